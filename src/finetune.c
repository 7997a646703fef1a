/* Fine-tuning setups (finetune.h): their defaults, names and the parsers
 * of a LoRA spec and of freeze patterns. What they do to a graph is in
 * finetune_graph.c; the rules of a LoRA layer and of a quantized weight
 * in ops/lora.c and ops/quant.c (docs/FINETUNING.md). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "util.h"
#include "vramplan/finetune.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const load_names[] = {
    VP_LOAD_MAP(VP__NAME_STR)};
static const char *const quant_names[] = {
    VP_QUANT_MAP(VP__NAME_STR)};
static const char *const base_dtype_names[] = {
    VP_BASE_DTYPE_MAP(VP__NAME_STR)};

_Static_assert(COUNT(load_names) == VP_LOAD__COUNT, "load names");
_Static_assert(COUNT(quant_names) == VP_QUANT__COUNT, "quant names");
_Static_assert(COUNT(base_dtype_names) == VP_BASE__COUNT, "dtype names");

void vp_finetune_init(vp_finetune *f)
{
    memset(f, 0, sizeof *f);
    f->load = VP_LOAD_DTYPE;
    f->base_dtype = VP_BASE_AUTO;
    f->quant = VP_QUANT_NONE;
    f->lora.alpha = 8.0; /* peft's default lora_alpha */
}

bool vp_finetune_active(const vp_finetune *f)
{
    return f->lora.r > 0 || f->freeze[0] != '\0' ||
           f->quant != VP_QUANT_NONE || f->base_dtype != VP_BASE_AUTO ||
           f->load != VP_LOAD_DTYPE;
}

VP__ENUM_NAME_FN(vp_load, vp_load, load_names)
VP__ENUM_NAME_FN(vp_quant, vp_quant, quant_names)
VP__ENUM_NAME_FN(vp_base_dtype, vp_base_dtype, base_dtype_names)
VP__ENUM_PARSE_FN(vp_load, vp_load, load_names)
VP__ENUM_PARSE_FN(vp_quant, vp_quant, quant_names)
VP__ENUM_PARSE_FN(vp_base_dtype, vp_base_dtype, base_dtype_names)

/* ---- the LoRA spec ---------------------------------------------------- */

static const char *const LORA_KEYS[] = {"r", "alpha", "targets", "dropout",
                                        "dora", "rslora", "adapter_dtype",
                                        NULL};

/* A module name: letters, digits, '_', '-', '.' (peft matches it against
 * the end of the module's dotted name). */
static bool module_name_ok(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* Append one target to out->targets. */
static vp_status add_target(vp_lora *out, const char *s, size_t n,
                            vp_error *err)
{
    size_t used = strlen(out->targets);

    if (!module_name_ok(s, n))
        return vp_error_set(err, VP_EARG,
                            "--lora: bad module name '%.*s' in targets",
                            (int)(n > 64 ? 64 : n), s);
    if (used + n + 2 > sizeof out->targets)
        return vp_error_set(err, VP_ELIMIT,
                            "--lora: the target list is longer than %d bytes",
                            VP_LORA_TARGETS_MAX - 1);
    if (used)
        out->targets[used++] = ',';
    memcpy(out->targets + used, s, n);
    out->targets[used + n] = '\0';
    return VP_OK;
}

static vp_status lora_number(const char *key, const char *v, double lo,
                             double hi, bool hi_open, double *out,
                             vp_error *err)
{
    char *end;

    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end != '\0' || !isfinite(d) || d < lo ||
        d > hi || (hi_open && d >= hi))
        return vp_error_set(err, VP_EARG,
                            "--lora: bad value '%s' for %s (%g to %g%s)", v,
                            key, lo, hi, hi_open ? ", excluded" : "");
    *out = d;
    return VP_OK;
}

