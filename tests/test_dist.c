/* The per-rank simulation of PyTorch's data-parallel wrappers
 * (vp_simulate_ranks, dist.h) on tests/data/dist/tiny-gpt.yaml, whose
 * parameters are counted in its description: P = 110336 in all, PU = 49984
 * in one layer (an FSDP unit), PR = 10368 in the root unit (word and
 * position embeddings 8192 + 2048, final norm 128; the head is tied).
 *
 * Each test compares a wrapper's run with the same case on one GPU (or
 * another wrapper) and checks the bytes its source adds, derived from the
 * rules of docs/DISTRIBUTED.md and the caching allocator's rounding of a
 * small block to a multiple of 512 B:
 *
 *   DDP's buckets (Reducer::initialize_buckets): one fp32 bucket for 4 P =
 *   441344 B (under bucket_cap_mb's 25 MiB), a multiple of 512;
 *   the parameters' .grad (4 B each, one tensor a parameter): the same
 *   blocks as the fp32 weights, W1 = after_model on one GPU;
 *   FSDP1's flat parameter, one a unit, sharded into `world` equal chunks
 *   (FlatParamHandle._get_shard pads the flat parameter to a multiple of
 *   the world): ceil(numel / world) fp32 elements a rank. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/vramplan.h"

#define P 110336ull
#define PU 49984ull
#define PR 10368ull
#define MODEL "tests/data/dist/tiny-gpt.yaml"

static uint64_t r512(uint64_t b) { return (b + 511) / 512 * 512; }

static vp_graph *tiny(void)
{
    vp_error err;
    vp_model *m = vp_model_load(MODEL, &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, 2, 32, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_model_free(m);
    return g;
}

/* The case on one GPU. */
static vp_estimate one_gpu(void)
{
    vp_graph *g = tiny();
    vp_setup s;
    vp_estimate e;
    vp_error err;
    vp_setup_init(&s);
    cr_assert_eq(vp_simulate(g, &s, &e, NULL, NULL, &err), VP_OK, "%s",
                 err.msg);
    vp_graph_free(g);
    return e;
}

/* Every role of the run; *n of them. */
static vp_rank_estimate *roles(const vp_dist *d, size_t *n, size_t *worst)
{
    vp_graph *g = tiny();
    vp_setup s;
    vp_rank_estimate *r = NULL;
    vp_error err;
    vp_setup_init(&s);
    s.dist = d;
    cr_assert_eq(vp_simulate_ranks(g, &s, &r, n, worst, &err), VP_OK, "%s",
                 err.msg);
    vp_graph_free(g);
    return r;
}

/* The run's first role, with world ranks of strategy st. */
static vp_estimate rank0(vp_dist_strategy st, uint32_t world, bool held)
{
    vp_dist d;
    size_t n, w;
    vp_dist_init(&d);
    d.strategy = st;
    d.world = world;
    d.rebuild_held = held;
    vp_rank_estimate *r = roles(&d, &n, &w);
    vp_estimate e = r[0].est;
    free(r);
    return e;
}

static uint64_t fwd(const vp_estimate *e, int step)
{
    return e->step[step - 1].peak[VP_PHASE_FORWARD];
}

static uint64_t opt(const vp_estimate *e, int step)
{
    return e->step[step - 1].peak[VP_PHASE_OPTIMIZER];
}

/* ---- DDP ------------------------------------------------------------- */

Test(dist_ddp, buckets_exist_from_construction)
{
    vp_estimate one = one_gpu();
    cr_assert_eq(P * 4 % 512, 0);
    for (int bv = 0; bv < 2; bv++) {
        vp_estimate e = rank0(bv ? VP_DIST_DDP_BUCKET_VIEW : VP_DIST_DDP, 2,
                              true);
        cr_assert_eq(e.after_model, one.after_model + 4 * P);
    }
}

Test(dist_ddp, bucket_view_makes_no_grad_tensors)
{
    /* at the optimizer step every .grad exists: beside the buckets
     * without views (one block a parameter, as the weights'), in them with */
    vp_estimate one = one_gpu();
    vp_estimate plain = rank0(VP_DIST_DDP, 2, true);
    vp_estimate view = rank0(VP_DIST_DDP_BUCKET_VIEW, 2, true);
    cr_assert_eq(opt(&plain, 1) - opt(&view, 1), one.after_model);
}

