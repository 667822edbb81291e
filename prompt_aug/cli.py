"""What ``prompt-aug-train`` checks before anything heavy loads: the recipe and the output folder.

* `parse_recipe`: a misspelled key, a value of the wrong type or an impossible batch gives one line that
  names the key, the file (or the command line) and what to change, instead of a traceback or argparse's
  full usage text.
* `prepare_output_dir`: a folder that already holds a run is refused unless the run is resumed from a
  checkpoint in it (``--resume_from_checkpoint``) or replaced (``--overwrite_output_dir true``, which deletes
  the old run's checkpoints, weights, logs and completions once the rest of the run is checked and the
  trainer built, so the folder never mixes two runs and a bad value loses nothing: `clear_earlier_run`). A
  resume from an earlier checkpoint than the folder's last is refused while the later ones are there.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import json
import logging
import os
import re
import shutil
import sys
import types
import typing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from accelerate import PartialState
from accelerate.utils import str_to_bool
from trl import TrlParser

from .adapters import ADAPTER_FILE
from .faults import (
    COLLAPSE_PREFIX,
    COLLAPSE_STOP_FILE,
    PREEMPTED_FILE,
    FaultError,
    check_resume,
    checkpoint_step,
    is_inside,
    last_complete_checkpoint,
)
from .logging_utils import check_log_file
from .model_card import OVERRIDES_LINE, readme_owner, recorded_overrides, without_hub_tokens
from .records import LogFileError
from .reward_checks import RewardFunctionError
from .sources import (
    LOCAL_MODELS,
    SourceError,
    check_mixture,
    check_source,
    file_in_the_way,
    resolve_local_model,
)

logger = logging.getLogger("prompt_aug")


class UsageError(ValueError):
    """Bad input from the user; the message names the culprit and says what to do."""


# What a user sees for these instead of a traceback (the entry point turns them into one line).
USER_ERRORS = (UsageError, SourceError, FaultError, LogFileError, RewardFunctionError)


class RecipeParser(TrlParser):
    """`TrlParser` whose errors are one line naming the key and where it was set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config_path: str | None = None
        self._cli_keys: set[str] = set()
        self._field_types = {
            name: kind
            for dtype in self.dataclass_types
            for name, kind in typing.get_type_hints(dtype).items()
        }
        # The keys a command-line null unsets: those that default to None or whose type admits it.
        self._nullable = {
            f.name
            for dtype in self.dataclass_types
            for f in dataclasses.fields(dtype)
            if f.default is None or _admits(self._field_types.get(f.name, Any), type(None))
        }

    def error(self, message: str) -> None:  # argparse calls this for a bad value; it would print the usage
        found = re.match(r"argument --([\w-]+)(?:/--[\w-]+)*: (.*)", message, re.DOTALL)
        key, problem = (found.group(1).replace("-", "_"), found.group(2)) if found else (None, message)
        where = "command line" if key in self._cli_keys or not self._config_path else self._config_path
        raise UsageError(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")

    # Why: TRL sets a recipe's values as the parser's defaults, and argparse converts a default only when it
    # is text. A list key given one value (``reward_funcs: correctness``) reached the config as a string,
    # later read letter by letter (the command line makes it a list of one), and list items kept YAML's
    # types (``dataset_levels: [3, 4]``: numbers). A one-value key given a list, a mapping, nothing
    # (``key:``) or a boolean for a number reached TRL's checks as it was: a traceback, or silently taken.
    def set_defaults_with_config(self, **kwargs: Any) -> list[str]:
        where = self._config_path or "recipe"
        for action in self._actions:
            if action.dest not in kwargs:
                continue
            if action.nargs in ("+", "*"):
                if kwargs[action.dest] is not None:
                    kwargs[action.dest] = _list_value(action, kwargs[action.dest], where)
            elif action.type is not None:  # not a ``--no_*`` switch, which shares its key's dest
                kind = self._field_types.get(action.dest, Any)
                kwargs[action.dest] = _scalar_value(action, kwargs[action.dest], kind, where)
        return super().set_defaults_with_config(**kwargs)

    # Why: argparse hands a command-line word to a key as text; here a null word (`NULL_WORDS`) unsets a key
    # that may be None instead (``--question_column null``; ``--dataset_name null`` beside --dataset_mixture),
    # and is refused by name for a key that may not. argparse converts the command line's words here, and
    # never a recipe's values, so a recipe's quoted "null" stays text, and a key's last word still wins.
    # report_to takes none as a value of its own, and None would fail as an integration's name.
    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        if len(arg_strings) == 1 and action.option_strings and is_null_word(arg_strings[0]):
            word, key = arg_strings[0], action.dest
            if key not in self._nullable or key in _NONE_IS_A_VALUE:
                if word.strip().lower() == "none":  # a value of its own for some keys (scale_rewards: none)
                    return super()._get_values(action, arg_strings)
                raise UsageError(
                    f"command line: {key}: {word} would unset it, but {key} always takes a value (here "
                    f"{self.get_default(key)!r}); give one, or leave --{key} out"
                )
            if not _none_is_its_value(action, word):
                return None
        return super()._get_values(action, arg_strings)

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


# The words that unset a key on the command line: YAML's nulls, and Python's None (as TRL's parser reads it
# for a number); any case.
NULL_WORDS = ("null", "~", "none")
# Keys that take the word none as a value of their own: transformers reads report_to none as no integration.
_NONE_IS_A_VALUE = ("report_to",)


def is_null_word(word: Any) -> bool:
    """Whether a command-line word unsets its key (`NULL_WORDS`, any case).

    >>> is_null_word("NULL"), is_null_word("~"), is_null_word("None"), is_null_word("nil")
    (True, True, True, False)
    """
    return isinstance(word, str) and word.strip().lower() in NULL_WORDS


def _none_is_its_value(action: argparse.Action, word: str) -> bool:
    """Whether ``word`` (none, in any case) is one of the choices of ``action``'s key rather than its unset
    (the keys of `_NONE_IS_A_VALUE` keep it before this is asked)."""
    return word.strip().lower() == "none" and "none" in [str(c).lower() for c in action.choices or ()]


def _admits(kind: Any, cls: type) -> bool:
    """Whether the field type ``kind`` (``int | None``, ``dict | str``, ...) takes values of ``cls``."""
    options = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
    return kind is Any or any(o is cls or typing.get_origin(o) is cls for o in options)


def _scalar_value(action: argparse.Action, value: Any, kind: Any, where: str) -> Any:
    """A recipe's value for a one-value key, checked as the command line would check its text: a list or a
    mapping is not one value, ``key:`` with nothing after it is no value (unless the key takes null), a
    boolean is not a number, a number with a point is an int only when whole (``8.0``: 8), and a key with
    choices (``dtype``) takes one of them.

    >>> import argparse
    >>> steps = argparse.Action(["--max_steps"], "max_steps", type=int, default=-1)
    >>> _scalar_value(steps, 8.0, int, "r.yaml")
    8
    """
    key = action.dest
    if value is None:
        if action.default is not None and not _admits(kind, type(None)):
            raise UsageError(f"{where}: {key}: no value; give one, or remove the line")
        return value
    if _admits(kind, dict) or _admits(kind, list):
        return value  # a key that takes a mapping or a list as well (``model_init_kwargs``, ``report_to``)
    if isinstance(value, (list, dict)):
        shape = "a list" if isinstance(value, list) else "a mapping"
        raise UsageError(f"{where}: {key}: one value, got {shape} {value!r}")
    number = getattr(action.type, "__name__", None)  # TRL wraps an optional key's type, keeping its name
    if number in ("int", "float") and (
        isinstance(value, bool) or (number == "int" and isinstance(value, float) and not value.is_integer())
    ):
        raise UsageError(f"{where}: {key}: {value!r} is not a{'n' if number == 'int' else ''} {number}")
    allowed = action.choices  # argparse checks a command-line word against them, never a recipe's value
    if allowed is not None and (action.type(value) if isinstance(value, str) else value) not in allowed:
        choices = ", ".join(map(repr, allowed))
        boolean = isinstance(value, bool)
        hint = "; YAML reads an unquoted no, yes, on or off as a boolean: quote it" if boolean else ""
        raise UsageError(f"{where}: {key}: invalid choice: {value!r} (choose from {choices}){hint}")
    return int(value) if number == "int" and isinstance(value, float) else value


def _list_value(action: argparse.Action, value: Any, where: str) -> list:
    """A recipe's value for a list key as the command line gives it: one value is a list of one, and each item
    is converted by the key's type, as on the command line (text, numbers, an option's names).

    >>> import argparse
    >>> levels = argparse.Action(["--levels"], "levels", nargs="+", type=str)
    >>> _list_value(levels, [3, 4], "r.yaml"), _list_value(levels, "Level 5", "r.yaml")
    (['3', '4'], ['Level 5'])
    """
    key, items = action.dest, value if isinstance(value, list) else [value]
    kind = action.type
    if kind is None:
        return items
    converted = []
    for item in items:
        try:
            if isinstance(item, (bool, list, dict)) or (
                kind is str and not isinstance(item, (str, int, float))
            ):
                raise ValueError  # str(), int() and float() would take these, argparse never sees them
            converted.append(kind(item))
        except (TypeError, ValueError):
            name = getattr(kind, "__name__", repr(kind))
            raise UsageError(f"{where}: {key}: item {item!r} is not a {name}") from None
    return converted


# A dry run only prints arithmetic, so it parses as if on CPU: `TrainingArguments` rejects `bf16: true` at
# parse time on a machine without a bf16 GPU unless `use_cpu` is set. The real run never gets this override.
DRY_RUN_OVERRIDES = ("--use_cpu", "true")


def command_line_flags(argv: list[str]) -> list[tuple[str, str, int, int]]:
    """Each ``--key`` on a command line as ``(key, value, start, stop)``, ``argv[start:stop]`` being its
    words. ``--key v``, ``--key=v`` and a bare ``--key`` (value ``"true"``) are read; dashes in a key
    read as underscores, as the parser takes them.

    >>> command_line_flags(["--dry-run", "--max_steps=2", "--seed", "3"])
    [('dry_run', 'true', 0, 1), ('max_steps', '2', 1, 2), ('seed', '3', 2, 4)]
    """
    found, i = [], 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("--") or len(word) == 2:
            i += 1
            continue
        name, equals, value = word[2:].partition("=")
        key = name.replace("-", "_")
        if equals:
            found.append((key, value, i, i + 1))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            found.append((key, argv[i + 1], i, i + 2))
        else:
            found.append((key, "true", i, i + 1))
        i = found[-1][3]
    return found


def command_line_keys(argv: list[str]) -> list[str]:
    """The keys a command line sets beside its recipe (``--config``), once each, in their order; none without
    a recipe.

    >>> command_line_keys(["--config=r.yaml", "--max-steps", "2", "--learning_rate=1e-5", "--max_steps", "3"])
    ['max_steps', 'learning_rate']
    """
    args, config_path = config_args(argv)
    keys = [key for key, _, _, _ in command_line_flags(args) if key != "config"]
    return list(dict.fromkeys(keys)) if config_path else []


def setting(argv: list[str], key: str) -> Any:
    """``key``'s value as the command line gives it (the last one wins; a null word, `is_null_word`, is
    None), else as the recipe file (``--config``) gives it; ``None`` when unset or unreadable (the parser
    then says why). Read before the recipe is parsed, to choose how to parse it.

    >>> setting(["--config", "missing.yaml", "--dry-run"], "dry_run"), setting([], "seed")
    ('true', None)
    >>> setting(["--config", "missing.yaml", "--deepspeed", "null"], "deepspeed")
    """
    flags = command_line_flags(argv)
    given = [value for name, value, _, _ in flags if name == key]
    config = [value for name, value, _, _ in flags if name == "config"]
    if given or not config:
        return given[-1] if given and not is_null_word(given[-1]) else None
    try:
        recipe = yaml.safe_load(Path(config[-1]).read_text())
    except (OSError, yaml.YAMLError):
        return None  # the parser names the file and the error
    return recipe.get(key) if isinstance(recipe, dict) else None


def is_true(value: Any) -> bool:
    """Whether a setting read by `setting` (a YAML value, a command-line word) or an environment variable
    means true, as the parser and accelerate read them (``on`` too, and a YAML number by its truth); a word
    neither reads counts as false here, and the parser then says why.

    >>> is_true("True"), is_true(True), is_true(1), is_true("on")
    (True, True, True, True)
    >>> is_true("0"), is_true("maybe"), is_true(None)
    (False, False, False)
    """
    if isinstance(value, (bool, int, float)):
        return bool(value)
    try:
        return isinstance(value, str) and str_to_bool(value.strip(), to_bool=True)
    except ValueError:
        return False


def wants_dry_run(argv: list[str]) -> bool:
    """Whether the command line or the recipe asks for ``dry_run`` (``--dry_run``, ``--dry-run``,
    ``--dry_run true``, ``--dry_run=true``, or ``dry_run: true`` in the recipe).

    >>> wants_dry_run(["--config", "r.yaml", "--dry-run"]), wants_dry_run(["--dry_run", "false"])
    (True, False)
    """
    return is_true(setting(argv, "dry_run"))


def dry_run_processes(argv: list[str]) -> int | None:
    """The process count a dry run plans for: ``--num_processes N`` on the command line, else the recipe
    file's ``num_processes``, else the launch's ``WORLD_SIZE``, else None (one process).

    >>> dry_run_processes(["--dry_run", "--num_processes", "16"]), dry_run_processes(["--num_processes=4"])
    (16, 4)
    """
    found = setting(argv, "num_processes")
    value = str(found) if found is not None else os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else None  # a bad value: parse_recipe says so


def config_args(args: list[str]) -> tuple[list[str], str | None]:
    """``args`` with ``--config=PATH`` written as ``--config PATH`` (the parser reads that form only), and the
    recipe's path (None: no ``--config``).

    Raises:
        UsageError: ``--config`` without a path after it, or given twice.

    >>> config_args(["--config=r.yaml", "--max_steps", "2"])
    (['--config', 'r.yaml', '--max_steps', '2'], 'r.yaml')
    """
    spread = []
    for arg in args:
        spread += ["--config", arg.split("=", 1)[1]] if arg.startswith("--config=") else [arg]
    at = [i for i, arg in enumerate(spread) if arg == "--config"]
    paths = [spread[i + 1] for i in at if i + 1 < len(spread) and spread[i + 1][:2] not in ("", "--")]
    if len(paths) < len(at):
        raise UsageError("--config: give the recipe's path, as --config RECIPE.yaml")
    if len(paths) > 1:
        raise UsageError(f"--config is given twice ({', '.join(paths)}); give one recipe")
    return spread, (paths[0] if paths else None)


# Keys of recipes written for other stacks (verl, OpenRLHF, open-r1, older TRL) or for generation, under the
# name this one gives them: (new name, whose rename). Their closest spelling here often means something else.
RENAMED_KEYS = {
    "torch_dtype": ("dtype", "in this transformers and TRL"),
    "dataset_prompt_column": ("question_column", "here (open-r1 calls it dataset_prompt_column)"),
    "dataset_train_split": ("dataset_split", "here (TRL's scripts call it dataset_train_split)"),
    "model": ("model_name_or_path", "here, as in TRL's ModelConfig"),
    "dataset": ("dataset_name", "here, as in TRL's scripts"),
    "lr": ("learning_rate", "here"),
    "epochs": ("num_train_epochs", "here"),
    "num_epochs": ("num_train_epochs", "here"),
    "total_epochs": ("num_train_epochs", "here (verl calls it total_epochs)"),
    "max_response_length": ("max_completion_length", "here (verl calls it max_response_length)"),
    "max_new_tokens": ("max_completion_length", "here (generation calls it max_new_tokens)"),
    "rollout_n": ("num_generations", "here: completions per question (verl's rollout.n)"),
    "n_samples_per_prompt": ("num_generations", "here (OpenRLHF calls it n_samples_per_prompt)"),
    "kl_coef": ("beta", "here: the KL penalty's coefficient"),
    "kl_loss_coef": ("beta", "here (verl calls it kl_loss_coef)"),
    "lora_rank": ("lora_r", "here (verl and OpenRLHF call it lora_rank)"),
    "use_lora": ("use_peft", "here, as in TRL's ModelConfig"),
    "train_batch_size": (
        "generation_batch_size",
        "here: completions a round; verl's train_batch_size counts questions (--dry_run shows both)",
    ),
}

# Keys of open-r1's recipes that W&B reads from the environment here (open-r1 sets these variables from them).
ENVIRONMENT_KEYS = {
    "wandb_project": "WANDB_PROJECT",
    "wandb_entity": "WANDB_ENTITY",
    "wandb_run_group": "WANDB_RUN_GROUP",
}


def _closest(key: str, known: set[str]) -> str:
    """What to write instead of the unknown ``key``: its new name if it is a known rename, else the closest
    known key.

    >>> _closest("torch_dtype", {"dtype", "torch_compile"})
    "; 'torch_dtype' is 'dtype' in this transformers and TRL"
    >>> _closest("wandb_project", {"project"})
    '; W&B reads it from the environment here: export WANDB_PROJECT=... before launching'

    """
    if key in ENVIRONMENT_KEYS:
        return (
            f"; W&B reads it from the environment here: export {ENVIRONMENT_KEYS[key]}=... before launching"
        )
    renamed = RENAMED_KEYS.get(key)
    if renamed and renamed[0] in known:
        return f"; {key!r} is {renamed[0]!r} {renamed[1]}"
    match = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else "; see --help for the keys"


class _KeysTwiceLoader(yaml.SafeLoader):
    """YAML's safe loader, noting each key given twice in a mapping (YAML keeps the last one, silently)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.twice: list[str] = []
        self._read: set[int] = set()  # the mapping nodes checked, before YAML merged ``<<`` keys into them

    # Why: YAML's loader folds a ``<<: *base`` mapping's keys into the node itself (here, for every mapping,
    # nested ones first), so a node is read for keys given twice once, as written, before that.
    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        if id(node) not in self._read:
            self._read.add(id(node))
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: its keys may be overridden
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    if key in lines:
                        self.twice.append(f"{key} is set twice (lines {lines[key]} and {line})")
                    lines[key] = line
                except TypeError:  # an unhashable key: construction refuses it with YAML's own error
                    pass
        super().flatten_mapping(node)


def _read_config(path: str) -> dict[str, Any]:
    """The recipe's mapping; a key given twice warns, naming both lines (the later one counts, as in YAML;
    appending overrides to a copy of a recipe is common enough not to refuse it)."""
    if Path(path).is_dir():
        raise UsageError(f"--config: {path} is a folder; give the recipe file in it")
    if not Path(path).is_file():
        raise UsageError(f"--config: no such file {path}")
    try:
        with open(path) as handle:  # a stream, so YAML's errors name the file
            loader = _KeysTwiceLoader(handle)
            try:
                config = loader.get_single_data()
            finally:
                loader.dispose()
    except yaml.YAMLError as err:
        raise UsageError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    for twice in loader.twice:
        warnings.warn(f"{path}: {twice}; the later one counts, remove the other", UserWarning, stacklevel=3)
    if not isinstance(config, dict):
        raise UsageError(f"{path}: a recipe is a YAML mapping of keys to values")
    return config


def read_recipe(path: str, known: set[str]) -> dict[str, Any]:
    """The recipe file's mapping, as training reads it: one line for a missing file, invalid YAML or a key
    not in ``known`` (with its new name or the closest key).

    Raises:
        UsageError: the file and what is wrong with it.
    """
    config = _read_config(path)
    for key in config:
        if key != "env" and key not in known:
            raise UsageError(f"{path}: unknown key {key!r}{_closest(key, known)}")
    return config


def _batch_message(message: str, set_keys: set[str]) -> str | None:
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
        f"num_generations ({generations}) must divide the completions per round, {source} = "
        f"{completions}; change num_generations, per_device_train_batch_size or steps_per_generation "
        "(check with --dry_run)"
    )


def _where(message: str, config_path: str | None, config_keys: set[str], cli_keys: set[str]) -> str:
    """Where the keys an error names were set: the recipe file, the command line (overriding the file, where
    it sets them too), or both (a ``--flag`` the message suggests is no key it names)."""
    if not config_path:
        return "command line"
    named = {k for k in config_keys | cli_keys if re.search(rf"(?<![\w.-]){re.escape(k)}\b", message)}
    from_cli = sorted(named & cli_keys)
    flags = " ".join(f"--{k}" for k in from_cli)
    if not from_cli:
        return config_path
    if not named <= cli_keys:
        return f"{config_path} and command line {flags}"
    return f"command line {flags}, overriding {config_path}" if named & config_keys else "command line"


def parse_recipe(
    parser: RecipeParser, args: list[str], check: Callable[..., None] | None = None
) -> tuple[Any, ...]:
    """Parse ``--config FILE`` and command-line overrides into the parser's dataclasses; ``check``, given
    them, raises a `ValueError` naming a key for what no one dataclass's `__post_init__` can check.

    Raises:
        UsageError: no ``--config`` and no flag either, a key no dataclass has (with its new name
            or the closest one), a word on the command line that no option takes, a value that does not
            convert, a batch
            that does not split into whole groups, a key's `__post_init__` check or ``check``; the message
            names the file or the command line.
    """
    args, config_path = config_args(list(args))
    if config_path is None and not args:  # a run given by flags alone, as TRL's scripts take it, stays
        raise UsageError("no recipe: give one with --config RECIPE.yaml (recipes/ has examples)")
    config = read_recipe(config_path, parser.option_names()) if config_path else {}
    cli_keys, flags = set(), parser.flag_names()
    for token in args:
        if token.startswith("--") and token != "--config":
            key = token[2:].split("=", 1)[0].replace("-", "_")
            if key not in flags:
                raise UsageError(f"command line: unknown option --{key}{_closest(key, flags)}")
            cli_keys.add(key)
    parser._config_path, parser._cli_keys = config_path, cli_keys
    try:
        parsed = parser.parse_args_and_config(args)
        if check is not None:
            check(*parsed)
        return parsed
    except ValueError as err:
        if isinstance(err, UsageError):
            raise
        stray = re.match(r"Some specified arguments are not used by the HfArgumentParser: (\[.*\])", str(err))
        if stray:  # words on the command line that no --key takes
            words = ast.literal_eval(stray.group(1))
            raise UsageError(
                f"command line: {', '.join(map(repr, words))} "
                f"{'belongs' if len(words) == 1 else 'belong'} to no option; give keys as --key value"
            ) from None
        message = _batch_message(str(err), set(config) | cli_keys) or str(err)
        raise UsageError(f"{_where(message, config_path, set(config), cli_keys)}: {message}") from None


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
    "merges.txt", "added_tokens.json", "eval", "eval-templates", "runs", PREEMPTED_FILE,
    COLLAPSE_STOP_FILE,
    "before_after.md", "before_after.json", "heldout.jsonl",  # the learning demo's (before_after: true)
)  # fmt: skip


def run_artifacts(output_dir: str | Path) -> list[Path]:
    """What in ``output_dir`` belongs to an earlier run: checkpoints, weights, trainer state, completions."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = sorted(p for p in folder.glob("checkpoint-*") if p.is_dir())
    found += sorted(p for p in folder.glob(f"{COLLAPSE_PREFIX}-*") if p.is_dir())
    found += [folder / n for n in _RUN_FILES if (folder / n).is_file()]
    # TRL makes completions/ when the trainer is built: empty, a run that failed before its first round.
    found += [folder / n for n in _RUN_DIRS if (folder / n).is_dir() and any((folder / n).iterdir())]
    found += sorted(folder.glob("model-*-of-*.safetensors"))
    return found


