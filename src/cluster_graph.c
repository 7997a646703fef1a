/* Plans for clusters of a graph-form or encoder-decoder model, planned
 * whole: data
 * parallelism (PyTorch DDP, DeepSpeed ZeRO 1-3, PyTorch FSDP) with
 * tp = pp = cp = ep = 1. The model is not one repeated transformer layer
 * that a two-layer copy stands for, so the whole graph is simulated at
 * micro-batch 1 and 2 (the activation bytes are linear in the batch)
 * and its matmul shapes, convolution and attention FLOPs feed the
 * evaluator's time model. The evaluator (cluster_mem.c, cluster_time.c)
 * sees the model as `units` equal layers, its checkpoint segments (the
 * units FSDP wraps), with the parameters outside every segment as the
 * root unit. docs/CLUSTER.md "Graph-form models". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "graph_internal.h"

/* ------------------------------------------------------------------ */
/* The model                                                           */
/* ------------------------------------------------------------------ */

void vp__whole_free(vp__whole *w)
{
    if (!w)
        return;
    free(w->gemm);
    free(w);
}

/* Add `count` GEMMs of one shape (rows per sample) to the list, merged
 * with an equal shape. */
static bool add_gemm(vp__whole *w, size_t *cap, double rows, double n,
                     double k)
{
    if (rows <= 0 || n <= 0 || k <= 0)
        return true;
    for (size_t i = 0; i < w->n_gemm; i++)
        if (w->gemm[i].rows == rows && w->gemm[i].n == n &&
            w->gemm[i].k == k) {
            w->gemm[i].count += 1;
            return true;
        }
    if (w->n_gemm == *cap &&
        !vp__grow((void **)&w->gemm, cap, w->n_gemm + 1, sizeof *w->gemm))
        return false;
    w->gemm[w->n_gemm++] = (vp__gemm){rows, n, k, 1, VP__SPLIT_NONE, false};
    return true;
}

/* The matmul work of one sample as the single-GPU time model times it
 * (timing.c matmul_time): linear layers and materialised attention
 * scores as GEMM shapes, convolutions by their FLOPs, fused attention
 * cores by theirs. */
static bool scan_work(const vp_graph *g, vp_cluster_model *cm, vp__whole *w)
{
    size_t cap = 0;
    for (size_t i = 0; i < g->n_ops; i++) {
        const vp_op *o = &g->ops[i];
        bool ok = true;
        if (o->kind == VP_OP_LINEAR && o->out_features && o->in_features) {
            ok = add_gemm(w, &cap,
                          (double)o->numel / (double)o->out_features,
                          (double)o->out_features, (double)o->in_features);
        } else if (o->kind == VP_OP_CONV2D ||
                   o->kind == VP_OP_CONV_TRANSPOSE2D) {
            w->conv_f += o->flops_fwd;
            w->conv_b += o->flops_bwd;
            w->conv_el += (double)o->numel;
        } else if (o->kind == VP_OP_BATCHNORM2D) {
            for (int k = 0; k < VP__BN__N; k++)
                for (int ph = 0; ph < 2; ph++)
                    w->bn[k][ph] += vp__bn_bytes(
                        k, ph, (double)o->numel, (double)o->rows,
                        o->rows ? (double)o->numel / (double)o->rows : 1);
        } else if (o->kind == VP_OP_ATTENTION) {
            if (o->attn_impl == VP_ATTN_EAGER || o->attn_impl == VP_ATTN_MATH) {
                double bh = (double)o->shape[0] * (double)o->heads;
                double q = (double)o->q_len, kv = (double)o->kv_len;
                double d = (double)o->head_dim;
                ok = add_gemm(w, &cap, bh * q, kv, d) &&
                     add_gemm(w, &cap, bh * q, d, kv);
            } else {
                cm->fattn_f.r += o->flops_fwd;
                cm->fattn_b.r += o->flops_bwd;
                cm->n_attn += 1;
            }
        }
        if (!ok)
            return false;
        cm->flops_per_sample += o->flops_fwd + o->flops_bwd;
    }
    if (cm->n_attn > 0) { /* the fields hold one attention core's */
        cm->fattn_f.r /= cm->n_attn;
        cm->fattn_b.r /= cm->n_attn;
    }
    return true;
}

