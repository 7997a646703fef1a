/* vramplan: checking the simulator against measured PyTorch runs.
 *
 * Reads files in the schema of the shared ground truth (one JSON object a
 * line, the first holding the environment), simulates each case and
 * compares predicted with measured figures. */
#ifndef VRAMPLAN_VALIDATE_H
#define VRAMPLAN_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/sim.h"
#include "vramplan/timing.h"

#define VP_VALIDATE_MAX_METRICS 24

typedef struct vp_metric {
    char name[32];        /* "peak_alloc", "peak_reserved", "step1.fwd_peak" */
    uint64_t predicted;   /* bytes (or a batch size for max_batch)           */
    uint64_t measured;
    double rel_err;       /* (predicted - measured) / measured               */
} vp_metric;

typedef struct vp_case_result {
    char id[128];
    char model[64];
    vp_metric metrics[VP_VALIDATE_MAX_METRICS];
    size_t n_metrics;
} vp_case_result;

/* Run one case: `json` is one line of a ground-truth file (not the env
 * line). The model is looked up as NAME.yaml then NAME.json in each of
 * `dirs` (n_dirs entries) in order. `first_in_process` says whether the
 * case ran first in its measuring process (collect.py runs every case of a
 * file in one process, so only the first pays the library workspaces).
 * `where` is "file:line" for error messages. VP_ESCHEMA for a malformed
 * case, VP_EIO when the model is not found, or the simulator's error. */
vp_status vp_validate_case(const char *json, size_t len, const char *where,
                           const char *const *dirs, size_t n_dirs,
                           bool first_in_process, vp_case_result *out,
                           vp_error *err);

/* The same, starting from `base` (NULL: vp_setup_init's defaults; e.g. a
 * GPU profile's context via vp_gpu_apply) and, when `hw` is given and the
 * case has a measured `step_ms`, adding the metric "step_us": the step-time
 * model's time of one step in microseconds against the measured median. */
vp_status vp_validate_case_on(const char *json, size_t len,
                              const char *where, const char *const *dirs,
                              size_t n_dirs, bool first_in_process,
                              const vp_setup *base, const vp_hw *hw,
                              vp_case_result *out, vp_error *err);

/* A multi-GPU case (scripts/collect_dist.py, docs/MULTIGPU.md): one rank
 * of a data-parallel run, the fields above plus `world` (2..65536),
 * `rank`, `strategy` ("ddp", "ddp-bucket-view", "fsdp-full",
 * "fsdp-grad-op"), `mixed_precision` and optionally `local_world`. The
 * cluster planner's per-GPU memory model (cluster.h) predicts the rank's
 * peaks on H200s; the metrics are "rankR.peak_alloc", "rankR.peak_reserved"
 * and "rankR.device_used" for those measured. VP_ESYNTAX for malformed
 * JSON, VP_ESCHEMA or VP_ERANGE for a missing or out-of-range field
 * (world < 2, rank >= world), VP_EARG for a case that failed when measured,
 * VP_EUNSUPPORTED for what the model does not cover (an optimizer other
 * than AdamW, inference, a model that is not a transformer), VP_EIO when
 * the model is not found. */
vp_status vp_validate_dist_case(const char *json, size_t len,
                                const char *where, const char *const *dirs,
                                size_t n_dirs, vp_case_result *out,
                                vp_error *err);

#endif
