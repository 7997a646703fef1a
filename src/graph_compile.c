/* The graph form compiled at load: the `graph:` section of a model file
 * read into plain values (graph_form.h), every check that does not depend
 * on the batch and the sequence length made here, with the file's
 * positions: keys, types, names and references, blocks and their
 * parameters. Strings are copied into the model's arena, so nothing of the
 * YAML document is needed afterwards. docs/MODEL_FORMAT.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_form.h"
#include "yaml_doc.h"

#define MAX_PATTERNS 64
#define MAX_LOCALS_SUGGESTED 64

static const char *const GRAPH_KEYS[] = {"consts", "input", "input_kind",
                                         "context", "blocks", "ops",
                                         "checkpoint", NULL};
static const char *const BLOCK_KEYS[] = {"params", "ops", NULL};
static const char *const CALL_KEYS[] = {"name", "block", "repeat", "with",
                                        "input", "hold_input", NULL};

typedef struct {
    vp_arena *a;
    vp_ydoc *d;
    vp_error *err;
    vp_gform *f;
    yaml_node_t *blocks;   /* the `blocks` mapping, or NULL              */
    uint8_t *state;        /* per block: 0 not compiled, 1 compiling, 2 done */
} gc;

/* The names of a list's entries so far, for references. */
typedef struct {
    const char **names;
    uint32_t n;
} locals;

static vp_status nomem(gc *c)
{
    return vp_error_set(c->err, VP_ENOMEM, "out of memory");
}

static void *alloc(gc *c, size_t n, size_t size)
{
    if (n && size > SIZE_MAX / n)
        return NULL;
    return vp__arena_alloc(c->a, n * size > 0 ? n * size : 1);
}

static size_t seq_len(const yaml_node_t *n)
{
    return (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
}

static size_t map_len(const yaml_node_t *n)
{
    return (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
}

/* ---- values ---------------------------------------------------------------- */

static vp_status expr(gc *c, yaml_node_t *n, vp_gexpr *out)
{
    const char *text = vp__yscalar(n);
    if (!text || !*text)
        return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                        "expected an integer or an expression");
    out->text = vp__arena_strdup(c->a, text);
    if (!out->text)
        return nomem(c);
    out->at = vp__ypos(n);
    out->lead = n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? 0 : 1;
    return VP_OK;
}

static vp_status str(gc *c, yaml_node_t *n, const char **out)
{
    const char *v;
    VP_TRY(vp__yget_str(c->d, n, &v, c->err));
    *out = vp__arena_strdup(c->a, v);
    return *out ? VP_OK : nomem(c);
}

/* A reference by name to an earlier entry of the list, `$input` or
 * `$context`. */
static vp_status resolve(gc *c, const locals *l, yaml_node_t *n, int32_t *out)
{
    const char *name = vp__yscalar(n);
    if (!name)
        return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                        "an input must be the name of an op");
    if (!strcmp(name, "$input")) {
        *out = VP_GREF_INPUT;
        return VP_OK;
    }
    if (!strcmp(name, "$context")) {
        if (!c->f->context)
            return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                            "'$context' needs the graph's 'context' (the "
                            "shape of the model's second input)");
        *out = VP_GREF_CONTEXT;
        return VP_OK;
    }
    for (uint32_t i = l->n; i-- > 0;) {
        if (!strcmp(l->names[i], name)) {
            *out = (int32_t)i;
            return VP_OK;
        }
    }
    const char *cands[MAX_LOCALS_SUGGESTED + 1];
    size_t k = 0;
    for (uint32_t i = 0; i < l->n && k < MAX_LOCALS_SUGGESTED; i++)
        cands[k++] = l->names[i];
    cands[k] = NULL;
    const char *sug = vp__suggest(name, cands);
    if (sug)
        return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                        "no op named '%.64s' before this one (did you mean "
                        "'%s'?)",
                        name, sug);
    return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                    "no op named '%.64s' before this one in this list", name);
}

/* ---- op entries ---------------------------------------------------------- */

