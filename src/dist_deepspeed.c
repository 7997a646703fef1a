/* DeepSpeed's ZeRO engine, one rank: its knobs (zero/config.py names and
 * defaults), the state every stage shares, and ZeRO-1/2's rules (ZeRO-3's:
 * dist_zero3.c): the engine's own allocations and frees as its source
 * makes them, over the same op rules and allocator model as one GPU.
 * Sources (deepspeedai/DeepSpeed, deepspeed/runtime), docs/DISTRIBUTED.md
 * "DeepSpeed ZeRO" gives each rule:
 *   zero/stage_1_and_2.py  DeepSpeedZeroOptimizer.__init__ (the aligned
 *       flat bit16 group, single_partition_of_fp32_groups,
 *       initialize_optimizer_states), setup_buckets (the ipg buffers),
 *       reduce_independent_p_g_buckets_and_remove_grads, reduce_ipg_grads,
 *       copy_grads_in_partition, independent_gradient_partition_epilogue,
 *       get_partition_info, get_flat_partition, get_grad_norm_direct,
 *       has_overflow_partitioned_grads_serial, _has_inf_or_nan, step
 *   engine.py              allreduce_gradients (when each stage reduces),
 *       _do_optimizer_sanity_check
 * The optimizer is DeepSpeed's FusedAdam (adamw-fused: fp32 moments, no
 * temporaries) or a client torch AdamW (its temporaries over the fp32
 * partition), or DeepSpeedCPUAdam on the host when offloaded. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_ds.h"
#include "dist_ds_impl.h"

/* ---- the config's knobs ------------------------------------------------ */

#define NAME_OF(name, str) str,
static const char *const OFFLOAD_NAMES[] = {VP_DS_OFFLOAD_MAP(NAME_OF)};
#undef NAME_OF

const char *const vp_ds_config_keys[] = {
    "reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients",
    "overlap_comm", "round_robin_gradients", "offload_optimizer",
    "offload_param", "stage3_prefetch_bucket_size",
    "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold", "sub_group_size",
    "gradient_clipping", "zero_init", NULL};

enum {
    K_REDUCE, K_ALLGATHER, K_CONTIG, K_OVERLAP, K_ROUND_ROBIN, K_OFF_OPT,
    K_OFF_PARAM, K_PREFETCH, K_MAX_LIVE, K_REUSE, K_PERSIST, K_SUBGROUP,
    K_CLIP, K_ZERO_INIT
};

void vp_ds_config_init(vp_ds_config *c)
{
    memset(c, 0, sizeof *c);
    c->reduce_bucket_size = 500000000;   /* pp_int(5e8)  */
    c->allgather_bucket_size = 500000000;
    c->contiguous_gradients = true;
    c->overlap_comm = -1;                /* stage == 3   */
    c->prefetch_bucket_size = 50000000;  /* pp_int(5e7)  */
    c->max_live_parameters = 1000000000; /* pp_int(1e9)  */
    c->max_reuse_distance = 1000000000;
    c->param_persistence_threshold = 100000; /* pp_int(1e5) */
    c->sub_group_size = 1000000000;
}

/* A count as a config writes it: 500000000 or 5e8 (a whole number). */
static bool parse_count(const char *v, uint64_t *out)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end != '\0' || !(x >= 0) || x > 1.8e19 ||
        x != floor(x))
        return false;
    *out = (uint64_t)x;
    return true;
}

static bool parse_bool(const char *v, bool *out)
{
    if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0) {
        *out = v[0] == 't';
        return true;
    }
    return false;
}

