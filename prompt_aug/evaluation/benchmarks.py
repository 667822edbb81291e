"""The benchmarks: the suite's five (``lkevinzc/math-eval``, or a local ``save_to_disk`` copy) and question
sets of one's own, loaded as `Problem` rows; the evaluation templates by name; `EvalError`."""

from __future__ import annotations

import difflib
import logging
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..model_card import hub_id_of
from ..sources import (
    ANSWER_GUESSES,
    DATA_FILES,
    QUESTION_GUESSES,
    as_stored,
    close_local_name,
    gold_text,
    hub_endpoint,
    hub_offline,
    hub_reachable,
    is_conversation,
    is_data_file_name,
    is_hub_id,
    is_verl_layout,
    load_saved,
    looks_local,
    pick_column,
    question_text,
    read_dataset,
    solution_golds,
    verl_gold,
    worked_golds,
)
from ..templates import Template, load_templates

# One logger for all of evaluation.
logger = logging.getLogger("prompt_aug.evaluate")

# The files a question set may be: those training reads (suffix -> datasets loader).
QUESTION_SET_FILES = DATA_FILES
HUB_SUITE = "lkevinzc/math-eval"
# Our benchmark name -> (split of the suite, column header in the tables).
BENCHMARKS: dict[str, tuple[str, str]] = {
    "aime24": ("aime", "AIME24"),
    "amc": ("amc", "AMC"),
    "math500": ("math", "MATH500"),
    "minerva": ("minerva", "Minerva"),
    "olympiadbench": ("olympiad_bench", "Olympiad"),
}
# Questions in each benchmark of the suite (1,560 in all): a copy that holds other counts is not the suite.
SUITE_QUESTIONS = {"aime24": 30, "amc": 83, "math500": 500, "minerva": 272, "olympiadbench": 675}
QUESTION_FIELD, ANSWER_FIELD = "problem", "answer"


class EvalError(ValueError):
    """Bad evaluation input (benchmark, data folder, template, settings); the message says which."""


@dataclass(frozen=True)
class Problem:
    """One benchmark question. ``gold`` lists the acceptable answers (any match counts)."""

    benchmark: str
    index: int
    question: str
    gold: list[str]


def normalize_gold(answer: Any) -> list[str]:
    """The gold answer(s) as strings; whole floats (AMC stores ``142.0``) lose their ``.0``.

    >>> normalize_gold(142.0), normalize_gold(["9.6\\n"]), normalize_gold("\\\\frac{1}{2}")
    (['142'], ['9.6'], ['\\\\frac{1}{2}'])
    >>> normalize_gold(None), normalize_gold(float("nan")), normalize_gold(["", None])
    ([], [], [])
    """
    values = answer if isinstance(answer, (list, tuple)) else [answer]
    golds = []
    for value in values:
        if value is None or (isinstance(value, float) and math.isnan(value)):  # a missing gold: none
            continue
        golds.append(gold_text(value).strip())
    return [g for g in golds if g]


def parse_benchmarks(spec: str | list[str]) -> list[str]:
    """Benchmark names from ``"amc,aime24"`` (or a list): the suite's in its order, then question sets.

    A question set of one's own is a local file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``), a
    ``save_to_disk`` folder or a Hub dataset id, with a question and a gold column; see `load_benchmark`.

    >>> parse_benchmarks("math500, aime24")
    ['aime24', 'math500']
    >>> parse_benchmarks("my_questions.jsonl,amc")
    ['amc', 'my_questions.jsonl']
    """
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    names = list(dict.fromkeys(n for n in names if n))
    unknown = [n for n in names if n not in BENCHMARKS and not is_question_set(n)]
    if unknown or not names:
        guesses = [f"{close} for {name}" for name in unknown if (close := close_benchmark(name))]
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        raise EvalError(
            f"unknown benchmark(s) {unknown or spec!r}{hint}; known: {', '.join(BENCHMARKS)}, or a question "
            "set (a .jsonl/.json/.parquet/.csv file, a save_to_disk folder or a Hub dataset id)"
        )
    return [b for b in BENCHMARKS if b in names] + [n for n in names if n not in BENCHMARKS]


def close_benchmark(name: str) -> str | None:
    """The suite benchmark ``name`` was probably meant for (another case, the suite's split or column name,
    a near spelling), or None.

    >>> [close_benchmark(n) for n in ("olympiad_bench", "AIME24", "math", "gsm8k")]
    ['olympiadbench', 'aime24', 'math500', None]
    """
    aliases = {alias.lower(): b for b, names in BENCHMARKS.items() for alias in (b, *names)}
    match = difflib.get_close_matches(name.strip().lower(), list(aliases), n=1, cutoff=0.6)
    return aliases[match[0]] if match else None


