/* Op rules: linear and conv2d, with the library workspaces they take
 * (cuBLAS, cuBLASLt, cuDNN) and the bias-gradient reduction's staging.
 * docs/SIMULATION_NOTES.md §0.1 and §3.2-3.5 (linear and the cuBLAS
 * workspaces), §7.1 (convolutions), §11 (torch_mha); PyTorch
 * aten/src/ATen/native/LinearAlgebra.cpp (addmm, matmul) and
 * Convolution.cpp; torch/nn/modules/activation.py (MultiheadAttention). */
#include <stdlib.h>

#include "../sim_internal.h"

/* What a linear or a convolution saves. MmBackward (the matmul path)
 * frees mat2 (W) before self (x); addmm, linear and convolution keep x
 * and then W. */
enum { LIN_W_MM, LIN_X, LIN_W };

/* cuBLASLt's workspace of the main thread: the first GEMM with a bias
 * epilogue (addmm) makes it (SIMULATION_NOTES.md §0.1). */
static void workspace_fwd(sim *S, bool bias)
{
    if (bias && !S->ws_fwd_lt) {
        S->ws_fwd_lt = true;
        vp__talloc(S, S->s->cublaslt_workspace, VP_CAT_WORKSPACE);
    }
}

/* The autograd thread's own cuBLAS handle: its workspace at the first
 * backward GEMM, and its cuBLASLt one at the first Lt GEMM there. */
static void workspace_bwd(sim *S, bool lt)
{
    if (!S->ws_bwd) {
        S->ws_bwd = true;
        vp__talloc(S, S->s->cublas_workspace, VP_CAT_WORKSPACE);
    }
    if (lt && !S->ws_bwd_lt) {
        S->ws_bwd_lt = true;
        vp__talloc(S, S->s->cublaslt_workspace, VP_CAT_WORKSPACE);
    }
}

/* Reduce.cuh global reduction for the bias gradient: a fp32 staging
 * buffer of out x min(2 rows, cap) plus a semaphore (SIMULATION_NOTES.md
 * §8.1, measured on the H200). setReduceConfig caps the grid at one wave
 * of blocks over the SMs, so the cap on staged elements scales with the
 * SM count: ~3.47e7 on the H200's 132 (the threads per SM, 2048 there,
 * are taken to be the same elsewhere). */
#define BIAS_STAGING_MIN_ROWS 256u
#define BIAS_STAGING_ELEMS_H200 34700000u
#define BIAS_STAGING_MIN_CAP 512u
static void bias_staging(sim *S, uint64_t rows, uint64_t out)
{
    if (rows < BIAS_STAGING_MIN_ROWS)
        return;
    uint64_t r = 2 * rows;
    uint64_t elems = vp__mulc(S, BIAS_STAGING_ELEMS_H200, S->s->sm_count) /
                     VP_DEFAULT_SM_COUNT;
    uint64_t cap = elems / (out ? out : 1);
    if (cap < BIAS_STAGING_MIN_CAP)
        cap = BIAS_STAGING_MIN_CAP;
    if (r > cap)
        r = cap;
    uint32_t a = vp__talloc(S, vp__mulc(S, vp__mulc(S, out, r), 4),
                            VP_CAT_TEMP);
    uint32_t b = vp__talloc(S, 32, VP_CAT_TEMP);
    vp__tunref(S, a);
    vp__tunref(S, b);
}

/* conv2d, and conv_transpose2d (cuDNN runs its forward as a convolution's
 * data gradient, with the same workspaces in the rule below) */
static bool is_conv(const vp_op *o)
{
    return o->kind == VP_OP_CONV2D || o->kind == VP_OP_CONV_TRANSPOSE2D;
}

/* ---- cuDNN convolution workspaces --------------------------------------- */

typedef enum { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER } conv_pass;

