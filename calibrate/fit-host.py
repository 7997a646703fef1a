"""Fit the host (Python) cost model of an eager training step (docs/STEP_TIME.md "The host").

    python3 calibrate/fit-host.py calibrate/profiles/h200-host.jsonl calibrate/profiles/h200-host-counts.jsonl

The first file is vp-host.py's output (host seconds of each phase, measured without synchronizing); the second
gives, for the same cases, the counts vramplan's step model issues (vp_step_time's host_kernels - host_casts,
host_casts, host_bwd_kernels, host_bwd_calls as bwd_call_units, host_tensors of one micro-batch; calls: the
forward's non-view ops). Each phase's cost is a weighted least-squares fit (relative error) of the measured host time
on the counts:

    forward   = (kernels + casts) x per_kernel                    (every kernel issued from Python)
    backward  = (backward kernels + call units) x per_bwd_kernel  (autograd engine: one node per kernel; a GEMM's
                                                                   backward node beyond its launches,
                                                                   docs/STEP_TIME.md "The host per op")
    optimizer = fixed + tensors x per_tensor                  (foreach AdamW + zero_grad, fp32 and bf16 state)
    and for each other optimizer its per_tensor = (host time - fixed) / tensors of its case (one each)

Cases left out of a phase, and why: checkpointed cases (their host times follow the GPU's; not through the CUDA
RNG state torch.utils.checkpoint saves per segment, which CUDAGeneratorImpl::get_state reads from host-side
values without waiting: the wait is unexplained, calibrate/vp-host-trace.py shows where it is); the optimizer of amp fp16 (GradScaler reads
found_inf with .item(), a synchronize) and of the other optimizers (one case each; their per-tensor cost is read off
that case with the fixed cost fitted on foreach). Prints the constants in microseconds and each phase's median and max relative error, and, as a check
of the forward's form, the fit with a cost per call and per cast apart (both come out as a kernel's or less:
neither the module call nor the model's code, plain nn.Module or Hugging Face, adds a cost of its own).

    python3 calibrate/fit-host.py ckpt calibrate/profiles/h200-host-trace.jsonl calibrate/profiles/h200-host-trace-counts.jsonl

reads checkpoint's hook costs off vp-host-trace.py's host phases (docs/STEP_TIME.md "Checkpointed steps on the host"):
the counts file gives, per case, the launches vramplan's model issues in one micro-batch (vp_step_time's host_kernels,
host_bwd_kernels: allocations plus the op families' launch rules, src/ops/) and, for a checkpointed case, its recomputed
forward's launches. For each pair (checkpointed / plain, same model on the same host) the plain case gives that host's
cost per launch, forward f and backward b; pack = the checkpointed forward's host time / its launches - f; recompute =
(its backward host time - non-recomputed launches x b - recomputed x f) / recomputed; both scaled by VP_HOST_FWD_KERNEL / f to
the host of VP_HOST_FWD_KERNEL. The constants are the medians. The backward's launches count with its GEMM nodes'
units (bwd_call_units), which carry no hook: b = backward host / (launches + units).

    python3 calibrate/fit-host.py ops calibrate/profiles/h200-launch-ops.jsonl [calibrate/profiles/h200-host-ops.jsonl]

reads the call units off vp-launch-ops.py's host microseconds per outermost op (docs/STEP_TIME.md "The host per op";
src/timing_host.h VP__HOST_GEMM_NODE): in each case that is not checkpointed (there the host
waits on the GPU) and phase, one launch's cost is the mean host us of the single-launch elementwise ops (forward:
aten mul, add, pow, mean, rsqrt, neg, silu, cat, sub, div, tanh, gelu called once a launch; backward: the nodes
NegBackward0, SiluBackward0, MeanBackward1, LogSoftmaxBackward0, GeluBackward0, TanhBackward0, SubBackward0,
MulBackward1); an op's units are (its host us - its launches x that cost) / that cost per call. Printed per op class,
the median and quartiles over the cases: the forward linear (aten::linear), the backward GEMM node (MmBackward0), and
cuDNN SDPA's forward and backward (the cases whose backward runs ScaledDotProductCudnnAttentionBackward0). Ratios
within the one session: the host's absolute speed drops out. With vp-host-ops.py's file, each class again with the
profiler's own cost per call (profiled - unprofiled us of the class on small tensors) taken off the op and off the
single-launch op ("(true)"): mul and add's mean forward, MulBackward1 backward; the 3-D linear (under autocast the
autocast linear's less a float()); MmBackward0 of one launch, of more the weight gradient's; SDPA causal; cuDNN's
backward. The model takes the backward GEMM node's corrected median only (the others' host phases or step times get
worse, docs/STEP_TIME.md "The host per op").
"""
import json
import sys


