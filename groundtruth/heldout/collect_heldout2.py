"""Second held-out set (stop 23): the shapes of the rules written this session, measured after they were written.

The rules: LoRA on packed projections and the rotary embedding's dtype (phi3, qwen3), eager attention's fp32
softmax in 16-bit modules (gemma2), checkpointed T5 math attention, DeepSeek's fp32 router and expert lifetimes,
and generate() for gemma2 and DeepSeek-V3 (MLA's compressed cache). Other sizes, batches, ranks and lengths than
any case the rules were checked on. Protocol, fields and runners are collect_more.py's through
collect_heldout.py (imported); only the cases are new.

    python3 groundtruth/heldout/collect_heldout2.py OUTDIR      # OUTDIR/heldout-{lora,families,generate}.jsonl
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collect_heldout as H  # noqa: E402

H.M.LORA_TARGETS["phi3-qkv-gu"] = ["qkv_proj", "gate_up_proj"]

H.FT[:] = [
    dict(id="ho2-phi3-medium-6l-lora-r16-qkv-o-bf16base-amp-b1", model="phi3-medium-6l", batch=1, seq=2048,
         prec="amp-bf16", base_dtype="bf16", lora=dict(r=16, alpha=32, targets="phi3-qkvo", dropout=0.05)),
    dict(id="ho2-phi3-mini-16l-lora-r32-qkv-gu-bf16base-amp-b2-ckpt", model="phi3-mini-16l", batch=2, seq=2048,
         prec="amp-bf16", base_dtype="bf16", ckpt=True,
         lora=dict(r=32, alpha=64, targets="phi3-qkv-gu", dropout=0.0)),
    dict(id="ho2-qwen3-0.6b-lora-r64-qv-bf16base-amp-b8", model="qwen3-0.6b", batch=8, seq=1024, prec="amp-bf16",
         base_dtype="bf16", lora=dict(r=64, alpha=128, targets="qv", dropout=0.1)),
]

H.FAM[:] = []
H.fam("gemma2-9b-4l", 2, "bf16")
H.fam("t5-small", 16, "bf16", ckpt=True, target=128)
H.fam("flan-t5-base", 8, "amp-bf16", ckpt=True, target=64)
H.fam("deepseek-v3-tiny", 4, "bf16", ckpt=True)
for c in H.FAM:
    c["id"] = c["id"].replace("ho-", "ho2-", 1)

H.GEN[:] = []
H.gen("gemma2-9b-4l", 2, 2048, 64)
H.gen("gemma2-9b-4l", 4, 512, 128, sample=True)
H.gen("deepseek-v3-tiny", 8, 1024, 64)
H.gen("deepseek-v3-tiny", 2, 4096, 32)
H.gen("phi3-medium-6l", 2, 1024, 64)
for c in H.GEN:
    c["id"] = c["id"].replace("ho-", "ho2-", 1)

if __name__ == "__main__":
    H.single(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
