"""A LoRA adapter saved as a LoRA run saves its output folder: for the merge tests (main suite and vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save_lora_adapter(
    base: Path,
    folder: Path,
    recorded: str | None = None,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    scale: float = 0.5,
    model_class: Any = None,
    safe_serialization: bool = True,
    **lora: Any,
) -> Path:
    """A rank-4 LoRA adapter on ``base``'s ``targets`` with non-zero weights (``lora_B`` drawn with standard
    deviation ``scale``; a fresh one is a no-op), saved in ``folder`` with ``base``'s tokenizer and a
    generation config of its own (EOS ids 2 and 5, at most 7 new tokens); ``base`` loads with ``model_class``
    (default `AutoModelForCausalLM`); ``safe_serialization`` False saves ``adapter_model.bin``. ``recorded``
    replaces the base model path its ``adapter_config.json`` records. ``lora`` adds `LoraConfig` keys
    (``modules_to_save``, ``bias``, ``use_dora``, ``trainable_token_indices``...): each other weight they make
    trainable gets noise of standard deviation ``scale`` added, so that it too changes the model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    loaded = (model_class or AutoModelForCausalLM).from_pretrained(base)
    model = get_peft_model(loaded, LoraConfig(r=4, target_modules=list(targets), **lora))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
            elif param.requires_grad and "lora_A" not in name:
                param.add_(torch.randn(param.shape, generator=generator) * scale)
    model.save_pretrained(folder, safe_serialization=safe_serialization)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    GenerationConfig(eos_token_id=[2, 5], max_new_tokens=7).save_pretrained(folder)
    if recorded is not None:
        config = json.loads((folder / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = recorded
        (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder
