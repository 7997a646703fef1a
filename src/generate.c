/* generate(): model.generate() of a causal language model under
 * torch.no_grad(), as transformers 5.17 runs it with PyTorch 2.11
 * (GenerationMixin._sample, _prefill; cache_utils.py), through the same
 * forward rules as the training step (src/ops/, run with nothing saved)
 * and the same caching-allocator model:
 *
 *   the prompt's forward (B x P tokens) with logits_to_keep = 1, so the
 *   head makes the last position's logits only; then N - 1 forwards of
 *   one token each, attending over the cache; after each forward the
 *   logits stage of sampler.c.
 *
 * The key/value cache grows as DynamicLayer.update does it
 * (self.keys = torch.cat([self.keys, key_states], dim=-2): a new tensor a
 * step for every layer's K and V, the old one freed after it, so the
 * allocator sees growing blocks: the fragmentation of a dynamic cache),
 * or is allocated once per layer at its first update (StaticLayer:
 * torch.zeros of P + N - 1 tokens, index_copy_ after). Where HF builds a
 * 4-D attention mask (eager attention, padded prompts, a static cache's
 * decode steps), GQA models repeat K and V to every head (repeat_kv) and
 * SDPA converts the boolean mask to the compute dtype.
 *
 * Rules and their sources: docs/GENERATE.md; the allocator traces in
 * groundtruth/traces/ (the generate cases). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate_impl.h"
#include "vramplan/kvcache.h"

/* The most op forwards a simulation runs (decode steps x calls x ops): a
 * few minutes of simulation; more is refused rather than left to run for
 * hours. */
#define MAX_OP_FORWARDS ((uint64_t)1 << 28)

/* ---- the cache -------------------------------------------------------------- */

static uint32_t kv_alloc(sim *S, uint64_t tokens, uint64_t per_token)
{
    return vp__talloc(S, vp__mulc(S, tokens, per_token), VP__CAT_KV);
}

/* The cache update of layer L for q new tokens; returns the key length
 * the layer's attention sees (also kept in L->kv). */
static uint64_t cache_update(vp__gen *G, vp__gen_layer *L, uint64_t q)
{
    sim *S = G->S;

    if (G->cfg->cache == VP_CACHE_STATIC) {
        /* StaticLayer.lazy_initialization: both buffers at once;
         * StaticSlidingWindowLayer keeps min(window, max_cache_len) */
        uint64_t n = L->window && L->window < G->lmax ? L->window : G->lmax;
        if (L->k == NONE) {
            L->k = kv_alloc(S, n, L->kb);
            L->v = kv_alloc(S, n, L->vb);
            L->stored = L->view = n;
        }
        /* a prefill longer than the window attends over all its keys
         * (StaticSlidingWindowLayer.update returns them; measured) */
        return L->kv = q > n ? q : n;
    }
    /* torch.cat([self.keys, key_states]), then the old tensor freed by
     * the assignment; a sliding layer keeps a view of the last
     * window - 1 tokens of the new tensor */
    uint64_t n = L->view + q;
    uint32_t k = kv_alloc(S, n, L->kb);
    vp__tunref(S, L->k);
    L->k = k;
    uint32_t v = kv_alloc(S, n, L->vb);
    vp__tunref(S, L->v);
    L->v = v;
    L->stored = n;
    L->view = L->window && n > L->window - 1 ? L->window - 1 : n;
    return L->kv = n;
}

/* The key length layer L's attention will see in a forward of q tokens,
 * before its update. */
static uint64_t kv_len_of(const vp__gen *G, const vp__gen_layer *L,
                          uint64_t q)
{
    if (G->cfg->cache == VP_CACHE_STATIC) {
        uint64_t n = L->window && L->window < G->lmax ? L->window : G->lmax;
        return q > n ? q : n;
    }
    return L->view + q;
}

/* `key_states, value_states = past_key_values.update(...)`: the
 * attention's k and v inputs become the cache's tensors, and the
 * projections' outputs are dropped. */
static void rebind(sim *S, uint32_t in, uint32_t cache)
{
    uint32_t old = S->out_t[in];
    vp__tref(S, cache);
    S->out_t[in] = cache;
    vp__tunref(S, old);
}

