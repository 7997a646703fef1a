/* The simulator's engine: tensors with reference counts, fed to the
 * caching-allocator model as PyTorch allocates and frees them; the events
 * and peaks they make; what ops save for backward (and what activation
 * offload, compression and selective recomputation keep instead);
 * autocast's weight cache; and the hand-off of gradients. The rules that
 * use them are in src/ops/ (sim_internal.h). */
#include <stdlib.h>
#include <string.h>

#include "allocator_internal.h"
#include "dist_internal.h"

uint64_t vp__mulc_overflow(sim *S)
{
    if (S->st == VP_OK)
        S->st = vp_error_set(S->err, VP_EOVERFLOW,
                             "a tensor of %s is larger than 2^64 bytes",
                             S->cur_op ? S->cur_op : "the model");
    return 0;
}

/* A new peak of allocated bytes: what the estimate says of it. */
static void new_peak(sim *S, uint64_t al)
{
    S->peak = al;
    S->out->peak_alloc = al;
    S->out->peak_phase = S->phase;
    S->out->peak_step = S->step;
    S->peak_op = S->cur_op; /* named in the estimate at the end */
    memcpy(S->out->by_category, S->cat_live, sizeof S->out->by_category);
    S->out->by_category[VP_CAT_ACT] += S->cat_live[VP__CAT_KV];
    S->out->gen.kv_at_peak = S->cat_live[VP__CAT_KV];
    S->out->gen.peak_token = S->gen_token;
    /* remember the event for the layer breakdown pass */
    S->out->events = S->events;
}

/* An event's callback and the stop at a given event, when either is set
 * (timelines, snapshots, the layer breakdown pass). */
static void emit_tail(sim *S, bool is_free, uint64_t bytes, vp_category cat,
                      uint64_t handle, uint64_t al)
{
    if (S->cb && S->hooks == NULL && S->events > VP_MAX_EVENTS_SEEN) {
        S->st = vp_error_set(S->err, VP_ELIMIT,
                             "the simulated steps make more than %u "
                             "allocator events to record (--timeline, "
                             "--snapshot, --html); simulate fewer --steps "
                             "or --accum",
                             VP_MAX_EVENTS_SEEN);
        return;
    }
    if (S->cb) {
        if (cat == VP__CAT_KV)
            cat = VP_CAT_ACT; /* the public categories */
        vp_sim_event ev = {S->events, is_free, bytes, cat, S->phase,
                           S->step, S->cur_op ? S->cur_op : "",
                           al, S->ast->reserved, handle,
                           vp_allocator_block_addr(S->a, handle)};
        S->cb(&ev, S->ud);
    }
    if (S->stop_at && S->events == S->stop_at)
        S->stopped = true;
}

/* An allocation event, `al` bytes allocated right after it; the peaks. */
static inline void emit_alloc(sim *S, uint64_t bytes, vp_category cat,
                              uint64_t handle, uint64_t al)
{
    S->events++;
    if (al > S->phase_peak)
        S->phase_peak = al;
    if (al > S->peak)
        new_peak(S, al);
    if (S->tail)
        emit_tail(S, false, bytes, cat, handle, al);
}

static inline void emit_free(sim *S, uint64_t bytes, vp_category cat,
                             uint64_t handle)
{
    S->events++;
    if (S->tail)
        emit_tail(S, true, bytes, cat, handle,
                  S->ast->allocated);
}

/* The allocator's error for `bytes` (an out-of-memory one names the op). */
static void alloc_failed(sim *S, vp_status st, uint64_t bytes)
{
    S->st = st;
    if (st == VP_EOOM) {
        char b1[32];
        vp_error_set(S->err, VP_EOOM,
                     "out of memory allocating %s in %s (step %u, %s)",
                     vp_size_format(bytes, b1, sizeof b1),
                     S->cur_op && *S->cur_op ? S->cur_op : "setup", S->step,
                     vp_phase_name(S->phase));
    }
}

