/* The training-step simulator's private interface: the engine's state, the
 * helpers with which op rules allocate, save and hand on gradients, and
 * the op table.
 *
 * Code map (docs/SIMULATION_NOTES.md, "Code map"):
 *   sim_engine.c        tensors, references, allocator events, saved
 *                       tensors, autocast casts, gradient hand-off
 *   sim_steady.c        accumulation's steady state, in closed form
 *   sim.c               the step: forward/backward dispatch through
 *                       vp__op_table, checkpoint segments, Python holds,
 *                       model load, input batch, phases, entry point
 *   ops/table.c         vp__op_table: the rules of each op kind
 *   ops/linear.c        linear, conv2d (cuBLAS and cuDNN workspaces)
 *   ops/attention.c     the attention core (eager, math, flash, efficient)
 *   ops/norm.c          layernorm, groupnorm, rmsnorm, batchnorm2d
 *   ops/pointwise.c     activations, add, mul, dropout, pooling, concat,
 *                       softmax, rope, views
 *   ops/embed_loss.c    embedding, cross-entropy, MSE loss
 *   ops/moe.c           router, grouped experts
 *   ops/mla.c           the concatenations of latent attention
 *   ops/lora.c          LoRA and DoRA adapters (peft)
 *   ops/quant.c         quantized base weights (bitsandbytes)
 *   optim.c             optimizer states and step temporaries
 *
 * An op family defines, next to each other, the forward rule (what the op
 * allocates, frees and saves for backward, in PyTorch's order) and the
 * backward rule (what its autograd node allocates and frees). What the
 * forward saves goes into named slots (an enum in the family's file) that
 * the backward reads by name. */
#ifndef VRAMPLAN_SIM_INTERNAL_H
#define VRAMPLAN_SIM_INTERNAL_H

#include "graph_internal.h"
#include "internal.h"
#include "util.h"
#include "vramplan/vramplan.h"

#define NONE UINT32_MAX /* no tensor                                     */
/* generate()'s key/value cache: an internal category after the public
 * ones, reported with the activations in by_category and apart in
 * vp_estimate.gen.kv_at_peak (generate.c). */
#define VP__CAT_KV ((vp_category)VP_CAT__COUNT)
#define MAX_SAVED 12    /* saved-tensor slots per op                      */

typedef struct {
    uint64_t handle, bytes;
    uint32_t refs;
    uint8_t cat;
    int32_t op;
} vp__tensor;

/* How an op's forward runs: saving for backward, under no_grad or a
 * checkpointed segment's first forward, or recomputed for the backward. */
typedef enum { MODE_SAVE, MODE_NOSAVE, MODE_RECOMPUTE } vp__fwd_mode;

/* The kinds of vp__pyhold (sim.c's PH_*). */
#define VP__PH_KINDS 5

/* A reference that a Python variable holds (graph.h, VP_OPF_HOLD_*). */
struct vp__pyhold {
    uint32_t id;
    uint8_t kind;
    int32_t seg; /* PH_LAYER: its layer; PH_SEG: the layer it feeds;
                    PH_UNTIL: the op after which it is dropped (hold_until) */
};

