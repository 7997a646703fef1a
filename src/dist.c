/* The per-rank engine of the data-parallel wrappers: the run's
 * configuration, its units (dist_internal.h), the hooks sim.c calls and
 * their dispatch to the wrapper's rules, and the roles of a run (the
 * ranks whose event streams are alike, simulated once each).
 * docs/DISTRIBUTED.md has the rules, with their sources. */
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

/* ---- names ------------------------------------------------------------- */

static const char *const STRATEGY_NAMES[] = {
#define XX(name, str) str,
    VP_DIST_STRATEGY_MAP(XX)
#undef XX
};
static const char *const MP_NAMES[] = {
#define XX(name, str) str,
    VP_MP_DTYPE_MAP(XX)
#undef XX
};
static const char *const PREFETCH_NAMES[] = {
#define XX(name, str) str,
    VP_PREFETCH_MAP(XX)
#undef XX
};

const char *vp_dist_strategy_name(vp_dist_strategy s)
{
    return (unsigned)s < VP_DIST__COUNT ? STRATEGY_NAMES[s] : "?";
}

const char *vp_mp_dtype_name(vp_mp_dtype d)
{
    return (unsigned)d < VP_MP__COUNT ? MP_NAMES[d] : "?";
}

const char *vp_prefetch_name(vp_prefetch p)
{
    return (unsigned)p < VP_PREFETCH__COUNT ? PREFETCH_NAMES[p] : "?";
}

static vp_status parse_name(const char *s, const char *const *names,
                            size_t n, int *out)
{
    for (size_t i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (int)i;
            return VP_OK;
        }
    return VP_EARG;
}

vp_status vp_dist_strategy_parse(const char *s, vp_dist_strategy *out)
{
    int v;
    vp_status st = parse_name(s, STRATEGY_NAMES, VP_DIST__COUNT, &v);
    if (st == VP_OK)
        *out = (vp_dist_strategy)v;
    return st;
}

vp_status vp_mp_dtype_parse(const char *s, vp_mp_dtype *out)
{
    int v;
    vp_status st = parse_name(s, MP_NAMES, VP_MP__COUNT, &v);
    if (st == VP_OK)
        *out = (vp_mp_dtype)v;
    return st;
}

vp_status vp_prefetch_parse(const char *s, vp_prefetch *out)
{
    int v;
    vp_status st = parse_name(s, PREFETCH_NAMES, VP_PREFETCH__COUNT, &v);
    if (st == VP_OK)
        *out = (vp_prefetch)v;
    return st;
}

bool vp_dist_is_fsdp(vp_dist_strategy s)
{
    return s >= VP_DIST_FSDP_FULL && s <= VP_DIST_FSDP2;
}

bool vp_dist_is_deepspeed(vp_dist_strategy s)
{
    return s >= VP_DIST_DS_ZERO1 && s <= VP_DIST_DS_ZERO3;
}

void vp_dist_init(vp_dist *d)
{
    memset(d, 0, sizeof *d);
    d->strategy = VP_DIST_NONE;
    d->world = 1;
    d->reshard_after_forward = -1;
    d->bucket_cap = VP_DDP_BUCKET_CAP;
    d->first_bucket = VP_DDP_FIRST_BUCKET;
    d->broadcast_buffers = true;
    d->rebuild_held = true;
    d->limit_all_gathers = true;
    d->backward_prefetch = VP_PREFETCH_PRE;
    vp_ds_config_init(&d->ds);
}

uint8_t vp__mp_bytes(vp_mp_dtype d)
{
    return d == VP_MP_FP32 ? 4 : d == VP_MP_BF16 || d == VP_MP_FP16 ? 2 : 0;
}

/* ---- parameters -------------------------------------------------------- */

bool vp__dist_is_buffer(const vp_graph *g, uint32_t p)
{
    const vp_param *pp = &g->params[p];
    return !pp->trainable && (pp->fp32_buffer || pp->elem_bytes_override);
}

