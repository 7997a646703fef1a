/* Plans for clusters: the evaluation of one configuration, the memory of
 * its most loaded GPU (docs/CLUSTER.md) and the call into the time model
 * (cluster_time.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"

/* ------------------------------------------------------------------ */
/* Evaluation                                                          */
/* ------------------------------------------------------------------ */

void vp__evctx_init(vp__evctx *x, const vp_cluster_model *cm,
                    const vp_cluster *c)
{
    memset(x, 0, sizeof *x);
    x->cm = cm;
    x->c = c;
    x->hw = c->hw;
    vp_hw_fill_defaults(&x->hw);
    static const int lin[VP_DT__COUNT] = {
        [VP_DT_BF16] = VP_HW_BF16, [VP_DT_FP16] = VP_HW_FP16,
        [VP_DT_FP8] = VP_HW_FP8, [VP_DT_FP32] = VP_HW_FP32};
    static const int mm[VP_DT__COUNT] = {
        [VP_DT_BF16] = VP_HW_BF16, [VP_DT_FP16] = VP_HW_FP16,
        [VP_DT_FP8] = VP_HW_BF16, [VP_DT_FP32] = VP_HW_FP32};
    for (int d = 0; d < VP_DT__COUNT; d++) {
        x->lin[d] = &x->hw.gemm[lin[d]];
        x->mm[d] = &x->hw.gemm[mm[d]];
        x->peak[d] = vp__dtype_rate(&c->hw, (vp_dtype)d, true);
    }
    x->host_bw = c->hw.host > 0 ? c->hw.host : 25e9;
}

double vp__fitv(const vp__fit *f, double b, double t, bool sp)
{
    double r = f->r0 + f->r1 * b, s = f->s0 + f->s1 * b;
    r = r > 0 ? r : 0;
    s = s > 0 ? s : 0;
    return sp ? (r + s) / t : r + s / t;
}

double vp_pipeline_in_flight(vp_schedule s, uint32_t p, uint64_t m,
                             uint32_t v, uint32_t stage)
{
    if (p <= 1)
        return 1.0;
    double md = (double)m;
    if (s == VP_SCHED_GPIPE)
        return md;
    if (s == VP_SCHED_DUALPIPE) {
        /* DeepSeek-V3 report Table 2 (deepseek-ai/DualPipe README):
         * PP + 1 chunks of activations on every rank */
        double f = (double)p + 1;
        return f < md ? f : md;
    }
    if (s == VP_SCHED_INTERLEAVED && v > 1) {
        /* Megatron: (p - k - 1) * 2 + (v - 1) * p warm-up chunks + 1 */
        double w = (double)(p - stage - 1) * 2.0 + (double)(v - 1) * p + 1;
        double all = md * v;
        return (w < all ? w : all) / (double)v;
    }
    double f = (double)(p - stage);
    return f < md ? f : md;
}

double vp_pipeline_bubble_time(vp_schedule s, uint32_t p, uint32_t v,
                               double f, double b, double w)
{
    if (p <= 1)
        return 0;
    if (s == VP_SCHED_DUALPIPE) {
        double x = f + 2 * b - 3 * w;
        return (p / 2 > 1 ? (double)(p / 2 - 1) : 0) * (x > 0 ? x : 0);
    }
    double n = (double)(p - 1) * (f + b);
    return s == VP_SCHED_INTERLEAVED && v > 1 ? n / v : n;
}

double vp_pipeline_bubble(uint32_t p, uint64_t m, uint32_t v)
{
    if (p <= 1 || m == 0)
        return 0;
    return (double)(p - 1) / ((double)m * (v ? v : 1));
}

/* States of one stage: dense params pd (group D), expert params pe
 * (group De), the largest gathered unit pu, root unit (FSDP: embedding +
 * head) pr. Two moments of a step are peaks: the forward/backward one,
 * w + gfb + o + buf + activations + transient, and the optimizer step,
 * w + g + o + bopt + temp (docs/CLUSTER.md "Two peaks"). */
typedef struct {
    double w, g, o, buf, host; /* bytes on the GPU, host per rank; g: every
                                  gradient, as the optimizer step has them */
    double gfb;   /* gradients resident at the forward/backward peak     */
    double bopt;  /* buffers during the optimizer step                    */
    double temp;  /* the optimizer step's temporaries                     */
    double popt;  /* params whose optimizer step runs here                */
} stbytes;

/* DeepSpeed's sub_group_size: ZeRO-3 steps its partition in sub-groups
 * of at most this many elements. */
#define DS_SUB_GROUP 1e9

/* PyTorch DDP without gradient_as_bucket_view, one micro-batch per step:
 * the .grad tensors (apart from the buckets) appear as the backward makes
 * them, so at its peak only those made so far exist. With accumulation
 * they exist from the second micro-batch on; bucket views are the
 * buckets, allocated when DDP is built. */
