/* generate()'s private interface: the state of one simulated
 * model.generate() call, shared by the driver (generate.c: the prefill,
 * the decode steps and the key/value cache) and the logits stage
 * (sampler.c: HF's logits processors, greedy or sampled tokens, and the
 * growing input_ids). docs/GENERATE.md has the rules and their sources.
 * Not installed. */
#ifndef VRAMPLAN_GENERATE_IMPL_H
#define VRAMPLAN_GENERATE_IMPL_H

#include "sim_internal.h"

/* One attention layer's cache (transformers cache_utils.py DynamicLayer,
 * DynamicSlidingWindowLayer, StaticLayer). */
typedef struct vp__gen_layer {
    uint32_t op;     /* its attention op                               */
    uint32_t k, v;   /* the K and V tensors, NONE before the first update */
    uint64_t view;   /* tokens the next update appends to            */
    uint64_t stored; /* tokens the tensors hold                      */
    uint64_t kv;     /* the key length the last update gave          */
    uint64_t kb, vb; /* bytes per token of K and of V, all sequences  */
    uint64_t window; /* sliding window, 0: full attention            */
    bool mla;        /* multi-head latent attention: K is the normed
                        latent, V the rotary key (one head each)     */
} vp__gen_layer;

/* What an op is to generate(): most run as in the graph; an attention
 * updates its layer's cache first; under MLA the cache takes the place of
 * the latent and the rotary key, and the ops that expand the cached latent
 * run over the key length instead of the new tokens. */
typedef enum {
    VP__GEN_OP,       /* as in the graph                             */
    VP__GEN_ATTN,     /* an attention layer: the cache update first  */
    VP__GEN_MLA_K,    /* MLA: the latent the cache's keys take       */
    VP__GEN_MLA_V,    /* MLA: the rotary key the cache's values take */
    VP__GEN_OVER_KV   /* MLA: kv_b_proj and its views, over the keys */
} vp__gen_role;

typedef struct vp__gen {
    sim *S;
    const vp_generate *cfg;
    vp_graph *gp, *gd;        /* the prefill (B x P) and decode (B x 1)
                                 instances of the model                */
    vp__gen_layer *layers;
    uint32_t n_layers;
    uint32_t *layer_of;       /* per op: its layer, NONE               */
    uint8_t *role;            /* per op: its vp__gen_role              */
    uint64_t rope_dim;        /* the rotary embedding's width          */
    uint32_t head_op;         /* the lm_head: from it on, the last
                                 position only (logits_to_keep = 1)   */
    uint32_t logits_op;       /* the final logits (after Gemma 2's
                                 soft-capping)                         */
    uint32_t loss_op;         /* the loss (not run)                    */
    uint64_t B, P, N;         /* sequences, prompt, new tokens         */
    uint64_t lmax;            /* a static cache's length: P + N - 1    */
    uint64_t vocab;
    uint8_t ce;               /* bytes per cache element (compute dtype) */
    bool eos;                 /* the model has an end-of-sequence token */
    /* the tensors of one call, NONE when absent */
    uint32_t logits;          /* outputs.logits of the last forward     */
    uint32_t l32, scores;     /* next_token_logits, next_token_scores   */
    uint32_t probs;           /* sampling: the softmax of the scores    */
    uint32_t ids, mask, pos;  /* input_ids, attention_mask and the
                                 positions, grown by one token a step  */
    uint32_t fmask[2];        /* the forward's materialized 4-D masks:
                                 full attention's and sliding layers'  */
    double flops;             /* of the call's forwards                 */
} vp__gen;

/* Everything _sample does between one forward and the next, after
 * forward t (0: the prefill): the kwargs' update, the fp32 logits, the
 * logits processors, the next token, input_ids' growth, `del outputs`
 * (sampler.c). */
void vp__gen_logits_stage(vp__gen *G, uint64_t t);
/* The tensors the logits stage keeps across steps, released when
 * generate() returns. */
void vp__gen_logits_release(vp__gen *G);

#endif
