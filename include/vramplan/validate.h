/* vramplan: checking the simulator against measured PyTorch runs.
 *
 * Reads files in the schema of the shared ground truth (JSON lines: the
 * first line holding the environment, then one case a line), simulates
 * each case and compares predicted with measured figures.
 *
 * Case lines are strict JSON with an explicit schema per kind of line
 * (a training-step case, a max-batch case, one rank of a multi-GPU run,
 * the env line; docs in README.md "Accuracy" and ../shared/groundtruth/
 * README.md): every field is checked for its type and range, an unknown
 * field is an error that names it with file:line:column, and a field that
 * a later version will read (lora, quant, generate, ...) is refused as
 * "not supported yet" instead of being ignored. */
#ifndef VRAMPLAN_VALIDATE_H
#define VRAMPLAN_VALIDATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/sim.h"
#include "vramplan/timing.h"

/* Metrics of one case: 5 totals and 3 phase peaks per simulated step. */
#define VP_VALIDATE_MAX_METRICS (16 + 3 * VP_MAX_STEPS)
/* The largest world a multi-GPU case may name (the cluster planner's GPU
 * counts are 32-bit; runs this large are not measured here). */
#define VP_VALIDATE_MAX_WORLD 65536u
/* Bytes in one line of a ground-truth file (a case is ~2 KiB): a longer
 * line is an error, so that a binary file or /dev/zero stops at once. */
#define VP_VALIDATE_MAX_LINE ((size_t)1 << 20)

/* The kinds of line of a ground-truth file. */
typedef enum {
    VP_GT_CASE,     /* training (or inference) steps on one GPU        */
    VP_GT_MAXBATCH, /* the largest batch under budget_gib              */
    VP_GT_RANK,     /* one rank of a multi-GPU run (world, rank, ...)  */
    VP_GT_GENERATE  /* model.generate() calls (generate, cache, runs)  */
} vp_gt_kind;

typedef struct vp_metric {
    char name[32];        /* "peak_alloc", "step1.fwd_peak", "step_us",
                             "max_batch", "rank1.peak_reserved",
                             "largest.peak_alloc" (the run's most loaded
                             rank, against the largest measured: made by
                             the file reader from its ranks' lines),
                             "run1.peak", "kv_cache_bytes"               */
    uint64_t predicted;   /* bytes (a batch for max_batch, us for step_us) */
    uint64_t measured;    /* > 0                                         */
    double rel_err;       /* (predicted - measured) / measured           */
} vp_metric;

typedef struct vp_case_result {
    vp_gt_kind kind;
    char id[128];         /* "" when the line has none                   */
    char model[64];
    uint32_t run;         /* a multi-GPU case's "run", 0 when absent     */
    uint32_t world, rank; /* a multi-GPU case's (world 0: one GPU)       */
    vp_metric metrics[VP_VALIDATE_MAX_METRICS];
    size_t n_metrics;
} vp_case_result;

/* What the env line (the first of a file) says the runs ran on; absent
 * fields are "" or 0. */
typedef struct vp_gt_env {
    char gpu[128];           /* "NVIDIA H200", as torch names the device */
    char torch[64];
    uint64_t total_bytes;    /* mem_get_info total                       */
    uint64_t context_bytes;  /* context_used_after_init                  */
    uint64_t world_size;     /* multi-GPU files                          */
    bool warmed_up;          /* the env names peft: collect_more.py, which
                                runs a warm-up (backward, autocast,
                                checkpointing) before its first case, so
                                no case pays the library workspaces     */
    double host_probe_us;    /* the session's host: the median of the case
                                lines' host_probe_us; 0 = none           */
} vp_gt_env;

