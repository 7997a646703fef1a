/* Plans for clusters: the per-GPU memory model, the step-time model, the
 * search (checked against brute force), the exports and the CLI. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "vramplan/cluster.h"
#include "vramplan/vramplan.h"

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
    p.accum = 4;
    p.dtype = VP_DT_BF16;
    p.recompute = VP_RC_NONE;
    p.sharding = sh;
    p.bucket_view = true;
    return p;
}

static void eval_ok(vp_cluster_model *cm, const vp_cluster *c,
                    const vp_par *p, vp_cluster_mem *mem, vp_cluster_time *t)
{
    vp_error err;
    vp_status st = vp_cluster_eval(cm, c, p, mem, t, &err);
    cr_assert_eq(st, VP_OK, "%s", err.msg);
}

/* ---- the model ------------------------------------------------------- */

/* Graph-form and encoder-decoder models are planned whole
 * (tests/test_cluster_graph.c) */
Test(cluster_model, plans_graph_and_encoder_decoder_models_whole)
{
    static const char *const paths[] = {"models/resnet50.yaml",
                                        "models/t5-base.yaml"};
    for (size_t i = 0; i < 2; i++) {
        vp_model *m = load(paths[i]);
        vp_cluster_model *cm = cmodel(m);
        vp_cluster_model_info in;
        vp_cluster_model_info_get(cm, &in);
        cr_assert(in.whole, "%s", paths[i]);
        vp_cluster_model_free(cm);
        vp_model_free(m);
    }
}

Test(cluster_model, parameters_match_the_graph)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_error err;
    vp_graph *g = vp_graph_build(m, 1, 0, &err);
    cr_assert_not_null(g);
    uint64_t n;
    cr_assert_eq(vp_graph_num_params(g, &n, &err), VP_OK);
    cr_assert_eq(in.params, n, "%llu vs %llu", (unsigned long long)in.params,
                 (unsigned long long)n);
    cr_assert_gt(in.tp_unit, 1u);
    vp_graph_free(g);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- checks ------------------------------------------------------------ */

Test(cluster_check, rejects_invalid_configurations)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_error err;
    vp_par p = par(2, 4, 1, VP_SHARD_MEGATRON);
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_OK, "%s", err.msg);
    p = par(4, 1, 1, VP_SHARD_MEGATRON); /* 4 GPUs of 8 */
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_EARG);
    cr_assert(strstr(err.msg, "GPUs"), "%s", err.msg);
    p = par(1, 8, 1, VP_SHARD_MEGATRON); /* 12 heads */
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_EARG);
    cr_assert(strstr(err.msg, "heads"));
    p = par(8, 1, 1, VP_SHARD_MEGATRON);
    p.sp = true; /* sp without tp */
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_EARG);
    p = par(2, 2, 2, VP_SHARD_DDP); /* torch DDP with tp */
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_EARG);
    p = par(8, 1, 1, VP_SHARD_ZERO3);
    p.dtype = VP_DT_FP8;
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_EARG);
    p = par(8, 1, 1, VP_SHARD_ZERO1);
    p.offload = VP_OFFLOAD_ALL; /* params offload needs ZeRO-3 */
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_EARG);
    p = par(4, 1, 2, VP_SHARD_MEGATRON);
    p.schedule = VP_SCHED_INTERLEAVED;
    p.vpp = 7; /* 6 layers per stage, fewer than vpp */
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_EARG);
    p.vpp = 3; /* 12 = 2 x 3 x 2 and 4 micro-batches, a multiple of 2 */
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_OK, "%s", err.msg);
    p.accum = 3;
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_EARG);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- memory ------------------------------------------------------------ */

Test(cluster_memory, ddp_buckets_unless_bucket_view)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_par p = par(8, 1, 1, VP_SHARD_DDP);
    vp_cluster_mem a, b;
    eval_ok(cm, &c, &p, &a, NULL);
    p.bucket_view = false;
    eval_ok(cm, &c, &p, &b, NULL);
    /* fp32 params + grads + Adam; the buckets add one copy of the grads
     * (4 micro-batches: every .grad exists beside them from the second
     * on, and the activations of 1024 tokens keep the backward's peak
     * above the optimizer step's) */
    cr_assert_eq(a.weights + a.grads + a.optimizer, 16 * in.params);
    cr_assert_eq(b.weights + b.grads + b.optimizer, 16 * in.params);
    cr_assert_eq(b.buffers - a.buffers, 4 * in.params);
    cr_assert_gt(a.activations, 0u);
    cr_assert_gt(b.activations, 0u);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* The optimizer step is a peak of its own: foreach AdamW (PyTorch's
 * default, PYTORCH_MEMORY 4) holds _foreach_sqrt(exp_avg_sq), one more
 * fp32 copy of the parameters it updates, beside every gradient and no
 * activation. gpt2-small (P = 124439808) at 64 tokens, one sequence per
 * GPU, every layer recomputed: the activations are 12 layer inputs of
 * 64 x 768 (a few MB), one layer's recomputation and the head's peak
 * (64 x 50257 logits in 16 and 32 bits, their gradients, the tied word
 * embedding's gradient made there: 38597376 x 2 B = 77 MB in a 16-bit
 * module), about 110 MB in all: under what the step adds. */