def check_output_dir(
    output_dir: str | Path, resume: bool, overwrite: bool, warm_start: str | None = None
) -> list[Path]:
    """What to delete before training into ``output_dir`` (empty: nothing); refuse to mix two runs.
    ``resume``: the run in ``output_dir`` is resumed; ``warm_start``: a checkpoint outside it that the run
    starts from, which does not continue the folder's run.

    Raises:
        UsageError: ``output_dir`` (or a folder above it) is a file; the folder holds a run and neither
            resuming nor overwriting was asked for, or both were.
    """
    file = file_in_the_way(output_dir)
    if file is not None:  # the trainer would fail to make the folder once the model has loaded
        where = "is a file" if file == Path(output_dir) else f"lies under {file}, a file"
        raise UsageError(f"output_dir {output_dir} {where}, not a folder; choose another --output_dir")
    found = run_artifacts(output_dir)
    readme = Path(output_dir) / "README.md"
    owned = readme_owner(readme)  # the user's own: no model card, or a card edited by hand
    if owned and not resume and PartialState().is_main_process:  # kept (`keep_own_readme`), not lost
        logger.warning("%s %s: training moves it to _README.md to write the card there", readme, owned)
    if resume and overwrite:
        raise UsageError(
            "--resume_from_checkpoint and --overwrite_output_dir true exclude each other; pick one"
        )
    if not found or resume:
        return []
    names = ", ".join(p.name for p in found[:6]) + (", ..." if len(found) > 6 else "")
    if warm_start and not overwrite:
        # The two runs' checkpoints would mix, and save_total_limit would delete the other run's.
        raise UsageError(
            f"output_dir {output_dir} already holds a run ({names}), and resume_from_checkpoint {warm_start} "
            "lies outside it; to start from that checkpoint here, add --overwrite_output_dir true (deletes "
            "the folder's run), or choose another --output_dir."
        )
    if not overwrite:
        raise UsageError(
            f"output_dir {output_dir} already holds a run ({names}). To continue it, add "
            "--resume_from_checkpoint true; to replace it, add --overwrite_output_dir true (deletes its "
            "checkpoints, model and completions); or choose another --output_dir."
        )
    extras = [Path(output_dir) / n for n in _RUN_EXTRAS if (Path(output_dir) / n).exists()]
    return found + [p for p in extras if not (owned and p == readme)]


