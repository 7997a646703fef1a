/* The step-time model of one GPU running eager PyTorch
 * (docs/STEP_TIME.md "One GPU"). The simulator replays the step; every
 * allocation it makes is a kernel writing that many bytes. A matmul
 * (linear, convolution, attention) takes its time from the GPU's curves
 * by shape; every other kernel moves about twice (binary ops three
 * times) what it writes at the measured bandwidth of its class. The host
 * issues every kernel at its measured cost (VP_HOST_*) and the GPU runs
 * each once issued: where the host is slower the GPU waits. The optimizer
 * step follows its measured cost per parameter and per tensor. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sim_internal.h" /* vp__op_table: the ops' launches */
#include "timing_host.h"
#include "timing_layout.h"

double vp_hw_matmul_rate(const vp_hw *hw, vp_precision p)
{
    switch (p) {
    case VP_PREC_FP32:
        return hw->fp32;
    case VP_PREC_AMP_BF16:
    case VP_PREC_BF16:
        return hw->bf16;
    case VP_PREC_AMP_FP16:
    case VP_PREC_FP16:
        return hw->fp16;
    default:
        return 0.0;
    }
}

double vp_curve_rate(const vp_curve *c, double w)
{
    if (w <= 0.0 || c->peak <= 0.0)
        return 0.0;
    if (c->half <= 0.0)
        return c->peak;
    if (c->h == 1.0 || c->h <= 0.0)
        return c->peak * w / (w + c->half);
    double wh = pow(w / c->half, c->h);
    return c->peak * wh / (wh + 1.0);
}

double vp_curve_time(const vp_curve *c, double w)
{
    if (w <= 0.0 || c->peak <= 0.0)
        return 0.0;
    if (c->half <= 0.0)
        return w / c->peak;
    if (c->h == 1.0 || c->h <= 0.0)
        return (w + c->half) / c->peak;
    /* w (w^h + half^h) / (peak w^h) */
    return (w + c->half * pow(c->half / w, c->h - 1.0)) / c->peak;
}

double vp_gemm_time(const vp_curve *c, double m, double n, double k)
{
    if (m <= 0 || n <= 0 || k <= 0)
        return 0.0;
    double t = vp_curve_time(c, 2.0 * m * n * k);
    if (c->kh > 0.0)
        t *= (k + c->kh) / k;
    return t;
}

/* The H200 sweep's bandwidth of each class over copy's (4279 GB/s):
 * add 4298, gelu 3083, silu 3949, layernorm 2674, softmax 1270,
 * to_fp32 2111, cross_entropy 333, rmsnorm_py 264. */
double vp_hw_mem_share(int kind)
{
    static const double share[VP_HW_MEM__N] = {
        [VP_HW_MEM_COPY] = 1.0,       [VP_HW_MEM_ADD] = 1.0044,
        [VP_HW_MEM_GELU] = 0.7205,    [VP_HW_MEM_SILU] = 0.9229,
        [VP_HW_MEM_LAYERNORM] = 0.6249, [VP_HW_MEM_SOFTMAX] = 0.2968,
        [VP_HW_MEM_CAST] = 0.4933,    [VP_HW_MEM_CROSS_ENTROPY] = 0.0778,
        [VP_HW_MEM_RMSNORM_PY] = 0.0617};
    return kind >= 0 && kind < VP_HW_MEM__N ? share[kind] : 1.0;
}

/* The H200 sweep's optimizer costs (docs/STEP_TIME.md): bytes per
 * parameter, GPU and host microseconds per tensor, fp32 and 16-bit. */
static const vp_optim_cost optim_h200[VP_HW_OPTIM__N][2] = {
    [VP_HW_OPTIM_ADAMW] = {{98.19, 0, 7.90}, {55.13, 0, 9.03}},
    [VP_HW_OPTIM_ADAMW_FUSED] = {{39.35, 0, 2.76}, {23.82, 0, 3.84}},
    [VP_HW_OPTIM_ADAMW_FORLOOP] = {{75.63, 0, 60.61}, {28.26, 0, 65.69}},
    [VP_HW_OPTIM_SGD] = {{42.04, 0, 2.20}, {22.17, 0, 3.07}}};

/* BatchNorm2d over NCHW activations in training mode (batch statistics)
 * by shape (docs/STEP_TIME.md "Batch norm by shape"; calibrate/
 * vp-bn-shapes.py, calibrate/profiles/h200-bn-shapes.jsonl, fitted by
 * calibrate/fit-bn.py). The statistics and the backward run one thread
 * block per channel (aten/src/ATen/native/cuda/Normalization.cuh
 * batch_norm_cuda_template's batch_norm_collect_statistics_kernel and
 * batch_norm_backward_cuda_template's batch_norm_backward_kernel: dim3
 * blocks(input.size(1)); cuDNN's bn_fw_tr_1C11 / bn_bw_1C11 kernels time
 * alike in the sweep), so a call of E elements in C channels of HW
 * pixels takes E x max(a / C, f x (1 + (h0 / HW)^q)): one channel's
 * elements at one block's rate while the channels leave SMs idle, the
 * elements at the bandwidth once they fill the GPU, slower on short rows
 * (a block reads each image's HW pixels of its channel as one row: ATen's
 * statistics at 7 x 7 take three times their bytes' time). Each call of
 * the sweep read its tensors from HBM (the L2 emptied before it, as a
 * layer's saved input is in a step); the sum over ResNet-50's 53 layers
 * at batch 64 is within 0.5-4.5 % of the step profiles' kernels (calibrate/
 * profiles/h200-kernels-byname.jsonl), the U-Net's within 2-6 % (h200-
 * kernels-case.jsonl). The path
 * (aten/src/ATen/native/Normalization.cpp _batch_norm_impl_index,
 * use_cudnn): cuDNN unless the input is bf16 or a half input has half
 * parameters. {a, f, h0, q} on the H200 (a and f in picoseconds),
 * forward then backward; a and f count as bytes at the copy bandwidth the
 * sweep's GPU ran at (4580.28 GB/s), so another profile's bandwidth
 * scales them. */
static const double bn_fit[VP__BN__N][2][4] = {
    [VP__BN_NATIVE] = {{1030, 4.8, 96, 1.25}, {1920, 5.1, 32, 1.0}},
    [VP__BN_CUDNN32] = {{570, 3.6, 24, 1.25}, {1590, 5.6, 16, 1.0}},
    [VP__BN_CUDNN16] = {{690, 3.1, 36, 3.0}, {1490, 3.4, 44, 3.0}}};
#define BN_REF_BYTES_PER_PS 4.58028

int vp__bn_path(vp_precision p)
{
    return p == VP_PREC_FP32       ? VP__BN_CUDNN32
           : p == VP_PREC_AMP_FP16 ? VP__BN_CUDNN16
                                   : VP__BN_NATIVE;
}

double vp__bn_bytes(int path, bool bwd, double elems, double channels,
                    double pixels)
{
    if (path < 0 || path >= VP__BN__N || elems <= 0)
        return 0;
    const double *k = bn_fit[path][bwd ? 1 : 0];
    double per = channels >= 1 ? k[0] / channels : k[0];
    double bw = k[1];
    if (pixels >= 1)
        bw *= 1.0 + pow(k[2] / pixels, k[3]);
    if (per < bw)
        per = bw;
    return elems * per * BN_REF_BYTES_PER_PS;
}

double vp__conv_layout_bytes(double numel, bool half)
{
    return 2.0 * numel * (half ? 2.0 : 4.0);
}

/* The H200 host's seconds per parameter tensor of each optimizer step
 * (calibrate/fit-host.py on calibrate/profiles/h200-host.jsonl): foreach
 * fitted on 16 cases, the others read off their one case each with the
 * fitted fixed cost (for-loop gpt2-small, fused gpt2-small, SGD
 * resnet50). */
static const double host_opt_h200[VP_HW_OPTIM__N] = {
    [VP_HW_OPTIM_ADAMW] = VP_HOST_OPT_TENSOR,
    [VP_HW_OPTIM_ADAMW_FUSED] = 9.71e-6,
    [VP_HW_OPTIM_ADAMW_FORLOOP] = 177.27e-6,
    [VP_HW_OPTIM_SGD] = 7.05e-6};

static void fill_gemm(vp_hw *hw)
{
    const double rate[VP_HW__DTYPES] = {hw->fp32, hw->tf32, hw->fp16,
                                        hw->bf16, hw->fp8};
    for (int t = 0; t < VP_HW__DTYPES; t++) {
        vp_curve *c = &hw->gemm[t];
        if (rate[t] <= 0.0) {
            *c = (vp_curve){0, 0, 0, 0};
        } else if (c->peak <= 0.0) {
            *c = (vp_curve){rate[t] * hw->eff_max, hw->f_half, 1.0, 0};
        } else if (c->half <= 0.0) {
            c->half = c->peak * VP_HW_GEMM_HALF_S;
            c->h = VP_HW_GEMM_EXPONENT;
            if (t != VP_HW_FP32 && c->kh <= 0.0)
                c->kh = VP_HW_GEMM_KH;
        }
        if (c->h <= 0.0)
            c->h = 1.0;
    }
}

static void fill_attention(vp_hw *hw)
{
    const vp_curve *g16 = hw->gemm[VP_HW_BF16].peak > 0 ? &hw->gemm[VP_HW_BF16]
                          : hw->gemm[VP_HW_FP16].peak > 0
                              ? &hw->gemm[VP_HW_FP16]
                              : &hw->gemm[VP_HW_FP32];
    const double share[VP_HW_ATTN__N][2] = {
        [VP_HW_ATTN_FLASH] = {VP_HW_ATTN_FWD_SHARE, VP_HW_ATTN_BWD_SHARE},
        [VP_HW_ATTN_EFFICIENT] = {VP_HW_ATTN_FWD_SHARE * 0.76,
                                  VP_HW_ATTN_BWD_SHARE * 0.54},
        [VP_HW_ATTN_CUDNN] = {VP_HW_ATTN_FWD_SHARE, VP_HW_ATTN_BWD_SHARE}};
    for (int i = 0; i < VP_HW_ATTN__N; i++)
        for (int d = 0; d < 2; d++) {
            vp_curve *c = &hw->attn[i][d];
            if (c->peak <= 0.0)
                *c = (vp_curve){g16->peak * share[i][d], g16->half, g16->h,
                                0};
            if (c->h <= 0.0)
                c->h = 1.0;
        }
}

void vp_hw_fill_defaults(vp_hw *hw)
{
    if (hw->f_half <= 0.0) {
        hw->f_half = VP_HW_DEFAULT_F_HALF;
        if (hw->eff_max <= 0.0 || hw->eff_max >= 1.0)
            hw->eff_max = VP_HW_DEFAULT_EFF_MAX;
    }
    if (hw->mem_eff <= 0.0 || hw->mem_eff >= 1.0)
        hw->mem_eff = VP_HW_DEFAULT_MEM_EFF;
    fill_gemm(hw);
    fill_attention(hw);
    if (hw->mem.peak <= 0.0) {
        double bw = hw->hbm * hw->mem_eff;
        hw->mem = (vp_curve){bw, bw * VP_HW_MEM_HALF_S, 1.0, 0};
    }
    if (hw->mem.h <= 0.0)
        hw->mem.h = 1.0;
    for (int k = 0; k < VP_HW_MEM__N; k++) {
        vp_curve *c = &hw->mem_kind[k];
        if (c->peak <= 0.0) {
            double share = vp_hw_mem_share(k);
            *c = (vp_curve){hw->mem.peak * share, hw->mem.half * share,
                            hw->mem.h, 0};
        }
        if (c->h <= 0.0)
            c->h = 1.0;
    }
    for (int o = 0; o < VP_HW_OPTIM__N; o++)
        for (int d = 0; d < 2; d++)
            if (hw->optim[o][d].bytes_per_param <= 0.0)
                hw->optim[o][d] = optim_h200[o][d];
    if (hw->dispatch <= 0.0)
        hw->dispatch = VP_EAGER_OP_OVERHEAD;
    if (hw->host_fwd <= 0.0)
        hw->host_fwd = VP_HOST_FWD_KERNEL;
    if (hw->host_bwd <= 0.0)
        hw->host_bwd = VP_HOST_BWD_KERNEL;
    if (hw->host_opt <= 0.0)
        hw->host_opt = VP_HOST_OPT_FIXED;
    for (int o = 0; o < VP_HW_OPTIM__N; o++)
        if (hw->host_opt_tensor[o] <= 0.0)
            hw->host_opt_tensor[o] = host_opt_h200[o];
    if (hw->sustained <= 0.0 || hw->sustained > 1.0)
        hw->sustained = VP_HW_DEFAULT_SUSTAINED;
    if (hw->optim_bw <= 0.0)
        hw->optim_bw = hw->mem_kind[VP_HW_MEM_COPY].peak;
}