static inline bool bucket_views(const vp_par *p)
{
    /* ZeroRedundancyOptimizer's DDP keeps its .grad apart from the
     * buckets (dist_ddp.c: ddp-zero1 without gradient_as_bucket_view) */
    return p->sharding == VP_SHARD_DDP && p->bucket_view;
}

static inline bool grads_progressive(const vp_par *p)
{
    return vp__ddp_like(p->sharding) && !bucket_views(p) && p->accum == 1;
}

/* The share of the simulated gradients (those the backward has made by
 * its peak, VP__Q_*_GRAD) that is memory beyond the resident states: 0
 * for DDP's bucket views and for accumulated gradients (copied into the
 * buckets or added in place), 1 otherwise (DDP's progressive .grad,
 * FSDP's unsharded gradients, the other engines as before). */
static inline double sim_grad_share(const vp_par *p)
{
    if (vp__ddp_like(p->sharding) && !grads_progressive(p))
        return 0.0;
    return 1.0;
}

/* The largest parameter tensor of a layer on one rank (DeepSpeed gathers
 * a sub-module whole, whatever stage3_max_live_parameters says). */
static double largest_tensor(const vp_cluster_model *cm, double t)
{
    double big = 0;
    if (cm->whole) /* a graph-form model (cluster_graph.c) */
        return cm->whole->big;
    for (size_t i = 0; i < cm->n_gemm; i++) {
        const vp__gemm *g = &cm->gemm[i];
        double n = g->n * g->k / (g->split == VP__SPLIT_NONE ? 1 : t);
        if (n > big)
            big = n;
    }
    return big;
}

/* DeepSpeed ZeRO-3 defaults: stage3_max_live_parameters,
 * stage3_prefetch_bucket_size, reduce_bucket_size (elements;
 * deepspeed/runtime/zero/config.py). */
#define DS_MAX_LIVE 1e9
#define DS_PREFETCH 5e7
#define DS_REDUCE_BUCKET 5e8

/* FSDP2's unsharded bytes at the forward/backward peak (PyTorch 2.11
 * torch/distributed/fsdp/_fully_shard/, dist_fsdp2.c), reshard_after_
 * forward True, parameters gathered in ab bytes, reduced in fp32: the
 * root group (embedding, head: pr) is unsharded from the head's backward
 * to the embedding's with the head's unsharded gradients
 * (FSDPParamGroup.post_backward runs once all its gradients exist); a
 * layer's backward holds its unsharded parameters, the next group's
 * prefetched all-gather output, its unsharded gradients and the fp32
 * reduce-scatter input (foreach_reduce, _chunk_cat), the all-gather input
 * (the shard cast to ab, 1/D of a unit) beside. Under torchao's fp8
 * all-gather (float8/fsdp_utils.py fsdp_pre_all_gather / fsdp_post_all_
 * gather) a layer's parameters are gathered in fp8 (lb = 1: its unsharded
 * and prefetched parameters and the all-gather input; the root group,
 * whose output head torchtitan leaves in bf16, and the gradients keep
 * ab); with force_recompute_fp8_weight_in_bwd no fp8 weight is saved for
 * the backward: the backward gathers it again. */
static double fsdp2_buffers(double ab, double lb, double pu, double pr,
                            double D)
{
    double layer = 2.0 * lb * pu + ab * pu + 4.0 * pu + lb * pu / D;
    return 2.0 * ab * pr + layer;
}

/* Parameters whose optimizer state a DDP rank holds: all, or with
 * ZeroRedundancyOptimizer those of its partition (zero_redundancy_
 * optimizer.py _partition_parameters: whole tensors, greedily by size, so
 * at least the largest tensor), stepped then broadcast in place. */
static double ddp_opt_params(const vp__evctx *x, const vp_par *p, double P,
                             double Ps)
{
    if (p->sharding != VP_SHARD_DDP_ZERO1)
        return P;
    double big = largest_tensor(x->cm, p->tp);
    return Ps > big ? Ps : big;
}

/* Bytes a parameter of the stage costs in weights, gradients and optimizer
 * state, by engine and dtype. */
