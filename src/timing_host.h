/* The host side of the single-GPU step-time model (timing_host.c; docs/
 * STEP_TIME.md "The host"): the two clocks of the launch queue, what
 * stalls the host (a device-to-host copy), and the host's part of the
 * kernels that PyTorch launches from C++ in a loop (torch._grouped_mm's
 * fallback for the MoE experts). Private to timing.c and timing_host.c. */
#ifndef VRAMPLAN_TIMING_HOST_H
#define VRAMPLAN_TIMING_HOST_H

#include <stdbool.h>

#include "internal.h"

/* The host's extra seconds per tensor a checkpointed segment saves
 * (torch/utils/checkpoint.py, non-reentrant; docs/STEP_TIME.md
 * "Checkpointed steps on the host"): in the forward,
 * _checkpoint_hook.pack_hook; in the backward, _recomputation_hook's
 * pack_hook and _checkpoint_hook's unpack_hook with their detaches and
 * the determinism check (the recomputed forward's launches cost
 * host_fwd besides). Measured by calibrate/vp-host-trace.py
 * (calibrate/profiles/h200-host-trace.jsonl): the checkpointed steps'
 * host phases against the same models' plain steps on the same host,
 * less the launches the model issues (allocations and the op families'
 * launch rules; the backward's GEMM nodes' units at a launch's cost,
 * VP__HOST_GEMM_NODE), over the tensors the simulator saves for the
 * segments (vp__save), scaled to the host of VP_HOST_FWD_KERNEL
 * (calibrate/fit-host.py ckpt; the three pairs' median). */
#define VP__HOST_CKPT_PACK 11.84e-6
#define VP__HOST_CKPT_RECOMPUTE 49.95e-6

/* The host's cost of a GEMM's backward node beyond its launches, in
 * backward launches (docs/STEP_TIME.md "The host per op"): autograd's
 * MmBackward0 (tools/autograd/derivatives.yaml mm) runs
 * mm_mat1_backward and mm_mat2_backward (torch/csrc/autograd/
 * FunctionsManual.cpp), each a transposed view and an at::mm whose
 * cuBLAS call first takes the thread's handle (aten/src/ATen/cuda/
 * CublasHandlePool.cpp getCurrentCUDABlasHandle: the device, the
 * current context, the pool's handle, cublasSetStream, the stream's
 * workspace looked up). The median over the 41 non-checkpointed cases of
 * calibrate/profiles/h200-launch-ops.jsonl of (the node's host us - its
 * launches x the same case's single-launch node's us) / that node's us,
 * each without the profiler's own cost per call
 * (calibrate/profiles/h200-host-ops.jsonl: MulBackward1's, MmBackward0's
 * of one launch or of the weight gradient's three; calibrate/fit-host.py
 * ops: quartiles 1.65 and 2.52; profiled, 1.01). */
#define VP__HOST_GEMM_NODE 2.22

/* When the host thread and the GPU are next free, seconds into the
 * step. */
typedef struct {
    double host, dev;
} vp__clocks;

/* n kernels issued at `per` host seconds each, `gpu` GPU seconds in all:
 * each starts once issued and the GPU is free. */
void vp__host_issue(vp__clocks *k, double n, double per, double gpu);

/* The host's speed against the calibration host's (hw->host_scale; 1
 * where none is set): every host cost of the step is scaled by it. */
double vp__host_scale(const vp_hw *hw);

/* A device-to-host copy (.item(), .cpu(), .tolist(), nonzero): the host
 * waits until the GPU has run everything issued so far. */
void vp__host_sync(vp__clocks *k);

/* GPU seconds of the work of a GEMM m x n x k on curve c launched among
 * others: 2mnk at the curve's peak, slowed by the inner dimension,
 * (k + k_half) / k; no gap. */
double vp__gemm_work(const vp_curve *c, double m, double n, double k);

/* GPU seconds of one GEMM m x n x k on curve c where its size, not the
 * curve's peak, decides (rank-r adapters, one expert's rows): the work at
 * the peak slowed by the inner dimension (timing.c gemm_gpu's rule) plus
 * the curve's fixed time at that size less the host's dispatch its sweep
 * point paid (as a memory-bound kernel's own time), at least the gap
 * between kernels. */
double vp__gemm_small(const vp_curve *c, double dispatch, double gap,
                      double m, double n, double k);

/* The optimizer step on the clocks; returns when the step ends. With
 * GradScaler (unscale > 0: its unscale-and-check kernel's GPU seconds) the
 * host launches the check (per: one dispatch) and waits for found_inf
 * (.item()); the optimizer's first kernel starts after its fixed Python
 * (fixed) and a dispatch; its kernels take gpu GPU seconds and cpu host
 * seconds in all. */
double vp__host_optimizer(vp__clocks *k, double per, double fixed, double gpu,
                          double cpu, double unscale);

/* cuBLAS's split-K (docs/STEP_TIME.md "cuBLAS split-K"): a GEMM whose
 * m x n output is too small to fill the GPU for its inner size k is
 * split along k, and a second kernel sums the partials
 * (cublasLt::splitKreduce_kernel, or the sm80 xmma kernel's split_k
 * pass in fp32). The region, from calibrate/profiles/
 * h200-gemm-launches.jsonl (H200, torch 2.11+cu130), the same for the
 * three layouts of a linear: 16-bit, k >= 4096 and m n <= min(2^20,
 * 32 k); fp32 (TF32 off), k >= 256 and m n <= min(2^20, 512 k). dt:
 * VP_HW_*. */
