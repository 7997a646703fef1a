/* The key/value cache layout of a decoder (kvcache.h): from a layer graph or
 * from a Hugging Face config.json (read with jansson), and the bytes a token
 * or a sequence takes in it.
 *
 * Per layer and token the cache holds (docs/SERVING.md §1):
 *   MHA/GQA/MQA  kv_heads x (key_dim + value_dim) elements
 *                (vLLM vllm/v1/kv_cache_interface.py AttentionSpec
 *                 .real_page_size_bytes: 2 x block x heads x head_size)
 *   MLA          kv_lora_rank + qk_rope_head_dim elements, no separate V
 *                (MLAAttentionSpec.real_page_size_bytes; transformers 5.17
 *                 caches the same, measured in groundtruth/)
 *   sliding      the same per token, at most `window` tokens kept. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "vramplan/kvcache.h"

#define MAX_CONFIG_BYTES (4u << 20)

const char *vp_kv_kind_name(vp_kv_kind k)
{
    switch (k) {
    case VP_KV_FULL:
        return "full";
    case VP_KV_SLIDING:
        return "sliding";
    case VP_KV_MLA:
        return "mla";
    }
    return "?";
}

void vp_kv_layout_destroy(vp_kv_layout *l)
{
    if (!l)
        return;
    free(l->layer);
    memset(l, 0, sizeof *l);
}

static vp_status layout_alloc(vp_kv_layout *l, uint32_t n, vp_error *err)
{
    l->layer = calloc(n, sizeof *l->layer);
    if (!l->layer)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    l->n_layers = n;
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* From a graph                                                         */
/* ------------------------------------------------------------------ */

