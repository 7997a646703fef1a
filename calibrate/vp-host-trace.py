"""Where the host waits in the fine-tuning, MoE and family steps (docs/STEP_TIME.md "The host", "MoE experts",
"Fine-tuning"): the measurements the host-side rules of src/timing_host.c were derived from source without.

    python3 calibrate/vp-host-trace.py OUT.jsonl [id-filter]     (from the repository root, one H200)

For each training case of groundtruth/collect_more.py (LoRA, DoRA, freezing, the families), groundtruth/
collect_moe.py (mixtral-small) and the held-out LoRA sets, built by those scripts' own code (their step loop is
replaced by this one, nothing else): three warm-up steps, then

1. the host's wall time of the forward, the backward and the optimizer step (with zero_grad) issued without a
   synchronize (vp-host.py's protocol), and the step's wall time with one at its end;
2. one steady step under torch.profiler (CPU and CUDA activity): per phase the kernels launched
   (cudaLaunchKernel, cuLaunchKernel, cudaLaunchKernelExC), the runtime calls that block the host
   (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpyAsync and cudaMemcpy: a
   device-to-host copy such as .item(), .cpu(), .tolist(), nonzero or torch._grouped_mm's fallback offs.cpu()),
   their count and host microseconds; the GPU's busy time, and its idle gaps longer than 20 us with the CPU op
   that was running when each gap ended (the one that made the GPU wait);
3. the kernels by name: count and GPU microseconds (grouped GEMMs, per-expert mm, LoRA's rank-r GEMMs, DoRA's
   norm, the routers' sorts and scatters).

One JSON object per line:
  {"kind": "host_trace", "case": ID, "fwd_ms", "bwd_ms", "opt_ms", "step_ms",
   "phases": {"fwd": {"launches", "syncs": {NAME: [count, us]}, "gpu_busy_ms", "idle_ms"}, "bwd": ..., "opt": ...},
   "gaps": [[us, CPU_OP], ...] (the 40 longest), "kernels": {NAME: [count, us]}}
"""
import bisect, contextlib, json, os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
GT = os.path.join(HERE, "..", "groundtruth")
sys.path.insert(0, GT)
sys.path.insert(0, os.path.join(GT, "heldout"))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402
import collect_more as C  # noqa: E402

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync", "cudaMemcpy")
LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
OUT = {}


def one_step(m, opt, batch, ac, accum, label=False):
    """One optimizer step as collect_more.phase_steps runs it; returns the host's phase times (no synchronize)."""
    t = [time.perf_counter()]
    for a in range(accum):
        with record_function("fwd") if label else contextlib.nullcontext():
            with torch.autocast("cuda", dtype=ac, enabled=ac is not None):
                loss = m(**batch).loss / accum
        t.append(time.perf_counter())
        with record_function("bwd") if label else contextlib.nullcontext():
            loss.backward()
        t.append(time.perf_counter())
        del loss
    with record_function("opt") if label else contextlib.nullcontext():
        opt.step()
        opt.zero_grad(set_to_none=True)
    t.append(time.perf_counter())
    return (t[1] - t[0]) * 1e3, (t[-2] - t[1]) * 1e3, (t[-1] - t[-2]) * 1e3


