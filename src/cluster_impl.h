/* What cluster.c, cluster_search.c and cluster_forms.c share: the
 * per-model precomputation and the evaluator's context. Not installed. */
#ifndef VRAMPLAN_CLUSTER_IMPL_H
#define VRAMPLAN_CLUSTER_IMPL_H

#include "internal.h"
#include "vramplan/cluster.h"

/* A quantity fitted over micro-batch b and tensor-parallel degree t:
 * X(b, t) = (r0 + r1 b) + (s0 + s1 b) / t; with sequence parallelism the
 * replicated part r is divided by t too. */
typedef struct vp__fit {
    double r0, r1, s0, s1;
} vp__fit;

/* A count split into its replicated and tensor-parallel parts. */
typedef struct vp__split {
    double r, s;
} vp__split;

/* A matmul shape of a layer (or of the head), per sequence at t = 1. */
enum { VP__SPLIT_NONE, VP__SPLIT_COL, VP__SPLIT_ROW };
typedef struct vp__gemm {
    double rows;   /* rows per sequence (an expert's share of the tokens for
                      expert GEMMs)                                       */
    double n, k;   /* output and input features                           */
    double count;  /* GEMMs of this shape (experts: one per expert)       */
    int split;     /* the side tensor parallelism divides                 */
    bool expert;
} vp__gemm;
#define VP__GEMMS 16

/* Memory-bound traffic of an engine that fuses its elementwise kernels
 * (Megatron, Transformer Engine, torch.compile), per sequence:
 * activation elements read and written (x the activation's bytes),
 * one-byte mask elements, kernels. docs/STEP_TIME.md "Memory-bound". */
typedef struct vp__fused {
    vp__split elems, masks;
    double kernels;
} vp__fused;

/* A communicator's shape on the cluster: ranks, nodes, ranks per node,
 * the bus bandwidth per rank, NVLink's and the network's. */
typedef struct vp__group {
    double n, nodes, ppn, bw, intra_bw, net_bw;
    bool pci;
} vp__group;

void vp__group_shape(const vp_cluster *c, double n, double stride,
                     vp__group *g);
double vp__coll(const vp__group *g, vp_coll k, double bytes);

/* Simulated quantities of one micro-batch (bytes, kernels). */
enum {
    VP__Q_EMB,        /* saved by the embedding                         */
    VP__Q_LAYER,      /* saved by one layer                             */
    VP__Q_ATTN_INT,   /* of which the core attention's internals        */
    VP__Q_EXTRA,      /* a layer's backward peak beyond what is saved,
                         parameter gradients left out                   */
    VP__Q_HEAD_SAVED, /* saved by the head and loss                     */
    VP__Q_HEAD_PEAK,  /* the head's peak over the last layer's output,
                         parameter gradients left out                   */
    VP__Q_MEM_F,      /* bytes written by a layer's memory-bound ops    */
    VP__Q_MEM_B,
    VP__Q_KER_F,      /* their kernels                                  */
    VP__Q_KER_B,
    VP__Q_ATTN_MEM_F, /* bytes written by the attention op              */
    VP__Q_ATTN_MEM_B,
    VP__Q_HEAD_MEM,   /* head + loss memory-bound bytes, fwd + bwd      */
    VP__Q_HEAD_KER,
    VP__Q_EMB_MEM,
    VP__Q_EMB_KER,
    VP__Q_HEAD_GRAD,  /* parameter-gradient bytes the backward has made
                         at the head's peak (in the simulated dtype:
                         fp32 under autocast and in fp32, else 16-bit)  */
    VP__Q_LAYER_GRAD, /* the same at a layer's backward peak (the
                         head's gradients and part of the layer's)      */
    VP__Q_COUNT
};

/* Precision classes of the simulated graph. */
enum {
    VP__CLS_HALF, /* module in bf16/fp16 (Megatron, DeepSpeed, FSDP MP) */
    VP__CLS_AMP,  /* fp32 module under autocast (PyTorch DDP)           */
    VP__CLS_FP32
};

