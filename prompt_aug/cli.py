"""What ``prompt-aug-train`` checks before anything heavy loads: the recipe and the output folder.

* `parse_recipe`: a misspelled key, a value of the wrong type or an impossible batch gives one line that
  names the key, the file (or the command line) and what to change, instead of a traceback or argparse's
  full usage text.
* `prepare_output_dir`: a folder that already holds a run is refused unless the run is resumed
  (``--resume_from_checkpoint``) or replaced (``--overwrite_output_dir true``, which first deletes the old
  run's checkpoints, weights, logs and completions, so the folder never mixes two runs).
"""

from __future__ import annotations

import difflib
import re
import shutil
from pathlib import Path
from typing import Any

import yaml
from trl import TrlParser

from .sources import SourceError


class UsageError(ValueError):
    """Bad input from the user; the message names the culprit and says what to do."""


# What a user sees for these instead of a traceback (the entry point turns them into one line).
USER_ERRORS = (UsageError, SourceError)


class RecipeParser(TrlParser):
    """`TrlParser` whose errors are one line naming the key and where it was set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config_path: str | None = None
        self._cli_keys: set[str] = set()

    def error(self, message: str) -> None:  # argparse calls this for a bad value; it would print the usage
        found = re.match(r"argument --([\w-]+)(?:/--[\w-]+)*: (.*)", message, re.DOTALL)
        key, problem = (found.group(1).replace("-", "_"), found.group(2)) if found else (None, message)
        where = "command line" if key in self._cli_keys or not self._config_path else self._config_path
        raise UsageError(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")

    def option_names(self) -> set[str]:
        """Every key a recipe may set (dataclass field names)."""
        return {action.dest for action in self._actions if action.dest != "help"}

    def flag_names(self) -> set[str]:
        """Every ``--flag`` the command line accepts, without the dashes (``no_*`` switches included)."""
        return {
            s[2:].replace("-", "_")
            for action in self._actions
            for s in action.option_strings
            if s[:2] == "--"
        }


def _closest(key: str, known: set[str]) -> str:
    match = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else "; see --help for the keys"


def _read_config(path: str) -> dict[str, Any]:
    if not Path(path).is_file():
        raise UsageError(f"--config: no such file {path}")
    try:
        with open(path) as handle:  # a stream, so YAML's errors name the file
            config = yaml.safe_load(handle)
    except yaml.YAMLError as err:
        raise UsageError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: a recipe is a YAML mapping of keys to values")
    return config


def _batch_message(message: str, where: str, set_keys: set[str]) -> str | None:
    """TRL's divisibility error, rephrased with the keys the user can change."""
    found = re.search(
        r"generation_batch_size \((\d+)\) must be divisible by num_generations \((\d+)\)", message
    )
    if not found:
        return None
    completions, generations = found.groups()
    source = (
        "generation_batch_size"
        if "generation_batch_size" in set_keys
        else "per_device_train_batch_size × processes × steps_per_generation "
        "(default: gradient_accumulation_steps)"
    )
    return (
        f"{where}: num_generations ({generations}) must divide the completions per round, {source} = "
        f"{completions}; change num_generations, per_device_train_batch_size or steps_per_generation "
        "(check with --dry_run)"
    )


def parse_recipe(parser: RecipeParser, args: list[str]) -> tuple[Any, ...]:
    """Parse ``--config FILE`` and command-line overrides into the parser's dataclasses.

    Raises:
        UsageError: a key no dataclass has (with the closest one), a value that does not convert, a batch
            that does not split into whole groups; the message names the file or the command line.
    """
    args = list(args)
    known = parser.option_names()
    config_path = args[args.index("--config") + 1] if "--config" in args[:-1] else None
    config = _read_config(config_path) if config_path else {}
    for key in config:
        if key != "env" and key not in known:
            raise UsageError(f"{config_path}: unknown key {key!r}{_closest(key, known)}")
    cli_keys, flags = set(), parser.flag_names()
    for token in args:
        if token.startswith("--") and token != "--config":
            key = token[2:].split("=", 1)[0].replace("-", "_")
            if key not in flags:
                raise UsageError(f"command line: unknown option --{key}{_closest(key, flags)}")
            cli_keys.add(key)
    parser._config_path, parser._cli_keys = config_path, cli_keys
    try:
        return parser.parse_args_and_config(args)
    except ValueError as err:
        if isinstance(err, UsageError):
            raise
        where = config_path or "command line"
        message = str(err)
        raise UsageError(
            _batch_message(message, where, set(config) | cli_keys) or f"{where}: {message}"
        ) from None


# ---------------------------------------------------------------------------------------------
# The output folder.

# A folder holding any of these holds a run.
_RUN_FILES = (
    "trainer_state.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
    "adapter_model.safetensors", "train_results.json", "all_results.json", "logs.jsonl",
)  # fmt: skip
_RUN_DIRS = ("completions",)
# Also deleted on overwrite: what the end of a run writes beside the weights.
_RUN_EXTRAS = (
    "README.md", "config.json", "generation_config.json", "training_args.bin", "adapter_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json",
    "merges.txt", "added_tokens.json", "eval", "eval-templates", "runs",
)  # fmt: skip


def run_artifacts(output_dir: str | Path) -> list[Path]:
    """What in ``output_dir`` belongs to an earlier run: checkpoints, weights, trainer state, completions."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = sorted(p for p in folder.glob("checkpoint-*") if p.is_dir())
    found += [folder / n for n in _RUN_FILES if (folder / n).is_file()]
    found += [folder / n for n in _RUN_DIRS if (folder / n).is_dir()]
    found += sorted(folder.glob("model-*-of-*.safetensors"))
    return found


def check_output_dir(output_dir: str | Path, resume: bool, overwrite: bool) -> list[Path]:
    """What to delete before training into ``output_dir`` (empty: nothing); refuse to mix two runs.

    Raises:
        UsageError: the folder holds a run and neither resuming nor overwriting was asked for, or both were.
    """
    found = run_artifacts(output_dir)
    if resume and overwrite:
        raise UsageError(
            "--resume_from_checkpoint and --overwrite_output_dir true exclude each other; pick one"
        )
    if not found or resume:
        return []
    if not overwrite:
        names = ", ".join(p.name for p in found[:6]) + (", ..." if len(found) > 6 else "")
        raise UsageError(
            f"output_dir {output_dir} already holds a run ({names}). To continue it, add "
            "--resume_from_checkpoint true; to replace it, add --overwrite_output_dir true (deletes its "
            "checkpoints, model and completions); or choose another --output_dir."
        )
    extras = [Path(output_dir) / n for n in _RUN_EXTRAS if (Path(output_dir) / n).exists()]
    return found + extras


def clear_run(paths: list[Path]) -> None:
    """Delete an earlier run's files and folders (the list `check_output_dir` returned)."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
