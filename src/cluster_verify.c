/* A PyTorch-engine plan of the cluster search simulated rank by rank: a
 * pure data-parallel layout (tp = pp = cp = ep = 1) of DDP (alone or with
 * ZeroRedundancyOptimizer), FSDP1 or FSDP2 (HSDP on a 2-D mesh), or FSDP2
 * with tensor parallelism and 1F1B pipeline stages as torchtitan composes
 * them (vp_tp_simulate, src/dist_tp.c), run through the per-rank simulator
 * of PyTorch's wrappers (vp_simulate_ranks, src/dist*.c) exactly as
 * `estimate --strategy S --world N [--tp T --pp P]` runs it; the
 * most loaded role's figures replace the fitted per-GPU formula of
 * cluster_mem.c. docs/CLUSTER.md "Verification" gives the mapping of the
 * plan's fields onto the wrapper's and the gaps between the two. */
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"

/* Steps simulated: the second step is DDP's bucket rebuild
 * (with the first buckets still held, the most loaded rank's figure), the
 * third the steady state that repeats (the 2-GPU measurements: steps 2, 3
 * and 4 alike to the byte, ../shared/groundtruth/dist/). */
#define TORCH_STEPS (VP_STEADY_STEPS + 1)

/* Micro-batches simulated a step: the first (no gradients yet) and two
 * that accumulate; every later one starts from the same tensors (DDP adds
 * into its bucket views in place, FSDP into the sharded gradients) and
 * repeats the peak. estimate at 2, 3, 4 and 16 micro-batches gives the
 * same peak allocated and reserved to the byte for DDP, FSDP full and
 * hybrid on gpt2-medium, llama-1b, resnet50 and t5-base (the wrappers are
 * simulated micro-batch by micro-batch, at most VP_MAX_ACCUM_UNSTEADY). */
#define TORCH_ACCUM 3u

/* Under 1F1B: the warm-up's micro-batches in flight on the first stage
 * (pp - 1) and the two that start the steady pairs, the same count on
 * every stage (so that `estimate --accum` gives each one's figures). */
static uint64_t torch_accum(const vp_par *p)
{
    uint64_t m = p->pp > 1 ? (uint64_t)p->pp + 2 : TORCH_ACCUM;
    if (m > VP_MAX_ACCUM_UNSTEADY)
        m = VP_MAX_ACCUM_UNSTEADY;
    return p->accum < m ? p->accum : m;
}

/* What the per-rank simulator does not model of the plan, named; NULL if
 * it models it. Such a plan keeps the formula (docs/CLUSTER.md). */
static const char *unsupported(const vp_par *p)
{
    if (vp_sharding_engine(p->sharding) != VP_ENGINE_TORCH)
        return "an engine other than PyTorch's";
    if (p->cp > 1 || p->ep > 1)
        return "FSDP composed with context or expert parallelism";
    if ((p->tp > 1 || p->pp > 1) && !vp__fsdp2(p->sharding))
        return "DDP or FSDP1 composed with tensor or pipeline parallelism "
               "(torchtitan composes FSDP2)";
    if (p->pp > 1 && (p->vpp > 1 || p->schedule != VP_SCHED_1F1B))
        return "FSDP2 under a pipeline schedule other than 1F1B";
    if ((p->tp > 1 || p->pp > 1) && p->offload != VP_OFFLOAD_NONE)
        return "CPUOffloadPolicy with tensor or pipeline parallelism";
    if (p->dtype == VP_DT_FP8)
        return "fp8 (float8 linears)";
    if (p->compile)
        return "torch.compile's fused kernels";
    if (p->recompute == VP_RC_SELECTIVE)
        return "the op-level selective recomputation policy (the "
               "simulator's selective recomputation is Megatron's core "
               "attention)";
    if (p->dp > VP_DIST_MAX_WORLD)
        return "a data-parallel world beyond VP_DIST_MAX_WORLD";
    if (p->offload != VP_OFFLOAD_NONE && !vp__fsdp2(p->sharding))
        return "FSDP1's CPUOffload (the simulator has FSDP2's "
               "CPUOffloadPolicy)";
    return NULL;
}

/* The plan's sharding, precision and batch as the wrapper's run and the
 * training setup (cluster_mem.c's torch rules: DDP keeps fp32 parameters
 * and runs under autocast in the plan's dtype, ZeroRedundancyOptimizer
 * without gradient_as_bucket_view; FSDP1 keeps fp32 flat parameters and
 * runs MixedPrecision with param_dtype the plan's dtype, reduce_dtype the
 * same; FSDP2 keeps fp32 DTensor shards and runs torchtitan's
 * MixedPrecisionPolicy, param_dtype the plan's dtype, reduce_dtype fp32
 * (torchtitan job_config.py Training.mixed_precision_param bfloat16,
 * mixed_precision_reduce float32, read by parallelize.py apply_fsdp),
 * reshard_after_forward True, CPUOffloadPolicy for offload all; fp32
 * plans run no mixed precision; foreach AdamW). */
