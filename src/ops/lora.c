/* Op rules: a LoRA adapter on a linear layer, as peft 0.21 runs it
 * (peft/tuners/lora/layer.py, Linear.forward; docs/FINETUNING.md):
 *
 *   result = base_layer(x)                      (the op inputs[1])
 *   x = self._cast_input_dtype(x, lora_A.weight.dtype)
 *   result = result + lora_B(lora_A(dropout(x))) * scaling
 *   result = result.to(torch_result_dtype)
 *
 * The cast is a copy when x is not in the adapters' dtype (fp32 adapters
 * over a bf16 base: peft's autocast_adapter_dtype); the Python variable
 * keeps it until the forward returns. lora_A and lora_B are bias-free
 * nn.Linear: under autocast their fp32 weights are cast to the compute
 * dtype (cached) and their input is cast too; lora_A saves its input for
 * its weight gradient, lora_B saves lora_A's output. DoRA (use_dora) adds
 * its magnitude and weight norm (peft/tuners/lora/dora.py,
 * DoraLinearLayer.forward; variants.py, DoraLinearVariant.forward). */
#include "../sim_internal.h"

/* What the adapter's forward saves: the dropout mask, lora_A's input
 * (its cast under autocast) and weight cast, lora_B's input and weight
 * cast. */
enum { LORA_MASK, LORA_AX, LORA_AW, LORA_BX, LORA_BW };

/* The sizes and dtypes of one adapter. */
typedef struct {
    uint8_t ex, ey;   /* bytes per element: x, the base layer's output     */
    uint8_t ae;       /* the adapters' dtype                                */
    uint8_t ce;       /* lora_A's and lora_B's matmul dtype (autocast: 2)   */
    uint8_t es;       /* result + lora: promoted                            */
    uint64_t nin, nr, nout; /* elements of x, of lora_A's and of the output */
    uint32_t pa, pb;  /* lora_A.weight, lora_B.weight                       */
    bool xg;          /* x requires a gradient                              */
} lora_dims;

static lora_dims dims_of(sim *S, const vp_op *o)
{
    const vp_graph *g = S->g;
    lora_dims d;
    uint32_t x = o->inputs[0], y = o->inputs[1];
    uint64_t rows = o->out_features ? o->numel / o->out_features : 0;

    d.pa = o->params[0];
    d.pb = o->params[1];
    d.ex = S->out_eb[x];
    d.ey = S->out_eb[y];
    d.ae = (uint8_t)vp__param_bytes(S, &g->params[d.pa]);
    d.ce = S->amp ? 2 : d.ae;
    d.es = vp__promote(d.ey, d.ce);
    d.nin = vp__mulc(S, rows, o->in_features);
    d.nr = o->in_features ? vp__mulc(S, rows, g->params[d.pa].numel /
                                                  o->in_features)
                          : 0;
    d.nout = o->numel;
    d.xg = g->ops[x].needs_grad;
    return d;
}

/* lora_A(dropout(xa)) -> lora_B -> * scaling: the scaled output (owned). */
static uint32_t adapter_fwd(sim *S, vp__fwd_op *f, const lora_dims *d,
                            uint32_t xa)
{
    uint32_t i = f->i, dx = xa;
    if (f->o->dropout > 0.0) {
        /* native_dropout: the mask, then the output; the mask is kept when
         * the input requires a gradient */
        uint32_t m = vp__talloc(S, d->nin, VP_CAT_ACT);
        dx = vp__talloc(S, vp__mulc(S, d->nin, d->ae), VP_CAT_ACT);
        if (f->sv && d->xg)
            vp__save(S, i, LORA_MASK, m);
        vp__tunref(S, m);
    } else {
        vp__tref(S, dx);
    }
    /* lora_A: autocast casts W, then x (F.linear casts right to left) */
    uint32_t wa = vp__weight_cast(S, d->pa);
    uint32_t xin = d->ae == d->ce
                       ? (vp__tref(S, dx), dx)
                       : vp__talloc(S, vp__mulc(S, d->nin, d->ce), VP_CAT_ACT);
    uint32_t a = vp__talloc(S, vp__mulc(S, d->nr, d->ce), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, i, LORA_AX, xin);
        if (d->xg)
            vp__save(S, i, LORA_AW, wa);
    }
    vp__tunref(S, xin);
    vp__tunref(S, dx);
    /* lora_B */
    uint32_t wb = vp__weight_cast(S, d->pb);
    uint32_t b = vp__talloc(S, vp__mulc(S, d->nout, d->ce), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, i, LORA_BX, a);
        vp__save(S, i, LORA_BW, wb);
    }
    vp__tunref(S, a);
    uint32_t s = vp__talloc(S, vp__mulc(S, d->nout, d->ce), VP_CAT_ACT);
    vp__tunref(S, b);
    return s;
}