def clear_run(paths: list[Path]) -> None:
    """Delete an earlier run's files and folders (the list `check_output_dir` returned); ``completions/`` is
    emptied, not removed: the trainer makes it when built, and writes into it without making it again."""
    for path in paths:
        emptied = path.is_dir() and path.name in _RUN_DIRS
        for item in list(path.iterdir()) if emptied else [path]:
            if item.is_dir():
                shutil.rmtree(item)
            else:
                item.unlink(missing_ok=True)


def clear_earlier_run(stale: list[Path], output_dir: str, state: PartialState) -> None:
    """Delete the earlier run `prepare_output_dir` found in ``output_dir`` (``overwrite_output_dir``): called
    once every check has passed and the trainer is built, so a bad value leaves that run as it was. The main
    process deletes, once every process is there."""
    state.wait_for_everyone()
    if stale and state.is_main_process:
        logger.info("overwrite_output_dir: deleting the earlier run in %s", output_dir)
        clear_run(stale)
    state.wait_for_everyone()


def check_reward_weights(weights: list[float] | None, names: list[str]) -> None:
    """One ``reward_weights`` entry per ``reward_funcs`` entry, in their order (TRL checks it only once the
    model has loaded).

    Raises:
        UsageError: one line with both lists.
    """
    if weights is not None and len(weights) != len(names):
        raise UsageError(
            f"reward_weights: {len(weights)} weights {list(weights)} for {len(names)} reward_funcs {names}; "
            "give one weight per reward function, in their order, or leave reward_weights out (all 1)"
        )


