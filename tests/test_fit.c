/* Tests of the framework-constant fit (vp_fit_framework) on recorded H200
 * measurements (a copy of shared/groundtruth/h200-torch2.11-cases.jsonl),
 * and of the `fit` and `calibrate --from-raw` commands. No GPU is
 * needed. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vramplan/gpu.h"
#include "vramplan/vramplan.h"

#define CASES "tests/data/gpu/h200-torch2.11-cases.jsonl"

static const char *const DIRS[] = {"models"};

Test(fit_framework, context_from_the_h200_cases)
{
    const char *files[] = {CASES};
    vp_fit_result r;
    vp_error err;
    cr_assert_eq(vp_fit_framework(files, 1, DIRS, 1, 718077952, &r, &err),
                 VP_OK, "%s", err.msg);
    cr_expect_eq(r.n_cases, 28);
    cr_expect_eq(r.skipped, 0, "%s", r.skip_note);
    cr_expect_eq(r.context_before, 718077952);
    /* device_used - peak_reserved is 751 to 791 MiB in these cases
     * (shared/docs/PYTORCH_MEMORY.md section 5) */
    cr_expect_gt(r.context_after, 751 * VP_MiB);
    cr_expect_lt(r.context_after, 791 * VP_MiB);
    cr_expect_gt(r.context_sd_bytes, 0.0);
    cr_expect_lt(r.context_sd_bytes, 16.0 * VP_MiB);
    cr_expect_lt(r.rms_after, r.rms_before);
    cr_expect_lt(r.median_abs_after, r.median_abs_before);
    vp_fit_result_destroy(&r);
}

/* The least-squares answer, computed directly: for relative residuals
 * (res_i + c - dev_i) / dev_i the minimum is
 * c = sum((dev_i - res_i) / dev_i^2) / sum(1 / dev_i^2). */
Test(fit_framework, matches_the_closed_form)
{
    const char *files[] = {CASES};
    vp_fit_result r;
    vp_error err;
    cr_assert_eq(vp_fit_framework(files, 1, DIRS, 1, 0x10000, &r, &err),
                 VP_OK, "%s", err.msg);
    double num = 0, den = 0;
    for (size_t i = 0; i < r.n_cases; i++) {
        double dev = (double)r.cases[i].measured_device,
               res = (double)r.cases[i].measured_reserved;
        num += (dev - res) / (dev * dev);
        den += 1.0 / (dev * dev);
    }
    double want = num / den;
    cr_expect(fabs((double)r.context_after - want) < 2.0, "%llu vs %.1f",
              (unsigned long long)r.context_after, want);
    /* its standard error: sqrt(chi^2 / (n - 1) / sum(1 / dev_i^2)) */
    double chi = 0;
    for (size_t i = 0; i < r.n_cases; i++) {
        double dev = (double)r.cases[i].measured_device,
               res = (double)r.cases[i].measured_reserved;
        chi += ((res + want - dev) / dev) * ((res + want - dev) / dev);
    }
    cr_assert_gt(r.n_cases, 1);
    double se = sqrt(chi / (double)(r.n_cases - 1) / den);
    cr_expect(fabs(r.context_sd_bytes - se) <= 1e-9 * se, "%.3f vs %.3f",
              r.context_sd_bytes, se);
    /* the starting point does not matter */
    vp_fit_result r2;
    cr_assert_eq(vp_fit_framework(files, 1, DIRS, 1, 4 * VP_GiB, &r2, &err),
                 VP_OK);
    cr_expect(llabs((long long)r2.context_after - (long long)r.context_after)
                  < 2,
              "%llu vs %llu", (unsigned long long)r2.context_after,
              (unsigned long long)r.context_after);
    vp_fit_result_destroy(&r2);
    vp_fit_result_destroy(&r);
}

Test(fit_framework, residuals_are_the_simulated_device_used)
{
    const char *files[] = {CASES};
    vp_fit_result r;
    vp_error err;
    cr_assert_eq(vp_fit_framework(files, 1, DIRS, 1, 718077952, &r, &err),
                 VP_OK, "%s", err.msg);
    for (size_t i = 0; i < r.n_cases; i++) {
        const vp_fit_case *c = &r.cases[i];
        double dev = (double)c->measured_device;
        cr_expect(fabs(c->err_before -
                       ((double)c->predicted_reserved + 718077952.0 - dev) /
                           dev) < 1e-12);
        cr_expect(fabs(c->err_after - ((double)c->predicted_reserved +
                                       (double)r.context_after - dev) /
                                          dev) < 1e-12);
    }
    vp_fit_result_destroy(&r);
}

Test(fit_framework, errors)
{
    vp_fit_result r;
    vp_error err;
    const char *missing[] = {"tests/data/gpu/no-such.jsonl"};
    cr_expect_eq(vp_fit_framework(missing, 1, DIRS, 1, 0, &r, &err), VP_EIO);
    cr_expect_null(r.cases);

    char path[] = "/tmp/vp-fit-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char *text =
        "{\"env\": {\"gpu\": \"NVIDIA H200\"}}\n"
        "{\"model\": \"mlp10\", \"batch\": 4, \"id\": \"no-device-used\"}\n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    const char *only[] = {path};
    cr_expect_eq(vp_fit_framework(only, 1, DIRS, 1, 0, &r, &err),
                 VP_ERANGE);
    cr_expect(strstr(err.msg, "no case") != NULL, "%s", err.msg);
    unlink(path);
}

