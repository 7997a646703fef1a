/* Op rules: normalisations. layer_norm and group_norm (ATen kernels,
 * fp32 under autocast), HF LlamaRMSNorm written in Python, and
 * batch_norm (cuDNN). docs/SIMULATION_NOTES.md §3.2, §7; PyTorch
 * aten/src/ATen/native/cuda/layer_norm_kernel.cu,
 * group_norm_kernel.cu, cudnn/BatchNorm.cpp; transformers
 * modeling_llama.py (LlamaRMSNorm). */
#include "../sim_internal.h"

/* What layer_norm, group_norm and batch_norm save: the input, the mean
 * and the reciprocal standard deviation (per row, fp32). */
enum { NORM_X, NORM_MEAN, NORM_RSTD };
/* What LlamaRMSNorm's autograd graph keeps: x.float(), the rsqrt per row,
 * and the normalised h cast back (the weight multiply's operand);
 * GemmaRMSNorm's h stays fp32 and 1 + w is kept too. */
enum { RMS_XF, RMS_RSTD, RMS_H, RMS_W1 };

void vp__layernorm_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint32_t i = f->i, in0 = f->in0;
    uint8_t ce = S->amp ? 4 : f->eb0;
    uint32_t x = vp__cast_input(S, in0, ce);
    /* layer_norm_cuda: X.expect_contiguous(), a copy of a strided input
     * for the kernel; autograd saves the input itself */
    uint32_t xc = o->kind == VP_OP_LAYERNORM && S->lay[in0]
                      ? vp__talloc(S, vp__mulc(S, f->n, ce), VP_CAT_TEMP)
                      : NONE;
    f->oeb = ce;
    f->ol = 0;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    uint32_t m = vp__talloc(S, vp__mulc(S, o->rows, 4), VP_CAT_ACT);
    uint32_t r = vp__talloc(S, vp__mulc(S, o->rows, 4), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, i, NORM_X, x);
        vp__save(S, i, NORM_MEAN, m);
        vp__save(S, i, NORM_RSTD, r);
    }
    vp__tunref(S, m);
    vp__tunref(S, r);
    vp__tunref(S, xc);
    vp__tunref(S, x);
}

/* HF GemmaRMSNorm (Gemma 1-3; traced): x.float(), pow, mean, + eps,
 * rsqrt (saved), x * rsqrt (saved for a trained weight), 1 +
 * weight.float() (saved), the product in fp32, .type_as(x).
 * modeling_gemma.py GemmaRMSNorm.forward computes
 * `output * (1.0 + self.weight.float())`: MulBackward0 keeps `self`
 * (the normalised x) only for the gradient of `other`
 * (tools/autograd/derivatives.yaml, mul.Tensor; autograd's codegen saves
 * an input only when an output that reads it is needed), so a frozen
 * weight (LoRA's base, --freeze) leaves it, and it goes when _norm's
 * result is dropped, before the cast back (ho5 gemma-2b LoRA trace). */
static void gemma_rmsnorm_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint64_t n = f->n;
    bool keep_h = f->sv && o->n_params > 0 &&
                  S->g->params[o->params[0]].trainable;
    uint32_t xf = vp__cast_input(S, f->in0, 4);
    vp__transient(S, vp__mulc(S, n, 4)); /* pow(2) */
    uint32_t r = vp__talloc(S, vp__mulc(S, o->rows, 4), VP_CAT_ACT);
    uint32_t h = vp__talloc(S, vp__mulc(S, n, 4), VP_CAT_ACT);
    uint32_t w1 = vp__talloc(S, vp__mulc(S, n / o->rows, 4), VP_CAT_ACT);
    f->out = vp__talloc(S, vp__mulc(S, n, 4), VP_CAT_ACT);
    f->oeb = 4;
    if (!keep_h) {
        vp__tunref(S, h);
        h = NONE;
    }
    if (f->eb0 != 4) {
        uint32_t c = vp__talloc(S, vp__mulc(S, n, f->eb0), VP_CAT_ACT);
        vp__tunref(S, f->out);
        f->out = c;
        f->oeb = f->eb0;
    }
    if (f->sv) {
        vp__save(S, f->i, RMS_XF, xf);
        vp__save(S, f->i, RMS_RSTD, r);
        if (keep_h)
            vp__save(S, f->i, RMS_H, h);
        vp__save(S, f->i, RMS_W1, w1);
    }
    vp__tunref(S, w1);
    vp__tunref(S, h);
    vp__tunref(S, r);
    vp__tunref(S, xf);
}

