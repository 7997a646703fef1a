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
    cli_args args;
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

enum {
    O_MODEL = CLI_O__SETUP, O_MIN, O_MAX, O_MAX_TRIALS, O_TIMEOUT, O_GRACE,
    O_MARGIN, O_LOG_DIR, O_FORMAT
};

static const char *const FORMATS[] = {"table", "json", NULL};

#define SECONDS(i, n, h)                                                    \
    {.id = i, .name = n, .metavar = "S", .type = CLI_ARG_DOUBLE,            \
     .dmax = 1e9, .help = h}

static const cli_opt OPTS[] = {
    {.id = O_MODEL, .name = "model", .metavar = "MODEL",
     .type = CLI_ARG_STRING},
    CLI_ROW_BUDGET(""),
    CLI_ROW_PRECISION(""),
    CLI_ROW_OPTIMIZER(""),
    CLI_ROW_CHECKPOINT(""),
    CLI_ROW_SEQ,
    CLI_ROW_ACCUM,
    CLI_ROW_ATTENTION(""),
    CLI_ROW_STEPS(""),
    CLI_ROW_KEEP_GRADS,
    {.id = O_MIN, .name = "min", .metavar = "N", .type = CLI_ARG_U64,
     .min = 1, .max = UINT64_MAX},
    {.id = O_MAX, .name = "max", .metavar = "N", .type = CLI_ARG_U64,
     .min = 1, .max = UINT64_MAX},
    {.id = O_MAX_TRIALS, .name = "max-trials", .metavar = "N",
     .type = CLI_ARG_U64, .min = 1, .max = UINT32_MAX},
    SECONDS(O_TIMEOUT, "timeout", ""),
    SECONDS(O_GRACE, "grace", ""),
    {.id = O_MARGIN, .name = "margin", .metavar = "F",
     .type = CLI_ARG_DOUBLE, .dmax = 0.999999},
    {.id = O_LOG_DIR, .name = "log-dir", .metavar = "DIR",
     .type = CLI_ARG_STRING},
    {.id = O_FORMAT, .short_name = 'f', .name = "format", .metavar = "FMT",
     .type = CLI_ARG_ENUM, .choices = FORMATS, .what = "format"},
    CLI_HELP_ROW,
};

/* The prediction's options need --model; the first one given. */
static const char *first_setup_option(const cli_val *v)
{
    static const char *const names[CLI_O__SETUP] = {
        [CLI_O_BATCH] = "--batch", [CLI_O_SEQ] = "--seq",
        [CLI_O_PRECISION] = "--precision", [CLI_O_OPTIMIZER] = "--optimizer",
        [CLI_O_CHECKPOINT] = "--checkpoint", [CLI_O_ACCUM] = "--accum",
        [CLI_O_KEEP_GRADS] = "--keep-grads", [CLI_O_ATTENTION] = "--attention",
        [CLI_O_STEPS] = "--steps", [CLI_O_BUDGET] = "--budget"};
    const char *first = NULL;
    int at = 0;

    for (int k = 0; k < CLI_O__SETUP; k++)
        if (v[k].given && (first == NULL || v[k].at < at)) {
            first = names[k];
            at = v[k].at;
        }
    return first;
}

static int probe_options(probe_args *a)
{
    const cli_val *v = a->args.v;
    int rc = cli_setup_common(v, true, &a->setup);

    if (rc >= 0)
        return rc;
    a->model_path = v[O_MODEL].given ? v[O_MODEL].text : NULL;
    a->checkpoint = v[CLI_O_CHECKPOINT].given ? v[CLI_O_CHECKPOINT].text
                                              : NULL;
    if (a->checkpoint != NULL && strcmp(a->checkpoint, "auto") == 0)
        return cli_usage_error("probe takes a fixed --checkpoint (none, all "
                               "or names), not auto");
    if (v[O_MIN].given)
        a->cfg.min = v[O_MIN].u;
    if (v[O_MAX].given)
        a->cfg.max = v[O_MAX].u;
    if (v[O_MAX_TRIALS].given)
        a->cfg.max_trials = (uint32_t)v[O_MAX_TRIALS].u;
    if (v[O_TIMEOUT].given)
        a->exec.timeout_s = v[O_TIMEOUT].d;
    if (v[O_GRACE].given)
        a->exec.grace_s = v[O_GRACE].d;
    if (v[O_MARGIN].given) {
        uint64_t ppm = (uint64_t)llround(v[O_MARGIN].d * 1e6);
        a->cfg.margin_ppm = (uint32_t)(ppm < 1000000 ? ppm : 999999);
    }
    a->log_dir = v[O_LOG_DIR].given ? v[O_LOG_DIR].text : NULL;
    a->json = v[O_FORMAT].given && v[O_FORMAT].choice == 1;
    a->setup_opt = first_setup_option(v);
    return -1;
}

