/* vramplan: training plans for clusters of GPUs.
 *
 * A plan splits the training of a transformer over N identical GPUs: data
 * parallelism (PyTorch DDP, Megatron's DDP or distributed optimizer,
 * DeepSpeed ZeRO stages 1-3, PyTorch FSDP full, grad-op or hybrid
 * sharding), tensor parallelism with or without sequence parallelism,
 * pipeline parallelism (GPipe, 1F1B, interleaved 1F1B), context and expert
 * parallelism, activation recomputation (none, selective, full) and CPU
 * offload of the optimizer state and the parameters.
 *
 * The per-layer activation bytes, the memory traffic of the memory-bound
 * ops and the parameter and FLOP counts come from vramplan's own graph and
 * simulator: a two-layer copy of the model is simulated for each precision
 * class and local sequence length, at micro-batch 1 and 2 and at tensor
 * parallel degree 1 and t2 (the smallest degree > 1 the heads allow), and
 * every quantity is fitted as X(b, t) = r(b) + s(b)/t with r, s linear in
 * the micro-batch b (Korthikanti et al.'s split into replicated and
 * tensor-parallel parts). Configurations are then evaluated analytically
 * (vp_cluster_eval), so a search can sweep millions of them.
 * docs/CLUSTER.md gives every formula and constant. */
#ifndef VRAMPLAN_CLUSTER_H
#define VRAMPLAN_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/model.h"
#include "vramplan/timing.h"

/* ---- the cluster ------------------------------------------------------ */

/* Identical GPUs, gpus_per_node of them joined by NVLink (hw.nvlink per
 * direction per GPU) in each node, the nodes joined by a network giving
 * hw.network per GPU per direction. Initialise with vp_cluster_init, which
 * fills a missing network with 50e9 B/s (one 400 Gb/s NIC per GPU) for
 * GPUs of 900 TFLOP/s bf16 or more, 25e9 B/s (200 Gb/s) otherwise, and a
 * missing NVLink with the host link (PCIe peer to peer). */
typedef struct vp_cluster {
    vp_hw hw;                 /* one GPU                                      */
    uint32_t gpus;            /* GPUs in the cluster                          */
    uint32_t gpus_per_node;   /* the NVLink domain                            */
    uint64_t memory;          /* bytes per GPU a plan may use (default
                                 hw.memory)                                   */
    uint64_t context;         /* CUDA context per GPU (default hw.context, or
                                 VP_DEFAULT_CONTEXT_BYTES when 0)            */
    uint64_t host_mem;        /* host RAM per node, bytes (default 128 GiB
                                 per GPU)                                     */
    double host_mem_bw;       /* host DRAM bandwidth per node, B/s, for the
                                 CPU optimizer step (default 200e9)           */
    double nvlink_eff;        /* fraction of hw.nvlink collectives reach
                                 (default 0.8)                                */
    double net_eff;           /* fraction of hw.network (default 0.85)        */
    uint64_t nccl_comm_bytes; /* device bytes per NCCL communicator for ring
                                 and tree collectives (default 320 MiB: 16
                                 channels x 2 connections x 10 MiB)           */
    uint64_t nccl_peer_bytes; /* device bytes per all-to-all peer (48 MiB)   */
    double alloc_overhead;    /* fraction added to the allocator's bytes for
                                 fragmentation and caching (default 0.05)     */
    /* MoE routing under expert parallelism (ep > 1): the tokens the
     * busiest rank's experts receive, over the balanced share (tokens x
     * top_k / ep), and the capacity factor of token-dropping routers (0 =
     * dropless: the load is the imbalance; > 0: each expert's buffer is
     * that many balanced shares, the rest dropped). Either is capped by
     * the worst case, every pick of the ep ranks' tokens on one rank
     * (vp_moe_load). With ep = 1 a rank holds every expert and its rows
     * are tokens x top_k whatever the routing. */
    double moe_imbalance;     /* >= 1, or 0 (default): the measured load
                                 at the plan's ep (vp_moe_measured_load)   */
    double moe_capacity;      /* 0 or >= 1 (default 0, dropless)            */
} vp_cluster;

