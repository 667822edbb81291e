"""The software stack under the package: the Python floor it shares with TRL, and the one-line refusals of a
missing part (vLLM, DeepSpeed, liger-kernel) or of a CUDA build the driver cannot run."""

from __future__ import annotations

import http.server
import importlib.metadata
import importlib.util
import logging
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from prompt_aug import stack, train
from prompt_aug.config import PromptAugGRPOConfig

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _floor(specifiers: str) -> Version:
    """The lowest version a ``requires-python`` admits (its ``>=``, ``~=`` and ``==`` bounds)."""
    bounds = [
        Version(s.version.rstrip(".*")) for s in SpecifierSet(specifiers) if s.operator in (">=", "~=", "==")
    ]
    assert bounds, f"{specifiers!r} sets no lower bound"
    return max(bounds)


def test_requires_python_is_trls_floor():
    ours = PYPROJECT["project"]["requires-python"]
    trls = importlib.metadata.metadata("trl")["Requires-Python"]
    assert _floor(ours) >= _floor(trls), (
        f"pyproject's requires-python {ours} admits Pythons TRL ({trls}) refuses"
    )
    assert _floor(ours) == _floor(trls), f"pyproject's requires-python {ours} is above TRL's {trls}"
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{_floor(ours).major}{_floor(ours).minor}"


# -- A missing part of the stack: one line naming the extra, before anything loads ---------------------

SMOKE = str(REPO / "recipes/smoke/tiny_cpu.yaml")


def _absent(package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(package) is not None, reason=f"{package} is installed")


@_absent("vllm")
def test_use_vllm_without_vllm_ends_in_one_line_naming_the_extra(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "prompt_aug.train", "--config", SMOKE, "--output_dir", str(tmp_path / "run"),
         "--use_vllm", "true"],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in output
    last = output.strip().splitlines()[-1]
    assert (
        last.startswith("prompt-aug-train: error: use_vllm: needs vLLM") and 'prompt-aug-grpo[vllm]"' in last
    )
    assert not (tmp_path / "run").exists()  # refused before the output folder and the model


@_absent("liger_kernel")
@pytest.mark.parametrize("dry_run", [["--dry_run"], []])
def test_use_liger_kernel_without_liger_kernel_is_refused_by_the_dry_run_too(dry_run, tmp_path):
    with pytest.raises(SystemExit) as err:
        train.main(
            ["--config", SMOKE, "--output_dir", str(tmp_path / "run"), "--use_liger_kernel", "true", *dry_run]
        )
    message = str(err.value)
    assert message.startswith("prompt-aug-train: error: use_liger_kernel: needs liger-kernel >= 0.8.2")
    assert 'pip install "prompt-aug-grpo[liger]"' in message and "\n" not in message
    assert "liger" in PYPROJECT["project"]["optional-dependencies"]


