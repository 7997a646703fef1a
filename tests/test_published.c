/* Published figures the cluster planner must reproduce: the ZeRO paper's
 * model-state bytes, Megatron-LM's bytes per parameter, Korthikanti et
 * al.'s activation bytes per layer (Table 2), the pipeline bubble and
 * 1F1B's micro-batches in flight, and published step times with their
 * exact layouts (docs/STEP_TIME.md "Published runs"). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/cluster.h"
#include "vramplan/vramplan.h"

#include "cluster_util.h"

#define GB 1e9

/* A100 SXM4 80GB datasheet (gpus/a100-80g.yaml) with vramplan's default
 * efficiency terms; Selene's network: 8 x 200 Gb/s HDR per node. */
static void a100(vp_hw *h)
{
    memset(h, 0, sizeof *h);
    strcpy(h->name, "a100-80g");
    h->memory = 80ull << 30;
    h->context = 718077952;
    h->fp32 = 19.5e12;
    h->tf32 = 156e12;
    h->fp16 = 312e12;
    h->bf16 = 312e12;
    h->hbm = 2039e9;
    h->host = 31.5e9;
    h->nvlink = 300e9;
    h->network = 25e9;
    h->eff_max = 1.0;
    h->mem_eff = 1.0;
    vp_hw_fill_defaults(h);
}

/* ---- ZeRO (Rajbhandari et al. 2020, Fig. 1): 7.5B, Nd = 64 ---------- */

Test(zero_paper, figure1_model_states)
{
    double psi = 7.5e9, k = 12, nd = 64;
    cr_assert_float_eq(vp_zero_state_bytes(psi, k, nd, 0) / GB, 120.0, 1e-9);
    cr_assert_float_eq(vp_zero_state_bytes(psi, k, nd, 1) / GB, 31.4, 0.05);
    cr_assert_float_eq(vp_zero_state_bytes(psi, k, nd, 2) / GB, 16.6, 0.05);
    cr_assert_float_eq(vp_zero_state_bytes(psi, k, nd, 3) / GB, 1.9, 0.05);
}

/* The evaluator's DeepSpeed states follow the same formulas for the
 * parameters a rank holds. */
Test(zero_paper, evaluator_matches_the_formulas)
{
    vp_model *m = load("tests/data/cluster/megatron-22b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_hw hw;
    a100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 64, 8);
    const vp_sharding st[] = {VP_SHARD_ZERO1, VP_SHARD_ZERO2,
                              VP_SHARD_ZERO3};
    for (int s = 0; s < 3; s++) {
        vp_par p = par(64, 1, 1, st[s]);
        vp_cluster_mem mem;
        vp_error err;
        cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, NULL, &err), VP_OK,
                     "%s", err.msg);
        double got = (double)(mem.weights + mem.grads + mem.optimizer);
        double want = vp_zero_state_bytes((double)in.params, 12, 64, s + 1);
        cr_assert(fabs(got / want - 1) < 1e-6, "stage %d: %g vs %g", s + 1,
                  got, want);
    }
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- Megatron-LM: 18 and 6 + 12/d bytes per parameter -------------- */

/* Megatron's DDP (whole) and the distributed optimizer over d ranks in
 * dtype dt: model-state bytes per parameter are whole and w_g + 12/d */
static void megatron_states(vp_dtype dt, double whole, double w_g)
{
    vp_model *m = load("tests/data/cluster/megatron-22b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_hw hw;
    a100(&hw);
    hw.fp8 = 2 * hw.bf16; /* for fp8; the A100 has none */
    const uint32_t ds[] = {2, 8, 64};
    const vp_sharding sh[] = {VP_SHARD_MEGATRON, VP_SHARD_DISTOPT};
    for (size_t i = 0; i < 3; i++)
        for (size_t k = 0; k < 2; k++) {
            uint32_t d = ds[i];
            vp_cluster c;
            vp_cluster_init(&c, &hw, d, 8);
            vp_error err;
            vp_cluster_mem mem;
            vp_par p = par(d, 1, 1, sh[k]);
            p.dtype = dt;
            cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, NULL, &err),
                         VP_OK, "%s", err.msg);
            double per = (double)(mem.weights + mem.grads + mem.optimizer) /
                         (double)in.params;
            double want = k == 0 ? whole : w_g + 12.0 / d;
            cr_assert_float_eq(per, want, 1e-6, "d %u: %g", d, per);
        }
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(megatron, bytes_per_parameter)
{
    megatron_states(VP_DT_BF16, 18.0, 6.0);
}