Test(cluster_memory, optimizer_step_is_a_second_peak)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_error err;
    vp_cluster_model *cm = vp_cluster_model_new(m, 64, &err);
    cr_assert_not_null(cm, "%s", err.msg);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    const uint64_t P = in.params;
    cr_assert_eq(P, 124439808u);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_cluster_mem a;
    vp_par p = par(8, 1, 1, VP_SHARD_DDP);
    p.accum = 1;
    p.recompute = VP_RC_FULL;
#define ALLOC(x) ((x).weights + (x).grads + (x).optimizer + (x).buffers + \
                  (x).activations + (x).transient)
    /* DDP with bucket views: 4 P weights + 4 P grads + 8 P moments + 4 P
     * temporary = 20 P; the autocast copies are gone by then */
    eval_ok(cm, &c, &p, &a, NULL);
    cr_assert_eq(ALLOC(a), 20 * P);
    cr_assert_eq(a.activations, 0u);
    cr_assert_eq(a.transient, 4 * P);
    cr_assert_eq(a.buffers, 0u);
    /* without bucket views the buckets are there too: 24 P */
    p.bucket_view = false;
    eval_ok(cm, &c, &p, &a, NULL);
    cr_assert_eq(ALLOC(a), 24 * P);
    cr_assert_eq(a.buffers, 4 * P);
    /* Megatron's fused Adam works in place on the fp32 main grads: no
     * second peak, 2 + 4 + 12 = 18 P plus the activations */
    p = par(8, 1, 1, VP_SHARD_MEGATRON);
    p.accum = 1;
    p.recompute = VP_RC_FULL;
    eval_ok(cm, &c, &p, &a, NULL);
    cr_assert_gt(a.activations, 0u);
    cr_assert_eq(ALLOC(a) - a.activations - a.transient, 18 * P);
    /* DeepSpeed ZeRO-1 on 4 GPUs flattens the rank's bf16 gradient
     * partition (2 B) and converts it to fp32 (4 B) for the fp32
     * partition's .grad (stage_1_and_2.py step()): 2 P weights + 2 P
     * grads + 12 P / 4 state + 6 P / 4 = 4 P + 18 P / 4; the 6 P / 4 =
     * 187 MB exceed the 110 MB of the forward/backward */
    vp_cluster c4;
    vp_cluster_init(&c4, &hw, 4, 4);
    p.dp = 4;
    p.sharding = VP_SHARD_ZERO1;
    eval_ok(cm, &c4, &p, &a, NULL);
    cr_assert_eq(a.weights + a.grads + a.optimizer, 4 * P + 12 * P / 4);
    cr_assert_eq(ALLOC(a), 4 * P + 18 * P / 4);
    cr_assert_eq(a.activations, 0u);
    /* offloaded, the step runs on the host: no device temporary */
    p.offload = VP_OFFLOAD_OPTIMIZER;
    eval_ok(cm, &c4, &p, &a, NULL);
    cr_assert_gt(a.activations, 0u);
#undef ALLOC
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* DDP's .grad tensors beside the buckets appear during the backward: with
 * one micro-batch per step none exists yet at gpt2-small's peak (the
 * start of the backward, in the loss head, where the fp32 gradient of the
 * 2048 x 50257 logits is made before any weight gradient); with two
 * micro-batches all 4 P exist from the second one on. The activations
 * (logits alone 2048 x 50257 x 10 B = 1 GB) keep the forward/backward
 * peak above the optimizer step's (24 P vs 18 P + activations). */