vp_status vp_kv_layout_from_graph(const vp_graph *g, vp_kv_layout *out,
                                  vp_error *err)
{
    uint32_t n = 0;

    memset(out, 0, sizeof *out);
    snprintf(out->model, sizeof out->model, "%s", vp_graph_model_name(g));
    for (size_t i = 0; i < vp_graph_op_count(g); i++) {
        const vp_op *o = vp_graph_op(g, i);
        if (o->kind == VP_OP_ATTENTION && o->causal)
            n++;
    }
    if (n == 0)
        return vp_error_set(err, VP_EUNSUPPORTED,
                            "model '%s' has no causal attention layer, so "
                            "no key/value cache",
                            out->model);
    if (n > VP_KV_MAX_LAYERS)
        return vp_error_set(err, VP_ELIMIT,
                            "model '%s' has %u attention layers (at most %u)",
                            out->model, n, VP_KV_MAX_LAYERS);
    if (layout_alloc(out, n, err) != VP_OK)
        return err->code;
    n = 0;
    for (size_t i = 0; i < vp_graph_op_count(g); i++) {
        const vp_op *o = vp_graph_op(g, i);
        if (o->kind != VP_OP_ATTENTION || !o->causal)
            continue;
        if (o->kv_heads == 0 || o->kv_heads > VP_KV_MAX_HEADS ||
            o->head_dim == 0 || o->head_dim > VP_KV_MAX_DIM ||
            o->heads > VP_KV_MAX_HEADS) {
            vp_kv_layout_destroy(out);
            return vp_error_set(err, VP_ERANGE,
                                "attention '%s': heads or head width out of "
                                "range",
                                o->name);
        }
        out->heads = (uint32_t)o->heads;
        out->layer[n++] = (vp_kv_layer){
            o->window ? VP_KV_SLIDING : VP_KV_FULL, (uint32_t)o->kv_heads,
            (uint32_t)o->head_dim, (uint32_t)o->head_dim, o->window};
    }
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* From a Hugging Face config.json                                      */
/* ------------------------------------------------------------------ */

typedef struct hf_ctx {
    const char *buf;
    size_t len;
    const char *path;
    json_t *root;
    vp_error *err;
} hf_ctx;

/* Line and column of a top-level key ("name": at depth 1), for messages;
 * 0:0 when not found. Strings are skipped, so keys inside values do not
 * match. */
static void key_pos(const hf_ctx *c, const char *key, uint32_t *line,
                    uint32_t *col)
{
    size_t klen = strlen(key);
    uint32_t ln = 1, cl = 1;
    int depth = 0;

    *line = *col = 0;
    for (size_t i = 0; i < c->len; i++) {
        char ch = c->buf[i];
        if (ch == '"') {
            size_t s = i + 1, j = s;
            while (j < c->len && c->buf[j] != '"')
                j += c->buf[j] == '\\' ? 2 : 1;
            if (depth == 1 && j - s == klen &&
                memcmp(c->buf + s, key, klen) == 0) {
                *line = ln;
                *col = cl;
                return;
            }
            cl += (uint32_t)(j + 1 - i);
            i = j;
            continue;
        }
        if (ch == '{' || ch == '[')
            depth++;
        else if (ch == '}' || ch == ']')
            depth--;
        if (ch == '\n') {
            ln++;
            cl = 1;
        } else {
            cl++;
        }
    }
}

static vp_status key_err(const hf_ctx *c, const char *key, vp_status code,
                         const char *what)
{
    uint32_t line, col;

    key_pos(c, key, &line, &col);
    return vp_error_at(c->err, code, c->path, line, col,
                       line ? (uint32_t)strlen(key) + 2 : 0, "'%s' %s", key,
                       what);
}

/* An optional positive integer key (absent or null: *found false). */
static vp_status get_uint(const hf_ctx *c, const char *key, uint64_t max,
                          uint64_t *out, bool *found)
{
    json_t *v = json_object_get(c->root, key);

    *found = false;
    if (!v || json_is_null(v))
        return VP_OK;
    if (!json_is_integer(v))
        return key_err(c, key, VP_ESCHEMA, "must be an integer");
    json_int_t x = json_integer_value(v);
    if (x <= 0 || (uint64_t)x > max)
        return key_err(c, key, VP_ERANGE, "is out of range");
    *out = (uint64_t)x;
    *found = true;
    return VP_OK;
}

/* The first present key of names[], required. */
static vp_status need_uint(const hf_ctx *c, const char *const *names,
                           uint64_t max, uint64_t *out)
{
    bool found;

    for (size_t i = 0; names[i]; i++) {
        VP_TRY(get_uint(c, names[i], max, out, &found));
        if (found)
            return VP_OK;
    }
    return vp_error_at(c->err, VP_ESCHEMA, c->path, 0, 0, 0,
                       "the config has no '%s'", names[0]);
}

static bool get_true(const hf_ctx *c, const char *key)
{
    return json_is_true(json_object_get(c->root, key));
}

/* Which layers slide: layer_types, else use_sliding_window with
 * max_window_layers (Qwen2: layers from max_window_layers on), else a
 * sliding_window alone (Mistral: every layer). */
static vp_status sliding_layers(const hf_ctx *c, vp_kv_layout *l,
                                uint64_t window)
{
    json_t *types = json_object_get(c->root, "layer_types");
    uint64_t from = 0;
    bool found;

    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || json_array_size(types) != l->n_layers)
            return key_err(c, "layer_types", VP_ESCHEMA,
                           "must list one type per hidden layer");
        for (uint32_t i = 0; i < l->n_layers; i++) {
            const char *t = json_string_value(json_array_get(types, i));
            if (t && strcmp(t, "full_attention") == 0)
                continue;
            if (!t || strcmp(t, "sliding_attention") != 0)
                return key_err(c, "layer_types", VP_ESCHEMA,
                               "holds a layer type other than "
                               "full_attention and sliding_attention");
            if (window == 0)
                return key_err(c, "sliding_window", VP_ESCHEMA,
                               "is needed by sliding_attention layers");
            l->layer[i].kind = VP_KV_SLIDING;
            l->layer[i].window = window;
        }
        return VP_OK;
    }
    if (window == 0)
        return VP_OK;
    if (json_object_get(c->root, "use_sliding_window")) {
        if (!get_true(c, "use_sliding_window"))
            return VP_OK;
        VP_TRY(get_uint(c, "max_window_layers", VP_KV_MAX_LAYERS, &from,
                        &found));
    }
    for (uint32_t i = (uint32_t)from; i < l->n_layers; i++) {
        l->layer[i].kind = VP_KV_SLIDING;
        l->layer[i].window = window;
    }
    return VP_OK;
}