/* Bytes of the cuDNN workspace that one convolution call takes from the
 * caching allocator (freed at once). torch 2.11 asks cuDNN's heuristics
 * (cudnn.benchmark off) for an algorithm; on the H200 they pick NHWC
 * tensor-core kernels for NCHW tensors, whose workspace holds NHWC copies
 * of the operands: the input, the output and, for k>1, the filter (a 1x1
 * filter has the same layout in NCHW and NHWC). In half precision the
 * copies pad the channels to a multiple of 8 (16-byte vectors), e.g. the
 * 3-channel stem. A 1x1 stride-1 convolution is a plain GEMM over NCHW and
 * needs no copies, except on small feature maps (fewer than 14x14 output
 * positions), where cuDNN transforms as well. The filter gradient of a 1x1
 * stride-1 convolution splits the batch into fp32 partial filters
 * (batch x Cout x Cin x 4 B) when that is smaller than the copies; the
 * other filter gradients add split-K partial sums, up to 16 fp32 copies of
 * the filter. In fp32 the split count fills one wave of CTAs over the
 * filter's 128x128 tiles: floor(SMs / tiles), at most 16 (measured on the
 * H200's 132 SMs: exactly 14, 3, 16, 4 and 1 splits for ResNet-50's 3x3
 * 128/256 and 1x1 downsample filters); the SM count is the setup's
 * (vp_setup.sm_count, from the GPU profile). In bf16 it varies with the
 * batch (0-13 splits), modelled as 16 splits capped at 8 MiB (measured
 * 2-16 MB). That extra is what keeps the filter-gradient workspace from
 * fitting in the block the data-gradient workspace just freed. The copies
 * carry ~147 B of alignment slack (measured: +147 B in most calls, +16 in
 * the rest). Evidence (docs/SIMULATION_NOTES.md §7.1): every distinct conv
 * of ResNet-50, fp32 and bf16, batches 32-256, and the resnet50 traces;
 * the rule gives 175 of the 184 measured forward workspaces within 1 %
 * (the rest: other algorithms, up to 1.5x) and 109 of the 184
 * filter-gradient ones. A few hundred bytes of per-call scratch (272/400
 * B, small pool) are left out. */
#define CUDNN_WS_SLACK 147u
#define CUDNN_SPLITK_MAX 16u
#define CUDNN_SPLITK_CAP (8u << 20)
#define CUDNN_TILE 128u       /* a split-K CTA's output tile side        */
#define CUDNN_SMALL_MAP 196u  /* 14 x 14 output positions                */

/* Split-K partial filters of a filter gradient (not 1x1 stride 1). */
static uint64_t conv_splitk(sim *S, const vp_op *o, uint8_t eb, uint64_t cip,
                            uint64_t cop, uint64_t k2, uint64_t w4)
{
    uint64_t grp = o->groups ? o->groups : 1;
    if (eb != 4) {
        uint64_t sk = vp__mulc(S, w4, CUDNN_SPLITK_MAX);
        return sk > CUDNN_SPLITK_CAP ? CUDNN_SPLITK_CAP : sk;
    }
    /* fp32: as many splits as fill one wave of CTAs over the filter's
     * 128x128 output tiles */
    uint64_t crs = vp__mulc(S, cip / grp, k2);
    uint64_t tiles = ((cop + CUDNN_TILE - 1) / CUDNN_TILE) *
                     ((crs + CUDNN_TILE - 1) / CUDNN_TILE);
    uint64_t splits = S->s->sm_count / (tiles ? tiles : 1);
    if (splits > CUDNN_SPLITK_MAX)
        splits = CUDNN_SPLITK_MAX;
    return splits > 1 ? vp__mulc(S, w4, splits) : 0;
}

