/* Rules of the op families that make mutants found untested
 * (scripts/mutants.tsv; docs/MUTANTS.md), read from the simulated event
 * stream of one op (vp_simulate's callback): the exact sizes and order of
 * the allocations inside it, worked out by hand from the PyTorch or
 * transformers code the rule cites. Run from the repository root. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/vramplan.h"

#define MAX_EV 64

typedef struct {
    bool is_free;
    uint64_t bytes; /* the request; a free gives its block's size */
    uint64_t tensor;
    vp_category cat;
    vp_phase phase;
} op_event;

/* The events of one op in step 1 (its forward and its backward). */
typedef struct {
    const char *op;
    op_event ev[MAX_EV];
    size_t n;
} op_stream;

static void record(const vp_sim_event *ev, void *ud)
{
    op_stream *s = ud;
    if (ev->step != 1 || !ev->op || strcmp(ev->op, s->op) != 0)
        return;
    cr_assert_lt(s->n, MAX_EV, "more than %d events in %s", MAX_EV, s->op);
    s->ev[s->n++] = (op_event){ev->is_free, ev->bytes, ev->tensor,
                               ev->category, ev->phase};
}

#define TF_SMALL "tests/data/good/tf-small.yaml"

/* A setup at batch 2, one step, fp32, the model's attention. */
static vp_setup setup_b2(void)
{
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 2;
    s.steps = 1;
    return s;
}

/* Simulate a model file under setup *s at sequence length seq (0: the
 * model's; every layer checkpointed when ckpt_all), its events to fn. */
static void run_model(const char *model, vp_setup *s, uint64_t seq,
                      bool ckpt_all, vp_sim_event_fn fn, void *ud)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_model *m = vp_model_load(model, &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, s->batch, seq, &err);
    cr_assert_not_null(g, "%s", err.msg);
    bool ck[64] = {false};
    if (ckpt_all) {
        size_t ns = vp_graph_segment_count(g);
        cr_assert_leq(ns, 64);
        vp_graph_default_checkpoint(g, ck);
        s->checkpoint = ck;
        s->n_checkpoint = ns;
    }
    vp_estimate e;
    vp_status rc = vp_simulate(g, s, &e, fn, ud, &err);
    cr_assert_eq(rc, VP_OK, "vp_simulate: %s", err.msg);
    s->checkpoint = NULL;
    s->n_checkpoint = 0;
    vp_graph_free(g);
    vp_model_free(m);
}

/* One training step of a model file at batch 2 (fp32 unless prec says),
 * the events of its op `op` into *st. */
static void simulate_op(const char *model, const char *op, vp_precision prec,
                        vp_attn_impl attn, bool attn_set, op_stream *st)
{
    vp_setup s = setup_b2();
    s.precision = prec;
    s.attn = attn;
    s.attn_set = attn_set;
    memset(st, 0, sizeof *st);
    st->op = op;
    run_model(model, &s, 0, false, record, st);
    cr_assert_gt(st->n, 0, "no event of %s", op);
}

/* tests/data/good/tf-small.yaml (hidden 64, 4 heads, seq 64, causal)
 * at batch 2 with eager attention forced, one step; the events of
 * layers.0.attn.core whose size is `a` or `b` bytes, in order. */
static size_t eager_scores(vp_precision prec, uint64_t a, uint64_t b,
                           op_event *out)
{
    static op_stream st;
    simulate_op(TF_SMALL, "layers.0.attn.core", prec,
                VP_ATTN_EAGER, true, &st);
    size_t n = 0;
    for (size_t i = 0; i < st.n; i++)
        if (st.ev[i].phase == VP_PHASE_FORWARD &&
            (st.ev[i].bytes == a || st.ev[i].bytes == b))
            out[n++] = st.ev[i];
    return n;
}

static void expect_event(const op_event *e, size_t i, bool is_free,
                         uint64_t bytes, vp_category cat)
{
    cr_expect_eq(e[i].is_free, is_free, "event %zu: %s expected", i,
                 is_free ? "a free" : "an allocation");
    cr_expect_eq(e[i].bytes, bytes, "event %zu: %llu B, expected %llu", i,
                 (unsigned long long)e[i].bytes,
                 (unsigned long long)bytes);
    cr_expect_eq(e[i].cat, cat, "event %zu: category %d, expected %d", i,
                 (int)e[i].cat, (int)cat);
}

