"""Kernel counts and the GPU's gaps between kernels in the ground-truth steps (docs/STEP_TIME.md "Single-GPU figures").

    python3 calibrate/vp-kernels.py OUT.jsonl [id-filter ...]     (from the repository root, one GPU)

For each case of shared/groundtruth/collect.py named by a filter (all training and inference cases without
accumulation when none is given; a filter may also name a case of groundtruth/extra.py or collect_encdec.py's
checkpointed ViT-B/16, more_cases): one steady step under torch.profiler (CUDA activity only), issued as collect.py
issues it, and a second one with a synchronize between its phases to count each phase's kernels. One JSON object per
line:
  {"kind":"kernel_profile","case":ID,"kernels":N,"busy_ms":..,"span_ms":..,
   "gap_small_ms":..,"gaps_small":N,"gap_large_ms":..,"gaps_large":N,"phase_kernels":{"fwd":N,"bwd":N,"opt":N}}
kernels counts every GPU activity (kernels, memsets, copies) of the unsynchronized step; busy_ms sums their durations;
span_ms runs from the first one's start to the last one's end; the gaps between consecutive activities are split at
gap_us (10 us): the small ones are the GPU's own time between back-to-back kernels, the large ones waits for the host.
by_name sums the unsynchronized step's activities by kernel name (cut at NAME_CHARS characters): which kernels the
step's GPU time is made of (GEMM, attention, cross-entropy, elementwise), to compare with the model's kinds.
"""
import importlib.util
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "groundtruth"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".shared"))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
import collect as G  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "vp_host", os.path.join(os.path.dirname(os.path.abspath(__file__)), "vp-host.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)  # its setup() and batch_of(): the case as collect.py runs it

GAP_US = 10.0
NAME_CHARS = 160


def step(c, st):
    """One step as collect.py runs it, without synchronizing inside."""
    m, fam, seq, opt, scaler, ac = st
    batch = H.batch_of(c, fam, seq)
    if c.get("infer"):
        with torch.no_grad(), torch.autocast("cuda", dtype=ac, enabled=ac is not None):
            G.loss_of(m, fam, batch)
        return
    with torch.autocast("cuda", dtype=ac, enabled=ac is not None):
        loss = G.loss_of(m, fam, batch)
    (scaler.scale(loss) if scaler else loss).backward()
    opt_step(c, st)


def opt_step(c, st):
    """The optimizer step and zero_grad, through GradScaler under amp fp16."""
    opt, scaler = st[3], st[4]
    if scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=c.get("set_to_none", True))


def by_name(prof):
    """{kernel name: [count, ms]} of the profiled GPU activities."""
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = e.name[:NAME_CHARS]
            c = out.setdefault(k, [0, 0.0])
            c[0] += 1
            c[1] += (e.time_range.end - e.time_range.start) / 1e3
    return out


def gpu_events(prof):
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted((e.time_range.start, e.time_range.end) for e in ev)


def phase_counts(c, st):
    """Kernels per phase: a step with a synchronize and a profiler window per phase."""
    counts = {}
    if c.get("infer"):
        return counts
    m, fam, seq, opt, scaler, ac = st
    batch = H.batch_of(c, fam, seq)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        with torch.autocast("cuda", dtype=ac, enabled=ac is not None):
            loss = G.loss_of(m, fam, batch)
        torch.cuda.synchronize()
    counts["fwd"] = len(gpu_events(p))
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        (scaler.scale(loss) if scaler else loss).backward()
        torch.cuda.synchronize()
    counts["bwd"] = len(gpu_events(p))
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        opt_step(c, st)
        torch.cuda.synchronize()
    counts["opt"] = len(gpu_events(p))
    return counts


def kernel_profile(c):
    st = H.setup(c)
    for _ in range(2):
        step(c, st)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        step(c, st)
        torch.cuda.synchronize()
    ev = gpu_events(p)
    names = by_name(p)
    busy = sum(e - s for s, e in ev)
    small = large = 0.0
    ns = nl = 0
    for (s0, e0), (s1, _) in zip(ev, ev[1:]):
        g = max(0.0, s1 - e0)
        if g <= GAP_US:
            small += g
            ns += 1
        else:
            large += g
            nl += 1
    r = dict(kind="kernel_profile", case=c["id"], kernels=len(ev), busy_ms=busy / 1e3,
             span_ms=(ev[-1][1] - ev[0][0]) / 1e3 if ev else 0.0, gap_small_ms=small / 1e3, gaps_small=ns,
             gap_large_ms=large / 1e3, gaps_large=nl, phase_kernels=phase_counts(c, st), by_name=names)
    del st
    G.cleanup()
    return r


def more_cases():
    """Cases of other collectors that collect.py's build() makes as they run them, by their ground-truth ids:
    groundtruth/extra.py's CASES (resnet50 amp b32, vit-b16 amp b64 and fp32 b32, bert-large amp b16, ...) and
    groundtruth/collect_encdec.py's checkpointed ViT-B/16 (CkptSeq around each encoder layer)."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("gt_extra", os.path.join(here, "..", "groundtruth", "extra.py"))
    x = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(x)  # its __main__ block does not run
    cases = [dict(c, id=x.cid(c)) for c in x.CASES]
    for b in (64, 128):
        cases.append(dict(id="vit-b16-amp-bf16-b%d-ckpt" % b, model="vit-b16", batch=b, prec="amp-bf16", ckpt=True))
    return cases


def main():
    out = open(sys.argv[1], "w")
    want = sys.argv[2:]
    for c in G.CASES + (more_cases() if want else []):
        if c.get("accum", 1) > 1 or (want and not any(w == c["id"] for w in want)):
            continue
        try:
            out.write(json.dumps(kernel_profile(c)) + "\n")
        except Exception as e:  # a case that does not run here: say so and go on
            out.write(json.dumps(dict(kind="kernel_profile", case=c["id"], error=repr(e)[:200])) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
