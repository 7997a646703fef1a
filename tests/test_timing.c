/* The step-time model (timing.h): the roofline of matrix work against
 * hand-computed FLOP counts, how the phases scale with the batch, the
 * precision, checkpointing, accumulation, inference and optimizer offload,
 * and the defaults of the efficiency terms. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "vramplan/vramplan.h"

#include "../src/timing_host.h" /* VP__HOST_GEMM_NODE */

#define ONE_LINEAR "tests/data/validate/one-linear.yaml"

static vp_model *load(const char *path)
{
    vp_error err;
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "%s: %s", path, err.msg);
    return m;
}

static vp_hw h200(void)
{
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load("h200", &err);
    cr_assert_not_null(p, "h200: %s", err.msg);
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    vp_gpu_hw(p, VP_GPU_BF16, &hw);
    vp_hw_fill_defaults(&hw);
    vp_gpu_free(p);
    cr_assert_gt(hw.fp32, 0.0);
    cr_assert_gt(hw.bf16, 0.0);
    return hw;
}

/* A GPU where matrix work is slow and memory traffic is free: every op
 * that is not a matmul costs only its launch gap (1 ns here). */
static vp_hw slow_gemm_hw(void)
{
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    snprintf(hw.name, sizeof hw.name, "slow-gemm");
    hw.fp32 = 1e10;
    hw.bf16 = 4e10;
    hw.fp16 = 4e10;
    hw.hbm = 1e20;
    hw.host = 1e10;
    hw.eff_max = 0.5;
    hw.f_half = 1e9;
    hw.mem_eff = 0.5;
    hw.launch = 1e-9;
    return hw;
}

/* Time `s` at s->batch with the checkpoint spec (NULL: none). */
static vp_step_time timed(const vp_model *m, const vp_setup *s0,
                          const char *ckpt, const vp_hw *hw)
{
    vp_error err;
    vp_graph *g = vp_graph_build(m, s0->batch, s0->seq, &err);
    cr_assert_not_null(g, "%s", err.msg);
    size_t ns = vp_graph_segment_count(g);
    bool mask[64] = {false};
    cr_assert_leq(ns, 64);
    cr_assert_eq(vp_graph_checkpoint_select(g, ckpt, mask, &err), VP_OK,
                 "%s", err.msg);
    vp_setup s = *s0;
    s.checkpoint = mask;
    s.n_checkpoint = ns;
    vp_step_time t;
    cr_assert_eq(vp_step_time_estimate(g, &s, hw, &t, &err), VP_OK, "%s",
                 err.msg);
    vp_graph_free(g);
    return t;
}

/* A GEMM among others runs at the curve's peak, rate x eff_max where no
 * curve was measured (its fixed cost is the host's, counted apart). */
static double roofline(const vp_hw *hw, double flops, double rate)
{
    return flops / (rate * hw->eff_max);
}

static bool is_matmul(vp_op_kind k)
{
    return k == VP_OP_LINEAR || k == VP_OP_CONV2D || k == VP_OP_ATTENTION;
}

static void near_rel(double got, double want, double tol, const char *what)
{
    cr_assert(fabs(got - want) <= tol * fabs(want),
              "%s: got %.9g, expected %.9g (tolerance %g relative)", what,
              got, want, tol);
}

/* ---- the roofline of matrix work --------------------------------------- */

