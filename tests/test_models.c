/* Tests for the shipped model descriptions (every .yaml file in models/).
 *
 * Each model is loaded, built for batch 1 at its default sequence length and
 * its trainable parameter count is checked against a published or measured
 * figure. The figures were also recomputed from the architectures (the
 * formula is in each comment). Tests run with the repository root as the
 * working directory. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/graph.h"
#include "vramplan/model.h"

static vp_model *must_load(const char *path)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "vp_model_load(%s): %s:%u:%u: %s (%s)", path,
                       err.path, err.line, err.col, err.msg,
                       vp_err_name(err.code));
    return m;
}

/* Trainable parameters of a model file built with batch 1, default seq. */
static uint64_t params_of(const char *path)
{
    vp_model *m = must_load(path);
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_graph *g = vp_graph_build(m, 1, 0, &err);
    cr_assert_not_null(g, "vp_graph_build(%s): %s:%u:%u: %s (%s)", path,
                       err.path, err.line, err.col, err.msg,
                       vp_err_name(err.code));
    uint64_t n = 0;
    vp_status st = vp_graph_num_params(g, &n, &err);
    cr_assert_eq(st, VP_OK, "vp_graph_num_params(%s): %s", path, err.msg);
    vp_graph_free(g);
    vp_model_free(m);
    return n;
}

static void expect_params(const char *path, uint64_t want)
{
    uint64_t got = params_of(path);
    cr_expect_eq(got, want, "%s: %llu parameters, expected %llu (%+lld)", path,
                 (unsigned long long)got, (unsigned long long)want,
                 (long long)(got - want));
}

#define PARAMS_TEST(id, file, want)                                         \
    Test(params, id) { expect_params("models/" file ".yaml", want); }

/* ---- measured: params of /work/shared/groundtruth/h200-torch2.11-cases.jsonl
 * (sum of p.numel() over model.parameters(), torch 2.11, transformers 5.17,
 * models built as in shared/groundtruth/collect.py) --------------------- */

/* MLP(width 4096, layers 10, classes 1000):
 * 9 * (4096*4096 + 4096) + 4096*1000 + 1000. */
PARAMS_TEST(mlp10_measured, "mlp10", 155128808ULL)
/* torchvision resnet50(weights=None); also torchvision's documented
 * num_params for ResNet50_Weights. */
PARAMS_TEST(resnet50_measured, "resnet50", 25557032ULL)
/* GPT2LMHeadModel(n_layer 12, n_embd 768, n_head 12), tied head:
 * wte 50257*768 + wpe 1024*768 + 12 * 7087872 + ln_f 1536. */
PARAMS_TEST(gpt2_small_measured, "gpt2-small", 124439808ULL)
/* GPT2LMHeadModel(n_layer 24, n_embd 1024, n_head 16). */
PARAMS_TEST(gpt2_medium_measured, "gpt2-medium", 354823168ULL)
/* BertForMaskedLM(hidden 768, 12 layers, 12 heads, ffn 3072): embeddings
 * (30522 + 512 + 2) * 768 + LayerNorm 1536, 12 * 7087872 per layer, no
 * pooler, MLM head dense 768*768 + 768, LayerNorm 1536, decoder bias 30522
 * (decoder weight tied to the word embedding) = 109514298. */
PARAMS_TEST(bert_base_measured, "bert-base", 109514298ULL)

/* T5ForConditionalGeneration (t5-base config, transformers 5.17): measured
 * in groundtruth/h200-torch2.11-families.jsonl. Shared embedding 32128*768;
 * 12 encoder blocks of 4*768*768 attention + 2*768*3072 MLP + 2*768 norms;
 * 12 decoder blocks with a second attention and norm; 2 * 32*12 relative
 * position biases; 2 final norms: 222903552. */
PARAMS_TEST(t5_base_measured, "t5-base", 222903552ULL)

/* ---- counted from the architecture -------------------------------------- */

