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

Test(steady, gpt2_checkpointed_and_expandable_match_the_loop)
{
    vp_graph *g = graph("models/gpt2-small.yaml", 1, 64);
    vp_error err;
    bool ck[256];
    cr_assert_leq(vp_graph_segment_count(g), 256);
    cr_assert_eq(vp_graph_checkpoint_select(g, "all", ck, &err), VP_OK);
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
