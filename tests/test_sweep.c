/* The PyTorch kernel sweep (scripts/h200_sweeps.py): its parser, its fits
 * (src/fit_curves.c) and the profile keys they fill. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/gpu.h"
#include "vramplan/timing.h"
#include "vramplan/vramplan.h"

#define SWEEP "groundtruth/h200-torch2.11-sweeps.jsonl"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

static void fit_file(vp_gpu_measured *m)
{
    size_t len;
    char *buf = slurp(SWEEP, &len);
    vp_error err;
    vp_sweep *w = vp_sweep_parse(buf, len, SWEEP, &err);
    free(buf);
    cr_assert_not_null(w, "%s:%u: %s", err.path, err.line, err.msg);
    memset(m, 0, sizeof *m);
    cr_assert_eq(vp_sweep_fit(w, m, &err), VP_OK, "%s", err.msg);
    vp_sweep_free(w);
}

static void close_rel(double got, double want, const char *what)
{
    cr_assert(fabs(got - want) <= 1e-4 * fabs(want),
              "%s: %.6g, the profile has %.6g", what, got, want);
}

/* gpus/h200.yaml's measured section is what the fitter makes of the
 * sweep (nothing adjusted by hand) */
Test(sweep, the_h200_profile_is_the_fit_of_the_sweep)
{
    vp_gpu_measured m;
    fit_file(&m);
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load("h200", &err);
    cr_assert_not_null(p, "%s", err.msg);
    const vp_gpu_measured *pm = vp_gpu_measured_get(p);
    cr_assert_not_null(pm);
    for (int t = 0; t < VP_GPU__DTYPES; t++)
        if (m.gemm[t].points) {
            close_rel(m.gemm[t].peak_tflops, pm->gemm[t].peak_tflops,
                      "GEMM peak");
            close_rel(m.gemm[t].k_half, pm->gemm[t].k_half, "GEMM k_half");
        }
    for (int i = 0; i < VP_GPU__ATTN; i++)
        for (int d = 0; d < 2; d++)
            close_rel(m.attention[i][d].peak_tflops,
                      pm->attention[i][d].peak_tflops, "attention peak");
    for (int k = 0; k < VP_GPU__MEM; k++) {
        close_rel(m.membound[k].peak, pm->membound[k].peak, "membound peak");
        close_rel(m.membound[k].fixed_us, pm->membound[k].fixed_us,
                  "membound fixed");
    }
    for (int o = 0; o < VP_GPU__OPTIM; o++)
        for (int d = 0; d < 2; d++)
            close_rel(m.optimizer[o][d].bytes_per_param,
                      pm->optimizer[o][d].bytes_per_param,
                      "optimizer bytes");
    close_rel(m.dispatch_us.median, pm->dispatch_us.median, "dispatch");
    vp_gpu_free(p);
}

/* Every family is present and physical: GEMM peaks below the datasheet,
 * copy near the HBM bandwidth, fused AdamW streaming fewer bytes than
 * foreach */
Test(sweep, fits_are_physical)
{
    vp_gpu_measured m;
    fit_file(&m);
    cr_assert(m.gemm[VP_GPU_BF16].points > 0);
    cr_assert_lt(m.gemm[VP_GPU_BF16].peak_tflops, 989.4);
    cr_assert_gt(m.gemm[VP_GPU_BF16].peak_tflops, 600.0);
    cr_assert_gt(m.gemm[VP_GPU_BF16].k_half, 0.0);
    double copy = m.membound[VP_HW_MEM_COPY].peak;
    cr_assert(copy > 3500 && copy < 4800, "copy %g GB/s", copy);
    cr_assert_lt(m.membound[VP_HW_MEM_SOFTMAX].peak, copy);
    cr_assert_lt(m.optimizer[VP_HW_OPTIM_ADAMW_FUSED][0].bytes_per_param,
                 m.optimizer[VP_HW_OPTIM_ADAMW][0].bytes_per_param);
    /* at least AdamW's 28 bytes of fp32 state read and written */
    cr_assert_geq(m.optimizer[VP_HW_OPTIM_ADAMW_FUSED][0].bytes_per_param,
                  28.0);
    cr_assert_gt(m.dispatch_us.median, 1.0);
}