def check_distinct(benchmarks: list[str]) -> None:
    """Raise `EvalError` when two of ``benchmarks`` are one question set (a file under two spellings) or
    would share a column of the table (two files of one stem), rather than count one set twice."""
    places: dict[str, str] = {}
    titles: dict[str, str] = {}
    for name in benchmarks:
        place, title = benchmark_place(name), benchmark_title(name)
        if place in places:
            raise EvalError(f"--benchmarks: {places[place]} and {name} are one question set; give it once")
        if title in titles:
            raise EvalError(
                f"--benchmarks: {titles[title]} and {name} would share the column {title!r} of the table; "
                "rename a file to tell them apart"
            )
        places[place], titles[title] = name, name


def benchmark_place(name: str) -> str:
    """What ``name`` is kept as in records and results: a local question set's absolute path (resolved from
    the working folder, so any spelling of one file gives one), anything else as it is.

    >>> benchmark_place("amc"), benchmark_place("my-org/my-questions")
    ('amc', 'my-org/my-questions')
    >>> benchmark_place("sums.jsonl") == str(Path.cwd().resolve() / "sums.jsonl")
    True
    """
    path = Path(name).expanduser()
    local = name not in BENCHMARKS and (is_data_file_name(name) or path.exists())
    return str(path.resolve()) if local else name


def is_question_set(name: str) -> bool:
    """Whether ``name`` names a question set of one's own (a data file, a folder, a Hub id), not a suite
    benchmark.

    >>> is_question_set("sums.jsonl"), is_question_set("my-org/my-questions"), is_question_set("math500")
    (True, True, False)
    """
    if name in BENCHMARKS:
        return False
    path = Path(name).expanduser()
    return is_data_file_name(name) or looks_local(name) or path.exists() or is_hub_id(name)


def benchmark_title(name: str) -> str:
    """The column header of a benchmark: the suite's title, or a question set's file or dataset name."""
    if name in BENCHMARKS:
        return BENCHMARKS[name][1]
    return Path(name).stem if is_data_file_name(name) else name.rstrip("/").split("/")[-1]


def hub_dataset(name: str, questions: int | None = None) -> dict[str, str] | None:
    """Where benchmark ``name`` lives on the Hub, for the card's ``model-index``: the suite's dataset and
    split, or a question set's own Hub id; None for a local file or folder (it has no page to link). The
    suite read from a local copy (``--data_dir``) is still the suite where it holds the suite's number of
    ``questions`` (`SUITE_QUESTIONS`); a copy with others is not.

    >>> hub_dataset("aime24"), hub_dataset("my-org/my-questions"), hub_dataset("/data/sums.jsonl")
    ({'type': 'lkevinzc/math-eval', 'split': 'aime', 'name': 'AIME24'}, {'type': 'my-org/my-questions', \
'name': 'my-questions'}, None)
    >>> hub_dataset("aime24", questions=2) is None
    True
    """
    if name in BENCHMARKS:
        if questions is not None and questions != SUITE_QUESTIONS[name]:
            return None
        split, title = BENCHMARKS[name]
        return {"type": HUB_SUITE, "split": split, "name": title}
    if hub_id_of(name):
        return {"type": name, "name": benchmark_title(name)}
    return None


def metric_name(name: str) -> str:
    """Benchmark ``name`` as it appears in ``eval/<name>/accuracy``: the suite's name, or a question set's
    file stem or dataset name (no folders, so the key is the same on every machine and W&B nests nothing).

    >>> metric_name("math500"), metric_name("/data/runs/sums.jsonl"), metric_name("my-org/my-questions")
    ('math500', 'sums', 'my-questions')
    """
    return name if name in BENCHMARKS else benchmark_title(name)


def _from_hub(what: str, repo_id: str, load: Callable[[], Any], local: str) -> Any:
    """``load()`` of ``repo_id``; any failure (an unreachable Hub, at once; offline without a cached copy, a
    missing or private repo) is one `EvalError` naming ``what``.

    ``local`` says how to give a local copy instead.
    """
    if not hub_offline() and not hub_reachable():  # at once, rather than after the client's retries
        raise EvalError(
            f"{what}: cannot reach the Hugging Face Hub ({hub_endpoint()}) to fetch {repo_id!r}; set "
            f"HF_HUB_OFFLINE=1 to use a copy in the Hugging Face cache, or {local}"
        )
    try:
        return load()
    except EvalError:
        raise
    except Exception as err:
        cause = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
        hint = (
            "HF_HUB_OFFLINE is set and the Hugging Face cache has no copy"
            if hub_offline()
            else "check the id and the connection, "
            "or set HF_HUB_OFFLINE=1 to use a copy in the Hugging Face cache"
        )
        raise EvalError(
            f"{what}: could not load it from the Hugging Face Hub ({cause}); {hint}; or {local}"
        ) from err