/* unet-sd-like, as groundtruth/collect_encdec.py builds it in torch: per
 * ResnetBlock2D(ci, c) 2ci + 9ci*c + c + 2c + 9c^2 + c (+ ci*c + c for a
 * 1x1 shortcut when ci != c); per Transformer2DModel(c) three LayerNorms
 * 6c, GroupNorm 2c, proj_in and proj_out 2(c^2 + c), self-attention 4c^2,
 * cross-attention 2c^2 + 2*768c, GEGLU 2(4c^2 + 4c) + 4c^2 + c; conv_in
 * 4*320*9 + 320, two downsamples and two upsample convs 9c^2 + c,
 * norm_out 640, conv_out 320*4*9 + 4; channels 320, 640, 1280 with the
 * skips of diffusers' layout: 600553604. */
PARAMS_TEST(unet_sd_like, "unet-sd-like", 600553604ULL)
/* unet-seg (milesial/Pytorch-UNet UNet(3, 2, bilinear=False)): per
 * DoubleConv(i, o) 9io + 9o^2 (no conv bias) + 4o (two BatchNorms); inc
 * (3, 64), down (64, 128) ... (512, 1024); per up level a 2x2
 * ConvTranspose2d(2c, c) 8c^2 + c and DoubleConv(2c, c) for c = 512 ...
 * 64; outc 64*2 + 2: 31037698. */
PARAMS_TEST(unet_seg, "unet-seg", 31037698ULL)

/* ---- published --------------------------------------------------------- */

/* Hugging Face openai-community/gpt2-large model card (774M); exact count
 * of GPT2LMHeadModel(n_layer 36, n_embd 1280, n_head 20). */
PARAMS_TEST(gpt2_large, "gpt2-large", 774030080ULL)
/* openai-community/gpt2-xl (1.5B): GPT2LMHeadModel(48, 1600, 25 heads). */
PARAMS_TEST(gpt2_xl, "gpt2-xl", 1557611200ULL)
/* BertForMaskedLM of google-bert/bert-large-uncased (Devlin et al. 2018,
 * 340M), counted like bert-base: embeddings (30522 + 512 + 2) * 1024 + 2048,
 * 24 * 12596224 per layer, MLM head 1049600 + 2048 + 30522. */
PARAMS_TEST(bert_large, "bert-large", 335174458ULL)
/* Llama-family counts: untied embedding and head 2 * vocab * hidden, per
 * layer q/o 2 * hidden * heads * head_dim, k/v 2 * hidden * kv_heads *
 * head_dim, SwiGLU 3 * hidden * ffn, two RMSNorms 2 * hidden; final norm.
 * TinyLlama/TinyLlama-1.1B (Zhang et al. 2024, TinyLlama): 1100048384. */
PARAMS_TEST(llama_1b, "llama-1b", 1100048384ULL)
/* meta-llama/Llama-2-7b-hf (Touvron et al. 2023, Llama 2): 6738415616. */
PARAMS_TEST(llama_2_7b, "llama-2-7b", 6738415616ULL)
/* meta-llama/Llama-2-13b-hf (Llama 2): 13015864320. */
PARAMS_TEST(llama_2_13b, "llama-2-13b", 13015864320ULL)
/* meta-llama/Llama-2-70b-hf (Llama 2, 8 KV heads): 68976648192. */
PARAMS_TEST(llama_2_70b, "llama-2-70b", 68976648192ULL)
/* meta-llama/Meta-Llama-3-8B (Llama 3 model card, vocab 128256): 8030261248. */
PARAMS_TEST(llama_3_8b, "llama-3-8b", 8030261248ULL)
/* meta-llama/Meta-Llama-3-70B (Llama 3 model card): 70553706496. */
PARAMS_TEST(llama_3_70b, "llama-3-70b", 70553706496ULL)
/* meta-llama/Llama-3.1-405B (The Llama 3 Herd of Models, Table 3):
 * 405853388800. */
PARAMS_TEST(llama_3_1_405b, "llama-3.1-405b", 405853388800ULL)
/* mistralai/Mistral-7B-v0.1 (Jiang et al. 2023, Mistral 7B): 7241732096. */
PARAMS_TEST(mistral_7b, "mistral-7b", 7241732096ULL)
/* mistralai/Mixtral-8x7B-v0.1 (Jiang et al. 2024, 46.7B total): 8 experts
 * of 3 * 4096 * 14336 and a 4096 x 8 router per layer: 46702792704. */
