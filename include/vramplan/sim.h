/* vramplan: the training-step simulator.
 *
 * A step is simulated as the ordered sequence of allocations and frees that
 * PyTorch 2.11 performs (forward, backward, optimizer step, zero_grad), for
 * steps 1..N, fed through the caching-allocator model (allocator.h). The
 * result is the peak allocated and reserved bytes per phase and per step,
 * the phase of the overall peak, a breakdown by category of what is live at
 * the peak, and the layers that hold most. */
#ifndef VRAMPLAN_SIM_H
#define VRAMPLAN_SIM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "vramplan/allocator.h"
#include "vramplan/defaults.h"
#include "vramplan/error.h"
#include "vramplan/graph.h"

#define VP_PRECISION_MAP(XX)                                        \
    XX(FP32, "fp32")                                                \
    XX(AMP_BF16, "amp-bf16")                                        \
    XX(AMP_FP16, "amp-fp16")                                        \
    XX(BF16, "bf16")                                                \
    XX(FP16, "fp16")

typedef enum {
#define VP__PREC(name, str) VP_PREC_##name,
    VP_PRECISION_MAP(VP__PREC)
#undef VP__PREC
    VP_PREC__COUNT
} vp_precision;

#define VP_OPTIMIZER_MAP(XX)                                        \
    XX(ADAMW, "adamw")                 /* foreach (PyTorch default) */ \
    XX(ADAMW_FUSED, "adamw-fused")                                  \
    XX(ADAMW_FORLOOP, "adamw-forloop")                              \
    XX(SGD, "sgd")                     /* momentum 0.9            */  \
    XX(SGD_PLAIN, "sgd-nomomentum")                                 \
    XX(ADAFACTOR, "adafactor")                                      \
    XX(ADAMW_8BIT, "adamw-8bit")       /* bitsandbytes AdamW8bit  */  \
    XX(NONE, "none")

typedef enum {
#define VP__OPT(name, str) VP_OPT_##name,
    VP_OPTIMIZER_MAP(VP__OPT)
#undef VP__OPT
    VP_OPT__COUNT
} vp_optimizer;

#define VP_CATEGORY_MAP(XX)                                         \
    XX(PARAM, "parameters")                                         \
    XX(GRAD, "gradients")                                           \
    XX(OPTIM, "optimizer state")                                    \
    XX(ACT, "activations")          /* saved for backward        */ \
    XX(TEMP, "temporaries")         /* transients, grads in flight */ \
    XX(CAST, "autocast weight cache")                               \
    XX(INPUT, "input batch")                                        \
    XX(WORKSPACE, "library workspaces")

typedef enum {
#define VP__CAT(name, str) VP_CAT_##name,
    VP_CATEGORY_MAP(VP__CAT)
#undef VP__CAT
    VP_CAT__COUNT
} vp_category;

typedef enum {
    VP_PHASE_SETUP,      /* model load, before step 1 */
    VP_PHASE_FORWARD,
    VP_PHASE_BACKWARD,
    VP_PHASE_OPTIMIZER,
    VP_PHASE__COUNT
} vp_phase;

#define VP_MAX_STEPS 16

/* A training setup. Initialise with vp_setup_init, then change fields. */
typedef struct vp_setup {
    uint64_t batch;            /* micro-batch size (>= 1)                      */
    uint64_t seq;              /* sequence length / image side; 0 = default    */
    uint64_t target;           /* decoder length of an encoder-decoder model;
                                  0 = the model's (vp_graph_build_target)      */
    vp_precision precision;
    vp_optimizer optimizer;
    vp_attn_impl attn;         /* overrides the model's implementation         */
    bool attn_set;             /* attn given by the user                       */
    bool set_to_none;          /* zero_grad(set_to_none=...), default true     */
    bool inference;            /* forward only under no_grad                   */
    uint32_t accum;            /* micro-batches per optimizer step, >= 1       */
    uint32_t steps;            /* steps simulated, 1..VP_MAX_STEPS (default 4) */
    const bool *checkpoint;    /* per segment, NULL = none; borrowed           */
    size_t n_checkpoint;       /* entries in checkpoint                        */
    const bool *selective;     /* per segment: selective recomputation of the
                                  attention core (Megatron): its scores,
                                  probabilities and dropout are recomputed in
                                  the backward instead of kept; NULL = none   */
    size_t n_selective;
    uint64_t cublas_workspace; /* bytes per handle; default 32 MiB (Hopper)   */
    uint64_t cublaslt_workspace; /* default 1 MiB                              */
    uint64_t context_bytes;    /* CUDA context outside the allocator          */
    uint32_t sm_count;         /* streaming multiprocessors (the GPU profile's
                                  sm_count; default VP_DEFAULT_SM_COUNT):
                                  cuDNN's split-K filter gradients fill one
                                  wave of them                              */
    bool fresh_process;        /* the backward-thread cuBLAS workspaces and
                                  the first Lt workspace are still to be made
                                  (true); false when an earlier run in the same
                                  process made them (collect.py's later cases) */
    vp_allocator_config alloc; /* allocator configuration and budget limit    */
    bool build_in_dtype;       /* the model is made directly in a half
                                  precision (from_config/from_pretrained with
                                  dtype=, the ground truth's "load": "dtype"),
                                  not built in fp32 and cast (false) */
    bool skip_breakdown;       /* searches: no per-layer breakdown (saves a
                                  second simulation pass)                     */
    bool offload_optimizer;    /* optimizer state on the host (ZeRO-Offload /
                                  CPU Adam): gradients go down after the
                                  backward, updated weights come back        */
    bool offload_activations;  /* torch.autograd.graph.save_on_cpu: saved
                                  tensors live on the host and are copied
                                  back for their op's backward               */
    uint32_t act_bits;         /* ActNN-style compression of saved
                                  activations to 2, 4 or 8 bits (0 = off):
                                  the compressed copy stays on the GPU, the
                                  op's backward decompresses it              */
    uint32_t weight_bits;      /* 8: INT8 linear weights (bitsandbytes
                                  LLM.int8), for inference: 1 byte per weight
                                  plus a fp32 scale per row, dequantized per
                                  layer; 0 = off                             */
} vp_setup;

