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
#include "vramplan/dist.h"
#include "vramplan/error.h"
#include "vramplan/finetune.h"
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
    XX(PAGED_ADAMW_8BIT, "paged-adamw-8bit") /* PagedAdamW8bit      */  \
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
/* Events a simulation sends to an event callback (a timeline row each,
 * a snapshot's or page's entry): bounds what --timeline, --snapshot and
 * --html write (docs/LIMITS.md). Without a callback the work is bounded
 * by the ops and the steps alone (accumulation's steady state is taken
 * in closed form). */
#define VP_MAX_EVENTS_SEEN (1u << 21)
/* Micro-batches simulated before accumulation's steady state (the state
 * at a micro-batch's start the same as at the previous one's): the rest
 * repeat it and are taken in closed form; a loop still changing after
 * this many is VP_ELIMIT, whatever the accumulation (docs/LIMITS.md). */
#define VP_MAX_ACCUM_UNSTEADY 256u

/* The key/value cache of generate(): transformers' DynamicCache (each
 * layer's K and V grown by torch.cat) or StaticCache (allocated once at
 * prompt + new - 1 tokens, cache_implementation="static"). */
#define VP_CACHE_MAP(XX)                                            \
    XX(DYNAMIC, "dynamic")                                          \
    XX(STATIC, "static")

typedef enum {
#define VP__CACHE(name, str) VP_CACHE_##name,
    VP_CACHE_MAP(VP__CACHE)
#undef VP__CACHE
    VP_CACHE__COUNT
} vp_cache_impl;

/* model.generate() of a causal language model under torch.no_grad(), as
 * transformers 5.x runs it (docs/GENERATE.md): a prefill over the prompt
 * that materializes the logits of its last position only, then one
 * forward of one token per new token, attending over the cache. Active
 * when prompt > 0; the setup's batch is the number of sequences. */
typedef struct vp_generate {
    uint64_t prompt;       /* prompt tokens per sequence (0: no generate) */
    uint64_t new_tokens;   /* tokens generated per sequence, >= 1         */
    uint64_t min_new;      /* min_new_tokens: HF's MinLength and
                              MinNewTokensLength processors mask the EOS
                              token until this many are generated (when
                              the model has one); 0: none                */
    vp_cache_impl cache;
    bool sample;           /* do_sample: softmax and torch.multinomial    */
    uint32_t top_k;        /* sampling: TopKLogitsWarper's k (0: none)     */
    bool top_p;            /* sampling: TopPLogitsWarper (top_p < 1)       */
    bool padded;           /* some prompts are padded (the attention mask
                              holds zeros): the causal mask is built and
                              GQA repeats K and V for SDPA                */
} vp_generate;

/* transformers GenerationConfig's default top_k (used when sampling). */
#define VP_GENERATE_TOP_K 50u

/* Parse a generate spec, comma-separated items:
 *   prompt=N, new=N     prompt and new tokens per sequence (both needed)
 *   min-new=N           min_new_tokens (default: new, every token made)
 *   sample              do_sample (top-k 50 unless top-k=N says)
 *   top-k=N, top-p=P    the sampling filters (top-p below 1 sorts)
 *   padded              prompts of different lengths, left-padded
 * into out's fields (its cache is left as it is). VP_EARG naming the item
 * for an unknown item or a bad value. */
vp_status vp_generate_parse(const char *spec, vp_generate *out,
                            vp_error *err);

/* A pipeline stage under the 1F1B schedule (Megatron-LM's
 * forward_backward_pipelining_without_interleaving): stage `stage` of
 * `stages` runs min(stages - stage - 1, m) warm-up forwards, then one
 * forward and one backward in turn, then the remaining backwards, with m
 * = the setup's accum micro-batches; the saved tensors of every forward
 * not yet backwarded stay alive (docs/DISTRIBUTED.md "Megatron-LM").
 * The graph is the stage's: a stage after the first takes the previous
 * stage's hidden states as its input; a stage before the last has no
 * loss, its backward starts from the gradient of its output, received in
 * the activations' dtype.
 * chunks > 1: the interleaved schedule (forward_backward_pipelining_with_
 * interleaving) over the rank's `chunks` model chunks, the graph's chunks
 * in order, each from its own input op (the first rank's first from the
 * embeddings); 0 or 1: one chunk, 1F1B.
 * torch: torch.distributed.pipelining's PipelineStage under Schedule1F1B
 * (torchtitan's pipeline; one chunk; the same order of forwards and
 * backwards): a receive buffer per micro-batch on a stage after the
 * first and a gradient-receive buffer per micro-batch on a stage before
 * the last, made at the first step and kept; each forward's output kept
 * until its backward has run, the last forward's until the step's end
 * (docs/DISTRIBUTED.md "torch's PipelineStage"). */
