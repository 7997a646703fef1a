/* Op rules: the ends of the model. The embedding lookup, and the losses
 * (cross-entropy, with HF's causal-LM label shift and upcast, and MSE),
 * whose targets come with the batch. docs/SIMULATION_NOTES.md §3.1, §3.3,
 * §3.4, §3.6, §5.3;
 * PyTorch aten/src/ATen/native/cuda/Embedding.cu
 * (embedding_dense_backward), LossNLL.cu, SoftMax.cu; transformers
 * loss/loss_utils.py (ForCausalLMLoss). */
#include "../sim_internal.h"

/* What a loss saves: MSE its input; cross-entropy the log-probabilities
 * (with an fp32 copy when log_softmax kept 16 bits under autocast), the
 * shifted labels and nll_loss's total_weight. */
enum { LOSS_INPUT, LOSS_LOGP, LOSS_LOGP32, LOSS_LABELS, LOSS_WEIGHT };

/* embedding_dense_backward's sort of the indices: four int64 buffers of
 * the token count, and a per-segment fp32 buffer of tokens / 10 +
 * min(tokens, vocab) rows (NROWS_PER_THREAD = 10; SIMULATION_NOTES.md
 * §3.6). */
#define EMB_SORT_BUFFERS 4
#define EMB_SEGMENT_DIV 10u

uint64_t vp__loss_target_bytes(sim *S, const vp_op *o)
{
    return o->kind == VP_OP_CROSS_ENTROPY
               ? vp__mulc(S, o->rows, 8)
               : vp__mulc(S, S->g->ops[o->inputs[0]].numel, 4);
}

/* the rows of the weight, in the parameters' dtype */
void vp__embedding_fwd(sim *S, vp__fwd_op *f)
{
    const vp_param *w = &S->g->params[f->o->params[0]];
    f->oeb = (uint8_t)vp__param_bytes(S, w);
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    /* enable_input_require_grads(): the frozen embedding's output made to
     * require grad is a leaf, which the graph's AccumulateGrad keeps
     * until the loss is deleted */
    if (!w->trainable && f->o->needs_grad && S->training &&
        f->mode == MODE_SAVE)
        vp__hold_graph(S, f->out);
}

/* the index sort, the per-segment partial sums (fp32) and the dense
 * weight gradient */
void vp__embedding_bwd(sim *S, vp__bwd_op *b)
{
    const vp_graph *g = S->g;
    const vp_op *o = b->o;
    const vp_param *p = &g->params[o->params[0]];
    if (!p->trainable) {
        /* frozen: no EmbeddingBackward; the leaf output's .grad */
        vp__hold_graph(S, b->gy);
        return;
    }
    uint64_t dim = o->shape[o->ndim - 1];
    uint64_t tokens = g->ops[b->in0].numel;
    if (o->shape[0] == 1 && g->batch > 1)
        tokens = o->numel / dim;
    for (int k = 0; k < EMB_SORT_BUFFERS; k++)
        vp__transient(S, vp__mulc(S, tokens, 8));
    uint64_t seg = tokens / EMB_SEGMENT_DIV +
                   (tokens < o->classes ? tokens : o->classes);
    uint32_t buf = vp__talloc(S, vp__mulc(S, vp__mulc(S, seg, dim), 4),
                              VP_CAT_TEMP);
    /* RowwiseParallel's embedding (vp_param.tp_dim): DTensor's strategy
     * for embedding_dense_backward takes the all-Replicate one (the
     * output's gradient all-gathered, the indices replicated), so the
     * weight's gradient is a Replicate DTensor of the whole vocabulary
     * (torch/distributed/tensor/_ops/_embedding_ops.py; the FSDP2 + TP
     * trace: the whole gradient, then Shard._replicate_to_shard's clone
     * of the rank's rows when FSDP reads it, dist_fsdp2.c) */
    uint64_t n = vp__mulc(S, p->numel, vp__tp_whole(g, p));
    uint32_t dense = vp__talloc(S, vp__mulc(S, n, vp__param_bytes(S, p)),
                                VP_CAT_TEMP);
    vp__tunref(S, buf);
    vp__param_grad(S, o->params[0], dense);
}

/* The loss's outputs before its saves: the log-probabilities (CE) or the
 * input's cast (MSE). */
typedef struct {
    uint32_t up, lp, lp32, x;
} loss_parts;

static void loss_terms(sim *S, vp__fwd_op *f, loss_parts *lt)
{
    const vp_op *o = f->o;
    uint8_t eb0 = f->eb0;
    uint64_t rc = vp__mulc(S, o->rows, o->classes);
    if (o->kind == VP_OP_MSE_LOSS) {
        lt->x = vp__cast_input(S, f->in0, S->amp ? 4 : eb0);
    } else if (eb0 == 2 && !o->upcast_logits && S->amp) {
        /* log_softmax keeps bf16; nll_loss (fp32 list) copies */
        lt->lp = vp__talloc(S, vp__mulc(S, rc, 2), VP_CAT_ACT);
        lt->lp32 = vp__talloc(S, vp__mulc(S, rc, 4), VP_CAT_ACT);
    } else {
        uint8_t le = o->upcast_logits ? 4 : eb0;
        if (lt->up == NONE)
            lt->up = vp__cast_input(S, f->in0, le);
        lt->lp = o->flags & VP_OPF_LOSS_PARALLEL
                     ? vp__loss_parallel_logp(S, rc, le)
                     : vp__talloc(S, vp__mulc(S, rc, le), VP_CAT_ACT);
    }
}

