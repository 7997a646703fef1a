/* The real-GPU probe without a GPU: the bracketing search against a fake
 * fits-function, the out-of-memory detector, "{batch}" substitution, the
 * trial runner against fake commands (the scripts in tests/data/probe:
 * PyTorch-like failures above a threshold, hangs, crashes, an OOM printed
 * on stdout only, children that would outlive their parent) and the probe
 * command's output. Timeouts are kept near a second. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vramplan/probe.h"
#include "vramplan/vramplan.h"

#define DATA "tests/data/probe/"

/* ------------------------------------------------------------------ */
/* A fake fits-function                                                */
/* ------------------------------------------------------------------ */

typedef struct fake {
    uint64_t limit;          /* batches <= limit fit                  */
    uint64_t error_at;       /* this batch fails otherwise (0: none)  */
    vp_trial_outcome error_outcome;
    uint64_t min, max;       /* every batch tried must lie in here    */
    uint32_t calls;
    uint64_t tried[256];
    bool harness_fails;
} fake;

static vp_status fake_try(uint64_t batch, vp_trial_outcome *outcome,
                          double *seconds, void *ud, vp_error *err)
{
    fake *f = ud;

    cr_assert_geq(batch, f->min, "tried %" PRIu64 " below min", batch);
    cr_assert_leq(batch, f->max, "tried %" PRIu64 " above max", batch);
    for (uint32_t i = 0; i < f->calls && i < 256; i++)
        cr_assert_neq(f->tried[i], batch, "batch %" PRIu64 " tried twice",
                      batch);
    if (f->calls < 256)
        f->tried[f->calls] = batch;
    f->calls++;
    if (f->harness_fails)
        return vp_error_set(err, VP_EIO, "harness broke");
    *seconds = 0.5;
    if (f->error_at && batch == f->error_at)
        *outcome = f->error_outcome;
    else
        *outcome = batch <= f->limit ? VP_TRIAL_OK : VP_TRIAL_OOM;
    return VP_OK;
}