uint64_t vp__param_dim0(const vp_graph *g, uint32_t p)
{
    const vp_param *pp = &g->params[p];
    const vp_op *o = &g->ops[pp->op];
    bool weight = o->n_params > 0 && o->params[0] == p;
    uint64_t d0 = 0;

    switch (o->kind) {
    case VP_OP_LINEAR:
        /* nn.Linear weight [out, in]; HF Conv1D (addmm) [in, out]; bias
         * [out] */
        d0 = weight && (o->flags & VP_OPF_ADDMM) ? o->in_features
                                                  : o->out_features;
        break;
    case VP_OP_EMBEDDING:
        d0 = weight ? o->classes : 0;
        break;
    case VP_OP_CONV2D:
        d0 = o->out_features;
        break;
    default:
        break;
    }
    /* a 1-D tensor (norms, biases, buffers), or a shape the op does not
     * say: its own length */
    if (d0 == 0 || pp->numel % d0 != 0)
        d0 = pp->numel;
    return d0;
}

uint64_t vp__chunk_numel(const vp_graph *g, uint32_t p, uint32_t world,
                         uint32_t rank, uint64_t *padded)
{
    uint64_t n = g->params[p].numel;
    uint64_t d0 = vp__param_dim0(g, p);
    uint64_t row = d0 ? n / d0 : 0;
    uint64_t rows = (d0 + world - 1) / world; /* torch.chunk            */
    uint64_t first = rows * rank;
    uint64_t mine = first >= d0 ? 0 : d0 - first < rows ? d0 - first : rows;
    if (padded)
        *padded = rows * row;
    return mine * row;
}

/* ---- the engine's state ------------------------------------------------ */

static const vp__dist_rules *rules_of(vp_dist_strategy s)
{
    switch (s) {
    case VP_DIST_DDP:
    case VP_DIST_DDP_BUCKET_VIEW:
    case VP_DIST_DDP_ZERO1:
        return &vp__dist_ddp_rules;
    case VP_DIST_FSDP_FULL:
    case VP_DIST_FSDP_GRAD_OP:
    case VP_DIST_FSDP_HYBRID:
    case VP_DIST_FSDP_NO_SHARD:
        return &vp__dist_fsdp1_rules;
    case VP_DIST_FSDP2:
        return &vp__dist_fsdp2_rules;
    case VP_DIST_MEGATRON_DDP:
    case VP_DIST_MEGATRON_DISTOPT:
        return &vp__dist_megatron_rules;
    case VP_DIST_DS_ZERO1:
    case VP_DIST_DS_ZERO2:
        return &vp__dist_zero12_rules;
    case VP_DIST_DS_ZERO3:
        return &vp__dist_zero3_rules;
    default:
        return NULL;
    }
}

/* DistributedDataParallel's strategies (with or without bucket views and
 * ZeroRedundancyOptimizer). */
static bool is_ddp(vp_dist_strategy s)
{
    return s == VP_DIST_DDP || s == VP_DIST_DDP_BUCKET_VIEW ||
           s == VP_DIST_DDP_ZERO1;
}

/* A knob of one wrapper given to another is an error naming it (it would
 * be ignored): DDP's with FSDP, FSDP1's with DDP or fully_shard. */
static vp_status check_knobs(const vp_dist *c, vp_error *err)
{
    const char *ddp_knob =
        c->bucket_cap != VP_DDP_BUCKET_CAP     ? "bucket_cap_mb"
        : c->first_bucket != VP_DDP_FIRST_BUCKET ? "the first bucket's cap"
        : c->static_graph                        ? "static_graph"
        : c->find_unused                         ? "find_unused_parameters"
        : !c->broadcast_buffers                  ? "broadcast_buffers=False"
        : !c->rebuild_held                       ? "rebuild_freed"
                                                 : NULL;
    if (ddp_knob && vp_dist_is_fsdp(c->strategy))
        return vp_error_set(err, VP_EARG, "%s is DDP's, not %s's", ddp_knob,
                            vp_dist_strategy_name(c->strategy));
    const char *fsdp1_knob =
        c->forward_prefetch                         ? "forward_prefetch"
        : c->backward_prefetch != VP_PREFETCH_PRE   ? "backward_prefetch"
        : c->use_orig_params                        ? "use_orig_params"
                                                    : NULL;
    if (fsdp1_knob &&
        (is_ddp(c->strategy) || c->strategy == VP_DIST_FSDP2))
        return vp_error_set(err, VP_EARG, "%s is FSDP1's, not %s's%s",
                            fsdp1_knob, vp_dist_strategy_name(c->strategy),
                            c->strategy == VP_DIST_FSDP2
                                ? " (fully_shard prefetches implicitly and "
                                  "keeps the original parameters)"
                                : "");
    return VP_OK;
}

