/* Op rules of the encoder-decoder models (HF T5 and mT5, transformers 5.x
 * modeling_t5.py / modeling_mt5.py): T5LayerNorm, the relative position
 * bias (T5Attention.compute_bias and _relative_position_bucket), the MLP's
 * cast to wo's dtype (T5DenseActDense.forward) and the scaling of the
 * decoder's output (T5ForConditionalGeneration.forward). Read from the
 * allocator traces groundtruth/traces/t5-base-amp-bf16-b2-s256-t64 and
 * mt5-small-bf16-b2-s256-t64-ckpt (docs/SIMULATION_NOTES.md §13). */
#include "../sim_internal.h"

/* What T5LayerNorm's graph keeps: the fp32 input (pow's), the input
 * itself (the multiply's), the rsqrt per row and the normalised states
 * the weight multiplies. */
enum { T5N_XF, T5N_X, T5N_RSTD, T5N_H };
/* What compute_bias keeps: the buckets (the embedding's indices). */
enum { PB_BUCKETS };

/* variance = x.to(fp32).pow(2).mean(-1); h = x * rsqrt(variance + eps);
 * h.to(weight dtype) when the weight is half; weight * h. */
void vp__t5norm_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint64_t n = f->n, r4 = vp__mulc(S, o->rows, 4);
    uint8_t e0 = f->eb0;
    uint32_t xf = vp__cast_input(S, f->in0, 4);
    uint32_t p = vp__talloc(S, vp__mulc(S, n, 4), VP_CAT_TEMP);
    if (!f->sv && xf != S->out_t[f->in0]) { /* unsaved: dies after pow */
        vp__tunref(S, xf);
        xf = NONE;
    }
    uint32_t var = vp__talloc(S, r4, VP_CAT_TEMP);
    vp__tunref(S, p);
    uint32_t ve = vp__talloc(S, r4, VP_CAT_TEMP);
    uint32_t r = vp__talloc(S, r4, VP_CAT_ACT);
    vp__tunref(S, ve);
    uint32_t h = vp__talloc(S, vp__mulc(S, n, 4), VP_CAT_ACT);
    uint8_t he = 4;
    if (S->PE != 4) {
        uint32_t h2 = vp__talloc(S, vp__mulc(S, n, S->PE), VP_CAT_ACT);
        vp__tunref(S, h);
        h = h2;
        he = S->PE;
    }
    f->oeb = vp__promote(S->PE, he);
    f->out = vp__talloc(S, vp__mulc(S, n, f->oeb), VP_CAT_ACT);
    vp__tunref(S, var);
    if (f->sv) {
        vp__save(S, f->i, T5N_XF, xf);
        if (e0 != 4)
            vp__save(S, f->i, T5N_X, S->out_t[f->in0]);
        vp__save(S, f->i, T5N_RSTD, r);
        vp__save(S, f->i, T5N_H, h);
    }
    vp__tunref(S, h);
    vp__tunref(S, r);
    vp__tunref(S, xf);
}

/* weight * h (h's grad, the weight's, summed over the rows); x * rsqrt
 * (x's share, rsqrt's summed per row); rsqrt's and mean's small kernels;
 * mean's expand; pow's two kernels; x's grad in its dtype. */