static vp_status list_attr(gc *c, yaml_node_t *v, vp_gkey key, vp_gattr *at)
{
    if (v->type != YAML_SEQUENCE_NODE)
        return vp__yerr(c->d, v, VP_ESCHEMA, c->err,
                        key == VP_GK_SHAPE
                            ? "reshape needs 'shape': a list of sizes"
                            : "permute needs 'dims': a list");
    at->n_items = (uint32_t)seq_len(v);
    at->items = alloc(c, at->n_items, sizeof *at->items);
    if (!at->items)
        return nomem(c);
    uint32_t k = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start;
         it < v->data.sequence.items.top; it++, k++)
        VP_TRY(expr(c, vp__ynode(c->d, *it), &at->items[k]));
    return VP_OK;
}

static vp_status attr(gc *c, const locals *l, yaml_node_t *v, vp_gkey key,
                      vp_gattr *at)
{
    at->key = key;
    at->at = vp__ypos(v);
    switch (vp__gkey_value(key)) {
    case VP_GV_EXPR:
        return expr(c, v, &at->expr);
    case VP_GV_BOOL:
        return vp__yget_bool(c->d, v, &at->b, c->err);
    case VP_GV_PROB:
        return vp__yget_prob(c->d, v, &at->p, c->err);
    case VP_GV_ENUM:
        return vp__yget_enum(c->d, v, vp__gkey_choices(key), &at->e, c->err);
    case VP_GV_LIST:
        return list_attr(c, v, key, at);
    case VP_GV_REF:
        return resolve(c, l, v, &at->ref);
    }
    return VP_OK;
}

/* The keys an op's kind requires, in the order of its keys; a list is
 * asked for by what it holds. */
static vp_status required(gc *c, yaml_node_t *n, const vp_gentry *e)
{
    const vp_gkind *gk = &vp__gkinds[e->kind];
    for (uint32_t i = 0; i < gk->n_keys; i++) {
        vp_gkey k = gk->keys[i];
        if (!(gk->required & (1u << k)) || vp__gattr(e, k))
            continue;
        if (k == VP_GK_SHAPE)
            return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                            "reshape needs 'shape': a list of sizes");
        if (k == VP_GK_DIMS)
            return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                            "permute needs 'dims': a list");
        return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                        "missing required key '%s'", vp__gkey_name(k));
    }
    return VP_OK;
}

/* The inputs named by `input` or `inputs` (none: the previous entry). */
static vp_status inputs(gc *c, const locals *l, yaml_node_t *n, vp_gentry *e,
                        yaml_node_t **inl_out)
{
    vp_ydoc *d = c->d;
    yaml_node_t *in1 = vp__ymap_get(d, n, "input", NULL);
    yaml_node_t *inl = vp__ymap_get(d, n, "inputs", NULL);
    *inl_out = inl;
    if (in1 && inl)
        return vp__yerr(d, inl, VP_ESCHEMA, c->err,
                        "give either 'input' or 'inputs', not both");
    if (in1) {
        VP_TRY(resolve(c, l, in1, &e->in[0]));
        e->n_in = 1;
        return VP_OK;
    }
    if (!inl)
        return VP_OK;
    if (inl->type != YAML_SEQUENCE_NODE)
        return vp__yerr(d, inl, VP_ESCHEMA, c->err,
                        "'inputs' must be a list of op names");
    for (yaml_node_item_t *it = inl->data.sequence.items.start;
         it < inl->data.sequence.items.top; it++) {
        if (e->n_in == VP_OP_MAX_INPUTS)
            return vp__yerr(d, inl, VP_ESCHEMA, c->err, "at most %d inputs",
                            VP_OP_MAX_INPUTS);
        VP_TRY(resolve(c, l, vp__ynode(d, *it), &e->in[e->n_in]));
        e->n_in++;
    }
    if (e->n_in == 0)
        return vp__yerr(d, inl, VP_ESCHEMA, c->err, "'inputs' is empty");
    return VP_OK;
}

/* The op kind named by `op`: one of the graph form's kinds, in the order
 * of VP_OP_KIND_MAP. */