/* nn.MultiheadAttention(batch_first=True)'s projections: one sample's
 * forward copies and bias adds, and the backward's copies, fills and
 * sums of q, k and v, as the single-GPU model times them
 * (timing.c vp__mha_kernels), in 16 bits and in fp32. */
static void scan_mha(const vp_graph *g, vp__whole *w)
{
    for (int wide = 0; wide < 2; wide++) {
        vp_setup s;
        vp_setup_init(&s);
        s.batch = 1;
        s.precision = wide ? VP_PREC_FP32 : VP_PREC_BF16;
        vp__mha_bytes *sum = &w->mha[wide];
        for (size_t i = 0; i < g->n_ops; i++) {
            vp__mha_bytes k;
            if (!vp__mha_kernels(g, &s, &g->ops[i], &k))
                continue;
            sum->copy[0] += k.copy[0];
            sum->copy[1] += k.copy[1];
            sum->add += k.add;
            sum->bcopy += k.bcopy;
            sum->badd += k.badd;
        }
    }
}

/* Parameters: the total, the root (outside every segment) and the
 * largest segment with its tensors. */
static vp_status scan_units(const vp_graph *g, vp_cluster_model *cm,
                            vp__whole *w, vp_error *err)
{
    size_t ns = g->n_segs ? g->n_segs : 1;
    double *seg = calloc(ns, sizeof *seg), *tens = calloc(ns, sizeof *tens);
    if (!seg || !tens) {
        free(seg);
        free(tens);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    double all = 0, root = 0;
    for (size_t i = 0; i < g->n_params; i++) {
        const vp_param *p = &g->params[i];
        if (!p->trainable)
            continue;
        double n = (double)p->numel;
        if (n > w->big)
            w->big = n;
        int32_t s = p->op < g->n_ops ? g->ops[p->op].segment : -1;
        all += n;
        if (s < 0 || (size_t)s >= g->n_segs) {
            root += n;
        } else {
            seg[s] += n;
            tens[s] += 1;
        }
    }
    for (size_t s = 0; s < g->n_segs; s++)
        if (seg[s] > w->unit_max) {
            w->unit_max = seg[s];
            cm->layer_tensors = tens[s];
        }
    free(seg);
    free(tens);
    cm->L = g->n_segs ? g->n_segs : 1;
    /* the evaluator's layers: the units' mean; its embedding: the root */
    cm->p_layer.r = (all - root) / (double)cm->L;
    cm->p_emb_other.r = root;
    if (g->n_segs == 0) { /* one unit: the whole model */
        cm->p_layer.r = all;
        cm->p_emb_other.r = 0;
        w->unit_max = all;
        cm->layer_tensors = (double)g->n_params;
    }
    cm->params = (uint64_t)llround(all);
    cm->layer_params = (uint64_t)llround(w->unit_max);
    cm->embed_params = (uint64_t)llround(root);
    return VP_OK;
}

vp_cluster_model *vp__cluster_whole_new(const vp_model *m, uint64_t seq,
                                        vp_error *err)
{
    vp_cluster_model *cm = calloc(1, sizeof *cm);
    vp__whole *w = calloc(1, sizeof *w);
    if (!cm || !w) {
        free(cm);
        free(w);
        vp_error_set(err, VP_ENOMEM, "out of memory");
        return NULL;
    }
    cm->m = m;
    cm->whole = w;
    cm->seq = seq ? seq : vp_model_default_seq(m);
    if (cm->seq == 0)
        cm->seq = 1; /* no sequence: a token is a sample */
    vp_graph *g = vp_graph_build(m, 1, cm->seq, err);
    vp_status st = g ? VP_OK : (err ? err->code : VP_ERANGE);
    if (st == VP_OK && !scan_work(g, cm, w))
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
    if (st == VP_OK)
        scan_mha(g, w);
    if (st == VP_OK)
        st = scan_units(g, cm, w, err);
    vp_graph_free(g);
    if (st != VP_OK) {
        vp_cluster_model_free(cm);
        return NULL;
    }
    return cm;
}

/* ------------------------------------------------------------------ */
/* The simulated step                                                  */
/* ------------------------------------------------------------------ */

typedef struct {
    const vp_op *op;
    const char *name;
} opname;

static int opname_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const opname *)a)->name;
    uintptr_t y = (uintptr_t)((const opname *)b)->name;
    return x < y ? -1 : x > y;
}

