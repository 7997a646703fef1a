"""The GEMM kernels' own GPU time by shape, read off the H200's per-GEMM profile (docs/STEP_TIME.md "GEMM
kernels' own rate").

    python3 calibrate/fit-gemm.py calibrate/profiles/h200-gemm-launches.jsonl [gpus/h200.yaml]

The measurement is `python3 calibrate/vp-gemm-launches.py OUT.jsonl` (one H200, torch 2.11.0+cu130): for fp32 (TF32
off), bf16 and fp16, every m x n x k of its grid and the three forms of a linear layer (fwd F.linear(x[m,k], w[n,k]),
dgrad g[m,n] @ w[n,k], wgrad g[m,n]^T @ x[m,k]), the cuBLAS kernels of one call under torch.profiler, each with its
own GPU microseconds.

Rule fitted: one GEMM kernel of output M x N and inner dimension K (the model's operands: fwd (m, n, k), dgrad
(m, k, n), wgrad (n, k, m)) takes

    t = 2 M N K / peak * (K + kh) / K

the form of timing_host.c vp__gemm_work (the step model adds the gap between kernels apart). Only calls of one
kernel (split-K calls run a second, reduce kernel, timed apart by the model) and of at least W_MIN FLOPs (below, the
kernel's start and tail, not its rate, decide) are used. Least squares on the relative error (peak in closed form
for each kh on a grid), points more than four times the median |residual| off (single timed calls: a few are
disturbed) dropped and the fit repeated. Prints, per dtype, the fit, its residuals, the measured rate and the
ratio of the measured time to the profile's curve (its gemm peak_tflops and k_half: gpus/h200.yaml, the sweep's
fit) per inner dimension.
"""
import json
import math
import re
import statistics
import sys

W_MIN = 3e10


def points(rows, dt):
    out = []
    for r in rows:
        if r.get("kind") != "gemm_launches" or r["dtype"] != dt:
            continue
        ks = [x for x in r["kernels"] if "Memset" not in x[1]]
        if len(ks) != 1 or ks[0][2] <= 0:
            continue
        m, n, k = r["m"], r["n"], r["k"]
        a = {"fwd": (m, n, k), "dgrad": (m, k, n), "wgrad": (n, k, m)}.get(r["form"])
        if a is None or 2.0 * m * n * k < W_MIN:
            continue
        out.append((a, 2.0 * m * n * k, ks[0][2] * 1e-6))
    return out


def resid(pts, peak, kh):
    return [w / peak * (a[2] + kh) / a[2] / t - 1 for a, w, t in pts]


def fit(pts):
    best = None
    for kh in range(0, 600):
        x = [w * (a[2] + kh) / a[2] / t for a, w, t in pts]
        peak = sum(v * v for v in x) / sum(x)
        s = sum(e * e for e in resid(pts, peak, kh))
        if best is None or s < best[0]:
            best = (s, peak, kh)
    return best[1], best[2]


def trimmed(pts):
    while True:
        peak, kh = fit(pts)
        r = resid(pts, peak, kh)
        med = statistics.median(abs(e) for e in r)
        keep = [p for p, e in zip(pts, r) if abs(e) <= max(4 * med, 0.1)]
        if len(keep) == len(pts):
            return pts, peak, kh
        pts = keep


def profile_curves(path):
    """gpus/h200.yaml measured.gemm: dtype -> (peak FLOP/s, k_half)."""
    out = {}
    for line in open(path):
        m = re.match(r"\s+(fp32|bf16|fp16): \{peak_tflops: ([0-9.]+),.*k_half: ([0-9.]+)", line)
        if m:
            out[m.group(1)] = (float(m.group(2)) * 1e12, float(m.group(3)))
    return out


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    curves = profile_curves(sys.argv[2] if len(sys.argv) > 2 else "gpus/h200.yaml")
    for dt in ("bf16", "fp16", "fp32"):
        pts0 = points(rows, dt)
        pts, peak, kh = trimmed(pts0)
        r = sorted(abs(e) for e in resid(pts, peak, kh))
        print("%s: peak %.1f TFLOP/s, kh %d; %d of %d calls (W >= %.0e), rms %.3f, median |r| %.3f, max %.3f" % (
            dt, peak / 1e12, kh, len(pts), len(pts0), W_MIN, math.sqrt(sum(e * e for e in r) / len(r)),
            r[len(r) // 2], r[-1]))
        cp, ckh = curves.get(dt, (0, 0))
        for k in sorted(set(a[2] for a, _, _ in pts)):
            s = [(w, t, a) for a, w, t in pts if a[2] == k]
            rate = statistics.median(w / t for w, t, _ in s) / 1e12
            ratio = statistics.median(t / (w / cp * (a[2] + ckh) / a[2]) for w, t, a in s) if cp else 0
            print("  K %5d: %3d calls, measured %6.1f TFLOP/s, fit %6.1f, measured / profile curve %.3f" % (
                k, len(s), rate, peak / 1e12 * k / (k + kh), ratio))


if __name__ == "__main__":
    main()
