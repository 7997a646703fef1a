"""Ground truth for vramplan's fine-tuning, new-architecture and generate() features, measured on one H200.

The protocol is that of shared/groundtruth/collect.py (imported; its model builders, batches, losses and step
loop are reused where they apply): random-init models from configs on the GPU, nothing downloaded; `steps` (4)
training steps with the peak statistics reset before forward, backward and optimizer step; every case in one
process after a warm-up (the backward thread's cuBLAS workspaces and cuBLASLt already exist, as in collect.py's
later cases).

    python3 groundtruth/collect_more.py OUTDIR [lora|families|generate|load|all] [id-filter]

writes OUTDIR/<mode>.jsonl (one case a line, the first line the environment) and OUTDIR/hf_configs/<model>.json
(the config of every family model, written by transformers' own save_pretrained, `architectures` included).
Case fields beyond collect.py's (groundtruth/README.md documents them): `lora` {r, alpha, targets, dropout,
dora}, `base_dtype`, `load`, `freeze`, `trainable_params`, `hf_config`, `target`, `generate` {prompt,
new_tokens, sample, pad}, `cache`, `kv_cache_bytes`, `runs`.
"""
import gc, json, os, signal, sys, time, traceback

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.join(HERE, "..", ".shared"), os.path.join(HERE, "..", "..", "shared", "groundtruth")):
    if os.path.exists(os.path.join(p, "collect.py")):
        sys.path.insert(0, p)
        break
import torch
import torch.nn.functional as F
import collect as G

DEV = "cuda"
GiB = 1 << 30
BF = torch.bfloat16

# ---- models of the new families: sizes of real checkpoints, some with fewer layers -----------------------
FAMILIES = {
    # name: (model_type, config kwargs, default seq, attention implementation)
    "qwen3-0.6b": ("qwen3", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 max_position_embeddings=40960, tie_word_embeddings=True), 1024, "sdpa"),
    "qwen3-moe-small": ("qwen3_moe", dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                          moe_intermediate_size=768, num_hidden_layers=4, num_attention_heads=32,
                                          num_key_value_heads=4, head_dim=128, num_experts=64, num_experts_per_tok=8,
                                          norm_topk_prob=True, max_position_embeddings=32768,
                                          tie_word_embeddings=False), 1024, "sdpa"),
    "qwen2-moe-small": ("qwen2_moe", dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                                          moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                                          num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16,
                                          num_experts=60, num_experts_per_tok=4, max_position_embeddings=8192,
                                          tie_word_embeddings=False), 1024, "sdpa"),
    "gemma-2b": ("gemma", dict(vocab_size=256000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                               num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                               max_position_embeddings=8192), 1024, "sdpa"),
    "gemma2-2b": ("gemma2", dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                 num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                 max_position_embeddings=8192, sliding_window=4096, query_pre_attn_scalar=256,
                                 final_logit_softcapping=30.0, attn_logit_softcapping=50.0), 1024, "eager"),
    "gemma3-1b": ("gemma3_text", dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                                      num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
                                      head_dim=256, max_position_embeddings=32768, sliding_window=512,
                                      query_pre_attn_scalar=256), 1024, "sdpa"),
    "phi3-mini-16l": ("phi3", dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                                   pad_token_id=32000), 2048, "sdpa"),
    "deepseek-v3-small": ("deepseek_v3", dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                              moe_intermediate_size=256, num_hidden_layers=4, num_attention_heads=16,
                                              num_key_value_heads=16, n_shared_experts=1, n_routed_experts=32,
                                              num_experts_per_tok=4, n_group=4, topk_group=2,
                                              first_k_dense_replace=1, q_lora_rank=384, kv_lora_rank=128,
                                              qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
                                              max_position_embeddings=4096, tie_word_embeddings=False), 1024,
                          "sdpa"),
    "t5-base": ("t5", dict(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12,
                           num_heads=12, feed_forward_proj="relu", tie_word_embeddings=True,
                           decoder_start_token_id=0, pad_token_id=0, eos_token_id=1), 512, "sdpa"),
    "mt5-small": ("mt5", dict(vocab_size=250112, d_model=512, d_kv=64, d_ff=1024, num_layers=8, num_decoder_layers=8,
                              num_heads=6, feed_forward_proj="gated-gelu", tie_word_embeddings=False), 512, "sdpa"),
    # known families in other shapes, for LoRA and generate
    "qwen2-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                 tie_word_embeddings=True), 1024, "sdpa"),
    "mistral-2b": ("mistral", dict(vocab_size=32000, hidden_size=2048, intermediate_size=7168, num_hidden_layers=16,
                                   num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=32768,
                                   sliding_window=4096), 2048, "sdpa"),
}
SEQ2SEQ = ("t5", "mt5")


