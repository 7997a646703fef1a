/* The wrappers' knobs, one behaviour each (issue 11's lists; the table in
 * docs/DISTRIBUTED.md, "Knobs", names each knob's test here), on
 * tests/data/dist/tiny-gpt.yaml: P = 110336 parameters, 28 tensors (12 a
 * layer, word and position embeddings, the final norm's weight and bias
 * of 64 each; the head is tied), PU = 49984 in a layer.
 *
 * Every figure is derived from the rule's source (cited at each test) and
 * the caching allocator's rounding of a small block to 512 B, never read
 * back from a run. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/vramplan.h"

#define P 110336ull
#define PU 49984ull
#define PR 10368ull
#define TENSORS 28u
#define MODEL "tests/data/dist/tiny-gpt.yaml"
/* tiny-llama: rotary positions, whose inv_freq buffer is 8 fp32 values */
#define LLAMA "tests/data/dist/tiny-llama.yaml"
#define BUFFER_BYTES 32u
/* tiny-odd: tensors that are not all multiples of 16 B (its description
 * lists them in module order) */
#define ODD "tests/data/dist/tiny-odd.yaml"

static uint64_t r512(uint64_t b) { return (b + 511) / 512 * 512; }

static vp_graph *load(const char *path)
{
    vp_error err;
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, 2, 32, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_model_free(m);
    return g;
}

static vp_graph *tiny(void)
{
    return load(MODEL);
}

/* The allocations one run makes under an op name, in one step. */
#define MAX_SEEN 64
typedef struct seen {
    const char *op;
    uint32_t step;
    int phase;               /* a vp_phase, or -1: any                     */
    uint64_t bytes[MAX_SEEN];
    size_t n;
    /* the most bytes alive at once of those allocations (of category
     * `cat` when live_cat is set) */
    bool live_cat;
    vp_category cat;
    uint64_t ids[MAX_SEEN], sizes[MAX_SEEN];
    size_t n_live;
    uint64_t live, most;
} seen;

static void track(seen *s, const vp_sim_event *ev)
{
    if (ev->is_free) {
        for (size_t i = 0; i < s->n_live; i++)
            if (s->ids[i] == ev->tensor) {
                s->live -= s->sizes[i];
                s->ids[i] = s->ids[s->n_live - 1];
                s->sizes[i] = s->sizes[--s->n_live];
                return;
            }
        return;
    }
    if (strcmp(ev->op, s->op) != 0 || (s->live_cat && ev->category != s->cat))
        return;
    cr_assert_lt(s->n_live, MAX_SEEN);
    s->ids[s->n_live] = ev->tensor;
    s->sizes[s->n_live++] = ev->bytes;
    s->live += ev->bytes;
    if (ev->step == s->step && (s->phase < 0 || (int)ev->phase == s->phase) &&
        s->live > s->most)
        s->most = s->live;
}

static void on_event(const vp_sim_event *ev, void *ud)
{
    seen *s = ud;
    track(s, ev);
    if (ev->is_free || ev->step != s->step || strcmp(ev->op, s->op) != 0 ||
        (s->phase >= 0 && (int)ev->phase != s->phase))
        return;
    cr_assert_lt(s->n, MAX_SEEN);
    s->bytes[s->n++] = ev->bytes;
}

/* A watch of op's allocations in step (any phase). */
static seen watch(const char *op, uint32_t step)
{
    seen s;
    memset(&s, 0, sizeof s);
    s.op = op;
    s.step = step;
    s.phase = -1;
    return s;
}