/* Op i of an MLA layer made to cover kv tokens instead of the forward's
 * new ones: the cached latent and rotary key, kv_b_proj's expansion of the
 * latent, the keys and the values (DeepseekV3Attention.expand_kv runs on
 * every cached token). Its shape is [B, tokens, width]. */
static void over_keys(vp__gen *G, vp_graph *g, uint32_t i, uint64_t kv)
{
    vp_op *o = &g->ops[i];
    o->shape[1] = kv;
    o->numel = vp__mulc(G->S, vp__mulc(G->S, G->B, kv), o->shape[2]);
}

/* MLA's cache (transformers 5.17 DeepseekV3Attention.forward, traced in
 * groundtruth/traces/deepseek-v3-small-gen-b4-p512-n8-dynamic):
 * `k_pass, k_rot = past_key_values.update(k_pass, k_rot, layer_idx)` with
 * k_pass the normed latent [B, 1, q, kv_lora_rank] and k_rot the roped
 * rotary key [B, 1, q, qk_rope_head_dim], so the layer's keys are the
 * latent and its values the rotary key; the update (at the latent) makes
 * both, then the reassignment frees the forward's own latent and rotary
 * key. Op i's output becomes the cache's tensor. */
static void mla_cache(vp__gen *G, vp_graph *g, uint32_t i, uint64_t q)
{
    sim *S = G->S;
    vp__gen_layer *L = &G->layers[G->layer_of[i]];
    const vp_op *o = &g->ops[i];
    bool key = G->role[i] == VP__GEN_MLA_K;
    S->cur_op = o->name;
    S->cur_op_idx = (int32_t)i;
    if (key)
        cache_update(G, L, q);
    uint32_t t = key ? L->k : L->v;
    for (uint32_t c = 0; c < S->consumers[i]; c++)
        vp__tref(S, t);
    S->out_t[i] = t;
    S->out_eb[i] = G->ce;
    S->lay[i] = 0;
    over_keys(G, g, i, L->kv);
    vp__tunref(S, S->out_t[o->inputs[0]]);
}

/* ---- one forward -------------------------------------------------------------- */

static bool eager(const vp__gen *G)
{
    const vp_op *o = &G->gd->ops[G->layers[0].op];
    return vp__attention_impl(G->S, o, G->ce) == VP_ATTN_EAGER;
}

/* Whether the mask of layer L's kind is materialized in a forward of q
 * tokens: always for eager attention; for SDPA unless
 * masking_utils._ignore_causal_mask_sdpa lets it pass is_causal instead,
 * which it does when no prompt is padded, q is 1 or the key length, and
 * the key length is below the layer's sliding window (a static cache's
 * decode steps read max_cache_len keys for one query: traced). */
static bool mask_needed(const vp__gen *G, const vp__gen_layer *L, uint64_t q,
                        bool prefill)
{
    if (eager(G) || G->cfg->padded ||
        (G->cfg->cache == VP_CACHE_STATIC && !prefill))
        return true;
    return L->window && kv_len_of(G, L, q) >= L->window;
}

/* masking_utils.create_causal_mask (and create_sliding_window_causal_mask
 * for sliding layers: Qwen2 makes both when it has both kinds, Mistral
 * the sliding one), once per forward before the layers: the causal grid
 * and its AND with the padding mask (q x kv each), then the 4-D boolean
 * mask [B, 1, q, kv]; eager attention takes it as a float mask in the
 * model's dtype (vp__attention_model_mask, kept until the forward
 * returns). */
static void model_mask(vp__gen *G, uint64_t q, bool prefill)
{
    sim *S = G->S;
    bool eg = eager(G);
    G->fmask[0] = G->fmask[1] = NONE;
    for (int k = 0; k < 2; k++) {
        const vp__gen_layer *L = NULL;
        for (uint32_t l = 0; l < G->n_layers && !L; l++)
            if ((G->layers[l].window != 0) == k)
                L = &G->layers[l];
        if (!L || !mask_needed(G, L, q, prefill))
            continue;
        uint64_t grid = vp__mulc(S, q, kv_len_of(G, L, q));
        uint32_t t1 = vp__talloc(S, grid, VP_CAT_TEMP);
        uint32_t t2 = vp__talloc(S, grid, VP_CAT_TEMP);
        vp__tunref(S, t1);
        G->fmask[k] = vp__talloc(S, vp__mulc(S, grid, G->B), VP_CAT_ACT);
        vp__tunref(S, t2);
        if (eg) { /* eager_mask: as a float mask of the model's dtype */
            uint32_t fm = vp__talloc(S, vp__mulc(S, vp__mulc(S, grid, G->B),
                                                 S->PE), VP_CAT_ACT);
            vp__tunref(S, G->fmask[k]);
            G->fmask[k] = fm;
        }
    }
}

