/* vramplan: what each memory technique buys on a given model.
 *
 * Every figure comes from the simulator (peak memory, largest batch under
 * the budget) and from the step-time model: each technique is a change of
 * the user's setup, applied alone, and a few are combined. */
#ifndef VRAMPLAN_TECHNIQUES_H
#define VRAMPLAN_TECHNIQUES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/model.h"
#include "vramplan/sim.h"
#include "vramplan/timing.h"

#define VP_TECHNIQUES_MAX 40

typedef struct vp_technique_result {
    char name[48];          /* "amp-bf16", "checkpoint all", ...           */
    char change[96];        /* what it changes in the setup                 */
    bool fits;              /* the user's batch fits in the budget          */
    bool applicable;        /* false: not meaningful here (note says why)   */
    uint64_t peak_alloc, peak_reserved;
    uint64_t max_batch;     /* under the budget (0: batch 1 does not fit)   */
    double step_s;          /* one optimizer step at the user's batch; 0 if
                               no GPU profile or it does not fit            */
    double samples_per_s;
    char note[128];
} vp_technique_result;

/* Evaluate the techniques on `base` (the user's setup: batch, precision,
 * optimizer...; base->alloc.limit is the budget, required). hw may be NULL
 * (no times). Fills out[0..*n): the baseline first, then each technique
 * alone, then combinations. */
vp_status vp_techniques(const vp_model *m, const vp_setup *base,
                        const char *base_ckpt, const vp_hw *hw,
                        vp_technique_result *out, size_t cap, size_t *n,
                        vp_error *err);

#endif