static uint64_t conv_ws(sim *S, const vp_op *o, uint8_t eb, conv_pass pass)
{
    const vp_op *x = &S->g->ops[o->inputs[0]];
    if (x->ndim != 4 || o->ndim != 4 || !o->in_features)
        return 0;
    uint64_t B = x->shape[0], ci = o->in_features, co = o->out_features;
    uint64_t cip = ci, cop = co;
    if (eb == 2) {
        cip = (ci + 7) / 8 * 8;
        cop = (co + 7) / 8 * 8;
    }
    uint64_t grp = o->groups ? o->groups : 1;
    uint64_t in = vp__mulc(S, vp__mulc(S, vp__mulc(S, B, cip),
                                       vp__mulc(S, x->shape[2], x->shape[3])),
                           eb);
    uint64_t out = vp__mulc(S, vp__mulc(S, vp__mulc(S, B, cop),
                                        vp__mulc(S, o->shape[2], o->shape[3])),
                            eb);
    uint64_t k2 = (uint64_t)o->kernel * o->kernel;
    uint64_t w = vp__mulc(S, vp__mulc(S, vp__mulc(S, cop, cip / grp), k2), eb);
    uint64_t w4 = vp__mulc(S, vp__mulc(S, vp__mulc(S, co, ci / grp), k2), 4);
    bool pointwise = o->kernel == 1 && o->stride <= 1;
    /* a non-overlapping patchify convolution (kernel = stride > 1, no
     * padding: ViT's conv_proj) in fp32: the forward takes no workspace
     * (traced: ViT-B/16 fp32 b32; in bf16 the general rule below holds to
     * 16 B) */
    if (pass == CONV_FWD && eb == 4 && o->kernel > 1 &&
        o->kernel == o->stride && !o->padding)
        return 0;
    uint64_t positions = o->shape[2] * o->shape[3];
    if (!pointwise) {
        /* a strided 1x1 forward in fp32 writes large outputs (over 14x14
         * positions) in NCHW directly: only the input is copied
         * (measured: ResNet-50's 256->512 downsample, 28x28 out) */
        if (o->kernel == 1 && pass == CONV_FWD && eb == 4 &&
            positions > CUDNN_SMALL_MAP)
            return in + CUDNN_WS_SLACK;
        uint64_t ws = in + out + (o->kernel > 1 ? w : 0) + CUDNN_WS_SLACK;
        if (pass == CONV_BWD_FILTER)
            ws += conv_splitk(S, o, eb, cip, cop, k2, w4);
        return ws;
    }
    if (pass == CONV_BWD_FILTER) {
        uint64_t split = vp__mulc(S, B, w4);
        uint64_t copies = in + out;
        return split < copies ? split : copies;
    }
    return positions < CUDNN_SMALL_MAP ? in + out + CUDNN_WS_SLACK : 0;
}

/* ---- Megatron's sequence parallelism ------------------------------------- */

/* The all-gather of a sequence-parallel column-parallel linear's input
 * (S/t tokens) into Megatron's global "mpu" buffer: GlobalMemoryBuffer.
 * get_tensor (megatron/core/parallel_state.py) makes the buffer at the
 * first request and replaces it (the old one freed) only by a larger
 * one; the forward gathers into it for the GEMM and the backward re-
 * gathers into it (LinearWithGradAccumulationAndAsyncCommunication,
 * megatron/core/tensor_parallel/layers.py): the linear saves its sharded
 * input, never the gathered one. */
static void sp_gather(sim *S, const vp_op *o, uint8_t ce)
{
    if (!(o->flags & VP_OPF_SP_GATHER) || !o->out_features)
        return;
    uint64_t rows = o->numel / o->out_features;
    uint64_t bytes = vp__mulc(S, vp__mulc(S, rows, o->in_features), ce);
    if (bytes <= S->mpu_bytes)
        return;
    if (S->mpu_bytes)
        vp__tunref(S, S->mpu);
    S->mpu = vp__talloc(S, bytes, VP_CAT_WORKSPACE);
    S->mpu_bytes = bytes;
}

/* The gradient of a gathered input: the whole sequence's grad_input
 * (the GEMM's output), reduce-scattered into a new S/t tensor, then
 * freed (layers.py, backward: sub_grad_input). gx: the sharded one,
 * made here. */
static uint32_t sp_grad_input(sim *S, const vp__bwd_op *b, uint8_t ce)
{
    const vp_op *o = b->o;
    if (!(o->flags & VP_OPF_SP_GATHER) || !o->out_features)
        return vp__grad_like(S, b->in0, ce);
    uint64_t rows = o->numel / o->out_features;
    uint32_t full = vp__talloc(
        S, vp__mulc(S, vp__mulc(S, rows, o->in_features), ce), VP_CAT_TEMP);
    uint32_t gx = vp__grad_like(S, b->in0, ce);
    vp__tunref(S, full);
    return gx;
}

/* A row-parallel linear's output over the whole sequence, before its
 * reduce-scatter to S/t tokens (mappings.py, reduce_scatter_to_sequence_
 * parallel_region): made before the sharded output, freed after it. */
