/* Model descriptions: the vramplan YAML forms and Hugging Face config.json. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_config.h"

static const char *const TOP_KEYS[] = {"name", "description", "source", "seq",
                                       "target", "transformer", "graph",
                                       NULL};
static const char *const TF_KEYS[] = {
    "type", "hidden", "layers", "heads", "kv_heads", "head_dim", "ffn",
    "vocab", "positions", "max_positions", "norm", "norm_bias", "activation",
    "bias", "qkv_bias", "fused_qkv", "tied_embeddings", "type_vocab",
    "embedding_norm", "final_norm", "dropout", "attention", "head",
    "num_labels", "moe", "qk_norm", "embedding_scale", "post_norms",
    "packed_qkv", "fused_gate_up", "softcap", "sliding_window",
    "full_attention_every", "sliding_window_from", "mla", "encoder_decoder",
    NULL};
static const char *const DROPOUT_KEYS[] = {"embedding", "attention",
                                           "residual", NULL};
static const char *const MOE_KEYS[] = {
    "experts", "top_k", "expert_ffn", "shared_experts", "shared_ffn",
    "shared_gate", "dense_layers", "every", "norm_topk", "router", "groups",
    "topk_groups", NULL};
static const char *const SOFTCAP_KEYS[] = {"attention", "logits", NULL};
static const char *const MLA_KEYS[] = {"q_lora_rank", "kv_lora_rank",
                                       "qk_nope_dim", "qk_rope_dim",
                                       "v_head_dim", NULL};
static const char *const ROUTERS[] = {"softmax", "sigmoid_group", NULL};
static const char *const TF_TYPES[] = {"decoder", "encoder",
                                       "encoder-decoder", NULL};
static const char *const ENCDEC_KEYS[] = {
    "decoder_layers", "relative_buckets", "relative_max_distance",
    "scale_decoder_outputs", "gated_ffn", "ffn_cast", NULL};
static const char *const POSITIONS[] = {"learned", "rotary", NULL};
static const char *const NORMS[] = {"layernorm", "rmsnorm", "gemma_rmsnorm",
                                    NULL};
static const char *const ACTS[] = {"gelu", "gelu_tanh", "relu",
                                   "silu", "swiglu", "geglu", NULL};
static const char *const ATTNS[] = {"sdpa", "flash", "efficient", "eager",
                                    "math", NULL};
static const char *const HEADS[] = {"causal-lm", "masked-lm",
                                    "classification", "none", NULL};


const char *vp_model_name(const vp_model *m) { return m->name; }
uint64_t vp_model_default_seq(const vp_model *m) { return m->seq; }
const char *vp_model_form(const vp_model *m)
{
    return m->form == 0 ? "transformer" : "graph";
}

void vp_model_free(vp_model *m)
{
    if (!m)
        return;
    vp__arena_destroy(&m->arena);
    free(m);
}

typedef vp__fields fields;

/* Optional fields: absent leaves *out untouched. */
static vp_status opt_u64(fields *f, const char *key, uint64_t min,
                         uint64_t *out)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n)
        return VP_OK;
    return vp__yget_u64(f->d, n, min, VP_MAX_DIM, out, f->err);
}

static vp_status req_u64(fields *f, const char *key, uint64_t *out,
                         const char *what)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n)
        return vp__yerr(f->d, f->map, VP_ESCHEMA, f->err,
                        "missing required key '%s' in %s", key, what);
    return vp__yget_u64(f->d, n, 1, VP_MAX_DIM, out, f->err);
}

static vp_status opt_bool(fields *f, const char *key, bool *out)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n)
        return VP_OK;
    return vp__yget_bool(f->d, n, out, f->err);
}

static vp_status opt_enum(fields *f, const char *key,
                          const char *const *choices, int *out)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n)
        return VP_OK;
    return vp__yget_enum(f->d, n, choices, out, f->err);
}

static vp_status opt_prob(fields *f, const char *key, double *out)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n || vp__yis_null(n))
        return VP_OK;
    return vp__yget_prob(f->d, n, out, f->err);
}

/* Where each hyperparameter is written, for errors that point at it. */
typedef struct {
    const char *hidden, *heads, *kv_heads, *head_dim, *layers, *top_k,
        *experts;
    bool moe_submap; /* vramplan YAML: top_k and experts under `moe:` */
} tf_keys;

static const tf_keys YAML_KEYS = {"hidden", "heads", "kv_heads", "head_dim",
                                  "layers", "top_k", "experts", true};
static const tf_keys GPT2_KEYS = {"n_embd", "n_head", "n_head", "n_embd",
                                  "n_layer", NULL, NULL, false};
static const tf_keys HF_KEYS = {"hidden_size", "num_attention_heads",
                                "num_key_value_heads", "head_dim",
                                "num_hidden_layers", "num_experts_per_tok",
                                "num_local_experts", false};
static const tf_keys QWEN_MOE_KEYS = {"hidden_size", "num_attention_heads",
                                      "num_key_value_heads", "head_dim",
                                      "num_hidden_layers",
                                      "num_experts_per_tok", "num_experts",
                                      false};
static const tf_keys DEEPSEEK_KEYS = {"hidden_size", "num_attention_heads",
                                      "num_key_value_heads", "qk_nope_head_dim",
                                      "num_hidden_layers",
                                      "num_experts_per_tok",
                                      "n_routed_experts", false};
/* t5 and mt5 (hf_t5.c); errors point at their keys. */
static const tf_keys T5_KEYS = {"d_model", "num_heads", "num_heads", "d_kv",
                                "num_layers", NULL, NULL, false};

/* The value node of `key` in map (or under its `moe:` map), else map. */
static yaml_node_t *key_at(vp_ydoc *d, yaml_node_t *map, const char *key,
                           bool in_moe)
{
    if (!key)
        return map;
    yaml_node_t *m = map;
    if (in_moe) {
        yaml_node_t *mm = vp__ymap_get(d, map, "moe", NULL);
        if (mm)
            m = mm;
    }
    yaml_node_t *n = vp__ymap_get(d, m, key, NULL);
    return n ? n : map;
}

/* Checks of the newer families' features (vp_tf_ext); errors point at
 * the description. MLA sets head_dim to the q/k head width. */