/* transformers' eager_attention_forward (modeling_llama.py:
 * `attn_weights = torch.matmul(query, key_states.transpose(2, 3)) *
 * scaling`; modeling_gpt2.py: the matmul, then `attn_weights /
 * torch.full(...)`), then `attn_weights + causal_mask`, then
 * `nn.functional.softmax(attn_weights, dim=-1)`. Each line makes a new
 * B x h x Sq x Sk tensor (aten's bmm, mul/div, add and _softmax are
 * out-of-place) and the name's previous tensor dies when it is rebound:
 * the matmul's scores and the scaled scores are live together, then the
 * scaled and the masked ones, then the masked scores and the softmax
 * (saved for the backward). fp32, B = 2, h = 4, S = 64: 2 x 4 x 64 x 64
 * x 4 B = 131072 B each. */
Test(rules_ops, eager_attention_scores_are_two_temporaries_then_mask_then_softmax)
{
    const uint64_t sc = 2ull * 4 * 64 * 64 * 4;
    op_event e[MAX_EV];
    size_t n = eager_scores(VP_PREC_FP32, sc, sc, e);
    cr_assert_eq(n, 7, "%zu score-sized events, expected 7", n);
    expect_event(e, 0, false, sc, VP_CAT_TEMP);  /* q @ k^T           */
    expect_event(e, 1, false, sc, VP_CAT_TEMP);  /* * scaling         */
    expect_event(e, 2, true, sc, VP_CAT_TEMP);   /* the matmul's dies */
    expect_event(e, 3, false, sc, VP_CAT_TEMP);  /* + causal_mask     */
    expect_event(e, 4, true, sc, VP_CAT_TEMP);   /* the scaled dies   */
    expect_event(e, 5, false, sc, VP_CAT_ACT);   /* softmax, saved    */
    expect_event(e, 6, true, sc, VP_CAT_TEMP);   /* the masked dies   */
    cr_expect_eq(e[2].tensor, e[0].tensor, "the first free is the matmul's");
    cr_expect_eq(e[4].tensor, e[1].tensor, "the second is the scaled one");
    cr_expect_eq(e[6].tensor, e[3].tensor, "the third is the masked one");
}

/* The same under autocast to bf16 (torch/csrc/autograd autocast_mode.cpp:
 * matmul is in the lower-precision list, softmax in the fp32 list): the
 * matmul and the scaling stay bf16 (2 x 4 x 64 x 64 x 2 = 65536 B); the
 * causal mask is built in the parameters' dtype, fp32, so the sum is
 * promoted to fp32 (131072 B); softmax runs in fp32 and is saved; then
 * `.to(value_states.dtype)` casts the probabilities back to bf16 for the
 * second matmul (65536 B). The masked scores die only when the name is
 * rebound, after the whole right-hand side `softmax(...).to(...)` has run:
 * the cast is allocated before the masked scores are freed. */
Test(rules_ops, eager_attention_scores_under_autocast_promote_at_the_mask)
{
    const uint64_t h = 2ull * 4 * 64 * 64 * 2, f = 2 * h;
    op_event e[MAX_EV];
    size_t n = eager_scores(VP_PREC_AMP_BF16, h, f, e);
    cr_assert_eq(n, 8, "%zu score-sized events, expected 8", n);
    expect_event(e, 0, false, h, VP_CAT_TEMP);   /* bf16 q @ k^T         */
    expect_event(e, 1, false, h, VP_CAT_TEMP);   /* bf16 * scaling       */
    expect_event(e, 2, true, h, VP_CAT_TEMP);
    expect_event(e, 3, false, f, VP_CAT_TEMP);   /* + fp32 mask: fp32    */
    expect_event(e, 4, true, h, VP_CAT_TEMP);
    expect_event(e, 5, false, f, VP_CAT_ACT);    /* fp32 softmax, saved  */
    expect_event(e, 6, false, h, VP_CAT_TEMP);   /* .to(bf16)            */
    expect_event(e, 7, true, f, VP_CAT_TEMP);    /* the masked dies      */
    cr_expect_eq(e[7].tensor, e[3].tensor, "the last free is the masked one");
}

