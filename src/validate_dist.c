/* Validation of multi-GPU cases (collect_dist.py, collect_dist_more.py)
 * against the per-rank simulation of their wrapper (dist.h,
 * docs/DISTRIBUTED.md).
 *
 * A case line is one rank of one data-parallel run: the ground-truth
 * schema plus `world`, `rank`, `strategy`, `mixed_precision` and the
 * wrapper's settings (validate.c reads them). The line's rank is
 * simulated as its run's rank `rank`: the same op rules and allocator
 * model as one GPU, with the wrapper's events (dist.c). Its figures are
 * compared as "rankR.peak_alloc", "rankR.peak_reserved",
 * "rankR.device_used" and "rankR.after_model"; the file reader (the
 * validate command) compares the run's most loaded rank with the largest
 * measured one ("largest.*").
 *
 * Precision, as the scripts run it: DDP's mixed precision is autocast
 * (`autocast`, bf16 by default) over fp32 parameters; FSDP's is
 * MixedPrecision(Policy) with `param_dtype` (bf16 by default) and
 * `reduce_dtype` (FSDP1: param_dtype's; FSDP2: fp32) over fp32 shards.
 *
 * FSDP2 + TP (collect_tp_fake.py): `tp` and `dp` the degrees of the
 * ("dp", "tp") mesh (world = dp x tp, global rank = dp rank x tp + tp
 * rank), `sequence_parallel` (the norms' SequenceParallel; only true is
 * modelled) and `loss_parallel` (default true; false: torchtitan's
 * disable_loss_parallel). The line's rank is simulated as dist_tp.c's
 * tensor-parallel rank over FSDP2 of dp ranks (vp_tp_graph_build).
 *
 * FSDP2 + TP + PP (collect_pp_fake.py): `pp` stages more (world = pp x
 * dp x tp, torchtitan's mesh ("pp", "dp", "tp"): the stage is rank /
 * (dp x tp)), `stage` (checked against the rank), `schedule` ("1f1b"),
 * `microbatches` (the step's `batch` split into them: the setup's
 * micro-batch and accumulation), `stage_layers` (checked against
 * vp_tp_stage_layers). The rank is simulated as its stage's graph under
 * 1F1B (vp_tp_pipeline; FSDP2's nosync rules, dist_fsdp2.c). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_ds.h"
#include "validate_impl.h"
#include "vramplan/dist.h"
#include "vramplan/tp.h"

/* vp__dist_strategies' order */
static const vp_dist_strategy STRATEGY[] = {
    VP_DIST_DDP,       VP_DIST_DDP_BUCKET_VIEW, VP_DIST_FSDP_FULL,
    VP_DIST_FSDP_GRAD_OP, VP_DIST_DDP_ZERO1,    VP_DIST_FSDP2,
    VP_DIST_FSDP_HYBRID, VP_DIST_DS_ZERO1,      VP_DIST_DS_ZERO2,
    VP_DIST_DS_ZERO3};
/* vp__dist_precs' DeepSpeed names: the module in bf16 or fp16 */
enum { PREC_DS_BF16 = 3, PREC_DS_FP16 = 4 };
static const vp_mp_dtype DTYPE[] = {VP_MP_FP32, VP_MP_BF16, VP_MP_FP16};

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

/* The precision of a DDP line: autocast over fp32 parameters. */
static vp_status ddp_precision(const vp_case_in *in, vp_setup *s,
                               vp_error *err)
{
    if (in->param_dtype >= 0 || in->reduce_dtype >= 0)
        return at(in, in->param_dtype >= 0 ? "param_dtype" : "reduce_dtype",
                  VP_ESCHEMA, err, "'%s' is FSDP's MixedPrecision; DDP runs "
                  "mixed precision under autocast",
                  in->param_dtype >= 0 ? "param_dtype" : "reduce_dtype");
    if (in->autocast >= 0 && !in->mixed_precision)
        return at(in, "autocast", VP_ERANGE, err,
                  "autocast contradicts mixed_precision false");
    if (in->mixed_precision)
        s->precision = in->autocast == 1 ? VP_PREC_AMP_FP16
                                         : VP_PREC_AMP_BF16;
    return VP_OK;
}

