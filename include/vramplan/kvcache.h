/* vramplan: the key/value cache of a decoder, per layer and per token.
 *
 * A layout lists, for every attention layer, what one token adds to the
 * cache: K and V heads times their widths for multi-head, grouped-query and
 * multi-query attention; one compressed latent plus the rotary key for
 * multi-head latent attention (DeepSeek-V2/V3 MLA); and, for sliding-window
 * layers, the window that caps how many tokens the layer keeps. Serving
 * (serve.h), dynamic batching (batching.h) and generation size their caches
 * from it.
 *
 *   vp_kv_layout kv;
 *   vp_kv_layout_from_hf("config.json", &kv, &err);      // or _from_graph
 *   uint64_t per_token;
 *   vp_kv_token_bytes(&kv, 2, 1, &per_token, &err);      // bf16, no TP
 *   vp_kv_layout_destroy(&kv);
 *
 * Byte counts are per tensor-parallel rank: K/V heads are split over the
 * ranks (replicated when there are fewer heads than ranks, as vLLM does),
 * an MLA latent is replicated on every rank. */
#ifndef VRAMPLAN_KVCACHE_H
#define VRAMPLAN_KVCACHE_H

#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/graph.h"

typedef enum {
    VP_KV_FULL,    /* attends to every earlier token                       */
    VP_KV_SLIDING, /* attends to the last `window` tokens                  */
    VP_KV_MLA      /* multi-head latent attention: one shared latent       */
} vp_kv_kind;

typedef struct vp_kv_layer {
    vp_kv_kind kind;
    uint32_t kv_heads;   /* K/V heads (MLA: 1, the latent is shared)         */
    uint32_t key_dim;    /* key width per head (MLA: kv_lora_rank +
                            qk_rope_head_dim, the cached latent and rope key) */
    uint32_t value_dim;  /* value width per head (MLA: 0)                    */
    uint64_t window;     /* VP_KV_SLIDING: tokens kept; else 0               */
} vp_kv_layer;

/* Bounds on what a layout may hold (any real model is far below). */
#define VP_KV_MAX_LAYERS 4096u
#define VP_KV_MAX_HEADS 65536u
#define VP_KV_MAX_DIM 65536u

typedef struct vp_kv_layout {
    char model[96];      /* name, for reports                               */
    uint32_t n_layers;
    uint32_t heads;      /* query heads (tensor-parallel divisibility)       */
    uint64_t max_positions; /* HF max_position_embeddings (n_positions);
                               0 when unknown (graphs)                      */
    vp_kv_layer *layer;  /* n_layers entries; vp_kv_layout_destroy frees     */
} vp_kv_layout;

/* The layout of a decoder's graph (vp_graph_build): one layer per causal
 * attention op, with its K/V heads and head width, sliding when the op has
 * a window (a config.json's sliding_window), else full attention. VP_EUNSUPPORTED
 * for a graph without causal attention (encoders, vision models: no cache).
 * *out is filled (vp_kv_layout_destroy) or left empty on error. */
vp_status vp_kv_layout_from_graph(const vp_graph *g, vp_kv_layout *out,
                                  vp_error *err);

/* The layout of a Hugging Face config.json: num_hidden_layers (n_layer),
 * num_attention_heads (n_head), num_key_value_heads (multi_query: 1),
 * head_dim (else hidden_size / heads); MLA when kv_lora_rank is set
 * (kv_lora_rank + qk_rope_head_dim); sliding windows from layer_types
 * ("sliding_attention" / "full_attention"), from use_sliding_window with
 * max_window_layers (Qwen2), or sliding_window alone (Mistral: every layer).
 * Other keys are not read. Errors carry file:line:column: VP_EIO,
 * VP_ESYNTAX, VP_ESCHEMA (missing or mistyped key, unknown layer type),
 * VP_ERANGE, VP_ELIMIT. */
vp_status vp_kv_layout_from_hf(const char *path, vp_kv_layout *out,
                               vp_error *err);
vp_status vp_kv_layout_from_hf_buf(const char *buf, size_t len,
                                   const char *path, vp_kv_layout *out,
                                   vp_error *err);

/* Release the layer array; the layout becomes empty. NULL is a no-op. */
void vp_kv_layout_destroy(vp_kv_layout *l);

/* K/V heads one tensor-parallel rank holds for a layer of kv_heads heads:
 * kv_heads / tp, or 1 (replicated) when tp >= kv_heads. VP_EARG when
 * neither divides the other (vLLM refuses such a split). */
vp_status vp_kv_heads_per_rank(uint32_t kv_heads, uint32_t tp,
                               uint32_t *out, vp_error *err);

/* Bytes one token adds to one layer's cache on one rank, for elements of
 * elem_bytes (2 for fp16/bf16, 1 for fp8). */
vp_status vp_kv_layer_token_bytes(const vp_kv_layer *l, uint32_t elem_bytes,
                                  uint32_t tp, uint64_t *out, vp_error *err);

/* Bytes one token adds to the whole cache of one rank (every layer,
 * sliding or not). VP_EOVERFLOW past 64 bits. */
vp_status vp_kv_token_bytes(const vp_kv_layout *l, uint32_t elem_bytes,
                            uint32_t tp, uint64_t *out, vp_error *err);

/* Bytes that hold one sequence of `tokens` tokens on one rank: full and
 * MLA layers keep every token, sliding layers min(tokens, window). */
vp_status vp_kv_seq_bytes(const vp_kv_layout *l, uint32_t elem_bytes,
                          uint32_t tp, uint64_t tokens, uint64_t *out,
                          vp_error *err);

const char *vp_kv_kind_name(vp_kv_kind k);

#endif
