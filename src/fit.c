/* Calibration and fitting: vp-calibrate's raw output, the GEMM efficiency
 * curves and collective latency/bandwidth fits, and the framework
 * constants fitted to measured training runs. Least squares on relative
 * residuals, so that a small shape weighs as much as a large one: the
 * curves through GSL (gsl_multifit_nlinear, trust region), the context,
 * which is linear, in closed form. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_blas.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_matrix.h>
#include <gsl/gsl_multifit_nlinear.h>
#include <gsl/gsl_vector.h>

#include "internal.h"
#include "json.h"
#include "vramplan/gpu.h"
#include "vramplan/validate.h"

#define MAX_SAMPLES 64
#define BIG UINT64_MAX
#define MAX_CALIB_BYTES (16u << 20)

/* ------------------------------------------------------------------ */
/* Small statistics                                                     */
/* ------------------------------------------------------------------ */

/* Median of n values (n >= 1), without changing v. */
static double median_of(const double *v, size_t n)
{
    double tmp[MAX_SAMPLES];
    if (n > MAX_SAMPLES)
        n = MAX_SAMPLES;
    memcpy(tmp, v, n * sizeof *v);
    return vp__median_sort(tmp, n);
}

static vp_gpu_stat stat_of(const double *v, size_t n)
{
    vp_gpu_stat s = {0, 0, 0, 0};
    if (!n)
        return s;
    if (n > MAX_SAMPLES)
        n = MAX_SAMPLES;
    s.median = median_of(v, n);
    s.min = s.max = v[0];
    for (size_t i = 1; i < n; i++) {
        s.min = v[i] < s.min ? v[i] : s.min;
        s.max = v[i] > s.max ? v[i] : s.max;
    }
    s.n = (uint32_t)n;
    return s;
}

/* ------------------------------------------------------------------ */
/* GSL nonlinear least squares                                          */
/* ------------------------------------------------------------------ */

typedef int (*resid_fn)(const gsl_vector *x, void *data, gsl_vector *f);
typedef int (*jac_fn)(const gsl_vector *x, void *data, gsl_matrix *j);

/* Solve for p parameters from x[] (in/out) with n residuals. *chisq gets
 * the final sum of squares and sd[] (may be NULL) the standard errors,
 * scaled by the residual variance (NaN when n == p: the fit is exact). */
static vp_status nl_solve(size_t n, size_t p, double *x, resid_fn f,
                          jac_fn df, void *data, double *chisq, double *sd,
                          const char *what, vp_error *err)
{
    if (n < p)
        return vp_error_set(err, VP_ERANGE,
                            "%s: %zu points for %zu parameters", what, n, p);
    gsl_error_handler_t *old = gsl_set_error_handler_off();
    vp_status st = VP_OK;
    gsl_multifit_nlinear_fdf fdf;
    memset(&fdf, 0, sizeof fdf);
    fdf.f = f;
    fdf.df = df;
    fdf.n = n;
    fdf.p = p;
    fdf.params = data;
    gsl_multifit_nlinear_parameters prm = gsl_multifit_nlinear_default_parameters();
    gsl_multifit_nlinear_workspace *w =
        gsl_multifit_nlinear_alloc(gsl_multifit_nlinear_trust, &prm, n, p);
    gsl_matrix *cov = gsl_matrix_alloc(p, p);
    if (!w || !cov) {
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
        goto done;
    }
    gsl_vector_view xv = gsl_vector_view_array(x, p);
    int rc = gsl_multifit_nlinear_init(&xv.vector, &fdf, w);
    int info = 0;
    if (rc == GSL_SUCCESS)
        rc = gsl_multifit_nlinear_driver(200, 1e-12, 1e-12, 0.0, NULL, NULL,
                                         &info, w);
    const gsl_vector *sol = gsl_multifit_nlinear_position(w);
    const gsl_vector *res = gsl_multifit_nlinear_residual(w);
    double c2 = 0.0;
    gsl_blas_ddot(res, res, &c2);
    bool finite = isfinite(c2);
    for (size_t i = 0; i < p; i++)
        finite = finite && isfinite(gsl_vector_get(sol, i));
    if ((rc != GSL_SUCCESS && rc != GSL_EMAXITER) || !finite) {
        st = vp_error_set(err, VP_ERANGE, "%s: the fit did not converge (%s)",
                          what, gsl_strerror(rc));
        goto done;
    }
    for (size_t i = 0; i < p; i++)
        x[i] = gsl_vector_get(sol, i);
    *chisq = c2;
    if (sd) {
        gsl_matrix *jac = gsl_multifit_nlinear_jac(w);
        gsl_multifit_nlinear_covar(jac, 0.0, cov);
        double scale = n > p ? c2 / (double)(n - p) : NAN; /* exact fit */
        for (size_t i = 0; i < p; i++)
            sd[i] = sqrt(gsl_matrix_get(cov, i, i) * scale);
    }
done:
    gsl_matrix_free(cov);
    if (w)
        gsl_multifit_nlinear_free(w);
    gsl_set_error_handler(old);
    return st;
}

/* ---- rate(W) = P W^h / (W^h + K^h); parameters log P, log K, log h -- */