def check_resume_peft(checkpoint: str, model_args: Any) -> None:
    """A checkpoint resumes only under the recipe's own PEFT settings: full weights without ``use_peft``, a
    LoRA adapter with it and with the ``lora_target_modules`` (where the recipe names them), ``lora_r``,
    ``lora_alpha``, ``use_rslora``, ``use_dora`` and ``lora_modules_to_save`` it was trained with.
    Otherwise the Trainer fails deep in loading weights or the optimizer, or silently rescales the adapter.

    Raises:
        UsageError: one line naming the checkpoint and the keys that differ.
    """
    adapter = Path(checkpoint) / ADAPTER_FILE
    if adapter.is_file() != bool(model_args.use_peft):
        held, peft = ("a LoRA adapter", "off") if adapter.is_file() else ("full weights", "on")
        raise UsageError(
            f"resume_from_checkpoint: {checkpoint} holds {held}, but use_peft is {peft}; resume with the "
            "settings the run was started with"
        )
    if not adapter.is_file():
        return
    saved = json.loads(adapter.read_text())
    saved_targets = sorted(set(saved.get("target_modules") or []))
    given = model_args.lora_target_modules  # TRL makes a list of one its item
    given = [given] if isinstance(given, str) else given
    differ = {}
    if isinstance(given, list) and "all-linear" not in given and sorted(set(given)) != saved_targets:
        differ["lora_target_modules"] = (sorted(given), saved_targets)
    # The adapter's shape (r, the extra modules trained whole) or its scale (alpha, rsLoRA, DoRA): PEFT keeps
    # the recipe's config and loads only the weights, so another scale would rescale the trained adapter.
    for key, saved_key, read in (
        ("lora_r", "r", None),
        ("lora_alpha", "lora_alpha", None),
        ("use_rslora", "use_rslora", bool),
        ("use_dora", "use_dora", bool),
        ("lora_modules_to_save", "modules_to_save", lambda v: sorted(set(v or []))),
    ):
        now, then = getattr(model_args, key), saved.get(saved_key)
        now, then = (read(now), read(then)) if read else (now, then)
        if now != then:
            differ[key] = (now, then)
    if differ:
        keys = "; ".join(f"{k} {now} (the checkpoint's: {then})" for k, (now, then) in differ.items())
        raise UsageError(
            f"resume_from_checkpoint: {checkpoint}'s adapter was trained with other LoRA settings: {keys}; "
            "resume with the settings the run was started with"
        )