typedef struct sim {
    const vp_graph *g;
    const vp_setup *s;
    vp_allocator *a;
    const vp_allocator_stats *ast; /* a's counters (vp__allocator_stats) */
    vp_error *err;
    vp_status st;
    vp__tensor *t;
    size_t nt, capt;
    uint32_t *free_ids;
    size_t n_free, cap_free;
    /* per op */
    uint32_t *out_t;
    uint8_t *out_eb;
    uint8_t *lay;      /* output not in its dims' memory order (graph.h,
                          VP_OPF_STRIDED): it follows a permute or the
                          transposed output of nn.MultiheadAttention */
    uint8_t *glay;     /* the same for the gradient held in grad_t      */
    uint32_t *saved;   /* n_ops * MAX_SAVED */
    uint8_t *n_saved;
    uint32_t *grad_t;
    uint32_t *consumers;
    /* per param */
    uint32_t *pgrad, *cast, *st1, *st2;
    uint8_t *gview;   /* pgrad is the view this backward's first
                         contribution came as (vp__param_grad_tview);
                         cleared when a backward begins */
    size_t n_cast;    /* cast[] entries that are not NONE */
    bool *ckpt;       /* per segment */
    uint32_t *held;   /* tensors kept until the model output is dropped */
    struct {
        int32_t seg;
        uint32_t id;
    } *ckin;          /* inputs kept by checkpointed segments */
    uint64_t *reload; /* per op: saved bytes offloaded or compressed, to
                         bring back (decompress) for its backward      */
    bool saving_offloadable; /* fwd in a mode whose saves may move    */
    int32_t recompute_slot;  /* saved slots from this one on are
                                recomputed in backward (-1: none)     */
    bool *sel;               /* per segment: selective recomputation  */
    uint64_t host_now;       /* host bytes held by offloads           */
    bool *int8;              /* per param: an INT8 linear weight, or NULL */
    bool kbit;               /* a quantized base (prepare_model_for_kbit_
                                training upcast its other half-precision
                                parameters to fp32)                     */
    size_t n_ckin, cap_ckin;
    size_t n_held, cap_held;
    bool qmaps;              /* bitsandbytes' quantization maps are on
                                the GPU (paged 8-bit AdamW)             */
    uint32_t *leaf;          /* kept by the autograd graph until the
                                loss is deleted                         */
    size_t n_leaf, cap_leaf;
    uint32_t *opc;           /* the running op's casts of frozen weights
                                (not in autocast's cache)             */
    size_t n_opc, cap_opc;
    struct vp__pyhold *ph; /* tensors kept by Python locals (VP_OPF_HOLD_*) */
    size_t n_ph, cap_ph;
    uint32_t n_ph_kind[VP__PH_KINDS]; /* ph's entries by kind */
    int32_t ph_until_min; /* at most the lowest op a hold_until entry of
                             ph waits for (INT32_MAX: none)          */
    /* state */
    vp_phase phase;
    uint32_t step;
    const char *cur_op;
    int32_t cur_op_idx;
    bool amp, half, training;
    uint8_t A, PE; /* low-precision activation bytes, parameter bytes */
    uint64_t cat_live[VP_CAT__COUNT + 1]; /* and VP__CAT_KV */
    uint64_t gen_token;    /* generate(): the token being made (1: the
                              prefill's), for the peak's report       */
    uint64_t phase_peak;
    uint64_t events;
    uint64_t retries_skipped; /* allocator retries of the micro-batches
                                 the steady state skipped (sim_steady.c) */
    bool ws_fwd_lt, ws_bwd, ws_bwd_lt;
    /* Megatron's global "mpu" buffer (parallel_state.py GlobalMemoryBuffer
     * .get_tensor): the sequence-parallel all-gathers' target, made at
     * the first, replaced by a larger request, never freed (ops/linear.c);
     * mpu_bytes 0: not made */
    uint32_t mpu;
    uint64_t mpu_bytes;
    /* the ops a forward, a backward and a batch cover: [op_lo, op_hi),
     * an interleaved pipeline rank's model chunk (sim_pipe.c); op_hi 0:
     * all of them */
    uint32_t op_lo, op_hi;
    /* a torch pipeline stage's receive buffer of the micro-batch, the
     * stage input's tensor (sim_pipe.c); recv_set false: the input is
     * allocated with the batch */
    bool recv_set;
    uint32_t recv_in;
    /* per param: Transformer Engine's fp8 weight copy and transpose with
     * the scaling metadata, made at its first fp8 forward and kept
     * (ops/linear.c); NULL until then */
    uint32_t *fp8w;
    /* results */
    vp_estimate *out;
    uint64_t peak;
    const char *peak_op;   /* the op of the peak (cur_op then)           */
    uint64_t stop_at;      /* pass 2: stop at this event (0 = run all) */
    bool stopped;
    vp_sim_event_fn cb;
    void *ud;
    bool tail;             /* cb or stop_at set: each event goes through
                              emit_tail (one test an event, not two)   */
    /* a data-parallel wrapper (dist_internal.h), NULL on one GPU */
    struct vp__dist *dist;
    int32_t stream;          /* the stream the next allocation is on      */
    /* what the optimizer updates: the parameters (opt_numel NULL), or the
     * wrapper's tensors (FSDP's shards): n_opt of them, opt_numel[k]
     * elements of opt_eb bytes, updated this step when opt_on[k] */
    uint32_t n_opt;
    const uint64_t *opt_numel;
    const bool *opt_on;
    uint8_t opt_eb;
    const vp__sim_hooks *hooks; /* NULL, or the caller's (internal.h) */
} sim;

