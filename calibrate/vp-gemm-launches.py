"""How many kernels cuBLAS launches for one GEMM, by shape, dtype and form (docs/STEP_TIME.md "Launches"): the
data for the split-K rule (a GEMM whose output tiles cannot fill the GPU is split along k, a second kernel
reducing the partial sums), which the per-op launch counts (calibrate/profiles/h200-launch-ops.jsonl) show on
small fp32 GEMMs (the MoE experts' per-expert fallback, DeepSeek's attention projections).

    python3 calibrate/vp-gemm-launches.py OUT.jsonl [--forms F,F...]     (one H200)

For fp32 (TF32 off, PyTorch's default for matmul), bf16 and fp16, every m x n x k of the grid below, the three
forms of a linear layer: "fwd" F.linear(x[m,k], w[n,k]), "dgrad" g[m,n] @ w[n,k], "wgrad" g[m,n]^T @ x[m,k]
(inner dimension m). Each call runs once to warm up, then once under torch.profiler (CPU + CUDA); the kernels
of the call's aten op are listed. One JSON object a line:
  {"kind": "gemm_launches", "dtype", "form", "m", "n", "k", "kernels": [[aten op, kernel name, us], ...]}

--forms picks the forms (default fwd,dgrad,wgrad); two more for the split-K rule's open questions
(docs/STEP_TIME.md "cuBLAS split-K"): "bias", F.linear(x[m,k], w[n,k], b[n]) (aten::addmm with the bias, as in
mlp10; GPT-2's Conv1D is an addmm too), and "bmm", torch.bmm(a[B,m,k], b[B,k,n]) for B in BS (eager attention),
its lines with "b": B. Kernel names are kept to 200 characters (the first run's 90 cut the sm80 xmma kernels'
execute_kernel / execute_split_k suffix).
"""
import bisect, json, sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

MS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
NS = (128, 256, 512, 1024, 2048, 4096, 8192)
KS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BS = (8, 32)
BMN = (128, 256, 512, 1024, 2048)
BK = (64, 128, 256, 512, 1024, 2048)


def call(form, m, n, k, dt, b=1):
    if form == "bias":
        x, w = torch.randn(m, k, device="cuda", dtype=dt), torch.randn(n, k, device="cuda", dtype=dt)
        bias = torch.randn(n, device="cuda", dtype=dt)
        return lambda: F.linear(x, w, bias)
    if form == "bmm":
        x, y = torch.randn(b, m, k, device="cuda", dtype=dt), torch.randn(b, k, n, device="cuda", dtype=dt)
        return lambda: torch.bmm(x, y)
    if form == "fwd":
        x, w = torch.randn(m, k, device="cuda", dtype=dt), torch.randn(n, k, device="cuda", dtype=dt)
        return lambda: F.linear(x, w)
    if form == "dgrad":
        g, w = torch.randn(m, n, device="cuda", dtype=dt), torch.randn(n, k, device="cuda", dtype=dt)
        return lambda: g.mm(w)
    g, x = torch.randn(m, n, device="cuda", dtype=dt), torch.randn(m, k, device="cuda", dtype=dt)
    return lambda: g.t().mm(x)


def shapes(form):
    if form == "bmm":
        return [(b, m, n, k) for b in BS for m in BMN for n in BMN for k in BK]
    return [(1, m, n, k) for m in MS for n in NS for k in KS]


def main():
    forms = ("fwd", "dgrad", "wgrad")
    if len(sys.argv) > 3 and sys.argv[2] == "--forms":
        forms = tuple(sys.argv[3].split(","))
    bad = [f for f in forms if f not in ("fwd", "dgrad", "wgrad", "bias", "bmm")]
    if bad or len(sys.argv) not in (2, 4):
        sys.exit("usage: vp-gemm-launches.py OUT.jsonl [--forms fwd,dgrad,wgrad,bias,bmm]")
    out = open(sys.argv[1], "w")
    out.write(json.dumps({"env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                                  "allow_tf32": torch.backends.cuda.matmul.allow_tf32}}) + "\n")
    for dname, dt in DT.items():
        for form in forms:
            fns = []
            for b, m, n, k in shapes(form):
                f = call(form, m, n, k, dt, b)
                f()
                fns.append(((b, m, n, k), f))
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for (b, m, n, k), f in fns:
                    with record_function("g|%d|%d|%d|%d" % (b, m, n, k)):
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
                            per[labels[i][2]].append([e.name, kk.name[:200], round(kk.duration, 2)])
            for lab, ks in per.items():
                _, b, m, n, k = lab.split("|")
                rec = dict(kind="gemm_launches", dtype=dname, form=form, m=int(m), n=int(n), k=int(k), kernels=ks)
                if form == "bmm":
                    rec["b"] = int(b)
                out.write(json.dumps(rec) + "\n")
            out.flush()
            del fns
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
