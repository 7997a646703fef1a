/* The layer graph: storage, accessors, FLOPs, segments and checkpoint
 * selection. The builders live in graph_transformer.c and
 * graph_explicit.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

size_t vp_graph_op_count(const vp_graph *g) { return g->n_ops; }
const vp_op *vp_graph_op(const vp_graph *g, size_t i)
{
    return i < g->n_ops ? &g->ops[i] : NULL;
}
size_t vp_graph_param_count(const vp_graph *g) { return g->n_params; }
const vp_param *vp_graph_param(const vp_graph *g, size_t i)
{
    return i < g->n_params ? &g->params[i] : NULL;
}
size_t vp_graph_segment_count(const vp_graph *g) { return g->n_segs; }
const vp_segment *vp_graph_segment(const vp_graph *g, size_t i)
{
    return i < g->n_segs ? &g->segs[i] : NULL;
}
uint64_t vp_graph_batch(const vp_graph *g) { return g->batch; }
uint64_t vp_graph_seq(const vp_graph *g) { return g->seq; }
uint64_t vp_graph_target(const vp_graph *g) { return g->target; }
const char *vp_graph_model_name(const vp_graph *g) { return g->model_name; }

void vp_graph_default_checkpoint(const vp_graph *g, bool *out)
{
    for (size_t i = 0; i < g->n_segs; i++)
        out[i] = g->seg_default[i];
}

vp_status vp_graph_num_params(const vp_graph *g, uint64_t *out, vp_error *err)
{
    uint64_t n = 0;
    for (size_t i = 0; i < g->n_params; i++) {
        if (!g->params[i].trainable)
            continue;
        if (!vp_add_u64(n, g->params[i].numel, &n))
            return vp_error_set(err, VP_EOVERFLOW,
                                "parameter count overflows 64 bits");
    }
    *out = n;
    return VP_OK;
}

/* The routed experts' parameters a token does not reach: of each
 * trainable stacked expert tensor ([E, ...]), the E - top_k experts'
 * share. */
static uint64_t idle_expert_params(const vp_graph *g)
{
    uint64_t idle = 0;
    for (size_t i = 0; i < g->n_ops; i++) {
        const vp_op *o = &g->ops[i];
        if (o->kind != VP_OP_MOE_EXPERTS || !o->classes ||
            o->top_k >= o->classes)
            continue;
        for (uint32_t j = 0; j < o->n_params; j++) {
            const vp_param *p = &g->params[o->params[j]];
            if (p->trainable) /* numel / E per expert, no overflow */
                idle += p->numel / o->classes * (o->classes - o->top_k);
        }
    }
    return idle;
}

vp_status vp_graph_num_active_params(const vp_graph *g, uint64_t *out,
                                     vp_error *err)
{
    uint64_t n;
    VP_TRY(vp_graph_num_params(g, &n, err));
    *out = n - idle_expert_params(g);
    return VP_OK;
}

void vp_graph_free(vp_graph *g)
{
    if (!g)
        return;
    free(g->ops);
    free(g->params);
    free(g->segs);
    free(g->seg_default);
    vp__arena_destroy(&g->arena);
    free(g);
}

vp_status vp__shape_numel(const uint64_t *shape, uint32_t ndim, uint64_t *out,
                          vp_error *err)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndim; i++)
        if (!vp_mul_u64(n, shape[i], &n))
            return vp_error_set(err, VP_EOVERFLOW,
                                "tensor size overflows 64 bits");
    *out = n;
    return VP_OK;
}

/* FLOPs of one op, forward and backward (multiply-add = 2). Doubles: these
 * are estimates for time, never byte counts. */
