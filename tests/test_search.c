/* The searches on one GPU: the covering knapsack against brute force, the
 * checkpoint placement against the "every layer" and "every k layers"
 * baselines, and the max-batch search's defining property. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "vramplan/vramplan.h"

/* Brute force over all subsets: least cost saving >= need (in units). */
static double brute(const uint64_t *save, const double *cost, size_t n,
                    uint64_t need, uint64_t unit, bool *feasible)
{
    double best = INFINITY;
    uint64_t k = need / unit + (need % unit != 0);
    for (uint32_t m = 0; m < (1u << n); m++) {
        uint64_t s = 0;
        double c = 0;
        for (size_t i = 0; i < n; i++)
            if (m & (1u << i)) {
                s += save[i] / unit;
                c += cost[i];
            }
        if (s >= k && c < best)
            best = c;
    }
    *feasible = !isinf(best);
    return best;
}

Test(knapsack, matches_brute_force_on_random_chains)
{
    srand(12345);
    for (int trial = 0; trial < 300; trial++) {
        size_t n = 1 + (size_t)(rand() % 12);
        uint64_t save[12];
        double cost[12];
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) {
            save[i] = (uint64_t)(rand() % 50) * VP_MiB;
            cost[i] = (double)(1 + rand() % 100);
            total += save[i];
        }
        uint64_t need = total ? (uint64_t)rand() % (total + 2 * VP_MiB) : 0;
        bool choose[12], feas, bfeas;
        double tot;
        vp_error err;
        cr_assert_eq(vp_knapsack_cover(save, cost, n, need, VP_MiB, choose,
                                       &tot, &feas, &err),
                     VP_OK);
        double b = brute(save, cost, n, need, VP_MiB, &bfeas);
        cr_assert_eq(feas, bfeas, "trial %d: feasibility differs", trial);
        if (!feas)
            continue;
        cr_assert_float_eq(tot, b, 1e-9, "trial %d: dp %g brute %g", trial,
                           tot, b);
        /* the reported subset is real: its cost and its saving */
        double c = 0;
        uint64_t s = 0;
        for (size_t i = 0; i < n; i++)
            if (choose[i]) {
                c += cost[i];
                s += save[i] / VP_MiB;
            }
        cr_assert_float_eq(c, tot, 1e-9);
        cr_assert_geq(s * VP_MiB + (VP_MiB - 1), need);
    }
}

Test(knapsack, nothing_needed_chooses_nothing)
{
    uint64_t save[3] = {VP_MiB, 2 * VP_MiB, 3 * VP_MiB};
    double cost[3] = {1, 2, 3};
    bool choose[3], feas;
    double tot;
    vp_error err;
    cr_assert_eq(vp_knapsack_cover(save, cost, 3, 0, VP_MiB, choose, &tot,
                                   &feas, &err),
                 VP_OK);
    cr_assert(feas);
    cr_assert(!choose[0] && !choose[1] && !choose[2]);
    cr_assert_float_eq(tot, 0.0, 1e-12);
}

Test(knapsack, infeasible_when_all_items_save_too_little)
{
    uint64_t save[2] = {VP_MiB, VP_MiB};
    double cost[2] = {1, 1};
    bool choose[2], feas;
    double tot;
    vp_error err;
    cr_assert_eq(vp_knapsack_cover(save, cost, 2, 5 * VP_MiB, VP_MiB, choose,
                                   &tot, &feas, &err),
                 VP_OK);
    cr_assert(!feas);
}

Test(knapsack, prefers_cheap_large_savings)
{
    /* need 10: {a:6 cost 5, b:5 cost 1, c:5 cost 1} -> b + c (cost 2) */
    uint64_t save[3] = {6 * VP_MiB, 5 * VP_MiB, 5 * VP_MiB};
    double cost[3] = {5, 1, 1};
    bool choose[3], feas;
    double tot;
    vp_error err;
    vp_knapsack_cover(save, cost, 3, 10 * VP_MiB, VP_MiB, choose, &tot, &feas,
                      &err);
    cr_assert(feas);
    cr_assert(!choose[0] && choose[1] && choose[2]);
    cr_assert_float_eq(tot, 2.0, 1e-12);
}

Test(knapsack, refuses_huge_tables)
{
    uint64_t save[2] = {1, 1};
    double cost[2] = {1, 1};
    bool choose[2], feas;
    double tot;
    vp_error err;
    cr_assert_eq(vp_knapsack_cover(save, cost, 2, UINT64_MAX / 2, 1, choose,
                                   &tot, &feas, &err),
                 VP_ELIMIT);
}

/* ---- on a real model ---------------------------------------------------- */

static vp_model *load(const char *path)
{
    vp_error err;
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s: %s", path, err.msg);
    return m;
}

