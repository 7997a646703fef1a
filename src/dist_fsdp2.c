/* FSDP2 (torch.distributed.fsdp.fully_shard), rank by rank (PyTorch 2.11,
 * torch/distributed/fsdp/_fully_shard/; docs/DISTRIBUTED.md "FSDP2"):
 *
 *  - fully_shard(layer) for every segment, then the root: each parameter
 *    becomes a DTensor sharded on dim 0 (FSDPParam._init_sharded_param):
 *    its padded chunk (torch.chunk's size, the same on every rank) is
 *    allocated, then the original freed;
 *  - unshard (FSDPParamGroup.unshard, foreach_all_gather): with a
 *    param_dtype the shards are cast into one flat all-gather input
 *    (_get_param_all_gather_inputs), then the all-gather output of world x
 *    that, both on the all-gather stream; the input is freed. The copy-out
 *    (foreach_all_gather_copy_out, wait_for_unshard) allocates each
 *    unsharded parameter on the default stream; in the forward the output
 *    is freed only after the next group's copy-out (comm_ctx.
 *    all_gather_state), in the backward at once;
 *  - reshard_after_forward True frees the unsharded parameters after each
 *    forward (the root's too), False keeps them to the backward, an int
 *    keeps a clone of 1/int of each (FSDPParam.to_sharded_post_forward)
 *    and all-gathers from it in the backward;
 *  - the backward unshards each group in its pre-backward hook and
 *    prefetches the next one's all-gather (implicit prefetch); after the
 *    group's backward (post_backward) it reshards, frees the last
 *    reduce-scatter input (comm_ctx.reduce_scatter_state), allocates the
 *    new one (world x the shard, reduce_dtype) on the default stream, frees
 *    the unsharded gradients and allocates the reduce-scatter output on
 *    the reduce-scatter stream (foreach_reduce); cast to the parameters'
 *    dtype when reduce_dtype differs, it holds the sharded gradients (views)
 *    until zero_grad; HSDP all-reduces it in place;
 *  - CPUOffloadPolicy: the shards live on the host; each all-gather
 *    copies them to the device first, each reduced gradient goes back to
 *    the host; the optimizer steps on the host;
 *  - a pipeline stage (vp_setup.pipe; torch/distributed/pipelining/
 *    stage.py, _PipelineStageBase.backward_maybe_with_nosync): every
 *    micro-batch's backward runs with set_reshard_after_backward(False)
 *    and set_requires_gradient_sync(False), so post_backward keeps the
 *    unsharded parameters and only accumulates the unsharded gradients,
 *    in reduce_dtype (FSDPParam.to_accumulated_grad_if_needed, then
 *    accumulate_unsharded_grad_if_needed); after the last micro-batch's
 *    backward the stage calls each group's post_backward with both set
 *    back (run_post_backward: all_states in order, the root's first),
 *    which reshards and reduce-scatters. reshard_after_forward defaults
 *    to False there (torchtitan parallelize.py apply_fsdp: "default" is
 *    not pp_enabled). */
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

typedef struct grp {
    uint32_t ag_out;       /* a prefetched all-gather output, not yet
                              copied out                                */
    bool unsharded;        /* the unsharded parameters exist            */
    bool post_fwd;         /* reshard_after_forward int: the 1/n clones */
    uint32_t grad;         /* the reduce-scatter output (sharded grads) */
} grp;

typedef struct fsdp2 {
    grp *g;                /* per unit                                   */
    uint32_t *shard;       /* per parameter: its sharded tensor          */
    uint32_t *full;        /* per parameter: its unsharded tensor        */
    uint32_t *post;        /* per parameter: its post-forward clone      */
    uint64_t *local;       /* per parameter: this rank's chunk elements  */
    bool *on;
    uint32_t ag_state;     /* forward: the last all-gather output        */
    uint32_t rs_state;     /* the last reduce-scatter input              */
    int32_t raf;           /* 1 True, 0 False, n: reshard to n ranks     */
    bool nosync;           /* a pipeline stage: no reduce but the last   */
    uint32_t *acc;         /* per parameter: its unsharded gradient
                              accumulated in reduce_dtype (nosync)       */
    uint64_t n_bwd;        /* backwards run (nosync)                     */
    uint64_t *whole;       /* per parameter: tp when its gradient is a
                              Replicate DTensor of the whole tensor
                              (grad_share), else 1                      */
} fsdp2;

