/* Model descriptions as plain values: the transformer form's
 * hyperparameters, or the compiled graph form (graph_form.h). Nothing of
 * the loaded document is kept. Not installed. */
#ifndef VRAMPLAN_MODEL_INTERNAL_H
#define VRAMPLAN_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "util.h"
#include "vramplan/graph.h"
#include "vramplan/model.h"

/* decoder (GPT, Llama), encoder (BERT), or an encoder and a decoder with
 * cross-attention (T5; graph_encdec.c) */
typedef enum { VP_TF_DECODER, VP_TF_ENCODER, VP_TF_ENCDEC } vp_tf_type;
typedef enum { VP_NORM_LAYERNORM, VP_NORM_RMSNORM } vp_norm_kind;
typedef enum {
    VP_ACT_GELU, VP_ACT_GELU_TANH, VP_ACT_RELU, VP_ACT_SILU, VP_ACT_SWIGLU,
    VP_ACT_GEGLU
} vp_act_kind;
typedef enum {
    VP_HEAD_CAUSAL_LM, VP_HEAD_MASKED_LM, VP_HEAD_CLASSIFICATION,
    VP_HEAD_NONE
} vp_head_kind;

/* How a mixture-of-experts layer routes (the router of transformers
 * 5.x's family): softmax then top-k (Mixtral, Qwen2/3-MoE; `norm_topk`
 * renormalises the k weights), or DeepSeek-V3's sigmoid scores with a
 * bias, a top-k of groups, then a top-k within them. */
typedef enum { VP_ROUTER_SOFTMAX, VP_ROUTER_SIGMOID_GROUP } vp_router_kind;

/* Multi-head latent attention (DeepSeek-V2/V3): q through a rank
 * q_lora (0: a plain q projection), k and v from a shared latent of rank
 * kv_lora plus one rotary key of qk_rope per token. */
typedef struct vp_tf_mla {
    uint64_t q_lora, kv_lora, qk_nope, qk_rope, v_dim;
} vp_tf_mla;

/* Features of the newer decoder families (Qwen3, Gemma 1-3, Phi-3,
 * Qwen-MoE, DeepSeek-V3): all zero for the older ones, which build as
 * before. docs/MODEL_FORMAT.md, "Transformer form". */
typedef struct vp_tf_ext {
    bool qk_norm;        /* RMSNorm over each head of q and k (Qwen3)      */
    bool norm_offset;    /* RMSNorm in fp32 with weight 1 + w, the output
                            in the input's dtype (Gemma)                    */
    bool embed_scale;    /* embeddings times sqrt(hidden) (Gemma)          */
    bool post_norms;     /* norms on the attention and MLP outputs too
                            (Gemma 2, 3)                                    */
    bool packed_qkv;     /* one nn.Linear qkv_proj, q, k, v sliced (Phi-3) */
    bool fused_gate_up;  /* one gate_up_proj, chunked (Phi-3)              */
    double attn_softcap; /* tanh soft-capping of attention scores, 0: none */
    double logit_softcap;/* ... of the output logits                       */
    uint64_t window;     /* sliding-window span, 0: full attention         */
    uint32_t full_every; /* with a window: layer i attends fully when
                            (i + 1) % full_every == 0; 0: none does        */
    uint32_t window_from;/* layers before this one attend fully (Qwen's
                            max_window_layers)                              */
    vp_tf_mla mla;       /* kv_lora > 0: multi-head latent attention       */
    /* mixture of experts: which layers, the router, shared experts */
    uint64_t dense_layers; /* the first layers keep a dense MLP (DeepSeek
                              first_k_dense_replace)                       */
    uint32_t moe_every;    /* MoE in layer i when (i + 1) % moe_every == 0
                              (Qwen-MoE decoder_sparse_step; 0 or 1: all)  */
    uint64_t shared_ffn;   /* the shared experts' inner size, 0: shared
                              experts x expert_ffn                         */
    bool shared_gate;      /* sigmoid(linear(x)) scales the shared expert
                              (Qwen2-MoE)                                  */
    bool norm_topk;        /* the k routing weights renormalised           */
    vp_router_kind router;
    uint64_t n_group, topk_group;
} vp_tf_ext;