/* fp8 under Megatron-Bridge's recipes (fp8_param_gather, bf16 grad
 * buffer): 2 B of fp8 parameter and transpose, 2 B of gradient, 12 B of
 * fp32 master and moments; 4 + 12/d with the distributed optimizer */
Test(megatron, fp8_bytes_per_parameter)
{
    megatron_states(VP_DT_FP8, 16.0, 4.0);
}

/* ---- Korthikanti et al. 2022, Table 2 -------------------------------- */

/* The closed forms, row by row, for GPT-3 175B (s 2048, h 12288, a 96)
 * at t = 8, b = 1, in units of sbh. */
Test(korthikanti, table2_rows)
{
    double s = 2048, b = 1, h = 12288, a = 96, t = 8, sbh = s * b * h;
    double as_h = a * s / h;
    struct {
        bool sp;
        vp_recompute rc;
        double t, per_sbh;
    } rows[] = {
        {false, VP_RC_NONE, 1, 34 + 5 * as_h},            /* no parallel */
        {false, VP_RC_NONE, t, 10 + 24 / t + 5 * as_h / t}, /* TP        */
        {true, VP_RC_NONE, t, (34 + 5 * as_h) / t},         /* TP + SP   */
        {false, VP_RC_SELECTIVE, t, 10 + 24 / t},           /* TP + sel  */
        {true, VP_RC_SELECTIVE, t, 34 / t},                 /* + SP + sel */
        {false, VP_RC_FULL, t, 2},                          /* full      */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        double got = vp_korthikanti_layer_bytes(s, b, h, a, rows[i].t,
                                                rows[i].sp, rows[i].rc);
        cr_assert_float_eq(got / sbh, rows[i].per_sbh, 1e-9, "row %zu", i);
    }
}

/* vramplan's simulated per-layer bytes (a two-layer copy of the model
 * through the simulator, bf16, eager attention, dropout 0.1) against
 * every row, for the four models of Table 3 at their t = 8. */
static void check_model(const char *path)
{
    vp_model *m = load(path);
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    const struct {
        uint32_t t;
        bool sp;
        vp_recompute rc;
    } rows[] = {
        {1, false, VP_RC_NONE},     {8, false, VP_RC_NONE},
        {8, true, VP_RC_NONE},      {8, false, VP_RC_SELECTIVE},
        {8, true, VP_RC_SELECTIVE}, {8, false, VP_RC_FULL},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (uint64_t b = 1; b <= 4; b *= 4) {
            uint64_t got;
            vp_error err;
            cr_assert_eq(vp_cluster_layer_act(cm, VP_DT_BF16, false, b,
                                              rows[i].t, rows[i].sp, 1,
                                              rows[i].rc, &got, &err),
                         VP_OK, "%s", err.msg);
            double want = vp_korthikanti_layer_bytes(
                (double)in.seq, (double)b, (double)in.hidden,
                (double)in.heads, rows[i].t, rows[i].sp, rows[i].rc);
            double rel = (double)got / want - 1;
            cr_assert(fabs(rel) < 0.02,
                      "%s row %zu b %llu: simulated %llu vs Table 2 %.0f "
                      "(%+.2f%%)",
                      path, i, (unsigned long long)b,
                      (unsigned long long)got, want, 100 * rel);
        }
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(korthikanti, simulated_22b) { check_model("tests/data/cluster/megatron-22b.yaml"); }
Test(korthikanti, simulated_175b) { check_model("tests/data/cluster/gpt3-175b.yaml"); }
Test(korthikanti, simulated_530b) { check_model("tests/data/cluster/turing-530b.yaml"); }
Test(korthikanti, simulated_1t) { check_model("tests/data/cluster/megatron-1t.yaml"); }

/* ---- pipelines (Narayanan et al. 2021) ------------------------------- */

Test(pipeline, bubble_fraction)
{
    cr_assert_float_eq(vp_pipeline_bubble(8, 64, 1), 7.0 / 64, 1e-12);
    cr_assert_float_eq(vp_pipeline_bubble(35, 280, 3), 34.0 / (3 * 280),
                       1e-12);
    cr_assert_float_eq(vp_pipeline_bubble(1, 16, 1), 0.0, 1e-12);
}

Test(pipeline, micro_batches_in_flight)
{
    /* 1F1B: p on the first stage, 1 on the last; GPipe: all m */
    cr_assert_float_eq(vp_pipeline_in_flight(VP_SCHED_1F1B, 8, 64, 1, 0), 8,
                       1e-12);
    cr_assert_float_eq(vp_pipeline_in_flight(VP_SCHED_1F1B, 8, 64, 1, 7), 1,
                       1e-12);
    cr_assert_float_eq(vp_pipeline_in_flight(VP_SCHED_1F1B, 8, 4, 1, 0), 4,
                       1e-12);
    cr_assert_float_eq(vp_pipeline_in_flight(VP_SCHED_GPIPE, 8, 64, 1, 0),
                       64, 1e-12);
    /* interleaved: p (1 + (p - 1)/(p v)) */
    cr_assert_float_eq(
        vp_pipeline_in_flight(VP_SCHED_INTERLEAVED, 4, 64, 2, 0),
        4 * (1 + 3.0 / 8), 1e-12);
}

/* The evaluated step: bubble / pipelined work = (p - 1)/m, and the first
 * stage holds p micro-batches under 1F1B. */
Test(pipeline, evaluated_bubble_and_in_flight)
{
    vp_model *m = load("tests/data/cluster/gpt3-175b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    a100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 64, 8);
    vp_par p = par(1, 8, 8, VP_SHARD_MEGATRON);
    p.accum = 64;
    vp_cluster_mem mem;
    vp_cluster_time t;
    vp_error err;
    cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, &t, &err), VP_OK, "%s",
                 err.msg);
    double work = t.step - t.bubble - t.dp_comm - t.optimizer - t.offload;
    cr_assert_float_eq(t.bubble / work, 7.0 / 64, 1e-9);
    cr_assert_eq(mem.stage, 0u);
    cr_assert_float_eq(mem.in_flight, 8.0, 1e-12);
    p.schedule = VP_SCHED_INTERLEAVED;
    p.vpp = 3;
    cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, &t, &err), VP_OK, "%s",
                 err.msg);
    work = t.step - t.bubble - t.dp_comm - t.optimizer - t.offload;
    cr_assert_float_eq(t.bubble / work, 7.0 / (3 * 64), 1e-9);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- published step times ------------------------------------------- */