/* The default imbalance: the busiest expert-parallel group's routed
 * tokens over the balanced share, the largest measured in training steps
 * of four MoE models on the H200 at that ep (every layer and step of
 * mixtral-small, qwen3_moe, qwen2_moe and deepseek_v3, random init:
 * groundtruth/moe/h200-torch2.11-moe-load.jsonl), rounded up: 1.39 at
 * ep 2, 1.93 at ep 3-4, 2.29 from ep 5 on (measured to ep 8; beyond, the
 * ep-8 figure). docs/CLUSTER.md "MoE routing". */
double vp_moe_measured_load(uint32_t ep);

/* The busiest expert-parallel rank's routed rows over the balanced share
 * under c's assumption for a model of `experts` routed experts, top_k
 * each, at expert-parallel degree ep; *worst (optional) gets the bound of
 * every pick on one rank, ep x min(top_k, experts / ep) / top_k. 1 when
 * ep <= 1 or without experts. */
double vp_moe_load(const vp_cluster *c, uint64_t experts, uint64_t top_k,
                   uint32_t ep, double *worst);

/* Defaults for a cluster of `gpus` copies of hw, gpus_per_node per node. */
void vp_cluster_init(vp_cluster *c, const vp_hw *hw, uint32_t gpus,
                     uint32_t gpus_per_node);

/* ---- one configuration ------------------------------------------------ */

/* Training precision: mixed precision with fp32 master weights and fp32
 * Adam moments, except fp32. fp8 runs the linear layers' GEMMs in fp8
 * (Transformer Engine) and keeps bf16 activations. */
#define VP_DTYPE_MAP(XX)                                                   \
    XX(BF16, "bf16")                                                       \
    XX(FP16, "fp16")                                                       \
    XX(FP8, "fp8")                                                         \
    XX(FP32, "fp32")

typedef enum {
#define VP__DT(name, str) VP_DT_##name,
    VP_DTYPE_MAP(VP__DT)
#undef VP__DT
    VP_DT__COUNT
} vp_dtype;

#define VP_RECOMPUTE_MAP(XX)                                               \
    XX(NONE, "none")                                                       \
    XX(SELECTIVE, "selective") /* core attention (Korthikanti et al.) */   \
    XX(FULL, "full")           /* every layer: only its input is kept  */

typedef enum {
#define VP__RC(name, str) VP_RC_##name,
    VP_RECOMPUTE_MAP(VP__RC)
#undef VP__RC
    VP_RC__COUNT
} vp_recompute;

#define VP_SCHEDULE_MAP(XX)                                                \
    XX(GPIPE, "gpipe")                                                     \
    XX(1F1B, "1f1b")                                                       \
    XX(INTERLEAVED, "interleaved")                                         \
    XX(DUALPIPE, "dualpipe")

typedef enum {
#define VP__SC(name, str) VP_SCHED_##name,
    VP_SCHEDULE_MAP(VP__SC)
#undef VP__SC
    VP_SCHED__COUNT
} vp_schedule;

/* How the data-parallel replicas hold the model states, and so which
 * engine runs the plan. */
#define VP_SHARDING_MAP(XX)                                                \
    XX(DDP, "ddp")                      /* PyTorch DDP + autocast      */  \
    XX(MEGATRON, "megatron-ddp")        /* Megatron, no sharding       */  \
    XX(DISTOPT, "distributed-optimizer")/* Megatron (= ZeRO-1)         */  \
    XX(ZERO1, "zero1")                  /* DeepSpeed                   */  \
    XX(ZERO2, "zero2")                                                     \
    XX(ZERO3, "zero3")                                                     \
    XX(FSDP_FULL, "fsdp-full-shard")    /* PyTorch FSDP                */  \
    XX(FSDP_GRAD_OP, "fsdp-shard-grad-op")                                 \
    XX(FSDP_HYBRID, "fsdp-hybrid-shard")                                  \
    XX(FSDP2, "fsdp2")                  /* fully_shard (torchtitan)    */  \
    XX(HSDP2, "hsdp2")                  /* fully_shard, 2-D mesh       */  \
    XX(DDP_ZERO1, "ddp-zero1")          /* DDP + ZeroRedundancyOpt.    */

typedef enum {
#define VP__SH(name, str) VP_SHARD_##name,
    VP_SHARDING_MAP(VP__SH)
#undef VP__SH
    VP_SHARD__COUNT
} vp_sharding;

#define VP_ENGINE_MAP(XX)                                                  \
    XX(MEGATRON, "megatron")                                               \
    XX(DEEPSPEED, "deepspeed")                                             \
    XX(TORCH, "torch")