static fsdp2 *impl(sim *S)
{
    return S->dist->impl;
}

/* The parameters whose gradient is a Replicate DTensor of the whole
 * tensor: RowwiseParallel's embedding (ops/embed_loss.c), untied (a tied
 * head's Shard(0) gradient comes first and is not modelled so). */
static void whole_grads(const vp_graph *g, uint64_t *whole)
{
    for (uint32_t p = 0; p < g->n_params; p++)
        whole[p] = 1;
    for (uint32_t i = 0; i < g->n_ops; i++)
        if (g->ops[i].kind == VP_OP_EMBEDDING && g->ops[i].n_params > 0) {
            uint32_t p = g->ops[i].params[0];
            whole[p] = vp__tp_whole(g, &g->params[p]);
        }
    for (uint32_t i = 0; i < g->n_ops; i++)
        for (uint32_t k = 0; k < g->ops[i].n_params; k++)
            if (g->ops[i].kind != VP_OP_EMBEDDING)
                whole[g->ops[i].params[k]] = 1;
}

static vp_status f2_init(sim *S, vp__dist *d)
{
    const vp_graph *g = S->g;
    size_t np = g->n_params ? g->n_params : 1;
    fsdp2 *f = calloc(1, sizeof *f);
    if (!f)
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    d->impl = f;
    f->g = calloc(d->n_units, sizeof *f->g);
    f->shard = malloc(np * sizeof *f->shard);
    f->full = malloc(np * sizeof *f->full);
    f->post = malloc(np * sizeof *f->post);
    f->local = calloc(np, sizeof *f->local);
    f->on = calloc(np, sizeof *f->on);
    f->acc = malloc(np * sizeof *f->acc);
    f->whole = malloc(np * sizeof *f->whole);
    if (!f->g || !f->shard || !f->full || !f->post || !f->local || !f->on ||
        !f->acc || !f->whole)
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    whole_grads(g, f->whole);
    for (size_t p = 0; p < np; p++)
        f->shard[p] = f->full[p] = f->post[p] = f->acc[p] = NONE;
    for (uint32_t u = 0; u < d->n_units; u++)
        f->g[u].ag_out = f->g[u].grad = NONE;
    f->ag_state = f->rs_state = NONE;
    int32_t raf = d->cfg->reshard_after_forward;
    f->nosync = S->s->pipe != NULL;
    f->raf = raf >= 0 ? raf : f->nosync ? 0 : 1;
    if (f->raf > 1 && (d->group % (uint32_t)f->raf != 0))
        return vp_error_set(S->err, VP_EARG,
                            "reshard_after_forward=%d does not divide the "
                            "shard group of %u ranks", (int)f->raf,
                            d->group);
    if (f->raf > 1 && (uint32_t)f->raf == d->group)
        f->raf = 1; /* the whole shard group: True (_fsdp_init.py,
                       _get_post_forward_mesh_info)                       */
    for (uint32_t p = 0; p < g->n_params; p++)
        if (d->unit_of_param[p] != UINT32_MAX)
            f->local[p] = vp__chunk_numel(g, p, d->group, d->grank, NULL);
    S->opt_numel = f->local;
    S->opt_on = f->on;
    S->opt_eb = d->model_eb;
    return VP_OK;
}

static void f2_destroy(vp__dist *d)
{
    fsdp2 *f = d->impl;
    if (f) {
        void *arrays[] = {f->g,     f->shard, f->full, f->post,
                          f->local, f->on,    f->acc,  f->whole};
        vp__dist_impl_free(d, arrays, sizeof arrays / sizeof arrays[0]);
    }
}

static uint64_t padded_of(sim *S, uint32_t p, uint32_t world)
{
    uint64_t padded;
    vp__chunk_numel(S->g, p, world, 0, &padded);
    return padded;
}

/* fully_shard on each segment, then the root: the shards are made, then
 * the originals freed. */
