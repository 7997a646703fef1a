"""Host time of the ground-truth training steps, phase by phase (docs/STEP_TIME.md "Host").

    python3 calibrate/vp-host.py OUT.jsonl [id-filter]     (from the repository root, one GPU)

For each case of shared/groundtruth/collect.py: the wall time the Python thread spends issuing the forward, the
backward and the optimizer step of a steady step, without waiting for the GPU (no synchronize inside the step; the
CUDA launch queue holds ~1000 kernels, more than these cases issue per phase, so the host is never held back), and
the same step's wall time with a synchronize at its end. One JSON object per line:
  {"kind":"host_profile","case":ID,"fwd_ms":..,"bwd_ms":..,"opt_ms":..,"step_ms":..,"ops":N}
where ops counts the forward's module calls (leaf modules, as vramplan's graph has them).
"""
import json, os, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "groundtruth"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".shared"))
import torch  # noqa: E402
import collect as G  # noqa: E402


def leaf_calls(m):
    n = [0]
    hooks = [mod.register_forward_pre_hook(lambda *_: n.__setitem__(0, n[0] + 1))
             for mod in m.modules() if not list(mod.children())]
    return n, hooks


def setup(c):
    """The case's model, optimizer, GradScaler and autocast dtype, as collect.py makes them."""
    m, fam, seq = G.build(c["model"], c.get("attn", "sdpa"), c.get("ckpt", False))
    prec = c.get("prec", "fp32")
    if prec == "bf16":
        m = m.to(torch.bfloat16)
    m.train()
    opt = {"adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-4, fused=True),
           "adamw-forloop": lambda p: torch.optim.AdamW(p, lr=1e-4, foreach=False),
           "sgd": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9)}.get(
        c.get("opt", "adamw"), lambda p: torch.optim.AdamW(p, lr=1e-4))(m.parameters())
    scaler = torch.amp.GradScaler("cuda") if prec == "amp-fp16" else None
    ac = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(prec)
    return m, fam, seq, opt, scaler, ac


def batch_of(c, fam, seq):
    batch = G.make_batch(fam, c["model"], c["batch"], c.get("seq", seq))
    if c.get("prec", "fp32") == "bf16" and "x" in batch:
        batch["x"] = batch["x"].to(torch.bfloat16)
    return batch


def host_phases(c, steps=5):
    m, fam, seq, opt, scaler, ac = setup(c)
    rows = []
    for s in range(steps):
        batch = batch_of(c, fam, seq)
        n, hooks = leaf_calls(m)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=ac, enabled=ac is not None):
            loss = G.loss_of(m, fam, batch)
        t1 = time.perf_counter()
        for h in hooks:
            h.remove()
        (scaler.scale(loss) if scaler else loss).backward()
        t2 = time.perf_counter()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t0, n[0]))
        del loss, batch
    del m, opt
    G.cleanup()
    r = sorted(rows[1:], key=lambda x: x[3])[len(rows[1:]) // 2]
    return dict(kind="host_profile", case=c["id"], fwd_ms=r[0] * 1e3, bwd_ms=r[1] * 1e3, opt_ms=r[2] * 1e3,
                step_ms=r[3] * 1e3, ops=r[4])


def main():
    out = open(sys.argv[1], "w")
    want = sys.argv[2] if len(sys.argv) > 2 else ""
    for c in G.CASES:
        if want and want not in c["id"] or c.get("infer") or c.get("accum", 1) > 1:
            continue
        try:
            out.write(json.dumps(host_phases(c)) + "\n")
        except Exception as e:  # a case that does not run here: say so and go on
            out.write(json.dumps(dict(kind="host_profile", case=c["id"], error=repr(e)[:200])) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
