"""Fifth held-out set (stop 27): measured at the start of the session, before this session's step-time rules (the
host's cost per op, GPU kernel rules) were written, and not shown to the helpers that wrote them. Other models,
batches, lengths and precisions than any earlier case of these families. Protocol, fields and runners are
collect_more.py's through collect_heldout.py (imported); only the cases are new.

    python3 groundtruth/heldout/collect_heldout5.py OUTDIR      # OUTDIR/heldout-{lora,families}.jsonl
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collect_heldout as H  # noqa: E402

H.FT[:] = [
    dict(id="ho5-qwen2-0.5b-lora-r32-all-bf16base-amp-b8", model="qwen2-0.5b", batch=8, seq=1024, prec="amp-bf16",
         base_dtype="bf16", lora=dict(r=32, alpha=64, targets="all", dropout=0.05)),
    dict(id="ho5-phi3-mini-16l-lora-r16-qkv-o-bf16-b2-ckpt", model="phi3-mini-16l", batch=2, seq=2048, prec="bf16",
         base_dtype="bf16", ckpt=True, lora=dict(r=16, alpha=32, targets="phi3-qkvo", dropout=0.0)),
    dict(id="ho5-llama-1b-dora-r16-qkvo-bf16base-amp-b4", model="llama-1b", batch=4, seq=1024, prec="amp-bf16",
         base_dtype="bf16", lora=dict(r=16, alpha=32, targets="qkvo", dropout=0.05, dora=True)),
    dict(id="ho5-gemma-2b-lora-r8-qkvo-bf16base-amp-b2", model="gemma-2b", batch=2, seq=2048, prec="amp-bf16",
         base_dtype="bf16", lora=dict(r=8, alpha=16, targets="qkvo", dropout=0.1)),
    dict(id="ho5-mistral-2b-fp32base-amp-b2-freeze-embed-l0-3", model="mistral-2b", batch=2, seq=2048,
         prec="amp-bf16", base_dtype="fp32", freeze=["embed", "layers.0-3"]),
]

H.FAM[:] = []
H.fam("qwen3-0.6b", 4, "bf16", ckpt=True, seq=2048)
H.fam("gemma3-1b", 8, "bf16")
H.fam("phi3-mini-16l", 4, "amp-bf16")
H.fam("qwen2-moe-small", 2, "amp-bf16", ckpt=True)
H.fam("mixtral-4l", 8, "bf16")
H.fam("deepseek-v3-tiny", 8, "bf16")
H.fam("t5-base", 8, "amp-bf16", target=128)
H.fam("gemma3-4b-8l", 2, "bf16", ckpt=True)
H.fam("qwen3-moe-128e", 2, "amp-bf16", ckpt=True)
H.fam("gpt2-medium", 8, "amp-fp16")
H.fam("phi3-medium-6l", 1, "amp-bf16")
for c in H.FAM:
    c["id"] = c["id"].replace("ho-", "ho5-", 1)

H.GEN[:] = []

if __name__ == "__main__":
    H.single(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
