/* vramplan: the step-time model of one GPU.
 *
 * Each op is timed with a roofline: matrix work (linear, conv, attention)
 * runs at the GPU's peak rate for its dtype times an efficiency that grows
 * with the op's size, eff(f) = eff_max * f / (f + f_half); everything else
 * is bound by memory bandwidth (bytes read and written). Backward and
 * recomputation are timed the same way; the optimizer streams its state. */
#ifndef VRAMPLAN_TIMING_H
#define VRAMPLAN_TIMING_H

#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/graph.h"
#include "vramplan/sim.h"

/* A rate that saturates with the size of the work W:
 *
 *   rate(W) = peak * W^h / (W^h + half^h)
 *
 * a Hill curve: `peak` is the asymptote (FLOP/s or B/s), `half` the work
 * (FLOP or bytes) at which half of it is reached. h = 1 is a fixed cost
 * plus a peak rate, time(W) = half / peak + W / peak. peak 0 = absent. */
typedef struct vp_curve {
    double peak, half, h;
    double kh;  /* GEMMs: the inner dimension k at which the rate is halved
                   again (k / (k + kh)); 0 = none                        */
} vp_curve;

/* GEMM data types of vp_hw.gemm, in vp_gpu_dtype's order (gpu.h). */
enum { VP_HW_FP32, VP_HW_TF32, VP_HW_FP16, VP_HW_BF16, VP_HW_FP8,
       VP_HW__DTYPES };

/* Fused attention kernels of vp_hw.attn (PyTorch SDPA's backends; cuDNN is
 * also Transformer Engine's on Hopper). */
#define VP_HW_ATTN_MAP(XX)                                                 \
    XX(FLASH, "flash")                                                     \
    XX(EFFICIENT, "efficient")                                             \
    XX(CUDNN, "cudnn")
enum {
#define VP__HA(name, str) VP_HW_ATTN_##name,
    VP_HW_ATTN_MAP(VP__HA)
#undef VP__HA
    VP_HW_ATTN__N
};

/* Memory-bound kernel classes of vp_hw.mem, each with its measured
 * bandwidth: bytes read + written per second. */
#define VP_HW_MEM_MAP(XX)                                                  \
    XX(COPY, "copy")                /* copies, gathers, views made whole */ \
    XX(ADD, "add")                  /* binary elementwise              */ \
    XX(GELU, "gelu")                                                       \
    XX(SILU, "silu")                /* cheap unary activations          */ \
    XX(LAYERNORM, "layernorm")      /* fused norms                      */ \
    XX(SOFTMAX, "softmax")                                                 \
    XX(CAST, "to_fp32")             /* dtype conversions                */ \
    XX(CROSS_ENTROPY, "cross_entropy") /* per byte of logits            */ \
    XX(RMSNORM_PY, "rmsnorm_py")    /* RMSNorm written in Python (HF)   */
enum {
#define VP__HM(name, str) VP_HW_MEM_##name,
    VP_HW_MEM_MAP(VP__HM)
#undef VP__HM
    VP_HW_MEM__N
};

/* Optimizer variants of vp_hw.optim and their state dtype. */
#define VP_HW_OPTIM_MAP(XX)                                                \
    XX(ADAMW, "adamw")              /* foreach (PyTorch's default)      */ \
    XX(ADAMW_FUSED, "adamw-fused")                                         \
    XX(ADAMW_FORLOOP, "adamw-forloop")                                     \
    XX(SGD, "sgd")                  /* momentum, foreach                */
enum {
#define VP__HO(name, str) VP_HW_OPTIM_##name,
    VP_HW_OPTIM_MAP(VP__HO)
#undef VP__HO
    VP_HW_OPTIM__N
};

/* One optimizer step: the GPU streams bytes_per_param through memory and
 * pays gpu_us per tensor. cpu_us is the sweep's per-tensor term (timed
 * with a synchronize, so the longer of the host's and the GPU's); the step
 * model takes the host's cost from vp_hw.host_opt_tensor, measured on the
 * host itself. */
typedef struct vp_optim_cost {
    double bytes_per_param, gpu_us, cpu_us;
} vp_optim_cost;