/* A tensor id: the one freed last, or a new one (NONE when out of host
 * memory). */
static inline uint32_t new_id(sim *S)
{
    if (S->n_free)
        return S->free_ids[--S->n_free];
    if (S->nt == S->capt &&
        !vp__grow((void **)&S->t, &S->capt, S->nt + 1, sizeof(vp__tensor))) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return NONE;
    }
    return (uint32_t)S->nt++;
}

/* Give id back (false when out of host memory). */
static inline bool free_id(sim *S, uint32_t id)
{
    if (S->n_free == S->cap_free &&
        !vp__grow((void **)&S->free_ids, &S->cap_free, S->n_free + 1,
                  sizeof(uint32_t))) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return false;
    }
    S->free_ids[S->n_free++] = id;
    return true;
}

uint32_t vp__talloc(sim *S, uint64_t bytes, vp_category cat)
{
    if (!OK(S))
        return NONE;
    uint64_t h, bs; /* set when the call succeeds */
    vp_status st = vp__allocator_alloc(S->a, bytes, S->stream, &h, &bs,
                                       S->err);
    if (st != VP_OK) {
        alloc_failed(S, st, bytes);
        return NONE;
    }
    uint32_t id = new_id(S);
    if (id == NONE)
        return NONE;
    S->t[id] = (vp__tensor){h, bs, 1, (uint8_t)cat, S->cur_op_idx};
    S->cat_live[cat] += bs;
    emit_alloc(S, bytes, cat, h, S->ast->allocated);
    return id;
}

void vp__tfree(sim *S, uint32_t id)
{
    const vp__tensor *t = &S->t[id];
    S->cat_live[t->cat] -= t->bytes;
    vp_status st = vp__allocator_release(S->a, t->handle, S->err);
    if (st != VP_OK) { /* only when host memory ran out */
        S->st = st;
        return;
    }
    if (free_id(S, id) && !S->stopped) {
        /* emit_free with the record read again where the tail wants it
         * (the release writes nothing of the simulator's): only S and id
         * live across the call */
        S->events++;
        if (S->tail) {
            t = &S->t[id];
            emit_tail(S, true, t->bytes, (vp_category)t->cat, t->handle,
                      S->ast->allocated);
        }
    }
}

/* vp__talloc and at once vp__tunref: the allocator's two calls in one
 * (vp__allocator_transient), the tensor id taken and given back, the two
 * events. With an event callback (timelines, snapshots), which reads the
 * allocator between them, the two calls. */
void vp__transient(sim *S, uint64_t bytes)
{
    if (!bytes)
        return;
    if (S->cb) {
        vp__tunref(S, vp__talloc(S, bytes, VP_CAT_TEMP));
        return;
    }
    if (!OK(S))
        return;
    uint64_t h, bs, at;
    vp_status st = vp__allocator_transient(S->a, bytes, S->stream, &h, &bs,
                                           &at, S->err);
    if (st != VP_OK) {
        alloc_failed(S, st, bytes);
        return;
    }
    uint32_t id = new_id(S);
    if (id == NONE)
        return;
    S->t[id] = (vp__tensor){h, bs, 0, (uint8_t)VP_CAT_TEMP, S->cur_op_idx};
    S->cat_live[VP_CAT_TEMP] += bs;
    emit_alloc(S, bytes, VP_CAT_TEMP, h, at);
    if (S->st != VP_OK)
        return;
    S->cat_live[VP_CAT_TEMP] -= bs;
    if (free_id(S, id) && !S->stopped)
        emit_free(S, bs, VP_CAT_TEMP, h);
}

void vp__hold(sim *S, uint32_t id)
{
    if (id == NONE)
        return;
    if (!vp__grow((void **)&S->held, &S->cap_held, S->n_held + 1,
                  sizeof(uint32_t))) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    vp__tref(S, id);
    S->held[S->n_held++] = id;
}

