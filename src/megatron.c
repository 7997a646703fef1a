/* A Megatron-LM rank simulated: the graph of one pipeline stage's
 * tensor-parallel rank, run through the simulator with Megatron's
 * wrapper (dist_megatron.c) and the 1F1B schedule (sim_pipe.c).
 * docs/DISTRIBUTED.md "Megatron-LM" gives each rule and its source. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"


/* What the simulated path does not model yet, named; NULL if none. */
static const char *unsupported(const vp_cluster_model *cm, const vp_par *p)
{
    if (p->sharding != VP_SHARD_MEGATRON && p->sharding != VP_SHARD_DISTOPT)
        return "a sharding other than Megatron's (megatron-ddp, "
               "distributed-optimizer)";
    const vp_tf *t = &cm->m->tf;
    if (cm->whole || cm->m->form != 0)
        return "a graph-form model (Megatron runs transformers)";
    if (t->type != VP_TF_DECODER)
        return "a model other than a decoder (Megatron's GPT model)";
    if (t->x.mla.kv_lora && p->cp > 1)
        return "latent attention under context parallelism (k and v of "
               "different widths in the KV ring)";
    if (t->x.qk_norm || t->x.norm_offset || t->x.post_norms ||
        t->x.attn_softcap > 0 || t->x.logit_softcap > 0 || t->x.window ||
        t->x.embed_scale || t->x.packed_qkv)
        return "a layer the Megatron op flavour does not build (per-head "
               "q/k norms, Gemma's norms, soft-capping, sliding windows, "
               "packed projections)";
    if (cm->experts && p->tp > 1 && !p->sp)
        return "mixture-of-experts layers with tp > 1 and no sequence "
               "parallelism (Megatron requires it: arguments.py)";
    if (p->pp > 1 && p->schedule == VP_SCHED_GPIPE)
        return "GPipe (Megatron runs 1F1B)";
    if (p->pp > 1 && p->schedule == VP_SCHED_DUALPIPE)
        return "DualPipe";
    if (p->offload == VP_OFFLOAD_ALL)
        return "parameter offload (Megatron offloads the optimizer)";
    return NULL;
}

static vp_precision precision_of(vp_dtype d)
{
    return d == VP_DT_FP16 ? VP_PREC_FP16
           : d == VP_DT_FP32 ? VP_PREC_FP32
                             : VP_PREC_BF16;
}

/* The stage's layers (vp__stage_layers: first, last, middle). */
static uint32_t layers_of(const vp_cluster_model *cm, const vp_par *p,
                          uint32_t stage)
{
    double l0, l1, lm;
    vp__stage_layers(cm, p, &l0, &l1, &lm);
    double l = stage == 0 ? l0 : stage + 1 == p->pp ? l1 : lm;
    return (uint32_t)l;
}

/* The model's first dense layers (DeepSeek-V3's three: --moe-layer-freq
 * [0]*3+[1]*58, Megatron-Core's transformer_block.py builds each layer's
 * spec from moe_layer_freq) that fall on the stage, under the 1F1B
 * schedule (stage s from layer l0 + (s - 1) lm). An interleaved stage's
 * chunks, and a period (moe_every > 1), are built all MoE: an upper
 * bound (an MoE layer keeps more than the dense one on every shipped
 * model). */
static uint32_t dense_on_stage(const vp_cluster_model *cm, const vp_par *p,
                               uint32_t stage, uint32_t layers)
{
    const vp_tf_ext *x = &cm->m->tf.x;
    if (!cm->experts || p->vpp > 1 || x->moe_every > 1)
        return 0;
    double l0, l1, lm;
    vp__stage_layers(cm, p, &l0, &l1, &lm);
    double first = stage == 0 ? 0 : l0 + (stage - 1) * lm;
    if (stage > 0 && stage + 1 == p->pp)
        first = (double)cm->L - l1;
    double d = (double)x->dense_layers - first;
    return d <= 0 ? 0 : d >= layers ? layers : (uint32_t)d;
}

/* The stage's graph: the tensor-parallel rank's share of its layers; the
 * embedding on the first stage, the final norm, head and loss on the
 * last. A tied head on a later stage than the embedding keeps its own
 * copy of the word embeddings (Megatron's setup_embeddings_and_output_
 * layer: the last stage's output_layer weight, synchronised with the
 * first stage's). */
