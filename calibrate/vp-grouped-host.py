"""The host's time of each torch._grouped_mm call inside the MoE steps, forward and backward (issue 13;
docs/STEP_TIME.md "MoE experts: the fallback's host").

    python3 calibrate/vp-grouped-host.py OUT.jsonl [--reps N] ID...     (from the repository root, one GPU)

Each case is run by its own collector's runner (groundtruth/collect_hostprobe.py's series_cases and heldout_cases)
at 4 steps under a TorchDispatchMode that sees every aten::_grouped_mm of the step: the forward's (and a
checkpointed step's recomputed ones) and the two that autograd's node makes for each of them
(tools/autograd/derivatives.yaml _grouped_mm: the input's gradient, 2d x 3d like the forward, and the weights'
gradient, 2d x 2d over each expert's rows; the mode reaches autograd's device thread through its thread-local
state). For each call the GPU is drained first (torch.cuda.synchronize, so that the fallback's own offs.cpu() does
not wait for earlier work), then the call is timed on the host (perf_counter) up to its return: the host's cost of
the call (aten/src/ATen/native/GroupedMMUtils.h _grouped_mm_fallback: the offsets' copy to the host and an mm_out
per group; or the CUTLASS kernel's two launches), without the profiler. The calls' own kernels are not waited for.
With --reps N the case list is run N times, each pass with its own host benchmark (collect_hostprobe.probe), in
alternating order. One line per pass, case and (phase, dtype, groups):
  {"kind":"grouped_host","id":ID,"rep":R,"probe_us":..,"phase":"fwd"|"bwd_input"|"bwd_weight","dtype":..,
   "groups":G,"calls":N,"rows":median rows a call,"us_median":..,"us_min":..,"us_per_group":median / G}
plus an env line with the host benchmark before the first case. Records of the first of the 4 steps are dropped.
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
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

REC = []
STEPS = 4


def phase_of(a, b):
    if not torch.is_grad_enabled():  # autograd's engine runs a step's backward with grad mode off
        return "bwd_weight" if a.dim() == 2 and b.dim() == 2 else "bwd_input"
    return "fwd"


class Timed(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.ops.aten._grouped_mm.default:
            return func(*args, **kwargs)
        a, b = args[0], args[1]
        offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        t1 = time.perf_counter()
        groups = int(offs.numel()) if offs is not None else int(b.shape[0]) if b.dim() == 3 else 1
        REC.append((phase_of(a, b), str(b.dtype).split(".")[-1], groups, int(a.shape[0]), (t1 - t0) * 1e6))
        return out


def summarize(cid, rep, probe_us, steps):
    """The records of the steps after the first (each step makes the same calls)."""
    by = {}
    for ph, dt, g, rows, us in REC[len(REC) // steps:]:
        by.setdefault((ph, dt, g), []).append((rows, us))
    lines = []
    for (ph, dt, g), v in sorted(by.items()):
        us = [x[1] for x in v]
        lines.append(dict(kind="grouped_host", id=cid, rep=rep, probe_us=probe_us, phase=ph, dtype=dt, groups=g,
                          calls=len(v), rows=statistics.median(x[0] for x in v),
                          us_median=round(statistics.median(us), 2), us_min=round(min(us), 2),
                          us_per_group=round(statistics.median(us) / g, 3)))
    return lines


def run_one(f, cases, cid, rep, probe_us, outdir):
    fn, c = cases[cid]
    REC.clear()
    try:
        with Timed():
            P.run_named(fn, c, STEPS, outdir)
    except Exception as e:  # a case that does not run here: say so and go on
        f.write(json.dumps(dict(kind="grouped_host", id=cid, rep=rep, error=repr(e)[:300])) + "\n")
        return
    import collect as G
    G.cleanup()
    for line in summarize(cid, rep, probe_us, STEPS):
        f.write(json.dumps(line) + "\n")
        print(line, flush=True)
    f.flush()


def main():
    argv = sys.argv[1:]
    reps = 1
    if "--reps" in argv:
        i = argv.index("--reps")
        reps = int(argv[i + 1])
        del argv[i:i + 2]
    out, ids = argv[0], argv[1:]
    import collect_more as M
    M.warmup()
    cases = P.named_cases(ids)
    outdir = os.path.dirname(os.path.abspath(out))
    with open(out, "w") as f:
        f.write(json.dumps(dict(env=dict(M.env_line(), host_probe=P.env_probe()))) + "\n")
        for rep in range(reps):
            probe_us = round(P.probe(), 2)
            for cid in (ids if rep % 2 == 0 else ids[::-1]):
                run_one(f, cases, cid, rep, probe_us, outdir)


if __name__ == "__main__":
    main()
