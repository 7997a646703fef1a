/* Validation of fine-tuning cases (groundtruth/README.md, collect_more.py):
 * the fields of a case line that describe LoRA (peft), frozen parameters,
 * a quantized base, the base dtype and how it was loaded; the setup they
 * make; and the figures checked besides the peaks (trainable_params and
 * total_params exactly, setup_peak: the peak while the base model was
 * built, before peft added its adapters, as collect_more.py measures). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "validate_impl.h"

/* collect_more.py's names. */
static const char *const BASE_DTYPES[] = {"fp32", "bf16", "fp16", NULL};
static const vp_base_dtype BASE_MAP[] = {VP_BASE_FP32, VP_BASE_BF16,
                                         VP_BASE_FP16};
static const char *const QUANTS[] = {"nf4", "fp4", "int8", NULL};
static const vp_quant QUANT_MAP[] = {VP_QUANT_NF4, VP_QUANT_FP4,
                                     VP_QUANT_INT8};
const char *const vp__case_loads[] = {"dtype", "fp32-then-cast", "meta",
                                     NULL};
const vp_load vp__case_load_map[] = {VP_LOAD_DTYPE, VP_LOAD_FP32_CAST,
                                     VP_LOAD_META};

#define N(rows) (sizeof rows / sizeof rows[0])

/* "lora": {r, alpha, targets, dropout, dora, rslora}. */
typedef struct lora_in {
    uint64_t r;
    double alpha, dropout;
    bool dora, rslora;
    vp_lora *out;
} lora_in;

/* targets: a module name, a list of them, or collect_more.py's "all" (as
 * all-linear). */
static vp_status read_targets(void *ctx, const vp_jval *v, vp_error *err)
{
    lora_in *l = ctx;
    const vp_jdoc *d = v->doc;
    char *t = l->out->targets;
    size_t used = 0;

    if (json_is_string(v->json)) {
        const char *s = json_string_value(v->json);
        snprintf(t, VP_LORA_TARGETS_MAX, "%s",
                 strcmp(s, "all") == 0 ? "all-linear" : s);
        if (strlen(s) >= VP_LORA_TARGETS_MAX || !*s)
            return vp__jerr(d, v->node, false, VP_ERANGE, err,
                            "'targets' must be a module name of 1 to %d "
                            "bytes", VP_LORA_TARGETS_MAX - 1);
        return VP_OK;
    }
    if (!json_is_array(v->json) || json_array_size(v->json) == 0)
        return vp__jerr(d, v->node, false, VP_ESCHEMA, err,
                        "'targets' must be a module name or a non-empty "
                        "array of them");
    for (int c = d->nodes[v->node].first_child; c >= 0; c = d->nodes[c].next) {
        json_t *e = d->nodes[c].value;
        const char *s = json_is_string(e) ? json_string_value(e) : NULL;
        size_t n = s ? strlen(s) : 0;
        if (n == 0 || strchr(s, ',') || used + n + 2 > VP_LORA_TARGETS_MAX)
            return vp__jerr(d, c, false, VP_ESCHEMA, err,
                            "a target must be a module name (a string "
                            "without commas; %d bytes in all)",
                            VP_LORA_TARGETS_MAX - 1);
        if (used)
            t[used++] = ',';
        memcpy(t + used, s, n + 1);
        used += n;
    }
    return VP_OK;
}

static vp_status read_lora(void *ctx, const vp_jval *v, vp_error *err)
{
    static const vp_jfield rows[] = {
        VP_JROW_U64("r", true, 1, VP_LORA_MAX_RANK, lora_in, r),
        VP_JROW_NUM("alpha", false, 0, false, 1e9, lora_in, alpha),
        VP_JROW_NUM("dropout", false, 0, false, 0.999999, lora_in, dropout),
        VP_JROW_BOOL("dora", false, lora_in, dora),
        VP_JROW_BOOL("rslora", false, lora_in, rslora),
        {.name = "targets", .type = VP_JT_ANY, .required = true,
         .apply = read_targets},
    };
    vp_case_in *in = ctx;
    vp_lora *out = &in->ft.f.lora;
    lora_in l = {0, 8.0, 0.0, false, false, out};

    VP_TRY(vp__jschema_check(v->doc, v->node, rows, N(rows), "'lora'", &l,
                             err));
    out->r = (uint32_t)l.r;
    out->alpha = l.alpha;
    out->dropout = l.dropout;
    out->dora = l.dora;
    out->rslora = l.rslora;
    return VP_OK;
}