vp_status vp_ds_config_set(vp_ds_config *c, const char *key,
                           const char *value, vp_error *err)
{
    int k = 0;
    while (vp_ds_config_keys[k] && strcmp(vp_ds_config_keys[k], key) != 0)
        k++;
    if (!vp_ds_config_keys[k])
        return vp_error_set(err, VP_EARG,
                            "unknown DeepSpeed knob '%s' (known: "
                            "reduce_bucket_size, allgather_bucket_size, "
                            "contiguous_gradients, overlap_comm, "
                            "round_robin_gradients, offload_optimizer, "
                            "offload_param, stage3_prefetch_bucket_size, "
                            "stage3_max_live_parameters, "
                            "stage3_max_reuse_distance, "
                            "stage3_param_persistence_threshold, "
                            "sub_group_size, gradient_clipping, "
                            "zero_init)", key);
    bool ok = true, b = false;
    uint64_t *count[] = {
        [K_REDUCE] = &c->reduce_bucket_size,
        [K_ALLGATHER] = &c->allgather_bucket_size,
        [K_PREFETCH] = &c->prefetch_bucket_size,
        [K_MAX_LIVE] = &c->max_live_parameters,
        [K_REUSE] = &c->max_reuse_distance,
        [K_PERSIST] = &c->param_persistence_threshold,
        [K_SUBGROUP] = &c->sub_group_size,
    };
    switch (k) {
    case K_CONTIG:
    case K_OVERLAP:
    case K_ROUND_ROBIN:
    case K_ZERO_INIT:
        ok = parse_bool(value, &b);
        if (k == K_CONTIG)
            c->contiguous_gradients = b;
        else if (k == K_OVERLAP)
            c->overlap_comm = b;
        else if (k == K_ZERO_INIT)
            c->zero_init = b;
        else
            c->round_robin_gradients = b;
        break;
    case K_OFF_OPT:
    case K_OFF_PARAM: {
        int d = 0;
        while (d < VP_DS_OFFLOAD__COUNT && strcmp(OFFLOAD_NAMES[d], value))
            d++;
        ok = d < VP_DS_OFFLOAD__COUNT;
        if (ok && k == K_OFF_OPT)
            c->offload_optimizer = (vp_ds_offload)d;
        else if (ok)
            c->offload_param = (vp_ds_offload)d;
        break;
    }
    case K_CLIP: {
        char *end;
        double x = strtod(value, &end);
        ok = end != value && *end == '\0' && x >= 0 && x < 1e30;
        if (ok)
            c->gradient_clipping = x;
        break;
    }
    default:
        ok = parse_count(value, count[k]);
        break;
    }
    if (!ok)
        return vp_error_set(err, VP_EARG,
                            "invalid value '%s' for DeepSpeed's %s (%s)",
                            value, key,
                            k == K_OFF_OPT || k == K_OFF_PARAM
                                ? "none, cpu or nvme"
                            : k == K_CONTIG || k == K_OVERLAP ||
                                    k == K_ROUND_ROBIN || k == K_ZERO_INIT
                                ? "true or false"
                            : k == K_CLIP ? "a number >= 0"
                                          : "a whole number of elements");
    return VP_OK;
}

vp_status vp_ds_config_parse(vp_ds_config *c, const char *text,
                             vp_error *err)
{
    char buf[512];
    size_t n = strlen(text);
    if (n >= sizeof buf)
        return vp_error_set(err, VP_EARG, "the DeepSpeed knobs are longer "
                                          "than %zu characters",
                            sizeof buf - 1);
    memcpy(buf, text, n + 1);
    for (char *kv = buf, *next; kv; kv = next) {
        next = strchr(kv, ',');
        if (next)
            *next++ = '\0';
        char *eq = strchr(kv, '=');
        if (!eq)
            return vp_error_set(err, VP_EARG,
                                "DeepSpeed knob '%s' has no '=VALUE'", kv);
        *eq = '\0';
        vp_status st = vp_ds_config_set(c, kv, eq + 1, err);
        if (st != VP_OK)
            return st;
    }
    return VP_OK;
}

vp_status vp_ds_config_json(vp_ds_config *c, const json_t *obj,
                            vp_error *err)
{
    const char *k;
    json_t *x;
    char text[64];

    if (!json_is_object(obj))
        return vp_error_set(err, VP_EARG,
                            "ds_config must be an object of DeepSpeed knobs");
    json_object_foreach((json_t *)obj, k, x) {
        if (json_is_boolean(x))
            snprintf(text, sizeof text, "%s",
                     json_is_true(x) ? "true" : "false");
        else if (json_is_integer(x))
            snprintf(text, sizeof text, "%lld",
                     (long long)json_integer_value(x));
        else if (json_is_real(x))
            snprintf(text, sizeof text, "%.17g", json_real_value(x));
        else if (json_is_string(x))
            snprintf(text, sizeof text, "%s", json_string_value(x));
        else
            return vp_error_set(err, VP_EARG,
                                "ds_config '%s': a number, true/false or a "
                                "string", k);
        vp_status st = vp_ds_config_set(c, k, text, err);
        if (st != VP_OK)
            return st;
    }
    return VP_OK;
}

