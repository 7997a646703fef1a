/* Plans for clusters: the per-model precomputation (graph + simulator)
 * and the analytic evaluation of one configuration. The search is in
 * cluster_search.c, the closed forms and names in cluster_forms.c; what
 * they share is in cluster_impl.h. Formulas: docs/CLUSTER.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "graph_tf.h"

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
    /* The defaults below are the model's (docs/CLUSTER.md, its table of
     * cluster settings; docs/CONSTANTS.md lists each one's source). Their
     * effects are pinned by tests: nvlink_eff by tests/test_rules_dist.c
     * (nvlink_collectives_at_80_percent), the others by the mutations
     * cluster-* of scripts/mutants.tsv (scripts/mutants.report.md names
     * the test that sees each). */
    c->host_mem = (uint64_t)128 * VP_GiB * c->gpus_per_node;
    c->host_mem_bw = 200e9;
    c->nvlink_eff = 0.8;
    c->net_eff = 0.85;
    c->nccl_comm_bytes = (uint64_t)320 * VP_MiB;
    c->nccl_peer_bytes = (uint64_t)48 * VP_MiB;
    c->alloc_overhead = 0.05;
    c->moe_imbalance = 0; /* the measured load */
    c->moe_capacity = 0;
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

double vp_moe_measured_load(uint32_t ep)
{
    if (ep <= 1)
        return 1.0;
    return ep <= 2 ? 1.39 : ep <= 4 ? 1.93 : 2.29;
}

double vp_moe_load(const vp_cluster *c, uint64_t experts, uint64_t top_k,
                   uint32_t ep, double *worst)
{
    double w = 1;
    if (experts && top_k && ep > 1) {
        double local = (double)experts / ep, k = (double)top_k;
        w = ep * (k < local ? k : local) / k;
    }
    if (worst)
        *worst = w;
    double f = c->moe_capacity > 0   ? c->moe_capacity
               : c->moe_imbalance > 0 ? c->moe_imbalance
                                      : vp_moe_measured_load(ep);
    f = f < 1 ? 1 : f;
    return f < w ? f : w;
}

static bool is_expert_op(const vp_op *o)
{
    return o->kind == VP_OP_MOE_EXPERTS ||
           (o->name && strstr(o->name, ".experts.") != NULL);
}

/* Whether op o belongs to an expert other than the first: a grouped MoE
 * (Megatron's TEGroupedMLP, GroupedGEMM) runs one kernel for all of a
 * rank's experts, so only the first expert's ops count kernels. */
