"""The host benchmark's time on the host the step-time model's host terms were measured on (docs/STEP_TIME.md "The
host's speed"; gpus/h200.yaml measured.host_probe_us).

    python3 calibrate/fit-host-probe.py [CALIB.jsonl RERUN.jsonl]     (no GPU; defaults: the H200 profiles below)

The host terms (VP_HOST_FWD_KERNEL, VP_HOST_BWD_KERNEL, the optimizer's; calibrate/fit-host.py) were fitted on the host
phases of calibrate/profiles/h200-host.jsonl (calibrate/vp-host.py), measured without the host benchmark. The same
cases' host phases were measured again with the benchmark beside each (calibrate/profiles/h200-host-rerun.jsonl,
groundtruth/collect_hostprobe.py `host`: `host_probe_us`, the median time of one iteration of a fixed eager
workload). A case whose host phases (forward + backward + optimizer) took h0 in the calibration and h1 beside a probe
of p says the calibration host would have run the probe in p * h0 / h1. Printed: the median of that over the cases
(the profile's figure), its range and count, as gpus/*.yaml's `host_probe_us` stat.
"""
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def phases(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        if d.get("kind") == "host_profile":
            out[d["case"]] = d
    return out


def main():
    calib, rerun = (sys.argv[1:3] if len(sys.argv) == 3 else
                    [os.path.join(HERE, "profiles", f) for f in ("h200-host.jsonl", "h200-host-rerun.jsonl")])
    a, b = phases(calib), phases(rerun)
    est = []
    for case, x in a.items():
        y = b.get(case)
        if not y or not y.get("host_probe_us"):
            continue
        h0 = x["fwd_ms"] + x["bwd_ms"] + x["opt_ms"]
        h1 = y["fwd_ms"] + y["bwd_ms"] + y["opt_ms"]
        est.append(y["host_probe_us"] * h0 / h1)
        print("%-38s %8.2f %8.2f ms  probe %7.1f us -> %7.1f" % (case, h0, h1, y["host_probe_us"], est[-1]))
    if not est:
        sys.exit("no case in both files")
    print("host_probe_us: {median: %.6g, min: %.6g, max: %.6g, n: %d}" %
          (statistics.median(est), min(est), max(est), len(est)))


if __name__ == "__main__":
    main()
