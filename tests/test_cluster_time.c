/* The cluster step-time model (docs/STEP_TIME.md): collectives after
 * NCCL's tuning model, layouts that cross nodes, MoE compute, overlap
 * switches, uneven stages, the MFU bound, the pins of the search and
 * the exports of the new layouts. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/cluster.h"
#include "vramplan/gpu.h"
#include "vramplan/vramplan.h"

#include "cluster_util.h"

/* The shipped H100 profile (cited curves and links). */
static void h100(vp_hw *hw)
{
    vp_error err;
    vp_gpu_profile *gp = vp_gpu_load("h100-80g", &err);
    cr_assert_not_null(gp, "%s", err.msg);
    memset(hw, 0, sizeof *hw);
    vp_gpu_hw(gp, VP_GPU_BF16, hw);
    vp_hw_fill_defaults(hw);
    vp_gpu_free(gp);
}

static vp_cluster cluster(uint32_t gpus)
{
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, gpus, 8);
    return c;
}

static void eval_ok(vp_cluster_model *cm, const vp_cluster *c,
                    const vp_par *p, vp_cluster_mem *mem, vp_cluster_time *t)
{
    vp_error err;
    vp_status st = vp_cluster_eval(cm, c, p, mem, t, &err);
    cr_assert_eq(st, VP_OK, "%s", err.msg);
}

static vp_status eval_err(vp_cluster_model *cm, const vp_cluster *c,
                          const vp_par *p, vp_error *err)
{
    vp_cluster_mem mem;
    vp_cluster_time t;
    return vp_cluster_eval(cm, c, p, &mem, &t, err);
}

/* ---- collectives (NCCL's tuning model) ------------------------------- */

/* A small all-reduce is latency: more nodes, more hops */
Test(collectives, latency_grows_with_the_nodes)
{
    vp_cluster c = cluster(1024);
    double t16 = vp_coll_time(&c, VP_COLL_ALL_REDUCE, 4096, 16, 1);
    double t128 = vp_coll_time(&c, VP_COLL_ALL_REDUCE, 4096, 128, 1);
    double t1024 = vp_coll_time(&c, VP_COLL_ALL_REDUCE, 4096, 1024, 1);
    cr_assert_lt(t16, t128);
    cr_assert_lt(t128, t1024);
    /* microseconds, not milliseconds */
    cr_assert_lt(t1024, 1e-3);
}

/* A large all-reduce of a group with one rank per node (Megatron's
 * data-parallel groups under tp 8) moves 2 (n-1)/n of the bytes through
 * each rank's own NIC */
Test(collectives, one_rank_per_node_runs_at_its_nic)
{
    vp_cluster c = cluster(512);
    double bytes = 4e9;
    double t = vp_coll_time(&c, VP_COLL_ALL_REDUCE, bytes, 64, 8);
    double wire = 2.0 * 63.0 / 64.0 * bytes / c.hw.network;
    cr_assert_geq(t, wire, "%g s below the NIC's %g s", t, wire);
    cr_assert_lt(t, 1.5 * wire);
}

/* A group with eight ranks on each node runs one ring channel per rail
 * (NCCL's busBw = nChannels x the per-channel NIC bandwidth): each
 * rank's NIC carries an eighth of its ring traffic, the rest NVLink
 * (NVIDIA/nccl #1048: two A100 nodes with 4 x 200 Gb/s reach 86 GB/s of
 * all-reduce bus bandwidth, one HCA 24 GB/s) */
Test(collectives, full_nodes_use_every_rail)
{
    vp_cluster c = cluster(64);
    double bytes = 4e9;
    double t = vp_coll_time(&c, VP_COLL_ALL_REDUCE, bytes, 64, 1);
    double own = vp_coll_time(&c, VP_COLL_ALL_REDUCE, bytes, 64, 8);
    double nv = c.hw.nvlink * c.nvlink_eff;
    double rails = 8 * c.hw.network * c.net_eff;
    double wire = 2.0 * 63.0 / 64.0 * bytes / (rails < nv ? rails : nv);
    cr_assert_geq(t, wire, "%g s below the rails' %g s", t, wire);
    cr_assert_lt(t, 1.5 * wire);
    cr_assert_lt(4 * t, own, "8 rails %g s, one NIC %g s", t, own);
}

/* Inside a node the same all-reduce runs at NVLink speed */
Test(collectives, nvlink_inside_a_node)
{
    vp_cluster c = cluster(64);
    double bytes = 1e9;
    double in = vp_coll_time(&c, VP_COLL_ALL_REDUCE, bytes, 8, 1);
    double across = vp_coll_time(&c, VP_COLL_ALL_REDUCE, bytes, 8, 8);
    cr_assert_lt(in * 4, across, "NVLink %g s vs network %g s", in, across);
}

/* tp = 6 on 8-GPU nodes: the groups do not tile the nodes, so half of
 * them cross a node boundary and run at the network's speed */
Test(collectives, a_group_that_does_not_tile_the_node_crosses_it)
{
    vp_cluster c = cluster(48);
    double bytes = 256e6;
    double t6 = vp_coll_time(&c, VP_COLL_ALL_REDUCE, bytes, 6, 1);
    double t8 = vp_coll_time(&c, VP_COLL_ALL_REDUCE, bytes, 8, 1);
    cr_assert_gt(t6, 4 * t8, "tp 6 %g s, tp 8 %g s", t6, t8);
}

/* ---- MoE ------------------------------------------------------------- */

/* At equal active FLOPs (top-8 of 64, 128 or 256 equal experts) and
 * EP 64, compute does not grow with the number of experts, in Megatron
 * and in the PyTorch engine (grouped experts both) */
