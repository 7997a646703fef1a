/* Tests of generate() (src/generate.c, src/sampler.c; docs/GENERATE.md):
 * the --generate spec, the key/value cache as transformers' DynamicCache
 * and StaticCache hold it, and what a call leaves behind.
 *
 * Most tests use tests/data/good/hf-llama.json in bf16: 2 layers, 4 query
 * heads of 16 dims, 2 KV heads, vocabulary 1000. One layer's K (or V) for
 * B sequences holds B x 2 heads x 16 dims x 2 B = 64 B bytes a token, so
 * the cache of a call is 2 layers x 2 (K, V) x 64 B x tokens = 256 B a
 * token, and it holds prompt + new - 1 tokens when generate() returns
 * (the last token is sampled, never fed back). Run from the repository
 * root. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <stdint.h>
#include <string.h>

#include "vramplan/vramplan.h"

#define LLAMA "tests/data/good/hf-llama.json"
#define MISTRAL "tests/data/good/hf-mistral.json"

/* K or V bytes per token of one layer for B sequences (see above). */
#define KV_TOKEN(B) ((uint64_t)(B) * 2 * 16 * 2)

typedef struct {
    vp_model *m;
    vp_graph *g;
} mg;

static mg open_model(const char *path, uint64_t batch, uint64_t prompt)
{
    mg r;
    vp_error err;
    memset(&err, 0, sizeof err);
    r.m = vp_model_load(path, &err);
    cr_assert_not_null(r.m, "%s: %s", path, err.msg);
    r.g = vp_graph_build(r.m, batch, prompt, &err);
    cr_assert_not_null(r.g, "%s: %s", path, err.msg);
    return r;
}

static void close_model(mg *r)
{
    vp_graph_free(r->g);
    vp_model_free(r->m);
}

static void gen_setup(vp_setup *s, uint64_t batch, const char *spec)
{
    vp_error err;
    vp_setup_init(s);
    s->fresh_process = false;
    s->precision = VP_PREC_BF16;
    s->batch = batch;
    s->steps = 2;
    cr_assert_eq(vp_generate_parse(spec, &s->generate, &err), VP_OK, "%s",
                 err.msg);
    s->seq = s->generate.prompt;
}

static vp_status run(const char *path, const vp_setup *s, vp_estimate *e,
                     vp_sim_event_fn cb, void *ud, vp_error *err)
{
    mg r = open_model(path, s->batch, s->generate.prompt);
    vp_status st = vp_simulate(r.g, s, e, cb, ud, err);
    close_model(&r);
    return st;
}

static vp_estimate simulate(const char *path, const vp_setup *s)
{
    vp_estimate e;
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_status st = run(path, s, &e, NULL, NULL, &err);
    cr_assert_eq(st, VP_OK, "%s", err.msg);
    return e;
}

/* ---- the spec ------------------------------------------------------------------ */

Test(generate_spec, prompt_and_new_with_every_token_made)
{
    vp_generate g;
    vp_error err;
    memset(&g, 0, sizeof g);
    cr_assert_eq(vp_generate_parse("prompt=1024,new=256", &g, &err), VP_OK);
    cr_expect_eq(g.prompt, 1024);
    cr_expect_eq(g.new_tokens, 256);
    cr_expect_eq(g.min_new, 256); /* EOS masked: min_new_tokens = new */
    cr_expect_not(g.sample);
    cr_expect_eq(g.top_k, 0);
    cr_expect_not(g.top_p);
    cr_expect_not(g.padded);
}

Test(generate_spec, sample_takes_generation_configs_top_k)
{
    vp_generate g;
    vp_error err;
    cr_assert_eq(vp_generate_parse("new=8,sample,prompt=16,top-p=0.9", &g,
                                   &err), VP_OK, "%s", err.msg);
    cr_expect(g.sample);
    cr_expect_eq(g.top_k, VP_GENERATE_TOP_K);
    cr_expect(g.top_p);
    cr_assert_eq(vp_generate_parse("prompt=16,new=8,sample,top-k=0,top-p=1",
                                   &g, &err), VP_OK, "%s", err.msg);
    cr_expect_eq(g.top_k, 0);
    cr_expect_not(g.top_p); /* top_p = 1 keeps every token: no warper */
}