/* One key=value item (value NULL for a bare flag). */
static vp_status lora_item(vp_lora *out, const char *key, const char *v,
                           vp_error *err)
{
    double d;

    if (strcmp(key, "dora") == 0 || strcmp(key, "rslora") == 0) {
        bool on = v == NULL || strcmp(v, "true") == 0;
        if (v != NULL && !on && strcmp(v, "false") != 0)
            return vp_error_set(err, VP_EARG,
                                "--lora: %s takes true or false, not '%s'",
                                key, v);
        if (key[0] == 'd')
            out->dora = on;
        else
            out->rslora = on;
        return VP_OK;
    }
    if (v == NULL || *v == '\0')
        return vp_error_set(err, VP_EARG, "--lora: '%s' needs a value (%s=...)",
                            key, key);
    if (strcmp(key, "r") == 0) {
        VP_TRY(lora_number(key, v, 1, VP_LORA_MAX_RANK, false, &d, err));
        if (d != floor(d))
            return vp_error_set(err, VP_EARG,
                                "--lora: the rank r must be a whole number, "
                                "not '%s'", v);
        out->r = (uint32_t)d;
    } else if (strcmp(key, "alpha") == 0) {
        VP_TRY(lora_number(key, v, 0, 1e9, false, &out->alpha, err));
    } else if (strcmp(key, "dropout") == 0) {
        VP_TRY(lora_number(key, v, 0, 1, true, &out->dropout, err));
    } else if (strcmp(key, "targets") == 0) {
        out->targets[0] = '\0';
        VP_TRY(add_target(out, v, strlen(v), err));
    } else if (strcmp(key, "adapter_dtype") == 0) {
        if (strcmp(v, "fp32") != 0 && strcmp(v, "base") != 0)
            return vp_error_set(err, VP_EARG,
                                "--lora: adapter_dtype is fp32 or base, not "
                                "'%s'", v);
        out->adapters_in_base_dtype = v[0] == 'b';
    } else {
        const char *hint = vp__suggest(key, LORA_KEYS);
        return vp_error_set(err, VP_EARG,
                            "--lora: unknown key '%s'%s%s%s (keys: r, alpha, "
                            "targets, dropout, dora, rslora, adapter_dtype)",
                            key, hint ? " (did you mean '" : "",
                            hint ? hint : "", hint ? "'?)" : "");
    }
    return VP_OK;
}

vp_status vp_lora_parse(const char *spec, vp_lora *out, vp_error *err)
{
    char item[VP_LORA_TARGETS_MAX];
    bool in_targets = false;
    unsigned seen = 0;
    vp_lora l;

    memset(&l, 0, sizeof l);
    l.alpha = 8.0;
    if (spec == NULL || *spec == '\0')
        return vp_error_set(err, VP_EARG, "--lora: empty spec (give at least "
                            "r=N,targets=NAMES)");
    for (const char *p = spec; *p;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof item)
            return vp_error_set(err, VP_EARG, "--lora: bad item in '%.100s'",
                                spec);
        memcpy(item, p, n);
        item[n] = '\0';
        p += n + (p[n] == ',');
        char *eq = strchr(item, '=');
        if (eq == NULL && in_targets && strcmp(item, "dora") != 0 &&
            strcmp(item, "rslora") != 0) {
            VP_TRY(add_target(&l, item, n, err)); /* the list goes on */
            continue;
        }
        if (eq != NULL)
            *eq = '\0';
        in_targets = strcmp(item, "targets") == 0;
        int k = vp__enum_index(LORA_KEYS, COUNT(LORA_KEYS) - 1, item);
        if (k >= 0 && (seen >> k & 1u))
            return vp_error_set(err, VP_EARG, "--lora: '%s' is given twice",
                                item);
        if (k >= 0)
            seen |= 1u << k;
        VP_TRY(lora_item(&l, item, eq ? eq + 1 : NULL, err));
    }
    if (l.r == 0)
        return vp_error_set(err, VP_EARG, "--lora: the rank r is missing "
                            "(r=N)");
    if (l.targets[0] == '\0')
        return vp_error_set(err, VP_EARG, "--lora: the targets are missing "
                            "(targets=q_proj,v_proj or targets=all-linear)");
    *out = l;
    return VP_OK;
}

/* ---- freeze patterns ---------------------------------------------------- */

/* Digits, at most 10 of them, as a number up to 2^32 - 1. */
static bool range_number(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;

    if (n == 0 || n > 10)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return v <= UINT32_MAX;
}