static int probe_parse(int argc, char **argv, probe_args *a)
{
    cli_spec spec = {OPTS, sizeof OPTS / sizeof OPTS[0], 0, 0,
                     "the command to run goes after '--'", true, probe_help};
    int rc;

    memset(a, 0, sizeof *a);
    vp_setup_init(&a->setup);
    a->setup.steps = VP_STEADY_STEPS; /* a probe trial runs a step or two */
    vp_probe_config_init(&a->cfg);
    vp_exec_config_init(&a->exec);
    a->exec.timeout_s = DEFAULT_TIMEOUT;
    a->exec.grace_s = DEFAULT_GRACE;
    if ((rc = cli_args_parse(&spec, argc, argv, &a->args)) >= 0 ||
        (rc = probe_options(a)) >= 0)
        return rc;
    a->cmd = a->args.rest;
    a->n_cmd = a->args.n_rest;
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

static int print_json(FILE *f, const probe_args *a, uint64_t predicted,
                      const vp_probe_result *r, const char *log_dir)
{
    json_t *o = json_object(), *trials = json_array();

    cli_jset(o, "max_batch", cli_ju64(r->max_batch));
    cli_jset(o, "recommended", cli_ju64(r->recommended));
    for (size_t i = 0; i < r->n_trials; i++) {
        json_t *t = json_object();
        cli_jset(t, "batch", cli_ju64(r->trials[i].batch));
        cli_jset(t, "outcome",
                 json_string(vp_trial_outcome_name(r->trials[i].outcome)));
        cli_jset(t, "seconds", cli_jreal(r->trials[i].seconds, "%.3f"));
        cli_jpush(trials, t);
    }
    cli_jset(o, "trials", trials);
    cli_jset(o, "predicted", predicted ? cli_ju64(predicted) : json_null());
    cli_jset(o, "complete", json_boolean(r->complete));
    cli_jset(o, "fail_batch",
             r->fail_batch ? cli_ju64(r->fail_batch) : json_null());
    cli_jset(o, "margin", cli_jreal(a->cfg.margin_ppm / 1e6, "%.6g"));
    cli_jset(o, "log_dir", cli_jstr(log_dir, SIZE_MAX));
    return cli_jprint(f, o, false);
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
    vp_error err;
    vp_status st;
    int rc = CLI_OK;

    *predicted = 0;
    vp_error_clear(&err);
    vp_model *model = cli_model_load(a->model_path, &rc);
    if (model == NULL)
        return rc;
    st = vp_maxbatch(model, &a->setup, a->checkpoint, a->cfg.max, &mb, &err);
    vp_model_free(model);
    if (st != VP_OK) {
        if (st == VP_EARG && err.msg[0])
            return cli_usage_error("%s", err.msg);
        return cli_report(&err, NULL);
    }
    *predicted = mb.max_batch;
    return -1;
}

static int prepare_log_dir(const probe_args *a, char *buf, size_t n)
{
    vp_error err;

    if (a->log_dir == NULL) {
        if (vp_probe_log_dir_new(buf, n, &err) != VP_OK)
            return cli_fail("%s", err.msg);
        return -1;
    }
    if (strlen(a->log_dir) >= n)
        return cli_fail("--log-dir is too long");
    strcpy(buf, a->log_dir);
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return cli_fail("cannot create '%s': %s", buf, strerror(errno));
    return -1;
}

static void describe_stop(const runner *rn, const vp_probe_result *r)
{
    const vp_trial *t = &r->trials[r->n_trials - 1];
    const vp_exec_result *x = &rn->last;

    if (r->stop == VP_TRIAL_TIMEOUT) {
        cli_fail("trial %zu (batch %" PRIu64 ") ran past the %.1f s "
                 "timeout; its process group was killed", r->n_trials,
                 t->batch, rn->a->exec.timeout_s);
    } else if (r->stop == VP_TRIAL_CANCELLED) {
        fprintf(stderr, "vramplan: interrupted during trial %zu (batch %"
                PRIu64 "); its process group was stopped\n", r->n_trials,
                t->batch);
        return;
    } else if (x->exec_failed) {
        cli_fail("cannot run '%s': %s", rn->a->cmd[0],
                 strerror(x->exec_errno));
        return;
    } else if (x->term_signal) {
        cli_fail("trial %zu (batch %" PRIu64 ") was killed by signal %d, "
                 "with no out-of-memory message", r->n_trials, t->batch,
                 x->term_signal);
    } else {
        cli_fail("trial %zu (batch %" PRIu64 ") failed with exit status %d, "
                 "with no out-of-memory message", r->n_trials, t->batch,
                 x->exit_code);
    }
    fprintf(stderr, "  stderr (%s), last lines:\n", x->err_path);
    show_tail(x->err_path, ERR_TAIL_LINES);
    fprintf(stderr, "  stdout: %s\n", x->out_path);
}

/* Run the search with SIGINT, SIGTERM and SIGHUP stopping the trial. */
static vp_status search(probe_args *a, runner *rn, vp_probe_result *res,
                        vp_error *err)
{
    struct sigaction sa, old_int, old_term, old_hup;
    vp_status st;

    g_cancel = 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
    st = vp_probe_search(&a->cfg, run_trial, rn, progress, NULL, res, err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    return st;
}

static int probe_run(probe_args *a)
{
    char log_dir[1024];
    uint64_t predicted = 0;
    vp_probe_result res;
    vp_error err;
    runner rn;
    int rc;

    if (a->model_path != NULL) {
        if ((rc = predict(a, &predicted)) >= 0)
            return rc;
        a->cfg.predicted = predicted ? predicted : a->cfg.min;
        fprintf(stderr, "probe: predicted largest batch %" PRIu64 "%s\n",
                predicted, predicted ? "" : " (batch 1 does not fit)");
    }
    if ((rc = prepare_log_dir(a, log_dir, sizeof log_dir)) >= 0)
        return rc;
    fprintf(stderr, "probe: logs in %s\n", log_dir);
    memset(&rn, 0, sizeof rn);
    rn.a = a;
    rn.log_dir = log_dir;
    vp_status st = search(a, &rn, &res, &err);
    if (st != VP_OK) {
        vp_probe_result_destroy(&res);
        return cli_fail("%s", err.msg[0] ? err.msg : vp_strerror(st));
    }
    rc = CLI_OK;
    if (a->json)
        rc = print_json(stdout, a, predicted, &res, log_dir);
    else
        print_table(stdout, a, predicted, &res, log_dir);
    fflush(stdout);
    if (rc != CLI_OK) {
        /* the JSON could not be written */
    } else if (res.stop != VP_TRIAL_OK && res.n_trials > 0) {
        describe_stop(&rn, &res);
        rc = res.stop == VP_TRIAL_CANCELLED ? CLI_CANCEL : CLI_TRIAL;
    } else if (res.max_batch == 0) {
        cli_fail("batch %" PRIu64 " ran out of memory", a->cfg.min);
        rc = CLI_NOFIT;
    }
    vp_probe_result_destroy(&res);
    return rc;
}

int cli_probe(int argc, char **argv)
{
    probe_args a;
    int rc = probe_parse(argc, argv, &a);

    if (rc < 0)
        rc = probe_run(&a);
    cli_args_free(&a.args);
    return rc;
}