static void fake_search(uint64_t limit, uint64_t predicted, uint64_t min,
                        uint64_t max, vp_probe_result *r, fake *f)
{
    vp_probe_config c;
    vp_error err;

    memset(f, 0, sizeof *f);
    f->limit = limit;
    f->min = min;
    f->max = max;
    vp_probe_config_init(&c);
    c.min = min;
    c.max = max;
    c.predicted = predicted;
    cr_assert_eq(vp_probe_search(&c, fake_try, f, NULL, NULL, r, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_eq(r->n_trials, f->calls);
}

/* The answer the search must give for a monotone fits-function. */
static void expect_answer(const vp_probe_result *r, uint64_t limit,
                          uint64_t min, uint64_t max)
{
    uint64_t want = limit < min ? 0 : limit > max ? max : limit;

    cr_assert_eq(r->max_batch, want, "limit %" PRIu64 ": found %" PRIu64,
                 limit, r->max_batch);
    cr_assert(r->complete);
    cr_assert_eq(r->stop, VP_TRIAL_OK);
    if (want == 0)
        cr_assert_eq(r->fail_batch, min);
    else if (want < max)
        cr_assert_eq(r->fail_batch, want + 1);
}

static uint32_t log2_ceil(uint64_t v)
{
    uint32_t k = 0;

    while (((uint64_t)1 << k) < v)
        k++;
    return k;
}

Test(probe_search, doubling_then_bisection_finds_every_threshold)
{
    for (uint64_t limit = 0; limit <= 300; limit++) {
        vp_probe_result r;
        fake f;

        fake_search(limit, 0, 1, 1 << 20, &r, &f);
        expect_answer(&r, limit, 1, 1 << 20);
        /* doubling to the first failure, then a bisection of its octave */
        cr_assert_leq(r.n_trials, 2 * log2_ceil(limit + 2) + 1,
                      "limit %" PRIu64 ": %zu trials", limit, r.n_trials);
        vp_probe_result_destroy(&r);
    }
}

Test(probe_search, doubling_matches_collect_py_counts)
{
    /* collect.py's search: 1, 2, 4... to the first failure, then bisect;
     * gpt2-small found 10 in 8 probes, resnet50 180 in 16 */
    vp_probe_result r;
    fake f;

    fake_search(10, 0, 1, 1 << 20, &r, &f);
    cr_assert_eq(r.n_trials, 8);
    vp_probe_result_destroy(&r);
    fake_search(180, 0, 1, 1 << 20, &r, &f);
    cr_assert_eq(r.n_trials, 16);
    vp_probe_result_destroy(&r);
}

Test(probe_search, exact_prediction_takes_two_trials)
{
    vp_probe_result r;
    fake f;

    fake_search(37, 37, 1, 1000, &r, &f);
    expect_answer(&r, 37, 1, 1000);
    cr_assert_eq(r.n_trials, 2);
    cr_assert_eq(r.trials[0].batch, 37);
    cr_assert_eq(r.trials[0].outcome, VP_TRIAL_OK);
    cr_assert_eq(r.trials[1].batch, 38);
    cr_assert_eq(r.trials[1].outcome, VP_TRIAL_OOM);
    cr_assert_float_eq(r.trials[1].seconds, 0.5, 1e-12);
    vp_probe_result_destroy(&r);
}

Test(probe_search, prediction_one_too_high_takes_two_trials)
{
    vp_probe_result r;
    fake f;

    fake_search(37, 38, 1, 1000, &r, &f);
    expect_answer(&r, 37, 1, 1000);
    cr_assert_eq(r.n_trials, 2);
    cr_assert_eq(r.trials[0].batch, 38);
    cr_assert_eq(r.trials[1].batch, 37);
    vp_probe_result_destroy(&r);
}

Test(probe_search, widens_geometrically_from_a_wrong_prediction)
{
    vp_probe_result r;
    fake f;

    /* 100 fits, 130 predicted: 130, 129, 127, 123, 115, 99 (ok), then
     * bisect (99, 115) */
    fake_search(100, 130, 1, 1000, &r, &f);
    expect_answer(&r, 100, 1, 1000);
    uint64_t want[] = {130, 129, 127, 123, 115, 99};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert_eq(r.trials[i].batch, want[i], "trial %zu", i);
    vp_probe_result_destroy(&r);

    /* 100 fits, 90 predicted: 90, 91, 93, 97, 105 (oom), then bisect */
    fake_search(100, 90, 1, 1000, &r, &f);
    expect_answer(&r, 100, 1, 1000);
    uint64_t up[] = {90, 91, 93, 97, 105};
    for (size_t i = 0; i < sizeof up / sizeof up[0]; i++)
        cr_assert_eq(r.trials[i].batch, up[i], "trial %zu", i);
    vp_probe_result_destroy(&r);
}

Test(probe_search, any_prediction_finds_the_threshold_in_log_trials)
{
    for (uint64_t limit = 0; limit <= 130; limit++)
        for (uint64_t p = 1; p <= 160; p++) {
            vp_probe_result r;
            fake f;
            uint64_t off = p > limit ? p - limit : limit - p;

            fake_search(limit, p, 1, 150, &r, &f);
            expect_answer(&r, limit, 1, 150);
            cr_assert_leq(r.n_trials, 2 * log2_ceil(off + 1) + 2,
                          "limit %" PRIu64 " predicted %" PRIu64
                          ": %zu trials", limit, p, r.n_trials);
            vp_probe_result_destroy(&r);
        }
}

Test(probe_search, stays_within_min_and_max)
{
    vp_probe_result r;
    fake f;

    fake_search(1000, 0, 5, 40, &r, &f); /* everything fits: max */
    expect_answer(&r, 1000, 5, 40);
    cr_assert_eq(r.fail_batch, 0);
    cr_assert_eq(r.trials[0].batch, 5);
    vp_probe_result_destroy(&r);

    fake_search(3, 0, 5, 40, &r, &f); /* nothing fits: min fails */
    expect_answer(&r, 3, 5, 40);
    cr_assert_eq(r.n_trials, 1);
    cr_assert_eq(r.recommended, 0);
    vp_probe_result_destroy(&r);

    fake_search(3, 30, 5, 40, &r, &f); /* from a prediction, down to min */
    expect_answer(&r, 3, 5, 40);
    cr_assert_eq(r.trials[r.n_trials - 1].batch, 5);
    vp_probe_result_destroy(&r);

    fake_search(17, 500, 5, 40, &r, &f); /* prediction clamped to max */
    expect_answer(&r, 17, 5, 40);
    cr_assert_eq(r.trials[0].batch, 40);
    vp_probe_result_destroy(&r);
}

static void stop_case(vp_trial_outcome outcome)
{
    vp_probe_config c;
    vp_probe_result r;
    vp_error err;
    fake f;

    memset(&f, 0, sizeof f);
    f.limit = 100;
    f.error_at = 16;
    f.error_outcome = outcome;
    f.min = 1;
    f.max = 1 << 20;
    vp_probe_config_init(&c);
    cr_assert_eq(vp_probe_search(&c, fake_try, &f, NULL, NULL, &r, &err),
                 VP_OK);
    cr_assert_eq(r.n_trials, 5); /* 1 2 4 8 16 */
    cr_assert_eq(r.trials[4].outcome, outcome);
    cr_assert_eq(r.stop, outcome);
    cr_assert_not(r.complete);
    cr_assert_eq(r.max_batch, 8);
    vp_probe_result_destroy(&r);
}

Test(probe_search, stops_at_an_error)
{
    stop_case(VP_TRIAL_ERROR);
}

Test(probe_search, stops_at_a_timeout)
{
    stop_case(VP_TRIAL_TIMEOUT);
}

Test(probe_search, stops_when_cancelled)
{
    stop_case(VP_TRIAL_CANCELLED);
}

Test(probe_search, max_trials_ends_the_search_incomplete)
{
    vp_probe_config c;
    vp_probe_result r;
    vp_error err;
    fake f;

    memset(&f, 0, sizeof f);
    f.limit = 1000;
    f.min = 1;
    f.max = 1 << 20;
    vp_probe_config_init(&c);
    c.max_trials = 4;
    cr_assert_eq(vp_probe_search(&c, fake_try, &f, NULL, NULL, &r, &err),
                 VP_OK);
    cr_assert_eq(r.n_trials, 4);
    cr_assert_eq(r.max_batch, 8);
    cr_assert_not(r.complete);
    cr_assert_eq(r.stop, VP_TRIAL_OK);
    vp_probe_result_destroy(&r);
}

Test(probe_search, harness_error_is_returned)
{
    vp_probe_config c;
    vp_probe_result r;
    vp_error err;
    fake f;

    memset(&f, 0, sizeof f);
    f.max = 1 << 20;
    f.min = 1;
    f.harness_fails = true;
    vp_probe_config_init(&c);
    cr_assert_eq(vp_probe_search(&c, fake_try, &f, NULL, NULL, &r, &err),
                 VP_EIO);
    cr_assert_str_eq(err.msg, "harness broke");
    cr_assert_eq(r.n_trials, 0);
    vp_probe_result_destroy(&r);
}

Test(probe_search, rejects_bad_configs)
{
    vp_probe_config c;
    vp_probe_result r;
    vp_error err;
    fake f;

    memset(&f, 0, sizeof f);
    vp_probe_config_init(&c);
    c.min = 0;
    cr_assert_eq(vp_probe_search(&c, fake_try, &f, NULL, NULL, &r, &err),
                 VP_EARG);
    vp_probe_config_init(&c);
    c.min = 10;
    c.max = 9;
    cr_assert_eq(vp_probe_search(&c, fake_try, &f, NULL, NULL, &r, &err),
                 VP_EARG);
    vp_probe_config_init(&c);
    c.margin_ppm = 1000000;
    cr_assert_eq(vp_probe_search(&c, fake_try, &f, NULL, NULL, &r, &err),
                 VP_EARG);
    cr_assert_eq(f.calls, 0);
}

typedef struct seen {
    uint32_t before, after;
    uint64_t lo, hi;
} seen;

static void on_progress(const vp_probe_progress *p, void *ud)
{
    seen *s = ud;

    if (p->done) {
        s->after++;
        cr_assert_eq(p->n, s->after);
        s->lo = p->lo;
        s->hi = p->hi;
    } else {
        s->before++;
        cr_assert_eq(p->n, s->before);
        cr_assert_eq(p->lo, s->lo, "the bracket before a trial is the one "
                     "after the last");
        cr_assert_eq(p->hi, s->hi);
    }
}

Test(probe_search, progress_reports_the_bracket)
{
    vp_probe_config c;
    vp_probe_result r;
    vp_error err;
    seen s = {0, 0, 0, 0};
    fake f;

    memset(&f, 0, sizeof f);
    f.limit = 21;
    f.min = 1;
    f.max = 1 << 20;
    vp_probe_config_init(&c);
    cr_assert_eq(vp_probe_search(&c, fake_try, &f, on_progress, &s, &r,
                                 &err),
                 VP_OK);
    cr_assert_eq(s.before, r.n_trials);
    cr_assert_eq(s.after, r.n_trials);
    cr_assert_eq(s.lo, 21);
    cr_assert_eq(s.hi, 22);
    vp_probe_result_destroy(&r);
}

Test(probe_search, recommended_is_floor_of_the_margin)
{
    cr_assert_eq(vp_probe_recommended(100, 50000), 95);
    cr_assert_eq(vp_probe_recommended(10, 50000), 9);
    cr_assert_eq(vp_probe_recommended(180, 50000), 171);
    cr_assert_eq(vp_probe_recommended(9984, 50000), 9484);
    cr_assert_eq(vp_probe_recommended(20, 0), 20);
    cr_assert_eq(vp_probe_recommended(1, 50000), 1);  /* never 0 */
    cr_assert_eq(vp_probe_recommended(0, 50000), 0);
    cr_assert_eq(vp_probe_recommended(1000, 100000), 900); /* exact */
    cr_assert_eq(vp_probe_recommended(UINT64_MAX, 0), UINT64_MAX);
    cr_assert_eq(vp_probe_recommended(UINT64_MAX, 500000),
                 UINT64_MAX / 2);
}

/* ------------------------------------------------------------------ */
/* Out-of-memory messages and arguments                                */
/* ------------------------------------------------------------------ */

static bool oom(const char *s)
{
    return vp_probe_oom_text(s, strlen(s));
}

Test(probe_oom, matches_pytorch_and_cuda_messages)
{
    cr_assert(oom("torch.OutOfMemoryError: CUDA out of memory. Tried to "
                  "allocate 2.00 GiB."));
    cr_assert(oom("Traceback...\ntorch.cuda.OutOfMemoryError: boom\n"));
    cr_assert(oom("RuntimeError: CUDA error: out of memory"));
    cr_assert(oom("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when "
                  "calling `cublasCreate(handle)`"));
    cr_assert(oom("RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. "
                  "This error may appear if you passed in a non-contiguous "
                  "input."));
    cr_assert(oom("cudaMalloc: cudaErrorMemoryAllocation"));
    cr_assert(oom("CUDA_ERROR_OUT_OF_MEMORY"));
    cr_assert(oom("terminate called after throwing an instance of "
                  "'c10::OutOfMemoryError'"));
    cr_assert(oom("XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
                  "trying to allocate 17179869184 bytes."));
    cr_assert(oom("DefaultCPUAllocator: can't allocate memory: you tried"));
    cr_assert(oom("HIP out of memory. Tried to allocate 2.00 GiB"));
    cr_assert(oom("50%|#####|\rtorch.OutOfMemoryError: CUDA out of memory."));
}

Test(probe_oom, ignores_other_failures)
{
    cr_assert_not(oom(""));
    cr_assert_not(oom("ValueError: unknown optimizer 'adamx'"));
    cr_assert_not(oom("RuntimeError: CUDA error: device-side assert "
                      "triggered"));
    cr_assert_not(oom("Killed"));
    cr_assert_not(oom("OSError: [Errno 12] Cannot allocate memory"));
    /* "CUDA" and "out of memory" on different lines are not one message */
    cr_assert_not(oom("CUDA available: True\nworker ran out of memory\n"));
    cr_assert_not(oom("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"));
}

Test(probe_oom, finds_the_message_in_long_files)
{
    char path[] = "/tmp/vp-probe-oom-XXXXXX";
    int fd = mkstemp(path);
    FILE *f;

    cr_assert_geq(fd, 0);
    f = fdopen(fd, "w");
    cr_assert_not_null(f);
    /* 300 KB of one line (a progress bar without newlines), then the
     * message on that same line, past several read blocks */
    for (int i = 0; i < 30000; i++)
        fputs("\r12% |##", f);
    fputs("torch.OutOfMemoryError: CUDA out of memory.", f);
    fclose(f);
    cr_assert(vp_probe_oom_file(path));

    f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 20000; i++)
        fputs("no problem on this line, only text that is long enough\n", f);
    fclose(f);
    cr_assert_not(vp_probe_oom_file(path));
    /* a message split over two lines is not one */
    f = fopen(path, "a");
    fputs("CUDA\nout of memory\n", f);
    fclose(f);
    cr_assert_not(vp_probe_oom_file(path));
    f = fopen(path, "a");
    fputs("CUDA error: out of memory\n", f);
    fclose(f);
    cr_assert(vp_probe_oom_file(path));
    unlink(path);
    cr_assert_not(vp_probe_oom_file(path)); /* unreadable: no */
}

Test(probe_args, replaces_every_batch_mark)
{
    char *tmpl[] = {"python3", "train.py", "--bs={batch}", "{batch}x{batch}",
                    "{batch", "plain"};
    vp_error err;
    char **argv = vp_probe_argv_format(tmpl, 6, 128, &err);

    cr_assert_not_null(argv);
    cr_assert_str_eq(argv[0], "python3");
    cr_assert_str_eq(argv[2], "--bs=128");
    cr_assert_str_eq(argv[3], "128x128");
    cr_assert_str_eq(argv[4], "{batch");
    cr_assert_str_eq(argv[5], "plain");
    cr_assert_null(argv[6]);
    vp_probe_argv_free(argv);
    argv = vp_probe_argv_format(tmpl, 3, UINT64_MAX, &err);
    cr_assert_str_eq(argv[2], "--bs=18446744073709551615");
    vp_probe_argv_free(argv);
    vp_probe_argv_free(NULL);
}

Test(probe_args, knows_whether_a_batch_mark_is_there)
{
    char *with[] = {"train", "--batch", "{batch}"};
    char *without[] = {"train", "--batch", "{BATCH}", "{ batch }"};

    cr_assert(vp_probe_argv_has_batch(with, 3));
    cr_assert_not(vp_probe_argv_has_batch(without, 4));
    cr_assert_not(vp_probe_argv_has_batch(with, 0));
}

Test(probe_oom, outcome_names)
{
    cr_assert_str_eq(vp_trial_outcome_name(VP_TRIAL_OK), "ok");
    cr_assert_str_eq(vp_trial_outcome_name(VP_TRIAL_OOM), "oom");
    cr_assert_str_eq(vp_trial_outcome_name(VP_TRIAL_ERROR), "error");
    cr_assert_str_eq(vp_trial_outcome_name(VP_TRIAL_TIMEOUT), "timeout");
    cr_assert_str_eq(vp_trial_outcome_name((vp_trial_outcome)99), "?");
}

/* ------------------------------------------------------------------ */
/* Running fake commands                                               */
/* ------------------------------------------------------------------ */

static char g_dir[64];

static void make_dir(void)
{
    vp_error err;

    cr_assert_eq(vp_probe_log_dir_new(g_dir, sizeof g_dir, &err), VP_OK,
                 "%s", err.msg);
}

static void remove_dir(void)
{
    char cmd[128];

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_assert_eq(system(cmd), 0);
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static vp_exec_result run_cmd(char **argv, double timeout, double grace)
{
    vp_exec_config c;
    vp_exec_result r;
    vp_error err;

    vp_exec_config_init(&c);
    c.log_dir = g_dir;
    c.log_name = "t";
    c.timeout_s = timeout;
    c.grace_s = grace;
    cr_assert_eq(vp_probe_exec(argv, &c, &r, &err), VP_OK, "%s", err.msg);
    return r;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    static char buf[65536];
    size_t n;

    cr_assert_not_null(f, "cannot open %s", path);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* No child of this process is left, zombie or not. */
static void assert_no_children(void)
{
    int st;

    cr_assert_eq(waitpid(-1, &st, WNOHANG), -1, "a child was left");
    cr_assert_eq(errno, ECHILD);
}

/* Whether pid is gone (or a zombie nobody reaped yet: dead). */
static bool dead(pid_t pid)
{
    char path[64], state = '?';
    FILE *f;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return kill(pid, 0) != 0 && errno == ESRCH;
    if (fscanf(f, "%*d %*s %c", &state) != 1)
        state = '?';
    fclose(f);
    return state == 'Z' || state == 'X';
}

static bool dies_within(pid_t pid, double seconds)
{
    double end = now_s() + seconds;

    while (now_s() < end) {
        if (dead(pid))
            return true;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return dead(pid);
}

static pid_t read_pid(const char *path)
{
    FILE *f = fopen(path, "r");
    int pid = 0;

    cr_assert_not_null(f, "no pid file %s", path);
    cr_assert_eq(fscanf(f, "%d", &pid), 1);
    fclose(f);
    cr_assert_gt(pid, 1);
    return (pid_t)pid;
}

TestSuite(probe_exec, .init = make_dir, .fini = remove_dir);

Test(probe_exec, ok_below_the_threshold_and_logs_the_output)
{
    char *argv[] = {DATA "fake_train.sh", "8", "10", NULL};
    vp_exec_result r = run_cmd(argv, 10, 1);

    cr_assert_eq(r.outcome, VP_TRIAL_OK);
    cr_assert_eq(r.exit_code, 0);
    cr_assert_str_eq(slurp(r.out_path), "step 1: batch 8\nstep 2: batch 8\n");
    cr_assert_str_eq(slurp(r.err_path), "");
    cr_assert_geq(r.seconds, 0.0);
    assert_no_children();
}

Test(probe_exec, oom_above_the_threshold)
{
    char *argv[] = {DATA "fake_train.sh", "11", "10", NULL};
    vp_exec_result r = run_cmd(argv, 10, 1);

    cr_assert_eq(r.outcome, VP_TRIAL_OOM);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(slurp(r.err_path), "torch.OutOfMemoryError") != NULL);
    assert_no_children();
}

Test(probe_exec, every_oom_style_is_oom)
{
    const char *styles[] = {"torch", "torch-legacy", "cuda-error", "cublas",
                            "cudnn", "runtime", "driver", "jax", "cpu",
                            "progress", "c10"};

    for (size_t i = 0; i < sizeof styles / sizeof styles[0]; i++) {
        char *argv[] = {DATA "fake_oom.sh", (char *)styles[i], NULL};
        vp_exec_result r = run_cmd(argv, 10, 1);

        cr_assert_eq(r.outcome, VP_TRIAL_OOM, "style %s: %s", styles[i],
                     vp_trial_outcome_name(r.outcome));
    }
    assert_no_children();
}

Test(probe_exec, abort_after_an_oom_message_is_oom)
{
    char *argv[] = {DATA "fake_oom.sh", "c10", NULL};
    vp_exec_result r = run_cmd(argv, 10, 1);

    cr_assert_eq(r.outcome, VP_TRIAL_OOM);
    cr_assert_eq(r.term_signal, SIGABRT);
    cr_assert_eq(r.exit_code, -1);
}

Test(probe_exec, other_failures_are_errors)
{
    char *crash[] = {DATA "crash.sh", NULL};
    char *stdout_only[] = {DATA "oom_stdout.sh", NULL};
    char *segv[] = {DATA "segv.sh", NULL};
    vp_exec_result r;

    r = run_cmd(crash, 10, 1);
    cr_assert_eq(r.outcome, VP_TRIAL_ERROR);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(slurp(r.err_path), "ValueError") != NULL);
    r = run_cmd(stdout_only, 10, 1);
    cr_assert_eq(r.outcome, VP_TRIAL_ERROR, "an OOM on stdout only is not "
                 "an OOM");
    r = run_cmd(segv, 10, 1);
    cr_assert_eq(r.outcome, VP_TRIAL_ERROR);
    cr_assert_eq(r.term_signal, SIGSEGV);
    assert_no_children();
}

Test(probe_exec, oom_message_with_exit_0_is_ok)
{
    char *argv[] = {DATA "oom_exit0.sh", NULL};
    vp_exec_result r = run_cmd(argv, 10, 1);

    cr_assert_eq(r.outcome, VP_TRIAL_OK);
}

Test(probe_exec, missing_command_is_an_error)
{
    char *argv[] = {"vramplan-no-such-command-here", "{batch}", NULL};
    vp_exec_result r = run_cmd(argv, 10, 1);

    cr_assert_eq(r.outcome, VP_TRIAL_ERROR);
    cr_assert(r.exec_failed);
    cr_assert_eq(r.exec_errno, ENOENT);
    cr_assert(strstr(slurp(r.err_path), "cannot run") != NULL);
    assert_no_children();
}

Test(probe_exec, timeout_kills_the_process_group)
{
    char *argv[] = {DATA "hang.sh", NULL};
    double t0 = now_s();
    vp_exec_result r = run_cmd(argv, 0.5, 1.0);
    double took = now_s() - t0;

    cr_assert_eq(r.outcome, VP_TRIAL_TIMEOUT);
    cr_assert_eq(r.term_signal, SIGTERM);
    cr_assert_lt(took, 1.4, "took %.2f s", took);
    cr_assert_geq(took, 0.5);
    cr_assert_str_eq(slurp(r.out_path), "started\n");
    assert_no_children();
}

Test(probe_exec, sigkill_after_the_grace_period)
{
    char *argv[] = {DATA "stubborn.sh", NULL};
    double t0 = now_s();
    /* a timeout long enough for the shell to set its trap on a loaded
     * machine: a SIGTERM before it would end the script */
    vp_exec_result r = run_cmd(argv, 1.5, 0.4);
    double took = now_s() - t0;

    cr_assert_eq(r.outcome, VP_TRIAL_TIMEOUT);
    cr_assert_eq(r.term_signal, SIGKILL);
    cr_assert_geq(took, 1.9, "took %.2f s", took);
    cr_assert_lt(took, 2.8, "took %.2f s", took);
    assert_no_children();
}

static void orphan_case(const char *mode, const char *then, double timeout,
                        vp_trial_outcome want)
{
    char pidfile[128];
    char *argv[] = {DATA "orphan.sh", pidfile, (char *)mode, (char *)then,
                    NULL};
    vp_exec_result r;
    pid_t child;

    snprintf(pidfile, sizeof pidfile, "%s/child.pid", g_dir);
    r = run_cmd(argv, timeout, 0.5);
    cr_assert_eq(r.outcome, want, "%s", vp_trial_outcome_name(r.outcome));
    child = read_pid(pidfile);
    cr_assert(dies_within(child, 2.0), "the child %d outlived the trial",
              (int)child);
    assert_no_children();
}

Test(probe_exec, kills_a_detached_child_left_behind)
{
    orphan_case("detached", "exit", 10, VP_TRIAL_OK);
}

Test(probe_exec, kills_a_child_holding_the_output_pipes)
{
    orphan_case("holding", "exit", 10, VP_TRIAL_OK);
}

Test(probe_exec, timeout_kills_the_children_too)
{
    orphan_case("detached", "hang", 0.5, VP_TRIAL_TIMEOUT);
}

/* Gone and reaped when the trial returns: not even a zombie is left. */
static void assert_gone_now(pid_t pid)
{
    errno = 0;
    cr_assert_eq(kill(pid, 0), -1, "process %d outlived the trial",
                 (int)pid);
    cr_assert_eq(errno, ESRCH);
}

static void setsid_case(const char *then, double timeout,
                        vp_trial_outcome want)
{
    char pidfile[128];
    char *argv[] = {DATA "orphan.sh", pidfile, "setsid", (char *)then, NULL};
    vp_exec_result r;

    snprintf(pidfile, sizeof pidfile, "%s/child.pid", g_dir);
    r = run_cmd(argv, timeout, 0.5);
    cr_assert_eq(r.outcome, want, "%s", vp_trial_outcome_name(r.outcome));
    assert_gone_now(read_pid(pidfile));
    assert_no_children();
}

Test(probe_exec, kills_a_double_forked_setsid_grandchild)
{
    setsid_case("exit", 10, VP_TRIAL_OK);
}

Test(probe_exec, timeout_kills_a_double_forked_setsid_grandchild)
{
    setsid_case("hang", 1.0, VP_TRIAL_TIMEOUT);
}

static char *slurp_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long len;

    cr_assert_not_null(f, "cannot open %s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    len = ftell(f);
    cr_assert_geq(len, 0);
    rewind(f);
    buf = malloc((size_t)len + 1);
    cr_assert_not_null(buf);
    *n = fread(buf, 1, (size_t)len, f);
    cr_assert_eq(*n, (size_t)len);
    buf[*n] = '\0';
    fclose(f);
    return buf;
}

Test(probe_exec, a_100_mb_log_is_capped_and_its_oom_still_found)
{
    char *argv[] = {DATA "chatty.sh", "100", NULL};
    const char *oom_line = "torch.OutOfMemoryError: CUDA out of memory. "
                           "Tried to allocate 2.00 GiB\n";
    uint64_t total = 100u * 1048576u + strlen(oom_line) + strlen("last line\n");
    char note[200];
    vp_exec_result r = run_cmd(argv, 60, 1);
    size_t n;
    char *log;

    cr_assert_eq(r.outcome, VP_TRIAL_OOM, "%s",
                 vp_trial_outcome_name(r.outcome));
    log = slurp_all(r.err_path, &n);
    snprintf(note, sizeof note,
             "\n[vramplan: %" PRIu64 " bytes cut here; the log keeps the "
             "first 1048576 and the last 1048576 of %" PRIu64 " bytes]\n",
             total - VP_PROBE_LOG_HEAD - VP_PROBE_LOG_TAIL, total);
    cr_assert_eq(n, VP_PROBE_LOG_HEAD + strlen(note) + VP_PROBE_LOG_TAIL);
    cr_assert(memcmp(log + VP_PROBE_LOG_HEAD, note, strlen(note)) == 0,
              "no note where the log was cut");
    cr_assert(strncmp(log, "step 17/1000", 12) == 0);
    cr_assert_str_eq(log + n - 10, "last line\n");
    cr_assert_null(strstr(log, "OutOfMemoryError"), "the OOM line was in "
                   "the cut part: found in the stream, not the log");
    free(log);
    assert_no_children();
}

Test(probe_exec, a_log_within_the_cap_is_whole)
{
    char *argv[] = {DATA "chatty.sh", "1", NULL};
    vp_exec_result r = run_cmd(argv, 60, 1);
    size_t n;
    char *log;

    cr_assert_eq(r.outcome, VP_TRIAL_OOM);
    log = slurp_all(r.err_path, &n);
    cr_assert_eq(n, 1048576u + strlen("torch.OutOfMemoryError: CUDA "
                 "out of memory. Tried to allocate 2.00 GiB\nlast line\n"));
    cr_assert_not_null(strstr(log, "OutOfMemoryError"));
    cr_assert_null(strstr(log, "bytes cut here"));
    free(log);
}

Test(probe_exec, no_descriptor_leaks_into_the_command)
{
    char fdarg[16];
    char *argv[] = {DATA "fdcheck.sh", fdarg, NULL};
    int fd = open("/dev/null", O_RDONLY); /* not close-on-exec */
    int high = dup2(fd, 57);
    vp_exec_result r;

    cr_assert_eq(high, 57);
    snprintf(fdarg, sizeof fdarg, "%d", high);
    r = run_cmd(argv, 10, 1);
    cr_assert_eq(r.outcome, VP_TRIAL_OK, "%s", slurp(r.err_path));
    close(fd);
    close(high);
}

static volatile sig_atomic_t g_stop = 1;

Test(probe_exec, cancel_stops_the_trial)
{
    char *argv[] = {DATA "hang.sh", NULL};
    vp_exec_config c;
    vp_exec_result r;
    vp_error err;
    double t0 = now_s();

    vp_exec_config_init(&c);
    c.log_dir = g_dir;
    c.timeout_s = 10;
    c.grace_s = 1;
    c.cancel = &g_stop;
    cr_assert_eq(vp_probe_exec(argv, &c, &r, &err), VP_OK);
    cr_assert_eq(r.outcome, VP_TRIAL_CANCELLED);
    cr_assert_lt(now_s() - t0, 1.0);
    assert_no_children();
}

Test(probe_exec, bad_arguments)
{
    char *empty[] = {NULL};
    char *argv[] = {DATA "hang.sh", NULL};
    vp_exec_config c;
    vp_exec_result r;
    vp_error err;

    vp_exec_config_init(&c);
    c.log_dir = g_dir;
    cr_assert_eq(vp_probe_exec(empty, &c, &r, &err), VP_EARG);
    c.log_dir = "/nonexistent/dir/for/logs";
    cr_assert_eq(vp_probe_exec(argv, &c, &r, &err), VP_EIO);
    assert_no_children();
}

/* The search driving real (fake) commands. */
typedef struct cmd_trials {
    char *tmpl[4];
    uint32_t n;
} cmd_trials;

static vp_status cmd_try(uint64_t batch, vp_trial_outcome *outcome,
                         double *seconds, void *ud, vp_error *err)
{
    cmd_trials *ct = ud;
    vp_exec_config c;
    vp_exec_result r;
    char name[32];
    char **argv = vp_probe_argv_format(ct->tmpl, 3, batch, err);
    vp_status st;

    cr_assert_not_null(argv);
    snprintf(name, sizeof name, "trial-%u", ++ct->n);
    vp_exec_config_init(&c);
    c.log_dir = g_dir;
    c.log_name = name;
    c.timeout_s = 10;
    st = vp_probe_exec(argv, &c, &r, err);
    vp_probe_argv_free(argv);
    *outcome = r.outcome;
    *seconds = r.seconds;
    return st;
}

Test(probe_exec, search_over_a_fake_training_command)
{
    cmd_trials ct = {{DATA "fake_train.sh", "{batch}", "37", NULL}, 0};
    vp_probe_config c;
    vp_probe_result r;
    vp_error err;

    vp_probe_config_init(&c);
    cr_assert_eq(vp_probe_search(&c, cmd_try, &ct, NULL, NULL, &r, &err),
                 VP_OK);
    cr_assert_eq(r.max_batch, 37);
    cr_assert_eq(r.recommended, 35);
    cr_assert_eq(r.n_trials, 12); /* 1..64 doubling (7), bisect (5) */
    vp_probe_result_destroy(&r);

    c.predicted = 37;
    cr_assert_eq(vp_probe_search(&c, cmd_try, &ct, NULL, NULL, &r, &err),
                 VP_OK);
    cr_assert_eq(r.max_batch, 37);
    cr_assert_eq(r.n_trials, 2);
    vp_probe_result_destroy(&r);
    assert_no_children();
}

/* ------------------------------------------------------------------ */
/* The probe command                                                   */
/* ------------------------------------------------------------------ */

typedef struct cli_out {
    char out[65536];
    char err[65536];
    int status;
} cli_out;

static bool starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static size_t count(const char *s, const char *what)
{
    size_t n = 0;

    for (const char *p = strstr(s, what); p != NULL;
         p = strstr(p + 1, what))
        n++;
    return n;
}

static const char *bin(void)
{
    const char *b = getenv("VRAMPLAN_BIN");

    return b != NULL && b[0] != '\0' ? b : "./vramplan";
}

/* Run the vramplan binary with args (NULL-terminated), capturing both
 * streams through files (the outputs are small). */
static void run_cli(cli_out *o, const char *const *args)
{
    char *argv[48];
    char outp[128], errp[128];
    size_t n = 0;
    int st;
    pid_t pid;

    char logs[128];

    /* probe's logs go under this test's directory, not into $TMPDIR */
    snprintf(logs, sizeof logs, "%s/logs", g_dir);
    argv[n++] = (char *)bin();
    for (bool first = true; *args != NULL && n < 45; args++, first = false) {
        argv[n++] = (char *)*args;
        if (first && strcmp(*args, "probe") == 0) {
            argv[n++] = "--log-dir";
            argv[n++] = logs;
        }
    }
    argv[n] = NULL;
    snprintf(outp, sizeof outp, "%s/cli.out", g_dir);
    snprintf(errp, sizeof errp, "%s/cli.err", g_dir);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);

        if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0)
            _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    while (waitpid(pid, &st, 0) < 0)
        cr_assert_eq(errno, EINTR);
    o->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    snprintf(o->out, sizeof o->out, "%s", slurp(outp));
    snprintf(o->err, sizeof o->err, "%s", slurp(errp));
}