static void bad(const char *text, uint32_t line, const char *needle)
{
    vp_error err;
    vp_sweep *w = vp_sweep_parse(text, strlen(text), "s.jsonl", &err);
    cr_assert_null(w, "accepted: %s", text);
    cr_assert_eq(err.line, line, "line %u for: %s (%s)", err.line, text,
                 err.msg);
    cr_assert_not_null(strstr(err.msg, needle), "'%s' not in: %s", needle,
                       err.msg);
}

Test(sweep, bad_lines_name_their_line)
{
    const char *ok = "{\"kind\": \"launch\", \"us_per_kernel\": 9.2}\n";
    char two[512];
    snprintf(two, sizeof two, "%s{\"kind\": \"gemm\", \"dtype\": \"bf16\", "
                              "\"m\": 64, \"k\": 64, \"ms\": 0.01}\n",
             ok);
    bad(two, 2, "\"n\"");
    snprintf(two, sizeof two, "%s{\"kind\": \"warp\"}\n", ok);
    bad(two, 2, "warp");
    snprintf(two, sizeof two, "%s%s{\"kind\": \"membound\", \"op\": "
                              "\"copy\", \"bytes\": 1024, \"ms\": -1}\n",
             ok, ok);
    bad(two, 3, "at least 0");
    snprintf(two, sizeof two, "%s{\"kind\": \"sdpa\", \"impl\": \"magic\"}\n",
             ok);
    bad(two, 2, "magic");
}

/* A field the sweep's kind does not have is an error that names it */
Test(sweep, unknown_field_is_named)
{
    bad("{\"kind\": \"launch\", \"us_per_kernel\": 9.2, \"us\": 1}\n", 1,
        "'us'");
}

/* A shape that failed on the GPU ("error") carries no measurement: it is
 * skipped, and the line after it still counts */
Test(sweep, failed_shape_is_skipped)
{
    const char *text =
        "{\"kind\": \"gemm\", \"dtype\": \"fp8\", \"m\": 64, \"n\": 64, "
        "\"k\": 64, \"error\": \"RuntimeError('no fp8')\"}\n"
        "{\"kind\": \"launch\", \"us_per_kernel\": 9.5}\n";
    vp_error err;
    vp_sweep *w = vp_sweep_parse(text, strlen(text), "s.jsonl", &err);
    cr_assert_not_null(w, "%s", err.msg);
    vp_gpu_measured m;
    memset(&m, 0, sizeof m);
    cr_assert_eq(vp_sweep_fit(w, &m, &err), VP_OK, "%s", err.msg);
    cr_assert_eq(m.gemm[VP_GPU_FP8].points, 0);
    cr_assert_float_eq(m.dispatch_us.median, 9.5, 1e-12);
    vp_sweep_free(w);
}

/* The new keys survive a write and a read */
Test(sweep, profile_keys_round_trip)
{
    vp_gpu_measured m;
    fit_file(&m);
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load("h100-80g", &err);
    cr_assert_not_null(p, "%s", err.msg);
    cr_assert_eq(vp_gpu_measured_set(p, &m, &err), VP_OK, "%s", err.msg);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(vp_gpu_write(p, f, &err), VP_OK, "%s", err.msg);
    fclose(f);
    vp_gpu_profile *q = vp_gpu_parse_buf(buf, len, "rt.yaml", &err);
    cr_assert_not_null(q, "%s:%u: %s", err.path, err.line, err.msg);
    const vp_gpu_measured *r = vp_gpu_measured_get(q);
    close_rel(r->attention[0][1].half_gflop, m.attention[0][1].half_gflop,
              "attention half");
    close_rel(r->membound[VP_HW_MEM_LAYERNORM].fixed_us,
              m.membound[VP_HW_MEM_LAYERNORM].fixed_us, "layernorm fixed");
    close_rel(r->optimizer[VP_HW_OPTIM_SGD][1].us_per_tensor,
              m.optimizer[VP_HW_OPTIM_SGD][1].us_per_tensor, "sgd tensor");
    close_rel(r->gemm[VP_GPU_BF16].k_half, m.gemm[VP_GPU_BF16].k_half,
              "k_half");
    cr_assert_eq(r->dispatch_us.n, m.dispatch_us.n);
    free(buf);
    vp_gpu_free(q);
    vp_gpu_free(p);
}
