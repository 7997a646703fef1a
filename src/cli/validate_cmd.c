/* vramplan validate: compare the simulator with measured runs, and check
 * the errors against bounds.
 *
 *   vramplan validate ../shared/groundtruth/h200-torch2.11-cases.jsonl \
 *       --gpu h200 --outliers groundtruth/bounds.json
 *
 * Every case line is checked and run by the library (validate.h); this
 * file prints the comparison, the summary per metric group, and checks
 * each file's errors against --max-error and the file's section of the
 * --outliers file. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum { O_MODELS, O_GPU, O_FORMAT, O_MAX_ERROR, O_OUTLIERS };

static const char *const FORMATS[] = {"table", "jsonl", NULL};

static const cli_opt OPTS[] = {
    {.id = O_MODELS, .name = "models", .metavar = "DIR",
     .type = CLI_ARG_STRING, .repeat = true,
     .help = "a directory of model files (repeatable; then models/)"},
    {.id = O_GPU, .short_name = 'g', .name = "gpu", .metavar = "NAME",
     .type = CLI_ARG_STRING,
     .help = "a GPU profile: its CUDA context and cuBLAS workspace, and the "
             "step-time model's error (step_us) against each case's "
             "step_ms (default: the profile of the env line's GPU, for the "
             "multi-GPU cases only)"},
    {.id = O_FORMAT, .short_name = 'f', .name = "format", .metavar = "FMT",
     .type = CLI_ARG_ENUM, .choices = FORMATS, .what = "format",
     .help = "table (default) or jsonl: one object per case and metric with "
             "id, metric, predicted, measured, rel_err"},
    {.id = O_MAX_ERROR, .name = "max-error", .metavar = "SPEC",
     .type = CLI_ARG_STRING,
     .help = "bounds on the |error| of each file's cases, percent: "
             "GROUP=MAX or GROUP=MEDIAN/MAX, comma-separated, e.g. "
             "allocated=0.01/0.1,max_batch=1.5; exit 1 when one is exceeded"},
    {.id = O_OUTLIERS, .name = "outliers", .metavar = "FILE",
     .type = CLI_ARG_STRING,
     .help = "a bounds file (groundtruth/bounds.json): per ground-truth "
             "file, its max-error bounds and its documented outliers, each "
             "with its reason and known error"},
    CLI_HELP_ROW,
};

static void validate_help(FILE *f)
{
    cli_help_page(
        f,
        "Usage: vramplan validate FILE.jsonl... [OPTIONS]\n"
        "\n"
        "Simulate every case of ground-truth files (the schema of\n"
        "shared/groundtruth: one JSON object a line, the first holding the\n"
        "environment) and compare the predicted peaks with the measured "
        "ones.\n"
        "A case's model NAME is looked up as NAME.yaml, then NAME.json (a\n"
        "Hugging Face config), in each --models DIR in order, then in "
        "models/.\n"
        "Case lines are strict JSON (at most 1 MiB a line); an unknown or\n"
        "mistyped field is an error at its line and column.\n"
        "\n"
        "Options:\n",
        OPTS, sizeof OPTS / sizeof OPTS[0],
        "\n"
        "The summary gives, per metric group (allocated, reserved,\n"
        "device_used, after_model, phases, max_batch, step_time), the "
        "number of\n"
        "cases and the median and largest relative error. A multi-GPU "
        "line is\n"
        "simulated as its rank (rank_allocated, rank_reserved,\n"
        "rank_device_used); each run's most loaded simulated rank is then\n"
        "compared with its largest measured one (largest.*, in allocated,\n"
        "reserved and device_used). A case id measured in more than one\n"
        "line (the same case run again, in one file or several) is also\n"
        "compared by the median of its measurements over their predictions:\n"
        "one summary line (step_time, repeated cases), or in jsonl one line\n"
        "per such case (metric step_us_median, with its number of\n"
        "measurements). A line with host_probe_us (the host benchmark\n"
        "beside it) is timed on its session's host: every host cost scaled\n"
        "by the median of the file's benchmarks over the GPU profile's\n"
        "measured host_probe_us.\n"
        "A documented\n"
        "outlier must keep its known error (within its tolerance) and does "
        "not\n"
        "count towards the bounds.\n"
        "\n");
}

/* ---- what a run keeps ------------------------------------------------------ */

