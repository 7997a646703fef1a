/* vramplan validate: compare the simulator with measured runs. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vramplan/vramplan.h"

#define MAX_DIRS 16

static void validate_help(FILE *f)
{
    fputs("Usage: vramplan validate FILE.jsonl... [--models DIR]... "
          "[--format table|jsonl]\n"
          "\n"
          "Simulate every case of ground-truth files (the schema of\n"
          "shared/groundtruth: one JSON object a line, the first holding the\n"
          "environment) and compare the predicted peaks with the measured "
          "ones.\n"
          "A case's model NAME is looked up as NAME.yaml, then NAME.json "
          "(a\n"
          "Hugging Face config), in each --models DIR in order, then in "
          "models/.\n"
          "\n"
          "Options:\n"
          "  --models DIR     a directory of model files (repeatable)\n"
          "  --gpu NAME       a GPU profile: its CUDA context and cuBLAS "
          "workspace,\n"
          "                   and the step-time model's error (step_us) "
          "against\n"
          "                   each case's measured step_ms\n"
          "  --format FMT     table (default) or jsonl: one object per case "
          "and\n"
          "                   metric with id, metric, predicted, measured, "
          "rel_err\n"
          "  -h, --help       show this help\n"
          "\n"
          "The summary gives, per metric, the number of cases and the median "
          "and\n"
          "largest relative error. Exit status: 0 when every case was "
          "simulated,\n"
          "2 when a case could not be (its error is printed), 3 for a bad "
          "model.\n",
          f);
}

typedef struct {
    double *v;
    size_t n, cap;
} errs;

static int push_err(errs *e, double x)
{
    if (e->n == e->cap) {
        size_t nc = e->cap ? e->cap * 2 : 32;
        double *nv = realloc(e->v, nc * sizeof *nv);
        if (!nv)
            return -1;
        e->v = nv;
        e->cap = nc;
    }
    e->v[e->n++] = fabs(x);
    return 0;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void summary(const char *label, errs *e, bool exact)
{
    if (!e->n)
        return;
    size_t n_exact = 0;
    for (size_t i = 0; i < e->n; i++)
        n_exact += e->v[i] == 0.0;
    qsort(e->v, e->n, sizeof *e->v, dcmp);
    double med = e->n % 2 ? e->v[e->n / 2]
                          : (e->v[e->n / 2 - 1] + e->v[e->n / 2]) / 2.0;
    printf("%s: %zu cases, ", label, e->n);
    if (exact)
        printf("exact %zu, ", n_exact);
    printf("median |err| %.2f%%, max |err| %.2f%%\n", 100.0 * med,
           100.0 * e->v[e->n - 1]);
}

int cli_validate(int argc, char **argv)
{
    const char *dirs[MAX_DIRS + 1];
    size_t n_dirs = 0;
    const char *files[64];
    size_t n_files = 0;
    bool jsonl = false;
    const char *gpu = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            validate_help(stdout);
            return 0;
        } else if (!strcmp(a, "--models")) {
            if (i + 1 >= argc)
                return cli_usage_error("option '--models' needs a value");
            if (n_dirs == MAX_DIRS)
                return cli_usage_error("at most %d --models directories",
                                       MAX_DIRS);
            dirs[n_dirs++] = argv[++i];
        } else if (!strcmp(a, "--gpu")) {
            if (i + 1 >= argc)
                return cli_usage_error("option '--gpu' needs a value");
            gpu = argv[++i];
        } else if (!strcmp(a, "--format")) {
            if (i + 1 >= argc)
                return cli_usage_error("option '--format' needs a value");
            const char *f = argv[++i];
            if (!strcmp(f, "jsonl"))
                jsonl = true;
            else if (!strcmp(f, "table"))
                jsonl = false;
            else
                return cli_usage_error("unknown format '%s' (expected table "
                                       "or jsonl)",
                                       f);
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("unknown option '%s' for validate", a);
        } else {
            if (n_files == 64)
                return cli_usage_error("at most 64 files");
            files[n_files++] = a;
        }
    }
    if (!n_files)
        return cli_usage_error("validate needs a FILE.jsonl");
    dirs[n_dirs++] = "models";

    errs alloc_e = {0}, res_e = {0}, mb_e = {0}, time_e = {0};
    vp_setup base;
    vp_setup_init(&base);
    vp_hw hw;
    if (gpu) {
        vp_error gerr;
        vp_gpu_profile *gp = vp_gpu_load(gpu, &gerr);
        if (!gp) {
            fprintf(stderr, "vramplan: error: --gpu %s: %s\n", gpu,
                    gerr.msg);
            return 2;
        }
        vp_gpu_apply(gp, &base);
        base.alloc.device_total = 0; /* the cases set their own budgets */
        vp_gpu_hw(gp, VP_GPU_BF16, &hw);
        vp_hw_fill_defaults(&hw);
        vp_gpu_free(gp);
    }
    int rc = 0;
    size_t cases = 0;
    if (!jsonl)
        printf("%-40s %-16s %16s %16s %9s\n", "case", "metric", "predicted",
               "measured", "error");
    for (size_t fi = 0; fi < n_files; fi++) {
        FILE *fp = fopen(files[fi], "r");
        if (!fp) {
            fprintf(stderr, "vramplan: error: cannot open '%s': %s\n",
                    files[fi], strerror(errno));
            rc = 2;
            continue;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        unsigned long ln = 0;
        bool first = true;
        while ((len = getline(&line, &cap, fp)) > 0) {
            ln++;
            if (strspn(line, " \t\r\n") == (size_t)len)
                continue;
            if (strstr(line, "\"env\"") && ln == 1)
                continue;
            char where[512];
            snprintf(where, sizeof where, "%s:%lu", files[fi], ln);
            vp_case_result r;
            vp_error err;
            /* multi-GPU cases (scripts/collect_dist.py) carry "world" */
            vp_status st =
                strstr(line, "\"world\"")
                    ? vp_validate_dist_case(line, (size_t)len, where, dirs,
                                            n_dirs, &r, &err)
                    : vp_validate_case_on(line, (size_t)len, where, dirs,
                                          n_dirs, first, &base,
                                          gpu ? &hw : NULL, &r, &err);
            first = false;
            cases++;
            if (st != VP_OK) {
                fprintf(stderr, "%s: error: case %s: %s\n", where,
                        r.id[0] ? r.id : "?", err.msg);
                if (rc == 0)
                    rc = st == VP_ESCHEMA || st == VP_ESYNTAX ? 3 : 2;
                continue;
            }
            for (size_t k = 0; k < r.n_metrics; k++) {
                const vp_metric *m = &r.metrics[k];
                if (jsonl)
                    printf("{\"id\": \"%s\", \"metric\": \"%s\", "
                           "\"predicted\": %llu, \"measured\": %llu, "
                           "\"rel_err\": %.6f}\n",
                           r.id, m->name, (unsigned long long)m->predicted,
                           (unsigned long long)m->measured, m->rel_err);
                else
                    printf("%-40s %-16s %16llu %16llu %+8.2f%%\n",
                           k ? "" : r.id, m->name,
                           (unsigned long long)m->predicted,
                           (unsigned long long)m->measured,
                           100.0 * m->rel_err);
                int e = 0;
                /* per-rank metrics of multi-GPU cases: "rank1.peak_alloc" */
                const char *dot = strchr(m->name, '.');
                const char *base_name =
                    !strncmp(m->name, "rank", 4) && dot ? dot + 1 : m->name;
                if (!strcmp(base_name, "peak_alloc"))
                    e = push_err(&alloc_e, m->rel_err);
                else if (!strcmp(base_name, "peak_reserved"))
                    e = push_err(&res_e, m->rel_err);
                else if (!strcmp(m->name, "max_batch"))
                    e = push_err(&mb_e, m->rel_err);
                else if (!strcmp(m->name, "step_us"))
                    e = push_err(&time_e, m->rel_err);
                if (e) {
                    fprintf(stderr, "vramplan: error: out of memory\n");
                    free(line);
                    fclose(fp);
                    return 2;
                }
            }
        }
        free(line);
        fclose(fp);
    }
    if (!jsonl) {
        summary("allocated", &alloc_e, false); /* per rank for multi-GPU */
        summary("reserved", &res_e, false);
        summary("max_batch", &mb_e, true);
        summary("step_time", &time_e, false);
    }
    free(alloc_e.v);
    free(res_e.v);
    free(mb_e.v);
    free(time_e.v);
    if (!cases && rc == 0) {
        fprintf(stderr, "vramplan: error: no cases in the input\n");
        rc = 2;
    }
    return rc;
}
