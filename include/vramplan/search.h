/* vramplan: searches on one GPU — the largest micro-batch under a budget
 * and the checkpoint placement that fits with the least recomputation. */
#ifndef VRAMPLAN_SEARCH_H
#define VRAMPLAN_SEARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/model.h"
#include "vramplan/sim.h"

typedef struct vp_maxbatch_result {
    uint64_t max_batch;   /* 0 when not even batch 1 fits                  */
    uint32_t trials;      /* simulations run                               */
    vp_estimate at_max;   /* the estimate at max_batch (when >= 1)         */
} vp_maxbatch_result;

/* The largest micro-batch whose simulated steps fit under
 * setup->alloc.limit (PyTorch's memory-fraction rule: no new segment may
 * take reserved past the limit; cached segments are freed and the
 * allocation retried before OOM), at most `cap` (0: no cap). The search
 * predicts the answer from the reserved peaks of small batches (memory
 * grows about linearly with the batch), gallops from the prediction until
 * the answer is bracketed and bisects: a handful of simulations. `ckpt` is a checkpoint spec for vp_graph_checkpoint_select (NULL =
 * none). setup->batch is ignored. VP_EARG when no limit is set. */
vp_status vp_maxbatch(const vp_model *m, const vp_setup *setup,
                      const char *ckpt, uint64_t cap,
                      vp_maxbatch_result *out, vp_error *err);

/* The same answer by a user's plain search: double from 1 until a batch
 * does not fit, stopping the doubling past `cap`, then bisect (as
 * shared/groundtruth/collect.py maxbatch does). Where the fit is not
 * monotone in the batch (allocator fragmentation), this lands where that
 * procedure lands; `vramplan validate` uses it to mirror the measurement. */
vp_status vp_maxbatch_doubling(const vp_model *m, const vp_setup *setup,
                               const char *ckpt, uint64_t cap,
                               vp_maxbatch_result *out, vp_error *err);

/* Whether one batch fits: builds the graph, simulates, and reports.
 * *fits is false for VP_EOOM and for sizes that overflow 64 bits; other
 * errors are returned. `est` may be NULL. */
vp_status vp_fits(const vp_model *m, const vp_setup *setup, uint64_t batch,
                  const char *ckpt, bool *fits, vp_estimate *est,
                  vp_error *err);

/* Minimum-cost covering knapsack, solved exactly by dynamic programming
 * over savings in units of `unit` bytes (each save[i] is rounded down to
 * whole units, so the choice saves at least `need` rounded up to units):
 * choose a subset of items whose save[] sum is at least `need` and whose
 * cost[] sum is least. Ties prefer fewer items. Returns false when even
 * all items do not save enough. choose[] gets the subset, *total its cost.
 * At most 1<<24 DP cells (n x need/unit); VP_ELIMIT past that. */
vp_status vp_knapsack_cover(const uint64_t *save, const double *cost,
                            size_t n, uint64_t need, uint64_t unit,
                            bool *choose, double *total, bool *feasible,
                            vp_error *err);

/* The same with two options per item (multiple-choice): each item is left
 * out (choice 0), or takes option A (save_a, cost_a; choice 1) or option B
 * (choice 2). Exact DP, same units and limits. */
vp_status vp_knapsack_cover2(const uint64_t *save_a, const double *cost_a,
                             const uint64_t *save_b, const double *cost_b,
                             size_t n, uint64_t need, uint64_t unit,
                             uint8_t *choice, double *total, bool *feasible,
                             vp_error *err);

typedef struct vp_ckpt_plan {
    size_t n_segments;
    size_t n_checkpointed;
    size_t n_selective;       /* layers with selective recomputation only */
    double recompute_flops;   /* forward FLOPs run again in backward       */
    double step_flops;        /* forward + backward without recompute      */
    uint32_t simulations;     /* simulator runs used                       */
    uint64_t peak_reserved;   /* of the chosen plan                        */
    uint64_t peak_alloc;
} vp_ckpt_plan;

/* Choose which segments to checkpoint so that the step at setup->batch
 * fits under setup->alloc.limit with the least recomputation (FLOP
 * weighted): the memory each segment's checkpoint saves is measured with
 * the simulator, an exact DP picks the cheapest set saving enough, and the
 * choice is verified by simulation (tightened until it fits). out_mask has
 * one entry per segment of the graph at that batch. VP_EOOM when not even
 * checkpointing every segment fits. */
vp_status vp_checkpoint_auto(const vp_model *m, const vp_setup *setup,
                             bool *out_mask, size_t n_mask,
                             vp_ckpt_plan *plan, vp_error *err);

/* vp_checkpoint_auto choosing per segment among none, selective
 * recomputation of the attention core (out_sel) and full checkpointing
 * (out_mask): a multiple-choice DP over the same measured savings. A
 * segment is selective or checkpointed, never both. */
vp_status vp_checkpoint_auto_sel(const vp_model *m, const vp_setup *setup,
                                 bool *out_mask, bool *out_sel, size_t n_mask,
                                 vp_ckpt_plan *plan, vp_error *err);

#endif
