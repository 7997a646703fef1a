/* Model descriptions: the vramplan YAML forms and Hugging Face config.json. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "yaml_doc.h"

static const char *const TOP_KEYS[] = {"name", "description", "source", "seq",
                                       "target", "transformer", "graph",
                                       NULL};
static const char *const TF_KEYS[] = {
    "type", "hidden", "layers", "heads", "kv_heads", "head_dim", "ffn",
    "vocab", "positions", "max_positions", "norm", "norm_bias", "activation",
    "bias", "qkv_bias", "fused_qkv", "tied_embeddings", "type_vocab",
    "embedding_norm", "final_norm", "dropout", "attention", "head",
    "num_labels", "moe", "encoder_decoder", NULL};
static const char *const DROPOUT_KEYS[] = {"embedding", "attention",
                                           "residual", NULL};
static const char *const MOE_KEYS[] = {"experts", "top_k", "expert_ffn",
                                       "shared_experts", NULL};
static const char *const TF_TYPES[] = {"decoder", "encoder",
                                       "encoder-decoder", NULL};
static const char *const ENCDEC_KEYS[] = {
    "decoder_layers", "relative_buckets", "relative_max_distance",
    "scale_decoder_outputs", "gated_ffn", "ffn_cast", NULL};
static const char *const POSITIONS[] = {"learned", "rotary", NULL};
static const char *const NORMS[] = {"layernorm", "rmsnorm", NULL};
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

typedef struct {
    vp_ydoc *d;
    yaml_node_t *map;
    vp_error *err;
} fields;

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

/* Checks shared by every source of transformer hyperparameters; errors
 * point at the value at fault. */
static vp_status tf_validate(vp_ydoc *d, yaml_node_t *at, vp_tf *t,
                             const tf_keys *k, vp_error *err)
{
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
    if (t->layers > VP_MAX_REPEAT)
        return vp__yerr(d, key_at(d, at, k->layers, false), VP_ELIMIT, err,
                        "%llu layers is more than the limit of %u",
                        (unsigned long long)t->layers, VP_MAX_REPEAT);
    if (t->experts > 4096)
        return vp__yerr(d, key_at(d, at, k->experts, k->moe_submap),
                        VP_ELIMIT, err,
                        "%llu experts is more than the limit of 4096",
                        (unsigned long long)t->experts);
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
    t->norm = (vp_norm_kind)v;
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
    if (mn) {
        VP_TRY(vp__ymap_check(d, mn, MOE_KEYS, "moe", err));
        fields mf = {d, mn, err};
        VP_TRY(req_u64(&mf, "experts", &t->experts, "moe"));
        VP_TRY(req_u64(&mf, "top_k", &t->top_k, "moe"));
        VP_TRY(opt_u64(&mf, "expert_ffn", 1, &t->expert_ffn));
        VP_TRY(opt_u64(&mf, "shared_experts", 0, &t->shared_experts));
    }
    VP_TRY(parse_encdec(d, tn, t, err));
    t->line = (uint32_t)tn->start_mark.line + 1;
    t->col = (uint32_t)tn->start_mark.column + 1;
    return tf_validate(d, tn, t, &YAML_KEYS, err);
}

/* ---- Hugging Face config.json ------------------------------------------ */

static const char *const HF_TYPES[] = {"gpt2", "llama", "mistral", "mixtral",
                                       "qwen2", "bert", "t5", "mt5", NULL};

static vp_status hf_u64(fields *f, const char *key, uint64_t *out, bool req)
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

/* An optional count that may be 0 (left as it is when absent or null). */
static vp_status hf_count(fields *f, const char *key, uint64_t *out)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n || vp__yis_null(n))
        return VP_OK;
    return vp__yget_u64(f->d, n, 0, VP_MAX_DIM, out, f->err);
}

static vp_status hf_bool(fields *f, const char *key, bool *out)
{
    yaml_node_t *n = vp__ymap_get(f->d, f->map, key, NULL);
    if (!n || vp__yis_null(n))
        return VP_OK;
    return vp__yget_bool(f->d, n, out, f->err);
}

/* The same for the families' own readers (hf_t5.c; yaml_doc.h). */
vp_status vp__hf_u64(vp_ydoc *d, yaml_node_t *map, const char *key,
                     uint64_t *out, bool req, vp_error *err)
{
    fields f = {d, map, err};
    return hf_u64(&f, key, out, req);
}

vp_status vp__hf_bool(vp_ydoc *d, yaml_node_t *map, const char *key,
                      bool *out, vp_error *err)
{
    fields f = {d, map, err};
    return hf_bool(&f, key, out);
}

