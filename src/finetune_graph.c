/* Fine-tuning applied to a graph (docs/FINETUNING.md): a copy of the
 * graph whose frozen parameters are not trainable, whose LoRA targets are
 * followed by a `lora` op (peft's lora.Linear: the base layer's result
 * plus lora_B(lora_A(dropout(x))) * scaling) with its adapters as new
 * trainable parameters, whose quantized base weights are marked with
 * their format, and in which every op's need of a gradient follows from
 * what is trainable.
 *
 * Targets are matched as peft matches target_modules
 * (peft/tuners/tuners_utils.py, check_target_module_exists): a module
 * whose dotted name is the target or ends with "." + target; a target may
 * be given by its Hugging Face module name (q_proj, c_attn, query, ...),
 * which maps onto vramplan's layer names. "all-linear" is every linear
 * layer but the output head (peft/utils/other.py,
 * _maybe_include_all_linear_layers). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "vramplan/finetune.h"
#include "vramplan/sim.h"

/* Hugging Face module names and the vramplan layer names they stand for
 * (graph_transformer.c names the layers). */
static const struct {
    const char *hf;
    const char *ours[5];
} ALIASES[] = {
    {"c_attn", {"attn.qkv"}},                    /* GPT-2 Conv1D          */
    {"c_proj", {"attn.o_proj", "mlp.proj"}},
    {"c_fc", {"mlp.fc"}},
    {"attn.c_proj", {"attn.o_proj"}},
    {"mlp.c_proj", {"mlp.proj"}},
    {"query", {"attn.q_proj"}},                  /* BERT                  */
    {"key", {"attn.k_proj"}},
    {"value", {"attn.v_proj"}},
    {"dense", {"attn.o_proj", "mlp.fc", "mlp.proj", "pooler.dense",
               "mlm.transform"}},
    {"self_attn.q_proj", {"attn.q_proj"}},       /* Llama and the like   */
    {"self_attn.k_proj", {"attn.k_proj"}},
    {"self_attn.v_proj", {"attn.v_proj"}},
    {"self_attn.o_proj", {"attn.o_proj"}},
    {"gate", {"router"}},                        /* Mixtral's router      */
    {"w1", {"gate_proj"}},                       /* Mixtral's experts     */
    {"w3", {"up_proj"}},
    {"w2", {"down_proj"}},
};

/* Token-embedding names that freeze patterns accept for "embed". */
static const char *const EMBED_ALIASES[] = {"embed", "embed_tokens", "wte",
                                            "word_embeddings", NULL};

#define ALL_LINEAR "all-linear"

/* peft's rule: the name is the key, or ends with "." + key. */
static bool name_ends_with(const char *name, const char *key)
{
    size_t n = strlen(name), k = strlen(key);

    if (k > n)
        return false;
    if (strcmp(name + n - k, key) != 0)
        return false;
    return k == n || name[n - k - 1] == '.';
}

static bool target_matches(const char *name, const char *t)
{
    if (name_ends_with(name, t))
        return true;
    for (size_t a = 0; a < sizeof ALIASES / sizeof ALIASES[0]; a++) {
        if (strcmp(ALIASES[a].hf, t) != 0)
            continue;
        for (size_t k = 0; k < 5 && ALIASES[a].ours[k]; k++)
            if (name_ends_with(name, ALIASES[a].ours[k]))
                return true;
    }
    return false;
}

/* The output head: the linear whose output the loss reads (through a
 * select for sequence classification), never an adapter target. */
static bool is_head(const vp_graph *g, uint32_t i)
{
    for (size_t k = 0; k < g->n_ops; k++) {
        const vp_op *o = &g->ops[k];
        if (o->kind != VP_OP_CROSS_ENTROPY && o->kind != VP_OP_MSE_LOSS)
            continue;
        uint32_t in = o->inputs[0];
        if (g->ops[in].kind == VP_OP_SELECT)
            in = g->ops[in].inputs[0];
        if (in == i)
            return true;
    }
    return false;
}

/* Mark targets[i] for every linear op the LoRA targets name; an unknown
 * target is an error naming it (peft raises "Target modules ... not
 * found"). */