/* ---- the rank's state (dist_ds_impl.h) --------------------------------- */

bool vp__ds_trainable(const vp_graph *g, uint32_t p)
{
    return g->params[p].trainable && !vp__dist_is_buffer(g, p) &&
           !g->params[p].adapter;
}

vp_status vp__ds_oom(sim *S)
{
    return vp_error_set(S->err, VP_ENOMEM, "out of memory");
}

static vp_status too_big(sim *S)
{
    return vp_error_set(S->err, VP_EOVERFLOW,
                        "the parameters overflow 64 bits");
}

uint64_t vp__ds_partition(const vp_graph *g, uint32_t world, uint32_t rank,
                          uint64_t *in_part, uint64_t *pad,
                          uint64_t *overlap_n)
{
    uint64_t total = 0;
    for (uint32_t p = 0; p < g->n_params; p++)
        if (vp__ds_trainable(g, p) &&
            !vp_add_u64(total, g->params[p].numel, &total))
            return 0;
    /* alignment = nccl_start_alignment_factor (2) x world */
    uint64_t align = 2 * (uint64_t)world;
    uint64_t aligned = (total + align - 1) / align * align;
    if (aligned < total)
        return 0;
    uint64_t part = aligned / world;
    uint64_t lo = part * rank, hi = lo + part, at = 0;
    *pad = total <= lo ? part : total < hi ? hi - total : 0;
    *in_part = 0;
    for (uint32_t p = 0; p < g->n_params; p++) {
        if (!vp__ds_trainable(g, p))
            continue;
        uint64_t n = g->params[p].numel, end = at + n;
        if (at < hi && end > lo) {
            uint64_t a = at > lo ? at : lo, b = end < hi ? end : hi;
            if (overlap_n)
                overlap_n[p] = b - a;
            *in_part += n;
        }
        at = end;
    }
    return part;
}

/* get_partition_info over the flat group (round_robin_gradients off). */
static vp_status flat_layout(sim *S, ds *z, uint32_t rank, uint32_t world)
{
    const vp_graph *g = S->g;
    for (uint32_t p = 0; p < g->n_params; p++) {
        if (!vp__ds_trainable(g, p))
            continue;
        z->flat_pos[p] = 1;
        if (!vp_add_u64(z->numel, g->params[p].numel, &z->numel))
            return too_big(S);
        if (g->params[p].numel > z->largest)
            z->largest = g->params[p].numel;
    }
    z->part = vp__ds_partition(g, world, rank, &z->in_part, &z->pad,
                               z->overlap_n);
    if (z->numel && !z->part)
        return too_big(S);
    return VP_OK;
}

/* ZeRO-3: each param's partition (Init._partition_param: the numel padded
 * to a multiple of the world, / world), persistence, the modules, the sub
 * groups (_create_fp16_sub_groups: sub_group_size elements each). */
static vp_status z3_layout(sim *S, ds *z, uint32_t world)
{
    const vp_graph *g = S->g;
    const vp_ds_config *c = &S->dist->cfg->ds;
    uint64_t cur = 0, total = 0;
    z->n_sub = 0;
    for (uint32_t p = 0; p < g->n_params; p++) {
        if (vp__dist_is_buffer(g, p) || g->params[p].adapter)
            continue;
        uint64_t n = g->params[p].numel;
        z->pnumel[p] = n / world + (n % world != 0);
        z->persist[p] = n <= c->param_persistence_threshold;
        if (!vp__ds_trainable(g, p))
            continue;
        if (cur > 0 && cur + n > c->sub_group_size) {
            z->n_sub++;
            cur = 0;
        }
        if (!vp_add_u64(cur, n, &cur) || !vp_add_u64(total, n, &total))
            return too_big(S);
        if (!vp_add_u64(z->sub[z->n_sub], z->pnumel[p], &z->sub[z->n_sub]))
            return too_big(S);
    }
    if (total > 0)
        z->n_sub++;
    z->trace_mode = 0; /* RECORD */
    z->defer = NONE;
    return VP_OK;
}

/* What the engine is modelled with: the module's precision and optimizer
 * (engine.py _do_optimizer_sanity_check), the knobs' ranges. */
