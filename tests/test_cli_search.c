/* Golden tests of the search commands: maxbatch, plan (one GPU),
 * techniques and validate, with their usage errors and exit statuses.
 *
 * Each case runs the binary (VRAMPLAN_BIN, default ./vramplan, from the
 * repository root) and compares its stdout with tests/golden/NAME.out, its
 * stderr with tests/golden/NAME.err and its exit status with the expected
 * one. Run with VRAMPLAN_UPDATE_GOLDEN=1 to rewrite the golden files from
 * the current output (then review the diff). The helpers are those of
 * test_cli.c. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "cli_golden.h"

/* --- maxbatch ---------------------------------------------------------- */

/* mlp10's fp32 AdamW state alone (2.3 GiB) is over 2 GiB: exit 1 */
Test(cli_search, maxbatch_mlp10_table)
{
    GOLDEN("search_maxbatch_mlp10_table", 1, "maxbatch", "models/mlp10.yaml",
           "--budget", "2GiB");
}
Test(cli_search, maxbatch_mlp10_json)
{
    GOLDEN("search_maxbatch_mlp10_json", 1, "maxbatch", "models/mlp10.yaml",
           "--budget", "2GiB", "--format", "json");
}
/* the largest batch of a generate() job (sequences), with its KV cache */
Test(cli_search, maxbatch_generate)
{
    GOLDEN("search_maxbatch_generate", 0, "maxbatch",
           "tests/data/good/hf-llama.json", "--precision", "bf16",
           "--generate", "prompt=100,new=10", "--budget", "64MiB",
           "--format", "json");
}
Test(cli_search, plan_refuses_generate)
{
    GOLDEN("search_plan_refuses_generate", 2, "plan",
           "tests/data/good/hf-llama.json", "--generate", "prompt=100,new=10",
           "--budget", "64MiB");
}
Test(cli_search, maxbatch_mlp10_fits_table)
{
    GOLDEN("search_maxbatch_mlp10_fits_table", 0, "maxbatch",
           "models/mlp10.yaml", "--budget", "4GiB");
}
Test(cli_search, maxbatch_mlp10_fits_json)
{
    GOLDEN("search_maxbatch_mlp10_fits_json", 0, "maxbatch",
           "models/mlp10.yaml", "--budget", "4GiB", "--format", "json");
}
Test(cli_search, maxbatch_gpu_fraction)
{
    GOLDEN("search_maxbatch_gpu_fraction", 0, "maxbatch",
           "models/mlp10.yaml", "--gpu", "h200", "--budget", "0.05",
           "--precision", "bf16");
}

/* an explicit --steps is kept: 4 was taken for "not given" and became 2 */
Test(cli_search, maxbatch_explicit_steps_are_kept)
{
    GOLDEN("search_maxbatch_steps_4", 0, "maxbatch", "models/mlp10.yaml",
           "--budget", "4GiB", "--steps", "4", "--format", "json");
}
Test(cli_search, techniques_explicit_steps_are_kept)
{
    GOLDEN("search_techniques_steps_4", 0, "techniques", "models/mlp10.yaml",
           "--batch", "256", "--budget", "2GiB", "--steps", "4",
           "--format", "json");
}

/* --- plan --------------------------------------------------------------- */

Test(cli_search, plan_mlp10_table)
{
    GOLDEN("search_plan_mlp10_table", 0, "plan", "models/mlp10.yaml", "--gpu",
           "h200", "--global-batch", "64", "--budget", "3GiB");
}
Test(cli_search, plan_mlp10_json)
{
    GOLDEN("search_plan_mlp10_json", 0, "plan", "models/mlp10.yaml", "--gpu",
           "h200", "--global-batch", "64", "--budget", "3GiB", "--format",
           "json");
}
Test(cli_search, plan_nothing_fits)
{
    GOLDEN("search_plan_nothing_fits", 1, "plan", "models/mlp10.yaml",
           "--gpu", "h200", "--global-batch", "64", "--budget", "256MiB");
}

/* --- techniques --------------------------------------------------------- */

Test(cli_search, techniques_mlp10_table)
{
    GOLDEN("search_techniques_mlp10_table", 0, "techniques",
           "models/mlp10.yaml", "--batch", "256", "--budget", "2GiB", "--gpu",
           "h200");
}
Test(cli_search, techniques_mlp10_json)
{
    GOLDEN("search_techniques_mlp10_json", 0, "techniques",
           "models/mlp10.yaml", "--batch", "256", "--budget", "2GiB", "--gpu",
           "h200", "--format", "json");
}

