"""Allocator event traces of fine-tuning, new-family, generate() and data-parallel cases (collect_more.py's and
collect_dist_more.py's protocols), for reading the simulator's rules off them.

    python3 groundtruth/trace_more.py OUTDIR [id-filter]
    torchrun --nproc_per_node=1 groundtruth/trace_more.py OUTDIR dist [id-filter]   # world-1 wrappers
    python3 groundtruth/trace_more.py OUTDIR fake W R [id-filter]                   # fake process group

Each trace is OUTDIR/<id>[-wW-rR].trace.jsonl.gz: a first line with the case and its measured peaks, then one
event per line, [action, addr, size, stream, frames] with up to 8 Python frames, innermost first (the format of
shared/groundtruth/traces). Training cases run 2 steps; generate cases one generate() call of fewer new tokens.
"""
import gzip, json, os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collect_more as M  # noqa: E402
import torch  # noqa: E402

G = M.G


def dump(path, head, snap):
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(dict(head, note="action,addr,size,stream,frames(innermost first, up to 8)")) + "\n")
        for trace in snap["device_traces"][:1]:
            for e in trace:
                fr = [f"{os.path.basename(x['filename'])}:{x['line']}:{x['name']}" for x in e.get("frames", [])
                      if "torch/cuda/memory" not in x["filename"]][:8]
                f.write(json.dumps([e["action"], e["addr"], e["size"], e.get("stream", 0), fr]) + "\n")


def traced(fn, c, path):
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, context="alloc", stacks="python")
    r = fn(dict(c), None)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    head = {k: r[k] for k in r if k in ("id", "peak_alloc", "peak_reserved", "steps", "runs", "after_model",
                                        "kv_cache_bytes", "setup_peak", "trainable_params", "params")}
    head["case"] = {k: v for k, v in c.items() if not k.startswith("_")}
    dump(path, head, snap)
    G.cleanup()



def trace_all(cases, out, filt="", steps=3):
    """Each (runner, case) of `cases` traced for `steps` steps (None: the case's own) into OUT/<id>.trace.jsonl.gz,
    after the warm-up; a case that fails is reported and the rest still run (the held-out trace scripts' loop and
    this script's single-GPU mode)."""
    os.makedirs(out, exist_ok=True)
    print("cases", [c["id"] for _, c in cases], flush=True)
    M.warmup()
    for fn, c in cases:
        if filt and filt not in c["id"]:
            continue
        t0 = time.time()
        try:
            traced(fn, c if steps is None else dict(c, steps=steps),
                   os.path.join(out, c["id"] + ".trace.jsonl.gz"))
            print("traced", c["id"], round(time.time() - t0, 1), flush=True)
        except Exception as e:
            print("trace failed", c["id"], repr(e)[:300], flush=True)
            G.cleanup()