/* Megatron's fused RMSNorm (Transformer Engine's rmsnorm_fwd, in
 * TELayerNormColumnParallelLinear or TENorm; VP_OPF_MEGATRON): the output
 * in the input's dtype and the fp32 rsigma per row; it saves the input
 * and rsigma (the following linear saves the output). */
static void fused_rmsnorm_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint32_t x = vp__cast_input(S, f->in0, f->eb0);
    f->oeb = f->eb0;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    uint32_t r = vp__talloc(S, vp__mulc(S, o->rows, 4), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, f->i, RMS_XF, x);
        vp__save(S, f->i, RMS_RSTD, r);
    }
    vp__tunref(S, r);
    vp__tunref(S, x);
}

/* HF LlamaRMSNorm: x.float(), pow, mean, rsqrt, mul, .to(dtype),
 * weight * h */
void vp__rmsnorm_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    if (o->flags & VP_OPF_T5_NORM) { /* T5LayerNorm: ops/encdec.c */
        vp__t5norm_fwd(S, f);
        return;
    }
    uint32_t i = f->i;
    uint8_t eb0 = f->eb0;
    uint64_t n = f->n;
    if (o->flags & VP_OPF_NORM_OFFSET) {
        gemma_rmsnorm_fwd(S, f);
        return;
    }
    if (o->flags & VP_OPF_MEGATRON) {
        fused_rmsnorm_fwd(S, f);
        return;
    }
    uint32_t xf = vp__cast_input(S, f->in0, 4);
    vp__transient(S, vp__mulc(S, n, 4)); /* pow(2) */
    uint32_t r = vp__talloc(S, vp__mulc(S, o->rows, 4), VP_CAT_ACT);
    uint32_t h = vp__talloc(S, vp__mulc(S, n, 4), VP_CAT_ACT);
    /* h is the local `hidden_states` until forward returns, after the
     * weight multiply's output; x.float() goes when the local is rebound
     * to h unless saved. Without a graph the two orders hold the same
     * bytes (x.float() or h), so h goes at once there. */
    uint32_t h2 = h;
    if (eb0 != 4) {
        h2 = vp__talloc(S, vp__mulc(S, n, eb0), VP_CAT_ACT);
        if (!f->sv)
            vp__tunref(S, h);
    }
    f->oeb = vp__promote((uint8_t)vp__param_bytes(S, &S->g->params[o->params[0]]),
                         eb0);
    f->out = vp__talloc(S, vp__mulc(S, n, f->oeb), VP_CAT_ACT);
    if (h2 != h && f->sv)
        vp__tunref(S, h);
    if (f->sv) {
        vp__save(S, i, RMS_XF, xf);
        vp__save(S, i, RMS_RSTD, r);
        /* weight * h keeps h for the weight's gradient only: a frozen
         * weight leaves it (tools/autograd/derivatives.yaml, mul) */
        if (S->g->params[o->params[0]].trainable)
            vp__save(S, i, RMS_H, h2);
    }
    vp__tunref(S, h2);
    vp__tunref(S, r);
    vp__tunref(S, xf);
}

/* HF's RMSNorm in Python (LlamaRMSNorm, and GemmaRMSNorm's 1 + weight;
 * modeling_llama.py LlamaRMSNorm.forward): to(fp32), pow, mean, + eps,
 * rsqrt, mul, to(dtype), weight * h. The forward's rules fold mean, + eps
 * and rsqrt into one rows-sized allocation: 2 launches more; Gemma's
 * weight.float() of a half weight one more. Its backward, autograd's nodes
 * (tools/autograd/derivatives.yaml; torch/csrc/autograd/
 * FunctionsManual.cpp): MulBackward0 of weight * h (grad * w; for a
 * trained weight grad * h and its sum to the weight's shape),
 * ToCopyBackward0 of the cast back (half), MulBackward0 of x * rsqrt
 * (grad * r; grad * x and its sum over the row), RsqrtBackward0 (-0.5 *
 * grad * result.pow(3): 3), AddBackward0 of + eps (none), MeanBackward1
 * (expand, / n: 1), PowBackward0 (grad * 2 * x.pow(1): 3), the sum of x's
 * two gradients (1), ToCopyBackward0 of x.float() (half): 12 + 2 (trained
 * weight) + 2 (half) kernels, of which the rules allocate the two fp32
 * temporaries, x's gradient, the weight's (trained) and Gemma's fp32
 * gradient (half). T5's and Megatron's norms are their rules. */
