/* Calibration and fitting: vp-calibrate's raw output, the GEMM efficiency
 * curves and collective latency/bandwidth fits, and the framework
 * constants fitted to measured training runs. Least squares through GSL
 * (gsl_multifit_nlinear, trust region), on relative residuals so that a
 * small shape weighs as much as a large one. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
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
#include "yaml_doc.h"
#include "vramplan/gpu.h"

#define MAX_SAMPLES 64
#define MAX_CALIB_BYTES (16u << 20)

/* ------------------------------------------------------------------ */
/* Small statistics                                                     */
/* ------------------------------------------------------------------ */

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values (n >= 1), without changing v. */
static double median_of(const double *v, size_t n)
{
    double tmp[MAX_SAMPLES];
    if (n > MAX_SAMPLES)
        n = MAX_SAMPLES;
    memcpy(tmp, v, n * sizeof *v);
    qsort(tmp, n, sizeof *tmp, dcmp);
    return n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2.0;
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
 * scaled by the residual variance when n > p. */
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
        double scale = n > p ? c2 / (double)(n - p) : 1.0;
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

typedef struct {
    vp_ydoc *d;
    yaml_node_t *root;
    vp_error *err;
} line_ctx;

static vp_status req_u64(line_ctx *c, const char *key, uint64_t *out)
{
    yaml_node_t *n = vp__ymap_get(c->d, c->root, key, NULL);
    if (!n)
        return vp__yerr(c->d, c->root, VP_ESCHEMA, c->err,
                        "the line has no \"%s\"", key);
    return vp__yget_u64(c->d, n, 0, UINT64_MAX, out, c->err);
}

static vp_status req_str(line_ctx *c, const char *key, char *buf,
                         size_t size)
{
    yaml_node_t *n = vp__ymap_get(c->d, c->root, key, NULL);
    const char *v;
    if (!n)
        return vp__yerr(c->d, c->root, VP_ESCHEMA, c->err,
                        "the line has no \"%s\"", key);
    vp_status st = vp__yget_str(c->d, n, &v, c->err);
    if (st == VP_OK)
        snprintf(buf, size, "%s", v);
    return st;
}

static vp_status num_of(line_ctx *c, yaml_node_t *n, double *out)
{
    const char *v = vp__yscalar(n);
    char *end;
    if (!v || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || !*v)
        return vp__yerr(c->d, n, VP_ESCHEMA, c->err, "expected a number");
    errno = 0;
    double x = strtod(v, &end);
    if (*end || errno == ERANGE || !isfinite(x) || x < 0.0)
        return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                        "expected a non-negative number, got '%.64s'", v);
    *out = x;
    return VP_OK;
}

/* An array of numbers into s (at most MAX_SAMPLES kept). */
static vp_status req_arr(line_ctx *c, const char *key, samples *s)
{
    yaml_node_t *n = vp__ymap_get(c->d, c->root, key, NULL);
    if (!n)
        return vp__yerr(c->d, c->root, VP_ESCHEMA, c->err,
                        "the line has no \"%s\"", key);
    if (n->type != YAML_SEQUENCE_NODE)
        return vp__yerr(c->d, n, VP_ESCHEMA, c->err,
                        "\"%s\" must be a list of numbers", key);
    s->n = 0;
    for (yaml_node_item_t *it = n->data.sequence.items.start;
         it < n->data.sequence.items.top; it++) {
        double x;
        vp_status st = num_of(c, vp__ynode(c->d, *it), &x);
        if (st != VP_OK)
            return st;
        if (s->n < MAX_SAMPLES)
            s->v[s->n++] = x;
    }
    if (!s->n)
        return vp__yerr(c->d, n, VP_ESCHEMA, c->err, "\"%s\" is empty",
                        key);
    return VP_OK;
}

static int index_of(const char *s, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

/* The index i < n whose name(i) is s, or -1. */
static int name_index(const char *s, int n, const char *(*name)(int))
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, name(i)))
            return i;
    return -1;
}

static const char *dtype_name(int i)
{
    return vp_gpu_dtype_name((vp_gpu_dtype)i);
}
static const char *coll_name(int i)
{
    return vp_gpu_coll_name((vp_gpu_coll)i);
}
static const char *bw_name(int i) { return vp_gpu_bw_name((vp_gpu_bw)i); }

