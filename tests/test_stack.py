"""The software stack under the package: the Python floor it shares with TRL, and the one-line refusals of a
missing part (vLLM, DeepSpeed, liger-kernel) or of a CUDA build the driver cannot run."""

from __future__ import annotations

import http.server
import importlib.metadata
import importlib.util
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from launch import torchrun
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
        last.startswith("prompt-aug-train: error: use_vllm: needs vLLM")
        and 'pip install -e ".[vllm]"' in last
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
    assert 'pip install -e ".[liger]"' in message and "\n" not in message
    assert "liger" in PYPROJECT["project"]["optional-dependencies"]


def _fake_liger(folder: Path, distribution: str, version: str) -> None:
    """An installed ``liger_kernel`` module from the distribution ``distribution`` at ``version``."""
    (folder / "liger_kernel").mkdir(parents=True)
    (folder / "liger_kernel" / "__init__.py").write_text("")
    info = folder / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("liger_kernel\n")


@_absent("liger_kernel")
def test_use_liger_kernel_takes_the_nightly_distribution_at_a_version_trl_supports(tmp_path, monkeypatch):
    config = PromptAugGRPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none")
    config.use_liger_kernel = True
    _fake_liger(tmp_path / "new", "liger-kernel-nightly", "0.9.0.dev20260101")
    monkeypatch.syspath_prepend(str(tmp_path / "new"))
    stack.check_stack(config, dry_run=True)
    monkeypatch.undo()
    _fake_liger(tmp_path / "old", "liger-kernel-nightly", "0.5.0.dev20250101")
    monkeypatch.syspath_prepend(str(tmp_path / "old"))
    with pytest.raises(stack.StackError, match=r"^use_liger_kernel: needs liger-kernel >= 0\.8\.2"):
        stack.check_stack(config, dry_run=True)