static vp_status hf_act(fields *f, const char *key, vp_act_kind gated_default,
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
    VP_TRY(hf_u64(f, "n_embd", &t->hidden, true));
    VP_TRY(hf_u64(f, "n_layer", &t->layers, true));
    VP_TRY(hf_u64(f, "n_head", &t->heads, true));
    VP_TRY(hf_u64(f, "vocab_size", &t->vocab, true));
    VP_TRY(hf_u64(f, "n_positions", &t->max_positions, true));
    t->ffn = 0;
    VP_TRY(hf_u64(f, "n_inner", &t->ffn, false));
    if (t->ffn == 0 && !vp_mul_u64(4, t->hidden, &t->ffn))
        return vp_error_set(err, VP_EOVERFLOW, "n_inner overflows");
    VP_TRY(hf_act(f, "activation_function", VP_ACT_GELU, &t->act));
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
    VP_TRY(hf_u64(f, "hidden_size", &t->hidden, true));
    VP_TRY(hf_u64(f, "num_hidden_layers", &t->layers, true));
    VP_TRY(hf_u64(f, "num_attention_heads", &t->heads, true));
    VP_TRY(hf_u64(f, "intermediate_size", &t->ffn, true));
    VP_TRY(hf_u64(f, "vocab_size", &t->vocab, true));
    VP_TRY(hf_u64(f, "max_position_embeddings", &t->max_positions, false));
    yaml_node_t *tvn = vp__ymap_get(f->d, f->map, "type_vocab_size", NULL);
    if (tvn && !vp__yis_null(tvn))
        VP_TRY(vp__yget_u64(f->d, tvn, 0, VP_MAX_DIM, &t->type_vocab, err));
    VP_TRY(hf_act(f, "hidden_act", VP_ACT_GELU, &t->act));
    VP_TRY(opt_prob(f, "hidden_dropout_prob", &t->p_resid));
    t->p_embd = t->p_resid;
    VP_TRY(opt_prob(f, "attention_probs_dropout_prob", &t->p_attn));
    return VP_OK;
}

/* HF LlamaConfig and its relatives (Mistral, Mixtral, Qwen2): rotary,
 * RMSNorm, SwiGLU, no biases (Qwen2: q, k, v biases). */
/* The layers from which a config's sliding_window applies, as the
 * configs resolve it (transformers MistralConfig, Qwen2Config): layer_types
 * when given (full_attention layers, then sliding_attention ones; layers
 * that alternate are not modelled), else use_sliding_window (Qwen2: false
 * turns the window off) with max_window_layers, else every layer
 * (Mistral). The same rule as kvcache.c's sliding_layers. */
static vp_status hf_sliding(fields *f, vp_tf *t)
{
    yaml_node_t *ty = vp__ymap_get(f->d, f->map, "layer_types", NULL);
    bool use = true;

    VP_TRY(hf_count(f, "sliding_window", &t->sliding_window));
    if (ty && !vp__yis_null(ty)) {
        if (ty->type != YAML_SEQUENCE_NODE ||
            ty->data.sequence.items.top - ty->data.sequence.items.start !=
                (ptrdiff_t)t->layers)
            return vp__yerr(f->d, ty, VP_ESCHEMA, f->err,
                            "layer_types must list one type per hidden "
                            "layer");
        uint64_t i = 0, from = t->layers;
        for (yaml_node_item_t *it = ty->data.sequence.items.start;
             it < ty->data.sequence.items.top; it++, i++) {
            yaml_node_t *n = vp__ynode(f->d, *it);
            const char *s = vp__yscalar(n);
            bool slide = s && !strcmp(s, "sliding_attention");
            if (!slide && !(s && !strcmp(s, "full_attention")))
                return vp__yerr(f->d, n, VP_ESCHEMA, f->err,
                                "a layer type other than full_attention "
                                "and sliding_attention");
            if (slide && from == t->layers)
                from = i;
            if (!slide && from < t->layers)
                return vp__yerr(f->d, n, VP_EUNSUPPORTED, f->err,
                                "full-attention layers after sliding ones "
                                "are not modelled");
        }
        if (from < t->layers && t->sliding_window == 0)
            return vp__yerr(f->d, ty, VP_ESCHEMA, f->err,
                            "sliding_attention layers need a "
                            "sliding_window");
        t->slide_from = from;
        if (from == t->layers)
            t->sliding_window = 0;
        return VP_OK;
    }
    VP_TRY(hf_bool(f, "use_sliding_window", &use));
    if (!use) {
        t->sliding_window = 0;
        return VP_OK;
    }
    if (vp__ymap_get(f->d, f->map, "use_sliding_window", NULL))
        VP_TRY(hf_count(f, "max_window_layers", &t->slide_from));
    return VP_OK;
}

