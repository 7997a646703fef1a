"""Per-rank ground truth for data-parallel wrappers, measured on one H200.

The protocol is shared/groundtruth/collect_dist.py's (same step loop, same warm-up, same fields), with more
wrappers and two ways to run them on a single GPU:

- `nccl`: under torchrun with one process (world 1) and the NCCL backend. Every wrapper still runs its own code
  path at world 1: DDP's buckets and their rebuild in step 2, FSDP2's all-gather copy-in/copy-out and
  reduce-scatter buffers, ZeroRedundancyOptimizer. (FSDP1 turns FULL_SHARD/SHARD_GRAD_OP into NO_SHARD at world 1.)
- `fake`: one process that PyTorch believes is rank R of a world of W, through PyTorch's own fake process group
  (torch.testing._internal.distributed.fake_pg, the one its memory-tracker tests use): collectives are no-ops but
  every buffer, shard and padding is allocated with its real size on this rank, so the rank's allocations are
  those of a real W-GPU run, less NCCL's own buffers (which live outside the caching allocator). Values of the
  tensors are meaningless; memory and shapes are not. Not a multi-GPU measurement: step_ms is not recorded.

    torchrun --nproc_per_node=1 groundtruth/collect_dist_more.py OUT.jsonl nccl [filter] [TRACEDIR]
    (filter: comma-separated substrings of case ids; "=ID" matches that id exactly)
    python3 groundtruth/collect_dist_more.py OUT.jsonl fake W R [filter]

Extra fields beyond collect_dist.py's: `pg` (nccl or fake), `fsdp_version`, `param_dtype`, `reduce_dtype`,
`reshard_after_forward`, `autocast`, `mesh` (HSDP: [replicate, shard]).
"""
import os
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
import functools, gzip, json, sys, time, traceback
import torch, torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collect_more as M  # noqa: E402  (puts the shared collect.py on the path)
G = M.G
BF = torch.bfloat16
GiB = 1 << 30


def layers_of(m, fam):
    return list(m.transformer.h) if fam == "gpt2" else list(m.model.layers)


def fsdp1(m, fam, c, world):
    from torch.distributed.fsdp import (FullyShardedDataParallel as FSDP, ShardingStrategy, MixedPrecision,
                                        BackwardPrefetch)
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    cls = {type(l) for l in layers_of(m, fam)}
    pol = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=cls)
    dt = {"bf16": BF, "fp32": torch.float32}
    mp = None
    if c.get("param_dtype"):
        pd, rd = dt[c["param_dtype"]], dt[c.get("reduce_dtype", c["param_dtype"])]
        mp = MixedPrecision(param_dtype=pd, reduce_dtype=rd, buffer_dtype=pd)
    ss = {"fsdp-full": ShardingStrategy.FULL_SHARD, "fsdp-grad-op": ShardingStrategy.SHARD_GRAD_OP,
          "fsdp-hybrid": ShardingStrategy.HYBRID_SHARD, "fsdp-noshard": ShardingStrategy.NO_SHARD}[c["strategy"]]
    kw = {}
    if ss == ShardingStrategy.HYBRID_SHARD:
        from torch.distributed.device_mesh import init_device_mesh
        kw["device_mesh"] = init_device_mesh("cuda", tuple(c["mesh"]), mesh_dim_names=("replicate", "shard"))
    return FSDP(m, auto_wrap_policy=pol, sharding_strategy=ss, mixed_precision=mp, device_id=torch.cuda.current_device(),
                backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True, use_orig_params=False, **kw)