/* --- validate ---------------------------------------------------------- */

Test(cli_search, validate_cases_table)
{
    GOLDEN("search_validate_cases_table", 0, "validate",
           "tests/data/validate/cases.jsonl");
}
/* A multi-GPU file: each rank line as its rank, then each run's largest
 * rank (the most loaded of the ranks simulated against the largest
 * measured). */
Test(cli_search, validate_dist_largest_rank)
{
    GOLDEN("search_validate_dist_largest", 0, "validate", "--models",
           "tests/data/dist", "tests/data/dist/largest.jsonl");
}

Test(cli_search, validate_cases_jsonl)
{
    GOLDEN("search_validate_cases_jsonl", 0, "validate",
           "tests/data/validate/cases.jsonl", "--format", "jsonl");
}
Test(cli_search, validate_cases_gpu)
{
    GOLDEN("search_validate_cases_gpu", 0, "validate",
           "tests/data/validate/cases.jsonl", "--gpu", "h200");
}
Test(cli_search, validate_maxbatch_table)
{
    GOLDEN("search_validate_maxbatch_table", 0, "validate",
           "tests/data/validate/maxbatch.jsonl");
}
Test(cli_search, validate_two_files_jsonl)
{
    GOLDEN("search_validate_two_files_jsonl", 0, "validate",
           "tests/data/validate/cases.jsonl",
           "tests/data/validate/maxbatch.jsonl", "--format", "jsonl");
}
/* a case measured as failed, an unknown model and a malformed line: each
 * reported with its file:line, the other cases still compared; exit 2 */
/* The same cases measured again (groundtruth/h200-torch2.11-rerun-cases-a
 * .jsonl's lines): the summary adds the repeated cases' line. */
Test(cli_search, validate_repeated_cases_table)
{
    GOLDEN("search_validate_repeated_table", 0, "validate", "--gpu", "h200",
           "tests/data/validate/cases.jsonl",
           "tests/data/validate/cases-again.jsonl");
}

/* Each value of the first step_us line for ID in out, from offset *at on. */
static bool step_line(const char *id, const char *metric,
                      const char **at, double *pred, double *meas)
{
    char key[160];
    snprintf(key, sizeof key, "{\"id\": \"%s\", \"metric\": \"%s\"", id,
             metric);
    const char *p = strstr(*at, key);
    if (p == NULL)
        return false;
    *at = p + 1;
    return sscanf(strstr(p, "\"predicted\""),
                  "\"predicted\": %lf, \"measured\": %lf", pred, meas) == 2;
}

/* In jsonl, a case measured twice gets a step_us_median line: the median
 * (of two, their mean) of its measured step times, the number of
 * measurements, and the error of the median of each measurement over its
 * own prediction (each line is timed on its host: cases-again.jsonl's
 * lines carry the host benchmark, cases.jsonl's not); its predicted
 * field is the median over that ratio. */
Test(cli_search, validate_repeated_cases_jsonl_median)
{
    static const char *const args[] = {
        "validate", "--gpu", "h200", "tests/data/validate/cases.jsonl",
        "tests/data/validate/cases-again.jsonl", "--format", "jsonl", NULL};
    static const char id[] = "gpt2-small-amp-bf16-b16-ckpt";
    cli_run r;
    double p1, m1, p2, m2, pm, mm;

    cli_exec(args, &r);
    cr_assert_eq(r.status, 0, "%s", r.err);
    const char *at = r.out;
    cr_assert(step_line(id, "step_us", &at, &p1, &m1));
    cr_assert(step_line(id, "step_us", &at, &p2, &m2));
    cr_assert_neq(m1, m2, "the two measurements differ");
    at = r.out;
    cr_assert(step_line(id, "step_us_median", &at, &pm, &mm));
    cr_assert_neq(p1, p2, "the second line's host is not the profile's");
    cr_assert_leq(fabs(mm - (m1 + m2) / 2.0), 0.5);
    double q = (m1 / p1 + m2 / p2) / 2.0;
    cr_assert_leq(fabs(pm - mm / q), 0.5, "%g vs %g", pm, mm / q);
    double e;
    cr_assert(sscanf(strstr(at, "\"rel_err\""), "\"rel_err\": %lf", &e) == 1);
    cr_assert_float_eq(e, 1.0 / q - 1.0, 1e-6);
    cr_assert(strstr(at, "\"measurements\": 2}") != NULL, "%s", at);
    cli_run_free(&r);
}

