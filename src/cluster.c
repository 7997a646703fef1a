/* Plans for clusters: the per-model precomputation (graph + simulator)
 * and the analytic evaluation of one configuration. The search is in
 * cluster_search.c, the closed forms and names in cluster_forms.c; what
 * they share is in cluster_impl.h. Formulas: docs/CLUSTER.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"

/* ------------------------------------------------------------------ */
/* Cluster defaults                                                    */
/* ------------------------------------------------------------------ */

void vp_cluster_init(vp_cluster *c, const vp_hw *hw, uint32_t gpus,
                     uint32_t gpus_per_node)
{
    memset(c, 0, sizeof *c);
    c->hw = *hw;
    /* profiles describe one GPU; the network is the cluster's: one
     * 400 Gb/s NIC per GPU for Hopper-class GPUs, 200 Gb/s before */
    if (c->hw.network <= 0)
        c->hw.network = hw->bf16 >= 900e12 ? 50e9 : 25e9;
    /* no NVLink: peers talk over PCIe */
    if (c->hw.nvlink <= 0)
        c->hw.nvlink = hw->host > 0 ? hw->host : c->hw.network;
    c->gpus = gpus;
    c->gpus_per_node = gpus_per_node ? gpus_per_node : 8;
    c->memory = hw->memory;
    c->context = hw->context ? hw->context : VP_DEFAULT_CONTEXT_BYTES;
    c->host_mem = (uint64_t)128 * VP_GiB * c->gpus_per_node;
    c->host_mem_bw = 200e9;
    c->nvlink_eff = 0.8;
    c->net_eff = 0.85;
    c->nvlink_latency = 5e-6;
    c->net_latency = 1e-5;
    c->nccl_comm_bytes = (uint64_t)320 * VP_MiB;
    c->nccl_peer_bytes = (uint64_t)48 * VP_MiB;
    c->alloc_overhead = 0.05;
}

/* ------------------------------------------------------------------ */
/* Fits                                                                */
/* ------------------------------------------------------------------ */

/* X(b, t) from four simulations: at t = 1 and t = t2, b = 1 and 2. */
static void fit_from(vp__fit *f, double x11, double x21, double x12,
                     double x22, double t2)
{
    /* X(b, t) = R(b) + S(b)/t: S = (X(b,1) - X(b,t2)) t2/(t2 - 1) */
    double s1 = t2 > 1 ? (x11 - x12) * t2 / (t2 - 1) : 0;
    double s2 = t2 > 1 ? (x21 - x22) * t2 / (t2 - 1) : 0;
    double r1 = x11 - s1, r2 = x21 - s2;
    if (s1 < 0) { r1 += s1; s1 = 0; }
    if (s2 < 0) { r2 += s2; s2 = 0; }
    /* linear in b through b = 1 and b = 2 */
    f->r1 = r2 - r1;
    f->r0 = r1 - f->r1;
    f->s1 = s2 - s1;
    f->s0 = s1 - f->s1;
}

/* ------------------------------------------------------------------ */
/* Graph scan: parameters and FLOPs                                    */
/* ------------------------------------------------------------------ */

typedef struct {
    double p_layer, p_exp, p_word, p_emb_other, p_head_word, p_head_other;
    double flin_f, flin_b, fattn_f, fattn_b, fexp_f, fexp_b;
    double fhead_f, fhead_b;
    double n_lin, n_attn, n_exp, n_head;
    double flops_layer, flops_emb, flops_head; /* all ops, fwd + bwd */
    double fattn_fwd_layer;                    /* for selective HFU  */
    uint64_t params;
} gscan;

enum { REG_EMB, REG_L0, REG_L1, REG_HEAD };

static int region_of(const vp_graph *g, uint32_t op)
{
    if (op < g->segs[0].first_op)
        return REG_EMB;
    if (op <= g->segs[0].last_op)
        return REG_L0;
    if (op <= g->segs[1].last_op)
        return REG_L1;
    return REG_HEAD;
}

static bool is_expert_op(const vp_op *o)
{
    return o->name && strstr(o->name, ".experts.") != NULL;
}

static void scan_graph(const vp_graph *g, gscan *s)
{
    memset(s, 0, sizeof *s);
    for (size_t i = 0; i < g->n_params; i++) {
        const vp_param *p = &g->params[i];
        if (!p->trainable)
            continue;
        const vp_op *o = &g->ops[p->op];
        double n = (double)p->numel;
        switch (region_of(g, p->op)) {
        case REG_EMB:
            if (o->kind == VP_OP_EMBEDDING && o->name &&
                strcmp(o->name, "embed_tokens") == 0)
                s->p_word += n;
            else
                s->p_emb_other += n;
            break;
        case REG_L0:
            break;
        case REG_L1:
            if (is_expert_op(o))
                s->p_exp += n;
            else
                s->p_layer += n;
            break;
        default:
            if (o->kind == VP_OP_LINEAR && o->out_features > o->in_features)
                s->p_head_word += n;
            else
                s->p_head_other += n;
            break;
        }
    }
    for (size_t i = 0; i < g->n_ops; i++) {
        const vp_op *o = &g->ops[i];
        int r = region_of(g, (uint32_t)i);
        double fb = o->flops_fwd + o->flops_bwd;
        if (r == REG_EMB)
            s->flops_emb += fb;
        else if (r == REG_HEAD)
            s->flops_head += fb;
        else if (r == REG_L1)
            s->flops_layer += fb;
        if (r == REG_L1 && o->kind == VP_OP_LINEAR) {
            if (is_expert_op(o)) {
                s->fexp_f += o->flops_fwd;
                s->fexp_b += o->flops_bwd;
                s->n_exp += 1;
            } else {
                s->flin_f += o->flops_fwd;
                s->flin_b += o->flops_bwd;
                s->n_lin += 1;
            }
        } else if (r == REG_L1 && o->kind == VP_OP_ATTENTION) {
            s->fattn_f += o->flops_fwd;
            s->fattn_b += o->flops_bwd;
            s->n_attn += 1;
        } else if (r == REG_HEAD && o->kind == VP_OP_LINEAR) {
            s->fhead_f += o->flops_fwd;
            s->fhead_b += o->flops_bwd;
            s->n_head += 1;
        }
    }
    s->fattn_fwd_layer = s->fattn_f;
}

/* ------------------------------------------------------------------ */
/* Simulation: per-layer activation bytes and memory traffic            */
/* ------------------------------------------------------------------ */

typedef struct {
    const char *p;
    uint32_t i;
} name_idx;

static int name_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const name_idx *)a)->p;
    uintptr_t y = (uintptr_t)((const name_idx *)b)->p;
    return (x > y) - (x < y);
}

typedef struct {
    const vp_graph *g;
    name_idx *names;
    size_t n;
    uint32_t core;     /* attention op of layer 1 (UINT32_MAX: none)  */
    double live;       /* ACT + TEMP + INPUT bytes                    */
    int region;
    bool fwd, bwd, l1_bwd, core_seen;
    double live_start, end_live[4], end_fwd;
    double scores;     /* elements of the core attention's scores */
    double core_s2;    /* its s x s bytes kept after its forward  */
    /* the temporaries allocated in step 2's backward: a parameter's
     * gradient is one of them (AccumulateGrad steals it) and is known
     * as such when zero_grad frees it as a gradient */
    struct gtemp {
        uint64_t handle, seq;
        double bytes;
        bool grad;
    } *temps;
    size_t n_temps, cap_temps;
    /* `live` where the head's and layer 1's peaks are looked for */
    struct gsample {
        uint64_t seq;
        double live;
        int reg; /* REG_HEAD or REG_L1 */
    } *samples;
    size_t n_samples, cap_samples;
    bool oom;
    double q[VP__Q_COUNT];
} simtrack;