static vp_status tf_validate_ext(vp_ydoc *d, yaml_node_t *at, vp_tf *t,
                                 vp_error *err)
{
    vp_tf_ext *x = &t->x;
    const vp_tf_mla *a = &x->mla;
#define BAD(code, ...) return vp__yerr(d, at, code, err, __VA_ARGS__)
    if (x->packed_qkv && t->fused_qkv)
        BAD(VP_ESCHEMA, "fused_qkv (GPT-2's Conv1D) and packed_qkv (one "
                        "nn.Linear) exclude each other");
    if (x->fused_gate_up && t->act != VP_ACT_SWIGLU && t->act != VP_ACT_GEGLU)
        BAD(VP_ESCHEMA, "fused_gate_up needs a gated activation (swiglu or "
                        "geglu)");
    if (a->kv_lora) {
        if (!t->rotary)
            BAD(VP_ESCHEMA, "multi-head latent attention (mla) needs "
                            "rotary positions");
        if (t->fused_qkv || x->packed_qkv || x->qk_norm)
            BAD(VP_ESCHEMA, "mla makes its own projections: no fused_qkv, "
                            "packed_qkv or qk_norm with it");
        if (a->qk_rope % 2)
            BAD(VP_ERANGE, "mla qk_rope_dim (%llu) must be even",
                (unsigned long long)a->qk_rope);
        uint64_t w;
        if (!vp_mul_u64(t->heads, a->qk_nope + a->v_dim, &w) ||
            !vp_mul_u64(t->heads, a->qk_nope + a->qk_rope, &w))
            BAD(VP_EOVERFLOW, "mla: heads x head widths overflows 64 bits");
        t->head_dim = a->qk_nope + a->qk_rope;
    }
    if (x->qk_norm && t->fused_qkv)
        BAD(VP_ESCHEMA, "qk_norm needs separate or packed q, k, v "
                        "projections, not fused_qkv");
    if (!x->window && (x->full_every || x->window_from))
        BAD(VP_ESCHEMA, "full_attention_every and sliding_window_from need "
                        "a sliding_window");
    if (!t->experts && (x->dense_layers || x->moe_every > 1 ||
                        x->shared_ffn || x->shared_gate))
        BAD(VP_ESCHEMA, "dense layers, shared experts and the MoE period "
                        "need experts");
    if (!t->experts)
        return VP_OK;
    if (x->dense_layers > t->layers)
        BAD(VP_ERANGE, "%llu dense layers is more than the %llu layers",
            (unsigned long long)x->dense_layers,
            (unsigned long long)t->layers);
    if (x->shared_ffn && !t->shared_experts)
        t->shared_experts = 1;
    if (x->shared_gate && !t->shared_experts)
        BAD(VP_ESCHEMA, "shared_gate needs a shared expert");
    if (x->router == VP_ROUTER_SIGMOID_GROUP) {
        uint64_t g = x->n_group ? x->n_group : 1;
        uint64_t tg = x->topk_group ? x->topk_group : g;
        if (t->experts % g || tg > g || t->top_k > tg * (t->experts / g))
            BAD(VP_ERANGE, "grouped routing: the %llu groups must divide "
                           "the %llu experts, and top_k %llu fit in the "
                           "%llu groups kept",
                (unsigned long long)g, (unsigned long long)t->experts,
                (unsigned long long)t->top_k, (unsigned long long)tg);
        x->n_group = g;
        x->topk_group = tg;
    }
#undef BAD
    return VP_OK;
}

/* Checks shared by every source of transformer hyperparameters; errors
 * point at the value at fault. */
static vp_status tf_validate(vp_ydoc *d, yaml_node_t *at, vp_tf *t,
                             const tf_keys *k, vp_error *err)
{
    VP_TRY(tf_validate_ext(d, at, t, err));
    if (t->kv_heads == 0)
        t->kv_heads = t->heads;
    if (t->head_dim == 0) {
        if (t->hidden % t->heads != 0)
            return vp__yerr(d, key_at(d, at, k->heads, false), VP_ESCHEMA,
                            err,
                            "hidden (%llu) is not a multiple of heads (%llu); "
                            "give head_dim",
                            (unsigned long long)t->hidden,
                            (unsigned long long)t->heads);
        t->head_dim = t->hidden / t->heads;
    }
    if (t->heads % t->kv_heads != 0)
        return vp__yerr(d, key_at(d, at, k->kv_heads, false), VP_ESCHEMA,
                        err,
                        "heads (%llu) is not a multiple of kv_heads (%llu)",
                        (unsigned long long)t->heads,
                        (unsigned long long)t->kv_heads);
    /* the projections' widths must fit 64 bits with room for batch x seq */
    uint64_t qd, kvd, qkv;
    if (!vp_mul_u64(t->heads, t->head_dim, &qd) ||
        !vp_mul_u64(t->kv_heads, t->head_dim, &kvd) ||
        !vp_mul_u64(kvd, 2, &kvd) || !vp_add_u64(qd, kvd, &qkv))
        return vp__yerr(d, key_at(d, at, k->head_dim, false), VP_EOVERFLOW,
                        err,
                        "heads x head_dim (%llu x %llu) overflows 64 bits",
                        (unsigned long long)t->heads,
                        (unsigned long long)t->head_dim);
    if (!t->rotary && t->max_positions == 0 && !t->rel_buckets)
        return vp__yerr(d, at, VP_ESCHEMA, err,
                        "learned positions need max_positions");
    if (t->experts) {
        if (t->top_k == 0 || t->top_k > t->experts)
            return vp__yerr(d, key_at(d, at, k->top_k, k->moe_submap),
                            VP_ERANGE, err,
                            "moe top_k (%llu) must be between 1 and experts "
                            "(%llu)",
                            (unsigned long long)t->top_k,
                            (unsigned long long)t->experts);
        if (t->expert_ffn == 0)
            t->expert_ffn = t->ffn;
    }
    if (t->head == VP_HEAD_CLASSIFICATION && t->num_labels == 0)
        t->num_labels = 2;
    if (t->layers > VP_MAX_LAYERS)
        return vp__yerr(d, key_at(d, at, k->layers, false), VP_ELIMIT, err,
                        "%llu layers is more than the limit of %u",
                        (unsigned long long)t->layers, VP_MAX_LAYERS);
    if (t->experts > 4096)
        return vp__yerr(d, key_at(d, at, k->experts, k->moe_submap),
                        VP_ELIMIT, err,
                        "%llu experts is more than the limit of 4096",
                        (unsigned long long)t->experts);
    /* each expert of each layer is at least five ops (dispatch, two
     * linears, the activation, combine): refused before they are built */
    if (t->layers * t->experts > VP_MAX_OPS / 5)
        return vp__yerr(d, key_at(d, at, k->experts, k->moe_submap),
                        VP_ELIMIT, err,
                        "%llu layers of %llu experts expand to more than "
                        "%u ops",
                        (unsigned long long)t->layers,
                        (unsigned long long)t->experts, VP_MAX_OPS);
    return VP_OK;
}

