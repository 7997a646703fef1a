/* GPU profiles: the strict YAML loader, accessors, and the writer.
 *
 * The schema is documented in calibrate/README.md; every shipped file in
 * gpus/ follows it. Errors point at the offending node (file:line:col). */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stddef.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"
#include "yaml_doc.h"
#include "vramplan/gpu.h"
#include "vramplan/resource.h"
#include "vramplan/timing.h"

#define MAX_PROFILE_BYTES (1u << 20)
#define MAX_LIST 32

struct vp_gpu_profile {
    vp_arena arena;
    const char *path;
    const char *name, *product, *vendor, *arch, *cc;
    const char *device_names[MAX_LIST];
    size_t n_device_names;
    uint64_t memory_bytes, usable_bytes;
    double memory_gbps;
    double peak_tflops[VP_GPU__DTYPES];
    double gemm_max_tflops[VP_GPU__DTYPES]; /* best-shape matmul, cited */
    uint32_t pcie_gen, pcie_lanes;
    double pcie_gbps;
    const char *link_kind;
    double link_gbps;
    uint64_t context_bytes;
    bool context_estimated;
    const char *context_note;
    uint64_t cublas_workspace_bytes;
    const char *sources[MAX_LIST];
    size_t n_sources;
    const char *notes;
    bool has_measured;
    vp_gpu_measured measured;
    uint32_t sm_count;       /* 0: not given                              */
    bool is_mig;             /* a MIG slice of another profile            */
    vp_gpu_mig mig;
};

const char *const vp_gpu_builtin_names[] = {
    "a100-40g", "a100-80g", "b200",    "h100-80g", "h100-pcie", "h200",
    "h800",     "l40s",     "mi300x",  "rtx3090",  "rtx4090",   "v100-16g",
    "v100-32g",
    /* MIG slices (mig.h) */
    "a100-40g-mig-1g.5gb",  "a100-40g-mig-1g.10gb", "a100-40g-mig-2g.10gb",
    "a100-40g-mig-3g.20gb", "a100-40g-mig-4g.20gb", "a100-40g-mig-7g.40gb",
    "a100-80g-mig-1g.10gb", "a100-80g-mig-1g.20gb", "a100-80g-mig-2g.20gb",
    "a100-80g-mig-3g.40gb", "a100-80g-mig-4g.40gb", "a100-80g-mig-7g.80gb",
    "h100-80g-mig-1g.10gb", "h100-80g-mig-1g.20gb", "h100-80g-mig-2g.20gb",
    "h100-80g-mig-3g.40gb", "h100-80g-mig-4g.40gb", "h100-80g-mig-7g.80gb",
    "h200-mig-1g.18gb",     "h200-mig-1g.35gb",     "h200-mig-2g.35gb",
    "h200-mig-3g.71gb",     "h200-mig-4g.71gb",     "h200-mig-7g.141gb",
    NULL};

static const char *const ATTN_NAMES[] = {
#define VP__S2(name, str) str,
    VP_HW_ATTN_MAP(VP__S2) NULL};
static const char *const MEM_NAMES[] = {VP_HW_MEM_MAP(VP__S2) NULL};
static const char *const OPTIM_NAMES[] = {VP_HW_OPTIM_MAP(VP__S2) NULL};
#undef VP__S2
static const char *const PHASE_NAMES[] = {"fwd", "bwd", NULL};
static const char *const STATE_NAMES[] = {"fp32", "bf16", NULL};

static const char *const DTYPE_NAMES[] = {
#define VP__S(name, str) str,
    VP_GPU_DTYPE_MAP(VP__S) NULL};
static const char *const COLL_NAMES[] = {VP_GPU_COLL_MAP(VP__S) NULL};
static const char *const BW_NAMES[] = {VP_GPU_BW_MAP(VP__S) NULL};
#undef VP__S

const char *vp_gpu_dtype_name(vp_gpu_dtype t)
{
    return (unsigned)t < VP_GPU__DTYPES ? DTYPE_NAMES[t] : "?";
}

const char *vp_gpu_coll_name(vp_gpu_coll c)
{
    return (unsigned)c < VP_GPU__COLLS ? COLL_NAMES[c] : "?";
}

const char *vp_gpu_bw_name(vp_gpu_bw b)
{
    return (unsigned)b < VP_GPU__BWS ? BW_NAMES[b] : "?";
}

/* ------------------------------------------------------------------ */
/* Typed getters                                                        */
/* ------------------------------------------------------------------ */

/* A finite number >= min (integers and decimals, exponents allowed). */
static vp_status get_double(vp_ydoc *d, yaml_node_t *n, double min,
                            double *out, vp_error *err)
{
    const char *v = vp__yscalar(n);
    if (!v || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || !*v)
        return vp__yerr(d, n, VP_ESCHEMA, err, "expected a number, got %s",
                        !n ? "nothing"
                        : n->type == YAML_MAPPING_NODE  ? "a mapping"
                        : n->type == YAML_SEQUENCE_NODE ? "a list"
                        : v && *v                       ? "a quoted string"
                                                        : "an empty value");
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (*end || errno == ERANGE || !isfinite(x) ||
        !(isdigit((unsigned char)v[0]) || v[0] == '-' || v[0] == '+' ||
          v[0] == '.'))
        return vp__yerr(d, n, VP_ESCHEMA, err,
                        "expected a number, got '%.64s'", v);
    if (x < min)
        return vp__yerr(d, n, VP_ERANGE, err,
                        "%.64s is too small (at least %g)", v, min);
    *out = x;
    return VP_OK;
}

/* A string (any scalar) copied into the arena. */
static vp_status get_string(vp_gpu_profile *p, vp_ydoc *d, yaml_node_t *n,
                            const char **out, vp_error *err)
{
    const char *v;
    VP_TRY(vp__yget_str(d, n, &v, err));
    if (!*v)
        return vp__yerr(d, n, VP_ESCHEMA, err, "expected a non-empty "
                                               "string");
    *out = vp__arena_strdup(&p->arena, v);
    if (!*out)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    return VP_OK;
}

/* A string copied into a fixed buffer (truncated). */
static vp_status get_buf(vp_ydoc *d, yaml_node_t *n, char *buf, size_t size,
                         vp_error *err)
{
    const char *v;
    VP_TRY(vp__yget_str(d, n, &v, err));
    snprintf(buf, size, "%s", v);
    return VP_OK;
}

static vp_status get_list(vp_gpu_profile *p, vp_ydoc *d, yaml_node_t *n,
                          const char **items, size_t *count,
                          const char *what, vp_error *err)
{
    if (!n || n->type != YAML_SEQUENCE_NODE)
        return vp__yerr(d, n, VP_ESCHEMA, err, "%s must be a list of "
                                               "strings",
                        what);
    *count = 0;
    for (yaml_node_item_t *it = n->data.sequence.items.start;
         it < n->data.sequence.items.top; it++) {
        yaml_node_t *e = vp__ynode(d, *it);
        if (*count == MAX_LIST)
            return vp__yerr(d, e, VP_ELIMIT, err, "%s has more than %d "
                                                  "entries",
                            what, MAX_LIST);
        VP_TRY(get_string(p, d, e, &items[(*count)++], err));
    }
    if (*count == 0)
        return vp__yerr(d, n, VP_ESCHEMA, err, "%s must not be empty",
                        what);
    return VP_OK;
}

/* The value of a required key; an error at the mapping when missing. */
static vp_status need(vp_ydoc *d, yaml_node_t *map, const char *key,
                      const char *what, yaml_node_t **out, vp_error *err)
{
    *out = vp__ymap_get(d, map, key, NULL);
    if (!*out || vp__yis_null(*out))
        return vp__yerr(d, map, VP_ESCHEMA, err, "%s needs '%s'", what,
                        key);
    return VP_OK;
}

