"""Training data: load math questions with gold answers into the rows the trainer sees.

Every loader returns a `datasets.Dataset` with the columns ``question``, ``answer`` (the gold, as a
string; a list of acceptable golds, any of which counts, when the source's answer column holds lists)
and ``uid`` (stable across runs and processes). These names are the contract between data,
collator and rewards. Every other column of the source is kept under its own name, so that it reaches
every reward function as a keyword argument, as in TRL (``difficulty``, ``tests``, ...); the columns the
question, the gold and the uid are read from become ``question``, ``answer`` and ``uid``. A column whose
name the rewards already receive (`RESERVED_COLUMNS`) stops the load with one line naming it.
Supported sources:

* ``synthetic``: generated questions (the smoke recipe; no network).
* ``synthetic-addition``: the 55 one-digit sums of the learning demo (no network).
* SimpleRL-Zoo in verl layout (the paper's set), from the Hub (``hkust-nlp/SimpleRL-Zoo-Data`` with
  ``dataset_config: simplelr_qwen_level3to5``) or a local folder of its parquet files. The question
  is the user turn of ``prompt``; the gold is ``reward_model.ground_truth`` (also when only
  ``question_column`` is named).
* MATH (``DigitalLearningGmbH/MATH-lighteval``): gold read from the boxed answer of ``solution``,
  optionally filtered by ``level``.
* Anything else through a column mapping (``question_column``, ``answer_column``; ``struct.field`` names a
  field of a column of mappings). An answer cell in GSM8K's form (``... #### 72``) gives the text after its
  last line-opening ``####``, and one over several lines its last ``\\boxed{}`` (worked prose with neither is
  dropped; a short answer over several lines, a matrix, is kept).

Preview what a recipe will train on::

    python -m prompt_aug.data --dataset ../shared/data/simplerl_level3to5 [--config RECIPE.yaml]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import numbers
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import datasets

from rewards.grading.extract import number_text

from .collator import FORMAT_COLUMNS, TRL_REWARD_ARGUMENTS, image_column
from .mixture import dataset_mixture
from .sources import (
    ANSWER_GUESSES,
    FILE_BUILDERS,
    QUESTION_GUESSES,
    ReadSource,
    SourceError,
    as_stored,
    builtin_names,
    builtin_rows,
    builtin_tokenizer,
    gold_text,
    is_conversation,
    is_hub_id,
    is_verl_layout,
    json_field,
    json_mapping,
    last_user_message,
    looks_local,
    other_blocks,
    pick_column,
    question_text,
    read_dataset,
    require_hub,
    resolve_local_model,
    solution_golds,
    source_label,
    stored_value,
    verl_gold,
    worked_golds,
)
from .templates import TemplateError

MATH_HUB_ID = "DigitalLearningGmbH/MATH-lighteval"
VERL_GOLD = "reward_model.ground_truth"  # where a verl-layout row keeps its gold


class DataError(ValueError):
    """The dataset does not have what we need; the message names the column and lists those present."""


# Names a dataset column may not have, because the reward functions already receive something under them:
# ours (the row's question, gold and id, TRL's ``prompt``, which the run writes, and the template's format
# rules) and TRL's own reward-function arguments (``completion`` is a column TRL withholds from them).
_TRL_REWARD_ARGUMENTS = (*TRL_REWARD_ARGUMENTS, "completion", "environments")
RESERVED_COLUMNS: dict[str, str] = {
    "question": "the question",
    "answer": "the gold answer",
    "uid": "the row id",
    "prompt": "TRL's prompt, which this run writes",
    **dict.fromkeys(FORMAT_COLUMNS, "the format rules of the row's template"),
    **dict.fromkeys(_TRL_REWARD_ARGUMENTS, "an argument TRL passes to reward functions"),
}


def check_column_names(columns: list[str], consumed: set[str], mapping: dict[str, str]) -> None:
    """Refuse a column that would shadow what the reward functions receive under its name.

    ``consumed`` are the columns the question, gold and id are read from (they are renamed, so they shadow
    nothing); ``mapping`` names them for the message (``{"question": "problem", ...}``).

    Raises:
        DataError: one line naming the column, what it would shadow, and how to get it out of the way.
    """
    for column in columns:
        if column in consumed or column not in RESERVED_COLUMNS:
            continue
        source = f" (read from {mapping[column]!r})" if column in mapping else ""
        raise DataError(
            f"column {column!r}: reward functions already receive {RESERVED_COLUMNS[column]}{source} under "
            "that name; rename the column in the data, or leave it out (a dataset_mixture source's `columns` "
            "selects the columns kept)"
        )


def check_no_images(ds: datasets.Dataset) -> None:
    """Refuse a column TRL would read as images (`prompt_aug.collator.image_column`).

    Raises:
        DataError: one line naming the column and how to get it out of the way.
    """
    column = image_column(ds)
    if column is not None:
        raise DataError(
            f"column {column!r}: TRL reads it as the row's images, which this run's text prompts cannot "
            "carry; rename the column in the data, or leave it out (a dataset_mixture source's `columns` "
            "selects the columns kept)"
        )


# Row indices named per reason in the report and in the error of `check_bad_rows`.
SHOWN_ROWS = 5


class Drops(Counter):
    """Rows dropped, counted by reason. For bad data (`add`), also the first `SHOWN_ROWS` row indices of each
    reason (in the dataset as read) and the column it is about; those reasons count toward
    ``max_bad_row_share``. The level filter and the prompt-length limit are choices, not bad data."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: dict[str, list[int]] = {}
        self.columns: dict[str, str] = {}
        self.notes: list[str] = []  # what loading changed without dropping a row
        self.answer_column: str | None = None  # the column the golds are read from
        self.question_column: str | None = None  # the column the questions are read from

    def add(self, reason: str, index: int, column: str) -> None:
        self[reason] += 1
        self.columns[reason] = column
        shown = self.rows.setdefault(reason, [])
        if len(shown) < SHOWN_ROWS:
            shown.append(index)

    def shown(self, reason: str, base: bool = True) -> str:
        """`` (rows 3, 17, ..., counted from 0)`` for a bad-data reason, else nothing; without ``base``, the
        rows alone (for a line that says once how they are counted)."""
        if reason not in self.rows:
            return ""
        more = ", ..." if self[reason] > len(self.rows[reason]) else ""
        counted = ", counted from 0" if base else ""
        return f" (rows {', '.join(map(str, self.rows[reason]))}{more}{counted})"

    def bad(self) -> int:
        return sum(self[reason] for reason in self.columns)

    def bad_golds(self) -> int:
        """Rows dropped for their gold answer: empty, NaN, of another type, or no ``\\boxed{}``."""
        return sum(self[reason] for reason, column in self.columns.items() if column == self.answer_column)