/* A transformer's default sequence length: its learned positions, at
 * most VP_DEFAULT_SEQ. */
static uint64_t default_seq(const vp_tf *t)
{
    return t->max_positions && t->max_positions < VP_DEFAULT_SEQ
               ? t->max_positions
               : VP_DEFAULT_SEQ;
}

static void tf_defaults(vp_tf *t)
{
    memset(t, 0, sizeof *t);
    t->bias = true;
    t->norm_bias = true;
    t->attn = VP_ATTN_SDPA;
    t->head = VP_HEAD_CAUSAL_LM;
}

/* The `encoder_decoder` map of an encoder-decoder (T5-style: pre-norm
 * blocks, relative position bias, cross-attention in the decoder). */
static vp_status parse_encdec(vp_ydoc *d, yaml_node_t *tn, vp_tf *t,
                              vp_error *err)
{
    yaml_node_t *ek = NULL;
    yaml_node_t *en = vp__ymap_get(d, tn, "encoder_decoder", &ek);
    if (t->type != VP_TF_ENCDEC) {
        if (en)
            return vp__yerr(d, ek, VP_ESCHEMA, err,
                            "'encoder_decoder' needs type encoder-decoder");
        return VP_OK;
    }
    t->dec_layers = t->layers;
    t->rel_buckets = 32;
    t->rel_max_distance = 128;
    t->scale_out = t->tied;
    t->t5_ff_cast = true;
    if (en) {
        VP_TRY(vp__ymap_check(d, en, ENCDEC_KEYS, "encoder_decoder", err));
        fields ef = {d, en, err};
        VP_TRY(opt_u64(&ef, "decoder_layers", 1, &t->dec_layers));
        VP_TRY(opt_u64(&ef, "relative_buckets", 1, &t->rel_buckets));
        VP_TRY(opt_u64(&ef, "relative_max_distance", 1,
                       &t->rel_max_distance));
        VP_TRY(opt_bool(&ef, "scale_decoder_outputs", &t->scale_out));
        VP_TRY(opt_bool(&ef, "gated_ffn", &t->gated_ffn));
        VP_TRY(opt_bool(&ef, "ffn_cast", &t->t5_ff_cast));
    }
    yaml_node_t *pk = NULL;
    if (!vp__ymap_get(d, tn, "max_positions", &pk))
        vp__ymap_get(d, tn, "positions", &pk);
    if (t->rotary || pk)
        return vp__yerr(d, pk ? pk : tn, VP_ESCHEMA, err,
                        "an encoder-decoder has relative positions (T5): "
                        "give neither 'positions' nor 'max_positions'");
    if (t->act == VP_ACT_SWIGLU || t->act == VP_ACT_GEGLU)
        return vp__yerr(d, vp__ymap_get(d, tn, "activation", NULL),
                        VP_ESCHEMA, err,
                        "an encoder-decoder names its MLP's activation "
                        "(relu, gelu, gelu_tanh, silu); a gated MLP is "
                        "encoder_decoder: {gated_ffn: true}");
    if (t->dec_layers > VP_MAX_REPEAT)
        return vp__yerr(d, en, VP_ELIMIT, err,
                        "%llu decoder layers is more than the limit of %u",
                        (unsigned long long)t->dec_layers, VP_MAX_REPEAT);
    t->scale_out = t->scale_out && t->tied;
    return VP_OK;
}

/* A u32 field (a layer count or a period). */
static vp_status opt_u32(fields *f, const char *key, uint64_t min,
                         uint32_t *out)
{
    uint64_t v = *out;
    VP_TRY(opt_u64(f, key, min, &v));
    if (v > VP_MAX_REPEAT)
        return vp__yerr(f->d, vp__ymap_get(f->d, f->map, key, NULL),
                        VP_ELIMIT, f->err, "'%s' %llu is more than the "
                        "limit of %u", key, (unsigned long long)v,
                        VP_MAX_REPEAT);
    *out = (uint32_t)v;
    return VP_OK;
}

/* The `moe:` section: the experts, which layers have them, the router
 * and the shared experts. */
static vp_status parse_moe(vp_ydoc *d, yaml_node_t *mn, vp_tf *t,
                           vp_error *err)
{
    VP_TRY(vp__ymap_check(d, mn, MOE_KEYS, "moe", err));
    fields mf = {d, mn, err};
    vp_tf_ext *x = &t->x;
    int v = 0;
    VP_TRY(req_u64(&mf, "experts", &t->experts, "moe"));
    VP_TRY(req_u64(&mf, "top_k", &t->top_k, "moe"));
    VP_TRY(opt_u64(&mf, "expert_ffn", 1, &t->expert_ffn));
    VP_TRY(opt_u64(&mf, "shared_experts", 0, &t->shared_experts));
    VP_TRY(opt_u64(&mf, "shared_ffn", 1, &x->shared_ffn));
    VP_TRY(opt_bool(&mf, "shared_gate", &x->shared_gate));
    VP_TRY(opt_u64(&mf, "dense_layers", 0, &x->dense_layers));
    VP_TRY(opt_u32(&mf, "every", 1, &x->moe_every));
    VP_TRY(opt_bool(&mf, "norm_topk", &x->norm_topk));
    VP_TRY(opt_enum(&mf, "router", ROUTERS, &v));
    x->router = (vp_router_kind)v;
    VP_TRY(opt_u64(&mf, "groups", 1, &x->n_group));
    VP_TRY(opt_u64(&mf, "topk_groups", 1, &x->topk_group));
    return VP_OK;
}

