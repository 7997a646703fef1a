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
} vp_hw;

typedef struct vp_step_time {
    double forward, backward, recompute, optimizer, offload; /* seconds   */
    double total;          /* one optimizer step (all micro-batches)        */
    double flops;          /* model FLOPs of the step (no recompute)        */
    double mfu;            /* flops / (total x peak of the compute dtype)   */
} vp_step_time;

/* Defaults of the efficiency terms for a GPU known only by its datasheet,
 * fitted once (not per case) to the step times measured on an H200 with
 * PyTorch 2.11 (shared/groundtruth, step_ms of 28 cases): large GEMMs at
 * 80 % of the datasheet peak, half that at 1e10 FLOP, elementwise kernels at
 * 80 % of the memory bandwidth. */
#define VP_HW_DEFAULT_EFF_MAX 0.8
#define VP_HW_DEFAULT_F_HALF 1e10
#define VP_HW_DEFAULT_MEM_EFF 0.8
/* Convolutions in PyTorch's default NCHW layout through cuDNN ran at about
 * 1.2 x the GPU's fp32 (non-tensor-core) peak whatever the precision: the
 * resnet50 cases of the same fit took as long in AMP bf16 and bf16 as in
 * fp32 (TF32), ~80 TFLOP/s on an H200, far below the tensor-core rates. */
#define VP_CONV_FP32_SHARE 1.2
/* A CPU AdamW step (DeepSpeed's CPUAdam) streams about 16 bytes per
 * parameter through host memory; 20 GB/s is a host-memory figure for one
 * process (documented estimate, not measured here). */
#define VP_HOST_ADAM_BW 20e9
/* PyTorch eager dispatch: host time per kernel launched from Python,
 * which bounds small kernels (same fit). */
#define VP_EAGER_OP_OVERHEAD 2e-5

/* Fill the efficiency terms a profile leaves open (eff_max >= 1 with no
 * curve, f_half 0, mem_eff >= 1) with the defaults above. */
void vp_hw_fill_defaults(vp_hw *hw);

/* Time one training step of g under setup on hw. VP_EARG when hw lacks a
 * rate for the setup's compute dtype. */
vp_status vp_step_time_estimate(const vp_graph *g, const vp_setup *setup,
                                const vp_hw *hw, vp_step_time *out,
                                vp_error *err);

/* The rate (FLOP/s) matrix work runs at under a precision (fp32 uses the
 * fp32 rate: PyTorch leaves TF32 off for matmul by default). */
double vp_hw_matmul_rate(const vp_hw *hw, vp_precision p);

#endif
