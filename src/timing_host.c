/* The host side of the single-GPU step-time model (docs/STEP_TIME.md
 * "The host", "MoE experts"): the launch queue's clocks, the host's
 * stalls, and the routed experts' GEMMs, whose form (one grouped kernel,
 * or a loop of GEMMs the host launches after a sync) decides whether an
 * MoE step is bound by the GPU or by the host. */
#include "timing_host.h"

void vp__host_issue(vp__clocks *k, double n, double per, double gpu)
{
    /* kernel by kernel (an op that issues none, a view's backward, runs
     * its GPU time when the GPU is free) */
    size_t n_k = n > 1 ? (size_t)(n + 0.5) : 1;
    for (size_t j = 0; j < n_k; j++) {
        k->host += n * per / (double)n_k;
        k->dev = (k->dev > k->host ? k->dev : k->host) + gpu / (double)n_k;
    }
}

double vp__host_scale(const vp_hw *hw)
{
    return hw->host_scale > 0.0 ? hw->host_scale : 1.0;
}

void vp__host_sync(vp__clocks *k)
{
    if (k->dev > k->host)
        k->host = k->dev;
}

/* torch/amp/grad_scaler.py _maybe_opt_step reads found_inf with .item()
 * before the step; Optimizer.step gathers and groups the tensors
 * (torch/optim/optimizer.py _group_tensors_by_device_and_dtype) before it
 * launches anything. */
double vp__host_optimizer(vp__clocks *k, double per, double fixed, double gpu,
                          double cpu, double unscale)
{
    if (unscale > 0) {
        vp__host_issue(k, 1, per, unscale);
        vp__host_sync(k);
    }
    double first = k->host + fixed + per;
    double dev = (k->dev > first ? k->dev : first) + gpu;
    double host = k->host + cpu;
    return dev > host ? dev : host;
}

double vp__gemm_work(const vp_curve *c, double m, double n, double k)
{
    if (m <= 0 || n <= 0 || k <= 0 || c->peak <= 0)
        return 0;
    double t = 2.0 * m * n * k / c->peak;
    if (c->kh > 0)
        t *= (k + c->kh) / k;
    return t;
}

double vp__gemm_queued(const vp_curve *c, double m, double n, double k)
{
    if (m <= 0 || n <= 0 || k <= 0 || c->peak <= 0)
        return 0;
    return 2.0 * m * n * k / (c->peak * VP__GEMM_QUEUED_SHARE) +
           VP__GEMM_QUEUED_FIXED;
}

double vp__gemm_small(const vp_curve *c, double dispatch, double gap,
                      double m, double n, double k)
{
    if (m <= 0 || n <= 0 || k <= 0 || c->peak <= 0)
        return 0;
    double w = 2.0 * m * n * k;
    double fixed = vp_curve_time(c, w) - w / c->peak - dispatch;
    return vp__gemm_work(c, m, n, k) + (fixed > gap ? fixed : gap);
}

bool vp__gemm_splitk(int dt, double m, double n, double k)
{
    /* the least inner size and the most output elements per inner
     * element: 16-bit, fp32 */
    static const double r[2][2] = {{4096, 32}, {256, 512}};
    const double *q = r[dt == VP_HW_FP32];
    double mn = m * n;
    return m > 0 && n > 0 && k >= q[0] && mn <= 1048576.0 && mn <= q[1] * k;
}

double vp__splitk_reduce(const vp_hw *hw, int dt, double gap, double m,
                         double n)
{
    double bw = hw->mem.peak;
    double eb = dt == VP_HW_FP32 ? 4.0 : 2.0;
    if (m <= 0 || n <= 0 || bw <= 0)
        return 0;
    return m * n * (4.0 * VP__SPLITK_SPLITS + eb) / bw + gap;
}

double vp__gemm_extra(const vp_hw *hw, int dt, double gap, double m,
                      double n, double k, double *gpu)
{
    *gpu = 0;
    if (!vp__gemm_splitk(dt, m, n, k))
        return 0;
    *gpu = vp__splitk_reduce(hw, dt, gap, m, n);
    return 1;
}