static const char *const KINDS[] = {
    "start", "context", "device", "malloc", "max_alloc", "launch",
    "bandwidth", "gemm_setup", "gemm", "nccl", "skip", "torch", "done",
    "gemm_sustained", NULL};

#define TRYL(x)                                                            \
    do {                                                                   \
        vp_status st_ = (x);                                               \
        if (st_ != VP_OK)                                                  \
            return st_;                                                    \
    } while (0)

static vp_status parse_line(vp_calib *c, line_ctx *l)
{
    char kind[32], buf[256];
    TRYL(req_str(l, "kind", kind, sizeof kind));
    int k = index_of(kind, KINDS);
    yaml_node_t *kn = vp__ymap_get(l->d, l->root, "kind", NULL);
    if (k < 0)
        return vp__yerr(l->d, kn, VP_ESCHEMA, l->err,
                        "unknown kind '%.32s'", kind);
    uint64_t u;
    samples s;
    switch (k) {
    case 0: /* start */
        TRYL(req_str(l, "program", buf, sizeof buf));
        if (strcmp(buf, "vp-calibrate") != 0)
            return vp__yerr(l->d, l->root, VP_ESCHEMA, l->err,
                            "not vp-calibrate output");
        break;
    case 1: /* context */
        TRYL(req_str(l, "mode", buf, sizeof buf));
        TRYL(req_u64(l, "after_init", &u));
        if (!strcmp(buf, "lazy") && c->n_lazy < MAX_SAMPLES)
            c->ctx_lazy[c->n_lazy++] = u;
        else if (!strcmp(buf, "eager") && c->n_eager < MAX_SAMPLES)
            c->ctx_eager[c->n_eager++] = u;
        else if (strcmp(buf, "lazy") && strcmp(buf, "eager"))
            return vp__yerr(l->d, l->root, VP_ESCHEMA, l->err,
                            "unknown context mode '%.32s'", buf);
        break;
    case 2: /* device */
        TRYL(req_str(l, "name", c->device, sizeof c->device));
        TRYL(req_str(l, "cc", c->cc, sizeof c->cc));
        TRYL(req_u64(l, "total", &c->total));
        TRYL(req_u64(l, "gpus", &c->gpus));
        TRYL(req_u64(l, "driver", &c->driver));
        TRYL(req_u64(l, "runtime", &c->runtime));
        break;
    case 3: { /* malloc */
        malloc_row r;
        TRYL(req_u64(l, "size", &r.size));
        TRYL(req_u64(l, "count", &r.count));
        TRYL(req_u64(l, "footprint", &r.footprint));
        TRYL(req_u64(l, "align_log2", &r.align_log2));
        TRYL(req_u64(l, "min_stride", &r.min_stride));
        if (r.count == 0 || r.align_log2 > 63)
            return vp__yerr(l->d, l->root, VP_ERANGE, l->err,
                            "bad count or alignment");
        if (c->n_mallocs < sizeof c->mallocs / sizeof c->mallocs[0])
            c->mallocs[c->n_mallocs++] = r;
        break;
    }
    case 4: /* max_alloc */
        TRYL(req_u64(l, "total", &c->total));
        TRYL(req_arr(l, "bytes", &c->max_alloc));
        TRYL(req_arr(l, "free", &c->free_bytes));
        break;
    case 5: /* launch */
        TRYL(req_arr(l, "enqueue_us", &c->launch_enq));
        TRYL(req_arr(l, "gpu_us", &c->launch_gpu));
        TRYL(req_arr(l, "sync_us", &c->launch_sync));
        break;
    case 6: { /* bandwidth */
        TRYL(req_str(l, "test", buf, sizeof buf));
        int b = name_index(buf, VP_GPU__BWS, bw_name);
        if (b < 0)
            return vp__yerr(l->d, l->root, VP_ESCHEMA, l->err,
                            "unknown bandwidth test '%.32s'", buf);
        TRYL(req_arr(l, "gbps", &c->bw[b]));
        break;
    }
    case 7: /* gemm_setup */
        break;
    case 8: { /* gemm */
        TRYL(req_str(l, "dtype", buf, sizeof buf));
        int t = name_index(buf, VP_GPU__DTYPES, dtype_name);
        if (t < 0)
            return vp__yerr(l->d, l->root, VP_ESCHEMA, l->err,
                            "unknown dtype '%.32s'", buf);
        uint64_t m, n, kk;
        TRYL(req_u64(l, "m", &m));
        TRYL(req_u64(l, "n", &n));
        TRYL(req_u64(l, "k", &kk));
        if (!m || !n || !kk || m > 1u << 20 || n > 1u << 20 || kk > 1u << 20)
            return vp__yerr(l->d, l->root, VP_ERANGE, l->err,
                            "GEMM dimensions out of range");
        TRYL(req_arr(l, "tflops", &s));
        if (c->n_gemm == MAX_ROWS)
            return vp__yerr(l->d, l->root, VP_ELIMIT, l->err,
                            "more than %d GEMM lines", MAX_ROWS);
        vp_gpu_stat st = stat_of(s.v, s.n);
        vp_calib_gemm_point *p = &c->gemm[c->n_gemm++];
        p->dtype = (vp_gpu_dtype)t;
        p->m = (uint32_t)m;
        p->n = (uint32_t)n;
        p->k = (uint32_t)kk;
        p->gflop = 2.0 * (double)m * (double)n * (double)kk / 1e9;
        p->median_tflops = st.median;
        p->min_tflops = st.min;
        p->max_tflops = st.max;
        break;
    }
    case 9: { /* nccl */
        TRYL(req_str(l, "op", buf, sizeof buf));
        int o = name_index(buf, VP_GPU__COLLS, coll_name);
        if (o < 0)
            return vp__yerr(l->d, l->root, VP_ESCHEMA, l->err,
                            "unknown collective '%.32s'", buf);
        nccl_row r;
        r.coll = (vp_gpu_coll)o;
        TRYL(req_u64(l, "ranks", &r.ranks));
        TRYL(req_u64(l, "bytes", &r.bytes));
        TRYL(req_arr(l, "us", &s));
        r.median_us = median_of(s.v, s.n);
        if (c->n_nccl == MAX_ROWS)
            return vp__yerr(l->d, l->root, VP_ELIMIT, l->err,
                            "more than %d NCCL lines", MAX_ROWS);
        c->nccl[c->n_nccl++] = r;
        break;
    }
    case 10: { /* skip */
        char what[128], why[256];
        TRYL(req_str(l, "what", what, sizeof what));
        TRYL(req_str(l, "why", why, sizeof why));
        if (c->n_skips < MAX_ROWS) {
            const char *t = vp__arena_printf(&c->arena, "%s: %s", what, why);
            if (!t)
                return vp_error_set(l->err, VP_ENOMEM, "out of memory");
            c->skips[c->n_skips++] = t;
        }
        break;
    }
    case 11: /* torch */
        TRYL(req_str(l, "version", c->torch_version,
                     sizeof c->torch_version));
        TRYL(req_u64(l, "context_used_after_init", &c->torch_context));
        TRYL(req_arr(l, "bf16_matmul_tflops", &c->torch_bf16));
        TRYL(req_arr(l, "copy_gbps", &c->torch_copy));
        break;
    case 12: { /* done */
        yaml_node_t *n = vp__ymap_get(l->d, l->root, "seconds", NULL);
        if (!n)
            return vp__yerr(l->d, l->root, VP_ESCHEMA, l->err,
                            "the line has no \"seconds\"");
        TRYL(num_of(l, n, &c->seconds));
        c->has_done = true;
        break;
    }
    case 13: /* gemm_sustained */
        TRYL(req_str(l, "dtype", buf, sizeof buf));
        if (strcmp(buf, "bf16") != 0)
            return vp__yerr(l->d, l->root, VP_ESCHEMA, l->err,
                            "sustained rate of '%.32s': only bf16 is kept",
                            buf);
        TRYL(req_arr(l, "tflops", &c->sustained));
        break;
    }
    return VP_OK;
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
    const char *p = buf, *end = buf + len;
    uint32_t ln = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        ln++;
        const char *line = p;
        p = nl ? nl + 1 : end;
        size_t sp = 0;
        while (sp < n && (line[sp] == ' ' || line[sp] == '\t' ||
                          line[sp] == '\r'))
            sp++;
        if (sp == n)
            continue;
        if (line[sp] != '{') {
            vp_error_at(err, VP_ESYNTAX, path, ln, (uint32_t)sp + 1, 1,
                        "expected a JSON object");
            goto fail;
        }
        if (memchr(line, '\0', n)) {
            vp_error_at(err, VP_ESYNTAX, path, ln, 1, 1, "NUL byte");
            goto fail;
        }
        vp_ydoc d;
        memset(&d, 0, sizeof d);
        d.path = path;
        vp_status st = vp__ydoc_load(&d, line, n, err);
        if (st == VP_OK) {
            line_ctx l = {&d, vp__ydoc_root(&d), err};
            if (l.root->type != YAML_MAPPING_NODE)
                st = vp__yerr(&d, l.root, VP_ESYNTAX, err,
                              "expected a JSON object");
            else
                st = parse_line(c, &l);
        }
        vp__ydoc_destroy(&d);
        if (st != VP_OK) {
            /* the document was one line: its line is this line */
            if (err)
                err->line = ln;
            goto fail;
        }
        lines++;
    }
    if (!lines) {
        vp_error_at(err, VP_ESCHEMA, path, 1, 1, 1,
                    "no measurements in the calibration output");
        goto fail;
    }
    return c;
