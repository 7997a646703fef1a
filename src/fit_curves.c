/* The curves of a PyTorch sweep (calibrate/vp-sweep.py): GEMMs by shape,
 * SDPA by backend, memory-bound kernels by class, optimizers, the eager
 * dispatch cost, fitted into a profile's measured section. Every fit is a
 * weighted linear least-squares fit (GSL gsl_multifit_wlinear) on relative
 * residuals, so that a small kernel weighs as much as a large one:
 *
 *   GEMM        time = t0 + W / P + (W / k) kh / P    (W = 2mnk)
 *   attention   time = t0 + F / P
 *   memory      time = t0 + bytes / B
 *   optimizer   time = tensors us + numel bytes_per_param / B_copy
 *
 * The formats and the models: calibrate/README.md, docs/STEP_TIME.md. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_errno.h>
#include <gsl/gsl_multifit.h>

#include "internal.h"
#include "yaml_doc.h"
#include "vramplan/gpu.h"
#include "vramplan/timing.h"

#define MAX_SWEEP_ROWS 100000

typedef struct {
    int kind;       /* 0 gemm, 1 sdpa, 2 membound, 3 optim, 4 launch */
    int cls;        /* dtype, backend, class or optimizer            */
    int sub;        /* optimizer state dtype (0 fp32, 1 bf16)        */
    double x[4];    /* gemm m n k; sdpa flops; membound bytes;
                       optim numel tensors                           */
    double ms[2];   /* time (sdpa: forward, backward)                */
} srow;

struct vp_sweep {
    srow *rows;
    size_t n, cap;
};

static const char *const SWEEP_KINDS[] = {"gemm", "sdpa", "membound",
                                          "optim", "launch", "env",
                                          "step_profile", NULL};

