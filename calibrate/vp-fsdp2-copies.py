"""FSDP2's copies around its collectives, measured (docs/STEP_TIME.md "Overlap", the ZeRO-3/FSDP row).

    torchrun --nproc-per-node 2 calibrate/vp-fsdp2-copies.py OUT.jsonl      (from the repository root)
    python3 calibrate/vp-fsdp2-copies.py OUT.jsonl                            (one GPU, world 1)

The cluster model times FSDP (as FSDP2, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) with two copies per
unit beside its all-gather and reduce-scatter: foreach_all_gather_copy_out (split_with_sizes_copy: the gathered
parameters read and written, 2 x 2 B per parameter in bf16) after each gather, and foreach_reduce's torch._chunk_cat
(the bf16 gradients read, written in the fp32 reduce dtype: 2 + 4 B per parameter) before each reduce-scatter; each
one kernel at the profile's copy curve. This script measures those kernels for units of known size, so that the rule
can be checked against the H200 (no multi-GPU measurement existed when it was written).

For each hidden size H of SIZES, a stack of UNITS units (Linear(H, 4H), GELU, Linear(4H, H)), each and the root wrapped
in fully_shard with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), is trained WARMUP steps (AdamW, batch
BATCH x SEQ tokens) and then STEPS steps under torch.profiler (CUDA activity only). Rank 0 writes one JSON line per size:
  {"kind":"fsdp2_copies","world":W,"hidden":H,"units":UNITS,"unit_params":P,"steps":STEPS,
   "copy_out":{"kernels":N,"ms":..},"chunk_cat":{"kernels":N,"ms":..},"copy_in":{"kernels":N,"ms":..},
   "copy_out_bytes_per_unit":4P,"chunk_cat_bytes_per_unit":6P,"top":[[name,ms,count],...]}
copy_out sums the kernels whose name holds "split_with_sizes", chunk_cat those holding "chunk_cat", copy_in the
foreach copies of the all-gather input (names holding "CopyFunctor" or "foreach_copy"); top lists the step's 25
costliest kernel names, to check that the matching caught them. Per step each unit is gathered twice (forward and
backward; the root's last unit is not resharded) and reduced once, so copy_out should count about 2 x UNITS kernels
a step and chunk_cat UNITS.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

SIZES = (2048, 4096, 8192)
UNITS = 8
BATCH, SEQ = 2, 2048
WARMUP, STEPS = 3, 5
TOP = 25


def fully_shard_api():
    """fully_shard and MixedPrecisionPolicy from where this PyTorch keeps them."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def build(h, device):
    fully_shard, MixedPrecisionPolicy = fully_shard_api()
    units = [torch.nn.Sequential(torch.nn.Linear(h, 4 * h, bias=False), torch.nn.GELU(),
                                 torch.nn.Linear(4 * h, h, bias=False)) for _ in range(UNITS)]
    model = torch.nn.Sequential(*units).to(device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for u in units:
        fully_shard(u, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model, sum(p.numel() for p in units[0].parameters()) * dist.get_world_size()


def train_step(model, opt, x):
    model(x).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def classify(name):
    low = name.lower()
    if "split_with_sizes" in low:
        return "copy_out"
    if "chunk_cat" in low:
        return "chunk_cat"
    if "copyfunctor" in low or "foreach_copy" in low:
        return "copy_in"
    return None


def measure(h, device):
    model, unit_params = build(h, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(BATCH, SEQ, h, device=device)
    for _ in range(WARMUP):
        train_step(model, opt, x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            train_step(model, opt, x)
        torch.cuda.synchronize()
    kinds = {k: {"kernels": 0, "ms": 0.0} for k in ("copy_out", "chunk_cat", "copy_in")}
    by_name = {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        ms = ev.time_range.elapsed_us() / 1000.0
        t = by_name.setdefault(ev.name, [0.0, 0])
        t[0] += ms
        t[1] += 1
        k = classify(ev.name)
        if k:
            kinds[k]["kernels"] += 1
            kinds[k]["ms"] += ms
    top = sorted(([n[:160], round(v[0], 4), v[1]] for n, v in by_name.items()), key=lambda r: -r[1])[:TOP]
    del model, opt
    torch.cuda.empty_cache()
    return {"kind": "fsdp2_copies", "world": dist.get_world_size(), "hidden": h, "units": UNITS,
            "unit_params": unit_params, "steps": STEPS, "batch": BATCH, "seq": SEQ,
            "copy_out": kinds["copy_out"], "chunk_cat": kinds["chunk_cat"], "copy_in": kinds["copy_in"],
            "copy_out_bytes_per_unit": 4 * unit_params, "chunk_cat_bytes_per_unit": 6 * unit_params,
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name(device), "top": top}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if "RANK" not in os.environ:  # one GPU: a world of 1
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", LOCAL_RANK="0")
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    out = open(sys.argv[1], "w") if dist.get_rank() == 0 else None
    for h in SIZES:
        line = measure(h, device)
        if out:
            out.write(json.dumps(line) + "\n")
            out.flush()
    if out:
        out.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