void vp__hold_graph(sim *S, uint32_t id)
{
    if (id == NONE)
        return;
    if (!vp__grow((void **)&S->leaf, &S->cap_leaf, S->n_leaf + 1,
                  sizeof(uint32_t))) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    vp__tref(S, id);
    S->leaf[S->n_leaf++] = id;
}

void vp__release_graph(sim *S)
{
    for (size_t i = 0; i < S->n_leaf; i++)
        vp__tunref(S, S->leaf[i]);
    S->n_leaf = 0;
}

void vp__release_held(sim *S)
{
    for (size_t i = 0; i < S->n_held; i++)
        vp__tunref(S, S->held[i]);
    S->n_held = 0;
}

/* ---- saved tensors --------------------------------------------------------- */

/* Saved tensors of 1 MiB and more are what activation offload and
 * compression move (masks, statistics and scalars stay). Returns the id
 * to keep in the op's saved slot: the tensor itself, its compressed copy,
 * or NONE when it went to the host (or, in the slots that selective
 * recomputation re-makes, nowhere). */
#define MOVABLE_MIN_BYTES VP_MiB /* smaller saved tensors stay           */
#define ACTNN_GROUP 256u         /* values per quantization group         */
#define ACTNN_GROUP_BYTES 8u     /* its fp32 scale and zero point         */
static uint32_t stash(sim *S, uint32_t op, uint32_t slot, uint32_t id)
{
    const vp_setup *s = S->s;
    if (S->recompute_slot >= 0 && slot >= (uint32_t)S->recompute_slot &&
        S->saving_offloadable) {
        /* selective recomputation: not kept; re-made for the backward */
        S->reload[op] += S->t[id].bytes;
        return NONE;
    }
    if (!S->saving_offloadable || (!s->offload_activations && !s->act_bits))
        return id;
    uint64_t b = S->t[id].bytes;
    if (b < MOVABLE_MIN_BYTES || S->t[id].cat != VP_CAT_ACT)
        return id;
    S->reload[op] += b;
    if (s->offload_activations) {
        S->host_now += b;
        S->out->host_traffic += 2 * b; /* down, and back for backward */
        if (S->host_now > S->out->host_bytes)
            S->out->host_bytes = S->host_now;
        return NONE;
    }
    /* ActNN: bits per element of an element of S->A bytes, plus a
     * per-group fp32 scale and zero point */
    uint64_t elems = b / S->A;
    uint64_t cb = (elems * s->act_bits + 7) / 8 +
                  (elems / ACTNN_GROUP + 1) * ACTNN_GROUP_BYTES;
    uint32_t c = vp__talloc(S, cb, VP_CAT_ACT);
    return c;
}

void vp__written_by(sim *S, bool launch)
{
    if (S->hooks != NULL && S->hooks->written_by != NULL)
        S->hooks->written_by(S->ud, launch);
}

void vp__save(sim *S, uint32_t op, uint32_t slot, uint32_t id)
{
    VP_ASSERT(slot < MAX_SAVED && slot >= S->n_saved[op]);
    uint32_t *sv = &S->saved[op * MAX_SAVED];
    while (S->n_saved[op] < slot)
        sv[S->n_saved[op]++] = NONE;
    uint32_t k = id == NONE ? NONE : stash(S, op, slot, id);
    /* a compressed copy comes with its own reference */
    if (k == id)
        vp__tref(S, id);
    sv[S->n_saved[op]++] = k;
    if (S->hooks != NULL && S->hooks->saved != NULL)
        S->hooks->saved(S->ud, S->step, op, S->phase);
}

void vp__save_vars(sim *S, uint32_t op, uint32_t n)
{
    if (S->hooks == NULL || S->hooks->saved == NULL)
        return;
    for (uint32_t k = 0; k < n; k++)
        S->hooks->saved(S->ud, S->step, op, S->phase);
}

void vp__drop_saved(sim *S, uint32_t op, uint32_t slot)
{
    if (slot < S->n_saved[op]) {
        vp__tunref(S, S->saved[op * MAX_SAVED + slot]);
        S->saved[op * MAX_SAVED + slot] = NONE;
    }
}