typedef struct record {
    char id[128];
    uint32_t run, line;
    char metric[32];
    int group;
    double err;            /* relative                                    */
    bool outlier;
    uint32_t world;        /* a rank line's run (0: one GPU)              */
    uint64_t predicted, measured;
} record;

/* A step time kept for the repeated cases' summary: a case id measured in
 * more than one line (the same case run again, in this file or another). */
typedef struct repeat {
    char id[128];
    uint64_t predicted, measured;
} repeat;

typedef struct state {
    const cli_args *args;
    const char **dirs;
    size_t n_dirs;
    bool jsonl;
    vp_setup base;         /* from --gpu                                  */
    vp_hw hw;              /* --gpu's, or the env line's GPU's            */
    bool have_gpu, have_hw;
    vp_bounds bounds;
    vp_error_bound cli_bound[VP_MG__COUNT];
    record *rec;           /* the current file's                          */
    size_t n_rec, cap_rec;
    double *all[VP_MG__COUNT]; /* every file's |errors|, for the summary  */
    size_t n_all[VP_MG__COUNT];
    size_t cases;
    int rc;                /* the first error's exit status              */
    bool exceeded;
    const vp_outlier *last_unsupported; /* reported once per case        */
    size_t not_modelled;   /* the current file's cases refused as such   */
    size_t not_cases;      /* files documented as not of cases           */
    repeat *rep;           /* every one-GPU step time, all files          */
    size_t n_rep, cap_rep;
} state;

static void note_rc(state *s, int rc)
{
    if (s->rc == CLI_OK && rc != CLI_OK)
        s->rc = rc;
}

/* Room for one more element of size `size` in *arr (n used of *cap). */
static bool grow(void **arr, size_t n, size_t *cap, size_t size)
{
    if (n < *cap)
        return true;
    size_t c = *cap ? 2 * *cap : 64;
    void *p = c <= SIZE_MAX / size ? realloc(*arr, c * size) : NULL;
    if (p == NULL)
        return false;
    *arr = p;
    *cap = c;
    return true;
}

static bool keep_repeat(state *s, const vp_case_result *r,
                        const vp_metric *m)
{
    if (!grow((void **)&s->rep, s->n_rep, &s->cap_rep, sizeof *s->rep))
        return false;
    repeat *k = &s->rep[s->n_rep++];
    snprintf(k->id, sizeof k->id, "%s", r->id);
    k->predicted = m->predicted;
    k->measured = m->measured;
    return true;
}

static bool keep(state *s, const vp_case_result *r, const vp_metric *m,
                 uint32_t line)
{
    int g = vp_metric_group_of(m->name);
    double *v;

    if (!grow((void **)&s->rec, s->n_rec, &s->cap_rec, sizeof *s->rec))
        return false;
    record *k = &s->rec[s->n_rec++];
    snprintf(k->id, sizeof k->id, "%s", r->id);
    k->run = r->run;
    k->line = line;
    snprintf(k->metric, sizeof k->metric, "%s", m->name);
    k->group = g;
    k->err = m->rel_err;
    k->outlier = false;
    k->world = r->world;
    k->predicted = m->predicted;
    k->measured = m->measured;
    if (g == VP_MG_STEP_TIME && r->world == 0 && !keep_repeat(s, r, m))
        return false;
    if (g < 0)
        return true;
    v = realloc(s->all[g], (s->n_all[g] + 1) * sizeof *v);
    if (v == NULL)
        return false;
    s->all[g] = v;
    v[s->n_all[g]++] = fabs(m->rel_err);
    return true;
}

static void print_metric(const state *s, const vp_case_result *r,
                         const vp_metric *m, bool first)
{
    if (s->jsonl) {
        json_t *o = json_object();
        cli_jset(o, "id", cli_jstr(r->id, sizeof r->id));
        if (r->run != 0)
            cli_jset(o, "run", cli_ju64(r->run));
        cli_jset(o, "metric", cli_jstr(m->name, sizeof m->name));
        cli_jset(o, "predicted", cli_ju64(m->predicted));
        cli_jset(o, "measured", cli_ju64(m->measured));
        cli_jset(o, "rel_err", cli_jreal(m->rel_err, "%.6f"));
        cli_jprint(stdout, o, false);
    } else {
        printf("%-40s %-16s %16" PRIu64 " %16" PRIu64 " %+8.2f%%\n",
               first ? r->id : "", m->name, m->predicted, m->measured,
               100.0 * m->rel_err);
    }
}