PARAMS_TEST(mixtral_8x7b, "mixtral-8x7b", 46702792704ULL)
/* Qwen/Qwen2-0.5B (Qwen2 Technical Report, 0.49B), tied embeddings and
 * q/k/v biases: 494032768. */
PARAMS_TEST(qwen2_0_5b, "qwen2-0.5b", 494032768ULL)
/* torchvision ResNet152_Weights.IMAGENET1K_V1 meta num_params. */
PARAMS_TEST(resnet152, "resnet152", 60192808ULL)
/* torchvision ViT_B_16_Weights.IMAGENET1K_V1 meta num_params. */
PARAMS_TEST(vit_b16, "vit-b16", 86567656ULL)
/* torchvision ViT_L_16_Weights.IMAGENET1K_V1 meta num_params. */
PARAMS_TEST(vit_l16, "vit-l16", 304326632ULL)

/* ---- Hugging Face config.json read as it is ---------------------------- */

/* tests/data/hf/ holds copies of shared/groundtruth/hf_configs/ (written by
 * transformers 5.17); each must describe the same model as models/. */
static void expect_hf_matches(const char *name)
{
    char json[256], yaml[256];
    snprintf(json, sizeof json, "tests/data/hf/%s.json", name);
    snprintf(yaml, sizeof yaml, "models/%s.yaml", name);
    uint64_t from_json = params_of(json), from_yaml = params_of(yaml);
    cr_expect_eq(from_json, from_yaml,
                 "%s gives %llu parameters, %s gives %llu (%+lld)", json,
                 (unsigned long long)from_json, yaml,
                 (unsigned long long)from_yaml,
                 (long long)(from_json - from_yaml));
}

Test(hf_config, gpt2_small_matches_yaml) { expect_hf_matches("gpt2-small"); }
Test(hf_config, gpt2_medium_matches_yaml) { expect_hf_matches("gpt2-medium"); }
Test(hf_config, bert_base_matches_yaml) { expect_hf_matches("bert-base"); }

/* ---- every shipped file ------------------------------------------------ */

static bool is_yaml(const char *f)
{
    size_t n = strlen(f);
    return n > 5 && f[0] != '.' && !strcmp(f + n - 5, ".yaml");
}

/* Calls fn on each .yaml file in models/; returns how many there were. */
static int each_model(void (*fn)(const char *path, const char *file))
{
    DIR *dir = opendir("models");
    cr_assert_not_null(dir, "cannot open models/ (run from the repo root)");
    int count = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (!is_yaml(de->d_name))
            continue;
        char path[512];
        snprintf(path, sizeof path, "models/%s", de->d_name);
        fn(path, de->d_name);
        count++;
    }
    closedir(dir);
    return count;
}

static void loads_and_builds(const char *path, const char *file)
{
    (void)file;
    uint64_t n = params_of(path);
    cr_expect_gt(n, 0, "%s has no parameters", path);
}

Test(models_dir, every_model_file_loads_and_builds)
{
    int count = each_model(loads_and_builds);
    cr_expect_geq(count, 21, "only %d model files in models/", count);
}

static void name_matches_file(const char *path, const char *file)
{
    vp_model *m = must_load(path);
    size_t n = strlen(file) - 5;
    cr_expect(strlen(vp_model_name(m)) == n &&
                  !strncmp(vp_model_name(m), file, n),
              "%s is named '%s'", path, vp_model_name(m));
    vp_model_free(m);
}

Test(models_dir, every_model_is_named_after_its_file)
{
    each_model(name_matches_file);
}

/* What `--checkpoint all` wraps must not be empty: transformer layers,
 * ResNet stages, ViT encoder layers, mlp10's Linear layers. */
static void has_checkpoint_units(const char *path, const char *file)
{
    (void)file;
    vp_model *m = must_load(path);
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_graph *g = vp_graph_build(m, 1, 0, &err);
    cr_assert_not_null(g, "vp_graph_build(%s): %s", path, err.msg);
    cr_expect_gt(vp_graph_segment_count(g), 0,
                 "%s has no checkpoint units", path);
    vp_graph_free(g);
    vp_model_free(m);
}

Test(models_dir, every_model_has_checkpoint_units)
{
    each_model(has_checkpoint_units);
}
