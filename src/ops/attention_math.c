/* Op rules: SDPA's math kernel as PyTorch 2.11 runs it, and the additive
 * bias of T5's attention. Read from the allocator traces of T5 and mT5
 * (groundtruth/traces/t5-base-amp-bf16-b2-s256-t64, mt5-small-bf16-b2-
 * s256-t64-ckpt; docs/SIMULATION_NOTES.md §13) and PyTorch
 * aten/src/ATen/native/transformers/attention.cpp
 * (_scaled_dot_product_attention_math: q, k, v upcast to fp32, q and k
 * each times sqrt(scale), matmul, add_ of the mask, _safe_softmax,
 * dropout, matmul with v, .to(the input dtype) of the output and of the
 * probabilities it also returns); transformers integrations/
 * sdpa_attention.py (create_position_bias_mask, the output's
 * transpose(1, 2).contiguous()). */
#include "../sim_internal.h"

/* What the math kernel saves: the bmm operands (q's copy, k's copy or
 * k^T itself when k is contiguous, v's copy or v itself), the softmax
 * output, the dropout mask and output; and (slot MATH_COND, after the
 * others) the bool condition of the causal where() that made the mask. */
enum { MQ, MK, MV, MPROBS, MMASK, MDROPPED };
#define MATH_COND 8u

/* The float mask the kernel adds (o->inputs[3]): the bias itself, or for
 * a causal attention torch.where(causal, bias, min) (create_position_
 * bias_mask: two aranges, the bool condition, which the where keeps for
 * its backward when the bias needs a gradient, the min scalar, a new
 * mask); then autocast's cast to the compute dtype. *mask and *cast are
 * owned (cast NONE when no cast), *cond the condition to save. */
void vp__attention_bias_fwd(sim *S, vp__fwd_op *f, uint8_t ce, uint32_t *mask,
                            uint32_t *cast, uint32_t *cond)
{
    const vp_op *o = f->o;
    uint32_t bi = o->inputs[3];
    uint8_t be = S->out_eb[bi];
    uint64_t m = S->g->ops[bi].numel;
    *cond = *cast = NONE;
    if (o->causal) {
        uint32_t r1 = vp__talloc(S, vp__mulc(S, o->q_len, 8), VP_CAT_TEMP);
        uint32_t r2 = vp__talloc(S, vp__mulc(S, o->kv_len, 8), VP_CAT_TEMP);
        *cond = vp__talloc(S, vp__mulc(S, o->q_len, o->kv_len), VP_CAT_ACT);
        vp__tunref(S, r1);
        vp__tunref(S, r2);
        uint32_t z = vp__talloc(S, 4, VP_CAT_TEMP);
        *mask = vp__talloc(S, vp__mulc(S, m, be), VP_CAT_TEMP);
        vp__tunref(S, z);
        if (!f->sv || !S->g->ops[bi].needs_grad) {
            vp__tunref(S, *cond);
            *cond = NONE;
        }
    } else {
        *mask = S->out_t[bi];
        vp__tref(S, *mask);
    }
    if (S->amp && be != ce)
        *cast = vp__talloc(S, vp__mulc(S, m, ce), VP_CAT_TEMP);
}

void vp__attention_bias_save(sim *S, uint32_t op, uint32_t cond)
{
    if (cond != NONE)
        vp__save(S, op, MATH_COND, cond);
}

/* Batch x heads (bh); elements of q (aq), of k and v (ak), of the scores
 * (P), and the fp32
 * bytes of each (aq4, ak4, p4). */
typedef struct {
    uint64_t bh, aq, ak, P, aq4, ak4, p4;
} msizes;

static msizes sizes_of(sim *S, const vp_op *o)
{
    msizes z;
    uint64_t bh = vp__mulc(S, o->shape[0], o->heads);
    z.bh = bh;
    z.aq = vp__mulc(S, vp__mulc(S, bh, o->q_len), o->head_dim);
    z.ak = vp__mulc(S, vp__mulc(S, bh, o->kv_len), o->head_dim);
    z.P = vp__mulc(S, vp__mulc(S, bh, o->q_len), o->kv_len);
    z.aq4 = vp__mulc(S, z.aq, 4);
    z.ak4 = vp__mulc(S, z.ak, 4);
    z.p4 = vp__mulc(S, z.P, 4);
    return z;
}

/* _safe_softmax: the softmax, then the rows that are all -inf (a bool of
 * the scores, its all() per row, a zero scalar); the scores die. */