/* ------------------------------------------------------------------ */
/* The step                                                            */
/* ------------------------------------------------------------------ */

/* What the simulator made an op do in one phase (forward, backward). */
typedef struct {
    double mem[2];      /* seconds of its memory-bound kernels            */
    double kernels[2];  /* kernels launched (allocations)                 */
    double casts;       /* autocast casts among the forward's kernels     */
    double outs[2];     /* allocations a matmul kernel wrote so far       */
    double out_bytes;   /* its largest forward allocation: its output     */
    double act_bytes;   /* the same less autocast's casts (a weight's)     */
    uint32_t consumers; /* ops that take its output and need a gradient    */
    double sums;        /* autograd's gradient sums into it, a micro-batch */
    double saved;       /* tensors its checkpointed segment's recomputation
                           saved for it (vp__sim_hooks.saved)             */
} op_traffic;

typedef struct {
    const vp_graph *g;
    const vp_hw *hw;
    const char **names; /* sorted op name pointers                        */
    uint32_t *index;
    op_traffic *t;
    op_traffic *prev, *cur; /* t at the last two micro-batch starts     */
    double opt_kernels;
    uint32_t step;
    double gap;         /* GPU seconds between kernels                     */
    double own;         /* a memory-bound kernel's own fixed GPU seconds   */
    bool sdpa_cudnn;    /* SDPA runs cuDNN attention on 16-bit inputs      */
    int written_by;     /* the next allocation's kernel is timed elsewhere:
                           1 an op's GEMM (a launch), 2 the next
                           allocation's kernel (none); 0 not
                           (vp__sim_hooks.written_by)                     */
} tctx;

static int ptr_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (const char *const *)a;
    uintptr_t y = (uintptr_t) * (const char *const *)b;
    return (x > y) - (x < y);
}

/* Kernels of a matmul op whose outputs the matmul itself writes: the
 * forward's output; the backward's input and weight gradients. */
static double matmul_outputs(const vp_op *o, int ph)
{
    switch (o->kind) {
    case VP_OP_LINEAR:
    case VP_OP_CONV2D:
    case VP_OP_CONV_TRANSPOSE2D:
        return ph == 0 ? 1 : 2;
    case VP_OP_ATTENTION:
        if (o->attn_impl == VP_ATTN_EAGER || o->attn_impl == VP_ATTN_MATH)
            return 2;  /* the two batched matmuls */
        return 1e9;    /* one fused kernel writes everything */
    default:
        return 0;
    }
}

/* The class of an op's memory-bound kernels and the bytes they move per
 * byte written. */
static int mem_class(const vp_op *o, double *moved)
{
    *moved = 2.0;
    switch (o->kind) {
    case VP_OP_LAYERNORM:
    case VP_OP_GROUPNORM:
    case VP_OP_BATCHNORM2D:
        return VP_HW_MEM_LAYERNORM;
    case VP_OP_RMSNORM:
        return o->flags & VP_OPF_PY_RMSNORM ? VP_HW_MEM_RMSNORM_PY
                                            : VP_HW_MEM_LAYERNORM;
    case VP_OP_GELU:
        return VP_HW_MEM_GELU;
    case VP_OP_RELU:
    case VP_OP_SILU:
    case VP_OP_TANH:
    case VP_OP_SIGMOID:
        return VP_HW_MEM_SILU;
    case VP_OP_GELU_TANH: /* composed of elementwise ops in Python */
    case VP_OP_ADD:
    case VP_OP_MUL:
    case VP_OP_DROPOUT:
    case VP_OP_ROPE:
        *moved = 3.0;
        return VP_HW_MEM_ADD;
    case VP_OP_SOFTMAX:
    case VP_OP_ATTENTION: /* the scores' softmax, scale, mask, dropout */
        return VP_HW_MEM_SOFTMAX;
    case VP_OP_CROSS_ENTROPY:
        *moved = 1.0;
        return VP_HW_MEM_CROSS_ENTROPY;
    default:
        return VP_HW_MEM_COPY;
    }
}

/* GPU seconds of one memory-bound kernel of class k moving `bytes`: the
 * class's bandwidth plus a kernel's own start and tail. A copy timed alone
 * (the sweep) took fixed + bytes / peak, the fixed part being the host's
 * dispatch of the call (the launch sweep) and the kernel's start and
 * tail: the GPU's share is copy's fixed - dispatch (8.25 us on the H200),
 * at least the gap between kernels launched back to back. The other
 * classes' larger fixed costs are their calls' Python (argument handling),
 * the host's (docs/STEP_TIME.md). */
/* n memory-bound kernels of kind k moving `bytes` in all: the bytes at
 * the kind's bandwidth and each kernel's own fixed time. */
static double kernels_time(const tctx *c, int k, double bytes, double n)
{
    const vp_curve *m = &c->hw->mem_kind[k];
    if (m->peak <= 0)
        return n * c->gap;
    return bytes / m->peak + n * c->own;
}

static double kernel_time(const tctx *c, int k, double bytes)
{
    return kernels_time(c, k, bytes, 1.0);
}

/* The routed experts (transformers' grouped_mm_experts_forward): their
 * memory-bound kernels are not their allocations (a masked_fill's fill and
 * the tokens' mask run in place; a broadcast, a chunk's strides, a sum
 * reading k rows a row written): timed from the source's kernels
 * (ops/moe.c vp__moe_experts_mem, moe_mem below). */
static bool source_timed(const vp_op *o)
{
    return o->kind == VP_OP_MOE_EXPERTS && !(o->flags & VP_OPF_MEGATRON);
}

/* nn.MultiheadAttention(batch_first=True)'s projections (torch_mha):
 * their forward's copies are timed from the source (mha_copies). */
static bool mha_layout(const vp_op *o)
{
    return o->kind == VP_OP_LINEAR && (o->flags & VP_OPF_TORCH_MHA);
}

static void on_event(const vp_sim_event *ev, void *ud)
{
    tctx *c = ud;
    if (ev->is_free)
        return;
    int by = c->written_by;
    c->written_by = 0;
    if (ev->step != c->step)
        return;
    if (ev->phase == VP_PHASE_OPTIMIZER) {
        c->opt_kernels += 1.0;
        return;
    }
    if (ev->phase != VP_PHASE_FORWARD && ev->phase != VP_PHASE_BACKWARD)
        return;
    /* find the op by its name pointer */
    size_t lo = 0, hi = c->g->n_ops;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)c->names[mid] < (uintptr_t)ev->op)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo >= c->g->n_ops || c->names[lo] != ev->op)
        return; /* batch, loss seed: not an op */
    int ph = ev->phase == VP_PHASE_FORWARD ? 0 : 1;
    const vp_op *o = &c->g->ops[c->index[lo]];
    op_traffic *t = &c->t[c->index[lo]];
    if (ev->category == VP_CAT_WORKSPACE || by == 2)
        return; /* a library's scratch, a kernel's second output */
    t->kernels[ph] += 1.0;
    double moved, b = (double)ev->bytes;
    if (ph == 0 && b > t->out_bytes)
        t->out_bytes = b;
    if (ev->category == VP_CAT_CAST) {
        t->casts += 1.0;
        /* an autocast copy: fp32 read, 16-bit written */
        if (!source_timed(o))
            t->mem[ph] += kernel_time(c, VP_HW_MEM_CAST, 3 * b);
        return;
    }
    if (ph == 0 && b > t->act_bytes)
        t->act_bytes = b;
    if (by == 1)
        return; /* written by one of the op's GEMMs: in its time */
    if (source_timed(o))
        return; /* timed from its source's kernels (moe_mem) */
    if (t->outs[ph] < matmul_outputs(o, ph)) {
        t->outs[ph] += 1.0; /* written by the matmul: in its time */
        return;
    }
    int k = mem_class(o, &moved);
    if (k == VP_HW_MEM_CROSS_ENTROPY || k == VP_HW_MEM_RMSNORM_PY ||
        o->kind == VP_OP_BATCHNORM2D || o->kind == VP_OP_ROPE)
        return; /* timed as a whole op (matmul_time) */
    if (ph == 0 && mha_layout(o))
        return; /* from the source's kernels (mha_copies) */
    /* non-contiguous and broadcast inputs: ATen's strided path */
    double r = vp__layout_ratio(c->g, o, ph, b);
    t->mem[ph] += kernel_time(c, k, moved * b * r);
}

/* The forward kernels of in-place calls (torchvision's ReLU(inplace=True),
 * ResNet's `out += identity`): they allocate nothing, so the simulator
 * shows no kernel, but each reads and writes its input's output (that of
 * the op it aliases) once per micro-batch. */
static void inplace_kernels(tctx *c, double micro_batches)
{
    for (size_t i = 0; i < c->g->n_ops; i++) {
        const vp_op *o = &c->g->ops[i];
        op_traffic *t = &c->t[i];
        if (!o->inplace || t->kernels[0] > 0 || o->n_inputs == 0 ||
            o->inputs[0] >= c->g->n_ops)
            continue;
        t->out_bytes = c->t[o->inputs[0]].out_bytes;
        double moved;
        int k = mem_class(o, &moved);
        t->mem[0] += micro_batches * kernel_time(c, k, moved * t->out_bytes);
    }
}

/* Autograd sums the gradients of an output that feeds several ops (a
 * residual stream, ResNet's identity, the q, k and v projections' shared
 * input): each gradient after the first is added into the first
 * (torch/csrc/autograd/input_buffer.cpp InputBuffer::add, accumulate:
 * in place where the buffer's tensor can be stolen, else out of place;
 * the simulator allocates nothing for it), one binary kernel over the
 * output's bytes per extra consumer that needs a gradient, once per
 * micro-batch. The engine's thread launches it while it runs the node
 * that hands the gradient over, so it is a backward launch of the
 * host's as well (host_cost). */
static void grad_sums(tctx *c, double micro_batches)
{
    const vp_graph *g = c->g;
    for (size_t j = 0; j < g->n_ops; j++) {
        const vp_op *o = &g->ops[j];
        if (!o->needs_grad)
            continue;
        for (uint32_t a = 0; a < o->n_inputs; a++) {
            uint32_t in = o->inputs[a];
            bool first = true; /* count a producer once per consumer */
            for (uint32_t p = 0; p < a; p++)
                if (o->inputs[p] == in)
                    first = false;
            if (!first || in >= g->n_ops || !g->ops[in].needs_grad)
                continue;
            op_traffic *t = &c->t[in];
            if (t->consumers++ > 0) {
                t->mem[1] += micro_batches *
                             kernel_time(c, VP_HW_MEM_ADD, 3.0 * t->out_bytes);
                t->sums += 1.0;
            }
        }
    }
}

/* The simulator says the next allocation is written by a kernel timed
 * elsewhere (vp__sim_hooks.written_by, ops/lora.c): on_event counts a
 * GEMM's output as a launch without a memory-bound kernel's time, and
 * native_dropout's mask as neither. */
static void on_written_by(void *ud, bool launch)
{
    ((tctx *)ud)->written_by = launch ? 1 : 2;
}

/* The simulator saved a tensor of op for its backward: in a checkpointed
 * segment only the recomputation saves (the first forward runs under
 * checkpoint's hooks, sim.c forward_pass), one tensor through the hooks
 * each (host_cost). */
static void on_saved(void *ud, uint32_t step, uint32_t op, vp_phase ph)
{
    tctx *c = ud;
    if (step == c->step && ph == VP_PHASE_BACKWARD && op < c->g->n_ops)
        c->t[op].saved += 1.0;
}

/* Accumulation's steady state (vp__sim_hooks): t as the last two
 * micro-batches began; the micro-batch between them repeats `times`
 * more times, and adds what it added each time. */
static void on_mb_start(void *ud, uint32_t step)
{
    tctx *c = ud;
    if (step != c->step)
        return;
    op_traffic *x = c->prev;
    c->prev = c->cur;
    c->cur = x;
    memcpy(c->cur, c->t, c->g->n_ops * sizeof *c->t);
}