/* The rotary embedding's cos and sin (LlamaRotaryEmbedding.forward, once
 * per forward after the mask; traced): the positions in fp32, freqs
 * (B x q x d/2), emb = cat(freqs, freqs), cos and sin in fp32 and times
 * the attention scaling, then both cast to the compute dtype, which the
 * model keeps until its layers are done (*cs). */
static void rotary(vp__gen *G, uint64_t q, uint32_t cs[2])
{
    sim *S = G->S;
    uint64_t d = G->rope_dim;
    uint64_t n = vp__mulc(S, G->B, q), nd = vp__mulc(S, n, d);
    uint32_t pos = vp__talloc(S, vp__mulc(S, n, 4), VP_CAT_TEMP);
    uint32_t fr = vp__talloc(S, vp__mulc(S, nd / 2 + nd % 2, 4), VP_CAT_TEMP);
    uint32_t emb = vp__talloc(S, vp__mulc(S, nd, 4), VP_CAT_TEMP);
    uint32_t f32[2];
    for (int k = 0; k < 2; k++) {
        uint32_t t = vp__talloc(S, vp__mulc(S, nd, 4), VP_CAT_TEMP);
        f32[k] = vp__talloc(S, vp__mulc(S, nd, 4), VP_CAT_TEMP);
        vp__tunref(S, t);
    }
    for (int k = 0; k < 2; k++)
        cs[k] = vp__talloc(S, vp__mulc(S, nd, G->ce), VP_CAT_ACT);
    vp__tunref(S, pos);
    vp__tunref(S, fr);
    vp__tunref(S, emb);
    vp__tunref(S, f32[0]);
    vp__tunref(S, f32[1]);
}

/* One attention layer: the cache update, HF's repeat_kv and SDPA's mask
 * conversion around the kernel's own rule. */
static void attention(vp__gen *G, vp_graph *g, uint32_t i, uint64_t q)
{
    sim *S = G->S;
    vp__gen_layer *L = &G->layers[G->layer_of[i]];
    vp_op *o = &g->ops[i];
    uint64_t kv = L->mla ? L->kv : cache_update(G, L, q);
    o->kv_len = kv;
    if (!L->mla && o->n_inputs == 3) {
        rebind(S, o->inputs[1], L->k);
        rebind(S, o->inputs[2], L->v);
    }
    bool eg = eager(G), masked = G->fmask[L->window != 0] != NONE;
    uint32_t rk = NONE, rv = NONE, conv = NONE;
    if (!eg && masked && o->kv_heads < o->heads) {
        /* repeat_kv: [B, kv_heads, kv, d] expanded to every head (eager
         * attention's own: ops/attention.c) */
        uint64_t rep = o->heads / o->kv_heads;
        rk = vp__talloc(S, vp__mulc(S, vp__mulc(S, kv, L->kb), rep),
                        VP_CAT_TEMP);
        rv = vp__talloc(S, vp__mulc(S, vp__mulc(S, kv, L->vb), rep),
                        VP_CAT_TEMP);
    }
    if (!eg && masked) /* torch.where(mask, 0, -inf) */
        conv = vp__talloc(S, vp__mulc(S, vp__mulc(S, G->B, q),
                                      vp__mulc(S, kv, G->ce)),
                          VP_CAT_TEMP);
    vp__fwd(S, i, MODE_SAVE, NULL);
    vp__tunref(S, conv);
    vp__tunref(S, rk);
    vp__tunref(S, rv);
}

/* FLOPs of op i in a forward of q tokens (attention over its key
 * length; MLA's expansion over the keys instead of the q tokens the graph
 * counted). */
