/* vramplan fit: fit the framework constants of the simulator (the CUDA
 * context outside the allocator) to measured training runs. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/gpu.h"
#include "vramplan/vramplan.h"

#define MAX_DIRS 16
#define MAX_FILES 64

static void fit_help(FILE *f)
{
    fputs(
        "Usage: vramplan fit MEASURED.jsonl... [--models DIR]... [--gpu "
        "PROFILE]\n"
        "                    [--out FILE]\n"
        "\n"
        "Fit the simulator's framework constants to measured runs in the\n"
        "ground-truth schema (shared/groundtruth: one JSON object a line, the\n"
        "first holding the environment), by least squares on relative "
        "errors:\n"
        "\n"
        "  context_bytes   the CUDA context and libraries outside PyTorch's\n"
        "                  allocator: device_used = peak_reserved + "
        "context\n"
        "\n"
        "The constant is fitted to the measured reserved and device bytes; "
        "the\n"
        "residuals printed are those of the simulated device_used (each "
        "case\n"
        "simulated as `vramplan validate` does) before and after the fit.\n"
        "The cuBLAS workspace is not fitted: PyTorch sets it exactly (32 MiB\n"
        "from compute capability 9.0, else 8519680 B).\n"
        "\n"
        "Options:\n"
        "  --models DIR      a directory of model files (repeatable; then\n"
        "                    models/)\n"
        "  -g, --gpu PROFILE the profile whose context is the starting point\n"
        "                    and that --out extends (default: the profile\n"
        "                    matching the file's env.gpu, else the built-in\n"
        "                    default context)\n"
        "  -o, --out FILE    write the profile with the fitted constants in\n"
        "                    its measured.framework section\n"
        "  -h, --help        show this help\n"
        "\n"
        "Exit status: 0 done, 2 usage or I/O error, 3 invalid input.\n",
        f);
}

/* The GPU named on the env line of a ground-truth file ("" if none). */
static void env_gpu(const char *file, char *out, size_t n)
{
    out[0] = '\0';
    FILE *f = fopen(file, "r");
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    if (getline(&line, &cap, f) > 0 && strstr(line, "\"env\"")) {
        const char *k = strstr(line, "\"gpu\"");
        if (k) {
            k += 5;
            k += strspn(k, " \t:");
            if (*k == '"') {
                k++;
                size_t len = strcspn(k, "\"");
                snprintf(out, n, "%.*s", (int)(len < n ? len : n - 1), k);
            }
        }
    }
    free(line);
    fclose(f);
}

static void print_summary(const char *label, double med, double mx,
                          double rms, size_t n)
{
    printf("device_used %s: %zu cases, median |err| %.2f%%, max |err| "
           "%.2f%%, rms %.2f%%\n",
           label, n, 100.0 * med, 100.0 * mx, 100.0 * rms);
}

int cli_fit(int argc, char **argv)
{
    const char *dirs[MAX_DIRS + 1], *files[MAX_FILES];
    size_t n_dirs = 0, n_files = 0;
    const char *gpu = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fit_help(stdout);
            return 0;
        } else if (!strcmp(a, "--models") || !strcmp(a, "-g") ||
                   !strcmp(a, "--gpu") || !strcmp(a, "-o") ||
                   !strcmp(a, "--out")) {
            if (!v)
                return cli_usage_error("option '%s' needs a value", a);
            i++;
            if (!strcmp(a, "--models")) {
                if (n_dirs == MAX_DIRS)
                    return cli_usage_error("at most %d --models directories",
                                           MAX_DIRS);
                dirs[n_dirs++] = v;
            } else if (a[1] == 'g' || !strcmp(a, "--gpu")) {
                gpu = v;
            } else {
                out = v;
            }
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("unknown option '%s' for fit", a);
        } else {
            if (n_files == MAX_FILES)
                return cli_usage_error("at most %d files", MAX_FILES);
            files[n_files++] = a;
        }
    }
    if (!n_files)
        return cli_usage_error("fit needs a MEASURED.jsonl file");
    dirs[n_dirs++] = "models";

    vp_error err;
    vp_gpu_profile *p = NULL;
    char named[128];
    if (!gpu) {
        env_gpu(files[0], named, sizeof named);
        gpu = named[0] ? vp_gpu_match_device(named) : NULL;
        if (!gpu && out) {
            fprintf(stderr,
                    "vramplan: error: no profile in gpus/ matches the GPU "
                    "'%s' of %s; give --gpu\n",
                    named, files[0]);
            return 2;
        }
    }
    if (gpu && !(p = vp_gpu_load(gpu, &err)))
        return cli_gpu_error(&err);
    uint64_t ctx0;
    if (p) {
        ctx0 = vp_gpu_context_bytes(p, NULL);
    } else {
        vp_setup s;
        vp_setup_init(&s);
        ctx0 = s.context_bytes;
    }

    vp_fit_result r;
    if (vp_fit_framework(files, n_files, dirs, n_dirs, ctx0, &r, &err) !=
        VP_OK) {
        int rc = cli_gpu_error(&err);
        vp_gpu_free(p);
        return rc;
    }
    printf("%-40s %16s %16s %9s %9s\n", "case", "measured", "reserved",
           "before", "after");
    for (size_t i = 0; i < r.n_cases; i++) {
        const vp_fit_case *c = &r.cases[i];
        printf("%-40s %16" PRIu64 " %16" PRIu64 " %+8.2f%% %+8.2f%%\n", c->id,
               c->measured_device, c->predicted_reserved,
               100.0 * c->err_before, 100.0 * c->err_after);
    }
    if (r.skipped)
        printf("skipped %zu cases (first: %s)\n", r.skipped, r.skip_note);
    printf("context_bytes: %" PRIu64 " -> %" PRIu64 " (standard error %.0f "
           "B)%s%s\n",
           r.context_before, r.context_after, r.context_sd_bytes,
           p ? ", profile " : "", p ? vp_gpu_name(p) : "");
    print_summary("before", r.median_abs_before, r.max_abs_before,
                  r.rms_before, r.n_cases);
    print_summary("after", r.median_abs_after, r.max_abs_after, r.rms_after,
                  r.n_cases);

    int rc = 0;
    if (out) {
        vp_gpu_measured m;
        const vp_gpu_measured *old = vp_gpu_measured_get(p);
        if (old)
            m = *old;
        else
            memset(&m, 0, sizeof m);
        m.context_bytes = r.context_after;
        char list[120] = "";
        for (size_t i = 0; i < n_files; i++) {
            const char *base = strrchr(files[i], '/');
            base = base ? base + 1 : files[i];
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                     base);
        }
        snprintf(m.framework_source, sizeof m.framework_source,
                 "vramplan fit: %zu cases of %s; device_used = peak_reserved "
                 "+ context, least squares on relative errors (standard "
                 "error %.0f B)",
                 r.n_cases, list, r.context_sd_bytes);
        FILE *f = NULL;
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
            rc = cli_gpu_error(&err);
        else
            printf("wrote %s\n", out);
    }
    vp_fit_result_destroy(&r);
    vp_gpu_free(p);
    return rc;
}