Test(cluster_memory, ddp_grads_appear_during_the_backward)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    const uint64_t P = in.params;
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_cluster_mem one, two, bv;
    vp_par p = par(8, 1, 1, VP_SHARD_DDP);
    p.micro_batch = 2;
    p.bucket_view = false;
    p.accum = 1;
    eval_ok(cm, &c, &p, &one, NULL);
    p.accum = 2;
    eval_ok(cm, &c, &p, &two, NULL);
    p.bucket_view = true;
    eval_ok(cm, &c, &p, &bv, NULL);
    cr_assert_gt(one.activations, 6 * P);
    cr_assert_eq(one.grads, 0u);
    cr_assert_eq(two.grads, 4 * P);
    cr_assert_eq(one.buffers, 4 * P + 2 * P); /* buckets + autocast */
    cr_assert_eq(two.total - one.total,
                 (uint64_t)llround(4.0 * (double)P * 1.05), "%llu",
                 (unsigned long long)(two.total - one.total));
    /* bucket views: the grads are the buckets, as with accumulation */
    cr_assert_eq(bv.grads, 4 * P);
    cr_assert_eq(two.total - bv.total,
                 (uint64_t)llround(4.0 * (double)P * 1.05));
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_memory, sharded_states_and_gather_buffers)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_cluster_mem z3, fs, go;
    vp_par p = par(8, 1, 1, VP_SHARD_ZERO3);
    eval_ok(cm, &c, &p, &z3, NULL);
    p.sharding = VP_SHARD_FSDP_FULL;
    eval_ok(cm, &c, &p, &fs, NULL);
    p.sharding = VP_SHARD_FSDP_GRAD_OP;
    eval_ok(cm, &c, &p, &go, NULL);
    double P = (double)in.params;
    /* ZeRO-3: 16 bytes per parameter over 8 ranks */
    cr_assert_float_eq((double)(z3.weights + z3.grads + z3.optimizer),
                       16 * P / 8, 16.0);
    /* FSDP keeps two layers gathered (limit_all_gathers), one layer's
     * unsharded grads and the root unit; SHARD_GRAD_OP keeps every layer */
    double layer = (double)in.layer_params;
    double root = (double)(in.embed_params + in.head_params);
    cr_assert_float_eq((double)fs.buffers, 2 * 2 * layer + 2 * layer +
                                               2 * root, 16.0);
    cr_assert_gt(go.buffers, fs.buffers);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* FSDP2 (fully_shard, reshard_after_forward True, torchtitan's
 * MixedPrecisionPolicy): fp32 shards, gradients and AdamW states as
 * FSDP1's; at the backward the root group's parameters and the head's
 * gradients (bf16), a layer's parameters, the next one's prefetched
 * all-gather output and the layer's gradients (bf16), its fp32
 * reduce-scatter input and the 1/8 all-gather input */
Test(cluster_memory, fsdp2_states_and_buffers)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_cluster_mem f1, f2;
    vp_par p = par(8, 1, 1, VP_SHARD_FSDP_FULL);
    eval_ok(cm, &c, &p, &f1, NULL);
    p.sharding = VP_SHARD_FSDP2;
    eval_ok(cm, &c, &p, &f2, NULL);
    double P = (double)in.params;
    cr_assert_float_eq((double)(f2.weights + f2.grads + f2.optimizer),
                       16 * P / 8, 16.0);
    cr_assert_eq(f2.weights + f2.grads + f2.optimizer,
                 f1.weights + f1.grads + f1.optimizer);
    double layer = (double)in.layer_params;
    double root = (double)(in.embed_params + in.head_params);
    cr_assert_float_eq((double)f2.buffers,
                       2 * 2 * root + 3 * 2 * layer + 4 * layer +
                           2 * layer / 8,
                       16.0);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ZeroRedundancyOptimizer: DDP's replicated parameters, gradients and
 * buckets, each rank's AdamW states of its partition only */
Test(cluster_memory, ddp_zero1_partitions_the_optimizer)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_cluster_mem d, z;
    vp_par p = par(8, 1, 1, VP_SHARD_DDP);
    p.bucket_view = false;
    eval_ok(cm, &c, &p, &d, NULL);
    p.sharding = VP_SHARD_DDP_ZERO1;
    eval_ok(cm, &c, &p, &z, NULL);
    cr_assert_eq(z.weights, d.weights);
    cr_assert_eq(z.grads, d.grads);
    cr_assert_float_eq((double)d.optimizer, 8.0 * (double)in.params, 16.0);
    /* at least 1/8, at least the largest tensor (the embedding) */
    cr_assert_geq((double)z.optimizer, 8.0 * (double)in.params / 8 - 16);
    cr_assert_lt(z.optimizer, d.optimizer / 4);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* FSDP2 reduces in fp32 (torchtitan's reduce_dtype): its reduce-scatter
 * moves twice FSDP1's bf16 bytes */
Test(cluster_time, fsdp2_reduces_in_fp32)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 16, 8);
    vp_cluster_mem mem;
    vp_cluster_time f1, f2;
    vp_par p = par(16, 1, 1, VP_SHARD_FSDP_FULL);
    p.accum = 1;
    eval_ok(cm, &c, &p, &mem, &f1);
    p.sharding = VP_SHARD_FSDP2;
    eval_ok(cm, &c, &p, &mem, &f2);
    cr_assert_gt(f2.step, f1.step);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* HSDP2 as FSDP1's hybrid sharding: dp a multiple of a node, above it;
 * ddp-zero1 data parallelism only */