/* Published runs, each with the exact layout its authors give, against
 * the step time they measured (docs/STEP_TIME.md "Published runs"). Where
 * a paper gives TFLOP/s per GPU instead, the step is its FLOPs over that
 * rate, with the paper's own FLOP count: Narayanan et al. 2021, eq. (3),
 * F = 96 B s l h^2 (1 + s / 6h + V / 16lh), which counts the recomputed
 * forward.
 *
 * Sources:
 *  N1 Narayanan et al. 2021, Efficient Large-Scale Language Model Training
 *     on GPU Clusters Using Megatron-LM (arXiv 2104.04473), Table 1; the
 *     layouts of NVIDIA/Megatron-LM examples/sc21/run_table_1.sh (TP, PP,
 *     MBS, GBS, NNODES, DDP-impl, --num-layers-per-virtual-pipeline-stage,
 *     --activations-checkpoint-method uniform) and CONFIG.sh (--fp16)
 *  N2 the same paper, Table 2: ZeRO-3 without model parallelism (DeepSpeed,
 *     March 2021) and PTD parallelism (held out)
 *  K5 Korthikanti et al. 2022, Reducing Activation Recomputation in Large
 *     Transformer Models, Table 5 (measured seconds per iteration), with
 *     the shapes and batches of calculon-ai/calculon validation/seqsel/tab5
 *  R  NVIDIA/Megatron-LM README (2021-2023), GPT-3 example: "With full
 *     global batch size of 1536 on 1024 A100 GPUs, each iteration takes
 *     around 32 seconds" (examples/pretrain_gpt3_175B.sh: TP 8, PP 16,
 *     micro-batch 1, --fp16)
 * All on Selene: DGX A100 80GB nodes, 8 x 200 Gb/s HDR InfiniBand. */
typedef struct {
    const char *name, *model;
    uint32_t gpus, tp, pp, vpp;
    uint64_t gb, mb;
    vp_dtype dt;
    vp_recompute rc;
    bool sp;
    vp_sharding sh;
    vp_switch overlap_dp;
    double tflops; /* per GPU (eq. 3), or 0 */
    double seconds;
    /* runs off Selene: the GPU profile, bytes/s per GPU between nodes,
     * torch.compile, context parallelism (0 = 1) */
    const char *gpu;
    double network;
    bool compile;
    uint32_t cp;
    bool fp8_gather; /* torchao's fp8 all-gather recipe */
} pubrun;