static void torch_run(const vp_cluster_model *cm, const vp_cluster *c,
                      const vp_par *p, vp_dist *d, vp_setup *s)
{
    static const vp_precision amp[VP_DT__COUNT] = {
        [VP_DT_BF16] = VP_PREC_AMP_BF16, [VP_DT_FP16] = VP_PREC_AMP_FP16,
        [VP_DT_FP32] = VP_PREC_FP32};
    static const vp_mp_dtype mp[VP_DT__COUNT] = {
        [VP_DT_BF16] = VP_MP_BF16, [VP_DT_FP16] = VP_MP_FP16,
        [VP_DT_FP32] = VP_MP_NONE};
    vp_dist_init(d);
    d->world = p->dp;
    vp_setup_init(s);
    s->batch = p->micro_batch;
    s->seq = cm->seq;
    s->accum = (uint32_t)torch_accum(p);
    s->steps = TORCH_STEPS;
    s->optimizer = VP_OPT_ADAMW;
    s->context_bytes = 0; /* the cluster's context is added once */
    s->skip_breakdown = true;
    s->dist = d;
    if (vp__ddp_like(p->sharding)) {
        d->strategy = p->sharding == VP_SHARD_DDP_ZERO1 ? VP_DIST_DDP_ZERO1
                      : p->bucket_view ? VP_DIST_DDP_BUCKET_VIEW
                                       : VP_DIST_DDP;
        s->precision = amp[p->dtype];
        return;
    }
    d->strategy = p->sharding == VP_SHARD_FSDP_GRAD_OP ? VP_DIST_FSDP_GRAD_OP
                  : p->sharding == VP_SHARD_FSDP_HYBRID ? VP_DIST_FSDP_HYBRID
                  : vp__fsdp2(p->sharding)             ? VP_DIST_FSDP2
                                                        : VP_DIST_FSDP_FULL;
    s->precision = VP_PREC_FP32;
    d->param_dtype = mp[p->dtype];
    if (vp__fsdp2(p->sharding)) {
        if (d->param_dtype != VP_MP_NONE)
            d->reduce_dtype = VP_MP_FP32;
        d->cpu_offload = p->offload == VP_OFFLOAD_ALL;
    }
    if (vp__hybrid(p->sharding))
        /* the shard group is a node (cluster_mem.c's D of hybrid) */
        d->shard = c->gpus_per_node < p->dp ? c->gpus_per_node : p->dp;
}

uint64_t vp__rank_device_bytes(const vp_cluster *c, uint64_t nccl,
                               uint64_t context)
{
    uint64_t outside;
    if (!vp_add_u64(nccl, context, &outside) || outside >= c->memory)
        return 0;
    return c->memory - outside;
}

vp_status vp__simulate_on_device(const vp_graph *g, vp_setup *s,
                                 uint64_t device, vp_estimate *out,
                                 vp_error *err)
{
    s->alloc.device_total = device;
    vp_status st = vp_simulate(g, s, out, NULL, NULL, err);
    if (st != VP_EOOM || device == 0)
        return st;
    vp_error_clear(err);
    s->alloc.device_total = 0;
    return vp_simulate(g, s, out, NULL, NULL, err);
}

/* The most loaded role's figures in the planner's fields: the autocast
 * weight cache in the buffers (the formula's table counts it there), the
 * caching allocator's reserve beyond its peak allocated as the overhead,
 * the formula's NCCL buffers and the cluster's context added. */
static vp_status to_mem(const vp_estimate *r, const vp_cluster *c,
                        vp_cluster_mem *m, vp_error *err)
{
    const uint64_t *k = r->by_category;
    uint64_t nccl = m->nccl, host = m->host;
    memset(m, 0, sizeof *m);
    m->weights = k[VP_CAT_PARAM];
    m->grads = k[VP_CAT_GRAD];
    m->optimizer = k[VP_CAT_OPTIM];
    m->buffers = k[VP_CAT_CAST];
    m->activations = k[VP_CAT_ACT] + k[VP_CAT_INPUT];
    m->transient = k[VP_CAT_TEMP] + k[VP_CAT_WORKSPACE];
    m->overhead = r->peak_reserved > r->peak_alloc
                      ? r->peak_reserved - r->peak_alloc
                      : 0;
    m->nccl = nccl;
    m->context = c->context;
    m->host = host;
    m->in_flight = 1;
    uint64_t t = r->peak_reserved;
    if (!vp_add_u64(t, nccl, &t) || !vp_add_u64(t, c->context, &t))
        return vp_error_set(err, VP_EOVERFLOW, "a rank's bytes overflow");
    m->total = t;
    return VP_OK;
}

