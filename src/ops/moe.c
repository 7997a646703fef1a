/* Op rules: mixture of experts as transformers 5.x runs it. The router's
 * top-k (softmax scores: Mixtral, Qwen-MoE, modeling_qwen3_moe.py
 * Qwen3MoeTopKRouter; sigmoid scores over groups: DeepSeek-V3,
 * modeling_deepseek_v3.py DeepseekV3TopkRouter) and the fused experts'
 * grouped GEMMs (integrations/moe.py, grouped_mm_experts_forward), read
 * off the allocator traces groundtruth/traces/qwen3-moe-small-*,
 * qwen2-moe-small-* and deepseek-v3-small-* (docs/SIMULATION_NOTES.md
 * §12). */
#include "../sim_internal.h"

/* What the router saves: the scores of every expert (softmax: fp32;
 * sigmoid: the logits' dtype), the chosen experts (int64), and with
 * renormalised weights the top-k values and their sum (the division's
 * operands). */
enum { ROUTER_SCORES, ROUTER_EXPERTS, ROUTER_TOPK, ROUTER_SUM };

/* Softmax router: softmax(logits, dtype=float) (a fp32 copy first when
 * the logits are 16-bit), topk (values fp32, indices int64), optionally
 * values / values.sum(-1), then .to(logits' dtype). Grouped router:
 * sigmoid in the logits' dtype (saved), + the fp32 correction bias, the
 * groups' top-2 sums and top groups, the masked scores' top-k, the chosen
 * weights gathered, renormalised and scaled. */
void vp__router_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint64_t ne = vp__mulc(S, o->shape[0], o->classes); /* tokens x E */
    uint8_t lb = f->eb0;
    bool grouped = o->flags & VP_OPF_ROUTER_GROUP;
    uint32_t sc, c = NONE;
    if (grouped) {
        sc = vp__talloc(S, vp__mulc(S, ne, lb), VP_CAT_ACT);
        uint32_t b = vp__talloc(S, vp__mulc(S, ne, 4), VP_CAT_TEMP);
        vp__transient(S, vp__mulc(S, ne, 4)); /* the masked scores */
        vp__tunref(S, b);
    } else {
        if (lb != 4)
            c = vp__talloc(S, vp__mulc(S, ne, 4), VP_CAT_TEMP);
        sc = vp__talloc(S, vp__mulc(S, ne, 4), VP_CAT_ACT);
        vp__tunref(S, c);
    }
    uint8_t ve = grouped ? lb : 4;
    uint32_t val = vp__talloc(S, vp__mulc(S, f->n, ve), VP_CAT_ACT);
    uint32_t idx = vp__talloc(S, vp__mulc(S, f->n, 8), VP_CAT_ACT);
    uint32_t sum = NONE, w = val;
    if (o->flags & VP_OPF_NORM_TOPK) {
        sum = vp__talloc(S, vp__mulc(S, o->shape[0], ve), VP_CAT_ACT);
        w = vp__talloc(S, vp__mulc(S, f->n, ve), VP_CAT_ACT);
    } else {
        vp__tref(S, w);
    }
    f->oeb = lb;
    if (ve != lb) {
        f->out = vp__talloc(S, vp__mulc(S, f->n, lb), VP_CAT_ACT);
        vp__tunref(S, w);
    } else {
        f->out = w;
    }
    if (f->sv) {
        vp__save(S, f->i, ROUTER_SCORES, sc);
        vp__save(S, f->i, ROUTER_EXPERTS, idx);
        if (sum != NONE) {
            vp__save(S, f->i, ROUTER_TOPK, val);
            vp__save(S, f->i, ROUTER_SUM, sum);
        }
    }
    if (o->hold_until > f->i) /* the indices, a local as the weights */
        vp__hold_until(S, idx, o->hold_until);
    vp__tunref(S, sc);
    vp__tunref(S, idx);
    vp__tunref(S, val);
    vp__tunref(S, sum);
}

/* the top-k grads scattered into a fp32 [tokens, E] buffer, then the
 * scores' backward: the logits' gradient */
void vp__router_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    uint64_t ne = vp__mulc(S, o->shape[0], o->classes);
    uint32_t sc = vp__talloc(S, vp__mulc(S, ne, 4), VP_CAT_TEMP);
    vp__tunref(S, b->gy);
    b->gy = NONE;
    if (b->ig0)
        b->gx = vp__grad_like(S, b->in0, b->eb0);
    vp__tunref(S, sc);
}

/* The grouped experts' saved tensors: the gathered tokens, gate_up's
 * output, the activation, the gated product, down's output, the routing
 * weights in expert order. */
