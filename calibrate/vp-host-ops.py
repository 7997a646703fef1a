"""The host's cost of one op class, with and without the profiler (docs/STEP_TIME.md "The host per op"): what
calibrate/profiles/h200-launch-ops.jsonl's profiled host microseconds cannot settle, the profiler's own cost per
recorded event, which inflates an op with many nested calls (a linear: t, matmul, mm, views) more than one with a
single call (mul).

    python3 calibrate/vp-host-ops.py OUT.jsonl        (one GPU; torch 2.11 on the H200 of the ground truth)

Every op runs on tensors small enough that its kernels take less than the host's launch (the host leads, the launch
queue never fills): N calls issued back to back, timed on the host without a synchronize inside the loop
(perf_counter before and after; the GPU drained before), the median of REPS runs; the same loop again under
torch.profiler (CPU activity), to give the profiler's inflation per op. Forward: the op's call. Backward: a chain of N
calls of the op built under grad, then .backward() timed (the engine's nodes; the loss's own nodes are one call).
One JSON object per line:
  {"kind": "host_op", "op": NAME, "phase": "fwd"|"bwd", "calls": N, "launches": per call (profiled count),
   "us_per_call": unprofiled, "profiled_us_per_call": under the profiler}
plus one {"kind": "env", "torch": ..., "gpu": ...}.

The grouped GEMMs (issue 13, docs/STEP_TIME.md "What is left", the MoE fallback's host): torch._grouped_mm on fp32
operands (aten/src/ATen/native/cuda/GroupedBlas.cpp: not the bf16 CUTLASS kernel, the fallback: offs.cpu() and an
mm_out per group), E groups of 16 rows over [E, 256, 256] weights (the transformers 5 experts' transposed view), E 8,
16, 32 and 128: ops "grouped_mm_fp32_eE" (forward) and "GroupedMmBackward0_fp32_eE" (input and weight gradients);
"grouped_mm_bf16_e16" is the CUTLASS kernel beside them. Their calls are N * 8 / E (at least 25), so every op issues
about the same number of mm.
"""
import json, statistics, sys, time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

N, REPS = 400, 7
DEV, BF = "cuda", torch.bfloat16
LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def small():
    """Activations [rows, 256] and weights [256, 256] in bf16: a few microseconds of GPU work a kernel."""
    x = torch.randn(64, 256, device=DEV, dtype=BF)
    w = torch.randn(256, 256, device=DEV, dtype=BF) / 16
    return x, w


def fwd_ops():
    x, w = small()
    x3 = x.view(4, 16, 256)
    wf = w.float()
    q = torch.randn(2, 4, 64, 64, device=DEV, dtype=BF)
    bias = torch.zeros(2, 4, 64, 64, device=DEV, dtype=BF)

    def autocast_linear():
        with torch.autocast("cuda", dtype=BF):
            return F.linear(x3.float(), wf)

    ops = {
        "mul": lambda: x * x,
        "add": lambda: x + x,
        "view": lambda: x.view(64, 16, 16),
        "transpose": lambda: x3.transpose(1, 2),
        "linear_2d": lambda: F.linear(x, w),
        "linear_3d": lambda: F.linear(x3, w),
        "linear_3d_autocast": autocast_linear,  # the input and weight casts inside
        "sdpa_causal": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),  # cuDNN on sm90, 16-bit
        "sdpa_bias": lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=bias),  # T5's: the math path
    }
    for e in GROUPS:
        a, wt, offs = grouped(e, torch.float32)
        ops["grouped_mm_fp32_e%d" % e] = lambda a=a, wt=wt, offs=offs: torch._grouped_mm(a, wt, offs=offs)
    a, wt, offs = grouped(16, BF)
    ops["grouped_mm_bf16_e16"] = lambda: torch._grouped_mm(a, wt, offs=offs)
    return ops


GROUPS = (8, 16, 32, 128)
ROWS = 16  # rows per group