static vp_graph *stage_graph(const vp_cluster_model *cm, const vp_cluster *c,
                             const vp_par *p, uint32_t stage, uint32_t layers,
                             vp_error *err)
{
    vp_tf tf;
    vp__local_tf(&tf, cm->m, p->tp);
    tf.layers = layers;
    tf.stage_in = stage > 0;
    tf.stage_out = stage + 1 < p->pp;
    tf.sp = p->sp && p->tp > 1 ? p->tp : 1;
    tf.chunks = p->vpp;
    tf.cp = p->cp;
    tf.megatron = true;
    tf.fp8 = p->dtype == VP_DT_FP8;
    tf.ep = p->ep;
    tf.moe_load = vp_moe_load(c, cm->experts, cm->top_k, p->ep, NULL);
    tf.x.dense_layers = dense_on_stage(cm, p, stage, layers);
    if (tf.stage_in)
        tf.tied = false;
    return vp__graph_build_tf(&tf, cm->m, p->micro_batch, cm->seq / p->cp,
                              err);
}

/* Passes alive at once on the stage: min(pp - stage, m) micro-batches
 * under 1F1B; model-chunk passes under the interleaved schedule,
 * min((pp - stage - 1) 2 + (vpp - 1) pp + 1, m vpp) (sim_pipe.c). */
static uint32_t in_flight_of(const vp_par *p, uint32_t stage)
{
    uint64_t n = p->accum * p->vpp, w;
    if (p->vpp > 1)
        w = (uint64_t)(p->pp - stage - 1) * 2 + (uint64_t)(p->vpp - 1) * p->pp;
    else
        w = p->pp - stage - 1;
    return (uint32_t)(w + 1 < n ? w + 1 : n);
}

/* Micro-batches simulated: the warm-up's and two more groups (pp under
 * the interleaved schedule, else one micro-batch), at most all of them.
 * After the warm-up and the first steady pair every pair starts from the
 * same tensors in flight (the gradients accumulate in place in the fp32
 * buffer), but not always from the same cached blocks: the bytes
 * allocated follow the allocator's block reuse (GPT-2 small, stage 1 of
 * 4: the peak moved by 192,512 B, 0.005 %, between m = 7 and 8 and by
 * nothing from 3 to 7; tests/test_megatron.c); the pairs left are taken
 * to repeat (Llama 3.1 405B, tp 4 SP, pp 32 x 3 chunks, cp 8: the same
 * peaks at m = 96, 128 and 256). */
static uint64_t simulated_mb(const vp_par *p, uint32_t stage)
{
    uint64_t g = p->vpp > 1 ? p->pp : 1, v = p->vpp;
    uint64_t need = (in_flight_of(p, stage) + v - 1) / v + 2 * g;
    need = (need + g - 1) / g * g;
    uint64_t cap = VP_MAX_ACCUM_UNSTEADY / g * g;
    if (need > cap)
        need = cap;
    return p->accum < need ? p->accum : need;
}

static void fill(vp_stage_sim *out, const vp_estimate *e, const vp_graph *g)
{
    out->peak_alloc = e->peak_alloc;
    out->peak_reserved = e->peak_reserved;
    for (int k = 0; k < VP_CAT__COUNT && k < 8; k++)
        out->by_category[k] = e->by_category[k];
    (void)vp_graph_num_params(g, &out->params, NULL);
}