void vp__lora_fwd(sim *S, vp__fwd_op *f)
{
    const vp_op *o = f->o;
    lora_dims d = dims_of(S, o);
    uint32_t x = S->out_t[o->inputs[0]];
    /* x = self._cast_input_dtype(x, lora_A.weight.dtype) */
    uint32_t xa = d.ex == d.ae
                      ? (vp__tref(S, x), x)
                      : vp__talloc(S, vp__mulc(S, d.nin, d.ae), VP_CAT_ACT);
    uint32_t s = adapter_fwd(S, f, &d, xa);
    uint32_t sum = vp__talloc(S, vp__mulc(S, d.nout, d.es), VP_CAT_ACT);
    vp__tunref(S, s);
    f->oeb = d.ey;
    f->ol = 0;
    if (d.es != d.ey) { /* result.to(torch_result_dtype) */
        f->out = vp__talloc(S, vp__mulc(S, d.nout, d.ey), VP_CAT_ACT);
        vp__tunref(S, sum);
    } else {
        f->out = sum;
    }
    vp__tunref(S, xa);
}

/* The gradient of a bias-free F.linear (MmBackward): the weight's, then
 * the input's (when it requires one); the grad_out and the saved input
 * and weight cast are dropped; the weight's gradient goes to
 * AccumulateGrad (through ToCopyBackward under autocast) after the
 * input's ToCopyBackward (to_eb: the dtype the input had before
 * autocast's cast). Returns the input's gradient (owned) or NONE. */
static uint32_t adapter_linear_bwd(sim *S, uint32_t op, uint32_t p,
                                   uint32_t gy, uint64_t nx, bool xg,
                                   uint8_t ce, uint8_t to_eb,
                                   uint32_t slot_x, uint32_t slot_w)
{
    const vp_param *pp = &S->g->params[p];
    uint32_t gw = vp__talloc(S, vp__mulc(S, pp->numel, ce), VP_CAT_TEMP);
    uint32_t gx = xg ? vp__talloc(S, vp__mulc(S, nx, ce), VP_CAT_TEMP) : NONE;
    vp__tunref(S, gy);
    vp__drop_saved(S, op, slot_x);
    vp__drop_saved(S, op, slot_w);
    if (gx != NONE && to_eb != ce) {
        uint32_t c = vp__talloc(S, vp__mulc(S, nx, to_eb), VP_CAT_TEMP);
        vp__tunref(S, gx);
        gx = c;
    }
    vp__param_grad_cast(S, p, gw);
    return gx;
}

void vp__lora_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    lora_dims d = dims_of(S, o);
    uint32_t g = b->gy;
    b->gy = NONE;
    if (d.es != d.ey) { /* ToCopyBackward of result.to(...) */
        uint32_t c = vp__talloc(S, vp__mulc(S, d.nout, d.es), VP_CAT_TEMP);
        vp__tunref(S, g);
        g = c;
    }
    /* AddBackward: the same gradient to the base layer's output */
    vp__tref(S, g);
    vp__give_grad(S, o->inputs[1], g, d.es);
    /* MulBackward (* scaling) */
    uint32_t gs = vp__talloc(S, vp__mulc(S, d.nout, d.ce), VP_CAT_TEMP);
    vp__tunref(S, g);
    uint32_t ga = adapter_linear_bwd(S, b->i, d.pb, gs, d.nr, true, d.ce,
                                     d.ce, LORA_BX, LORA_BW);
    uint32_t gx = adapter_linear_bwd(S, b->i, d.pa, ga, d.nin, d.xg, d.ce,
                                     d.ae, LORA_AX, LORA_AW);
    if (gx != NONE && o->dropout > 0.0) { /* NativeDropoutBackward */
        uint32_t c = vp__talloc(S, vp__mulc(S, d.nin, d.ae), VP_CAT_TEMP);
        vp__tunref(S, gx);
        vp__drop_saved(S, b->i, LORA_MASK);
        gx = c;
    }
    if (gx != NONE && d.ex != d.ae) { /* ToCopyBackward of the cast */
        uint32_t c = vp__talloc(S, vp__mulc(S, d.nin, d.ex), VP_CAT_TEMP);
        vp__tunref(S, gx);
        gx = c;
    }
    b->gx = gx;
    b->gxe = d.ex;
}