typedef enum {
#define VP__EN(name, str) VP_ENGINE_##name,
    VP_ENGINE_MAP(VP__EN)
#undef VP__EN
    VP_ENGINE__COUNT
} vp_engine;

#define VP_OFFLOAD_MAP(XX)                                                 \
    XX(NONE, "none")                                                       \
    XX(OPTIMIZER, "optimizer")  /* optimizer state + fp32 grads on host */ \
    XX(ALL, "optimizer+params") /* and the parameters                  */

typedef enum {
#define VP__OF(name, str) VP_OFFLOAD_##name,
    VP_OFFLOAD_MAP(VP__OF)
#undef VP__OF
    VP_OFFLOAD__COUNT
} vp_offload;

/* A switch with a default: VP_AUTO takes it. */
typedef enum { VP_AUTO = 0, VP_ON, VP_OFF } vp_switch;

/* One configuration. gpus = dp x tp x pp x cp; the global batch is
 * dp x micro_batch x accum sequences. */
typedef struct vp_par {
    uint32_t dp, tp, pp, cp, ep; /* ep divides dp (experts' replicas)      */
    uint32_t vpp;             /* model chunks per stage (interleaved), >= 1 */
    bool sp;                  /* sequence parallelism (needs tp > 1)        */
    vp_schedule schedule;
    uint64_t micro_batch;     /* sequences per micro-batch per replica       */
    uint64_t accum;           /* micro-batches per optimizer step            */
    vp_dtype dtype;
    vp_recompute recompute;
    vp_sharding sharding;
    vp_offload offload;
    bool bucket_view;         /* DDP gradient_as_bucket_view=True            */
    /* Layers of the first and the last pipeline stage (Megatron's
     * --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-
     * layers); 0 = an even split, the remainder on the first stages. The
     * middle stages share the rest evenly. */
    uint32_t first_layers, last_layers;
    /* Overlap switches of the engines (docs/STEP_TIME.md "Overlap"):
     * overlap_dp = Megatron --overlap-grad-reduce and --overlap-param-
     * gather, DeepSpeed overlap_comm and ZeRO-3's prefetch (PyTorch DDP
     * and FSDP always overlap; default on); overlap_tp = Megatron
     * --tp-comm-overlap (userbuffers), PyTorch async TP (default off);
     * overlap_ep = expert all-to-alls behind another micro-batch's compute
     * (Megatron --overlap-moe-expert-parallel-comm, DualPipe; default
     * off). VP_AUTO (0) takes the default. */
    vp_switch overlap_dp, overlap_tp, overlap_ep;
    bool compile;             /* torch.compile: fused memory-bound kernels  */
    /* torchao's float8 FSDP all-gather recipe (torchtitan --float8.enable_
     * fsdp_float8_all_gather, --float8.precompute_float8_dynamic_scale_
     * for_fsdp, --float8.force_recompute_fp8_weight_in_bwd): fp8 dtype,
     * FSDP2 or HSDP2 sharding; docs/CLUSTER.md "fp8 all-gather" */
    bool fp8_gather;
    /* multi-token prediction modules on the last stage (DeepSeek-V3's D,
     * Megatron-Core --mtp-num-layers): each a transformer layer, two
     * norms and a 2h x h projection, the embedding and the output head
     * shared with the model (0 = none) */
    uint32_t mtp;
} vp_par;

/* Bytes on the most loaded GPU. */
typedef struct vp_cluster_mem {
    uint64_t weights, grads, optimizer; /* resident model states            */
    uint64_t buffers;      /* DDP buckets and autocast cache, ZeRO/FSDP
                              gathered parameters and unsharded gradients    */
    uint64_t activations;  /* saved for backward, all micro-batches in
                              flight on that stage                           */
    uint64_t transient;    /* peak working memory beyond the saved
                              activations (one layer's backward, logits)     */
    uint64_t overhead;     /* alloc_overhead x the allocator's bytes         */
    uint64_t nccl;         /* NCCL communicator buffers                      */
    uint64_t context;      /* CUDA context                                   */
    uint64_t total;        /* device bytes: the sum of the above             */
    uint64_t host;         /* host RAM per node for offloaded state          */
    uint32_t stage;        /* the most loaded pipeline stage (0-based)       */
    double in_flight;      /* micro-batches whose activations it holds       */
} vp_cluster_mem;