/* The precision of a DeepSpeed line: the module built in fp32, then in
 * bf16 ("bf16": {"enabled": true}, the default of mixed_precision) or
 * fp16, no autocast; its zero_optimization knobs from `ds_config`
 * (vp_ds_config_json). */
static vp_status ds_line(const vp_case_in *in, vp_dist *d, vp_setup *s,
                         vp_error *err)
{
    if (in->autocast >= 0 || in->param_dtype >= 0 || in->reduce_dtype >= 0)
        return at(in, in->autocast >= 0      ? "autocast"
                      : in->param_dtype >= 0 ? "param_dtype"
                                             : "reduce_dtype",
                  VP_ESCHEMA, err, "DeepSpeed runs its module in bf16 or "
                  "fp16 ('prec'), not under autocast or FSDP's "
                  "MixedPrecision");
    if (in->prec > 0 && in->prec < PREC_DS_BF16)
        return at(in, "prec", VP_ESCHEMA, err,
                  "prec '%s' is not DeepSpeed's (fp32, bf16, fp16)",
                  vp__dist_precs[in->prec]);
    if (in->mixed_precision)
        s->precision = in->prec == PREC_DS_FP16 ? VP_PREC_FP16
                                                : VP_PREC_BF16;
    /* collect_deepspeed.py builds the model in fp32 (from_config) and the
     * engine casts it parameter by parameter (engine.py,
     * _cast_module_mixed_precision) */
    s->ft.load = VP_LOAD_FP32_CAST;
    if (in->ds_node < 0)
        return VP_OK;
    vp_status st = vp_ds_config_json(&d->ds, in->doc->nodes[in->ds_node].value,
                                     err);
    return st == VP_OK ? VP_OK : at(in, "ds_config", st, err, "%s", err->msg);
}

/* The precision of an FSDP line: MixedPrecision over fp32 shards. */
static vp_status fsdp_precision(const vp_case_in *in, vp_dist *d,
                                vp_error *err)
{
    if (in->autocast >= 0)
        return at(in, "autocast", VP_EUNSUPPORTED, err,
                  "autocast with FSDP is not modelled (FSDP's mixed "
                  "precision is param_dtype)");
    if (!in->mixed_precision) {
        if ((in->param_dtype >= 0 && in->param_dtype != 0) ||
            (in->reduce_dtype >= 0 && in->reduce_dtype != 0))
            return at(in, in->param_dtype > 0 ? "param_dtype"
                                              : "reduce_dtype",
                      VP_ERANGE, err, "a 16-bit dtype contradicts "
                      "mixed_precision false");
        return VP_OK;
    }
    d->param_dtype = in->param_dtype >= 0 ? DTYPE[in->param_dtype]
                                          : VP_MP_BF16;
    if (d->param_dtype == VP_MP_FP32)
        return at(in, "param_dtype", VP_ERANGE, err,
                  "param_dtype fp32 contradicts mixed_precision true");
    d->reduce_dtype = in->reduce_dtype >= 0 ? DTYPE[in->reduce_dtype]
                      : d->strategy == VP_DIST_FSDP2 ? VP_MP_FP32
                                                     : d->param_dtype;
    return VP_OK;
}

/* reshard_after_forward: fully_shard's bool or int; FSDP1's strategies
 * say it themselves. */
static vp_status reshard(const vp_case_in *in, vp_dist *d, vp_error *err)
{
    if (in->reshard_node < 0)
        return VP_OK;
    json_t *v = in->doc->nodes[in->reshard_node].value;
    bool fsdp1 = vp_dist_is_fsdp(d->strategy) && d->strategy != VP_DIST_FSDP2;
    if (fsdp1 && json_is_boolean(v)) {
        bool full = d->strategy == VP_DIST_FSDP_FULL ||
                    d->strategy == VP_DIST_FSDP_HYBRID;
        if (json_is_true(v) != full)
            return at(in, "reshard_after_forward", VP_ERANGE, err,
                      "reshard_after_forward %s contradicts strategy '%s'",
                      json_is_true(v) ? "true" : "false",
                      vp_dist_strategy_name(d->strategy));
        return VP_OK;
    }
    if (d->strategy != VP_DIST_FSDP2)
        return at(in, "reshard_after_forward", VP_ESCHEMA, err,
                  "reshard_after_forward is FSDP's");
    if (json_is_boolean(v)) {
        d->reshard_after_forward = json_is_true(v) ? 1 : 0;
        return VP_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 2 ||
        json_integer_value(v) > (json_int_t)VP_VALIDATE_MAX_WORLD)
        return at(in, "reshard_after_forward", VP_ESCHEMA, err,
                  "reshard_after_forward must be true, false or an integer "
                  "from 2 to %u", VP_VALIDATE_MAX_WORLD);
    d->reshard_after_forward = (int32_t)json_integer_value(v);
    return VP_OK;
}

