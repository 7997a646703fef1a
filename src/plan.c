/* Planning one GPU: precision x optimizer x checkpointing x micro-batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

const char *vp_ckpt_mode_name(vp_ckpt_mode c)
{
    switch (c) {
    case VP_CKPT_NONE:
        return "none";
    case VP_CKPT_ALL:
        return "all";
    case VP_CKPT_AUTO:
        return "auto";
    }
    return "?";
}

/* Largest divisor of g that is <= m (>= 1 when m >= 1). */
static uint64_t divisor_at_most(uint64_t g, uint64_t m)
{
    if (m >= g)
        return g;
    for (uint64_t d = m; d >= 1; d--)
        if (g % d == 0)
            return d;
    return 0;
}

typedef struct {
    const vp_model *m;
    const vp_plan_request *req;
    vp_plan_result *out;
    vp_error *err;
} pctx;

/* Simulate a candidate at its micro-batch and accumulation, with its
 * checkpoint mask, and time it. */
static vp_status evaluate(pctx *c, vp_plan_candidate *k, const char *spec)
{
    vp_graph *g = vp_graph_build_target(c->m, k->micro_batch,
                                        c->req->base.seq,
                                        c->req->base.target, c->err);
    if (!g)
        return c->err ? c->err->code : VP_ESCHEMA;
    if (vp__graph_search_check(g, c->err) != VP_OK) {
        vp_graph_free(g);
        return VP_ELIMIT;
    }
    size_t ns = vp_graph_segment_count(g);
    bool *mask = calloc(ns ? ns : 1, sizeof *mask);
    vp_status st = VP_OK;
    if (!mask) {
        st = vp_error_set(c->err, VP_ENOMEM, "out of memory");
        goto done;
    }
    vp_setup s = c->req->base;
    s.skip_breakdown = true;
    s.batch = k->micro_batch;
    s.accum = k->accum;
    s.precision = k->precision;
    s.optimizer = k->optimizer;
    s.offload_optimizer = k->offload;
    s.steps = VP_STEADY_STEPS;
    if (k->ckpt == VP_CKPT_AUTO) {
        vp_ckpt_plan cp;
        st = vp_checkpoint_auto(c->m, &s, mask, ns, &cp, c->err);
        c->out->simulations += cp.simulations;
        if (st == VP_EOOM) {
            vp_error_clear(c->err);
            k->fits = false;
            snprintf(k->reason, sizeof k->reason,
                     "does not fit at micro-batch %llu even with every "
                     "layer checkpointed",
                     (unsigned long long)k->micro_batch);
            st = VP_OK;
            goto done;
        }
        if (st != VP_OK)
            goto done;
    } else if ((st = vp_graph_checkpoint_select(g, spec, mask, c->err)) !=
               VP_OK) {
        goto done;
    }
    for (size_t i = 0; i < ns; i++)
        k->n_checkpointed += mask[i];
    k->n_segments = ns;
    s.checkpoint = mask;
    s.n_checkpoint = ns;
    vp_estimate e;
    c->out->simulations++;
    st = vp_simulate(g, &s, &e, NULL, NULL, c->err);
    if (st == VP_EOOM) {
        vp_error_clear(c->err);
        k->fits = false;
        snprintf(k->reason, sizeof k->reason,
                 "micro-batch %llu with %u accumulation steps does not fit",
                 (unsigned long long)k->micro_batch, k->accum);
        st = VP_OK;
        goto done;
    }
    if (st != VP_OK)
        goto done;
    k->fits = true;
    k->peak_alloc = e.peak_alloc;
    k->peak_reserved = e.peak_reserved;
    k->device_used = e.device_used;
    st = vp_step_time_estimate(g, &s, &c->req->hw, &k->time, c->err);
    if (st == VP_OK && k->time.total > 0)
        k->samples_per_s = (double)c->req->global_batch / k->time.total;
done:
    free(mask);
    vp_graph_free(g);
    return st;
}

static int cand_cmp(const void *a, const void *b)
{
    const vp_plan_candidate *x = a, *y = b;
    if (x->fits != y->fits)
        return x->fits ? -1 : 1;
    if (!x->fits)
        return 0;
    return (x->time.total > y->time.total) - (x->time.total < y->time.total);
}

/* Why k lost to best: the part of the step time that grew most. */
static void explain(vp_plan_candidate *k, const vp_plan_candidate *best,
                    const vp_hw *hw)
{
    double pct = 100.0 * (k->time.total / best->time.total - 1.0);
    double d_fb = (k->time.forward + k->time.backward) -
                  (best->time.forward + best->time.backward);
    double d_rc = k->time.recompute - best->time.recompute;
    double d_opt = k->time.optimizer - best->time.optimizer;
    const char *why;
    /* recomputation's memory traffic is timed with the backward */
    if (k->n_checkpointed > best->n_checkpointed && d_fb + d_rc > d_opt)
        why = "recomputes more checkpointed layers";
    else if (d_rc >= d_fb && d_rc >= d_opt && d_rc > 0)
        why = "recomputes checkpointed layers";
    else if (k->offload && k->time.offload > d_fb)
        why = "optimizer offload: the host link and CPU Adam";
    else if (d_opt >= d_fb && d_opt > 0)
        why = "slower optimizer step";
    else if (vp_hw_matmul_rate(hw, k->precision) <
             vp_hw_matmul_rate(hw, best->precision))
        why = "lower matmul rate of its precision";
    else if (k->precision != best->precision)
        why = "autocast casts and wider activations: more memory traffic";
    else if (k->accum > best->accum)
        why = "smaller micro-batches, more accumulation steps";
    else
        why = "more memory traffic";
    snprintf(k->reason, sizeof k->reason, "%.1f%% slower: %s", pct, why);
}