/* Step 2 of the simulation: `live` (activations, temporaries, the input
 * batch) at each event, the temporaries its backward allocates (a
 * parameter's gradient is one that a later zero_grad frees as a
 * gradient, or that is never freed) and the memory-bound ops' output
 * bytes and kernels. */
typedef struct {
    opname *ops;
    size_t n_ops;
    double live, base, end_fwd;
    double input;      /* of live, the input batch                       */
    bool started, bwd;
    struct wsample { uint64_t seq; double live; } *smp;
    size_t n_smp, cap_smp;
    struct wtemp { uint64_t handle, seq; double bytes; bool freed; } *tmp;
    size_t n_tmp, cap_tmp;
    double mem[2], ker[2]; /* forward, backward */
    bool oom;
} wtrack;

static const vp_op *op_of(const wtrack *k, const char *name)
{
    opname key = {NULL, name};
    const opname *r = name ? bsearch(&key, k->ops, k->n_ops, sizeof key,
                                     opname_cmp)
                           : NULL;
    return r ? r->op : NULL;
}

static bool memory_bound(const vp_op *o)
{
    return o->kind != VP_OP_LINEAR && o->kind != VP_OP_CONV2D &&
           o->kind != VP_OP_CONV_TRANSPOSE2D && o->kind != VP_OP_ATTENTION;
}

static void on_free(wtrack *k, const vp_sim_event *ev)
{
    if (ev->category == VP_CAT_GRAD)
        return; /* a gradient: stays in the temporaries' list */
    for (size_t i = k->n_tmp; i-- > 0;)
        if (k->tmp[i].handle == ev->tensor && !k->tmp[i].freed) {
            k->tmp[i].freed = true;
            return;
        }
}

static void wtrack_event(const vp_sim_event *ev, void *ud)
{
    wtrack *k = ud;
    double before = k->live;
    bool mine = ev->category == VP_CAT_ACT || ev->category == VP_CAT_TEMP ||
                ev->category == VP_CAT_INPUT;
    /* a gradient was allocated as a temporary (AccumulateGrad steals it) */
    double d = ev->is_free ? -(double)ev->bytes : (double)ev->bytes;
    if (mine || (ev->is_free && ev->category == VP_CAT_GRAD))
        k->live += d;
    if (ev->category == VP_CAT_INPUT)
        k->input += d;
    if (ev->step != 2 || (ev->phase != VP_PHASE_FORWARD &&
                          ev->phase != VP_PHASE_BACKWARD)) {
        if (ev->is_free && ev->step >= 2)
            on_free(k, ev);
        return;
    }
    if (!k->started) {
        /* the step's input batch, loaded before it, is kept by it */
        k->started = true;
        k->base = before - k->input;
    }
    int ph = ev->phase == VP_PHASE_BACKWARD;
    if (ph && !k->bwd) {
        k->bwd = true;
        k->end_fwd = before;
    }
    if (ev->is_free) {
        on_free(k, ev);
    } else {
        const vp_op *o = op_of(k, ev->op);
        if (o && memory_bound(o) && mine) {
            k->mem[ph] += (double)ev->bytes;
            k->ker[ph] += 1;
        }
        if (ph && ev->category == VP_CAT_TEMP) {
            if (k->n_tmp == k->cap_tmp &&
                !vp__grow((void **)&k->tmp, &k->cap_tmp, k->n_tmp + 1,
                          sizeof *k->tmp)) {
                k->oom = true;
                return;
            }
            k->tmp[k->n_tmp++] =
                (struct wtemp){ev->tensor, ev->seq, (double)ev->bytes, false};
        }
    }
    if (k->n_smp == k->cap_smp &&
        !vp__grow((void **)&k->smp, &k->cap_smp, k->n_smp + 1,
                  sizeof *k->smp)) {
        k->oom = true;
        return;
    }
    k->smp[k->n_smp++] = (struct wsample){ev->seq, k->live};
}

static vp_precision whole_precision(int cls)
{
    return cls == VP__CLS_AMP ? VP_PREC_AMP_BF16
           : cls == VP__CLS_FP32 ? VP_PREC_FP32
                                 : VP_PREC_BF16;
}