Test(cluster_check, hsdp2_and_ddp_zero1_layouts)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_error err;
    vp_par p = par(8, 1, 1, VP_SHARD_HSDP2);
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_EARG);
    cr_assert(strstr(err.msg, "hybrid sharding needs dp"), "%s", err.msg);
    p = par(4, 2, 1, VP_SHARD_DDP_ZERO1);
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_EARG);
    cr_assert(strstr(err.msg, "ddp-zero1 runs data parallelism only"), "%s",
              err.msg);
    p = par(4, 2, 1, VP_SHARD_FSDP2);
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_OK, "%s", err.msg);
    vp_cluster_init(&c, &hw, 16, 8);
    p = par(16, 1, 1, VP_SHARD_HSDP2);
    cr_assert_eq(vp_par_check(cm, &c, &p, &err), VP_OK, "%s", err.msg);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_memory, sequence_parallel_divides_activations_by_t)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_error err;
    uint64_t one, four, four_sp;
    cr_assert_eq(vp_cluster_layer_act(cm, VP_DT_BF16, false, 2, 1, false, 1,
                                      VP_RC_NONE, &one, &err),
                 VP_OK);
    cr_assert_eq(vp_cluster_layer_act(cm, VP_DT_BF16, false, 2, 4, false, 1,
                                      VP_RC_NONE, &four, &err),
                 VP_OK);
    cr_assert_eq(vp_cluster_layer_act(cm, VP_DT_BF16, false, 2, 4, true, 1,
                                      VP_RC_NONE, &four_sp, &err),
                 VP_OK);
    cr_assert_float_eq((double)four_sp / (double)one, 0.25, 0.01);
    cr_assert_gt(four, four_sp); /* without sp the norms are replicated */
    cr_assert_lt(four, one);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_memory, context_parallel_splits_the_sequence)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_error err;
    uint64_t one, two;
    cr_assert_eq(vp_cluster_layer_act(cm, VP_DT_BF16, false, 1, 1, false, 1,
                                      VP_RC_NONE, &one, &err),
                 VP_OK);
    cr_assert_eq(vp_cluster_layer_act(cm, VP_DT_BF16, false, 1, 1, false, 2,
                                      VP_RC_NONE, &two, &err),
                 VP_OK);
    cr_assert_float_eq((double)two / (double)one, 0.5, 0.02);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_memory, expert_parallel_shards_experts)
{
    vp_model *m = load("models/mixtral-8x7b.yaml");
    vp_error err;
    vp_cluster_model *cm = vp_cluster_model_new(m, 4096, &err);
    cr_assert_not_null(cm, "%s", err.msg);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 64, 8);
    vp_cluster_mem e1, e8;
    vp_cluster_time t8;
    vp_par p = par(8, 2, 4, VP_SHARD_DISTOPT);
    p.accum = 8;
    eval_ok(cm, &c, &p, &e1, NULL);
    p.ep = 8;
    eval_ok(cm, &c, &p, &e8, &t8);
    cr_assert_lt(e8.weights * 4, e1.weights); /* experts are most weights */
    cr_assert_eq(e8.nccl - e1.nccl, 7 * c.nccl_peer_bytes);
    cr_assert_gt(t8.ep_comm, 0.0);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_memory, offload_moves_state_to_the_host)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_cluster_mem a, b, all;
    vp_cluster_time ta, tb;
    vp_par p = par(8, 1, 1, VP_SHARD_ZERO2);
    eval_ok(cm, &c, &p, &a, &ta);
    p.offload = VP_OFFLOAD_OPTIMIZER;
    eval_ok(cm, &c, &p, &b, &tb);
    cr_assert_gt(a.optimizer, 0u);
    cr_assert_eq(b.optimizer, 0u);
    cr_assert_eq(a.host, 0u);
    cr_assert_gt(b.host, 0u);
    cr_assert_gt(tb.optimizer, ta.optimizer); /* the CPU steps slower */
    p.sharding = VP_SHARD_ZERO3;
    p.offload = VP_OFFLOAD_ALL;
    eval_ok(cm, &c, &p, &all, NULL);
    cr_assert_eq(all.weights + all.grads + all.optimizer, 0u);
    c.host_mem = b.host - 1;
    cr_assert(!vp_cluster_fits(&c, &b));
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_memory, nccl_buffers_per_communicator)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_cluster_mem a, b;
    vp_par p = par(8, 1, 1, VP_SHARD_MEGATRON);
    eval_ok(cm, &c, &p, &a, NULL);
    p = par(4, 2, 1, VP_SHARD_MEGATRON);
    eval_ok(cm, &c, &p, &b, NULL);
    cr_assert_eq(a.nccl, c.nccl_comm_bytes);     /* DP */
    cr_assert_eq(b.nccl, 2 * c.nccl_comm_bytes); /* DP and TP */
    cr_assert_eq(c.nccl_comm_bytes, 320ull << 20);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_memory, pipeline_first_stage_holds_most)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_cluster_mem g, o;
    vp_par p = par(1, 1, 8, VP_SHARD_MEGATRON);
    p.accum = 32;
    eval_ok(cm, &c, &p, &o, NULL);
    p.schedule = VP_SCHED_GPIPE;
    eval_ok(cm, &c, &p, &g, NULL);
    cr_assert_eq(o.stage, 0u);
    cr_assert_float_eq(o.in_flight, 8.0, 1e-9);
    cr_assert_float_eq(g.in_flight, 32.0, 1e-9);
    cr_assert_gt(g.activations, 3 * o.activations);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- time -------------------------------------------------------------- */

