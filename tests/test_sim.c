/* Tests of the training-step simulator (vp_simulate) on cases small enough
 * to work out by hand from docs/SIMULATION_NOTES.md and
 * shared/docs/PYTORCH_MEMORY.md.
 *
 * Most tests use tests/data/good/mlp-sim.yaml at batch 1024 in fp32:
 *
 *   input   x [1024, 4096]                       16 MiB   (B*W*4)
 *   layers.0.fc   linear 4096 -> 4096, no bias    out 16 MiB, weight 64 MiB
 *   layers.0.act  gelu                            out 16 MiB
 *   layers.1.fc   linear 4096 -> 4096, no bias    out 16 MiB, weight 64 MiB
 *   layers.1.act  gelu                            out 16 MiB
 *   head          linear 4096 -> 2560, no bias    out 10 MiB, weight 40 MiB
 *   loss          cross_entropy                   log-probs 10 MiB
 *
 * P = 2*4096*4096 + 4096*2560 = 44040192 parameters, P*4 = 168 MiB.
 * Every large tensor is a multiple of 2 MiB, so the caching allocator gives
 * each one a block of exactly its size (a new segment is the size rounded to
 * 2 MiB, or 20 MiB under 10 MiB; a reused free block is split when more than
 * 1 MiB is left, and the rest is always a multiple of 2 MiB). The small
 * tensors are rounded to 512 B: the labels (1024 int64 = 8192 B) and
 * 4-byte scalars (512 B blocks: loss, total_weight, the loss / accum
 * result, the backward seed and its division).
 *
 * The setup has fresh_process = false: the cuBLAS and cuBLASLt workspaces
 * exist before the model (PyTorch's later cases in one process), so they
 * are in `baseline` and every figure below excludes them.
 *
 * The rules used (PYTORCH_MEMORY.md §3, §4, SIMULATION_NOTES.md §3, §6):
 * a linear saves its input (when its weight needs a gradient); GELU saves
 * its input; outputs not saved die when their last consumer has run;
 * cross-entropy saves fp32 log-probs and total_weight; backward of the loss
 * allocates the nll grad and the log_softmax grad (both [rows, classes]);
 * a linear's backward allocates grad_x (unless its input needs none) and
 * grad_W, which becomes .grad; AdamW foreach allocates exp_avg and
 * exp_avg_sq per parameter at step 1 and one sqrt temporary per parameter
 * at every step; zero_grad(set_to_none=True) frees the grads.
 *
 * All sizes in the comments are in MiB plus the small bytes ("+ 8704 B").
 * The regression tests at the end name bugs once found in src/
 * and fail today. Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/vramplan.h"

#define MIB ((uint64_t)1 << 20)
#define GOOD_DIR "tests/data/good/"

/* The MLP's sizes. */
#define P_ELEMS 44040192ULL          /* 2*4096*4096 + 4096*2560        */
#define PBYTES (168 * MIB)           /* P * 4 = 64 + 64 + 40 MiB       */
#define ACT (16 * MIB)               /* 1024 x 4096 x 4                */
#define LOGITS (10 * MIB)            /* 1024 x 2560 x 4                */
#define LABELS 8192ULL               /* 1024 x 8                       */
#define SCALAR 512ULL                /* a 4-byte tensor's block        */

/* ---- helpers ------------------------------------------------------------ */

typedef struct {
    vp_model *m;
    vp_graph *g;
} mg;

static mg open_graph(const char *path, uint64_t batch, uint64_t seq)
{
    mg r;
    vp_error err;
    memset(&err, 0, sizeof err);
    r.m = vp_model_load(path, &err);
    cr_assert_not_null(r.m, "%s: %s", path, err.msg);
    r.g = vp_graph_build(r.m, batch, seq, &err);
    cr_assert_not_null(r.g, "%s: %s", path, err.msg);
    return r;
}

static void done(mg *r)
{
    vp_graph_free(r->g);
    vp_model_free(r->m);
}

static mg mlp(void) { return open_graph(GOOD_DIR "mlp-sim.yaml", 1024, 0); }

static void mlp_setup(vp_setup *s)
{
    vp_setup_init(s);
    s->batch = 1024;
    s->fresh_process = false;
    s->steps = 2;
}

static vp_estimate simulate_ok(const vp_graph *g, const vp_setup *s)
{
    vp_estimate e;
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_status st = vp_simulate(g, s, &e, NULL, NULL, &err);
    cr_assert_eq(st, VP_OK, "vp_simulate: %s (%s)", err.msg,
                 vp_err_name(st));
    return e;
}

static vp_estimate simulate_mlp(const vp_setup *s)
{
    mg r = mlp();
    vp_estimate e = simulate_ok(r.g, s);
    done(&r);
    return e;
}

#define EXPECT_BYTES(got, want)                                            \
    cr_expect_eq((uint64_t)(got), (uint64_t)(want),                        \
                 "%s = %llu, expected %llu (%+lld)", #got,                 \
                 (unsigned long long)(got), (unsigned long long)(want),    \
                 (long long)((uint64_t)(got) - (uint64_t)(want)))

static uint64_t category_sum(const vp_estimate *e)
{
    uint64_t s = 0;
    for (int c = 0; c < VP_CAT__COUNT; c++)
        s += e->by_category[c];
    return s;
}

/* ---- the model ------------------------------------------------------------- */

Test(sim_mlp, parameter_count)
{
    mg r = mlp();
    uint64_t n;
    cr_assert_eq(vp_graph_num_params(r.g, &n, NULL), VP_OK);
    EXPECT_BYTES(n, P_ELEMS);
    done(&r);
}

/* ---- fp32, AdamW (foreach) ------------------------------------------------- */

/* The parameters are made first: 64 + 64 + 40 MiB = P*4. */
Test(sim_adamw, after_model_is_the_parameters)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.params, P_ELEMS);
    EXPECT_BYTES(e.after_model, PBYTES);
    EXPECT_BYTES(e.param_bytes, PBYTES);
}