static void state_bytes(const vp_par *p, vp_engine e, double *w, double *g,
                        double *opt)
{
    if (p->dtype == VP_DT_FP32) {
        *w = 4, *g = 4, *opt = 8;
    } else if (e == VP_ENGINE_MEGATRON && p->dtype == VP_DT_FP16) {
        /* fp16 gradients, fp32 main parameters and their fp32 gradient
         * copy, Adam moments: 20 bytes (docs/api-guide/dist_optimizer.md) */
        *w = 2, *g = 2, *opt = 16;
    } else if (e == VP_ENGINE_MEGATRON && p->dtype == VP_DT_FP8) {
        /* Megatron-Bridge's fp8 recipes (mixed_precision.py
         * bf16_with_fp8_*_mixed: fp8_param_gather; the performance
         * configs' grad_reduce_in_fp32 = False): the parameters are
         * Transformer Engine Float8Tensors, fp8 data and its transpose
         * for the wgrad/dgrad GEMMs, no bf16 copy; bf16 grad buffer;
         * fp32 main parameters and moments */
        *w = 2, *g = 2, *opt = 12;
    } else if (e == VP_ENGINE_MEGATRON) {
        *w = 2, *g = 4, *opt = 12;
    } else if (e == VP_ENGINE_DEEPSPEED) {
        *w = 2, *g = 2, *opt = 12;
    } else {
        *w = 4, *g = 4, *opt = 8; /* fp32 parameters, autocast / FSDP MP */
    }
}

/* The host's share under optimizer or full offload. */
static void offload_states(const vp_par *p, vp_engine e, double P, double Ps,
                           double w, double g, double opt, stbytes *o)
{
    if (p->offload == VP_OFFLOAD_OPTIMIZER) {
        o->host = (opt + 4.0) * Ps; /* state + the fp32 grad partition */
        o->o = 0;
        o->temp = 0; /* the step runs on the host */
        if (e == VP_ENGINE_DEEPSPEED) {
            /* grads leave for the host as they are reduced */
            if (p->sharding != VP_SHARD_ZERO3) {
                double bucket = P < 5e7 ? P : 5e7;
                o->g = o->gfb = 0;
                o->buf = o->bopt = 4.5 * bucket * g;
            } else {
                o->g = o->gfb = 0;
            }
        }
    } else if (p->offload == VP_OFFLOAD_ALL) {
        o->host = (w + g + opt) * Ps;
        o->w = o->g = o->gfb = o->o = 0;
        o->temp = 0; /* the step runs on the host */
    }
}

