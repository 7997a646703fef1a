/* What vLLM's start-up measures, derived from the model's shapes: the
 * weights one rank loads and the peak of the profile run (a dummy forward
 * of max_num_batched_tokens tokens and a dummy sampling step), replayed
 * through the caching-allocator model. docs/SERVING.md §2 lists the
 * allocations and their sources in vLLM and PyTorch. */
#include <string.h>

#include "serve_impl.h"
#include "util.h"
#include "vramplan/allocator.h"
#include "vramplan/kvcache.h"
#include "vramplan/units.h"

/* vLLM pads the vocabulary of its embedding and LM head to a multiple of
 * 64 (vllm/model_executor/layers/vocab_parallel_embedding.py,
 * DEFAULT_VOCAB_PADDING_SIZE, pad_vocab_size). */
#define VOCAB_PAD 64u

/* PyTorch's sort of rows of at least 2049 elements takes the segmented
 * radix sort (aten/src/ATen/native/cuda/SortStable.cu): one segment at a
 * time for a single row, the full-sort path under 128 rows, else
 * segmented_sort_pairs. */
#define SORT_SEGMENTED_ROWS 128u

/* ------------------------------------------------------------------ */
/* Dimensions                                                           */
/* ------------------------------------------------------------------ */

static vp_status dims_segment(const vp_graph *g, const vp_segment *s,
                              sv_dims *d, vp_error *err)
{
    bool seen_attn = false;

    for (uint32_t i = s->first_op; i <= s->last_op; i++) {
        const vp_op *o = vp_graph_op(g, i);
        switch (o->kind) {
        case VP_OP_ATTENTION:
            if (!o->causal)
                return vp_error_set(err, VP_EUNSUPPORTED,
                                    "'%s' is not causal: vLLM serving "
                                    "needs a decoder",
                                    o->name);
            d->heads = (uint32_t)o->heads;
            d->kv_heads = (uint32_t)o->kv_heads;
            d->head_dim = (uint32_t)o->head_dim;
            seen_attn = true;
            break;
        case VP_OP_ROUTER:
        case VP_OP_MOE_EXPERTS:
            return vp_error_set(err, VP_EUNSUPPORTED,
                                "'%s': mixture-of-experts layers are not "
                                "modelled for serving",
                                o->name);
        case VP_OP_MUL:
            d->gated = d->gated || seen_attn;
            break;
        case VP_OP_RMSNORM:
            d->rmsnorm = true;
            break;
        case VP_OP_ROPE:
            d->rotary = true;
            break;
        case VP_OP_LINEAR:
            d->ffn = o->in_features; /* the last one: the down projection */
            break;
        default:
            break;
        }
    }
    if (!seen_attn)
        return vp_error_set(err, VP_EUNSUPPORTED,
                            "layer '%s' has no attention", s->name);
    return VP_OK;
}