@dataclass
class DataReport:
    """What loading did: rows kept, and rows dropped with the reason (and, for bad data, the first rows)."""

    source: str
    read: int
    rows: int
    dropped: Counter
    # A mixture's sources, by the index their uids start with.
    sources: list[str] = field(default_factory=list)
    # Which columns became question and gold, and the other columns the reward functions receive.
    columns: str | None = None

    def __str__(self) -> str:
        return "\n  ".join([self.summary(), *self.column_lines(), *self.drops(), *self.notes()])

    def column_lines(self) -> list[str]:
        """The columns line, where the data has one (not a built-in set)."""
        return [f"columns: {self.columns}"] if self.columns else []

    def summary(self) -> str:
        """The first line: the source, rows read and rows kept."""
        return f"dataset {self.source}: {self.read} rows read, {self.rows} kept"

    def drops(self) -> list[str]:
        """One line per reason rows were dropped: the count, the reason and, for bad data, the first rows."""
        shown = self.dropped.shown if isinstance(self.dropped, Drops) else lambda why: ""
        return [f"dropped {n}: {why}{shown(why)}" for why, n in self.dropped.items() if n]

    def notes(self) -> list[str]:
        """One line per thing loading changed without dropping a row, or worth knowing about the data."""
        return [f"note: {note}" for note in getattr(self.dropped, "notes", [])]

    def one_line(self) -> str:
        """The report on one line (for an error message)."""
        return "; ".join([self.summary(), *self.drops(), *self.notes()])


def _require(ds: datasets.Dataset, column: str, what: str) -> None:
    if column not in ds.column_names:
        raise DataError(f"{what} column {column!r} not found; the dataset has columns {ds.column_names}")