/* The keys of the newer families (vp_tf_ext). */
static vp_status parse_tf_ext(fields *f, vp_tf *t)
{
    vp_ydoc *d = f->d;
    vp_tf_ext *x = &t->x;
    VP_TRY(opt_bool(f, "qk_norm", &x->qk_norm));
    VP_TRY(opt_bool(f, "embedding_scale", &x->embed_scale));
    VP_TRY(opt_bool(f, "post_norms", &x->post_norms));
    VP_TRY(opt_bool(f, "packed_qkv", &x->packed_qkv));
    VP_TRY(opt_bool(f, "fused_gate_up", &x->fused_gate_up));
    VP_TRY(opt_u64(f, "sliding_window", 1, &x->window));
    VP_TRY(opt_u32(f, "full_attention_every", 1, &x->full_every));
    VP_TRY(opt_u32(f, "sliding_window_from", 0, &x->window_from));
    yaml_node_t *sn = vp__ymap_get(d, f->map, "softcap", NULL);
    if (sn) {
        VP_TRY(vp__ymap_check(d, sn, SOFTCAP_KEYS, "softcap", f->err));
        yaml_node_t *n;
        if ((n = vp__ymap_get(d, sn, "attention", NULL)))
            VP_TRY(vp__yget_pos(d, n, 1e6, &x->attn_softcap, f->err));
        if ((n = vp__ymap_get(d, sn, "logits", NULL)))
            VP_TRY(vp__yget_pos(d, n, 1e6, &x->logit_softcap, f->err));
    }
    yaml_node_t *an = vp__ymap_get(d, f->map, "mla", NULL);
    if (an) {
        VP_TRY(vp__ymap_check(d, an, MLA_KEYS, "mla", f->err));
        fields af = {d, an, f->err};
        vp_tf_mla *a = &x->mla;
        VP_TRY(opt_u64(&af, "q_lora_rank", 0, &a->q_lora));
        VP_TRY(req_u64(&af, "kv_lora_rank", &a->kv_lora, "mla"));
        VP_TRY(req_u64(&af, "qk_nope_dim", &a->qk_nope, "mla"));
        VP_TRY(req_u64(&af, "qk_rope_dim", &a->qk_rope, "mla"));
        VP_TRY(req_u64(&af, "v_head_dim", &a->v_dim, "mla"));
    }
    return VP_OK;
}

static vp_status parse_transformer(vp_model *m, vp_ydoc *d, yaml_node_t *tn,
                                   vp_error *err)
{
    VP_TRY(vp__ymap_check(d, tn, TF_KEYS, "transformer", err));
    vp_tf *t = &m->tf;
    tf_defaults(t);
    fields f = {d, tn, err};
    int v;
    yaml_node_t *tyn = vp__ymap_get(d, tn, "type", NULL);
    if (!tyn)
        return vp__yerr(d, tn, VP_ESCHEMA, err,
                        "missing required key 'type' in transformer "
                        "(decoder or encoder)");
    VP_TRY(vp__yget_enum(d, tyn, TF_TYPES, &v, err));
    t->type = (vp_tf_type)v;
    t->final_norm = t->type != VP_TF_ENCODER;
    if (t->type == VP_TF_ENCODER)
        t->head = VP_HEAD_MASKED_LM;
    VP_TRY(req_u64(&f, "hidden", &t->hidden, "transformer"));
    VP_TRY(req_u64(&f, "layers", &t->layers, "transformer"));
    VP_TRY(req_u64(&f, "heads", &t->heads, "transformer"));
    VP_TRY(opt_u64(&f, "kv_heads", 1, &t->kv_heads));
    VP_TRY(opt_u64(&f, "head_dim", 1, &t->head_dim));
    VP_TRY(req_u64(&f, "ffn", &t->ffn, "transformer"));
    VP_TRY(req_u64(&f, "vocab", &t->vocab, "transformer"));
    v = 0;
    VP_TRY(opt_enum(&f, "positions", POSITIONS, &v));
    t->rotary = v == 1;
    VP_TRY(opt_u64(&f, "max_positions", 1, &t->max_positions));
    v = 0;
    VP_TRY(opt_enum(&f, "norm", NORMS, &v));
    t->norm = v == 2 ? VP_NORM_RMSNORM : (vp_norm_kind)v;
    t->x.norm_offset = v == 2;
    t->norm_bias = t->norm == VP_NORM_LAYERNORM;
    VP_TRY(opt_bool(&f, "norm_bias", &t->norm_bias));
    v = 0;
    VP_TRY(opt_enum(&f, "activation", ACTS, &v));
    t->act = (vp_act_kind)v;
    VP_TRY(opt_bool(&f, "bias", &t->bias));
    t->qkv_bias = t->bias;
    VP_TRY(opt_bool(&f, "qkv_bias", &t->qkv_bias));
    VP_TRY(opt_bool(&f, "fused_qkv", &t->fused_qkv));
    VP_TRY(opt_bool(&f, "tied_embeddings", &t->tied));
    VP_TRY(opt_u64(&f, "type_vocab", 0, &t->type_vocab));
    VP_TRY(opt_bool(&f, "embedding_norm", &t->embedding_norm));
    VP_TRY(opt_bool(&f, "final_norm", &t->final_norm));
    yaml_node_t *dn = vp__ymap_get(d, tn, "dropout", NULL);
    if (dn) {
        VP_TRY(vp__ymap_check(d, dn, DROPOUT_KEYS, "dropout", err));
        fields df = {d, dn, err};
        VP_TRY(opt_prob(&df, "embedding", &t->p_embd));
        VP_TRY(opt_prob(&df, "attention", &t->p_attn));
        VP_TRY(opt_prob(&df, "residual", &t->p_resid));
    }
    v = 0;
    VP_TRY(opt_enum(&f, "attention", ATTNS, &v));
    t->attn = (vp_attn_impl)v;
    v = (int)t->head;
    VP_TRY(opt_enum(&f, "head", HEADS, &v));
    t->head = (vp_head_kind)v;
    VP_TRY(opt_u64(&f, "num_labels", 1, &t->num_labels));
    yaml_node_t *mn = vp__ymap_get(d, tn, "moe", NULL);
    if (mn)
        VP_TRY(parse_moe(d, mn, t, err));
    VP_TRY(parse_tf_ext(&f, t));
    VP_TRY(parse_encdec(d, tn, t, err));
    t->line = (uint32_t)tn->start_mark.line + 1;
    t->col = (uint32_t)tn->start_mark.column + 1;
    return tf_validate(d, tn, t, &YAML_KEYS, err);
}

