"""MoE ground truth for vramplan's routing assumption (issue 14, part 4), measured on one H200.

Two things, with collect_more.py's protocol (imported: same builders, step loop, warm-up, output lines):

1. `cases`: training cases of the shared collect.py's mixtral-small (8 layers, 8 experts, top-2) as
   transformers 5.x runs it (its default experts implementation on a GPU, grouped_mm), written in the
   families schema (hf_config, load, attn) to OUT/moe.jsonl; its config to OUT/hf_configs/mixtral-small.json.
2. `load`: how the routers spread the tokens in those training steps, for every MoE model of the families
   file and mixtral-small: per step and per MoE layer, the busiest expert's token count over the balanced
   count (tokens x top_k / experts), the same for the busiest group of E/ep experts (ep = 2, 4, 8: what one
   expert-parallel rank receives), and the number of experts that got no token. Read off the top-k indices
   handed to the experts module (a forward pre-hook on every fused experts module; the hook is installed only
   in this pass, never in the measured cases). One line per model in OUT/moe_load.jsonl.

3. `trace`: allocator traces (trace_more.py's format) of the two families cases whose peak reserved the
   simulator under-predicts by 4-5 % (phi3-mini-16l-bf16-b4-ckpt, deepseek-v3-small-bf16-b8-ckpt), at their
   measured sizes, 2 steps, to OUT/traces/<id>.trace.jsonl.gz.

    python3 groundtruth/collect_moe.py OUT [cases|load|trace|all]
"""
import json, os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch
import collect_more as C

MOE_MODELS = ["mixtral-small", "qwen3-moe-small", "qwen2-moe-small", "deepseek-v3-small"]

CASES = []


def case(model, batch, prec, **kw):
    cid = f"{model}-{prec}-b{batch}" + ("-ckpt" if kw.get("ckpt") else "")
    CASES.append(dict(id=cid, model=model, batch=batch, prec=prec, opt="adamw", **kw))


case("mixtral-small", 4, "amp-bf16")
case("mixtral-small", 8, "bf16", ckpt=True)
case("mixtral-small", 2, "fp32")


def experts_modules(m):
    """The fused experts (MixtralExperts, Qwen3MoeExperts, Qwen2MoeExperts, DeepseekV3NaiveMoe: the
    @use_experts_implementation classes, called as experts(hidden_states, top_k_index, top_k_weights))."""
    return [mod for mod in m.modules() if hasattr(mod, "num_experts") and
            isinstance(getattr(mod, "gate_up_proj", None), torch.nn.Parameter)]


def group_max(counts, ep):
    e = counts.numel()
    if e % ep:
        return None
    return counts.view(ep, e // ep).sum(1).max().item()


def load_stats(name, steps=4, batch=4, prec="amp-bf16"):
    """The routers' spread over `steps` training steps of `name` (random init, seed 0, random tokens)."""
    torch.manual_seed(0)
    m, mt, seq = C.build_hf(name, None, None, None)
    m.train()
    mods = experts_modules(m)
    seen = []

    def hook(mod, args, kwargs):
        idx = args[1] if len(args) > 1 else kwargs.get("top_k_index")
        if idx is None or not m.training:
            return
        k = idx.shape[-1]
        tokens = idx.numel() // k
        counts = torch.bincount(idx.flatten(), minlength=mod.num_experts).float()
        bal = tokens * k / mod.num_experts
        r = dict(max_over_balanced=round(counts.max().item() / bal, 4),
                 idle_experts=int((counts == 0).sum().item()))
        for ep in (2, 4, 8):
            g = group_max(counts, ep)
            if g is not None:
                r[f"ep{ep}_max_over_balanced"] = round(g / (bal * mod.num_experts / ep), 4)
        seen.append(r)

    hs = [mod.register_forward_pre_hook(hook, with_kwargs=True) for mod in mods]
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    out = []
    for s in range(steps):
        seen.clear()
        b = C.make_batch(m, mt, batch, seq)
        with torch.autocast("cuda", dtype=C.BF, enabled=prec == "amp-bf16"):
            loss = m(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(list(seen))
    for h in hs:
        h.remove()
    del m, opt
    return dict(model=name, fam=mt, batch=batch, seq=seq, prec=prec, experts_modules=len(mods), steps=out)


def main():
    outdir, mode = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "all"
    os.makedirs(outdir, exist_ok=True)
    C.warmup()
    if mode in ("cases", "all"):
        with open(os.path.join(outdir, "moe.jsonl"), "a") as f:
            f.write(json.dumps(dict(env=C.env_line())) + "\n")
            for c in CASES:
                t0 = time.time()
                try:
                    r = C.run_family(dict(c), outdir)
                except torch.OutOfMemoryError:
                    r = dict(c, error="oom")
                C.G.cleanup()
                r["wall_s"] = round(time.time() - t0, 2)
                f.write(json.dumps(r) + "\n")
                f.flush()
                print(r["id"], r.get("error", ""), r.get("peak_alloc"), r["wall_s"], flush=True)
    if mode in ("trace", "all"):
        trace(outdir)
    if mode in ("load", "all"):
        with open(os.path.join(outdir, "moe_load.jsonl"), "a") as f:
            for name in MOE_MODELS:
                r = load_stats(name)
                C.G.cleanup()
                f.write(json.dumps(r) + "\n")
                f.flush()
                worst = max(x["max_over_balanced"] for st in r["steps"] for x in st) if r["steps"][0] else None
                print(name, "layers", len(r["steps"][0]), "worst expert / balanced", worst, flush=True)


def trace(outdir):
    import trace_more as TM
    d = os.path.join(outdir, "traces")
    os.makedirs(d, exist_ok=True)
    fam = {c["id"]: c for c in C.FAM}
    for cid in ("phi3-mini-16l-bf16-b4-ckpt", "deepseek-v3-small-bf16-b8-ckpt"):
        t0 = time.time()
        TM.traced(C.run_family, dict(fam[cid], steps=2), os.path.join(d, cid + ".trace.jsonl.gz"))
        print("traced", cid, round(time.time() - t0, 1), flush=True)


if __name__ == "__main__":
    main()