double vp__rmsnorm_launches(const vp_graph *g, const vp_op *o, int ph,
                            bool wide)
{
    if (!(o->flags & VP_OPF_PY_RMSNORM) || (o->flags & VP_OPF_T5_NORM) ||
        (o->flags & VP_OPF_MEGATRON))
        return 0;
    bool gemma = o->flags & VP_OPF_NORM_OFFSET;
    bool train = o->n_params > 0 && g->params[o->params[0]].trainable;
    if (ph == 0)
        return 2.0 + (gemma && !wide ? 1.0 : 0.0);
    double k = 12.0 + (train ? 2.0 : 0.0) + (wide ? 0.0 : 2.0) +
               (gemma && train && !wide ? 1.0 : 0.0);
    double made = 3.0 + (train ? 1.0 : 0.0) + (gemma && !wide ? 1.0 : 0.0);
    return k - made;
}

/* layernorm, groupnorm and rmsnorm (whose Python graph first makes two
 * fp32 temporaries of the input's size). */
void vp__norm_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    if (o->flags & VP_OPF_T5_NORM) {
        vp__t5norm_bwd(S, b);
        return;
    }
    uint64_t n = b->n;
    uint8_t ce = S->amp ? 4 : b->eb0;
    bool ln = o->kind == VP_OP_LAYERNORM;
    if (o->kind == VP_OP_RMSNORM && !(o->flags & VP_OPF_MEGATRON)) {
        /* GemmaRMSNorm: type_as's backward casts the grad to fp32 */
        uint32_t g32 = (o->flags & VP_OPF_NORM_OFFSET) && b->oeb != 4
                           ? vp__talloc(S, vp__mulc(S, n, 4), VP_CAT_TEMP)
                           : NONE;
        vp__transient(S, vp__mulc(S, n, 4));
        vp__transient(S, vp__mulc(S, n, 4));
        vp__tunref(S, g32);
    }
    /* layer_norm_backward_cuda: X.expect_contiguous() first, then dX,
     * dgamma, dbeta; the kernel copies a strided dY */
    uint32_t xc = ln && S->lay[b->in0]
                      ? vp__talloc(S, vp__mulc(S, n, ce), VP_CAT_TEMP)
                      : NONE;
    if (b->ig0) {
        b->gx = vp__grad_like(S, b->in0, ce);
        b->gxe = ce;
    }
    for (uint32_t k = 0; k < o->n_params; k++)
        vp__weight_grad(S, o->params[k], false);
    if (ln && b->gstr && b->gy != NONE)
        vp__transient(S, vp__mulc(S, n, b->oeb));
    vp__tunref(S, xc);
}

/* cudnn_batch_norm: the output in the input's dtype; the per-channel
 * mean and inverse variance are saved with the input. */
void vp__batchnorm_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint32_t i = f->i;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
    uint32_t m = vp__talloc(S, vp__mulc(S, o->rows, 4), VP_CAT_ACT);
    uint32_t r = vp__talloc(S, vp__mulc(S, o->rows, 4), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, i, NORM_X, S->out_t[f->in0]);
        vp__save(S, i, NORM_MEAN, m);
        vp__save(S, i, NORM_RSTD, r);
    }
    vp__tunref(S, m);
    vp__tunref(S, r);
}

void vp__batchnorm_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    if (b->ig0)
        b->gx = vp__grad_like(S, b->in0, b->eb0);
    vp__weight_grad(S, o->params[0], false);
    vp__weight_grad(S, o->params[1], false);
}
