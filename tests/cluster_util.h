/* Helpers of the cluster planner's tests (test_published.c,
 * test_cluster_time.c): load a model, precompute its cluster model, a
 * configuration.
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

#endif