static vp_estimate run_mask(const vp_model *m, const vp_setup *s0,
                            const bool *mask, size_t n, vp_status *st)
{
    vp_error err;
    vp_graph *g = vp_graph_build(m, s0->batch, s0->seq, &err);
    cr_assert_not_null(g);
    vp_setup s = *s0;
    s.checkpoint = mask;
    s.n_checkpoint = n;
    vp_estimate e;
    *st = vp_simulate(g, &s, &e, NULL, NULL, &err);
    vp_graph_free(g);
    return e;
}

Test(checkpoint_auto, fits_and_recomputes_no_more_than_the_baselines,
     .timeout = 60)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    s.precision = VP_PREC_AMP_BF16;
    s.steps = 2;
    /* between the all-layers and the no-checkpoint peaks */
    s.alloc.limit = 11 * VP_GiB;
    size_t n = 12;
    bool mask[12];
    vp_ckpt_plan plan;
    vp_error err;
    cr_assert_eq(vp_checkpoint_auto(m, &s, mask, n, &plan, &err), VP_OK,
                 "%s", err.msg);
    cr_assert_gt(plan.n_checkpointed, 0);
    cr_assert_lt(plan.n_checkpointed, n);
    /* the chosen set fits under the budget */
    vp_status st;
    run_mask(m, &s, mask, n, &st);
    cr_assert_eq(st, VP_OK);
    /* every layer checkpointed also fits but recomputes more */
    bool all[12];
    for (size_t i = 0; i < n; i++)
        all[i] = true;
    run_mask(m, &s, all, n, &st);
    cr_assert_eq(st, VP_OK);
    cr_assert_lt(plan.n_checkpointed, n);
    /* "every k layers": any k whose baseline fits recomputes at least as
     * much (all layers have the same cost here) */
    for (size_t k = 2; k <= 6; k++) {
        bool every[12];
        size_t cnt = 0;
        for (size_t i = 0; i < n; i++) {
            every[i] = i % k == 0;
            cnt += every[i];
        }
        run_mask(m, &s, every, n, &st);
        if (st == VP_OK)
            cr_assert_leq(plan.n_checkpointed, cnt, "k=%zu", k);
    }
    vp_model_free(m);
}

Test(checkpoint_auto, nothing_when_it_already_fits)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 64;
    s.steps = 2;
    s.alloc.limit = 40 * VP_GiB;
    bool mask[10];
    vp_ckpt_plan plan;
    vp_error err;
    cr_assert_eq(vp_checkpoint_auto(m, &s, mask, 10, &plan, &err), VP_OK);
    cr_assert_eq(plan.n_checkpointed, 0);
    cr_assert_float_eq(plan.recompute_flops, 0.0, 1e-9);
    vp_model_free(m);
}

Test(checkpoint_auto, no_fit_is_an_error)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    s.steps = 2;
    s.alloc.limit = 1 * VP_GiB; /* below the model state alone */
    bool mask[12];
    vp_ckpt_plan plan;
    vp_error err;
    cr_assert_eq(vp_checkpoint_auto(m, &s, mask, 12, &plan, &err), VP_EOOM);
    vp_model_free(m);
}

Test(maxbatch, largest_fits_and_the_next_does_not, .timeout = 60)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.steps = 2;
    s.alloc.limit = 3 * VP_GiB + VP_GiB / 2;
    vp_maxbatch_result r;
    vp_error err;
    cr_assert_eq(vp_maxbatch(m, &s, NULL, 0, &r, &err), VP_OK);
    cr_assert_gt(r.max_batch, 1);
    bool ok;
    cr_assert_eq(vp_fits(m, &s, r.max_batch, NULL, &ok, NULL, &err), VP_OK);
    cr_assert(ok);
    cr_assert_eq(vp_fits(m, &s, r.max_batch + 1, NULL, &ok, NULL, &err),
                 VP_OK);
    cr_assert(!ok);
    cr_assert_leq(r.at_max.peak_reserved, s.alloc.limit);
    vp_model_free(m);
}

Test(maxbatch, needs_a_budget)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    vp_setup_init(&s);
    vp_maxbatch_result r;
    vp_error err;
    cr_assert_eq(vp_maxbatch(m, &s, NULL, 0, &r, &err), VP_EARG);
    vp_model_free(m);
}

Test(maxbatch, zero_when_the_model_alone_does_not_fit)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.steps = 2;
    s.alloc.limit = 256 * VP_MiB;
    vp_maxbatch_result r;
    vp_error err;
    cr_assert_eq(vp_maxbatch(m, &s, NULL, 0, &r, &err), VP_OK);
    cr_assert_eq(r.max_batch, 0);
    vp_model_free(m);
}