static uint32_t safe_softmax(sim *S, uint32_t scores, uint64_t p4,
                             uint64_t rows)
{
    uint32_t sm = vp__talloc(S, p4, VP_CAT_ACT);
    uint32_t eq = vp__talloc(S, p4 / 4, VP_CAT_TEMP);
    uint32_t r = vp__talloc(S, rows, VP_CAT_TEMP);
    uint32_t z = vp__talloc(S, 4, VP_CAT_TEMP);
    vp__tunref(S, z);
    vp__tunref(S, r);
    vp__tunref(S, eq);
    vp__tunref(S, scores);
    return sm;
}

/* The math kernel's forward on q, k, v (owned by the caller; k and v
 * contiguous when the cache copied them, else transposed views of their
 * projections, as q always is), the mask `mask` already added in place.
 * Under a half compute dtype q, k, v are upcast; the output (.to(input
 * dtype)) goes to HF's transpose(1, 2).contiguous() copy, f->out. */
void vp__attention_math_fwd(sim *S, vp__fwd_op *f, uint32_t q, uint32_t k,
                            uint32_t v, bool kv_contig, uint8_t ce)
{
    const vp_op *o = f->o;
    msizes z = sizes_of(S, o);
    uint64_t aq = z.aq, P = z.P, aq4 = z.aq4, ak4 = z.ak4;
    uint64_t p4 = z.p4;
    bool up = ce != 4;
    uint32_t cm = NONE;
    if (o->causal && o->n_inputs < 4) /* is_causal: a tril mask, as float */
        cm = vp__talloc(S, vp__mulc(S, vp__mulc(S, o->q_len, o->kv_len), 4),
                        VP_CAT_TEMP);
    uint32_t qa = up ? vp__talloc(S, aq4, VP_CAT_TEMP) : q;
    uint32_t ka = up ? vp__talloc(S, ak4, VP_CAT_TEMP) : k;
    uint32_t va = up ? vp__talloc(S, ak4, VP_CAT_ACT) : v;
    if (!up) {
        vp__tref(S, qa);
        vp__tref(S, ka);
        vp__tref(S, va);
    }
    uint32_t query = vp__talloc(S, aq4, VP_CAT_TEMP);
    uint32_t keyt = vp__talloc(S, ak4, VP_CAT_ACT);
    /* bmm wants its operands contiguous: q is a transposed view, and so
     * are k and v unless the cache copied them */
    uint32_t qc = vp__talloc(S, aq4, VP_CAT_ACT);
    uint32_t kc = kv_contig ? keyt : vp__talloc(S, ak4, VP_CAT_ACT);
    uint32_t scores = vp__talloc(S, p4, VP_CAT_TEMP);
    if (!kv_contig)
        vp__tunref(S, keyt);
    /* Nothing saved (a checkpointed forward: torch.utils.checkpoint's
     * saved-tensor hooks keep none): what only autograd would have kept
     * dies with its last C++ reference. matmul's contiguous operands are
     * temporaries of the call; `attn = at::dropout(attn, ...)` drops the
     * softmax output, and native_dropout's mask is a temporary of the
     * tuple (attention.cpp _scaled_dot_product_attention_math). */
    if (!f->sv) {
        vp__tunref(S, qc);
        vp__tunref(S, kc);
        qc = kc = NONE;
    }
    uint32_t sm = safe_softmax(S, scores, p4, vp__mulc(S, z.bh, o->q_len));
    uint32_t dm = NONE, dd = sm;
    if (o->dropout > 0) {
        dm = vp__talloc(S, P, VP_CAT_ACT);
        dd = vp__talloc(S, p4, VP_CAT_ACT);
        if (!f->sv) {
            vp__tunref(S, sm);
            vp__tunref(S, dm);
            sm = dm = NONE;
        }
    } else {
        vp__tref(S, sm);
    }
    /* return (matmul(attn, v).to(dtype), attn.to(dtype)): GCC evaluates
     * the tuple's arguments right to left */
    uint32_t x = up ? vp__talloc(S, vp__mulc(S, P, ce), VP_CAT_TEMP) : NONE;
    uint32_t vc = va;
    if (!kv_contig)
        vc = vp__talloc(S, ak4, VP_CAT_ACT);
    else
        vp__tref(S, vc);
    uint32_t bo = vp__talloc(S, aq4, VP_CAT_TEMP);
    if (!f->sv) { /* v's contiguous operand, a temporary of the matmul */
        vp__tunref(S, vc);
        vc = NONE;
    }
    uint32_t out = bo;
    if (up)
        out = vp__talloc(S, vp__mulc(S, aq, ce), VP_CAT_TEMP);
    if (f->sv) {
        if (o->segment >= 0 && S->sel[o->segment])
            S->recompute_slot = MPROBS;
        vp__save(S, f->i, MQ, qc);
        vp__save(S, f->i, MK, kc);
        vp__save(S, f->i, MV, vc);
        vp__save(S, f->i, MPROBS, sm);
        vp__save(S, f->i, MMASK, dm);
        vp__save(S, f->i, MDROPPED, dd);
        S->recompute_slot = -1;
    }
    uint32_t rel[] = {qc, kc, vc, sm, dm, dd, qa, ka, va, query};
    for (size_t r = 0; r < sizeof rel / sizeof rel[0]; r++)
        vp__tunref(S, rel[r]);
    if (up)
        vp__tunref(S, bo);
    vp__tunref(S, x);
    vp__tunref(S, cm);
    /* HF: attn_output.transpose(1, 2).contiguous() */
    f->out = vp__talloc(S, vp__mulc(S, f->n, ce), VP_CAT_ACT);
    vp__tunref(S, out);
}