#define GPT(n) "tests/data/published/gpt-" n ".yaml"
#define T530 "tests/data/cluster/turing-530b.yaml"
#define T175 "tests/data/cluster/gpt3-175b.yaml"
#define T1T "tests/data/cluster/megatron-1t.yaml"
#define T22 "tests/data/cluster/megatron-22b.yaml"
#define MEG VP_SHARD_MEGATRON
#define FULL VP_RC_FULL
#define SEL VP_RC_SELECTIVE
/* Selene: the A100 80GB profile, 25 GB/s per GPU, eager, no CP */
#define SELENE NULL, 0, false, 0, false

static const pubrun collected[] = {
    /* N1: DDP-impl torch up to 18B (buckets overlap the backward), local
     * from 39B (one all-reduce after the backward) */
    {"N1 1.7B", GPT("1.7b"), 32, 1, 1, 1, 512, 16, VP_DT_FP16, FULL, false,
     MEG, VP_ON, 137, 0, SELENE},
    {"N1 3.6B", GPT("3.6b"), 64, 2, 1, 1, 512, 16, VP_DT_FP16, FULL, false,
     MEG, VP_ON, 138, 0, SELENE},
    {"N1 7.5B", GPT("7.5b"), 128, 4, 1, 1, 512, 16, VP_DT_FP16, FULL, false,
     MEG, VP_ON, 142, 0, SELENE},
    {"N1 18.4B", GPT("18b"), 256, 8, 1, 1, 1024, 8, VP_DT_FP16, FULL, false,
     MEG, VP_ON, 135, 0, SELENE},
    {"N1 39.1B", GPT("39b"), 512, 8, 2, 1, 1536, 4, VP_DT_FP16, FULL, false,
     MEG, VP_OFF, 138, 0, SELENE},
    {"N1 76.1B", GPT("76b"), 1024, 8, 4, 3, 1792, 2, VP_DT_FP16, FULL, false,
     MEG, VP_OFF, 140, 0, SELENE},
    {"N1 145.6B", GPT("145b"), 1536, 8, 8, 2, 2304, 2, VP_DT_FP16, FULL,
     false, MEG, VP_OFF, 148, 0, SELENE},
    {"N1 310.1B", GPT("310b"), 1920, 8, 16, 2, 2160, 1, VP_DT_FP16, FULL,
     false, MEG, VP_OFF, 155, 0, SELENE},
    {"N1 529.6B", T530, 2520, 8, 35, 3, 2520, 1, VP_DT_FP16, FULL, false,
     MEG, VP_OFF, 163, 0, SELENE},
    {"N1 1008B", T1T, 3072, 8, 64, 1, 3072, 1, VP_DT_FP16, FULL, false, MEG,
     VP_OFF, 163, 0, SELENE},
    /* R */
    {"R 175B", T175, 1024, 8, 16, 1, 1536, 1, VP_DT_FP16, FULL, false, MEG,
     VP_OFF, 0, 32.0, SELENE},
    /* K5: one replica (no data parallelism); full = full recomputation,
     * seqsel = sequence parallelism + selective recomputation */
    {"K5 22B full", T22, 8, 8, 1, 1, 4, 4, VP_DT_FP16, FULL, false, MEG,
     VP_AUTO, 0, 1.42, SELENE},
    {"K5 22B seqsel", T22, 8, 8, 1, 1, 4, 4, VP_DT_FP16, SEL, true, MEG,
     VP_AUTO, 0, 1.10, SELENE},
    {"K5 175B full", T175, 64, 8, 8, 3, 64, 1, VP_DT_FP16, FULL, false, MEG,
     VP_AUTO, 0, 18.13, SELENE},
    {"K5 175B seqsel", T175, 64, 8, 8, 3, 64, 1, VP_DT_FP16, SEL, true, MEG,
     VP_AUTO, 0, 13.75, SELENE},
    {"K5 530B full", T530, 280, 8, 35, 3, 280, 1, VP_DT_FP16, FULL, false,
     MEG, VP_AUTO, 0, 49.05, SELENE},
    {"K5 530B seqsel", T530, 280, 8, 35, 3, 280, 1, VP_DT_FP16, SEL, true,
     MEG, VP_AUTO, 0, 37.83, SELENE},
    {"K5 1T full", T1T, 512, 8, 64, 1, 512, 1, VP_DT_FP16, FULL, false, MEG,
     VP_AUTO, 0, 94.42, SELENE},
    {"K5 1T seqsel", T1T, 512, 8, 64, 1, 512, 1, VP_DT_FP16, SEL, true, MEG,
     VP_AUTO, 0, 71.49, SELENE},
    /* T: torchtitan on 64 A100 80GB, FSDP2 (fully_shard) over the 64
     * ranks, bf16 parameters, seq 8192 (Llama 3) or 4096 (Llama 2), WPS
     * = tokens/s per GPU: step = local batch x seq / WPS; "selective
     * op" is the torch engine's selective recomputation */
    {"T L3 8B sel", "models/llama-3-8b.yaml", 64, 1, 1, 1, 64, 1,
     VP_DT_BF16, SEL, false, VP_SHARD_FSDP2, VP_AUTO, 0, 8192 / 2973.0, SELENE},
    {"T L3 70B full", "models/llama-3-70b.yaml", 64, 1, 1, 1, 64, 1,
     VP_DT_BF16, FULL, false, VP_SHARD_FSDP2, VP_AUTO, 0, 8192 / 331.0, SELENE},
    {"T L2 13B sel", "models/llama-2-13b.yaml", 64, 1, 1, 1, 128, 2,
     VP_DT_BF16, SEL, false, VP_SHARD_FSDP2, VP_AUTO, 0,
     2 * 4096 / 1904.0, SELENE},
    {"T L2 70B sel", "models/llama-2-70b.yaml", 64, 1, 1, 1, 64, 1,
     VP_DT_BF16, SEL, false, VP_SHARD_FSDP2, VP_AUTO, 0, 4096 / 355.0, SELENE},
    {"T L2 70B full", "models/llama-2-70b.yaml", 64, 1, 1, 1, 128, 2,
     VP_DT_BF16, FULL, false, VP_SHARD_FSDP2, VP_AUTO, 0,
     2 * 4096 / 353.0, SELENE},
};

