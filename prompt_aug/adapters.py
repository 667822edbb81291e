"""LoRA adapter folders: the base model an adapter records, and merging it into that base.

``python -m prompt_aug.adapters merge OUTPUT_DIR [--base MODEL] [--output DIR]`` writes a full model (the
base with the adapter folded in, the tokenizer and the run's generation config, which holds the recipe's
stop tokens) that vLLM and any ``from_pretrained`` can load. It prints the new folder.

A LoRA run (``use_peft: true``) saves only its adapter. The hf evaluation backend loads such a folder as it
is; vLLM needs the merged model.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from .model_card import CardError, full_model_card
from .sources import SourceError, check_source, looks_local

logger = logging.getLogger("prompt_aug")

ADAPTER_FILE = "adapter_config.json"
# What a merged folder takes from the adapter folder: the run's tokenizer and chat template, and its
# generation config (the recipe's stop tokens; the merged model would otherwise bring its base's).
_CARRIED = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json",
    "merges.txt", "added_tokens.json", "tokenizer.model", "generation_config.json",
    "README.md",  # the run's model card, which `python -m prompt_aug.model_card` fills with an evaluation
)  # fmt: skip


class AdapterError(ValueError):
    """An adapter folder that cannot be used as asked; the message names the folder and what to do."""


def is_adapter(folder: str | Path) -> bool:
    """Whether ``folder`` is a PEFT adapter folder (it holds ``adapter_config.json``)."""
    return (Path(folder).expanduser() / ADAPTER_FILE).is_file()


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


def check_adapter_base(key: str, folder: str | Path) -> None:
    """Fail in one line when the adapter in ``folder`` records no base model, a local base model that is not
    there (a relative path read from another folder, or a base moved since), or a Hub id that cannot be had
    (offline, not in the cache), before transformers fails deep in loading it.

    Raises:
        AdapterError: names the folder, the recorded base, and the ways out.
    """
    base = adapter_base(folder)
    if not base:
        raise AdapterError(
            f"{key} {folder}: a LoRA adapter whose {ADAPTER_FILE} records no base model "
            f"(base_model_name_or_path); merge it with `python -m prompt_aug.adapters merge {folder} --base "
            "<the base model>`"
        )
    if not looks_local(base):  # a Hub id: offline, it must be in the cache
        try:
            check_source(f"{key} {folder}: its LoRA adapter's base model", base, model=True)
        except SourceError as err:
            raise AdapterError(str(err)) from None
    if looks_local(base) and not Path(base).expanduser().exists():
        raise AdapterError(
            f"{key} {folder}: a LoRA adapter whose base model {base!r} is not there (resolved to "
            f"{Path(base).expanduser().resolve()}); run from the folder it was trained in, or merge it with "
            f"`python -m prompt_aug.adapters merge {folder} --base <the base model>`"
        )


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


def merge(folder: str | Path, base: str | None = None, output: str | Path | None = None) -> Path:
    """Fold the adapter in ``folder`` into its base model (``base``, default the one it records) and save the
    full model, with the adapter folder's tokenizer (else the base's), generation config and model card (a
    full model's: `model_card.full_model_card`), in ``output`` (default `default_output`), written under a
    temporary name and renamed when complete. Returns ``output``.

    Raises:
        AdapterError: ``folder`` is not an adapter, its ``adapter_config.json`` does not parse, its base is
            not recorded or cannot be found, or ``output`` is not empty.
    """
    folder = Path(folder).expanduser().resolve()
    if not is_adapter(folder):
        raise AdapterError(f"{folder}: no {ADAPTER_FILE} there, so not a LoRA adapter folder")
    # A file that does not parse fails here, naming it, with or without ``base``.
    recorded = adapter_base(folder)
    if base is None:
        check_adapter_base("merge", folder)
        base = recorded
    check_source("--base", base, model=True)  # a missing folder, or an unreachable or uncached Hub id
    target = Path(output).expanduser() if output else default_output(folder)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise AdapterError(f"--output {target} exists and is not empty; remove it or pass another --output")
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
    with torch.no_grad():
        merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    umask = os.umask(0o022)  # read, and put back: mkdtemp's folder is the owner's alone
    os.umask(umask)
    work.chmod(0o777 & ~umask)  # the merged folder opens as any folder made here would (a vLLM server's user)
    try:
        merged.save_pretrained(work)
        for name in _CARRIED:
            if (folder / name).is_file():
                shutil.copy2(folder / name, work / name)
        if not has_tokenizer(folder):
            AutoTokenizer.from_pretrained(base).save_pretrained(work)
        if (work / "README.md").is_file():
            card = merged_card((work / "README.md").read_text(), target)
            try:
                card = full_model_card(card, target)
            except CardError as err:  # a hand-edited card: the merge stands, the card keeps its metadata
                logger.warning("%s; its evaluation section and metadata were left as they were", err)
            (work / "README.md").write_text(card)
        if target.exists():
            target.rmdir()  # empty (checked above)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> None:
    """``python -m prompt_aug.adapters merge FOLDER [--base MODEL] [--output DIR]``; prints the new folder."""
    parser = argparse.ArgumentParser(
        prog="python -m prompt_aug.adapters", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    join = commands.add_parser(
        "merge", help="fold a LoRA adapter into its base model and save the full model"
    )
    join.add_argument("folder", help="the adapter folder (a LoRA run's output_dir or one of its checkpoints)")
    join.add_argument("--base", default=None, help="the base model (default: the one the adapter records)")
    join.add_argument(
        "--output", default=None, help="the folder to write (default: FOLDER-merged; RUN-checkpoint-N-merged)"
    )
    args = parser.parse_args(argv)
    try:
        print(merge(args.folder, args.base, args.output))
    except (AdapterError, SourceError) as err:
        raise SystemExit(f"prompt_aug.adapters: error: {err}") from None


if __name__ == "__main__":
    main()
