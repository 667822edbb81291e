"""LoRA adapter folders: the base model an adapter records, and merging it into that base.

``python -m prompt_aug.adapters merge OUTPUT_DIR [--base MODEL] [--output DIR] [--dtype D]`` writes a full
model (the base with the adapter folded in, the tokenizer and the run's generation config, which holds the
recipe's stop tokens) that vLLM and any ``from_pretrained`` can load. It prints the new folder.

A LoRA run (``use_peft: true``) saves only its adapter. The hf evaluation backend loads such a folder as it
is; vLLM needs the merged model.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

from .faults import staged_folder
from .model_card import CardError, full_model_card, weights_fingerprint
from .sources import (
    LOCAL_MODELS,
    SourceError,
    check_source,
    close_local_name,
    fetch_command,
    file_in_the_way,
    looks_local,
    model_class,
    resolve_local_model,
)

logger = logging.getLogger("prompt_aug")

ADAPTER_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")  # where PEFT looks for an adapter's weights
# What a merged folder takes from the adapter folder: the run's tokenizer and chat template, and its
# generation config (the recipe's stop tokens; the merged model would otherwise bring its base's). The run's
# model card goes too, where it is the trainer's (`is_trainer_card`).
_CARRIED = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json",
    "merges.txt", "added_tokens.json", "tokenizer.model", "generation_config.json",
)  # fmt: skip
# The dtypes `merge` computes in: ``auto`` is the base's stored dtype.
DTYPES = ("auto", "bfloat16", "float16", "float32")  # ModelConfig's ``dtype`` choices
PASS_BASE = "pass --base <folder or Hub id>"  # the way out of a recorded base that cannot be had


class AdapterError(ValueError):
    """An adapter folder that cannot be used as asked; the message names the folder and what to do."""


def is_adapter(folder: str | Path) -> bool:
    """Whether ``folder`` is a PEFT adapter folder (it holds ``adapter_config.json``)."""
    return (Path(folder).expanduser() / ADAPTER_FILE).is_file()


def adapted_modules(folder: str | Path) -> set[str]:
    """The paths of the modules the LoRA adapter in ``folder`` adapts, as the model it was trained on names
    them (``model.layers.0.self_attn.q_proj``): of its linear and embedding layers, and of the modules whose
    parameters it adapts (``lora_target_parameters``, a MoE's experts); empty without its weights."""
    folder = Path(folder).expanduser()
    path = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if path is None:
        return set()
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as weights:
            keys = list(weights.keys())
    else:
        import torch

        keys = list(torch.load(path, map_location="meta", weights_only=True))
    found = (re.match(r"base_model\.model\.(.+?)\.lora_(?:embedding_)?A\b", key) for key in keys)
    return {re.sub(r"(\.base_layer)+$", "", m.group(1)) for m in found if m}


def adapter_base_class(folder: str | Path, base: str, **config_kwargs: Any) -> Any:
    """The class to load ``base`` in for the adapter in ``folder``: the class TRL's trainer gives it
    (`sources.model_class`) where that model has every module the adapter adapts, else the one of
    `AutoModelForCausalLM` and `AutoModelForImageTextToText` that has them. A vision-language checkpoint
    trained whole (TRL's class) or as its text model alone (Qwen3.5's causal-LM class) gets its adapter
    applied either way; PEFT would skip the modules it cannot find with a warning, computing the base. A base
    that has them in no class (another model) gets TRL's class."""
    import torch
    import transformers

    modules = adapted_modules(folder)
    config = transformers.AutoConfig.from_pretrained(base, **config_kwargs)
    first = model_class(config)
    if not modules:
        return first
    candidates = [first, transformers.AutoModelForCausalLM, transformers.AutoModelForImageTextToText]
    for candidate in dict.fromkeys(candidates):
        try:
            with torch.device("meta"):
                skeleton = (
                    candidate.from_config(config) if hasattr(candidate, "from_config") else candidate(config)
                )
        except (ValueError, TypeError, ImportError, AttributeError, KeyError):  # a class that cannot build
            continue  # it (an auto class that does not know the model type, a missing package)
        if modules <= {name for name, _ in skeleton.named_modules()}:
            return candidate
    return first  # another model than the one trained: loading the adapter names what it lacks


def has_tokenizer(folder: str | Path) -> bool:
    """Whether ``folder`` holds a tokenizer (``tokenizer_config.json``); an adapter saved by PEFT alone does
    not, and takes its base model's."""
    return (Path(folder).expanduser() / "tokenizer_config.json").is_file()


def adapter_base(folder: str | Path) -> str:
    """The base model the adapter in ``folder`` was trained on, as its ``adapter_config.json`` records it
    (``""`` where it records none).

    Raises:
        AdapterError: the file is not a JSON object; names it.
    """
    path = Path(folder).expanduser() / ADAPTER_FILE
    try:
        config = json.loads(path.read_text())
    except ValueError as err:
        raise AdapterError(
            f"{path}: not valid JSON ({err}); save the adapter again or fix the file"
        ) from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path}: not a JSON object; save the adapter again or fix the file")
    return str(config.get("base_model_name_or_path") or "")