def check_resume_steps(checkpoint: str, max_steps: int) -> None:
    """A checkpoint to resume must be short of ``max_steps``: one at or past it would train on past the end
    and overwrite the finished run's model and results. (``max_steps`` -1, epochs, is left to the Trainer,
    which counts the steps from the data.)

    Raises:
        UsageError: one line naming the checkpoint, its step and the key to raise.
    """
    step = checkpoint_step(checkpoint)
    if 0 < max_steps <= step:
        raise UsageError(
            f"resume_from_checkpoint: {checkpoint} is already at step {step} of max_steps {max_steps}, the "
            "run's end (its weights are there): raise max_steps (the recipe's or --max_steps) to train on"
        )


def prepare_output_dir(
    script_args: Any, args: Any, model_args: Any, state: PartialState
) -> tuple[str | None, list[Path]]:
    """Fail on a missing local path, an unreachable Hub or an output folder that holds another run. Returns
    the checkpoint to resume from, if any, and what ``overwrite_output_dir`` deletes of the earlier run,
    nothing yet (`clear_earlier_run`, once the rest of the run is checked)."""
    # A known local model not fetched yet: its fetch command.
    resolve_local_model(model_args.model_name_or_path)
    check_source("model_name_or_path", model_args.model_name_or_path, builtin=tuple(LOCAL_MODELS), model=True)
    if args.eval_data_dir:
        check_source("eval_data_dir", args.eval_data_dir)
    resume = check_resume(args.resume_from_checkpoint, args, state.num_processes, log=state.is_main_process)
    # A checkpoint outside output_dir starts a new run there (a warm start): the folder must be free.
    inside = resume is not None and is_inside(resume, args.output_dir)
    if resume is not None:
        check_resume_peft(resume, model_args)
        check_resume_steps(resume, args.max_steps)
    if inside:
        check_log_file(args.output_dir)
    warm_start = resume if resume is not None and not inside else None
    stale = check_output_dir(args.output_dir, inside, script_args.overwrite_output_dir, warm_start)
    for key, value in (
        ("model_name_or_path", model_args.model_name_or_path),
        ("dataset_name", script_args.dataset_name),
    ):
        doomed = next((p for p in stale if value and Path(value).exists() and is_inside(value, p)), None)
        if doomed is not None:  # it would be read, then deleted under the run that reads it
            raise UsageError(
                f"{key}: {value} lies in {doomed}, which --overwrite_output_dir true deletes with the "
                f"earlier run in {args.output_dir}; copy it out of that folder first, or choose another "
                "--output_dir"
            )
    if script_args.dataset_mixture is not None:
        check_mixture(script_args.dataset_mixture)
    elif script_args.dataset_name is None:
        raise UsageError(
            "dataset_name is not set: give a Hub id, a local folder or file, or a built-in set (synthetic), "
            "or several sources as dataset_mixture"
        )
    else:
        check_source("dataset_name", script_args.dataset_name)
    state.wait_for_everyone()  # every rank has looked before the main process changes the folder
    if resume and state.is_main_process:  # no longer the preempted or stopped run a script looks for
        (Path(args.output_dir) / PREEMPTED_FILE).unlink(missing_ok=True)
        (Path(args.output_dir) / COLLAPSE_STOP_FILE).unlink(missing_ok=True)
    state.wait_for_everyone()
    return resume, stale