/* Seconds per optimizer step on the slowest pipeline stage. */
typedef struct vp_cluster_time {
    double compute;     /* forward + backward of every micro-batch           */
    double recompute;   /* recomputed forward                                */
    double tp_comm;     /* tensor/sequence-parallel collectives (exposed)    */
    double cp_comm;     /* context-parallel ring, beyond attention compute   */
    double ep_comm;     /* expert all-to-alls                                */
    double pp_comm;     /* pipeline sends and receives                       */
    double bubble;      /* pipeline fill and drain                           */
    double dp_comm;     /* data-parallel / sharding collectives, exposed     */
    double optimizer;   /* optimizer step (on the GPU or the host)           */
    double offload;     /* host transfers not hidden behind compute          */
    double step;        /* one optimizer step                                */
    double samples_per_s, tokens_per_s;
    double model_flops; /* per step, whole model, without recomputation      */
    double mfu;         /* model_flops / (step x gpus x dtype peak)          */
    double hfu;         /* the same with the recomputed forward              */
    /* where compute + recompute go (per step, the slowest stage) */
    double gemm;        /* matmuls of the linear layers and the head         */
    double attention;   /* the attention core                                */
    double memory;      /* memory-bound kernels (norms, activations, ...)    */
    double mfu_bound;   /* the MFU the GPU's GEMM curve allows at most for
                           this plan's largest GEMM (sanity bound: mfu <=
                           mfu_bound)                                        */
} vp_cluster_time;

/* ---- the per-model precomputation ------------------------------------- */

typedef struct vp_cluster_model vp_cluster_model;

/* Precompute what plans of model m at sequence length seq (0 = the
 * model's) need: parameter and FLOP counts of the layers, embedding and
 * head (from the graph at tensor-parallel degrees 1 and t2). Activation
 * quantities are simulated lazily, once per (precision class, context-
 * parallel degree). A graph-form or encoder-decoder model is planned whole
 * (vp_cluster_model_info.whole): its graph simulated at micro-batch 1 and 2,
 * data parallelism, ZeRO and FSDP only (vp_par_check refuses tp, pp, cp,
 * ep, sp, Megatron, recomputation, fp8 and torch.compile by name); its
 * units are its checkpoint segments. m must outlive the result
 * (borrowed). Returns NULL with *err: VP_EUNSUPPORTED for a transformer
 * description without layers, graph errors (VP_ERANGE, VP_EOVERFLOW),
 * VP_ENOMEM. Release with vp_cluster_model_free. */
vp_cluster_model *vp_cluster_model_new(const vp_model *m, uint64_t seq,
                                       vp_error *err);
void vp_cluster_model_free(vp_cluster_model *cm);

typedef struct vp_cluster_model_info {
    const char *name;
    uint64_t seq, layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
    uint64_t experts, top_k;
    uint64_t params;           /* trainable elements                       */
    uint64_t layer_params;     /* one layer, experts included              */
    uint64_t embed_params, head_params; /* head: 0 when tied               */
    uint32_t tp_unit;          /* t2; 0 when the model allows no TP        */
    double flops_per_token;    /* forward + backward, no recompute         */
    /* architecture, for the exports */
    uint64_t max_positions;
    bool rmsnorm, gated_mlp, rotary, bias, tied;
    double attn_dropout, hidden_dropout;
    /* a graph-form or encoder-decoder model planned whole: data
     * parallelism, ZeRO or FSDP only; `layers` are its units (checkpoint segments), seq its image
     * side or sequence, and a "token" (tokens_per_s, flops_per_token,
     * compare's --tokens) is a sample */
    bool whole;
} vp_cluster_model_info;

void vp_cluster_model_info_get(const vp_cluster_model *cm,
                               vp_cluster_model_info *out);

/* Per-layer activation bytes for one micro-batch (for tests and reports):
 * the bytes a layer keeps for backward under `rc`, simulated with the
 * precision class of dtype (autocast when torch_ddp) at micro-batch b,
 * tensor-parallel degree t (with sequence parallelism sp) and context-
 * parallel degree cp. */
vp_status vp_cluster_layer_act(vp_cluster_model *cm, vp_dtype dtype,
                               bool torch_ddp, uint64_t b, uint32_t t,
                               bool sp, uint32_t cp, vp_recompute rc,
                               uint64_t *bytes, vp_error *err);

/* ---- evaluation -------------------------------------------------------- */

/* Check a configuration against the model and cluster: VP_OK, or VP_EARG
 * with the reason in *err (degrees that do not multiply to the GPU count,
 * tp not dividing the heads, an engine without the feature...). */
