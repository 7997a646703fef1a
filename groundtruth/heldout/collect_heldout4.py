"""Fourth held-out set (stop 26): measured at the start of the session, before this session's step-time rules
(MoE routers' and experts' glue, the backward's launches, peft's host work, checkpointed encoder-decoders) and the
allocator's segment-address rule were written, and not shown to the helpers that wrote them. Other models, batches,
lengths and precisions than any case those rules were checked on. Protocol, fields and runners are
collect_more.py's through collect_heldout.py (imported); only the cases are new.

    python3 groundtruth/heldout/collect_heldout4.py OUTDIR      # OUTDIR/heldout-{lora,families}.jsonl
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collect_heldout as H  # noqa: E402

H.FT[:] = [
    dict(id="ho4-llama-1b-lora-r16-all-fp32base-amp-b2", model="llama-1b", batch=2, seq=2048, prec="amp-bf16",
         base_dtype="fp32", lora=dict(r=16, alpha=32, targets="all", dropout=0.05)),
    dict(id="ho4-mistral-2b-lora-r8-qkvo-bf16base-amp-b2-ckpt", model="mistral-2b", batch=2, seq=2048,
         prec="amp-bf16", base_dtype="bf16", ckpt=True, lora=dict(r=8, alpha=16, targets="qkvo", dropout=0.0)),
    dict(id="ho4-gpt2-medium-lora-r32-all-bf16-b4", model="gpt2-medium", batch=4, seq=1024, prec="bf16",
         base_dtype="bf16", lora=dict(r=32, alpha=64, targets="gpt2-all", dropout=0.1)),
    dict(id="ho4-qwen3-0.6b-freeze-embed-l0-13-bf16-b4", model="qwen3-0.6b", batch=4, seq=1024, prec="bf16",
         base_dtype="bf16", freeze=["embed", "layers.0-13"]),
]

H.FAM[:] = []
H.fam("deepseek-v3-tiny", 2, "amp-bf16")
H.fam("qwen3-moe-128e", 4, "bf16", ckpt=True)
H.fam("qwen2-moe-small", 8, "bf16")
H.fam("mixtral-4l", 1, "amp-bf16", seq=4096)
H.fam("t5-small", 16, "amp-bf16", ckpt=True, target=128)
H.fam("flan-t5-base", 4, "bf16", target=64)
H.fam("gemma2-9b-4l", 1, "amp-bf16", ckpt=True)
H.fam("qwen3-1.7b-8l", 2, "bf16", seq=2048)
H.fam("llama-1b", 8, "amp-bf16", ckpt=True, seq=1024)
H.fam("gemma-2b", 2, "amp-bf16")
for c in H.FAM:
    c["id"] = c["id"].replace("ho-", "ho4-", 1)

H.GEN[:] = []

if __name__ == "__main__":
    H.single(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
