"""The host's time of a torch._grouped_mm call on the fallback against its groups (calibrate/vp-grouped-host.py's
lines): call_us = F + G x groups at the calibration host, each line's median scaled from its session's host benchmark
(the line's probe_us, else the file's env line) to the profile's (gpus/h200.yaml host_probe_us median, 1678.14 us),
least squares on the relative error over every fp32 line of the files given; prints F and G (timing_host.h
VP__HOST_GROUPED_CALL, VP__HOST_GROUPED_GROUP) and each line against the fit; and the median of the bf16 lines
(CUTLASS's grouped kernel, one call whatever the groups: VP__HOST_GROUPED_FAST).

    python3 calibrate/fit-grouped-host.py calibrate/profiles/h200-grouped-host*.jsonl
"""
import json
import sys

CAL_PROBE_US = 1678.14


def load(path):
    """Each line of the file as (id, phase, groups, us at the calibration host, dtype)."""
    rows, probe = [], None
    for line in open(path):
        o = json.loads(line)
        if "env" in o:
            probe = o["env"]["host_probe"]["probe_us"]
            continue
        if "error" in o:
            continue
        p = o.get("probe_us", probe)
        rows.append((o["id"], o.get("phase", "fwd"), o["groups"], o["us_median"] * CAL_PROBE_US / p, o["dtype"]))
    return rows


def fit(rows):
    """min sum ((F + G g) / y - 1)^2: the normal equations of two unknowns."""
    a11 = a12 = a22 = b1 = b2 = 0.0
    for _, _, g, y, _ in rows:
        x1, x2 = 1.0 / y, g / y
        a11 += x1 * x1
        a12 += x1 * x2
        a22 += x2 * x2
        b1 += x1
        b2 += x2
    det = a11 * a22 - a12 * a12
    return (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det


def main():
    every = [r for path in sys.argv[1:] for r in load(path)]
    rows = [r for r in every if r[4] == "float32"]
    F, G = fit(rows)
    errs = sorted(abs((F + G * g) / y - 1) for _, _, g, y, _ in rows)
    print("lines %d  F %.1f us  G %.2f us a group  median |err| %.1f %%  max %.1f %%" %
          (len(rows), F, G, 100 * errs[len(errs) // 2], 100 * errs[-1]))
    for cid, ph, g, y, _ in sorted(rows, key=lambda r: (r[2], r[0], r[1])):
        print("  %-40s %-10s %4d groups %7.0f us  fit %+6.1f %%" % (cid, ph, g, y, 100 * ((F + G * g) / y - 1)))
    fast = sorted(r[3] for r in every if r[4] == "bfloat16")
    if fast:
        n = len(fast)
        med = fast[n // 2] if n % 2 else (fast[n // 2 - 1] + fast[n // 2]) / 2
        print("bf16 lines %d  median %.1f us a call (%.1f-%.1f)" % (n, med, fast[0], fast[-1]))


if __name__ == "__main__":
    main()