typedef struct {
    const double *w, *y;
    size_t n;
} xy_data;

/* x = (log P, log K[, log h]); h = 1 when x has two entries. */
static void curve_params(const gsl_vector *x, double *P, double *K,
                         double *h)
{
    *P = exp(gsl_vector_get(x, 0));
    *K = exp(gsl_vector_get(x, 1));
    *h = x->size > 2 ? exp(gsl_vector_get(x, 2)) : 1.0;
}

static int curve_f(const gsl_vector *x, void *data, gsl_vector *f)
{
    const xy_data *d = data;
    double P, K, h;
    curve_params(x, &P, &K, &h);
    for (size_t i = 0; i < d->n; i++) {
        double u = pow(d->w[i] / K, h), m = P * u / (1.0 + u);
        gsl_vector_set(f, i, (m - d->y[i]) / d->y[i]);
    }
    return GSL_SUCCESS;
}

static int curve_df(const gsl_vector *x, void *data, gsl_matrix *j)
{
    const xy_data *d = data;
    double P, K, h;
    curve_params(x, &P, &K, &h);
    for (size_t i = 0; i < d->n; i++) {
        double lr = log(d->w[i] / K), u = exp(h * lr);
        double m = P * u / (1.0 + u), g = m / (1.0 + u) / d->y[i];
        gsl_matrix_set(j, i, 0, m / d->y[i]);
        gsl_matrix_set(j, i, 1, -h * g);
        if (x->size > 2)
            gsl_matrix_set(j, i, 2, h * lr * g);
    }
    return GSL_SUCCESS;
}

vp_status vp_fit_gemm_curve(const double *gflop, const double *tflops,
                            size_t n, vp_gpu_gemm_fit *out, vp_error *err)
{
    memset(out, 0, sizeof *out);
    if (n < 2)
        return vp_error_set(err, VP_ERANGE,
                            "a GEMM curve needs 2 points or more, got %zu",
                            n);
    double best = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!(gflop[i] > 0.0) || !(tflops[i] > 0.0) || !isfinite(gflop[i]) ||
            !isfinite(tflops[i]))
            return vp_error_set(err, VP_ERANGE,
                                "GEMM point %zu is not positive", i + 1);
        best = tflops[i] > best ? tflops[i] : best;
    }
    /* h = 1 first. Start: the peak a little over the best point, K from
     * the points under 80 % of it (K = W (P / y - 1)), their median. */
    double P0 = 1.05 * best, ks[MAX_SAMPLES];
    size_t nk = 0;
    for (size_t i = 0; i < n && nk < MAX_SAMPLES; i++)
        if (tflops[i] < 0.8 * P0)
            ks[nk++] = gflop[i] * (P0 / tflops[i] - 1.0);
    double K0 = nk ? median_of(ks, nk) : 1e-3 * gflop[0];
    if (!(K0 > 0.0))
        K0 = 1e-3;
    double x[3] = {log(P0), log(K0), 0.0}, chisq = 0.0;
    xy_data d = {gflop, tflops, n};
    vp_status st = nl_solve(n, 2, x, curve_f, curve_df, &d, &chisq, NULL,
                            "GEMM efficiency curve", err);
    if (st != VP_OK)
        return st;
    out->exponent = 1.0;
    /* then the exponent, from there; kept when it converges in range and
     * fits better */
    if (n >= 3) {
        double x3[3] = {x[0], x[1], 0.0}, c3 = 0.0;
        vp_error e3;
        if (nl_solve(n, 3, x3, curve_f, curve_df, &d, &c3, NULL,
                     "GEMM efficiency curve", &e3) == VP_OK &&
            c3 < chisq && exp(x3[2]) >= 0.25 && exp(x3[2]) <= 8.0) {
            memcpy(x, x3, sizeof x);
            chisq = c3;
            out->exponent = exp(x3[2]);
        }
    }
    out->points = (uint32_t)n;
    out->peak_tflops = exp(x[0]);
    out->half_gflop = exp(x[1]);
    out->rms_rel_err = sqrt(chisq / (double)n);
    out->best_tflops = best;
    return VP_OK;
}

/* ---- time = L + bytes * S, S = 1 / (B * 1e3) ------------------------ */

static int lat_f(const gsl_vector *x, void *data, gsl_vector *f)
{
    const xy_data *d = data;
    double L = gsl_vector_get(x, 0), S = gsl_vector_get(x, 1);
    for (size_t i = 0; i < d->n; i++)
        gsl_vector_set(f, i, (L + S * d->w[i] - d->y[i]) / d->y[i]);
    return GSL_SUCCESS;
}

static int lat_df(const gsl_vector *x, void *data, gsl_matrix *j)
{
    (void)x;
    const xy_data *d = data;
    for (size_t i = 0; i < d->n; i++) {
        gsl_matrix_set(j, i, 0, 1.0 / d->y[i]);
        gsl_matrix_set(j, i, 1, d->w[i] / d->y[i]);
    }
    return GSL_SUCCESS;
}

