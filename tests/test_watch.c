/* Tests of `vramplan watch` (src/watch.c, src/cli/watch_cmd.c) with the
 * fake NVML of tests/fake_nvml.c (VRAMPLAN_FAKE_NVML, set by make test):
 * the jobs are shell commands that write the "GPU memory in use" into the
 * file the fake reads. Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vramplan/vramplan.h"
#include "vramplan/watch.h"

#include "cli_golden.h"

#define GiB ((uint64_t)1 << 30)

static char used_file[64];

static const char *fake_nvml(void)
{
    const char *p = getenv("VRAMPLAN_FAKE_NVML");
    cr_assert(p && *p && access(p, R_OK) == 0,
              "VRAMPLAN_FAKE_NVML must name build/tests/libfake_nvml.so "
              "(make test sets it)");
    return p;
}

/* The fake's environment: 80 GiB GPUs, 1 GiB in use before the job. */
static void fake_env(int devices)
{
    char n[8];
    snprintf(used_file, sizeof used_file, "/tmp/vp-watch-%d.used",
             (int)getpid());
    unlink(used_file);
    snprintf(n, sizeof n, "%d", devices);
    setenv("FAKE_NVML_DEVICES", n, 1);
    setenv("FAKE_NVML_TOTAL", "85899345920", 1);
    setenv("FAKE_NVML_BASE", "1073741824", 1);
    setenv("FAKE_NVML_USED_FILE", used_file, 1);
    unsetenv("FAKE_NVML_FAIL");
}

static vp_nvml *open_fake(int devices)
{
    vp_error err;
    fake_env(devices);
    vp_nvml *n = vp_nvml_open(fake_nvml(), &err);
    cr_assert_not_null(n, "%s", err.msg);
    return n;
}

typedef struct log {
    int alerts, clears, kills;
    uint32_t alert_step;
    uint64_t alert_used, alert_predicted;
    size_t out_bytes;
} log_t;

static void record(const vp_watch_event *ev, void *ud)
{
    log_t *l = ud;
    switch (ev->kind) {
    case VP_WATCH_ALERT:
        l->alerts++;
        l->alert_step = ev->step;
        l->alert_used = ev->used;
        l->alert_predicted = ev->predicted;
        break;
    case VP_WATCH_CLEAR:
        l->clears++;
        break;
    case VP_WATCH_KILL:
        l->kills++;
        break;
    case VP_WATCH_OUTPUT:
        l->out_bytes += ev->len;
        break;
    default:
        break;
    }
}

/* A watched job: the fake NVML, the settings, what was seen. */
typedef struct job {
    vp_nvml *n;
    vp_watch_config c;
    log_t l;
    vp_watch_result r;
} job;

/* devices fake GPUs and a budget (0: none). */
static void job_begin(job *j, int devices, uint64_t budget)
{
    memset(j, 0, sizeof *j);
    j->n = open_fake(devices);
    vp_watch_config_init(&j->c);
    j->c.budget = budget;
}

/* Run a shell script as the job. */
static void job_run(job *j, const char *script)
{
    char *argv[] = {"sh", "-c", (char *)script, NULL};
    vp_error err;
    vp_status st = vp_watch_run(argv, &j->c, j->n, record, &j->l, &j->r, &err);
    cr_assert_eq(st, VP_OK, "%s", err.msg);
}

static void job_end(job *j)
{
    vp_watch_result_destroy(&j->r);
    vp_nvml_close(j->n);
    unlink(used_file);
}

/* A script line that sets the fake GPU's used bytes (1 GiB + n GiB). */
#define USE(n) "echo $((1073741824 + " #n " * 1073741824)) > $FAKE_NVML_USED_FILE; "

Test(watch, config_defaults_and_predicted_steps)
{
    vp_watch_config c;
    vp_watch_config_init(&c);
    cr_assert_eq(c.alert_ppm, 900000);
    cr_assert_eq(c.kill_ppm, 0);
    cr_assert(c.interval_s <= 0.05, "at least 20 samples a second");
    cr_assert_eq(vp_watch_predicted(&c, 3), 0, "no plan");
    c.predicted[0] = 10;
    c.predicted[1] = 30;
    c.predicted[2] = 20;
    c.n_predicted = 3;
    cr_assert_eq(vp_watch_predicted(&c, 1), 10);
    cr_assert_eq(vp_watch_predicted(&c, 3), 20);
    cr_assert_eq(vp_watch_predicted(&c, 99), 20, "later steps: the last");
    cr_assert_eq(vp_watch_predicted(&c, 0), 30, "unknown step: the largest");
}

