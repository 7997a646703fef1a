/* Rules of the optimizers' state that make mutants found untested
 * (scripts/mutants.tsv; docs/MUTANTS.md). Expected values are worked out
 * by hand from the rule's source, on tests/data/good/mlp-sim.yaml at batch
 * 1024 in fp32 (test_sim.c describes it): two 4096 x 4096 weights and a
 * 2560 x 4096 head, no biases. Run from the repository root. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <string.h>

#include "vramplan/vramplan.h"

#define MIB ((uint64_t)1 << 20)

/* Simulate a model file under setup *s, its events to fn (may be NULL). */
static vp_estimate run_model(const char *model, const vp_setup *s,
                             vp_sim_event_fn fn, void *ud)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_model *m = vp_model_load(model, &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, s->batch, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_estimate e;
    vp_status st = vp_simulate(g, s, &e, fn, ud, &err);
    cr_assert_eq(st, VP_OK, "vp_simulate: %s", err.msg);
    vp_graph_free(g);
    vp_model_free(m);
    return e;
}

/* mlp-sim at batch 1024, two steps, with the optimizer on the GPU or
 * offloaded to the host. */
static vp_estimate simulate_mlp_setup(vp_optimizer opt, bool offload)
{
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 1024;
    s.fresh_process = false;
    s.steps = 2;
    s.optimizer = opt;
    s.offload_optimizer = offload;
    return run_model("tests/data/good/mlp-sim.yaml", &s, NULL, NULL);
}

static vp_estimate simulate_mlp(vp_optimizer opt)
{
    return simulate_mlp_setup(opt, false);
}

/* torch.optim.Adafactor (torch/optim/_adafactor.py, Adafactor._init_group):
 * a matrix keeps row_var (rows x 1) and col_var (1 x cols) in the
 * gradient's dtype, not a full variance, and a 0-dim step. A 4096 x 4096
 * fp32 weight: 4096 + 4096 values, 32768 B + the 4-byte step, 33280 B as
 * 512-B blocks of the small pool; the 2560 x 4096 head: 2560 + 4096 values,
 * 26624 + 4 B, 27136 B as blocks. The full variance would be 168 MiB. */
Test(rules_optim, adafactor_factors_the_second_moment)
{
    vp_estimate e = simulate_mlp(VP_OPT_ADAFACTOR);
    cr_expect_eq(e.optim_bytes, 2 * 33280ULL + 27136ULL, "optim_bytes %llu",
                 (unsigned long long)e.optim_bytes);
}

/* bitsandbytes AdamW8bit (optim/optimizer.py, Optimizer2State.init_state,
 * not paged): a parameter of 4096 values or more keeps two uint8 moments
 * (torch.zeros_like) and two fp32 absmax tensors of one value per 2048
 * (blocks = n // 2048, one more for a remainder), and the first such
 * parameter moves the two 256-value fp32 maps (1 KiB each) to the GPU.
 * A 4096 x 4096 weight: 2 x 16 MiB + 2 x 8192 x 4 B; the 2560 x 4096
 * head: 2 x 10 MiB + 2 x 5120 x 4 B. Blocks of 256 would make the absmax
 * tensors 8 times larger (256 KiB and 160 KiB). */
Test(rules_optim, adamw_8bit_absmax_per_2048_values)
{
    vp_estimate e = simulate_mlp(VP_OPT_ADAMW_8BIT);
    uint64_t fc = 2 * 16 * MIB + 2 * 32768ULL;
    uint64_t head = 2 * 10 * MIB + 2 * 20480ULL;
    cr_expect_eq(e.optim_bytes, 2 * fc + head + 2 * 1024ULL,
                 "optim_bytes %llu", (unsigned long long)e.optim_bytes);
    cr_expect_eq(e.paged_bytes, 0);
}

/* The optimizer state allocated in step 1, in order (the event stream). */
typedef struct {
    uint64_t bytes[16];
    size_t n;
} state_allocs;

static void record_state(const vp_sim_event *ev, void *ud)
{
    state_allocs *a = ud;
    if (ev->step == 1 && !ev->is_free && ev->category == VP_CAT_OPTIM &&
        a->n < sizeof a->bytes / sizeof *a->bytes)
        a->bytes[a->n++] = ev->bytes;
}

/* torch.optim.Adafactor factors the second moment of every tensor of two
 * dimensions (torch/optim/_adafactor.py, Adafactor._init_group: row_var
 * with the last dimension 1, col_var with the one before 1), an
 * embedding's table too. tests/data/good/tf-small.yaml's first two
 * parameters are its embeddings: the token table 1000 x 64, (1000 + 64)
 * x 4 B + the 4-byte step = 4260 B; the learned positions 128 x 64,
 * (128 + 64) x 4 + 4 = 772 B. (Full variances: 256004 and 32772 B.) */
Test(rules_optim, adafactor_factors_an_embedding_table)
{
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 2;
    s.steps = 1;
    s.optimizer = VP_OPT_ADAFACTOR;
    state_allocs a = {0};
    run_model("tests/data/good/tf-small.yaml", &s, record_state, &a);
    cr_assert_geq(a.n, 2, "%zu state allocations", a.n);
    cr_expect_eq(a.bytes[0], 4260u, "token table: %llu B",
                 (unsigned long long)a.bytes[0]);
    cr_expect_eq(a.bytes[1], 772u, "positions: %llu B",
                 (unsigned long long)a.bytes[1]);
}

/* The optimizer on the host (ZeRO-Offload's DeepSpeedCPUAdam: the fp32
 * partition, its moments and the gradients copied down in fp32,
 * deepspeed/runtime/zero/stage_1_and_2.py with offload_optimizer): per
 * fp32 parameter, Adam's two moments (8 B) and the gradient's host copy
 * (4 B); the weights themselves stay on the GPU. mlp-sim: P = 2 x 4096^2
 * + 2560 x 4096 = 44,040,192 values, 12 P = 528,482,304 B of host
 * memory. */
Test(rules_optim, offloaded_adamw_keeps_moments_and_a_gradient_copy_on_the_host)
{
    vp_estimate e = simulate_mlp_setup(VP_OPT_ADAMW, true);
    cr_expect_eq(e.host_bytes, 12ULL * 44040192ULL, "host_bytes %llu",
                 (unsigned long long)e.host_bytes);
    cr_expect_eq(e.optim_bytes, 0u, "optim_bytes %llu on the GPU",
                 (unsigned long long)e.optim_bytes);
}
