"""How many kernel launches the host can issue ahead of the GPU before a launch blocks, and what one launch costs
the Python thread when it does not (docs/STEP_TIME.md, "The launch queue"). The GPU is held busy by
torch.cuda._sleep; the host then launches small kernels without synchronizing and times each call: the first call
that takes longer than the sleep's remainder minus a margin is the one that waited for a free slot.

    python3 calibrate/vp-launch-queue.py OUT.jsonl
"""
import json, sys, time
import torch


def trial(launch, n, cycles):
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    t = [time.perf_counter()]
    for _ in range(n):
        launch()
        t.append(time.perf_counter())
    torch.cuda.synchronize()
    d = [b - a for a, b in zip(t, t[1:])]
    block = next((i for i, x in enumerate(d) if x > 2e-3), None)
    free = sorted(d[:block] if block else d)
    return dict(blocked_at=block, launch_us_median=round(1e6 * free[len(free) // 2], 3),
                launch_us_p10=round(1e6 * free[len(free) // 10], 3), n=n)


def main():
    out = sys.argv[1]
    x = torch.zeros(1024, device="cuda")
    y = torch.zeros(1024, device="cuda")
    forms = {"add_": lambda: x.add_(1.0), "mul3": lambda: torch.mul(x, y, out=x),
             "addcmul_": lambda: x.addcmul_(y, y, value=0.5), "fill_": lambda: x.fill_(0.0)}
    for f in forms.values():
        for _ in range(200):
            f()
    torch.cuda.synchronize()
    rows = []
    for name, f in forms.items():
        for rep in range(3):
            r = trial(f, 16384, 1_500_000_000)
            r.update(kind="launch_queue", form=name, rep=rep)
            rows.append(r)
            print(json.dumps(r), flush=True)
    env = dict(kind="env", torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    with open(out, "w") as fh:
        for r in [env] + rows:
            fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