Test(generate_spec, an_unknown_item_is_named_with_a_suggestion)
{
    vp_generate g;
    vp_error err;
    cr_assert_eq(vp_generate_parse("prmpt=16,new=8", &g, &err), VP_EARG);
    cr_expect(strstr(err.msg, "'prmpt=16'") != NULL, "%s", err.msg);
    cr_expect(strstr(err.msg, "did you mean 'prompt'") != NULL, "%s",
              err.msg);
}

Test(generate_spec, bad_values_are_errors_naming_the_item)
{
    static const char *const bad[] = {
        "prompt=16",          "new=8",          "prompt=0,new=8",
        "prompt=16,new=0",    "prompt=x,new=8", "prompt=16,new=8,",
        "prompt=16,new=8,sample=1", "prompt=16,new",
        "prompt=16,new=8,top-p=1.5", "prompt=16,new=8,min-new=9",
        "prompt=16,new=8,top-k=5", "prompt=-1,new=8",
        "prompt=99999999999999999999999,new=8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        vp_generate g;
        vp_error err;
        vp_status st = vp_generate_parse(bad[i], &g, &err);
        cr_expect(st == VP_EARG || st == VP_ERANGE, "%s: status %d", bad[i],
                  st);
        cr_expect(err.msg[0] != '\0', "%s: no message", bad[i]);
    }
}

/* ---- the cache ------------------------------------------------------------------ */

/* DynamicCache: prompt + new - 1 tokens in every layer's K and V. */
Test(generate_cache, dynamic_cache_holds_prompt_plus_new_minus_one)
{
    vp_setup s;
    gen_setup(&s, 4, "prompt=100,new=10");
    vp_estimate e = simulate(LLAMA, &s);
    cr_expect_eq(e.gen.kv_cache_bytes, 2 * 2 * KV_TOKEN(4) * 109);
}

/* StaticCache: max_cache_len = prompt + new - 1 tokens, allocated at the
 * first update, the same bytes as the dynamic cache's end. */
Test(generate_cache, static_cache_is_allocated_at_its_full_length)
{
    vp_setup s;
    gen_setup(&s, 4, "prompt=100,new=10");
    s.generate.cache = VP_CACHE_STATIC;
    vp_estimate e = simulate(LLAMA, &s);
    cr_expect_eq(e.gen.kv_cache_bytes, 2 * 2 * KV_TOKEN(4) * 109);
    /* the whole cache is live at the prefill's peak, in 512-B blocks
     * (27904 B a tensor) */
    cr_expect_eq(e.gen.peak_token, 1);
    cr_expect_eq(e.gen.kv_at_peak, 2 * 2 * 28160);
}

/* A sliding-window layer (Mistral, window 4096) keeps window - 1 tokens
 * after each update once the prompt is longer. */
Test(generate_cache, sliding_window_caps_the_cache)
{
    vp_setup s;
    gen_setup(&s, 1, "prompt=5000,new=4");
    vp_estimate e = simulate(MISTRAL, &s);
    mg r = open_model(MISTRAL, 1, 5000);
    vp_kv_layout kv;
    vp_error err;
    cr_assert_eq(vp_kv_layout_from_graph(r.g, &kv, &err), VP_OK, "%s",
                 err.msg);
    uint64_t per_token = 0;
    for (uint32_t l = 0; l < kv.n_layers; l++)
        per_token += (uint64_t)kv.layer[l].kv_heads *
                     (kv.layer[l].key_dim + kv.layer[l].value_dim) * 2;
    vp_kv_layout_destroy(&kv);
    close_model(&r);
    /* the last update appends 1 token to the window - 1 kept */
    cr_expect_eq(e.gen.kv_cache_bytes, per_token * 4096);
}

