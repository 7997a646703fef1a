/* Expansion of the explicit graph form: ops with shapes inferred from their
 * inputs, named blocks invoked with parameters and `repeat`, checkpoint
 * units matched by name patterns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define NO_OP UINT32_MAX
#define MAX_VARS 64
#define MAX_PATTERNS 64

typedef struct {
    const char *name;
    uint32_t op;
} local;

typedef struct scope {
    const char *prefix;          /* "" at the top level                  */
    vp_expr_var vars[MAX_VARS];
    size_t n_vars;
    uint32_t input;              /* the block's input op                 */
    local *locals;
    size_t n_locals, cap_locals;
    int depth;
    bool top;
} scope;

typedef struct {
    vp_graph *g;
    vp_model *m;
    vp_ydoc *d;
    vp_error *err;
    yaml_node_t *blocks;         /* mapping name -> block, or NULL       */
    const char *patterns[MAX_PATTERNS];
    size_t n_patterns;
    bool has_patterns;
    uint64_t expanded;           /* block instances expanded             */
} gb;

#define TRY(x)                                                             \
    do {                                                                   \
        vp_status st_ = (x);                                               \
        if (st_ != VP_OK)                                                  \
            return st_;                                                    \
    } while (0)

static const char *const GRAPH_KEYS[] = {"consts", "input", "input_kind",
                                         "blocks", "ops", "checkpoint", NULL};
static const char *const BLOCK_KEYS[] = {"params", "ops", NULL};
static const char *const CALL_KEYS[] = {"name", "block", "repeat", "with",
                                        "input", "hold_input", NULL};
static const char *const OP_KIND_NAMES[] = {
    "linear", "conv2d", "batchnorm2d", "layernorm", "rmsnorm", "groupnorm",
    "embedding", "attention", "relu", "gelu", "gelu_tanh", "silu", "tanh",
    "sigmoid", "dropout", "maxpool2d", "avgpool2d", "adaptive_avgpool2d",
    "add", "mul", "concat", "flatten", "reshape", "permute", "select",
    "softmax", "cross_entropy", "mse_loss", NULL};

/* Keys each op accepts besides name, op, input, inputs. */
static const char *const *op_keys(const char *kind)
{
    static const char *const lin[] = {"out", "bias", "tied_to", NULL};
    static const char *const conv[] = {"out", "kernel", "stride", "padding",
                                       "groups", "bias", NULL};
    static const char *const none[] = {NULL};
    static const char *const ln[] = {"bias", NULL};
    static const char *const gn[] = {"groups", NULL};
    static const char *const emb[] = {"vocab", "dim", "tied_to", NULL};
    static const char *const att[] = {"heads", "kv_heads", "head_dim",
                                      "causal", "impl", "dropout", "bias",
                                      "layout", "hold_input", NULL};
    static const char *const act[] = {"inplace", NULL};
    static const char *const drop[] = {"p", NULL};
    static const char *const pool[] = {"kernel", "stride", "padding", NULL};
    static const char *const apool[] = {"out", NULL};
    static const char *const add[] = {"inplace", "learned", NULL};
    static const char *const cat[] = {"dim", "learned_tokens", NULL};
    static const char *const flat[] = {"start", NULL};
    static const char *const resh[] = {"shape", NULL};
    static const char *const perm[] = {"dims", NULL};
    static const char *const sel[] = {"dim", "index", NULL};
    static const struct {
        const char *k;
        const char *const *keys;
    } t[] = {{"linear", lin},       {"conv2d", conv},
             {"batchnorm2d", none}, {"layernorm", ln},
             {"rmsnorm", none},     {"groupnorm", gn},
             {"embedding", emb},    {"attention", att},
             {"relu", act},         {"gelu", act},
             {"gelu_tanh", act},    {"silu", act},
             {"tanh", act},         {"sigmoid", act},
             {"dropout", drop},     {"maxpool2d", pool},
             {"avgpool2d", pool},   {"adaptive_avgpool2d", apool},
             {"add", add},          {"mul", none},
             {"concat", cat},       {"flatten", flat},
             {"reshape", resh},     {"permute", perm},
             {"select", sel},       {"softmax", none},
             {"cross_entropy", none}, {"mse_loss", none}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(t[i].k, kind))
            return t[i].keys;
    return none;
}

/* ---- expressions ------------------------------------------------------ */

static vp_status eval(gb *b, scope *s, yaml_node_t *n, int64_t *out)
{
    const char *text = vp__yscalar(n);
    if (!text || !*text)
        return vp__yerr(b->d, n, VP_ESCHEMA, b->err,
                        "expected an integer or an expression");
    size_t pos;
    char msg[200];
    vp_status st = vp__expr_eval(text, s->vars, s->n_vars, out, &pos, msg,
                                 sizeof msg);
    if (st != VP_OK) {
        uint32_t q = n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? 0 : 1;
        return vp_error_at(b->err, st, b->d->path,
                           (uint32_t)n->start_mark.line + 1,
                           (uint32_t)(n->start_mark.column + pos + q) + 1, 1,
                           "%s", msg);
    }
    return VP_OK;
}

/* A size: an expression whose value is in [min, 2^40]. */
static vp_status size_of(gb *b, scope *s, yaml_node_t *n, int64_t min,
                         uint64_t *out)
{
    int64_t v;
    TRY(eval(b, s, n, &v));
    if (v < min)
        return vp__yerr(b->d, n, VP_ERANGE, b->err,
                        "'%.64s' is %lld here; it must be at least %lld",
                        vp__yscalar(n), (long long)v, (long long)min);
    if ((uint64_t)v > ((uint64_t)1 << 40))
        return vp__yerr(b->d, n, VP_ERANGE, b->err,
                        "'%.64s' is %lld here, larger than 2^40",
                        vp__yscalar(n), (long long)v);
    *out = (uint64_t)v;
    return VP_OK;
}

static vp_status key_size(gb *b, scope *s, yaml_node_t *op, const char *key,
                          uint64_t dflt, int64_t min, bool required,
                          uint64_t *out)
{
    yaml_node_t *n = vp__ymap_get(b->d, op, key, NULL);
    if (!n) {
        if (required)
            return vp__yerr(b->d, op, VP_ESCHEMA, b->err,
                            "missing required key '%s'", key);
        *out = dflt;
        return VP_OK;
    }
    return size_of(b, s, n, min, out);
}