static uint32_t sp_full_output(sim *S, const vp_op *o, uint32_t in0,
                               uint8_t eb)
{
    if (!(o->flags & VP_OPF_SP_SCATTER) || !o->in_features)
        return NONE;
    uint64_t rows = S->g->ops[in0].numel / o->in_features;
    return vp__talloc(
        S, vp__mulc(S, vp__mulc(S, rows, o->out_features), eb), VP_CAT_TEMP);
}

/* ---- Transformer Engine's fp8 linears (VP_OPF_FP8) ----------------------- */

/* The fp8 scaling metadata of a module (transformer_engine/pytorch/
 * fp8.py, FP8GlobalStateManager; Megatron's --fp8-amax-history-len
 * default 1): forward amax history [1, 3], scale and scale_inv [3];
 * backward [1, 2], [2], [2], fp32. */
static const uint64_t FP8_META[] = {12, 12, 12, 8, 8, 8};

/* The weight's scaling metadata, for the module's first linear (meta),
 * made at its first fp8 forward and kept across micro-batches and
 * steps. The weight itself is a Float8Tensor parameter (Megatron-Bridge's
 * fp8 recipes: fp8_param_gather, the model built under TE's
 * fp8_model_init; mixed_precision.py bf16_with_fp8_*_mixed): its fp8
 * data and transpose, 1 B each, are the parameter's 2 B, no cached copy
 * beside a bf16 weight. */
static void fp8_weight(sim *S, uint32_t p, bool meta)
{
    if (!S->fp8w) {
        size_t np = S->g->n_params ? S->g->n_params : 1;
        S->fp8w = malloc(np * sizeof *S->fp8w);
        if (!S->fp8w) {
            S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
            return;
        }
        for (size_t k = 0; k < np; k++)
            S->fp8w[k] = NONE;
    }
    if (S->fp8w[p] != NONE)
        return;
    S->fp8w[p] = 0; /* seen */
    for (size_t k = 0; meta && k < sizeof FP8_META / sizeof FP8_META[0];
         k++)
        vp__talloc(S, FP8_META[k], VP_CAT_CAST);
}

/* The fp8 cast of linear i's input in0 that the GEMM reads and the
 * linear saves: one per input (Megatron's linear_qkv casts the norm's
 * output once for q, k and v, one module: the graph's three projections
 * share it, the one an earlier projection of the same input saved,
 * *shared), else new. */
static uint32_t fp8_input(sim *S, uint32_t i, uint32_t in0, bool *shared)
{
    const vp_graph *g = S->g;
    for (uint32_t j = i; j-- > in0 + 1;) {
        const vp_op *o = &g->ops[j];
        if (o->kind != VP_OP_LINEAR || !(o->flags & VP_OPF_FP8) ||
            o->inputs[0] != in0)
            continue;
        uint32_t id = S->n_saved[j] > LIN_X ? S->saved[j * MAX_SAVED + LIN_X]
                                             : NONE;
        if (id != NONE) {
            vp__tref(S, id);
            *shared = true;
            return id;
        }
    }
    *shared = false;
    return vp__talloc(S, g->ops[in0].numel, VP_CAT_ACT);
}

/* The backward of an fp8 linear: grad_output cast to fp8 with its
 * transpose, and the saved fp8 input's transpose for the weight
 * gradient, freed after the GEMMs (_Linear.backward). */
static void fp8_backward(sim *S, const vp__bwd_op *b)
{
    if (!(b->o->flags & VP_OPF_FP8))
        return;
    uint64_t in = S->g->ops[b->in0].numel;
    uint32_t g8 = vp__talloc(S, b->n, VP_CAT_TEMP);
    uint32_t g8t = vp__talloc(S, b->n, VP_CAT_TEMP);
    uint32_t x8t = vp__talloc(S, in, VP_CAT_TEMP);
    vp__tunref(S, x8t);
    vp__tunref(S, g8t);
    vp__tunref(S, g8);
}

/* ---- forward --------------------------------------------------------------- */

/* torch_mha's in_proj (nn.MultiheadAttention(batch_first=True) transposes
 * the query to sequence-first, torch/nn/modules/activation.py
 * MultiheadAttention.forward), as the graph knows it: a linear of the
 * layout whose input is not the attention (that one is out_proj). */