/* The run's settings, checked before any event: VP_EARG for what is out of
 * range or another wrapper's, VP_EUNSUPPORTED for what is not modelled. */
static vp_status check_cfg(const vp_dist *c, vp_error *err)
{
    if ((unsigned)c->strategy >= VP_DIST__COUNT)
        return vp_error_set(err, VP_EARG, "unknown data-parallel strategy");
    if (c->world < 1 || c->world > VP_DIST_MAX_WORLD)
        return vp_error_set(err, VP_EARG,
                            "world %u is outside 1..%u", c->world,
                            VP_DIST_MAX_WORLD);
    if (c->rank >= c->world)
        return vp_error_set(err, VP_EARG,
                            "rank %u is not below the world size %u",
                            c->rank, c->world);
    if (c->shard && (c->shard > c->world || c->world % c->shard))
        return vp_error_set(err, VP_EARG,
                            "a shard group of %u ranks does not divide the "
                            "world of %u", c->shard, c->world);
    if (c->shard && c->shard != c->world &&
        c->strategy != VP_DIST_FSDP_HYBRID && c->strategy != VP_DIST_FSDP2)
        return vp_error_set(err, VP_EARG,
                            "a shard group smaller than the world is "
                            "fsdp-hybrid's or fsdp2's (HSDP)");
    if ((unsigned)c->param_dtype >= VP_MP__COUNT ||
        (unsigned)c->reduce_dtype >= VP_MP__COUNT ||
        (unsigned)c->buffer_dtype >= VP_MP__COUNT ||
        (unsigned)c->output_dtype >= VP_MP__COUNT ||
        (unsigned)c->backward_prefetch >= VP_PREFETCH__COUNT)
        return vp_error_set(err, VP_EARG, "invalid mixed-precision dtype or "
                                          "prefetch");
    bool fsdp = vp_dist_is_fsdp(c->strategy);
    if (!fsdp && (c->param_dtype || c->reduce_dtype || c->buffer_dtype))
        return vp_error_set(err, VP_EARG,
                            "param_dtype, reduce_dtype and buffer_dtype are "
                            "FSDP's MixedPrecision: DDP runs mixed precision "
                            "under autocast (--precision amp-bf16)");
    if (c->strategy != VP_DIST_FSDP2 && c->reshard_after_forward >= 0)
        return vp_error_set(err, VP_EARG,
                            "reshard_after_forward is fully_shard's (fsdp2); "
                            "FSDP1 reshards after the forward with "
                            "fsdp-full and fsdp-hybrid only");
    if (c->reshard_after_forward > (int32_t)VP_DIST_MAX_WORLD)
        return vp_error_set(err, VP_EARG, "reshard_after_forward %d is too "
                            "large", (int)c->reshard_after_forward);
    if (c->cpu_offload && c->strategy != VP_DIST_FSDP2 &&
        c->strategy != VP_DIST_MEGATRON_DISTOPT)
        return vp_error_set(err, VP_EARG,
                            "CPUOffloadPolicy is fully_shard's (fsdp2); "
                            "--optimizer-cpu-offload Megatron's distributed "
                            "optimizer (megatron-distopt)");
    if (c->overlap_with_ddp && c->strategy != VP_DIST_DDP_ZERO1)
        return vp_error_set(err, VP_EARG,
                            "overlap_with_ddp is ZeroRedundancyOptimizer's "
                            "(ddp-zero1)");
    if (c->bucket_cap == 0 || c->first_bucket == 0)
        return vp_error_set(err, VP_EARG, "DDP bucket sizes must be > 0");
    vp_status st = check_knobs(c, err);
    if (st != VP_OK)
        return st;
    if (c->output_dtype != VP_MP_NONE && c->strategy != VP_DIST_FSDP2)
        return vp_error_set(err, VP_EARG, "output_dtype is fully_shard's "
                            "MixedPrecisionPolicy (fsdp2)");
    if (c->output_dtype != VP_MP_NONE && c->param_dtype == VP_MP_NONE)
        return vp_error_set(err, VP_EUNSUPPORTED,
                            "output_dtype without a param_dtype is not "
                            "modelled (the next module would not cast its "
                            "inputs back: cast_forward_inputs needs one)");
    if (c->buffer_dtype != VP_MP_NONE)
        return vp_error_set(err, VP_EUNSUPPORTED,
                            "MixedPrecision buffer_dtype is not modelled "
                            "(FSDP1 _lazy_init casts the floating-point "
                            "buffers; the simulation keeps them in their "
                            "dtype)");
    if (!c->limit_all_gathers)
        return vp_error_set(err, VP_EUNSUPPORTED,
                            "limit_all_gathers=False is not modelled: "
                            "without FSDP1's rate limiter the CPU runs "
                            "ahead and the resharded parameters' blocks, "
                            "recorded on the compute stream, stay pending "
                            "for a time the allocator model does not know");
    return VP_OK;
}

