/* Op rules: elementwise ops and views. Activations (ATen kernels and HF's
 * Python gelu_new), rotary embedding, dropout, add and mul, pooling,
 * concat, softmax, and the views (flatten, reshape, permute, select).
 * docs/SIMULATION_NOTES.md §3.1-3.2, §3.5, §7, §11; PyTorch
 * aten/src/ATen/native/TensorIterator.cpp (output layout), Dropout.cpp
 * (native_dropout), tools/autograd/derivatives.yaml (what each backward
 * saves); transformers activations.py (NewGELUActivation). */
#include "../sim_internal.h"

/* What an activation saves: GELU and SiLU their input, ReLU, tanh and
 * sigmoid their output. */
enum { ACT_SAVED };
/* HF NewGELUActivation: 0.5*x, x.float(), tanh(...), 1 + tanh(...). */
enum { GT_HALF_X, GT_X_FLOAT, GT_TANH, GT_ONE_PLUS_TANH };
enum { DROPOUT_MASK };
enum { MUL_A, MUL_B };
enum { MAXPOOL_X, MAXPOOL_INDICES };
enum { SOFTMAX_OUT };

void vp__activation_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    if (o->inplace)
        vp__alias_input(S, f);
    else
        f->out = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
    if (f->sv)
        vp__save(S, f->i, ACT_SAVED,
                 (o->kind == VP_OP_GELU || o->kind == VP_OP_SILU)
                     ? S->out_t[f->in0]
                     : f->out);
}

/* HF NewGELUActivation: 0.5*x*(1+tanh(c*(x+0.044715*x^3))) as separate
 * kernels; pow is on autocast's fp32 list. Unsaved (no grad, or inside a
 * checkpoint) each temporary dies as soon as the expression no longer
 * needs it: x.float() after pow, tanh after 1+tanh, 0.5*x and 1+tanh
 * after the product. */
void vp__gelu_tanh_fwd(sim *S, vp__fwd_op *f)
{
    uint64_t n = f->n;
    uint8_t eb0 = f->eb0;
    bool sv = f->sv;
    uint8_t fe = S->amp ? 4 : eb0;
    uint32_t half = vp__talloc(S, vp__mulc(S, n, eb0), VP_CAT_ACT);
    uint32_t xf = vp__cast_input(S, f->in0, fe);
    uint32_t p = vp__talloc(S, vp__mulc(S, n, fe), VP_CAT_TEMP);
    if (!sv) {
        vp__tunref(S, xf);
        xf = NONE;
    }
    uint32_t q = vp__talloc(S, vp__mulc(S, n, fe), VP_CAT_TEMP);
    vp__tunref(S, p);
    uint32_t r = vp__talloc(S, vp__mulc(S, n, fe), VP_CAT_TEMP);
    vp__tunref(S, q);
    uint32_t c = vp__talloc(S, vp__mulc(S, n, fe), VP_CAT_TEMP);
    vp__tunref(S, r);
    uint32_t th = vp__talloc(S, vp__mulc(S, n, fe), VP_CAT_ACT);
    vp__tunref(S, c);
    uint32_t u = vp__talloc(S, vp__mulc(S, n, fe), VP_CAT_ACT);
    if (!sv) {
        vp__tunref(S, th);
        th = NONE;
    }
    f->oeb = fe;
    f->out = vp__talloc(S, vp__mulc(S, n, f->oeb), VP_CAT_ACT);
    if (sv) {
        vp__save(S, f->i, GT_HALF_X, half);
        vp__save(S, f->i, GT_X_FLOAT, xf);
        vp__save(S, f->i, GT_TANH, th);
        vp__save(S, f->i, GT_ONE_PLUS_TANH, u);
    }
    vp__tunref(S, half);
    vp__tunref(S, xf);
    vp__tunref(S, th);
    vp__tunref(S, u);
}

/* The autograd nodes of 0.5*x * (1 + tanh(c*(x + 0.044715*x^3))), run
 * from the last (highest sequence number) to the first, as traced
 * (docs/SIMULATION_NOTES.md §3.5). F: the fp32 width under autocast (pow
 * is on the fp32 list), X: x's width. */