TestSuite(probe_cli, .init = make_dir, .fini = remove_dir);

Test(probe_cli, json_output_without_a_model)
{
    char logs[128];
    cli_out o;

    snprintf(logs, sizeof logs, "%s/logs", g_dir);
    run_cli(&o, (const char *const[]){"probe", "--format", "json",
                                      "--log-dir", logs, "--min", "4",
                                      "--", DATA "fake_train.sh", "{batch}",
                                      "37", NULL});
    cr_assert_eq(o.status, 0, "%s", o.err);
    cr_assert(starts(o.out, "{\"max_batch\": 37, \"recommended\": 35, "
                            "\"trials\": [{\"batch\": 4, \"outcome\": "
                            "\"ok\", \"seconds\": "),
              "%s", o.out);
    cr_assert_eq(count(o.out, "\"batch\":"), 10, "%s", o.out);
    cr_assert(strstr(o.out, "{\"batch\": 64, \"outcome\": \"oom\"") != NULL);
    cr_assert(strstr(o.out, "{\"batch\": 38, \"outcome\": \"oom\"") != NULL);
    cr_assert(strstr(o.out, "\"predicted\": null, \"complete\": true, "
                            "\"fail_batch\": 38, \"margin\": 0.05, "
                            "\"log_dir\": ") != NULL, "%s", o.out);
    /* one progress line per trial; the logs are kept */
    cr_assert(strstr(o.err, "probe: trial 1: batch 4 ") != NULL, "%s", o.err);
    char path[256];
    snprintf(path, sizeof path, "%s/trial-01-batch-4.out", logs);
    cr_assert_str_eq(slurp(path), "step 1: batch 4\nstep 2: batch 4\n");
}

