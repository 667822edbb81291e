"""Audit every gold answer of the training set and the five evaluation benchmarks against our grader.

For each gold (the SimpleRL level 3-5 train parquet, and aime / amc / math / minerva /
olympiad_bench from the evaluation suite; a list gold counts each element):

1. **parse**: how our gold parser reads it (`rewards.grading.verify.gold_status` after `normalize_gold`):
   parsed to a SymPy object, text-only (math-verify's string fallback: only an identical answer
   matches), or unparseable (the reward would be ``None``); counted by the gold's form; and whether
   the in-process claim `rewards.grading.fastpath.surely_parseable` is ever contradicted;
2. **self**: a completion boxing the gold (as written in the dataset) must grade correct;
3. **cross**: a completion boxing another question's gold (``--others`` random ones per gold, with a
   different normalised text) must grade wrong; exceptions are listed, split into "same value"
   (e.g. ``0.5`` and ``\\frac{1}{2}``: right to accept) and the rest;
4. **near miss**: a completion boxing the gold with one of its integers changed must grade wrong
   (this finds graders that ignore part of an answer, e.g. a base subscript).

Everything is graded through `rewards.grading.grade.grade_batch`, so through the worker pool and its limits.

    python bench/gold_audit.py                         # data from ../shared/data
    python bench/gold_audit.py /path/to/data --others 3 --show 40
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rewards.grading import pool as grader_pool
from rewards.grading.fastpath import constant_values, surely_parseable
from rewards.grading.grade import grade_batch
from rewards.grading.verify import normalize_gold

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grading import near_miss  # the same wrong-answer generator as the grading benchmark

DEFAULT_DATA = REPO.parent / "shared" / "data"
TRAIN_FILE = Path("simplerl_level3to5") / "SimpleRL-simplelr_qwen_level3to5.train.parquet"
BENCHMARKS = ("aime", "amc", "math", "minerva", "olympiad_bench")

# (form, pattern on the raw gold); the first that matches names the form.
FORMS = [
    ("empty", re.compile(r"^\s*$")),
    ("integer", re.compile(r"^\s*\$?-?\d+\$?\s*$")),
    ("decimal", re.compile(r"^\s*\$?-?\d*\.\d+\$?\s*$")),
    ("thousands", re.compile(r"^\s*-?\d{1,3}(,\d{3})+\s*$")),
    ("matrix", re.compile(r"\\begin\{[pbv]?matrix\}")),
    ("base subscript", re.compile(r"^\s*\$?\w+_\{?\d+\}?\$?\s*$")),
    ("degrees", re.compile(r"\\circ|°|\\degree")),
    ("percent", re.compile(r"\\?%")),
    ("units / \\text", re.compile(r"\\(?:text|mbox|mathrm)\{")),
    ("interval / union", re.compile(r"\\cup|\\infty|^\s*[\[(].*,.*[\])]\s*$")),
    ("equation", re.compile(r"=|\\le|\\ge|<|>")),
    ("tuple / list", re.compile(r",")),
    ("scientific", re.compile(r"\\times\s*10\^")),
    ("fraction", re.compile(r"^\s*\$?-?\\[dt]?frac\{?\d+\}?\{?\d+\}?\$?\s*$")),
    ("letters", re.compile(r"^\s*\$?\(?[A-Za-z]+\)?\$?\s*$")),
    ("expression", re.compile(r".")),
]


def form_of(gold: str) -> str:
    """The form of a raw gold, for counting.

    >>> form_of("025"), form_of("\\\\frac{3}{4}"), form_of("(1, 2]"), form_of("20412_5"), form_of("x^2+1")
    ('integer', 'fraction', 'interval / union', 'base subscript', 'expression')
    """
    return next(name for name, pattern in FORMS if pattern.search(gold))


def load_golds(data: Path) -> list[tuple[str, int, Any]]:
    """``(source, question index, gold)`` for every question; a gold may be a list."""
    import datasets
    import pandas as pd

    rows: list[tuple[str, int, Any]] = []
    frame = pd.read_parquet(data / TRAIN_FILE, columns=["reward_model"])
    rows += [("train", i, r["ground_truth"]) for i, r in enumerate(frame["reward_model"])]
    suite = datasets.load_from_disk(str(data / "evaluation_suite"))
    for split in BENCHMARKS:
        rows += [(split, i, answer) for i, answer in enumerate(suite[split]["answer"])]
    return rows


def _elements(gold: Any) -> list[Any]:
    """A list gold's elements as strings; any other gold as the dataset stores it (AMC: a float)."""
    return [str(g) for g in gold] if isinstance(gold, list) else [gold]


