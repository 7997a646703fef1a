/* Rules of the per-rank memory of the cluster planner that make mutants
 * found untested (scripts/mutants.tsv; docs/MUTANTS.md). Expected values
 * are worked out by hand from DeepSpeed's sources (the rule's citation in
 * src/cluster_mem.c). Run from the repository root. */
#include <criterion/criterion.h>

#include <math.h>
#include <string.h>

#include "cluster_util.h"

/* The H100 profile of test_cluster.c (80 GB, NVLink 450 GB/s). */
static void h100(vp_hw *h)
{
    memset(h, 0, sizeof *h);
    strcpy(h->name, "h100-80g");
    h->memory = 80ull << 30;
    h->context = 718077952;
    h->fp32 = 67e12;
    h->tf32 = 494.7e12;
    h->bf16 = 989.4e12;
    h->fp16 = 989.4e12;
    h->fp8 = 1978.9e12;
    h->hbm = 3.35e12;
    h->host = 55e9;
    h->nvlink = 450e9;
    h->network = 50e9;
    h->eff_max = 1.0;
    h->mem_eff = 1.0;
    vp_hw_fill_defaults(h);
}

/* vp_coll_time of an all-gather of `bytes` over n ranks `stride` apart on
 * a cluster of `gpus` H100s, 8 a node (default_nic: the profile names no
 * network, vp_cluster_init's default), against want, to 1e-9. */
static void expect_all_gather(bool default_nic, uint32_t gpus, double bytes,
                              uint32_t n, uint32_t stride, double want)
{
    vp_hw hw;
    h100(&hw);
    if (default_nic)
        hw.network = 0;
    vp_cluster c;
    vp_cluster_init(&c, &hw, gpus, 8);
    double t = vp_coll_time(&c, VP_COLL_ALL_GATHER, bytes, n, stride);
    cr_expect(fabs(t - want) <= 1e-9 * want, "%.9g s, expected %.9g s", t,
              want);
}

static vp_cluster_mem eval_mem_dt(const char *model, uint64_t seq,
                                  uint32_t gpus, vp_sharding sh,
                                  vp_dtype dt, uint64_t *P);

static vp_cluster_mem eval_mem(const char *model, uint64_t seq,
                               uint32_t gpus, vp_sharding sh, uint64_t *P)
{
    return eval_mem_dt(model, seq, gpus, sh, VP_DT_BF16, P);
}

/* One GPU's memory of the configuration par() makes, in dtype dt. */
static vp_cluster_mem eval_mem_dt(const char *model, uint64_t seq,
                                  uint32_t gpus, vp_sharding sh,
                                  vp_dtype dt, uint64_t *P)
{
    vp_model *m = load(model);
    vp_error err;
    vp_cluster_model *cm = vp_cluster_model_new(m, seq, &err);
    cr_assert_not_null(cm, "%s", err.msg);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    *P = in.params;
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, gpus, 8);
    vp_par p = par(gpus, 1, 1, sh);
    p.dtype = dt;
    vp_cluster_mem mem;
    cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, NULL, &err), VP_OK, "%s",
                 err.msg);
    vp_cluster_model_free(cm);
    vp_model_free(m);
    return mem;
}

/* DeepSpeed ZeRO-2 with overlap_comm (deepspeed/runtime/zero/
 * stage_1_and_2.py, DeepSpeedZeroOptimizer.__init__: "the buffers used
 * for overlapping ... 4.5x of the reduce_bucket_size"; reduce_bucket_size
 * 5e8 elements, capped here at the model's 5e7-element buckets): 4.5 x
 * 5e7 x 2 B = 450,000,000 B of bf16 gradient buffers. gpt2-small (P =
 * 124439808) on 4 GPUs, 64 tokens, every layer recomputed: the optimizer
 * step is the peak (its fp32 conversion of the gradient partition, 6 P /
 * 4 = 187 MB, beats the ~110 MB of activations): 2 P weights + 2 P / 4
 * gradients + 12 P / 4 Adam state + 6 P / 4 + the buffers = 7 P +
 * 450,000,000 B. */
Test(rules_dist, zero2_overlap_buffers_are_4_5_buckets)
{
    uint64_t P;
    vp_cluster_mem a =
        eval_mem("models/gpt2-small.yaml", 64, 4, VP_SHARD_ZERO2, &P);
    cr_assert_eq(P, 124439808u);
    cr_expect_eq(a.buffers, 450000000u, "buffers %llu",
                 (unsigned long long)a.buffers);
    cr_expect_eq(a.weights + a.grads + a.optimizer + a.buffers + a.transient,
                 7 * P + 450000000u);
    cr_expect_eq(a.activations, 0u);
}

