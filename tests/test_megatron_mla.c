/* Megatron-Core's multi-head latent attention in the simulated Megatron
 * stage (src/graph_mla.c meg_mla; docs/DISTRIBUTED.md "Megatron-LM",
 * MLA): what a layer keeps for its backward, hand-derived from
 * MLASelfAttention (megatron/core/transformer/multi_latent_attention.py)
 * at tp 1 and 2 with and without sequence parallelism; the weights a
 * tensor-parallel rank holds (the down projections duplicated, the up
 * projections and linear_proj split); DeepSeek-V3's Megatron layouts
 * simulated. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/cluster.h"
#include "vramplan/vramplan.h"

#include "cluster_util.h"

#define MLA "tests/data/cluster/mla-dense.yaml"
/* its shape */
#define H 1024.0
#define HEADS 16.0
#define FFN 2048.0
#define QR 512.0  /* q_lora_rank */
#define KVR 256.0 /* kv_lora_rank */
#define DN 128.0  /* qk_head_dim (no position embedding) */
#define DR 64.0   /* qk_pos_emb_head_dim */
#define DV 128.0  /* v_head_dim */

/* What one dense MLA layer keeps for its backward (bf16, b = 1, no
 * dropout, Transformer Engine's fused attention), read off
 * MLASelfAttention's forward at tp = t, with n = s/t tokens on the rank
 * under sequence parallelism (s without), a = heads/t:
 *  - input_layernorm: its input 2nh and fp32 rstd 4n (each of the four
 *    norms' rstd a 512-B block at least);
 *  - linear_q_down_proj and linear_kv_down_proj (duplicated TELinear):
 *    one input between them, the norm's output, 2nh;
 *  - linear_q_up_proj (q_layernorm fused): the norm's input (q_down's
 *    output) 2n QR and rstd 4n, the GEMM's input 2n QR (sharded under
 *    SP, gathered for the GEMM);
 *  - linear_kv_up_proj (kv_layernorm fused): the same with the latent,
 *    2n KVR + 4n + 2n KVR; the latent is a view of kv_combined [n, KVR +
 *    DR], which the norm's saved input keeps whole: 2n DR more;
 *  - the core attention: q and k 2 s a (DN + DR) each, v and the output
 *    2 s a DV each, the logsumexp 4 a s;
 *  - pre_mlp_layernorm 2nh + 4n, linear_fc1's input 2nh, the fused
 *    SwiGLU's input 2 s 2f/t, linear_fc2's 2 s f/t. */
static double mla_layer(double s, double t, bool sp)
{
    double n = sp ? s / t : s, a = HEADS / t, f = FFN / t;
    double rstd = ceil(4 * n / 512) * 512; /* the allocator's 512-B unit */
    double norms = 2 * (2 * n * H) + 2 * n * QR + 2 * n * (KVR + DR) +
                   4 * rstd;
    double gemm_in = 2 * n * H + 2 * n * QR + 2 * n * KVR + 2 * n * H;
    double core = 2 * 2 * s * a * (DN + DR) + 2 * 2 * s * a * DV + 4 * a * s;
    double mlp = 2 * s * 3 * f;
    return norms + gemm_in + core + mlp;
}

/* A micro-batch in flight on a middle stage (1 of 4, m = 2 to 3, no
 * recomputation) keeps the count above, layer by layer, at tp 1, tp 2
 * and tp 2 with sequence parallelism. */