/* ---- Hugging Face config.json ------------------------------------------ */

vp_status vp__hf_u64(fields *f, const char *key, uint64_t *out, bool req)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n || vp__yis_null(n)) {
        if (req)
            return vp__yerr(f->d, f->map, VP_ESCHEMA, f->err,
                            "missing required key \"%s\" in the config", key);
        return VP_OK;
    }
    return vp__yget_u64(f->d, n, 1, VP_MAX_DIM, out, f->err);
}

vp_status vp__hf_u64z(fields *f, const char *key, uint64_t *out)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n || vp__yis_null(n))
        return VP_OK;
    return vp__yget_u64(f->d, n, 0, VP_MAX_DIM, out, f->err);
}

vp_status vp__hf_prob(fields *f, const char *key, double *out)
{
    return opt_prob(f, key, out);
}

vp_status vp__hf_pos(fields *f, const char *key, double max, double *out)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n || vp__yis_null(n))
        return VP_OK;
    return vp__yget_pos(f->d, n, max, out, f->err);
}

yaml_node_t *vp__hf_node(fields *f, const char *key)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    return n && !vp__yis_null(n) ? n : NULL;
}

vp_status vp__hf_bool(fields *f, const char *key, bool *out)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n || vp__yis_null(n))
        return VP_OK;
    return vp__yget_bool(f->d, n, out, f->err);
}

vp_status vp__hf_act(fields *f, const char *key, vp_act_kind gated_default,
                     vp_act_kind *out)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n || vp__yis_null(n))
        return VP_OK;
    const char *v = vp__yscalar(n);
    if (!v)
        return vp__yerr(f->d, n, VP_ESCHEMA, f->err,
                        "\"%s\" must be a string", key);
    static const struct {
        const char *name;
        vp_act_kind plain, gated;
    } map[] = {
        {"gelu", VP_ACT_GELU, VP_ACT_GEGLU},
        {"gelu_new", VP_ACT_GELU_TANH, VP_ACT_GEGLU},
        {"gelu_pytorch_tanh", VP_ACT_GELU_TANH, VP_ACT_GEGLU},
        {"gelu_fast", VP_ACT_GELU_TANH, VP_ACT_GEGLU},
        {"relu", VP_ACT_RELU, VP_ACT_RELU},
        {"silu", VP_ACT_SILU, VP_ACT_SWIGLU},
        {"swish", VP_ACT_SILU, VP_ACT_SWIGLU},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (!strcmp(v, map[i].name)) {
            *out = gated_default == VP_ACT_SWIGLU ? map[i].gated : map[i].plain;
            return VP_OK;
        }
    }
    return vp__yerr(f->d, n, VP_EUNSUPPORTED, f->err,
                    "unsupported activation \"%.64s\" (supported: gelu, "
                    "gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu, "
                    "swish)",
                    v);
}

static vp_status hf_head(vp_model *m, vp_ydoc *d, yaml_node_t *root,
                         vp_error *err)
{
    yaml_node_t *an = vp__ymap_get(d, root, "architectures", NULL);
    if (!an || vp__yis_null(an))
        return VP_OK; /* keep the model type's default head */
    if (an->type != YAML_SEQUENCE_NODE ||
        an->data.sequence.items.top == an->data.sequence.items.start)
        return vp__yerr(d, an, VP_ESCHEMA, err,
                        "\"architectures\" must be a non-empty list");
    yaml_node_t *first = vp__ynode(d, *an->data.sequence.items.start);
    const char *a = vp__yscalar(first);
    if (!a)
        return vp__yerr(d, first, VP_ESCHEMA, err,
                        "\"architectures\" entries must be strings");
    size_t n = strlen(a);
#define ENDS(s) (n >= strlen(s) && !strcmp(a + n - strlen(s), s))
    if (ENDS("ForCausalLM") || ENDS("LMHeadModel"))
        m->tf.head = VP_HEAD_CAUSAL_LM;
    else if (ENDS("ForMaskedLM"))
        m->tf.head = VP_HEAD_MASKED_LM;
    else if (ENDS("ForSequenceClassification"))
        m->tf.head = VP_HEAD_CLASSIFICATION;
    else if (ENDS("Model"))
        m->tf.head = VP_HEAD_NONE;
    else
        return vp__yerr(d, first, VP_EUNSUPPORTED, err,
                        "unsupported architecture \"%.64s\" (supported: "
                        "...ForCausalLM, ...LMHeadModel, ...ForMaskedLM, "
                        "...ForSequenceClassification, ...Model)",
                        a);
#undef ENDS
    return VP_OK;
}

/* HF GPT2Config (modeling_gpt2.py: Conv1D projections, tied lm_head,
 * gelu_new, dropout 0.1 by default). */
static vp_status hf_gpt2(fields *f, vp_tf *t, vp_error *err)
{
    t->type = VP_TF_DECODER;
    t->fused_qkv = true;
    t->tied = true;
    t->final_norm = true;
    t->act = VP_ACT_GELU_TANH;
    t->p_embd = t->p_attn = t->p_resid = 0.1;
    VP_TRY(vp__hf_u64(f, "n_embd", &t->hidden, true));
    VP_TRY(vp__hf_u64(f, "n_layer", &t->layers, true));
    VP_TRY(vp__hf_u64(f, "n_head", &t->heads, true));
    VP_TRY(vp__hf_u64(f, "vocab_size", &t->vocab, true));
    VP_TRY(vp__hf_u64(f, "n_positions", &t->max_positions, true));
    t->ffn = 0;
    VP_TRY(vp__hf_u64(f, "n_inner", &t->ffn, false));
    if (t->ffn == 0 && !vp_mul_u64(4, t->hidden, &t->ffn))
        return vp_error_set(err, VP_EOVERFLOW, "n_inner overflows");
    VP_TRY(vp__hf_act(f, "activation_function", VP_ACT_GELU, &t->act));
    fields pf = *f;
    VP_TRY(opt_prob(&pf, "embd_pdrop", &t->p_embd));
    VP_TRY(opt_prob(&pf, "attn_pdrop", &t->p_attn));
    VP_TRY(opt_prob(&pf, "resid_pdrop", &t->p_resid));
    return VP_OK;
}

