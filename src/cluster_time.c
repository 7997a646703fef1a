/* Plans for clusters: the step time of one configuration on its slowest
 * pipeline stage. Compute comes from the GPU's curves (matmuls by shape,
 * the attention core, memory-bound kernels by bytes), collectives from
 * NCCL's tuning model (cluster_coll.c), overlap as each engine schedules
 * it. Every rule and constant: docs/STEP_TIME.md. */
#include <math.h>
#include <string.h>

#include "cluster_impl.h"

static inline double pos(double v) { return v > 0 ? v : 0; }
static inline double maxd(double a, double b) { return a > b ? a : b; }

/* A fitted split quantity (r + s / t, r / t too with sp). */
static inline double vsplit(const vp__split *q, double t, bool sp)
{
    return sp ? (q->r + q->s) / t : q->r + q->s / t;
}

/* One layer (or the head) of one micro-batch. */
typedef struct {
    double gemm_f, attn_f, mem_f;  /* forward compute                  */
    double gemm_b, attn_b, mem_b;  /* backward compute                 */
    double tp_f, tp_b;             /* exposed tensor-parallel comm      */
    double ep_f, ep_b;             /* exposed expert all-to-alls        */
    double cp_f, cp_b;             /* exposed context-parallel ring     */
    double rec;                    /* recomputed forward (with comm)    */
    double rec_gemm, rec_attn, rec_mem;
    double best_rate;              /* fastest GEMM rate of the shapes   */
} ltime;

typedef struct {
    const vp__evctx *x;
    const vp__act *a;
    const vp_par *p;
    double t, cp, ep, b, sl, h, e, sus;
    bool sp, fused;
    vp_engine eng;
    const vp_curve *lin, *mm;
} tctx;

/* GEMMs of a shape list: the forward's seconds (the backward's dgrad and
 * wgrad do the same work each). */
static double gemms(tctx *k, const vp__gemm *g, size_t n, double *best)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        double rows = k->b * g[i].rows / k->cp;
        double nn = g[i].n, kk = g[i].k, cnt = g[i].count;
        if (g[i].split == VP__SPLIT_COL)
            nn /= k->t;
        else if (g[i].split == VP__SPLIT_ROW)
            kk /= k->t;
        if (g[i].expert && k->ep > 1) {
            rows *= k->ep; /* an expert gets the tokens of ep ranks */
            cnt /= k->ep;
        }
        double w = 2.0 * rows * nn * kk;
        double r = vp_curve_rate(k->lin, w);
        if (k->lin->kh > 0)
            r *= kk / (kk + k->lin->kh);
        if (r > *best)
            *best = r;
        /* a rank's experts in one grouped GEMM (Megatron's TEGroupedMLP,
         * torchtitan's torch._grouped_mm) */
        if (g[i].expert && cnt > 1)
            sum += vp_gemm_time(k->lin, rows * cnt, nn, kk);
        else
            sum += cnt * vp_gemm_time(k->lin, rows, nn, kk);
    }
    return sum / k->sus;
}

/* Memory-bound seconds of `bytes` in `kernels` kernels. */
static double memtime_of(const vp__evctx *x, int cls, double bytes,
                         double kernels)
{
    if (bytes <= 0)
        return 0;
    if (kernels < 1)
        kernels = 1;
    return kernels * vp_curve_time(&x->hw.mem_kind[cls], bytes / kernels);
}

static double memtime(const vp__evctx *x, double bytes, double kernels)
{
    return memtime_of(x, VP_HW_MEM_COPY, bytes, kernels);
}

/* The attention core, forward and backward. */
static void attention(tctx *k, ltime *o)
{
    const vp_cluster_model *cm = k->x->cm;
    const vp__evctx *x = k->x;
    double bcp = k->b / k->cp;
    double ff = bcp * (cm->fattn_f.r + cm->fattn_f.s / k->t);
    double fb = bcp * (cm->fattn_b.r + cm->fattn_b.s / k->t);
    if (!cm->at_eager) {
        /* a fused kernel per context-parallel chunk: Transformer
         * Engine's cuDNN attention, PyTorch SDPA's flash */
        int impl = k->eng == VP_ENGINE_TORCH ? VP_HW_ATTN_FLASH
                                             : VP_HW_ATTN_CUDNN;
        /* a graph-form model is timed as the single-GPU model times it
         * (timing.c attention_time): PyTorch 2.11's SDPA runs cuDNN
         * attention on 16-bit inputs where the profile has its curve */
        if (cm->whole)
            impl = x->hw.attn[VP_HW_ATTN_CUDNN][0].peak > 0
                       ? VP_HW_ATTN_CUDNN
                       : VP_HW_ATTN_FLASH;
        const vp_curve *cf = &x->hw.attn[impl][0], *cb = &x->hw.attn[impl][1];
        if (k->p->dtype == VP_DT_FP32)
            cf = cb = k->mm;
        o->attn_f = k->cp * vp_curve_time(cf, ff / k->cp) / k->sus;
        o->attn_b = k->cp * vp_curve_time(cb, fb / k->cp) / k->sus;
        return;
    }
    /* materialised scores: batched matmuls (the whole s x s, masked or
     * not) against the traffic of the scores and probabilities */
    if (cm->at_causal)
        ff *= 2, fb *= 2;
    double mf = vp_curve_time(k->mm, ff) / k->sus;
    double mb = vp_curve_time(k->mm, fb) / k->sus;
    /* the scores' traffic: Megatron's fused scale-mask-softmax streams
     * at the copy bandwidth, PyTorch's softmax at its own (measured) */
    const vp_curve *sm = &x->hw.mem_kind[k->fused ? VP_HW_MEM_COPY
                                                   : VP_HW_MEM_SOFTMAX];
    double bytes;
    if (k->fused) {
        double heads = cm->at_heads / k->t;
        if (heads < 1)
            heads = 1;
        double s2 = k->b * heads * (cm->at_q / k->cp) * cm->at_kv;
        /* scores written; fused scale-mask-softmax reads them and writes
         * the probabilities; dropout reads those, writes its output and
         * mask; the second matmul reads it (Megatron's
         * FusedScaleMaskSoftmax, Korthikanti et al. 2022 section 4.1) */
        bytes = cm->at_dropout > 0 ? s2 * (6 * k->e + 1) : s2 * 4 * k->e;
    } else {
        bytes = 2.0 * vp__fitv(&k->a->q[VP__Q_ATTN_MEM_F], k->b, k->t,
                               k->sp);
    }
    o->attn_f = maxd(mf, 3 * vp_curve_time(sm, bytes / 3));
    o->attn_b = maxd(mb, 5 * vp_curve_time(sm, 2 * bytes / 5));
}

