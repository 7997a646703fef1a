"""Allocator trace of the held-out flan-t5-base case whose checkpointed forward peak is predicted 17 % high (step
1; 10 % later): ho-flan-t5-base-bf16-b16-ckpt exactly as collect_heldout.py measured it (bf16, b16, seq 512,
target 128, non-reentrant checkpointing, SDPA), 2 steps.

    python3 groundtruth/heldout/trace_flan_ckpt.py OUTDIR   # writes OUTDIR/ho-flan-t5-base-bf16-b16-ckpt.trace.jsonl.gz
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # collect_heldout.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # collect_more.py, trace_more.py
import collect_heldout as H  # noqa: E402  (registers flan-t5-base in collect_more.FAMILIES)
import trace_more as T  # noqa: E402

M = H.M
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
case = next(c for c in H.FAM if c["id"] == "ho-flan-t5-base-bf16-b16-ckpt")
M.warmup()
T.traced(M.run_family, dict(case, steps=2), os.path.join(out, case["id"] + ".trace.jsonl.gz"))
