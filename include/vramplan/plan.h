/* vramplan: planning a training setup on one GPU.
 *
 * Searches precision, optimizer variant, activation checkpointing and the
 * split of a global batch into micro-batches with gradient accumulation;
 * every candidate's memory comes from the simulator under the budget and
 * its time from the step-time model; candidates are ranked by time. */
#ifndef VRAMPLAN_PLAN_H
#define VRAMPLAN_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/model.h"
#include "vramplan/sim.h"
#include "vramplan/timing.h"

#define VP_PLAN_MAX 128

typedef enum {
    VP_CKPT_NONE,
    VP_CKPT_ALL,
    VP_CKPT_AUTO /* the least recomputation that fits (vp_checkpoint_auto) */
} vp_ckpt_mode;

typedef struct vp_plan_candidate {
    vp_precision precision;
    vp_optimizer optimizer;
    vp_ckpt_mode ckpt;
    bool offload;             /* optimizer state on the host (CPU Adam)  */
    size_t n_checkpointed, n_segments;
    uint64_t micro_batch;
    uint32_t accum;
    bool fits;
    uint64_t peak_alloc, peak_reserved, device_used;
    vp_step_time time;
    double samples_per_s;
    char reason[160];   /* why it lost (empty for the best)              */
} vp_plan_candidate;

typedef struct vp_plan_request {
    vp_setup base;              /* seq, attention, set_to_none, budget
                                   (base.alloc.limit), context...        */
    vp_hw hw;
    uint64_t global_batch;      /* samples per optimizer step            */
    bool precisions[VP_PREC__COUNT];  /* allowed; all false = defaults   */
    bool optimizers[VP_OPT__COUNT];   /* allowed; all false = defaults   */
} vp_plan_request;

typedef struct vp_plan_result {
    vp_plan_candidate cand[VP_PLAN_MAX];
    size_t n;                   /* sorted: fitting first, fastest first   */
    uint32_t simulations;       /* configurations simulated               */
} vp_plan_result;

/* Plan one GPU. Optimizer offload is tried where the GPU alone does not
 * reach the whole global batch in one micro-batch. VP_EARG for a request
 * without a budget or global batch;
 * VP_OK with no fitting candidate when nothing fits (cand[].reason says
 * why each failed). */
vp_status vp_plan_single(const vp_model *m, const vp_plan_request *req,
                         vp_plan_result *out, vp_error *err);

const char *vp_ckpt_mode_name(vp_ckpt_mode c);

#endif