static void stage_states(const vp__evctx *x, const vp_par *p, double pd,
                         double pe, double pu, double pr, stbytes *o)
{
    double D = (double)p->dp * p->cp;
    double De = D / p->ep;
    double P = pd + pe;
    vp_engine e = vp_sharding_engine(p->sharding);
    bool f32 = p->dtype == VP_DT_FP32;
    double w, g, opt;
    state_bytes(p, e, &w, &g, &opt);
    double ab = f32 ? 4 : 2; /* gathered / autocast copies */
    double Ps;               /* sharded parameter count per rank */
    double Dsh = D;          /* the shard group */
    if (vp__hybrid(p->sharding)) {
        double gpn = (double)x->c->gpus_per_node;
        Dsh = gpn < D ? gpn : D;
        Ps = pd / Dsh + pe / Dsh;
    } else {
        Ps = pd / D + pe / De;
    }
    /* DeepSpeed's step (stage_1_and_2.py step(), stage3.py
     * _prepare_fp32_grad_for_sub_group): the gradient partition is
     * flattened (a copy in the gradient dtype) and converted to fp32 to
     * become the fp32 partition's .grad; FusedAdam then runs in place */
    double ds_flat = g + (g < 4 ? 4.0 : 0.0);
    memset(o, 0, sizeof *o);
    switch (p->sharding) {
    case VP_SHARD_DDP:
    case VP_SHARD_DDP_ZERO1: {
        double po = ddp_opt_params(x, p, P, Ps);
        o->w = w * P, o->g = g * P, o->o = opt * po;
        /* buckets (1x grads, from construction) unless the grads are
         * views of them; autocast's bf16 weight copies, saved for the
         * backward, until their layer's backward */
        o->bopt = bucket_views(p) ? 0 : g * P;
        o->buf = o->bopt + (f32 ? 0 : 2.0 * P);
        o->gfb = grads_progressive(p) ? 0 : o->g;
        /* foreach AdamW: _foreach_sqrt(exp_avg_sq), one fp32 copy */
        o->temp = 4.0 * po;
        o->popt = po;
        break;
    }
    case VP_SHARD_MEGATRON:
        /* fused Adam in place; main grads are the fp32 grad buffer, or
         * with a bf16 one their fp32 copy (megatron/core/optimizer/
         * optimizer.py _copy_model_grads_to_main_grads: main_grad.float())
         */
        o->w = w * P, o->g = g * P, o->o = opt * P;
        o->temp = g < 4 ? 4.0 * P : 0;
        o->popt = P;
        break;
    case VP_SHARD_DISTOPT:
        /* the same per shard (distrib_optimizer.py
         * _copy_model_grads_to_main_grads: shard_model_grad.float()) */
        o->w = w * P, o->g = g * P, o->o = opt * Ps;
        o->temp = g < 4 ? 4.0 * Ps : 0;
        o->popt = Ps;
        break;
    case VP_SHARD_ZERO1:
        o->w = w * P, o->g = g * P, o->o = opt * Ps;
        o->temp = ds_flat * Ps;
        o->popt = Ps;
        break;
    case VP_SHARD_ZERO2: {
        double bucket = P < 5e7 ? P : 5e7;
        o->w = w * P, o->g = g * Ps, o->o = opt * Ps;
        o->buf = 4.5 * bucket * g; /* DeepSpeed: overlap_comm = 4.5x */
        o->bopt = o->buf;
        o->temp = ds_flat * Ps;
        o->popt = Ps;
        break;
    }
    case VP_SHARD_ZERO3: {
        /* the gathered sub-modules, at most stage3_max_live_parameters
         * (but a sub-module whole) and the prefetch bucket; the gradient
         * bucket being reduced */
        double live = 2.0 * pu < DS_MAX_LIVE + DS_PREFETCH
                          ? 2.0 * pu
                          : DS_MAX_LIVE + DS_PREFETCH;
        double big = largest_tensor(x->cm, p->tp);
        if (live < big)
            live = big;
        o->w = w * Ps, o->g = g * Ps, o->o = opt * Ps;
        o->buf = w * live + g * (pu < DS_REDUCE_BUCKET ? pu
                                                      : DS_REDUCE_BUCKET);
        o->temp = ds_flat * (Ps < DS_SUB_GROUP ? Ps : DS_SUB_GROUP);
        o->popt = Ps;
        break;
    }
    case VP_SHARD_FSDP_FULL:
    case VP_SHARD_FSDP_HYBRID:
        o->w = w * Ps, o->g = g * Ps, o->o = opt * Ps;
        /* limit_all_gathers: 2 units in flight, unsharded grads of one,
         * the root unit (embedding, head) gathered all step */
        o->buf = 2.0 * ab * pu + ab * pu + ab * pr;
        o->temp = 4.0 * Ps; /* foreach AdamW on the fp32 shards */
        o->popt = Ps;
        break;
    case VP_SHARD_FSDP_GRAD_OP:
        o->w = w * Ps, o->g = g * Ps, o->o = opt * Ps;
        o->buf = ab * P + ab * pu; /* gathered from forward to backward */
        o->temp = 4.0 * Ps;
        o->popt = Ps;
        break;
    case VP_SHARD_FSDP2:
    case VP_SHARD_HSDP2:
        /* fp32 DTensor shards, the reduce-scatter output (reduce_dtype
         * fp32, torchtitan's MixedPrecisionPolicy) held as the sharded
         * gradients (dist_fsdp2.c); buf: fsdp2_buffers */
        o->w = w * Ps, o->g = g * Ps, o->o = opt * Ps;
        o->buf = fsdp2_buffers(ab, p->fp8_gather ? 1.0 : ab, pu, pr, Dsh);
        o->temp = 4.0 * Ps; /* foreach AdamW on the fp32 shards */
        o->popt = Ps;
        break;
    default:
        break;
    }
    if (!vp__ddp_like(p->sharding))
        o->gfb = o->g;
    offload_states(p, e, P, Ps, w, g, opt, o);
}

void vp__stage_layers(const vp_cluster_model *cm, const vp_par *p,
                      double *l0, double *l1, double *lm)
{
    double L = (double)cm->L, pp = p->pp;
    *lm = 0;
    if (p->pp <= 1) {
        *l0 = *l1 = L;
        return;
    }
    if (p->first_layers || p->last_layers) {
        /* Megatron: the pinned ends, the rest evenly over the middle */
        double f = p->first_layers, la = p->last_layers;
        double nmid = pp - (f ? 1 : 0) - (la ? 1 : 0);
        double rest = L - f - la;
        double per = nmid > 0 ? ceil(rest / nmid) : 0;
        *l0 = f ? f : per;
        *l1 = la ? la : per;
        *lm = pp > 2 ? per : 0;
        return;
    }
    /* an even split; a remainder goes to the first stages */
    double lo = floor(L / pp), hi = ceil(L / pp);
    *l0 = hi;
    *l1 = fmod(L, pp) == 0 ? hi : lo;
    *lm = pp > 2 ? hi : 0;
}