vp_status vp_par_check(const vp_cluster_model *cm, const vp_cluster *c,
                       const vp_par *p, vp_error *err);

/* Memory of the most loaded GPU and the step time of one configuration.
 * Either output may be NULL. Checks p with vp_par_check first. May run
 * the simulator (first use of a precision class and context-parallel
 * degree); VP_ENOMEM, graph errors. */
vp_status vp_cluster_eval(vp_cluster_model *cm, const vp_cluster *c,
                          const vp_par *p, vp_cluster_mem *mem,
                          vp_cluster_time *time, vp_error *err);

/* ---- collectives -------------------------------------------------------- */

typedef enum {
    VP_COLL_ALL_REDUCE,
    VP_COLL_ALL_GATHER,
    VP_COLL_REDUCE_SCATTER,
    VP_COLL_ALL_TO_ALL,
    VP_COLL_SEND
} vp_coll;

/* Seconds for one NCCL call moving `bytes` as nccl-tests count them (an
 * all-reduce's buffer, an all-gather's gathered output, a reduce-scatter's
 * input, a rank's whole all-to-all send buffer, one message) in a group of
 * n ranks `stride` ranks apart on cluster c: NCCL's tuning model (latency
 * by algorithm, protocol and hops; bus bandwidth of NVLink within a node,
 * of the rank's NIC across nodes), docs/STEP_TIME.md. 0 for n <= 1. */
double vp_coll_time(const vp_cluster *c, vp_coll k, double bytes, uint32_t n,
                    uint32_t stride);

/* Whether mem fits the cluster's GPU memory and host RAM. */
bool vp_cluster_fits(const vp_cluster *c, const vp_cluster_mem *mem);

/* ---- closed forms (published figures) ---------------------------------- */

/* Model-state bytes per GPU from the ZeRO paper (Rajbhandari et al. 2020,
 * Fig. 1): psi parameters, k optimizer bytes per parameter (12 for mixed-
 * precision Adam), nd data-parallel ranks, stage 0 (plain DP) to 3:
 * (2+2+k)psi, 4psi + k psi/nd, 2psi + (2+k)psi/nd, (2+2+k)psi/nd. */
double vp_zero_state_bytes(double psi, double k, double nd, int stage);

/* Korthikanti et al. 2022, Table 2: activation bytes of one transformer
 * layer with 16-bit activations and 1-byte dropout masks; s sequence, b
 * micro-batch, h hidden, a heads, t tensor-parallel degree. */
double vp_korthikanti_layer_bytes(double s, double b, double h, double a,
                                  double t, bool sp, vp_recompute rc);

/* Pipeline bubble fraction (p-1)/m, interleaved (p-1)/(v m) (Narayanan
 * et al. 2021); and micro-batches whose activations stage k holds. */
double vp_pipeline_bubble(uint32_t p, uint64_t m, uint32_t v);
double vp_pipeline_in_flight(vp_schedule s, uint32_t p, uint64_t m,
                             uint32_t v, uint32_t stage);
/* Seconds of bubble per step of a stage whose chunk (its layers, one
 * micro-batch) takes f forward, b full backward, w of which the weight
 * gradients: (p-1)(f+b) for 1F1B and GPipe, (p-1)(f+b)/v interleaved,
 * (p/2-1)(f+2b-3w) for DualPipe (DeepSeek-V3 report Table 2, its F&B
 * chunk's compute taken as f + b). */
double vp_pipeline_bubble_time(vp_schedule s, uint32_t p, uint32_t v,
                               double f, double b, double w);

/* ---- search ------------------------------------------------------------ */

#define VP_CLUSTER_TOP 10

