"""Kernel-level timing sweeps on one GPU, for vramplan's step-time model (docs/STEP_TIME.md).

    python3 scripts/h200_sweeps.py OUT.jsonl [gemm,sdpa,membound,optim,launch,profile] [budget_s]

Every time is the median of CUDA-event-timed repetitions after warm-up, on random data (never zeros), inputs
rotated among several buffers when they would fit in L2. One JSON object per line:
  {"kind":"env",...}
  {"kind":"gemm","dtype":D,"m":M,"n":N,"k":K,"ms":..,"tflops":..}           torch.matmul (M,K)x(K,N); fp8: _scaled_mm
  {"kind":"sdpa","impl":I,"dtype":"bf16","b":..,"h":..,"hkv":..,"s":..,"d":..,"causal":..,"fwd_ms":..,"bwd_ms":..}
  {"kind":"membound","op":OP,"bytes":B,"ms":..}                             B = bytes read + written (counted)
  {"kind":"optim","opt":O,"numel":N,"tensors":T,"dtype":..,"ms":..}
  {"kind":"launch","us_per_kernel":..}
  {"kind":"step_profile","case":ID,"step_ms":..,"gpu_busy_ms":..,"by_cat":{...}}
"""
import json, math, os, sys, time
import torch
import torch.nn.functional as F

DEV = "cuda"
OUT = None
T0 = time.time()
BUDGET = 1e9


def emit(d):
    OUT.write(json.dumps(d) + "\n"); OUT.flush()