static int name_at(const char *s, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

typedef struct {
    vp_ydoc *d;
    yaml_node_t *root;
    vp_error *err;
} sline;

static vp_status snum(sline *l, const char *key, double *out)
{
    yaml_node_t *n = vp__ymap_get(l->d, l->root, key, NULL);
    if (!n)
        return vp__yerr(l->d, l->root, VP_ESCHEMA, l->err,
                        "the line has no \"%s\"", key);
    const char *v = vp__yscalar(n);
    char *end;
    if (!v || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || !*v)
        return vp__yerr(l->d, n, VP_ESCHEMA, l->err,
                        "\"%s\" must be a number", key);
    errno = 0;
    double x = strtod(v, &end);
    if (*end || errno == ERANGE || !isfinite(x) || x < 0.0)
        return vp__yerr(l->d, n, VP_ESCHEMA, l->err,
                        "\"%s\" must be a non-negative number, got "
                        "'%.64s'",
                        key, v);
    *out = x;
    return VP_OK;
}

static vp_status sstr(sline *l, const char *key, const char **out)
{
    yaml_node_t *n = vp__ymap_get(l->d, l->root, key, NULL);
    if (!n)
        return vp__yerr(l->d, l->root, VP_ESCHEMA, l->err,
                        "the line has no \"%s\"", key);
    return vp__yget_str(l->d, n, out, l->err);
}

static vp_status enum_of(sline *l, const char *key,
                         const char *const *names, int *out)
{
    const char *v;
    vp_status st = sstr(l, key, &v);
    if (st != VP_OK)
        return st;
    *out = name_at(v, names);
    if (*out < 0)
        return vp__yerr(l->d, vp__ymap_get(l->d, l->root, key, NULL),
                        VP_ESCHEMA, l->err, "unknown %s '%.32s'", key, v);
    return VP_OK;
}

static const char *const GEMM_DT[] = {"fp32", "tf32", "fp16", "bf16", "fp8",
                                      NULL};
static const char *const SDPA_IMPL[] = {
#define VP__S3(name, str) str,
    VP_HW_ATTN_MAP(VP__S3) "math", NULL};
static const char *const MEM_CLASS[] = {VP_HW_MEM_MAP(VP__S3) NULL};
static const char *const OPTIMS[] = {VP_HW_OPTIM_MAP(VP__S3) NULL};
#undef VP__S3
static const char *const STATE_DT[] = {"float32", "bfloat16", NULL};

/* One line into r; *keep false for lines that carry no fit (env, step
 * profiles, SDPA backends that failed or are not fitted). */
static vp_status parse_sweep_line(sline *l, srow *r, bool *keep)
{
    int k;
    memset(r, 0, sizeof *r);
    *keep = true;
    VP_TRY(enum_of(l, "kind", SWEEP_KINDS, &k));
    r->kind = k;
    switch (k) {
    case 0:
        VP_TRY(enum_of(l, "dtype", GEMM_DT, &r->cls));
        VP_TRY(snum(l, "m", &r->x[0]));
        VP_TRY(snum(l, "n", &r->x[1]));
        VP_TRY(snum(l, "k", &r->x[2]));
        VP_TRY(snum(l, "ms", &r->ms[0]));
        return VP_OK;
    case 1: {
        VP_TRY(enum_of(l, "impl", SDPA_IMPL, &r->cls));
        if (r->cls >= VP_HW_ATTN__N ||
            vp__ymap_get(l->d, l->root, "error", NULL)) {
            *keep = false; /* math is not fitted; a backend may fail */
            return VP_OK;
        }
        double b, h, s, dd, causal = 0;
        VP_TRY(snum(l, "b", &b));
        VP_TRY(snum(l, "h", &h));
        VP_TRY(snum(l, "s", &s));
        VP_TRY(snum(l, "d", &dd));
        yaml_node_t *c = vp__ymap_get(l->d, l->root, "causal", NULL);
        bool cz = false;
        if (c)
            VP_TRY(vp__yget_bool(l->d, c, &cz, l->err));
        causal = cz;
        r->x[0] = 4.0 * b * h * s * s * dd * (causal ? 0.5 : 1.0);
        VP_TRY(snum(l, "fwd_ms", &r->ms[0]));
        VP_TRY(snum(l, "bwd_ms", &r->ms[1]));
        return VP_OK;
    }
    case 2: {
        const char *op;
        VP_TRY(sstr(l, "op", &op));
        r->cls = name_at(op, MEM_CLASS);
        if (r->cls < 0)
            return vp__yerr(l->d, vp__ymap_get(l->d, l->root, "op", NULL),
                            VP_ESCHEMA, l->err, "unknown op '%.32s'", op);
        VP_TRY(snum(l, "bytes", &r->x[0]));
        VP_TRY(snum(l, "ms", &r->ms[0]));
        return VP_OK;
    }
    case 3:
        VP_TRY(enum_of(l, "opt", OPTIMS, &r->cls));
        VP_TRY(enum_of(l, "dtype", STATE_DT, &r->sub));
        VP_TRY(snum(l, "numel", &r->x[0]));
        VP_TRY(snum(l, "tensors", &r->x[1]));
        VP_TRY(snum(l, "ms", &r->ms[0]));
        return VP_OK;
    case 4:
        VP_TRY(snum(l, "us_per_kernel", &r->x[0]));
        return VP_OK;
    default:
        *keep = false;
        return VP_OK;
    }
}

vp_sweep *vp_sweep_parse(const char *buf, size_t len, const char *path,
                         vp_error *err)
{
    vp_error_clear(err);
    vp_sweep *w = calloc(1, sizeof *w);
    if (!w) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        return NULL;
    }
    size_t pos = 0;
    uint32_t line = 0;
    while (pos < len) {
        size_t end = pos;
        while (end < len && buf[end] != '\n')
            end++;
        line++;
        size_t a = pos;
        while (a < end && (buf[a] == ' ' || buf[a] == '\t' || buf[a] == '\r'))
            a++;
        pos = end + 1;
        if (a == end)
            continue;
        vp_ydoc d;
        memset(&d, 0, sizeof d);
        d.path = path;
        vp_status st = vp__ydoc_load(&d, buf + a, end - a, err);
        if (st != VP_OK) {
            err->line = line;
            vp_sweep_free(w);
            return NULL;
        }
        sline l = {&d, vp__ydoc_root(&d), err};
        srow r;
        bool keep = false;
        if (!l.root || l.root->type != YAML_MAPPING_NODE)
            st = vp__yerr(&d, l.root, VP_ESCHEMA, err,
                          "a sweep line is a JSON object");
        else
            st = parse_sweep_line(&l, &r, &keep);
        vp__ydoc_destroy(&d);
        if (st == VP_OK && keep && w->n >= MAX_SWEEP_ROWS)
            st = vp_error_set(err, VP_ELIMIT, "more than %d sweep lines",
                              MAX_SWEEP_ROWS);
        if (st == VP_OK && keep && w->n == w->cap &&
            !vp__grow((void **)&w->rows, &w->cap, w->n + 1, sizeof *w->rows))
            st = vp_error_set(err, VP_ENOMEM, "out of memory");
        if (st != VP_OK) {
            err->line = line;
            snprintf(err->path, sizeof err->path, "%s", path);
            vp_sweep_free(w);
            return NULL;
        }
        if (keep)
            w->rows[w->n++] = r;
    }
    return w;
}

void vp_sweep_free(vp_sweep *w)
{
    if (!w)
        return;
    free(w->rows);
    free(w);
}

/* Weighted least squares of y = X c on relative residuals (weights
 * 1 / y^2); *rms gets the root mean square relative residual. */