static void on_repeat(void *ud, uint32_t step, uint64_t times)
{
    tctx *c = ud;
    if (step != c->step)
        return;
    double k = (double)times;
    for (size_t i = 0; i < c->g->n_ops; i++) {
        op_traffic *t = &c->t[i];
        const op_traffic *p = &c->prev[i];
        for (int ph = 0; ph < 2; ph++) {
            t->mem[ph] += (t->mem[ph] - p->mem[ph]) * k;
            t->kernels[ph] += (t->kernels[ph] - p->kernels[ph]) * k;
            t->outs[ph] += (t->outs[ph] - p->outs[ph]) * k;
        }
        t->casts += (t->casts - p->casts) * k;
        t->saved += (t->saved - p->saved) * k;
    }
}

static int gemm_dtype(vp_precision p)
{
    switch (p) {
    case VP_PREC_AMP_BF16:
    case VP_PREC_BF16:
        return VP_HW_BF16;
    case VP_PREC_AMP_FP16:
    case VP_PREC_FP16:
        return VP_HW_FP16;
    default:
        return VP_HW_FP32;
    }
}

/* The backward's kernels of the attention's q, k and v (torch/nn/
 * functional.py multi_head_attention_forward, torch 2.11), ne = N x E
 * elements of eb bytes: `q, k, v = proj[0], proj[1], proj[2]` are
 * selects of the contiguous (3, L, N, E) projection, so each gradient
 * goes through SelectBackward (tools/autograd/derivatives.yaml select.int:
 * select_backward_symint; aten/src/ATen/native/TensorShape.cpp
 * select_backward_symint: `at::zeros_symint(input_sizes)`, a fill of the
 * whole 3 N E buffer, then `.select(dim, index).copy_(grad)`, a contiguous
 * copy of N E), and the engine adds the three buffers into proj's
 * gradient (torch/csrc/autograd/input_buffer.cpp InputBuffer::add: two
 * adds of 3 N E, in place). The profile's three FillFunctor, three
 * Memcpy DtoD and two vectorized adds a layer. Not after flash (or
 * cuDNN): the efficient kernel takes grad_out as [B, L, h, d] (a copy of
 * the sequence-first gradient) and its dq, dk, dv go back through
 * `q.view(bsz, h, L, d)` and `.view(L, bsz * h, d).transpose(0, 1)`,
 * two reshape copies each (ViewBackward: derivatives.yaml view,
 * `grad.reshape_symint(self.sym_sizes())` of a non-viewable gradient),
 * seven strided copies at the transposed-copy ratio. */
static void mha_bwd_bytes(vp__mha_bytes *k, double ne, double eb,
                          double tr, bool flash)
{
    k->bcopy = 3.0 * (3.0 * eb * ne) + 3.0 * (2.0 * eb * ne);
    k->bcopies = 6.0;
    k->badd = 2.0 * 3.0 * (3.0 * eb * ne);
    k->badds = 2.0;
    if (!flash) {
        k->bcopy += 7.0 * tr * ne;
        k->bcopies += 7.0;
    }
}

/* The forward kernels of nn.MultiheadAttention(batch_first=True)'s
 * projections other than their GEMMs and casts, from the source (torch/
 * nn/functional.py multi_head_attention_forward, torch 2.11), each a
 * copy of a transposed tensor made contiguous, ATen's strided copy at the
 * profile's transposed-copy ratio (timing_layout.c): in_proj's input is
 * the query transposed to sequence-first, so F.linear goes through
 * matmul, which folds it to rows with a copy (aten/src/ATen/native/
 * LinearAlgebra.cpp _matmul_impl: reshape of a non-viewable tensor), and
 * adds the bias in place, a broadcast add (Linear.cpp linear:
 * `output.add_(*bias)`, ops/linear.c vp__linear_launches); then
 * _in_projection_packed's `unflatten(-1, (3, E)).unsqueeze(0)
 * .transpose(0, -2).squeeze(-2).contiguous()` copies q, k, v apart.
 * out_proj's input is `attn_output.permute(2, 0, 1, 3).contiguous()`, a
 * copy unless the kernel wrote its output sequence-first (flash; the
 * simulator's choice, vp__attention_impl_of). The allocations are the
 * simulator's (ops/linear.c vp__linear_fwd), timed by these bytes
 * instead of one contiguous copy each (mha_copies; the cluster planner's
 * model, cluster_graph.c scan_mha, per sample). */
bool vp__mha_kernels(const vp_graph *g, const vp_setup *s, const vp_op *o,
                     vp__mha_bytes *k)
{
    memset(k, 0, sizeof *k);
    if (!mha_layout(o) || o->n_inputs == 0 || o->inputs[0] >= g->n_ops)
        return false;
    const vp_op *xo = &g->ops[o->inputs[0]];
    bool wide = gemm_dtype(s->precision) == VP_HW_FP32;
    double eb = wide ? 4.0 : 2.0;
    double tr = 2.0 * eb * vp__layout_transpose_copy(wide);
    if (!vp__linear_mha_in(g, o)) {
        bool flash = vp__attention_impl_of(g, s, xo, (uint8_t)eb) ==
                     VP_ATTN_FLASH;
        if (!flash)
            k->copy[0] = tr * (double)xo->numel;
        if (xo->needs_grad && !s->inference)
            mha_bwd_bytes(k, (double)xo->numel, eb, tr, flash);
        return true;
    }
    k->copy[0] = tr * (double)xo->numel;
    k->copy[1] = tr * (double)o->numel;
    if (o->n_params > 1)
        k->add = 3.0 * eb * (double)o->numel * vp__layout_broadcast(wide);
    return true;
}

/* One projection's kernels, each with a memory-bound kernel's own time. */
static double mha_fwd(const tctx *c, const vp_setup *s, const vp_op *o)
{
    vp__mha_bytes k;
    if (!vp__mha_kernels(c->g, s, o, &k))
        return 0;
    double t = 0;
    for (int i = 0; i < 2; i++)
        if (k.copy[i] > 0)
            t += kernel_time(c, VP_HW_MEM_COPY, k.copy[i]);
    if (k.add > 0)
        t += kernel_time(c, VP_HW_MEM_ADD, k.add);
    return t;
}

/* The backward's kernels on out_proj's record (mha_bwd_bytes), each
 * with a memory-bound kernel's own time. */
static double mha_bwd(const tctx *c, const vp_setup *s, const vp_op *o)
{
    vp__mha_bytes k;
    if (!vp__mha_kernels(c->g, s, o, &k) || k.bcopies <= 0)
        return 0;
    return kernels_time(c, VP_HW_MEM_COPY, k.bcopy, k.bcopies) +
           kernels_time(c, VP_HW_MEM_ADD, k.badd, k.badds);
}

static void mha_copies(tctx *c, const vp_setup *s, double micro_batches)
{
    for (size_t i = 0; i < c->g->n_ops; i++) {
        const vp_op *o = &c->g->ops[i];
        if (c->t[i].kernels[0] > 0)
            c->t[i].mem[0] += micro_batches * mha_fwd(c, s, o);
        if (c->t[i].kernels[1] > 0)
            c->t[i].mem[1] += micro_batches * mha_bwd(c, s, o);
    }
}

/* GPU seconds of a GEMM launched among others: its work at the curve's
 * peak, slowed by the inner dimension (k + kh) / k, and the gap between
 * kernels. The curve's fixed cost is not the GPU's: a call measured
 * alone (the sweep) pays the host's dispatch, counted apart here. */
static double gemm_gpu(const vp_curve *c, double gap, double m, double n,
                       double k)
{
    if (m <= 0 || n <= 0 || k <= 0 || c->peak <= 0)
        return 0;
    return vp__gemm_work(c, m, n, k) + gap;
}

/* 16-bit GEMMs whose operands' rows are not 16-byte aligned (a row of
 * n or k elements, n x 2 bytes not a multiple of 16: GPT-2's 50257-token
 * head, BERT's 30522) cannot use cuBLAS's TMA tensor-core kernels
 * (cuBLAS documentation, "Tensor Core Usage": pointers and leading
 * dimensions 16-byte aligned); the step profiles ran them as
 * cutlass_75_tensorop_bf16_s1688gemm_*_align1 (2-byte rows) and
 * cutlass_80_*_align2 (4-byte rows). Their rates, as shares of the
 * 16-bit GEMM peak (calibrate/vp-gemm-align.py on the H200,
 * calibrate/profiles/h200-gemm-align.jsonl: median over m 4096-32768, d
 * 768 and 1024; vocabulary 50257 and 30522 against 50304 and 30528):
 * forward, input gradient, weight gradient. 8-byte rows, unmeasured, take
 * the 4-byte rates; fp32 GEMMs (SIMT) showed no difference. */
enum { GEMM_FWD, GEMM_DGRAD, GEMM_WGRAD };
static const double unaligned_share[2][3] = {
    {0.1280, 0.1873, 0.1991},  /* 2-byte rows: 93.6, 137.0, 145.6 TFLOP/s */
    {0.3205, 0.3343, 0.3297}}; /* 4-byte rows: 234.4, 244.5, 241.2        */

/* The alignment class of a 16-bit linear's rows: -1 aligned, 0 rows of
 * an odd number of elements, 1 of an even number not a multiple of 8. */
static int unaligned_class(const vp_setup *s, uint64_t n, uint64_t k)
{
    if (gemm_dtype(s->precision) == VP_HW_FP32)
        return -1;
    uint64_t x = n | k;
    if (x % 8 == 0)
        return -1;
    return x % 2 ? 0 : 1;
}

/* A GEMM's seconds `t` (the aligned curve's) in alignment class al:
 * at least its FLOPs (2 mnk) at the unaligned kernel's rate. */
static double unaligned(const vp_curve *c, int al, int form, double t,
                        double mnk)
{
    if (al < 0 || c->peak <= 0)
        return t;
    double u = 2.0 * mnk / (unaligned_share[al][form] * c->peak);
    return u > t ? u : t;
}

/* A convolution in PyTorch's NCHW layout (docs/STEP_TIME.md
 * "Convolutions"): cuDNN runs it as an implicit GEMM in NHWC (the
 * sm90_xmma_fprop/dgrad/wgrad_implicit_gemm kernels of the step
 * profiles), m = N Ho Wo output pixels, n = the output channels, k = the
 * FLOPs' inner size (Cin / groups x kernel^2), at VP_CONV_GEMM_SHARE of
 * the GEMM curve of its dtype (TF32 for fp32: torch.backends.cudnn.
 * allow_tf32 defaults to True), and converts the output (the forward) and
 * its gradient (the backward) between the layouts (cuDNN's
 * nchwToNhwcKernel / nhwcToNchwKernel): a copy of those bytes. */
static double conv_gemm(const vp_curve *c, double gap, double m, double n,
                        double k)
{
    double t = gemm_gpu(c, gap, m, n, k);
    return t > gap ? (t - gap) / VP_CONV_GEMM_SHARE + gap : t;
}

static void conv_time(const vp_hw *hw, const vp_setup *s, const vp_op *o,
                      double gap, double *f, double *b)
{
    int dt = gemm_dtype(s->precision);
    if (dt == VP_HW_FP32 && hw->gemm[VP_HW_TF32].peak > 0)
        dt = VP_HW_TF32;
    const vp_curve *c = &hw->gemm[dt];
    double n = (double)o->out_features;
    double m = n > 0 ? (double)o->numel / n : 0;
    double k = m > 0 && n > 0 ? o->flops_fwd / (2.0 * m * n) : 0;
    const vp_curve *cp = &hw->mem_kind[VP_HW_MEM_COPY];
    double layout =
        cp->peak > 0 ? vp__conv_layout_bytes((double)o->numel,
                                             s->precision != VP_PREC_FP32) /
                           cp->peak
                     : 0;
    *f = conv_gemm(c, gap, m, n, k) + layout;
    *b = conv_gemm(c, gap, n, k, m) + layout;
    if (o->flops_bwd > 1.5 * o->flops_fwd)
        *b += conv_gemm(c, gap, m, k, n);
}

/* A linear's backward GEMMs: the weight gradient unless the weight is
 * frozen (fine-tuning's base), the input gradient when the input needs
 * one (the graph's backward FLOPs say). */
static void linear_grads(const tctx *x, const vp_op *o, bool *wg, bool *dg)
{
    *wg = o->n_params > 0 && x->g->params[o->params[0]].trainable;
    *dg = o->flops_bwd > 1.5 * o->flops_fwd;
}

