#!/usr/bin/env python3
"""One trial of a max-batch search: two real training steps on the GPU.

The model, batch, loss and step are those of shared/groundtruth/collect.py
(copied below, unchanged in what they allocate), so that `vramplan probe`
can be checked against the measured largest batches there:

    python3 scripts/train_step.py --model gpt2-small --prec amp-bf16 \
        --budget-gib 16 --batch 10

As collect.py's `maxbatch` mode does, it runs a first small matmul (the
main thread's cuBLAS workspace), caps the caching allocator with
torch.cuda.set_per_process_memory_fraction(budget / total), builds the
model and runs `--steps` (2) training steps at the batch. It exits 0 when
they ran and prints one JSON line of peaks; on out-of-memory the
torch.OutOfMemoryError propagates (PyTorch prints "torch.OutOfMemoryError:
CUDA out of memory ..." on stderr and the exit status is 1).

collect.py's search ran every trial in one process, so from its second
trial on the backward thread's cuBLAS workspace and the cuBLASLt workspace
already existed. Each run of this script is a fresh process, like a user's
own training command; --warmup first runs one batch-1 step and frees it,
to reproduce collect.py's later trials instead.
"""
import argparse
import gc
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "cuda"
GiB = 1 << 30

# ---- copied from shared/groundtruth/collect.py --------------------------

MODELS = {
    # name: (family, config kwargs, default seq)
    "gpt2-small":  ("gpt2", dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024), 1024),
    "gpt2-medium": ("gpt2", dict(n_layer=24, n_embd=1024, n_head=16, vocab_size=50257, n_positions=1024), 1024),
    "gpt2-large":  ("gpt2", dict(n_layer=36, n_embd=1280, n_head=20, vocab_size=50257, n_positions=1024), 1024),
    "gpt2-xl":     ("gpt2", dict(n_layer=48, n_embd=1600, n_head=25, vocab_size=50257, n_positions=1024), 1024),
    "llama-1b":    ("llama", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048), 2048),
    "llama-7b":    ("llama", dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                                  num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096), 2048),
    "mixtral-small": ("mixtral", dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=8, num_attention_heads=16,
                                  num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                                  max_position_embeddings=2048), 1024),
    "bert-base":   ("bert", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072), 512),
    "bert-large":  ("bert", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096), 512),
    "resnet50":    ("tv", dict(name="resnet50"), 224),
    "vit-b16":     ("tv", dict(name="vit_b_16"), 224),
    "mlp10":       ("mlp", dict(width=4096, layers=10, classes=1000), 4096),
}


def hf_causal(kind, **kw):
    import transformers as T
    if kind == "gpt2":
        cfg = T.GPT2Config(**kw)
    elif kind == "llama":
        cfg = T.LlamaConfig(**kw)
    elif kind == "mixtral":
        cfg = T.MixtralConfig(**kw)
    return cfg


class MLP(nn.Module):
    def __init__(self, width, layers, classes):
        super().__init__()
        mods = []
        for _ in range(layers - 1):
            mods += [nn.Linear(width, width), nn.ReLU()]
        mods.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*mods)

    def forward(self, x):
        return self.net(x)


class CkptSeq(nn.Module):
    """Wrap torchvision stages with non-reentrant checkpointing."""
    def __init__(self, m):
        super().__init__(); self.m = m

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.m, x, use_reentrant=False)


def build(name, attn, ckpt):
    fam, kw, seq = MODELS[name]
    if fam in ("gpt2", "llama", "mixtral"):
        import transformers as T
        cfg = hf_causal(fam, **kw)
        with torch.device(DEV):
            m = T.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    elif fam == "bert":
        import transformers as T
        cfg = T.BertConfig(**kw)
        with torch.device(DEV):
            m = T.BertForMaskedLM._from_config(cfg, attn_implementation=attn)
    elif fam == "tv":
        import torchvision
        m = getattr(torchvision.models, kw["name"])(weights=None).to(DEV)
        if ckpt:
            if kw["name"].startswith("resnet"):
                for s in ("layer1", "layer2", "layer3", "layer4"):
                    setattr(m, s, CkptSeq(getattr(m, s)))
            else:
                layers = m.encoder.layers
                for i in range(len(layers)):
                    layers[i] = CkptSeq(layers[i])
    elif fam == "mlp":
        m = MLP(**kw).to(DEV)
        if ckpt:
            m.net = nn.Sequential(*[CkptSeq(l) if isinstance(l, nn.Linear) else l for l in m.net])
    if ckpt and fam in ("gpt2", "llama", "mixtral", "bert"):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return m, fam, seq


