"""The software stack under a training run, checked before any model loads: one line for each missing part.

* `check_before_parse`: what would otherwise fail while the recipe is parsed (transformers checks there):
  DeepSpeed for a ZeRO launch, and a CUDA build of torch that the machine's NVIDIA driver cannot run (else
  TRL's "Your setup doesn't support bf16/gpu", which points the wrong way).
* `machine_problem` (`optimizer_problem`, `wandb_problem`; asked while the recipe is parsed, so the line
  names its file): a package ``optim`` needs (bitsandbytes for the 8-bit and paged optimizers), and for
  ``report_to: wandb`` wandb and a W&B login (or an offline or disabled W&B mode).
* `check_stack`: vLLM for ``use_vllm`` and liger-kernel for ``use_liger_kernel``, each line naming the extra
  that installs it; and the log line of torch's CUDA build beside the driver's version.
* `wait_for_vllm_server`: in vLLM server mode, wait for the server's health endpoint with a line every 15 s
  (host, port, time left, its last answer, the command that starts it), and end the run in one line at
  ``vllm_server_timeout``; the main process waits, as it alone talks to the server, and tells the others.
  TRL's own wait (in `VLLMClient`) then finds the server up at once.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .cli import UsageError, is_true, setting

logger = logging.getLogger("prompt_aug")

GPU_CONSTRAINTS = "-c constraints-gpu.txt"
# The lowest liger-kernel TRL 1.16 supports (its `liger` extra).
LIGER_MIN_VERSION = "0.8.2"
# Where Linux reports the loaded NVIDIA kernel module's version; `nvidia-smi` is asked when it is absent.
NVIDIA_VERSION_FILE = Path("/proc/driver/nvidia/version")
# CUDA major version -> the lowest driver (major) that runs its builds (CUDA's minor-version compatibility).
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
CUDA12_ROUTE = 'the README\'s "CUDA 12 drivers" install'


class StackError(UsageError):
    """A part of the software stack the run needs is missing or cannot run; one line naming it and the fix."""


# ---------------------------------------------------------------------------------------------
# Before the recipe is parsed.


def check_before_parse(argv: list[str] | None = None) -> None:
    """Refuse, before the recipe is parsed, a DeepSpeed launch without DeepSpeed, and a torch whose CUDA
    build the NVIDIA driver cannot run (not checked for a dry run or a CPU run: ``use_cpu``, or
    ``accelerate launch --cpu``). ``argv``: the command line (default: ``sys.argv[1:]``).

    Raises:
        StackError: the missing package and its extra, or torch's CUDA build and the driver's version.
    """
    argv = list(argv) if argv is not None else sys.argv[1:]
    deepspeed_key = setting(argv, "deepspeed")
    launched = is_true(os.environ.get("ACCELERATE_USE_DEEPSPEED"))
    if (launched or deepspeed_key) and not _installed("deepspeed"):
        culprit = "ACCELERATE_USE_DEEPSPEED (a DeepSpeed accelerate config)" if launched else "deepspeed"
        raise StackError(
            f"{culprit}: needs the deepspeed package, which is not installed; "
            f'pip install -e ".[deepspeed]" {GPU_CONSTRAINTS}, or launch with '
            "accelerate_configs/ddp.yaml"
        )
    if is_true(setting(argv, "dry_run")) or is_true(setting(argv, "use_cpu")):
        return
    if is_true(os.environ.get("ACCELERATE_USE_CPU")):  # `accelerate launch --cpu`, which transformers honours
        return
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):  # GPUs hidden on purpose
        return
    import torch

    problem = cuda_problem(torch.__version__, torch.version.cuda, torch.cuda.is_available(), nvidia_driver())
    if problem:
        raise StackError(problem)


def cuda_problem(
    torch_version: str, torch_cuda: str | None, available: bool, driver: str | None
) -> str | None:
    """Why CUDA is unavailable on a machine with an NVIDIA driver, and the fix; ``None`` when CUDA is
    available or there is no driver (a CPU machine).

    >>> line = cuda_problem("2.13.0+cu130", "13.0", False, "550.54.15")
    >>> "for CUDA 13.0, which needs an NVIDIA driver >= 580, and this machine's driver is 550.54.15" in line
    True
    >>> cuda_problem("2.13.0+cu130", "13.0", True, "580.65.06") is None
    True
    """
    if available or driver is None:
        return None
    if torch_cuda is None:
        return (
            f"CUDA is not available: torch {torch_version} is a CPU build, and this machine has NVIDIA "
            f'driver {driver}; install a CUDA build (pip install -e ".[gpu]" {GPU_CONSTRAINTS}), or set '
            "use_cpu: true"
        )
    needed = MIN_DRIVER.get(int(torch_cuda.split(".")[0]))
    if needed is not None and _major(driver) < needed:
        fix = f"update the driver to {needed} or later"
        if needed > _major(driver) >= MIN_DRIVER[12]:
            fix = f"install torch built for CUDA 12 ({CUDA12_ROUTE}), or {fix}"
        return (
            f"CUDA is not available: torch {torch_version} is built for CUDA {torch_cuda}, which needs an "
            f"NVIDIA driver >= {needed}, and this machine's driver is {driver}; {fix}"
        )
    return (
        f"CUDA is not available: torch {torch_version} is built for CUDA {torch_cuda} and NVIDIA driver "
        f"{driver} is loaded, but no GPU is usable; check nvidia-smi and CUDA_VISIBLE_DEVICES, or set "
        "use_cpu: true"
    )


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version (``"580.65.06"``), or ``None`` when no driver is loaded."""
    try:
        text = NVIDIA_VERSION_FILE.read_text()
    except OSError:
        text = ""
    found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", text)
    if found:
        return found.group(1)
    if NVIDIA_VERSION_FILE != Path("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is None:
        return None  # a file given in its place (tests) is the whole answer
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None


def _major(version: str) -> int:
    return int(version.split(".")[0])


def _installed(package: str, min_version: str | None = None) -> bool:
    """Whether the module ``package`` imports, from a distribution of at least ``min_version``: the one named
    like it, else any that ships it (``liger-kernel-nightly`` ships ``liger_kernel``)."""
    if importlib.util.find_spec(package) is None:
        return False
    if min_version is None:
        return True
    from packaging.version import InvalidVersion, Version

    def shipping() -> Any:  # the distributions that ship it, read only where the usual name is missing
        yield package.replace("_", "-")
        yield from importlib.metadata.packages_distributions().get(package, [])

    for name in shipping():
        try:
            return Version(importlib.metadata.version(name)) >= Version(min_version)
        except importlib.metadata.PackageNotFoundError:
            continue
        except InvalidVersion:
            return False
    return False


# ---------------------------------------------------------------------------------------------
# While the recipe is parsed (`machine_problem`, which the entry point hands to
# `prompt_aug.recipe.check_recipe`; not in a dry run).

# W&B modes (WANDB_MODE, or `wandb offline` in a settings file) that need no account.
WANDB_LOCAL_MODES = ("offline", "dryrun", "disabled")


def machine_problem(args: Any) -> str | None:
    """What this machine lacks for the training arguments ``args``: `optimizer_problem`, then
    `wandb_problem`; None when nothing."""
    return optimizer_problem(args) or wandb_problem(args.report_to)


def optimizer_problem(args: Any) -> str | None:
    """Why the Trainer could not build ``optim`` here, found as it looks for it: a package that is not
    installed (bitsandbytes for the 8-bit, paged, Lion and AdEMAMix optimizers; GaLore's, torchao's, ...), in
    transformers' words; None otherwise.

    >>> from transformers import TrainingArguments
    >>> optimizer_problem(TrainingArguments("out", optim="adamw_torch", report_to="none")) is None
    True
    """
    from transformers import Trainer

    try:
        Trainer.get_optimizer_cls_and_kwargs(args)
    except ImportError as err:
        name = getattr(args.optim, "value", args.optim)
        return f"optim: {name} needs a package that is not installed ({err}); or choose another optim"
    except Exception:  # noqa: BLE001 (one that needs the model, GaLore's or LOMO's: the Trainer says why)
        return None
    return None


def wandb_problem(report_to: list[str]) -> str | None:
    """Why ``report_to: wandb`` would stop the run once the model has loaded: wandb not installed, or no W&B
    credentials where ``wandb.init`` looks (WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, a settings file's
    api_key, the .netrc entry ``wandb login`` writes), read without the network; None otherwise, and in an
    offline or disabled W&B mode. wandb is imported only when ``report_to`` names it. Only the main process
    (RANK 0) logs to W&B, so only it needs the login.

    >>> wandb_problem(["tensorboard"]) is None
    True
    """
    if "wandb" not in report_to or os.environ.get("RANK", "0") != "0":
        return None
    if os.environ.get("WANDB_MODE", "").strip().lower() in WANDB_LOCAL_MODES:
        return None
    if not _installed("wandb"):
        return (
            "report_to: wandb needs the wandb package, which is not installed; "
            'pip install -e ".[wandb]", or set report_to: none'
        )
    try:  # wandb's own readers of its settings and .netrc (as its `wandb login` command reads them)
        from wandb.errors import AuthenticationError
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth
    except ImportError:  # another wandb layout: wandb.init says what is missing, as before
        return None
    key = os.environ.get("WANDB_API_KEY")
    if key:
        bad = wbauth.check_api_key(key)
        return None if bad is None else f"report_to: wandb, but WANDB_API_KEY is not a W&B API key: {bad}"
    try:  # the environment and the settings files (no service started), then .netrc
        settings = wandb_setup.singleton().settings
        if (
            os.environ.get("WANDB_IDENTITY_TOKEN_FILE")
            or settings.mode in WANDB_LOCAL_MODES
            or settings.api_key
        ):
            return None
        if wbauth.read_netrc_auth(host=settings.base_url):
            return None
    except AuthenticationError as err:  # a .netrc entry that is no API key
        return (
            f"report_to: wandb, but the W&B API key in .netrc is not valid ({err}); run wandb login --relogin"
        )
    except Exception:  # noqa: BLE001 (settings wandb cannot read, a WANDB_MODE it lacks: wandb.init says why)
        return None
    return (
        "report_to: wandb, but no W&B API key is configured (WANDB_API_KEY, or wandb login); log in, set "
        "WANDB_MODE=offline to log locally, or set report_to: none"
    )


# ---------------------------------------------------------------------------------------------
# After the recipe is parsed.


def check_stack(args: Any, dry_run: bool = False) -> None:
    """Refuse, in one line naming the key and the extra that brings it, vLLM for ``use_vllm`` (not in a dry
    run, which checks a GPU recipe on any machine) and liger-kernel for ``use_liger_kernel`` (in a dry run
    too: it would pass, and the run fail). Outside a dry run, log torch's CUDA build and the driver's version
    (the first process of each machine).

    Raises:
        StackError: the key, the missing package and the install line.
    """
    if getattr(args, "use_liger_kernel", False) and not _installed("liger_kernel", LIGER_MIN_VERSION):
        raise StackError(
            f"use_liger_kernel: needs liger-kernel >= {LIGER_MIN_VERSION}, which is not installed; "
            'pip install -e ".[liger]" (a CUDA machine), or set use_liger_kernel false'
        )
    if dry_run:
        return
    if getattr(args, "use_vllm", False) and not _installed("vllm"):
        raise StackError(
            'use_vllm: needs vLLM, which is not installed; pip install -e ".[vllm]" '
            f"{GPU_CONSTRAINTS} (a CUDA machine), or set use_vllm false"
        )
    if os.environ.get("LOCAL_RANK", "0") == "0":  # one line per machine: each has its own driver
        logger.info("%s", stack_line())


def stack_line() -> str:
    """torch's version and CUDA build, the NVIDIA driver's version and the GPUs visible, in one line."""
    import torch

    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    driver = nvidia_driver() or "none"
    return f"torch {torch.__version__} ({build}); NVIDIA driver {driver}; {gpus} GPU(s) visible"


# ---------------------------------------------------------------------------------------------
# vLLM server mode.


def server_address(args: Any) -> tuple[str, str, str]:
    """The vLLM server's base URL as TRL's `VLLMClient` builds it, and the host and port it names (a URL
    without one: its scheme's, where the client connects).

    >>> from types import SimpleNamespace
    >>> server_address(SimpleNamespace(vllm_server_base_url="https://node1"))
    ('https://node1', 'node1', '443')
    >>> server_address(SimpleNamespace(vllm_server_base_url="http://node1:8000"))
    ('http://node1:8000', 'node1', '8000')
    """
    from urllib.parse import urlparse

    if args.vllm_server_base_url:
        parsed = urlparse(args.vllm_server_base_url)
        scheme = parsed.scheme or "http"
        base = f"{scheme}://{parsed.netloc}{parsed.path}"
        return base, str(parsed.hostname), str(parsed.port or {"http": 80, "https": 443}.get(scheme, ""))
    return (
        f"http://{args.vllm_server_host}:{args.vllm_server_port}",
        args.vllm_server_host,
        str(args.vllm_server_port),
    )


def serve_command(model: str, port: str) -> str:
    """The command that starts the server TRL's client talks to."""
    return f"trl vllm-serve --model {model}" + (f" --port {port}" if port else "")


def wait_for_vllm_server(args: Any, model: str, report_every: float = 15.0) -> None:
    """In vLLM server mode (``use_vllm``, ``vllm_mode: server``), wait up to ``vllm_server_timeout`` seconds
    for the server's ``/health`` to answer, logging every ``report_every`` seconds what it waits for.

    Only the main process waits: it alone talks to the server (TRL builds its `VLLMClient` there), so a
    ``localhost`` server is the main machine's. The other processes wait for its verdict (a collective, within
    ``ddp_timeout``), and every process stops with the same line.

    Raises:
        StackError: no answer in time; the line names the host, the port, the last answer or error, and the
            command that starts the server.
    """
    if not (getattr(args, "use_vllm", False) and args.vllm_mode == "server"):
        return
    from accelerate import PartialState

    state = PartialState()
    error = None
    if state.is_main_process:
        try:
            _wait_for_health(args, model, report_every)
        except StackError as err:
            error = str(err)
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        (error,) = broadcast_object_list([error])
    if error:
        raise StackError(error)


def _wait_for_health(args: Any, model: str, report_every: float) -> None:
    """`wait_for_vllm_server`'s wait, on this process."""
    base, host, port = server_address(args)
    timeout = float(args.vllm_server_timeout)
    start = time.monotonic()
    next_report = start
    while True:
        answer = _health(f"{base}/health", min(5.0, max(0.5, timeout - (time.monotonic() - start))))
        if answer is None:
            if next_report > start:  # it had to wait: say that the wait is over
                logger.info("vLLM server at %s:%s is up", host, port)
            return
        now = time.monotonic()
        left = timeout - (now - start)
        if left <= 0:
            where = (
                "vllm_server_base_url" if args.vllm_server_base_url else "vllm_server_host/vllm_server_port"
            )
            raise StackError(
                f"no vLLM server answered at {host}:{port} ({where}) within vllm_server_timeout "
                f"{timeout:g} s (last: {answer}); start it there with `{serve_command(model, port)}`, or "
                "raise vllm_server_timeout"
            )
        if now >= next_report:
            logger.info(
                "waiting for the vLLM server at %s:%s (%d s left of vllm_server_timeout; last: %s); start it "
                "with `%s`", host, port, round(left), answer, serve_command(model, port),
            )  # fmt: skip
            next_report = now + report_every
        time.sleep(min(1.0, max(0.0, left)))


def _health(url: str, timeout: float) -> str | None:
    """``None`` when ``url`` answers 200 (redirects followed, as TRL's client follows them), else what it
    answered or why it did not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if response.status == 200:
                return None
            return f"/health answered HTTP {response.status}"
    except urllib.error.HTTPError as err:
        hint = "still loading?" if err.code == 503 else "another service on that port?"
        return f"/health answered HTTP {err.code} {err.reason}, {hint}"
    except urllib.error.URLError as err:
        return str(getattr(err.reason, "strerror", None) or err.reason)
    except (OSError, ValueError) as err:  # a timeout, a reset connection, a malformed URL
        return str(err) or type(err).__name__