/* Memory-bound kernels of a layer, forward and backward. */
static void memory(tctx *k, ltime *o)
{
    const vp_cluster_model *cm = k->x->cm;
    if (k->fused) {
        const vp__fused *f = &cm->fz_layer;
        double bcp = k->b / k->cp;
        double bytes = bcp * (k->e * vsplit(&f->elems, k->t, k->sp) +
                              vsplit(&f->masks, k->t, k->sp));
        /* a backward kernel reads the gradient and the saved input and
         * writes the input's gradient: twice the forward's traffic */
        o->mem_f = memtime(k->x, bytes, f->kernels);
        o->mem_b = memtime(k->x, 2 * bytes, 2 * f->kernels);
        return;
    }
    const vp__act *a = k->a;
    double bf = 2.0 * vp__fitv(&a->q[VP__Q_MEM_F], k->b, k->t, k->sp);
    double bb = 2.0 * vp__fitv(&a->q[VP__Q_MEM_B], k->b, k->t, k->sp);
    o->mem_f = memtime(k->x, bf, vp__fitv(&a->q[VP__Q_KER_F], k->b, k->t,
                                          k->sp));
    o->mem_b = memtime(k->x, bb, vp__fitv(&a->q[VP__Q_KER_B], k->b, k->t,
                                          k->sp));
}

/* Exposed part of a collective overlapped chunk by chunk with `work`
 * (Transformer Engine's userbuffers split a GEMM into t chunks: the
 * first chunk's exchange is exposed). */
static double chunked(double comm, double work, double chunks)
{
    if (comm <= 0)
        return 0;
    return comm / chunks + pos(comm * (1 - 1 / chunks) - work);
}

static void comms(tctx *k, ltime *o)
{
    const vp__evctx *x = k->x;
    const vp_cluster_model *cm = x->cm;
    const vp_par *p = k->p;
    double h = k->h;
    if (k->t > 1) {
        vp__group g;
        vp__group_shape(x->c, k->t, 1, &g);
        double xtp = k->b * k->sl * h * k->e;
        double f, bw;
        if (k->sp) {
            double ag = vp__coll(&g, VP_COLL_ALL_GATHER, xtp);
            double rs = vp__coll(&g, VP_COLL_REDUCE_SCATTER, xtp);
            f = 2 * (ag + rs);
            bw = 2 * (ag + rs) + 2 * ag; /* inputs gathered again */
        } else {
            f = bw = 2 * vp__coll(&g, VP_COLL_ALL_REDUCE, xtp);
        }
        if (vp__on(p->overlap_tp, false)) {
            o->tp_f = chunked(f, o->gemm_f, k->t);
            o->tp_b = chunked(bw, o->gemm_b, k->t);
        } else {
            o->tp_f = f, o->tp_b = bw;
        }
    }
    if (cm->experts && k->ep > 1) {
        vp__group g;
        vp__group_shape(x->c, k->ep, k->t * k->cp, &g);
        double xe = k->b * k->sl * (double)cm->top_k * h * k->e /
                    (k->sp ? k->t : 1.0);
        double a2a = 2 * vp__coll(&g, VP_COLL_ALL_TO_ALL, xe);
        /* DualPipe overlaps each chunk's all-to-alls with the paired
         * chunk's compute (DeepSeek-V3 report, section 3.2.1) */
        if (vp__on(p->overlap_ep, false) ||
            p->schedule == VP_SCHED_DUALPIPE) {
            o->ep_f = pos(a2a - (o->gemm_f + o->attn_f + o->mem_f));
            o->ep_b = pos(a2a - (o->gemm_b + o->attn_b + o->mem_b));
        } else {
            o->ep_f = o->ep_b = a2a;
        }
    }
    if (k->cp > 1) {
        vp__group g;
        vp__group_shape(x->c, 2, k->t, &g);
        double kvl = (double)cm->kv_heads / k->t;
        if (kvl < 1)
            kvl = 1;
        double kv = k->b * k->sl * 2 * kvl * (double)cm->head_dim * k->e;
        double ring = (k->cp - 1) * vp__coll(&g, VP_COLL_SEND, kv);
        o->cp_f = pos(ring - o->attn_f);
        o->cp_b = pos(2 * ring - o->attn_b);
    }
}

/* A layer's linear outputs and weights per rank (elements) and its
 * linear count. */
static void lin_elems(const tctx *k, double *out, double *wt, double *n)
{
    const vp_cluster_model *cm = k->x->cm;
    double bcp = k->b / k->cp;
    *out = *wt = *n = 0;
    for (size_t i = 0; i < cm->n_gemm; i++) {
        const vp__gemm *g = &cm->gemm[i];
        double nn = g->n, kk = g->k;
        if (g->split == VP__SPLIT_COL)
            nn /= k->t;
        else if (g->split == VP__SPLIT_ROW)
            kk /= k->t;
        *out += g->count * bcp * g->rows * nn;
        *wt += g->count * nn * kk;
        *n += g->count;
    }
}

/* FSDP's shard group: the data-parallel ranks, HSDP's within a node. */
static double shard_ranks(const tctx *k)
{
    double D = (double)k->p->dp * k->p->cp;
    double gpn = (double)k->x->c->gpus_per_node;
    return vp__hybrid(k->p->sharding) && gpn < D ? gpn : D;
}