/* cudnn_batch_norm in training (aten/src/ATen/native/cudnn/BatchNorm.cpp):
 * the output in the input's dtype, and save_mean and save_var, one fp32
 * value per channel, which autograd keeps for cudnn_batch_norm_backward.
 * tests/data/good/conv-pool.yaml's bn1 at batch 2: 16 channels of 32 x 32,
 * the output 2 x 16 x 32 x 32 x 4 = 131072 B, the statistics 16 x 4 =
 * 64 B each; both live until the op's backward, none freed in the
 * forward. */
Test(rules_ops, batch_norm_keeps_its_mean_and_inverse_std_for_the_backward)
{
    static op_stream st;
    simulate_op("tests/data/good/conv-pool.yaml", "bn1", VP_PREC_FP32,
                VP_ATTN_SDPA, false, &st);
    const op_event *e = st.ev;
    cr_assert_geq(st.n, 3);
    expect_event(e, 0, false, 131072, VP_CAT_ACT);
    expect_event(e, 1, false, 64, VP_CAT_ACT);
    expect_event(e, 2, false, 64, VP_CAT_ACT);
    size_t freed = 0;
    for (size_t i = 3; i < st.n; i++) {
        cr_expect(!(e[i].is_free && e[i].phase == VP_PHASE_FORWARD),
                  "event %zu: a free in bn1's forward", i);
        if (e[i].is_free && e[i].phase == VP_PHASE_BACKWARD &&
            (e[i].tensor == e[1].tensor || e[i].tensor == e[2].tensor))
            freed++;
    }
    cr_expect_eq(freed, 2, "%zu of the two statistics freed in bn1's "
                 "backward", freed);
}

/* embedding_dense_backward (aten/src/ATen/native/cuda/Embedding.cu and
 * EmbeddingBackwardKernel.cu, embedding_backward_cuda_kernel; traced in
 * docs/SIMULATION_NOTES.md §3.6): the indices sorted through int64
 * buffers of one value per token (the sorted indices, their original
 * positions, the segment offsets and the sort's scratch), one at a time;
 * then the per-segment fp32 partial sums, tokens / NROWS_PER_THREAD (10)
 * + min(tokens, vocab) rows of the embedding width; then the dense fp32
 * gradient of the whole table; the partial sums die. tf-small's
 * embed_tokens at batch 2 x 64 tokens: N = 128, 128 x 8 = 1024 B per sort
 * buffer; (128 / 10 + 128) x 64 x 4 = 35840 B; 1000 x 64 x 4 = 256000 B. */
Test(rules_ops, embedding_backward_sorts_then_sums_segments)
{
    static op_stream st;
    simulate_op(TF_SMALL, "embed_tokens",
                VP_PREC_FP32, VP_ATTN_SDPA, false, &st);
    op_event e[MAX_EV];
    size_t n = 0;
    for (size_t i = 0; i < st.n; i++)
        if (st.ev[i].phase == VP_PHASE_BACKWARD)
            e[n++] = st.ev[i];
    cr_assert_geq(n, 11, "%zu backward events, expected 11 (then the "
                  "incoming gradient's free)", n);
    for (size_t k = 0; k < 4; k++) {
        expect_event(e, 2 * k, false, 1024, VP_CAT_TEMP);
        expect_event(e, 2 * k + 1, true, 1024, VP_CAT_TEMP);
    }
    expect_event(e, 8, false, 35840, VP_CAT_TEMP);
    expect_event(e, 9, false, 256000, VP_CAT_TEMP);
    expect_event(e, 10, true, 35840, VP_CAT_TEMP);
}

/* Allocations of op `op` in step 1's backward phase. */
typedef struct {
    const char *op;
    size_t allocs;
} bwd_count;

static void count_bwd(const vp_sim_event *ev, void *ud)
{
    bwd_count *c = ud;
    if (ev->step == 1 && ev->phase == VP_PHASE_BACKWARD && !ev->is_free &&
        ev->op && strcmp(ev->op, c->op) == 0)
        c->allocs++;
}

static size_t checkpointed_bwd_allocs(const char *op)
{
    vp_setup s = setup_b2();
    bwd_count c = {op, 0};
    run_model(TF_SMALL, &s, 0, true, count_bwd, &c);
    return c.allocs;
}