vp_status vp_fit_latency_bw(const double *bytes, const double *us, size_t n,
                            vp_gpu_coll_fit *out, vp_error *err)
{
    uint32_t ranks = out->ranks;
    memset(out, 0, sizeof *out);
    out->ranks = ranks;
    if (n < 2)
        return vp_error_set(err, VP_ERANGE,
                            "a latency/bandwidth fit needs 2 points or "
                            "more, got %zu",
                            n);
    size_t lo = 0, hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(bytes[i] > 0.0) || !(us[i] > 0.0))
            return vp_error_set(err, VP_ERANGE,
                                "point %zu is not positive", i + 1);
        lo = bytes[i] < bytes[lo] ? i : lo;
        hi = bytes[i] > bytes[hi] ? i : hi;
    }
    if (bytes[hi] == bytes[lo])
        return vp_error_set(err, VP_ERANGE,
                            "a latency/bandwidth fit needs two sizes");
    double S0 = (us[hi] - us[lo]) / (bytes[hi] - bytes[lo]);
    if (!(S0 > 0.0))
        S0 = us[hi] / bytes[hi];
    double x[2] = {us[lo], S0}, chisq = 0.0;
    xy_data d = {bytes, us, n};
    vp_status st = nl_solve(n, 2, x, lat_f, lat_df, &d, &chisq, NULL,
                            "latency/bandwidth fit", err);
    if (st != VP_OK)
        return st;
    if (!(x[1] > 0.0))
        return vp_error_set(err, VP_ERANGE,
                            "latency/bandwidth fit: the time does not grow "
                            "with the size");
    out->points = (uint32_t)n;
    out->latency_us = x[0];
    out->bandwidth_gbps = 1.0 / (x[1] * 1e3);
    out->rms_rel_err = sqrt(chisq / (double)n);
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* vp-calibrate's raw output                                            */
/* ------------------------------------------------------------------ */

typedef struct {
    double v[MAX_SAMPLES];
    size_t n;
} samples;

typedef struct {
    uint64_t size, count, footprint, align_log2, min_stride;
} malloc_row;

typedef struct {
    vp_gpu_coll coll;
    uint64_t ranks, bytes;
    double median_us;
} nccl_row;

#define MAX_ROWS 256

struct vp_calib {
    vp_arena arena;
    char device[128], cc[16], torch_version[64];
    uint64_t total, gpus, driver, runtime;
    uint64_t ctx_lazy[MAX_SAMPLES], ctx_eager[MAX_SAMPLES];
    size_t n_lazy, n_eager;
    malloc_row mallocs[32];
    size_t n_mallocs;
    samples max_alloc, free_bytes;
    samples launch_enq, launch_gpu, launch_sync;
    samples bw[VP_GPU__BWS];
    vp_calib_gemm_point gemm[MAX_ROWS];
    size_t n_gemm;
    nccl_row nccl[MAX_ROWS];
    size_t n_nccl;
    const char *skips[MAX_ROWS];
    size_t n_skips;
    uint64_t torch_context;
    samples torch_bf16, torch_copy, sustained;
    double seconds;
    bool has_done;
};

/* One line of the raw output, as its kind's schema read it. */
typedef struct raw_line {
    const char *kind, *program, *name, *cc, *what, *why, *version;
    int mode, test, dtype, op;
    uint64_t after_init, total, gpus, driver, runtime;
    uint64_t size, count, footprint, align_log2, min_stride;
    uint64_t m, n, k, ranks, bytes;
    double seconds;
    samples s[3];
} raw_line;

/* An array of non-negative numbers (at most MAX_SAMPLES kept). */
static vp_status read_samples(void *ctx, const vp_jval *v, vp_error *err)
{
    samples *s = (samples *)(void *)((char *)ctx + v->field->offset);
    const vp_jdoc *d = v->doc;

    s->n = 0;
    for (int c = d->nodes[v->node].first_child; c >= 0;
         c = d->nodes[c].next) {
        json_t *x = d->nodes[c].value;
        if (!json_is_number(x) || json_number_value(x) < 0.0)
            return vp__jerr(d, c, false, VP_ESCHEMA, err,
                            "'%s' must hold non-negative numbers",
                            v->field->name);
        if (s->n < MAX_SAMPLES)
            s->v[s->n++] = json_number_value(x);
    }
    if (s->n == 0)
        return vp__jerr(d, v->node, false, VP_ESCHEMA, err, "'%s' is empty",
                        v->field->name);
    return VP_OK;
}

static const char *const CONTEXT_MODES[] = {"lazy", "eager", NULL};
#define VP__S(name, str) str,
static const char *const DTYPES[] = {VP_GPU_DTYPE_MAP(VP__S) NULL};
static const char *const COLLS[] = {VP_GPU_COLL_MAP(VP__S) NULL};
static const char *const BWS[] = {VP_GPU_BW_MAP(VP__S) NULL};
#undef VP__S

#define R_INFO VP_JROW_INFO
#define R_STR(n, m) VP_JROW_STR(n, true, raw_line, m)
#define R_U64(n, lo, hi, m) VP_JROW_U64(n, true, lo, hi, raw_line, m)
#define R_ENUM(n, ch, m) VP_JROW_ENUM(n, true, ch, raw_line, m)
#define R_ARR(n, i)                                                        \
    {.name = n, .type = VP_JT_ARRAY, .required = true,                     \
     .apply = read_samples, .offset = offsetof(raw_line, s) + i * sizeof(samples)}
