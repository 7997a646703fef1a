/* vramplan probe: find the largest batch by running the real command.
 *
 *   vramplan probe --model models/gpt2-small.yaml --precision amp-bf16 \
 *       --budget 16GiB -- python3 train.py --batch-size {batch}
 *
 * The search and the process handling are in the library (probe.h); this
 * file parses the options, predicts the starting batch with vp_maxbatch,
 * prints progress on stderr and the result on stdout. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "vramplan/probe.h"
#include "vramplan/vramplan.h"

enum {
    PROBE_OK = 0,        /* the largest batch was found                 */
    PROBE_NOFIT = 1,     /* not even --min ran                          */
    PROBE_USAGE = 2,     /* usage, I/O or system error                  */
    PROBE_MODEL = 3,     /* invalid model description                   */
    PROBE_TRIAL = 4,     /* a trial failed otherwise or timed out       */
    PROBE_CANCEL = 130   /* interrupted                                 */
};

#define DEFAULT_TIMEOUT 1800.0
#define DEFAULT_GRACE 5.0
#define ERR_TAIL_LINES 20

static void probe_help(FILE *f)
{
    fputs(
        "Usage: vramplan probe [--model MODEL [SETUP] --budget SIZE] "
        "[OPTIONS] -- CMD [ARGS...]\n"
        "\n"
        "Find the largest batch that runs on the real GPU by running CMD, "
        "with\n"
        "every '{batch}' in its arguments replaced by the batch to try (no "
        "shell;\n"
        "e.g. -- python3 train.py --batch-size {batch}). A trial is 'ok' when "
        "CMD\n"
        "exits 0, 'oom' when it exits non-zero and its stderr shows a CUDA or\n"
        "PyTorch out-of-memory error, 'error' for any other failure and "
        "'timeout'\n"
        "past --timeout; an error or a timeout stops the search.\n"
        "\n"
        "With --model the search starts at the batch that 'vramplan maxbatch'\n"
        "predicts, p: it tries p, then p+1 (or p-1), widening by 2, 4, 8... "
        "until\n"
        "the boundary is bracketed, then bisects, so a good prediction needs "
        "two\n"
        "trials. Without --model it doubles from --min, then bisects.\n"
        "\n"
        "Prediction (with --model):\n"
        "  --model MODEL           the model file, as for 'vramplan estimate'\n"
        "  --budget SIZE           the allocator budget CMD applies (e.g. "
        "with\n"
        "                          torch.cuda.set_per_process_memory_"
        "fraction)\n"
        "  -p, --precision P       fp32, amp-bf16, amp-fp16, bf16, fp16\n"
        "  -o, --optimizer O       adamw, adamw-fused, adamw-forloop, sgd, ...\n"
        "  -c, --checkpoint SPEC   none, all or segment names\n"
        "  -s, --seq N             sequence length or image side\n"
        "  --accum N               micro-batches per optimizer step\n"
        "  --attention IMPL        sdpa, flash, efficient, eager, math\n"
        "  --steps N               training steps CMD runs (default 2)\n"
        "  --keep-grads            zero_grad(set_to_none=False)\n"
        "\n"
        "Search:\n"
        "  --min N                 smallest batch to try (default 1)\n"
        "  --max N                 largest batch to try (default 1048576)\n"
        "  --timeout S             seconds a trial may run (default 1800; 0: "
        "none);\n"
        "                          then its process group gets SIGTERM, and\n"
        "  --grace S               S seconds later SIGKILL (default 5)\n"
        "  --margin F              recommended = floor(max x (1 - F)), "
        "default 0.05\n"
        "  --max-trials N          stop after N trials (default: no limit)\n"
        "  --log-dir DIR           keep each trial's stdout and stderr in DIR\n"
        "                          (default: a new $TMPDIR/vramplan-probe-*)\n"
        "  -f, --format FMT        table (default) or json\n"
        "  -h, --help              show this help\n"
        "\n"
        "Progress goes to stderr, one line per trial. JSON: {\"max_batch\": N,\n"
        "\"recommended\": N, \"trials\": [{\"batch\": N, \"outcome\": \"ok\", "
        "\"seconds\": X},\n"
        "...], \"predicted\": N|null, \"complete\": B, \"fail_batch\": "
        "N|null,\n"
        "\"margin\": F, \"log_dir\": \"...\"}.\n"
        "\n"
        "Exit status:\n"
        "  0    the largest batch was found\n"
        "  1    not even --min ran (it ran out of memory)\n"
        "  2    usage, I/O or system error\n"
        "  3    invalid model description\n"
        "  4    a trial failed with an error other than out of memory, or "
        "timed out\n"
        "  130  interrupted (the running trial is stopped first)\n",
        f);
}

