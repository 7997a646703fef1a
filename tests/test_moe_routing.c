/* Tests of the MoE routing assumption of the cluster planner
 * (vp_cluster.moe_imbalance / moe_capacity, vp_moe_load) and of the
 * dense-then-MoE layer mix of its model (DeepSeek-V3). */
#include <criterion/criterion.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>

#include "cluster_util.h"
#include "vramplan/gpu.h"

/* A cluster of gpus/h800.yaml's GPUs, 8 a node. */
static vp_cluster cluster(uint32_t gpus)
{
    return profile_cluster("h800", gpus);
}

/* ---- the load factor --------------------------------------------------- */

Test(moe_load, one_rank_holds_every_expert)
{
    vp_cluster c = cluster(8);
    double w = 0;
    cr_expect_eq(vp_moe_load(&c, 256, 8, 1, &w), 1.0);
    cr_expect_eq(w, 1.0);
}

Test(moe_load, default_is_the_measured_load_at_the_plans_ep)
{
    vp_cluster c = cluster(64);
    cr_expect_eq(vp_moe_load(&c, 256, 8, 2, NULL), 1.39);
    cr_expect_eq(vp_moe_load(&c, 256, 8, 4, NULL), 1.93);
    cr_expect_eq(vp_moe_load(&c, 256, 8, 8, NULL), 2.29);
    cr_expect_eq(vp_moe_load(&c, 256, 8, 64, NULL), 2.29);
    /* capped by the worst case: 8 experts top-2 on 2 ranks at most 2 */
    cr_expect_eq(vp_moe_load(&c, 8, 2, 2, NULL), 1.39);
}

/* The default covers every load measured on the H200: each layer and
 * step's busiest group of E/ep experts (groundtruth/moe/, written by
 * groundtruth/collect_moe.py load). */
Test(moe_load, default_covers_every_measured_load)
{
    FILE *f = fopen("groundtruth/moe/h200-torch2.11-moe-load.jsonl", "r");
    cr_assert_not_null(f);
    char line[65536];
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *d = json_loads(line, 0, &je);
        cr_assert_not_null(d, "%s", je.text);
        size_t si, li;
        json_t *st, *ly;
        json_array_foreach(json_object_get(d, "steps"), si, st)
        {
            json_array_foreach(st, li, ly)
            {
                for (uint32_t ep = 2; ep <= 8; ep *= 2) {
                    char key[32];
                    snprintf(key, sizeof key, "ep%u_max_over_balanced", ep);
                    json_t *v = json_object_get(ly, key);
                    if (!v)
                        continue;
                    cr_expect_leq(json_number_value(v),
                                  vp_moe_measured_load(ep), "%s: %s %g",
                                  json_string_value(json_object_get(d,
                                                                    "model")),
                                  key, json_number_value(v));
                    seen++;
                }
            }
        }
        json_decref(d);
    }
    fclose(f);
    cr_expect_gt(seen, 100, "%d measured loads", seen);
}

/* 64 ranks of 4 experts each: a token puts at most 4 of its 8 picks on
 * one rank, so the busiest rank gets at most 64 x 4 / 8 = 32 shares. */
Test(moe_load, worst_is_every_pick_on_one_rank)
{
    vp_cluster c = cluster(64);
    double w = 0;
    c.moe_imbalance = 64;
    cr_expect_eq(vp_moe_load(&c, 256, 8, 64, &w), 32.0);
    cr_expect_eq(w, 32.0);
    /* 8 experts top-2 on 2 ranks: 2 x min(2, 4) / 2 = 2 */
    cr_expect_eq(vp_moe_load(&c, 8, 2, 2, &w), 2.0);
}

Test(moe_load, a_capacity_factor_replaces_the_imbalance)
{
    vp_cluster c = cluster(64);
    c.moe_imbalance = 3;
    c.moe_capacity = 1.5;
    cr_expect_eq(vp_moe_load(&c, 256, 8, 64, NULL), 1.5);
}

/* ---- memory ------------------------------------------------------------ */

static uint64_t total_at(vp_cluster_model *cm, const vp_cluster *c,
                         const vp_par *p)
{
    vp_cluster_mem mem;
    vp_error err;
    cr_assert_eq(vp_cluster_eval(cm, c, p, &mem, NULL, &err), VP_OK, "%s",
                 err.msg);
    return mem.total;
}

/* Without recomputation every layer keeps its experts' rows: the busiest
 * rank's memory grows with the imbalance, by as much from 1 to 2 as from
 * 2 to 3 (linear in the load). */
Test(moe_memory, grows_linearly_with_the_busiest_ranks_load)
{
    vp_model *m = load("tests/data/cluster/moe-e64.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    vp_par p = par(64, 1, 1, VP_SHARD_FSDP_FULL);
    p.ep = 8;
    p.recompute = VP_RC_NONE;
    uint64_t t[3];
    for (int i = 0; i < 3; i++) {
        c.moe_imbalance = 1.0 + i;
        t[i] = total_at(cm, &c, &p);
    }
    cr_expect_gt(t[1], t[0]);
    double d1 = (double)(t[1] - t[0]), d2 = (double)(t[2] - t[1]);
    cr_expect(fabs(d2 / d1 - 1) < 0.01, "steps %g and %g", d1, d2);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(moe_memory, routing_does_not_matter_without_expert_parallelism)
{
    vp_model *m = load("tests/data/cluster/moe-e64.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    vp_par p = par(64, 1, 1, VP_SHARD_FSDP_FULL);
    p.recompute = VP_RC_NONE;
    c.moe_imbalance = 1;
    uint64_t a = total_at(cm, &c, &p);
    c.moe_imbalance = 4;
    cr_expect_eq(total_at(cm, &c, &p), a);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- DeepSeek-V3: dense first layers, then experts --------------------- */

Test(deepseek_v3_cluster, counts_671b_parameters)
{
    vp_model *m = load("models/deepseek-v3.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    /* the graph's count (tests/test_hf_families.c): 3 dense and 58 MoE
     * layers, the embedding and the head */
    cr_expect_eq(in.params, 671026404352ULL, "%llu",
                 (unsigned long long)in.params);
    cr_expect_eq(in.experts, 256);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- the CLI ----------------------------------------------------------- */

#include "cli_golden.h"

/* A pinned expert-parallel layout: the report's routing line with the
 * balanced and worst bounds */
Test(moe_cli, plan_shows_the_routing_bounds)
{
    GOLDEN("moe_plan_routing", 0, "plan", "tests/data/cluster/moe-e64.yaml",
           "--gpus", "64", "--gpu", "h800", "--ep", "8", "--tp", "1",
           "--pp", "1", "--recompute", "none", "--sharding",
           "fsdp-full-shard", "--top", "0");
}

Test(moe_cli, plan_with_a_capacity_factor_json)
{
    GOLDEN("moe_plan_capacity_json", 0, "plan",
           "tests/data/cluster/moe-e64.yaml", "--gpus", "64", "--gpu",
           "h800", "--ep", "8", "--tp", "1", "--pp", "1", "--recompute",
           "none", "--sharding", "fsdp-full-shard", "--top", "0",
           "--moe-capacity", "1.5", "--format", "json");
}

Test(moe_cli, an_imbalance_below_one_is_an_error)
{
    GOLDEN("moe_plan_bad_imbalance", 2, "plan",
           "tests/data/cluster/moe-e64.yaml", "--gpus", "64", "--gpu",
           "h800", "--moe-imbalance", "0.5");
}