/* One simulation at micro-batch b: q[VP__Q_LAYER] the bytes the forward
 * keeps, q[VP__Q_EXTRA] the step's peak beyond them without the
 * parameter gradients, q[VP__Q_LAYER_GRAD] what the gradients made by
 * then add, q[VP__Q_MEM_*] / q[VP__Q_KER_*] the memory-bound bytes and
 * kernels. */
static vp_status simulate_whole(vp_cluster_model *cm, int cls, uint64_t b,
                                double q[VP__Q_COUNT], vp_error *err)
{
    vp_graph *g = vp_graph_build(cm->m, b, cm->seq, err);
    if (!g)
        return err ? err->code : VP_ERANGE;
    wtrack k;
    memset(&k, 0, sizeof k);
    vp_status st = VP_OK;
    k.ops = malloc((g->n_ops ? g->n_ops : 1) * sizeof *k.ops);
    if (!k.ops) {
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < g->n_ops; i++)
        k.ops[i] = (opname){&g->ops[i], g->ops[i].name};
    k.n_ops = g->n_ops;
    qsort(k.ops, k.n_ops, sizeof *k.ops, opname_cmp);
    vp_setup s;
    vp_setup_init(&s);
    s.batch = b;
    s.seq = cm->seq;
    s.precision = whole_precision(cls);
    s.optimizer = VP_OPT_NONE;
    s.steps = VP_STEADY_STEPS + 1; /* step 3's zero_grad names step 2's
                                      gradients */
    s.context_bytes = 0;
    vp_estimate e;
    cm->sims++;
    st = vp_simulate(g, &s, &e, wtrack_event, &k, err);
    if (st == VP_OK && k.oom)
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
    if (st != VP_OK)
        goto done;
    /* the peak with and without the gradients made so far */
    double all = k.end_fwd, nog = k.end_fwd, gsum = 0;
    size_t j = 0;
    for (size_t i = 0; i < k.n_smp; i++) {
        while (j < k.n_tmp && k.tmp[j].seq <= k.smp[i].seq) {
            if (!k.tmp[j].freed)
                gsum += k.tmp[j].bytes;
            j++;
        }
        all = fmax(all, k.smp[i].live);
        nog = fmax(nog, k.smp[i].live - gsum);
    }
    memset(q, 0, sizeof(double) * VP__Q_COUNT);
    q[VP__Q_LAYER] = fmax(0, k.end_fwd - k.base);
    q[VP__Q_EXTRA] = fmax(0, nog - k.end_fwd);
    q[VP__Q_LAYER_GRAD] = fmax(0, all - nog);
    q[VP__Q_MEM_F] = k.mem[0];
    q[VP__Q_MEM_B] = k.mem[1];
    q[VP__Q_KER_F] = k.ker[0];
    q[VP__Q_KER_B] = k.ker[1];
done:
    free(k.ops);
    free(k.smp);
    free(k.tmp);
    vp_graph_free(g);
    return st;
}

/* The kernels the host issues for one micro-batch in each phase, as the
 * single-GPU time model counts them (vp_step_time_estimate's
 * host_kernels, host_bwd_kernels and the backward's GEMM nodes' units,
 * host_bwd_calls, docs/STEP_TIME.md "The host per op"): they depend neither on the GPU's
 * rates, so any rates will do, nor on the batch from 2 on (at 1 the
 * backward allocates less: ViT-B/16 issues 387 backward kernels at 1,
 * 485 from 2 to 64). */
static vp_status host_kernels(vp_cluster_model *cm, int cls, double k[2],
                              vp_error *err)
{
    vp_graph *g = vp_graph_build(cm->m, 2, cm->seq, err);
    if (!g)
        return err ? err->code : VP_ERANGE;
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    strcpy(hw.name, "counts");
    hw.bf16 = hw.fp16 = hw.fp32 = hw.fp8 = 1e15;
    hw.hbm = 1e12;
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 2;
    s.seq = cm->seq;
    s.precision = whole_precision(cls);
    s.optimizer = VP_OPT_NONE;
    s.context_bytes = 0;
    vp_step_time t;
    cm->sims++;
    vp_status st = vp_step_time_estimate(g, &s, &hw, &t, err);
    vp_graph_free(g);
    k[0] = t.host_kernels;
    k[1] = t.host_bwd_kernels + t.host_bwd_calls;
    return st;
}