typedef struct probe_args {
    const char *model_path;
    const char *checkpoint;
    vp_setup setup;
    const char *setup_opt;  /* the first prediction option given      */
    vp_probe_config cfg;
    vp_exec_config exec;
    const char *log_dir;
    bool json;
    char **cmd;             /* after "--"                             */
    size_t n_cmd;
} probe_args;

/* ---- parsing ---------------------------------------------------------- */

static bool parse_u64(const char *text, uint64_t min, uint64_t max,
                      uint64_t *out)
{
    unsigned long long v;
    char *end;

    if (text[0] < '0' || text[0] > '9')
        return false;
    errno = 0;
    v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return false;
    *out = (uint64_t)v;
    return true;
}

/* A finite decimal number >= 0 (no sign, no exponent). */
static bool parse_seconds(const char *text, double *out)
{
    char *end;
    double v;

    if ((text[0] < '0' || text[0] > '9') && text[0] != '.')
        return false;
    if (strpbrk(text, "eEnNiIxX") != NULL)
        return false;
    errno = 0;
    v = strtod(text, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v) || v < 0)
        return false;
    *out = v;
    return true;
}

static int bad_value(const char *opt, const char *val, const char *want)
{
    return cli_usage_error("invalid value '%s' for %s: expected %s", val, opt,
                           want);
}

enum {
    O_MODEL, O_BUDGET, O_PRECISION, O_OPTIMIZER, O_CHECKPOINT, O_SEQ,
    O_ACCUM, O_ATTENTION, O_STEPS, O_KEEP_GRADS, O_MIN, O_MAX, O_MAX_TRIALS,
    O_TIMEOUT, O_GRACE, O_MARGIN, O_LOG_DIR, O_FORMAT
};

typedef struct opt {
    int id;
    const char *name;  /* with the dashes                          */
    const char *alias; /* short form, or NULL                      */
    bool value;        /* takes a value                            */
    bool setup;        /* a prediction option: needs --model       */
} opt;

static const opt OPTS[] = {
    {O_MODEL, "--model", NULL, true, false},
    {O_BUDGET, "--budget", NULL, true, true},
    {O_PRECISION, "--precision", "-p", true, true},
    {O_OPTIMIZER, "--optimizer", "-o", true, true},
    {O_CHECKPOINT, "--checkpoint", "-c", true, true},
    {O_SEQ, "--seq", "-s", true, true},
    {O_ACCUM, "--accum", NULL, true, true},
    {O_ATTENTION, "--attention", NULL, true, true},
    {O_STEPS, "--steps", NULL, true, true},
    {O_KEEP_GRADS, "--keep-grads", NULL, false, true},
    {O_MIN, "--min", NULL, true, false},
    {O_MAX, "--max", NULL, true, false},
    {O_MAX_TRIALS, "--max-trials", NULL, true, false},
    {O_TIMEOUT, "--timeout", NULL, true, false},
    {O_GRACE, "--grace", NULL, true, false},
    {O_MARGIN, "--margin", NULL, true, false},
    {O_LOG_DIR, "--log-dir", NULL, true, false},
    {O_FORMAT, "--format", "-f", true, false},
};