enum { EX_TOKENS, EX_GATE_UP, EX_ACT, EX_PROD, EX_DOWN, EX_WEIGHTS };

/* Rows (tokens x top_k), and the widths of the expert GEMMs. */
typedef struct {
    uint64_t rows, h, i, h_rows, i_rows, gu_rows;
    uint8_t pe; /* the experts' dtype (their parameters')          */
} ex_dims;

static ex_dims ex_dims_of(sim *S, const vp_op *o)
{
    ex_dims d;
    d.h = o->in_features;
    d.i = o->out_features;
    d.rows = vp__mulc(S, o->numel / d.h, o->top_k);
    d.h_rows = vp__mulc(S, d.rows, d.h);
    d.i_rows = vp__mulc(S, d.rows, d.i);
    d.gu_rows = vp__mulc(S, d.i_rows, 2);
    d.pe = (uint8_t)vp__param_bytes(S, &S->g->params[o->params[0]]);
    return d;
}

/* grouped_mm_experts_forward: hidden_states[token_idx] in expert order;
 * _grouped_linear(gate_up_proj) (input cast to the weights' dtype: the
 * grouped GEMM is not autocast) and its result copied; act(gate) * up;
 * _grouped_linear(down_proj), copied; times the routing weights (in their
 * dtype when it is wider: DeepSeek-V3's fp32 weights over bf16 experts);
 * back to token order; summed over the k picks; .to(the input's dtype).
 * Outside training (inference, generate()) each local dies when the
 * function drops it: gate_up's copy and the activation once the gated
 * product is made, the product once down has run (traced:
 * deepseek-v3-small generate()); a checkpointed training forward keeps
 * them to the end (measured: mixtral-small bf16 b8 checkpointed, whose
 * reserved peak the early frees put 4.5 % under). */
void vp__moe_experts_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    ex_dims d = ex_dims_of(S, o);
    uint8_t pe = d.pe, we = vp__promote(pe, S->out_eb[o->inputs[1]]);
    bool early = !f->sv && !S->training;
    uint64_t r8 = vp__mulc(S, d.rows, 8);
    /* argsort(expert_ids): its indices (perm) and sorted keys (int64),
     * the radix sort's buffer; token_idx = perm // k */
    uint32_t perm = vp__talloc(S, r8, VP_CAT_ACT);
    uint32_t keys = vp__talloc(S, r8, VP_CAT_ACT);
    vp__transient(S, r8);
    vp__transient(S, r8);
    uint32_t tok = vp__talloc(S, vp__mulc(S, d.h_rows, f->eb0), VP_CAT_ACT);
    uint32_t rw = vp__talloc(S, vp__mulc(S, d.rows, S->out_eb[o->inputs[1]]),
                             VP_CAT_ACT);
    /* expert_ids_g.int() for histc; tokens_per_expert, its cumsum */
    uint32_t ids = vp__talloc(S, vp__mulc(S, d.rows, 4), VP_CAT_ACT);
    uint32_t hist = vp__talloc(S, vp__mulc(S, o->classes, 4), VP_CAT_ACT);
    uint32_t offs = vp__talloc(S, vp__mulc(S, o->classes, 4), VP_CAT_ACT);
    if (f->eb0 != pe) {
        uint32_t c = vp__talloc(S, vp__mulc(S, d.h_rows, pe), VP_CAT_ACT);
        vp__tunref(S, tok);
        tok = c;
    }
    uint32_t g0 = vp__talloc(S, vp__mulc(S, d.gu_rows, pe), VP_CAT_TEMP);
    uint32_t gu = vp__talloc(S, vp__mulc(S, d.gu_rows, pe), VP_CAT_ACT);
    vp__tunref(S, g0);
    uint32_t act = vp__talloc(S, vp__mulc(S, d.i_rows, pe), VP_CAT_ACT);
    uint32_t prod = vp__talloc(S, vp__mulc(S, d.i_rows, pe), VP_CAT_ACT);
    if (early) {
        vp__tunref(S, act);
        vp__tunref(S, gu);
        act = gu = NONE;
    }
    uint32_t d0 = vp__talloc(S, vp__mulc(S, d.h_rows, pe), VP_CAT_TEMP);
    if (early) {
        vp__tunref(S, prod);
        prod = NONE;
    }
    uint32_t dn = vp__talloc(S, vp__mulc(S, d.h_rows, pe), VP_CAT_ACT);
    vp__tunref(S, d0);
    uint32_t wt = vp__talloc(S, vp__mulc(S, d.h_rows, we), VP_CAT_TEMP);
    /* inv_perm = empty_like(perm); inv_perm[perm] = arange(S) */
    uint32_t inv = vp__talloc(S, r8, VP_CAT_ACT);
    vp__transient(S, r8);
    uint32_t un = vp__talloc(S, vp__mulc(S, d.h_rows, we), VP_CAT_TEMP);
    vp__tunref(S, wt);
    f->out = vp__talloc(S, vp__mulc(S, f->n, we), VP_CAT_ACT);
    if (!early)
        vp__tunref(S, un);
    if (we != f->eb0) {
        uint32_t c = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
        vp__tunref(S, f->out);
        f->out = c;
    }
    if (f->sv) {
        vp__save(S, f->i, EX_TOKENS, tok);
        vp__save(S, f->i, EX_GATE_UP, gu);
        vp__save(S, f->i, EX_ACT, act);
        vp__save(S, f->i, EX_PROD, prod);
        vp__save(S, f->i, EX_DOWN, dn);
        vp__save(S, f->i, EX_WEIGHTS, rw);
    }
    if (early)
        vp__tunref(S, un);
    uint32_t drop[] = {perm, keys, tok, rw, ids, hist, offs, gu, act, prod,
                       dn, inv};
    for (size_t k = 0; k < sizeof drop / sizeof drop[0]; k++)
        vp__tunref(S, drop[k]);
}