/* Step 1 starts with the parameters and the batch (x 16 MiB, labels). */
Test(sim_adamw, step1_start)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].start, PBYTES + ACT + LABELS);
}

/* Forward, from start = 184 MiB + 8192 B:
 *   layers.0.fc out +16 (200); layers.0.act out +16 (216), the fc out stays
 *   (GELU saves its input); layers.1.fc +16 (232), saves the act out;
 *   layers.1.act +16 (248); head +10 (258), saves layers.1.act;
 *   loss: log-probs +10 (268), loss +512, total_weight +512
 *   -> forward peak 268 MiB + 9216 B = start + 4*16 + 2*10 MiB + 1024 B.
 * Then the logits die (-10): 258 MiB + 9216 B; the training loop's
 * loss / accum makes a new scalar (+512) and drops the loss (-512):
 * after_fwd = 258 MiB + 9216 B. */
Test(sim_adamw, forward_peak_and_after_forward)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_FORWARD],
                 PBYTES + ACT + LABELS + 4 * ACT + 2 * LOGITS + 2 * SCALAR);
    EXPECT_BYTES(e.step[0].after_fwd,
                 PBYTES + ACT + LABELS + 4 * ACT + LOGITS + 2 * SCALAR);
}

/* Backward, from 258 MiB + 9216 B (params 168, x 16, fc0 out 16, act0 16,
 * fc1 out 16, act1 16, log-probs 10; labels, total_weight, loss):
 *   seed +512, its division +512, seed freed: 258 MiB + 9728 B;
 *   loss: nll grad +10 (268), log_softmax grad +10 (278), nll grad -10,
 *     log-probs -10, total_weight -512, division -512: 258 MiB + 8704 B;
 *   head: grad_x +16 (274), grad_W +40 (314) -> .grad; its grad_out -10,
 *     act1 (saved by head only) -16: 288;
 *   layers.1.act: grad +16 (304); grad_out -16, fc1 out -16: 272;
 *   layers.1.fc: grad_x +16 (288), grad_W +64 (352); grad_out -16, act0
 *     -16: 320;
 *   layers.0.act: +16 (336); -16, fc0 out -16: 304;
 *   layers.0.fc: no grad_x (the input needs none), grad_W +64 (368);
 *     grad_out -16: 352.
 * bwd peak = 368 MiB + 8704 B; after_bwd = params + grads + x = 352 MiB
 * plus the labels and the loss (8704 B). */
Test(sim_adamw, backward_peak_and_grads)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_BACKWARD],
                 2 * PBYTES + 2 * ACT + LABELS + SCALAR);
    EXPECT_BYTES(e.step[0].after_bwd, 2 * PBYTES + ACT + LABELS + SCALAR);
    EXPECT_BYTES(e.grad_bytes, PBYTES);
}

/* Step 1 optimizer: exp_avg and exp_avg_sq per parameter (2 * P*4 = 336
 * MiB), then one sqrt temporary per parameter (P*4 = 168 MiB):
 * opt peak = after_bwd + 2*P*4 + P*4 = 352 + 336 + 168 = 856 MiB + 8704 B. */
Test(sim_adamw, step1_optimizer_peak)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_OPTIMIZER],
                 e.step[0].after_bwd + 2 * PBYTES + PBYTES);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_OPTIMIZER],
                 856 * MIB + LABELS + SCALAR);
}

/* zero_grad frees the grads, then the loss and the batch go: step 1 ends
 * with params + state = 168 + 336 = 504 MiB; step 2 starts with the batch
 * on top: 520 MiB + 8192 B. */
Test(sim_adamw, end_of_step_and_steady_start)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].end, 3 * PBYTES);
    EXPECT_BYTES(e.step[1].start, 3 * PBYTES + ACT + LABELS);
    EXPECT_BYTES(e.optim_bytes, 2 * PBYTES);
}

/* Step 2 is step 1 with the state (336 MiB) underneath: forward peak
 * 268 + 336 = 604 MiB + 9216 B, backward peak 368 + 336 = 704 MiB + 8704 B,
 * optimizer peak (only the sqrt temporaries are new) 688 + 168 = 856 MiB
 * + 8704 B, the same as step 1. */
Test(sim_adamw, step2_phases)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    cr_assert_eq(e.steps, 2);
    EXPECT_BYTES(e.step[1].peak[VP_PHASE_FORWARD],
                 604 * MIB + LABELS + 2 * SCALAR);
    EXPECT_BYTES(e.step[1].peak[VP_PHASE_BACKWARD],
                 704 * MIB + LABELS + SCALAR);
    EXPECT_BYTES(e.step[1].peak[VP_PHASE_OPTIMIZER],
                 856 * MIB + LABELS + SCALAR);
}

/* The overall peak is step 1's optimizer step (step 2 only equals it). */
Test(sim_adamw, peak_is_the_step1_optimizer)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.peak_alloc, 856 * MIB + LABELS + SCALAR);
    cr_expect_eq(e.peak_phase, VP_PHASE_OPTIMIZER, "phase %s",
                 vp_phase_name(e.peak_phase));
    cr_expect_eq(e.peak_step, 1);
    cr_expect_str_eq(e.peak_op, "optimizer");
    EXPECT_BYTES(e.peak_alloc_steady, 856 * MIB + LABELS + SCALAR);
}

/* At the peak (the last sqrt temporary): parameters 168, grads 168, state
 * 336, temporaries 168 MiB + the loss scalar (512 B), the batch 16 MiB +
 * 8192 B; no activations, casts or workspaces (those are in baseline). */