Test(probe_cli, model_prediction_needs_two_trials)
{
    char limit[32], want[160];
    const char *p;
    cli_out o;

    /* the fake command fits up to what vramplan predicts for mlp10 under
     * 4 GiB (9984 on the H200, where it was measured): two trials */
    run_cli(&o, (const char *const[]){"maxbatch", "models/mlp10.yaml",
                                      "--budget", "4GiB", "--steps", "2",
                                      "--format", "json", NULL});
    cr_assert_eq(o.status, 0, "%s", o.err);
    p = strstr(o.out, "\"max_batch\": ");
    cr_assert_not_null(p, "%s", o.out);
    snprintf(limit, sizeof limit, "%llu",
             strtoull(p + strlen("\"max_batch\": "), NULL, 10));
    run_cli(&o, (const char *const[]){"probe", "--model", "models/mlp10.yaml",
                                      "--budget", "4GiB", "--format", "json",
                                      "--", DATA "fake_train.sh", "{batch}",
                                      limit, NULL});
    cr_assert_eq(o.status, 0, "%s", o.err);
    snprintf(want, sizeof want, "{\"max_batch\": %s, \"recommended\": %llu, "
             "\"trials\": [{\"batch\": %s, \"outcome\": \"ok\"", limit,
             (unsigned long long)vp_probe_recommended(strtoull(limit, NULL,
                                                               10), 50000),
             limit);
    cr_assert(starts(o.out, want), "%s", o.out);
    snprintf(want, sizeof want, "{\"batch\": %llu, \"outcome\": \"oom\"",
             strtoull(limit, NULL, 10) + 1);
    cr_assert(strstr(o.out, want) != NULL, "%s", o.out);
    snprintf(want, sizeof want, "\"predicted\": %s,", limit);
    cr_assert(strstr(o.out, want) != NULL, "%s", o.out);
    cr_assert_eq(count(o.out, "\"batch\":"), 2, "two trials: %s", o.out);
}

