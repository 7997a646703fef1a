"""SDPA's fused attention kernels' GPU time by shape, read off the H200 measurement (docs/STEP_TIME.md "Attention").

    python3 calibrate/fit-attn.py calibrate/profiles/h200-sdpa-gpu.jsonl

The measurement is `python3 calibrate/vp-kernels-attn.py sdpa calibrate/profiles/h200-sdpa-gpu.jsonl` (one H200,
torch 2.11.0+cu130): per backend (flash, efficient, cuDNN), shape (b, h, hkv, s, d), causal mask and attention
dropout, the kernels' own GPU time per call under torch.profiler, forward and backward (fwd_gpu_ms, bwd_gpu_ms).

Rule: one call of backend i, pass p (forward, backward), mask c (causal or not) and dropout r (0 or > 0) takes

    t = t0[i][p][c][r] + E * e[i][p][c][r] + W / rate[i][p][c][r][d]

W the call's FLOPs as the model counts them (4 b h s^2 d, halved when causal; x2.5 backward), E = b h s d the
elements of q, d the head dimension: a fixed cost of the call's kernels; a cost per element of q, what grows with
b h s rather than s^2 (the backward's dO.O preprocessing, its fp32 dQ accumulator and conversion, flash's copies of
the gradients, and under a causal mask the diagonal tiles computed whole); and a rate per head dimension (the
kernels' tiles are chosen by d). Fitted per group by least squares on the relative error (t / measured - 1), which is
linear in t0, e and 1 / rate. Prints timing.c's table attn_h200 and each group's residuals; head dimensions a backend
refused (efficient on grouped KV: d 256 was measured only with grouped KV) are 0 in the table (timing.c takes the
nearest measured one).
"""
import json
import sys

DIMS = (64, 80, 96, 128, 256)  # timing.c ATTN_DIMS
IMPLS = ("flash", "efficient", "cudnn")  # timing.h VP_HW_ATTN_MAP order


def flops(r):
    w = 4.0 * r["b"] * r["h"] * r["s"] ** 2 * r["d"]
    return w / 2 if r["causal"] else w


def solve(a, y):
    """Gaussian elimination with partial pivoting of the normal equations a x = y (small, dense)."""
    n = len(y)
    m = [row[:] + [y[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda i: abs(m[i][c]))
        m[c], m[p] = m[p], m[c]
        for i in range(n):
            if i != c and m[c][c]:
                f = m[i][c] / m[c][c]
                m[i] = [u - f * v for u, v in zip(m[i], m[c])]
    return [m[i][n] / m[i][i] if m[i][i] else 0.0 for i in range(n)]


def fit(points):
    """points: (d, W, E, t seconds). Minimise sum ((t0 + E e + W x_d) / t - 1)^2 over t0, e and x_d = 1 / rate_d."""
    dims = sorted({p[0] for p in points})
    n = 2 + len(dims)
    ata = [[0.0] * n for _ in range(n)]
    aty = [0.0] * n
    for d, w, e, t in points:
        row = [0.0] * n
        row[0] = 1.0 / t
        row[1] = e / t
        row[2 + dims.index(d)] = w / t
        for i in range(n):
            aty[i] += row[i]
            for j in range(n):
                ata[i][j] += row[i] * row[j]
    x = solve(ata, aty)
    res = [(x[0] + e * x[1] + w * x[2 + dims.index(d)]) / t - 1 for d, w, e, t in points]
    return x[0], x[1], {d: 1.0 / x[2 + i] for i, d in enumerate(dims) if x[2 + i] > 0}, res


def main(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if r.get("kind") == "sdpa_gpu" and "error" not in r]
    print("/* calibrate/fit-attn.py %s: t0 us, ps per element of q, TFLOP/s at head dim %s */" % (path, DIMS))
    allres = []
    for impl in IMPLS:
        print("[VP_HW_ATTN_%s] = {" % impl.upper())
        for p, key, mult in ((0, "fwd_gpu_ms", 1.0), (1, "bwd_gpu_ms", 2.5)):
            for causal in (False, True):
                for drop in (False, True):
                    pts = [(r["d"], mult * flops(r), r["b"] * r["h"] * r["s"] * r["d"], r[key] * 1e-3) for r in rows
                           if r["impl"] == impl and r["causal"] == causal and (r["dropout"] > 0) == drop]
                    t0, e, rate, res = fit(pts)
                    allres += res
                    ab = sorted(abs(e) for e in res)
                    print("    {%.2f, %.3f, {%s}}, /* %s %s %s: %d points, rms %.3f, max %.3f */" % (
                        t0 * 1e6, e * 1e12, ", ".join("%.1f" % (rate.get(d, 0) / 1e12) for d in DIMS),
                        ("fwd", "bwd")[p], "causal" if causal else "full", "dropout" if drop else "no-drop",
                        len(pts), (sum(e * e for e in res) / len(res)) ** 0.5, ab[-1]))
        print("},")
    ab = sorted(abs(e) for e in allres)
    print("/* all %d: median |res| %.3f, max %.3f */" % (len(ab), ab[len(ab) // 2], ab[-1]))


if __name__ == "__main__":
    main(sys.argv[1])
