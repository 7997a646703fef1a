/* DistributedDataParallel and ZeroRedundancyOptimizer, rank by rank
 * (PyTorch 2.11; docs/DISTRIBUTED.md "DDP" and "ZeRO-1" cite each rule):
 *
 *  - construction (torch/nn/parallel/distributed.py,
 *    DistributedDataParallel.__init__): _sync_module_states broadcasts the
 *    parameters and buffers through broadcast_coalesced, flat buffers of
 *    at least 250 MiB, two alive at once; the Reducer
 *    (torch/csrc/distributed/c10d/reducer.cpp, initialize_buckets) then
 *    allocates one bucket per dtype for the first iteration (bucket size
 *    limit sys.maxsize unless find_unused_parameters);
 *  - each forward (_pre_forward): the buffers are broadcast
 *    (broadcast_buffers), and in the second iteration
 *    Reducer::rebuild_buckets syncs the bucket indices (two int32
 *    tensors) and allocates the buckets again in the order the gradients
 *    became ready, capped at 1 MiB for the first and bucket_cap_mb for
 *    the others. The old buckets are dropped, but ProcessGroupNCCL keeps
 *    the last all-reduce's tensors in its stash (collective():
 *    stashed_for_allocator_safety_) until the first collective enqueued
 *    (workEnqueue unstashes shelvesToUnstash_) after the watchdog's poll
 *    (Watchdog::runLoop, every kWatchdogThreadSleepMillis = 100 ms) found
 *    the work complete: a wall-clock race. The rank where the poll comes
 *    after the rebuild's last collective (rebuild_held, the worst)
 *    holds them into the second step's backward;
 *  - backward: each gradient is copied into its bucket
 *    (mark_variable_ready_dense); with gradient_as_bucket_view the
 *    gradient AccumulateGrad made is freed and .grad becomes a view of the
 *    bucket;
 *  - ZeroRedundancyOptimizer (torch/distributed/optim/
 *    zero_redundancy_optimizer.py, _partition_parameters): the parameters
 *    sorted by size, largest first, each to the rank with the fewest
 *    elements so far; the rank keeps the optimizer state of its own; with
 *    overlap_with_ddp (ddp_zero_hook.py, hook_with_zero_step) each bucket
 *    goes to the rank with the fewest elements and is stepped as soon as it
 *    is reduced, from the iteration after the rebuild. */
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

#define BROADCAST_BUCKET ((uint64_t)250 * 1048576) /* _DEFAULT_BUCKET_CAP */

typedef struct ddp {
    bool bv, zero;
    uint8_t eb;            /* bucket element bytes (the parameters')      */
    uint32_t *order;       /* bucketed parameters in the order their
                              gradients became ready in the first backward */
    uint32_t n_order, n_tr;
    uint32_t *bucket;      /* the buckets' tensors                        */
    uint32_t *bucket_of;   /* per parameter: its bucket                   */
    uint32_t *first;       /* per bucket: index of its first parameter in
                              the bucket's list (members)                */
    uint32_t *members;     /* parameters, bucket by bucket                */
    uint32_t *left;        /* per bucket: gradients not yet ready        */
    uint32_t n_buckets;
    uint32_t *held;        /* the first iteration's buckets, still held   */
    uint32_t n_held;
    bool rebuilt;
    bool *owned;           /* ZeRO: parameters of this rank's partition   */
    bool *on;              /* what the optimizer steps (S->opt_on)        */
    bool *mask;            /* overlap_with_ddp: one bucket's parameters   */
    uint32_t *owner;       /* overlap_with_ddp: per bucket, its rank      */
} ddp;

static ddp *impl(sim *S)
{
    return S->dist->impl;
}

static bool bucketed(const sim *S, uint32_t p)
{
    return S->g->params[p].trainable;
}

/* ---- ZeroRedundancyOptimizer's partition -------------------------------- */

typedef struct by_size {
    uint64_t numel;
    uint32_t p;
} by_size;

static int cmp_size(const void *a, const void *b)
{
    const by_size *x = a, *y = b;
    if (x->numel != y->numel)
        return x->numel > y->numel ? -1 : 1; /* largest first            */
    return x->p < y->p ? -1 : x->p > y->p;   /* sorted() is stable       */
}

/* The index of the smallest size, the first of equals (_get_min_index). */
static uint32_t min_index(const uint64_t *sizes, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t r = 1; r < n; r++)
        if (sizes[r] < sizes[best])
            best = r;
    return best;
}

