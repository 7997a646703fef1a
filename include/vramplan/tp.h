/* FSDP2 composed with tensor parallelism (2-D) and pipeline stages (3-D),
 * as torchtitan composes them, simulated for one rank (src/dist_tp.c;
 * docs/DISTRIBUTED.md "FSDP2 + TP (2-D) and + PP (3-D)").
 *
 *   vp_tp_layout l = {.tp = 2, .pp = 2, .stage = VP_TP_WORST};
 *   vp_setup s; vp_setup_init(&s); s.dist = &d;   // d: fsdp2 over dp
 *   vp_tp_simulate(model, &l, &s, &roles, &n, &worst, &err);
 *   // l.stage: the most loaded stage; roles: its FSDP2 roles
 */
#ifndef VRAMPLAN_TP_H
#define VRAMPLAN_TP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/graph.h"
#include "vramplan/model.h"
#include "vramplan/sim.h"

/* vp_tp_layout.stage: the most loaded of the stages that differ. */
#define VP_TP_WORST UINT32_MAX

typedef struct vp_tp_layout {
    uint32_t tp;    /* tensor-parallel degree, >= 1 (apply_tp with
                       SequenceParallel norms and loss_parallel)          */
    uint32_t pp;    /* pipeline stages, >= 1 (pipeline_llm, 1F1B)         */
    uint32_t stage; /* the stage simulated, or VP_TP_WORST                */
    bool ac_full;   /* every layer checkpointed (torchtitan apply_ac,
                       activation_checkpoint.mode "full": each
                       TransformerBlock in ptd_checkpoint_wrapper)        */
    bool disable_loss_parallel; /* torchtitan's parallelism.
                       disable_loss_parallel: the output ColwiseParallel
                       to Replicate(), the whole logits on every rank;
                       false (the default): Shard(-1) logits under
                       loss_parallel()                                    */
} vp_tp_layout;

/* The transformer layers of stage `stage` of pp (torchtitan
 * pipeline_parallel.py generate_llm_fqn_per_model_part, input_weight =
 * output_weight = 1): layers + 2 slots split evenly, the remainder on the
 * first stages, the embedding one slot of the first, norm and output one
 * of the last. 0 when the split is one torchtitan refuses. */
uint32_t vp_tp_stage_layers(uint64_t layers, uint32_t pp, uint32_t stage);

/* The graph of one tensor-parallel rank of stage l->stage (not
 * VP_TP_WORST); NULL with *err set when the model or layout is not one
 * the composition models (named). */
vp_graph *vp_tp_graph_build(const vp_model *m, const vp_tp_layout *l,
                            uint64_t batch, uint64_t seq, vp_error *err);

/* Simulate the rank of l (setup->dist an fsdp2 run over the data-parallel
 * ranks; setup->pipe is set here when pp > 1 and must be NULL): every
 * FSDP2 role of the stage, or of each stage that differs (the first, the
 * second, the last) for VP_TP_WORST, which then becomes the most loaded
 * one (the largest peak allocated, then reserved, then the first).
 * *roles, *n and *worst as vp_simulate_ranks gives them for that stage. */
vp_status vp_tp_simulate(const vp_model *m, vp_tp_layout *l,
                         const vp_setup *setup, vp_rank_estimate **roles,
                         size_t *n, size_t *worst, vp_error *err);

/* The pipeline of stage l->stage, for a setup that runs its graph. */
void vp_tp_pipeline(const vp_tp_layout *l, vp_pipeline *out);

/* setup->checkpoint for graph g under l->ac_full: *flags (the caller
 * frees it; NULL without) every segment's. */
vp_status vp_tp_checkpoint(const vp_tp_layout *l, const vp_graph *g,
                           vp_setup *setup, bool **flags, vp_error *err);

#endif