static vp_status parse_hf(const hf_ctx *c, vp_kv_layout *l)
{
    static const char *const layers_k[] = {"num_hidden_layers", "n_layer",
                                           NULL};
    static const char *const heads_k[] = {"num_attention_heads", "n_head",
                                          NULL};
    static const char *const hidden_k[] = {"hidden_size", "n_embd", NULL};
    uint64_t n_layers, heads, kv_heads, head_dim, hidden, window = 0;
    uint64_t lora = 0, rope = 0;
    bool found, mla;

    VP_TRY(need_uint(c, layers_k, VP_KV_MAX_LAYERS, &n_layers));
    VP_TRY(need_uint(c, heads_k, VP_KV_MAX_HEADS, &heads));
    kv_heads = heads;
    VP_TRY(get_uint(c, "num_key_value_heads", VP_KV_MAX_HEADS, &kv_heads,
                    &found));
    if (!found && get_true(c, "multi_query"))
        kv_heads = 1;
    if (kv_heads > heads)
        return key_err(c, "num_key_value_heads", VP_ERANGE,
                       "exceeds num_attention_heads");
    VP_TRY(get_uint(c, "head_dim", VP_KV_MAX_DIM, &head_dim, &found));
    if (!found) {
        VP_TRY(need_uint(c, hidden_k,
                         (uint64_t)VP_KV_MAX_DIM * VP_KV_MAX_HEADS, &hidden));
        if (hidden % heads != 0)
            return key_err(c, hidden_k[0], VP_ERANGE,
                           "is not a multiple of the attention heads");
        head_dim = hidden / heads;
        if (head_dim > VP_KV_MAX_DIM)
            return key_err(c, hidden_k[0], VP_ERANGE, "is out of range");
    }
    VP_TRY(get_uint(c, "kv_lora_rank", VP_KV_MAX_DIM, &lora, &mla));
    if (mla) {
        VP_TRY(get_uint(c, "qk_rope_head_dim", VP_KV_MAX_DIM, &rope, &found));
        if (!found)
            return key_err(c, "kv_lora_rank", VP_ESCHEMA,
                           "needs qk_rope_head_dim (multi-head latent "
                           "attention)");
    }
    json_t *sw = json_object_get(c->root, "sliding_window");
    if (!json_is_integer(sw) || json_integer_value(sw) != 0) /* 0: none */
        VP_TRY(get_uint(c, "sliding_window", UINT64_MAX >> 1, &window,
                        &found));

    static const char *const pos_k[] = {"max_position_embeddings",
                                        "n_positions", NULL};
    uint64_t max_pos = 0;
    for (size_t i = 0; pos_k[i] && !max_pos; i++)
        VP_TRY(get_uint(c, pos_k[i], UINT64_MAX >> 1, &max_pos, &found));

    memset(l, 0, sizeof *l);
    if (layout_alloc(l, (uint32_t)n_layers, c->err) != VP_OK)
        return c->err->code;
    l->heads = (uint32_t)heads;
    l->max_positions = max_pos;
    for (uint32_t i = 0; i < l->n_layers; i++)
        l->layer[i] = mla ? (vp_kv_layer){VP_KV_MLA, 1,
                                          (uint32_t)(lora + rope), 0, 0}
                          : (vp_kv_layer){VP_KV_FULL, (uint32_t)kv_heads,
                                          (uint32_t)head_dim,
                                          (uint32_t)head_dim, 0};
    if (!mla)
        VP_TRY(sliding_layers(c, l, window));
    return VP_OK;
}

vp_status vp_kv_layout_from_hf_buf(const char *buf, size_t len,
                                   const char *path, vp_kv_layout *out,
                                   vp_error *err)
{
    json_error_t jerr;
    hf_ctx c = {buf, len, path ? path : "<buffer>", NULL, err};
    const char *name = strrchr(c.path, '/');
    vp_status st;

    vp_error_clear(err);
    memset(out, 0, sizeof *out);
    if (len > MAX_CONFIG_BYTES)
        return vp_error_at(err, VP_ELIMIT, c.path, 0, 0, 0,
                           "a config is at most %u bytes", MAX_CONFIG_BYTES);
    c.root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!c.root)
        return vp_error_at(err, VP_ESYNTAX, c.path,
                           jerr.line > 0 ? (uint32_t)jerr.line : 0,
                           jerr.column > 0 ? (uint32_t)jerr.column : 0, 1,
                           "malformed JSON: %s", jerr.text);
    if (!json_is_object(c.root)) {
        json_decref(c.root);
        return vp_error_at(err, VP_ESCHEMA, c.path, 1, 1, 0,
                           "a config.json holds one object");
    }
    st = parse_hf(&c, out);
    json_decref(c.root);
    if (st != VP_OK) {
        vp_kv_layout_destroy(out);
        return st;
    }
    snprintf(out->model, sizeof out->model, "%s", name ? name + 1 : c.path);
    return VP_OK;
}

