/* Op rules: linear layers over a quantized base, as bitsandbytes 0.49
 * keeps and runs them (docs/FINETUNING.md; bitsandbytes is not installed
 * on the H200 the ground truth was measured on: these rules are read from
 * its source, not measured).
 *
 * 4-bit (NF4, FP4; bitsandbytes/nn/modules.py Params4bit._quantize,
 * functional.py quantize_4bit): the weight packed two values a byte, an
 * fp32 absmax per block of 64 values and the 16-value code table; with
 * double quantization (compress_statistics) the absmax is stored as uint8
 * in blocks of 256 with their own fp32 absmax, a 256-value fp32 code copy
 * and the mean it was centred on. Forward (Linear4bit.forward,
 * autograd/_functions.py MatMul4Bit): x cast to the compute dtype, the
 * weight dequantized whole into a temporary (functional.py
 * dequantize_4bit, after the absmax when nested), F.linear, the output
 * cast back to x's dtype; the autograd node keeps only the packed weight.
 * Backward: the weight dequantized again, grad_x = grad @ W.
 * (bitsandbytes 0.50 runs fused 4-bit GEMM kernels for at most 512
 * tokens on Hopper-class GPUs without the forward's temporary; larger
 * batches take this path.)
 *
 * 8-bit (LLM.int8, Linear8bitLt with has_fp16_weights=False, threshold
 * 6.0; Int8Params._quantize, functional.int8_vectorwise_quant,
 * autograd/_functions.py MatMul8bitLt): int8 rows and an fp32 scale per
 * output row. Forward: x cast to fp16, its outliers found (|x| >= 6: an
 * fp16 and a bool temporary), x quantized per row (int8 and fp32 row
 * scales), the int8 GEMM into int32, dequantized into the output; the
 * node keeps x. Backward: the weight dequantized (CB.to(dtype) * SCB /
 * 127), grad_x = grad @ W. */
#include "../sim_internal.h"

#define BNB_BLOCK4 64u      /* values per 4-bit absmax block            */
#define BNB_BLOCK2 256u     /* values per block of the nested absmax    */
#define BNB_CODE4 64u       /* the 16-value fp32 NF4/FP4 table          */
#define BNB_CODE8 1024u     /* the 256-value fp32 dynamic map           */
#define BNB_SCALAR 4u       /* a 0-dim fp32 tensor (the nested offset)  */

static uint64_t blocks(uint64_t n, uint64_t b)
{
    return n / b + (n % b != 0);
}

/* The op whose weight p is. */
static const vp_op *owner(const vp_graph *g, uint32_t p)
{
    return &g->ops[g->params[p].op];
}

uint64_t vp__quant_bytes(const vp_graph *g, uint32_t p, bool nested)
{
    const vp_param *pp = &g->params[p];
    uint64_t n = pp->numel, b4 = blocks(n, BNB_BLOCK4), r;

    if (pp->quant == VP_QUANT_INT8) {
        /* n <= 2^40 and out_features <= 2^40: no overflow */
        return n + owner(g, p)->out_features * 4;
    }
    r = n / 2 + n % 2 + BNB_CODE4;
    if (!nested)
        return r + b4 * 4;
    return r + b4 + blocks(b4, BNB_BLOCK2) * 4 + BNB_CODE8 + BNB_SCALAR;
}

/* A quantized weight as from_pretrained loads it: its copy in the load
 * dtype arrives on the GPU, is quantized (with quantize_4bit's or
 * int8_vectorwise_quant's outputs and temporaries), and is freed. */
void vp__quant_load(sim *S, uint32_t p)
{
    const vp_param *pp = &S->g->params[p];
    uint64_t n = pp->numel, b4 = blocks(n, BNB_BLOCK4);

    if (pp->quant == VP_QUANT_INT8) {
        /* B.to(device, float16); row_stats, then the int8 rows */
        uint32_t w = vp__talloc(S, vp__mulc(S, n, 2), VP_CAT_TEMP);
        vp__talloc(S, vp__mulc(S, owner(S->g, p)->out_features, 4),
                   VP_CAT_PARAM);
        vp__talloc(S, n, VP_CAT_PARAM);
        vp__tunref(S, w);
        return;
    }
    uint32_t w = vp__talloc(S, vp__mulc(S, n, S->PE), VP_CAT_TEMP);
    uint32_t am = vp__talloc(S, vp__mulc(S, b4, 4), VP_CAT_PARAM);
    vp__talloc(S, n / 2 + n % 2, VP_CAT_PARAM);
    vp__talloc(S, BNB_CODE4, VP_CAT_PARAM);
    if (S->s->ft.double_quant) {
        /* offset = absmax.mean(); quantize_blockwise(absmax - offset,
         * 256): its fp32 absmax, the uint8 values, a copy of the code */
        vp__talloc(S, BNB_SCALAR, VP_CAT_PARAM);
        uint32_t c = vp__talloc(S, vp__mulc(S, b4, 4), VP_CAT_TEMP);
        vp__talloc(S, vp__mulc(S, blocks(b4, BNB_BLOCK2), 4), VP_CAT_PARAM);
        vp__talloc(S, b4, VP_CAT_PARAM);
        vp__talloc(S, BNB_CODE8, VP_CAT_PARAM);
        vp__tunref(S, c);
        vp__tunref(S, am); /* del _absmax */
    }
    vp__tunref(S, w);
}

