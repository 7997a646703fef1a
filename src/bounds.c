/* Error bounds of the validation (validate.h): metric groups, the
 * --max-error syntax, and bounds files with documented outliers. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "json.h"
#include "vramplan/validate.h"

#define MAX_BOUNDS_BYTES (1u << 20)
#define DEFAULT_TOLERANCE 0.25 /* percentage points around an outlier   */
#define VP__MG_NONE (-1) /* no group                                   */

static const char *const GROUP_NAMES[] = {
#define VP__MG(name, str) str,
    VP_METRIC_GROUP_MAP(VP__MG)
#undef VP__MG
    NULL};

const char *vp_metric_group_name(vp_metric_group g)
{
    return (unsigned)g < VP_MG__COUNT ? GROUP_NAMES[g] : "?";
}

/* Past "PREFIX" and one or more digits, or NULL. */
static const char *after_number(const char *s, const char *prefix)
{
    size_t n = strlen(prefix), d;

    if (strncmp(s, prefix, n) != 0)
        return NULL;
    d = strspn(s + n, "0123456789");
    return d > 0 ? s + n + d : NULL;
}

int vp_metric_group_of(const char *m)
{
    static const struct {
        const char *name;
        int g, rank_g;
    } plain[] = {{"peak_alloc", VP_MG_ALLOCATED, VP_MG_RANK_ALLOCATED},
                 {"peak_reserved", VP_MG_RESERVED, VP_MG_RANK_RESERVED},
                 {"device_used", VP_MG_DEVICE_USED, VP_MG_RANK_DEVICE_USED},
                 {"after_model", VP_MG_AFTER_MODEL, VP_MG_AFTER_MODEL},
                 {"max_batch", VP_MG_MAX_BATCH, VP__MG_NONE},
                 {"step_us", VP_MG_STEP_TIME, VP__MG_NONE},
                 {"params", VP_MG_PARAMS, VP__MG_NONE},
                 {"trainable_params", VP_MG_PARAMS, VP__MG_NONE},
                 {"total_params", VP_MG_PARAMS, VP__MG_NONE},
                 {"setup_peak", VP_MG_SETUP, VP__MG_NONE},
                 {"kv_cache_bytes", VP_MG_KV_CACHE, VP__MG_NONE}};
    const char *rest = after_number(m, "rank");
    bool largest = strncmp(m, "largest.", 8) == 0;

    if (rest != NULL && *rest == '.')
        m = rest + 1; /* one rank's figure                          */
    else if (largest)
        m += 8;       /* a run's most loaded rank: as one GPU's      */
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        if (strcmp(m, plain[i].name) != 0)
            continue;
        if (largest)
            return plain[i].g <= VP_MG_DEVICE_USED ? plain[i].g : -1;
        return rest == NULL ? plain[i].g : plain[i].rank_g;
    }
    const char *run = rest == NULL && !largest ? after_number(m, "run") : NULL;
    if (run != NULL && strcmp(run, ".peak") == 0)
        return VP_MG_PHASES;
    rest = !largest ? after_number(m, "step") : NULL;
    if (rest != NULL && (strcmp(rest, ".fwd_peak") == 0 ||
                         strcmp(rest, ".bwd_peak") == 0 ||
                         strcmp(rest, ".opt_peak") == 0))
        return VP_MG_PHASES;
    return -1;
}

/* A percentage: a finite decimal number >= 0 filling [s, end). */
static bool parse_pct(const char *s, const char *end, double *out)
{
    char buf[32], *stop;

    if (end <= s || (size_t)(end - s) >= sizeof buf ||
        strspn(s, "0123456789.") < (size_t)(end - s))
        return false;
    memcpy(buf, s, (size_t)(end - s));
    buf[end - s] = '\0';
    errno = 0;
    *out = strtod(buf, &stop);
    return errno == 0 && *stop == '\0' && isfinite(*out);
}

/* One "GROUP=MAX" or "GROUP=MEDIAN/MAX" item of length n. */
static vp_status parse_item(const char *s, size_t n,
                            vp_error_bound out[VP_MG__COUNT], vp_error *err)
{
    const char *eq = memchr(s, '=', n), *end = s + n, *slash;
    char name[32];
    int g;

    if (eq == NULL || eq == s || (size_t)(eq - s) >= sizeof name)
        return vp_error_set(err, VP_EARG, "'%.*s': expected GROUP=MAX or "
                            "GROUP=MEDIAN/MAX", (int)n, s);
    memcpy(name, s, (size_t)(eq - s));
    name[eq - s] = '\0';
    for (g = 0; g < VP_MG__COUNT && strcmp(GROUP_NAMES[g], name); g++)
        ;
    if (g == VP_MG__COUNT) {
        const char *best = vp__suggest(name, GROUP_NAMES);
        return vp_error_set(err, VP_EARG, "unknown metric group '%s'%s%s%s",
                            name, best ? " (did you mean '" : "",
                            best ? best : "", best ? "'?)" : "");
    }
    if (out[g].set)
        return vp_error_set(err, VP_EARG, "metric group '%s' given twice",
                            name);
    slash = memchr(eq + 1, '/', (size_t)(end - eq - 1));
    out[g].set = true;
    out[g].has_median = slash != NULL;
    if ((slash && !parse_pct(eq + 1, slash, &out[g].median_pct)) ||
        !parse_pct(slash ? slash + 1 : eq + 1, end, &out[g].max_pct))
        return vp_error_set(err, VP_EARG, "'%.*s': the bounds are "
                            "percentages, e.g. %s=0.05/1.5", (int)n, s, name);
    return VP_OK;
}