static vp_status check(sim *S, const vp_ds_config *c, int stage)
{
    vp_optimizer o = S->s->optimizer;
    if (S->amp)
        return vp_error_set(S->err, VP_EARG,
                            "DeepSpeed runs its module in bf16 or fp16 "
                            "(\"bf16\": {\"enabled\": true}), not under "
                            "autocast (engine.py: Amp and ZeRO are not "
                            "compatible): use precision bf16, fp16 or fp32");
    if (o != VP_OPT_ADAMW_FUSED && o != VP_OPT_ADAMW &&
        o != VP_OPT_ADAMW_FORLOOP)
        return vp_error_set(S->err, VP_EARG,
                            "DeepSpeed's ZeRO is modelled with Adam: its "
                            "FusedAdam (adamw-fused, the config's \"Adam\"), "
                            "or a client torch.optim.AdamW (adamw, "
                            "adamw-forloop) stepping the fp32 partition; "
                            "DeepSpeedCPUAdam with offload_optimizer");
    if (S->s->offload_optimizer)
        return vp_error_set(S->err, VP_EARG,
                            "DeepSpeed offloads through its own "
                            "offload_optimizer knob (--ds "
                            "offload_optimizer=cpu), not "
                            "--offload-optimizer");
    if ((c->offload_param || c->zero_init) && stage != 3)
        return vp_error_set(S->err, VP_EARG,
                            "%s is ZeRO stage 3's", c->zero_init
                                                        ? "zero_init"
                                                        : "offload_param");
    if (c->reduce_bucket_size == 0 ||
        c->reduce_bucket_size > UINT64_MAX / 8)
        return vp_error_set(S->err, VP_EARG,
                            "reduce_bucket_size %llu is outside 1..2^61 "
                            "elements",
                            (unsigned long long)c->reduce_bucket_size);
    if (c->allgather_bucket_size % 2)
        return vp_error_set(S->err, VP_EARG,
                            "allgather_bucket_size must be a multiple of "
                            "nccl_start_alignment_factor (2)");
    return VP_OK;
}

/* The state's arrays, per parameter (and per op: the modules). */
static bool alloc_arrays(ds *z, size_t np, size_t nops)
{
    z->overlap_n = calloc(np, sizeof *z->overlap_n);
    z->flat_pos = calloc(np, sizeof *z->flat_pos);
    z->bucket = calloc(np, sizeof *z->bucket);
    z->pnumel = calloc(np, sizeof *z->pnumel);
    z->persist = calloc(np, sizeof *z->persist);
    z->gath = malloc(np * sizeof *z->gath);
    z->recent = calloc(np, sizeof *z->recent);
    z->cap_trace = nops <= UINT32_MAX / 3 ? (uint32_t)(3 * nops) : 0;
    z->trace = calloc(z->cap_trace ? z->cap_trace : 1, sizeof *z->trace);
    z->sub = calloc(np, sizeof *z->sub);
    z->opt_n = calloc(np, sizeof *z->opt_n);
    z->on = calloc(np, sizeof *z->on);
    z->own = malloc(np * sizeof *z->own);
    if (!z->overlap_n || !z->flat_pos || !z->bucket || !z->pnumel ||
        !z->persist || !z->gath || !z->recent || !z->trace || !z->sub ||
        !z->opt_n || !z->on || !z->own)
        return false;
    for (size_t p = 0; p < np; p++)
        z->gath[p] = z->own[p] = NONE;
    z->ipg[0] = z->ipg[1] = z->gip = z->held = z->padz = NONE;
    z->fp32_grad = z->grad_flat = NONE;
    return true;
}

vp_status vp__ds_init(sim *S, vp__dist *d)
{
    const vp_graph *g = S->g;
    const vp_ds_config *c = &d->cfg->ds;
    int stage = d->cfg->strategy == VP_DIST_DS_ZERO1   ? 1
                : d->cfg->strategy == VP_DIST_DS_ZERO2 ? 2
                                                       : 3;
    vp_status st = check(S, c, stage);
    if (st != VP_OK)
        return st;
    ds *z = calloc(1, sizeof *z);
    if (!z)
        return vp__ds_oom(S);
    d->impl = z;
    z->stage = stage;
    z->overlap = c->overlap_comm < 0 ? z->stage == 3 : c->overlap_comm;
    z->offload_opt = c->offload_optimizer != VP_DS_OFFLOAD_NONE;
    z->offload_par = c->offload_param != VP_DS_OFFLOAD_NONE;
    z->eb = d->model_eb;
    if (!alloc_arrays(z, g->n_params ? g->n_params : 1,
                      g->n_ops ? g->n_ops : 1))
        return vp__ds_oom(S);
    st = z->stage == 3 ? z3_layout(S, z, d->group)
                       : flat_layout(S, z, d->grank, d->group);
    if (st != VP_OK)
        return st;
    if (z->stage == 3) {
        memcpy(z->opt_n, z->sub, z->n_sub * sizeof *z->opt_n);
        S->n_opt = z->n_sub;
    } else {
        z->opt_n[0] = z->part;
        S->n_opt = 1;
    }
    for (uint32_t k = 0; k < S->n_opt; k++)
        z->on[k] = !z->offload_opt;
    S->opt_numel = z->opt_n;
    S->opt_on = z->on;
    S->opt_eb = 4;
    return VP_OK;
}