void vp__release_saved(sim *S, uint32_t op)
{
    for (uint8_t i = 0; i < S->n_saved[op]; i++)
        vp__tunref(S, S->saved[op * MAX_SAVED + i]);
    S->n_saved[op] = 0;
}

/* ---- autocast -------------------------------------------------------- */

/* The low-precision copy of a parameter (autocast's weight cache); NONE
 * when no cast happens (not amp). The cache keeps one reference. The
 * cache holds only casts of leaves that require grad
 * (aten/src/ATen/autocast_mode.cpp, cached_cast): a frozen weight is cast
 * afresh by every op, and the cast dies when the op returns unless the op
 * saved it. */
uint32_t vp__weight_cast(sim *S, uint32_t p)
{
    if (!vp__param_is_cast(S, p))
        return NONE;
    if (!S->g->params[p].trainable) {
        uint32_t c = vp__talloc(S, vp__mulc(S, S->g->params[p].numel, 2),
                                VP_CAT_CAST);
        if (c != NONE && !vp__grow((void **)&S->opc, &S->cap_opc,
                                   S->n_opc + 1, sizeof *S->opc)) {
            S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
            vp__tunref(S, c);
            return NONE;
        }
        if (c != NONE)
            S->opc[S->n_opc++] = c;
        return c;
    }
    if (S->cast[p] == NONE) {
        const vp_param *pp = &S->g->params[p];
        S->cast[p] = vp__talloc(S, vp__mulc(S, pp->numel, 2), VP_CAT_CAST);
        S->n_cast += S->cast[p] != NONE;
    }
    return S->cast[p];
}

void vp__release_op_casts(sim *S)
{
    for (size_t k = 0; k < S->n_opc; k++)
        vp__tunref(S, S->opc[k]);
    S->n_opc = 0;
}

void vp__clear_cast_cache(sim *S)
{
    size_t np = S->g->n_params;
    /* in parameter order, up to the last cached cast (a scan of every
     * parameter at each checkpointed segment was quadratic) */
    for (size_t p = 0; p < np && S->n_cast > 0 && OK(S); p++) {
        if (S->cast[p] != NONE) {
            uint32_t id = S->cast[p];
            S->cast[p] = NONE;
            S->n_cast--;
            vp__tunref(S, id);
        }
    }
}

/* Input x of op, cast to `eb` bytes if needed: returns an owned
 * reference. */
uint32_t vp__cast_input(sim *S, uint32_t in_op, uint8_t eb)
{
    uint32_t x = S->out_t[in_op];
    if (S->out_eb[in_op] == eb || S->g->ops[in_op].value != VP_VAL_FLOAT) {
        vp__tref(S, x);
        return x;
    }
    return vp__talloc(S, vp__mulc(S, S->g->ops[in_op].numel, eb), VP_CAT_ACT);
}

/* ---- gradients --------------------------------------------------------- */

/* Hand a parameter gradient (an owned tensor in param dtype) to
 * AccumulateGrad: steal it when .grad is unset, else add in place. A
 * weight used twice in one backward (a tied head) gets both contributions
 * in the engine's InputBuffer first, which sums in place only into a
 * tensor it holds the last reference to (input_buffer.cpp, accumulate and
 * can_accumulate_inplace): a view (gview) keeps its base alive, so the sum
 * is a new tensor, then the view and the new contribution are freed. */
void vp__param_grad(sim *S, uint32_t p, uint32_t gid)
{
    if (gid == NONE)
        return;
    if (S->pgrad[p] == NONE) {
        S->cat_live[S->t[gid].cat] -= S->t[gid].bytes;
        S->t[gid].cat = VP_CAT_GRAD;
        S->cat_live[VP_CAT_GRAD] += S->t[gid].bytes;
        S->pgrad[p] = gid;
    } else if (S->gview[p]) {
        uint32_t held = S->pgrad[p];
        S->pgrad[p] = vp__talloc(S, S->t[held].bytes, VP_CAT_GRAD);
        S->gview[p] = 0;
        vp__tunref(S, held);
        vp__tunref(S, gid);
    } else {
        vp__tunref(S, gid);
    }
    if (S->dist)
        vp__dist_grad(S, p);
}