/* The option an argument names ("--name", "--name=V" or "-x"), or NULL. */
static const opt *find_opt(const char *arg, const char **eq)
{
    size_t len;

    *eq = arg[1] == '-' ? strchr(arg, '=') : NULL;
    len = *eq != NULL ? (size_t)(*eq - arg) : strlen(arg);
    for (size_t k = 0; k < sizeof OPTS / sizeof OPTS[0]; k++)
        if ((strlen(OPTS[k].name) == len &&
             strncmp(arg, OPTS[k].name, len) == 0) ||
            (*eq == NULL && OPTS[k].alias != NULL &&
             strcmp(arg, OPTS[k].alias) == 0))
            return &OPTS[k];
    return NULL;
}

/* Apply one option's value; -1 when fine, else an exit code. */
static int probe_option(probe_args *a, const opt *o, const char *val)
{
    vp_error err;
    uint64_t v;
    double d;

    switch (o->id) {
    case O_MODEL:
        if (val[0] == '\0')
            return cli_usage_error("--model needs a MODEL file");
        a->model_path = val;
        break;
    case O_BUDGET:
        if (vp_size_parse(val, &a->setup.alloc.limit, &err) != VP_OK)
            return cli_usage_error("--budget: %s", err.msg);
        if (a->setup.alloc.limit == 0)
            return cli_usage_error("invalid value '%s' for --budget: the "
                                   "budget must be more than 0 bytes", val);
        break;
    case O_PRECISION:
        if (vp_precision_parse(val, &a->setup.precision) != VP_OK)
            return cli_usage_error("unknown precision '%s' (expected fp32, "
                                   "amp-bf16, amp-fp16, bf16 or fp16)", val);
        break;
    case O_OPTIMIZER:
        if (vp_optimizer_parse(val, &a->setup.optimizer) != VP_OK)
            return cli_usage_error("unknown optimizer '%s'", val);
        break;
    case O_CHECKPOINT:
        if (val[0] == '\0')
            return cli_usage_error("--checkpoint needs a SPEC");
        if (strcmp(val, "auto") == 0)
            return cli_usage_error("probe takes a fixed --checkpoint (none, "
                                   "all or names), not auto");
        a->checkpoint = val;
        break;
    case O_SEQ:
        if (!parse_u64(val, 1, UINT64_MAX, &a->setup.seq))
            return bad_value(o->name, val, "an integer >= 1");
        break;
    case O_ACCUM:
        if (!parse_u64(val, 1, UINT32_MAX, &v))
            return bad_value(o->name, val, "an integer >= 1");
        a->setup.accum = (uint32_t)v;
        break;
    case O_ATTENTION:
        if (vp_attn_impl_parse(val, &a->setup.attn) != VP_OK)
            return cli_usage_error("unknown attention implementation '%s' "
                                   "(expected one of: sdpa flash efficient "
                                   "eager math)", val);
        a->setup.attn_set = true;
        break;
    case O_STEPS:
        if (!parse_u64(val, 1, VP_MAX_STEPS, &v))
            return bad_value(o->name, val, "an integer from 1 to 16");
        a->setup.steps = (uint32_t)v;
        break;
    case O_KEEP_GRADS:
        a->setup.set_to_none = false;
        break;
    case O_MIN:
        if (!parse_u64(val, 1, UINT64_MAX, &a->cfg.min))
            return bad_value(o->name, val, "an integer >= 1");
        break;
    case O_MAX:
        if (!parse_u64(val, 1, UINT64_MAX, &a->cfg.max))
            return bad_value(o->name, val, "an integer >= 1");
        break;
    case O_MAX_TRIALS:
        if (!parse_u64(val, 1, UINT32_MAX, &v))
            return bad_value(o->name, val, "an integer >= 1");
        a->cfg.max_trials = (uint32_t)v;
        break;
    case O_TIMEOUT:
        if (!parse_seconds(val, &a->exec.timeout_s))
            return bad_value(o->name, val, "seconds >= 0");
        break;
    case O_GRACE:
        if (!parse_seconds(val, &a->exec.grace_s))
            return bad_value(o->name, val, "seconds >= 0");
        break;
    case O_MARGIN:
        if (!parse_seconds(val, &d) || d >= 1.0)
            return bad_value(o->name, val,
                             "a fraction from 0 to below 1, e.g. 0.05");
        v = (uint64_t)llround(d * 1e6);
        a->cfg.margin_ppm = (uint32_t)(v < 1000000 ? v : 999999);
        break;
    case O_LOG_DIR:
        if (val[0] == '\0')
            return cli_usage_error("--log-dir needs a DIR");
        a->log_dir = val;
        break;
    case O_FORMAT:
        if (strcmp(val, "json") == 0)
            a->json = true;
        else if (strcmp(val, "table") == 0)
            a->json = false;
        else
            return cli_usage_error("unknown format '%s' (expected table or "
                                   "json)", val);
        break;
    }
    if (o->setup && a->setup_opt == NULL)
        a->setup_opt = o->name;
    return -1;
}