/* HF BertConfig (BertForMaskedLM by default: tied decoder, token types,
 * the embedding LayerNorm, no final norm). */
static vp_status hf_bert(fields *f, vp_tf *t, vp_error *err)
{
    t->type = VP_TF_ENCODER;
    t->tied = true;
    t->embedding_norm = true;
    t->final_norm = false;
    t->act = VP_ACT_GELU;
    t->head = VP_HEAD_MASKED_LM;
    t->type_vocab = 2;
    t->max_positions = 512;
    t->p_embd = t->p_attn = t->p_resid = 0.1;
    VP_TRY(vp__hf_u64(f, "hidden_size", &t->hidden, true));
    VP_TRY(vp__hf_u64(f, "num_hidden_layers", &t->layers, true));
    VP_TRY(vp__hf_u64(f, "num_attention_heads", &t->heads, true));
    VP_TRY(vp__hf_u64(f, "intermediate_size", &t->ffn, true));
    VP_TRY(vp__hf_u64(f, "vocab_size", &t->vocab, true));
    VP_TRY(vp__hf_u64(f, "max_position_embeddings", &t->max_positions, false));
    yaml_node_t *tvn = vp__ymap_get(f->d, f->map, "type_vocab_size", NULL);
    if (tvn && !vp__yis_null(tvn))
        VP_TRY(vp__yget_u64(f->d, tvn, 0, VP_MAX_DIM, &t->type_vocab, err));
    VP_TRY(vp__hf_act(f, "hidden_act", VP_ACT_GELU, &t->act));
    VP_TRY(opt_prob(f, "hidden_dropout_prob", &t->p_resid));
    t->p_embd = t->p_resid;
    VP_TRY(opt_prob(f, "attention_probs_dropout_prob", &t->p_attn));
    return VP_OK;
}

/* HF LlamaConfig and its relatives (Mistral, Mixtral, Qwen2): rotary,
 * RMSNorm, SwiGLU, no biases (Qwen2: q, k, v biases). */
static vp_status hf_llama(fields *f, vp_tf *t, const char *type)
{
    t->max_positions = 2048; /* LlamaConfig's max_position_embeddings */
    VP_TRY(vp__hf_llama_like(f, t));
    if (!strcmp(type, "qwen2")) /* Qwen2Attention: q, k, v biases always */
        t->qkv_bias = true;
    VP_TRY(vp__hf_bool(f, "mlp_bias", &t->bias));
    if (!strcmp(type, "mixtral")) {
        VP_TRY(vp__hf_u64(f, "num_local_experts", &t->experts, true));
        VP_TRY(vp__hf_u64(f, "num_experts_per_tok", &t->top_k, true));
    }
    return VP_OK;
}

static vp_status hf_llama_only(fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    return hf_llama(f, t, "llama");
}

/* layer_types of a MistralConfig or Qwen2Config (transformers 5.x): the
 * full_attention layers, then the sliding_attention ones from
 * x.window_from on; full layers after sliding ones are not modelled for
 * these families (Gemma's patterns: hf_families.c). */
static vp_status hf_mono_layer_types(fields *f, vp_tf *t)
{
    yaml_node_t *ty = vp__hf_node(f, "layer_types");
    if (!ty)
        return VP_OK;
    if (ty->type != YAML_SEQUENCE_NODE ||
        ty->data.sequence.items.top - ty->data.sequence.items.start !=
            (ptrdiff_t)t->layers)
        return vp__yerr(f->d, ty, VP_ESCHEMA, f->err,
                        "layer_types must list one type per hidden layer");
    uint64_t i = 0, from = t->layers;
    for (yaml_node_item_t *it = ty->data.sequence.items.start;
         it < ty->data.sequence.items.top; it++, i++) {
        yaml_node_t *n = vp__ynode(f->d, *it);
        const char *v = vp__yscalar(n);
        bool slide = v && !strcmp(v, "sliding_attention");
        if (!slide && !(v && !strcmp(v, "full_attention")))
            return vp__yerr(f->d, n, VP_ESCHEMA, f->err,
                            "a layer type other than full_attention and "
                            "sliding_attention");
        if (slide && from == t->layers)
            from = i;
        if (!slide && from < t->layers)
            return vp__yerr(f->d, n, VP_EUNSUPPORTED, f->err,
                            "full-attention layers after sliding ones are "
                            "not modelled");
    }
    if (from == t->layers) {
        t->x.window = 0;
        return VP_OK;
    }
    if (!t->x.window)
        VP_TRY(vp__hf_u64z(f, "sliding_window", &t->x.window));
    if (!t->x.window)
        return vp__yerr(f->d, ty, VP_ESCHEMA, f->err,
                        "sliding_attention layers need a sliding_window");
    t->x.window_from = (uint32_t)from; /* < layers */
    return VP_OK;
}

/* MistralConfig: Llama's shapes with a sliding window (modeling_mistral.py:
 * every layer windowed when sliding_window is set). */
static vp_status hf_mistral(fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    VP_TRY(hf_llama(f, t, "mistral"));
    VP_TRY(vp__hf_u64z(f, "sliding_window", &t->x.window));
    return hf_mono_layer_types(f, t);
}

static vp_status hf_mixtral(fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    VP_TRY(hf_llama(f, t, "mixtral"));
    return vp__hf_u64z(f, "sliding_window", &t->x.window);
}

/* Qwen2Config: q, k, v biases; a window from max_window_layers on when
 * use_sliding_window (modeling_qwen2.py, configuration_qwen2.py). */