/* ---- outliers and bounds ---------------------------------------------------- */

static bool same_case(const vp_outlier *o, const char *id, uint32_t run)
{
    return strcmp(o->id, id) == 0 && (o->run == 0 || o->run == run);
}

/* A documented outlier that the model refuses as not supported yet. */
static const vp_outlier *unsupported_outlier(const vp_bounds_file *bf,
                                             const vp_case_result *r)
{
    for (size_t i = 0; bf != NULL && i < bf->n_outliers; i++)
        if (bf->outliers[i].unsupported &&
            same_case(&bf->outliers[i], r->id, r->run))
            return &bf->outliers[i];
    return NULL;
}

/* "FILE:LINE: error: MSG" (LINE 0: the file as a whole); exit 1. */
static void exceeded(state *s, const char *path, uint32_t line,
                     const char *fmt, ...) CLI_PRINTF(4, 5);
static void exceeded(state *s, const char *path, uint32_t line,
                     const char *fmt, ...)
{
    va_list ap;

    if (line > 0)
        fprintf(stderr, "%s:%" PRIu32 ": error: ", path, line);
    else
        fprintf(stderr, "%s: error: ", path);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    s->exceeded = true;
}

/* The documented error of a record: within its tolerance, or reported. */
static void check_documented(state *s, const char *path, const vp_outlier *o,
                             record *r, char *line, size_t n)
{
    size_t used = strlen(line);

    r->outlier = true;
    if (fabs(100.0 * r->err - o->error_pct) > o->tolerance_pct)
        exceeded(s, path, r->line, "outlier %s %s: %+.2f%%, documented as "
                 "%+.2f%% (tolerance %.2f): the error or the measurement "
                 "changed",
                 r->id, r->metric, 100.0 * r->err, o->error_pct,
                 o->tolerance_pct);
    snprintf(line + used, n - used, "%s%s %+.2f%%", used ? ", " : "",
             r->metric, 100.0 * r->err);
}

/* Each documented error: the case must have it, within its tolerance;
 * one line per case lists them with the reason. */
