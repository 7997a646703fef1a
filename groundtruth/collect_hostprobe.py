"""The single-GPU step times again, each case beside a fixed benchmark of the host (issue 13: the host's speed).

The committed step times come from several lent machines whose CPUs differ: the same case measured in two sessions
differs by up to 42 % (ho3- and ho5-gemma3-4b-8l-bf16-b2-ckpt: 128.7 and 90.7 ms, same software), and the
host-bound mlp10-bf16 step is 5.98 ms in the shared file and 7.10-7.48 ms in the mlp10-repeat file. This script
runs the cases of each step-time collector again, in the collector's own process layout and protocol (imported,
unchanged), and adds to every case line `host_probe_us`: the host's time for one iteration of a fixed eager
workload measured right before the case (`probe`). The env line gets the same benchmark at the start of the set
(`host_probe`, with the launch loop's figure).

    python3 groundtruth/collect_hostprobe.py OUTDIR SET      # one set a process
    python3 groundtruth/collect_hostprobe.py --probe         # this host's benchmark, us (plan --host-probe-us)

SET is one of: steps (a step-time series: 14 cases of several collectors at 16 steps each, every step's time and
the GPU's SM clock after it, twice, the second pass in reverse order: OUTDIR/steps/steps.jsonl; each run's own case
line, at 16 steps, in OUTDIR/steps/cases.jsonl), t5steps (the same
series for every T5-family case of the families and held-out sets: OUTDIR/t5steps/steps.jsonl), bf16steps (the
same series for BF16_PAIRS: each host-bound pure-bf16 case beside an AMP case of its model,
OUTDIR/bf16steps/steps.jsonl), series ID... (the same series for the cases named, from any of the collectors below:
OUTDIR/series/steps.jsonl), host (calibrate/vp-host.py's host phases of the shared cases, each line with the
probe), cases (shared collect.py), extra (extra.py), finetune (collect_more.py lora), families (collect_more.py
families), moe (collect_moe.py cases), encdec (collect_encdec.py), ho1 .. ho5
(groundtruth/heldout/collect_heldout*.py, training cases only). Outputs go to OUTDIR/SET/ under each collector's own
file names.
"""
import gc, importlib.util, json, os, runpy, statistics, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
for p in (os.path.join(ROOT, ".req"), os.path.join(ROOT, ".shared"), os.path.join(ROOT, "..", "shared", "groundtruth")):
    if os.path.exists(os.path.join(p, "collect.py")):
        sys.path.insert(0, p)
        break
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "heldout"))
import torch  # noqa: E402

_NET = None


def probe(reps=7, iters=30):
    """Host microseconds per iteration of a fixed eager workload: an 8-block MLP (Linear 64x64 + GELU, bias) on a
    16 x 64 input, forward, sum, backward and zero_grad, every tensor tiny so that the GPU always waits on the host
    (about 60 kernels an iteration, 1,800 a repetition, beyond the launch queue's 1,022 only if the GPU were
    slower than the host). The median of `reps` repetitions, each timed on the host without a synchronize inside."""
    global _NET
    if _NET is None:
        torch.manual_seed(0)
        _NET = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
                                     for _ in range(8)]).cuda()
    x = torch.randn(16, 64, device="cuda")
    ts = []
    for r in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            _NET(x).sum().backward()
            _NET.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        if r:
            ts.append((t1 - t0) / iters * 1e6)
    return round(statistics.median(ts), 3)


def launch_probe(n=2000):
    """Host microseconds per eager x.add_(1) on a one-element tensor (calibrate's `launch` form)."""
    x = torch.zeros(1, device="cuda")
    ts = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        ts.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return round(statistics.median(ts), 3)


def with_probe(fn):
    def run(*a, **k):
        p = probe()
        r = fn(*a, **k)
        if isinstance(r, dict) and "step_ms" in r:
            r["host_probe_us"] = p
        return r
    return run


def env_probe():
    return dict(probe_us=probe(), launch_us=launch_probe())


def patch_env(mod, attr):
    orig = getattr(mod, attr)

    def env_line():
        e = orig()
        e["host_probe"] = env_probe()
        return e
    setattr(mod, attr, env_line)


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