typedef struct {
    uint64_t per_token; /* one layer's K or V, all sequences */
    uint64_t lo, hi;    /* token counts looked for           */
    uint32_t count[64]; /* allocations of (lo + i) tokens    */
} kv_sizes;

static void count_kv(const vp_sim_event *ev, void *ud)
{
    kv_sizes *k = ud;
    if (ev->is_free || ev->step != 1 || ev->bytes % k->per_token)
        return;
    uint64_t n = ev->bytes / k->per_token;
    if (n >= k->lo && n <= k->hi)
        k->count[n - k->lo]++;
}

/* DynamicLayer.update: torch.cat makes a new K and a new V one token
 * longer in every layer at every decode step (2 layers x 2 each). The
 * prefill's 100-token tensors are left out: the rotary cos and sin of
 * B x 100 x 16 fp32 have their size. */
Test(generate_cache, dynamic_cache_grows_by_cat_every_step)
{
    vp_setup s;
    vp_estimate e;
    vp_error err;
    kv_sizes k = {.per_token = KV_TOKEN(4), .lo = 101, .hi = 109};
    gen_setup(&s, 4, "prompt=100,new=10");
    cr_assert_eq(run(LLAMA, &s, &e, count_kv, &k, &err), VP_OK, "%s",
                 err.msg);
    for (uint64_t n = k.lo; n <= k.hi; n++)
        cr_expect_eq(k.count[n - k.lo], 4, "%llu tokens: %u allocations",
                     (unsigned long long)n, k.count[n - k.lo]);
}

/* The static cache is allocated once per layer (K and V) per call. */
Test(generate_cache, static_cache_allocates_once)
{
    vp_setup s;
    vp_estimate e;
    vp_error err;
    kv_sizes k = {.per_token = KV_TOKEN(4), .lo = 101, .hi = 109};
    gen_setup(&s, 4, "prompt=100,new=10");
    s.generate.cache = VP_CACHE_STATIC;
    cr_assert_eq(run(LLAMA, &s, &e, count_kv, &k, &err), VP_OK, "%s",
                 err.msg);
    for (uint64_t n = k.lo; n < k.hi; n++)
        cr_expect_eq(k.count[n - k.lo], 0, "%llu tokens",
                     (unsigned long long)n);
    cr_expect_eq(k.count[k.hi - k.lo], 4);
}

/* ---- a call ---------------------------------------------------------------------- */

/* generate() returns the cache with its output, and the caller drops
 * both: every call ends where it started, at the weights (and the
 * inputs are gone too). */
Test(generate_call, a_call_ends_at_the_weights)
{
    vp_setup s;
    gen_setup(&s, 4, "prompt=100,new=10");
    vp_estimate e = simulate(LLAMA, &s);
    cr_expect_eq(e.steps, 2);
    for (uint32_t c = 0; c < e.steps; c++)
        cr_expect_eq(e.step[c].end, e.gen.weights, "call %u", c + 1);
    cr_expect_eq(e.gen.weights, e.after_model);
}

Test(generate_call, the_peak_is_the_larger_of_prefill_and_decode)
{
    vp_setup s;
    gen_setup(&s, 4, "prompt=100,new=10");
    vp_estimate e = simulate(LLAMA, &s);
    uint64_t pk = e.gen.prefill_peak > e.gen.decode_peak
                      ? e.gen.prefill_peak
                      : e.gen.decode_peak;
    cr_expect_eq(e.peak_alloc, pk);
    cr_expect_eq(e.step[0].peak[VP_PHASE_FORWARD], pk);
    cr_expect(e.gen.peak_token >= 1 && e.gen.peak_token <= 10);
}

/* Greedy decoding's fp32 logits and scores of B x V; sampling adds top-k's
 * mask and output, the softmax's probs and multinomial's draw: more at
 * every step. */