Test(watch, missing_nvml_is_an_error_naming_it)
{
    vp_error err;
    cr_assert_null(vp_nvml_open("/nonexistent/libnvidia-ml.so.1", &err));
    cr_assert_eq(err.code, VP_EIO);
    cr_assert(strstr(err.msg, "/nonexistent/libnvidia-ml.so.1") != NULL,
              "%s", err.msg);
}

Test(watch, nvml_init_failure_is_reported)
{
    vp_error err;
    fake_env(1);
    setenv("FAKE_NVML_FAIL", "init", 1);
    cr_assert_null(vp_nvml_open(fake_nvml(), &err));
    cr_assert(strstr(err.msg, "nvmlInit failed: Driver Not Loaded") != NULL,
              "%s", err.msg);
}

Test(watch, nvml_memory_and_names_per_gpu)
{
    vp_nvml *n = open_fake(2);
    FILE *f = fopen(used_file, "w");
    cr_assert_not_null(f);
    fputs("123 456\n", f);
    fclose(f);
    uint64_t used, total;
    vp_error err;
    cr_assert_eq(vp_nvml_count(n), 2);
    cr_assert_eq(vp_nvml_memory(n, 1, &used, &total, &err), VP_OK);
    cr_assert_eq(used, 456);
    cr_assert_eq(total, 80 * GiB);
    char name[64];
    cr_assert_eq(vp_nvml_name(n, 0, name, sizeof name, &err), VP_OK);
    cr_assert_str_eq(name, "Fake GPU 0");
    cr_assert_eq(vp_nvml_memory(n, 2, &used, &total, &err), VP_EARG);
    vp_nvml_close(n);
    unlink(used_file);
}

Test(watch, stops_the_job_at_the_kill_threshold, .timeout = 20)
{
    job j;
    job_begin(&j, 1, 10 * GiB);
    j.c.kill_ppm = 950000; /* 9.5 GiB */
    job_run(&j, USE(4) "sleep 0.3; " USE(8) "sleep 0.3; " USE(10) "sleep 30");
    cr_assert(j.r.killed);
    cr_assert_eq(j.r.term_signal, SIGTERM);
    cr_assert_lt(j.r.seconds, 5.0, "stopped at once, not after the sleep");
    cr_assert_eq(j.r.gpu[0].peak, 10 * GiB, "the job's bytes: less the 1 GiB "
                                           "in use before");
    cr_assert_eq(j.r.gpu[0].before, GiB);
    cr_assert_eq(j.l.alerts, 1, "8 GiB is under 90 %%, 10 GiB over");
    cr_assert_eq(j.l.kills, 1);
    job_end(&j);
}

Test(watch, alert_clears_and_exit_status_passes_through, .timeout = 20)
{
    job j;
    job_begin(&j, 1, 10 * GiB);
    job_run(&j, USE(9) "sleep 0.3; " USE(2) "sleep 0.3; exit 3");
    cr_assert_not(j.r.killed);
    cr_assert_eq(j.r.exit_code, 3);
    cr_assert_eq(j.l.alerts, 1);
    cr_assert_eq(j.l.clears, 1);
    cr_assert_eq(j.r.gpu[0].alerts, 1);
    cr_assert_gt(j.r.samples / j.r.seconds, 20.0, "at least 20 Hz");
    job_end(&j);
}

Test(watch, steps_come_from_the_output_and_meet_the_plan, .timeout = 20)
{
    job j;
    job_begin(&j, 1, 10 * GiB);
    j.c.predicted[0] = 4 * GiB;
    j.c.predicted[1] = 8 * GiB;
    j.c.n_predicted = 2;
    job_run(&j, "echo 'epoch 0 Step: 1 loss 3.2'; " USE(4) "sleep 0.3; "
                "echo 'step=2'; sleep 0.1; " USE(9) "sleep 0.3");
    cr_assert_eq(j.r.last_step, 2);
    cr_assert_eq(j.l.alert_step, 2);
    cr_assert_eq(j.l.alert_used, 9 * GiB);
    cr_assert_eq(j.l.alert_predicted, 8 * GiB, "the plan at step 2");
    cr_assert_eq(j.r.gpu[0].peak_step, 2);
    cr_assert_gt(j.l.out_bytes, 20, "the output passed through");
    job_end(&j);
}

Test(watch, a_command_that_cannot_start)
{
    job j;
    job_begin(&j, 1, 0);
    char *argv[] = {"/nonexistent/train", NULL};
    vp_error err;
    cr_assert_eq(vp_watch_run(argv, &j.c, j.n, NULL, NULL, &j.r, &err),
                 VP_OK);
    cr_assert(j.r.exec_failed);
    cr_assert_eq(j.r.exec_errno, ENOENT);
    job_end(&j);
}