static vp_status key_bool(gb *b, yaml_node_t *op, const char *key, bool dflt,
                          bool *out)
{
    yaml_node_t *n = vp__ymap_get(b->d, op, key, NULL);
    *out = dflt;
    if (!n)
        return VP_OK;
    return vp__yget_bool(b->d, n, out, b->err);
}

/* ---- names and ops ---------------------------------------------------- */

static vp_status add_local(gb *b, scope *s, const char *name, uint32_t op,
                           yaml_node_t *at)
{
    for (size_t i = 0; i < s->n_locals; i++)
        if (!strcmp(s->locals[i].name, name))
            return vp__yerr(b->d, at, VP_ESCHEMA, b->err,
                            "the name '%.64s' is used twice in this list",
                            name);
    if (!vp__grow((void **)&s->locals, &s->cap_locals, s->n_locals + 1,
                  sizeof(local)))
        return vp_error_set(b->err, VP_ENOMEM, "out of memory");
    s->locals[s->n_locals++] = (local){name, op};
    return VP_OK;
}

static vp_status resolve(gb *b, scope *s, yaml_node_t *n, uint32_t *op)
{
    const char *name = vp__yscalar(n);
    if (!name)
        return vp__yerr(b->d, n, VP_ESCHEMA, b->err,
                        "an input must be the name of an op");
    if (!strcmp(name, "$input")) {
        if (s->input == NO_OP)
            return vp__yerr(b->d, n, VP_ESCHEMA, b->err,
                            "'$input' used where there is no input");
        *op = s->input;
        return VP_OK;
    }
    for (size_t i = s->n_locals; i-- > 0;) {
        if (!strcmp(s->locals[i].name, name)) {
            *op = s->locals[i].op;
            return VP_OK;
        }
    }
    const char *cands[65];
    size_t k = 0;
    for (size_t i = 0; i < s->n_locals && k < 64; i++)
        cands[k++] = s->locals[i].name;
    cands[k] = NULL;
    const char *sug = vp__suggest(name, cands);
    if (sug)
        return vp__yerr(b->d, n, VP_ESCHEMA, b->err,
                        "no op named '%.64s' before this one (did you mean "
                        "'%s'?)",
                        name, sug);
    return vp__yerr(b->d, n, VP_ESCHEMA, b->err,
                    "no op named '%.64s' before this one in this list", name);
}

static const char *full_name(gb *b, scope *s, const char *leaf)
{
    return s->prefix[0] ? vp__arena_printf(&b->g->arena, "%s.%s", s->prefix,
                                           leaf)
                        : vp__arena_strdup(&b->g->arena, leaf);
}

static vp_status param(gb *b, vp_op *o, const char *leaf, uint64_t numel,
                       bool trainable, uint32_t *idx)
{
    char name[256];
    snprintf(name, sizeof name, "%s.%s", o->name, leaf);
    uint32_t i;
    TRY(vp__graph_add_param(b->g, name, numel, (uint32_t)b->g->n_ops,
                            trainable, &i, b->err));
    o->params[o->n_params++] = i;
    if (idx)
        *idx = i;
    return VP_OK;
}

static vp_status mul2(gb *b, yaml_node_t *at, uint64_t x, uint64_t y,
                      uint64_t *out)
{
    if (!vp_mul_u64(x, y, out))
        return vp__yerr(b->d, at, VP_EOVERFLOW, b->err,
                        "size overflows 64 bits");
    return VP_OK;
}