def make_batch(fam, name, b, seq):
    if fam in ("gpt2", "llama", "mixtral", "bert"):
        V = MODELS[name][1].get("vocab_size", 30522)
        ids = torch.randint(0, V, (b, seq), device=DEV)
        return dict(input_ids=ids, labels=ids.clone())
    if fam == "tv":
        return dict(x=torch.randn(b, 3, seq, seq, device=DEV), y=torch.randint(0, 1000, (b,), device=DEV))
    return dict(x=torch.randn(b, MODELS[name][1]["width"], device=DEV), y=torch.randint(0, 1000, (b,), device=DEV))


def loss_of(m, fam, batch):
    if fam in ("gpt2", "llama", "mixtral", "bert"):
        return m(**batch).loss
    return F.cross_entropy(m(batch["x"]), batch["y"])


def run_case(c):
    """collect.py's run_case: build, then `steps` training steps; returns
    the peaks (an OutOfMemoryError propagates)."""
    name, b = c["model"], c["batch"]
    prec, ckpt, opt_name = c.get("prec", "fp32"), c.get("ckpt", False), c.get("opt", "adamw")
    attn = c.get("attn", "sdpa")
    set_to_none = c.get("set_to_none", True)
    steps = c.get("steps", 4)
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m, fam, seq = build(name, attn, ckpt)
    seq = c.get("seq", seq)
    if prec == "bf16":
        m = m.to(torch.bfloat16)
    if prec == "fp16-pure":
        m = m.to(torch.float16)
    m.train()
    if opt_name == "adamw":
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    elif opt_name == "adamw-fused":
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    elif opt_name == "adamw-forloop":
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=False)
    elif opt_name == "sgd":
        opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    elif opt_name == "adafactor":
        opt = torch.optim.Adafactor(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda") if prec == "amp-fp16" else None
    ac_dtype = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(prec)
    peak, peak_res, times = 0, 0, []
    for s in range(steps):
        accum = c.get("accum", 1)
        batch = make_batch(fam, name, b, seq)
        if prec in ("bf16", "fp16-pure") and "x" in batch:
            batch["x"] = batch["x"].to(next(m.parameters()).dtype)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        torch.cuda.reset_peak_memory_stats()
        for a in range(accum):
            if a:
                del loss
                batch = make_batch(fam, name, b, seq)
            with torch.autocast("cuda", dtype=ac_dtype, enabled=ac_dtype is not None):
                loss = loss_of(m, fam, batch) / accum
            peak = max(peak, torch.cuda.max_memory_allocated() - base)
            peak_res = max(peak_res, torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()
            (scaler.scale(loss) if scaler else loss).backward()
        peak = max(peak, torch.cuda.max_memory_allocated() - base)
        peak_res = max(peak_res, torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()
        if scaler:
            scaler.step(opt); scaler.update()
        else:
            opt.step()
        peak = max(peak, torch.cuda.max_memory_allocated() - base)
        peak_res = max(peak_res, torch.cuda.max_memory_reserved())
        opt.zero_grad(set_to_none=set_to_none)
        del loss
        del batch
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
    st = torch.cuda.memory_stats()
    r = dict(peak_alloc=peak, peak_reserved=peak_res,
             num_alloc_retries=st["num_alloc_retries"],
             step_ms=sorted(times)[len(times) // 2] * 1e3)
    del m, opt, scaler
    return r


def cleanup():
    gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()

# ---- the trial -------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--prec", default="fp32",
                   choices=["fp32", "amp-bf16", "amp-fp16", "bf16", "fp16-pure"])
    p.add_argument("--budget-gib", type=float, required=True,
                   help="allocator cap in GiB (set_per_process_memory_fraction)")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seq", type=int)
    p.add_argument("--ckpt", action="store_true")
    p.add_argument("--opt", default="adamw")
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--warmup", action="store_true",
                   help="first run one batch-1 step, as collect.py's earlier trials did")
    a = p.parse_args()
    if a.batch < 1:
        p.error("--batch must be >= 1")

    t0 = time.time()
    torch.ones(1, device=DEV) @ torch.ones(1, 1, device=DEV)   # as collect.py main()
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(a.budget_gib * GiB / total)
    c = dict(model=a.model, prec=a.prec, ckpt=a.ckpt, opt=a.opt, attn=a.attn)
    if a.seq:
        c["seq"] = a.seq
    if a.warmup:
        run_case(dict(c, batch=1, steps=1))
        cleanup()
    r = run_case(dict(c, batch=a.batch, steps=a.steps))
    r.update(model=a.model, prec=a.prec, batch=a.batch, budget_gib=a.budget_gib,
             warmup=a.warmup, wall_s=round(time.time() - t0, 2))
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