bool vp__linear_mha_in(const vp_graph *g, const vp_op *o)
{
    return o->kind == VP_OP_LINEAR && (o->flags & VP_OPF_TORCH_MHA) &&
           o->n_inputs > 0 && o->inputs[0] < g->n_ops &&
           g->ops[o->inputs[0]].kind != VP_OP_ATTENTION;
}

/* Its bias: F.linear of the transposed 3-d input is not the fused addmm
 * (aten/src/ATen/native/Linear.cpp linear: only a contiguous 3-d input
 * is folded) but `at::matmul(input, weight.t())` and then
 * `output.add_(*bias)`: a forward launch that allocates nothing. */
double vp__linear_launches(const vp_graph *g, const vp_op *o, int ph,
                           bool wide)
{
    (void)wide;
    return ph == 0 && o->n_params > 1 && vp__linear_mha_in(g, o) ? 1.0 : 0.0;
}

/* The layout details of a linear (torch_mha: in_proj and out_proj of
 * nn.MultiheadAttention(batch_first=True)). */
typedef struct {
    bool mha_out; /* out_proj: takes attn_output.permute(2, 0, 1, 3)
                     .contiguous(), returns its result transposed        */
    bool mha_in;  /* in_proj                                             */
    bool mm;      /* F.linear of a strided 3-d input: through matmul     */
} lin_path;

static lin_path linear_path(const sim *S, const vp_op *o, uint32_t in0)
{
    const vp_op *xo = &S->g->ops[in0];
    bool mha = o->flags & VP_OPF_TORCH_MHA;
    lin_path p;
    p.mha_out = mha && xo->kind == VP_OP_ATTENTION;
    p.mha_in = mha && !p.mha_out;
    /* F.linear of a 3-d input that is not contiguous (in_proj reads its
     * input through a transpose) goes through matmul: the input is
     * reshaped to 2-d by a copy, which the mm saves, and the bias is
     * added in place */
    p.mm = o->kind == VP_OP_LINEAR &&
           (p.mha_in || (S->lay[in0] && xo->ndim >= 3));
    return p;
}

/* F.linear(x.type(torch.float32), W.type(torch.float32)) outside
 * autocast (transformers 5.17 modeling_deepseek_v3.py
 * DeepseekV3TopkRouter.forward; traced on deepseek-v3-small generate(),
 * and on deepseek-v3-tiny bf16 b8 training, ho5): fp32 copies of a 16-bit
 * input and weight, the output in fp32. With autograd MmBackward0 keeps
 * the fp32 input for the weight's gradient and the fp32 weight for the
 * input's (tools/autograd/derivatives.yaml, mm: mm_mat2_backward reads
 * self, mm_mat1_backward mat2); without, the copies are dropped. Under
 * autocast the linear runs in the autocast dtype as any other. */
static bool fp32_linear_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    if (!(o->flags & VP_OPF_FP32_LINEAR) || S->amp || o->n_params != 1)
        return false;
    const vp_param *pw = &S->g->params[o->params[0]];
    uint32_t x = vp__cast_input(S, f->in0, 4);
    uint32_t w = vp__param_bytes(S, pw) != 4
                     ? vp__talloc(S, vp__mulc(S, pw->numel, 4), VP_CAT_TEMP)
                     : NONE;
    workspace_fwd(S, false);
    f->oeb = 4;
    f->ol = 0;
    f->out = vp__talloc(S, vp__mulc(S, f->n, 4), VP_CAT_ACT);
    if (f->sv) {
        if (pw->trainable)
            vp__save(S, f->i, LIN_X, x);
        if (S->g->ops[f->in0].needs_grad)
            vp__save(S, f->i, LIN_W, w);
    }
    vp__tunref(S, x);
    vp__tunref(S, w);
    return true;
}

/* Its backward (traced, ho5 deepseek-v3-tiny): MmBackward0 makes the
 * weight's fp32 gradient, then the input's, and drops grad_out and what
 * it saved; then the ToCopyBackward0 of W.type(fp32) casts the weight's
 * to its dtype, and that of x.type(fp32) the input's. */
