"""Per-rank ground truth of PyTorch's data-parallel wrappers on 2 GPUs, one case a process, each case twice.

The step loop is shared/groundtruth/collect_dist.py's (dist.barrier() and torch.cuda.synchronize() before each
step, the peaks reset before each phase, zero_grad(set_to_none=True)); the lines carry its schema plus the case
fields validate reads: `run`, `pg`, `fsdp_version`, `param_dtype`, `reduce_dtype`, `reshard_after_forward`,
`autocast`, `mesh` ([replicate, shard] of HSDP's 2-D mesh).

Why one process a case: the world-1 file (groundtruth/dist/h200-torch2.11-world1.jsonl) ran many cases in one
process, and every case after the first carried the previous case's history (its reducer freed inside the next
case; the reserved peak inflated). Here the driver starts `torchrun` once per (case, run): every case is the first
of its process, alone on the GPUs.

    python3 groundtruth/collect_dist2.py --dry-run                 # the case list and each process's command
    python3 groundtruth/collect_dist2.py OUT.jsonl [--filter a,b] [--runs 2 | --run R] [--nproc 2]  # the driver
    torchrun --standalone --nproc_per_node=2 groundtruth/collect_dist2.py --case ID --rep R OUT.jsonl  # one case
(`--rep`, not `--run`: torchrun's parser takes `--run` as an ambiguous abbreviation of its own `--run-path`.)

The DDP rebuild probes test the rule of docs/DISTRIBUTED.md ("DDP's rebuild"): step 1's bucket stays in
ProcessGroupNCCL's stash until a collective is enqueued after the watchdog (a 100 ms poll) has retired step 1's
last all-reduce, so whether a rank still holds it in step 2's forward depends on how long step 1's optimizer step
and step 2's start take against that poll. `-settle` sleeps 250 ms and runs a barrier before step 2: every rank
must have released the first buckets (step2.fwd_peak equal to step3's on every rank). `-warm` runs one AdamW step
on a small tensor before the case, so step 1's optimizer loads no kernel (CUDA's lazy module loading): the window
is short and most ranks should hold them (step2.fwd_peak above step3's by 4 B a parameter). The plain cases, each
the first of its process, should release them if the first optimizer step's kernel loading is what made the shared
file's first case (gpt2-medium ddp, both runs) release them.
"""
import os
import sys
import json
import subprocess
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
GiB = 1 << 30
CASE_TIMEOUT_S = 900

# ---- the cases (no torch needed: --dry-run works anywhere) -------------------------------------------------

# model: (batch, family of its builder, layers path)
MODELS = {
    "gpt2-medium": (8, "gpt2"),
    "llama-1b": (2, "llama"),
    "qwen2-0.5b": (4, "qwen2"),
    "bert-large": (16, "bert"),
}
TAG = {"ddp": "ddp", "ddp-bucket-view": "ddpbv", "ddp-zero1": "zero1", "fsdp-full": "fsdp1full",
       "fsdp-grad-op": "fsdp1gradop", "fsdp-hybrid": "fsdp1hybrid"}
CASES = []


def add(model, strategy, suffix="", **kw):
    batch = kw.pop("batch", MODELS[model][0])
    tag = TAG.get(strategy, strategy)
    if kw.get("fsdp_version") == 2:
        tag = "fsdp2hsdp" if kw.get("mesh") else "fsdp2"
        if kw.get("reshard_after_forward") is False:
            tag += "-noreshard"
    if kw.get("mesh"):
        tag += "-m%dx%d" % tuple(kw["mesh"])
    mp = "bf16" if (kw.get("autocast") or kw.get("param_dtype")) == "bf16" else "fp32"
    cid = f"{model}-{tag}-{mp}-b{batch}" + ("-ckpt" if kw.get("ckpt") else "") + suffix
    if strategy.startswith("fsdp") and "fsdp_version" not in kw:
        kw["fsdp_version"] = 1
    CASES.append(dict(id=cid, model=model, batch=batch, strategy=strategy, opt="adamw", attn="sdpa",
                      ckpt=kw.pop("ckpt", False), mixed_precision=mp == "bf16", **kw))


