/* Instantiation of the graph form (compiled at load: graph_compile.c,
 * graph_form.h) for a batch and a sequence length: ops with shapes
 * inferred from their inputs, through one builder per op kind in the
 * table vp__gkinds; named blocks invoked with parameters and `repeat`;
 * checkpoint units matched by name patterns. Errors point at the file
 * positions the compiled form kept. docs/MODEL_FORMAT.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expr.h"
#include "graph_form.h"
#include "graph_internal.h"

#define NO_OP UINT32_MAX

typedef struct scope {
    const char *prefix;          /* "" at the top level                  */
    vp_expr_var vars[VP_GFORM_MAX_VARS];
    size_t n_vars;
    uint32_t input;              /* the list's input op                  */
    uint32_t context;            /* the model's `context` input, NO_OP   */
    uint32_t *made;              /* per entry of the list: its op        */
    int depth;
    bool top;
} scope;

typedef struct {
    vp_graph *g;
    const vp_gform *f;
    const char *path;            /* the model file, for errors           */
    vp_error *err;
    uint64_t expanded;           /* block instances expanded             */
} gb;

/* An op being built from an entry. */
struct vp_gop {
    gb *b;
    scope *s;
    const vp_gentry *e;
    vp_op o;                     /* shaped like its first input          */
    const vp_op *x;              /* the first input                      */
    uint32_t ins[VP_OP_MAX_INPUTS];
    uint32_t n_in;
    uint64_t last;               /* x's last dim                         */
    uint32_t out;                /* the op made                          */
    bool pushed;                 /* the builder pushed its ops itself    */
};
typedef struct vp_gop opb;

/* An error at the entry's mapping. */
#define AT_ENTRY(c, code, ...)                                             \
    vp__error_at_pos((c)->b->err, (code), (c)->b->path, (c)->e->at,        \
                     __VA_ARGS__)

/* ---- sizes ------------------------------------------------------------------ */

static vp_status eval(gb *b, scope *s, const vp_gexpr *x, int64_t *out)
{
    size_t pos;
    char msg[200];
    vp_status st = vp__expr_eval(x->text, s->vars, s->n_vars, out, &pos, msg,
                                 sizeof msg);
    if (st != VP_OK)
        return vp_error_at(b->err, st, b->path, x->at.line,
                           x->at.col + (uint32_t)pos + x->lead, 1, "%s", msg);
    return VP_OK;
}

/* A size: an expression whose value is in [min, 2^40]. */
static vp_status size_of(gb *b, scope *s, const vp_gexpr *x, int64_t min,
                         uint64_t *out)
{
    int64_t v;
    VP_TRY(eval(b, s, x, &v));
    if (v < min)
        return vp__error_at_pos(b->err, VP_ERANGE, b->path, x->at,
                                "'%.64s' is %lld here; it must be at least "
                                "%lld",
                                x->text, (long long)v, (long long)min);
    if ((uint64_t)v > VP_MAX_DIM)
        return vp__error_at_pos(b->err, VP_ERANGE, b->path, x->at,
                                "'%.64s' is %lld here, larger than 2^40",
                                x->text, (long long)v);
    *out = (uint64_t)v;
    return VP_OK;
}

/* The size of attribute `key` (absent: dflt). */
static vp_status attr_size(opb *c, vp_gkey key, uint64_t dflt, int64_t min,
                           uint64_t *out)
{
    const vp_gattr *a = vp__gattr(c->e, key);
    if (!a) {
        *out = dflt;
        return VP_OK;
    }
    return size_of(c->b, c->s, &a->expr, min, out);
}

static bool attr_bool(const opb *c, vp_gkey key, bool dflt)
{
    const vp_gattr *a = vp__gattr(c->e, key);
    return a ? a->b : dflt;
}

static vp_status out_of_range(opb *c, vp_srcpos at, const char *what)
{
    return vp__error_at_pos(c->b->err, VP_ERANGE, c->b->path, at, "%s: %s",
                            c->o.name, what);
}

static vp_status mul2(opb *c, uint64_t x, uint64_t y, uint64_t *out)
{
    if (!vp_mul_u64(x, y, out))
        return AT_ENTRY(c, VP_EOVERFLOW, "size overflows 64 bits");
    return VP_OK;
}

/* ---- names, parameters, ops ------------------------------------------------ */

static const char *full_name(gb *b, scope *s, const char *leaf)
{
    return s->prefix[0] ? vp__arena_printf(&b->g->arena, "%s.%s", s->prefix,
                                           leaf)
                        : vp__arena_strdup(&b->g->arena, leaf);
}

/* The op an entry's reference names. */
static uint32_t ref_op(const scope *s, int32_t ref)
{
    return ref == VP_GREF_INPUT     ? s->input
           : ref == VP_GREF_CONTEXT ? s->context
                                    : s->made[ref];
}

static vp_status param(gb *b, vp_op *o, const char *leaf, uint64_t numel,
                       bool trainable, uint32_t *idx)
{
    char name[256];
    snprintf(name, sizeof name, "%s.%s", o->name, leaf);
    uint32_t i;
    VP_TRY(vp__graph_add_param(b->g, name, numel, (uint32_t)b->g->n_ops,
                               trainable, &i, b->err));
    o->params[o->n_params++] = i;
    if (idx)
        *idx = i;
    return VP_OK;
}

static vp_status push(gb *b, vp_op *o, vp_srcpos at, uint32_t *idx)
{
    vp_status st = vp__graph_add_op(b->g, o, idx, b->err);
    if (st == VP_EOVERFLOW)
        return vp__error_at_pos(b->err, VP_EOVERFLOW, b->path, at,
                                "the output of '%.100s' has more than 2^64 "
                                "elements",
                                o->name);
    return st;
}

/* `hold_input: true`: the caller's Python variable keeps the input of a
 * module call (op `in`) alive until the call's last op `last` has run, as
 * in `y = self.ln_2(x); y = self.mlp(y)`. */
static void hold_input(gb *b, uint32_t in, uint32_t last)
{
    vp_op *io = &b->g->ops[in];
    if (io->kind != VP_OP_INPUT && last > in && last > io->hold_until)
        io->hold_until = last;
}

/* The weight of the op: shared with the op named by `tied_to` (its first
 * parameter, which must have the same number of elements), else new. */