void vp__ds_destroy(vp__dist *d)
{
    ds *z = d->impl;
    if (!z)
        return;
    void *arrays[] = {z->overlap_n, z->flat_pos, z->bucket, z->pnumel,
                      z->persist,   z->gath,     z->recent, z->trace,
                      z->sub,       z->opt_n,    z->on,     z->own};
    vp__dist_impl_free(d, arrays, sizeof arrays / sizeof *arrays);
}

/* Host bytes of the offloads (pinned, not on the GPU): the fp32 master
 * partition, Adam's two moments and the fp32 gradient (4 B each), the
 * bit16 staging copy; offload_param adds the bit16 partitions. */
void vp__ds_host_bytes(sim *S, ds *z, uint64_t part)
{
    uint64_t per = 16 + (uint64_t)z->eb;
    if (z->offload_par)
        per += z->eb;
    uint64_t b = vp__mulc(S, part, per);
    if (b > S->out->host_bytes)
        S->out->host_bytes = b;
}

/* ---- ZeRO-1 and 2 ------------------------------------------------------ */

/* DeepSpeedZeroOptimizer.__init__: empty_cache(); the group flattened
 * (align_dense_tensors pads it to 2 x world elements; the model's params
 * become views of it); this rank's partition cloned and cast to fp32
 * (single_partition_of_fp32_groups; on the host when offloaded, with
 * temp_grad_buffer_for_gpu_offload on the GPU); initialize_optimizer_
 * states' zero fp32 gradient, dropped at once unless offloaded. */
static void z12_wrap(sim *S, uint32_t *model)
{
    vp__dist *d = S->dist;
    ds *z = d->impl;
    const vp_graph *g = S->g;
    vp__model_convert(S, model);
    vp_allocator_empty_cache(S->a);
    uint64_t aligned = vp__mulc(S, z->part, d->group);
    uint32_t pad = NONE;
    if (aligned > z->numel)
        pad = vp__dist_alloc(S, vp__mulc(S, aligned - z->numel, z->eb),
                             VP_CAT_TEMP, VP_STREAM_DEFAULT, "zero pad");
    vp__dist_alloc(S, vp__mulc(S, aligned, z->eb), VP_CAT_PARAM,
                   VP_STREAM_DEFAULT, "zero bit16_groups_flat");
    vp__dist_free_id(S, &pad);
    for (uint32_t p = 0; p < g->n_params; p++)
        if (z->flat_pos[p])
            vp__dist_free_id(S, &model[p]);
    /* .clone().to(fp32): the clone is the master when already fp32 */
    uint32_t clone = vp__dist_alloc(
        S, vp__mulc(S, z->part, z->eb),
        z->eb == 4 && !z->offload_opt ? VP_CAT_OPTIM : VP_CAT_TEMP,
        VP_STREAM_DEFAULT, "zero fp32 partition");
    if (z->offload_opt) {
        vp__dist_free_id(S, &clone);
        vp__dist_alloc(S, vp__mulc(S, z->largest, z->eb), VP_CAT_GRAD,
                       VP_STREAM_DEFAULT, "zero temp_grad_buffer");
        vp__ds_host_bytes(S, z, z->part);
        return;
    }
    if (z->eb != 4) {
        vp__dist_alloc(S, vp__mulc(S, z->part, 4), VP_CAT_OPTIM,
                       VP_STREAM_DEFAULT, NULL);
        vp__dist_free_id(S, &clone);
    }
    uint32_t zg = vp__dist_alloc(S, vp__mulc(S, z->part, 4), VP_CAT_TEMP,
                                 VP_STREAM_DEFAULT, "zero init grad");
    vp__dist_free_id(S, &zg);
}

