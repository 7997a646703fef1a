/* vramplan: the layer graph.
 *
 * A graph is a model description instantiated for one micro-batch size and
 * one sequence length (or image side): a list of primitive ops in execution
 * order, each with its inputs, its output shape, its parameters and its
 * forward/backward FLOPs. Ops are grouped into segments (the model's
 * repeated blocks: transformer layers, ResNet stages...), which are the units
 * that activation checkpointing can wrap. What each op saves for backward
 * and its transients depend on the precision; see sim.h (vp_op_memory). */
#ifndef VRAMPLAN_GRAPH_H
#define VRAMPLAN_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/model.h"

#define VP_MAX_DIMS 6
#define VP_OP_MAX_INPUTS 4
#define VP_OP_MAX_PARAMS 4

/* The op kinds. The graph form (docs/MODEL_FORMAT.md) offers those from
 * linear to mse_loss, in this order, and cross_attention, upsample and
 * conv_transpose2d; the others are made by the transformer form
 * (cross_attention only in the graph form, which builds it of linears
 * and an attention core). */
#define VP_OP_KIND_MAP(XX)                                                   \
    XX(INPUT, "input")                 /* data fed to the model            */ \
    XX(LINEAR, "linear")                                                     \
    XX(CONV2D, "conv2d")                                                     \
    XX(BATCHNORM2D, "batchnorm2d")                                           \
    XX(LAYERNORM, "layernorm")                                               \
    XX(RMSNORM, "rmsnorm")                                                   \
    XX(GROUPNORM, "groupnorm")                                               \
    XX(EMBEDDING, "embedding")                                               \
    XX(ATTENTION, "attention")         /* scaled-dot-product core          */ \
    XX(RELU, "relu")                                                         \
    XX(GELU, "gelu")                                                         \
    XX(GELU_TANH, "gelu_tanh")         /* HF gelu_new, composed in Python  */ \
    XX(SILU, "silu")                                                         \
    XX(TANH, "tanh")                                                         \
    XX(SIGMOID, "sigmoid")                                                   \
    XX(DROPOUT, "dropout")                                                   \
    XX(MAXPOOL2D, "maxpool2d")                                               \
    XX(AVGPOOL2D, "avgpool2d")                                               \
    XX(ADAPTIVE_AVGPOOL2D, "adaptive_avgpool2d")                             \
    XX(ADD, "add")                                                           \
    XX(MUL, "mul")                                                           \
    XX(CONCAT, "concat")                                                     \
    XX(FLATTEN, "flatten")                                                   \
    XX(RESHAPE, "reshape")                                                   \
    XX(PERMUTE, "permute")             /* a view                           */ \
    XX(SELECT, "select")               /* a view: one index of a dim       */ \
    XX(SOFTMAX, "softmax")                                                   \
    XX(CROSS_ENTROPY, "cross_entropy")                                       \
    XX(MSE_LOSS, "mse_loss")                                                 \
    XX(ROUTER, "router")               /* MoE gate: top-k of a softmax     */ \
    XX(ROPE, "rope")                   /* rotary position embedding        */ \
    XX(MOE_EXPERTS, "moe_experts")     /* fused experts, grouped GEMMs     */ \
    XX(SOFTCAP, "softcap")             /* cap * tanh(x / cap)              */ \
    XX(SCALE, "scale")                 /* times a constant                 */ \
    XX(MLA_Q, "mla_q")                 /* MLA: q = cat(q_pass, rope(q_rot))*/ \
    XX(MLA_K, "mla_k")                 /* MLA: k = cat(k_pass, k_rot)      */ \
    XX(CROSS_ATTENTION, "cross_attention") /* graph form: q from the first
                                          input, k and v from the second   */ \
    XX(UPSAMPLE, "upsample")           /* nearest or bilinear; the scale in
                                          `stride`                         */ \
    XX(CONV_TRANSPOSE2D, "conv_transpose2d")                                 \
    XX(POSITION_BIAS, "position_bias") /* T5 relative position bias        */ \
    XX(CAST, "cast")                   /* .to(the weights' dtype)          */ \
    XX(LORA, "lora")                   /* a LoRA adapter on the linear op
                                          inputs[1] (made by fine-tuning
                                          setups, finetune.h)              */ \
    XX(REDISTRIBUTE, "redistribute")   /* a DTensor's sequence dim all-
                                          gathered or reduce-scattered
                                          (torch tensor parallelism, the
                                          transformer form's vp_tf.dtensor):
                                          a new tensor of its shape; the
                                          gradient a new one of the
                                          input's                          */