static vp_status find_targets(const vp_graph *g, const vp_lora *l,
                              bool *targets, size_t *n_targets, vp_error *err)
{
    char t[VP_LORA_TARGETS_MAX];
    bool all = strcmp(l->targets, ALL_LINEAR) == 0;

    *n_targets = 0;
    for (const char *p = l->targets; *p;) {
        size_t n = strcspn(p, ",");
        memcpy(t, p, n);
        t[n] = '\0';
        p += n + (p[n] == ',');
        bool any = false;
        for (uint32_t i = 0; i < g->n_ops; i++) {
            const vp_op *o = &g->ops[i];
            bool hit = all ? o->kind == VP_OP_LINEAR && !is_head(g, i)
                           : target_matches(o->name, t);
            if (!hit)
                continue;
            if (o->kind != VP_OP_LINEAR || (o->flags & VP_OPF_TORCH_MHA))
                return vp_error_set(err, VP_EUNSUPPORTED,
                                    "LoRA target '%s' names %s, a %s: "
                                    "adapters on linear layers only are "
                                    "modelled",
                                    t, o->name,
                                    o->kind == VP_OP_LINEAR
                                        ? "torch.nn.MultiheadAttention "
                                          "projection"
                                        : vp_op_kind_name(o->kind));
            any = true;
            if (!targets[i])
                (*n_targets)++;
            targets[i] = true;
        }
        if (!any && !all)
            return vp_error_set(err, VP_EARG,
                                "LoRA target '%s' matches no linear layer of "
                                "%s (layer names end in q_proj, k_proj, "
                                "v_proj, o_proj, gate_proj, up_proj, "
                                "down_proj, qkv, fc, proj; or give "
                                "all-linear)", t, g->model_name);
        if (all)
            break;
    }
    if (*n_targets == 0)
        return vp_error_set(err, VP_EARG,
                            "LoRA: %s has no linear layer to adapt",
                            g->model_name);
    return VP_OK;
}

/* ---- freeze patterns ---------------------------------------------------- */

/* One dot-separated part: a glob ('*' within the part) or a numeric
 * range A-B. */
static bool part_matches(const char *pat, size_t pn, const char *s,
                         size_t sn)
{
    char p[64], v[64];
    uint64_t a, b, x = 0;
    bool bad;

    if (pn >= sizeof p || sn >= sizeof v)
        return false;
    memcpy(p, pat, pn);
    p[pn] = '\0';
    memcpy(v, s, sn);
    v[sn] = '\0';
    if (vp__freeze_range(pat, pn, &a, &b, &bad)) {
        if (sn == 0 || sn > 10 || strspn(v, "0123456789") != sn)
            return false;
        for (size_t i = 0; i < sn; i++)
            x = x * 10 + (uint64_t)(v[i] - '0');
        return x >= a && x <= b;
    }
    return vp__glob_match(p, v);
}

/* The pattern's parts match the first parts of the name. */
static bool pattern_matches(const char *pat, const char *name)
{
    for (;;) {
        size_t pn = strcspn(pat, "."), sn = strcspn(name, ".");
        if (!part_matches(pat, pn, name, sn))
            return false;
        if (pat[pn] == '\0')
            return true;
        if (name[sn] == '\0')
            return false;
        pat += pn + 1;
        name += sn + 1;
    }
}

static bool is_embed_alias(const char *pat)
{
    for (size_t k = 0; EMBED_ALIASES[k]; k++)
        if (strcmp(EMBED_ALIASES[k], pat) == 0)
            return true;
    return false;
}

/* Freeze the parameters the patterns name; a pattern that names none is
 * an error naming it. */