Test(generate_call, sampling_holds_more_than_greedy)
{
    vp_setup g, smp;
    gen_setup(&g, 64, "prompt=8,new=4");
    gen_setup(&smp, 64, "prompt=8,new=4,sample");
    vp_estimate eg = simulate(LLAMA, &g), es = simulate(LLAMA, &smp);
    cr_expect_gt(es.gen.decode_peak, eg.gen.decode_peak);
    cr_expect_eq(es.gen.kv_cache_bytes, eg.gen.kv_cache_bytes);
}

Test(generate_call, calls_repeat_the_same_peak)
{
    vp_setup s;
    gen_setup(&s, 4, "prompt=100,new=10");
    s.steps = 3;
    vp_estimate e = simulate(LLAMA, &s);
    cr_expect_eq(e.step[1].peak[VP_PHASE_FORWARD],
                 e.step[2].peak[VP_PHASE_FORWARD]);
}

/* ---- what generate() refuses ------------------------------------------------------ */

Test(generate_errors, an_encoder_has_no_generate)
{
    vp_setup s;
    vp_estimate e;
    vp_error err;
    gen_setup(&s, 2, "prompt=16,new=4");
    cr_expect_eq(run("tests/data/good/hf-bert.json", &s, &e, NULL, NULL,
                     &err), VP_EUNSUPPORTED);
    cr_expect(strstr(err.msg, "causal language-model head") != NULL, "%s",
              err.msg);
}

/* tf-small has 128 learned positions: 100 + 29 tokens do not fit. */
Test(generate_errors, learned_positions_bound_the_length)
{
    vp_setup s;
    vp_estimate e;
    vp_error err;
    gen_setup(&s, 1, "prompt=100,new=30");
    cr_expect_eq(run("tests/data/good/tf-small.yaml", &s, &e, NULL, NULL,
                     &err), VP_ERANGE);
    gen_setup(&s, 1, "prompt=100,new=29");
    cr_expect_eq(run("tests/data/good/tf-small.yaml", &s, &e, NULL, NULL,
                     &err), VP_OK, "%s", err.msg);
}

Test(generate_errors, a_budget_too_small_is_eoom)
{
    vp_setup s;
    vp_estimate e;
    vp_error err;
    gen_setup(&s, 4, "prompt=100,new=10");
    s.alloc.limit = (uint64_t)1 << 20;
    cr_expect_eq(run(LLAMA, &s, &e, NULL, NULL, &err), VP_EOOM);
}

/* ---- a generate case of a ground-truth file ------------------------------------- */

static vp_status gen_line(const char *json, vp_case_result *r, vp_error *err)
{
    static const char *const dirs[] = {"models"};
    vp_validate_opts o = {"test", 2, dirs, 1, false, NULL, NULL, false, 0, 0.0};
    return vp_validate_line(json, strlen(json), &o, r, err);
}

#define CASE_HEAD                                                            \
    "{\"id\": \"g\", \"model\": \"tiny\", \"batch\": 4, \"hf_config\": "     \
    "\"tests/data/good/hf-llama.json\", \"prec\": \"bf16\", \"infer\": true, "
#define RUNS                                                                 \
    "\"runs\": [{\"start\": 10, \"peak\": 1000, \"end\": 10}, "               \
    "{\"start\": 10, \"peak\": 900, \"end\": 10}]"

/* The cache's bytes are compared with kv_cache_bytes, each call's peak
 * with its run's. */