static vp_status op_kind(gc *c, yaml_node_t *kn, vp_op_kind *out)
{
    const char *names[VP_OP__COUNT + 1];
    vp_op_kind kinds[VP_OP__COUNT];
    size_t n = 0;
    for (int k = 0; k < VP_OP__COUNT; k++) {
        if (!vp__gkinds[k].keys)
            continue;
        kinds[n] = (vp_op_kind)k;
        names[n++] = vp_op_kind_name((vp_op_kind)k);
    }
    names[n] = NULL;
    int ki;
    VP_TRY(vp__yget_enum(c->d, kn, names, &ki, c->err));
    *out = kinds[ki];
    return VP_OK;
}

/* The keys an op of its kind accepts (besides name, op, input, inputs). */
static vp_status check_keys(gc *c, yaml_node_t *n, const vp_gentry *e)
{
    const vp_gkind *gk = &vp__gkinds[e->kind];
    const char *allowed[4 + VP_GK__COUNT + 1] = {"name", "op", "input",
                                                 "inputs"};
    size_t na = 4;
    for (uint32_t i = 0; i < gk->n_keys; i++)
        allowed[na++] = vp__gkey_name(gk->keys[i]);
    allowed[na] = NULL;
    const char *kind = vp_op_kind_name(e->kind);
    char what[96];
    snprintf(what, sizeof what, "%s %s op",
             strchr("aeiou", kind[0]) ? "an" : "a", kind);
    return vp__ymap_check(c->d, n, allowed, what, c->err);
}

/* The attributes of an op entry, each read as its key's kind of value. */
static vp_status attrs(gc *c, const locals *l, yaml_node_t *n, vp_gentry *e)
{
    const vp_gkind *gk = &vp__gkinds[e->kind];
    e->attrs = alloc(c, map_len(n), sizeof *e->attrs);
    if (!e->attrs)
        return nomem(c);
    for (yaml_node_pair_t *pr = n->data.mapping.pairs.start;
         pr < n->data.mapping.pairs.top; pr++) {
        const char *k = vp__yscalar(vp__ynode(c->d, pr->key));
        for (uint32_t i = 0; i < gk->n_keys; i++) {
            if (strcmp(k, vp__gkey_name(gk->keys[i])) != 0)
                continue;
            vp_gattr *at = &e->attrs[e->n_attrs++];
            VP_TRY(attr(c, l, vp__ynode(c->d, pr->value), gk->keys[i], at));
        }
    }
    return VP_OK;
}

static vp_status op_entry(gc *c, const locals *l, yaml_node_t *n,
                          uint32_t index, vp_gentry *e)
{
    vp_ydoc *d = c->d;
    VP_TRY(op_kind(c, vp__ymap_get(d, n, "op", NULL), &e->kind));
    VP_TRY(check_keys(c, n, e));
    const char *kind = vp_op_kind_name(e->kind);
    yaml_node_t *nn = vp__ymap_get(d, n, "name", NULL);
    if (nn) {
        VP_TRY(str(c, nn, &e->leaf));
        e->name_at = vp__ypos(nn);
    } else {
        e->leaf = vp__arena_printf(c->a, "%s%u", kind, index);
        if (!e->leaf)
            return nomem(c);
    }
    yaml_node_t *inl;
    VP_TRY(inputs(c, l, n, e, &inl));
    bool learned = e->kind == VP_OP_ADD && vp__ymap_get(d, n, "learned", NULL);
    if (e->n_in > 1 && (!vp__gkinds[e->kind].multi_input || learned))
        return vp__yerr(d, inl, VP_ESCHEMA, c->err, "%s takes one input",
                        kind);
    VP_TRY(attrs(c, l, n, e));
    return required(c, n, e);
}

/* ---- block invocations --------------------------------------------------- */

static vp_status compile_block_ops(gc *c, uint32_t k);