def check_adapter_base(key: str, folder: str | Path, way_out: str | None = None) -> None:
    """Fail in one line when the adapter in ``folder`` records no base model, a local base model that is not
    there (a relative path read from another folder, or a base moved since), or a Hub id that cannot be had
    (offline, not in the cache), before transformers fails deep in loading it. ``way_out`` ends the message
    (default: merge the adapter with ``--base``).

    Raises:
        AdapterError: names the folder, the recorded base, and the ways out.
    """
    base = adapter_base(folder)
    way_out = (
        way_out or f"merge it with `python -m prompt_aug.adapters merge {folder} --base <folder or Hub id>`"
    )
    if not base:
        raise AdapterError(
            f"{key} {folder}: a LoRA adapter whose {ADAPTER_FILE} records no base model "
            f"(base_model_name_or_path); {way_out}"
        )
    if looks_local(base) and not Path(base).expanduser().exists():
        # Only a relative path depends on the folder it is read from.
        here = "" if Path(base).expanduser().is_absolute() else "run from the folder it was trained in, or "
        name = Path(base).name  # a fetched model's folder, on the machine it was trained on
        fetched = ""
        if name in LOCAL_MODELS:
            fetched = f" (it is the fetched model {name}: --base {name} names it here, once "
            fetched += f"`{fetch_command(name)}` has run)"
        raise AdapterError(
            f"{key} {folder}: a LoRA adapter whose base model {base!r} is not there (resolved to "
            f"{Path(base).expanduser().resolve()}); {here}{way_out}{fetched}"
        )
    try:  # a file, a folder with no model in it, a Hub id that cannot be had
        check_source(f"{key} {folder}: its LoRA adapter's base model", base, model=True, way_out=way_out)
    except SourceError as err:
        raise AdapterError(str(err)) from None


def same_model(a: str, b: str) -> bool | None:
    """Whether ``a`` and ``b`` (model folders or Hub ids) are one model: two folders where they are one
    folder or hold the same weights (`weights_fingerprint`), two Hub ids where they are one id; None where
    that cannot be told (a path not on this machine, a Hub id against a folder).

    >>> same_model("Qwen/Qwen2.5-Math-1.5B", "qwen/qwen2.5-math-1.5b"), same_model("a/b", "/nowhere/x")
    (True, None)
    """
    if a == b:
        return True
    first, second = Path(a).expanduser(), Path(b).expanduser()
    if first.is_dir() and second.is_dir():
        if first.resolve() == second.resolve():
            return True
        weights = weights_fingerprint(first)
        return weights is not None and weights == weights_fingerprint(second)
    if not looks_local(a) and not looks_local(b) and not first.exists() and not second.exists():
        return a.lower() == b.lower()
    return None


