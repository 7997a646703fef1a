/* A pipeline stage's step under the 1F1B schedule: several micro-batches'
 * forwards alive at once, each with its own saved tensors, through the
 * same op rules and allocator as one GPU.
 *
 * Megatron-LM, megatron/core/pipeline_parallel/schedules.py,
 * forward_backward_pipelining_without_interleaving: rank s of p runs
 * num_warmup_microbatches = min(p - s - 1, m) forwards, then
 * num_microbatches_remaining = m - warm-up times one forward and one
 * backward (of the oldest micro-batch in flight), then the warm-up's
 * backwards (cooldown). A forward's output is sent and its storage freed
 * (deallocate_output_tensor); its input (the received hidden states) and
 * every tensor its ops saved stay until its backward, which starts from
 * the gradient the next stage sends (recv_backward), or on the last stage
 * from the loss. At most w + 1 micro-batches are in flight.
 *
 * The interleaved schedule (vp_pipeline.chunks = v > 1; schedules.py,
 * forward_backward_pipelining_with_interleaving): the rank's v model
 * chunks are consecutive op ranges of the graph, each from its own input
 * op; m v passes (a micro-batch through one chunk), (p - s - 1) 2 +
 * (v - 1) p of them warm-up forwards (all when that is as many), then a
 * forward and a backward in turn; get_model_chunk_id orders the chunks
 * within each group of p micro-batches, reversed for the backwards.
 *
 * Each pass in flight has its own per-op state (outputs, saved slots,
 * checkpointed inputs, Python holds, autograd leaves, batch), taken from
 * a free list: the engine's arrays are swapped for the pass's while it
 * runs, and its op range (sim.op_lo, op_hi) bounds the engine's passes.
 *
 * torch's PipelineStage under Schedule1F1B (vp_pipeline.torch,
 * torchtitan; torch/distributed/pipelining/schedules.py,
 * Schedule1F1B._step_microbatches: min(m, p - s) warm-up forwards, then
 * a backward and a forward in turn, the same order as Megatron's) keeps
 * more (stage.py, _PipelineStageBase; docs/DISTRIBUTED.md):
 *  - the stage's first step makes a receive buffer per micro-batch
 *    (_prepare_forward_infra, _create_act_recv_info: torch.empty of the
 *    input's shape) on a stage after the first, then a gradient-receive
 *    buffer per micro-batch (_prepare_backward_infra,
 *    _create_grad_recv_info) on a stage before the last; the stage keeps
 *    them for the run, each micro-batch's input is its buffer and its
 *    backward starts from its gradient buffer;
 *  - forward_one_chunk keeps the stage's output in fwd_cache until
 *    backward_one_chunk pops it: alive until that backward has run (the
 *    last stage's too: the logits its loss is computed from);
 *  - the schedule's `output` variable keeps the latest forward's output
 *    until the next forward_one_chunk returns, the last one's until
 *    _step_microbatches returns (after perform_reduce_grad). */
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"
#include "sim_internal.h"

typedef struct {
    uint32_t *out_t, *saved;
    uint8_t *out_eb, *lay, *n_saved;
    uint64_t *reload;
    uint32_t *held, *leaf;
    size_t n_held, cap_held, n_leaf, cap_leaf, n_ckin, cap_ckin, n_ph, cap_ph;
    void *ckin, *ph;
    uint32_t n_ph_kind[VP__PH_KINDS];
    int32_t ph_until_min;
    uint32_t batch[VP__MAX_BATCH];
    size_t nb;
    uint32_t loss_t;
    uint32_t out_keep; /* torch: the stage output in fwd_cache */
} mbctx;

#define SWAP(T, a, b)                                                      \
    do {                                                                   \
        T t_ = (a);                                                        \
        (a) = (b);                                                         \
        (b) = t_;                                                          \
    } while (0)

