#!/usr/bin/env python3
"""Multi-GPU ground truth for DeepSpeed ZeRO 1/2/3: per-rank memory.

The protocol of scripts/collect_dist.py (itself shared/groundtruth/collect.py's:
model built from a config with random weights on the GPU, `steps` training
steps, peak statistics reset before the forward, the backward and the
optimizer step; the library workspaces and the NCCL communicator made by a
warm-up before the first case; the construction's transients released with
gc.collect() + torch.cuda.empty_cache() once the engine is built), run under
torchrun with one process per GPU, for DeepSpeed's engine:

    deepspeed.initialize(model, config={"bf16": {"enabled": true},
        "zero_optimization": {"stage": S, <knobs>},
        "optimizer": {"type": "Adam"}  -> FusedAdam, "gradient_clipping": 0})
    loss = engine(**batch).loss; engine.backward(loss); engine.step()

on gpt2-medium and the llama-1b shape (collect_dist.py's MODELS), ZeRO-1, 2
and 3 with the defaults and a second setting each (a small reduce bucket with
overlap_comm; ZeRO-3: stage3_max_reuse_distance 0, prefetch off, persistence
threshold 0; one built under deepspeed.zero.Init; one with optimizer offload
to the CPU; one with two micro-batches a step).

Not run yet: deepspeed is not on the H200 image (install it first:
`pip install deepspeed`, which builds FusedAdam's and CPUAdam's kernels at
first use; DS_BUILD_OPS=0 is the default JIT path). Command, on 2 to 8 H200s:

    torchrun --standalone --nproc_per_node=2 groundtruth/collect_deepspeed.py \\
        run groundtruth/dist/h200-torch2.11-deepspeed.jsonl [FILTER]
    python3 groundtruth/collect_deepspeed.py list [FILTER]

then `vramplan validate --gpu h200 groundtruth/dist/h200-torch2.11-deepspeed.jsonl`
compares every rank line with its simulated rank (docs/DISTRIBUTED.md,
"DeepSpeed ZeRO"). Output: JSON lines in the ground-truth schema with the
multi-GPU fields of collect_dist.py (`world`, `rank`, `local_world`,
`strategy` = deepspeed-zero1/2/3, `mixed_precision`, `prec` = bf16) and
`ds_config`: the zero_optimization knobs set (vramplan's names, which are
DeepSpeed's), `zero_init` among them when the model was built under
deepspeed.zero.Init.
"""
import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import collect_dist as CD  # noqa: E402  (sets the NCCL environment before torch)

CASES = []


def add(model, batch, stage, knobs=None, tag="", accum=1, ckpt=False):
    c = dict(model=model, batch=batch, strategy=f"deepspeed-zero{stage}", stage=stage, opt="adamw-fused",
             attn="sdpa", ckpt=ckpt, accum=accum, mixed_precision=True, prec="bf16",
             ds_config=dict(knobs or {}))
    c["id"] = f"{model}-zero{stage}-b{batch}" + (f"-a{accum}" if accum > 1 else "") + ("-ckpt" if ckpt else "") + tag
    CASES.append(c)


for _m, _b in (("gpt2-medium", 8), ("llama-1b", 2)):
    for _s in (1, 2, 3):
        add(_m, _b, _s)
    add(_m, _b, 1, dict(reduce_bucket_size=50000000, overlap_comm=True), "-rb5e7-overlap")
    add(_m, _b, 2, dict(reduce_bucket_size=50000000, overlap_comm=True), "-rb5e7-overlap")
    add(_m, _b, 3, dict(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0,
                        stage3_param_persistence_threshold=0), "-noreuse")
    add(_m, _b, 3, dict(zero_init=True), "-zinit")
    add(_m, _b, 2, dict(offload_optimizer="cpu"), "-offload")
    add(_m, _b, 2, accum=2)
add("llama-1b", 2, 3, ckpt=True)


def select(filt="", case=None):
    return [c for c in CASES if (c["id"] == case if case else filt in c["id"])]