# The value of a key ending in ``_token`` (``hub_token``; ``HF_TOKEN`` under a recipe's ``env``), as a recipe
# gives it (``key: value``) or a command line (``--key=value``, ``--key value``; dashes or underscores).
_TOKEN_KEY = r"(?<![\w-])(?:--)?[\w-]*[_-]token"
_TOKEN_VALUES = (
    re.compile(rf"(?i)({_TOKEN_KEY}[ \t]*[:=][ \t]*)(\"[^\"]*\"|'[^']*'|[^\s,}}\]#]+)"),
    re.compile(r"(?i)((?<![\w-])--[\w-]*[_-]token[ \t]+)(?!--)(\S+)"),
)


def hide_tokens(text: str) -> str:
    r"""``text`` (a recipe, a command line) with the value of each key ending in ``_token`` shown as ``***``,
    and any other Hugging Face token as ``hf_***``: the model card and the resume hint are shown and
    published, a Hub token must not be.

    >>> hide_tokens("hub_token: hf_abc  # mine\nseed: 1")
    'hub_token: ***  # mine\nseed: 1'
    >>> hide_tokens("--hub-token hf_a --seed 1 --hub_token=hf_b")
    '--hub-token *** --seed 1 --hub_token=***'
    >>> hide_tokens("hub_token: >-\n  hf_abcdef\nseed: 1")  # a value the patterns miss, as YAML reads it
    'hub_token: ***\n  ***\nseed: 1'
    >>> hide_tokens('--model_init_kwargs {"token": "hf_' + "Ab3" * 11 + 'x"}')  # a key of another name
    '--model_init_kwargs {"token": "hf_***"}'
    """
    try:  # a recipe: every value its YAML gives a token key, however it is written (a block, a tag)
        found = _token_values(yaml.safe_load(text))
    except yaml.YAMLError:
        found = set()
    for pattern in _TOKEN_VALUES:
        text = pattern.sub(r"\1***", text)
    for value in sorted(found, key=len, reverse=True):
        text = text.replace(value, "***")
    return without_hub_tokens(text)  # a token under another key (``model_init_kwargs: {token: ...}``)


