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

/* What the adapter's forward saves, in the order it saves them: the
 * dropout mask, lora_A's input (its cast under autocast) and weight cast,
 * lora_B's input and weight cast. DoRA's forward saves, besides: the
 * weight norm and magnitude / norm (the magnitude's gradient), the LoRA
 * result, the base weight's cast and the base result (its F.linear on the
 * dropped input) and (magnitude / norm - 1). */
enum { LORA_MASK, LORA_AX, LORA_AW, LORA_BX, LORA_BW };
enum {
    DORA_MASK, DORA_NORM, DORA_MAG, DORA_AX, DORA_AW, DORA_BX, DORA_BW,
    DORA_LRES, DORA_WCAST, DORA_BASE, DORA_M1
};

/* The slots of lora_A's and lora_B's saves. */
typedef struct {
    uint32_t ax, aw, bx, bw;
} ab_slots;

static const ab_slots LORA_SLOTS = {LORA_AX, LORA_AW, LORA_BX, LORA_BW};
static const ab_slots DORA_SLOTS = {DORA_AX, DORA_AW, DORA_BX, DORA_BW};

/* The sizes and dtypes of one adapter. */
typedef struct {
    uint8_t ex, ey;   /* bytes per element: x, the base layer's output     */
    uint8_t ae;       /* the adapters' dtype                                */
    uint8_t ce;       /* lora_A's and lora_B's matmul dtype (autocast: 2)   */
    uint8_t es;       /* result + lora: promoted                            */
    uint64_t nin, nr, nout; /* elements of x, of lora_A's and of the output */
    uint64_t nw;      /* elements of the base weight                        */
    uint32_t pa, pb, pm; /* lora_A.weight, lora_B.weight, the magnitude    */
    uint32_t pw;      /* the base weight                                    */
    bool xg;          /* x requires a gradient                              */
    bool dora;
} lora_dims;

static lora_dims dims_of(sim *S, const vp_op *o)
{
    const vp_graph *g = S->g;
    lora_dims d;
    uint32_t x = o->inputs[0], y = o->inputs[1];
    uint64_t rows = o->out_features ? o->numel / o->out_features : 0;

    d.pa = o->params[0];
    d.pb = o->params[1];
    d.dora = o->n_params > 2;
    d.pm = d.dora ? o->params[2] : NONE;
    d.pw = g->ops[y].params[0];
    d.ex = S->out_eb[x];
    d.ey = S->out_eb[y];
    d.ae = (uint8_t)vp__param_bytes(S, &g->params[d.pa]);
    d.ce = S->amp ? 2 : d.ae;
    /* DoRA's result is fp32 (magnitude / norm is): result + it promotes */
    d.es = vp__promote(d.ey, d.dora ? d.ae : d.ce);
    d.nin = vp__mulc(S, rows, o->in_features);
    d.nr = o->in_features ? vp__mulc(S, rows, g->params[d.pa].numel /
                                                  o->in_features)
                          : 0;
    d.nout = o->numel;
    d.nw = g->params[d.pw].numel;
    d.xg = g->ops[x].needs_grad;
    return d;
}

/* dropout(xa): the output (owned) and the mask, kept when the input
 * requires a gradient (native_dropout: the mask, then the output). */
static uint32_t dropout_fwd(sim *S, vp__fwd_op *f, const lora_dims *d,
                            uint32_t xa, uint32_t slot)
{
    if (f->o->dropout <= 0.0) {
        vp__tref(S, xa);
        return xa;
    }
    vp__written_by(S, false); /* one kernel writes both */
    uint32_t m = vp__talloc(S, d->nin, VP_CAT_ACT);
    uint32_t dx = vp__talloc(S, vp__mulc(S, d->nin, d->ae), VP_CAT_ACT);
    if (f->sv && d->xg)
        vp__save(S, f->i, slot, m);
    vp__tunref(S, m);
    return dx;
}

/* lora_B(lora_A(dx)): lora_B's output (owned). Autocast casts each
 * weight, then the input (F.linear casts right to left). */