static bool fp32_linear_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    if (!(o->flags & VP_OPF_FP32_LINEAR) || S->amp || o->n_params != 1)
        return false;
    uint32_t pw = o->params[0];
    const vp_param *p = &S->g->params[pw];
    workspace_bwd(S, false);
    uint32_t gw = p->trainable
                      ? vp__talloc(S, vp__mulc(S, p->numel, 4), VP_CAT_TEMP)
                      : NONE;
    uint32_t gx = b->ig0 ? vp__talloc(S, vp__mulc(S, S->g->ops[b->in0].numel,
                                                  4),
                                      VP_CAT_TEMP)
                         : NONE;
    vp__tunref(S, b->gy);
    b->gy = NONE;
    vp__release_saved(S, b->i);
    uint64_t eb = vp__param_bytes(S, p);
    if (gw != NONE && eb != 4) {
        uint32_t c = vp__talloc(S, vp__mulc(S, p->numel, eb), VP_CAT_TEMP);
        vp__tunref(S, gw);
        gw = c;
    }
    vp__param_grad(S, pw, gw);
    vp__give_grad(S, b->in0, gx, 4);
    return true;
}

void vp__linear_fwd(sim *S, vp__fwd_op *f)
{
    const vp_graph *g = S->g;
    const vp_op *o = f->o;
    if (o->n_params && g->params[o->params[0]].quant) {
        vp__quant_linear_fwd(S, f); /* ops/quant.c */
        return;
    }
    if (fp32_linear_fwd(S, f))
        return;
    uint32_t i = f->i, in0 = f->in0;
    bool bias = o->n_params > 1;
    uint8_t ce = S->amp ? 2 : f->eb0; /* compute dtype */
    const vp_op *xo = &g->ops[in0];
    lin_path p = linear_path(S, o, in0);
    /* out_proj's copy, unless the kernel wrote its output sequence-first
     * (flash: empty_like(q), and q is a view of the sequence-first
     * projection) */
    uint32_t xp = NONE;
    if (p.mha_out &&
        vp__attention_impl(S, xo, S->out_eb[in0]) != VP_ATTN_FLASH)
        xp = vp__talloc(S, vp__mulc(S, xo->numel, S->out_eb[in0]),
                        VP_CAT_ACT);
    /* autocast's wrapper casts the arguments right to left:
     * addmm(b, x, W) casts W, x, b; linear/conv(x, W, b) b, W, x */
    uint32_t x, w;
    if (o->flags & VP_OPF_ADDMM) {
        w = vp__weight_cast(S, o->params[0]);
        x = vp__cast_input(S, in0, ce);
        if (bias)
            vp__weight_cast(S, o->params[1]);
    } else {
        if (bias)
            vp__weight_cast(S, o->params[1]);
        w = vp__weight_cast(S, o->params[0]);
        x = xp != NONE ? xp : vp__cast_input(S, in0, ce);
    }
    uint32_t xc = p.mm ? vp__talloc(S, vp__mulc(S, xo->numel, ce), VP_CAT_ACT)
                       : NONE;
    if (o->kind == VP_OP_LINEAR)
        workspace_fwd(S, bias && !p.mm);
    f->oeb = ce;
    f->ol = p.mha_out;
    /* INT8 weights: dequantized for the matmul, freed after it */
    uint32_t deq = S->int8 && S->int8[o->params[0]]
                       ? vp__talloc(S,
                                    vp__mulc(S, g->params[o->params[0]].numel,
                                             ce),
                                    VP_CAT_TEMP)
                       : NONE;
    sp_gather(S, o, ce);
    if (o->flags & VP_OPF_FP8) {
        /* the GEMM reads the fp8 cast of the input, which is saved */
        bool shared;
        uint32_t x8 = fp8_input(S, i, in0, &shared);
        fp8_weight(S, o->params[0], !shared);
        vp__tunref(S, x);
        x = x8;
    }
    uint32_t full = sp_full_output(S, o, in0, f->oeb);
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    vp__tunref(S, full);
    vp__tunref(S, deq);
    if (p.mm) {
        vp__tunref(S, x); /* the (strided) cast; the mm keeps the copy */
        x = xc;
    }
    if (p.mha_in) {
        /* unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2)
         * .squeeze(-2).contiguous(): q, k, v are views of this copy */
        uint32_t c = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
        vp__tunref(S, f->out);
        f->out = c;
    }
    if (is_conv(o))
        vp__transient(S, conv_ws(S, o, ce, CONV_FWD));
    if (f->sv) {
        if (p.mm && xo->needs_grad)
            vp__save(S, i, LIN_W_MM, w);
        if (g->params[o->params[0]].trainable)
            vp__save(S, i, LIN_X, x);
        /* ConvolutionBackward keeps the weight (its cast under autocast)
         * even when the input needs no gradient (traced on ResNet-50 and
         * ViT's patchify conv); linear's mm saves it only for the input's
         * gradient */
        if (!p.mm && (xo->needs_grad || is_conv(o)))
            vp__save(S, i, LIN_W, w);
    }
    vp__tunref(S, x);
}

