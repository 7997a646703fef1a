"""The GPU's own time of SDPA's fused attention kernels, and of checkpointed family steps (docs/STEP_TIME.md
"What is left": the measurements the attention and checkpoint rules wait for).

    python3 calibrate/vp-kernels-attn.py sdpa OUT.jsonl            (from the repository root, one H200)
    python3 calibrate/vp-kernels-attn.py ckpt OUT.jsonl [ID ...]    (groundtruth/collect_more.py's family cases)

sdpa: scripts/h200_sweeps.py times each SDPA call alone between two CUDA events, so a call shorter than the host's
issue of it measures the host (0.069 ms forward, 0.202 ms backward: autograd.grad's engine), and its points carry
the head dimension and the causal mask only through the FLOPs. Here each call runs 20 times back to back under
torch.profiler (CUDA activity only) and the kernels' own durations are summed per call: the GPU's time, what a step
pays when its host runs ahead. Shapes: the sweep's (b, h, hkv, s, d), the ground truth's head dimensions (64 GPT-2 /
BERT / T5, 80, 96 phi3, 128 Llama / Qwen3, 256 Gemma) at s 512-4096, causal and not, dropout 0 and 0.1 (GPT-2 and
BERT train with attention dropout 0.1). One JSON object per line:
  {"kind":"sdpa_gpu","impl":..,"b":..,"h":..,"hkv":..,"s":..,"d":..,"causal":..,"dropout":..,
   "fwd_gpu_ms":..,"bwd_gpu_ms":..,"fwd_ms":..,"bwd_ms":..,"kernels":{name: [count, ms]}}
fwd_ms / bwd_ms are the events' times as the sweep takes them, for the same call.

ckpt: for each checkpointed family case, a steady step as collect_more.py runs it (synchronized step time), the
forward's and the backward's host time issued without a synchronize, the step's GPU busy time and its gaps over
10 us (the GPU waiting for the host) under torch.profiler, each with gradient_checkpointing_kwargs
{"use_reentrant": False} and again with "preserve_rng_state": False: whether the RNG juggling of
torch/utils/checkpoint.py (get_device_states, fork_rng / set_device_states per recomputed segment) is what makes these
steps 35-50 % longer than the kernel model (qwen3-0.6b-bf16-b8-ckpt, mt5-small-bf16-b32-ckpt; docs/STEP_TIME.md).
  {"kind":"ckpt_profile","case":ID,"preserve_rng_state":B,"step_ms":..,"fwd_host_ms":..,"bwd_host_ms":..,
   "busy_ms":..,"gap_large_ms":..,"gaps_large":N,"kernels":N}
"""
import importlib.util
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}
REPS = 20
GAP_US = 10.0
SWEEP = [(16, 12, 12, 512, 64), (16, 16, 16, 512, 64), (16, 32, 32, 512, 128), (16, 32, 8, 512, 128),
         (16, 8, 1, 512, 256)]
EXTRA = [(8, 12, 12, 1024, 64), (32, 12, 12, 512, 64), (4, 16, 16, 1024, 64), (4, 32, 32, 2048, 80),
         (2, 32, 32, 4096, 96), (4, 16, 8, 1024, 128), (2, 8, 1, 2048, 256), (2, 8, 4, 2048, 256)]