def hf_config(name):
    import transformers as T
    if name in FAMILIES:
        mt, kw, seq, attn = FAMILIES[name]
        return T.AutoConfig.for_model(mt, **kw), mt, seq, attn
    fam, kw, seq = G.MODELS[name]
    return G.hf_causal(fam, **kw), fam, seq, "sdpa"


def from_config(cls, cfg, attn, dtype):
    kw = dict(attn_implementation=attn)
    if dtype is not None:
        try:
            return cls.from_config(cfg, dtype=dtype, **kw)
        except TypeError:
            return cls.from_config(cfg, torch_dtype=dtype, **kw)
    return cls.from_config(cfg, **kw)


def build_hf(name, attn=None, dtype=None, outdir=None):
    """The model on the GPU, built in `dtype` (None: fp32) as from_pretrained(dtype=...) would."""
    import transformers as T
    cfg, mt, seq, attn0 = hf_config(name)
    attn = attn or attn0
    cls = T.AutoModelForSeq2SeqLM if mt in SEQ2SEQ else T.AutoModelForCausalLM
    with torch.device(DEV):
        try:
            m = from_config(cls, cfg, attn, dtype)
        except ValueError as e:  # an implementation the family does not support: fall back to eager
            if "attn" not in str(e) and "attention" not in str(e):
                raise
            m = from_config(cls, cfg, "eager", dtype)
    if outdir:
        d = os.path.join(outdir, "hf_configs")
        os.makedirs(d, exist_ok=True)
        m.config.architectures = [type(m).__name__]
        tmp = os.path.join(d, "_tmp")
        m.config.save_pretrained(tmp)
        os.replace(os.path.join(tmp, "config.json"), os.path.join(d, name + ".json"))
        os.rmdir(tmp)
    return m, mt, seq


def vocab_of(m):
    return m.config.vocab_size


def make_batch(m, mt, b, seq, target=None):
    V = vocab_of(m)
    ids = torch.randint(0, V, (b, seq), device=DEV)
    if mt in SEQ2SEQ:
        lab = torch.randint(0, V, (b, target or seq), device=DEV)
        return dict(input_ids=ids, labels=lab)
    return dict(input_ids=ids, labels=ids.clone())


def phase_steps(m, params, c, batch_fn, opt=None, before_step=None):
    """collect.py's step loop for any model whose forward returns .loss; `opt` (else c's "opt" over params) and
    `before_step(s)`, called after step s's batch is made (collect_dist2.py: its barrier), are optional."""
    prec, opt_name = c.get("prec", "fp32"), c.get("opt", "adamw")
    steps, accum = c.get("steps", 4), c.get("accum", 1)
    base = c["_base"]
    if opt is None:
        opt = {"adamw": lambda: torch.optim.AdamW(params, lr=1e-4),
               "adamw-fused": lambda: torch.optim.AdamW(params, lr=1e-4, fused=True),
               "sgd": lambda: torch.optim.SGD(params, lr=1e-3, momentum=0.9)}[opt_name]()
    ac = {"amp-bf16": BF, "amp-fp16": torch.float16}.get(prec)
    out, times = [], []
    for s in range(steps):
        batch = batch_fn()
        if before_step is not None:
            before_step(s)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        torch.cuda.reset_peak_memory_stats()
        ph = {"start": torch.cuda.memory_allocated() - base}
        for a in range(accum):
            if a:
                del loss
                batch = batch_fn()
            with torch.autocast("cuda", dtype=ac, enabled=ac is not None):
                loss = m(**batch).loss / accum
            ph["fwd_peak"] = max(ph.get("fwd_peak", 0), torch.cuda.max_memory_allocated() - base)
            ph["after_fwd"] = torch.cuda.memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
            loss.backward()
        ph["bwd_peak"] = torch.cuda.max_memory_allocated() - base
        ph["after_bwd"] = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        ph["opt_peak"] = torch.cuda.max_memory_allocated() - base
        opt.zero_grad(set_to_none=c.get("set_to_none", True))
        del loss, batch
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
        ph["end"] = torch.cuda.memory_allocated() - base
        ph["reserved"] = torch.cuda.memory_reserved()
        out.append(ph)
    del opt
    return out, times


