/* Op rules: mixture of experts as transformers 5.x runs it. The router's
 * top-k (softmax scores: Mixtral, Qwen-MoE, modeling_qwen3_moe.py
 * Qwen3MoeTopKRouter; sigmoid scores over groups: DeepSeek-V3,
 * modeling_deepseek_v3.py DeepseekV3TopkRouter) and the fused experts'
 * grouped GEMMs (integrations/moe.py, grouped_mm_experts_forward), read
 * off the allocator traces groundtruth/traces/qwen3-moe-small-*,
 * qwen2-moe-small-* and deepseek-v3-small-* (docs/SIMULATION_NOTES.md
 * §12); their launch rules (the host calls beyond the allocations, from
 * the same sources and autograd's nodes: docs/STEP_TIME.md "MoE routers'
 * and experts' glue"). */
#include <math.h>

#include "../sim_internal.h"

static void meg_router_fwd(sim *S, vp__fwd_op *f);
static void meg_router_bwd(sim *S, vp__bwd_op *b);
static void meg_experts_fwd(sim *S, vp__fwd_op *f);
static void meg_experts_bwd(sim *S, vp__bwd_op *b);

/* What the router saves: the scores of every expert (softmax: fp32;
 * sigmoid: the logits' dtype), the chosen experts (int64), and with
 * renormalised weights the top-k values and their sum (the division's
 * operands). */
enum { ROUTER_SCORES, ROUTER_EXPERTS, ROUTER_TOPK, ROUTER_SUM };

/* Autograd saves those (SoftmaxBackward0 its result, TopkBackward0 its
 * indices, DivBackward0 both operands), and the grouped router saves 5
 * variables more (modeling_deepseek_v3.py route_tokens_to_experts; torch
 * 2.11 derivatives.yaml): the groups' topk(2), the top groups' and the
 * masked scores' top-k keep their indices though no gradient reaches them
 * (3), masked_fill its mask, gather the scores a second time beside the
 * chosen experts. Checkpoint's hooks pack each (vp__save_vars). */
#define ROUTER_GROUP_VARS 5u

/* Softmax router: softmax(logits, dtype=float) (a fp32 copy first when
 * the logits are 16-bit), topk (values fp32, indices int64), optionally
 * values / values.sum(-1), then .to(logits' dtype). Grouped router:
 * sigmoid in the logits' dtype (saved), + the fp32 correction bias, the
 * groups' top-2 sums and top groups, the masked scores' top-k, the chosen
 * weights gathered, renormalised and scaled. */
void vp__router_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    if (o->flags & VP_OPF_MEGATRON) {
        meg_router_fwd(S, f);
        return;
    }
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
        if (grouped)
            vp__save_vars(S, f->i, ROUTER_GROUP_VARS);
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
    if (o->flags & VP_OPF_MEGATRON) {
        meg_router_bwd(S, b);
        return;
    }
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

/* The variables its autograd nodes save beyond those slots (derivatives.yaml,
 * torch 2.11; the nodes as measured, calibrate/profiles/h200-launch-ops.jsonl
 * qwen3-moe-small amp b4: three IndexBackward0, three MaskedFillBackward0, two
 * GroupedMmBackward0, SiluBackward0 and two MulBackward0 a layer): each
 * IndexBackward0 its index (the tokens', the weights' gather, [inv_perm]:
 * 3), each MaskedFillBackward0 its mask (3), each _grouped_mm its weight and
 * offs beside its input (2 x 2), the gate's SiluBackward0 gate and
 * MulBackward0 up, two views of gate_up's output (1 beyond it): 11, for 17 in
 * all. */
#define EX_VARS 11u

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
    if (o->flags & VP_OPF_MEGATRON) {
        meg_experts_fwd(S, f);
        return;
    }
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
        vp__save_vars(S, f->i, EX_VARS);
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
    if (o->flags & VP_OPF_MEGATRON) {
        meg_experts_bwd(S, b);
        return;
    }
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

/* ---- launches (docs/STEP_TIME.md "MoE routers' and experts' glue") ----- */

/* The bits of the largest of n indices (n - 1). */
static double index_bits(uint64_t n)
{
    double b = 0;
    for (uint64_t v = n > 1 ? n - 1 : 0; v != 0; v >>= 1)
        b += 1.0;
    return b;
}