static vp_status hf_llama(fields *f, vp_tf *t, const char *type)
{
    t->type = VP_TF_DECODER;
    t->rotary = true;
    t->norm = VP_NORM_RMSNORM;
    t->norm_bias = false;
    t->act = VP_ACT_SWIGLU;
    t->bias = false;
    t->qkv_bias = !strcmp(type, "qwen2");
    t->final_norm = true;
    t->max_positions = 2048; /* LlamaConfig's max_position_embeddings */
    VP_TRY(hf_u64(f, "hidden_size", &t->hidden, true));
    VP_TRY(hf_u64(f, "num_hidden_layers", &t->layers, true));
    VP_TRY(hf_u64(f, "num_attention_heads", &t->heads, true));
    VP_TRY(hf_u64(f, "num_key_value_heads", &t->kv_heads, false));
    VP_TRY(hf_u64(f, "head_dim", &t->head_dim, false));
    VP_TRY(hf_u64(f, "intermediate_size", &t->ffn, true));
    VP_TRY(hf_u64(f, "vocab_size", &t->vocab, true));
    VP_TRY(hf_u64(f, "max_position_embeddings", &t->max_positions, false));
    VP_TRY(hf_act(f, "hidden_act", VP_ACT_SWIGLU, &t->act));
    bool ab = t->qkv_bias;
    VP_TRY(hf_bool(f, "attention_bias", &ab));
    if (strcmp(type, "qwen2"))
        t->qkv_bias = ab;
    VP_TRY(hf_bool(f, "mlp_bias", &t->bias));
    VP_TRY(opt_prob(f, "attention_dropout", &t->p_attn));
    VP_TRY(hf_sliding(f, t));
    if (!strcmp(type, "mixtral")) {
        VP_TRY(hf_u64(f, "num_local_experts", &t->experts, true));
        VP_TRY(hf_u64(f, "num_experts_per_tok", &t->top_k, true));
    }
    return VP_OK;
}

/* The model_type of a config, one of HF_TYPES. */
static vp_status hf_type(vp_ydoc *d, yaml_node_t *root, const char **out,
                         vp_error *err)
{
    yaml_node_t *tn = vp__ymap_get(d, root, "model_type", NULL);
    if (!tn)
        return vp__yerr(d, root, VP_ESCHEMA, err,
                        "missing \"model_type\" (supported: gpt2, llama, "
                        "mistral, mixtral, qwen2, bert, t5, mt5)");
    const char *tv = vp__yscalar(tn);
    for (int mt = 0; tv && HF_TYPES[mt]; mt++)
        if (!strcmp(tv, HF_TYPES[mt])) {
            *out = HF_TYPES[mt];
            return VP_OK;
        }
    return vp__yerr(d, tn, VP_EUNSUPPORTED, err,
                    "unsupported model_type \"%.64s\" (supported: gpt2, "
                    "llama, mistral, mixtral, qwen2, bert, t5, mt5)",
                    tv ? tv : "?");
}

/* t5 and mt5 (hf_t5.c); errors point at their keys. */
static const tf_keys T5_KEYS = {"d_model", "num_heads", "num_heads", "d_kv",
                                "num_layers", NULL, NULL, false};
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
    const char *type = NULL;
    VP_TRY(hf_type(d, root, &type, err));
    vp_tf *t = &m->tf;
    tf_defaults(t);
    t->qkv_bias = true;
    fields f = {d, root, err};
    if (!strcmp(type, "t5") || !strcmp(type, "mt5"))
        return parse_hf_t5(m, d, root, type, err);
    if (!strcmp(type, "gpt2"))
        VP_TRY(hf_gpt2(&f, t, err));
    else if (!strcmp(type, "bert"))
        VP_TRY(hf_bert(&f, t, err));
    else
        VP_TRY(hf_llama(&f, t, type));
    VP_TRY(hf_bool(&f, "tie_word_embeddings", &t->tied));
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
        VP_TRY(hf_u64(&f, "num_labels", &t->num_labels, false));
    }
    t->line = (uint32_t)root->start_mark.line + 1;
    t->col = (uint32_t)root->start_mark.column + 1;
    m->seq = default_seq(t);
    return tf_validate(d, root, t,
                       !strcmp(type, "gpt2") ? &GPT2_KEYS : &HF_KEYS, err);
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