/* A parameter's gradient as the backward op produces it: in the op's
 * compute dtype, then (amp) ToCopyBackward to fp32. */
void vp__weight_grad(sim *S, uint32_t p, bool via_cast)
{
    const vp_param *pp = &S->g->params[p];
    if (!pp->trainable)
        return;
    uint64_t n = pp->numel;
    if (via_cast && vp__param_is_cast(S, p)) {
        uint32_t lo = vp__talloc(S, vp__mulc(S, n, 2), VP_CAT_TEMP);
        uint32_t hi = vp__talloc(S, vp__mulc(S, n, 4), VP_CAT_TEMP);
        vp__tunref(S, lo);
        vp__param_grad(S, p, hi);
    } else {
        vp__param_grad(S, p, vp__talloc(S, vp__mulc(S, n, vp__param_bytes(S, pp)),
                                VP_CAT_TEMP));
    }
}

/* A parameter gradient made in the compute dtype (owned): under autocast
 * ToCopyBackward makes the fp32 copy (then the low one is freed), which
 * AccumulateGrad steals. */
void vp__param_grad_cast(sim *S, uint32_t p, uint32_t lo)
{
    if (lo == NONE)
        return;
    if (vp__param_is_cast(S, p)) {
        uint32_t hi = vp__talloc(S, vp__mulc(S, S->g->params[p].numel, 4),
                             VP_CAT_TEMP);
        vp__tunref(S, lo);
        lo = hi;
    }
    vp__param_grad(S, p, lo);
}

/* The weight enters F.linear as weight.t(): MmBackward's grad comes back
 * through TBackward as a view of the mm output (FunctionsManual.cpp,
 * mm_mat2_backward; t's derivative, derivatives.yaml). Under autocast
 * ToCopyBackward copies it instead. */
void vp__param_grad_tview(sim *S, uint32_t p, uint32_t lo)
{
    bool view = lo != NONE && S->pgrad[p] == NONE && !vp__param_is_cast(S, p);
    vp__param_grad_cast(S, p, lo);
    if (view && S->pgrad[p] == lo)
        S->gview[p] = 1;
}

/* Give grad tensor gid (owned) to producer op `in`: convert its dtype if
 * the producer's output has another width (the copy keeps the strides),
 * then accumulate. `strided`: the grad is not in the dims' memory order;
 * a sum into an existing buffer keeps that buffer's layout. */
void vp__give_grad_l(sim *S, uint32_t in, uint32_t gid, uint8_t g_eb,
                        bool strided)
{
    if (gid == NONE || !OK(S))
        return;
    const vp_op *po = &S->g->ops[in];
    if (!po->needs_grad) {
        vp__tunref(S, gid);
        return;
    }
    if (S->out_eb[in] != g_eb) {
        uint32_t c = vp__talloc(S, vp__mulc(S, po->numel, S->out_eb[in]),
                            VP_CAT_TEMP);
        vp__tunref(S, gid);
        gid = c;
    }
    if (S->grad_t[in] == NONE) {
        S->grad_t[in] = gid;
        S->glay[in] = strided;
    } else {
        vp__tunref(S, gid); /* summed in place into the existing buffer */
    }
}

void vp__give_grad(sim *S, uint32_t in, uint32_t gid, uint8_t g_eb)
{
    vp__give_grad_l(S, in, gid, g_eb, false);
}

uint32_t vp__grad_like(sim *S, uint32_t in, uint8_t eb)
{
    return vp__talloc(S, vp__mulc(S, S->g->ops[in].numel, eb), VP_CAT_TEMP);
}
