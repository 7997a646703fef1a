/* Hostile input (issue 18): each reproducer of the review ends quickly
 * with an error that names the culprit, or with the right answer
 * (docs/LIMITS.md lists every limit and its test). Golden files
 * tests/golden/hostile_*. The issue asks for 5 s each: docs/LIMITS.md
 * gives the figures; the timeouts here leave room for sanitizers on a
 * loaded machine. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include "cli_golden.h"

#include <sys/stat.h>

#define H "tests/data/hostile/"

/* ---- limits before expansion -------------------------------------------- */

Test(hostile, layers_past_the_limit, .timeout = 120)
{
    GOLDEN("hostile_layers_100000", 3, "estimate", H "layers-100000.yaml");
}

Test(hostile, nested_repeats_refused_before_building, .timeout = 120)
{
    GOLDEN("hostile_ops_nested_repeat", 3, "estimate",
           H "ops-nested-repeat.yaml");
}

Test(hostile, moe_op_limit_has_a_position, .timeout = 120)
{
    GOLDEN("hostile_moe_ops", 3, "estimate", H "moe-ops.yaml");
}

/* ---- accumulation in closed form ----------------------------------------- */

Test(hostile, largest_accum_is_closed_form, .timeout = 120)
{
    GOLDEN("hostile_accum_max", 0, "estimate", "models/mlp10.yaml",
           "--batch", "2", "--seq", "256", "--accum", "4294967295",
           "--format", "json");
}

Test(hostile, accum_past_32_bits_is_an_option_error, .timeout = 120)
{
    GOLDEN("hostile_accum_33bit_option", 2, "estimate", "models/mlp10.yaml",
           "--accum", "4294967297");
}

Test(hostile, timeline_rows_are_capped, .timeout = 120)
{
    GOLDEN("hostile_timeline_cap", 3, "estimate", "models/mlp10.yaml",
           "--batch", "1", "--seq", "64", "--accum", "4294967295",
           "--timeline", "/dev/null");
}

/* ---- case lines ------------------------------------------------------------- */

Test(hostile, case_accum_past_32_bits, .timeout = 120)
{
    GOLDEN("hostile_case_accum_33bit", 3, "validate",
           H "case-accum-33bit.jsonl");
}

/* The review's `accum` 10^6 case line, which hung validate and fit: the
 * closed form makes it one simulation (0.2 s). */
Test(hostile, case_accum_a_million_ends, .timeout = 120)
{
    GOLDEN("hostile_case_accum_1e6", 0, "validate",
           H "case-accum-1e6.jsonl");
}

Test(hostile, fit_case_accum_a_million_ends, .timeout = 120)
{
    GOLDEN("hostile_fit_case_accum_1e6", 0, "fit", H "case-accum-1e6.jsonl");
}

Test(hostile, case_measured_zero, .timeout = 120)
{
    GOLDEN("hostile_case_measured_zero", 3, "validate",
           H "case-measured-zero.jsonl");
}

Test(hostile, case_step_ms_overflow, .timeout = 120)
{
    GOLDEN("hostile_case_step_ms_inf", 3, "validate",
           H "case-step-ms-inf.jsonl");
}

Test(hostile, case_without_id, .timeout = 120)
{
    GOLDEN("hostile_case_no_id", 3, "validate", H "case-no-id.jsonl");
}

Test(hostile, env_not_an_object, .timeout = 120)
{
    GOLDEN("hostile_env_not_object", 3, "validate", H "env-not-object.jsonl");
}

Test(hostile, fit_device_used_past_64_bits, .timeout = 120)
{
    GOLDEN("hostile_fit_device_used_max", 3, "fit",
           H "fit-device-used-max.jsonl");
}

/* ---- options ---------------------------------------------------------------- */

Test(hostile, budget_of_a_fraction_of_a_byte, .timeout = 120)
{
    GOLDEN("hostile_budget_fraction", 2, "maxbatch", "models/mlp10.yaml",
           "--budget", "1.5");
}

Test(hostile, techniques_nothing_fits_exits_1, .timeout = 120)
{
    GOLDEN("hostile_techniques_nothing_fits", 1, "techniques",
           "models/mlp10.yaml", "--budget", "1MiB", "--seq", "64");
}

Test(hostile, compare_with_no_layout_has_no_global_batch, .timeout = 120)
{
    GOLDEN("hostile_compare_no_layout", 1, "compare", "models/gpt2-small.yaml",
           "--gpus", "1000000", "--gpu", "h200");
}

/* ---- files ------------------------------------------------------------------ */

Test(hostile, directory_says_why, .timeout = 120)
{
    GOLDEN("hostile_model_directory", 2, "estimate", "tests/data/hostile");
}

/* The command args (NULL-terminated, at most 8) with "@" replaced by a
 * FIFO named `name` that nothing writes: refused at once, not waited on. */
static void expect_fifo_refused(const char *name, const char *const *args)
{
    char path[] = "/tmp/vramplan-fifo-XXXXXX", fifo[64];
    const char *argv[9];
    size_t n = 0;
    cli_run r;

    cr_assert_not_null(mkdtemp(path));
    snprintf(fifo, sizeof fifo, "%s/%s", path, name);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    for (; args[n] != NULL && n < 8; n++)
        argv[n] = strcmp(args[n], "@") == 0 ? fifo : args[n];
    argv[n] = NULL;
    cli_exec(argv, &r);
    unlink(fifo);
    rmdir(path);
    cr_expect_eq(r.status, 2, "status %d: %s", r.status, r.err);
    cr_expect(strstr(r.err, "not a regular file") != NULL, "%s", r.err);
    cli_run_free(&r);
}

Test(hostile, fifo_is_refused_without_waiting, .timeout = 120)
{
    expect_fifo_refused("model.yaml",
                        (const char *const[]){"estimate", "@", NULL});
}

/* calibrate's own inputs (--from-raw, --sweep) blocked on a FIFO. */
Test(hostile, calibrate_from_a_fifo_is_refused_without_waiting,
     .timeout = 120)
{
    expect_fifo_refused("raw.jsonl",
                        (const char *const[]){"calibrate", "--from-raw", "@",
                                              "--gpu", "h200", NULL});
}

Test(hostile, calibrate_from_a_directory_says_why, .timeout = 120)
{
    GOLDEN("hostile_calibrate_directory", 2, "calibrate", "--from-raw",
           "tests/data/hostile", "--gpu", "h200");
}

/* One 400 KB line in a model: the error shows a window of it. */
Test(hostile, a_long_source_line_is_cut, .timeout = 120)
{
    char path[] = "/tmp/vramplan-long-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs("name: x\nseq: [", f);
    for (int i = 0; i < 100000; i++)
        fputs("1, ", f);
    fputs("1]\n", f);
    fclose(f);
    cli_run r;
    cli_exec((const char *const[]){"estimate", path, NULL}, &r);
    unlink(path);
    cr_expect_eq(r.status, 3, "status %d", r.status);
    cr_expect_lt(strlen(r.err), 1024, "%zu bytes of error", strlen(r.err));
    cr_expect(strstr(r.err, "...") != NULL, "%s", r.err);
    cli_run_free(&r);
}

/* A search simulates its model tens of times: it takes at most
 * VP_MAX_SEARCH_OPS ops (300 layers are 4205), refused before the first
 * simulation. */
Test(hostile, search_past_its_op_limit, .timeout = 120)
{
    GOLDEN("hostile_search_ops", 3, "plan", H "search-ops.yaml", "--gpu",
           "h200");
}
