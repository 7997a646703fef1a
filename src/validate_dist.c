/* Validation of multi-GPU cases (collect_dist.py) against the cluster
 * planner's per-GPU memory model (cluster.h, docs/CLUSTER.md).
 *
 * A case line is one rank of one data-parallel run: the ground-truth
 * schema plus `world`, `rank`, `strategy` and `mixed_precision`
 * (validate.c reads it). The run is evaluated as the cluster configuration
 * dp = world (tp = pp = cp = ep = 1, one micro-batch of `batch` sequences
 * per rank) on the GPU the runs used (vp_validate_opts.hw), and the most
 * loaded GPU's figures are compared with the rank's measurements:
 *
 *   peak_alloc    = weights + grads + optimizer + buffers + activations
 *                   + transient   (the caching allocator's bytes, at the
 *                   larger of the forward/backward peak and the optimizer
 *                   step's, docs/CLUSTER.md "Two peaks")
 *   peak_reserved = peak_alloc + overhead (alloc_overhead, 5 %)
 *   device_used   = peak_reserved + NCCL buffers + CUDA context
 *
 * Data parallelism loads every rank alike, so every rank gets the same
 * prediction; the metrics carry the rank ("rank3.peak_alloc"). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "validate_impl.h"
#include "vramplan/cluster.h"

/* The strategies the model covers, in vp__dist_strategies' order; the
 * others measured (ZeroRedundancyOptimizer, FSDP2) are not modelled yet. */
#define DIST_N_MODELLED 4
static const vp_sharding DIST_SHARDING[DIST_N_MODELLED] = {
    VP_SHARD_DDP, VP_SHARD_DDP, VP_SHARD_FSDP_FULL, VP_SHARD_FSDP_GRAD_OP};
static const bool DIST_BUCKET_VIEW[DIST_N_MODELLED] = {false, true, false,
                                                      false};