static void stage_params(const vp__evctx *x, const vp_par *p, vp__stages *o)
{
    const vp_cluster_model *cm = x->cm;
    double t = p->tp, ep = p->ep;
    bool one = p->pp == 1;
    vp__stage_layers(cm, p, &o->l0, &o->l1, &o->lm);
    double Pl = cm->p_layer.r + cm->p_layer.s / t;
    double Pe = (cm->p_exp.r + cm->p_exp.s / t) / ep;
    double Pemb = cm->p_emb_other.r + cm->p_emb_other.s / t +
                  cm->p_word.r + cm->p_word.s / t;
    double Phead = cm->p_head_word.r + cm->p_head_word.s / t +
                   cm->p_head_other.r + cm->p_head_other.s / t;
    if (cm->tied && !one)
        Phead += cm->p_word.r + cm->p_word.s / t; /* copy on the last */
    o->pd0 = o->l0 * Pl + Pemb + (one ? Phead : 0);
    o->pd1 = o->l1 * Pl + Phead + (one ? Pemb : 0);
    o->pdm = o->lm * Pl;
    o->pe0 = o->l0 * Pe, o->pe1 = o->l1 * Pe, o->pem = o->lm * Pe;
    if (p->mtp) {
        /* multi-token prediction (DeepSeek-V3 report section 2.2;
         * Megatron-Core MultiTokenPredictionBlock on the last stage): D
         * modules of a transformer layer, two RMSNorms and the 2h x h
         * projection eh_proj (column-parallel), the embedding and the
         * output head shared */
        double D = p->mtp, h = (double)cm->hidden;
        o->pd1 += D * (Pl + 2 * h * h / t + 2 * h);
        o->pe1 += D * Pe;
        o->l1 += D;
        if (one) {
            o->pd0 = o->pd1, o->pe0 = o->pe1, o->l0 = o->l1;
        }
    }
    if (p->schedule == VP_SCHED_DUALPIPE && !one) {
        /* DualPipe: rank k holds stages k and p - 1 - k (2x parameters,
         * DeepSeek-V3 report Table 2): the first and last ranks both
         * hold the embedding and the head */
        o->pd0 = o->pd1 = o->pd0 + o->pd1;
        o->pdm *= 2;
        o->pe0 = o->pe1 = o->pe0 + o->pe1;
        o->pem *= 2;
    }
    o->pu = Pl + Pe;
    o->pr = Pemb + Phead;
    if (cm->whole) /* units of unequal size: the largest is gathered */
        o->pu = cm->whole->unit_max;
    if (p->sharding == VP_SHARD_ZERO3) {
        if (Pemb > o->pu)
            o->pu = Pemb;
        if (Phead > o->pu)
            o->pu = Phead;
    }
}

/* NCCL buffers of the communicators a rank uses. */
static double nccl_bytes(const vp__evctx *x, const vp_par *p)
{
    const vp_cluster *c = x->c;
    double t = p->tp, cp = p->cp, d = p->dp, ep = p->ep, pp = p->pp;
    double ncoll = 0;
    if (t > 1)
        ncoll++;
    if (cp > 1)
        ncoll++;
    if (d * cp > 1)
        ncoll += vp__hybrid(p->sharding) ? 2 : 1;
    if (ep > 1 && d * cp / ep > 1)
        ncoll++;
    return ncoll * (double)c->nccl_comm_bytes +
           (pp > 1 ? 0.5 * (double)c->nccl_comm_bytes : 0) +
           (ep > 1 ? (ep - 1) * (double)c->nccl_peer_bytes : 0);
}

static double vsplit_of(const vp__split *q, double t, bool sp)
{
    return sp ? (q->r + q->s) / t : q->r + q->s / t;
}

/* What a layer keeps in Megatron / Transformer Engine: the tensors its
 * fused kernels save (saved_op), the linears' inputs in one byte under
 * fp8 (the fp8 copy the GEMM read), and the materialised scores: softmax
 * output, dropout mask and output, 5as^2b/t (Korthikanti et al. 2022,
 * Table 2); *att the scores' part. */
static double fused_layer(const vp_cluster_model *cm, const vp__act *a,
                          const vp_par *p, double *att)
{
    double t = (double)p->tp, bcp = (double)p->micro_batch / p->cp;
    bool sp = p->sp;
    double eb = a->resid_bytes;
    double lin = bcp * vsplit_of(&cm->lin_in, t, sp);
    double keep = bcp * vsplit_of(&cm->keep, t, sp);
    double mask = bcp * vsplit_of(&cm->keep_mask, t, sp);
    double s2 = 0;
    if (cm->at_eager) {
        double heads = cm->at_heads / t;
        s2 = bcp * (heads < 1 ? 1 : heads) * cm->at_q * cm->at_kv *
             (cm->at_dropout > 0 ? 2 * eb + 1 : eb);
    }
    *att = s2;
    bool fp8 = p->dtype == VP_DT_FP8;
    /* under fp8 the fused attention keeps its own 16-bit output (TE
     * FusedAttnFunc's saved out) beside the fp8 copy linear_proj saves;
     * in 16 bits the two are one tensor, counted in lin */
    double out = 0;
    if (fp8 && !cm->at_eager) {
        double heads = cm->at_heads / t;
        out = eb * bcp * (heads < 1 ? 1 : heads) * cm->at_q * cm->at_dim;
    }
    return eb * keep + (fp8 ? 1.0 : eb) * lin + mask + s2 + out;
}