/* The launches of a linear's GEMMs in phase ph beyond one kernel each
 * (cuBLAS's split-K, timing_host.c vp__gemm_extra) and *gpu their
 * GPU seconds; m tokens, n outputs, k inputs. */
static double linear_extra(const tctx *x, const vp_setup *s, const vp_op *o,
                           int ph, double *gpu)
{
    double m = (double)o->numel / (double)o->out_features;
    double n = (double)o->out_features, k = (double)o->in_features;
    int dt = gemm_dtype(s->precision);
    double g, l;
    *gpu = 0;
    if (ph == 0)
        return vp__gemm_extra(x->hw, dt, x->gap, m, n, k, gpu);
    bool wg, dg;
    linear_grads(x, o, &wg, &dg);
    l = wg ? vp__gemm_extra(x->hw, dt, x->gap, n, k, m, &g) : 0;
    *gpu += l > 0 ? g : 0;
    double d = dg ? vp__gemm_extra(x->hw, dt, x->gap, m, k, n, &g) : 0;
    *gpu += d > 0 ? g : 0;
    return l + d;
}

/* A linear's forward and backward GEMMs: the forward, the weight
 * gradient (k over m) and the input gradient (m x n @ n x k), as
 * linear_grads says; unaligned 16-bit rows at their measured rates; the
 * split GEMMs' reduce kernels. */
static void linear_time(const tctx *x, const vp_setup *s, const vp_op *o,
                        double *f, double *b)
{
    const vp_curve *c = &x->hw->gemm[gemm_dtype(s->precision)];
    double m = (double)o->numel / (double)o->out_features;
    double n = (double)o->out_features, k = (double)o->in_features;
    int al = unaligned_class(s, o->out_features, o->in_features);
    bool wg, dg;
    linear_grads(x, o, &wg, &dg);
    *f = unaligned(c, al, GEMM_FWD, gemm_gpu(c, x->gap, m, n, k), m * n * k);
    *b = wg ? unaligned(c, al, GEMM_WGRAD, gemm_gpu(c, x->gap, n, k, m),
                        n * k * m)
            : 0;
    if (dg)
        *b += unaligned(c, al, GEMM_DGRAD, gemm_gpu(c, x->gap, m, k, n),
                        m * k * n);
    double r;
    linear_extra(x, s, o, 0, &r);
    *f += r;
    linear_extra(x, s, o, 1, &r);
    *b += r;
}

/* A LoRA adapter's GEMMs (peft 0.21, peft/tuners/lora/layer.py
 * Linear.forward: lora_B(lora_A(dropout(x))) * scaling added to the
 * frozen base's output): lora_A (rows x r x in) and lora_B (rows x out x
 * r) forward; backward both weight gradients, lora_B's input gradient and
 * lora_A's when x needs one. Rank-r GEMMs are thin, their time the
 * curve's at their shape (vp__gemm_small, timing_host.c). DoRA (n_params
 * 3: the magnitude; peft/tuners/lora/dora.py DoraLinearLayer.forward)
 * adds lora_B(lora_A(eye(in))) for the weight
 * norm (no gradient: detached) and, with dropout, the base layer again
 * on the dropped input (F.linear(x, weight): forward and its input
 * gradient, the weight frozen). The elementwise kernels (dropout, the
 * scaling, the add, DoRA's norm) are the simulator's allocations; those
 * the GEMMs write are in this time (vp__written_by). The GEMMs run in
 * the adapters' compute dtype: autocast's, else their own: peft's
 * autocast_adapter_dtype (peft/tuners/tuners_utils.py
 * BaseTuner._cast_adapter_dtype) keeps them fp32 over a 16-bit base, so
 * in a bf16 step the adapters' GEMMs are fp32 ones (the H200 profile of
 * gpt2-medium's bf16 LoRA ran sm80_xmma_gemm_f32f32 ffma kernels). */
static void lora_time(const tctx *x, const vp_setup *s, const vp_op *o,
                      double *f, double *b)
{
    double n = (double)o->out_features, k = (double)o->in_features;
    *f = *b = 0;
    if (n <= 0 || k <= 0 || o->n_params < 2)
        return;
    bool amp = s->precision == VP_PREC_AMP_BF16 ||
               s->precision == VP_PREC_AMP_FP16;
    const vp_param *pa = &x->g->params[o->params[0]];
    int dt = !amp && pa->elem_bytes_override == 4 ? VP_HW_FP32
                                                  : gemm_dtype(s->precision);
    const vp_curve *c = &x->hw->gemm[dt];
    double m = (double)o->numel / n;
    double r = (double)x->g->params[o->params[0]].numel / k;
    bool xg = o->n_inputs && x->g->ops[o->inputs[0]].needs_grad;
    double g = x->gap, d = x->hw->dispatch;
    *f = vp__gemm_small(c, d, g, m, r, k) + vp__gemm_small(c, d, g, m, n, r);
    *b = vp__gemm_small(c, d, g, n, r, m) + vp__gemm_small(c, d, g, m, r, n) +
         vp__gemm_small(c, d, g, r, k, m) +
         (xg ? vp__gemm_small(c, d, g, m, k, r) : 0);
    if (o->n_params < 3)
        return;
    *f += vp__gemm_small(c, d, g, k, r, k) + vp__gemm_small(c, d, g, k, n, r);
    if (o->dropout > 0) {
        *f += gemm_gpu(c, g, m, n, k);
        *b += xg ? gemm_gpu(c, g, m, k, n) : 0;
    }
}

/* SDPA's fused kernels on the H200, one call's GPU seconds by shape
 * (docs/STEP_TIME.md "Attention by shape"): calibrate/fit-attn.py on
 * calibrate/profiles/h200-sdpa-gpu.jsonl (the kernels' own time under
 * torch.profiler, calibrate/vp-kernels-attn.py sdpa). By backend, pass
 * (forward, backward), mask (full, causal) and dropout (0, > 0): the
 * call's fixed microseconds, picoseconds per element of q (b h s d: the
 * backward's dO.O pass and dQ accumulator, the causal diagonal tiles) and
 * TFLOP/s at each head dimension of attn_dims. 0: not measured (the
 * efficient kernel refuses grouped KV, so d 256 has no point). */
typedef struct {
    double t0_us, ps_el, tflops[5];
} attn_fit;

static const double attn_dims[5] = {64, 80, 96, 128, 256};

static const attn_fit attn_h200[VP_HW_ATTN__N][2][2][2] = {
    [VP_HW_ATTN_FLASH] = {
        {{{5.42, 0.810, {306.3, 271.3, 358.4, 367.0, 335.1}},
           {5.56, 0.826, {227.4, 223.9, 276.7, 287.6, 328.9}}},
         {{16.13, 1.434, {256.0, 250.5, 325.5, 326.1, 276.1}},
           {19.35, 1.120, {194.9, 184.5, 261.8, 257.6, 273.8}}}},
        {{{12.56, 12.729, {295.9, 222.8, 310.3, 314.4, 260.5}},
           {15.50, 12.951, {249.6, 220.6, 284.0, 301.1, 257.4}}},
         {{30.53, 13.513, {261.2, 198.6, 265.4, 305.0, 233.5}},
           {35.04, 14.217, {222.0, 200.5, 270.9, 270.3, 243.4}}}},
    },
    [VP_HW_ATTN_EFFICIENT] = {
        {{{4.84, 1.013, {129.3, 112.3, 137.2, 176.8, 0.0}},
           {8.48, 0.812, {65.5, 67.8, 82.2, 107.0, 0.0}}},
         {{13.41, 1.490, {109.9, 104.5, 130.2, 165.2, 0.0}},
           {21.83, 1.546, {56.0, 64.1, 78.6, 100.9, 0.0}}}},
        {{{7.89, 3.918, {107.4, 90.3, 109.7, 139.0, 0.0}},
           {13.73, 4.370, {73.1, 55.7, 66.6, 82.1, 0.0}}},
         {{22.89, 5.903, {89.7, 80.9, 100.4, 125.8, 0.0}},
           {32.38, 7.797, {62.2, 49.9, 61.1, 74.3, 0.0}}}},
    },
    [VP_HW_ATTN_CUDNN] = {
        {{{5.51, 0.690, {483.5, 445.3, 538.6, 704.4, 749.1}},
           {6.82, 0.826, {181.2, 185.7, 224.1, 300.5, 281.1}}},
         {{10.64, 0.882, {422.9, 388.8, 486.4, 639.7, 569.4}},
           {19.00, 0.983, {162.9, 176.4, 218.9, 287.3, 153.9}}}},
        {{{16.72, 6.637, {497.9, 399.5, 480.8, 618.6, 384.2}},
           {15.43, 6.477, {349.0, 282.7, 336.8, 446.5, 252.5}}},
         {{28.82, 7.288, {431.4, 367.8, 448.7, 597.6, 401.4}},
           {29.76, 7.113, {301.8, 281.5, 343.0, 455.3, 322.6}}}},
    },
};

/* The H200 profile's attention peaks the table was measured against
 * (gpus/h200.yaml measured.attention, TFLOP/s) and its copy bandwidth
 * (GB/s): another GPU's rates scale with its own curve's peak, the
 * per-element term with its copy bandwidth. */
static const double attn_h200_peak[VP_HW_ATTN__N][2] = {
    [VP_HW_ATTN_FLASH] = {338.865, 387.957},
    [VP_HW_ATTN_EFFICIENT] = {369.295, 201.9},
    [VP_HW_ATTN_CUDNN] = {647.071, 638.359}};
#define ATTN_H200_COPY_GBPS 4580.28

/* TFLOP/s of fit f at head dimension d: between the measured neighbours
 * linearly in seconds per FLOP, the nearest measured one outside. */
static double attn_tflops(const attn_fit *f, double d)
{
    int lo = -1, hi = -1;
    for (int i = 0; i < 5; i++) {
        if (f->tflops[i] <= 0)
            continue;
        if (attn_dims[i] <= d)
            lo = i;
        if (attn_dims[i] >= d && hi < 0)
            hi = i;
    }
    if (lo < 0)
        return hi < 0 ? 0 : f->tflops[hi];
    if (hi < 0 || hi == lo)
        return f->tflops[lo];
    double u = (d - attn_dims[lo]) / (attn_dims[hi] - attn_dims[lo]);
    return 1.0 / ((1 - u) / f->tflops[lo] + u / f->tflops[hi]);
}

/* The query and key rows one thread block of a fused attention kernel of
 * backend impl, pass ph, head dimension d computes (*bq, *bk), read off
 * the kernels the H200 profiles ran (calibrate/profiles/h200-sdpa-gpu.jsonl,
 * h200-kernels-byname.jsonl): FlashAttention's Flash_fwd_kernel_traits
 * and Flash_bwd_kernel_traits<d, kBlockM, kBlockN> (pytorch_flash::
 * flash_fwd_kernel: <64, 128, 128>, <96 and 128, 128, 64>, <256, 64, 64>;
 * flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel: <64, 128, 128>, <96 and
 * 128, 64, 128>, <256, 64, 64>), the memory-efficient kernel's
 * AttentionKernel / AttentionBackwardKernel<..., kQueriesPerBlock,
 * kKeysPerBlock, kMaxK> (fmha_cutlassF_{f32,bf16}_aligned_64x64_rf at d
 * 64, fmha_cutlassF_bf16_aligned_64x128_rf above; fmha_cutlassB_*_64x64
 * _k64, _128x128_k128), cuDNN's sdpa_sm90_flash_fprop_*_64x128xd and
 * sdpa_sm90_flash_bprop_*_64x64xd at every d, queries first as in the
 * other two. */
static void attn_tile(int impl, int ph, double d, double *bq, double *bk)
{
    if (impl == VP_HW_ATTN_CUDNN) {
        *bq = 64;
        *bk = ph ? 64 : 128;
    } else if (impl == VP_HW_ATTN_EFFICIENT) {
        *bq = ph && d > 64 ? 128 : 64;
        *bk = d > 64 ? 128 : 64;
    } else if (ph) {
        *bq = d > 64 ? 64 : 128;
        *bk = d > 128 ? 64 : 128;
    } else {
        *bq = d > 128 ? 64 : 128;
        *bk = d > 64 ? 64 : 128;
    }
}