static void f2_wrap(sim *S, uint32_t *model)
{
    vp__dist *d = S->dist;
    fsdp2 *f = impl(S);
    const bool host = d->cfg->cpu_offload;
    if (d->model_eb == 2)
        vp__model_convert(S, model); /* model.to(half), then fully_shard */
    for (uint32_t k = 1; k <= d->n_units && OK(S); k++) {
        const vp__unit *un = &d->units[k % d->n_units];
        for (uint32_t i = 0; i < un->n_params && !host; i++) {
            uint32_t p = un->params[i];
            f->shard[p] = vp__dist_alloc(
                S, vp__mulc(S, padded_of(S, p, d->group), d->model_eb),
                VP_CAT_PARAM, VP_STREAM_DEFAULT, "fsdp2 _init_sharded_param");
        }
        for (uint32_t i = 0; i < un->n_params; i++)
            vp__dist_free_id(S, &model[un->params[i]]);
    }
}

/* ---- unshard ---------------------------------------------------------- */

/* foreach_all_gather: the all-gather output of unit u (and its input,
 * freed once copied in). From the post-forward clones when there are. */
static uint32_t all_gather(sim *S, uint32_t u)
{
    vp__dist *d = S->dist;
    fsdp2 *f = impl(S);
    const vp__unit *un = &d->units[u];
    const bool host = d->cfg->cpu_offload;
    const bool cast = d->unsharded_eb != d->model_eb;
    uint32_t n = un->n_params;
    const char *what = "fsdp2 all_gather";

    if (n == 0)
        return NONE;
    uint32_t *in = malloc(n * sizeof *in);
    if (!in) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return NONE;
    }
    for (uint32_t i = 0; i < n; i++)
        in[i] = NONE;
    uint32_t flat = NONE;
    if (host) {
        /* each shard copied to the device, then cast (not the foreach
         * path: offload_to_cpu) */
        for (uint32_t i = 0; i < n; i++) {
            uint32_t p = un->params[i];
            uint64_t pad = padded_of(S, p, d->group);
            in[i] = vp__dist_alloc(S, vp__mulc(S, pad, d->model_eb),
                                   VP_CAT_TEMP, VP_STREAM_UNSHARD, what);
            if (cast) {
                uint32_t c = vp__dist_alloc(S, vp__mulc(S, pad,
                                                        d->unsharded_eb),
                                            VP_CAT_TEMP, VP_STREAM_UNSHARD,
                                            what);
                vp__dist_free_id(S, &in[i]);
                in[i] = c;
            }
        }
    } else if (cast || f->g[u].post_fwd) {
        /* one flat input: the shards cast into it (foreach copy) */
        flat = vp__dist_alloc(S, vp__mulc(S, un->padded, d->unsharded_eb),
                              VP_CAT_TEMP, VP_STREAM_UNSHARD, what);
    }
    uint32_t out = vp__dist_alloc(
        S, vp__mulc(S, vp__mulc(S, un->padded, d->group), d->unsharded_eb),
        VP_CAT_TEMP, VP_STREAM_UNSHARD, what);
    vp__dist_free_id(S, &flat);
    for (uint32_t i = 0; i < n; i++)
        vp__dist_free_id(S, &in[i]);
    free(in);
    if (f->g[u].post_fwd) {
        for (uint32_t i = 0; i < n; i++)
            vp__dist_free_id(S, &f->post[un->params[i]]);
        f->g[u].post_fwd = false;
    }
    return out;
}

/* foreach_all_gather_copy_out: each unsharded parameter; the output is
 * kept for the next group's copy-out in the forward, freed at once in
 * the backward. */
static void copy_out(sim *S, uint32_t u, uint32_t out, bool forward)
{
    vp__dist *d = S->dist;
    fsdp2 *f = impl(S);
    const vp__unit *un = &d->units[u];
    for (uint32_t i = 0; i < un->n_params; i++) {
        uint32_t p = un->params[i];
        f->full[p] = vp__dist_alloc(
            S, vp__mulc(S, S->g->params[p].numel, d->unsharded_eb),
            VP_CAT_PARAM, VP_STREAM_DEFAULT, "fsdp2 copy_out");
    }
    f->g[u].unsharded = true;
    if (forward) {
        vp__dist_free_id(S, &f->ag_state);
        f->ag_state = out;
    } else {
        vp__dist_free_id(S, &out);
    }
}

