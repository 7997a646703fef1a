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
    if (vp__graph_search_check(g, err) != VP_OK) {
        vp_graph_free(g);
        return VP_ELIMIT;
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

/* What both max-batch searches check first: a budget, and the cap (none
 * given: 2^40). */
static vp_status maxbatch_begin(const vp_setup *setup, uint64_t *cap,
                                vp_maxbatch_result *out, vp_error *err)
{
    memset(out, 0, sizeof *out);
    vp_error_clear(err);
    if (setup->alloc.limit == 0 && setup->alloc.device_total == 0)
        return vp_error_set(err, VP_EARG,
                            "a memory budget is needed for a max-batch "
                            "search");
    if (*cap == 0)
        *cap = (uint64_t)1 << 40;
    return VP_OK;
}

vp_status vp_maxbatch(const vp_model *m, const vp_setup *setup,
                      const char *ckpt, uint64_t cap,
                      vp_maxbatch_result *out, vp_error *err)
{
    vp_status st0 = maxbatch_begin(setup, &cap, out, err);
    if (st0 != VP_OK)
        return st0;
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
    vp_status st0 = maxbatch_begin(setup, &cap, out, err);
    if (st0 != VP_OK)
        return st0;
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

/* The working arrays of one placement search, a value per segment. */
typedef struct {
    size_t n;
    uint64_t *save, *save_s; /* peak bytes saved: whole / attention only */
    double *cost, *cost_s;   /* forward FLOPs recomputed: same split */
    bool *mask, *one, *sel;
    uint8_t *choice;
    int32_t *rep; /* an earlier identical segment, or -1 */
} ck_work;

static void ck_free(ck_work *w)
{
    void *const arrays[] = {w->save, w->save_s, w->cost, w->cost_s, w->mask,
                            w->one,  w->sel,    w->choice, w->rep};
    vp__free_each(arrays, sizeof arrays / sizeof arrays[0]);
}

static vp_status ck_alloc(ck_work *w, size_t n, vp_error *err)
{
    memset(w, 0, sizeof *w);
    w->n = n;
    w->save = calloc(n, sizeof *w->save);
    w->save_s = calloc(n, sizeof *w->save_s);
    w->cost = calloc(n, sizeof *w->cost);
    w->cost_s = calloc(n, sizeof *w->cost_s);
    w->mask = calloc(n, sizeof *w->mask);
    w->one = calloc(n, sizeof *w->one);
    w->sel = calloc(n, sizeof *w->sel);
    w->choice = calloc(n, sizeof *w->choice);
    w->rep = calloc(n, sizeof *w->rep);
    if (!w->save || !w->save_s || !w->cost || !w->cost_s || !w->mask ||
        !w->one || !w->sel || !w->choice || !w->rep)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    return VP_OK;
}

/* Forward FLOPs each segment would recompute, whole and attention only. */
static void ck_costs(const vp_graph *g, ck_work *w, vp_ckpt_plan *plan)
{
    for (size_t i = 0; i < g->n_ops; i++)
        plan->step_flops += g->ops[i].flops_fwd + g->ops[i].flops_bwd;
    for (size_t i = 0; i < w->n; i++) {
        const vp_segment *sg = &g->segs[i];
        for (uint32_t k = sg->first_op; k <= sg->last_op; k++) {
            w->cost[i] += g->ops[k].flops_fwd;
            if (g->ops[k].kind == VP_OP_ATTENTION)
                w->cost_s[i] += g->ops[k].flops_fwd;
        }
    }
}

static uint64_t ck_saved(const vp_estimate *e0, const vp_estimate *e)
{
    return e0->peak_alloc > e->peak_alloc ? e0->peak_alloc - e->peak_alloc
                                          : 0;
}

/* What checkpointing each segment alone saves (peak allocated, against the
 * unlimited uncheckpointed run e0), and what recomputing only its
 * attention core saves; identical segments share one measurement. */
static vp_status ck_measure(ck_ctx *c, ck_work *w, bool try_sel,
                            const vp_estimate *e0)
{
    vp_estimate e;
    bool fits;
    for (size_t i = 0; i < w->n; i++) {
        w->rep[i] = -1;
        for (size_t j = 0; j < i; j++)
            if (w->rep[j] < 0 &&
                same_segment(c->g, &c->g->segs[i], &c->g->segs[j])) {
                w->rep[i] = (int32_t)j;
                break;
            }
        if (w->rep[i] >= 0) {
            w->save[i] = w->save[w->rep[i]];
            w->save_s[i] = w->save_s[w->rep[i]];
            continue;
        }
        w->one[i] = true;
        vp_status st = sim_mask(c, w->one, NULL, false, &e, &fits);
        if (st == VP_OK) {
            w->save[i] = ck_saved(e0, &e);
            if (try_sel && w->cost_s[i] > 0) {
                st = sim_mask(c, w->mask, w->one, false, &e, &fits);
                w->save_s[i] = ck_saved(e0, &e);
            }
        }
        w->one[i] = false;
        if (st != VP_OK)
            return st;
    }
    return VP_OK;
}

/* Cover the bytes needed at least FLOPs (knapsack), simulate the choice
 * under the budget, and raise the need by the overshoot until it fits. */
static vp_status ck_search(ck_ctx *c, ck_work *w, bool try_sel,
                           const vp_estimate *e0, vp_ckpt_plan *plan)
{
    size_t n = w->n;
    /* the budget applies to reserved bytes; keep the unsplit-block and
     * fragmentation gap of the uncheckpointed run as a margin */
    uint64_t gap = e0->peak_reserved > e0->peak_alloc
                       ? e0->peak_reserved - e0->peak_alloc
                       : 0;
    uint64_t limit = c->s.alloc.limit;
    uint64_t target = limit > gap ? limit - gap : 0;
    uint64_t need = e0->peak_alloc > target ? e0->peak_alloc - target : 0;
    uint64_t total_save = 0;
    for (size_t i = 0; i < n; i++)
        total_save += w->save[i];
    uint64_t unit = VP_MiB;
    while (n * (total_save / unit + 1) > ((uint64_t)1 << 22))
        unit *= 2;
    for (int iter = 0; iter < 24; iter++) {
        double tot;
        bool feas, fits;
        vp_estimate e;
        vp_status st;
        if (try_sel) {
            st = vp_knapsack_cover2(w->save_s, w->cost_s, w->save, w->cost,
                                    n, need, unit, w->choice, &tot, &feas,
                                    c->err);
            for (size_t i = 0; i < n; i++) {
                w->sel[i] = w->choice[i] == 1;
                w->mask[i] = w->choice[i] == 2;
            }
        } else {
            st = vp_knapsack_cover(w->save, w->cost, n, need, unit, w->mask,
                                   &tot, &feas, c->err);
        }
        if (st != VP_OK)
            return st;
        if (!feas)
            for (size_t i = 0; i < n; i++) {
                w->mask[i] = true; /* try everything */
                w->sel[i] = false;
            }
        if ((st = sim_mask(c, w->mask, w->sel, true, &e, &fits)) != VP_OK)
            return st;
        if (fits) {
            plan->peak_alloc = e.peak_alloc;
            plan->peak_reserved = e.peak_reserved;
            return VP_OK;
        }
        if (!feas)
            return vp_error_set(c->err, VP_EOOM,
                                "does not fit even with every segment "
                                "checkpointed");
        /* tighten by what the unlimited run overshoots */
        if ((st = sim_mask(c, w->mask, w->sel, false, &e, &fits)) != VP_OK)
            return st;
        uint64_t over = e.peak_reserved > limit ? e.peak_reserved - limit
                                                : unit;
        need += over < unit ? unit : over;
    }
    return vp_error_set(c->err, VP_EOOM,
                        "no checkpoint placement found that fits");
}

static void ck_report(const ck_work *w, bool *out_mask, bool *out_sel,
                      vp_ckpt_plan *plan)
{
    for (size_t i = 0; i < w->n; i++) {
        out_mask[i] = w->mask[i];
        if (out_sel)
            out_sel[i] = w->sel[i];
        if (w->mask[i]) {
            plan->n_checkpointed++;
            plan->recompute_flops += w->cost[i];
        } else if (w->sel[i]) {
            plan->n_selective++;
            plan->recompute_flops += w->cost_s[i];
        }
    }
}

/* Run the search over a built graph: already fitting, else measure and
 * cover. */
static vp_status ck_place(ck_ctx *c, ck_work *w, bool try_sel,
                          vp_ckpt_plan *plan)
{
    vp_estimate e0;
    bool fits;
    vp_status st = sim_mask(c, w->mask, NULL, true, &e0, &fits);
    if (st != VP_OK)
        return st;
    if (fits) {
        plan->peak_alloc = e0.peak_alloc;
        plan->peak_reserved = e0.peak_reserved;
        return VP_OK;
    }
    if ((st = sim_mask(c, w->mask, NULL, false, &e0, &fits)) != VP_OK)
        return st;
    if ((st = ck_measure(c, w, try_sel, &e0)) != VP_OK)
        return st;
    return ck_search(c, w, try_sel, &e0, plan);
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
    if (vp__graph_search_check(g, err) != VP_OK) {
        vp_graph_free(g);
        return VP_ELIMIT;
    }
    size_t n = vp_graph_segment_count(g);
    ck_work w = {0};
    vp_status st;
    if (n == 0)
        st = vp_error_set(err, VP_EARG, "the model has no checkpoint units");
    else if (n_mask < n)
        st = vp_error_set(err, VP_EARG, "checkpoint mask too short");
    else
        st = ck_alloc(&w, n, err);
    if (st == VP_OK) {
        ck_ctx c = {g, *setup, 0, err};
        plan->n_segments = n;
        ck_costs(g, &w, plan);
        st = ck_place(&c, &w, out_sel != NULL, plan);
        if (st == VP_OK) {
            ck_report(&w, out_mask, out_sel, plan);
            plan->simulations = c.sims;
        }
    }
    ck_free(&w);
    vp_graph_free(g);
    return st;
}
