"""The GEMMs of a rank-r LoRA adapter (docs/STEP_TIME.md "LoRA's kernels"): the thin shapes the GEMM sweep
(gpus/h200.yaml, k from 512) does not reach, which src/timing.c lora_time times with vp__gemm_small.

    python3 calibrate/vp-gemm-rank.py OUT.jsonl            (one GPU, about a minute)

For each dtype (bf16, fp32 with TF32 off: peft's fp32 adapters outside autocast), rows m, layer width d (in = out)
and rank r, the six GEMMs of lora_B(lora_A(x)) as autograd runs them (peft/tuners/lora/layer.py Linear.forward;
tools/autograd/derivatives.yaml mm): lora_A's forward x [m, d] @ A^T [d, r], lora_B's a [m, r] @ B^T [r, d], lora_B's
weight gradient g^T [d, m] @ a, its input gradient g [m, d] @ B [d, r], lora_A's weight gradient ga^T [r, m] @ x, its
input gradient ga [m, r] @ A [r, d]. Each is timed with CUDA events two ways: one call alone ("alone_us", the median of
REPS) and REPS calls queued back to back ("queued_us", per call: what a step's stream sees). One JSON object per line:
  {"kind":"gemm_rank","dtype":..,"form":"a_fwd"|"b_fwd"|"b_wgrad"|"b_dgrad"|"a_wgrad"|"a_dgrad",
   "m":..,"n":..,"k":..,"r":..,"d":..,"alone_us":..,"queued_us":..}
with m x n x k the GEMM's shape (2mnk FLOPs).
"""
import importlib.util
import json
import os
import sys

import torch

_spec = importlib.util.spec_from_file_location(
    "vp_gemm_align", os.path.join(os.path.dirname(os.path.abspath(__file__)), "vp-gemm-align.py"))
_align = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_align)
REPS = _align.REPS


def alone(fn):
    """One call alone, after a warm-up call: vp-gemm-align.py's timing, in us."""
    return _align.timed(fn) * 1e3


def queued(fn):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(REPS):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / REPS


def main():
    out = open(sys.argv[1], "w")
    torch.backends.cuda.matmul.allow_tf32 = False
    for dt in (torch.bfloat16, torch.float32):
        for m in (2048, 4096, 8192, 16384):
            for d in (1024, 2048, 4096):
                for r in (8, 16, 32, 64):
                    x = torch.randn(m, d, device="cuda", dtype=dt)
                    g = torch.randn(m, d, device="cuda", dtype=dt)
                    wa = torch.randn(r, d, device="cuda", dtype=dt)
                    wb = torch.randn(d, r, device="cuda", dtype=dt)
                    a = torch.randn(m, r, device="cuda", dtype=dt)
                    forms = (("a_fwd", (m, r, d), lambda: x @ wa.t()), ("b_fwd", (m, d, r), lambda: a @ wb.t()),
                             ("b_wgrad", (d, r, m), lambda: g.t() @ a), ("b_dgrad", (m, r, d), lambda: g @ wb),
                             ("a_wgrad", (r, d, m), lambda: a.t() @ x), ("a_dgrad", (m, d, r), lambda: a @ wa))
                    for name, (gm, gn, gk), fn in forms:
                        out.write(json.dumps(dict(kind="gemm_rank", dtype=str(dt).replace("torch.", ""), form=name,
                                                  m=gm, n=gn, k=gk, r=r, d=d, alone_us=alone(fn),
                                                  queued_us=queued(fn))) + "\n")
                        out.flush()
                    del x, g, wa, wb, a
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