def _comparable(text: str) -> str:
    """A gold rewritten so that plain arithmetic can compare it: ``125\\%`` -> ``\\frac{125}{100}``,
    ``1:4`` -> ``\\frac{1}{4}``, ``(C)`` -> ``C``."""
    text = re.sub(r"^(.+?)\\%$", r"\\frac{\1}{100}", text.strip())
    text = re.sub(r"^(\d+)\s*:\s*(\d+)$", r"\\frac{\1}{\2}", text)
    return re.sub(r"^\(([A-Za-z])\)$", r"\1", text)


def _same_value(a: str, b: str) -> bool:
    """Whether two normalised golds are the same constant(s) or the same letter: accepting one for the
    other is right."""
    a, b = _comparable(a), _comparable(b)
    if a == b:
        return True
    va, vb = constant_values(a), constant_values(b)
    if va is None or vb is None or len(va) != len(vb):
        return False
    return all(abs(x - y) <= 1e-6 * max(1.0, abs(x)) for x, y in zip(sorted(va), sorted(vb)))


def audit(rows: list[tuple[str, int, Any]], others: int, seed: int) -> dict[str, Any]:
    elements = [(source, i, text) for source, i, gold in rows for text in _elements(gold)]
    texts = [text for _, _, text in elements]
    normalised = [normalize_gold(t) for t in texts]

    # 1. parse: every distinct normalised gold, in the workers
    distinct = sorted(set(normalised))
    statuses = dict(
        zip(
            distinct,
            [
                o[1] if o[0] == "ok" else o[0]
                for o in grader_pool.get_pool().map("rewards.grading.verify:gold_status", distinct)
            ],
        )
    )
    # our in-process claim "math-verify surely reads this" must never meet an unparseable gold
    surely = [norm for norm in distinct if surely_parseable(norm)]
    contradicted = [norm for norm in surely if statuses[norm] == "unparseable"]
    by_form: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []
    for (source, i, text), norm in zip(elements, normalised):
        status = "unparseable" if not norm else statuses[norm]
        by_form[form_of(str(text))][status] += 1
        if status != "parsed":
            failures.append((source, i, text, norm, status))

    # 2. self: boxing the gold as written grades correct
    start = time.perf_counter()
    grades = grade_batch([f"\\boxed{{{t}}}" for t in texts], texts)
    self_seconds = time.perf_counter() - start
    self_failures = [(e, g) for e, g in zip(elements, grades) if not g.correct]

    # 3. cross: boxing another question's (different) gold grades wrong
    rng = random.Random(seed)
    pairs = []
    for index, norm in enumerate(normalised):
        for _ in range(others):
            other = rng.randrange(len(texts))
            while normalised[other] == norm:
                other = rng.randrange(len(texts))
            pairs.append((index, other))
    start = time.perf_counter()
    cross = grade_batch([f"\\boxed{{{texts[o]}}}" for _, o in pairs], [texts[i] for i, _ in pairs])
    cross_seconds = time.perf_counter() - start
    accepted = [(i, o, g) for (i, o), g in zip(pairs, cross) if g.correct]
    same = [(i, o) for i, o, _ in accepted if _same_value(normalised[i], normalised[o])]
    wrong = [(i, o) for i, o, _ in accepted if not _same_value(normalised[i], normalised[o])]
    # 4. near misses: the gold with one integer changed must grade wrong; each accepted one is listed, to be
    # read (its value is not checked: a change that keeps it, 0^{2} -> 0^{3}, is rightly accepted)
    misses = [(index, near_miss(str(texts[index]), rng)) for index in range(len(texts))]
    misses = [(index, miss) for index, miss in misses if miss is not None]
    start = time.perf_counter()
    graded = grade_batch([f"\\boxed{{{miss}}}" for _, miss in misses], [texts[i] for i, _ in misses])
    miss_seconds = time.perf_counter() - start
    miss_accepted = [(i, miss) for (i, miss), g in zip(misses, graded) if g.correct]
    return {
        "surely": len(surely),
        "contradicted": contradicted,
        "distinct": len(distinct),
        "misses": len(misses),
        "miss_accepted": miss_accepted,
        "miss_seconds": miss_seconds,
        "elements": elements,
        "normalised": normalised,
        "by_form": by_form,
        "failures": failures,
        "self_failures": self_failures,
        "self_seconds": self_seconds,
        "pairs": len(pairs),
        "cross_seconds": cross_seconds,
        "same": same,
        "wrong": wrong,
        # over all three graded batches: self, cross and near misses
        "timeouts": sum(g.timed_out for g in [*grades, *cross, *graded]),
        "timed_out": [  # (gold, boxed answer) of each graded pair that ran out of time
            *[(texts[i], texts[i]) for i, g in enumerate(grades) if g.timed_out],
            *[(texts[i], texts[o]) for (i, o), g in zip(pairs, cross) if g.timed_out],
            *[(texts[i], miss) for (i, miss), g in zip(misses, graded) if g.timed_out],
        ],
        "errors": sum(g.error for g in [*grades, *cross, *graded]),
    }