/* torch._grouped_mm (aten/src/ATen/native/cuda/GroupedBlas.cpp
 * _grouped_mm_cuda) runs CUTLASS's grouped kernel (bf16bf16_grouped_mm,
 * "fast path, no d2h sync needed") only when both operands and the output
 * are bf16 on sm90/sm100; otherwise _grouped_mm_fallback
 * (aten/src/ATen/native/GroupedMMUtils.h) copies the offsets to the host
 * (offs.cpu(): the host waits for the GPU) and launches one at::mm_out per
 * expert. transformers 5.17 casts the tokens to the experts' dtype (the
 * grouped GEMM is not autocast: src/ops/moe.c), so under autocast the
 * experts run fp32 GEMMs on the fallback. Its backward
 * (tools/autograd/derivatives.yaml) is a _grouped_mm per operand: the
 * input gradient (rows x inner over the outputs) and the weight gradient
 * (2d x 2d over each expert's rows), each again one kernel or a sync and a
 * loop. Routing is taken as balanced (tokens x top_k / E rows an
 * expert): the work's sum does not depend on the spread, and the loads
 * measured (groundtruth/moe/h200-torch2.11-moe-load.jsonl) leave no
 * expert idle in these models. */
void vp__moe_gemms_of(const vp_hw *hw, const vp_op *o, vp_precision p,
                      bool grouped, double gap, int ph, const bool grads[2],
                      vp__moe_gemms *out)
{
    out->calls = 0;
    out->fallback = !(grouped && p == VP_PREC_BF16);
    double e = o->classes ? (double)o->classes : 1.0;
    /* the fallback: offs.cpu() (a copy, a host call) and an mm per
     * expert; the grouped kernel: prepare_grouped_gemm_data (the problem
     * sizes and pointers, on the GPU) and the CUTLASS kernel
     * (at::cuda::detail::bf16bf16_grouped_mm; 2 launches per
     * aten::_grouped_mm in calibrate/profiles/h200-launch-ops.jsonl) */
    int dt = p == VP_PREC_BF16   ? VP_HW_BF16
             : p == VP_PREC_FP16 ? VP_HW_FP16
                                 : VP_HW_FP32;
    const vp_curve *c = &hw->gemm[dt];
    double h = (double)o->in_features, f = (double)o->out_features;
    if (h <= 0 || f <= 0)
        return;
    double rows = (double)o->numel / h * (double)o->top_k;
    /* forward: gate_up, down; backward: down's input and weight
     * gradients, then gate_up's (m x n over the inner k; the weight
     * gradients' inner dimension is one expert's rows) */
    const double shape[2][4][3] = {
        {{rows, 2 * f, h}, {rows, h, f}},
        {{rows, f, h}, {h, f, rows}, {rows, h, 2 * f}, {2 * f, h, rows}}};
    for (int i = 0; i < (ph == 0 ? 2 : 4); i++) {
        const double *d = shape[ph][i];
        bool wgrad = ph == 1 && (i == 1 || i == 3);
        if (ph == 1 && !grads[wgrad])
            continue; /* frozen experts; tokens without a gradient */
        double m = wgrad ? d[0] : d[0] / e, k = wgrad ? d[2] / e : d[2];
        /* the fallback's mm per expert, each split or not alike
         * (balanced rows) */
        double red = 0, x = out->fallback
                                ? vp__gemm_extra(hw, dt, gap, m, d[1], k, &red)
                                : 0;
        /* one expert's GEMM (the grouped kernel runs them all in one;
         * the fallback's fp32 GEMMs back to back take their own
         * kernels' time, split-K's second kernel included) */
        double one = !out->fallback ? vp__gemm_work(c, m, d[1], k)
                     : dt == VP_HW_FP32
                         ? vp__gemm_queued(c, m, d[1], k)
                         : vp__gemm_small(c, hw->dispatch, gap, m, d[1], k) +
                               red;
        int i_c = out->calls++;
        out->launches[i_c] = out->fallback ? e * (1.0 + x) + 1.0 : 2.0;
        out->gpu[i_c] = e * one + (out->fallback ? 0 : gap);
        out->host[i_c] = out->fallback ? (VP__HOST_GROUPED_CALL +
                                          e * VP__HOST_GROUPED_GROUP) *
                                             vp__host_scale(hw)
                                       : out->launches[i_c] * hw->dispatch;
    }
}

double vp__moe_gemms_gpu(const vp__moe_gemms *m)
{
    double t = 0;
    for (int i = 0; i < m->calls; i++)
        t += m->gpu[i];
    return t;
}

double vp__moe_gemms_host(const vp__moe_gemms *m)
{
    double t = 0;
    for (int i = 0; i < m->calls; i++)
        t += m->host[i];
    return t;
}

void vp__moe_gemms_run(const vp__moe_gemms *m, vp__clocks *k)
{
    for (int i = 0; i < m->calls; i++) {
        if (m->fallback)
            vp__host_sync(k);
        double n = m->launches[i];
        vp__host_issue(k, n, n > 0 ? m->host[i] / n : 0, m->gpu[i]);
    }
}
