/* The cluster planner's DeepSpeed plans re-evaluated by the rank
 * simulation (dist_deepspeed.c): a ZeRO-1/2/3 layout without model
 * parallelism (tp = pp = cp = ep = 1) is simulated as its most loaded
 * rank, the fitted figure kept for pruning and ranking.
 * docs/DISTRIBUTED.md "DeepSpeed ZeRO", "In the cluster planner". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "dist_internal.h"

/* Whether the rank simulation models the layout. */
static bool modelled(const vp_cluster_model *cm, const vp_par *p)
{
    return (p->sharding == VP_SHARD_ZERO1 || p->sharding == VP_SHARD_ZERO2 ||
            p->sharding == VP_SHARD_ZERO3) &&
           p->tp == 1 && p->pp == 1 && p->cp == 1 && p->ep == 1 && !p->sp &&
           !cm->experts && !cm->whole && p->dtype != VP_DT_FP8 &&
           p->micro_batch > 0;
}

static void to_mem(const vp_estimate *est, vp_cluster_mem *m)
{
    const uint64_t *k = est->by_category;
    m->weights = k[VP_CAT_PARAM];
    m->grads = k[VP_CAT_GRAD];
    m->optimizer = k[VP_CAT_OPTIM];
    m->buffers = 0;
    m->activations = k[VP_CAT_ACT] + k[VP_CAT_INPUT];
    m->transient = k[VP_CAT_TEMP] + k[VP_CAT_CAST] + k[VP_CAT_WORKSPACE];
    m->overhead = est->peak_reserved - est->peak_alloc;
    m->host = est->host_bytes;
    m->stage = 0;
    m->in_flight = 1;
}

vp_status vp__plan_simulate_ds(vp_cluster_model *cm, const vp_cluster *c,
                               vp_plan_entry *e, vp_error *err)
{
    const vp_par *p = &e->par;
    if (!modelled(cm, p))
        return VP_OK;
    /* the graph is the model's own ops, as a Hugging Face model runs
     * under DeepSpeed's engine */
    vp_status st;
    vp_tf tf;
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp__local_tf(&tf, cm->m, 1);
    tf.layers = (uint32_t)in.layers;
    vp_graph *g = vp__graph_build_tf(&tf, cm->m, p->micro_batch, cm->seq,
                                     err);
    if (!g)
        return err ? err->code : VP_ESCHEMA;
    bool *all = calloc(g->n_segs ? g->n_segs : 1, sizeof *all);
    if (!all) {
        vp_graph_free(g);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = p->sharding == VP_SHARD_ZERO1   ? VP_DIST_DS_ZERO1
                 : p->sharding == VP_SHARD_ZERO2 ? VP_DIST_DS_ZERO2
                                                 : VP_DIST_DS_ZERO3;
    d.world = p->dp;
    d.rank = vp__ds_heaviest_rank(g, &d);
    /* a model of this size is built under deepspeed.zero.Init with
     * ZeRO-3 (Megatron-DeepSpeed's pretrain_gpt.py model_provider) */
    d.ds.zero_init = d.strategy == VP_DIST_DS_ZERO3;
    if (p->offload != VP_OFFLOAD_NONE)
        d.ds.offload_optimizer = VP_DS_OFFLOAD_CPU;
    if (p->offload == VP_OFFLOAD_ALL)
        d.ds.offload_param = VP_DS_OFFLOAD_CPU;
    vp_setup s;
    vp_setup_init(&s);
    s.batch = p->micro_batch;
    s.seq = cm->seq;
    s.precision = p->dtype == VP_DT_FP16   ? VP_PREC_FP16
                  : p->dtype == VP_DT_FP32 ? VP_PREC_FP32
                                           : VP_PREC_BF16;
    s.optimizer = VP_OPT_ADAMW_FUSED;
    s.accum = (uint32_t)(p->accum < VP_MAX_ACCUM_UNSTEADY
                             ? p->accum
                             : VP_MAX_ACCUM_UNSTEADY);
    /* ZeRO-3's coordinator uses its trace (prefetch, reuse distance) from
     * the third forward: the first invalidates an empty trace, the second
     * records it (partitioned_param_coordinator.py reset_step) */
    s.steps = d.strategy == VP_DIST_DS_ZERO3 ? 3 : 2;
    s.context_bytes = 0;
    s.dist = &d;
    if (p->recompute == VP_RC_FULL) {
        for (size_t k = 0; k < g->n_segs; k++)
            all[k] = true;
        s.checkpoint = all;
        s.n_checkpoint = g->n_segs;
    }
    vp_estimate est;
    st = vp__simulate_on_device(
        g, &s, vp__rank_device_bytes(c, e->mem.nccl, e->mem.context), &est,
        err);
    free(all);
    vp_graph_free(g);
    if (st != VP_OK)
        return st;
    to_mem(&est, &e->mem);
    uint64_t t = est.peak_reserved;
    if (!vp_add_u64(t, e->mem.nccl, &t) ||
        !vp_add_u64(t, e->mem.context, &t))
        return vp_error_set(err, VP_EOVERFLOW, "a rank's bytes overflow");
    e->mem.total = t;
    e->simulated = true;
    e->fits = vp_cluster_fits(c, &e->mem);
    return VP_OK;
}

vp_status vp_cluster_ds_sim(vp_cluster_model *cm, const vp_cluster *c,
                            const vp_par *p, vp_plan_entry *e,
                            vp_error *err)
{
    memset(e, 0, sizeof *e);
    e->par = *p;
    vp_status st = vp_cluster_eval(cm, c, p, &e->mem, &e->time, err);
    if (st != VP_OK)
        return st;
    e->fits = vp_cluster_fits(c, &e->mem);
    return vp__plan_simulate_ds(cm, c, e, err);
}