def report(result: dict[str, Any], show: int) -> None:
    elements, normalised = result["elements"], result["normalised"]
    print(f"{len(elements)} gold answers ({len(set(normalised))} distinct after normalisation)\n")
    print("| form | golds | parsed | text-only | unparseable |")
    print("|---|---:|---:|---:|---:|")
    totals: collections.Counter = collections.Counter()
    for form, _ in FORMS:
        counts = result["by_form"].get(form)
        if not counts:
            continue
        totals.update(counts)
        print(
            f"| {form} | {sum(counts.values())} | {counts['parsed']} | {counts['text-only']} "
            f"| {counts['unparseable']} |"
        )
    print(
        f"| **all** | {sum(totals.values())} | {totals['parsed']} | {totals['text-only']} "
        f"| {totals['unparseable']} |"
    )
    print(
        f"\nknown parseable in-process (fastpath.surely_parseable): "
        f"{result['surely']}/{result['distinct']} distinct golds; "
        f"contradicted by math-verify: {len(result['contradicted'])} {result['contradicted'][:show]}"
    )
    print("\nnot parsed to a SymPy object:")
    for source, i, text, norm, status in result["failures"][:show]:
        print(f"  {status:11s} {source}[{i}] {text!r} -> {norm!r}")
    print(
        f"\nself check (boxing the gold grades correct): "
        f"{len(elements) - len(result['self_failures'])}/{len(elements)} "
        f"in {result['self_seconds']:.1f} s"
    )
    for (source, i, text), grade in result["self_failures"][:show]:
        print(
            f"  FAIL {source}[{i}] {text!r}: extracted {grade.extracted!r}, gold_ok={grade.gold_ok}, "
            f"timed_out={grade.timed_out}, error={grade.error}"
        )
    print(
        f"\ncross check (boxing another question's gold grades wrong): "
        f"{result['pairs'] - len(result['same']) - len(result['wrong'])}"
        f"/{result['pairs']} wrong, in {result['cross_seconds']:.1f} s"
    )
    print(f"  accepted, same value (right): {len(result['same'])}")
    for i, o in result["same"][:show]:
        print(f"    gold {normalised[i]!r} <- answer {normalised[o]!r}")
    print(f"  accepted, different (false positives): {len(result['wrong'])}")
    for i, o in result["wrong"][:show]:
        print(
            f"    gold {normalised[i]!r} <- answer {normalised[o]!r}   ({elements[i][0]}[{elements[i][1]}])"
        )
    print(
        f"\nnear misses (one integer of the gold changed) graded wrong: "
        f"{result['misses'] - len(result['miss_accepted'])}"
        f"/{result['misses']}, in {result['miss_seconds']:.1f} s; accepted:"
    )
    for i, miss in result["miss_accepted"][:show]:
        print(f"    gold {elements[i][2]!r} <- answer {miss!r}   ({elements[i][0]}[{elements[i][1]}])")
    print(f"\ntimeouts {result['timeouts']}, errors {result['errors']}")
    for gold, answer in result["timed_out"]:
        print(f"  timed out: gold {str(gold)!r} <- answer {str(answer)!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "data",
        nargs="?",
        default=str(DEFAULT_DATA),
        help="folder holding simplerl_level3to5/ and evaluation_suite/",
    )
    parser.add_argument("--others", type=int, default=3, help="other questions' golds tried per gold")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=30, help="examples listed per category")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = audit(load_golds(Path(args.data)), args.others, args.seed)
    report(result, args.show)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
