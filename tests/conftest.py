"""Shared fixtures: a tiny Qwen2 model and ChatML tokenizer built in code (no Hub)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from prompt_aug.demo.smoke import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-random-qwen2")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