/* setup_buckets, at the first gradient of a backward: the ipg buffer
 * (two with overlap_comm), reduce_bucket_size elements each. */
static void setup_buckets(sim *S, ds *z)
{
    if (z->ready || !S->dist->cfg->ds.contiguous_gradients)
        return;
    uint64_t b = vp__mulc(S, S->dist->cfg->ds.reduce_bucket_size, z->eb);
    z->ipg[0] = vp__dist_alloc(S, b, VP_CAT_GRAD, VP_STREAM_DEFAULT,
                               "zero ipg buffer");
    if (z->overlap)
        z->ipg[1] = vp__dist_alloc(S, b, VP_CAT_GRAD, VP_STREAM_DEFAULT,
                                   "zero ipg buffer");
    z->ipg_idx = 0;
    z->ready = true;
}

/* Offloaded (stage_1_and_2.py, copy_grads_in_partition's cpu_offload
 * branch): the gradient's norm from a double copy (set_norm_for_param_
 * grad_in_gpu), then its portion cast to fp32 for the host copy
 * (async_inplace_copy_grad_to_fp32_buffer_from_gpu). */
static void offload_grad(sim *S, ds *z, uint32_t p)
{
    uint64_t n = S->g->params[p].numel;
    vp__transient(S, vp__mulc(S, n, 8));
    vp__transient(S, vp__mulc(S, z->overlap_n[p], 4));
}

/* reduce_ipg_grads: the bucket reduced; each of its params' gradients
 * copied into grads_in_partition when the partition holds it (allocated
 * at the first, Σ numel of the partition's params), dropped otherwise
 * (stage 2); an extra-large param's own gradient freed after. */
static void reduce_ipg(sim *S, ds *z)
{
    const char *was = S->cur_op;
    S->cur_op = "zero reduce_ipg_grads";
    for (uint32_t k = 0; k < z->n_bucket && OK(S); k++) {
        uint32_t p = z->bucket[k];
        bool mine = z->overlap_n[p] > 0;
        if (mine && z->offload_opt)
            offload_grad(S, z, p);
        else if (mine && S->dist->cfg->ds.contiguous_gradients &&
                 z->gip == NONE)
            z->gip = vp__dist_alloc(S, vp__mulc(S, z->in_part, z->eb),
                                    VP_CAT_GRAD,
                                    z->overlap ? VP_STREAM_REDUCE
                                               : VP_STREAM_DEFAULT,
                                    "zero grads_in_partition");
        /* a gradient left as its own tensor (extra-large, or without
         * contiguous_gradients): stage 2 drops it when not this rank's
         * (clear_grad_attribute); this rank's goes once copied into
         * grads_in_partition, else averaged_gradients keeps it */
        bool copied = mine && S->dist->cfg->ds.contiguous_gradients &&
                      !z->offload_opt;
        if (S->pgrad[p] != NONE && ((z->stage == 2 && !mine) || copied))
            vp__dist_free_id(S, &S->pgrad[p]);
    }
    z->n_bucket = 0;
    z->bucket_n = 0;
    S->cur_op = was;
}

/* reduce_independent_p_g_buckets_and_remove_grads. */
static void to_bucket(sim *S, ds *z, uint32_t p)
{
    const vp_ds_config *c = &S->dist->cfg->ds;
    uint64_t n = S->g->params[p].numel;
    if (n == 0)
        return;
    if (z->bucket_n + n > c->reduce_bucket_size) {
        reduce_ipg(S, z);
        if (c->contiguous_gradients && z->overlap)
            z->ipg_idx = 1 - z->ipg_idx;
    }
    /* copied into the contiguous buffer: .grad becomes a view of it */
    if (c->contiguous_gradients && n <= c->reduce_bucket_size)
        vp__dist_free_id(S, &S->pgrad[p]);
    z->bucket_n += n;
    z->bucket[z->n_bucket++] = p;
}

static bool boundary(const sim *S)
{
    return S->dist->n_fwd >= S->s->accum;
}