def summarize(r, steps_out, times):
    st = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    keys = ("fwd_peak", "bwd_peak", "opt_peak")
    r.update(steps=steps_out,
             peak_alloc=max(max(p.get(k, 0) for k in keys) for p in steps_out),
             peak_alloc_steady=max(steps_out[-1].get(k, 0) for k in keys),
             peak_reserved=st["reserved_bytes.all.peak"], num_alloc_retries=st["num_alloc_retries"],
             device_used=total - free,
             step_ms=sorted(times[1:])[len(times[1:]) // 2] * 1e3 if len(times) > 1 else times[0] * 1e3)
    return r


# ---- fine-tuning: LoRA (peft), frozen layers, loading in the target dtype --------------------------------
LORA_TARGETS = {"qv": ["q_proj", "v_proj"], "qkvo": ["q_proj", "k_proj", "v_proj", "o_proj"],
                "all": "all-linear", "gpt2-attn": ["c_attn"], "gpt2-all": ["c_attn", "c_proj", "c_fc"]}


def freeze_by_patterns(m, patterns):
    """Freeze every parameter whose name matches a pattern: 'embed' (the token embedding), 'layers.A-B'."""
    n = 0
    for name, p in m.named_parameters():
        for pat in patterns:
            if pat == "embed" and ("embed_tokens" in name or name.endswith("wte.weight")):
                p.requires_grad_(False)
            elif pat.startswith("layers."):
                a, _, b = pat[len("layers."):].partition("-")
                lo, hi = int(a), int(b or a)
                parts = name.split(".")
                for key in ("layers", "h"):  # Llama-style model.layers.i, GPT-2 transformer.h.i
                    if key in parts and parts[parts.index(key) + 1].isdigit():
                        if lo <= int(parts[parts.index(key) + 1]) <= hi:
                            p.requires_grad_(False)
        n += p.numel() if p.requires_grad else 0
    return n


def run_ft(c, outdir):
    import peft
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    base_dtype = {"bf16": BF, "fp32": None}[c.get("base_dtype", "fp32")]
    load = c.get("load", "dtype")
    m, mt, seq = build_hf(c["model"], c.get("attn"), base_dtype if load == "dtype" else None, outdir)
    if load == "fp32-then-cast" and base_dtype is not None:
        m = m.to(base_dtype)
    setup_peak = torch.cuda.max_memory_allocated() - base
    seq = c.get("seq", seq)
    if c.get("ckpt"):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    nparam = sum(p.numel() for p in m.parameters())
    if "lora" in c:
        L = c["lora"]
        tg = LORA_TARGETS.get(L["targets"], L["targets"])
        cfg = peft.LoraConfig(r=L["r"], lora_alpha=L["alpha"], target_modules=tg, lora_dropout=L.get("dropout", 0.0),
                              use_dora=L.get("dora", False), task_type="CAUSAL_LM",
                              fan_in_fan_out=mt == "gpt2")
        if c.get("ckpt"):
            m.enable_input_require_grads()
        m = peft.get_peft_model(m, cfg)
        if isinstance(tg, list):
            c["lora"] = dict(L, targets=tg)
    elif "freeze" in c:
        freeze_by_patterns(m, c["freeze"])
    params = [p for p in m.parameters() if p.requires_grad]
    trainable = sum(p.numel() for p in params)
    total_params = sum(p.numel() for p in m.parameters())
    c["_base"] = base
    r = dict({k: v for k, v in c.items() if not k.startswith("_")}, fam=mt, seq=seq, params=nparam,
             trainable_params=trainable, total_params=total_params, setup_peak=setup_peak,
             after_model=torch.cuda.memory_allocated() - base, peft=peft.__version__,
             attn=getattr(m.config, "_attn_implementation", None))
    b = c["batch"]
    steps_out, times = phase_steps(m, params, c, lambda: make_batch(m, mt, b, seq))
    summarize(r, steps_out, times)
    del m, params
    return r


FT = []


def ft(cid, **c):
    FT.append(dict(c, id=cid))


# LoRA over four families (llama, gpt2, qwen2, mistral): r 8..64, targets q,v .. all-linear, bf16 and fp32
# bases, dropout on and off, with and without checkpointing; DoRA; partial freezing; loading in bf16.
ft("llama-1b-lora-r16-qv-bf16base-amp-b4", model="llama-1b", batch=4, seq=1024, prec="amp-bf16", base_dtype="bf16",
   lora=dict(r=16, alpha=32, targets="qv", dropout=0.05))
ft("llama-1b-lora-r16-all-bf16base-amp-b8-ckpt", model="llama-1b", batch=8, seq=2048, prec="amp-bf16",
   base_dtype="bf16", ckpt=True, lora=dict(r=16, alpha=32, targets="all", dropout=0.05))
ft("llama-1b-lora-r8-qv-fp32-b4-nodrop", model="llama-1b", batch=4, seq=512, prec="fp32", base_dtype="fp32",
   lora=dict(r=8, alpha=16, targets="qv", dropout=0.0))
ft("llama-1b-lora-r32-qkvo-fp32base-amp-b4-ckpt", model="llama-1b", batch=4, seq=1024, prec="amp-bf16",
   base_dtype="fp32", ckpt=True, lora=dict(r=32, alpha=64, targets="qkvo", dropout=0.1))
ft("llama-1b-dora-r16-qv-bf16base-amp-b2", model="llama-1b", batch=2, seq=1024, prec="amp-bf16", base_dtype="bf16",
   lora=dict(r=16, alpha=32, targets="qv", dropout=0.05, dora=True))
ft("llama-7b-lora-r16-all-bf16base-amp-b2-ckpt", model="llama-7b", batch=2, seq=2048, prec="amp-bf16",
   base_dtype="bf16", ckpt=True, lora=dict(r=16, alpha=32, targets="all", dropout=0.05))
ft("gpt2-medium-lora-r32-attn-fp32base-amp-b8", model="gpt2-medium", batch=8, seq=1024, prec="amp-bf16",
   base_dtype="fp32", lora=dict(r=32, alpha=64, targets="gpt2-attn", dropout=0.1))
ft("gpt2-medium-lora-r64-all-fp32-b8-ckpt-nodrop", model="gpt2-medium", batch=8, seq=1024, prec="fp32",
   base_dtype="fp32", ckpt=True, lora=dict(r=64, alpha=128, targets="gpt2-all", dropout=0.0))
ft("qwen2-0.5b-lora-r8-qkvo-bf16base-amp-b8", model="qwen2-0.5b", batch=8, seq=1024, prec="amp-bf16",
   base_dtype="bf16", lora=dict(r=8, alpha=16, targets="qkvo", dropout=0.05))
ft("qwen2-0.5b-lora-r64-all-bf16-b4-ckpt-nodrop", model="qwen2-0.5b", batch=4, seq=2048, prec="bf16",
   base_dtype="bf16", ckpt=True, lora=dict(r=64, alpha=16, targets="all", dropout=0.0))
ft("mistral-2b-lora-r16-qv-bf16base-amp-b4-ckpt", model="mistral-2b", batch=4, seq=2048, prec="amp-bf16",
   base_dtype="bf16", ckpt=True, lora=dict(r=16, alpha=32, targets="qv", dropout=0.05))
ft("mistral-2b-lora-r32-all-bf16base-amp-b2", model="mistral-2b", batch=2, seq=2048, prec="amp-bf16",
   base_dtype="bf16", lora=dict(r=32, alpha=32, targets="all", dropout=0.0))
ft("llama-1b-freeze-embed-l0-15-amp-b4", model="llama-1b", batch=4, seq=1024, prec="amp-bf16", base_dtype="fp32",
   freeze=["embed", "layers.0-15"])
ft("gpt2-medium-freeze-embed-l0-11-fp32-b4", model="gpt2-medium", batch=4, seq=1024, prec="fp32",
   base_dtype="fp32", freeze=["embed", "layers.0-11"])
ft("llama-1b-bf16-load-dtype-b2", model="llama-1b", batch=2, seq=2048, prec="bf16", base_dtype="bf16", load="dtype")
ft("llama-1b-bf16-load-cast-b2", model="llama-1b", batch=2, seq=2048, prec="bf16", base_dtype="bf16",
   load="fp32-then-cast")


# ---- new families: training cases -----------------------------------------------------------------------
def run_family(c, outdir):
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    dtype = BF if c.get("prec") == "bf16" else None
    m, mt, seq = build_hf(c["model"], c.get("attn"), dtype, outdir)
    seq = c.get("seq", seq)
    if c.get("ckpt"):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    nparam = sum(p.numel() for p in m.parameters())
    c["_base"] = base
    r = dict({k: v for k, v in c.items() if not k.startswith("_")}, fam=mt, seq=seq, params=nparam,
             hf_config="hf_configs/%s.json" % c["model"], load="dtype", attn=m.config._attn_implementation,
             after_model=torch.cuda.memory_allocated() - base)
    b, tgt = c["batch"], c.get("target")
    steps_out, times = phase_steps(m, list(m.parameters()), c, lambda: make_batch(m, mt, b, seq, tgt))
    summarize(r, steps_out, times)
    del m
    return r


FAM = []


def fam(model, batch, prec, **kw):
    cid = f"{model}-{prec}-b{batch}" + ("-ckpt" if kw.get("ckpt") else "") + (f"-s{kw['seq']}" if "seq" in kw else "")
    FAM.append(dict(id=cid, model=model, batch=batch, prec=prec, opt="adamw", **kw))


fam("qwen3-0.6b", 4, "amp-bf16")
fam("qwen3-0.6b", 8, "bf16", ckpt=True)
fam("qwen3-0.6b", 2, "fp32", seq=512)
fam("qwen3-moe-small", 4, "amp-bf16")
fam("qwen3-moe-small", 8, "bf16", ckpt=True)
fam("qwen2-moe-small", 4, "amp-bf16")
fam("qwen2-moe-small", 4, "fp32", ckpt=True)
fam("gemma-2b", 2, "amp-bf16")
fam("gemma-2b", 4, "bf16", ckpt=True)
fam("gemma2-2b", 2, "amp-bf16")
fam("gemma2-2b", 4, "bf16", ckpt=True)
fam("gemma3-1b", 4, "amp-bf16")
fam("gemma3-1b", 4, "fp32", ckpt=True)
fam("phi3-mini-16l", 2, "amp-bf16")
fam("phi3-mini-16l", 4, "bf16", ckpt=True)
fam("deepseek-v3-small", 4, "amp-bf16")
fam("deepseek-v3-small", 8, "bf16", ckpt=True)
fam("deepseek-v3-small", 2, "fp32")
fam("t5-base", 16, "amp-bf16", target=128)
fam("t5-base", 16, "fp32", ckpt=True, target=128)
fam("mt5-small", 16, "amp-bf16", target=128)
fam("mt5-small", 32, "bf16", ckpt=True, target=64)


# ---- generate() with a KV cache --------------------------------------------------------------------------
def cache_bytes(pkv):
    """Bytes of the K/V tensors a transformers Cache object holds."""
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if isinstance(t, torch.Tensor) and t.is_cuda and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.untyped_storage().nbytes()
    for layer in getattr(pkv, "layers", []) or []:
        add(getattr(layer, "keys", None)); add(getattr(layer, "values", None))
    for name in ("key_cache", "value_cache"):
        for t in getattr(pkv, name, []) or []:
            add(t)
    return total


def run_generate(c, outdir):
    import transformers as T
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m, mt, _ = build_hf(c["model"], c.get("attn"), BF, outdir if c["model"] in FAMILIES else None)
    m.eval()
    nparam = sum(p.numel() for p in m.parameters())
    after_model = torch.cuda.memory_allocated() - base
    g = c["generate"]
    b, P, N = c["batch"], g["prompt"], g["new_tokens"]
    gc_ = T.GenerationConfig(max_new_tokens=N, min_new_tokens=N, do_sample=g.get("sample", False),
                             top_k=50 if g.get("sample") else None, top_p=0.9 if g.get("sample") else None,
                             eos_token_id=None, pad_token_id=0, bos_token_id=None,
                             cache_implementation="static" if c.get("cache") == "static" else None,
                             disable_compile=True, return_dict_in_generate=True)
    runs = []
    kvb = 0
    for rep in range(c.get("reps", 2)):
        ids = torch.randint(1, vocab_of(m), (b, P), device=DEV)
        mask = torch.ones_like(ids)
        if g.get("pad"):
            # left padding: every other sequence a quarter shorter
            for i in range(0, b, 2):
                mask[i, : P // 4] = 0
                ids[i, : P // 4] = 0
        torch.cuda.synchronize(); t0 = time.perf_counter()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated() - base
        with torch.no_grad():
            out = m.generate(input_ids=ids, attention_mask=mask, generation_config=gc_)
        torch.cuda.synchronize(); ms = (time.perf_counter() - t0) * 1e3
        peak = torch.cuda.max_memory_allocated() - base
        kvb = cache_bytes(out.past_key_values)
        gen = out.sequences.shape[1] - P
        del out
        gc.collect()
        runs.append(dict(start=start, peak=peak, end=torch.cuda.memory_allocated() - base,
                         reserved=torch.cuda.memory_reserved(), ms=ms, generated=gen))
        del ids, mask
    st = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    r = dict({k: v for k, v in c.items() if not k.startswith("_")}, fam=mt, params=nparam, after_model=after_model,
             load="dtype", attn=m.config._attn_implementation, prec="bf16", infer=True, runs=runs, kv_cache_bytes=kvb,
             peak_alloc=max(x["peak"] for x in runs), peak_reserved=st["reserved_bytes.all.peak"],
             num_alloc_retries=st["num_alloc_retries"], device_used=total - free,
             ms_per_token=runs[-1]["ms"] / max(1, N))
    if c["model"] in FAMILIES:
        r["hf_config"] = "hf_configs/%s.json" % c["model"]
    del m
    return r


GEN = []


def gen(model, batch, prompt, new, cache="dynamic", sample=False, pad=False, attn=None):
    cid = f"{model}-gen-b{batch}-p{prompt}-n{new}-{cache}" + ("-sample" if sample else "") + ("-pad" if pad else "")
    c = dict(id=cid, model=model, batch=batch, cache=cache,
             generate=dict(prompt=prompt, new_tokens=new, sample=sample, pad=pad))
    if attn:
        c["attn"] = attn
    GEN.append(c)


gen("llama-1b", 32, 512, 128)
gen("llama-1b", 1, 8192, 64)
gen("llama-1b", 8, 2048, 128, cache="static")
gen("llama-1b", 64, 256, 256, cache="static")
gen("llama-1b", 8, 1024, 128, pad=True)
gen("qwen2-0.5b", 128, 128, 128, sample=True)
gen("qwen2-0.5b", 32, 1024, 256, cache="static", sample=True)
gen("llama-7b", 4, 4096, 64)
gen("gpt2-medium", 16, 512, 256)
gen("mistral-2b", 8, 2048, 128)
gen("qwen3-0.6b", 16, 1024, 128)
gen("gemma2-2b", 4, 1024, 128)
gen("deepseek-v3-small", 8, 1024, 64)


# ---- driver ----------------------------------------------------------------------------------------------
class Timeout(Exception):
    pass


def _alarm(sig, frm):
    raise Timeout()


def warmup():
    torch.ones(1, device=DEV) @ torch.ones(1, 1, device=DEV)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).to(DEV)
    x = torch.randn(32, 64, device=DEV)
    m(x).sum().backward()
    with torch.autocast("cuda", dtype=BF):
        m(x).sum().backward()
    torch.utils.checkpoint.checkpoint(m, x.requires_grad_(), use_reentrant=False).sum().backward()
    del m, x
    G.cleanup()


def env_line():
    import transformers
    e = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
             total=torch.cuda.mem_get_info()[1], transformers=transformers.__version__)
    try:
        import peft
        e["peft"] = peft.__version__
    except ImportError:
        pass
    return e


def main():
    outdir, mode = sys.argv[1], sys.argv[2]
    filt = sys.argv[3] if len(sys.argv) > 3 else ""
    budget_s = float(os.environ.get("COLLECT_BUDGET_S", "1e9"))
    t_start = time.time()
    os.makedirs(outdir, exist_ok=True)
    warmup()
    sets = {"lora": (FT, run_ft), "families": (FAM, run_family), "generate": (GEN, run_generate)}
    modes = list(sets) if mode == "all" else mode.split(",")
    signal.signal(signal.SIGALRM, _alarm)
    for md in modes:
        cases, fn = sets[md]
        with open(os.path.join(outdir, md + ".jsonl"), "a") as f:
            f.write(json.dumps(dict(env=env_line())) + "\n")
            for c in cases:
                if filt and filt not in c["id"]:
                    continue
                if time.time() - t_start > budget_s:
                    print("budget spent, skipping", c["id"], flush=True)
                    continue
                t0 = time.time()
                signal.alarm(int(os.environ.get("CASE_TIMEOUT_S", "90")))
                try:
                    r = fn(dict(c), outdir)
                except torch.OutOfMemoryError:
                    r = dict(c, error="oom")
                except Timeout:
                    r = dict(c, error="timeout")
                except Exception as e:
                    r = dict(c, error=repr(e)[:300], tb=traceback.format_exc()[-1500:])
                signal.alarm(0)
                G.cleanup()
                r["wall_s"] = round(time.time() - t0, 2)
                f.write(json.dumps(r) + "\n"); f.flush()
                print(r["id"], r.get("error", ""), "peak=%.3f GiB" % (r.get("peak_alloc", 0) / GiB),
                      "res=%.3f" % (r.get("peak_reserved", 0) / GiB), r["wall_s"], flush=True)


if __name__ == "__main__":
    main()
