/* Searches on one GPU: the largest batch under a budget, and the
 * checkpoint placement that fits with the least recomputation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

vp_status vp_fits(const vp_model *m, const vp_setup *setup, uint64_t batch,
                  const char *ckpt, bool *fits, vp_estimate *est,
                  vp_error *err)
{
    *fits = false;
    vp_graph *g = vp_graph_build_target(m, batch, setup->seq, setup->target,
                                        err);
    if (!g) {
        if (err && err->code == VP_EOVERFLOW) {
            vp_error_clear(err);
            return VP_OK; /* too large to even describe: does not fit */
        }
        return err ? err->code : VP_ESCHEMA;
    }
    size_t ns = vp_graph_segment_count(g);
    bool *mask = calloc(ns ? ns : 1, sizeof *mask);
    if (!mask) {
        vp_graph_free(g);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    vp_status st = vp_graph_checkpoint_select(g, ckpt, mask, err);
    if (st == VP_OK) {
        vp_setup s = *setup;
        s.batch = batch;
        s.skip_breakdown = true;
        s.checkpoint = mask;
        s.n_checkpoint = ns;
        vp_estimate local;
        st = vp_simulate(g, &s, est ? est : &local, NULL, NULL, err);
        if (st == VP_OK) {
            *fits = true;
        } else if (st == VP_EOOM || st == VP_EOVERFLOW) {
            vp_error_clear(err);
            st = VP_OK;
        }
    }
    free(mask);
    vp_graph_free(g);
    return st;
}

/* Whether a batch fits, and its peak allocated bytes without a limit
 * (0 when it overflows). A run whose reserved bytes never pass the limit
 * is the same run under the limit, so it fits; only a run that passes it
 * needs the limited simulation (where freeing cached segments and retrying
 * may still let it fit). */
static vp_status probe(const vp_model *m, const vp_setup *setup,
                       uint64_t batch, const char *ckpt, uint64_t limit,
                       bool *fits, uint64_t *reserved, uint32_t *trials,
                       vp_estimate *best, uint64_t *best_batch,
                       vp_error *err)
{
    vp_setup s = *setup;
    s.alloc.limit = 0;
    s.alloc.device_total = 0;
    vp_estimate e;
    bool ok;
    vp_status st = vp_fits(m, &s, batch, ckpt, &ok, &e, err);
    (*trials)++;
    if (st != VP_OK)
        return st;
    /* the prediction follows the allocated peak: under a limit the
     * allocator frees cached segments before it fails, so reserved
     * bytes end close to allocated ones */
    *reserved = ok ? e.peak_alloc : 0;


    if (ok && e.peak_reserved <= limit) {
        *fits = true;
        if (batch > *best_batch) { /* the same run as under the limit */
            *best = e;
            *best_batch = batch;
        }
        return VP_OK;
    }
    if (!ok) { /* overflowed: too large by far */
        *fits = false;
        return VP_OK;
    }
    (*trials)++;
    return vp_fits(m, setup, batch, ckpt, fits, NULL, err);
}