/* The rank's shard of a layer's linear weights cast to fp8 before the
 * all-gather (torchao float8/fsdp_utils.py WeightWithDynamicFloat8Cast-
 * Tensor.fsdp_pre_all_gather with the precomputed scale: float8_training_
 * tensor.py hp_tensor_and_scale_to_float8, no amax), in FSDP's eager
 * hook: the eager cast's row share, its fp32 shard read in 4 B where the
 * measured bf16 tensor was read in 2 (5 B moved for 3). */
static double shard_cast(const tctx *k, double wt, double n)
{
    double row = (VP_FP8_CAST_COMPILED - VP_FP8_CAST_TRANS_AMAX) /
                 VP_FP8_CAST_COMPILED;
    return memtime(k->x, 4.0 * VP_FP8_CAST_EAGER * row * 5.0 / 3.0 * wt /
                             shard_ranks(k),
                   3.0 * n);
}

/* fp8 current scaling's casts, per layer and micro-batch
 * (docs/CLUSTER.md "fp8 step time"): a tensor is read for its amax, then
 * read again to write the fp8 data and its transpose.
 *   Megatron: Transformer Engine's fused cast-transpose (Float8Current-
 * Scaling's quantizer, cpp_extensions cast_transpose; pytorch/module/
 * linear.py _Linear.forward casts the input, _Linear.backward the output
 * gradient), 2 + 2 + 1 + 1 B an element in two kernels at the copy
 * curve; the weights are fp8 parameters, cast once in the optimizer
 * step (fp8_param_gather).
 *   torch: torchao's tensorwise dynamic float8 under torch.compile
 * (float8/float8_linear.py matmul_with_hp_or_float8_args; float8_
 * scaling_utils.py hp_tensor_to_float8_dynamic): the forward casts the
 * input and the bf16 gathered weight, the backward the output gradient
 * both ways under one amax, and the input and weight again, transposed,
 * for wgrad and dgrad (their amax is the forward's: the same tensorwise
 * max in one compiled graph, and torchtitan's op-level policy saves
 * aten.max). Each of the three thus gets an amax, a cast and a
 * transposed cast, which Inductor's kernels run at VP_FP8_CAST_COMPILED
 * times a copy of the tensor, ATen's eager ones at VP_FP8_CAST_EAGER
 * (timing.h); the amax and row-major cast of the input and weight are
 * charged to the forward (VP_FP8_CAST_ROW_AMAX), their transposed casts
 * to the backward (the rest), the eager cast split in the compiled
 * one's proportion.
 *   torch with the fp8 all-gather (p->fp8_gather): the weight arrives in
 * fp8 (shard_cast, once in the forward and again for the backward's
 * gather under force_recompute_fp8_weight_in_bwd), so only the input is
 * cast in the forward; the backward's dgrad reads the gathered fp8
 * weight column-major for torch._scaled_mm (float8_ops.py float8_mm ->
 * addmm_float8_unwrapped), a 1 + 1 B transposing copy. */
static void fp8_casts(tctx *k, ltime *o)
{
    const vp_cluster_model *cm = k->x->cm;
    double in = k->b / k->cp * vsplit(&cm->lin_in, k->t, k->sp);
    double out, wt, n;
    lin_elems(k, &out, &wt, &n);
    if (k->eng != VP_ENGINE_TORCH) {
        /* two kernels a linear each way */
        o->mem_f += memtime(k->x, 6.0 * in, 2.0 * n);
        o->mem_b += memtime(k->x, 6.0 * out, 2.0 * n);
        return;
    }
    /* a copy of a bf16 tensor reads and writes 2 B an element */
    double per = 4.0 * (k->p->compile ? VP_FP8_CAST_COMPILED
                                      : VP_FP8_CAST_EAGER);
    double fw = VP_FP8_CAST_ROW_AMAX / VP_FP8_CAST_COMPILED, bw = 1 - fw;
    if (!k->p->fp8_gather) {
        o->mem_f += memtime(k->x, per * fw * (in + wt), 4.0 * n);
        o->mem_b += memtime(k->x, per * (bw * (in + wt) + out), 4.0 * n);
        return;
    }
    double sc = shard_cast(k, wt, n);
    o->mem_f += memtime(k->x, per * fw * in, 2.0 * n) + sc;
    o->mem_b += memtime(k->x, per * (bw * in + out) + 2.0 * wt, 4.0 * n) +
                sc;
}

/* torchao's precompute_float8_dynamic_scale_for_fsdp (float8/fsdp_
 * utils.py), once a step after the optimizer: one torch._foreach_norm
 * (ord inf) over the rank's fp32 shards of the float8 linears' weights,
 * 4 B an element, and one all-reduce (MAX) of their amaxes. */
static double fp8_amax_pass(const tctx *k, double layers)
{
    if (!k->p->fp8_gather)
        return 0;
    double out, wt, n;
    lin_elems(k, &out, &wt, &n);
    double Ds = shard_ranks(k);
    vp__group g;
    vp__group_shape(k->x->c, Ds, k->t, &g);
    return memtime(k->x, 4.0 * layers * wt / Ds, 1) +
           vp__coll(&g, VP_COLL_ALL_REDUCE, 4.0 * layers * n);
}