def set_host(out):
    V = load(os.path.join(ROOT, "calibrate", "vp-host.py"), "vp_host")
    torch.ones(1, device="cuda") @ torch.ones(1, 1, device="cuda")
    with open(os.path.join(out, "host.jsonl"), "w") as f:
        f.write(json.dumps(dict(env=dict(torch=torch.__version__, host_probe=env_probe()))) + "\n")
        for c in V.G.CASES:
            if c.get("infer"):
                continue
            p = probe()
            r = V.host_phases(c)
            r["host_probe_us"] = p
            f.write(json.dumps(r) + "\n"); f.flush()
            print(r["case"], "fwd %.2f bwd %.2f opt %.2f probe %.1f" % (r["fwd_ms"], r["bwd_ms"], r["opt_ms"], p),
                  flush=True)


def set_cases(out):
    import collect as G
    G.run_case = with_probe(G.run_case)
    sys.argv = ["collect.py", "cases", os.path.join(out, "cases.jsonl")]
    torch.ones(1, device="cuda") @ torch.ones(1, 1, device="cuda")
    first = env_probe()
    G.main()
    probe_into_env(os.path.join(out, "cases.jsonl"), first)


def probe_into_env(path, probe_):
    """The probe joins the env line that a collector wrote itself (the file's first line)."""
    lines = open(path).read().splitlines()
    env = json.loads(lines[0])
    env["env"]["host_probe"] = probe_
    with open(path, "w") as f:
        f.write("\n".join([json.dumps(env)] + lines[1:]) + "\n")


def set_extra(out):
    import collect as G
    X = load(os.path.join(HERE, "extra.py"), "extra_cases")
    X.warmup()
    env = dict(X.env_line(), host_probe=env_probe())
    run = with_probe(G.run_case)
    with open(os.path.join(out, "extra-cases.jsonl"), "w") as f:
        f.write(json.dumps(dict(env=env)) + "\n")
        for c in X.CASES:
            c = dict(c, id=X.cid(c))
            t0 = time.time()
            try:
                r = run(c)
            except Exception as e:  # noqa: BLE001
                r = dict(c, error=repr(e)[:300])
            G.cleanup()
            r["wall_s"] = round(time.time() - t0, 2)
            f.write(json.dumps(r) + "\n"); f.flush()
            print(r["id"], r.get("error", ""), r.get("step_ms"), r.get("host_probe_us"), flush=True)


def patch_more():
    import collect_more as M
    M.run_ft = with_probe(M.run_ft)
    M.run_family = with_probe(M.run_family)
    M.run_generate = lambda c, outdir: dict(c, error="skipped")
    patch_env(M, "env_line")
    return M


def set_more(out, mode):
    M = patch_more()
    sys.argv = ["collect_more.py", out, mode]
    M.main()


def set_moe(out):
    patch_more()
    sys.argv = ["collect_moe.py", out, "cases"]
    runpy.run_path(os.path.join(HERE, "collect_moe.py"), run_name="__main__")


def set_encdec(out):
    import collect_encdec as E
    E.CASES[:] = [(with_probe(fn), c) for fn, c in E.CASES]
    sys.argv = ["collect_encdec.py", out]
    torch.ones(1, device="cuda") @ torch.ones(1, 1, device="cuda")
    first = env_probe()
    E.main()
    probe_into_env(os.path.join(out, "encdec.jsonl"), first)


def set_heldout(out, n):
    patch_more()
    script = os.path.join(HERE, "heldout", "collect_heldout.py" if n == 1 else "collect_heldout%d.py" % n)
    sys.argv = [script, out] + (["single"] if n == 1 else [])
    runpy.run_path(script, run_name="__main__")


SERIES = [("G", "mlp10-bf16-b1024"), ("G", "resnet50-fp32-b64"), ("G", "gpt2-small-amp-bf16-b8"),
          ("G", "gpt2-medium-amp-bf16-b8-ckpt"), ("X", "resnet50-amp-bf16-b32"), ("X", "bert-large-amp-bf16-b16"),
          ("X", "llama-1b-amp-bf16-b2-ckpt"), ("E", "vit-b16-amp-bf16-b64-ckpt"), ("F", "t5-base-amp-bf16-b16"),
          ("F", "deepseek-v3-small-amp-bf16-b4"), ("F", "qwen3-0.6b-bf16-b8-ckpt"), ("F", "gemma2-2b-amp-bf16-b2"),
          ("L", "llama-1b-lora-r32-qkvo-fp32base-amp-b4-ckpt"), ("F", "qwen3-0.6b-amp-bf16-b4")]


# issue 13, stop 28 (docs/STEP_TIME.md "What is left", pure-bf16 steps): the host-bound pure-bf16 steps, each beside
# an AMP step of the same model, so that both are measured on one host
BF16_PAIRS = [("mlp10-bf16-b1024", "mlp10-amp-bf16-b1024"), ("llama-1b-bf16-load-dtype-b2", "llama-1b-amp-bf16-b1"),
              ("qwen3-0.6b-bf16-b8-ckpt", "qwen3-0.6b-amp-bf16-b4"),
              ("gemma2-2b-bf16-b4-ckpt", "gemma2-2b-amp-bf16-b2"),
              ("mt5-small-bf16-b32-ckpt", "mt5-small-amp-bf16-b16"),
              ("ho2-t5-small-bf16-b16-ckpt", "ho-t5-small-amp-bf16-b32"),
              ("ho4-flan-t5-base-bf16-b4", "ho5-t5-base-amp-bf16-b8"),
              ("ho-flan-t5-base-bf16-b16-ckpt", "ho2-flan-t5-base-amp-bf16-b8-ckpt")]


def series_cases():
    """Every step-time case of the shared and extra collectors, the encoder-decoders, the families, LoRA and MoE: id ->
    (runner, case)."""
    import collect as G
    import collect_more as M
    import collect_encdec as E
    X = load(os.path.join(HERE, "extra.py"), "extra_cases")
    cases = {c["id"]: (G.run_case, c) for c in G.CASES}
    cases.update({X.cid(c): (G.run_case, dict(c, id=X.cid(c))) for c in X.CASES})
    cases.update({c["id"]: (fn, c) for fn, c in E.CASES})
    cases.update({c["id"]: (M.run_family, c) for c in M.FAM})
    cases.update({c["id"]: (M.run_ft, c) for c in M.FT})
    O = load(os.path.join(HERE, "collect_moe.py"), "collect_moe")
    cases.update({c["id"]: (M.run_family, c) for c in O.CASES})
    return cases


def heldout_cases(keep=lambda c: True):
    """The training cases of the families set and the five held-out sets (families and LoRA) that `keep` accepts,
    in that order: id -> (runner, case). Each held-out script rewrites collect_heldout.FAM and .FT in place when
    imported, so its cases are copied right after its import."""
    import collect_more as M
    cases = {c["id"]: (M.run_family, c) for c in M.FAM if keep(c)}
    for n in range(1, 6):
        name = "collect_heldout" if n == 1 else "collect_heldout%d" % n
        load(os.path.join(HERE, "heldout", name + ".py"), name)
        H = sys.modules["collect_heldout"]
        cases.update({c["id"]: (M.run_family, dict(c)) for c in H.FAM if keep(c)})
        cases.update({c["id"]: (M.run_ft, dict(c)) for c in H.FT if keep(c)})
    return cases


def named_cases(ids):
    """Every step-time case of series_cases and heldout_cases: id -> (runner, case); exits naming any of `ids` that
    none of them has."""
    cases = series_cases()
    cases.update(heldout_cases())
    missing = [cid for cid in ids if cid not in cases]
    if missing:
        sys.exit("unknown case " + ", ".join(missing))
    return cases


def run_named(fn, c, steps, out):
    """Case c by its collector's runner fn at `steps` steps: the families' and LoRA's runners take the output folder,
    collect.py's and the U-Net's not. Returns the runner's case line."""
    c = dict(c, steps=steps)
    return fn(c) if fn.__code__.co_argcount == 1 else fn(c, out)


def t5_cases():
    """The T5 family's training cases (t5, flan-t5, mt5) of the families set and the five held-out sets."""
    return {k: v for k, v in heldout_cases(lambda c: "t5" in c["model"]).items() if v[0].__name__ == "run_family"}