def _token_values(node: Any) -> set[str]:
    """The text values (8 characters or more) of the keys ending in ``_token``, or named ``token`` (a gated
    model's, under ``model_init_kwargs``), anywhere in a parsed recipe ``node``; any case."""
    if isinstance(node, list):
        return set().union(*map(_token_values, node))
    if not isinstance(node, dict):
        return set()
    found = set()
    for key, value in node.items():
        secret = isinstance(value, str) and len(value.strip()) >= 8  # not a flag or a number shown everywhere
        if (str(key).lower().endswith("_token") or str(key).lower() == "token") and secret:
            found.add(value.strip())
        found |= _token_values(value)
    return found


# The flags that say how a run starts, which the command that resumes it replaces.
_START_FLAGS = ("resume_from_checkpoint", "overwrite_output_dir")


def interrupted_message(
    output_dir: str,
    step: int,
    max_steps: int,
    argv: list[str] | None,
    headline: str = "Interrupted",
    optimizer: bool = True,
    entropy: bool = False,
    overwrite: bool = False,
    processes: int | None = None,
) -> str:
    """Where training stopped and the command that continues it (tokens hidden, `hide_tokens`).
    ``optimizer``, ``entropy``: what the run's checkpoints hold (`prompt_aug.faults.saved_parts`);
    ``overwrite``: the run's ``overwrite_output_dir``, which the command turns off (a recipe may set it, and
    a resume refuses it); ``processes``: the run's count (default: the launcher's ``WORLD_SIZE``), so that a
    checkpoint missing a process's RNG state, which a resume skips, is not the one named."""
    args = list(argv) if argv is not None else sys.argv[1:]
    dropped = {
        i
        for key, _, start, stop in command_line_flags(args)
        if key in _START_FLAGS
        for i in range(start, stop)
    }
    kept = [word for i, word in enumerate(args) if i not in dropped]  # the resume command replaces these
    world = processes if processes is not None else int(os.environ.get("WORLD_SIZE", "1") or 1)
    last = (
        last_complete_checkpoint(output_dir, optimizer, processes=world, entropy=entropy)[0]
        if Path(output_dir).is_dir()
        else None
    )
    lines = [f"{headline} at step {step}/{max_steps}."]
    if last is None:
        lines.append(
            f"No checkpoint was saved in {output_dir} yet; start over with --overwrite_output_dir true."
        )
    else:
        # Under a launcher only the script's arguments are known here; the launch (processes, machines,
        # engine config) must be the same as the run's, or the rounds and the optimizer state differ.
        launch = "python" if world <= 1 else f"<the same launcher, on {world} processes>"
        added = [
            *(["--overwrite_output_dir", "false"] if overwrite else []),
            "--resume_from_checkpoint",
            "true",
        ]
        command = " ".join([*kept, *added])
        shown = hide_tokens(command)
        lines += [
            f"Last checkpoint: {last}. Resume with the same launch command plus {' '.join(added)}:",
            f"  {launch} -m prompt_aug.train {shown}",
        ]
        if shown != command:
            lines.append("(*** stands for the token given: put it back, or set HF_TOKEN instead.)")
    return "\n".join(lines)


