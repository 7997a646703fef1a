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

static vp_estimate simulate_mlp(vp_optimizer opt)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_model *m = vp_model_load("tests/data/good/mlp-sim.yaml", &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, 1024, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 1024;
    s.fresh_process = false;
    s.steps = 2;
    s.optimizer = opt;
    vp_estimate e;
    vp_status st = vp_simulate(g, &s, &e, NULL, NULL, &err);
    cr_assert_eq(st, VP_OK, "vp_simulate: %s", err.msg);
    vp_graph_free(g);
    vp_model_free(m);
    return e;
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
