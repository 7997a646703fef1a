/* Error bounds of the validation (validate.h): metric groups, the
 * --max-error syntax, and bounds files (groundtruth/bounds.json and the
 * small ones in tests/data/validate/). */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/vramplan.h"

Test(metric_groups, every_metric_validate_makes_has_its_group)
{
    static const struct {
        const char *metric;
        int group;
    } m[] = {
        {"peak_alloc", VP_MG_ALLOCATED},
        {"rank1.peak_alloc", VP_MG_RANK_ALLOCATED},
        {"largest.peak_alloc", VP_MG_ALLOCATED},
        {"peak_reserved", VP_MG_RESERVED},
        {"rank12.peak_reserved", VP_MG_RANK_RESERVED},
        {"largest.peak_reserved", VP_MG_RESERVED},
        {"device_used", VP_MG_DEVICE_USED},
        {"rank0.device_used", VP_MG_RANK_DEVICE_USED},
        {"largest.device_used", VP_MG_DEVICE_USED},
        {"rank0.after_model", VP_MG_AFTER_MODEL},
        {"rank1.step1.fwd_peak", VP_MG_PHASES},
        {"after_model", VP_MG_AFTER_MODEL},
        {"step1.fwd_peak", VP_MG_PHASES},
        {"step16.opt_peak", VP_MG_PHASES},
        {"max_batch", VP_MG_MAX_BATCH},
        {"step_us", VP_MG_STEP_TIME},
    };

    for (size_t i = 0; i < sizeof m / sizeof *m; i++)
        cr_assert_eq(vp_metric_group_of(m[i].metric), m[i].group, "%s",
                     m[i].metric);
}

Test(metric_groups, names_validate_never_makes_have_none)
{
    static const char *const bad[] = {
        "peak", "step.fwd_peak", "step1.end", "rank.peak_alloc",
        "rank1.max_batch", "rank1.step1.end", "largest.after_model",
        "largest.step1.fwd_peak", "largest.", "peak_alloc_steady", ""};

    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(vp_metric_group_of(bad[i]), -1, "'%s'", bad[i]);
}

Test(error_bounds, max_and_median_over_max)
{
    vp_error_bound b[VP_MG__COUNT];
    vp_error err;

    cr_assert_eq(vp_error_bounds_parse("allocated=0.01/0.1,max_batch=1.5", b,
                                       &err),
                 VP_OK, "%s", err.msg);
    cr_assert(b[VP_MG_ALLOCATED].set && b[VP_MG_ALLOCATED].has_median);
    cr_assert_float_eq(b[VP_MG_ALLOCATED].median_pct, 0.01, 1e-12);
    cr_assert_float_eq(b[VP_MG_ALLOCATED].max_pct, 0.1, 1e-12);
    cr_assert(b[VP_MG_MAX_BATCH].set && !b[VP_MG_MAX_BATCH].has_median);
    cr_assert_float_eq(b[VP_MG_MAX_BATCH].max_pct, 1.5, 1e-12);
    cr_assert(!b[VP_MG_RESERVED].set);
}

Test(error_bounds, errors_name_the_item)
{
    static const struct {
        const char *spec, *msg;
    } bad[] = {
        {"allocted=1", "unknown metric group 'allocted' (did you mean "
                       "'allocated'?)"},
        {"allocated=1,allocated=2", "metric group 'allocated' given twice"},
        {"allocated", "'allocated': expected GROUP=MAX or GROUP=MEDIAN/MAX"},
        {"allocated=-1", "'allocated=-1': the bounds are percentages"},
        {"allocated=1e3", "'allocated=1e3': the bounds are percentages"},
        {"allocated=0.1/", "'allocated=0.1/': the bounds are percentages"},
        {"", "'': expected GROUP=MAX or GROUP=MEDIAN/MAX"},
    };

    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        vp_error_bound b[VP_MG__COUNT];
        vp_error err;
        cr_assert_eq(vp_error_bounds_parse(bad[i].spec, b, &err), VP_EARG,
                     "%s", bad[i].spec);
        cr_assert_not_null(strstr(err.msg, bad[i].msg), "%s: %s",
                           bad[i].spec, err.msg);
    }
}

Test(bounds_file, the_committed_bounds_hold_every_ground_truth_file)
{
    static const char *const files[] = {
        "h200-torch2.11-cases.jsonl", "h200-torch2.11-maxbatch.jsonl",
        "h200x2-torch2.11-dist.jsonl", "h200-torch2.11-extra.jsonl"};
    vp_bounds b;
    vp_error err;

    cr_assert_eq(vp_bounds_load("groundtruth/bounds.json", &b, &err), VP_OK,
                 "%s:%u:%u: %s", err.path, err.line, err.col, err.msg);
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        const vp_bounds_file *f = vp_bounds_find(&b, files[i]);
        cr_assert_not_null(f, "%s", files[i]);
        bool any = false;
        for (int g = 0; g < VP_MG__COUNT; g++)
            any |= f->bound[g].set;
        cr_assert(any, "%s has no bound", files[i]);
    }
    vp_bounds_destroy(&b);
}