typedef struct vp_hw {
    char name[64];
    uint64_t memory;       /* device bytes                                  */
    uint64_t context;      /* CUDA context + libraries outside the allocator */
    double fp32, tf32, bf16, fp16, fp8; /* dense peak FLOP/s; 0 = none      */
    double hbm;            /* memory bandwidth, B/s                         */
    double host;           /* host link, B/s per direction (pinned)         */
    double nvlink;         /* GPU-to-GPU within a node, B/s per direction   */
    double network;        /* per GPU across nodes, B/s per direction       */
    double eff_max;        /* efficiency of large GEMMs (0..1)              */
    double f_half;         /* GEMM FLOPs at which efficiency is half eff_max */
    double mem_eff;        /* fraction of hbm reached by elementwise ops    */
    double launch;         /* seconds per kernel launch                     */
    /* Rates by size (docs/STEP_TIME.md); absent curves (peak 0) are filled
     * by vp_hw_fill_defaults from the terms above. */
    vp_curve gemm[VP_HW__DTYPES]; /* matmul FLOP/s by FLOPs, burst clocks */
    vp_curve attn[VP_HW_ATTN__N][2]; /* fused attention, 16-bit, forward and
                                        backward: FLOP/s by the call's
                                        FLOPs (4bhs^2d, halved when causal;
                                        x2.5 backward)                     */
    vp_curve mem;          /* memory-bound kernels: B/s by bytes moved      */
    vp_curve mem_kind[VP_HW_MEM__N]; /* the same by kernel class          */
    vp_optim_cost optim[VP_HW_OPTIM__N][2]; /* [variant][fp32, 16-bit]    */
    double dispatch;       /* host seconds per eager PyTorch kernel (0 =
                              VP_EAGER_OP_OVERHEAD)                          */
    /* The host's cost of issuing the step (docs/STEP_TIME.md "The
     * host"); 0 = the VP_HOST_* defaults. */
    double host_fwd;       /* seconds per forward kernel issued from Python
                              (module call, the model's Python, autocast)    */
    double host_bwd;       /* seconds per backward kernel (autograd engine) */
    double host_opt;       /* seconds of the optimizer step's fixed Python  */
    double host_opt_tensor[VP_HW_OPTIM__N]; /* seconds per parameter
                               tensor by optimizer variant, all the host's
                               per-tensor work (launches, zero_grad)         */
    double sustained;      /* share of the burst GEMM rate kept when GEMMs
                              run back to back for seconds (power limit);
                              0 = 1                                          */
    double optim_bw;       /* B/s of the fused optimizer's streaming;
                              0 = mem.peak                                   */
    /* The host's speed (docs/STEP_TIME.md "The host's speed"): host_probe
     * is the host benchmark's seconds (groundtruth/collect_hostprobe.py
     * `probe`) on the host the profile's host terms were measured on (0 =
     * not measured); host_scale multiplies every host cost of the step
     * (dispatch, host_*, checkpoint's hooks): a step measured on a host
     * whose probe took p seconds is timed with host_scale p / host_probe.
     * 0 = 1. */
    double host_probe, host_scale;
} vp_hw;

typedef struct vp_step_time {
    double forward, backward, recompute, optimizer, offload; /* seconds   */
    double total;          /* one optimizer step (all micro-batches)        */
    /* the GPU's kernel time by kind, and the host's dispatch time (the
     * step takes the longer of the two in each phase) */
    double gemm, attention, memory, cpu;
    /* what the host issues in one micro-batch: forward kernels (calls that
     * write in place count one), of which autocast casts, backward
     * kernels; parameter tensors the optimizer steps */
    double host_kernels, host_casts, host_bwd_kernels, host_tensors;
    /* the host's cost of the backward's GEMM nodes beyond their launches,
     * in backward launches (docs/STEP_TIME.md "The host per op") */
    double host_bwd_calls;
    /* checkpointed segments in one micro-batch: the tensors they save for
     * the backward (each through checkpoint's hooks twice: packed in the
     * forward, packed again and unpacked in the backward) and the
     * backward's launches that run their forward again (docs/
     * STEP_TIME.md "Checkpointed steps on the host") */
    double host_ckpt_saved, host_recomputed;
    double flops;          /* model FLOPs of the step (no recompute)        */
    double mfu;            /* flops / (total x peak of the compute dtype)   */
} vp_step_time;

