/* vramplan watch [--model MODEL [SETUP]] [OPTIONS] -- CMD ARGS...
 *
 * Runs a training command and follows its GPU memory through NVML
 * (watch.h): alerts past a share of the budget, stops the job before it
 * reaches the budget when asked (--kill-at), and ends with the measured
 * peak against the plan's prediction, with a CSV and an HTML page of
 * both. The job's own output passes through unchanged; watch's lines go
 * to stderr, prefixed "vramplan watch:". */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "vramplan/watch.h"

enum { WATCH_OK = 0, WATCH_STOPPED = 1, WATCH_USAGE = 2, WATCH_MODEL = 3 };

typedef struct watch_args {
    const char *model;
    const char *gpu, *budget_text, *csv, *html, *checkpoint;
    vp_setup setup;
    vp_watch_config cfg;
    char **cmd;
    char model_buf[4096];
} watch_args;

static void watch_help(FILE *f)
{
    fputs(
        "Usage: vramplan watch [--model MODEL [SETUP]] [OPTIONS] -- CMD "
        "[ARGS...]\n"
        "\n"
        "Run CMD (no shell) and sample the memory it takes on each GPU "
        "through\n"
        "NVML, 40 times a second: NVML's used bytes less what was in use "
        "before\n"
        "CMD started, as nvidia-smi shows it. Past --alert of the budget a "
        "line\n"
        "says so, with the step the job last printed and how far it is from "
        "the\n"
        "plan; at --kill-at the job's process group gets SIGTERM (SIGKILL "
        "after\n"
        "--grace) before PyTorch runs out of memory. At the end: the "
        "measured\n"
        "peak against the prediction. The job's output passes through.\n"
        "\n"
        "With --model, the plan is `vramplan estimate` of MODEL and SETUP: "
        "its\n"
        "device bytes (reserved + CUDA context) by the end of each step.\n"
        "\n"
        "Options:\n"
        "  --model MODEL         the model the job trains (name or file)\n"
        "  -b, --batch N, -s, --seq N, -p, --precision P, -o, --optimizer O,\n"
        "  -c, --checkpoint SPEC, --accum N, --steps N\n"
        "                        the setup, as for estimate\n"
        "  --gpu NAME            GPU profile for the CUDA context of the "
        "plan\n"
        "  --gpu-dir DIR         searched first for --gpu NAME\n"
        "  --budget SIZE         bytes the job may take on a GPU (default: "
        "the\n"
        "                        GPU's memory less what was in use before)\n"
        "  --alert PCT           alert threshold, e.g. 90% or 0.9 (default "
        "90%)\n"
        "  --kill-at PCT         stop the job at this share of the budget\n"
        "                        (default: never)\n"
        "  --interval SECONDS    between samples (default 0.025)\n"
        "  --grace SECONDS       SIGTERM to SIGKILL (default 5)\n"
        "  --device N,...        NVML indices of the GPUs (default: all)\n"
        "  --step-pattern RE     extended regex over the job's output lines "
        "whose\n"
        "                        first group is the step (default "
        "'[Ss]tep[ :=#]*([0-9]+)')\n"
        "  --csv FILE            write the samples: "
        "t_s,gpu,step,used,predicted,budget\n"
        "  --html FILE           write a page of measured against predicted\n"
        "  -h, --help            show this help and exit\n"
        "\n"
        "NVML is libnvidia-ml.so.1, or the file named by VRAMPLAN_NVML_LIB.\n"
        "\n"
        "Exit status: the job's (128 + N when signal N ended it); 1 when "
        "watch\n"
        "stopped it at --kill-at; 2 for a usage, NVML or system error; 3 for "
        "an\n"
        "invalid model.\n",
        f);
}

/* "90%" or "0.9": parts per million in (0, 1e6]. */
static bool parse_share(const char *s, uint32_t *ppm)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno)
        return false;
    if (*end == '%') {
        v /= 100.0;
        end++;
    }
    if (*end || !(v > 0.0 && v <= 1.0))
        return false;
    *ppm = (uint32_t)(v * 1e6 + 0.5);
    return true;
}

