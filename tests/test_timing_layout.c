/* Memory-bound kernels by input layout and HF's Python RMSNorm by its
 * input's width (src/timing_layout.c; docs/STEP_TIME.md "Memory-bound
 * kernels by input layout"): the ratios of the H200's strided profile
 * (calibrate/profiles/h200-strided.jsonl, at 64 M elements), on the ops
 * whose inputs the models make non-contiguous or broadcast. */
#include <criterion/criterion.h>
#include <string.h>

#include "vramplan/vramplan.h"

#include "../src/graph_internal.h"
#include "../src/sim_internal.h"
#include "../src/timing_layout.h"

/* ops: 0 a linear [N, 2F], 1 a slice of it [N, F] (Phi-3's gate), 2 a
 * second slice (up), 3 silu(gate), 4 up * silu(gate), 5 a linear [N, F],
 * 6 silu of it, 7 RoPE on it */
enum { LIN2, GATE, UP, ACT, MUL, LIN, ACT2, ROPE, N_OPS };
#define ROWS 64
#define F 128

static vp_op ops[N_OPS];
static vp_graph g;

static void op(int i, vp_op_kind k, uint64_t numel, int in0, int in1)
{
    memset(&ops[i], 0, sizeof ops[i]);
    ops[i].kind = k;
    ops[i].numel = numel;
    ops[i].n_inputs = in0 < 0 ? 0 : in1 < 0 ? 1 : 2;
    ops[i].inputs[0] = in0 < 0 ? 0 : (uint32_t)in0;
    ops[i].inputs[1] = in1 < 0 ? 0 : (uint32_t)in1;
}

static void setup(void)
{
    op(LIN2, VP_OP_LINEAR, ROWS * 2 * F, -1, -1);
    op(GATE, VP_OP_SELECT, ROWS * F, LIN2, -1);
    op(UP, VP_OP_SELECT, ROWS * F, LIN2, -1);
    op(ACT, VP_OP_SILU, ROWS * F, GATE, -1);
    op(MUL, VP_OP_MUL, ROWS * F, UP, ACT);
    op(LIN, VP_OP_LINEAR, ROWS * F, -1, -1);
    op(ACT2, VP_OP_SILU, ROWS * F, LIN, -1);
    op(ROPE, VP_OP_ROPE, ROWS * F, LIN, -1);
    memset(&g, 0, sizeof g);
    g.ops = ops;
    g.n_ops = N_OPS;
}

/* the ratio of op i's kernel writing `width`-byte elements of its output */
static double ratio(int i, int ph, double width)
{
    return vp__layout_ratio(&g, &ops[i], ph, width * (double)ops[i].numel);
}

TestSuite(timing_layout, .init = setup);

Test(timing_layout, silu_on_a_chunk_runs_the_strided_unary_kernel)
{
    cr_assert_float_eq(ratio(ACT, 0, 2), 2.58, 1e-12);
    cr_assert_float_eq(ratio(ACT, 1, 2), 2.58, 1e-12);
    cr_assert_float_eq(ratio(ACT, 0, 4), 1.68, 1e-12);
}

Test(timing_layout, product_with_a_chunk_runs_the_strided_binary_kernel)
{
    cr_assert_float_eq(ratio(MUL, 0, 2), 1.95, 1e-12);
    cr_assert_float_eq(ratio(MUL, 1, 4), 1.26, 1e-12);
}

/* RoPE is timed as a whole op (vp__rope_bytes), not kernel by kernel */
Test(timing_layout, rope_has_no_per_allocation_ratio)
{
    cr_assert_float_eq(ratio(ROPE, 0, 2), 1.0, 1e-12);
    cr_assert_float_eq(ratio(ROPE, 1, 4), 1.0, 1e-12);
}

/* The profile's ratios at 64 M elements (h200-strided.jsonl, kernels'
 * own us): broadcast mul over contiguous mul (183.2 / 92.5, 212.1 /
 * 184.8), rotate_half, the neg of a slice and the cat, over a copy
 * (223.4 / 64.4, 278.7 / 126.8), neg of a slice over neg (158.6 / 64.0,
 * 194.9 / 127.1), copy of a slice over copy (155.5 / 64.4, 194.1 /
 * 126.8); [16-bit, fp32]. */
static const double bcast[2] = {1.98, 1.15};
static const double rot[2] = {3.47, 2.20};
static const double neg[2] = {2.48, 1.53};
static const double chunk_copy[2] = {2.42, 1.53};

/* q * cos + rotate_half(q) * sin on bf16 q and cos: two broadcast
 * products (read 2, write 2 bytes an element), rotate_half (a copy's 4),
 * the add (6) */