Test(megatron_mla, a_micro_batch_keeps_the_rule)
{
    vp_model *m = load(MLA);
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    const struct {
        uint32_t t;
        bool sp;
    } runs[] = {{1, false}, {2, false}, {2, true}};
    for (size_t i = 0; i < 3; i++) {
        vp_cluster c = profile_cluster("h100-80g", 4 * runs[i].t);
        vp_par p = par(1, runs[i].t, 4, VP_SHARD_MEGATRON);
        p.sp = runs[i].sp;
        p.recompute = VP_RC_NONE;
        vp_stage_sim a;
        double got = stage_one_more(cm, &c, p, 1, &a);
        double want = a.layers * mla_layer((double)in.seq, runs[i].t,
                                           runs[i].sp);
        cr_assert_eq(got, want, "t %u sp %d: %.0f vs %.0f (%+.0f)",
                     runs[i].t, runs[i].sp, got, want, got - want);
    }
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* DeepSeek-V3 (models/deepseek-v3.yaml) on 2048 H800s as its report lays
 * it out (pp 16, ep 64, dp 128, ZeRO-1: the distributed optimizer; 1F1B
 * here, DualPipe aside), and at tp 2 with sequence parallelism: a middle
 * stage's rank holds, per MoE layer, the whole down projections and
 * their norms (duplicated: q_down 7168 x 1536, kv_down 7168 x 576, the
 * 1536 and 512 norm weights), heads / t of the up projections (192 and
 * 256 wide per head) and of linear_proj (128 per head), the two layer
 * norms, the replicated router (256 x 7168), its 4 local experts and the
 * shared expert at 2048 / t each (3 GEMMs of 7168 x f). */
static uint64_t dsv3_layer_params(uint64_t t)
{
    uint64_t h = 7168, a = 128 / t, f = 2048 / t;
    uint64_t attn = h * 1536 + 1536 + a * 192 * 1536 + h * 576 + 512 +
                    512 * a * 256 + a * 128 * h;
    uint64_t moe = 256 * h + 4 * 3 * f * h + 3 * f * h;
    return attn + 2 * h + moe;
}

Test(megatron_mla, deepseek_v3_stage_weights_per_rank, .timeout = 60)
{
    vp_model *m = load("models/deepseek-v3.yaml");
    vp_cluster_model *cm = cmodel(m);
    for (uint32_t t = 1; t <= 2; t++) {
        vp_cluster c = profile_cluster("h800", 2048);
        vp_par p = par(128 / t, t, 16, VP_SHARD_DISTOPT);
        p.sp = t > 1;
        p.ep = 64;
        p.accum = 16;
        vp_stage_sim r;
        sim_stage(cm, &c, &p, 1, &r);
        cr_assert_eq(r.params, r.layers * dsv3_layer_params(t),
                     "t %u: %llu vs %u x %llu", t,
                     (unsigned long long)r.params, r.layers,
                     (unsigned long long)dsv3_layer_params(t));
        fprintf(stderr, "deepseek-v3 tp %u pp 16 ep 64 stage 1: %u layers, "
                "peak %.2f GiB allocated, %.2f GiB with NCCL and context\n",
                t, r.layers, (double)r.peak_alloc / (1 << 30),
                (double)r.total / (1 << 30));
    }
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* The report's layout (pp 16, ep 64, dp 128, the distributed optimizer,
 * micro-batch 1, global batch 1024 sequences of 4096; full recomputation,
 * 1F1B) on 2048 H800s: each stage that differs (first, middle, last) is
 * simulated and fits; the worst stage's figure and the fitted one are
 * printed (docs/DISTRIBUTED.md "Megatron-LM", MLA, gives them). */
Test(megatron_mla, deepseek_v3_report_layout_simulated, .timeout = 60)
{
    vp_model *m = load("models/deepseek-v3.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c = profile_cluster("h800", 2048);
    vp_par p = par(128, 1, 16, VP_SHARD_DISTOPT);
    p.ep = 64;
    p.accum = 8;
    vp_cluster_mem mem;
    vp_error err;
    cr_assert_eq(vp_cluster_eval(cm, &c, &p, &mem, NULL, &err), VP_OK, "%s",
                 err.msg);
    const uint32_t stages[] = {0, 1, 15};
    uint64_t worst = 0;
    uint32_t at = 0;
    for (size_t i = 0; i < 3; i++) {
        vp_stage_sim r;
        sim_stage(cm, &c, &p, stages[i], &r);
        cr_assert_leq(r.total, c.memory, "stage %u: %llu", stages[i],
                      (unsigned long long)r.total);
        if (r.total > worst) {
            worst = r.total;
            at = stages[i];
        }
    }
    fprintf(stderr, "deepseek-v3 pp 16 ep 64 dp 128: simulated %.2f GiB "
            "(stage %u), fitted %.2f GiB (stage %u)\n",
            (double)worst / (1 << 30), at, (double)mem.total / (1 << 30),
            mem.stage);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}