@_absent("deepspeed")
def test_a_deepspeed_launch_without_deepspeed_is_one_line_before_the_recipe_is_parsed(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` sets for a ZeRO config
    with pytest.raises(SystemExit) as err:
        train.main(["--config", SMOKE, "--output_dir", str(tmp_path / "run"), "--dry_run"])
    message = str(err.value)
    assert message.startswith(
        "prompt-aug-train: error: ACCELERATE_USE_DEEPSPEED (a DeepSpeed accelerate config)"
    )
    assert 'pip install -e ".[deepspeed]"' in message and "\n" not in message
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    with pytest.raises(SystemExit, match=r"error: deepspeed: needs the deepspeed package"):
        train.main(["--config", SMOKE, "--output_dir", str(tmp_path / "run"), "--deepspeed", "ds.json"])


@_absent("bitsandbytes")
def test_a_bitsandbytes_optimizer_without_bitsandbytes_is_one_line_naming_the_file_before_anything_loads(
    tmp_path, capsys
):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(Path(SMOKE).read_text() + "\noptim: adamw_bnb_8bit\n")
    with pytest.raises(SystemExit) as err:
        train.main(["--config", str(recipe), "--output_dir", str(tmp_path / "run")])
    message = str(err.value)
    assert message.startswith(
        f"prompt-aug-train: error: {recipe}: optim: adamw_bnb_8bit needs a package that is not installed "
        "(You need to install `bitsandbytes`"
    )
    assert message.endswith("); or choose another optim") and "\n" not in message
    assert not (tmp_path / "run").exists()
    # The dry run checks a recipe for the launch machine on any machine, as it does QLoRA's bitsandbytes.
    train.main(["--config", str(recipe), "--output_dir", str(tmp_path / "run"), "--dry_run"])
    assert "questions per round" in capsys.readouterr().out


# -- report_to: wandb needs a W&B login, checked before anything loads -------------------------------


def _without_wandb_login(home: Path) -> dict[str, str]:
    """The environment with no W&B credentials anywhere W&B looks (variables, settings files, .netrc)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k not in ("NETRC", "RANK")}
    return {**env, "HOME": str(home), "NETRC": str(home / "netrc"), "WANDB_CONFIG_DIR": str(home / "wandb")}


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_report_to_wandb_without_a_login_is_one_line_naming_the_file_before_anything_loads(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(Path(SMOKE).read_text().replace("report_to: none", "report_to: wandb"))
    run = [
        sys.executable,
        "-m",
        "prompt_aug.train",
        "--config",
        str(recipe),
        "--output_dir",
        str(tmp_path / "run"),
    ]
    done = subprocess.run(
        run, cwd=REPO, env=_without_wandb_login(tmp_path), capture_output=True, text=True, check=False,
        timeout=300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in output
    assert output.strip().splitlines()[-1] == (
        f"prompt-aug-train: error: {recipe}: report_to: wandb, but no W&B API key is configured "
        "(WANDB_API_KEY, or wandb login); log in, set WANDB_MODE=offline to log locally, or set "
        "report_to: none"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_wandb_needs_no_login_offline_and_a_key_of_the_right_form_otherwise(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    for mode in ("offline", "disabled", "dryrun"):
        monkeypatch.setenv("WANDB_MODE", mode)
        assert stack.wandb_problem(["wandb"]) is None
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert stack.wandb_problem(["tensorboard", "wandb"]) is None
    monkeypatch.setenv("WANDB_API_KEY", "abc")
    assert stack.wandb_problem(["wandb"]) == (
        "report_to: wandb, but WANDB_API_KEY is not a W&B API key: API key must have 40+ characters, has 3."
    )
    monkeypatch.setenv("RANK", "1")  # only the main process logs to W&B
    assert stack.wandb_problem(["wandb"]) is None


def test_report_to_wandb_without_wandb_names_the_extra(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(stack, "_installed", lambda package, min_version=None: package != "wandb")
    assert stack.wandb_problem(["wandb"]) == (
        "report_to: wandb needs the wandb package, which is not installed; "
        'pip install -e ".[wandb]", or set report_to: none'
    )
    assert "wandb" in PYPROJECT["project"]["optional-dependencies"]


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_a_cpu_or_dry_run_in_any_spelling_is_not_checked_against_the_driver(tmp_path, monkeypatch):
    version = tmp_path / "version"
    version.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    )
    monkeypatch.setattr(stack, "NVIDIA_VERSION_FILE", version)  # a CPU container that sees the host's driver
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    for argv in (["--use-cpu"], ["--use-cpu", "true"], ["--use-cpu=true"], ["--dry-run"]):  # the parser's too
        stack.check_before_parse(argv)
    with pytest.raises(stack.StackError, match="CUDA is not available"):
        stack.check_before_parse(["--config", SMOKE, "--use-cpu", "false"])
    for value in ("True", "on"):  # what `accelerate launch --cpu` exports; accelerate reads "on" as true too
        monkeypatch.setenv("ACCELERATE_USE_CPU", value)
        stack.check_before_parse(["--config", SMOKE, "--use-cpu", "false"])
    monkeypatch.setenv("ACCELERATE_USE_CPU", "False")  # what every other accelerate launch exports
    with pytest.raises(stack.StackError, match="CUDA is not available"):
        stack.check_before_parse(["--config", SMOKE, "--use_cpu", "false"])


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
    with caplog.at_level(logging.INFO, logger="prompt_aug"), pytest.raises(stack.StackError) as err:
        stack.wait_for_vllm_server(_server_config(port, 3), "my/model", report_every=1.0)
    message = str(err.value)
    assert message.startswith(f"no vLLM server answered at 127.0.0.1:{port}") and "\n" not in message
    assert (
        f"`trl vllm-serve --model my/model --port {port}`" in message and "vllm_server_timeout 3 s" in message
    )
    assert "(last: Connection refused)" in message  # what the last try met
    waits = [r.getMessage() for r in caplog.records if "waiting for the vLLM server" in r.getMessage()]
    # The first at once, then one per report_every until the 3 s are up: the wait ends at its timeout.
    assert 2 <= len(waits) <= 4, waits
    assert re.search(r"\([23] s left of vllm_server_timeout; last: Connection refused\)", waits[0]), waits
    assert all(
        f"127.0.0.1:{port}" in w and "s left" in w and "trl vllm-serve --model my/model" in w for w in waits
    )


class _Health(http.server.BaseHTTPRequestHandler):
    answered: ClassVar[list[str]] = []  # the paths answered 200, in order

    def do_GET(self) -> None:  # http.server calls it by this name
        healthy = self.path.rstrip("/") == "/health"
        if healthy:
            self.answered.append(self.path)
        self.send_response(200 if healthy else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _Loading(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server calls it by this name
        self.send_response(503)  # what a vLLM server answers while its model loads
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _serving(port: int, handler: type) -> http.server.HTTPServer:
    server = http.server.HTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_server_that_answers_but_not_200_is_named_by_its_status():
    port = _closed_port()
    server = _serving(port, _Loading)
    try:
        with pytest.raises(stack.StackError) as err:
            stack.wait_for_vllm_server(_server_config(port, 2), "my/model", report_every=1.0)
    finally:
        server.shutdown()
        server.server_close()
    message = str(err.value)
    assert message.startswith(f"no vLLM server answered at 127.0.0.1:{port}") and "\n" not in message
    assert "(last: /health answered HTTP 503 Service Unavailable, still loading?)" in message


# Each process is given its own `localhost` port, as processes on other machines see their own loopback.
_TWO_PROCESS_WAIT = """
import os, sys
from prompt_aug import stack
from prompt_aug.config import PromptAugGRPOConfig

rank = int(os.environ["RANK"])
for main_port, other_port in ((int(sys.argv[1]), int(sys.argv[2])), (int(sys.argv[2]), int(sys.argv[1]))):
    config = PromptAugGRPOConfig(
        output_dir="unused", use_cpu=True, bf16=False, report_to="none", use_vllm=True, vllm_mode="server",
        vllm_server_host="127.0.0.1", vllm_server_port=main_port if rank == 0 else other_port,
        vllm_server_timeout=2,
    )
    try:
        stack.wait_for_vllm_server(config, "my/model", report_every=1.0)
        verdict = "up"
    except stack.StackError as err:
        verdict = str(err)
    # One write a line: print writes the line and its end apart, and unbuffered the two processes' interleave.
    sys.stdout.write(f"rank {rank}: {verdict}\\n")
    sys.stdout.flush()
# As a run ends: leave the group the verdict was broadcast over before Python exits (a gloo worker thread
# still holding the broadcast's tensor at interpreter teardown aborts the process).
from prompt_aug.train import close_process_group
close_process_group()
"""


def test_only_the_main_process_waits_for_the_server_and_every_process_takes_its_verdict(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text(_TWO_PROCESS_WAIT)
    up, down = _closed_port(), _closed_port()
    server = _serving(up, _Health)
    try:
        done = subprocess.run(
            [*torchrun(2), str(script), str(up), str(down)],
            cwd=REPO, capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    lines = [line for line in done.stdout.splitlines() if line.startswith("rank ")]
    assert done.returncode == 0, done.stdout + done.stderr
    # The main process's server is up: the other process goes on though its own port is closed.
    assert sorted(lines[:2]) == ["rank 0: up", "rank 1: up"], lines
    # The main process's port is closed: both stop with its line, though the other's own server answers.
    verdicts = sorted(lines[2:])
    assert len(verdicts) == 2 and verdicts[0][len("rank 0: ") :] == verdicts[1][len("rank 1: ") :], verdicts
    assert verdicts[0].startswith(f"rank 0: no vLLM server answered at 127.0.0.1:{down}")


def test_server_mode_goes_on_as_soon_as_the_server_answers(caplog, monkeypatch):
    port = _closed_port()
    monkeypatch.setattr(_Health, "answered", [])
    servers: list[http.server.HTTPServer] = []

    def serve() -> None:  # the port is closed until then: the first tries are refused
        servers.append(http.server.HTTPServer(("127.0.0.1", port), _Health))
        servers[0].serve_forever()

    starter = threading.Timer(3.0, serve)  # the server comes up seconds after the wait starts
    starter.start()
    try:
        with caplog.at_level(logging.INFO, logger="prompt_aug"):
            stack.wait_for_vllm_server(_server_config(port, 30), "my/model", report_every=1.0)
    finally:
        starter.cancel()
        for server in servers:
            server.shutdown()
            server.server_close()
    said = [r.getMessage() for r in caplog.records]
    # It waited (the port was closed at first), then went on at the server's first answer.
    assert said[0].startswith(f"waiting for the vLLM server at 127.0.0.1:{port} (30 s left"), said
    assert said[-1] == f"vLLM server at 127.0.0.1:{port} is up", said
    assert _Health.answered == ["/health"]
    # Not in server mode: no wait at all.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="prompt_aug"):
        stack.wait_for_vllm_server(
            PromptAugGRPOConfig(output_dir="unused", use_cpu=True, report_to="none"), "m"
        )
    assert not [r for r in caplog.records if "vLLM server" in r.getMessage()]