def _load_question_set(name: str, text_columns: tuple[str | None, ...] = ()) -> Any:
    """A question set's rows as stored (``text_columns``: the columns a CSV file's text is kept in, beside
    the guessed ones)."""
    import datasets

    path = Path(name).expanduser()
    if is_data_file_name(name):
        if not path.is_file():
            close = close_local_name(name)
            raise EvalError(
                f"question set {name}: no such file" + (f"; did you mean {close!r}?" if close else "")
            )
        # a file that does not parse, or holds no rows, is one line
        return read_dataset(str(path), text_columns=text_columns)
    if path.is_dir():
        loaded = load_saved(path, f"question set {name}")
    elif path.is_file():
        raise EvalError(
            f"question set {name}: a file of a kind not read; give a {'/'.join(QUESTION_SET_FILES)} file, "
            "or a save_to_disk folder"
        )
    elif looks_local(name):  # a path (./sets/q, /data/q, a/b/c, data/q with data/ here), not a Hub id
        close = close_local_name(name)
        fix = f"did you mean {close!r}?" if close else "fix the path, or give a Hub dataset id (owner/name)"
        raise EvalError(f"question set {name}: no such file or folder (resolved to {path.resolve()}); {fix}")
    else:
        loaded = _from_hub(
            f"question set {name}", name, lambda: datasets.load_dataset(name), "give a file or folder"
        )
    if isinstance(loaded, datasets.DatasetDict):
        if "test" not in loaded and len(loaded) != 1:
            raise EvalError(
                f"question set {name} has splits {sorted(loaded)}; expected a `test` split or only one"
            )
        loaded = loaded["test"] if "test" in loaded else next(iter(loaded.values()))
    return loaded


_SUITES: dict[str, Any] = {}


def _load_split(split: str, data_dir: str | Path | None) -> Any:
    import datasets

    if data_dir is None:

        def load() -> Any:
            try:
                return datasets.load_dataset(HUB_SUITE, split=split)
            except ValueError as err:  # an unknown split
                raise EvalError(f"{HUB_SUITE} has no split {split!r}: {err}") from err

        return _from_hub(
            f"suite {HUB_SUITE}",
            HUB_SUITE,
            load,
            "give a local copy of the suite (--data_dir, eval_data_dir)",
        )
    key = str(Path(data_dir).resolve())
    if key not in _SUITES:
        if not Path(data_dir).is_dir():
            raise EvalError(f"--data_dir {data_dir}: no such folder")
        _SUITES[key] = load_saved(data_dir, f"--data_dir {data_dir}")
    suite = _SUITES[key]
    if not isinstance(suite, datasets.DatasetDict):
        splits = ", ".join(split for split, _ in BENCHMARKS.values())
        above = Path(data_dir).resolve().parent
        fix = (
            f"give the folder that holds it, {above}"
            if (above / "dataset_dict.json").is_file()
            else f"give a save_to_disk copy of {HUB_SUITE}, a DatasetDict with the splits {splits}"
        )
        raise EvalError(f"--data_dir {data_dir} holds a single Dataset (one split); {fix}")
    if split not in suite:
        raise EvalError(f"--data_dir {data_dir} has no split {split!r}; it has {sorted(suite)}")
    return suite[split]