/* Exchange the engine's per-micro-batch state with c's. */
static void swap_ctx(sim *S, mbctx *c)
{
    SWAP(uint32_t *, S->out_t, c->out_t);
    SWAP(uint32_t *, S->saved, c->saved);
    SWAP(uint8_t *, S->out_eb, c->out_eb);
    SWAP(uint8_t *, S->lay, c->lay);
    SWAP(uint8_t *, S->n_saved, c->n_saved);
    SWAP(uint64_t *, S->reload, c->reload);
    SWAP(uint32_t *, S->held, c->held);
    SWAP(uint32_t *, S->leaf, c->leaf);
    SWAP(size_t, S->n_held, c->n_held);
    SWAP(size_t, S->cap_held, c->cap_held);
    SWAP(size_t, S->n_leaf, c->n_leaf);
    SWAP(size_t, S->cap_leaf, c->cap_leaf);
    SWAP(size_t, S->n_ckin, c->n_ckin);
    SWAP(size_t, S->cap_ckin, c->cap_ckin);
    SWAP(size_t, S->n_ph, c->n_ph);
    SWAP(size_t, S->cap_ph, c->cap_ph);
    for (int k = 0; k < VP__PH_KINDS; k++)
        SWAP(uint32_t, S->n_ph_kind[k], c->n_ph_kind[k]);
    SWAP(int32_t, S->ph_until_min, c->ph_until_min);
    void *t = S->ckin;
    S->ckin = c->ckin;
    c->ckin = t;
    t = S->ph;
    S->ph = c->ph;
    c->ph = t;
}

static void ctx_free(mbctx *c)
{
    void *const arrays[] = {c->out_t,   c->saved,  c->out_eb, c->lay,
                            c->n_saved, c->reload, c->held,   c->leaf,
                            c->ckin,    c->ph};
    vp__free_each(arrays, sizeof arrays / sizeof arrays[0]);
}

static bool ctx_init(mbctx *c, size_t no)
{
    memset(c, 0, sizeof *c);
    c->out_t = malloc(no * sizeof *c->out_t);
    c->saved = malloc(no * MAX_SAVED * sizeof *c->saved);
    c->out_eb = calloc(no, 1);
    c->lay = calloc(no, 1);
    c->n_saved = calloc(no, 1);
    c->reload = calloc(no, sizeof *c->reload);
    c->loss_t = NONE;
    c->ph_until_min = INT32_MAX;
    c->out_keep = NONE;
    if (!c->out_t || !c->saved || !c->out_eb || !c->lay || !c->n_saved ||
        !c->reload)
        return false;
    for (size_t i = 0; i < no; i++)
        c->out_t[i] = NONE;
    return true;
}

/* The schedule's units: a micro-batch's pass through one model chunk,
 * numbered in forward order (k: micro-batch group k / (p v), chunk
 * (k mod p v) / p, micro-batch of the group k mod p; with one chunk the
 * micro-batches in order). */
typedef struct {
    sim *S;
    mbctx *ctx;
    uint32_t slots, loss, *refs_of;
    uint32_t stages, chunks;
    uint32_t *lo;       /* chunks + 1: the chunks' first ops, n_ops last */
    uint32_t *slot_of;  /* per unit: its context while in flight        */
    uint32_t *free_slot;
    uint32_t n_free;
    uint64_t fwd_peak, bwd_peak;
    /* torch's PipelineStage (vp_pipeline.torch; n_units entries each,
     * NONE where the stage has none): the receive and gradient-receive
     * buffers; out_op the op whose output the stage returns, last_out
     * the schedule's `output` */
    bool torch;
    uint32_t *recv, *grecv;
    uint32_t out_op, last_out;
} sched;

static uint32_t unit_chunk(const sched *q, uint64_t k)
{
    return (uint32_t)(k % ((uint64_t)q->stages * q->chunks) / q->stages);
}

/* The unit of the k-th backward: get_model_chunk_id(forward=False) runs
 * the chunks in reverse order within each group (schedules.py). */
static uint64_t bwd_unit(const sched *q, uint64_t k)
{
    uint64_t pv = (uint64_t)q->stages * q->chunks, r = k % pv;
    uint64_t ch = q->chunks - 1 - r / q->stages;
    return k - r + ch * q->stages + r % q->stages;
}

/* The ops of unit k's chunk, for the engine's passes. */
static void select_chunk(sched *q, uint64_t k)
{
    uint32_t c = unit_chunk(q, k);
    q->S->op_lo = q->lo[c];
    q->S->op_hi = q->lo[c + 1];
}

/* torch's forward_one_chunk of micro-batch k: its input the receive
 * buffer; the output gets fwd_cache's reference (one consumer more);
 * the previous forward's output, the schedule's `output`, is dropped
 * when the stage's output is made (forward_one_chunk returns). */
