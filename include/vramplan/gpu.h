/* vramplan: GPU profiles and their calibration.
 *
 * A profile (gpus/NAME.yaml) holds a GPU's datasheet figures with their
 * sources: memory, dense peak rates per data type, memory and link
 * bandwidths, and the two framework constants the simulator uses (the CUDA
 * context outside PyTorch's allocator and the cuBLAS workspace). A profile
 * may also carry a `measured:` section, written by `vramplan calibrate`
 * (from the raw output of calibrate/vp-calibrate) and `vramplan fit` (from
 * measured training runs): GEMM efficiency curves, measured bandwidths,
 * launch latency, NCCL fits and fitted framework constants.
 *
 *   vp_error err;
 *   vp_gpu_profile *p = vp_gpu_load("h100-80g", &err);  // gpus/h100-80g.yaml
 *   double bf16 = vp_gpu_peak_tflops(p, VP_GPU_BF16);   // 989.4
 *   vp_setup s; vp_setup_init(&s); vp_gpu_apply(p, &s); // context, workspace, SMs
 *   vp_gpu_free(p);
 *
 * Units are in the names: _bytes (bytes), _gbps (10^9 bytes/s), _tflops
 * (10^12 floating-point operations/s), _us (microseconds), _gflop (10^9
 * floating-point operations). */
#ifndef VRAMPLAN_GPU_H
#define VRAMPLAN_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vramplan/error.h"
#include "vramplan/sim.h"

/* GEMM data types: operands and the arithmetic (fp32 is plain fp32 FMA;
 * tf32 is fp32 data through tensor cores; fp8 is E4M3). */
#define VP_GPU_DTYPE_MAP(XX)                                                \
    XX(FP32, "fp32")                                                        \
    XX(TF32, "tf32")                                                        \
    XX(FP16, "fp16")                                                        \
    XX(BF16, "bf16")                                                        \
    XX(FP8, "fp8")

typedef enum {
#define VP__GDT(name, str) VP_GPU_##name,
    VP_GPU_DTYPE_MAP(VP__GDT)
#undef VP__GDT
    VP_GPU__DTYPES
} vp_gpu_dtype;

/* Collectives measured through NCCL. */
#define VP_GPU_COLL_MAP(XX)                                                 \
    XX(ALL_REDUCE, "all_reduce")                                            \
    XX(ALL_GATHER, "all_gather")                                            \
    XX(REDUCE_SCATTER, "reduce_scatter")

typedef enum {
#define VP__GCO(name, str) VP_GPU_##name,
    VP_GPU_COLL_MAP(VP__GCO)
#undef VP__GCO
    VP_GPU__COLLS
} vp_gpu_coll;

/* Bandwidths measured by vp-calibrate. copy and triad count bytes read
 * plus bytes written; d2d_memcpy is cudaMemcpy device to device (same
 * counting); the host links count the bytes moved. */
#define VP_GPU_BW_MAP(XX)                                                   \
    XX(COPY, "copy")                                                        \
    XX(TRIAD, "triad")                                                      \
    XX(D2D_MEMCPY, "d2d_memcpy")                                            \
    XX(H2D_PINNED, "h2d_pinned")                                            \
    XX(D2H_PINNED, "d2h_pinned")                                            \
    XX(H2D_PAGEABLE, "h2d_pageable")                                        \
    XX(D2H_PAGEABLE, "d2h_pageable")

typedef enum {
#define VP__GBW(name, str) VP_GPU_BW_##name,
    VP_GPU_BW_MAP(VP__GBW)
#undef VP__GBW
    VP_GPU__BWS
} vp_gpu_bw;

/* A repeated measurement: median, smallest and largest sample, count.
 * n == 0 means absent. */
typedef struct vp_gpu_stat {
    double median, min, max;
    uint32_t n;
} vp_gpu_stat;

/* GEMM efficiency curve of one data type:
 *
 *   rate(W) = peak_tflops * W^h / (W^h + half_gflop^h)    (W in GFLOP)
 *
 * the rate of a matmul of W = 2mnk/1e9 GFLOP: a saturating (Hill) curve
 * that reaches half the peak at half_gflop. With h = 1 it is a fixed cost
 * plus a peak rate, time(W) = t0 + W / peak with half_gflop = peak * t0;
 * measured curves are steeper (h > 1): small GEMMs leave multiprocessors
 * idle as well as paying the launch. points == 0 means absent. */