/* {median: X, min: X, max: X, n: N}; min and max default to the median. */
static vp_status get_stat(vp_ydoc *d, yaml_node_t *n, vp_gpu_stat *out,
                          vp_error *err)
{
    static const char *const keys[] = {"median", "min", "max", "n", NULL};
    VP_TRY(vp__ymap_check(d, n, keys, "a measurement", err));
    yaml_node_t *v;
    VP_TRY(need(d, n, "median", "a measurement", &v, err));
    VP_TRY(get_double(d, v, 0.0, &out->median, err));
    out->min = out->max = out->median;
    out->n = 1;
    if ((v = vp__ymap_get(d, n, "min", NULL)))
        VP_TRY(get_double(d, v, 0.0, &out->min, err));
    if ((v = vp__ymap_get(d, n, "max", NULL)))
        VP_TRY(get_double(d, v, 0.0, &out->max, err));
    if ((v = vp__ymap_get(d, n, "n", NULL))) {
        uint64_t u;
        VP_TRY(vp__yget_u64(d, v, 1, 1000000, &u, err));
        out->n = (uint32_t)u;
    }
    if (out->min > out->median || out->max < out->median)
        return vp__yerr(d, n, VP_ERANGE, err,
                        "min <= median <= max does not hold");
    return VP_OK;
}

static vp_status opt_u64(vp_ydoc *d, yaml_node_t *map, const char *key,
                         uint64_t *out, vp_error *err)
{
    yaml_node_t *v = vp__ymap_get(d, map, key, NULL);
    if (v)
        VP_TRY(vp__yget_u64(d, v, 0, UINT64_MAX, out, err));
    return VP_OK;
}