static void torch_fwd_begin(sched *q, uint64_t k)
{
    sim *S = q->S;
    S->recv_set = q->recv[k] != NONE;
    S->recv_in = q->recv[k];
    S->consumers[q->out_op]++;
    if (q->last_out != NONE) {
        vp__hold_until(S, q->last_out, q->out_op);
        vp__tunref(S, q->last_out);
        q->last_out = NONE;
    }
}

static void torch_fwd_end(sched *q, mbctx *c)
{
    sim *S = q->S;
    S->consumers[q->out_op]--;
    if (!OK(S))
        return;
    c->out_keep = S->out_t[q->out_op];
    vp__tref(S, c->out_keep);
    q->last_out = c->out_keep;
}

/* The forward of unit k (run()'s micro-batch, sim.c). */
static void mb_forward(sched *q, uint64_t k)
{
    sim *S = q->S;
    q->slot_of[k] = q->free_slot[--q->n_free];
    mbctx *c = &q->ctx[q->slot_of[k]];
    select_chunk(q, k);
    bool loss = q->loss != NONE && q->loss >= S->op_lo && q->loss < S->op_hi;
    swap_ctx(S, c);
    vp__sim_phase(S, VP_PHASE_FORWARD);
    if (q->torch)
        torch_fwd_begin(q, k);
    vp__sim_alloc_batch(S, c->batch, &c->nb);
    S->recv_set = false;
    vp__sim_forward(S);
    if (q->torch)
        torch_fwd_end(q, c);
    if (OK(S)) {
        vp__release_held(S);
        if (loss) {
            /* the schedule scales the loss by 1/m: a new scalar */
            uint32_t l2 = vp__talloc(S, 4, VP_CAT_TEMP);
            vp__tunref(S, S->out_t[q->loss]);
            S->out_t[q->loss] = NONE;
            c->loss_t = l2;
        }
        vp__clear_cast_cache(S);
    }
    if (S->phase_peak > q->fwd_peak)
        q->fwd_peak = S->phase_peak;
    swap_ctx(S, c);
}

/* The k-th backward, then its unit's inputs and graph dropped. */
static void mb_backward(sched *q, uint64_t k)
{
    sim *S = q->S;
    uint64_t u = bwd_unit(q, k);
    mbctx *c = &q->ctx[q->slot_of[u]];
    q->free_slot[q->n_free++] = q->slot_of[u];
    select_chunk(q, u);
    swap_ctx(S, c);
    vp__sim_phase(S, VP_PHASE_BACKWARD);
    if (q->loss != NONE && q->loss >= S->op_lo && q->loss < S->op_hi) {
        vp__sim_loss_backward(S, q->loss, q->refs_of);
    } else {
        /* recv_backward: the gradient of the chunk's output (torch: its
         * gradient-receive buffer) */
        uint32_t last = S->op_hi - 1;
        S->cur_op = "recv grad";
        if (q->torch) {
            vp__tref(S, q->grecv[u]);
            S->grad_t[last] = q->grecv[u];
        } else {
            S->grad_t[last] = vp__talloc(
                S, vp__mulc(S, S->g->ops[last].numel, S->out_eb[last]),
                VP_CAT_TEMP);
        }
        vp__sim_backward(S, q->refs_of);
    }
    if (S->phase_peak > q->bwd_peak)
        q->bwd_peak = S->phase_peak;
    vp__tunref(S, c->loss_t);
    c->loss_t = NONE;
    vp__tunref(S, c->out_keep); /* fwd_cache's entry popped */
    c->out_keep = NONE;
    vp__release_graph(S);
    for (size_t i = 0; i < c->nb; i++)
        vp__tunref(S, c->batch[i]);
    c->nb = 0;
    swap_ctx(S, c);
}

/* One step's schedule over n units, w of them warm-up forwards. */
static void schedule(sched *q, uint64_t n, uint64_t w)
{
    sim *S = q->S;
    for (uint64_t k = 0; k < w && OK(S); k++)
        mb_forward(q, k);
    for (uint64_t i = 0; i + w < n && OK(S); i++) {
        mb_forward(q, w + i);
        if (OK(S))
            mb_backward(q, i);
    }
    for (uint64_t i = n - w; i < n && OK(S); i++)
        mb_backward(q, i);
    S->op_lo = S->op_hi = 0;
}

/* The warm-up forwards of a rank: min(p - s - 1, m) under 1F1B; with v
 * chunks (p - s - 1) 2 + (v - 1) p, all the m v units when that is as
 * many (schedules.py, forward_backward_pipelining_with_interleaving,
 * microbatch_group_size_per_vp_stage = p). */
