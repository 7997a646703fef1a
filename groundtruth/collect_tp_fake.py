"""FSDP2 composed with tensor parallelism (2-D), torchtitan's way, as one rank of a fake world on one H200.

torchtitan's `apply_tp` plan (torchtitan/models/llama3/infra/parallelize.py) put on a Hugging Face Llama/Mistral
module tree: the embedding RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)); each layer's norms
SequenceParallel(); self_attn and mlp PrepareModuleInput (Shard(1) -> Replicate()); q/k/v/gate/up ColwiseParallel,
o/down RowwiseParallel(output_layouts=Shard(1)); the final norm SequenceParallel(); lm_head ColwiseParallel(
input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False) with `loss_parallel()` around the forward
and the backward (`--lp 0`: output_layouts=Replicate(), the whole logits on every rank). Then `apply_fsdp`'s FSDP2:
fully_shard per decoder layer and the root over the "dp" mesh dimension, MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32), reshard_after_forward True; activation checkpointing (non-reentrant, per decoder layer, as
`apply_ac` "full") where the case says so. position_ids are passed whole (the sharded embedding's output has S/tp
tokens, from which the model would otherwise derive them).

The process group is PyTorch's fake one (torch.testing._internal.distributed.fake_pg, as collect_dist_more.py):
collectives are no-ops, every shard, gather and staging buffer has its real size, so the rank's allocations are
those of a real run less NCCL's own buffers. Not a multi-GPU measurement: no step time. Protocol and fields are
collect_dist_more.py's, plus `tp`, `dp`, `sequence_parallel`, `loss_parallel`.

    python3 groundtruth/collect_tp_fake.py OUT.jsonl DP TP RANK [filter] [--lp 0] [--trace DIR]

With `--trace DIR` each selected case runs 2 steps under the allocator's memory history instead, written as
DIR/<id>-wW-rR.trace.jsonl.gz in groundtruth/trace_more.py's format (no line is added to OUT.jsonl).
"""
import os, sys, time, traceback
import json
import torch, torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collect_more as M  # noqa: E402
import collect_dist_more as D  # noqa: E402
G = M.G
BF = torch.bfloat16


def apply_tp(m, tp_mesh, lp):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   PrepareModuleInput, parallelize_module)
    out = (ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False) if lp else
           ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()))
    parallelize_module(m, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": out})
    for layer in m.model.layers:
        parallelize_module(layer, tp_mesh, {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1))})


def apply_fsdp(m, dp_mesh):
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    pol = MixedPrecisionPolicy(param_dtype=BF, reduce_dtype=torch.float32)
    for layer in m.model.layers:
        fully_shard(layer, mesh=dp_mesh, mp_policy=pol, reshard_after_forward=True)
    fully_shard(m, mesh=dp_mesh, mp_policy=pol, reshard_after_forward=True)


def run_case(c, rank, mesh, lp):
    from torch.distributed.tensor.parallel import loss_parallel
    import contextlib
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m, fam, seq = M.build_hf(c["model"], "sdpa", None, None)
    seq = c.get("seq", seq)
    nparam = sum(p.numel() for p in m.parameters())
    if c.get("ckpt"):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    vocab = m.config.vocab_size
    apply_tp(m, mesh["tp"], lp)
    apply_fsdp(m, mesh["dp"])
    build_peak = torch.cuda.max_memory_allocated() - base
    G.cleanup()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    world = mesh.size()
    r = dict(c, fam=fam, seq=seq, params=nparam, world=world, rank=rank, local_world=world, pg="fake",
             prec="fsdp-mp-bf16", build_peak_alloc=build_peak, after_model=torch.cuda.memory_allocated() - base)
    steps_out = []
    for s in range(c.get("steps", 4)):
        ids = torch.randint(0, vocab, (c["batch"], seq), device="cuda")
        pos = torch.arange(seq, device="cuda").unsqueeze(0).expand(c["batch"], seq)
        batch = dict(input_ids=ids, labels=ids.clone(), position_ids=pos)
        ctx = loss_parallel() if lp else contextlib.nullcontext()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        ph = {"start": torch.cuda.memory_allocated() - base}
        with ctx:
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
        torch.cuda.synchronize()
        ph["end"] = torch.cuda.memory_allocated() - base
        ph["reserved"] = torch.cuda.memory_reserved()
        steps_out.append(ph)
    st = torch.cuda.memory_stats()
    keys = ("fwd_peak", "bwd_peak", "opt_peak")
    r.update(steps=steps_out, peak_alloc=max(max(p[k] for k in keys) for p in steps_out),
             peak_alloc_steady=max(steps_out[-1][k] for k in keys),
             peak_reserved=st["reserved_bytes.all.peak"], num_alloc_retries=st["num_alloc_retries"])
    del m, opt
    return r


