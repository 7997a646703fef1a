/* DeepSpeed ZeRO 1/2/3 simulated per rank (src/dist_deepspeed.c,
 * docs/DISTRIBUTED.md "DeepSpeed ZeRO") on tests/data/dist/tiny-gpt.yaml:
 * P = 110336 trainable elements (test_dist.c counts them), bf16, DeepSpeed's
 * FusedAdam. Each test pins one rule of the engine's source by the
 * allocations it makes, read from the event stream (the engine's events
 * carry the names dist_deepspeed.c gives them) and computed here from the
 * graph's own parameter sizes:
 *   the flat bit16 group padded to nccl_start_alignment_factor (2) x world
 *   elements, its partition (aligned / world), the fp32 master and Adam's
 *   moments of the partition (stage_1_and_2.py __init__);
 *   the ipg buffer of reduce_bucket_size elements (two with overlap_comm)
 *   made at the backward's first gradient (setup_buckets);
 *   grads_in_partition: Σ numel of the params that meet the partition
 *   (copy_grads_in_partition);
 *   ZeRO-3's all-gathers (each param padded to the world,
 *   partition_parameters.py _aligned_size), persistence, the release of
 *   the first two steps (no trace yet) and the reuse distance of the
 *   third. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/validate.h"
#include "vramplan/vramplan.h"

#include "cli_golden.h"

#define P 110336ull
#define MODEL "tests/data/dist/tiny-gpt.yaml"

typedef struct {
    vp_sim_event *ev;
    size_t n, cap;
} events;

static void collect(const vp_sim_event *e, void *ud)
{
    events *E = ud;
    if (E->n == E->cap) {
        E->cap = E->cap ? 2 * E->cap : 4096;
        E->ev = realloc(E->ev, E->cap * sizeof *E->ev);
        cr_assert_not_null(E->ev);
    }
    E->ev[E->n] = *e;
    /* the engine's names are the library's; an op's dies with its graph */
    if (strncmp(e->op, "zero", 4) != 0)
        E->ev[E->n].op = "";
    E->n++;
}

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

static void ds_init(vp_dist *d, vp_dist_strategy st, uint32_t world,
                    uint32_t rank)
{
    vp_dist_init(d);
    d->strategy = st;
    d->world = world;
    d->rank = rank;
}

/* As validate sets up a rank line: after the scripts' warm-up, SDPA. */
static bool as_validate;
/* Every layer checkpointed. */
static bool ckpt_all;

/* One rank's run, its events in *E (NULL: none). */
static vp_estimate run(const vp_dist *d, uint32_t accum, events *E)
{
    vp_graph *g = tiny();
    vp_setup s;
    vp_estimate e;
    vp_error err;
    vp_setup_init(&s);
    if (as_validate) {
        s.fresh_process = false;
        s.attn = (vp_attn_impl)0; /* vp__case_attns' "sdpa" */
        s.attn_set = true;
        s.ft.load = VP_LOAD_FP32_CAST; /* built in fp32, cast by the engine */
    }
    s.precision = VP_PREC_BF16;
    s.optimizer = VP_OPT_ADAMW_FUSED;
    s.accum = accum;
    s.dist = d;
    bool all[64];
    cr_assert_leq(vp_graph_segment_count(g), 64);
    for (size_t k = 0; k < 64; k++)
        all[k] = true;
    if (ckpt_all) {
        s.checkpoint = all;
        s.n_checkpoint = vp_graph_segment_count(g);
    }
    cr_assert_eq(vp_simulate(g, &s, &e, E ? collect : NULL, E, &err), VP_OK,
                 "%s", err.msg);
    vp_graph_free(g);
    return e;
}

/* The allocations named `op` (requests, in order) into out; their count. */
static size_t allocs(const events *E, const char *op, uint32_t step,
                     uint64_t *out, size_t max)
{
    size_t k = 0;
    for (size_t i = 0; i < E->n; i++)
        if (!E->ev[i].is_free && strcmp(E->ev[i].op, op) == 0 &&
            (step == 0 || E->ev[i].step == step) && k < max)
            out[k++] = E->ev[i].bytes;
    return k;
}

/* The partition of rank r of w (get_partition_info): its size, the
 * elements of the params that meet it. */