/* a new gradient of `bytes` replacing *g */
static void regrad(sim *S, uint32_t *g, uint64_t bytes)
{
    uint32_t n = vp__talloc(S, bytes, VP_CAT_TEMP);
    vp__tunref(S, *g);
    *g = n;
}

/* The nodes in reverse (traced): the sum's and the reorder's backward
 * (a zero buffer and an index_put), the weights' product (both operands'
 * grads, the weights' summed), the copy, down's grouped GEMM (weight
 * grad, then the input's), the gated product, the activation, the
 * chunk's cat, the copy, gate_up's grouped GEMM, then the gather's
 * index_add into a zero buffer like the input. */
void vp__moe_experts_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    uint32_t i = b->i;
    ex_dims d = ex_dims_of(S, o);
    uint8_t pe = d.pe;
    uint32_t g = b->gy;
    b->gy = NONE;
    if (b->oeb != pe)
        regrad(S, &g, vp__mulc(S, b->n, pe));
    uint32_t z = vp__talloc(S, vp__mulc(S, d.h_rows, pe), VP_CAT_TEMP);
    regrad(S, &z, vp__mulc(S, d.h_rows, pe));
    vp__tunref(S, g);
    g = z;
    uint32_t gd = vp__talloc(S, vp__mulc(S, d.h_rows, pe), VP_CAT_TEMP);
    vp__transient(S, vp__mulc(S, d.h_rows, pe)); /* grad * down */
    uint32_t in1 = o->inputs[1];
    if (S->g->ops[in1].needs_grad)
        vp__give_grad(S, in1, vp__grad_like(S, in1, S->out_eb[in1]),
                      S->out_eb[in1]);
    vp__tunref(S, g);
    vp__drop_saved(S, i, EX_WEIGHTS);
    vp__drop_saved(S, i, EX_DOWN);
    regrad(S, &gd, vp__mulc(S, d.h_rows, pe));
    vp__weight_grad(S, o->params[1], false);
    regrad(S, &gd, vp__mulc(S, d.i_rows, pe));
    vp__drop_saved(S, i, EX_PROD);
    uint32_t ga = vp__talloc(S, vp__mulc(S, d.i_rows, pe), VP_CAT_TEMP);
    uint32_t gup = vp__talloc(S, vp__mulc(S, d.i_rows, pe), VP_CAT_TEMP);
    vp__tunref(S, gd);
    vp__drop_saved(S, i, EX_ACT);
    regrad(S, &ga, vp__mulc(S, d.i_rows, pe));
    vp__drop_saved(S, i, EX_GATE_UP);
    uint32_t c = vp__talloc(S, vp__mulc(S, d.gu_rows, pe), VP_CAT_TEMP);
    vp__tunref(S, ga);
    vp__tunref(S, gup);
    regrad(S, &c, vp__mulc(S, d.gu_rows, pe));
    vp__weight_grad(S, o->params[0], false);
    regrad(S, &c, vp__mulc(S, d.h_rows, pe));
    vp__drop_saved(S, i, EX_TOKENS);
    if (b->ig0) {
        b->gx = vp__grad_like(S, b->in0, pe);
        b->gxe = pe;
    }
    vp__tunref(S, c);
}