vp_status vp__whole_act(vp_cluster_model *cm, vp__act *a, vp_error *err)
{
    vp_status hs = host_kernels(cm, a->cls, a->host_k, err);
    if (hs != VP_OK)
        return hs;
    double q[2][VP__Q_COUNT];
    for (int bi = 0; bi < 2; bi++) {
        vp_status st = simulate_whole(cm, a->cls, (uint64_t)bi + 1, q[bi],
                                      err);
        if (st != VP_OK)
            return st;
    }
    /* linear in b through b = 1 and 2; nothing tensor-parallel */
    for (int i = 0; i < VP__Q_COUNT; i++) {
        a->q[i].r1 = q[1][i] - q[0][i];
        a->q[i].r0 = q[0][i] - a->q[i].r1;
    }
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* What a whole model cannot do                                        */
/* ------------------------------------------------------------------ */

vp_status vp__whole_check(const vp_cluster_model *cm, const vp_par *p,
                          vp_error *err)
{
    const char *name = vp_model_name(cm->m);
#define REFUSE(what, why)                                                  \
    return vp_error_set(err, VP_EARG,                                      \
                        "%s: '%s' is planned whole (a graph-form or "      \
                        "encoder-decoder model: data parallelism, ZeRO "   \
                        "or FSDP); %s",                                    \
                        what, name, why)
    if (p->tp > 1)
        REFUSE("tensor parallelism", "splitting its matmuls needs a "
                                     "transformer's heads and MLP widths");
    if (p->pp > 1)
        REFUSE("pipeline parallelism", "stages need a sequence of "
                                       "repeated layers");
    if (p->cp > 1)
        REFUSE("context parallelism", "splitting the sequence needs a "
                                      "transformer's attention");
    if (p->ep > 1)
        REFUSE("expert parallelism", "it has no mixture of experts the "
                                     "planner knows");
    if (p->sp)
        REFUSE("sequence parallelism", "it needs tensor parallelism");
    if (vp_sharding_engine(p->sharding) == VP_ENGINE_MEGATRON)
        REFUSE(vp_sharding_name(p->sharding),
               "Megatron-LM trains its own decoder-only models");
    if (p->recompute != VP_RC_NONE)
        REFUSE("recomputation", "its checkpointing is per segment "
                                "(estimate --checkpoint), planned on one "
                                "GPU");
    if (p->dtype == VP_DT_FP8)
        REFUSE("fp8", "float8 training converts a transformer's linear "
                      "layers, not its convolutions");
    if (p->compile)
        REFUSE("torch.compile", "its fused kernels are modeled for "
                                "transformers only");
    return VP_OK;
#undef REFUSE
}

vp_status vp__whole_opts_check(const vp_cluster_model *cm,
                               const vp_search_opts *o, vp_error *err)
{
    vp_par p;
    memset(&p, 0, sizeof p);
    p.tp = o->tp ? o->tp : 1;
    p.pp = o->pp ? o->pp : 1;
    p.cp = o->cp ? o->cp : 1;
    p.ep = o->ep ? o->ep : 1;
    p.sp = o->sp == 1;
    p.sharding = o->sharding >= 0 ? (vp_sharding)o->sharding
                                  : VP_SHARD_DDP;
    p.recompute = o->recompute >= 0 ? (vp_recompute)o->recompute
                                    : VP_RC_NONE;
    p.compile = o->compile;
    /* fp8 or the megatron engine alone leave nothing to search */
    bool only_fp8 = o->dtypes[VP_DT_FP8];
    bool only_mg = o->engines[VP_ENGINE_MEGATRON];
    for (int i = 0; i < VP_DT__COUNT; i++)
        only_fp8 &= i == VP_DT_FP8 || !o->dtypes[i];
    for (int i = 0; i < VP_ENGINE__COUNT; i++)
        only_mg &= i == VP_ENGINE_MEGATRON || !o->engines[i];
    p.dtype = only_fp8 ? VP_DT_FP8 : VP_DT_BF16;
    if (only_mg && o->sharding < 0)
        return vp_error_set(err, VP_EARG,
                            "the megatron engine: '%s' is planned whole (a "
                            "graph-form or encoder-decoder model: data "
                            "parallelism, ZeRO or FSDP); Megatron-LM trains "
                            "its own decoder-only models",
                            vp_model_name(cm->m));
    return vp__whole_check(cm, &p, err);
}