static bool parse_seconds(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

static bool parse_count(const char *s, uint64_t lo, uint64_t hi,
                        uint64_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool parse_devices(const char *s, vp_watch_config *c)
{
    c->n_gpus = 0;
    while (*s) {
        char *end;
        if (*s < '0' || *s > '9' || c->n_gpus == VP_WATCH_MAX_GPUS)
            return false;
        unsigned long v = strtoul(s, &end, 10);
        if (v > 1024 || (*end && *end != ','))
            return false;
        c->gpus[c->n_gpus++] = (unsigned)v;
        s = *end ? end + 1 : end;
    }
    return c->n_gpus > 0;
}

static int bad(const char *opt, const char *val, const char *want)
{
    return cli_usage_error("invalid value '%s' for %s: expected %s", val,
                           opt, want);
}

/* One option with its value; -1 when fine, else an exit code. */
static int option(watch_args *a, const char *o, const char *v)
{
    uint64_t n;
    vp_setup *s = &a->setup;
    if (!strcmp(o, "--model")) a->model = v;
    else if (!strcmp(o, "--batch") || !strcmp(o, "-b")) {
        if (!parse_count(v, 1, UINT32_MAX, &s->batch))
            return bad(o, v, "an integer >= 1");
    } else if (!strcmp(o, "--seq") || !strcmp(o, "-s")) {
        if (!parse_count(v, 1, UINT32_MAX, &s->seq))
            return bad(o, v, "an integer >= 1");
    } else if (!strcmp(o, "--accum") || !strcmp(o, "--steps")) {
        bool acc = o[2] == 'a';
        if (!parse_count(v, 1, acc ? UINT32_MAX : VP_MAX_STEPS, &n))
            return bad(o, v, acc ? "an integer >= 1" : "1 to 16");
        *(acc ? &s->accum : &s->steps) = (uint32_t)n;
    } else if (!strcmp(o, "--precision") || !strcmp(o, "-p")) {
        if (vp_precision_parse(v, &s->precision) != VP_OK)
            return bad(o, v, "fp32, amp-bf16, amp-fp16, bf16 or fp16");
    } else if (!strcmp(o, "--optimizer") || !strcmp(o, "-o")) {
        if (vp_optimizer_parse(v, &s->optimizer) != VP_OK)
            return bad(o, v, "an optimizer of `vramplan estimate --help`");
    } else if (!strcmp(o, "--checkpoint") || !strcmp(o, "-c")) a->checkpoint = v;
    else if (!strcmp(o, "--gpu")) a->gpu = v;
    else if (!strcmp(o, "--gpu-dir")) cli_set_gpu_dir(v);
    else if (!strcmp(o, "--budget")) {
        vp_error err;
        if (vp_size_parse(v, &a->cfg.budget, &err) != VP_OK ||
            a->cfg.budget == 0)
            return bad(o, v, "a size above 0 bytes, e.g. 70GiB");
    } else if (!strcmp(o, "--alert")) {
        if (!parse_share(v, &a->cfg.alert_ppm))
            return bad(o, v, "a share such as 90% or 0.9");
    } else if (!strcmp(o, "--kill-at")) {
        if (!parse_share(v, &a->cfg.kill_ppm))
            return bad(o, v, "a share such as 98% or 0.98");
    } else if (!strcmp(o, "--interval")) {
        if (!parse_seconds(v, 0.001, 60.0, &a->cfg.interval_s))
            return bad(o, v, "seconds from 0.001 to 60");
    } else if (!strcmp(o, "--grace")) {
        if (!parse_seconds(v, 0.0, 3600.0, &a->cfg.grace_s))
            return bad(o, v, "seconds from 0 to 3600");
    } else if (!strcmp(o, "--device")) {
        if (!parse_devices(v, &a->cfg))
            return bad(o, v, "GPU indices such as 0 or 0,1");
    } else if (!strcmp(o, "--step-pattern")) a->cfg.step_pattern = v;
    else if (!strcmp(o, "--csv")) a->csv = v;
    else if (!strcmp(o, "--html")) a->html = v;
    else return cli_usage_error("unknown option '%s'", o);
    return -1;
}

static const char *const FLAGLESS[] = {"-h", "--help", NULL};

static int parse(int argc, char **argv, watch_args *a)
{
    memset(a, 0, sizeof *a);
    vp_setup_init(&a->setup);
    vp_watch_config_init(&a->cfg);
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        if (!strcmp(arg, FLAGLESS[0]) || !strcmp(arg, FLAGLESS[1])) {
            watch_help(stdout);
            return WATCH_OK;
        }
        if (arg[0] != '-')
            return cli_usage_error("unexpected argument '%s' (put the "
                                   "command after --)", arg);
        char name[64];
        const char *val;
        if (eq && arg[1] == '-') {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
            val = eq + 1;
        } else if (i + 1 < argc) {
            snprintf(name, sizeof name, "%s", arg);
            val = argv[++i];
        } else {
            return cli_usage_error("option %s needs a value", arg);
        }
        int rc = option(a, name, val);
        if (rc >= 0)
            return rc;
    }
    if (i + 1 >= argc)
        return cli_usage_error("watch needs a command after --");
    a->cmd = argv + i + 1;
    bool setup = a->setup.batch != 1 || a->setup.seq || a->checkpoint ||
                 a->setup.accum != 1 || a->setup.precision != VP_PREC_FP32 ||
                 a->setup.optimizer != VP_OPT_ADAMW;
    if (setup && !a->model)
        return cli_usage_error("the setup options describe --model: give "
                               "--model MODEL");
    return -1;
}

/* The plan: the device bytes by the end of each simulated step. */
static int predict(watch_args *a)
{
    vp_error err;
    vp_hw hw;
    if (a->gpu) {
        if (cli_gpu_hw(a->gpu, &hw) != 0)
            return WATCH_USAGE;
        a->setup.context_bytes = hw.context;
    }
    if (!a->model)
        return -1;
    const char *path = cli_model_path(a->model, a->model_buf,
                                      sizeof a->model_buf);
    if (!path)
        return WATCH_USAGE;
    vp_model *m = vp_model_load(path, &err);
    vp_graph *g = m ? vp_graph_build(m, a->setup.batch, a->setup.seq, &err)
                    : NULL;
    bool *ck = NULL;
    vp_status st = g ? VP_OK : err.code;
    if (st == VP_OK && a->checkpoint) {
        size_t n = vp_graph_segment_count(g);
        ck = calloc(n ? n : 1, sizeof *ck);
        st = ck ? vp_graph_checkpoint_select(g, a->checkpoint, ck, &err)
                : vp_error_set(&err, VP_ENOMEM, "out of memory");
        a->setup.checkpoint = ck;
        a->setup.n_checkpoint = n;
    }
    vp_estimate e;
    if (st == VP_OK)
        st = vp_simulate(g, &a->setup, &e, NULL, NULL, &err);
    if (st == VP_OK) {
        uint64_t most = 0;
        for (uint32_t k = 0; k < e.steps && k < VP_WATCH_MAX_STEPS; k++) {
            if (e.step[k].reserved > most)
                most = e.step[k].reserved;
            a->cfg.predicted[k] = most + a->setup.context_bytes;
        }
        a->cfg.n_predicted = e.steps;
        char b[32];
        fprintf(stderr, "vramplan watch: plan: %s, batch %" PRIu64
                        ", %s: %s on the GPU (reserved + CUDA context)\n",
                vp_model_name(m), a->setup.batch,
                vp_precision_name(a->setup.precision),
                vp_size_format(vp_watch_predicted(&a->cfg, 0), b, sizeof b));
    }
    free(ck);
    vp_graph_free(g);
    vp_model_free(m);
    if (st == VP_OK)
        return -1;
    if (err.line)
        fprintf(stderr, "%s:%u:%u: error: %s\n", err.path, err.line, err.col,
                err.msg);
    else
        fprintf(stderr, "vramplan: error: %s\n", err.msg);
    return st == VP_ENOMEM || st == VP_EIO || st == VP_EARG ? WATCH_USAGE
                                                            : WATCH_MODEL;
}

/* "+4.2 % above the plan (71.50 GiB)" or "" without a plan. */
static const char *vs_plan(uint64_t used, uint64_t pred, char *buf,
                           size_t n)
{
    char b[32];
    if (!pred) {
        buf[0] = '\0';
        return buf;
    }
    double d = 100.0 * ((double)used - (double)pred) / (double)pred;
    snprintf(buf, n, ", %.1f%% %s the plan (%s)", d < 0 ? -d : d,
             d < 0 ? "below" : "above", vp_size_format(pred, b, sizeof b));
    return buf;
}

static void on_event(const vp_watch_event *ev, void *ud)
{
    (void)ud;
    char b1[32], b2[32], vs[96], at[48];
    if (ev->kind == VP_WATCH_OUTPUT) {
        FILE *f = ev->fd == 1 ? stdout : stderr;
        fwrite(ev->data, 1, ev->len, f);
        fflush(f);
        return;
    }
    if (ev->kind == VP_WATCH_SAMPLE)
        return; /* peaks are in the summary */
    if (ev->step)
        snprintf(at, sizeof at, "at step %" PRIu32 " (%.1f s)", ev->step,
                 ev->t);
    else
        snprintf(at, sizeof at, "at %.1f s", ev->t);
    double pct = ev->budget ? 100.0 * (double)ev->used / (double)ev->budget
                            : 0.0;
    const char *what = ev->kind == VP_WATCH_ALERT ? "ALERT: "
                       : ev->kind == VP_WATCH_KILL ? "STOPPING THE JOB: "
                                                   : "back under the alert: ";
    fprintf(stderr,
            "vramplan watch: %sGPU %u at %.1f%% of the budget (%s of %s) "
            "%s%s\n",
            what, ev->gpu, pct, vp_size_format(ev->used, b1, sizeof b1),
            vp_size_format(ev->budget, b2, sizeof b2), at,
            vs_plan(ev->used, ev->predicted, vs, sizeof vs));
}

static void summary(const watch_args *a, const vp_watch_result *r)
{
    char b1[32], b2[32], vs[96];
    if (r->exec_failed)
        fprintf(stderr, "vramplan watch: cannot run '%s': %s\n", a->cmd[0],
                strerror(r->exec_errno));
    else if (r->killed)
        fprintf(stderr, "vramplan watch: stopped the job on GPU %u after "
                        "%.1f s, before it ran out of memory\n",
                r->killed_gpu, r->seconds);
    else if (r->term_signal)
        fprintf(stderr, "vramplan watch: the job ended by signal %d after "
                        "%.1f s\n", r->term_signal, r->seconds);
    else
        fprintf(stderr, "vramplan watch: the job exited with status %d "
                        "after %.1f s\n", r->exit_code, r->seconds);
    fprintf(stderr, "vramplan watch: %" PRIu64 " samples per GPU (%.0f a "
                    "second)\n",
            r->samples, r->seconds > 0 ? (double)r->samples / r->seconds : 0);
    for (unsigned g = 0; g < r->n_gpus; g++) {
        const vp_watch_gpu *gp = &r->gpu[g];
        uint64_t pred = vp_watch_predicted(&a->cfg, gp->peak_step);
        fprintf(stderr, "  GPU %u %s: peak %s", gp->index, gp->name,
                vp_size_format(gp->peak, b1, sizeof b1));
        if (gp->peak_step)
            fprintf(stderr, " at step %" PRIu32, gp->peak_step);
        fprintf(stderr, " (%.1f s), %.1f%% of the budget %s%s\n", gp->peak_t,
                gp->budget ? 100.0 * (double)gp->peak / (double)gp->budget
                           : 0.0,
                vp_size_format(gp->budget, b2, sizeof b2),
                vs_plan(gp->peak, pred, vs, sizeof vs));
    }
}

static int write_out(const char *path, const watch_args *a,
                     const vp_watch_result *r, bool html)
{
    vp_error err;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "vramplan: error: cannot open '%s' for writing: %s\n",
                path, strerror(errno));
        return WATCH_USAGE;
    }
    vp_status st = html ? vp_watch_write_html(r, &a->cfg, a->model, f, &err)
                        : vp_watch_write_csv(r, &a->cfg, f, &err);
    if (fclose(f) != 0 && st == VP_OK)
        st = vp_error_set(&err, VP_EIO, "%s", strerror(errno));
    if (st != VP_OK) {
        fprintf(stderr, "vramplan: error: '%s': %s\n", path, err.msg);
        return WATCH_USAGE;
    }
    return -1;
}