/* The work of a fused attention call over its FLOPs: a block of the
 * kernel computes all its rows' scores, a sequence's last, partial block
 * as much as a whole one (its rows masked, flash_fwd_kernel's
 * Is_even_MN = false path, the memory-efficient kernel's predicated
 * iterators): the FLOPs of the lengths rounded up to whole blocks.
 * ViT-B/16's 197 tokens run 256 rows a side, 1.69 times their FLOPs;
 * lengths that are multiples of 128 (every measured shape, the
 * transformers' sequences) 1. */
static double attn_blocks(int impl, int ph, const vp_op *o)
{
    double q = (double)o->q_len, kv = (double)o->kv_len, bq, bk;
    if (q <= 0 || kv <= 0)
        return 1.0;
    attn_tile(impl, ph, (double)o->head_dim, &bq, &bk);
    return ceil(q / bq) * bq * ceil(kv / bk) * bk / (q * kv);
}

/* GPU seconds of one fused SDPA call of backend impl, pass ph (0 forward,
 * 1 backward) of op o, its attention dropout applied when training (drop):
 * the H200's fit scaled by the profile's peak, over the whole blocks'
 * work (attn_blocks). */
static double attn_call_time(const vp_hw *hw, int impl, int ph,
                             const vp_op *o, bool drop)
{
    const vp_curve *c = &hw->attn[impl][ph];
    double w = (ph ? o->flops_bwd : o->flops_fwd) * attn_blocks(impl, ph, o);
    if (c->peak <= 0 || w <= 0)
        return 0;
    const attn_fit *f = &attn_h200[impl][ph][o->causal ? 1 : 0][drop ? 1 : 0];
    double rate = attn_tflops(f, (double)o->head_dim) * 1e12 * c->peak /
                  (attn_h200_peak[impl][ph] * 1e12);
    double bw = hw->mem_kind[VP_HW_MEM_COPY].peak;
    double bh = (double)o->shape[0] * (double)o->heads;
    double el = bh * 0.5 * (double)(o->q_len + o->kv_len) *
                (double)o->head_dim;
    double e = f->ps_el * 1e-12 * el *
               (bw > 0 ? ATTN_H200_COPY_GBPS * 1e9 / bw : 1.0);
    return f->t0_us * 1e-6 + e + (rate > 0 ? w / rate : 0);
}

/* The fused kernel SDPA runs on 16-bit inputs (ai: the user's or the
 * model's choice): cuDNN's on Hopper and later (x->sdpa_cudnn), flash
 * before. */
static int fused_impl(const tctx *x, vp_attn_impl ai)
{
    return ai == VP_ATTN_FLASH       ? VP_HW_ATTN_FLASH
           : ai == VP_ATTN_EFFICIENT ? VP_HW_ATTN_EFFICIENT
           : x->sdpa_cudnn           ? VP_HW_ATTN_CUDNN
                                     : VP_HW_ATTN_FLASH;
}

/* The kernels cuDNN's SDPA backward launches beside its own (torch 2.11
 * aten/src/ATen/native/cudnn/MHA.cpp run_cudnn_SDP_bprop runs the
 * cuDNN frontend's sdpa_backward graph; the H200 profiles name them):
 * FlashAttention-2's backward (Dao 2023, Algorithm 2) first takes the
 * row sums D = rowsum(dO * O) (cudnn::fusion::compute_dot_do_o), and
 * accumulates dQ in fp32 across the key blocks, converted to the
 * 16-bit gradient at the end (convert_dq_to_16bits): 2 launches a call
 * that allocate nothing of the simulator's (the GQA head sums of dK and
 * dV, fmha_reduce_head, are its allocations). Every cuDNN call in
 * calibrate/profiles/h200-host-trace.jsonl shows exactly one of each;
 * an attention with a bias input (T5's position bias) ran SDPA's math
 * path there (bmm, _safe_softmax) and has none. */
#define CUDNN_BWD_HELPERS 2.0

static double cudnn_bwd_launches(const tctx *x, const vp_setup *s,
                                 const vp_op *o)
{
    vp_attn_impl ai = s->attn_set ? s->attn : o->attn_impl;
    if (o->kind != VP_OP_ATTENTION || ai == VP_ATTN_EAGER ||
        ai == VP_ATTN_MATH || s->precision == VP_PREC_FP32 ||
        o->n_inputs >= 4 || fused_impl(x, ai) != VP_HW_ATTN_CUDNN)
        return 0;
    return CUDNN_BWD_HELPERS;
}

/* SDPA's math path (aten/src/ATen/native/transformers/attention.cpp
 * _scaled_dot_product_attention_math, torch 2.11), which the simulator
 * runs for fp32 grouped-KV attention and an additive bias that needs a
 * gradient (ops/attention.c vp__attention_impl_of): its batched GEMMs on
 * the fp32 curve (16-bit inputs are upcast first), two forward, four
 * backward (MmBackward of each: grad @ v^T, probs^T @ grad, grad_s @ k,
 * grad_s^T @ q), and its memory-bound kernels by class, bytes moved per
 * element of the scores (sc, fp32) or of q (qn): forward the mask or bias
 * added in place (8 sc, a broadcast operand), _safe_softmax (softmax 8
 * sc, isneginf 5, the rows' all() 1, where 9), dropout (9 sc), the
 * scalings of q and k (8 qn each), enable_gqa's repeat_interleave of k
 * and v, the upcasts and the casts back, and HF's transpose(1, 2).
 * contiguous() of the output; backward the gradient made contiguous
 * through that transpose, dropout's and where's backward (9 sc each),
 * softmax's (12 sc), the scalings, the repeats summed back, a bias's
 * gradient summed over the batch (4 sc). Its allocations are not timed
 * one by one (on_event: the attention op's memory-bound time is here). */
static void math_time(const tctx *x, const vp_setup *s, const vp_op *o,
                      int ce, double *f, double *b)
{
    const vp_curve *g = &x->hw->gemm[VP_HW_FP32];
    double bh = (double)o->shape[0] * (double)o->heads;
    double q = (double)o->q_len, kv = (double)o->kv_len;
    double d = (double)o->head_dim, sc = bh * q * kv, qn = bh * q * d;
    double kvn = (double)o->shape[0] * (double)o->kv_heads * kv * d;
    bool gqa = o->kv_heads && o->kv_heads < o->heads &&
               !(o->flags & VP_OPF_TORCH_MHA);
    bool mask = o->causal || o->n_inputs >= 4, up = ce != 4;
    bool drop = !s->inference && o->dropout > 0;
    double tr = vp__layout_transpose_copy(ce == 4) * 2.0 * ce * qn;
    double gap = x->gap;
    *f = gemm_gpu(g, gap, bh * q, kv, d) + gemm_gpu(g, gap, bh * q, d, kv);
    *b = gemm_gpu(g, gap, bh * q, kv, d) + gemm_gpu(g, gap, bh * kv, d, q) +
         gemm_gpu(g, gap, bh * q, d, kv) + gemm_gpu(g, gap, bh * kv, d, q);
    double fm = (mask ? kernel_time(x, VP_HW_MEM_ADD,
                                    8 * sc * vp__layout_broadcast(true))
                      : 0) +
                kernel_time(x, VP_HW_MEM_SOFTMAX, 8 * sc) +
                kernel_time(x, VP_HW_MEM_ADD, 5 * sc) +
                kernel_time(x, VP_HW_MEM_COPY, sc) +
                kernel_time(x, VP_HW_MEM_ADD, 9 * sc) +
                2 * kernel_time(x, VP_HW_MEM_ADD, 8 * qn) +
                kernel_time(x, VP_HW_MEM_COPY, tr);
    double bm = kernel_time(x, VP_HW_MEM_ADD, 9 * sc) +
                kernel_time(x, VP_HW_MEM_SOFTMAX, 12 * sc) +
                2 * kernel_time(x, VP_HW_MEM_ADD, 8 * qn) +
                kernel_time(x, VP_HW_MEM_COPY, tr);
    if (drop) {
        fm += kernel_time(x, VP_HW_MEM_ADD, 9 * sc);
        bm += kernel_time(x, VP_HW_MEM_ADD, 9 * sc);
    }
    if (gqa) {
        fm += 2 * kernel_time(x, VP_HW_MEM_COPY, 4 * (qn + kvn));
        bm += 2 * kernel_time(x, VP_HW_MEM_COPY, 4 * (qn + kvn));
    }
    if (up) { /* q, k, v to fp32 and back; the output and weights down */
        double n = qn + 2 * kvn;
        fm += kernel_time(x, VP_HW_MEM_CAST, 6 * n) +
              kernel_time(x, VP_HW_MEM_CAST, 6 * (qn + sc));
        bm += kernel_time(x, VP_HW_MEM_CAST, 6 * (qn + n));
    }
    if (o->n_inputs >= 4)
        bm += kernel_time(x, VP_HW_MEM_COPY, 4 * sc);
    *f += fm;
    *b += bm;
}

/* The op whose allocation op i's output is: i itself, or through the
 * views (reshape, permute, flatten) that allocate nothing, the op they
 * view. */
static uint32_t viewed_op(const tctx *x, uint32_t i)
{
    for (uint32_t d = 0; d < x->g->n_ops && i < x->g->n_ops; d++) {
        const vp_op *o = &x->g->ops[i];
        if ((x->t[i].act_bytes > 0 && o->numel) ||
            (o->kind != VP_OP_RESHAPE && o->kind != VP_OP_PERMUTE &&
             o->kind != VP_OP_FLATTEN) ||
            o->n_inputs == 0)
            return i;
        i = o->inputs[0];
    }
    return i;
}

/* Bytes an element of op i's output: its largest forward allocation
 * but autocast's casts (viewed_op); 0 where none is known. */
static double elem_bytes(const tctx *x, uint32_t i)
{
    i = viewed_op(x, i);
    if (i >= x->g->n_ops || x->t[i].act_bytes <= 0 || !x->g->ops[i].numel)
        return 0;
    return x->t[i].act_bytes / (double)x->g->ops[i].numel;
}

/* Whether op i's output is fp32 under autocast: its element width from
 * the simulation (elem_bytes), where autocast did not make it: a
 * linear's and a LoRA adapter's outputs are in the autocast dtype
 * (peft's base + B(A(x)) * scaling, all 16-bit). */
static bool amp_fp32_out(const tctx *x, uint32_t i)
{
    i = viewed_op(x, i);
    if (i >= x->g->n_ops)
        return false;
    const vp_op *o = &x->g->ops[i];
    if (o->kind == VP_OP_LORA ||
        (o->kind == VP_OP_LINEAR && !(o->flags & VP_OPF_FP32_LINEAR)))
        return false;
    return elem_bytes(x, i) == 4.0;
}

/* SDPA under autocast (aten/src/ATen/autocast_mode.cpp: lower_precision_fp
 * ops, cached_cast) casts each fp32 one of q, k, v to the 16-bit dtype
 * before the fused kernel: a copy kernel per tensor, 4 bytes read and 2
 * written an element (ATen's vectorized bfloat16_copy_kernel_cuda: the
 * copy class's rate); the backward's ToCopyBackward0 casts its gradient
 * back up (2 read, 4 written; the unrolled direct_copy_kernel_cuda: the
 * to_fp32 sweep's rate) where the tensor needs one. The simulator
 * allocates the casts to the attention op, whose fused allocations
 * on_event does not time one by one. fp32 q and k: HF's RoPE over an fp32
 * residual stream (modeling_llama.py LlamaRotaryEmbedding.forward: cos and
 * sin in the hidden states' dtype), Qwen3's norms of q and k with fp32
 * weights (docs/STEP_TIME.md "Autocast's casts of q, k, v"). */
static void fused_casts(const tctx *x, const vp_setup *s, const vp_op *o,
                        double *f, double *b)
{
    if (s->precision != VP_PREC_AMP_BF16 && s->precision != VP_PREC_AMP_FP16)
        return;
    for (uint32_t j = 0; j < o->n_inputs && j < 3; j++) {
        uint32_t in = o->inputs[j];
        if (in >= x->g->n_ops || !amp_fp32_out(x, in))
            continue;
        double n = (double)x->g->ops[in].numel;
        *f += kernel_time(x, VP_HW_MEM_COPY, 6.0 * n);
        if (x->g->ops[in].needs_grad)
            *b += kernel_time(x, VP_HW_MEM_CAST, 6.0 * n);
    }
}