void vp__gelu_tanh_bwd(sim *S, vp__bwd_op *b)
{
    uint32_t i = b->i;
    uint8_t eb0 = b->eb0;
    uint8_t fe = S->amp ? 4 : eb0;
    bool cast = fe != eb0;
    uint64_t nF = vp__mulc(S, b->n, fe), nX = vp__mulc(S, b->n, eb0);
    /* MulBackward0 (0.5x * u): both grads in F, 0.5x's cast to X */
    uint32_t ga = vp__talloc(S, nF, VP_CAT_TEMP);
    uint32_t gb = vp__talloc(S, nF, VP_CAT_TEMP);
    if (cast) {
        uint32_t a2 = vp__talloc(S, nX, VP_CAT_TEMP);
        vp__tunref(S, ga);
        ga = a2;
    }
    vp__tunref(S, b->gy);
    b->gy = NONE;
    vp__drop_saved(S, i, GT_ONE_PLUS_TANH);
    vp__drop_saved(S, i, GT_HALF_X);
    /* TanhBackward */
    uint32_t c = vp__talloc(S, nF, VP_CAT_TEMP);
    vp__tunref(S, gb);
    vp__drop_saved(S, i, GT_TANH);
    /* MulBackward0 (c * r) */
    uint32_t d = vp__talloc(S, nF, VP_CAT_TEMP);
    vp__tunref(S, c);
    /* AddBackward0 (x + q): x's share (cast to X) opens x's input buffer;
     * q's share passes through */
    uint32_t acc = d;
    if (cast)
        acc = vp__talloc(S, nX, VP_CAT_TEMP);
    else
        vp__tref(S, d);
    /* MulBackward0 (0.044715 * p) */
    uint32_t e = vp__talloc(S, nF, VP_CAT_TEMP);
    vp__tunref(S, d);
    /* PowBackward0: grad * 3 * x^2, three kernels */
    uint32_t t1 = vp__talloc(S, nF, VP_CAT_TEMP);
    uint32_t t2 = vp__talloc(S, nF, VP_CAT_TEMP);
    uint32_t t3 = vp__talloc(S, nF, VP_CAT_TEMP);
    vp__tunref(S, t1);
    vp__tunref(S, t2);
    vp__tunref(S, e);
    vp__drop_saved(S, i, GT_X_FLOAT);
    /* ToCopyBackward0 of x.float(); summed in place into the buffer */
    if (cast) {
        uint32_t g2 = vp__talloc(S, nX, VP_CAT_TEMP);
        vp__tunref(S, t3);
        t3 = g2;
    }
    vp__tunref(S, t3);
    /* MulBackward0 (0.5 * x), summed in place */
    uint32_t h = vp__talloc(S, nX, VP_CAT_TEMP);
    vp__tunref(S, ga);
    vp__tunref(S, h);
    if (b->ig0) {
        b->gx = acc;
        b->gxe = eb0;
    } else {
        vp__tunref(S, acc);
    }
}

/* The dtype of HF's cos and sin: the rotary embedding computes them in
 * fp32 and returns cos.to(x.dtype), sin.to(x.dtype), x the embedding's
 * output (transformers models/llama/modeling_llama.py and phi3/
 * modeling_phi3.py, *RotaryEmbedding.forward, called with inputs_embeds
 * in *Model.forward): fp32 for an fp32 embedding (also a quantized base's,
 * upcast by prepare_model_for_kbit_training), bf16 for a bf16 model under
 * autocast. A graph without a token embedding: fp32 under autocast. */
static uint8_t rotary_eb(const sim *S, uint8_t eb0)
{
    for (size_t i = 0; i < S->g->n_ops; i++)
        if (S->g->ops[i].kind == VP_OP_EMBEDDING && S->out_eb[i])
            return S->out_eb[i];
    return S->amp ? 4 : eb0;
}

/* HF apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, promoted to the
 * wider of q's and cos's dtypes (fp32 under autocast over an fp32 model,
 * q's bf16 over a bf16 one). */
void vp__rope_fwd(sim *S, vp__fwd_op *f)
{
    uint8_t re = vp__promote(f->eb0, rotary_eb(S, f->eb0));
    vp__transient(S, vp__mulc(S, f->n, re));
    vp__transient(S, vp__mulc(S, f->n, f->eb0));
    f->oeb = re;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
}

void vp__rope_bwd(sim *S, vp__bwd_op *b)
{
    vp__transient(S, vp__mulc(S, b->n, b->oeb));
    vp__elementwise_bwd(S, b);
}

/* HF's apply_rotary_pos_emb on one of q, k (modeling_llama.py:
 * q * cos + rotate_half(q) * sin, rotate_half = cat(-x2, x1) of two
 * slices): mul, neg, cat, mul, add, of which the rules allocate two
 * temporaries and the output: 2 launches more. The backward
 * (derivatives.yaml): AddBackward0 (none), grad * sin, CatBackward0
 * (views), NegBackward0 (1), SliceBackward0 for each half (zeros and a
 * copy into the slice: 2 each), grad * cos, and the sums of x's three
 * gradients (2): 9 kernels, of which the rules allocate a temporary and
 * x's gradient. */
