"""Shared fixtures: a tiny Qwen2 model and ChatML tokenizer built in code (no Hub)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# One torch thread per process, here and in every subprocess a test starts (they inherit the environment).
# On 2 cores a second busy process makes 2-thread kernels wait on each other: HF generation ran up to 10x
# slower than with 1 thread (docs/benchmarks.md, "Torch threads"). Set OMP_NUM_THREADS to override.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # after the environment above, so that its thread pool reads it

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from prompt_aug.demo.smoke import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-random-qwen2")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def smollm2_dir():
    """The folder `python -m prompt_aug.models fetch smollm2-135m-instruct` writes; a test using it is skipped
    when it is absent, and fails instead with ``PROMPT_AUG_REAL_MODEL=1`` (CI, whose `.ci/run` fetches it)."""
    from prompt_aug.sources import default_dir, fetch_command, is_fetched

    name = "smollm2-135m-instruct"
    path = default_dir(name)
    if not is_fetched(path):
        why = f"{name} is not fetched in {path}: run `{fetch_command(name)}` (needs the network once)"
        if os.environ.get("PROMPT_AUG_REAL_MODEL") == "1":
            pytest.fail(why + "; PROMPT_AUG_REAL_MODEL=1 says it must be there")
        pytest.skip(why)
    return path


@pytest.fixture
def unreachable_hub(monkeypatch):
    """Hub clients online, but the endpoint is a closed local port: connections are refused at once."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