static vp_status weight(opb *c, uint64_t numel)
{
    const vp_gattr *t = vp__gattr(c->e, VP_GK_TIED_TO);
    if (!t)
        return param(c->b, &c->o, "weight", numel, true, NULL);
    const vp_op *so = &c->b->g->ops[ref_op(c->s, t->ref)];
    if (!so->n_params || so->kind == VP_OP_INPUT)
        return vp__error_at_pos(c->b->err, VP_ESCHEMA, c->b->path, t->at,
                                "'%.64s' has no weight to share", so->name);
    const vp_param *sp = &c->b->g->params[so->params[0]];
    if (sp->numel != numel)
        return vp__error_at_pos(c->b->err, VP_ESCHEMA, c->b->path, t->at,
                                "cannot tie to '%.64s': its weight has %llu "
                                "elements, this one needs %llu",
                                so->name, (unsigned long long)sp->numel,
                                (unsigned long long)numel);
    c->o.params[c->o.n_params++] = so->params[0];
    return VP_OK;
}

/* ---- builders, one per kind ---------------------------------------------- */

static vp_status build_linear(opb *c)
{
    vp_op *o = &c->o;
    uint64_t v, w = 0;
    VP_TRY(attr_size(c, VP_GK_OUT, 0, 1, &v));
    o->in_features = c->last;
    o->out_features = v;
    o->shape[o->ndim - 1] = v;
    VP_TRY(mul2(c, c->last, v, &w));
    VP_TRY(weight(c, w));
    if (attr_bool(c, VP_GK_BIAS, true))
        VP_TRY(param(c->b, o, "bias", v, true, NULL));
    return VP_OK;
}

/* The output side of a window of k with padding pad and stride st over
 * dims 2 and 3 of x (convolution, pooling). */
static vp_status window(opb *c, uint64_t k, uint64_t st, uint64_t pad,
                        const char *too_large)
{
    for (int i = 2; i < 4; i++) {
        uint64_t h = c->x->shape[i] + 2 * pad;
        if (h < k)
            return out_of_range(c, c->e->at, too_large);
        c->o.shape[i] = (h - k) / st + 1;
    }
    return VP_OK;
}

/* conv2d and conv_transpose2d: out, kernel, stride, padding, groups and
 * the bias; the output's sides, (H + 2p - k) / s + 1 for a convolution,
 * (H - 1) s - 2p + k for a transposed one (torch.nn.ConvTranspose2d
 * without output_padding); the weight, [out, in / groups, k, k] or [in,
 * out / groups, k, k]: as many elements either way. */
static vp_status build_conv(opb *c)
{
    vp_op *o = &c->o;
    const vp_op *x = c->x;
    bool tr = o->kind == VP_OP_CONV_TRANSPOSE2D;
    if (x->ndim != 4)
        return AT_ENTRY(c, VP_ESCHEMA,
                        "%s needs a 4-d input [N, C, H, W]; '%.64s' has "
                        "%u dims",
                        vp_op_kind_name(o->kind), x->name, x->ndim);
    uint64_t v, k, st, pad, grp, w = 0, kk = 0;
    VP_TRY(attr_size(c, VP_GK_OUT, 0, 1, &v));
    VP_TRY(attr_size(c, VP_GK_KERNEL, 0, 1, &k));
    VP_TRY(attr_size(c, VP_GK_STRIDE, 1, 1, &st));
    VP_TRY(attr_size(c, VP_GK_PADDING, 0, 0, &pad));
    VP_TRY(attr_size(c, VP_GK_GROUPS, 1, 1, &grp));
    uint64_t ch = x->shape[1];
    if (ch % grp || v % grp)
        return out_of_range(c, c->e->at,
                            "channels are not a multiple of groups");
    if (!tr)
        VP_TRY(window(c, k, st, pad,
                      "the kernel is larger than the padded image"));
    for (int i = 2; i < 4 && tr; i++) {
        uint64_t h = 0;
        VP_TRY(mul2(c, x->shape[i] - 1, st, &h));
        if (h + k <= 2 * pad) /* all below 2^41: no overflow */
            return out_of_range(c, c->e->at,
                                "the padding removes the whole output");
        o->shape[i] = h + k - 2 * pad;
    }
    VP_TRY(mul2(c, k, k, &kk));
    if (k > UINT32_MAX || st > UINT32_MAX || pad > UINT32_MAX ||
        grp > UINT32_MAX)
        return out_of_range(c, c->e->at,
                            "kernel, stride, padding and groups must be "
                            "below 2^32");
    o->shape[1] = v;
    o->in_features = ch;
    o->out_features = v;
    o->kernel = (uint32_t)k;
    o->stride = (uint32_t)st;
    o->padding = (uint32_t)pad;
    o->groups = (uint32_t)grp;
    VP_TRY(mul2(c, v, ch / grp, &w));
    VP_TRY(mul2(c, w, kk, &w));
    VP_TRY(param(c->b, o, "weight", w, true, NULL));
    if (attr_bool(c, VP_GK_BIAS, true))
        VP_TRY(param(c->b, o, "bias", v, true, NULL));
    return VP_OK;
}

static vp_status build_batchnorm2d(opb *c)
{
    vp_op *o = &c->o;
    if (c->x->ndim < 2)
        return AT_ENTRY(c, VP_ESCHEMA, "batchnorm2d needs [N, C, ...]");
    uint64_t ch = c->x->shape[1];
    uint32_t nb;
    VP_TRY(param(c->b, o, "weight", ch, true, NULL));
    VP_TRY(param(c->b, o, "bias", ch, true, NULL));
    VP_TRY(param(c->b, o, "running_mean", ch, false, NULL));
    VP_TRY(param(c->b, o, "running_var", ch, false, NULL));
    /* num_batches_tracked: an int64 buffer of one element */
    char pname[256];
    snprintf(pname, sizeof pname, "%s.num_batches_tracked", o->name);
    vp_graph *g = c->b->g;
    VP_TRY(vp__graph_add_param(g, pname, 1, (uint32_t)g->n_ops, false, &nb,
                               c->b->err));
    g->params[nb].elem_bytes_override = 8;
    o->rows = ch;
    return VP_OK;
}

/* layernorm (optional bias) and rmsnorm (none) over the last dim */
static vp_status build_norm(opb *c)
{
    vp_op *o = &c->o;
    bool bias = o->kind == VP_OP_LAYERNORM && attr_bool(c, VP_GK_BIAS, true);
    VP_TRY(param(c->b, o, "weight", c->last, true, NULL));
    if (bias)
        VP_TRY(param(c->b, o, "bias", c->last, true, NULL));
    o->rows = c->x->numel / c->last;
    return VP_OK;
}

static vp_status build_groupnorm(opb *c)
{
    vp_op *o = &c->o;
    const vp_op *x = c->x;
    uint64_t grp;
    VP_TRY(attr_size(c, VP_GK_GROUPS, 0, 1, &grp));
    if (x->ndim < 2 || x->shape[1] % grp)
        return out_of_range(c, c->e->at,
                            "channels are not a multiple of groups");
    o->groups = (uint32_t)grp;
    VP_TRY(param(c->b, o, "weight", x->shape[1], true, NULL));
    VP_TRY(param(c->b, o, "bias", x->shape[1], true, NULL));
    o->rows = x->shape[0] * grp;
    return VP_OK;
}