def shapes():
    out = []
    for b, h, hkv, s, d in SWEEP:  # the sweep's shapes at its four other lengths, batch x length constant
        for f in (1, 2, 4, 8, 16):
            out.append((max(1, b // f), h, hkv, s * f, d))
    return out + EXTRA


def gpu_ms(fn):
    """The kernels' own time per call of fn (REPS calls back to back) and by kernel name."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize()
    names, total = {}, 0.0
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            ms = (e.time_range.end - e.time_range.start) / 1e3
            total += ms
            c = names.setdefault(e.name[:120], [0, 0.0])
            c[0] += 1
            c[1] += ms / REPS
    return total / REPS, names


def event_ms(fn):
    """The sweep's way (scripts/h200_sweeps.py bench): one call between two events, the median of 20."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(REPS):
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts) // 2]


def sdpa(out):
    for impl, be in BACKENDS.items():
        for b, h, hkv, s, d in shapes():
            for causal in (True, False):
                for drop in (0.0, 0.1):
                    r = dict(kind="sdpa_gpu", impl=impl, b=b, h=h, hkv=hkv, s=s, d=d, causal=causal, dropout=drop)
                    try:
                        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                        k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                        v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                        with sdpa_kernel(be):
                            f = lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=causal,
                                                                       enable_gqa=hkv != h)
                            o = f()
                            go = torch.randn_like(o)
                            g = lambda: torch.autograd.grad(o, (q, k, v), go, retain_graph=True)
                            r["fwd_gpu_ms"], kf = gpu_ms(f)
                            r["bwd_gpu_ms"], kb = gpu_ms(g)
                            r["fwd_ms"], r["bwd_ms"] = event_ms(f), event_ms(g)
                            r["kernels"] = dict(fwd=kf, bwd=kb)
                    except Exception as e:  # a shape the backend refuses: say so and go on
                        r["error"] = repr(e)[:160]
                    out.write(json.dumps(r) + "\n")
                    out.flush()
                    q = k = v = o = go = None
                    torch.cuda.empty_cache()


def ckpt(out, want):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "groundtruth"))
    spec = importlib.util.spec_from_file_location("collect_more", os.path.join(here, "..", "groundtruth",
                                                                               "collect_more.py"))
    M = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(M)
    M.warmup()
    for c in M.FAM:
        if not c.get("ckpt") or (want and c["id"] not in want):
            continue
        for keep in (True, False):
            try:
                out.write(json.dumps(ckpt_case(M, dict(c), keep)) + "\n")
            except Exception as e:
                out.write(json.dumps(dict(kind="ckpt_profile", case=c["id"], preserve_rng_state=keep,
                                          error=repr(e)[:200])) + "\n")
            out.flush()
            M.G.cleanup()


def ckpt_case(M, c, keep):
    """One checkpointed family case: steady step time, host phases, GPU busy time and host waits."""
    torch.manual_seed(0)
    dtype = M.BF if c.get("prec") == "bf16" else None
    m, mt, seq = M.build_hf(c["model"], c.get("attn"), dtype, None)
    seq = c.get("seq", seq)
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False,
                                                                   "preserve_rng_state": keep})
    m.train()
    opt = torch.optim.AdamW(list(m.parameters()), lr=1e-4)
    ac = {"amp-bf16": M.BF}.get(c.get("prec"))
    batch_fn = lambda: M.make_batch(m, mt, c["batch"], seq, c.get("target"))

    def one(times=None):
        batch = batch_fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=ac, enabled=ac is not None):
            loss = m(**batch).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if times is not None:
            times.append((time.perf_counter() - t0, t1 - t0, t2 - t1))

    for _ in range(2):
        one()
    ts = []
    for _ in range(3):
        one(ts)
    ts.sort()
    step, fwd, bwd = ts[1]
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        one()
    ev = sorted((e.time_range.start, e.time_range.end) for e in p.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    gaps = [max(0.0, s1 - e0) for (_, e0), (s1, _) in zip(ev, ev[1:])]
    large = [g for g in gaps if g > GAP_US]
    del m, opt
    return dict(kind="ckpt_profile", case=c["id"], preserve_rng_state=keep, step_ms=step * 1e3,
                fwd_host_ms=fwd * 1e3, bwd_host_ms=bwd * 1e3, busy_ms=sum(e - s for s, e in ev) / 1e3,
                gap_large_ms=sum(large) / 1e3, gaps_large=len(large), kernels=len(ev))


def main():
    mode, path = sys.argv[1], sys.argv[2]
    with open(path, "w") as out:
        if mode == "sdpa":
            sdpa(out)
        elif mode == "ckpt":
            ckpt(out, sys.argv[3:])
        else:
            sys.exit("mode: sdpa or ckpt")


if __name__ == "__main__":
    main()