static vp_status apply_freeze(vp_graph *g, const char *spec, vp_error *err)
{
    char pat[VP_FREEZE_MAX];

    for (const char *p = spec; *p;) {
        size_t n = strcspn(p, ",");
        memcpy(pat, p, n);
        pat[n] = '\0';
        p += n + (p[n] == ',');
        bool any = false;
        uint32_t first_emb = UINT32_MAX;
        for (uint32_t i = 0; i < g->n_ops && first_emb == UINT32_MAX; i++)
            if (g->ops[i].kind == VP_OP_EMBEDDING && g->ops[i].n_params)
                first_emb = g->ops[i].params[0];
        /* "h.A-B" (GPT-2's name) is layers.A-B */
        const char *pm = pat;
        char alt[VP_FREEZE_MAX + 8];
        if (strncmp(pat, "h.", 2) == 0) {
            snprintf(alt, sizeof alt, "layers.%s", pat + 2);
            pm = alt;
        }
        for (size_t k = 0; k < g->n_params; k++) {
            vp_param *pp = &g->params[k];
            bool hit = is_embed_alias(pat) ? k == first_emb
                                           : pattern_matches(pm, pp->name);
            if (!hit || !pp->trainable)
                continue;
            pp->trainable = false;
            any = true;
        }
        if (!any)
            return vp_error_set(err, VP_EARG,
                                "freeze pattern '%s' matches no trainable "
                                "parameter of %s (parameters are named like "
                                "embed_tokens.weight, layers.0.attn.q_proj."
                                "weight, lm_head.weight; 'embed' is the token "
                                "embedding, 'layers.0-15' a range)",
                                pat, g->model_name);
    }
    return VP_OK;
}

/* ---- the copy ---------------------------------------------------------- */

/* A parameter of the copy. */
static vp_status add_param(vp_graph *d, const char *op, const char *leaf,
                           uint64_t numel, uint32_t at, uint8_t eb,
                           uint32_t *idx, vp_error *err)
{
    if (!vp__grow((void **)&d->params, &d->cap_params, d->n_params + 1,
                  sizeof(vp_param)))
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    vp_param *p = &d->params[d->n_params];
    memset(p, 0, sizeof *p);
    p->name = vp__arena_printf(&d->arena, "%s.%s", op, leaf);
    if (!p->name)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    p->numel = numel;
    p->op = at;
    p->trainable = true;
    p->adapter = true;
    p->elem_bytes_override = eb;
    *idx = (uint32_t)d->n_params++;
    return VP_OK;
}

/* Flags that describe an op's output (what Python holds it by): they move
 * from a target to its lora op, whose output the module returns. */
#define OUTPUT_FLAGS                                                       \
    (VP_OPF_HOLD_FWD | VP_OPF_HOLD_MODULE | VP_OPF_MODULE_RET |            \
     VP_OPF_HOLD_ADD | VP_OPF_HOLD_LAYER | VP_OPF_HOLD_SEG |               \
     VP_OPF_HOLD_OUT)

/* The lora op after target t (new index at), its adapters appended. */
static vp_status lora_op(vp_graph *d, const vp_op *t, uint32_t t_new,
                         uint32_t at, const vp_lora *l, uint8_t eb,
                         vp_error *err)
{
    vp_op *o = &d->ops[at];
    uint64_t a_n, b_n;

    *o = *t;
    o->kind = VP_OP_LORA;
    o->name = vp__arena_printf(&d->arena, "%s.lora", t->name);
    if (!o->name)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    o->n_inputs = 2;
    o->inputs[0] = d->ops[t_new].inputs[0];
    o->inputs[1] = t_new;
    o->dropout = l->dropout;
    o->n_params = 0;
    o->flags = t->flags & OUTPUT_FLAGS;
    o->hold_until = t->hold_until;
    d->ops[t_new].flags &= ~OUTPUT_FLAGS;
    d->ops[t_new].hold_until = 0;
    if (!vp_mul_u64(t->in_features, l->r, &a_n) ||
        !vp_mul_u64(t->out_features, l->r, &b_n))
        return vp_error_set(err, VP_EOVERFLOW,
                            "the adapters of %s overflow 64 bits", t->name);
    VP_TRY(add_param(d, t->name, "lora_A.weight", a_n, at, eb,
                     &o->params[o->n_params++], err));
    VP_TRY(add_param(d, t->name, "lora_B.weight", b_n, at, eb,
                     &o->params[o->n_params++], err));
    if (l->dora)
        VP_TRY(add_param(d, t->name, "lora_magnitude_vector",
                         t->out_features, at, eb,
                         &o->params[o->n_params++], err));
    return VP_OK;
}