static vp_status build_embedding(opb *c)
{
    vp_op *o = &c->o;
    if (c->x->value != VP_VAL_INDEX)
        return AT_ENTRY(c, VP_ESCHEMA,
                        "embedding needs token indices as input "
                        "(input_kind: index)");
    uint64_t voc, dim, w = 0;
    VP_TRY(attr_size(c, VP_GK_VOCAB, 0, 1, &voc));
    VP_TRY(attr_size(c, VP_GK_DIM, 0, 1, &dim));
    if (o->ndim >= VP_MAX_DIMS)
        return AT_ENTRY(c, VP_ESCHEMA, "too many dims");
    o->shape[o->ndim++] = dim;
    o->classes = voc;
    VP_TRY(mul2(c, voc, dim, &w));
    return weight(c, w);
}

/* The attention's sizes. */
typedef struct {
    uint64_t heads, kvh, hd;
    uint32_t mha; /* VP_OPF_TORCH_MHA for layout torch_mha */
} att_sizes;

static vp_status attention_sizes(opb *c, att_sizes *a)
{
    uint64_t last = c->last;
    VP_TRY(attr_size(c, VP_GK_HEADS, 0, 1, &a->heads));
    VP_TRY(attr_size(c, VP_GK_KV_HEADS, a->heads, 1, &a->kvh));
    if (last % a->heads && !vp__gattr(c->e, VP_GK_HEAD_DIM))
        return out_of_range(c, c->e->at, "dim is not a multiple of heads");
    VP_TRY(attr_size(c, VP_GK_HEAD_DIM, last / a->heads, 1, &a->hd));
    if (a->heads % a->kvh)
        return out_of_range(c, c->e->at,
                            "heads is not a multiple of kv_heads");
    /* layout: packed (q, k, v split by views of one projection, [batch,
     * seq, heads, head_dim]) or torch_mha
     * (torch.nn.MultiheadAttention(batch_first=True)) */
    const vp_gattr *lay = vp__gattr(c->e, VP_GK_LAYOUT);
    a->mha = 0;
    if (lay && lay->e == 1) {
        if (a->kvh != a->heads || last % a->heads || a->hd != last / a->heads)
            return out_of_range(c, lay->at,
                                "layout torch_mha needs kv_heads = heads and "
                                "head_dim = dim / heads");
        a->mha = VP_OPF_TORCH_MHA;
    }
    return VP_OK;
}

/* The attention core between its projections. */
static vp_op attention_core(opb *c, const att_sizes *a, uint32_t in,
                            uint64_t qd)
{
    const vp_gattr *impl = vp__gattr(c->e, VP_GK_IMPL);
    const vp_gattr *p = vp__gattr(c->e, VP_GK_DROPOUT);
    vp_op o;
    memset(&o, 0, sizeof o);
    o.kind = VP_OP_ATTENTION;
    o.value = VP_VAL_FLOAT;
    o.name = vp__arena_printf(&c->b->g->arena, "%s.core", c->o.name);
    o.n_inputs = 1;
    o.inputs[0] = in;
    o.ndim = 3;
    o.shape[0] = c->x->shape[0];
    o.shape[1] = c->x->shape[1];
    o.shape[2] = qd;
    o.heads = (uint32_t)a->heads;
    o.kv_heads = (uint32_t)a->kvh;
    o.head_dim = (uint32_t)a->hd;
    o.q_len = o.kv_len = c->x->shape[1];
    o.causal = attr_bool(c, VP_GK_CAUSAL, false);
    o.attn_impl = impl ? (vp_attn_impl)impl->e : VP_ATTN_SDPA;
    o.dropout = p ? p->p : 0.0;
    o.flags = a->mha;
    return o;
}

/* An attention: in_proj (packed q, k, v), the core, out_proj. */
static vp_status build_attention(opb *c)
{
    gb *b = c->b;
    vp_graph *g = b->g;
    const vp_op *x = c->x;
    if (x->ndim != 3)
        return AT_ENTRY(c, VP_ESCHEMA,
                        "attention needs [batch, seq, dim]; '%.64s' has %u "
                        "dims",
                        x->name, x->ndim);
    att_sizes a;
    VP_TRY(attention_sizes(c, &a));
    bool bias = attr_bool(c, VP_GK_BIAS, true);
    uint64_t last = c->last, qd = 0, kvd = 0, qkv = 0, w = 0;
    vp_op q = c->o;
    q.kind = VP_OP_LINEAR;
    q.name = vp__arena_printf(&g->arena, "%s.in_proj", c->o.name);
    VP_TRY(mul2(c, a.heads, a.hd, &qd));
    VP_TRY(mul2(c, a.kvh, a.hd, &kvd));
    VP_TRY(mul2(c, kvd, 2, &kvd));
    if (!vp_add_u64(qd, kvd, &qkv))
        return AT_ENTRY(c, VP_EOVERFLOW, "heads x head_dim overflows 64 bits");
    q.in_features = last;
    q.out_features = qkv;
    q.shape[2] = qkv;
    q.flags |= a.mha;
    VP_TRY(mul2(c, last, qkv, &w));
    VP_TRY(param(b, &q, "weight", w, true, NULL));
    if (bias)
        VP_TRY(param(b, &q, "bias", qkv, true, NULL));
    uint32_t qi, ci;
    VP_TRY(push(b, &q, c->e->at, &qi));
    c->x = &g->ops[c->ins[0]]; /* the push may have moved the ops */
    vp_op core = attention_core(c, &a, qi, qd);
    VP_TRY(push(b, &core, c->e->at, &ci));
    vp_op po = c->o;
    po.kind = VP_OP_LINEAR;
    po.n_params = 0;
    po.name = vp__arena_printf(&g->arena, "%s.out_proj", c->o.name);
    po.inputs[0] = ci;
    po.in_features = qd;
    po.out_features = last;
    po.flags |= a.mha;
    VP_TRY(mul2(c, qd, last, &w));
    VP_TRY(param(b, &po, "weight", w, true, NULL));
    if (bias)
        VP_TRY(param(b, &po, "bias", last, true, NULL));
    VP_TRY(push(b, &po, c->e->at, &c->out));
    if (attr_bool(c, VP_GK_HOLD_INPUT, false))
        hold_input(b, c->ins[0], c->out);
    c->pushed = true;
    return VP_OK;
}

