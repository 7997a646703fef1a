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

static void sim_stage(vp_cluster_model *cm, const vp_cluster *c,
                      const vp_par *p, uint32_t stage, vp_stage_sim *out)
{
    vp_error err;
    cr_assert_eq(vp_cluster_stage_sim(cm, c, p, stage, out, &err), VP_OK,
                 "%s", err.msg);
}

/* The peak's growth from m = 2 to 3 micro-batches on stage `stage`: one
 * more micro-batch in flight, what its layers keep. */
static double one_more(vp_cluster_model *cm, const vp_cluster *c, vp_par p,
                       uint32_t stage, vp_stage_sim *a)
{
    vp_stage_sim b;
    p.accum = 2;
    sim_stage(cm, c, &p, stage, a);
    p.accum = 3;
    sim_stage(cm, c, &p, stage, &b);
    return (double)b.peak_alloc - (double)a->peak_alloc;
}

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
        double got = one_more(cm, &c, p, 1, &a);
        double want = a.layers * mla_layer((double)in.seq, runs[i].t,
                                           runs[i].sp);
        cr_assert_eq(got, want, "t %u sp %d: %.0f vs %.0f (%+.0f)",
                     runs[i].t, runs[i].sp, got, want, got - want);
    }
    vp_cluster_model_free(cm);
    vp_model_free(m);
}
