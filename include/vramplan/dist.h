/* vramplan: PyTorch's data-parallel wrappers, simulated rank by rank.
 *
 * A data-parallel run is simulated as the event stream of one rank: the
 * same op rules and caching-allocator model as one GPU (sim.h), with the
 * wrapper's own allocations and frees added where its source makes them
 * (DDP's buckets, ZeroRedundancyOptimizer's partition, FSDP's flat
 * parameters, all-gather and reduce-scatter buffers on their own
 * streams). Ranks that hold the same shapes make the same stream: they
 * share a role, simulated once. docs/DISTRIBUTED.md gives every rule with
 * its source (file and function of PyTorch 2.11).
 *
 *   vp_dist d; vp_dist_init(&d);
 *   d.strategy = VP_DIST_FSDP2; d.world = 8; d.param_dtype = VP_MP_BF16;
 *   vp_setup s; vp_setup_init(&s); s.dist = &d; ...
 *   vp_rank_estimate *r; size_t n; size_t worst;
 *   vp_simulate_ranks(g, &s, &r, &n, &worst, &err);   // one per role
 */
#ifndef VRAMPLAN_DIST_H
#define VRAMPLAN_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"

#define VP_DIST_STRATEGY_MAP(XX)                                           \
    XX(NONE, "none")                  /* one GPU                        */ \
    XX(DDP, "ddp")                    /* DistributedDataParallel        */ \
    XX(DDP_BUCKET_VIEW, "ddp-bucket-view") /* gradient_as_bucket_view   */ \
    XX(DDP_ZERO1, "ddp-zero1")        /* DDP + ZeroRedundancyOptimizer  */ \
    XX(FSDP_FULL, "fsdp-full")        /* FSDP1 FULL_SHARD               */ \
    XX(FSDP_GRAD_OP, "fsdp-grad-op")  /* FSDP1 SHARD_GRAD_OP            */ \
    XX(FSDP_HYBRID, "fsdp-hybrid")    /* FSDP1 HYBRID_SHARD             */ \
    XX(FSDP_NO_SHARD, "fsdp-no-shard") /* FSDP1 NO_SHARD                */ \
    XX(FSDP2, "fsdp2")                /* fully_shard                    */ \
    XX(MEGATRON_DDP, "megatron-ddp")  /* Megatron-LM DDP, fp32 main grads */ \
    XX(MEGATRON_DISTOPT, "megatron-distopt") /* + distributed optimizer */ \
    XX(DS_ZERO1, "deepspeed-zero1")   /* DeepSpeed ZeRO stage 1         */ \
    XX(DS_ZERO2, "deepspeed-zero2")   /* stage 2 (gradients partitioned) */ \
    XX(DS_ZERO3, "deepspeed-zero3")   /* stage 3 (parameters too)       */

typedef enum {
#define VP__DS(name, str) VP_DIST_##name,
    VP_DIST_STRATEGY_MAP(VP__DS)
#undef VP__DS
    VP_DIST__COUNT
} vp_dist_strategy;

/* MixedPrecision / MixedPrecisionPolicy dtypes; NONE: the parameters'
 * own dtype. */
#define VP_MP_DTYPE_MAP(XX)                                                \
    XX(NONE, "none")                                                       \
    XX(FP32, "fp32")                                                       \
    XX(BF16, "bf16")                                                       \
    XX(FP16, "fp16")

typedef enum {
#define VP__MPD(name, str) VP_MP_##name,
    VP_MP_DTYPE_MAP(VP__MPD)
#undef VP__MPD
    VP_MP__COUNT
} vp_mp_dtype;

/* FSDP1 backward_prefetch. */
#define VP_PREFETCH_MAP(XX)                                                \
    XX(PRE, "pre")   /* BackwardPrefetch.BACKWARD_PRE (the default here)  */ \
    XX(POST, "post") /* BackwardPrefetch.BACKWARD_POST                    */ \
    XX(NONE, "none")

typedef enum {
#define VP__PF(name, str) VP_PREFETCH_##name,
    VP_PREFETCH_MAP(VP__PF)
#undef VP__PF
    VP_PREFETCH__COUNT
} vp_prefetch;

/* DeepSpeed's offload devices (offload_optimizer / offload_param
 * "device"). */
#define VP_DS_OFFLOAD_MAP(XX)                                              \
    XX(NONE, "none")                                                       \
    XX(CPU, "cpu")                                                         \
    XX(NVME, "nvme")

typedef enum {
#define VP__DSO(name, str) VP_DS_OFFLOAD_##name,
    VP_DS_OFFLOAD_MAP(VP__DSO)
#undef VP__DSO
    VP_DS_OFFLOAD__COUNT
} vp_ds_offload;

/* The knobs of a DeepSpeed config's zero_optimization section (and the
 * engine's gradient_clipping), as deepspeed/runtime/zero/config.py names
 * and defaults them (vp_ds_config_init). Counts are elements, as
 * DeepSpeed's are. docs/DISTRIBUTED.md, "DeepSpeed ZeRO". */
typedef struct vp_ds_config {
    uint64_t reduce_bucket_size;     /* 5e8                               */
    uint64_t allgather_bucket_size;  /* 5e8                               */
    bool contiguous_gradients;       /* true                              */
    int8_t overlap_comm;             /* -1: the stage's default (stage 3) */
    bool round_robin_gradients;      /* false                             */
    vp_ds_offload offload_optimizer; /* none                              */
    vp_ds_offload offload_param;     /* none (stage 3 only)               */
    uint64_t prefetch_bucket_size;   /* stage3_prefetch_bucket_size 5e7   */
    uint64_t max_live_parameters;    /* stage3_max_live_parameters 1e9    */
    uint64_t max_reuse_distance;     /* stage3_max_reuse_distance 1e9     */
    uint64_t param_persistence_threshold; /* stage3_..._threshold 1e5     */
    uint64_t sub_group_size;         /* 1e9                               */
    double gradient_clipping;        /* 0: none                           */
    bool zero_init;                  /* stage 3: the model built under
                                        deepspeed.zero.Init (each param
                                        partitioned as it is made)      */
} vp_ds_config;