Test(bounds_file, outliers_carry_their_error_and_reason)
{
    vp_bounds b;
    vp_error err;

    cr_assert_eq(vp_bounds_load("groundtruth/bounds.json", &b, &err), VP_OK,
                 "%s", err.msg);
    /* a path finds its section by the base name */
    const vp_bounds_file *f =
        vp_bounds_find(&b, "../shared/groundtruth/h200-torch2.11-cases.jsonl");
    cr_assert_not_null(f);
    const vp_outlier *o = NULL;
    for (size_t i = 0; i < f->n_outliers && o == NULL; i++)
        if (!strcmp(f->outliers[i].id, "resnet50-amp-fp16-b64") &&
            !strcmp(f->outliers[i].metric, "peak_alloc"))
            o = &f->outliers[i];
    cr_assert_not_null(o);
    cr_assert_float_eq(o->error_pct, 6.83, 1e-9);
    cr_assert_float_eq(o->tolerance_pct, 0.25, 1e-9);
    cr_assert_not_null(strstr(o->reason, "GradScaler"));
    /* every strategy of the 2-GPU file is simulated: its outliers carry
     * their errors (DDP's rebuild released early on the measured ranks) */
    f = vp_bounds_find(&b, "h200x2-torch2.11-dist.jsonl");
    cr_assert_not_null(f);
    cr_assert_gt(f->n_outliers, 0);
    for (size_t i = 0; i < f->n_outliers; i++) {
        cr_assert(!f->outliers[i].unsupported);
        cr_assert_not_null(strstr(f->outliers[i].reason, "rebuild"));
    }
    vp_bounds_destroy(&b);
}

Test(bounds_file, an_unknown_field_is_named_at_its_place)
{
    vp_bounds b;
    vp_error err;

    cr_assert_eq(vp_bounds_load("tests/data/validate/bounds-bad.json", &b,
                                &err),
                 VP_ESCHEMA);
    cr_assert_eq(err.line, 3);
    cr_assert_eq(err.col, 29);
    cr_assert_str_eq(err.msg, "unknown field 'max_eror' in a file's bounds "
                              "(did you mean 'max_error'?)");
    cr_assert_null(b.files);
}

static vp_status load_text(const char *text, vp_error *err)
{
    char path[] = "/tmp/vp-bounds-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    vp_bounds b;

    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    vp_status st = vp_bounds_load(path, &b, err);
    vp_bounds_destroy(&b);
    remove(path);
    return st;
}

Test(bounds_file, an_outlier_needs_errors_or_unsupported)
{
    vp_error err;

    cr_assert_eq(load_text("{\"files\": [{\"file\": \"a.jsonl\", \"outliers\": "
                           "[{\"id\": \"x\", \"reason\": \"r\"}]}]}",
                           &err),
                 VP_ESCHEMA);
    cr_assert_not_null(strstr(err.msg, "either"), "%s", err.msg);
    cr_assert_eq(load_text("{\"files\": [{\"file\": \"a.jsonl\", \"outliers\": "
                           "[{\"id\": \"x\", \"reason\": \"r\", \"errors\": "
                           "{\"peak_alloc\": 1}, \"unsupported\": true}]}]}",
                           &err),
                 VP_ESCHEMA);
}

Test(bounds_file, a_whole_file_not_modelled_or_not_of_cases)
{
    vp_bounds b;
    vp_error err;

    cr_assert_eq(vp_bounds_load("tests/data/validate/bounds.json", &b, &err),
                 VP_OK, "%s", err.msg);
    const vp_bounds_file *f = vp_bounds_find(&b, "later.jsonl");
    cr_assert_not_null(f);
    cr_assert_str_eq(f->not_modelled, "fine-tuning on several GPUs: a later issue");
    cr_assert_str_eq(f->not_cases, "");
    f = vp_bounds_find(&b, "sweeps.jsonl");
    cr_assert_str_eq(f->not_cases, "kernel timings, not training cases");
    vp_bounds_destroy(&b);
    /* such a file has no bounds to check */
    cr_assert_eq(load_text("{\"files\": [{\"file\": \"a.jsonl\", "
                           "\"not_modelled\": \"x\", \"max_error\": "
                           "\"allocated=1\"}]}",
                           &err),
                 VP_ESCHEMA);
}

Test(bounds_file, documented_metrics_are_metrics_validate_makes)
{
    vp_error err;

    cr_assert_eq(load_text("{\"files\": [{\"file\": \"a.jsonl\", \"outliers\": "
                           "[{\"id\": \"x\", \"reason\": \"r\", \"errors\": "
                           "{\"peak_allocated\": 1}}]}]}",
                           &err),
                 VP_ESCHEMA);
    cr_assert_not_null(strstr(err.msg, "'peak_allocated' is not a metric"),
                       "%s", err.msg);
    cr_assert_eq(load_text("{\"files\": [{\"file\": \"a.jsonl\", "
                           "\"max_error\": \"phases=x\"}]}",
                           &err),
                 VP_ESCHEMA);
    cr_assert_not_null(strstr(err.msg, "max_error:"), "%s", err.msg);
}