double vp__rope_launches(const vp_graph *g, const vp_op *o, int ph,
                         bool wide)
{
    (void)g;
    (void)o;
    (void)wide;
    return ph == 0 ? 2.0 : 9.0 - 2.0;
}

/* native_dropout: the bool mask, then the output */
void vp__dropout_fwd(sim *S, vp__fwd_op *f)
{
    uint32_t m = vp__talloc(S, f->n, VP_CAT_ACT);
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
    if (f->sv)
        vp__save(S, f->i, DROPOUT_MASK, m);
    vp__tunref(S, m);
}

/* native_dropout's CUDA kernel writes the output and the mask in one
 * launch (aten/src/ATen/native/cuda/Dropout.cu dropout_cuda:
 * fused_dropout_kernel_vec takes both; the H200 profiles show one
 * fused_dropout_kernel_vec per nn.Dropout call): one launch fewer than
 * the forward's two allocations. Its backward (native_dropout_backward,
 * masked_scale_kernel) is its one allocation. */
double vp__dropout_launches(const vp_graph *g, const vp_op *o, int ph,
                            bool wide)
{
    (void)g;
    (void)o;
    (void)wide;
    return ph == 0 ? -1.0 : 0.0;
}

/* The widest input (and a learned operand's parameter dtype): type
 * promotion of a binary op. */
uint8_t vp__promoted_eb(const sim *S, const vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint8_t e = f->eb0;
    for (uint32_t j = 1; j < o->n_inputs; j++)
        e = vp__promote(e, S->out_eb[o->inputs[j]]);
    if (o->n_params)
        e = vp__promote(e, (uint8_t)vp__param_bytes(S, &S->g->params[o->params[0]]));
    return e;
}

/* add (also in place, or with a learned operand), mul (saves both
 * operands) */
void vp__binary_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    f->oeb = vp__promoted_eb(S, f);
    if (o->inplace)
        vp__alias_input(S, f);
    else
        f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    if (f->sv && o->kind == VP_OP_MUL) {
        vp__save(S, f->i, MUL_A, S->out_t[o->inputs[0]]);
        vp__save(S, f->i, MUL_B, S->out_t[o->inputs[1]]);
    }
}

/* add and concat pass the gradient through (concat as views); mul makes
 * one per operand. Broadcast operands get a reduced copy. */
void vp__binary_bwd(sim *S, vp__bwd_op *b)
{
    const vp_graph *g = S->g;
    const vp_op *o = b->o;
    for (uint32_t j = 0; j < o->n_inputs; j++) {
        uint32_t in = o->inputs[j];
        if (!g->ops[in].needs_grad)
            continue;
        bool learned_tokens = o->kind == VP_OP_CONCAT && o->n_params;
        if (!learned_tokens &&
            (o->kind == VP_OP_MUL || g->ops[in].numel != b->n)) {
            vp__give_grad(S, in, vp__grad_like(S, in, S->out_eb[in]),
                          S->out_eb[in]);
        } else {
            /* prepended learned tokens: the input's grad is a narrow
             * view of grad_out (a copy only to change the dtype) */
            vp__tref(S, b->gy);
            vp__give_grad_l(S, in, b->gy, b->oeb, b->gstr);
        }
    }
    for (uint32_t k = 0; k < o->n_params; k++)
        vp__weight_grad(S, o->params[k], false);
}

/* max_pool2d_with_indices: the output and its int64 indices; saves the
 * input and the indices */
void vp__maxpool_fwd(sim *S, vp__fwd_op *f)
{
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
    uint32_t idx = vp__talloc(S, vp__mulc(S, f->n, 8), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, f->i, MAXPOOL_X, S->out_t[f->in0]);
        vp__save(S, f->i, MAXPOOL_INDICES, idx);
    }
    vp__tunref(S, idx);
}

/* Average pooling and concat: a new contiguous output, nothing saved.
 * cat promotes to the widest input: ViT's class token (a fp32 parameter)
 * makes the joined tokens fp32 under autocast. */
void vp__join_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    if (o->kind == VP_OP_CONCAT && o->n_params)
        f->oeb = vp__promote(f->eb0, (uint8_t)vp__param_bytes(
                                          S, &S->g->params[o->params[0]]));
    f->ol = 0;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
}

