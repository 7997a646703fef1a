"""Third held-out set (stop 25): checkpointed steps and attention shapes, measured before the rules of this session
were merged (the host timeline of a checkpointed backward; SDPA's kernel time by backend, head dimension, mask and
dropout), and not shown to the sessions that wrote them. Other models, batches, lengths and precisions than any case
those rules were checked on. Protocol, fields and runners are collect_more.py's through collect_heldout.py
(imported); only the cases are new.

    python3 groundtruth/heldout/collect_heldout3.py OUTDIR      # OUTDIR/heldout-{lora,families}.jsonl
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collect_heldout as H  # noqa: E402

H.FT[:] = [
    dict(id="ho3-llama-1b-lora-r8-qv-bf16base-amp-b4-ckpt", model="llama-1b", batch=4, seq=2048, prec="amp-bf16",
         base_dtype="bf16", ckpt=True, lora=dict(r=8, alpha=16, targets="qv", dropout=0.05)),
    dict(id="ho3-qwen2-0.5b-lora-r32-all-bf16-b8-ckpt", model="qwen2-0.5b", batch=8, seq=1024, prec="bf16",
         base_dtype="bf16", ckpt=True, lora=dict(r=32, alpha=64, targets="all", dropout=0.0)),
]

H.FAM[:] = []
H.fam("qwen3-1.7b-8l", 4, "amp-bf16", ckpt=True)
H.fam("gemma3-4b-8l", 2, "bf16", ckpt=True)
H.fam("phi3-mini-16l", 2, "amp-bf16", ckpt=True)
H.fam("mixtral-4l", 2, "bf16", ckpt=True)
H.fam("qwen2-moe-small", 2, "amp-bf16", ckpt=True)
H.fam("gemma-2b", 8, "bf16", ckpt=True, seq=1024)
H.fam("qwen3-0.6b", 16, "bf16", ckpt=True, seq=512)
H.fam("t5-base", 8, "amp-bf16", ckpt=True, target=64)
H.fam("qwen3-0.6b", 2, "bf16", seq=4096)
H.fam("phi3-mini-16l", 1, "bf16", seq=4096)
for c in H.FAM:
    c["id"] = c["id"].replace("ho-", "ho3-", 1)

H.GEN[:] = []

if __name__ == "__main__":
    H.single(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