static int64_t lookup_op(const simtrack *k, const char *name)
{
    size_t lo = 0, hi = k->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)k->names[mid].p < (uintptr_t)name)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < k->n && k->names[lo].p == name)
        return k->names[lo].i;
    return -1;
}

static void account_mem(simtrack *k, const vp_op *o, int reg, bool bwd,
                        double bytes)
{
    if (o->kind == VP_OP_LINEAR)
        return; /* written by the GEMM: in its time */
    if (reg == REG_L1) {
        if (o->kind == VP_OP_ATTENTION) {
            k->q[bwd ? VP__Q_ATTN_MEM_B : VP__Q_ATTN_MEM_F] += bytes;
        } else {
            k->q[bwd ? VP__Q_MEM_B : VP__Q_MEM_F] += bytes;
            k->q[bwd ? VP__Q_KER_B : VP__Q_KER_F] += 1;
        }
    } else if (reg == REG_HEAD) {
        k->q[VP__Q_HEAD_MEM] += bytes;
        k->q[VP__Q_HEAD_KER] += 1;
    } else if (reg == REG_EMB) {
        k->q[VP__Q_EMB_MEM] += bytes;
        k->q[VP__Q_EMB_KER] += 1;
    }
}

/* Step 2's backward: log a temporary; mark the one a gradient free
 * releases. */
static void note_temp(simtrack *k, const vp_sim_event *ev)
{
    if (ev->is_free) {
        if (ev->category != VP_CAT_GRAD)
            return;
        /* the block was live from its allocation to this free: the
         * latest allocation of the handle is the gradient's */
        for (size_t i = k->n_temps; i-- > 0;)
            if (k->temps[i].handle == ev->tensor) {
                k->temps[i].grad = true;
                break;
            }
        return;
    }
    if (ev->category != VP_CAT_TEMP || ev->phase != VP_PHASE_BACKWARD)
        return;
    if (k->n_temps == k->cap_temps &&
        !vp__grow((void **)&k->temps, &k->cap_temps, k->n_temps + 1,
                  sizeof *k->temps)) {
        k->oom = true;
        return;
    }
    k->temps[k->n_temps++] = (struct gtemp){ev->tensor, ev->seq,
                                            (double)ev->bytes, false};
}

static void note_sample(simtrack *k, uint64_t seq, double live, int reg)
{
    if (k->n_samples == k->cap_samples &&
        !vp__grow((void **)&k->samples, &k->cap_samples, k->n_samples + 1,
                  sizeof *k->samples)) {
        k->oom = true;
        return;
    }
    k->samples[k->n_samples++] = (struct gsample){seq, live, reg};
}

/* The peak of region reg without the gradients the backward has made
 * (*nog) and what those gradients add to it (*add: the peak with them,
 * `live`'s, minus *nog). Samples and temporaries are in event order. */
static void peak_split(const simtrack *k, int reg, double *nog, double *add)
{
    double all = -INFINITY, best = -INFINITY, g = 0;
    size_t j = 0;
    for (size_t i = 0; i < k->n_samples; i++) {
        const struct gsample *sm = &k->samples[i];
        while (j < k->n_temps && k->temps[j].seq <= sm->seq) {
            if (k->temps[j].grad)
                g += k->temps[j].bytes;
            j++;
        }
        if (sm->reg != reg)
            continue;
        if (sm->live > all)
            all = sm->live;
        if (sm->live - g > best)
            best = sm->live - g;
    }
    if (all == -INFINITY) {
        *nog = *add = 0;
        return;
    }
    *nog = best;
    *add = all - best;
}

static void track(const vp_sim_event *ev, void *ud)
{
    simtrack *k = ud;
    double before = k->live;
    /* a gradient is allocated as a temporary and freed as a gradient:
     * `live` keeps the gradients the backward has made so far, which
     * peak_split() tells apart afterwards */
    if (ev->category == VP_CAT_ACT || ev->category == VP_CAT_TEMP ||
        ev->category == VP_CAT_INPUT)
        k->live += ev->is_free ? -(double)ev->bytes : (double)ev->bytes;
    if (ev->step != 2)
        return;
    note_temp(k, ev);
    int64_t op = lookup_op(k, ev->op);
    if (ev->phase == VP_PHASE_FORWARD) {
        int reg = op < 0 ? k->region : region_of(k->g, (uint32_t)op);
        if (!k->fwd) {
            k->fwd = true;
            k->live_start = before;
            k->region = reg;
        } else if (reg > k->region) {
            for (int r = k->region; r < reg; r++)
                k->end_live[r] = before;
            k->region = reg;
        }
        if (op >= 0 && (uint32_t)op == k->core && ev->bytes >= k->scores &&
            (ev->category == VP_CAT_ACT || ev->category == VP_CAT_TEMP)) {
            /* the s x s tensors of the core attention (scores, softmax,
             * dropout mask and output): what selective recomputation
             * drops; Q, K, V and the output stay saved */
            k->core_seen = true;
            k->core_s2 += ev->is_free ? -(double)ev->bytes
                                      : (double)ev->bytes;
        }
        if (k->region == REG_HEAD)
            note_sample(k, ev->seq, k->live, REG_HEAD);
        if (!ev->is_free && op >= 0)
            account_mem(k, &k->g->ops[op], reg, false, (double)ev->bytes);
    } else if (ev->phase == VP_PHASE_BACKWARD) {
        if (!k->bwd) {
            k->bwd = true;
            for (int r = k->region; r <= REG_HEAD; r++)
                k->end_live[r] = before;
            k->end_fwd = before;
            note_sample(k, ev->seq - 1, before, REG_HEAD);
        }
        int reg = op < 0 ? (k->l1_bwd ? REG_L1 : REG_HEAD)
                         : region_of(k->g, (uint32_t)op);
        if (reg == REG_HEAD && !k->l1_bwd)
            note_sample(k, ev->seq, k->live, REG_HEAD);
        if (reg == REG_L1) {
            k->l1_bwd = true;
            note_sample(k, ev->seq, k->live, REG_L1);
        }
        if (!ev->is_free && op >= 0)
            account_mem(k, &k->g->ops[op], reg, true, (double)ev->bytes);
    }
}

static vp_precision cls_precision(int cls)
{
    return cls == VP__CLS_AMP ? VP_PREC_AMP_BF16
           : cls == VP__CLS_FP32 ? VP_PREC_FP32
                                 : VP_PREC_BF16;
}

/* Bytes per element of the residual stream (a checkpointed layer's input)
 * and of the attention output, by precision class. */
static double cls_resid_bytes(int cls)
{
    return cls == VP__CLS_HALF ? 2.0 : 4.0;
}


