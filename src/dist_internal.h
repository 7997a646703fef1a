/* The per-rank engine of the data-parallel wrappers (dist.c) and the rules
 * of each wrapper (dist_ddp.c, dist_fsdp.c, dist_fsdp2.c). Not installed.
 *
 * A wrapper is a table of hooks (vp__dist_rules) that the step loop of
 * sim.c calls where PyTorch runs the wrapper's own code: once the model
 * is built (the wrapper's constructor), before each step's forward, around
 * the forward and backward of every unit (an FSDP unit is a segment of
 * the graph, a decoder layer; unit 0 is the root module with every
 * parameter outside the segments), when a parameter's gradient is
 * accumulated, around the optimizer step and at zero_grad. A hook
 * allocates and frees through the engine (sim_internal.h) on the streams
 * its source names, so every rule is more events over the same op rules
 * and allocator model. A new role (a pipeline stage, a tensor-parallel
 * shard) is another table. */
#ifndef VRAMPLAN_DIST_INTERNAL_H
#define VRAMPLAN_DIST_INTERNAL_H

#include "sim_internal.h"
#include "vramplan/dist.h"

/* Streams (the allocator caches blocks per stream). */
enum {
    VP_STREAM_DEFAULT = 0,
    VP_STREAM_PRE_UNSHARD = 1, /* FSDP1 _pre_unshard_stream (mixed precision
                                  shard), FSDP2 all_gather_copy_in_stream */
    VP_STREAM_UNSHARD = 2,     /* FSDP1 _unshard_stream, FSDP2
                                  all_gather_stream                      */
    VP_STREAM_REDUCE = 3       /* FSDP1 _post_backward_stream, FSDP2
                                  reduce_scatter_stream                  */
};

/* A unit: the parameters FSDP flattens (FSDP1) or shards (FSDP2)
 * together. DDP and ZeRO use the units only to walk the parameters. */
typedef struct vp__unit {
    int32_t seg;           /* the graph segment; -1: the root            */
    uint32_t *params;      /* parameters sharded with it, in the order
                                of graph params (module.parameters())    */
    uint32_t n_params;
    uint64_t numel;        /* their elements                              */
    uint64_t shard;        /* FSDP1: each rank's flat-shard elements
                              (padded to world equal chunks)            */
    uint64_t padded;       /* FSDP2: Σ dim-0-padded shard elements (the
                              all-gather input of one rank)             */
} vp__unit;

struct vp__dist;
typedef struct vp__dist vp__dist;

/* The hooks of a wrapper; NULL: nothing at that point. */
typedef struct vp__dist_rules {
    vp_status (*init)(sim *S, vp__dist *d);   /* check, size the state    */
    void (*wrap)(sim *S, uint32_t *model);    /* the constructor: model[p]
                                                 is parameter p's tensor
                                                 as built (fp32)          */
    void (*step_begin)(sim *S);               /* before each forward      */
    void (*fwd_begin)(sim *S);                /* root pre-forward         */
    void (*fwd_end)(sim *S);                  /* root post-forward        */
    void (*unit_fwd_begin)(sim *S, uint32_t u);
    void (*unit_fwd_end)(sim *S, uint32_t u);
    void (*bwd_begin)(sim *S);                /* root pre-backward        */
    void (*bwd_end)(sim *S);                  /* end of backward          */
    void (*unit_bwd_begin)(sim *S, uint32_t u);
    void (*unit_bwd_end)(sim *S, uint32_t u);
    void (*grad_ready)(sim *S, uint32_t p);   /* p's gradient is complete */
    void (*zero_grad)(sim *S);
    void (*opt_begin)(sim *S);                /* before optimizer.step()  */
    /* around every op's forward and backward (DeepSpeed ZeRO-3's
     * per-module fetch and release) */
    void (*op_fwd)(sim *S, uint32_t op, bool after);
    void (*op_bwd)(sim *S, uint32_t op, bool after);
    /* around every op a checkpointed segment's recomputation runs, then
     * once at its end (ZeRO-3's module hooks fire in the recomputed
     * forward too) */
    void (*op_recompute)(sim *S, uint32_t op, bool after);
    void (*recompute_end)(sim *S);
    /* parameter p just made by the model's construction (*t its tensor):
     * DeepSpeed's zero.Init partitions it there */
    void (*param_built)(sim *S, uint32_t p, uint32_t *t);
    void (*destroy)(vp__dist *d);
} vp__dist_rules;

/* The rules of a scheme that acts at every unit boundary (FSDP1, FSDP2),
 * from its functions named p_init, p_wrap, ..., p_destroy. */
#define VP__DIST_UNIT_RULES(p)                                             \
    {                                                                      \
        .init = p##_init, .wrap = p##_wrap, .fwd_begin = p##_fwd_begin,    \
        .fwd_end = p##_fwd_end, .unit_fwd_begin = p##_unit_fwd_begin,      \
        .unit_fwd_end = p##_unit_fwd_end, .bwd_begin = p##_bwd_begin,      \
        .bwd_end = p##_bwd_end, .unit_bwd_begin = p##_unit_bwd_begin,      \
        .unit_bwd_end = p##_unit_bwd_end, .zero_grad = p##_zero_grad,      \
        .destroy = p##_destroy,                                            \
    }