static uint64_t partition(uint32_t w, uint32_t r, uint64_t *in_part)
{
    vp_graph *g = tiny();
    uint64_t n = 0;
    for (size_t p = 0; p < vp_graph_param_count(g); p++)
        n += vp_graph_param(g, p)->trainable ? vp_graph_param(g, p)->numel : 0;
    cr_assert_eq(n, P);
    uint64_t part = (P + 2 * w - 1) / (2 * w) * (2 * w) / w;
    uint64_t lo = part * r, hi = lo + part, at = 0;
    *in_part = 0;
    for (size_t p = 0; p < vp_graph_param_count(g); p++) {
        uint64_t e = at + vp_graph_param(g, p)->numel;
        if (vp_graph_param(g, p)->trainable && at < hi && e > lo)
            *in_part += vp_graph_param(g, p)->numel;
        at = vp_graph_param(g, p)->trainable ? e : at;
    }
    vp_graph_free(g);
    return part;
}

/* ---- ZeRO-1 and 2 ---------------------------------------------------- */

Test(dist_deepspeed, flat_group_padded_to_twice_the_world)
{
    static const uint32_t worlds[] = {1, 3, 7, 8};
    for (size_t i = 0; i < 4; i++) {
        uint32_t w = worlds[i];
        vp_dist d;
        ds_init(&d, VP_DIST_DS_ZERO1, w, 0);
        events E = {0};
        run(&d, 1, &E);
        uint64_t b[4], in;
        uint64_t part = partition(w, 0, &in);
        cr_assert_eq(allocs(&E, "zero bit16_groups_flat", 0, b, 4), 1);
        cr_assert_eq(b[0], 2 * part * w, "world %u", w);
        /* align_dense_tensors' zero pad, when the group does not divide */
        size_t npad = allocs(&E, "zero pad", 0, b, 4);
        cr_assert_eq(npad, part * w > P, "world %u", w);
        if (npad)
            cr_assert_eq(b[0], 2 * (part * w - P));
        free(E.ev);
    }
}

Test(dist_deepspeed, fp32_master_and_adam_of_the_partition_only)
{
    for (uint32_t w = 1; w <= 4; w++) {
        vp_dist d;
        ds_init(&d, VP_DIST_DS_ZERO2, w, 0);
        vp_estimate e = run(&d, 1, NULL);
        uint64_t in, part = partition(w, 0, &in);
        /* fp32 master (4) + exp_avg, exp_avg_sq (4 + 4), each a block
         * rounded to 512 B, + FusedAdam's 4-B step */
        uint64_t r = (part * 4 + 511) / 512 * 512;
        cr_assert_eq(e.optim_bytes, 3 * r + 512, "world %u", w);
    }
}

Test(dist_deepspeed, client_adamw_steps_the_fp32_partition)
{
    /* a client torch.optim.AdamW (foreach) wrapped by ZeRO: its one
     * temporary (_foreach_sqrt) is the fp32 partition's size */
    vp_graph *g = tiny();
    vp_dist d;
    ds_init(&d, VP_DIST_DS_ZERO2, 2, 0);
    uint64_t in, part = partition(2, 0, &in);
    vp_setup s;
    vp_estimate fused, foreach_;
    vp_error err;
    vp_setup_init(&s);
    s.precision = VP_PREC_BF16;
    s.dist = &d;
    s.optimizer = VP_OPT_ADAMW_FUSED;
    cr_assert_eq(vp_simulate(g, &s, &fused, NULL, NULL, &err), VP_OK, "%s",
                 err.msg);
    s.optimizer = VP_OPT_ADAMW;
    cr_assert_eq(vp_simulate(g, &s, &foreach_, NULL, NULL, &err), VP_OK,
                 "%s", err.msg);
    /* step 2 (the moments exist in both): the temporary on top, less
     * FusedAdam's device-side step count (a 512-B block) */
    cr_assert_eq(foreach_.step[1].peak[VP_PHASE_OPTIMIZER] + 512,
                 fused.step[1].peak[VP_PHASE_OPTIMIZER] +
                     (part * 4 + 511) / 512 * 512);
    s.optimizer = VP_OPT_SGD;
    cr_assert_eq(vp_simulate(g, &s, &foreach_, NULL, NULL, &err), VP_EARG);
    vp_graph_free(g);
}