/* map[i]: op i's index in the copy; out_of[i]: the op whose output its
 * consumers read (a target's lora op). */
static void make_maps(const vp_graph *g, const bool *tgt, uint32_t *map,
                      uint32_t *out_of)
{
    uint32_t k = 0;

    for (uint32_t i = 0; i < g->n_ops; i++) {
        bool t = tgt && tgt[i];
        map[i] = k;
        out_of[i] = k + t;
        k += 1 + t;
    }
}

/* The ops of g, with a lora op after every target. */
static vp_status copy_ops(vp_graph *d, const vp_graph *g, const bool *tgt,
                          size_t n_tgt, const uint32_t *map,
                          const uint32_t *out_of, const vp_lora *l,
                          uint8_t eb, vp_error *err)
{
    size_t n = g->n_ops + n_tgt;

    d->ops = calloc(n ? n : 1, sizeof *d->ops);
    if (!d->ops)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    d->cap_ops = n ? n : 1;
    d->n_ops = n;
    for (uint32_t i = 0; i < g->n_ops; i++) {
        vp_op *o = &d->ops[map[i]];
        *o = g->ops[i];
        for (uint32_t j = 0; j < o->n_inputs; j++)
            o->inputs[j] = out_of[o->inputs[j]];
        if (o->hold_until)
            o->hold_until = out_of[o->hold_until];
        if (tgt && tgt[i])
            VP_TRY(lora_op(d, o, map[i], map[i] + 1, l, eb, err));
    }
    return VP_OK;
}

/* The parameters (their first op renumbered) and the segments. */
static vp_status copy_rest(vp_graph *d, const vp_graph *g,
                           const uint32_t *map, const bool *tgt,
                           vp_error *err)
{
    size_t np = g->n_params;

    d->batch = g->batch;
    d->seq = g->seq;
    d->model_name = g->model_name;
    d->params = malloc((np ? np : 1) * sizeof *d->params);
    d->segs = malloc((g->n_segs ? g->n_segs : 1) * sizeof *d->segs);
    d->seg_default = malloc((g->n_segs ? g->n_segs : 1) * sizeof(bool));
    if (!d->params || !d->segs || !d->seg_default)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    d->cap_params = np ? np : 1;
    d->cap_segs = g->n_segs ? g->n_segs : 1;
    if (np)
        memcpy(d->params, g->params, np * sizeof *d->params);
    d->n_params = np;
    for (size_t p = 0; p < np; p++)
        if (g->params[p].op < g->n_ops)
            d->params[p].op = map[g->params[p].op];
    for (size_t s = 0; s < g->n_segs; s++) {
        uint32_t last = g->segs[s].last_op;
        d->segs[s] = g->segs[s];
        d->segs[s].first_op = map[g->segs[s].first_op];
        d->segs[s].last_op = map[last] + (tgt && tgt[last]);
        d->seg_default[s] = g->seg_default[s];
    }
    d->n_segs = g->n_segs;
    return VP_OK;
}

/* Which weights a quantized base stores quantized: every linear layer's
 * own weight but the output head's (transformers' bitsandbytes
 * integration keeps the output embeddings: get_keys_to_not_convert). */
static void mark_quantized(vp_graph *d, vp_quant q)
{
    for (uint32_t i = 0; i < d->n_ops; i++) {
        const vp_op *o = &d->ops[i];
        if (o->kind != VP_OP_LINEAR || !o->n_params)
            continue;
        vp_param *w = &d->params[o->params[0]];
        if (w->op != i || is_head(d, i))
            continue;
        w->quant = (uint8_t)q;
    }
}

/* needs_grad in op order, from what is trainable; enable_input_require_
 * grads makes the token embedding's output require a gradient. */
