"""Allocator traces of two open questions (2026-12-01, H200, same stack): the held-out phi3 LoRA case on the packed
qkv_proj (+6 % predicted) and llama-7b generate() p4096 n64 (reserved −9.8 % over a long dynamic-cache decode).

    python3 groundtruth/heldout/trace_open_questions.py OUTDIR   # writes the two .trace.jsonl.gz into OUTDIR
"""
import sys, os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import collect_more as M, trace_more as T
M.LORA_TARGETS["phi3-qkvo"] = ["qkv_proj", "o_proj"]
out = sys.argv[1]
M.warmup()
T.traced(M.run_ft, dict(id="ho-phi3-mini-16l-lora-r8-qkv-o-bf16base-amp-b2", model="phi3-mini-16l", batch=2, seq=2048,
         prec="amp-bf16", base_dtype="bf16", steps=2, lora=dict(r=8, alpha=16, targets="phi3-qkvo", dropout=0.05)),
         out + "/ho-phi3-mini-16l-lora-r8-qkv-o-bf16base-amp-b2.trace.jsonl.gz")
T.traced(M.run_generate, dict(id="llama-7b-gen-b4-p4096-n64-dynamic", model="llama-7b", batch=4, cache="dynamic",
         generate=dict(prompt=4096, new_tokens=64, sample=False, pad=False), reps=1),
         out + "/llama-7b-gen-b4-p4096-n64-dynamic.trace.jsonl.gz")
