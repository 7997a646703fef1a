#!/usr/bin/env python3
"""A training job that goes over its memory budget, for `vramplan watch`.

GPT-2 small (the model, batch and step of shared/groundtruth/collect.py,
through scripts/train_step.py) trains normally for --good steps; then it
makes a classic mistake: it keeps every step's loss tensor in a Python
list (`losses.append(loss)` instead of `loss.item()`), so each step's
autograd graph, with its saved activations, stays alive, and the memory
grows step by step until PyTorch raises OutOfMemoryError at the budget
(torch.cuda.set_per_process_memory_fraction). It prints "step N" and
memory_reserved after every step.

Alone it runs out of memory:

    python3 scripts/watch_demo.py --budget-gib 24

Under watch, with the plan of the same job, it is stopped before that:

    ./vramplan watch --model gpt2-small --batch 2 --seq 512 \
        --precision amp-bf16 --budget 24GiB --alert 80% --kill-at 90% \
        --interval 0.01 --csv OUT/watch.csv --html OUT/watch.html -- \
        python3 scripts/watch_demo.py --budget-gib 24

watch's budget is the device memory, as nvidia-smi shows it; the
allocator's cap here is the same number of bytes for its reserved memory,
so the job runs out of memory only past the budget plus its CUDA context.
Each leaked step adds about 1 GiB (batch 2, seq 512) in a few milliseconds,
so --kill-at 90 % leaves about three steps of room: the job is stopped at
the step that crosses 90 %, in its pause between steps."""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step as ts  # noqa: E402

GiB = 1 << 30


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-gib", type=float, required=True)
    p.add_argument("--model", default="gpt2-small")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--good", type=int, default=4,
                   help="steps before the leak starts (default 4)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--pause", type=float, default=0.4,
                   help="seconds between steps, as a data loader would "
                        "take (default 0.4)")
    a = p.parse_args()

    torch.ones(1, device="cuda") @ torch.ones(1, 1, device="cuda")
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(a.budget_gib * GiB / total)
    m, fam, seq0 = ts.build(a.model, "sdpa", False)
    seq = a.seq or seq0
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    losses = []
    for step in range(1, a.steps + 1):
        batch = ts.make_batch(fam, a.model, a.batch, seq)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ts.loss_of(m, fam, batch)
        if step > a.good:
            # the mistake: the graph of this step stays referenced
            losses.append(loss)
            loss.backward(retain_graph=True)
        else:
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        print("step %d loss %.3f reserved %.2f GiB" %
              (step, loss.item(), torch.cuda.memory_reserved() / GiB),
              flush=True)
        time.sleep(a.pause)
    return 0


if __name__ == "__main__":
    sys.exit(main())
