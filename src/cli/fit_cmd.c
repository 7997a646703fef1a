/* vramplan fit: fit the framework constants of the simulator (the CUDA
 * context outside the allocator) to measured training runs. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum { O_MODELS, O_GPU, O_OUT };

static const cli_opt OPTS[] = {
    {.id = O_MODELS, .name = "models", .metavar = "DIR",
     .type = CLI_ARG_STRING, .repeat = true,
     .help = "a directory of model files (repeatable; then models/)"},
    {.id = O_GPU, .short_name = 'g', .name = "gpu", .metavar = "PROFILE",
     .type = CLI_ARG_STRING,
     .help = "the profile whose context is the starting point and that "
             "--out extends (default: the profile matching the file's "
             "env.gpu, else the built-in default context)"},
    {.id = O_OUT, .short_name = 'o', .name = "out", .metavar = "FILE",
     .type = CLI_ARG_STRING,
     .help = "write the profile with the fitted constants in its "
             "measured.framework section"},
    CLI_HELP_ROW,
};

static void fit_help(FILE *f)
{
    cli_help_page(
        f,
        "Usage: vramplan fit MEASURED.jsonl... [OPTIONS]\n"
        "\n"
        "Fit the simulator's framework constants to measured runs in the\n"
        "ground-truth schema (shared/groundtruth: one JSON object a line, "
        "the\n"
        "first holding the environment), by least squares on relative "
        "errors:\n"
        "\n"
        "  context_bytes   the CUDA context and libraries outside "
        "PyTorch's\n"
        "                  allocator: device_used = peak_reserved + "
        "context\n"
        "\n"
        "The constant is fitted to the measured reserved and device bytes; "
        "the\n"
        "residuals printed are those of the simulated device_used (each "
        "case\n"
        "simulated as `vramplan validate` does) before and after the fit.\n"
        "The cuBLAS workspace is not fitted: PyTorch sets it exactly (32 "
        "MiB\n"
        "from compute capability 9.0, else 8519680 B). Case lines are "
        "checked\n"
        "as validate checks them; max-batch and multi-GPU lines are "
        "skipped.\n"
        "\n"
        "Options:\n",
        OPTS, sizeof OPTS / sizeof OPTS[0],
        "\n");
}

/* The profile to start from: --gpu, else the one of the first file's env
 * line. *p NULL when none; -1, or the exit status. */
static int start_profile(const cli_args *a, vp_gpu_profile **p)
{
    const char *gpu = a->v[O_GPU].given ? a->v[O_GPU].text : NULL;
    const char *file = a->operands[0];
    char named[128] = "";
    vp_error err;
    int rc = -1;

    *p = NULL;
    if (gpu == NULL) {
        vp_gt_file *f = vp_gt_open(file, &err);
        if (f == NULL)
            return cli_report(&err, NULL);
        if (vp_gt_file_env(f) != NULL)
            snprintf(named, sizeof named, "%s", vp_gt_file_env(f)->gpu);
        vp_gt_close(f);
        gpu = named[0] ? vp_gpu_match_device(named) : NULL;
        if (gpu == NULL && a->v[O_OUT].given)
            return cli_fail("no profile in gpus/ matches the GPU '%s' of %s; "
                            "give --gpu", named, file);
    }
    if (gpu != NULL && (*p = cli_gpu_load(gpu, &rc)) == NULL)
        return rc;
    return -1;
}

static void print_summary(const char *label, double med, double mx,
                          double rms, size_t n)
{
    printf("device_used %s: %zu cases, median |err| %.2f%%, max |err| "
           "%.2f%%, rms %.2f%%\n",
           label, n, 100.0 * med, 100.0 * mx, 100.0 * rms);
}