Test(sim_adamw, categories_at_the_peak)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.by_category[VP_CAT_PARAM], PBYTES);
    EXPECT_BYTES(e.by_category[VP_CAT_GRAD], PBYTES);
    EXPECT_BYTES(e.by_category[VP_CAT_OPTIM], 2 * PBYTES);
    EXPECT_BYTES(e.by_category[VP_CAT_TEMP], PBYTES + SCALAR);
    EXPECT_BYTES(e.by_category[VP_CAT_INPUT], ACT + LABELS);
    EXPECT_BYTES(e.by_category[VP_CAT_ACT], 0);
    EXPECT_BYTES(e.by_category[VP_CAT_CAST], 0);
    EXPECT_BYTES(e.by_category[VP_CAT_WORKSPACE], 0);
    EXPECT_BYTES(category_sum(&e), e.peak_alloc);
}

/* Reserved: the peak needs no freed segment back, and the device total is
 * reserved + the CUDA context. */
Test(sim_adamw, reserved_and_device_used)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    cr_expect_geq(e.peak_reserved, e.peak_alloc + e.baseline);
    EXPECT_BYTES(e.device_used, e.peak_reserved + s.context_bytes);
    /* baseline: the cuBLAS workspace twice (32 MiB, one per thread) and the
     * cuBLASLt one (1 MiB) */
    EXPECT_BYTES(e.baseline, 65 * MIB);
}

/* A fresh process makes the backward thread's 32 MiB cuBLAS workspace at
 * the first backward GEMM (the head) and the main thread's 1 MiB Lt one at
 * the first forward linear with a bias, which this MLP does not have:
 * the backward peak gains exactly 32 MiB, after_bwd too. */
Test(sim_adamw, fresh_process_adds_the_backward_workspace)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate warm = simulate_mlp(&s);
    s.fresh_process = true;
    vp_estimate fresh = simulate_mlp(&s);
    EXPECT_BYTES(fresh.baseline, 32 * MIB);
    EXPECT_BYTES(fresh.step[0].peak[VP_PHASE_BACKWARD],
                 warm.step[0].peak[VP_PHASE_BACKWARD] + 32 * MIB);
    EXPECT_BYTES(fresh.step[0].after_bwd, warm.step[0].after_bwd + 32 * MIB);
    EXPECT_BYTES(fresh.step[0].peak[VP_PHASE_FORWARD],
                 warm.step[0].peak[VP_PHASE_FORWARD]);
}

/* ---- other optimizers ------------------------------------------------------ */

/* SGD with momentum: one buffer per parameter at step 1 (P*4), no
 * temporaries. Step 1 opt peak = after_bwd + 168 = 520 MiB + 8704 B; the
 * overall peak is step 2's backward, 368 + 168 = 536 MiB + 8704 B, with the
 * 168 MiB of momentum live. */
Test(sim_optimizers, sgd_momentum_state_is_one_copy)
{
    vp_setup s;
    mlp_setup(&s);
    s.optimizer = VP_OPT_SGD;
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_OPTIMIZER] - e.step[0].after_bwd,
                 PBYTES);
    EXPECT_BYTES(e.step[0].end, 2 * PBYTES);
    EXPECT_BYTES(e.peak_alloc, 536 * MIB + LABELS + SCALAR);
    cr_expect_eq(e.peak_phase, VP_PHASE_BACKWARD);
    cr_expect_eq(e.peak_step, 2);
    EXPECT_BYTES(e.by_category[VP_CAT_OPTIM], PBYTES);
    EXPECT_BYTES(e.optim_bytes, PBYTES);
}

/* Plain SGD keeps no state: the optimizer step allocates nothing. */
Test(sim_optimizers, sgd_without_momentum_has_no_state)
{
    vp_setup s;
    mlp_setup(&s);
    s.optimizer = VP_OPT_SGD_PLAIN;
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_OPTIMIZER], e.step[0].after_bwd);
    EXPECT_BYTES(e.step[0].end, PBYTES);
}

/* Counts the bytes allocated per (phase, category) of one step. */
typedef struct {
    uint32_t step;
    uint64_t alloc[VP_PHASE__COUNT][VP_CAT__COUNT];
    uint64_t live_cast, max_live_cast;
    uint64_t cast_at_first_bwd;
    bool seen_bwd;
} tally;

static void count_event(const vp_sim_event *ev, void *ud)
{
    tally *t = ud;
    if (ev->category == VP_CAT_CAST) {
        if (ev->is_free)
            t->live_cast -= ev->bytes;
        else
            t->live_cast += ev->bytes;
        if (t->live_cast > t->max_live_cast)
            t->max_live_cast = t->live_cast;
    }
    if (ev->phase == VP_PHASE_BACKWARD && !t->seen_bwd && ev->step == 1) {
        t->seen_bwd = true;
        t->cast_at_first_bwd = t->live_cast;
    }
    if (ev->step == t->step && !ev->is_free)
        t->alloc[ev->phase][ev->category] += ev->bytes;
}

static vp_estimate simulate_tally(const vp_setup *s, tally *t)
{
    mg r = mlp();
    vp_estimate e;
    vp_error err;
    vp_status st = vp_simulate(r.g, s, &e, count_event, t, &err);
    cr_assert_eq(st, VP_OK, "%s", err.msg);
    done(&r);
    return e;
}

/* Fused AdamW: the same two state tensors (336 MiB) plus a 4-byte device
 * `step` per parameter (3 x 512 B), and no temporaries at all. */
Test(sim_optimizers, fused_adamw_has_no_temporaries)
{
    vp_setup s;
    mlp_setup(&s);
    s.optimizer = VP_OPT_ADAMW_FUSED;
    tally t;
    memset(&t, 0, sizeof t);
    t.step = 1;
    vp_estimate e = simulate_tally(&s, &t);
    EXPECT_BYTES(t.alloc[VP_PHASE_OPTIMIZER][VP_CAT_TEMP], 0);
    EXPECT_BYTES(t.alloc[VP_PHASE_OPTIMIZER][VP_CAT_OPTIM],
                 2 * P_ELEMS * 4 + 3 * 4);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_OPTIMIZER],
                 e.step[0].after_bwd + 2 * PBYTES + 3 * SCALAR);
    /* step 2 allocates nothing in the optimizer */
    EXPECT_BYTES(e.step[1].peak[VP_PHASE_OPTIMIZER], e.step[1].after_bwd);
}