Test(timing_layout, rope_forward_moves_its_five_kernels_bytes)
{
    double k = 0;
    double want = 2 * 4 * bcast[0] + 2 * 2 * rot[0] + 3 * 2;
    cr_assert_float_eq(vp__rope_bytes(1e6, 2, 2, 0, &k) / 1e6, want, 1e-9);
    cr_assert_float_eq(k, 3.0, 1e-12); /* the rules' allocations */
}

/* grad * sin and grad * cos (broadcast), neg of grad's strided half, two
 * slice_backward (zeros, a copy into the half), two sums of x's three
 * gradients: 15 bytes an element of bf16 before the layouts' ratios */
Test(timing_layout, rope_backward_moves_its_nine_kernels_bytes)
{
    double k = 0;
    double want = 2 * 4 * bcast[0] + 2 * neg[0] +
                  2 * (2 + 2 * chunk_copy[0]) + 2 * 6;
    cr_assert_float_eq(vp__rope_bytes(1e6, 2, 2, 1, &k) / 1e6, want, 1e-9);
    cr_assert_float_eq(k, 2.0, 1e-12);
}

/* Under autocast over an fp32 embedding cos is fp32 and q bf16: the
 * products write fp32, and the backward casts each product's gradient
 * back to q's dtype (the engine's validate_outputs) */
Test(timing_layout, rope_under_autocast_casts_its_gradients_back)
{
    double k = 0;
    double fwd = 2 * 6 * bcast[1] + 2 * 2 * rot[0] + 3 * 4;
    double bwd = 2 * 8 * bcast[1] + 2 * 6 + 2 * neg[0] +
                 2 * (2 + 2 * chunk_copy[0]) + 2 * 6;
    cr_assert_float_eq(vp__rope_bytes(1e6, 2, 4, 0, &k) / 1e6, fwd, 1e-9);
    cr_assert_float_eq(vp__rope_bytes(1e6, 2, 4, 1, &k) / 1e6, bwd, 1e-9);
}

Test(timing_layout, contiguous_inputs_run_the_vectorized_kernel)
{
    cr_assert_float_eq(ratio(ACT2, 0, 2), 1.0, 1e-12);
    cr_assert_float_eq(ratio(ACT2, 1, 4), 1.0, 1e-12);
    cr_assert_float_eq(ratio(LIN, 0, 2), 1.0, 1e-12);
}

/* slice_backward writes the sliced input's gradient: its width is
 * read off the input's elements, not the slice's */
Test(timing_layout, slice_backward_copies_into_strided_rows)
{
    double in = (double)ops[LIN2].numel;
    cr_assert_float_eq(vp__layout_ratio(&g, &ops[GATE], 1, 2 * in), 2.42,
                       1e-12);
    cr_assert_float_eq(vp__layout_ratio(&g, &ops[GATE], 1, 4 * in), 1.53,
                       1e-12);
    cr_assert_float_eq(vp__layout_ratio(&g, &ops[GATE], 0, 2 * in), 1.0,
                       1e-12);
}

Test(timing_layout, rmsnorm_charges_a_wide_input_its_kernels_bytes)
{
    cr_assert_float_eq(vp__rmsnorm_py_bytes(2.0), 4.0, 1e-12);
    cr_assert_float_eq(vp__rmsnorm_py_bytes(4.0), 4.0 * 28.0 / 36.0, 1e-12);
}

/* transformers' sdpa_attention_forward copies the kernel's output
 * (transpose(1, 2).contiguous()) where flash's layout is not already
 * [B, L, h, d]: a head width not a power of two (Phi-3's 96) or v's
 * width unlike q's (MLA); timed then at the transposed copy's rate */
Test(timing_layout, hf_copies_a_flash_output_of_odd_head_width)
{
    vp_op a;
    memset(&a, 0, sizeof a);
    a.kind = VP_OP_ATTENTION;
    a.causal = true;
    a.n_inputs = 3;
    a.head_dim = 96;
    cr_assert(vp__attention_out_copied(&a, VP_ATTN_FLASH));
    cr_assert_not(vp__attention_out_copied(&a, VP_ATTN_EFFICIENT));
    a.head_dim = 128;
    cr_assert_not(vp__attention_out_copied(&a, VP_ATTN_FLASH));
    a.head_dim = 192;
    a.v_head_dim = 128;
    cr_assert(vp__attention_out_copied(&a, VP_ATTN_FLASH));
    a.flags = VP_OPF_MEGATRON;
    cr_assert_not(vp__attention_out_copied(&a, VP_ATTN_FLASH));
    cr_assert_float_eq(vp__layout_transpose_copy(false), 2.84, 1e-12);
}