/* Units: the root, then one per segment; parameters go to the unit of the
 * first op that uses them; buffers to none. */
static vp_status make_units(sim *S, vp__dist *d)
{
    const vp_graph *g = S->g;
    size_t np = g->n_params ? g->n_params : 1;

    d->n_units = (uint32_t)g->n_segs + 1;
    d->units = calloc(d->n_units, sizeof *d->units);
    d->unit_of_seg = calloc(g->n_segs ? g->n_segs : 1, sizeof *d->unit_of_seg);
    d->unit_of_param = calloc(np, sizeof *d->unit_of_param);
    d->uses = calloc(np, sizeof *d->uses);
    d->pending = calloc(np, sizeof *d->pending);
    uint32_t *all = calloc(np, sizeof *all);
    if (!d->units || !d->unit_of_seg || !d->unit_of_param || !d->uses ||
        !d->pending || !all) {
        free(all);
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    }
    d->units[0].seg = -1;
    for (size_t k = 0; k < g->n_segs; k++) {
        d->units[k + 1].seg = (int32_t)k;
        d->unit_of_seg[k] = (int32_t)k + 1;
    }
    for (size_t i = 0; i < g->n_ops; i++)
        for (uint32_t j = 0; j < g->ops[i].n_params; j++)
            d->uses[g->ops[i].params[j]]++;
    /* count, then lay out each unit's list inside `all` */
    for (uint32_t p = 0; p < g->n_params; p++) {
        int32_t seg = g->ops[g->params[p].op].segment;
        uint32_t u = seg >= 0 ? (uint32_t)seg + 1 : 0;
        d->unit_of_param[p] = vp__dist_is_buffer(g, p) ? UINT32_MAX : u;
        if (d->unit_of_param[p] != UINT32_MAX)
            d->units[u].n_params++;
    }
    uint32_t at = 0;
    for (uint32_t u = 0; u < d->n_units; u++) {
        d->units[u].params = all + at;
        at += d->units[u].n_params;
        d->units[u].n_params = 0;
    }
    for (uint32_t p = 0; p < g->n_params; p++) {
        uint32_t u = d->unit_of_param[p];
        if (u == UINT32_MAX)
            continue;
        vp__unit *un = &d->units[u];
        un->params[un->n_params++] = p;
        if (!vp_add_u64(un->numel, g->params[p].numel, &un->numel))
            return vp_error_set(S->err, VP_EOVERFLOW,
                                "a unit's parameters overflow 64 bits");
        uint64_t padded;
        vp__chunk_numel(g, p, d->group, d->grank, &padded);
        if (!vp_add_u64(un->padded, padded, &un->padded))
            return vp_error_set(S->err, VP_EOVERFLOW,
                                "a unit's parameters overflow 64 bits");
    }
    for (uint32_t u = 0; u < d->n_units; u++)
        d->units[u].shard = (d->units[u].numel + d->group - 1) / d->group;
    return VP_OK;
}

/* The element sizes: the parameters as the model holds them, those the
 * ops use (FSDP's param_dtype), those reduced. MixedPrecision on an fp32
 * model runs the ops in half precision: the simulator's half mode, with
 * the wrapper keeping the fp32 parameters. */
