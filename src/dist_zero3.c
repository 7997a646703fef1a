/* DeepSpeed ZeRO-3, one rank (DeepSpeedZeroOptimizer_Stage3): parameters
 * partitioned and gathered per module, gradients reduce-scattered through
 * the ipg bucket into their partitions. Sources (deepspeedai/DeepSpeed,
 * deepspeed/runtime), docs/DISTRIBUTED.md "DeepSpeed ZeRO":
 *   zero/stage3.py  _setup_for_real_optimizer, initialize_optimizer_states,
 *       __add_grad_to_ipg_bucket, __reduce_and_partition_ipg_grads,
 *       partition_grads, step, _prepare_fp32_grad_for_sub_group,
 *       get_grad_norm_direct
 *   zero/partition_parameters.py  Init._partition_param, _aligned_size,
 *       Init._post_init_method
 *   zero/partitioned_param_coordinator.py  fetch_sub_module (prefetch),
 *       release_sub_module, __params_to_release (reuse distance)
 *   comm/coalesced_collectives.py  reduce_scatter_coalesced
 * The knobs, the state and the shared steps: dist_deepspeed.c. */
#include <stdlib.h>
#include <string.h>

#include "dist_ds_impl.h"


/* The parameter's all-gathered tensor (partition x world elements). */
static void gather(sim *S, ds *z, uint32_t p)
{
    if (z->gath[p] != NONE || z->persist[p] || !z->pnumel[p])
        return;
    /* the coordinator's __allgather_stream: its own with overlap_comm,
     * else the default (parameter_offload.py) */
    z->gath[p] = vp__dist_alloc(
        S, vp__mulc(S, vp__mulc(S, z->pnumel[p], S->dist->group), z->eb),
        VP_CAT_PARAM, z->overlap ? VP_STREAM_UNSHARD : VP_STREAM_DEFAULT,
        "zero3 all-gather");
    z->n_avail += S->g->params[p].numel;
}

static void release(sim *S, ds *z, uint32_t p)
{
    if (z->gath[p] == NONE)
        return;
    vp__dist_free_id(S, &z->gath[p]);
    z->n_avail -= S->g->params[p].numel;
}

/* Init(module): the module converted, each parameter partitioned (its
 * padded partition made, the whole freed unless persistent: numel <=
 * stage3_param_persistence_threshold), the partitions of each sub group
 * moved into one flat buffer (_create_fp16_partitions_with_
 * defragmentation: zero/utils.py defragment), the fp32 copy of each
 * (clone().float()),
 * initialize_optimizer_states (a zero fp32 gradient of the largest sub
 * group, one optimizer step that makes Adam's moments), the ipg buffer
 * and grad_partitions_flat_buffer. On the host when offloaded. */
/* Init._partition_param: the padded partition made (on the host with
 * offload_param, persistent ones on the GPU), the whole freed unless
 * persistent (then kept: *t is the partition either way). */
static void z3_partition(sim *S, ds *z, uint32_t p, uint32_t *t)
{
    if (!z->pnumel[p])
        return;
    uint32_t part = NONE;
    if (!z->offload_par || z->persist[p])
        part = vp__dist_alloc(S, vp__mulc(S, z->pnumel[p], z->eb),
                              VP_CAT_PARAM, VP_STREAM_DEFAULT,
                              "zero3 partition");
    if (!z->persist[p])
        vp__dist_free_id(S, t);
    *t = part;
}

/* Under deepspeed.zero.Init each parameter is partitioned as its module
 * is made (Init._post_init_method): the whole model never is. */
static void z3_param_built(sim *S, uint32_t p, uint32_t *t)
{
    ds *z = S->dist->impl;
    if (S->dist->cfg->ds.zero_init)
        z3_partition(S, z, p, t);
}