typedef struct vp__act {
    int cls;
    uint32_t cp;
    double resid_bytes; /* bytes per element of the residual stream */
    double host_k[2];   /* graph-form models: kernels the host issues for
                           one micro-batch, forward and backward (timing.c's
                           host model; independent of the batch)         */
    vp__fit q[VP__Q_COUNT];
} vp__act;

/* A graph-form model planned whole (cluster_graph.c): what the
 * evaluator needs beyond the fields it shares with transformers. */
typedef struct vp__whole {
    vp__gemm *gemm;     /* linear layers and materialised attention
                           scores, rows per sample, merged by shape      */
    size_t n_gemm;
    double conv_f, conv_b; /* convolution FLOPs of one sample            */
    double conv_el;     /* output elements of one sample's convolutions
                           (cuDNN's layout copies: timing.c conv_time)   */
    double bn[VP__BN__N][2]; /* one sample's batch norms, bytes at the copy
                           bandwidth by kernel path, forward and backward
                           (timing.c bn_fit)                              */
    vp__mha_bytes mha[2]; /* one sample's torch_mha projections' forward
                           copies and bias adds and the backward's copies,
                           fills and sums of q, k, v, 16-bit [0] and fp32
                           [1] (timing.c vp__mha_kernels)                 */
    double unit_max;    /* parameters of the largest unit (segment)      */
    double big;         /* elements of the largest parameter tensor      */
} vp__whole;

struct vp_cluster_model {
    const vp_model *m;
    vp__whole *whole;  /* graph-form models: planned whole (NULL: a
                          transformer, the per-layer fits)               */
    vp_tf local[2];   /* the model with two layers, at t = 1 and t = t2:
                         plain values, built with vp__graph_build_tf     */
    uint64_t seq, L, hidden, heads, kv_heads, head_dim, ffn, vocab;
    uint64_t experts, top_k;
    vp_attn_impl attn;
    uint32_t t2;
    bool tied;
    /* parameters (elements) */
    vp__split p_layer, p_exp, p_word, p_emb_other, p_head_word, p_head_other;
    /* FLOPs of one sequence (b = 1, whole seq) */
    vp__split flin_f, flin_b, fattn_f, fattn_b, fexp_f, fexp_b;
    vp__split fhead_f, fhead_b;
    double n_lin, n_attn, n_exp, n_head; /* GEMM kernels per layer, head */
    double flops_per_sample, rec_full_per_sample, rec_sel_per_sample;
    /* matmul shapes of a layer and of the head */
    vp__gemm gemm[VP__GEMMS], hgemm[4];
    size_t n_gemm, n_hgemm;
    /* fused memory-bound traffic of a layer, the head (with the loss) and
     * the embedding */
    vp__fused fz_layer, fz_head, fz_emb;
    /* elements per sequence of a layer's linear inputs and of the
     * activation outputs of gated MLPs (fp8 and fused-SwiGLU savings) */
    vp__split lin_in, gated;
    /* elements a layer keeps under op-level selective checkpointing
     * (torchtitan's policy: every other linear's output, the attention
     * core's output and statistics) */
    vp__split sac;
    /* what a layer saves in an engine with fused kernels, besides the
     * linears' inputs: activation elements and one-byte mask elements per
     * sequence (the materialised scores are added at evaluation) */
    vp__split keep, keep_mask;
    vp__split keep_exp; /* of keep, the routed experts' rows (balanced)   */
    /* the attention core of a layer */
    double at_heads, at_q, at_kv, at_dim, at_dropout;
    bool at_causal, at_eager;
    /* parameter tensors and sub-modules with parameters of a layer (what
     * DeepSpeed ZeRO-3 gathers call by call) */
    double layer_tensors, layer_modules;
    uint64_t params, layer_params, embed_params, head_params;
    /* simulated activation entries */
    vp__act **act;            /* each entry allocated alone: stable */
    size_t n_act, cap_act;
    uint32_t sims;
};

