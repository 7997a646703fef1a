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
    uint64_t sliding_window; /* a config.json's sliding_window (tokens)
                                for the layers from slide_from on
                                (Mistral: all; Qwen2: max_window_layers);
                                0: every layer attends to all tokens */
    uint64_t slide_from;
    bool no_eos;        /* a config.json with no end-of-sequence token
                           (eos_token_id null or absent): generate()'s
                           min-length processors are not made          */
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
