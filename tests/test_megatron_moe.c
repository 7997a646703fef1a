/* Megatron-Core's MoE layer in the simulated Megatron stage (src/graph_
 * moe.c meg_moe, src/ops/moe.c meg_*, src/dist_megatron.c): what a layer
 * keeps for its backward, from the router and the token dispatcher's
 * rule (docs/DISTRIBUTED.md "Megatron-LM", MoE); the experts' optimizer
 * shard over the expert-data-parallel group; the layouts still refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/cluster.h"
#include "vramplan/vramplan.h"

#include "cluster_util.h"

#define MIXTRAL "models/mixtral-8x7b.yaml"

static void h100(vp_cluster *c, uint32_t gpus)
{
    *c = profile_cluster("h100-80g", gpus);
    c->moe_imbalance = 1; /* balanced routing: the rule's case */
}

/* What one Megatron MoE layer keeps (bf16, no dropout, the flash kernel,
 * b = 1, tp = t with sequence parallelism, ep = e, balanced): the
 * attention block as Korthikanti et al. count it under SP (the two norms'
 * inputs and the qkv input on s/t tokens; q, k, v, the output and the
 * logsumexp split over t), the norms' fp32 rstd per local token, the
 * router's input (the norm output, s/t tokens); the router's fp32 top-k
 * softmax [n, k], top indices (int64) and the aux loss's fp32 scores
 * [n, E]; the dispatcher's sorted indices (int64, n k); the grouped MLP's
 * rows r = n k t (the gathered tokens): fc1's input [r, h], the SwiGLU's
 * input [r, 2f/t] and probs [r], fc2's input [r, f/t], n = s/t tokens. */
static double moe_layer(const vp_cluster_model_info *in, uint64_t f_exp,
                        double t)
{
    double s = (double)in->seq, h = (double)in->hidden;
    double a = (double)in->heads / t, d = (double)in->head_dim;
    double kv = in->kv_heads >= t ? (double)in->kv_heads / t : 1;
    double n = s / t, k = (double)in->top_k, E = (double)in->experts;
    double f = (double)f_exp / t, r = n * k * t;
    double attn = 3 * 2 * n * h + 2 * s * (a * d + 2 * kv * d) +
                  2 * s * a * d + a * s * 4;
    double norms = 2 * n * 4, router_in = 2 * n * h;
    double router = n * k * 4 + n * k * 8 + n * E * 4;
    double dispatch = n * k * 8;
    double experts = r * (2 * h + 2 * 2 * f + 2 + 2 * f);
    return attn + norms + router_in + router + dispatch + experts;
}

/* Mixtral 8x7B (8 experts, top 2, f 14336), pp 4, stage 1, no
 * recomputation: a micro-batch in flight keeps the rule's bytes, layer
 * by layer, at tp 1 and 2 (SP) and ep 1, 2, 4, 8: the local experts'
 * count changes the weights, not the rows (balanced). */
Test(megatron_moe, a_micro_batch_keeps_the_rule)
{
    vp_model *m = load(MIXTRAL);
    vp_cluster_model *cm = cmodel(m);
    vp_cluster_model_info in;
    vp_cluster_model_info_get(cm, &in);
    for (uint32_t t = 1; t <= 2; t++)
        for (uint32_t e = 1; e <= 8; e *= 2) {
            vp_cluster c;
            h100(&c, 4 * t * 8);
            vp_par p = par(8, t, 4, VP_SHARD_MEGATRON);
            p.sp = t > 1;
            p.ep = e;
            p.recompute = VP_RC_NONE;
            vp_stage_sim a;
            double got = stage_one_more(cm, &c, p, 1, &a);
            double want = a.layers * moe_layer(&in, 14336, t);
            cr_assert_eq(got, want, "t %u ep %u: %.0f vs %.0f (%+.0f)", t,
                         e, got, want, got - want);
        }
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* The distributed optimizer shards the dense parameters over dp and the
 * routed experts' over the expert-data-parallel group, dp / ep (Mixtral
 * 8x7B, dp 8, pp 4, ep 8: one local expert, its weights stepped whole on
 * every rank): 12 B (fp32 master, two moments) of each shard element,
 * the fused Adam's 4 B step; the experts' weights are 3 f h per local
 * expert and layer. */