Test(moe, compute_does_not_grow_with_the_experts)
{
    const char *paths[] = {"tests/data/cluster/moe-e64.yaml",
                           "tests/data/cluster/moe-e128.yaml",
                           "tests/data/cluster/moe-e256.yaml"};
    const vp_sharding sh[] = {VP_SHARD_DISTOPT, VP_SHARD_FSDP_FULL};
    vp_cluster c = cluster(64);
    for (int s = 0; s < 2; s++) {
        double comp[3];
        for (int i = 0; i < 3; i++) {
            vp_model *m = load(paths[i]);
            vp_cluster_model *cm = cmodel(m);
            vp_par p = par(64, 1, 1, sh[s]);
            p.ep = 64;
            p.accum = 4;
            vp_cluster_mem mem;
            vp_cluster_time t;
            eval_ok(cm, &c, &p, &mem, &t);
            comp[i] = t.compute + t.recompute;
            vp_cluster_model_free(cm);
            vp_model_free(m);
        }
        /* within 2 %: the router's logits grow with the experts */
        for (int i = 1; i < 3; i++)
            cr_assert(fabs(comp[i] / comp[0] - 1) < 0.02,
                      "%s, experts x%d: compute %g s vs %g s",
                      vp_sharding_name(sh[s]), 1 << i, comp[i], comp[0]);
    }
}

/* ---- precision ------------------------------------------------------- */

/* Megatron keeps fp16 gradients in fp16 (bf16 forces fp32 main-grad
 * accumulation, megatron/training/arguments.py) */