/* torch.utils.checkpoint (non-reentrant, early stop on by default:
 * set_checkpoint_early_stop, _StopRecomputationError raised by the
 * unpack hook once every saved tensor is back): a layer's recomputation
 * ends at its last op that saves something. In tf-small's checkpointed
 * layer 0 that is mlp.proj (a linear: it saves its input); the
 * residual add after it saves nothing and is not recomputed, so it
 * allocates nothing in the backward, while the attention's residual add,
 * inside the recomputed range, makes its output again (32768 B). */
Test(rules_ops, checkpoint_recomputation_stops_at_the_last_op_that_saves)
{
    cr_expect_eq(checkpointed_bwd_allocs("layers.0.mlp.residual"), 0);
    cr_expect_eq(checkpointed_bwd_allocs("layers.0.attn.residual"), 1);
}

/* The library workspaces of a fresh process, in order (the event stream's
 * VP_CAT_WORKSPACE allocations over two steps). */
typedef struct {
    uint64_t bytes[8];
    uint32_t step[8];
    vp_phase phase[8];
    char op[8][40];
    size_t n;
} ws_events;

static void record_ws(const vp_sim_event *ev, void *ud)
{
    ws_events *w = ud;
    if (ev->is_free || ev->category != VP_CAT_WORKSPACE || w->n >= 8)
        return;
    w->bytes[w->n] = ev->bytes;
    w->step[w->n] = ev->step;
    w->phase[w->n] = ev->phase;
    snprintf(w->op[w->n], sizeof w->op[0], "%s", ev->op ? ev->op : "");
    w->n++;
}

/* aten/src/ATen/cuda/CublasHandlePool.cpp: a cuBLAS workspace per handle
 * and stream, getChosenWorkspaceSize 32 MiB on sm90 (the main thread's,
 * made by the process's first GEMM, before the model: the setup), and
 * a cuBLASLt workspace of getCUDABlasLtWorkspaceSize, 1 MiB, made by the
 * first addmm (a linear with a bias runs cublasLt's bias epilogue,
 * gemm_and_bias); the autograd engine's backward thread has its own
 * handle, so the first backward GEMM (tf-small's untied lm_head) makes a
 * second 32 MiB workspace. All are kept: step 2 makes none. */
Test(rules_ops, cublas_workspaces_per_thread_and_the_lt_one_at_the_first_addmm)
{
    vp_setup s = setup_b2();
    s.steps = 2;
    ws_events w;
    memset(&w, 0, sizeof w);
    run_model(TF_SMALL, &s, 0, false, record_ws, &w);
    cr_assert_eq(w.n, 3, "%zu workspaces, expected 3", w.n);
    cr_expect_eq(w.bytes[0], 32ull << 20);
    cr_expect_eq(w.phase[0], VP_PHASE_SETUP);
    cr_expect_eq(w.bytes[1], 1ull << 20);
    cr_expect_eq(w.step[1], 1);
    cr_expect_eq(w.phase[1], VP_PHASE_FORWARD);
    cr_expect_str_eq(w.op[1], "layers.0.attn.q_proj");
    cr_expect_eq(w.bytes[2], 32ull << 20);
    cr_expect_eq(w.step[2], 1);
    cr_expect_eq(w.phase[2], VP_PHASE_BACKWARD);
    cr_expect_str_eq(w.op[2], "lm_head");
}

/* HF LlamaRMSNorm.forward (modeling_llama.py): `hidden_states =
 * hidden_states.to(torch.float32)`, `variance = hidden_states.pow(2)
 * .mean(-1, keepdim=True)`, `hidden_states = hidden_states *
 * torch.rsqrt(variance + eps)`, `return self.weight *
 * hidden_states.to(input_dtype)`. The fp32 product h is the local
 * `hidden_states` until forward returns, so it dies after the weight
 * multiply's output is made (traced: ho3-qwen3-0.6b-bf16-b2-s4096, events
 * 424-437). tests/data/good/hf-llama.json (hidden 64) at batch 2 x 256
 * tokens in bf16: N x H = 32768 elements, x.float() and h 131072 B, the
 * bf16 cast and the output 65536 B, rsqrt 512 x 4 = 2048 B. */
