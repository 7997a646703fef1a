/* Memory-bound kernels by input layout (docs/STEP_TIME.md "Memory-bound
 * kernels by input layout").
 *
 * ATen's TensorIterator vectorizes an elementwise kernel only when every
 * operand is contiguous (aten/src/ATen/native/cuda/CUDALoops.cuh
 * gpu_kernel_impl: vectorized_elementwise_kernel when
 * iter.is_contiguous(), else unrolled_elementwise_kernel or, with
 * non-trivial strides, elementwise_kernel over offset calculators); a
 * slice of a fused projection's output (row stride twice its width) and a
 * stride-0 broadcast operand are not. A transpose alone is not: the
 * iterator reorders the dimensions of operands permuted alike (the
 * profile: mul, add, silu, neg on transposed inputs at 0.99-1.01 of the
 * contiguous time). The H200's run (calibrate/profiles/h200-strided.jsonl,
 * calibrate/vp-kernels-strided.py, torch 2.11.0+cu130; the kernels' own
 * time at 64 M elements against the same op's contiguous kernel) gives
 * the ratios below; 16 and 32 M elements agree within 0.07. */
#include "timing_layout.h"

#include "graph_internal.h"
#include "sim_internal.h" /* VP__LAY_* */

enum {
    LAY_BCAST,
    LAY_CHUNK_BINARY,
    LAY_CHUNK_UNARY,
    LAY_CHUNK_COPY,
    LAY_TRANSPOSE_COPY,
    LAY_CHUNK_NEG,
    LAY_ROTATE_HALF,
    LAY__N
};

/* [16-bit, fp32] */
static const double layout_ratio[LAY__N][2] = {
    [LAY_BCAST] = {1.98, 1.15},        /* mul 183.2 / 92.5, 212.1 / 184.8 us */
    [LAY_CHUNK_BINARY] = {1.95, 1.26}, /* mul 180.8 / 92.5, 232.5 / 184.8 us */
    [LAY_CHUNK_UNARY] = {2.58, 1.68},  /* silu 181.3 / 70.1, 213.1 / 126.9  */
    [LAY_CHUNK_COPY] = {2.42, 1.53},   /* copy 155.5 / 64.4, 194.1 / 126.8  */
    /* x.transpose(1, 2).contiguous() of [B, S, H, d]: 182.7 / 64.4,
     * 214.4 / 126.8 us */
    [LAY_TRANSPOSE_COPY] = {2.84, 1.69},
    [LAY_CHUNK_NEG] = {2.48, 1.53},    /* neg 158.6 / 64.0, 194.9 / 127.1  */
    /* HF rotate_half, cat((-x2, x1), dim=-1) of x's two halves (the
     * strided neg and CatArrayBatchedCopy), against a copy of x: 223.4 /
     * 64.4, 278.7 / 126.8 us */
    [LAY_ROTATE_HALF] = {3.47, 2.20},
};

double vp__layout_transpose_copy(bool wide)
{
    return layout_ratio[LAY_TRANSPOSE_COPY][wide];
}

double vp__layout_broadcast(bool wide)
{
    return layout_ratio[LAY_BCAST][wide];
}

double vp__layout_of(int layout, int kind, bool wide)
{
    if (layout == VP__LAY_BCAST)
        return layout_ratio[LAY_BCAST][wide];
    if (layout != VP__LAY_CHUNK)
        return 1.0;
    int r = kind == VP_HW_MEM_ADD                              ? LAY_CHUNK_BINARY
            : kind == VP_HW_MEM_SILU || kind == VP_HW_MEM_GELU ? LAY_CHUNK_UNARY
                                                               : LAY_CHUNK_COPY;
    return layout_ratio[r][wide];
}

static bool sliced(const vp_graph *g, uint32_t in)
{
    return in < g->n_ops && g->ops[in].kind == VP_OP_SELECT;
}

/* The elements an allocation of op o counts: a slice's backward writes
 * its input's gradient (slice_backward), the others their output's. */
static double elements(const vp_graph *g, const vp_op *o)
{
    if (o->kind == VP_OP_SELECT && o->n_inputs && o->inputs[0] < g->n_ops)
        return (double)g->ops[o->inputs[0]].numel;
    return (double)o->numel;
}