/* The block named by `block` (its index in the `blocks` mapping). */
static vp_status find_block(gc *c, yaml_node_t *bn, const char *bname,
                            uint32_t *out)
{
    uint32_t k = 0;
    if (c->blocks)
        for (yaml_node_pair_t *pr = c->blocks->data.mapping.pairs.start;
             pr < c->blocks->data.mapping.pairs.top; pr++, k++) {
            const char *name = vp__yscalar(vp__ynode(c->d, pr->key));
            if (name && !strcmp(name, bname)) {
                *out = k;
                return VP_OK;
            }
        }
    const char *cands[MAX_LOCALS_SUGGESTED + 1];
    size_t n = 0;
    if (c->blocks)
        for (yaml_node_pair_t *pr = c->blocks->data.mapping.pairs.start;
             pr < c->blocks->data.mapping.pairs.top &&
             n < MAX_LOCALS_SUGGESTED;
             pr++)
            cands[n++] = vp__yscalar(vp__ynode(c->d, pr->key));
    cands[n] = NULL;
    const char *sug = vp__suggest(bname, cands);
    return vp__yerr(c->d, bn, VP_ESCHEMA, c->err,
                    "unknown block '%.64s'%s%s%s", bname,
                    sug ? " (did you mean '" : "", sug ? sug : "",
                    sug ? "'?)" : "");
}

/* `with`: a value for each parameter of the block that it names; the
 * others take their defaults, which they must have. */
static vp_status call_with(gc *c, yaml_node_t *n, const char *bname,
                           vp_gentry *e)
{
    vp_ydoc *d = c->d;
    const vp_gblock *blk = &c->f->blocks[e->block];
    yaml_node_t *wn = vp__ymap_get(d, n, "with", NULL);
    if (wn && wn->type != YAML_MAPPING_NODE)
        return vp__yerr(d, wn, VP_ESCHEMA, c->err,
                        "'with' must be a mapping of parameter values");
    e->with = alloc(c, blk->n_params, sizeof *e->with);
    if (!e->with)
        return nomem(c);
    if (wn) {
        for (yaml_node_pair_t *pr = wn->data.mapping.pairs.start;
             pr < wn->data.mapping.pairs.top; pr++) {
            yaml_node_t *kn = vp__ynode(d, pr->key);
            const char *k = vp__yscalar(kn);
            uint32_t i = 0;
            while (k && i < blk->n_params && strcmp(blk->params[i], k))
                i++;
            if (!k || i == blk->n_params)
                return vp__yerr(d, kn, VP_ESCHEMA, c->err,
                                "block '%.64s' has no parameter '%.64s'",
                                bname, k ? k : "?");
            VP_TRY(expr(c, vp__ynode(d, pr->value), &e->with[i]));
        }
    }
    for (uint32_t i = 0; i < blk->n_params; i++)
        if (!e->with[i].text && !blk->defaults[i].text)
            return vp__yerr(d, n, VP_ESCHEMA, c->err,
                            "block '%.64s' needs a value for parameter "
                            "'%.64s' (in 'with')",
                            bname, blk->params[i]);
    return VP_OK;
}

static vp_status call_entry(gc *c, const locals *l, yaml_node_t *n,
                            uint32_t index, vp_gentry *e)
{
    vp_ydoc *d = c->d;
    e->call = true;
    VP_TRY(vp__ymap_check(d, n, CALL_KEYS, "a block invocation", c->err));
    yaml_node_t *bn = vp__ymap_get(d, n, "block", NULL);
    const char *bname;
    VP_TRY(vp__yget_str(d, bn, &bname, c->err));
    VP_TRY(find_block(c, bn, bname, &e->block));
    e->repeat = 1;
    yaml_node_t *rn = vp__ymap_get(d, n, "repeat", NULL);
    if (rn)
        VP_TRY(vp__yget_u64(d, rn, 1, VP_MAX_REPEAT, &e->repeat, c->err));
    e->repeated = rn != NULL;
    yaml_node_t *hn = vp__ymap_get(d, n, "hold_input", NULL);
    if (hn)
        VP_TRY(vp__yget_bool(d, hn, &e->hold, c->err));
    yaml_node_t *nn = vp__ymap_get(d, n, "name", NULL);
    if (nn) {
        VP_TRY(str(c, nn, &e->leaf));
        e->name_at = vp__ypos(nn);
    } else {
        e->leaf = vp__arena_printf(c->a, "%s%u", bname, index);
        if (!e->leaf)
            return nomem(c);
    }
    yaml_node_t *in1 = vp__ymap_get(d, n, "input", NULL);
    if (in1) {
        VP_TRY(resolve(c, l, in1, &e->in[0]));
        e->n_in = 1;
    }
    VP_TRY(call_with(c, n, bname, e));
    /* the block's ops, where it is first used (its errors come in the
     * order the model runs) */
    return compile_block_ops(c, e->block);
}