static void layer(tctx *k, ltime *o)
{
    const vp_cluster_model *cm = k->x->cm;
    memset(o, 0, sizeof *o);
    o->gemm_f = gemms(k, cm->gemm, cm->n_gemm, &o->best_rate);
    o->gemm_b = 2 * o->gemm_f;
    attention(k, o);
    memory(k, o);
    if (k->p->dtype == VP_DT_FP8)
        fp8_casts(k, o);
    comms(k, o);
    vp_engine e = k->eng;
    switch (k->p->recompute) {
    case VP_RC_FULL:
        o->rec_gemm = o->gemm_f, o->rec_attn = o->attn_f;
        o->rec_mem = o->mem_f;
        o->rec = o->gemm_f + o->attn_f + o->mem_f + o->tp_f + o->ep_f +
                 o->cp_f;
        break;
    case VP_RC_SELECTIVE:
        if (e == VP_ENGINE_TORCH) {
            /* torchtitan's op-level policy: matmul and attention outputs
             * saved, every other matmul recomputed, the elementwise ops
             * recomputed */
            o->rec_gemm = 0.5 * o->gemm_f, o->rec_mem = o->mem_f;
        } else {
            o->rec_attn = o->attn_f; /* the core attention (Megatron) */
        }
        o->rec = o->rec_gemm + o->rec_attn + o->rec_mem;
        break;
    default:
        break;
    }
}

/* What the single-GPU model adds for NCHW convolutions and batch norms
 * (timing.c conv_time, bn_fit): each convolution's layout conversion,
 * its output twice at the copy bandwidth in each direction, and the batch
 * norms' kernels by their channels, both linear in the micro-batch. */
static void whole_nchw(tctx *k, const vp__whole *w, ltime *o)
{
    const vp_curve *cp = &k->x->hw.mem_kind[VP_HW_MEM_COPY];
    if (cp->peak <= 0)
        return;
    bool half = k->p->dtype != VP_DT_FP32;
    double lay = k->b * vp__conv_layout_bytes(w->conv_el, half) / cp->peak;
    o->gemm_f += lay;
    o->gemm_b += lay;
    /* the planner's fp16 is autocast's: a half input, fp32 parameters */
    int bn = k->p->dtype == VP_DT_FP32   ? VP__BN_CUDNN32
             : k->p->dtype == VP_DT_FP16 ? VP__BN_CUDNN16
                                         : VP__BN_NATIVE;
    o->mem_f += k->b * w->bn[bn][0] / cp->peak;
    o->mem_b += k->b * w->bn[bn][1] / cp->peak;
}

/* What the single-GPU model adds for nn.MultiheadAttention(batch_first=
 * True)'s projections (timing.c mha_fwd, mha_bwd): their forward's
 * strided copies at the copy bandwidth and in_proj's bias add at the add
 * bandwidth; the backward's SelectBackward fills and copies of q, k, v at
 * the copy bandwidth and their sums at the add bandwidth; the bytes of
 * vp__mha_kernels, linear in the micro-batch. */
static void whole_mha(tctx *k, const vp__whole *w, ltime *o)
{
    const vp__mha_bytes *m = &w->mha[k->p->dtype == VP_DT_FP32];
    const vp_curve *cp = &k->x->hw.mem_kind[VP_HW_MEM_COPY];
    const vp_curve *ad = &k->x->hw.mem_kind[VP_HW_MEM_ADD];
    if (cp->peak > 0) {
        o->mem_f += k->b * (m->copy[0] + m->copy[1]) / cp->peak;
        o->mem_b += k->b * m->bcopy / cp->peak;
    }
    if (ad->peak > 0) {
        o->mem_f += k->b * m->add / ad->peak;
        o->mem_b += k->b * m->badd / ad->peak;
    }
}

/* One unit (of cm->L) of a graph-form model planned whole
 * (cluster_graph.c): the whole graph's GEMM shapes on the linear curve,
 * its convolutions as cuDNN's implicit GEMMs at VP_CONV_GEMM_SHARE of
 * the dtype's GEMM curve at its peak (timing.c conv_time times them by
 * shape; their layout copies in whole_nchw), its attention cores
 * and memory-bound kernels, shared by the units. */
static void whole_unit(tctx *k, ltime *o)
{
    const vp_cluster_model *cm = k->x->cm;
    const vp__whole *w = cm->whole;
    memset(o, 0, sizeof *o);
    double conv = VP_CONV_GEMM_SHARE * k->lin->peak;
    double top = vp__dtype_rate(&k->x->hw, k->p->dtype, false);
    if (conv <= 0 || conv > top)
        conv = top;
    double g = gemms(k, w->gemm, w->n_gemm, &o->best_rate);
    o->gemm_f = g + (conv > 0 ? k->b * w->conv_f / conv : 0);
    o->gemm_b = 2 * g + (conv > 0 ? k->b * w->conv_b / conv : 0);
    if (w->conv_f > 0 && conv > o->best_rate)
        o->best_rate = conv;
    attention(k, o); /* one attention core (cluster_graph.c), times n_attn */
    if (cm->fattn_f.r > 0 && o->attn_f > 0 &&
        k->b * cm->fattn_f.r / o->attn_f > o->best_rate)
        o->best_rate = k->b * cm->fattn_f.r / o->attn_f;
    o->attn_f *= cm->n_attn, o->attn_b *= cm->n_attn;
    memory(k, o);
    whole_nchw(k, w, o);
    whole_mha(k, w, o);
    /* the host issues the micro-batch's kernels one by one (timing.c's
     * host model: host_fwd, host_bwd per kernel): a floor under each
     * phase, binding for small batches of small ops */
    double hf = k->a->host_k[0] * k->x->hw.host_fwd;
    double hb = k->a->host_k[1] * k->x->hw.host_bwd;
    double gf = o->gemm_f + o->attn_f + o->mem_f;
    double gb = o->gemm_b + o->attn_b + o->mem_b;
    double sf = gf > 0 && hf > gf ? hf / gf : 1;
    double sb = gb > 0 && hb > gb ? hb / gb : 1;
    /* the kinds stretched in proportion: the GPU waits between them */
    o->gemm_f *= sf, o->attn_f *= sf, o->mem_f *= sf;
    o->gemm_b *= sb, o->attn_b *= sb, o->mem_b *= sb;
    double u = (double)cm->L;
    o->gemm_f /= u, o->gemm_b /= u, o->attn_f /= u, o->attn_b /= u;
    o->mem_f /= u, o->mem_b /= u;
}