Test(precision, megatron_fp16_gradients_take_two_bytes)
{
    vp_model *m = load("tests/data/cluster/megatron-22b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_cluster c = cluster(8);
    vp_par p = par(1, 8, 1, VP_SHARD_MEGATRON);
    vp_cluster_mem mem;
    vp_cluster_time t;
    /* the gradients of one rank's share (layers split over tp 8, the
     * embedding and head over its vocabulary) per parameter of the model */
    p.dtype = VP_DT_FP16;
    eval_ok(cm, &c, &p, &mem, &t);
    double per = 8.0 * (double)mem.grads / (double)in.params;
    cr_assert(fabs(per / 2.0 - 1) < 0.01, "fp16: %g B per parameter", per);
    p.dtype = VP_DT_BF16;
    eval_ok(cm, &c, &p, &mem, &t);
    per = 8.0 * (double)mem.grads / (double)in.params;
    cr_assert(fabs(per / 4.0 - 1) < 0.01, "bf16: %g B per parameter", per);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- layouts --------------------------------------------------------- */

/* Uneven stages (Megatron's --decoder-first/last-pipeline-num-layers):
 * the middle stages share what the first and last leave, evenly */
Test(layouts, uneven_stages_split_the_rest_evenly)
{
    vp_model *m = load("tests/data/cluster/gpt3-175b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    vp_par p = par(1, 8, 8, VP_SHARD_MEGATRON);
    p.accum = 16;
    vp_cluster_mem even, uneven;
    vp_cluster_time t;
    eval_ok(cm, &c, &p, &even, &t);
    cr_assert_eq(even.stage, 0u);
    p.first_layers = 5; /* 96 - 5 - 6 = 85 over 6 middle stages */
    p.last_layers = 6;
    vp_error err;
    cr_assert_eq(eval_err(cm, &c, &p, &err), VP_EARG);
    p.first_layers = 6; /* 96 = 6 + 6 x 14 + 6 */
    eval_ok(cm, &c, &p, &uneven, &t);
    /* the fullest stage is now a middle one, with 14 layers against 12
     * and the embedding */
    cr_assert(uneven.stage > 0 && uneven.stage < 7, "stage %u",
              uneven.stage);
    cr_assert_gt(uneven.weights, even.weights);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- DualPipe (DeepSeek-V3 report, Table 2; deepseek-ai/DualPipe) ---- */

/* The bubbles of Table 2, in seconds, for chunks of F = 1, B = 2, W = 1 */
Test(dualpipe, bubble_of_table_2)
{
    cr_assert_float_eq(
        vp_pipeline_bubble_time(VP_SCHED_1F1B, 8, 1, 1, 2, 1), 7 * 3.0,
        1e-12);
    cr_assert_float_eq(
        vp_pipeline_bubble_time(VP_SCHED_INTERLEAVED, 8, 3, 1, 2, 1), 7.0,
        1e-12);
    /* (PP/2 - 1)(F&B + B - 3W) with F&B = F + B */
    cr_assert_float_eq(
        vp_pipeline_bubble_time(VP_SCHED_DUALPIPE, 8, 1, 1, 2, 1),
        3 * (3.0 + 2 - 3), 1e-12);
    cr_assert_float_eq(
        vp_pipeline_bubble_time(VP_SCHED_DUALPIPE, 2, 1, 1, 2, 1), 0.0,
        1e-12);
}

/* PP + 1 chunks of activations on every rank */
Test(dualpipe, activations_of_pp_plus_one_chunks)
{
    for (uint32_t k = 0; k < 8; k++)
        cr_assert_float_eq(
            vp_pipeline_in_flight(VP_SCHED_DUALPIPE, 8, 64, 1, k), 9.0,
            1e-12);
}

/* dualpipe.py step(): an even pp, an even number of micro-batches, at
 * least 2 pp of them */
Test(dualpipe, needs_even_stages_and_enough_micro_batches)
{
    vp_model *m = load("tests/data/cluster/gpt3-175b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_error err;
    vp_cluster c6 = cluster(48);
    vp_par p = par(1, 8, 6, VP_SHARD_MEGATRON);
    p.schedule = VP_SCHED_DUALPIPE;
    p.accum = 12;
    cr_assert_eq(eval_err(cm, &c6, &p, &err), VP_OK, "%s", err.msg);
    p.accum = 11;
    cr_assert_eq(eval_err(cm, &c6, &p, &err), VP_EARG);
    p.accum = 10;
    cr_assert_eq(eval_err(cm, &c6, &p, &err), VP_EARG);
    vp_cluster c3 = cluster(24);
    p = par(1, 8, 3, VP_SHARD_MEGATRON);
    p.schedule = VP_SCHED_DUALPIPE;
    p.accum = 12;
    cr_assert_eq(eval_err(cm, &c3, &p, &err), VP_EARG);
    cr_assert(strstr(err.msg, "DualPipe"), "%s", err.msg);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* Against 1F1B on the same layout: twice the model states on a rank (it
 * holds stages k and p - 1 - k), one more micro-batch of activations on
 * the first, the same work per micro-batch, a smaller bubble and the
 * pipeline sends hidden */
Test(dualpipe, memory_and_time_against_1f1b)
{
    vp_model *m = load("tests/data/cluster/gpt3-175b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    vp_par p = par(1, 8, 8, VP_SHARD_MEGATRON);
    p.accum = 32;
    p.recompute = VP_RC_SELECTIVE;
    vp_cluster_mem m1, md;
    vp_cluster_time t1, td;
    eval_ok(cm, &c, &p, &m1, &t1);
    p.schedule = VP_SCHED_DUALPIPE;
    eval_ok(cm, &c, &p, &md, &td);
    /* 96 layers over 8 stages: 12 a stage, 24 on a DualPipe rank */
    double r = (double)md.weights / (double)m1.weights;
    cr_assert(r > 1.9 && r < 2.1, "weights %g x", r);
    cr_assert_eq(md.stage, 0u);
    cr_assert_float_eq(md.in_flight, m1.in_flight + 1, 1e-12);
    cr_assert_float_eq(td.compute, t1.compute, 1e-9 * t1.compute);
    cr_assert_float_eq(td.pp_comm, 0.0, 1e-12);
    cr_assert_gt(t1.pp_comm, 0.0);
    /* (p/2 - 1)(F + 2B - 3W) against (p - 1)(F + B + sends), where
     * F + 2B - 3W < 2 (F + B): below 2 (p/2 - 1)/(p - 1) of it */
    cr_assert_lt(td.bubble, 2 * 3.0 / 7.0 * t1.bubble,
                 "bubble %g vs 1F1B %g", td.bubble, t1.bubble);
    cr_assert_gt(td.bubble, 0.0);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* A pinned DualPipe layout is searched; the Megatron export refuses it */
Test(dualpipe, pinned_in_the_search_refused_by_megatron_export)
{
    vp_model *m = load("tests/data/cluster/gpt3-175b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(512);
    vp_search_opts o;
    vp_search_opts_init(&o);
    o.tp = 8;
    o.pp = 8;
    o.schedule = VP_SCHED_DUALPIPE;
    o.engines[VP_ENGINE_MEGATRON] = true;
    vp_cluster_plan *pl = calloc(1, sizeof *pl);
    vp_error err;
    cr_assert_eq(vp_cluster_search(cm, &c, &o, pl, &err), VP_OK, "%s",
                 err.msg);
    const vp_plan_entry *e = pl->found ? &pl->best : &pl->closest;
    cr_assert_eq(e->par.schedule, VP_SCHED_DUALPIPE);
    char buf[4096];
    size_t len;
    cr_assert_eq(vp_export_plan(cm, &c, &e->par, VP_EXPORT_MEGATRON, buf,
                                sizeof buf, &len, &err),
                 VP_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "DualPipe"), "%s", err.msg);
    free(pl);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* FSDP with tensor parallelism (torchtitan's 2-D) and DeepSpeed ZeRO
 * with it (Megatron-DeepSpeed) are planned and timed */
Test(layouts, fsdp_and_zero_compose_with_tp)
{
    vp_model *m = load("tests/data/cluster/megatron-22b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    const vp_sharding sh[] = {VP_SHARD_FSDP_FULL, VP_SHARD_ZERO1,
                              VP_SHARD_ZERO3};
    for (int i = 0; i < 3; i++) {
        vp_par p = par(8, 8, 1, sh[i]);
        vp_cluster_mem mem;
        vp_cluster_time t;
        eval_ok(cm, &c, &p, &mem, &t);
        cr_assert_gt(t.tp_comm, 0.0, "%s", vp_sharding_name(sh[i]));
        cr_assert_gt(t.step, t.compute);
    }
    vp_par ddp = par(8, 8, 1, VP_SHARD_DDP);
    vp_error err;
    cr_assert_eq(eval_err(cm, &c, &ddp, &err), VP_EARG);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* Interleaving only needs each stage to hold vpp layers: 96 layers on
 * pp 8 with 5 chunks (96 is no multiple of 40) */
Test(layouts, interleaving_without_divisibility)
{
    vp_model *m = load("tests/data/cluster/gpt3-175b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    vp_par p = par(1, 8, 8, VP_SHARD_MEGATRON);
    p.accum = 16;
    p.schedule = VP_SCHED_INTERLEAVED;
    p.vpp = 5;
    vp_cluster_mem mem;
    vp_cluster_time t, t1;
    eval_ok(cm, &c, &p, &mem, &t);
    p.schedule = VP_SCHED_1F1B;
    p.vpp = 1;
    eval_ok(cm, &c, &p, &mem, &t1);
    cr_assert_lt(t.bubble, t1.bubble);
    p.schedule = VP_SCHED_INTERLEAVED;
    p.vpp = 13; /* more chunks than a stage's 12 layers */
    vp_error err;
    cr_assert_eq(eval_err(cm, &c, &p, &err), VP_EARG);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- overlap --------------------------------------------------------- */

/* ZeRO-3 without prefetch waits for every gather; with it, a layer's
 * gathers hide behind the layer before */
Test(overlap, zero3_prefetch_hides_the_gathers)
{
    vp_model *m = load("tests/data/cluster/megatron-22b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    vp_par p = par(64, 1, 1, VP_SHARD_ZERO3);
    p.accum = 2;
    vp_cluster_mem mem;
    vp_cluster_time on, off;
    eval_ok(cm, &c, &p, &mem, &on);
    p.overlap_dp = VP_OFF;
    eval_ok(cm, &c, &p, &mem, &off);
    cr_assert_gt(off.dp_comm, on.dp_comm);
    cr_assert_gt(off.step, on.step);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* Megatron's --tp-comm-overlap hides part of the TP collectives and
 * needs sequence parallelism */
Test(overlap, tp_comm_overlap)
{
    vp_model *m = load("tests/data/cluster/megatron-22b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    vp_par p = par(8, 8, 1, VP_SHARD_DISTOPT);
    p.sp = true;
    vp_cluster_mem mem;
    vp_cluster_time off, on;
    eval_ok(cm, &c, &p, &mem, &off);
    p.overlap_tp = VP_ON;
    eval_ok(cm, &c, &p, &mem, &on);
    cr_assert_lt(on.tp_comm, off.tp_comm);
    p.sp = false;
    vp_error err;
    cr_assert_eq(eval_err(cm, &c, &p, &err), VP_EARG);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* Expert all-to-alls behind the layer's compute (--overlap-ep on):
 * less exposed, never more than without */
Test(overlap, ep_all_to_all_overlap)
{
    vp_model *m = load("tests/data/cluster/moe-e64.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    vp_par p = par(64, 1, 1, VP_SHARD_DISTOPT);
    p.ep = 8;
    vp_cluster_mem mem;
    vp_cluster_time off, on;
    eval_ok(cm, &c, &p, &mem, &off);
    p.overlap_ep = VP_ON;
    eval_ok(cm, &c, &p, &mem, &on);
    cr_assert_gt(off.ep_comm, 0.0);
    cr_assert_lt(on.ep_comm, off.ep_comm);
    cr_assert_float_eq(on.compute, off.compute, 1e-12 * off.compute);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- multi-token prediction (DeepSeek-V3 report 2.2) ----------------- */

/* Each module adds a layer, two norms and the 2h x h projection to the
 * last stage's parameters (the embedding and head are shared): on one
 * GPU per module exactly (layer + 2h^2 + 2h) x 18 B (Megatron: 2 B
 * weights, 4 B main grads, 12 B optimizer) */
Test(mtp, parameters_of_a_module)
{
    vp_model *m = load("tests/data/cluster/megatron-22b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_cluster c = cluster(1);
    vp_par p = par(1, 1, 1, VP_SHARD_MEGATRON);
    vp_cluster_mem m0, m1;
    vp_cluster_time t0, t1;
    eval_ok(cm, &c, &p, &m0, &t0);
    p.mtp = 1;
    eval_ok(cm, &c, &p, &m1, &t1);
    double h = (double)in.hidden;
    double want = ((double)in.layer_params + 2 * h * h + 2 * h) * 18;
    double got = (double)(m1.weights + m1.grads + m1.optimizer) -
                 (double)(m0.weights + m0.grads + m0.optimizer);
    cr_assert(fabs(got / want - 1) < 1e-6, "%g B vs %g B", got, want);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* The module's layer, its projection and the head again cost time on
 * the last stage only: with pp 2 the last stage becomes the slowest, by
 * more than a layer; the model's FLOPs (MFU's) are the model's */
Test(mtp, time_on_the_last_stage)
{
    vp_model *m = load("tests/data/cluster/megatron-22b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(16);
    vp_par p = par(1, 8, 2, VP_SHARD_MEGATRON);
    p.accum = 8;
    vp_cluster_mem m0, m1;
    vp_cluster_time t0, t1;
    eval_ok(cm, &c, &p, &m0, &t0);
    p.mtp = 1;
    eval_ok(cm, &c, &p, &m1, &t1);
    cr_assert_gt(t1.step, t0.step);
    cr_assert_float_eq(t1.model_flops, t0.model_flops, 0);
    cr_assert_gt(t1.gemm, t0.gemm);
    p.mtp = 9;
    vp_error err;
    cr_assert_eq(eval_err(cm, &c, &p, &err), VP_EARG);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- the PyTorch engine (torchtitan's options) ----------------------- */

static void torch_eval(vp_cluster_model *cm, vp_recompute rc, vp_dtype dt,
                       bool compile, vp_cluster_mem *mem, vp_cluster_time *t)
{
    vp_cluster c = cluster(8);
    vp_par p = par(8, 1, 1, VP_SHARD_FSDP_FULL);
    p.recompute = rc;
    p.dtype = dt;
    p.compile = compile;
    eval_ok(cm, &c, &p, mem, t);
}

/* Selective recomputation in the torch engine is torchtitan's op-level
 * policy: part of the forward again (less than full recomputation), and
 * activations between none and full */
Test(torch_engine, selective_recomputation)
{
    vp_model *m = load("models/llama-3-8b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_mem mn, ms, mf;
    vp_cluster_time tn, ts, tf;
    torch_eval(cm, VP_RC_NONE, VP_DT_BF16, false, &mn, &tn);
    torch_eval(cm, VP_RC_SELECTIVE, VP_DT_BF16, false, &ms, &ts);
    torch_eval(cm, VP_RC_FULL, VP_DT_BF16, false, &mf, &tf);
    cr_assert_float_eq(tn.recompute, 0.0, 1e-12);
    cr_assert_gt(ts.recompute, 0.0);
    cr_assert_lt(ts.recompute, tf.recompute);
    cr_assert_lt(ms.activations, mn.activations);
    cr_assert_gt(ms.activations, mf.activations);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* Llama 3 8B under FSDP on 8 GPUs: bf16 (eager, or compiled when dt is
 * not bf16) against (dt, compile) */
static void torch_against_bf16(vp_dtype dt, bool compile,
                                vp_cluster_mem *me, vp_cluster_time *te,
                                vp_cluster_mem *mx, vp_cluster_time *tx)
{
    vp_model *m = load("models/llama-3-8b.yaml");
    vp_cluster_model *cm = cmodel(m);
    torch_eval(cm, VP_RC_NONE, VP_DT_BF16, compile && dt != VP_DT_BF16, me,
               te);
    torch_eval(cm, VP_RC_NONE, dt, compile, mx, tx);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* torch.compile fuses the memory-bound kernels (less memory-bound time,
 * the same GEMMs); the memory is eager's */
Test(torch_engine, compile_fuses_memory_bound_kernels)
{
    vp_cluster_mem me, mc;
    vp_cluster_time te, tc;
    torch_against_bf16(VP_DT_BF16, true, &me, &te, &mc, &tc);
    cr_assert_lt(tc.memory, te.memory);
    cr_assert_float_eq(tc.gemm, te.gemm, 1e-12 * te.gemm);
    cr_assert_eq(mc.total, me.total);
}

/* float8 linears in the torch engine (compiled, as torchtitan runs
 * them): the linears' GEMMs at the fp8 curve (faster), the attention as
 * bf16 */
Test(torch_engine, float8_linears)
{
    vp_cluster_mem mb, m8;
    vp_cluster_time tb, t8;
    torch_against_bf16(VP_DT_FP8, true, &mb, &tb, &m8, &t8);
    cr_assert_lt(t8.gemm, 0.8 * tb.gemm, "fp8 %g s, bf16 %g s", t8.gemm,
                 tb.gemm);
    cr_assert_float_eq(t8.attention, tb.attention, 1e-12 * tb.attention);
}

/* fp8 current scaling under Megatron (Llama 3 8B, one GPU, one
 * micro-batch): each linear's input and output gradient is read for its
 * amax, read again and written as fp8 data and transpose, 6 B an
 * element in two kernels each way, at the copy curve; the fp8 weights
 * are not cast per micro-batch. The memory-bound time grows by exactly
 * that over bf16's, layer by layer (q, k, v, o, gate, up, down; the
 * q/k/v and gate/up pairs share their input's cast). */
Test(fp8, megatron_cast_kernels_by_bytes)
{
    vp_model *m = load("models/llama-3-8b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_cluster c = cluster(1);
    vp_par p = par(1, 1, 1, VP_SHARD_MEGATRON);
    p.recompute = VP_RC_NONE;
    vp_cluster_mem mb, m8;
    vp_cluster_time tb, t8;
    eval_ok(cm, &c, &p, &mb, &tb);
    p.dtype = VP_DT_FP8;
    eval_ok(cm, &c, &p, &m8, &t8);
    double s = (double)in.seq, h = (double)in.hidden;
    double qd = (double)in.heads * (double)in.head_dim;
    double kv = (double)in.kv_heads * (double)in.head_dim;
    double f = (double)in.ffn, lin = 7;
    double x = s * (h + qd + h + f), dy = s * (qd + 2 * kv + h + 2 * f + h);
    const vp_curve *cc = &c.hw.mem_kind[VP_HW_MEM_COPY];
    double per = 2 * lin * vp_curve_time(cc, 6 * x / (2 * lin)) +
                 2 * lin * vp_curve_time(cc, 6 * dy / (2 * lin));
    double want = (double)in.layers * per;
    cr_assert_float_eq(t8.memory - tb.memory, want, 1e-9 * want,
                       "%g s vs %g s", t8.memory - tb.memory, want);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* fp8 under torch (torchao's tensorwise dynamic float8; Llama 3 8B,
 * FSDP on 8 GPUs, one micro-batch): each linear's input, gathered bf16
 * weight and output gradient gets an amax, a cast and a transposed cast,
 * moving the measured multiple of a copy's 4 B an element at the copy
 * curve: Inductor's under torch.compile, ATen's eager. The input's and
 * weight's amax and row cast run in the forward (the measured share of
 * the compiled cast), their transposed casts in the backward with the
 * output gradient's three, four kernels a linear each way. The
 * memory-bound time grows by exactly that over bf16's (the q/k/v and
 * gate/up pairs share their input's cast). */
typedef struct {
    double x, dy, w, lin, layers;
} lin_sizes;

static lin_sizes llama_linears(vp_cluster_model *cm)
{
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    double s = (double)in.seq, h = (double)in.hidden;
    double qd = (double)in.heads * (double)in.head_dim;
    double kv = (double)in.kv_heads * (double)in.head_dim;
    double f = (double)in.ffn;
    lin_sizes z = {s * (h + qd + h + f),
                   s * (qd + 2 * kv + h + 2 * f + h),
                   h * (qd + 2 * kv) + qd * h + 3 * h * f, 7,
                   (double)in.layers};
    return z;
}

static void torch_casts(bool compile, double per_element)
{
    vp_model *m = load("models/llama-3-8b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_cluster c = cluster(8);
    vp_cluster_mem mb, m8;
    vp_cluster_time tb, t8;
    torch_eval(cm, VP_RC_NONE, VP_DT_BF16, compile, &mb, &tb);
    torch_eval(cm, VP_RC_NONE, VP_DT_FP8, compile, &m8, &t8);
    lin_sizes z = llama_linears(cm);
    const vp_curve *cc = &c.hw.mem_kind[VP_HW_MEM_COPY];
    double b = 4 * per_element;
    double fw = VP_FP8_CAST_ROW_AMAX / VP_FP8_CAST_COMPILED, l4 = 4 * z.lin;
    double per = l4 * vp_curve_time(cc, b * fw * (z.x + z.w) / l4) +
                 l4 * vp_curve_time(cc, b * ((1 - fw) * (z.x + z.w) + z.dy) /
                                            l4);
    double want = z.layers * per;
    cr_assert_float_eq(t8.memory - tb.memory, want, 1e-9 * want,
                       "%g s vs %g s", t8.memory - tb.memory, want);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(fp8, torch_compiled_casts_at_the_measured_multiple_of_a_copy)
{
    torch_casts(true, VP_FP8_CAST_COMPILED);
}

Test(fp8, torch_eager_casts_at_the_measured_multiple_of_a_copy)
{
    torch_casts(false, VP_FP8_CAST_EAGER);
}

/* torchao's fp8 all-gather recipe (Llama 3 8B, FSDP2 on 8 GPUs,
 * compiled, one micro-batch) against the plain fp8 run: no gathered
 * weight is cast in the layer; each rank casts its shard (1/8 of the
 * weights, fp32 read: 5 B for the measured bf16 cast's 3, eager, three
 * kernels a linear) before the forward's gather and again before the
 * backward's; the backward copies the gathered fp8 weight to column-major
 * for dgrad (1 + 1 B). */
static void fp8_fsdp2(bool gather, vp_cluster_mem *m, vp_cluster_time *t,
                      vp_cluster_model *cm)
{
    vp_cluster c = cluster(8);
    vp_par p = par(8, 1, 1, VP_SHARD_FSDP2);
    p.recompute = VP_RC_NONE;
    p.dtype = VP_DT_FP8;
    p.compile = true;
    p.fp8_gather = gather;
    eval_ok(cm, &c, &p, m, t);
}

/* the plain fp8 run (0) and the recipe's (1) */
typedef struct {
    vp_model *m;
    vp_cluster_model *cm;
    vp_cluster_mem m0, m1;
    vp_cluster_time t0, t1;
    lin_sizes z;
    vp_curve copy;
} fp8ag_pair;

static void fp8ag_eval(fp8ag_pair *r)
{
    r->m = load("models/llama-3-8b.yaml");
    r->cm = cmodel(r->m);
    fp8_fsdp2(false, &r->m0, &r->t0, r->cm);
    fp8_fsdp2(true, &r->m1, &r->t1, r->cm);
    r->z = llama_linears(r->cm);
    vp_cluster c = cluster(8);
    r->copy = c.hw.mem_kind[VP_HW_MEM_COPY];
}

static void fp8ag_free(fp8ag_pair *r)
{
    vp_cluster_model_free(r->cm);
    vp_model_free(r->m);
}

Test(fp8, all_gather_casts_the_shard_not_the_gathered_weight)
{
    fp8ag_pair r;
    fp8ag_eval(&r);
    lin_sizes z = r.z;
    const vp_curve *cc = &r.copy;
    double b = 4 * VP_FP8_CAST_COMPILED, l2 = 2 * z.lin, l4 = 4 * z.lin;
    double fw = VP_FP8_CAST_ROW_AMAX / VP_FP8_CAST_COMPILED;
    double row = (VP_FP8_CAST_COMPILED - VP_FP8_CAST_TRANS_AMAX) /
                 VP_FP8_CAST_COMPILED;
    double plain = l4 * vp_curve_time(cc, b * fw * (z.x + z.w) / l4) +
                   l4 * vp_curve_time(cc, b * ((1 - fw) * (z.x + z.w) +
                                               z.dy) / l4);
    double shard = 4 * VP_FP8_CAST_EAGER * row * 5.0 / 3.0 * z.w / 8;
    double ag = l2 * vp_curve_time(cc, b * fw * z.x / l2) +
                2 * 3 * z.lin * vp_curve_time(cc, shard / (3 * z.lin)) +
                l4 * vp_curve_time(cc, (b * ((1 - fw) * z.x + z.dy) +
                                        2 * z.w) / l4);
    double want = z.layers * (ag - plain);
    double got = r.t1.memory - r.t0.memory;
    cr_assert_float_eq(got, want, 1e-9 * fabs(want), "%g s vs %g s", got,
                       want);
    fp8ag_free(&r);
}

/* precompute_float8_dynamic_scale_for_fsdp: once a step, the rank's fp32
 * shards of the linear weights read for their amax (4 B an element, one
 * kernel) and one all-reduce of the amaxes, added to the optimizer step */
Test(fp8, all_gather_precomputes_the_weight_amax_once_a_step)
{
    fp8ag_pair r;
    fp8ag_eval(&r);
    double read = vp_curve_time(&r.copy, 4 * r.z.layers * r.z.w / 8);
    /* the all-reduce of 4 B a linear: more than nothing, less than the
     * read */
    double got = r.t1.optimizer - r.t0.optimizer;
    cr_assert_gt(got, read);
    cr_assert_lt(got, 2 * read);
    fp8ag_free(&r);
}

/* FSDP2's gathered layer parameters in fp8: the unsharded and prefetched
 * parameters and the all-gather input lose 1 B a parameter each; the
 * unsharded gradients and the root group (embedding, head) keep bf16 */
Test(fp8, all_gather_holds_fp8_gathered_weights)
{
    fp8ag_pair r;
    fp8ag_eval(&r);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(r.cm, &in);
    double pu = r.z.w + 2.0 * (double)in.hidden; /* the norms' weights */
    double want = 2 * pu + pu / 8;
    double got = (double)r.m0.buffers - (double)r.m1.buffers;
    cr_assert_float_eq(got, want, 2.0, "%g vs %g", got, want);
    fp8ag_free(&r);
}

/* the recipe is torchao's under FSDP2: refused with bf16 or with
 * Megatron's sharding */
Test(fp8, all_gather_needs_fp8_under_fsdp2)
{
    vp_model *m = load("models/llama-3-8b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(8);
    vp_par p = par(8, 1, 1, VP_SHARD_FSDP2);
    p.fp8_gather = true;
    vp_error err;
    cr_assert_eq(eval_err(cm, &c, &p, &err), VP_EARG);
    cr_assert(strstr(err.msg, "fp8 all-gather") != NULL, "%s", err.msg);
    p = par(8, 1, 1, VP_SHARD_MEGATRON);
    p.dtype = VP_DT_FP8;
    p.fp8_gather = true;
    cr_assert_eq(eval_err(cm, &c, &p, &err), VP_EARG);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- the MFU bound --------------------------------------------------- */

/* No plan the search picks claims more MFU than the GPU's GEMM curve
 * allows, and the time breakdown adds up to compute + recompute */
Test(mfu, search_stays_under_the_bound)
{
    const char *paths[] = {"tests/data/cluster/megatron-22b.yaml",
                           "tests/data/cluster/gpt3-175b.yaml",
                           "tests/data/cluster/moe-e64.yaml"};
    const uint32_t gpus[] = {64, 1024, 64};
    for (int i = 0; i < 3; i++) {
        vp_model *m = load(paths[i]);
        vp_cluster_model *cm = cmodel(m);
        vp_cluster c = cluster(gpus[i]);
        vp_search_opts o;
        vp_search_opts_init(&o);
        o.top = 3;
        vp_cluster_plan *pl = calloc(1, sizeof *pl);
        vp_error err;
        cr_assert_eq(vp_cluster_search(cm, &c, &o, pl, &err), VP_OK, "%s",
                     err.msg);
        cr_assert(pl->found, "%s", paths[i]);
        const vp_cluster_time *t = &pl->best.time;
        cr_assert_gt(t->mfu, 0.0);
        cr_assert_leq(t->mfu, t->mfu_bound, "%s: MFU %g over %g", paths[i],
                      t->mfu, t->mfu_bound);
        cr_assert_lt(t->mfu_bound, 1.0);
        double parts = t->gemm + t->attention + t->memory;
        cr_assert(fabs(parts / (t->compute + t->recompute) - 1) < 1e-6,
                  "%s: %g vs %g", paths[i], parts,
                  t->compute + t->recompute);
        free(pl);
        vp_cluster_model_free(cm);
        vp_model_free(m);
    }
}

/* Every plan `plan` prints for the bundled models (the best and each
 * alternative, or the closest configuration when none fits), on 8 and
 * 256 GPUs with every precision: MFU above zero and at most its bound,
 * the bound below one, the compute split adding up to compute +
 * recompute, and the parts of the step (compute, recompute, exposed TP,
 * CP, EP, PP and data-parallel communication, bubble, optimizer,
 * offload) adding up to the step unless the bound raised it */
static void check_entry(const char *what, const vp_plan_entry *e)
{
    const vp_cluster_time *t = &e->time;
    cr_assert_gt(t->mfu, 0.0, "%s", what);
    cr_assert_leq(t->mfu, t->mfu_bound * (1 + 1e-9), "%s: MFU %g over %g",
                  what, t->mfu, t->mfu_bound);
    cr_assert_lt(t->mfu_bound, 1.0, "%s", what);
    double split = t->gemm + t->attention + t->memory;
    cr_assert(fabs(split - t->compute - t->recompute) <=
                  1e-6 * (t->compute + t->recompute),
              "%s: GEMM + attention + memory %g vs %g", what, split,
              t->compute + t->recompute);
    double parts = t->compute + t->recompute + t->tp_comm + t->cp_comm +
                   t->ep_comm + t->pp_comm + t->bubble + t->dp_comm +
                   t->optimizer + t->offload;
    bool at_bound = fabs(t->mfu / t->mfu_bound - 1) < 1e-9;
    cr_assert(at_bound || fabs(parts / t->step - 1) < 1e-6,
              "%s: parts %g s vs step %g s", what, parts, t->step);
}

Test(mfu, every_printed_plan_of_the_bundled_models, .timeout = 300)
{
    static const char *models[] = {
        "bert-base", "bert-large", "deepseek-v3", "gpt2-large",
        "gpt2-medium", "gpt2-small", "gpt2-xl", "llama-1b",
        "llama-2-13b", "llama-2-70b", "llama-2-7b", "llama-3-70b",
        "llama-3-8b", "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "mlp10",
        "qwen2-0.5b", "resnet152", "resnet50", "t5-base", "unet-sd-like",
        "unet-seg", "vit-b16", "vit-l16"};
    const uint32_t gpus[] = {8, 256};
    size_t checked = 0;
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char path[64];
        snprintf(path, sizeof path, "models/%s.yaml", models[i]);
        vp_model *m = load(path);
        vp_cluster_model *cm = cmodel(m);
        for (int g = 0; g < 2; g++) {
            vp_cluster c = cluster(gpus[g]);
            vp_search_opts o;
            vp_search_opts_init(&o);
            for (int d = 0; d < VP_DT__COUNT; d++)
                o.dtypes[d] = true;
            o.top = 5;
            vp_cluster_plan *pl = calloc(1, sizeof *pl);
            vp_error err;
            cr_assert_eq(vp_cluster_search(cm, &c, &o, pl, &err), VP_OK,
                         "%s: %s", path, err.msg);
            char what[128];
            snprintf(what, sizeof what, "%s on %u", models[i], gpus[g]);
            if (!pl->found) {
                check_entry(what, &pl->closest);
                checked++;
            } else {
                check_entry(what, &pl->best);
                for (size_t a = 0; a < pl->n_alt; a++)
                    check_entry(what, &pl->alt[a]);
                checked += 1 + pl->n_alt;
            }
            free(pl);
        }
        vp_cluster_model_free(cm);
        vp_model_free(m);
    }
    cr_assert_gt(checked, 100);
}

/* ---- the search's pins ----------------------------------------------- */

static vp_cluster_plan *search(vp_cluster_model *cm, const vp_cluster *c,
                               const vp_search_opts *o)
{
    vp_cluster_plan *pl = calloc(1, sizeof *pl);
    vp_error err;
    cr_assert_eq(vp_cluster_search(cm, c, o, pl, &err), VP_OK, "%s",
                 err.msg);
    return pl;
}

Test(pins, vpp_schedule_sp_and_stages_are_kept)
{
    vp_model *m = load("tests/data/cluster/gpt3-175b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(1024);
    vp_search_opts o;
    vp_search_opts_init(&o);
    o.tp = 8;
    o.pp = 8;
    o.vpp = 3;
    o.sp = 0;
    o.first_layers = 10;
    o.last_layers = 8;
    o.global_batch = 1024;
    vp_cluster_plan *pl = search(cm, &c, &o);
    cr_assert(pl->found);
    const vp_par *p = &pl->best.par;
    cr_assert_eq(p->schedule, VP_SCHED_INTERLEAVED);
    cr_assert_eq(p->vpp, 3u);
    cr_assert(!p->sp);
    cr_assert_eq(p->first_layers, 10u);
    cr_assert_eq(p->last_layers, 8u);
    for (size_t i = 0; i < pl->n_alt; i++) {
        cr_assert_eq(pl->alt[i].par.vpp, 3u);
        cr_assert(!pl->alt[i].par.sp);
    }
    free(pl);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* A pinned layout that does not fit still gets its step time */
Test(pins, nearest_configuration_is_timed)
{
    vp_model *m = load("tests/data/cluster/gpt3-175b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    vp_search_opts o;
    vp_search_opts_init(&o);
    o.tp = 8;
    o.pp = 8;
    o.recompute = VP_RC_NONE;
    o.sharding = VP_SHARD_MEGATRON;
    o.no_offload = true;
    o.global_batch = 64;
    vp_cluster_plan *pl = search(cm, &c, &o);
    cr_assert(!pl->found);
    cr_assert_gt(pl->closest.mem.total, c.memory);
    cr_assert_gt(pl->closest.time.step, 0.0);
    cr_assert_eq(pl->closest.par.recompute, VP_RC_NONE);
    free(pl);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- exports --------------------------------------------------------- */

static char *export_of(vp_cluster_model *cm, const vp_cluster *c,
                       const vp_par *p, vp_export_format f, vp_status *st)
{
    static char buf[8192];
    size_t len;
    vp_error err;
    *st = vp_export_plan(cm, c, p, f, buf, sizeof buf, &len, &err);
    if (*st != VP_OK)
        snprintf(buf, sizeof buf, "%s", err.msg);
    return buf;
}

Test(exports, megatron_flags_of_the_new_layouts)
{
    vp_model *m = load("tests/data/cluster/gpt3-175b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(512);
    vp_par p = par(8, 8, 8, VP_SHARD_DISTOPT);
    p.sp = true;
    p.first_layers = 10;
    p.last_layers = 8;
    p.schedule = VP_SCHED_INTERLEAVED;
    p.vpp = 2;
    p.overlap_tp = VP_ON;
    vp_status st;
    const char *s = export_of(cm, &c, &p, VP_EXPORT_MEGATRON, &st);
    cr_assert_eq(st, VP_OK, "%s", s);
    cr_assert_not_null(strstr(s, "--decoder-first-pipeline-num-layers 10"));
    cr_assert_not_null(strstr(s, "--decoder-last-pipeline-num-layers 8"));
    cr_assert_not_null(strstr(s, "--num-virtual-stages-per-pipeline-rank 2"));
    cr_assert_not_null(strstr(s, "--tp-comm-overlap"));
    cr_assert_not_null(strstr(s, "--overlap-param-gather"));
    p.dtype = VP_DT_FP16;
    p.overlap_dp = VP_OFF;
    s = export_of(cm, &c, &p, VP_EXPORT_MEGATRON, &st);
    cr_assert_null(strstr(s, "--accumulate-allreduce-grads-in-fp32"));
    cr_assert_null(strstr(s, "--overlap-grad-reduce"));
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(exports, deepspeed_and_torchrun_with_tp)
{
    vp_model *m = load("tests/data/cluster/megatron-22b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = cluster(64);
    vp_par p = par(8, 8, 1, VP_SHARD_ZERO1);
    vp_status st;
    const char *s = export_of(cm, &c, &p, VP_EXPORT_DEEPSPEED, &st);
    cr_assert_eq(st, VP_OK, "%s", s);
    cr_assert_not_null(strstr(s, "\"autotp_size\": 8"));
    p.sharding = VP_SHARD_ZERO3;
    s = export_of(cm, &c, &p, VP_EXPORT_DEEPSPEED, &st);
    cr_assert_eq(st, VP_EUNSUPPORTED);
    cr_assert_not_null(strstr(s, "Megatron-DeepSpeed"));
    p.sharding = VP_SHARD_FSDP_FULL;
    s = export_of(cm, &c, &p, VP_EXPORT_TORCHRUN, &st);
    cr_assert_eq(st, VP_EUNSUPPORTED);
    cr_assert_not_null(strstr(s, "torchtitan"));
    vp_cluster_model_free(cm);
    vp_model_free(m);
}