static void op_flops(const vp_graph *g, vp_op *op)
{
    double out = (double)op->numel;
    double in0 = op->n_inputs ? (double)g->ops[op->inputs[0]].numel : 0.0;
    bool in_grad = op->n_inputs && g->ops[op->inputs[0]].needs_grad;
    double f = 0.0, b = 0.0;
    switch (op->kind) {
    case VP_OP_LINEAR:
        f = 2.0 * out * (double)op->in_features;
        b = f * (in_grad ? 2.0 : 1.0);
        break;
    case VP_OP_CONV2D:
        f = 2.0 * out * (double)op->in_features / (double)op->groups *
            (double)op->kernel * (double)op->kernel;
        b = f * (in_grad ? 2.0 : 1.0);
        break;
    case VP_OP_CONV_TRANSPOSE2D: /* every input element meets the filter */
        f = 2.0 * in0 * (double)op->out_features / (double)op->groups *
            (double)op->kernel * (double)op->kernel;
        b = f * (in_grad ? 2.0 : 1.0);
        break;
    case VP_OP_ATTENTION: {
        double bh = (double)op->shape[0] * (double)op->heads;
        f = 4.0 * bh * (double)op->q_len * (double)op->kv_len *
            (double)op->head_dim;
        if (op->causal)
            f /= 2.0;
        b = 2.5 * f;
        break;
    }
    case VP_OP_MOE_EXPERTS: /* gate_up and down over tokens x top_k rows */
        f = 6.0 * (out / (double)op->in_features) * (double)op->top_k *
            (double)op->in_features * (double)op->out_features;
        b = 2.0 * f;
        break;
    case VP_OP_CROSS_ENTROPY:
    case VP_OP_SOFTMAX:
        f = 5.0 * in0;
        b = 3.0 * in0;
        break;
    case VP_OP_LAYERNORM:
    case VP_OP_RMSNORM:
    case VP_OP_GROUPNORM:
    case VP_OP_BATCHNORM2D:
        f = 5.0 * out;
        b = 8.0 * out;
        break;
    case VP_OP_GELU_TANH:
        f = 8.0 * out;
        b = 12.0 * out;
        break;
    case VP_OP_LORA: {
        /* lora_A and lora_B, plus the scaling and the sum */
        double r = op->in_features && op->n_params
                       ? (double)g->params[op->params[0]].numel /
                             (double)op->in_features
                       : 0.0;
        double rows = op->out_features ? out / (double)op->out_features : 0;
        f = 2.0 * rows * r *
                ((double)op->in_features + (double)op->out_features) +
            2.0 * out;
        b = 2.0 * f;
        break;
    }
    case VP_OP_INPUT:
    case VP_OP_FLATTEN:
    case VP_OP_RESHAPE:
    case VP_OP_PERMUTE:
    case VP_OP_SELECT:
        break;
    default:
        f = out;
        b = 2.0 * out;
        break;
    }
    op->flops_fwd = f;
    op->flops_bwd = op->needs_grad ? b : 0.0;
}

vp_status vp__graph_search_check(const vp_graph *g, vp_error *err)
{
    if (g->n_ops <= VP_MAX_SEARCH_OPS)
        return VP_OK;
    return vp_error_set(err, VP_ELIMIT,
                        "the model has %zu ops; a search (maxbatch, plan, "
                        "techniques, batching) simulates it many times and "
                        "takes at most %u (estimate takes up to %u)",
                        (size_t)g->n_ops, VP_MAX_SEARCH_OPS, VP_MAX_OPS);
}

void vp__graph_op_flops(const vp_graph *g, vp_op *op)
{
    op_flops(g, op);
}

vp_status vp__graph_add_op(vp_graph *g, const vp_op *op, uint32_t *idx,
                           vp_error *err)
{
    if (g->n_ops >= VP_MAX_OPS)
        return vp_error_set(err, VP_ELIMIT,
                            "the model expands to more than %u ops",
                            VP_MAX_OPS);
    if (!vp__grow((void **)&g->ops, &g->cap_ops, g->n_ops + 1, sizeof *op))
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    vp_op *o = &g->ops[g->n_ops];
    *o = *op;
    o->segment = -1;
    if (vp__shape_numel(o->shape, o->ndim, &o->numel, err) != VP_OK)
        return err ? err->code : VP_EOVERFLOW;
    bool ng = false;
    for (uint32_t i = 0; i < o->n_inputs; i++)
        ng |= g->ops[o->inputs[i]].needs_grad;
    for (uint32_t i = 0; i < o->n_params; i++)
        ng |= g->params[o->params[i]].trainable;
    o->needs_grad = ng;
    op_flops(g, o);
    *idx = (uint32_t)g->n_ops++;
    return VP_OK;
}

vp_status vp__graph_add_param(vp_graph *g, const char *name, uint64_t numel,
                              uint32_t op, bool trainable, uint32_t *idx,
                              vp_error *err)
{
    if (!vp__grow((void **)&g->params, &g->cap_params, g->n_params + 1,
                  sizeof(vp_param)))
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    vp_param *p = &g->params[g->n_params];
    memset(p, 0, sizeof *p);
    p->name = vp__arena_strdup(&g->arena, name);
    if (!p->name)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    p->numel = numel;
    p->op = op;
    p->trainable = trainable;
    *idx = (uint32_t)g->n_params++;
    return VP_OK;
}

vp_status vp__graph_add_segment(vp_graph *g, const char *name, uint32_t first,
                                uint32_t last, bool dflt, vp_error *err)
{
    size_t cap = g->cap_segs;
    if (!vp__grow((void **)&g->segs, &g->cap_segs, g->n_segs + 1,
                  sizeof(vp_segment)))
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    if (g->cap_segs != cap) {
        bool *nd = realloc(g->seg_default, g->cap_segs * sizeof(bool));
        if (!nd)
            return vp_error_set(err, VP_ENOMEM, "out of memory");
        g->seg_default = nd;
    }
    vp_segment *s = &g->segs[g->n_segs];
    s->name = vp__arena_strdup(&g->arena, name);
    if (!s->name)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    s->first_op = first;
    s->last_op = last;
    g->seg_default[g->n_segs] = dflt;
    for (uint32_t i = first; i <= last && i < g->n_ops; i++)
        if (g->ops[i].segment < 0)
            g->ops[i].segment = (int32_t)g->n_segs;
    g->n_segs++;
    return VP_OK;
}

