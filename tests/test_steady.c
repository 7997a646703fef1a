/* Accumulation's steady state in closed form (src/sim_steady.c): the
 * estimate is the loop's, field for field, wherever both run; the work
 * does not grow with --accum. The loop is forced by an event callback
 * (every event must then be sent). */
#include <criterion/criterion.h>

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "vramplan/vramplan.h"

static void noop(const vp_sim_event *ev, void *ud)
{
    (void)ev;
    (void)ud;
}

static vp_graph *graph(const char *path, uint64_t batch, uint64_t seq)
{
    vp_error err;
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s: %s", path, err.msg);
    vp_graph *g = vp_graph_build(m, batch, seq, &err);
    cr_assert_not_null(g, "%s: %s", path, err.msg);
    vp_model_free(m);
    return g;
}

/* The closed form and the loop, compared whole. */
static void same_as_loop(vp_graph *g, const vp_setup *s)
{
    vp_estimate *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    vp_error err;
    cr_assert_not_null(a);
    cr_assert_not_null(b);
    vp_status sa = vp_simulate(g, s, a, NULL, NULL, &err);
    vp_status sb = vp_simulate(g, s, b, noop, NULL, &err);
    cr_assert_eq(sa, sb);
    cr_expect_eq(a->events, b->events, "events %llu vs %llu",
                 (unsigned long long)a->events,
                 (unsigned long long)b->events);
    cr_expect_eq(a->peak_alloc, b->peak_alloc);
    cr_expect_eq(a->peak_reserved, b->peak_reserved);
    cr_expect_eq(a->num_alloc_retries, b->num_alloc_retries);
    cr_expect_eq(a->host_traffic, b->host_traffic);
    cr_expect(memcmp(a->step, b->step, sizeof a->step) == 0,
              "per-step figures differ (accum %u)", s->accum);
    cr_expect(memcmp(a, b, sizeof *a) == 0, "estimates differ (accum %u)",
              s->accum);
    free(a);
    free(b);
}

Test(steady, mlp10_every_setup_matches_the_loop)
{
    vp_graph *g = graph("models/mlp10.yaml", 2, 256);
    for (uint32_t acc = 1; acc <= 6; acc++)
        for (int p = 0; p < VP_PREC__COUNT; p++) {
            vp_setup s;
            vp_setup_init(&s);
            s.steps = 2;
            s.accum = acc;
            s.precision = (vp_precision)p;
            same_as_loop(g, &s);
            s.offload_activations = true;
            same_as_loop(g, &s);
        }
    vp_graph_free(g);
}

/* gpt2-small at batch 1, 64 tokens, and every segment checkpointed in
 * ck (room for 256). */
static vp_graph *gpt2_checkpointed(bool *ck)
{
    vp_graph *g = graph("models/gpt2-small.yaml", 1, 64);
    vp_error err;
    cr_assert_leq(vp_graph_segment_count(g), 256);
    cr_assert_eq(vp_graph_checkpoint_select(g, "all", ck, &err), VP_OK);
    return g;
}

Test(steady, gpt2_checkpointed_and_expandable_match_the_loop)
{
    bool ck[256];
    vp_graph *g = gpt2_checkpointed(ck);
    for (uint32_t acc = 2; acc <= 5; acc++) {
        vp_setup s;
        vp_setup_init(&s);
        s.checkpoint = ck;
        s.steps = 2;
        s.accum = acc;
        s.precision = VP_PREC_AMP_BF16;
        same_as_loop(g, &s);
        s.alloc.expandable_segments = true;
        s.set_to_none = false;
        same_as_loop(g, &s);
    }
    vp_graph_free(g);
}

/* The events grow by one micro-batch's worth per micro-batch, and 2^32 - 1
 * micro-batches cost what a few do. */