static uint32_t ab_fwd(sim *S, vp__fwd_op *f, const lora_dims *d,
                       uint32_t dx, const ab_slots *sl)
{
    uint32_t i = f->i;
    uint32_t wa = vp__weight_cast(S, d->pa);
    uint32_t xin = d->ae == d->ce
                       ? (vp__tref(S, dx), dx)
                       : vp__talloc(S, vp__mulc(S, d->nin, d->ce), VP_CAT_ACT);
    vp__written_by(S, true);
    uint32_t a = vp__talloc(S, vp__mulc(S, d->nr, d->ce), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, i, sl->ax, xin);
        if (d->xg)
            vp__save(S, i, sl->aw, wa);
    }
    vp__tunref(S, xin);
    uint32_t wb = vp__weight_cast(S, d->pb);
    vp__written_by(S, true);
    uint32_t b = vp__talloc(S, vp__mulc(S, d->nout, d->ce), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, i, sl->bx, a);
        vp__save(S, i, sl->bw, wb);
    }
    vp__tunref(S, a);
    return b;
}

/* lora_B(lora_A(dropout(xa))) * scaling: the scaled output (owned). */
static uint32_t adapter_fwd(sim *S, vp__fwd_op *f, const lora_dims *d,
                            uint32_t xa)
{
    uint32_t dx = dropout_fwd(S, f, d, xa, LORA_MASK);
    uint32_t b = ab_fwd(S, f, d, dx, &LORA_SLOTS);
    vp__tunref(S, dx);
    uint32_t s = vp__talloc(S, vp__mulc(S, d->nout, d->ce), VP_CAT_ACT);
    vp__tunref(S, b);
    return s;
}

/* DoRA's weight norm (dora.py, get_lora_weight and get_weight_norm): the
 * LoRA weight made through the adapters from an identity matrix in the
 * adapters' dtype (x_eye, and its cast under autocast; the graph of
 * lora_A(x_eye), never used for a gradient, lives until the forward
 * returns: the tensors in *keep), .to(x.dtype); the base weight
 * .to(x.dtype); W + scaling * lora_weight; its row norms. */
static uint32_t dora_norm(sim *S, const vp_op *o, const lora_dims *d,
                          uint32_t keep[4])
{
    uint64_t in = o->in_features, out = o->out_features;
    uint64_t ii = vp__mulc(S, in, in), io = vp__mulc(S, in, out);
    uint64_t ir = vp__mulc(S, in, S->g->params[d->pa].numel / (in ? in : 1));
    uint32_t eye = vp__talloc(S, vp__mulc(S, ii, d->ae), VP_CAT_TEMP);
    vp__weight_cast(S, d->pa);
    keep[0] = d->ae != d->ce ? vp__talloc(S, vp__mulc(S, ii, d->ce), VP_CAT_TEMP)
                             : NONE;
    vp__written_by(S, true);
    keep[1] = vp__talloc(S, vp__mulc(S, ir, d->ce), VP_CAT_TEMP);
    vp__weight_cast(S, d->pb);
    vp__written_by(S, true);
    uint32_t lw = vp__talloc(S, vp__mulc(S, io, d->ce), VP_CAT_TEMP);
    vp__tunref(S, eye);
    keep[2] = lw;
    if (d->ce != d->ae) { /* lora_weight.to(x.dtype) */
        keep[2] = vp__talloc(S, vp__mulc(S, io, d->ae), VP_CAT_TEMP);
        vp__tunref(S, lw);
    }
    uint32_t pwe = (uint32_t)vp__param_bytes(S, &S->g->params[d->pw]);
    keep[3] = pwe != d->ae ? vp__talloc(S, vp__mulc(S, d->nw, d->ae),
                                        VP_CAT_TEMP)
                           : NONE;
    uint32_t sc = vp__talloc(S, vp__mulc(S, io, d->ae), VP_CAT_TEMP);
    uint32_t sum = vp__talloc(S, vp__mulc(S, io, d->ae), VP_CAT_TEMP);
    vp__tunref(S, sc);
    uint32_t norm = vp__talloc(S, vp__mulc(S, out, d->ae), VP_CAT_ACT);
    vp__tunref(S, sum);
    return norm;
}

/* DoRA (peft 0.21 variants.py DoraLinearVariant.forward, dora.py
 * DoraLinearLayer.forward) on the cast x: the dropout, the weight norm,
 * magnitude / norm, the LoRA result, the base result (with dropout: a
 * second F.linear of the dropped input over the base weight's copy; the
 * base layer's output otherwise), (m / n - 1) * base + m / n * lora *
 * scaling (fp32), then result + it. Returns that sum (owned). */