static vp_status lsq(const double *X, const double *y, size_t n, size_t p,
                     double *c, double *rms, vp_error *err)
{
    if (n < p)
        return vp_error_set(err, VP_ERANGE, "too few points (%zu) to fit "
                                            "%zu parameters",
                            n, p);
    gsl_matrix *A = gsl_matrix_alloc(n, p), *cov = gsl_matrix_alloc(p, p);
    gsl_vector *Y = gsl_vector_alloc(n), *W = gsl_vector_alloc(n);
    gsl_vector *C = gsl_vector_alloc(p);
    gsl_multifit_linear_workspace *ws = gsl_multifit_linear_alloc(n, p);
    vp_status st = VP_OK;
    if (!A || !cov || !Y || !W || !C || !ws) {
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < p; j++)
            gsl_matrix_set(A, i, j, X[i * p + j]);
        gsl_vector_set(Y, i, y[i]);
        gsl_vector_set(W, i, 1.0 / (y[i] * y[i]));
    }
    double chi;
    gsl_error_handler_t *old = gsl_set_error_handler_off();
    int rc = gsl_multifit_wlinear(A, W, Y, C, cov, &chi, ws);
    gsl_set_error_handler(old);
    if (rc) {
        st = vp_error_set(err, VP_ERANGE, "the fit failed: %s",
                          gsl_strerror(rc));
        goto done;
    }
    double s = 0;
    for (size_t j = 0; j < p; j++)
        c[j] = gsl_vector_get(C, j);
    for (size_t i = 0; i < n; i++) {
        double f = 0;
        for (size_t j = 0; j < p; j++)
            f += X[i * p + j] * c[j];
        s += (f / y[i] - 1) * (f / y[i] - 1);
    }
    *rms = sqrt(s / (double)n);
done:
    gsl_matrix_free(A);
    gsl_matrix_free(cov);
    gsl_vector_free(Y);
    gsl_vector_free(W);
    gsl_vector_free(C);
    gsl_multifit_linear_free(ws);
    return st;
}

/* Rows of one kind and class (and sub-class, -1 = any). */
static size_t select_rows(const vp_sweep *w, int kind, int cls, int sub,
                          const srow **out)
{
    size_t n = 0;
    for (size_t i = 0; i < w->n; i++)
        if (w->rows[i].kind == kind && w->rows[i].cls == cls &&
            (sub < 0 || w->rows[i].sub == sub))
            out[n++] = &w->rows[i];
    return n;
}

/* The GEMM points worth fitting: those whose time the host's dispatch
 * does not set (above VP_SWEEP_GEMM_MIN_MS). */
#define VP_SWEEP_GEMM_MIN_MS 0.05