vp_status vp_plan_single(const vp_model *m, const vp_plan_request *req,
                         vp_plan_result *out, vp_error *err)
{
    memset(out, 0, sizeof *out);
    vp_error_clear(err);
    if (req->base.alloc.limit == 0)
        return vp_error_set(err, VP_EARG, "planning needs a memory budget");
    if (req->global_batch == 0)
        return vp_error_set(err, VP_EARG, "the global batch must be >= 1");
    bool prec[VP_PREC__COUNT], opt[VP_OPT__COUNT];
    bool anyp = false, anyo = false;
    for (int i = 0; i < VP_PREC__COUNT; i++)
        anyp |= req->precisions[i];
    for (int i = 0; i < VP_OPT__COUNT; i++)
        anyo |= req->optimizers[i];
    for (int i = 0; i < VP_PREC__COUNT; i++)
        prec[i] = anyp ? req->precisions[i]
                       : vp_hw_matmul_rate(&req->hw, (vp_precision)i) > 0 &&
                             i != VP_PREC_FP16 &&
                             (i != VP_PREC_AMP_FP16 || req->hw.bf16 <= 0);
    /* a base dtype the user gave narrows the precisions */
    for (int i = 0; i < VP_PREC__COUNT; i++)
        prec[i] = prec[i] && vp__base_dtype_fits((int)req->base.ft.base_dtype, i);
    for (int i = 0; i < VP_OPT__COUNT; i++)
        opt[i] = anyo ? req->optimizers[i]
                      : i == VP_OPT_ADAMW || i == VP_OPT_ADAMW_FUSED ||
                            i == VP_OPT_ADAMW_8BIT;
    pctx c = {m, req, out, err};
    uint64_t G = req->global_batch;
    for (int p = 0; p < VP_PREC__COUNT; p++) {
        if (!prec[p])
            continue;
        for (int o = 0; o < VP_OPT__COUNT; o++) {
            if (!opt[o])
                continue;
            bool reach_all = false;
            for (int off = 0; off <= 1; off++) {
            if (off && reach_all)
                break; /* offloading cannot beat a setup that fits whole */
            /* with the state on the host the GPU-side AdamW variant does
             * not matter: offload is tried with the first allowed one */
            bool first_opt = true;
            for (int q = 0; q < o; q++)
                if (opt[q])
                    first_opt = false;
            if (off && !first_opt)
                break;
            uint64_t fit_none = 0, fit_all = 0;
            for (int ck = VP_CKPT_NONE; ck <= VP_CKPT_AUTO; ck++) {
                if (out->n >= VP_PLAN_MAX)
                    break;
                vp_plan_candidate *k = &out->cand[out->n];
                memset(k, 0, sizeof *k);
                k->precision = (vp_precision)p;
                k->optimizer = (vp_optimizer)o;
                k->ckpt = (vp_ckpt_mode)ck;
                k->offload = off;
                uint64_t fit;
                const char *spec = ck == VP_CKPT_ALL ? "all" : NULL;
                if (ck == VP_CKPT_AUTO) {
                    /* worth it only where "all" reaches a larger
                     * micro-batch than "none" */
                    if (fit_all <= fit_none)
                        continue;
                    fit = fit_all;
                } else {
                    vp_setup s = req->base;
                    s.precision = k->precision;
                    s.optimizer = k->optimizer;
                    s.offload_optimizer = k->offload;
                    s.steps = VP_STEADY_STEPS;
                    vp_maxbatch_result mb;
                    vp_status st = vp_maxbatch(m, &s, spec, G, &mb, err);
                    out->simulations += mb.trials;
                    if (st != VP_OK)
                        return st;
                    fit = mb.max_batch;
                    if (ck == VP_CKPT_NONE)
                        fit_none = fit;
                    else
                        fit_all = fit;
                    if (!off && ck == VP_CKPT_NONE && fit >= G)
                        reach_all = true;
                }
                out->n++;
                if (fit == 0) {
                    k->fits = false;
                    snprintf(k->reason, sizeof k->reason,
                             "does not fit: batch 1 needs more than the "
                             "budget");
                    continue;
                }
                /* accumulation keeps the gradients of the first
                 * micro-batches through the next forward: when the split
                 * does not fit, try the next smaller divisor */
                uint64_t mbs = divisor_at_most(G, fit);
                for (int tries = 0; mbs >= 1 && tries < 8; tries++) {
                    vp_plan_candidate save = *k;
                    k->micro_batch = mbs;
                    k->accum = (uint32_t)(G / mbs);
                    vp_status st = evaluate(&c, k, spec);
                    if (st != VP_OK)
                        return st;
                    if (k->fits || mbs == 1)
                        break;
                    uint64_t next = divisor_at_most(G, mbs - 1);
                    *k = save;
                    k->micro_batch = mbs;
                    k->accum = (uint32_t)(G / mbs);
                    snprintf(k->reason, sizeof k->reason,
                             "micro-batch %llu with %u accumulation steps "
                             "does not fit",
                             (unsigned long long)mbs, k->accum);
                    mbs = next;
                }
            }
            }
        }
    }
    qsort(out->cand, out->n, sizeof out->cand[0], cand_cmp);
    if (out->n && out->cand[0].fits) {
        out->cand[0].reason[0] = '\0';
        for (size_t i = 1; i < out->n; i++)
            if (out->cand[i].fits)
                explain(&out->cand[i], &out->cand[0], &req->hw);
    }
    return VP_OK;
}