static vp_status opt_stat(vp_ydoc *d, yaml_node_t *map, const char *key,
                          vp_gpu_stat *out, vp_error *err)
{
    yaml_node_t *v = vp__ymap_get(d, map, key, NULL);
    if (v)
        VP_TRY(get_stat(d, v, out, err));
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* The measured section                                                 */
/* ------------------------------------------------------------------ */

/* A required number of a fit, at least min. */
static vp_status need_double(vp_ydoc *d, yaml_node_t *n, const char *key,
                             const char *what, double min, double *out,
                             vp_error *err)
{
    yaml_node_t *v;
    VP_TRY(need(d, n, key, what, &v, err));
    return get_double(d, v, min, out, err);
}

/* What a fit ends with, both optional: its rms_rel_err and the points it
 * was fitted to (1 when absent). */
static vp_status fit_quality(vp_ydoc *d, yaml_node_t *n, double *rms_rel_err,
                             uint32_t *points, vp_error *err)
{
    yaml_node_t *v;
    if ((v = vp__ymap_get(d, n, "rms_rel_err", NULL)))
        VP_TRY(get_double(d, v, 0.0, rms_rel_err, err));
    uint64_t u = 1;
    if ((v = vp__ymap_get(d, n, "points", NULL)))
        VP_TRY(vp__yget_u64(d, v, 1, 100000, &u, err));
    *points = (uint32_t)u;
    return VP_OK;
}

static vp_status parse_gemm(vp_ydoc *d, yaml_node_t *n, vp_gpu_gemm_fit *g,
                            vp_error *err)
{
    static const char *const keys[] = {"peak_tflops", "half_gflop",
                                       "exponent",    "rms_rel_err",
                                       "best_tflops", "points",
                                       "k_half",      NULL};
    VP_TRY(vp__ymap_check(d, n, keys, "a GEMM curve", err));
    VP_TRY(need_double(d, n, "peak_tflops", "a GEMM curve", 1e-6,
                       &g->peak_tflops, err));
    VP_TRY(need_double(d, n, "half_gflop", "a GEMM curve", 0.0,
                       &g->half_gflop, err));
    yaml_node_t *v;
    g->exponent = 1.0;
    if ((v = vp__ymap_get(d, n, "exponent", NULL)))
        VP_TRY(get_double(d, v, 0.01, &g->exponent, err));
    if ((v = vp__ymap_get(d, n, "rms_rel_err", NULL)))
        VP_TRY(get_double(d, v, 0.0, &g->rms_rel_err, err));
    if ((v = vp__ymap_get(d, n, "best_tflops", NULL)))
        VP_TRY(get_double(d, v, 0.0, &g->best_tflops, err));
    if ((v = vp__ymap_get(d, n, "k_half", NULL)))
        VP_TRY(get_double(d, v, 0.0, &g->k_half, err));
    uint64_t u = 1;
    if ((v = vp__ymap_get(d, n, "points", NULL)))
        VP_TRY(vp__yget_u64(d, v, 1, 100000, &u, err));
    g->points = (uint32_t)u;
    return VP_OK;
}

static vp_status parse_coll(vp_ydoc *d, yaml_node_t *n, vp_gpu_coll_fit *c,
                            vp_error *err)
{
    static const char *const keys[] = {"ranks",       "latency_us",
                                       "bandwidth_gbps", "rms_rel_err",
                                       "points",      NULL};
    VP_TRY(vp__ymap_check(d, n, keys, "a collective fit", err));
    yaml_node_t *v;
    uint64_t u;
    VP_TRY(need(d, n, "ranks", "a collective fit", &v, err));
    VP_TRY(vp__yget_u64(d, v, 2, 1u << 20, &u, err));
    c->ranks = (uint32_t)u;
    VP_TRY(need_double(d, n, "latency_us", "a collective fit", 0.0,
                       &c->latency_us, err));
    VP_TRY(need_double(d, n, "bandwidth_gbps", "a collective fit", 1e-9,
                       &c->bandwidth_gbps, err));
    return fit_quality(d, n, &c->rms_rel_err, &c->points, err);
}

static vp_status parse_rate(vp_ydoc *d, yaml_node_t *n, vp_gpu_rate_fit *r,
                           const char *unit, vp_error *err)
{
    const char *const keys[] = {unit, "fixed_us", "rms_rel_err", "points",
                                NULL};
    VP_TRY(vp__ymap_check(d, n, keys, "a rate fit", err));
    VP_TRY(need_double(d, n, unit, "a rate fit", 1e-6, &r->peak, err));
    VP_TRY(need_double(d, n, "fixed_us", "a rate fit", 0.0, &r->fixed_us,
                       err));
    return fit_quality(d, n, &r->rms_rel_err, &r->points, err);
}

static vp_status parse_mem_rate(vp_ydoc *d, yaml_node_t *n,
                                vp_gpu_rate_fit *r, vp_error *err)
{
    return parse_rate(d, n, r, "peak_gbps", err);
}

static vp_status parse_attention(vp_ydoc *d, yaml_node_t *n,
                                 vp_gpu_gemm_fit (*r)[2], vp_error *err)
{
    VP_TRY(vp__ymap_check(d, n, PHASE_NAMES, "an attention fit", err));
    for (int ph = 0; ph < 2; ph++) {
        yaml_node_t *v = vp__ymap_get(d, n, PHASE_NAMES[ph], NULL);
        if (v)
            VP_TRY(parse_gemm(d, v, &(*r)[ph], err));
    }
    return VP_OK;
}

static vp_status parse_optim_one(vp_ydoc *d, yaml_node_t *n,
                                 vp_gpu_optim_fit *o, vp_error *err)
{
    static const char *const keys[] = {"bytes_per_param", "us_per_tensor",
                                       "rms_rel_err", "points", NULL};
    VP_TRY(vp__ymap_check(d, n, keys, "an optimizer fit", err));
    VP_TRY(need_double(d, n, "bytes_per_param", "an optimizer fit", 1e-6,
                       &o->bytes_per_param, err));
    VP_TRY(need_double(d, n, "us_per_tensor", "an optimizer fit", 0.0,
                       &o->us_per_tensor, err));
    return fit_quality(d, n, &o->rms_rel_err, &o->points, err);
}

static vp_status parse_optim(vp_ydoc *d, yaml_node_t *n,
                             vp_gpu_optim_fit (*o)[2], vp_error *err)
{
    VP_TRY(vp__ymap_check(d, n, STATE_NAMES, "an optimizer", err));
    for (int i = 0; i < 2; i++) {
        yaml_node_t *v = vp__ymap_get(d, n, STATE_NAMES[i], NULL);
        if (v)
            VP_TRY(parse_optim_one(d, v, &(*o)[i], err));
    }
    return VP_OK;
}

/* A mapping from names (of `names`) to sub-items parsed by fn. */
#define PARSE_NAMED(d, n, names, what, parse, arr)                         \
    do {                                                                   \
        VP_TRY(vp__ymap_check(d, n, names, what, err));                       \
        for (size_t i_ = 0; names[i_]; i_++) {                             \
            yaml_node_t *v_ = vp__ymap_get(d, n, names[i_], NULL);         \
            if (v_)                                                        \
                VP_TRY(parse(d, v_, &(arr)[i_], err));                        \
        }                                                                  \
    } while (0)

static vp_status parse_measured(vp_ydoc *d, yaml_node_t *n,
                                vp_gpu_measured *m, vp_error *err)
{
    static const char *const keys[] = {
        "source",          "device_name",
        "total_bytes",     "free_bytes",
        "max_alloc_bytes", "malloc_alignment_bytes",
        "malloc_granularity_bytes", "context_lazy_bytes",
        "context_eager_bytes", "launch_us",
        "launch_gpu_us",   "launch_sync_us",
        "bandwidth_gbps",  "gemm",
        "nccl",            "framework",
        "torch",           "bf16_sustained_tflops",
        "attention",       "membound",
        "optimizer",       "dispatch_us",
        "host_probe_us",   NULL};
    VP_TRY(vp__ymap_check(d, n, keys, "measured", err));
    yaml_node_t *v;
    if ((v = vp__ymap_get(d, n, "source", NULL)))
        VP_TRY(get_buf(d, v, m->source, sizeof m->source, err));
    if ((v = vp__ymap_get(d, n, "device_name", NULL)))
        VP_TRY(get_buf(d, v, m->device_name, sizeof m->device_name, err));
    VP_TRY(opt_u64(d, n, "total_bytes", &m->total_bytes, err));
    VP_TRY(opt_u64(d, n, "free_bytes", &m->free_bytes, err));
    VP_TRY(opt_u64(d, n, "max_alloc_bytes", &m->max_alloc_bytes, err));
    VP_TRY(opt_u64(d, n, "malloc_alignment_bytes", &m->malloc_alignment_bytes,
                   err));
    VP_TRY(opt_u64(d, n, "malloc_granularity_bytes",
                   &m->malloc_granularity_bytes, err));
    VP_TRY(opt_u64(d, n, "context_lazy_bytes", &m->context_lazy_bytes, err));
    VP_TRY(opt_u64(d, n, "context_eager_bytes", &m->context_eager_bytes, err));
    VP_TRY(opt_stat(d, n, "launch_us", &m->launch_us, err));
    VP_TRY(opt_stat(d, n, "launch_gpu_us", &m->launch_gpu_us, err));
    VP_TRY(opt_stat(d, n, "launch_sync_us", &m->launch_sync_us, err));
    VP_TRY(opt_stat(d, n, "bf16_sustained_tflops", &m->bf16_sustained_tflops,
                    err));
    if ((v = vp__ymap_get(d, n, "bandwidth_gbps", NULL)))
        PARSE_NAMED(d, v, BW_NAMES, "bandwidth_gbps", get_stat, m->bw_gbps);
    if ((v = vp__ymap_get(d, n, "gemm", NULL)))
        PARSE_NAMED(d, v, DTYPE_NAMES, "gemm", parse_gemm, m->gemm);
    if ((v = vp__ymap_get(d, n, "nccl", NULL)))
        PARSE_NAMED(d, v, COLL_NAMES, "nccl", parse_coll, m->nccl);
    if ((v = vp__ymap_get(d, n, "attention", NULL)))
        PARSE_NAMED(d, v, ATTN_NAMES, "attention", parse_attention,
                    m->attention);
    if ((v = vp__ymap_get(d, n, "membound", NULL)))
        PARSE_NAMED(d, v, MEM_NAMES, "membound", parse_mem_rate,
                    m->membound);
    if ((v = vp__ymap_get(d, n, "optimizer", NULL)))
        PARSE_NAMED(d, v, OPTIM_NAMES, "optimizer", parse_optim,
                    m->optimizer);
    VP_TRY(opt_stat(d, n, "dispatch_us", &m->dispatch_us, err));
    VP_TRY(opt_stat(d, n, "host_probe_us", &m->host_probe_us, err));
    if ((v = vp__ymap_get(d, n, "framework", NULL))) {
        static const char *const fk[] = {"context_bytes",
                                         "cublas_workspace_bytes", "source",
                                         NULL};
        VP_TRY(vp__ymap_check(d, v, fk, "framework", err));
        VP_TRY(opt_u64(d, v, "context_bytes", &m->context_bytes, err));
        VP_TRY(opt_u64(d, v, "cublas_workspace_bytes",
                       &m->cublas_workspace_bytes, err));
        yaml_node_t *s = vp__ymap_get(d, v, "source", NULL);
        if (s)
            VP_TRY(get_buf(d, s, m->framework_source,
                           sizeof m->framework_source, err));
    }
    if ((v = vp__ymap_get(d, n, "torch", NULL))) {
        static const char *const tk[] = {"bf16_matmul_tflops", "copy_gbps",
                                         NULL};
        VP_TRY(vp__ymap_check(d, v, tk, "torch", err));
        VP_TRY(opt_stat(d, v, "bf16_matmul_tflops", &m->torch_bf16_tflops,
                        err));
        VP_TRY(opt_stat(d, v, "copy_gbps", &m->torch_copy_gbps, err));
    }
    return VP_OK;
}

/* ------------------------------------------------------------------ */
/* The profile                                                          */
/* ------------------------------------------------------------------ */

static const char *const TOP_KEYS[] = {
    "name",           "product",         "device_names",
    "vendor",         "arch",            "compute_capability",
    "memory_bytes",   "usable_bytes",    "memory_gbps",
    "peak_tflops",    "gemm_max_tflops", "host_link",       "gpu_link",
    "context_bytes",  "context_estimated", "context_note",
    "cublas_workspace_bytes", "sources", "notes",
    "measured",       "sm_count",        "mig",
    NULL};

static const char *const VENDORS[] = {"nvidia", "amd", NULL};
static const char *const LINK_KINDS[] = {"nvlink", "infinity-fabric",
                                         "none", NULL};

/* For a MIG slice, the mig: section (NVIDIA's MIG user guide, "Supported
 * MIG Profiles"; docs/SERVING.md §4); sm_count is read before it. */
static vp_status parse_mig(vp_gpu_profile *p, vp_ydoc *d, yaml_node_t *root,
                           vp_error *err)
{
    static const char *const mk[] = {"of", "profile", "compute_slices",
                                     "memory_slices", "instances",
                                     "copy_engines", "decoders", "jpeg",
                                     "ofa", NULL};
    uint32_t *const counts[] = {&p->mig.compute_slices,
                                &p->mig.memory_slices, &p->mig.instances,
                                &p->mig.copy_engines,  &p->mig.decoders,
                                &p->mig.jpeg,          &p->mig.ofa};
    static const uint64_t lo[] = {1, 1, 1, 0, 0, 0, 0};
    yaml_node_t *v, *mg;
    uint64_t u;

    if (!(mg = vp__ymap_get(d, root, "mig", NULL)))
        return VP_OK;
    if (!p->sm_count)
        return vp__yerr(d, mg, VP_ESCHEMA, err,
                        "a MIG slice needs 'sm_count'");
    VP_TRY(vp__ymap_check(d, mg, mk, "mig", err));
    VP_TRY(need(d, mg, "of", "mig", &v, err));
    VP_TRY(get_string(p, d, v, &p->mig.of, err));
    VP_TRY(need(d, mg, "profile", "mig", &v, err));
    VP_TRY(get_string(p, d, v, &p->mig.profile, err));
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        VP_TRY(need(d, mg, mk[i + 2], "mig", &v, err));
        VP_TRY(vp__yget_u64(d, v, lo[i], 64, &u, err));
        *counts[i] = (uint32_t)u;
    }
    p->is_mig = true;
    return VP_OK;
}

