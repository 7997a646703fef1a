/* Reading Hugging Face config.json files: the field readers that model.c
 * and the family readers of hf_families.c share. A config is loaded as a
 * YAML document (JSON is YAML), so errors point at the value at fault.
 * Not installed. */
#ifndef VRAMPLAN_HF_CONFIG_H
#define VRAMPLAN_HF_CONFIG_H

#include "model_internal.h"
#include "yaml_doc.h"

/* The mapping the fields are read from, and where errors go. */
typedef struct vp__fields {
    vp_ydoc *d;
    yaml_node_t *map;
    vp_error *err;
} vp__fields;

/* A size field (1 .. VP_MAX_DIM); absent or null: *out untouched, or an
 * error when req. */
vp_status vp__hf_u64(vp__fields *f, const char *key, uint64_t *out, bool req);
/* The same, 0 allowed. */
vp_status vp__hf_u64z(vp__fields *f, const char *key, uint64_t *out);
vp_status vp__hf_bool(vp__fields *f, const char *key, bool *out);
/* A probability in [0, 1); absent or null: *out untouched. */
vp_status vp__hf_prob(vp__fields *f, const char *key, double *out);
/* A positive number (at most max); absent or null: *out untouched. */
vp_status vp__hf_pos(vp__fields *f, const char *key, double max,
                     double *out);
/* An activation name (hidden_act and the like): the plain kind, or the
 * gated one when gated_default is VP_ACT_SWIGLU. */
vp_status vp__hf_act(vp__fields *f, const char *key,
                     vp_act_kind gated_default, vp_act_kind *out);
/* The value node of key (NULL when absent or null). */
yaml_node_t *vp__hf_node(vp__fields *f, const char *key);

/* The keys every Llama-like config has (LlamaConfig's): a decoder with
 * rotary positions, RMSNorm, no biases; hidden_size, num_hidden_layers,
 * num_attention_heads, intermediate_size, vocab_size (required),
 * num_key_value_heads, head_dim, max_position_embeddings (kept when
 * absent), attention_dropout, attention_bias (q, k, v, o biases) and
 * hidden_act (the gated kind: SwiGLU by default). */
vp_status vp__hf_llama_like(vp__fields *f, vp_tf *t);
/* The readers of the families of hf_families.c: each fills t (already
 * set to the transformer defaults, qkv_bias true) from the config, as
 * transformers 5.x's configuration and modeling files of the family
 * define the model. */
typedef vp_status vp__hf_reader(vp__fields *f, vp_tf *t, vp_error *err);
vp__hf_reader vp__hf_qwen3, vp__hf_qwen3_moe, vp__hf_qwen2_moe, vp__hf_gemma,
    vp__hf_gemma2, vp__hf_gemma3_text, vp__hf_phi3, vp__hf_deepseek_v3;

#endif