/* ---- backward -------------------------------------------------------------- */

/* The gradients of x, W and b (compute dtype), before they are handed on. */
typedef struct {
    uint32_t gx, gw, gb;
    uint8_t gxe;
    bool gxs;
} lin_grads;

/* The matmul path: the bias's AddBackward (add_ ran last) and its
 * reduction, then MmBackward: mat2 (W), then self (x); the grad of a
 * transposed input comes back transposed. */
static void linear_bwd_mm(sim *S, const vp__bwd_op *b, const lin_path *p,
                          uint8_t ce, uint64_t rows, lin_grads *gr)
{
    const vp_graph *g = S->g;
    const vp_op *o = b->o;
    uint32_t pw = o->params[0];
    bool tb = o->n_params > 1 && g->params[o->params[1]].trainable;
    uint32_t ew = S->amp ? 2 : vp__param_bytes(S, &g->params[pw]);
    if (tb) {
        uint32_t pb = o->params[1];
        uint32_t eb = S->amp ? 2 : vp__param_bytes(S, &g->params[pb]);
        gr->gb = vp__talloc(S, vp__mulc(S, g->params[pb].numel, eb),
                            VP_CAT_TEMP);
        bias_staging(S, rows, o->out_features);
    }
    if (g->params[pw].trainable)
        gr->gw = vp__talloc(S, vp__mulc(S, g->params[pw].numel, ew),
                            VP_CAT_TEMP);
    if (b->ig0) {
        gr->gx = vp__grad_like(S, b->in0, ce);
        gr->gxe = ce;
        gr->gxs = p->mha_in;
    }
}

/* addmm, linear and convolution: grad_x (with cuDNN's data-gradient
 * workspace), grad_W (filter-gradient workspace), then grad_b and the sum
 * over rows (conv: over N, H, W). gc: cuDNN's contiguous copy of grad_out,
 * freed after the filter gradient. */
static void linear_bwd_direct(sim *S, const vp__bwd_op *b, uint8_t ce,
                              uint64_t rows, uint32_t gc, lin_grads *gr)
{
    const vp_graph *g = S->g;
    const vp_op *o = b->o;
    bool conv = is_conv(o);
    uint32_t pw = o->params[0];
    bool tb = o->n_params > 1 && g->params[o->params[1]].trainable;
    uint32_t ew = S->amp ? 2 : vp__param_bytes(S, &g->params[pw]);
    if (b->ig0) {
        gr->gx = sp_grad_input(S, b, ce);
        gr->gxe = ce;
        if (conv)
            vp__transient(S, conv_ws(S, o, ce, CONV_BWD_DATA));
    }
    if (g->params[pw].trainable) {
        gr->gw = vp__talloc(S, vp__mulc(S, g->params[pw].numel, ew),
                            VP_CAT_TEMP);
        if (conv)
            vp__transient(S, conv_ws(S, o, ce, CONV_BWD_FILTER));
    }
    vp__tunref(S, gc);
    /* In a checkpointed segment the recomputed tensors the node saved die
     * as its apply returns, before the engine's validate_outputs sums the
     * bias gradient: torch.utils.checkpoint's unpack_hook hands out the
     * last reference (holder.handles[gid] = None), where a plain node's
     * SavedVariables live until release_variables() after
     * validate_outputs (engine.cpp evaluate_function). Traced:
     * vit-b16-amp-bf16-b32-ckpt (SIMULATION_NOTES.md §11.4). */
    if (o->segment >= 0 && S->ckpt[o->segment])
        vp__release_saved(S, b->i);
    if (tb) {
        uint32_t pb = o->params[1];
        uint32_t eb = S->amp ? 2 : vp__param_bytes(S, &g->params[pb]);
        gr->gb = vp__talloc(S, vp__mulc(S, g->params[pb].numel, eb),
                            VP_CAT_TEMP);
        if (!conv)
            bias_staging(S, rows, o->out_features);
        else if (o->out_features)
            bias_staging(S, b->n / o->out_features, o->out_features);
    }
}

