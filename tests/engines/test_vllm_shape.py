"""The smoke model's shape is one vLLM's CPU kernels take (read from vLLM itself, not a copied list)."""

from __future__ import annotations

import json

from engine_tools import require


def test_smoke_model_head_size_is_supported_by_vllms_cpu_attention(tiny_model_dir):
    require("vllm")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = json.loads((tiny_model_dir / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_size = config["hidden_size"] // heads
    assert head_size in CPUAttentionBackend.get_supported_head_sizes(), head_size
    assert heads % kv_heads == 0 and config["hidden_size"] % heads == 0
