#!/usr/bin/env python3
"""Multi-GPU ground truth: per-rank memory of DDP and FSDP training steps.

The protocol of shared/groundtruth/collect.py (model built from a config with
random weights, `steps` training steps, peak statistics reset before the
forward, the backward and the optimizer step), run under torchrun with one
process per GPU and NCCL, for

    ddp              DistributedDataParallel, default 25 MiB buckets
    ddp-bucket-view  the same with gradient_as_bucket_view=True
    fsdp-full        FSDP (FSDP1) ShardingStrategy.FULL_SHARD
    fsdp-grad-op     FSDP (FSDP1) ShardingStrategy.SHARD_GRAD_OP

each with and without bf16 mixed precision (DDP: torch.autocast(bf16) over
fp32 parameters, as collect.py's amp-bf16; FSDP: MixedPrecision(param_dtype,
reduce_dtype, buffer_dtype = bf16); without it everything is fp32), on
gpt2-medium, llama-1b and the llama-7b shape of collect.py (named
llama-2-7b here, the name of that shape in vramplan's models/).

Usage (docs/MULTIGPU.md):

    torchrun --standalone --nproc_per_node=N scripts/collect_dist.py \\
        run OUT.jsonl [FILTER] [--case ID] [--steps 4]
    python3 scripts/collect_dist.py sweep OUT.jsonl --nproc N \\
        [--filter F] [--timeout 900]      # one torchrun per case
    python3 scripts/collect_dist.py list [FILTER]

Output: JSON lines in the ground-truth schema (shared/groundtruth/README.md),
an `env` line first, then one line per rank per case with the extra fields
`world`, `rank`, `local_world`, `strategy`, `mixed_precision`. Every rank
measures its own GPU; rank 0 gathers the records (dist.gather_object over a
gloo group, so that the gathering allocates nothing on the GPUs) and writes
them all. A case that fails on a rank records `error` on that rank's line
("oom" for torch.OutOfMemoryError, else the exception) and the run goes on;
`sweep` also records a case whose torchrun crashed or hung.
"""
import os

# NVLink SHARP / multicast off, before torch (and NCCL) is imported: NVLS
# buffers take GPU memory the planner does not model, and the lent machines
# ask for multicast to stay off.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse
import datetime
import functools
import gc
import json
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings

GiB = 1 << 30

# ---- models: copied from shared/groundtruth/collect.py (MODELS) ----------
# name: (family, config kwargs, default seq)
MODELS = {
    "gpt2-medium": ("gpt2", dict(n_layer=24, n_embd=1024, n_head=16, vocab_size=50257, n_positions=1024), 1024),
    "llama-1b": ("llama", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                               num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                               max_position_embeddings=2048), 2048),
    # collect.py's "llama-7b"
    "llama-2-7b": ("llama", dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                                 max_position_embeddings=4096), 2048),
}

STRATEGIES = ("ddp", "ddp-bucket-view", "fsdp-full", "fsdp-grad-op")

# ---- cases ----------------------------------------------------------------
CASES = []


def base_id(c):
    return (f"{c['model']}-{c['strategy']}-{'bf16' if c['mixed_precision'] else 'fp32'}-b{c['batch']}"
            + ("-ckpt" if c.get("ckpt") else "") + (f"-s{c['seq']}" if "seq" in c else ""))


def add(**c):
    c.setdefault("opt", "adamw")
    c.setdefault("attn", "sdpa")
    c.setdefault("ckpt", False)
    c["id"] = base_id(c)
    CASES.append(c)


for _s in STRATEGIES:
    for _mp in (True, False):
        add(model="gpt2-medium", batch=8, strategy=_s, mixed_precision=_mp)
for _s in STRATEGIES:
    for _mp in (True, False):
        add(model="llama-1b", batch=2, strategy=_s, mixed_precision=_mp)
# 7B, every layer checkpointed: DDP keeps 16-22 bytes per parameter on every
# GPU plus AdamW's foreach temporary (4 bytes per parameter), so some DDP cases
# record "oom" (fp32 with buckets did on one H200; bf16 with bucket views
# peaked at 134.8 GB), which the planner must predict too
for _s in STRATEGIES:
    for _mp in (True, False):
        add(model="llama-2-7b", batch=1, seq=2048, ckpt=True, strategy=_s, mixed_precision=_mp)