static vp_status hf_qwen2(fields *f, vp_tf *t, vp_error *err)
{
    (void)err;
    VP_TRY(hf_llama(f, t, "qwen2"));
    bool sw = false;
    VP_TRY(vp__hf_bool(f, "use_sliding_window", &sw));
    if (sw) {
        uint64_t from = 28; /* Qwen2Config's max_window_layers */
        t->x.window = 4096;
        VP_TRY(vp__hf_u64z(f, "sliding_window", &t->x.window));
        VP_TRY(vp__hf_u64z(f, "max_window_layers", &from));
        t->x.window_from =
            from > VP_MAX_REPEAT ? VP_MAX_REPEAT : (uint32_t)from;
    }
    return hf_mono_layer_types(f, t);
}

/* The model_types read, the reader of each and the names of the keys
 * that its errors point at. */
static const struct hf_type_row {
    const char *type;
    vp__hf_reader *read;
    const tf_keys *keys;
} HF_READERS[] = {
    {"gpt2", hf_gpt2, &GPT2_KEYS},
    {"llama", hf_llama_only, &HF_KEYS},
    {"mistral", hf_mistral, &HF_KEYS},
    {"mixtral", hf_mixtral, &HF_KEYS},
    {"qwen2", hf_qwen2, &HF_KEYS},
    {"bert", hf_bert, &HF_KEYS},
    {"qwen3", vp__hf_qwen3, &HF_KEYS},
    {"qwen3_moe", vp__hf_qwen3_moe, &QWEN_MOE_KEYS},
    {"qwen2_moe", vp__hf_qwen2_moe, &QWEN_MOE_KEYS},
    {"gemma", vp__hf_gemma, &HF_KEYS},
    {"gemma2", vp__hf_gemma2, &HF_KEYS},
    {"gemma3_text", vp__hf_gemma3_text, &HF_KEYS},
    {"phi3", vp__hf_phi3, &HF_KEYS},
    {"deepseek_v3", vp__hf_deepseek_v3, &DEEPSEEK_KEYS},
    {"t5", NULL, &T5_KEYS}, /* encoder-decoders: parse_hf_t5 */
    {"mt5", NULL, &T5_KEYS},
};
#define N_HF_READERS (sizeof HF_READERS / sizeof HF_READERS[0])

/* "gpt2, llama, ..." for the errors. */
static void hf_type_list(char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_HF_READERS && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "",
                              HF_READERS[i].type);
}

/* The row of a config's model_type. */
static vp_status hf_type(vp_ydoc *d, yaml_node_t *root,
                         const struct hf_type_row **out, vp_error *err)
{
    char list[256];
    hf_type_list(list, sizeof list);
    yaml_node_t *tn = vp__ymap_get(d, root, "model_type", NULL);
    if (!tn)
        return vp__yerr(d, root, VP_ESCHEMA, err,
                        "missing \"model_type\" (supported: %s)", list);
    const char *tv = vp__yscalar(tn);
    for (size_t i = 0; tv && i < N_HF_READERS; i++)
        if (!strcmp(tv, HF_READERS[i].type)) {
            *out = &HF_READERS[i];
            return VP_OK;
        }
    return vp__yerr(d, tn, VP_EUNSUPPORTED, err,
                    "unsupported model_type \"%.64s\" (supported: %s)",
                    tv ? tv : "?", list);
}

#define T5_DEFAULT_SEQ 512u /* T5's pre-training length (n_positions) */

static vp_status parse_hf_t5(vp_model *m, vp_ydoc *d, yaml_node_t *root,
                             const char *type, vp_error *err)
{
    vp_tf *t = &m->tf;
    VP_TRY(vp__hf_t5(d, root, type, t, err));
    t->line = (uint32_t)root->start_mark.line + 1;
    t->col = (uint32_t)root->start_mark.column + 1;
    m->seq = T5_DEFAULT_SEQ;
    return tf_validate(d, root, t, &T5_KEYS, err);
}

static vp_status parse_hf(vp_model *m, vp_ydoc *d, vp_error *err)
{
    yaml_node_t *root = vp__ydoc_root(d);
    if (root->type != YAML_MAPPING_NODE)
        return vp__yerr(d, root, VP_ESCHEMA, err,
                        "a config.json must hold a JSON object");
    const struct hf_type_row *row = NULL;
    VP_TRY(hf_type(d, root, &row, err));
    vp_tf *t = &m->tf;
    tf_defaults(t);
    t->qkv_bias = true;
    fields f = {d, root, err};
    if (!row->read) /* t5, mt5: hf_t5.c */
        return parse_hf_t5(m, d, root, row->type, err);
    VP_TRY(row->read(&f, t, err));
    VP_TRY(vp__hf_bool(&f, "tie_word_embeddings", &t->tied));
    /* PretrainedConfig's eos_token_id (None by default): what
     * GenerationConfig takes when the model has no generation_config */
    yaml_node_t *eos = vp__ymap_get(d, root, "eos_token_id", NULL);
    t->no_eos = !eos || vp__yis_null(eos);
    VP_TRY(hf_head(m, d, root, err));
    if (t->head == VP_HEAD_CLASSIFICATION) {
        yaml_node_t *ln = vp__ymap_get(d, root, "id2label", NULL);
        if (ln && ln->type == YAML_MAPPING_NODE)
            t->num_labels = (uint64_t)(ln->data.mapping.pairs.top -
                                       ln->data.mapping.pairs.start);
        VP_TRY(vp__hf_u64(&f, "num_labels", &t->num_labels, false));
    }
    t->line = (uint32_t)root->start_mark.line + 1;
    t->col = (uint32_t)root->start_mark.column + 1;
    m->seq = default_seq(t);
    return tf_validate(d, root, t, row->keys, err);
}

/* ---- loading ------------------------------------------------------------ */

static const char *base_name(vp_arena *a, const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    char *s = vp__arena_strdup(a, b);
    if (!s)
        return NULL;
    char *dot = strrchr(s, '.');
    if (dot && dot != s)
        *dot = '\0';
    return s;
}