Test(timing, matmul_forward_follows_flops_over_rate_times_efficiency)
{
    vp_model *m = load(ONE_LINEAR);
    vp_hw hw = slow_gemm_hw();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 1024;
    vp_error err;
    vp_graph *g = vp_graph_build(m, s.batch, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    double want = 0.0;
    size_t n_mm = 0;
    for (size_t i = 0; i < vp_graph_op_count(g); i++) {
        const vp_op *o = vp_graph_op(g, i);
        if (!is_matmul(o->kind))
            continue;
        n_mm++;
        /* Linear(4096, 4096) on 1024 rows: 2 m n k */
        cr_assert_float_eq(o->flops_fwd, 2.0 * 1024 * 4096 * 4096, 1.0);
        want += roofline(&hw, o->flops_fwd, hw.fp32);
    }
    cr_assert_eq(n_mm, 1);
    vp_step_time t;
    cr_assert_eq(vp_step_time_estimate(g, &s, &hw, &t, &err), VP_OK, "%s",
                 err.msg);
    /* the other ops cost only a few gaps of 1 ns against ~7 s, the host
     * ~10 us to launch the first kernel */
    cr_assert_geq(t.forward, want);
    near_rel(t.forward, want, 1e-4, "forward");
    vp_graph_free(g);
    vp_model_free(m);
}

Test(timing, matmul_backward_follows_the_same_roofline)
{
    vp_model *m = load(ONE_LINEAR);
    vp_hw hw = slow_gemm_hw();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 1024;
    vp_error err;
    vp_graph *g = vp_graph_build(m, s.batch, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    double want = 0.0;
    for (size_t i = 0; i < vp_graph_op_count(g); i++) {
        const vp_op *o = vp_graph_op(g, i);
        if (is_matmul(o->kind) && o->flops_bwd > 0)
            want += roofline(&hw, o->flops_bwd, hw.fp32);
    }
    cr_assert_gt(want, 0.0);
    vp_step_time t;
    cr_assert_eq(vp_step_time_estimate(g, &s, &hw, &t, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_geq(t.backward, want);
    near_rel(t.backward, want, 1e-4, "backward");
    vp_graph_free(g);
    vp_model_free(m);
}

Test(timing, halving_eff_max_doubles_matmul_time)
{
    vp_model *m = load(ONE_LINEAR);
    vp_hw hw = slow_gemm_hw();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 1024;
    vp_step_time a = timed(m, &s, NULL, &hw);
    hw.eff_max /= 2.0;
    vp_step_time b = timed(m, &s, NULL, &hw);
    near_rel(b.forward, 2.0 * a.forward, 1e-4, "forward");
    near_rel(b.backward, 2.0 * a.backward, 1e-4, "backward");
    vp_model_free(m);
}

Test(timing, matmul_rate_per_precision)
{
    vp_hw hw = slow_gemm_hw();
    hw.tf32 = 7e10; /* fp32 matmuls stay off TF32 (PyTorch's default) */
    hw.fp16 = 3e10;
    cr_assert_float_eq(vp_hw_matmul_rate(&hw, VP_PREC_FP32), hw.fp32, 0.0);
    cr_assert_float_eq(vp_hw_matmul_rate(&hw, VP_PREC_AMP_BF16), hw.bf16, 0.0);
    cr_assert_float_eq(vp_hw_matmul_rate(&hw, VP_PREC_BF16), hw.bf16, 0.0);
    cr_assert_float_eq(vp_hw_matmul_rate(&hw, VP_PREC_AMP_FP16), hw.fp16, 0.0);
    cr_assert_float_eq(vp_hw_matmul_rate(&hw, VP_PREC_FP16), hw.fp16, 0.0);
}

/* ---- scaling with the setup -------------------------------------------- */

Test(timing, doubling_the_batch_roughly_doubles_the_time)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    /* fp32 at batch 16 and more: the matmuls outweigh the per-kernel
     * launch costs that do not grow with the batch */
    s.precision = VP_PREC_FP32;
    s.batch = 16;
    vp_step_time a = timed(m, &s, NULL, &hw);
    s.batch = 32;
    vp_step_time b = timed(m, &s, NULL, &hw);
    double fb = (b.forward + b.backward) / (a.forward + a.backward);
    cr_assert(fb > 1.8 && fb < 2.1, "forward+backward grew %.3fx", fb);
    /* the optimizer step does not depend on the batch */
    near_rel(b.optimizer, a.optimizer, 1e-9, "optimizer");
    double tot = b.total / a.total;
    cr_assert(tot > 1.6 && tot <= fb + 1e-9, "total grew %.3fx", tot);
    vp_model_free(m);
}

Test(timing, fp32_is_slower_than_bf16_on_the_same_gpu)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    s.precision = VP_PREC_FP32;
    vp_step_time f32 = timed(m, &s, NULL, &hw);
    s.precision = VP_PREC_BF16;
    vp_step_time b16 = timed(m, &s, NULL, &hw);
    s.precision = VP_PREC_AMP_BF16;
    vp_step_time amp = timed(m, &s, NULL, &hw);
    cr_assert_gt(f32.forward, b16.forward);
    cr_assert_gt(f32.backward, b16.backward);
    cr_assert_gt(f32.total, b16.total);
    cr_assert_gt(f32.total, amp.total);
    /* the same model FLOPs whatever the precision */
    near_rel(b16.flops, f32.flops, 1e-12, "flops");
    vp_model_free(m);
}

Test(timing, recompute_time_only_with_checkpointing)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 4;
    s.precision = VP_PREC_AMP_BF16;
    vp_step_time none = timed(m, &s, NULL, &hw);
    vp_step_time all = timed(m, &s, "all", &hw);
    vp_step_time one = timed(m, &s, "layers.0", &hw);
    cr_assert_float_eq(none.recompute, 0.0, 0.0);
    cr_assert_gt(all.recompute, 0.0);
    /* recomputing a part of the forward costs less than the forward */
    cr_assert_lt(all.recompute, all.forward);
    cr_assert_gt(one.recompute, 0.0);
    cr_assert_lt(one.recompute, all.recompute);
    cr_assert_gt(all.total, none.total);
    /* the model FLOPs leave the recomputation out */
    near_rel(all.flops, none.flops, 1e-12, "flops");
    vp_model_free(m);
}

Test(timing, accumulation_multiplies_forward_and_backward)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 4;
    s.precision = VP_PREC_AMP_BF16;
    vp_step_time one = timed(m, &s, NULL, &hw);
    s.accum = 4;
    vp_step_time four = timed(m, &s, NULL, &hw);
    /* after the first, each micro-batch adds at least the longer of its
     * host and GPU time (the host launches it while the GPU still runs
     * the one before), a little more where one waits for the other
     * inside it */
    double passes1 = one.forward + one.backward + one.recompute;
    double passes4 = four.forward + four.backward + four.recompute;
    double gpu = one.gemm + one.attention + one.memory;
    double more = gpu > one.cpu ? gpu : one.cpu;
    cr_assert_geq(passes4, (passes1 + 3.0 * more) * (1 - 1e-9));
    near_rel(passes4, passes1 + 3.0 * more, 0.05, "forward+backward x4");
    cr_assert_lt(passes4, 4.0 * passes1);
    near_rel(four.gemm, 4.0 * one.gemm, 1e-9, "GEMM time x4");
    near_rel(four.flops, 4.0 * one.flops, 1e-12, "flops x4");
    /* one optimizer step per accumulated batch */
    near_rel(four.optimizer, one.optimizer, 0.05, "optimizer");
    vp_model_free(m);
}