/* Held out: evaluated after the rules above were set, never used to set
 * them. N2's PTD-P rows give the model-parallel size only (TP 8 within a
 * node, PP 12 and 35); the schedule is taken as 1F1B. */
static const pubrun held_out[] = {
    {"N2 PTD-P 175B 384", T175, 384, 8, 12, 1, 1536, 1, VP_DT_FP16, FULL,
     false, MEG, VP_OFF, 153, 0, SELENE},
    {"N2 PTD-P 175B 768", T175, 768, 8, 12, 1, 1536, 1, VP_DT_FP16, FULL,
     false, MEG, VP_OFF, 149, 0, SELENE},
    {"N2 PTD-P 175B 1536", T175, 1536, 8, 12, 1, 1536, 1, VP_DT_FP16, FULL,
     false, MEG, VP_OFF, 141, 0, SELENE},
    {"N2 PTD-P 530B 560", T530, 560, 8, 35, 1, 2240, 1, VP_DT_FP16, FULL,
     false, MEG, VP_OFF, 171, 0, SELENE},
    {"N2 PTD-P 530B 1120", T530, 1120, 8, 35, 1, 2240, 1, VP_DT_FP16, FULL,
     false, MEG, VP_OFF, 167, 0, SELENE},
    {"N2 PTD-P 530B 2240", T530, 2240, 8, 35, 1, 2240, 1, VP_DT_FP16, FULL,
     false, MEG, VP_OFF, 159, 0, SELENE},
};

/* Held out, second set: taken after this tree's rules (NCCL's rails,
 * FSDP2's copies, DualPipe) were set, never used to set them; measured
 * error reported whatever it is (docs/STEP_TIME.md "Published runs").
 *  TT torchtitan benchmarks/llama3_8b_h200_2025-06_torchtitan.md (Trainy,
 *     June 2025): Llama 3.1 8B on 4 and 8 nodes of 8 H200, 400 Gb/s per
 *     GPU, FSDP2 over all ranks, local batch 2, seq 8192, torch.compile,
 *     float8 linears, selective op AC (train_configs/llama3_8b.toml),
 *     --float8.enable_fsdp_float8_all_gather --float8.precompute_float8_
 *     dynamic_scale_for_fsdp --float8.force_recompute_fp8_weight_in_bwd
 *     (the file's command: torchao's fp8 all-gather recipe, fp8_gather);
 *     TPS/GPU 10938 and 10753
 *  MB Megatron-Bridge docs/performance-summary.md, 25.11 NeMo container:
 *     DGX-H100 and DGX-B200 (8 x 400 Gb/s), FP8 current scaling, the
 *     table's GBS, MBS, TP, PP, CP, VP; distributed optimizer, sequence
 *     parallelism with TP (the recipes' defaults), no recomputation;
 *     tokens/s/GPU -> step = GBS x seq / (tokens/s/GPU x GPUs) */