Test(generate_case, a_case_yields_the_cache_and_each_calls_peak)
{
    vp_case_result r;
    vp_error err;
    const char *json = CASE_HEAD "\"generate\": {\"prompt\": 100, "
                       "\"new_tokens\": 10}, \"cache\": \"static\", " RUNS
                       ", \"kv_cache_bytes\": 111616, \"peak_alloc\": 1000}";
    cr_assert_eq(gen_line(json, &r, &err), VP_OK, "%s", err.msg);
    cr_assert_eq(r.kind, VP_GT_GENERATE);
    bool kv = false, run2 = false;
    for (size_t i = 0; i < r.n_metrics; i++) {
        const vp_metric *m = &r.metrics[i];
        if (!strcmp(m->name, "kv_cache_bytes")) {
            kv = true;
            cr_expect_eq(m->predicted, 2 * 2 * KV_TOKEN(4) * 109);
            cr_expect_eq(m->measured, 111616);
        }
        if (!strcmp(m->name, "run2.peak")) {
            run2 = true;
            cr_expect_eq(m->measured, 900);
        }
    }
    cr_expect(kv && run2);
}

Test(generate_case, an_unknown_field_of_generate_is_named)
{
    vp_case_result r;
    vp_error err;
    const char *json = CASE_HEAD "\"generate\": {\"prompt\": 100, "
                       "\"new_tokens\": 10, \"beams\": 4}}";
    cr_assert_eq(gen_line(json, &r, &err), VP_ESCHEMA);
    cr_expect(strstr(err.msg, "'beams'") != NULL, "%s", err.msg);
}

Test(generate_case, peak_alloc_must_be_the_largest_run_peak)
{
    vp_case_result r;
    vp_error err;
    const char *json = CASE_HEAD "\"generate\": {\"prompt\": 100, "
                       "\"new_tokens\": 10}, " RUNS ", \"peak_alloc\": 900}";
    cr_assert_eq(gen_line(json, &r, &err), VP_ERANGE);
    cr_expect(strstr(err.msg, "largest run peak") != NULL, "%s", err.msg);
}

Test(generate_case, generate_runs_under_no_grad)
{
    vp_case_result r;
    vp_error err;
    const char *json = "{\"id\": \"g\", \"model\": \"tiny\", \"batch\": 4, "
                       "\"hf_config\": \"tests/data/good/hf-llama.json\", "
                       "\"infer\": false, \"generate\": {\"prompt\": 100, "
                       "\"new_tokens\": 10}}";
    cr_assert_eq(gen_line(json, &r, &err), VP_ERANGE);
    cr_expect(strstr(err.msg, "'infer' must be true") != NULL, "%s",
              err.msg);
}

typedef struct {
    uint64_t bytes;
    uint32_t step1, n;
} size_count;

static void count_size(const vp_sim_event *ev, void *ud)
{
    size_count *c = ud;
    if (!ev->is_free && ev->step == 1 && ev->bytes == c->bytes)
        c->n++;
}

/* _ignore_causal_mask_sdpa keeps is_causal only while the key length is
 * below the sliding window: over it, the prefill materializes Mistral's
 * sliding-window mask [B, 1, P, P] (bool), once for all layers (B = 2:
 * the grids it is made from are P x P). */
Test(generate_cache, a_prompt_over_the_window_materializes_the_mask)
{
    vp_setup s;
    vp_estimate e;
    vp_error err;
    size_count c = {.bytes = 2 * 5000ull * 5000};
    gen_setup(&s, 2, "prompt=5000,new=2");
    cr_assert_eq(run(MISTRAL, &s, &e, count_size, &c, &err), VP_OK, "%s",
                 err.msg);
    cr_expect_eq(c.n, 1, "%u", c.n);
    size_count d = {.bytes = 2 * 4000ull * 4000};
    gen_setup(&s, 2, "prompt=4000,new=2");
    cr_assert_eq(run(MISTRAL, &s, &e, count_size, &d, &err), VP_OK, "%s",
                 err.msg);
    cr_expect_eq(d.n, 0);
}

/* Every decode step is simulated: a length whose steps would take hours
 * is refused at once (VP_ELIMIT), not run. */
Test(generate_errors, an_endless_generation_is_refused, .timeout = 10)
{
    vp_setup s;
    vp_estimate e;
    vp_error err;
    gen_setup(&s, 1, "prompt=16,new=1099511627776");
    cr_expect_eq(run(LLAMA, &s, &e, NULL, NULL, &err), VP_ELIMIT);
    cr_expect(strstr(err.msg, "op forwards") != NULL, "%s", err.msg);
}