/* ---- lists ------------------------------------------------------------------ */

static vp_status list(gc *c, yaml_node_t *ln, vp_glist *out)
{
    vp_ydoc *d = c->d;
    if (!ln || ln->type != YAML_SEQUENCE_NODE)
        return vp__yerr(d, ln, VP_ESCHEMA, c->err, "'ops' must be a list");
    size_t n = seq_len(ln);
    out->entries = alloc(c, n, sizeof *out->entries);
    locals l = {alloc(c, n, sizeof(const char *)), 0};
    if (!out->entries || !l.names)
        return nomem(c);
    uint32_t index = 0;
    for (yaml_node_item_t *it = ln->data.sequence.items.start;
         it < ln->data.sequence.items.top; it++, index++) {
        yaml_node_t *en = vp__ynode(d, *it);
        if (!en || en->type != YAML_MAPPING_NODE)
            return vp__yerr(d, en, VP_ESCHEMA, c->err,
                            "each entry of 'ops' must be a mapping");
        vp_gentry *e = &out->entries[index];
        e->at = vp__ypos(en);
        e->name_at = e->at;
        if (vp__ymap_get(d, en, "block", NULL)) {
            VP_TRY(call_entry(c, &l, en, index, e));
        } else {
            if (!vp__ymap_get(d, en, "op", NULL))
                return vp__yerr(d, en, VP_ESCHEMA, c->err,
                                "an entry of 'ops' needs 'op' or 'block'");
            VP_TRY(op_entry(c, &l, en, index, e));
        }
        /* a name used twice: at the invocation's name, or at the op */
        for (uint32_t i = 0; i < l.n; i++)
            if (!strcmp(l.names[i], e->leaf))
                return vp__error_at_pos(c->err, VP_ESCHEMA, d->path,
                                        e->call ? e->name_at : e->at,
                                        "the name '%.64s' is used twice in "
                                        "this list",
                                        e->leaf);
        l.names[l.n++] = e->leaf;
        out->n = l.n;
    }
    if (index == 0)
        return vp__yerr(d, ln, VP_ESCHEMA, c->err, "'ops' is empty");
    return VP_OK;
}

/* ---- blocks -------------------------------------------------------------- */

static yaml_node_t *block_def(gc *c, uint32_t k)
{
    yaml_node_pair_t *pr = c->blocks->data.mapping.pairs.start + k;
    return vp__ynode(c->d, pr->value);
}

static vp_status compile_block_ops(gc *c, uint32_t k)
{
    if (c->state[k])
        return VP_OK; /* done, or being compiled: a block that invokes
                         itself fails when it is instantiated */
    c->state[k] = 1;
    yaml_node_t *ops = vp__ymap_get(c->d, block_def(c, k), "ops", NULL);
    VP_TRY(list(c, ops, &c->f->blocks[k].ops));
    c->state[k] = 2;
    return VP_OK;
}

/* A block's name and parameters (its ops come where it is invoked). */
static vp_status block_header(gc *c, uint32_t k)
{
    vp_ydoc *d = c->d;
    yaml_node_pair_t *pr = c->blocks->data.mapping.pairs.start + k;
    yaml_node_t *bd = vp__ynode(d, pr->value);
    vp_gblock *blk = &c->f->blocks[k];
    const char *name = vp__yscalar(vp__ynode(d, pr->key));
    if (name && !(blk->name = vp__arena_strdup(c->a, name)))
        return nomem(c);
    VP_TRY(vp__ymap_check(d, bd, BLOCK_KEYS, "a block", c->err));
    if (!vp__ymap_get(d, bd, "ops", NULL))
        return vp__yerr(d, bd, VP_ESCHEMA, c->err, "a block needs 'ops'");
    yaml_node_t *pn = vp__ymap_get(d, bd, "params", NULL);
    if (!pn)
        return VP_OK;
    if (pn->type != YAML_MAPPING_NODE)
        return vp__yerr(d, pn, VP_ESCHEMA, c->err,
                        "'params' must be a mapping of names to defaults");
    size_t np = map_len(pn);
    blk->params = alloc(c, np, sizeof *blk->params);
    blk->param_at = alloc(c, np, sizeof *blk->param_at);
    blk->defaults = alloc(c, np, sizeof *blk->defaults);
    if (!blk->params || !blk->param_at || !blk->defaults)
        return nomem(c);
    for (pr = pn->data.mapping.pairs.start; pr < pn->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *kn = vp__ynode(d, pr->key), *dv = vp__ynode(d, pr->value);
        uint32_t i = blk->n_params++;
        VP_TRY(str(c, kn, &blk->params[i]));
        blk->param_at[i] = vp__ypos(kn);
        if (!vp__yis_null(dv))
            VP_TRY(expr(c, dv, &blk->defaults[i]));
    }
    return VP_OK;
}