#define OK(S) ((S)->st == VP_OK && !(S)->stopped)

/* ---- the engine (sim_engine.c) ----------------------------------------- */

/* a * b, checked: on overflow S->st is set (VP_EOVERFLOW) and 0 returned.
 * Inline (the op rules call it for nearly every tensor they size); the
 * overflow's error out of line. */
uint64_t vp__mulc_overflow(sim *S);
static inline uint64_t vp__mulc(sim *S, uint64_t a, uint64_t b)
{
    uint64_t r;
    return vp_mul_u64(a, b, &r) ? r : vp__mulc_overflow(S);
}
/* Allocate a tensor with one reference on stream S->stream; NONE on
 * failure (S->st set). */
uint32_t vp__talloc(sim *S, uint64_t bytes, vp_category cat);
static inline void vp__tref(sim *S, uint32_t id) /* NONE: no-op */
{
    if (id != NONE)
        S->t[id].refs++;
}
/* vp__tunref's last reference: the tensor freed. */
void vp__tfree(sim *S, uint32_t id);
/* Drop a reference (NONE: no-op); frees at the last. Inline: most drops
 * are not the last (llama-3-70b's steps: 37,101 drops, 22,176 frees),
 * and a call paid the free's prologue for each. */
static inline void vp__tunref(sim *S, uint32_t id)
{
    if (id == NONE || S->st != VP_OK)
        return;
    vp__tensor *t = &S->t[id];
    VP_ASSERT(t->refs > 0);
    if (--t->refs == 0)
        vp__tfree(S, id);
}
/* A transient: allocated and freed at once (0 bytes: nothing). */
void vp__transient(sim *S, uint64_t bytes);
/* Keep a tensor until the model's output is dropped (end of forward). */
void vp__hold(sim *S, uint32_t id);
void vp__release_held(sim *S);
/* Keep a tensor until the loss (and with it the autograd graph) is
 * deleted: a leaf that requires grad and its .grad. */
void vp__hold_graph(sim *S, uint32_t id);
void vp__release_graph(sim *S);

/* The next allocation is not a memory-bound kernel of its own
 * (vp__sim_hooks.written_by): a GEMM's output (launch true: its time is
 * the op's matmul time, timing.c) or written by the kernel that writes
 * the allocation after it (launch false: native_dropout's mask, with
 * its output). */
void vp__written_by(sim *S, bool launch);

/* Save tensor id (NONE allowed) for op's backward in slot `slot`; slots
 * are saved in increasing order. Activation offload, compression and
 * selective recomputation may keep something else (stash). */
void vp__save(sim *S, uint32_t op, uint32_t slot, uint32_t id);
/* op's autograd nodes save n variables more than its slots hold (indices,
 * masks, offsets, parameters, a second view of a saved tensor): each is a
 * SavedVariable checkpoint's hooks pack (vp__sim_hooks.saved), none is
 * memory the op keeps (docs/STEP_TIME.md "Checkpointed steps on the
 * host"). */
void vp__save_vars(sim *S, uint32_t op, uint32_t n);
/* Free one saved tensor before the others (its slot becomes NONE). */
void vp__drop_saved(sim *S, uint32_t op, uint32_t slot);
void vp__release_saved(sim *S, uint32_t op); /* all, in slot order */