Test(dist_deepspeed, ipg_buffer_at_the_first_gradient)
{
    for (int ov = 0; ov < 2; ov++) {
        vp_dist d;
        ds_init(&d, VP_DIST_DS_ZERO2, 2, 0);
        d.ds.reduce_bucket_size = 20000;
        d.ds.overlap_comm = ov;
        events E = {0};
        run(&d, 1, &E);
        uint64_t b[8];
        /* every step's backward makes them again (_release_ipg_buffers) */
        cr_assert_eq(allocs(&E, "zero ipg buffer", 1, b, 8), 1u + ov);
        cr_assert_eq(b[0], 2 * 20000ull);
        for (size_t i = 0; i < E.n; i++)
            if (strcmp(E.ev[i].op, "zero ipg buffer") == 0)
                cr_assert_eq(E.ev[i].phase, VP_PHASE_BACKWARD);
        free(E.ev);
    }
}

Test(dist_deepspeed, grads_in_partition_holds_whole_params)
{
    for (uint32_t r = 0; r < 3; r++) {
        vp_dist d;
        ds_init(&d, VP_DIST_DS_ZERO2, 3, r);
        events E = {0};
        run(&d, 1, &E);
        uint64_t b[8], in;
        partition(3, r, &in);
        cr_assert_eq(allocs(&E, "zero grads_in_partition", 1, b, 8), 1);
        cr_assert_eq(b[0], 2 * in, "rank %u", r);
        free(E.ev);
    }
}

Test(dist_deepspeed, last_rank_lists_zeros_for_its_padding)
{
    /* world 3: 110340 aligned, 4 elements of padding on rank 2 */
    uint64_t b[8];
    for (uint32_t r = 0; r < 3; r++) {
        vp_dist d;
        ds_init(&d, VP_DIST_DS_ZERO1, 3, r);
        events E = {0};
        run(&d, 1, &E);
        size_t n = allocs(&E, "zero partition padding", 1, b, 8);
        cr_assert_eq(n, r == 2, "rank %u", r);
        if (n)
            cr_assert_eq(b[0], 2 * 4ull);
        free(E.ev);
    }
}

Test(dist_deepspeed, without_contiguous_gradients_the_own_grads_stay)
{
    /* no ipg buffer, no grads_in_partition: averaged_gradients keeps this
     * rank's whole bf16 gradients to the step, the others are dropped */
    for (uint32_t r = 0; r < 3; r++) {
        vp_dist d;
        ds_init(&d, VP_DIST_DS_ZERO2, 3, r);
        d.ds.contiguous_gradients = false;
        events E = {0};
        vp_estimate e = run(&d, 1, &E);
        uint64_t b[4], in;
        partition(3, r, &in);
        cr_assert_eq(allocs(&E, "zero ipg buffer", 0, b, 4), 0);
        cr_assert_eq(allocs(&E, "zero grads_in_partition", 0, b, 4), 0);
        vp_dist d0;
        ds_init(&d0, VP_DIST_DS_ZERO2, 3, r);
        vp_estimate c = run(&d0, 1, NULL);
        /* the same gradients after the backward, in their own blocks
         * (each rounded to 512 B) instead of one */
        uint64_t own = e.step[0].after_bwd, flat = c.step[0].after_bwd;
        cr_assert_geq(own, flat, "rank %u", r);
        cr_assert_lt(own - flat, 512 * 64, "rank %u", r);
        free(E.ev);
    }
}

Test(dist_deepspeed, stage1_keeps_whole_gradients_until_the_boundary)
{
    /* ZeRO-1 reduces at the boundary only (engine.allreduce_gradients):
     * after the backward of a non-boundary micro-batch every bf16
     * gradient is alive; ZeRO-2 has reduced them into its partition */
    vp_dist d1, d2;
    ds_init(&d1, VP_DIST_DS_ZERO1, 4, 0);
    ds_init(&d2, VP_DIST_DS_ZERO2, 4, 0);
    events E1 = {0}, E2 = {0};
    run(&d1, 2, &E1);
    run(&d2, 2, &E2);
    uint64_t b[8];
    cr_assert_eq(allocs(&E1, "zero grads_in_partition", 1, b, 8), 1);
    /* ZeRO-2 makes it in each micro-batch's backward (the second is
     * added into the first and freed) */
    cr_assert_eq(allocs(&E2, "zero grads_in_partition", 1, b, 8), 2);
    free(E1.ev);
    free(E2.ev);
}