/* softmax (fp32 under autocast) saves its output */
void vp__softmax_fwd(sim *S, vp__fwd_op *f)
{
    f->oeb = S->amp ? 4 : f->eb0;
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
    if (f->sv)
        vp__save(S, f->i, SOFTMAX_OUT, f->out);
}

/* flatten, reshape: a view, or a copy when dims are merged across a
 * permuted order */
void vp__reshape_fwd(sim *S, vp__fwd_op *f)
{
    if (S->lay[f->in0]) {
        f->out = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
        f->ol = 0;
        return;
    }
    vp__alias_input(S, f);
}

/* permute, select: views; a permute that reorders dims flips the layout */
void vp__view_fwd(sim *S, vp__fwd_op *f)
{
    if (f->o->flags & VP_OPF_STRIDED)
        f->ol ^= 1;
    vp__alias_input(S, f);
}

/* flatten, reshape, permute: the gradient passes through as a view.
 * Through a permute the grad's order flips; a reshape that copied gives
 * it back in the input's dims order. */
void vp__view_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    if (!b->ig0)
        return;
    vp__tref(S, b->gy);
    b->gx = b->gy;
    b->gxe = b->oeb;
    b->gxs = o->kind == VP_OP_PERMUTE
                 ? b->gstr ^ ((o->flags & VP_OPF_STRIDED) != 0)
                 : (S->lay[b->in0] ? false : b->gstr);
}

/* One gradient shaped like the input's (activations, dropout, softmax,
 * pooling, select: its backward makes the input-sized gradient). */
void vp__elementwise_bwd(sim *S, vp__bwd_op *b)
{
    if (b->ig0)
        b->gx = vp__grad_like(S, b->in0, b->eb0);
}

/* x * c by a constant tensor (Gemma's embedding scale): a new output;
 * MulBackward keeps the constant only. With VP_OPF_KV_COPY, HF
 * DynamicCache's copy cat([], x) (MLA's latent and rotary key): made and
 * kept by the cache only while it is on (use_cache: not under
 * checkpointing), else x itself. */
void vp__scale_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    if ((o->flags & VP_OPF_KV_COPY) &&
        (f->mode != MODE_SAVE || (o->segment >= 0 && S->ckpt[o->segment]))) {
        vp__alias_input(S, f);
        return;
    }
    f->out = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
    if (o->flags & VP_OPF_KV_COPY)
        vp__hold(S, f->out);
}

/* the constant's product makes a new gradient; the cache's cat hands on
 * a view */
void vp__scale_bwd(sim *S, vp__bwd_op *b)
{
    if (!(b->o->flags & VP_OPF_KV_COPY)) {
        vp__elementwise_bwd(S, b);
        return;
    }
    if (b->ig0) {
        vp__tref(S, b->gy);
        b->gx = b->gy;
        b->gxe = b->oeb;
    }
}

/* Gemma 2's final_logit_softcapping (modeling_gemma2.py,
 * Gemma2ForCausalLM.forward): logits / cap, tanh (saved by its
 * backward), * cap, each a new tensor in the logits' dtype. */
enum { SOFTCAP_TANH };

void vp__softcap_fwd(sim *S, vp__fwd_op *f)
{
    uint64_t bytes = vp__mulc(S, f->n, f->eb0);
    uint32_t d = vp__talloc(S, bytes, VP_CAT_TEMP);
    uint32_t th = vp__talloc(S, bytes, VP_CAT_ACT);
    vp__tunref(S, d);
    f->out = vp__talloc(S, bytes, VP_CAT_ACT);
    if (f->sv)
        vp__save(S, f->i, SOFTCAP_TANH, th);
    vp__tunref(S, th);
}

/* * cap, tanh and / cap backward: one new gradient each */
void vp__softcap_bwd(sim *S, vp__bwd_op *b)
{
    uint64_t bytes = vp__mulc(S, b->n, b->oeb);
    uint32_t g1 = vp__talloc(S, bytes, VP_CAT_TEMP);
    vp__tunref(S, b->gy);
    b->gy = NONE;
    uint32_t g2 = vp__talloc(S, bytes, VP_CAT_TEMP);
    vp__tunref(S, g1);
    vp__drop_saved(S, b->i, SOFTCAP_TANH);
    if (b->ig0) {
        b->gx = vp__talloc(S, bytes, VP_CAT_TEMP);
        b->gxe = b->oeb;
    }
    vp__tunref(S, g2);
}