vp_status vp__zero_partition(const vp_graph *g, uint32_t world,
                             uint32_t *rank_of)
{
    by_size *v = calloc(g->n_params ? g->n_params : 1, sizeof *v);
    uint64_t *sizes = calloc(world, sizeof *sizes);
    uint32_t n = 0;
    if (!v || !sizes) {
        free(v);
        free(sizes);
        return VP_ENOMEM;
    }
    for (uint32_t p = 0; p < g->n_params; p++) {
        rank_of[p] = UINT32_MAX;
        if (g->params[p].trainable)
            v[n++] = (by_size){g->params[p].numel, p};
    }
    qsort(v, n, sizeof *v, cmp_size);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t r = min_index(sizes, world);
        sizes[r] += v[k].numel;
        rank_of[v[k].p] = r;
    }
    free(v);
    free(sizes);
    return VP_OK;
}

static vp_status partition(sim *S, ddp *z)
{
    const vp_graph *g = S->g;
    uint32_t *rank_of = calloc(g->n_params ? g->n_params : 1,
                               sizeof *rank_of);
    if (!rank_of ||
        vp__zero_partition(g, S->dist->cfg->world, rank_of) != VP_OK) {
        free(rank_of);
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    }
    for (uint32_t p = 0; p < g->n_params; p++)
        z->owned[p] = rank_of[p] == S->dist->cfg->rank;
    free(rank_of);
    return VP_OK;
}

static vp_status ddp_init(sim *S, vp__dist *d)
{
    const vp_graph *g = S->g;
    size_t np = g->n_params ? g->n_params : 1;
    ddp *z = calloc(1, sizeof *z);
    if (!z)
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    d->impl = z;
    z->bv = d->cfg->strategy == VP_DIST_DDP_BUCKET_VIEW;
    z->zero = d->cfg->strategy == VP_DIST_DDP_ZERO1;
    z->order = calloc(np, sizeof *z->order);
    z->bucket_of = calloc(np, sizeof *z->bucket_of);
    z->members = calloc(np, sizeof *z->members);
    z->first = calloc(np + 1, sizeof *z->first);
    z->bucket = calloc(np, sizeof *z->bucket);
    z->left = calloc(np, sizeof *z->left);
    z->held = calloc(np, sizeof *z->held);
    z->owner = calloc(np, sizeof *z->owner);
    z->owned = calloc(np, sizeof *z->owned);
    z->on = calloc(np, sizeof *z->on);
    z->mask = calloc(np, sizeof *z->mask);
    if (!z->mask || !z->order || !z->bucket_of || !z->members || !z->first ||
        !z->bucket || !z->left || !z->held || !z->owner || !z->owned ||
        !z->on)
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    for (uint32_t p = 0; p < g->n_params; p++) {
        z->n_tr += bucketed(S, p);
        z->owned[p] = true;
    }
    S->opt_on = z->on;
    if (z->zero && !d->cfg->overlap_with_ddp)
        return partition(S, z);
    return VP_OK;
}

static void ddp_destroy(vp__dist *d)
{
    ddp *z = d->impl;
    if (z) {
        void *arrays[] = {z->order, z->bucket_of, z->members, z->first,
                          z->bucket, z->left, z->held, z->owner, z->owned,
                          z->on, z->mask};
        vp__dist_impl_free(d, arrays, sizeof arrays / sizeof arrays[0]);
    }
}

/* ---- buckets ---------------------------------------------------------- */

/* compute_bucket_assignment_by_size over `params` (n, in order): a bucket
 * closes once its bytes reach the current limit; the limits are `limits`
 * in turn, the last one repeated. */
static void assign(sim *S, ddp *z, const uint32_t *params, uint32_t n,
                   const uint64_t *limits, uint32_t n_limits)
{
    uint64_t size = 0;
    uint32_t lim = 0;
    z->n_buckets = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t p = params[k];
        if (size == 0)
            z->first[z->n_buckets] = k;
        z->members[k] = p;
        z->bucket_of[p] = z->n_buckets;
        size += S->g->params[p].numel * z->eb;
        if (size >= limits[lim] || k + 1 == n) {
            z->n_buckets++;
            size = 0;
            if (lim + 1 < n_limits)
                lim++;
        }
    }
    z->first[z->n_buckets] = n;
}