static vp_status parse_profile(vp_gpu_profile *p, vp_ydoc *d, vp_error *err)
{
    yaml_node_t *root = vp__ydoc_root(d), *v;
    if (root->type != YAML_MAPPING_NODE)
        return vp__yerr(d, root, VP_ESCHEMA, err,
                        "a GPU profile must be a mapping");
    VP_TRY(vp__ymap_check(d, root, TOP_KEYS, "the GPU profile", err));
    const char *what = "the GPU profile";
    VP_TRY(need(d, root, "name", what, &v, err));
    VP_TRY(get_string(p, d, v, &p->name, err));
    for (const char *c = p->name; *c; c++)
        if (!islower((unsigned char)*c) && !isdigit((unsigned char)*c) &&
            *c != '-' && *c != '_' && *c != '.')
            return vp__yerr(d, v, VP_ESCHEMA, err,
                            "a profile name holds lower-case letters, "
                            "digits, '-', '_' and '.' only");
    VP_TRY(need(d, root, "product", what, &v, err));
    VP_TRY(get_string(p, d, v, &p->product, err));
    VP_TRY(need(d, root, "device_names", what, &v, err));
    VP_TRY(get_list(p, d, v, p->device_names, &p->n_device_names,
                    "device_names", err));
    int k;
    VP_TRY(need(d, root, "vendor", what, &v, err));
    VP_TRY(vp__yget_enum(d, v, VENDORS, &k, err));
    p->vendor = VENDORS[k];
    VP_TRY(need(d, root, "arch", what, &v, err));
    VP_TRY(get_string(p, d, v, &p->arch, err));
    VP_TRY(need(d, root, "compute_capability", what, &v, err));
    VP_TRY(get_string(p, d, v, &p->cc, err));

    if ((v = vp__ymap_get(d, root, "sm_count", NULL))) {
        uint64_t sms;
        VP_TRY(vp__yget_u64(d, v, 1, 65536, &sms, err));
        p->sm_count = (uint32_t)sms;
    }
    VP_TRY(need(d, root, "memory_bytes", what, &v, err));
    VP_TRY(vp__yget_u64(d, v, VP_GiB, (uint64_t)1 << 50, &p->memory_bytes,
                        err));
    if ((v = vp__ymap_get(d, root, "usable_bytes", NULL))) {
        VP_TRY(vp__yget_u64(d, v, VP_GiB, p->memory_bytes, &p->usable_bytes,
                            err));
    }
    VP_TRY(need(d, root, "memory_gbps", what, &v, err));
    VP_TRY(get_double(d, v, 1.0, &p->memory_gbps, err));

    yaml_node_t *pk;
    VP_TRY(need(d, root, "peak_tflops", what, &pk, err));
    VP_TRY(vp__ymap_check(d, pk, DTYPE_NAMES, "peak_tflops", err));
    for (int t = 0; t < VP_GPU__DTYPES; t++) {
        v = vp__ymap_get(d, pk, DTYPE_NAMES[t], NULL);
        if (v)
            VP_TRY(get_double(d, v, 0.01, &p->peak_tflops[t], err));
    }
    if (p->peak_tflops[VP_GPU_FP32] == 0.0)
        return vp__yerr(d, pk, VP_ESCHEMA, err, "peak_tflops needs 'fp32'");
    if ((pk = vp__ymap_get(d, root, "gemm_max_tflops", NULL))) {
        VP_TRY(vp__ymap_check(d, pk, DTYPE_NAMES, "gemm_max_tflops", err));
        for (int t = 0; t < VP_GPU__DTYPES; t++) {
            v = vp__ymap_get(d, pk, DTYPE_NAMES[t], NULL);
            if (!v)
                continue;
            if (p->peak_tflops[t] == 0.0)
                return vp__yerr(d, v, VP_ESCHEMA, err,
                                "gemm_max_tflops has '%s' but peak_tflops "
                                "has none",
                                DTYPE_NAMES[t]);
            VP_TRY(get_double(d, v, 0.01, &p->gemm_max_tflops[t], err));
            if (p->gemm_max_tflops[t] > p->peak_tflops[t])
                return vp__yerr(d, v, VP_ERANGE, err,
                                "gemm_max_tflops.%s exceeds the peak (%g)",
                                DTYPE_NAMES[t], p->peak_tflops[t]);
        }
    }

    yaml_node_t *hl;
    VP_TRY(need(d, root, "host_link", what, &hl, err));
    static const char *const hk[] = {"kind", "gen", "lanes", "gbps", NULL};
    VP_TRY(vp__ymap_check(d, hl, hk, "host_link", err));
    static const char *const hkinds[] = {"pcie", NULL};
    VP_TRY(need(d, hl, "kind", "host_link", &v, err));
    VP_TRY(vp__yget_enum(d, v, hkinds, &k, err));
    uint64_t u;
    VP_TRY(need(d, hl, "gen", "host_link", &v, err));
    VP_TRY(vp__yget_u64(d, v, 1, 7, &u, err));
    p->pcie_gen = (uint32_t)u;
    VP_TRY(need(d, hl, "lanes", "host_link", &v, err));
    VP_TRY(vp__yget_u64(d, v, 1, 32, &u, err));
    p->pcie_lanes = (uint32_t)u;
    VP_TRY(need(d, hl, "gbps", "host_link", &v, err));
    VP_TRY(get_double(d, v, 0.1, &p->pcie_gbps, err));

    p->link_kind = "none";
    if ((v = vp__ymap_get(d, root, "gpu_link", NULL))) {
        static const char *const gk[] = {"kind", "gbps", NULL};
        yaml_node_t *gl = v;
        VP_TRY(vp__ymap_check(d, gl, gk, "gpu_link", err));
        VP_TRY(need(d, gl, "kind", "gpu_link", &v, err));
        VP_TRY(vp__yget_enum(d, v, LINK_KINDS, &k, err));
        p->link_kind = LINK_KINDS[k];
        if (strcmp(p->link_kind, "none") != 0) {
            VP_TRY(need(d, gl, "gbps", "gpu_link", &v, err));
            VP_TRY(get_double(d, v, 0.1, &p->link_gbps, err));
        } else if ((v = vp__ymap_get(d, gl, "gbps", NULL))) {
            return vp__yerr(d, v, VP_ESCHEMA, err,
                            "a gpu_link of kind none has no gbps");
        }
    }

    VP_TRY(parse_mig(p, d, root, err));
    VP_TRY(need(d, root, "context_bytes", what, &v, err));
    VP_TRY(vp__yget_u64(d, v, 0, 64 * VP_GiB, &p->context_bytes, err));
    VP_TRY(need(d, root, "context_estimated", what, &v, err));
    VP_TRY(vp__yget_bool(d, v, &p->context_estimated, err));
    if ((v = vp__ymap_get(d, root, "context_note", NULL)))
        VP_TRY(get_string(p, d, v, &p->context_note, err));
    VP_TRY(need(d, root, "cublas_workspace_bytes", what, &v, err));
    VP_TRY(vp__yget_u64(d, v, 0, 64 * VP_GiB, &p->cublas_workspace_bytes,
                        err));
    VP_TRY(need(d, root, "sources", what, &v, err));
    VP_TRY(get_list(p, d, v, p->sources, &p->n_sources, "sources", err));
    if ((v = vp__ymap_get(d, root, "notes", NULL)))
        VP_TRY(get_string(p, d, v, &p->notes, err));
    if ((v = vp__ymap_get(d, root, "measured", NULL))) {
        VP_TRY(parse_measured(d, v, &p->measured, err));
        p->has_measured = true;
    }
    return VP_OK;
}