/* Embedding and head of one micro-batch: compute and exposed TP comm. */
typedef struct {
    double emb, head, emb_comm, gemm, me, mh;
} ends;

static void ends_time(tctx *k, ends *o, double *best)
{
    const vp__evctx *x = k->x;
    const vp_cluster_model *cm = x->cm;
    const vp__act *a = k->a;
    memset(o, 0, sizeof *o);
    double hg = gemms(k, cm->hgemm, cm->n_hgemm, best);
    o->gemm = 3 * hg;
    double me, mh;
    if (k->fused) {
        double bcp = k->b / k->cp;
        const vp__fused *fe = &cm->fz_emb, *fh = &cm->fz_head;
        double be = bcp * (k->e * vsplit(&fe->elems, k->t, k->sp) +
                           vsplit(&fe->masks, k->t, k->sp));
        double bh = bcp * (k->e * vsplit(&fh->elems, k->t, k->sp) +
                           vsplit(&fh->masks, k->t, k->sp));
        me = 3 * memtime(x, be, fe->kernels);
        mh = 3 * memtime(x, bh, fh->kernels);
    } else {
        me = memtime(x, 2 * vp__fitv(&a->q[VP__Q_EMB_MEM], k->b, k->t, k->sp),
                     vp__fitv(&a->q[VP__Q_EMB_KER], k->b, k->t, k->sp));
        mh = memtime(x, 2 * vp__fitv(&a->q[VP__Q_HEAD_MEM], k->b, k->t,
                                     k->sp),
                     vp__fitv(&a->q[VP__Q_HEAD_KER], k->b, k->t, k->sp));
    }
    o->me = me, o->mh = mh;
    o->emb = me;
    o->head = o->gemm + mh;
    if (k->t > 1) {
        /* the vocabulary-parallel embedding's all-reduce (reduce-scatter
         * with sp) */
        vp__group g;
        vp__group_shape(x->c, k->t, 1, &g);
        double xtp = k->b * k->sl * k->h * k->e;
        o->emb_comm = vp__coll(&g, k->sp ? VP_COLL_REDUCE_SCATTER
                                         : VP_COLL_ALL_REDUCE,
                               xtp);
    }
}

/* Bytes per parameter of the gradient reduction and the parameter
 * gather. */
static void dp_bytes(const vp_par *p, double *gb, double *pb)
{
    vp_engine e = vp_sharding_engine(p->sharding);
    *pb = p->dtype == VP_DT_FP32 ? 4 : 2;
    if (p->fp8_gather)
        *pb = 1; /* torchao's fp8 all-gather: fsdp_pre_all_gather */
    if (p->dtype == VP_DT_FP32)
        *gb = 4;
    else if (e == VP_ENGINE_MEGATRON && p->dtype == VP_DT_FP8) {
        /* Megatron-Bridge's fp8 recipes: bf16 gradients reduced, fp8
         * parameters gathered (docs/CLUSTER.md "Model states") */
        *gb = 2, *pb = 1;
    } else if (e == VP_ENGINE_MEGATRON)
        /* fp32 main-grad accumulation and reduction is forced by bf16
         * only (arguments.py: --bf16 sets accumulate_allreduce_grads_in_
         * fp32); fp16 reduces its fp16 gradients */
        *gb = p->dtype == VP_DT_FP16 ? 2 : 4;
    else if (vp__ddp_like(p->sharding))
        *gb = 4; /* fp32 parameters under autocast */
    else if (vp__fsdp2(p->sharding))
        *gb = 4; /* torchtitan's MixedPrecisionPolicy reduce_dtype fp32 */
    else
        *gb = 2;
}

/* n_calls collectives that move `bytes` in all. */
static double calls(const vp__group *g, vp_coll k, double bytes, double n)
{
    if (bytes <= 0 || g->n <= 1)
        return 0;
    if (n < 1)
        n = 1;
    return n * vp__coll(g, k, bytes / n);
}

/* Bucketed collective of `bytes` in buckets of `bucket` bytes: total
 * time and the time of one bucket (the last, never overlapped). */
static double bucketed(const vp__group *g, vp_coll k, double bytes,
                       double bucket, double *last)
{
    if (bytes <= 0 || g->n <= 1) {
        *last = 0;
        return 0;
    }
    double n = ceil(bytes / bucket);
    *last = vp__coll(g, k, bytes / n);
    return n * *last;
}

typedef struct {
    double Tf, Tb;       /* one micro-batch's forward, backward (+rec) on
                            the slowest stage: the overlap windows      */
    double P, Pe;        /* dense and expert parameters of the stage   */
    double layers;       /* layers of the slowest stage                */
    double pu;           /* parameters of one layer (a gathered unit)  */
} window;

/* Exposed data-parallel time of the non-sharded engines (after the last
 * micro-batch's backward) and of ZeRO-2's per-micro-batch reduction. */