Test(watch, cancel_stops_the_job, .timeout = 20)
{
    static volatile sig_atomic_t cancel = 1;
    job j;
    job_begin(&j, 1, 0);
    j.c.cancel = &cancel;
    job_run(&j, "sleep 30");
    cr_assert(j.r.cancelled);
    cr_assert_lt(j.r.seconds, 5.0);
    job_end(&j);
}

Test(watch, bad_settings_are_refused)
{
    job j;
    job_begin(&j, 1, 0);
    char *argv[] = {"true", NULL};
    vp_error err;
    j.c.interval_s = 0;
    cr_assert_eq(vp_watch_run(argv, &j.c, j.n, NULL, NULL, &j.r, &err),
                 VP_EARG);
    vp_watch_config_init(&j.c);
    j.c.step_pattern = "(";
    cr_assert_eq(vp_watch_run(argv, &j.c, j.n, NULL, NULL, &j.r, &err),
                 VP_EARG);
    vp_watch_config_init(&j.c);
    j.c.gpus[0] = 5;
    j.c.n_gpus = 1;
    cr_assert_eq(vp_watch_run(argv, &j.c, j.n, NULL, NULL, &j.r, &err),
                 VP_EARG);
    job_end(&j);
}

Test(watch, csv_and_html_of_the_samples, .timeout = 20)
{
    job j;
    job_begin(&j, 2, 10 * GiB);
    j.c.predicted[0] = 3 * GiB;
    j.c.n_predicted = 1;
    job_run(&j, "echo step 1; echo '3221225472 2147483648' > "
                "$FAKE_NVML_USED_FILE; sleep 1");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    vp_error err;
    cr_assert_eq(vp_watch_write_csv(&j.r, &j.c, f, &err), VP_OK);
    fclose(f);
    cr_assert(strncmp(buf, "t_s,gpu,step,used,predicted,budget\n", 35) == 0);
    cr_assert(strstr(buf, ",0,1,2147483648,3221225472,10737418240\n"),
              "GPU 0: 2 GiB of the job at step 1:\n%s", buf);
    cr_assert(strstr(buf, ",1,1,1073741824,3221225472,10737418240\n"),
              "GPU 1: 1 GiB:\n%s", buf);
    free(buf);
    f = open_memstream(&buf, &len);
    cr_assert_eq(vp_watch_write_html(&j.r, &j.c, "gpt2 <small>", f, &err),
                 VP_OK);
    fclose(f);
    cr_assert(strstr(buf, "<svg") && strstr(buf, "GPU 1 measured"));
    cr_assert(strstr(buf, "gpt2 &lt;small&gt;"), "escaped title");
    cr_assert(!strstr(buf, "<script") && !strstr(buf, "src=") &&
                  !strstr(buf, "href="),
              "self-contained: nothing to fetch");
    free(buf);
    job_end(&j);
}

/* ---- the command ------------------------------------------------------ */

Test(watch_cli, kills_and_exits_1_with_the_plan, .timeout = 60)
{
    fake_env(1);
    setenv("VRAMPLAN_NVML_LIB", fake_nvml(), 1);
    cli_run r;
    cli_exec((const char *const[]){
                 "watch", "--model", "models/mlp10.yaml", "--budget", "4GiB",
                 "--kill-at", "95%", "--", "sh", "-c",
                 "echo step 1; " USE(2) "sleep 0.3; echo step 2; " USE(4)
                 "sleep 30",
                 NULL},
             &r);
    cr_assert_eq(r.status, 1, "stderr:\n%s", r.err);
    cr_assert(strstr(r.out, "step 1\nstep 2\n"), "the job's output: %s",
              r.out);
    cr_assert(strstr(r.err, "vramplan watch: plan: mlp10"), "%s", r.err);
    cr_assert(strstr(r.err, "STOPPING THE JOB: GPU 0 at 100.0% of the "
                            "budget (4.00 GiB of 4.00 GiB) at step 2"),
              "%s", r.err);
    cr_assert(strstr(r.err, "above the plan"), "%s", r.err);
    cli_run_free(&r);
    unlink(used_file);
}

Test(watch_cli, needs_a_command)
{
    GOLDEN("watch_no_command", 2, "watch", "--budget", "1GiB");
}

Test(watch_cli, bad_share)
{
    GOLDEN("watch_bad_alert", 2, "watch", "--alert", "120%", "--", "true");
}

Test(watch_cli, setup_without_model)
{
    GOLDEN("watch_setup_without_model", 2, "watch", "--batch", "8", "--",
           "true");
}

Test(watch_cli, without_nvml)
{
    setenv("VRAMPLAN_NVML_LIB", "/nonexistent/libnvidia-ml.so.1", 1);
    GOLDEN("watch_no_nvml", 2, "watch", "--", "true");
}