vp_status vp_cluster_stage_sim(vp_cluster_model *cm, const vp_cluster *c,
                               const vp_par *p, uint32_t stage,
                               vp_stage_sim *out, vp_error *err)
{
    memset(out, 0, sizeof *out);
    vp_cluster_mem mem;
    vp_cluster_time tm;
    vp_status st = vp_cluster_eval(cm, c, p, &mem, &tm, err);
    if (st != VP_OK)
        return st;
    const char *why = unsupported(cm, p);
    if (why)
        return vp_error_set(err, VP_EUNSUPPORTED,
                            "a simulated Megatron rank with %s is not "
                            "modelled yet", why);
    if (stage >= p->pp)
        return vp_error_set(err, VP_EARG, "stage %u is not one of %u", stage,
                            p->pp);
    out->stage = stage;
    out->layers = layers_of(cm, p, stage);
    out->in_flight = in_flight_of(p, stage);
    out->simulated_mb = (uint32_t)simulated_mb(p, stage);
    out->chunks = p->vpp;
    vp_graph *g = stage_graph(cm, c, p, stage, out->layers, err);
    if (!g)
        return err ? err->code : VP_ESCHEMA;
    bool *all = malloc((g->n_segs ? g->n_segs : 1) * sizeof *all);
    if (!all) {
        vp_graph_free(g);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    for (size_t k = 0; k < g->n_segs; k++)
        all[k] = true;
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = p->sharding == VP_SHARD_DISTOPT ? VP_DIST_MEGATRON_DISTOPT
                                                 : VP_DIST_MEGATRON_DDP;
    /* the gradients are reduced, and the distributed optimizer shards,
     * over the data-parallel group with the context-parallel ranks
     * (parallel_state.get_data_parallel_group(with_context_parallel=
     * True), distributed_data_parallel.py) */
    d.world = p->dp * p->cp;
    /* the experts': over the expert-data-parallel group, dp x cp / ep
     * (parallel_state.py, the expert-model-parallel ranks carved from the
     * data- and context-parallel ones with etp = tp) */
    d.expert_world = p->ep > 1 ? d.world / p->ep : 0;
    d.cpu_offload = p->offload == VP_OFFLOAD_OPTIMIZER;
    vp_pipeline pl = {p->pp, stage, p->vpp, false};
    vp_setup s;
    vp_setup_init(&s);
    s.batch = p->micro_batch;
    s.seq = cm->seq;
    s.precision = precision_of(p->dtype);
    s.optimizer = VP_OPT_ADAMW_FUSED;
    s.accum = out->simulated_mb;
    s.steps = 2;
    s.context_bytes = 0;
    s.skip_breakdown = true;
    s.dist = &d;
    s.pipe = &pl;
    if (p->recompute == VP_RC_FULL) {
        s.checkpoint = all;
        s.n_checkpoint = g->n_segs;
    } else if (p->recompute == VP_RC_SELECTIVE) {
        s.selective = all;
        s.n_selective = g->n_segs;
    }
    vp_estimate e;
    st = vp__simulate_on_device(
        g, &s, vp__rank_device_bytes(c, mem.nccl, mem.context), &e, err);
    if (st == VP_OK) {
        fill(out, &e, g);
        uint64_t t = e.peak_reserved;
        if (!vp_add_u64(t, mem.nccl, &t) || !vp_add_u64(t, mem.context, &t))
            st = vp_error_set(err, VP_EOVERFLOW, "a stage's bytes overflow");
        out->total = t;
    }
    free(all);
    vp_graph_free(g);
    return st;
}

/* The stages of pp that differ: the first, the last and the first middle
 * one (the middle stages hold the same layers, the first of them the most
 * micro-batches in flight). */
uint32_t vp__stages_that_differ(uint32_t pp, uint32_t st[3])
{
    uint32_t n = 0;
    st[n++] = 0;
    if (pp > 2)
        st[n++] = 1;
    if (pp > 1)
        st[n++] = pp - 1;
    return n;
}

/* The simulated rank's figures in the planner's fields. */
static void to_mem(const vp_stage_sim *r, vp_cluster_mem *m)
{
    const uint64_t *k = r->by_category;
    /* fp8: Transformer Engine's cached fp8 weights are weights */
    m->weights = k[VP_CAT_PARAM] + k[VP_CAT_CAST];
    m->grads = k[VP_CAT_GRAD];
    m->optimizer = k[VP_CAT_OPTIM];
    m->buffers = 0;
    m->activations = k[VP_CAT_ACT] + k[VP_CAT_INPUT];
    m->transient = k[VP_CAT_TEMP] + k[VP_CAT_WORKSPACE];
    m->overhead = r->peak_reserved - r->peak_alloc;
    m->total = r->total;
    m->stage = r->stage;
    m->in_flight = (double)r->in_flight / (r->chunks ? r->chunks : 1);
}

vp_status vp__plan_simulate(vp_cluster_model *cm, const vp_cluster *c,
                            vp_plan_entry *e, vp_error *err)
{
    if (unsupported(cm, &e->par))
        return VP_OK;
    uint32_t st[3];
    uint32_t n = vp__stages_that_differ(e->par.pp, st);
    vp_stage_sim worst;
    memset(&worst, 0, sizeof worst);
    for (uint32_t i = 0; i < n; i++) {
        vp_stage_sim r;
        vp_status s = vp_cluster_stage_sim(cm, c, &e->par, st[i], &r, err);
        if (s != VP_OK)
            return s;
        if (i == 0 || r.total > worst.total)
            worst = r;
    }
    to_mem(&worst, &e->mem);
    e->simulated = true;
    e->fits = vp_cluster_fits(c, &e->mem);
    return VP_OK;
}