/* DeepSpeed ZeRO-3 steps the rank's partition in sub-groups of at most
 * sub_group_size = 1e9 elements (deepspeed/runtime/zero/stage3.py,
 * _create_fp16_sub_groups and _prepare_fp32_grad_for_sub_group; default
 * in zero/config.py): the step's temporary is one sub-group's bf16 flat
 * gradient and its fp32 copy, (2 + 4) x 1e9 = 6e9 B, however large the
 * partition. llama-2-7b on 2 GPUs holds 3.37e9 parameters per rank, so
 * uncapped it would be 2.0e10 B. */
Test(rules_dist, zero3_steps_in_sub_groups)
{
    uint64_t P;
    vp_cluster_mem a =
        eval_mem("models/llama-2-7b.yaml", 64, 2, VP_SHARD_ZERO3, &P);
    cr_assert_gt(P / 2, 1000000000u);
    cr_expect_eq(a.transient, 6000000000u, "transient %llu",
                 (unsigned long long)a.transient);
}

/* The collectives' bandwidth within a node is NVLink x nvlink_eff (0.8,
 * src/cluster.c vp_cluster_init; docs/CLUSTER.md): an all-gather of 1 GiB
 * over the 8 GPUs of an H100 node (450 GB/s) is a ring of 7 steps; NCCL's
 * Simple protocol is the fastest at this size (src/cluster_coll.c,
 * ring_time): bus bandwidth 450 x 0.8 = 360 GB/s, algorithm bandwidth
 * 360 x 8 / 7 GB/s, latency 8.4 us (base) + 7 x 3.4 us (NVLink hops) =
 * 32.2 us: 32.2e-6 + 2^30 x 7 / (8 x 360e9) s = 2.6419e-3 s. (LL128:
 * 360 x 0.92 GB/s and 14 + 7 x 1.9 us, 2.84e-3 s; LL: at most 87.7
 * GB/s.) */
Test(rules_dist, nvlink_collectives_at_80_percent)
{
    double bytes = 1073741824.0;
    expect_all_gather(false, 8, bytes, 8, 1,
                      32.2e-6 + bytes * 7.0 / (8.0 * 360e9));
}

/* Across nodes a rank's traffic leaves through its own NIC: a profile
 * without one gets 400 Gb/s (50e9 B/s) on a Hopper-class GPU (bf16 of at
 * least 900 TFLOP/s; src/cluster.c vp_cluster_init), used at net_eff =
 * 0.85: 42.5e9 B/s. An all-gather of 1 GiB between 2 ranks 8 apart (one
 * per node) is one ring step over the network; NCCL's Simple protocol
 * is the fastest (src/cluster_coll.c ring_time): algorithm bandwidth
 * 42.5e9 x 2 B/s, latency 8.4 us (base) + 14.0 us (one network hop, a
 * rank per node: the tree's network latency) = 22.4 us. (LL128: 0.92 of
 * the bandwidth and 22.5 us; LL: half of it.) */
Test(rules_dist, network_collectives_at_85_percent_of_the_nic)
{
    double bytes = 1073741824.0;
    expect_all_gather(true, 16, bytes, 2, 8, 22.4e-6 + bytes / (2.0 * 42.5e9));
}

/* DeepSpeed ZeRO-3's gathered parameters and gradient bucket (defaults
 * of deepspeed/runtime/zero/config.py: stage3_max_live_parameters 1e9,
 * stage3_prefetch_bucket_size 5e7, reduce_bucket_size 5e8 elements;
 * src/cluster_mem.c stage_states). A llama-2-70b layer holds
 * 2 x 8192^2 + 2 x 8192 x 1024 (q, o; GQA k, v) + 3 x 8192 x 28672 (MLP)
 * + 2 x 8192 (norms) = 855,654,400 parameters: two layers in flight
 * (1.71e9) are over the live cap, so 1e9 + 5e7 elements are gathered (the
 * largest tensor, 8192 x 28672, is smaller), and the reduce bucket is full
 * at 5e8: 2 B x 1.05e9 + 2 B x 5e8 = 3.1e9 B of bf16 buffers. At 4096
 * tokens on 8 GPUs the backward (6.0e9 B of activations) is the peak, so
 * they are in the figure. */