static void grads_and_flops(vp_graph *d, bool input_grads)
{
    bool first_emb = true;
    for (uint32_t i = 0; i < d->n_ops; i++) {
        vp_op *o = &d->ops[i];
        bool ng = false;
        for (uint32_t j = 0; j < o->n_inputs; j++)
            ng |= d->ops[o->inputs[j]].needs_grad;
        for (uint32_t j = 0; j < o->n_params; j++)
            ng |= d->params[o->params[j]].trainable;
        if (o->kind == VP_OP_EMBEDDING && first_emb) {
            ng |= input_grads;
            first_emb = false;
        }
        o->needs_grad = ng;
        vp__graph_op_flops(d, o);
    }
}

/* What is trainable: with adapters or a quantized base, only the
 * adapters (peft freezes the base; prepare_model_for_kbit_training freezes
 * every parameter); then the freeze patterns. Half-precision parameters
 * that a quantized base leaves unquantized are upcast to fp32
 * (prepare_model_for_kbit_training, peft/utils/other.py). */
static vp_status trainable(vp_graph *d, const vp_finetune *ft,
                           uint8_t base_eb, vp_error *err)
{
    for (size_t p = 0; p < d->n_params; p++) {
        vp_param *pp = &d->params[p];
        if (pp->adapter)
            continue;
        if (ft->lora.r || ft->quant != VP_QUANT_NONE)
            pp->trainable = false;
        if (ft->quant != VP_QUANT_NONE && !pp->quant && base_eb == 2 &&
            !pp->fp32_buffer && !pp->elem_bytes_override)
            pp->elem_bytes_override = 4;
    }
    if (ft->freeze[0])
        VP_TRY(apply_freeze(d, ft->freeze, err));
    return VP_OK;
}

vp_graph *vp__graph_finetune(const vp_graph *g, const vp_finetune *ft,
                             uint8_t base_eb, bool input_grads,
                             vp_error *err)
{
    const vp_lora *l = &ft->lora;
    size_t no = g->n_ops ? g->n_ops : 1;
    bool *tgt = l->r ? calloc(no, sizeof *tgt) : NULL;
    uint32_t *map = calloc(no, sizeof *map), *out_of = calloc(no, sizeof *out_of);
    vp_graph *d = calloc(1, sizeof *d);
    size_t n_tgt = 0;
    vp_status st = VP_OK;

    if (!map || !out_of || !d || (l->r && !tgt))
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
    if (st == VP_OK && l->r)
        st = find_targets(g, l, tgt, &n_tgt, err);
    if (st == VP_OK) {
        make_maps(g, tgt, map, out_of);
        st = copy_rest(d, g, map, tgt, err);
    }
    if (st == VP_OK)
        st = copy_ops(d, g, tgt, n_tgt, map, out_of, l,
                      l->adapters_in_base_dtype ? base_eb : 4, err);
    if (st == VP_OK && ft->quant != VP_QUANT_NONE)
        mark_quantized(d, ft->quant);
    if (st == VP_OK)
        st = trainable(d, ft, base_eb, err);
    if (st == VP_OK)
        grads_and_flops(d, input_grads);
    free(tgt);
    free(map);
    free(out_of);
    if (st != VP_OK) {
        vp_graph_free(d);
        return NULL;
    }
    return d;
}

/* ---- a setup's fine-tuning ---------------------------------------------- */

uint8_t vp__base_bytes(const vp_setup *s)
{
    switch (s->ft.base_dtype) {
    case VP_BASE_FP32:
        return 4;
    case VP_BASE_BF16:
    case VP_BASE_FP16:
        return 2;
    default:
        return s->precision == VP_PREC_BF16 || s->precision == VP_PREC_FP16
                   ? 2
                   : 4;
    }
}

/* The base dtype must agree with the precision: pure half precision keeps
 * its weights in that dtype, fp32 training keeps fp32 weights, and a half
 * base under autocast is in autocast's dtype. */
bool vp__base_dtype_fits(int b, int p)
{
    return b == VP_BASE_AUTO ||
           (b == VP_BASE_FP32 && p != VP_PREC_BF16 && p != VP_PREC_FP16) ||
           (b == VP_BASE_BF16 &&
            (p == VP_PREC_BF16 || p == VP_PREC_AMP_BF16)) ||
           (b == VP_BASE_FP16 && (p == VP_PREC_FP16 || p == VP_PREC_AMP_FP16));
}