def bench(fn, reps=None, target_ms=60.0):
    """Median ms of fn() over CUDA events; reps chosen so the run takes about target_ms."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); fn(); e.record(); torch.cuda.synchronize()
    one = max(s.elapsed_time(e), 1e-3)
    n = reps or int(min(50, max(5, target_ms / one)))
    ts = []
    for _ in range(n):
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def over_budget():
    return time.time() - T0 > BUDGET


def sweep_gemm():
    torch.backends.cuda.matmul.allow_tf32 = False
    Ms = (128, 512, 2048, 8192, 32768)
    NKs = (512, 1024, 2048, 4096, 8192, 14336)
    for dt in ("bf16", "fp16", "tf32", "fp32", "fp8"):
        for m in Ms:
            for n in NKs:
                for k in NKs:
                    if over_budget():
                        return
                    fl = 2.0 * m * n * k
                    if dt == "fp32" and fl > 1.2e12:
                        continue
                    torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
                    try:
                        if dt == "fp8":
                            a = torch.randn(m, k, device=DEV).to(torch.float8_e4m3fn)
                            b = torch.randn(n, k, device=DEV).to(torch.float8_e4m3fn).t()
                            one = torch.ones((), device=DEV)
                            fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                        else:
                            t = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dt, torch.float32)
                            a = torch.randn(m, k, device=DEV, dtype=t)
                            b = torch.randn(k, n, device=DEV, dtype=t)
                            fn = lambda: torch.matmul(a, b)
                        ms = bench(fn)
                        emit(dict(kind="gemm", dtype=dt, m=m, n=n, k=k, ms=ms, tflops=fl / ms / 1e9))
                    except Exception as e:
                        emit(dict(kind="gemm", dtype=dt, m=m, n=n, k=k, error=repr(e)[:200]))
                    del fn
                    a = b = None
    torch.backends.cuda.matmul.allow_tf32 = False


def sweep_sdpa():
    from torch.nn.attention import sdpa_kernel, SDPBackend
    be = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
          "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}
    shapes = [(b, h, hkv, s, d) for (b, s) in ((16, 512), (8, 1024), (4, 2048), (2, 4096), (1, 8192))
              for (h, hkv, d) in ((12, 12, 64), (16, 16, 64), (32, 32, 128), (32, 8, 128), (8, 1, 256))]
    for impl in ("flash", "efficient", "cudnn", "math"):
        for (b, h, hkv, s, d) in shapes:
            if over_budget():
                return
            if impl == "math" and s > 2048:
                continue
            for causal in (True, False):
                try:
                    q = torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
                    k = torch.randn(b, hkv, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
                    v = torch.randn(b, hkv, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
                    gqa = hkv != h
                    with sdpa_kernel(be[impl]):
                        f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                        fwd = bench(f)
                        o = f()
                        go = torch.randn_like(o)
                        bw = bench(lambda: torch.autograd.grad(o, (q, k, v), go, retain_graph=True))
                    emit(dict(kind="sdpa", impl=impl, dtype="bf16", b=b, h=h, hkv=hkv, s=s, d=d, causal=causal,
                              fwd_ms=fwd, bwd_ms=bw))
                    del o, go
                except Exception as e:
                    emit(dict(kind="sdpa", impl=impl, b=b, h=h, hkv=hkv, s=s, d=d, causal=causal,
                              error=repr(e)[:160]))
                q = k = v = None
                torch.cuda.empty_cache()


def sweep_membound():
    for mb in (1, 4, 16, 64, 256, 1024, 4096):
        if over_budget():
            return
        n = mb * (1 << 20) // 2
        x = torch.randn(n, device=DEV, dtype=torch.bfloat16)
        y = torch.randn(n, device=DEV, dtype=torch.bfloat16)
        rows = max(1, n // 4096)
        x2 = x[: rows * 4096].view(rows, 4096)
        w = torch.ones(4096, device=DEV, dtype=torch.bfloat16)
        ops = {
            "copy": (lambda: y.copy_(x), 2 * 2 * n),
            "add": (lambda: x + y, 3 * 2 * n),
            "gelu": (lambda: F.gelu(x), 2 * 2 * n),
            "silu": (lambda: F.silu(x), 2 * 2 * n),
            "layernorm": (lambda: F.layer_norm(x2, (4096,), w, w), 2 * 2 * rows * 4096),
            "rmsnorm_py": (lambda: (x2.float() * torch.rsqrt(x2.float().pow(2).mean(-1, keepdim=True) + 1e-6))
                           .to(torch.bfloat16) * w, 2 * 2 * rows * 4096),
            "softmax": (lambda: torch.softmax(x2, -1), 2 * 2 * rows * 4096),
            "to_fp32": (lambda: x.float(), 6 * n),
        }
        for name, (fn, byts) in ops.items():
            try:
                emit(dict(kind="membound", op=name, bytes=byts, ms=bench(fn)))
            except Exception as e:
                emit(dict(kind="membound", op=name, bytes=byts, error=repr(e)[:160]))
        V = 32000
        r = max(1, (mb << 20) // (V * 2))
        logits = torch.randn(r, V, device=DEV, dtype=torch.bfloat16)
        lab = torch.randint(0, V, (r,), device=DEV)
        emit(dict(kind="membound", op="cross_entropy", bytes=r * V * 2, rows=r, vocab=V,
                  ms=bench(lambda: F.cross_entropy(logits.float(), lab))))
        del x, y, x2, logits
        torch.cuda.empty_cache()


def sweep_optim():
    for total in (10**7, 10**8, 10**9):
        for tensors in (10, 100, 1000):
            if over_budget():
                return
            for dt in (torch.float32, torch.bfloat16):
                ps = [torch.randn(total // tensors, device=DEV, dtype=dt, requires_grad=True) for _ in range(tensors)]
                for p in ps:
                    p.grad = torch.randn_like(p)
                for name, mk in (("adamw", lambda: torch.optim.AdamW(ps, lr=1e-4)),
                                 ("adamw-fused", lambda: torch.optim.AdamW(ps, lr=1e-4, fused=True)),
                                 ("adamw-forloop", lambda: torch.optim.AdamW(ps, lr=1e-4, foreach=False)),
                                 ("sgd", lambda: torch.optim.SGD(ps, lr=1e-3, momentum=0.9))):
                    if name == "adamw-forloop" and tensors > 100:
                        continue
                    try:
                        opt = mk()
                        opt.step()
                        ms = bench(opt.step, reps=7)
                        emit(dict(kind="optim", opt=name, numel=total, tensors=tensors,
                                  dtype=str(dt).replace("torch.", ""), ms=ms))
                        del opt
                    except Exception as e:
                        emit(dict(kind="optim", opt=name, numel=total, tensors=tensors, error=repr(e)[:160]))
                del ps
                torch.cuda.empty_cache()


def sweep_launch():
    x = torch.zeros(1, device=DEV)
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20000):
        x.add_(1)
    torch.cuda.synchronize()
    emit(dict(kind="launch", us_per_kernel=(time.perf_counter() - t) / 20000 * 1e6, what="x.add_(1) eager loop"))


PROFILE_CASES = ["mlp10-fp32-b1024", "gpt2-small-amp-bf16-b8", "gpt2-small-fp32-b8", "gpt2-small-bf16-b8",
                 "gpt2-medium-amp-bf16-b8", "gpt2-small-amp-bf16-b16-ckpt", "bert-base-amp-bf16-b32",
                 "resnet50-fp32-b64", "resnet50-amp-bf16-b64", "gpt2-small-amp-bf16-b8-adamw-fused",
                 "gpt2-small-amp-bf16-b8-adamw-forloop", "mlp10-bf16-b1024"]


def category(name):
    n = name.lower()
    if any(x in n for x in ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "wgmma", "xmma_gemm", "ampere_")):
        return "gemm"
    if any(x in n for x in ("flash", "fmha", "attention", "efficient_attention")):
        return "attention"
    if any(x in n for x in ("adam", "sgd", "multi_tensor", "foreach")):
        return "optimizer"
    if any(x in n for x in ("conv", "cudnn", "implicit", "winograd", "wgrad", "dgrad")):
        return "conv"
    if any(x in n for x in ("elementwise", "vectorized", "reduce", "norm", "softmax", "cross", "nll", "copy",
                            "cat", "index", "embedding", "dropout", "gelu", "fill")):
        return "elementwise"
    return "other"


def step_profiles():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".shared"))
    import collect as G
    from torch.profiler import profile, ProfilerActivity
    byid = {c["id"]: c for c in G.CASES}
    for cid in PROFILE_CASES:
        if over_budget():
            return
        c = dict(byid[cid], steps=3)
        try:
            def prof_run(steps):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    r = G.run_case(dict(c, steps=steps))
                G.cleanup()
                by = {}
                for ev in prof.key_averages():
                    t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
                    if t and "cuda" in str(ev.device_type).lower():
                        cat = category(ev.key)
                        by[cat] = by.get(cat, 0.0) + t / 1e3
                return r, by
            # one steady step's kernels: a 3-step run less a 2-step run (model build and step 1 cancel out)
            r3, b3 = prof_run(3)
            r2, b2 = prof_run(2)
            by = {k: b3.get(k, 0.0) - b2.get(k, 0.0) for k in set(b3) | set(b2)}
            emit(dict(kind="step_profile", case=cid, step_ms_profiled=r3["step_ms"], gpu_busy_ms=sum(by.values()),
                      by_cat=by, note="kernel time of one steady step: profiled 3-step run minus 2-step run"))
        except Exception as e:
            emit(dict(kind="step_profile", case=cid, error=repr(e)[:200]))


def main():
    global OUT, BUDGET
    path = sys.argv[1]
    which = sys.argv[2].split(",") if len(sys.argv) > 2 else ["launch", "membound", "gemm", "sdpa", "optim",
                                                              "profile"]
    BUDGET = float(sys.argv[3]) if len(sys.argv) > 3 else 1e9
    OUT = open(path, "a")
    torch.ones(1, device=DEV) @ torch.ones(1, 1, device=DEV)
    p = torch.cuda.get_device_properties(0)
    emit(dict(kind="env", torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
              sm_count=p.multi_processor_count, total=p.total_memory))
    fns = dict(gemm=sweep_gemm, sdpa=sweep_sdpa, membound=sweep_membound, optim=sweep_optim, launch=sweep_launch,
               profile=step_profiles)
    for w in which:
        t = time.time()
        fns[w]()
        print(w, "done in %.1fs" % (time.time() - t), flush=True)


if __name__ == "__main__":
    main()