void vp_ds_config_init(vp_ds_config *c);
/* Set one knob from its text as a config would give it (a number such as
 * 5e8 or 500000000, true/false, none/cpu/nvme); the names are the
 * config's (reduce_bucket_size, overlap_comm, offload_optimizer,
 * stage3_prefetch_bucket_size, ..., gradient_clipping). VP_EARG naming an
 * unknown knob or a bad value. */
vp_status vp_ds_config_set(vp_ds_config *c, const char *key,
                           const char *value, vp_error *err);
/* "key=value,key=value" (estimate's --ds). */
vp_status vp_ds_config_parse(vp_ds_config *c, const char *text,
                             vp_error *err);
/* The knobs' names, NULL-terminated. */
extern const char *const vp_ds_config_keys[];

/* Largest data-parallel world a run may name. */
#define VP_DIST_MAX_WORLD 65536u
/* DDP's bucket_cap_mb default (25 MiB) and its first rebuilt bucket
 * (dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB). */
#define VP_DDP_BUCKET_CAP ((uint64_t)25 * 1048576)
#define VP_DDP_FIRST_BUCKET ((uint64_t)1048576)

/* A data-parallel run and the rank simulated. Initialise with
 * vp_dist_init, then change fields. FSDP wraps every segment of the graph
 * (a decoder layer, as transformer_auto_wrap_policy or fully_shard per
 * layer does) and the root module. */
typedef struct vp_dist {
    vp_dist_strategy strategy;
    uint32_t world;            /* ranks of the data-parallel group (>= 1)    */
    uint32_t rank;             /* the rank simulated, 0..world-1             */
    uint32_t shard;            /* HYBRID_SHARD / FSDP2 on a 2-D mesh: ranks
                                  per shard group (the mesh's last dim);
                                  0 = world (no replication)                 */
    vp_mp_dtype param_dtype;   /* FSDP MixedPrecision(Policy) param_dtype   */
    vp_mp_dtype reduce_dtype;  /* reduce_dtype; NONE: param_dtype's          */
    vp_mp_dtype output_dtype;  /* FSDP2 MixedPrecisionPolicy output_dtype
                                  (NONE: not cast); needs a param_dtype     */
    vp_mp_dtype buffer_dtype;  /* FSDP1 buffer_dtype: only NONE (the
                                  buffers' own dtype) is modelled; another
                                  is refused (VP_EUNSUPPORTED)               */
    int32_t reshard_after_forward; /* FSDP2: 1 True, 0 False, n >= 2 the
                                      int (reshard to n ranks); -1 default
                                      (True)                                */
    uint64_t bucket_cap;       /* DDP bucket_cap_mb in bytes (25 MiB)        */
    uint64_t first_bucket;     /* DDP's first rebuilt bucket (1 MiB)         */
    bool static_graph;         /* DDP static_graph                           */
    bool find_unused;          /* DDP find_unused_parameters                 */
    bool broadcast_buffers;    /* DDP broadcast_buffers (default true)       */
    bool rebuild_held;         /* DDP: the rank simulated still holds the
                                  iteration-1 buckets when the second step
                                  rebuilds them (ProcessGroupNCCL's stash,
                                  freed at the first collective after its
                                  watchdog's 100 ms poll: a race, late on
                                  some rank): the most loaded rank (default
                                  true)                                      */
    bool overlap_with_ddp;     /* ZeroRedundancyOptimizer overlap_with_ddp   */
    bool limit_all_gathers;    /* FSDP1 (default true; false is refused,
                                  VP_EUNSUPPORTED: a timing effect)         */
    bool forward_prefetch;     /* FSDP1 (default false)                      */
    vp_prefetch backward_prefetch; /* FSDP1 (default BACKWARD_PRE)           */
    bool use_orig_params;      /* FSDP1 (default false)                      */
    bool cpu_offload;          /* FSDP2 CPUOffloadPolicy                     */
    bool empty_cache_after_wrap; /* the script calls torch.cuda.empty_cache()
                                    once the wrapper is built (the
                                    ground-truth protocol, collect_dist.py)  */
    vp_ds_config ds;           /* deepspeed-zero1/2/3                        */
    uint32_t expert_world;     /* Megatron with MoE: the expert-data-parallel
                                  ranks the experts' gradients are reduced
                                  and sharded over (dp x cp / ep); 0 = world */
} vp_dist;

/* Defaults: no strategy, world 1, rank 0, no mixed precision, DDP's 25
 * MiB buckets, BACKWARD_PRE, limit_all_gathers, broadcast_buffers, the
 * rebuild held. */
void vp_dist_init(vp_dist *d);

const char *vp_dist_strategy_name(vp_dist_strategy s);
const char *vp_mp_dtype_name(vp_mp_dtype d);
const char *vp_prefetch_name(vp_prefetch p);
/* Parse names as printed above; VP_EARG if unknown. */
vp_status vp_dist_strategy_parse(const char *s, vp_dist_strategy *out);
vp_status vp_mp_dtype_parse(const char *s, vp_mp_dtype *out);
vp_status vp_prefetch_parse(const char *s, vp_prefetch *out);

/* Whether the strategy is one of FSDP's (1 or 2). */
bool vp_dist_is_fsdp(vp_dist_strategy s);
/* Whether the strategy is one of DeepSpeed's ZeRO stages. */
bool vp_dist_is_deepspeed(vp_dist_strategy s);

#endif