def set_steps(out, nsteps=16, which="steps", ids=()):
    """Every step's time (between the step loop's own synchronizes, recorded by wrapping torch.cuda.synchronize)
    and the SM clock after it (NVML through torch.cuda.clock_rate), at `nsteps` steps, twice (the second pass in
    reverse order): SERIES's cases (which "steps": OUTDIR/steps/steps.jsonl), BF16_PAIRS's (which "bf16steps") or
    every T5-family case (which
    "t5steps": OUTDIR/t5steps/steps.jsonl, issue 13: identical T5 cases measured 30 % apart at the median, against
    4.7 % for the other families, docs/STEP_TIME.md "What is left"); each span with the milliseconds the garbage
    collector took in it (gc_ms) and its full collections (gc_full)."""
    import collect as G
    import collect_more as M
    M.warmup()
    if which == "t5steps":
        cases = t5_cases()
        order = list(cases)
    elif which == "bf16steps":
        cases = series_cases()
        cases.update(t5_cases())
        order = [cid for pair in BF16_PAIRS for cid in pair]
    elif which == "series":
        cases = named_cases(ids)
        order = ids
    else:
        cases = series_cases()
        order = [cid for _, cid in SERIES]
    marks = []
    sync = torch.cuda.synchronize
    # Python's garbage collector (gc.callbacks): seconds spent in collections and the full (generation 2) ones,
    # cumulative, read at each mark, so that each span gets its own (a step whose host stalls in a collection)
    gcs = dict(t0=0.0, s=0.0, full=0)

    def on_gc(phase, info):
        if phase == "start":
            gcs["t0"] = time.perf_counter()
        else:
            gcs["s"] += time.perf_counter() - gcs["t0"]
            gcs["full"] += info.get("generation") == 2

    def timed_sync(*a, **k):
        sync(*a, **k)
        t = time.perf_counter()
        try:
            clk = torch.cuda.clock_rate()
        except Exception:  # noqa: BLE001
            clk = None
        marks.append((t, clk, gcs["s"], gcs["full"]))
    gc.callbacks.append(on_gc)
    with open(os.path.join(out, "steps.jsonl"), "w") as f, open(os.path.join(out, "cases.jsonl"), "w") as fc:
        env = json.dumps(dict(env=dict(M.env_line(), host_probe=env_probe()))) + "\n"
        f.write(env)
        fc.write(env)
        for p, ids in enumerate((order, order[::-1])):
            for cid in ids:
                fn, c = cases[cid]
                pr = probe()
                marks.clear()
                torch.cuda.synchronize = timed_sync
                try:
                    r = run_named(fn, c, nsteps, out)
                finally:
                    torch.cuda.synchronize = sync
                G.cleanup()
                # the loop synchronizes at each step's start and end: the step is the span of each such pair
                ts = [(marks[i + 1][0] - marks[i][0]) * 1e3 for i in range(len(marks) - 1)]
                gc_ms = [round((marks[i + 1][2] - marks[i][2]) * 1e3, 3) for i in range(len(marks) - 1)]
                gc_full = [marks[i + 1][3] - marks[i][3] for i in range(len(marks) - 1)]
                clk = [m[1] for m in marks]
                line = dict(kind="step_series", id=cid, run=p + 1, step_ms_protocol=r.get("step_ms"),
                            spans_ms=[round(t, 3) for t in ts], clocks_mhz=clk, host_probe_us=pr,
                            gc_ms=gc_ms, gc_full=gc_full)
                f.write(json.dumps(line) + "\n"); f.flush()
                # the runner's own line (its collector's schema, nsteps steps): a measurement of the case
                fc.write(json.dumps(dict(r, host_probe_us=pr)) + "\n"); fc.flush()
                print(cid, p + 1, "protocol %.1f" % r.get("step_ms", 0), "spans", [round(t, 1) for t in ts][-8:],
                      "clk", clk[-3:], "gc_ms", gc_ms[-8:], flush=True)
    gc.callbacks.remove(on_gc)


def main():
    if sys.argv[1:] == ["--probe"]:
        # the figure `vramplan plan --host-probe-us` takes: this machine's host
        print(probe())
        return
    outdir, which = sys.argv[1], sys.argv[2]
    if (which == "series") != (len(sys.argv) > 3):
        sys.exit("usage: collect_hostprobe.py OUTDIR SET, or OUTDIR series ID...")
    out = os.path.join(outdir, which)
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    if which in ("steps", "t5steps", "bf16steps"):
        set_steps(out, which=which)
    elif which == "series":
        set_steps(out, which=which, ids=sys.argv[3:])
    elif which == "host":
        set_host(out)
    elif which == "cases":
        set_cases(out)
    elif which == "extra":
        set_extra(out)
    elif which in ("finetune", "families"):
        set_more(out, "lora" if which == "finetune" else "families")
    elif which == "moe":
        set_moe(out)
    elif which == "encdec":
        set_encdec(out)
    elif which.startswith("ho") and which[2:].isdigit():
        set_heldout(out, int(which[2:]))
    else:
        sys.exit("unknown set " + which)
    print("set", which, "done in %.1f s" % (time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
