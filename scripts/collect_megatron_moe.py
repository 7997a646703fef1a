#!/usr/bin/env python3
"""Measure what one Megatron-Core MoE layer keeps for its backward, to check
the rule of src/graph_moe.c meg_moe and src/ops/moe.c meg_* (docs/
DISTRIBUTED.md "Megatron-LM", mixture of experts).

One GPU, tp = ep = 1 (the layer's saved bytes do not depend on ep under
balanced routing: the rows are tokens x top_k whatever the local experts).
Builds the MoE submodule of Megatron-Core's Transformer Engine GPT layer
spec (alltoall dispatcher, grouped GEMM, unfused permute, forced balanced
routing, an aux loss), runs its forward on [s, b, h] bf16 tokens and prints
one JSON line per case: the bytes allocated across the forward less its
output (what autograd and the dispatcher keep), and the forward's peak over
the start.

Needs megatron-core and transformer-engine (pip install megatron-core
transformer-engine[pytorch]); run:
    python3 scripts/collect_megatron_moe.py > moe_meg.jsonl
"""
import json
import os
import sys

try:
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_with_transformer_engine_spec)
    from megatron.core.tensor_parallel.random import (
        model_parallel_cuda_manual_seed)
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
except ImportError as e:
    sys.exit(f"collect_megatron_moe.py needs megatron-core and "
             f"transformer-engine: {e}")

# (name, hidden, experts, top_k, expert ffn, seq, batch): Mixtral 8x7B's
# layer widths at short sequences, and a small layout with more experts
CASES = [
    ("mixtral-layer", 4096, 8, 2, 14336, 1024, 1),
    ("mixtral-layer", 4096, 8, 2, 14336, 2048, 1),
    ("small-64e", 1024, 64, 6, 512, 2048, 2),
]


def init():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(123)


def measure(name, h, e, k, f, s, b):
    cfg = TransformerConfig(
        num_layers=1, hidden_size=h, num_attention_heads=8,
        ffn_hidden_size=f, moe_ffn_hidden_size=f, num_moe_experts=e,
        moe_router_topk=k, moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=True, moe_permute_fusion=False,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2,
        moe_router_force_load_balancing=True, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, bias_activation_fusion=True,
        add_bias_linear=False, bf16=True, params_dtype=torch.bfloat16)
    spec = get_gpt_layer_with_transformer_engine_spec(
        num_experts=e, moe_grouped_gemm=True)
    # Float16Module casts the module (the router's fp32 weight too)
    layer = build_module(spec.submodules.mlp, config=cfg).cuda().bfloat16()
    x = torch.randn(s, b, h, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    torch.cuda.synchronize()
    m0 = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y, _ = layer(x)
    torch.cuda.synchronize()
    m1 = torch.cuda.memory_allocated()
    peak = torch.cuda.max_memory_allocated()
    kept = m1 - m0 - y.numel() * y.element_size()
    print(json.dumps({"case": name, "hidden": h, "experts": e, "top_k": k,
                      "expert_ffn": f, "seq": s, "batch": b,
                      "kept_bytes": kept, "fwd_peak_over_start": peak - m0,
                      "torch": torch.__version__}), flush=True)
    del y, layer, x
    torch.cuda.empty_cache()


def main():
    init()
    for c in CASES:
        measure(*c)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