static vp_status blocks(gc *c, yaml_node_t *gn)
{
    c->blocks = vp__ymap_get(c->d, gn, "blocks", NULL);
    if (!c->blocks)
        return VP_OK;
    if (c->blocks->type != YAML_MAPPING_NODE)
        return vp__yerr(c->d, c->blocks, VP_ESCHEMA, c->err,
                        "'blocks' must be a mapping of block names");
    size_t n = map_len(c->blocks);
    c->f->blocks = alloc(c, n, sizeof *c->f->blocks);
    c->state = calloc(n ? n : 1, 1);
    if (!c->f->blocks || !c->state)
        return nomem(c);
    c->f->n_blocks = (uint32_t)n;
    for (uint32_t k = 0; k < n; k++)
        VP_TRY(block_header(c, k));
    return VP_OK;
}

/* ---- the graph section ----------------------------------------------------- */

static vp_status consts(gc *c, yaml_node_t *gn)
{
    vp_ydoc *d = c->d;
    yaml_node_t *cn = vp__ymap_get(d, gn, "consts", NULL);
    if (!cn)
        return VP_OK;
    if (cn->type != YAML_MAPPING_NODE)
        return vp__yerr(d, cn, VP_ESCHEMA, c->err,
                        "'consts' must be a mapping of names to sizes");
    size_t n = map_len(cn);
    vp_gform *f = c->f;
    f->const_names = alloc(c, n, sizeof *f->const_names);
    f->consts = alloc(c, n, sizeof *f->consts);
    if (!f->const_names || !f->consts)
        return nomem(c);
    for (yaml_node_pair_t *pr = cn->data.mapping.pairs.start;
         pr < cn->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = vp__ynode(d, pr->key);
        VP_TRY(expr(c, vp__ynode(d, pr->value), &f->consts[f->n_consts]));
        if (f->n_consts == VP_GFORM_MAX_VARS - 3)
            return vp__yerr(d, kn, VP_ELIMIT, c->err,
                            "too many constants (at most %d)", VP_GFORM_MAX_VARS - 3);
        VP_TRY(str(c, kn, &f->const_names[f->n_consts]));
        f->n_consts++;
    }
    return VP_OK;
}

static vp_status patterns(gc *c, yaml_node_t *gn)
{
    vp_ydoc *d = c->d;
    yaml_node_t *ck = vp__ymap_get(d, gn, "checkpoint", NULL);
    if (!ck)
        return VP_OK;
    if (ck->type != YAML_SEQUENCE_NODE)
        return vp__yerr(d, ck, VP_ESCHEMA, c->err,
                        "'checkpoint' must be a list of name patterns");
    vp_gform *f = c->f;
    f->has_patterns = true;
    f->patterns = alloc(c, seq_len(ck), sizeof *f->patterns);
    if (!f->patterns)
        return nomem(c);
    for (yaml_node_item_t *it = ck->data.sequence.items.start;
         it < ck->data.sequence.items.top; it++) {
        if (f->n_patterns == MAX_PATTERNS)
            return vp__yerr(d, ck, VP_ELIMIT, c->err,
                            "at most %d checkpoint patterns", MAX_PATTERNS);
        VP_TRY(str(c, vp__ynode(d, *it), &f->patterns[f->n_patterns]));
        f->n_patterns++;
    }
    return VP_OK;
}