bool vp__gemm_splitk(int dt, double m, double n, double k);

/* GPU seconds of the second kernel of a split GEMM with an m x n output
 * of dtype dt: VP__SPLITK_SPLITS fp32 partials read and the output
 * written at the memory-bound kernels' peak, after the gap. */
#define VP__SPLITK_SPLITS 2.0
double vp__splitk_reduce(const vp_hw *hw, int dt, double gap, double m,
                         double n);

/* Launches of one GEMM (m x n over k, dtype dt) beyond its GEMM kernel:
 * the second kernel where it is split; *gpu gets its GPU seconds. */
double vp__gemm_extra(const vp_hw *hw, int dt, double gap, double m,
                      double n, double k, double *gpu);

/* GPU seconds of the kernels of one fp32 GEMM m x n x k among many
 * small ones launched back to back (torch._grouped_mm's fallback, one
 * mm per expert): w / (VP__GEMM_QUEUED_SHARE x the curve's peak) +
 * VP__GEMM_QUEUED_FIXED, split-K's second kernel included. Each kernel
 * costs its own duration, not the isolated sweep's fixed time (which
 * holds a dispatch and the kernel's start and tail). Fitted by
 * calibrate/fit-gemm-small.py on calibrate/profiles/h200-gemm-small.jsonl
 * (calibrate/vp-gemm-small.py: 324 fp32 torch.mm shapes, expert rows
 * 16-4,096 against twelve MoE widths, three layouts, kernels under the
 * profiler; 44.0 TFLOP/s, 0.8782 of the fp32 curve's 50.10, and 6.4 us;
 * rms log error 0.25 against the curve's 0.52, within 10 % on the
 * experts' shapes; above 1 GFLOP rms 0.19, the curve's 0.18). */
#define VP__GEMM_QUEUED_SHARE 0.8782
#define VP__GEMM_QUEUED_FIXED 6.4e-6
double vp__gemm_queued(const vp_curve *c, double m, double n, double k);

/* The host's seconds of one torch._grouped_mm call on the fallback
 * (aten/src/ATen/native/GroupedMMUtils.h _grouped_mm_fallback: offs.cpu()
 * and, per group, offs_cpu[g].item(), the slices, mat_b[g] and an
 * at::mm_out whose cuBLAS call takes the thread's handle), after its
 * sync: VP__HOST_GROUPED_CALL + groups x VP__HOST_GROUPED_GROUP at the
 * calibration host (VP_HOST_FWD_KERNEL's), scaled by its host_scale.
 * Measured in the steps by calibrate/vp-grouped-host.py (every
 * aten::_grouped_mm of the step under a TorchDispatchMode, the forward's
 * and the two of its backward node, the GPU drained before each, timed
 * to its return; calibrate/profiles/h200-grouped-host*.jsonl: 8 to 128
 * groups, fp32, three sessions) and fitted by
 * calibrate/fit-grouped-host.py, relative least squares, each call's
 * median scaled by its session's host benchmark: the cost follows the
 * groups, not the kernels (split-K's second kernels add none), and the
 * backward's calls cost what the forward's do. */
#define VP__HOST_GROUPED_CALL 220.5e-6
#define VP__HOST_GROUPED_GROUP 18.49e-6

/* The routed experts' GEMMs in one phase of one micro-batch
 * (integrations/moe.py grouped_mm_experts_forward; docs/STEP_TIME.md
 * "MoE experts"): `calls` torch._grouped_mm calls (forward: gate_up and
 * down; backward: the input and the weight gradient of each), each one
 * kernel on the fast path or `launches` mm kernels after a host sync on
 * the fallback, gpu[c] GPU seconds and host[c] host seconds each. */
enum { VP__MOE_CALLS = 4 };
typedef struct {
    int calls;
    bool fallback;
    double launches[VP__MOE_CALLS]; /* kernels of each call          */
    double gpu[VP__MOE_CALLS];  /* GPU seconds of each call          */
    double host[VP__MOE_CALLS]; /* host seconds of each call         */
} vp__moe_gemms;

/* The grouped GEMMs of op o (VP_OP_MOE_EXPERTS) in phase ph (0 forward,
 * 1 backward) at precision p on hw; `grouped` says whether the GPU runs
 * torch._grouped_mm's CUTLASS kernel (sm90 and later). gap: the GPU's
 * seconds between kernels; hw->dispatch the host's per launch of the
 * fast path, hw->host_scale the fallback's host speed. grads: the
 * backward's input gradients (the tokens need one) and weight gradients
 * (the experts are trained); a backward with neither has no call. */
void vp__moe_gemms_of(const vp_hw *hw, const vp_op *o, vp_precision p,
                      bool grouped, double gap, int ph, const bool grads[2],
                      vp__moe_gemms *out);

/* Their GPU seconds in all. */
double vp__moe_gemms_gpu(const vp__moe_gemms *m);

/* Their host seconds in all. */
double vp__moe_gemms_host(const vp__moe_gemms *m);

/* Run them on the clocks, each fallback call after its sync. */
void vp__moe_gemms_run(const vp__moe_gemms *m, vp__clocks *k);

#endif