static double op_flops(const vp__gen *G, const vp_graph *g, uint32_t i,
                       uint64_t q)
{
    const vp_op *o = &g->ops[i];
    if (G->role[i] == VP__GEN_OVER_KV)
        return o->flops_fwd / (double)q * (double)o->shape[1];
    if (o->kind != VP_OP_ATTENTION)
        return o->flops_fwd;
    double f = 4.0 * (double)o->shape[0] * (double)o->heads * (double)q *
               (double)o->kv_len * (double)o->head_dim;
    return o->causal && q == o->kv_len ? f / 2.0 : f;
}

/* One call of the model: the prompt's (prefill) or one new token's. The
 * prefill runs its head on the last position only: the decode
 * instance's lm_head, whose input is B x 1 x H (logits_to_keep = 1). */
static void forward(vp__gen *G, bool prefill)
{
    sim *S = G->S;
    vp_graph *g = prefill ? G->gp : G->gd;
    uint64_t q = prefill ? G->P : 1;
    for (size_t i = 0; i < g->n_ops; i++)
        S->out_t[i] = NONE;
    for (uint32_t l = 0; l < G->n_layers; l++)
        g->ops[G->layers[l].op].kv_len = kv_len_of(G, &G->layers[l], q);
    S->g = g;
    uint32_t cs[2] = {NONE, NONE};
    for (uint32_t i = 0; i < g->n_ops && OK(S); i++) {
        if (i == G->loss_op)
            continue;
        if (i == G->head_op) { /* the base model has returned */
            vp__tunref(S, cs[0]);
            vp__tunref(S, cs[1]);
            cs[0] = cs[1] = NONE;
            if (prefill)
                S->g = g = G->gd;
        }
        if (g->n_segs && i == g->segs[0].first_op) {
            model_mask(G, q, prefill);
            if (g->tf.rotary)
                rotary(G, q, cs);
        }
        switch (G->role[i]) {
        case VP__GEN_ATTN:
            attention(G, g, i, q);
            break;
        case VP__GEN_MLA_K:
        case VP__GEN_MLA_V:
            mla_cache(G, g, i, q);
            break;
        case VP__GEN_OVER_KV:
            over_keys(G, g, i, G->layers[G->layer_of[i]].kv);
            vp__fwd(S, i, MODE_SAVE, NULL);
            break;
        default:
            vp__fwd(S, i, MODE_SAVE, NULL);
        }
        G->flops += op_flops(G, g, i, i >= G->head_op ? 1 : q);
    }
    vp__release_pyholds(S);
    vp__release_held(S);
    vp__tunref(S, cs[0]);
    vp__tunref(S, cs[1]);
    for (int k = 0; k < 2; k++) {
        vp__tunref(S, G->fmask[k]);
        G->fmask[k] = NONE;
    }
    G->logits = OK(S) ? S->out_t[G->logits_op] : NONE;
    S->cur_op = "";
    S->cur_op_idx = -1;
}

/* ---- a call ------------------------------------------------------------------ */

static uint64_t cache_bytes(const vp__gen *G)
{
    uint64_t total = 0;
    for (uint32_t l = 0; l < G->n_layers; l++) {
        const vp__gen_layer *L = &G->layers[l];
        total += L->stored * (L->kb + L->vb); /* bounded: allocated */
    }
    return total;
}

static void release_call(vp__gen *G)
{
    sim *S = G->S;
    vp__gen_logits_release(G);
    for (uint32_t l = 0; l < G->n_layers; l++) {
        vp__tunref(S, G->layers[l].k);
        vp__tunref(S, G->layers[l].v);
        G->layers[l].k = G->layers[l].v = NONE;
        G->layers[l].view = G->layers[l].stored = 0;
    }
}

/* Peak allocated since the last mark, relative to the baseline; the
 * mark moves to now. */
static uint64_t phase_peak(sim *S)
{
    uint64_t p = S->phase_peak - S->out->baseline;
    S->phase_peak = vp__allocated(S);
    return p;
}

