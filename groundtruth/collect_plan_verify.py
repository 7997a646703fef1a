"""Per-rank ground truth for the cluster planner's verified PyTorch plans (docs/CLUSTER.md "Verification of
PyTorch layouts"): the run a plan of DDP, DDP + ZeroRedundancyOptimizer, FSDP1 or FSDP2 at tp = pp = 1 stands for, measured as the planner simulates it.

Not yet measured (no GPU was lent when the planner's verification was written); run on 2 (or 8) H200s:

    torchrun --nproc_per_node=2 groundtruth/collect_plan_verify.py OUT.jsonl [filter]

The protocol is shared/groundtruth/collect_dist.py's (its wrappers, warm-up, step loop and fields; imported), with
what the planner's simulation assumes and that file's protocol does not:

- `cleanup_after_wrap: false`: no gc.collect() / torch.cuda.empty_cache() once the wrapper is built (the planner,
  like `estimate --strategy`, keeps FSDP's construction blocks cached: 1.8 GiB more reserved than the measured
  protocol on gpt2-medium FSDP1 b8 at world 2);
- `accum`: micro-batches a step (the planner simulates at most 3 and takes the rest to repeat the peak);
- `ckpt`: every decoder layer checkpointed (the plan's full recomputation);
- `init: cpu`: FSDP1 built from the model on the host with `device_id` (one unit moved at a time), the way a
  large-model plan is run; the planner keeps the formula where the simulated construction from the whole model
  on the GPU is the peak, and this case gives the rule to replace it.

Each line is collect_dist.py's schema plus `accum`, `cleanup_after_wrap` and `init`; check a line against the
planner with `vramplan estimate MODEL --strategy S --world N --batch B --accum min(A, 3) --steps 3 ...` (peak
allocated: less the 34,603,008 B of cuBLAS workspaces the warm-up made before the baseline).
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.join(HERE, "..", ".shared"), os.path.join(HERE, "..", "..", "shared", "groundtruth")):
    if os.path.exists(os.path.join(p, "collect_dist.py")):
        sys.path.insert(0, p)
        break
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import collect_dist as D  # noqa: E402  (the shared protocol: wrap, warm-up, step loop)
import collect_more as M  # noqa: E402  (summarize: the case's figures in the shared schema)

G = D.G


def run_case(c, rank, world, local_rank):
    name, b, accum = c["model"], c["batch"], c["accum"]
    strategy, mp = c["strategy"], c["mixed_precision"]
    torch.manual_seed(rank)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    if c["init"] == "cpu":
        G.DEV, dev = "cpu", G.DEV
        try:
            m, fam, seq = G.build(name, "sdpa", c["ckpt"])
        finally:
            G.DEV = dev
    else:
        m, fam, seq = G.build(name, "sdpa", c["ckpt"])
    m.train()
    nparam = sum(p.numel() for p in m.parameters())
    m = D.wrap(m, fam, strategy, mp, local_rank)
    build_peak = torch.cuda.max_memory_allocated() - base
    if c["cleanup_after_wrap"]:
        G.cleanup()
    if strategy == "ddp-zero1":  # as collect_dist.py
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
    else:
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ac = mp and strategy.startswith("ddp")
    r = dict(c, fam=fam, seq=seq, params=nparam, world=world, rank=rank, local_world=world,
             prec=("amp-bf16" if ac else "fsdp-mp-bf16" if mp else "fp32"),
             build_peak_alloc=build_peak, after_model=torch.cuda.memory_allocated() - base)
    steps_out, times = [], []
    for s in range(c["steps"]):
        dist.barrier(); torch.cuda.synchronize(); t0 = time.perf_counter()
        torch.cuda.reset_peak_memory_stats()
        ph = {"start": torch.cuda.memory_allocated() - base}
        fwd = bwd = 0
        for k in range(accum):
            batch = G.make_batch(fam, name, b, seq)
            torch.cuda.reset_peak_memory_stats()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=ac):
                loss = G.loss_of(m, fam, batch) / accum
            fwd = max(fwd, torch.cuda.max_memory_allocated() - base)
            ph["after_fwd"] = torch.cuda.memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
            loss.backward()
            bwd = max(bwd, torch.cuda.max_memory_allocated() - base)
            ph["after_bwd"] = torch.cuda.memory_allocated() - base
            del loss, batch
        ph["fwd_peak"], ph["bwd_peak"] = fwd, bwd
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        ph["opt_peak"] = torch.cuda.max_memory_allocated() - base
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
        ph["end"] = torch.cuda.memory_allocated() - base
        ph["reserved"] = torch.cuda.memory_reserved()
        steps_out.append(ph)
    M.summarize(r, steps_out, times)
    del m, opt
    return r


CASES = []


def add(model, batch, strategy, accum=1, ckpt=False, cleanup_after_wrap=False, init="cuda", mp=True, steps=4):
    tag = {"ddp-bucket-view": "ddpbv", "fsdp-full": "fsdp1full", "fsdp-grad-op": "fsdp1gradop", "fsdp2": "fsdp2",
           "ddp-zero1": "zero1"}[strategy]
    cid = (f"plan-{model}-{tag}-{'bf16' if mp else 'fp32'}-b{batch}x{accum}" + ("-ckpt" if ckpt else "")
           + ("-cleanup" if cleanup_after_wrap else "") + ("-cpuinit" if init == "cpu" else ""))
    CASES.append(dict(id=cid, model=model, batch=batch, strategy=strategy, mixed_precision=mp, opt="adamw",
                      attn="sdpa", ckpt=ckpt, accum=accum, cleanup_after_wrap=cleanup_after_wrap, init=init,
                      steps=steps))


# the planner's script: no cleanup after the wrapper is built
for s in ("ddp-bucket-view", "fsdp-full", "fsdp-grad-op"):
    add("gpt2-medium", 8, s)
    add("gpt2-medium", 4, s, accum=4)
    add("gpt2-medium", 8, s, ckpt=True)
# the planner's fsdp2 (torchtitan's MixedPrecisionPolicy: collect_dist.py's wrap) and ddp-zero1 plans with
# accumulation and checkpointing (the shared file has them at b8 x 1 only)
for s in ("fsdp2", "ddp-zero1"):
    add("gpt2-medium", 4, s, accum=4)
    add("gpt2-medium", 8, s, ckpt=True)
# the shared file's protocol, for the pairing (the same runs with the cleanup)
add("gpt2-medium", 8, "fsdp-full", cleanup_after_wrap=True)
add("gpt2-medium", 8, "fsdp-grad-op", cleanup_after_wrap=True)
# a model whose fp32 weights outweigh its step at micro-batch 1 with checkpointing: built from the GPU, then from
# the host with device_id (the construction a large-model plan uses)
add("llama-1b", 1, "fsdp-full", ckpt=True)
add("llama-1b", 1, "fsdp-full", ckpt=True, init="cpu")
add("llama-1b", 2, "fsdp-grad-op", accum=4, init="cpu")


def main():
    out = sys.argv[1]
    filt = sys.argv[2] if len(sys.argv) > 2 else ""
    D.CASES[:] = [c for c in CASES if not filt or filt in c["id"]]
    D.run_case = run_case
    sys.argv = [sys.argv[0], out]
    D.main()


if __name__ == "__main__":
    main()