/* Bytes per element of a parameter in this precision (inline, as the
 * next: the op rules ask for every parameter they touch). */
static inline uint32_t vp__param_bytes(const sim *S, const vp_param *p)
{
    if (p->elem_bytes_override)
        return p->elem_bytes_override;
    if (p->fp32_buffer)
        return 4;
    return S->PE;
}

/* Whether autocast casts parameter p for its op: a fp32 weight under
 * autocast (a half-precision weight is already in the compute dtype; a
 * quantized one is dequantized by its op). */
static inline bool vp__param_is_cast(const sim *S, uint32_t p)
{
    const vp_param *pp = &S->g->params[p];
    return S->amp && !(S->int8 && S->int8[p]) && !pp->quant &&
           vp__param_bytes(S, pp) == 4;
}
/* The autocast copy of parameter p (the cache keeps one reference); NONE
 * when no cast happens. */
uint32_t vp__weight_cast(sim *S, uint32_t p);
void vp__clear_cast_cache(sim *S);
/* Drop the running op's casts of frozen weights (after its forward). */
void vp__release_op_casts(sim *S);
/* Op in_op's output in `eb` bytes per element: an owned reference (a new
 * tensor when a cast is needed). */
uint32_t vp__cast_input(sim *S, uint32_t in_op, uint8_t eb);

/* Gradients. vp__param_grad hands parameter p's gradient gid (owned) to
 * AccumulateGrad; vp__weight_grad makes and hands it (via_cast: the
 * compute dtype, then ToCopyBackward to fp32 under autocast);
 * vp__param_grad_cast hands one made in the compute dtype. */
void vp__param_grad(sim *S, uint32_t p, uint32_t gid);
/* PyTorch tensor parallelism (vp_param.tp_dim): the whole tensor is tp
 * times the rank's share (1: not distributed) */
uint64_t vp__tp_whole(const vp_graph *g, const vp_param *pp);
void vp__weight_grad(sim *S, uint32_t p, bool via_cast);
void vp__param_grad_cast(sim *S, uint32_t p, uint32_t lo);
/* A Linear's weight gradient (owned, compute dtype): as
 * vp__param_grad_cast, but without a cast it arrives as a view, which a
 * later contribution in the same backward sums out of place. */
void vp__param_grad_tview(sim *S, uint32_t p, uint32_t lo);
/* Give gradient gid (owned, g_eb bytes per element, `strided` when not
 * in the dims' memory order) to op `in`: converted to its output's dtype,
 * then kept or summed into the one it has. */
void vp__give_grad_l(sim *S, uint32_t in, uint32_t gid, uint8_t g_eb,
                     bool strided);
void vp__give_grad(sim *S, uint32_t in, uint32_t gid, uint8_t g_eb);
/* A new gradient shaped like op in's output. */
uint32_t vp__grad_like(sim *S, uint32_t in, uint8_t eb);

static inline uint8_t vp__promote(uint8_t a, uint8_t b)
{
    return a > b ? a : b;
}

/* ---- accumulation's steady state (sim_steady.c) ------------------------ */

/* The state at the start of the last micro-batch looked at, and the
 * counters then. */
typedef struct vp__steady {
    vp_words prev, cur;
    uint64_t at[3]; /* events, allocator retries, host traffic */
    bool have;
    /* the peak so far (and its op) left out of the state: set where a
     * repetition's events cannot raise it (the step loop: the peak so far
     * is at least every figure the step to repeat reached) */
    bool any_peak;
} vp__steady;

/* Called at the start of each micro-batch after the first, with the
 * loop's batch and loss tensors and the micro-batches `left` to run
 * (this one included). True when the state is the one the previous
 * micro-batch started from: that one repeats `left` times, and the
 * counters that grow have been advanced as those repetitions would have
 * (the caller skips them). False otherwise, or with S->st set. */
bool vp__steady_reached(sim *S, vp__steady *d, const uint32_t *batch,
                        size_t nb, uint32_t loss_t, uint64_t left);