static void one_call(vp__gen *G, uint32_t call)
{
    sim *S = G->S;
    vp_estimate *out = S->out;
    uint64_t tokens = vp__mulc(S, vp__mulc(S, G->B, G->P), 8);
    S->step = call;
    S->phase = VP_PHASE_FORWARD;
    S->cur_op = "input";
    /* the caller's input_ids and attention_mask (int64) */
    uint32_t ids = vp__talloc(S, tokens, VP_CAT_INPUT);
    uint32_t mask = vp__talloc(S, tokens, VP_CAT_INPUT);
    vp_phase_peaks *pk = &out->step[call - 1];
    memset(pk, 0, sizeof *pk);
    pk->start = vp__allocated(S) - out->baseline;
    S->phase_peak = vp__allocated(S);
    /* _prepare_position_ids_for_generation (kept for the call), and
     * prepare_inputs_for_generation's copy for the prefill */
    uint32_t pos0 = vp__talloc(S, tokens, VP_CAT_INPUT);
    uint32_t pin = vp__talloc(S, tokens, VP_CAT_INPUT);
    S->gen_token = 1;
    forward(G, true);
    vp__tunref(S, pin);
    vp__gen_logits_stage(G, 0);
    uint64_t pre = phase_peak(S), dec = 0;
    for (uint64_t t = 1; t < G->N && OK(S); t++) {
        S->gen_token = t + 1;
        forward(G, false);
        vp__gen_logits_stage(G, t);
    }
    if (G->N > 1)
        dec = phase_peak(S);
    if (out->gen.prefill_peak < pre)
        out->gen.prefill_peak = pre;
    if (out->gen.decode_peak < dec)
        out->gen.decode_peak = dec;
    pk->peak[VP_PHASE_FORWARD] = pre > dec ? pre : dec;
    out->gen.kv_cache_bytes = cache_bytes(G);
    /* generate() returns; the caller drops its output, then its inputs */
    S->cur_op = "";
    release_call(G);
    vp__tunref(S, pos0);
    vp__tunref(S, ids);
    vp__tunref(S, mask);
    pk->after_fwd = pk->end = vp__allocated(S) - out->baseline;
    vp_allocator_stats st;
    vp_allocator_stats_get(S->a, &st);
    pk->reserved = st.reserved;
    out->steps = call;
}

/* ---- setting up ----------------------------------------------------------------- */

/* An MLA attention op a (graph_mla.c): its cache takes the place of the
 * latent and the rotary key the k concatenation reads (through kv_b_proj
 * for the latent); those two, kv_b_proj, k and v run over the keys. */
static vp_status mla_init(vp__gen *G, uint32_t a, uint32_t l)
{
    const vp_graph *g = G->gd;
    const vp_op *o = &g->ops[a];
    uint32_t kst = o->inputs[1], kvb = g->ops[kst].inputs[0];
    uint32_t rot = g->ops[kst].inputs[1], lat = g->ops[kvb].inputs[0];
    uint32_t over[] = {lat, rot, kvb, kst, o->inputs[2]};
    if (g->ops[lat].kind != VP_OP_SCALE || g->ops[rot].kind != VP_OP_SCALE)
        return vp_error_set(G->S->err, VP_EUNSUPPORTED,
                            "generate: attention '%s' is not multi-head "
                            "latent attention as transformers builds it",
                            o->name);
    for (size_t k = 0; k < sizeof over / sizeof *over; k++) {
        if (g->ops[over[k]].ndim != 3)
            return vp_error_set(G->S->err, VP_EUNSUPPORTED,
                                "generate: MLA op '%s' is not [batch, "
                                "tokens, width]", g->ops[over[k]].name);
        G->layer_of[over[k]] = l;
        G->role[over[k]] = k == 0   ? VP__GEN_MLA_K
                           : k == 1 ? VP__GEN_MLA_V
                                    : VP__GEN_OVER_KV;
    }
    vp__gen_layer *L = &G->layers[l];
    L->mla = true;
    L->kb = vp__mulc(G->S, G->B, vp__mulc(G->S, g->ops[lat].shape[2], G->ce));
    L->vb = vp__mulc(G->S, G->B, vp__mulc(G->S, g->ops[rot].shape[2], G->ce));
    G->rope_dim = g->ops[rot].shape[2];
    return VP_OK;
}

/* The cache geometry of every attention layer (kvcache.c), in bytes per
 * token of all sequences; each op's role. */
