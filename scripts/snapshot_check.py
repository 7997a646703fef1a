#!/usr/bin/env python3
"""Check vramplan's simulated snapshot with PyTorch's own tools, on a GPU.

    python3 scripts/snapshot_check.py --ours OURS.pickle --out DIR \
        [--model gpt2-small --prec amp-bf16 --batch 8 --seq 1024 --steps 4]

1. Loads OURS.pickle (written by `vramplan estimate ... --snapshot`) and
   renders it with torch.cuda._memory_viz: segsum (the `stats` view),
   trace (the Pythonic event list), segments and memory (the flamegraph
   input, with the collapsed stacks written as text instead of calling
   flamegraph.pl), trace_plot and segment_plot (HTML pages for the viewer).
2. Takes a real snapshot of the same training steps (the model, batch and
   step of shared/groundtruth/collect.py, through scripts/train_step.py)
   with torch.cuda.memory._record_memory_history and _dump_snapshot, and
   renders it the same way.
3. Compares the two: the keys of the top level, of segments, blocks and
   trace entries, the trace's actions, and the figures (peak of the
   requested bytes in the trace, reserved bytes at the end, segments).
4. Copies torch's viewer (torch/utils/viz/*.js) to DIR/viewer, so that
   scripts/memory_viz_render.sh can show both snapshots in it off-line,
   where the wheel has it (torch 2.11.0's has not: viewer_files is then
   empty, and the viewer is taken from PyTorch's source tree).

Writes DIR/summary.json and prints it. Exit 0 when torch's tools read our
file and the key sets agree (keys only the real snapshot has are listed,
not errors: a newer torch may add some)."""
import argparse
import glob
import json
import os
import pickle
import shutil
import sys
import time

import torch
from torch.cuda import _memory_viz as mv

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def collapsed(text):
    """Stand-in for flamegraph.pl: keep the collapsed stacks as text."""
    return text


def render(name, data, out):
    """Run torch's readers over a snapshot; returns what each produced."""
    res = {}
    views = {
        "stats": lambda: mv.segsum(data),
        "trace": lambda: mv.trace(data),
        "segments": lambda: mv.segments(data, format_flamegraph=collapsed),
        "memory": lambda: mv.memory(data, format_flamegraph=collapsed),
        "trace_plot": lambda: mv.trace_plot(data),
        "segment_plot": lambda: mv.segment_plot(data),
    }
    for view, fn in views.items():
        t = time.time()
        try:
            text = fn()
        except Exception as e:  # report, keep going
            res[view] = "FAILED: %s: %s" % (type(e).__name__, e)
            continue
        ext = "html" if view.endswith("plot") else "txt"
        path = os.path.join(out, "%s-%s.%s" % (name, view, ext))
        with open(path, "w") as f:
            f.write(text)
        res[view] = "ok, %d chars in %.2f s" % (len(text), time.time() - t)
    return res


def keys(data):
    segs = data.get("segments", [])
    blocks = [b for s in segs for b in s.get("blocks", [])]
    trace = [e for d in data.get("device_traces", []) for e in d]
    union = lambda items: sorted(set().union(*[set(i) for i in items])) \
        if items else []
    return {
        "top": sorted(data),
        "segment": union(segs),
        "block": union(blocks),
        "trace_entry": union(trace),
        "actions": sorted({e["action"] for e in trace}),
        "settings": sorted(data.get("allocator_settings", {})),
    }


def figures(data):
    cur = peak = 0
    n_alloc = 0
    for d in data["device_traces"]:
        for e in d:
            if e["action"] == "alloc":
                cur += e["size"]
                peak = max(peak, cur)
                n_alloc += 1
            elif e["action"] == "free_completed":
                cur -= e["size"]
    return {
        "segments": len(data["segments"]),
        "reserved_end": sum(s["total_size"] for s in data["segments"]),
        "allocated_end": sum(s["allocated_size"] for s in data["segments"]),
        "trace_entries": sum(len(d) for d in data["device_traces"]),
        "allocs": n_alloc,
        "peak_requested_in_trace": peak,
    }


def real_snapshot(a, path):
    import train_step as ts
    torch.ones(1, device="cuda") @ torch.ones(1, 1, device="cuda")
    torch.cuda.memory._record_memory_history(max_entries=10_000_000)
    c = dict(model=a.model, prec=a.prec, ckpt=False, opt="adamw",
             attn="sdpa", batch=a.batch, steps=a.steps)
    if a.seq:
        c["seq"] = a.seq
    r = ts.run_case(c)
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ours", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="gpt2-small")
    p.add_argument("--prec", default="amp-bf16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)

    with open(a.ours, "rb") as f:
        ours = pickle.load(f)
    summary = {"torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0),
               "ours": {"render": render("ours", ours, a.out),
                        "keys": keys(ours), "figures": figures(ours)}}
    shutil.copy(a.ours, os.path.join(a.out, "ours.pickle"))

    real_path = os.path.join(a.out, "real.pickle")
    summary["real_case"] = real_snapshot(a, real_path)
    with open(real_path, "rb") as f:
        real = pickle.load(f)
    summary["real"] = {"render": render("real", real, a.out),
                       "keys": keys(real), "figures": figures(real)}

    diff = {}
    for k in summary["ours"]["keys"]:
        o, r = set(summary["ours"]["keys"][k]), set(summary["real"]["keys"][k])
        diff[k] = {"only_ours": sorted(o - r), "only_real": sorted(r - o)}
    summary["key_diff"] = diff

    viz = os.path.join(os.path.dirname(torch.__file__), "utils", "viz")
    os.makedirs(os.path.join(a.out, "viewer"), exist_ok=True)
    for js in glob.glob(os.path.join(viz, "*.js")):
        shutil.copy(js, os.path.join(a.out, "viewer"))
    summary["viewer_files"] = sorted(os.listdir(os.path.join(a.out, "viewer")))

    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
    failed = [v for v, r in summary["ours"]["render"].items()
              if r.startswith("FAILED")]
    # ours adds 'category' to trace entries (memory_viz colours by it, as
    # _profile_to_snapshot writes it) and may hold other actions
    extra = {"trace_entry": {"category"}, "actions": None}
    only_ours = [k for k, d in diff.items()
                 if extra.get(k, set()) is not None and
                 set(d["only_ours"]) - extra.get(k, set())]
    if failed or only_ours:
        print("snapshot_check: FAILED:", failed, only_ours, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