/* at::cuda::cub::radix_sort_pairs over `bits` of the key (aten/src/ATen/
 * cuda/cub.cuh; cub's onesweep sort): a histogram kernel, an exclusive
 * sum, then one pass per 8 bits. */
static double radix_launches(double bits)
{
    return 2.0 + ceil(bits / 8.0);
}

/* IndexBackward0 of x[idx] over n indexed rows (torch/csrc/autograd/
 * FunctionsManual.cpp index_backward: zeros_like(x).index_put_(idx, grad,
 * accumulate=True); aten/src/ATen/native/cuda/Indexing.cu
 * index_put_with_sort_kernel): the zeros, wrapIndexOnce's remainder, the
 * index times its stride (computeLinearIndex), divide_ by the slice,
 * arange, the sort over bits(n - 1), the accumulating kernel. */
static double index_bwd_launches(uint64_t n)
{
    return 5.0 + radix_launches(index_bits(n)) + 1.0;
}

/* DivBackward0 of topk /= topk.sum(-1, keepdim=True) (derivatives.yaml
 * div.Tensor): grad / d; the divisor's -grad * ((a / d) / d) (4) summed
 * to [tokens, 1]; the sum's backward an expand (a view); the top-k values'
 * two gradients summed: 7. */
#define RENORM_BWD 7.0

/* The routers' kernels beyond their rules' allocations (vp__router_fwd,
 * vp__router_bwd). Softmax routers (modeling_mixtral.py MixtralTopKRouter,
 * modeling_qwen3_moe.py Qwen3MoeTopKRouter, Qwen2-MoE's): the forward's
 * copy, softmax, topk (gatherTopK and the sort of its k: two kernels, two
 * outputs), the renormalisation's sum and division and the cast are one
 * allocation each; the backward is TopkBackward0 (zeros [tokens, E], a
 * scatter), SoftmaxBackward0 and, renormalised, DivBackward0 (7), where
 * the rules allocate the zeros and the logits' gradient. DeepSeek-V3's
 * group-limited router (modeling_deepseek_v3.py DeepseekV3MoE.
 * route_tokens_to_experts): sigmoid, + e_score_correction_bias, the
 * groups' topk(2) (2) and its sum, topk over the groups (unsorted: 1),
 * zeros_like, scatter_, the mask's expand().reshape() (a copy), .bool(),
 * ~, masked_fill (a clone and the fill), topk (unsorted: 1), gather;
 * renormalised: sum, + 1e-20, /=; * routed_scaling_factor: 16 + 3
 * kernels, where the rules allocate the scores, the biased scores, the
 * masked scores, the weights and the indices (+ the sum and the divided
 * weights). Its backward: MulBackward0 (1), DivBackward0 (7),
 * GatherBackward0 (zeros, scatter_add), SigmoidBackward0; the selection's
 * path carries no gradient (its outputs are indices). */
double vp__router_launches(const vp_graph *g, const vp_op *o, int ph,
                           bool wide)
{
    (void)wide;
    if (o->flags & VP_OPF_MEGATRON)
        return 0;
    double norm = (o->flags & VP_OPF_NORM_TOPK) ? 1.0 : 0.0;
    double gx = g->ops[o->inputs[0]].needs_grad ? 1.0 : 0.0;
    if (o->flags & VP_OPF_ROUTER_GROUP)
        return ph == 0 ? (16.0 + 3.0 * norm) - (5.0 + 2.0 * norm)
                       : (4.0 + RENORM_BWD * norm) - (1.0 + gx);
    return ph == 0 ? 0.0 : (3.0 + RENORM_BWD * norm) - (1.0 + gx);
}