static double dp_flat(tctx *k, const window *w)
{
    const vp__evctx *x = k->x;
    const vp_par *p = k->p;
    double D = (double)p->dp * p->cp, De = D / k->ep;
    vp__group gd, ge;
    vp__group_shape(x->c, D, k->t, &gd);
    vp__group_shape(x->c, De, k->t * k->cp * k->ep, &ge);
    double gb, pb;
    dp_bytes(p, &gb, &pb);
    double m = (double)p->accum, l1, l2, l3, l4;
    bool ov = vp__on(p->overlap_dp, true);
    switch (p->sharding) {
    case VP_SHARD_DDP:
    case VP_SHARD_DDP_ZERO1: { /* 25 MiB buckets, overlapped with the
                                  backward */
        double ar = bucketed(&gd, VP_COLL_ALL_REDUCE, gb * w->P, 25 * 1048576.0,
                             &l1) +
                    bucketed(&ge, VP_COLL_ALL_REDUCE, gb * w->Pe,
                             25 * 1048576.0, &l2);
        double t = maxd(ar - w->Tb, l1 + l2);
        if (p->sharding == VP_SHARD_DDP_ZERO1)
            /* ZeroRedundancyOptimizer.step then broadcasts each rank's
             * updated fp32 parameters from it (_sync_params, in buckets
             * of at most 250 MiB): every rank receives all but its own
             * partition, an all-gather's bytes, after the step */
            t += bucketed(&gd, VP_COLL_ALL_GATHER, 4.0 * w->P,
                          250 * 1048576.0, &l3) +
                 bucketed(&ge, VP_COLL_ALL_GATHER, 4.0 * w->Pe,
                          250 * 1048576.0, &l4);
        return t;
    }
    case VP_SHARD_MEGATRON: {
        /* buckets of max(40M, 1M x dp) elements (DistributedDataParallel
         * Config bucket_size) */
        double bk = gb * maxd(4e7, 1e6 * D);
        double ar = bucketed(&gd, VP_COLL_ALL_REDUCE, gb * w->P, bk, &l1) +
                    bucketed(&ge, VP_COLL_ALL_REDUCE, gb * w->Pe, bk, &l2);
        return ov ? maxd(ar - w->Tb, l1 + l2) : ar;
    }
    case VP_SHARD_DISTOPT: {
        double bk = gb * maxd(4e7, 1e6 * D);
        double rs = bucketed(&gd, VP_COLL_REDUCE_SCATTER, gb * w->P, bk, &l1) +
                    bucketed(&ge, VP_COLL_REDUCE_SCATTER, gb * w->Pe, bk, &l2);
        double ag = bucketed(&gd, VP_COLL_ALL_GATHER, pb * w->P, bk, &l3) +
                    bucketed(&ge, VP_COLL_ALL_GATHER, pb * w->Pe, bk, &l4);
        return ov ? maxd(rs - w->Tb, l1 + l2) + maxd(ag - w->Tf, l3 + l4)
                  : rs + ag;
    }
    case VP_SHARD_ZERO1:
    case VP_SHARD_ZERO2: {
        /* reduce_bucket_size and allgather_bucket_size 5e8 elements */
        double rs = bucketed(&gd, VP_COLL_REDUCE_SCATTER, gb * w->P, gb * 5e8,
                             &l1) +
                    bucketed(&ge, VP_COLL_REDUCE_SCATTER, gb * w->Pe,
                             gb * 5e8, &l2);
        double ag = bucketed(&gd, VP_COLL_ALL_GATHER, pb * w->P, pb * 5e8,
                             &l3) +
                    bucketed(&ge, VP_COLL_ALL_GATHER, pb * w->Pe, pb * 5e8,
                             &l4);
        if (p->sharding == VP_SHARD_ZERO2) /* every micro-batch */
            return m * (ov ? maxd(rs - w->Tb, l1 + l2) : rs) + ag;
        return (ov ? maxd(rs - w->Tb, l1 + l2) : rs) + ag;
    }
    default:
        return 0;
    }
}

/* Sharded engines (ZeRO-3, FSDP): the per-layer gathers and reductions of
 * one micro-batch, prefetched one layer ahead. On return *lf and *lb are
 * a layer's forward and backward with the exposed communication, *first
 * the gather and reduction no compute hides. */
static void dp_sharded(tctx *k, const window *w, double *lf, double *lb,
                       double *first)
{
    const vp__evctx *x = k->x;
    const vp_cluster_model *cm = x->cm;
    const vp_par *p = k->p;
    double D = (double)p->dp * p->cp;
    double gb, pb;
    dp_bytes(p, &gb, &pb);
    double Pl = w->pu;
    double Dg = D, ar = 0;
    vp__group g;
    if (vp__hybrid(p->sharding)) {
        Dg = (double)x->c->gpus_per_node < D ? (double)x->c->gpus_per_node
                                             : D;
        vp__group gx;
        vp__group_shape(x->c, D / Dg, k->t * Dg, &gx);
        ar = vp__coll(&gx, VP_COLL_ALL_REDUCE, gb * Pl / Dg);
    }
    vp__group_shape(x->c, Dg, k->t, &g);
    /* DeepSpeed gathers parameter by parameter (partition_parameters.py
     * all-gather per tensor of the fetched sub-modules), FSDP a unit's
     * flat parameter in one call */
    double nag = p->sharding == VP_SHARD_ZERO3 ? cm->layer_tensors : 1;
    double ag = calls(&g, VP_COLL_ALL_GATHER, pb * Pl, nag);
    double rs = vp__coll(&g, VP_COLL_REDUCE_SCATTER, gb * Pl) + ar;
    /* gathered again for the backward, or for the recomputed forward
     * (whose parameters the backward then reuses: DeepSpeed's
     * stage3_max_reuse_distance, FSDP's unit backward) */
    double agb = ag;
    if (p->sharding == VP_SHARD_FSDP_GRAD_OP)
        agb = 0; /* kept from the forward */
    double cf = *lf, cb = *lb;
    if (p->sharding != VP_SHARD_ZERO3) {
        /* FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py):
         * each gathered unit is copied out into its parameters on the
         * compute stream (foreach_all_gather_copy_out, split_with_sizes_
         * copy: read and written), and its gradients into the reduce-
         * scatter input on that stream (foreach_reduce, torch._chunk_cat:
         * read in the parameter dtype, written in the reduce dtype).
         * FSDP1's flat parameter is gathered in place: timed as FSDP2.
         * _chunk_cat upcasting to an fp32 reduce dtype runs at the cast
         * class's bandwidth: calibrate/profiles/h200-fsdp2-copies.jsonl
         * (calibrate/vp-fsdp2-copies.py, world 1) measured 2071, 2027,
         * 1939 GB/s of (pb + gb) bytes per unit of 34M, 134M, 537M
         * parameters, against to_fp32's 2208 (copy's 4580). */
        double out = memtime(x, 2 * pb * Pl, 1);
        cf += out;
        if (agb > 0)
            cb += out;
        rs += memtime_of(x, gb != pb ? VP_HW_MEM_CAST : VP_HW_MEM_COPY,
                         (pb + gb) * Pl, 1);
    }
    if (p->sharding == VP_SHARD_ZERO3 && !vp__on(p->overlap_dp, true)) {
        /* no prefetch: each sub-module waits for its gather
         * (fetch_sub_module); the reduce-scatter still overlaps the next
         * layer's backward (overlap_comm) */
        *lf = cf + ag;
        *lb = agb + maxd(cb, rs);
    } else {
        *lf = maxd(cf, ag);
        *lb = maxd(cb, agb + rs);
    }
    *first = ag + rs;
}