Test(dist_deepspeed, ranks_with_other_params_are_other_roles)
{
    vp_graph *g = tiny();
    vp_dist d;
    uint32_t *ranks, *counts;
    size_t n;
    vp_error err;
    ds_init(&d, VP_DIST_DS_ZERO1, 3, 0);
    cr_assert_eq(vp_dist_roles(g, &d, &ranks, &counts, &n, &err), VP_OK);
    cr_assert_eq(n, 3);
    free(ranks);
    free(counts);
    d.strategy = VP_DIST_DS_ZERO3;
    cr_assert_eq(vp_dist_roles(g, &d, &ranks, &counts, &n, &err), VP_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(counts[0], 3);
    free(ranks);
    free(counts);
    vp_graph_free(g);
}

Test(dist_deepspeed, many_ranks_are_three_roles)
{
    /* over 64 ranks: the heaviest partition, the last, rank 0 for the
     * rest; the heaviest meets the most parameter elements */
    vp_graph *g = tiny();
    vp_dist d;
    uint32_t *ranks, *counts;
    size_t n;
    vp_error err;
    ds_init(&d, VP_DIST_DS_ZERO2, 100, 0);
    cr_assert_eq(vp_dist_roles(g, &d, &ranks, &counts, &n, &err), VP_OK);
    vp_graph_free(g);
    uint64_t best = 0, in;
    uint32_t h = 0;
    for (uint32_t r = 0; r < 100; r++) {
        partition(100, r, &in);
        if (in > best) {
            best = in;
            h = r;
        }
    }
    cr_assert_eq(n, h == 0 ? 2u : 3u);
    uint32_t total = 0;
    bool has_h = false, has_last = false;
    for (size_t k = 0; k < n; k++) {
        total += counts[k];
        has_h |= ranks[k] == h;
        has_last |= ranks[k] == 99 && counts[k] == 1;
    }
    cr_assert_eq(total, 100);
    cr_assert(has_h && has_last);
    free(ranks);
    free(counts);
}

/* ---- ZeRO-3 ---------------------------------------------------------- */

/* The all-gathers of a step: count and bytes. */
static uint64_t gathered(const events *E, uint32_t step, size_t *n)
{
    uint64_t b[4096], sum = 0;
    *n = allocs(E, "zero3 all-gather", step, b, 4096);
    for (size_t i = 0; i < *n; i++)
        sum += b[i];
    return sum;
}

Test(dist_deepspeed, zero3_gathers_padded_params_not_persistent_ones)
{
    vp_graph *g = tiny();
    uint32_t w = 3;
    uint64_t thr = 5000, want = 0;
    size_t nwant = 0;
    /* each use of a non-persistent param in the forward and in the
     * backward gathers it once in step 1 (released after each module) */
    for (size_t i = 0; i < vp_graph_op_count(g); i++)
        for (uint32_t j = 0; j < vp_graph_op(g, i)->n_params; j++) {
            uint64_t n = vp_graph_param(g, vp_graph_op(g, i)->params[j])->numel;
            if (n > thr) {
                want += 2 * 2 * ((n + w - 1) / w * w);
                nwant += 2;
            }
        }
    vp_graph_free(g);
    vp_dist d;
    ds_init(&d, VP_DIST_DS_ZERO3, w, 0);
    d.ds.param_persistence_threshold = thr;
    events E = {0};
    run(&d, 1, &E);
    size_t n;
    cr_assert_eq(gathered(&E, 1, &n), want);
    cr_assert_eq(n, nwant);
    free(E.ev);
}

/* The trace (partitioned_param_coordinator.py reset_step at each
 * forward's start): the first reset completes an empty trace, which the
 * first module invalidates (trace_prologue); the second forward +
 * backward records it; from the third it is complete and the reuse
 * distance applies. */
Test(dist_deepspeed, zero3_reuse_distance_keeps_params_from_step_three)
{
    vp_dist d;
    ds_init(&d, VP_DIST_DS_ZERO3, 2, 0);
    d.ds.param_persistence_threshold = 0;
    d.ds.prefetch_bucket_size = 0;
    /* 0: everything released after its module, as without a trace */
    d.ds.max_reuse_distance = 0;
    events E0 = {0};
    run(&d, 1, &E0);
    size_t n1, n3;
    uint64_t b1 = gathered(&E0, 1, &n1), b3 = gathered(&E0, 3, &n3);
    cr_assert_eq(b1, b3);
    cr_assert_eq(n1, n3);
    /* the default (1e9 elements, more than the trace holds): a param
     * used again in the backward is kept from its forward */
    d.ds.max_reuse_distance = 1000000000;
    events E1 = {0};
    run(&d, 1, &E1);
    size_t m1, m2, m3;
    cr_assert_eq(gathered(&E1, 1, &m1), b1);
    cr_assert_eq(gathered(&E1, 2, &m2), b1);
    cr_assert_eq(m2, n1);
    cr_assert_lt(gathered(&E1, 3, &m3), b1);
    cr_assert_lt(m3, n3);
    free(E0.ev);
    free(E1.ev);
}

/* A checkpointed layer's recomputation runs its modules' hooks as the
 * forward does (parameter_offload.py _pre_forward_module_hook /
 * _post_forward_module_hook around each module of the recomputed
 * forward): in step 1 (no trace: each released after its module) every
 * non-persistent param of a checkpointed layer is gathered three times
 * (forward, recomputation, backward), and the gathered bytes live at
 * once never pass the largest module's: never a whole layer. */
Test(dist_deepspeed, zero3_recomputation_fetches_module_by_module)
{
    vp_graph *g = tiny();
    uint32_t w = 2;
    uint64_t thr = 5000, want = 0, module_max = 0;
    size_t nwant = 0;
    for (size_t i = 0; i < vp_graph_op_count(g); i++) {
        const vp_op *o = vp_graph_op(g, i);
        uint64_t mod = 0;
        for (uint32_t j = 0; j < o->n_params; j++) {
            uint64_t n = vp_graph_param(g, o->params[j])->numel;
            if (n <= thr)
                continue;
            uint64_t b = 2 * ((n + w - 1) / w * w);
            uint32_t uses = o->segment >= 0 ? 3 : 2;
            want += uses * b;
            nwant += uses;
            mod += b;
        }
        module_max = mod > module_max ? mod : module_max;
    }
    vp_graph_free(g);
    vp_dist d;
    ds_init(&d, VP_DIST_DS_ZERO3, w, 0);
    d.ds.param_persistence_threshold = thr;
    events E = {0};
    ckpt_all = true;
    run(&d, 1, &E);
    ckpt_all = false;
    size_t n;
    cr_assert_eq(gathered(&E, 1, &n), want);
    cr_assert_eq(n, nwant);
    /* the live all-gathers, by tensor id, through step 1 */
    uint64_t ids[256], bytes[256], live = 0, peak = 0;
    size_t k = 0;
    for (size_t i = 0; i < E.n && E.ev[i].step <= 1; i++) {
        const vp_sim_event *e = &E.ev[i];
        if (!e->is_free && strcmp(e->op, "zero3 all-gather") == 0) {
            cr_assert_lt(k, 256);
            ids[k] = e->tensor;
            bytes[k++] = e->bytes;
            live += e->bytes;
            peak = live > peak ? live : peak;
        }
        for (size_t j = 0; e->is_free && j < k; j++)
            if (ids[j] == e->tensor) {
                live -= bytes[j];
                ids[j] = ids[--k];
                bytes[j] = bytes[k];
                break;
            }
    }
    cr_assert_eq(peak, module_max);
    free(E.ev);
}

Test(dist_deepspeed, zero3_state_is_partitioned_at_construction)
{
    vp_graph *g = tiny();
    uint32_t w = 4;
    uint64_t parts = 0;
    for (size_t p = 0; p < vp_graph_param_count(g); p++)
        if (vp_graph_param(g, p)->trainable)
            parts += (vp_graph_param(g, p)->numel + w - 1) / w;
    vp_graph_free(g);
    vp_dist d;
    ds_init(&d, VP_DIST_DS_ZERO3, w, 0);
    d.ds.reduce_bucket_size = 30000;
    events E = {0};
    vp_estimate e = run(&d, 1, &E);
    uint64_t b[4];
    cr_assert_eq(allocs(&E, "zero3 fp16 flat", 0, b, 4), 1);
    cr_assert_eq(b[0], 2 * parts);
    cr_assert_eq(allocs(&E, "zero3 grad partitions", 0, b, 4), 1);
    cr_assert_eq(b[0], 2 * parts);
    cr_assert_eq(allocs(&E, "zero3 ipg buffer", 0, b, 4), 1);
    cr_assert_eq(b[0], 2 * 30000ull);
    /* Adam's moments are made by initialize_optimizer_states' step:
     * before the first forward */
    uint64_t r = (parts * 4 + 511) / 512 * 512;
    cr_assert_eq(e.optim_bytes, 3 * r + 512);
    cr_assert_geq(e.after_model, 3 * r + 512 + 2 * (2 * parts) + 60000);
    free(E.ev);
}

Test(dist_deepspeed, offload_keeps_the_state_on_the_host)
{
    vp_dist d;
    ds_init(&d, VP_DIST_DS_ZERO3, 4, 0);
    vp_estimate on = run(&d, 1, NULL);
    d.ds.offload_optimizer = VP_DS_OFFLOAD_CPU;
    vp_estimate off = run(&d, 1, NULL);
    cr_assert_eq(off.optim_bytes, 0);
    cr_assert_lt(off.peak_alloc, on.peak_alloc);
    cr_assert_gt(off.host_bytes, 0);
    d.ds.offload_optimizer = VP_DS_OFFLOAD_NVME;
    vp_estimate nv = run(&d, 1, NULL);
    cr_assert_eq(nv.peak_alloc, off.peak_alloc);
    cr_assert_eq(nv.host_bytes, off.host_bytes);
}

/* ---- the knobs ------------------------------------------------------- */

Test(dist_deepspeed, knobs_parse_as_a_config_writes_them)
{
    vp_ds_config c;
    vp_error err;
    vp_ds_config_init(&c);
    cr_assert_eq(vp_ds_config_parse(&c,
                                     "reduce_bucket_size=2e8,overlap_comm="
                                     "true,offload_optimizer=cpu,"
                                     "stage3_max_reuse_distance=0",
                                     &err),
                 VP_OK, "%s", err.msg);
    cr_assert_eq(c.reduce_bucket_size, 200000000ull);
    cr_assert_eq(c.overlap_comm, 1);
    cr_assert_eq(c.offload_optimizer, VP_DS_OFFLOAD_CPU);
    cr_assert_eq(c.max_reuse_distance, 0);
}

Test(dist_deepspeed, unknown_knob_is_named)
{
    vp_ds_config c;
    vp_error err;
    vp_ds_config_init(&c);
    cr_assert_eq(vp_ds_config_parse(&c, "stage3_max_live_params=1", &err),
                 VP_EARG);
    cr_assert_not_null(strstr(err.msg, "'stage3_max_live_params'"));
    cr_assert_eq(vp_ds_config_set(&c, "overlap_comm", "yes", &err), VP_EARG);
    cr_assert_not_null(strstr(err.msg, "overlap_comm"));
    cr_assert_eq(vp_ds_config_set(&c, "reduce_bucket_size", "1.5", &err),
                 VP_EARG);
}

/* ---- the JSON API ---------------------------------------------------- */

static vp_status api(const char *ds, char **resp, vp_error *err)
{
    char req[512];
    snprintf(req, sizeof req,
             "{\"command\": \"estimate\", \"model\": \"" MODEL "\", "
             "\"batch\": 2, \"seq\": 32, \"precision\": \"bf16\", "
             "\"optimizer\": \"adamw-fused\", \"strategy\": "
             "\"deepspeed-zero3\", \"world\": 4, \"ds_config\": %s}",
             ds);
    return vp_api_call(req, resp, err);
}

Test(dist_deepspeed, api_takes_ds_config_by_its_names)
{
    char *a = NULL, *b = NULL;
    vp_error err;
    cr_assert_eq(api("{}", &a, &err), VP_OK, "%s", err.msg);
    cr_assert_eq(api("{\"offload_optimizer\": \"cpu\", "
                     "\"stage3_max_reuse_distance\": 0, "
                     "\"overlap_comm\": false, \"reduce_bucket_size\": 5e4}",
                     &b, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_not_null(strstr(a, "\"deepspeed-zero3\""));
    cr_assert_str_neq(a, b);
    vp_api_free(a);
    vp_api_free(b);
}

Test(dist_deepspeed, api_names_an_unknown_knob)
{
    char *a = NULL;
    vp_error err;
    cr_assert_eq(api("{\"stage3_prefetch_bucket\": 1}", &a, &err), VP_EARG);
    cr_assert_null(a);
    cr_assert_not_null(strstr(err.msg, "'stage3_prefetch_bucket'"), "%s",
                       err.msg);
}

/* ---- validate's rank lines ------------------------------------------- */

#define LINE_HEAD                                                          \
    "{\"id\": \"ds\", \"model\": \"tiny-gpt\", \"fam\": \"gpt2\", "        \
    "\"batch\": 2, \"seq\": 32, \"opt\": \"adamw-fused\", \"attn\": "      \
    "\"sdpa\", \"ckpt\": false, \"world\": 4, \"rank\": 0, \"strategy\": " \
    "\"deepspeed-zero3\", \"mixed_precision\": true, \"prec\": \"bf16\", " \
    "\"peak_alloc\": 3000000"

static vp_status line(const char *tail, vp_case_result *r, vp_error *err)
{
    static const char *const dirs[] = {"tests/data/dist", "models"};
    char json[1024];
    vp_validate_opts o = {"dist", 1, dirs, 2, true, NULL, NULL, false, 0, 0.0};
    snprintf(json, sizeof json, "%s%s}", LINE_HEAD, tail);
    return vp_validate_line(json, strlen(json), &o, r, err);
}

static uint64_t predicted(const vp_case_result *r, const char *name)
{
    for (size_t i = 0; i < r->n_metrics; i++)
        if (strcmp(r->metrics[i].name, name) == 0)
            return r->metrics[i].predicted;
    cr_assert_fail("no metric %s", name);
    return 0;
}

Test(dist_deepspeed, validate_simulates_a_deepspeed_rank_line)
{
    vp_case_result r;
    vp_error err;
    cr_assert_eq(line("", &r, &err), VP_OK, "%s", err.msg);
    vp_dist d;
    ds_init(&d, VP_DIST_DS_ZERO3, 4, 0);
    d.empty_cache_after_wrap = true;
    as_validate = true;
    vp_estimate e = run(&d, 1, NULL);
    cr_assert_eq(predicted(&r, "rank0.peak_alloc"), e.peak_alloc);
    cr_assert_eq(line(", \"ds_config\": {\"stage3_max_reuse_distance\": 0, "
                      "\"reduce_bucket_size\": 30000}",
                      &r, &err),
                 VP_OK, "%s", err.msg);
    d.ds.max_reuse_distance = 0;
    d.ds.reduce_bucket_size = 30000;
    e = run(&d, 1, NULL);
    cr_assert_eq(predicted(&r, "rank0.peak_alloc"), e.peak_alloc);
}

Test(dist_deepspeed, validate_names_an_unknown_knob_at_its_field)
{
    vp_case_result r;
    vp_error err;
    cr_assert_eq(line(", \"ds_config\": {\"stage3_live\": 1}", &r, &err),
                 VP_EARG);
    cr_assert_not_null(strstr(err.msg, "'stage3_live'"), "%s", err.msg);
    cr_assert_gt(err.col, strlen(LINE_HEAD));
    /* FSDP's and autocast's fields are not DeepSpeed's */
    cr_assert_eq(line(", \"param_dtype\": \"bf16\"", &r, &err), VP_ESCHEMA);
    /* the knobs are an object */
    cr_assert_eq(line(", \"ds_config\": 5", &r, &err), VP_EARG);
    cr_assert_not_null(strstr(err.msg, "ds_config"), "%s", err.msg);
}

/* ---- the cluster planner's verification ------------------------------ */

static vp_plan_entry planned(uint32_t gpus, uint32_t tp, vp_sharding sh)
{
    vp_error err;
    vp_model *m = vp_model_load("tests/data/published/gpt-1.7b.yaml", &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_cluster_model *cm = vp_cluster_model_new(m, 0, &err);
    cr_assert_not_null(cm, "%s", err.msg);
    vp_gpu_profile *gp = vp_gpu_load("a100-80g", &err);
    cr_assert_not_null(gp, "%s", err.msg);
    vp_hw hw;
    vp_gpu_hw(gp, VP_GPU_BF16, &hw);
    vp_hw_fill_defaults(&hw);
    vp_gpu_free(gp);
    vp_cluster c;
    vp_cluster_init(&c, &hw, gpus, 8);
    vp_par p;
    memset(&p, 0, sizeof p);
    p.dp = gpus / tp;
    p.tp = tp;
    p.pp = p.cp = p.ep = p.vpp = 1;
    p.schedule = VP_SCHED_1F1B;
    p.micro_batch = 2;
    p.accum = 1;
    p.dtype = VP_DT_FP16;
    p.recompute = VP_RC_FULL;
    p.sharding = sh;
    vp_plan_entry e;
    cr_assert_eq(vp_cluster_ds_sim(cm, &c, &p, &e, &err), VP_OK, "%s",
                 err.msg);
    vp_cluster_model_free(cm);
    vp_model_free(m);
    return e;
}

Test(dist_deepspeed, planner_simulates_zero3_without_model_parallelism)
{
    vp_plan_entry e = planned(32, 1, VP_SHARD_ZERO3);
    cr_assert(e.simulated);
    /* the fitted NCCL and context on top of the simulated reserved */
    cr_assert_eq(e.mem.total, e.mem.weights + e.mem.grads +
                                  e.mem.optimizer + e.mem.activations +
                                  e.mem.transient + e.mem.overhead +
                                  e.mem.nccl + e.mem.context);
    /* Adam's state of the partitions (ceil(numel / 32) each): the fp32
     * master and two moments, each sub group's a block (rounded to
     * 512 B) with FusedAdam's 4-B step */
    vp_error err;
    vp_model *m = vp_model_load("tests/data/published/gpt-1.7b.yaml", &err);
    vp_graph *g = vp_graph_build(m, 1, 128, &err);
    cr_assert_not_null(g, "%s", err.msg);
    uint64_t parts = 0;
    for (size_t p = 0; p < vp_graph_param_count(g); p++)
        if (vp_graph_param(g, p)->trainable)
            parts += (vp_graph_param(g, p)->numel + 31) / 32;
    vp_graph_free(g);
    vp_model_free(m);
    cr_assert_geq(e.mem.optimizer, 12 * parts);
    cr_assert_lt(e.mem.optimizer, 12 * parts + 4 * 2048);
}

Test(dist_deepspeed, planner_leaves_tensor_parallel_layouts_fitted)
{
    vp_plan_entry e = planned(32, 2, VP_SHARD_ZERO1);
    cr_assert_not(e.simulated);
}

/* ---- the command line (golden files) ---------------------------------- */

Test(dist_deepspeed_cli, zero2_roles_and_report)
{
    GOLDEN("estimate_ds_zero2_roles", 0, "estimate",
           "tests/data/dist/tiny-gpt.yaml", "--batch", "2", "--precision",
           "bf16", "--optimizer", "adamw-fused", "--strategy",
           "deepspeed-zero2", "--world", "3", "--ds",
           "reduce_bucket_size=20000,overlap_comm=true");
}

Test(dist_deepspeed_cli, zero3_json)
{
    GOLDEN("estimate_ds_zero3_json", 0, "estimate",
           "tests/data/dist/tiny-gpt.yaml", "--batch", "2", "--precision",
           "bf16", "--optimizer", "adamw-fused", "--strategy",
           "deepspeed-zero3", "--world", "4", "--ds",
           "stage3_param_persistence_threshold=5000,reduce_bucket_size=3e4",
           "--format", "json");
}

Test(dist_deepspeed_cli, unknown_knob_is_named)
{
    GOLDEN("estimate_ds_unknown_knob", 2, "estimate",
           "tests/data/dist/tiny-gpt.yaml", "--strategy", "deepspeed-zero3",
           "--world", "2", "--ds", "stage3_max_live=1");
}

Test(dist_deepspeed_cli, knobs_need_a_deepspeed_strategy)
{
    GOLDEN("estimate_ds_needs_deepspeed", 2, "estimate",
           "tests/data/dist/tiny-gpt.yaml", "--strategy", "fsdp2", "--world",
           "2", "--ds", "overlap_comm=true");
}

Test(dist_deepspeed_cli, autocast_is_refused)
{
    GOLDEN("estimate_ds_autocast", 2, "estimate",
           "tests/data/dist/tiny-gpt.yaml", "--precision", "amp-bf16",
           "--optimizer", "adamw-fused", "--strategy", "deepspeed-zero1",
           "--world", "2");
}
