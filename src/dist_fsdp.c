/* FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel), rank by rank
 * (PyTorch 2.11, torch/distributed/fsdp/_flat_param.py, _runtime_utils.py,
 * _init_utils.py; docs/DISTRIBUTED.md "FSDP1"):
 *
 *  - construction, every unit (the segments, then the root): its
 *    parameters are copied into one flat parameter (flatten_tensors), this
 *    rank's shard is copied out (FlatParamHandle.shard, _get_shard: the
 *    flat parameter in world equal chunks, the last padded), the flat
 *    parameter freed, then the originals; use_orig_params aligns every
 *    parameter to 16 bytes first;
 *  - the first forward (_lazy_init, init_flat_param_attributes) makes and
 *    frees the mixed-precision shard, the padded unsharded parameter and,
 *    with a param_dtype, its full-precision twin;
 *  - unshard (_unshard): the shard cast to param_dtype on the pre-unshard
 *    stream (_use_low_precision_shard), the padded unsharded parameter on
 *    the unshard stream (_alloc_padded_unsharded_flat_param, world x the
 *    shard), the cast freed; FULL_SHARD and HYBRID_SHARD reshard after each
 *    forward but the root's, SHARD_GRAD_OP keeps the parameters to the
 *    backward; NO_SHARD (and any strategy on one rank) keeps the flat
 *    parameter whole and frees only its cast after each forward;
 *    forward_prefetch unshards the next unit with the current one,
 *    BACKWARD_PRE the next unit of the backward in the pre-backward hook,
 *    BACKWARD_POST in the post-backward hook;
 *  - post-backward (_post_backward_hook, _reduce_grad): autograd gathers
 *    the parameters' gradients into the flat gradient (on the unshard
 *    stream, where the views were made) and frees them; the unit reshards;
 *    the reduce-scatter output (shard, reduce_dtype) is cast to the
 *    parameters' dtype (_cast_grad_to_param_dtype) and kept as the sharded
 *    gradient; the flat gradient is freed. NO_SHARD all-reduces the flat
 *    gradient in place and keeps its cast. */
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

typedef struct unit1 {
    uint32_t shard;        /* the flat shard (NO_SHARD: the flat param)   */
    uint32_t full;         /* the padded unsharded parameter, or NO_SHARD's
                              cast to param_dtype                        */
    uint32_t grad;         /* the sharded gradient                        */
} unit1;

typedef struct fsdp1 {
    unit1 *u;
    uint64_t *numel;       /* per unit: the flat parameter (aligned)     */
    uint64_t *shard;       /* per unit: this rank's shard                */
    bool *on;              /* per unit: stepped by the optimizer         */
    bool no_shard, reshard_fwd, mp;
    bool lazy_done;
} fsdp1;

static fsdp1 *impl(sim *S)
{
    return S->dist->impl;
}

/* use_orig_params: every parameter starts at a 16-byte aligned offset
 * (FlatParamHandle._init_flat_param_and_metadata, _get_aligned_numel), and
 * the flat parameter is padded to a multiple of the world. */
static uint64_t flat_numel(sim *S, const vp__unit *un, bool align)
{
    vp__dist *d = S->dist;
    uint64_t n = 0, a = 16 / d->model_eb;
    for (uint32_t i = 0; i < un->n_params; i++) {
        if (align && n % a)
            n += a - n % a;
        n += S->g->params[un->params[i]].numel;
    }
    if (align && n % d->group)
        n += d->group - n % d->group;
    return n;
}

static vp_status f1_init(sim *S, vp__dist *d)
{
    fsdp1 *f = calloc(1, sizeof *f);
    if (!f)
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    d->impl = f;
    if (d->n_units > S->g->n_params)
        return vp_error_set(S->err, VP_EARG,
                            "FSDP needs a parameter in every unit");
    f->u = calloc(d->n_units, sizeof *f->u);
    f->numel = calloc(d->n_units, sizeof *f->numel);
    f->shard = calloc(d->n_units, sizeof *f->shard);
    f->on = calloc(d->n_units, sizeof *f->on);
    if (!f->u || !f->numel || !f->shard || !f->on)
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    f->no_shard = d->group == 1;
    f->reshard_fwd = d->cfg->strategy == VP_DIST_FSDP_FULL ||
                     d->cfg->strategy == VP_DIST_FSDP_HYBRID;
    f->mp = d->unsharded_eb != d->model_eb;
    for (uint32_t u = 0; u < d->n_units; u++) {
        f->u[u] = (unit1){NONE, NONE, NONE};
        f->numel[u] = flat_numel(S, &d->units[u], d->cfg->use_orig_params);
        f->shard[u] = (f->numel[u] + d->group - 1) / d->group;
    }
    /* the optimizer steps the flat shards, root first (its flat parameter
     * is registered first) */
    S->n_opt = d->n_units;
    S->opt_numel = f->shard;
    S->opt_on = f->on;
    S->opt_eb = d->model_eb;
    return VP_OK;
}