Test(rules_ops, rmsnorm_fp32_product_dies_after_the_weight_multiply)
{
    static op_stream st;
    simulate_op("tests/data/good/hf-llama.json", "layers.0.input_norm",
                VP_PREC_BF16, VP_ATTN_SDPA, false, &st);
    op_event e[MAX_EV];
    size_t n = 0;
    for (size_t i = 0; i < st.n; i++)
        if (st.ev[i].phase == VP_PHASE_FORWARD)
            e[n++] = st.ev[i];
    cr_assert_eq(n, 8, "%zu forward events, expected 8", n);
    expect_event(e, 0, false, 131072, VP_CAT_ACT);  /* x.float() */
    expect_event(e, 1, false, 131072, VP_CAT_TEMP); /* pow(2) */
    expect_event(e, 2, true, 131072, VP_CAT_TEMP);
    expect_event(e, 3, false, 2048, VP_CAT_ACT);    /* rsqrt */
    expect_event(e, 4, false, 131072, VP_CAT_ACT);  /* h */
    expect_event(e, 5, false, 65536, VP_CAT_ACT);   /* h.to(bf16) */
    expect_event(e, 6, false, 65536, VP_CAT_ACT);   /* weight * ... */
    expect_event(e, 7, true, 131072, VP_CAT_ACT);   /* h at return */
}

/* Step 1's backward events of embed_tokens in tests/data/good/
 * tf-small-tied.yaml (lm_head tied to the 1000 x 64 table) at batch 2,
 * after its partial sums are freed. */
static size_t tied_embedding_tail(vp_precision prec, op_event *out)
{
    static op_stream st;
    simulate_op("tests/data/good/tf-small-tied.yaml", "embed_tokens", prec,
                VP_ATTN_SDPA, false, &st);
    size_t n = 0;
    bool after = false;
    for (size_t i = 0; i < st.n; i++) {
        if (st.ev[i].phase != VP_PHASE_BACKWARD)
            continue;
        if (after)
            out[n++] = st.ev[i];
        if (st.ev[i].is_free && st.ev[i].bytes == 35840)
            after = true;
    }
    return n;
}

/* The tied weight's two gradients meet in AccumulateGrad's InputBuffer
 * (input_buffer.cpp, accumulate): lm_head's first, as TBackward's view
 * of MmBackward's product (the weight enters F.linear as weight.t()),
 * which keeps its base alive, so can_accumulate_inplace fails and the
 * sum is a new tensor; then the view and the embedding's dense gradient
 * die (traced: ho3-qwen3-0.6b-bf16-b2-s4096, events 14160-14164). fp32:
 * 1000 x 64 x 4 = 256000 B each. */
Test(rules_ops, tied_head_gradient_is_summed_out_of_place)
{
    op_event e[MAX_EV];
    size_t n = tied_embedding_tail(VP_PREC_FP32, e);
    cr_assert_geq(n, 3, "%zu events after the partial sums, expected 3", n);
    expect_event(e, 0, false, 256000, VP_CAT_GRAD);
    expect_event(e, 1, true, 256000, VP_CAT_GRAD);
    expect_event(e, 2, true, 256000, VP_CAT_TEMP);
}

/* Under autocast lm_head's gradient comes through ToCopyBackward of the
 * weight's bf16 cast, a tensor of its own, so the dense gradient is
 * added into it in place and freed (SIMULATION_NOTES.md section 3.6). */
Test(rules_ops, tied_head_gradient_under_autocast_is_summed_in_place)
{
    op_event e[MAX_EV];
    size_t n = tied_embedding_tail(VP_PREC_AMP_BF16, e);
    cr_assert_geq(n, 1, "no event after the partial sums");
    expect_event(e, 0, true, 256000, VP_CAT_TEMP);
}

/* One bf16 training step of a small Hugging Face config at batch 2,
 * sequence 64 (hidden 64: 8192 elements a hidden state, 32768 B in fp32,
 * 16384 B in bf16; 128 rows), the parameters matching `freeze` frozen
 * (NULL: none); the events of op `op` in phase `ph` into out. */
static size_t hf_op_events(const char *model, const char *freeze,
                           const char *op, vp_phase ph, op_event *out)
{
    static op_stream st;
    vp_setup s = setup_b2();
    s.precision = VP_PREC_BF16;
    if (freeze) {
        vp_error err;
        cr_assert_eq(vp_freeze_parse(freeze, &s.ft, &err), VP_OK, "%s",
                     err.msg);
    }
    memset(&st, 0, sizeof st);
    st.op = op;
    run_model(model, &s, 64, false, record, &st);
    size_t n = 0;
    for (size_t i = 0; i < st.n; i++)
        if (st.ev[i].phase == ph)
            out[n++] = st.ev[i];
    return n;
}

