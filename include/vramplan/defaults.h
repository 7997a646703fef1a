/* vramplan: the framework constants, named once.
 *
 * Figures that depend on the GPU (its memory, the CUDA context, rates)
 * belong in its profile (gpus/NAME.yaml, gpu.h); these are the defaults
 * the library falls back on when no profile is given, and the constants
 * of PyTorch's protocol that do not depend on the GPU. */
#ifndef VRAMPLAN_DEFAULTS_H
#define VRAMPLAN_DEFAULTS_H

#include "vramplan/units.h"

/* The CUDA context and libraries outside PyTorch's caching allocator,
 * measured on an H200 with torch 2.11.0+cu130, CUDA 13.0, driver 580
 * (shared/groundtruth env.context_used_after_init; gpus/h200.yaml): the
 * default when no GPU profile gives one. */
#define VP__CONTEXT 718077952
#define VP_DEFAULT_CONTEXT_BYTES ((uint64_t)VP__CONTEXT)

/* The H200's streaming multiprocessors (NVIDIA H100/H200 SXM: 132 of the
 * GH100's 144; NVIDIA H100 Tensor Core GPU Architecture whitepaper), the
 * GPU the simulator's rules were measured on: the default when no GPU
 * profile gives sm_count. */
#define VP_DEFAULT_SM_COUNT 132u

/* A number of these as a string literal, for help texts:
 * VP_TEXT(VP__CONTEXT) is "718077952". */
#define VP__TEXT(x) #x
#define VP_TEXT(x) VP__TEXT(x)

/* cuBLAS workspace per handle that PyTorch allocates: 32 MiB from compute
 * capability 9.0 (Hopper), else 8519680 B (aten/src/ATen/cuda/
 * CublasHandlePool.cpp, getChosenWorkspaceSize), and cuBLASLt's 1 MiB. */
#define VP_CUBLAS_WORKSPACE_SM90 (32 * VP_MiB)
#define VP_CUBLAS_WORKSPACE_PRE_SM90 ((uint64_t)8519680)
#define VP_CUBLASLT_WORKSPACE (1 * VP_MiB)

/* Training steps simulated by default: step 1 differs from the steady
 * state (the optimizer state appears in it), and 4 is what collect.py
 * measures. */
#define VP_DEFAULT_STEPS 4

/* Two steps reach the steady state: the second has every buffer of the
 * first (optimizer state, cached blocks) and peaks no lower than later
 * ones. The searches (max batch, plan, techniques) and collect.py's
 * max-batch trials simulate or run this many. */
#define VP_STEADY_STEPS 2

#endif