Test(cluster_time, crossing_nodes_is_slower)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c8, c2;
    vp_cluster_init(&c8, &hw, 8, 8);
    vp_cluster_init(&c2, &hw, 8, 2);
    vp_par p = par(8, 1, 1, VP_SHARD_ZERO3);
    vp_cluster_mem m8, m2;
    vp_cluster_time t8, t2;
    eval_ok(cm, &c8, &p, &m8, &t8);
    eval_ok(cm, &c2, &p, &m2, &t2);
    cr_assert_geq(t2.dp_comm, t8.dp_comm);
    cr_assert_gt(t2.step, t8.step);
    cr_assert_gt(t8.mfu, 0.1);
    cr_assert_lt(t8.mfu, 1.0);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    cr_assert_float_eq(t8.tokens_per_s, 8.0 * 4 * (double)in.seq / t8.step,
                       1e-6);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_time, recomputation_costs_time)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_par p = par(4, 2, 1, VP_SHARD_MEGATRON);
    vp_cluster_mem mn, ms, mf;
    vp_cluster_time tn, ts, tf;
    eval_ok(cm, &c, &p, &mn, &tn);
    p.recompute = VP_RC_SELECTIVE;
    eval_ok(cm, &c, &p, &ms, &ts);
    p.recompute = VP_RC_FULL;
    eval_ok(cm, &c, &p, &mf, &tf);
    cr_assert_lt(tn.step, tf.step);
    cr_assert_leq(tn.step, ts.step);
    cr_assert_lt(mf.activations, mn.activations);
    cr_assert_gt(tf.hfu, tf.mfu);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- search ------------------------------------------------------------ */

static bool better(const vp_cluster_time *t, const vp_cluster_mem *m,
                   const vp_cluster_time *bt, const vp_cluster_mem *bm)
{
    double tol = 1e-9 * (t->step > bt->step ? t->step : bt->step);
    if (t->step < bt->step - tol)
        return true;
    if (t->step > bt->step + tol)
        return false;
    return m->host < bm->host || (m->host == bm->host && m->total < bm->total);
}

/* Brute force over the raw space: every valid configuration is counted
 * by the search (evaluated or pruned), the fitting ones agree, and the
 * best is the same. */