/* Defaults of the efficiency terms for a GPU known only by its datasheet
 * (legacy terms: a GEMM curve eff_max f / (f + f_half) where no curve and
 * no cited rate exist): large GEMMs at 80 % of the datasheet peak, half that
 * at 1e10 FLOP, elementwise kernels at 80 % of the memory bandwidth. */
#define VP_HW_DEFAULT_EFF_MAX 0.8
#define VP_HW_DEFAULT_F_HALF 1e10
#define VP_HW_DEFAULT_MEM_EFF 0.8
/* cuDNN's convolutions in NCHW (the implicit-GEMM fprop/dgrad/wgrad
 * kernels and the GEMMs it runs 1x1 convolutions as) against the GEMM
 * curve of their dtype at the same m, n, k: resnet50 on the H200
 * (calibrate/profiles/h200-kernels-byname.jsonl) 7.55 ms modelled for
 * 10.83 measured in fp32 (TF32) at batch 64, 4.08 for 5.60 in AMP bf16
 * at batch 64, 4.84 for 6.98 in the bf16 forward at batch 256: 0.70, 0.73,
 * 0.69 of the curve's rate. */
#define VP_CONV_GEMM_SHARE 0.71
/* Scaled-dot-product attention on fp32 inputs runs PyTorch's
 * memory-efficient kernel in fp32 (fmha_cutlassF_f32 / fmha_cutlassB_f32,
 * CUDA-core FMA): on the H200 (calibrate/profiles/h200-kernels-
 * byname.jsonl, gpt2-small-fp32-b8) 7.690 ms forward and 15.488 ms
 * backward over 154.6 and 386.5 GFLOP, 20.11 and 24.96 TFLOP/s: these
 * shares of the fp32 GEMM peak (50.10 TFLOP/s). */
#define VP_ATTN_FP32_FWD_SHARE 0.4013
#define VP_ATTN_FP32_BWD_SHARE 0.4982
/* A CPU AdamW step (DeepSpeed's CPUAdam) streams about 16 bytes per
 * parameter through host memory; 20 GB/s is a host-memory figure for one
 * process (documented estimate, not measured here). */
#define VP_HOST_ADAM_BW 20e9
/* PyTorch eager dispatch: host seconds per kernel launched from Python,
 * where the profile measured none: the H200 sweep's x.add_(1) loop,
 * 9.26 us (docs/STEP_TIME.md). */
#define VP_EAGER_OP_OVERHEAD 9.26e-6
/* The host model of an eager step, fitted on the H200 host's phase times
 * (calibrate/profiles/h200-host.jsonl, calibrate/fit-host.py; docs/
 * STEP_TIME.md "The host"): a forward kernel issued from Python costs
 * 31.0 us whatever the model's code (plain nn.Module or Hugging Face; an
 * autocast cast as much), a backward kernel 22.0 us (autograd's engine),
 * and a backward GEMM node's units beyond its launches as many ("The
 * host per op"),
 * the optimizer step 868 us plus, per parameter tensor, 16.93 us for
 * foreach AdamW (the for-loop, fused and SGD costs are timing.c's
 * host_opt_h200). */
#define VP_HOST_FWD_KERNEL 30.97e-6
#define VP_HOST_BWD_KERNEL 20.46e-6
#define VP_HOST_OPT_FIXED 868.4e-6
#define VP_HOST_OPT_TENSOR 16.93e-6

/* The size dependence of a GEMM curve given only its peak (a cited
 * best-shape rate): that of the H200 calibration's bf16 fit
 * (calibrate/profiles/h200.yaml: half_gflop 5.49947 at 810.225 TFLOP/s,
 * exponent 1.10282), i.e. half the peak at the work the peak does in
 * 6.79 us, and the H200 sweep's inner-dimension term (kh 207.7 in bf16,
 * docs/STEP_TIME.md). */
#define VP_HW_GEMM_HALF_S 6.79e-6
#define VP_HW_GEMM_EXPONENT 1.10282
#define VP_HW_GEMM_KH 207.7
/* torchao's dynamic float8 cast of a bf16 tensor (the tensorwise amax,
 * the fp8 data and its transpose) against a copy of the tensor, per
 * element, on the H200: under torch.compile (Inductor's kernels) 4.9534
 * ps, eager (ATen's abs, amax, float, mul, clamp, to) 23.4372, a copy
 * 0.8693 (30 linear-shaped tensors, 4096-16384 x 512-53248; calibrate/
 * profiles/h200-fp8-casts.jsonl from scripts/fp8_casts.py, fitted by
 * calibrate/fit-fp8.py). The cast moves this many times the copy's 4 B
 * an element at the copy curve. The compiled amax and row-major cast
 * alone (the forward's share) 3.4243 ps, the amax and transposed cast
 * 3.8934: the transposed cast (the backward's) is the whole less the
 * first, the row cast alone the whole less the second. */