/* How to run a case line. */
typedef struct vp_validate_opts {
    const char *path;          /* the file, for messages                 */
    uint32_t line;             /* the case's line in it (1-based)        */
    const char *const *dirs;   /* models: NAME.yaml, then NAME.json, in  */
    size_t n_dirs;             /*   each directory in order              */
    bool first_in_process;     /* collect.py runs a file's cases in one
                                  process: only the first pays the
                                  library workspaces                     */
    const vp_setup *base;      /* NULL: vp_setup_init's defaults (e.g. a
                                  GPU profile's via vp_gpu_apply)         */
    const vp_hw *hw;           /* the GPU the runs used: the per-rank
                                  model of multi-GPU cases needs it (NULL:
                                  they are refused), and the step time   */
    bool step_time;            /* add "step_us" (the step-time model on
                                  hw against the measured step_ms)        */
    uint64_t context_bytes;    /* multi-GPU cases: the CUDA context and
                                  NCCL's memory outside the allocator (the
                                  env line's context_used_after_init,
                                  measured after the process group's
                                  warm-up); 0: the setup's               */
    double host_probe_us;      /* the session's host benchmark (the
                                  file's vp_gt_env.host_probe_us): the
                                  step time of a line that carries one is
                                  timed on that host; 0 = each line's own */
} vp_validate_opts;

/* Check and run one case line (not the env line): simulate a training
 * case, search a max-batch case (collect.py's doubling search), or
 * evaluate a multi-GPU rank with the cluster planner's per-GPU model, and
 * compare with the measured figures. Measured peaks must agree with each
 * other (peak_alloc is the largest phase peak, peak_alloc_steady the last
 * step's, peak_reserved the largest step reserved), as collect.py
 * records them. out->kind, id and model are filled as soon as they are
 * read. Errors carry path:line:column: VP_ESYNTAX (not JSON), VP_ESCHEMA
 * (an unknown, missing or mistyped field), VP_ERANGE (a value out of
 * range, inconsistent measurements), VP_EUNSUPPORTED (a field or a setup
 * that is not modelled yet), VP_ELIMIT, VP_EARG (the case failed when it
 * was measured), VP_EIO (the model is not found), or the simulator's. */
vp_status vp_validate_line(const char *json, size_t len,
                           const vp_validate_opts *o, vp_case_result *out,
                           vp_error *err);

/* Parse an env line ({"env": {...}}, strictly). */
vp_status vp_validate_env(const char *json, size_t len, const char *path,
                          uint32_t line, vp_gt_env *out, vp_error *err);

/* ---- ground-truth files, line by line -------------------------------- */

typedef struct vp_gt_file vp_gt_file;

/* Open a ground-truth file and read its env line when the first line is
 * one. Returns a reader owned by the caller (vp_gt_close), or NULL with
 * *err set (VP_EIO, or the env line's error). */
vp_gt_file *vp_gt_open(const char *path, vp_error *err);
/* The env line, or NULL when the file has none. */
const vp_gt_env *vp_gt_file_env(const vp_gt_file *f);
/* The next case line: *json (valid until the next call), *len, *line.
 * *end is set after the last. Blank lines are skipped. VP_ELIMIT for a
 * line over VP_VALIDATE_MAX_LINE bytes, VP_ESYNTAX for a NUL byte,
 * VP_EIO. */
vp_status vp_gt_next(vp_gt_file *f, const char **json, size_t *len,
                     uint32_t *line, bool *end, vp_error *err);
void vp_gt_close(vp_gt_file *f);

/* ---- error bounds ------------------------------------------------------
 *
 * `validate --max-error` and a bounds file (groundtruth/bounds.json) turn
 * the comparison into a check: per group of metrics, the median and the
 * largest |relative error| of a file's cases must stay within bounds (in
 * percent), except documented outliers, each listed by case id with its
 * reason and the error it is known to have (within a tolerance: the
 * outlier is checked too, not hidden). */