def recipe_text(argv: list[str] | None, resume: str | None = None) -> str:
    """The recipe file's text, with the command-line overrides as a last comment line; tokens hidden
    (`hide_tokens`). ``resume``: the checkpoint this launch resumes, whose run trained its steps under the
    overrides of its own launches: their lines, as the card of that run records them
    (`model_card.recorded_overrides`), come first, and this launch's names the step it resumed at."""
    args, config_path = config_args(list(argv) if argv is not None else sys.argv[1:])
    text = ""
    if config_path:
        text = Path(config_path).read_text()
    overrides = [a for i, a in enumerate(args) if a != "--config" and (i == 0 or args[i - 1] != "--config")]
    lines, label = [], OVERRIDES_LINE
    if resume is not None:
        step, run = checkpoint_step(resume), Path(resume).parent
        earlier = recorded_overrides(run)
        if earlier is None:
            lines.append(f"{label} before step {step}: not known (no model card in {run})")
        else:  # a launch that resumed at this step or later trained no step this run keeps
            lines += [line for line in earlier if _resumed_at(line) < step] or [f"{label}: none"]
        label += f", resumed at step {step}"
    if overrides or resume is not None:  # a resumed launch says what it changed, none included
        lines.append(f"{label}: " + (" ".join(overrides) or "none"))
    if lines:
        text += "\n" + "\n".join(lines) + "\n"
    return hide_tokens(text)


def _resumed_at(line: str) -> int:
    """The step a launch's overrides line (`recipe_text`) says it resumed at; 0 for the run's first launch.

    >>> _resumed_at("# command-line overrides, resumed at step 200: --seed 1")
    200
    >>> _resumed_at("# command-line overrides: --seed 1")
    0
    """
    found = re.match(rf"{re.escape(OVERRIDES_LINE)}, resumed at step (\d+):", line)
    return int(found.group(1)) if found else 0