static int probe_parse(int argc, char **argv, probe_args *a)
{
    memset(a, 0, sizeof *a);
    vp_setup_init(&a->setup);
    a->setup.steps = 2; /* a probe trial usually runs a step or two */
    vp_probe_config_init(&a->cfg);
    vp_exec_config_init(&a->exec);
    a->exec.timeout_s = DEFAULT_TIMEOUT;
    a->exec.grace_s = DEFAULT_GRACE;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *eq, *val = NULL;
        const opt *o;
        int rc;

        if (strcmp(arg, "--") == 0) {
            a->cmd = argv + i + 1;
            a->n_cmd = (size_t)(argc - i - 1);
            break;
        }
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            probe_help(stdout);
            return PROBE_OK;
        }
        if (arg[0] != '-' || arg[1] == '\0')
            return cli_usage_error("unexpected argument '%s' (the command "
                                   "to run goes after '--')", arg);
        o = find_opt(arg, &eq);
        if (o == NULL)
            return cli_usage_error("unknown option '%s' for probe", arg);
        if (o->value) {
            if (eq != NULL)
                val = eq + 1;
            else if (i + 1 < argc)
                val = argv[++i];
            else
                return cli_usage_error("option %s needs a value", o->name);
        } else if (eq != NULL) {
            return cli_usage_error("option %s takes no value", o->name);
        }
        rc = probe_option(a, o, val);
        if (rc >= 0)
            return rc;
    }

    if (a->cmd == NULL || a->n_cmd == 0)
        return cli_usage_error("probe needs the command to run after '--' "
                               "(e.g. -- python3 train.py --batch {batch})");
    if (!vp_probe_argv_has_batch(a->cmd, a->n_cmd))
        return cli_usage_error("no '{batch}' in the command: write it where "
                               "the batch size goes");
    if (a->cfg.min > a->cfg.max)
        return cli_usage_error("--min (%" PRIu64 ") is above --max (%" PRIu64
                               ")", a->cfg.min, a->cfg.max);
    if (a->model_path == NULL && a->setup_opt != NULL)
        return cli_usage_error("%s is for the prediction: it needs --model",
                               a->setup_opt);
    if (a->model_path != NULL && a->setup.alloc.limit == 0)
        return cli_usage_error("--model needs --budget (the allocator budget "
                               "that the command applies)");
    return -1;
}

/* ---- library errors ----------------------------------------------------- */

static int model_error(const vp_error *err)
{
    const char *msg = err->msg[0] ? err->msg : vp_strerror(err->code);

    if (err->path[0] != '\0' && err->line > 0)
        fprintf(stderr, "%s:%" PRIu32 ":%" PRIu32 ": error: %s\n", err->path,
                err->line, err->col ? err->col : 1, msg);
    else if (err->path[0] != '\0')
        fprintf(stderr, "%s: error: %s\n", err->path, msg);
    else
        fprintf(stderr, "vramplan: error: %s\n", msg);
    switch (err->code) {
    case VP_ESYNTAX:
    case VP_ESCHEMA:
    case VP_ERANGE:
    case VP_EUNSUPPORTED:
    case VP_ELIMIT:
    case VP_EOVERFLOW:
    case VP_EUNIT:
        return PROBE_MODEL;
    default:
        return PROBE_USAGE;
    }
}

/* ---- trials ------------------------------------------------------------- */