/* The attention core's seconds: the kernel the simulator runs (sim.c
 * attn_impl_of: the user's choice or the model's). Eager attention is two
 * batched matmuls over the whole (masked) score matrix; SDPA on fp32
 * inputs the memory-efficient kernel in fp32 (CUDA-core FMA,
 * fmha_cutlassF/B_f32) at its measured shares of the fp32 GEMM peak
 * (VP_ATTN_FP32_FWD_SHARE, _BWD_); on 16-bit inputs cuDNN's kernel on
 * Hopper and later (x->sdpa_cudnn), flash before, at their curves. */
static void attention_time(const tctx *x, const vp_setup *s, const vp_op *o,
                           double *f, double *b)
{
    const vp_hw *hw = x->hw;
    vp_attn_impl ai = s->attn_set ? s->attn : o->attn_impl;
    int ce = s->precision == VP_PREC_FP32 ? 4 : 2;
    vp_attn_impl runs = vp__attention_impl_of(x->g, s, o, (uint8_t)ce);
    if (ai == VP_ATTN_SDPA && runs == VP_ATTN_MATH) {
        math_time(x, s, o, ce, f, b);
        return;
    }
    if (ai == VP_ATTN_EAGER || ai == VP_ATTN_MATH) {
        const vp_curve *c = &hw->gemm[gemm_dtype(s->precision)];
        double bh = (double)o->shape[0] * (double)o->heads;
        double q = (double)o->q_len, kv = (double)o->kv_len;
        double d = (double)o->head_dim;
        *f = gemm_gpu(c, x->gap, bh * q, kv, d) +
             gemm_gpu(c, x->gap, bh * q, d, kv);
        *b = 2.0 * *f;
        return;
    }
    if (s->precision == VP_PREC_FP32) {
        double r = hw->gemm[VP_HW_FP32].peak;
        /* the memory-efficient kernel in fp32, over its blocks' work */
        double wf = o->flops_fwd * attn_blocks(VP_HW_ATTN_EFFICIENT, 0, o);
        double wb = o->flops_bwd * attn_blocks(VP_HW_ATTN_EFFICIENT, 1, o);
        *f = r > 0 ? wf / (VP_ATTN_FP32_FWD_SHARE * r) : 0;
        *b = r > 0 ? wb / (VP_ATTN_FP32_BWD_SHARE * r) : 0;
        return;
    }
    int impl = fused_impl(x, ai);
    bool drop = !s->inference && o->dropout > 0;
    *f = attn_call_time(hw, impl, 0, o, drop);
    *b = attn_call_time(hw, impl, 1, o, drop);
    fused_casts(x, s, o, f, b);
    /* HF's copy of the output out of the kernel's [B, h, L, d] layout
     * (vp__attention_out_copied: Phi-3's head width 96, MLA's v width),
     * a write the simulator allocates to the op: the transposed copy's
     * rate (docs/STEP_TIME.md "Memory-bound kernels by input layout") */
    const vp_curve *cp = &hw->mem_kind[VP_HW_MEM_COPY];
    if (cp->peak > 0 && vp__attention_out_copied(o, runs))
        *f += 2.0 * (double)o->numel * ce *
                  vp__layout_transpose_copy(false) / cp->peak +
              x->own;
}

/* The routed experts' GEMMs of op o in phase ph (timing_host.c): the
 * grouped kernel on Hopper and later, the profiles with a cuDNN attention
 * rate (sdpa_cudnn: sm90+, as torch._grouped_mm's fast path asks). */
static void moe_gemms(const tctx *x, const vp_setup *s, const vp_op *o,
                      int ph, vp__moe_gemms *m)
{
    const vp_graph *g = x->g;
    bool grads[2] = {
        o->needs_grad && o->n_inputs && g->ops[o->inputs[0]].needs_grad,
        o->needs_grad && o->n_params && g->params[o->params[0]].trainable};
    vp__moe_gemms_of(x->hw, o, s->precision, x->sdpa_cudnn, x->gap, ph, grads,
                     m);
}

/* HF's RoPE on one of q, k: the bytes of apply_rotary_pos_emb's kernels
 * and its backward's, each at the elementwise rate times its layout's
 * ratio, not only its allocations' (the rules allocate 3 of the
 * forward's 5 kernels and 2 of the backward's 9), and the allocations'
 * fixed time (vp__rope_bytes; docs/STEP_TIME.md "RoPE by its kernels").
 * The rotated tensor's width is its input's (q's: a linear's or a
 * norm's output), the result's the op's own (the wider of q and cos). */
static void rope_time(const tctx *x, const vp_op *o, double *f, double *b)
{
    const vp_curve *m = &x->hw->mem_kind[VP_HW_MEM_ADD];
    double n = (double)o->numel, kf, kb;
    if (m->peak <= 0 || n <= 0)
        return;
    double out = elem_bytes(x, (uint32_t)(o - x->g->ops));
    double in = o->n_inputs ? elem_bytes(x, o->inputs[0]) : 0;
    if (out <= 0)
        out = 2.0;
    if (in <= 0)
        in = out;
    *f = vp__rope_bytes(n, in, out, 0, &kf) / m->peak + kf * x->own;
    *b = vp__rope_bytes(n, in, out, 1, &kb) / m->peak + kb * x->own;
}

/* Cross-entropy's kernels. The sweep's op (scripts/h200_sweeps.py
 * sweep_membound): F.cross_entropy(logits.float(), labels) on 16-bit
 * logits, its bytes 2 per logit: the upcast HF's causal-LM loss makes,
 * log_softmax and nll_loss in fp32; its backward (nll, log_softmax and
 * the cast's backward) about one such pass. fp32 logits skip the cast (6
 * bytes a logit at the to_fp32 rate).
 *
 * A loss on 16-bit logits as they are under autocast (BertForMaskedLM's
 * and T5's CrossEntropyLoss; ops/embed_loss.c loss_terms) runs other
 * kernels: cross_entropy is CompositeImplicit, and
 * aten/src/ATen/native/LossNLL.cpp cross_entropy_loss_symint calls
 * at::log_softmax(self, class_dim, self.scalar_type()), a dtype given, so
 * autocast's fp32_set_opt_dtype policy (aten/src/ATen/autocast_mode.cpp)
 * leaves it 16-bit; nll_loss, on autocast's fp32 list, copies the log-
 * probabilities to fp32. The backward: nll_loss_backward zeroes an fp32
 * gradient (a fill), ToCopyBackward casts it back, log_softmax_backward
 * runs in 16 bits. The H200 profile of bert-base AMP b32 ran exactly
 * those (calibrate/profiles/h200-kernels-byname.jsonl: cunn_SoftMaxForward
 * and cunn_SoftMaxBackward <8, BFloat16, float, BFloat16>, 0.911 and
 * 0.907 ms over 16384 x 30522 logits; an fp32 fill, 0.45 ms; nll_loss's
 * kernels on float, 0.04 ms). Timed by measured rates: the log-softmax
 * at half the sweep's fp32 pass (the sweep's op less its cast, 8 bytes a
 * logit read and written where 16 bits move 4), the casts (6 bytes) at
 * the to_fp32 rate, the fill (4 bytes) at the copy rate, each kernel its
 * own start. */
static void ce_time(const tctx *x, const vp_setup *s, const vp_op *o,
                    double *f, double *b)
{
    const vp_hw *hw = x->hw;
    double rc = (double)o->rows * (double)o->classes;
    const vp_curve *ce = &hw->mem_kind[VP_HW_MEM_CROSS_ENTROPY];
    const vp_curve *cast = &hw->mem_kind[VP_HW_MEM_CAST];
    const vp_curve *cp = &hw->mem_kind[VP_HW_MEM_COPY];
    double t = ce->peak > 0 ? 2.0 * rc / ce->peak : 0;
    double up = cast->peak > 0 ? 6.0 * rc / cast->peak : 0;
    bool amp = s->precision == VP_PREC_AMP_BF16 ||
               s->precision == VP_PREC_AMP_FP16;
    double eb = o->n_inputs ? elem_bytes(x, o->inputs[0]) : 0;
    if (amp && !o->upcast_logits && eb == 2.0 && up < t && cp->peak > 0) {
        double ls = (t - up) / 2.0; /* one 16-bit log-softmax pass */
        *f = ls + up + 3.0 * x->own;
        *b = 4.0 * rc / cp->peak + up + ls + 4.0 * x->own;
        return;
    }
    if (s->precision == VP_PREC_FP32 && up < t)
        t -= up;
    *f = *b = t + x->gap;
}

/* Forward and backward matmul seconds of one op. */
static void matmul_time(const tctx *x, const vp_setup *s, const vp_op *o,
                        double *f, double *b)
{
    const vp_hw *hw = x->hw;
    double gap = x->gap;
    *f = *b = 0;
    if (o->kind == VP_OP_LINEAR && o->out_features && o->in_features) {
        linear_time(x, s, o, f, b);
    } else if (o->kind == VP_OP_CONV2D ||
               o->kind == VP_OP_CONV_TRANSPOSE2D) {
        conv_time(hw, s, o, gap, f, b);
    } else if (o->kind == VP_OP_BATCHNORM2D) {
        /* NCHW batch norm in training mode by its shape (bn_fit) */
        const vp_curve *cp = &hw->mem_kind[VP_HW_MEM_COPY];
        int path = vp__bn_path(s->precision);
        double e = (double)o->numel, c = (double)o->rows, px = 1;
        for (uint32_t d = 2; d < o->ndim; d++)
            px *= (double)o->shape[d];
        *f = cp->peak > 0 ? vp__bn_bytes(path, false, e, c, px) / cp->peak +
                                gap
                          : 0;
        *b = cp->peak > 0 ? vp__bn_bytes(path, true, e, c, px) / cp->peak +
                                gap
                          : 0;
    } else if (o->kind == VP_OP_ATTENTION) {
        attention_time(x, s, o, f, b);
    } else if (o->kind == VP_OP_RMSNORM && (o->flags & VP_OPF_PY_RMSNORM)) {
        /* HF's RMSNorm in Python: the sweep's rate per byte of its
         * kernels, by its input's width (the input op's output, not
         * autocast's cast of its weight); the backward retraces it
         * twice */
        double w = 2.0;
        uint32_t in = o->n_inputs ? o->inputs[0] : UINT32_MAX;
        if (in < x->g->n_ops && x->g->ops[in].numel)
            w = x->t[in].act_bytes / (double)x->g->ops[in].numel;
        double e = vp__rmsnorm_py_bytes(w) / 2.0;
        const vp_curve *r = &hw->mem_kind[VP_HW_MEM_RMSNORM_PY];
        double t = (r->peak > 0 ? 2.0 * (double)o->numel * e / r->peak : 0) +
                   gap;
        *f = t;
        *b = 2.0 * t;
    } else if (o->kind == VP_OP_ROPE) {
        rope_time(x, o, f, b);
    } else if (o->kind == VP_OP_LORA) {
        lora_time(x, s, o, f, b);
    } else if (o->kind == VP_OP_MOE_EXPERTS) {
        vp__moe_gemms m;
        moe_gemms(x, s, o, 0, &m);
        *f = vp__moe_gemms_gpu(&m);
        moe_gemms(x, s, o, 1, &m);
        *b = vp__moe_gemms_gpu(&m);
    } else if (o->kind == VP_OP_CROSS_ENTROPY) {
        ce_time(x, s, o, f, b);
    }
}

/* The optimizer step's GPU seconds (its state streamed through memory,
 * the sweep's bytes per parameter) and host seconds (the host model's
 * fixed cost and its cost per tensor); *unscale gets GradScaler's
 * unscale-and-check pass (amp fp16), after which the host waits for the GPU
 * (found_inf read with .item(), torch/amp/grad_scaler.py _maybe_opt_step). */
