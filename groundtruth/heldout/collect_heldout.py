"""Held-out ground truth for vramplan's fine-tuning, family, generate() and data-parallel models, on one H200.

Shapes and settings that no rule was developed against: other sizes of the same families, other LoRA ranks,
targets and dtypes, other generate() lengths and caches, other wrappers' worlds. The protocol, fields and runners
are collect_more.py's and collect_dist_more.py's (imported); only the cases are new.

    python3 groundtruth/heldout/collect_heldout.py OUTDIR single [filter]   # lora, families, generate -> OUTDIR/heldout-*.jsonl
    python3 groundtruth/heldout/collect_heldout.py OUTDIR configs           # OUTDIR/hf_configs/<model>.json of every case
    python3 groundtruth/heldout/collect_heldout.py OUT.jsonl fake W R       # FSDP1/FSDP2 rank R of a fake world of W
    torchrun --nproc_per_node=1 groundtruth/heldout/collect_heldout.py OUT.jsonl nccl   # DDP/ZeRO1/FSDP2 at world 1
"""
import json, os, signal, sys, time, traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # collect_more.py
import collect_more as M  # noqa: E402

M.LORA_TARGETS["phi3-qkvo"] = ["qkv_proj", "o_proj"]

M.FAMILIES.update({
    "qwen3-1.7b-8l": ("qwen3", dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=8,
                                    num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                    max_position_embeddings=40960, tie_word_embeddings=True), 1024, "sdpa"),
    "qwen3-moe-128e": ("qwen3_moe", dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072,
                                         moe_intermediate_size=384, num_hidden_layers=4, num_attention_heads=16,
                                         num_key_value_heads=4, head_dim=64, num_experts=128, num_experts_per_tok=8,
                                         norm_topk_prob=True, max_position_embeddings=32768,
                                         tie_word_embeddings=False), 1024, "sdpa"),
    "gemma2-9b-4l": ("gemma2", dict(vocab_size=256000, hidden_size=3584, intermediate_size=14336,
                                    num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                                    max_position_embeddings=8192, sliding_window=4096, query_pre_attn_scalar=256,
                                    final_logit_softcapping=30.0, attn_logit_softcapping=50.0), 1024, "eager"),
    "gemma3-4b-8l": ("gemma3_text", dict(vocab_size=262208, hidden_size=2560, intermediate_size=10240,
                                         num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                                         head_dim=256, max_position_embeddings=32768, sliding_window=1024,
                                         query_pre_attn_scalar=256), 1024, "sdpa"),
    "phi3-medium-6l": ("phi3", dict(vocab_size=32064, hidden_size=5120, intermediate_size=17920,
                                    num_hidden_layers=6, num_attention_heads=40, num_key_value_heads=10,
                                    max_position_embeddings=4096, pad_token_id=32000), 2048, "sdpa"),
    "deepseek-v3-tiny": ("deepseek_v3", dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                                             moe_intermediate_size=192, num_hidden_layers=3, num_attention_heads=8,
                                             num_key_value_heads=8, n_shared_experts=2, n_routed_experts=16,
                                             num_experts_per_tok=2, n_group=2, topk_group=1,
                                             first_k_dense_replace=1, q_lora_rank=256, kv_lora_rank=96,
                                             qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=96,
                                             max_position_embeddings=4096, tie_word_embeddings=False), 2048,
                         "sdpa"),
    "mixtral-4l": ("mixtral", dict(vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_hidden_layers=4,
                                   num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
                                   num_experts_per_tok=2, max_position_embeddings=32768,
                                   tie_word_embeddings=False), 1024, "sdpa"),
    "t5-small": ("t5", dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6,
                            num_heads=8, feed_forward_proj="relu", tie_word_embeddings=True,
                            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1), 512, "sdpa"),
    "flan-t5-base": ("t5", dict(vocab_size=32128, d_model=768, d_kv=64, d_ff=2048, num_layers=12,
                                num_decoder_layers=12, num_heads=12, feed_forward_proj="gated-gelu",
                                tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0,
                                eos_token_id=1), 512, "sdpa"),
})

