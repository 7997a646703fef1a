/* A Megatron-LM rank simulated (src/megatron.c, src/dist_megatron.c,
 * src/sim_pipe.c): the stage graphs of published layouts through the
 * simulator under the 1F1B schedule, against the cluster planner's fitted
 * per-GPU figure and Korthikanti et al.'s Table 2; the schedule's
 * micro-batches in flight; the Megatron model states. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/cluster.h"
#include "vramplan/vramplan.h"

#include "cluster_util.h"

#define T175 "tests/data/cluster/gpt3-175b.yaml"
#define T22 "tests/data/cluster/megatron-22b.yaml"
#define T530 "tests/data/cluster/turing-530b.yaml"
#define T1T "tests/data/cluster/megatron-1t.yaml"

static void gpu(vp_cluster *c, const char *name, uint32_t gpus)
{
    vp_error err;
    vp_gpu_profile *gp = vp_gpu_load(name, &err);
    cr_assert_not_null(gp, "%s", err.msg);
    vp_hw hw;
    vp_gpu_hw(gp, VP_GPU_BF16, &hw);
    vp_hw_fill_defaults(&hw);
    vp_gpu_free(gp);
    vp_cluster_init(c, &hw, gpus, 8);
}

static void a100(vp_cluster *c, uint32_t gpus)
{
    vp_error err;
    vp_gpu_profile *gp = vp_gpu_load("a100-80g", &err);
    cr_assert_not_null(gp, "%s", err.msg);
    vp_hw hw;
    vp_gpu_hw(gp, VP_GPU_BF16, &hw);
    vp_hw_fill_defaults(&hw);
    vp_gpu_free(gp);
    vp_cluster_init(c, &hw, gpus, 8);
}

/* The fitted per-GPU bytes before the allocator overhead, NCCL and the
 * context: what the simulation's peak allocated stands for. */
static double fitted_alloc(vp_cluster_model *cm, const vp_cluster *c,
                           const vp_par *p)
{
    vp_cluster_mem mem;
    vp_cluster_time t;
    vp_error err;
    cr_assert_eq(vp_cluster_eval(cm, c, p, &mem, &t, &err), VP_OK, "%s",
                 err.msg);
    return (double)(mem.total - mem.overhead - mem.nccl - mem.context);
}

/* GPT-3 175B on 1024 A100s in R 175B's layout: dp 8, t 8, p 16, one
 * micro-batch, full recomputation. */
typedef struct {
    vp_model *m;
    vp_cluster_model *cm;
    vp_cluster_model_info in;
    vp_cluster c;
    vp_par p;
} gpt3;

static void gpt3_open(gpt3 *f)
{
    f->m = load(T175);
    f->cm = cmodel(f->m);
    vp_cluster_model_info_get(f->cm, &f->in);
    a100(&f->c, 1024);
    f->p = par(8, 8, 16, VP_SHARD_MEGATRON);
}

/* Its layout under the interleaved schedule with v chunks, m
 * micro-batches. */
static vp_par gpt3_interleaved(const gpt3 *f, uint32_t v, uint64_t m)
{
    vp_par p = f->p;
    p.vpp = v;
    p.schedule = VP_SCHED_INTERLEAVED;
    p.accum = m;
    return p;
}

static void gpt3_close(gpt3 *f)
{
    vp_cluster_model_free(f->cm);
    vp_model_free(f->m);
}

/* One more micro-batch in flight: stage `stage` of p simulated at m = 2
 * (*a) and 3 (*b); the peak's growth. */
static double one_more(vp_cluster_model *cm, const vp_cluster *c, vp_par p,
                       uint32_t stage, vp_stage_sim *a, vp_stage_sim *b)
{
    p.accum = 2;
    sim_stage(cm, c, &p, stage, a);
    p.accum = 3;
    sim_stage(cm, c, &p, stage, b);
    return (double)b->peak_alloc - (double)a->peak_alloc;
}

typedef struct {
    const char *name, *model;
    uint32_t gpus, tp, pp;
    uint64_t gb, mb;
    uint32_t vpp;
    bool sp;
    vp_recompute rc;
} layout;

#define GPT(n) "tests/data/published/gpt-" n ".yaml"
#define FULL VP_RC_FULL
#define SEL VP_RC_SELECTIVE