def ds_json(c):
    """The DeepSpeed config of a case."""
    z = {"stage": c["stage"]}
    for k, v in c["ds_config"].items():
        if k == "zero_init":
            continue
        if k in ("offload_optimizer", "offload_param"):
            z[k] = {"device": v, "pin_memory": True}
        else:
            z[k] = v
    return {"train_micro_batch_size_per_gpu": c["batch"], "gradient_accumulation_steps": c["accum"],
            "bf16": {"enabled": True}, "zero_optimization": z, "gradient_clipping": 0.0,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": False}},
            "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30, "wall_clock_breakdown": False}


def run_case(torch, c, steps, rank, dev, at):
    import deepspeed
    torch.manual_seed(0)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    free0, total0 = torch.cuda.mem_get_info()
    cfg = ds_json(c)
    at["phase"] = "build"
    if c["ds_config"].get("zero_init"):
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            m, fam, seq = CD.build(torch, c["model"], c["attn"], dev)
    else:
        m, fam, seq = CD.build(torch, c["model"], c["attn"], dev)
    if c["ckpt"]:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    nparam = sum(getattr(p, "ds_numel", p.numel()) for p in m.parameters())
    at["phase"] = "wrap"
    engine, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)
    torch.cuda.synchronize()
    build_peak = torch.cuda.max_memory_allocated() - base
    CD.cleanup(torch)
    r = dict(c, fam=fam, seq=seq, params=nparam, base_alloc=base, build_peak_alloc=build_peak,
             after_model=torch.cuda.memory_allocated() - base, device_used_start=total0 - free0)
    r.pop("stage")
    V = CD.MODELS[c["model"]][1]["vocab_size"]
    gen = torch.Generator(device=dev)
    gen.manual_seed(1000 + rank)
    steps_out, times = [], []
    for k in range(steps):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        torch.cuda.reset_peak_memory_stats()
        ph = {"start": torch.cuda.memory_allocated() - base, "fwd_peak": 0, "bwd_peak": 0}
        for mb in range(c["accum"]):
            at["phase"] = f"step{k + 1}.forward"
            ids = torch.randint(0, V, (c["batch"], seq), device=dev, generator=gen)
            loss = engine(input_ids=ids, labels=ids.clone()).loss
            torch.cuda.synchronize()
            ph["fwd_peak"] = max(ph["fwd_peak"], torch.cuda.max_memory_allocated() - base)
            ph["after_fwd"] = torch.cuda.memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
            at["phase"] = f"step{k + 1}.backward"
            engine.backward(loss)
            torch.cuda.synchronize()
            ph["bwd_peak"] = max(ph["bwd_peak"], torch.cuda.max_memory_allocated() - base)
            ph["after_bwd"] = torch.cuda.memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
            if mb + 1 < c["accum"]:
                engine.step()  # not a boundary: DeepSpeed only counts the micro-step
                del loss, ids
        at["phase"] = f"step{k + 1}.optimizer"
        engine.step()  # the boundary: optimizer.step() and zero_grad
        torch.cuda.synchronize()
        ph["opt_peak"] = torch.cuda.max_memory_allocated() - base
        del loss, ids
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
        ph["end"] = torch.cuda.memory_allocated() - base
        ph["reserved"] = torch.cuda.memory_reserved()
        steps_out.append(ph)
    import collect_more as M  # summarize: the shared schema's figures (imports torch)
    M.summarize(r, steps_out, times)
    engine.destroy()
    del engine, m
    return r


def cmd_run(a):
    import datetime
    import socket
    import torch
    import torch.distributed as dist
    import deepspeed
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    deepspeed.init_distributed(dist_backend="nccl", timeout=datetime.timedelta(seconds=a.nccl_timeout))
    ctl = dist.new_group(backend="gloo")
    torch.ones(1, device=dev) @ torch.ones(1, 1, device=dev)
    free, total = torch.cuda.mem_get_info()
    ctx = total - free - torch.cuda.memory_reserved()
    CD.warmup(torch, dist, dev)
    f = None
    if rank == 0:
        import transformers
        env = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda, total=total,
                   transformers=transformers.__version__, deepspeed=deepspeed.__version__, world_size=world,
                   local_world_size=local_world, host=socket.gethostname(), context_used_after_init=ctx)
        new = CD.file_empty(a.out)
        f = open(a.out, "a")
        if new:
            f.write(json.dumps(dict(env=env)) + "\n"); f.flush()
    for c in select(a.filter, a.case):
        t0, at = time.time(), {"phase": "start"}
        try:
            r = run_case(torch, c, a.steps, rank, dev, at)
        except torch.OutOfMemoryError:
            r = dict(c, error="oom", error_phase=at["phase"], error_alloc=torch.cuda.memory_allocated(),
                     error_reserved=torch.cuda.memory_reserved())
            r.pop("stage")
        except Exception as e:  # recorded; the next case still runs
            r = dict(c, error=repr(e)[:300], error_phase=at["phase"], tb=traceback.format_exc()[-800:])
            r.pop("stage")
        CD.cleanup(torch)
        r.update(id=f"{c['id']}-w{world}", world=world, rank=rank, local_world=local_world,
                 wall_s=round(time.time() - t0, 2))
        got = [None] * world if rank == 0 else None
        dist.gather_object(r, got, dst=0, group=ctl)
        if rank == 0:
            for x in sorted(got, key=lambda y: y["rank"]):
                f.write(json.dumps(x) + "\n")
                print(x["id"], "rank", x["rank"], x.get("error", ""),
                      "peak_alloc=%.3f GiB" % (x.get("peak_alloc", 0) / CD.GiB), flush=True)
            f.flush()
    dist.barrier(group=ctl)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("filter", nargs="?", default="")
    r.add_argument("--case")
    r.add_argument("--steps", type=int, default=4)
    r.add_argument("--nccl-timeout", type=int, default=600)
    ls = sub.add_parser("list")
    ls.add_argument("filter", nargs="?", default="")
    a = ap.parse_args()
    if a.cmd == "list":
        for c in select(a.filter):
            print(c["id"])
        return
    cmd_run(a)


if __name__ == "__main__":
    main()