Test(steady, the_largest_accumulation_is_closed_form, .timeout = 10)
{
    vp_graph *g = graph("models/gpt2-small.yaml", 1, 64);
    vp_setup s;
    vp_setup_init(&s);
    s.steps = 1;
    vp_estimate e3, e4, big;
    vp_error err;
    s.accum = 3;
    cr_assert_eq(vp_simulate(g, &s, &e3, NULL, NULL, &err), VP_OK);
    s.accum = 4;
    cr_assert_eq(vp_simulate(g, &s, &e4, NULL, NULL, &err), VP_OK);
    s.accum = UINT32_MAX;
    clock_t t0 = clock();
    cr_assert_eq(vp_simulate(g, &s, &big, NULL, NULL, &err), VP_OK);
    double cpu = (double)(clock() - t0) / CLOCKS_PER_SEC;
    uint64_t per = e4.events - e3.events;
    cr_expect_eq(big.events, e4.events + (uint64_t)(UINT32_MAX - 4) * per);
    cr_expect_eq(big.peak_alloc, e4.peak_alloc);
    cr_expect_lt(cpu, 5.0, "%.2f s", cpu);
    vp_graph_free(g);
}

/* A run that sends its events stops at VP_MAX_EVENTS_SEEN, with an error
 * that says why, instead of writing gigabytes. */
Test(steady, events_sent_are_capped, .timeout = 60)
{
    vp_graph *g = graph("models/mlp10.yaml", 1, 64);
    vp_setup s;
    vp_setup_init(&s);
    s.steps = 1;
    s.accum = UINT32_MAX;
    vp_estimate e;
    vp_error err;
    cr_assert_eq(vp_simulate(g, &s, &e, noop, NULL, &err), VP_ELIMIT);
    cr_expect(strstr(err.msg, "more than 2097152 allocator events") != NULL,
              "%s", err.msg);
    vp_graph_free(g);
}

/* ---- fine-tuning and generate() (merged with finetune and generate) ---- */

static void lora_spec(vp_setup *s, const char *spec)
{
    vp_error err;
    cr_assert_eq(vp_lora_parse(spec, &s->ft.lora, &err), VP_OK, "%s: %s",
                 spec, err.msg);
}

/* LoRA and DoRA adapters on a frozen bf16 base (the autograd graph's
 * kept leaves, casts of frozen weights), a 4-bit base with paged 8-bit
 * AdamW (bitsandbytes' maps on the GPU, paged moments), a partly
 * frozen base: the closed form is the loop's, field for field. */
Test(steady, lora_qlora_and_frozen_setups_match_the_loop)
{
    vp_graph *g = graph("tests/data/good/hf-llama.json", 2, 32);
    vp_error err;
    bool ck[256];
    cr_assert_leq(vp_graph_segment_count(g), 256);
    cr_assert_eq(vp_graph_checkpoint_select(g, "all", ck, &err), VP_OK);
    static const char *specs[] = {
        "r=8,alpha=16,targets=q_proj,v_proj",
        "r=8,targets=q_proj,k_proj,v_proj,o_proj,dropout=0.1",
        "r=4,targets=q_proj,v_proj,dora",
    };
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++)
        for (uint32_t acc = 1; acc <= 5; acc += 2)
            for (int ckpt = 0; ckpt < 2; ckpt++) {
                vp_setup s;
                vp_setup_init(&s);
                s.steps = 2;
                s.accum = acc;
                s.precision = VP_PREC_AMP_BF16;
                s.ft.base_dtype = VP_BASE_BF16;
                s.checkpoint = ckpt ? ck : NULL;
                lora_spec(&s, specs[k]);
                same_as_loop(g, &s);
                s.ft.quant = VP_QUANT_NF4;
                s.ft.double_quant = true;
                s.optimizer = VP_OPT_PAGED_ADAMW_8BIT;
                same_as_loop(g, &s);
            }
    for (uint32_t acc = 2; acc <= 4; acc++) {
        vp_setup s;
        vp_setup_init(&s);
        s.steps = 2;
        s.accum = acc;
        s.precision = VP_PREC_AMP_FP16;
        cr_assert_eq(vp_freeze_parse("layers.0", &s.ft, &err), VP_OK);
        same_as_loop(g, &s);
    }
    vp_graph_free(g);
}

/* generate() runs no accumulation loop: with its events sent or not, and
 * with an accumulation set, the estimate is the same. */