static vp_status layers_init(vp__gen *G)
{
    sim *S = G->S;
    vp_kv_layout kv;
    size_t n = G->gd->n_ops;
    vp_status st = vp_kv_layout_from_graph(G->gd, &kv, S->err);
    if (st != VP_OK)
        return st;
    G->layers = calloc(kv.n_layers, sizeof *G->layers);
    G->layer_of = malloc(n * sizeof *G->layer_of);
    G->role = calloc(n, 1);
    if (!G->layers || !G->layer_of || !G->role) {
        vp_kv_layout_destroy(&kv);
        return vp_error_set(S->err, VP_ENOMEM, "out of memory");
    }
    G->n_layers = kv.n_layers;
    for (uint32_t i = 0; i < n; i++)
        G->layer_of[i] = NONE;
    uint32_t l = 0;
    for (uint32_t i = 0; i < n && st == VP_OK; i++) {
        const vp_op *o = &G->gd->ops[i];
        if (o->kind != VP_OP_ATTENTION || !o->causal || l >= kv.n_layers)
            continue;
        const vp_kv_layer *y = &kv.layer[l];
        vp__gen_layer *L = &G->layers[l];
        L->op = i;
        L->k = L->v = NONE;
        L->window = y->kind == VP_KV_SLIDING ? y->window : 0;
        L->kb = vp__mulc(S, vp__mulc(S, G->B, y->kv_heads),
                         vp__mulc(S, y->key_dim, G->ce));
        L->vb = vp__mulc(S, vp__mulc(S, G->B, y->kv_heads),
                         vp__mulc(S, y->value_dim, G->ce));
        G->rope_dim = o->head_dim;
        G->layer_of[i] = l;
        G->role[i] = VP__GEN_ATTN;
        if (o->n_inputs == 3 && G->gd->ops[o->inputs[1]].kind == VP_OP_MLA_K)
            st = mla_init(G, i, l);
        l++;
    }
    vp_kv_layout_destroy(&kv);
    return st != VP_OK ? st : S->st;
}

/* The causal LM's loss and lm_head; the prefill and decode instances,
 * each op's kind as in the caller's graph. */
static vp_status graphs_init(vp__gen *G, const vp_graph *g)
{
    sim *S = G->S;
    if (!g->has_tf || g->tf.type != VP_TF_DECODER ||
        g->tf.head != VP_HEAD_CAUSAL_LM)
        return vp_error_set(S->err, VP_EUNSUPPORTED,
                            "generate needs a decoder with a causal "
                            "language-model head (transformer type decoder, "
                            "head causal-lm); '%s' is not one",
                            g->model_name);
    if (!g->tf.rotary && G->P + G->N - 1 > g->tf.max_positions)
        return vp_error_set(S->err, VP_ERANGE,
                            "prompt %llu + %llu new tokens is longer than "
                            "the model's %llu learned positions",
                            (unsigned long long)G->P,
                            (unsigned long long)(G->N - 1),
                            (unsigned long long)g->tf.max_positions);
    G->gp = vp__graph_rebuild(g, G->B, G->P, S->err);
    G->gd = G->gp ? vp__graph_rebuild(g, G->B, 1, S->err) : NULL;
    if (!G->gd)
        return S->err ? S->err->code : VP_ENOMEM;
    VP_ASSERT(G->gp->n_ops == g->n_ops && G->gd->n_ops == g->n_ops);
    G->loss_op = G->logits_op = G->head_op = NONE;
    for (uint32_t i = 0; i < g->n_ops; i++) {
        G->gp->ops[i].flags &= ~VP_OPF_KV_COPY; /* the cache's cat is it */
        G->gd->ops[i].flags &= ~VP_OPF_KV_COPY;
        if (G->head_op == NONE && (g->ops[i].flags & VP_OPF_MODEL_END))
            G->head_op = i;
        if (vp__op_table[g->ops[i].kind].traits & VP__TRAIT_LOSS) {
            G->loss_op = i;
            G->logits_op = g->ops[i].inputs[0];
        }
    }
    VP_ASSERT(G->loss_op != NONE && G->head_op != NONE &&
              G->head_op <= G->logits_op);
    G->vocab = g->tf.vocab;
    G->eos = !g->tf.no_eos;
    return VP_OK;
}

