/* Tests of the KV-cache layout (kvcache.h) and of vLLM server sizing
 * (serve.h): bytes per token for MHA, GQA, MQA, MLA and sliding windows,
 * the generate() runs measured on an H200, and vLLM's KV blocks for
 * llama-3-8b on an H100 80GB worked by hand (docs/SERVING.md §1-2). */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli_golden.h"
#include "vramplan/vramplan.h"

/* ---- helpers ------------------------------------------------------------ */

static void kv_from_model(const char *path, vp_kv_layout *kv)
{
    vp_error err;
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s: %s", path, err.msg);
    vp_graph *g = vp_graph_build(m, 1, 1, &err);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert_eq(vp_kv_layout_from_graph(g, kv, &err), VP_OK, "%s", err.msg);
    vp_graph_free(g);
    vp_model_free(m);
}

static void kv_from_hf(const char *path, vp_kv_layout *kv)
{
    vp_error err;
    cr_assert_eq(vp_kv_layout_from_hf(path, kv, &err), VP_OK, "%s: %s",
                 path, err.msg);
}

static uint64_t per_token(const vp_kv_layout *kv, uint32_t elem, uint32_t tp)
{
    vp_error err;
    uint64_t b;
    cr_assert_eq(vp_kv_token_bytes(kv, elem, tp, &b, &err), VP_OK, "%s",
                 err.msg);
    return b;
}

static vp_status hf_buf(const char *json, vp_kv_layout *kv, vp_error *err)
{
    return vp_kv_layout_from_hf_buf(json, strlen(json), "t.json", kv, err);
}

/* ---- bytes per token ------------------------------------------------------ */

/* GPT-2 medium, multi-head: 24 layers x (K + V) x 16 heads x 64 x 2 B */
Test(kvcache, mha_per_token)
{
    vp_kv_layout kv;
    kv_from_model("models/gpt2-medium.yaml", &kv);
    cr_assert_eq(kv.n_layers, 24);
    cr_assert_eq(per_token(&kv, 2, 1), 24ull * 2 * 16 * 64 * 2);
    vp_kv_layout_destroy(&kv);
}

/* Llama 3 8B, grouped-query: 32 layers x 2 x 8 KV heads x 128 x 2 B */
Test(kvcache, gqa_per_token)
{
    vp_kv_layout kv;
    kv_from_model("models/llama-3-8b.yaml", &kv);
    cr_assert_eq(per_token(&kv, 2, 1), 32ull * 2 * 8 * 128 * 2);
    cr_assert_eq(per_token(&kv, 1, 1), 32ull * 2 * 8 * 128); /* fp8 */
    cr_assert_eq(per_token(&kv, 2, 2), 32ull * 2 * 4 * 128 * 2);
    vp_kv_layout_destroy(&kv);
}

/* Multi-query (Falcon's multi_query flag): one K/V head, replicated on
 * every tensor-parallel rank. */