/* A projection of op `in` (last dim in_f) to out_f features, named
 * NAME.leaf, with its weight and (bias) its bias; pushed. */
static vp_status projection(opb *c, uint32_t in, uint64_t in_f, uint64_t out_f,
                            const char *leaf, bool bias, uint32_t *out)
{
    gb *b = c->b;
    const vp_op *x = &b->g->ops[in];
    vp_op p = c->o;
    uint64_t w = 0;
    p.kind = VP_OP_LINEAR;
    p.n_params = 0;
    p.n_inputs = 1;
    p.inputs[0] = in;
    p.ndim = x->ndim;
    memcpy(p.shape, x->shape, sizeof p.shape);
    p.shape[p.ndim - 1] = out_f;
    p.name = vp__arena_printf(&b->g->arena, "%s.%s", c->o.name, leaf);
    p.in_features = in_f;
    p.out_features = out_f;
    VP_TRY(mul2(c, in_f, out_f, &w));
    VP_TRY(param(b, &p, "weight", w, true, NULL));
    if (bias)
        VP_TRY(param(b, &p, "bias", out_f, true, NULL));
    return push(b, &p, c->e->at, out);
}

/* cross_attention on inputs [x, context]: separate q (of x), k and v (of
 * the context) projections, the core (queries x's length, keys the
 * context's), the output projection back to x's width. q, k and v are
 * locals of the module's forward until it returns (diffusers
 * AttnProcessor2_0.__call__). */
static vp_status build_cross_attention(opb *c)
{
    gb *b = c->b;
    const vp_op *x = c->x;
    if (c->n_in != 2)
        return AT_ENTRY(c, VP_ESCHEMA,
                        "cross_attention needs 'inputs': [queries, context]");
    const vp_op *ctx = &b->g->ops[c->ins[1]];
    if (x->ndim != 3 || ctx->ndim != 3 || ctx->shape[0] != x->shape[0])
        return AT_ENTRY(c, VP_ESCHEMA,
                        "cross_attention needs [batch, seq, dim] inputs of "
                        "the same batch; '%.64s' and '%.64s' are not",
                        x->name, ctx->name);
    att_sizes a;
    VP_TRY(attention_sizes(c, &a));
    if (a.mha)
        return out_of_range(c, vp__gattr(c->e, VP_GK_LAYOUT)->at,
                            "cross_attention has separate projections: "
                            "layout packed only");
    bool bias = attr_bool(c, VP_GK_BIAS, true);
    uint64_t qd = 0, kvd = 0;
    VP_TRY(mul2(c, a.heads, a.hd, &qd));
    VP_TRY(mul2(c, a.kvh, a.hd, &kvd));
    uint64_t cd = ctx->shape[2], kv_len = ctx->shape[1];
    uint32_t q, k, v, ci;
    VP_TRY(projection(c, c->ins[0], c->last, qd, "to_q", bias, &q));
    VP_TRY(projection(c, c->ins[1], cd, kvd, "to_k", bias, &k));
    VP_TRY(projection(c, c->ins[1], cd, kvd, "to_v", bias, &v));
    c->x = &b->g->ops[c->ins[0]]; /* the pushes may have moved the ops */
    vp_op core = attention_core(c, &a, q, qd);
    core.n_inputs = 3;
    core.inputs[1] = k;
    core.inputs[2] = v;
    core.kv_len = kv_len;
    VP_TRY(push(b, &core, c->e->at, &ci));
    VP_TRY(projection(c, ci, qd, c->last, "to_out", bias, &c->out));
    uint32_t held[] = {q, k, v};
    for (int i = 0; i < 3; i++)
        hold_input(b, held[i], c->out);
    if (attr_bool(c, VP_GK_HOLD_INPUT, false))
        hold_input(b, c->ins[0], c->out);
    c->pushed = true;
    return VP_OK;
}

/* upsample: F.interpolate(scale_factor=scale, mode=nearest|bilinear) of
 * [N, C, H, W] */
static vp_status build_upsample(opb *c)
{
    vp_op *o = &c->o;
    if (c->x->ndim != 4)
        return AT_ENTRY(c, VP_ESCHEMA, "upsample needs [N, C, H, W]");
    uint64_t f;
    VP_TRY(attr_size(c, VP_GK_SCALE, 2, 1, &f));
    for (int i = 2; i < 4; i++)
        VP_TRY(mul2(c, c->x->shape[i], f, &o->shape[i]));
    if (f > UINT32_MAX)
        return out_of_range(c, c->e->at, "scale must be below 2^32");
    o->stride = (uint32_t)f;
    const vp_gattr *m = vp__gattr(c->e, VP_GK_MODE);
    if (m && m->e == 1)
        o->flags |= VP_OPF_BILINEAR;
    return VP_OK;
}

/* relu, gelu, gelu_tanh, silu, tanh, sigmoid */
static vp_status build_activation(opb *c)
{
    c->o.inplace = attr_bool(c, VP_GK_INPLACE, false);
    return VP_OK;
}

static vp_status build_dropout(opb *c)
{
    c->o.dropout = vp__gattr(c->e, VP_GK_P)->p;
    return VP_OK;
}

/* maxpool2d, avgpool2d */
static vp_status build_pool(opb *c)
{
    vp_op *o = &c->o;
    if (c->x->ndim != 4)
        return AT_ENTRY(c, VP_ESCHEMA, "%s needs a 4-d input [N, C, H, W]",
                        vp_op_kind_name(o->kind));
    uint64_t k, st, pad;
    VP_TRY(attr_size(c, VP_GK_KERNEL, 0, 1, &k));
    VP_TRY(attr_size(c, VP_GK_STRIDE, k, 1, &st));
    VP_TRY(attr_size(c, VP_GK_PADDING, 0, 0, &pad));
    VP_TRY(window(c, k, st, pad, "the window is larger than the image"));
    if (k > UINT32_MAX || st > UINT32_MAX || pad > UINT32_MAX)
        return out_of_range(c, c->e->at,
                            "kernel, stride and padding must be below 2^32");
    o->kernel = (uint32_t)k;
    o->stride = (uint32_t)st;
    o->padding = (uint32_t)pad;
    return VP_OK;
}

static vp_status build_adaptive_pool(opb *c)
{
    if (c->x->ndim != 4)
        return AT_ENTRY(c, VP_ESCHEMA,
                        "adaptive_avgpool2d needs [N, C, H, W]");
    uint64_t v;
    VP_TRY(attr_size(c, VP_GK_OUT, 1, 1, &v));
    c->o.shape[2] = c->o.shape[3] = v;
    return VP_OK;
}