#define DIM (1u << 20)

static const vp_jfield K_START[] = {
    R_STR("program", program), R_INFO("version", VP_JT_U64),
    R_INFO("repeats", VP_JT_U64), R_INFO("quick", VP_JT_BOOL)};
static const vp_jfield K_CONTEXT[] = {
    R_ENUM("mode", CONTEXT_MODES, mode), R_U64("after_init", 0, BIG, after_init),
    R_INFO("after_kernel", VP_JT_U64), R_INFO("total", VP_JT_U64)};
static const vp_jfield K_DEVICE[] = {
    R_STR("name", name), R_STR("cc", cc), R_U64("total", 0, BIG, total),
    R_U64("gpus", 0, BIG, gpus), R_U64("driver", 0, BIG, driver),
    R_U64("runtime", 0, BIG, runtime), R_INFO("sms", VP_JT_U64),
    R_INFO("l2_bytes", VP_JT_U64), R_INFO("bus_width", VP_JT_U64),
    R_INFO("pci", VP_JT_STRING), R_INFO("link_speed", VP_JT_STRING),
    R_INFO("link_width", VP_JT_STRING), R_INFO("max_link_speed", VP_JT_STRING)};
static const vp_jfield K_MALLOC[] = {
    R_U64("size", 0, BIG, size), R_U64("count", 1, BIG, count),
    R_U64("footprint", 0, BIG, footprint),
    R_U64("align_log2", 0, 63, align_log2),
    R_U64("min_stride", 0, BIG, min_stride)};
static const vp_jfield K_MAX_ALLOC[] = {
    R_U64("total", 0, BIG, total), R_INFO("step", VP_JT_U64),
    R_ARR("bytes", 0), R_ARR("free", 1)};
static const vp_jfield K_LAUNCH[] = {
    R_INFO("launches", VP_JT_U64), R_ARR("enqueue_us", 0),
    R_ARR("gpu_us", 1), R_ARR("sync_us", 2)};
static const vp_jfield K_BANDWIDTH[] = {
    R_ENUM("test", BWS, test), R_INFO("bytes", VP_JT_U64),
    R_INFO("iters", VP_JT_U64), R_ARR("gbps", 0)};
static const vp_jfield K_GEMM_SETUP[] = {
    R_INFO("cublaslt_version", VP_JT_U64), R_INFO("workspace", VP_JT_U64)};
static const vp_jfield K_GEMM[] = {
    R_ENUM("dtype", DTYPES, dtype), R_U64("m", 1, DIM, m),
    R_U64("n", 1, DIM, n), R_U64("k", 1, DIM, k),
    R_INFO("layout", VP_JT_STRING), R_INFO("algos", VP_JT_U64),
    R_INFO("iters", VP_JT_U64), R_INFO("rest_ms", VP_JT_U64),
    R_ARR("tflops", 0)};
static const vp_jfield K_NCCL[] = {
    R_ENUM("op", COLLS, op), R_U64("ranks", 0, BIG, ranks),
    R_U64("bytes", 0, BIG, bytes), R_INFO("iters", VP_JT_U64),
    R_ARR("us", 0)};
static const vp_jfield K_SKIP[] = {R_STR("what", what), R_STR("why", why)};
static const vp_jfield K_TORCH[] = {
    R_STR("version", version), R_INFO("device_name", VP_JT_STRING),
    R_U64("context_used_after_init", 0, BIG, after_init),
    R_ARR("bf16_matmul_tflops", 0), R_ARR("copy_gbps", 1)};
static const vp_jfield K_DONE[] = {
    VP_JROW_NUM("seconds", true, 0, false, 1e9, raw_line, seconds)};
static const vp_jfield K_SUSTAINED[] = {
    R_ENUM("dtype", DTYPES, dtype), R_INFO("m", VP_JT_U64),
    R_INFO("n", VP_JT_U64), R_INFO("k", VP_JT_U64),
    R_INFO("iters", VP_JT_U64), R_ARR("tflops", 0)};

typedef enum {
    K_START_, K_CONTEXT_, K_DEVICE_, K_MALLOC_, K_MAX_ALLOC_, K_LAUNCH_,
    K_BANDWIDTH_, K_GEMM_SETUP_, K_GEMM_, K_NCCL_, K_SKIP_, K_TORCH_, K_DONE_,
    K_SUSTAINED_, K__COUNT
} raw_kind;

#define KIND(name, rows) {name, rows, sizeof rows / sizeof rows[0]}
static const vp_jkind KINDS[K__COUNT] = {
    KIND("start", K_START),         KIND("context", K_CONTEXT),
    KIND("device", K_DEVICE),       KIND("malloc", K_MALLOC),
    KIND("max_alloc", K_MAX_ALLOC), KIND("launch", K_LAUNCH),
    KIND("bandwidth", K_BANDWIDTH), KIND("gemm_setup", K_GEMM_SETUP),
    KIND("gemm", K_GEMM),           KIND("nccl", K_NCCL),
    KIND("skip", K_SKIP),           KIND("torch", K_TORCH),
    KIND("done", K_DONE),           KIND("gemm_sustained", K_SUSTAINED),
};