/* "freeze": patterns, as collect_more.py's freeze_by_patterns takes them
 * ("embed", "layers.A-B"). */
static vp_status read_freeze(void *ctx, const vp_jval *v, vp_error *err)
{
    vp_case_in *in = ctx;
    const vp_jdoc *d = v->doc;
    char buf[VP_FREEZE_MAX];
    size_t used = 0;

    if (json_array_size(v->json) == 0)
        return vp__jerr(d, v->node, false, VP_ESCHEMA, err,
                        "'freeze' must be a non-empty array of patterns");
    for (int c = d->nodes[v->node].first_child; c >= 0; c = d->nodes[c].next) {
        json_t *e = d->nodes[c].value;
        const char *s = json_is_string(e) ? json_string_value(e) : NULL;
        size_t n = s ? strlen(s) : 0;
        if (n == 0 || strchr(s, ',') || used + n + 2 > sizeof buf)
            return vp__jerr(d, c, false, VP_ESCHEMA, err,
                            "a freeze pattern must be a string without "
                            "commas (%zu bytes in all)", sizeof buf - 1);
        if (used)
            buf[used++] = ',';
        memcpy(buf + used, s, n + 1);
        used += n;
    }
    if (vp_freeze_parse(buf, &in->ft.f, err) != VP_OK)
        return vp__jerr(d, v->node, false, VP_ERANGE, err, "%s",
                        err ? err->msg : "bad freeze pattern");
    return VP_OK;
}

#define FT_U64(n, m) VP_JROW_U64(n, false, 1, UINT64_MAX, vp_case_in, ft.m)
#define FT_ENUM(n, ch, m) VP_JROW_ENUM(n, false, ch, vp_case_in, ft.m)

const vp_jfield vp__case_ft_rows[] = {
    {.name = "lora", .type = VP_JT_OBJECT, .apply = read_lora},
    {.name = "freeze", .type = VP_JT_ARRAY, .apply = read_freeze},
    FT_ENUM("base_dtype", BASE_DTYPES, base_dtype),
    FT_ENUM("quant", QUANTS, quant),
    FT_ENUM("load", vp__case_loads, load),
    FT_U64("trainable_params", trainable),
    FT_U64("total_params", total),
    FT_U64("setup_peak", setup_peak),
    VP_JROW_INFO("peft", VP_JT_STRING),
};
const size_t vp__case_ft_n = N(vp__case_ft_rows);

void vp__case_ft_init(vp_case_in *in)
{
    memset(&in->ft, 0, sizeof in->ft);
    vp_finetune_init(&in->ft.f);
    in->ft.base_dtype = in->ft.quant = in->ft.load = -1;
}

/* The fine-tuning of the setup. A line without base_dtype follows
 * collect.py, which builds every model in fp32 and casts it for pure
 * half precision; collect_more.py's lines give base_dtype and load the
 * model in it unless "load" says otherwise. */
void vp__case_ft_setup(const vp_case_in *in, vp_setup *s)
{
    const vp_case_ft *c = &in->ft;

    s->ft = c->f;
    s->ft.load = c->base_dtype < 0 ? VP_LOAD_FP32_CAST : VP_LOAD_DTYPE;
    if (c->load >= 0)
        s->ft.load = vp__case_load_map[c->load];
    if (c->quant >= 0)
        s->ft.quant = QUANT_MAP[c->quant];
    if (c->base_dtype >= 0) {
        vp_base_dtype b = BASE_MAP[c->base_dtype];
        /* the precision's own base needs no word */
        bool half = s->precision == VP_PREC_BF16 ||
                    s->precision == VP_PREC_FP16;
        if (half == (b != VP_BASE_FP32))
            b = VP_BASE_AUTO;
        s->ft.base_dtype = b;
    }
}

void vp__case_ft_metrics(const vp_case_in *in, const vp_estimate *e,
                         vp_case_result *out)
{
    const vp_case_ft *c = &in->ft;

    if (c->trainable)
        vp__case_metric(out, "trainable_params", e->params, c->trainable);
    if (c->total)
        vp__case_metric(out, "total_params", e->total_params, c->total);
    if (c->setup_peak)
        vp__case_metric(out, "setup_peak", e->load_peak, c->setup_peak);
}