/* The published Megatron layouts of tests/test_published.c (N1 Narayanan
 * et al. 2021 Table 1, R the Megatron-LM README's GPT-3, K5 Korthikanti
 * et al. 2022 Table 5, N2 PTD-P), here in bf16: 1F1B and interleaved,
 * full recomputation, or sequence parallelism with selective
 * recomputation (K5 "seqsel"). */
static const layout published[] = {
    {"N1 1.7B", GPT("1.7b"), 32, 1, 1, 512, 16, 1, false, FULL},
    {"N1 3.6B", GPT("3.6b"), 64, 2, 1, 512, 16, 1, false, FULL},
    {"N1 7.5B", GPT("7.5b"), 128, 4, 1, 512, 16, 1, false, FULL},
    {"N1 18.4B", GPT("18b"), 256, 8, 1, 1024, 8, 1, false, FULL},
    {"N1 39.1B", GPT("39b"), 512, 8, 2, 1536, 4, 1, false, FULL},
    {"N1 76.1B", GPT("76b"), 1024, 8, 4, 1792, 2, 3, false, FULL},
    {"N1 145.6B", GPT("145b"), 1536, 8, 8, 2304, 2, 2, false, FULL},
    {"N1 310.1B", GPT("310b"), 1920, 8, 16, 2160, 1, 2, false, FULL},
    {"N1 529.6B", T530, 2520, 8, 35, 2520, 1, 3, false, FULL},
    {"N1 1008B", T1T, 3072, 8, 64, 3072, 1, 1, false, FULL},
    {"R 175B", T175, 1024, 8, 16, 1536, 1, 1, false, FULL},
    {"K5 22B full", T22, 8, 8, 1, 4, 4, 1, false, FULL},
    {"K5 22B seqsel", T22, 8, 8, 1, 4, 4, 1, true, SEL},
    {"K5 175B full", T175, 64, 8, 8, 64, 1, 3, false, FULL},
    {"K5 175B seqsel", T175, 64, 8, 8, 64, 1, 3, true, SEL},
    {"K5 530B full", T530, 280, 8, 35, 280, 1, 3, false, FULL},
    {"K5 530B seqsel", T530, 280, 8, 35, 280, 1, 3, true, SEL},
    {"K5 1T full", T1T, 512, 8, 64, 512, 1, 1, false, FULL},
    {"K5 1T seqsel", T1T, 512, 8, 64, 512, 1, 1, true, SEL},
    {"N2 PTD-P 175B 384", T175, 384, 8, 12, 1536, 1, 1, false, FULL},
    {"N2 PTD-P 530B 560", T530, 560, 8, 35, 2240, 1, 1, false, FULL},
};