static vp_status precision(sim *S, vp__dist *d)
{
    const vp_dist *c = d->cfg;
    uint8_t pdt = vp__mp_bytes(c->param_dtype);
    uint8_t rdt = vp__mp_bytes(c->reduce_dtype);

    d->model_eb = S->half ? 2 : 4;
    if (pdt && pdt > d->model_eb)
        return vp_error_set(S->err, VP_EARG,
                            "param_dtype %s is wider than the model's "
                            "parameters", vp_mp_dtype_name(c->param_dtype));
    if (pdt && S->amp)
        return vp_error_set(S->err, VP_EARG,
                            "FSDP's param_dtype and autocast together are not "
                            "modelled: use one of them");
    if (pdt == 2 && !S->half) {
        S->half = true;
        S->A = 2;
        S->PE = 2;
    }
    d->unsharded_eb = pdt ? pdt : d->model_eb;
    d->reduce_eb = rdt ? rdt : d->unsharded_eb;
    return VP_OK;
}

vp_status vp__dist_new(sim *S)
{
    const vp_dist *c = S->s->dist;
    if (S->s->generate.prompt)
        return vp_error_set(S->err, VP_EUNSUPPORTED,
                            "generate() on a data-parallel run is not "
                            "modelled");
    const vp_finetune *ft = &S->s->ft;
    if (ft->lora.r > 0 || ft->freeze[0] != '\0' ||
        ft->quant != VP_QUANT_NONE || ft->base_dtype != VP_BASE_AUTO)
        return vp_error_set(S->err, VP_EUNSUPPORTED,
                            "a data-parallel run with frozen parameters, "
                            "LoRA or a quantized base is not modelled");
    vp_status st = check_cfg(c, S->err);
    if (st != VP_OK)
        return st;
    vp__dist *d = calloc(1, sizeof *d);
    if (!d)
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    S->dist = d;
    d->cfg = c;
    d->rules = rules_of(c->strategy);
    d->group = c->shard ? c->shard : c->world;
    d->grank = c->rank % d->group;
    if (c->strategy == VP_DIST_FSDP_NO_SHARD ||
        (vp_dist_is_fsdp(c->strategy) && c->strategy != VP_DIST_FSDP2 &&
         d->group == 1)) {
        /* FSDP1 falls back to NO_SHARD on one rank (_init_core_state) */
        d->group = 1;
        d->grank = 0;
    }
    st = precision(S, d);
    if (st == VP_OK)
        st = make_units(S, d);
    if (st == VP_OK && vp_dist_is_fsdp(c->strategy) &&
        (S->s->optimizer == VP_OPT_ADAFACTOR || S->s->offload_optimizer))
        st = vp_error_set(S->err, VP_EARG,
                          "FSDP with %s is not modelled (its state is per "
                          "shard)", S->s->offload_optimizer
                                        ? "an offloaded optimizer"
                                        : "Adafactor");
    if (st == VP_OK && d->rules->init)
        st = d->rules->init(S, d);
    return st;
}

void vp__dist_free(sim *S)
{
    vp__dist *d = S->dist;
    if (!d)
        return;
    if (d->rules && d->rules->destroy)
        d->rules->destroy(d);
    if (d->units)
        free(d->units[0].params);
    free(d->units);
    free(d->unit_of_seg);
    free(d->unit_of_param);
    free(d->uses);
    free(d->pending);
    free(d);
    S->dist = NULL;
}

/* ---- hooks ------------------------------------------------------------- */

bool vp__dist_wrap(sim *S, uint32_t *model)
{
    vp__dist *d = S->dist;
    const char *was = S->cur_op;
    S->cur_op = vp_dist_strategy_name(d->cfg->strategy);
    d->rules->wrap(S, model);
    S->stream = VP_STREAM_DEFAULT;
    if (d->cfg->empty_cache_after_wrap)
        vp_allocator_empty_cache(S->a);
    S->cur_op = was;
    return true;
}

void vp__dist_step_begin(sim *S)
{
    vp__dist *d = S->dist;
    d->step++;
    d->n_fwd = 0;
    if (d->rules->step_begin)
        d->rules->step_begin(S);
    S->stream = VP_STREAM_DEFAULT;
}