typedef struct vp_gpu_gemm_fit {
    uint32_t points;     /* shapes fitted                                 */
    double peak_tflops;  /* asymptotic rate                               */
    double half_gflop;   /* work at half the peak                         */
    double exponent;     /* h; 1 when the profile gives none              */
    double rms_rel_err;  /* root mean square of (fit - median) / median   */
    double best_tflops;  /* highest median measured                       */
    double k_half;       /* the inner dimension at which the rate is halved
                            again, rate x k / (k + k_half); 0 = none      */
} vp_gpu_gemm_fit;

/* A kernel family's time against its size (FLOP for attention, bytes
 * read + written for memory-bound kernels):
 *   time_us(w) = fixed_us + w / rate
 * rate = peak (TFLOP/s or GB/s). points == 0 means absent. */
typedef struct vp_gpu_rate_fit {
    uint32_t points;
    double peak;         /* TFLOP/s (attention) or GB/s (memory-bound)    */
    double fixed_us;
    double rms_rel_err;
} vp_gpu_rate_fit;

/* An optimizer step's time against its parameters and tensors:
 *   time_us = numel x bytes_per_param / copy bandwidth + tensors x us_per_
 *   tensor. points == 0 means absent. */
typedef struct vp_gpu_optim_fit {
    uint32_t points;
    double bytes_per_param, us_per_tensor, rms_rel_err;
} vp_gpu_optim_fit;

/* Sweep families (scripts/h200_sweeps.py): SDPA backends (their rate by
 * the call's GFLOP is a Hill curve like a GEMM's), memory-bound
 * kernel classes, optimizers; the names are timing.h's. */
#define VP_GPU__ATTN 3
#define VP_GPU__MEM 9
#define VP_GPU__OPTIM 4

/* A collective's time against its message size:
 *   time_us(bytes) = latency_us + bytes / (bandwidth_gbps * 1e3)
 * bytes as nccl-tests count them (one rank's buffer for all-reduce, the
 * gathered output for all-gather, the input for reduce-scatter).
 * points == 0 means absent. */
typedef struct vp_gpu_coll_fit {
    uint32_t ranks, points;
    double latency_us, bandwidth_gbps, rms_rel_err;
} vp_gpu_coll_fit;

/* What calibration and fitting measured. Every field is optional: 0 (or
 * an empty string, or n/points 0) means absent. */
typedef struct vp_gpu_measured {
    char source[256];          /* program, date, driver, runtime           */
    char device_name[128];     /* as CUDA reports it                       */
    uint64_t total_bytes;      /* cudaMemGetInfo total                      */
    uint64_t free_bytes;       /* free after this process's context         */
    uint64_t max_alloc_bytes;  /* largest single cudaMalloc (2 MiB steps)   */
    uint64_t malloc_alignment_bytes;   /* of every address returned         */
    uint64_t malloc_granularity_bytes; /* large allocations take multiples  */
    uint64_t context_lazy_bytes;  /* bare CUDA runtime after init, LAZY     */
    uint64_t context_eager_bytes; /* the same, CUDA_MODULE_LOADING=EAGER    */
    vp_gpu_stat launch_us;      /* host cost of one kernel launch           */
    vp_gpu_stat launch_gpu_us;  /* back-to-back empty kernels on the GPU    */
    vp_gpu_stat launch_sync_us; /* launch + synchronize round trip          */
    vp_gpu_stat bw_gbps[VP_GPU__BWS];
    vp_gpu_gemm_fit gemm[VP_GPU__DTYPES];
    vp_gpu_coll_fit nccl[VP_GPU__COLLS];
    /* PyTorch sweep (vramplan calibrate --sweep): SDPA by backend, forward
     * and backward (bf16; FLOPs 4bhs^2d, halved when causal, x2.5
     * backward); memory-bound kernels by class; optimizers by variant and
     * state dtype (fp32, bf16); the host cost of one eager kernel */
    vp_gpu_gemm_fit attention[VP_GPU__ATTN][2]; /* rate by GFLOP       */
    vp_gpu_rate_fit membound[VP_GPU__MEM];
    vp_gpu_optim_fit optimizer[VP_GPU__OPTIM][2];
    vp_gpu_stat dispatch_us;
    /* the host benchmark (collect_hostprobe.py `probe`) on the host the
     * host terms were measured on (calibrate/fit-host-probe.py) */
    vp_gpu_stat host_probe_us;
    /* framework constants (the simulator's vp_setup fields) */
    uint64_t context_bytes;          /* CUDA context outside the allocator */
    uint64_t cublas_workspace_bytes; /* cuBLAS workspace per handle         */
    char framework_source[256];      /* how they were obtained              */
    /* PyTorch in the same run, for comparison */
    vp_gpu_stat bf16_sustained_tflops; /* bf16 8192^3 back to back for
                                          ~0.5 s, in ~50 ms windows: the
                                          rate under the power limit       */
    vp_gpu_stat torch_bf16_tflops;   /* torch.matmul bf16 8192^3            */
    vp_gpu_stat torch_copy_gbps;     /* Tensor.copy_ of 1 GiB, read+write   */
} vp_gpu_measured;

