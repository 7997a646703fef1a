"""How many kernels cuBLAS launches for one GEMM, by shape, dtype and form (docs/STEP_TIME.md "Launches"): the
data for the split-K rule (a GEMM whose output tiles cannot fill the GPU is split along k, a second kernel
reducing the partial sums), which the per-op launch counts (calibrate/profiles/h200-launch-ops.jsonl) show on
small fp32 GEMMs (the MoE experts' per-expert fallback, DeepSeek's attention projections).

    python3 calibrate/vp-gemm-launches.py OUT.jsonl      (one H200)

For fp32 (TF32 off, PyTorch's default for matmul), bf16 and fp16, every m x n x k of the grid below, the three
forms of a linear layer: "fwd" F.linear(x[m,k], w[n,k]), "dgrad" g[m,n] @ w[n,k], "wgrad" g[m,n]^T @ x[m,k]
(inner dimension m). Each call runs once to warm up, then once under torch.profiler (CPU + CUDA); the kernels
of the call's aten op are listed. One JSON object a line:
  {"kind": "gemm_launches", "dtype", "form", "m", "n", "k", "kernels": [[aten op, kernel name, us], ...]}
"""
import bisect, json, sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

MS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
NS = (128, 256, 512, 1024, 2048, 4096, 8192)
KS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def call(form, m, n, k, dt):
    if form == "fwd":
        x, w = torch.randn(m, k, device="cuda", dtype=dt), torch.randn(n, k, device="cuda", dtype=dt)
        return lambda: F.linear(x, w)
    if form == "dgrad":
        g, w = torch.randn(m, n, device="cuda", dtype=dt), torch.randn(n, k, device="cuda", dtype=dt)
        return lambda: g.mm(w)
    g, x = torch.randn(m, n, device="cuda", dtype=dt), torch.randn(m, k, device="cuda", dtype=dt)
    return lambda: g.t().mm(x)


def main():
    out = open(sys.argv[1], "w")
    out.write(json.dumps({"env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                                  "allow_tf32": torch.backends.cuda.matmul.allow_tf32}}) + "\n")
    for dname, dt in DT.items():
        for form in ("fwd", "dgrad", "wgrad"):
            fns = []
            for m in MS:
                for n in NS:
                    for k in KS:
                        f = call(form, m, n, k, dt)
                        f()
                        fns.append(((m, n, k), f))
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for (m, n, k), f in fns:
                    with record_function("g|%d|%d|%d" % (m, n, k)):
                        f()
                torch.cuda.synchronize()
            ev = prof.events()
            labels = sorted((e.time_range.start, e.time_range.end, e.name) for e in ev if e.name.startswith("g|"))
            per = {lab: [] for _, _, lab in labels}
            starts = [a for a, _, _ in labels]
            for e in ev:
                if e.name.startswith("aten::") and e.kernels:
                    i = bisect.bisect_right(starts, e.time_range.start) - 1
                    if i >= 0 and labels[i][1] >= e.time_range.end:
                        for kk in e.kernels:
                            per[labels[i][2]].append([e.name, kk.name[:90], round(kk.duration, 2)])
            for lab, ks in per.items():
                _, m, n, k = lab.split("|")
                out.write(json.dumps(dict(kind="gemm_launches", dtype=dname, form=form, m=int(m), n=int(n),
                                          k=int(k), kernels=ks)) + "\n")
            out.flush()
            del fns
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
