"""The torch fp8 cast rule's constant read off the H200 measurement (docs/CLUSTER.md "fp8 step time").

    python3 calibrate/fit-fp8.py calibrate/profiles/h200-fp8-casts.jsonl

scripts/fp8_casts.py timed, for bf16 tensors of linear shapes (rows x cols = E elements), current scaling's amax,
scale-cast and transposed cast (one tensorwise amax, the fp8 data and its transpose) eager and under torch.compile,
and a copy of the same tensor (x.clone(): 4 B an element read and written), in one process. For each mode this fits
time = fixed + E x per-element time (least squares of the relative error over the shapes) and prints the fit, its
median and largest relative error, and the per-element time over the copy's. The fixed term is the host's (one
Python call timed alone: 10 us for a copy, 64 us for the compiled function's guards and wrapper), not a kernel's; the
per-element ratios are the rule's constants (include/vramplan/timing.h VP_FP8_CAST_COMPILED, _EAGER): the compiled cast moves
that many times a copy's bytes at the profile's copy curve, so it carries over to other GPUs by their copy curve.
Modes compile_cast (amax + row-major cast) and compile_tcast (amax + transposed cast) split the compiled cost:
VP_FP8_CAST_ROW_AMAX and VP_FP8_CAST_TRANS_AMAX, the forward's share and (whole less the second) the row cast alone.
"""
import json
import statistics
import sys


def fit(pts):
    """time = a + b E minimising sum((a + b E) / t - 1)^2."""
    s11 = sum(1 / t / t for e, t in pts)
    s12 = sum(e / t / t for e, t in pts)
    s22 = sum(e * e / t / t for e, t in pts)
    r1 = sum(1 / t for e, t in pts)
    r2 = sum(e / t for e, t in pts)
    det = s11 * s22 - s12 * s12
    a, b = (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det
    err = sorted(abs((a + b * e) / t - 1) for e, t in pts)
    return a, b, statistics.median(err), err[-1]


def main(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    for r in rows:
        if r.get("kind") == "env":
            print("env: %s, torch %s" % (r.get("gpu"), r.get("torch")))
    casts = [r for r in rows if r.get("kind") == "fp8cast"]
    fits = {}
    present = {r["mode"] for r in casts}
    for mode in ("copy", "compile", "eager", "compile_cast", "compile_tcast"):
        pts = [(r["rows"] * r["cols"], r["ms"] * 1e-3) for r in casts if r["mode"] == mode]
        if mode not in present and mode.startswith("compile_"):
            continue  # the split of the compiled cast, measured since
        if len(pts) < 2:
            sys.exit("%s: fewer than two %s rows" % (path, mode))
        fits[mode] = fit(pts)
        a, b, med, worst = fits[mode]
        print("%-7s %2d shapes: %6.1f us + %.4f ps an element (%.0f GB/s of 4 B), |err| median %.3f, max %.3f" % (
            mode, len(pts), a * 1e6, b * 1e12, 4 / b / 1e9, med, worst))
    for mode in (m for m in ("compile", "eager", "compile_cast", "compile_tcast") if m in fits):
        print("%s per element over a copy's: %.3f" % (mode, fits[mode][1] / fits["copy"][1]))
    if "compile_cast" in fits and "compile_tcast" in fits:
        whole, cast, tcast = (fits[m][1] for m in ("compile", "compile_cast", "compile_tcast"))
        # amax + row cast is the forward's share; the whole less it the transposed cast (the backward's);
        # the whole less amax + transposed cast the row cast alone (the fp8 all-gather's shard cast)
        print("forward share (amax + row cast) %.3f, transposed cast %.3f, row cast alone %.3f of the compiled cast" % (
            cast / whole, 1 - cast / whole, 1 - tcast / whole))


if __name__ == "__main__":
    main(sys.argv[1])
