"""The host's time of each torch._grouped_mm call inside the MoE steps (issue 13; docs/STEP_TIME.md "What is left",
the fp32 fallback's host).

    python3 calibrate/vp-grouped-host.py OUT.jsonl ID...       (from the repository root, one GPU)

Each case is run by its own collector's runner (groundtruth/collect_hostprobe.py's series_cases and heldout_cases)
at 4 steps, with torch._grouped_mm (and torch.nn.functional.grouped_mm where it exists) wrapped: the GPU is drained
first (torch.cuda.synchronize, so that the call's own offs.cpu() does not wait for earlier work), then the call is
timed on the host (perf_counter) up to its return. That is the host's cost of the call (the fallback's copy of the
offsets to the host and its per-group mm launches, aten/src/ATen/native/GroupedMMUtils.h _grouped_mm_fallback; or
the CUTLASS kernel's two launches), measured in the step, without the profiler. Forward calls only (the backward's
grouped GEMMs are called by autograd from C++). One line per case and (dtype, groups):
  {"kind":"grouped_host","id":ID,"dtype":..,"groups":G,"calls":N,"rows":median rows a call,"us_median":..,
   "us_min":..,"us_per_group":median / G}
plus an env line with the host benchmark (collect_hostprobe.probe) before the first case.
"""
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "groundtruth"))
import collect_hostprobe as P  # noqa: E402
import torch  # noqa: E402

REC = []
_IN = [False]


def wrap(fn):
    def timed(a, b, *args, **kw):
        if _IN[0]:
            return fn(a, b, *args, **kw)
        _IN[0] = True
        try:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(a, b, *args, **kw)
            t1 = time.perf_counter()
        finally:
            _IN[0] = False
        offs = kw.get("offs", args[0] if args else None)
        groups = int(offs.numel()) if offs is not None else int(b.shape[0]) if b.dim() == 3 else 1
        REC.append((str(b.dtype).split(".")[-1], groups, int(a.shape[0]), (t1 - t0) * 1e6))
        return out
    return timed


def main():
    out, ids = sys.argv[1], sys.argv[2:]
    import collect_more as M
    M.warmup()
    cases = P.named_cases(ids)
    torch._grouped_mm = wrap(torch._grouped_mm)
    F = torch.nn.functional
    if hasattr(F, "grouped_mm"):
        F.grouped_mm = wrap(F.grouped_mm)
    outdir = os.path.dirname(os.path.abspath(out))
    with open(out, "w") as f:
        f.write(json.dumps(dict(env=dict(M.env_line(), host_probe=P.env_probe()))) + "\n")
        for cid in ids:
            fn, c = cases[cid]
            REC.clear()
            try:
                P.run_named(fn, c, 4, outdir)
            except Exception as e:  # a case that does not run here: say so and go on
                f.write(json.dumps(dict(kind="grouped_host", id=cid, error=repr(e)[:300])) + "\n")
                continue
            import collect as G
            G.cleanup()
            by = {}
            for dt, g, rows, us in REC[len(REC) // 4:]:  # the steps after the first
                by.setdefault((dt, g), []).append((rows, us))
            for (dt, g), v in sorted(by.items()):
                us = [x[1] for x in v]
                line = dict(kind="grouped_host", id=cid, dtype=dt, groups=g, calls=len(v),
                            rows=statistics.median(x[0] for x in v), us_median=round(statistics.median(us), 2),
                            us_min=round(min(us), 2), us_per_group=round(statistics.median(us) / g, 3))
                f.write(json.dumps(line) + "\n")
                print(line, flush=True)
            f.flush()


if __name__ == "__main__":
    main()