static volatile sig_atomic_t g_cancel;

static void on_signal(int sig)
{
    (void)sig;
    g_cancel = 1;
}

int cli_watch(int argc, char **argv)
{
    watch_args a;
    vp_watch_result r;
    vp_error err;
    int rc = parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    if ((rc = predict(&a)) >= 0)
        return rc;
    vp_nvml *nvml = vp_nvml_open(NULL, &err);
    if (!nvml) {
        fprintf(stderr, "vramplan: error: %s\n", err.msg);
        return WATCH_USAGE;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    a.cfg.cancel = &g_cancel;
    vp_status st = vp_watch_run(a.cmd, &a.cfg, nvml, on_event, NULL, &r,
                                &err);
    vp_nvml_close(nvml);
    if (st != VP_OK) {
        fprintf(stderr, "vramplan: error: %s\n", err.msg);
        vp_watch_result_destroy(&r);
        return WATCH_USAGE;
    }
    summary(&a, &r);
    rc = -1;
    if (a.csv)
        rc = write_out(a.csv, &a, &r, false);
    if (rc < 0 && a.html)
        rc = write_out(a.html, &a, &r, true);
    if (rc < 0)
        rc = r.exec_failed ? WATCH_USAGE
             : r.killed    ? WATCH_STOPPED
             : r.term_signal ? 128 + r.term_signal
                             : r.exit_code;
    vp_watch_result_destroy(&r);
    return rc;
}