Test(dist_ddp, second_step_rebuild_holds_the_first_buckets)
{
    /* Reducer::rebuild_buckets in step 2's forward allocates the new
     * buckets (here one: 4 P < _DEFAULT_FIRST_BUCKET_BYTES); the rank that
     * still holds step 1's has 4 P more until the step ends */
    vp_estimate held = rank0(VP_DIST_DDP, 2, true);
    vp_estimate freed = rank0(VP_DIST_DDP, 2, false);
    cr_assert_eq(fwd(&held, 2) - fwd(&held, 3), 4 * P);
    cr_assert_eq(fwd(&freed, 2), fwd(&freed, 3));
    cr_assert_eq(fwd(&held, 3), fwd(&freed, 3));
    cr_assert_eq(held.peak_alloc - freed.peak_alloc, 4 * P);
}

Test(dist_ddp, states_are_replicated_whatever_the_world)
{
    vp_estimate w2 = rank0(VP_DIST_DDP, 2, true);
    vp_estimate w8 = rank0(VP_DIST_DDP, 8, true);
    cr_assert_eq(w2.peak_alloc, w8.peak_alloc);
    cr_assert_eq(w2.optim_bytes, one_gpu().optim_bytes);
}

Test(dist_ddp, zero_partition_splits_the_adam_state)
{
    /* ZeroRedundancyOptimizer: each rank holds the Adam state (two fp32
     * moments a parameter, one block each, and a step scalar) of its
     * own partition; the ranks' states add up to one GPU's */
    vp_dist d;
    size_t n, w;
    vp_dist_init(&d);
    d.strategy = VP_DIST_DDP_ZERO1;
    d.world = 2;
    vp_rank_estimate *r = roles(&d, &n, &w);
    cr_assert_eq(n, 2);
    cr_assert_eq(r[0].rank, 0);
    cr_assert_eq(r[1].rank, 1);
    cr_assert_eq(r[0].est.optim_bytes + r[1].est.optim_bytes,
                 one_gpu().optim_bytes);
    cr_assert_neq(r[0].est.optim_bytes, r[1].est.optim_bytes);
    /* the most loaded is the larger peak */
    cr_assert_geq(r[w].est.peak_alloc, r[1 - w].est.peak_alloc);
    free(r);
}

/* ---- FSDP1 ----------------------------------------------------------- */

Test(dist_fsdp1, flat_shards_padded_to_the_world)
{
    static const uint32_t worlds[] = {2, 4, 8};
    for (size_t i = 0; i < 3; i++) {
        uint64_t W = worlds[i];
        vp_estimate e = rank0(VP_DIST_FSDP_FULL, (uint32_t)W, true);
        uint64_t want = r512(4 * ((PR + W - 1) / W)) +
                        2 * r512(4 * ((PU + W - 1) / W));
        cr_assert_eq(e.after_model, want, "world %llu",
                     (unsigned long long)W);
        /* AdamW's two moments of the shard, one block a unit each */
        cr_assert_geq(e.optim_bytes, 2 * want);
    }
}

Test(dist_fsdp1, world_one_is_no_shard)
{
    /* FSDP1 at world 1 uses NO_SHARD: the flat parameter of each unit
     * whole, one block a unit */
    vp_estimate e = rank0(VP_DIST_FSDP_FULL, 1, true);
    cr_assert_eq(e.after_model, r512(4 * PR) + 2 * r512(4 * PU));
    vp_estimate g = rank0(VP_DIST_FSDP_GRAD_OP, 1, true);
    cr_assert_eq(g.peak_alloc, e.peak_alloc);
}

Test(dist_fsdp1, grad_op_keeps_the_gathered_units_through_the_backward)
{
    /* SHARD_GRAD_OP does not reshard after the forward: the forward ends
     * with every unit's unsharded flat parameter, FULL_SHARD with none */
    vp_estimate full = rank0(VP_DIST_FSDP_FULL, 2, true);
    vp_estimate op = rank0(VP_DIST_FSDP_GRAD_OP, 2, true);
    cr_assert_gt(fwd(&op, 1), fwd(&full, 1));
    cr_assert_eq(full.after_model, op.after_model);
}