typedef struct vp_gpu_profile vp_gpu_profile;

/* A MIG slice (profile key `mig:`): the GPU it is cut from and its share,
 * as NVIDIA's MIG user guide lists them. */
typedef struct vp_gpu_mig {
    const char *of;          /* profile name of the whole GPU ("h100-80g") */
    const char *profile;     /* NVIDIA's profile name ("1g.10gb")          */
    uint32_t compute_slices; /* of 7                                       */
    uint32_t memory_slices;  /* of 8                                       */
    uint32_t instances;      /* at most this many on one GPU               */
    uint32_t copy_engines, decoders, jpeg, ofa;
} vp_gpu_mig;

/* Load a profile. path_or_name is a file path (it contains a '/' or ends
 * in .yaml) or a bare name like "h100-80g", looked up as NAME.yaml in
 * $VRAMPLAN_GPU_DIR and then in gpus/. The schema is strict: unknown keys,
 * missing or mistyped fields are errors with the file, line and column.
 * Returns a profile owned by the caller (vp_gpu_free), or NULL with *err
 * set: VP_EIO (not found, unreadable), VP_ESYNTAX, VP_ESCHEMA, VP_ERANGE,
 * VP_ELIMIT, VP_ENOMEM. */
vp_gpu_profile *vp_gpu_load(const char *path_or_name, vp_error *err);

/* The same from a buffer; `path` is used in error messages. */
vp_gpu_profile *vp_gpu_parse_buf(const char *buf, size_t len,
                                 const char *path, vp_error *err);

/* Release a profile. NULL is a no-op. */
void vp_gpu_free(vp_gpu_profile *p);

/* Names of the profiles shipped in gpus/, NULL-terminated. */
extern const char *const vp_gpu_builtin_names[];

/* Find the shipped profile whose device_names holds `device_name` (as
 * cudaGetDeviceProperties or torch.cuda.get_device_name report it; case
 * and surrounding spaces ignored). Returns a name of vp_gpu_builtin_names,
 * or NULL. Loads the files to look; errors are ignored. */
const char *vp_gpu_match_device(const char *device_name);

/* ---- accessors (strings valid until vp_gpu_free) ------------------- */
const char *vp_gpu_name(const vp_gpu_profile *p);    /* "h100-80g"       */
const char *vp_gpu_product(const vp_gpu_profile *p); /* "NVIDIA H100 SXM5 80GB" */
const char *vp_gpu_vendor(const vp_gpu_profile *p);  /* "nvidia", "amd"  */
const char *vp_gpu_arch(const vp_gpu_profile *p);    /* "hopper"         */
/* "9.0" for NVIDIA, "gfx942" for AMD. */
const char *vp_gpu_compute_capability(const vp_gpu_profile *p);

/* Streaming multiprocessors (AMD: compute units; profile key sm_count)
 * from the datasheet, or the slice's for a MIG profile; 0 when the profile
 * does not give them. */
uint32_t vp_gpu_sm_count(const vp_gpu_profile *p);
/* The MIG section, or NULL when the profile is a whole GPU. Strings valid
 * until vp_gpu_free. */
const vp_gpu_mig *vp_gpu_mig_get(const vp_gpu_profile *p);

/* Datasheet memory capacity (the vendor's GB taken as GiB, as nvidia-smi
 * counts it). */
uint64_t vp_gpu_memory_bytes(const vp_gpu_profile *p);
/* What the runtime reports as the device's total (cudaMemGetInfo): the
 * measured total if the profile has one, else `usable_bytes`, else
 * memory_bytes. */
uint64_t vp_gpu_usable_bytes(const vp_gpu_profile *p);

/* Dense (no sparsity) datasheet peak, TFLOP/s; 0 when the GPU has no
 * such arithmetic (bf16 on a V100, fp8 before Ada/Hopper). */