void vp__t5norm_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    uint64_t n4 = vp__mulc(S, b->n, 4), r4 = vp__mulc(S, o->rows, 4);
    uint8_t he = S->PE;
    uint32_t gh = vp__talloc(S, vp__mulc(S, b->n, he), VP_CAT_TEMP);
    if (S->g->params[o->params[0]].trainable)
        vp__norm_weight_sum(S, b, he); /* grad * h summed to the weight */
    else
        vp__transient(S, vp__mulc(S, b->n, he));
    vp__tunref(S, b->gy);
    b->gy = NONE;
    vp__drop_saved(S, b->i, T5N_H);
    uint32_t gx = vp__talloc(S, n4, VP_CAT_TEMP);
    uint32_t t = vp__talloc(S, n4, VP_CAT_TEMP);
    vp__transient(S, r4);
    vp__tunref(S, t);
    vp__tunref(S, gh);
    for (int k = 0; k < 3; k++)
        vp__transient(S, r4);
    vp__drop_saved(S, b->i, T5N_RSTD);
    uint32_t gm = vp__talloc(S, n4, VP_CAT_TEMP);
    uint32_t p1 = vp__talloc(S, n4, VP_CAT_TEMP);
    uint32_t p2 = vp__talloc(S, n4, VP_CAT_TEMP);
    vp__tunref(S, p1);
    vp__tunref(S, gm);
    vp__tunref(S, p2); /* summed into x's grad */
    if (b->ig0 && b->eb0 != 4) {
        uint32_t c = vp__talloc(S, vp__mulc(S, b->n, b->eb0), VP_CAT_TEMP);
        vp__tunref(S, gx);
        gx = c;
    }
    if (b->ig0) {
        b->gx = gx;
        b->gxe = b->eb0;
    } else {
        vp__tunref(S, gx);
    }
}

/* compute_bias: the query and key positions (int64), their differences
 * [q, k], _relative_position_bucket's int64, bool and fp32 temporaries
 * (at most three of [q, k] at a time besides the differences), the
 * buckets (kept as the embedding's indices), relative_attention_bias's
 * rows [q, k, heads] in the weight's dtype, returned permuted to [1,
 * heads, q, k]. Without a table (the decoder's cross-attention): zeros
 * [1, heads, q, k] in the compute dtype. */
void vp__position_bias_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint64_t qk = vp__mulc(S, o->q_len, o->kv_len);
    if (!o->n_params) {
        f->oeb = S->amp || S->half ? 2 : 4;
        f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
        return;
    }
    uint32_t cp = vp__talloc(S, vp__mulc(S, o->q_len, 8), VP_CAT_TEMP);
    uint32_t mp = vp__talloc(S, vp__mulc(S, o->kv_len, 8), VP_CAT_TEMP);
    uint32_t rp = vp__talloc(S, vp__mulc(S, qk, 8), VP_CAT_TEMP);
    uint32_t bk = vp__talloc(S, vp__mulc(S, qk, 8), VP_CAT_ACT);
    uint32_t t1 = vp__talloc(S, vp__mulc(S, qk, 8), VP_CAT_TEMP);
    uint32_t t2 = vp__talloc(S, vp__mulc(S, qk, 4), VP_CAT_TEMP);
    vp__tunref(S, t2);
    vp__tunref(S, t1);
    f->oeb = S->PE;
    f->ol = 1;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    vp__tunref(S, cp);
    vp__tunref(S, mp);
    vp__tunref(S, rp);
    if (f->sv)
        vp__save(S, f->i, PB_BUCKETS, bk);
    vp__tunref(S, bk);
}

/* The permuted gradient made contiguous for embedding_dense_backward,
 * its sort of the [q, k] indices, the table's dense gradient. */
void vp__position_bias_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    if (!o->n_params)
        return;
    uint64_t qk = vp__mulc(S, o->q_len, o->kv_len);
    uint32_t c = vp__talloc(S, vp__mulc(S, b->n, b->oeb), VP_CAT_TEMP);
    vp__tunref(S, b->gy);
    b->gy = NONE;
    for (int k = 0; k < 3; k++)
        vp__transient(S, vp__mulc(S, qk, 8));
    vp__weight_grad(S, o->params[0], false);
    vp__tunref(S, c);
}

/* hidden_states.to(self.wo.weight.dtype): a copy when the dtypes differ
 * (fp32 weights under autocast) */
void vp__cast_fwd(sim *S, vp__fwd_op *f)
{
    f->oeb = S->PE;
    f->out = vp__cast_input(S, f->in0, f->oeb);
}

/* ToCopyBackward: the gradient passes; the engine converts it to the
 * input's dtype */
void vp__cast_bwd(sim *S, vp__bwd_op *b)
{
    if (!b->ig0)
        return;
    vp__tref(S, b->gy);
    b->gx = b->gy;
    b->gxe = b->oeb;
    b->gxs = b->gstr;
}