double vp__layout_ratio(const vp_graph *g, const vp_op *o, int ph,
                        double bytes)
{
    double n = elements(g, o);
    int wide = n > 0 && bytes / n > 3.0; /* fp32 elements */
    /* slice_backward: zeros, then a copy into the slice's strided rows
     * (aten/src/ATen/native/TensorShape.cpp slice_backward) */
    if (o->kind == VP_OP_SELECT)
        return ph == 1 ? layout_ratio[LAY_CHUNK_COPY][wide] : 1.0;
    bool chunk = false;
    for (uint32_t a = 0; a < o->n_inputs; a++)
        chunk = chunk || sliced(g, o->inputs[a]);
    if (!chunk)
        return 1.0;
    /* Phi-3's MLP (transformers models/phi3/modeling_phi3.py
     * Phi3MLP.forward: gate, up_states = up_states.chunk(2, dim=-1);
     * up_states * self.activation_fn(gate)) */
    switch (o->kind) {
    case VP_OP_MUL:
    case VP_OP_ADD:
        return layout_ratio[LAY_CHUNK_BINARY][wide];
    case VP_OP_SILU:
    case VP_OP_GELU:
        return layout_ratio[LAY_CHUNK_UNARY][wide];
    default:
        return 1.0;
    }
}

/* LlamaRMSNorm.forward (modeling_llama.py): to(float32), pow(2),
 * mean(-1), rsqrt, multiply, to(input dtype), times the weight: 36 bytes
 * moved per element on a 16-bit input, 28 on fp32 (the casts are
 * no-ops). The sweep's rate counts 4 (a 16-bit input and output). */
double vp__rmsnorm_py_bytes(double width)
{
    return width > 3.0 ? 4.0 * 28.0 / 36.0 : 4.0;
}

/* HF apply_rotary_pos_emb on one of q, k of n elements (transformers
 * models/llama/modeling_llama.py apply_rotary_pos_emb, rotate_half):
 * bytes of its kernels at the elementwise rate, each already times its
 * layout's ratio; `in` the rotated tensor's bytes an element, `out` the
 * result's (the wider of it and cos's). Forward: q * cos and
 * rotate_half(q) * sin against the [B, 1, S, d] broadcast cos and sin
 * (read in, write out each), rotate_half (the profile's neg of the slice
 * x2 and cat with the slice x1, against a copy of x), the add (two read,
 * one written). Backward
 * (tools/autograd/derivatives.yaml): AddBackward0 nothing; MulBackward0
 * grad * sin and grad * cos (out read, out written, broadcast, then a
 * copy to in where the dtypes differ: the engine's cast of a gradient
 * to its input's dtype); CatBackward0 narrow views; NegBackward0 on the
 * strided half of grad; SliceBackward0 of each half (aten/src/ATen/
 * native/TensorShape.cpp slice_backward: zeros of x's size, then a copy
 * into the half: in written, then in read and written over the half);
 * the sums of x's three gradients (2 adds: two read, one written); the
 * fill is contiguous, the copies into the slices strided (the chunk
 * copy's ratio). *k gets the kernels whose fixed time the model charges:
 * the rules' allocations (src/ops/pointwise.c vp__rope_fwd: two
 * temporaries and the output; vp__rope_bwd: a temporary and x's
 * gradient), as for every op's allocations (timing.c kernel_time); the
 * others' start and tail overlap their neighbours'. */
double vp__rope_bytes(double n, double in, double out, int ph, double *k)
{
    bool w = in > 3.0;
    double bc = layout_ratio[LAY_BCAST][out > 3.0];
    double un = layout_ratio[LAY_CHUNK_NEG][w];
    double cp = layout_ratio[LAY_CHUNK_COPY][w];
    if (ph == 0) {
        *k = 3.0;
        return n * (2.0 * (in + out) * bc +
                    2.0 * in * layout_ratio[LAY_ROTATE_HALF][w] + 3.0 * out);
    }
    bool cast = in != out;
    *k = 2.0;
    return n * (2.0 * 2.0 * out * bc + (cast ? 2.0 * (in + out) : 0.0) +
                in * un + 2.0 * (in + in * cp) + 2.0 * 3.0 * in);
}