def build_cases():
    for model in MODELS:
        add(model, "ddp", autocast="bf16")
        add(model, "ddp-bucket-view", autocast="bf16")
        add(model, "ddp-zero1", autocast="bf16")
        add(model, "fsdp-full", param_dtype="bf16", reduce_dtype="bf16")
        add(model, "fsdp-full", param_dtype="bf16", reduce_dtype="bf16", ckpt=True)
        add(model, "fsdp-grad-op", param_dtype="bf16", reduce_dtype="bf16")
        for mesh in ([1, 2], [2, 1]):  # HYBRID_SHARD at world 2: shard across both, or replicate on both
            add(model, "fsdp-hybrid", param_dtype="bf16", reduce_dtype="bf16", mesh=mesh)
        add(model, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32")
        add(model, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32", reshard_after_forward=False)
        add(model, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32", ckpt=True)
        add(model, "fsdp2", fsdp_version=2)
        for mesh in ([1, 2], [2, 1]):
            add(model, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32", mesh=mesh)
    # DDP's rebuild: the watchdog race settled one way, then the other (module docstring)
    for strategy in ("ddp", "ddp-bucket-view"):
        add("gpt2-medium", strategy, "-settle", autocast="bf16")
        add("gpt2-medium", strategy, "-warm", autocast="bf16")


build_cases()
assert len({c["id"] for c in CASES}) == len(CASES), "case ids must be unique"


def torchrun_cmd(cid, run, out, nproc):
    return ["torchrun", "--standalone", f"--nproc_per_node={nproc}", os.path.join(HERE, "collect_dist2.py"),
            "--case", cid, "--rep", str(run), out]


def selected(filt):
    """The cases whose id contains one of the comma-separated keys (a key ending in $: whose id ends with it)."""
    keys = [x for x in filt.split(",") if x] if filt else []

    def hit(k, cid):
        return cid.endswith(k[:-1]) if k.endswith("$") else k in cid
    return [c for c in CASES if not keys or any(hit(k, c["id"]) for k in keys)]


# ---- one case, under torchrun --------------------------------------------------------------------------------

def layers_of(m, fam):
    if fam == "gpt2":
        return list(m.transformer.h)
    if fam == "bert":
        return list(m.bert.encoder.layer)
    return list(m.model.layers)


def build(c):
    """The model on this rank's GPU in fp32, its family and sequence, the builders the other scripts use."""
    sys.path.insert(0, HERE)
    import collect_more as M  # puts the shared collect.py on the path (module G)
    fam = MODELS[c["model"]][1]
    if fam == "bert":
        m, _, seq = M.G.build(c["model"], c["attn"], False)
    else:
        m, _, seq = M.build_hf(c["model"], c["attn"], None, None)
    if c.get("ckpt"):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return m, fam, seq, M


def make_batch(M, m, fam, c, seq):
    if fam == "bert":
        return M.G.make_batch("bert", c["model"], c["batch"], seq)
    return M.make_batch(m, fam, c["batch"], seq)


def wrap(m, fam, c, world):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    s, bf = c["strategy"], torch.bfloat16
    dt = {"bf16": bf, "fp32": torch.float32}
    if s.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(m, device_ids=[torch.cuda.current_device()], gradient_as_bucket_view=(s == "ddp-bucket-view"))
    mesh = None
    if c.get("mesh"):
        mesh = init_device_mesh("cuda", tuple(c["mesh"]), mesh_dim_names=("replicate", "shard"))
    if c.get("fsdp_version") == 2:
        from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
        pol = MixedPrecisionPolicy()
        if c.get("param_dtype"):
            pol = MixedPrecisionPolicy(param_dtype=dt[c["param_dtype"]], reduce_dtype=dt[c["reduce_dtype"]])
        mesh = mesh or init_device_mesh("cuda", (world,))
        raf = c.get("reshard_after_forward", True)
        for layer in layers_of(m, fam):
            fully_shard(layer, mesh=mesh, mp_policy=pol, reshard_after_forward=raf)
        fully_shard(m, mesh=mesh, mp_policy=pol, reshard_after_forward=raf)
        return m
    import functools
    from torch.distributed.fsdp import (FullyShardedDataParallel as FSDP, ShardingStrategy, MixedPrecision,
                                        BackwardPrefetch)
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    pol = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={type(x) for x in layers_of(m, fam)})
    pd, rd = dt[c["param_dtype"]], dt[c["reduce_dtype"]]
    ss = {"fsdp-full": ShardingStrategy.FULL_SHARD, "fsdp-grad-op": ShardingStrategy.SHARD_GRAD_OP,
          "fsdp-hybrid": ShardingStrategy.HYBRID_SHARD}[s]
    kw = {"device_mesh": mesh} if mesh is not None else {}
    return FSDP(m, auto_wrap_policy=pol, sharding_strategy=ss,
                mixed_precision=MixedPrecision(param_dtype=pd, reduce_dtype=rd, buffer_dtype=pd),
                device_id=torch.cuda.current_device(), backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                limit_all_gathers=True, use_orig_params=False, **kw)


def run_case(c, rank, world):
    import torch
    import torch.distributed as dist
    if c["id"].endswith("-warm"):
        w = torch.zeros(1 << 16, device="cuda", requires_grad=True)
        w.grad = torch.ones_like(w)
        torch.optim.AdamW([w], lr=1e-4).step()  # the foreach AdamW kernels loaded before step 1
        del w
    torch.manual_seed(rank)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m, fam, seq, M = build(c)
    seq = c.get("seq", seq)
    m.train()
    nparam = sum(p.numel() for p in m.parameters())
    inner = m
    m = wrap(m, fam, c, world)
    build_peak = torch.cuda.max_memory_allocated() - base
    M.G.cleanup()
    if c["strategy"] == "ddp-zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
    else:
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ac = c.get("autocast") == "bf16"
    r = {k: v for k, v in c.items()}
    r.update(fam=fam, seq=seq, params=nparam, world=world, rank=rank, local_world=world, pg="nccl",
             prec=("amp-bf16" if ac else "fsdp-mp-bf16" if c.get("param_dtype") == "bf16" else "fp32"),
             build_peak_alloc=build_peak, after_model=torch.cuda.memory_allocated() - base)

    def before_step(s):  # collect_dist.py's barrier; -settle waits out the watchdog's poll first
        if s == 1 and c["id"].endswith("-settle"):
            torch.cuda.synchronize()
            time.sleep(0.25)  # > kWatchdogThreadSleepMillis
        dist.barrier()
    steps_out, times = M.phase_steps(m, None, dict(r, _base=base), lambda: make_batch(M, inner, fam, c, seq),
                                     opt=opt, before_step=before_step)
    return M.summarize(r, steps_out, times)


def warmup(world):
    import torch
    import torch.distributed as dist
    x = torch.randn(256, 256, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        (x @ x).sum().backward()
    (x @ x).sum().backward()
    torch.utils.checkpoint.checkpoint(lambda t: t @ t, x, use_reentrant=False).sum().backward()
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.all_gather_into_tensor(torch.empty(world << 20, device="cuda"), t)
    dist.reduce_scatter_tensor(torch.empty((1 << 20) // world, device="cuda"), t)
    del x, t


def env_line(world):
    import torch
    import transformers
    free, total = torch.cuda.mem_get_info()
    return dict(env=dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                         total=total, transformers=transformers.__version__,
                         nccl=".".join(map(str, torch.cuda.nccl.version())), world_size=world,
                         context_used_after_init=total - free - torch.cuda.memory_reserved(),
                         nccl_env={k: v for k, v in os.environ.items()
                                   if k.startswith(("NCCL_", "TORCH_NCCL", "TORCH_SYMM", "NVSHMEM_"))}))


def one_case(cid, run, out):
    import traceback
    import torch
    import torch.distributed as dist
    c = next(x for x in CASES if x["id"] == cid)
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    warmup(world)
    sys.path.insert(0, HERE)
    import collect_more as M
    M.G.cleanup()
    env = env_line(world)
    t0 = time.time()
    try:
        r = run_case(dict(c), rank, world)
    except torch.OutOfMemoryError:
        r = dict(c, world=world, rank=rank, pg="nccl", error="oom")
    except Exception as e:
        r = dict(c, world=world, rank=rank, pg="nccl", error=repr(e)[:300], tb=traceback.format_exc()[-1500:])
    r["run"] = run
    r["wall_s"] = round(time.time() - t0, 2)
    rows = [None] * world
    dist.all_gather_object(rows, r)
    if rank == 0:
        new = not os.path.exists(out) or os.path.getsize(out) == 0
        with open(out, "a") as f:
            if new:
                f.write(json.dumps(env) + "\n")
            for x in rows:
                f.write(json.dumps(x) + "\n")
        print(cid, "run", run, [x.get("error", "%.3f GiB" % (x.get("peak_alloc", 0) / GiB)) for x in rows],
              "%.1fms" % r.get("step_ms", 0), r["wall_s"], flush=True)
    dist.destroy_process_group()


# ---- the driver --------------------------------------------------------------------------------------------------

def usage():
    sys.exit(__doc__)


def main(argv):
    opts = {"--filter": "", "--runs": "2", "--nproc": "2", "--case": None, "--run": None, "--rep": None}
    dry, rest, i = False, [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--dry-run":
            dry = True
        elif a in opts:
            if i + 1 >= len(argv):
                usage()
            opts[a] = argv[i + 1]
            i += 1
        elif a.startswith("-"):
            sys.exit(f"unknown option {a}")
        else:
            rest.append(a)
        i += 1
    out = rest[0] if rest else "OUT.jsonl"
    if opts["--case"]:
        if not any(c["id"] == opts["--case"] for c in CASES):
            sys.exit(f"unknown case {opts['--case']}")
        return one_case(opts["--case"], int(opts["--rep"] or opts["--run"] or 1), out)
    nproc = int(opts["--nproc"])
    runs = [int(opts["--run"])] if opts["--run"] else list(range(1, int(opts["--runs"]) + 1))
    cases = selected(opts["--filter"])
    if dry:
        for c in cases:
            fields = {k: v for k, v in c.items() if k not in ("id", "model", "batch", "strategy", "opt", "attn")}
            print(c["id"], c["model"], "b%d" % c["batch"], c["strategy"], json.dumps(fields, sort_keys=True))
        print(f"{len(cases)} cases x {len(runs)} runs = {len(cases) * len(runs)} processes, for example:")
        print(" ", " ".join(torchrun_cmd(cases[0]["id"], runs[0], out, nproc)) if cases else "  (none)")
        return
    if not rest:
        usage()
    failed = 0
    for run in runs:
        for c in cases:
            try:
                rc = subprocess.run(torchrun_cmd(c["id"], run, out, nproc), timeout=CASE_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc != 0:
                failed += 1
                print("FAILED", c["id"], "run", run, rc, flush=True)
    print(f"done: {len(cases) * len(runs) - failed} of {len(cases) * len(runs)} processes wrote their lines", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