/* Megatron's _VocabParallelCrossEntropy (megatron/core/tensor_parallel/
 * cross_entropy.py; VP_OPF_MEGATRON) on a rank's vocab/t logits:
 * calculate_logits_max makes the fp32 copy (logits.float()) and the row
 * max; calculate_predicted_logits subtracts the max and exponentiates in
 * place (exp_logits is that copy), with the target mask, the masked
 * target and the predicted logit per row; the per-token losses, summed
 * by the loss function. It saves exp_logits, the mask and the masked
 * target (int64). */
static void vocab_parallel_ce_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint64_t rows4 = vp__mulc(S, o->rows, 4);
    uint32_t el = vp__cast_input(S, f->in0, 4);
    uint32_t mx = vp__talloc(S, rows4, VP_CAT_TEMP);
    uint32_t mask = vp__talloc(S, o->rows, VP_CAT_ACT);
    uint32_t tgt = vp__talloc(S, vp__mulc(S, o->rows, 8), VP_CAT_ACT);
    uint32_t pred = vp__talloc(S, rows4, VP_CAT_TEMP);
    uint32_t sum = vp__talloc(S, rows4, VP_CAT_TEMP);
    uint32_t tok = vp__talloc(S, rows4, VP_CAT_TEMP);
    f->oeb = 4;
    f->out = vp__talloc(S, 4, VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, f->i, LOSS_LOGP, el);
        vp__save(S, f->i, LOSS_LABELS, tgt);
        vp__save(S, f->i, LOSS_WEIGHT, mask);
    }
    uint32_t drop[] = {tok, sum, pred, tgt, mask, mx, el};
    for (size_t k = 0; k < sizeof drop / sizeof drop[0]; k++)
        vp__tunref(S, drop[k]);
    f->refs++; /* the loss is held by the training loop */
}

void vp__loss_fwd(sim *S, vp__fwd_op *f)
{
    const vp_graph *g = S->g;
    const vp_op *o = f->o;
    uint32_t i = f->i;
    uint32_t lbl = NONE, pad = NONE;
    loss_parts lt = {NONE, NONE, NONE, NONE};
    if (o->flags & VP_OPF_MEGATRON) {
        vocab_parallel_ce_fwd(S, f);
        return;
    }
    /* HF ForCausalLMLoss: logits.float(); labels padded with -100
     * (B x (S+1) int64) and shifted (.contiguous()); both locals live
     * until the loss function returns, after nll_loss */
    if (o->kind == VP_OP_CROSS_ENTROPY && o->upcast_logits)
        lt.up = vp__cast_input(S, f->in0, 4);
    if (o->flags & VP_OPF_SHIFT_LABELS) {
        uint64_t bsz = g->batch && o->rows % g->batch == 0 ? g->batch : 1;
        pad = vp__talloc(S, vp__mulc(S, o->rows + bsz, 8), VP_CAT_TEMP);
        lbl = vp__talloc(S, vp__mulc(S, o->rows, 8), VP_CAT_ACT);
    }
    loss_terms(S, f, &lt);
    if (f->sv)
        vp__save(S, i, LOSS_INPUT, lt.x);
    vp__tunref(S, lt.x);
    f->oeb = 4;
    f->out = vp__talloc(S, 4, VP_CAT_ACT);
    uint32_t tw = vp__talloc(S, 4, VP_CAT_ACT);
    vp__tunref(S, lt.up);
    vp__tunref(S, pad);
    if (f->sv) {
        vp__save(S, i, LOSS_LOGP, lt.lp);
        vp__save(S, i, LOSS_LOGP32, lt.lp32);
        vp__save(S, i, LOSS_LABELS, lbl);
        vp__save(S, i, LOSS_WEIGHT, tw);
    }
    vp__tunref(S, lt.lp);
    vp__tunref(S, lt.lp32);
    vp__tunref(S, lbl);
    vp__tunref(S, tw);
    f->refs++; /* the loss is held by the training loop */
}

void vp__loss_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    uint8_t eb0 = b->eb0;
    uint64_t rc = vp__mulc(S, o->rows, o->classes);
    if (o->kind == VP_OP_MSE_LOSS) {
        if (b->ig0)
            b->gx = vp__grad_like(S, b->in0, eb0);
        return;
    }
    if (o->flags & VP_OPF_MEGATRON) {
        /* the gradient is made in place in exp_logits (fp32), then
         * .float()'s backward casts it to the logits' dtype */
        b->gx = vp__grad_like(S, b->in0, eb0);
        b->gxe = eb0;
        vp__release_saved(S, b->i);
        return;
    }
    if (eb0 == 2 && !o->upcast_logits && S->amp) {
        uint32_t gn = vp__talloc(S, vp__mulc(S, rc, 4), VP_CAT_TEMP);
        /* NllLossBackward drops the fp32 log-probs before
         * ToCopyBackward runs */
        vp__drop_saved(S, b->i, LOSS_LOGP32);
        uint32_t c16 = vp__talloc(S, vp__mulc(S, rc, 2), VP_CAT_TEMP);
        vp__tunref(S, gn);
        b->gx = vp__talloc(S, vp__mulc(S, rc, 2), VP_CAT_TEMP);
        vp__tunref(S, c16);
        b->gxe = 2;
    } else if (o->flags & VP_OPF_LOSS_PARALLEL) {
        b->gxe = o->upcast_logits ? 4 : eb0;
        b->gx = vp__loss_parallel_grad(S, b->i, rc, b->gxe);
    } else {
        uint8_t le = o->upcast_logits ? 4 : eb0;
        uint32_t gn = vp__talloc(S, vp__mulc(S, rc, le), VP_CAT_TEMP);
        uint32_t gl = vp__talloc(S, vp__mulc(S, rc, le), VP_CAT_TEMP);
        vp__tunref(S, gn);
        vp__release_saved(S, b->i);
        b->gx = gl;
        b->gxe = le;
    }
}