static vp_status add_gemm(vp_calib *c, const raw_line *r, const vp_jdoc *d,
                          vp_error *err)
{
    if (c->n_gemm == MAX_ROWS)
        return vp__jerr(d, 0, false, VP_ELIMIT, err,
                        "more than %d GEMM lines", MAX_ROWS);
    vp_gpu_stat st = stat_of(r->s[0].v, r->s[0].n);
    vp_calib_gemm_point *p = &c->gemm[c->n_gemm++];
    p->dtype = (vp_gpu_dtype)r->dtype;
    p->m = (uint32_t)r->m;
    p->n = (uint32_t)r->n;
    p->k = (uint32_t)r->k;
    p->gflop = 2.0 * (double)r->m * (double)r->n * (double)r->k / 1e9;
    p->median_tflops = st.median;
    p->min_tflops = st.min;
    p->max_tflops = st.max;
    return VP_OK;
}

static vp_status add_nccl(vp_calib *c, const raw_line *r, const vp_jdoc *d,
                          vp_error *err)
{
    if (c->n_nccl == MAX_ROWS)
        return vp__jerr(d, 0, false, VP_ELIMIT, err,
                        "more than %d NCCL lines", MAX_ROWS);
    c->nccl[c->n_nccl++] = (nccl_row){(vp_gpu_coll)r->op, r->ranks, r->bytes,
                                      median_of(r->s[0].v, r->s[0].n)};
    return VP_OK;
}

static vp_status apply_other(vp_calib *c, raw_kind k, const raw_line *r,
                             const vp_jdoc *d, vp_error *err)
{
    switch (k) {
    case K_SKIP_:
        if (c->n_skips < MAX_ROWS) {
            const char *t = vp__arena_printf(&c->arena, "%s: %s", r->what,
                                             r->why);
            if (t == NULL)
                return vp_error_set(err, VP_ENOMEM, "out of memory");
            c->skips[c->n_skips++] = t;
        }
        break;
    case K_TORCH_:
        snprintf(c->torch_version, sizeof c->torch_version, "%s", r->version);
        c->torch_context = r->after_init;
        c->torch_bf16 = r->s[0];
        c->torch_copy = r->s[1];
        break;
    case K_DONE_:
        c->seconds = r->seconds;
        c->has_done = true;
        break;
    case K_SUSTAINED_:
        if (r->dtype != VP_GPU_BF16)
            return vp__jerr(d, vp__jdoc_member(d, 0, "dtype"), false,
                            VP_ESCHEMA, err, "sustained rate of '%s': only "
                            "bf16 is kept", DTYPES[r->dtype]);
        c->sustained = r->s[0];
        break;
    default: /* gemm_setup: information only */
        break;
    }
    return VP_OK;
}

/* Keep what a checked line says. */
static vp_status apply_line(vp_calib *c, raw_kind k, const raw_line *r,
                            const vp_jdoc *d, vp_error *err)
{
    switch (k) {
    case K_START_:
        if (strcmp(r->program, "vp-calibrate") != 0)
            return vp__jerr(d, vp__jdoc_member(d, 0, "program"), false,
                            VP_ESCHEMA, err, "not vp-calibrate output");
        break;
    case K_CONTEXT_:
        if (r->mode == 0 && c->n_lazy < MAX_SAMPLES)
            c->ctx_lazy[c->n_lazy++] = r->after_init;
        else if (r->mode == 1 && c->n_eager < MAX_SAMPLES)
            c->ctx_eager[c->n_eager++] = r->after_init;
        break;
    case K_DEVICE_:
        snprintf(c->device, sizeof c->device, "%s", r->name);
        snprintf(c->cc, sizeof c->cc, "%s", r->cc);
        c->total = r->total;
        c->gpus = r->gpus;
        c->driver = r->driver;
        c->runtime = r->runtime;
        break;
    case K_MALLOC_:
        if (c->n_mallocs < sizeof c->mallocs / sizeof c->mallocs[0])
            c->mallocs[c->n_mallocs++] = (malloc_row){
                r->size, r->count, r->footprint, r->align_log2, r->min_stride};
        break;
    case K_MAX_ALLOC_:
        c->total = r->total;
        c->max_alloc = r->s[0];
        c->free_bytes = r->s[1];
        break;
    case K_LAUNCH_:
        c->launch_enq = r->s[0];
        c->launch_gpu = r->s[1];
        c->launch_sync = r->s[2];
        break;
    case K_BANDWIDTH_:
        c->bw[r->test] = r->s[0];
        break;
    case K_GEMM_:
        return add_gemm(c, r, d, err);
    case K_NCCL_:
        return add_nccl(c, r, d, err);
    default:
        return apply_other(c, k, r, d, err);
    }
    return VP_OK;
}