/* A shard group of one rank (FSDPParamGroup.wait_for_unshard,
 * world_size == 1): no all-gather; each parameter's cast to param_dtype
 * (FSDPParam.all_gather_inputs) is copied into its unsharded tensor, the
 * previous cast freed once the next is made. */
static void copy_single(sim *S, uint32_t u)
{
    vp__dist *d = S->dist;
    fsdp2 *f = impl(S);
    const vp__unit *un = &d->units[u];
    const bool cast = d->unsharded_eb != d->model_eb || d->cfg->cpu_offload;
    uint32_t prev = NONE;
    for (uint32_t i = 0; i < un->n_params; i++) {
        uint32_t p = un->params[i];
        uint64_t n = S->g->params[p].numel;
        uint32_t c = cast ? vp__dist_alloc(S, vp__mulc(S, n, d->unsharded_eb),
                                           VP_CAT_TEMP, VP_STREAM_DEFAULT,
                                           "fsdp2 all_gather_inputs")
                          : NONE;
        vp__dist_free_id(S, &prev);
        f->full[p] = vp__dist_alloc(S, vp__mulc(S, n, d->unsharded_eb),
                                    VP_CAT_PARAM, VP_STREAM_DEFAULT,
                                    "fsdp2 wait_for_unshard");
        prev = c;
    }
    vp__dist_free_id(S, &prev);
    f->g[u].unsharded = true;
}

static void unshard(sim *S, uint32_t u, bool forward)
{
    fsdp2 *f = impl(S);
    if (f->g[u].unsharded || S->dist->units[u].n_params == 0)
        return;
    if (S->dist->group == 1) {
        copy_single(S, u);
        return;
    }
    uint32_t out = f->g[u].ag_out;
    f->g[u].ag_out = NONE;
    if (out == NONE)
        out = all_gather(S, u);
    copy_out(S, u, out, forward);
}

/* Free the unsharded parameters; to_sharded_post_forward keeps a clone of
 * 1/n of each first. */
static void reshard(sim *S, uint32_t u, bool post_forward)
{
    vp__dist *d = S->dist;
    fsdp2 *f = impl(S);
    const vp__unit *un = &d->units[u];
    if (!f->g[u].unsharded)
        return;
    for (uint32_t i = 0; i < un->n_params && post_forward && f->raf > 1;
         i++) {
        uint32_t p = un->params[i];
        uint64_t n = vp__mulc(S, padded_of(S, p, d->group),
                              d->group / (uint32_t)f->raf);
        f->post[p] = vp__dist_alloc(S, vp__mulc(S, n, d->unsharded_eb),
                                    VP_CAT_PARAM, VP_STREAM_DEFAULT,
                                    "fsdp2 to_sharded_post_forward");
    }
    f->g[u].post_fwd = post_forward && f->raf > 1;
    for (uint32_t i = 0; i < un->n_params; i++)
        vp__dist_free_id(S, &f->full[un->params[i]]);
    f->g[u].unsharded = false;
}

/* ---- output_dtype -------------------------------------------------------- */

/* MixedPrecisionPolicy.output_dtype (FSDPState._post_forward, after the
 * pre-backward hook is registered on the output): each module's floating
 * outputs cast to it; the next module's _pre_forward casts them back to
 * param_dtype (cast_forward_inputs), so the copy lives only between the
 * two, beside the output, which stands for its cast-back twin. In the
 * backward the two ToCopyBackward nodes run before the module's
 * pre-backward hook: a transient gradient in output_dtype. A cast to the
 * activations' own dtype is no copy (_cast_fp_tensor). */
static void cast_outputs(sim *S, uint64_t numel)
{
    uint8_t ob = vp__mp_bytes(S->dist->cfg->output_dtype);
    if (!ob || ob == S->A || numel == 0)
        return;
    S->cur_op = "fsdp2 cast_forward_outputs";
    vp__transient(S, vp__mulc(S, numel, ob));
}