double vp_gpu_peak_tflops(const vp_gpu_profile *p, vp_gpu_dtype t);
/* Expected rate of a GEMM of `gflop` (2mnk / 1e9) in data type t: the
 * measured efficiency curve when the profile has one, else the datasheet
 * peak. 0 when the GPU has no such arithmetic. */
double vp_gpu_gemm_tflops(const vp_gpu_profile *p, vp_gpu_dtype t,
                          double gflop);

double vp_gpu_memory_gbps(const vp_gpu_profile *p);  /* HBM/GDDR, datasheet */
/* Host link: PCIe generation, lanes, and bandwidth in one direction. */
uint32_t vp_gpu_pcie_gen(const vp_gpu_profile *p);
uint32_t vp_gpu_pcie_lanes(const vp_gpu_profile *p);
double vp_gpu_pcie_gbps(const vp_gpu_profile *p);
/* GPU-to-GPU link (NVLink, Infinity Fabric), both directions together as
 * vendors quote it; 0 when there is none. */
double vp_gpu_link_gbps(const vp_gpu_profile *p);

/* CUDA context outside the caching allocator with PyTorch: the measured
 * or fitted framework constant when present, else the profile's
 * context_bytes. *estimated (may be NULL) says whether that figure is an
 * estimate rather than a measurement. */
uint64_t vp_gpu_context_bytes(const vp_gpu_profile *p, bool *estimated);
/* cuBLAS workspace per handle that PyTorch allocates (32 MiB from compute
 * capability 9.0, else 8519680 B); the fitted value when present. */
uint64_t vp_gpu_cublas_workspace_bytes(const vp_gpu_profile *p);

/* The measured section, or NULL when the profile has none. */
const vp_gpu_measured *vp_gpu_measured_get(const vp_gpu_profile *p);
/* Replace the measured section (copied). VP_OK or VP_EARG. */
vp_status vp_gpu_measured_set(vp_gpu_profile *p, const vp_gpu_measured *m,
                              vp_error *err);

/* Set the simulator's constants from the profile: context_bytes,
 * cublas_workspace, sm_count (when the profile gives it) and
 * alloc.device_total (usable bytes). */
void vp_gpu_apply(const vp_gpu_profile *p, vp_setup *s);

/* Fill the step-time model's hardware description (timing.h) from the
 * profile: datasheet rates, usable memory, context; from the measured
 * section when present, the GEMM curve of data type `curve` (eff_max =
 * fitted peak / datasheet peak, f_half), the copy bandwidth's share of the
 * datasheet (mem_eff), pinned host-to-device bandwidth and the launch
 * time. nvlink is per direction (half of vp_gpu_link_gbps). */
struct vp_hw;
void vp_gpu_hw(const vp_gpu_profile *p, vp_gpu_dtype curve,
               struct vp_hw *out);

/* Write the profile as YAML (the schema vp_gpu_load reads; comments are
 * not kept). VP_EIO on a write error. */
vp_status vp_gpu_write(const vp_gpu_profile *p, FILE *f, vp_error *err);

const char *vp_gpu_dtype_name(vp_gpu_dtype t);
const char *vp_gpu_coll_name(vp_gpu_coll c);
const char *vp_gpu_bw_name(vp_gpu_bw b);

/* ---- calibration: vp-calibrate's raw output (src/fit.c) ------------ */

/* The raw output, parsed: every sample of every line. Opaque. */
typedef struct vp_calib vp_calib;

/* Parse vp-calibrate's stdout (JSON lines; a line of `vramplan calibrate`'s
 * PyTorch probe may follow). Unknown kinds are errors, so are malformed
 * lines (with the line number). Returns a vp_calib owned by the caller
 * (vp_calib_free) or NULL with *err set. */
vp_calib *vp_calib_parse(const char *buf, size_t len, const char *path,
                         vp_error *err);
void vp_calib_free(vp_calib *c);

/* Reduce and fit the raw measurements into *out (zeroed first): medians
 * and spreads, GEMM efficiency curves (GSL nonlinear least squares), NCCL
 * latency/bandwidth fits, malloc granularity. `source` is copied into
 * out->source. VP_ERANGE when a fit fails. */
vp_status vp_calib_reduce(const vp_calib *c, const char *source,
                          vp_gpu_measured *out, vp_error *err);

/* The device name in the raw output ("" if none); valid until
 * vp_calib_free. */
const char *vp_calib_device_name(const vp_calib *c);

/* Skipped measurements, "what: why" each; valid until vp_calib_free. */
size_t vp_calib_skips(const vp_calib *c, const char *const **out);