static void f1_destroy(vp__dist *d)
{
    fsdp1 *f = d->impl;
    if (f) {
        void *arrays[] = {f->u, f->numel, f->shard, f->on};
        vp__dist_impl_free(d, arrays, sizeof arrays / sizeof arrays[0]);
    }
}

static uint64_t unsharded_numel(sim *S, uint32_t u)
{
    fsdp1 *f = impl(S);
    return f->no_shard ? f->numel[u]
                       : vp__mulc(S, f->shard[u], S->dist->group);
}

static void f1_wrap(sim *S, uint32_t *model)
{
    vp__dist *d = S->dist;
    fsdp1 *f = impl(S);
    if (d->model_eb == 2)
        vp__model_convert(S, model); /* model.to(half), then FSDP       */
    for (uint32_t k = 1; k <= d->n_units && OK(S); k++) {
        uint32_t u = k % d->n_units;
        const vp__unit *un = &d->units[u];
        if (un->n_params == 0)
            continue;
        uint32_t flat = vp__dist_alloc(S, vp__mulc(S, f->numel[u],
                                                   d->model_eb),
                                       VP_CAT_PARAM, VP_STREAM_DEFAULT,
                                       "fsdp flatten_tensors");
        if (f->no_shard) {
            f->u[u].shard = flat;
        } else {
            f->u[u].shard = vp__dist_alloc(S, vp__mulc(S, f->shard[u],
                                                       d->model_eb),
                                           VP_CAT_PARAM, VP_STREAM_DEFAULT,
                                           "fsdp shard");
            vp__dist_free_id(S, &flat);
        }
        for (uint32_t i = un->n_params; i-- > 0;)
            vp__dist_free_id(S, &model[un->params[i]]);
    }
}

/* init_flat_param_attributes at the first forward: made and freed. */
static void lazy_init(sim *S)
{
    vp__dist *d = S->dist;
    fsdp1 *f = impl(S);
    if (f->lazy_done)
        return;
    f->lazy_done = true;
    for (uint32_t u = 0; u < d->n_units && OK(S); u++) {
        if (d->units[u].n_params == 0)
            continue;
        uint64_t sizes[3] = {0, 0, 0};
        if (f->mp)
            sizes[0] = vp__mulc(S, f->no_shard ? f->numel[u] : f->shard[u],
                                d->unsharded_eb);  /* _mp_shard          */
        if (!f->no_shard) {
            sizes[1] = vp__mulc(S, unsharded_numel(S, u),
                                d->unsharded_eb);  /* _full_param_padded  */
            if (f->mp)
                sizes[2] = vp__mulc(S, unsharded_numel(S, u),
                                    d->model_eb);  /* full precision twin */
        }
        for (int i = 0; i < 3; i++) {
            uint32_t t = sizes[i] ? vp__dist_alloc(S, sizes[i], VP_CAT_TEMP,
                                                   VP_STREAM_DEFAULT,
                                                   "fsdp _lazy_init")
                                  : NONE;
            vp__dist_free_id(S, &t);
        }
    }
}

/* ---- unshard and reshard ----------------------------------------------- */

static void unshard(sim *S, uint32_t u)
{
    vp__dist *d = S->dist;
    fsdp1 *f = impl(S);
    const char *what = "fsdp unshard";
    if (u >= d->n_units || d->units[u].n_params == 0 ||
        f->u[u].full != NONE || (f->no_shard && !f->mp))
        return;
    if (f->no_shard) {
        f->u[u].full = vp__dist_alloc(S, vp__mulc(S, f->numel[u],
                                                  d->unsharded_eb),
                                      VP_CAT_PARAM, VP_STREAM_PRE_UNSHARD,
                                      what);
        return;
    }
    uint32_t lp = NONE;
    if (f->mp)
        lp = vp__dist_alloc(S, vp__mulc(S, f->shard[u], d->unsharded_eb),
                            VP_CAT_TEMP, VP_STREAM_PRE_UNSHARD, what);
    f->u[u].full = vp__dist_alloc(S, vp__mulc(S, unsharded_numel(S, u),
                                              d->unsharded_eb),
                                  VP_CAT_PARAM, VP_STREAM_UNSHARD, what);
    vp__dist_free_id(S, &lp);
}