/* ---- FSDP2 ----------------------------------------------------------- */

Test(dist_fsdp2, every_parameter_sharded_on_dim0)
{
    /* fully_shard: each parameter's own padded dim-0 chunk, one block
     * each; the ranks' shards add up to more than a W-th of the model (the
     * padding) and to less than one GPU's weights */
    vp_estimate one = one_gpu();
    vp_estimate w2 = rank0(VP_DIST_FSDP2, 2, true);
    vp_estimate w4 = rank0(VP_DIST_FSDP2, 4, true);
    cr_assert_geq(w2.after_model, 4 * P / 2);
    cr_assert_lt(w2.after_model, one.after_model);
    cr_assert_lt(w4.after_model, w2.after_model);
    cr_assert_eq(w2.optim_bytes, 2 * w2.after_model);
}

Test(dist_fsdp2, world_one_keeps_whole_parameters)
{
    /* a shard group of one rank: each parameter's shard is the whole of it,
     * one block each as on one GPU */
    vp_estimate e = rank0(VP_DIST_FSDP2, 1, true);
    cr_assert_eq(e.after_model, one_gpu().after_model);
}

Test(dist_roles, every_rank_is_in_one_role)
{
    static const vp_dist_strategy st[] = {
        VP_DIST_DDP, VP_DIST_DDP_ZERO1, VP_DIST_FSDP_FULL,
        VP_DIST_FSDP_GRAD_OP, VP_DIST_FSDP2};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        vp_dist d;
        vp_error err;
        uint32_t *ranks, *counts;
        size_t n;
        vp_dist_init(&d);
        d.strategy = st[i];
        d.world = 8;
        vp_graph *g = tiny();
        cr_assert_eq(vp_dist_roles(g, &d, &ranks, &counts, &n, &err), VP_OK,
                     "%s", err.msg);
        uint32_t total = 0;
        for (size_t k = 0; k < n; k++) {
            total += counts[k];
            cr_assert(k == 0 || ranks[k] > ranks[k - 1]);
        }
        cr_assert_eq(total, 8, "%s", vp_dist_strategy_name(st[i]));
        free(ranks);
        free(counts);
        vp_graph_free(g);
    }
}

Test(dist_roles, hsdp_mesh_must_divide_the_world)
{
    vp_dist d;
    vp_error err;
    uint32_t *ranks = NULL, *counts = NULL;
    size_t n;
    vp_dist_init(&d);
    d.strategy = VP_DIST_FSDP2;
    d.world = 8;
    d.shard = 3;
    vp_graph *g = tiny();
    cr_assert_eq(vp_dist_roles(g, &d, &ranks, &counts, &n, &err), VP_EARG);
    cr_assert_not_null(strstr(err.msg, "3"), "%s", err.msg);
    vp_graph_free(g);
}

/* What the wrappers do not model is refused by name, not simulated as
 * one GPU's run: generate() and fine-tuning setups (frozen parameters,
 * LoRA, a quantized base). */
static vp_status refused(vp_setup *s, vp_error *err)
{
    vp_dist d;
    vp_rank_estimate *r = NULL;
    size_t n, w;
    vp_dist_init(&d);
    d.strategy = VP_DIST_DDP;
    d.world = 2;
    s->dist = &d;
    vp_graph *g = tiny();
    vp_status st = vp_simulate_ranks(g, s, &r, &n, &w, err);
    vp_graph_free(g);
    free(r);
    return st;
}

Test(dist_roles, generate_is_refused)
{
    vp_setup s;
    vp_error err;
    vp_setup_init(&s);
    cr_assert_eq(vp_generate_parse("prompt=8,new=2", &s.generate, &err),
                 VP_OK, "%s", err.msg);
    s.seq = s.generate.prompt;
    cr_assert_eq(refused(&s, &err), VP_EUNSUPPORTED, "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "generate()"), "%s", err.msg);
}

Test(dist_roles, fine_tuning_is_refused)
{
    vp_setup s;
    vp_error err;
    vp_setup_init(&s);
    cr_assert_eq(vp_freeze_parse("embed", &s.ft, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(refused(&s, &err), VP_EUNSUPPORTED, "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "frozen parameters"), "%s", err.msg);
}