def fsdp2(m, fam, c, world):
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    from torch.distributed.device_mesh import init_device_mesh
    dt = {"bf16": BF, "fp32": torch.float32}
    pol = MixedPrecisionPolicy()
    if c.get("param_dtype"):
        pol = MixedPrecisionPolicy(param_dtype=dt[c["param_dtype"]], reduce_dtype=dt[c.get("reduce_dtype", "fp32")])
    if c.get("mesh"):
        mesh = init_device_mesh("cuda", tuple(c["mesh"]), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cuda", (world,))
    raf = c.get("reshard_after_forward", True)
    for l in layers_of(m, fam):
        fully_shard(l, mesh=mesh, mp_policy=pol, reshard_after_forward=raf)
    fully_shard(m, mesh=mesh, mp_policy=pol, reshard_after_forward=raf)
    return m


def wrap(m, fam, c, world):
    s = c["strategy"]
    if s in ("ddp", "ddp-bucket-view", "ddp-zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        dev = torch.cuda.current_device()
        return DDP(m, device_ids=[dev], gradient_as_bucket_view=(s == "ddp-bucket-view"))
    if c.get("fsdp_version") == 2:
        return fsdp2(m, fam, c, world)
    return fsdp1(m, fam, c, world)


def run_case(c, rank, world, pg):
    torch.manual_seed(rank)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m, fam, seq = M.build_hf(c["model"], "sdpa", None, None)
    seq = c.get("seq", seq)
    if c.get("ckpt"):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    nparam = sum(p.numel() for p in m.parameters())
    inner = m  # the HF model: its config (vocabulary) stays reachable under any wrapper
    m = wrap(m, fam, c, world)
    build_peak = torch.cuda.max_memory_allocated() - base
    G.cleanup()
    if c["strategy"] == "ddp-zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
    else:
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ac = c.get("autocast") == "bf16"
    r = dict(c, fam=fam, seq=seq, params=nparam, world=world, rank=rank, local_world=world, pg=pg,
             prec=("amp-bf16" if ac else "fsdp-mp-bf16" if c.get("param_dtype") == "bf16" else "fp32"),
             build_peak_alloc=build_peak, after_model=torch.cuda.memory_allocated() - base)
    steps_out, times = [], []
    for s in range(c.get("steps", 4)):
        batch = M.make_batch(inner, fam, c["batch"], seq)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        torch.cuda.reset_peak_memory_stats()
        ph = {"start": torch.cuda.memory_allocated() - base}
        with torch.autocast("cuda", dtype=BF, enabled=ac):
            loss = m(**batch).loss
        ph["fwd_peak"] = torch.cuda.max_memory_allocated() - base
        ph["after_fwd"] = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        ph["bwd_peak"] = torch.cuda.max_memory_allocated() - base
        ph["after_bwd"] = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        ph["opt_peak"] = torch.cuda.max_memory_allocated() - base
        opt.zero_grad(set_to_none=True)
        del loss, batch
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
        ph["end"] = torch.cuda.memory_allocated() - base
        ph["reserved"] = torch.cuda.memory_reserved()
        steps_out.append(ph)
    st = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    keys = ("fwd_peak", "bwd_peak", "opt_peak")
    r.update(steps=steps_out, peak_alloc=max(max(p[k] for k in keys) for p in steps_out),
             peak_alloc_steady=max(steps_out[-1][k] for k in keys),
             peak_reserved=st["reserved_bytes.all.peak"], num_alloc_retries=st["num_alloc_retries"],
             device_used=total - free)
    if pg == "nccl":
        r["step_ms"] = sorted(times[1:])[len(times[1:]) // 2] * 1e3
    del m, opt, inner
    return r


CASES = []


def add(model, batch, strategy, **kw):
    tag = {"ddp": "ddp", "ddp-bucket-view": "ddpbv", "ddp-zero1": "zero1", "fsdp-full": "fsdp1full",
           "fsdp-grad-op": "fsdp1gradop", "fsdp-hybrid": "fsdp1hybrid", "fsdp-noshard": "fsdp1noshard"}.get(strategy)
    if kw.get("fsdp_version") == 2:
        tag = "fsdp2hsdp" if kw.get("mesh") else "fsdp2"
        if kw.get("reshard_after_forward") is False:
            tag += "-noreshard"
    mp = "bf16" if (kw.get("autocast") or kw.get("param_dtype")) == "bf16" else "fp32"
    cid = f"{model}-{tag}-{mp}-b{batch}" + ("-ckpt" if kw.get("ckpt") else "")
    if strategy.startswith("fsdp") and "fsdp_version" not in kw:
        kw["fsdp_version"] = 1
    CASES.append(dict(id=cid, model=model, batch=batch, strategy=strategy, opt="adamw", attn="sdpa",
                      ckpt=kw.pop("ckpt", False), mixed_precision=mp == "bf16", **kw))


for model, b in (("gpt2-medium", 4), ("llama-1b", 2)):
    add(model, b, "ddp", autocast="bf16")
    add(model, b, "ddp-bucket-view", autocast="bf16")
    add(model, b, "ddp-zero1", autocast="bf16")
    add(model, b, "fsdp-full", param_dtype="bf16", reduce_dtype="bf16")
    add(model, b, "fsdp-grad-op", param_dtype="bf16", reduce_dtype="bf16")
    add(model, b, "fsdp-full", param_dtype="bf16", reduce_dtype="bf16", ckpt=True)
    add(model, b, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32")
    add(model, b, "fsdp2", fsdp_version=2)
    add(model, b, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32", reshard_after_forward=False)
    add(model, b, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32", ckpt=True)
# the shared 2-GPU file's FSDP configurations, for checking the fake process group against real ranks
add("gpt2-medium", 8, "fsdp-full", param_dtype="bf16", reduce_dtype="bf16")
add("gpt2-medium", 8, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32")
for model, b in (("gpt2-medium", 4), ("llama-1b", 2)):
    add(model, b, "fsdp-hybrid", param_dtype="bf16", reduce_dtype="bf16", mesh="HALF")
    add(model, b, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32", mesh="HALF")


def trace_case(c, rank, world, pg, path):
    torch.cuda.memory._record_memory_history(max_entries=3_000_000, context="alloc", stacks="python")
    r = run_case(dict(c, steps=2), rank, world, pg)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(dict(case=c["id"], world=world, rank=rank, pg=pg, peak_alloc=r["peak_alloc"],
                                peak_reserved=r["peak_reserved"], steps=r["steps"], after_model=r["after_model"],
                                note="action,addr,size,stream,frames(innermost first, up to 6)")) + "\n")
        for trace in snap["device_traces"][:1]:
            for e in trace:
                fr = [f"{os.path.basename(x['filename'])}:{x['line']}:{x['name']}" for x in e.get("frames", [])
                      if "torch/cuda/memory" not in x["filename"]][:6]
                f.write(json.dumps([e["action"], e["addr"], e["size"], e.get("stream", 0), fr]) + "\n")
    G.cleanup()


def warmup(world):
    x = torch.randn(256, 256, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=BF):
        (x @ x).sum().backward()
    (x @ x).sum().backward()
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t); dist.broadcast(t, 0)
    dist.all_gather_into_tensor(torch.empty(world << 20, device="cuda"), t)
    dist.reduce_scatter_tensor(torch.empty((1 << 20) // world, device="cuda"), t)
    del x, t
    G.cleanup()


def main():
    out, pg = sys.argv[1], sys.argv[2]
    if pg == "nccl":
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        rank, world = dist.get_rank(), dist.get_world_size()
        filt = sys.argv[3] if len(sys.argv) > 3 else ""
        tracedir = sys.argv[4] if len(sys.argv) > 4 else ""
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore
        world, rank = int(sys.argv[3]), int(sys.argv[4])
        filt = sys.argv[5] if len(sys.argv) > 5 else ""
        tracedir = ""
        torch.cuda.set_device(0)
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    warmup(world)
    import transformers
    free, total = torch.cuda.mem_get_info()
    env = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda, total=total,
               transformers=transformers.__version__, world_size=world, pg=pg, rank=rank,
               context_used_after_init=total - free - torch.cuda.memory_reserved())
    if pg == "nccl":
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    with open(out, "a") as f:
        f.write(json.dumps(dict(env=env)) + "\n")
    for c in CASES:
        c = dict(c)
        if filt and not any(c["id"] == x[1:] if x.startswith("=") else x in c["id"] for x in filt.split(",")):
            continue
        if c.get("mesh") == "HALF":
            if world < 2 or world % 2:
                continue
            c["mesh"] = [2, world // 2]
        if c["strategy"] == "fsdp-hybrid" and pg == "nccl":
            continue
        t0 = time.time()
        try:
            r = run_case(c, rank, world, pg)
        except torch.OutOfMemoryError:
            r = dict(c, world=world, rank=rank, pg=pg, error="oom")
        except Exception as e:
            r = dict(c, world=world, rank=rank, pg=pg, error=repr(e)[:300], tb=traceback.format_exc()[-1500:])
        G.cleanup()
        r["wall_s"] = round(time.time() - t0, 2)
        with open(out, "a") as f:
            f.write(json.dumps(r) + "\n")
        print(pg, world, rank, c["id"], r.get("error", "%.3f GiB" % (r.get("peak_alloc", 0) / GiB)), r["wall_s"],
              flush=True)
    if tracedir:
        os.makedirs(tracedir, exist_ok=True)
        for want in ("gpt2-medium-ddpbv-bf16-b4", "gpt2-medium-fsdp2-bf16-b4", "gpt2-medium-zero1-bf16-b4",
                     "gpt2-medium-ddp-bf16-b4"):
            for c in CASES:
                if c["id"] == want:
                    try:
                        trace_case(c, rank, world, pg, os.path.join(tracedir, f"{want}-w{world}.trace.jsonl.gz"))
                        print("traced", want, flush=True)
                    except Exception as e:
                        print("trace failed", want, repr(e)[:200], flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