/* The buckets in reverse order (members kept in order within each). */
static void reverse_buckets(sim *S, ddp *z)
{
    uint32_t n = z->first[z->n_buckets], at = 0;
    uint32_t *m = malloc((n ? n : 1) * sizeof *m);
    uint32_t *f = malloc((z->n_buckets + 1) * sizeof *f);
    if (!m || !f) {
        free(m);
        free(f);
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    for (uint32_t b = z->n_buckets; b-- > 0;) {
        f[z->n_buckets - 1 - b] = at;
        for (uint32_t k = z->first[b]; k < z->first[b + 1]; k++) {
            m[at] = z->members[k];
            z->bucket_of[m[at]] = z->n_buckets - 1 - b;
            at++;
        }
    }
    f[z->n_buckets] = n;
    memcpy(z->members, m, n * sizeof *m);
    memcpy(z->first, f, (z->n_buckets + 1) * sizeof *f);
    free(m);
    free(f);
}

static uint64_t bucket_bytes(sim *S, ddp *z, uint32_t b)
{
    uint64_t n = 0;
    for (uint32_t k = z->first[b]; k < z->first[b + 1]; k++)
        n += S->g->params[z->members[k]].numel;
    return vp__mulc(S, n, z->eb);
}

/* Reducer::initialize_buckets: one tensor per bucket, in bucket order. */
static void alloc_buckets(sim *S, ddp *z)
{
    for (uint32_t b = 0; b < z->n_buckets && OK(S); b++) {
        z->bucket[b] = vp__dist_alloc(S, bucket_bytes(S, z, b), VP_CAT_GRAD,
                                      VP_STREAM_DEFAULT, "ddp buckets");
        z->left[b] = z->first[b + 1] - z->first[b];
    }
}

/* overlap_with_ddp: each bucket to the rank with the fewest elements so
 * far (_assign_bucket_subset_to_rank), this rank's parameters owned. */
static void assign_bucket_owners(sim *S, ddp *z)
{
    uint32_t w = S->dist->cfg->world;
    uint64_t *sizes = calloc(w, sizeof *sizes);
    if (!sizes) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return;
    }
    for (uint32_t b = 0; b < z->n_buckets; b++) {
        uint32_t r = min_index(sizes, w);
        z->owner[b] = r;
        for (uint32_t k = z->first[b]; k < z->first[b + 1]; k++) {
            sizes[r] += S->g->params[z->members[k]].numel;
            z->owned[z->members[k]] = r == S->dist->cfg->rank;
        }
    }
    free(sizes);
}

/* broadcast_coalesced: flat copies of groups of at least 250 MiB (one
 * dtype per group), the next made before the previous is freed. */
static void broadcast_coalesced(sim *S, bool buffers, const char *what)
{
    const vp_graph *g = S->g;
    uint32_t prev = NONE;
    uint64_t size = 0;
    for (uint32_t p = 0; p <= g->n_params && OK(S); p++) {
        bool last = p == g->n_params;
        if (!last && vp__dist_is_buffer(g, p) != buffers)
            continue;
        if (!last)
            size += vp__mulc(S, g->params[p].numel,
                             vp__param_bytes(S, &g->params[p]));
        if (size == 0 || (!last && size < BROADCAST_BUCKET))
            continue;
        uint32_t flat = vp__dist_alloc(S, size, VP_CAT_TEMP,
                                       VP_STREAM_DEFAULT, what);
        vp__dist_free_id(S, &prev);
        prev = flat;
        size = 0;
    }
    vp__dist_free_id(S, &prev);
}

static void ddp_wrap(sim *S, uint32_t *model)
{
    const vp_graph *g = S->g;
    ddp *z = impl(S);
    const vp_dist *c = S->dist->cfg;
    vp__model_convert(S, model); /* model.to(...) before DDP(model)     */
    z->eb = S->PE;
    broadcast_coalesced(S, false, "ddp _sync_module_states");
    broadcast_coalesced(S, true, "ddp _sync_module_states");
    uint32_t n = 0;
    for (uint32_t p = 0; p < g->n_params; p++)
        if (bucketed(S, p))
            z->order[n++] = p;
    if (c->find_unused && !c->static_graph) {
        /* [1 MiB, bucket_cap] over the parameters in order; DDP hands the
         * Reducer the buckets reversed (the order gradients come in) */
        uint64_t lim[2] = {c->first_bucket, c->bucket_cap};
        assign(S, z, z->order, n, lim, 2);
        reverse_buckets(S, z);
    } else {
        uint64_t lim = UINT64_MAX;
        assign(S, z, z->order, n, &lim, 1);
    }
    alloc_buckets(S, z);
    z->n_order = 0;
    if (z->zero && c->overlap_with_ddp)
        assign_bucket_owners(S, z);
}

/* ---- the step --------------------------------------------------------- */