/* A layer unit's output: its segment's last op's. */
static uint64_t unit_out_numel(sim *S, uint32_t u)
{
    int32_t seg = S->dist->units[u].seg;
    return seg < 0 ? 0 : S->g->ops[S->g->segs[seg].last_op].numel;
}

/* The root's floating output: the logits the loss was computed from (the
 * loss itself is fp32 already). */
static uint64_t root_out_numel(sim *S)
{
    for (size_t i = S->g->n_ops; i-- > 0;) {
        const vp_op *o = &S->g->ops[i];
        if (o->kind == VP_OP_CROSS_ENTROPY && o->n_inputs > 0)
            return S->g->ops[o->inputs[0]].numel;
    }
    return 0;
}

/* ---- forward ---------------------------------------------------------- */

static void f2_fwd_begin(sim *S)
{
    unshard(S, 0, true);
}

static void f2_unit_fwd_begin(sim *S, uint32_t u)
{
    unshard(S, u, true);
}

static void f2_unit_fwd_end(sim *S, uint32_t u)
{
    if (impl(S)->raf != 0)
        reshard(S, u, true);
    cast_outputs(S, unit_out_numel(S, u));
}

static void f2_fwd_end(sim *S)
{
    fsdp2 *f = impl(S);
    if (f->raf != 0)
        reshard(S, 0, true);
    vp__dist_free_id(S, &f->ag_state);
    cast_outputs(S, root_out_numel(S));
}

/* ---- backward --------------------------------------------------------- */

/* The implicit backward prefetch: the all-gather of the group that runs
 * next in the backward (the previous segment), copied out in its own
 * pre-backward. */
static void prefetch(sim *S, uint32_t u)
{
    fsdp2 *f = impl(S);
    if (u == 0 || f->g[u].unsharded || f->g[u].ag_out != NONE ||
        S->dist->group == 1)
        return;
    f->g[u].ag_out = all_gather(S, u);
}

static void f2_bwd_begin(sim *S)
{
    unshard(S, 0, false);
    prefetch(S, S->dist->n_units - 1);
}

static void f2_unit_bwd_begin(sim *S, uint32_t u)
{
    cast_outputs(S, unit_out_numel(S, u));
    unshard(S, u, false);
    prefetch(S, u - 1);
}

/* foreach_reduce: the reduce-scatter of unit u's unsharded gradients. */
/* A gradient that is a Replicate DTensor of the whole tensor (the tensor-
 * parallel embedding's, ops/embed_loss.c), as FSDPParam's
 * unsharded_grad_data / unsharded_accumulated_grad_data read it
 * (_get_grad_inner_tensor: grad.redistribute to the parameter's
 * placements, Shard._replicate_to_shard's clone of the rank's rows, then
 * post_backward drops the whole one): *id becomes the clone. */
static void grad_share(sim *S, uint32_t p, uint32_t *id, uint8_t eb)
{
    if (*id == NONE || impl(S)->whole[p] == 1)
        return;
    uint64_t share = vp__mulc(S, S->g->params[p].numel, eb);
    uint32_t c = vp__dist_alloc(S, share, VP_CAT_GRAD, VP_STREAM_DEFAULT,
                                "fsdp2 _replicate_to_shard");
    vp__dist_free_id(S, id);
    *id = c;
}

