"""Checkpoint's saved-variable hooks on the host, apart from any model (docs/STEP_TIME.md "What is left": the
recompute's price; src/timing_host.h VP__HOST_CKPT_PACK, VP__HOST_CKPT_RECOMPUTE).

    python3 calibrate/vp-ckpt-hooks.py OUT.jsonl        (from the repository root, one H200, a few minutes)
    python3 calibrate/vp-ckpt-hooks.py fit OUT.jsonl    (no GPU)

A stack of S segments of n elementwise ops on a small bf16 CUDA tensor (16 x 1024: each kernel a few us, so the
host leads the GPU), every op one launch that keeps k variables for the backward (torch 2.11
tools/autograd/derivatives.yaml; tools/autograd/gen_variable_type.py saves a mul operand only where the other
operand needs a gradient, `guard_for`):

    add   x + w   k = 0   (AddBackward0 keeps nothing)
    mulc  x * c   k = 1   (c a buffer, no gradient: MulBackward0 keeps c only)
    mulw  x * w   k = 2   (w a parameter: MulBackward0 keeps x and w)

run plain and under torch.utils.checkpoint.checkpoint (use_reentrant=False, one call per segment, the ground
truth's setting), the forward's and the backward's host time issued without a synchronize (vp-host.py's protocol),
the median of 30 steps after 5 warm-up steps. Each SavedVariable goes through the default hooks
(torch/csrc/autograd/saved_variable.cpp): in the forward checkpoint's pack_hook, in the backward the recomputed
forward (the first unpack of a segment runs it; a segment that saves nothing is never recomputed) with
_recomputation_hook's pack_hook and the unpack_hook. The fit, per phase, by least squares over the configurations:

    forward:   checkpointed - plain                                 = a x S + p x saved
    backward:  checkpointed - plain - recomputed launches x f       = a' x S + r x saved

with f the plain forward's host us per launch, recomputed launches S x (n - 1) where k > 0 (the early stop: the last
op's inputs are saved before its kernel, _StopRecomputationError), saved = S x n x k. p and r are the pack and the
recompute per saved variable, a and a' the fixed costs per segment (checkpoint's frame, the RNG state, the context
managers), which the model pairs cannot tell apart from p and r; all scaled by VP_HOST_FWD_KERNEL / f to the host
the model is calibrated on.

One JSON object per line: {"kind": "ckpt_hooks", "op", "saved_per_op", "segments", "ops", "plain_fwd_us",
"plain_bwd_us", "ckpt_fwd_us", "ckpt_bwd_us"}
"""
import importlib.util, json, os, statistics, sys, time

HOST_FWD_KERNEL_US = 30.97  # include/vramplan/timing.h VP_HOST_FWD_KERNEL
SAVED = {"add": 0, "mulc": 1, "mulw": 2}
CONFIGS = [(op, n, s) for op in SAVED for n in (4, 16, 64) for s in (4, 16)]


def build(torch, op, n, segs):
    class Seg(torch.nn.Module):
        def __init__(self):
            super().__init__()
            one = lambda: 1 + 0.01 * torch.randn(1024, device="cuda", dtype=torch.bfloat16)
            self.w = torch.nn.ParameterList(torch.nn.Parameter(one()) for _ in range(n))
            self.register_buffer("c", one())

        def forward(self, x):
            for w in self.w:
                x = x + w if op == "add" else x * (self.c if op == "mulc" else w)
            return x

    mods = [Seg() for _ in range(segs)]

    def run(x, use):
        for m in mods:
            x = torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False) if use else m(x)
        return x

    return mods, run


def measure(torch, mods, run, use, warm=5, steps=30):
    x = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    fwd, bwd = [], []
    for i in range(warm + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = run(x, use)
        t1 = time.perf_counter()
        loss = y.float().sum()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        x.grad = None
        for m in mods:
            m.zero_grad(set_to_none=True)
        if i >= warm:
            fwd.append(t1 - t0)
            bwd.append(t3 - t2)
    return statistics.median(fwd) * 1e6, statistics.median(bwd) * 1e6


def collect(out):
    import torch
    import torch.utils.checkpoint
    with open(out, "w") as fo:
        for op, n, s in CONFIGS:
            mods, run = build(torch, op, n, s)
            pf, pb = measure(torch, mods, run, False)
            cf, cb = measure(torch, mods, run, True)
            r = {"kind": "ckpt_hooks", "op": op, "saved_per_op": SAVED[op], "segments": s, "ops": n,
                 "plain_fwd_us": pf, "plain_bwd_us": pb, "ckpt_fwd_us": cf, "ckpt_bwd_us": cb}
            fo.write(json.dumps(r) + "\n")
            fo.flush()
            print(json.dumps(r))


def lsq(X, y):
    """Least squares by the normal equations (two or three unknowns), solved by fit-host.py's gauss."""
    spec = importlib.util.spec_from_file_location("fit_host", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                           "fit-host.py"))
    fh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fh)
    n = len(X[0])
    return fh.gauss([[sum(r[i] * r[j] for r in X) for j in range(n)] + [sum(r[i] * v for r, v in zip(X, y))]
                     for i in range(n)])


def fit(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    f = statistics.median(r["plain_fwd_us"] / (r["segments"] * r["ops"]) for r in rows)
    scale = HOST_FWD_KERNEL_US / f
    Xf, yf, Xb, yb = [], [], [], []
    for r in rows:
        s, n, k = r["segments"], r["ops"], r["saved_per_op"]
        sv = s * n * k
        rec = s * (n - 1) if k else 0
        Xf.append([s, sv])
        yf.append(r["ckpt_fwd_us"] - r["plain_fwd_us"])
        Xb.append([s, sv])
        yb.append(r["ckpt_bwd_us"] - r["plain_bwd_us"] - rec * f)
    a, p = lsq(Xf, yf)
    a2, rc = lsq(Xb, yb)
    print("host: %.2f us a forward launch (x %.3f to VP_HOST_FWD_KERNEL's host)" % (f, scale))
    print("forward:  %.2f us a segment, pack %.2f us a saved variable" % (a * scale, p * scale))
    print("backward: %.2f us a segment, recompute %.2f us a saved variable" % (a2 * scale, rc * scale))
    for r, x, v, xb, vb in zip(rows, Xf, yf, Xb, yb):
        print("  %-4s n %2d S %2d: fwd %8.1f us (fit %8.1f), bwd %8.1f us (fit %8.1f)" % (
            r["op"], r["ops"], r["segments"], v, a * x[0] + p * x[1], vb, a2 * xb[0] + rc * xb[1]))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "fit":
        fit(sys.argv[2])
    elif len(sys.argv) == 2:
        collect(sys.argv[1])
    else:
        sys.exit(__doc__)