/* add (in place, or of a learned per-sample weight) and mul: two inputs
 * of the same shape, or the second broadcast over the first */
static vp_status build_binary(opb *c)
{
    vp_op *o = &c->o;
    const vp_op *x = c->x;
    const char *kind = vp_op_kind_name(o->kind);
    bool learned = false;
    if (o->kind == VP_OP_ADD) {
        o->inplace = attr_bool(c, VP_GK_INPLACE, false);
        learned = attr_bool(c, VP_GK_LEARNED, false);
    }
    if (learned) {
        if (c->n_in != 1)
            return AT_ENTRY(c, VP_ESCHEMA, "a learned add takes one input");
        return param(c->b, o, "weight", x->numel / x->shape[0], true, NULL);
    }
    if (c->n_in != 2)
        return AT_ENTRY(c, VP_ESCHEMA, "%s needs 'inputs' with two ops",
                        kind);
    const vp_op *y = &c->b->g->ops[c->ins[1]];
    if (y->numel != x->numel && y->numel != 1 && x->numel % y->numel)
        return out_of_range(c, c->e->at,
                            "the two inputs have different shapes");
    o->n_inputs = 2;
    o->inputs[1] = c->ins[1];
    return VP_OK;
}

/* concat along `dim` of its inputs, or of learned tokens prepended */
static vp_status build_concat(opb *c)
{
    vp_op *o = &c->o;
    const vp_op *x = c->x;
    uint64_t dim, tok, w = 0;
    VP_TRY(attr_size(c, VP_GK_DIM, 1, 0, &dim));
    VP_TRY(attr_size(c, VP_GK_LEARNED_TOKENS, 0, 0, &tok));
    if (dim >= x->ndim)
        return out_of_range(c, c->e->at, "dim is past the input's dims");
    if (tok) {
        if (c->n_in != 1)
            return AT_ENTRY(c, VP_ESCHEMA,
                            "concat with learned_tokens takes one input");
        VP_TRY(mul2(c, x->numel / x->shape[0] / x->shape[dim], tok, &w));
        VP_TRY(param(c->b, o, "tokens", w, true, NULL));
        o->shape[dim] += tok;
        return VP_OK;
    }
    if (c->n_in < 2)
        return AT_ENTRY(c, VP_ESCHEMA,
                        "concat needs 'inputs' with two or more ops");
    for (uint32_t i = 1; i < c->n_in; i++) {
        const vp_op *y = &c->b->g->ops[c->ins[i]];
        if (y->ndim != x->ndim)
            return out_of_range(c, c->e->at, "inputs differ in dims");
        o->shape[dim] += y->shape[dim];
        o->inputs[i] = c->ins[i];
    }
    o->n_inputs = c->n_in;
    return VP_OK;
}

static vp_status build_flatten(opb *c)
{
    vp_op *o = &c->o;
    const vp_op *x = c->x;
    uint64_t st;
    VP_TRY(attr_size(c, VP_GK_START, 1, 0, &st));
    if (st >= x->ndim)
        return out_of_range(c, c->e->at, "start is past the input's dims");
    uint64_t r = 1;
    for (uint32_t i = (uint32_t)st; i < x->ndim; i++)
        r *= x->shape[i]; /* bounded by the input's numel */
    o->ndim = (uint32_t)st + 1;
    o->shape[st] = r;
    return VP_OK;
}

static vp_status build_reshape(opb *c)
{
    vp_op *o = &c->o;
    const vp_gattr *sh = vp__gattr(c->e, VP_GK_SHAPE);
    gb *b = c->b;
    o->ndim = 0;
    for (uint32_t i = 0; i < sh->n_items; i++) {
        if (o->ndim == VP_MAX_DIMS)
            return vp__error_at_pos(b->err, VP_ESCHEMA, b->path, sh->at,
                                    "at most %d dims", VP_MAX_DIMS);
        VP_TRY(size_of(b, c->s, &sh->items[i], 1, &o->shape[o->ndim]));
        o->ndim++;
    }
    uint64_t ne;
    VP_TRY(vp__shape_numel(o->shape, o->ndim, &ne, b->err));
    if (ne != c->x->numel)
        return vp__error_at_pos(b->err, VP_ERANGE, b->path, sh->at,
                                "reshape to %llu elements from %llu",
                                (unsigned long long)ne,
                                (unsigned long long)c->x->numel);
    return VP_OK;
}

static vp_status build_permute(opb *c)
{
    vp_op *o = &c->o;
    const vp_op *x = c->x;
    const vp_gattr *dn = vp__gattr(c->e, VP_GK_DIMS);
    gb *b = c->b;
    uint32_t k = 0;
    bool seen[VP_MAX_DIMS] = {false};
    for (; k < dn->n_items; k++) {
        uint64_t p;
        if (k >= x->ndim)
            return vp__error_at_pos(b->err, VP_ESCHEMA, b->path, dn->at,
                                    "more dims than the input has");
        VP_TRY(size_of(b, c->s, &dn->items[k], 0, &p));
        if (p >= x->ndim || seen[p])
            return vp__error_at_pos(b->err, VP_ERANGE, b->path,
                                    dn->items[k].at,
                                    "not a permutation of the input's dims");
        seen[p] = true;
        o->shape[k] = x->shape[p];
        if (p != k)
            o->flags |= VP_OPF_STRIDED;
    }
    if (k != x->ndim)
        return vp__error_at_pos(b->err, VP_ESCHEMA, b->path, dn->at,
                                "permute needs all %u dims", x->ndim);
    return VP_OK;
}

static vp_status build_select(opb *c)
{
    vp_op *o = &c->o;
    const vp_op *x = c->x;
    uint64_t dim, idx;
    VP_TRY(attr_size(c, VP_GK_DIM, 1, 0, &dim));
    VP_TRY(attr_size(c, VP_GK_INDEX, 0, 0, &idx));
    if (dim >= x->ndim || idx >= x->shape[dim])
        return out_of_range(c, c->e->at, "dim or index out of range");
    for (uint32_t i = (uint32_t)dim; i + 1 < x->ndim; i++)
        o->shape[i] = x->shape[i + 1];
    o->ndim--;
    return VP_OK;
}

static vp_status build_softmax(opb *c)
{
    c->o.rows = c->x->numel / c->last;
    return VP_OK;
}

/* cross_entropy, mse_loss: a scalar over the input's rows */
static vp_status build_loss(opb *c)
{
    c->o.classes = c->last;
    c->o.rows = c->x->numel / c->last;
    c->o.ndim = 0;
    return VP_OK;
}

/* ---- the table ------------------------------------------------------------ */

#define KEYS(...) (const vp_gkey[]){__VA_ARGS__}, \
    sizeof((const vp_gkey[]){__VA_ARGS__}) / sizeof(vp_gkey)