def trace_case(c, rank, mesh, lp, tracedir):
    import trace_more as T
    os.makedirs(tracedir, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, context="alloc", stacks="python")
    r = run_case(dict(c, steps=2), rank, mesh, lp)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    head = {k: r[k] for k in ("id", "peak_alloc", "peak_reserved", "steps", "after_model")}
    head["case"] = c
    T.dump(os.path.join(tracedir, f"{c['id']}-w{mesh.size()}-r{rank}.trace.jsonl.gz"), head, snap)
    G.cleanup()


CASES = []


def add(model, batch, seq, ckpt=False):
    CASES.append(dict(model=model, batch=batch, seq=seq, strategy="fsdp2", fsdp_version=2, opt="adamw", attn="sdpa",
                      ckpt=ckpt, mixed_precision=True, param_dtype="bf16", reduce_dtype="fp32",
                      reshard_after_forward=True, sequence_parallel=True))


add("llama-1b", 2, 2048)
add("llama-1b", 2, 2048, ckpt=True)
add("mistral-2b", 1, 2048)
add("mistral-2b", 2, 2048, ckpt=True)


def main():
    args = [a for a in sys.argv[1:]]
    lp, tracedir = True, ""
    if "--trace" in args:
        i = args.index("--trace")
        tracedir = args[i + 1]
        del args[i:i + 2]
    if "--lp" in args:
        i = args.index("--lp")
        lp = args[i + 1] != "0"
        del args[i:i + 2]
    out, dp, tp, rank = args[0], int(args[1]), int(args[2]), int(args[3])
    filt = args[4] if len(args) > 4 else ""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.device_mesh import init_device_mesh
    torch.cuda.set_device(0)
    dist.init_process_group("fake", rank=rank, world_size=dp * tp, store=FakeStore())
    mesh = init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))
    D.warmup(dp * tp)
    import transformers
    free, total = torch.cuda.mem_get_info()
    env = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda, total=total,
               transformers=transformers.__version__, world_size=dp * tp, pg="fake", rank=rank,
               context_used_after_init=total - free - torch.cuda.memory_reserved())
    with open(out, "a") as f:
        f.write(json.dumps(dict(env=env)) + "\n")
    for c in CASES:
        c = dict(c, tp=tp, dp=dp, loss_parallel=lp)
        c["id"] = (f"{c['model']}-fsdp2tp-dp{dp}tp{tp}-bf16-b{c['batch']}" + ("-ckpt" if c["ckpt"] else "")
                   + ("" if lp else "-nolp"))
        if filt and filt not in c["id"]:
            continue
        t0 = time.time()
        if tracedir:
            trace_case(c, rank, mesh, lp, tracedir)
            print("traced", c["id"], round(time.time() - t0, 1), flush=True)
            continue
        try:
            r = run_case(c, rank, mesh, lp)
        except torch.OutOfMemoryError:
            r = dict(c, rank=rank, pg="fake", error="oom")
        except Exception as e:
            r = dict(c, rank=rank, pg="fake", error=repr(e)[:300], tb=traceback.format_exc()[-2500:])
        G.cleanup()
        r["wall_s"] = round(time.time() - t0, 2)
        with open(out, "a") as f:
            f.write(json.dumps(r) + "\n")
        print(c["id"], r.get("error", "%.3f GiB" % (r.get("peak_alloc", 0) / 2**30)), r["wall_s"], flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