/* A field of a pipeline line on a line without 'pp' of 2 or more;
 * NULL when there is none. */
static const char *pipe_field(const vp_case_in *in)
{
    return in->stage_node >= 0    ? "stage"
           : in->schedule >= 0    ? "schedule"
           : in->microbatches     ? "microbatches"
           : in->stage_layers     ? "stage_layers"
           : in->return_outputs   ? "return_outputs"
                                  : NULL;
}

/* The pipeline stage of an FSDP2 + TP + PP line (collect_pp_fake.py):
 * its stage from its rank (torchtitan's mesh ("pp", "dp", "tp"): rank =
 * stage x dp x tp + dp rank x tp + tp rank), checked against 'stage';
 * the step's batch split into 'microbatches' (Schedule1F1B needs at least
 * as many as the stages) is the setup's micro-batch and accumulation. */
static vp_status pipe_stage(const vp_case_in *in, uint64_t dp, uint64_t tp,
                            vp_tp_layout *l, vp_setup *s, vp_error *err)
{
    uint64_t stage = in->rank / (dp * tp), n = in->microbatches;
    uint64_t given = in->stage_node < 0 ? stage
                     : (uint64_t)json_integer_value(
                           in->doc->nodes[in->stage_node].value);
    if (given != stage)
        return at(in, "stage", VP_ERANGE, err, "stage %" PRIu64 " contradicts "
                  "rank %" PRIu64 " of dp %" PRIu64 " x tp %" PRIu64 " x pp %"
                  PRIu64 " (stage %" PRIu64 ")", given, in->rank, dp, tp,
                  in->pp, stage);
    if (in->accum)
        return at(in, "accum", VP_ESCHEMA, err, "a pipeline line's "
                  "micro-batches are 'microbatches', not 'accum'");
    if (n == 0)
        return at(in, "pp", VP_ESCHEMA, err, "a pipeline line needs "
                  "'microbatches' (the step's batch is split into them)");
    if (n < in->pp)
        return at(in, "microbatches", VP_ERANGE, err, "1F1B needs at least "
                  "as many micro-batches as stages (Schedule1F1B): %" PRIu64
                  " < %" PRIu64, n, in->pp);
    if (in->batch % n)
        return at(in, "microbatches", VP_ERANGE, err, "batch %" PRIu64
                  " is not split evenly into %" PRIu64 " micro-batches",
                  in->batch, n);
    /* forward_one_chunk(save_forward_output=return_outputs): the last
     * stage's output_chunks hold every micro-batch's output until the
     * next step, which the simulated stage does not keep */
    if (in->return_outputs && stage + 1 == in->pp)
        return at(in, "return_outputs", VP_EUNSUPPORTED, err, "the last "
                  "stage's outputs kept for the step's return (output_chunks"
                  ", step() without return_outputs=False) are not modelled");
    l->stage = (uint32_t)stage;
    s->batch = in->batch / n;
    s->accum = (uint32_t)n;
    return VP_OK;
}

/* The tensor- and pipeline-parallel layout of an FSDP2 + TP (+ PP) line
 * into *l (tp and pp 1 when the line has none); d->world becomes the
 * data-parallel degree and d->rank the rank's data-parallel index. */