/* One simulation of the local model (ti: 0 -> t = 1, 1 -> t = t2). */
static vp_status simulate_one(vp_cluster_model *cm, int cls, uint64_t seq,
                              uint64_t b, int ti, double q[VP__Q_COUNT],
                              vp_error *err)
{
    vp_graph *g = vp__graph_build_tf(&cm->local[ti], cm->m, b, seq, err);
    if (!g)
        return err ? err->code : VP_ESCHEMA;
    vp_status st = VP_OK;
    simtrack k;
    memset(&k, 0, sizeof k);
    k.g = g;
    k.n = g->n_ops;
    k.core = UINT32_MAX;
    k.names = malloc((g->n_ops ? g->n_ops : 1) * sizeof *k.names);
    if (!k.names) {
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < g->n_ops; i++) {
        k.names[i] = (name_idx){g->ops[i].name, (uint32_t)i};
        if (g->ops[i].kind == VP_OP_ATTENTION &&
            region_of(g, (uint32_t)i) == REG_L1 && k.core == UINT32_MAX)
            k.core = (uint32_t)i;
    }
    qsort(k.names, g->n_ops, sizeof *k.names, name_cmp);
    if (k.core != UINT32_MAX) {
        const vp_op *o = &g->ops[k.core];
        k.scores = (double)o->shape[0] * (double)o->heads *
                   (double)o->q_len * (double)o->kv_len;
    } else {
        k.scores = INFINITY;
    }
    vp_setup s;
    vp_setup_init(&s);
    s.batch = b;
    s.seq = seq;
    s.precision = cls_precision(cls);
    s.optimizer = VP_OPT_NONE;
    s.steps = VP_STEADY_STEPS;
    s.context_bytes = 0;
    vp_estimate e;
    cm->sims++;
    st = vp_simulate(g, &s, &e, track, &k, err);
    if (st != VP_OK)
        goto done;
    if (k.oom) {
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
        goto done;
    }
    memcpy(q, k.q, sizeof k.q);
    double layer = k.end_live[REG_L1] - k.end_live[REG_L0];
    /* `live` holds the parameter gradients the backward has made so far
     * (as a DDP .grad or an FSDP unit's unsharded gradient appears); the
     * peaks are split into the peak without them and what they add to
     * it, so that the evaluator counts them only where they are not
     * resident (DDP's bucket views, accumulated gradients) */
    double hn, ha, xn, xa;
    peak_split(&k, REG_HEAD, &hn, &ha);
    peak_split(&k, REG_L1, &xn, &xa);
    q[VP__Q_LAYER] = layer;
    q[VP__Q_EMB] = k.end_live[REG_L0] - k.live_start - layer;
    q[VP__Q_HEAD_SAVED] = k.end_fwd - k.end_live[REG_L1];
    q[VP__Q_HEAD_PEAK] = hn - k.end_live[REG_L1];
    q[VP__Q_EXTRA] = xn - k.end_live[REG_L1];
    q[VP__Q_HEAD_GRAD] = ha;
    q[VP__Q_LAYER_GRAD] = xa;
    q[VP__Q_ATTN_INT] = k.core_seen && k.core_s2 > 0 ? k.core_s2 : 0;
    for (int i = 0; i < VP__Q_COUNT; i++)
        if (q[i] < 0)
            q[i] = 0;
done:
    free(k.samples);
    free(k.temps);
    free(k.names);
    vp_graph_free(g);
    return st;
}