#define TT(n, tps)                                                         \
    {"TT L3.1 8B " #n " H200", "models/llama-3-8b.yaml", n, 1, 1, 1, 2 * n, \
     2, VP_DT_FP8, SEL, false, VP_SHARD_FSDP2, VP_AUTO, 0,                 \
     2 * 8192.0 / (tps), "h200", 50e9, true, 0, true}
static const pubrun held_out2[] = {
    TT(32, 10938),
    TT(64, 10753),
    {"MB L3 70B 64 H100", "models/llama-3-70b.yaml", 64, 4, 8, 5, 128, 1,
     VP_DT_FP8, VP_RC_NONE, true, VP_SHARD_DISTOPT, VP_AUTO, 0,
     128 * 8192.0 / (1602.0 * 64), "h100-80g", 50e9, false, 1, false},
    {"MB L3.1 405B 1024 H100", "models/llama-3.1-405b.yaml", 1024, 8, 8, 8,
     512, 1, VP_DT_FP8, VP_RC_NONE, true, VP_SHARD_DISTOPT, VP_AUTO, 0,
     512 * 8192.0 / (292.0 * 1024), "h100-80g", 50e9, false, 2, false},
    {"MB L3 8B 8 B200", "models/llama-3-8b.yaml", 8, 1, 1, 1, 128, 2,
     VP_DT_FP8, VP_RC_NONE, false, VP_SHARD_DISTOPT, VP_AUTO, 0,
     128 * 8192.0 / (30624.0 * 8), "b200", 50e9, false, 1, false},
    {"MB L3.1 405B 128 B200", "models/llama-3.1-405b.yaml", 128, 4, 8, 8, 64,
     1, VP_DT_FP8, VP_RC_NONE, true, VP_SHARD_DISTOPT, VP_AUTO, 0,
     64 * 8192.0 / (661.0 * 128), "b200", 50e9, false, 2, false},
};

/* Not reproduced: Narayanan et al.'s ZeRO-3 rows (docs/STEP_TIME.md
 * "Published runs"). Their step times imply 16-18 GB/s of collective
 * bandwidth per rank, one NIC's, where NCCL reaches the node's eight
 * rails; checked for fit and the MFU bound, their errors printed. */
static const pubrun zero3_2021[] = {
    /* N2 ZeRO-3: DeepSpeed of March 2021, whose prefetcher gave up on a
     * module order that changed (deepspeedai/DeepSpeed PR #873): each
     * sub-module waits for its gather; full recomputation, fp16 */
    {"N2 ZeRO-3 175B 384", T175, 384, 1, 1, 1, 1536, 4, VP_DT_FP16, FULL,
     false, VP_SHARD_ZERO3, VP_OFF, 144, 0, SELENE},
    {"N2 ZeRO-3 175B 768", T175, 768, 1, 1, 1, 1536, 2, VP_DT_FP16, FULL,
     false, VP_SHARD_ZERO3, VP_OFF, 88, 0, SELENE},
    {"N2 ZeRO-3 175B 1536", T175, 1536, 1, 1, 1, 1536, 1, VP_DT_FP16, FULL,
     false, VP_SHARD_ZERO3, VP_OFF, 44, 0, SELENE},
    {"N2 ZeRO-3 530B 640", T530, 640, 1, 1, 1, 2560, 4, VP_DT_FP16, FULL,
     false, VP_SHARD_ZERO3, VP_OFF, 138, 0, SELENE},
    {"N2 ZeRO-3 530B 1120", T530, 1120, 1, 1, 1, 2240, 2, VP_DT_FP16, FULL,
     false, VP_SHARD_ZERO3, VP_OFF, 98, 0, SELENE},
    {"N2 ZeRO-3 530B 2240", T530, 2240, 1, 1, 1, 2240, 1, VP_DT_FP16, FULL,
     false, VP_SHARD_ZERO3, VP_OFF, 48, 0, SELENE},
};