typedef struct vp_pipeline {
    uint32_t stages, stage;
    uint32_t chunks;
    bool torch;
} vp_pipeline;

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
    const vp_dist *dist;       /* a data-parallel run (dist.h), simulated as
                                  its rank dist->rank; NULL or strategy
                                  NONE: one GPU; borrowed                    */
    vp_finetune ft;            /* frozen parameters, LoRA, a quantized base,
                                  the base dtype and how it is loaded
                                  (finetune.h; default: full fine-tuning,
                                  loaded in the training dtype)           */
    const vp_pipeline *pipe;   /* a pipeline stage's schedule (training,
                                  NULL: none); borrowed                     */
    vp_generate generate;      /* generate() instead of training or
                                  inference steps when prompt > 0; `steps`
                                  is then the number of generate() calls   */
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

/* What a generate() simulation found (vp_estimate.gen); allocated bytes
 * are relative to the baseline, as peak_alloc. */
typedef struct vp_gen_estimate {
    uint64_t kv_cache_bytes;  /* the cache generate() returns: the bytes
                                 of its K and V tensors' storage          */
    uint64_t kv_at_peak;      /* cache bytes live at peak_alloc (counted
                                 in by_category's activations too)       */
    uint64_t weights;         /* parameter bytes on the device            */
    uint64_t prefill_peak;    /* peak allocated up to the first token     */
    uint64_t decode_peak;     /* peak allocated in the decode steps       */
    uint64_t peak_token;      /* the token whose step makes peak_alloc:
                                 1 the prefill's, k the (k-1)-th decode  */
} vp_gen_estimate;

typedef struct vp_estimate {
    uint64_t params;              /* trainable parameter elements           */
    uint64_t total_params;        /* all parameter elements (adapters too)  */
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
    uint64_t setup_peak;          /* peak allocated while the model was
                                     loaded (and quantized, and its adapters
                                     added), before step 1; peak_alloc is
                                     the larger of it and the steps' peaks */
    uint64_t load_peak;           /* the part of it before the adapters
                                     were added (the base model's load) */
    uint64_t paged_bytes;         /* paged optimizer state (unified memory,
                                     outside the caching allocator: not in
                                     the allocated and reserved figures,
                                     counted in device_used)               */
    vp_gen_estimate gen;          /* generate(): setup.generate.prompt > 0  */
} vp_estimate;

/* Called for every allocation event when set (for --timeline). `bytes` is
 * the request; allocated/reserved are the allocator's counters after it. */
typedef struct vp_sim_event {
    uint64_t seq;            /* event number                                */
    bool is_free;
    uint64_t bytes;          /* an allocation: the bytes requested; a free:
                                the block's size (the request rounded up
                                to 512 B, or a whole block whose remainder
                                was too small to split); `allocated` is
                                the allocator's exact counter              */
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

/* One role of a data-parallel run: the ranks whose streams are alike
 * (the same shards, the same partition), simulated once. */
typedef struct vp_rank_estimate {
    uint32_t rank;        /* the role's first rank                          */
    uint32_t n_ranks;     /* ranks that play it                             */
    vp_estimate est;      /* its simulation (vp_simulate with that rank)    */
} vp_rank_estimate;

/* Simulate every role of setup->dist (which must be set, with a strategy
 * other than NONE). *out (the caller frees it with free()) holds *n
 * roles in the order of their first rank; *worst is the index of the most
 * loaded one: the largest peak allocated (then peak reserved, then the
 * lower rank). dist->rank is ignored. Errors as vp_simulate's, for the
 * role that failed (VP_EOOM leaves *out NULL). */
vp_status vp_simulate_ranks(const vp_graph *g, const vp_setup *setup,
                            vp_rank_estimate **out, size_t *n,
                            size_t *worst, vp_error *err);

/* The roles of a run without simulating them: *ranks (caller frees) holds
 * the first rank of each role, *counts the ranks that play it. VP_EARG
 * for an invalid run (a world or shard size out of range, a mesh that does
 * not divide the world). */
vp_status vp_dist_roles(const vp_graph *g, const vp_dist *d,
                        uint32_t **ranks, uint32_t **counts, size_t *n,
                        vp_error *err);

const char *vp_precision_name(vp_precision p);
const char *vp_optimizer_name(vp_optimizer o);
const char *vp_category_name(vp_category c);
const char *vp_phase_name(vp_phase p);
const char *vp_cache_impl_name(vp_cache_impl c);
/* Parse names as printed by the *_name functions; VP_EARG if unknown. */
vp_status vp_precision_parse(const char *s, vp_precision *out);
vp_status vp_optimizer_parse(const char *s, vp_optimizer *out);
vp_status vp_attn_impl_parse(const char *s, vp_attn_impl *out);
vp_status vp_cache_impl_parse(const char *s, vp_cache_impl *out);

#endif