static bool later_expert(const vp_op *o)
{
    const char *e = o->name ? strstr(o->name, ".experts.") : NULL;
    return e && strtoul(e + 9, NULL, 10) > 0;
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
        if (r == REG_L1 && o->kind == VP_OP_MOE_EXPERTS) {
            s->fexp_f += o->flops_fwd; /* two grouped GEMMs */
            s->fexp_b += o->flops_bwd;
            s->n_exp += 2;
        } else if (r == REG_L1 && o->kind == VP_OP_LINEAR) {
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
/* Graph scan: matmul shapes, fused traffic, the attention core          */
/* ------------------------------------------------------------------ */

typedef struct {
    vp__gemm gemm[VP__GEMMS], hgemm[4];
    size_t n_gemm, n_hgemm;
    double fz[3][3]; /* [emb, layer, head][elems, bytes, kernels] */
    double lin_in;   /* elements of the (distinct) inputs of a layer's
                        linears: what fp8 training saves in one byte    */
    double gated;    /* outputs of the activations of gated MLPs, which
                        the fused SwiGLU does not keep                  */
    double mm_out;   /* outputs of a layer's linears and attention core:
                        what op-level selective checkpointing saves     */
    double keep[3];  /* what a fused engine saves for the backward, besides
                        the linears' inputs: activation elements, one-byte
                        mask elements; of the first, the routed experts'
                        (their rows grow with the routing's imbalance)  */
} shapes;

static void add_gemm(vp__gemm *arr, size_t *n, size_t cap, vp__gemm g)
{
    for (size_t i = 0; i < *n; i++)
        if (arr[i].rows == g.rows && arr[i].n == g.n && arr[i].k == g.k &&
            arr[i].split == g.split && arr[i].expert == g.expert) {
            arr[i].count += g.count;
            return;
        }
    if (*n < cap)
        arr[(*n)++] = g;
    else /* more distinct shapes than kept: fold into the last */
        arr[cap - 1].count += g.count * (g.rows * g.n * g.k) /
                              (arr[cap - 1].rows * arr[cap - 1].n *
                               arr[cap - 1].k);
}

/* Whether the first later op that reads op i's output is of kind k (a
 * gated MLP in Hugging Face's order, act(gate_proj(x)) * up_proj(x),
 * runs up_proj between the activation and the product); the search
 * stops at that reader. */
static bool read_first_by(const vp_graph *g, size_t i, vp_op_kind k)
{
    for (size_t j = i + 1; j < g->n_ops; j++) {
        const vp_op *o = &g->ops[j];
        for (uint32_t q = 0; q < o->n_inputs; q++)
            if (o->inputs[q] == i)
                return o->kind == k;
    }
    return false;
}

static bool feeds(const vp_graph *g, size_t i, vp_op_kind k)
{
    if (i + 1 >= g->n_ops || g->ops[i + 1].kind != k)
        return false;
    const vp_op *nx = &g->ops[i + 1];
    for (uint32_t j = 0; j < nx->n_inputs; j++)
        if (nx->inputs[j] == i)
            return true;
    return i + 1 < g->n_ops && nx->n_inputs == 0;
}

/* Elements of the grouped experts' token rows (tokens x top_k x
 * hidden) and of their inner rows (x expert_ffn). */
static double expert_rows(const vp_op *o, bool inner)
{
    double r = (double)o->numel * (double)o->top_k;
    return inner ? r * (double)o->out_features / (double)o->in_features : r;
}

/* Traffic of op i under the fusions of Megatron-LM and Transformer Engine
 * (fused_bias_dropout_add, bias_gelu / bias_swiglu, fused layer norm,
 * fused rotary; docs/STEP_TIME.md): elements read + written, fixed
 * bytes, kernels. */
static void fused_op(const vp_graph *g, size_t i, double f[3])
{
    const vp_op *o = &g->ops[i];
    double n = (double)o->numel;
    switch (o->kind) {
    case VP_OP_LAYERNORM:
    case VP_OP_RMSNORM:
    case VP_OP_GROUPNORM:
    case VP_OP_ROPE:
    case VP_OP_SOFTMAX:
    case VP_OP_CONCAT:
    case VP_OP_ROUTER:
    case VP_OP_EMBEDDING:
        f[0] += 2 * n, f[2] += 1;
        break;
    case VP_OP_MOE_EXPERTS:
        /* the tokens' gather and scatter-add (the experts' rows, not the
         * token tensor) and the fused SwiGLU over the inner rows */
        f[0] += 4 * expert_rows(o, false) + 3 * expert_rows(o, true);
        f[2] += 3;
        break;
    case VP_OP_GELU:
    case VP_OP_GELU_TANH:
    case VP_OP_RELU:
    case VP_OP_SILU:
    case VP_OP_TANH:
    case VP_OP_SIGMOID:
        if (!feeds(g, i, VP_OP_MUL)) /* else fused into the gated mul */
            f[0] += 2 * n, f[2] += 1;
        break;
    case VP_OP_MUL:
        f[0] += 3 * n, f[2] += 1;
        break;
    case VP_OP_DROPOUT:
        if (feeds(g, i, VP_OP_ADD)) { /* bias-dropout-add: one kernel */
            f[1] += n;
        } else {
            f[0] += 2 * n, f[1] += n, f[2] += 1;
        }
        break;
    case VP_OP_ADD:
        f[0] += 3 * n, f[2] += 1;
        break;
    case VP_OP_CROSS_ENTROPY:
        /* vocab-parallel cross entropy: the logits read once and their
         * fp32 exponentials written and read */
        n = (double)o->rows * (double)o->classes;
        f[0] += n, f[1] += 8 * n, f[2] += 3;
        break;
    default:
        break;
    }
}

/* Elements op i saves for the backward in an engine with fused kernels
 * (Megatron-LM, Transformer Engine), besides the linears' inputs (lin_in):
 * a norm its input; attention its q, k, v (its output is the next
 * linear's input); a lone activation its input; a gated product the two
 * inputs of the fused SwiGLU; dropout its mask (one byte); an expert
 * combine the expert's output. The tensors of Korthikanti et al. 2022,
 * section 4.1, op by op. */
static void saved_op(const vp_graph *g, size_t i, double keep[3])
{
    const vp_op *o = &g->ops[i];
    double n = (double)o->numel;
    switch (o->kind) {
    case VP_OP_LAYERNORM:
    case VP_OP_RMSNORM:
    case VP_OP_GROUPNORM:
        if (o->n_inputs)
            keep[0] += (double)g->ops[o->inputs[0]].numel;
        break;
    case VP_OP_ATTENTION:
        for (uint32_t j = 0; j < o->n_inputs; j++)
            keep[0] += (double)g->ops[o->inputs[j]].numel;
        break;
    case VP_OP_GELU:
    case VP_OP_GELU_TANH:
    case VP_OP_RELU:
    case VP_OP_SILU:
    case VP_OP_TANH:
    case VP_OP_SIGMOID:
        /* a gated product's activation is inside the fused SwiGLU */
        if (!read_first_by(g, i, VP_OP_MUL))
            keep[0] += n;
        break;
    case VP_OP_MUL:
        keep[0] += 2 * n;
        break;
    case VP_OP_DROPOUT:
        if (o->dropout > 0)
            keep[1] += n;
        break;
    case VP_OP_MOE_EXPERTS:
        /* the experts' GEMM inputs (their rows, and the gated product),
         * the fused SwiGLU's two inputs, the output the combine scales */
        n = 2 * expert_rows(o, false) + 3 * expert_rows(o, true);
        keep[0] += n;
        keep[2] += n;
        break;
    default:
        break;
    }
}

/* The grouped experts' two GEMMs (gate_up, then down), one per expert
 * over its share of the tokens x top_k rows; with tensor parallelism
 * gate_up splits by columns and down by rows (o2: the op at t = t2). */
static void experts_gemms(const vp_op *o, const vp_op *o2, double t2,
                          shapes *sh)
{
    double e = (double)o->classes, h = (double)o->in_features;
    double f = (double)o->out_features;
    double rows = expert_rows(o, false) / h / e;
    bool split = t2 > 1 && o2->kind == VP_OP_MOE_EXPERTS &&
                 (double)o2->out_features * t2 == f;
    vp__gemm gu = {rows, 2 * f, h, e, split ? VP__SPLIT_COL : VP__SPLIT_NONE,
                   true};
    vp__gemm dn = {rows, h, f, e, split ? VP__SPLIT_ROW : VP__SPLIT_NONE,
                   true};
    add_gemm(sh->gemm, &sh->n_gemm, VP__GEMMS, gu);
    add_gemm(sh->gemm, &sh->n_gemm, VP__GEMMS, dn);
    sh->mm_out += 0.5 * (expert_rows(o, true) * 2 + expert_rows(o, false));
}

/* primary: record the attention core and the parameter tensors in cm
 * (the graph at t = 1); g2 is the graph at t = t2, for the splits. */
static void scan_shapes(const vp_graph *g1, const vp_graph *g2, double t2,
                        bool primary, vp_cluster_model *cm, shapes *sh)
{
    memset(sh, 0, sizeof *sh);
    for (size_t i = 0; i < g1->n_ops; i++) {
        const vp_op *o = &g1->ops[i];
        const vp_op *o2 = i < g2->n_ops ? &g2->ops[i] : o;
        int r = region_of(g1, (uint32_t)i);
        if (r == REG_L0)
            continue;
        int fr = r == REG_EMB ? 0 : r == REG_L1 ? 1 : 2;
        double f[3] = {0, 0, 0};
        fused_op(g1, i, f);
        if (later_expert(o))
            f[2] = 0;
        for (int q = 0; q < 3; q++)
            sh->fz[fr][q] += f[q];
        if (r == REG_L1)
            saved_op(g1, i, sh->keep);
        if (primary && r == REG_L1 && o->n_params) {
            cm->layer_modules += 1;
            cm->layer_tensors += o->n_params;
        }
        if (primary && o->kind == VP_OP_ATTENTION && r == REG_L1) {
            cm->at_heads = (double)o->heads;
            cm->at_q = (double)o->q_len;
            cm->at_kv = (double)o->kv_len;
            cm->at_dim = (double)o->head_dim;
            cm->at_causal = o->causal;
            cm->at_dropout = o->dropout;
            cm->at_eager = o->attn_impl == VP_ATTN_EAGER ||
                           o->attn_impl == VP_ATTN_MATH;
        }
        if (r == REG_L1 && o->kind == VP_OP_ATTENTION)
            sh->mm_out += 2.0 * (double)o->numel; /* output, kept whole */
        if (r == REG_L1 && o->kind == VP_OP_LINEAR)
            sh->mm_out += 0.5 * (double)o->numel; /* every other one */
        if (r == REG_L1 && feeds(g1, i, VP_OP_MUL) &&
            (o->kind == VP_OP_SILU || o->kind == VP_OP_GELU ||
             o->kind == VP_OP_GELU_TANH || o->kind == VP_OP_RELU ||
             o->kind == VP_OP_SIGMOID))
            sh->gated += (double)o->numel;
        if (r == REG_L1 && o->kind == VP_OP_MOE_EXPERTS) {
            experts_gemms(o, o2, t2, sh);
            continue;
        }
        if (o->kind != VP_OP_LINEAR || (r != REG_L1 && r != REG_HEAD) ||
            !o->out_features)
            continue;
        if (r == REG_L1 && o->n_inputs) {
            uint32_t src = o->inputs[0];
            bool seen = false;
            for (size_t j = g1->segs[1].first_op; j < i && !seen; j++)
                seen = g1->ops[j].kind == VP_OP_LINEAR &&
                       g1->ops[j].n_inputs && g1->ops[j].inputs[0] == src;
            if (!seen && src < g1->n_ops)
                sh->lin_in += (double)g1->ops[src].numel;
        }
        vp__gemm g = {(double)o->numel / (double)o->out_features,
                      (double)o->out_features, (double)o->in_features, 1.0,
                      VP__SPLIT_NONE, is_expert_op(o)};
        if (t2 > 1 && o2->kind == VP_OP_LINEAR &&
            (double)o2->out_features * t2 == g.n)
            g.split = VP__SPLIT_COL;
        else if (t2 > 1 && o2->kind == VP_OP_LINEAR &&
                 (double)o2->in_features * t2 == g.k)
            g.split = VP__SPLIT_ROW;
        if (r == REG_L1)
            add_gemm(sh->gemm, &sh->n_gemm, VP__GEMMS, g);
        else
            add_gemm(sh->hgemm, &sh->n_hgemm, 4, g);
    }
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
        bool expert; /* made by layer 1's grouped experts, counted as
                        memory traffic (account_mem)                   */
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
            if (!later_expert(o)) /* grouped experts (torchtitan) */
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
 * releases. A weight gradient of the grouped experts (`expert`: op is
 * layer 1's MOE_EXPERTS) is the grouped GEMM's output, in its time as a
 * linear's: it leaves the memory traffic account_mem gave it. */
static void note_temp(simtrack *k, const vp_sim_event *ev, bool expert)
{
    if (ev->is_free) {
        if (ev->category != VP_CAT_GRAD)
            return;
        /* the block was live from its allocation to this free: the
         * latest allocation of the handle is the gradient's */
        for (size_t i = k->n_temps; i-- > 0;)
            if (k->temps[i].handle == ev->tensor) {
                k->temps[i].grad = true;
                if (k->temps[i].expert)
                    k->q[VP__Q_MEM_B] -= k->temps[i].bytes;
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
                                            (double)ev->bytes, false, expert};
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
    int64_t op = lookup_op(k, ev->op);
    note_temp(k, ev, op >= 0 && k->g->ops[op].kind == VP_OP_MOE_EXPERTS &&
                         region_of(k->g, (uint32_t)op) == REG_L1);
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
    a->resid_bytes = cls_resid_bytes(cls);
    if (cm->whole) { /* a graph-form model, simulated whole */
        vp_status st = vp__whole_act(cm, a, err);
        if (st != VP_OK) {
            free(a);
            return st;
        }
        cm->act[cm->n_act++] = a;
        *out = a;
        return VP_OK;
    }
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
    /* a mixture of experts: the layer the model stands for is an MoE
     * layer (its dense layers are counted apart: dense_mix) */
    tf->x.dense_layers = 0;
    tf->x.moe_every = 1;
    if (t <= 1)
        return;
    tf->heads /= t;
    tf->kv_heads = tf->kv_heads >= t ? tf->kv_heads / t : 1;
    tf->ffn /= t;
    tf->expert_ffn /= t;
    tf->vocab = div_up(tf->vocab, t);
}

/* Layers of the model without experts: the first dense_layers and those
 * off the MoE period (vp__tf_layer_moe). */
static uint64_t dense_layers_of(const vp_tf *t)
{
    uint64_t n = 0;
    for (uint64_t l = 0; t->experts && l < t->layers; l++)
        n += !vp__tf_layer_moe(t, l);
    return n;
}

/* A model whose MoE layers and dense layers differ (DeepSeek-V3's first
 * three, a moe_every period): the per-layer figures are an MoE layer's
 * (each stage is planned as if all its layers were: an upper bound for
 * the stages holding dense ones); the model's totals (parameters, FLOPs,
 * full recomputation) count the dense layers as a dense layer of the
 * same model, scanned here into *dense. */
static vp_status dense_mix(const vp_cluster_model *cm, gscan *dense,
                           vp_error *err)
{
    vp_tf tf = cm->m->tf;
    tf.layers = 2;
    tf.experts = 0;
    tf.top_k = 0;
    tf.shared_experts = 0;
    tf.x.dense_layers = 0;
    tf.x.shared_ffn = 0;
    tf.x.shared_gate = false;
    vp_graph *g = vp__graph_build_tf(&tf, cm->m, 1, cm->seq, err);
    if (!g)
        return err ? err->code : VP_EARG;
    scan_graph(g, dense);
    vp_graph_free(g);
    return VP_OK;
}

/* The model's dimensions that vp_tf, vp_cluster_model and
 * vp_cluster_model_info all name alike (the layers are L in the second). */
#define CLUSTER_DIMS(X)                                                    \
    X(hidden) X(heads) X(kv_heads) X(head_dim) X(ffn) X(vocab) X(experts)   \
    X(top_k)

/* A per-layer figure x1 (unsharded) and x2 (at tensor-parallel degree t2)
 * split into its replicated part r and its part s that tensor parallelism
 * shards: x2 = r + s / t2, clamped to 0 <= s <= x1. */
static vp__split tp_split(double x1, double x2, double t2)
{
    double sh = t2 > 1 ? (x1 - x2) * t2 / (t2 - 1) : 0;
    sh = sh < 0 ? 0 : sh > x1 ? x1 : sh;
    return (vp__split){x1 - sh, sh};
}

vp_cluster_model *vp_cluster_model_new(const vp_model *m, uint64_t seq,
                                       vp_error *err)
{
    vp_error_clear(err);
    /* not one repeated decoder layer: the whole model (cluster_graph.c) */
    if (m->form != 0 || m->tf.type == VP_TF_ENCDEC)
        return vp__cluster_whole_new(m, seq, err);
    if (m->tf.layers < 1) {
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
#define VP__COPY(f) cm->f = t->f;
    CLUSTER_DIMS(VP__COPY)
#undef VP__COPY
    cm->attn = t->attn;
    cm->t2 = tp_unit(t);
    make_local(&cm->local[0], m, 1);
    make_local(&cm->local[1], m, cm->t2 > 1 ? cm->t2 : 1);
    gscan s[2];
    shapes shp[2];
    int nt = cm->t2 > 1 ? 2 : 1;
    double t2 = cm->t2 > 1 ? (double)cm->t2 : 1.0;
    vp_graph *gr[2] = {NULL, NULL};
    for (int ti = 0; ti < nt; ti++) {
        vp_graph *g = vp__graph_build_tf(&cm->local[ti], cm->m, 1, cm->seq,
                                         err);
        if (!g) {
            vp_graph_free(gr[0]);
            free(cm);
            return NULL;
        }
        gr[ti] = g;
        if (g->n_segs != 2) {
            vp_graph_free(gr[0]);
            vp_graph_free(gr[1]);
            free(cm);
            vp_error_set(err, VP_EUNSUPPORTED,
                         "cluster plans need a model of repeated layers");
            return NULL;
        }
        scan_graph(g, &s[ti]);
    }
    if (nt == 1)
        s[1] = s[0];
    scan_shapes(gr[0], nt == 2 ? gr[1] : gr[0], t2, true, cm, &shp[0]);
    if (nt == 2)
        scan_shapes(gr[1], gr[1], 1.0, false, cm, &shp[1]);
    else
        shp[1] = shp[0];
    vp_graph_free(gr[0]);
    vp_graph_free(gr[1]);
    memcpy(cm->gemm, shp[0].gemm, sizeof cm->gemm);
    memcpy(cm->hgemm, shp[0].hgemm, sizeof cm->hgemm);
    cm->n_gemm = shp[0].n_gemm;
    cm->n_hgemm = shp[0].n_hgemm;
    vp__fused *fz[3] = {&cm->fz_emb, &cm->fz_layer, &cm->fz_head};
    for (int r = 0; r < 3; r++) {
        fz[r]->elems = tp_split(shp[0].fz[r][0], shp[1].fz[r][0], t2);
        fz[r]->masks = tp_split(shp[0].fz[r][1], shp[1].fz[r][1], t2);
        fz[r]->kernels = shp[0].fz[r][2];
    }
    cm->lin_in = tp_split(shp[0].lin_in, shp[1].lin_in, t2);
    cm->gated = tp_split(shp[0].gated, shp[1].gated, t2);
    cm->sac = tp_split(shp[0].mm_out, shp[1].mm_out, t2);
    cm->keep = tp_split(shp[0].keep[0], shp[1].keep[0], t2);
    cm->keep_mask = tp_split(shp[0].keep[1], shp[1].keep[1], t2);
    cm->keep_exp = tp_split(shp[0].keep[2], shp[1].keep[2], t2);
#define SPLIT(field) cm->field = tp_split(s[0].field, s[1].field, t2)
    SPLIT(p_layer);
    SPLIT(p_exp);
    SPLIT(p_word);
    SPLIT(p_emb_other);
    SPLIT(p_head_word);
    SPLIT(p_head_other);
    SPLIT(flin_f);
    SPLIT(flin_b);
    SPLIT(fattn_f);
    SPLIT(fattn_b);
    SPLIT(fexp_f);
    SPLIT(fexp_b);
    SPLIT(fhead_f);
    SPLIT(fhead_b);
#undef SPLIT
    cm->n_lin = s[0].n_lin;
    cm->n_attn = s[0].n_attn;
    cm->n_exp = s[0].n_exp;
    cm->n_head = s[0].n_head;
    cm->tied = t->tied;
    uint64_t nd = dense_layers_of(t);
    gscan d = s[0];
    if (nd && dense_mix(cm, &d, err) != VP_OK) {
        free(cm);
        return NULL;
    }
    double L = (double)(cm->L - nd), D = (double)nd;
    cm->flops_per_sample = L * s[0].flops_layer + D * d.flops_layer +
                           s[0].flops_emb + s[0].flops_head;
    cm->rec_full_per_sample = L * (s[0].flin_f + s[0].fattn_f + s[0].fexp_f) +
                              D * (d.flin_f + d.fattn_f + d.fexp_f);
    cm->rec_sel_per_sample = L * s[0].fattn_f + D * d.fattn_f;
    cm->params = (uint64_t)llround(
        L * (s[0].p_layer + s[0].p_exp) + D * (d.p_layer + d.p_exp) +
        s[0].p_word + s[0].p_emb_other + s[0].p_head_word +
        s[0].p_head_other);
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
    vp__whole_free(cm->whole);
    free(cm);
}

void vp_cluster_model_info_get(const vp_cluster_model *cm,
                               vp_cluster_model_info *out)
{
    memset(out, 0, sizeof *out);
    out->name = vp_model_name(cm->m);
    out->seq = cm->seq;
    out->layers = cm->L;
#define VP__COPY(f) out->f = cm->f;
    CLUSTER_DIMS(VP__COPY)
#undef VP__COPY
    out->params = cm->params;
    out->layer_params = cm->layer_params;
    out->embed_params = cm->embed_params;
    out->head_params = cm->head_params;
    out->tp_unit = cm->t2;
    out->whole = cm->whole != NULL;
    out->flops_per_token = cm->flops_per_sample /
                           (out->whole ? 1.0 : (double)cm->seq);
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
    [VP_SHARD_FSDP2] = VP_ENGINE_TORCH,
    [VP_SHARD_HSDP2] = VP_ENGINE_TORCH,
    [VP_SHARD_DDP_ZERO1] = VP_ENGINE_TORCH,
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
        /* FSDP1's CPUOffload, FSDP2's CPUOffloadPolicy */
        return s == VP_SHARD_ZERO3 || s == VP_SHARD_FSDP_FULL ||
               s == VP_SHARD_FSDP2 || s == VP_SHARD_HSDP2;
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
    if (cm->whole)
        return false;
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
    if (cm->whole && vp__whole_check(cm, p, err) != VP_OK)
        return VP_EARG;
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
    if (p->first_layers || p->last_layers) {
        uint64_t f = p->first_layers, la = p->last_layers;
        uint64_t ends = (f ? 1 : 0) + (la ? 1 : 0);
        if (p->pp < 2)
            BAD("first/last stage layers need pp > 1");
        if (f + la > cm->L)
            BAD("the first and last stages hold %llu layers of %llu",
                (unsigned long long)(f + la), (unsigned long long)cm->L);
        uint64_t rest = cm->L - f - la, nmid = p->pp - ends;
        if (nmid == 0 && rest)
            BAD("the first and last stages must hold all %llu layers when "
                "pp = 2",
                (unsigned long long)cm->L);
        if (nmid && (rest < nmid || rest % nmid))
            BAD("the %llu layers left for the other %llu stages do not "
                "split evenly",
                (unsigned long long)rest, (unsigned long long)nmid);
    }
    if (p->ep > 1 && (!cm->experts || cm->experts % p->ep || p->dp % p->ep))
        BAD("expert-parallel degree %u must divide the experts (%llu) and "
            "dp (%u)",
            p->ep, (unsigned long long)cm->experts, p->dp);
    if (p->pp == 1 && (p->schedule != VP_SCHED_1F1B || p->vpp != 1))
        BAD("a schedule needs pp > 1 (use 1f1b, vpp 1, when pp = 1)");
    if (p->schedule == VP_SCHED_INTERLEAVED) {
        if (p->vpp < 2)
            BAD("the interleaved schedule needs vpp >= 2");
        double l0, l1, lm;
        vp__stage_layers(cm, p, &l0, &l1, &lm);
        double lmin = l0 < l1 ? l0 : l1;
        if (lm > 0 && lm < lmin)
            lmin = lm;
        if (lmin < p->vpp)
            BAD("interleaving needs every stage to hold at least vpp = %u "
                "layers",
                p->vpp);
        if (p->accum % p->pp)
            BAD("interleaving needs the micro-batches divisible by pp");
    } else if (p->vpp != 1) {
        BAD("vpp > 1 needs the interleaved schedule");
    }
    if (p->schedule == VP_SCHED_DUALPIPE &&
        (p->pp % 2 || p->accum % 2 || p->accum < 2 * (uint64_t)p->pp))
        /* deepseek-ai/DualPipe dualpipe.py step(): num_ranks % 2 == 0,
         * num_chunks % 2 == 0 and num_chunks >= num_ranks * 2 */
        BAD("DualPipe needs an even pp and an even number of micro-batches "
            "of at least 2 pp");
    vp_engine e = shard_engine[p->sharding];
    if (p->dtype == VP_DT_FP8 && e == VP_ENGINE_DEEPSPEED)
        BAD("fp8 training needs Megatron (Transformer Engine) or PyTorch "
            "(float8 linears)");
    if (e == VP_ENGINE_DEEPSPEED && p->recompute == VP_RC_SELECTIVE)
        BAD("selective recomputation needs Megatron (the core attention) "
            "or PyTorch (op-level policy)");
    if (vp__ddp_like(p->sharding) &&
        (p->tp > 1 || p->pp > 1 || p->cp > 1 || p->ep > 1))
        BAD("%s runs data parallelism only (tp = pp = cp = ep = 1); "
            "FSDP composes with them", vp_sharding_name(p->sharding));
    if (e == VP_ENGINE_DEEPSPEED) {
        if (p->cp > 1 || p->ep > 1)
            BAD("DeepSpeed plans here use cp = ep = 1");
        if (p->pp > 1 && (p->sharding != VP_SHARD_ZERO1 ||
                          p->schedule != VP_SCHED_1F1B))
            BAD("DeepSpeed's pipeline engine runs 1F1B with ZeRO stage 1 "
                "only");
    }
    if (p->compile && e != VP_ENGINE_TORCH)
        BAD("torch.compile applies to the PyTorch engine");
    if (p->fp8_gather &&
        (p->dtype != VP_DT_FP8 || !vp__fsdp2(p->sharding)))
        BAD("the fp8 all-gather is torchao's float8 recipe under FSDP2 or "
            "HSDP2 (fp8 dtype)");
    if (p->mtp && (cm->whole || p->mtp > 8))
        BAD("multi-token prediction takes 1 to 8 modules after a "
            "decoder-only transformer");
    if ((unsigned)p->overlap_dp > VP_OFF || (unsigned)p->overlap_tp > VP_OFF ||
        (unsigned)p->overlap_ep > VP_OFF)
        BAD("invalid overlap switch in the configuration");
    if (p->overlap_tp == VP_ON && (p->tp < 2 || !p->sp))
        BAD("tensor-parallel communication overlap needs tp > 1 with "
            "sequence parallelism");
    if (p->overlap_ep == VP_ON && p->ep < 2)
        BAD("expert all-to-all overlap needs ep > 1");
    if (vp__hybrid(p->sharding) &&
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

void vp__local_tf(vp_tf *tf, const vp_model *m, uint32_t t)
{
    make_local(tf, m, t);
}