/* One measurement per case: no repeated line. */
Test(cli_search, validate_single_measurements_have_no_median)
{
    static const char *const args[] = {
        "validate", "--gpu", "h200", "tests/data/validate/cases.jsonl", NULL};
    cli_run r;

    cli_exec(args, &r);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_null(strstr(r.out, "repeated cases"), "%s", r.out);
    cli_run_free(&r);
}

/* plan --host-probe-us: the host benchmark of the machine that will run
 * the step times its host costs (docs/STEP_TIME.md "The host's speed"):
 * mlp10's bf16 step is host-bound, so a host three times slower than
 * the profile's makes it slower. */
static double first_step_seconds(const char *probe)
{
    const char *args[] = {"plan", "models/mlp10.yaml", "--gpu", "h200",
                          "--format", "json", probe ? "--host-probe-us"
                                                    : NULL,
                          probe, NULL};
    cli_run r;
    double t = 0;

    cli_exec(args, &r);
    cr_assert_eq(r.status, 0, "%s", r.err);
    const char *p = strstr(r.out, "\"step_seconds\": ");
    cr_assert_not_null(p, "%s", r.out);
    cr_assert(sscanf(p, "\"step_seconds\": %lf", &t) == 1);
    cli_run_free(&r);
    return t;
}

Test(cli_search, plan_times_the_step_on_the_given_host)
{
    double own = first_step_seconds(NULL);
    cr_assert_gt(first_step_seconds("5000"), 1.5 * own);
    cr_assert_float_eq(first_step_seconds("1678.14"), own, 1e-6);
}

Test(cli_search, host_probe_needs_a_gpu_profile_with_one)
{
    static const char *const none[] = {"plan", "models/mlp10.yaml",
                                       "--host-probe-us", "2000", NULL};
    static const char *const h100[] = {"plan", "models/mlp10.yaml", "--gpu",
                                       "h100-80g", "--host-probe-us", "2000",
                                       NULL};
    cli_run r;

    cli_exec(none, &r);
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "--host-probe-us needs --gpu"), "%s",
                       r.err);
    cli_run_free(&r);
    cli_exec(h100, &r);
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "no host benchmark"), "%s", r.err);
    cli_run_free(&r);
}

/* The search options a command does not use are refused by name. */
Test(cli_search, maxbatch_refuses_plans_options)
{
    static const char *const gb[] = {"maxbatch", "models/mlp10.yaml", "--gpu",
                                     "h200", "--global-batch", "8", NULL};
    static const char *const hp[] = {"maxbatch", "models/mlp10.yaml", "--gpu",
                                     "h200", "--host-probe-us", "2000", NULL};
    static const char *const tq[] = {"techniques", "models/mlp10.yaml",
                                     "--gpu", "h200", "--global-batch", "8",
                                     NULL};
    cli_run r;

    cli_exec(gb, &r);
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "--global-batch is plan's"), "%s", r.err);
    cli_run_free(&r);
    cli_exec(hp, &r);
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "--host-probe-us"), "%s", r.err);
    cli_run_free(&r);
    cli_exec(tq, &r);
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "--global-batch is plan's"), "%s", r.err);
    cli_run_free(&r);
}

Test(cli_search, validate_bad_cases)
{
    GOLDEN("search_validate_bad_cases", 2, "validate",
           "tests/data/validate/bad.jsonl");
}

/* strict case lines: JSON only, unknown fields named, later fields
 * refused, no zero or non-finite measurement, the env line first; each
 * error with line:column and a caret */
Test(cli_search, validate_strict_lines)
{
    GOLDEN("search_validate_strict", 3, "validate",
           "tests/data/validate/strict.jsonl");
}
/* a long line is shown as a window around the error */
Test(cli_search, validate_long_line)
{
    GOLDEN("search_validate_long_line", 3, "validate",
           "tests/data/validate/long-line.jsonl");
}
/* A device is refused before it is read (it once grew to 24 GB). */
Test(cli_search, validate_binary_file)
{
    GOLDEN("search_validate_dev_zero", 2, "validate", "/dev/zero");
}

/* --- validate: bounds ----------------------------------------------------- */