static void z3_wrap(sim *S, uint32_t *model)
{
    vp__dist *d = S->dist;
    ds *z = d->impl;
    const vp_graph *g = S->g;
    uint64_t total = 0, largest = 0;
    if (!d->cfg->ds.zero_init) {
        vp__model_convert(S, model);
        for (uint32_t p = 0; p < g->n_params && OK(S); p++)
            z3_partition(S, z, p, &model[p]);
    }
    for (uint32_t k = 0; k < z->n_sub; k++) {
        total += z->sub[k];
        largest = z->sub[k] > largest ? z->sub[k] : largest;
    }
    /* zero/utils.py defragment: every partition copied to the host and
     * freed, gc.collect() + empty_cache(), one device buffer of them all
     * (lp_param_buffer, the sub groups' flats are views of it); with
     * offload_param a pinned host buffer instead */
    for (uint32_t p = 0; p < g->n_params; p++)
        if (z->pnumel[p] && g->params[p].trainable && !z->offload_par)
            vp__dist_free_id(S, &model[p]);
    if (!z->offload_par) {
        vp_allocator_empty_cache(S->a);
        vp__dist_alloc(S, vp__mulc(S, total, z->eb), VP_CAT_PARAM,
                       VP_STREAM_DEFAULT, "zero3 fp16 flat");
    }
    if (z->offload_opt) {
        vp__ds_host_bytes(S, z, total);
    } else {
        for (uint32_t k = 0; k < z->n_sub; k++) {
            uint32_t c = vp__dist_alloc(
                S, vp__mulc(S, z->sub[k], z->eb),
                z->eb == 4 ? VP_CAT_OPTIM : VP_CAT_TEMP, VP_STREAM_DEFAULT,
                "zero3 fp32 partition");
            if (z->eb != 4) {
                vp__dist_alloc(S, vp__mulc(S, z->sub[k], 4), VP_CAT_OPTIM,
                               VP_STREAM_DEFAULT, NULL);
                vp__dist_free_id(S, &c);
            }
        }
        uint32_t gb = vp__dist_alloc(S, vp__mulc(S, largest, 4), VP_CAT_TEMP,
                                     VP_STREAM_DEFAULT, "zero3 init grad");
        vp__optimizer_step(S);
        vp__dist_free_id(S, &gb);
    }
    if (d->cfg->ds.contiguous_gradients)
        z->ipg[0] = vp__dist_alloc(
            S, vp__mulc(S, d->cfg->ds.reduce_bucket_size, z->eb),
            VP_CAT_GRAD, VP_STREAM_DEFAULT, "zero3 ipg buffer");
    if (!z->offload_opt)
        z->grad_flat = vp__dist_alloc(S, vp__mulc(S, total, z->eb),
                                      VP_CAT_GRAD, VP_STREAM_DEFAULT,
                                      "zero3 grad partitions");
}

/* ZeRoTraceMode (partitioned_param_coordinator.py). */
enum { Z3_RECORD = 0, Z3_COMPLETE, Z3_INVALID };

/* reset_step, at the root module's forward pre-hook
 * (parameter_offload.py _start_of_forward_hook): a trace being recorded
 * is complete (the first one empty: nothing ran yet), an invalid one is
 * recorded again in this forward + backward. */
static void z3_fwd_begin(sim *S)
{
    ds *z = S->dist->impl;
    z->pos = z->qpos = z->qparam = 0;
    if (z->trace_mode == Z3_RECORD)
        z->trace_mode = Z3_COMPLETE;
    else if (z->trace_mode == Z3_INVALID)
        z->trace_mode = Z3_RECORD;
    z->rc_seg = -1;
    z->defer = NONE;
    for (uint32_t p = 0; p < S->g->n_params; p++)
        z->recent[p] = INT64_MIN / 2;
}

/* The prefetch queue's next (step, param) of the trace. */
static bool queue_next(const sim *S, ds *z, uint32_t *k, uint32_t *p)
{
    while (z->qpos < z->n_trace) {
        const vp_op *o = &S->g->ops[z->trace[z->qpos]];
        while (z->qparam < o->n_params) {
            uint32_t q = o->params[z->qparam++];
            if (z->pnumel[q]) {
                *k = z->qpos;
                *p = q;
                return true;
            }
        }
        z->qpos++;
        z->qparam = 0;
    }
    return false;
}

/* trace_prologue: a complete trace that does not hold this module at
 * this step is invalidated (_invalidate_trace); record_module while
 * recording (the trace: the modules as fetched, recomputed forwards
 * included). */
static void trace_module(ds *z, uint32_t op)
{
    if (z->trace_mode == Z3_COMPLETE &&
        (z->pos >= z->n_trace || z->trace[z->pos] != op)) {
        z->trace_mode = Z3_INVALID;
        z->n_trace = 0;
    }
    if (z->trace_mode == Z3_RECORD && z->n_trace < z->cap_trace)
        z->trace[z->n_trace++] = op;
}

/* fetch_sub_module: the module's parameters gathered; with a complete
 * trace its params popped off the queue and the next ones prefetched, up
 * to stage3_prefetch_bucket_size elements and stage3_max_live_parameters
 * available. */