static volatile sig_atomic_t g_cancel;

static void on_signal(int sig)
{
    g_cancel = sig;
}

typedef struct runner {
    const probe_args *a;
    const char *log_dir;
    uint32_t n;                 /* trials started                     */
    vp_exec_result last;        /* of the last trial                  */
    char name[64];
} runner;

static vp_status run_trial(uint64_t batch, vp_trial_outcome *outcome,
                           double *seconds, void *ud, vp_error *err)
{
    runner *r = ud;
    vp_exec_config c = r->a->exec;
    char **argv;
    vp_status st;

    r->n++;
    snprintf(r->name, sizeof r->name, "trial-%02" PRIu32 "-batch-%" PRIu64,
             r->n, batch);
    c.log_dir = r->log_dir;
    c.log_name = r->name;
    c.cancel = &g_cancel;
    argv = vp_probe_argv_format(r->a->cmd, r->a->n_cmd, batch, err);
    if (argv == NULL)
        return err->code;
    st = vp_probe_exec(argv, &c, &r->last, err);
    vp_probe_argv_free(argv);
    *outcome = r->last.outcome;
    *seconds = r->last.seconds;
    return st;
}

static void show_bound(char *buf, size_t n, uint64_t v)
{
    if (v)
        snprintf(buf, n, "%" PRIu64, v);
    else
        snprintf(buf, n, "?");
}

static void progress(const vp_probe_progress *p, void *ud)
{
    char lo[24], hi[24];

    (void)ud;
    if (!p->done) {
        show_bound(lo, sizeof lo, p->lo);
        show_bound(hi, sizeof hi, p->hi);
        fprintf(stderr, "probe: trial %" PRIu32 ": batch %" PRIu64
                " (fits <= %s, fails >= %s) ... ", p->n, p->trial->batch,
                p->lo ? lo : "-", hi);
    } else {
        show_bound(lo, sizeof lo, p->lo);
        show_bound(hi, sizeof hi, p->hi);
        fprintf(stderr, "%s in %.1f s; bracket [%s, %s]\n",
                vp_trial_outcome_name(p->trial->outcome), p->trial->seconds,
                p->lo ? lo : "-", hi);
    }
    fflush(stderr);
}

/* The last lines of a file on stderr, indented. */
static void show_tail(const char *path, int lines)
{
    FILE *f = fopen(path, "rb");
    long size, from;
    char *buf;
    size_t len, start;
    int seen = 0;

    if (f == NULL)
        return;
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0) {
        fclose(f);
        return;
    }
    from = size > 16384 ? size - 16384 : 0;
    buf = malloc(16385);
    if (buf == NULL || fseek(f, from, SEEK_SET) != 0) {
        free(buf);
        fclose(f);
        return;
    }
    len = fread(buf, 1, 16384, f);
    fclose(f);
    while (len > 0 && buf[len - 1] == '\n')
        len--;
    buf[len] = '\0';
    start = len;
    while (start > 0) {
        if (buf[start - 1] == '\n' && ++seen == lines)
            break;
        start--;
    }
    for (char *line = buf + start; *line != '\0';) {
        char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);

        fprintf(stderr, "    | %.*s\n", (int)n, line);
        line += n + (nl != NULL);
    }
    free(buf);
}

static void shell_word(FILE *f, const char *s)
{
    if (s[0] != '\0' && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnop"
                                  "qrstuvwxyz0123456789_./:=,@%+-{}") ==
                            strlen(s)) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputs("'\\''", f);
        else
            fputc(*s, f);
    }
    fputc('\'', f);
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;

        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void print_json(FILE *f, const probe_args *a, uint64_t predicted,
                       const vp_probe_result *r, const char *log_dir)
{
    fprintf(f, "{\"max_batch\": %" PRIu64 ", \"recommended\": %" PRIu64
            ", \"trials\": [", r->max_batch, r->recommended);
    for (size_t i = 0; i < r->n_trials; i++)
        fprintf(f, "%s{\"batch\": %" PRIu64 ", \"outcome\": \"%s\", "
                "\"seconds\": %.3f}", i ? ", " : "", r->trials[i].batch,
                vp_trial_outcome_name(r->trials[i].outcome),
                r->trials[i].seconds);
    fputs("], \"predicted\": ", f);
    if (predicted)
        fprintf(f, "%" PRIu64, predicted);
    else
        fputs("null", f);
    fprintf(f, ", \"complete\": %s, \"fail_batch\": ",
            r->complete ? "true" : "false");
    if (r->fail_batch)
        fprintf(f, "%" PRIu64, r->fail_batch);
    else
        fputs("null", f);
    fprintf(f, ", \"margin\": %.6g, \"log_dir\": ",
            a->cfg.margin_ppm / 1e6);
    json_str(f, log_dir);
    fputs("}\n", f);
}