void vp__steady_free(vp__steady *d);

/* ---- op rules ------------------------------------------------------------ */

/* An op's forward, as the rule sees it. The rule sets out (one creation
 * reference; the engine adds the consumers' references), and oeb, ol,
 * refs when they differ from the defaults. */
typedef struct vp__fwd_op {
    uint32_t i;         /* the op's index                                */
    const vp_op *o;
    vp__fwd_mode mode;
    bool sv;            /* autograd keeps what the op saves              */
    uint32_t in0;       /* the first input's op; NONE without inputs     */
    uint8_t eb0;        /* its bytes per element                         */
    uint64_t n;         /* output elements                               */
    uint32_t out;       /* the output tensor; NONE: none                 */
    uint8_t oeb;        /* output bytes per element; default eb0         */
    uint8_t ol;         /* output strided; default: the first input's    */
    uint32_t refs;      /* references its consumers hold                 */
} vp__fwd_op;

/* An op's backward, as the rule sees it. gy is owned by the rule (set to
 * NONE when freed early); gx, the first input's gradient, is handed on
 * by the engine after the rule. */
typedef struct vp__bwd_op {
    uint32_t i;
    const vp_op *o;
    uint32_t gy;        /* the output's gradient                          */
    bool gstr;          /* gy is not in the output's memory order         */
    uint32_t in0;       /* the first input's op; NONE without inputs     */
    bool ig0;           /* the first input needs a gradient              */
    uint8_t eb0, oeb;   /* bytes per element: first input, output         */
    uint64_t n;         /* output elements                               */
    uint32_t gx;        /* the first input's gradient; NONE: none        */
    uint8_t gxe;        /* its bytes per element; default eb0            */
    bool gxs;           /* strided                                        */
} vp__bwd_op;

typedef void vp__fwd_fn(sim *S, vp__fwd_op *f);
typedef void vp__bwd_fn(sim *S, vp__bwd_op *b);

/* Kernels op o launches in phase ph (0 forward, 1 backward) of one
 * micro-batch beyond the allocations its rules make: the launches that
 * allocate nothing (a view's zero-filled gradient, an accumulation in
 * place) or whose allocations the rules fold into one (docs/STEP_TIME.md
 * "Launches"). wide: the op's activations are fp32 (fp32 or autocast).
 * The step's host model (timing.c) issues these with the allocations. */
typedef double vp__launch_fn(const vp_graph *g, const vp_op *o, int ph,
                             bool wide);

/* Traits of an op kind (vp__op_rules.traits). */
#define VP__TRAIT_PASSTHROUGH 0x1u /* its output is a view, a sum or a join
                                      of its inputs, and it saves nothing:
                                      a recomputation may stop before it  */
#define VP__TRAIT_LOSS 0x2u        /* a loss: its targets come with the
                                      batch, its output seeds backward    */

typedef struct vp__op_rules {
    vp__fwd_fn *fwd;    /* NULL: nothing in the forward (the input)       */
    vp__bwd_fn *bwd;    /* NULL: nothing in the backward                  */
    uint32_t traits;
    vp__launch_fn *launches; /* NULL: its kernels are its allocations */
} vp__op_rules;

/* Indexed by vp_op_kind (ops/table.c). */
extern const vp__op_rules vp__op_table[VP_OP__COUNT];

/* The rules, by family. */
vp__fwd_fn vp__linear_fwd;     /* linear, conv2d (ops/linear.c)          */
vp__bwd_fn vp__linear_bwd;
vp__launch_fn vp__linear_launches; /* torch_mha in_proj's bias add_     */
bool vp__linear_mha_in(const vp_graph *g, const vp_op *o);
vp__fwd_fn vp__attention_fwd;  /* ops/attention.c                        */
vp__bwd_fn vp__attention_bwd;
vp__fwd_fn vp__layernorm_fwd;  /* layernorm, groupnorm (ops/norm.c)      */
vp__fwd_fn vp__rmsnorm_fwd;
vp__bwd_fn vp__norm_bwd;       /* layernorm, groupnorm, rmsnorm          */
vp__launch_fn vp__rmsnorm_launches;
/* A Python norm's `weight * h` gradient: grad * h (geb bytes an element),
 * the weight's gradient, then at::sum_to's Reduce.cuh staging (ops/norm.c;
 * also T5LayerNorm's, ops/encdec.c) */