#define HF_GEMMA3 "tests/data/good/hf-gemma3-mqa.json"
#define HF_DEEPSEEK "tests/data/good/hf-deepseek-v3.json"

/* transformers 5.17 modeling_gemma3.py Gemma3RMSNorm.forward:
 * `output = self._norm(x.float())`, `output = output * (1.0 +
 * self.weight.float())`, `return output.type_as(x)`. MulBackward0 keeps
 * the normalised x (`self`) only for the gradient of `other`
 * (derivatives.yaml, mul.Tensor), so with the weight frozen it dies as
 * the name is rebound to the product, before the cast back (traced:
 * ho5-gemma-2b-lora-r8-qkvo-bf16base-amp-b2, modeling_gemma.py:77).
 * x.float(), pow(2), rsqrt (128 rows), x * rsqrt, 1 + w (64 fp32), the
 * product, the cast back. */
Test(rules_ops, gemma_rmsnorm_with_a_frozen_weight_drops_the_normalised_x)
{
    op_event e[MAX_EV];
    size_t n = hf_op_events(HF_GEMMA3, "layers.1", "layers.1.input_norm",
                            VP_PHASE_FORWARD, e);
    cr_assert_eq(n, 10, "%zu forward events, expected 10", n);
    expect_event(e, 0, false, 32768, VP_CAT_ACT);  /* x.float() */
    expect_event(e, 1, false, 32768, VP_CAT_TEMP); /* pow(2) */
    expect_event(e, 2, true, 32768, VP_CAT_TEMP);
    expect_event(e, 3, false, 512, VP_CAT_ACT);    /* rsqrt */
    expect_event(e, 4, false, 32768, VP_CAT_ACT);  /* x * rsqrt */
    expect_event(e, 5, false, 256, VP_CAT_ACT);    /* 1 + w.float() */
    expect_event(e, 6, false, 32768, VP_CAT_ACT);  /* the product */
    expect_event(e, 7, true, 32768, VP_CAT_ACT);   /* x * rsqrt dropped */
    expect_event(e, 8, false, 16384, VP_CAT_ACT);  /* type_as(x) */
    expect_event(e, 9, true, 32768, VP_CAT_ACT);   /* the fp32 product */
}

/* The same norm with its weight trained: x * rsqrt is saved for the
 * weight's gradient, so only the fp32 product dies in the forward. */
Test(rules_ops, gemma_rmsnorm_with_a_trained_weight_keeps_the_normalised_x)
{
    op_event e[MAX_EV];
    size_t n = hf_op_events(HF_GEMMA3, NULL, "layers.1.input_norm",
                            VP_PHASE_FORWARD, e);
    cr_assert_eq(n, 9, "%zu forward events, expected 9", n);
    expect_event(e, 6, false, 32768, VP_CAT_ACT); /* the product */
    expect_event(e, 7, false, 16384, VP_CAT_ACT); /* type_as(x) */
    expect_event(e, 8, true, 32768, VP_CAT_ACT);  /* the fp32 product */
}

/* A sliding layer whose window (32) cuts the 64 keys passes its mask to
 * SDPA, so transformers' sdpa_attention_forward calls repeat_kv
 * (use_gqa_in_sdpa is false with a mask). With one KV head the reshape
 * of the expanded [2, 1, 4, 64, 16] is a view (a size-1 dim merged with
 * the stride-0 one: ATen's computeStride), and the efficient kernel
 * takes it: no copy (traced: ho5-gemma3-1b-bf16-b8's sliding layers).
 * DynamicCache's k and v copies (2 x 1 x 64 x 16 x 2 B), the output
 * (2 x 4 x 64 x 16 x 2 B), the logsumexp (2 x 4 x 64 x 4 B), the kernel's
 * scratch, the bool mask as an additive bf16 bias (2 x 64 x 64 x 2 B,
 * convert_boolean_attn_mask; saved), then the layer's k and v die. */