static void print_table(FILE *f, const probe_args *a, uint64_t predicted,
                        const vp_probe_result *r, const char *log_dir)
{
    double total = 0;

    fputs("command      ", f);
    for (size_t i = 0; i < a->n_cmd; i++) {
        if (i)
            fputc(' ', f);
        shell_word(f, a->cmd[i]);
    }
    fputc('\n', f);
    if (a->model_path != NULL) {
        char b[32];

        fprintf(f, "predicted    ");
        if (predicted)
            fprintf(f, "%" PRIu64, predicted);
        else
            fprintf(f, "none (batch 1 does not fit)");
        fprintf(f, " by %s, budget %s\n", a->model_path,
                vp_size_format(a->setup.alloc.limit, b, sizeof b));
    }
    fprintf(f, "\n%5s %10s  %-9s %9s\n", "trial", "batch", "outcome",
            "seconds");
    for (size_t i = 0; i < r->n_trials; i++) {
        fprintf(f, "%5zu %10" PRIu64 "  %-9s %9.1f\n", i + 1,
                r->trials[i].batch,
                vp_trial_outcome_name(r->trials[i].outcome),
                r->trials[i].seconds);
        total += r->trials[i].seconds;
    }
    fputc('\n', f);
    if (r->max_batch)
        fprintf(f, "max batch    %" PRIu64 "%s\n", r->max_batch,
                r->complete ? (r->fail_batch
                                   ? " (the largest that ran; the next one "
                                     "ran out of memory)"
                                   : " (the largest that ran; --max)")
                            : " (the largest that ran so far: search "
                              "stopped)");
    else
        fprintf(f, "max batch    none: batch %" PRIu64 " %s\n", a->cfg.min,
                r->complete ? "ran out of memory" : "did not run");
    if (r->max_batch)
        fprintf(f, "recommended  %" PRIu64 " (margin %.4g%%)\n",
                r->recommended, a->cfg.margin_ppm / 1e4);
    fprintf(f, "trials       %zu in %.1f s\n", r->n_trials, total);
    fprintf(f, "logs         %s\n", log_dir);
}

/* ---- the command -------------------------------------------------------- */

static int predict(const probe_args *a, uint64_t *predicted)
{
    vp_maxbatch_result mb;
    vp_model *model;
    vp_error err;
    vp_status st;

    *predicted = 0;
    vp_error_clear(&err);
    char buf[4096];
    const char *path = cli_model_path(a->model_path, buf, sizeof buf);
    if (path == NULL)
        return 2;
    model = vp_model_load(path, &err);
    if (model == NULL)
        return model_error(&err);
    st = vp_maxbatch(model, &a->setup, a->checkpoint, a->cfg.max, &mb, &err);
    vp_model_free(model);
    if (st != VP_OK) {
        if (st == VP_EARG && err.msg[0])
            return cli_usage_error("%s", err.msg);
        return model_error(&err);
    }
    *predicted = mb.max_batch;
    return -1;
}

