/* What each memory technique buys (techniques.h): the rows' order and
 * applicability, that each technique moves the peak the way it should,
 * and that the figures agree with the simulator and the max-batch search
 * run directly. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/vramplan.h"

static vp_model *load(const char *path)
{
    vp_error err;
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s: %s", path, err.msg);
    return m;
}

static vp_hw gpu_hw(const char *name)
{
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load(name, &err);
    cr_assert_not_null(p, "%s: %s", name, err.msg);
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    vp_gpu_hw(p, VP_GPU_BF16, &hw);
    vp_hw_fill_defaults(&hw);
    vp_gpu_free(p);
    return hw;
}

/* gpt2-small, batch 8, seq 1024, fp32 AdamW under 12 GiB: the baseline
 * (about 15 GiB reserved) does not fit, checkpointing every layer (about
 * 7.6 GiB) does. */
static void gpt2_base(vp_setup *s)
{
    vp_setup_init(s);
    s->batch = 8;
    s->steps = 2;
    s->alloc.limit = 12 * VP_GiB;
}

/* mlp10, batch 256, fp32 AdamW: cheap to search; its peak is the
 * optimizer step (about 2.9 GiB allocated, 3.0 GiB reserved) */
static void mlp10_base(vp_setup *s, uint64_t budget)
{
    vp_setup_init(s);
    s->batch = 256;
    s->steps = 2;
    s->alloc.limit = budget;
}

typedef struct rows {
    vp_technique_result r[VP_TECHNIQUES_MAX];
    size_t n;
} rows;

static void run(const vp_model *m, const vp_setup *s, const char *ckpt,
                const vp_hw *hw, rows *out)
{
    vp_error err;
    cr_assert_eq(vp_techniques(m, s, ckpt, hw, out->r, VP_TECHNIQUES_MAX,
                               &out->n, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_gt(out->n, 0);
}

static const vp_technique_result *row(const rows *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->r[i].name, name))
            return &t->r[i];
    return NULL;
}

static const vp_technique_result *must_row(const rows *t, const char *name)
{
    const vp_technique_result *r = row(t, name);
    cr_assert_not_null(r, "no row '%s'", name);
    return r;
}

/* Peak of one setup without a limit (what the rows report). */
static vp_estimate simulate(const vp_model *m, const vp_setup *s0,
                            const char *ckpt)
{
    vp_error err;
    vp_graph *g = vp_graph_build(m, s0->batch, s0->seq, &err);
    cr_assert_not_null(g, "%s", err.msg);
    size_t ns = vp_graph_segment_count(g);
    bool mask[64] = {false};
    cr_assert_leq(ns, 64);
    cr_assert_eq(vp_graph_checkpoint_select(g, ckpt, mask, &err), VP_OK);
    vp_setup s = *s0;
    s.skip_breakdown = true;
    s.alloc.limit = 0;
    s.checkpoint = mask;
    s.n_checkpoint = ns;
    vp_estimate e;
    cr_assert_eq(vp_simulate(g, &s, &e, NULL, NULL, &err), VP_OK, "%s",
                 err.msg);
    vp_graph_free(g);
    return e;
}

/* ---- the rows ---------------------------------------------------------- */

Test(techniques, the_baseline_comes_first_and_is_the_user_setup)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    mlp10_base(&s, 2 * VP_GiB);
    rows t;
    run(m, &s, NULL, NULL, &t);
    cr_assert_str_eq(t.r[0].name, "baseline");
    cr_assert(t.r[0].applicable);
    vp_estimate e = simulate(m, &s, NULL);
    cr_assert_eq(t.r[0].peak_alloc, e.peak_alloc);
    cr_assert_eq(t.r[0].peak_reserved, e.peak_reserved);
    /* ~3 GiB reserved against a 2 GiB budget */
    cr_assert_not(t.r[0].fits);
    /* "baseline" appears once */
    for (size_t i = 1; i < t.n; i++)
        cr_assert_str_neq(t.r[i].name, "baseline");
    vp_model_free(m);
}