/* "load" is the training cases' field (validate_ft.c's choices); only
 * weights made in their dtype are modelled with generate() */
Test(generate_case, a_load_other_than_dtype_is_refused_by_name)
{
    vp_case_result r;
    vp_error err;
    const char *json = CASE_HEAD "\"generate\": {\"prompt\": 100, "
                       "\"new_tokens\": 10}, \"load\": \"meta\"}";
    cr_assert_eq(gen_line(json, &r, &err), VP_EUNSUPPORTED, "%s", err.msg);
    cr_expect(strstr(err.msg, "\"meta\"") != NULL, "%s", err.msg);
}

Test(generate_case, a_missing_hf_config_is_named_at_its_field)
{
    vp_case_result r;
    vp_error err;
    const char *json = "{\"id\": \"g\", \"model\": \"tiny\", \"batch\": 4, "
                       "\"generate\": {\"prompt\": 100, \"new_tokens\": 10},"
                       " \"hf_config\": \"no-such-config.json\"}";
    cr_assert_eq(gen_line(json, &r, &err), VP_EIO);
    cr_expect(strstr(err.msg, "'no-such-config.json' not found") != NULL,
              "%s", err.msg);
    cr_expect_eq(err.col, (int)(strstr(json, "\"no-such") - json) + 1);
}

/* Qwen2's use_sliding_window with max_window_layers 1: layer 0 attends to
 * every token, layers 1 and 2 slide over 64 (Qwen2Config's layer_types
 * rule), in the graph's cache layout as in the config's. */