static vp_status push(gb *b, vp_op *o, yaml_node_t *at, uint32_t *idx)
{
    vp_status st = vp__graph_add_op(b->g, o, idx, b->err);
    if (st == VP_EOVERFLOW)
        return vp__yerr(b->d, at, VP_EOVERFLOW, b->err,
                        "the output of '%.100s' has more than 2^64 elements",
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

/* The weight of o: shared with the op named by `tied_to` (its first
 * parameter, which must have the same number of elements), else new. */
static vp_status weight(gb *b, scope *s, yaml_node_t *n, vp_op *o,
                        uint64_t numel)
{
    yaml_node_t *tn = vp__ymap_get(b->d, n, "tied_to", NULL);
    if (!tn)
        return param(b, o, "weight", numel, true, NULL);
    uint32_t src;
    TRY(resolve(b, s, tn, &src));
    const vp_op *so = &b->g->ops[src];
    if (!so->n_params || so->kind == VP_OP_INPUT)
        return vp__yerr(b->d, tn, VP_ESCHEMA, b->err,
                        "'%.64s' has no weight to share", so->name);
    const vp_param *sp = &b->g->params[so->params[0]];
    if (sp->numel != numel)
        return vp__yerr(b->d, tn, VP_ESCHEMA, b->err,
                        "cannot tie to '%.64s': its weight has %llu elements, "
                        "this one needs %llu",
                        so->name, (unsigned long long)sp->numel,
                        (unsigned long long)numel);
    o->params[o->n_params++] = so->params[0];
    return VP_OK;
}

static vp_status out_of_range(gb *b, yaml_node_t *at, const vp_op *o,
                              const char *what)
{
    return vp__yerr(b->d, at, VP_ERANGE, b->err, "%s: %s", o->name, what);
}

/* Build one primitive op (or the ops of an attention) from its mapping. */
static vp_status build_op(gb *b, scope *s, yaml_node_t *n, uint32_t prev,
                          uint32_t index, uint32_t *out)
{
    vp_ydoc *d = b->d;
    yaml_node_t *kn = vp__ymap_get(d, n, "op", NULL);
    int ki;
    TRY(vp__yget_enum(d, kn, OP_KIND_NAMES, &ki, b->err));
    const char *kind = OP_KIND_NAMES[ki];
    /* allowed keys */
    const char *allowed[16] = {"name", "op", "input", "inputs"};
    size_t na = 4;
    for (const char *const *k = op_keys(kind); *k; k++)
        allowed[na++] = *k;
    allowed[na] = NULL;
    char what[96];
    snprintf(what, sizeof what, "%s %s op",
             strchr("aeiou", kind[0]) ? "an" : "a", kind);
    TRY(vp__ymap_check(d, n, allowed, what, b->err));
    const char *leaf = NULL;
    yaml_node_t *nn = vp__ymap_get(d, n, "name", NULL);
    char auto_name[64];
    if (nn) {
        TRY(vp__yget_str(d, nn, &leaf, b->err));
    } else {
        snprintf(auto_name, sizeof auto_name, "%s%u", kind, index);
        leaf = auto_name;
    }

    /* inputs */
    uint32_t ins[VP_OP_MAX_INPUTS];
    uint32_t n_in = 0;
    yaml_node_t *in1 = vp__ymap_get(d, n, "input", NULL);
    yaml_node_t *inl = vp__ymap_get(d, n, "inputs", NULL);
    if (in1 && inl)
        return vp__yerr(d, inl, VP_ESCHEMA, b->err,
                        "give either 'input' or 'inputs', not both");
    if (in1) {
        TRY(resolve(b, s, in1, &ins[0]));
        n_in = 1;
    } else if (inl) {
        if (inl->type != YAML_SEQUENCE_NODE)
            return vp__yerr(d, inl, VP_ESCHEMA, b->err,
                            "'inputs' must be a list of op names");
        for (yaml_node_item_t *it = inl->data.sequence.items.start;
             it < inl->data.sequence.items.top; it++) {
            if (n_in == VP_OP_MAX_INPUTS)
                return vp__yerr(d, inl, VP_ESCHEMA, b->err,
                                "at most %d inputs", VP_OP_MAX_INPUTS);
            TRY(resolve(b, s, vp__ynode(d, *it), &ins[n_in]));
            n_in++;
        }
        if (n_in == 0)
            return vp__yerr(d, inl, VP_ESCHEMA, b->err,
                            "'inputs' is empty");
    } else {
        if (prev == NO_OP)
            return vp__yerr(d, n, VP_ESCHEMA, b->err,
                            "this op has no input");
        ins[0] = prev;
        n_in = 1;
    }

    vp_graph *g = b->g;
    vp_op o;
    memset(&o, 0, sizeof o);
    o.value = VP_VAL_FLOAT;
    o.name = full_name(b, s, leaf);
    if (!o.name)
        return vp_error_set(b->err, VP_ENOMEM, "out of memory");
    o.n_inputs = 1;
    o.inputs[0] = ins[0];
    const vp_op *x = &g->ops[ins[0]];
    o.ndim = x->ndim;
    memcpy(o.shape, x->shape, sizeof o.shape);
    uint64_t last = x->ndim ? x->shape[x->ndim - 1] : 1;
    uint64_t v = 0, w = 0;
    bool bias;

    bool binary = !strcmp(kind, "mul") ||
                  (!strcmp(kind, "add") && !vp__ymap_get(d, n, "learned", NULL));
    bool multi = binary || !strcmp(kind, "concat");
    if (n_in > 1 && !multi)
        return vp__yerr(d, inl, VP_ESCHEMA, b->err, "%s takes one input",
                        kind);
    if (x->value != VP_VAL_FLOAT && strcmp(kind, "embedding"))
        return vp__yerr(d, n, VP_ESCHEMA, b->err,
                        "%s needs a float input; '%.64s' gives indices", kind,
                        x->name);
    if (x->ndim == 0 && strcmp(kind, "embedding"))
        return vp__yerr(d, n, VP_ESCHEMA, b->err,
                        "%s cannot take the scalar output of '%.64s'", kind,
                        x->name);

    if (!strcmp(kind, "linear")) {
        o.kind = VP_OP_LINEAR;
        TRY(key_size(b, s, n, "out", 0, 1, true, &v));
        TRY(key_bool(b, n, "bias", true, &bias));
        o.in_features = last;
        o.out_features = v;
        o.shape[o.ndim - 1] = v;
        TRY(mul2(b, n, last, v, &w));
        TRY(weight(b, s, n, &o, w));
        if (bias)
            TRY(param(b, &o, "bias", v, true, NULL));
    } else if (!strcmp(kind, "conv2d")) {
        o.kind = VP_OP_CONV2D;
        if (x->ndim != 4)
            return vp__yerr(d, n, VP_ESCHEMA, b->err,
                            "conv2d needs a 4-d input [N, C, H, W]; '%.64s' "
                            "has %u dims",
                            x->name, x->ndim);
        uint64_t k, st, pad, grp;
        TRY(key_size(b, s, n, "out", 0, 1, true, &v));
        TRY(key_size(b, s, n, "kernel", 0, 1, true, &k));
        TRY(key_size(b, s, n, "stride", 1, 1, false, &st));
        TRY(key_size(b, s, n, "padding", 0, 0, false, &pad));
        TRY(key_size(b, s, n, "groups", 1, 1, false, &grp));
        TRY(key_bool(b, n, "bias", true, &bias));
        uint64_t c = x->shape[1];
        if (c % grp || v % grp)
            return out_of_range(b, n, &o,
                                "channels are not a multiple of groups");
        for (int i = 2; i < 4; i++) {
            uint64_t h = x->shape[i] + 2 * pad;
            if (h < k)
                return out_of_range(b, n, &o,
                                    "the kernel is larger than the padded "
                                    "image");
            o.shape[i] = (h - k) / st + 1;
        }
        uint64_t kk = 0;
        TRY(mul2(b, n, k, k, &kk));
        if (k > UINT32_MAX || st > UINT32_MAX || pad > UINT32_MAX ||
            grp > UINT32_MAX)
            return out_of_range(b, n, &o,
                                "kernel, stride, padding and groups must be "
                                "below 2^32");
        o.shape[1] = v;
        o.in_features = c;
        o.out_features = v;
        o.kernel = (uint32_t)k;
        o.stride = (uint32_t)st;
        o.padding = (uint32_t)pad;
        o.groups = (uint32_t)grp;
        TRY(mul2(b, n, v, c / grp, &w));
        TRY(mul2(b, n, w, kk, &w));
        TRY(param(b, &o, "weight", w, true, NULL));
        if (bias)
            TRY(param(b, &o, "bias", v, true, NULL));
    } else if (!strcmp(kind, "batchnorm2d")) {
        o.kind = VP_OP_BATCHNORM2D;
        if (x->ndim < 2)
            return vp__yerr(d, n, VP_ESCHEMA, b->err,
                            "batchnorm2d needs [N, C, ...]");
        uint64_t c = x->shape[1];
        uint32_t nb;
        TRY(param(b, &o, "weight", c, true, NULL));
        TRY(param(b, &o, "bias", c, true, NULL));
        TRY(param(b, &o, "running_mean", c, false, NULL));
        TRY(param(b, &o, "running_var", c, false, NULL));
        /* num_batches_tracked: an int64 buffer of one element */
        char pname[256];
        snprintf(pname, sizeof pname, "%s.num_batches_tracked", o.name);
        TRY(vp__graph_add_param(g, pname, 1, (uint32_t)g->n_ops, false, &nb,
                                b->err));
        g->params[nb].elem_bytes_override = 8;
        o.rows = c;
    } else if (!strcmp(kind, "layernorm") || !strcmp(kind, "rmsnorm")) {
        o.kind = kind[0] == 'l' ? VP_OP_LAYERNORM : VP_OP_RMSNORM;
        bias = o.kind == VP_OP_LAYERNORM;
        if (o.kind == VP_OP_LAYERNORM)
            TRY(key_bool(b, n, "bias", true, &bias));
        TRY(param(b, &o, "weight", last, true, NULL));
        if (bias)
            TRY(param(b, &o, "bias", last, true, NULL));
        o.rows = x->numel / last;
    } else if (!strcmp(kind, "groupnorm")) {
        o.kind = VP_OP_GROUPNORM;
        uint64_t grp;
        TRY(key_size(b, s, n, "groups", 0, 1, true, &grp));
        if (x->ndim < 2 || x->shape[1] % grp)
            return out_of_range(b, n, &o,
                                "channels are not a multiple of groups");
        o.groups = (uint32_t)grp;
        TRY(param(b, &o, "weight", x->shape[1], true, NULL));
        TRY(param(b, &o, "bias", x->shape[1], true, NULL));
        o.rows = x->shape[0] * grp;
    } else if (!strcmp(kind, "embedding")) {
        o.kind = VP_OP_EMBEDDING;
        if (x->value != VP_VAL_INDEX)
            return vp__yerr(d, n, VP_ESCHEMA, b->err,
                            "embedding needs token indices as input "
                            "(input_kind: index)");
        uint64_t voc, dim;
        TRY(key_size(b, s, n, "vocab", 0, 1, true, &voc));
        TRY(key_size(b, s, n, "dim", 0, 1, true, &dim));
        if (o.ndim >= VP_MAX_DIMS)
            return vp__yerr(d, n, VP_ESCHEMA, b->err, "too many dims");
        o.shape[o.ndim++] = dim;
        o.classes = voc;
        TRY(mul2(b, n, voc, dim, &w));
        TRY(weight(b, s, n, &o, w));
    } else if (!strcmp(kind, "attention")) {
        if (x->ndim != 3)
            return vp__yerr(d, n, VP_ESCHEMA, b->err,
                            "attention needs [batch, seq, dim]; '%.64s' has "
                            "%u dims",
                            x->name, x->ndim);
        uint64_t heads, kvh, hd;
        static const char *const impls[] = {"sdpa", "flash", "efficient",
                                            "eager", "math", NULL};
        TRY(key_size(b, s, n, "heads", 0, 1, true, &heads));
        TRY(key_size(b, s, n, "kv_heads", heads, 1, false, &kvh));
        if (last % heads && !vp__ymap_get(d, n, "head_dim", NULL))
            return out_of_range(b, n, &o, "dim is not a multiple of heads");
        TRY(key_size(b, s, n, "head_dim", last / heads, 1, false, &hd));
        if (heads % kvh)
            return out_of_range(b, n, &o,
                                "heads is not a multiple of kv_heads");
        TRY(key_bool(b, n, "bias", true, &bias));
        bool causal;
        TRY(key_bool(b, n, "causal", false, &causal));
        int impl = 0;
        yaml_node_t *in_ = vp__ymap_get(d, n, "impl", NULL);
        if (in_)
            TRY(vp__yget_enum(d, in_, impls, &impl, b->err));
        double p = 0.0;
        yaml_node_t *pn = vp__ymap_get(d, n, "dropout", NULL);
        if (pn)
            TRY(vp__yget_prob(d, pn, &p, b->err));
        /* layout: packed (q, k, v split by views of one projection,
         * [batch, seq, heads, head_dim]) or torch_mha
         * (torch.nn.MultiheadAttention(batch_first=True)) */
        static const char *const layouts[] = {"packed", "torch_mha", NULL};
        int lay = 0;
        yaml_node_t *ln_ = vp__ymap_get(d, n, "layout", NULL);
        if (ln_)
            TRY(vp__yget_enum(d, ln_, layouts, &lay, b->err));
        bool hold;
        TRY(key_bool(b, n, "hold_input", false, &hold));
        if (lay == 1 && (kvh != heads || last % heads || hd != last / heads))
            return out_of_range(b, ln_, &o,
                                "layout torch_mha needs kv_heads = heads and "
                                "head_dim = dim / heads");
        uint32_t mha = lay == 1 ? VP_OPF_TORCH_MHA : 0;
        /* in_proj (packed q, k, v), core, out_proj */
        vp_op q = o;
        q.kind = VP_OP_LINEAR;
        q.name = vp__arena_printf(&g->arena, "%s.in_proj", o.name);
        uint64_t qd = 0, kvd = 0, qkv = 0;
        TRY(mul2(b, n, heads, hd, &qd));
        TRY(mul2(b, n, kvh, hd, &kvd));
        TRY(mul2(b, n, kvd, 2, &kvd));
        if (!vp_add_u64(qd, kvd, &qkv))
            return vp__yerr(d, n, VP_EOVERFLOW, b->err,
                            "heads x head_dim overflows 64 bits");
        q.in_features = last;
        q.out_features = qkv;
        q.shape[2] = qkv;
        q.flags |= mha;
        TRY(mul2(b, n, last, qkv, &w));
        TRY(param(b, &q, "weight", w, true, NULL));
        if (bias)
            TRY(param(b, &q, "bias", qkv, true, NULL));
        uint32_t qi, ci;
        TRY(push(b, &q, n, &qi));
        vp_op c;
        memset(&c, 0, sizeof c);
        c.kind = VP_OP_ATTENTION;
        c.value = VP_VAL_FLOAT;
        c.name = vp__arena_printf(&g->arena, "%s.core", o.name);
        c.n_inputs = 1;
        c.inputs[0] = qi;
        c.ndim = 3;
        c.shape[0] = x->shape[0];
        c.shape[1] = x->shape[1];
        c.shape[2] = qd;
        c.heads = (uint32_t)heads;
        c.kv_heads = (uint32_t)kvh;
        c.head_dim = (uint32_t)hd;
        c.q_len = c.kv_len = x->shape[1];
        c.causal = causal;
        c.attn_impl = (vp_attn_impl)impl;
        c.dropout = p;
        c.flags = mha;
        TRY(push(b, &c, n, &ci));
        vp_op po = o;
        po.kind = VP_OP_LINEAR;
        po.n_params = 0;
        po.name = vp__arena_printf(&g->arena, "%s.out_proj", o.name);
        po.inputs[0] = ci;
        po.in_features = qd;
        po.out_features = last;
        po.flags |= mha;
        TRY(mul2(b, n, qd, last, &w));
        TRY(param(b, &po, "weight", w, true, NULL));
        if (bias)
            TRY(param(b, &po, "bias", last, true, NULL));
        TRY(push(b, &po, n, out));
        if (hold)
            hold_input(b, ins[0], *out);
        return VP_OK;
    } else if (!strcmp(kind, "relu") || !strcmp(kind, "gelu") ||
               !strcmp(kind, "gelu_tanh") || !strcmp(kind, "silu") ||
               !strcmp(kind, "tanh") || !strcmp(kind, "sigmoid")) {
        o.kind = !strcmp(kind, "relu")        ? VP_OP_RELU
                 : !strcmp(kind, "gelu")      ? VP_OP_GELU
                 : !strcmp(kind, "gelu_tanh") ? VP_OP_GELU_TANH
                 : !strcmp(kind, "silu")      ? VP_OP_SILU
                 : !strcmp(kind, "tanh")      ? VP_OP_TANH
                                              : VP_OP_SIGMOID;
        TRY(key_bool(b, n, "inplace", false, &o.inplace));
    } else if (!strcmp(kind, "dropout")) {
        o.kind = VP_OP_DROPOUT;
        yaml_node_t *pn = vp__ymap_get(d, n, "p", NULL);
        if (!pn)
            return vp__yerr(d, n, VP_ESCHEMA, b->err,
                            "missing required key 'p'");
        TRY(vp__yget_prob(d, pn, &o.dropout, b->err));
    } else if (!strcmp(kind, "maxpool2d") || !strcmp(kind, "avgpool2d")) {
        o.kind = kind[0] == 'm' ? VP_OP_MAXPOOL2D : VP_OP_AVGPOOL2D;
        if (x->ndim != 4)
            return vp__yerr(d, n, VP_ESCHEMA, b->err,
                            "%s needs a 4-d input [N, C, H, W]", kind);
        uint64_t k, st, pad;
        TRY(key_size(b, s, n, "kernel", 0, 1, true, &k));
        TRY(key_size(b, s, n, "stride", k, 1, false, &st));
        TRY(key_size(b, s, n, "padding", 0, 0, false, &pad));
        for (int i = 2; i < 4; i++) {
            uint64_t h = x->shape[i] + 2 * pad;
            if (h < k)
                return out_of_range(b, n, &o,
                                    "the window is larger than the image");
            o.shape[i] = (h - k) / st + 1;
        }
        if (k > UINT32_MAX || st > UINT32_MAX || pad > UINT32_MAX)
            return out_of_range(b, n, &o,
                                "kernel, stride and padding must be below "
                                "2^32");
        o.kernel = (uint32_t)k;
        o.stride = (uint32_t)st;
        o.padding = (uint32_t)pad;
    } else if (!strcmp(kind, "adaptive_avgpool2d")) {
        o.kind = VP_OP_ADAPTIVE_AVGPOOL2D;
        if (x->ndim != 4)
            return vp__yerr(d, n, VP_ESCHEMA, b->err,
                            "adaptive_avgpool2d needs [N, C, H, W]");
        TRY(key_size(b, s, n, "out", 1, 1, false, &v));
        o.shape[2] = o.shape[3] = v;
    } else if (!strcmp(kind, "add") || !strcmp(kind, "mul")) {
        o.kind = kind[0] == 'a' ? VP_OP_ADD : VP_OP_MUL;
        bool learned = false;
        if (o.kind == VP_OP_ADD) {
            TRY(key_bool(b, n, "inplace", false, &o.inplace));
            TRY(key_bool(b, n, "learned", false, &learned));
        }
        if (learned) {
            if (n_in != 1)
                return vp__yerr(d, n, VP_ESCHEMA, b->err,
                                "a learned add takes one input");
            TRY(param(b, &o, "weight", x->numel / x->shape[0], true, NULL));
        } else {
            if (n_in != 2)
                return vp__yerr(d, n, VP_ESCHEMA, b->err,
                                "%s needs 'inputs' with two ops", kind);
            const vp_op *y = &g->ops[ins[1]];
            if (y->numel != x->numel && y->numel != 1 && x->numel % y->numel)
                return out_of_range(b, n, &o,
                                    "the two inputs have different shapes");
            o.n_inputs = 2;
            o.inputs[1] = ins[1];
        }
    } else if (!strcmp(kind, "concat")) {
        o.kind = VP_OP_CONCAT;
        uint64_t dim, tok;
        TRY(key_size(b, s, n, "dim", 1, 0, false, &dim));
        TRY(key_size(b, s, n, "learned_tokens", 0, 0, false, &tok));
        if (dim >= x->ndim)
            return out_of_range(b, n, &o, "dim is past the input's dims");
        if (tok) {
            if (n_in != 1)
                return vp__yerr(d, n, VP_ESCHEMA, b->err,
                                "concat with learned_tokens takes one input");
            TRY(mul2(b, n, x->numel / x->shape[0] / x->shape[dim], tok, &w));
            TRY(param(b, &o, "tokens", w, true, NULL));
            o.shape[dim] += tok;
        } else {
            if (n_in < 2)
                return vp__yerr(d, n, VP_ESCHEMA, b->err,
                                "concat needs 'inputs' with two or more ops");
            for (uint32_t i = 1; i < n_in; i++) {
                const vp_op *y = &g->ops[ins[i]];
                if (y->ndim != x->ndim)
                    return out_of_range(b, n, &o, "inputs differ in dims");
                o.shape[dim] += y->shape[dim];
                o.inputs[i] = ins[i];
            }
            o.n_inputs = n_in;
        }
    } else if (!strcmp(kind, "flatten")) {
        o.kind = VP_OP_FLATTEN;
        uint64_t st;
        TRY(key_size(b, s, n, "start", 1, 0, false, &st));
        if (st >= x->ndim)
            return out_of_range(b, n, &o, "start is past the input's dims");
        uint64_t r = 1;
        for (uint32_t i = (uint32_t)st; i < x->ndim; i++)
            r *= x->shape[i]; /* bounded by the input's numel */
        o.ndim = (uint32_t)st + 1;
        o.shape[st] = r;
    } else if (!strcmp(kind, "reshape")) {
        o.kind = VP_OP_RESHAPE;
        yaml_node_t *sh = vp__ymap_get(d, n, "shape", NULL);
        if (!sh || sh->type != YAML_SEQUENCE_NODE)
            return vp__yerr(d, sh ? sh : n, VP_ESCHEMA, b->err,
                            "reshape needs 'shape': a list of sizes");
        o.ndim = 0;
        for (yaml_node_item_t *it = sh->data.sequence.items.start;
             it < sh->data.sequence.items.top; it++) {
            if (o.ndim == VP_MAX_DIMS)
                return vp__yerr(d, sh, VP_ESCHEMA, b->err,
                                "at most %d dims", VP_MAX_DIMS);
            TRY(size_of(b, s, vp__ynode(d, *it), 1, &o.shape[o.ndim]));
            o.ndim++;
        }
        uint64_t ne;
        TRY(vp__shape_numel(o.shape, o.ndim, &ne, b->err));
        if (ne != x->numel)
            return vp__yerr(d, sh, VP_ERANGE, b->err,
                            "reshape to %llu elements from %llu",
                            (unsigned long long)ne,
                            (unsigned long long)x->numel);
    } else if (!strcmp(kind, "permute")) {
        o.kind = VP_OP_PERMUTE;
        yaml_node_t *dn = vp__ymap_get(d, n, "dims", NULL);
        if (!dn || dn->type != YAML_SEQUENCE_NODE)
            return vp__yerr(d, dn ? dn : n, VP_ESCHEMA, b->err,
                            "permute needs 'dims': a list");
        uint32_t k = 0;
        bool seen[VP_MAX_DIMS] = {false};
        for (yaml_node_item_t *it = dn->data.sequence.items.start;
             it < dn->data.sequence.items.top; it++, k++) {
            uint64_t p;
            yaml_node_t *pn = vp__ynode(d, *it);
            if (k >= x->ndim)
                return vp__yerr(d, dn, VP_ESCHEMA, b->err,
                                "more dims than the input has");
            TRY(size_of(b, s, pn, 0, &p));
            if (p >= x->ndim || seen[p])
                return vp__yerr(d, pn, VP_ERANGE, b->err,
                                "not a permutation of the input's dims");
            seen[p] = true;
            o.shape[k] = x->shape[p];
            if (p != k)
                o.flags |= VP_OPF_STRIDED;
        }
        if (k != x->ndim)
            return vp__yerr(d, dn, VP_ESCHEMA, b->err,
                            "permute needs all %u dims", x->ndim);
    } else if (!strcmp(kind, "select")) {
        o.kind = VP_OP_SELECT;
        uint64_t dim, idx;
        TRY(key_size(b, s, n, "dim", 1, 0, false, &dim));
        TRY(key_size(b, s, n, "index", 0, 0, false, &idx));
        if (dim >= x->ndim || idx >= x->shape[dim])
            return out_of_range(b, n, &o, "dim or index out of range");
        for (uint32_t i = (uint32_t)dim; i + 1 < x->ndim; i++)
            o.shape[i] = x->shape[i + 1];
        o.ndim--;
    } else if (!strcmp(kind, "softmax")) {
        o.kind = VP_OP_SOFTMAX;
        o.rows = x->numel / last;
    } else if (!strcmp(kind, "cross_entropy") || !strcmp(kind, "mse_loss")) {
        o.kind = kind[0] == 'c' ? VP_OP_CROSS_ENTROPY : VP_OP_MSE_LOSS;
        o.classes = last;
        o.rows = x->numel / last;
        o.ndim = 0;
    }
    return push(b, &o, n, out);
}

/* ---- lists, blocks, segments ----------------------------------------- */

static vp_status build_list(gb *b, scope *s, yaml_node_t *list, uint32_t *out);

static vp_status maybe_segment(gb *b, const char *name, uint32_t first,
                               uint32_t last, bool repeated, bool top,
                               yaml_node_t *at)
{
    bool match;
    if (b->has_patterns) {
        match = false;
        for (size_t i = 0; i < b->n_patterns; i++)
            if (vp__glob_match(b->patterns[i], name))
                match = true;
    } else {
        match = repeated && top;
    }
    if (!match || last < first)
        return VP_OK;
    for (uint32_t i = first; i <= last; i++)
        if (b->g->ops[i].segment >= 0)
            return vp__yerr(b->d, at, VP_ESCHEMA, b->err,
                            "checkpoint unit '%.64s' overlaps '%.64s'", name,
                            b->g->segs[b->g->ops[i].segment].name);
    return vp__graph_add_segment(b->g, name, first, last, true, b->err);
}

static vp_status call_block(gb *b, scope *s, yaml_node_t *n, uint32_t prev,
                            uint32_t index, uint32_t *out)
{
    vp_ydoc *d = b->d;
    TRY(vp__ymap_check(d, n, CALL_KEYS, "a block invocation", b->err));
    yaml_node_t *bn = vp__ymap_get(d, n, "block", NULL);
    const char *bname;
    TRY(vp__yget_str(d, bn, &bname, b->err));
    yaml_node_t *def = vp__ymap_get(d, b->blocks, bname, NULL);
    if (!def) {
        const char *cands[65];
        size_t k = 0;
        if (b->blocks)
            for (yaml_node_pair_t *pr = b->blocks->data.mapping.pairs.start;
                 pr < b->blocks->data.mapping.pairs.top && k < 64; pr++)
                cands[k++] = vp__yscalar(vp__ynode(d, pr->key));
        cands[k] = NULL;
        const char *sug = vp__suggest(bname, cands);
        return vp__yerr(d, bn, VP_ESCHEMA, b->err,
                        "unknown block '%.64s'%s%s%s", bname,
                        sug ? " (did you mean '" : "", sug ? sug : "",
                        sug ? "'?)" : "");
    }
    if (s->depth + 1 > VP_MAX_NEST)
        return vp__yerr(d, n, VP_ELIMIT, b->err,
                        "blocks nested deeper than %d (a block that invokes "
                        "itself?)",
                        VP_MAX_NEST);
    uint64_t repeat = 1;
    yaml_node_t *rn = vp__ymap_get(d, n, "repeat", NULL);
    if (rn)
        TRY(vp__yget_u64(d, rn, 1, VP_MAX_REPEAT, &repeat, b->err));
    bool hold;
    TRY(key_bool(b, n, "hold_input", false, &hold));
    const char *leaf;
    yaml_node_t *nn = vp__ymap_get(d, n, "name", NULL);
    char auto_name[64];
    if (nn) {
        TRY(vp__yget_str(d, nn, &leaf, b->err));
    } else {
        snprintf(auto_name, sizeof auto_name, "%s%u", bname, index);
        leaf = vp__arena_strdup(&b->g->arena, auto_name);
        if (!leaf)
            return vp_error_set(b->err, VP_ENOMEM, "out of memory");
    }
    yaml_node_t *in1 = vp__ymap_get(d, n, "input", NULL);
    uint32_t x = prev;
    if (in1)
        TRY(resolve(b, s, in1, &x));
    if (x == NO_OP)
        return vp__yerr(d, n, VP_ESCHEMA, b->err, "this block has no input");

    /* parameters: defaults, then `with`, evaluated in the caller's scope */
    scope inner;
    memset(&inner, 0, sizeof inner);
    inner.depth = s->depth + 1;
    inner.n_vars = 0;
    for (size_t i = 0; i < s->n_vars; i++)
        inner.vars[inner.n_vars++] = s->vars[i];
    yaml_node_t *pn = vp__ymap_get(d, def, "params", NULL);
    yaml_node_t *wn = vp__ymap_get(d, n, "with", NULL);
    if (wn && wn->type != YAML_MAPPING_NODE)
        return vp__yerr(d, wn, VP_ESCHEMA, b->err,
                        "'with' must be a mapping of parameter values");
    if (pn && pn->type != YAML_MAPPING_NODE)
        return vp__yerr(d, pn, VP_ESCHEMA, b->err,
                        "'params' must be a mapping of names to defaults");
    if (wn) {
        for (yaml_node_pair_t *pr = wn->data.mapping.pairs.start;
             pr < wn->data.mapping.pairs.top; pr++) {
            yaml_node_t *kn = vp__ynode(d, pr->key);
            const char *k = vp__yscalar(kn);
            if (!k || !vp__ymap_get(d, pn, k, NULL))
                return vp__yerr(d, kn, VP_ESCHEMA, b->err,
                                "block '%.64s' has no parameter '%.64s'",
                                bname, k ? k : "?");
        }
    }
    if (pn) {
        for (yaml_node_pair_t *pr = pn->data.mapping.pairs.start;
             pr < pn->data.mapping.pairs.top; pr++) {
            yaml_node_t *kn = vp__ynode(d, pr->key);
            const char *k = vp__yscalar(kn);
            yaml_node_t *val = vp__ymap_get(d, wn, k, NULL);
            int64_t v;
            if (val) {
                TRY(eval(b, s, val, &v));
            } else {
                yaml_node_t *dv = vp__ynode(d, pr->value);
                if (vp__yis_null(dv))
                    return vp__yerr(d, n, VP_ESCHEMA, b->err,
                                    "block '%.64s' needs a value for "
                                    "parameter '%.64s' (in 'with')",
                                    bname, k);
                TRY(eval(b, &inner, dv, &v));
            }
            if (inner.n_vars == MAX_VARS)
                return vp__yerr(d, kn, VP_ELIMIT, b->err,
                                "too many names in scope (at most %d)",
                                MAX_VARS);
            inner.vars[inner.n_vars++] = (vp_expr_var){k, v};
        }
    }
    yaml_node_t *ops = vp__ymap_get(d, def, "ops", NULL);
    vp_status st = VP_OK;
    for (uint64_t r = 0; r < repeat && st == VP_OK; r++) {
        if (++b->expanded > VP_MAX_OPS) {
            st = vp__yerr(d, n, VP_ELIMIT, b->err,
                          "the model expands to more than %u blocks",
                          VP_MAX_OPS);
            break;
        }
        const char *inst =
            rn ? (s->prefix[0]
                      ? vp__arena_printf(&b->g->arena, "%s.%s.%llu", s->prefix,
                                         leaf, (unsigned long long)r)
                      : vp__arena_printf(&b->g->arena, "%s.%llu", leaf,
                                         (unsigned long long)r))
               : full_name(b, s, leaf);
        if (!inst) {
            st = vp_error_set(b->err, VP_ENOMEM, "out of memory");
            break;
        }
        inner.prefix = inst;
        inner.input = x;
        inner.n_locals = 0;
        uint32_t first = (uint32_t)b->g->n_ops;
        uint32_t arg = x;
        st = build_list(b, &inner, ops, &x);
        if (st == VP_OK && hold)
            hold_input(b, arg, (uint32_t)b->g->n_ops - 1);
        if (st == VP_OK)
            st = maybe_segment(b, inst, first, (uint32_t)b->g->n_ops - 1,
                               rn != NULL, s->top, n);
    }
    free(inner.locals);
    if (st != VP_OK)
        return st;
    *out = x;
    return add_local(b, s, leaf, x, nn ? nn : n);
}

static vp_status build_list(gb *b, scope *s, yaml_node_t *list, uint32_t *out)
{
    vp_ydoc *d = b->d;
    if (!list || list->type != YAML_SEQUENCE_NODE)
        return vp__yerr(d, list, VP_ESCHEMA, b->err,
                        "'ops' must be a list");
    uint32_t prev = s->input;
    uint32_t index = 0;
    for (yaml_node_item_t *it = list->data.sequence.items.start;
         it < list->data.sequence.items.top; it++, index++) {
        yaml_node_t *n = vp__ynode(d, *it);
        if (!n || n->type != YAML_MAPPING_NODE)
            return vp__yerr(d, n, VP_ESCHEMA, b->err,
                            "each entry of 'ops' must be a mapping");
        uint32_t o;
        if (vp__ymap_get(d, n, "block", NULL)) {
            TRY(call_block(b, s, n, prev, index, &o));
        } else {
            if (!vp__ymap_get(d, n, "op", NULL))
                return vp__yerr(d, n, VP_ESCHEMA, b->err,
                                "an entry of 'ops' needs 'op' or 'block'");
            uint32_t first = (uint32_t)b->g->n_ops;
            TRY(build_op(b, s, n, prev, index, &o));
            yaml_node_t *nn = vp__ymap_get(d, n, "name", NULL);
            char auto_name[64];
            snprintf(auto_name, sizeof auto_name, "%s%u",
                     vp__yscalar(vp__ymap_get(d, n, "op", NULL)), index);
            const char *lname =
                nn ? vp__yscalar(nn) : vp__arena_strdup(&b->g->arena, auto_name);
            if (!lname)
                return vp_error_set(b->err, VP_ENOMEM, "out of memory");
            TRY(add_local(b, s, lname, o, n));
            if (b->has_patterns) {
                const char *full = full_name(b, s, lname);
                if (!full)
                    return vp_error_set(b->err, VP_ENOMEM, "out of memory");
                TRY(maybe_segment(b, full, first, o, false, s->top, n));
            }
        }
        prev = o;
    }
    if (prev == s->input)
        return vp__yerr(d, list, VP_ESCHEMA, b->err, "'ops' is empty");
    *out = prev;
    return VP_OK;
}

vp_status vp__build_explicit(vp_graph *g, vp_model *m, vp_error *err)
{
    vp_ydoc *d = &m->ydoc;
    yaml_node_t *gn = m->graph_node;
    gb b;
    memset(&b, 0, sizeof b);
    b.g = g;
    b.m = m;
    b.d = d;
    b.err = err;
    TRY(vp__ymap_check(d, gn, GRAPH_KEYS, "graph", err));
    scope top;
    memset(&top, 0, sizeof top);
    top.prefix = "";
    top.top = true;
    top.input = NO_OP;
    if (g->batch > INT64_MAX || g->seq > INT64_MAX)
        return vp_error_set(err, VP_ERANGE, "batch or sequence too large");
    top.vars[top.n_vars++] = (vp_expr_var){"batch", (int64_t)g->batch};
    top.vars[top.n_vars++] = (vp_expr_var){"seq", (int64_t)g->seq};
    top.vars[top.n_vars++] = (vp_expr_var){"image", (int64_t)g->seq};
    yaml_node_t *cn = vp__ymap_get(d, gn, "consts", NULL);
    if (cn) {
        if (cn->type != YAML_MAPPING_NODE)
            return vp__yerr(d, cn, VP_ESCHEMA, err,
                            "'consts' must be a mapping of names to sizes");
        for (yaml_node_pair_t *pr = cn->data.mapping.pairs.start;
             pr < cn->data.mapping.pairs.top; pr++) {
            yaml_node_t *kn = vp__ynode(d, pr->key);
            int64_t v;
            TRY(eval(&b, &top, vp__ynode(d, pr->value), &v));
            if (top.n_vars == MAX_VARS)
                return vp__yerr(d, kn, VP_ELIMIT, err,
                                "too many constants (at most %d)",
                                MAX_VARS - 3);
            top.vars[top.n_vars++] = (vp_expr_var){vp__yscalar(kn), v};
        }
    }
    b.blocks = vp__ymap_get(d, gn, "blocks", NULL);
    if (b.blocks) {
        if (b.blocks->type != YAML_MAPPING_NODE)
            return vp__yerr(d, b.blocks, VP_ESCHEMA, err,
                            "'blocks' must be a mapping of block names");
        for (yaml_node_pair_t *pr = b.blocks->data.mapping.pairs.start;
             pr < b.blocks->data.mapping.pairs.top; pr++) {
            yaml_node_t *bd = vp__ynode(d, pr->value);
            TRY(vp__ymap_check(d, bd, BLOCK_KEYS, "a block", err));
            if (!vp__ymap_get(d, bd, "ops", NULL))
                return vp__yerr(d, bd, VP_ESCHEMA, err,
                                "a block needs 'ops'");
        }
    }
    yaml_node_t *ck = vp__ymap_get(d, gn, "checkpoint", NULL);
    if (ck) {
        if (ck->type != YAML_SEQUENCE_NODE)
            return vp__yerr(d, ck, VP_ESCHEMA, err,
                            "'checkpoint' must be a list of name patterns");
        b.has_patterns = true;
        for (yaml_node_item_t *it = ck->data.sequence.items.start;
             it < ck->data.sequence.items.top; it++) {
            if (b.n_patterns == MAX_PATTERNS)
                return vp__yerr(d, ck, VP_ELIMIT, err,
                                "at most %d checkpoint patterns",
                                MAX_PATTERNS);
            TRY(vp__yget_str(d, vp__ynode(d, *it),
                             &b.patterns[b.n_patterns], err));
            b.n_patterns++;
        }
    }
    /* the input */
    yaml_node_t *in = vp__ymap_get(d, gn, "input", NULL);
    if (!in || in->type != YAML_SEQUENCE_NODE)
        return vp__yerr(d, in ? in : gn, VP_ESCHEMA, err,
                        "graph needs 'input': the input's shape as a list, "
                        "e.g. [batch, 3, image, image]");
    vp_op o;
    memset(&o, 0, sizeof o);
    o.kind = VP_OP_INPUT;
    o.value = VP_VAL_FLOAT;
    o.name = "input";
    for (yaml_node_item_t *it = in->data.sequence.items.start;
         it < in->data.sequence.items.top; it++) {
        if (o.ndim == VP_MAX_DIMS)
            return vp__yerr(d, in, VP_ESCHEMA, err, "at most %d dims",
                            VP_MAX_DIMS);
        TRY(size_of(&b, &top, vp__ynode(d, *it), 1, &o.shape[o.ndim]));
        o.ndim++;
    }
    if (o.ndim == 0)
        return vp__yerr(d, in, VP_ESCHEMA, err, "'input' is empty");
    yaml_node_t *ik = vp__ymap_get(d, gn, "input_kind", NULL);
    if (ik) {
        static const char *const kinds[] = {"float", "index", NULL};
        int k;
        TRY(vp__yget_enum(d, ik, kinds, &k, err));
        o.value = k ? VP_VAL_INDEX : VP_VAL_FLOAT;
    }
    uint32_t x;
    vp_status st = push(&b, &o, in, &x);
    if (st != VP_OK)
        return st;
    top.input = x;
    yaml_node_t *ops = vp__ymap_get(d, gn, "ops", NULL);
    if (!ops)
        return vp__yerr(d, gn, VP_ESCHEMA, err, "graph needs 'ops'");
    st = build_list(&b, &top, ops, &x);
    free(top.locals);
    return st;
}
