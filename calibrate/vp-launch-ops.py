"""Which op launches each kernel of a training step, per phase (docs/STEP_TIME.md "Launches"): the data the launch
rules of src/timing_host.c are checked against, op by op instead of a phase's total.

    python3 calibrate/vp-launch-ops.py OUT.jsonl [id-filter]     (from the repository root, one H200)

The cases and their construction are calibrate/vp-host-trace.py's (its case list, collect_more.py's builders);
three warm-up steps, then one step under torch.profiler (CPU activity only). Every CPU event is placed on its
thread's stack of enclosing events; for each kernel launch (cudaLaunchKernel, cuLaunchKernel, cudaLaunchKernelExC,
cuLaunchKernelEx) the outermost op (in the backward the autograd node, "autograd::engine::evaluate_function: X")
and the innermost aten op are counted per phase, and so is every outermost op, launching or not (the host's
dispatches). One JSON object per line:
  {"kind": "launch_ops", "case": ID, "phases": {"fwd": {"launches": N, "by_outer": {OP: n}, "by_inner": {OP: n},
   "outer_ops": {OP: [count, host_us]}}, "bwd": ..., "opt": ...}}
"""
import importlib.util, json, os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("vp_host_trace", os.path.join(HERE, "vp-host-trace.py"))
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

LABELS = ("fwd", "bwd", "opt")
OUT = {}


def analyse(prof):
    cpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    ranges = {e.name: (e.time_range.start, e.time_range.end) for e in cpu if e.name in LABELS}

    def phase_of(t):
        for k, (a, b) in ranges.items():
            if a <= t <= b:
                return k
        return None

    phases = {k: {"launches": 0, "by_outer": {}, "by_inner": {}, "outer_ops": {}} for k in ranges}
    stacks = {}
    for e in sorted((e for e in cpu if e.name not in LABELS),
                    key=lambda e: (e.time_range.start, -e.time_range.elapsed_us())):
        st = stacks.setdefault(e.thread, [])
        while st and st[-1].time_range.end <= e.time_range.start:
            st.pop()
        p = phase_of(e.time_range.start)
        if p is not None:
            ph = phases[p]
            if not st:
                o = ph["outer_ops"].setdefault(e.name[:100], [0, 0.0])
                o[0] += 1
                o[1] += e.time_range.elapsed_us()
            if e.name in T.LAUNCH:
                ph["launches"] += 1
                outer = st[0].name[:100] if st else "(none)"
                inner = next((s.name for s in reversed(st) if s.name.startswith("aten::")), "(none)")[:100]
                ph["by_outer"][outer] = ph["by_outer"].get(outer, 0) + 1
                ph["by_inner"][inner] = ph["by_inner"].get(inner, 0) + 1
        st.append(e)
    for ph in phases.values():
        ph["outer_ops"] = {k: [v[0], round(v[1], 1)] for k, v in sorted(ph["outer_ops"].items(),
                                                                      key=lambda x: -x[1][0])}
    return phases


def traced_steps(m, params, c, batch_fn):
    opt, ac, accum = T.step_setup(params, c)
    for s in range(3):
        T.one_step(m, opt, batch_fn(), ac, accum)
    batch = batch_fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        T.one_step(m, opt, batch, ac, accum, label=True)
        torch.cuda.synchronize()
    OUT.update(phases=analyse(prof))
    return [], []


def run_cases(kind, steps, state):
    """Every case of the host traces' list matching argv[2]'s filters, its steps run by `steps`, which leaves its
    record's fields in `state`: one JSON line of `kind` a case to argv[1]."""
    out = open(sys.argv[1], "w")
    want = sys.argv[2].split(",") if len(sys.argv) > 2 else [""]
    T.C.phase_steps = steps
    T.C.summarize = lambda *a: None
    T.C.warmup()
    for c, run in T.cases():
        if not any(w in c["id"] for w in want):
            continue
        state.clear()
        t0 = time.time()
        try:
            run(dict(c), None)
            rec = dict(kind=kind, case=c["id"], **state)
        except Exception as e:  # a case that does not run here: say so and go on
            rec = dict(kind=kind, case=c["id"], error=repr(e)[:200])
        rec["wall_s"] = round(time.time() - t0, 1)
        torch.cuda.empty_cache()
        out.write(json.dumps(rec) + "\n")
        out.flush()


def main():
    run_cases("launch_ops", traced_steps, OUT)


if __name__ == "__main__":
    main()