static void reduce(sim *S, uint32_t u)
{
    vp__dist *d = S->dist;
    fsdp2 *f = impl(S);
    const vp__unit *un = &d->units[u];
    const char *what = "fsdp2 reduce_scatter";
    bool any = false;
    for (uint32_t i = 0; i < un->n_params; i++)
        any |= S->pgrad[un->params[i]] != NONE ||
               f->acc[un->params[i]] != NONE;
    if (!any)
        return;
    for (uint32_t i = 0; i < un->n_params; i++) {
        grad_share(S, un->params[i], &S->pgrad[un->params[i]],
                   d->unsharded_eb);
        grad_share(S, un->params[i], &f->acc[un->params[i]], d->reduce_eb);
    }
    vp__dist_free_id(S, &f->rs_state);
    f->rs_state = vp__dist_alloc(
        S, vp__mulc(S, vp__mulc(S, un->padded, d->group), d->reduce_eb),
        VP_CAT_TEMP, VP_STREAM_DEFAULT, what);
    for (uint32_t i = un->n_params; i-- > 0;) {
        vp__dist_free_id(S, &S->pgrad[un->params[i]]);
        vp__dist_free_id(S, &f->acc[un->params[i]]);
    }
    uint32_t out = vp__dist_alloc(S, vp__mulc(S, un->padded, d->reduce_eb),
                                  VP_CAT_GRAD, VP_STREAM_REDUCE, what);
    if (d->reduce_eb != d->model_eb) {
        /* _to_dtype_if_needed(reduce_output, orig_dtype) */
        uint32_t c = vp__dist_alloc(S, vp__mulc(S, un->padded, d->model_eb),
                                    VP_CAT_GRAD, VP_STREAM_REDUCE, what);
        vp__dist_free_id(S, &out);
        out = c;
    }
    if (d->cfg->cpu_offload || f->g[u].grad != NONE) {
        /* copied to the host, or added into the gradients held */
        vp__dist_free_id(S, &out);
    } else {
        f->g[u].grad = out;
    }
    for (uint32_t i = 0; i < un->n_params; i++)
        f->on[un->params[i]] = !d->cfg->cpu_offload &&
                               f->local[un->params[i]] > 0 &&
                               S->g->params[un->params[i]].trainable;
}

/* post_backward without gradient sync (a pipeline stage's micro-batch):
 * each unsharded gradient kept, in reduce_dtype: the first cast to it
 * (to_accumulated_grad_if_needed: grad.to(reduce_dtype), then the grad
 * dropped), the later ones added into it and dropped (accumulate_
 * unsharded_grad_if_needed). In the parameters' dtype AccumulateGrad
 * adds into .grad itself. */
static void accumulate(sim *S, uint32_t u)
{
    vp__dist *d = S->dist;
    fsdp2 *f = impl(S);
    const vp__unit *un = &d->units[u];
    if (d->reduce_eb == d->unsharded_eb)
        return;
    for (uint32_t i = 0; i < un->n_params; i++) {
        uint32_t p = un->params[i];
        if (S->pgrad[p] == NONE)
            continue;
        /* grad.to(reduce_dtype) as the gradient is: the whole tensor
         * for a Replicate DTensor (grad_share) */
        if (f->acc[p] == NONE)
            f->acc[p] = vp__dist_alloc(
                S, vp__mulc(S, vp__mulc(S, S->g->params[p].numel, f->whole[p]),
                            d->reduce_eb),
                VP_CAT_GRAD, VP_STREAM_DEFAULT,
                "fsdp2 to_accumulated_grad_if_needed");
        vp__dist_free_id(S, &S->pgrad[p]);
    }
}

static void f2_unit_bwd_end(sim *S, uint32_t u)
{
    if (impl(S)->nosync) {
        accumulate(S, u);
        return;
    }
    reshard(S, u, false);
    reduce(S, u);
}

static void f2_bwd_end(sim *S)
{
    vp__dist *d = S->dist;
    fsdp2 *f = impl(S);
    if (f->nosync) {
        accumulate(S, 0);
        /* the step's last micro-batch: run_post_backward, the root's
         * state first, then the others in the module order */
        if (++f->n_bwd % (S->s->accum ? S->s->accum : 1) != 0)
            return;
        for (uint32_t u = 0; u < d->n_units && OK(S); u++) {
            reshard(S, u, false);
            reduce(S, u);
        }
    } else {
        reshard(S, 0, false);
        reduce(S, 0);
    }
    vp__dist_free_id(S, &f->rs_state);
}

static void f2_zero_grad(sim *S)
{
    vp__dist *d = S->dist;
    fsdp2 *f = impl(S);
    if (!S->s->set_to_none)
        return;
    /* each unit's buffer goes with the last of its gradients, in the
     * order of the parameters: the segments, then the root */
    for (uint32_t k = 1; k <= d->n_units; k++)
        vp__dist_free_id(S, &f->g[k % d->n_units].grad);
    memset(f->on, 0, S->g->n_params * sizeof *f->on);
}

const vp__dist_rules vp__dist_fsdp2_rules = VP__DIST_UNIT_RULES(f2);
