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
    uint64_t kb, vb; /* bytes per token of K and of V, all sequences  */
    uint64_t window; /* sliding window, 0: full attention            */
} vp__gen_layer;

typedef struct vp__gen {
    sim *S;
    const vp_generate *cfg;
    vp_graph *gp, *gd;        /* the prefill (B x P) and decode (B x 1)
                                 instances of the model                */
    vp__gen_layer *layers;
    uint32_t n_layers;
    uint32_t *layer_of;       /* per op: its layer, NONE               */
    uint32_t logits_op;       /* the lm_head                           */
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