/* The activation terms of one micro-batch. */
typedef struct {
    double saved, trans, emb, head_saved, head_peak, extra;
    double gh, gx; /* gradient bytes made by the head's and a layer's
                      backward peak (simulated dtype)                   */
} actterms;

static void act_terms(const vp__evctx *x, const vp__act *a, const vp_par *p,
                      actterms *o)
{
    const vp_cluster_model *cm = x->cm;
    double b = (double)p->micro_batch, t = (double)p->tp;
    if (cm->whole) {
        /* a graph-form model simulated whole, in the PyTorch module
         * every engine it allows runs: its saved bytes shared by its
         * units (the evaluator's layers), no recomputation */
        memset(o, 0, sizeof *o);
        o->saved = vp__fitv(&a->q[VP__Q_LAYER], b, 1, false) /
                   (double)cm->L;
        o->trans = vp__fitv(&a->q[VP__Q_EXTRA], b, 1, false);
        o->gx = vp__fitv(&a->q[VP__Q_LAYER_GRAD], b, 1, false);
        return;
    }
    bool sp = p->sp;
    double bcp = b / p->cp;
    double layer = vp__fitv(&a->q[VP__Q_LAYER], b, t, sp);
    double att = vp__fitv(&a->q[VP__Q_ATTN_INT], b, t, sp);
    double extra = vp__fitv(&a->q[VP__Q_EXTRA], b, t, sp);
    vp_engine e = vp_sharding_engine(p->sharding);
    if (e != VP_ENGINE_TORCH)
        layer = fused_layer(cm, a, p, &att);
    /* the busiest expert-parallel rank's experts keep more rows than the
     * balanced share the model was built with (vp_moe_load) */
    double f = vp_moe_load(x->c, cm->experts, cm->top_k, p->ep, NULL);
    if (f > 1)
        layer += (f - 1) * a->resid_bytes * bcp *
                 vsplit_of(&cm->keep_exp, t, sp);
    double in = bcp * (double)cm->seq * (double)cm->hidden *
                a->resid_bytes / (sp ? t : 1.0);
    if (in > layer)
        in = layer;
    switch (p->recompute) {
    case VP_RC_SELECTIVE:
        if (e == VP_ENGINE_TORCH) {
            /* op-level policy: the layer's input and the outputs it
             * saves, the rest recomputed */
            double keep = in + bcp * a->resid_bytes *
                                   (sp ? (cm->sac.r + cm->sac.s) / t
                                       : cm->sac.r + cm->sac.s / t);
            o->saved = keep < layer ? keep : layer;
        } else {
            o->saved = layer - att > in ? layer - att : in;
        }
        o->trans = extra + (layer - o->saved);
        break;
    case VP_RC_FULL:
        o->saved = in;
        o->trans = layer - in + extra;
        break;
    default:
        o->saved = layer;
        o->trans = extra;
        break;
    }
    if (e != VP_ENGINE_TORCH) {
        /* Megatron's embedding keeps its dropout mask and the token ids
         * (theoretical_memory_usage.py: 8sb + sbh per micro-batch); its
         * output is the first layer's input, counted there */
        double mask = cm->m->tf.p_embd > 0 ? (double)cm->hidden : 0;
        o->emb = bcp * (double)cm->seq * (8.0 + mask / (sp ? t : 1.0));
    } else {
        o->emb = vp__fitv(&a->q[VP__Q_EMB], b, t, sp);
    }
    o->head_saved = vp__fitv(&a->q[VP__Q_HEAD_SAVED], b, t, sp);
    o->head_peak = vp__fitv(&a->q[VP__Q_HEAD_PEAK], b, t, sp);
    o->gh = vp__fitv(&a->q[VP__Q_HEAD_GRAD], b, t, sp);
    o->gx = vp__fitv(&a->q[VP__Q_LAYER_GRAD], b, t, sp);
}

static uint64_t to_u64(double v)
{
    if (!(v > 0))
        return 0;
    if (v >= 1.8e19)
        return UINT64_MAX;
    return (uint64_t)llround(v);
}

/* One stage's two peaks (docs/CLUSTER.md "Two peaks"). */
typedef struct {
    stbytes s;
    double act, tr, fb, op, alloc, in_flight;
    uint32_t stage;
} stpeak;

static void peaks(stpeak *k)
{
    const stbytes *s = &k->s;
    k->fb = s->w + s->gfb + s->o + s->buf + k->act + k->tr;
    k->op = s->w + s->g + s->o + s->bopt + s->temp;
    k->alloc = k->fb > k->op ? k->fb : k->op;
}