/* An error at a field of the case. */
static vp_status at(const vp_case_in *in, const char *field, vp_status code,
                    vp_error *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
static vp_status at(const vp_case_in *in, const char *field, vp_status code,
                    vp_error *err, const char *fmt, ...)
{
    char text[sizeof err->msg];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return vp__jerr(in->doc, vp__jdoc_member(in->doc, 0, field), false, code,
                    err, "%s", text);
}

/* What the per-rank model covers: the strategies above, foreach AdamW
 * (PyTorch's default: the cluster model counts its state and its step's
 * temporary), training steps, and mixed precision as the model applies it
 * (DDP: autocast to bf16 over fp32 parameters; FSDP1: MixedPrecision
 * with bf16 parameters and bf16 reductions). */
static vp_status check_covered(const vp_case_in *in, vp_error *err)
{
    const char *dt = in->mixed_precision ? "bf16" : "fp32";
    bool fsdp = in->strategy >= 2;

    if (in->strategy >= DIST_N_MODELLED)
        return at(in, "strategy", VP_EUNSUPPORTED, err,
                  "strategy '%s' is not supported yet",
                  vp__dist_strategies[in->strategy]);
    if (in->fsdp_version > 1)
        return at(in, "fsdp_version", VP_EUNSUPPORTED, err,
                  "fsdp_version 2 is not supported yet");
    if (in->opt > 0)
        return at(in, "opt", VP_EUNSUPPORTED, err,
                  "optimizer '%s' is not modelled for multi-GPU cases (the "
                  "cluster model counts foreach AdamW)",
                  vp__case_opts[in->opt]);
    if (in->infer)
        return at(in, "infer", VP_EUNSUPPORTED, err,
                  "multi-GPU inference is not modelled");
    if (in->prec >= 0 && (in->prec != 0) != in->mixed_precision)
        return at(in, "prec", VP_ERANGE, err,
                  "prec '%s' contradicts mixed_precision",
                  vp__dist_precs[in->prec]);
    if (in->autocast >= 0 && (fsdp || !in->mixed_precision || in->autocast))
        return at(in, "autocast", VP_EUNSUPPORTED, err,
                  "autocast '%s' is supported with DDP and mixed precision "
                  "only (bf16)", in->autocast ? "fp16" : "bf16");
    if (in->param_dtype >= 0 && strcmp(vp__dtypes[in->param_dtype], dt))
        return at(in, "param_dtype", VP_EUNSUPPORTED, err,
                  "param_dtype '%s' is not supported yet with this "
                  "mixed_precision", vp__dtypes[in->param_dtype]);
    /* FULL_SHARD reshards after the forward, SHARD_GRAD_OP does not */
    if (in->reshard_node >= 0 &&
        json_is_true(in->doc->nodes[in->reshard_node].value) !=
            (in->strategy == 2))
        return at(in, "reshard_after_forward", VP_EUNSUPPORTED, err,
                  "reshard_after_forward %s is not supported yet with "
                  "strategy '%s'",
                  in->strategy == 2 ? "false" : "true",
                  vp__dist_strategies[in->strategy]);
    if (in->reduce_dtype >= 0 && strcmp(vp__dtypes[in->reduce_dtype], dt))
        return at(in, "reduce_dtype", VP_EUNSUPPORTED, err,
                  "reduce_dtype '%s' is not supported yet with this "
                  "mixed_precision", vp__dtypes[in->reduce_dtype]);
    return VP_OK;
}

static void rank_metric(vp_case_result *r, uint64_t rank, const char *what,
                        uint64_t pred, uint64_t meas)
{
    char name[32];

    if (meas == 0)
        return;
    snprintf(name, sizeof name, "rank%llu.%s", (unsigned long long)rank,
             what);
    vp__case_metric(r, name, pred, meas);
}

/* The rank's configuration as a cluster plan. */
static void rank_par(const vp_case_in *in, vp_par *p)
{
    memset(p, 0, sizeof *p);
    p->dp = (uint32_t)in->world;
    p->tp = p->pp = p->cp = p->ep = p->vpp = 1;
    p->schedule = VP_SCHED_1F1B;
    p->micro_batch = in->batch;
    p->accum = in->accum ? in->accum : 1;
    /* DDP: autocast over fp32 parameters; FSDP: MixedPrecision with bf16
     * parameters, reductions and buffers; without either, fp32 */
    p->dtype = in->mixed_precision ? VP_DT_BF16 : VP_DT_FP32;
    p->recompute = in->ckpt ? VP_RC_FULL : VP_RC_NONE;
    p->sharding = DIST_SHARDING[in->strategy];
    p->offload = VP_OFFLOAD_NONE;
    p->bucket_view = DIST_BUCKET_VIEW[in->strategy];
}

vp_status vp__validate_rank(const vp_case_in *in, const vp_validate_opts *o,
                            vp_case_result *out, vp_error *err)
{
    uint64_t local = in->local_world ? in->local_world
                     : in->world < 8 ? in->world : 8;
    vp_cluster_model *cm = NULL;
    vp_cluster_mem mem = {0};
    vp_cluster c;
    vp_par p;

    if (in->world == 1)
        return at(in, "world", VP_EUNSUPPORTED, err,
                  "a data-parallel run at world 1 is not modelled yet");
    if (in->rank >= in->world)
        return at(in, "rank", VP_ERANGE, err,
                  "rank %" PRIu64 " is not below the world size %" PRIu64,
                  in->rank, in->world);
    if (local > in->world)
        return at(in, "local_world", VP_ERANGE, err,
                  "local_world %" PRIu64 " is above the world size %" PRIu64,
                  local, in->world);
    vp_status st = check_covered(in, err);
    if (st == VP_OK && o->hw == NULL)
        st = vp__jerr(in->doc, 0, false, VP_EUNSUPPORTED, err,
                      "a multi-GPU case needs the GPU the runs used (an env "
                      "line naming a known GPU, or --gpu)");
    if (st != VP_OK)
        return st;
    vp_model *m = vp__case_find_model(in, o->dirs, o->n_dirs, o->path, err);
    if (m == NULL)
        return err != NULL ? err->code : VP_EIO;
    if (in->attn >= 0 && m->form == 0)
        m->tf.attn = (vp_attn_impl)in->attn;
    cm = vp_cluster_model_new(m, in->seq, err);
    st = cm == NULL ? (err != NULL ? err->code : VP_EUNSUPPORTED) : VP_OK;
    if (st == VP_OK) {
        vp_cluster_init(&c, o->hw, (uint32_t)in->world, (uint32_t)local);
        rank_par(in, &p);
        st = vp_cluster_eval(cm, &c, &p, &mem, NULL, err);
    }
    uint64_t alloc = 0, reserved = 0;
    const uint64_t parts[] = {mem.weights, mem.grads, mem.optimizer,
                              mem.buffers, mem.activations, mem.transient};
    for (size_t i = 0; st == VP_OK && i < sizeof parts / sizeof *parts; i++)
        if (!vp_add_u64(alloc, parts[i], &alloc))
            st = vp_error_set(err, VP_EOVERFLOW, "the rank's bytes overflow");
    if (st == VP_OK && !vp_add_u64(alloc, mem.overhead, &reserved))
        st = vp_error_set(err, VP_EOVERFLOW, "the rank's bytes overflow");
    if (st == VP_OK) {
        rank_metric(out, in->rank, "peak_alloc", alloc, in->peak_alloc);
        rank_metric(out, in->rank, "peak_reserved", reserved,
                    in->peak_reserved);
        rank_metric(out, in->rank, "device_used", mem.total,
                    in->device_used);
    }
    vp_cluster_model_free(cm);
    vp_model_free(m);
    return st;
}