FT = {c["id"]: c for c in M.FT}
FAM = {c["id"]: c for c in M.FAM}
TRACES = [
    (M.run_ft, dict(FT["llama-1b-lora-r16-qv-bf16base-amp-b4"], id="llama-1b-lora-r16-qv-bf16base-amp-b2-s512",
                    batch=2, seq=512, steps=2)),
    (M.run_ft, dict(FT["llama-1b-lora-r16-all-bf16base-amp-b8-ckpt"], id="llama-1b-lora-r16-all-bf16base-amp-b2-s512-ckpt",
                    batch=2, seq=512, steps=2)),
    (M.run_ft, dict(FT["gpt2-medium-lora-r32-attn-fp32base-amp-b8"], id="gpt2-medium-lora-r32-attn-fp32base-amp-b2",
                    batch=2, seq=512, steps=2)),
    (M.run_ft, dict(FT["llama-1b-dora-r16-qv-bf16base-amp-b2"], id="llama-1b-dora-r16-qv-bf16base-amp-b1-s512",
                    batch=1, seq=512, steps=2)),
    (M.run_ft, dict(FT["llama-1b-freeze-embed-l0-15-amp-b4"], id="llama-1b-freeze-embed-l0-15-amp-b1-s512",
                    batch=1, seq=512, steps=2)),
    (M.run_ft, dict(FT["llama-1b-bf16-load-cast-b2"], id="llama-1b-bf16-load-cast-b1-s512", batch=1, seq=512,
                    steps=2)),
    (M.run_family, dict(FAM["qwen3-0.6b-amp-bf16-b4"], id="qwen3-0.6b-amp-bf16-b1-s512", batch=1, seq=512, steps=2)),
    (M.run_family, dict(FAM["gemma2-2b-amp-bf16-b2"], id="gemma2-2b-amp-bf16-b1-s512", batch=1, seq=512, steps=2)),
    (M.run_family, dict(FAM["gemma3-1b-amp-bf16-b4"], id="gemma3-1b-amp-bf16-b1-s512", batch=1, seq=512, steps=2)),
    (M.run_family, dict(FAM["qwen3-moe-small-amp-bf16-b4"], id="qwen3-moe-small-amp-bf16-b1-s512", batch=1, seq=512,
                        steps=2)),
    (M.run_family, dict(FAM["qwen2-moe-small-amp-bf16-b4"], id="qwen2-moe-small-amp-bf16-b1-s512", batch=1, seq=512,
                        steps=2)),
    (M.run_family, dict(FAM["deepseek-v3-small-amp-bf16-b4"], id="deepseek-v3-small-amp-bf16-b1-s512", batch=1,
                        seq=512, steps=2)),
    (M.run_family, dict(FAM["phi3-mini-16l-amp-bf16-b2"], id="phi3-mini-16l-amp-bf16-b1-s512", batch=1, seq=512,
                        steps=2)),
    (M.run_family, dict(FAM["t5-base-amp-bf16-b16"], id="t5-base-amp-bf16-b2-s256-t64", batch=2, seq=256, target=64,
                        steps=2)),
    (M.run_family, dict(FAM["mt5-small-bf16-b32-ckpt"], id="mt5-small-bf16-b2-s256-t64-ckpt", batch=2, seq=256,
                        target=64, steps=2)),
]


def gen_case(model, b, p, n, cache="dynamic", sample=False, pad=False):
    cid = f"{model}-gen-b{b}-p{p}-n{n}-{cache}" + ("-sample" if sample else "") + ("-pad" if pad else "")
    return dict(id=cid, model=model, batch=b, cache=cache,
                generate=dict(prompt=p, new_tokens=n, sample=sample, pad=pad), reps=1)


TRACES += [(M.run_generate, gen_case("llama-1b", 8, 1024, 16)),
           (M.run_generate, gen_case("llama-1b", 8, 1024, 16, cache="static")),
           (M.run_generate, gen_case("qwen2-0.5b", 16, 256, 16, sample=True)),
           (M.run_generate, gen_case("llama-1b", 4, 512, 8, pad=True)),
           (M.run_generate, gen_case("gemma2-2b", 2, 512, 8)),
           (M.run_generate, gen_case("deepseek-v3-small", 4, 512, 8)),
           (M.run_generate, gen_case("gpt2-medium", 4, 256, 8))]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    mode = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] in ("dist", "fake") else "single"
    if mode == "single":
        trace_all(TRACES, out, sys.argv[2] if len(sys.argv) > 2 else "", steps=None)
        return
    import torch.distributed as dist
    import collect_dist_more as D
    if mode == "dist":
        lr = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(lr)
        dist.init_process_group("nccl", device_id=torch.device("cuda", lr))
        filt = sys.argv[3] if len(sys.argv) > 3 else ""
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore
        torch.cuda.set_device(0)
        dist.init_process_group("fake", rank=int(sys.argv[4]), world_size=int(sys.argv[3]), store=FakeStore())
        filt = sys.argv[5] if len(sys.argv) > 5 else ""
    rank, world = dist.get_rank(), dist.get_world_size()
    D.warmup(world)
    pg = "nccl" if mode == "dist" else "fake"
    for c in D.CASES:
        c = dict(c)
        if not filt or not any(x == c["id"] for x in filt.split(",")):
            continue
        if c.get("mesh") == "HALF":
            c["mesh"] = [2, world // 2]
        try:
            D.trace_case(c, rank, world, pg, os.path.join(out, f"{c['id']}-w{world}-r{rank}.trace.jsonl.gz"))
            print("traced", c["id"], world, rank, flush=True)
        except Exception as e:
            print("trace failed", c["id"], repr(e)[:200], flush=True)
            G.cleanup()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