bool vp__freeze_range(const char *part, size_t n, uint64_t *a, uint64_t *b,
                      bool *bad)
{
    const char *dash = memchr(part, '-', n);
    size_t k = dash ? (size_t)(dash - part) : 0;

    *bad = false;
    if (!dash || k == 0 || k + 1 == n ||
        strspn(part, "0123456789") != k ||
        strspn(dash + 1, "0123456789") < n - k - 1)
        return false; /* not of the shape A-B */
    if (!range_number(part, k, a) || !range_number(dash + 1, n - k - 1, b) ||
        *a > *b) {
        *bad = true;
        return false;
    }
    return true;
}

/* Every dot-separated part of one pattern that looks like a range is one. */
static vp_status check_ranges(const char *p, size_t k, vp_error *err)
{
    for (size_t i = 0; i < k;) {
        size_t m = i;
        uint64_t a, b;
        bool bad;
        while (m < k && p[m] != '.')
            m++;
        (void)vp__freeze_range(p + i, m - i, &a, &b, &bad);
        if (bad)
            return vp_error_set(err, VP_EARG,
                                "--freeze: bad range '%.*s' (A-B with A <= B "
                                "<= %u)", (int)(m - i > 64 ? 64 : m - i),
                                p + i, (unsigned)UINT32_MAX);
        i = m + 1;
    }
    return VP_OK;
}

vp_status vp_freeze_parse(const char *spec, vp_finetune *f, vp_error *err)
{
    size_t n = spec ? strlen(spec) : 0;

    if (n == 0)
        return vp_error_set(err, VP_EARG, "--freeze: no patterns");
    if (n >= sizeof f->freeze)
        return vp_error_set(err, VP_ELIMIT,
                            "--freeze: the patterns are longer than %d bytes",
                            VP_FREEZE_MAX - 1);
    for (const char *p = spec; *p;) {
        size_t k = strcspn(p, ",");
        if (k == 0)
            return vp_error_set(err, VP_EARG,
                                "--freeze: an empty pattern in '%.100s'",
                                spec);
        for (size_t i = 0; i < k; i++) {
            char c = p[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                  c == '.' || c == '*'))
                return vp_error_set(err, VP_EARG,
                                    "--freeze: bad character '%c' in pattern "
                                    "'%.*s'", c, (int)(k > 64 ? 64 : k), p);
        }
        VP_TRY(check_ranges(p, k, err));
        p += k + (p[k] == ',');
    }
    memcpy(f->freeze, spec, n + 1);
    return VP_OK;
}

/* One line: "LoRA r16 alpha 32 on all-linear (dropout 0.05, fp32
 * adapters), base nf4 (double quant), frozen embed, load dtype". */
void vp_finetune_describe(const vp_finetune *f, char *buf, size_t cap)
{
    const vp_lora *l = &f->lora;
    size_t n = 0;
    int k;

    if (cap == 0)
        return;
    buf[0] = '\0';
#define PUT(...)                                                           \
    do {                                                                   \
        k = snprintf(buf + n, cap - n, __VA_ARGS__);                       \
        if (k < 0 || (size_t)k >= cap - n)                                 \
            return;                                                        \
        n += (size_t)k;                                                    \
    } while (0)
    if (l->r > 0)
        PUT("%s r%u alpha %g on %s (dropout %g, %s adapters)%s, ",
            l->dora ? "DoRA" : "LoRA", l->r, l->alpha, l->targets,
            l->dropout, l->adapters_in_base_dtype ? "base-dtype" : "fp32",
            l->rslora ? ", rsLoRA" : "");
    if (f->quant != VP_QUANT_NONE)
        PUT("base %s%s, ", vp_quant_name(f->quant),
            f->double_quant ? " (double quant)" : "");
    else if (f->base_dtype != VP_BASE_AUTO)
        PUT("base %s, ", vp_base_dtype_name(f->base_dtype));
    if (f->freeze[0] != '\0')
        PUT("frozen %s, ", f->freeze);
    PUT("load %s", vp_load_name(f->load));
#undef PUT
}
