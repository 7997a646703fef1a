"""BatchNorm2d's training kernels by shape: the constants of src/timing.c bn_shape (docs/STEP_TIME.md "Batch norm by
shape") from calibrate/vp-bn-shapes.py's sweep.

    python3 calibrate/fit-bn.py calibrate/profiles/h200-bn-shapes.jsonl

For each kernel path (native: ATen's NCHW kernels, a bf16 input or a half input with half parameters; cudnn32: fp32;
cudnn16: a half input with fp32 parameters, autocast fp16) and phase, the time of a call with E elements in C
channels of HW pixels is E x max(a / C, f x (1 + (h0 / HW)^q)): a, the picoseconds of one channel's element when
each channel's block runs alone (few channels: one thread block per channel), f, the picoseconds per element when the
channels fill the GPU, and the short rows' penalty (a block reads each image's HW pixels of its channel as one row:
ATen's statistics kernel at 7 x 7 takes three times its bytes' time). Least squares on log time over the calls of at
least MIN_ELEMS elements (the layers that weigh in a step): a and f first, by a grid search (10 ps steps for a, 0.1 ps
for f) over the calls of at least 784 pixels, then h0 and q over all of them. Prints the constants, the rms and
largest log error.
"""
import json
import math
import sys

MIN_ELEMS = 8e6
PATHS = {"native": ("bf16", "amp"), "cudnn32": ("fp32",), "cudnn16": ("fp16",)}


def err(pts, a, f, h0=0.0, q=1.0):
    e = [math.log(E * max(a / C, f * (1 + (h0 / hw) ** q)) / t) for C, E, hw, t in pts]
    return sum(x * x for x in e), max(abs(x) for x in e)


def fit(pts):
    best = None
    wide = [p for p in pts if p[2] >= 784]
    for a in range(200, 3000, 10):
        for f10 in range(15, 90):
            s, mx = err(wide, a, f10 / 10)
            if best is None or s < best[0]:
                best = (s, a, f10 / 10)
    _, a, f = best
    best = None
    for h0 in range(0, 201, 4):
        for q in (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0):
            s, mx = err(pts, a, f, h0, q)
            if best is None or s < best[0]:
                best = (s, a, f, h0, q, mx)
    return best


def main():
    rows = [json.loads(l) for l in open(sys.argv[1])][1:]
    for path, modes in PATHS.items():
        for ph in ("fwd", "bwd"):
            pts = [(o["c"], o["elems"], o["hw"], o[ph + "_ms"] * 1e9) for o in rows
                   if o["mode"] in modes and o["elems"] >= MIN_ELEMS]
            s, a, f, h0, q, mx = fit(pts)
            print("%-8s %s a %5d ps  f %4.1f ps  h0 %3d  q %.2f  n %3d  rms %.3f  max %.3f" %
                  (path, ph, a, f, h0, q, len(pts), math.sqrt(s / len(pts)), mx))


if __name__ == "__main__":
    main()