Test(maxbatch, ground_truth_budgets_within_three_percent, .timeout = 60)
{
    /* shared/groundtruth/h200-torch2.11-maxbatch.jsonl, measured on an
     * H200: gpt2-small amp-bf16 16 GiB -> 10, resnet50 amp-bf16 8 GiB ->
     * 180, mlp10 fp32 4 GiB -> 9984 (collect.py's search with cap 8192) */
    static const struct {
        const char *model;
        vp_precision prec;
        uint64_t gib, measured;
    } cases[] = {{"models/gpt2-small.yaml", VP_PREC_AMP_BF16, 16, 10},
                 {"models/resnet50.yaml", VP_PREC_AMP_BF16, 8, 180},
                 {"models/mlp10.yaml", VP_PREC_FP32, 4, 9984}};
    for (size_t i = 0; i < 3; i++) {
        vp_model *m = load(cases[i].model);
        vp_setup s;
        vp_setup_init(&s);
        s.precision = cases[i].prec;
        s.steps = 2;
        s.fresh_process = false;
        s.alloc.limit = cases[i].gib * VP_GiB;
        vp_maxbatch_result r;
        vp_error err;
        cr_assert_eq(vp_maxbatch_doubling(m, &s, NULL, 8192, &r, &err), VP_OK);
        double rel = fabs((double)r.max_batch - (double)cases[i].measured) /
                     (double)cases[i].measured;
        cr_assert(rel <= 0.03 || (cases[i].measured < 32 &&
                                  llabs((long long)r.max_batch -
                                        (long long)cases[i].measured) <= 1),
                  "%s: predicted %llu, measured %llu", cases[i].model,
                  (unsigned long long)r.max_batch,
                  (unsigned long long)cases[i].measured);
        vp_model_free(m);
    }
}

/* ---- none / selective / full per layer ------------------------------------ */

static double brute3(const uint64_t *sa, const double *ca, const uint64_t *sb,
                     const double *cb, size_t n, uint64_t need,
                     uint64_t unit, bool *feasible)
{
    double best = INFINITY;
    uint64_t k = need / unit + (need % unit != 0);
    uint32_t total = 1;
    for (size_t i = 0; i < n; i++)
        total *= 3;
    for (uint32_t m = 0; m < total; m++) {
        uint32_t x = m;
        uint64_t s = 0;
        double c = 0;
        for (size_t i = 0; i < n; i++, x /= 3) {
            if (x % 3 == 1) {
                s += sa[i] / unit;
                c += ca[i];
            } else if (x % 3 == 2) {
                s += sb[i] / unit;
                c += cb[i];
            }
        }
        if (s >= k && c < best)
            best = c;
    }
    *feasible = !isinf(best);
    return best;
}

Test(knapsack, two_options_match_brute_force)
{
    srand(777);
    for (int trial = 0; trial < 200; trial++) {
        size_t n = 1 + (size_t)(rand() % 8);
        uint64_t sa[8], sb[8], total = 0;
        double ca[8], cb[8];
        for (size_t i = 0; i < n; i++) {
            sa[i] = (uint64_t)(rand() % 20) * VP_MiB; /* selective: less */
            sb[i] = sa[i] + (uint64_t)(rand() % 40) * VP_MiB;
            ca[i] = (double)(1 + rand() % 10);
            cb[i] = ca[i] + (double)(rand() % 50);
            total += sb[i];
        }
        uint64_t need = total ? (uint64_t)rand() % (total + VP_MiB) : 0;
        uint8_t choice[8];
        double tot;
        bool feas, bfeas;
        vp_error err;
        cr_assert_eq(vp_knapsack_cover2(sa, ca, sb, cb, n, need, VP_MiB,
                                        choice, &tot, &feas, &err),
                     VP_OK);
        double b = brute3(sa, ca, sb, cb, n, need, VP_MiB, &bfeas);
        cr_assert_eq(feas, bfeas, "trial %d", trial);
        if (feas)
            cr_assert_float_eq(tot, b, 1e-9, "trial %d: dp %g brute %g",
                               trial, tot, b);
    }
}

Test(checkpoint_auto, eager_attention_prefers_selective_recomputation,
     .timeout = 60)
{
    /* eager attention keeps B*h*S*S probabilities per layer: recomputing
     * only the attention core frees them for a fraction of a layer's
     * FLOPs, so the DP picks selective layers before full ones */
    vp_model *m = load("models/gpt2-small.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    s.precision = VP_PREC_AMP_BF16;
    s.attn = VP_ATTN_EAGER;
    s.attn_set = true;
    s.steps = 2;
    s.alloc.limit = 16 * VP_GiB;
    bool mask[12], sel[12];
    vp_ckpt_plan plan;
    vp_error err;
    cr_assert_eq(vp_checkpoint_auto_sel(m, &s, mask, sel, 12, &plan, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_gt(plan.n_selective, 0);
    cr_assert_eq(plan.n_checkpointed, 0);
    vp_status st;
    vp_error e2;
    vp_graph *g = vp_graph_build(m, 8, 0, &e2);
    vp_setup t = s;
    t.checkpoint = mask;
    t.n_checkpoint = 12;
    t.selective = sel;
    t.n_selective = 12;
    vp_estimate est;
    st = vp_simulate(g, &t, &est, NULL, NULL, &e2);
    cr_assert_eq(st, VP_OK);
    vp_graph_free(g);
    vp_model_free(m);
}
