"""Grading throughput and robustness: ours (`rewards.grading.grade.grade_batch`) vs TRL's `accuracy_reward`.

Both graders get the same inputs, built from the ground truths of the SimpleRL level 3-5 train set:

(a) a realistic GRPO batch: 128 questions x 8 completions = 1,024, each question under one of the 13
    templates, each completion written in that template's format (``<think>/<answer>`` tags, "The
    final answer is:", ``<solution>/<check>``, a plain boxed answer): 40% the gold as written, 15% an
    equivalent form (``x = 5``, ``5.0``, ``\\dfrac``, thousands separators, ``$...$``), 40% wrong
    (three in four a near miss of the gold's shape: one of its integers changed; one in four another
    question's gold) and 5% cut off before any final answer;
(b) the same batch with 16 pathological completions mixed in: towers of exponents (4), huge sums,
    products and integrals (4), deep nesting (4), megabytes of text (4);
(c) a mixed-shape batch: 1,024 completions built as (a), then each one, with probability 1/2,
    rewritten to answer with another question's gold (so usually an answer of another shape: an
    expression against a number, a tuple against a fraction).

Ours is timed cold (a fresh pool: includes starting it) and warm (a fresh pool warmed up on a batch
of other questions; nothing about these questions cached). TRL gets each raw gold boxed (its parser
needs LaTeX delimiters: a bare ``\\frac{2 \\sqrt{2}}{3}`` parses to nothing and the completion is
skipped). TRL runs in a child process's main thread, so math-verify's own signal timeouts are on, as
in a trainer; it is warmed up the same way. Warm figures are the median of ``--repeats`` runs. Each
pathological completion is also timed alone (TRL capped at ``--item-cap-s``); if TRL's whole
pathological batch passes ``--trl-cap-s``, its time is estimated from those (and reported as an
estimate).

    python bench/grading.py                      # data from ../shared/data/simplerl_level3to5
    python bench/grading.py /path/to/simplerl_level3to5 --trl-cap-s 300
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing as mp
import os
import queue as queue_module
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prompt_aug.templates import load_templates
from rewards.grading import grade as grade_module
from rewards.grading import pool as grader_pool
from rewards.grading.extract import extract_lenient
from rewards.grading.grade import grade_batch

DEFAULT_DATA = REPO.parent / "shared" / "data" / "simplerl_level3to5"  # from a clone in /work: ../shared/data
TRAIN_FILE = "SimpleRL-simplelr_qwen_level3to5.train.parquet"
GROUP = 8

STEPS = [
    (
        "First, let us restate the problem in symbols: we are asked for a single quantity, "
        "so we set up the relations."
    ),
    (
        "Let $a$ and $b$ be the unknowns. From the first condition, $a + b = 12$, "
        "and from the second, $ab = 35$."
    ),
    "Substituting gives $a^2 - 12a + 35 = 0$, so $(a-5)(a-7) = 0$ and $a \\in \\{5, 7\\}$.",
    (
        "We compute $\\frac{3}{4} \\cdot \\frac{8}{9} = \\frac{2}{3}$, "
        "and therefore the ratio simplifies nicely."
    ),
    "By the Pythagorean theorem, $c = \\sqrt{3^2 + 4^2} = 5$, which we use in the next step.",
    "Summing the arithmetic series, $\\sum_{k=1}^{10} k = 55$, and the remaining terms cancel in pairs.",
    (
        "Checking small cases: $n = 1$ gives $2$, $n = 2$ gives $6$, $n = 3$ gives $12$, "
        "so the pattern is $n(n+1)$."
    ),
    (
        "Since $\\sin^2 x + \\cos^2 x = 1$, we get $\\cos x = \\pm \\frac{\\sqrt{3}}{2}$ "
        "and only the positive root fits."
    ),
    "Modulo $7$, the powers of $3$ cycle with period $6$: $3, 2, 6, 4, 5, 1$.",
    "Multiplying both sides by $2x - 1 \\neq 0$ and collecting terms gives a linear equation in $x$.",
]


def _reasoning(rng: random.Random) -> str:
    return "\n".join(rng.sample(STEPS, k=rng.randint(4, 8)))


def render(template: Any, reasoning: str, answer: str | None) -> str:
    """A completion in ``template``'s format (the part after its prefill), boxing ``answer`` (None: none)."""
    if answer is None:  # cut off by the length limit: no final answer
        return reasoning[: len(reasoning) * 2 // 3]
    boxed = f"\\boxed{{{answer}}}"
    name = template.name
    if name.startswith("open-r1"):
        head = "" if template.prefill else "<think>\n"
        return f"{head}{reasoning}\n</think>\n<answer>\nThe answer is {boxed}\n</answer>"
    if name.startswith("deepseek-r1"):
        head = "" if template.prefill else "<think> "
        return f"{head}{reasoning} </think> <answer> {boxed} </answer>"
    if name.startswith("reflective"):
        head = "" if template.prefill else "<solution>\n"
        return (
            f"{head}{reasoning}\n</solution>\n<check>\nLet's verify step by step: substituting back, "
            f"both conditions hold.\n</check>\nTherefore the answer is {boxed}."
        )
    if name.startswith(("lm_eval_prompt1", "lm_eval_prompt4")):
        return f"{reasoning}\nThe final answer is: {boxed}"
    return f"{reasoning}\nSo the answer is {boxed}."


def equivalent_form(gold: str, rng: random.Random) -> str:
    """The gold written another way that a careful grader should accept."""
    text = gold.strip()
    if text.lstrip("-").isdigit():
        return rng.choice(
            [f"{text}.0", f"x = {text}", f"{int(text):,}" if abs(int(text)) >= 1000 else f"0{text}"]
        )
    if text.startswith("\\frac"):
        return text.replace("\\frac", "\\dfrac", 1)
    return f"${text}$"


def near_miss(gold: str, rng: random.Random) -> str | None:
    """The gold with one of its integers changed: a wrong answer of the same shape, or ``None``."""
    numbers = list(re.finditer(r"\d+", gold))
    if not numbers:
        return None
    match = rng.choice(numbers)
    value = int(match.group()) + rng.choice([1, 2] if match.group() == "0" else [-1, 1, 2])
    return gold[: match.start()] + str(value) + gold[match.end() :]


def wrong_form(gold: str, others: list[str], rng: random.Random) -> str:
    """A wrong answer: usually a near miss of the same shape, sometimes another question's gold."""
    if rng.random() < 0.75 and (miss := near_miss(gold, rng)) is not None and miss != gold:
        return miss
    other = rng.choice(others)
    while other == gold:
        other = rng.choice(others)
    return other


def build_batch(
    golds: list[str], n: int, rng: random.Random, templates: list[Any]
) -> tuple[list[str], list[str], list[str]]:
    """``n`` completions (``n / 8`` questions x 8), their golds and template names."""
    completions, answers, names = [], [], []
    for q in range(n // GROUP):
        gold = rng.choice(golds)
        template = templates[q % len(templates)]
        for _ in range(GROUP):
            roll = rng.random()
            if roll < 0.40:
                answer = gold
            elif roll < 0.55:
                answer = equivalent_form(gold, rng)
            elif roll < 0.95:
                answer = wrong_form(gold, golds, rng)
            else:
                answer = None
            completions.append(render(template, _reasoning(rng), answer))
            answers.append(gold)
            names.append(template.name)
    return completions, answers, names


def other_gold(gold: str, others: list[str], rng: random.Random) -> str:
    """Another question's gold, with a different text: usually an answer of another shape."""
    other = rng.choice(others)
    while other.strip() == gold.strip():
        other = rng.choice(others)
    return other


def build_mixed_batch(
    golds: list[str], n: int, rng: random.Random, templates: list[Any]
) -> tuple[list[str], list[str], list[str]]:
    """Like `build_batch`, but half of the completions answer with another question's gold (so usually
    another shape: an expression against a number, a tuple against a fraction); the other half are
    drawn as in the realistic batch."""
    completions, answers, names = build_batch(golds, n, rng, templates)
    for i in range(n):
        if rng.random() < 0.5:
            completions[i] = render(
                templates[(i // GROUP) % len(templates)], _reasoning(rng), other_gold(answers[i], golds, rng)
            )
    return completions, answers, names


PATHOLOGICAL = {
    "tower 10^{10^{10}}": "\\boxed{10^{10^{10}}}",
    "tower 9^{9^{9^{9}}}": "so the answer is \\boxed{9^{9^{9^{9}}}}.",
    "tower of eight 2s": "\\boxed{" + "2^{" * 8 + "2" + "}" * 8 + "}",
    "(10^{100})!": "\\boxed{(10^{100})!}",
    "sum of n^n to 10^6": "\\boxed{\\sum_{n=1}^{10^{6}} n^n}",
    "5,000 ones added": "\\boxed{" + "+".join(["1"] * 5000) + "}",
    "product to 10^9": "\\boxed{\\prod_{k=1}^{10^{9}} k}",
    "integral of e^{x^{x^x}}": "\\boxed{\\int_0^{1} e^{x^{x^x}} dx}",
    "40 nested parentheses": "\\boxed{" + "(" * 40 + "1" + ")" * 40 + "}",
    "20 nested fractions": "\\boxed{" + "\\frac{" * 20 + "1}{2}" * 20 + "}",
    "12 nested radicals": "\\boxed{" + "\\sqrt{" * 12 + "2" + "}" * 12 + "}",
    "30 nested braces": "\\boxed{" + "{" * 30 + "1" + "}" * 30 + "}",
    "1 MB of prose": "lorem ipsum dolor sit amet " * 40_000,
    "1 MB boxed number": "\\boxed{" + "9" * 1_000_000 + "}",
    "1 MB 'final answer is $'": "final answer is $1 " * 55_000,
    "1 MB of unclosed boxes": "\\boxed{" * 150_000,
}


def with_pathological(batch: tuple[list[str], list[str], list[str]], rng: random.Random):
    completions, answers, names = (list(x) for x in batch)
    for text in PATHOLOGICAL.values():
        at = rng.randrange(len(completions) + 1)
        completions.insert(at, text)
        answers.insert(at, answers[min(at, len(answers) - 1)])
        names.insert(at, "qwen-math")
    return completions, answers, names


# -- timing ------------------------------------------------------------------------------------------


def time_ours(batch) -> tuple[float, list]:
    completions, answers, names = batch
    start = time.perf_counter()
    grades = grade_batch(completions, answers, names)
    return time.perf_counter() - start, grades


def clear_gold_caches() -> None:
    grade_module._gold_texts.cache_clear()
    grade_module._PARSEABLE.clear()


def _trl_child(warmup, batch, queue) -> None:
    logging.disable(logging.WARNING)  # TRL's grader logs every timeout with its whole input
    from trl.rewards import accuracy_reward

    def run(b):
        # Raw golds have no LaTeX delimiters, and TRL's parser needs them (a bare `\frac{2\sqrt{2}}{3}`
        # parses to nothing and the completion is skipped), so TRL gets each gold boxed.
        solutions = [f"\\boxed{{{g}}}" for g in b[1]]
        return accuracy_reward([[{"role": "assistant", "content": c}] for c in b[0]], solutions)

    if warmup is not None:
        run(warmup)
    start = time.perf_counter()
    rewards = run(batch)
    queue.put((time.perf_counter() - start, rewards))


def time_trl(warmup, batch, cap_s: float) -> tuple[float | None, list | None]:
    """TRL's reward on ``batch`` in a fresh process's main thread; ``(None, None)`` past ``cap_s``."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_trl_child, args=(warmup, batch, queue))
    child.start()
    try:
        return queue.get(timeout=cap_s)
    except queue_module.Empty:  # capped
        return None, None
    finally:
        child.kill()
        child.join()


def _warm_run(warmup, batch) -> tuple[float, list]:
    grader_pool.configure()  # fresh workers: nothing of the previous run cached
    time_ours(warmup)
    clear_gold_caches()
    return time_ours(batch)


def _median(runs: list[tuple[float | None, Any]]) -> tuple[float | None, Any]:
    """The run with the median time (a capped run counts as slowest)."""
    ordered = sorted(runs, key=lambda run: math.inf if run[0] is None else run[0])
    return ordered[len(ordered) // 2]


def settled_in_process(batch) -> tuple[int, int]:
    """How many completions of ``batch`` the fast path and guards settle without a worker, and how
    many distinct tasks the others make (identical tasks are sent once)."""
    settled, tasks = 0, set()
    for completion, gold in zip(batch[0], batch[1]):
        texts = grade_module._gold_texts(gold)
        answer = extract_lenient(completion) if grade_module._in_process_ok(completion) else completion
        if grade_module._in_process_ok(completion) and grade_module._settle(answer, texts) is not None:
            settled += 1
        else:
            tasks.add((answer, texts))
    return settled, len(tasks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "data", nargs="?", default=str(DEFAULT_DATA), help="folder with the SimpleRL level 3-5 parquet"
    )
    parser.add_argument("--n", type=int, default=1024, help="completions in the realistic batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trl-cap-s", type=float, default=300.0, help="wall-time cap for one TRL run")
    parser.add_argument(
        "--item-cap-s", type=float, default=30.0, help="cap per pathological completion alone"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per warm measurement (median reported)"
    )
    args = parser.parse_args(argv)

    import pandas as pd

    frame = pd.read_parquet(Path(args.data) / TRAIN_FILE, columns=["reward_model"])
    golds = [str(r["ground_truth"]) for r in frame["reward_model"]]
    templates = list(load_templates().values())
    rng = random.Random(args.seed)
    warmup = build_batch(golds, args.n, random.Random(args.seed + 1), templates)
    batch = build_batch(golds, args.n, rng, templates)
    patho = with_pathological(batch, rng)
    mixed = build_mixed_batch(golds, args.n, random.Random(args.seed + 2), templates)
    config = grader_pool.get_pool().config
    print(
        f"pool: {config.workers} workers, {config.time_limit_s} s hard limit per completion, "
        f"{config.memory_mb} MiB cap"
    )
    print(
        f"(a) {len(batch[0])} completions over {len(set(batch[1]))} golds and {len(templates)} templates; "
        f"(b) the same plus {len(PATHOLOGICAL)} pathological "
        f"({sum(map(len, PATHOLOGICAL.values())) / 1e6:.1f} MB)"
    )

    # ours, cold: a fresh pool and empty caches
    grader_pool.configure()
    clear_gold_caches()
    ours_cold, _ = time_ours(batch)
    # ours, warm: a fresh pool warmed up on other questions, parent gold caches cleared; median of 3
    ours_warm, ours_grades = _median([_warm_run(warmup, batch) for _ in range(args.repeats)])
    clear_gold_caches()
    settled, remote_tasks = settled_in_process(batch)  # with nothing learned from workers yet
    ours_mixed, mixed_grades = _median([_warm_run(warmup, mixed) for _ in range(args.repeats)])
    clear_gold_caches()
    settled_mixed, remote_mixed = settled_in_process(mixed)
    ours_patho, patho_grades = _median([_warm_run(warmup, patho) for _ in range(args.repeats)])
    timeouts = sum(g.timed_out for g in patho_grades)
    errors = sum(g.error for g in patho_grades)

    print("timing TRL on (a) ...", flush=True)
    trl_a, trl_rewards = _median([time_trl(warmup, batch, args.trl_cap_s) for _ in range(args.repeats)])
    print("timing TRL on (c) ...", flush=True)
    trl_c, trl_mixed = _median([time_trl(warmup, mixed, args.trl_cap_s) for _ in range(args.repeats)])
    print("timing TRL on (b) ...", flush=True)
    trl_b, _ = time_trl(warmup, patho, args.trl_cap_s)
    # each pathological completion alone: ours on a warm pool, TRL in a fresh child (capped)
    print("timing each pathological completion alone ...", flush=True)
    alone = []
    grader_pool.configure()
    grade_module.grade("\\boxed{\\sqrt{4}}", "2")  # start the pool
    for name, text in PATHOLOGICAL.items():
        start = time.perf_counter()
        verdict = grade_module.grade(text, "5")
        ours_seconds = time.perf_counter() - start
        trl_seconds, trl_reward = time_trl(None, ([text], ["5"], ["qwen-math"]), args.item_cap_s)
        alone.append((name, len(text), ours_seconds, verdict, trl_seconds, trl_reward))
    extrapolated = None
    if trl_b is None:
        extrapolated = (trl_a or 0.0) + sum(args.item_cap_s if t is None else t for *_, t, _ in alone)

    n_a, n_b = len(batch[0]), len(patho[0])
    ours_correct = sum(g.correct for g in ours_grades)
    rows = [
        ("(a) realistic, ours, cold pool", ours_cold, n_a),
        ("(a) realistic, ours, warm pool", ours_warm, n_a),
        ("(a) realistic, TRL accuracy_reward", trl_a, n_a),
        ("(b) + 16 pathological, ours, warm pool", ours_patho, n_b),
        ("(b) + 16 pathological, TRL accuracy_reward", trl_b, n_b),
        ("(c) mixed shapes, ours, warm pool", ours_mixed, len(mixed[0])),
        ("(c) mixed shapes, TRL accuracy_reward", trl_c, len(mixed[0])),
    ]
    print()
    print("| run | wall time (s) | completions / s |")
    print("|---|---:|---:|")
    for name, seconds, n in rows:
        if seconds is None:
            estimate = (
                f" (capped at {args.trl_cap_s:.0f} s; estimate {extrapolated:.0f} s)" if extrapolated else ""
            )
            print(f"| {name} | > {args.trl_cap_s:.0f}{estimate} | - |")
        else:
            print(f"| {name} | {seconds:.2f} | {n / seconds:,.0f} |")
    print()
    if trl_a:
        print(f"(a) speed-up, warm: {trl_a / ours_warm:.1f}x; cold: {trl_a / ours_cold:.1f}x")
    if trl_c:
        print(f"(c) speed-up, warm: {trl_c / ours_mixed:.1f}x")
    trl_b_value = trl_b if trl_b is not None else extrapolated
    if trl_b_value:
        print(
            f"(b) speed-up: {trl_b_value / ours_patho:.1f}x"
            f"{'' if trl_b is not None else ' (vs the estimate)'}"
        )
    print(
        f"(a) settled in-process (fast path, guards): {settled}/{n_a}; the other {n_a - settled} went to the "
        f"pool as {remote_tasks} distinct tasks"
    )
    print(
        f"(a) graded correct: ours {ours_correct}/{n_a}, TRL {sum(r == 1.0 for r in trl_rewards or [])}/{n_a}"
    )
    if trl_rewards:
        disagree = sum(float(g.correct) != r for g, r in zip(ours_grades, trl_rewards))
        print(f"(a) verdicts differing between ours and TRL: {disagree}")
    print(
        f"(c) settled in-process: {settled_mixed}/{len(mixed[0])}; "
        f"the other {len(mixed[0]) - settled_mixed} went to the "
        f"pool as {remote_mixed} distinct tasks"
    )
    if trl_mixed:
        print(
            f"(c) graded correct: ours {sum(g.correct for g in mixed_grades)}, "
            f"TRL {sum(r == 1.0 for r in trl_mixed)}; "
            f"verdicts differing: {sum(float(g.correct) != r for g, r in zip(mixed_grades, trl_mixed))}"
        )
    print(f"load average during the run (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    bad = set(PATHOLOGICAL.values())
    bad_grades = [g for g, text in zip(patho_grades, patho[0]) if text in bad]
    print()
    print(
        "| pathological completion | chars | ours alone (s) | ours: score, flag | TRL alone (s) | TRL score |"
    )
    print("|---|---:|---:|---|---:|---|")
    for name, chars, ours_seconds, verdict, trl_seconds, trl_reward in alone:
        flag = "timeout" if verdict.timed_out else "error" if verdict.error else "-"
        trl_time = f"> {args.item_cap_s:.0f} (capped)" if trl_seconds is None else f"{trl_seconds:.2f}"
        trl_score = "-" if trl_reward is None else trl_reward[0]
        print(
            f"| {name} | {chars:,} | {ours_seconds:.2f} | {float(verdict.correct)}, {flag} "
            f"| {trl_time} | {trl_score} |"
        )
    print(
        f"(b) pathological completions scoring 0: "
        f"{sum(not g.correct for g in bad_grades)}/{len(bad_grades)}; "
        f"counted as timeouts {timeouts}, errors {errors}"
    )


if __name__ == "__main__":
    main()