static uint64_t warmup(const vp_pipeline *p, uint32_t v, uint64_t m)
{
    uint64_t n = m * v, w;
    if (v <= 1)
        w = p->stages - p->stage - 1;
    else
        w = (uint64_t)(p->stages - p->stage - 1) * 2 +
            (uint64_t)(v - 1) * p->stages;
    return w < n ? w : n;
}

/* The chunks' first ops: op 0, then each hidden-states input after it
 * (graph_transformer.c builds each chunk from its own). */
static vp_status chunk_bounds(sim *S, uint32_t v, uint32_t *lo)
{
    const vp_graph *g = S->g;
    uint32_t n = 1;
    lo[0] = 0;
    for (uint32_t i = 1; i < g->n_ops; i++)
        if (g->ops[i].kind == VP_OP_INPUT &&
            g->ops[i].value == VP_VAL_FLOAT) {
            if (n == v)
                break;
            lo[n++] = i;
        }
    if (n != v)
        return vp_error_set(S->err, VP_EARG,
                            "the stage's graph has %u model chunks, not the "
                            "schedule's %u",
                            n, v);
    lo[v] = (uint32_t)g->n_ops;
    return VP_OK;
}

/* torch's stage at its first step (_initialize_stage): a receive
 * buffer per micro-batch of the stage input's shape on a stage after the
 * first, then a gradient-receive buffer per micro-batch of the output's
 * on a stage before the last, in the activations' dtype. */
static void torch_buffers(sched *q, uint64_t n)
{
    sim *S = q->S;
    const vp_graph *g = S->g;
    const vp_pipeline *p = S->s->pipe;
    uint64_t e = S->half ? 2 : 4, in = NONE;
    for (uint32_t i = 0; i < g->n_ops && in == NONE; i++)
        if (g->ops[i].kind == VP_OP_INPUT && g->ops[i].value == VP_VAL_FLOAT)
            in = i;
    S->cur_op = "pipeline buffers";
    for (uint64_t k = 0; k < n && p->stage > 0 && in != NONE && OK(S); k++)
        q->recv[k] = vp__talloc(S, vp__mulc(S, g->ops[in].numel, e),
                                VP_CAT_INPUT);
    uint64_t out = g->ops[g->n_ops - 1].numel;
    for (uint64_t k = 0; k < n && p->stage + 1 < p->stages && OK(S); k++)
        q->grecv[k] = vp__talloc(S, vp__mulc(S, out, e), VP_CAT_TEMP);
    S->cur_op = "";
}

/* The op whose output the stage returns: its last; the last stage's
 * the logits its loss is computed from. */
static uint32_t torch_out_op(const sched *q)
{
    const vp_graph *g = q->S->g;
    const vp_pipeline *p = q->S->s->pipe;
    if (p->stage + 1 < p->stages || q->loss == NONE ||
        g->ops[q->loss].n_inputs == 0)
        return (uint32_t)g->n_ops - 1;
    return g->ops[q->loss].inputs[0];
}

static vp_status check(sim *S)
{
    const vp_pipeline *p = S->s->pipe;
    if (!S->training)
        return vp_error_set(S->err, VP_EARG,
                            "a pipeline schedule is a training step's");
    if (p->stages < 1 || p->stage >= p->stages)
        return vp_error_set(S->err, VP_EARG,
                            "pipeline stage %u is not one of %u stages",
                            p->stage, p->stages);
    if (S->s->accum > VP_MAX_ACCUM_UNSTEADY)
        return vp_error_set(S->err, VP_ELIMIT,
                            "a pipeline stage is simulated micro-batch by "
                            "micro-batch: at most %u per step",
                            VP_MAX_ACCUM_UNSTEADY);
    if (S->g->n_ops == 0)
        return vp_error_set(S->err, VP_EARG, "the stage has no ops");
    if (p->torch && p->chunks > 1)
        return vp_error_set(S->err, VP_EUNSUPPORTED,
                            "torch's pipeline stage is simulated under "
                            "Schedule1F1B, one model chunk a rank");
    if (p->chunks > 1 && S->s->accum % p->stages)
        return vp_error_set(S->err, VP_EARG,
                            "the interleaved schedule runs the micro-batches "
                            "in groups of the %u stages: %llu is not a "
                            "multiple",
                            p->stages, (unsigned long long)S->s->accum);
    return VP_OK;
}