/* The cluster of a run: the shipped profile (A100 80GB unless the run
 * names another), Selene's 25 GB/s per GPU network unless the run
 * gives its own. */
static void run_cluster(vp_cluster *c, const pubrun *r)
{
    vp_error err;
    vp_gpu_profile *gp = vp_gpu_load(r->gpu ? r->gpu : "a100-80g", &err);
    cr_assert_not_null(gp, "%s", err.msg);
    vp_hw hw;
    vp_gpu_hw(gp, VP_GPU_BF16, &hw);
    vp_hw_fill_defaults(&hw);
    vp_gpu_free(gp);
    hw.network = r->network > 0 ? r->network : 25e9;
    vp_cluster_init(c, &hw, r->gpus, 8);
}

/* The layout run r ran. */
static vp_par run_par(const pubrun *r)
{
    uint32_t cp = r->cp ? r->cp : 1;
    vp_par p = par(r->gpus / (r->tp * r->pp * cp), r->tp, r->pp, r->sh);
    p.cp = cp;
    p.compile = r->compile;
    p.fp8_gather = r->fp8_gather;
    p.vpp = r->vpp;
    p.schedule = r->vpp > 1 ? VP_SCHED_INTERLEAVED : VP_SCHED_1F1B;
    p.micro_batch = r->mb;
    p.accum = r->gb / (p.dp * r->mb);
    cr_assert_eq(p.accum * p.dp * r->mb, r->gb, "%s: batch", r->name);
    p.dtype = r->dt;
    p.recompute = r->rc;
    p.sp = r->sp;
    p.overlap_dp = r->overlap_dp;
    p.bucket_view = true;
    return p;
}

/* Predicted over published step time - 1, for run r, which must fit. */
static double run_error(const pubrun *r)
{
    vp_model *m = load(r->model);
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_cluster c;
    run_cluster(&c, r);
    vp_par p = run_par(r);
    vp_cluster_mem mem;
    vp_cluster_time t;
    vp_error err;
    cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, &t, &err), VP_OK,
                 "%s: %s", r->name, err.msg);
    cr_assert(vp_cluster_fits(&c, &mem), "%s does not fit: %.1f GiB of %.1f",
              r->name, (double)mem.total / (1 << 30),
              (double)c.memory / (1 << 30));
    double meas = r->seconds;
    if (r->tflops > 0) {
        double B = (double)r->gb, s = (double)in.seq, l = (double)in.layers;
        double h = (double)in.hidden, V = (double)in.vocab;
        double F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
        meas = F / (r->tflops * 1e12 * r->gpus);
    }
    double e = t.step / meas - 1;
    fprintf(stderr, "published %-22s measured %7.2f s vramplan %7.2f s "
                    "error %+6.1f%% mfu %.1f%% (bound %.1f%%)\n",
            r->name, meas, t.step, 100 * e, 100 * t.mfu, 100 * t.mfu_bound);
    cr_assert_leq(t.mfu, t.mfu_bound + 1e-12, "%s: MFU above its bound",
                  r->name);
    vp_cluster_model_free(cm);
    vp_model_free(m);
    return e;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Every run within 15 %, the median within med_max. */
static void check_runs(const pubrun *runs, size_t n, const char *what,
                       double med_max)
{
    double abs_e[64];
    cr_assert_leq(n, 64);
    for (size_t i = 0; i < n; i++) {
        double e = run_error(&runs[i]);
        abs_e[i] = fabs(e);
        cr_assert_lt(abs_e[i], 0.15, "%s: %+.1f%%", runs[i].name, 100 * e);
    }
    qsort(abs_e, n, sizeof abs_e[0], dcmp);
    double med = n % 2 ? abs_e[n / 2] : (abs_e[n / 2 - 1] + abs_e[n / 2]) / 2;
    fprintf(stderr, "published %s: %zu runs, median |error| %.1f%%, max "
                    "%.1f%%\n",
            what, n, 100 * med, 100 * abs_e[n - 1]);
    cr_assert_lt(med, med_max, "%s: median |error| %.1f%%", what, 100 * med);
}

Test(published, collected_runs, .timeout = 120)
{
    check_runs(collected, sizeof collected / sizeof collected[0],
               "collected", 0.05);
}

