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
 * temporaries, x's gradient, the weight's and its unreduced product
 * grad * h (trained) and Gemma's fp32 gradient (half); the sum's staging
 * is the reduce kernel's scratch (a workspace: no kernel of its own).
 * T5's and Megatron's norms are their rules. */
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
    double made = 3.0 + (train ? 2.0 : 0.0) + (gemma && !wide ? 1.0 : 0.0);
    return k - made;
}

/* floor(log2(n)) as a power of two (Reduce.cuh last_pow2), n >= 1 */
static uint64_t last_pow2(uint64_t n)
{
    uint64_t p = 1;
    while (p <= n / 2)
        p *= 2;
    return p;
}

#define REDUCE_MAX_THREADS 512u  /* ReduceConfig's mnt() for a float sum */
#define REDUCE_OUT_VEC 4u        /* output_vec_size of a contiguous row  */
#define REDUCE_WARP 32u
#define REDUCE_MIN_VPT 16u       /* min_values_per_thread                */
#define REDUCE_MAX_VPT 256u      /* max_values_per_thread                */
#define REDUCE_THREADS_PER_SM 2048u /* maxThreadsPerMultiProcessor, sm_80+ */

/* The global-memory staging of a sum over the leading dims of a
 * contiguous [rows, out] tensor to [out] (sum_to_size of a broadcast
 * weight's gradient), as aten/src/ATen/native/cuda/Reduce.cuh
 * setReduceConfig sizes it for a reduction over a non-fastest-striding
 * dim: outputs vectorised by 4 across a warp's lanes (block_width =
 * min(pow2(out/4), 32)), the rows across block_height = min(pow2(rows),
 * 128 / block_width) warps when that leaves each thread >= min(16
 * block_height, 256) values; then, when each thread still has >= 256
 * values and the grid (out / 4 / block_width blocks) fits in one wave
 * (SMs x 2048 / threads blocks), ctas_per_output = max(min(ceil(wave /
 * grid), ceil(vpt / 16)), ceil(vpt / 256)) blocks per output column,
 * and gpu_reduce_kernel allocates global_memory_size() = 4 B (the fp32
 * accumulator) x out x ctas x block_width x 4, and semaphore_size() = 4
 * B x grid. Returns the buffer's bytes (0: the sum stays in one block)
 * and the semaphores' in *sem. SIMULATION_NOTES.md section 8.1a. */
static uint64_t rows_sum_staging(sim *S, uint64_t rows, uint64_t out,
                                 uint64_t *sem)
{
    *sem = 0;
    uint64_t vec = REDUCE_OUT_VEC;
    while (vec > 1 && out % vec)
        vec /= 2;
    uint64_t lim = REDUCE_MAX_THREADS / vec, cols = out / vec;
    if (cols == 0 || rows == 0)
        return 0;
    uint64_t d0 = cols < lim ? last_pow2(cols) : lim;
    uint64_t d1 = rows < lim ? last_pow2(rows) : lim;
    uint64_t bw = d0 < REDUCE_WARP ? d0 : REDUCE_WARP;
    uint64_t bh = d1 < lim / bw ? d1 : lim / bw;
    bw = d0 < lim / bh ? d0 : lim / bh;
    uint64_t split = bh * REDUCE_MIN_VPT < REDUCE_MAX_VPT
                         ? bh * REDUCE_MIN_VPT
                         : REDUCE_MAX_VPT;
    if (rows < split)
        return 0; /* each warp takes its own outputs: no global reduce */
    uint64_t vpt = (rows + bh - 1) / bh;
    uint64_t grid = (cols + bw - 1) / bw;
    uint64_t wave = (uint64_t)S->s->sm_count *
                    (REDUCE_THREADS_PER_SM / (bw * bh));
    if (vpt < REDUCE_MAX_VPT || grid > wave)
        return 0;
    uint64_t c1 = (wave + grid - 1) / grid;
    uint64_t c2 = (vpt + REDUCE_MIN_VPT - 1) / REDUCE_MIN_VPT;
    uint64_t c3 = (vpt + REDUCE_MAX_VPT - 1) / REDUCE_MAX_VPT;
    uint64_t ctas = c1 < c2 ? c1 : c2;
    if (ctas < c3)
        ctas = c3;
    if (ctas <= 1)
        return 0;
    *sem = 4 * grid;
    return vp__mulc(S, vp__mulc(S, vp__mulc(S, out, 4), ctas), bw * vec);
}

/* HF's Python RMSNorm, trained weight: MulBackward0 of weight * h makes
 * grad * h (the grad's dtype; Gemma's product is fp32) and the engine's
 * validate_outputs sums it to the weight's shape (InputMetadata::
 * reduce_grad, at::sum_to): the weight's gradient, then Reduce.cuh's
 * staging and semaphores (the semaphores freed first), then the
 * unreduced product. Traced: llama-1b-amp-bf16-b1 (90 x 33,554,432 B),
 * ho3-qwen3-0.6b-bf16-b2-s4096 (q_norm and k_norm too). T5LayerNorm's
 * `self.weight * hidden_states` is the same node (ops/encdec.c). */
void vp__norm_weight_sum(sim *S, const vp__bwd_op *b, uint8_t geb)
{
    const vp_op *o = b->o;
    uint32_t p = o->params[0];
    uint64_t out = S->g->params[p].numel;
    uint32_t prod = vp__talloc(S, vp__mulc(S, b->n, geb), VP_CAT_TEMP);
    vp__weight_grad(S, p, false);
    uint64_t sem;
    uint64_t buf = rows_sum_staging(S, out ? b->n / out : 0, out, &sem);
    if (buf) {
        uint32_t a = vp__talloc(S, buf, VP_CAT_WORKSPACE);
        uint32_t s = vp__talloc(S, sem, VP_CAT_WORKSPACE);
        vp__tunref(S, s);
        vp__tunref(S, a);
    }
    vp__tunref(S, prod);
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
    bool py_rms = o->kind == VP_OP_RMSNORM && !(o->flags & VP_OPF_MEGATRON) &&
                  o->n_params > 0 && S->g->params[o->params[0]].trainable;
    if (py_rms)
        vp__norm_weight_sum(S, b, (o->flags & VP_OPF_NORM_OFFSET) ? 4 : b->oeb);
    for (uint32_t k = py_rms ? 1 : 0; k < o->n_params; k++)
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