Test(cluster_search, exhaustive_against_brute_force, .timeout = 60)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 4);
    c.memory = 3ull << 30;
    vp_search_opts o;
    vp_search_opts_init(&o);
    o.global_batch = 16;
    o.dtypes[VP_DT_BF16] = o.dtypes[VP_DT_FP8] = true;
    vp_cluster_plan *pl = malloc(sizeof *pl);
    cr_assert_not_null(pl);
    vp_error err;
    cr_assert_eq(vp_cluster_search(cm, &c, &o, pl, &err), VP_OK, "%s",
                 err.msg);
    const uint32_t dv[] = {1, 2, 4, 8};
    uint64_t valid = 0, fitting = 0;
    vp_par best;
    vp_cluster_mem bm;
    vp_cluster_time bt;
    memset(&best, 0, sizeof best);
    memset(&bm, 0, sizeof bm);
    memset(&bt, 0, sizeof bt);
    bool have = false;
    for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++)
    for (int d = 0; d < 4; d++)
    for (int e = 0; e < 4; e++) {
        vp_par p;
        memset(&p, 0, sizeof p);
        p.dp = dv[a], p.tp = dv[b], p.pp = dv[d], p.cp = dv[e], p.ep = 1;
        if (p.dp * p.tp * p.pp * p.cp != 8 || 16 % p.dp)
            continue;
        for (uint64_t mb = 1; mb <= 16; mb++) {
            if ((16 / p.dp) % mb)
                continue;
            p.micro_batch = mb;
            p.accum = 16 / p.dp / mb;
            for (int dt = 0; dt < VP_DT__COUNT; dt++)
            for (int sc = 0; sc < VP_SCHED__COUNT; sc++)
            for (uint32_t v = 1; v <= 12; v++)
            for (int sp = 0; sp < 2; sp++)
            for (int rc = 0; rc < VP_RC__COUNT; rc++)
            for (int sh = 0; sh < VP_SHARD__COUNT; sh++)
            for (int of = 0; of < VP_OFFLOAD__COUNT; of++) {
                /* DualPipe is searched only when pinned */
                if ((dt != VP_DT_BF16 && dt != VP_DT_FP8) ||
                    sc == VP_SCHED_DUALPIPE)
                    continue;
                p.dtype = dt, p.schedule = sc, p.vpp = v, p.sp = sp;
                p.recompute = rc, p.sharding = sh, p.offload = of;
                p.bucket_view = true;
                if (vp_par_check(cm, &c, &p, &err) != VP_OK)
                    continue;
                /* the distributed optimizer on one replica is
                 * Megatron's DDP: the search keeps one of the two */
                if (sh == VP_SHARD_DISTOPT && p.dp * p.cp == 1)
                    continue;
                valid++;
                vp_cluster_mem mem;
                vp_cluster_time t;
                cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, &t, &err),
                             VP_OK);
                if (!vp_cluster_fits(&c, &mem))
                    continue;
                fitting++;
                if (!have || better(&t, &mem, &bt, &bm)) {
                    have = true;
                    best = p, bm = mem, bt = t;
                }
            }
        }
    }
    cr_assert_eq(pl->evaluated + pl->pruned, valid, "search %llu + %llu, "
                 "brute force %llu",
                 (unsigned long long)pl->evaluated,
                 (unsigned long long)pl->pruned, (unsigned long long)valid);
    cr_assert_gt(pl->pruned, 0u);
    cr_assert_eq(pl->fitting, fitting);
    cr_assert(have && pl->found);
    cr_assert_float_eq(pl->best.time.step, bt.step, 1e-12 * bt.step);
    /* a verified best carries its simulated memory: its fitted figure is
     * the brute force's */
    vp_cluster_mem fitted;
    vp_cluster_time ft;
    cr_assert_eq(vp_cluster_eval(cm, &c, &pl->best.par, &fitted, &ft, &err),
                 VP_OK);
    cr_assert_eq(fitted.total, bm.total);
    if (!pl->best.simulated)
        cr_assert_eq(pl->best.mem.total, bm.total);
    (void)best;
    /* alternatives are other layouts, each slower or equal */
    for (size_t i = 0; i < pl->n_alt; i++) {
        cr_assert_geq(pl->alt[i].time.step, pl->best.time.step * (1 - 1e-12));
        cr_assert(pl->alt[i].reason[0]);
    }
    free(pl);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_search, nothing_fits_then_the_smallest_cluster)
{
    vp_model *m = load("models/llama-2-70b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 1, 8);
    c.host_mem = 256ull << 30;
    vp_search_opts o;
    vp_search_opts_init(&o);
    o.global_batch = 64;
    vp_cluster_plan *pl = malloc(sizeof *pl);
    cr_assert_not_null(pl);
    vp_error err;
    cr_assert_eq(vp_cluster_search(cm, &c, &o, pl, &err), VP_OK, "%s",
                 err.msg);
    cr_assert(!pl->found);
    cr_assert_gt(pl->closest.mem.total, 0u);
    uint32_t gpus;
    cr_assert_eq(vp_cluster_min_gpus(cm, &c, &o, 65536, &gpus, pl, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_gt(gpus, 1u);
    cr_assert_leq(gpus, 64u);
    cr_assert_eq(gpus & (gpus - 1), 0u);
    cr_assert(pl->found);
    cr_assert(vp_cluster_fits(&c, &pl->best.mem) ||
              pl->best.mem.total <= c.memory);
    free(pl);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_search, pins_and_bad_batches)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 16, 8);
    vp_search_opts o;
    vp_search_opts_init(&o);
    o.global_batch = 64;
    o.tp = 2;
    o.recompute = VP_RC_FULL;
    vp_cluster_plan *pl = malloc(sizeof *pl);
    vp_error err;
    cr_assert_eq(vp_cluster_search(cm, &c, &o, pl, &err), VP_OK);
    cr_assert(pl->found);
    cr_assert_eq(pl->best.par.tp, 2u);
    cr_assert_eq(pl->best.par.recompute, VP_RC_FULL);
    o.tp = 3; /* divides no GPU count here */
    cr_assert_eq(vp_cluster_search(cm, &c, &o, pl, &err), VP_EARG);
    free(pl);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- export ------------------------------------------------------------ */

static char *export_text(vp_cluster_model *cm, const vp_cluster *c,
                         const vp_par *p, vp_export_format f, vp_status *st)
{
    static char buf[8192];
    size_t len;
    vp_error err;
    *st = vp_export_plan(cm, c, p, f, buf, sizeof buf, &len, &err);
    cr_assert_lt(len, sizeof buf);
    if (*st != VP_OK)
        snprintf(buf, sizeof buf, "%s", err.msg);
    return buf;
}

Test(cluster_export, engines)
{
    vp_model *m = load("models/llama-3-8b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 16, 8);
    vp_status st;
    vp_par p = par(16, 1, 1, VP_SHARD_ZERO3);
    p.offload = VP_OFFLOAD_ALL;
    char *t = export_text(cm, &c, &p, VP_EXPORT_DEEPSPEED, &st);
    cr_assert_eq(st, VP_OK, "%s", t);
    /* a DeepSpeed config is a JSON document */
    json_error_t je;
    json_t *ds = json_loads(t, 0, &je);
    cr_assert_not_null(ds, "not JSON: %s", je.text);
    json_t *zero = json_object_get(ds, "zero_optimization");
    cr_assert_eq(json_integer_value(json_object_get(zero, "stage")), 3);
    cr_assert_eq(json_integer_value(json_object_get(ds, "train_batch_size")),
                 64);
    cr_assert(json_is_object(json_object_get(zero, "offload_param")));
    cr_assert(json_is_true(
        json_object_get(json_object_get(ds, "bf16"), "enabled")));
    json_decref(ds);
    t = export_text(cm, &c, &p, VP_EXPORT_MEGATRON, &st);
    cr_assert_eq(st, VP_EUNSUPPORTED);
    cr_assert(strstr(t, "--engine megatron"), "%s", t);

    p = par(2, 4, 2, VP_SHARD_DISTOPT);
    p.sp = true;
    p.schedule = VP_SCHED_INTERLEAVED;
    p.vpp = 2;
    p.recompute = VP_RC_SELECTIVE;
    t = export_text(cm, &c, &p, VP_EXPORT_MEGATRON, &st);
    cr_assert_eq(st, VP_OK, "%s", t);
    cr_assert(strstr(t, "--tensor-model-parallel-size 4 --sequence-parallel"));
    cr_assert(strstr(t, "--pipeline-model-parallel-size 2"));
    cr_assert(strstr(t, "--num-layers-per-virtual-pipeline-stage 8"));
    cr_assert(strstr(t, "--use-distributed-optimizer"));
    cr_assert(strstr(t, "--recompute-activations"));
    cr_assert(strstr(t, "--global-batch-size 8"));
    cr_assert(strstr(t, "--num-query-groups 8"));
    p.schedule = VP_SCHED_GPIPE;
    p.vpp = 1;
    export_text(cm, &c, &p, VP_EXPORT_MEGATRON, &st);
    cr_assert_eq(st, VP_EUNSUPPORTED);

    p = par(16, 1, 1, VP_SHARD_FSDP_HYBRID);
    p.recompute = VP_RC_FULL;
    t = export_text(cm, &c, &p, VP_EXPORT_TORCHRUN, &st);
    cr_assert_eq(st, VP_OK, "%s", t);
    cr_assert(strstr(t, "torchrun --nnodes 2 --nproc-per-node 8"));
    cr_assert(strstr(t, "--fsdp \"hybrid_shard auto_wrap\""));
    cr_assert(strstr(t, "LlamaDecoderLayer"));
    cr_assert(strstr(t, "ShardingStrategy.HYBRID_SHARD"));
    cr_assert(strstr(t, "\"activation_checkpointing\": true"));
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_export, fsdp2_and_ddp_zero1_torchrun)
{
    vp_model *m = load("models/llama-1b.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 16, 8);
    vp_status st;
    vp_par p = par(16, 1, 1, VP_SHARD_FSDP2);
    char *t = export_text(cm, &c, &p, VP_EXPORT_TORCHRUN, &st);
    cr_assert_eq(st, VP_OK, "%s", t);
    cr_assert(strstr(t, "# FSDP2: fully_shard(layer) for each "
                        "LlamaDecoderLayer"), "%s", t);
    cr_assert(strstr(t, "reduce_dtype=torch.float32"), "%s", t);
    cr_assert(strstr(t, "\"version\": 2"), "%s", t);
    cr_assert(strstr(t, "--fsdp \"full_shard auto_wrap\""), "%s", t);
    p.sharding = VP_SHARD_HSDP2;
    t = export_text(cm, &c, &p, VP_EXPORT_TORCHRUN, &st);
    cr_assert_eq(st, VP_OK, "%s", t);
    cr_assert(strstr(t, "mesh=2-D"), "%s", t);
    cr_assert(strstr(t, "--fsdp \"hybrid_shard auto_wrap\""), "%s", t);
    p.sharding = VP_SHARD_DDP_ZERO1;
    t = export_text(cm, &c, &p, VP_EXPORT_TORCHRUN, &st);
    cr_assert_eq(st, VP_EUNSUPPORTED);
    cr_assert(strstr(t, "ZeroRedundancyOptimizer"), "%s", t);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_export, short_buffer_reports_the_length)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_hw hw;
    h100(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 8, 8);
    vp_par p = par(8, 1, 1, VP_SHARD_ZERO1);
    char small[16];
    size_t len;
    vp_error err;
    cr_assert_eq(vp_export_plan(cm, &c, &p, VP_EXPORT_DEEPSPEED, small,
                                sizeof small, &len, &err),
                 VP_OK);
    cr_assert_gt(len, sizeof small);
    cr_assert_eq(strlen(small), sizeof small - 1);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

Test(cluster_names, round_trip)
{
    for (int i = 0; i < VP_SHARD__COUNT; i++) {
        vp_sharding s;
        cr_assert_eq(vp_sharding_parse(vp_sharding_name((vp_sharding)i), &s),
                     VP_OK);
        cr_assert_eq((int)s, i);
    }
    vp_dtype d;
    cr_assert_eq(vp_dtype_parse("fp8", &d), VP_OK);
    cr_assert_eq(d, VP_DT_FP8);
    cr_assert_eq(vp_dtype_parse("int4", &d), VP_EARG);
    cr_assert_eq(vp_sharding_engine(VP_SHARD_FSDP_FULL), VP_ENGINE_TORCH);
    cr_assert_eq(vp_export_engine(VP_EXPORT_DEEPSPEED), VP_ENGINE_DEEPSPEED);
}

/* ---- CLI ---------------------------------------------------------------- */

static int run_cli(const char *args, char *out, size_t n)
{
    const char *bin = getenv("VRAMPLAN_BIN");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin && bin[0] ? bin : "./vramplan",
             args);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    size_t len = fread(out, 1, n - 1, f);
    out[len] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static bool wired(const char *out)
{
    return !strstr(out, "unknown command") && !strstr(out, "not available");
}

Test(cluster_cli, plan_prints_the_best_plan, .timeout = 30)
{
    static char out[1 << 16];
    int rc = run_cli("plan models/gpt2-small.yaml --gpus 8 --gpu h100-80g "
                     "--global-batch 32 --top 2",
                     out, sizeof out);
    cr_assert(wired(out), "plan --gpus must reach the cluster planner: %s",
              out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "Best plan"), "%s", out);
    cr_assert(strstr(out, "configurations evaluated"));
    rc = run_cli("plan models/gpt2-small.yaml --gpus 8 --gpu h100-80g "
                 "--format json",
                 out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "\"best\": {"));
    rc = run_cli("plan models/gpt2-small.yaml --gpus 8 --gpu h100-80g "
                 "--tp 0",
                 out, sizeof out);
    cr_assert_eq(rc, 2, "%s", out);
}

Test(cluster_cli, nothing_fits_names_the_smallest_cluster, .timeout = 30)
{
    static char out[1 << 16];
    int rc = run_cli("plan models/llama-2-70b.yaml --gpus 1 --gpu h100-80g "
                     "--global-batch 64 --host-mem 256GiB",
                     out, sizeof out);
    cr_assert(wired(out), "plan --gpus must reach the cluster planner: %s",
              out);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, "Nothing fits"), "%s", out);
    cr_assert(strstr(out, "The smallest cluster that fits"), "%s", out);
}

Test(cluster_cli, compare_and_export, .timeout = 30)
{
    static char out[1 << 16];
    int rc = run_cli("compare models/gpt2-small.yaml --gpus 8,16 "
                     "--gpu h100-80g --tokens 10B --format csv",
                     out, sizeof out);
    cr_assert(wired(out), "compare must be a command: %s", out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "gpu,gpus,fits,"), "%s", out);
    cr_assert(strstr(out, "h100-80g,16,true,"), "%s", out);
    rc = run_cli("export models/gpt2-small.yaml --gpus 8 --gpu h100-80g "
                 "--to deepspeed",
                 out, sizeof out);
    cr_assert(wired(out), "export must be a command: %s", out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "\"zero_optimization\""), "%s", out);
}
