/* Private to serve.c and serve_profile.c: the model's dimensions as vLLM
 * sees them, its weights per rank, and the profile run's memory. */
#ifndef VRAMPLAN_SERVE_IMPL_H
#define VRAMPLAN_SERVE_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/graph.h"

typedef struct sv_dims {
    uint64_t hidden;     /* residual stream width                          */
    uint64_t vocab;      /* output classes (the sampler's row width)        */
    uint64_t ffn;        /* MLP inner width                                */
    uint32_t layers;     /* decoder layers                                  */
    uint32_t heads, kv_heads, head_dim;  /* of the first layer              */
    bool gated;          /* gate and up projections (SwiGLU, GeGLU)        */
    bool rmsnorm;        /* RMSNorm: vLLM fuses residual add and norm in
                            place; LayerNorm models add out of place        */
    bool rotary;         /* rotary positions: a cos/sin cache buffer        */
} sv_dims;

/* The dimensions of a causal decoder's graph (built for batch 1). */
vp_status vp__serve_dims(const vp_graph *g, sv_dims *d, vp_error *err);

/* Bytes of the weights one rank loads: column-parallel projections split
 * over tp, row-parallel ones split on their input, K/V heads replicated
 * below tp, vocabulary padded to 64 and split, norms replicated, and the
 * rotary cos/sin cache of max_pos positions. Each tensor rounded as the
 * caching allocator rounds it. */
vp_status vp__serve_weights(const vp_graph *g, const sv_dims *d,
                            uint32_t dtype_bytes, uint32_t tp,
                            uint64_t max_pos, uint64_t *out, vp_error *err);

typedef struct sv_profile {
    uint64_t tokens;     /* max_num_batched_tokens                          */
    uint64_t reqs;       /* requests the tokens are split into              */
    uint32_t dtype_bytes, tp;
    bool eager;          /* Python-local lifetimes instead of the compiled
                            graph's free-at-last-use                       */
    bool forward_only;   /* no sampler (CUDA-graph pool estimate)           */
} sv_profile;

/* The profile run (GPUModelRunner.profile_run): the dummy forward and the
 * dummy sampler, replayed through the caching-allocator model. Peaks of
 * allocated bytes above the weights: *fwd over the forward, *smp over the
 * sampler (with the forward's outputs still held), *peak the larger. */
vp_status vp__serve_profile(const sv_dims *d, const sv_profile *p,
                            uint64_t *fwd, uint64_t *smp, uint64_t *peak,
                            vp_error *err);

#endif