static vp_status parse_yaml_model(vp_model *m, vp_ydoc *d, vp_error *err)
{
    yaml_node_t *root = vp__ydoc_root(d);
    if (root->type != YAML_MAPPING_NODE)
        return vp__yerr(d, root, VP_ESCHEMA, err,
                        "a model file must be a mapping with a 'transformer' "
                        "or 'graph' section");
    VP_TRY(vp__ymap_check(d, root, TOP_KEYS, "the model", err));
    yaml_node_t *nn = vp__ymap_get(d, root, "name", NULL);
    if (nn) {
        const char *name;
        VP_TRY(vp__yget_str(d, nn, &name, err));
        if (!(m->name = vp__arena_strdup(&m->arena, name)))
            return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    yaml_node_t *k;
    if ((k = vp__ymap_get(d, root, "description", NULL)))
        VP_TRY(vp__yget_str(d, k, &(const char *){NULL}, err));
    if ((k = vp__ymap_get(d, root, "source", NULL)))
        VP_TRY(vp__yget_str(d, k, &(const char *){NULL}, err));
    yaml_node_t *sn = vp__ymap_get(d, root, "seq", NULL);
    if (sn)
        VP_TRY(vp__yget_u64(d, sn, 1, VP_MAX_DIM, &m->seq, err));
    yaml_node_t *tgk = NULL;
    yaml_node_t *tgn = vp__ymap_get(d, root, "target", &tgk);
    if (tgn)
        VP_TRY(vp__yget_u64(d, tgn, 1, VP_MAX_DIM, &m->target, err));
    yaml_node_t *tk = NULL, *gk = NULL;
    yaml_node_t *tn = vp__ymap_get(d, root, "transformer", &tk);
    yaml_node_t *gn = vp__ymap_get(d, root, "graph", &gk);
    if (tn && gn)
        return vp__yerr(d, gk, VP_ESCHEMA, err,
                        "a model has either 'transformer' or 'graph', not "
                        "both");
    if (!tn && !gn)
        return vp__yerr(d, root, VP_ESCHEMA, err,
                        "missing 'transformer' or 'graph' section");
    if (tn) {
        m->form = 0;
        VP_TRY(parse_transformer(m, d, tn, err));
        if (tgn && m->tf.type != VP_TF_ENCDEC)
            return vp__yerr(d, tgk, VP_ESCHEMA, err,
                            "'target' (the decoder length) is for an "
                            "encoder-decoder transformer");
        if (sn && !m->tf.rotary && !m->tf.rel_buckets &&
            m->seq > m->tf.max_positions)
            return vp__yerr(d, sn, VP_ERANGE, err,
                            "seq %llu is longer than the model's %llu "
                            "learned positions",
                            (unsigned long long)m->seq,
                            (unsigned long long)m->tf.max_positions);
        if (!sn)
            m->seq = default_seq(&m->tf);
        return VP_OK;
    }
    m->form = 1;
    if (tgn)
        return vp__yerr(d, tgk, VP_ESCHEMA, err,
                        "'target' (the decoder length) is for an "
                        "encoder-decoder transformer");
    if (!sn)
        return vp__yerr(d, root, VP_ESCHEMA, err,
                        "a graph model needs 'seq' (its default sequence "
                        "length, image side or width)");
    /* compiled into plain values, checked as far as no size is known */
    struct vp_gform *f;
    VP_TRY(vp__graph_compile(&m->arena, d, gn, &f, err));
    m->gform = f;
    return VP_OK;
}

/* What any model file must be: at most VP_MAX_INPUT_BYTES, no NUL byte
 * (its position is given). */
static vp_status check_text(const char *buf, size_t len, const char *path,
                            vp_error *err)
{
    if (len > VP_MAX_INPUT_BYTES)
        return vp_error_at(err, VP_ELIMIT, path, 0, 0, 0,
                           "file is larger than %u bytes", VP_MAX_INPUT_BYTES);
    const char *z = memchr(buf, '\0', len);
    if (!z)
        return VP_OK;
    uint32_t line = 1, col = 1;
    for (const char *c = buf; c < z; c++) {
        if (*c == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return vp_error_at(err, VP_ESYNTAX, path, line, col, 1,
                       "NUL byte in the file");
}

/* Parse the document into m; the document is freed once the model holds
 * its plain values. */
static vp_status parse_doc(vp_model *m, const char *buf, size_t len,
                           int is_json, vp_error *err)
{
    char *copy = NULL;
    if (is_json) {
        VP_TRY(vp__json_check(buf, len, m->path, err));
        /* JSON allows tabs as whitespace; YAML's scanner does not, and
         * tabs cannot occur inside JSON strings unescaped. */
        copy = malloc(len + 1);
        if (!copy)
            return vp_error_set(err, VP_ENOMEM, "out of memory");
        for (size_t i = 0; i < len; i++)
            copy[i] = buf[i] == '\t' ? ' ' : buf[i];
        copy[len] = '\0';
        buf = copy;
    }
    vp_ydoc d;
    memset(&d, 0, sizeof d);
    d.path = m->path;
    vp_status st = vp__ydoc_load(&d, buf, len, err);
    if (st == VP_OK)
        st = is_json ? parse_hf(m, &d, err) : parse_yaml_model(m, &d, err);
    vp__ydoc_destroy(&d);
    free(copy);
    return st;
}

vp_model *vp_model_parse_buf(const char *buf, size_t len, const char *name,
                             int is_json, vp_error *err)
{
    vp_error_clear(err);
    vp_model *m = calloc(1, sizeof *m);
    if (!m) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        return NULL;
    }
    m->path = vp__arena_strdup(&m->arena, name ? name : "<input>");
    m->name = m->path ? base_name(&m->arena, m->path) : NULL;
    if (!m->path || !m->name) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        vp_model_free(m);
        return NULL;
    }
    if (check_text(buf, len, m->path, err) != VP_OK ||
        parse_doc(m, buf, len, is_json, err) != VP_OK) {
        vp_model_free(m);
        return NULL;
    }
    return m;
}

vp_model *vp_model_load(const char *path, vp_error *err)
{
    vp_error_clear(err);
    char *buf;
    size_t len;
    if (vp__read_file(path, VP_MAX_INPUT_BYTES, &buf, &len, err) != VP_OK)
        return NULL;
    size_t pl = strlen(path);
    int is_json = pl >= 5 && !strcmp(path + pl - 5, ".json");
    vp_model *m = vp_model_parse_buf(buf, len, path, is_json, err);
    free(buf);
    return m;
}