#define NOKEYS (const vp_gkey[]){VP_GK__COUNT}, 0

static const vp_gkey ACT_KEYS[] = {VP_GK_INPLACE};
static const vp_gkey POOL_KEYS[] = {VP_GK_KERNEL, VP_GK_STRIDE,
                                    VP_GK_PADDING};

#define REQ(k) (1u << VP_GK_##k)
_Static_assert(VP_GK__COUNT <= 32, "vp_gkind.required holds a bit per key");

/* The graph form's op kinds: their keys (in the order error messages
 * list them), whether they take several inputs, the keys they require,
 * and their builder. */
const vp_gkind vp__gkinds[VP_OP__COUNT] = {
    [VP_OP_LINEAR] = {KEYS(VP_GK_OUT, VP_GK_BIAS, VP_GK_TIED_TO), false,
                      REQ(OUT), build_linear},
    [VP_OP_CONV2D] = {KEYS(VP_GK_OUT, VP_GK_KERNEL, VP_GK_STRIDE,
                           VP_GK_PADDING, VP_GK_GROUPS, VP_GK_BIAS),
                      false, REQ(OUT) | REQ(KERNEL), build_conv},
    [VP_OP_BATCHNORM2D] = {NOKEYS, false, 0, build_batchnorm2d},
    [VP_OP_LAYERNORM] = {KEYS(VP_GK_BIAS), false, 0, build_norm},
    [VP_OP_RMSNORM] = {NOKEYS, false, 0, build_norm},
    [VP_OP_GROUPNORM] = {KEYS(VP_GK_GROUPS), false, REQ(GROUPS),
                         build_groupnorm},
    [VP_OP_EMBEDDING] = {KEYS(VP_GK_VOCAB, VP_GK_DIM, VP_GK_TIED_TO), false,
                         REQ(VOCAB) | REQ(DIM), build_embedding},
    [VP_OP_ATTENTION] = {KEYS(VP_GK_HEADS, VP_GK_KV_HEADS, VP_GK_HEAD_DIM,
                              VP_GK_CAUSAL, VP_GK_IMPL, VP_GK_DROPOUT,
                              VP_GK_BIAS, VP_GK_LAYOUT, VP_GK_HOLD_INPUT),
                         false, REQ(HEADS), build_attention},
    [VP_OP_RELU] = {ACT_KEYS, 1, false, 0, build_activation},
    [VP_OP_GELU] = {ACT_KEYS, 1, false, 0, build_activation},
    [VP_OP_GELU_TANH] = {ACT_KEYS, 1, false, 0, build_activation},
    [VP_OP_SILU] = {ACT_KEYS, 1, false, 0, build_activation},
    [VP_OP_TANH] = {ACT_KEYS, 1, false, 0, build_activation},
    [VP_OP_SIGMOID] = {ACT_KEYS, 1, false, 0, build_activation},
    [VP_OP_DROPOUT] = {KEYS(VP_GK_P), false, REQ(P), build_dropout},
    [VP_OP_MAXPOOL2D] = {POOL_KEYS, 3, false, REQ(KERNEL), build_pool},
    [VP_OP_AVGPOOL2D] = {POOL_KEYS, 3, false, REQ(KERNEL), build_pool},
    [VP_OP_ADAPTIVE_AVGPOOL2D] = {KEYS(VP_GK_OUT), false, 0,
                                  build_adaptive_pool},
    [VP_OP_ADD] = {KEYS(VP_GK_INPLACE, VP_GK_LEARNED), true, 0,
                   build_binary},
    [VP_OP_MUL] = {NOKEYS, true, 0, build_binary},
    [VP_OP_CONCAT] = {KEYS(VP_GK_DIM, VP_GK_LEARNED_TOKENS), true, 0,
                      build_concat},
    [VP_OP_FLATTEN] = {KEYS(VP_GK_START), false, 0, build_flatten},
    [VP_OP_RESHAPE] = {KEYS(VP_GK_SHAPE), false, REQ(SHAPE), build_reshape},
    [VP_OP_PERMUTE] = {KEYS(VP_GK_DIMS), false, REQ(DIMS), build_permute},
    [VP_OP_SELECT] = {KEYS(VP_GK_DIM, VP_GK_INDEX), false, 0, build_select},
    [VP_OP_SOFTMAX] = {NOKEYS, false, 0, build_softmax},
    [VP_OP_CROSS_ENTROPY] = {NOKEYS, false, 0, build_loss},
    [VP_OP_MSE_LOSS] = {NOKEYS, false, 0, build_loss},
    [VP_OP_CROSS_ATTENTION] = {KEYS(VP_GK_HEADS, VP_GK_KV_HEADS,
                                    VP_GK_HEAD_DIM, VP_GK_IMPL,
                                    VP_GK_DROPOUT, VP_GK_BIAS,
                                    VP_GK_HOLD_INPUT),
                               true, REQ(HEADS), build_cross_attention},
    [VP_OP_UPSAMPLE] = {KEYS(VP_GK_SCALE, VP_GK_MODE), false, 0,
                        build_upsample},
    [VP_OP_CONV_TRANSPOSE2D] = {KEYS(VP_GK_OUT, VP_GK_KERNEL, VP_GK_STRIDE,
                                     VP_GK_PADDING, VP_GK_GROUPS,
                                     VP_GK_BIAS),
                                false, REQ(OUT) | REQ(KERNEL), build_conv},
};

static const char *const IMPLS[] = {"sdpa", "flash", "efficient", "eager",
                                    "math", NULL};
static const char *const LAYOUTS[] = {"packed", "torch_mha", NULL};
static const char *const MODES[] = {"nearest", "bilinear", NULL};

static const struct {
    const char *name;
    vp_gvalue value;
} GKEYS[VP_GK__COUNT] = {
#define VP__GK(id, str, type) [VP_GK_##id] = {str, VP_GV_##type},
    VP_GKEY_MAP(VP__GK)
#undef VP__GK
};

const char *vp__gkey_name(vp_gkey k) { return GKEYS[k].name; }
vp_gvalue vp__gkey_value(vp_gkey k) { return GKEYS[k].value; }

const char *const *vp__gkey_choices(vp_gkey k)
{
    return k == VP_GK_IMPL     ? IMPLS
           : k == VP_GK_LAYOUT ? LAYOUTS
           : k == VP_GK_MODE   ? MODES
                               : NULL;
}

const vp_gattr *vp__gattr(const vp_gentry *e, vp_gkey key)
{
    for (uint32_t i = 0; i < e->n_attrs; i++)
        if (e->attrs[i].key == key)
            return &e->attrs[i];
    return NULL;
}