static void print_fit(const vp_fit_result *r, const vp_gpu_profile *p)
{
    printf("%-40s %16s %16s %9s %9s\n", "case", "measured", "reserved",
           "before", "after");
    for (size_t i = 0; i < r->n_cases; i++) {
        const vp_fit_case *c = &r->cases[i];
        printf("%-40s %16" PRIu64 " %16" PRIu64 " %+8.2f%% %+8.2f%%\n", c->id,
               c->measured_device, c->predicted_reserved,
               100.0 * c->err_before, 100.0 * c->err_after);
    }
    if (r->skipped)
        printf("skipped %zu cases (first: %s)\n", r->skipped, r->skip_note);
    char se[64];
    if (isfinite(r->context_sd_bytes))
        snprintf(se, sizeof se, "standard error %.0f B", r->context_sd_bytes);
    else
        snprintf(se, sizeof se, "exact for one case: no standard error");
    printf("context_bytes: %" PRIu64 " -> %" PRIu64 " (%s)%s%s\n",
           r->context_before, r->context_after, se, p ? ", profile " : "",
           p ? vp_gpu_name(p) : "");
    print_summary("before", r->median_abs_before, r->max_abs_before,
                  r->rms_before, r->n_cases);
    print_summary("after", r->median_abs_after, r->max_abs_after,
                  r->rms_after, r->n_cases);
}

/* The profile with the fitted context in its measured section. */
static int write_profile(const cli_args *a, vp_gpu_profile *p,
                         const vp_fit_result *r)
{
    const char *out = a->v[O_OUT].text;
    const vp_gpu_measured *old = vp_gpu_measured_get(p);
    vp_gpu_measured m;
    char list[120] = "";
    vp_error err;
    FILE *f = NULL;

    if (old)
        m = *old;
    else
        memset(&m, 0, sizeof m);
    m.context_bytes = r->context_after;
    for (size_t i = 0; i < a->n_operands; i++) {
        const char *base = strrchr(a->operands[i], '/');
        size_t used = strlen(list);
        base = base ? base + 1 : a->operands[i];
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                 base);
    }
    snprintf(m.framework_source, sizeof m.framework_source,
             "vramplan fit: %zu cases of %s; device_used = peak_reserved + "
             "context, least squares on relative errors (standard error "
             "%.0f B)", r->n_cases, list,
             isfinite(r->context_sd_bytes) ? r->context_sd_bytes : 0.0);
    vp_status st = vp_gpu_measured_set(p, &m, &err);
    if (st == VP_OK && !(f = fopen(out, "w")))
        st = vp_error_set(&err, VP_EIO, "cannot write '%s': %s", out,
                          strerror(errno));
    if (st == VP_OK)
        st = vp_gpu_write(p, f, &err);
    if (f && fclose(f) != 0 && st == VP_OK)
        st = vp_error_set(&err, VP_EIO, "cannot write '%s': %s", out,
                          strerror(errno));
    if (st != VP_OK)
        return cli_report(&err, NULL);
    printf("wrote %s\n", out);
    return CLI_OK;
}

static int fit_run(const cli_args *a, const char **dirs, size_t n_dirs)
{
    vp_gpu_profile *p = NULL;
    vp_fit_result r;
    vp_error err;
    int rc = start_profile(a, &p);
    uint64_t ctx0 = p != NULL ? vp_gpu_context_bytes(p, NULL)
                              : VP_DEFAULT_CONTEXT_BYTES;

    if (rc >= 0)
        return rc;
    if (vp_fit_framework(a->operands, a->n_operands, dirs, n_dirs, ctx0, &r,
                         &err) != VP_OK) {
        rc = cli_report(&err, NULL);
    } else {
        print_fit(&r, p);
        rc = a->v[O_OUT].given ? write_profile(a, p, &r) : CLI_OK;
        vp_fit_result_destroy(&r);
    }
    vp_gpu_free(p);
    return rc;
}

int cli_fit(int argc, char **argv)
{
    cli_spec spec = {OPTS, sizeof OPTS / sizeof OPTS[0], 0, SIZE_MAX, "",
                     false, fit_help};
    const char **dirs = NULL;
    cli_args a;
    int rc = cli_args_parse(&spec, argc, argv, &a);

    if (rc < 0 && a.n_operands == 0)
        rc = cli_usage_error("fit needs a MEASURED.jsonl file");
    if (rc < 0 && (dirs = malloc((a.v[O_MODELS].n_list + 1) *
                                 sizeof *dirs)) == NULL)
        rc = cli_fail("out of memory");
    if (rc < 0) {
        size_t n = 0;
        for (size_t i = 0; i < a.v[O_MODELS].n_list; i++)
            dirs[n++] = a.v[O_MODELS].list[i];
        dirs[n++] = "models";
        rc = fit_run(&a, dirs, n);
    }
    free(dirs);
    cli_args_free(&a);
    return rc;
}