def select(filt="", case=None):
    if case:
        return [c for c in CASES if c["id"] == case]
    return [c for c in CASES if filt in c["id"]]


# ---- one case on one rank -----------------------------------------------

def prec_name(c):
    if not c["mixed_precision"]:
        return "fp32"
    return "amp-bf16" if c["strategy"].startswith("ddp") else "fsdp-mp-bf16"


def build(torch, name, attn, dev):
    import transformers as T
    fam, kw, seq = MODELS[name]
    cfg = T.GPT2Config(**kw) if fam == "gpt2" else T.LlamaConfig(**kw)
    with torch.device(dev):
        m = T.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    return m, fam, seq


def wrap(torch, m, c, dev):
    s = c["strategy"]
    if s in ("ddp", "ddp-bucket-view"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(m, device_ids=[dev.index], gradient_as_bucket_view=(s == "ddp-bucket-view"))
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy, BackwardPrefetch
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    # the decoder layers are the units (HF's _no_split_modules: GPT2Block,
    # LlamaDecoderLayer); the embeddings, final norm and head form the root
    names = set(getattr(m, "_no_split_modules", None) or [])
    layer_cls = {type(x) for x in m.modules() if type(x).__name__ in names}
    if not layer_cls:
        raise RuntimeError(f"no decoder-layer class found for FSDP wrapping ({sorted(names)})")
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_cls)
    mp = None
    if c["mixed_precision"]:
        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                            buffer_dtype=torch.bfloat16)
    strat = ShardingStrategy.FULL_SHARD if s == "fsdp-full" else ShardingStrategy.SHARD_GRAD_OP
    return FSDP(m, auto_wrap_policy=policy, sharding_strategy=strat, mixed_precision=mp,
                device_id=dev, limit_all_gathers=True, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                use_orig_params=False)