def load_benchmark(
    name: str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    question_column: str | None = None,
    answer_column: str | None = None,
    column_keys: tuple[str, str] = ("--question_column", "--answer_column"),
) -> list[Problem]:
    """The questions of benchmark ``name`` (the first ``limit`` of them only, if given; rows without a
    question or a gold answer are left out before the count).

    A suite benchmark comes from the Hub or ``data_dir``; a question set (see `parse_benchmarks`) from
    its file, folder or Hub id, with its question in ``question_column`` and its gold in ``answer_column``,
    found as training finds them when not named (`sources.QUESTION_GUESSES`, `sources.ANSWER_GUESSES`): a
    ``solution`` column gives the last ``\\boxed{}`` of each solution. The suite's columns are fixed, so the
    mapping applies to question sets only. ``column_keys`` are the settings an error tells to set (the
    command's flags, or the recipe keys during training).
    """
    name = parse_benchmarks(name)[0]
    if name in BENCHMARKS:
        split = BENCHMARKS[name][0]
        ds, where, questions, answers = (
            _load_split(split, data_dir),
            f"benchmark {name} (split {split!r})",
            QUESTION_FIELD,
            ANSWER_FIELD,
        )
    else:
        ds, where = _load_question_set(name, (question_column, answer_column)), f"question set {name}"
        verl = is_verl_layout(ds.column_names, question_column, answer_column)
        if verl:  # as training reads it
            ds = ds.map(lambda row: {"answer": verl_gold(row["reward_model"])})
            question_column, answer_column = "prompt", "answer"
        questions = pick_column(ds.column_names, question_column, QUESTION_GUESSES)
        answers = pick_column(ds.column_names, answer_column, ANSWER_GUESSES)
        for found, guesses, key in (
            (questions, QUESTION_GUESSES, column_keys[0]),
            (answers, ANSWER_GUESSES, column_keys[1]),
        ):
            if found is None:
                raise EvalError(
                    f"{where}: none of the columns {list(guesses)} is there (it has {ds.column_names}); "
                    f"name the column with {key}"
                )
    missing = [f for f in (questions, answers) if f not in ds.column_names]
    if missing:
        hint = "" if name in BENCHMARKS else f"; name the columns with {column_keys[0]} and {column_keys[1]}"
        raise EvalError(f"{where} lacks column(s) {missing}; it has {ds.column_names}{hint}")
    golds = as_stored(list(ds[answers]), ds.features[answers])
    if name not in BENCHMARKS:
        if answers == "solution":  # a worked solution: its boxed answer, as training reads it
            golds, _ = solution_golds(golds)
        elif not verl:  # GSM8K's `#### 72`, or a worked answer's last box, as training reads it
            golds, _, _ = worked_golds(golds)
        odd = next((g for g in golds if g is not None and not _gold_like(g)), None)
        if odd is not None:
            raise EvalError(
                f"{where}: column {answers!r} holds {type(odd).__name__} values ({str(odd)[:80]}), not "
                f"answers; name the gold column with {column_keys[1]}"
            )
        asked = next((q for q in ds[questions] if not _question_like(q)), None)
        if asked is not None:
            raise EvalError(
                f"{where}: column {questions!r} holds {type(asked).__name__} values ({str(asked)[:80]}), not "
                "questions (text or a conversation); a JSON file of columns is one row: write one record a "
                f"line (JSON Lines) or a list of records, or name the question column with {column_keys[0]}"
            )
    problems = [
        Problem(
            name,
            i,
            # The suite's question as stored (the paper's prompts); a question set's read as training reads
            # it (a conversation's user turn, stripped).
            str(row[questions]) if name in BENCHMARKS else question_text(row[questions]),
            normalize_gold(gold),
        )
        for i, (row, gold) in enumerate(zip(ds, golds, strict=True))
    ]
    kept = [p for p in problems if p.question and p.gold]  # each keeps its row index, for resumes
    if len(kept) < len(problems):
        logger.warning(
            "%s: %d of %d rows have no question or no gold answer and are left out", where,
            len(problems) - len(kept), len(problems),
        )  # fmt: skip
    if not kept:
        raise EvalError(f"{where}: no row has both a question and a gold answer")
    return kept if limit is None else kept[:limit]  # the first questions kept, not the first rows


def _question_like(value: Any) -> bool:
    """Whether ``value`` is a question: text, a conversation, or missing (the row is left out)."""
    return value is None or isinstance(value, (str, numbers.Real)) or is_conversation(value)


def _gold_like(value: Any) -> bool:
    """Whether ``value`` is a gold answer: text, a number, or a list of them."""
    values = value if isinstance(value, list) else [value]
    return all(v is None or isinstance(v, (str, numbers.Real, Decimal)) for v in values)


def parse_templates(spec: str, templates_file: str | Path | None = None) -> list[Template]:
    """``"qwen-math"``, ``"abel,open-r1"`` or ``"all"`` (the whole bank, in file order)."""
    bank = load_templates(templates_file)
    if spec.strip() == "all":
        return list(bank.values())
    names = list(dict.fromkeys(s.strip() for s in spec.split(",") if s.strip()))
    unknown = [n for n in names if n not in bank]
    if unknown or not names:
        raise EvalError(f"unknown template(s) {unknown or spec!r}; known: {', '.join(bank)} (or `all`)")
    return [bank[n] for n in names]
