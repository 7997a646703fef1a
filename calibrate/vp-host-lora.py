"""The host's cost of a peft LoRA / DoRA linear layer against a frozen nn.Linear (issue 13; docs/STEP_TIME.md
"LoRA's host per layer").

    python3 calibrate/vp-host-lora.py OUT.jsonl        (one GPU; torch 2.11 and peft 0.21 of the ground truth)

The single-GPU LoRA steps the model times longest are the ones with adapters on few projections (q, v or q, k, v, o:
+4 to +19 % against their measurements), those it times shortest have adapters on every linear (-1 to -14 %): the
host's cost of an adapted layer against a frozen one decides both. This measures it on tensors small enough that
every kernel takes less than its launch (the host leads; the queue never fills): a stack of L linear layers
(hidden 256, bias off, bf16 weights, under autocast bf16 as the ground truth's "bf16base-amp" cases; fp32 base
under autocast for "fp32base-amp"), frozen, each either plain or wrapped by peft (r 16, alpha 32, dropout 0, fp32
adapters: peft's autocast_adapter_dtype; DoRA with use_dora). Forward: the stack's call on a [16, 256] input that
requires grad (so that the frozen layers' backward runs, as in a transformer where the adapters sit between
layers), timed on the host without a synchronize inside (N calls, the median of REPS); backward: .backward() of one
forward's sum, timed alone. One line per variant and phase: {"kind":"host_lora","variant":..,"base":..,"layers":L,
"phase":"fwd"|"bwd","us_per_layer":.., "launches_per_layer":..} (launches counted under torch.profiler, CUDA
activity, one call).
"""
import json
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

L, H, N, REPS = 32, 256, 30, 7


def stack(variant, base):
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(H, H, bias=False) for _ in range(L)]).cuda().to(base)
    for p in m.parameters():
        p.requires_grad_(False)
    if variant != "frozen":
        from peft import LoraConfig, inject_adapter_in_model
        cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[str(i) for i in range(L)],
                         use_dora=variant == "dora")
        m = inject_adapter_in_model(cfg, m)
        for n, p in m.named_parameters():
            p.requires_grad_("lora_" in n)
            if "lora_" in n:
                p.data = p.data.float()  # peft's autocast_adapter_dtype: fp32 adapters on a 16-bit base
    return m


def timed(fn):
    ts = []
    for _ in range(REPS + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        ts.append(t1 - t0)
    torch.cuda.synchronize()
    return statistics.median(ts[1:])


def launches(fn):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def measure(variant, base):
    m = stack(variant, base)
    x = torch.randn(16, H, device="cuda", dtype=base, requires_grad=True)

    def fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return m(x)

    def fwds():
        for _ in range(N):
            fwd()
    out = []
    for _ in range(3):
        fwd().float().sum().backward()
    tf = timed(fwds) / N
    out.append(dict(phase="fwd", us=tf * 1e6, launches=launches(fwd)))
    ys = []

    def prep():
        ys.clear()
        ys.extend(fwd().float().sum() for _ in range(REPS + 2))

    prep()
    it = iter(ys)
    tb = timed(lambda: next(it).backward())
    prep()
    it = iter(ys)
    nb = launches(lambda: next(it).backward())
    out.append(dict(phase="bwd", us=tb * 1e6, launches=nb))
    return out


def main():
    import peft
    with open(sys.argv[1], "w") as f:
        f.write(json.dumps(dict(kind="env", torch=torch.__version__, peft=peft.__version__,
                                gpu=torch.cuda.get_device_name())) + "\n")
        for base in (torch.bfloat16, torch.float32):
            for variant in ("frozen", "lora", "dora"):
                for r in measure(variant, base):
                    line = dict(kind="host_lora", variant=variant, base=str(base).split(".")[-1], layers=L,
                                phase=r["phase"], us_per_layer=round(r["us"] / L, 3),
                                launches_per_layer=round(r["launches"] / L, 3))
                    f.write(json.dumps(line) + "\n")
                    print(line, flush=True)


if __name__ == "__main__":
    main()