void vp__norm_weight_sum(sim *S, const vp__bwd_op *b, uint8_t geb);
vp__fwd_fn vp__batchnorm_fwd;
vp__bwd_fn vp__batchnorm_bwd;
vp__fwd_fn vp__activation_fwd; /* relu, tanh, sigmoid, gelu, silu
                                  (ops/pointwise.c)                      */
vp__fwd_fn vp__gelu_tanh_fwd;
vp__bwd_fn vp__gelu_tanh_bwd;
vp__fwd_fn vp__rope_fwd;
vp__bwd_fn vp__rope_bwd;
vp__launch_fn vp__rope_launches;
vp__fwd_fn vp__dropout_fwd;
vp__launch_fn vp__dropout_launches;
vp__fwd_fn vp__binary_fwd;     /* add, mul                               */
vp__bwd_fn vp__binary_bwd;     /* add, mul, concat                       */
vp__fwd_fn vp__maxpool_fwd;
vp__fwd_fn vp__join_fwd;       /* avgpool, adaptive avgpool, concat      */
vp__fwd_fn vp__softmax_fwd;
vp__fwd_fn vp__reshape_fwd;    /* flatten, reshape                       */
vp__fwd_fn vp__view_fwd;       /* permute, select                        */
vp__bwd_fn vp__view_bwd;       /* flatten, reshape, permute              */
vp__bwd_fn vp__elementwise_bwd; /* one gradient like the first input's   */
vp__fwd_fn vp__embedding_fwd;  /* ops/embed_loss.c                       */
vp__bwd_fn vp__embedding_bwd;
vp__fwd_fn vp__loss_fwd;       /* cross-entropy, MSE                     */
vp__bwd_fn vp__loss_bwd;
vp__fwd_fn vp__router_fwd;     /* ops/moe.c                              */
vp__fwd_fn vp__moe_dispatch_fwd;
vp__fwd_fn vp__moe_combine_fwd;
vp__bwd_fn vp__moe_combine_bwd;
vp__fwd_fn vp__t5norm_fwd;     /* ops/encdec.c: T5LayerNorm (rmsnorm with
                                  VP_OPF_T5_NORM)                        */
vp__bwd_fn vp__t5norm_bwd;
vp__fwd_fn vp__position_bias_fwd;
vp__bwd_fn vp__position_bias_bwd;
vp__fwd_fn vp__cast_fwd;
vp__bwd_fn vp__cast_bwd;
vp__fwd_fn vp__upsample_fwd;   /* ops/spatial.c                          */
vp__bwd_fn vp__router_bwd;
vp__fwd_fn vp__moe_experts_fwd;
vp__bwd_fn vp__moe_experts_bwd;
vp__launch_fn vp__router_launches;
vp__launch_fn vp__moe_experts_launches;

/* One memory-bound kernel of an op timed from its source's kernels: its
 * class (VP_HW_MEM_*), the bytes it moves, and its operands' layout
 * (timing_layout.h: contiguous, a stride-0 broadcast operand, a slice of
 * a chunked tensor). */
enum { VP__LAY_CONTIG, VP__LAY_BCAST, VP__LAY_CHUNK };
typedef struct {
    int kind;
    double bytes;
    int layout;
    bool wide; /* fp32 elements                                       */
} vp__mem_kernel;
enum { VP__MOE_MEM_KERNELS = 24 };

/* The routed experts' memory-bound kernels (ops/moe.c) of op o in phase
 * ph, one micro-batch, into k (VP__MOE_MEM_KERNELS at most); eb: bytes an
 * element of the tokens, of the experts and of the weighted outputs.
 * Returns how many; *small gets the op's other, launch-bound kernels. */