def resumed_base_problem(checkpoint: str | Path, model_path: str) -> str | None:
    """Why the LoRA adapter in ``checkpoint`` cannot go on training on ``model_path`` (the run's model, as
    `prompt_aug.models.resolve_model_path` gives it), or None: it records another base model (`same_model`
    says so; where it cannot tell, it passes).

    >>> resumed_base_problem("/nowhere/checkpoint-5", "Qwen/Qwen2.5-Math-1.5B") is None  # no adapter there
    True
    """
    if not (Path(checkpoint) / ADAPTER_FILE).is_file():
        return None
    recorded = adapter_base(checkpoint)
    if not recorded or same_model(recorded, model_path) is not False:
        return None
    return (
        f"resume_from_checkpoint: {checkpoint}'s adapter was trained on {recorded}, not on "
        f"model_name_or_path {model_path}; resume with the model the run was started with"
    )


def not_an_adapter(folder: Path) -> str:
    """Why ``folder``, which holds no ``adapter_config.json``, is not an adapter to merge, and what to give
    instead: a path that is not there (and a close name beside it), a file, a full model (nothing to merge),
    or a LoRA run that saved checkpoints but no final adapter (its last checkpoint)."""
    if not folder.exists():
        close = close_local_name(str(folder))
        fix = (
            f"; did you mean {close}?"
            if close
            else "; give a LoRA run's output folder or one of its checkpoints"
        )
        return f"{folder}: no such folder{fix}"
    if not folder.is_dir():
        return f"{folder}: a file, not a LoRA adapter folder; give the folder the adapter was saved in"
    if (folder / "config.json").is_file():
        return (
            f"{folder}: a full model (config.json, no {ADAPTER_FILE}), not a LoRA adapter: there is "
            "nothing to merge, load it as it is"
        )
    checkpoints = [
        p for p in folder.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name) and is_adapter(p)
    ]
    if checkpoints:
        last = max(checkpoints, key=lambda p: int(p.name.split("-")[1]))
        return (
            f"{folder}: no {ADAPTER_FILE} (the run saved no final adapter, stopped early?); merge one of its "
            f"checkpoints, the last being {last}"
        )
    return f"{folder}: no {ADAPTER_FILE} there, so not a LoRA adapter folder"


def _other_local_base(recorded: str, base: str) -> bool:
    """Whether ``recorded``, an adapter's base model, is a local model folder still there and ``base`` is
    not surely the same model (`same_model`)."""
    folder = Path(recorded).expanduser()
    if not recorded or not looks_local(recorded) or not (folder / "config.json").is_file():
        return False
    return same_model(recorded, base) is not True


def default_output(folder: Path) -> Path:
    """Where `merge` writes by default: ``<folder>-merged`` beside the folder; for a run's ``checkpoint-N``,
    ``<run>-checkpoint-N-merged`` beside the run, outside its output folder, where checkpoint rotation and
    ``--overwrite_output_dir`` would take a ``checkpoint-N-merged`` for one of the run's checkpoints.

    >>> default_output(Path("/r/run")), default_output(Path("/r/run/checkpoint-500"))
    (PosixPath('/r/run-merged'), PosixPath('/r/run-checkpoint-500-merged'))
    """
    if re.fullmatch(r"checkpoint-\d+", folder.name):
        return folder.parent.with_name(f"{folder.parent.name}-{folder.name}-merged")
    return folder.with_name(folder.name + "-merged")


def merged_card(card: str, target: Path) -> str:
    """The run's model card for its merged folder ``target``: titled with the folder's name, and its
    snippets loading the model from there (a card names the folder it was written in).

    >>> print(merged_card('# run\\nm = f.from_pretrained("outputs/run")\\np = pipeline(model="outputs/run")',
    ...                   Path("/o/run-merged")))
    # run-merged
    m = f.from_pretrained("/o/run-merged")
    p = pipeline(model="/o/run-merged")
    """
    card = re.sub(r"^# .*$", lambda _: f"# {target.name}", card, count=1, flags=re.MULTILINE)
    card = re.sub(r'from_pretrained\("[^"]*"\)', lambda _: f'from_pretrained("{target}")', card)
    return re.sub(r'\bmodel="[^"]*"', lambda _: f'model="{target}"', card)