#define VP_FP8_CAST_COMPILED 5.698
#define VP_FP8_CAST_EAGER 26.961
#define VP_FP8_CAST_ROW_AMAX 3.939
#define VP_FP8_CAST_TRANS_AMAX 4.479
/* Sustained over burst GEMM rate where nothing was measured: the H200's
 * bf16 8192^3 back to back for 0.5 s (692.252 TFLOP/s, median of ten
 * 50 ms windows) over its best burst (797.029), calibrate/README.md. */
#define VP_HW_DEFAULT_SUSTAINED 0.8685
/* Fused attention against the 16-bit GEMM curve's peak where nothing was
 * measured: FlashAttention-2 (Dao 2023, sections 4.1-4.2) reaches up to
 * 73 % of the A100's peak in the forward and 63 % in the backward, where
 * the best GEMM reaches 86.9 % (gpus/a100-80g.yaml gemm_max_tflops):
 * shares 0.84 and 0.72 (efficient: the H200's ratios to flash, 0.76 and
 * 0.54; cuDNN: taken as flash). Hopper profiles get the H200's measured
 * shares instead (gpu.c). */
#define VP_HW_ATTN_FWD_SHARE 0.84
#define VP_HW_ATTN_BWD_SHARE 0.72
/* Memory-bound kernels where nothing was measured: the copy bandwidth
 * (hbm x mem_eff), half of it for a kernel moving what the peak moves in
 * 3 us (the H200's back-to-back launch gap was 4.5 us in a VM,
 * calibrate/README.md); the other classes at the H200 sweep's ratios to
 * copy (vp_hw_mem_share). */
#define VP_HW_MEM_HALF_S 3e-6
/* GPU seconds between two kernels launched back to back where the
 * profile measured none: the H200 calibration's empty kernels, 4.53 us
 * (calibrate/profiles/h200.yaml launch_gpu_us). */
#define VP_GPU_KERNEL_GAP 4.53e-6

/* The H200 sweep's bandwidth of each memory-bound class over copy's
 * (docs/STEP_TIME.md), for GPUs that measured none. */
double vp_hw_mem_share(int kind);

/* Fill what a profile leaves open: the legacy efficiency terms (eff_max
 * >= 1 with no curve, f_half 0, mem_eff >= 1) with the defaults above,
 * then the curves: a GEMM curve without a peak gets rate x eff_max and half
 * f_half (h 1); one with a peak but no half gets VP_HW_GEMM_HALF_S,
 * VP_HW_GEMM_EXPONENT and VP_HW_GEMM_KH; attention gets the 16-bit GEMM
 * curve's shares; memory-bound kernels the copy bandwidth and the class
 * ratios; the optimizer the H200's measured costs; sustained 0 gets
 * VP_HW_DEFAULT_SUSTAINED. */
void vp_hw_fill_defaults(vp_hw *hw);

/* Seconds for work w (FLOP or bytes) on curve c: w / rate(w). 0 for
 * w <= 0 or an absent curve. */
double vp_curve_time(const vp_curve *c, double w);
/* The rate at work w. */
double vp_curve_rate(const vp_curve *c, double w);
/* Seconds of an (m x k) @ (k x n) matmul on GEMM curve c: the curve at
 * 2mnk FLOPs, slowed by (k + kh) / k. */
double vp_gemm_time(const vp_curve *c, double m, double n, double k);

/* Time one training step of g under setup on hw. VP_EARG when hw lacks a
 * rate for the setup's compute dtype. */
vp_status vp_step_time_estimate(const vp_graph *g, const vp_setup *setup,
                                const vp_hw *hw, vp_step_time *out,
                                vp_error *err);

/* The rate (FLOP/s) matrix work runs at under a precision (fp32 uses the
 * fp32 rate: PyTorch leaves TF32 off for matmul by default). */
double vp_hw_matmul_rate(const vp_hw *hw, vp_precision p);

#endif