/* ---- ops, lists, blocks --------------------------------------------------- */

static vp_status build_list(gb *b, scope *s, const vp_glist *l, uint32_t *out);

/* Build one op entry (an attention: three ops) on its inputs. */
static vp_status build_op(gb *b, scope *s, const vp_gentry *e, uint32_t prev,
                          uint32_t *out)
{
    opb c;
    memset(&c, 0, sizeof c);
    c.b = b;
    c.s = s;
    c.e = e;
    c.n_in = e->n_in ? e->n_in : 1;
    for (uint32_t i = 0; i < e->n_in; i++)
        c.ins[i] = ref_op(s, e->in[i]);
    if (!e->n_in) {
        if (prev == NO_OP)
            return AT_ENTRY(&c, VP_ESCHEMA, "this op has no input");
        c.ins[0] = prev;
    }
    const char *kind = vp_op_kind_name(e->kind);
    vp_op *o = &c.o;
    o->kind = e->kind;
    o->value = VP_VAL_FLOAT;
    o->name = full_name(b, s, e->leaf);
    if (!o->name)
        return vp_error_set(b->err, VP_ENOMEM, "out of memory");
    o->n_inputs = 1;
    o->inputs[0] = c.ins[0];
    c.x = &b->g->ops[c.ins[0]];
    o->ndim = c.x->ndim;
    memcpy(o->shape, c.x->shape, sizeof o->shape);
    c.last = c.x->ndim ? c.x->shape[c.x->ndim - 1] : 1;
    if (c.x->value != VP_VAL_FLOAT && e->kind != VP_OP_EMBEDDING)
        return AT_ENTRY(&c, VP_ESCHEMA,
                        "%s needs a float input; '%.64s' gives indices", kind,
                        c.x->name);
    if (c.x->ndim == 0 && e->kind != VP_OP_EMBEDDING)
        return AT_ENTRY(&c, VP_ESCHEMA,
                        "%s cannot take the scalar output of '%.64s'", kind,
                        c.x->name);
    VP_TRY(vp__gkinds[e->kind].build(&c));
    if (!c.pushed)
        VP_TRY(push(b, o, e->at, &c.out));
    *out = c.out;
    return VP_OK;
}

/* A checkpoint unit: a block instance or op whose name a `checkpoint`
 * pattern matches, or without patterns each repeated block instance at
 * the top level. */
static vp_status maybe_segment(gb *b, const char *name, uint32_t first,
                               uint32_t last, bool repeated, bool top,
                               vp_srcpos at)
{
    const vp_gform *f = b->f;
    bool match = false;
    if (f->has_patterns) {
        for (size_t i = 0; i < f->n_patterns; i++)
            if (vp__glob_match(f->patterns[i], name))
                match = true;
    } else {
        match = repeated && top;
    }
    if (!match || last < first)
        return VP_OK;
    for (uint32_t i = first; i <= last; i++)
        if (b->g->ops[i].segment >= 0)
            return vp__error_at_pos(b->err, VP_ESCHEMA, b->path, at,
                                    "checkpoint unit '%.64s' overlaps "
                                    "'%.64s'",
                                    name,
                                    b->g->segs[b->g->ops[i].segment].name);
    return vp__graph_add_segment(b->g, name, first, last, true, b->err);
}

/* The block's parameters in its scope: `with` values evaluated in the
 * caller's scope, defaults in the block's. */
static vp_status bind_params(gb *b, scope *s, const vp_gentry *e,
                             scope *inner)
{
    const vp_gblock *blk = &b->f->blocks[e->block];
    for (uint32_t i = 0; i < blk->n_params; i++) {
        int64_t v;
        if (e->with[i].text)
            VP_TRY(eval(b, s, &e->with[i], &v));
        else
            VP_TRY(eval(b, inner, &blk->defaults[i], &v));
        if (inner->n_vars == VP_GFORM_MAX_VARS)
            return vp__error_at_pos(b->err, VP_ELIMIT, b->path,
                                    blk->param_at[i],
                                    "too many names in scope (at most %d)",
                                    VP_GFORM_MAX_VARS);
        inner->vars[inner->n_vars++] = (vp_expr_var){blk->params[i], v};
    }
    return VP_OK;
}

/* The name of instance r of a block invocation. */
static const char *instance_name(gb *b, scope *s, const vp_gentry *e,
                                 uint64_t r)
{
    if (!e->repeated)
        return full_name(b, s, e->leaf);
    if (s->prefix[0])
        return vp__arena_printf(&b->g->arena, "%s.%s.%llu", s->prefix,
                                e->leaf, (unsigned long long)r);
    return vp__arena_printf(&b->g->arena, "%s.%llu", e->leaf,
                            (unsigned long long)r);
}

static vp_status call_block(gb *b, scope *s, const vp_gentry *e,
                            uint32_t prev, uint32_t *out)
{
    if (s->depth + 1 > VP_MAX_NEST)
        return vp__error_at_pos(b->err, VP_ELIMIT, b->path, e->at,
                                "blocks nested deeper than %d (a block that "
                                "invokes itself?)",
                                VP_MAX_NEST);
    uint32_t x = e->n_in ? ref_op(s, e->in[0]) : prev;
    if (x == NO_OP)
        return vp__error_at_pos(b->err, VP_ESCHEMA, b->path, e->at,
                                "this block has no input");
    const vp_gblock *blk = &b->f->blocks[e->block];
    scope inner;
    memset(&inner, 0, sizeof inner);
    inner.depth = s->depth + 1;
    inner.context = s->context;
    memcpy(inner.vars, s->vars, s->n_vars * sizeof s->vars[0]);
    inner.n_vars = s->n_vars;
    VP_TRY(bind_params(b, s, e, &inner));
    inner.made = malloc((blk->ops.n ? blk->ops.n : 1) * sizeof *inner.made);
    if (!inner.made)
        return vp_error_set(b->err, VP_ENOMEM, "out of memory");
    vp_status st = VP_OK;
    for (uint64_t r = 0; r < e->repeat && st == VP_OK; r++) {
        if (++b->expanded > VP_MAX_OPS) {
            st = vp__error_at_pos(b->err, VP_ELIMIT, b->path, e->at,
                                  "the model expands to more than %u "
                                  "blocks",
                                  VP_MAX_OPS);
            break;
        }
        inner.prefix = instance_name(b, s, e, r);
        if (!inner.prefix) {
            st = vp_error_set(b->err, VP_ENOMEM, "out of memory");
            break;
        }
        inner.input = x;
        uint32_t first = (uint32_t)b->g->n_ops;
        uint32_t arg = x;
        st = build_list(b, &inner, &blk->ops, &x);
        if (st == VP_OK && e->hold)
            hold_input(b, arg, (uint32_t)b->g->n_ops - 1);
        if (st == VP_OK)
            st = maybe_segment(b, inner.prefix, first,
                               (uint32_t)b->g->n_ops - 1, e->repeated,
                               s->top, e->at);
    }
    free(inner.made);
    *out = x;
    return st;
}

