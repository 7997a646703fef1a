/* The step-time model's kernel rules measured on the H200
 * (docs/STEP_TIME.md "One GPU"): 16-bit GEMMs with unaligned rows at their
 * measured rates, fp32 attention, SDPA's kernels by shape, batch
 * norm per element, in-place calls. Each test times a one-op graph (or
 * two that differ by one op) in inference, where the GPU's time of the
 * kind is exactly the rule's. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/vramplan.h"

static vp_hw gpu(const char *name)
{
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load(name, &err);
    cr_assert_not_null(p, "%s: %s", name, err.msg);
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    vp_gpu_hw(p, VP_GPU_BF16, &hw);
    vp_gpu_free(p);
    return hw;
}

/* One step of model `path` at batch b and sequence seq (0: the model's)
 * in precision p, forward only when `infer`; SDPA's choice of attention
 * or `ai` when `force`. */
static vp_step_time step(const char *path, uint64_t b, uint64_t seq,
                         vp_precision p, bool infer, const vp_hw *hw,
                         bool force, vp_attn_impl ai, vp_graph **gout)
{
    vp_error err;
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s: %s", path, err.msg);
    vp_graph *g = vp_graph_build(m, b, seq, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_setup s;
    vp_setup_init(&s);
    s.batch = b;
    s.precision = p;
    s.inference = infer;
    s.attn = ai;
    s.attn_set = force;
    vp_step_time t;
    cr_assert_eq(vp_step_time_estimate(g, &s, hw, &t, &err), VP_OK, "%s",
                 err.msg);
    vp_model_free(m);
    if (gout)
        *gout = g;
    else
        vp_graph_free(g);
    return t;
}

/* The forward of model `path` at batch b in precision p, forward only. */
static vp_step_time forward(const char *path, uint64_t b, vp_precision p,
                            const vp_hw *hw, vp_graph **gout)
{
    return step(path, b, 0, p, true, hw, false, VP_ATTN_SDPA, gout);
}

static void near_rel(double got, double want, double tol, const char *what)
{
    cr_assert(fabs(got - want) <= tol * fabs(want),
              "%s: got %.9g, expected %.9g (tolerance %g relative)", what,
              got, want, tol);
}

static double gap_of(const vp_hw *hw)
{
    return hw->launch > 0 ? hw->launch : VP_GPU_KERNEL_GAP;
}

/* The aligned curve's GEMM seconds (timing.c gemm_gpu). */
static double curve_gemm(const vp_hw *hw, int dt, double m, double n,
                         double k)
{
    vp_hw f = *hw;
    vp_hw_fill_defaults(&f);
    const vp_curve *c = &f.gemm[dt];
    return 2.0 * m * n * k / c->peak * (k + c->kh) / k + gap_of(hw);
}

Test(timing_kernels, unaligned_bf16_head_runs_at_the_measured_align1_rate)
{
    vp_hw hw = gpu("h200");
    vp_step_time t =
        forward("tests/data/timing/head-50257.yaml", 8192, VP_PREC_BF16, &hw,
                NULL);
    /* calibrate/profiles/h200-gemm-align.jsonl: 93.6 TFLOP/s forward,
     * 0.1280 of the bf16 peak */
    double want = 2.0 * 8192 * 768 * 50257 / (0.1280 * hw.gemm[VP_HW_BF16].peak);
    near_rel(t.gemm, want, 1e-9, "gemm");
}

Test(timing_kernels, padded_head_runs_on_the_curve)
{
    vp_hw hw = gpu("h200");
    vp_step_time t =
        forward("tests/data/timing/head-50304.yaml", 8192, VP_PREC_BF16, &hw,
                NULL);
    near_rel(t.gemm, curve_gemm(&hw, VP_HW_BF16, 8192, 50304, 768), 1e-9,
             "gemm");
}

Test(timing_kernels, fp32_head_pays_nothing_for_unaligned_rows)
{
    vp_hw hw = gpu("h200");
    vp_step_time t =
        forward("tests/data/timing/head-50257.yaml", 4096, VP_PREC_FP32, &hw,
                NULL);
    near_rel(t.gemm, curve_gemm(&hw, VP_HW_FP32, 4096, 50257, 768), 1e-9,
             "gemm");
}

/* A loss on 16-bit logits under autocast (timing.c ce_time; BERT's
 * CrossEntropyLoss): log_softmax in 16 bits at half the sweep's fp32 pass
 * (its cross-entropy op less the upcast), nll_loss's fp32 copy and the
 * cast back at the to_fp32 rate (6 bytes a logit), nll_loss_backward's
 * fp32 fill at the copy rate; three kernels forward, four backward. A
 * training step of a 32000-class head on 4096 rows: the head's forward and
 * weight-gradient GEMMs and the loss. */
Test(timing_kernels, amp_loss_on_16bit_logits_runs_log_softmax_in_16_bits)
{
    vp_hw hw = gpu("h200");
    vp_step_time t = step("tests/data/timing/ce-32000.yaml", 4096, 0,
                          VP_PREC_AMP_BF16, false, &hw, false, VP_ATTN_SDPA,
                          NULL);
    vp_hw f = hw;
    vp_hw_fill_defaults(&f);
    double rc = 4096.0 * 32000.0;
    const vp_curve *cp = &f.mem_kind[VP_HW_MEM_COPY];
    double own = cp->half / cp->peak - f.dispatch;
    if (own < gap_of(&hw))
        own = gap_of(&hw);
    double up = 6.0 * rc / f.mem_kind[VP_HW_MEM_CAST].peak;
    double ls = (2.0 * rc / f.mem_kind[VP_HW_MEM_CROSS_ENTROPY].peak - up) / 2;
    double loss = (ls + up + 3 * own) + (4.0 * rc / cp->peak + up + ls + 4 * own);
    double gemms = curve_gemm(&hw, VP_HW_BF16, 4096, 32000, 768) +
                   curve_gemm(&hw, VP_HW_BF16, 32000, 768, 4096);
    near_rel(t.gemm, gemms + loss, 1e-9, "gemm");
}

/* The graph's attention forwards' FLOPs over `rate`. */
static double attention_time(const vp_graph *g, double rate)
{
    double s = 0;
    for (size_t i = 0; i < vp_graph_op_count(g); i++) {
        const vp_op *o = vp_graph_op(g, i);
        if (o->kind == VP_OP_ATTENTION)
            s += o->flops_fwd / rate;
    }
    cr_assert_gt(s, 0.0);
    return s;
}

Test(timing_kernels, fp32_attention_runs_at_its_measured_share)
{
    vp_hw hw = gpu("h200");
    vp_graph *g;
    vp_step_time t = forward("models/gpt2-small.yaml", 2, VP_PREC_FP32, &hw, &g);
    double rate = VP_ATTN_FP32_FWD_SHARE * hw.gemm[VP_HW_FP32].peak;
    near_rel(t.attention, attention_time(g, rate), 1e-9, "attention");
    vp_graph_free(g);
}

/* The attention time of one training step of model `path` at batch b and
 * sequence `seq` in AMP bf16 on the H200 profile, SDPA's choice or `ai`. */
static double train_attention(const char *path, uint64_t b, uint64_t seq,
                              const vp_hw *hw, bool force, vp_attn_impl ai)
{
    vp_step_time t = step(path, b, seq, VP_PREC_AMP_BF16, false, hw, force,
                          ai, NULL);
    cr_assert_gt(t.attention, 0.0);
    return t.attention;
}

/* SDPA's cuDNN kernels in the H200 step profiles (calibrate/profiles/
 * h200-kernels-byname.jsonl, not used by the fit, calibrate/fit-attn.py):
 * gpt2-small at batch 8 (causal, s 1024, dropout 0.1), the forward
 * (fprop + philox unpack) 1.251 ms and the backward (dO.O, bprop, dQ
 * conversion, memsets) 2.156 ms over 12 layers; the rule gives them
 * within 1 %. */
Test(timing_kernels, sdpa_cudnn_matches_the_gpt2_step_profile)
{
    vp_hw hw = gpu("h200");
    double t = train_attention("models/gpt2-small.yaml", 8, 0, &hw, false,
                               VP_ATTN_SDPA);
    near_rel(t, (1.251 + 2.156) * 1e-3, 0.01, "attention");
}

/* bert-base at batch 32 (full mask, s 512, dropout 0.1): forward 1.921 ms,
 * backward 3.490 ms (the same profile); the backward's dO.O pass and dQ
 * conversion at this batch are 3 % above the fit's per-element term. */
Test(timing_kernels, sdpa_cudnn_matches_the_bert_step_profile)
{
    vp_hw hw = gpu("h200");
    double t = train_attention("models/bert-base.yaml", 32, 512, &hw, false,
                               VP_ATTN_SDPA);
    near_rel(t, (1.921 + 3.490) * 1e-3, 0.03, "attention");
}

/* Without a cuDNN attention rate (before Hopper) SDPA runs flash:
 * exactly the time of flash asked for by name, and slower than cuDNN's. */
Test(timing_kernels, sdpa_runs_flash_without_cudnn)
{
    vp_hw hw = gpu("h200");
    vp_hw nocudnn = hw;
    nocudnn.attn[VP_HW_ATTN_CUDNN][0].peak = 0;
    nocudnn.attn[VP_HW_ATTN_CUDNN][1].peak = 0;
    double fl = train_attention("models/gpt2-small.yaml", 8, 0, &hw, true,
                                VP_ATTN_FLASH);
    double sd = train_attention("models/gpt2-small.yaml", 8, 0, &nocudnn,
                                false, VP_ATTN_SDPA);
    near_rel(sd, fl, 1e-12, "flash");
    cr_assert_gt(fl, train_attention("models/gpt2-small.yaml", 8, 0, &hw,
                                     false, VP_ATTN_SDPA));
}

/* Attention dropout costs only in training: a forward in inference times
 * the dropout-free kernel, below the training forward's share. */
Test(timing_kernels, inference_runs_attention_without_dropout)
{
    vp_hw hw = gpu("h200");
    vp_step_time t = forward("models/gpt2-small.yaml", 8, VP_PREC_AMP_BF16,
                             &hw, NULL);
    double train = train_attention("models/gpt2-small.yaml", 8, 0, &hw,
                                   false, VP_ATTN_SDPA);
    /* the microbenchmark: causal 12.9 GFLOP at d 64, 0.046 ms without
     * dropout, 0.104 ms with (cuDNN's dropout forward) */
    near_rel(t.attention, 12 * 0.046e-3, 0.03, "inference");
    cr_assert_lt(t.attention, 0.5 * train);
}

/* The forward seconds of the batch norm of bn-NAME.yaml (conv-NAME.yaml
 * without it) at batch 16 and image side `seq` (0: the model's), less
 * the GPU's gap between kernels. */
static double bn_forward(const char *name, uint64_t seq, vp_precision p,
                         const vp_hw *hw)
{
    char with[128], without[128];
    snprintf(with, sizeof with, "tests/data/timing/bn%s.yaml", name);
    snprintf(without, sizeof without, "tests/data/timing/conv%s.yaml", name);
    vp_step_time a = step(with, 16, seq, p, true, hw, false, VP_ATTN_SDPA,
                          NULL);
    vp_step_time b = step(without, 16, seq, p, true, hw, false, VP_ATTN_SDPA,
                          NULL);
    return a.gemm - b.gemm - gap_of(hw);
}

/* Few channels: one thread block per channel, so twice the channels over
 * the same images take the time of the same channel's elements. */
Test(timing_kernels, batch_norm_of_few_channels_takes_one_channels_time)
{
    vp_hw hw = gpu("h200");
    double c64 = bn_forward("", 0, VP_PREC_FP32, &hw);
    double c128 = bn_forward("-c128", 0, VP_PREC_FP32, &hw);
    cr_assert_gt(c64, 0.0);
    near_rel(c128, c64, 1e-9, "64 and 128 channels");
    /* cuDNN's fp32 forward, 570 ps a channel's element, as bytes at the
     * copy bandwidth the sweep ran at (4.58028 B/ps) */
    vp_hw f = hw;
    vp_hw_fill_defaults(&f);
    double want = 16.0 * 56 * 56 * 570 * 4.58028 /
                  f.mem_kind[VP_HW_MEM_COPY].peak;
    near_rel(c64, want, 1e-9, "64 channels");
}

/* Many channels fill the GPU: the elements at the fitted bandwidth. */
Test(timing_kernels, batch_norm_of_many_channels_runs_at_the_bandwidth)
{
    vp_hw hw = gpu("h200");
    vp_hw f = hw;
    vp_hw_fill_defaults(&f);
    double got = bn_forward("-c1024", 0, VP_PREC_FP32, &hw);
    /* 3.6 ps an element, 3.6 x (1 + (24 / 3136)^1.25) on 56 x 56 rows */
    double per = 3.6 * (1.0 + pow(24.0 / 3136.0, 1.25));
    double want = 16.0 * 1024 * 56 * 56 * per * 4.58028 /
                  f.mem_kind[VP_HW_MEM_COPY].peak;
    near_rel(got, want, 1e-9, "1024 channels");
}

/* aten/src/ATen/native/Normalization.cpp _batch_norm_impl_index: a bf16
 * input takes ATen's kernels, a half input with fp32 parameters
 * (autocast fp16) cuDNN's. */
Test(timing_kernels, batch_norm_path_follows_the_input_dtype)
{
    vp_hw hw = gpu("h200");
    double bf16 = bn_forward("", 0, VP_PREC_AMP_BF16, &hw);
    double fp16 = bn_forward("", 0, VP_PREC_AMP_FP16, &hw);
    near_rel(bf16 / fp16, 1030.0 / 690.0, 1e-9, "ATen / cuDNN");
}

/* ATen's statistics kernel reads each image's pixels of a channel as a
 * row: on 7 x 7 rows its elements take (1 + (96 / 49)^1.25) times the
 * bandwidth's time. */
Test(timing_kernels, batch_norm_statistics_slow_down_on_short_rows)
{
    vp_hw hw = gpu("h200");
    double r7 = bn_forward("-c1024", 7, VP_PREC_BF16, &hw) / 49.0;
    double r56 = bn_forward("-c1024", 56, VP_PREC_BF16, &hw) / 3136.0;
    near_rel(r7 / r56,
             (1.0 + pow(96.0 / 49.0, 1.25)) / (1.0 + pow(96.0 / 3136.0, 1.25)),
             1e-9, "7 x 7 against 56 x 56 per element");
}

Test(timing_kernels, in_place_relu_moves_what_an_out_of_place_one_does)
{
    vp_hw hw = gpu("h200");
    vp_step_time in = forward("tests/data/timing/relu-inplace-true.yaml",
                              1024, VP_PREC_BF16, &hw, NULL);
    vp_step_time out = forward("tests/data/timing/relu-inplace-false.yaml",
                               1024, VP_PREC_BF16, &hw, NULL);
    cr_assert_gt(in.memory, 0.0);
    near_rel(in.memory, out.memory, 1e-12, "memory-bound time");
}

/* One training step of model `path` at batch b in fp32. */
static vp_step_time train(const char *path, uint64_t b, const vp_hw *hw)
{
    vp_error err;
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s: %s", path, err.msg);
    vp_graph *g = vp_graph_build(m, b, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_setup s;
    vp_setup_init(&s);
    s.batch = b;
    vp_step_time t;
    cr_assert_eq(vp_step_time_estimate(g, &s, hw, &t, &err), VP_OK, "%s",
                 err.msg);
    vp_graph_free(g);
    vp_model_free(m);
    return t;
}

Test(timing_kernels, a_forked_output_adds_one_gradient_sum)
{
    vp_hw hw = gpu("h200");
    vp_step_time fork = train("tests/data/timing/residual-fork.yaml", 64, &hw);
    vp_step_time chain =
        train("tests/data/timing/residual-chain.yaml", 64, &hw);
    vp_hw f = hw;
    vp_hw_fill_defaults(&f);
    const vp_curve *cp = &f.mem_kind[VP_HW_MEM_COPY];
    double own = cp->half / cp->peak - f.dispatch;
    if (own < gap_of(&hw))
        own = gap_of(&hw);
    /* fc1's fp32 output, 64 x 2048, read twice and written once */
    double bytes = 3.0 * 64 * 2048 * 4;
    double want = bytes / f.mem_kind[VP_HW_MEM_ADD].peak + own;
    near_rel(fork.memory - chain.memory, want, 1e-9, "gradient sum");
}

/* A memory-bound kernel of class k moving `bytes` (timing.c kernel_time):
 * its class's bandwidth and a kernel's own GPU time, copy's fixed cost
 * less the host's dispatch, at least the gap. */
static double mem_kernel(const vp_hw *hw0, int k, double bytes)
{
    vp_hw hw = *hw0;
    vp_hw_fill_defaults(&hw);
    const vp_curve *cp = &hw.mem_kind[VP_HW_MEM_COPY];
    double own = cp->half / cp->peak - hw.dispatch;
    if (own < gap_of(hw0))
        own = gap_of(hw0);
    return bytes / hw.mem_kind[k].peak + own;
}

/* fp32 grouped-KV attention runs SDPA's math path (the efficient kernel
 * refuses enable_gqa): TinyLlama's 22 layers at batch 1, 256 tokens, the
 * forward's two batched GEMMs on the fp32 curve and its memory-bound
 * kernels (the causal mask added, a broadcast operand; _safe_softmax's
 * softmax, isneginf, all() and where(); the scalings of q and k; the
 * repeats of k and v; HF's transpose of the output made contiguous), per
 * element of the fp32 scores (sc) and of q (qn). */
Test(timing_kernels, fp32_gqa_attention_runs_the_math_path)
{
    vp_hw hw = gpu("h200");
    vp_step_time t = step("models/llama-1b.yaml", 1, 256, VP_PREC_FP32, true,
                          &hw, false, VP_ATTN_SDPA, NULL);
    double bh = 32, s = 256, d = 64, sc = bh * s * s, qn = bh * s * d;
    double kvn = 4 * s * d;
    double layer =
        curve_gemm(&hw, VP_HW_FP32, bh * s, s, d) +
        curve_gemm(&hw, VP_HW_FP32, bh * s, d, s) +
        mem_kernel(&hw, VP_HW_MEM_ADD, 8 * sc * 1.15) +
        mem_kernel(&hw, VP_HW_MEM_SOFTMAX, 8 * sc) +
        mem_kernel(&hw, VP_HW_MEM_ADD, 5 * sc) +
        mem_kernel(&hw, VP_HW_MEM_COPY, sc) +
        mem_kernel(&hw, VP_HW_MEM_ADD, 9 * sc) +
        2 * mem_kernel(&hw, VP_HW_MEM_ADD, 8 * qn) +
        mem_kernel(&hw, VP_HW_MEM_COPY, 1.69 * 8 * qn) +
        2 * mem_kernel(&hw, VP_HW_MEM_COPY, 4 * (qn + kvn));
    near_rel(t.attention, 22 * layer, 1e-9, "attention");
}

/* Autocast casts fp32 q and k (HF's RoPE over the fp32 residual stream:
 * cos and sin in its dtype) to bf16 before the fused kernel, one copy
 * kernel each at the copy rate, 6 bytes an element; v, v_proj's output,
 * is bf16 already (timing.c fused_casts). TinyLlama's 22 layers at batch
 * 1, 256 tokens: the AMP forward's attention less the bf16 one's. */
Test(timing_kernels, amp_casts_fp32_q_and_k_before_the_fused_kernel)
{
    vp_hw hw = gpu("h200");
    vp_step_time amp = step("models/llama-1b.yaml", 1, 256, VP_PREC_AMP_BF16,
                            true, &hw, false, VP_ATTN_SDPA, NULL);
    vp_step_time bf = step("models/llama-1b.yaml", 1, 256, VP_PREC_BF16,
                           true, &hw, false, VP_ATTN_SDPA, NULL);
    double qn = 32.0 * 256 * 64, kn = 4.0 * 256 * 64;
    double layer = mem_kernel(&hw, VP_HW_MEM_COPY, 6 * qn) +
                   mem_kernel(&hw, VP_HW_MEM_COPY, 6 * kn);
    near_rel(amp.attention - bf.attention, 22 * layer, 1e-9, "casts");
}

/* A fused attention kernel computes whole blocks of queries and keys
 * (timing.c attn_blocks): ViT-B/16's 197 tokens run 256 rows a side. In
 * fp32 the memory-efficient kernel (fmha_cutlassF_f32_aligned_64x64) does
 * 256 x 256 scores per head at its measured share of the fp32 peak. */
Test(timing_kernels, fp32_attention_computes_whole_blocks)
{
    vp_hw hw = gpu("h200");
    vp_graph *g;
    vp_step_time t = forward("models/vit-b16.yaml", 4, VP_PREC_FP32, &hw, &g);
    double rate = VP_ATTN_FP32_FWD_SHARE * hw.gemm[VP_HW_FP32].peak;
    double blocks = (256.0 * 256.0) / (197.0 * 197.0);
    near_rel(t.attention, blocks * attention_time(g, rate), 1e-9,
             "attention");
    vp_graph_free(g);
}

/* cuDNN's kernels (sdpa_sm90_flash_fprop 64 x 128, bprop 64 x 64) on 197
 * and on 226 tokens (ViT-B/16 at images 224 and 240) both compute 256 x
 * 256 blocks: the FLOPs' time is the same, and the larger differs only by
 * its per-element term (timing.c attn_h200, cuDNN without mask or
 * dropout: 0.690 ps forward, 6.637 backward per element of q), 12 layers
 * of 64 x 12 heads x 29 tokens x 64 more; without the blocks its FLOPs
 * alone would cost (226 / 197)^2 = 1.32 times as much. */
Test(timing_kernels, cudnn_attention_pays_the_partial_block)
{
    vp_hw hw = gpu("h200");
    double t224 = train_attention("models/vit-b16.yaml", 64, 224, &hw, false,
                                  VP_ATTN_SDPA);
    double t240 = train_attention("models/vit-b16.yaml", 64, 240, &hw, false,
                                  VP_ATTN_SDPA);
    double el = 64.0 * 12.0 * (226.0 - 197.0) * 64.0;
    near_rel(t240 - t224, 12.0 * (0.690 + 6.637) * 1e-12 * el, 1e-6,
             "226 - 197 tokens");
}

/* nn.MultiheadAttention(batch_first=True) (layout torch_mha): in_proj's
 * input is the query transposed to sequence-first, so F.linear runs
 * matmul and then adds the bias in place (aten/src/ATen/native/Linear.cpp
 * linear: `output.add_(*bias)`): a broadcast add over the 3 x 768-wide
 * projection (the strided profile's broadcast ratio, 1.98 in 16 bits),
 * one forward launch that allocates nothing; out_proj's bias is addmm's,
 * fused. ViT-B/16's 197 tokens at batch 8 in bf16, forward only. */
Test(timing_kernels, mha_in_proj_adds_its_bias_in_place)
{
    vp_hw hw = gpu("h200");
    vp_step_time with = forward("tests/data/timing/mha-bias-true.yaml", 8,
                                VP_PREC_BF16, &hw, NULL);
    vp_step_time without = forward("tests/data/timing/mha-bias-false.yaml",
                                   8, VP_PREC_BF16, &hw, NULL);
    double out = 8.0 * 197 * 3 * 768 * 2; /* in_proj's bytes */
    near_rel(with.memory - without.memory,
             mem_kernel(&hw, VP_HW_MEM_ADD, 3.0 * out * 1.98), 1e-9,
             "bias add");
    near_rel(with.host_kernels - without.host_kernels, 1.0, 1e-12,
             "the add's launch");
}

/* torch_mha's copies of transposed tensors (torch/nn/functional.py
 * multi_head_attention_forward) run ATen's strided copy, 2.84 times the
 * contiguous copy in 16 bits (x.transpose(1, 2).contiguous() in the
 * strided profile): out_proj's `attn_output.permute(2, 0, 1, 3)
 * .contiguous()` is one unless the kernel wrote its output
 * sequence-first (flash); the memory-efficient kernel's is copied. */
Test(timing_kernels, mha_out_proj_copies_a_permuted_output_unless_flash)
{
    vp_hw hw = gpu("h200");
    vp_step_time eff = step("tests/data/timing/mha-bias-false.yaml", 8, 0,
                            VP_PREC_BF16, true, &hw, true, VP_ATTN_EFFICIENT,
                            NULL);
    vp_step_time flash = step("tests/data/timing/mha-bias-false.yaml", 8, 0,
                              VP_PREC_BF16, true, &hw, true, VP_ATTN_FLASH,
                              NULL);
    double bytes = 8.0 * 197 * 768 * 2; /* the attention's output */
    near_rel(eff.memory - flash.memory,
             mem_kernel(&hw, VP_HW_MEM_COPY, 2.0 * bytes * 2.84), 1e-9,
             "out_proj's copy");
}

/* in_proj's two copies: matmul folds the transposed query to rows
 * (LinearAlgebra.cpp _matmul_impl) and _in_projection_packed makes q, k,
 * v contiguous apart, both strided copies (fp32: 1.69 times the
 * contiguous one). fp32 with flash forced (no out_proj copy), no biases,
 * forward only: those two and the loss's are the forward's memory-bound
 * kernels. */
Test(timing_kernels, mha_in_proj_copies_its_input_and_q_k_v_strided)
{
    vp_hw hw = gpu("h200");
    vp_step_time t = step("tests/data/timing/mha-bias-false.yaml", 8, 0,
                          VP_PREC_FP32, true, &hw, true, VP_ATTN_FLASH, NULL);
    vp_step_time loss = forward("tests/data/timing/mse-197x768.yaml", 8,
                                VP_PREC_FP32, &hw, NULL);
    double x = 8.0 * 197 * 768 * 4;
    near_rel(t.memory - loss.memory,
             mem_kernel(&hw, VP_HW_MEM_COPY, 2.0 * x * 1.69) +
                 mem_kernel(&hw, VP_HW_MEM_COPY, 2.0 * 3.0 * x * 1.69),
             1e-9, "in_proj's copies");
}


/* The backward's memory-bound time of model `path` at batch b in bf16
 * with attention `ai`: a training step's less its forward's. */
static double bwd_memory(const char *path, uint64_t b, const vp_hw *hw,
                         vp_attn_impl ai)
{
    vp_step_time train = step(path, b, 0, VP_PREC_BF16, false, hw, true, ai,
                              NULL);
    vp_step_time infer = step(path, b, 0, VP_PREC_BF16, true, hw, true, ai,
                              NULL);
    return train.memory - infer.memory;
}

/* The backward of torch_mha's `q, k, v = proj[0], proj[1], proj[2]`:
 * each select's gradient goes through SelectBackward (aten/src/ATen/
 * native/TensorShape.cpp select_backward_symint: zeros of the whole
 * (3, L, N, E) projection, a fill, then `.select(0, i).copy_(grad)`, a
 * contiguous copy), and autograd adds the three buffers (torch/csrc/
 * autograd/input_buffer.cpp InputBuffer::add): three fills of 3 N E,
 * three copies of N E and two adds of 3 N E a layer (the profile's
 * FillFunctor, Memcpy DtoD and vectorized adds). With flash (no strided
 * copies of q, k, v), against the loss's backward (a linear on the same
 * input: its backward is its GEMM), from batch 8 to 16: their bytes at
 * the copy and add bandwidths (the kernels' own times and the weight
 * gradients' do not follow the batch). */
Test(timing_kernels, mha_q_k_v_gradients_are_zero_filled_copied_and_summed)
{
    vp_hw hw = gpu("h200");
    vp_hw_fill_defaults(&hw);
    double d[2];
    for (int i = 0; i < 2; i++)
        d[i] = bwd_memory("tests/data/timing/mha-bias-false.yaml", 8u << i,
                          &hw, VP_ATTN_FLASH) -
               bwd_memory("tests/data/timing/linear-197x768.yaml", 8u << i,
                          &hw, VP_ATTN_FLASH);
    double x = 8.0 * 197 * 768 * 2; /* the 8 more samples' N E, bf16 */
    near_rel(d[1] - d[0],
             (3.0 * 3.0 * x + 3.0 * 2.0 * x) /
                     hw.mem_kind[VP_HW_MEM_COPY].peak +
                 2.0 * 3.0 * 3.0 * x / hw.mem_kind[VP_HW_MEM_ADD].peak,
             1e-9, "SelectBackward's fills, copies and sums");
}

/* The memory-efficient kernel takes grad_out as [B, L, h, d], a copy of
 * the sequence-first gradient, and its dq, dk, dv go back through
 * `q.view(bsz, h, L, d)` and `.view(L, bsz * h, d).transpose(0, 1)`, two
 * reshape copies each (ViewBackward): seven strided copies at the
 * transposed-copy ratio (2.84 in 16 bits) that flash does not make. */
Test(timing_kernels, mha_backward_copies_q_k_v_strided_unless_flash)
{
    vp_hw hw = gpu("h200");
    double eff = bwd_memory("tests/data/timing/mha-bias-false.yaml", 8, &hw,
                            VP_ATTN_EFFICIENT);
    double flash = bwd_memory("tests/data/timing/mha-bias-false.yaml", 8,
                              &hw, VP_ATTN_FLASH);
    double x = 8.0 * 197 * 768 * 2;
    near_rel(eff - flash,
             7.0 * mem_kernel(&hw, VP_HW_MEM_COPY, 2.0 * x * 2.84), 1e-9,
             "the efficient kernel's strided copies");
}