Test(rules_ops, sdpa_with_one_kv_head_repeats_k_and_v_as_a_view)
{
    op_event e[MAX_EV];
    size_t n = hf_op_events(HF_GEMMA3, NULL, "layers.0.attn.core",
                            VP_PHASE_FORWARD, e);
    cr_assert_eq(n, 9, "%zu forward events, expected 9", n);
    expect_event(e, 0, false, 4096, VP_CAT_ACT);  /* cache k */
    expect_event(e, 1, false, 4096, VP_CAT_ACT);  /* cache v */
    expect_event(e, 2, false, 16384, VP_CAT_ACT); /* output */
    expect_event(e, 3, false, 2048, VP_CAT_ACT);  /* logsumexp */
    expect_event(e, 4, false, 256, VP_CAT_TEMP);  /* scratch */
    expect_event(e, 5, true, 512, VP_CAT_TEMP);
    expect_event(e, 6, false, 16384, VP_CAT_ACT); /* the additive bias */
    expect_event(e, 7, true, 4096, VP_CAT_ACT);
    expect_event(e, 8, true, 4096, VP_CAT_ACT);
}

/* transformers 5.17 modeling_deepseek_v3.py DeepseekV3TopkRouter.forward:
 * `F.linear(hidden_states.type(torch.float32),
 * self.weight.type(torch.float32))` in a bf16 model: fp32 copies of the
 * input (128 x 64) and of the weight (8 x 64), the fp32 logits (128 x
 * 8); with autograd MmBackward0 keeps both copies (derivatives.yaml, mm),
 * so the forward frees nothing (traced: ho5-deepseek-v3-tiny-bf16-b8,
 * modeling_deepseek_v3.py:146). */
Test(rules_ops, fp32_router_linear_keeps_its_fp32_copies_for_the_backward)
{
    op_event e[MAX_EV];
    size_t n = hf_op_events(HF_DEEPSEEK, NULL, "layers.1.mlp.gate",
                            VP_PHASE_FORWARD, e);
    cr_assert_eq(n, 3, "%zu forward events, expected 3", n);
    expect_event(e, 0, false, 32768, VP_CAT_ACT); /* x.float() */
    expect_event(e, 1, false, 2048, VP_CAT_TEMP); /* W.float() */
    expect_event(e, 2, false, 4096, VP_CAT_ACT);  /* fp32 logits */
}

/* Its backward (traced, the same case): MmBackward0 makes the weight's
 * fp32 gradient, then the input's, and drops grad_out and its saved
 * copies; ToCopyBackward0 of W.type(fp32) casts the weight's gradient to
 * bf16, then that of x.type(fp32) the input's, which is summed into the
 * layer input's gradient. */
Test(rules_ops, fp32_router_linear_backward_casts_both_gradients_back)
{
    op_event e[MAX_EV];
    size_t n = hf_op_events(HF_DEEPSEEK, NULL, "layers.1.mlp.gate",
                            VP_PHASE_BACKWARD, e);
    cr_assert_eq(n, 10, "%zu backward events, expected 10", n);
    expect_event(e, 0, false, 2048, VP_CAT_TEMP);  /* dW, fp32 */
    expect_event(e, 1, false, 32768, VP_CAT_TEMP); /* dx, fp32 */
    expect_event(e, 2, true, 4096, VP_CAT_TEMP);   /* grad_out */
    expect_event(e, 3, true, 32768, VP_CAT_ACT);   /* saved x.float() */
    expect_event(e, 4, true, 2048, VP_CAT_TEMP);   /* saved W.float() */
    expect_event(e, 5, false, 1024, VP_CAT_TEMP);  /* dW, bf16 */
    expect_event(e, 6, true, 2048, VP_CAT_TEMP);
    expect_event(e, 7, false, 16384, VP_CAT_TEMP); /* dx, bf16 */
    expect_event(e, 8, true, 32768, VP_CAT_TEMP);
    expect_event(e, 9, true, 16384, VP_CAT_TEMP);  /* summed in */
}

/* The backward events of op `op` of a model file in bf16 at batch 2 and
 * sequence seq. */
static size_t norm_bwd(const char *model, const char *op, uint64_t seq,
                       op_event *out)
{
    static op_stream st;
    vp_setup s = setup_b2();
    s.precision = VP_PREC_BF16;
    memset(&st, 0, sizeof st);
    st.op = op;
    run_model(model, &s, seq, false, record, &st);
    size_t n = 0;
    for (size_t i = 0; i < st.n; i++)
        if (st.ev[i].phase == VP_PHASE_BACKWARD)
            out[n++] = st.ev[i];
    return n;
}