typedef struct vp_search_opts {
    uint64_t global_batch;            /* sequences per step; 0 = 2^22 tokens
                                         / seq (at least 1)               */
    bool dtypes[VP_DT__COUNT];        /* allowed; all false = bf16 (fp16 on
                                         GPUs without bf16) and fp32      */
    bool engines[VP_ENGINE__COUNT];   /* allowed; all false = all         */
    bool no_offload;                  /* leave CPU offload out            */
    /* pins: 0 = searched */
    uint32_t tp, pp, cp, ep, dp;
    uint64_t micro_batch;
    int recompute;                    /* -1 = searched, else vp_recompute */
    int sharding;                     /* -1 = searched, else vp_sharding  */
    int schedule;                     /* -1 = searched, else vp_schedule  */
    uint32_t vpp;                     /* 0 = searched, else model chunks
                                         per stage (1 = no interleaving)  */
    int sp;                           /* -1 = searched, 0 off, 1 on       */
    /* set on every configuration (vp_par's fields; 0 / VP_AUTO = the
     * even split and the engines' defaults); configurations they do not
     * apply to are left out */
    uint32_t first_layers, last_layers;
    vp_switch overlap_dp, overlap_tp, overlap_ep;
    bool compile;
    bool fp8_gather;
    uint32_t mtp;
    uint32_t top;                     /* alternatives, <= VP_CLUSTER_TOP  */
} vp_search_opts;

void vp_search_opts_init(vp_search_opts *o);

typedef struct vp_plan_entry {
    vp_par par;
    vp_cluster_mem mem;
    vp_cluster_time time;
    bool fits;
    bool simulated;     /* mem is the simulated most loaded rank's
                           (vp_cluster_stage_sim), not the fitted figure  */
    char reason[200];   /* why it lost against the best (empty: best)     */
} vp_plan_entry;

typedef struct vp_cluster_plan {
    uint32_t gpus;
    uint64_t global_batch;
    bool found;                       /* some configuration fits          */
    vp_plan_entry best;
    vp_plan_entry alt[VP_CLUSTER_TOP];/* best of other layouts, fastest
                                         first                             */
    size_t n_alt;
    vp_plan_entry closest;            /* least memory (when none fits),
                                         with its step time               */
    uint64_t evaluated;               /* configurations evaluated         */
    uint64_t pruned;                  /* skipped by the model-state bound */
    uint64_t fitting;                 /* evaluated ones that fit          */
    uint32_t sims;                    /* simulator runs (precomputation)  */
} vp_cluster_plan;

/* Search every valid configuration on cluster c: dtype, engine and
 * sharding, offload, tp (with and without sp), cp, ep, pp with its
 * schedule and interleaving, micro-batch and accumulation, recomputation.
 * A layout whose model states alone exceed the GPU memory is skipped
 * with every activation option (counted in pruned). Fills *out; VP_OK
 * also when nothing fits (out->found false). VP_EARG for a global batch
 * or options no configuration can satisfy. */
vp_status vp_cluster_search(vp_cluster_model *cm, const vp_cluster *c,
                            const vp_search_opts *o, vp_cluster_plan *out,
                            vp_error *err);

/* The smallest power-of-two GPU count above c->gpus, up to max_gpus, on
 * which a plan fits (*gpus = 0 when none does); *out gets that search. */
vp_status vp_cluster_min_gpus(vp_cluster_model *cm, const vp_cluster *c,
                              const vp_search_opts *o, uint32_t max_gpus,
                              uint32_t *gpus, vp_cluster_plan *out,
                              vp_error *err);

/* The fewest GPUs of c's kind (its GPU, node size, memory, host RAM and
 * network; c->gpus is ignored) whose best plan trains on `tokens` within
 * `seconds`: sizes 1, 2, 4 ... below a node, then whole nodes, doubled
 * until one finishes and then bisected (the time falls as nodes are
 * added). *gpus = 0 when no size up to max_gpus finishes; otherwise *out
 * holds the search at *gpus. VP_EARG for a token budget or time <= 0. */
vp_status vp_cluster_gpus_for_time(vp_cluster_model *cm, const vp_cluster *c,
                                   const vp_search_opts *o, double tokens,
                                   double seconds, uint32_t max_gpus,
                                   uint32_t *gpus, vp_cluster_plan *out,
                                   vp_error *err);

/* ---- export ------------------------------------------------------------ */

#define VP_EXPORT_MAP(XX)                                                  \
    XX(DEEPSPEED, "deepspeed")  /* DeepSpeed JSON config              */   \
    XX(MEGATRON, "megatron")    /* Megatron-LM pretrain_gpt.py args   */   \
    XX(TORCHRUN, "torchrun")    /* torchrun + HF Trainer FSDP flags   */

typedef enum {
#define VP__EX(name, str) VP_EXPORT_##name,
    VP_EXPORT_MAP(VP__EX)
#undef VP__EX
    VP_EXPORT__COUNT
} vp_export_format;

/* The engine an export format drives. */
vp_engine vp_export_engine(vp_export_format f);