#define VP_METRIC_GROUP_MAP(XX)                                            \
    XX(ALLOCATED, "allocated")     /* peak_alloc, largest.peak_alloc    */ \
    XX(RESERVED, "reserved")       /* peak_reserved, largest.peak_reserved */ \
    XX(DEVICE_USED, "device_used") /* device_used, largest.device_used  */ \
    XX(AFTER_MODEL, "after_model") /* after_model, rankN.after_model    */ \
    XX(PHASES, "phases")           /* stepN.fwd_peak, bwd_peak, opt_peak,
                                      runN.peak (a generate() call's)    */ \
    XX(MAX_BATCH, "max_batch")                                             \
    XX(STEP_TIME, "step_time")     /* step_us against step_ms           */ \
    XX(PARAMS, "params")           /* params, trainable_params,
                                      total_params                      */ \
    XX(SETUP, "setup")             /* setup_peak                        */ \
    XX(KV_CACHE, "kv_cache")       /* kv_cache_bytes of generate()      */ \
    XX(RANK_ALLOCATED, "rank_allocated")     /* rankN.peak_alloc       */ \
    XX(RANK_RESERVED, "rank_reserved")       /* rankN.peak_reserved    */ \
    XX(RANK_DEVICE_USED, "rank_device_used") /* rankN.device_used      */

typedef enum {
#define VP__MG(name, str) VP_MG_##name,
    VP_METRIC_GROUP_MAP(VP__MG)
#undef VP__MG
    VP_MG__COUNT
} vp_metric_group;

/* The group of a metric name, or -1 for a name validate never makes. */
int vp_metric_group_of(const char *metric);
const char *vp_metric_group_name(vp_metric_group g);

typedef struct vp_error_bound {
    bool set;
    bool has_median;
    double median_pct;     /* the median |error| at most this, percent   */
    double max_pct;        /* every case's |error| at most this          */
} vp_error_bound;

/* Parse "GROUP=MAX" or "GROUP=MEDIAN/MAX" items, comma-separated
 * ("allocated=0.01/0.1,max_batch=1.5"); percentages, finite and >= 0. A
 * group given twice, an unknown group (with a suggestion) or a bad number
 * is VP_EARG with a message naming it. */
vp_status vp_error_bounds_parse(const char *spec,
                                vp_error_bound out[VP_MG__COUNT],
                                vp_error *err);

/* A documented outlier: a case (id, and run when the file measures one
 * twice) whose metric is known to be off by error_pct (signed, percent);
 * it must stay within tolerance_pct of that. Or, with unsupported, a case
 * that the model refuses as not supported yet. */
typedef struct vp_outlier {
    char id[128];
    uint32_t run;            /* 0: any run                               */
    char metric[32];         /* "" when unsupported                      */
    bool unsupported;
    double error_pct, tolerance_pct;
    char reason[256];
} vp_outlier;

typedef struct vp_bounds_file {
    char name[256];          /* the ground-truth file's base name         */
    char not_modelled[256];  /* every case of the file is refused as not
                                supported yet, for this reason ("" no)   */
    char not_cases[256];     /* not a file of cases (not read), why      */
    vp_error_bound bound[VP_MG__COUNT];
    vp_outlier *outliers;
    size_t n_outliers;
} vp_bounds_file;

typedef struct vp_bounds {
    vp_bounds_file *files;
    size_t n_files;
} vp_bounds;

/* Load a bounds file (JSON; README.md "Accuracy" describes it):
 *   {"tolerance": PCT, "files": [{"file": NAME, "max_error": SPEC,
 *     "outliers": [{"id": ID, "run": N, "reason": TEXT,
 *                   "errors": {METRIC: PCT, ...} | "unsupported": true,
 *                   "tolerance": PCT}]}
 *    | {"file": NAME, "not_modelled": REASON}
 *    | {"file": NAME, "not_cases": REASON}]}
 * Strict, with file:line:col errors. The caller owns *out
 * (vp_bounds_destroy). */
vp_status vp_bounds_load(const char *path, vp_bounds *out, vp_error *err);
void vp_bounds_destroy(vp_bounds *b);
/* The section of a ground-truth file (matched by its base name), or
 * NULL. */
const vp_bounds_file *vp_bounds_find(const vp_bounds *b, const char *path);

#endif