FT = [
    dict(id="ho-qwen3-0.6b-lora-r16-all-bf16base-amp-b4", model="qwen3-0.6b", batch=4, seq=1024, prec="amp-bf16",
         base_dtype="bf16", lora=dict(r=16, alpha=32, targets="all", dropout=0.05)),
    dict(id="ho-llama-1b-lora-r4-qkvo-fp32-b2-drop", model="llama-1b", batch=2, seq=2048, prec="fp32",
         base_dtype="fp32", lora=dict(r=4, alpha=8, targets="qkvo", dropout=0.1)),
    dict(id="ho-llama-1b-dora-r8-all-bf16base-amp-b2-ckpt", model="llama-1b", batch=2, seq=2048, prec="amp-bf16",
         base_dtype="bf16", ckpt=True, lora=dict(r=8, alpha=16, targets="all", dropout=0.0, dora=True)),
    dict(id="ho-mistral-2b-freeze-embed-l0-7-bf16-b2", model="mistral-2b", batch=2, seq=2048, prec="bf16",
         base_dtype="bf16", freeze=["embed", "layers.0-7"]),
    dict(id="ho-qwen2-0.5b-lora-r16-qv-bf16base-amp-b16-ckpt", model="qwen2-0.5b", batch=16, seq=1024,
         prec="amp-bf16", base_dtype="bf16", ckpt=True, lora=dict(r=16, alpha=32, targets="qv", dropout=0.05)),
    dict(id="ho-phi3-mini-16l-lora-r8-qkv-o-bf16base-amp-b2", model="phi3-mini-16l", batch=2, seq=2048,
         prec="amp-bf16", base_dtype="bf16", lora=dict(r=8, alpha=16, targets="phi3-qkvo", dropout=0.05)),
    dict(id="ho-gpt2-medium-lora-r16-all-bf16-b8", model="gpt2-medium", batch=8, seq=1024, prec="bf16",
         base_dtype="bf16", lora=dict(r=16, alpha=32, targets="gpt2-all", dropout=0.05)),
    dict(id="ho-llama-1b-fp32-amp-b4-freeze-l0-3", model="llama-1b", batch=4, seq=1024,
         prec="amp-bf16", base_dtype="fp32", freeze=["layers.0-3"]),
]

FAM = []


def fam(model, batch, prec, **kw):
    cid = f"ho-{model}-{prec}-b{batch}" + ("-ckpt" if kw.get("ckpt") else "") + (f"-s{kw['seq']}" if "seq" in kw else "")
    FAM.append(dict(id=cid, model=model, batch=batch, prec=prec, opt="adamw", **kw))


fam("qwen3-1.7b-8l", 4, "amp-bf16")
fam("qwen3-1.7b-8l", 8, "bf16", ckpt=True)
fam("qwen3-moe-128e", 4, "amp-bf16")
fam("gemma2-9b-4l", 2, "bf16", ckpt=True)
fam("gemma2-9b-4l", 1, "amp-bf16")
fam("gemma3-4b-8l", 2, "amp-bf16")
fam("phi3-medium-6l", 2, "bf16", ckpt=True)
fam("deepseek-v3-tiny", 4, "amp-bf16")
fam("deepseek-v3-tiny", 2, "fp32", ckpt=True)
fam("mixtral-4l", 4, "amp-bf16")
fam("t5-small", 32, "amp-bf16", target=64)
fam("flan-t5-base", 16, "bf16", ckpt=True, target=128)
fam("qwen3-0.6b", 4, "amp-bf16", seq=2048)

GEN = []


def gen(model, batch, prompt, new, cache="dynamic", sample=False, pad=False):
    cid = f"ho-{model}-gen-b{batch}-p{prompt}-n{new}-{cache}" + ("-sample" if sample else "") + ("-pad" if pad else "")
    GEN.append(dict(id=cid, model=model, batch=batch, cache=cache,
                    generate=dict(prompt=prompt, new_tokens=new, sample=sample, pad=pad)))