Test(techniques, half_precision_rows_lower_the_fp32_peak)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_setup s;
    gpt2_base(&s);
    rows t;
    run(m, &s, NULL, NULL, &t);
    uint64_t base = t.r[0].peak_alloc;
    const vp_technique_result *amp = must_row(&t, "amp-bf16");
    const vp_technique_result *fp16 = must_row(&t, "amp-fp16");
    const vp_technique_result *bf16 = must_row(&t, "pure bf16");
    cr_assert_lt(amp->peak_alloc, base);
    cr_assert_lt(fp16->peak_alloc, base);
    /* weights, gradients and optimizer state in bf16 too */
    cr_assert_lt(bf16->peak_alloc, amp->peak_alloc);
    cr_assert_geq(bf16->max_batch, t.r[0].max_batch);
    vp_model_free(m);
}

Test(techniques, the_base_precision_has_no_row_of_its_own)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    mlp10_base(&s, 2 * VP_GiB);
    s.precision = VP_PREC_AMP_BF16;
    rows t;
    run(m, &s, NULL, NULL, &t);
    cr_assert_null(row(&t, "amp-bf16"));
    cr_assert_not_null(row(&t, "amp-fp16"));
    cr_assert_not_null(row(&t, "pure bf16"));
    vp_model_free(m);
}

Test(techniques, checkpointing_every_layer_lowers_the_activation_peak)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_setup s;
    gpt2_base(&s);
    rows t;
    run(m, &s, NULL, NULL, &t);
    const vp_technique_result *ck = must_row(&t, "checkpoint every layer");
    cr_assert(ck->applicable);
    cr_assert_lt(ck->peak_alloc, t.r[0].peak_alloc);
    /* the same as simulating "all" directly, where the saved activations
     * at the peak are what shrinks */
    vp_estimate ea = simulate(m, &s, "all");
    vp_estimate b = simulate(m, &s, NULL);
    cr_assert_eq(ck->peak_alloc, ea.peak_alloc);
    cr_assert_lt(ea.by_category[VP_CAT_ACT], b.by_category[VP_CAT_ACT]);
    cr_assert(ck->fits);
    cr_assert_gt(ck->max_batch, t.r[0].max_batch);
    vp_model_free(m);
}

Test(techniques, checkpoint_optimal_fits_where_the_baseline_does_not)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_setup s;
    gpt2_base(&s);
    rows t;
    run(m, &s, NULL, NULL, &t);
    const vp_technique_result *opt = must_row(&t, "checkpoint optimal");
    const vp_technique_result *all = must_row(&t, "checkpoint every layer");
    cr_assert_not(t.r[0].fits);
    cr_assert(opt->fits, "%s", opt->note);
    /* fewer layers than all: more memory, still under the budget */
    cr_assert_geq(opt->peak_alloc, all->peak_alloc);
    cr_assert_lt(opt->peak_alloc, t.r[0].peak_alloc);
    /* "N of 12 segments, recompute X% of the FLOPs", 0 < N < 12 */
    unsigned k = 0, of = 0;
    cr_assert_eq(sscanf(opt->note, "%u of %u segments", &k, &of), 2, "%s",
                 opt->note);
    cr_assert_eq(of, 12);
    cr_assert(k > 0 && k < 12, "%s", opt->note);
    vp_model_free(m);
}

Test(techniques, int8_weights_row_is_an_inference_figure)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    mlp10_base(&s, 2 * VP_GiB);
    rows t;
    run(m, &s, NULL, NULL, &t);
    const vp_technique_result *i8 = &t.r[t.n - 1];
    cr_assert_str_eq(i8->name, "INT8 weights (inference)");
    cr_assert(i8->applicable);
    /* the user's setup under no_grad with INT8 linear weights */
    vp_setup inf = s;
    inf.inference = true;
    inf.weight_bits = 8;
    vp_estimate e = simulate(m, &inf, NULL);
    cr_assert_eq(i8->peak_alloc, e.peak_alloc);
    cr_assert_eq(i8->peak_reserved, e.peak_reserved);
    /* far below the training step, and it fits where training does not */
    cr_assert_lt(i8->peak_alloc, t.r[0].peak_alloc / 2);
    cr_assert(i8->fits);
    cr_assert_gt(i8->max_batch, s.batch);
    vp_model_free(m);
}

Test(techniques, accumulation_not_applicable_for_an_odd_batch)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 7;
    s.steps = 2;
    s.alloc.limit = 4 * VP_GiB;
    rows t;
    run(m, &s, NULL, NULL, &t);
    static const char *const names[] = {"accumulation x2", "accumulation x4"};
    for (size_t i = 0; i < 2; i++) {
        const vp_technique_result *r = must_row(&t, names[i]);
        cr_assert_not(r->applicable, "%s", names[i]);
        cr_assert_not_null(strstr(r->note, "not a multiple"), "%s",
                           r->note);
        cr_assert_eq(r->peak_alloc, 0);
        cr_assert_eq(r->max_batch, 0);
    }
    vp_model_free(m);
}