/* Check one line against its kind's schema and keep it. */
static vp_status parse_line(vp_calib *c, const char *line, size_t n,
                            const char *path, uint32_t ln, vp_error *err)
{
    int k = K_START_;
    raw_line r;
    vp_jdoc d;

    memset(&r, 0, sizeof r);
    vp_status st = vp__jdoc_parse(&d, line, n, path, ln, err);
    if (st != VP_OK)
        return st;
    st = vp__jdoc_check_kind(&d, KINDS, K__COUNT, "a calibration line", &r,
                             &k, err);
    if (st == VP_OK)
        st = apply_line(c, (raw_kind)k, &r, &d, err);
    vp__jdoc_destroy(&d);
    return st;
}

vp_calib *vp_calib_parse(const char *buf, size_t len, const char *path,
                         vp_error *err)
{
    vp_error_clear(err);
    if (!path)
        path = "<raw>";
    if (len > MAX_CALIB_BYTES) {
        vp_error_at(err, VP_ELIMIT, path, 0, 0, 0,
                    "calibration output over %u bytes", MAX_CALIB_BYTES);
        return NULL;
    }
    vp_calib *c = calloc(1, sizeof *c);
    if (!c) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        return NULL;
    }
    size_t lines = 0;
    uint32_t ln = 0;
    for (const char *p = buf, *end = buf + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        const char *line = p;
        ln++;
        p = nl ? nl + 1 : end;
        if (strspn(line, " \t\r") >= n)
            continue;
        if (parse_line(c, line, n, path, ln, err) != VP_OK) {
            vp_calib_free(c);
            return NULL;
        }
        lines++;
    }
    if (!lines) {
        vp_error_at(err, VP_ESCHEMA, path, 1, 1, 1,
                    "no measurements in the calibration output");
        vp_calib_free(c);
        return NULL;
    }
    return c;
}

void vp_calib_free(vp_calib *c)
{
    if (!c)
        return;
    vp__arena_destroy(&c->arena);
    free(c);
}

const char *vp_calib_device_name(const vp_calib *c) { return c->device; }

size_t vp_calib_skips(const vp_calib *c, const char *const **out)
{
    *out = c->skips;
    return c->n_skips;
}

size_t vp_calib_gemm_points(const vp_calib *c,
                            const vp_calib_gemm_point **out)
{
    *out = c->gemm;
    return c->n_gemm;
}

static uint64_t median_u64(const uint64_t *v, size_t n)
{
    double d[MAX_SAMPLES];
    for (size_t i = 0; i < n && i < MAX_SAMPLES; i++)
        d[i] = (double)v[i];
    return (uint64_t)llround(median_of(d, n < MAX_SAMPLES ? n : MAX_SAMPLES));
}

/* Smallest power of two g (4 KiB .. 1 GiB) such that every allocation of
 * 2 MiB or more took round_up(size, g) bytes; 0 when none fits. (Smaller
 * ones share pages: the driver packs them.) */
static uint64_t malloc_granularity(const vp_calib *c)
{
    for (uint64_t g = 4096; g <= VP_GiB; g *= 2) {
        bool ok = false;
        for (size_t i = 0; i < c->n_mallocs; i++) {
            const malloc_row *r = &c->mallocs[i];
            if (r->size < 2 * VP_MiB)
                continue;
            uint64_t want = (r->size + g - 1) / g * g;
            if (r->footprint / r->count != want) {
                ok = false;
                break;
            }
            ok = true;
        }
        if (ok)
            return g;
    }
    return 0;
}

