"""GEMMs whose row length is not a multiple of 8 elements: the language-model head of a 50257- or 30522-token
vocabulary (docs/STEP_TIME.md "GEMMs").

    python3 calibrate/vp-gemm-align.py OUT.jsonl            (one GPU, about 30 s)

For each dtype (bf16, fp32), hidden size d and rows m, and each vocabulary V, the three GEMMs of a head
y = x W^T (W [V, d]) as autograd runs them: the forward x [m, d] @ W^T, the input gradient g [m, V] @ W and the
weight gradient g^T @ x, each timed with CUDA events (median of REPS after a warm-up). V is taken as it comes
(50257, 30522: rows of 50257 or 30522 elements, 2- or 4-byte aligned only) and rounded up to a multiple of 64
(50304, 30528): the same work with 16-byte aligned rows. One JSON object per line:
  {"kind":"gemm_align","dtype":..,"form":"fwd"|"dgrad"|"wgrad","m":..,"d":..,"vocab":..,"ms":..,"tflops":..}
"""
import json
import sys

import torch

REPS = 20


def timed(fn):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def main():
    out = open(sys.argv[1], "w")
    torch.backends.cuda.matmul.allow_tf32 = False
    for dt in (torch.bfloat16, torch.float32):
        for d in (768, 1024):
            for m in (4096, 8192, 32768):
                if dt == torch.float32 and m > 8192:
                    continue
                for v in (50257, 50304, 30522, 30528):
                    x = torch.randn(m, d, device="cuda", dtype=dt)
                    w = torch.randn(v, d, device="cuda", dtype=dt)
                    g = torch.randn(m, v, device="cuda", dtype=dt)
                    forms = (("fwd", lambda: x @ w.t()), ("dgrad", lambda: g @ w), ("wgrad", lambda: g.t() @ x))
                    for name, fn in forms:
                        ms = timed(fn)
                        out.write(json.dumps(dict(kind="gemm_align", dtype=str(dt).replace("torch.", ""), form=name,
                                                  m=m, d=d, vocab=v, ms=ms,
                                                  tflops=2.0 * m * d * v / ms / 1e9)) + "\n")
                        out.flush()
                    del x, w, g
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