/* Constants of one (model, cluster) pair for the evaluator. */
typedef struct vp__evctx {
    const vp_cluster_model *cm;
    const vp_cluster *c;
    vp_hw hw;              /* the cluster's GPU, curves filled           */
    double host_bw;
    double peak[VP_DT__COUNT];        /* datasheet rate of the linear layers */
    const vp_curve *lin[VP_DT__COUNT];  /* GEMM curve of the linear layers */
    const vp_curve *mm[VP_DT__COUNT];   /* of other matmuls (eager attention) */
} vp__evctx;

/* The stages of a configuration: layers and parameters of the first,
 * the last and the fullest middle stage (docs/CLUSTER.md "Stages"). */
typedef struct vp__stages {
    double l0, l1, lm;    /* layers; lm = 0 when there is no middle stage */
    double pd0, pd1, pdm; /* dense parameters                             */
    double pe0, pe1, pem; /* expert parameters (local experts)            */
    double pu;            /* the largest unit gathered at once (a layer)  */
    double pr;            /* FSDP's root unit: embedding and head         */
    double popt;          /* parameters the slowest stage's optimizer
                             steps                                        */
} vp__stages;

void vp__stage_layers(const vp_cluster_model *cm, const vp_par *p,
                      double *l0, double *l1, double *lm);
/* The time of a configuration (cluster_time.c). */
void vp__time(const vp__evctx *x, const vp__act *a, const vp_par *p,
              const vp__stages *st, vp_cluster_time *tm);
double vp__fitv(const vp__fit *f, double b, double t, bool sp);

/* A switch's value, `dflt` for VP_AUTO. */
static inline bool vp__on(vp_switch s, bool dflt)
{
    return s == VP_AUTO ? dflt : s == VP_ON;
}

/* PyTorch DDP, alone or with ZeroRedundancyOptimizer: replicated fp32
 * parameters and gradients under autocast, data parallelism only. */
static inline bool vp__ddp_like(vp_sharding s)
{
    return s == VP_SHARD_DDP || s == VP_SHARD_DDP_ZERO1;
}

/* FSDP2 (fully_shard) on a 1-D or a 2-D (HSDP) mesh. */
static inline bool vp__fsdp2(vp_sharding s)
{
    return s == VP_SHARD_FSDP2 || s == VP_SHARD_HSDP2;
}

/* Sharded within a node, replicated across nodes (FSDP1 HYBRID_SHARD,
 * FSDP2 on a (replicate, shard) mesh). */
static inline bool vp__hybrid(vp_sharding s)
{
    return s == VP_SHARD_FSDP_HYBRID || s == VP_SHARD_HSDP2;
}

/* Candidates of a search re-evaluated by simulation (cluster_search.c):
 * the fastest family bests, at least 20. */
#define VP__VERIFY_TOP 24
/* The stages of a pipeline of pp stages that differ, into st (megatron.c):
 * the first, the first middle one and the last; returns their count. */
uint32_t vp__stages_that_differ(uint32_t pp, uint32_t st[3]);
/* Replace e's memory by its most loaded simulated rank's (megatron.c)
 * when vp_cluster_stage_sim models its layout (e->simulated), and set
 * e->fits from it; otherwise leave e as fitted. */
vp_status vp__plan_simulate(vp_cluster_model *cm, const vp_cluster *c,
                            vp_plan_entry *e, vp_error *err);
/* The same for DeepSpeed's ZeRO layouts without model parallelism
 * (cluster_ds.c: the most loaded rank through dist_deepspeed.c). */
vp_status vp__plan_simulate_ds(vp_cluster_model *cm, const vp_cluster *c,
                               vp_plan_entry *e, vp_error *err);
