"""The fp32 GEMM kernels' own time by shape (calibrate/vp-gemm-small.py's sweep): kernel_us = w / R + t0 for w the
GEMM's FLOPs, R a rate and t0 a fixed time, least squares on log time over every shape and layout; prints R (TFLOP/s,
and as a share of the profile's fp32 GEMM peak, 50.1003 TFLOP/s on the H200), t0 (us), the rms and largest log error,
and each layout's own fit beside it (timing_host.c vp__gemm_queued; docs/STEP_TIME.md "What is left").

    python3 calibrate/fit-gemm-small.py calibrate/profiles/h200-gemm-small.jsonl
"""
import json
import math
import sys

PEAK = 50.1003e12


def fit(pts):
    best = None
    for r10 in range(100, 600, 2):
        R = r10 / 10 * 1e12
        for t0x in range(0, 200):
            t0 = t0x / 10 * 1e-6
            s = mx = 0.0
            for w, t in pts:
                e = math.log((w / R + t0) / t)
                s += e * e
                mx = max(mx, abs(e))
            if best is None or s < best[0]:
                best = (s, R, t0, mx)
    s, R, t0, mx = best
    return R, t0, math.sqrt(s / len(pts)), mx


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if '"gemm_small"' in l]
    groups = {"all": rows}
    for lay in ("nn", "nt", "tn"):
        groups[lay] = [o for o in rows if o["layout"] == lay]
    for name, g in groups.items():
        pts = [(2.0 * o["m"] * o["n"] * o["k"], o["kernel_us"] * 1e-6) for o in g if o["kernel_us"] > 0]
        R, t0, rms, mx = fit(pts)
        print("%-3s n %3d  R %.1f TFLOP/s (share %.4f)  t0 %.1f us  rms %.3f  max %.3f" %
              (name, len(pts), R / 1e12, R / PEAK, t0 * 1e6, rms, mx))


if __name__ == "__main__":
    main()