vp_status vp__serve_dims(const vp_graph *g, sv_dims *d, vp_error *err)
{
    memset(d, 0, sizeof *d);
    for (size_t i = 0; i < vp_graph_op_count(g) && !d->vocab; i++) {
        const vp_op *o = vp_graph_op(g, i);
        if (o->kind == VP_OP_EMBEDDING) {
            d->hidden = o->shape[o->ndim - 1];
            d->vocab = o->classes;
        }
    }
    d->layers = (uint32_t)vp_graph_segment_count(g);
    if (!d->vocab || d->layers == 0)
        return vp_error_set(err, VP_EUNSUPPORTED,
                            "model '%s' is not a token decoder with layers",
                            vp_graph_model_name(g));
    VP_TRY(dims_segment(g, vp_graph_segment(g, 0), d, err));
    if (d->heads == 0 || d->kv_heads == 0 || d->head_dim == 0 || !d->ffn)
        return vp_error_set(err, VP_EUNSUPPORTED,
                            "model '%s': attention or MLP shapes not found",
                            vp_graph_model_name(g));
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* Weights per rank                                                     */
/* ------------------------------------------------------------------ */

static uint64_t pad_vocab(uint64_t v)
{
    return (v + VOCAB_PAD - 1) / VOCAB_PAD * VOCAB_PAD;
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

/* Output features one rank computes for a column-parallel projection of
 * `out` features: query heads split, K/V heads split or replicated (vLLM
 * QKVParallelLinear), anything else split. */
static uint64_t column_out(const sv_dims *d, uint32_t kv_r, uint32_t tp,
                           uint64_t out)
{
    uint64_t hd = d->head_dim, q = (uint64_t)d->heads * hd,
             kv = (uint64_t)d->kv_heads * hd;

    if (out == kv && kv != q)
        return kv_r * hd;
    if (out == q + 2 * kv)
        return q / tp + 2 * kv_r * hd;
    return out / tp;
}

/* Elements of one parameter on one rank. op is the op that uses it;
 * row-parallel: the projection that reads the attention output or the MLP
 * inner activation (its input is split, its bias replicated). */
static uint64_t param_per_rank(const sv_dims *d, const vp_op *o,
                               const vp_param *p, uint32_t kv_r,
                               uint32_t tp)
{
    bool bias = ends_with(p->name, ".bias");

    if (o->kind == VP_OP_EMBEDDING && o->classes == d->vocab)
        return p->numel / d->vocab * pad_vocab(d->vocab) / tp;
    if (o->kind != VP_OP_LINEAR)
        return p->numel; /* norms, position tables: replicated */
    if (o->out_features == d->vocab)
        return p->numel / d->vocab * pad_vocab(d->vocab) / tp;
    if (o->out_features == d->hidden &&
        (o->in_features == d->ffn ||
         o->in_features == (uint64_t)d->heads * d->head_dim))
        return bias ? p->numel : p->numel / tp; /* row-parallel */
    uint64_t out_r = column_out(d, kv_r, tp, o->out_features);
    return bias ? out_r : o->in_features * out_r;
}

vp_status vp__serve_weights(const vp_graph *g, const sv_dims *d,
                            uint32_t dtype_bytes, uint32_t tp,
                            uint64_t max_pos, uint64_t *out, vp_error *err)
{
    vp_allocator_config ac;
    uint64_t total = 0, bytes;
    uint32_t kv_r;

    vp_allocator_config_init(&ac);
    VP_TRY(vp_kv_heads_per_rank(d->kv_heads, tp, &kv_r, err));
    if (d->heads % tp != 0 || d->ffn % tp != 0 ||
        pad_vocab(d->vocab) % tp != 0)
        return vp_error_set(err, VP_EARG,
                            "%u attention heads, MLP width %llu or the "
                            "padded vocabulary do not split over %u ranks",
                            d->heads, (unsigned long long)d->ffn, tp);
    for (size_t i = 0; i < vp_graph_param_count(g); i++) {
        const vp_param *p = vp_graph_param(g, i);
        if (p->fp32_buffer)
            continue; /* rotary inv_freq: vLLM keeps a cos/sin cache */
        uint64_t n = param_per_rank(d, vp_graph_op(g, p->op), p, kv_r, tp);
        if (!vp_mul_u64(n, dtype_bytes, &bytes) ||
            !vp_add_u64(total, vp_allocator_round_size(&ac, bytes), &total))
            return vp_error_set(err, VP_EOVERFLOW,
                                "weights overflow 64 bits");
    }
    /* RotaryEmbedding.cos_sin_cache: [max_position, rotary_dim] in the
     * model's dtype (vllm/model_executor/layers/rotary_embedding) */
    if (d->rotary) {
        if (!vp_mul_u64(max_pos, d->head_dim, &bytes) ||
            !vp_mul_u64(bytes, dtype_bytes, &bytes) ||
            !vp_add_u64(total, vp_allocator_round_size(&ac, bytes), &total))
            return vp_error_set(err, VP_EOVERFLOW,
                                "weights overflow 64 bits");
    }
    *out = total;
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* The profile run                                                      */
/* ------------------------------------------------------------------ */

typedef struct trk {
    vp_allocator *a;
    vp_error *err;
    vp_status st;
} trk;

/* Allocate rows x cols elements of elem bytes; a handle (0 once failed). */
static uint64_t take(trk *t, uint64_t rows, uint64_t cols, uint64_t elem)
{
    uint64_t bytes, h = 0;

    if (t->st != VP_OK)
        return 0;
    if (!vp_mul_u64(rows, cols, &bytes) || !vp_mul_u64(bytes, elem, &bytes)) {
        t->st = vp_error_set(t->err, VP_EOVERFLOW,
                             "a profile-run tensor overflows 64 bits");
        return 0;
    }
    t->st = vp_allocator_malloc(t->a, bytes, 0, &h, t->err);
    return h;
}

static void drop(trk *t, uint64_t *h)
{
    if (*h && t->st == VP_OK)
        t->st = vp_allocator_release(t->a, *h, t->err);
    *h = 0;
}

/* One decoder layer (vllm/model_executor/models/llama.py LlamaDecoderLayer,
 * gpt2.py GPT2Block). *res is the residual stream, *hid the previous
 * layer's output (RMSNorm models fold it into the next norm in place). */
static void fwd_layer(trk *t, const sv_dims *d, const sv_profile *p,
                      uint32_t l, uint64_t *res, uint64_t *hid)
{
    uint64_t T = p->tokens, b = p->dtype_bytes, H = d->hidden;
    uint64_t q = (uint64_t)d->heads / p->tp * d->head_dim;
    uint64_t F = d->ffn / p->tp, kvr = 1, normed, qkv, att, lse, o, ar;
    uint32_t kv_r;

    if (vp_kv_heads_per_rank(d->kv_heads, p->tp, &kv_r, NULL) == VP_OK)
        kvr = (uint64_t)kv_r * d->head_dim;
    if (d->rmsnorm && l > 0) {
        normed = *hid; /* fused_add_rms_norm in place */
        *hid = 0;
    } else {
        normed = take(t, T, H, b);
    }
    qkv = take(t, T, q + 2 * kvr, b);
    if (!p->eager)
        drop(t, &normed); /* the compiled graph frees at last use */
    att = take(t, T, q, b);
    lse = take(t, (uint64_t)d->heads / p->tp, T, 4); /* softmax_lse fp32 */
    drop(t, &lse);
    if (!p->eager)
        drop(t, &qkv);
    o = take(t, T, H, b);
    if (!p->eager)
        drop(t, &att);
    if (p->tp > 1) { /* all-reduce out of place */
        ar = take(t, T, H, b);
        drop(t, &o);
        o = ar;
    }
    drop(t, &qkv); /* eager: locals die when the module returns */
    drop(t, &att);
    drop(t, &normed);
    if (!d->rmsnorm) { /* hidden = attn_output + residual; ln_2 */
        ar = take(t, T, H, b);
        drop(t, res);
        drop(t, &o);
        *res = ar;
        o = take(t, T, H, b);
    }
    uint64_t gu = take(t, T, d->gated ? 2 * F : F, b);
    if (!p->eager)
        drop(t, &o);
    uint64_t act = take(t, T, F, b); /* SiluAndMul / GELU out of place */
    if (!p->eager)
        drop(t, &gu);
    uint64_t down = take(t, T, H, b);
    if (!p->eager)
        drop(t, &act);
    if (p->tp > 1) {
        ar = take(t, T, H, b);
        drop(t, &down);
        down = ar;
    }
    drop(t, &gu);
    drop(t, &act);
    drop(t, &o);
    if (d->rmsnorm) {
        *hid = down;
    } else { /* hidden = residual + feed_forward */
        ar = take(t, T, H, b);
        drop(t, res);
        drop(t, &down);
        *res = ar;
    }
}

/* The model's forward; leaves *out ([T, H]) and *last ([reqs, H], the rows
 * the logits are computed for) allocated. */
static void forward(trk *t, const sv_dims *d, const sv_profile *p,
                    uint64_t *out, uint64_t *last)
{
    uint64_t T = p->tokens, b = p->dtype_bytes, res, hid = 0, ar;

    res = take(t, T, d->hidden, b); /* embedding */
    if (p->tp > 1) {
        ar = take(t, T, d->hidden, b);
        drop(t, &res);
        res = ar;
    }
    for (uint32_t l = 0; l < d->layers && t->st == VP_OK; l++)
        fwd_layer(t, d, p, l, &res, &hid);
    if (d->rmsnorm) { /* final norm fused in place */
        *out = hid;
        drop(t, &res);
    } else {
        *out = take(t, T, d->hidden, b);
        drop(t, &res);
    }
    uint64_t idx = take(t, p->reqs, 1, 8); /* logit_indices */
    *last = take(t, p->reqs, d->hidden, b);
    drop(t, &idx);
}

/* The sort of apply_top_k_top_p: values and indices out, and the
 * segmented radix sort's temporaries (ATen SortStable.cu, CUB's
 * alternate key and value buffers). */
static void sort_rows(trk *t, uint64_t n, uint64_t V, uint64_t *sv,
                      uint64_t *si)
{
    uint64_t a, c;

    *sv = take(t, n, V, 4);
    *si = take(t, n, V, 8);
    if (n == 1) { /* segmented_sort_large_segments */
        a = take(t, V, 1, 8);
        c = take(t, V, 1, 4 + 8);
        drop(t, &c);
        drop(t, &a);
    } else if (n < SORT_SEGMENTED_ROWS) { /* segmented_sort_pairs_by_full_sort */
        uint64_t s1 = take(t, n, V, 8), s2 = take(t, n, V, 8);
        c = take(t, n, V, 4 + 8);
        drop(t, &c);
        c = take(t, n, V, 8); /* radix_sort_keys on the segment ids */
        drop(t, &c);
        drop(t, &s2);
        drop(t, &s1);
    } else { /* segmented_sort_pairs */
        a = take(t, n, V, 8); /* reverse indices */
        c = take(t, n, V, 4 + 8);
        drop(t, &c);
        drop(t, &a);
    }
}

/* GPUModelRunner._dummy_sampler_run: random hidden states, the LM head for
 * the sampled rows, Sampler.forward with temperature, top-k and top-p set
 * (vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py forward_native). */
static void sampler(trk *t, const sv_dims *d, const sv_profile *p)
{
    uint64_t n = p->reqs, V = d->vocab, b = p->dtype_bytes;
    uint64_t Vp = pad_vocab(V), rnd, lg, f32 = 0, g, tmp, sv, si, km, kb, ps;

    rnd = take(t, n, d->hidden, b);
    lg = take(t, n, Vp / p->tp, b);
    if (p->tp > 1) { /* all-gather, then movedim to [n, V] contiguous */
        uint64_t gat = take(t, n, Vp, b);
        drop(t, &lg);
        lg = take(t, n, Vp, b);
        drop(t, &gat);
    }
    if (b != 4)
        f32 = take(t, n, V, 4); /* logits.to(torch.float32) */
    g = take(t, n, 1, 8);       /* greedy argmax */
    tmp = take(t, n, 1, 4);     /* torch.where on the temperatures */
    drop(t, &tmp);
    sort_rows(t, n, V, &sv, &si);
    tmp = take(t, n, 1, 8); /* V - k */
    km = take(t, n, 1, 4);  /* gather: the k-th value */
    drop(t, &tmp);
    kb = take(t, n, V, 1); /* logits_sort < top_k_mask */
    drop(t, &km);
    ps = take(t, n, V, 4); /* softmax; cumsum in place */
    tmp = take(t, n, 1, 4);
    uint64_t pb = take(t, n, V, 1); /* probs_sum <= 1 - p */
    drop(t, &tmp);
    uint64_t sc = take(t, n, V, 4); /* logits_sort.scatter */
    drop(t, &sv);
    drop(t, &si);
    drop(t, &kb);
    drop(t, &ps);
    drop(t, &pb);
    uint64_t pr = take(t, n, V, 4), qx = take(t, n, V, 4); /* random_sample */
    uint64_t am = take(t, n, 1, 8);
    uint64_t all[] = {am, qx, pr, sc, g, f32, lg, rnd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        drop(t, &all[i]);
}

vp_status vp__serve_profile(const sv_dims *d, const sv_profile *p,
                            uint64_t *fwd, uint64_t *smp, uint64_t *peak,
                            vp_error *err)
{
    vp_allocator_stats s;
    uint64_t out = 0, last = 0;
    trk t = {NULL, err, VP_OK};

    if (p->tp == 0 || p->reqs == 0 || p->tokens == 0 || p->reqs > p->tokens)
        return vp_error_set(err, VP_EARG, "profile run without tokens");
    t.a = vp_allocator_new(NULL, err);
    if (!t.a)
        return err->code;
    forward(&t, d, p, &out, &last);
    vp_allocator_stats_get(t.a, &s);
    *fwd = s.peak_allocated;
    *smp = 0;
    if (!p->forward_only) {
        vp_allocator_reset_peaks(t.a);
        sampler(&t, d, p);
        vp_allocator_stats_get(t.a, &s);
        *smp = s.peak_allocated;
    }
    *peak = *fwd > *smp ? *fwd : *smp;
    drop(&t, &last);
    drop(&t, &out);
    vp_allocator_free(t.a);
    return t.st;
}