/* A shape: a list of size expressions (the `input`, the `context`). */
static vp_status shape_list(gc *c, yaml_node_t *in, const char *key,
                            vp_gexpr **out, uint32_t *ndim)
{
    vp_ydoc *d = c->d;
    *out = alloc(c, VP_MAX_DIMS, sizeof **out);
    if (!*out)
        return nomem(c);
    for (yaml_node_item_t *it = in->data.sequence.items.start;
         it < in->data.sequence.items.top; it++) {
        if (*ndim == VP_MAX_DIMS)
            return vp__yerr(d, in, VP_ESCHEMA, c->err, "at most %d dims",
                            VP_MAX_DIMS);
        VP_TRY(expr(c, vp__ynode(d, *it), &(*out)[*ndim]));
        (*ndim)++;
    }
    if (*ndim == 0)
        return vp__yerr(d, in, VP_ESCHEMA, c->err, "'%s' is empty", key);
    return VP_OK;
}

/* `context`: the shape of a second float input (the conditioning that
 * cross-attention reads, e.g. [batch, 77, 768]), optional. */
static vp_status context(gc *c, yaml_node_t *gn)
{
    yaml_node_t *cn = vp__ymap_get(c->d, gn, "context", NULL);
    if (!cn)
        return VP_OK;
    if (cn->type != YAML_SEQUENCE_NODE)
        return vp__yerr(c->d, cn, VP_ESCHEMA, c->err,
                        "'context' is the second input's shape as a list, "
                        "e.g. [batch, 77, 768]");
    c->f->context_at = vp__ypos(cn);
    return shape_list(c, cn, "context", &c->f->context,
                      &c->f->context_ndim);
}

static vp_status input(gc *c, yaml_node_t *gn)
{
    vp_ydoc *d = c->d;
    vp_gform *f = c->f;
    yaml_node_t *in = vp__ymap_get(d, gn, "input", NULL);
    if (!in || in->type != YAML_SEQUENCE_NODE)
        return vp__yerr(d, in ? in : gn, VP_ESCHEMA, c->err,
                        "graph needs 'input': the input's shape as a list, "
                        "e.g. [batch, 3, image, image]");
    f->input_at = vp__ypos(in);
    VP_TRY(shape_list(c, in, "input", &f->input, &f->input_ndim));
    f->input_kind = VP_VAL_FLOAT;
    yaml_node_t *ik = vp__ymap_get(d, gn, "input_kind", NULL);
    if (ik) {
        static const char *const kinds[] = {"float", "index", NULL};
        int k;
        VP_TRY(vp__yget_enum(d, ik, kinds, &k, c->err));
        f->input_kind = k ? VP_VAL_INDEX : VP_VAL_FLOAT;
    }
    return VP_OK;
}

static vp_status compile(gc *c, yaml_node_t *gn)
{
    VP_TRY(vp__ymap_check(c->d, gn, GRAPH_KEYS, "graph", c->err));
    VP_TRY(consts(c, gn));
    VP_TRY(context(c, gn));
    VP_TRY(blocks(c, gn));
    VP_TRY(patterns(c, gn));
    VP_TRY(input(c, gn));
    yaml_node_t *ops = vp__ymap_get(c->d, gn, "ops", NULL);
    if (!ops)
        return vp__yerr(c->d, gn, VP_ESCHEMA, c->err, "graph needs 'ops'");
    VP_TRY(list(c, ops, &c->f->ops));
    /* the blocks no invocation reached */
    for (uint32_t k = 0; k < c->f->n_blocks; k++)
        VP_TRY(compile_block_ops(c, k));
    return VP_OK;
}

vp_status vp__graph_compile(vp_arena *a, vp_ydoc *d, yaml_node_t *gn,
                            vp_gform **out, vp_error *err)
{
    gc c = {a, d, err, NULL, NULL, NULL};
    c.f = vp__arena_alloc(a, sizeof *c.f);
    if (!c.f)
        return nomem(&c);
    vp_status st = compile(&c, gn);
    free(c.state);
    if (st == VP_OK)
        *out = c.f;
    return st;
}