Test(generate_cache, qwen2s_max_window_layers_picks_the_sliding_layers)
{
    const char *path = "tests/data/good/hf-qwen2-sliding.json";
    mg r = open_model(path, 1, 16);
    vp_kv_layout g, h;
    vp_error err;
    cr_assert_eq(vp_kv_layout_from_graph(r.g, &g, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(vp_kv_layout_from_hf(path, &h, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(g.n_layers, 3);
    cr_expect_eq(g.layer[0].kind, VP_KV_FULL);
    for (uint32_t l = 0; l < 3; l++) {
        cr_expect_eq(g.layer[l].kind, h.layer[l].kind, "layer %u", l);
        cr_expect_eq(g.layer[l].window, h.layer[l].window, "layer %u", l);
        cr_expect_eq(g.layer[l].window, l ? 64 : 0, "layer %u", l);
    }
    vp_kv_layout_destroy(&g);
    vp_kv_layout_destroy(&h);
    close_model(&r);
}

/* StaticSlidingWindowLayer: a prefill longer than the window attends
 * over all its keys, so its mask is [B, 1, P, P] as the dynamic cache's
 * (measured: mistral-2b b2 p6144 static, groundtruth/
 * h200-torch2.11-generate-window.jsonl), while the cache keeps W. */
Test(generate_cache, a_static_sliding_prefill_attends_over_the_prompt)
{
    vp_setup s;
    vp_estimate e;
    vp_error err;
    size_count c = {.bytes = 2 * 5000ull * 5000};
    gen_setup(&s, 2, "prompt=5000,new=2");
    s.generate.cache = VP_CACHE_STATIC;
    cr_assert_eq(run(MISTRAL, &s, &e, count_size, &c, &err), VP_OK, "%s",
                 err.msg);
    cr_expect_eq(c.n, 1, "%u", c.n);
    /* 3 layers x (K + V) x 1 head x 8 dims x 2 B x 2 sequences x W */
    cr_expect_eq(e.gen.kv_cache_bytes, 3ull * 2 * 8 * 2 * 2 * 4096);
}

/* ---- multi-head latent attention (DeepSeek-V3) ---------------------------------- */

/* tests/data/good/hf-deepseek-v3.json: 2 layers, 4 heads, kv_lora_rank
 * 32, qk_rope_head_dim 8, qk_nope_head_dim 16, v_head_dim 16. */
#define DEEPSEEK "tests/data/good/hf-deepseek-v3.json"

/* transformers 5.17 DeepseekV3Attention caches the normed latent (32) as
 * the layer's keys and the roped rotary key (8) as its values, one head
 * each: 40 elements a token and layer, not the heads' k and v. */
Test(generate_mla, the_cache_holds_the_latent_and_the_rotary_key)
{
    vp_setup s;
    gen_setup(&s, 4, "prompt=100,new=10");
    vp_estimate e = simulate(DEEPSEEK, &s);
    cr_expect_eq(e.gen.kv_cache_bytes, 2ull * 4 * 109 * (32 + 8) * 2);
}

typedef struct {
    const char *op;
    uint32_t step;
    uint64_t bytes[32]; /* allocations by op, in order */
    uint32_t n;
} op_allocs;

static void collect_op(const vp_sim_event *ev, void *ud)
{
    op_allocs *a = ud;
    if (!ev->is_free && ev->step == a->step && strcmp(ev->op, a->op) == 0 &&
        a->n < 32)
        a->bytes[a->n++] = ev->bytes;
}

/* The allocations op makes in the first generate() call of the DeepSeek
 * model, 4 sequences. */
static op_allocs deepseek_allocs(const char *op, const char *spec)
{
    vp_setup s;
    vp_estimate e;
    vp_error err;
    op_allocs a = {.op = op, .step = 1};
    gen_setup(&s, 4, spec);
    cr_assert_eq(run(DEEPSEEK, &s, &e, collect_op, &a, &err), VP_OK, "%s",
                 err.msg);
    return a;
}

/* expand_kv runs kv_b_proj over every cached token: its output is
 * [B, keys, heads x (nope + v)] in each forward, 100 keys in the prefill,
 * then 101 to 109 in the decode steps. */
Test(generate_mla, kv_b_proj_expands_every_cached_token)
{
    op_allocs a = deepseek_allocs("layers.1.attn.kv_b_proj",
                                  "prompt=100,new=10");
    cr_assert_eq(a.n, 10);
    for (uint32_t t = 0; t < a.n; t++)
        cr_expect_eq(a.bytes[t], 4ull * (100 + t) * 4 * (16 + 16) * 2,
                     "forward %u: %llu bytes", t,
                     (unsigned long long)a.bytes[t]);
}

/* ---- Gemma 2: soft-capping, alternating sliding layers, eager --------------------- */

/* tests/data/good/hf-gemma2.json: 4 layers (sliding, full, sliding,
 * full; window 64), 4 heads of 16 dims, 2 KV heads, vocabulary 1000,
 * final_logit_softcapping 30, attn_logit_softcapping 50. */
#define GEMMA2 "tests/data/good/hf-gemma2.json"

typedef struct {
    uint64_t bytes;   /* allocations of this size ...                  */
    uint32_t n;       /* ... counted                                    */
    uint64_t largest; /* the largest allocation of logit_softcap        */
} g2_sizes;

static void g2_count(const vp_sim_event *ev, void *ud)
{
    g2_sizes *c = ud;
    if (ev->is_free || ev->step != 1)
        return;
    if (ev->bytes == c->bytes)
        c->n++;
    if (strcmp(ev->op, "logit_softcap") == 0 && ev->bytes > c->largest)
        c->largest = ev->bytes;
}

static vp_status gemma2_run(uint64_t batch, const char *spec, vp_estimate *e,
                            vp_sim_event_fn cb, void *ud, vp_error *err)
{
    vp_setup s;
    gen_setup(&s, batch, spec);
    s.attn = VP_ATTN_EAGER;
    s.attn_set = true;
    return run(GEMMA2, &s, e, cb, ud, err);
}

/* Gemma2ForCausalLM soft-caps the logits it makes: with
 * logits_to_keep = 1 those of the last position, B x 1 x V (the division
 * and tanh in bf16: 2 x 1000 x 2 B), never B x P x V. */
Test(generate_gemma2, the_capped_head_makes_the_last_positions_logits_only)
{
    vp_estimate e;
    vp_error err;
    g2_sizes c = {0};
    cr_assert_eq(gemma2_run(2, "prompt=100,new=4", &e, g2_count, &c, &err),
                 VP_OK, "%s", err.msg);
    cr_expect_eq(c.largest, 2 * 1000 * 2, "%llu",
                 (unsigned long long)c.largest);
}

/* Eager attention takes create_causal_mask's and
 * create_sliding_window_causal_mask's masks, both as float masks of the
 * model's dtype [B, 1, P, P]: two of 2 x 100 x 100 x 2 B in the prefill. */
Test(generate_gemma2, eager_makes_the_full_and_the_sliding_float_mask)
{
    vp_estimate e;
    vp_error err;
    g2_sizes c = {.bytes = 2 * 100 * 100 * 2};
    cr_assert_eq(gemma2_run(2, "prompt=100,new=1", &e, g2_count, &c, &err),
                 VP_OK, "%s", err.msg);
    cr_expect_eq(c.n, 2, "%u", c.n);
}

typedef struct {
    uint64_t tensor;  /* the attention weights of layers.0's prefill     */
    bool freed_in_attn, freed;
} g2_weights;

/* The weights are the last B x H x P x P bf16 tensor the core makes. */
static void g2_weights_ev(const vp_sim_event *ev, void *ud)
{
    g2_weights *w = ud;
    if (ev->step != 1)
        return;
    if (!ev->is_free && !w->freed &&
        strcmp(ev->op, "layers.0.attn.core") == 0 &&
        ev->bytes == 2ull * 4 * 100 * 100 * 2)
        w->tensor = ev->tensor;
    if (ev->is_free && ev->tensor == w->tensor && !w->freed) {
        w->freed = true;
        w->freed_in_attn = strncmp(ev->op, "layers.0.attn.", 14) == 0;
    }
}

/* `hidden_states, _ = self.self_attn(...)`: without autograd the
 * attention's returned weights live until the decoder layer returns, past
 * the attention (traced on gemma2-2b generate()). */
Test(generate_gemma2, eager_weights_live_until_the_layer_returns)
{
    vp_estimate e;
    vp_error err;
    g2_weights w = {0};
    cr_assert_eq(gemma2_run(2, "prompt=100,new=1", &e, g2_weights_ev, &w,
                            &err), VP_OK, "%s", err.msg);
    cr_assert(w.freed);
    cr_expect_not(w.freed_in_attn);
}

/* DeepseekV3TopkRouter: F.linear(x.float(), W.float()) without autograd,
 * so the router's logits are fp32 (400 tokens x 8 experts x 4 B), and the
 * experts' rows times those fp32 weights are fp32 too (800 rows x 64 x
 * 4 B, the product and its reordering; traced on deepseek-v3-small). */
Test(generate_mla, the_deepseek_router_and_the_weighting_run_in_fp32)
{
    op_allocs gate = deepseek_allocs("layers.1.mlp.gate", "prompt=100,new=1");
    /* the input's and the weight's fp32 copies, then the logits */
    cr_assert_eq(gate.n, 3);
    cr_expect_eq(gate.bytes[0], 400ull * 64 * 4);
    cr_expect_eq(gate.bytes[1], 8ull * 64 * 4);
    cr_expect_eq(gate.bytes[2], 400ull * 8 * 4);
    op_allocs ex = deepseek_allocs("layers.1.mlp.experts", "prompt=100,new=1");
    uint32_t fp32_rows = 0;
    for (uint32_t k = 0; k < ex.n; k++)
        fp32_rows += ex.bytes[k] == 800ull * 64 * 4;
    cr_expect_eq(fp32_rows, 2, "%u", fp32_rows);
}