vp_status vp_calib_reduce(const vp_calib *c, const char *source,
                          vp_gpu_measured *m, vp_error *err)
{
    memset(m, 0, sizeof *m);
    vp_error_clear(err);
    char extra[160] = "";
    if (c->driver || c->runtime)
        snprintf(extra, sizeof extra, "; CUDA driver %u.%u, runtime %u.%u",
                 (unsigned)(c->driver / 1000), (unsigned)(c->driver % 1000 / 10),
                 (unsigned)(c->runtime / 1000),
                 (unsigned)(c->runtime % 1000 / 10));
    if (c->has_done)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                 "; vp-calibrate %.1f s", c->seconds);
    if (c->torch_version[0])
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                 "; torch %.40s", c->torch_version);
    snprintf(m->source, sizeof m->source, "%.90s%s", source ? source : "",
             extra);
    snprintf(m->device_name, sizeof m->device_name, "%s", c->device);
    m->total_bytes = c->total;
    if (c->free_bytes.n)
        m->free_bytes = (uint64_t)llround(median_of(c->free_bytes.v,
                                                    c->free_bytes.n));
    if (c->max_alloc.n)
        m->max_alloc_bytes = (uint64_t)llround(median_of(c->max_alloc.v,
                                                         c->max_alloc.n));
    if (c->n_mallocs) {
        uint64_t a = 63;
        for (size_t i = 0; i < c->n_mallocs; i++)
            a = c->mallocs[i].align_log2 < a ? c->mallocs[i].align_log2 : a;
        m->malloc_alignment_bytes = (uint64_t)1 << a;
        m->malloc_granularity_bytes = malloc_granularity(c);
    }
    if (c->n_lazy)
        m->context_lazy_bytes = median_u64(c->ctx_lazy, c->n_lazy);
    if (c->n_eager)
        m->context_eager_bytes = median_u64(c->ctx_eager, c->n_eager);
    m->launch_us = stat_of(c->launch_enq.v, c->launch_enq.n);
    m->launch_gpu_us = stat_of(c->launch_gpu.v, c->launch_gpu.n);
    m->launch_sync_us = stat_of(c->launch_sync.v, c->launch_sync.n);
    for (int b = 0; b < VP_GPU__BWS; b++)
        m->bw_gbps[b] = stat_of(c->bw[b].v, c->bw[b].n);

    for (int t = 0; t < VP_GPU__DTYPES; t++) {
        double w[MAX_ROWS], y[MAX_ROWS];
        size_t n = 0;
        for (size_t i = 0; i < c->n_gemm; i++)
            if (c->gemm[i].dtype == (vp_gpu_dtype)t) {
                w[n] = c->gemm[i].gflop;
                y[n++] = c->gemm[i].median_tflops;
            }
        if (!n)
            continue;
        vp_status st = vp_fit_gemm_curve(w, y, n, &m->gemm[t], err);
        if (st != VP_OK) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
            return vp_error_set(err, st, "gemm %s: %s", vp_gpu_dtype_name((vp_gpu_dtype)t), msg);
        }
    }
    for (int o = 0; o < VP_GPU__COLLS; o++) {
        double x[MAX_ROWS], y[MAX_ROWS];
        size_t n = 0;
        uint64_t ranks = 0;
        for (size_t i = 0; i < c->n_nccl; i++)
            if (c->nccl[i].coll == (vp_gpu_coll)o) {
                x[n] = (double)c->nccl[i].bytes;
                y[n++] = c->nccl[i].median_us;
                ranks = c->nccl[i].ranks;
            }
        if (!n)
            continue;
        m->nccl[o].ranks = (uint32_t)ranks;
        vp_status st = vp_fit_latency_bw(x, y, n, &m->nccl[o], err);
        if (st != VP_OK) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
            return vp_error_set(err, st, "nccl %s: %s", vp_gpu_coll_name((vp_gpu_coll)o), msg);
        }
    }
    if (c->torch_context) {
        m->context_bytes = c->torch_context;
        snprintf(m->framework_source, sizeof m->framework_source,
                 "torch %s in the calibration run: mem_get_info used - "
                 "memory_reserved after a 1x1 matmul (as "
                 "shared/groundtruth/collect.py)",
                 c->torch_version);
    }
    m->bf16_sustained_tflops = stat_of(c->sustained.v, c->sustained.n);
    m->torch_bf16_tflops = stat_of(c->torch_bf16.v, c->torch_bf16.n);
    m->torch_copy_gbps = stat_of(c->torch_copy.v, c->torch_copy.n);
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* Framework constants from measured runs                               */
/* ------------------------------------------------------------------ */

/* The context that minimises the relative errors of device_used =
 * reserved + context over the cases, in closed form (the model is linear
 * in it): the weighted least squares with weights 1 / device_i^2,
 *     c = sum w_i (device_i - reserved_i) / sum w_i,
 * its standard error sqrt(chi^2 / (n - 1) / sum w_i) from two cases on
 * (with one the fit is exact and the error undefined: NaN). */
static void context_lsq(const double *res, const double *dev, size_t n,
                        double *c, double *sd)
{
    double sw = 0, swy = 0;
    for (size_t i = 0; i < n; i++) {
        double w = 1.0 / (dev[i] * dev[i]);
        sw += w;
        swy += w * (dev[i] - res[i]);
    }
    *c = swy / sw;
    double chi = 0;
    for (size_t i = 0; i < n; i++) {
        double r = (res[i] + *c - dev[i]) / dev[i];
        chi += r * r;
    }
    *sd = n > 1 ? sqrt(chi / (double)(n - 1) / sw) : NAN;
}

static const vp_metric *metric_named(const vp_case_result *r,
                                     const char *name)
{
    for (size_t i = 0; i < r->n_metrics; i++)
        if (!strcmp(r->metrics[i].name, name))
            return &r->metrics[i];
    return NULL;
}

static void summarise(const vp_fit_case *cs, size_t n, bool after,
                      double *rms, double *med, double *mx)
{
    double *a = malloc((n ? n : 1) * sizeof *a);
    double s = 0.0, m = 0.0;
    if (!a) {
        *rms = *med = *mx = NAN;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        double e = after ? cs[i].err_after : cs[i].err_before;
        s += e * e;
        a[i] = fabs(e);
        m = a[i] > m ? a[i] : m;
    }
    *rms = n ? sqrt(s / (double)n) : 0.0;
    *med = n ? vp__median_sort(a, n) : 0.0;
    *mx = m;
    free(a);
}

void vp_fit_result_destroy(vp_fit_result *r)
{
    if (!r)
        return;
    free(r->cases);
    r->cases = NULL;
    r->n_cases = 0;
}