Test(techniques, accumulation_splits_an_even_batch)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_setup s;
    gpt2_base(&s);
    rows t;
    run(m, &s, NULL, NULL, &t);
    const vp_technique_result *x2 = must_row(&t, "accumulation x2");
    const vp_technique_result *x4 = must_row(&t, "accumulation x4");
    cr_assert(x2->applicable && x4->applicable);
    cr_assert_not_null(strstr(x2->change, "micro-batch 4 x 2"), "%s",
                       x2->change);
    cr_assert_not_null(strstr(x4->change, "micro-batch 2 x 4"), "%s",
                       x4->change);
    /* smaller micro-batches: less activation memory */
    cr_assert_lt(x2->peak_alloc, t.r[0].peak_alloc);
    cr_assert_lt(x4->peak_alloc, x2->peak_alloc);
    vp_setup four = s;
    four.batch = 4;
    four.accum = 2;
    vp_estimate e = simulate(m, &four, NULL);
    cr_assert_eq(x2->peak_alloc, e.peak_alloc);
    vp_model_free(m);
}

Test(techniques, max_batch_is_the_maxbatch_answer_of_the_row_setup)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_setup s;
    gpt2_base(&s);
    rows t;
    run(m, &s, NULL, NULL, &t);
    vp_error err;
    vp_maxbatch_result mb;
    /* pure bf16 */
    vp_setup b = s;
    b.precision = VP_PREC_BF16;
    cr_assert_eq(vp_maxbatch(m, &b, NULL, (uint64_t)1 << 20, &mb, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_gt(mb.max_batch, 0);
    cr_assert_eq(must_row(&t, "pure bf16")->max_batch, mb.max_batch);
    /* every layer checkpointed */
    cr_assert_eq(vp_maxbatch(m, &s, "all", (uint64_t)1 << 20, &mb, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_eq(must_row(&t, "checkpoint every layer")->max_batch,
                 mb.max_batch);
    /* the baseline */
    cr_assert_eq(vp_maxbatch(m, &s, NULL, (uint64_t)1 << 20, &mb, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_eq(t.r[0].max_batch, mb.max_batch);
    /* here the baseline fits neither 8 nor any larger batch */
    cr_assert_lt(t.r[0].max_batch, s.batch);
    vp_model_free(m);
}

/* ---- times ------------------------------------------------------------- */

Test(techniques, without_a_gpu_no_times)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    mlp10_base(&s, 4 * VP_GiB);
    rows t;
    run(m, &s, NULL, NULL, &t);
    for (size_t i = 0; i < t.n; i++) {
        cr_assert_float_eq(t.r[i].step_s, 0.0, 0.0, "%s", t.r[i].name);
        cr_assert_float_eq(t.r[i].samples_per_s, 0.0, 0.0, "%s",
                           t.r[i].name);
    }
    vp_model_free(m);
}

Test(techniques, with_a_gpu_fitting_rows_are_timed)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_hw hw = gpu_hw("h200");
    vp_setup s;
    mlp10_base(&s, 3 * VP_GiB);
    rows t;
    run(m, &s, NULL, &hw, &t);
    size_t timed = 0, untimed = 0;
    for (size_t i = 0; i < t.n; i++) {
        const vp_technique_result *r = &t.r[i];
        if (r->applicable && r->fits) {
            cr_assert_gt(r->step_s, 0.0, "%s", r->name);
            timed++;
        } else {
            cr_assert_float_eq(r->step_s, 0.0, 0.0, "%s", r->name);
            untimed++;
        }
    }
    cr_assert_gt(timed, 2);
    cr_assert_gt(untimed, 0);
    /* samples per second count every micro-batch of the step */
    const vp_technique_result *x2 = must_row(&t, "accumulation x2");
    cr_assert(x2->fits);
    cr_assert_float_eq(x2->samples_per_s, 256.0 / x2->step_s,
                       1e-9 * x2->samples_per_s);
    vp_model_free(m);
}

/* BUG (src/techniques.c, vp_techniques): the single-precision rows are
 * marked not applicable when the GPU has no rate for their precision, but
 * the combination rows "amp-bf16 + checkpoint" and "bf16 + checkpoint +
 * 8-bit" are not; eval_variant then times them and vp_step_time_estimate
 * returns VP_EARG, which fails the whole call.
 * Input: mlp10, batch 8, fp32 AdamW, budget 4 GiB, hw = gpus/v100-32g
 * (bf16 0). CLI: vramplan techniques models/mlp10.yaml --batch 8
 * --budget 4GiB --gpu v100-32g.
 * Expected: VP_OK, the bf16 rows not applicable with a note, amp-fp16
 * applicable, the combinations in fp16. Got: VP_EARG "the GPU profile 'v100-32g'
 * has no amp-bf16 rate or no memory bandwidth" (the CLI exits 2). */
Test(techniques, precisions_the_gpu_lacks_are_not_applicable)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_hw hw = gpu_hw("v100-32g"); /* no bf16 */
    cr_assert_float_eq(hw.bf16, 0.0, 0.0);
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    s.steps = 2;
    s.alloc.limit = 4 * VP_GiB;
    rows t;
    run(m, &s, NULL, &hw, &t);
    static const char *const no_rate[] = {"amp-bf16", "pure bf16"};
    for (size_t i = 0; i < 2; i++) {
        const vp_technique_result *r = must_row(&t, no_rate[i]);
        cr_assert_not(r->applicable, "%s", no_rate[i]);
        cr_assert_neq(r->note[0], '\0', "%s", no_rate[i]);
    }
    cr_assert(must_row(&t, "amp-fp16")->applicable);
    /* the combinations fall back to fp16 */
    cr_assert(must_row(&t, "amp-fp16 + checkpoint")->applicable);
    cr_assert(must_row(&t, "fp16 + checkpoint + 8-bit")->applicable);
    vp_model_free(m);
}

Test(techniques, precision_rows_without_a_gpu_are_applicable)
{
    /* with no GPU profile there is no rate to miss */
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    s.steps = 2;
    s.alloc.limit = 4 * VP_GiB;
    rows t;
    run(m, &s, NULL, NULL, &t);
    cr_assert(must_row(&t, "amp-bf16")->applicable);
    cr_assert(must_row(&t, "pure bf16")->applicable);
    cr_assert(must_row(&t, "amp-fp16")->applicable);
    vp_model_free(m);
}

/* ---- the setup --------------------------------------------------------- */

Test(techniques, inference_setup_has_no_training_rows)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 64;
    s.steps = 2;
    s.inference = true;
    s.alloc.limit = 4 * VP_GiB;
    rows t;
    run(m, &s, NULL, NULL, &t);
    static const char *const training[] = {
        "checkpoint every layer", "checkpoint optimal", "accumulation x2",
        "set_to_none=False", "no_grad inference", "8-bit AdamW",
        "optimizer offload"};
    for (size_t i = 0; i < sizeof training / sizeof *training; i++)
        cr_assert_null(row(&t, training[i]), "%s", training[i]);
    cr_assert_str_eq(t.r[0].name, "baseline");
    cr_assert_not_null(row(&t, "INT8 weights (inference)"));
    vp_model_free(m);
}

Test(techniques, set_to_none_row_flips_the_user_choice)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    s.steps = 2;
    s.alloc.limit = 4 * VP_GiB;
    rows t;
    run(m, &s, NULL, NULL, &t);
    cr_assert_not_null(row(&t, "set_to_none=False"));
    cr_assert_null(row(&t, "set_to_none=True"));
    s.set_to_none = false;
    run(m, &s, NULL, NULL, &t);
    cr_assert_not_null(row(&t, "set_to_none=True"));
    cr_assert_null(row(&t, "set_to_none=False"));
    vp_model_free(m);
}

Test(techniques, the_row_count_respects_the_capacity)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    s.steps = 2;
    s.alloc.limit = 4 * VP_GiB;
    vp_technique_result out[3];
    size_t n = 99;
    vp_error err;
    cr_assert_eq(vp_techniques(m, &s, NULL, NULL, out, 3, &n, &err), VP_OK);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(out[0].name, "baseline");
    vp_model_free(m);
}

Test(techniques, earg_without_a_budget)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    rows t;
    t.n = 99;
    vp_error err;
    cr_assert_eq(vp_techniques(m, &s, NULL, NULL, t.r, VP_TECHNIQUES_MAX,
                               &t.n, &err),
                 VP_EARG);
    cr_assert_eq(err.code, VP_EARG);
    cr_assert_eq(t.n, 0);
    vp_model_free(m);
}