struct vp__dist {
    const vp_dist *cfg;
    const vp__dist_rules *rules;
    uint32_t group;        /* ranks a parameter is sharded over          */
    uint32_t grank;        /* this rank's index in that group            */
    uint8_t model_eb;      /* bytes of the parameters as held (sharded)  */
    uint8_t unsharded_eb;  /* of the parameters the ops use              */
    uint8_t reduce_eb;     /* of the gradients reduced                   */
    vp__unit *units;       /* units[0]: the root                         */
    uint32_t n_units;
    int32_t *unit_of_seg;  /* per segment                                */
    uint32_t *unit_of_param; /* per parameter (UINT32_MAX: a buffer)      */
    uint32_t *uses;        /* per parameter: ops that use it            */
    uint32_t *pending;     /* per parameter: gradient contributions left
                              in this backward                          */
    uint32_t step;         /* steps begun                                */
    uint32_t n_fwd;        /* forwards (micro-batches) begun this step   */
    void *impl;            /* the wrapper's own state                    */
};

/* The wrappers' tables. */
extern const vp__dist_rules vp__dist_ddp_rules;   /* dist_ddp.c */
extern const vp__dist_rules vp__dist_fsdp1_rules; /* dist_fsdp.c */
extern const vp__dist_rules vp__dist_fsdp2_rules; /* dist_fsdp2.c */
extern const vp__dist_rules vp__dist_megatron_rules; /* dist_megatron.c */
extern const vp__dist_rules vp__dist_zero12_rules; /* dist_deepspeed.c */
extern const vp__dist_rules vp__dist_zero3_rules;  /* dist_zero3.c */
/* The roles of a DeepSpeed run (dist_deepspeed.c): sig[r] for each rank.
 * ZeRO-1/2 ranks differ by the params their partition meets and its
 * padding; over VP_DS_MAX_ROLES ranks three are simulated: the heaviest
 * partition (the most elements met, vp__ds_heaviest_rank), the last (the
 * padding), and rank 0 standing for the others. ZeRO-3: one role.
 * VP_ENOMEM. */
#define VP_DS_MAX_ROLES 64u
vp_status vp__ds_signatures(const vp_graph *g, const vp_dist *d,
                            uint64_t *sig, vp_error *err);
uint32_t vp__ds_heaviest_rank(const vp_graph *g, const vp_dist *d);
/* ZeRO-1/2's partition of rank `rank` of `world` (stage_1_and_2.py: the
 * flat group padded to 2 x world elements, get_partition_info): its size
 * (0 on overflow), *in_part the elements of the params that meet it (whole),
 * *pad its padding, overlap_n[p] (if not NULL) param p's elements in it. */
uint64_t vp__ds_partition(const vp_graph *g, uint32_t world, uint32_t rank,
                          uint64_t *in_part, uint64_t *pad,
                          uint64_t *overlap_n);

/* ---- what sim.c calls (dist.c) ----------------------------------------- */

/* S->s->dist set and not NONE: the engine's state in S->dist (after the
 * graph and the precision are known). May change S's element sizes
 * (FSDP's MixedPrecision runs the ops in param_dtype). */
vp_status vp__dist_new(sim *S);
void vp__dist_free(sim *S);
/* The wrapper takes the parameters as built (model[p]); false when there
 * is no wrapper, and sim.c converts and keeps them itself. */
bool vp__dist_wrap(sim *S, uint32_t *model);
void vp__dist_step_begin(sim *S);
void vp__dist_fwd_begin(sim *S);
void vp__dist_fwd_end(sim *S);
void vp__dist_fwd_op(sim *S, uint32_t op, bool after); /* unit boundaries */
void vp__dist_bwd_begin(sim *S);
void vp__dist_bwd_end(sim *S);
void vp__dist_bwd_op(sim *S, uint32_t op, bool after);
void vp__dist_recompute_op(sim *S, uint32_t op, bool after);
void vp__dist_recompute_end(sim *S);
void vp__dist_grad(sim *S, uint32_t p);
void vp__dist_zero_grad(sim *S);
void vp__dist_opt_begin(sim *S);
void vp__dist_param_built(sim *S, uint32_t p, uint32_t *t);

/* ---- helpers for the rules (dist.c) ------------------------------------ */

/* An allocation on a stream. */
uint32_t vp__dist_alloc(sim *S, uint64_t bytes, vp_category cat, int stream,
                        const char *what);
/* Free (NONE: nothing) and set *id to NONE. */
void vp__dist_free_id(sim *S, uint32_t *id);

/* A scheme's destroy: frees its state's n arrays, then the state (d->impl)
 * itself. */
void vp__dist_impl_free(vp__dist *d, void *const *arrays, size_t n);
/* The first dimension of a parameter (chunked by FSDP2 and padded by
 * dim-0 sharding): a weight's rows as torch stores them. */
uint64_t vp__param_dim0(const vp_graph *g, uint32_t p);
/* Elements of the dim-0 chunk that `rank` of `world` holds
 * (torch.chunk), and the padded chunk every rank stores. */
uint64_t vp__chunk_numel(const vp_graph *g, uint32_t p, uint32_t world,
                         uint32_t rank, uint64_t *padded);
/* Whether parameter p is a buffer (not flattened or sharded). */
bool vp__dist_is_buffer(const vp_graph *g, uint32_t p);
/* Convert the parameters as built to the model's precision (model.to()),
 * as sim.c does without a wrapper. */
void vp__model_convert(sim *S, uint32_t *model);
/* ZeroRedundancyOptimizer's partition of the trainable parameters
 * (dist_ddp.c): rank_of[p] (UINT32_MAX for the others). VP_ENOMEM. */
vp_status vp__zero_partition(const vp_graph *g, uint32_t world,
                             uint32_t *rank_of);
/* Bytes of a MixedPrecision dtype; 0 for NONE. */
uint8_t vp__mp_bytes(vp_mp_dtype d);

#endif