static vp_status add_case(vp_fit_result *out, size_t *cap,
                          const vp_fit_case *c, vp_error *err)
{
    if (out->n_cases == *cap) {
        size_t nc = *cap ? *cap * 2 : 32;
        vp_fit_case *g = realloc(out->cases, nc * sizeof *g);
        if (!g)
            return vp_error_set(err, VP_ENOMEM, "out of memory");
        out->cases = g;
        *cap = nc;
    }
    out->cases[out->n_cases++] = *c;
    return VP_OK;
}

static void skip_case(vp_fit_result *out, const char *file, uint32_t line,
                      const char *why)
{
    if (!out->skip_note[0])
        snprintf(out->skip_note, sizeof out->skip_note, "%.120s:%" PRIu32
                 ": %.170s", file, line, why);
    out->skipped++;
}

/* Read one file's cases into out: the one-GPU training cases with a
 * measured device_used and peak_reserved. Other lines (max-batch and
 * multi-GPU cases) and cases that failed when measured are skipped and
 * counted; any other error in a line is the file's error. */
static vp_status fit_read_file(const char *file, const char *const *dirs,
                               size_t n_dirs, uint64_t ctx0,
                               vp_fit_result *out, size_t *cap,
                               vp_error *err)
{
    vp_validate_opts o = {file, 0, dirs, n_dirs, true, NULL, NULL, false, 0, 0.0};
    vp_gt_file *f = vp_gt_open(file, err);
    vp_status st = f != NULL ? VP_OK : err != NULL ? err->code : VP_EIO;
    const char *json;
    vp_case_result r;
    vp_error e;
    size_t len;
    bool end;

    while (st == VP_OK &&
           (st = vp_gt_next(f, &json, &len, &o.line, &end, err)) == VP_OK &&
           !end) {
        vp_status cs = vp_validate_line(json, len, &o, &r, &e);
        o.first_in_process = false;
        const vp_metric *dev = metric_named(&r, "device_used");
        const vp_metric *res = metric_named(&r, "peak_reserved");
        if (r.kind != VP_GT_CASE || cs == VP_EARG || (cs == VP_OK &&
                                                      (!dev || !res))) {
            skip_case(out, file, o.line,
                      r.kind != VP_GT_CASE ? "not a one-GPU training case"
                      : cs == VP_EARG ? e.msg
                                      : "no device_used or peak_reserved");
            continue;
        }
        if (cs != VP_OK) {
            if (err != NULL)
                *err = e;
            st = cs;
            break;
        }
        vp_fit_case c;
        memset(&c, 0, sizeof c);
        snprintf(c.id, sizeof c.id, "%s", r.id);
        c.measured_device = dev->measured;
        c.measured_reserved = res->measured;
        c.predicted_reserved = res->predicted;
        c.err_before = ((double)c.predicted_reserved + (double)ctx0 -
                        (double)c.measured_device) /
                       (double)c.measured_device;
        st = add_case(out, cap, &c, err);
    }
    vp_gt_close(f);
    return st;
}

vp_status vp_fit_framework(const char *const *files, size_t n_files,
                           const char *const *dirs, size_t n_dirs,
                           uint64_t context_before, vp_fit_result *out,
                           vp_error *err)
{
    memset(out, 0, sizeof *out);
    vp_error_clear(err);
    out->context_before = context_before;
    size_t cap = 0;
    for (size_t f = 0; f < n_files; f++) {
        vp_status st = fit_read_file(files[f], dirs, n_dirs, context_before,
                                     out, &cap, err);
        if (st != VP_OK) {
            vp_fit_result_destroy(out);
            return st;
        }
    }
    size_t n = out->n_cases;
    if (!n) {
        vp_fit_result_destroy(out);
        return vp_error_set(err, VP_ERANGE,
                            "no case with measured device_used and "
                            "peak_reserved to fit%s%s",
                            out->skip_note[0] ? " (" : "",
                            out->skip_note[0] ? out->skip_note : "");
    }
    double *res = malloc(n * sizeof *res), *dev = malloc(n * sizeof *dev);
    if (!res || !dev) {
        free(res);
        free(dev);
        vp_fit_result_destroy(out);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        res[i] = (double)out->cases[i].measured_reserved;
        dev[i] = (double)out->cases[i].measured_device;
    }
    double x = 0.0, sd = 0.0;
    vp_status st = VP_OK;
    context_lsq(res, dev, n, &x, &sd);
    free(res);
    free(dev);
    if (st == VP_OK && !(x > 0.0 && x < 64.0 * (double)VP_GiB))
        st = vp_error_set(err, VP_ERANGE,
                          "context fit: %.0f bytes is out of range", x);
    if (st != VP_OK) {
        vp_fit_result_destroy(out);
        return st;
    }
    out->context_after = (uint64_t)llround(x);
    out->context_sd_bytes = sd;
    for (size_t i = 0; i < n; i++) {
        vp_fit_case *c = &out->cases[i];
        c->err_after = ((double)c->predicted_reserved +
                        (double)out->context_after -
                        (double)c->measured_device) /
                       (double)c->measured_device;
    }
    summarise(out->cases, n, false, &out->rms_before, &out->median_abs_before,
              &out->max_abs_before);
    summarise(out->cases, n, true, &out->rms_after, &out->median_abs_after,
              &out->max_abs_after);
    return VP_OK;
}