/* Foreach AdamW, for comparison: the temporaries are one copy of the
 * parameters at every step. */
Test(sim_optimizers, foreach_adamw_temporaries_every_step)
{
    vp_setup s;
    mlp_setup(&s);
    tally t;
    memset(&t, 0, sizeof t);
    t.step = 2;
    vp_estimate e = simulate_tally(&s, &t);
    EXPECT_BYTES(t.alloc[VP_PHASE_OPTIMIZER][VP_CAT_TEMP], P_ELEMS * 4);
    EXPECT_BYTES(t.alloc[VP_PHASE_OPTIMIZER][VP_CAT_OPTIM], 0);
    EXPECT_BYTES(e.step[1].peak[VP_PHASE_OPTIMIZER],
                 e.step[1].after_bwd + PBYTES);
}

/* No optimizer: nothing allocated after the backward. */
Test(sim_optimizers, none)
{
    vp_setup s;
    mlp_setup(&s);
    s.optimizer = VP_OPT_NONE;
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_OPTIMIZER], e.step[0].after_bwd);
    EXPECT_BYTES(e.step[1].start, PBYTES + ACT + LABELS);
}

/* ---- zero_grad --------------------------------------------------------------- */

/* set_to_none=False keeps the grads: step 1 ends with params + grads +
 * state = 168 + 168 + 336 = 672 MiB instead of 504. */
Test(sim_zero_grad, keep_grads_at_the_end_of_the_step)
{
    vp_setup s;
    mlp_setup(&s);
    s.set_to_none = false;
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].end, 4 * PBYTES);
    EXPECT_BYTES(e.step[1].start, 4 * PBYTES + ACT + LABELS);
}

Test(sim_zero_grad, set_to_none_frees_the_grads)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].end, 3 * PBYTES);
}

/* ---- inference ----------------------------------------------------------------- */

/* Under no_grad nothing is saved: each output dies after its consumer.
 * From start = 184 MiB + 8192 B: fc0 +16 (200), act0 +16 (216), fc0 out
 * -16; fc1 +16 (216), act0 -16; act1 +16 (216), ... : peak 216 MiB + 8192 B
 * (two 16-MiB activations), first reached at layers.0.act. */
Test(sim_inference, no_backward_no_optimizer_no_grads)
{
    vp_setup s;
    mlp_setup(&s);
    s.inference = true;
    vp_estimate e = simulate_mlp(&s);
    for (uint32_t k = 0; k < e.steps; k++) {
        EXPECT_BYTES(e.step[k].peak[VP_PHASE_BACKWARD], 0);
        EXPECT_BYTES(e.step[k].peak[VP_PHASE_OPTIMIZER], 0);
    }
    EXPECT_BYTES(e.by_category[VP_CAT_GRAD], 0);
    EXPECT_BYTES(e.by_category[VP_CAT_OPTIM], 0);
    cr_expect_eq(e.peak_phase, VP_PHASE_FORWARD);
}

Test(sim_inference, peak_is_two_activations)
{
    vp_setup s;
    mlp_setup(&s);
    s.inference = true;
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.peak_alloc, PBYTES + ACT + LABELS + 2 * ACT);
    EXPECT_BYTES(e.by_category[VP_CAT_ACT], 2 * ACT);
    cr_expect_str_eq(e.peak_op, "layers.0.act");
    EXPECT_BYTES(e.step[0].after_fwd, e.step[0].start);
    EXPECT_BYTES(e.step[0].end, PBYTES);
}

/* ---- activation checkpointing ---------------------------------------------- */

/* Both layers checkpointed: only each layer's input is kept (act0, as the
 * input of layers.1; the data x is the batch), and the head saves act1.
 * Forward: fc0 +16 (200), act0 +16 (216), fc0 out -16 (200); fc1 +16
 * (216), act1 +16 (232), fc1 out -16 (216); head +10 (226); log-probs +10
 * (236), two scalars: peak 236 MiB + 9216 B (268 without); after_fwd
 * 226 MiB + 9216 B (258 without): the two fc outputs (32 MiB) are not
 * kept. */
Test(sim_checkpoint, every_layer_lowers_the_forward)
{
    mg r = mlp();
    cr_assert_eq(vp_graph_segment_count(r.g), 2);
    bool ck[2] = {true, true};
    vp_setup s;
    mlp_setup(&s);
    vp_estimate plain = simulate_ok(r.g, &s);
    s.checkpoint = ck;
    s.n_checkpoint = 2;
    vp_estimate e = simulate_ok(r.g, &s);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_FORWARD],
                 PBYTES + ACT + LABELS + 2 * ACT + 2 * LOGITS + 2 * SCALAR);
    EXPECT_BYTES(e.step[0].after_fwd,
                 PBYTES + ACT + LABELS + 2 * ACT + LOGITS + 2 * SCALAR);
    EXPECT_BYTES(plain.step[0].after_fwd - e.step[0].after_fwd, 2 * ACT);
    done(&r);
}

/* Checkpointing does not change what is left after the backward (params,
 * grads, batch) nor the optimizer step. */
Test(sim_checkpoint, same_after_backward)
{
    mg r = mlp();
    bool ck[2] = {true, true};
    vp_setup s;
    mlp_setup(&s);
    s.checkpoint = ck;
    s.n_checkpoint = 2;
    vp_estimate e = simulate_ok(r.g, &s);
    EXPECT_BYTES(e.step[0].after_bwd, 2 * PBYTES + ACT + LABELS + SCALAR);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_OPTIMIZER],
                 856 * MIB + LABELS + SCALAR);
    done(&r);
}

