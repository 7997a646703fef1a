/* DeepSpeed's ZeRO engine, one rank: the state and the steps that ZeRO-1/2
 * (dist_deepspeed.c) and ZeRO-3 (dist_zero3.c) share. Not installed. */
#ifndef VRAMPLAN_DIST_DS_IMPL_H
#define VRAMPLAN_DIST_DS_IMPL_H

#include "dist_internal.h"

typedef struct {
    int stage;         /* 1, 2, 3                                       */
    bool overlap;      /* overlap_comm (the stage's default resolved)   */
    bool offload_opt;  /* offload_optimizer cpu or nvme                 */
    bool offload_par;  /* offload_param (stage 3)                       */
    uint8_t eb;        /* the bit16 (or fp32) parameters' bytes         */
    /* ZeRO-1/2: the one flat group */
    uint64_t numel;    /* trainable elements                            */
    uint64_t part;     /* partition_size                                */
    uint64_t in_part;  /* Σ numel of the params overlapping it          */
    uint64_t pad;      /* groups_padding of this rank                   */
    uint64_t *overlap_n; /* per param: its elements in this partition  */
    uint64_t largest;  /* largest_param_numel                           */
    uint32_t *flat_pos; /* per param: the elements before it (+1; 0: not
                           in the group)                               */
    /* the backward's buffers */
    uint32_t ipg[2];   /* reduce_bucket_size elements each               */
    uint32_t ipg_idx;
    uint64_t bucket_n; /* elements in the bucket                         */
    uint32_t *bucket;  /* its params                                     */
    uint32_t n_bucket;
    uint32_t gip;      /* grads_in_partition                             */
    uint32_t held;     /* all_grad_tensors / averaged_gradients' storage */
    uint32_t padz;     /* get_flat_partition's zero padding              */
    uint32_t fp32_grad; /* the optimizer's flat fp32 gradient           */
    uint32_t *own;     /* per param: its own gradient kept to the step
                          (this rank's, without contiguous_gradients)  */
    bool ready;        /* ready_for_gradients                            */
    /* ZeRO-3 */
    uint64_t *pnumel;  /* per param: partition_numel (0: not sharded)   */
    bool *persist;     /* ds_persist                                    */
    uint32_t *gath;    /* the gathered parameter, or NONE               */
    int64_t *recent;   /* __most_recent_step_id_param_fetched_for       */
    uint32_t *trace;   /* __submodule_order: the ops with parameters as
                          the recording forward + backward fetched them
                          (recomputations included)                    */
    uint32_t n_trace;
    uint32_t cap_trace; /* 3 per op: forward, recomputation, backward  */
    int trace_mode;    /* ZeRoTraceMode: Z3_RECORD, Z3_COMPLETE,
                          Z3_INVALID (dist_zero3.c)                     */
    int32_t rc_seg;    /* the segment last recomputed this backward      */
    uint32_t defer;    /* an op whose backward fetch waits for its
                          segment's recomputation, or NONE              */
    uint32_t pos;      /* the trace's step                               */
    uint32_t qpos;     /* the prefetch queue (steps, then params)        */
    uint32_t qparam;
    uint64_t n_avail;  /* __n_available_params                           */
    uint64_t *sub;     /* sub groups' partition elements                */
    uint32_t n_sub;
    uint32_t grad_flat; /* grad_partitions_flat_buffer                  */
    /* the optimizer */
    uint64_t *opt_n;   /* per optimizer tensor (a sub group)            */
    bool *on;
} ds;

/* vp__dist_rules' init (the knobs checked, the layout of the partitions,
 * the optimizer's tensors), zero_grad (the step's fp32 gradient dropped)
 * and destroy, for every stage. */
vp_status vp__ds_init(sim *S, vp__dist *d);
void vp__ds_zero_grad(sim *S);
void vp__ds_destroy(vp__dist *d);
/* A trainable parameter of the flat groups (not a buffer or adapter). */
bool vp__ds_trainable(const vp_graph *g, uint32_t p);
vp_status vp__ds_oom(sim *S);
/* The offloads' host bytes for `part` partition elements. */
void vp__ds_host_bytes(sim *S, ds *z, uint64_t part);
/* The step's checks over k gradients of n[i] elements: fp16's overflow
 * (has_overflow_partitioned_grads_serial, _has_inf_or_nan), then the norms
 * (get_grad_norm_direct: a double copy of each). */
void vp__ds_step_checks(sim *S, const uint64_t *n, uint32_t k);

#endif