Test(megatron_moe, experts_sharded_over_expert_data_parallel)
{
    vp_model *m = load(MIXTRAL);
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c;
    h100(&c, 32);
    for (uint32_t e = 1; e <= 8; e *= 8) {
        vp_par p = par(8, 1, 4, VP_SHARD_DISTOPT);
        p.ep = e;
        vp_stage_sim r;
        sim_stage(cm, &c, &p, 1, &r);
        uint64_t X = r.layers * (8 / e) * 3ull * 14336 * 4096;
        uint64_t D = r.params - X, ew = 8 / e;
        double want = 12.0 * (double)((D + 7) / 8 + (X + ew - 1) / ew) + 4;
        cr_assert(fabs((double)r.by_category[VP_CAT_OPTIM] / want - 1) <
                      5e-4,
                  "ep %u: %llu vs %.0f", e,
                  (unsigned long long)r.by_category[VP_CAT_OPTIM], want);
    }
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* What the simulated stage still refuses in an MoE model, named:
 * DeepSeek-V3's latent attention under context parallelism (k and v of
 * different widths in Transformer Engine's KV ring, not modelled) and
 * tp > 1 without sequence parallelism (Megatron's arguments.py requires
 * it with MoE). */
Test(megatron_moe, refusals_are_named)
{
    const char *model[] = {"models/deepseek-v3.yaml", MIXTRAL};
    const char *why[] = {"latent attention under context parallelism",
                         "no sequence parallelism"};
    for (int k = 0; k < 2; k++) {
        vp_model *m = load(model[k]);
        vp_cluster_model *cm = cmodel(m);
        vp_cluster c;
        h100(&c, k == 0 ? 128 : 64);
        vp_par p = par(8, 2, 4, VP_SHARD_MEGATRON);
        p.sp = k == 0;
        p.cp = k == 0 ? 2 : 1;
        p.ep = 8;
        vp_stage_sim r;
        vp_error err;
        cr_assert_eq(vp_cluster_stage_sim(cm, &c, &p, 0, &r, &err),
                     VP_EUNSUPPORTED, "%s", err.msg);
        cr_assert_not_null(strstr(err.msg, why[k]), "%s", err.msg);
        vp_cluster_model_free(cm);
        vp_model_free(m);
    }
}

/* The model's first dense layers on a 1F1B stage are built dense
 * (--moe-layer-freq; megatron.c dense_on_stage): tests/data/cluster/moe-
 * dense3.yaml (3 dense layers of ffn 8192, then 64 experts of 1024, 1
 * shared), pp 2, 4 layers a stage: stage 0 holds 3 dense layers and 1 MoE
 * layer, stage 1 four MoE layers; an MoE layer's MLP has the router
 * (64 h), 64 experts and the shared expert (3 x 1024 h each), a dense
 * layer's 3 x 8192 h. */
Test(megatron_moe, dense_first_layers_on_their_stage)
{
    vp_model *m = load("tests/data/cluster/moe-dense3.yaml");
    vp_cluster_model *cm = cmodel(m);
    vp_cluster c;
    h100(&c, 2);
    vp_par p = par(1, 1, 2, VP_SHARD_MEGATRON);
    vp_stage_sim r0, r1;
    sim_stage(cm, &c, &p, 0, &r0);
    sim_stage(cm, &c, &p, 1, &r1);
    uint64_t h = 2048, moe = 64 * h + 65 * 3 * 1024 * h, dense = 3 * 8192 * h;
    uint64_t emb = 32000 * h, head = 32000 * h + h; /* + the final norm */
    cr_assert_eq(r0.layers, 4u);
    cr_assert_eq(r0.params - emb - r1.params + head, 3 * (dense - moe));
    vp_cluster_model_free(cm);
    vp_model_free(m);
}