def analyse(prof):
    ev = [e for e in prof.events()]
    ranges = {e.name: (e.time_range.start, e.time_range.end) for e in ev if e.name in ("fwd", "bwd", "opt")}
    kern = sorted([e for e in ev if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0],
                  key=lambda e: e.time_range.start)
    cpu = [e for e in ev if e.device_type == torch.autograd.DeviceType.CPU]

    order = sorted((e for e in cpu if e.name not in ("fwd", "bwd", "opt")), key=lambda e: e.time_range.start)
    starts = [e.time_range.start for e in order]

    def running(t):
        """The innermost CPU op running at time t (the shortest of those that contain it, among the last 400
        started)."""
        i = bisect.bisect_right(starts, t)
        inside = [e for e in order[max(0, i - 400):i] if e.time_range.end >= t]
        return min(inside, key=lambda e: e.time_range.elapsed_us()).name if inside else ""

    def phase_of(t):
        for k, (a, b) in ranges.items():
            if a <= t <= b:
                return k
        return None

    phases = {k: {"launches": 0, "syncs": {}, "gpu_busy_ms": 0.0, "idle_ms": 0.0} for k in ranges}
    for e in cpu:
        p = phase_of(e.time_range.start)
        if p is None:
            continue
        if e.name in LAUNCH:
            phases[p]["launches"] += 1
        elif e.name in SYNCS:
            s = phases[p]["syncs"].setdefault(e.name, [0, 0.0])
            s[0] += 1
            s[1] += e.time_range.elapsed_us()
    kernels, gaps, end = {}, [], None
    for k in kern:
        n = kernels.setdefault(k.name[:120], [0, 0.0])
        n[0] += 1
        n[1] += k.time_range.elapsed_us()
        p = phase_of(k.time_range.start)
        if p:
            phases[p]["gpu_busy_ms"] += k.time_range.elapsed_us() / 1e3
        if end is not None and k.time_range.start - end > 20:
            gap = k.time_range.start - end
            if p:
                phases[p]["idle_ms"] += gap / 1e3
            gaps.append([round(gap, 1), running(k.time_range.start)])
        end = k.time_range.end if end is None else max(end, k.time_range.end)
    gaps.sort(reverse=True)
    return phases, gaps[:40], {k: [v[0], round(v[1], 1)] for k, v in sorted(kernels.items(), key=lambda x: -x[1][1])}


def step_setup(params, c):
    """The case's optimizer, autocast dtype (None: none) and accumulation steps, as collect_more.py's cases run."""
    opt = {"adamw": lambda: torch.optim.AdamW(params, lr=1e-4),
           "adamw-fused": lambda: torch.optim.AdamW(params, lr=1e-4, fused=True),
           "sgd": lambda: torch.optim.SGD(params, lr=1e-3, momentum=0.9)}[c.get("opt", "adamw")]()
    ac = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(c.get("prec", "fp32"))
    return opt, ac, c.get("accum", 1)


def traced_steps(m, params, c, batch_fn):
    """Replaces collect_more.phase_steps: warm-up, host phases, one profiled step."""
    opt, ac, accum = step_setup(params, c)
    rows = []
    for s in range(6):
        batch = batch_fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f, b, o = one_step(m, opt, batch, ac, accum)
        torch.cuda.synchronize()
        rows.append((f, b, o, (time.perf_counter() - t0) * 1e3))
    r = sorted(rows[3:], key=lambda x: x[3])[1]
    batch = batch_fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        one_step(m, opt, batch, ac, accum, label=True)
        torch.cuda.synchronize()
    phases, gaps, kernels = analyse(prof)
    OUT.update(fwd_ms=r[0], bwd_ms=r[1], opt_ms=r[2], step_ms=r[3], phases=phases, gaps=gaps, kernels=kernels)
    return [], []


def cases():
    import collect_moe as M
    import collect_heldout as H
    out = [(c, C.run_ft) for c in C.FT] + [(c, C.run_family) for c in C.FAM] + [(c, C.run_family) for c in M.CASES]
    out += [(c, C.run_ft) for c in list(H.FT)] + [(c, C.run_family) for c in list(H.FAM)]
    import collect_heldout2  # noqa: F401  (replaces H.FT and H.FAM with the second held-out set)
    return out + [(c, C.run_ft) for c in list(H.FT)] + [(c, C.run_family) for c in list(H.FAM)]


def main():
    out = open(sys.argv[1], "w")
    want = sys.argv[2] if len(sys.argv) > 2 else ""
    C.phase_steps = traced_steps
    C.summarize = lambda *a: None
    C.warmup()
    for c, run in cases():
        if want and want not in c["id"]:
            continue
        OUT.clear()
        try:
            run(dict(c), None)
            rec = dict(kind="host_trace", case=c["id"], **OUT)
        except Exception as e:  # a case that does not run here: say so and go on
            rec = dict(kind="host_trace", case=c["id"], error=repr(e)[:200])
        torch.cuda.empty_cache()
        out.write(json.dumps(rec) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