/* Defaults: batch 1, default seq, fp32, AdamW (foreach), set_to_none, 1
 * micro-batch, 4 steps, no checkpointing, H200 workspaces, context and SM
 * count. */
void vp_setup_init(vp_setup *s);

typedef struct vp_phase_peaks {
    uint64_t start;                     /* allocated at the step's start   */
    uint64_t peak[VP_PHASE__COUNT];     /* peak allocated in each phase     */
    uint64_t after_fwd, after_bwd, end; /* allocated after each phase      */
    uint64_t reserved;                  /* reserved at the step's end       */
} vp_phase_peaks;

#define VP_TOP_LAYERS 8

typedef struct vp_layer_bytes {
    char name[96];
    uint64_t bytes;
} vp_layer_bytes;

typedef struct vp_estimate {
    uint64_t params;              /* trainable parameter elements           */
    uint64_t param_bytes;         /* parameters + buffers on the device     */
    uint64_t grad_bytes;          /* all gradients, when they all exist     */
    uint64_t optim_bytes;         /* optimizer state after step 1           */
    uint64_t baseline;            /* allocated before the model (library
                                     workspaces made by earlier GEMMs); the
                                     allocated figures below exclude it, as
                                     PyTorch's measured deltas do          */
    uint64_t after_model;         /* allocated once the model is loaded     */
    uint64_t peak_alloc;          /* max_memory_allocated over all steps    */
    uint64_t peak_alloc_steady;   /* over the last step                     */
    vp_phase peak_phase;          /* phase of peak_alloc                     */
    uint32_t peak_step;           /* 1-based step of peak_alloc             */
    char peak_op[96];             /* op running at the peak                 */
    uint64_t peak_reserved;       /* max_memory_reserved                    */
    uint64_t device_used;         /* peak_reserved + CUDA context (nvidia-smi) */
    uint64_t by_category[VP_CAT__COUNT]; /* live bytes at the peak          */
    vp_layer_bytes top_layers[VP_TOP_LAYERS]; /* activations held at peak  */
    uint32_t n_top_layers;
    uint32_t steps;
    vp_phase_peaks step[VP_MAX_STEPS];
    uint64_t events;              /* allocations + frees simulated          */
    uint64_t num_alloc_retries;
    double flops_per_step;        /* forward + backward + recompute         */
    uint64_t host_bytes;          /* host RAM the offloads need at most     */
    uint64_t host_traffic;        /* bytes over the host link per step      */
} vp_estimate;

/* Called for every allocation event when set (for --timeline). `bytes` is
 * the request; allocated/reserved are the allocator's counters after it. */
typedef struct vp_sim_event {
    uint64_t seq;            /* event number                                */
    bool is_free;
    uint64_t bytes;          /* requested bytes                             */
    vp_category category;
    vp_phase phase;
    uint32_t step;           /* 1-based                                    */
    const char *op;          /* op name, or "" (model, optimizer)           */
    uint64_t allocated, reserved;
    uint64_t tensor;         /* unique id of the allocation, the same on its
                                free (the allocator's block handle)         */
    uint64_t addr;           /* the block's simulated device address (the
                                allocator model's), the same on its free    */
} vp_sim_event;
typedef void (*vp_sim_event_fn)(const vp_sim_event *ev, void *ud);

/* Simulate `setup->steps` training steps of the graph. Fills *out.
 * Returns VP_OK, VP_EOOM when the step does not fit in
 * setup->alloc.limit (out is then filled up to the failure), VP_EARG for an
 * invalid setup, VP_EOVERFLOW, VP_ENOMEM. `on_event` may be NULL. */
vp_status vp_simulate(const vp_graph *g, const vp_setup *setup,
                      vp_estimate *out, vp_sim_event_fn on_event, void *ud,
                      vp_error *err);

const char *vp_precision_name(vp_precision p);
const char *vp_optimizer_name(vp_optimizer o);
const char *vp_category_name(vp_category c);
const char *vp_phase_name(vp_phase p);
/* Parse names as printed by the *_name functions; VP_EARG if unknown. */
vp_status vp_precision_parse(const char *s, vp_precision *out);
vp_status vp_optimizer_parse(const char *s, vp_optimizer *out);
vp_status vp_attn_impl_parse(const char *s, vp_attn_impl *out);

#endif