/* The routed experts' kernels beyond their rules' allocations, the
 * grouped GEMMs apart (timing_host.c vp__moe_gemms_of launches those); a
 * masked_fill's clone is a copy_ (cudaMemcpyAsync), a host call as a
 * kernel is. grouped_mm_experts_forward (integrations/moe.py,
 * transformers 5.17): torch.sort(expert_ids) (Sort.cu
 * segmented_sort_large_segments: fill_reverse_indices_kernel, then the
 * radix sort over the int64 key's 64 bits: 11), perm // top_k,
 * hidden_states[...], sample_weights[perm], .int(), histc (zeros, the
 * histogram), cumsum (2), the sentinel mask's >=, clamp_, each GEMM's
 * output masked out of place (a clone and the fill: 2 x 2) and the
 * gathered tokens in place (1), act(gate) * up (2), * the weights,
 * arange and inv_perm[perm] = (2), [inv_perm], the sum over the k picks:
 * 33 host calls (the casts to the weights' dtype and back are one
 * allocation each) for the rules' 20 allocations. The backward,
 * autograd's nodes in reverse: the view of the sum's expanded gradient (a
 * copy), IndexBackward0 of [inv_perm] over tokens x k rows, three
 * MaskedFillBackward0 (a clone and the fill each), the weights'
 * MulBackward0 (grad * w; for the weights' gradient grad * out summed to
 * [rows, 1], and IndexBackward0 of sample_weights[perm]), the gate's
 * MulBackward0 (2), SiluBackward0, the chunk's cat, and for the tokens'
 * gradient IndexBackward0 of hidden_states[perm // k] over the tokens;
 * the rules allocate 13 tensors, the weights' gradient, the tokens' and
 * each trained expert weight's. */
static double experts_calls(const vp_graph *g, const vp_op *o, int ph)
{
    if (ph == 0)
        return 33.0;
    uint64_t tokens = o->numel / o->in_features, rows;
    if (!vp_mul_u64(tokens, o->top_k, &rows))
        rows = UINT64_MAX; /* bits(rows - 1): 64 */
    double w = g->ops[o->inputs[1]].needs_grad ? 1.0 : 0.0;
    double x = g->ops[o->inputs[0]].needs_grad ? 1.0 : 0.0;
    return 12.0 + 2.0 * w + (1.0 + w) * index_bwd_launches(rows) +
           x * index_bwd_launches(tokens);
}

double vp__moe_experts_launches(const vp_graph *g, const vp_op *o, int ph,
                                bool wide)
{
    (void)wide;
    if ((o->flags & VP_OPF_MEGATRON) || o->in_features == 0)
        return 0;
    if (ph == 0)
        return experts_calls(g, o, 0) - 20.0;
    double w = g->ops[o->inputs[1]].needs_grad ? 1.0 : 0.0;
    double x = g->ops[o->inputs[0]].needs_grad ? 1.0 : 0.0;
    double trained = 0;
    for (uint32_t k = 0; k < o->n_params && k < 2; k++)
        trained += g->params[o->params[k]].trainable ? 1.0 : 0.0;
    return experts_calls(g, o, 1) - (13.0 + w + x + trained);
}

/* a kernel of class `kind` moving `moved` times `n` elements of e bytes */
static size_t mk(vp__mem_kernel *k, size_t j, int kind, double moved,
                 double n, double e, int layout)
{
    k[j] = (vp__mem_kernel){kind, moved * n * e, layout, e > 3.0};
    return j + 1;
}

/* A masked_fill of n elements of e bytes over the [rows, 1] sentinel mask
 * broadcast, out of place (a clone, then the fill in place) or in place;
 * the fill as a binary kernel with a broadcast operand (calibrate/
 * profiles/h200-kernels-byop.jsonl: masked_fill_'s elementwise_kernel
 * per element as the strided profile's broadcast mul, fp32 and bf16) */
static size_t masked(vp__mem_kernel *k, size_t j, double n, double e,
                     bool clone)
{
    if (clone)
        j = mk(k, j, VP_HW_MEM_COPY, 2.0, n, e, VP__LAY_CONTIG);
    return mk(k, j, VP_HW_MEM_ADD, 3.0, n, e, VP__LAY_BCAST);
}

/* The forward's large kernels (grouped_mm_experts_forward, as the launch
 * rule above counts them): the tokens gathered, masked in place and cast
 * to the experts' dtype; gate_up's output masked out of place; act(gate)
 * on a chunk and * up (the other chunk); down's output masked out of
 * place; * the routing weights ([rows, 1]); [inv_perm]; the sum over the
 * k picks (reads rows, writes tokens); the cast back. r rows of h and i
 * elements, t tokens. */