static void fill_mem(const vp_cluster *c, const stpeak *k, double nccl,
                     double host, vp_cluster_mem *mem)
{
    const stbytes *s = &k->s;
    bool step = k->op > k->fb;
    memset(mem, 0, sizeof *mem);
    mem->weights = to_u64(s->w);
    mem->optimizer = to_u64(s->o);
    if (step) {
        /* the optimizer step: every gradient, no activations */
        mem->grads = to_u64(s->g);
        mem->buffers = to_u64(s->bopt);
        mem->transient = to_u64(s->temp);
    } else {
        mem->grads = to_u64(s->gfb);
        mem->buffers = to_u64(s->buf);
        mem->activations = to_u64(k->act);
        mem->transient = to_u64(k->tr);
    }
    mem->overhead = to_u64(k->alloc * c->alloc_overhead);
    mem->nccl = to_u64(nccl);
    mem->context = c->context;
    mem->total = mem->weights + mem->grads + mem->optimizer +
                 mem->buffers + mem->activations + mem->transient +
                 mem->overhead + mem->nccl + mem->context;
    double ranks = c->gpus < c->gpus_per_node ? c->gpus : c->gpus_per_node;
    mem->host = to_u64(1.5 * host * ranks); /* DeepSpeed buffer factor */
    mem->stage = k->stage;
    mem->in_flight = k->in_flight;
}

void vp__evaluate(const vp__evctx *x, const vp__act *a, const vp_par *p,
                  vp_cluster_mem *mem, vp_cluster_time *tm)
{
    const vp_cluster_model *cm = x->cm;
    double t = p->tp, pp = p->pp, cp = p->cp, b = (double)p->micro_batch;
    double h = (double)cm->hidden, sl = (double)(cm->seq / p->cp);
    bool one = p->pp == 1;
    double ab = p->dtype == VP_DT_FP32 ? 4.0 : 2.0;
    vp__stages P;
    stage_params(x, p, &P);
    /* first, last and (the first of the) middle stages */
    stpeak k[3];
    memset(k, 0, sizeof k);
    stage_states(x, p, P.pd0, P.pe0, P.pu, P.pr, &k[0].s);
    if (one)
        k[1].s = k[0].s;
    else
        stage_states(x, p, P.pd1, P.pe1, P.pu, P.pr, &k[1].s);
    bool mid = P.lm > 0;
    if (mid)
        stage_states(x, p, P.pdm, P.pem, P.pu, P.pr, &k[2].s);

    actterms at;
    act_terms(x, a, p, &at);
    double kvl = (double)cm->kv_heads / t;
    if (kvl < 1)
        kvl = 1;
    double kv_bytes = b * sl * 2.0 * kvl * (double)cm->head_dim * ab;
    double extra_bufs = (cp > 1 ? 2.0 * kv_bytes : 0) +
                        (pp > 1 ? 2.0 * b * sl * h * ab / t : 0);
    /* the gradients the backward has made by its peak, where they are
     * not resident states */
    double gs = sim_grad_share(p);
    double gx = gs * at.gx, gh = gs * at.gh;
    if (p->sharding == VP_SHARD_ZERO2 || p->sharding == VP_SHARD_ZERO3) {
        /* DeepSpeed copies each gradient into its reduce bucket (counted
         * in the buffers) as it is made and drops the tensor
         * (stage_1_and_2.py / stage3.py reduce_partition_and_remove_grads):
         * beyond the bucket, one parameter's gradient at a time */
        double each = largest_tensor(cm, t) * a->resid_bytes;
        gx = gx < each ? gx : each;
        gh = gh < each ? gh : each;
    }
    at.trans += gx;
    double hp = at.head_peak + gh;
    if (hp < at.head_saved)
        hp = at.head_saved;
    double head_tr = hp - at.head_saved;
    double trl = at.trans > head_tr ? at.trans : head_tr;
    uint32_t sts[3] = {0, p->pp - 1, 1};
    double lay[3] = {P.l0, P.l1, P.lm};
    /* DualPipe's end ranks run chunks of both ends (an upper bound: every
     * chunk counted with the embedding's and the head's bytes) */
    bool ends2 = p->schedule == VP_SCHED_DUALPIPE;
    /* each multi-token prediction module runs the head again on the last
     * stage and keeps its projection's input (2h per token) */
    double mtp_act = p->mtp * (at.head_saved + 2.0 * b * sl * h * ab /
                                                   (p->sp ? t : 1.0));
    for (int i = 0; i < (mid ? 3 : 2); i++) {
        k[i].stage = sts[i];
        k[i].in_flight = vp_pipeline_in_flight(p->schedule, p->pp, p->accum,
                                               p->vpp, sts[i]);
        if (one) {
            k[i].act = P.l0 * at.saved + at.emb + at.head_saved + mtp_act;
            k[i].tr = trl + extra_bufs;
        } else {
            k[i].act = k[i].in_flight *
                       (lay[i] * at.saved +
                        (i == 0 || (ends2 && i == 1) ? at.emb : 0) +
                        (i == 1 || (ends2 && i == 0)
                             ? at.head_saved + mtp_act
                             : 0));
            k[i].tr = (i == 1 ? trl : at.trans) + extra_bufs;
        }
        peaks(&k[i]);
    }
    if (mem) {
        int w = k[1].alloc > k[0].alloc ? 1 : 0;
        if (mid && k[2].alloc > k[w].alloc)
            w = 2;
        double host = k[0].s.host > k[1].s.host ? k[0].s.host : k[1].s.host;
        fill_mem(x->c, &k[w], nccl_bytes(x, p), host, mem);
    }
    if (!tm)
        return;
    /* the optimizer runs on every stage at once: the stage with most
     * parameters sets its time */
    P.popt = k[0].s.popt;
    if (k[1].s.popt > P.popt)
        P.popt = k[1].s.popt;
    if (mid && k[2].s.popt > P.popt)
        P.popt = k[2].s.popt;
    vp__time(x, a, p, &P, tm);
}

