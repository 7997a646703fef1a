/* vramplan internal: what validate.c (reading case lines, one-GPU and
 * max-batch cases, files) shares with validate_dist.c (multi-GPU ranks).
 * Not installed. */
#ifndef VRAMPLAN_VALIDATE_IMPL_H
#define VRAMPLAN_VALIDATE_IMPL_H

#include "internal.h"
#include "json.h"
#include "vramplan/validate.h"

/* One element of a case's "steps": allocated bytes at the phase marks
 * (0 when absent) and the reserved bytes. */
typedef struct vp_step_in {
    uint64_t start, fwd_peak, after_fwd, bwd_peak, after_bwd, opt_peak, end;
    uint64_t reserved;
} vp_step_in;

/* A case's fine-tuning fields (validate_ft.c): the enums' choice indices
 * (-1 absent) and the figures measured besides the peaks (0 absent). */
typedef struct vp_case_ft {
    vp_finetune f;          /* lora, freeze                               */
    int base_dtype, quant, load;
    uint64_t trainable, total, setup_peak;
} vp_case_ft;
/* One generate() call of a generate case ("runs"): allocated bytes at
 * its start, its peak and its end, and the reserved bytes after it. */
typedef struct vp_run_in {
    uint64_t start, peak, end, reserved;
} vp_run_in;

/* A generate case's own fields (validate_gen.c). */
typedef struct vp_gen_in {
    uint64_t prompt, new_tokens;
    bool sample, pad;
    int cache;                /* its choice, -1 when absent            */
    uint64_t kv_cache_bytes;
    uint32_t n_runs;
    vp_run_in run[VP_MAX_STEPS];
} vp_gen_in;

/* A case line's fields as the schema read them. Enum fields hold the
 * index of their value in the row's choices, -1 when absent; numbers are 0
 * when absent (every counted field is at least 1). */
typedef struct vp_case_in {
    const vp_jdoc *doc;
    const char *id, *model, *failed;
    const char *hf_config;  /* the model's config.json, relative to the
                               case file's folder; NULL: found by model */
    int prec, opt, attn, strategy, autocast, param_dtype, reduce_dtype;
    int reshard_node;       /* reshard_after_forward's node, -1 */
    int ds_node;            /* DeepSpeed's ds_config object, -1  */
    int pg;                 /* multi-GPU: 0 nccl, 1 fake, -1     */
    uint64_t mesh[2];       /* HSDP [replicate, shard]; 0: none  */
    uint64_t tp, dp;        /* FSDP2 + TP: the mesh's degrees; 0 */
    int sp_node, lp_node;   /* sequence_parallel, loss_parallel's
                               nodes, -1                          */
    uint64_t pp;            /* + PP (collect_pp_fake.py): stages; 0 */
    int stage_node;         /* "stage"'s node, -1                 */
    int schedule;           /* its choice (1f1b), -1              */
    uint64_t microbatches;  /* per step; 0 absent                 */
    uint64_t stage_layers;  /* the stage's layers as built; 0     */
    bool return_outputs;    /* the last stage kept its outputs    */
    int retries_node;       /* num_alloc_retries' node, -1       */
    bool ckpt, set_to_none, infer, mixed_precision;
    uint64_t batch, seq, accum, world, rank, local_world, run, fsdp_version;
    uint64_t target;        /* encoder-decoder: the decoder length      */
    uint64_t max_batch, cap;
    uint64_t after_model, peak_alloc, peak_alloc_steady, peak_reserved;
    uint64_t device_used, params;
    double budget_gib, step_ms;
    double host_probe_us;   /* the host benchmark beside it; 0 absent */
    uint32_t n_steps;
    vp_step_in step[VP_MAX_STEPS];
    vp_case_ft ft;
    vp_gen_in gen;
} vp_case_in;

/* Values of the enum fields, in the order of their choices. */
extern const char *const vp__case_attns[];  /* sdpa flash efficient eager
                                               math (vp_attn_impl order) */
extern const char *const vp__case_opts[];   /* adamw adamw-fused
                                               adamw-forloop sgd adafactor */
extern const char *const vp__dist_strategies[]; /* ddp ddp-bucket-view
                                                   fsdp-full fsdp-grad-op
                                                   ddp-zero1 fsdp2
                                                   fsdp-hybrid
                                                   deepspeed-zero1/2/3    */
extern const char *const vp__case_pgs[];    /* nccl fake                 */
extern const char *const vp__dist_precs[];  /* fp32 amp-bf16 fsdp-mp-bf16 */
extern const char *const vp__dtypes[];      /* fp32 bf16 fp16            */
extern const char *const vp__case_precs[];  /* collect.py's precisions   */
extern const vp_precision vp__case_prec_map[]; /* their vp_precision     */

/* The case's model: its "hf_config" (relative to the folder of the case
 * file `path`; VP_EIO at that field when missing), else the first of dirs
 * that holds NAME.yaml or NAME.json (vp_model_load), else the
 * hf_configs/NAME.json beside the case file (a ground-truth folder's
 * configs); VP_EIO naming it, at the case's "model", when none does. */
vp_model *vp__case_find_model(const vp_case_in *in, const char *const *dirs,
                              size_t n_dirs, const char *path,
                              vp_error *err);

/* The fields of a generate case besides those of every line (its table
 * of rows for vp__jschema_check; validate_gen.c). */
extern const vp_jfield vp__gen_rows[];
extern const size_t vp__n_gen_rows;

/* Run a generate case that vp_validate_line has read: its model (its
 * hf_config, or found as vp__case_find_model does), the generate() calls
 * of its runs, and the metrics (peaks, reserved, after_model,
 * device_used, kv_cache_bytes, each run's peak). */
vp_status vp__validate_generate(const vp_case_in *in,
                                const vp_validate_opts *o,
                                vp_case_result *out, vp_error *err);

/* Append a metric (predicted against measured > 0) to r. */
void vp__case_metric(vp_case_result *r, const char *name, uint64_t pred,
                     uint64_t meas);

/* The fine-tuning fields of one-GPU cases (validate_ft.c): their rows,
 * their defaults, the setup they make, and the figures they check. */
extern const vp_jfield vp__case_ft_rows[];
/* "load"'s choices (dtype, fp32-then-cast, meta) and their vp_load: one
 * field for training and generate cases (in->ft.load). */
extern const char *const vp__case_loads[];
extern const vp_load vp__case_load_map[];
extern const size_t vp__case_ft_n;
void vp__case_ft_init(vp_case_in *in);
void vp__case_ft_setup(const vp_case_in *in, vp_setup *s);
void vp__case_ft_metrics(const vp_case_in *in, const vp_estimate *e,
                         vp_case_result *out);

/* Run a multi-GPU rank that vp_validate_line has read (validate_dist.c). */
vp_status vp__validate_rank(const vp_case_in *in, const vp_validate_opts *o,
                            vp_case_result *out, vp_error *err);

#endif
