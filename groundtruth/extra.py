"""Extra ground truth (same protocol as collect.py cases) for models and settings
outside the shared file, plus a few allocator traces. One process; a warm-up makes
the backward-thread cuBLAS workspaces first, as mlp10 does in collect.py."""
import json, os, sys, time, gzip
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "groundtruth"))
import collect as g

CASES = [
    dict(model="llama-1b", batch=1, prec="amp-bf16"),
    dict(model="llama-1b", batch=2, prec="amp-bf16", ckpt=True),
    dict(model="gpt2-large", batch=4, prec="amp-bf16"),
    dict(model="bert-large", batch=16, prec="amp-bf16"),
    dict(model="vit-b16", batch=64, prec="amp-bf16"),
    dict(model="vit-b16", batch=32, prec="fp32"),
    dict(model="resnet50", batch=32, prec="amp-bf16"),
    dict(model="resnet50", batch=96, prec="fp32", ckpt=True),
    dict(model="gpt2-small", batch=4, prec="amp-bf16", attn="eager"),
    dict(model="gpt2-medium", batch=16, prec="amp-bf16", infer=True),
]
TRACES = sys.argv[2].split(",") if len(sys.argv) > 2 else ["mlp10-bf16-b1024", "llama-1b-amp-bf16-b1", "vit-b16-amp-bf16-b64"]

def cid(c):
    return ("-".join(str(c[k]) for k in ("model", "prec")) + f"-b{c['batch']}" + ("-ckpt" if c.get("ckpt") else "")
            + (f"-{c['attn']}" if c.get("attn", "sdpa") != "sdpa" else "") + ("-infer" if c.get("infer") else ""))

def trace(c, path):
    torch.cuda.memory._record_memory_history(max_entries=3_000_000, context="alloc", stacks="python")
    r = g.run_case(dict(c, steps=2))
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    ev = snap["device_traces"][0]
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(dict(case=c["id"], peak_alloc=r["peak_alloc"], peak_reserved=r["peak_reserved"],
                                steps=r["steps"], after_model=r["after_model"])) + "\n")
        for e in ev:
            fr = [f"{os.path.basename(x['filename'])}:{x['line']}:{x['name']}" for x in e.get("frames", [])
                  if "torch/cuda/memory" not in x["filename"]][:6]
            f.write(json.dumps([e["action"], e["addr"], e["size"], e.get("stream", 0), fr]) + "\n")
    g.cleanup()

def warmup():
    """CUDA up, and the backward thread's cuBLAS workspaces made first, as mlp10 does in collect.py."""
    torch.ones(1, device="cuda") @ torch.ones(1, 1, device="cuda")
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).cuda()
    x = torch.randn(32, 64, device="cuda")
    m(x).sum().backward()
    torch.utils.checkpoint.checkpoint(m, x.requires_grad_(), use_reentrant=False).sum().backward()
    del m, x
    g.cleanup()

def env_line():
    import transformers
    return dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                total=torch.cuda.mem_get_info()[1], transformers=transformers.__version__)

if __name__ == "__main__":
    out = sys.argv[1]
    warmup()
    env = env_line()
    with open(os.path.join(out, "extra-cases.jsonl"), "w") as f:
      if len(sys.argv) <= 2:
        f.write(json.dumps(dict(env=env)) + "\n")
        for c in (CASES if len(sys.argv) <= 2 else []):
            c = dict(c, id=cid(c))
            t0 = time.time()
            try:
                r = g.run_case(c)
            except Exception as e:
                r = dict(c, error=repr(e)[:300])
            g.cleanup()
            r["wall_s"] = round(time.time() - t0, 2)
            f.write(json.dumps(r) + "\n"); f.flush()
            print(r["id"], r.get("error", ""), r.get("peak_alloc"), r.get("peak_reserved"), r["wall_s"], flush=True)
    allc = {cid(c): dict(c, id=cid(c)) for c in CASES}
    allc.update({c["id"]: c for c in g.CASES})
    for t in TRACES:
        t0 = time.time()
        try:
            trace(allc[t], os.path.join(out, t + ".trace.jsonl.gz"))
        except Exception as e:
            print("trace failed", t, repr(e)[:200])
        print("traced", t, round(time.time() - t0, 1), flush=True)