/* The activation entry for (cls, cp), simulated on first use. */
vp_status vp__act_get(vp_cluster_model *cm, int cls, uint32_t cp,
                      const vp__act **out, vp_error *err)
{
    for (size_t i = 0; i < cm->n_act; i++)
        if (cm->act[i]->cls == cls && cm->act[i]->cp == cp) {
            *out = cm->act[i];
            return VP_OK;
        }
    if (cm->seq % cp != 0)
        return vp_error_set(err, VP_EARG,
                            "context-parallel degree %u does not divide the "
                            "sequence length %llu",
                            cp, (unsigned long long)cm->seq);
    if (!vp__grow((void **)&cm->act, &cm->cap_act, cm->n_act + 1,
                  sizeof *cm->act))
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    vp__act *a = calloc(1, sizeof *a);
    if (!a)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    a->cls = cls;
    a->cp = cp;
    uint64_t sl = cm->seq / cp;
    double q[2][2][VP__Q_COUNT]; /* [b-1][ti] */
    int nt = cm->t2 > 1 ? 2 : 1;
    for (int bi = 0; bi < 2; bi++)
        for (int ti = 0; ti < nt; ti++) {
            vp_status st = simulate_one(cm, cls, sl, (uint64_t)bi + 1, ti,
                                        q[bi][ti], err);
            if (st != VP_OK) {
                free(a);
                return st;
            }
        }
    if (nt == 1)
        for (int bi = 0; bi < 2; bi++)
            memcpy(q[bi][1], q[bi][0], sizeof q[bi][0]);
    for (int i = 0; i < VP__Q_COUNT; i++)
        fit_from(&a->q[i], q[0][0][i], q[1][0][i], q[0][1][i], q[1][1][i],
                 (double)(cm->t2 > 1 ? cm->t2 : 1));
    a->resid_bytes = cls_resid_bytes(cls);
    cm->act[cm->n_act++] = a;
    *out = a;
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* The model                                                           */
/* ------------------------------------------------------------------ */

static uint64_t div_up(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

/* The smallest t > 1 that divides the heads, the MLP widths and works
 * with the KV heads (divides them, or is a multiple of them). */
static uint32_t tp_unit(const vp_tf *t)
{
    for (uint32_t d = 2; d <= 64; d++) {
        if (t->heads % d || t->ffn % d)
            continue;
        if (t->experts && t->expert_ffn % d)
            continue;
        if (t->kv_heads % d && d % t->kv_heads)
            continue;
        return d;
    }
    return 0;
}

/* The description of one tensor-parallel rank's share of two layers (a
 * value: vp_tf owns nothing). */
static void make_local(vp_tf *tf, const vp_model *m, uint32_t t)
{
    *tf = m->tf;
    tf->layers = 2;
    if (t <= 1)
        return;
    tf->heads /= t;
    tf->kv_heads = tf->kv_heads >= t ? tf->kv_heads / t : 1;
    tf->ffn /= t;
    tf->expert_ffn /= t;
    tf->vocab = div_up(tf->vocab, t);
}

vp_cluster_model *vp_cluster_model_new(const vp_model *m, uint64_t seq,
                                       vp_error *err)
{
    vp_error_clear(err);
    if (m->form != 0 || m->tf.layers < 1) {
        vp_error_set(err, VP_EUNSUPPORTED,
                     "cluster plans need a transformer model; '%s' is a "
                     "%s description",
                     m->name ? m->name : "?", vp_model_form(m));
        return NULL;
    }
    vp_cluster_model *cm = calloc(1, sizeof *cm);
    if (!cm) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        return NULL;
    }
    cm->m = m;
    cm->seq = seq ? seq : m->seq;
    if (cm->seq == 0)
        cm->seq = VP_DEFAULT_SEQ;
    const vp_tf *t = &m->tf;
    cm->L = t->layers;
    cm->hidden = t->hidden;
    cm->heads = t->heads;
    cm->kv_heads = t->kv_heads;
    cm->head_dim = t->head_dim;
    cm->ffn = t->ffn;
    cm->vocab = t->vocab;
    cm->experts = t->experts;
    cm->top_k = t->top_k;
    cm->attn = t->attn;
    cm->t2 = tp_unit(t);
    make_local(&cm->local[0], m, 1);
    make_local(&cm->local[1], m, cm->t2 > 1 ? cm->t2 : 1);
    gscan s[2];
    int nt = cm->t2 > 1 ? 2 : 1;
    for (int ti = 0; ti < nt; ti++) {
        vp_graph *g = vp__graph_build_tf(&cm->local[ti], cm->m, 1, cm->seq,
                                         err);
        if (!g) {
            free(cm);
            return NULL;
        }
        if (g->n_segs != 2) {
            vp_graph_free(g);
            free(cm);
            vp_error_set(err, VP_EUNSUPPORTED,
                         "cluster plans need a model of repeated layers");
            return NULL;
        }
        scan_graph(g, &s[ti]);
        vp_graph_free(g);
    }
    if (nt == 1)
        s[1] = s[0];
    double t2 = cm->t2 > 1 ? (double)cm->t2 : 1.0;
#define SPLIT(dst, field)                                                  \
    do {                                                                   \
        double x1 = s[0].field, x2 = s[1].field;                           \
        double sh = t2 > 1 ? (x1 - x2) * t2 / (t2 - 1) : 0;                \
        if (sh < 0)                                                        \
            sh = 0;                                                        \
        if (sh > x1)                                                       \
            sh = x1;                                                       \
        (dst).s = sh;                                                      \
        (dst).r = x1 - sh;                                                 \
    } while (0)
    SPLIT(cm->p_layer, p_layer);
    SPLIT(cm->p_exp, p_exp);
    SPLIT(cm->p_word, p_word);
    SPLIT(cm->p_emb_other, p_emb_other);
    SPLIT(cm->p_head_word, p_head_word);
    SPLIT(cm->p_head_other, p_head_other);
    SPLIT(cm->flin_f, flin_f);
    SPLIT(cm->flin_b, flin_b);
    SPLIT(cm->fattn_f, fattn_f);
    SPLIT(cm->fattn_b, fattn_b);
    SPLIT(cm->fexp_f, fexp_f);
    SPLIT(cm->fexp_b, fexp_b);
    SPLIT(cm->fhead_f, fhead_f);
    SPLIT(cm->fhead_b, fhead_b);
#undef SPLIT
    cm->n_lin = s[0].n_lin;
    cm->n_attn = s[0].n_attn;
    cm->n_exp = s[0].n_exp;
    cm->n_head = s[0].n_head;
    cm->tied = t->tied;
    double L = (double)cm->L;
    cm->flops_per_sample = L * s[0].flops_layer + s[0].flops_emb +
                           s[0].flops_head;
    cm->rec_full_per_sample = L * (s[0].flin_f + s[0].fattn_f + s[0].fexp_f);
    cm->rec_sel_per_sample = L * s[0].fattn_f;
    cm->params = (uint64_t)llround(
        L * (s[0].p_layer + s[0].p_exp) + s[0].p_word + s[0].p_emb_other +
        s[0].p_head_word + s[0].p_head_other);
    cm->layer_params = (uint64_t)llround(s[0].p_layer + s[0].p_exp);
    cm->embed_params = (uint64_t)llround(s[0].p_word + s[0].p_emb_other);
    cm->head_params = (uint64_t)llround(s[0].p_head_word +
                                        s[0].p_head_other);
    return cm;
}

void vp_cluster_model_free(vp_cluster_model *cm)
{
    if (!cm)
        return;
    for (size_t i = 0; i < cm->n_act; i++)
        free(cm->act[i]);
    free(cm->act);
    free(cm);
}

void vp_cluster_model_info_get(const vp_cluster_model *cm,
                               vp_cluster_model_info *out)
{
    memset(out, 0, sizeof *out);
    out->name = vp_model_name(cm->m);
    out->seq = cm->seq;
    out->layers = cm->L;
    out->hidden = cm->hidden;
    out->heads = cm->heads;
    out->kv_heads = cm->kv_heads;
    out->head_dim = cm->head_dim;
    out->ffn = cm->ffn;
    out->vocab = cm->vocab;
    out->experts = cm->experts;
    out->top_k = cm->top_k;
    out->params = cm->params;
    out->layer_params = cm->layer_params;
    out->embed_params = cm->embed_params;
    out->head_params = cm->head_params;
    out->tp_unit = cm->t2;
    out->flops_per_token = cm->flops_per_sample / (double)cm->seq;
    const vp_tf *t = &cm->m->tf;
    out->max_positions = t->rotary ? cm->seq : t->max_positions;
    out->rmsnorm = t->norm == VP_NORM_RMSNORM;
    out->gated_mlp = t->act == VP_ACT_SWIGLU || t->act == VP_ACT_GEGLU;
    out->rotary = t->rotary;
    out->bias = t->bias;
    out->tied = t->tied;
    out->attn_dropout = t->p_attn;
    out->hidden_dropout = t->p_resid;
}

/* ------------------------------------------------------------------ */
/* Checks                                                              */
/* ------------------------------------------------------------------ */

static const vp_engine shard_engine[VP_SHARD__COUNT] = {
    [VP_SHARD_DDP] = VP_ENGINE_TORCH,
    [VP_SHARD_MEGATRON] = VP_ENGINE_MEGATRON,
    [VP_SHARD_DISTOPT] = VP_ENGINE_MEGATRON,
    [VP_SHARD_ZERO1] = VP_ENGINE_DEEPSPEED,
    [VP_SHARD_ZERO2] = VP_ENGINE_DEEPSPEED,
    [VP_SHARD_ZERO3] = VP_ENGINE_DEEPSPEED,
    [VP_SHARD_FSDP_FULL] = VP_ENGINE_TORCH,
    [VP_SHARD_FSDP_GRAD_OP] = VP_ENGINE_TORCH,
    [VP_SHARD_FSDP_HYBRID] = VP_ENGINE_TORCH,
};

vp_engine vp_sharding_engine(vp_sharding s)
{
    return (unsigned)s < VP_SHARD__COUNT ? shard_engine[s]
                                         : VP_ENGINE_MEGATRON;
}

double vp__dtype_rate(const vp_hw *hw, vp_dtype d, bool linear)
{
    switch (d) {
    case VP_DT_BF16:
        return hw->bf16;
    case VP_DT_FP16:
        return hw->fp16;
    case VP_DT_FP8:
        return linear ? hw->fp8 : hw->bf16;
    case VP_DT_FP32:
        return hw->fp32;
    default:
        return 0;
    }
}

bool vp__offload_allowed(vp_sharding s, vp_offload o)
{
    switch (o) {
    case VP_OFFLOAD_NONE:
        return true;
    case VP_OFFLOAD_OPTIMIZER:
        return s == VP_SHARD_DISTOPT || s == VP_SHARD_ZERO1 ||
               s == VP_SHARD_ZERO2 || s == VP_SHARD_ZERO3;
    case VP_OFFLOAD_ALL:
        return s == VP_SHARD_ZERO3 || s == VP_SHARD_FSDP_FULL;
    default:
        return false;
    }
}

bool vp__tp_valid(const vp_cluster_model *cm, uint32_t t)
{
    if (t == 1)
        return true;
    if (cm->t2 <= 1)
        return false;
    const vp_tf *tf = &cm->m->tf;
    if (tf->heads % t || tf->ffn % t)
        return false;
    if (tf->experts && tf->expert_ffn % t)
        return false;
    if (tf->kv_heads % t && t % tf->kv_heads)
        return false;
    return true;
}

bool vp__cp_valid(const vp_cluster_model *cm, uint32_t cp)
{
    if (cp == 1)
        return true;
    if (cm->attn == VP_ATTN_EAGER || cm->attn == VP_ATTN_MATH)
        return false;
    return cm->seq % (2ull * cp) == 0;
}

vp_status vp_par_check(const vp_cluster_model *cm, const vp_cluster *c,
                       const vp_par *p, vp_error *err)
{
#define BAD(...) return vp_error_set(err, VP_EARG, __VA_ARGS__)
    vp_error_clear(err);
    if (!p->dp || !p->tp || !p->pp || !p->cp || !p->ep || !p->vpp)
        BAD("every parallel degree must be >= 1");
    if (!p->micro_batch || !p->accum)
        BAD("micro-batch and accumulation must be >= 1");
    if ((unsigned)p->dtype >= VP_DT__COUNT ||
        (unsigned)p->recompute >= VP_RC__COUNT ||
        (unsigned)p->schedule >= VP_SCHED__COUNT ||
        (unsigned)p->sharding >= VP_SHARD__COUNT ||
        (unsigned)p->offload >= VP_OFFLOAD__COUNT)
        BAD("invalid enumeration value in the configuration");
    uint64_t prod = (uint64_t)p->dp * p->tp * p->pp * p->cp;
    if (prod != c->gpus)
        BAD("dp %u x tp %u x pp %u x cp %u = %llu, not the %u GPUs", p->dp,
            p->tp, p->pp, p->cp, (unsigned long long)prod, c->gpus);
    if (c->hw.hbm <= 0)
        BAD("the GPU profile '%s' has no memory bandwidth", c->hw.name);
    if (vp__dtype_rate(&c->hw, p->dtype, true) <= 0)
        BAD("the GPU '%s' has no %s rate", c->hw.name,
            vp_dtype_name(p->dtype));
    if (!vp__tp_valid(cm, p->tp))
        BAD("tensor-parallel degree %u does not divide the %llu heads, "
            "the MLP width or the %llu KV heads",
            p->tp, (unsigned long long)cm->heads,
            (unsigned long long)cm->kv_heads);
    if (p->sp && p->tp == 1)
        BAD("sequence parallelism needs tp > 1");
    if (!vp__cp_valid(cm, p->cp))
        BAD("context parallelism %u needs a sequence divisible by %u and "
            "an attention that does not materialise the scores",
            p->cp, 2 * p->cp);
    if (p->pp > cm->L)
        BAD("pipeline degree %u exceeds the %llu layers", p->pp,
            (unsigned long long)cm->L);
    if (p->ep > 1 && (!cm->experts || cm->experts % p->ep || p->dp % p->ep))
        BAD("expert-parallel degree %u must divide the experts (%llu) and "
            "dp (%u)",
            p->ep, (unsigned long long)cm->experts, p->dp);
    if (p->pp == 1 && (p->schedule != VP_SCHED_1F1B || p->vpp != 1))
        BAD("a schedule needs pp > 1 (use 1f1b, vpp 1, when pp = 1)");
    if (p->schedule == VP_SCHED_INTERLEAVED) {
        if (p->vpp < 2)
            BAD("the interleaved schedule needs vpp >= 2");
        if (cm->L % ((uint64_t)p->pp * p->vpp))
            BAD("interleaving needs the %llu layers divisible by pp x vpp",
                (unsigned long long)cm->L);
        if (p->accum % p->pp)
            BAD("interleaving needs the micro-batches divisible by pp");
    } else if (p->vpp != 1) {
        BAD("vpp > 1 needs the interleaved schedule");
    }
    vp_engine e = shard_engine[p->sharding];
    if (p->dtype == VP_DT_FP8 && e != VP_ENGINE_MEGATRON)
        BAD("fp8 training needs Megatron (Transformer Engine)");
    if (e != VP_ENGINE_MEGATRON && p->recompute == VP_RC_SELECTIVE)
        BAD("selective recomputation needs Megatron");
    if (e == VP_ENGINE_TORCH && (p->tp > 1 || p->pp > 1 || p->cp > 1 ||
                                 p->ep > 1))
        BAD("%s runs data parallelism only (tp = pp = cp = ep = 1)",
            vp_sharding_name(p->sharding));
    if (e == VP_ENGINE_DEEPSPEED) {
        if (p->tp > 1 || p->cp > 1 || p->ep > 1)
            BAD("DeepSpeed plans here use tp = cp = ep = 1");
        if (p->pp > 1 && (p->sharding != VP_SHARD_ZERO1 ||
                          p->schedule != VP_SCHED_1F1B))
            BAD("DeepSpeed's pipeline engine runs 1F1B with ZeRO stage 1 "
                "only");
    }
    if (p->sharding == VP_SHARD_FSDP_HYBRID &&
        (p->dp <= c->gpus_per_node || p->dp % c->gpus_per_node))
        BAD("hybrid sharding needs dp a multiple of the %u GPUs per node "
            "and larger than it",
            c->gpus_per_node);
    if (!vp__offload_allowed(p->sharding, p->offload))
        BAD("%s offload is not available with %s",
            vp_offload_name(p->offload), vp_sharding_name(p->sharding));
    return VP_OK;
#undef BAD
}

/* ------------------------------------------------------------------ */
/* Evaluation                                                          */
/* ------------------------------------------------------------------ */

void vp__evctx_init(vp__evctx *x, const vp_cluster_model *cm,
                    const vp_cluster *c)
{
    memset(x, 0, sizeof *x);
    x->cm = cm;
    x->c = c;
    x->gpn = (double)c->gpus_per_node;
    x->nv_bw = c->hw.nvlink * c->nvlink_eff;
    x->net_bw = c->hw.network * c->net_eff;
    if (x->nv_bw <= 0)
        x->nv_bw = x->net_bw > 0 ? x->net_bw : 1e9;
    if (x->net_bw <= 0)
        x->net_bw = x->nv_bw;
    double bw = c->hw.hbm * (c->hw.mem_eff > 0 ? c->hw.mem_eff : 1.0);
    x->inv_mem = bw > 0 ? 1.0 / bw : 0;
    x->launch = c->hw.launch;
    x->fh = c->hw.f_half;
    double em = c->hw.eff_max > 0 ? c->hw.eff_max : 1.0;
    for (int d = 0; d < VP_DT__COUNT; d++) {
        double rl = vp__dtype_rate(&c->hw, (vp_dtype)d, true);
        double ra = vp__dtype_rate(&c->hw, (vp_dtype)d, false);
        x->k_lin[d] = rl > 0 ? 1.0 / (rl * em) : 0;
        x->k_attn[d] = ra > 0 ? 1.0 / (ra * em) : 0;
        x->peak[d] = rl;
    }
    x->host_bw = c->hw.host > 0 ? c->hw.host : 25e9;
}

/* Bandwidth (B/s per rank) and latency of a group of n ranks whose
 * members are `stride` ranks apart. */
static inline void group_link(const vp__evctx *x, double n, double stride,
                              double *bw, double *lat)
{
    if (n * stride <= x->gpn) {
        *bw = x->nv_bw;
        *lat = x->c->nvlink_latency;
        return;
    }
    double k = stride >= x->gpn ? 1.0 : x->gpn / stride;
    if (k > n)
        k = n;
    double net = x->net_bw * k;
    *bw = net < x->nv_bw ? net : x->nv_bw;
    *lat = x->c->net_latency;
}

static inline double lg2(double n) { return n > 1 ? log2(n) : 0; }

/* Collective times; S = bytes of the whole (unsharded) buffer. */
static inline double t_allreduce(const vp__evctx *x, double S, double n,
                                 double stride)
{
    if (n <= 1 || S <= 0)
        return 0;
    double bw, lat;
    group_link(x, n, stride, &bw, &lat);
    return 2.0 * (n - 1) / n * S / bw + 2.0 * lat * lg2(n);
}

static inline double t_gather(const vp__evctx *x, double S, double n,
                              double stride) /* all-gather, reduce-scatter */
{
    if (n <= 1 || S <= 0)
        return 0;
    double bw, lat;
    group_link(x, n, stride, &bw, &lat);
    return (n - 1) / n * S / bw + lat * lg2(n);
}

static inline double t_alltoall(const vp__evctx *x, double S, double n,
                                double stride)
{
    if (n <= 1 || S <= 0)
        return 0;
    double bw, lat;
    group_link(x, n, stride, &bw, &lat);
    return (n - 1) / n * S / bw + lat * (n - 1);
}

static inline double t_p2p(const vp__evctx *x, double S, double stride)
{
    double bw, lat;
    group_link(x, 2, stride, &bw, &lat);
    return S / bw + lat;
}

static inline double pos(double v) { return v > 0 ? v : 0; }

static inline double fitv(const vp__fit *f, double b, double t, bool sp)
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
    if (s == VP_SCHED_INTERLEAVED && v > 1) {
        /* Megatron: (p - k - 1) * 2 + (v - 1) * p warm-up chunks + 1 */
        double w = (double)(p - stage - 1) * 2.0 + (double)(v - 1) * p + 1;
        double all = md * v;
        return (w < all ? w : all) / (double)v;
    }
    double f = (double)(p - stage);
    return f < md ? f : md;
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
static inline bool grads_progressive(const vp_par *p)
{
    return p->sharding == VP_SHARD_DDP && !p->bucket_view && p->accum == 1;
}

/* The share of the simulated gradients (those the backward has made by
 * its peak, VP__Q_*_GRAD) that is memory beyond the resident states: 0
 * for DDP's bucket views and for accumulated gradients (copied into the
 * buckets or added in place), 1 otherwise (DDP's progressive .grad,
 * FSDP's unsharded gradients, the other engines as before). */
static inline double sim_grad_share(const vp_par *p)
{
    if (p->sharding == VP_SHARD_DDP && !grads_progressive(p))
        return 0.0;
    return 1.0;
}

static void stage_states(const vp__evctx *x, const vp_par *p, double pd,
                         double pe, double pu, double pr, stbytes *o)
{
    double D = (double)p->dp * p->cp;
    double De = D / p->ep;
    double P = pd + pe;
    vp_engine e = shard_engine[p->sharding];
    bool f32 = p->dtype == VP_DT_FP32;
    double w, g, opt;
    if (f32) {
        w = 4, g = 4, opt = 8;
    } else if (e == VP_ENGINE_MEGATRON) {
        w = p->dtype == VP_DT_FP8 ? 4 : 2; /* + fp8 weight and transpose */
        g = 4, opt = 12;
    } else if (e == VP_ENGINE_DEEPSPEED) {
        w = 2, g = 2, opt = 12;
    } else {
        w = 4, g = 4, opt = 8; /* fp32 parameters, autocast / FSDP MP */
    }
    double ab = f32 ? 4 : 2; /* gathered / autocast copies */
    double Ps;               /* sharded parameter count per rank */
    if (p->sharding == VP_SHARD_FSDP_HYBRID) {
        double Dh = x->gpn < D ? x->gpn : D;
        Ps = pd / Dh + pe / Dh;
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
        o->w = w * P, o->g = g * P, o->o = opt * P;
        /* buckets (1x grads, from construction) unless the grads are
         * views of them; autocast's bf16 weight copies, saved for the
         * backward, until their layer's backward */
        o->bopt = p->bucket_view ? 0 : g * P;
        o->buf = o->bopt + (f32 ? 0 : 2.0 * P);
        o->gfb = grads_progressive(p) ? 0 : o->g;
        /* foreach AdamW: _foreach_sqrt(exp_avg_sq), one fp32 copy */
        o->temp = 4.0 * P;
        o->popt = P;
        break;
    case VP_SHARD_MEGATRON:
        /* fused Adam in place; main grads are the fp32 grad buffer */
        o->w = w * P, o->g = g * P, o->o = opt * P;
        o->popt = P;
        break;
    case VP_SHARD_DISTOPT:
        o->w = w * P, o->g = g * P, o->o = opt * Ps;
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
    case VP_SHARD_ZERO3:
        o->w = w * Ps, o->g = g * Ps, o->o = opt * Ps;
        o->buf = (2.0 * w + g) * pu; /* two gathered units + their grads */
        o->temp = ds_flat * (Ps < DS_SUB_GROUP ? Ps : DS_SUB_GROUP);
        o->popt = Ps;
        break;
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
    default:
        break;
    }
    if (p->sharding != VP_SHARD_DDP)
        o->gfb = o->g;
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

/* Parameters on the first and last stage. */
typedef struct {
    double pd0, pd1; /* dense parameters of the first and last stage  */
    double pe;       /* expert parameters of a stage (local experts)  */
    double pu;       /* the largest unit gathered at once (a layer)   */
    double pr;       /* FSDP's root unit: embedding and head          */
} stparams;

static void stage_params(const vp__evctx *x, const vp_par *p, stparams *o)
{
    const vp_cluster_model *cm = x->cm;
    double t = p->tp, ep = p->ep;
    double l = ceil((double)cm->L / p->pp);
    bool first_last = p->pp == 1;
    double Pl = cm->p_layer.r + cm->p_layer.s / t;
    double Pe = (cm->p_exp.r + cm->p_exp.s / t) / ep;
    double Pemb = cm->p_emb_other.r + cm->p_emb_other.s / t +
                  cm->p_word.r + cm->p_word.s / t;
    double Phead = cm->p_head_word.r + cm->p_head_word.s / t +
                   cm->p_head_other.r + cm->p_head_other.s / t;
    if (cm->tied && !first_last)
        Phead += cm->p_word.r + cm->p_word.s / t; /* copy on the last */
    o->pd0 = l * Pl + Pemb + (first_last ? Phead : 0);
    o->pd1 = l * Pl + Phead + (first_last ? Pemb : 0);
    o->pe = l * Pe;
    o->pu = Pl + Pe;
    o->pr = Pemb + Phead;
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
        ncoll += p->sharding == VP_SHARD_FSDP_HYBRID ? 2 : 1;
    if (ep > 1 && d * cp / ep > 1)
        ncoll++;
    return ncoll * (double)c->nccl_comm_bytes +
           (pp > 1 ? 0.5 * (double)c->nccl_comm_bytes : 0) +
           (ep > 1 ? (ep - 1) * (double)c->nccl_peer_bytes : 0);
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
    double b = (double)p->micro_batch, t = (double)p->tp;
    bool sp = p->sp;
    double layer = fitv(&a->q[VP__Q_LAYER], b, t, sp);
    double att = fitv(&a->q[VP__Q_ATTN_INT], b, t, sp);
    double extra = fitv(&a->q[VP__Q_EXTRA], b, t, sp);
    double in = b * (double)(x->cm->seq / p->cp) * (double)x->cm->hidden *
                a->resid_bytes / (sp ? t : 1.0);
    if (in > layer)
        in = layer;
    switch (p->recompute) {
    case VP_RC_SELECTIVE:
        o->saved = layer - att > in ? layer - att : in;
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
    o->emb = fitv(&a->q[VP__Q_EMB], b, t, sp);
    o->head_saved = fitv(&a->q[VP__Q_HEAD_SAVED], b, t, sp);
    o->head_peak = fitv(&a->q[VP__Q_HEAD_PEAK], b, t, sp);
    o->gh = fitv(&a->q[VP__Q_HEAD_GRAD], b, t, sp);
    o->gx = fitv(&a->q[VP__Q_LAYER_GRAD], b, t, sp);
}

static uint64_t to_u64(double v)
{
    if (!(v > 0))
        return 0;
    if (v >= 1.8e19)
        return UINT64_MAX;
    return (uint64_t)llround(v);
}

void vp__evaluate(const vp__evctx *x, const vp__act *a, const vp_par *p,
                  vp_cluster_mem *mem, vp_cluster_time *tm)
{
    const vp_cluster_model *cm = x->cm;
    const vp_cluster *c = x->c;
    double t = p->tp, pp = p->pp, d = p->dp, cp = p->cp, ep = p->ep;
    double v = p->vpp, b = (double)p->micro_batch, m = (double)p->accum;
    bool sp = p->sp;
    double L = (double)cm->L;
    double l = ceil(L / pp);
    double h = (double)cm->hidden;
    double sl = (double)(cm->seq / p->cp);
    bool first_last = p->pp == 1;
    vp_engine eng = shard_engine[p->sharding];
    double ab = p->dtype == VP_DT_FP32 ? 4.0 : 2.0;

    stparams P;
    stage_params(x, p, &P);
    double pd0 = P.pd0, pd1 = P.pd1, pe_st = P.pe, pu = P.pu, pr = P.pr;
    stbytes s0, s1;
    stage_states(x, p, pd0, pe_st, pu, pr, &s0);
    if (first_last)
        s1 = s0;
    else
        stage_states(x, p, pd1, pe_st, pu, pr, &s1);

    /* ---- activations ---- */
    actterms at;
    act_terms(x, a, p, &at);
    double f0 = vp_pipeline_in_flight(p->schedule, p->pp, p->accum, p->vpp,
                                      0);
    double f1 = vp_pipeline_in_flight(p->schedule, p->pp, p->accum, p->vpp,
                                      p->pp - 1);
    double kvl = (double)cm->kv_heads / t;
    if (kvl < 1)
        kvl = 1;
    double kv_bytes = b * sl * 2.0 * kvl * (double)cm->head_dim * ab;
    double extra_bufs = (cp > 1 ? 2.0 * kv_bytes : 0) +
                        (pp > 1 ? 2.0 * b * sl * h * ab / t : 0);
    double act0, act1, tr0, tr1;
    /* the gradients the backward has made by its peak, where they are
     * not resident states */
    double gs = sim_grad_share(p);
    at.trans += gs * at.gx;
    double hp = at.head_peak + gs * at.gh;
    if (hp < at.head_saved)
        hp = at.head_saved;
    double head_tr = hp - at.head_saved;
    if (first_last) {
        act0 = act1 = l * at.saved + at.emb + at.head_saved;
        tr0 = tr1 = (at.trans > head_tr ? at.trans : head_tr) + extra_bufs;
    } else {
        act0 = f0 * (l * at.saved + at.emb);
        act1 = f1 * (l * at.saved + at.head_saved);
        tr0 = at.trans + extra_bufs;
        tr1 = (at.trans > head_tr ? at.trans : head_tr) + extra_bufs;
    }
    /* the forward/backward peak and the optimizer step's of each stage */
    double fb0 = s0.w + s0.gfb + s0.o + s0.buf + act0 + tr0;
    double fb1 = s1.w + s1.gfb + s1.o + s1.buf + act1 + tr1;
    double op0 = s0.w + s0.g + s0.o + s0.bopt + s0.temp;
    double op1 = s1.w + s1.g + s1.o + s1.bopt + s1.temp;
    double alloc0 = fb0 > op0 ? fb0 : op0;
    double alloc1 = fb1 > op1 ? fb1 : op1;

    double nccl = nccl_bytes(x, p);

    if (mem) {
        bool last = alloc1 > alloc0;
        const stbytes *s = last ? &s1 : &s0;
        double alloc = last ? alloc1 : alloc0;
        bool step = (last ? op1 > fb1 : op0 > fb0);
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
            mem->activations = to_u64(last ? act1 : act0);
            mem->transient = to_u64(last ? tr1 : tr0);
        }
        mem->overhead = to_u64(alloc * c->alloc_overhead);
        mem->nccl = to_u64(nccl);
        mem->context = c->context;
        mem->total = mem->weights + mem->grads + mem->optimizer +
                     mem->buffers + mem->activations + mem->transient +
                     mem->overhead + mem->nccl + mem->context;
        double hpr = s0.host > s1.host ? s0.host : s1.host;
        double ranks = c->gpus < c->gpus_per_node ? c->gpus
                                                  : c->gpus_per_node;
        mem->host = to_u64(1.5 * hpr * ranks); /* DeepSpeed buffer factor */
        mem->stage = last ? p->pp - 1 : 0;
        mem->in_flight = last ? f1 : f0;
    }
    if (!tm)
        return;

    /* ---- time of one micro-batch per layer ---- */
    int dt = p->dtype;
    double kl = x->k_lin[dt], ka = x->k_attn[dt], fh = x->fh;
    double bcp = b / cp;
    double flin_f = bcp * (cm->flin_f.r + cm->flin_f.s / t);
    double flin_b = bcp * (cm->flin_b.r + cm->flin_b.s / t);
    double fexp_f = bcp * (cm->fexp_f.r + cm->fexp_f.s / t);
    double fexp_b = bcp * (cm->fexp_b.r + cm->fexp_b.s / t);
    double fatt_f = bcp * (cm->fattn_f.r + cm->fattn_f.s / t);
    double fatt_b = bcp * (cm->fattn_b.r + cm->fattn_b.s / t);
    double nexp = cm->n_exp / ep;
    double mm_f = (flin_f + cm->n_lin * fh) * kl + (fexp_f + nexp * fh) * kl;
    double mm_b = (flin_b + 2 * cm->n_lin * fh) * kl +
                  (fexp_b + 2 * nexp * fh) * kl;
    /* ring attention runs one attention kernel per chunk it meets */
    double att_fm = (fatt_f + cm->n_attn * cp * fh) * ka;
    double att_bm = (fatt_b + cm->n_attn * cp * fh) * ka;
    double att_f_mem = 2.0 * fitv(&a->q[VP__Q_ATTN_MEM_F], b, t, sp) *
                       x->inv_mem;
    double att_b_mem = 2.0 * fitv(&a->q[VP__Q_ATTN_MEM_B], b, t, sp) *
                       x->inv_mem;
    double att_f = att_fm > att_f_mem ? att_fm : att_f_mem;
    double att_b = att_bm > att_b_mem ? att_bm : att_b_mem;
    double nk = cm->n_lin + cm->n_attn + nexp;
    double mem_f = 2.0 * fitv(&a->q[VP__Q_MEM_F], b, t, sp) * x->inv_mem +
                   (fitv(&a->q[VP__Q_KER_F], b, t, sp) + nk) * x->launch;
    double mem_b = 2.0 * fitv(&a->q[VP__Q_MEM_B], b, t, sp) * x->inv_mem +
                   (fitv(&a->q[VP__Q_KER_B], b, t, sp) + 2 * nk) * x->launch;
    /* tensor parallel: 2 all-reduces (or all-gather + reduce-scatter
     * pairs with sp) in forward, 2 in backward */
    double xtp = b * sl * h * ab;
    double tp1 = t > 1 ? 2.0 * t_allreduce(x, xtp, t, 1) : 0;
    /* with sp, backward gathers the inputs of the column-parallel
     * linears again (only their shards are saved) */
    double tp_redo = t > 1 && sp ? 2.0 * t_gather(x, xtp, t, 1) : 0;
    /* experts: dispatch and combine all-to-alls */
    double ep1 = 0;
    if (cm->experts && ep > 1)
        ep1 = 2.0 * t_alltoall(x, b * sl * (double)cm->top_k * h * ab /
                                      (sp ? t : 1.0),
                               ep, t * cp);
    /* context parallel: ring of K, V chunks, hidden behind attention */
    double cpr_f = 0, cpr_b = 0;
    if (cp > 1) {
        double ring = (cp - 1) * t_p2p(x, kv_bytes, t);
        cpr_f = pos(ring - att_f);
        cpr_b = pos(2.0 * ring - att_b);
    }
    double lay_f = mm_f + att_f + mem_f;
    double lay_b = mm_b + att_b + mem_b;
    double rec = 0, rec_comm = 0;
    if (p->recompute == VP_RC_FULL) {
        rec = lay_f;
        rec_comm = tp1 + ep1 + cpr_f;
    } else if (p->recompute == VP_RC_SELECTIVE) {
        rec = att_f;
    }
    /* embedding and head */
    double emb_t = 2.0 * fitv(&a->q[VP__Q_EMB_MEM], b, t, sp) * x->inv_mem +
                   fitv(&a->q[VP__Q_EMB_KER], b, t, sp) * x->launch;
    double emb_comm = t > 1 ? t_allreduce(x, xtp, t, 1) : 0;
    double fh_f = bcp * (cm->fhead_f.r + cm->fhead_f.s / t);
    double fh_b = bcp * (cm->fhead_b.r + cm->fhead_b.s / t);
    double head_t = (fh_f + cm->n_head * fh) * kl +
                    (fh_b + 2 * cm->n_head * fh) * kl +
                    2.0 * fitv(&a->q[VP__Q_HEAD_MEM], b, t, sp) * x->inv_mem +
                    fitv(&a->q[VP__Q_HEAD_KER], b, t, sp) * x->launch;
    /* per micro-batch on the first and last stage */
    double comp_l = l * (lay_f + lay_b);
    double comm_l = l * (2 * tp1 + tp_redo + 2 * ep1 + cpr_f + cpr_b);
    double rec_l = l * rec, recc_l = l * rec_comm;
    double st0 = comp_l + rec_l + comm_l + recc_l + emb_t + emb_comm +
                 (first_last ? head_t : 0);
    double st1 = comp_l + rec_l + comm_l + recc_l + head_t +
                 (first_last ? emb_t + emb_comm : 0);
    double p2p = pp > 1 ? t_p2p(x, b * sl * h * ab / t, t * cp * d) : 0;
    double tmb = (st0 > st1 ? st0 : st1) + 2.0 * v * p2p;
    double pipe;
    if (pp <= 1)
        pipe = m * tmb;
    else if (p->schedule == VP_SCHED_INTERLEAVED)
        pipe = (m + (pp - 1) / v) * tmb;
    else
        pipe = (m + pp - 1) * tmb;
    /* forward and backward of one micro-batch, the overlap windows */
    double Tf = l * (lay_f + tp1 + ep1 + cpr_f);
    double Tb = l * (lay_b + tp1 + tp_redo + ep1 + cpr_b + rec + rec_comm);

    /* ---- data parallel and sharding ---- */
    double D = d * cp, De = D / ep;
    double Pd = pd0 > pd1 ? pd0 : pd1, Pex = pe_st;
    double gb, pb = ab;
    if (p->dtype == VP_DT_FP32 || eng == VP_ENGINE_MEGATRON ||
        p->sharding == VP_SHARD_DDP)
        gb = 4;
    else
        gb = 2;
    double sd = t, se = t * cp * ep; /* strides of the DP groups */
    double dpx = 0, ar, rs, ag;
    switch (p->sharding) {
    case VP_SHARD_DDP:
    case VP_SHARD_MEGATRON:
        ar = t_allreduce(x, gb * Pd, D, sd) + t_allreduce(x, gb * Pex, De, se);
        dpx = pos(ar - Tb);
        break;
    case VP_SHARD_DISTOPT:
        rs = t_gather(x, gb * Pd, D, sd) + t_gather(x, gb * Pex, De, se);
        ag = t_gather(x, pb * Pd, D, sd) + t_gather(x, pb * Pex, De, se);
        dpx = pos(rs - Tb) + pos(ag - Tf);
        break;
    case VP_SHARD_ZERO1:
        rs = t_gather(x, gb * Pd, D, sd);
        ag = t_gather(x, pb * Pd, D, sd);
        dpx = rs + ag;
        break;
    case VP_SHARD_ZERO2:
        rs = t_gather(x, gb * Pd, D, sd);
        ag = t_gather(x, pb * Pd, D, sd);
        dpx = m * pos(rs - Tb) + ag;
        break;
    case VP_SHARD_ZERO3:
    case VP_SHARD_FSDP_FULL:
        ag = t_gather(x, pb * Pd, D, sd);
        rs = t_gather(x, gb * Pd, D, sd);
        dpx = m * (pos(ag - Tf) + pos(ag + rs - Tb));
        break;
    case VP_SHARD_FSDP_GRAD_OP:
        ag = t_gather(x, pb * Pd, D, sd);
        rs = t_gather(x, gb * Pd, D, sd);
        dpx = m * (pos(ag - Tf) + pos(rs - Tb));
        break;
    case VP_SHARD_FSDP_HYBRID: {
        double Dh = x->gpn < D ? x->gpn : D;
        ag = t_gather(x, pb * Pd, Dh, 1);
        rs = t_gather(x, gb * Pd, Dh, 1);
        ar = t_allreduce(x, gb * Pd / Dh, D / Dh, Dh);
        dpx = m * (pos(ag - Tf) + pos(ag + rs + ar - Tb));
        break;
    }
    default:
        break;
    }

    /* tied embeddings on more than one stage: the first and last stage
     * all-reduce the word embedding's gradient */
    if (cm->tied && pp > 1)
        dpx += t_allreduce(x, gb * (cm->p_word.r + cm->p_word.s / t), 2,
                           t * cp * d * (pp - 1));

    /* ---- optimizer and offload ---- */
    const stbytes *sw = pd1 > pd0 ? &s1 : &s0;
    double popt = sw->popt;
    double opt = 0, off = 0;
    double obytes = p->dtype == VP_DT_FP32 ? 28.0 : 30.0;
    if (p->offload == VP_OFFLOAD_NONE) {
        opt = popt * obytes * x->inv_mem;
    } else {
        double ranks = c->gpus < c->gpus_per_node ? c->gpus
                                                  : c->gpus_per_node;
        opt = popt * obytes / (c->host_mem_bw / ranks);
        double down = 4.0 * popt / x->host_bw; /* fp32 grads to host  */
        double up = pb * popt / x->host_bw;    /* new weights back    */
        off = pos(down - Tb) + up;
        if (p->offload == VP_OFFLOAD_ALL) {
            /* the shard crosses the host link at each gather */
            double fetch = (eng == VP_ENGINE_TORCH ? 4.0 : pb) * popt /
                           x->host_bw;
            off += m * (pos(fetch - Tf) + pos(fetch - Tb));
        }
    }

    double step = pipe + dpx + opt + off;
    double gbatch = d * b * m;
    memset(tm, 0, sizeof *tm);
    double comp_mb = (st0 > st1 ? st0 : st1) - rec_l - comm_l - recc_l;
    tm->compute = m * comp_mb;
    tm->recompute = m * rec_l;
    tm->tp_comm = m * l * ((2 + (p->recompute == VP_RC_FULL)) * tp1 +
                           tp_redo) +
                  m * emb_comm;
    tm->ep_comm = m * l * (2 + (p->recompute == VP_RC_FULL)) * ep1;
    tm->cp_comm = m * l * (cpr_f + cpr_b +
                           (p->recompute == VP_RC_FULL ? cpr_f : 0));
    tm->pp_comm = m * 2.0 * v * p2p;
    tm->bubble = pipe - m * tmb;
    tm->dp_comm = dpx;
    tm->optimizer = opt;
    tm->offload = off;
    tm->step = step;
    tm->samples_per_s = gbatch / step;
    tm->tokens_per_s = gbatch * (double)cm->seq / step;
    tm->model_flops = gbatch * cm->flops_per_sample;
    double peak = x->peak[dt] * (double)c->gpus;
    double recf = p->recompute == VP_RC_FULL ? cm->rec_full_per_sample
                  : p->recompute == VP_RC_SELECTIVE ? cm->rec_sel_per_sample
                                                    : 0;
    tm->mfu = tm->model_flops / (step * peak);
    tm->hfu = (tm->model_flops + gbatch * recf) / (step * peak);
}

double vp__states_bound(const vp__evctx *x, const vp_par *p, double *host)
{
    stparams P;
    stbytes s0, s1;
    stage_params(x, p, &P);
    stage_states(x, p, P.pd0, P.pe, P.pu, P.pr, &s0);
    stage_states(x, p, P.pd1, P.pe, P.pu, P.pr, &s1);
    /* at the forward/backward peak at least the resident states and
     * buffers: DDP's .grad beside the buckets may be all still to come
     * (one micro-batch; the layout's accumulation is not chosen yet);
     * the optimizer step's peak is whole */
    bool prog = p->sharding == VP_SHARD_DDP && !p->bucket_view;
    double g0 = prog ? 0 : s0.gfb;
    double g1 = prog ? 0 : s1.gfb;
    double f0 = s0.w + g0 + s0.o + s0.buf;
    double f1 = s1.w + g1 + s1.o + s1.buf;
    double o0 = s0.w + s0.g + s0.o + s0.bopt + s0.temp;
    double o1 = s1.w + s1.g + s1.o + s1.bopt + s1.temp;
    double a0 = f0 > o0 ? f0 : o0;
    double a1 = f1 > o1 ? f1 : o1;
    double a = a0 > a1 ? a0 : a1;
    double ranks = x->c->gpus < x->c->gpus_per_node ? x->c->gpus
                                                    : x->c->gpus_per_node;
    double hpr = s0.host > s1.host ? s0.host : s1.host;
    *host = 1.5 * hpr * ranks;
    return a * (1.0 + x->c->alloc_overhead) + nccl_bytes(x, p) +
           (double)x->c->context;
}

int vp__cls_of(const vp_par *p)
{
    if (p->dtype == VP_DT_FP32)
        return VP__CLS_FP32;
    return p->sharding == VP_SHARD_DDP ? VP__CLS_AMP : VP__CLS_HALF;
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