/* ---- the commands ---------------------------------------------------------- */

static const char *bin(void)
{
    const char *b = getenv("VRAMPLAN_BIN");
    return b && *b ? b : "./vramplan";
}

/* Run a shell command line; its exit status. */
static int sh(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The command is in the binary: a missing one fails the test (it never
 * skips). */
static void need_command(const char *name)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s --help >/dev/null 2>&1", bin(), name);
    cr_assert_eq(sh(cmd), 0, "'%s %s --help' failed: the command is "
                 "missing from this build", bin(), name);
}

Test(fit_cli, writes_a_profile_with_the_fitted_context)
{
    need_command("fit");
    char out[] = "/tmp/vp-fit-out-XXXXXX";
    int fd = mkstemp(out);
    cr_assert_geq(fd, 0);
    close(fd);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s fit " CASES " --gpu h200 --out %s > %s.txt 2>&1", bin(), out,
             out);
    cr_assert_eq(sh(cmd), 0, "%s", cmd);
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load(out, &err);
    cr_assert_not_null(p, "%s", err.msg);
    uint64_t ctx = vp_gpu_context_bytes(p, NULL);
    cr_expect_gt(ctx, 751 * VP_MiB);
    cr_expect_lt(ctx, 791 * VP_MiB);
    vp_gpu_free(p);
    snprintf(cmd, sizeof cmd,
             "grep -q '^device_used after: 28 cases' %s.txt", out);
    cr_expect_eq(sh(cmd), 0, "no summary line in the output");
    snprintf(cmd, sizeof cmd, "%s.txt", out);
    unlink(cmd);
    unlink(out);
}

Test(fit_cli, usage_errors)
{
    need_command("fit");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s fit >/dev/null 2>&1", bin());
    cr_expect_eq(sh(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s fit " CASES " --bogus >/dev/null 2>&1",
             bin());
    cr_expect_eq(sh(cmd), 2);
}

Test(calibrate_cli, from_raw_writes_a_measured_profile)
{
    need_command("calibrate");
    char out[] = "/tmp/vp-cal-out-XXXXXX";
    int fd = mkstemp(out);
    cr_assert_geq(fd, 0);
    close(fd);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s calibrate --from-raw tests/data/gpu/h200-raw.jsonl --out %s "
             ">/dev/null 2>&1",
             bin(), out);
    cr_assert_eq(sh(cmd), 0, "%s", cmd);
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load(out, &err);
    cr_assert_not_null(p, "%s", err.msg);
    cr_expect_str_eq(vp_gpu_name(p), "h200");
    const vp_gpu_measured *m = vp_gpu_measured_get(p);
    cr_assert_not_null(m);
    cr_expect_eq(m->gemm[VP_GPU_BF16].points, 13);
    cr_expect_eq(m->context_bytes, 718077952);
    vp_gpu_free(p);
    unlink(out);
    /* a bad raw file is an input error (3) */
    snprintf(cmd, sizeof cmd,
             "%s calibrate --from-raw tests/data/gpu/h200-torch2.11-cases."
             "jsonl >/dev/null 2>&1",
             bin());
    cr_expect_eq(sh(cmd), 3);
}

/* --sweep fits the kernel sweep into the measured section: the H200's
 * sweep gives gpus/h200.yaml's fits; a bad sweep line is an input error */
Test(calibrate_cli, from_raw_with_a_sweep)
{
    need_command("calibrate");
    char out[] = "/tmp/vp-cal-out-XXXXXX";
    int fd = mkstemp(out);
    cr_assert_geq(fd, 0);
    close(fd);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s calibrate --from-raw tests/data/gpu/h200-raw.jsonl --sweep "
             "groundtruth/h200-torch2.11-sweeps.jsonl --out %s >/dev/null "
             "2>&1",
             bin(), out);
    cr_assert_eq(sh(cmd), 0, "%s", cmd);
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load(out, &err);
    vp_gpu_profile *ship = vp_gpu_load("h200", &err);
    cr_assert_not_null(p, "%s", err.msg);
    cr_assert_not_null(ship, "%s", err.msg);
    const vp_gpu_measured *m = vp_gpu_measured_get(p);
    const vp_gpu_measured *s = vp_gpu_measured_get(ship);
    cr_expect_float_eq(m->dispatch_us.median, s->dispatch_us.median, 1e-9);
    cr_expect_float_eq(m->membound[VP_HW_MEM_COPY].peak,
                       s->membound[VP_HW_MEM_COPY].peak,
                       1e-4 * s->membound[VP_HW_MEM_COPY].peak);
    vp_gpu_free(ship);
    vp_gpu_free(p);
    unlink(out);
    snprintf(cmd, sizeof cmd,
             "%s calibrate --from-raw tests/data/gpu/h200-raw.jsonl --sweep "
             "tests/data/gpu/h200-raw.jsonl >/dev/null 2>&1",
             bin());
    cr_expect_eq(sh(cmd), 3);
}