/* layers.0.input_norm of tests/data/good/hf-llama.json (hidden 64) */
static size_t llama_norm_bwd(uint64_t seq, op_event *out)
{
    return norm_bwd("tests/data/good/hf-llama.json", "layers.0.input_norm",
                    seq, out);
}

/* MulBackward0 of `self.weight * h` makes grad * h, which the engine sums
 * to the weight's [64] (at::sum_to): Reduce.cuh setReduceConfig at 2 x
 * 8192 = 16384 rows: block 16 x 8 (outputs by 4), 2048 values a thread,
 * grid 1, a wave of 132 x 16 blocks, ctas_per_output = max(min(2112,
 * 128), 8) = 128: staging 4 x 64 x 128 x 16 x 4 = 2,097,152 B and 4 B of
 * semaphores, the semaphores freed first (traced: llama-1b-amp-bf16-b1,
 * 33,554,432 B at 2048 x 2048). The product: 16384 x 64 x 2 B. */
Test(rules_ops, rmsnorm_weight_gradient_sum_stages_its_partials)
{
    op_event e[MAX_EV];
    size_t n = llama_norm_bwd(8192, e);
    size_t k = 0;
    while (k < n && e[k].cat != VP_CAT_WORKSPACE)
        k++;
    cr_assert_geq(k, 2, "no weight gradient before the staging");
    cr_assert_lt(k + 3, n, "no staging in %zu backward events", n);
    expect_event(e, k - 2, false, 2097152, VP_CAT_TEMP); /* grad * h */
    expect_event(e, k - 1, false, 128, VP_CAT_TEMP);     /* weight grad */
    expect_event(e, k, false, 2097152, VP_CAT_WORKSPACE);
    expect_event(e, k + 1, false, 4, VP_CAT_WORKSPACE);  /* semaphores */
    expect_event(e, k + 2, true, 512, VP_CAT_WORKSPACE);
    expect_event(e, k + 3, true, 2097152, VP_CAT_WORKSPACE);
    expect_event(e, k + 4, true, 2097152, VP_CAT_TEMP);
}

/* At 2 x 256 = 512 rows each of the 8 warps sums 64 values, under
 * max_values_per_thread (256): the sum stays in each block, no staging. */
Test(rules_ops, rmsnorm_weight_gradient_sum_of_few_rows_stays_in_a_block)
{
    op_event e[MAX_EV];
    size_t n = llama_norm_bwd(256, e);
    cr_assert_gt(n, 0, "no backward event");
    for (size_t i = 0; i < n; i++)
        cr_expect_neq(e[i].cat, VP_CAT_WORKSPACE, "event %zu: staging", i);
}

/* T5LayerNorm's `self.weight * hidden_states` (modeling_t5.py) is the
 * same MulBackward0 and sum_to: tests/data/hf/mt5-small.json (d_model
 * 512) at 2 x 512 = 1024 rows: block 32 x 4, 256 values a thread, grid
 * 4, ctas_per_output = max(min(528, 16), 1) = 16: staging 4 x 512 x 16
 * x 32 x 4 = 4,194,304 B, semaphores 16 B; grad * h 1024 x 512 x 2 B and
 * the weight's gradient 512 x 2 B before it. */
Test(rules_ops, t5_norm_weight_gradient_sum_stages_its_partials)
{
    op_event e[MAX_EV];
    size_t n = norm_bwd("tests/data/hf/mt5-small.json",
                        "encoder.block.0.self_attn.norm", 512, e);
    size_t k = 0;
    while (k < n && e[k].cat != VP_CAT_WORKSPACE)
        k++;
    cr_assert_geq(k, 2, "no weight gradient before the staging");
    cr_assert_lt(k + 4, n, "no staging in %zu backward events", n);
    expect_event(e, k - 2, false, 1048576, VP_CAT_TEMP); /* grad * h */
    expect_event(e, k - 1, false, 1024, VP_CAT_TEMP);    /* weight grad */
    expect_event(e, k, false, 4194304, VP_CAT_WORKSPACE);
    expect_event(e, k + 1, false, 16, VP_CAT_WORKSPACE); /* semaphores */
    expect_event(e, k + 2, true, 512, VP_CAT_WORKSPACE);
    expect_event(e, k + 3, true, 4194304, VP_CAT_WORKSPACE);
    expect_event(e, k + 4, true, 1048576, VP_CAT_TEMP);
}