Test(timing, inference_has_no_backward_or_optimizer)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 4;
    s.precision = VP_PREC_AMP_BF16;
    vp_step_time train = timed(m, &s, NULL, &hw);
    s.inference = true;
    vp_step_time inf = timed(m, &s, NULL, &hw);
    cr_assert_gt(inf.forward, 0.0);
    cr_assert_float_eq(inf.backward, 0.0, 0.0);
    cr_assert_float_eq(inf.recompute, 0.0, 0.0);
    cr_assert_float_eq(inf.optimizer, 0.0, 0.0);
    near_rel(inf.total, inf.forward + inf.offload, 1e-12, "total");
    cr_assert_lt(inf.total, train.total);
    cr_assert_lt(inf.flops, train.flops);
    vp_model_free(m);
}

Test(timing, optimizer_none_has_no_optimizer_time)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 64;
    s.optimizer = VP_OPT_NONE;
    vp_step_time t = timed(m, &s, NULL, &hw);
    cr_assert_float_eq(t.optimizer, 0.0, 0.0);
    cr_assert_gt(t.backward, 0.0);
    vp_model_free(m);
}

Test(timing, offload_optimizer_moves_the_optimizer_to_the_host)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 64;
    vp_step_time gpu = timed(m, &s, NULL, &hw);
    s.offload_optimizer = true;
    vp_step_time off = timed(m, &s, NULL, &hw);
    cr_assert_gt(gpu.optimizer, 0.0);
    cr_assert_float_eq(gpu.offload, 0.0, 0.0);
    cr_assert_float_eq(off.optimizer, 0.0, 0.0);
    /* at least CPU Adam's pass: 16 bytes per parameter at 20 GB/s */
    double cpu_adam = 155128808.0 * 16.0 / VP_HOST_ADAM_BW;
    cr_assert_geq(off.offload, cpu_adam * (1.0 - 1e-9), "offload %g < %g",
                  off.offload, cpu_adam);
    near_rel(off.total,
             off.forward + off.backward + off.recompute + off.offload, 1e-12,
             "total");
    vp_model_free(m);
}