fail:
    vp_calib_free(c);
    return NULL;
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
            return vp_error_set(err, st, "gemm %s: %s", dtype_name(t), msg);
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
            return vp_error_set(err, st, "nccl %s: %s", coll_name(o), msg);
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

typedef struct {
    const double *res, *dev; /* measured reserved and device bytes */
    size_t n;
} ctx_data;

static int ctx_f(const gsl_vector *x, void *data, gsl_vector *f)
{
    const ctx_data *d = data;
    double c = gsl_vector_get(x, 0);
    for (size_t i = 0; i < d->n; i++)
        gsl_vector_set(f, i, (d->res[i] + c - d->dev[i]) / d->dev[i]);
    return GSL_SUCCESS;
}

static int ctx_df(const gsl_vector *x, void *data, gsl_matrix *j)
{
    (void)x;
    const ctx_data *d = data;
    for (size_t i = 0; i < d->n; i++)
        gsl_matrix_set(j, i, 0, 1.0 / d->dev[i]);
    return GSL_SUCCESS;
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
    qsort(a, n, sizeof *a, dcmp);
    *rms = n ? sqrt(s / (double)n) : 0.0;
    *med = !n ? 0.0 : n % 2 ? a[n / 2] : (a[n / 2 - 1] + a[n / 2]) / 2.0;
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

/* Read one file's cases into out. */
static vp_status fit_read_file(const char *file, const char *const *dirs,
                               size_t n_dirs, uint64_t ctx0,
                               vp_fit_result *out, size_t *cap,
                               vp_error *err)
{
    FILE *fp = fopen(file, "r");
    if (!fp)
        return vp_error_set(err, VP_EIO, "cannot open '%s': %s", file,
                            strerror(errno));
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    unsigned long ln = 0;
    bool first = true;
    vp_status st = VP_OK;
    while ((len = getline(&line, &lcap, fp)) > 0) {
        ln++;
        if (strspn(line, " \t\r\n") == (size_t)len)
            continue;
        if (ln == 1 && strstr(line, "\"env\""))
            continue;
        char where[512];
        snprintf(where, sizeof where, "%s:%lu", file, ln);
        vp_case_result r;
        vp_error e;
        vp_status cs = vp_validate_case(line, (size_t)len, where, dirs,
                                        n_dirs, first, &r, &e);
        first = false;
        if (cs == VP_ENOMEM) {
            st = vp_error_set(err, VP_ENOMEM, "out of memory");
            break;
        }
        const vp_metric *dev = cs == VP_OK ? metric_named(&r, "device_used")
                                           : NULL;
        const vp_metric *res = cs == VP_OK ? metric_named(&r, "peak_reserved")
                                           : NULL;
        if (!dev || !res || !dev->measured || !res->measured) {
            if (!out->skip_note[0])
                snprintf(out->skip_note, sizeof out->skip_note, "%.120s: %.170s",
                         where,
                         cs != VP_OK ? e.msg
                                     : "no device_used or peak_reserved");
            out->skipped++;
            continue;
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
        if ((st = add_case(out, cap, &c, err)) != VP_OK)
            break;
    }
    free(line);
    fclose(fp);
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
    ctx_data d = {res, dev, n};
    double x = (double)context_before, chisq = 0.0, sd = 0.0;
    vp_status st = nl_solve(n, 1, &x, ctx_f, ctx_df, &d, &chisq, &sd,
                            "context fit", err);
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