/* The same for a PyTorch-engine plan (cluster_verify.c): a DDP or FSDP
 * layout at tp = pp = cp = ep = 1 simulated as `estimate --strategy
 * --world` runs it, its most loaded role's figures in e->mem; any other
 * plan (and what the per-rank simulator does not model: fp8, compile,
 * selective recomputation, offload, an FSDP plan whose peak is the
 * wrapper's construction from the whole model) is left as it is. */
/* The bytes a rank's caching allocator can hold on the plan's GPU: the
 * usable memory less NCCL's buffers and the CUDA context (0 when those
 * fill it). Verification simulates under it, so that a rank frees its
 * cached blocks and retries before failing, as PyTorch's allocator does
 * when cudaMalloc fails (CUDACachingAllocator.cpp, DeviceCachingAllocator::
 * malloc: release_cached_blocks, then alloc_block again). */
uint64_t vp__rank_device_bytes(const vp_cluster *c, uint64_t nccl,
                               uint64_t context);
/* vp_simulate under that device size; a rank that runs out of it even so
 * is simulated again without it, so that its figures (over the memory,
 * fits false) are reported. */
vp_status vp__simulate_on_device(const vp_graph *g, vp_setup *s,
                                 uint64_t device, vp_estimate *out,
                                 vp_error *err);
vp_status vp__plan_simulate_torch(vp_cluster_model *cm, const vp_cluster *c,
                                  vp_plan_entry *e, vp_error *err);
/* The description of one tensor-parallel rank's share (heads, ffn and
 * vocab divided by t) of two layers of m (a value). */
void vp__local_tf(vp_tf *tf, const vp_model *m, uint32_t t);
vp_status vp__act_get(vp_cluster_model *cm, int cls, uint32_t cp,
                      const vp__act **out, vp_error *err);
void vp__evctx_init(vp__evctx *x, const vp_cluster_model *cm,
                    const vp_cluster *c);
/* Evaluate a valid configuration (vp_par_check passed). */
void vp__evaluate(const vp__evctx *x, const vp__act *a, const vp_par *p,
                  vp_cluster_mem *mem, vp_cluster_time *tm);
/* Device bytes of the model states, buffers, NCCL and context on the
 * most loaded stage (a lower bound of the total: activations excluded),
 * and the host bytes per node. */
double vp__states_bound(const vp__evctx *x, const vp_par *p, double *host);
int vp__cls_of(const vp_par *p);
double vp__dtype_rate(const vp_hw *hw, vp_dtype d, bool linear);
bool vp__offload_allowed(vp_sharding s, vp_offload o);
bool vp__tp_valid(const vp_cluster_model *cm, uint32_t t);
bool vp__cp_valid(const vp_cluster_model *cm, uint32_t cp);

/* Graph-form models planned whole (cluster_graph.c). The default global
 * batch: samples per GPU (Goyal et al. 2017, "Accurate, Large Minibatch
 * SGD: Training ImageNet in 1 Hour", n = 32 images per worker). */
#define VP_WHOLE_SAMPLES_PER_GPU 32
vp_cluster_model *vp__cluster_whole_new(const vp_model *m, uint64_t seq,
                                        vp_error *err);
void vp__whole_free(vp__whole *w);
/* The activation entry a->cls of a whole model: its step simulated at
 * micro-batch 1 and 2. */
vp_status vp__whole_act(vp_cluster_model *cm, vp__act *a, vp_error *err);
/* VP_EUNSUPPORTED naming what a whole model cannot do (tp, pp, cp, ep,
 * sp, Megatron, recomputation, fp8, torch.compile) and why. */
vp_status vp__whole_check(const vp_cluster_model *cm, const vp_par *p,
                          vp_error *err);
/* The same for a search's pins. */
vp_status vp__whole_opts_check(const vp_cluster_model *cm,
                               const vp_search_opts *o, vp_error *err);

#endif