Test(kvcache, mqa_per_token)
{
    vp_kv_layout kv;
    vp_error err;
    cr_assert_eq(hf_buf("{\"n_layer\": 4, \"n_head\": 8, \"hidden_size\": "
                        "512, \"multi_query\": true}",
                        &kv, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_eq(kv.layer[0].kv_heads, 1);
    cr_assert_eq(per_token(&kv, 2, 1), 4ull * 2 * 1 * 64 * 2);
    cr_assert_eq(per_token(&kv, 2, 4), 4ull * 2 * 1 * 64 * 2);
    vp_kv_layout_destroy(&kv);
}

/* DeepSeek-V3 MLA: one latent of kv_lora_rank 128 + rope key 32 a layer */
Test(kvcache, mla_per_token)
{
    vp_kv_layout kv;
    kv_from_hf("groundtruth/hf_configs/deepseek-v3-small.json", &kv);
    cr_assert_eq(kv.layer[0].kind, VP_KV_MLA);
    cr_assert_eq(per_token(&kv, 2, 1), 4ull * (128 + 32) * 2);
    cr_assert_eq(per_token(&kv, 2, 8), 4ull * (128 + 32) * 2); /* replicated */
    vp_kv_layout_destroy(&kv);
}

/* Mistral's sliding_window applies to every layer: a sequence longer than
 * the window keeps 4096 tokens a layer. */
Test(kvcache, sliding_window_caps_sequence)
{
    vp_kv_layout kv;
    vp_error err;
    uint64_t b;
    kv_from_hf("groundtruth/hf_configs/mistral-2b.json", &kv);
    cr_assert_eq(kv.layer[15].kind, VP_KV_SLIDING);
    cr_assert_eq(kv.layer[15].window, 4096);
    uint64_t tok = 2ull * 8 * 128 * 2; /* one layer, one token */
    cr_assert_eq(vp_kv_seq_bytes(&kv, 2, 1, 1000, &b, &err), VP_OK);
    cr_assert_eq(b, 16 * 1000 * tok);
    cr_assert_eq(vp_kv_seq_bytes(&kv, 2, 1, 10000, &b, &err), VP_OK);
    cr_assert_eq(b, 16 * 4096 * tok);
    vp_kv_layout_destroy(&kv);
}

/* Gemma 2's layer_types alternate sliding (window 4096) and full layers */
Test(kvcache, layer_types_mix)
{
    vp_kv_layout kv;
    vp_error err;
    uint64_t b;
    kv_from_hf("groundtruth/hf_configs/gemma2-2b.json", &kv);
    cr_assert_eq(kv.layer[0].kind, VP_KV_SLIDING);
    cr_assert_eq(kv.layer[1].kind, VP_KV_FULL);
    uint64_t tok = 2ull * 4 * 256 * 2;
    cr_assert_eq(vp_kv_seq_bytes(&kv, 2, 1, 8192, &b, &err), VP_OK);
    cr_assert_eq(b, 13 * 8192 * tok + 13 * 4096 * tok);
    vp_kv_layout_destroy(&kv);
}

/* Qwen2: use_sliding_window false keeps every layer full, sliding_window 0
 * means none */
Test(kvcache, qwen_sliding_off)
{
    vp_kv_layout kv;
    kv_from_hf("groundtruth/hf_configs/qwen2-moe-small.json", &kv);
    for (uint32_t i = 0; i < kv.n_layers; i++)
        cr_assert_eq(kv.layer[i].kind, VP_KV_FULL);
    vp_kv_layout_destroy(&kv);
}

Test(kvcache, heads_per_rank)
{
    vp_error err;
    uint32_t r;
    cr_assert_eq(vp_kv_heads_per_rank(8, 2, &r, &err), VP_OK);
    cr_assert_eq(r, 4);
    cr_assert_eq(vp_kv_heads_per_rank(8, 16, &r, &err), VP_OK);
    cr_assert_eq(r, 1); /* replicated */
    cr_assert_eq(vp_kv_heads_per_rank(8, 3, &r, &err), VP_EARG);
    cr_assert_eq(vp_kv_heads_per_rank(3, 4, &r, &err), VP_EARG);
}

/* ---- config errors --------------------------------------------------------- */

Test(kvcache, hf_missing_layers)
{
    vp_kv_layout kv;
    vp_error err;
    cr_assert_eq(hf_buf("{\"num_attention_heads\": 8}", &kv, &err),
                 VP_ESCHEMA);
    cr_assert(strstr(err.msg, "num_hidden_layers"), "%s", err.msg);
}

Test(kvcache, hf_mistyped_key_has_position)
{
    vp_kv_layout kv;
    vp_error err;
    cr_assert_eq(hf_buf("{\n  \"num_hidden_layers\": 2,\n"
                        "  \"num_attention_heads\": \"8\"\n}",
                        &kv, &err),
                 VP_ESCHEMA);
    cr_assert_eq(err.line, 3);
    cr_assert_eq(err.col, 3);
    cr_assert_str_eq(err.msg, "'num_attention_heads' must be an integer");
}

Test(kvcache, hf_unknown_layer_type)
{
    vp_kv_layout kv;
    vp_error err;
    cr_assert_eq(hf_buf("{\"num_hidden_layers\": 2, \"num_attention_heads\":"
                        " 2, \"head_dim\": 8, \"sliding_window\": 16, "
                        "\"layer_types\": [\"full_attention\", "
                        "\"linear_attention\"]}",
                        &kv, &err),
                 VP_ESCHEMA);
    cr_assert(strstr(err.msg, "layer type"), "%s", err.msg);
}

Test(kvcache, hf_malformed_json)
{
    vp_kv_layout kv;
    vp_error err;
    cr_assert_eq(hf_buf("{\"num_hidden_layers\": 2,\n  oops}", &kv, &err),
                 VP_ESYNTAX);
    cr_assert_eq(err.line, 2);
}

Test(kvcache, encoder_has_no_cache)
{
    vp_error err;
    vp_kv_layout kv;
    vp_model *m = vp_model_load("models/bert-base.yaml", &err);
    vp_graph *g = vp_graph_build(m, 1, 8, &err);
    cr_assert_eq(vp_kv_layout_from_graph(g, &kv, &err), VP_EUNSUPPORTED);
    vp_graph_free(g);
    vp_model_free(m);
}

/* ---- the generate() runs measured on the H200 ------------------------------ */

/* transformers' generate() feeds the prompt and every new token but the
 * last through the model, so the returned cache (dynamic or static, whose
 * max_cache_len is the same) holds prompt + new_tokens - 1 positions for
 * each sequence (left padding included): kv_cache_bytes must equal
 * batch x (prompt + new - 1) x bytes per token, exactly, for all 13 runs
 * (MHA, GQA, MLA, sliding windows that the runs do not reach). */
Test(kvcache, generate_groundtruth_exact)
{
    const char *path = "groundtruth/h200-torch2.11-generate.jsonl";
    FILE *f = fopen(path, "r");
    char line[8192], cfg[256];
    int runs = 0;

    cr_assert_not_null(f, "%s", path);
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        cr_assert_not_null(o, "%s: %s", path, je.text);
        const char *model = json_string_value(json_object_get(o, "model"));
        if (!model) { /* the environment line */
            json_decref(o);
            continue;
        }
        json_t *gen = json_object_get(o, "generate");
        uint64_t batch = json_integer_value(json_object_get(o, "batch"));
        uint64_t tokens =
            json_integer_value(json_object_get(gen, "prompt")) +
            json_integer_value(json_object_get(gen, "new_tokens")) - 1;
        uint64_t want =
            json_integer_value(json_object_get(o, "kv_cache_bytes"));
        vp_kv_layout kv;
        vp_error err;
        uint64_t seq;
        snprintf(cfg, sizeof cfg, "groundtruth/hf_configs/%s.json", model);
        kv_from_hf(cfg, &kv);
        cr_assert_eq(vp_kv_seq_bytes(&kv, 2, 1, tokens, &seq, &err), VP_OK);
        cr_assert_eq(batch * seq, want, "%s: %llu, measured %llu",
                     json_string_value(json_object_get(o, "id")),
                     (unsigned long long)(batch * seq),
                     (unsigned long long)want);
        vp_kv_layout_destroy(&kv);
        json_decref(o);
        runs++;
    }
    fclose(f);
    cr_assert_eq(runs, 13);
}

/* ---- vLLM: llama-3-8b on an H100 80GB, worked by hand ---------------------- */

/* The hand computation (docs/SERVING.md §1 cites the vLLM lines):
 *
 * total       = 85899345920 B (gpus/h100-80g.yaml: 80 GiB, no measured
 *               cudaMemGetInfo total)
 * requested   = total x 0.9 = 77309411328     (gpu_worker.py init_device)
 * weights, TP1: 8030261248 parameters x 2 B = 16060522496, + rotary
 *               cos_sin_cache 8192 x 128 x 2 = 2097152 -> 16062619648
 *        TP2: embedding and LM head 128256/2 x 4096 each, per layer
 *               q 4096x2048, k, v 4096x512, o 2048x4096, gate, up
 *               4096x7168, down 7168x4096, norms 2x4096; final norm 4096:
 *               4015263744 x 2 B + 2097152 -> 8032624640
 * activation  = the sampler's peak (default max_num_seqs 1024 rows over
 *               the 128256-word vocabulary, n x V = 131334144): held
 *               forward output 8192x4096 and gathered rows 1024x4096 in
 *               bf16, random rows 1024x4096 bf16, logits bf16 (2 nV),
 *               their fp32 copy (4 nV), greedy ids, sort values (4 nV) and
 *               indices (8 nV), reverse indices (8 nV), CUB's alternate
 *               keys and values (12 nV):
 *               67108864 + 8388608 + 8388608 + 262668288 + 525336576
 *               + 8192 + 525336576 + 1050673152 + 1050673152
 *               + 1576009728 = 5074591744   (the same at TP2: the
 *               logits are gathered to every rank)
 * available   = requested - weights - activation - non-torch (0)
 *               (gpu_worker.py determine_available_memory)
 * page        = 16 x kv_heads x (128 + 128) x dtype bytes
 *               (kv_cache_interface.py FullAttentionSpec)
 * num_blocks  = available // page // 32       (kv_cache_utils.py
 *               get_num_blocks)
 *
 *   TP1 bf16: (77309411328 - 16062619648 - 5074591744) // 65536 // 32
 *             = 56172199936 // 65536 // 32 = 26784
 *   TP1 fp8:  56172199936 // 32768 // 32 = 53569
 *   TP2 bf16: (77309411328 - 8032624640 - 5074591744) // 32768 // 32
 *             = 64202194944 // 32768 // 32 = 61227
 *   TP2 fp8:  64202194944 // 16384 // 32 = 122455
 *
 * vramplan's activation peak comes from the allocator model (block
 * rounding and unsplit segment tails: a few MiB more), so the blocks agree
 * within a few per ten thousand; the issue asks for 2 %. */
static void llama_h100(uint32_t tp, uint32_t kv_bytes, uint64_t weights,
                       uint64_t page, uint64_t hand_blocks)
{
    vp_error err;
    vp_model *m = vp_model_load("models/llama-3-8b.yaml", &err);
    vp_gpu_profile *gpu = vp_gpu_load("h100-80g", &err);
    vp_serve_config c;
    vp_serve_result r;

    cr_assert(m && gpu);
    vp_serve_config_init(&c);
    c.tensor_parallel = tp;
    c.kv_dtype_bytes = kv_bytes;
    cr_assert_eq(vp_serve_plan(m, NULL, gpu, &c, &r, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(r.requested_bytes, 77309411328ull);
    cr_assert_eq(r.weight_bytes, weights);
    cr_assert_eq(r.page_bytes, page);
    cr_assert_eq(r.max_num_seqs, 1024);
    cr_assert_eq(r.max_num_batched_tokens, 8192);
    cr_assert_lt(fabs((double)r.num_blocks - (double)hand_blocks),
                 0.02 * (double)hand_blocks, "%llu blocks, by hand %llu",
                 (unsigned long long)r.num_blocks,
                 (unsigned long long)hand_blocks);
    cr_assert_leq(r.num_blocks, hand_blocks); /* rounding only adds bytes */
    cr_assert_eq(r.kv_tokens, r.num_blocks * 16);
    vp_gpu_free(gpu);
    vp_model_free(m);
}

Test(serve, llama3_8b_h100_tp1_bf16)
{
    llama_h100(1, 0, 16062619648ull, 65536, 26784);
}
Test(serve, llama3_8b_h100_tp1_fp8)
{
    llama_h100(1, 1, 16062619648ull, 32768, 53569);
}
Test(serve, llama3_8b_h100_tp2_bf16)
{
    llama_h100(2, 0, 8032624640ull, 32768, 61227);
}
Test(serve, llama3_8b_h100_tp2_fp8)
{
    llama_h100(2, 1, 8032624640ull, 16384, 122455);
}

/* ---- defaults, limits, concurrency ------------------------------------------ */

static void plan(const char *model, const char *gpu_name,
                 const vp_serve_config *c, vp_serve_result *r,
                 vp_status want)
{
    vp_error err;
    vp_model *m = vp_model_load(model, &err);
    vp_gpu_profile *gpu = vp_gpu_load(gpu_name, &err);
    cr_assert(m && gpu, "%s", err.msg);
    cr_assert_eq(vp_serve_plan(m, NULL, gpu, c, r, &err), want, "%s",
                 err.msg);
    vp_gpu_free(gpu);
    vp_model_free(m);
}

/* arg_utils.py: 8192 tokens and 1024 sequences on >= 70 GiB non-A100s,
 * else 2048 and 256 */
Test(serve, defaults_by_gpu)
{
    vp_serve_config c;
    vp_serve_result r;
    vp_serve_config_init(&c);
    plan("models/llama-1b.yaml", "a100-80g", &c, &r, VP_OK);
    cr_assert_eq(r.max_num_batched_tokens, 2048);
    cr_assert_eq(r.max_num_seqs, 256);
    plan("models/llama-1b.yaml", "h100-80g-mig-3g.40gb", &c, &r, VP_OK);
    cr_assert_eq(r.max_num_batched_tokens, 2048);
    plan("models/llama-1b.yaml", "h200", &c, &r, VP_OK);
    cr_assert_eq(r.max_num_batched_tokens, 8192);
    cr_assert_eq(r.max_num_seqs, 1024);
}

/* 16 GB of weights do not fit a 10 GB slice: vLLM refuses to start */
Test(serve, weights_past_reservation)
{
    vp_serve_config c;
    vp_serve_result r;
    vp_serve_config_init(&c);
    plan("models/llama-3-8b.yaml", "h100-80g-mig-1g.10gb", &c, &r, VP_EOOM);
    cr_assert_eq(r.kv_available, 0);
}

/* fewer blocks per request: more requests at once, up to max_num_seqs */
Test(serve, concurrency_by_request_length)
{
    vp_serve_config c;
    vp_serve_result r;
    uint64_t last = 0;
    vp_serve_config_init(&c);
    for (uint64_t len = 8192; len >= 64; len /= 2) {
        c.request_tokens = len;
        plan("models/llama-3-8b.yaml", "h100-80g", &c, &r, VP_OK);
        cr_assert_eq(r.blocks_per_request, len / 16);
        cr_assert_geq(r.concurrency, last);
        cr_assert_leq(r.concurrency, r.max_num_seqs);
        last = r.concurrency;
    }
    cr_assert_eq(last, 1024); /* 64-token requests: max_num_seqs binds */
}

Test(serve, request_past_max_model_len)
{
    vp_serve_config c;
    vp_serve_result r;
    vp_serve_config_init(&c);
    c.request_tokens = 9000;
    plan("models/llama-3-8b.yaml", "h100-80g", &c, &r, VP_EARG);
}

/* eager: no graphs, and Python locals keep more alive in the forward */
Test(serve, enforce_eager)
{
    vp_serve_config c;
    vp_serve_result compiled, eager;
    vp_serve_config_init(&c);
    plan("models/llama-3-8b.yaml", "h100-80g", &c, &compiled, VP_OK);
    c.enforce_eager = true;
    plan("models/llama-3-8b.yaml", "h100-80g", &c, &eager, VP_OK);
    cr_assert_eq(eager.cudagraph_sizes, 0);
    cr_assert_eq(compiled.cudagraph_sizes, 51); /* 1, 2, 4, 8..248, 256..512 */
    cr_assert_eq(compiled.cudagraph_max_size, 512);
    cr_assert_gt(eager.forward_peak, compiled.forward_peak);
}

/* an MLA layout: one latent per layer, no factor 2 for K and V */
Test(serve, mla_page)
{
    vp_error err;
    vp_kv_layer layers[32];
    vp_kv_layout kv = {"mla", 32, 32, 8192, layers};
    vp_serve_config c;
    vp_serve_result r;
    vp_model *m = vp_model_load("models/llama-3-8b.yaml", &err);
    vp_gpu_profile *gpu = vp_gpu_load("h200", &err);

    for (int i = 0; i < 32; i++)
        layers[i] = (vp_kv_layer){VP_KV_MLA, 1, 512 + 64, 0, 0};
    vp_serve_config_init(&c);
    cr_assert_eq(vp_serve_plan(m, &kv, gpu, &c, &r, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(r.page_bytes, 16 * 576 * 2);
    cr_assert_eq(r.num_blocks, r.kv_available / r.page_bytes / 32);
    vp_gpu_free(gpu);
    vp_model_free(m);
}

/* gemma2's 13 sliding and 13 full layers: two groups of 13 share the
 * blocks; a request needs the full layers' blocks plus the window's */
Test(serve, hybrid_groups)
{
    vp_error err;
    vp_kv_layout kv;
    vp_serve_config c;
    vp_serve_result r;
    vp_model *m = vp_model_load("models/llama-3-8b.yaml", &err);
    vp_gpu_profile *gpu = vp_gpu_load("h200", &err);

    kv_from_hf("groundtruth/hf_configs/gemma2-2b.json", &kv);
    kv.heads = 32; /* heads of the llama graph that sizes the rest */
    vp_serve_config_init(&c);
    cr_assert_eq(vp_serve_plan(m, &kv, gpu, &c, &r, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(r.group_size, 13);
    cr_assert_eq(r.n_groups, 2);
    cr_assert_eq(r.num_blocks, r.kv_available / r.page_bytes / 13);
    cr_assert_eq(r.kv_tokens, r.num_blocks / 2 * 16);
    /* 8192 tokens: 512 blocks for the full group, window: 
     * cdiv(min(4095 + 8192, 8192), 16) + 1 = 513 */
    cr_assert_eq(r.blocks_per_max_request, 512 + 513);
    vp_kv_layout_destroy(&kv);
    vp_gpu_free(gpu);
    vp_model_free(m);
}

/* ---- CLI ------------------------------------------------------------------- */

Test(cli_serve, llama3_h100_table)
{
    GOLDEN("serve_llama3_h100_table", 0, "serve", "models/llama-3-8b.yaml",
           "--gpu", "h100-80g", "--prompt", "3000", "--output", "1000");
}
Test(cli_serve, llama3_h100_tp2_fp8_json)
{
    GOLDEN("serve_llama3_h100_tp2_fp8_json", 0, "serve",
           "models/llama-3-8b.yaml", "--gpu", "h100-80g",
           "--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8",
           "--format", "json");
}
Test(cli_serve, mistral_hf_sliding)
{
    GOLDEN("serve_mistral_hf_sliding", 0, "serve",
           "groundtruth/hf_configs/mistral-2b.json", "--gpu", "h200",
           "--max-model-len", "16384", "--gpu-memory-utilization", "0.8");
}
Test(cli_serve, does_not_fit)
{
    GOLDEN("serve_does_not_fit", 1, "serve", "models/llama-3-8b.yaml",
           "--gpu", "h100-80g-mig-1g.10gb");
}
Test(cli_serve, tp_does_not_split)
{
    GOLDEN("serve_tp_does_not_split", 2, "serve", "models/llama-3-8b.yaml",
           "--gpu", "h100-80g", "--tensor-parallel-size", "3");
}
Test(cli_serve, bad_utilization)
{
    GOLDEN("serve_bad_utilization", 2, "serve", "models/llama-3-8b.yaml",
           "--gpu", "h100-80g", "--gpu-memory-utilization", "1.5");
}
Test(cli_serve, bad_kv_dtype)
{
    GOLDEN("serve_bad_kv_dtype", 2, "serve", "models/llama-3-8b.yaml",
           "--gpu", "h100-80g", "--kv-cache-dtype", "int4");
}
Test(cli_serve, encoder_model)
{
    GOLDEN("serve_encoder_model", 3, "serve", "models/bert-base.yaml",
           "--gpu", "h100-80g");
}
Test(cli_serve, help)
{
    GOLDEN("serve_help", 0, "serve", "--help");
}