Test(cli_search, validate_within_bounds)
{
    GOLDEN("search_validate_bounds_ok", 0, "validate",
           "tests/data/validate/cases.jsonl", "--outliers",
           "tests/data/validate/bounds.json");
}
/* a phase peak 5 % off: over the bound, the case named; exit 1 */
Test(cli_search, validate_bound_exceeded)
{
    GOLDEN("search_validate_bound_exceeded", 1, "validate",
           "tests/data/validate/perturbed-step.jsonl", "--outliers",
           "tests/data/validate/bounds.json");
}
/* peak_alloc 5 % off its phase peaks: the measurements disagree */
Test(cli_search, validate_peaks_disagree)
{
    GOLDEN("search_validate_peaks_disagree", 3, "validate",
           "tests/data/validate/perturbed-peak.jsonl");
}
/* an outlier no longer at its documented error fails too */
Test(cli_search, validate_stale_outlier)
{
    GOLDEN("search_validate_stale_outlier", 1, "validate",
           "tests/data/validate/stale.jsonl", "--outliers",
           "tests/data/validate/bounds.json");
}
Test(cli_search, validate_max_error)
{
    GOLDEN("search_validate_max_error", 1, "validate",
           "tests/data/validate/maxbatch.jsonl", "--max-error",
           "max_batch=0.01/0.5");
}
Test(cli_search, validate_max_error_unknown_group)
{
    GOLDEN("search_validate_max_error_group", 2, "validate",
           "tests/data/validate/cases.jsonl", "--max-error", "allocted=1");
}
Test(cli_search, validate_bounds_file_error)
{
    GOLDEN("search_validate_bounds_bad", 3, "validate",
           "tests/data/validate/cases.jsonl", "--outliers",
           "tests/data/validate/bounds-bad.json");
}
Test(cli_search, validate_file_without_bounds)
{
    GOLDEN("search_validate_no_section", 2, "validate",
           "tests/data/validate/maxbatch.jsonl", "--outliers",
           "tests/data/validate/bounds-nosection.json");
}

/* a set whose fields a later version reads: every case must be refused
 * as not supported yet, and one that runs fails the check */
Test(cli_search, validate_not_modelled_set)
{
    GOLDEN("search_validate_not_modelled", 0, "validate",
           "tests/data/validate/later.jsonl", "--outliers",
           "tests/data/validate/bounds.json");
}
Test(cli_search, validate_not_modelled_set_runs)
{
    GOLDEN("search_validate_not_modelled_runs", 1, "validate",
           "tests/data/validate/later-runs.jsonl", "--outliers",
           "tests/data/validate/bounds.json");
}
Test(cli_search, validate_not_cases)
{
    GOLDEN("search_validate_not_cases", 0, "validate",
           "tests/data/validate/sweeps.jsonl", "--outliers",
           "tests/data/validate/bounds.json");
}

/* --- usage errors ------------------------------------------------------- */

Test(cli_search, maxbatch_without_budget)
{
    GOLDEN("search_maxbatch_no_budget", 2, "maxbatch", "models/mlp10.yaml");
}
Test(cli_search, maxbatch_fraction_without_gpu)
{
    GOLDEN("search_maxbatch_fraction_no_gpu", 2, "maxbatch",
           "models/mlp10.yaml", "--budget", "0.5");
}
Test(cli_search, maxbatch_checkpoint_auto)
{
    GOLDEN("search_maxbatch_checkpoint_auto", 2, "maxbatch",
           "models/mlp10.yaml", "--budget", "4GiB", "--checkpoint", "auto");
}
Test(cli_search, plan_without_gpu)
{
    GOLDEN("search_plan_no_gpu", 2, "plan", "models/mlp10.yaml",
           "--global-batch", "64", "--budget", "3GiB");
}
Test(cli_search, plan_fraction_without_gpu)
{
    GOLDEN("search_plan_fraction_no_gpu", 2, "plan", "models/mlp10.yaml",
           "--budget", "0.5");
}
Test(cli_search, plan_global_batch_zero)
{
    GOLDEN("search_plan_global_batch_zero", 2, "plan", "models/mlp10.yaml",
           "--gpu", "h200", "--global-batch", "0");
}
Test(cli_search, techniques_without_budget)
{
    GOLDEN("search_techniques_no_budget", 2, "techniques",
           "models/mlp10.yaml", "--batch", "8");
}
Test(cli_search, validate_without_file)
{
    GOLDEN("search_validate_no_file", 2, "validate");
}
Test(cli_search, validate_missing_file)
{
    GOLDEN("search_validate_missing_file", 2, "validate",
           "tests/data/validate/does-not-exist.jsonl");
}
Test(cli_search, validate_unknown_format)
{
    GOLDEN("search_validate_unknown_format", 2, "validate",
           "tests/data/validate/cases.jsonl", "--format", "csv");
}