typedef enum {
#define VP__OPK(name, str) VP_OP_##name,
    VP_OP_KIND_MAP(VP__OPK)
#undef VP__OPK
    VP_OP__COUNT
} vp_op_kind;

/* What the output elements are: floats (their width follows the precision
 * mode), int64 indices, or bools. */
typedef enum { VP_VAL_FLOAT, VP_VAL_INDEX, VP_VAL_BOOL } vp_value_kind;

typedef enum {
    VP_ATTN_SDPA,      /* PyTorch picks: flash for fp16/bf16, else efficient */
    VP_ATTN_FLASH,
    VP_ATTN_EFFICIENT,
    VP_ATTN_EAGER,     /* materialised scores and probabilities               */
    VP_ATTN_MATH       /* SDPA's math fallback                                */
} vp_attn_impl;

typedef struct vp_param {
    const char *name;   /* "h.0.attn.c_attn.weight"                          */
    uint64_t numel;
    uint32_t op;        /* first op that uses it                             */
    bool trainable;     /* false for buffers (BatchNorm running statistics)  */
    bool fp32_buffer;   /* buffer kept in fp32 whatever the precision        */
    uint32_t elem_bytes_override; /* 8 for int64 buffers, else 0             */
    uint8_t quant;      /* a quantized base weight: its vp_quant
                           (finetune.h); 0 = stored as it is             */
    bool adapter;       /* added by a fine-tuning setup (LoRA, DoRA)     */
    uint8_t tp_dim;     /* PyTorch tensor parallelism (vp_tf.dtensor):
                           0 replicated or none, 1 Shard(0), 2 Shard(1)
                           of the whole tensor that apply_tp distributes
                           (numel is the rank's share)                   */
} vp_param;

typedef struct vp_op {
    vp_op_kind kind;
    const char *name;                 /* "h.3.mlp.c_fc"; valid until free   */
    int32_t segment;                  /* checkpoint segment, -1 = none       */
    uint32_t n_inputs;
    uint32_t inputs[VP_OP_MAX_INPUTS];/* indices of producing ops           */
    uint32_t ndim;
    uint64_t shape[VP_MAX_DIMS];      /* output shape                        */
    uint64_t numel;                   /* output elements                     */
    vp_value_kind value;              /* output element kind                 */
    uint32_t n_params;
    uint32_t params[VP_OP_MAX_PARAMS];/* indices into the graph's params     */
    bool inplace;                     /* activation applied in place         */
    bool needs_grad;                  /* some input or param requires grad   */
    /* attributes, by kind */
    uint64_t in_features, out_features;   /* linear, conv (channels)        */
    uint32_t kernel, stride, padding, groups;
    uint64_t heads, kv_heads, head_dim;   /* attention                       */
    uint64_t v_head_dim;                  /* attention: v's and the output's
                                             head width, 0 = head_dim (MLA) */
    uint64_t window;                      /* attention: a sliding window of
                                             this many tokens (the masks,
                                             generate()'s cache), 0 = none  */
    double softcap;                       /* attention scores (eager) or the
                                             softcap op: its cap            */
    uint64_t q_len, kv_len;               /* attention                       */
    bool causal;
    vp_attn_impl attn_impl;               /* as described in the model      */
    uint32_t cp;                          /* attention: Megatron's context-
                                             parallel ranks (Transformer
                                             Engine's KV ring), 0 or 1 none */
    double dropout;                       /* dropout p, attention dropout p  */
    uint64_t rows;                        /* norm/loss/softmax rows          */
    uint64_t classes;                     /* loss classes, vocab, experts    */
    uint32_t top_k;
    bool upcast_logits;                   /* loss: logits.float() first (HF) */
    uint32_t flags;                       /* VP_OPF_* behaviour details       */
    uint32_t hold_until;                  /* a Python variable of the caller
                                             keeps the output alive until op
                                             hold_until has run (a module's
                                             argument, graph key hold_input);
                                             0 = none                         */
    double flops_fwd, flops_bwd;          /* floating-point operations       */
} vp_op;

/* Framework behaviours that change what an op allocates (vp_op.flags). */
#define VP_OPF_KV_COPY 0x1u      /* attention copies k, v into HF's
                                    DynamicCache (use_cache in training, off
                                    under checkpointing): GPT-2's packed
                                    k, v; the separate ones of the others  */
#define VP_OPF_HOLD_FWD 0x2u     /* output lives until the model's forward
                                    returns (HF embedding outputs)           */
#define VP_OPF_MODEL_END 0x4u    /* first op after the model's forward: the
                                    held outputs are released before it       */