vp_status vp__pipe_run(sim *S)
{
    const vp_graph *g = S->g;
    const vp_pipeline *p = S->s->pipe;
    vp_status st = check(S);
    if (st != VP_OK)
        return st;
    uint64_t m = S->s->accum;
    uint32_t v = p->chunks > 1 ? p->chunks : 1;
    uint64_t n = m * v, w = warmup(p, v, m);
    sched q;
    memset(&q, 0, sizeof q);
    q.S = S;
    q.slots = (uint32_t)(w + 1 < n ? w + 1 : n);
    q.loss = NONE;
    q.stages = p->stages;
    q.chunks = v;
    for (uint32_t i = 0; i < g->n_ops; i++)
        if (vp__op_table[g->ops[i].kind].traits & VP__TRAIT_LOSS)
            q.loss = i;
    q.refs_of = calloc(g->n_ops, sizeof *q.refs_of);
    q.ctx = calloc(q.slots, sizeof *q.ctx);
    q.lo = calloc(v + 1, sizeof *q.lo);
    q.slot_of = calloc(n, sizeof *q.slot_of);
    q.free_slot = calloc(q.slots, sizeof *q.free_slot);
    q.torch = p->torch;
    q.last_out = NONE;
    q.recv = malloc(n * sizeof *q.recv);
    q.grecv = malloc(n * sizeof *q.grecv);
    bool ok = q.refs_of && q.ctx && q.lo && q.slot_of && q.free_slot &&
              q.recv && q.grecv;
    for (uint64_t k = 0; ok && k < n; k++)
        q.recv[k] = q.grecv[k] = NONE;
    if (ok)
        q.out_op = torch_out_op(&q);
    for (uint32_t k = 0; ok && k < q.slots; k++)
        ok = ctx_init(&q.ctx[k], g->n_ops);
    if (!ok)
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
    else
        S->st = chunk_bounds(S, v, q.lo);
    if (OK(S))
        vp__load_model(S);
    vp_estimate *out = S->out;
    for (uint32_t step = 1; step <= S->s->steps && OK(S); step++) {
        S->step = step;
        vp_phase_peaks *pk = &out->step[step - 1];
        memset(pk, 0, sizeof *pk);
        pk->start = vp__allocated(S) - out->baseline;
        q.fwd_peak = q.bwd_peak = 0;
        q.n_free = q.slots;
        for (uint32_t k = 0; k < q.slots; k++)
            q.free_slot[k] = q.slots - 1 - k;
        if (S->dist)
            vp__dist_step_begin(S);
        if (q.torch && step == 1)
            torch_buffers(&q, n);
        schedule(&q, n, w);
        vp__tunref(S, q.last_out); /* _step_microbatches returns */
        q.last_out = NONE;
        if (!OK(S))
            break;
        pk->peak[VP_PHASE_FORWARD] = q.fwd_peak - out->baseline;
        pk->peak[VP_PHASE_BACKWARD] = q.bwd_peak - out->baseline;
        pk->after_bwd = vp__allocated(S) - out->baseline;
        vp__sim_phase(S, VP_PHASE_OPTIMIZER);
        if (S->dist)
            vp__dist_opt_begin(S);
        vp__optimizer_step(S);
        if (S->cat_live[VP_CAT_OPTIM] > out->optim_bytes)
            out->optim_bytes = S->cat_live[VP_CAT_OPTIM];
        pk->peak[VP_PHASE_OPTIMIZER] = S->phase_peak - out->baseline;
        vp__sim_zero_grad(S);
        pk->end = vp__allocated(S) - out->baseline;
        vp_allocator_stats as;
        vp_allocator_stats_get(S->a, &as);
        pk->reserved = as.reserved;
        out->steps = step;
    }
    for (uint32_t k = 0; q.ctx && k < q.slots; k++) {
        ctx_free(&q.ctx[k]);
    }
    for (uint64_t k = 0; q.recv && q.grecv && k < n; k++) {
        vp__tunref(S, q.recv[k]);
        vp__tunref(S, q.grecv[k]);
    }
    void *const arrays[] = {q.ctx,       q.refs_of, q.lo,   q.slot_of,
                            q.free_slot, q.recv,    q.grecv};
    vp__free_each(arrays, sizeof arrays / sizeof arrays[0]);
    return S->st;
}