static size_t experts_fwd_mem(double r, double t, double h, double i,
                              const double eb[3], vp__mem_kernel *k)
{
    size_t j = 0;
    double x = eb[0], p = eb[1], w = eb[2];
    j = mk(k, j, VP_HW_MEM_COPY, 2.0, r * h, x, VP__LAY_CONTIG);
    j = masked(k, j, r * h, x, false);
    if (x != p)
        j = mk(k, j, VP_HW_MEM_CAST, 1.0, r * h, x + p, VP__LAY_CONTIG);
    j = masked(k, j, 2.0 * r * i, p, true);
    j = mk(k, j, VP_HW_MEM_SILU, 2.0, r * i, p, VP__LAY_CHUNK);
    j = mk(k, j, VP_HW_MEM_ADD, 3.0, r * i, p, VP__LAY_CHUNK);
    j = masked(k, j, r * h, p, true);
    j = mk(k, j, VP_HW_MEM_ADD, 3.0, r * h, w, VP__LAY_BCAST);
    j = mk(k, j, VP_HW_MEM_COPY, 2.0, r * h, w, VP__LAY_CONTIG);
    j = mk(k, j, VP_HW_MEM_COPY, 1.0, (r + t) * h, w, VP__LAY_CONTIG);
    if (w != x)
        j = mk(k, j, VP_HW_MEM_CAST, 1.0, t * h, w + x, VP__LAY_CONTIG);
    return j;
}

/* The backward's (autograd's nodes, as above): the cast's backward; the
 * sum's expanded gradient made whole (a broadcast read); IndexBackward0
 * of [inv_perm] (zeros, the accumulation); the weights' MulBackward0
 * (grad * w; with the weights' gradient grad * out and its sum to
 * [rows, 1]); down's MaskedFillBackward0; the gate's MulBackward0 (both
 * over a chunk); SiluBackward0 (x a chunk); the chunk's cat; gate_up's
 * MaskedFillBackward0; with the tokens' gradient their
 * MaskedFillBackward0, the cast's backward and IndexBackward0 of their
 * gather (zeros like the input, the accumulation). */
static size_t experts_bwd_mem(double r, double t, double h, double i,
                              const double eb[3], const bool need[2],
                              vp__mem_kernel *k)
{
    size_t j = 0;
    double x = eb[0], p = eb[1], w = eb[2];
    if (w != x)
        j = mk(k, j, VP_HW_MEM_CAST, 1.0, t * h, w + x, VP__LAY_CONTIG);
    j = mk(k, j, VP_HW_MEM_COPY, 2.0, r * h, w, VP__LAY_BCAST);
    j = mk(k, j, VP_HW_MEM_COPY, 1.0, r * h, w, VP__LAY_CONTIG);
    j = mk(k, j, VP_HW_MEM_COPY, 2.0, r * h, w, VP__LAY_CONTIG);
    j = mk(k, j, VP_HW_MEM_ADD, 3.0, r * h, w, VP__LAY_BCAST);
    if (need[1]) {
        j = mk(k, j, VP_HW_MEM_ADD, 3.0, r * h, w, VP__LAY_CONTIG);
        j = mk(k, j, VP_HW_MEM_COPY, 1.0, r * h, w, VP__LAY_CONTIG);
    }
    j = masked(k, j, r * h, p, true);
    for (int a = 0; a < 3; a++) /* grad * up, grad * act(gate), silu's */
        j = mk(k, j, VP_HW_MEM_ADD, 3.0, r * i, p, VP__LAY_CHUNK);
    j = mk(k, j, VP_HW_MEM_COPY, 2.0, 2.0 * r * i, p, VP__LAY_CONTIG);
    j = masked(k, j, 2.0 * r * i, p, true);
    if (!need[0])
        return j;
    j = masked(k, j, r * h, x, true);
    if (x != p)
        j = mk(k, j, VP_HW_MEM_CAST, 1.0, r * h, x + p, VP__LAY_CONTIG);
    j = mk(k, j, VP_HW_MEM_COPY, 1.0, t * h, x, VP__LAY_CONTIG);
    return mk(k, j, VP_HW_MEM_COPY, 2.0, r * h, x, VP__LAY_CONTIG);
}