/* Pipeline sends of one micro-batch (both directions), exposed:
 * Megatron's scatter-gather sends 1/t of the activation; interleaved
 * schedules overlap them with compute (--overlap-p2p-communication). */
static double p2p(tctx *k)
{
    const vp_par *p = k->p;
    if (p->pp <= 1)
        return 0;
    vp_engine e = k->eng;
    if ((e == VP_ENGINE_MEGATRON && p->schedule == VP_SCHED_INTERLEAVED) ||
        p->schedule == VP_SCHED_DUALPIPE)
        return 0; /* DualPipe batches its sends with the paired chunk's */
    vp__group g;
    vp__group_shape(k->x->c, 2,
                    (double)p->tp * p->cp * p->dp, &g);
    double bytes = k->b * k->sl * k->h * k->e;
    if (e == VP_ENGINE_MEGATRON)
        bytes /= k->t;
    return 2 * vp__coll(&g, VP_COLL_SEND, bytes);
}

/* Bytes per parameter the optimizer step streams through memory, from the
 * profile's measured AdamW (the H200 sweep's where none was measured). */
static double optim_bytes(const vp_hw *hw, const vp_par *p)
{
    vp_engine e = vp_sharding_engine(p->sharding);
    if (e == VP_ENGINE_TORCH)
        /* foreach AdamW (torch/optim/adamw.py _multi_tensor_adamw) on the
         * fp32 parameters */
        return hw->optim[VP_HW_OPTIM_ADAMW][0].bytes_per_param;
    /* fused Adam in place on the fp32 master copy (as torch's fused
     * AdamW: parameter, gradient and moments read, parameter and moments
     * written); then the 16-bit copy written, the gradient norm's read of
     * the gradients, fp16's unscale reading and writing them */
    double b = hw->optim[VP_HW_OPTIM_ADAMW_FUSED][0].bytes_per_param;
    if (p->dtype != VP_DT_FP32)
        b += 2;
    b += 4;
    if (p->dtype == VP_DT_FP16)
        b += 8;
    return b;
}

/* The optimizer step and the offload transfers not hidden behind the
 * forward (w->Tf) and backward (w->Tb) of one micro-batch, for popt
 * parameters whose step runs on this rank. */
static void opt_offload(const tctx *k, double popt, const window *w,
                        double *opt, double *off)
{
    const vp__evctx *x = k->x;
    const vp_cluster *c = x->c;
    const vp_par *p = k->p;
    *opt = *off = 0;
    if (p->offload == VP_OFFLOAD_NONE) {
        *opt = popt * optim_bytes(&x->hw, p) / x->hw.optim_bw;
        return;
    }
    double ranks = c->gpus < c->gpus_per_node ? c->gpus : c->gpus_per_node;
    double obytes = p->dtype == VP_DT_FP32 ? 28.0 : 30.0;
    *opt = popt * obytes / (c->host_mem_bw / ranks);
    double pb = p->dtype == VP_DT_FP32 ? 4 : 2;
    double down = 4.0 * popt / x->host_bw; /* fp32 grads to host  */
    double up = pb * popt / x->host_bw;    /* new weights back    */
    *off = pos(down - w->Tb) + up;
    if (p->offload == VP_OFFLOAD_ALL) {
        double fetch = (k->eng == VP_ENGINE_TORCH ? 4.0 : pb) * popt /
                       x->host_bw;
        *off += (double)p->accum * (pos(fetch - w->Tf) + pos(fetch - w->Tb));
    }
}