Test(probe_cli, table_output)
{
    cli_out o;

    run_cli(&o, (const char *const[]){"probe", "--margin", "0.1", "--",
                                      DATA "fake_train.sh", "{batch}", "5",
                                      NULL});
    cr_assert_eq(o.status, 0, "%s", o.err);
    cr_assert(strstr(o.out, "command      tests/data/probe/fake_train.sh "
                            "{batch} 5\n") != NULL, "%s", o.out);
    cr_assert(strstr(o.out, "max batch    5 (the largest that ran; the next "
                            "one ran out of memory)\n") != NULL, "%s", o.out);
    cr_assert(strstr(o.out, "recommended  4 (margin 10%)\n") != NULL, "%s",
              o.out);
    cr_assert(strstr(o.out, "trials       6 in ") != NULL, "%s", o.out);
}

Test(probe_cli, an_error_stops_the_search_with_its_output)
{
    cli_out o;

    run_cli(&o, (const char *const[]){"probe", "--", DATA "crash.sh",
                                      "{batch}", NULL});
    cr_assert_eq(o.status, 4);
    cr_assert(strstr(o.out, "max batch    none: batch 1 did not run") !=
              NULL, "%s", o.out);
    cr_assert(strstr(o.err, "failed with exit status 1, with no "
                            "out-of-memory message") != NULL, "%s", o.err);
    cr_assert(strstr(o.err, "    | ValueError: unknown optimizer") != NULL,
              "%s", o.err);
}