def run_case(torch, dist, c, steps, rank, dev, at):
    """at["phase"] follows the case, so that a failure can say where."""
    name, b = c["model"], c["batch"]
    mp = c["mixed_precision"]
    torch.manual_seed(0)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    free0, total0 = torch.cuda.mem_get_info()
    dev_used_start = total0 - free0
    at["phase"] = "build"
    m, fam, seq = build(torch, name, c["attn"], dev)
    seq = c.get("seq", seq)
    if c["ckpt"]:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    nparam = sum(p.numel() for p in m.parameters())
    at["phase"] = "wrap"
    m = wrap(torch, m, c, dev)
    local_params = sum(p.numel() for p in m.parameters())
    # the construction's transients (DDP's broadcast buckets, FSDP's
    # unsharded copies) are released, so that reserved reflects the steps
    torch.cuda.synchronize()
    build_peak = torch.cuda.max_memory_allocated() - base
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    r = dict(c, fam=fam, seq=seq, prec=prec_name(c), params=nparam, local_params=local_params,
             base_alloc=base, build_peak_alloc=build_peak, after_model=torch.cuda.memory_allocated() - base,
             device_used_start=dev_used_start)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ac = mp and c["strategy"].startswith("ddp")
    V = MODELS[name][1]["vocab_size"]
    gen = torch.Generator(device=dev)
    gen.manual_seed(1000 + rank)
    steps_out, times = [], []
    for k in range(steps):
        at["phase"] = f"step{k + 1}.forward"
        ids = torch.randint(0, V, (b, seq), device=dev, generator=gen)
        batch = dict(input_ids=ids, labels=ids.clone())
        torch.cuda.synchronize(); t0 = time.perf_counter()
        torch.cuda.reset_peak_memory_stats()
        ph = {"start": torch.cuda.memory_allocated() - base}
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=ac):
            loss = m(**batch).loss
        torch.cuda.synchronize()
        ph["fwd_peak"] = torch.cuda.max_memory_allocated() - base
        ph["after_fwd"] = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        at["phase"] = f"step{k + 1}.backward"
        loss.backward()
        torch.cuda.synchronize()
        ph["bwd_peak"] = torch.cuda.max_memory_allocated() - base
        ph["after_bwd"] = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        at["phase"] = f"step{k + 1}.optimizer"
        opt.step()
        torch.cuda.synchronize()
        ph["opt_peak"] = torch.cuda.max_memory_allocated() - base
        opt.zero_grad(set_to_none=True)
        del loss, batch, ids
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
        ph["end"] = torch.cuda.memory_allocated() - base
        ph["reserved"] = torch.cuda.memory_reserved()
        steps_out.append(ph)
    st = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    later = sorted(times[1:])
    r.update(steps=steps_out,
             peak_alloc=max(max(p[k] for k in ("fwd_peak", "bwd_peak", "opt_peak")) for p in steps_out),
             peak_alloc_steady=max(steps_out[-1][k] for k in ("fwd_peak", "bwd_peak", "opt_peak")),
             peak_reserved=st["reserved_bytes.all.peak"], num_alloc_retries=st["num_alloc_retries"],
             device_used=total - free,
             step_ms=(later[len(later) // 2] if later else times[0]) * 1e3)
    del m, opt
    return r


def cleanup(torch):
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def warmup(torch, dist, dev):
    """Make the library workspaces (main and backward-thread cuBLAS, cuBLASLt,
    checkpointing) and the NCCL communicator before the first case, so that
    every case runs in a process that already has them."""
    x = torch.ones(1, device=dev) @ torch.ones(1, 1, device=dev)
    lin = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).to(dev)
    x = torch.randn(32, 64, device=dev)
    lin(x).sum().backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lin(x).sum().backward()
    torch.utils.checkpoint.checkpoint(lin, x.requires_grad_(), use_reentrant=False).sum().backward()
    w = dist.get_world_size()
    t = torch.ones(4096 * w, device=dev)
    dist.all_reduce(t)
    dist.all_gather_into_tensor(torch.empty(t.numel() * w, device=dev), t)
    dist.reduce_scatter_tensor(torch.empty(t.numel() // w, device=dev), t)
    dist.broadcast(t, 0)
    torch.cuda.synchronize()
    del x, lin, t
    cleanup(torch)


def file_empty(path):
    return not os.path.exists(path) or os.path.getsize(path) == 0


def cmd_run(a):
    import torch
    import torch.distributed as dist
    warnings.filterwarnings("ignore", category=FutureWarning)  # FSDP1's deprecation notice
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    dist.init_process_group(backend="nccl", device_id=dev,
                            timeout=datetime.timedelta(seconds=a.nccl_timeout))
    ctl = dist.new_group(backend="gloo")  # records travel on the CPU
    if world < 2 and rank == 0:
        print("collect_dist: warning: world size 1; vramplan validates multi-GPU cases only", file=sys.stderr)
    torch.ones(1, device=dev) @ torch.ones(1, 1, device=dev)
    free, total = torch.cuda.mem_get_info()
    ctx = total - free - torch.cuda.memory_reserved()
    warmup(torch, dist, dev)
    cases = select(a.filter, a.case)
    if not cases and rank == 0:
        print(f"collect_dist: no case matches {a.case or a.filter!r}", file=sys.stderr)
    env = None
    if rank == 0:
        import transformers
        nccl = torch.cuda.nccl.version()
        env = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   total=total, transformers=transformers.__version__,
                   nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
                   world_size=world, local_world_size=local_world, host=socket.gethostname(),
                   context_used_after_init=ctx,
                   nccl_env={k: os.environ[k] for k in sorted(os.environ) if k.startswith(("NCCL_", "TORCH_NCCL", "TORCH_SYMM", "NVSHMEM_"))})
    f = None
    if rank == 0:
        new = file_empty(a.out)
        f = open(a.out, "a")
        if new:
            f.write(json.dumps(dict(env=env)) + "\n"); f.flush()
    for c in cases:
        t0 = time.time()
        at = {"phase": "start"}
        try:
            r = run_case(torch, dist, c, a.steps, rank, dev, at)
        except torch.OutOfMemoryError:
            r = dict(c, error="oom", error_phase=at["phase"],
                     error_alloc=torch.cuda.memory_allocated(), error_reserved=torch.cuda.memory_reserved())
        except Exception as e:  # recorded, the next case still runs
            r = dict(c, error=repr(e)[:300], error_phase=at["phase"], tb=traceback.format_exc()[-800:])
        try:
            cleanup(torch)
        except Exception as e:
            r.setdefault("error", "cleanup: " + repr(e)[:200])
        r.update(id=f"{c['id']}-w{world}", prec=r.get("prec", prec_name(c)), world=world, rank=rank,
                 local_world=local_world, wall_s=round(time.time() - t0, 2))
        got = [None] * world if rank == 0 else None
        dist.gather_object(r, got, dst=0, group=ctl)
        if rank == 0:
            for x in sorted(got, key=lambda y: y["rank"]):
                f.write(json.dumps(x) + "\n")
            f.flush()
            for x in sorted(got, key=lambda y: y["rank"]):
                print(x["id"], "rank", x["rank"], x.get("error", ""),
                      "peak_alloc=%.3f GiB" % (x.get("peak_alloc", 0) / GiB),
                      "reserved=%.3f" % (x.get("peak_reserved", 0) / GiB),
                      "device=%.3f" % (x.get("device_used", 0) / GiB),
                      "step=%.1fms" % x.get("step_ms", 0), x["wall_s"], flush=True)
        dist.barrier(group=ctl)
    if f:
        f.close()
    dist.destroy_process_group()
    return 0


def cmd_sweep(a):
    """One torchrun per case: a crash or a hang loses only that case, which is
    recorded with its error on every rank's line."""
    cases = select(a.filter)
    here = os.path.abspath(__file__)
    part = a.out + ".part"
    for c in cases:
        if os.path.exists(part):
            os.remove(part)
        # torchrun, from the same Python environment
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.nproc}", here, "run", part,
               "--case", c["id"], "--steps", str(a.steps), "--nccl-timeout", str(a.nccl_timeout)]
        print("+", " ".join(cmd), flush=True)
        err = None
        # its own session, so that a timeout stops torchrun and its workers
        p = subprocess.Popen(cmd, start_new_session=True)
        try:
            rc = p.wait(timeout=a.timeout)
            if rc:
                err = f"torchrun exit status {rc}"
        except subprocess.TimeoutExpired:
            err = f"timeout after {a.timeout} s"
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=30)
                    break
                except subprocess.TimeoutExpired:
                    pass
        lines = []
        if os.path.exists(part):
            with open(part) as g:
                lines = [x for x in g if x.strip()]
        env = [x for x in lines if x.startswith('{"env"')]
        rows = [x for x in lines if not x.startswith('{"env"')]
        seen = {json.loads(x).get("rank") for x in rows}
        with open(a.out, "a") as o:
            if file_empty(a.out) and env:
                o.write(env[0])
            for x in rows:
                o.write(x)
            for rk in range(a.nproc):
                if rk not in seen:
                    o.write(json.dumps(dict(c, id=f"{c['id']}-w{a.nproc}", prec=prec_name(c), world=a.nproc,
                                            rank=rk, local_world=a.nproc,
                                            error=err or "no record from this rank")) + "\n")
    if os.path.exists(part):
        os.remove(part)
    return 0


def cmd_list(a):
    for c in select(a.filter):
        print(c["id"])
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="under torchrun: run the cases, rank 0 appends the lines to OUT")
    r.add_argument("out")
    r.add_argument("filter", nargs="?", default="", help="substring of the case ids")
    r.add_argument("--case", help="exactly this case id")
    r.add_argument("--steps", type=int, default=4)
    r.add_argument("--nccl-timeout", type=int, default=600, help="seconds before a stuck collective aborts")
    s = sub.add_parser("sweep", help="one torchrun per case (robust to crashes and hangs)")
    s.add_argument("out")
    s.add_argument("--nproc", type=int, required=True, help="GPUs (processes) per run")
    s.add_argument("--filter", default="")
    s.add_argument("--steps", type=int, default=4)
    s.add_argument("--timeout", type=int, default=900, help="seconds per case")
    s.add_argument("--nccl-timeout", type=int, default=600)
    li = sub.add_parser("list", help="print the case ids")
    li.add_argument("filter", nargs="?", default="")
    a = ap.parse_args(argv)
    return {"run": cmd_run, "sweep": cmd_sweep, "list": cmd_list}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