void vp__time(const vp__evctx *x, const vp__act *a, const vp_par *p,
              const vp__stages *st, vp_cluster_time *tm)
{
    const vp_cluster_model *cm = x->cm;
    const vp_cluster *c = x->c;
    tctx k;
    memset(&k, 0, sizeof k);
    k.x = x, k.a = a, k.p = p;
    k.t = p->tp, k.cp = p->cp, k.ep = p->ep;
    k.b = (double)p->micro_batch;
    k.sl = (double)(cm->seq / p->cp);
    k.h = (double)cm->hidden;
    k.e = p->dtype == VP_DT_FP32 ? 4 : 2;
    k.sus = x->hw.sustained;
    k.sp = p->sp;
    k.eng = vp_sharding_engine(p->sharding);
    /* a graph-form model runs as the PyTorch module in every engine */
    k.fused = !cm->whole && (k.eng != VP_ENGINE_TORCH || p->compile);
    k.lin = x->lin[p->dtype];
    k.mm = x->mm[p->dtype];
    double m = (double)p->accum, pp = p->pp, v = p->vpp;

    ltime L;
    if (cm->whole)
        whole_unit(&k, &L);
    else
        layer(&k, &L);
    ends E;
    double best = L.best_rate;
    ends_time(&k, &E, &best);
    double lf = L.gemm_f + L.attn_f + L.mem_f + L.tp_f + L.ep_f + L.cp_f;
    double lb = L.gemm_b + L.attn_b + L.mem_b + L.tp_b + L.ep_b + L.cp_b +
                L.rec;
    /* the slowest stage's layers and parameters */
    double l0 = st->l0, l1 = st->l1, lm = st->lm;
    double lmax = maxd(maxd(l0, l1), lm);
    window w;
    w.layers = lmax;
    w.P = maxd(maxd(st->pd0, st->pd1), st->pdm);
    w.Pe = maxd(maxd(st->pe0, st->pe1), st->pem);
    w.Tf = lmax * lf;
    w.Tb = lmax * lb;
    w.pu = st->pu;
    double slf = lf, slb = lb, first = 0;
    bool sharded = p->sharding == VP_SHARD_ZERO3 ||
                   p->sharding == VP_SHARD_FSDP_FULL ||
                   p->sharding == VP_SHARD_FSDP_GRAD_OP ||
                   p->sharding == VP_SHARD_FSDP_HYBRID ||
                   vp__fsdp2(p->sharding);
    if (sharded)
        dp_sharded(&k, &w, &slf, &slb, &first);
    double per = slf + slb;
    bool one = p->pp == 1;
    /* multi-token prediction: its layers are in l1 (stage_params); the
     * head again and the 2h x h projection, forward and backward */
    double mtpg = 0, mtph = 0;
    if (p->mtp) {
        const vp__gemm pr = {(double)cm->seq, k.h, 2 * k.h, 1,
                             VP__SPLIT_COL, false};
        mtpg = p->mtp * (E.gemm + 3 * gemms(&k, &pr, 1, &best));
        mtph = mtpg + p->mtp * E.mh;
    }
    double s0 = l0 * per + E.emb + E.emb_comm + (one ? E.head + mtph : 0) +
                first;
    double s1 = l1 * per + E.head + mtph +
                (one ? E.emb + E.emb_comm : 0) + first;
    double sm = lm > 0 ? lm * per + first : 0;
    double tst = maxd(maxd(s0, s1), sm);
    double pp2 = p2p(&k);
    double tmb = tst + pp2;
    double pipe = one ? m * tmb : (m + (pp - 1) / v) * tmb;
    if (!one && p->schedule == VP_SCHED_DUALPIPE) {
        /* DeepSeek-V3 report Table 2: bubble (PP/2 - 1)(F&B + B - 3W)
         * with F, B the slowest stage's forward and full backward chunk
         * (in the proportion of its layers'), F&B the two overlapped
         * (their compute: F + B) and W its weight gradients (half the
         * layers' backward GEMMs) */
        pipe = m * tmb + vp_pipeline_bubble_time(p->schedule, p->pp, 1,
                                                 tst * slf / per,
                                                 tst * slb / per,
                                                 lmax * L.gemm_b / 2);
    }
    double dpx = dp_flat(&k, &w);
    /* tied embeddings on two stages: their gradients all-reduced */
    if (cm->tied && p->pp > 1) {
        double gb, pb;
        dp_bytes(p, &gb, &pb);
        vp__group g;
        vp__group_shape(c, 2, (double)p->tp * p->cp * p->dp * (p->pp - 1),
                        &g);
        dpx += vp__coll(&g, VP_COLL_ALL_REDUCE,
                        gb * (cm->p_word.r + cm->p_word.s / k.t));
    }

    double opt, off;
    opt_offload(&k, st->popt, &w, &opt, &off);
    opt += fp8_amax_pass(&k, lmax);

    double step = pipe + dpx + opt + off;
    double gbatch = (double)p->dp * k.b * m;
    memset(tm, 0, sizeof *tm);
    int which = s0 >= s1 && s0 >= sm ? 0 : s1 >= sm ? 1 : 2;
    double ls = which == 0 ? l0 : which == 1 ? l1 : lm;
    bool has_emb = one || which == 0, has_head = one || which == 1;
    double full = p->recompute == VP_RC_FULL;
    tm->tp_comm = m * (ls * (L.tp_f + L.tp_b + full * L.tp_f) +
                       (has_emb ? E.emb_comm : 0));
    tm->ep_comm = m * ls * (L.ep_f + L.ep_b + full * L.ep_f);
    tm->cp_comm = m * ls * (L.cp_f + L.cp_b + full * L.cp_f);
    tm->recompute = m * ls * (L.rec_gemm + L.rec_attn + L.rec_mem);
    tm->gemm = m * (ls * (L.gemm_f + L.gemm_b + L.rec_gemm) +
                    (has_head ? E.gemm + mtpg : 0));
    tm->attention = m * ls * (L.attn_f + L.attn_b + L.rec_attn);
    tm->memory = m * (ls * (L.mem_f + L.mem_b + L.rec_mem) +
                      (has_emb ? E.me : 0) +
                      (has_head ? E.mh + mtph - mtpg : 0));
    tm->compute = tm->gemm + tm->attention + tm->memory - tm->recompute;
    tm->dp_comm = dpx;
    if (sharded)
        tm->dp_comm += m * (ls * ((slf - lf) + (slb - lb)) + first);
    tm->pp_comm = m * pp2;
    tm->bubble = pipe - m * tmb;
    tm->optimizer = opt;
    tm->offload = off;
    tm->model_flops = gbatch * cm->flops_per_sample;
    double peak = x->peak[p->dtype] * (double)c->gpus;
    /* sanity bound: no plan beats its own best GEMM */
    tm->mfu_bound = x->peak[p->dtype] > 0
                        ? best * k.sus / x->peak[p->dtype]
                        : 0;
    if (tm->mfu_bound > 0 && tm->model_flops / (step * peak) > tm->mfu_bound)
        step = tm->model_flops / (peak * tm->mfu_bound);
    tm->step = step;
    tm->samples_per_s = gbatch / step;
    /* a graph-form model's token is a sample (vp_cluster_model_info) */
    tm->tokens_per_s = gbatch * (cm->whole ? 1.0 : (double)cm->seq) / step;
    double recf = p->recompute == VP_RC_FULL ? cm->rec_full_per_sample
                  : p->recompute == VP_RC_SELECTIVE ? cm->rec_sel_per_sample
                                                    : 0;
    tm->mfu = tm->model_flops / (step * peak);
    tm->hfu = (tm->model_flops + gbatch * recf) / (step * peak);
}