/* Recomputation adds each checkpointed layer's forward FLOPs once more. */
Test(sim_checkpoint, recompute_flops)
{
    mg r = mlp();
    bool ck[2] = {true, false};
    vp_setup s;
    mlp_setup(&s);
    vp_estimate plain = simulate_ok(r.g, &s);
    s.checkpoint = ck;
    s.n_checkpoint = 2;
    vp_estimate e = simulate_ok(r.g, &s);
    double extra = 0;
    for (size_t i = 0; i < vp_graph_op_count(r.g); i++)
        if (vp_graph_op(r.g, i)->segment == 0)
            extra += vp_graph_op(r.g, i)->flops_fwd;
    /* layers.0.fc: 2 * 1024 * 4096 * 4096 = 34359738368, plus the GELU's
     * 1024 * 4096 elementwise */
    cr_expect_eq(extra, 34359738368.0 + 4194304.0, "%g", extra);
    cr_expect_eq(e.flops_per_step - plain.flops_per_step, extra, "%g",
                 e.flops_per_step - plain.flops_per_step);
    done(&r);
}

/* ---- gradient accumulation --------------------------------------------------- */

/* Two micro-batches: the second forward runs with the first one's grads
 * (168 MiB) alive but not its activations (freed in its backward), so the
 * forward peak is one micro-batch's (268 MiB + 9216 B) + the grads =
 * 436 MiB + 9216 B, not two micro-batches' activations. After the second
 * backward the state is as with one micro-batch. */
Test(sim_accum, two_micro_batches_keep_one_activation_peak)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate one = simulate_mlp(&s);
    s.accum = 2;
    vp_estimate two = simulate_mlp(&s);
    EXPECT_BYTES(two.step[0].peak[VP_PHASE_FORWARD],
                 one.step[0].peak[VP_PHASE_FORWARD] + PBYTES);
    EXPECT_BYTES(two.step[0].peak[VP_PHASE_FORWARD],
                 436 * MIB + LABELS + 2 * SCALAR);
    EXPECT_BYTES(two.step[0].after_bwd, one.step[0].after_bwd);
    EXPECT_BYTES(two.step[0].peak[VP_PHASE_OPTIMIZER],
                 one.step[0].peak[VP_PHASE_OPTIMIZER]);
}

/* In the second backward .grad exists, so each weight gradient is a
 * transient added into it: the head's 40 MiB on top of 442 MiB (after_fwd
 * 258 + 168 grads, the loss grads replacing the log-probs, grad_x 16)
 * gives 482 MiB + 8704 B. */
Test(sim_accum, second_backward_adds_transient_grads)
{
    vp_setup s;
    mlp_setup(&s);
    s.accum = 2;
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_BACKWARD],
                 482 * MIB + LABELS + SCALAR);
}

/* FLOPs per optimizer step double with two micro-batches. */
Test(sim_accum, flops_scale_with_micro_batches)
{
    vp_setup s;
    mlp_setup(&s);
    vp_estimate one = simulate_mlp(&s);
    s.accum = 2;
    vp_estimate two = simulate_mlp(&s);
    cr_expect_eq(two.flops_per_step, 2 * one.flops_per_step);
}

/* ---- precision ----------------------------------------------------------------- */

/* amp-bf16: each weight gets a bf16 copy in autocast's cache the first
 * time a linear uses it: 2 bytes per parameter, P*2 = 84 MiB, all three
 * alive at the end of the forward. autocast's exit clears the cache; the
 * casts of layers.1.fc (32 MiB) and head (20 MiB) stay, saved for the
 * backward (their inputs need a gradient), layers.0.fc's (32 MiB) goes. */
Test(sim_precision, amp_bf16_weight_cache)
{
    vp_setup s;
    mlp_setup(&s);
    s.precision = VP_PREC_AMP_BF16;
    s.steps = 1;
    tally t;
    memset(&t, 0, sizeof t);
    t.step = 1;
    simulate_tally(&s, &t);
    EXPECT_BYTES(t.alloc[VP_PHASE_FORWARD][VP_CAT_CAST], P_ELEMS * 2);
    EXPECT_BYTES(t.max_live_cast, P_ELEMS * 2);
    EXPECT_BYTES(t.cast_at_first_bwd, 52 * MIB);
    EXPECT_BYTES(t.live_cast, 0);
}

Test(sim_precision, fp32_has_no_weight_cache)
{
    vp_setup s;
    mlp_setup(&s);
    s.steps = 1;
    tally t;
    memset(&t, 0, sizeof t);
    t.step = 1;
    simulate_tally(&s, &t);
    EXPECT_BYTES(t.max_live_cast, 0);
}

/* amp keeps fp32 parameters, grads and state. */
Test(sim_precision, amp_keeps_fp32_parameters)
{
    vp_setup s;
    mlp_setup(&s);
    s.precision = VP_PREC_AMP_BF16;
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.after_model, PBYTES);
    EXPECT_BYTES(e.grad_bytes, PBYTES);
    EXPECT_BYTES(e.step[0].end, 3 * PBYTES);
}

/* Pure bf16: the model is built in fp32 and converted: 2 bytes per
 * parameter remain, P*2 = 84 MiB; grads and state are bf16 too. */
Test(sim_precision, pure_bf16_halves_the_parameters)
{
    vp_setup s;
    mlp_setup(&s);
    s.precision = VP_PREC_BF16;
    vp_estimate e = simulate_mlp(&s);
    EXPECT_BYTES(e.after_model, PBYTES / 2);
    EXPECT_BYTES(e.param_bytes, PBYTES / 2);
    EXPECT_BYTES(e.grad_bytes, PBYTES / 2);
    /* params + AdamW state, all bf16: 84 + 168 MiB */
    EXPECT_BYTES(e.step[0].end, 3 * PBYTES / 2);
}

/* ---- budget ---------------------------------------------------------------------- */

/* With a 256 MiB limit on reserved memory: the workspaces reserve 66 MiB
 * (32 MiB twice, and a 2 MiB small segment for the 1 MiB Lt workspace),
 * the parameters 168 (234), the batch 16 (250; the labels fit in the small
 * segment). layers.0.fc's 16 MiB output needs a new segment: 266 > 256, no
 * cached block to free: out of memory. */
