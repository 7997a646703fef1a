/* Benchmark of the one-GPU searches on llama-3-70b (seq 4096, bf16):
 * simulations per second, the max-batch search (prediction-guided) against
 * the plain doubling search as the baseline, and the optimal checkpoint
 * placement against one simulation. Figures are ratios to baselines
 * measured in the same run; nothing passes or fails. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "vramplan/vramplan.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const vp_error *e)
{
    fprintf(stderr, "bench_search: %s\n", e->msg);
    exit(1);
}

int main(void)
{
    vp_error err;
    vp_model *m = vp_model_load("models/llama-3-70b.yaml", &err);
    if (!m)
        die(&err);
    vp_setup s;
    vp_setup_init(&s);
    s.seq = 4096;
    s.precision = VP_PREC_BF16;
    s.steps = VP_STEADY_STEPS;
    s.skip_breakdown = true;
    s.batch = 1;
    vp_graph *g = vp_graph_build(m, 1, 4096, &err);
    if (!g)
        die(&err);
    /* simulations per second */
    vp_estimate e;
    int n = 0;
    double t0 = now(), t1;
    do {
        if (vp_simulate(g, &s, &e, NULL, NULL, &err) != VP_OK)
            die(&err);
        n++;
        t1 = now();
    } while (t1 - t0 < 1.0);
    double sim_s = (t1 - t0) / n;
    printf("simulator: llama-3-70b, batch 1, seq 4096, 2 steps: %.0f "
           "simulations/s (%.2f ms each, %llu events)\n",
           1.0 / sim_s, sim_s * 1e3, (unsigned long long)e.events);

    /* max batch under 2 TiB (a budget that makes the search non-trivial) */
    s.alloc.limit = 2048 * VP_GiB;
    vp_maxbatch_result a, b;
    t0 = now();
    if (vp_maxbatch(m, &s, NULL, 0, &a, &err) != VP_OK)
        die(&err);
    double t_guided = now() - t0;
    t0 = now();
    if (vp_maxbatch_doubling(m, &s, NULL, 0, &b, &err) != VP_OK)
        die(&err);
    double t_doubling = now() - t0;
    printf("maxbatch: %.1f ms, %u simulations, batch %llu (baseline: "
           "doubling search %.1f ms, %u simulations, batch %llu): %.2fx "
           "faster; goal under 50 ms\n",
           t_guided * 1e3, a.trials, (unsigned long long)a.max_batch,
           t_doubling * 1e3, b.trials, (unsigned long long)b.max_batch,
           t_doubling / t_guided);

    /* optimal checkpoint placement at a batch that needs some */
    s.batch = 4;
    s.alloc.limit = 800 * VP_GiB; /* between all-layers and none at b4 */
    size_t ns = 128;
    bool mask[128];
    vp_ckpt_plan plan;
    t0 = now();
    vp_status st = vp_checkpoint_auto(m, &s, mask, ns, &plan, &err);
    double t_ck = now() - t0;
    if (st != VP_OK && st != VP_EOOM)
        die(&err);
    printf("checkpoint placement: %.1f ms, %u simulations, %zu of %zu "
           "layers checkpointed (baseline: one simulation %.2f ms: %.1fx); "
           "goal under 50 ms\n",
           t_ck * 1e3, plan.simulations, plan.n_checkpointed,
           plan.n_segments, sim_s * 1e3, t_ck / sim_s);
    vp_graph_free(g);
    vp_model_free(m);
    return 0;
}
