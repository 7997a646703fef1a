"""The GPU's kernels in a steady step of any step-time case, by kind (issue 13: the GPU-bound cases the model
times short: U-Nets, Mixtral, DeepSeek-V3 under autocast; docs/STEP_TIME.md "Kernels of the GPU-bound outliers").

    python3 calibrate/vp-kernels-case.py OUT.jsonl ID...      (from the repository root, one GPU)

Each case ID is looked up among every step-time collector's cases (groundtruth/collect_hostprobe.py's
series_cases and heldout_cases: shared collect.py, extra.py, collect_encdec.py, collect_more.py, collect_moe.py and
the five held-out sets) and run by its own runner, unchanged, at 4 steps. The runner synchronizes at each step's
start and end; torch.cuda.synchronize is wrapped so that every span between two synchronizes runs under
torch.profiler (CUDA activity only). The line keeps the last span with at least half the largest span's kernels
(the last steady step):
  {"kind":"kernel_case","id":ID,"step_ms_protocol":..,"span_ms":..,"kernels":N,"busy_ms":..,
   "gap_small_ms":..,"gap_large_ms":..,"by_kind":{"gemm":ms,"attention":ms,"memory":ms},"top":[[name,count,ms],..],
   "waits":[["before -> after",count,ms],..]}
span_ms is the wall time of the profiled span on the host (the profiler's own cost included); busy_ms sums the
GPU activities' durations; gaps between consecutive activities are split at 10 us as in vp-kernels.py. by_kind
classifies kernel names: GEMM (cuBLAS / CUTLASS / nvjet / grouped mm), attention (flash, fmha, cuDNN SDPA),
memory (everything else: elementwise, reductions, copies, norms, optimizer). "waits" sums the GPU's idle gaps over
50 us by the kernels on either side (where the GPU waits for the host).
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "groundtruth"))
import collect_hostprobe as P  # noqa: E402  (sets sys.path for the shared collectors)
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

GAP_US = 10.0
BIG_GAP_US = 50.0
GEMM = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "grouped_mm", "_mm_", "s16816", "s1688", "wgmma")
ATTN = ("flash", "fmha", "sdpa", "attention", "attn")


def kind(name):
    n = name.lower()
    if any(k in n for k in ATTN):
        return "attention"
    if any(k in n for k in GEMM):
        return "gemm"
    return "memory"


def summary(prof, wall_ms):
    ev = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    by_kind = {"gemm": 0.0, "attention": 0.0, "memory": 0.0}
    names = {}
    for s, e, n in ev:
        d = (e - s) / 1e3
        by_kind[kind(n)] += d
        c = names.setdefault(n[:160], [0, 0.0])
        c[0] += 1
        c[1] += d
    small = large = 0.0
    for (s0, e0, _), (s1, _, _) in zip(ev, ev[1:]):
        g = max(0.0, s1 - e0) / 1e3
        if g <= GAP_US / 1e3:
            small += g
        else:
            large += g
    top = sorted(([n, c, round(ms, 4)] for n, (c, ms) in names.items()), key=lambda x: -x[2])[:60]
    # where the GPU waits: the gaps over BIG_GAP_US summed by the kernels on either side
    waits = {}
    for (s0, e0, n0), (s1, _, n1) in zip(ev, ev[1:]):
        g = s1 - e0
        if g > BIG_GAP_US:
            k = n0[:70] + " -> " + n1[:70]
            w = waits.setdefault(k, [0, 0.0])
            w[0] += 1
            w[1] += g / 1e3
    return dict(span_ms=round(wall_ms, 3), kernels=len(ev), busy_ms=round(sum(by_kind.values()), 4),
                gpu_span_ms=round((ev[-1][1] - ev[0][0]) / 1e3, 4) if ev else 0.0,
                gap_small_ms=round(small, 4), gap_large_ms=round(large, 4),
                by_kind={k: round(v, 4) for k, v in by_kind.items()}, top=top,
                waits=sorted(([k, c, round(ms, 4)] for k, (c, ms) in waits.items()), key=lambda x: -x[2])[:40])


def run(cid, fn, c, outdir):
    spans = []
    cur = {"p": None, "t": 0.0, "in": False}
    sync = torch.cuda.synchronize

    def timed_sync(*a, **k):
        sync(*a, **k)
        if cur["in"]:  # the profiler's own synchronizes
            return
        cur["in"] = True
        try:
            t = time.perf_counter()
            if cur["p"] is not None:
                cur["p"].stop()
                spans.append(summary(cur["p"], (t - cur["t"]) * 1e3))
            cur["p"] = profile(activities=[ProfilerActivity.CUDA])
            cur["p"].start()
            cur["t"] = time.perf_counter()
        finally:
            cur["in"] = False
    torch.cuda.synchronize = timed_sync
    try:
        r = P.run_named(fn, c, 4, outdir)
    finally:
        torch.cuda.synchronize = sync
        if cur["p"] is not None:
            cur["in"] = True
            cur["p"].stop()
    import collect as G
    G.cleanup()
    most = max((s["kernels"] for s in spans), default=0)
    steady = [s for s in spans if s["kernels"] * 2 >= most]
    line = dict(kind="kernel_case", id=cid, step_ms_protocol=r.get("step_ms"), spans=len(spans))
    line.update(steady[-1] if steady else {})
    return line


def main():
    out, ids = sys.argv[1], sys.argv[2:]
    import collect_more as M
    M.warmup()
    cases = P.named_cases(ids)
    outdir = os.path.dirname(os.path.abspath(out))
    with open(out, "w") as f:
        f.write(json.dumps(dict(env=dict(M.env_line(), host_probe=P.env_probe()))) + "\n")
        for cid in ids:
            fn, c = cases[cid]
            try:
                line = run(cid, fn, c, outdir)
            except Exception as e:  # a case that does not run here: say so and go on
                line = dict(kind="kernel_case", id=cid, error=repr(e)[:300])
            f.write(json.dumps(line) + "\n")
            f.flush()
            print(cid, {k: line.get(k) for k in ("step_ms_protocol", "span_ms", "busy_ms", "by_kind")}, flush=True)


if __name__ == "__main__":
    main()