Test(sim_budget, too_small_is_out_of_memory)
{
    mg r = mlp();
    vp_setup s;
    mlp_setup(&s);
    s.alloc.limit = 256 * MIB;
    vp_estimate e;
    vp_error err;
    vp_status st = vp_simulate(r.g, &s, &e, NULL, NULL, &err);
    cr_expect_eq(st, VP_EOOM, "%s", vp_err_name(st));
    cr_expect_eq(err.code, VP_EOOM);
    cr_expect_str_eq(err.msg, "out of memory allocating 16.00 MiB in "
                              "layers.0.fc (step 1, forward)");
    done(&r);
}

/* The peak reserved of the unlimited run fits; 2 MiB less does not. */
Test(sim_budget, limit_at_the_peak_reserved)
{
    mg r = mlp();
    vp_setup s;
    mlp_setup(&s);
    vp_estimate free_run = simulate_ok(r.g, &s);
    s.alloc.limit = free_run.peak_reserved;
    vp_estimate e = simulate_ok(r.g, &s);
    EXPECT_BYTES(e.peak_alloc, free_run.peak_alloc);
    s.alloc.limit = free_run.peak_alloc + free_run.baseline - 2 * MIB;
    vp_error err;
    vp_status st = vp_simulate(r.g, &s, &e, NULL, NULL, &err);
    cr_expect_eq(st, VP_EOOM, "%s", vp_err_name(st));
    done(&r);
}

/* ---- invalid setups ------------------------------------------------------------ */

Test(sim_setup, invalid_values)
{
    mg r = mlp();
    vp_setup s;
    vp_estimate e;
    vp_error err;
    mlp_setup(&s);
    s.steps = 0;
    cr_expect_eq(vp_simulate(r.g, &s, &e, NULL, NULL, &err), VP_EARG);
    mlp_setup(&s);
    s.steps = VP_MAX_STEPS + 1;
    cr_expect_eq(vp_simulate(r.g, &s, &e, NULL, NULL, &err), VP_EARG);
    mlp_setup(&s);
    s.accum = 0;
    cr_expect_eq(vp_simulate(r.g, &s, &e, NULL, NULL, &err), VP_EARG);
    mlp_setup(&s);
    s.batch = 0;
    cr_expect_eq(vp_simulate(r.g, &s, &e, NULL, NULL, &err), VP_EARG);
    mlp_setup(&s);
    s.precision = (vp_precision)99;
    cr_expect_eq(vp_simulate(r.g, &s, &e, NULL, NULL, &err), VP_EARG);
    done(&r);
}