Test(probe_cli, a_timeout_stops_the_search)
{
    cli_out o;

    run_cli(&o, (const char *const[]){"probe", "--timeout", "0.3", "--grace",
                                      "0.3", "--format", "json", "--",
                                      DATA "hang.sh", "{batch}", NULL});
    cr_assert_eq(o.status, 4);
    cr_assert(strstr(o.out, "\"outcome\": \"timeout\"") != NULL, "%s", o.out);
    cr_assert(strstr(o.err, "ran past the 0.3 s timeout") != NULL, "%s",
              o.err);
}

Test(probe_cli, nothing_fits)
{
    cli_out o;

    run_cli(&o, (const char *const[]){"probe", "--format", "json", "--",
                                      DATA "fake_train.sh", "{batch}", "0",
                                      NULL});
    cr_assert_eq(o.status, 1);
    cr_assert(starts(o.out, "{\"max_batch\": 0, \"recommended\": 0, "),
              "%s", o.out);
}

Test(probe_cli, usage_errors)
{
    cli_out o;

    run_cli(&o, (const char *const[]){"probe", "--", DATA "fake_train.sh",
                                      "8", "10", NULL});
    cr_assert_eq(o.status, 2);
    cr_assert(strstr(o.err, "no '{batch}' in the command") != NULL, "%s",
              o.err);
    run_cli(&o, (const char *const[]){"probe", "--budget", "4GiB", "--",
                                      DATA "fake_train.sh", "{batch}", "10",
                                      NULL});
    cr_assert_eq(o.status, 2);
    cr_assert(strstr(o.err, "--budget is for the prediction: it needs "
                            "--model") != NULL, "%s", o.err);
    run_cli(&o, (const char *const[]){"probe", "--model", "models/mlp10.yaml",
                                      "--", DATA "fake_train.sh", "{batch}",
                                      "10", NULL});
    cr_assert_eq(o.status, 2);
    run_cli(&o, (const char *const[]){"probe", "--margin", "1", "--",
                                      DATA "fake_train.sh", "{batch}", "10",
                                      NULL});
    cr_assert_eq(o.status, 2);
    run_cli(&o, (const char *const[]){"probe", DATA "fake_train.sh",
                                      "{batch}", NULL});
    cr_assert_eq(o.status, 2);
    run_cli(&o, (const char *const[]){"probe", "--help", NULL});
    cr_assert_eq(o.status, 0);
    cr_assert(starts(o.out, "Usage: vramplan probe"));
}