double vp__states_bound(const vp__evctx *x, const vp_par *p, double *host)
{
    vp__stages P;
    stbytes s[3];
    stage_params(x, p, &P);
    stage_states(x, p, P.pd0, P.pe0, P.pu, P.pr, &s[0]);
    stage_states(x, p, P.pd1, P.pe1, P.pu, P.pr, &s[1]);
    int n = 2;
    if (P.lm > 0)
        stage_states(x, p, P.pdm, P.pem, P.pu, P.pr, &s[n++]);
    /* at the forward/backward peak at least the resident states and
     * buffers: DDP's .grad beside the buckets may be all still to come
     * (one micro-batch; the layout's accumulation is not chosen yet);
     * the optimizer step's peak is whole */
    bool prog = vp__ddp_like(p->sharding) && !bucket_views(p);
    double a = 0, hpr = 0;
    for (int i = 0; i < n; i++) {
        double g = prog ? 0 : s[i].gfb;
        double f = s[i].w + g + s[i].o + s[i].buf;
        double o = s[i].w + s[i].g + s[i].o + s[i].bopt + s[i].temp;
        if (f > a)
            a = f;
        if (o > a)
            a = o;
        if (s[i].host > hpr)
            hpr = s[i].host;
    }
    double ranks = x->c->gpus < x->c->gpus_per_node ? x->c->gpus
                                                    : x->c->gpus_per_node;
    *host = 1.5 * hpr * ranks;
    return a * (1.0 + x->c->alloc_overhead) + nccl_bytes(x, p) +
           (double)x->c->context;
}

int vp__cls_of(const vp_par *p)
{
    if (p->dtype == VP_DT_FP32)
        return VP__CLS_FP32;
    return vp__ddp_like(p->sharding) ? VP__CLS_AMP : VP__CLS_HALF;
}

vp_status vp_cluster_eval(vp_cluster_model *cm, const vp_cluster *c,
                          const vp_par *p, vp_cluster_mem *mem,
                          vp_cluster_time *time, vp_error *err)
{
    vp_status st = vp_par_check(cm, c, p, err);
    if (st != VP_OK)
        return st;
    const vp__act *a;
    st = vp__act_get(cm, vp__cls_of(p), p->cp, &a, err);
    if (st != VP_OK)
        return st;
    vp__evctx x;
    vp__evctx_init(&x, cm, c);
    vp__evaluate(&x, a, p, mem, time);
    return VP_OK;
}

bool vp_cluster_fits(const vp_cluster *c, const vp_cluster_mem *mem)
{
    return mem->total <= c->memory && mem->host <= c->host_mem;
}

vp_status vp_cluster_layer_act(vp_cluster_model *cm, vp_dtype dtype,
                               bool torch_ddp, uint64_t b, uint32_t t,
                               bool sp, uint32_t cp, vp_recompute rc,
                               uint64_t *bytes, vp_error *err)
{
    vp_par p;
    memset(&p, 0, sizeof p);
    p.dtype = dtype;
    p.sharding = torch_ddp ? VP_SHARD_DDP : VP_SHARD_MEGATRON;
    p.micro_batch = b;
    p.tp = t ? t : 1;
    p.cp = cp ? cp : 1;
    p.sp = sp;
    p.recompute = rc;
    const vp__act *a;
    vp_status st = vp__act_get(cm, vp__cls_of(&p), p.cp, &a, err);
    if (st != VP_OK)
        return st;
    vp__evctx x;
    vp_cluster c;
    memset(&c, 0, sizeof c);
    c.gpus_per_node = 8;
    vp__evctx_init(&x, cm, &c);
    actterms at;
    act_terms(&x, a, &p, &at);
    *bytes = to_u64(at.saved);
    return VP_OK;
}