Test(timing, earg_when_the_gpu_lacks_the_precision_rate)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_error err;
    vp_graph *g = vp_graph_build(m, 8, 0, &err);
    cr_assert_not_null(g);
    vp_hw hw = slow_gemm_hw();
    snprintf(hw.name, sizeof hw.name, "no-bf16-gpu");
    hw.bf16 = 0.0; /* like a V100 */
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    s.precision = VP_PREC_AMP_BF16;
    vp_step_time t;
    cr_assert_eq(vp_step_time_estimate(g, &s, &hw, &t, &err), VP_EARG);
    cr_assert_eq(err.code, VP_EARG);
    cr_assert_not_null(strstr(err.msg, "no-bf16-gpu"), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "amp-bf16"), "%s", err.msg);
    /* fp32 still has its rate */
    s.precision = VP_PREC_FP32;
    cr_assert_eq(vp_step_time_estimate(g, &s, &hw, &t, &err), VP_OK, "%s",
                 err.msg);
    vp_graph_free(g);
    vp_model_free(m);
}

Test(timing, earg_without_memory_bandwidth)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_error err;
    vp_graph *g = vp_graph_build(m, 8, 0, &err);
    cr_assert_not_null(g);
    vp_hw hw = slow_gemm_hw();
    hw.hbm = 0.0;
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    vp_step_time t;
    cr_assert_eq(vp_step_time_estimate(g, &s, &hw, &t, &err), VP_EARG);
    vp_graph_free(g);
    vp_model_free(m);
}

Test(timing, mfu_is_in_the_unit_interval)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_hw hw = h200();
    static const vp_precision precs[] = {VP_PREC_FP32, VP_PREC_AMP_BF16,
                                         VP_PREC_BF16};
    for (size_t i = 0; i < 3; i++) {
        for (uint64_t b = 1; b <= 16; b *= 4) {
            vp_setup s;
            vp_setup_init(&s);
            s.batch = b;
            s.precision = precs[i];
            vp_step_time t = timed(m, &s, NULL, &hw);
            cr_assert(t.mfu > 0.0 && t.mfu <= 1.0, "%s batch %llu: mfu %g",
                      vp_precision_name(precs[i]), (unsigned long long)b,
                      t.mfu);
            /* its definition */
            near_rel(t.mfu,
                     t.flops / (t.total * vp_hw_matmul_rate(&hw, precs[i])),
                     1e-12, "mfu");
        }
    }
    vp_model_free(m);
}

