"""The GPU time of a training step's kernels by the op that launched them, per phase (docs/STEP_TIME.md "Memory-bound
kernels by input layout", issue 13): the data the simulator's per-op GPU rules (src/timing.c, src/timing_layout.c,
src/ops/) are checked against, op family by op family instead of the step's total or a kernel name's total (the host
traces' "kernels" are by name only, and one name serves many ops: a broadcast multiply of RMSNorm and of RoPE alike).

    python3 calibrate/vp-kernels-byop.py OUT.jsonl [id-filter,...]     (from the repository root, one H200)

The cases and their construction are calibrate/vp-host-trace.py's (its case list, collect_more.py's builders); three
warm-up steps, then one step under torch.profiler with CPU and CUDA activity. Every module's forward is wrapped in a
record_function range "mod::CLASS" (forward pre- and post-hooks). From the exported Chrome trace each kernel, memcpy
and memset is joined to its launch (the runtime call with the same correlation id), and the launch is placed on its
thread's stack of enclosing CPU events: the kernel's GPU microseconds are summed per phase by (a) the innermost
module of the forward ("mod::Qwen3RMSNorm"; in the backward and the optimizer the outermost op: the autograd node,
"autograd::engine::evaluate_function: MulBackward0"), (b) that key and the innermost aten op, (c) that key and the
kernel's name (first 100 characters). One JSON object per line:
  {"kind": "kernels_byop", "case": ID, "phases": {"fwd": {"gpu_us": T, "by_key": {KEY: [n, us]},
   "by_key_op": {"KEY | aten::mul": [n, us]}, "by_key_kernel": {"KEY | KERNEL": [n, us]}}, "bwd": ..., "opt": ...}}
"""
import importlib.util, json, os, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("vp_launch_ops", os.path.join(HERE, "vp-launch-ops.py"))
L = importlib.util.module_from_spec(spec)
spec.loader.exec_module(L)
T = L.T  # vp-host-trace.py: the cases, one_step, step_setup
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

LABELS = ("fwd", "bwd", "opt")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
OUT = {}


def add(d, k, us):
    v = d.setdefault(k, [0, 0.0])
    v[0] += 1
    v[1] += us


def analyse(trace):
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    ranges = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in ev
              if e.get("cat") == "user_annotation" and e["name"] in LABELS}

    def phase_of(t):
        return next((k for k, (a, b) in ranges.items() if a <= t <= b), None)

    gpu = {}
    for e in ev:
        if e.get("cat") in GPU_CATS and "correlation" in e.get("args", {}):
            gpu.setdefault(e["args"]["correlation"], []).append(e)
    cpu = sorted((e for e in ev if e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
                  and e["name"] not in LABELS), key=lambda e: (e["ts"], -e["dur"]))
    phases = {k: {"gpu_us": 0.0, "by_key": {}, "by_key_op": {}, "by_key_kernel": {}} for k in ranges}
    stacks = {}
    for e in cpu:
        st = stacks.setdefault(e["tid"], [])
        while st and st[-1]["ts"] + st[-1]["dur"] <= e["ts"]:
            st.pop()
        corr = e.get("args", {}).get("correlation")
        p = phase_of(e["ts"])
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and corr in gpu and p is not None:
            mods = [s["name"] for s in st if s["name"].startswith("mod::")]
            key = mods[-1] if p == "fwd" and mods else (st[0]["name"][:100] if st else "(none)")
            inner = next((s["name"] for s in reversed(st) if s["name"].startswith("aten::")), "(none)")[:100]
            ph = phases[p]
            for k in gpu[corr]:
                us = float(k["dur"])
                ph["gpu_us"] += us
                add(ph["by_key"], key, us)
                add(ph["by_key_op"], key + " | " + inner, us)
                add(ph["by_key_kernel"], key + " | " + k["name"][:100], us)
        st.append(e)
    for ph in phases.values():
        ph["gpu_us"] = round(ph["gpu_us"], 1)
        for t in ("by_key", "by_key_op", "by_key_kernel"):
            ph[t] = {k: [v[0], round(v[1], 1)] for k, v in sorted(ph[t].items(), key=lambda x: -x[1][1])}
    return phases


def wrap_modules(m):
    """A record_function range "mod::CLASS" around every module's forward."""
    open_ = []

    def pre(mod, args):
        r = torch.autograd.profiler.record_function("mod::" + type(mod).__name__)
        r.__enter__()
        open_.append(r)

    def post(mod, args, out):
        if open_:
            open_.pop().__exit__(None, None, None)

    return [h for mod in m.modules() for h in (mod.register_forward_pre_hook(pre), mod.register_forward_hook(post))]


def traced_steps(m, params, c, batch_fn):
    opt, ac, accum = T.step_setup(params, c)
    for s in range(3):
        T.one_step(m, opt, batch_fn(), ac, accum)
    batch = batch_fn()
    hooks = wrap_modules(m)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        T.one_step(m, opt, batch, ac, accum, label=True)
        torch.cuda.synchronize()
    for h in hooks:
        h.remove()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        OUT.update(phases=analyse(json.load(f)))
    os.unlink(path)
    return [], []


def main():
    L.run_cases("kernels_byop", traced_steps, OUT)


if __name__ == "__main__":
    main()