static vp_status tp_layout(const vp_case_in *in, vp_dist *d, vp_tp_layout *l,
                           vp_setup *s, vp_error *err)
{
    *l = (vp_tp_layout){1, 1, 0, in->ckpt, false};
    const char *f = pipe_field(in);
    if (in->pp < 2 && f)
        return at(in, f, VP_ESCHEMA, err, "'%s' needs 'pp' (pipeline "
                  "stages, 2 or more)", f);
    if (!in->tp && !in->pp) {
        f = in->dp                ? "dp"
            : in->sp_node >= 0    ? "sequence_parallel"
            : in->lp_node >= 0    ? "loss_parallel"
                                  : NULL;
        return f ? at(in, f, VP_ESCHEMA, err, "'%s' needs 'tp' (FSDP2 + "
                      "tensor parallelism)", f)
                 : VP_OK;
    }
    if (!in->tp && (in->sp_node >= 0 || in->lp_node >= 0))
        return at(in, in->sp_node >= 0 ? "sequence_parallel"
                                       : "loss_parallel",
                  VP_ESCHEMA, err, "'%s' needs 'tp' (FSDP2 + tensor "
                  "parallelism)", in->sp_node >= 0 ? "sequence_parallel"
                                                   : "loss_parallel");
    if (d->strategy != VP_DIST_FSDP2)
        return at(in, in->tp ? "tp" : "pp", VP_ESCHEMA, err, "%s "
                  "parallelism composes with fsdp2 (torchtitan's "
                  "apply_fsdp), not '%s'", in->tp ? "tensor" : "pipeline",
                  vp_dist_strategy_name(d->strategy));
    if (in->mesh[0])
        return at(in, "mesh", VP_ESCHEMA, err, "an HSDP mesh with 'tp' or "
                  "'pp' is not modelled");
    /* each at most VP_VALIDATE_MAX_WORLD: the products fit */
    uint64_t tp = in->tp ? in->tp : 1, pp = in->pp ? in->pp : 1;
    uint64_t dp = in->dp ? in->dp : in->world / (tp * pp);
    if (in->world % (tp * pp) || dp * tp * pp != in->world) {
        char ppn[32] = "";
        if (in->pp)
            snprintf(ppn, sizeof ppn, " x pp %" PRIu64, pp);
        return at(in, in->dp ? "dp" : in->tp ? "tp" : "pp", VP_ERANGE, err,
                  "dp %" PRIu64 " x tp %" PRIu64 "%s is not the world of "
                  "%" PRIu64, dp, tp, ppn, in->world);
    }
    if (in->sp_node >= 0 && !json_is_true(in->doc->nodes[in->sp_node].value))
        return at(in, "sequence_parallel", VP_EUNSUPPORTED, err,
                  "tensor parallelism without sequence-parallel norms is "
                  "not modelled");
    l->tp = (uint32_t)tp;
    l->pp = (uint32_t)pp;
    l->disable_loss_parallel =
        in->lp_node >= 0 && !json_is_true(in->doc->nodes[in->lp_node].value);
    d->world = (uint32_t)dp;
    d->rank = (uint32_t)(in->rank % (dp * tp) / tp);
    return pp > 1 ? pipe_stage(in, dp, tp, l, s, err) : VP_OK;
}

/* The run the line describes, as a vp_dist (and the precision of s). */
static vp_status rank_run(const vp_case_in *in, vp_dist *d, vp_setup *s,
                          vp_error *err)
{
    vp_dist_init(d);
    d->strategy = STRATEGY[in->strategy];
    d->world = (uint32_t)in->world;
    d->rank = (uint32_t)in->rank;
    d->empty_cache_after_wrap = true; /* the scripts' G.cleanup()        */
    if (in->local_world > in->world)
        return at(in, "local_world", VP_ERANGE, err,
                  "local_world %" PRIu64 " is above the world size %" PRIu64,
                  in->local_world, in->world);
    if (in->rank >= in->world)
        return at(in, "rank", VP_ERANGE, err,
                  "rank %" PRIu64 " is not below the world size %" PRIu64,
                  in->rank, in->world);
    if ((in->fsdp_version == 2) != (d->strategy == VP_DIST_FSDP2) &&
        in->fsdp_version != 0)
        return at(in, "fsdp_version", VP_ERANGE, err,
                  "fsdp_version %" PRIu64 " contradicts strategy '%s'",
                  in->fsdp_version, vp_dist_strategy_name(d->strategy));
    if (in->mesh[0]) {
        if (in->mesh[0] * in->mesh[1] != in->world)
            return at(in, "mesh", VP_ERANGE, err,
                      "mesh %" PRIu64 " x %" PRIu64 " is not the world of "
                      "%" PRIu64, in->mesh[0], in->mesh[1], in->world);
        if (d->strategy != VP_DIST_FSDP2 &&
            d->strategy != VP_DIST_FSDP_HYBRID)
            return at(in, "mesh", VP_ESCHEMA, err,
                      "a 2-D mesh is HSDP's (fsdp-hybrid, fsdp2)");
        d->shard = (uint32_t)in->mesh[1];
    } else if (d->strategy == VP_DIST_FSDP_HYBRID) {
        return at(in, "strategy", VP_ESCHEMA, err,
                  "fsdp-hybrid needs its 'mesh' [replicate, shard]");
    }
    if (in->prec >= 0 && (in->prec != 0) != in->mixed_precision)
        return at(in, "prec", VP_ERANGE, err,
                  "prec '%s' contradicts mixed_precision",
                  vp__dist_precs[in->prec]);
    if (in->ds_node >= 0 && !vp_dist_is_deepspeed(d->strategy))
        return at(in, "ds_config", VP_ESCHEMA, err,
                  "ds_config is DeepSpeed's (deepspeed-zero1/2/3)");
    if (vp_dist_is_deepspeed(d->strategy))
        return ds_line(in, d, s, err);
    if (in->prec >= PREC_DS_BF16)
        return at(in, "prec", VP_ESCHEMA, err,
                  "prec '%s' is DeepSpeed's", vp__dist_precs[in->prec]);
    vp_status st = vp_dist_is_fsdp(d->strategy)
                       ? fsdp_precision(in, d, err)
                       : ddp_precision(in, s, err);
    return st == VP_OK ? reshard(in, d, err) : st;
}

