"""A recipe's ``dataset_mixture``: TRL's `DatasetMixtureConfig` of `MixtureSource`, each source mapped onto
question / answer / uid as ``dataset_name`` is (`prompt_aug.sources.read_training_data` reads it,
`prompt_aug.data.mix_sources` maps it)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Any

from trl import DatasetMixtureConfig
from trl.scripts.utils import DatasetConfig


@dataclass
class MixtureSource(DatasetConfig):
    """One source of a ``dataset_mixture``: TRL's `DatasetConfig` (``path``, ``name``, ``data_dir``,
    ``data_files``, ``split``, ``columns``, ``fraction``) and the column mapping of ``dataset_name``
    (``None``: the top-level key's value, else guessed)."""

    question_column: str | None = None
    answer_column: str | None = None
    dataset_levels: list[str] | None = None


def dataset_mixture(value: Any) -> DatasetMixtureConfig:
    """The recipe's ``dataset_mixture`` mapping as TRL's `DatasetMixtureConfig` of `MixtureSource`; a key
    neither has, a ``fraction`` that is no share (not a number >= 0, or all 0), or what the package cannot
    train on (streaming, a test split), fails in one line. A `DatasetMixtureConfig` built in code is checked
    the same way, its TRL `DatasetConfig` sources made `MixtureSource`."""
    if isinstance(value, DatasetMixtureConfig):  # each field as a recipe would give it
        value = {f.name: getattr(value, f.name) for f in fields(value)}
        value["datasets"] = [
            {f.name: getattr(d, f.name) for f in fields(d)} if isinstance(d, DatasetConfig) else d
            for d in value["datasets"] or []
        ]
    where = "dataset_mixture"
    if not isinstance(value, dict):  # a recipe value: a ValueError, reported in one line by the parser
        raise ValueError(f"{where}: a mapping with `datasets: [...]`, got {type(value).__name__}")  # noqa: TRY004
    known = {f.name for f in fields(DatasetMixtureConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; it takes {sorted(known)}")
    if value.get("streaming"):
        raise ValueError(
            f"{where}.streaming: not supported (the trainer's sampler needs the row count); remove it"
        )
    if value.get("test_split_size") is not None:
        raise ValueError(
            f"{where}.test_split_size: prompt-aug-train has no held-out split; remove it and give held-out "
            "questions to eval_benchmarks as a file"
        )
    entries = value.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{where}.datasets: a non-empty list of sources, each with a `path`")
    keys = {f.name for f in fields(MixtureSource)}
    sources = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "path" not in entry:
            raise ValueError(
                f"{where}.datasets[{i}]: a mapping with a `path` ({sorted(keys)}), got {entry!r}"
            )
        unknown = sorted(set(entry) - keys)
        if unknown:
            raise ValueError(
                f"{where}.datasets[{i}]: unknown key(s) {unknown}; a source takes {sorted(keys)}"
            )
        _check_types(entry, f"{where}.datasets[{i}]")
        levels = entry.get("dataset_levels")
        if levels is not None:  # as the top-level key: one value is a list of one, numbers match str(level)
            levels = levels if isinstance(levels, list) else [levels]
            entry = {**entry, "dataset_levels": [str(level) for level in levels]}
        sources.append(MixtureSource(**entry))
    fractions = [s.fraction for s in sources]
    if None in fractions and any(f is not None for f in fractions):
        raise ValueError(f"{where}: `fraction` must be set for every source or for none")
    for i, fraction in enumerate(fractions):
        if fraction is not None and not _share(fraction):
            raise ValueError(
                f"{where}.datasets[{i}].fraction: a share of the mixture is a number >= 0, got {fraction!r}; "
                "write a plain number (unquoted in YAML)"
            )
    if fractions[0] is not None and not sum(fractions) > 0:
        raise ValueError(
            f"{where}.datasets: every source's fraction is 0; give at least one source a share above 0"
        )
    return DatasetMixtureConfig(datasets=sources)


_TEXT = ("name", "data_dir", "split", "question_column", "answer_column")  # a source's keys that take text


def _check_types(entry: dict[str, Any], where: str) -> None:
    """A source's keys of the wrong shape (a list for a path, a number for a column), which TRL would pass on
    as they are to fail deep in `datasets`, or take silently (``columns: question``: its letters)."""
    path = entry["path"]
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}.path: text (a path or a Hub id), got {path!r}; give one source per entry")
    for key in _TEXT:
        value = entry.get(key)
        if value is not None and not isinstance(value, str):
            quote = "; quote it in YAML" if isinstance(value, (int, float)) else ""
            raise ValueError(f"{where}.{key}: text, got {value!r}{quote}")
    columns = entry.get("columns")
    if columns is not None and not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)):
        raise ValueError(f"{where}.columns: a list of column names, e.g. [question, answer], got {columns!r}")
    files = entry.get("data_files")
    if files is not None and not isinstance(files, (str, list, dict)):
        raise ValueError(
            f"{where}.data_files: a file, a list of files or a split -> files mapping, got {files!r}"
        )
    levels = entry.get("dataset_levels")
    if isinstance(levels, dict) or (
        isinstance(levels, list) and any(isinstance(v, (list, dict)) for v in levels)
    ):
        raise ValueError(
            f"{where}.dataset_levels: a list of `level` values, e.g. [Level 4, Level 5], got {levels!r}"
        )


def _share(value: Any) -> bool:
    """Whether ``value`` is a finite number >= 0 (text and booleans are not)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