/* Full recomputation: every segment (decoder layer) checkpointed, as
 * `--checkpoint all`; *flags (the caller frees it) NULL otherwise. */
static vp_status checkpoint_all(const vp_graph *g, const vp_par *p,
                                vp_setup *s, bool **flags, vp_error *err)
{
    *flags = NULL;
    if (p->recompute != VP_RC_FULL || g->n_segs == 0)
        return VP_OK;
    *flags = calloc(g->n_segs, sizeof **flags);
    if (!*flags)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    memset(*flags, true, g->n_segs * sizeof **flags);
    s->checkpoint = *flags;
    s->n_checkpoint = g->n_segs;
    return VP_OK;
}

/* Every role of the plan's rank: the graph of the whole model, or with
 * tp or pp > 1 the most loaded stage's TP rank (vp_tp_simulate, *l's
 * stage set to it). */
static vp_status roles_of(vp_cluster_model *cm, const vp_par *p, vp_setup *s,
                          vp_tp_layout *l, vp_rank_estimate **r, size_t *n,
                          size_t *worst, vp_error *err)
{
    if (p->tp > 1 || p->pp > 1) {
        l->stage = VP_TP_WORST;
        return vp_tp_simulate(cm->m, l, s, r, n, worst, err);
    }
    vp_graph *g = vp_graph_build(cm->m, p->micro_batch, cm->seq, err);
    if (!g)
        return err ? err->code : VP_ESCHEMA;
    bool *flags;
    vp_status st = checkpoint_all(g, p, s, &flags, err);
    if (st == VP_OK)
        st = vp_simulate_ranks(g, s, r, n, worst, err);
    s->checkpoint = NULL;
    s->n_checkpoint = 0;
    free(flags);
    vp_graph_free(g);
    return st;
}

vp_status vp__plan_simulate_torch(vp_cluster_model *cm, const vp_cluster *c,
                                  vp_plan_entry *e, vp_error *err)
{
    const vp_par *p = &e->par;
    if (unsupported(p))
        return VP_OK;
    vp_dist d;
    vp_setup s;
    torch_run(cm, c, p, &d, &s);
    /* torchtitan: apply_tp (sequence-parallel norms whatever p->sp says:
     * torchtitan has no other), pipeline_llm's 1F1B, apply_ac's full
     * mode; reshard_after_forward False under pp (dist_fsdp2.c) */
    vp_tp_layout l = {p->tp, p->pp, VP_TP_WORST, p->recompute == VP_RC_FULL,
                      false};
    /* every role once (dist_roles.c): DDP and FSDP1 have one (equal
     * padded shards); FSDP2's last ranks hold shorter dim-0 chunks and
     * ZeroRedundancyOptimizer's partitions differ: the most loaded */
    vp_rank_estimate *r = NULL;
    size_t n, worst;
    s.alloc.device_total = vp__rank_device_bytes(c, e->mem.nccl, c->context);
    vp_status st = roles_of(cm, p, &s, &l, &r, &n, &worst, err);
    if (st == VP_EOOM && s.alloc.device_total) {
        /* over the memory even after freeing its cache: the figures
         * without the cap, which do not fit */
        vp_error_clear(err);
        s.alloc.device_total = 0;
        st = roles_of(cm, p, &s, &l, &r, &n, &worst, err);
    }
    /* FSDP built from the whole model on the GPU (model.cuda(), then the
     * wrapper, as estimate simulates it) peaks at its construction when
     * the fp32 model outweighs the step: a plan of such a model is run
     * from the meta device or the host (device_id), which the simulator
     * does not model; the formula stands */
    bool built = st == VP_OK && r[worst].est.peak_phase == VP_PHASE_SETUP &&
                 vp_dist_is_fsdp(d.strategy);
    if (st == VP_OK && !built)
        st = to_mem(&r[worst].est, c, &e->mem, err);
    if (st == VP_OK && !built) {
        /* 1F1B: min(pp - stage, m) micro-batches in flight (sim_pipe.c) */
        uint64_t w = p->pp - l.stage;
        e->mem.stage = p->pp > 1 ? l.stage : 0;
        e->mem.in_flight = (double)(p->pp > 1 && w < p->accum ? w
                                    : p->pp > 1          ? p->accum
                                                         : 1);
        e->simulated = true;
        e->fits = vp_cluster_fits(c, &e->mem);
    }
    free(r);
    return st;
}