/* A graph without a loss can only run inference. */
Test(sim_setup, training_needs_a_loss)
{
    static const char text[] = "seq: 8\ngraph:\n  input: [batch, seq]\n"
                               "  ops: [{op: linear, out: 8}]\n";
    vp_error err;
    vp_model *m = vp_model_parse_buf(text, sizeof text - 1, "n.yaml", 0, &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, 1, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_setup s;
    vp_setup_init(&s);
    vp_estimate e;
    cr_expect_eq(vp_simulate(g, &s, &e, NULL, NULL, &err), VP_EARG);
    cr_expect(strstr(err.msg, "no loss") != NULL, "%s", err.msg);
    s.inference = true;
    cr_expect_eq(vp_simulate(g, &s, &e, NULL, NULL, &err), VP_OK, "%s",
                 err.msg);
    vp_graph_free(g);
    vp_model_free(m);
}

/* An sm_count of 0 leaves cuDNN no CTAs to split over: refused. */
Test(sim_setup, sm_count_zero)
{
    mg r = mlp();
    vp_setup s;
    vp_estimate e;
    vp_error err;
    mlp_setup(&s);
    s.sm_count = 0;
    cr_expect_eq(vp_simulate(r.g, &s, &e, NULL, NULL, &err), VP_EARG);
    cr_expect(strstr(err.msg, "sm_count") != NULL, "%s", err.msg);
    done(&r);
}

/* ---- GPU-specific constants ---------------------------------------------------- */

/* The largest temporary requested in the backward (its bytes). */
static void max_bwd_temp(const vp_sim_event *ev, void *ud)
{
    uint64_t *m = ud;
    if (!ev->is_free && ev->phase == VP_PHASE_BACKWARD &&
        ev->category == VP_CAT_TEMP && ev->bytes > *m)
        *m = ev->bytes;
}

/* The largest temporary of one training step of the graph model `text`
 * (batch 1, its default seq) on a GPU of sm_count SMs. */
static uint64_t largest_bwd_temp(const char *text, uint32_t sm_count)
{
    vp_error err;
    vp_model *m = vp_model_parse_buf(text, strlen(text), "t.yaml", 0, &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, 1, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_setup s;
    vp_setup_init(&s);
    s.steps = 1;
    s.sm_count = sm_count;
    vp_estimate e;
    uint64_t ws = 0;
    cr_assert_eq(vp_simulate(g, &s, &e, max_bwd_temp, &ws, &err), VP_OK,
                 "%s", err.msg);
    vp_graph_free(g);
    vp_model_free(m);
    return ws;
}

static uint64_t conv_filter_workspace(uint32_t sm_count)
{
    return largest_bwd_temp(
        "seq: 28\ngraph:\n  input: [batch, 128, image, image]\n"
        "  ops:\n"
        "    - {name: conv, op: conv2d, out: 128, kernel: 3, padding: 1,"
        " bias: false}\n"
        "    - {op: flatten, start: 1}\n"
        "    - {op: mse_loss}\n",
        sm_count);
}

/* The fp32 filter gradient of a 3x3 128 -> 128 convolution on a 28 x 28
 * image (batch 1; its input needs no gradient, so it is the only cuDNN
 * call of the backward): the workspace holds NHWC copies of the input and
 * the output (128 x 784 x 4 = 401408 B each), of the filter (128 x 128 x
 * 9 x 4 = 589824 B), 147 B of slack and the split-K partial filters. The
 * filter is 1 x 9 tiles of 128 x 128, so one wave of CTAs makes floor(SMs
 * / 9) splits: 14 on the H200's 132 SMs, 12 on the A100's 108. */
#define CONV_COPIES (2 * 401408ULL + 589824ULL + 147ULL)
Test(sim_gpu, conv_filter_split_k_fills_the_sms)
{
    cr_expect_eq(conv_filter_workspace(VP_DEFAULT_SM_COUNT),
                 CONV_COPIES + 14 * 589824ULL);
    cr_expect_eq(conv_filter_workspace(108), CONV_COPIES + 12 * 589824ULL);
    /* at most 16 splits, however many SMs */
    cr_expect_eq(conv_filter_workspace(1000), CONV_COPIES + 16 * 589824ULL);
    /* fewer SMs than tiles: no split-K at all */
    cr_expect_eq(conv_filter_workspace(8), CONV_COPIES);
}

static uint64_t bias_staging(uint32_t sm_count)
{
    return largest_bwd_temp("seq: 8192\ngraph:\n  input: [batch, seq, 64]\n"
                            "  ops:\n"
                            "    - {op: linear, out: 3072}\n"
                            "    - {op: mse_loss}\n",
                            sm_count);
}

/* The bias gradient of a linear to 3072 features over 8192 rows: the
 * global reduction stages out x R fp32 values, R = min(2 rows, cap / out)
 * with a cap of 34,700,000 elements on the H200's 132 SMs (measured
 * 138,412,032 B, R = 11264; SIMULATION_NOTES.md §8.1), scaled by the SM
 * count: 34700000 / 3072 = 11295 rows on 132 SMs, 34700000 x 108 / 132 /
 * 3072 = 9241 on 108. The largest temporary of the backward (grad_out is
 * 8192 x 3072 x 4 = 100,663,296 B; the input needs no gradient). */
Test(sim_gpu, bias_staging_scales_with_the_sms)
{
    cr_expect_eq(bias_staging(VP_DEFAULT_SM_COUNT), 4ULL * 3072 * 11295);
    cr_expect_eq(bias_staging(108), 4ULL * 3072 * 9241);
}

/* A GPU profile's sm_count reaches the setup; the default is the H200's. */
Test(sim_gpu, profile_sets_the_sm_count)
{
    vp_setup s;
    vp_setup_init(&s);
    cr_expect_eq(s.sm_count, 132u);
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load("a100-80g", &err);
    cr_assert_not_null(p, "%s", err.msg);
    cr_expect_eq(vp_gpu_sm_count(p), 108u);
    vp_gpu_apply(p, &s);
    cr_expect_eq(s.sm_count, 108u);
    vp_gpu_free(p);
}

/* ---- extremes ------------------------------------------------------------------- */

/* tf-1t: H = 32768, L = 66, 256 heads of 128, 16 kv heads (k, v 32768 x
 * 2048), SwiGLU F = 131072, V = 131072, RMSNorm, no biases, untied.
 *   per layer: norms 2H                   =        65536
 *              q, o 2 * H * H             =   2147483648
 *              k, v 2 * H * 2048          =    134217728
 *              gate, up, down 3 * H * F   =  12884901888
 *              total                      =  15166668800
 *   66 layers                             = 1001000140800
 *   embed + lm_head 2 * V * H             =    8589934592
 *   final norm H                          =         32768
 *   total                                 = 1009590108160 */
#define TF1T_PARAMS 1009590108160ULL

Test(sim_extreme, trillion_parameter_count, .timeout = 30)
{
    mg r = open_graph(GOOD_DIR "tf-1t.yaml", 1, 0);
    uint64_t n;
    cr_assert_eq(vp_graph_num_params(r.g, &n, NULL), VP_OK);
    EXPECT_BYTES(n, TF1T_PARAMS);
    done(&r);
}

/* fp32 AdamW at batch 1, seq 2048: the optimizer dominates. Every weight is
 * a multiple of 2 MiB and every norm weight 128 KiB (a small-pool block of
 * exactly that size), so:
 *   after_model = P*4 + 512 (the rotary inv_freq buffer: 64 fp32 = 256 B in
 *                 a 512-B block), 4038360433152 B;
 *   step-1 optimizer peak = after_bwd + 2*P*4 (state) + P*4 (sqrt);
 *   the peak is that step (about 20 TB), with params, grads, 2 x state and
 *   1 x temporaries = 5 * P*4 of it; nothing wraps. */
Test(sim_extreme, trillion_parameter_estimate, .timeout = 60)
{
    mg r = open_graph(GOOD_DIR "tf-1t.yaml", 1, 0);
    vp_setup s;
    vp_setup_init(&s);
    s.fresh_process = false;
    s.steps = 1;
    vp_estimate e;
    vp_error err;
    vp_status st = vp_simulate(r.g, &s, &e, NULL, NULL, &err);
    if (st == VP_EOVERFLOW || st == VP_EOOM) {
        /* a clean refusal is acceptable */
        cr_expect_gt(strlen(err.msg), 0);
        done(&r);
        return;
    }
    cr_assert_eq(st, VP_OK, "%s (%s)", err.msg, vp_err_name(st));
    const uint64_t pb = TF1T_PARAMS * 4;
    EXPECT_BYTES(e.params, TF1T_PARAMS);
    EXPECT_BYTES(e.param_bytes, pb + 256);
    EXPECT_BYTES(e.grad_bytes, pb);
    EXPECT_BYTES(e.after_model, pb + 512);
    EXPECT_BYTES(e.step[0].peak[VP_PHASE_OPTIMIZER],
                 e.step[0].after_bwd + 3 * pb);
    EXPECT_BYTES(e.peak_alloc, e.step[0].peak[VP_PHASE_OPTIMIZER]);
    cr_expect_eq(e.peak_phase, VP_PHASE_OPTIMIZER);
    EXPECT_BYTES(e.by_category[VP_CAT_PARAM], pb + 512);
    EXPECT_BYTES(e.by_category[VP_CAT_GRAD], pb);
    EXPECT_BYTES(e.by_category[VP_CAT_OPTIM], 2 * pb);
    cr_expect_geq(e.by_category[VP_CAT_TEMP], pb);
    EXPECT_BYTES(category_sum(&e), e.peak_alloc);
    cr_expect_lt(e.peak_alloc, 6 * pb);
    cr_expect_geq(e.peak_reserved, e.peak_alloc);
    done(&r);
}

/* GPT-2 small at batch 1,000,000 x 1024 tokens (N = 1.024e9) in fp32: the
 * logits N x V x 4 = 205,852,672,000,000 B fit in 64 bits, so the answer
 * must be a number, and a sane one: at the loss head's backward the
 * saved fp32 log-probs, the nll grad and the log_softmax grad are live
 * together (3 x N x V x 4, SIMULATION_NOTES.md §3.4), on top of the
 * parameters; the peak must be at least that and well under 2^63. */
Test(sim_extreme, gpt2_small_batch_one_million, .timeout = 60)
{
    mg r = open_graph("models/gpt2-small.yaml", 1000000, 1024);
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 1000000;
    s.steps = 1;
    vp_estimate e;
    vp_error err;
    vp_status st = vp_simulate(r.g, &s, &e, NULL, NULL, &err);
    if (st != VP_OK) {
        cr_expect(st == VP_EOVERFLOW || st == VP_EOOM, "%s: %s",
                  vp_err_name(st), err.msg);
        cr_expect_gt(strlen(err.msg), 0);
        done(&r);
        return;
    }
    const uint64_t nv4 = 1024000000ULL * 50257ULL * 4ULL;
    EXPECT_BYTES(nv4, 205852672000000ULL);
    EXPECT_BYTES(e.params, 124439808ULL);
    cr_expect_geq(e.peak_alloc, 3 * nv4 + 124439808ULL * 4, "%llu",
                  (unsigned long long)e.peak_alloc);
    cr_expect_lt(e.peak_alloc, (uint64_t)1 << 62, "%llu",
                 (unsigned long long)e.peak_alloc);
    cr_expect_geq(e.step[0].peak[VP_PHASE_BACKWARD], e.step[0].after_fwd);
    cr_expect_geq(e.step[0].after_fwd, e.step[0].start);
    EXPECT_BYTES(category_sum(&e), e.peak_alloc);
    done(&r);
}

/* A batch whose tensors pass 2^64 bytes is refused when the graph is built
 * (batch x seq x vocab x 8 overflows), before any simulation. */
Test(sim_extreme, gpt2_small_batch_too_large_to_build)
{
    vp_error err;
    vp_model *m = vp_model_load("models/gpt2-small.yaml", &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, (uint64_t)1 << 40, 1024, &err);
    cr_expect_null(g);
    vp_graph_free(g);
    cr_expect_eq(err.code, VP_EOVERFLOW);
    vp_model_free(m);
}

/* ---- bugs ------------------------------------------------------------------------ */

/* Regression test (once a bug in src/sim.c, vp_simulate): optim_bytes is documented (sim.h) as the
 * optimizer state after step 1, but it is taken from by_category at the
 * peak. When the peak comes before the first optimizer step (one step
 * simulated, peak in its backward) it is 0. mlp-sim at batch 16384, one
 * step of AdamW: the peak is in the backward (activations of 256 MiB),
 * and step 1 ends with params + state = 168 + 336 MiB, so optim_bytes must
 * be 2 * P*4 = 336 MiB. */
Test(sim_bugs, optim_bytes_when_the_peak_precedes_the_optimizer)
{
    mg r = open_graph(GOOD_DIR "mlp-sim.yaml", 16384, 0);
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 16384;
    s.fresh_process = false;
    s.steps = 1;
    vp_estimate e = simulate_ok(r.g, &s);
    cr_assert_eq(e.peak_phase, VP_PHASE_BACKWARD);
    EXPECT_BYTES(e.step[0].end, 3 * PBYTES);
    EXPECT_BYTES(e.optim_bytes, 2 * PBYTES);
    done(&r);
}

/* Regression test (once a bug in src/sim.c, save / forward_pass): a checkpointed segment's inputs
 * are saved on its last op, at most MAX_SAVED (12) tensors, guarded by a
 * VP_ASSERT. A block that reads `$input` in more than 12 ops (13 adds
 * here: a valid model) aborts the process under --checkpoint all instead
 * of simulating (bad or unusual input must never reach an assert). */
Test(sim_bugs, checkpointed_block_with_many_uses_of_its_input)
{
    char text[2048];
    int n = snprintf(text, sizeof text,
                     "seq: 8\n"
                     "graph:\n"
                     "  input: [batch, seq]\n"
                     "  blocks:\n"
                     "    b:\n"
                     "      ops:\n"
                     "        - {name: a0, op: linear, out: seq}\n");
    for (int i = 1; i <= 13; i++)
        n += snprintf(text + n, sizeof text - (size_t)n,
                      "        - {name: a%d, op: add, inputs: [a%d, $input]}\n",
                      i, i - 1);
    snprintf(text + n, sizeof text - (size_t)n,
             "  ops:\n"
             "    - {name: pre, op: linear, out: seq}\n"
             "    - {name: blk, block: b, repeat: 1}\n"
             "    - {op: cross_entropy}\n");
    vp_error err;
    vp_model *m = vp_model_parse_buf(text, strlen(text), "many.yaml", 0, &err);
    cr_assert_not_null(m, "%s:%u:%u: %s", err.path, err.line, err.col,
                       err.msg);
    vp_graph *g = vp_graph_build(m, 1, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert_eq(vp_graph_segment_count(g), 1);
    bool ck[1] = {true};
    vp_setup s;
    vp_setup_init(&s);
    s.checkpoint = ck;
    s.n_checkpoint = 1;
    vp_estimate e = simulate_ok(g, &s);
    cr_expect_gt(e.peak_alloc, 0);
    vp_graph_free(g);
    vp_model_free(m);
}
