/* Helpers of the cluster planner's tests (test_published.c,
 * test_cluster_time.c, test_cluster_graph.c, test_moe_routing.c,
 * test_megatron*.c: a stage simulated, one more micro-batch in flight;
 * test_cluster_verify.c): load a model, precompute its cluster model, a
 * cluster of a shipped GPU profile, a configuration.
 * Include after criterion.h. */
#ifndef VRAMPLAN_TESTS_CLUSTER_UTIL_H
#define VRAMPLAN_TESTS_CLUSTER_UTIL_H

#include <string.h>

#include "vramplan/cluster.h"
#include "vramplan/vramplan.h"

static inline vp_model *load(const char *path)
{
    vp_error err;
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s: %s", path, err.msg);
    return m;
}

static inline vp_cluster_model *cmodel(vp_model *m)
{
    vp_error err;
    vp_cluster_model *cm = vp_cluster_model_new(m, 0, &err);
    cr_assert_not_null(cm, "%s", err.msg);
    return cm;
}

/* `gpus` GPUs of a shipped profile (its bf16 GEMM curve), 8 a node. */
static inline vp_cluster profile_cluster(const char *gpu, uint32_t gpus)
{
    vp_error err;
    vp_gpu_profile *gp = vp_gpu_load(gpu, &err);
    cr_assert_not_null(gp, "%s: %s", gpu, err.msg);
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    vp_gpu_hw(gp, VP_GPU_BF16, &hw);
    vp_hw_fill_defaults(&hw);
    vp_gpu_free(gp);
    vp_cluster c;
    vp_cluster_init(&c, &hw, gpus, 8);
    return c;
}

/* One configuration: micro-batch 1, one micro-batch per step, bf16, full
 * recomputation, 1F1B; the callers change what they test. */
static inline vp_par par(uint32_t dp, uint32_t tp, uint32_t pp,
                         vp_sharding sh)
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
    p.bucket_view = true;
    return p;
}

/* Simulate stage `stage` of configuration p (vp_cluster_stage_sim), which
 * must succeed. */
static inline void sim_stage(vp_cluster_model *cm, const vp_cluster *c,
                             const vp_par *p, uint32_t stage,
                             vp_stage_sim *out)
{
    vp_error err;
    cr_assert_eq(vp_cluster_stage_sim(cm, c, p, stage, out, &err), VP_OK,
                 "%s", err.msg);
}

/* The peak's growth from m = 2 to 3 micro-batches on stage `stage`: one
 * more micro-batch in flight, what its layers keep (*a: the m = 2 run). */
static inline double stage_one_more(vp_cluster_model *cm,
                                    const vp_cluster *c, vp_par p,
                                    uint32_t stage, vp_stage_sim *a)
{
    vp_stage_sim b;
    p.accum = 2;
    sim_stage(cm, c, &p, stage, a);
    p.accum = 3;
    sim_stage(cm, c, &p, stage, &b);
    return (double)b.peak_alloc - (double)a->peak_alloc;
}

#endif