def _shared_embedding(model: Any) -> Any:
    """The weight that the input and output embeddings of ``model`` share (a base with
    ``tie_word_embeddings``), or None."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if inputs is None or outputs is None or outputs.weight is not inputs.weight:
        return None
    return inputs.weight


def _untie_embeddings(adapted: Any, shared: Any) -> None:
    """Give the output embedding under ``adapted`` (a PEFT model loaded on a tied base) a copy of ``shared``,
    the weight it shares with the input embedding, so that a delta merged into one leaves the other as the
    adapter-applied model computes it. PEFT is given the base tied, as training gave it: trainable tokens,
    and ``ensure_weight_tying``, act on both embeddings only where it sees them tied."""
    import torch

    model = adapted.get_base_model()
    copy = torch.nn.Parameter(shared.detach().clone(), requires_grad=False)
    for module in model.get_output_embeddings().modules():  # the layer, or PEFT's wrappers of it
        if module._parameters.get("weight") is shared:
            module._parameters["weight"] = copy
    model.config.tie_word_embeddings = False


def _unmerged_layer(model: Any) -> str | None:
    """The first layer of ``model`` that PEFT's ``merge_and_unload`` left one of its own (with its class),
    or None."""
    for name, module in model.named_modules():
        if type(module).__module__.startswith("peft."):
            return f"{name} ({type(module).__name__})"
    return None


def _retie_embeddings(model: Any) -> None:
    """Tie the embeddings of ``model`` again where the merge left them equal (an adapter that touched
    neither): the merged model is then saved as its base was."""
    import torch

    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if torch.equal(outputs.weight, inputs.weight):
        outputs.weight = inputs.weight
        model.config.tie_word_embeddings = True


def _size_mismatch(error: str) -> str | None:
    """The first weight that PEFT's ``size mismatch`` error names, shortened, with its two shapes; None for
    another error.

    >>> _size_mismatch("Error(s) in loading state_dict for PeftModel:\\n\\tsize mismatch for base_model."
    ...     "model.model.layers.0.self_attn.q_proj.lora_A.default.weight: copying a param with shape torch."
    ...     "Size([4, 64]) from checkpoint, the shape in current model is torch.Size([4, 128]).")
    'model.layers.0.self_attn.q_proj.lora_A is [4, 64] in the adapter, [4, 128] in the base'
    """
    found = re.search(
        r"size mismatch for (?:base_model\.model\.)?(\S+?)(?:\.default)?(?:\.weight)?: copying a param with "
        r"shape torch\.Size\((\[[^\]]*\])\) from checkpoint, the shape in current model is "
        r"torch\.Size\((\[[^\]]*\])\)",
        error,
    )
    if found is None:
        line = next((line.strip() for line in error.splitlines() if "size mismatch" in line), None)
        return line.rstrip(".") if line else None
    name, adapter, base = found.groups()
    return f"{name} is {adapter} in the adapter, {base} in the base"


def is_trainer_card(card: str) -> bool:
    """Whether ``card`` is the card a run's trainer wrote (TRL's, with ours in it), not PEFT's placeholder,
    which a checkpoint's adapter folder holds.

    >>> is_trainer_card("It has been trained using [TRL](https://github.com/huggingface/trl).")
    True
    >>> is_trainer_card("# Model Card for Model ID")
    False
    """
    return "trained using [TRL](" in card or "## Template bank" in card.split("\n")


def check_output(target: Path) -> None:
    """Refuse ``target`` as `merge`'s output folder when it is a file, a folder that is not empty, or lies
    under a file.

    Raises:
        AdapterError: names ``--output`` and what is in the way.
    """
    file = file_in_the_way(target)
    if file == target:
        raise AdapterError(f"--output {target} is a file, not a folder; pass another --output")
    if file is not None:
        raise AdapterError(f"--output {target}: {file} is a file, not a folder; pass another --output")
    if target.is_dir() and any(target.iterdir()):
        raise AdapterError(f"--output {target} exists and is not empty; remove it or pass another --output")


def merge(
    folder: str | Path, base: str | None = None, output: str | Path | None = None, dtype: str = "auto"
) -> Path:
    """Fold the adapter in ``folder`` into its base model (``base``: a folder, a Hub id or a fetched model's
    name, `sources.LOCAL_MODELS`; default the one it records) and save the full model, with the adapter
    folder's tokenizer (else the base's), generation config and model card (the trainer's card only, made a
    full model's: `model_card.full_model_card`), in ``output`` (default `default_output`), written under a
    temporary name and renamed when complete. The merge is computed in ``dtype`` (``auto``: the base's stored
    dtype; ``float32`` keeps a small delta that bf16 would round away). Returns ``output``.

    A base with tied input and output embeddings gets the adapter tied, as in training, and is untied before
    the merge, so that a LoRA on ``lm_head`` (or on the embeddings) changes that layer alone, and trainable
    tokens both, as the adapter-applied model does; the merged model is saved untied where they then differ.

    Raises:
        AdapterError: ``folder`` is not an adapter, its ``adapter_config.json`` does not parse, its base is
            not recorded, cannot be found, is quantized or has other shapes than the adapter's, its weights
            are missing, ``base`` is itself an adapter folder, PEFT leaves a layer unmerged, ``output`` is
            refused by `check_output`, or ``dtype`` is not one of `DTYPES`.
        SourceError: ``base`` cannot be found (a missing folder, an unreachable or uncached Hub id).
    """
    folder = Path(folder).expanduser().resolve()
    if not is_adapter(folder):
        raise AdapterError(not_an_adapter(folder))
    if not any((folder / name).is_file() for name in WEIGHT_FILES):  # else PEFT takes it for a Hub id
        raise AdapterError(
            f"{folder}: {ADAPTER_FILE} but no adapter weights ({' or '.join(WEIGHT_FILES)}); give the folder "
            "the adapter was saved in whole"
        )
    if dtype not in DTYPES:
        raise AdapterError(f"--dtype {dtype!r}: not one of {', '.join(DTYPES)}")
    # A file that does not parse fails here, naming it, with or without ``base``.
    recorded = adapter_base(folder)
    if base is None:
        check_adapter_base("merge", folder, way_out=PASS_BASE)
        base, label = recorded, f"merge {folder}: its LoRA adapter's base model {recorded}"
    else:
        label = f"--base {base}"
        base = resolve_local_model(base, key="--base")  # a fetched model's short name is its folder
        check_source("--base", base, model=True)  # a missing folder, or an unreachable or uncached Hub id
        if is_adapter(base):  # PEFT would fail on it after loading, with a false version mismatch
            raise AdapterError(
                f"{label}: a PEFT adapter folder ({ADAPTER_FILE}), not a full model; merge it first (python "
                f"-m prompt_aug.adapters merge {base}) and give the merged folder as --base"
            )
        if _other_local_base(recorded, base):
            logger.warning(
                "%s: the adapter in %s was trained on %s, which is still there; merging it into %s as asked "
                "(leave --base out to merge into the model it was trained on)",
                label, folder, recorded, base,
            )  # fmt: skip
    target = Path(output).expanduser() if output else default_output(folder)
    check_output(target)
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(base)
    quantized = getattr(config, "quantization_config", None)
    if quantized:  # PEFT would fold the delta into rounded weights, or need a GPU library to load them at all
        method = quantized.get("quant_method") if isinstance(quantized, dict) else quantized.quant_method
        raise AdapterError(
            f"{label}: a quantized model ({method}), which the adapter's delta cannot be folded into without "
            "rounding it away; pass --base the unquantized model it was quantized from"
        )
    model = adapter_base_class(folder, base).from_pretrained(
        base, dtype=dtype if dtype == "auto" else getattr(torch, dtype)
    )
    shared = _shared_embedding(model)
    try:
        adapted = PeftModel.from_pretrained(model, str(folder))
    except (RuntimeError, ValueError) as err:  # another model than the one the adapter was trained on
        mismatch = _size_mismatch(str(err))
        if mismatch is None and isinstance(err, ValueError) and "not found in the base model" in str(err):
            mismatch = str(err).split(" not found in the base model")[0]  # PEFT's: Target modules {...}
            mismatch = f"{mismatch[0].lower()}{mismatch[1:]} are not in the base"
        if mismatch is None:
            raise
        raise AdapterError(
            f"{label}: not the model the adapter in {folder} was trained on ({mismatch}); pass --base the "
            "model it was trained on"
        ) from None
    with torch.no_grad():
        if shared is not None:
            _untie_embeddings(adapted, shared)
        merged = adapted.merge_and_unload()
        if left := _unmerged_layer(merged):  # saved, it would hold PEFT's keys, which no loader reads
            raise AdapterError(
                f"{folder}: PEFT cannot fold this adapter into its base ({left} is left a PEFT layer); "
                "evaluate the adapter folder as it is (--backend hf), or train without that combination"
            )
        if shared is not None:
            _retie_embeddings(merged)
    target.parent.mkdir(parents=True, exist_ok=True)
    with staged_folder(target) as work:
        merged.save_pretrained(work)
        for name in _CARRIED:
            if (folder / name).is_file():
                shutil.copy2(folder / name, work / name)
        if not has_tokenizer(folder):
            AutoTokenizer.from_pretrained(base).save_pretrained(work)
        card = (folder / "README.md").read_text() if (folder / "README.md").is_file() else ""
        # A checkpoint's card is PEFT's placeholder, which would describe an adapter: only the trainer's goes.
        if is_trainer_card(card):
            card = merged_card(card, target)
            try:
                card = full_model_card(card, target)
            except CardError as err:  # a hand-edited card: the merge stands, the card keeps its metadata
                logger.warning("%s; its evaluation section and metadata were left as they were", err)
            (work / "README.md").write_text(card)
        try:
            if target.exists():
                target.rmdir()  # empty (checked above), unless another process has since filled it
            work.rename(target)
        except OSError as err:
            raise AdapterError(
                f"--output {target}: written by another process during the merge ({err.strerror}), and left "
                "as it is; remove it or pass another --output, and merge again"
            ) from None
    return target


def main(argv: list[str] | None = None) -> None:
    """``python -m prompt_aug.adapters merge FOLDER [--base MODEL] [--output DIR] [--dtype D]``; prints the
    new folder."""
    parser = argparse.ArgumentParser(
        prog="python -m prompt_aug.adapters", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    join = commands.add_parser(
        "merge", help="fold a LoRA adapter into its base model and save the full model"
    )
    join.add_argument("folder", help="the adapter folder (a LoRA run's output_dir or one of its checkpoints)")
    join.add_argument(
        "--base", default=None,
        help="the base model: a folder, a Hub id or a fetched model's name (default: the adapter's own)",
    )  # fmt: skip
    join.add_argument(
        "--output", default=None, help="the folder to write (default: FOLDER-merged; RUN-checkpoint-N-merged)"
    )
    join.add_argument(
        "--dtype", default="auto", choices=DTYPES,
        help="the dtype to merge and save in (default: the base's; float32 keeps a small LoRA delta exactly)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        print(merge(args.folder, args.base, args.output, args.dtype))
    except (AdapterError, SourceError) as err:
        raise SystemExit(f"prompt_aug.adapters: error: {err}") from None


if __name__ == "__main__":
    main()