vp_status vp_maxbatch(const vp_model *m, const vp_setup *setup,
                      const char *ckpt, uint64_t cap,
                      vp_maxbatch_result *out, vp_error *err)
{
    memset(out, 0, sizeof *out);
    vp_error_clear(err);
    if (setup->alloc.limit == 0 && setup->alloc.device_total == 0)
        return vp_error_set(err, VP_EARG,
                            "a memory budget is needed for a max-batch "
                            "search");
    if (cap == 0)
        cap = (uint64_t)1 << 40;
    uint64_t limit = setup->alloc.limit ? setup->alloc.limit
                                        : setup->alloc.device_total;
    bool ok;
    vp_status st;
    uint64_t r1, r;
    vp_estimate best;
    uint64_t best_batch = 0;
    if ((st = probe(m, setup, 1, ckpt, limit, &ok, &r1, &out->trials,
                    &best, &best_batch, err)) != VP_OK)
        return st;
    if (!ok)
        return VP_OK; /* batch 1 does not fit */
    /* Memory grows about linearly with the batch: secant steps through
     * (1, r1) predict the answer, which is then bracketed and bisected. */
    uint64_t lo = 1, hi = cap + 1; /* lo fits; hi does not (or past cap) */
    uint64_t xa = 1, ra = r1;      /* the secant's anchor                */
    uint64_t guess = 2;
    for (int it = 0; it < 8 && hi - lo > 1; it++) {
        if (guess <= lo)
            guess = lo + 1;
        if (guess >= hi)
            guess = lo + (hi - lo) / 2;
        if ((st = probe(m, setup, guess, ckpt, limit, &ok, &r, &out->trials,
                        &best, &best_batch, err)) != VP_OK)
            return st;
        if (ok)
            lo = guess;
        else
            hi = guess;
        if (!ok && lo > 1 && hi - lo <= (lo / 4 > 16 ? lo / 4 : 16))
            break; /* tightly bracketed: bisect from here */
        if (!ok && !r) {
            /* so large it overflows: come back geometrically */
            guess = lo > (UINT64_MAX >> 3) ? hi - 1 : lo * 8;
            continue;
        }
        double slope = guess == xa || !r
                           ? 0.0
                           : ((double)r - (double)ra) /
                                 ((double)guess - (double)xa);
        if (!(slope > 0.0)) {
            /* fixed costs still dominate: move on geometrically */
            guess = ok ? 2 * guess : guess;
            continue;
        }
        double next = (double)guess + ((double)limit - (double)r) / slope;
        xa = guess;
        ra = r;
        if (!(next >= 1.0) || next > (double)cap)
            next = (double)cap;
        guess = (uint64_t)next;
        /* step just past the prediction so that it gets bracketed */
        if (ok && guess <= lo)
            guess = lo + 1;
        if (!ok && guess >= hi)
            guess = hi - 1;
    }
    /* gallop from lo until a failure bounds it (when hi is still open) */
    uint64_t step = lo / 32 > 1 ? lo / 32 : 1;
    while (hi > cap && lo < cap) {
        uint64_t b = cap - lo > step ? lo + step : cap;
        if ((st = probe(m, setup, b, ckpt, limit, &ok, &r, &out->trials,
                        &best, &best_batch, err)) != VP_OK)
            return st;
        if (ok)
            lo = b;
        else
            hi = b;
        step *= 2;
    }
    /* bisect what is left */
    while (hi > lo + 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if ((st = probe(m, setup, mid, ckpt, limit, &ok, &r, &out->trials,
                        &best, &best_batch, err)) != VP_OK)
            return st;
        if (ok)
            lo = mid;
        else
            hi = mid;
    }
    out->max_batch = lo;
    if (best_batch == lo) {
        out->at_max = best;
        return VP_OK;
    }
    return vp_fits(m, setup, lo, ckpt, &ok, &out->at_max, err);
}

vp_status vp_maxbatch_doubling(const vp_model *m, const vp_setup *setup,
                               const char *ckpt, uint64_t cap,
                               vp_maxbatch_result *out, vp_error *err)
{
    memset(out, 0, sizeof *out);
    vp_error_clear(err);
    if (setup->alloc.limit == 0 && setup->alloc.device_total == 0)
        return vp_error_set(err, VP_EARG,
                            "a memory budget is needed for a max-batch "
                            "search");
    if (cap == 0)
        cap = (uint64_t)1 << 40;
    uint64_t lo = 0, hi = 1;
    bool ok;
    vp_status st;
    for (;;) {
        st = vp_fits(m, setup, hi, ckpt, &ok, NULL, err);
        out->trials++;
        if (st != VP_OK)
            return st;
        if (!ok)
            break;
        lo = hi;
        if (hi > UINT64_MAX / 2)
            break;
        hi *= 2;
        if (hi > cap)
            break; /* untested: the bisection treats it as too large */
    }
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        st = vp_fits(m, setup, mid, ckpt, &ok, NULL, err);
        out->trials++;
        if (st != VP_OK)
            return st;
        if (ok)
            lo = mid;
        else
            hi = mid;
    }
    out->max_batch = lo;
    if (lo)
        return vp_fits(m, setup, lo, ckpt, &ok, &out->at_max, err);
    return VP_OK;
}

#define KNAPSACK_MAX_CELLS ((uint64_t)1 << 24)

