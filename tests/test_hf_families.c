/* Tests for the Hugging Face config.json readers of the newer decoder
 * families (src/hf_families.c) and the transformer form's keys they need.
 *
 * Parameter counts: each config in groundtruth/hf_configs/ was written by
 * transformers 5.17's save_pretrained for a model measured on the H200;
 * the expected count is that case's `params` in
 * groundtruth/h200-torch2.11-families.jsonl (sum(p.numel()) of the model
 * built from the config). Tests run from the repository root. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/graph.h"
#include "vramplan/model.h"

static vp_graph *build(const char *path)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "vp_model_load(%s): %s:%u:%u: %s", path, err.path,
                       err.line, err.col, err.msg);
    vp_graph *g = vp_graph_build(m, 1, 0, &err);
    cr_assert_not_null(g, "vp_graph_build(%s): %s", path, err.msg);
    vp_model_free(m);
    return g;
}

static uint64_t count(const char *path, bool active)
{
    vp_graph *g = build(path);
    uint64_t n = 0;
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_status st = active ? vp_graph_num_active_params(g, &n, &err)
                          : vp_graph_num_params(g, &n, &err);
    cr_assert_eq(st, VP_OK, "%s: %s", path, err.msg);
    vp_graph_free(g);
    return n;
}

static void expect_count(const char *path, bool active, uint64_t want)
{
    uint64_t got = count(path, active);
    cr_expect_eq(got, want, "%s: %llu %sparameters, expected %llu (%+lld)",
                 path, (unsigned long long)got, active ? "active " : "",
                 (unsigned long long)want, (long long)(got - want));
}

#define MEASURED(id, name, want)                                            \
    Test(hf_families, id)                                                   \
    {                                                                       \
        expect_count("groundtruth/hf_configs/" name ".json", false, want);  \
    }

/* tied embeddings, qk-norm (Qwen3RMSNorm on q and k per head) */
MEASURED(qwen3_0_6b, "qwen3-0.6b", 596049920ULL)
/* 64 experts top-8 as two stacked tensors per layer, untied */
MEASURED(qwen3_moe_small, "qwen3-moe-small", 1906330624ULL)
/* 60 experts + the shared expert and its sigmoid gate, q/k/v biases */
MEASURED(qwen2_moe_small, "qwen2-moe-small", 2904573952ULL)
/* Gemma: head_dim 256 with 8 heads over hidden 2048, tied, GeGLU */
MEASURED(gemma_2b, "gemma-2b", 2506172416ULL)
/* Gemma 2: four norms a layer, soft-capping (no parameters) */
MEASURED(gemma2_2b, "gemma2-2b", 2614341888ULL)
/* Gemma 3: Gemma 2's layout plus q/k norms, 5 local : 1 global */
MEASURED(gemma3_1b, "gemma3-1b", 999885952ULL)
/* Phi-3: packed qkv_proj and gate_up_proj */
MEASURED(phi3_mini_16l, "phi3-mini-16l", 2009041920ULL)
/* DeepSeek-V3 small: MLA, a dense first layer, 32 routed + 1 shared,
 * the router's e_score_correction_bias a buffer, not a parameter */
MEASURED(deepseek_v3_small, "deepseek-v3-small", 161983488ULL)

/* DeepSeek-V3 as published (tests/data/hf/deepseek-v3.json: the values of
 * deepseek-ai/DeepSeek-V3's config.json). Per layer: MLA q_a 7168x1536,
 * q_a_norm 1536, q_b 1536x(128x192), kv_a 7168x(512+64), kv_a_norm 512,
 * kv_b 512x(128x256), o 16384x7168 = 187107328, two norms 14336; 3 dense
 * MLPs of 3x7168x18432; 58 MoE layers of 256+1 experts of 3x7168x2048
 * and a 256x7168 router; embedding and head 129280x7168 each; final norm:
 * 671026404352, the technical report's 671B (its 14B MTP module is not in
 * transformers' DeepseekV3ForCausalLM). */
Test(deepseek_v3, hf_config_gives_671b)
{
    expect_count("tests/data/hf/deepseek-v3.json", false, 671026404352ULL);
}

/* Active: 8 of the 256 routed experts: 61 x 187121664 + 3 x 396361728 +
 * 58 x (9 x 44040192 + 1835008) + 2 x 926679040 + 7168 = 37552282624,
 * the report's 37B activated (with the embedding and the head). */
Test(deepseek_v3, hf_config_gives_37b_active)
{
    expect_count("tests/data/hf/deepseek-v3.json", true, 37552282624ULL);
}

Test(deepseek_v3, yaml_matches_hf_config)
{
    cr_expect_eq(count("models/deepseek-v3.yaml", false),
                 count("tests/data/hf/deepseek-v3.json", false));
    cr_expect_eq(count("models/deepseek-v3.yaml", true),
                 count("tests/data/hf/deepseek-v3.json", true));
}

/* Mixtral 8x7B: 2 of 8 experts a token: 46702792704 - 32 layers x 6 idle
 * experts x 3 x 4096 x 14336 = 12879925248 (Jiang et al. 2024: 13B
 * active). */
Test(active_params, mixtral_two_of_eight)
{
    expect_count("models/mixtral-8x7b.yaml", true, 12879925248ULL);
}

/* Without experts every parameter is active. */
Test(active_params, dense_model_all_active)
{
    cr_expect_eq(count("models/llama-3-8b.yaml", true),
                 count("models/llama-3-8b.yaml", false));
}