static void rank_metric(vp_case_result *r, uint64_t rank, const char *what,
                        uint64_t pred, uint64_t meas)
{
    char name[32];

    if (meas == 0)
        return;
    snprintf(name, sizeof name, "rank%" PRIu64 ".%s", rank, what);
    vp__case_metric(r, name, pred, meas);
}

/* The phase peaks of each step: "rankR.stepN.fwd_peak", ... */
static void step_metrics(const vp_case_in *in, const vp_estimate *e,
                         vp_case_result *out)
{
    static const char *const names[] = {"fwd_peak", "bwd_peak", "opt_peak"};
    static const vp_phase ph[] = {VP_PHASE_FORWARD, VP_PHASE_BACKWARD,
                                  VP_PHASE_OPTIMIZER};
    char what[24];

    for (uint32_t k = 0; k < in->n_steps && k < e->steps; k++) {
        const uint64_t meas[] = {in->step[k].fwd_peak, in->step[k].bwd_peak,
                                 in->step[k].opt_peak};
        for (size_t q = 0; q < 3; q++) {
            snprintf(what, sizeof what, "step%" PRIu32 ".%s", k + 1,
                     names[q]);
            rank_metric(out, in->rank, what, e->step[k].peak[ph[q]],
                        meas[q]);
        }
    }
}

/* The setup of the line's steps, from o->base. */
static vp_setup rank_setup(const vp_case_in *in, const vp_validate_opts *o)
{
    vp_setup s;

    if (o->base != NULL)
        s = *o->base;
    else
        vp_setup_init(&s);
    /* the scripts' warm-up made the cuBLAS workspaces of both threads */
    s.fresh_process = false;
    if (o->context_bytes)
        s.context_bytes = o->context_bytes;
    if (in->opt >= 0) {
        static const vp_optimizer OPT[] = {VP_OPT_ADAMW, VP_OPT_ADAMW_FUSED,
                                           VP_OPT_ADAMW_FORLOOP, VP_OPT_SGD,
                                           VP_OPT_ADAFACTOR};
        s.optimizer = OPT[in->opt];
    }
    if (in->attn >= 0) {
        s.attn = (vp_attn_impl)in->attn;
        s.attn_set = true;
    }
    s.inference = in->infer;
    s.accum = in->accum ? (uint32_t)in->accum : 1;
    s.batch = in->batch;
    s.seq = in->seq;
    if (in->n_steps > 0)
        s.steps = in->n_steps;
    return s;
}