static void check_outliers(state *s, const char *path,
                           const vp_bounds_file *bf)
{
    char line[512] = "";

    for (size_t i = 0; bf != NULL && i < bf->n_outliers; i++) {
        const vp_outlier *o = &bf->outliers[i];
        bool found = o->unsupported;
        for (size_t k = 0; k < s->n_rec && !o->unsupported; k++) {
            record *r = &s->rec[k];
            if (same_case(o, r->id, r->run) && !strcmp(o->metric, r->metric)) {
                check_documented(s, path, o, r, line, sizeof line);
                found = true;
            }
        }
        if (!found)
            exceeded(s, path, 0, "documented outlier %s %s is not in the "
                     "file", o->id, o->metric);
        const vp_outlier *next = i + 1 < bf->n_outliers ? o + 1 : NULL;
        if (line[0] && (next == NULL || !same_case(next, o->id, o->run) ||
                        next->run != o->run) && !s->jsonl) {
            printf("outlier %s: %s (documented: %s)\n", o->id, line,
                   o->reason);
            line[0] = '\0';
        }
    }
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *v, size_t n)
{
    qsort(v, n, sizeof *v, dcmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

/* One group's bound over the file's cases that are not outliers. */
static bool check_group(state *s, const char *path, int g,
                        const vp_error_bound *b)
{
    double *v = malloc((s->n_rec ? s->n_rec : 1) * sizeof *v), med;
    size_t n = 0;

    if (v == NULL)
        return false;
    for (size_t k = 0; k < s->n_rec; k++)
        if (s->rec[k].group == g && !s->rec[k].outlier)
            v[n++] = fabs(s->rec[k].err);
    for (size_t k = 0; k < s->n_rec; k++) {
        const record *r = &s->rec[k];
        if (r->group == g && !r->outlier &&
            100.0 * fabs(r->err) > b->max_pct)
            exceeded(s, path, r->line, "%s: case %s %s: %+.2f%% is over the "
                     "bound %.2f%%", vp_metric_group_name((vp_metric_group)g),
                     r->id, r->metric, 100.0 * r->err, b->max_pct);
    }
    if (n > 0 && b->has_median &&
        100.0 * (med = median_of(v, n)) > b->median_pct)
        exceeded(s, path, 0, "%s: median |err| %.3f%% of %zu cases is over "
                 "the bound %.3f%%", vp_metric_group_name((vp_metric_group)g),
                 100.0 * med, n, b->median_pct);
    free(v);
    return true;
}

/* The bounds of a file: its section of --outliers, and --max-error over
 * it. */
static int check_file(state *s, const char *path)
{
    const vp_bounds_file *bf = NULL;
    vp_error_bound b[VP_MG__COUNT];

    if (s->args->v[O_OUTLIERS].given &&
        (bf = vp_bounds_find(&s->bounds, path)) == NULL)
        return cli_fail("%s has no section in %s: add its bounds", path,
                        s->args->v[O_OUTLIERS].text);
    memcpy(b, bf ? bf->bound : s->cli_bound, sizeof b);
    for (int g = 0; g < VP_MG__COUNT; g++)
        if (s->cli_bound[g].set)
            b[g] = s->cli_bound[g];
    check_outliers(s, path, bf);
    for (int g = 0; g < VP_MG__COUNT; g++)
        if (b[g].set && !check_group(s, path, g, &b[g]))
            return cli_fail("out of memory");
    return CLI_OK;
}

/* ---- running the files ------------------------------------------------------- */

/* The GPU of a file: --gpu, else the profile of the env line's GPU (for
 * the multi-GPU cases' per-rank model). */
static void env_hw(state *s, const vp_gt_file *f)
{
    const vp_gt_env *env = vp_gt_file_env(f);
    const char *name = env && env->gpu[0] ? vp_gpu_match_device(env->gpu)
                                          : NULL;

    int rc;

    s->have_hw = s->have_gpu;
    if (!s->have_gpu && name != NULL) {
        rc = cli_gpu_hw(name, &s->hw);
        s->have_hw = rc < 0;
        if (rc >= 0)
            note_rc(s, rc);
    }
}

/* One case line: run, print, keep. */
static void run_line(state *s, const char *path, const vp_bounds_file *bf,
                     const char *json, size_t len, vp_validate_opts *o)
{
    vp_case_result r;
    vp_error err;
    char prefix[160];
    vp_status st = vp_validate_line(json, len, o, &r, &err);
    const vp_outlier *un = unsupported_outlier(bf, &r);

    o->first_in_process = false;
    s->cases++;
    if (st == VP_EUNSUPPORTED && bf != NULL && bf->not_modelled[0]) {
        s->not_modelled++; /* the whole file is documented as such */
        return;
    }
    if (st == VP_OK && bf != NULL && bf->not_modelled[0]) {
        exceeded(s, path, o->line, "case %s ran, but the file is documented "
                 "as not modelled: give it its bounds", r.id);
        return;
    }
    if (st == VP_EUNSUPPORTED && un != NULL) {
        if (!s->jsonl && un != s->last_unsupported)
            printf("outlier %s: not modelled, %s (documented: %s)\n", r.id,
                   err.msg, un->reason);
        s->last_unsupported = un;
        return;
    }
    if (st != VP_OK) {
        snprintf(prefix, sizeof prefix, "case %.128s: ", r.id);
        note_rc(s, cli_report(&err, r.id[0] ? prefix : NULL));
        return;
    }
    if (un != NULL)
        exceeded(s, path, o->line, "case %s is documented as not modelled, "
                 "but it ran: update its outlier entry", r.id);
    for (size_t k = 0; k < r.n_metrics; k++) {
        print_metric(s, &r, &r.metrics[k], k == 0);
        if (!keep(s, &r, &r.metrics[k], o->line))
            note_rc(s, cli_fail("out of memory"));
    }
}

/* A rank line's figure that the run's largest rank is compared on: its
 * name after "rankN.", or NULL. */
static const char *largest_of(const record *r)
{
    static const char *const what[] = {"peak_alloc", "peak_reserved",
                                       "device_used"};
    const char *dot = strchr(r->metric, '.');

    if (r->world == 0 || strncmp(r->metric, "rank", 4) != 0 || dot == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof what / sizeof what[0]; i++)
        if (strcmp(dot + 1, what[i]) == 0)
            return what[i];
    return NULL;
}

/* The largest rank of each multi-GPU run in the file (its lines of one id,
 * run and world): the most loaded of the ranks simulated against the
 * largest measured, as "largest.peak_alloc" and the like, kept as the
 * run's figures (the one-GPU metric groups). Bounded by the file's
 * records. */
static void add_largest(state *s)
{
    size_t n = s->n_rec;
    bool *done = calloc(n ? n : 1, sizeof *done);

    if (done == NULL) {
        note_rc(s, cli_fail("out of memory"));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const char *what = largest_of(&s->rec[i]);
        if (done[i] || what == NULL)
            continue;
        vp_case_result r;
        vp_metric m;
        memset(&r, 0, sizeof r);
        memset(&m, 0, sizeof m);
        snprintf(r.id, sizeof r.id, "%s", s->rec[i].id);
        r.run = s->rec[i].run;
        r.world = s->rec[i].world;
        for (size_t k = i; k < n; k++) {
            const record *x = &s->rec[k];
            const char *w = largest_of(x);
            if (done[k] || w != what || x->world != r.world ||
                x->run != r.run || strcmp(x->id, r.id) != 0)
                continue;
            done[k] = true;
            m.predicted = x->predicted > m.predicted ? x->predicted
                                                     : m.predicted;
            m.measured = x->measured > m.measured ? x->measured : m.measured;
        }
        snprintf(m.name, sizeof m.name, "largest.%s", what);
        m.rel_err = ((double)m.predicted - (double)m.measured) /
                    (double)m.measured;
        print_metric(s, &r, &m, true);
        if (!keep(s, &r, &m, s->rec[i].line))
            note_rc(s, cli_fail("out of memory"));
    }
    free(done);
}

/* Which host a file's step times were timed on (docs/STEP_TIME.md "The
 * host's speed"): its session's benchmark against the profile's. */
static void host_note(const state *s, const char *path, double probe_us)
{
    if (s->jsonl || !s->have_gpu || !s->have_hw || probe_us <= 0.0 ||
        s->hw.host_probe <= 0.0)
        return;
    printf("%s: step times on its session's host: benchmark %.0f us "
           "against the profile's %.0f us, host costs x%.3f\n",
           path, probe_us, s->hw.host_probe * 1e6,
           probe_us * 1e-6 / s->hw.host_probe);
}

static void run_file(state *s, const char *path)
{
    vp_validate_opts o = {path, 0, s->dirs, s->n_dirs, true,
                          s->have_gpu ? &s->base : NULL, NULL, s->have_gpu,
                          0, 0.0};
    const vp_bounds_file *bf = s->args->v[O_OUTLIERS].given
                                   ? vp_bounds_find(&s->bounds, path)
                                   : NULL;
    vp_error err;
    const char *json;
    size_t len;
    bool end;
    vp_gt_file *f;

    if (bf != NULL && bf->not_cases[0]) {
        if (!s->jsonl)
            printf("%s: not a file of cases, not read (documented: %s)\n",
                   path, bf->not_cases);
        s->not_cases++;
        return;
    }
    if ((f = vp_gt_open(path, &err)) == NULL) {
        note_rc(s, cli_report(&err, NULL));
        return;
    }
    env_hw(s, f);
    o.hw = s->have_hw ? &s->hw : NULL;
    const vp_gt_env *env = vp_gt_file_env(f);
    if (env != NULL) {
        o.context_bytes = env->context_bytes;
        o.host_probe_us = env->host_probe_us;
        o.first_in_process = !env->warmed_up;
    }
    s->n_rec = 0;
    for (;;) {
        vp_status st = vp_gt_next(f, &json, &len, &o.line, &end, &err);
        if (st != VP_OK)
            note_rc(s, cli_report(&err, NULL));
        if (st != VP_OK || end)
            break;
        run_line(s, path, bf, json, len, &o);
    }
    vp_gt_close(f);
    add_largest(s);
    if (s->not_modelled > 0 && !s->jsonl)
        printf("%s: %zu cases not modelled yet (documented: %s)\n", path,
               s->not_modelled, bf->not_modelled);
    s->not_modelled = 0;
    host_note(s, path, o.host_probe_us);
    if (s->args->v[O_OUTLIERS].given || s->args->v[O_MAX_ERROR].given)
        note_rc(s, check_file(s, path));
}

static void summary(const state *s, int g)
{
    double *v = s->all[g];
    size_t n = s->n_all[g], exact = 0;

    if (n == 0)
        return;
    for (size_t i = 0; i < n; i++)
        exact += v[i] == 0.0;
    printf("%s: %zu %s, ", vp_metric_group_name((vp_metric_group)g), n,
           g == VP_MG_PHASES ? "peaks" : "cases");
    if (g == VP_MG_MAX_BATCH)
        printf("exact %zu, ", exact);
    double med = median_of(v, n); /* sorts v */
    printf("median |err| %.2f%%, max |err| %.2f%%\n", 100.0 * med,
           100.0 * v[n - 1]);
}

/* ---- repeated cases ------------------------------------------------------- */

static int rcmp(const void *a, const void *b)
{
    const repeat *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->measured > y->measured) - (x->measured < y->measured);
}

/* The median of measured / predicted over a case's n lines, sorted in
 * *tmp (room for n; err's free tail); 0 where a prediction is 0. */
static double ratio_median(const repeat *r, size_t n, double *tmp)
{
    for (size_t k = 0; k < n; k++) {
        if (r[k].predicted == 0)
            return 0.0;
        tmp[k] = (double)r[k].measured / (double)r[k].predicted;
    }
    return median_of(tmp, n);
}

/* Measured step times vary between runs of the same case (the host's speed
 * from step to step and from machine to machine: docs/STEP_TIME.md
 * "Measurement spread"); a case measured more than once is also compared
 * with the median of its measurements. One jsonl line per such case
 * (metric step_us_median, measurements), or a summary line. */
static void repeated(state *s)
{
    double *err = NULL, *dev = NULL;
    size_t n_case = 0, n_dev = 0, most = 0, least = SIZE_MAX;

    if (s->n_rep < 2)
        return; /* no case can have been measured twice */
    qsort(s->rep, s->n_rep, sizeof *s->rep, rcmp);
    err = malloc((s->n_rep + 1) * sizeof *err);
    dev = malloc((s->n_rep + 1) * sizeof *dev);
    for (size_t i = 0, j; err != NULL && dev != NULL && i < s->n_rep; i = j) {
        for (j = i + 1; j < s->n_rep && !strcmp(s->rep[j].id, s->rep[i].id);)
            j++;
        size_t n = j - i, h = i + n / 2;
        if (n < 2)
            continue;
        double med = n % 2 ? (double)s->rep[h].measured
                           : ((double)s->rep[h - 1].measured +
                              (double)s->rep[h].measured) / 2.0;
        /* each measurement against its own prediction (its host's speed:
         * docs/STEP_TIME.md "The host's speed"): the median of their
         * ratios, which is the prediction over the measurements' median
         * where every line is predicted alike */
        double r = ratio_median(&s->rep[i], n, &err[n_case]);
        if (med <= 0.0 || r <= 0.0)
            continue;
        double pred = med / r;
        for (size_t k = i; k < j; k++)
            dev[n_dev++] = fabs((double)s->rep[k].measured / med - 1.0);
        err[n_case++] = fabs(1.0 / r - 1.0);
        most = n > most ? n : most;
        least = n < least ? n : least;
        if (s->jsonl) {
            json_t *o = json_object();
            cli_jset(o, "id", cli_jstr(s->rep[i].id, sizeof s->rep[i].id));
            cli_jset(o, "metric", json_string("step_us_median"));
            cli_jset(o, "predicted", cli_ju64((uint64_t)(pred + 0.5)));
            cli_jset(o, "measured", cli_ju64((uint64_t)(med + 0.5)));
            cli_jset(o, "rel_err", cli_jreal(1.0 / r - 1.0, "%.6f"));
            cli_jset(o, "measurements", cli_ju64(n));
            cli_jprint(stdout, o, false);
        }
    }
    if (n_case > 0 && !s->jsonl) {
        double em = median_of(err, n_case), dm = median_of(dev, n_dev);
        char times[48];
        if (least == most)
            snprintf(times, sizeof times, "%zu", most);
        else
            snprintf(times, sizeof times, "%zu to %zu", least, most);
        printf("step_time, repeated cases: %zu cases measured %s times; "
               "against each case's median, median |err| %.2f%%, max |err| "
               "%.2f%%; the measurements about their case's median, median "
               "%.2f%%, max %.2f%%\n",
               n_case, times, 100.0 * em, 100.0 * err[n_case - 1],
               100.0 * dm, 100.0 * dev[n_dev - 1]);
    }
    free(err);
    free(dev);
}

/* --gpu, --max-error and --outliers; -1, or the exit status. */
static int prepare(state *s)
{
    const cli_val *v = s->args->v;
    vp_gpu_profile *p;
    vp_error err;
    int rc = -1;

    vp_setup_init(&s->base);
    if (v[O_GPU].given) {
        if ((p = cli_gpu_load(v[O_GPU].text, &rc)) == NULL)
            return rc;
        vp_gpu_apply(p, &s->base);
        s->base.alloc.device_total = 0; /* the cases set their own budgets */
        vp_gpu_hw(p, VP_GPU_BF16, &s->hw);
        vp_hw_fill_defaults(&s->hw);
        vp_gpu_free(p);
        s->have_gpu = true;
    }
    if (v[O_MAX_ERROR].given &&
        vp_error_bounds_parse(v[O_MAX_ERROR].text, s->cli_bound, &err) !=
            VP_OK)
        return cli_usage_error("--max-error: %s", err.msg);
    if (v[O_OUTLIERS].given &&
        vp_bounds_load(v[O_OUTLIERS].text, &s->bounds, &err) != VP_OK)
        return cli_report(&err, NULL);
    return -1;
}

static int validate_run(state *s)
{
    const cli_args *a = s->args;
    int rc = prepare(s);

    if (rc >= 0)
        return rc;
    if (!s->jsonl)
        printf("%-40s %-16s %16s %16s %9s\n", "case", "metric", "predicted",
               "measured", "error");
    for (size_t i = 0; i < a->n_operands; i++)
        run_file(s, a->operands[i]);
    for (int g = 0; g < VP_MG__COUNT && !s->jsonl; g++)
        summary(s, g);
    repeated(s);
    if (s->cases == 0 && s->not_cases == 0 && s->rc == CLI_OK)
        note_rc(s, cli_fail("no cases in the input"));
    return s->rc != CLI_OK ? s->rc : s->exceeded ? CLI_NOFIT : CLI_OK;
}

int cli_validate(int argc, char **argv)
{
    cli_spec spec = {OPTS, sizeof OPTS / sizeof OPTS[0], 0, SIZE_MAX, "",
                     false, validate_help};
    state s;
    int rc;

    cli_args a;

    memset(&s, 0, sizeof s);
    rc = cli_args_parse(&spec, argc, argv, &a);
    s.args = &a;
    if (rc < 0 && a.n_operands == 0)
        rc = cli_usage_error("validate needs a FILE.jsonl");
    if (rc < 0) {
        const cli_val *m = &a.v[O_MODELS];
        s.dirs = malloc((m->n_list + 1) * sizeof *s.dirs);
        if (s.dirs == NULL)
            rc = cli_fail("out of memory");
    }
    if (rc < 0) {
        for (size_t i = 0; i < a.v[O_MODELS].n_list; i++)
            s.dirs[s.n_dirs++] = a.v[O_MODELS].list[i];
        s.dirs[s.n_dirs++] = "models";
        s.jsonl = a.v[O_FORMAT].given && a.v[O_FORMAT].choice == 1;
        rc = validate_run(&s);
    }
    free(s.dirs);
    free(s.rec);
    free(s.rep);
    for (int g = 0; g < VP_MG__COUNT; g++)
        free(s.all[g]);
    vp_bounds_destroy(&s.bounds);
    cli_args_free(&a);
    return rc;
}