static vp_status check_dtypes(const vp_setup *s, vp_error *err)
{
    vp_base_dtype b = s->ft.base_dtype;
    vp_precision p = s->precision;
    bool ok = vp__base_dtype_fits((int)b, (int)p);

    if ((unsigned)b >= VP_BASE__COUNT || (unsigned)s->ft.load >= VP_LOAD__COUNT ||
        (unsigned)s->ft.quant >= VP_QUANT__COUNT)
        return vp_error_set(err, VP_EARG, "invalid base dtype, load or "
                            "quantization");
    if (!ok)
        return vp_error_set(err, VP_EARG,
                            "a %s base does not go with precision %s (pure "
                            "bf16/fp16 keeps the weights in that dtype, "
                            "fp32 in fp32; under autocast the base is fp32 or "
                            "autocast's dtype)",
                            vp_base_dtype_name(b), vp_precision_name(p));
    return VP_OK;
}

static vp_status check_setup(const vp_setup *s, vp_error *err)
{
    const vp_finetune *ft = &s->ft;
    const vp_lora *l = &ft->lora;

    VP_TRY(check_dtypes(s, err));
    if (ft->quant != VP_QUANT_NONE && ft->load == VP_LOAD_FP32_CAST)
        return vp_error_set(err, VP_EARG,
                            "a quantized base is quantized as it loads: "
                            "--load fp32-then-cast does not apply");
    if (ft->quant != VP_QUANT_NONE && s->weight_bits)
        return vp_error_set(err, VP_EARG,
                            "--quant and INT8 weights (weight_bits) are two "
                            "ways of quantizing: give one");
    if (ft->double_quant && ft->quant != VP_QUANT_NF4 &&
        ft->quant != VP_QUANT_FP4)
        return vp_error_set(err, VP_EARG,
                            "double quantization is for 4-bit bases (nf4, "
                            "fp4)");
    if (l->r && (l->r > VP_LORA_MAX_RANK || !(l->dropout >= 0.0) ||
                 !(l->dropout < 1.0) || !memchr(l->targets, '\0',
                                                 sizeof l->targets) ||
                 !l->targets[0]))
        return vp_error_set(err, VP_EARG,
                            "invalid LoRA setup: rank 1 to %u, dropout in "
                            "[0, 1), targets named",
                            VP_LORA_MAX_RANK);
    if (!memchr(ft->freeze, '\0', sizeof ft->freeze))
        return vp_error_set(err, VP_EARG, "invalid freeze patterns");
    return VP_OK;
}

vp_status vp__finetune_prepare(const vp_graph *g, const vp_setup *s,
                               vp_graph **out, vp_error *err)
{
    const vp_finetune *ft = &s->ft;
    bool ckpt = false;

    *out = NULL;
    VP_TRY(check_setup(s, err));
    if (!ft->lora.r && !ft->freeze[0] && ft->quant == VP_QUANT_NONE)
        return VP_OK; /* the parameters stay as they are */
    for (size_t k = 0; s->checkpoint && k < s->n_checkpoint; k++)
        ckpt |= s->checkpoint[k];
    /* with checkpointing, peft models call enable_input_require_grads()
     * (transformers' gradient_checkpointing_enable for a PEFT model;
     * prepare_model_for_kbit_training) */
    bool input_grads = ft->lora.r && ckpt && !s->inference;
    vp_graph *d = vp__graph_finetune(g, ft, vp__base_bytes(s), input_grads,
                                     err);
    if (!d)
        return err ? err->code : VP_EARG;
    uint64_t n = 0;
    (void)vp_graph_num_params(d, &n, NULL);
    if (n == 0 && !s->inference) {
        vp_graph_free(d);
        return vp_error_set(err, VP_EARG,
                            "nothing to train: every parameter of %s is "
                            "frozen (add LoRA adapters, or use --inference)",
                            g->model_name);
    }
    *out = d;
    return VP_OK;
}