static void reshard(sim *S, uint32_t u)
{
    vp__dist_free_id(S, &impl(S)->u[u].full);
}

static void f1_fwd_begin(sim *S)
{
    lazy_init(S);
    unshard(S, 0);
    if (S->dist->cfg->forward_prefetch)
        unshard(S, 1);
}

static void f1_unit_fwd_begin(sim *S, uint32_t u)
{
    unshard(S, u);
    if (S->dist->cfg->forward_prefetch)
        unshard(S, u + 1);
}

static void f1_unit_fwd_end(sim *S, uint32_t u)
{
    fsdp1 *f = impl(S);
    if (f->reshard_fwd || f->no_shard)
        reshard(S, u);
}

static void f1_fwd_end(sim *S)
{
    if (impl(S)->no_shard)
        reshard(S, 0);
}

/* ---- backward ---------------------------------------------------------- */

static void f1_bwd_begin(sim *S)
{
    unshard(S, 0);
    if (S->dist->cfg->backward_prefetch == VP_PREFETCH_PRE)
        unshard(S, S->dist->n_units - 1);
}

static void f1_unit_bwd_begin(sim *S, uint32_t u)
{
    unshard(S, u);
    if (S->dist->cfg->backward_prefetch == VP_PREFETCH_PRE && u > 1)
        unshard(S, u - 1);
}

/* The sharded gradient (or NO_SHARD's) from the flat gradient. */
static void reduce(sim *S, uint32_t u, uint32_t *flat)
{
    vp__dist *d = S->dist;
    fsdp1 *f = impl(S);
    const char *what = "fsdp reduce_scatter";
    uint32_t red = NONE, out;
    if (d->reduce_eb != d->unsharded_eb)
        /* _reduce_grad: unsharded_grad.to(reduce_dtype) */
        red = vp__dist_alloc(S, vp__mulc(S, unsharded_numel(S, u),
                                         d->reduce_eb),
                             VP_CAT_TEMP, VP_STREAM_REDUCE, what);
    if (f->no_shard) {
        out = red != NONE ? red : *flat;
        if (red == NONE)
            *flat = NONE;
        red = NONE;
    } else {
        out = vp__dist_alloc(S, vp__mulc(S, f->shard[u], d->reduce_eb),
                             VP_CAT_GRAD, VP_STREAM_REDUCE, what);
    }
    uint8_t oeb = d->reduce_eb;
    if (oeb != d->model_eb) {
        /* _cast_grad_to_param_dtype */
        uint64_t n = f->no_shard ? f->numel[u] : f->shard[u];
        uint32_t c = vp__dist_alloc(S, vp__mulc(S, n, d->model_eb),
                                    VP_CAT_GRAD, VP_STREAM_REDUCE, what);
        vp__dist_free_id(S, &out);
        out = c;
    }
    vp__dist_free_id(S, &red);
    if (f->u[u].grad != NONE)
        vp__dist_free_id(S, &out); /* accumulated into the one held     */
    else
        f->u[u].grad = out;
    f->on[u] = true;
}

static void post_backward(sim *S, uint32_t u)
{
    vp__dist *d = S->dist;
    const vp__unit *un = &d->units[u];
    bool any = false;
    for (uint32_t i = 0; i < un->n_params; i++)
        any |= S->pgrad[un->params[i]] != NONE;
    if (!any) {
        reshard(S, u);
        return;
    }
    uint32_t flat = vp__dist_alloc(S, vp__mulc(S, unsharded_numel(S, u),
                                               d->unsharded_eb),
                                   VP_CAT_TEMP, VP_STREAM_UNSHARD,
                                   "fsdp post_backward");
    for (uint32_t i = 0; i < un->n_params; i++)
        vp__dist_free_id(S, &S->pgrad[un->params[i]]);
    reshard(S, u);
    if (d->cfg->backward_prefetch == VP_PREFETCH_POST && u > 1)
        unshard(S, u - 1);
    reduce(S, u, &flat);
    vp__dist_free_id(S, &flat);
}

static void f1_unit_bwd_end(sim *S, uint32_t u)
{
    post_backward(S, u);
}

static void f1_bwd_end(sim *S)
{
    post_backward(S, 0);
}

static void f1_zero_grad(sim *S)
{
    vp__dist *d = S->dist;
    fsdp1 *f = impl(S);
    if (!S->s->set_to_none)
        return;
    for (uint32_t u = 0; u < d->n_units; u++) {
        vp__dist_free_id(S, &f->u[u].grad);
        f->on[u] = false;
    }
}

const vp__dist_rules vp__dist_fsdp1_rules = VP__DIST_UNIT_RULES(f1);