gen("llama-1b", 16, 1024, 64, sample=True)
gen("qwen2-0.5b", 64, 512, 128)
gen("mistral-2b", 4, 4096, 64, cache="static")
gen("qwen3-0.6b", 8, 2048, 128, cache="static")
gen("gemma3-1b", 8, 1024, 128)
gen("gpt2-medium", 32, 256, 128, pad=True)
gen("phi3-mini-16l", 4, 2048, 128)
gen("qwen3-1.7b-8l", 24, 512, 256, sample=True)


def configs(outdir):
    """Every held-out family's config.json, as build_hf writes it (the model built on the meta device)."""
    import transformers as T
    d = os.path.join(outdir, "hf_configs")
    os.makedirs(d, exist_ok=True)
    for name in sorted({c["model"] for c in FT + FAM + GEN}):
        cfg, mt, _, attn = M.hf_config(name)
        cls = T.AutoModelForSeq2SeqLM if mt in M.SEQ2SEQ else T.AutoModelForCausalLM
        with M.torch.device("meta"):
            m = M.from_config(cls, cfg, attn, None)
        m.config.architectures = [type(m).__name__]
        tmp = os.path.join(d, "_tmp")
        m.config.save_pretrained(tmp)
        os.replace(os.path.join(tmp, "config.json"), os.path.join(d, name + ".json"))
        os.rmdir(tmp)


def single(outdir, only=""):
    signal.signal(signal.SIGALRM, M._alarm)
    os.makedirs(outdir, exist_ok=True)
    M.warmup()
    for name, cases, fn in (("lora", FT, M.run_ft), ("families", FAM, M.run_family),
                            ("generate", GEN, M.run_generate)):
        with open(os.path.join(outdir, "heldout-%s.jsonl" % name), "a") as f:
            f.write(json.dumps(dict(env=M.env_line())) + "\n")
            for c in cases:
                if only and only not in c["id"]:
                    continue
                t0 = time.time()
                signal.alarm(int(os.environ.get("CASE_TIMEOUT_S", "90")))
                try:
                    r = fn(dict(c), outdir)
                except M.torch.OutOfMemoryError:
                    r = dict(c, error="oom")
                except M.Timeout:
                    r = dict(c, error="timeout")
                except Exception as e:
                    r = dict(c, error=repr(e)[:300], tb=traceback.format_exc()[-1500:])
                signal.alarm(0)
                M.G.cleanup()
                r["wall_s"] = round(time.time() - t0, 2)
                f.write(json.dumps(r) + "\n"); f.flush()
                print(r["id"], r.get("error", ""), "peak=%.3f GiB" % (r.get("peak_alloc", 0) / M.GiB), r["wall_s"],
                      flush=True)


def distributed():
    import collect_dist_more as D
    D.CASES.clear()
    for model, b in (("qwen2-0.5b", 4), ("mistral-2b", 1)):
        D.add(model, b, "ddp", autocast="bf16")
        D.add(model, b, "ddp-bucket-view", autocast="bf16")
        D.add(model, b, "ddp-zero1", autocast="bf16")
        D.add(model, b, "fsdp-full", param_dtype="bf16", reduce_dtype="bf16")
        D.add(model, b, "fsdp-grad-op", param_dtype="bf16", reduce_dtype="bf16", ckpt=True)
        D.add(model, b, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32")
        D.add(model, b, "fsdp2", fsdp_version=2, ckpt=True)
        D.add(model, b, "fsdp2", fsdp_version=2, param_dtype="bf16", reduce_dtype="fp32", reshard_after_forward=False)
    for c in D.CASES:
        c["id"] = "ho-" + c["id"]
    D.main()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "single":
        single(sys.argv[1], sys.argv[3] if len(sys.argv) > 3 else "")
    elif len(sys.argv) > 2 and sys.argv[2] == "configs":
        configs(sys.argv[1])
    else:
        distributed()