/* A new owned tensor in place of *t (the previous one freed after). */
static void next(sim *S, uint32_t *t, uint64_t bytes)
{
    uint32_t n = vp__talloc(S, bytes, VP_CAT_TEMP);
    vp__tunref(S, *t);
    *t = n;
}

/* The math kernel's backward, node by node in the engine's order: the
 * output's ToCopy and its view's reshape copy; bmm(attn, v) (dv, dattn);
 * dropout; _safe_softmax (its where, then the softmax); the mask add_'s
 * gradient for a bias that needs one (summed over the batch in fp32, cast
 * to the mask's dtype, then autocast's ToCopy back); bmm(q, k^T); the two
 * scalings; the upcasts' ToCopy of q, k, v. The bias's gradient goes to
 * the bias op through the where's backward (causal). */
void vp__attention_math_bwd(sim *S, vp__bwd_op *b, uint8_t ce, uint32_t *dq,
                            uint32_t *dk, uint32_t *dv)
{
    const vp_op *o = b->o;
    uint32_t i = b->i;
    msizes z = sizes_of(S, o);
    uint64_t aq = z.aq, ak = z.ak, aq4 = z.aq4, ak4 = z.ak4, p4 = z.p4;
    bool up = ce != 4;
    uint32_t g = b->gy;
    b->gy = NONE;
    if (up)
        next(S, &g, aq4);
    next(S, &g, aq4); /* the strided grad reshaped for bmm */
    uint32_t gv = vp__talloc(S, ak4, VP_CAT_TEMP);
    uint32_t ga = vp__talloc(S, p4, VP_CAT_TEMP);
    vp__tunref(S, g);
    vp__drop_saved(S, i, MV);
    vp__drop_saved(S, i, MDROPPED);
    if (o->dropout > 0) {
        next(S, &ga, p4);
        vp__drop_saved(S, i, MMASK);
    }
    uint32_t w = vp__talloc(S, p4, VP_CAT_TEMP); /* the where */
    uint32_t gs = vp__talloc(S, p4, VP_CAT_TEMP);
    vp__tunref(S, w);
    vp__tunref(S, ga);
    vp__drop_saved(S, i, MPROBS);
    uint32_t gm = NONE;
    uint32_t bi = o->n_inputs >= 4 ? o->inputs[3] : NONE;
    bool bias_grad = bi != NONE && S->g->ops[bi].needs_grad;
    uint64_t m = bias_grad ? S->g->ops[bi].numel : 0;
    if (bias_grad) {
        gm = vp__talloc(S, vp__mulc(S, m, 4), VP_CAT_TEMP);
        if (up)
            next(S, &gm, vp__mulc(S, m, ce));
    }
    uint32_t gq = vp__talloc(S, aq4, VP_CAT_TEMP);
    uint32_t gk = vp__talloc(S, ak4, VP_CAT_TEMP);
    vp__tunref(S, gs);
    vp__drop_saved(S, i, MK);
    vp__drop_saved(S, i, MQ);
    next(S, &gq, aq4);
    next(S, &gk, ak4);
    if (up) {
        next(S, &gq, vp__mulc(S, aq, ce));
        next(S, &gk, vp__mulc(S, ak, ce));
        next(S, &gv, vp__mulc(S, ak, ce));
    }
    *dq = gq;
    *dk = gk;
    *dv = gv;
    if (!bias_grad)
        return;
    uint8_t be = S->out_eb[bi];
    if (S->amp && be != ce)
        next(S, &gm, vp__mulc(S, m, be)); /* autocast's ToCopy */
    if (o->causal) {
        /* WhereBackward: a zero scalar, the bias's share */
        uint32_t zero = vp__talloc(S, 4, VP_CAT_TEMP);
        uint32_t gb = vp__talloc(S, vp__mulc(S, m, be), VP_CAT_TEMP);
        vp__tunref(S, zero);
        vp__tunref(S, gm);
        gm = gb;
        vp__drop_saved(S, i, MATH_COND);
    }
    vp__give_grad(S, bi, gm, be);
}
