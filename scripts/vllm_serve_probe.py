#!/usr/bin/env python3
"""Start vLLM (V1 engine) on this GPU with dummy weights and print what it
measured at start-up, to compare with `vramplan serve` (docs/SERVING.md).

Needs vLLM installed (no network: the model is a local config.json with dummy
weights and no tokenizer). Writes one JSON line to stdout:

  total (torch.cuda.mem_get_info total), the settings, and from vLLM's log:
  weights_gib, torch_peak_increase_gib, non_torch_increase_gib,
  available_kv_gib, kv_tokens, max_concurrency, cuda_graph_gib

  python3 scripts/vllm_serve_probe.py --config llama-3-8b [--tp 2]
      [--kv-cache-dtype fp8] [--max-model-len 8192] [--enforce-eager]

--config is a Hugging Face config.json, or `llama-3-8b` for the shapes of
models/llama-3-8b.yaml (Meta-Llama-3-8B).
"""
import argparse
import json
import logging
import os
import re
import sys
import tempfile

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu",
}

PATTERNS = {
    "weights_gib": r"(?:Model loading took|Loading model weights took) ([\d.]+) GiB",
    "torch_peak_increase_gib": r"torch peak memory increase: ([\d.]+)GiB",
    "non_torch_increase_gib": r"non-torch forward increase memory: ([\d.]+)GiB",
    "available_kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "kv_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "max_concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "cuda_graph_gib": r"Graph capturing finished in .* took ([\d.]+) GiB",
}


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="llama-3-8b")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--max-model-len", type=int)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--enforce-eager", action="store_true")
    a = ap.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # logs in-process
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG")
    import torch
    from vllm import LLM
    from vllm.usage.usage_lib import UsageContext  # noqa: F401

    cfg = LLAMA3_8B if a.config == "llama-3-8b" else json.load(open(a.config))
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    h = Collect()
    logging.getLogger("vllm").addHandler(h)
    total = torch.cuda.mem_get_info()[1]
    # `vllm serve` defaults (OpenAI server usage context), as vramplan uses
    big = total >= 70 * 2**30 and "a100" not in torch.cuda.get_device_name().lower()
    llm = LLM(model=d, load_format="dummy", skip_tokenizer_init=True,
              tensor_parallel_size=a.tp, kv_cache_dtype=a.kv_cache_dtype,
              max_model_len=a.max_model_len,
              gpu_memory_utilization=a.gpu_memory_utilization,
              enforce_eager=a.enforce_eager,
              max_num_batched_tokens=8192 if big else 2048,
              max_num_seqs=1024 if big else 256)
    out = {"total": total, "device": torch.cuda.get_device_name(),
           "config": a.config, "tp": a.tp, "kv_cache_dtype": a.kv_cache_dtype,
           "gpu_memory_utilization": a.gpu_memory_utilization}
    text = "\n".join(h.lines)
    for key, pat in PATTERNS.items():
        m = re.search(pat, text)
        out[key] = float(m.group(1).replace(",", "")) if m else None
    print(json.dumps(out))
    del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