@_absent("deepspeed")
def test_a_deepspeed_launch_without_deepspeed_is_one_line_before_the_recipe_is_parsed(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` sets for a ZeRO config
    with pytest.raises(SystemExit) as err:
        train.main(["--config", SMOKE, "--output_dir", str(tmp_path / "run"), "--dry_run"])
    message = str(err.value)
    assert message.startswith(
        "prompt-aug-train: error: ACCELERATE_USE_DEEPSPEED (a DeepSpeed accelerate config)"
    )
    assert 'pip install "prompt-aug-grpo[deepspeed]"' in message and "\n" not in message
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    with pytest.raises(SystemExit, match=r"error: deepspeed: needs the deepspeed package"):
        train.main(["--config", SMOKE, "--output_dir", str(tmp_path / "run"), "--deepspeed", "ds.json"])


# -- torch's CUDA build and the NVIDIA driver -----------------------------------------------------------


def test_a_cuda_13_torch_on_a_cuda_12_driver_names_both_and_the_cuda_12_route():
    line = stack.cuda_problem("2.13.0+cu130", "13.0", False, "550.54.15")
    assert line.startswith("CUDA is not available: torch 2.13.0+cu130 is built for CUDA 13.0")
    assert "driver >= 580" in line and "driver is 550.54.15" in line and "CUDA 12" in line
    assert "CUDA 12 drivers" in (REPO / "README.md").read_text()  # the route the line points to
    old = stack.cuda_problem("2.13.0+cu130", "13.0", False, "470.10")  # too old for CUDA 12 too
    assert old.endswith("update the driver to 580 or later")
    assert stack.cuda_problem("2.13.0+cu130", "13.0", True, "580.65.06") is None
    assert stack.cuda_problem("2.13.0+cpu", None, False, None) is None  # a CPU machine


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_a_driver_without_usable_cuda_stops_the_run_in_one_line_naming_both(tmp_path, monkeypatch):
    version = tmp_path / "version"
    version.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.3.0\n"
    )
    monkeypatch.setattr(stack, "NVIDIA_VERSION_FILE", version)  # the machine's driver, as Linux reports it
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert stack.nvidia_driver() == "550.54.15"
    with pytest.raises(SystemExit) as err:
        train.main(["--config", SMOKE, "--output_dir", str(tmp_path / "run"), "--use_cpu", "false"])
    message = str(err.value)
    assert (
        message.startswith("prompt-aug-train: error: CUDA is not available: torch ") and "\n" not in message
    )
    assert "550.54.15" in message and (torch.version.cuda or "CPU build") in message
    assert not (tmp_path / "run").exists()
    # A CPU run (the smoke recipe's use_cpu) and a dry run are not checked.
    stack.check_before_parse(["--config", SMOKE])
    stack.check_before_parse(["--config", SMOKE, "--use_cpu", "false", "--dry_run"])
    stack.check_before_parse([f"--config={SMOKE}"])  # the recipe's use_cpu, read from either form


def test_the_start_of_a_run_logs_torchs_cuda_build_beside_the_driver(caplog):
    with caplog.at_level(logging.INFO, logger="prompt_aug"):
        stack.check_stack(
            PromptAugGRPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none")
        )
    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
    assert f"torch {torch.__version__} ({build}); NVIDIA driver " in caplog.text


# -- vLLM server mode: what the run waits for ------------------------------------------------------------


def _server_config(port: int, timeout: float) -> PromptAugGRPOConfig:
    return PromptAugGRPOConfig(
        output_dir="unused", use_cpu=True, bf16=False, report_to="none", use_vllm=True, vllm_mode="server",
        vllm_server_host="127.0.0.1", vllm_server_port=port, vllm_server_timeout=timeout,
    )  # fmt: skip


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_server_mode_against_a_closed_port_says_what_it_waits_for_and_ends_in_one_line(caplog):
    port = _closed_port()
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="prompt_aug"), pytest.raises(stack.StackError) as err:
        stack.wait_for_vllm_server(_server_config(port, 3), "my/model", report_every=1.0)
    assert time.monotonic() - started < 3 + 3
    message = str(err.value)
    assert message.startswith(f"no vLLM server answered at 127.0.0.1:{port}") and "\n" not in message
    assert (
        f"`trl vllm-serve --model my/model --port {port}`" in message and "vllm_server_timeout 3 s" in message
    )
    waits = [r.getMessage() for r in caplog.records if "waiting for the vLLM server" in r.getMessage()]
    assert len(waits) >= 2, waits  # the first at once, then one per report_every
    assert all(
        f"127.0.0.1:{port}" in w and "s left" in w and "trl vllm-serve --model my/model" in w for w in waits
    )


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server calls it by this name
        self.send_response(200 if self.path.rstrip("/") == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_server_mode_goes_on_as_soon_as_the_server_answers():
    port = _closed_port()
    server = http.server.HTTPServer(("127.0.0.1", port), _Health)
    serving = threading.Event()

    def serve() -> None:
        serving.set()
        server.serve_forever()

    starter = threading.Timer(1.0, serve)  # the server comes up a second after the wait starts
    starter.start()
    try:
        started = time.monotonic()
        stack.wait_for_vllm_server(_server_config(port, 30), "my/model", report_every=1.0)
        assert time.monotonic() - started < 10
    finally:
        starter.cancel()
        if serving.is_set():
            server.shutdown()
        server.server_close()
    # Not in server mode: no wait at all.
    stack.wait_for_vllm_server(PromptAugGRPOConfig(output_dir="unused", use_cpu=True, report_to="none"), "m")
