"""fp32 GEMM kernels of MoE experts' shapes, the kernels' own GPU time (issue 13; docs/STEP_TIME.md "What is left",
the fp32 `_grouped_mm` fallback).

    python3 calibrate/vp-gemm-small.py OUT.jsonl        (one GPU, about a minute)

The fallback runs one at::mm_out per expert on slices of the routed rows (aten/src/ATen/native/GroupedMMUtils.h
_grouped_mm_fallback): many small fp32 GEMMs back to back. The GEMM curve of the GPU profile is event-timed single
calls, whose fixed time (26 us for fp32 on the H200) is mostly launch latency; back to back, a small kernel costs its
own duration. This times, under torch.profiler (CUDA activity), the kernels of torch.mm in fp32 (TF32 off, as the
ground truth) for rows in 16..4096 against the inner and outer sizes of MoE experts, in the three layouts the
forward and backward use (x @ W and x @ W^T with the rows as m; x^T @ g, a weight gradient, with the rows as the
inner size k), REPS calls each; every kernel of a call is summed (cuBLAS's
split-K reduce included). One line a shape: {"kind":"gemm_small","dtype":"fp32","layout":..,"m":..,"n":..,"k":..,
"kernel_us": median over calls, "kernels": kernels a call}.
"""
import json
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

REPS = 20
ROWS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SIZES = ((384, 1024), (768, 1024), (1024, 384), (1024, 768), (2048, 1024), (1024, 2048), (2816, 1024),
         (1024, 1408), (4096, 1024), (1024, 4096), (14336, 4096), (4096, 7168))


def one(layout, m, n, k):
    if layout == "nn":      # x [m, k] @ W [k, n]
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(k, n, device="cuda")
    elif layout == "nt":    # x [m, k] @ W [n, k]^T
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(n, k, device="cuda").t()
    else:                   # tn: x [k, m]^T @ g [k, n] (a weight gradient over k rows)
        a = torch.randn(k, m, device="cuda").t()
        b = torch.randn(k, n, device="cuda")
    for _ in range(3):
        torch.mm(a, b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(REPS):
            torch.mm(a, b)
        torch.cuda.synchronize()
    ev = sorted((e.time_range.start, e.time_range.end) for e in p.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    per = len(ev) // REPS if REPS else 0
    calls = [sum(e - s for s, e in ev[i * per:(i + 1) * per]) for i in range(REPS)] if per else [0.0]
    return dict(kind="gemm_small", dtype="fp32", layout=layout, m=m, n=n, k=k,
                kernel_us=round(statistics.median(calls), 3), kernels=per)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    with open(sys.argv[1], "w") as f:
        f.write(json.dumps(dict(kind="env", torch=torch.__version__, gpu=torch.cuda.get_device_name())) + "\n")
        for layout in ("nn", "nt", "tn"):
            for n, k in SIZES:
                for m in ROWS:
                    # the weight gradient's inner size is the expert's rows
                    line = one(layout, n, k, m) if layout == "tn" else one(layout, m, n, k)
                    f.write(json.dumps(line) + "\n")
            f.flush()
            print(layout, "done", flush=True)


if __name__ == "__main__":
    main()