static void expect_bytes(const seen *s, const uint64_t *want, size_t n)
{
    cr_assert_eq(s->n, n, "%s: %zu allocations", s->op, s->n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(s->bytes[i], want[i], "%s #%zu: %llu", s->op, i,
                     (unsigned long long)s->bytes[i]);
}

/* Rank d->rank of the run (checkpointing every layer when ckpt), and
 * what it allocates under `watch` (may be NULL). */
static vp_estimate run_on(const char *path, const vp_dist *d,
                          vp_precision prec, bool ckpt, seen *watch)
{
    vp_graph *g = load(path);
    vp_setup s;
    vp_estimate e;
    vp_error err;
    bool ck[8] = {false};
    vp_setup_init(&s);
    s.dist = d;
    s.precision = prec;
    if (ckpt) {
        cr_assert_leq(vp_graph_segment_count(g), 8);
        vp_graph_default_checkpoint(g, ck);
        s.checkpoint = ck;
        s.n_checkpoint = vp_graph_segment_count(g);
    }
    cr_assert_eq(vp_simulate(g, &s, &e, watch ? on_event : NULL, watch,
                             &err),
                 VP_OK, "%s", err.msg);
    vp_graph_free(g);
    return e;
}

static vp_estimate run(const vp_dist *d, vp_precision prec, bool ckpt,
                       seen *watch)
{
    return run_on(MODEL, d, prec, ckpt, watch);
}

static vp_dist ddp(uint32_t world)
{
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = VP_DIST_DDP;
    d.world = world;
    return d;
}

static uint64_t sum(const seen *s)
{
    uint64_t t = 0;
    for (size_t i = 0; i < s->n; i++)
        t += s->bytes[i];
    return t;
}

/* ---- DDP (torch/csrc/distributed/c10d/reducer.cpp) --------------------- */

Test(dist_knobs, first_bucket_cap_takes_the_first_ready_gradient_alone)
{
    /* compute_bucket_assignment_by_size in rebuild_buckets: a bucket closes
     * at the first parameter that brings it to its limit; the limits are
     * [first_bucket, bucket_cap, bucket_cap...]. With a 1-byte first
     * limit the first rebuilt bucket is the first gradient to become
     * ready, the final norm's (64 fp32 elements: 256 B); an unbounded
     * second limit takes the rest. The first iteration's single bucket
     * (initialize_buckets, no limit) was made at construction. */
    vp_dist d = ddp(2);
    d.first_bucket = 1;
    d.bucket_cap = UINT64_MAX;
    seen s = watch("ddp buckets", 2);
    run(&d, VP_PREC_FP32, false, &s);
    cr_assert_eq(s.n, 2);
    cr_assert_eq(s.bytes[0], 64 * 4);
    cr_assert_eq(s.bytes[1], 4 * P - 64 * 4);
    seen first = watch("ddp buckets", 0);
    run(&d, VP_PREC_FP32, false, &first);
    cr_assert_eq(first.n, 1);
    cr_assert_eq(first.bytes[0], 4 * P);
}

Test(dist_knobs, bucket_cap_of_one_byte_buckets_every_tensor_alone)
{
    /* the same rule with every limit at one byte: one bucket a tensor */
    vp_dist d = ddp(2);
    d.first_bucket = 1;
    d.bucket_cap = 1;
    seen s = watch("ddp buckets", 2);
    run(&d, VP_PREC_FP32, false, &s);
    cr_assert_eq(s.n, TENSORS);
    cr_assert_eq(sum(&s), 4 * P);
}

Test(dist_knobs, static_graph_rebuilds_like_the_default)
{
    /* Reducer::should_rebuild_buckets: (static_graph_ ||
     * !find_unused_parameters_) && !has_rebuilt_bucket_: with the default
     * find_unused_parameters=False the static graph changes nothing in
     * the buckets' memory */
    vp_dist a = ddp(2), b = ddp(2);
    b.static_graph = true;
    seen sa = watch("ddp buckets", 2);
    seen sb = watch("ddp buckets", 2);
    vp_estimate ea = run(&a, VP_PREC_FP32, false, &sa);
    vp_estimate eb = run(&b, VP_PREC_FP32, false, &sb);
    cr_assert_eq(sa.n, 1);
    cr_assert_eq(sb.n, 1);
    cr_assert_eq(ea.peak_alloc, eb.peak_alloc);
}

Test(dist_knobs, find_unused_parameters_never_rebuilds)
{
    /* should_rebuild_buckets is false with find_unused_parameters and no
     * static graph: the buckets made at construction ([1 MiB, 25 MiB] over
     * the parameters in reverse order; here one, 4 P < 1 MiB) stay */
    vp_dist d = ddp(2);
    d.find_unused = true;
    seen s = watch("ddp buckets", 2);
    vp_estimate e = run(&d, VP_PREC_FP32, false, &s);
    cr_assert_eq(s.n, 0);
    cr_assert_eq(e.step[1].peak[VP_PHASE_FORWARD],
                 e.step[2].peak[VP_PHASE_FORWARD]);
}

Test(dist_knobs, overlap_with_ddp_splits_the_state_by_bucket)
{
    /* ddp_zero_hook.py, _assign_bucket_subset_to_rank: each rebuilt bucket
     * to the rank with the fewest elements; the ranks' AdamW states (two
     * fp32 moments a parameter, each its own block, and the step scalars)
     * add up to one GPU's; the first step's optimizer.step() makes none */
    vp_dist one = ddp(1);
    vp_estimate whole = run(&one, VP_PREC_FP32, false, NULL);
    uint64_t total = 0;
    for (uint32_t r = 0; r < 2; r++) {
        vp_dist d = ddp(2);
        d.strategy = VP_DIST_DDP_ZERO1;
        d.overlap_with_ddp = true;
        d.first_bucket = 1;
        d.bucket_cap = 1;
        d.rank = r;
        vp_estimate e = run(&d, VP_PREC_FP32, false, NULL);
        total += e.optim_bytes;
        cr_assert_lt(e.optim_bytes, whole.optim_bytes);
    }
    cr_assert_eq(total, whole.optim_bytes);
}

Test(dist_knobs, broadcast_buffers_flattens_the_buffers_before_each_forward)
{
    /* distributed.py, _pre_forward -> _sync_buffers ->
     * _default_broadcast_coalesced: the buffers (module.buffers(), the
     * non-persistent inv_freq too) copied into one flat tensor before every
     * forward; broadcast_buffers=False skips it */
    for (uint32_t step = 1; step <= 4; step++) {
        for (int on = 0; on < 2; on++) {
            vp_dist d = ddp(2);
            d.broadcast_buffers = on;
            seen s = watch("ddp _sync_buffers", step);
            run_on(LLAMA, &d, VP_PREC_FP32, false, &s);
            cr_assert_eq(s.n, (size_t)on, "step %u", step);
            cr_assert(!on || s.bytes[0] == BUFFER_BYTES);
        }
    }
}

/* ---- FSDP1 (torch/distributed/fsdp/) ---------------------------------- */

Test(dist_knobs, hybrid_shard_is_full_shard_within_its_group)
{
    /* HYBRID_SHARD on [replicate, shard]: FULL_SHARD over the shard group
     * (_init_process_group_state_for_hybrid_shard), the reduced shard
     * all-reduced in place across the replicas */
    vp_dist h, f;
    vp_dist_init(&h);
    vp_dist_init(&f);
    h.strategy = VP_DIST_FSDP_HYBRID;
    h.world = 4;
    h.shard = 2;
    f.strategy = VP_DIST_FSDP_FULL;
    f.world = 2;
    vp_estimate eh = run(&h, VP_PREC_FP32, false, NULL);
    vp_estimate ef = run(&f, VP_PREC_FP32, false, NULL);
    cr_assert_eq(eh.after_model, r512(4 * ((PR + 1) / 2)) + 2 * r512(4 * (PU / 2)));
    cr_assert_eq(eh.after_model, ef.after_model);
    cr_assert_eq(eh.peak_alloc, ef.peak_alloc);
}

Test(dist_knobs, no_shard_keeps_each_flat_parameter_whole)
{
    /* NO_SHARD at any world: one flat parameter a unit, whole */
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = VP_DIST_FSDP_NO_SHARD;
    d.world = 4;
    vp_estimate e = run(&d, VP_PREC_FP32, false, NULL);
    cr_assert_eq(e.after_model, r512(4 * PR) + 2 * r512(4 * PU));
}

/* FSDP1 FULL_SHARD at world 2 in fp32 (no MixedPrecision: the unsharded
 * flat parameter is the only "fsdp unshard" allocation, category PARAM):
 * a layer's padded unsharded flat parameter is 2 x ceil(PU / 2) x 4 B, the
 * root's 2 x ceil(PR / 2) x 4 B; the root stays unsharded from the forward
 * to the end of the backward (_reshard skips the root after the forward). */
#define LAYER_FLAT (2 * ((PU + 1) / 2) * 4)
#define ROOT_FLAT (2 * ((PR + 1) / 2) * 4)

static uint64_t most_unsharded(vp_dist *d, vp_phase ph)
{
    seen s = watch("fsdp unshard", 1);
    s.phase = (int)ph;
    s.live_cat = true;
    s.cat = VP_CAT_PARAM;
    run(d, VP_PREC_FP32, false, &s);
    return s.most;
}

static vp_dist fsdp1(void)
{
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = VP_DIST_FSDP_FULL;
    d.world = 2;
    return d;
}

Test(dist_knobs, forward_prefetch_gathers_the_next_layer_with_the_current)
{
    /* _runtime_utils.py, _pre_forward -> _prefetch_handle(FORWARD) with
     * forward_prefetch: the next unit's all-gather is issued in the current
     * unit's pre-forward */
    vp_dist d = fsdp1();
    cr_assert_eq(most_unsharded(&d, VP_PHASE_FORWARD), ROOT_FLAT + LAYER_FLAT);
    d.forward_prefetch = true;
    cr_assert_eq(most_unsharded(&d, VP_PHASE_FORWARD),
                 ROOT_FLAT + 2 * LAYER_FLAT);
}

Test(dist_knobs, backward_prefetch_pre_holds_two_layers_post_and_none_one)
{
    /* BACKWARD_PRE: the next unit's all-gather in the current unit's
     * pre-backward hook (_pre_backward_hook -> _prefetch_handle), so two
     * layers are unsharded at once; BACKWARD_POST issues it in the
     * post-backward hook after the current unit is resharded; NONE never */
    vp_dist d = fsdp1();
    cr_assert_eq(most_unsharded(&d, VP_PHASE_BACKWARD),
                 ROOT_FLAT + 2 * LAYER_FLAT);
    d.backward_prefetch = VP_PREFETCH_POST;
    cr_assert_eq(most_unsharded(&d, VP_PHASE_BACKWARD), ROOT_FLAT + LAYER_FLAT);
    d.backward_prefetch = VP_PREFETCH_NONE;
    cr_assert_eq(most_unsharded(&d, VP_PHASE_BACKWARD), ROOT_FLAT + LAYER_FLAT);
}

Test(dist_knobs, use_orig_params_aligns_every_parameter_to_16_bytes)
{
    /* FlatParamHandle._init_flat_param_and_metadata with use_orig_params:
     * padding before each parameter to _get_aligned_numel (16 B: 4 fp32
     * elements). tiny-odd's layer, in module order (66, 66, 13068, 198,
     * 4356, 66, 66, 66, 8580, 130, 8580, 66: 35308 elements), pads before
     * the 2nd, 3rd, 5th, 7th, 8th, 9th and 11th tensors, 2 elements each:
     * 35322; the root (wte 8382, wpe 2112, the final norm 66 + 66: 10626)
     * before wpe and the norm's bias: 10630. flatten_tensors allocates the
     * flat parameter, layers first, then the root. */
    vp_dist d = fsdp1();
    seen plain = watch("fsdp flatten_tensors", 0);
    run_on(ODD, &d, VP_PREC_FP32, false, &plain);
    const uint64_t raw[] = {4 * 35308, 4 * 10626};
    expect_bytes(&plain, raw, 2);
    d.use_orig_params = true;
    seen orig = watch("fsdp flatten_tensors", 0);
    run_on(ODD, &d, VP_PREC_FP32, false, &orig);
    const uint64_t aligned[] = {4 * 35322, 4 * 10630};
    expect_bytes(&orig, aligned, 2);
}

/* FSDP1 MixedPrecision at world 2: a layer's shard is ceil(PU / 2) = 24992
 * fp32 elements, the root's 5184 (PU and PR are even). */
#define L1 ((PU + 1) / 2)
#define R1 ((PR + 1) / 2)

Test(dist_knobs, fsdp1_unshard_casts_the_shard_to_param_dtype_first)
{
    /* _unshard: _use_low_precision_shard casts the fp32 shard to
     * param_dtype on the pre-unshard stream, then
     * _alloc_padded_unsharded_flat_param (world x the shard, param_dtype)
     * on the unshard stream; the forward's order: the root, the layers */
    vp_dist d = fsdp1();
    d.param_dtype = VP_MP_BF16;
    seen un = watch("fsdp unshard", 1);
    un.phase = VP_PHASE_FORWARD;
    run(&d, VP_PREC_FP32, false, &un);
    const uint64_t want[] = {R1 * 2, 2 * R1 * 2, L1 * 2, 2 * L1 * 2,
                             L1 * 2, 2 * L1 * 2};
    expect_bytes(&un, want, 6);
}

Test(dist_knobs, fsdp1_reduce_scatter_in_reduce_dtype_then_param_dtype)
{
    /* _post_backward_hook: the flat gradient cast to reduce_dtype when it
     * differs (world x the shard); _reduce_grad: the reduce-scatter output
     * (the shard, reduce_dtype), cast to the parameters' fp32 by
     * _cast_grad_to_param_dtype when reduce_dtype is narrower; the
     * backward's order: the layers last to first, then the root */
    for (int fp32 = 0; fp32 < 2; fp32++) {
        vp_dist d = fsdp1();
        d.param_dtype = VP_MP_BF16;
        d.reduce_dtype = fp32 ? VP_MP_FP32 : VP_MP_BF16;
        seen rs = watch("fsdp reduce_scatter", 1);
        run(&d, VP_PREC_FP32, false, &rs);
        if (fp32) {
            const uint64_t want[] = {2 * L1 * 4, L1 * 4, 2 * L1 * 4, L1 * 4,
                                     2 * R1 * 4, R1 * 4};
            expect_bytes(&rs, want, 6);
        } else {
            const uint64_t want[] = {L1 * 2, L1 * 4, L1 * 2, L1 * 4,
                                     R1 * 2, R1 * 4};
            expect_bytes(&rs, want, 6);
        }
    }
}

/* ---- FSDP2 (torch/distributed/fsdp/_fully_shard/) ---------------------- */

static vp_dist fsdp2(uint32_t world, int32_t raf)
{
    vp_dist d;
    vp_dist_init(&d);
    d.strategy = VP_DIST_FSDP2;
    d.world = world;
    d.param_dtype = VP_MP_BF16;
    d.reduce_dtype = VP_MP_FP32;
    d.reshard_after_forward = raf;
    return d;
}

/* tiny-gpt at world 2: every dim 0 is even, so a layer's padded shard is
 * PU / 2 = 24992 elements and the root's PR / 2 = 5184. */
#define LSH (PU / 2)
#define RSH (PR / 2)

Test(dist_knobs, all_gather_copy_in_and_out_in_param_dtype)
{
    /* foreach_all_gather (_fsdp_collectives.py): the shards cast into one
     * flat input (sum of padded shards x param_dtype), the output world x
     * that; forward order: the root, then the layers; no forward prefetch
     * (only explicit). foreach_all_gather_copy_out: every unsharded
     * parameter, P elements in bf16 over the forward. */
    vp_dist d = fsdp2(2, 1);
    seen ag = watch("fsdp2 all_gather", 1), out = watch("fsdp2 copy_out", 1);
    ag.phase = out.phase = VP_PHASE_FORWARD;
    run(&d, VP_PREC_FP32, false, &ag);
    run(&d, VP_PREC_FP32, false, &out);
    const uint64_t want[] = {RSH * 2, 2 * RSH * 2, LSH * 2, 2 * LSH * 2,
                             LSH * 2, 2 * LSH * 2};
    expect_bytes(&ag, want, 6);
    cr_assert_eq(sum(&out), 2 * P);
}

Test(dist_knobs, reduce_scatter_buffers_in_reduce_dtype)
{
    /* foreach_reduce: the reduce-scatter input (world x the padded shard,
     * reduce_dtype), the output (the shard, reduce_dtype), cast back to the
     * parameters' fp32 when reduce_dtype differs (_to_dtype_if_needed);
     * the backward's order: the layers last to first, then the root */
    for (int bf = 0; bf < 2; bf++) {
        vp_dist d = fsdp2(2, 1);
        d.reduce_dtype = bf ? VP_MP_BF16 : VP_MP_FP32;
        seen rs = watch("fsdp2 reduce_scatter", 1);
        run(&d, VP_PREC_FP32, false, &rs);
        if (!bf) {
            const uint64_t want[] = {2 * LSH * 4, LSH * 4, 2 * LSH * 4,
                                     LSH * 4,     2 * RSH * 4, RSH * 4};
            expect_bytes(&rs, want, 6);
        } else {
            const uint64_t want[] = {2 * LSH * 2, LSH * 2, LSH * 4,
                                     2 * LSH * 2, LSH * 2, LSH * 4,
                                     2 * RSH * 2, RSH * 2, RSH * 4};
            expect_bytes(&rs, want, 9);
        }
    }
}


Test(dist_knobs, output_dtype_casts_each_module_output_on_the_way)
{
    /* MixedPrecisionPolicy(param_dtype=bf16, output_dtype=fp32): a layer's
     * output [2, 32, 64] cast to fp32 (16384 B) after its forward, and its
     * gradient in fp32 before the layer's pre-backward hook; the root's
     * logits [2, 32, 128] (32768 B) after the forward, with no gradient
     * through them (the loss was computed inside the model). Forward: the
     * layers, then the root; backward: the layers last to first. */
    const uint64_t layer = 2 * 32 * 64 * 4, logits = 2 * 32 * 128 * 4;
    vp_dist d = fsdp2(2, 1);
    d.output_dtype = VP_MP_FP32;
    seen fwd = watch("fsdp2 cast_forward_outputs", 1);
    seen bwd = watch("fsdp2 cast_forward_outputs", 1);
    fwd.phase = VP_PHASE_FORWARD;
    bwd.phase = VP_PHASE_BACKWARD;
    vp_estimate e = run(&d, VP_PREC_FP32, false, &fwd);
    run(&d, VP_PREC_FP32, false, &bwd);
    const uint64_t want_fwd[] = {layer, layer, logits};
    const uint64_t want_bwd[] = {layer, layer};
    expect_bytes(&fwd, want_fwd, 3);
    expect_bytes(&bwd, want_bwd, 2);
    /* transients: nothing more is kept after the forward */
    vp_dist plain = fsdp2(2, 1);
    vp_estimate p = run(&plain, VP_PREC_FP32, false, NULL);
    cr_assert_eq(e.step[0].after_fwd, p.step[0].after_fwd);
    /* a cast to the activations' own dtype is no copy */
    d.output_dtype = VP_MP_BF16;
    seen none = watch("fsdp2 cast_forward_outputs", 1);
    run(&d, VP_PREC_FP32, false, &none);
    cr_assert_eq(none.n, 0);
}

Test(dist_knobs, reshard_after_forward_of_the_shard_group_is_true)
{
    /* _fsdp_init.py, _get_post_forward_mesh_info: an int equal to the
     * shard mesh size becomes True (1 becomes False) */
    vp_dist t = fsdp2(4, 1), n = fsdp2(4, 4), f = fsdp2(4, 0);
    vp_estimate et = run(&t, VP_PREC_FP32, false, NULL);
    vp_estimate en = run(&n, VP_PREC_FP32, false, NULL);
    vp_estimate ef = run(&f, VP_PREC_FP32, false, NULL);
    cr_assert_eq(en.peak_alloc, et.peak_alloc);
    cr_assert_eq(en.step[0].peak[VP_PHASE_FORWARD],
                 et.step[0].peak[VP_PHASE_FORWARD]);
    cr_assert_neq(en.peak_alloc, ef.peak_alloc);
}

Test(dist_knobs, reshard_after_forward_int_keeps_a_clone_of_each_parameter)
{
    /* FSDPParam.to_sharded_post_forward: after each forward (the root's
     * too) each parameter keeps all_gather_output.numel() / n of itself,
     * in param_dtype. At world 4 and n = 2: half of each parameter, 2 B an
     * element: numel bytes, one block each (every tiny-gpt dim 0 divides
     * by 4, so there is no padding). Per layer: 8 tensors of 256 B or
     * less (512 B blocks) and 12288 + 4096 + 16384 + 16384; the root: the
     * embeddings 8192 + 2048 and the final norm's two 512 B blocks. */
    const uint64_t layer = 8 * 512 + 12288 + 4096 + 16384 + 16384;
    const uint64_t root = 8192 + 2048 + 2 * 512;
    vp_dist two = fsdp2(4, 2), full = fsdp2(4, 1);
    vp_estimate e2 = run(&two, VP_PREC_FP32, false, NULL);
    vp_estimate et = run(&full, VP_PREC_FP32, false, NULL);
    cr_assert_eq(e2.step[0].after_fwd - et.step[0].after_fwd,
                 2 * layer + root);
}

Test(dist_knobs, hsdp_is_fsdp2_within_its_shard_group)
{
    /* fully_shard on a 2-D mesh [replicate, shard]: the parameters
     * sharded over the shard dim only, the reduce-scatter output
     * all-reduced in place across the replicas (foreach_reduce) */
    vp_dist h = fsdp2(4, 1), f = fsdp2(2, 1);
    h.shard = 2;
    vp_estimate eh = run(&h, VP_PREC_FP32, false, NULL);
    vp_estimate ef = run(&f, VP_PREC_FP32, false, NULL);
    cr_assert_eq(eh.after_model, ef.after_model);
    cr_assert_eq(eh.peak_alloc, ef.peak_alloc);
}

Test(dist_knobs, reshard_after_forward_must_divide_the_shard_group)
{
    /* an int that is not a factor of the shard mesh size is a ValueError */
    vp_dist d = fsdp2(4, 3);
    vp_graph *g = tiny();
    vp_setup s;
    vp_estimate e;
    vp_error err;
    vp_setup_init(&s);
    s.dist = &d;
    cr_assert_eq(vp_simulate(g, &s, &e, NULL, NULL, &err), VP_EARG);
    cr_assert_not_null(strstr(err.msg, "reshard_after_forward=3"), "%s",
                       err.msg);
    vp_graph_free(g);
}

Test(dist_knobs, checkpointing_under_fsdp2_saves_what_it_saves_on_one_gpu)
{
    /* non-reentrant checkpointing of every layer under fully_shard: the
     * activations the forward keeps shrink by exactly what they shrink by
     * on one GPU in the same dtype (the wrapper's buffers are the same
     * with and without it; the recomputation unshards nothing more:
     * the group is unsharded by its pre-backward hook) */
    vp_dist d = fsdp2(2, 1);
    vp_estimate plain = run(&d, VP_PREC_FP32, false, NULL);
    vp_estimate ck = run(&d, VP_PREC_FP32, true, NULL);
    vp_estimate one = run(NULL, VP_PREC_BF16, false, NULL);
    vp_estimate one_ck = run(NULL, VP_PREC_BF16, true, NULL);
    uint64_t saved_dist = plain.step[0].after_fwd - ck.step[0].after_fwd;
    uint64_t saved_one = one.step[0].after_fwd - one_ck.step[0].after_fwd;
    cr_assert_gt(saved_one, 0);
    cr_assert_eq(saved_dist, saved_one);
}

Test(dist_knobs, checkpointing_under_fsdp1_saves_what_it_saves_on_one_gpu)
{
    /* the same with FSDP1 FULL_SHARD and MixedPrecision(bf16): each
     * checkpointed layer's recomputation runs inside the unit's backward,
     * whose parameters the pre-backward hook has unsharded already */
    vp_dist d = fsdp1();
    d.param_dtype = VP_MP_BF16;
    vp_estimate plain = run(&d, VP_PREC_FP32, false, NULL);
    vp_estimate ck = run(&d, VP_PREC_FP32, true, NULL);
    vp_estimate one = run(NULL, VP_PREC_BF16, false, NULL);
    vp_estimate one_ck = run(NULL, VP_PREC_BF16, true, NULL);
    cr_assert_gt(one.step[0].after_fwd, one_ck.step[0].after_fwd);
    cr_assert_eq(plain.step[0].after_fwd - ck.step[0].after_fwd,
                 one.step[0].after_fwd - one_ck.step[0].after_fwd);
}

Test(dist_knobs, cpu_offload_keeps_no_shard_on_the_device)
{
    /* CPUOffloadPolicy: the sharded parameters and the optimizer state on
     * the host (FSDPParam with offload_to_cpu; the optimizer steps the CPU
     * shards): nothing of them on the device once wrapped */
    vp_dist d = fsdp2(2, 1);
    d.cpu_offload = true;
    vp_estimate e = run(&d, VP_PREC_FP32, false, NULL);
    cr_assert_eq(e.after_model, 0);
    cr_assert_eq(e.optim_bytes, 0);
}

/* ---- refused by name ----------------------------------------------------- */

/* A run refused with `code`, the knob named in the message. */
static void expect_error(const vp_dist *d, vp_status code, const char *knob)
{
    vp_graph *g = tiny();
    vp_setup s;
    vp_estimate e;
    vp_error err;
    vp_setup_init(&s);
    s.dist = d;
    cr_assert_eq(vp_simulate(g, &s, &e, NULL, NULL, &err), code, "%s",
                 err.msg);
    cr_assert_not_null(strstr(err.msg, knob), "%s", err.msg);
    vp_graph_free(g);
}

Test(dist_knobs, buffer_dtype_is_refused_not_ignored)
{
    vp_dist d = fsdp1();
    d.param_dtype = VP_MP_BF16;
    d.buffer_dtype = VP_MP_BF16;
    expect_error(&d, VP_EUNSUPPORTED, "buffer_dtype");
}

Test(dist_knobs, limit_all_gathers_false_is_refused_not_ignored)
{
    vp_dist d = fsdp1();
    d.limit_all_gathers = false;
    expect_error(&d, VP_EUNSUPPORTED, "limit_all_gathers=False");
}

Test(dist_knobs, a_knob_of_another_wrapper_is_an_error_naming_it)
{
    /* it would be ignored: DDP's knobs with FSDP, FSDP1's with DDP or
     * fully_shard */
    vp_dist a = fsdp2(2, 1);
    a.forward_prefetch = true;
    expect_error(&a, VP_EARG, "forward_prefetch");
    vp_dist b = fsdp1();
    b.static_graph = true;
    expect_error(&b, VP_EARG, "static_graph");
    vp_dist c = ddp(2);
    c.use_orig_params = true;
    expect_error(&c, VP_EARG, "use_orig_params");
    vp_dist e = fsdp2(2, 1);
    e.rebuild_held = false;
    expect_error(&e, VP_EARG, "rebuild_freed");
    vp_dist f = fsdp1();
    f.output_dtype = VP_MP_FP32;
    expect_error(&f, VP_EARG, "output_dtype");
}

Test(dist_knobs, output_dtype_without_param_dtype_is_refused)
{
    /* the next module casts its inputs back only with a param_dtype
     * (cast_forward_inputs): without, its fp32 weights would meet the cast
     * outputs */
    vp_dist d = fsdp2(2, 1);
    d.param_dtype = VP_MP_NONE;
    d.reduce_dtype = VP_MP_NONE;
    d.output_dtype = VP_MP_BF16;
    expect_error(&d, VP_EUNSUPPORTED, "output_dtype");
}