vp_gpu_profile *vp_gpu_parse_buf(const char *buf, size_t len,
                                 const char *path, vp_error *err)
{
    vp_error_clear(err);
    vp_gpu_profile *p = calloc(1, sizeof *p);
    if (!p) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        return NULL;
    }
    vp_ydoc d;
    memset(&d, 0, sizeof d);
    p->path = vp__arena_strdup(&p->arena, path ? path : "<buffer>");
    if (!p->path) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        goto fail;
    }
    d.path = p->path;
    if (len > MAX_PROFILE_BYTES) {
        vp_error_at(err, VP_ELIMIT, p->path, 0, 0, 0,
                    "a GPU profile is at most %u bytes", MAX_PROFILE_BYTES);
        goto fail;
    }
    if (!buf && len) {
        vp_error_set(err, VP_EARG, "no buffer");
        goto fail;
    }
    if (len && memchr(buf, '\0', len)) {
        vp_error_at(err, VP_ESYNTAX, p->path, 0, 0, 0,
                    "the file holds a NUL byte");
        goto fail;
    }
    if (vp__ydoc_load(&d, buf, len, err) != VP_OK)
        goto fail;
    if (parse_profile(p, &d, err) != VP_OK)
        goto fail;
    vp__ydoc_destroy(&d);
    return p;
fail:
    vp__ydoc_destroy(&d);
    vp_gpu_free(p);
    return NULL;
}

void vp_gpu_free(vp_gpu_profile *p)
{
    if (!p)
        return;
    vp__arena_destroy(&p->arena);
    free(p);
}

static bool is_path(const char *s)
{
    size_t n = strlen(s);
    return strchr(s, '/') != NULL ||
           (n > 5 && strcmp(s + n - 5, ".yaml") == 0) ||
           (n > 4 && strcmp(s + n - 4, ".yml") == 0);
}

static vp_gpu_profile *load_file(const char *path, vp_error *err)
{
    char *buf;
    size_t len;
    if (vp__read_file(path, MAX_PROFILE_BYTES, &buf, &len, err) != VP_OK)
        return NULL;
    vp_gpu_profile *p = vp_gpu_parse_buf(buf, len, path, err);
    free(buf);
    return p;
}

vp_gpu_profile *vp_gpu_load(const char *path_or_name, vp_error *err)
{
    vp_error_clear(err);
    if (!path_or_name || !*path_or_name) {
        vp_error_set(err, VP_EARG, "no GPU profile given");
        return NULL;
    }
    if (is_path(path_or_name))
        return load_file(path_or_name, err);
    /* a name: the search path of resource.h */
    char path[PATH_MAX];
    if (vp_resource_find(VP_RES_GPU, path_or_name, NULL, path, sizeof path,
                         err) != VP_OK)
        return NULL;
    return load_file(path, err);
}

/* Case-insensitive equality, ignoring surrounding white space. */
static bool same_name(const char *a, const char *b)
{
    while (isspace((unsigned char)*a))
        a++;
    while (isspace((unsigned char)*b))
        b++;
    size_t la = strlen(a), lb = strlen(b);
    while (la && isspace((unsigned char)a[la - 1]))
        la--;
    while (lb && isspace((unsigned char)b[lb - 1]))
        lb--;
    return la == lb && strncasecmp(a, b, la) == 0;
}