static int prepare_log_dir(const probe_args *a, char *buf, size_t n)
{
    vp_error err;

    if (a->log_dir == NULL) {
        if (vp_probe_log_dir_new(buf, n, &err) != VP_OK) {
            fprintf(stderr, "vramplan: error: %s\n", err.msg);
            return PROBE_USAGE;
        }
        return -1;
    }
    if (strlen(a->log_dir) >= n) {
        fprintf(stderr, "vramplan: error: --log-dir is too long\n");
        return PROBE_USAGE;
    }
    strcpy(buf, a->log_dir);
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "vramplan: error: cannot create '%s': %s\n", buf,
                strerror(errno));
        return PROBE_USAGE;
    }
    return -1;
}

static void describe_stop(const runner *rn, const vp_probe_result *r)
{
    const vp_trial *t = &r->trials[r->n_trials - 1];
    const vp_exec_result *x = &rn->last;

    if (r->stop == VP_TRIAL_TIMEOUT) {
        fprintf(stderr, "vramplan: error: trial %zu (batch %" PRIu64
                ") ran past the %.1f s timeout; its process group was "
                "killed\n", r->n_trials, t->batch, rn->a->exec.timeout_s);
    } else if (r->stop == VP_TRIAL_CANCELLED) {
        fprintf(stderr, "vramplan: interrupted during trial %zu (batch %"
                PRIu64 "); its process group was stopped\n", r->n_trials,
                t->batch);
        return;
    } else if (x->exec_failed) {
        fprintf(stderr, "vramplan: error: cannot run '%s': %s\n",
                rn->a->cmd[0], strerror(x->exec_errno));
        return;
    } else if (x->term_signal) {
        fprintf(stderr, "vramplan: error: trial %zu (batch %" PRIu64
                ") was killed by signal %d, with no out-of-memory message\n",
                r->n_trials, t->batch, x->term_signal);
    } else {
        fprintf(stderr, "vramplan: error: trial %zu (batch %" PRIu64
                ") failed with exit status %d, with no out-of-memory "
                "message\n", r->n_trials, t->batch, x->exit_code);
    }
    fprintf(stderr, "  stderr (%s), last lines:\n", x->err_path);
    show_tail(x->err_path, ERR_TAIL_LINES);
    fprintf(stderr, "  stdout: %s\n", x->out_path);
}

int cli_probe(int argc, char **argv)
{
    struct sigaction sa, old_int, old_term, old_hup;
    char log_dir[1024];
    uint64_t predicted = 0;
    vp_probe_result res;
    vp_error err;
    vp_status st;
    probe_args a;
    runner rn;
    int rc;

    rc = probe_parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    if (a.model_path != NULL) {
        rc = predict(&a, &predicted);
        if (rc >= 0)
            return rc;
        a.cfg.predicted = predicted ? predicted : a.cfg.min;
        fprintf(stderr, "probe: predicted largest batch %" PRIu64 "%s\n",
                predicted, predicted ? "" : " (batch 1 does not fit)");
    }
    rc = prepare_log_dir(&a, log_dir, sizeof log_dir);
    if (rc >= 0)
        return rc;
    fprintf(stderr, "probe: logs in %s\n", log_dir);

    memset(&rn, 0, sizeof rn);
    rn.a = &a;
    rn.log_dir = log_dir;
    g_cancel = 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
    st = vp_probe_search(&a.cfg, run_trial, &rn, progress, NULL, &res, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    if (st != VP_OK) {
        fprintf(stderr, "vramplan: error: %s\n",
                err.msg[0] ? err.msg : vp_strerror(st));
        vp_probe_result_destroy(&res);
        return PROBE_USAGE;
    }

    if (a.json)
        print_json(stdout, &a, predicted, &res, log_dir);
    else
        print_table(stdout, &a, predicted, &res, log_dir);
    fflush(stdout);

    if (res.stop != VP_TRIAL_OK && res.n_trials > 0) {
        describe_stop(&rn, &res);
        rc = res.stop == VP_TRIAL_CANCELLED ? PROBE_CANCEL : PROBE_TRIAL;
    } else if (res.max_batch == 0) {
        fprintf(stderr, "vramplan: error: batch %" PRIu64 " ran out of "
                "memory\n", a.cfg.min);
        rc = PROBE_NOFIT;
    } else {
        rc = PROBE_OK;
    }
    vp_probe_result_destroy(&res);
    return rc;
}