#define VP_OPF_SHIFT_LABELS 0x8u /* loss shifts the labels (HF causal LM)    */
#define VP_OPF_PY_RMSNORM 0x10u  /* RMSNorm written in Python (HF Llama)     */
#define VP_OPF_TIED_INIT 0x20u   /* tied head: the module is built with its own
                                    weight (fp32, in_features x out_features),
                                    freed when HF ties it to the embedding    */
#define VP_OPF_ADDMM 0x40u       /* linear as torch.addmm(b, x, W) (HF Conv1D)
                                    rather than F.linear(x, W, b): the order
                                    of autocast's casts and of their grads    */
/* Python variable lifetimes: an output that a Python local keeps alive
 * after its last consumer has run. */
#define VP_OPF_HOLD_MODULE 0x80u /* ... until the enclosing sub-module (HF
                                    attention, MLP, embeddings) returns: the
                                    next op flagged VP_OPF_MODULE_RET        */
#define VP_OPF_MODULE_RET 0x100u /* last op of a sub-module's forward        */
#define VP_OPF_HOLD_ADD 0x200u   /* ... until the next residual add, where
                                    the variable is reassigned (HF GPT-2)    */
#define VP_OPF_HOLD_LAYER 0x400u /* ... until its layer returns              */
#define VP_OPF_HOLD_SEG 0x800u   /* the layer loop's variable: lives until the
                                    next layer (segment) it feeds returns    */
#define VP_OPF_HOLD_OUT 0x1000u  /* the base model's output: a local of the
                                    head's forward until it returns, after
                                    the loss (HF *ForCausalLM, *ForMaskedLM) */
/* Memory layouts (graph form). */
#define VP_OPF_STRIDED 0x2000u   /* a view whose dims are not in memory order
                                    (permute other than the identity): what
                                    reads it contiguously copies it, and the
                                    gradient coming back through it arrives
                                    in the other order                      */
#define VP_OPF_TORCH_MHA 0x4000u /* in_proj, core and out_proj of
                                    torch.nn.MultiheadAttention(batch_first=
                                    True) (graph key layout: torch_mha): the
                                    module works sequence-first on transposed
                                    views, copies q, k, v and the output, and
                                    returns its output transposed            */
/* Newer decoder families (transformer form). */
#define VP_OPF_NORM_OFFSET 0x8000u /* RMSNorm in fp32 with weight 1 + w,
                                      the output in the input's dtype
                                      (HF GemmaRMSNorm)                    */
#define VP_OPF_NORM_TOPK 0x10000u  /* router: the k weights renormalised  */
#define VP_OPF_ROUTER_GROUP 0x20000u /* router: DeepSeek-V3's sigmoid scores,
                                      group top-k (classes: experts, rows:
                                      groups)                              */
#define VP_OPF_SOFTMAX_NATIVE 0x40000u /* eager attention: softmax in the
                                         scores' dtype (GPT-2, BERT), not
                                         softmax(dtype=torch.float32)    */
/* PyTorch's tensor parallelism on the head (vp_tf.dtensor; torchtitan's
 * apply_tp, docs/DISTRIBUTED.md "FSDP2 + TP"): the cross entropy of
 * Shard(-1) logits under torch.distributed.tensor.parallel's
 * loss_parallel() (tensor/parallel/loss.py: _log_softmax and
 * _nll_loss_and_log_softmax_backward, ops/loss_parallel.c); a
 * redistribution of the last dim, Shard(-1) to Replicate (ColwiseParallel
 * output_layouts Replicate(): torchtitan's disable_loss_parallel), whose
 * backward is Shard._replicate_to_shard's clone of the rank's chunk. */
#define VP_OPF_LOSS_PARALLEL 0x80000u
#define VP_OPF_GATHER_LAST 0x100000u
/* Megatron's sequence parallelism (megatron/core/tensor_parallel/
 * layers.py, LinearWithGradAccumulationAndAsyncCommunication): a
 * column-parallel linear whose input (S/t tokens) is all-gathered into the
 * global "mpu" buffer for the GEMM and saved sharded; a row-parallel one
 * whose full output is reduce-scattered to S/t tokens. */
#define VP_OPF_SP_GATHER 0x800000u
#define VP_OPF_SP_SCATTER 0x1000000u
/* Megatron-LM's fused kernels (Transformer Engine, megatron/core/fusions):
 * a norm saves its input and the per-row statistics, no fp32 copies
 * (ops/norm.c); the cross entropy is _VocabParallelCrossEntropy's
 * (ops/embed_loss.c). Set by the Megatron op flavour of the transformer
 * builder (vp_tf.megatron). */