size_t vp__moe_experts_mem(const vp_graph *g, const vp_op *o, int ph,
                           const double eb[3], vp__mem_kernel *k,
                           double *small)
{
    *small = 0;
    if ((o->flags & VP_OPF_MEGATRON) || o->in_features == 0)
        return 0;
    double h = (double)o->in_features, i = (double)o->out_features;
    double t = (double)(o->numel / o->in_features), r = t * (double)o->top_k;
    size_t n;
    if (ph == 0) {
        n = experts_fwd_mem(r, t, h, i, eb, k);
    } else {
        bool need[2] = {g->ops[o->inputs[0]].needs_grad,
                        g->ops[o->inputs[1]].needs_grad};
        n = experts_bwd_mem(r, t, h, i, eb, need, k);
    }
    size_t casts = 0;
    for (size_t j = 0; j < n; j++)
        casts += k[j].kind == VP_HW_MEM_CAST;
    double rest = experts_calls(g, o, ph) - (double)(n - casts);
    *small = rest > 0 ? rest : 0;
    return n;
}

/* ---- Megatron-Core (VP_OPF_MEGATRON; graph_moe.c meg_moe) ------------- */

/* TopKRouter.routing (megatron/core/transformer/moe/router.py; moe_utils.
 * py topk_routing_with_score_function, compute_routing_scores_for_aux_
 * loss), unfused, logits [n, E] in the module's dtype (Float16Module made
 * the router's fp32 weight bf16). Softmax (Mixtral, Qwen): topk on the
 * logits, softmax(scores, dtype=float32) saved (fp32 [n, k]) then
 * .type_as; sigmoid (DeepSeek-V3): sigmoid(logits.float()).type_as saved
 * ([n, E]), the fp32 expert bias added for the selection, the chosen
 * scores gathered and renormalised. Either way: the top indices (int64
 * [n, k], saved by the scatter), the dense probs zeros_like(logits).
 * scatter(...) [n, E] (the output), the routing map zeros_like(logits).
 * int().scatter(...).bool() [n, E] (kept by the dispatcher until the
 * unpermute: hold_until), and the load-balancing loss's fp32 scores
 * [n, E] (saved by their softmax or sigmoid). */
enum { MR_SCORES, MR_IDX, MR_AUX };

static void meg_router_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint64_t n = o->shape[0], nk = vp__mulc(S, n, o->top_k);
    uint64_t ne = vp__mulc(S, n, o->classes);
    uint8_t lb = f->eb0;
    uint32_t sc;
    if (o->flags & VP_OPF_ROUTER_GROUP) {
        uint32_t s32 = vp__talloc(S, vp__mulc(S, ne, 4), VP_CAT_TEMP);
        sc = vp__talloc(S, vp__mulc(S, ne, lb), VP_CAT_ACT);
        vp__tunref(S, s32);
        vp__transient(S, vp__mulc(S, ne, 4)); /* + the expert bias */
    } else {
        vp__transient(S, vp__mulc(S, nk, lb)); /* topk values */
        sc = vp__talloc(S, vp__mulc(S, nk, 4), VP_CAT_ACT);
    }
    uint32_t idx = vp__talloc(S, vp__mulc(S, nk, 8), VP_CAT_ACT);
    vp__transient(S, vp__mulc(S, nk, lb)); /* the probs, [n, k] */
    f->out = vp__talloc(S, vp__mulc(S, ne, lb), VP_CAT_ACT);
    uint32_t z = vp__talloc(S, vp__mulc(S, ne, lb), VP_CAT_TEMP);
    uint32_t zi = vp__talloc(S, vp__mulc(S, ne, 4), VP_CAT_TEMP);
    vp__tunref(S, z);
    uint32_t si = vp__talloc(S, vp__mulc(S, ne, 4), VP_CAT_TEMP);
    vp__tunref(S, zi);
    uint32_t map = vp__talloc(S, ne, VP_CAT_ACT);
    vp__tunref(S, si);
    uint32_t aux = vp__talloc(S, vp__mulc(S, ne, 4), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, f->i, MR_SCORES, sc);
        vp__save(S, f->i, MR_IDX, idx);
        vp__save(S, f->i, MR_AUX, aux);
    }
    if (o->hold_until > f->i)
        vp__hold_until(S, map, o->hold_until);
    uint32_t drop[] = {sc, idx, map, aux};
    for (size_t k = 0; k < sizeof drop / sizeof drop[0]; k++)
        vp__tunref(S, drop[k]);
}

/* The aux loss's and the probs' gradients into fp32 [n, E] buffers, then
 * the logits' gradient. */