/* The dequantized weight, n values of eb bytes (owned): the nested
 * absmax first (dequantize_blockwise, fp32, the offset added in place;
 * freed at once), then the weight in the dtype it was loaded in, cast to
 * eb if that differs. */
static uint32_t dequant(sim *S, uint32_t p, uint8_t eb)
{
    const vp_param *pp = &S->g->params[p];
    uint64_t n = pp->numel;
    uint32_t am = NONE, w;

    if (pp->quant == VP_QUANT_INT8) {
        /* CB.to(dtype, copy=True).mul_(SCB.unsqueeze(1).mul(1 / 127)) */
        w = vp__talloc(S, vp__mulc(S, n, eb), VP_CAT_TEMP);
        vp__transient(S, vp__mulc(S, owner(S->g, p)->out_features, 4));
        return w;
    }
    if (S->s->ft.double_quant)
        am = vp__talloc(S, vp__mulc(S, blocks(n, BNB_BLOCK4), 4), VP_CAT_TEMP);
    w = vp__talloc(S, vp__mulc(S, n, S->PE), VP_CAT_TEMP);
    vp__tunref(S, am);
    if (S->PE != eb) {
        uint32_t c = vp__talloc(S, vp__mulc(S, n, eb), VP_CAT_TEMP);
        vp__tunref(S, w);
        w = c;
    }
    return w;
}

/* The compute dtype of a quantized layer: autocast's, else the half base
 * dtype (bnb_4bit_compute_dtype as QLoRA sets it); fp32 otherwise. */
static uint8_t compute_bytes(const sim *S)
{
    return S->amp || S->PE == 2 ? 2 : 4;
}

void vp__quant_linear_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    uint32_t p = o->params[0], in0 = f->in0;
    const vp_param *pp = &S->g->params[p];
    const vp_op *xo = &S->g->ops[in0];
    bool int8 = pp->quant == VP_QUANT_INT8;
    uint8_t ce = int8 ? 2 : compute_bytes(S);
    uint64_t nx = xo->numel;
    /* x.to(compute_dtype) (LLM.int8: A.to(float16) for the quantization) */
    uint32_t x = vp__cast_input(S, in0, ce);
    if (int8) {
        /* outliers = A.abs() >= threshold; row stats; int8 rows */
        vp__transient(S, vp__mulc(S, nx, 2));
        vp__transient(S, nx);
        uint64_t rows = o->in_features ? nx / o->in_features : 0;
        uint32_t rs = vp__talloc(S, vp__mulc(S, rows, 4), VP_CAT_TEMP);
        uint32_t q = vp__talloc(S, nx, VP_CAT_TEMP);
        vp__tunref(S, x);
        /* int8 GEMM into int32, dequantized into x's dtype; the node
         * keeps x itself */
        uint32_t acc = vp__talloc(S, vp__mulc(S, f->n, 4), VP_CAT_TEMP);
        f->oeb = f->eb0;
        f->out = vp__talloc(S, vp__mulc(S, f->n, f->oeb), VP_CAT_ACT);
        vp__tunref(S, acc);
        vp__tunref(S, q);
        vp__tunref(S, rs);
        if (f->sv)
            vp__save(S, f->i, 0, S->out_t[in0]);
        return;
    }
    if (o->n_params > 1) /* bias.to(compute_dtype) */
        vp__transient(S, vp__mulc(S, S->g->params[o->params[1]].numel, ce));
    uint32_t w = dequant(S, p, ce);
    uint32_t y = vp__talloc(S, vp__mulc(S, f->n, ce), VP_CAT_ACT);
    vp__tunref(S, w);
    vp__tunref(S, x);
    f->oeb = f->eb0;
    if (ce != f->eb0) { /* .to(inp_dtype) */
        f->out = vp__talloc(S, vp__mulc(S, f->n, f->eb0), VP_CAT_ACT);
        vp__tunref(S, y);
    } else {
        f->out = y;
    }
}

void vp__quant_linear_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    uint32_t p = o->params[0];
    bool int8 = S->g->params[p].quant == VP_QUANT_INT8;
    uint8_t ce = int8 ? b->eb0 : compute_bytes(S);
    uint32_t g = b->gy;
    b->gy = NONE;
    if (!b->ig0) {
        vp__tunref(S, g);
        return;
    }
    if (!int8 && ce != b->oeb) { /* ToCopyBackward of .to(inp_dtype) */
        uint32_t c = vp__talloc(S, vp__mulc(S, b->n, ce), VP_CAT_TEMP);
        vp__tunref(S, g);
        g = c;
    }
    uint32_t w = dequant(S, p, ce);
    uint32_t gx = vp__grad_like(S, b->in0, ce);
    vp__tunref(S, w);
    vp__tunref(S, g);
    b->gx = gx;
    b->gxe = ce;
}