def gauss(M):
    """The solution of the augmented system M (n rows of n coefficients and the right-hand side), by Gauss-Jordan
    elimination with partial pivoting."""
    n = len(M)
    M = [list(r) for r in M]
    for i in range(n):
        p = max(range(i, n), key=lambda k: abs(M[k][i]))
        M[i], M[p] = M[p], M[i]
        for k in range(n):
            if k != i:
                f = M[k][i] / M[i][i]
                M[k] = [a - f * b for a, b in zip(M[k], M[i])]
    return [M[i][n] / M[i][i] for i in range(n)]


def solve(X, y):
    """Least squares of X b = y weighted by 1/y (relative error), by the normal equations."""
    n = len(X[0])
    A = [[sum(r[i] * r[j] / v ** 2 for r, v in zip(X, y)) for j in range(n)] for i in range(n)]
    c = [sum(r[i] / v for r, v in zip(X, y)) for i in range(n)]
    return gauss([a + [b] for a, b in zip(A, c)])


def report(name, X, y, b, labels):
    err = sorted(abs(sum(u * v for u, v in zip(r, b)) / t - 1) for r, t in zip(X, y))
    terms = ", ".join("%s %.2f us" % (l, v * 1e6) for l, v in zip(labels, b))
    print("%-9s %s  (%d cases: median %.1f %%, max %.1f %%)" % (name, terms, len(y), 100 * err[len(err) // 2],
                                                               100 * err[-1]))


CKPT_PAIRS = (("qwen3-0.6b-bf16-b8-ckpt", "qwen3-0.6b-amp-bf16-b4"), ("gemma2-2b-bf16-b4-ckpt", "gemma2-2b-amp-bf16-b2"),
              ("mt5-small-bf16-b32-ckpt", "mt5-small-amp-bf16-b16"))


HOST_FWD_KERNEL = 30.97e-6  # include/vramplan/timing.h VP_HOST_FWD_KERNEL (this file's forward fit)


def ckpt(trace, counts):
    h = {d["case"]: d for d in map(json.loads, filter(str.strip, open(trace)))}
    n = {d["case"]: d for d in map(json.loads, filter(str.strip, open(counts)))}
    pack, rec = [], []
    for c, p in CKPT_PAIRS:
        f = h[p]["fwd_ms"] * 1e-3 / n[p]["kernels"]
        b = h[p]["bwd_ms"] * 1e-3 / (n[p]["bwd_kernels"] + n[p]["bwd_call_units"])
        r = n[c]["recomputed"]
        s = HOST_FWD_KERNEL / f
        sv = n[c]["saved"]
        pack.append((h[c]["fwd_ms"] * 1e-3 - n[c]["kernels"] * f) / sv * s)
        rest = (n[c]["bwd_kernels"] - r + n[c]["bwd_call_units"]) * b + r * f
        rec.append((h[c]["bwd_ms"] * 1e-3 - rest) / sv * s)
        print("%-26s f %.2f us, b %.2f us: pack %.2f us, recompute %.2f us" % (c, f * 1e6, b * 1e6, pack[-1] * 1e6,
                                                                               rec[-1] * 1e6))
    med = lambda v: sorted(v)[len(v) // 2]
    print("median: pack %.2f us, recompute %.2f us" % (med(pack) * 1e6, med(rec) * 1e6))


BWD = "autograd::engine::evaluate_function: "
ONE_FWD = ("aten::mul", "aten::add", "aten::pow", "aten::mean", "aten::rsqrt", "aten::neg", "aten::silu", "aten::cat",
           "aten::sub", "aten::div", "aten::tanh", "aten::gelu")
ONE_BWD = tuple(BWD + x for x in ("NegBackward0", "SiluBackward0", "MeanBackward1", "LogSoftmaxBackward0",
                                  "GeluBackward0", "TanhBackward0", "SubBackward0", "MulBackward1"))


def one_launch(ph, names):
    """Mean host us of the ops among names that launch exactly once a call, in one case's phase."""
    o = ph["outer_ops"]
    n = [k for k in names if k in o and ph["by_outer"].get(k, 0) == o[k][0]]
    return sum(o[k][1] for k in n) / sum(o[k][0] for k in n)


def units(ph, op, one):
    """An op's host cost beyond its launches per call, in launches; None where the case has none."""
    if op not in ph["outer_ops"]:
        return None
    calls, us = ph["outer_ops"][op]
    return (us - ph["by_outer"].get(op, 0) * one) / calls / one


def inflation(path):
    """The profiler's own cost per call of each op class (vp-host-ops.py: profiled - unprofiled us, one host)."""
    d = {r["op"]: r for r in map(json.loads, filter(str.strip, open(path))) if r.get("kind") == "host_op"}
    infl = {k: r["profiled_us_per_call"] - r["us_per_call"] for k, r in d.items()}
    return {"one fwd": (infl["mul"] + infl["add"]) / 2, "one bwd": infl["MulBackward1"],
            "linear": infl["linear_3d"], "linear autocast": infl["linear_3d_autocast"] - (infl["mul"] + infl["add"]) / 2,
            "node 1": infl["MmBackward0"], "node 2": infl["MmBackward0_weight"],
            "sdpa fwd": infl["sdpa_causal"], "sdpa bwd": infl["ScaledDotProductCudnnAttentionBackward0"]}


def units_true(ph, op, one, infl_one, infl_op):
    """units() with the profiler's inflation taken off the op and off the single-launch op."""
    if op not in ph["outer_ops"]:
        return None
    calls, us = ph["outer_ops"][op]
    t = one - infl_one
    return (us / calls - infl_op - ph["by_outer"].get(op, 0) / calls * t) / t


def ops(path, hostops=None):
    got = {}
    for d in map(json.loads, filter(str.strip, open(path))):
        if "phases" not in d or "ckpt" in d["case"]:
            continue
        f, b = d["phases"]["fwd"], d["phases"]["bwd"]
        of, ob = one_launch(f, ONE_FWD), one_launch(b, ONE_BWD)
        cudnn = BWD + "ScaledDotProductCudnnAttentionBackward0" in b["outer_ops"]
        for name, v in (("linear forward", units(f, "aten::linear", of)),
                        ("GEMM backward node", units(b, BWD + "MmBackward0", ob)),
                        ("cuDNN SDPA forward", units(f, "aten::scaled_dot_product_attention", of) if cudnn else None),
                        ("cuDNN SDPA backward", units(b, BWD + "ScaledDotProductCudnnAttentionBackward0", ob)
                         if cudnn else None)):
            if v is not None:
                got.setdefault(name, []).append(v)
        if hostops is None:
            continue
        i = inflation(hostops)
        amp = "-amp" in d["case"]  # autocast: the linear's casts are inside its call
        nb = b["outer_ops"].get(BWD + "MmBackward0")
        node = i["node 2"] if nb and b["by_outer"].get(BWD + "MmBackward0", 0) / nb[0] > 1.5 else i["node 1"]
        for name, v in (("linear forward (true)", units_true(f, "aten::linear", of, i["one fwd"],
                                                             i["linear autocast" if amp else "linear"])),
                        ("GEMM backward node (true)", units_true(b, BWD + "MmBackward0", ob, i["one bwd"], node)),
                        ("cuDNN SDPA forward (true)", units_true(f, "aten::scaled_dot_product_attention", of,
                                                                 i["one fwd"], i["sdpa fwd"]) if cudnn else None),
                        ("cuDNN SDPA backward (true)", units_true(b, BWD + "ScaledDotProductCudnnAttentionBackward0",
                                                                  ob, i["one bwd"], i["sdpa bwd"]) if cudnn else None)):
            if v is not None:
                got.setdefault(name, []).append(v)
    for name, v in got.items():
        v.sort()
        print("%-20s %2d cases: median %.2f launches (quartiles %.2f, %.2f; %.2f to %.2f)" % (
            name, len(v), v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2,
            v[len(v) // 4], v[3 * len(v) // 4], v[0], v[-1]))


def main():
    if sys.argv[1] == "ckpt":
        ckpt(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1] == "ops":
        ops(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
        return
    host = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    cnt = {d["case"]: d for d in map(json.loads, filter(str.strip, open(sys.argv[2])))}
    rows = [(h, cnt[h["case"]]) for h in host if "error" not in h and h["case"] in cnt]
    free = [(h, c) for h, c in rows if "ckpt" not in h["case"]]
    y = [h["fwd_ms"] * 1e-3 for h, c in free]
    X = [[c["kernels"] + c["casts"]] for h, c in free]
    report("forward", X, y, solve(X, y), ["per kernel"])
    X = [[c["calls"], c["kernels"], c["casts"]] for h, c in free]
    report("(check)", X, y, solve(X, y), ["per call", "per kernel", "per cast"])
    X = [[c["bwd_kernels"] + c["bwd_call_units"]] for h, c in free]
    y = [h["bwd_ms"] * 1e-3 for h, c in free]
    report("backward", X, y, solve(X, y), ["per kernel"])
    foreach = [(h, c) for h, c in free if "fp16" not in h["case"] and
               not any(o in h["case"] for o in ("-sgd", "-adamw-fused", "-adamw-forloop"))]
    X = [[1, c["tensors"]] for h, c in foreach]
    y = [h["opt_ms"] * 1e-3 for h, c in foreach]
    b = solve(X, y)
    report("optimizer", X, y, b, ["fixed", "per tensor"])
    for h, c in free:
        for o in ("-sgd", "-adamw-fused", "-adamw-forloop"):
            if o in h["case"] and "fp16" not in h["case"]:
                print("%-9s %s: per tensor %.2f us (%s)" % ("", o[1:], (h["opt_ms"] * 1e-3 - b[0]) / c["tensors"] * 1e6,
                                                             h["case"]))


if __name__ == "__main__":
    main()