static void z12_grad_ready(sim *S, uint32_t p)
{
    ds *z = S->dist->impl;
    if (!z->flat_pos[p] || S->pgrad[p] == NONE)
        return;
    /* process_gradients: hooks exist with contiguous_gradients,
     * overlap_comm or stage 2 */
    if (!S->dist->cfg->ds.contiguous_gradients && !z->overlap &&
        z->stage == 1)
        return;
    setup_buckets(S, z);
    if (z->stage == 2 || (z->overlap && boundary(S)))
        to_bucket(S, z, p);
}

/* independent_gradient_partition_epilogue: the bucket's rest reduced;
 * all_grad_tensors keeps the partition's gradients (a later micro-batch's
 * added into them); at the boundary get_flat_partition lists them, with
 * zeros for the partition's padding; the ipg buffers released and every
 * .grad dropped. */
static void epilogue(sim *S, ds *z)
{
    reduce_ipg(S, z);
    if (!z->offload_opt) {
        if (z->held == NONE) {
            z->held = z->gip;
        } else {
            vp__dist_free_id(S, &z->gip);
        }
        z->gip = NONE;
        if (boundary(S) && z->pad)
            z->padz = vp__dist_alloc(S, vp__mulc(S, z->pad, z->eb),
                                     VP_CAT_GRAD, VP_STREAM_DEFAULT,
                                     "zero partition padding");
    }
    vp__dist_free_id(S, &z->ipg[0]);
    vp__dist_free_id(S, &z->ipg[1]);
    z->ready = false;
    /* _clear_param_grad_only: a gradient of this rank's own (without
     * contiguous_gradients) stays in all_grad_tensors (the first
     * micro-batch's; a later one is added into it and dropped) */
    for (uint32_t p = 0; p < S->g->n_params; p++) {
        if (!z->flat_pos[p])
            continue;
        if (z->overlap_n[p] && !z->offload_opt && z->own[p] == NONE) {
            z->own[p] = S->pgrad[p];
            S->pgrad[p] = NONE;
        }
        vp__dist_free_id(S, &S->pgrad[p]);
    }
}

/* engine.allreduce_gradients after each backward: stage 2 runs the
 * epilogue every micro-batch; stage 1 at the boundary only, after
 * reduce_gradients has put every gradient through the buckets in the
 * group's order (without overlap_comm). */
static void z12_bwd_end(sim *S)
{
    ds *z = S->dist->impl;
    if (z->stage == 1 && !boundary(S))
        return;
    if (z->stage == 1 && !z->overlap) {
        if (S->dist->cfg->ds.contiguous_gradients)
            setup_buckets(S, z);
        for (uint32_t p = 0; p < S->g->n_params && OK(S); p++)
            if (z->flat_pos[p] && S->pgrad[p] != NONE)
                to_bucket(S, z, p);
    }
    epilogue(S, z);
}

/* has_overflow_partitioned_grads_serial (fp16's loss scaler): per
 * gradient x.float(), isnan, isinf, logical_or, .float(), max. */
static void overflow_check(sim *S, uint64_t n)
{
    uint32_t t[5];
    uint64_t sz[5] = {4, 1, 1, 1, 4};
    for (int k = 0; k < 5; k++)
        t[k] = vp__talloc(S, vp__mulc(S, n, sz[k]), VP_CAT_TEMP);
    vp__transient(S, 4);
    for (int k = 5; k-- > 0;)
        vp__tunref(S, t[k]);
}

/* get_grad_norm_direct: each gradient's L2 norm from a double copy
 * (g.data.double()), the norms stacked. Runs every step, clipping or
 * not (scaled_global_norm). */
static void grad_norm(sim *S, const uint64_t *n, uint32_t k)
{
    uint32_t norms = vp__talloc(S, vp__mulc(S, k, 8), VP_CAT_TEMP);
    for (uint32_t i = 0; i < k && OK(S); i++)
        if (n[i])
            vp__transient(S, vp__mulc(S, n[i], 8));
    vp__transient(S, vp__mulc(S, k, 8)); /* stack().square() */
    vp__tunref(S, norms);
}

void vp__ds_step_checks(sim *S, const uint64_t *n, uint32_t k)
{
    if (S->s->precision == VP_PREC_FP16) {
        vp__transient(S, 4); /* invalid_grad_count */
        for (uint32_t i = 0; i < k && OK(S); i++)
            overflow_check(S, n[i]);
    }
    grad_norm(S, n, k);
}