static void optimizer_cost(const vp_graph *g, const vp_setup *s,
                           const vp_hw *hw, double *gpu, double *cpu,
                           double *unscale)
{
    double params = 0, tensors = 0;
    for (size_t p = 0; p < g->n_params; p++)
        if (g->params[p].trainable) {
            params += (double)g->params[p].numel;
            tensors += 1;
        }
    int v;
    switch (s->optimizer) {
    case VP_OPT_ADAMW_FUSED:
        v = VP_HW_OPTIM_ADAMW_FUSED;
        break;
    case VP_OPT_ADAMW_FORLOOP:
    case VP_OPT_ADAFACTOR:
    case VP_OPT_ADAMW_8BIT:
        v = VP_HW_OPTIM_ADAMW_FORLOOP;
        break;
    case VP_OPT_SGD:
    case VP_OPT_SGD_PLAIN:
        v = VP_HW_OPTIM_SGD;
        break;
    default:
        v = VP_HW_OPTIM_ADAMW;
        break;
    }
    int half = s->precision == VP_PREC_BF16 || s->precision == VP_PREC_FP16;
    const vp_optim_cost *oc = &hw->optim[v][half];
    *gpu = params * oc->bytes_per_param / hw->optim_bw +
           tensors * oc->gpu_us * 1e-6;
    /* bitsandbytes' 8-bit step loops over the tensors in Python with one
     * kernel each (bitsandbytes/optim/optimizer.py Optimizer8bit.step,
     * update_step): unmeasured, taken at foreach's per-tensor cost rather
     * than the for-loop's dozen launches */
    int hv = s->optimizer == VP_OPT_ADAMW_8BIT ? VP_HW_OPTIM_ADAMW : v;
    *cpu = hw->host_opt + tensors * hw->host_opt_tensor[hv];
    *unscale = 0;
    if (s->precision == VP_PREC_AMP_FP16) {
        /* the fp32 gradients read and written once */
        const vp_curve *a = &hw->mem_kind[VP_HW_MEM_ADD];
        *unscale = a->peak > 0 ? params * 8.0 / a->peak : 0;
    }
}

static bool checkpointed(const vp_setup *s, const vp_op *o)
{
    return !s->inference && o->segment >= 0 && s->checkpoint &&
           (size_t)o->segment < s->n_checkpoint && s->checkpoint[o->segment];
}

/* The recomputed forward of op i: PyTorch's non-reentrant checkpoint stops
 * once the tensors the backward needs exist again (early stop, torch/
 * utils/checkpoint.py), so a segment's trailing matmuls, whose backward
 * needs only their inputs, and its last add are not run again. */
static bool recomputed(const vp_graph *g, const vp_setup *s, size_t i)
{
    const vp_op *o = &g->ops[i];
    if (!checkpointed(s, o))
        return false;
    for (size_t j = i; j < g->n_ops && g->ops[j].segment == o->segment;
         j++) {
        vp_op_kind k = g->ops[j].kind;
        if (k != VP_OP_LINEAR && k != VP_OP_CONV2D && k != VP_OP_ADD)
            return true; /* something after it is still to be saved */
    }
    return false;
}

/* Seconds of op o's memory-bound kernels in phase ph of one micro-batch
 * from its source's kernels (vp__moe_experts_mem): the tokens' width
 * from the simulation, the experts' their parameters' (16-bit in a 16-bit
 * model, fp32 otherwise), the weighted outputs' the wider of the experts'
 * and the routing weights' (DeepSeek-V3's router scores in fp32:
 * modeling_deepseek_v3.py DeepseekV3TopkRouter.forward). */
static double moe_mem_phase(const tctx *c, const vp_setup *s,
                            const vp_op *o, int ph)
{
    double p = s->precision == VP_PREC_BF16 || s->precision == VP_PREC_FP16
                   ? 2.0
                   : 4.0;
    double x = elem_bytes(c, o->inputs[0]);
    bool fp32_router = o->inputs[1] < c->g->n_ops &&
                       (c->g->ops[o->inputs[1]].flags & VP_OPF_ROUTER_GROUP);
    double eb[3] = {x > 0 ? x : p, p, fp32_router ? 4.0 : p};
    vp__mem_kernel k[VP__MOE_MEM_KERNELS];
    double small, t = 0;
    size_t n = vp__moe_experts_mem(c->g, o, ph, eb, k, &small);
    for (size_t j = 0; j < n; j++)
        t += kernel_time(c, k[j].kind,
                         k[j].bytes * vp__layout_of(k[j].layout, k[j].kind,
                                                    k[j].wide));
    return t + small * c->gap;
}

/* The routed experts' memory-bound kernels of every micro-batch, the
 * recomputed forward's in the backward (source_timed). */
static void moe_mem(tctx *c, const vp_setup *s, double micro_batches)
{
    for (size_t i = 0; i < c->g->n_ops; i++) {
        const vp_op *o = &c->g->ops[i];
        if (!source_timed(o))
            continue;
        double f = moe_mem_phase(c, s, o, 0);
        c->t[i].mem[0] = micro_batches * f;
        c->t[i].mem[1] = 0;
        if (s->inference || !o->needs_grad)
            continue;
        c->t[i].mem[1] = micro_batches * (moe_mem_phase(c, s, o, 1) +
                                          (recomputed(c->g, s, i) ? f : 0));
    }
}

/* The step's launch queue (docs/STEP_TIME.md): one host thread submits
 * each op's kernels in turn, a forward kernel through Python (host_fwd
 * each, the module call and the model's code included), a backward kernel
 * from autograd's engine (host_bwd); the GPU runs them as they arrive.
 * Where the GPU is the slower, the host runs ahead and its later work
 * (the next micro-batch, the optimizer's Python) hides behind the GPU's;
 * where the host is the slower, the GPU idles. */
typedef struct {
    const vp_graph *g;
    const vp_setup *s;
    const vp_hw *hw;
    const tctx *c;
    double mb;      /* micro-batches per step (the simulation's totals / mb) */
} qctx;

typedef vp__clocks clocks; /* timing_host.h */

/* Kernels the host issues for an op in phase ph of one of mb micro-batches:
 * its allocations, and one for a forward call that writes in place
 * (torchvision's ReLU(inplace=True), ResNet's `out += identity`); views
 * and the input launch nothing. */
static double host_kernels(const vp_op *o, const op_traffic *t, int ph,
                           double mb)
{
    if (ph != 0 || t->kernels[0] > 0)
        return t->kernels[ph] / mb;
    switch (o->kind) {
    case VP_OP_INPUT:
    case VP_OP_FLATTEN:
    case VP_OP_RESHAPE:
    case VP_OP_PERMUTE:
    case VP_OP_SELECT:
        return 0;
    default:
        return 1;
    }
}

/* The kernels op o launches in phase ph of one micro-batch beyond its
 * allocations (its family's launch rule, src/ops/; docs/STEP_TIME.md
 * "Launches"), in a phase whose rules ran. Its activations are fp32 in
 * fp32 and under autocast over an fp32 base. */
static double op_launches(const qctx *q, const vp_op *o, const op_traffic *t,
                          int ph)
{
    vp__launch_fn *f = vp__op_table[o->kind].launches;
    if (f == NULL || t->kernels[ph] <= 0)
        return 0;
    vp_precision p = q->s->precision;
    vp_base_dtype b = q->s->ft.base_dtype;
    bool amp = p == VP_PREC_AMP_BF16 || p == VP_PREC_AMP_FP16;
    bool wide = p == VP_PREC_FP32 ||
                (amp && (b == VP_BASE_AUTO || b == VP_BASE_FP32));
    return f(q->g, o, ph, wide);
}

/* The kernels a linear's GEMMs launch in phase ph of one micro-batch
 * beyond one each (linear_extra), in a phase whose rules ran. */
static double gemm_launches(const qctx *q, const vp_op *o,
                            const op_traffic *t, int ph)
{
    if (o->kind != VP_OP_LINEAR || !o->out_features || !o->in_features ||
        t->kernels[ph] <= 0 || (ph == 1 && (q->s->inference || !o->needs_grad)))
        return 0;
    double g;
    return linear_extra(q->c, q->s, o, ph, &g);
}

/* The host's cost of op o's GEMM calls in phase ph of one micro-batch
 * beyond their launches, in launches of the phase (docs/STEP_TIME.md
 * "The host per op"): a GEMM's backward node, a linear's MmBackward0
 * (VP__HOST_GEMM_NODE). A LoRA adapter has two (lora_A's, lora_B's);
 * DoRA's weight norm is detached (peft/tuners/lora/dora.py
 * DoraLinearLayer.forward), so its eye GEMMs have none, but under
 * dropout the base layer it runs again on the dropped input has one
 * where that input needs a gradient. */
static double op_calls(const qctx *q, const vp_op *o, const op_traffic *t,
                       int ph)
{
    if (ph != 1 || t->kernels[1] <= 0 || q->s->inference || !o->needs_grad)
        return 0;
    if (o->kind == VP_OP_LINEAR && o->out_features && o->in_features)
        return VP__HOST_GEMM_NODE;
    if (o->kind != VP_OP_LORA)
        return 0;
    bool xg = o->n_inputs && q->g->ops[o->inputs[0]].needs_grad;
    bool again = o->n_params >= 3 && o->dropout > 0 && xg;
    return (again ? 3.0 : 2.0) * VP__HOST_GEMM_NODE;
}

/* The launches of op i's forward that the backward runs again in one
 * micro-batch, at most nk (its backward's launches, which hold them):
 * none where the recomputation's early stop does not reach it
 * (recomputed). */
static double recomputed_launches(const qctx *q, size_t i, double nk)
{
    if (!recomputed(q->g, q->s, i))
        return 0;
    const vp_op *o = &q->g->ops[i];
    const op_traffic *t = &q->c->t[i];
    double kr = t->kernels[0] / q->mb + op_launches(q, o, t, 0) +
                gemm_launches(q, o, t, 0);
    return kr < nk ? kr : nk;
}

/* The host seconds of checkpointed op i in phase ph of one micro-batch
 * beyond nk launches at the phase's cost (torch/utils/checkpoint.py,
 * non-reentrant; docs/STEP_TIME.md "Checkpointed steps on the host").
 * The hooks run per saved tensor, and the tensors the op saves are those
 * its recomputation saves (op_traffic.saved): in the forward each goes
 * through _checkpoint_hook's pack_hook (a _Holder, its weakref, the
 * tensor's metadata for the determinism check: VP__HOST_CKPT_PACK); in
 * the backward each is packed again by _recomputation_hook's pack_hook
 * and taken by _checkpoint_hook's unpack_hook (VP__HOST_CKPT_RECOMPUTE),
 * also past the early stop, whose last tensors are packed before their
 * op's kernel runs. The first unpack runs the segment's forward again
 * (the module's Python): its launches cost host_fwd, not host_bwd. */

static double ckpt_host(const qctx *q, int ph, size_t i, double nk)
{
    double sv = q->c->t[i].saved / q->mb;
    if (ph == 0)
        return sv * VP__HOST_CKPT_PACK * vp__host_scale(q->hw);
    return sv * VP__HOST_CKPT_RECOMPUTE * vp__host_scale(q->hw) +
           recomputed_launches(q, i, nk) * (q->hw->host_fwd - q->hw->host_bwd);
}

/* The host's kernels for op i in phase ph of one micro-batch (*nk), its
 * seconds per kernel (*per) and its GEMM calls' cost beyond them in
 * launches (*calls, op_calls). A forward kernel costs host_fwd, a
 * backward one host_bwd, and so does a call's unit; a checkpointed op's
 * hooks and recomputation are in *per (ckpt_host). */
static void host_cost(const qctx *q, int ph, size_t i, double *nk,
                      double *per, double *calls)
{
    const vp_op *o = &q->g->ops[i];
    const op_traffic *t = &q->c->t[i];
    const vp_hw *hw = q->hw;
    *nk = host_kernels(o, t, ph, q->mb) + op_launches(q, o, t, ph) +
          gemm_launches(q, o, t, ph);
    if (ph == 1) /* the gradient sums into its output; cuDNN's helpers */
        *nk += t->sums +
               (t->kernels[1] > 0 ? cudnn_bwd_launches(q->c, q->s, o) : 0);
    *per = ph == 0 ? hw->host_fwd : hw->host_bwd;
    *calls = *nk > 0 ? op_calls(q, o, t, ph) : 0;
    if (*nk <= 0)
        return;
    double host = (*nk + *calls) * *per; /* a unit at the launch cost */
    if (checkpointed(q->s, o))
        host += ckpt_host(q, ph, i, *nk);
    *per = host / *nk;
}

/* GPU seconds of op i in phase ph of one micro-batch, the kernels the
 * host issues for it (*nk) and its host seconds per kernel (*per); *rec
 * gets the recomputed forward's share. */
static double op_cost(const qctx *q, int ph, size_t i, double *nk,
                      double *per, double *rec, double *calls)
{
    const vp_op *o = &q->g->ops[i];
    const op_traffic *t = &q->c->t[i];
    double mf, mbk;
    matmul_time(q->c, q->s, o, &mf, &mbk);
    /* an op whose output needs no gradient (frozen layers before the
     * first trainable one) has no backward */
    double gpu = ph == 0 ? mf : q->s->inference || !o->needs_grad ? 0 : mbk;
    *rec = ph == 1 && recomputed(q->g, q->s, i) ? mf : 0;
    gpu += *rec + t->mem[ph] / q->mb;
    host_cost(q, ph, i, nk, per, calls);
    return gpu;
}