Test(timing, total_is_the_sum_of_the_phases)
{
    vp_model *m = load("models/gpt2-small.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 4;
    s.accum = 2;
    s.precision = VP_PREC_AMP_BF16;
    vp_step_time t = timed(m, &s, "all", &hw);
    near_rel(t.total,
             t.forward + t.backward + t.recompute + t.optimizer + t.offload,
             1e-12, "total");
    vp_model_free(m);
}

/* ---- the host (docs/STEP_TIME.md "The host") --------------------------- */

/* A GPU on which every kernel is instant, the host's costs round numbers:
 * the step is the host's time alone. */
static vp_hw instant_gpu_hw(void)
{
    vp_hw hw = slow_gemm_hw();
    hw.fp32 = hw.bf16 = hw.fp16 = 1e30;
    hw.hbm = 1e30;
    hw.launch = 1e-15;
    hw.host_fwd = 1e-3;
    hw.host_bwd = 2e-3;
    hw.host_opt = 5e-3;
    hw.host_opt_tensor[VP_HW_OPTIM_ADAMW] = 1e-4;
    hw.optim[VP_HW_OPTIM_ADAMW][0] = (vp_optim_cost){1e-12, 0, 50};
    hw.optim_bw = 1e30;
    return hw;
}

Test(timing_host, a_host_bound_step_is_the_hosts_time)
{
    vp_model *m = load(ONE_LINEAR);
    vp_hw hw = instant_gpu_hw();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 64;
    vp_step_time t = timed(m, &s, NULL, &hw);
    /* one bias-free Linear: one parameter tensor; its output is the
     * forward's first kernel, its weight and input gradients two of the
     * backward's */
    cr_assert_float_eq(t.host_tensors, 1.0, 0.0);
    cr_assert_geq(t.host_kernels, 2.0);
    cr_assert_geq(t.host_bwd_kernels, 2.0);
    cr_assert_float_eq(t.host_casts, 0.0, 0.0);
    /* forward kernels x 1 ms + backward kernels and its GEMM node's
     * units ("The host per op") x 2 ms + the optimizer's 5 ms + 1 tensor
     * x 0.1 ms (the sweep's cpu_us, 50 us, is not the host's) */
    cr_assert_float_eq(t.host_bwd_calls, VP__HOST_GEMM_NODE, 1e-12);
    double want = t.host_kernels * 1e-3 +
                  (t.host_bwd_kernels + t.host_bwd_calls) * 2e-3 + 5e-3 +
                  1.0 * 1e-4;
    near_rel(t.total, want, 1e-9, "host-bound step");
    near_rel(t.optimizer, 5e-3 + 1e-4, 1e-9, "optimizer's host");
    vp_model_free(m);
}

Test(timing_host, the_optimizers_kernels_wait_for_its_python)
{
    vp_model *m = load(ONE_LINEAR);
    vp_hw hw = instant_gpu_hw();
    /* the optimizer's state streams at 1 GB/s: 4096 x 4096 parameters x
     * 1000 B = 16.78 s of GPU time, which starts once the host has run the
     * step's fixed Python (5 ms) and launched the first kernel */
    hw.optim[VP_HW_OPTIM_ADAMW][0] = (vp_optim_cost){1000, 0, 50};
    hw.optim_bw = 1e9;
    hw.dispatch = 1e-5;
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 64;
    vp_step_time t = timed(m, &s, NULL, &hw);
    double passes = t.host_kernels * 1e-3 +
                    (t.host_bwd_kernels + t.host_bwd_calls) * 2e-3;
    double gpu = 4096.0 * 4096.0 * 1000.0 / 1e9;
    near_rel(t.total, passes + 5e-3 + 1e-5 + gpu, 1e-9, "step");
    vp_model_free(m);
}

Test(timing_host, a_call_that_writes_in_place_issues_one_kernel)
{
    /* ResNet-50 (torchvision): 49 ReLU(inplace=True) calls and 16
     * `out += identity` adds allocate nothing; each issues one kernel */
    vp_model *m = load("models/resnet50.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 8;
    vp_error err;
    vp_graph *g = vp_graph_build(m, s.batch, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    double relu = 0, add = 0;
    for (size_t i = 0; i < vp_graph_op_count(g); i++) {
        relu += vp_graph_op(g, i)->kind == VP_OP_RELU;
        add += vp_graph_op(g, i)->kind == VP_OP_ADD;
    }
    vp_graph_free(g);
    cr_assert_float_eq(relu, 49.0, 0.0);
    cr_assert_float_eq(add, 16.0, 0.0);
    vp_step_time t = timed(m, &s, NULL, &hw);
    /* the fit's counts (calibrate/profiles/h200-host-counts.jsonl,
     * resnet50-fp32-b64): 309 forward kernels = 244 allocations + 65;
     * 414 backward ones = 397 allocations + the 16 blocks' sums of the
     * identity's two gradients (autograd's InputBuffer) + 1; the fc
     * layer's split-K second kernel (fp32, 8 x 1000 over 2048; its input
     * gradient 8 x 2048 over 1000), one each way */
    cr_assert_float_eq(t.host_kernels, 244.0 + 65.0 + 1.0, 0.0);
    cr_assert_float_eq(t.host_bwd_kernels, 397.0 + 16.0 + 1.0, 0.0);
    cr_assert_float_eq(t.host_tensors, 161.0, 0.0);
    /* counts are per micro-batch: the same under accumulation */
    s.accum = 2;
    vp_step_time a = timed(m, &s, NULL, &hw);
    cr_assert_float_eq(a.host_kernels, 310.0, 0.0);
    cr_assert_float_eq(a.host_bwd_kernels, 414.0, 0.0);
    vp_model_free(m);
}

Test(timing_host, autocast_casts_are_forward_kernels)
{
    /* mlp10: 10 Linears, 9 ReLUs and the loss issue 22 kernels; under
     * autocast each Linear's weight and bias are cast (20 casts) and the
     * 16-bit activations add 2 kernels (the fit's counts,
     * calibrate/profiles/h200-host-counts.jsonl: kernels + casts). In
     * fp32 the last Linear (1024 x 1000 over 4096) is split along k: one
     * kernel more (vp__gemm_splitk); its 16-bit GEMM is not. */
    vp_model *m = load("models/mlp10.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 1024;
    vp_step_time a = timed(m, &s, NULL, &hw);
    cr_assert_float_eq(a.host_kernels, 22.0 + 1.0, 0.0);
    cr_assert_float_eq(a.host_casts, 0.0, 0.0);
    cr_assert_float_eq(a.host_bwd_kernels, 60.0, 0.0);
    s.precision = VP_PREC_AMP_BF16;
    vp_step_time b = timed(m, &s, NULL, &hw);
    cr_assert_float_eq(b.host_casts, 20.0, 0.0);
    cr_assert_float_eq(b.host_kernels, 44.0, 0.0);
    cr_assert_float_eq(b.host_bwd_kernels, 81.0, 0.0);
    vp_model_free(m);
}

/* cuBLAS's split-K second kernels are host launches of the linears'
 * GEMMs (docs/STEP_TIME.md "cuBLAS split-K"): mlp10 in fp32 at batch 256
 * splits every forward GEMM (256 x 4096 over 4096, 256 x 1000 over 4096:
 * at most 2^20 outputs, 512 per inner element) and the input gradients
 * of the eight 4096-wide layers that have one (256 x 4096 over 4096; over
 * 1000 for the last layer's, too short), no weight gradient (4096 x 4096
 * over 256 rows); at batch 2048 no GEMM is small enough. */
Test(timing_host, split_gemms_launch_a_second_kernel)
{
    vp_model *m = load("models/mlp10.yaml");
    vp_hw hw = h200();
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 256;
    vp_step_time a = timed(m, &s, NULL, &hw);
    cr_assert_float_eq(a.host_kernels, 22.0 + 10.0, 0.0);
    cr_assert_float_eq(a.host_bwd_kernels, 60.0 + 8.0, 0.0);
    s.batch = 2048;
    vp_step_time b = timed(m, &s, NULL, &hw);
    cr_assert_float_eq(b.host_kernels, 22.0, 0.0);
    cr_assert_float_eq(b.host_bwd_kernels, 60.0, 0.0);
    vp_model_free(m);
}

Test(timing_host, h200_defaults_are_the_host_fit)
{
    /* calibrate/fit-host.py on calibrate/profiles/h200-host.jsonl */
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    vp_hw_fill_defaults(&hw);
    cr_assert_float_eq(hw.host_fwd, 30.97e-6, 1e-12);
    cr_assert_float_eq(hw.host_bwd, 20.46e-6, 1e-12);
    cr_assert_float_eq(hw.host_opt, 868.4e-6, 1e-12);
    cr_assert_float_eq(hw.host_opt_tensor[VP_HW_OPTIM_ADAMW], 16.93e-6, 1e-12);
    cr_assert_float_eq(hw.host_opt_tensor[VP_HW_OPTIM_ADAMW_FUSED], 9.71e-6,
                       1e-12);
    cr_assert_float_eq(hw.host_opt_tensor[VP_HW_OPTIM_ADAMW_FORLOOP],
                       177.27e-6, 1e-12);
    cr_assert_float_eq(hw.host_opt_tensor[VP_HW_OPTIM_SGD], 7.05e-6, 1e-12);
}

/* ---- vp_hw_fill_defaults ----------------------------------------------- */

Test(hw_defaults, fills_an_empty_profile)
{
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    vp_hw_fill_defaults(&hw);
    cr_assert_float_eq(hw.eff_max, VP_HW_DEFAULT_EFF_MAX, 0.0);
    cr_assert_float_eq(hw.f_half, VP_HW_DEFAULT_F_HALF, 0.0);
    cr_assert_float_eq(hw.mem_eff, VP_HW_DEFAULT_MEM_EFF, 0.0);
}

Test(hw_defaults, keeps_a_measured_curve)
{
    vp_hw hw = slow_gemm_hw(); /* eff_max 0.5, f_half 1e9, mem_eff 0.5 */
    vp_hw_fill_defaults(&hw);
    cr_assert_float_eq(hw.eff_max, 0.5, 0.0);
    cr_assert_float_eq(hw.f_half, 1e9, 0.0);
    cr_assert_float_eq(hw.mem_eff, 0.5, 0.0);
    /* the GEMM curves follow them: rate x eff_max, half f_half */
    cr_assert_float_eq(hw.gemm[VP_HW_FP32].peak, 0.5e10, 1.0);
    cr_assert_float_eq(hw.gemm[VP_HW_FP32].half, 1e9, 0.0);
    cr_assert_float_eq(hw.gemm[VP_HW_BF16].peak, 2e10, 1.0);
    cr_assert_float_eq(hw.gemm[VP_HW_FP8].peak, 0.0, 0.0); /* no fp8 */
}

Test(hw_defaults, datasheet_efficiency_of_one_is_open)
{
    /* a datasheet profile: eff 1 (no curve), no f_half, full bandwidth */
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    hw.eff_max = 1.0;
    hw.mem_eff = 1.0;
    vp_hw_fill_defaults(&hw);
    cr_assert_float_eq(hw.eff_max, VP_HW_DEFAULT_EFF_MAX, 0.0);
    cr_assert_float_eq(hw.f_half, VP_HW_DEFAULT_F_HALF, 0.0);
    cr_assert_float_eq(hw.mem_eff, VP_HW_DEFAULT_MEM_EFF, 0.0);
}

Test(hw_defaults, fills_only_the_open_fields)
{
    /* a curve (f_half) but the datasheet's memory efficiency */
    vp_hw hw = slow_gemm_hw();
    hw.mem_eff = 1.0;
    vp_hw_fill_defaults(&hw);
    cr_assert_float_eq(hw.eff_max, 0.5, 0.0);
    cr_assert_float_eq(hw.f_half, 1e9, 0.0);
    cr_assert_float_eq(hw.mem_eff, VP_HW_DEFAULT_MEM_EFF, 0.0);
    /* a measured memory efficiency but no curve */
    vp_hw h2;
    memset(&h2, 0, sizeof h2);
    h2.mem_eff = 0.6;
    h2.eff_max = 0.7;
    vp_hw_fill_defaults(&h2);
    cr_assert_float_eq(h2.mem_eff, 0.6, 0.0);
    cr_assert_float_eq(h2.eff_max, 0.7, 0.0);
    cr_assert_float_eq(h2.f_half, VP_HW_DEFAULT_F_HALF, 0.0);
}

Test(hw_defaults, leaves_rates_and_names_alone)
{
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    snprintf(hw.name, sizeof hw.name, "x");
    hw.fp32 = 1e13;
    hw.bf16 = 2e14;
    hw.hbm = 3e12;
    hw.launch = 5e-6;
    hw.memory = 80ull << 30;
    vp_hw_fill_defaults(&hw);
    cr_assert_str_eq(hw.name, "x");
    cr_assert_float_eq(hw.fp32, 1e13, 0.0);
    cr_assert_float_eq(hw.bf16, 2e14, 0.0);
    cr_assert_float_eq(hw.hbm, 3e12, 0.0);
    cr_assert_float_eq(hw.launch, 5e-6, 0.0);
    cr_assert_eq(hw.memory, 80ull << 30);
}

/* A GPU profile that measured no memory-bound kernel classes runs each at
 * the H200 sweep's bandwidth for that class over copy's (scripts/
 * h200_sweeps.py; src/timing.c vp_hw_mem_share): copy 4279 GB/s, add
 * 4298, gelu 3083, silu 3949, layernorm 2674, softmax 1270, to_fp32 2111,
 * cross_entropy 333, Python RMSNorm 264. The shares are those ratios to
 * four decimals, so each class's bandwidth is copy's times the ratio
 * within half a unit of the fourth decimal. */
Test(timing_defaults, unmeasured_kernel_classes_at_the_h200_sweep_ratios)
{
    static const double gbps[VP_HW_MEM__N] = {
        [VP_HW_MEM_COPY] = 4279, [VP_HW_MEM_ADD] = 4298,
        [VP_HW_MEM_GELU] = 3083, [VP_HW_MEM_SILU] = 3949,
        [VP_HW_MEM_LAYERNORM] = 2674, [VP_HW_MEM_SOFTMAX] = 1270,
        [VP_HW_MEM_CAST] = 2111, [VP_HW_MEM_CROSS_ENTROPY] = 333,
        [VP_HW_MEM_RMSNORM_PY] = 264};
    vp_hw hw;
    memset(&hw, 0, sizeof hw);
    strcpy(hw.name, "no-sweep");
    hw.fp32 = 67e12;
    hw.bf16 = 989.4e12;
    hw.hbm = 3.35e12;
    hw.eff_max = 1.0;
    hw.mem_eff = 0.9;
    vp_hw_fill_defaults(&hw);
    double copy = hw.mem_kind[VP_HW_MEM_COPY].peak;
    cr_assert_gt(copy, 0.0);
    for (int k = 0; k < VP_HW_MEM__N; k++) {
        double share = hw.mem_kind[k].peak / copy;
        double want = gbps[k] / gbps[VP_HW_MEM_COPY];
        cr_expect(fabs(share - want) <= 5e-5, "class %d: %.6f of copy, "
                  "the sweep's %.6f", k, share, want);
    }
}