/* The averaged gradients' lengths (each param's portion, the padding). */
static uint32_t portions(const sim *S, const ds *z, uint64_t *out)
{
    uint32_t k = 0;
    for (uint32_t p = 0; p < S->g->n_params; p++)
        if (z->overlap_n[p])
            out[k++] = z->overlap_n[p];
    if (z->pad)
        out[k++] = z->pad;
    return k;
}

/* step: the loss scaler's overflow check (fp16), the norm, the flat
 * bit16 gradient of the partition cast to fp32, the partition's
 * gradients released; the fp32 gradient dropped after optimizer.step
 * (zero_grad below). */
static void z12_opt_begin(sim *S)
{
    ds *z = S->dist->impl;
    S->cur_op = "zero step";
    if (z->offload_opt)
        return;
    uint64_t *n = malloc((S->g->n_params + 1) * sizeof *n);
    if (!n) {
        S->st = vp__ds_oom(S);
        return;
    }
    uint32_t k = portions(S, z, n);
    vp__ds_step_checks(S, n, k);
    free(n);
    uint32_t flat = vp__talloc(S, vp__mulc(S, z->part, z->eb), VP_CAT_TEMP);
    if (z->eb != 4) {
        z->fp32_grad = vp__talloc(S, vp__mulc(S, z->part, 4), VP_CAT_GRAD);
        vp__tunref(S, flat);
    } else {
        z->fp32_grad = flat;
    }
    vp__dist_free_id(S, &z->held);
    vp__dist_free_id(S, &z->padz);
    for (uint32_t p = 0; p < S->g->n_params; p++)
        vp__dist_free_id(S, &z->own[p]);
}

void vp__ds_zero_grad(sim *S)
{
    ds *z = S->dist->impl;
    vp__dist_free_id(S, &z->fp32_grad);
}

/* ---- the tables -------------------------------------------------------- */

const vp__dist_rules vp__dist_zero12_rules = {
    .init = vp__ds_init,
    .wrap = z12_wrap,
    .bwd_end = z12_bwd_end,
    .grad_ready = z12_grad_ready,
    .opt_begin = z12_opt_begin,
    .zero_grad = vp__ds_zero_grad,
    .destroy = vp__ds_destroy,
};

/* ---- roles ------------------------------------------------------------- */

/* One rank's signature: the params its partition meets (their elements
 * in it and whole), its padding; ZeRO-3's partitions are alike. */
static uint64_t rank_signature(const vp_graph *g, const vp_dist *d,
                               uint32_t rank, uint64_t *n)
{
    uint64_t in, pad, h = 1469598103934665603ull;
    memset(n, 0, (g->n_params ? g->n_params : 1) * sizeof *n);
    vp__ds_partition(g, d->world, rank, &in, &pad, n);
    for (uint32_t p = 0; p < g->n_params; p++)
        if (n[p])
            h = (((h ^ n[p]) * 1099511628211ull) ^ g->params[p].numel) *
                1099511628211ull;
    return (h ^ pad) * 1099511628211ull;
}

uint32_t vp__ds_heaviest_rank(const vp_graph *g, const vp_dist *d)
{
    uint64_t best = 0, in, pad;
    uint32_t who = 0;
    for (uint32_t r = 0; d->strategy != VP_DIST_DS_ZERO3 && r < d->world;
         r++) {
        vp__ds_partition(g, d->world, r, &in, &pad, NULL);
        if (in > best) {
            best = in;
            who = r;
        }
    }
    return who;
}

vp_status vp__ds_signatures(const vp_graph *g, const vp_dist *d,
                            uint64_t *sig, vp_error *err)
{
    uint32_t w = d->world;
    if (d->strategy == VP_DIST_DS_ZERO3)
        return VP_OK; /* every partition padded alike: one role */
    uint64_t *n = malloc((g->n_params ? g->n_params : 1) * sizeof *n);
    if (!n)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    for (uint32_t r = 0; r < w; r++)
        sig[r] = rank_signature(g, d, r, n);
    free(n);
    if (w <= VP_DS_MAX_ROLES)
        return VP_OK;
    /* beyond that, three roles: the heaviest partition, the last (the
     * padding), and rank 0 for the others */
    uint32_t h = vp__ds_heaviest_rank(g, d);
    for (uint32_t r = 1; r + 1 < w; r++)
        if (r != h)
            sig[r] = sig[0];
    return VP_OK;
}