static uint32_t dora_fwd(sim *S, vp__fwd_op *f, const lora_dims *d,
                         uint32_t xa)
{
    const vp_op *o = f->o;
    uint32_t i = f->i, keep[4];
    uint64_t out = o->out_features;
    uint32_t dx = dropout_fwd(S, f, d, xa, DORA_MASK);
    uint32_t norm = dora_norm(S, o, d, keep);
    uint32_t mag = vp__talloc(S, vp__mulc(S, out, d->ae), VP_CAT_ACT);
    if (f->sv) {
        vp__save(S, i, DORA_NORM, norm);
        vp__save(S, i, DORA_MAG, mag);
    }
    uint32_t lr = ab_fwd(S, f, d, dx, &DORA_SLOTS);
    if (f->sv)
        vp__save(S, i, DORA_LRES, lr);
    uint32_t base = S->out_t[o->inputs[1]];
    vp__tref(S, base);
    if (o->dropout > 0.0) { /* F.linear(x, weight) on the dropped x */
        uint32_t w = d->ae != d->ce ? vp__talloc(S, vp__mulc(S, d->nw, d->ce),
                                                 VP_CAT_ACT)
                                    : NONE;
        uint32_t xc = d->ae != d->ce ? vp__talloc(S, vp__mulc(S, d->nin, d->ce),
                                                  VP_CAT_TEMP)
                                     : NONE;
        vp__tunref(S, base);
        vp__written_by(S, true);
        base = vp__talloc(S, vp__mulc(S, d->nout, d->ce), VP_CAT_ACT);
        vp__tunref(S, xc);
        if (f->sv && d->xg)
            vp__save(S, i, DORA_WCAST, w);
        vp__tunref(S, w);
    }
    uint32_t m1 = vp__talloc(S, vp__mulc(S, out, d->ae), VP_CAT_ACT);
    uint64_t nb = vp__mulc(S, d->nout, d->ae);
    uint32_t t1 = vp__talloc(S, nb, VP_CAT_TEMP);
    uint32_t t2 = vp__talloc(S, nb, VP_CAT_TEMP);
    uint32_t t3 = vp__talloc(S, nb, VP_CAT_TEMP);
    vp__tunref(S, t2);
    uint32_t dr = vp__talloc(S, nb, VP_CAT_TEMP);
    vp__tunref(S, t1);
    vp__tunref(S, t3);
    if (f->sv) {
        vp__save(S, i, DORA_BASE, base);
        if (d->xg)
            vp__save(S, i, DORA_M1, m1);
    }
    vp__tunref(S, m1);
    vp__tunref(S, base);
    vp__tunref(S, lr);
    vp__tunref(S, mag);
    vp__tunref(S, norm);
    for (int k = 0; k < 4; k++) /* the LoRA weight's graph and copies */
        vp__tunref(S, keep[k]);
    uint32_t sum = vp__talloc(S, vp__mulc(S, d->nout, d->es), VP_CAT_ACT);
    vp__tunref(S, dr);
    vp__tunref(S, dx);
    return sum;
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
    uint32_t sum;
    if (d.dora) {
        sum = dora_fwd(S, f, &d, xa);
    } else {
        uint32_t s = adapter_fwd(S, f, &d, xa);
        sum = vp__talloc(S, vp__mulc(S, d.nout, d.es), VP_CAT_ACT);
        vp__tunref(S, s);
    }
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
    vp__written_by(S, true);
    uint32_t gw = vp__talloc(S, vp__mulc(S, pp->numel, ce), VP_CAT_TEMP);
    uint32_t gx = NONE;
    if (xg) {
        vp__written_by(S, true);
        gx = vp__talloc(S, vp__mulc(S, nx, ce), VP_CAT_TEMP);
    }
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

/* gx (owned, may be NONE) plus a second gradient of the same tensor:
 * summed into the first. */
static uint32_t sum_grad(sim *S, uint32_t gx, uint32_t more)
{
    if (gx == NONE)
        return more;
    vp__tunref(S, more);
    return gx;
}

/* DoRA's tail in reverse (the engine's order: the scaling, magnitude /
 * norm * lora, (m / n - 1) * base, then the base F.linear on the dropped
 * x, lora_B, lora_A, the magnitude's division): from the gradient g of
 * its fp32 result (owned) to the dropped x's gradient (owned, or NONE);
 * with no dropout the base result's share goes to the base layer. */
static uint32_t dora_bwd(sim *S, vp__bwd_op *b, const lora_dims *d,
                         uint32_t g)
{
    const vp_op *o = b->o;
    uint32_t i = b->i;
    uint64_t nb = vp__mulc(S, d->nout, d->ae), out = o->out_features;
    uint32_t g3 = vp__talloc(S, nb, VP_CAT_TEMP); /* * scaling */
    vp__transient(S, nb);                         /* g3 * lora, summed   */
    uint32_t glr = vp__talloc(S, nb, VP_CAT_TEMP);
    vp__tunref(S, g3);
    if (d->ae != d->ce) { /* the LoRA result was in the compute dtype */
        uint32_t c = vp__talloc(S, vp__mulc(S, d->nout, d->ce), VP_CAT_TEMP);
        vp__tunref(S, glr);
        glr = c;
    }
    vp__transient(S, nb); /* g * base, summed for (m / n - 1)         */
    uint32_t gb = NONE;
    if (d->xg) {
        gb = vp__talloc(S, nb, VP_CAT_TEMP);
        if (d->ae != d->ce) {
            uint32_t c = vp__talloc(S, vp__mulc(S, d->nout, d->ce),
                                    VP_CAT_TEMP);
            vp__tunref(S, gb);
            gb = c;
        }
    }
    vp__tunref(S, g);
    vp__drop_saved(S, i, DORA_BASE);
    vp__drop_saved(S, i, DORA_M1);
    uint32_t gx = NONE;
    if (gb != NONE && o->dropout > 0.0) { /* base F.linear: grad_x */
        vp__written_by(S, true);
        gx = vp__talloc(S, vp__mulc(S, d->nin, d->ce), VP_CAT_TEMP);
        vp__tunref(S, gb);
        vp__drop_saved(S, i, DORA_WCAST);
        if (d->ce != d->ae) {
            uint32_t c = vp__talloc(S, vp__mulc(S, d->nin, d->ae), VP_CAT_TEMP);
            vp__tunref(S, gx);
            gx = c;
        }
    } else if (gb != NONE) {
        vp__give_grad(S, o->inputs[1], gb, d->ce);
    }
    uint32_t ga = adapter_linear_bwd(S, i, d->pb, glr, d->nr, true, d->ce,
                                     d->ce, DORA_BX, DORA_BW);
    uint32_t gl = adapter_linear_bwd(S, i, d->pa, ga, d->nin, d->xg, d->ce,
                                     d->ae, DORA_AX, DORA_AW);
    gx = gl == NONE ? gx : sum_grad(S, gx, gl);
    /* magnitude / norm: the magnitude's gradient */
    vp__param_grad(S, d->pm, vp__talloc(S, vp__mulc(S, out, d->ae),
                                        VP_CAT_TEMP));
    return gx;
}

void vp__lora_bwd(sim *S, vp__bwd_op *b)
{
    const vp_op *o = b->o;
    lora_dims d = dims_of(S, o);
    uint32_t g = b->gy, gx;
    b->gy = NONE;
    if (d.es != d.ey) { /* ToCopyBackward of result.to(...) */
        uint32_t c = vp__talloc(S, vp__mulc(S, d.nout, d.es), VP_CAT_TEMP);
        vp__tunref(S, g);
        g = c;
    }
    /* AddBackward: the same gradient to the base layer's output */
    vp__tref(S, g);
    vp__give_grad(S, o->inputs[1], g, d.es);
    if (d.dora) {
        gx = dora_bwd(S, b, &d, g);
    } else {
        /* MulBackward (* scaling) */
        uint32_t gs = vp__talloc(S, vp__mulc(S, d.nout, d.ce), VP_CAT_TEMP);
        vp__tunref(S, g);
        uint32_t ga = adapter_linear_bwd(S, b->i, d.pb, gs, d.nr, true, d.ce,
                                         d.ce, LORA_BX, LORA_BW);
        gx = adapter_linear_bwd(S, b->i, d.pa, ga, d.nin, d.xg, d.ce, d.ae,
                                LORA_AX, LORA_AW);
    }
    if (gx != NONE && o->dropout > 0.0) { /* NativeDropoutBackward */
        uint32_t c = vp__talloc(S, vp__mulc(S, d.nin, d.ae), VP_CAT_TEMP);
        vp__tunref(S, gx);
        vp__drop_saved(S, b->i, LORA_MASK); /* DORA_MASK too */
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
