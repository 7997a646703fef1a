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

enum {
    O_MODEL = CLI_O__SETUP, O_GPU, O_GPU_DIR, O_ALERT, O_KILL_AT, O_INTERVAL,
    O_GRACE, O_DEVICE, O_STEP_PATTERN, O_CSV, O_HTML
};

#define STR(i, n, m, h)                                                     \
    {.id = i, .name = n, .metavar = m, .type = CLI_ARG_STRING, .help = h}
#define SECONDS(i, n, lo, hi, h)                                            \
    {.id = i, .name = n, .metavar = "SECONDS", .type = CLI_ARG_DOUBLE,      \
     .dmin = lo, .dmax = hi, .help = h}

static const cli_opt OPTS[] = {
    STR(O_MODEL, "model", "MODEL",
        "the model the job trains (name or file); the setup options below "
        "describe it"),
    CLI_ROW_BATCH,
    CLI_ROW_SEQ,
    CLI_ROW_PRECISION("as for estimate (default fp32)"),
    CLI_ROW_OPTIMIZER("as for estimate (default adamw)"),
    CLI_ROW_CHECKPOINT("as for estimate (default none)"),
    CLI_ROW_ACCUM,
    CLI_ROW_STEPS("training steps of the plan (default "
                  VP_TEXT(VP_DEFAULT_STEPS) ")"),
    STR(O_GPU, "gpu", "NAME", "GPU profile for the CUDA context of the plan"),
    CLI_ROW_GPU_DIR(O_GPU_DIR),
    CLI_ROW_BUDGET("bytes the job may take on a GPU (default: the GPU's "
                   "memory less what was in use before)"),
    STR(O_ALERT, "alert", "PCT",
        "alert threshold, e.g. 90% or 0.9 (default 90%)"),
    STR(O_KILL_AT, "kill-at", "PCT",
        "stop the job at this share of the budget (default: never)"),
    SECONDS(O_INTERVAL, "interval", 0.001, 60.0,
            "between samples (default 0.025)"),
    SECONDS(O_GRACE, "grace", 0.0, 3600.0, "SIGTERM to SIGKILL (default 5)"),
    STR(O_DEVICE, "device", "N,...",
        "NVML indices of the GPUs (default: all)"),
    STR(O_STEP_PATTERN, "step-pattern", "RE",
        "'[Ss]tep[ :=#]*([0-9]+)' by default: an extended regex over the "
        "job's output lines whose first group is the step"),
    STR(O_CSV, "csv", "FILE",
        "write the samples: t_s,gpu,step,used,predicted,budget"),
    STR(O_HTML, "html", "FILE", "write a page of measured against predicted"),
    CLI_HELP_ROW,
};

typedef struct watch_args {
    cli_args args;
    const char *model;
    const char *gpu, *csv, *html, *checkpoint;
    vp_setup setup;
    vp_watch_config cfg;
    char **cmd;
} watch_args;

static void watch_help(FILE *f);

