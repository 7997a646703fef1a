/* Benchmark of the cluster planner (make bench), on one core.
 *
 * The full plan: llama-3.1-405b on 1024 x h100-80g with every option of
 * the search enabled (all precisions the GPU has, all engines, offload),
 * timed cold (the per-model precomputation and its simulations included)
 * and warm; the configurations evaluated per second. Baselines measured
 * in the same run: one step of the single-GPU simulator (gpt2-small), and
 * the public per-configuration API (vp_cluster_eval: checks, cache lookup,
 * context set-up) over the same kind of configurations. Everything is
 * printed as figures and ratios; nothing passes or fails. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vramplan/cluster.h"
#include "vramplan/gpu.h"
#include "vramplan/vramplan.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int die(const char *what, const vp_error *err)
{
    fprintf(stderr, "bench: %s: %s\n", what, err->msg);
    return 1;
}

static void gpu(vp_hw *hw)
{
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load("h100-80g", &err);
    if (p) {
        vp_gpu_hw(p, VP_GPU_BF16, hw);
        vp_gpu_free(p);
    } else { /* the datasheet, should the profiles be missing */
        memset(hw, 0, sizeof *hw);
        strcpy(hw->name, "h100-80g");
        hw->memory = 80ull << 30;
        hw->fp32 = 67e12;
        hw->bf16 = hw->fp16 = 989.4e12;
        hw->fp8 = 1978.9e12;
        hw->hbm = 3.35e12;
        hw->host = 55e9;
        hw->nvlink = 450e9;
    }
    vp_hw_fill_defaults(hw);
}

/* One single-GPU simulated step of gpt2-small (batch 8, seq 1024). */
static double simulate_once(void)
{
    vp_error err;
    vp_model *m = vp_model_load("models/gpt2-small.yaml", &err);
    if (!m)
        return -1;
    vp_graph *g = vp_graph_build(m, 8, 1024, &err);
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    s.precision = VP_PREC_AMP_BF16;
    s.steps = 1;
    vp_estimate e;
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        double t0 = now();
        vp_simulate(g, &s, &e, NULL, NULL, &err);
        double t = now() - t0;
        if (t < best)
            best = t;
    }
    vp_graph_free(g);
    vp_model_free(m);
    return best;
}

int main(void)
{
    vp_error err;
    vp_hw hw;
    gpu(&hw);
    vp_model *m = vp_model_load("models/llama-3.1-405b.yaml", &err);
    if (!m)
        return die("models/llama-3.1-405b.yaml", &err);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 1024, 8);
    vp_search_opts o;
    vp_search_opts_init(&o);
    for (int i = 0; i < VP_DT__COUNT; i++)
        o.dtypes[i] = true; /* those the GPU lacks drop out */
    o.top = VP_CLUSTER_TOP;
    vp_cluster_plan *pl = malloc(sizeof *pl);
    if (!pl)
        return 1;

    /* cold: precomputation + simulations + search */
    double t0 = now();
    vp_cluster_model *cm = vp_cluster_model_new(m, 0, &err);
    if (!cm)
        return die("model", &err);
    if (vp_cluster_search(cm, &c, &o, pl, &err) != VP_OK)
        return die("search", &err);
    double cold = now() - t0;
    uint32_t sims = pl->sims;

    /* warm: the search alone, best of 5 */
    double warm = 1e30;
    for (int i = 0; i < 5; i++) {
        t0 = now();
        if (vp_cluster_search(cm, &c, &o, pl, &err) != VP_OK)
            return die("search", &err);
        double t = now() - t0;
        if (t < warm)
            warm = t;
    }
    uint64_t evaluated = pl->evaluated, pruned = pl->pruned;
    double rate = (double)evaluated / warm;
    double rate_all = (double)(evaluated + pruned) / warm;

    /* baseline: the public API per configuration, over the layouts the
     * search evaluates (micro-batch, schedule and recomputation varied) */
    uint64_t n_api = 0;
    double api_t = 0;
    {
        const uint32_t tps[] = {1, 2, 4, 8};
        const uint32_t pps[] = {8, 16, 32};
        vp_cluster_mem mem;
        vp_cluster_time tm;
        t0 = now();
        for (int rep = 0; rep < 200; rep++)
            for (size_t a = 0; a < 4; a++)
                for (size_t b = 0; b < 3; b++)
                    for (int rc = 0; rc < VP_RC__COUNT; rc++)
                        for (uint64_t mb = 1; mb <= 4; mb *= 2) {
                            vp_par p;
                            memset(&p, 0, sizeof p);
                            p.tp = tps[a], p.pp = pps[b], p.cp = 1, p.ep = 1;
                            p.dp = 1024 / (p.tp * p.pp);
                            if (512 % (p.dp * mb))
                                continue;
                            p.vpp = 1;
                            p.schedule = VP_SCHED_1F1B;
                            p.micro_batch = mb;
                            p.accum = 512 / p.dp / mb;
                            p.dtype = VP_DT_BF16;
                            p.recompute = (vp_recompute)rc;
                            p.sharding = VP_SHARD_DISTOPT;
                            p.sp = p.tp > 1;
                            if (vp_cluster_eval(cm, &c, &p, &mem, &tm,
                                                &err) == VP_OK)
                                n_api++;
                        }
        api_t = now() - t0;
    }
    double api_rate = (double)n_api / api_t;
    double sim1 = simulate_once();

    printf("cluster planner benchmark (one core)\n");
    printf("  plan           llama-3.1-405b on 1024 x %s, every option "
           "(precisions, engines, offload)\n",
           hw.name);
    printf("  space          %llu configurations: %llu evaluated, %llu "
           "pruned by the model-state bound, %llu fit\n",
           (unsigned long long)(evaluated + pruned),
           (unsigned long long)evaluated, (unsigned long long)pruned,
           (unsigned long long)pl->fitting);
    printf("  full plan      %.3f s cold (%u simulations included), "
           "%.3f s warm\n",
           cold, sims, warm);
    printf("  evaluated/s    %.3g configurations per second (%.3g "
           "including the pruned)\n",
           rate, rate_all);
    printf("  baselines      vp_cluster_eval %.3g configurations per second; "
           "one simulated step of gpt2-small %.3f ms\n",
           api_rate, 1e3 * sim1);
    printf("  ratios         search / public API = %.1fx; full plan (cold) = "
           "%.0f simulated steps\n",
           rate / api_rate, sim1 > 0 ? cold / sim1 : 0);
    printf("  goals          %.2fx the 1e6 configurations/s goal; the full "
           "plan takes %.3fx the 2 s goal\n",
           rate / 1e6, cold / 2.0);
    if (pl->found)
        printf("  best           dp %u tp %u%s pp %u cp %u, %s, %s, %.2f "
               "s/step, MFU %.1f%%\n",
               pl->best.par.dp, pl->best.par.tp,
               pl->best.par.sp ? "+sp" : "", pl->best.par.pp,
               pl->best.par.cp, vp_dtype_name(pl->best.par.dtype),
               vp_sharding_name(pl->best.par.sharding), pl->best.time.step,
               100 * pl->best.time.mfu);
    free(pl);
    vp_cluster_model_free(cm);
    vp_model_free(m);
    return 0;
}