static void fetch(sim *S, ds *z, uint32_t op)
{
    const vp_op *o = &S->g->ops[op];
    const vp_ds_config *c = &S->dist->cfg->ds;
    uint32_t need = 0, k, p;
    trace_module(z, op);
    for (uint32_t j = 0; j < o->n_params; j++) {
        uint32_t q = o->params[j];
        if (!z->pnumel[q])
            continue;
        need += z->recent[q] < (int64_t)z->pos;
        gather(S, z, q);
    }
    if (z->trace_mode == Z3_COMPLETE) {
        for (uint32_t popped = 0; popped < need && queue_next(S, z, &k, &p);
             popped++)
            z->recent[p] = k;
        uint64_t room = c->max_live_parameters > z->n_avail
                            ? c->max_live_parameters - z->n_avail
                            : 0;
        uint64_t cap = room < c->prefetch_bucket_size
                           ? room
                           : c->prefetch_bucket_size;
        uint64_t numel = 0;
        while (numel < cap && OK(S) && queue_next(S, z, &k, &p)) {
            if (k > z->recent[p])
                z->recent[p] = k;
            if (z->gath[p] == NONE && !z->persist[p]) {
                gather(S, z, p);
                numel += S->g->params[p].numel;
            }
        }
    }
    z->pos++;
}

/* release_sub_module: with a complete trace the params not to be used
 * again within stage3_max_reuse_distance elements of the trace, nor
 * prefetched past this step (__params_to_release); every one while the
 * trace is recorded or invalid (the first two forwards + backwards). */
static void z3_release_mod(sim *S, ds *z, uint32_t op)
{
    const vp_op *o = &S->g->ops[op];
    uint64_t maxd = S->dist->cfg->ds.max_reuse_distance;
    for (uint32_t j = 0; j < o->n_params; j++) {
        uint32_t p = o->params[j];
        if (z->gath[p] == NONE)
            continue;
        bool keep = false;
        if (z->trace_mode == Z3_COMPLETE) {
            keep = z->recent[p] > (int64_t)z->pos;
            uint64_t seen = 0;
            for (uint32_t k = z->pos; !keep && k < z->n_trace; k++) {
                if (seen >= maxd)
                    break;
                const vp_op *m = &S->g->ops[z->trace[k]];
                for (uint32_t i = 0; i < m->n_params; i++) {
                    keep |= m->params[i] == p;
                    seen += S->g->params[m->params[i]].numel;
                }
            }
        }
        if (!keep)
            release(S, z, p);
    }
}

static bool has_params(const ds *z, const vp_op *o)
{
    for (uint32_t j = 0; j < o->n_params; j++)
        if (z->pnumel[o->params[j]])
            return true;
    return false;
}

static void z3_op_fwd(sim *S, uint32_t op, bool after)
{
    ds *z = S->dist->impl;
    if (!has_params(z, &S->g->ops[op]))
        return;
    S->cur_op = "zero3 fetch";
    if (!after)
        fetch(S, z, op);
    else
        z3_release_mod(S, z, op);
}

/* The backward: each module fetched before its backward, released
 * after. A checkpointed segment's first op to run backward waits for the
 * segment's recomputation: the checkpoint's forward ran without grad, so
 * its modules' pre-backward hooks (parameter_offload.py
 * _pre_backward_module_hook, put on the outputs by
 * _post_forward_module_hook) exist only once the recomputed forward has
 * run (its own fetches and releases: z3_op_recompute). */
static void z3_op_bwd(sim *S, uint32_t op, bool after)
{
    ds *z = S->dist->impl;
    const vp_graph *g = S->g;
    int32_t seg = g->ops[op].segment;
    if (!has_params(z, &g->ops[op]))
        return;
    S->cur_op = "zero3 fetch";
    if (after && z->defer == op) {
        z->defer = NONE; /* no gradient: the op and its segment skipped */
        return;
    }
    if (!after && seg >= 0 && S->ckpt[seg] && z->rc_seg != seg)
        z->defer = op;
    else if (!after)
        fetch(S, z, op);
    else
        z3_release_mod(S, z, op);
}

/* The recomputed forward: the module hooks fire as in the forward
 * (DeepSpeed's CheckpointFunction.backward, torch's checkpoint alike,
 * run the segment's modules again), each module fetched and released
 * under the trace's reuse distance. */
static void z3_op_recompute(sim *S, uint32_t op, bool after)
{
    ds *z = S->dist->impl;
    z->rc_seg = S->g->ops[op].segment;
    z3_op_fwd(S, op, after);
}

static void z3_recompute_end(sim *S)
{
    ds *z = S->dist->impl;
    if (z->defer == NONE)
        return;
    S->cur_op = "zero3 fetch";
    fetch(S, z, z->defer);
    z->defer = NONE;
}

/* __reduce_and_partition_ipg_grads: reduce_scatter_coalesced concatenates
 * the padded partitions of every rank (world x Σ partition elements,
 * unless a single tensor divides evenly), partition_grads copies this
 * rank's into grad_partitions_flat_buffer and drops .grad. */