static vp_status check_setup(const vp_generate *c, vp_error *err)
{
    if (c->new_tokens == 0)
        return vp_error_set(err, VP_EARG,
                            "generate needs at least 1 new token");
    if (c->prompt > VP_MAX_DIM || c->new_tokens > VP_MAX_DIM ||
        c->min_new > c->new_tokens)
        return vp_error_set(err, VP_ERANGE,
                            "generate: prompt and new tokens 1 to %llu, "
                            "min_new at most the new tokens",
                            (unsigned long long)VP_MAX_DIM);
    if ((unsigned)c->cache >= VP_CACHE__COUNT)
        return vp_error_set(err, VP_EARG, "generate: invalid cache");
    if (c->top_k > 0 && !c->sample)
        return vp_error_set(err, VP_EARG,
                            "generate: top-k filtering needs sampling");
    if (c->top_p && !c->sample)
        return vp_error_set(err, VP_EARG,
                            "generate: top-p filtering needs sampling");
    return VP_OK;
}

vp_status vp__generate_run(sim *S)
{
    const vp_graph *g = S->g;
    vp__gen G;
    memset(&G, 0, sizeof G);
    G.S = S;
    G.cfg = &S->s->generate;
    G.B = S->s->batch;
    G.P = G.cfg->prompt;
    G.N = G.cfg->new_tokens;
    G.lmax = G.P + G.N - 1;
    G.ce = S->amp ? 2 : S->A;
    G.logits = G.l32 = G.scores = G.probs = NONE;
    G.ids = G.mask = G.pos = G.fmask[0] = G.fmask[1] = NONE;
    vp_status st = check_setup(G.cfg, S->err);
    if (st == VP_OK)
        st = graphs_init(&G, g);
    if (st == VP_OK)
        st = layers_init(&G);
    if (st == VP_OK &&
        G.N > MAX_OP_FORWARDS / S->s->steps / G.gd->n_ops)
        st = vp_error_set(S->err, VP_ELIMIT,
                          "generate: %llu new tokens x %u calls x %zu ops "
                          "is over the simulation's bound of %llu op "
                          "forwards; simulate fewer new tokens or calls",
                          (unsigned long long)G.N, (unsigned)S->s->steps,
                          G.gd->n_ops, (unsigned long long)MAX_OP_FORWARDS);
    if (st == VP_OK && G.vocab > UINT64_MAX / 16 / G.B)
        st = vp_error_set(S->err, VP_EOVERFLOW,
                          "batch x vocabulary overflows 64 bits");
    if (st == VP_OK) {
        S->g = G.gp;
        vp__load_model(S);
        S->out->gen.weights = S->out->after_model;
        /* torch.cuda.reset_peak_memory_stats(): the calls' peaks */
        S->peak = 0;
        S->out->peak_alloc = 0;
        for (uint32_t c = 1; c <= S->s->steps && OK(S); c++)
            one_call(&G, c);
        S->out->flops_per_step = G.flops / S->s->steps;
        st = S->st;
    }
    S->g = g;
    /* the peak's op names a node of the graphs freed below: copied now */
    if (S->peak_op != NULL)
        snprintf(S->out->peak_op, sizeof S->out->peak_op, "%s", S->peak_op);
    S->peak_op = NULL;
    S->cur_op = "";
    free(G.layers);
    free(G.layer_of);
    free(G.role);
    vp_graph_free(G.gp);
    vp_graph_free(G.gd);
    return st;
}

/* ---- the --generate spec -------------------------------------------------------- */

static const char *const SPEC_KEYS[] = {"prompt", "new",   "min-new", "sample",
                                        "top-k",  "top-p", "padded",  NULL};