def grouped(e, dtype):
    """A routed experts' GEMM: [E * ROWS, 256] tokens, the experts' [E, 256, 256] weights as the transposed view
    transformers 5 passes (integrations/moe.py grouped_mm_experts_forward), int32 offsets of each group's end."""
    a = torch.randn(e * ROWS, 256, device=DEV, dtype=dtype)
    w = torch.randn(e, 256, 256, device=DEV, dtype=dtype) / 16
    offs = torch.arange(ROWS, e * ROWS + 1, ROWS, device=DEV, dtype=torch.int32)
    return a, w.transpose(-1, -2), offs


def calls_of(name):
    """Calls of one op: N, the grouped ones N * 8 / E (at least 25)."""
    if "_e" in name:
        return max(25, N * 8 // int(name.rsplit("_e", 1)[1]))
    return N // 8 if name.startswith("ScaledDotProduct") else N


def bwd_chains():
    """Chains whose backward runs N nodes of one kind (and the leaf's AccumulateGrad)."""
    x, w = small()

    def chain(step):
        def build():
            y = x.detach().requires_grad_(True)
            for _ in range(N):
                y = step(y)
            return y.float().sum()
        return build

    ws = w.detach().requires_grad_(True)
    q0 = torch.randn(2, 4, 64, 64, device=DEV, dtype=BF)
    chains = {
        "MulBackward1": chain(lambda y: y * 1.0001),  # a single-launch node: the unit
        "MmBackward0": chain(lambda y: y @ w),  # frozen weight: the input gradient only
        "MmBackward0_weight": chain(lambda y: y @ ws),  # and the weight's: mm_mat1 and mm_mat2_backward
        "ScaledDotProductCudnnAttentionBackward0": lambda: sdpa_chain(q0),
    }
    for e in GROUPS:
        chains["GroupedMmBackward0_fp32_e%d" % e] = grouped_chain(e)
    return chains


def grouped_chain(e):
    """A chain of calls_of(...) grouped GEMMs over trained fp32 experts: each node's input and weight gradients."""
    a, wt, offs = grouped(e, torch.float32)
    wt = wt.detach().requires_grad_(True)
    calls = calls_of("GroupedMmBackward0_fp32_e%d" % e)

    g = torch.randn_like(a)  # a dense output gradient: the fallback refuses sum()'s expanded one (strides 0, 0)

    def build():
        y = a.detach().requires_grad_(True)
        for _ in range(calls):
            y = torch._grouped_mm(y, wt, offs=offs)
        return (y * g).sum()
    return build


def sdpa_chain(q0):
    y = q0.detach().requires_grad_(True)
    for _ in range(N // 8):
        y = F.scaled_dot_product_attention(y, y, y, is_causal=True)
    return y.float().sum()


def host_us(fn, calls):
    """Median host microseconds per call of fn() run `calls` times back to back."""
    out = []
    for _ in range(REPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def profiled(fn, calls):
    """(host microseconds per call, launches per call) of the same loop under the profiler."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        us = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
    n = sum(1 for e in prof.events() if e.name in LAUNCH)
    return us, n / calls


def backward_us(build, calls):
    """Median host microseconds per node of .backward() on a fresh chain of `calls` nodes."""
    out = []
    for _ in range(REPS):
        loss = build()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss.backward()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def backward_profiled(build, calls):
    loss = build()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        loss.backward()
        us = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
    n = sum(1 for e in prof.events() if e.name in LAUNCH)
    return us, n / calls


def main():
    out = open(sys.argv[1], "w")
    out.write(json.dumps(dict(kind="env", torch=torch.__version__, gpu=torch.cuda.get_device_name())) + "\n")
    for name, fn in fwd_ops().items():
        for _ in range(20):
            fn()
        calls = calls_of(name)
        us = host_us(fn, calls)
        pus, launches = profiled(fn, calls)
        out.write(json.dumps(dict(kind="host_op", op=name, phase="fwd", calls=calls, launches=round(launches, 3),
                                  us_per_call=round(us, 2), profiled_us_per_call=round(pus, 2))) + "\n")
        out.flush()
    for name, build in bwd_chains().items():
        calls = calls_of(name)
        build().backward()
        us = backward_us(build, calls)
        pus, launches = backward_profiled(build, calls)
        out.write(json.dumps(dict(kind="host_op", op=name, phase="bwd", calls=calls, launches=round(launches, 3),
                                  us_per_call=round(us, 2), profiled_us_per_call=round(pus, 2))) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