/* Reducer::rebuild_buckets in the second iteration's _pre_forward. */
static void rebuild(sim *S, ddp *z)
{
    const vp_dist *c = S->dist->cfg;
    uint32_t idx = vp__dist_alloc(S, vp__mulc(S, (uint64_t)z->n_order + 1, 4),
                                  VP_CAT_TEMP, VP_STREAM_DEFAULT,
                                  "ddp rebuild_buckets");
    uint64_t lim[2] = {c->first_bucket, c->bucket_cap};
    uint32_t old = z->n_buckets;
    for (uint32_t b = 0; b < old; b++) {
        if (c->rebuild_held)
            z->held[z->n_held++] = z->bucket[b];
        else
            vp__tunref(S, z->bucket[b]);
        z->bucket[b] = NONE;
    }
    assign(S, z, z->order, z->n_order, lim, 2);
    uint32_t sizes = vp__dist_alloc(S, vp__mulc(S, (uint64_t)z->n_buckets + 1,
                                                4),
                                    VP_CAT_TEMP, VP_STREAM_DEFAULT, NULL);
    vp__tunref(S, sizes);
    vp__tunref(S, idx);
    alloc_buckets(S, z);
    if (z->bv && !S->s->set_to_none) {
        /* initialize_bucket_views: a kept .grad is copied into its view
         * and replaced by it */
        for (uint32_t k = 0; k < z->n_order; k++)
            vp__dist_free_id(S, &S->pgrad[z->order[k]]);
    }
    if (z->zero && c->overlap_with_ddp)
        assign_bucket_owners(S, z);
    z->rebuilt = true;
}

static void ddp_step_begin(sim *S)
{
    ddp *z = impl(S);
    const vp_dist *c = S->dist->cfg;
    if (c->broadcast_buffers)
        broadcast_coalesced(S, true, "ddp _sync_buffers");
    if (!z->rebuilt && S->dist->step == 2 &&
        (c->static_graph || !c->find_unused) && z->n_order == z->n_tr)
        rebuild(S, z);
    for (uint32_t b = 0; b < z->n_buckets; b++)
        z->left[b] = z->first[b + 1] - z->first[b];
}

/* overlap_with_ddp: the bucket's owner steps its parameters as soon as the
 * bucket is reduced (its local optimizer over them: the state at the
 * first step, the step's temporaries), from the iteration after the
 * rebuild. */
static void overlap_step(sim *S, ddp *z, uint32_t b)
{
    if (!z->rebuilt || z->owner[b] != S->dist->cfg->rank)
        return;
    for (uint32_t k = z->first[b]; k < z->first[b + 1]; k++)
        z->mask[z->members[k]] = true;
    S->opt_on = z->mask;
    vp__optimizer_step(S);
    S->opt_on = z->on;
    for (uint32_t k = z->first[b]; k < z->first[b + 1]; k++)
        z->mask[z->members[k]] = false;
}

static void ddp_grad_ready(sim *S, uint32_t p)
{
    ddp *z = impl(S);
    if (!bucketed(S, p))
        return;
    if (!z->rebuilt && z->n_order < z->n_tr)
        z->order[z->n_order++] = p; /* Reducer's rebuilt_params_        */
    z->on[p] = z->owned[p] && !(z->zero && S->dist->cfg->overlap_with_ddp);
    if (z->bv) {
        /* .grad := the bucket's view; the gradient made is freed */
        vp__dist_free_id(S, &S->pgrad[p]);
    }
    uint32_t b = z->bucket_of[p];
    if (z->left[b] > 0 && --z->left[b] == 0 && z->zero &&
        S->dist->cfg->overlap_with_ddp)
        overlap_step(S, z, b);
}

static void ddp_bwd_end(sim *S)
{
    ddp *z = impl(S);
    /* the worst rank: freed at the latest by the last bucket's
     * all-reduce of this backward (workEnqueue after the watchdog's poll) */
    for (uint32_t k = 0; k < z->n_held; k++)
        vp__tunref(S, z->held[k]);
    z->n_held = 0;
}

static void ddp_zero_grad(sim *S)
{
    ddp *z = impl(S);
    if (!S->s->set_to_none)
        return;
    memset(z->on, 0, S->g->n_params * sizeof *z->on);
}

const vp__dist_rules vp__dist_ddp_rules = {
    .init = ddp_init,
    .wrap = ddp_wrap,
    .step_begin = ddp_step_begin,
    .bwd_end = ddp_bwd_end,
    .grad_ready = ddp_grad_ready,
    .zero_grad = ddp_zero_grad,
    .destroy = ddp_destroy,
};
