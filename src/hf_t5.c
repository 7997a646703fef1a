/* Hugging Face config.json of the encoder-decoder families t5 and mt5
 * (transformers 5.x configuration_t5.py / configuration_mt5.py, read as
 * modeling_t5.py and modeling_mt5.py use them): an encoder and a decoder of
 * T5Blocks with RMS layer norms (T5LayerNorm), no biases, T5's relative
 * position bias, a ReLU or gated MLP (T5DenseActDense,
 * T5DenseGatedActDense), the shared embedding tied to both stacks and, by
 * default, to the LM head. graph_encdec.c builds the graph. */
#include <string.h>

#include "hf_config.h"

/* T5Config's defaults for keys a config may leave out */
#define T5_BUCKETS 32u       /* relative_attention_num_buckets             */
#define T5_MAX_DISTANCE 128u /* relative_attention_max_distance            */
#define T5_HEAD_DIM 64u      /* d_kv                                       */
#define T5_DROPOUT 0.1       /* dropout_rate                               */

typedef vp__fields cfg; /* hf_config.h */

static vp_status u64(cfg *c, const char *key, uint64_t *out, bool req)
{
    return vp__hf_u64(c, key, out, req);
}

static vp_status boolean(cfg *c, const char *key, bool *out)
{
    return vp__hf_bool(c, key, out);
}

/* feed_forward_proj: "ACT" or "gated-ACT" (T5Config: "gated-gelu" means
 * gelu_new, for compatibility); the activations modeling_t5.py reaches
 * through ACT2FN. */
static vp_status ffn_kind(cfg *c, vp_tf *t)
{
    yaml_node_t *n = vp__ymap_get(c->d, c->map, "feed_forward_proj", NULL);
    t->act = VP_ACT_RELU;
    t->gated_ffn = false;
    if (!n || vp__yis_null(n))
        return VP_OK;
    const char *v = vp__yscalar(n);
    if (!v)
        return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                        "\"feed_forward_proj\" must be a string");
    const char *act = v;
    if (!strncmp(v, "gated-", 6)) {
        t->gated_ffn = true;
        act = v + 6;
        if (!strcmp(act, "gelu"))
            act = "gelu_new";
    }
    static const struct {
        const char *name;
        vp_act_kind kind;
    } acts[] = {{"relu", VP_ACT_RELU},          {"gelu_new", VP_ACT_GELU_TANH},
                {"gelu", VP_ACT_GELU},          {"silu", VP_ACT_SILU},
                {"swish", VP_ACT_SILU},         {"gelu_fast", VP_ACT_GELU_TANH}};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if (!strcmp(act, acts[i].name)) {
            t->act = acts[i].kind;
            return VP_OK;
        }
    return vp__yerr(c->d, n, VP_EUNSUPPORTED, c->err,
                    "unsupported feed_forward_proj \"%.64s\" (supported: "
                    "relu, gelu, gelu_new, gelu_fast, silu, swish, each "
                    "optionally gated-)",
                    v);
}

/* The head from `architectures`: ...ForConditionalGeneration (the LM head
 * and its loss, the default) or ...Model (the decoder's states). */
static vp_status t5_head(cfg *c, vp_tf *t)
{
    yaml_node_t *an = vp__ymap_get(c->d, c->map, "architectures", NULL);
    t->head = VP_HEAD_CAUSAL_LM;
    if (!an || vp__yis_null(an))
        return VP_OK;
    if (an->type != YAML_SEQUENCE_NODE ||
        an->data.sequence.items.top == an->data.sequence.items.start)
        return vp__yerr(c->d, an, VP_ESCHEMA, c->err,
                        "\"architectures\" must be a non-empty list");
    yaml_node_t *first = vp__ynode(c->d, *an->data.sequence.items.start);
    const char *a = vp__yscalar(first);
    if (!a)
        return vp__yerr(c->d, first, VP_ESCHEMA, c->err,
                        "\"architectures\" entries must be strings");
    size_t n = strlen(a);
    const char *gen = "ForConditionalGeneration";
    if (n >= strlen(gen) && !strcmp(a + n - strlen(gen), gen))
        return VP_OK;
    if (!strcmp(a, "T5Model") || !strcmp(a, "MT5Model")) {
        t->head = VP_HEAD_NONE;
        return VP_OK;
    }
    return vp__yerr(c->d, first, VP_EUNSUPPORTED, c->err,
                    "unsupported architecture \"%.64s\" for an encoder-"
                    "decoder (supported: ...ForConditionalGeneration, "
                    "T5Model, MT5Model)",
                    a);
}

vp_status vp__hf_t5(vp_ydoc *d, yaml_node_t *root, const char *type,
                    vp_tf *t, vp_error *err)
{
    cfg c = {d, root, err};
    t->type = VP_TF_ENCDEC;
    t->norm = VP_NORM_RMSNORM;
    t->norm_bias = false;
    t->bias = t->qkv_bias = false;
    t->final_norm = true;
    t->tied = true;
    t->t5_ff_cast = true;
    t->head_dim = T5_HEAD_DIM;
    t->rel_buckets = T5_BUCKETS;
    t->rel_max_distance = T5_MAX_DISTANCE;
    t->p_embd = t->p_attn = t->p_resid = T5_DROPOUT;
    VP_TRY(u64(&c, "d_model", &t->hidden, true));
    VP_TRY(u64(&c, "num_heads", &t->heads, true));
    VP_TRY(u64(&c, "d_kv", &t->head_dim, false));
    VP_TRY(u64(&c, "num_layers", &t->layers, true));
    t->dec_layers = t->layers;
    VP_TRY(u64(&c, "num_decoder_layers", &t->dec_layers, false));
    if (t->dec_layers > VP_MAX_REPEAT)
        return vp__yerr(d, vp__ymap_get(d, root, "num_decoder_layers", NULL),
                        VP_ELIMIT, err,
                        "%llu decoder layers is more than the limit of %u",
                        (unsigned long long)t->dec_layers, VP_MAX_REPEAT);
    VP_TRY(u64(&c, "d_ff", &t->ffn, true));
    VP_TRY(u64(&c, "vocab_size", &t->vocab, true));
    VP_TRY(u64(&c, "relative_attention_num_buckets", &t->rel_buckets, false));
    VP_TRY(u64(&c, "relative_attention_max_distance", &t->rel_max_distance,
               false));
    yaml_node_t *pn = vp__ymap_get(d, root, "dropout_rate", NULL);
    if (pn && !vp__yis_null(pn)) {
        VP_TRY(vp__yget_prob(d, pn, &t->p_resid, err));
        t->p_embd = t->p_attn = t->p_resid;
    }
    VP_TRY(ffn_kind(&c, t));
    VP_TRY(boolean(&c, "tie_word_embeddings", &t->tied));
    /* T5ForConditionalGeneration scales the decoder's output by
     * d_model^-0.5 before a tied LM head (config scale_decoder_outputs,
     * true by default); MT5ForConditionalGeneration does not (traced:
     * groundtruth/traces/t5-base-*, mt5-small-*) */
    t->scale_out = t->tied && !strcmp(type, "t5");
    VP_TRY(boolean(&c, "scale_decoder_outputs", &t->scale_out));
    t->scale_out = t->scale_out && t->tied;
    return t5_head(&c, t);
}