/* tf: the transformer description to build, NULL for the model's form. */
static vp_graph *build(const vp_model *m, const vp_tf *tf, uint64_t batch,
                       uint64_t seq, uint64_t target, vp_error *err)
{
    vp_error_clear(err);
    if (batch == 0) {
        vp_error_set(err, VP_ERANGE, "the batch size must be at least 1");
        return NULL;
    }
    vp_graph *g = calloc(1, sizeof *g);
    if (!g) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        return NULL;
    }
    g->batch = batch;
    g->seq = seq ? seq : m->seq;
    if (tf && tf->type == VP_TF_ENCDEC)
        g->target = target ? target : m->target ? m->target : g->seq;
    g->model_name = vp__arena_strdup(&g->arena, m->name);
    g->path = m->path ? vp__arena_strdup(&g->arena, m->path) : NULL;
    if (tf) {
        g->has_tf = true;
        g->tf = *tf;
    }
    if (!g->model_name || (m->path && !g->path)) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        goto fail;
    }
    vp_status st = tf ? vp__build_transformer(g, tf, m->path, err)
                      : vp__build_explicit(g, m->gform, m->path, err);
    if (st != VP_OK)
        goto fail;
    return g;
fail:
    vp_graph_free(g);
    return NULL;
}

vp_graph *vp_graph_build(const vp_model *m, uint64_t batch, uint64_t seq,
                         vp_error *err)
{
    return build(m, m->form == 0 ? &m->tf : NULL, batch, seq, 0, err);
}

vp_graph *vp_graph_build_target(const vp_model *m, uint64_t batch,
                                uint64_t seq, uint64_t target,
                                vp_error *err)
{
    return build(m, m->form == 0 ? &m->tf : NULL, batch, seq, target, err);
}

vp_graph *vp__graph_build_tf(const vp_tf *t, const vp_model *m,
                             uint64_t batch, uint64_t seq, vp_error *err)
{
    return build(m, t, batch, seq, 0, err);
}

vp_graph *vp__graph_rebuild(const vp_graph *g, uint64_t batch, uint64_t seq,
                            vp_error *err)
{
    vp_model m;

    if (!g->has_tf) {
        vp_error_set(err, VP_EUNSUPPORTED,
                     "model '%s' is a layer graph, not a transformer "
                     "description",
                     g->model_name);
        return NULL;
    }
    memset(&m, 0, sizeof m);
    m.name = g->model_name;
    m.path = g->path;
    m.seq = g->seq;
    m.target = g->target; /* an encoder-decoder keeps its decoder length */
    return build(&m, &g->tf, batch, seq, g->target, err);
}

vp_status vp_graph_checkpoint_select(const vp_graph *g, const char *spec,
                                     bool *out, vp_error *err)
{
    for (size_t i = 0; i < g->n_segs; i++)
        out[i] = false;
    if (!spec || !strcmp(spec, "none") || !*spec)
        return VP_OK;
    if (!strcmp(spec, "all")) {
        vp_graph_default_checkpoint(g, out);
        return VP_OK;
    }
    const char *p = spec;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char pat[256];
        if (len == 0 || len >= sizeof pat)
            return vp_error_set(err, VP_EARG,
                                "bad checkpoint list '%.100s'", spec);
        memcpy(pat, p, len);
        pat[len] = '\0';
        bool any = false;
        for (size_t i = 0; i < g->n_segs; i++) {
            if (vp__glob_match(pat, g->segs[i].name)) {
                out[i] = true;
                any = true;
            }
        }
        if (!any) {
            char names[200] = "";
            size_t used = 0;
            for (size_t i = 0; i < g->n_segs && i < 4; i++) {
                int w = snprintf(names + used, sizeof names - used, "%s%s",
                                 i ? ", " : "", g->segs[i].name);
                if (w < 0 || (size_t)w >= sizeof names - used)
                    break;
                used += (size_t)w;
            }
            if (g->n_segs == 0)
                return vp_error_set(err, VP_EARG,
                                    "'%s' matches no checkpoint unit: this "
                                    "model has none",
                                    pat);
            return vp_error_set(err, VP_EARG,
                                "'%s' matches no checkpoint unit (units are "
                                "%s%s)",
                                pat, names, g->n_segs > 4 ? ", ..." : "");
        }
        p += len;
        if (*p == ',')
            p++;
    }
    return VP_OK;
}