size_t vp__moe_experts_mem(const vp_graph *g, const vp_op *o, int ph,
                           const double eb[3], vp__mem_kernel *k,
                           double *small);
vp__fwd_fn vp__softcap_fwd;   /* ops/pointwise.c                         */
vp__bwd_fn vp__softcap_bwd;
vp__fwd_fn vp__scale_fwd;
vp__bwd_fn vp__scale_bwd;
vp__fwd_fn vp__mla_q_fwd;     /* ops/mla.c                               */
vp__fwd_fn vp__mla_k_fwd;
vp__bwd_fn vp__mla_cat_bwd;
vp__fwd_fn vp__lora_fwd;       /* ops/lora.c                             */
vp__bwd_fn vp__lora_bwd;
vp__fwd_fn vp__redistribute_fwd; /* ops/redistribute.c               */
vp__bwd_fn vp__redistribute_bwd;
/* ops/loss_parallel.c (VP_OPF_LOSS_PARALLEL): the log-probabilities of
 * rc logits of eb bytes, and the gradient of the logits from the saved
 * ones of op (released) */
uint32_t vp__loss_parallel_logp(sim *S, uint64_t rc, uint8_t eb);
uint32_t vp__loss_parallel_grad(sim *S, uint32_t op, uint64_t rc, uint8_t eb);

/* Helpers shared by rules. The output aliases the first input (in
 * place, or a view). */
static inline void vp__alias_input(sim *S, vp__fwd_op *f)
{
    f->out = S->out_t[f->in0];
    vp__tref(S, f->out);
}
/* Type promotion of an op with several operands: the widest input, and a
 * learned operand's parameter width (ops/pointwise.c). */
uint8_t vp__promoted_eb(const sim *S, const vp__fwd_op *f);

/* Model-level allocations that belong to a family. */
/* HF masking_utils: the causal mask that eager attention reads, made
 * before the first layer (ops/attention.c). */
void vp__attention_model_mask(sim *S);
/* The attention kernel that runs: the setup's or the model's choice, SDPA
 * resolved by the compute element bytes ce, GQA and an additive bias
 * (ops/attention.c). */
vp_attn_impl vp__attention_impl(const sim *S, const vp_op *o, uint8_t ce);
/* The same from the graph and the setup alone (the step-time model). */
/* Whether a setup runs training steps (a backward): not inference and not
 * generate() (sim.c's S->training; ops/attention.c's kernel choice). */
static inline bool vp__setup_training(const vp_setup *s)
{
    return !s->inference && !s->generate.prompt;
}

vp_attn_impl vp__attention_impl_of(const vp_graph *g, const vp_setup *s,
                                   const vp_op *o, uint8_t ce);
/* Whether HF's transpose(1, 2).contiguous() copies the output of the
 * kernel impl (the simulator's choice) runs (ops/attention.c). */
bool vp__attention_out_copied(const vp_op *o, vp_attn_impl impl);
/* SDPA's math kernel and an additive attention bias (ops/attention_math.c):
 * the bias's mask (owned *mask, the
 * autocast copy *cast, the causal condition *cond to save after the
 * kernel's slots, with vp__attention_bias_save); the kernel's forward on
 * q, k, v (k and v contiguous: copied by the cache) and backward. */
void vp__attention_bias_fwd(sim *S, vp__fwd_op *f, uint8_t ce, uint32_t *mask,
                            uint32_t *cast, uint32_t *cond);
void vp__attention_bias_save(sim *S, uint32_t op, uint32_t cond);
void vp__attention_math_fwd(sim *S, vp__fwd_op *f, uint32_t q, uint32_t k,
                            uint32_t v, bool kv_contig, uint8_t ce);
void vp__attention_math_bwd(sim *S, vp__bwd_op *b, uint8_t ce, uint32_t *dq,
                            uint32_t *dk, uint32_t *dv);
