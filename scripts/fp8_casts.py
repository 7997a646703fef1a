"""fp8 current scaling's kernels on one GPU, for the cluster model's fp8 step time (docs/CLUSTER.md "fp8 step time").

    python3 scripts/fp8_casts.py OUT.jsonl

The model charges each linear input (forward) and output gradient (backward) 2 + 2 + 1 + 1 bytes an element in two
kernels at the profile's copy curve: an amax read, then a read that writes the fp8 data and its transpose (Transformer
Engine's Float8CurrentScaling cast_transpose; torchao's hp_tensor_to_float8_dynamic). This script times, for bf16
tensors of the linears' shapes (tokens x hidden), the same work in PyTorch: eager (amax; scale-cast; transpose-cast as
separate kernels) and under torch.compile (what torchtitan's float8 runs), and a plain copy of the same bytes for the
copy curve. Every time is the median of CUDA-event-timed repetitions after warm-up, on random data. One JSON object a
line:
  {"kind":"env",...}
  {"kind":"fp8cast","mode":"eager"|"compile"|"compile_cast"|"compile_tcast"|"copy","rows":R,"cols":C,"bytes_model":6RC,
   "ms":..,"gbps_model":..}
compile_cast (amax, row-major cast: torchao's forward casts) and compile_tcast (amax, transposed cast: its backward's
re-casts of input and weight) split the compiled cost between the passes; bytes_model 5RC for them, 4RC for copy.
Compare gbps_model with the profile's copy curve at bytes_model / 2 (the two kernels): the rule holds where they agree.
"""
import json
import sys

import torch

DEV = "cuda"


def bench(fn, target_ms=60.0):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); fn(); e.record(); torch.cuda.synchronize()
    one = max(s.elapsed_time(e), 1e-3)
    n = int(min(50, max(5, target_ms / one)))
    ts = []
    for _ in range(n):
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


F8 = torch.float8_e4m3fn
F8_MAX = torch.finfo(F8).max


def cast_transpose(x):
    amax = x.abs().amax().float()
    scale = F8_MAX / torch.clamp(amax, min=1e-12)
    y = (x.float() * scale).clamp(-F8_MAX, F8_MAX).to(F8)
    yt = (x.t().float() * scale).clamp(-F8_MAX, F8_MAX).to(F8).contiguous()
    return y, yt, scale


def cast_only(x):
    amax = x.abs().amax().float()
    scale = F8_MAX / torch.clamp(amax, min=1e-12)
    return (x.float() * scale).clamp(-F8_MAX, F8_MAX).to(F8), scale


def tcast_only(x):
    amax = x.abs().amax().float()
    scale = F8_MAX / torch.clamp(amax, min=1e-12)
    return (x.t().float() * scale).clamp(-F8_MAX, F8_MAX).to(F8).contiguous(), scale


def main():
    out = open(sys.argv[1], "w")
    emit = lambda d: (out.write(json.dumps(d) + "\n"), out.flush())
    emit({"kind": "env", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)})
    compiled = torch.compile(cast_transpose)
    compiled_cast, compiled_tcast = torch.compile(cast_only), torch.compile(tcast_only)
    # linear inputs and output gradients of Llama 3 8B / 70B / 405B layers at tp 1-8, 4096-16384 tokens
    for rows in (4096, 8192, 16384):
        for cols in (512, 1024, 2048, 4096, 6656, 8192, 14336, 16384, 28672, 53248):
            if rows * cols * 2 > 4 << 30:
                continue
            x = torch.randn(rows, cols, device=DEV, dtype=torch.bfloat16)
            for mode, fn in (("eager", lambda: cast_transpose(x)), ("compile", lambda: compiled(x)),
                             ("compile_cast", lambda: compiled_cast(x)), ("compile_tcast", lambda: compiled_tcast(x)),
                             ("copy", lambda: x.clone())):
                ms = bench(fn)
                bm = {"copy": 4.0, "compile_cast": 5.0, "compile_tcast": 5.0}.get(mode, 6.0) * rows * cols
                emit({"kind": "fp8cast", "mode": mode, "rows": rows, "cols": cols, "bytes_model": bm, "ms": ms,
                      "gbps_model": bm / ms / 1e6})
            del x
    out.close()


if __name__ == "__main__":
    main()