Test(rules_dist, zero3_gathers_live_and_prefetch_and_one_reduce_bucket)
{
    uint64_t P;
    vp_cluster_mem a =
        eval_mem("models/llama-2-70b.yaml", 4096, 8, VP_SHARD_ZERO3, &P);
    cr_assert_gt(a.activations, 0u, "the optimizer step is the peak");
    cr_expect_eq(a.buffers, 3100000000u, "buffers %llu",
                 (unsigned long long)a.buffers);
}

/* Megatron-LM with fp16 (docs/api-guide/dist_optimizer.md, the
 * non-distributed optimizer): fp16 parameters and gradients (2 + 2 B),
 * then 16 B of optimizer state per parameter: the fp32 main parameters
 * (4), their fp32 gradients (4), Adam's two fp32 moments (8); 20 B in
 * all. gpt2-small (P = 124,439,808) on one GPU: 16 P = 1,991,036,928 B. */
Test(rules_dist, megatron_fp16_keeps_20_bytes_per_parameter)
{
    uint64_t P;
    vp_cluster_mem a = eval_mem_dt("models/gpt2-small.yaml", 64, 1,
                                   VP_SHARD_MEGATRON, VP_DT_FP16, &P);
    cr_assert_eq(P, 124439808u);
    cr_expect_eq(a.weights, 2 * P);
    cr_expect_eq(a.grads, 2 * P);
    cr_expect_eq(a.optimizer, 16 * P, "optimizer %llu",
                 (unsigned long long)a.optimizer);
}

/* A small collective runs NCCL's LL protocol (NVIDIA/nccl src/graph/
 * tuning.cc, ncclTunerConstantsDefaults; src/cluster_coll.c ring_time):
 * an all-gather of 64 KiB over the 8 GPUs of an H100 node is a ring of 7
 * steps; LL's latency is its ring base 6.6 us + 7 NVLink hops of 0.6 us =
 * 10.8 us (LL128: 14 + 7 x 1.9 = 27.3 us; Simple: 8.4 + 7 x 3.4 = 32.2
 * us), and its bus bandwidth half the link's, 0.5 x 360 GB/s, capped at
 * llMaxBws' one-node 87.7 GB/s: algorithm bandwidth 87.7 x 8 / 7 GB/s.
 * 10.8e-6 + 65536 x 7 / (8 x 87.7e9) s = 11.454 us. */
Test(rules_dist, small_collectives_run_ll_at_its_latency_and_bandwidth_cap)
{
    double bytes = 65536.0;
    expect_all_gather(false, 8, bytes, 8, 1,
                      10.8e-6 + bytes * 7.0 / (8.0 * 87.7e9));
}

/* DDP all-reduces the fp32 gradients in 25 MiB buckets as the backward
 * makes them (torch/nn/parallel/distributed.py, bucket_cap_mb = 25), so
 * only the last bucket's all-reduce is exposed when the backward is
 * longer than all of them (src/cluster_time.c dp_flat). gpt2-small's
 * 124,439,808 fp32 gradients, 497,759,232 B: 19 buckets of 26,197,854.3 B.
 * On the 8 GPUs of an H100 node an all-reduce is a ring of 14 steps; NCCL's
 * LL128 is the fastest at this size: 14 + 14 x 1.9 = 40.6 us and 0.92 x
 * 360 GB/s of bus bandwidth, x 8 / 14 for the algorithm's (Simple: 8.4 +
 * 14 x 3.4 = 56 us at 360 GB/s; LL: capped at 87.7 GB/s). With 16
 * sequences of 1024 tokens per GPU the backward (~0.1 s) hides the other
 * 18: 40.6e-6 + 26197854.3 x 14 / (8 x 0.92 x 360e9) s = 179.03 us. */
Test(rules_dist, ddp_exposes_only_the_last_25_mib_bucket)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_error err;
    vp_cluster_model *cm = vp_cluster_model_new(m, 1024, &err);
    cr_assert_not_null(cm, "%s", err.msg);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_par p = par(8, 1, 1, VP_SHARD_DDP);
    p.micro_batch = 16;
    p.recompute = VP_RC_NONE;
    vp_cluster_mem mem;
    vp_cluster_time t;
    cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, &t, &err), VP_OK, "%s",
                 err.msg);
    double bucket = 124439808.0 * 4 / 19;
    double want = 40.6e-6 + bucket * 14.0 / (8.0 * 0.92 * 360e9);
    cr_expect(fabs(t.dp_comm - want) <= 1e-9 * want,
              "%.9g s exposed, expected %.9g s", t.dp_comm, want);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}