Test(steady, generate_with_and_without_events)
{
    static const char *specs[] = {"prompt=32,new=8", "prompt=32,new=8",
                                  "prompt=32,new=6,sample,top-k=50"};
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++)
        for (uint32_t acc = 1; acc <= 3; acc += 2) {
            vp_setup s;
            vp_error err;
            vp_setup_init(&s);
            s.precision = VP_PREC_BF16;
            s.batch = 2;
            s.steps = 2;
            s.accum = acc;
            cr_assert_eq(vp_generate_parse(specs[k], &s.generate, &err),
                         VP_OK, "%s: %s", specs[k], err.msg);
            if (k == 1)
                s.generate.cache = VP_CACHE_STATIC;
            s.seq = s.generate.prompt;
            vp_graph *g = graph("tests/data/good/hf-llama.json", s.batch,
                                s.generate.prompt);
            same_as_loop(g, &s);
            vp_graph_free(g);
        }
}

/* The step time takes the steady state through its hooks: what it counts
 * per micro-batch (kernels, autocast casts) grows by one micro-batch's
 * worth per micro-batch, as the loop would count them. */
Test(steady, step_time_counts_grow_per_micro_batch)
{
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load("h200", &err);
    cr_assert_not_null(p, "h200: %s", err.msg);
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    vp_gpu_hw(p, VP_GPU_BF16, &hw);
    vp_hw_fill_defaults(&hw);
    vp_gpu_free(p);
    vp_graph *g = graph("models/gpt2-small.yaml", 1, 64);
    double casts[3], kern[3];
    static const uint32_t accs[3] = {1, 2, 9};
    for (int i = 0; i < 3; i++) {
        vp_setup s;
        vp_setup_init(&s);
        s.steps = 2;
        s.accum = accs[i];
        s.precision = VP_PREC_AMP_BF16;
        vp_step_time t;
        cr_assert_eq(vp_step_time_estimate(g, &s, &hw, &t, &err), VP_OK,
                     "%s", err.msg);
        casts[i] = t.host_casts * accs[i]; /* per micro-batch, reported */
        kern[i] = t.host_kernels * accs[i];
    }
    cr_assert_gt(casts[0], 0.0);
    /* the first micro-batch, then one more per micro-batch */
    cr_expect_float_eq(casts[2], casts[0] + 8 * (casts[1] - casts[0]), 1e-6,
                       "casts %.1f %.1f %.1f", casts[0], casts[1], casts[2]);
    cr_expect_float_eq(kern[2], kern[0] + 8 * (kern[1] - kern[0]), 1e-6,
                       "kernels %.1f %.1f %.1f", kern[0], kern[1], kern[2]);
    vp_graph_free(g);
}

/* The fine-tuning setups reach the steady state (the comparisons above
 * are of the closed form, not of two loops): 2^32 - 1 micro-batches of
 * LoRA under checkpointing and of QLoRA with paged 8-bit AdamW cost what
 * a few cost. */
Test(steady, lora_accumulation_is_closed_form, .timeout = 20)
{
    vp_graph *g = graph("tests/data/good/hf-llama.json", 2, 32);
    vp_error err;
    bool ck[256];
    cr_assert_eq(vp_graph_checkpoint_select(g, "all", ck, &err), VP_OK);
    for (int q = 0; q < 2; q++) {
        vp_setup s;
        vp_setup_init(&s);
        s.steps = 1;
        s.precision = VP_PREC_AMP_BF16;
        s.ft.base_dtype = VP_BASE_BF16;
        s.checkpoint = q ? NULL : ck;
        lora_spec(&s, "r=8,targets=q_proj,v_proj,dropout=0.1");
        if (q) {
            s.ft.quant = VP_QUANT_NF4;
            s.optimizer = VP_OPT_PAGED_ADAMW_8BIT;
        }
        vp_estimate e3, e4, big;
        s.accum = 3;
        cr_assert_eq(vp_simulate(g, &s, &e3, NULL, NULL, &err), VP_OK, "%s",
                     err.msg);
        s.accum = 4;
        cr_assert_eq(vp_simulate(g, &s, &e4, NULL, NULL, &err), VP_OK, "%s",
                     err.msg);
        s.accum = UINT32_MAX;
        clock_t t0 = clock();
        cr_assert_eq(vp_simulate(g, &s, &big, NULL, NULL, &err), VP_OK, "%s",
                     err.msg);
        double cpu = (double)(clock() - t0) / CLOCKS_PER_SEC;
        uint64_t per = e4.events - e3.events;
        cr_expect_gt(per, 0);
        cr_expect_eq(big.events, e4.events + (uint64_t)(UINT32_MAX - 4) * per);
        cr_expect_eq(big.peak_alloc, e4.peak_alloc);
        cr_expect_eq(big.paged_bytes, e4.paged_bytes);
        cr_expect_lt(cpu, 5.0, "%.2f s", cpu);
    }
    vp_graph_free(g);
}