static void meg_router_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    uint64_t ne4 = vp__mulc(S, vp__mulc(S, o->shape[0], o->classes), 4);
    uint32_t ga = vp__talloc(S, ne4, VP_CAT_TEMP);
    vp__drop_saved(S, b->i, MR_AUX);
    uint32_t gs = vp__talloc(S, ne4, VP_CAT_TEMP);
    vp__tunref(S, b->gy);
    b->gy = NONE;
    if (b->ig0)
        b->gx = vp__grad_like(S, b->in0, b->eb0);
    vp__tunref(S, gs);
    vp__tunref(S, ga);
}

/* Rows of the dispatch: n tokens; sent n x top_k; received on this rank
 * (after the expert-parallel all-to-all) rows / etp; gathered over the
 * expert-tensor-parallel ranks: rows (the grouped GEMMs'). */
typedef struct {
    uint64_t n, sent, recv, rows, h, f;
    uint32_t local;
    uint8_t eb, pb; /* the tokens', the probs' bytes per element */
} meg_dims;

static meg_dims meg_dims_of(sim *S, const vp_op *o, uint8_t eb, uint8_t pb)
{
    meg_dims d;
    d.h = o->in_features;
    d.f = o->out_features;
    d.n = o->numel / d.h;
    d.sent = vp__mulc(S, d.n, o->top_k);
    d.rows = o->rows;
    d.recv = o->heads > 1 ? (d.rows + o->heads - 1) / o->heads : d.rows;
    d.local = (uint32_t)o->classes;
    d.eb = eb;
    d.pb = pb;
    return d;
}

/* one buffer of `bytes` replacing *t (a copy, a collective's output) */
static void move(sim *S, uint32_t *t, uint64_t bytes, uint8_t cat)
{
    uint32_t n = vp__talloc(S, bytes, cat);
    vp__tunref(S, *t);
    *t = n;
}

/* [rows, h] tensors of the dispatch, bytes */
static uint64_t meg_rows(sim *S, uint64_t rows, const meg_dims *d)
{
    return vp__mulc(S, vp__mulc(S, rows, d->h), d->eb);
}

/* A [sent, h] tensor through the dispatch: the all-to-all (recv rows),
 * the gather over etp (rows), the sort by local expert; with pr, the
 * probs along. */
static void meg_dispatch(sim *S, uint32_t *t, uint32_t *pr, const meg_dims *d)
{
    uint64_t hop[3] = {d->recv, d->rows, d->rows};
    bool on[3] = {true, d->rows != d->recv, d->local > 1};
    for (int k = 0; k < 3; k++) {
        if (!on[k])
            continue;
        move(S, t, meg_rows(S, hop[k], d), VP_CAT_TEMP);
        if (pr)
            move(S, pr, vp__mulc(S, hop[k], d->pb), VP_CAT_TEMP);
    }
}

/* A [rows, h] tensor back: the unsort, the reduce-scatter over etp, the
 * all-to-all (sent rows). */
static void meg_combine(sim *S, uint32_t *t, const meg_dims *d)
{
    if (d->local > 1)
        move(S, t, meg_rows(S, d->rows, d), VP_CAT_TEMP);
    if (d->rows != d->recv)
        move(S, t, meg_rows(S, d->recv, d), VP_CAT_TEMP);
    move(S, t, meg_rows(S, d->sent, d), VP_CAT_TEMP);
}

enum { ME_IDX, ME_FC1_IN, ME_FC1_OUT, ME_PROBS, ME_FC2_IN };

/* token_dispatcher.py MoEAlltoAllTokenDispatcher, dropless, unfused
 * permute (moe_utils.py permute, unpermute, sort_chunks_by_idxs):
 * routing_map.T.contiguous() (bool [E, n]) and probs.T.contiguous(); the
 * sorted indices (int64 [n k], kept for the unpermute); the permuted
 * tokens and probs [n k]; all_to_all over ep (rows / etp); gather_from_
 * sequence_parallel_region over etp (rows); sort_chunks_by_idxs by local
 * expert (more than one); experts.py TEGroupedMLP: linear_fc1 (saves its
 * input), the weighted SwiGLU on [rows, 2f] with the probs (saves both),
 * linear_fc2 (saves the activation [rows, f]); then back: unsort,
 * reduce_scatter over etp, all_to_all, unpermute into zeros [n, h]. */