def _is_id(value: Any) -> bool:
    """Whether a row's id value can be its uid: text or a number (not NaN)."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and not _is_nan(value)


def _row_uids(questions: list[str], ids: list[Any] | None, column: str) -> tuple[list[str], list[str]]:
    """Each row's uid, and a note when the rows' ids (``column``'s values) were not kept. The ids are kept as
    text where every row has one (text or a number) and no two are the same text (1 and "1" are one uid);
    else each row's uid is a hash of its question, numbered where questions repeat. No ids at all (none, or
    all missing, as verl's ``extra_info`` without an index) need no note."""
    notes: list[str] = []
    if ids is not None and any(i is not None for i in ids):
        odd = [i for i in ids if not _is_id(i)]
        texts = [str(i) for i in ids]
        repeated = [t for t, n in Counter(texts).items() if n > 1]
        if odd:
            first = odd[0]
            missing = first is None or _is_nan(first)
            kind = "a missing value" if missing else f"{type(first).__name__} {first!r}"
            notes.append(
                f"column {column!r} holds {kind[:80]}, not an id (text or a number), so each row's uid is a "
                "hash of its question"
            )
        elif repeated:
            notes.append(
                f"{len(repeated)} value(s) of column {column!r} repeat (e.g. {repeated[0]!r}), so each row's "
                "uid is a hash of its question; make them unique to keep them as uids"
            )
        else:
            return texts, notes
    seen: Counter = Counter()
    uids = []
    for question in questions:
        digest = hashlib.sha1(question.encode()).hexdigest()[:16]
        uids.append(f"{digest}-{seen[digest]}")
        seen[digest] += 1
    return uids, notes


def _gold(answer: Any) -> str | list[str] | None:
    """A gold as text, or a list of acceptable golds (empty and NaN ones dropped); ``None`` when missing."""
    if answer is None:
        return None
    if isinstance(answer, (list, tuple)):
        return [
            text
            for text in (gold_text(a).strip() for a in answer if a is not None and not _is_nan(a))
            if text
        ]
    return gold_text(answer).strip()


def _is_nan(value: Any) -> bool:
    if isinstance(value, Decimal):
        return value.is_nan()
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isnan(value)


def _gold_problem(answer: Any) -> str | None:
    """Why a raw gold answer cannot be graded, or None: the grader reads text, numbers and bools (or lists
    of them); a real NaN (not the text "nan") and other types (a dict, ...) are bad data."""
    if _is_nan(answer):
        return "NaN gold answer"
    values = answer if isinstance(answer, (list, tuple)) else [answer]
    for value in values:
        if value is not None and not isinstance(value, (str, numbers.Real, Decimal)):
            inside = " in a list" if values is answer else ""
            return f"gold answer of type {type(value).__name__}{inside}"
    if _gold(answer) in (None, "", []):
        return "empty gold answer"
    return None


def _question_problem(question: Any) -> str | None:
    """Why a raw question cell cannot be asked, or None: a mapping, or a list that is not a conversation
    (ShareGPT's ``{from, value}`` turns, say), would be asked as its Python text; a conversation whose last
    user turn holds an image (or other content that is not text) would be asked without it."""
    if isinstance(question, dict) or (isinstance(question, list) and not is_conversation(question)):
        return f"question of type {type(question).__name__} (not text, nor {{role, content}} messages)"
    if isinstance(question, str) and question.lstrip().startswith("["):  # as `question_text` reads text
        parsed = stored_value(question)
        question = parsed if parsed and is_conversation(parsed) else question
    message = last_user_message(question) if isinstance(question, list) else None
    blocks = other_blocks(message.get("content")) if message is not None else []
    if blocks:
        return f"question with {', '.join(sorted(set(blocks)))} content (a text prompt cannot carry it)"
    return None


def check_bad_rows(dropped: Counter, kept: int, max_share: float | None) -> None:
    """Stop when more than ``max_share`` of the rows considered (kept + bad) are bad data.

    Raises:
        DataError: one line naming each bad reason with its column, count and first rows, the share, and
            the ``--max_bad_row_share`` value that would let the run go on.
    """
    if max_share is None or not isinstance(dropped, Drops):
        return
    if not 0.0 <= max_share <= 1.0:
        raise DataError(f"max_bad_row_share must be between 0 and 1, not {max_share}")
    bad = dropped.bad()
    considered = kept + bad
    if not considered or bad / considered <= max_share:
        return
    share = bad / considered
    enough = math.ceil(round(share * 100, 6)) / 100  # the smallest share in whole percent that lets it go on
    details = "; ".join(
        f"{n} {reason} in column {dropped.columns[reason]!r}{dropped.shown(reason, base=False)}"
        for reason, n in dropped.items()
        if reason in dropped.columns
    )
    details += "; rows counted from 0"
    if not kept:  # no share lets a run go on: the columns or the data are wrong
        raise DataError(
            f"all {considered} rows are unusable ({details}): check question_column and answer_column "
            "(python -m prompt_aug.data --dataset ... previews them), or fix the data"
        )
    raise DataError(
        f"{share:.1%} of the {considered} rows are unusable ({details}), more than max_bad_row_share "
        f"{max_share:g}: fix the data, or allow them with --max_bad_row_share {enough:g}"
    )


def level_key(level: Any) -> str:
    """A ``level`` value as levels are compared: 4, "4" and "Level 4" are one level.

    >>> [level_key(v) for v in [4, "4", "Level 4", " level 4 ", 4.0, "Level ?"]]
    ['4', '4', '4', '4', '4', '?']
    """
    return re.sub(r"(?i)^level\s*", "", number_text(level).strip())


def to_rows(
    ds: datasets.Dataset,
    question_column: str | None = None,
    answer_column: str | None = None,
    levels: list[str] | None = None,
) -> tuple[datasets.Dataset, Counter]:
    """Map a raw dataset onto ``question``/``answer``/``uid``, its other columns kept as they are (after
    those three); return it with drop counts by reason (a `Drops`: for bad data, also the first rows of each
    reason and its column).

    Raises:
        DataError: a question or answer column is missing, or another column has a reserved name
            (`check_column_names`).
    """
    dropped = Drops()
    cols = ds.column_names
    ids = None
    id_column = "uid"  # the column the ids are read from
    unboxed: set[int] = set()  # rows whose answer cell gives no gold by its column's rule, and why
    no_gold = ""
    read_index = list(range(len(ds)))  # each row's index in the dataset as read
    if levels:
        _require(ds, "level", "level")
        wanted = {level_key(level) for level in levels}
        read_index = [i for i, lv in enumerate(ds["level"]) if level_key(lv) in wanted]
        dropped[f"level not in {levels}"] = len(ds) - len(read_index)
        if not read_index and len(ds):
            held = sorted({str(lv) for lv in ds["level"]}, key=lambda lv: (level_key(lv), lv))
            shown = ", ".join(map(repr, held[:SHOWN_ROWS])) + (", ..." if len(held) > SHOWN_ROWS else "")
            dropped.notes.append(
                f"no row has a level in {levels}; column 'level' holds {shown} (fix dataset_levels)"
            )
        ds = ds.select(read_index)
    # Naming verl's own columns reads the layout as naming none does.
    named = (
        None if question_column == "prompt" else question_column,
        None if answer_column == VERL_GOLD else answer_column,
    )
    if is_verl_layout(cols, *named):
        q_col, a_col = "prompt", VERL_GOLD
        # ``reward_model`` stays whole for the rewards (verl's read its ``ground_truth`` and ``style``).
        # SimpleRL-Zoo's file also holds the raw question: the rewards get the prompt's under that name.
        consumed = {"prompt", "uid", "question"}
        raw_questions = list(ds["prompt"])
        answers = [verl_gold(rm) for rm in ds["reward_model"]]
        if "uid" in cols:
            ids = list(ds["uid"])
        elif "extra_info" in cols:
            ids, id_column = [json_field(info, "index") for info in ds["extra_info"]], "extra_info.index"
    else:
        q_col = pick_column(cols, question_column, QUESTION_GUESSES)
        a_col = pick_column(cols, answer_column, ANSWER_GUESSES)
        if a_col is None and "reward_model" in cols:  # verl's gold beside a question column named
            a_col = VERL_GOLD
        if q_col is None:
            raise DataError(
                f"no question column (tried {list(QUESTION_GUESSES)}); set `question_column`. Columns: {cols}"
            )
        if a_col is None:
            raise DataError(
                f"no answer column (tried {list(ANSWER_GUESSES)}); set `answer_column`. Columns: {cols}"
            )
        _require(ds, q_col, "question")
        answers, a_from = answer_values(ds, a_col)
        if a_from != a_col and a_from not in RESERVED_COLUMNS:  # a struct's field: the struct stays whole
            a_from = None
        elif a_from != a_col:
            dropped.notes.append(
                f"column {a_from!r} (the gold's {a_col!r}) does not reach the rewards: its name is one they "
                "already receive; rename the column to keep it"
            )
        raw_questions = list(ds[q_col])
        if a_col == "solution":
            answers, unboxed = solution_golds(answers)
            no_gold = (
                "no \\boxed{} in the solution (its last box is the gold; rename a column of plain answers)"
            )
        else:
            answers, unboxed, worked = worked_golds(answers)
            no_gold = (
                "worked solution with no final answer (no `####` line, no \\boxed{}); set answer_column to "
                "a column of final answers"
            )
            if worked:
                dropped.notes.append(
                    f"{worked} gold(s) of column {a_col!r} are worked solutions: each gives the text after "
                    "its last `####`, else its last \\boxed{}"
                )
        if "uid" in cols:
            ids = list(ds["uid"])
        consumed = {q_col, a_from, "uid"}
        if is_verl_layout(cols, None, None):  # verl's chat prompt, which the run writes anew
            consumed.add("prompt")
    dropped.answer_column, dropped.question_column = a_col, q_col
    questions = [question_text(q) for q in raw_questions]
    check_column_names(cols, consumed, {"question": q_col, "answer": a_col})
    check_no_images(ds)
    keep = []
    for i, (question, answer) in enumerate(zip(questions, answers)):
        problem = _gold_problem(answer)
        if i in unboxed:
            problem = no_gold
        if problem is not None:
            dropped.add(problem, read_index[i], a_col)
        elif (problem := _question_problem(raw_questions[i])) is not None:
            dropped.add(problem, read_index[i], q_col)
        elif not question:
            dropped.add("empty question", read_index[i], q_col)
        else:
            keep.append(i)
    answers = [_gold(a) for a in answers]
    uids, notes = _row_uids(questions, ids, id_column)
    dropped.notes += notes
    columns = {
        "question": [questions[i] for i in keep],
        # A list-valued answer column keeps every gold (any of them counts, as in evaluation); then the whole
        # column is lists, a single gold being a list of one.
        "answer": (
            [answers[i] if isinstance(answers[i], list) else [answers[i]] for i in keep]
            if any(isinstance(answers[i], list) for i in keep)
            else [answers[i] for i in keep]
        ),
        "uid": [uids[i] for i in keep],
    }
    rows = datasets.Dataset.from_dict(columns)
    extra = [c for c in cols if c not in consumed]
    if extra:  # the dataset's own columns, for the reward functions, with their types as loaded
        kept = ds.select(keep)
        features = datasets.Features({**rows.features, **{c: ds.features[c] for c in extra}})
        rows = datasets.Dataset.from_dict({**columns, **{c: kept[c] for c in extra}}, features=features)
    return rows, dropped


def answer_values(ds: datasets.Dataset, column: str) -> tuple[list[Any], str]:
    """The values of the answer column, and the column they are read from. ``struct.field`` (no column of
    that name) reads ``field`` of each row's mapping in ``struct`` (stored as it is or as JSON text). A
    class-label column gives its label names, not their indices.

    Raises:
        DataError: the column (or ``struct``) is missing, naming the columns there are.
    """
    struct, dot, key = column.partition(".")
    if column not in ds.column_names and dot and struct in ds.column_names:
        feature = ds.features[struct]
        inner = feature.get(key) if isinstance(feature, dict) else None
        mappings = [json_mapping(value) for value in ds[struct]]  # the column read and parsed once
        _require_field(struct, key, list(feature) if isinstance(feature, dict) else None, mappings)
        return as_stored([None if m is None else m.get(key) for m in mappings], inner), struct
    _require(ds, column, "answer")
    return as_stored(list(ds[column]), ds.features[column]), column


def _require_field(struct: str, key: str, fields: list[str] | None, mappings: list[dict | None]) -> None:
    """Refuse ``struct.key`` when ``key`` is a field of no row's mapping in ``struct``: of the struct type's
    ``fields``, or, for mappings of varying keys or JSON text (``fields`` None), of the keys the rows'
    ``mappings`` hold.

    Raises:
        DataError: one line naming the column, the field and the fields there are.
    """
    if fields is None:
        fields = list(dict.fromkeys(str(k) for m in mappings if m is not None for k in m))
    if key not in fields:
        raise DataError(
            f"answer column '{struct}.{key}': field {key!r} is in no row of column {struct!r} (its fields: "
            f"{', '.join(fields) or 'none'}); fix answer_column"
        )


def filter_long_prompts(
    rows: datasets.Dataset,
    templates: list[Any],
    tokenizer: Any,
    max_prompt_length: int | None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[datasets.Dataset, int]:
    """Drop rows whose prompt, rendered with the longest template (and ``chat_template_kwargs``, as training
    renders it), exceeds ``max_prompt_length`` tokens.

    TRL has no prompt-length limit, so this is where over-long prompts are removed.
    """
    if not max_prompt_length or len(rows) == 0:
        return rows, 0
    kwargs = chat_template_kwargs or {}
    probe = rows[0]["question"]
    longest = max(templates, key=lambda t: len(tokenizer(t.render(probe, tokenizer, **kwargs)).input_ids))
    lengths = [
        len(ids)
        for ids in tokenizer([longest.render(q, tokenizer, **kwargs) for q in rows["question"]]).input_ids
    ]
    keep = [i for i, n in enumerate(lengths) if n <= max_prompt_length]
    return rows.select(keep), len(rows) - len(keep)


def load_math_dataset(
    name: str,
    config: str | None = None,
    split: str = "train",
    question_column: str | None = None,
    answer_column: str | None = None,
    levels: list[str] | None = None,
    num_synthetic: int = 256,
    seed: int = 0,
    max_bad_row_share: float | None = None,
    columns: list[str] | None = None,
    data_files: Any = None,
    inherited_columns: bool = False,
) -> tuple[datasets.Dataset, DataReport]:
    """Load ``name`` (``synthetic``, a Hub id, or a local path) as ``question``/``answer``/``uid`` rows.
    With ``max_bad_row_share``, more bad rows than that share is a `DataError` (`check_bad_rows`). With
    ``columns`` (a mixture source's), only those columns are read; ``data_files`` go to ``datasets``
    (a builder such as ``json`` names them, as a mixture source in TRL's form does). With
    ``inherited_columns`` (a mixture source's columns are the top-level ones), they are read as
    `mix_sources` reads them (`source_columns`)."""
    built = builtin_rows(name, num_synthetic, seed)
    if built is not None:
        return _builtin_set(name, built)
    try:
        raw = read_dataset(
            name, config, split, data_files=data_files, text_columns=(question_column, answer_column)
        )
    except SourceError as err:  # a missing path, split or file: the message lists what is there
        raise DataError(str(err)) from None
    if columns is not None:
        _require_all(raw, columns)
        raw = raw.select_columns(columns)
    question_column, answer_column = source_columns(
        raw.column_names, question_column, answer_column, inherited_columns
    )
    return rows_of(name, raw, question_column, answer_column, levels, max_bad_row_share)


def _builtin_set(name: str, built: list[dict]) -> tuple[datasets.Dataset, DataReport]:
    rows = datasets.Dataset.from_list(built)
    return rows, DataReport(name, len(rows), len(rows), Counter())


def rows_of(
    name: str,
    raw: datasets.Dataset,
    question_column: str | None = None,
    answer_column: str | None = None,
    levels: list[str] | None = None,
    max_bad_row_share: float | None = None,
    note_repeats: bool = True,
) -> tuple[datasets.Dataset, DataReport]:
    """The dataset ``name`` read as stored (``raw``) as ``question``/``answer``/``uid`` rows (`to_rows`),
    with the report of what was kept and dropped; too many bad rows is a `DataError` (`check_bad_rows`).
    With ``note_repeats``, the report counts questions that appear more than once (a mixture counts them
    across its sources)."""
    if name == MATH_HUB_ID and answer_column is None:
        answer_column = "solution"
    rows, dropped = to_rows(raw, question_column, answer_column, levels)
    check_bad_rows(dropped, len(rows), max_bad_row_share)
    if note_repeats and (repeats := repeated_questions(rows["question"])):
        dropped.notes.append(repeats)
    columns = f"{read_from(dropped)}; {to_rewards(rows.features)}"
    return rows, DataReport(name, len(raw), len(rows), dropped, columns=columns)


def read_from(dropped: Drops) -> str:
    """Which columns became the question and the gold (and by what rule, where the cell is not the gold).

    >>> drops = Drops()
    >>> drops.question_column, drops.answer_column = "problem", "solution"
    >>> read_from(drops)
    "question <- 'problem', gold <- 'solution' (its last \\\\boxed{})"
    """
    rule = " (its last \\boxed{})" if dropped.answer_column == "solution" else ""
    turn = " (its user turn)" if dropped.question_column == "prompt" else ""
    return f"question <- {dropped.question_column!r}{turn}, gold <- {dropped.answer_column!r}{rule}"


def to_rewards(features: datasets.Features) -> str:
    """The columns reward functions receive besides question, answer and uid, each with its type.

    >>> to_rewards(datasets.Features({"question": datasets.Value("string"), "n": datasets.Value("int64")}))
    'also to the rewards: n (int64)'
    """
    extra = [f"{c} ({_short_type(f)})" for c, f in features.items() if c not in ("question", "answer", "uid")]
    return f"also to the rewards: {', '.join(extra) or 'no other column'}"


def _short_type(feature: Any) -> str:
    """A column's type in a few words: ``int64``, ``list of string``, ``struct {ground_truth, style}``."""
    if isinstance(feature, datasets.Value):  # Arrow's large_string reaches the rewards as a str too
        return feature.dtype.removeprefix("large_")
    if isinstance(feature, datasets.List):
        return f"list of {_short_type(feature.feature)}"
    if isinstance(feature, dict):
        return f"struct {{{', '.join(feature)}}}"
    return type(feature).__name__


def repeated_questions(questions: list[str]) -> str | None:
    """A note counting the questions that appear more than once, or None when none does.

    >>> repeated_questions(["a", "b", "a", "a", "c", "c"])
    '2 questions appear more than once (5 rows); each is trained as often as it appears'
    """
    repeats = [n for n in Counter(questions).values() if n > 1]
    if not repeats:
        return None
    many = "questions appear" if len(repeats) > 1 else "question appears"
    return (
        f"{len(repeats)} {many} more than once ({sum(repeats)} rows); each is trained as often as it appears"
    )


def mix_sources(
    read: list[ReadSource],
    question_column: str | None = None,
    answer_column: str | None = None,
    levels: list[str] | None = None,
    max_bad_row_share: float | None = None,
    keep_prompts: Callable[[datasets.Dataset], tuple[datasets.Dataset, int, str]] | None = None,
) -> tuple[datasets.Dataset, DataReport]:
    """The sources of a ``dataset_mixture`` (TRL's `DatasetMixtureConfig` of
    `prompt_aug.mixture.MixtureSource`), read by `prompt_aug.sources.read_training_data`, as one set of
    ``question``/``answer``/``uid`` rows.

    Each source's ``columns`` are selected, then it is mapped with its own column keys (the arguments here are
    the defaults; a source in verl layout that sets neither and lacks the default columns is read as verl
    layout). ``keep_prompts`` (rows -> the rows kept, how many dropped, why) drops each source's prompts
    that are too long. ``fraction`` keeps TRL's meaning (shares of the mixture, no source oversampled),
    applied to the rows that remain. Uids get the source's position as a prefix (``0:...``, ``1:...``), so
    two sources never share one. ``max_bad_row_share`` applies to each source (`check_bad_rows`). Each
    source keeps its other columns; a column that only some sources have is ``None`` in the rows of the
    others (`align_columns`).

    Raises:
        DataError: a source lacks a column, has too many bad rows, or keeps no row; the message starts with
            its key.
    """
    parts, reports = [], []
    for i, (key, source, raw, _) in enumerate(read):
        try:
            if source.columns is not None:
                _require_all(raw, source.columns)
                raw = raw.select_columns(source.columns)
            q_col, a_col = source.question_column or question_column, source.answer_column or answer_column
            inherited = source.question_column is None and source.answer_column is None
            q_col, a_col = source_columns(raw.column_names, q_col, a_col, inherited)
            rows, report = rows_of(
                source.path, raw, q_col, a_col, source.dataset_levels or levels, max_bad_row_share, False
            )
            if not len(rows):  # else it would surface as a column typed null in the mixture
                why = "; ".join(report.drops()) or "empty"
                notes = "".join(f"; {note}" for note in report.notes())
                raise DataError(
                    f"kept 0 of its {report.read} rows ({why}){notes}; fix the source or its filter, or "
                    "leave it out of the mixture"
                )
            # A source left with no row gives none (its columns keep their types).
            if keep_prompts is not None:
                rows, n_long, why = keep_prompts(rows)
                if n_long:
                    report.dropped[why] += n_long
                if not len(rows) and source.fraction:  # its share could not be met: the mixture is empty
                    raise DataError(
                        f"all {n_long} rows left dropped ({why}), so its fraction cannot be met; raise "
                        "max_prompt_length, give it fraction 0, or leave it out of the mixture"
                    )
        except DataError as err:  # a missing column, too many bad rows, or none left
            raise DataError(f"{key}: {err}") from None
        parts.append(rows.map(lambda row, i=i: {"uid": mixed_uid(i, row["uid"])}))
        reports.append(report)
    sources = [source for _, source, _, _ in read]
    fractions = [source.fraction for source in sources]
    beyond = [0] * len(parts)
    if fractions[0] is not None:  # TRL's rule (`get_dataset`): the largest mixture with these shares
        weights = [f / sum(fractions) for f in fractions]
        total = min(len(part) / w for part, w in zip(parts, weights, strict=True) if w > 0)
        kept = [round(w * total) for w in weights]
        beyond = [len(part) - n for part, n in zip(parts, kept, strict=True)]
        parts = [part.select(range(n)) for part, n in zip(parts, kept, strict=True)]
    if len({repr(part.features["answer"]) for part in parts}) > 1:  # list golds in some sources only
        parts = [part.map(lambda row: {"answer": _as_list(row["answer"])}) for part in parts]
    # Each source by its path or data files, or, where two have the same, by its recipe key too.
    labels = [source_label(source) for source in sources]
    labels = [
        label if labels.count(label) == 1 else key for label, (key, *_) in zip(labels, read, strict=True)
    ]
    widened: list[str] = []
    # The columns of mappings a source's gold was read from (verl's reward_model; answer_column meta.answer).
    holders = [r.dropped.answer_column for r in reports if r.dropped.answer_column]
    parts = align_columns(parts, labels, widened, frozenset(c.split(".")[0] for c in holders if "." in c))
    mixed = datasets.concatenate_datasets(parts)
    dropped = Drops()
    for label, report, extra in zip(labels, reports, beyond, strict=True):
        for why, n in report.dropped.items():
            dropped[f"{label}: {why}"] += n
        if extra:
            dropped[f"{label}: beyond its fraction of the mixture"] += extra
        dropped.notes += [f"{label}: {note}" for note in getattr(report.dropped, "notes", [])]
    dropped.notes += widened
    if repeats := repeated_questions(mixed["question"]):
        dropped.notes.append(f"{repeats} (across the sources)")
    names = ", ".join(f"{label} ({len(p)} rows)" for label, p in zip(labels, parts, strict=True))
    read_rows = sum(r.read for r in reports)
    read = "; ".join(f"{label}: {read_from(r.dropped)}" for label, r in zip(labels, reports, strict=True))
    return mixed, DataReport(
        f"mixture of {names}", read_rows, len(mixed), dropped, sources=labels,
        columns=f"{read}; {to_rewards(mixed.features)}",
    )  # fmt: skip


def source_columns(
    columns: list[str], question_column: str | None, answer_column: str | None, inherited: bool
) -> tuple[str | None, str | None]:
    """The question and answer columns a mixture source is read with: the ones given, except that
    ``inherited`` top-level columns a verl-layout source lacks are the other sources' (it is read as verl).

    >>> source_columns(["prompt", "reward_model"], "problem", "solution", inherited=True)
    (None, None)
    >>> source_columns(["problem", "solution"], "problem", "solution", inherited=True)
    ('problem', 'solution')
    """
    missing = any(c not in columns for c in (question_column, answer_column) if c is not None)
    if inherited and missing and is_verl_layout(columns, None, None):
        return None, None
    return question_column, answer_column


def mixed_uid(source: int, uid: str) -> str:
    """A mixture row's uid: its source's index before the source's own uid, so no two sources share one.

    >>> mixed_uid(1, "a3f-0")
    '1:a3f-0'
    """
    return f"{source}:{uid}"


def align_columns(
    parts: list[datasets.Dataset],
    names: list[str],
    notes: list[str] | None = None,
    gold_holders: frozenset[str] = frozenset(),
) -> list[datasets.Dataset]:
    """The sources of a mixture with the same columns, in the order they first appear: a column that a
    source lacks is added to it, ``None`` in every row (a reward function sees ``None`` for its rows).
    ``notes`` gets one line per column whose integers some sources must read as floats, and one per column of
    ``gold_holders`` (a column of mappings a gold was read from, kept whole for the rewards) left out of the
    mixture because its type differs between sources: the golds are read already.

    Raises:
        DataError: a column whose type differs between two sources (``names`` name them), with what to do.
    """
    features: dict[str, Any] = {}
    owner: dict[str, int] = {}
    left_out: set[str] = set()
    for i, part in enumerate(parts):
        for column, feature in part.features.items():
            if column in left_out:
                continue
            if column not in features:
                features[column], owner[column] = feature, i
            elif column != "answer":  # the golds are made one type before (lists where any source has some)
                merged = _one_type(features[column], feature)
                if merged is None and column in gold_holders:
                    left_out.add(column)
                    del features[column]
                    if notes is not None:
                        notes.append(
                            f"column {column!r}, which holds the gold, has another type in datasets[{i}] "
                            f"({names[i]}) than in datasets[{owner[column]}] ({names[owner[column]]}); it is "
                            "left out of the mixture (each source's gold is read already)"
                        )
                    continue
                if merged is None:
                    first = owner[column]
                    raise DataError(
                        f"dataset_mixture: column {column!r} is {_type_name(features[column])} in "
                        f"datasets[{first}] ({names[first]}) but {_type_name(feature)} in datasets[{i}] "
                        f"({names[i]}); give it one type in both, or leave it out of one with `columns`"
                    )
                if repr(merged) != repr(features[column]):  # the source that gave the type names it
                    owner[column] = i
                features[column] = merged
    aligned = []
    for i, part in enumerate(parts):
        for column, feature in features.items():
            if column not in part.column_names:
                part = part.add_column(column, [None] * len(part), feature=feature)
            elif column != "answer" and repr(part.features[column]) != repr(feature):
                if notes is not None and _ints_as_floats(part.features[column], feature):
                    notes.append(
                        f"column {column!r}: {_short_type(part.features[column])} in datasets[{i}] "
                        f"({names[i]}) is read as {_short_type(feature)}, the type another source gives it; "
                        "its whole numbers reach the rewards as floats (3.0)"
                    )
                try:
                    part = part.cast_column(column, feature)
                except (ValueError, TypeError) as err:  # Arrow's safe cast: a value the wider type can't hold
                    raise DataError(
                        f"dataset_mixture: column {column!r} of datasets[{i}] ({names[i]}) cannot be read as "
                        f"{_type_name(feature)}, the type the mixture gives it ({str(err).splitlines()[0]}); "
                        "give it one type in every source, or leave it out of one with `columns`"
                    ) from None
        aligned.append(part.select_columns(list(features)))
    return aligned


def _ints_as_floats(feature: Any, wider: Any) -> bool:
    """Whether reading a column of type ``feature`` as ``wider`` makes integers floats (also in lists and
    mappings)."""
    if isinstance(feature, datasets.Value) and isinstance(wider, datasets.Value):
        return "int" in feature.dtype and "float" in wider.dtype
    if isinstance(feature, datasets.List) and isinstance(wider, datasets.List):
        return _ints_as_floats(feature.feature, wider.feature)
    if isinstance(feature, dict) and isinstance(wider, dict):
        return any(_ints_as_floats(f, wider[k]) for k, f in feature.items() if k in wider)
    return False


def _all_null(feature: Any) -> bool:
    """Whether a column's type is Arrow's null: every value of it in that source is missing."""
    return isinstance(feature, datasets.Value) and feature.dtype == "null"


def _one_type(known: Any, other: Any) -> Any:
    """The type of a column that is ``known`` in one source and ``other`` in another, or None where they
    differ. Arrow's null type holds no value, so it takes the other's type, also inside lists and mappings
    (a source whose lists are all empty, or whose field is always missing). Numbers of two widths or kinds
    take the wider: integers ``int64``, with a float ``float64`` (``3`` in one file, ``2.5`` in another);
    text, ``large_string`` (a parquet file pandas wrote beside a JSON Lines file). Mappings take every field
    of both, by name (datasets' cast leaves a field a source lacks None in its rows); mappings beside
    datasets' `Json` (a JSON Lines file whose mappings differ row to row) are `Json`, each row its own.

    >>> _one_type(datasets.Value("int64"), datasets.Value("float32"))
    Value('float64')
    >>> _one_type(datasets.Value("string"), datasets.Value("large_string"))
    Value('large_string')
    >>> _one_type(datasets.Value("int64"), datasets.Value("string")) is None
    True
    """
    if _all_null(other):
        return known
    if _all_null(known):
        return other
    if isinstance(known, datasets.Value) and isinstance(other, datasets.Value) and known.dtype != other.dtype:
        kinds = {value.dtype.rstrip("0123456789") for value in (known, other)}
        unsigned64 = "uint64" in (known.dtype, other.dtype)  # wider than int64 and float64 hold exactly
        if kinds <= {"int", "uint", "float"} and not unsigned64:
            return datasets.Value("float64" if "float" in kinds else "int64")
        for kind in ("string", "binary"):  # pandas writes parquet text as large_string, JSON reads string
            if {known.dtype, other.dtype} == {kind, f"large_{kind}"}:
                return datasets.Value(f"large_{kind}")
    if isinstance(known, dict) and isinstance(other, dict):  # by name; a field one lacks is None there
        fields = {
            key: _one_type(value, other[key]) if key in other else value for key, value in known.items()
        }
        fields.update({key: value for key, value in other.items() if key not in known})
        return None if any(f is None for f in fields.values()) else fields
    if {type(known), type(other)} == {datasets.Json, dict}:  # each row's mapping as it is
        return datasets.Json()
    if isinstance(known, datasets.List) and isinstance(other, datasets.List):
        inner = _one_type(known.feature, other.feature)
        return None if inner is None or known.length != other.length else datasets.List(inner, known.length)
    return known if repr(known) == repr(other) else None


def _type_name(feature: Any) -> str:
    """A feature's type in a few words: ``int64``, ``string``, ``List(string)``."""
    return feature.dtype if isinstance(feature, datasets.Value) else repr(feature)


def _require_all(ds: datasets.Dataset, columns: list[str]) -> None:
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise DataError(f"columns {missing} not found; the dataset has columns {ds.column_names}")


def _as_list(answer: Any) -> list[str]:
    return answer if isinstance(answer, list) else [answer]


# ---------------------------------------------------------------------------------------------
# Preview: what a user checks before spending GPU hours.

_ANSWER_FORMS = (
    ("integer", re.compile(r"^-?\d+$")),
    ("decimal", re.compile(r"^-?\d*\.\d+$")),
    ("fraction", re.compile(r"^-?\\[dt]?frac\{-?\d+\}\{\d+\}$|^-?\d+/\d+$")),
    ("tuple or interval", re.compile(r"^[\(\[].*,.*[\)\]]$")),
    ("text", re.compile(r"^\\text\{[^{}]*\}$|^[A-Za-z ]+$")),
)


def plain_prompts(
    dataset: datasets.Dataset,
    template: Any,
    tokenizer: Any = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> datasets.Dataset:
    """Without augmentation: each question as ``template``'s messages, a TRL conversational ``prompt``,
    with the template's format rules in the row so that the rewards grade by them; given the ``tokenizer``
    TRL renders them with, without the markers its generation prompt already writes
    (`Template.markers_to_write`)."""
    from .collator import format_columns

    if template.prefill:
        raise TemplateError(
            f"prompt_augmentation is false, so questions are asked under eval_template {template.name!r} "
            f"through TRL's chat handling, which cannot prefill {template.prefill!r}; "
            "choose an eval_template without a prefill"
        )
    opening = template.opening(tokenizer, **(chat_template_kwargs or {})) if tokenizer is not None else None
    columns = format_columns(template, opening)
    return dataset.map(lambda row: {"prompt": template.messages(row["question"]), **columns})


def load_train_dataset(
    read: list[ReadSource], script_args: Any, args: Any, templates: list, eval_template: Any, tokenizer: Any
) -> tuple[datasets.Dataset, DataReport]:
    """The training questions of a recipe, from its sources as read (`prompt_aug.sources.read_training_data`):
    mapped to rows (main process first), asked under ``eval_template`` as TRL conversational prompts when
    augmentation is off, and too-long prompts dropped. Returns them and the report of what was kept and
    dropped. A missing column is a `DataError` naming ``dataset_name`` or the mixture's source."""
    from accelerate import PartialState

    long = f"prompt longer than {script_args.max_prompt_length} tokens"

    def keep_prompts(rows: datasets.Dataset) -> tuple[datasets.Dataset, int, str]:
        kept, n_long = filter_long_prompts(
            rows, templates, tokenizer, script_args.max_prompt_length, args.chat_template_kwargs
        )
        return kept, n_long, long

    with PartialState().main_process_first():
        if script_args.dataset_mixture is not None:  # each source's long prompts go before the fractions
            dataset, report = mix_sources(
                read,
                script_args.question_column,
                script_args.answer_column,
                script_args.dataset_levels,
                max_bad_row_share=script_args.max_bad_row_share,
                keep_prompts=keep_prompts,
            )
        elif read[0].builtin:
            dataset, report = _builtin_set(script_args.dataset_name, read[0].data)
        else:
            try:
                dataset, report = rows_of(
                    script_args.dataset_name,
                    read[0].data,
                    question_column=script_args.question_column,
                    answer_column=script_args.answer_column,
                    levels=script_args.dataset_levels,
                    max_bad_row_share=script_args.max_bad_row_share,
                )
            except DataError as err:  # a missing column: the message lists the columns there are
                raise DataError(f"{read[0].key}: {err}") from None
        if script_args.dataset_mixture is None:
            dataset, n_long, _ = keep_prompts(dataset)
            if n_long:
                report.dropped[long] += n_long
        if not args.prompt_augmentation:
            dataset = plain_prompts(dataset, eval_template, tokenizer, args.chat_template_kwargs)
    report.rows = len(dataset)
    return dataset, report


def answer_form(answer: str) -> str:
    """A coarse class of a gold answer, for the preview histogram.

    >>> [answer_form(a) for a in ["12", "\\\\frac{1}{2}", "(1, 2)", "\\\\text{Monday}", "2\\\\sqrt{3}"]]
    ['integer', 'fraction', 'tuple or interval', 'text', 'expression']
    """
    if isinstance(answer, list):  # several acceptable golds: the first one's form
        answer = answer[0] if answer else ""
    text = answer.strip().strip("$")
    for form, pattern in _ANSWER_FORMS:
        if pattern.match(text):
            return form
    return "expression"


def _files_of(data_files: Any) -> list[str]:
    """The paths a ``data_files`` value names (a path, a list of them, or a split -> path(s) mapping)."""
    if isinstance(data_files, dict):
        return [f for value in data_files.values() for f in _files_of(value)]
    if isinstance(data_files, (list, tuple)):
        return [str(f) for f in data_files]
    return [str(data_files)] if data_files else []


def _same_path(dataset: str, names: list[str]) -> bool:
    """Whether ``dataset`` is one of ``names``, as written or as the same local path (``./a`` is ``a``)."""
    here = Path(dataset).expanduser().resolve()
    return any(dataset == name or Path(name).expanduser().resolve() == here for name in names)


def _source_keys(recipe: dict[str, Any], dataset: str) -> dict[str, Any]:
    """The recipe's data keys for ``dataset`` as training reads them: for its ``dataset_mixture`` source of
    that ``path`` (or, for one in TRL's form, ``path: json`` with ``data_files``, of that data file or that
    builder, whose ``data_files`` then come too), the source's subset, split and ``columns``, and its column
    and level keys where set (else the top-level ones); otherwise the top-level keys."""
    keys = {k: recipe.get(k) for k in ("dataset_config", "dataset_split", "question_column", "answer_column")}
    keys["dataset_levels"] = recipe.get("dataset_levels")
    keys["columns"] = keys["data_files"] = None
    keys["inherited"] = False
    if not recipe.get("dataset_mixture"):
        return keys
    try:
        sources = dataset_mixture(recipe["dataset_mixture"]).datasets
    except ValueError as err:
        raise DataError(str(err)) from None
    if dataset in FILE_BUILDERS:  # a source in TRL's form, `path: json` with its data_files
        builders = [i for i, s in enumerate(sources) if s.path == dataset]
        if len(builders) > 1:
            raise DataError(
                f"--dataset {dataset}: dataset_mixture.datasets{builders} all read with the {dataset} "
                "builder; give one of the source's data files as --dataset"
            )
    source = next((s for s in sources if _same_path(dataset, [s.path, *_files_of(s.data_files)])), None)
    if source is None:
        return keys
    return {
        "dataset_config": source.name,
        "dataset_split": source.split,
        "question_column": source.question_column or keys["question_column"],
        "answer_column": source.answer_column or keys["answer_column"],
        "dataset_levels": source.dataset_levels or keys["dataset_levels"],
        "columns": source.columns,
        "data_files": source.data_files if dataset == source.path and dataset in FILE_BUILDERS else None,
        "inherited": source.question_column is None and source.answer_column is None,
    }


def preview(args: argparse.Namespace) -> str:
    """The preview report as text (see `main`)."""
    from transformers import AutoTokenizer

    from .config import PromptAugGRPOConfig, mapping_value
    from .recipe import PromptAugScriptArguments
    from .templates import chat_template_text, check_renders, load_templates, templates_for

    recipe: dict[str, Any] = {}
    if args.config:  # its values as training parses them (a one-word list is a list of one, "false" false)
        from .recipe import parse_recipe_file

        parsed = parse_recipe_file(args.config)  # a bad file, key or value is one line
        recipe = {key: value for keys in parsed[:3] for key, value in vars(keys).items()}
    keys = _source_keys(recipe, args.dataset)
    if args.question_column or args.answer_column:  # the command line's, over the recipe's
        keys["inherited"] = False
    for key in ("question_column", "answer_column"):
        keys[key] = getattr(args, key) or keys[key]
    if is_hub_id(args.dataset) and not looks_local(args.dataset) and not Path(args.dataset).exists():
        require_hub("--dataset", args.dataset)  # at once, rather than after the client's retries
    levels = keys.get("dataset_levels")
    rows, report = load_math_dataset(
        args.dataset,
        config=args.dataset_config or keys.get("dataset_config"),
        split=args.split or keys.get("dataset_split") or "train",
        question_column=keys.get("question_column"),
        answer_column=keys.get("answer_column"),
        levels=None if levels is None else [str(level) for level in levels],  # YAML's 4 is the level "4"
        columns=keys["columns"],
        data_files=keys["data_files"],
        inherited_columns=keys["inherited"],
    )
    # Too many bad rows stop training: said here, so that the rest of the preview still shows them.
    share = args.max_bad_row_share
    if share is None:
        share = recipe.get("max_bad_row_share", _default(PromptAugScriptArguments, "max_bad_row_share"))
    try:
        check_bad_rows(report.dropped, report.rows, share)
    except DataError as err:
        stop = f"training would stop here: {err}"
    else:
        stop = None
    tokenizer_name = args.tokenizer or recipe.get("model_name_or_path")
    # A fetched model's short name is its folder, as training reads it; one not fetched yet stops here.
    tokenizer_name = resolve_local_model(
        tokenizer_name, "--tokenizer" if args.tokenizer else "model_name_or_path"
    )
    lines = []
    tokenizer = None
    max_len = args.max_prompt_length or recipe.get("max_prompt_length")
    if tokenizer_name in builtin_names("model"):  # a built-in model: its tokenizer is the built-in one
        tokenizer = builtin_tokenizer()
    elif tokenizer_name:
        try:
            if (
                is_hub_id(tokenizer_name)
                and not looks_local(tokenizer_name)
                and not Path(tokenizer_name).exists()
            ):
                require_hub("--tokenizer", tokenizer_name)  # no minute of retries before the fallback
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
        except (OSError, ValueError) as err:  # SourceError is a ValueError
            lines.append(f"(could not load tokenizer {tokenizer_name!r}: {str(err).splitlines()[0]})")
    if tokenizer is None:
        tokenizer = builtin_tokenizer()
        fix = (  # a name was tried and failed (said above): another name, reachable here, is what helps
            "pass --tokenizer with a local folder or a fetched model's name"
            if tokenizer_name
            else "pass --tokenizer or --config for your model's"
        )
        lines.append(f"(rendering with the built-in ChatML tokenizer instead; {fix})")
        if max_len:  # its token counts are not the model's: a limit applied with it would invent drops
            lines.append(f"(prompt length limit {max_len} not applied: it needs the model's tokenizer)")
            max_len = None
    elif recipe.get("chat_template"):  # as the training run sets it
        tokenizer.chat_template = chat_template_text(recipe["chat_template"])
    try:  # as training renders with them
        kwargs = mapping_value("chat_template_kwargs", recipe.get("chat_template_kwargs")) or {}
    except ValueError as err:
        raise DataError(str(err)) from None
    check_renders(load_templates(recipe.get("templates_file")).values(), tokenizer, kwargs)
    # The templates training asks under (the evaluation template alone without prompt augmentation).
    names = ("prompt_augmentation", "templates", "template_weights", "templates_file", "eval_template")
    asked = {key: recipe.get(key, _default(PromptAugGRPOConfig, key)) for key in names}
    templates, _, _ = templates_for(argparse.Namespace(**asked, system_prompt=recipe.get("system_prompt")))
    n_gold = len(rows)
    rows, n_long = filter_long_prompts(rows, templates, tokenizer, max_len, kwargs)
    report.dropped[f"prompt longer than {max_len} tokens (longest template)"] += n_long
    report.rows = len(rows)
    lines.append(str(report))
    no_gold = report.dropped.bad_golds() if isinstance(report.dropped, Drops) else 0
    lines.append(f"golds: {n_gold} rows with a gold answer, {no_gold} without one (dropped)")
    if stop:
        lines.append(stop)
    forms = Counter(answer_form(a) for a in rows["answer"])
    lines.append("answer forms:")
    width = max(forms.values(), default=1)
    for form, n in forms.most_common():
        lines.append(f"  {form:<18} {n:>6}  {'#' * max(1, round(40 * n / width))}")
    if len(rows):
        question = rows[0]["question"]
        lines.append(f"\nfirst question (uid {rows[0]['uid']}), its gold: {rows[0]['answer']!r}")
        for template in templates:
            lines.append(f"\n----- template {template.name} -----")
            lines.append(template.render(question, tokenizer, **kwargs))
    return "\n".join(lines)


def _default(config: type, key: str) -> Any:
    """The default of ``config``'s field ``key``, as a recipe without the key trains with."""
    return next(f.default for f in dataclasses.fields(config) if f.name == key)


def main(argv: list[str] | None = None) -> None:
    """``python -m prompt_aug.data --dataset PATH_OR_ID [--config RECIPE.yaml] [--question_column COL]
    [--answer_column COL]``: preview a dataset."""
    parser = argparse.ArgumentParser(prog="python -m prompt_aug.data", description=main.__doc__)
    parser.add_argument("--dataset", required=True, help="`synthetic`, a Hub id, or a local path")
    parser.add_argument(
        "--config", help="a recipe YAML: templates, columns, prompt limit and tokenizer come from it"
    )
    parser.add_argument(
        "--dataset_config", help="Hub subset / local sub-folder (e.g. simplelr_qwen_level3to5)"
    )
    parser.add_argument("--split", help="split to load (default: train)")
    parser.add_argument("--question_column", help="the question column (default: the recipe's, else guessed)")
    parser.add_argument(
        "--answer_column", help="the gold-answer column (default: the recipe's, else guessed)"
    )
    parser.add_argument("--tokenizer", help="tokenizer to render prompts with (default: the recipe's model)")
    parser.add_argument("--max_prompt_length", type=int, help="drop prompts longer than this many tokens")
    parser.add_argument(
        "--max_bad_row_share", type=float,
        help="the share of unusable rows training accepts (default: the recipe's, else 0.05)",
    )  # fmt: skip
    from .cli import UsageError
    from .logging_utils import quiet_deprecations

    quiet_deprecations()  # the recipe's config would raise transformers' deprecations before each line
    try:
        print(preview(parser.parse_args(argv)))
    except (DataError, TemplateError, SourceError, UsageError) as err:
        message = re.sub(r"set `(\w+_column)`", r"pass --\1 (or set \1 in the recipe)", str(err))
        raise SystemExit(f"prompt-aug-data: error: {message}") from None


if __name__ == "__main__":
    main()