/* The fused attention kernel under Megatron's context parallelism
 * (vp_op.cp > 1, ops/attention_cp.c): Transformer Engine's ring of cp
 * ranks; the forward sets f->out and saves q, the last kv received, the
 * logsumexp (and the output unless keep_out); the backward makes the
 * gradients of q, k and v. */
void vp__attention_cp_fwd(sim *S, vp__fwd_op *f, uint32_t q, uint64_t qn,
                          uint64_t kvn, uint64_t bh, uint8_t ce,
                          bool keep_out);
void vp__attention_cp_bwd(sim *S, const vp_op *o, uint64_t qn, uint64_t kvn,
                          uint8_t ce, uint32_t *dq, uint32_t *dk,
                          uint32_t *dv);
/* Bytes of a loss's targets, made with the batch (ops/embed_loss.c). */
uint64_t vp__loss_target_bytes(sim *S, const vp_op *o);

/* ---- quantized base weights (ops/quant.c) -------------------------------- */

/* Load quantized weight p: its half-precision copy arrives, is quantized
 * into its stored tensors, and is freed. */
void vp__quant_load(sim *S, uint32_t p);
/* Bytes quantized weight p of g keeps (all its tensors, as requested;
 * nested: 4-bit double quantization). */
uint64_t vp__quant_bytes(const vp_graph *g, uint32_t p, bool nested);
/* The linear rules of a layer whose weight is quantized (linear.c hands
 * over to them). */
void vp__quant_linear_fwd(sim *S, vp__fwd_op *f);
void vp__quant_linear_bwd(sim *S, vp__bwd_op *b);
/* ---- the step's parts that generate() reuses (sim.c) -------------------- */

/* Forward of op i (its rule, then its output's consumers and Python
 * references). refs_of: the consumers' references during a recomputation
 * (NULL: all its consumers). */
void vp__fwd(sim *S, uint32_t i, vp__fwd_mode mode, const uint32_t *refs_of);
/* Drop every Python reference (the forward returned). */
void vp__release_pyholds(sim *S);
/* Keep a tensor as a local of layer (segment) seg until it returns
 * (seg < 0: not kept). */
void vp__hold_layer(sim *S, uint32_t id, int32_t seg);
/* Keep a tensor until op `op` has run (a caller's local, as hold_until). */
void vp__hold_until(sim *S, uint32_t id, uint32_t op);
/* The model's weights, loaded as setup.ft.load says (built in their dtype
 * as from_pretrained(dtype=...) does, or in fp32 and cast), adapters
 * added. */
void vp__load_model(sim *S);
/* Allocated bytes now. */
uint64_t vp__allocated(sim *S);

/* generate(): the prefill and decode steps of setup.generate in place of
 * the training steps (generate.c). */
vp_status vp__generate_run(sim *S);

/* ---- a pipeline stage (sim_pipe.c; sim.c's pieces it runs) ------------- */

/* The end of the ops a pass covers (sim.op_hi, or all). */
static inline uint32_t vp__op_end(const sim *S)
{
    return S->op_hi ? S->op_hi : (uint32_t)S->g->n_ops;
}

#define VP__MAX_BATCH 8 /* input tensors of a micro-batch */
/* The steps of a pipeline stage's schedule (setup.pipe), instead of the
 * one-GPU loop. */
vp_status vp__pipe_run(sim *S);
void vp__sim_alloc_batch(sim *S, uint32_t *batch, size_t *nb);
void vp__sim_phase(sim *S, vp_phase ph);
void vp__sim_forward(sim *S);
/* The backward from the gradients given in grad_t. */
void vp__sim_backward(sim *S, uint32_t *refs_of);
void vp__sim_loss_backward(sim *S, uint32_t loss, uint32_t *refs_of);
void vp__sim_zero_grad(sim *S);

/* ---- the optimizer (optim.c) -------------------------------------------- */

/* optimizer.step(): the state at the first step, the step's temporaries,
 * or the host-side traffic of an offloaded optimizer. */
void vp__optimizer_step(sim *S);

#endif