const char *vp_gpu_match_device(const char *device_name)
{
    if (!device_name)
        return NULL;
    for (size_t i = 0; vp_gpu_builtin_names[i]; i++) {
        vp_error err;
        vp_gpu_profile *p = vp_gpu_load(vp_gpu_builtin_names[i], &err);
        if (!p)
            continue;
        bool hit = false;
        for (size_t k = 0; k < p->n_device_names && !hit; k++)
            hit = same_name(p->device_names[k], device_name);
        vp_gpu_free(p);
        if (hit)
            return vp_gpu_builtin_names[i];
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Accessors                                                            */
/* ------------------------------------------------------------------ */

const char *vp_gpu_name(const vp_gpu_profile *p) { return p->name; }
const char *vp_gpu_product(const vp_gpu_profile *p) { return p->product; }
const char *vp_gpu_vendor(const vp_gpu_profile *p) { return p->vendor; }
const char *vp_gpu_arch(const vp_gpu_profile *p) { return p->arch; }
uint32_t vp_gpu_sm_count(const vp_gpu_profile *p) { return p->sm_count; }
const vp_gpu_mig *vp_gpu_mig_get(const vp_gpu_profile *p)
{
    return p->is_mig ? &p->mig : NULL;
}
const char *vp_gpu_compute_capability(const vp_gpu_profile *p)
{
    return p->cc;
}
uint64_t vp_gpu_memory_bytes(const vp_gpu_profile *p)
{
    return p->memory_bytes;
}

uint64_t vp_gpu_usable_bytes(const vp_gpu_profile *p)
{
    if (p->has_measured && p->measured.total_bytes)
        return p->measured.total_bytes;
    return p->usable_bytes ? p->usable_bytes : p->memory_bytes;
}

double vp_gpu_peak_tflops(const vp_gpu_profile *p, vp_gpu_dtype t)
{
    return (unsigned)t < VP_GPU__DTYPES ? p->peak_tflops[t] : 0.0;
}

double vp_gpu_gemm_tflops(const vp_gpu_profile *p, vp_gpu_dtype t,
                          double gflop)
{
    if ((unsigned)t >= VP_GPU__DTYPES || p->peak_tflops[t] == 0.0)
        return 0.0;
    const vp_gpu_gemm_fit *g = &p->measured.gemm[t];
    if (!p->has_measured || g->points == 0)
        return p->peak_tflops[t];
    if (gflop <= 0.0)
        return 0.0;
    if (g->half_gflop <= 0.0)
        return g->peak_tflops;
    double h = g->exponent > 0.0 ? g->exponent : 1.0;
    double u = pow(gflop / g->half_gflop, h);
    return isinf(u) ? g->peak_tflops : g->peak_tflops * u / (1.0 + u);
}

double vp_gpu_memory_gbps(const vp_gpu_profile *p) { return p->memory_gbps; }
uint32_t vp_gpu_pcie_gen(const vp_gpu_profile *p) { return p->pcie_gen; }
uint32_t vp_gpu_pcie_lanes(const vp_gpu_profile *p) { return p->pcie_lanes; }
double vp_gpu_pcie_gbps(const vp_gpu_profile *p) { return p->pcie_gbps; }
double vp_gpu_link_gbps(const vp_gpu_profile *p) { return p->link_gbps; }

uint64_t vp_gpu_context_bytes(const vp_gpu_profile *p, bool *estimated)
{
    if (p->has_measured && p->measured.context_bytes) {
        if (estimated)
            *estimated = false;
        return p->measured.context_bytes;
    }
    if (estimated)
        *estimated = p->context_estimated;
    return p->context_bytes;
}

uint64_t vp_gpu_cublas_workspace_bytes(const vp_gpu_profile *p)
{
    if (p->has_measured && p->measured.cublas_workspace_bytes)
        return p->measured.cublas_workspace_bytes;
    return p->cublas_workspace_bytes;
}

const vp_gpu_measured *vp_gpu_measured_get(const vp_gpu_profile *p)
{
    return p->has_measured ? &p->measured : NULL;
}

vp_status vp_gpu_measured_set(vp_gpu_profile *p, const vp_gpu_measured *m,
                              vp_error *err)
{
    if (!p || !m)
        return vp_error_set(err, VP_EARG, "no profile or measurements");
    p->measured = *m;
    p->measured.source[sizeof p->measured.source - 1] = '\0';
    p->measured.device_name[sizeof p->measured.device_name - 1] = '\0';
    p->measured.framework_source[sizeof p->measured.framework_source - 1] =
        '\0';
    p->has_measured = true;
    return VP_OK;
}

void vp_gpu_apply(const vp_gpu_profile *p, vp_setup *s)
{
    uint64_t ctx = vp_gpu_context_bytes(p, NULL);
    uint64_t total = vp_gpu_usable_bytes(p);
    s->context_bytes = ctx;
    s->cublas_workspace = vp_gpu_cublas_workspace_bytes(p);
    if (p->sm_count)
        s->sm_count = p->sm_count;
    /* what the caching allocator can get: the device minus the context */
    s->alloc.device_total = total > ctx ? total - ctx : 0;
}

void vp_gpu_hw(const vp_gpu_profile *p, vp_gpu_dtype curve, vp_hw *hw)
{
    memset(hw, 0, sizeof *hw);
    snprintf(hw->name, sizeof hw->name, "%s", p->name);
    hw->memory = vp_gpu_usable_bytes(p);
    hw->context = vp_gpu_context_bytes(p, NULL);
    hw->fp32 = p->peak_tflops[VP_GPU_FP32] * 1e12;
    hw->tf32 = p->peak_tflops[VP_GPU_TF32] * 1e12;
    hw->fp16 = p->peak_tflops[VP_GPU_FP16] * 1e12;
    hw->bf16 = p->peak_tflops[VP_GPU_BF16] * 1e12;
    hw->fp8 = p->peak_tflops[VP_GPU_FP8] * 1e12;
    hw->hbm = p->memory_gbps * 1e9;
    hw->host = p->pcie_gbps * 1e9;
    hw->nvlink = p->link_gbps * 1e9 / 2; /* per direction */
    hw->eff_max = 1.0;
    hw->f_half = 0.0;
    hw->mem_eff = 1.0;
    /* the GEMM curves: measured where calibrated, else the cited rate of
     * the best shape (its size dependence comes from vp_hw_fill_defaults) */
    for (int t = 0; t < VP_GPU__DTYPES && t < VP_HW__DTYPES; t++) {
        if (p->peak_tflops[t] <= 0.0)
            continue;
        const vp_gpu_gemm_fit *g = &p->measured.gemm[t];
        if (p->has_measured && g->points)
            hw->gemm[t] = (vp_curve){g->peak_tflops * 1e12,
                                     g->half_gflop * 1e9,
                                     g->exponent > 0 ? g->exponent : 1.0,
                                     g->k_half};
        else if (p->gemm_max_tflops[t] > 0.0)
            hw->gemm[t].peak = p->gemm_max_tflops[t] * 1e12;
    }
    /* Hopper and later: fused attention at the H200's measured shares of
     * the best-shape bf16 GEMM rate (flash 344.6 / 332.3, efficient 262.0
     * / 179.0, cuDNN 646.5 / 632.5 TFLOP/s forward / backward over 794.5),
     * docs/STEP_TIME.md */
    if (p->gemm_max_tflops[VP_GPU_BF16] > 0.0 &&
        (!strcmp(p->arch, "hopper") || !strcmp(p->arch, "blackwell"))) {
        static const double sh[VP_HW_ATTN__N][2] = {
            {0.434, 0.418}, {0.330, 0.225}, {0.814, 0.796}};
        for (int i = 0; i < VP_HW_ATTN__N; i++)
            for (int ph = 0; ph < 2; ph++)
                hw->attn[i][ph].peak =
                    p->gemm_max_tflops[VP_GPU_BF16] * 1e12 * sh[i][ph];
    }
    if (!p->has_measured)
        return;
    const vp_gpu_measured *m = &p->measured;
    /* GEMMs back to back for seconds run at the power-limited clock */
    const vp_gpu_gemm_fit *gb = &m->gemm[VP_GPU_BF16];
    if (m->bf16_sustained_tflops.n && gb->points && gb->peak_tflops > 0)
        hw->sustained = m->bf16_sustained_tflops.median / gb->peak_tflops;
    if (hw->sustained > 1.0)
        hw->sustained = 1.0;
    for (int i = 0; i < VP_GPU__ATTN && i < VP_HW_ATTN__N; i++)
        for (int ph = 0; ph < 2; ph++) {
            const vp_gpu_gemm_fit *r = &m->attention[i][ph];
            if (r->points)
                hw->attn[i][ph] = (vp_curve){r->peak_tflops * 1e12,
                                             r->half_gflop * 1e9,
                                             r->exponent > 0 ? r->exponent
                                                             : 1.0,
                                             0};
        }
    for (int i = 0; i < VP_GPU__MEM && i < VP_HW_MEM__N; i++) {
        const vp_gpu_rate_fit *r = &m->membound[i];
        if (r->points)
            hw->mem_kind[i] = (vp_curve){r->peak * 1e9,
                                         r->peak * 1e9 * r->fixed_us * 1e-6,
                                         1.0, 0};
    }
    if (m->membound[VP_HW_MEM_COPY].points)
        hw->mem = hw->mem_kind[VP_HW_MEM_COPY];
    for (int i = 0; i < VP_GPU__OPTIM && i < VP_HW_OPTIM__N; i++)
        for (int d = 0; d < 2; d++) {
            const vp_gpu_optim_fit *o = &m->optimizer[i][d];
            if (o->points)
                hw->optim[i][d] = (vp_optim_cost){o->bytes_per_param, 0,
                                                  o->us_per_tensor};
        }
    if (m->dispatch_us.n)
        hw->dispatch = m->dispatch_us.median * 1e-6;
    if (m->host_probe_us.n)
        hw->host_probe = m->host_probe_us.median * 1e-6;
    if ((unsigned)curve < VP_GPU__DTYPES && m->gemm[curve].points &&
        p->peak_tflops[curve] > 0.0) {
        hw->eff_max = m->gemm[curve].peak_tflops / p->peak_tflops[curve];
        hw->f_half = m->gemm[curve].half_gflop * 1e9;
    }
    if (m->bw_gbps[VP_GPU_BW_COPY].n && p->memory_gbps > 0.0)
        hw->mem_eff = m->bw_gbps[VP_GPU_BW_COPY].median / p->memory_gbps;
    if (m->bw_gbps[VP_GPU_BW_H2D_PINNED].n)
        hw->host = m->bw_gbps[VP_GPU_BW_H2D_PINNED].median * 1e9;
    if (m->launch_gpu_us.n)
        hw->launch = m->launch_gpu_us.median * 1e-6;
}

/* ------------------------------------------------------------------ */
/* Writer                                                               */
/* ------------------------------------------------------------------ */

/* A double-quoted YAML string. */
static void put_q(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c < 0x20)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* A number with six significant digits; reads back with get_double. */
static void put_num(FILE *f, double x)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.6g", x);
    fputs(buf, f);
}

static void put_stat(FILE *f, int indent, const char *key,
                     const vp_gpu_stat *s)
{
    if (!s->n)
        return;
    fprintf(f, "%*s%s: {median: ", indent, "", key);
    put_num(f, s->median);
    fputs(", min: ", f);
    put_num(f, s->min);
    fputs(", max: ", f);
    put_num(f, s->max);
    fprintf(f, ", n: %u}\n", s->n);
}

static void put_u64(FILE *f, int indent, const char *key, uint64_t v)
{
    if (v)
        fprintf(f, "%*s%s: %llu\n", indent, "", key, (unsigned long long)v);
}

static void put_gemm(FILE *f, const vp_gpu_gemm_fit *g)
{
    fputs("{peak_tflops: ", f);
    put_num(f, g->peak_tflops);
    fputs(", half_gflop: ", f);
    put_num(f, g->half_gflop);
    fputs(", exponent: ", f);
    put_num(f, g->exponent > 0.0 ? g->exponent : 1.0);
    fputs(", rms_rel_err: ", f);
    put_num(f, g->rms_rel_err);
    fputs(", best_tflops: ", f);
    put_num(f, g->best_tflops);
    if (g->k_half > 0.0) {
        fputs(", k_half: ", f);
        put_num(f, g->k_half);
    }
    fprintf(f, ", points: %u}\n", g->points);
}

/* A fit of two constants: {k1: v1, k2: v2, rms_rel_err: .., points: ..} */
static void put_fit2(FILE *f, const char *k1, double v1, const char *k2,
                     double v2, double rms_rel_err, uint32_t points)
{
    fprintf(f, "{%s: ", k1);
    put_num(f, v1);
    fprintf(f, ", %s: ", k2);
    put_num(f, v2);
    fputs(", rms_rel_err: ", f);
    put_num(f, rms_rel_err);
    fprintf(f, ", points: %u}", points);
}

static void put_rate(FILE *f, const char *unit, const vp_gpu_rate_fit *r)
{
    put_fit2(f, unit, r->peak, "fixed_us", r->fixed_us, r->rms_rel_err,
             r->points);
}

static void put_gemm_row(FILE *f, const void *fit)
{
    put_gemm(f, fit);
}

static void put_optim_row(FILE *f, const void *fit)
{
    const vp_gpu_optim_fit *o = fit;
    put_fit2(f, "bytes_per_param", o->bytes_per_param, "us_per_tensor",
             o->us_per_tensor, o->rms_rel_err, o->points);
    fputc('\n', f);
}

static void put_membound_row(FILE *f, const void *fit)
{
    put_rate(f, "peak_gbps", fit);
    fputc('\n', f);
}

/* A section of fits by name (gemm, membound), or by name and by two
 * sub-names (attention: forward/backward, optimizer: fp32/bf16 state):
 * the array at offset `fits` of vp_gpu_measured, fits[i] or fits[i][j]
 * of `size` bytes each, with its points at offset `at`. Only the fits
 * with points are written, by put (which ends the line); nothing at all
 * when none has. */
typedef struct {
    const char *head;        /* the comment and the section's key */
    const char *const *names;
    const char *const *sub;  /* the two sub-names, NULL: none     */
    int n;
    size_t fits, size, at;
    void (*put)(FILE *f, const void *fit);
} fit_grid;

enum { GRID_GEMM, GRID_ATTENTION, GRID_MEMBOUND, GRID_OPTIMIZER };

static const fit_grid GRIDS[] = {
    [GRID_GEMM] = {"  # rate(W) = peak_tflops * W^h / (W^h + half_gflop^h), "
                   "h = exponent, W = 2mnk / 1e9\n  gemm:\n",
                   DTYPE_NAMES, NULL, VP_GPU__DTYPES,
                   offsetof(vp_gpu_measured, gemm), sizeof(vp_gpu_gemm_fit),
                   offsetof(vp_gpu_gemm_fit, points), put_gemm_row},
    [GRID_ATTENTION] = {"  # rate as for gemm, W = the call's GFLOP: "
                        "4bhs^2d (/2 causal), x2.5 bwd\n  attention:\n",
                        ATTN_NAMES, PHASE_NAMES, VP_GPU__ATTN,
                        offsetof(vp_gpu_measured, attention),
                        sizeof(vp_gpu_gemm_fit),
                        offsetof(vp_gpu_gemm_fit, points), put_gemm_row},
    [GRID_MEMBOUND] = {"  # time_us = fixed_us + bytes / (peak_gbps 1e3), "
                       "bytes read + written\n  membound:\n",
                       MEM_NAMES, NULL, VP_GPU__MEM,
                       offsetof(vp_gpu_measured, membound),
                       sizeof(vp_gpu_rate_fit),
                       offsetof(vp_gpu_rate_fit, points), put_membound_row},
    [GRID_OPTIMIZER] = {"  # time_us = numel bytes_per_param / copy "
                        "bandwidth + tensors us_per_tensor\n  optimizer:\n",
                        OPTIM_NAMES, STATE_NAMES, VP_GPU__OPTIM,
                        offsetof(vp_gpu_measured, optimizer),
                        sizeof(vp_gpu_optim_fit),
                        offsetof(vp_gpu_optim_fit, points), put_optim_row},
};

static const void *grid_fit(const vp_gpu_measured *m, const fit_grid *g,
                            int i, int j)
{
    size_t k = g->sub ? (size_t)i * 2 + (size_t)j : (size_t)i;
    return (const char *)m + g->fits + k * g->size;
}

/* Has fits[i] (j < 0), or fits[i][j], points? */
static bool grid_has(const vp_gpu_measured *m, const fit_grid *g, int i,
                     int j)
{
    if (j < 0 && g->sub)
        return grid_has(m, g, i, 0) || grid_has(m, g, i, 1);
    uint32_t points;
    memcpy(&points, (const char *)grid_fit(m, g, i, j < 0 ? 0 : j) + g->at,
           sizeof points);
    return points != 0;
}

static void write_grid(FILE *f, const vp_gpu_measured *m, int which)
{
    const fit_grid *g = &GRIDS[which];
    bool any = false;
    for (int i = 0; i < g->n; i++)
        any |= grid_has(m, g, i, -1);
    if (!any)
        return;
    fputs(g->head, f);
    for (int i = 0; i < g->n; i++) {
        if (!grid_has(m, g, i, -1))
            continue;
        if (!g->sub) {
            fprintf(f, "    %s: ", g->names[i]);
            g->put(f, grid_fit(m, g, i, 0));
            continue;
        }
        fprintf(f, "    %s:\n", g->names[i]);
        for (int j = 0; j < 2; j++) {
            if (!grid_has(m, g, i, j))
                continue;
            fprintf(f, "      %s: ", g->sub[j]);
            g->put(f, grid_fit(m, g, i, j));
        }
    }
}

/* The PyTorch sweep's sections (attention, membound, optimizer). */
static void write_sweep(FILE *f, const vp_gpu_measured *m)
{
    write_grid(f, m, GRID_ATTENTION);
    write_grid(f, m, GRID_MEMBOUND);
    write_grid(f, m, GRID_OPTIMIZER);
    put_stat(f, 2, "dispatch_us", &m->dispatch_us);
    put_stat(f, 2, "host_probe_us", &m->host_probe_us);
}

static void write_measured(FILE *f, const vp_gpu_measured *m)
{
    fputs("measured:\n", f);
    if (m->source[0]) {
        fputs("  source: ", f);
        put_q(f, m->source);
        fputc('\n', f);
    }
    if (m->device_name[0]) {
        fputs("  device_name: ", f);
        put_q(f, m->device_name);
        fputc('\n', f);
    }
    put_u64(f, 2, "total_bytes", m->total_bytes);
    put_u64(f, 2, "free_bytes", m->free_bytes);
    put_u64(f, 2, "max_alloc_bytes", m->max_alloc_bytes);
    put_u64(f, 2, "malloc_alignment_bytes", m->malloc_alignment_bytes);
    put_u64(f, 2, "malloc_granularity_bytes", m->malloc_granularity_bytes);
    put_u64(f, 2, "context_lazy_bytes", m->context_lazy_bytes);
    put_u64(f, 2, "context_eager_bytes", m->context_eager_bytes);
    put_stat(f, 2, "launch_us", &m->launch_us);
    put_stat(f, 2, "launch_gpu_us", &m->launch_gpu_us);
    put_stat(f, 2, "launch_sync_us", &m->launch_sync_us);
    bool any = false;
    for (int b = 0; b < VP_GPU__BWS; b++)
        any |= m->bw_gbps[b].n != 0;
    if (any) {
        fputs("  bandwidth_gbps:\n", f);
        for (int b = 0; b < VP_GPU__BWS; b++)
            put_stat(f, 4, BW_NAMES[b], &m->bw_gbps[b]);
    }
    write_grid(f, m, GRID_GEMM);
    put_stat(f, 2, "bf16_sustained_tflops", &m->bf16_sustained_tflops);
    write_sweep(f, m);
    any = false;
    for (int c = 0; c < VP_GPU__COLLS; c++)
        any |= m->nccl[c].points != 0;
    if (any) {
        fputs("  # time_us(bytes) = latency_us + bytes / (bandwidth_gbps * "
              "1e3)\n  nccl:\n",
              f);
        for (int c = 0; c < VP_GPU__COLLS; c++) {
            const vp_gpu_coll_fit *x = &m->nccl[c];
            if (!x->points)
                continue;
            fprintf(f, "    %s: {ranks: %u, latency_us: ", COLL_NAMES[c],
                    x->ranks);
            put_num(f, x->latency_us);
            fputs(", bandwidth_gbps: ", f);
            put_num(f, x->bandwidth_gbps);
            fputs(", rms_rel_err: ", f);
            put_num(f, x->rms_rel_err);
            fprintf(f, ", points: %u}\n", x->points);
        }
    }
    if (m->context_bytes || m->cublas_workspace_bytes ||
        m->framework_source[0]) {
        fputs("  framework:\n", f);
        put_u64(f, 4, "context_bytes", m->context_bytes);
        put_u64(f, 4, "cublas_workspace_bytes", m->cublas_workspace_bytes);
        if (m->framework_source[0]) {
            fputs("    source: ", f);
            put_q(f, m->framework_source);
            fputc('\n', f);
        }
    }
    if (m->torch_bf16_tflops.n || m->torch_copy_gbps.n) {
        fputs("  torch:\n", f);
        put_stat(f, 4, "bf16_matmul_tflops", &m->torch_bf16_tflops);
        put_stat(f, 4, "copy_gbps", &m->torch_copy_gbps);
    }
}

vp_status vp_gpu_write(const vp_gpu_profile *p, FILE *f, vp_error *err)
{
    fputs("# vramplan GPU profile (schema: calibrate/README.md)\n", f);
    fputs("name: ", f);
    put_q(f, p->name);
    fputs("\nproduct: ", f);
    put_q(f, p->product);
    fputs("\ndevice_names: [", f);
    for (size_t i = 0; i < p->n_device_names; i++) {
        if (i)
            fputs(", ", f);
        put_q(f, p->device_names[i]);
    }
    fprintf(f, "]\nvendor: %s\narch: ", p->vendor);
    put_q(f, p->arch);
    fputs("\ncompute_capability: ", f);
    put_q(f, p->cc);
    fputc('\n', f);
    if (p->sm_count)
        fprintf(f, "sm_count: %u\n", p->sm_count);
    fprintf(f, "memory_bytes: %llu\n", (unsigned long long)p->memory_bytes);
    put_u64(f, 0, "usable_bytes", p->usable_bytes);
    fputs("memory_gbps: ", f);
    put_num(f, p->memory_gbps);
    fputs("\npeak_tflops:\n", f);
    for (int t = 0; t < VP_GPU__DTYPES; t++) {
        if (p->peak_tflops[t] == 0.0)
            continue;
        fprintf(f, "  %s: ", DTYPE_NAMES[t]);
        put_num(f, p->peak_tflops[t]);
        fputc('\n', f);
    }
    bool any_max = false;
    for (int t = 0; t < VP_GPU__DTYPES; t++)
        any_max |= p->gemm_max_tflops[t] > 0.0;
    if (any_max) {
        fputs("gemm_max_tflops:\n", f);
        for (int t = 0; t < VP_GPU__DTYPES; t++) {
            if (p->gemm_max_tflops[t] == 0.0)
                continue;
            fprintf(f, "  %s: ", DTYPE_NAMES[t]);
            put_num(f, p->gemm_max_tflops[t]);
            fputc('\n', f);
        }
    }
    fprintf(f, "host_link: {kind: pcie, gen: %u, lanes: %u, gbps: ",
            p->pcie_gen, p->pcie_lanes);
    put_num(f, p->pcie_gbps);
    fprintf(f, "}\ngpu_link: {kind: %s", p->link_kind);
    if (strcmp(p->link_kind, "none") != 0) {
        fputs(", gbps: ", f);
        put_num(f, p->link_gbps);
    }
    fprintf(f, "}\ncontext_bytes: %llu\ncontext_estimated: %s\n",
            (unsigned long long)p->context_bytes,
            p->context_estimated ? "true" : "false");
    if (p->context_note) {
        fputs("context_note: ", f);
        put_q(f, p->context_note);
        fputc('\n', f);
    }
    fprintf(f, "cublas_workspace_bytes: %llu\nsources:\n",
            (unsigned long long)p->cublas_workspace_bytes);
    for (size_t i = 0; i < p->n_sources; i++) {
        fputs("  - ", f);
        put_q(f, p->sources[i]);
        fputc('\n', f);
    }
    if (p->notes) {
        fputs("notes: ", f);
        put_q(f, p->notes);
        fputc('\n', f);
    }
    if (p->is_mig) {
        fputs("mig:\n  of: ", f);
        put_q(f, p->mig.of);
        fputs("\n  profile: ", f);
        put_q(f, p->mig.profile);
        fprintf(f,
                "\n  compute_slices: %u\n  memory_slices: %u\n"
                "  instances: %u\n  copy_engines: %u\n  decoders: %u\n"
                "  jpeg: %u\n  ofa: %u\n",
                p->mig.compute_slices, p->mig.memory_slices,
                p->mig.instances, p->mig.copy_engines, p->mig.decoders,
                p->mig.jpeg, p->mig.ofa);
    }
    if (p->has_measured)
        write_measured(f, &p->measured);
    if (fflush(f) != 0 || ferror(f))
        return vp_error_set(err, VP_EIO, "cannot write the profile: %s",
                            strerror(errno));
    return VP_OK;
}