#define VP_OPF_MEGATRON 0x2000000u
/* Transformer Engine's fp8 linear (Megatron --fp8-format; ops/linear.c):
 * the input cast to fp8 for the GEMM and saved in one byte, the weight's
 * fp8 copy and transpose cached across micro-batches, the scaling
 * metadata; the backward's fp8 casts of the gradient and transposes. */
#define VP_OPF_FP8 0x8000000u
#define VP_OPF_FP32_LINEAR 0x4000000u /* F.linear(x.float(), W.float()):
                                      DeepSeek-V3's router gate          */

/* Encoder-decoder models and the graph form's newer ops. High bits, apart
 * from the flags above. */
#define VP_OPF_T5_NORM 0x10000000u /* T5LayerNorm (HF modeling_t5.py): the
                                      variance in fp32, the input times its
                                      rsqrt, cast to a half weight's dtype,
                                      times the weight                   */
#define VP_OPF_BILINEAR 0x20000000u /* upsample: bilinear (else nearest)  */
#define VP_OPF_TIED_LATE 0x40000000u /* an embedding or head tied to an
                                      earlier embedding, built with its own
                                      weight (fp32, classes x dim or in x
                                      out) that the tying after the whole
                                      model is built frees (HF T5: both
                                      stacks' embed_tokens and lm_head)   */

typedef struct vp_segment {
    const char *name;   /* "h.3", "layer2"                                   */
    uint32_t first_op, last_op;            /* inclusive range               */
} vp_segment;

typedef struct vp_graph vp_graph;

/* Instantiate a model for a micro-batch and a sequence length (or image
 * side; 0 = the model's default). Returns a graph owned by the caller
 * (vp_graph_free) or NULL with *err set (positions point into the model
 * file): VP_ERANGE for a shape that becomes empty or negative, VP_EOVERFLOW
 * for sizes past 64 bits, VP_ELIMIT for more than VP_MAX_OPS ops. */
vp_graph *vp_graph_build(const vp_model *m, uint64_t batch, uint64_t seq,
                         vp_error *err);
/* The same with the decoder length of an encoder-decoder model (T5):
 * `target` tokens (0: the model's default, its `target`, else seq).
 * Models without a decoder of their own ignore it. */
vp_graph *vp_graph_build_target(const vp_model *m, uint64_t batch,
                                uint64_t seq, uint64_t target,
                                vp_error *err);
void vp_graph_free(vp_graph *g);

size_t vp_graph_op_count(const vp_graph *g);
const vp_op *vp_graph_op(const vp_graph *g, size_t i);
size_t vp_graph_param_count(const vp_graph *g);     /* parameter tensors   */
const vp_param *vp_graph_param(const vp_graph *g, size_t i);
size_t vp_graph_segment_count(const vp_graph *g);
const vp_segment *vp_graph_segment(const vp_graph *g, size_t i);

/* Trainable parameter elements (shared weights counted once); *out. */
vp_status vp_graph_num_params(const vp_graph *g, uint64_t *out, vp_error *err);
/* The trainable parameters one token passes through (*out): of each
 * mixture of experts' routed experts, top_k of its experts; every other
 * parameter (the router, shared experts, dense layers) whole. Equal to
 * vp_graph_num_params for a model without experts. */
vp_status vp_graph_num_active_params(const vp_graph *g, uint64_t *out,
                                     vp_error *err);
uint64_t vp_graph_batch(const vp_graph *g);
uint64_t vp_graph_seq(const vp_graph *g);
/* The decoder length of an encoder-decoder graph, 0 for other models. */
uint64_t vp_graph_target(const vp_graph *g);
const char *vp_graph_model_name(const vp_graph *g);
/* The segments that "--checkpoint all" wraps: the model's declared
 * checkpoint units (every transformer layer; for graphs the `checkpoint`
 * list or each repeated block instance). Sets out[i] for each segment. */
void vp_graph_default_checkpoint(const vp_graph *g, bool *out);

/* Select checkpoint segments from a spec: "none", "all" (the default units)
 * or a comma-separated list of segment names or patterns ('*' matches any
 * run of characters except '.'), e.g. "layers.0,layers.1" or "h.*".
 * out has vp_graph_segment_count entries. VP_EARG when a name or pattern
 * matches no segment (the message lists some valid names). */
vp_status vp_graph_checkpoint_select(const vp_graph *g, const char *spec,
                                     bool *out, vp_error *err);

const char *vp_op_kind_name(vp_op_kind k);
const char *vp_attn_impl_name(vp_attn_impl a);

#endif
