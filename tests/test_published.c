/* Published figures the cluster planner must reproduce: the ZeRO paper's
 * model-state bytes, Megatron-LM's bytes per parameter, Korthikanti et
 * al.'s activation bytes per layer (Table 2), the pipeline bubble and
 * 1F1B's micro-batches in flight, and Calculon's validation set
 * (Korthikanti et al.'s measured step times, Table 5). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/cluster.h"
#include "vramplan/vramplan.h"

#define GB 1e9

static vp_model *load(const char *path)
{
    vp_error err;
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s: %s", path, err.msg);
    return m;
}

static vp_cluster_model *cmodel(vp_model *m)
{
    vp_error err;
    vp_cluster_model *cm = vp_cluster_model_new(m, 0, &err);
    cr_assert_not_null(cm, "%s", err.msg);
    return cm;
}

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

static vp_par par(uint32_t dp, uint32_t tp, uint32_t pp, vp_sharding sh)
{
    vp_par p;
    memset(&p, 0, sizeof p);
    p.dp = dp;
    p.tp = tp;
    p.pp = pp;
    p.cp = 1;
    p.ep = 1;
    p.vpp = 1;
    p.schedule = VP_SCHED_1F1B;
    p.micro_batch = 1;
    p.accum = 1;
    p.dtype = VP_DT_BF16;
    p.recompute = VP_RC_FULL;
    p.sharding = sh;
    return p;
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

Test(megatron, bytes_per_parameter)
{
    vp_model *m = load("tests/data/cluster/megatron-22b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_hw hw;
    a100(&hw);
    const uint32_t ds[] = {2, 8, 64};
    for (size_t i = 0; i < 3; i++) {
        uint32_t d = ds[i];
        vp_cluster c;
        vp_cluster_init(&c, &hw, d, 8);
        vp_error err;
        vp_cluster_mem mem;
        vp_par p = par(d, 1, 1, VP_SHARD_MEGATRON);
        cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, NULL, &err), VP_OK,
                     "%s", err.msg);
        double per = (double)(mem.weights + mem.grads + mem.optimizer) /
                     (double)in.params;
        cr_assert_float_eq(per, 18.0, 1e-6);
        p.sharding = VP_SHARD_DISTOPT;
        cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, NULL, &err), VP_OK,
                     "%s", err.msg);
        per = (double)(mem.weights + mem.grads + mem.optimizer) /
              (double)in.params;
        cr_assert_float_eq(per, 6.0 + 12.0 / d, 1e-6, "d %u: %g", d, per);
    }
    vp_cluster_model_free(cm);
    vp_model_free(m);
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

/* ---- Calculon's validation set: Korthikanti et al., Table 5 ----------- */

/* Shapes and batches: calculon-ai/calculon validation/seqsel/tab5/MODEL_MODE.json
 * (fp16; full = full recompute with tensor-parallel all-reduces, seqsel =
 * sequence parallelism + selective recompute); measured seconds per step
 * from calculon/llm/validation.py (kProfile of seqsel_tab5). */
static const struct {
    const char *file;
    uint32_t gpus, pp, vpp;
    uint64_t batch, micro;
    double full_s, seqsel_s;
} tab5[] = {
    {"tests/data/cluster/megatron-22b.yaml", 8, 1, 1, 4, 4, 1.42, 1.10},
    {"tests/data/cluster/gpt3-175b.yaml", 64, 8, 3, 64, 1, 18.13, 13.75},
    {"tests/data/cluster/turing-530b.yaml", 280, 35, 3, 280, 1, 49.05,
     37.83},
    {"tests/data/cluster/megatron-1t.yaml", 512, 64, 1, 512, 1, 94.42,
     71.49},
};

Test(calculon, table5_step_times)
{
    double sum = 0, worst = 0;
    int n = 0;
    for (size_t i = 0; i < sizeof tab5 / sizeof tab5[0]; i++) {
        vp_model *m = load(tab5[i].file);
        vp_cluster_model *cm = cmodel(m);
        vp_hw hw;
        a100(&hw);
        vp_cluster c;
        vp_cluster_init(&c, &hw, tab5[i].gpus, 8);
        for (int mode = 0; mode < 2; mode++) {
            vp_par p = par(1, 8, tab5[i].pp, VP_SHARD_MEGATRON);
            p.dtype = VP_DT_FP16;
            p.vpp = tab5[i].vpp;
            p.schedule = tab5[i].vpp > 1 ? VP_SCHED_INTERLEAVED
                                         : VP_SCHED_1F1B;
            p.micro_batch = tab5[i].micro;
            p.accum = tab5[i].batch / tab5[i].micro;
            p.sp = mode == 1;
            p.recompute = mode ? VP_RC_SELECTIVE : VP_RC_FULL;
            vp_cluster_time t;
            vp_cluster_mem mem;
            vp_error err;
            cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, &t, &err), VP_OK,
                         "%s", err.msg);
            double meas = mode ? tab5[i].seqsel_s : tab5[i].full_s;
            double e = 100 * (t.step / meas - 1);
            fprintf(stderr, "calculon-validation %-40s %-6s vramplan %7.2f s "
                            "measured %6.2f s error %+6.2f%%\n",
                    tab5[i].file, mode ? "seqsel" : "full", t.step, meas, e);
            sum += fabs(e);
            worst = fabs(e) > worst ? fabs(e) : worst;
            n++;
            /* every case fits the 80 GB the paper ran on */
            cr_assert(vp_cluster_fits(&c, &mem), "%s does not fit: %.1f GiB",
                      tab5[i].file, (double)mem.total / (1 << 30));
        }
        vp_cluster_model_free(cm);
        vp_model_free(m);
    }
    fprintf(stderr, "calculon-validation mean |error| %.2f%%, max %.2f%% "
                    "(Calculon: 3.65%%, 8.87%%)\n",
            sum / n, worst);
    cr_assert(worst < 10.0, "max error %.2f%%", worst);
    cr_assert(sum / n < 5.0, "mean error %.2f%%", sum / n);
}