static vp_par layout_par(const layout *l, vp_sharding sh)
{
    vp_par p = par(l->gpus / (l->tp * l->pp), l->tp, l->pp, sh);
    p.micro_batch = l->mb;
    p.accum = l->gb / (p.dp * l->mb);
    p.vpp = l->vpp;
    p.schedule = l->vpp > 1 ? VP_SCHED_INTERLEAVED : VP_SCHED_1F1B;
    p.sp = l->sp;
    p.recompute = l->rc;
    return p;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* bf16 with Megatron's DDP: the fitted figure's assumptions hold (the
 * states 18 bytes a parameter, Korthikanti's per-layer bytes, the
 * micro-batches or model-chunk passes in flight, the embedding's mask),
 * so the larger of the first and the last stage agrees with the fit:
 * measured -12.44 % to +0.74 %, median |error| 0.49 %, within 2 % but
 * where the head's rank holds many logits: N1 1.7B, 3.6B, 7.5B (pp 1, 16
 * sequences of 51200 logits / t), 4.0-4.3 B a logit lower (the bound
 * below: 6 B). Above the fit by at most 0.74 % (N1 529.6B, interleaved:
 * the fit's fractional chunks in flight). */
Test(megatron, published_bf16_agree_with_the_fit, .timeout = 60)
{
    size_t n = sizeof published / sizeof published[0];
    double abs_e[sizeof published / sizeof published[0]];
    for (size_t i = 0; i < n; i++) {
        const layout *l = &published[i];
        vp_model *m = load(l->model);
        vp_cluster_model *cm = cmodel(m);
        vp_cluster c;
        a100(&c, l->gpus);
        vp_par p = layout_par(l, VP_SHARD_MEGATRON);
        double fit = fitted_alloc(cm, &c, &p);
        vp_stage_sim first, last;
        sim_stage(cm, &c, &p, 0, &first);
        sim_stage(cm, &c, &p, p.pp - 1, &last);
        double worst = (double)(first.peak_alloc > last.peak_alloc
                                    ? first.peak_alloc
                                    : last.peak_alloc);
        double e = worst / fit - 1;
        fprintf(stderr, "%-20s fit %6.2f GB  simulated first %6.2f last "
                        "%6.2f GB (%+.2f%%)\n",
                l->name, fit / 1e9, first.peak_alloc / 1e9,
                last.peak_alloc / 1e9, 100 * e);
        /* the fit's head is the model's own cross entropy (Hugging Face:
         * at its backward the fp32 log-probabilities and two fp32
         * gradients, 12 B a logit), Megatron's keeps exp_logits in fp32
         * and makes the gradient in the logits' dtype (6 B): up to 6 B
         * a logit of the head's rank, b s V/t, lower */
        vp_cluster_model_info in;
        vp_cluster_model_info_get(cm, &in);
        double rc = (double)l->mb * (double)in.seq *
                    ceil((double)in.vocab / l->tp);
        double lo = -6 * rc / fit - 0.02;
        cr_assert(e > lo && e < 0.01, "%s: %+.2f%% (from %+.2f%%)", l->name,
                  100 * e, 100 * lo);
        abs_e[i] = fabs(e);
        vp_cluster_model_free(cm);
        vp_model_free(m);
    }
    qsort(abs_e, n, sizeof abs_e[0], dcmp);
    cr_assert_lt(abs_e[n / 2], 0.01, "median |error| %.2f%%",
                 100 * abs_e[n / 2]);
}

/* The published Megatron layouts ran on 80 GB A100s in fp16: every
 * simulated stage that differs (first, first middle, last) fits there,
 * its total (reserved bytes, NCCL, context) within the planner's usable
 * memory. */
Test(megatron, published_fp16_runs_fit_simulated, .timeout = 60)
{
    for (size_t i = 0; i < sizeof published / sizeof published[0]; i++) {
        const layout *l = &published[i];
        vp_model *m = load(l->model);
        vp_cluster_model *cm = cmodel(m);
        vp_cluster c;
        a100(&c, l->gpus);
        vp_par p = layout_par(l, VP_SHARD_MEGATRON);
        p.dtype = VP_DT_FP16;
        uint32_t st[3] = {0, 1, p.pp - 1};
        for (uint32_t k = 0; k < 3; k++) {
            if (st[k] >= p.pp)
                continue;
            vp_stage_sim r;
            sim_stage(cm, &c, &p, st[k], &r);
            cr_assert_leq(r.total, c.memory, "%s stage %u: %.2f GB", l->name,
                          st[k], r.total / 1e9);
        }
        vp_cluster_model_free(cm);
        vp_model_free(m);
    }
}

/* One more micro-batch in flight on the first stage adds exactly what
 * Korthikanti et al. count under full recomputation: each layer's input
 * 2sbh (not divided by t without sequence parallelism) and the
 * embedding's dropout mask sbh and token ids 8sb (Megatron's
 * theoretical_memory_usage.py); with sequence parallelism (section
 * 4.2.2: the residual stream, norms and dropouts on s/t tokens) 2sbh/t
 * and sbh/t, the token ids whole (every rank reads them);
 * on a middle stage the layers' inputs alone (the first the received
 * hidden states). 1F1B keeps min(p - s, m) micro-batches. */
Test(megatron, one_more_micro_batch_in_flight_korthikanti_full)
{
    gpt3 f;
    gpt3_open(&f);
    vp_par p = f.p;
    double sbh = (double)f.in.seq * (double)f.in.hidden;
    for (int sp = 0; sp < 2; sp++) {
        p.sp = sp;
        double d = sp ? p.tp : 1; /* sequence parallelism: s/t tokens */
        for (uint32_t stage = 0; stage < 2; stage++) {
            vp_stage_sim a, b;
            double got = one_more(f.cm, &f.c, p, stage, &a, &b);
            cr_assert_eq(a.in_flight, 2u);
            cr_assert_eq(b.in_flight, 3u);
            double want = a.layers * 2 * sbh / d +
                          (stage == 0 ? sbh / d + 8.0 * f.in.seq : 0);
            cr_assert_eq(got, want, "sp %d stage %u: %.0f vs %.0f", sp,
                         stage, got, want);
        }
    }
    gpt3_close(&f);
}

/* Without recomputation a middle stage's micro-batch keeps, per layer,
 * Korthikanti et al.'s Table 2 row "sequence parallel": 34sbh/t +
 * 5as^2b/t (the norms' fp32 mean and rstd, 2 x 8sb/t, on top: the
 * paper leaves them out). */
Test(megatron_sp, korthikanti_table2_per_layer)
{
    gpt3 f;
    gpt3_open(&f);
    vp_par p = f.p;
    p.sp = true;
    p.recompute = VP_RC_NONE;
    double s = (double)f.in.seq, h = (double)f.in.hidden, t = 8;
    double a_ = (double)f.in.heads;
    vp_stage_sim x, y;
    double layer = 34 * s * h / t + 5 * a_ * s * s / t + 2 * 8 * s / t;
    double got = one_more(f.cm, &f.c, p, 1, &x, &y);
    cr_assert_eq(got, x.layers * layer, "%.0f vs %.0f", got,
                 x.layers * layer);
    gpt3_close(&f);
}

/* Stage s of p holds min(p - s, m) forwards: the last stage one; a
 * stage past the last is refused. */
Test(megatron, in_flight_per_stage)
{
    gpt3 f;
    gpt3_open(&f);
    vp_par p = f.p;
    p.accum = 64;
    uint32_t want[] = {16, 15, 8, 1};
    uint32_t st[] = {0, 1, 8, 15};
    for (int i = 0; i < 4; i++) {
        vp_stage_sim r;
        sim_stage(f.cm, &f.c, &p, st[i], &r);
        cr_assert_eq(r.in_flight, want[i], "stage %u", st[i]);
        cr_assert_eq(r.layers, 6u);
    }
    vp_stage_sim r;
    vp_error err;
    cr_assert_eq(vp_cluster_stage_sim(f.cm, &f.c, &p, 16, &r, &err), VP_EARG);
    gpt3_close(&f);
}

/* Megatron's states at the peak, bf16: 2 B parameters (and buffers), the 4 B fp32
 * gradient buffer, 12 B of fp32 master and Adam moments (+ the fused
 * Adam's 4 B step count); the distributed optimizer divides the 12 B by
 * dp (padded up). */
Test(megatron, model_states_ddp_and_distributed_optimizer)
{
    vp_model *m = load(T22);
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c;
    a100(&c, 64);
    for (int k = 0; k < 2; k++) {
        vp_par p = par(8, 8, 1, k ? VP_SHARD_DISTOPT : VP_SHARD_MEGATRON);
        vp_stage_sim r;
        sim_stage(cm, &c, &p, 0, &r);
        uint64_t P = r.params, d = k ? 8 : 1;
        /* the parameters' 2 B, and the model's non-trainable buffers */
        cr_assert_geq(r.by_category[VP_CAT_PARAM], 2 * P);
        cr_assert_lt(r.by_category[VP_CAT_PARAM], 2 * P + 2 * P / 100);
        /* the buffer, and the 2 B .grad of the parameters whose
         * post-hook has not run yet at the peak (it falls in the head's
         * and embedding's backward: their vocab/t x h gradients) */
        cr_assert_geq(r.by_category[VP_CAT_GRAD], 4 * P);
        cr_assert_lt(r.by_category[VP_CAT_GRAD], 4 * P + 5 * P / 100);
        /* P counts every parameter the graph names; the buffer the
         * trainable ones (within 0.03 % on this model) */
        double want = 12.0 * (double)((P + d - 1) / d) + 4;
        cr_assert(fabs((double)r.by_category[VP_CAT_OPTIM] / want - 1) <
                      5e-4,
                  "%llu vs %.0f",
                  (unsigned long long)r.by_category[VP_CAT_OPTIM], want);
    }
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* --optimizer-cpu-offload (HybridDeviceOptimizer, offload fraction 1):
 * the fp32 master shard and the Adam moments live on the host, the
 * device keeps the 2 B parameters and the 4 B gradient buffer; the
 * activations are those of the same layout without offload. */
Test(megatron, optimizer_cpu_offload_keeps_params_and_grads)
{
    vp_model *m = load(T22);
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c;
    a100(&c, 64);
    vp_par p = par(8, 8, 1, VP_SHARD_DISTOPT);
    vp_stage_sim on, off;
    sim_stage(cm, &c, &p, 0, &off);
    p.offload = VP_OFFLOAD_OPTIMIZER;
    sim_stage(cm, &c, &p, 0, &on);
    cr_assert_eq(on.by_category[VP_CAT_OPTIM], 0u);
    cr_assert_eq(on.by_category[VP_CAT_PARAM],
                 off.by_category[VP_CAT_PARAM]);
    cr_assert_eq(on.by_category[VP_CAT_GRAD], off.by_category[VP_CAT_GRAD]);
    cr_assert_eq(on.by_category[VP_CAT_ACT], off.by_category[VP_CAT_ACT]);
    cr_assert_eq(off.peak_alloc - on.peak_alloc,
                 off.by_category[VP_CAT_OPTIM]);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* fp16: the gradient buffer in fp16 (bf16 alone forces fp32
 * accumulation), and the optimizer step's fp32 copies of the main
 * gradients (main_grad.float()) on top of the states. */
Test(megatron, fp16_main_grads_at_the_step)
{
    vp_model *m = load(T22);
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c;
    a100(&c, 8);
    vp_par p = par(1, 8, 1, VP_SHARD_MEGATRON);
    p.dtype = VP_DT_FP16;
    p.micro_batch = 1;
    vp_stage_sim r;
    sim_stage(cm, &c, &p, 0, &r);
    uint64_t P = r.params;
    cr_assert_eq(r.by_category[VP_CAT_GRAD], 2 * P);
    /* without activations the step's moment is the peak: 2 + 2 + 12 + 4 */
    cr_assert_geq(r.peak_alloc, 20 * P);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* What the simulated path does not model yet is refused by name. */
Test(megatron, unsupported_layouts_are_named)
{
    vp_model *m = load("models/mixtral-8x7b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c;
    gpu(&c, "h100-80g", 64);
    vp_par p = par(8, 8, 1, VP_SHARD_MEGATRON);
    vp_stage_sim r;
    vp_error err;
    cr_assert_eq(vp_cluster_stage_sim(cm, &c, &p, 0, &r, &err),
                 VP_EUNSUPPORTED, "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "mixture-of-experts"), "%s",
                       err.msg);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* Context parallelism: a rank's micro-batch keeps what the same stage
 * keeps at s/cp tokens without it (Transformer Engine's ring saves q, the
 * last kv received, the output and the logsumexp: the bytes of q, k, v,
 * out and logsumexp at s/cp), here Llama 3 8B, tp 8, pp 4, cp 2, no
 * recomputation, a middle stage; the ring's buffers are transient: the
 * cp rank's peak is not below the half-sequence one. */
Test(megatron_cp, micro_batch_keeps_the_s_over_cp_bytes)
{
    vp_model *m = load("models/llama-3-8b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_error err;
    vp_cluster_model *half = vp_cluster_model_new(m, 4096, &err);
    cr_assert_not_null(half, "%s", err.msg);
    vp_cluster c;
    gpu(&c, "h100-80g", 128);
    vp_par p = par(2, 8, 4, VP_SHARD_MEGATRON);
    p.cp = 2;
    p.recompute = VP_RC_NONE;
    vp_par q = p;
    q.cp = 1;
    q.dp = 4;
    vp_stage_sim a2, a3, h2, h3;
    double cpd = one_more(cm, &c, p, 1, &a2, &a3);
    double hd = one_more(half, &c, q, 1, &h2, &h3);
    cr_assert_eq(cpd, hd);
    cr_assert_geq(a3.peak_alloc, h3.peak_alloc);
    vp_cluster_model_free(half);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* Megatron's default split needs a stage's layers divisible by vpp
 * (arguments.py); its explicit layout (--pipeline-model-parallel-layout)
 * places any count per virtual stage. A stage of 6 layers in 4 chunks
 * runs chunks of 2, 2, 1 and 1 layers, each pass in flight keeping its
 * chunk's layers' inputs (full recomputation). */
Test(megatron_interleaved, unequal_chunks_first_heavier)
{
    gpt3 f;
    gpt3_open(&f);
    vp_stage_sim two, four;
    vp_par p = gpt3_interleaved(&f, 2, 16);
    sim_stage(f.cm, &f.c, &p, 15, &two);
    p.vpp = 4;
    sim_stage(f.cm, &f.c, &p, 15, &four);
    cr_assert_eq(four.layers, 6u);
    cr_assert_eq(four.chunks, 4u);
    /* the last rank: (4 - 1) 16 + 1 = 49 passes of 64 in flight, against
     * 17 of 32 with two chunks */
    cr_assert_eq(four.in_flight, 49u);
    cr_assert_eq(two.in_flight, 17u);
    double sbh = (double)f.in.seq * (double)f.in.hidden;
    /* at the first backward (the head's, on the last chunk): 16 passes
     * of each of the first three chunks and the last chunk's one, 16 x
     * (2 + 2 + 1) + 1 = 81 layers' inputs, against 16 x 3 + 3 = 51 */
    cr_assert_eq((double)four.peak_alloc - (double)two.peak_alloc,
                 30 * 2 * sbh);
    gpt3_close(&f);
}

/* Rank s of p with v chunks runs (p - s - 1) 2 + (v - 1) p warm-up
 * passes (schedules.py, forward_backward_pipelining_with_interleaving):
 * that many plus one model-chunk passes in flight, all m v of them when
 * that is fewer. */
Test(megatron_interleaved, passes_in_flight_per_stage)
{
    gpt3 f;
    gpt3_open(&f);
    vp_par p = gpt3_interleaved(&f, 2, 64);
    uint32_t want[] = {47, 45, 31, 17};
    uint32_t st[] = {0, 1, 8, 15};
    for (int i = 0; i < 4; i++) {
        vp_stage_sim r;
        sim_stage(f.cm, &f.c, &p, st[i], &r);
        cr_assert_eq(r.in_flight, want[i], "stage %u: %u", st[i],
                     r.in_flight);
        cr_assert_eq(r.chunks, 2u);
    }
    p.accum = 16; /* 32 passes, fewer than stage 1's 44 + 1 */
    vp_stage_sim r;
    sim_stage(f.cm, &f.c, &p, 1, &r);
    cr_assert_eq(r.in_flight, 32u);
    gpt3_close(&f);
}

/* Each model-chunk pass in flight on a middle rank keeps its chunk's
 * layers' inputs under full recomputation, L_s/v x 2sbh: stage 1 of 16
 * with v = 2 holds 32 passes at m = 16 and 45 at m = 32, 13 x 3 layers x
 * 2sbh apart. */
Test(megatron_interleaved, chunk_passes_keep_their_layers_inputs)
{
    gpt3 f;
    gpt3_open(&f);
    vp_stage_sim a, b;
    vp_par p = gpt3_interleaved(&f, 2, 16);
    sim_stage(f.cm, &f.c, &p, 1, &a);
    p.accum = 32;
    sim_stage(f.cm, &f.c, &p, 1, &b);
    double sbh = (double)f.in.seq * (double)f.in.hidden;
    double want = (double)(b.in_flight - a.in_flight) * (a.layers / 2) * 2 *
                  sbh;
    cr_assert_eq((double)(b.peak_alloc - a.peak_alloc), want, "%llu vs %.0f",
                 (unsigned long long)(b.peak_alloc - a.peak_alloc), want);
    gpt3_close(&f);
}

/* The search simulates its candidates where the simulated rank stands for
 * Megatron's: the best plan of a pinned published layout (R 175B, no
 * sequence parallelism, 1F1B) reports the most loaded simulated stage. */
Test(megatron_search, best_plan_memory_from_the_simulation)
{
    vp_model *m = load(T175);
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c;
    a100(&c, 1024);
    vp_search_opts o;
    vp_search_opts_init(&o);
    o.global_batch = 1536;
    o.tp = 8;
    o.pp = 16;
    o.cp = 1;
    o.vpp = 1;
    o.sp = 0;
    o.micro_batch = 1;
    o.recompute = VP_RC_FULL;
    o.sharding = VP_SHARD_MEGATRON;
    o.dtypes[VP_DT_BF16] = true;
    vp_cluster_plan pl;
    vp_error err;
    cr_assert_eq(vp_cluster_search(cm, &c, &o, &pl, &err), VP_OK, "%s",
                 err.msg);
    cr_assert(pl.found);
    cr_assert(pl.best.simulated);
    cr_assert(pl.best.fits);
    uint64_t worst = 0;
    uint32_t at = 0;
    for (uint32_t s = 0; s < 16; s++) {
        vp_stage_sim r;
        sim_stage(cm, &c, &pl.best.par, s, &r);
        if (r.total > worst) {
            worst = r.total;
            at = s;
        }
    }
    cr_assert_eq(pl.best.mem.total, worst);
    cr_assert_eq(pl.best.mem.stage, at);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* Korthikanti et al.'s count of what one layer of a decoder saves for
 * its backward (section 4.1, table 2: 34sbh + 5as^2b without parallelism)
 * written for any decoder as Megatron's fused kernels run it (b = 1, no
 * sequence parallelism, the flash kernel: no scores): replicated on the t
 * ranks, the two norms' inputs, the two column-parallel linears' inputs
 * (the norms' outputs), the two dropout masks (1 B, when there is
 * dropout); split, q, k, v (kept by the attention kernel), its output
 * (linear_proj's input), the MLP's fc1 output (the activation's input:
 * gate and up, 2f, for a gated MLP) and fc2's input; plus what the paper
 * leaves out, the kernel's fp32 logsumexp and the norms' fp32 statistics
 * per token (mean and rstd, or rstd), and the dropout's random state. */
static double korthikanti_layer(const vp_cluster_model_info *in, double t)
{
    double s = (double)in->seq, h = (double)in->hidden;
    double a = (double)in->heads / t, d = (double)in->head_dim;
    double kv = in->kv_heads >= t ? (double)in->kv_heads / t : 1;
    double f = (double)in->ffn / t;
    double rep = 2 * (2 * s * h) + 2 * (2 * s * h) +
                 (in->hidden_dropout > 0 ? 2 * s * h : 0);
    double split = 2 * s * (a * d + 2 * kv * d) + 2 * s * a * d +
                   2 * s * (in->gated_mlp ? 3 * f : 2 * f);
    double stats = a * s * 4 + (in->rmsnorm ? 2 : 4) * s * 4;
    /* with attention dropout the kernel's philox seed and offset, 8 B
     * each, 512 B blocks */
    double rng = in->attn_dropout > 0 ? 2 * 512 : 0;
    return rep + split + stats + rng;
}

/* The stage graph is built in the Megatron op flavour (fused norms,
 * fused SwiGLU or bias-GELU, Transformer Engine's attention, vocab-
 * parallel cross entropy) whatever form the model's own ops take (Hugging
 * Face's GPT-2: Python tanh GELU, a packed Conv1D projection; Llama 3:
 * Python RMSNorm, separate gate and up projections, SDPA): a micro-batch
 * in flight on a middle stage (1 of 4, m = 2 to 3) keeps exactly the
 * count above, layer by layer, at t = 1, 2 and 4. */
Test(megatron_flavour, a_micro_batch_keeps_korthikanti_count)
{
    const char *models[] = {"models/gpt2-medium.yaml",
                            "models/llama-3-8b.yaml"};
    for (int k = 0; k < 2; k++) {
        vp_model *m = load(models[k]);
        vp_cluster_model *cm = cmodel(m);
        vp_cluster_model_info in;
        vp_cluster_model_info_get(cm, &in);
        for (uint32_t t = 1; t <= 4; t *= 2) {
            vp_cluster c;
            gpu(&c, "h100-80g", 4 * t);
            vp_par p = par(1, t, 4, VP_SHARD_MEGATRON);
            p.recompute = VP_RC_NONE;
            vp_stage_sim a, b;
            double got = one_more(cm, &c, p, 1, &a, &b);
            double want = a.layers * korthikanti_layer(&in, t);
            cr_assert_eq(got, want, "%s t %u: %.0f vs %.0f", models[k], t,
                         got, want);
        }
        vp_cluster_model_free(cm);
        vp_model_free(m);
    }
}

/* fp8 (Transformer Engine, --fp8-format): a layer's linears save the
 * fp8 cast of their inputs, 1 B an element, where bf16 keeps 2; the
 * fused attention keeps its own bf16 output, linear_proj the fp8 cast of
 * it; the fused SwiGLU its bf16 input. So a middle stage's micro-batch
 * (Llama 3 8B, t 2, pp 4, stage 1, no recomputation) keeps Korthikanti's
 * count less 1 B for each of the four linear inputs (qkv and fc1: the
 * norms' outputs, replicated; fc2: f/t) and plus 1 B for the attention
 * output; and every module of fp8 linears has its scaling metadata, its
 * weights being fp8 parameters (fp8_param_gather: no cached copy). */
Test(megatron_fp8, linear_inputs_in_one_byte)
{
    vp_model *m = load("models/llama-3-8b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_cluster c;
    gpu(&c, "h100-80g", 8);
    vp_par p = par(1, 2, 4, VP_SHARD_MEGATRON);
    p.recompute = VP_RC_NONE;
    vp_stage_sim a, b;
    double bf = one_more(cm, &c, p, 1, &a, &b);
    p.dtype = VP_DT_FP8;
    vp_stage_sim a8, b8;
    double f8 = one_more(cm, &c, p, 1, &a8, &b8);
    double s = (double)in.seq, h = (double)in.hidden, t = 2;
    double qd = (double)in.heads * (double)in.head_dim / t;
    double f = (double)in.ffn / t;
    double per_layer = -(2 * s * h) - s * f + s * qd;
    cr_assert_eq(bf, a.layers * korthikanti_layer(&in, t));
    cr_assert_eq(f8 - bf, a.layers * per_layer, "%.0f vs %.0f", f8 - bf,
                 a.layers * per_layer);
    /* the four modules' scaling metadata, six fp32 tensors of at most 3
     * elements each (a 512-B block) */
    cr_assert_eq(a.by_category[VP_CAT_CAST], 0u);
    cr_assert_eq((double)a8.by_category[VP_CAT_CAST],
                 a8.layers * (4 * 6 * 512));
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* The search simulates its Megatron candidates through the flavour: a
 * GPT-2's best plan reports its simulated rank. */
Test(megatron_search, gpt2_best_plan_simulated)
{
    vp_model *m = load("models/gpt2-medium.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c;
    a100(&c, 8);
    vp_search_opts o;
    vp_search_opts_init(&o);
    o.tp = 1;
    o.pp = 1;
    o.sharding = VP_SHARD_DISTOPT;
    vp_cluster_plan pl;
    vp_error err;
    cr_assert_eq(vp_cluster_search(cm, &c, &o, &pl, &err), VP_OK, "%s",
                 err.msg);
    cr_assert(pl.found);
    cr_assert(pl.best.simulated);
    vp_stage_sim r;
    sim_stage(cm, &c, &pl.best.par, 0, &r);
    cr_assert_eq(pl.best.mem.total, r.total);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- the 1F1B schedule through vp_simulate (sim_pipe.c) ---------------- */

static vp_estimate pipe_run(const char *model, uint32_t stages,
                            uint32_t stage, uint32_t accum)
{
    vp_model *m = load(model);
    vp_error err;
    vp_graph *g = vp_graph_build(m, 2, 512, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = VP_DIST_MEGATRON_DISTOPT;
    d.world = 4;
    vp_pipeline pl = {stages, stage, 1, false};
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 2;
    s.seq = 512;
    s.precision = VP_PREC_BF16;
    s.optimizer = VP_OPT_ADAMW_FUSED;
    s.accum = accum;
    s.steps = 2;
    s.skip_breakdown = true;
    s.dist = &d;
    s.pipe = &pl;
    vp_estimate e;
    cr_assert_eq(vp_simulate(g, &s, &e, NULL, NULL, &err), VP_OK, "%s",
                 err.msg);
    vp_graph_free(g);
    vp_model_free(m);
    return e;
}

/* After the warm-up and the first steady 1F1B pair the peaks repeat
 * (the same micro-batches' tensors in flight), up to the allocator's
 * block reuse: measured on GPT-2 small, stage 1 of 4 (w = 2), the same
 * peaks from m = 3 to 7, and 192,512 B more from m = 8 (0.005 %). */
Test(megatron_pipe, steady_pairs_repeat)
{
    vp_estimate a = pipe_run("models/gpt2-small.yaml", 4, 1, 3);
    for (uint32_t m = 4; m <= 7; m++) {
        vp_estimate b = pipe_run("models/gpt2-small.yaml", 4, 1, m);
        cr_assert_eq(a.peak_alloc, b.peak_alloc, "m %u", m);
        cr_assert_eq(a.peak_reserved, b.peak_reserved, "m %u", m);
    }
    vp_estimate c = pipe_run("models/gpt2-small.yaml", 4, 1, 8);
    cr_assert_eq(c.peak_alloc - a.peak_alloc, 192512u);
}

Test(megatron_pipe, bad_stage_and_inference_refused)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_error err;
    vp_graph *g = vp_graph_build(m, 1, 128, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_pipeline pl = {2, 2, 1, false};
    vp_setup s;
    vp_setup_init(&s);
    s.seq = 128;
    s.pipe = &pl;
    vp_estimate e;
    cr_assert_eq(vp_simulate(g, &s, &e, NULL, NULL, &err), VP_EARG);
    cr_assert_not_null(strstr(err.msg, "stage 2"), "%s", err.msg);
    pl.stage = 0;
    s.inference = true;
    cr_assert_eq(vp_simulate(g, &s, &e, NULL, NULL, &err), VP_EARG);
    vp_graph_free(g);
    vp_model_free(m);
}