typedef struct vp_tf {
    vp_tf_type type;
    uint64_t hidden, layers, heads, kv_heads, head_dim, ffn, vocab;
    uint64_t max_positions, type_vocab, num_labels;
    bool rotary;
    vp_norm_kind norm;
    vp_act_kind act;
    bool bias, qkv_bias, fused_qkv, tied, embedding_norm, final_norm;
    bool norm_bias;
    double p_embd, p_attn, p_resid;
    vp_attn_impl attn;
    vp_head_kind head;
    uint64_t experts, top_k, expert_ffn, shared_experts;
    bool no_eos;        /* a config.json with no end-of-sequence token
                           (eos_token_id null or absent): generate()'s
                           min-length processors are not made          */
    /* a pipeline stage's share (megatron.c): stage_in, the input is the
     * previous stage's hidden states (no embeddings); stage_out, the
     * output is the last layer's (no final norm, head or loss) */
    bool stage_in, stage_out;
    /* Megatron's sequence parallelism over sp tensor-parallel ranks (0 or
     * 1: none; megatron.c): the residual stream, norms and dropouts on
     * S/sp tokens, the column-parallel linears' inputs gathered, the
     * row-parallel outputs reduce-scattered (VP_OPF_SP_GATHER, _SCATTER) */
    uint32_t sp;
    /* with sp > 1, PyTorch's tensor parallelism instead of Megatron's, as
     * torchtitan applies it (dist_tp.c): the column-parallel linears'
     * shared input all-gathered into a new tensor they save
     * (PrepareModuleInput to Replicate), the row-parallel outputs and the
     * embedding's reduce-scattered (output_layouts Shard(1)): VP_OP_
     * REDISTRIBUTE ops, no VP_OPF_SP_GATHER / _SCATTER; the head's
     * Shard(-1) logits under loss_parallel() (VP_OPF_LOSS_PARALLEL), or
     * with replicate_logits all-gathered to the whole vocabulary
     * (torchtitan's disable_loss_parallel, VP_OPF_GATHER_LAST) */
    bool dtensor, replicate_logits;
    /* an interleaved pipeline rank's model chunks (0 or 1: one; megatron.
     * c): layers / chunks layers each, each from its own received input
     * (the first rank's first from the embeddings) */
    uint32_t chunks;
    /* Megatron's context parallelism (megatron.c): the graph is one
     * rank's s/cp tokens, its attention cores Transformer Engine's ring
     * over cp ranks (vp_op.cp); 0 or 1: none */
    uint32_t cp;
    /* the Megatron op flavour (megatron.c): what Megatron-LM's fused
     * kernels keep (graph_transformer.c, VP_OPF_MEGATRON): fused norms,
     * gate and up projections in one linear_fc1 with the fused SwiGLU,
     * the flash kernel for SDPA, the vocab-parallel cross entropy on
     * unshifted labels */
    bool megatron;
    /* with it, Transformer Engine's fp8 linears in the layers (--fp8-
     * format; VP_OPF_FP8); the output layer stays in 16 bits */
    bool fp8;
    /* with it, Megatron-Core's MoE layer (graph_moe.c): the expert-
     * parallel ranks (0 or 1: none; the local experts experts / ep) and
     * the rows the busiest rank's experts receive over the balanced
     * share (vp_moe_load; 0 or 1: balanced) */
    uint32_t ep;
    double moe_load;
    uint32_t line, col; /* where the description starts */
    /* encoder-decoder (VP_TF_ENCDEC): `layers` encoder layers and
     * dec_layers decoder layers; T5's relative position bias (rel_buckets
     * buckets up to rel_max_distance, computed by the first layer of each
     * stack) when rel_buckets > 0; scale_out: the decoder's output times
     * hidden^-0.5 before a tied head (T5); gated_ffn: the MLP is
     * act(wi_0 x) * wi_1 x (T5DenseGatedActDense); t5_ff_cast: its hidden
     * state is cast to wo's dtype before wo (T5DenseActDense) */
    uint64_t dec_layers, rel_buckets, rel_max_distance;
    bool scale_out, gated_ffn, t5_ff_cast;
    vp_tf_ext x;        /* the newer families' features (hf_families.c) */
} vp_tf;

struct vp_model {
    vp_arena arena;
    const char *name;
    const char *path;
    int form; /* 0 transformer, 1 graph */
    uint64_t seq;
    uint64_t target; /* encoder-decoder: default decoder length (0: seq) */
    vp_tf tf;                     /* the transformer form               */
    const struct vp_gform *gform; /* the graph form, compiled (in arena) */
};

#endif