/* A whole decimal number in [lo, hi] filling [s, e). */
static bool spec_u64(const char *s, const char *e, uint64_t lo, uint64_t hi,
                     uint64_t *out)
{
    uint64_t v = 0;
    if (s == e || e - s > 20)
        return false;
    for (const char *p = s; p < e; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return v >= lo && v <= hi;
}

/* top-p=F: a decimal in (0, 1]; *on when below 1. */
static bool spec_top_p(const char *s, const char *e, bool *on)
{
    char buf[32], *end;
    if (s == e || (size_t)(e - s) >= sizeof buf ||
        strspn(s, "0123456789.") < (size_t)(e - s))
        return false;
    memcpy(buf, s, (size_t)(e - s));
    buf[e - s] = '\0';
    double p = strtod(buf, &end);
    *on = p < 1.0;
    return *end == '\0' && p > 0.0 && p <= 1.0;
}

/* One KEY or KEY=VALUE item of length n into *g. */
static vp_status spec_item(const char *s, size_t n, vp_generate *g,
                           bool *min_set, vp_error *err)
{
    const char *e = s + n, *eq = memchr(s, '=', n), *v = eq ? eq + 1 : e;
    char key[16];
    size_t kn = (size_t)((eq ? eq : e) - s);
    int k = -1;
    if (kn > 0 && kn < sizeof key) {
        memcpy(key, s, kn);
        key[kn] = '\0';
        for (k = 0; SPEC_KEYS[k] && strcmp(SPEC_KEYS[k], key); k++)
            ;
    }
    if (k < 0 || !SPEC_KEYS[k]) {
        const char *hint = kn > 0 && kn < sizeof key
                               ? vp__suggest(key, SPEC_KEYS) : NULL;
        return vp_error_set(err, VP_EARG, "unknown item '%.*s' in the "
                            "generate spec%s%s%s (items: prompt=N, new=N, "
                            "min-new=N, sample, top-k=N, top-p=P, padded)",
                            (int)n, s, hint ? " (did you mean '" : "",
                            hint ? hint : "", hint ? "'?)" : "");
    }
    bool flag = k == 3 || k == 6, ok;
    if (flag != (eq == NULL))
        return vp_error_set(err, VP_EARG, "'%s' in the generate spec %s",
                            SPEC_KEYS[k], flag ? "takes no value"
                                               : "needs a value (KEY=VALUE)");
    switch (k) {
    case 0: ok = spec_u64(v, e, 1, VP_MAX_DIM, &g->prompt); break;
    case 1: ok = spec_u64(v, e, 1, VP_MAX_DIM, &g->new_tokens); break;
    case 2: ok = spec_u64(v, e, 0, VP_MAX_DIM, &g->min_new);
            *min_set = true; break;
    case 4: {
        uint64_t t = 0;
        ok = spec_u64(v, e, 0, UINT32_MAX, &t);
        g->top_k = (uint32_t)t;
        break;
    }
    case 5: ok = spec_top_p(v, e, &g->top_p); break;
    default: ok = true; *(k == 3 ? &g->sample : &g->padded) = true; break;
    }
    if (!ok)
        return vp_error_set(err, VP_EARG, "invalid value '%.*s' for '%s' in "
                            "the generate spec (%s)", (int)(e - v), v,
                            SPEC_KEYS[k],
                            k == 5 ? "a number above 0, at most 1"
                                   : "a whole number of tokens");
    return VP_OK;
}

vp_status vp_generate_parse(const char *spec, vp_generate *out, vp_error *err)
{
    vp_generate g;
    bool min_set = false, top_k_set = false;
    memset(&g, 0, sizeof g);
    vp_error_clear(err);
    for (const char *p = spec ? spec : "";;) {
        size_t n = strcspn(p, ",");
        if (n == 0)
            return vp_error_set(err, VP_EARG, "an empty item in the generate "
                                "spec '%s'", spec ? spec : "");
        top_k_set |= strncmp(p, "top-k=", 6) == 0;
        VP_TRY(spec_item(p, n, &g, &min_set, err));
        if (p[n] == '\0')
            break;
        p += n + 1;
    }
    if (g.prompt == 0 || g.new_tokens == 0)
        return vp_error_set(err, VP_EARG, "the generate spec needs prompt=N "
                            "and new=N");
    if (!min_set) /* every sequence makes all its tokens (EOS masked) */
        g.min_new = g.new_tokens;
    if (g.sample && !top_k_set) /* GenerationConfig's default top_k */
        g.top_k = VP_GENERATE_TOP_K;
    out->prompt = g.prompt;
    out->new_tokens = g.new_tokens;
    out->min_new = g.min_new;
    out->sample = g.sample;
    out->top_k = g.top_k;
    out->top_p = g.top_p;
    out->padded = g.padded;
    return check_setup(&g, err);
}