static void meg_experts_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    meg_dims d = meg_dims_of(S, o, f->eb0, S->out_eb[o->inputs[1]]);
    uint64_t rh = meg_rows(S, d.rows, &d);
    uint64_t ne = vp__mulc(S, d.n, S->g->ops[o->inputs[1]].classes);
    vp__transient(S, ne);                    /* routing_map.T */
    uint32_t idx = vp__talloc(S, vp__mulc(S, d.sent, 8), VP_CAT_ACT);
    vp__transient(S, vp__mulc(S, ne, d.pb)); /* probs.T */
    uint32_t pr = vp__talloc(S, vp__mulc(S, d.sent, d.pb), VP_CAT_TEMP);
    uint32_t tok = vp__talloc(S, meg_rows(S, d.sent, &d), VP_CAT_TEMP);
    meg_dispatch(S, &tok, &pr, &d);
    uint64_t rf = vp__mulc(S, vp__mulc(S, d.rows, d.f), d.eb);
    uint32_t fc1 = vp__talloc(S, vp__mulc(S, rf, 2), VP_CAT_ACT);
    uint32_t act = vp__talloc(S, rf, VP_CAT_ACT);
    uint32_t fc2 = vp__talloc(S, rh, VP_CAT_TEMP);
    meg_combine(S, &fc2, &d);
    f->out = vp__talloc(S, meg_rows(S, d.n, &d), VP_CAT_ACT);
    vp__tunref(S, fc2);
    if (f->sv) {
        vp__save(S, f->i, ME_IDX, idx);
        vp__save(S, f->i, ME_FC1_IN, tok);
        vp__save(S, f->i, ME_FC1_OUT, fc1);
        vp__save(S, f->i, ME_PROBS, pr);
        vp__save(S, f->i, ME_FC2_IN, act);
    }
    uint32_t drop[] = {idx, tok, fc1, pr, act};
    for (size_t k = 0; k < sizeof drop / sizeof drop[0]; k++)
        vp__tunref(S, drop[k]);
}

/* The forward's hops in reverse: the unpermute's gather [n k, h], the
 * all-to-all, the gather over etp, the sort; linear_fc2's input grad
 * [rows, f] and weight grad; the SwiGLU's [rows, 2f] and the probs';
 * linear_fc1's input grad [rows, h] and weight grad; unsort, reduce-
 * scatter, all-to-all, the permute's index_add into zeros [n, h]; the
 * probs' gradient back through the dispatch to the router. */
static void meg_experts_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    uint32_t i = b->i, in1 = o->inputs[1];
    meg_dims d = meg_dims_of(S, o, b->eb0, S->out_eb[in1]);
    uint64_t rh = meg_rows(S, d.rows, &d);
    uint64_t rf = vp__mulc(S, vp__mulc(S, d.rows, d.f), d.eb);
    uint32_t g = b->gy;
    b->gy = NONE;
    move(S, &g, meg_rows(S, d.sent, &d), VP_CAT_TEMP);
    meg_dispatch(S, &g, NULL, &d);
    vp__weight_grad(S, o->params[1], false);
    move(S, &g, rf, VP_CAT_TEMP);
    vp__drop_saved(S, i, ME_FC2_IN);
    uint32_t gp = vp__talloc(S, vp__mulc(S, d.rows, d.pb), VP_CAT_TEMP);
    move(S, &g, vp__mulc(S, rf, 2), VP_CAT_TEMP);
    vp__drop_saved(S, i, ME_FC1_OUT);
    vp__drop_saved(S, i, ME_PROBS);
    vp__weight_grad(S, o->params[0], false);
    move(S, &g, rh, VP_CAT_TEMP);
    vp__drop_saved(S, i, ME_FC1_IN);
    meg_combine(S, &g, &d);
    move(S, &gp, vp__mulc(S, d.sent, d.pb), VP_CAT_TEMP);
    if (S->g->ops[in1].needs_grad)
        vp__give_grad(S, in1, vp__grad_like(S, in1, S->out_eb[in1]),
                      S->out_eb[in1]);
    vp__tunref(S, gp);
    if (b->ig0) {
        b->gx = vp__grad_like(S, b->in0, d.eb);
        b->gxe = d.eb;
    }
    vp__tunref(S, g);
}
