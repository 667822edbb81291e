"""A model built in code that ends its turn and writes on: for the stop-rule tests (evaluation and training).

Not a stand-in for anything under test: a real Qwen2 model, saved and loaded like any other, whose weights
are set so that greedy (or near-greedy) decoding is known in advance.
"""

from __future__ import annotations

import itertools
from pathlib import Path


def build_turn_then_eos_model(path: Path) -> Path:
    """A 1-layer Qwen2 whose next token depends only on the current one, wired so that greedy decoding after
    the chat prompt writes ``7``, ends its turn with ``<|im_end|>``, goes on with ``\\boxed{9}`` and then
    stops at ``<|endoftext|>``, the model's only EOS (as for the base Qwen2.5-Math-1.5B)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from prompt_aug.demo.smoke import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.eos_token = "<|endoftext|>"
    ids = tokenizer.convert_tokens_to_ids
    chain = ["Ċ", "7", "<|im_end|>", *tokenizer.tokenize("\\boxed{9}"), "<|endoftext|>"]
    assert len(set(chain)) == len(chain)  # each token has one successor
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=ids("<|endoftext|>"), pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:  # the block adds nothing: the last hidden state is the embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for i, (token, successor) in enumerate(itertools.pairwise(chain)):
            model.model.embed_tokens.weight[ids(token), i] = 1.0
            model.lm_head.weight[ids(successor), i] = 100.0
    model.generation_config = GenerationConfig(
        eos_token_id=[ids("<|endoftext|>")], pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