vp_status vp_error_bounds_parse(const char *spec,
                                vp_error_bound out[VP_MG__COUNT],
                                vp_error *err)
{
    memset(out, 0, VP_MG__COUNT * sizeof *out);
    for (const char *p = spec;;) {
        size_t n = strcspn(p, ",");
        vp_status st = parse_item(p, n, out, err);
        if (st != VP_OK)
            return st;
        if (p[n] == '\0')
            return VP_OK;
        p += n + 1;
    }
}

/* ---- bounds files ---------------------------------------------------------- */

typedef struct load_ctx {
    vp_bounds *b;
    double tolerance;
} load_ctx;

typedef struct file_ctx {
    load_ctx *top;
    const char *file, *max_error, *not_modelled, *not_cases;
    int max_error_node, outliers_node;
} file_ctx;

typedef struct outlier_ctx {
    const char *id, *reason;
    uint64_t run;
    bool unsupported;
    double tolerance;
    int errors_node;
} outlier_ctx;

static vp_status add_outlier(vp_bounds_file *f, const outlier_ctx *o,
                             const char *metric, double pct)
{
    vp_outlier *n = realloc(f->outliers, (f->n_outliers + 1) * sizeof *n);

    if (n == NULL)
        return VP_ENOMEM;
    f->outliers = n;
    n = &f->outliers[f->n_outliers++];
    memset(n, 0, sizeof *n);
    snprintf(n->id, sizeof n->id, "%s", o->id);
    n->run = (uint32_t)o->run;
    snprintf(n->metric, sizeof n->metric, "%s", metric);
    n->unsupported = o->unsupported;
    n->error_pct = pct;
    n->tolerance_pct = o->tolerance;
    snprintf(n->reason, sizeof n->reason, "%s", o->reason);
    return VP_OK;
}

