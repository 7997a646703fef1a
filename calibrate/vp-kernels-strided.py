"""Memory-bound kernels by input layout (docs/STEP_TIME.md "GEMM kernels' own rate", what is left): the data for a
rule on the elementwise kernels that run on non-contiguous or broadcast inputs.

    python3 calibrate/vp-kernels-strided.py OUT.jsonl        (one H200, torch 2.11.0+cu130; about 2 minutes)

The step profiles (calibrate/profiles/h200-host-trace.jsonl, kernels by name) show ATen's non-vectorized
TensorIterator path (`elementwise_kernel<128, 4, gpu_kernel_impl_nocast<...>>`, `CatArrayBatchedCopy`) taking a
large share of the Llama-type steps' memory-bound time (phi3-mini-16l bf16 b4 checkpointed: silu 193 us a call,
the gate-up product 89 us, where the vectorized kernel would move the same bytes in about 30): the fused gate_up
projection's chunks, RoPE's q * cos against a broadcast cos and its rotate_half cat, the attention output's
transpose(1, 2).contiguous(). The model times every memory-bound kernel at its class's contiguous bandwidth. This
measures, for bf16 and fp32 and three sizes, each op on a contiguous input and on the layouts the models make:

  contig     x [N, D] contiguous
  chunk      x = y[:, :D] of y [N, 2D] (torch.chunk of a fused projection: row stride 2D)
  bcast      q [B, H, S, d] against c [B, 1, S, d] (RoPE's cos / sin)
  transpose  x [B, S, H, d].transpose(1, 2) (the attention output before .contiguous())

ops: mul and add (binary, second operand alike), silu, neg, copy (.contiguous() / clone), cat (rotate_half:
torch.cat((-x2, x1), -1) of x's halves). Each call runs twice to warm up, then five times under torch.profiler; the
kernels' own GPU microseconds per call (median). One JSON object a line:
  {"kind": "strided", "op", "layout", "dtype", "elements", "bytes_out", "kernels": [[name, us], ...], "us"}
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

DT = {"bf16": torch.bfloat16, "fp32": torch.float32}
SIZES = ((8, 16, 1024, 128), (4, 32, 2048, 128), (8, 32, 2048, 128))  # B, H, S, d: 16 M, 32 M, 64 M elements


def tensors(layout, shape, dt):
    b, h, s, d = shape
    n, D = b * s, h * d
    r = lambda *z: torch.randn(*z, device="cuda", dtype=dt)
    if layout == "contig":
        return r(n, D), r(n, D)
    if layout == "chunk":
        return r(n, 2 * D)[:, :D], r(n, 2 * D)[:, D:]
    if layout == "bcast":
        return r(b, h, s, d), r(b, 1, s, d)
    return r(b, s, h, d).transpose(1, 2), r(b, s, h, d).transpose(1, 2)


def op_fn(op, x, y):
    if op == "mul":
        return lambda: x * y
    if op == "add":
        return lambda: x + y
    if op == "silu":
        return lambda: F.silu(x)
    if op == "neg":
        return lambda: -x
    if op == "copy":
        return lambda: x.contiguous() if not x.is_contiguous() else x.clone()
    h = x.shape[-1] // 2
    return lambda: torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def timed(fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    ks = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            ks.setdefault(e.name[:160], []).append(e.time_range.elapsed_us())
    per = [[k, round(sum(v) / 5, 2)] for k, v in ks.items()]
    return per, round(sum(u for _, u in per), 2), ks


def main():
    out = open(sys.argv[1], "w")
    out.write(json.dumps({"env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}}) + "\n")
    for dn, dt in DT.items():
        for shape in SIZES:
            for layout in ("contig", "chunk", "bcast", "transpose"):
                for op in ("mul", "add", "silu", "neg", "copy", "cat"):
                    if layout == "bcast" and op not in ("mul", "add"):
                        continue
                    x, y = tensors(layout, shape, dt)
                    per, us, _ = timed(op_fn(op, x, y))
                    n = x.numel() if layout != "bcast" else x.numel()
                    rec = dict(kind="strided", op=op, layout=layout, dtype=dn, shape=list(shape), elements=n,
                               bytes_out=n * x.element_size(), kernels=per, us=us)
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                    del x, y
            torch.cuda.empty_cache()
    out.close()


if __name__ == "__main__":
    main()