/* ------------------------------------------------------------------ */
/* The replay command's event file (the GPU side is not run here)      */
/* ------------------------------------------------------------------ */

TestSuite(replay_cli, .init = make_dir, .fini = remove_dir);

Test(replay_cli, event_file_replays_the_simulated_segments)
{
    char path[128], line[512];
    unsigned long long peak = 0, reserved = 0, max_seen = 0, a, s;
    size_t segs = 0, frees = 0, gemm_lines = 0;
    bool end = false;
    cli_out o;
    FILE *f;

    snprintf(path, sizeof path, "%s/mlp10.ev", g_dir);
    run_cli(&o, (const char *const[]){"replay", "models/mlp10.yaml",
                                      "--batch", "1024", "--budget", "4GiB",
                                      "--events", path, NULL});
    cr_assert_eq(o.status, 0, "%s", o.err);
    f = fopen(path, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert_str_eq(line, "vramplan-replay 1\n");
    while (fgets(line, sizeof line, f) != NULL) {
        cr_assert_not(end, "a record after 'end'");
        if (sscanf(line, "seg + %llu %llu", &a, &s) == 2) {
            reserved += s;
            segs++;
            if (reserved > max_seen)
                max_seen = reserved;
        } else if (strncmp(line, "seg - ", 6) == 0) {
            frees++;
        } else if (sscanf(line, "predicted peak_reserved %llu", &peak) == 1) {
            continue;
        } else if (strncmp(line, "gemm ", 5) == 0) {
            gemm_lines++;
        } else if (strcmp(line, "end\n") == 0) {
            end = true;
        }
    }
    fclose(f);
    cr_assert(end);
    cr_assert_gt(segs, 0);
    cr_assert_eq(frees, 0, "no segment is freed at batch 1024 under 4 GiB");
    /* the segments' high-water mark is the simulator's peak reserved */
    cr_assert_eq(max_seen, peak);
    /* mlp10: forward of 10 linears, weight grads of 10, input grads of 9
     * (not the first), in 6 distinct shapes */
    cr_assert_eq(gemm_lines, 6);
    cr_assert(strstr(slurp(path), "gemm f32 T N 4096 1024 4096 9 net.0\n"));
    cr_assert(strstr(slurp(path), "gemm f32 N N 4096 1024 4096 8 net.2\n"));
}

Test(replay_cli, frees_segments_when_the_budget_is_tight)
{
    char path[128], batch[32], line[512];
    unsigned long long a, s, peak = 0, reserved = 0, max_seen = 0;
    unsigned long long live[4096], size[4096];
    size_t n_live = 0, frees = 0;
    const char *p;
    cli_out o;
    FILE *f;

    /* at the largest batch under 4 GiB the allocator frees its cached
     * segments and retries (PyTorch did too: num_alloc_retries 2 at 9984
     * on the H200): cudaFree events, each of a live segment */
    run_cli(&o, (const char *const[]){"maxbatch", "models/mlp10.yaml",
                                      "--budget", "4GiB", "--steps", "2",
                                      "--format", "json", NULL});
    p = strstr(o.out, "\"max_batch\": ");
    cr_assert_not_null(p, "%s", o.out);
    snprintf(batch, sizeof batch, "%llu",
             strtoull(p + strlen("\"max_batch\": "), NULL, 10));
    snprintf(path, sizeof path, "%s/tight.ev", g_dir);
    run_cli(&o, (const char *const[]){"replay", "models/mlp10.yaml",
                                      "--batch", batch, "--budget", "4GiB",
                                      "--events", path, NULL});
    cr_assert_eq(o.status, 0, "%s", o.err);
    f = fopen(path, "r");
    cr_assert_not_null(f);
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "seg + %llu %llu", &a, &s) == 2) {
            cr_assert_lt(n_live, 4096);
            live[n_live] = a;
            size[n_live++] = s;
            reserved += s;
            cr_assert_leq(reserved, 4ull << 30, "past the budget");
            if (reserved > max_seen)
                max_seen = reserved;
        } else if (sscanf(line, "seg - %llu", &a) == 1) {
            size_t i = 0;

            while (i < n_live && live[i] != a)
                i++;
            cr_assert_lt(i, n_live, "segment %llu freed but not live", a);
            reserved -= size[i];
            live[i] = live[n_live - 1];
            size[i] = size[--n_live];
            frees++;
        } else {
            sscanf(line, "predicted peak_reserved %llu", &peak);
        }
    }
    fclose(f);
    cr_assert_gt(frees, 0, "no segment freed");
    cr_assert_eq(max_seen, peak);
    cr_assert(strstr(slurp(path), "\nmark 2 optimizer\n") != NULL);
}

Test(replay_cli, errors)
{
    char path[128];
    cli_out o;

    snprintf(path, sizeof path, "%s/x.ev", g_dir);
    run_cli(&o, (const char *const[]){"replay", "models/mlp10.yaml",
                                      "--batch", "1024", "--budget", "100MiB",
                                      "--events", path, NULL});
    cr_assert_eq(o.status, 1, "does not fit in the simulation");
    cr_assert(strstr(o.err, "nothing to replay") != NULL, "%s", o.err);
    run_cli(&o, (const char *const[]){"replay", "models/mlp10.yaml", NULL});
    cr_assert_eq(o.status, 2);
    cr_assert(strstr(o.err, "replay needs --budget") != NULL, "%s", o.err);
    run_cli(&o, (const char *const[]){"replay", "models/mlp10.yaml",
                                      "--budget", "4GiB", "--replayer",
                                      "/nonexistent/vp-replay", NULL});
    cr_assert_eq(o.status, 2);
    cr_assert(strstr(o.err, "cannot run the GPU replayer") != NULL, "%s",
              o.err);
}