/* The step loop's steady state (src/sim.c steps_repeat): from step 3 on,
 * a step that starts where the one before started repeats it; the
 * estimate is the loop's for every step count, with accumulation,
 * checkpointing, offload and expandable segments. */
Test(steady, steps_match_the_loop)
{
    bool ck[256];
    vp_graph *g = gpt2_checkpointed(ck);
    for (uint32_t steps = 3; steps <= VP_MAX_STEPS; steps += 13) {
        for (int p = 0; p < VP_PREC__COUNT; p++) {
            vp_setup s;
            vp_setup_init(&s);
            s.steps = steps;
            s.precision = (vp_precision)p;
            same_as_loop(g, &s);
            s.accum = 3;
            s.checkpoint = ck;
            same_as_loop(g, &s);
            s.offload_activations = true;
            s.alloc.expandable_segments = true;
            s.set_to_none = false;
            same_as_loop(g, &s);
        }
    }
    vp_graph_free(g);
}

Test(steady, steps_of_mlp10_and_resnet50_match_the_loop)
{
    const char *models[] = {"models/mlp10.yaml", "models/resnet50.yaml"};
    for (int m = 0; m < 2; m++) {
        vp_graph *g = graph(models[m], 2, 64);
        for (uint32_t steps = 3; steps <= 6; steps++) {
            vp_setup s;
            vp_setup_init(&s);
            s.steps = steps;
            s.batch = 2;
            same_as_loop(g, &s);
            s.inference = true;
            same_as_loop(g, &s);
        }
        vp_graph_free(g);
    }
}

/* Best CPU time of three simulations. */
static double best_cpu(vp_graph *g, const vp_setup *s, vp_estimate *e)
{
    double best = 1e30;
    vp_error err;
    for (int r = 0; r < 3; r++) {
        clock_t t0 = clock();
        cr_assert_eq(vp_simulate(g, s, e, NULL, NULL, &err), VP_OK);
        double t = (double)(clock() - t0) / CLOCKS_PER_SEC;
        if (t < best)
            best = t;
    }
    return best;
}

/* Events grow by one step's worth per step once steps repeat, the last
 * step's figures are the repeated step's, and the most steps cost about
 * what four do (the steps after the steady state are not simulated: the
 * loop would take four times as long). */
Test(steady, steps_after_the_steady_state_are_closed_form, .timeout = 60)
{
    vp_graph *g = graph("models/gpt2-small.yaml", 4, 256);
    vp_setup s;
    vp_setup_init(&s);
    vp_estimate *e = calloc(VP_MAX_STEPS + 1, sizeof *e);
    cr_assert_not_null(e);
    vp_error err;
    for (uint32_t n = 4; n < VP_MAX_STEPS; n++) {
        s.steps = n;
        cr_assert_eq(vp_simulate(g, &s, &e[n], NULL, NULL, &err), VP_OK);
    }
    s.steps = 4;
    double t4 = best_cpu(g, &s, &e[4]);
    s.steps = VP_MAX_STEPS;
    double t16 = best_cpu(g, &s, &e[VP_MAX_STEPS]);
    uint64_t per = e[5].events - e[4].events;
    cr_assert_gt(per, 0);
    for (uint32_t n = 5; n <= VP_MAX_STEPS; n++) {
        cr_expect_eq(e[n].events, e[4].events + (n - 4) * per);
        cr_expect(memcmp(&e[n].step[n - 1], &e[4].step[3],
                         sizeof e[4].step[3]) == 0, "step %u", n);
    }
    cr_expect_lt(t16, 2 * t4, "%u steps %.4f s, 4 steps %.4f s",
                 VP_MAX_STEPS, t16, t4);
    free(e);
    vp_graph_free(g);
}