static vp_status fit_gemm(const srow **r, size_t n, vp_gpu_gemm_fit *g,
                          vp_error *err)
{
    double *X = malloc(3 * n * sizeof *X), *y = malloc(n * sizeof *y);
    if (!X || !y) {
        free(X);
        free(y);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    size_t m = 0;
    double best = 0;
    for (size_t i = 0; i < n; i++) {
        double W = 2.0 * r[i]->x[0] * r[i]->x[1] * r[i]->x[2];
        double t = r[i]->ms[0] * 1e-3;
        if (t > 0 && W / t > best)
            best = W / t;
        if (r[i]->ms[0] < VP_SWEEP_GEMM_MIN_MS)
            continue;
        X[3 * m] = 1.0;
        X[3 * m + 1] = W;
        X[3 * m + 2] = W / r[i]->x[2];
        y[m++] = t;
    }
    double c[3], rms;
    vp_status st = lsq(X, y, m, 3, c, &rms, err);
    free(X);
    free(y);
    if (st != VP_OK)
        return st;
    if (c[1] <= 0)
        return vp_error_set(err, VP_ERANGE, "the GEMM fit has no positive "
                                            "rate");
    double P = 1.0 / c[1];
    memset(g, 0, sizeof *g);
    g->points = (uint32_t)m;
    g->peak_tflops = P / 1e12;
    g->half_gflop = (c[0] > 0 ? c[0] : 0) * P / 1e9;
    g->exponent = 1.0;
    g->k_half = c[2] > 0 ? c[2] * P : 0;
    g->rms_rel_err = rms;
    g->best_tflops = best / 1e12;
    return VP_OK;
}

/* Least squares of the rows' ms[ph] (in seconds) on two columns: x[ca]
 * (the intercept when ca < 0) and x[cb]. */
static vp_status lsq_rows(const srow **r, size_t n, int ca, int cb, int ph,
                          double c[2], double *rms, vp_error *err)
{
    double *X = malloc(2 * n * sizeof *X), *y = malloc(n * sizeof *y);
    if (!X || !y) {
        free(X);
        free(y);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        X[2 * i] = ca < 0 ? 1.0 : r[i]->x[ca];
        X[2 * i + 1] = r[i]->x[cb];
        y[i] = r[i]->ms[ph] * 1e-3;
    }
    vp_status st = lsq(X, y, n, 2, c, rms, err);
    free(X);
    free(y);
    return st;
}

/* time = t0 + x / rate over rows' x[0] and ms[ph]. */
static vp_status fit_rate(const srow **r, size_t n, int ph, double unit,
                          vp_gpu_rate_fit *out, vp_error *err)
{
    double c[2], rms;
    vp_status st = lsq_rows(r, n, -1, 0, ph, c, &rms, err);
    if (st != VP_OK)
        return st;
    if (c[1] <= 0)
        return vp_error_set(err, VP_ERANGE, "the fit has no positive rate");
    out->points = (uint32_t)n;
    out->peak = 1.0 / c[1] / unit;
    out->fixed_us = c[0] > 0 ? c[0] * 1e6 : 0;
    out->rms_rel_err = rms;
    return VP_OK;
}

/* The attention's rate by the call's GFLOP, a Hill curve (fit.c's GEMM
 * fit): its efficiency keeps growing over the sizes measured. */
static vp_status fit_attention(const srow **r, size_t n, int ph,
                               vp_gpu_gemm_fit *out, vp_error *err)
{
    double *w = malloc(n * sizeof *w), *rate = malloc(n * sizeof *rate);
    if (!w || !rate) {
        free(w);
        free(rate);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    double best = 0;
    for (size_t i = 0; i < n; i++) {
        w[i] = r[i]->x[0] * (ph ? 2.5 : 1.0) / 1e9;
        rate[i] = w[i] / r[i]->ms[ph]; /* GFLOP per ms = TFLOP/s */
        if (rate[i] > best)
            best = rate[i];
    }
    vp_status st = vp_fit_gemm_curve(w, rate, n, out, err);
    free(w);
    free(rate);
    if (st == VP_OK)
        out->best_tflops = best;
    return st;
}

/* time = tensors us + numel B / copy, the copy bandwidth in B/s. */
static vp_status fit_optim(const srow **r, size_t n, double copy,
                           vp_gpu_optim_fit *o, vp_error *err)
{
    double c[2], rms;
    vp_status st = lsq_rows(r, n, 1, 0, 0, c, &rms, err);
    if (st != VP_OK)
        return st;
    o->points = (uint32_t)n;
    o->us_per_tensor = c[0] > 0 ? c[0] * 1e6 : 0;
    o->bytes_per_param = c[1] > 0 ? c[1] * copy : 0;
    o->rms_rel_err = rms;
    return VP_OK;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

vp_status vp_sweep_fit(const vp_sweep *w, vp_gpu_measured *m, vp_error *err)
{
    vp_error_clear(err);
    const srow **r = malloc((w->n ? w->n : 1) * sizeof *r);
    if (!r)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    vp_status st = VP_OK;
    size_t n;
    for (int t = 0; t < VP_GPU__DTYPES && st == VP_OK; t++)
        if ((n = select_rows(w, 0, t, -1, r)))
            st = fit_gemm(r, n, &m->gemm[t], err);
    for (int i = 0; i < VP_GPU__ATTN && st == VP_OK; i++)
        if ((n = select_rows(w, 1, i, -1, r)))
            for (int ph = 0; ph < 2 && st == VP_OK; ph++)
                st = fit_attention(r, n, ph, &m->attention[i][ph], err);
    for (int k = 0; k < VP_GPU__MEM && st == VP_OK; k++)
        if ((n = select_rows(w, 2, k, -1, r)))
            st = fit_rate(r, n, 0, 1e9, &m->membound[k], err);
    double copy = m->membound[VP_HW_MEM_COPY].points
                      ? m->membound[VP_HW_MEM_COPY].peak * 1e9
                      : 0;
    for (int o = 0; o < VP_GPU__OPTIM && st == VP_OK; o++)
        for (int d = 0; d < 2 && st == VP_OK; d++)
            if ((n = select_rows(w, 3, o, d, r))) {
                if (copy <= 0) {
                    st = vp_error_set(err, VP_ERANGE,
                                      "optimizer lines need the copy "
                                      "bandwidth (membound copy lines)");
                    break;
                }
                st = fit_optim(r, n, copy, &m->optimizer[o][d], err);
            }
    if (st == VP_OK) {
        double v[64];
        uint32_t k = 0;
        for (size_t i = 0; i < w->n && k < 64; i++)
            if (w->rows[i].kind == 4)
                v[k++] = w->rows[i].x[0];
        if (k) {
            qsort(v, k, sizeof *v, dcmp);
            m->dispatch_us = (vp_gpu_stat){v[k / 2], v[0], v[k - 1], k};
        }
    }
    free(r);
    return st;
}