/* One fitted GEMM point, for reports: shape, median and fitted rate. */
typedef struct vp_calib_gemm_point {
    vp_gpu_dtype dtype;
    uint32_t m, n, k;
    double gflop, median_tflops, min_tflops, max_tflops;
} vp_calib_gemm_point;
size_t vp_calib_gemm_points(const vp_calib *c,
                            const vp_calib_gemm_point **out);

/* Fit rate(W) = P W^h / (W^h + K^h) to n points (W in GFLOP, rates in
 * TFLOP/s) by nonlinear least squares on relative residuals; h is fitted
 * (0.25 to 8) when n >= 3, else 1. n >= 2. */
vp_status vp_fit_gemm_curve(const double *gflop, const double *tflops,
                            size_t n, vp_gpu_gemm_fit *out, vp_error *err);

/* Fit time_us = L + bytes / (B * 1e3) to n points, least squares on
 * relative residuals. n >= 2. out->ranks is kept; the rest is set. */
vp_status vp_fit_latency_bw(const double *bytes, const double *us, size_t n,
                            vp_gpu_coll_fit *out, vp_error *err);

/* ---- a PyTorch sweep (scripts/h200_sweeps.py, src/fit_curves.c) ----- */

/* The sweep's JSON lines (kinds gemm, sdpa, membound, optim, launch; env
 * and step_profile lines are read and ignored), parsed. Opaque. */
typedef struct vp_sweep vp_sweep;

/* Parse a sweep: strict JSON, one object a line, each kind's fields
 * checked (an unknown kind, field or class, a missing or negative figure is
 * an error at path:line:column); a line with "error" (a shape that failed
 * on the GPU) is skipped. Returns a vp_sweep owned by the caller
 * (vp_sweep_free) or NULL with *err set (VP_ESYNTAX, VP_ESCHEMA,
 * VP_ERANGE, VP_ELIMIT, VP_ENOMEM). */
vp_sweep *vp_sweep_parse(const char *buf, size_t len, const char *path,
                         vp_error *err);
void vp_sweep_free(vp_sweep *w);

/* Fit the sweep's families into m: GEMM curves per dtype (with k_half),
 * attention per backend and direction, memory-bound classes, optimizers,
 * dispatch_us. Families the sweep lacks are left as they are. VP_ERANGE
 * when a fit fails. */
vp_status vp_sweep_fit(const vp_sweep *w, vp_gpu_measured *m, vp_error *err);

/* ---- framework constants from measured runs (src/fit.c) ------------- */

/* One case of a ground-truth file, as the fit saw it. */
typedef struct vp_fit_case {
    char id[128];
    uint64_t measured_device, measured_reserved, predicted_reserved;
    double err_before, err_after; /* relative error of predicted
                                     device_used (predicted reserved +
                                     context) before and after the fit     */
} vp_fit_case;

typedef struct vp_fit_result {
    vp_fit_case *cases;   /* n_cases entries; vp_fit_result_destroy frees */
    size_t n_cases;
    size_t skipped;       /* cases without device_used or peak_reserved,
                             or that could not be simulated               */
    char skip_note[300];  /* the first skipped case and why ("" if none) */
    uint64_t context_before, context_after; /* bytes                      */
    double context_sd_bytes;                /* standard error of the fit;
                                               NaN with one case (exact) */
    double rms_before, rms_after;           /* of the relative errors     */
    double median_abs_before, median_abs_after;
    double max_abs_before, max_abs_after;
} vp_fit_result;

/* Fit the CUDA context (device_used = peak_reserved + context) to the
 * cases of ground-truth files (the schema of shared/groundtruth: one JSON
 * object a line, the first holding the environment). Each case is
 * simulated through vp_validate_line (models looked up in dirs) for the
 * before/after residuals of the predicted device_used; the constant itself
 * is fitted to the measured reserved and device bytes, so that errors of
 * the simulated reserved bytes do not leak into it (GSL nonlinear least
 * squares on relative residuals). context_before is the starting value
 * (the profile's, or vp_setup_init's). VP_EIO, VP_ESCHEMA with the
 * case's file:line, VP_ERANGE when there is nothing to fit. */
vp_status vp_fit_framework(const char *const *files, size_t n_files,
                           const char *const *dirs, size_t n_dirs,
                           uint64_t context_before, vp_fit_result *out,
                           vp_error *err);
void vp_fit_result_destroy(vp_fit_result *r);

#endif