vp_status vp_kv_layout_from_hf(const char *path, vp_kv_layout *out,
                               vp_error *err)
{
    char *buf;
    size_t len;
    vp_status st;

    vp_error_clear(err);
    memset(out, 0, sizeof *out);
    st = vp__read_file(path, MAX_CONFIG_BYTES, &buf, &len, err);
    if (st != VP_OK)
        return st;
    st = vp_kv_layout_from_hf_buf(buf, len, path, out, err);
    free(buf);
    return st;
}

/* ------------------------------------------------------------------ */
/* Bytes                                                                */
/* ------------------------------------------------------------------ */

vp_status vp_kv_heads_per_rank(uint32_t kv_heads, uint32_t tp, uint32_t *out,
                               vp_error *err)
{
    if (tp == 0 || kv_heads == 0)
        return vp_error_set(err, VP_EARG, "no heads or no ranks");
    if (kv_heads >= tp) {
        if (kv_heads % tp != 0)
            return vp_error_set(err, VP_EARG,
                                "%u key/value heads do not split over %u "
                                "tensor-parallel ranks",
                                kv_heads, tp);
        *out = kv_heads / tp;
    } else {
        if (tp % kv_heads != 0)
            return vp_error_set(err, VP_EARG,
                                "%u tensor-parallel ranks do not replicate "
                                "%u key/value heads evenly",
                                tp, kv_heads);
        *out = 1;
    }
    return VP_OK;
}

vp_status vp_kv_layer_token_bytes(const vp_kv_layer *l, uint32_t elem_bytes,
                                  uint32_t tp, uint64_t *out, vp_error *err)
{
    uint32_t heads = 1;
    uint64_t width = (uint64_t)l->key_dim + l->value_dim;

    if (elem_bytes == 0)
        return vp_error_set(err, VP_EARG, "zero-byte cache elements");
    if (l->kind != VP_KV_MLA)
        VP_TRY(vp_kv_heads_per_rank(l->kv_heads, tp, &heads, err));
    else if (tp == 0)
        return vp_error_set(err, VP_EARG, "no ranks");
    if (!vp_mul_u64(width, heads, out) || !vp_mul_u64(*out, elem_bytes, out))
        return vp_error_set(err, VP_EOVERFLOW, "cache bytes per token "
                                               "overflow 64 bits");
    return VP_OK;
}

vp_status vp_kv_seq_bytes(const vp_kv_layout *l, uint32_t elem_bytes,
                          uint32_t tp, uint64_t tokens, uint64_t *out,
                          vp_error *err)
{
    uint64_t total = 0, per, held, bytes;

    for (uint32_t i = 0; i < l->n_layers; i++) {
        const vp_kv_layer *y = &l->layer[i];
        VP_TRY(vp_kv_layer_token_bytes(y, elem_bytes, tp, &per, err));
        held = y->kind == VP_KV_SLIDING && y->window < tokens ? y->window
                                                              : tokens;
        if (!vp_mul_u64(per, held, &bytes) ||
            !vp_add_u64(total, bytes, &total))
            return vp_error_set(err, VP_EOVERFLOW,
                                "cache of %llu tokens overflows 64 bits",
                                (unsigned long long)tokens);
    }
    *out = total;
    return VP_OK;
}

vp_status vp_kv_token_bytes(const vp_kv_layout *l, uint32_t elem_bytes,
                            uint32_t tp, uint64_t *out, vp_error *err)
{
    uint64_t total = 0, per;

    for (uint32_t i = 0; i < l->n_layers; i++) {
        VP_TRY(vp_kv_layer_token_bytes(&l->layer[i], elem_bytes, tp, &per,
                                       err));
        if (!vp_add_u64(total, per, &total))
            return vp_error_set(err, VP_EOVERFLOW,
                                "cache bytes per token overflow 64 bits");
    }
    *out = total;
    return VP_OK;
}