/* {"METRIC": PCT, ...} of one outlier, flattened into f. */
static vp_status outlier_errors(const vp_jdoc *d, vp_bounds_file *f,
                                const outlier_ctx *o, vp_error *err)
{
    for (int c = d->nodes[o->errors_node].first_child; c >= 0;
         c = d->nodes[c].next) {
        json_t *v = d->nodes[c].value;
        if (vp_metric_group_of(d->nodes[c].key) < 0)
            return vp__jerr(d, c, true, VP_ESCHEMA, err,
                            "'%.64s' is not a metric validate reports",
                            d->nodes[c].key);
        if (!json_is_number(v))
            return vp__jerr(d, c, false, VP_ESCHEMA, err,
                            "an error must be a number (percent)");
        if (add_outlier(f, o, d->nodes[c].key, json_number_value(v)) != VP_OK)
            return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    return VP_OK;
}

static vp_status read_outlier(const vp_jdoc *d, int node, vp_bounds_file *f,
                              vp_error *err)
{
    static const vp_jfield rows[] = {
        VP_JROW_STR("id", true, outlier_ctx, id),
        VP_JROW_U64("run", false, 1, UINT32_MAX, outlier_ctx, run),
        VP_JROW_STR("reason", true, outlier_ctx, reason),
        VP_JROW_BOOL("unsupported", false, outlier_ctx, unsupported),
        VP_JROW_NUM("tolerance", false, 0, false, 100, outlier_ctx,
                    tolerance),
        {.name = "errors", .type = VP_JT_OBJECT, .apply = vp__jset_node,
         .offset = offsetof(outlier_ctx, errors_node)},
    };
    outlier_ctx o = {NULL, NULL, 0, false, -1.0, -1};
    vp_status st = vp__jschema_check(d, node, rows, sizeof rows / sizeof *rows,
                                     "an outlier", &o, err);

    if (st != VP_OK)
        return st;
    if (o.unsupported == (o.errors_node >= 0))
        return vp__jerr(d, node, false, VP_ESCHEMA, err,
                        "an outlier has either \"errors\" or \"unsupported\": "
                        "true");
    if (o.unsupported)
        return add_outlier(f, &o, "", 0.0) == VP_OK
                   ? VP_OK
                   : vp_error_set(err, VP_ENOMEM, "out of memory");
    return outlier_errors(d, f, &o, err);
}

static vp_status read_file(void *ctx, const vp_jval *v, vp_error *err);

static vp_status read_files(void *ctx, const vp_jval *v, vp_error *err)
{
    const vp_jdoc *d = v->doc;

    for (int c = d->nodes[v->node].first_child; c >= 0;
         c = d->nodes[c].next) {
        vp_jval e = *v;
        e.node = c;
        vp_status st = read_file(ctx, &e, err);
        if (st != VP_OK)
            return st;
    }
    return VP_OK;
}

static vp_status read_file(void *ctx, const vp_jval *v, vp_error *err)
{
    static const vp_jfield rows[] = {
        VP_JROW_STR("file", true, file_ctx, file),
        VP_JROW_STR("max_error", false, file_ctx, max_error),
        VP_JROW_STR("not_modelled", false, file_ctx, not_modelled),
        VP_JROW_STR("not_cases", false, file_ctx, not_cases),
        {.name = "outliers", .type = VP_JT_ARRAY, .apply = vp__jset_node,
         .offset = offsetof(file_ctx, outliers_node)},
    };
    load_ctx *top = ctx;
    const vp_jdoc *d = v->doc;
    file_ctx fc = {top, NULL, NULL, NULL, NULL, -1, -1};
    vp_status st = vp__jschema_check(d, v->node, rows,
                                     sizeof rows / sizeof *rows,
                                     "a file's bounds", &fc, err);
    vp_bounds *b = top->b;
    vp_bounds_file *f;

    if (st != VP_OK)
        return st;
    f = realloc(b->files, (b->n_files + 1) * sizeof *f);
    if (f == NULL)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    b->files = f;
    f = &b->files[b->n_files++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", fc.file);
    snprintf(f->not_modelled, sizeof f->not_modelled, "%s",
             fc.not_modelled ? fc.not_modelled : "");
    snprintf(f->not_cases, sizeof f->not_cases, "%s",
             fc.not_cases ? fc.not_cases : "");
    if ((fc.not_modelled || fc.not_cases) &&
        (fc.max_error || fc.outliers_node >= 0 ||
         (fc.not_modelled && fc.not_cases)))
        return vp__jerr(d, v->node, false, VP_ESCHEMA, err,
                        "a file that is not modelled, or not of cases, has "
                        "no bounds or outliers");
    if (fc.max_error != NULL &&
        vp_error_bounds_parse(fc.max_error, f->bound, err) != VP_OK)
        return vp__jerr(d, vp__jdoc_member(d, v->node, "max_error"), false,
                        VP_ESCHEMA, err, "max_error: %s", err->msg);
    int c = fc.outliers_node >= 0 ? d->nodes[fc.outliers_node].first_child
                                  : -1;
    for (; c >= 0 && st == VP_OK; c = d->nodes[c].next)
        st = read_outlier(d, c, f, err);
    return st;
}

vp_status vp_bounds_load(const char *path, vp_bounds *out, vp_error *err)
{
    static const vp_jfield rows[] = {
        VP_JROW_NUM("tolerance", false, 0, false, 100, load_ctx, tolerance),
        {.name = "files", .type = VP_JT_ARRAY, .required = true,
         .apply = read_files},
    };
    load_ctx c = {out, DEFAULT_TOLERANCE};
    char *buf = NULL;
    size_t len;
    vp_jdoc d;

    memset(out, 0, sizeof *out);
    vp_error_clear(err);
    vp_status st = vp__read_file(path, MAX_BOUNDS_BYTES, &buf, &len, err);
    if (st == VP_OK && len > MAX_BOUNDS_BYTES)
        st = vp_error_at(err, VP_ELIMIT, path, 0, 0, 0,
                         "a bounds file holds at most %u bytes",
                         MAX_BOUNDS_BYTES);
    if (st == VP_OK && (st = vp__jdoc_parse(&d, buf, len, path, 1, err)) ==
                           VP_OK) {
        st = vp__jschema_check(&d, 0, rows, sizeof rows / sizeof *rows,
                               "a bounds file", &c, err);
        vp__jdoc_destroy(&d);
    }
    free(buf);
    for (size_t i = 0; st == VP_OK && i < out->n_files; i++)
        for (size_t k = 0; k < out->files[i].n_outliers; k++)
            if (out->files[i].outliers[k].tolerance_pct < 0)
                out->files[i].outliers[k].tolerance_pct = c.tolerance;
    if (st != VP_OK)
        vp_bounds_destroy(out);
    return st;
}

void vp_bounds_destroy(vp_bounds *b)
{
    if (b == NULL)
        return;
    for (size_t i = 0; i < b->n_files; i++)
        free(b->files[i].outliers);
    free(b->files);
    memset(b, 0, sizeof *b);
}

const vp_bounds_file *vp_bounds_find(const vp_bounds *b, const char *path)
{
    const char *base = strrchr(path, '/');

    base = base != NULL ? base + 1 : path;
    for (size_t i = 0; i < b->n_files; i++)
        if (strcmp(b->files[i].name, base) == 0)
            return &b->files[i];
    return NULL;
}
