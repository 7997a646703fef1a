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
 * Each micro-batch in flight has its own per-op state (outputs, saved
 * slots, checkpointed inputs, Python holds, autograd leaves, batch): the
 * engine's arrays are swapped for the micro-batch's while it runs. */
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
    uint32_t batch[VP__MAX_BATCH];
    size_t nb;
    uint32_t loss_t;
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
    if (!c->out_t || !c->saved || !c->out_eb || !c->lay || !c->n_saved ||
        !c->reload)
        return false;
    for (size_t i = 0; i < no; i++)
        c->out_t[i] = NONE;
    return true;
}

typedef struct {
    sim *S;
    mbctx *ctx;
    uint32_t slots, loss, *refs_of;
    uint64_t fwd_peak, bwd_peak;
} sched;

/* The forward of micro-batch k (run()'s micro-batch, sim.c). */
static void mb_forward(sched *q, uint64_t k)
{
    sim *S = q->S;
    mbctx *c = &q->ctx[k % q->slots];
    swap_ctx(S, c);
    vp__sim_phase(S, VP_PHASE_FORWARD);
    vp__sim_alloc_batch(S, c->batch, &c->nb);
    vp__sim_forward(S);
    if (OK(S)) {
        vp__release_held(S);
        if (q->loss != NONE) {
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

/* The backward of micro-batch k, then its inputs and graph dropped. */
static void mb_backward(sched *q, uint64_t k)
{
    sim *S = q->S;
    const vp_graph *g = S->g;
    mbctx *c = &q->ctx[k % q->slots];
    swap_ctx(S, c);
    vp__sim_phase(S, VP_PHASE_BACKWARD);
    if (q->loss != NONE) {
        vp__sim_loss_backward(S, q->loss, q->refs_of);
    } else {
        /* recv_backward: the gradient of the stage's output */
        uint32_t last = (uint32_t)g->n_ops - 1;
        S->cur_op = "recv grad";
        S->grad_t[last] = vp__talloc(
            S, vp__mulc(S, g->ops[last].numel, S->out_eb[last]), VP_CAT_TEMP);
        vp__sim_backward(S, q->refs_of);
    }
    if (S->phase_peak > q->bwd_peak)
        q->bwd_peak = S->phase_peak;
    vp__tunref(S, c->loss_t);
    c->loss_t = NONE;
    vp__release_graph(S);
    for (size_t i = 0; i < c->nb; i++)
        vp__tunref(S, c->batch[i]);
    c->nb = 0;
    swap_ctx(S, c);
}

/* One step's 1F1B schedule. */
static void schedule(sched *q, uint64_t m, uint64_t w)
{
    sim *S = q->S;
    for (uint64_t k = 0; k < w && OK(S); k++)
        mb_forward(q, k);
    for (uint64_t i = 0; i + w < m && OK(S); i++) {
        mb_forward(q, w + i);
        if (OK(S))
            mb_backward(q, i);
    }
    for (uint64_t i = m - w; i < m && OK(S); i++)
        mb_backward(q, i);
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
    uint64_t w = p->stages - p->stage - 1;
    if (w > m)
        w = m;
    sched q = {S, NULL, (uint32_t)(w + 1), NONE, NULL, 0, 0};
    for (uint32_t i = 0; i < g->n_ops; i++)
        if (vp__op_table[g->ops[i].kind].traits & VP__TRAIT_LOSS)
            q.loss = i;
    q.refs_of = calloc(g->n_ops, sizeof *q.refs_of);
    q.ctx = calloc(q.slots, sizeof *q.ctx);
    bool ok = q.refs_of && q.ctx;
    for (uint32_t k = 0; ok && k < q.slots; k++)
        ok = ctx_init(&q.ctx[k], g->n_ops);
    if (!ok)
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
    if (OK(S))
        vp__load_model(S);
    vp_estimate *out = S->out;
    for (uint32_t step = 1; step <= S->s->steps && OK(S); step++) {
        S->step = step;
        vp_phase_peaks *pk = &out->step[step - 1];
        memset(pk, 0, sizeof *pk);
        pk->start = vp__allocated(S) - out->baseline;
        q.fwd_peak = q.bwd_peak = 0;
        if (S->dist)
            vp__dist_step_begin(S);
        schedule(&q, m, w);
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
    free(q.ctx);
    free(q.refs_of);
    return S->st;
}