static vp_status build_list(gb *b, scope *s, const vp_glist *l, uint32_t *out)
{
    uint32_t prev = s->input;
    for (uint32_t k = 0; k < l->n; k++) {
        const vp_gentry *e = &l->entries[k];
        uint32_t o;
        if (e->call) {
            VP_TRY(call_block(b, s, e, prev, &o));
        } else {
            uint32_t first = (uint32_t)b->g->n_ops;
            VP_TRY(build_op(b, s, e, prev, &o));
            if (b->f->has_patterns) {
                const char *full = full_name(b, s, e->leaf);
                if (!full)
                    return vp_error_set(b->err, VP_ENOMEM, "out of memory");
                VP_TRY(maybe_segment(b, full, first, o, false, s->top, e->at));
            }
        }
        s->made[k] = o;
        prev = o;
    }
    *out = prev;
    return VP_OK;
}

/* ---- the size before expansion ---------------------------------------------- */

/* What a list expands to, ops and block instances counted alike, as
 * vp__build_explicit checks it before building anything: the work and
 * memory of a model are bounded by VP_MAX_OPS whatever its repeat counts
 * multiply to (docs/LIMITS.md). Saturates at VP_MAX_OPS + 1. A block
 * that invokes itself, or a chain deeper than VP_MAX_NEST, counts as
 * nothing here: the builder reports it where it is. */
typedef struct {
    const vp_gform *f;
    uint64_t *memo; /* per block: its size, UINT64_MAX before known */
    bool *busy;     /* per block: being counted                      */
} sizer;

static uint64_t sat(uint64_t a, uint64_t b, bool mul)
{
    uint64_t r;
    bool ok = mul ? vp_mul_u64(a, b, &r) : vp_add_u64(a, b, &r);
    return ok && r <= VP_MAX_OPS ? r : (uint64_t)VP_MAX_OPS + 1;
}

static uint64_t entry_size(sizer *z, const vp_gentry *e, int depth);

static uint64_t list_size(sizer *z, const vp_glist *l, int depth)
{
    uint64_t n = 0;
    for (uint32_t k = 0; k < l->n; k++)
        n = sat(n, entry_size(z, &l->entries[k], depth), false);
    return n;
}

static uint64_t entry_size(sizer *z, const vp_gentry *e, int depth)
{
    if (!e->call)
        return 1;
    uint32_t k = e->block;
    if (k >= z->f->n_blocks || z->busy[k] || depth >= VP_MAX_NEST)
        return 0;
    if (z->memo[k] == UINT64_MAX) {
        z->busy[k] = true;
        z->memo[k] = list_size(z, &z->f->blocks[k].ops, depth + 1);
        z->busy[k] = false;
    }
    return sat(e->repeat, sat(1, z->memo[k], false), true);
}

/* VP_ELIMIT at the top-level entry past the limit. */
static vp_status check_size(gb *b)
{
    const vp_gform *f = b->f;
    size_t nb = f->n_blocks ? f->n_blocks : 1;
    sizer z = {f, malloc(nb * sizeof *z.memo), calloc(nb, sizeof *z.busy)};
    vp_status st = VP_OK;
    if (!z.memo || !z.busy)
        st = vp_error_set(b->err, VP_ENOMEM, "out of memory");
    else
        memset(z.memo, 0xff, nb * sizeof *z.memo);
    uint64_t n = 1; /* the input */
    for (uint32_t k = 0; k < f->ops.n && st == VP_OK; k++) {
        n = sat(n, entry_size(&z, &f->ops.entries[k], 0), false);
        if (n > VP_MAX_OPS)
            st = vp__error_at_pos(b->err, VP_ELIMIT, b->path,
                                  f->ops.entries[k].at,
                                  "the model expands to more than %u ops "
                                  "and block instances",
                                  VP_MAX_OPS);
    }
    free(z.memo);
    free(z.busy);
    return st;
}

/* ---- the graph -------------------------------------------------------------- */

/* An input op: the graph's `input` (or `context`, always float) shape in
 * this instantiation. */
static vp_status input_op(gb *b, scope *top, bool ctx, uint32_t *out)
{
    const vp_gform *f = b->f;
    vp_op o;
    memset(&o, 0, sizeof o);
    o.kind = VP_OP_INPUT;
    o.value = ctx ? VP_VAL_FLOAT : f->input_kind;
    o.name = ctx ? "context" : "input";
    const vp_gexpr *dims = ctx ? f->context : f->input;
    uint32_t n = ctx ? f->context_ndim : f->input_ndim;
    for (uint32_t i = 0; i < n; i++) {
        VP_TRY(size_of(b, top, &dims[i], 1, &o.shape[o.ndim]));
        o.ndim++;
    }
    return push(b, &o, ctx ? f->context_at : f->input_at, out);
}

vp_status vp__build_explicit(vp_graph *g, const vp_gform *f, const char *path,
                             vp_error *err)
{
    gb b = {g, f, path, err, 0};
    if (g->batch > INT64_MAX || g->seq > INT64_MAX)
        return vp_error_set(err, VP_ERANGE, "batch or sequence too large");
    VP_TRY(check_size(&b));
    scope top;
    memset(&top, 0, sizeof top);
    top.prefix = "";
    top.top = true;
    top.input = top.context = NO_OP;
    top.vars[top.n_vars++] = (vp_expr_var){"batch", (int64_t)g->batch};
    top.vars[top.n_vars++] = (vp_expr_var){"seq", (int64_t)g->seq};
    top.vars[top.n_vars++] = (vp_expr_var){"image", (int64_t)g->seq};
    for (uint32_t i = 0; i < f->n_consts; i++) {
        int64_t v;
        VP_TRY(eval(&b, &top, &f->consts[i], &v));
        top.vars[top.n_vars++] = (vp_expr_var){f->const_names[i], v};
    }
    uint32_t x;
    VP_TRY(input_op(&b, &top, false, &x));
    top.input = x;
    if (f->context)
        VP_TRY(input_op(&b, &top, true, &top.context));
    top.made = malloc((f->ops.n ? f->ops.n : 1) * sizeof *top.made);
    if (!top.made)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    vp_status st = build_list(&b, &top, &f->ops, &x);
    free(top.made);
    return st;
}