/* An MoE experts op on the clocks: its routing and elementwise kernels
 * (the allocations), then its grouped GEMMs (timing_host.c), the
 * recomputed forward's first in a checkpointed backward. */
static void moe_phase(const qctx *q, int ph, size_t i, bool rec, double gpu,
                      double nk, double per, clocks *k)
{
    const vp_op *o = &q->g->ops[i];
    vp__moe_gemms m[2];
    moe_gemms(q->c, q->s, o, 0, &m[0]);
    moe_gemms(q->c, q->s, o, 1, &m[1]);
    double mm = vp__moe_gemms_gpu(&m[ph]);
    if (rec)
        mm += vp__moe_gemms_gpu(&m[0]);
    vp__host_issue(k, nk, per, gpu > mm ? gpu - mm : 0);
    if (rec)
        vp__moe_gemms_run(&m[0], k);
    vp__moe_gemms_run(&m[ph], k);
}

/* One phase of one micro-batch on the clocks; returns the GPU seconds of
 * its recomputed forward. */
static double run_phase(const qctx *q, int ph, clocks *k)
{
    double rec = 0;
    for (size_t n = 0; n < q->g->n_ops; n++) {
        size_t i = ph == 0 ? n : q->g->n_ops - 1 - n;
        double nk, per, r, calls;
        double gpu = op_cost(q, ph, i, &nk, &per, &r, &calls);
        rec += r;
        bool moe = q->g->ops[i].kind == VP_OP_MOE_EXPERTS;
        if (moe && !(ph && q->s->inference)) {
            moe_phase(q, ph, i, r > 0, gpu, nk, per, k);
            continue;
        }
        /* nk is the simulator's allocation count */
        vp__host_issue(k, nk, per, gpu);
    }
    return rec;
}

/* The GPU's kernel time by kind, the host's time and the FLOPs of all
 * micro-batches. */
static void account(const qctx *q, vp_step_time *out)
{
    double flops = 0;
    for (int ph = 0; ph < (q->s->inference ? 1 : 2); ph++)
        for (size_t i = 0; i < q->g->n_ops; i++) {
            const vp_op *o = &q->g->ops[i];
            double mf, mbk, nk, per, rec, calls;
            matmul_time(q->c, q->s, o, &mf, &mbk);
            op_cost(q, ph, i, &nk, &per, &rec, &calls);
            double mm = (ph == 0 ? mf : mbk) + rec;
            if (o->kind == VP_OP_ATTENTION)
                out->attention += mm * q->mb;
            else if (o->kind == VP_OP_ROPE)
                out->memory += mm * q->mb;
            else
                out->gemm += mm * q->mb;
            flops += ph == 0 ? o->flops_fwd : o->flops_bwd;
            out->memory += q->c->t[i].mem[ph];
            out->cpu += nk * per * q->mb;
            if (o->kind == VP_OP_MOE_EXPERTS) {
                vp__moe_gemms m[2];
                moe_gemms(q->c, q->s, o, 0, &m[0]);
                moe_gemms(q->c, q->s, o, ph, &m[1]);
                out->cpu += (vp__moe_gemms_host(&m[1]) +
                             (rec > 0 ? vp__moe_gemms_host(&m[0]) : 0)) *
                            q->mb;
            }
            if (ph == 0) {
                out->host_kernels += nk;
                out->host_casts += q->c->t[i].casts / q->mb;
            } else {
                out->host_bwd_kernels += nk;
                out->host_bwd_calls += calls;
                out->host_recomputed += recomputed_launches(q, i, nk);
                if (checkpointed(q->s, o))
                    out->host_ckpt_saved += q->c->t[i].saved / q->mb;
            }
        }
    out->flops = flops * q->mb;
}

typedef struct {
    double gpu, cpu, unscale; /* optimizer_cost's terms */
    bool run;
} opt_terms;

/* The optimizer after the last backward: its kernels start once the GPU
 * is free and the host has launched them, after the step's fixed Python
 * (torch/optim/optimizer.py: the parameter groups' tensors gathered and
 * grouped by device and dtype before the first kernel); GradScaler's
 * check makes the host wait for the GPU first. Returns when the step
 * ends. */
static double run_optimizer(const qctx *q, const opt_terms *ot, clocks k)
{
    if (!ot->run)
        return k.dev > k.host ? k.dev : k.host;
    return vp__host_optimizer(&k, q->hw->dispatch, q->hw->host_opt, ot->gpu,
                              ot->cpu, ot->unscale);
}

/* The step on the clocks: the first micro-batch, the second (which
 * starts while the GPU still runs the first's backward) repeated for the
 * rest, the optimizer; the phases split for the report. */
static void timeline(const qctx *q, const opt_terms *ot, vp_step_time *out)
{
    clocks k = {0, 0};
    double fwd0 = 0, end[2] = {0, 0}, host[2] = {0, 0}, rec = 0;
    int runs = q->mb > 1 ? 2 : 1;
    for (int r = 0; r < runs; r++) {
        run_phase(q, 0, &k);
        if (r == 0)
            fwd0 = k.dev;
        if (!q->s->inference)
            rec = run_phase(q, 1, &k);
        end[r] = k.dev;
        host[r] = k.host;
    }
    if (runs == 2) {
        k.dev += (q->mb - 2) * (end[1] - end[0]);
        k.host += (q->mb - 2) * (host[1] - host[0]);
    }
    double passes = k.dev > k.host ? k.dev : k.host;
    double step = run_optimizer(q, ot, k);
    out->recompute = rec * q->mb;
    out->forward = end[0] > 0 ? passes * fwd0 / end[0] : passes;
    out->backward = passes - out->forward - out->recompute;
    if (out->backward < 0)
        out->backward = 0;
    out->optimizer = step - passes;
}

static vp_status prepare(const vp_graph *g, tctx *c, vp_error *err)
{
    size_t n = g->n_ops ? g->n_ops : 1;
    c->names = malloc(n * sizeof(char *));
    c->index = malloc(n * sizeof(uint32_t));
    c->t = calloc(n, sizeof(op_traffic));
    c->prev = calloc(n, sizeof(op_traffic));
    c->cur = calloc(n, sizeof(op_traffic));
    typedef struct {
        const char *p;
        uint32_t i;
    } pi;
    pi *tmp = malloc(n * sizeof *tmp);
    if (!c->names || !c->index || !c->t || !c->prev || !c->cur || !tmp) {
        free(tmp);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < g->n_ops; i++)
        tmp[i] = (pi){g->ops[i].name, (uint32_t)i};
    qsort(tmp, g->n_ops, sizeof *tmp, ptr_cmp);
    for (size_t i = 0; i < g->n_ops; i++) {
        c->names[i] = tmp[i].p;
        c->index[i] = tmp[i].i;
    }
    free(tmp);
    return VP_OK;
}

static vp_status step_time(const vp_graph *g0, const vp_graph *g,
                           const vp_setup *s, const vp_hw *hw0,
                           vp_step_time *out, vp_error *err);

/* The step of the graph the simulator runs: with adapters, a frozen or a
 * quantized base, the fine-tuned copy (vp__finetune_prepare): its LoRA
 * ops, its frozen weights without gradients, its trainable tensors. */
vp_status vp_step_time_estimate(const vp_graph *g, const vp_setup *s,
                                const vp_hw *hw0, vp_step_time *out,
                                vp_error *err)
{
    vp_graph *ft = NULL;
    memset(out, 0, sizeof *out);
    vp_status st = vp__finetune_prepare(g, s, &ft, err);
    if (st != VP_OK)
        return st;
    st = step_time(g, ft ? ft : g, s, hw0, out, err);
    vp_graph_free(ft);
    return st;
}

/* The host's speed: every host cost of the step at host_scale times its
 * calibration host's (a slower host issues the same launches more slowly;
 * the GPU's kernels are the same). */
static void scale_host(vp_hw *hw)
{
    double f = vp__host_scale(hw);
    hw->host_scale = f;
    if (f == 1.0)
        return;
    hw->dispatch *= f;
    hw->host_fwd *= f;
    hw->host_bwd *= f;
    hw->host_opt *= f;
    for (int o = 0; o < VP_HW_OPTIM__N; o++)
        hw->host_opt_tensor[o] *= f;
}

static vp_status step_time(const vp_graph *g0, const vp_graph *g,
                           const vp_setup *s, const vp_hw *hw0,
                           vp_step_time *out, vp_error *err)
{
    double rate = vp_hw_matmul_rate(hw0, s->precision);
    if (rate <= 0.0 || hw0->hbm <= 0.0)
        return vp_error_set(err, VP_EARG,
                            "the GPU profile '%s' has no %s rate or no "
                            "memory bandwidth",
                            hw0->name, vp_precision_name(s->precision));
    vp_hw hw = *hw0;
    vp_hw_fill_defaults(&hw);
    scale_host(&hw);
    tctx c;
    memset(&c, 0, sizeof c);
    c.g = g;
    c.hw = &hw;
    c.step = VP_STEADY_STEPS; /* the steady step is timed */
    c.gap = hw.launch > 0 ? hw.launch : VP_GPU_KERNEL_GAP;
    /* PyTorch's SDPA tries cuDNN attention first on Hopper and later
     * (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp priority
     * order, check_cudnn_hardware_support: sm90+); the H200 step profiles
     * ran cudnn_generated_fort_native_sdpa_sm90_flash kernels. gpu.c
     * gives exactly those profiles a cuDNN attention rate. */
    c.sdpa_cudnn = hw0->attn[VP_HW_ATTN_CUDNN][0].peak > 0;
    const vp_curve *cp = &hw.mem_kind[VP_HW_MEM_COPY];
    /* the sweep's fixed time less the dispatch of the host it ran on (the
     * GPU's own part does not follow the host's speed) */
    c.own = cp->peak > 0 ? cp->half / cp->peak - hw.dispatch / hw.host_scale
                         : 0;
    if (c.own < c.gap)
        c.own = c.gap;
    vp_status st = prepare(g, &c, err);
    if (st != VP_OK)
        goto done;
    vp_setup s2 = *s;
    s2.steps = VP_STEADY_STEPS;
    s2.skip_breakdown = true;
    s2.alloc.limit = 0;
    s2.alloc.device_total = 0;
    vp_estimate e;
    static const vp__sim_hooks hooks = {on_mb_start, on_repeat,
                                        on_written_by, on_saved};
    st = vp__simulate_prepared(g0, g == g0 ? NULL : g, &s2, &e, on_event, &c,
                               &hooks, err);
    if (st != VP_OK)
        goto done;
    qctx q = {g, s, &hw, &c, s->inference ? 1 : s->accum};
    inplace_kernels(&c, q.mb);
    mha_copies(&c, s, q.mb);
    moe_mem(&c, s, q.mb);
    if (!s->inference)
        grad_sums(&c, q.mb);
    account(&q, out);
    opt_terms ot = {0, 0, 0, !s->inference && s->optimizer != VP_OPT_NONE &&
                                 !s->offload_optimizer};
    if (ot.run)
        optimizer_cost(g, s, &hw, &ot.gpu, &ot.cpu, &ot.unscale);
    for (size_t p = 0; p < g->n_params; p++)
        out->host_tensors += g->params[p].trainable ? 1.0 : 0.0;
    timeline(&q, &ot, out);
    /* offloads: what crosses the host link, not overlapped with compute
     * (conservative), and the CPU optimizer's own pass */
    if (e.host_traffic && hw.host > 0)
        out->offload = (double)e.host_traffic / hw.host;
    if (s->offload_optimizer && !s->inference) {
        uint64_t params = 0;
        for (size_t p = 0; p < g->n_params; p++)
            if (g->params[p].trainable)
                params += g->params[p].numel;
        out->offload += (double)params * 16.0 / VP_HOST_ADAM_BW;
    }
    out->total = out->forward + out->backward + out->recompute +
                 out->optimizer + out->offload;
    out->mfu = out->total > 0 ? out->flops / (out->total * rate) : 0.0;
done:
    free(c.names);
    free(c.index);
    free(c.t);
    free(c.prev);
    free(c.cur);
    return st;
}