/* Write plan p (global batch gb on cluster c) as format f into buf (n
 * bytes, always NUL-terminated when n > 0); *len gets the full length
 * (may exceed n - 1: call again with a larger buffer). VP_EUNSUPPORTED
 * when the engine cannot run the plan (the message says why). */
vp_status vp_export_plan(const vp_cluster_model *cm, const vp_cluster *c,
                         const vp_par *p, vp_export_format f, char *buf,
                         size_t n, size_t *len, vp_error *err);

/* ---- a Megatron-LM rank, simulated (megatron.c) ------------------------ */

/* One pipeline stage's rank of a Megatron-LM layout, simulated: the
 * stage's layers (tensor-parallel shards: heads/tp, ffn/tp, vocab/tp), the
 * embedding on the first stage, the head and loss on the last, under the
 * 1F1B or interleaved schedule (vp_pipeline), sequence parallelism as
 * Megatron's layers run it, with Megatron's bf16 parameters, fp32
 * gradient buffer and (distributed) optimizer states, through the
 * simulator and the allocator model. docs/DISTRIBUTED.md "Megatron-LM". */
typedef struct vp_stage_sim {
    uint32_t stage;          /* 0-based                                     */
    uint32_t layers;         /* decoder layers on the stage                 */
    uint32_t in_flight;      /* micro-batches whose forwards are alive at
                                once (min(pp - stage, m)); interleaved:
                                model-chunk passes, min((pp - stage - 1) 2
                                + (vpp - 1) pp + 1, m vpp)                  */
    uint32_t chunks;         /* model chunks of the stage (vpp)             */
    uint32_t simulated_mb;   /* micro-batches simulated per step: the
                                warm-up's and two more groups (pp when
                                interleaved, else 1), at most all and
                                VP_MAX_ACCUM_UNSTEADY; the rest repeat     */
    uint64_t params;         /* parameter elements on the rank              */
    uint64_t peak_alloc;     /* allocated bytes at the peak                 */
    uint64_t peak_reserved;  /* the allocator's reserved bytes              */
    uint64_t by_category[8]; /* live at the peak (vp_category order)       */
    uint64_t total;          /* peak reserved + NCCL + context: the GPU's
                                bytes                                       */
} vp_stage_sim;

/* Simulate stage `stage` of a Megatron layout (sharding megatron-ddp or
 * distributed-optimizer, 1F1B, interleaved or one stage, bf16/fp16/fp32/
 * fp8, sequence and context parallelism, optimizer offload), the stage's
 * graph in Megatron's op flavour. Layouts the simulated path does not
 * model yet (experts, parameter offload, layer forms the flavour does not
 * build) are VP_EUNSUPPORTED naming the feature. */
vp_status vp_cluster_stage_sim(vp_cluster_model *cm,
                               const vp_cluster *c, const vp_par *p,
                               uint32_t stage, vp_stage_sim *out,
                               vp_error *err);

/* A DeepSpeed ZeRO layout without model parallelism (sharding zero1,
 * zero2 or zero3, tp = pp = cp = ep = 1) simulated as its most loaded
 * rank (dist.h's deepspeed-zero1/2/3): *e gets the fitted evaluation,
 * then, where the simulation models the layout (e->simulated), the
 * simulated rank's memory and fit. */
vp_status vp_cluster_ds_sim(vp_cluster_model *cm, const vp_cluster *c,
                            const vp_par *p, vp_plan_entry *e,
                            vp_error *err);

/* ---- names ------------------------------------------------------------- */

vp_engine vp_sharding_engine(vp_sharding s);
const char *vp_dtype_name(vp_dtype d);
const char *vp_recompute_name(vp_recompute r);
const char *vp_schedule_name(vp_schedule s);
const char *vp_sharding_name(vp_sharding s);
const char *vp_engine_name(vp_engine e);
const char *vp_offload_name(vp_offload o);
const char *vp_export_format_name(vp_export_format f);
/* Parse the names above; VP_EARG if unknown. */
vp_status vp_dtype_parse(const char *s, vp_dtype *out);
vp_status vp_recompute_parse(const char *s, vp_recompute *out);
vp_status vp_schedule_parse(const char *s, vp_schedule *out);
vp_status vp_sharding_parse(const char *s, vp_sharding *out);
vp_status vp_engine_parse(const char *s, vp_engine *out);
vp_status vp_export_format_parse(const char *s, vp_export_format *out);

#endif