static const cli_spec SPEC = {OPTS, sizeof OPTS / sizeof OPTS[0], 0, 0,
                              "put the command after --", true, watch_help};

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
        "Options:\n", f);
    cli_opts_help(f, &SPEC);
    fputs(
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

/* The options of the watch itself (budget, shares, sampling, outputs). */
static int apply_watch(const cli_val *v, watch_args *a)
{
    vp_watch_config *c = &a->cfg;

    if (v[CLI_O_BUDGET].given && v[CLI_O_BUDGET].u == 0)
        return bad("--budget", v[CLI_O_BUDGET].text,
                   "a size above 0 bytes, e.g. 70GiB");
    c->budget = v[CLI_O_BUDGET].given ? v[CLI_O_BUDGET].u : c->budget;
    if (v[O_ALERT].given && !parse_share(v[O_ALERT].text, &c->alert_ppm))
        return bad("--alert", v[O_ALERT].text, "a share such as 90% or 0.9");
    if (v[O_KILL_AT].given && !parse_share(v[O_KILL_AT].text, &c->kill_ppm))
        return bad("--kill-at", v[O_KILL_AT].text,
                   "a share such as 98% or 0.98");
    if (v[O_DEVICE].given && !parse_devices(v[O_DEVICE].text, c))
        return bad("--device", v[O_DEVICE].text,
                   "GPU indices such as 0 or 0,1");
    c->interval_s = v[O_INTERVAL].given ? v[O_INTERVAL].d : c->interval_s;
    c->grace_s = v[O_GRACE].given ? v[O_GRACE].d : c->grace_s;
    if (v[O_STEP_PATTERN].given)
        c->step_pattern = v[O_STEP_PATTERN].text;
    a->csv = v[O_CSV].given ? v[O_CSV].text : NULL;
    a->html = v[O_HTML].given ? v[O_HTML].text : NULL;
    return -1;
}

static int parse(int argc, char **argv, watch_args *a)
{
    const cli_val *v = a->args.v;
    int rc;

    memset(a, 0, sizeof *a);
    vp_setup_init(&a->setup);
    vp_watch_config_init(&a->cfg);
    if ((rc = cli_args_parse(&SPEC, argc, argv, &a->args)) >= 0 ||
        (rc = cli_setup_common(v, false, &a->setup)) >= 0 ||
        (rc = apply_watch(v, a)) >= 0)
        return rc;
    if (v[O_GPU_DIR].given)
        cli_set_gpu_dir(v[O_GPU_DIR].text);
    a->model = v[O_MODEL].given ? v[O_MODEL].text : NULL;
    a->gpu = v[O_GPU].given ? v[O_GPU].text : NULL;
    a->checkpoint = v[CLI_O_CHECKPOINT].given ? v[CLI_O_CHECKPOINT].text
                                              : NULL;
    if (a->args.rest == NULL || a->args.n_rest == 0)
        return cli_usage_error("watch needs a command after --");
    a->cmd = a->args.rest;
    bool setup = false;
    for (int k = 0; k < CLI_O__SETUP; k++)
        setup |= v[k].given && k != CLI_O_BUDGET;
    if (setup && !a->model)
        return cli_usage_error("the setup options describe --model: give "
                               "--model MODEL");
    return -1;
}

/* The plan's device bytes by the end of each simulated step, into cfg. */
static int simulate_plan(watch_args *a, const vp_model *m)
{
    vp_graph *g;
    bool *ck = NULL;
    vp_estimate e;
    vp_error err;
    char b[32];
    int rc = -1;

    if ((g = vp_graph_build(m, a->setup.batch, a->setup.seq, &err)) == NULL)
        return cli_report(&err, NULL);
    if (a->checkpoint != NULL &&
        (rc = cli_select_segments(g, a->checkpoint, "--checkpoint", &ck)) <
            0) {
        a->setup.checkpoint = ck;
        a->setup.n_checkpoint = vp_graph_segment_count(g);
    }
    if (rc < 0 && vp_simulate(g, &a->setup, &e, NULL, NULL, &err) != VP_OK)
        rc = cli_report(&err, NULL);
    if (rc < 0) {
        uint64_t most = 0;
        for (uint32_t k = 0; k < e.steps && k < VP_WATCH_MAX_STEPS; k++) {
            most = e.step[k].reserved > most ? e.step[k].reserved : most;
            a->cfg.predicted[k] = most + a->setup.context_bytes;
        }
        a->cfg.n_predicted = e.steps;
        fprintf(stderr, "vramplan watch: plan: %s, batch %" PRIu64
                        ", %s: %s on the GPU (reserved + CUDA context)\n",
                vp_model_name(m), a->setup.batch,
                vp_precision_name(a->setup.precision),
                vp_size_format(vp_watch_predicted(&a->cfg, 0), b, sizeof b));
    }
    a->setup.checkpoint = NULL;
    a->setup.n_checkpoint = 0;
    free(ck);
    vp_graph_free(g);
    return rc;
}

/* The plan: --gpu's CUDA context, and with --model the simulated steps. */
static int predict(watch_args *a)
{
    vp_hw hw;
    int rc = -1;

    if (a->gpu) {
        if ((rc = cli_gpu_hw(a->gpu, &hw)) >= 0)
            return rc;
        a->setup.context_bytes = hw.context;
    }
    if (!a->model)
        return -1;
    vp_model *m = cli_model_load(a->model, &rc);
    if (m == NULL)
        return rc;
    rc = simulate_plan(a, m);
    vp_model_free(m);
    return rc;
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
    if (!f)
        return cli_fail("cannot open '%s' for writing: %s", path,
                        strerror(errno));
    vp_status st = html ? vp_watch_write_html(r, &a->cfg, a->model, f, &err)
                        : vp_watch_write_csv(r, &a->cfg, f, &err);
    if (fclose(f) != 0 && st == VP_OK)
        st = vp_error_set(&err, VP_EIO, "%s", strerror(errno));
    if (st != VP_OK)
        return cli_fail("'%s': %s", path, err.msg);
    return -1;
}

static volatile sig_atomic_t g_cancel;

static void on_signal(int sig)
{
    (void)sig;
    g_cancel = 1;
}

/* Run the job under NVML; -1 with *r filled (destroy it), or the exit
 * status. */
static int run_job(watch_args *a, vp_watch_result *r)
{
    vp_error err;
    vp_nvml *nvml = vp_nvml_open(NULL, &err);

    memset(r, 0, sizeof *r);
    if (!nvml)
        return cli_fail("%s", err.msg);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    a->cfg.cancel = &g_cancel;
    vp_status st = vp_watch_run(a->cmd, &a->cfg, nvml, on_event, NULL, r,
                                &err);
    vp_nvml_close(nvml);
    if (st != VP_OK) {
        vp_watch_result_destroy(r);
        return cli_fail("%s", err.msg);
    }
    return -1;
}

int cli_watch(int argc, char **argv)
{
    watch_args a;
    vp_watch_result r;
    int rc = parse(argc, argv, &a);

    if (rc < 0)
        rc = predict(&a);
    if (rc < 0 && (rc = run_job(&a, &r)) < 0) {
        summary(&a, &r);
        if (a.csv)
            rc = write_out(a.csv, &a, &r, false);
        if (rc < 0 && a.html)
            rc = write_out(a.html, &a, &r, true);
        if (rc < 0)
            rc = r.exec_failed   ? CLI_USAGE
                 : r.killed      ? CLI_NOFIT
                 : r.term_signal ? 128 + r.term_signal
                                 : r.exit_code;
        vp_watch_result_destroy(&r);
    }
    cli_args_free(&a.args);
    return rc;
}