static void z3_reduce(sim *S, ds *z)
{
    if (!z->n_bucket)
        return;
    const char *was = S->cur_op;
    S->cur_op = "zero3 reduce-scatter";
    uint64_t parts = 0;
    for (uint32_t k = 0; k < z->n_bucket; k++)
        parts += z->pnumel[z->bucket[k]];
    uint32_t one = z->bucket[0];
    /* on reduce_and_partition_stream: its own with overlap_comm */
    if (z->n_bucket > 1 || S->g->params[one].numel % S->dist->group) {
        uint32_t cat = vp__dist_alloc(
            S, vp__mulc(S, vp__mulc(S, parts, S->dist->group), z->eb),
            VP_CAT_TEMP, z->overlap ? VP_STREAM_REDUCE : VP_STREAM_DEFAULT,
            NULL);
        vp__dist_free_id(S, &cat);
    }
    for (uint32_t k = 0; k < z->n_bucket; k++)
        vp__dist_free_id(S, &S->pgrad[z->bucket[k]]);
    z->n_bucket = 0;
    z->bucket_n = 0;
    S->cur_op = was;
}

/* reduce_independent_p_g_buckets_and_remove_grads / __add_grad_to_ipg_
 * bucket: a full bucket reduced first; a gradient that fits copied into
 * the ipg buffer (.grad a view of it). */
static void z3_grad_ready(sim *S, uint32_t p)
{
    ds *z = S->dist->impl;
    const vp_ds_config *c = &S->dist->cfg->ds;
    if (!vp__ds_trainable(S->g, p) || S->pgrad[p] == NONE)
        return;
    uint64_t n = S->g->params[p].numel;
    if (z->bucket_n + n > c->reduce_bucket_size)
        z3_reduce(S, z);
    if (c->contiguous_gradients && z->bucket_n + n <= c->reduce_bucket_size)
        vp__dist_free_id(S, &S->pgrad[p]);
    z->bucket_n += n;
    z->bucket[z->n_bucket++] = p;
}

static void z3_bwd_end(sim *S)
{
    z3_reduce(S, S->dist->impl);
}

/* step: _partition_all_parameters (every gathered parameter released),
 * the overflow check (fp16), the norms (a double copy of each gradient
 * partition), then per sub group the flat gradient cast to fp32,
 * the step, the fp32 gradient dropped. */
static void z3_opt_begin(sim *S)
{
    ds *z = S->dist->impl;
    const vp_graph *g = S->g;
    S->cur_op = "zero3 step";
    for (uint32_t p = 0; p < g->n_params; p++)
        release(S, z, p);
    if (z->offload_opt)
        return;
    uint64_t *n = malloc((g->n_params + 1) * sizeof *n);
    if (!n) {
        S->st = vp__ds_oom(S);
        return;
    }
    uint32_t k = 0;
    for (uint32_t p = 0; p < g->n_params; p++)
        if (z->pnumel[p] && vp__ds_trainable(g, p))
            n[k++] = z->pnumel[p];
    vp__ds_step_checks(S, n, k);
    free(n);
    /* sub groups one at a time: the sim's optimizer step follows for
     * the tensors; each fp32 gradient lives through its own step */
    for (uint32_t s = 0; s + 1 < z->n_sub && OK(S); s++) {
        uint32_t f = vp__talloc(S, vp__mulc(S, z->sub[s], z->eb), VP_CAT_TEMP);
        uint32_t f32 = vp__talloc(S, vp__mulc(S, z->sub[s], 4), VP_CAT_GRAD);
        vp__tunref(S, f);
        vp__tunref(S, f32);
    }
    if (z->n_sub) {
        uint64_t last = z->sub[z->n_sub - 1];
        uint32_t f = vp__talloc(S, vp__mulc(S, last, z->eb), VP_CAT_TEMP);
        z->fp32_grad = vp__talloc(S, vp__mulc(S, last, 4), VP_CAT_GRAD);
        vp__tunref(S, f);
    }
}

const vp__dist_rules vp__dist_zero3_rules = {
    .init = vp__ds_init,
    .wrap = z3_wrap,
    .fwd_begin = z3_fwd_begin,
    .op_fwd = z3_op_fwd,
    .op_bwd = z3_op_bwd,
    .op_recompute = z3_op_recompute,
    .recompute_end = z3_recompute_end,
    .bwd_end = z3_bwd_end,
    .grad_ready = z3_grad_ready,
    .opt_begin = z3_opt_begin,
    .zero_grad = vp__ds_zero_grad,
    .param_built = z3_param_built,
    .destroy = vp__ds_destroy,
};