/* AddmmBackward / ConvolutionBackward: grad_x, grad_W, grad_b in the
 * compute dtype (with cuDNN's workspaces, or the bias-sum staging); then
 * the node drops grad_out and what it saved. Under autocast each grad
 * then goes through the ToCopyBackward of its cast to fp32; the engine
 * runs those in argument order (the autocast wrapper evaluates its casts
 * right to left, so the first argument's node has the highest sequence
 * number): b, x, W for HF Conv1D's addmm(b, x, W); x, W, b for linear and
 * conv. */
void vp__linear_bwd(sim *S, vp__bwd_op *b)
{
    const vp_graph *g = S->g;
    const vp_op *o = b->o;
    if (o->n_params && g->params[o->params[0]].quant) {
        vp__quant_linear_bwd(S, b); /* ops/quant.c */
        return;
    }
    if (fp32_linear_bwd(S, b))
        return;
    uint32_t i = b->i, in0 = b->in0;
    bool conv = is_conv(o);
    uint8_t ce = S->amp ? 2 : b->eb0;
    uint64_t rows = o->in_features ? g->ops[in0].numel / o->in_features : 0;
    /* the forward's matmul path, and torch_mha's in_proj, whose grad
     * comes back as the [3, L, N, E] buffer that the core's backward
     * assembles */
    lin_path p = linear_path(S, o, in0);
    /* ViewBackward: the grad must be in the output's memory order to be
     * seen as 2-d; reshape copies it (torch_mha: out_proj's output was
     * returned transposed; in_proj's unflatten/transpose chain) */
    if (!conv && b->gy != NONE && (p.mha_in || S->lay[i] != b->gstr)) {
        uint32_t c = vp__talloc(S, vp__mulc(S, b->n, S->out_eb[i]),
                                VP_CAT_TEMP);
        vp__tunref(S, b->gy);
        b->gy = c;
    }
    /* cuDNN takes a contiguous grad_out: a copy of one that came back
     * through a permute (ViT's patch embedding), freed after the filter
     * gradient */
    /* sequence parallelism: the reduce-scatter's backward all-gathers the
     * sharded gradient into a new whole-sequence one (mappings.py,
     * _ReduceScatterToSequenceParallelRegion.backward) */
    if ((o->flags & VP_OPF_SP_SCATTER) && b->gy != NONE) {
        uint32_t c = sp_full_output(S, o, in0, S->out_eb[i]);
        vp__tunref(S, b->gy);
        b->gy = c;
    }
    uint32_t gc = conv && b->gstr && b->gy != NONE
                      ? vp__talloc(S, vp__mulc(S, b->n, S->out_eb[i]),
                                   VP_CAT_TEMP)
                      : NONE;
    if (!conv)
        workspace_bwd(S, false);
    fp8_backward(S, b);
    lin_grads gr = {NONE, NONE, NONE, b->eb0, false};
    if (p.mm)
        linear_bwd_mm(S, b, &p, ce, rows, &gr);
    else
        linear_bwd_direct(S, b, ce, rows, gc, &gr);
    vp__tunref(S, b->gy);
    b->gy = NONE;
    vp__release_saved(S, i);
    uint32_t pw = o->params[0], pb = o->n_params > 1 ? o->params[1] : NONE;
    if (o->flags & VP_OPF_ADDMM) { /* addmm(b, x, W) */
        vp__param_grad_cast(S, pb, gr.gb);
        vp__give_grad_l(S, in0, gr.gx, gr.gxe, gr.gxs);
        vp__param_grad_cast(S, pw, gr.gw);
    } else { /* linear / conv (x, W, b); linear's W as weight.t() */
        vp__give_grad_l(S, in0, gr.gx, gr.gxe, gr.gxs);
        if (conv)
            vp__param_grad_cast(S, pw, gr.gw);
        else
            vp__param_grad_tview(S, pw, gr.gw);
        vp__param_grad_cast(S, pb, gr.gb);
    }
}