Test(published, held_out_runs, .timeout = 60)
{
    check_runs(held_out, sizeof held_out / sizeof held_out[0], "held out",
               0.055);
}

/* The second held-out set misses the 15 % / 5 % asked for
 * (docs/STEP_TIME.md gives the figures and the causes found): each run
 * fits (the fp8 Megatron rows under Megatron-Bridge's fp8 states,
 * docs/CLUSTER.md "fp8"), is evaluated and stays under its MFU bound
 * (run_error), its error printed; the model is not faster than the
 * GPU's best GEMMs allow, and not off by more than a third */
Test(published, held_out_second_set_is_reported, .timeout = 120)
{
    size_t n = sizeof held_out2 / sizeof held_out2[0];
    double abs_e[16];
    cr_assert_leq(n, 16);
    for (size_t i = 0; i < n; i++) {
        double e = run_error(&held_out2[i]);
        abs_e[i] = fabs(e);
        cr_assert_lt(abs_e[i], 1.0 / 3.0, "%s: %+.1f%%", held_out2[i].name,
                     100 * e);
    }
    qsort(abs_e, n, sizeof abs_e[0], dcmp);
    double med = n % 2 ? abs_e[n / 2] : (abs_e[n / 2 - 1] + abs_e[n / 2]) / 2;
    fprintf(stderr, "published held out (second set): %zu runs, median "
                    "|error| %.1f%%, max %.1f%%\n",
            n, 100 * med, 100 * abs_e[n - 1]);
}

/* DeepSpeed 0.3's ZeRO-3 rows: every one fits and stays under its MFU
 * bound; the model, with NCCL's rail bandwidth, is faster than they ran
 * (docs/STEP_TIME.md says by how much and why they are not used) */
Test(published, zero3_2021_rows_fit_and_are_reported, .timeout = 60)
{
    size_t n = sizeof zero3_2021 / sizeof zero3_2021[0];
    for (size_t i = 0; i < n; i++)
        cr_assert_lt(run_error(&zero3_2021[i]), 0.0, "%s",
                     zero3_2021[i].name);
}

/* The same rows as DeepSpeed's ZeRO-3 rank simulation sees them
 * (vp_cluster_ds_sim: the model's ops, zero.Init, FusedAdam, the knobs'
 * defaults, every layer checkpointed, no offload): each is simulated and
 * its allocated and reserved peaks printed; docs/DISTRIBUTED.md
 * "DeepSpeed ZeRO" gives the figures and what the source says of each
 * part. Every row fits, as it ran. */
Test(published, zero3_2021_rows_simulated_as_ran, .timeout = 120)
{
    size_t n = sizeof zero3_2021 / sizeof zero3_2021[0];
    for (size_t i = 0; i < n; i++) {
        const pubrun *r = &zero3_2021[i];
        vp_model *m = load(r->model);
        vp_cluster_model *cm = cmodel(m);
        vp_cluster c;
        run_cluster(&c, r);
        vp_par p = run_par(r);
        vp_plan_entry e;
        vp_error err;
        cr_assert_eq(vp_cluster_ds_sim(cm, &c, &p, &e, &err), VP_OK,
                     "%s: %s", r->name, err.msg);
        cr_assert(e.simulated, "%s", r->name);
        uint64_t alloc = e.mem.weights + e.mem.grads + e.mem.optimizer +
                         e.mem.activations + e.mem.transient;
        const vp_cluster_mem *k = &e.mem;
        fprintf(stderr, "published %-22s ZeRO-3 rank: allocated %.2f GiB, "
                        "total %.2f GiB of %.2f, %s; GB: total %.1f, "
                        "%.1f / %.1f / %.1f / %.1f / %.1f, overhead %.1f\n",
                r->name, (double)alloc / (1 << 30),
                (double)k->total / (1 << 30), (double)c.memory / (1 << 30),
                e.fits ? "fits" : "does not fit", k->total / 1e9,
                k->weights / 1e9, k->grads / 1e9, k->optimizer / 1e9,
                k->activations / 1e9, k->transient / 1e9, k->overhead / 1e9);
        cr_assert_lt(alloc, c.memory, "%s", r->name);
        cr_assert(e.fits, "%s: %.2f GiB", r->name,
                  (double)e.mem.total / (1 << 30));
        vp_cluster_model_free(cm);
        vp_model_free(m);
    }
}
