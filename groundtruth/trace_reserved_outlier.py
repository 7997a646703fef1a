"""Allocator trace of the fine-tuning set's reserved outlier (2026-12-01, H200, same stack): llama-1b LoRA r16 on
every linear layer, bf16 base under autocast, every layer checkpointed, batch 8, seq 2048, whose peak reserved the
simulator puts 4.69 % low with the allocated bytes exact. The committed trace of the same setup at batch 2, seq 512
(traces/llama-1b-lora-r16-all-bf16base-amp-b2-s512-ckpt) is exact in reserved, so only the full size shows it.

    python3 groundtruth/trace_reserved_outlier.py OUTDIR   # writes OUTDIR/llama-1b-lora-r16-all-bf16base-amp-b8-ckpt.trace.jsonl.gz
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collect_more as M  # noqa: E402
import trace_more as T  # noqa: E402

out = sys.argv[1]
M.warmup()
T.traced(M.run_ft, dict(T.FT["llama-1b-lora-r16-all-bf16base-amp-b8-ckpt"], steps=2),
         out + "/llama-1b-lora-r16-all-bf16base-amp-b8-ckpt.trace.jsonl.gz")