#define HOOK(name, ...)                                                    \
    do {                                                                   \
        const char *was_ = S->cur_op;                                      \
        if (S->dist->rules->name)                                          \
            S->dist->rules->name(__VA_ARGS__);                             \
        S->stream = VP_STREAM_DEFAULT;                                     \
        S->cur_op = was_;                                                  \
    } while (0)

void vp__dist_impl_free(vp__dist *d, void *const *arrays, size_t n)
{
    vp__free_each(arrays, n);
    free(d->impl);
    d->impl = NULL;
}

void vp__dist_fwd_begin(sim *S)
{
    for (uint32_t p = 0; p < S->g->n_params; p++)
        S->dist->pending[p] = S->dist->uses[p];
    S->dist->n_fwd++;
    HOOK(fwd_begin, S);
}

void vp__dist_fwd_end(sim *S)
{
    HOOK(fwd_end, S);
}

/* The unit of op's segment when op is where a pass enters it (before its
 * first op in the forward, before its last in the backward) or leaves it
 * (after its last op, after its first); UINT32_MAX otherwise. */
static uint32_t unit_edge(const sim *S, uint32_t op, bool after, bool bwd)
{
    const vp_graph *g = S->g;
    int32_t seg = g->ops[op].segment;
    if (seg < 0)
        return UINT32_MAX;
    uint32_t edge =
        after != bwd ? g->segs[seg].last_op : g->segs[seg].first_op;
    return op == edge ? (uint32_t)S->dist->unit_of_seg[seg] : UINT32_MAX;
}

void vp__dist_fwd_op(sim *S, uint32_t op, bool after)
{
    uint32_t u = unit_edge(S, op, after, false);
    if (!after)
        HOOK(op_fwd, S, op, false);
    if (u != UINT32_MAX && !after)
        HOOK(unit_fwd_begin, S, u);
    else if (u != UINT32_MAX)
        HOOK(unit_fwd_end, S, u);
    if (after)
        HOOK(op_fwd, S, op, true);
}

void vp__dist_bwd_begin(sim *S)
{
    HOOK(bwd_begin, S);
}

void vp__dist_bwd_end(sim *S)
{
    HOOK(bwd_end, S);
}

void vp__dist_bwd_op(sim *S, uint32_t op, bool after)
{
    uint32_t u = unit_edge(S, op, after, true);
    if (!after)
        HOOK(op_bwd, S, op, false);
    if (u != UINT32_MAX && !after)
        HOOK(unit_bwd_begin, S, u);
    else if (u != UINT32_MAX)
        HOOK(unit_bwd_end, S, u);
    if (after)
        HOOK(op_bwd, S, op, true);
}

void vp__dist_recompute_op(sim *S, uint32_t op, bool after)
{
    HOOK(op_recompute, S, op, after);
}

void vp__dist_recompute_end(sim *S)
{
    HOOK(recompute_end, S);
}

/* A parameter's gradient is complete when its last use in the graph has
 * handed it on (autograd sums the uses of a tied weight before its
 * AccumulateGrad runs once). */
void vp__dist_grad(sim *S, uint32_t p)
{
    vp__dist *d = S->dist;
    if (d->pending[p] > 0 && --d->pending[p] > 0)
        return;
    HOOK(grad_ready, S, p);
}

void vp__dist_zero_grad(sim *S)
{
    HOOK(zero_grad, S);
}

void vp__dist_opt_begin(sim *S)
{
    HOOK(opt_begin, S);
}

void vp__dist_param_built(sim *S, uint32_t p, uint32_t *t)
{
    HOOK(param_built, S, p, t);
}

/* ---- helpers ----------------------------------------------------------- */

uint32_t vp__dist_alloc(sim *S, uint64_t bytes, vp_category cat, int stream,
                        const char *what)
{
    if (what)
        S->cur_op = what;
    S->stream = stream;
    uint32_t id = vp__talloc(S, bytes, cat);
    S->stream = VP_STREAM_DEFAULT;
    return id;
}

void vp__dist_free_id(sim *S, uint32_t *id)
{
    if (*id == NONE)
        return;
    uint32_t t = *id;
    *id = NONE;
    vp__tunref(S, t);
}