vp_status vp_knapsack_cover(const uint64_t *save, const double *cost,
                            size_t n, uint64_t need, uint64_t unit,
                            bool *choose, double *total, bool *feasible,
                            vp_error *err)
{
    for (size_t i = 0; i < n; i++)
        choose[i] = false;
    *total = 0.0;
    *feasible = true;
    if (need == 0)
        return VP_OK;
    if (unit == 0)
        return vp_error_set(err, VP_EARG, "knapsack unit must be > 0");
    uint64_t K = need / unit + (need % unit != 0); /* units to cover */
    uint64_t cells;
    if (!vp_mul_u64(K + 1, n + 1, &cells) || cells > KNAPSACK_MAX_CELLS)
        return vp_error_set(err, VP_ELIMIT,
                            "checkpoint search too large (%zu units x %llu "
                            "steps)",
                            n, (unsigned long long)K);
    /* dp[i][j]: least cost using items < i to save >= j units (capped) */
    double *dp = malloc(cells * sizeof *dp);
    uint32_t *cnt = malloc(cells * sizeof *cnt);
    if (!dp || !cnt) {
        free(dp);
        free(cnt);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
#define AT(i, j) ((size_t)(i) * (size_t)(K + 1) + (size_t)(j))
    for (uint64_t j = 0; j <= K; j++) {
        dp[AT(0, j)] = j == 0 ? 0.0 : INFINITY;
        cnt[AT(0, j)] = 0;
    }
    for (size_t i = 1; i <= n; i++) {
        uint64_t w = save[i - 1] / unit;
        for (uint64_t j = 0; j <= K; j++) {
            double skip = dp[AT(i - 1, j)];
            uint32_t skip_n = cnt[AT(i - 1, j)];
            uint64_t from = j > w ? j - w : 0;
            double take = dp[AT(i - 1, from)] + cost[i - 1];
            uint32_t take_n = cnt[AT(i - 1, from)] + 1;
            bool t = take < skip || (take == skip && take_n < skip_n);
            dp[AT(i, j)] = t ? take : skip;
            cnt[AT(i, j)] = t ? take_n : skip_n;
        }
    }
    if (isinf(dp[AT(n, K)])) {
        *feasible = false;
    } else {
        *total = dp[AT(n, K)];
        uint64_t j = K;
        for (size_t i = n; i > 0; i--) {
            if (dp[AT(i, j)] != dp[AT(i - 1, j)] ||
                cnt[AT(i, j)] != cnt[AT(i - 1, j)]) {
                choose[i - 1] = true;
                uint64_t w = save[i - 1] / unit;
                j = j > w ? j - w : 0;
            }
        }
    }
#undef AT
    free(dp);
    free(cnt);
    return VP_OK;
}

vp_status vp_knapsack_cover2(const uint64_t *save_a, const double *cost_a,
                             const uint64_t *save_b, const double *cost_b,
                             size_t n, uint64_t need, uint64_t unit,
                             uint8_t *choice, double *total, bool *feasible,
                             vp_error *err)
{
    for (size_t i = 0; i < n; i++)
        choice[i] = 0;
    *total = 0.0;
    *feasible = true;
    if (need == 0)
        return VP_OK;
    if (unit == 0)
        return vp_error_set(err, VP_EARG, "knapsack unit must be > 0");
    uint64_t K = need / unit + (need % unit != 0);
    uint64_t cells;
    if (!vp_mul_u64(K + 1, n + 1, &cells) || cells > KNAPSACK_MAX_CELLS)
        return vp_error_set(err, VP_ELIMIT,
                            "checkpoint search too large (%zu units x %llu "
                            "steps)",
                            n, (unsigned long long)K);
    double *dp = malloc(cells * sizeof *dp);
    uint8_t *pick = malloc(cells);
    if (!dp || !pick) {
        free(dp);
        free(pick);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
#define AT(i, j) ((size_t)(i) * (size_t)(K + 1) + (size_t)(j))
    for (uint64_t j = 0; j <= K; j++) {
        dp[AT(0, j)] = j == 0 ? 0.0 : INFINITY;
        pick[AT(0, j)] = 0;
    }
    for (size_t i = 1; i <= n; i++) {
        uint64_t wa = save_a[i - 1] / unit, wb = save_b[i - 1] / unit;
        for (uint64_t j = 0; j <= K; j++) {
            double best = dp[AT(i - 1, j)];
            uint8_t c = 0;
            double ta = dp[AT(i - 1, j > wa ? j - wa : 0)] + cost_a[i - 1];
            if (ta < best) {
                best = ta;
                c = 1;
            }
            double tb = dp[AT(i - 1, j > wb ? j - wb : 0)] + cost_b[i - 1];
            if (tb < best) {
                best = tb;
                c = 2;
            }
            dp[AT(i, j)] = best;
            pick[AT(i, j)] = c;
        }
    }
    if (isinf(dp[AT(n, K)])) {
        *feasible = false;
    } else {
        *total = dp[AT(n, K)];
        uint64_t j = K;
        for (size_t i = n; i > 0; i--) {
            uint8_t c = pick[AT(i, j)];
            choice[i - 1] = c;
            uint64_t w = c == 1 ? save_a[i - 1] / unit
                         : c == 2 ? save_b[i - 1] / unit
                                  : 0;
            j = j > w ? j - w : 0;
        }
    }
#undef AT
    free(dp);
    free(pick);
    return VP_OK;
}

/* ---- checkpoint placement ------------------------------------------------ */

typedef struct {
    const vp_graph *g;
    vp_setup s;
    uint32_t sims;
    vp_error *err;
} ck_ctx;

static vp_status sim_mask(ck_ctx *c, const bool *mask, const bool *sel,
                          bool limited, vp_estimate *e, bool *fits)
{
    vp_setup s = c->s;
    s.skip_breakdown = true;
    s.checkpoint = mask;
    s.n_checkpoint = vp_graph_segment_count(c->g);
    s.selective = sel;
    s.n_selective = sel ? s.n_checkpoint : 0;
    if (!limited) {
        s.alloc.limit = 0;
        s.alloc.device_total = 0;
    }
    c->sims++;
    vp_status st = vp_simulate(c->g, &s, e, NULL, NULL, c->err);
    *fits = st == VP_OK;
    if (st == VP_EOOM) {
        vp_error_clear(c->err);
        return VP_OK;
    }
    return st;
}

/* Segments with the same op kinds, sizes and FLOPs behave the same: they
 * share one measurement. */
static bool same_segment(const vp_graph *g, const vp_segment *a,
                         const vp_segment *b)
{
    if (a->last_op - a->first_op != b->last_op - b->first_op)
        return false;
    for (uint32_t k = 0; k <= a->last_op - a->first_op; k++) {
        const vp_op *x = &g->ops[a->first_op + k];
        const vp_op *y = &g->ops[b->first_op + k];
        if (x->kind != y->kind || x->numel != y->numel ||
            x->flops_fwd != y->flops_fwd)
            return false;
    }
    return true;
}

vp_status vp_checkpoint_auto(const vp_model *m, const vp_setup *setup,
                             bool *out_mask, size_t n_mask,
                             vp_ckpt_plan *plan, vp_error *err)
{
    return vp_checkpoint_auto_sel(m, setup, out_mask, NULL, n_mask, plan,
                                  err);
}

vp_status vp_checkpoint_auto_sel(const vp_model *m, const vp_setup *setup,
                                 bool *out_mask, bool *out_sel, size_t n_mask,
                                 vp_ckpt_plan *plan, vp_error *err)
{
    memset(plan, 0, sizeof *plan);
    vp_error_clear(err);
    if (setup->alloc.limit == 0)
        return vp_error_set(err, VP_EARG,
                            "--checkpoint auto needs a memory budget");
    vp_graph *g = vp_graph_build_target(m, setup->batch, setup->seq,
                                        setup->target, err);
    if (!g)
        return err ? err->code : VP_ESCHEMA;
    size_t n = vp_graph_segment_count(g);
    vp_status st = VP_OK;
    uint64_t *save = NULL, *save_s = NULL;
    double *cost = NULL, *cost_s = NULL;
    bool *mask = NULL, *one = NULL, *sel = NULL;
    uint8_t *choice = NULL;
    int32_t *rep = NULL;
    if (n == 0) {
        st = vp_error_set(err, VP_EARG,
                          "the model has no checkpoint units");
        goto done;
    }
    if (n_mask < n) {
        st = vp_error_set(err, VP_EARG, "checkpoint mask too short");
        goto done;
    }
    save = calloc(n, sizeof *save);
    cost = calloc(n, sizeof *cost);
    mask = calloc(n, sizeof *mask);
    one = calloc(n, sizeof *one);
    rep = calloc(n, sizeof *rep);
    save_s = calloc(n, sizeof *save_s);
    cost_s = calloc(n, sizeof *cost_s);
    sel = calloc(n, sizeof *sel);
    choice = calloc(n, sizeof *choice);
    if (!save || !cost || !mask || !one || !rep || !save_s || !cost_s ||
        !sel || !choice) {
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
        goto done;
    }
    ck_ctx c = {g, *setup, 0, err};
    plan->n_segments = n;
    for (size_t i = 0; i < g->n_ops; i++)
        plan->step_flops += g->ops[i].flops_fwd + g->ops[i].flops_bwd;
    for (size_t i = 0; i < n; i++) {
        const vp_segment *sg = &g->segs[i];
        for (uint32_t k = sg->first_op; k <= sg->last_op; k++) {
            cost[i] += g->ops[k].flops_fwd;
            if (g->ops[k].kind == VP_OP_ATTENTION)
                cost_s[i] += g->ops[k].flops_fwd;
        }
    }
    bool try_sel = out_sel != NULL;
    vp_estimate e0, e;
    bool fits;
    /* nothing checkpointed: does it already fit? */
    if ((st = sim_mask(&c, mask, NULL, true, &e0, &fits)) != VP_OK)
        goto done;
    if (fits) {
        plan->peak_alloc = e0.peak_alloc;
        plan->peak_reserved = e0.peak_reserved;
        goto found;
    }
    if ((st = sim_mask(&c, mask, NULL, false, &e0, &fits)) != VP_OK)
        goto done;
    /* what checkpointing each segment alone saves (peak allocated), and
     * what recomputing only its attention core saves */
    for (size_t i = 0; i < n; i++) {
        rep[i] = -1;
        for (size_t j = 0; j < i; j++)
            if (rep[j] < 0 && same_segment(g, &g->segs[i], &g->segs[j])) {
                rep[i] = (int32_t)j;
                break;
            }
        if (rep[i] >= 0) {
            save[i] = save[rep[i]];
            save_s[i] = save_s[rep[i]];
            continue;
        }
        one[i] = true;
        st = sim_mask(&c, one, NULL, false, &e, &fits);
        if (st == VP_OK && try_sel && cost_s[i] > 0) {
            save[i] = e0.peak_alloc > e.peak_alloc
                          ? e0.peak_alloc - e.peak_alloc
                          : 0;
            st = sim_mask(&c, mask, one, false, &e, &fits);
            save_s[i] = e0.peak_alloc > e.peak_alloc
                            ? e0.peak_alloc - e.peak_alloc
                            : 0;
            one[i] = false;
            if (st != VP_OK)
                goto done;
            continue;
        }
        one[i] = false;
        if (st != VP_OK)
            goto done;
        save[i] = e0.peak_alloc > e.peak_alloc ? e0.peak_alloc - e.peak_alloc
                                               : 0;
    }
    /* the budget applies to reserved bytes; keep the unsplit-block and
     * fragmentation gap of the uncheckpointed run as a margin */
    uint64_t gap = e0.peak_reserved > e0.peak_alloc
                       ? e0.peak_reserved - e0.peak_alloc
                       : 0;
    uint64_t limit = setup->alloc.limit;
    uint64_t target = limit > gap ? limit - gap : 0;
    uint64_t need = e0.peak_alloc > target ? e0.peak_alloc - target : 0;
    uint64_t total_save = 0;
    for (size_t i = 0; i < n; i++)
        total_save += save[i];
    uint64_t unit = VP_MiB;
    while (n * (total_save / unit + 1) > ((uint64_t)1 << 22))
        unit *= 2;
    for (int iter = 0; iter < 24; iter++) {
        double tot;
        bool feas;
        if (try_sel) {
            st = vp_knapsack_cover2(save_s, cost_s, save, cost, n, need, unit,
                                    choice, &tot, &feas, err);
            for (size_t i = 0; i < n; i++) {
                sel[i] = choice[i] == 1;
                mask[i] = choice[i] == 2;
            }
        } else {
            st = vp_knapsack_cover(save, cost, n, need, unit, mask, &tot,
                                   &feas, err);
        }
        if (st != VP_OK)
            goto done;
        if (!feas)
            for (size_t i = 0; i < n; i++) {
                mask[i] = true; /* try everything */
                sel[i] = false;
            }
        if ((st = sim_mask(&c, mask, sel, true, &e, &fits)) != VP_OK)
            goto done;
        if (fits) {
            plan->peak_alloc = e.peak_alloc;
            plan->peak_reserved = e.peak_reserved;
            goto found;
        }
        if (!feas) {
            st = vp_error_set(err, VP_EOOM,
                              "does not fit even with every segment "
                              "checkpointed");
            goto done;
        }
        /* tighten by what the unlimited run overshoots */
        if ((st = sim_mask(&c, mask, sel, false, &e, &fits)) != VP_OK)
            goto done;
        uint64_t over = e.peak_reserved > limit ? e.peak_reserved - limit
                                                : unit;
        if (over < unit)
            over = unit;
        need += over;
    }
    st = vp_error_set(err, VP_EOOM,
                      "no checkpoint placement found that fits");
    goto done;
found:
    for (size_t i = 0; i < n; i++) {
        out_mask[i] = mask[i];
        if (out_sel)
            out_sel[i] = sel[i];
        if (mask[i]) {
            plan->n_checkpointed++;
            plan->recompute_flops += cost[i];
        } else if (sel[i]) {
            plan->n_selective++;
            plan->recompute_flops += cost_s[i];
        }
    }
    plan->simulations = c.sims;
    st = VP_OK;
done:
    free(save);
    free(save_s);
    free(cost_s);
    free(sel);
    free(choice);
    free(cost);
    free(mask);
    free(one);
    free(rep);
    vp_graph_free(g);
    return st;
}