static vp_status simulate(const vp_case_in *in, vp_model *m,
                          const vp_tp_layout *l, vp_setup *s, vp_estimate *e,
                          vp_error *err)
{
    vp_graph *g = l->tp > 1 || l->pp > 1
                      ? vp_tp_graph_build(m, l, s->batch, s->seq, err)
                      : vp_graph_build(m, s->batch, s->seq, err);
    if (g == NULL)
        return err != NULL ? err->code : VP_ESCHEMA;
    vp_pipeline pl; /* a stage: its 1F1B (sim_pipe.c) */
    vp_tp_pipeline(l, &pl);
    s->pipe = l->pp > 1 ? &pl : NULL;
    size_t ns = vp_graph_segment_count(g);
    bool *ck = calloc(ns ? ns : 1, sizeof *ck);
    vp_status st = VP_OK;
    if (ck == NULL)
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
    /* HF's gradient_checkpointing_enable: every decoder layer, as
     * torchtitan's apply_ac "full" (vp_tp_checkpoint's) */
    if (st == VP_OK && in->ckpt)
        vp_graph_default_checkpoint(g, ck);
    s->checkpoint = ck;
    s->n_checkpoint = ns;
    if (st == VP_OK)
        st = vp_simulate(g, s, e, NULL, NULL, err);
    free(ck);
    vp_graph_free(g);
    s->pipe = NULL;
    return st;
}

/* 'stage_layers', the layers the script built for the stage, against
 * torchtitan's split that the simulation takes (vp_tp_stage_layers). */
static vp_status check_stage_layers(const vp_case_in *in, const vp_model *m,
                                    const vp_tp_layout *l, vp_error *err)
{
    if (!in->stage_layers || m->form != 0)
        return VP_OK;
    uint32_t n = vp_tp_stage_layers(m->tf.layers, l->pp, l->stage);
    if (in->stage_layers != n)
        return at(in, "stage_layers", VP_ERANGE, err, "stage_layers %" PRIu64
                  " is not stage %" PRIu32 "'s share of %" PRIu32 " stages "
                  "(%" PRIu32 " of %" PRIu64 " layers, torchtitan's "
                  "generate_llm_fqn_per_model_part)", in->stage_layers,
                  l->stage, l->pp, n, m->tf.layers);
    return VP_OK;
}

vp_status vp__validate_rank(const vp_case_in *in, const vp_validate_opts *o,
                            vp_case_result *out, vp_error *err)
{
    vp_setup s = rank_setup(in, o);
    vp_dist d;
    vp_tp_layout l;
    vp_estimate e;

    if (in->infer)
        return at(in, "infer", VP_EUNSUPPORTED, err,
                  "multi-GPU inference is not modelled");
    vp_status st = rank_run(in, &d, &s, err);
    if (st == VP_OK)
        st = tp_layout(in, &d, &l, &s, err);
    if (st != VP_OK)
        return st;
    s.dist = &d;
    vp_model *m = vp__case_find_model(in, o->dirs, o->n_dirs, o->path, err);
    if (m == NULL)
        return err != NULL ? err->code : VP_EIO;
    if (in->attn >= 0 && m->form == 0)
        m->tf.attn = (vp_attn_impl)in->attn;
    st = check_stage_layers(in, m, &l, err);
    if (st == VP_OK)
        st = simulate(in, m, &l, &s, &e, err);
    if (st == VP_OK) {
        /* the scripts reset the peaks after building the wrapper, and
         * before each phase: the steps' phase peaks, and the reserved
         * bytes at the end of a step (they never fall) */
        uint64_t pa = 0, pr = 0;
        for (uint32_t k = 0; k < e.steps; k++) {
            for (int ph = VP_PHASE_FORWARD; ph < VP_PHASE__COUNT; ph++)
                pa = e.step[k].peak[ph] > pa ? e.step[k].peak[ph] : pa;
            pr = e.step[k].reserved > pr ? e.step[k].reserved : pr;
        }
        rank_metric(out, in->rank, "peak_alloc", pa, in->peak_alloc);
        rank_metric(out, in->rank, "peak_reserved", pr, in->peak_reserved);
        /* the fake process group shares the GPU with other processes:
         * the device's use is not this rank's */
        if (in->pg != 1)
            rank_metric(out, in->rank, "device_used",
                        pr + s.context_bytes, in->device_used);
        rank_metric(out, in->rank, "after_model", e.after_model,
                    in->after_model);
        step_metrics(in, &e, out);
    }
    vp_model_free(m);
    return st;
}
