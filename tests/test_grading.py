"""Grading that never hangs, is fast, and tells the truth.

Runs offline on CPU in well under a minute; needs no data beyond what is written here.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import pytest

from rewards import correctness_reward, extract_lenient, grade, normalize, strict_correctness_reward
from rewards.grading import fastpath
from rewards.grading import pool as grader_pool
from rewards.grading.fastpath import as_number, fast_verdict, surely_parseable
from rewards.grading.grade import IN_PROCESS_MAX_CHARS, Grade, grade_batch
from rewards.grading.verify import is_equivalent, normalize_gold, parse_text

LIMIT_S = grader_pool.get_pool().config.time_limit_s
# "Returns within the limit": one task's limit, plus one retry, plus scheduling slack on a busy CI box.
BOUND_S = 2 * LIMIT_S + 3.0
# Waits for work that has no time promise of its own end when the work does; this only stops a hang.
SAFETY_CEILING_S = 15 * 60


@pytest.fixture(scope="module", autouse=True)
def warm_pool():
    """Start the pool once (server start-up is not part of any per-input bound)."""
    assert grade("\\boxed{\\sqrt{4}}", "2").correct
    yield


class Metrics:
    """Collects what a reward function logs through TRL's ``log_metric``."""

    def __init__(self):
        self.values: dict[str, float] = {}

    def __call__(self, name: str, value: float) -> None:
        self.values[name] = value


# -- hard limits -------------------------------------------------------------------------------------

# name -> (completion, must be counted as a timeout or an error)
PATHOLOGICAL = {
    "tower 10^10^10": ("\\boxed{10^{10^{10}}}", True),
    "tower 9^9^9^9": ("The answer is $\\boxed{9^{9^{9^{9}}}}$.", True),
    "tower of 2s": ("\\boxed{" + "2^{" * 8 + "2" + "}" * 8 + "}", True),
    "factorial of a googol": ("\\boxed{(10^{100})!}", True),
    "huge product": ("\\boxed{\\prod_{k=1}^{10^{9}} k}", True),
    "huge sum": ("\\boxed{\\sum_{n=1}^{10^{6}} n^n}", True),
    "binomial": ("\\boxed{\\binom{10^{9}}{5 \\cdot 10^{8}}}", True),
    "slow integral": ("\\boxed{\\int_0^1 e^{x^{x^x}} dx}", True),
    "sum of 5000 ones": ("\\boxed{" + "+".join(["1"] * 5000) + "}", True),
    "40 nested parentheses": ("\\boxed{" + "(" * 40 + "1" + ")" * 40 + "}", True),
    "20 nested fractions": ("\\boxed{" + "\\frac{" * 20 + "1}{2}" * 20 + "}", True),
    "a megabyte boxed": ("\\boxed{" + "9" * 1_000_000 + "}", True),
    "40,000 digits read in-process": ("the value is " + "1" * 40_000, True),  # a digit loop, no exponent
    "a megabyte of prose": ("lorem ipsum dolor " * 60_000, False),
    "many Minerva openers": ("final answer is $1 " * 10_000, False),  # each `$...$` is read once: linear
    "unclosed boxes": ("\\boxed{" * 200_000, False),
    "a run of spaces in a box": ("\\boxed{1" + " " * 2_000 + "x}", False),  # each space is read once
    "a run of ties in a box": ("\\boxed{1" + "~" * 20_000 + "x}", True),  # then refused: too long
    "a run of escaped spaces in a box": ("\\boxed{1" + "\\ " * 10_000 + "x}", True),
}


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_pathological_input_returns_within_limit_and_scores_zero(name):
    completion, counted = PATHOLOGICAL[name]
    start = time.monotonic()
    verdict = grade(completion, "5")
    elapsed = time.monotonic() - start
    assert elapsed < BOUND_S, f"{name}: {elapsed:.1f} s"
    assert verdict.correct is False
    if counted:
        assert verdict.timed_out or verdict.error, verdict


def test_reward_counts_timeouts_and_errors_per_call():
    completions = [c for c, counted in PATHOLOGICAL.values()] + [
        "\\boxed{5}",
        "\\boxed{\\sqrt{25}}",
        "\\boxed{6}",
    ]
    metrics = Metrics()
    start = time.monotonic()
    rewards = correctness_reward(completions, answer=["5"] * len(completions), log_metric=metrics)
    assert time.monotonic() - start < len(PATHOLOGICAL) * BOUND_S
    assert rewards == [0.0] * len(PATHOLOGICAL) + [1.0, 1.0, 0.0]
    counted = sum(c for _, c in PATHOLOGICAL.values())
    assert metrics.values["rewards/timeouts"] + metrics.values["rewards/errors"] == counted
    assert metrics.values["rewards/unparseable_gold"] == 0


def test_pool_kills_a_task_blocked_outside_python_and_replaces_its_worker():
    # `time.sleep` burns no CPU, so only the hard wall-clock limit can stop it.
    pool = grader_pool.GraderPool(
        grader_pool.PoolConfig(workers=1, time_limit_s=1.0, preload="math", initializer="")
    )
    try:
        before = pool.worker_pids()
        start = time.monotonic()
        assert pool.map("time:sleep", [60, 0]) == [("timeout", None), ("ok", None)]
        assert time.monotonic() - start < 1.0 + 3.0
        after = pool.worker_pids()
        assert len(after) == 1 and after != before
        assert not _alive(before[0])
    finally:
        pool.close()


def test_pool_memory_cap_reports_an_error_and_recovers():
    pool = grader_pool.GraderPool(
        grader_pool.PoolConfig(workers=1, memory_mb=512, preload="math", initializer="")
    )
    try:
        outcomes = pool.map("builtins:bytearray", [2 * 1024**3, 16])
        assert outcomes[0] == ("error", "MemoryError")
        assert outcomes[1] == ("ok", bytearray(16))
    finally:
        pool.close()


def test_a_batch_interrupted_while_waiting_leaves_no_reply_for_the_next():
    # A signal handler's exception (a training step's timeout) ends `map` while the server still works on
    # the batch; the next batches must get their own results, not the interrupted one's.
    class Interrupt(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupt

    pool = grader_pool.GraderPool(
        grader_pool.PoolConfig(workers=1, time_limit_s=5.0, preload="math", initializer="")
    )
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        assert pool.map("math:factorial", [3]) == [("ok", 6)]
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Interrupt):
            pool.map("time:sleep", [0.5])
        time.sleep(2.0)  # the interrupted batch is done: its reply, if any, is waiting in the pipe
        assert pool.map("math:factorial", [4, 5]) == [("ok", 24), ("ok", 120)]
        assert pool.map("math:factorial", [6]) == [("ok", 720)]
        assert len(pool.worker_pids()) == 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        pool.close()


def test_grading_from_worker_threads():
    results: dict[int, list[Grade]] = {}

    def work(k: int) -> None:
        results[k] = grade_batch(
            [f"\\boxed{{\\sqrt{{{k * k}}}}}", "\\boxed{10^{10^{10}}}", f"so \\boxed{{{k}}}"], [str(k)] * 3
        )

    threads = [threading.Thread(target=work, args=(k,)) for k in (3, 4, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=SAFETY_CEILING_S)  # returns when the thread is done
    assert sorted(results) == [3, 4, 5]
    for grades in results.values():
        assert [g.correct for g in grades] == [True, False, True]
        assert grades[1].timed_out


def test_worker_killed_mid_batch_is_replaced_and_batch_completes():
    slow = [f"\\boxed{{\\int_0^{{{k}}} e^{{x^{{x^x}}}} dx}}" for k in (1, 2, 3)]  # each runs to the CPU limit
    normal = [f"\\boxed{{\\sqrt{{{k * k}}}}}" for k in range(1, 31)]  # each needs math-verify
    completions = slow + normal
    golds = ["5"] * len(slow) + [str(k) for k in range(1, 31)]
    victims = grader_pool.get_pool().worker_pids()
    out: list[list[Grade]] = []
    runner = threading.Thread(target=lambda: out.append(grade_batch(completions, golds)))
    runner.start()
    time.sleep(0.3)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    runner.join(timeout=SAFETY_CEILING_S)  # returns when the batch is done
    assert out, "the batch did not complete"
    grades = out[0]
    assert all(g.correct for g in grades[len(slow) :])
    assert not any(g.correct for g in grades[: len(slow)])
    assert not set(victims) & set(grader_pool.get_pool().worker_pids())


def test_forked_child_gets_its_own_pool():
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0 if grade("\\boxed{\\sqrt{9}}", "3").correct else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert grade("\\boxed{\\sqrt{16}}", "4").correct  # the parent's pool is untouched


def test_interpreter_exit_stops_the_pool_without_zombies_or_hang():
    code = (
        "from rewards import grade; from rewards.grading.pool import get_pool; "
        "assert grade('\\\\boxed{\\\\sqrt{4}}', '2').correct; "
        "p = get_pool(); print(p._process.pid, *p.worker_pids())"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=SAFETY_CEILING_S,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) >= 2
    deadline = time.monotonic() + 60  # the loop ends as soon as they are gone; a busy box only slows it
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as alive: nobody reaped it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "X"
    except FileNotFoundError:
        return False


# -- the fast path agrees with math-verify -----------------------------------------------------------

# (answer, gold, mathematically equal?). Expected verdicts are mathematics, not the code's output.
TABLE = [
    # integers, negatives, leading zeros (AIME), thousands separators
    ("5", "5", True),
    ("-3", "-3", True),
    ("3", "-3", False),
    ("-7", "7", False),
    ("0", "-0", True),
    ("025", "25", True),
    ("25", "025", True),
    ("007", "7", True),
    ("00", "0", True),
    ("+5", "5", True),
    ("1,000", "1000", True),
    ("1000", "1,000", True),
    ("1,000,000", "1000000", True),
    ("123,456", "123456", True),
    ("-1,000", "-1000", True),
    ("1,000.5", "1000.5", True),
    ("999", "1,000", False),
    ("12345678901234567890", "12345678901234567891", False),
    ("12345678901234567890", "12345678901234567890", True),
    # decimals vs fractions, \frac vs /, \dfrac
    ("0.5", "\\frac{1}{2}", True),
    ("\\frac{1}{2}", "0.5", True),
    (".5", "1/2", True),
    ("0.25", "\\frac14", True),
    ("0.75", "3/4", True),
    ("0.3", "\\frac{1}{3}", False),
    ("0.333", "\\frac13", False),
    ("1.0", "1", True),
    ("6", "6.0", True),
    ("2.50", "2.5", True),
    ("-0.5", "-\\frac12", True),
    ("0.1", "0.2", False),
    ("3.14159", "3.14159", True),
    ("1/2", "\\frac{1}{2}", True),
    ("2/4", "\\frac{1}{2}", True),
    ("\\frac{3}{4}", "3/4", True),
    ("\\dfrac{3}{4}", "\\frac34", True),
    ("\\tfrac{2}{6}", "\\frac{1}{3}", True),
    ("\\frac{-1}{2}", "-\\frac{1}{2}", True),
    ("\\frac{1}{-2}", "-0.5", True),
    ("\\frac{2}{3}", "\\frac{3}{2}", False),
    ("\\frac{10}{4}", "2.5", True),
    ("\\frac{7}{8}", "0.875", True),
    ("\\frac{7}{8}", "0.87", False),
    # percent, degrees, assignments, text
    ("50\\%", "50\\%", True),
    ("0.5", "50\\%", True),
    ("40\\%", "50\\%", False),
    ("5\\%", "0.05", True),
    ("90^\\circ", "90", True),
    ("90", "90^{\\circ}", True),
    ("45^\\circ", "90^\\circ", False),
    ("x=5", "5", True),
    ("5", "x=5", True),
    ("x = 5", "x=5", True),
    ("x=4", "5", False),
    ("12\\text{ cm}", "12", True),
    ("\\text{Monday}", "\\text{Monday}", True),
    # intervals, tuples, sets, matrices
    ("(1,2)", "(1, 2)", True),
    ("[1,2)", "[1,2)", True),
    ("[1,2]", "[1,2)", False),
    ("(-\\infty, 3) \\cup (3, \\infty)", "(-\\infty,3)\\cup(3,\\infty)", True),
    ("\\infty", "\\infty", True),
    ("-\\infty", "\\infty", False),
    ("(1,2,3)", "(1, 2, 3)", True),
    ("(1,2,3)", "(1,3,2)", False),
    ("(3, 4)", "(4, 3)", False),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", True),
    ("\\begin{pmatrix}2\\\\1\\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", False),
    # radicals, pi, powers, polynomials
    ("\\sqrt{8}", "2\\sqrt{2}", True),
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\sqrt{8}", "\\sqrt{2}", False),
    ("\\sqrt{4}", "2", True),
    ("3\\sqrt{3}", "\\sqrt{27}", True),
    ("2\\pi", "\\pi+\\pi", True),
    ("\\frac{\\pi}{2}", "\\frac12\\pi", True),
    ("\\pi/4", "\\frac{\\pi}{4}", True),
    ("\\pi", "3.14", False),
    ("\\frac{\\pi}{8}", "\\frac{\\pi}{8}", True),
    ("10^{3}", "1000", True),
    ("1.5\\times10^{3}", "1500", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2+1", "(x+1)^2", False),
    # closed-form constants and tuples of them (the fast path's "clearly different")
    ("9\\pi", "9", False),
    ("1236", "\\frac{2\\sqrt{2}}{3}", False),
    ("2^{10}", "1000", False),
    ("2^{10}", "1024", True),
    ("-3^2", "-9", True),
    ("-3^2", "9", False),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
    ("3\\pi", "\\frac{6\\pi}{2}", True),
    ("\\sqrt[3]{8}", "2", True),
    ("4\\sqrt{3}", "4\\sqrt{2}", False),
    ("(1,2,3)", "(1,2,4)", False),
    ("(3, 1)", "(5, 2)", False),
    ("5", "5, 15", False),
    ("\\{1,2\\}", "\\{1,3\\}", False),
    ("[1,3)", "(1,2)", False),
    ("(0, -\\frac{47}{17})", "(0, -\\frac{47}{16})", False),
    ("(2, 1)", "(2, 1)", True),
    ("\\left( \\frac{1}{2}, 3 \\right)", "(0.5, 3)", True),
    # expressions in variables (the fast path compares their values at two points)
    ("2x^2+4x", "2x^2+3x", False),
    ("x+1", "y+1", False),
    ("1", "2x^2+3x", False),
    ("(x+1)^2", "x^2+2x+1", True),
    ("\\frac{x}{2}", "0.5x", True),
    ("3p^3 - 6p^2 - 3p + 10", "3p^3 - 6p^2 - 3p + 11", False),
    ("\\frac{1}{(a + b)^3}", "\\frac{1}{(a+b)^2}", False),
    ("2\\sqrt{x}", "\\sqrt{4x}", True),
    # unions of intervals (the fast path compares boundary points)
    ("(-\\infty, -3) \\cup (0, 1)", "(-\\infty, -2) \\cup (0, 1)", False),
    ("(0, 2) \\cup (1, 3)", "(0, 3)", True),
    ("(0, 1) \\cup (1, 2)", "(0, 2)", False),
    ("[0, 1) \\cup [1, 2)", "[0, 2)", True),
    ("4", "(-\\infty,2) \\cup (2,4)", False),
]


def _math_verify(answer: str, gold: str) -> bool:
    """The slow path, in-process (these inputs are tame): math-verify on the same normalised strings."""
    parsed = parse_text(gold)
    assert parsed is not None, gold
    return is_equivalent(answer, parsed)


@pytest.mark.parametrize(("answer", "gold", "equal"), TABLE)
def test_fast_path_agrees_with_math_verify_and_mathematics(answer, gold, equal):
    a, g = normalize(answer), normalize_gold(gold)
    assert _math_verify(a, g) is equal
    fast = fast_verdict(a, g)
    assert fast in (None, equal)
    assert grade(f"so \\boxed{{{answer}}}", gold).correct is equal


def test_golds_known_parseable_in_process_are_parseable():
    texts = {normalize_gold(g) for _, g, _ in TABLE} | {normalize(a) for a, _, _ in TABLE}
    known = [t for t in texts if surely_parseable(t)]
    assert len(known) > 60
    for text in known:
        assert parse_text(text) is not None, text
    assert not surely_parseable("\\text{odd}") and not surely_parseable("}{")


def test_fast_path_answers_the_common_cases():
    # Without this, a fast path that always says "don't know" would pass the agreement test.
    plain = [(a, g) for a, g, _ in TABLE if as_number(normalize(a)) and as_number(normalize_gold(g))]
    assert len(plain) >= 30
    for answer, gold in plain:
        if fast_verdict(normalize(answer), normalize_gold(gold)) is None:
            assert "." in answer + gold  # only decimals close to each other are left to math-verify


def _forms(value: Fraction) -> list[str]:
    """Ways to write ``value`` that the fast path reads."""
    forms = [f"\\frac{{{value.numerator}}}{{{value.denominator}}}", f"{value.numerator}/{value.denominator}"]
    if value.denominator == 1:
        forms += [str(value.numerator), f"0{value.numerator}" if value >= 0 else f"-0{-value.numerator}"]
        if abs(value) >= 1000:
            forms.append(f"{value.numerator:,}")
    if 10**6 % value.denominator == 0:
        forms.append(f"{Decimal(value.numerator) / Decimal(value.denominator)}")
    return forms


def _rounds_equal(x: Fraction, y: Fraction) -> bool:
    """math-verify's convention with a decimal involved: equal after rounding to 6 places."""
    q = Decimal("0.000001")
    rx = (Decimal(x.numerator) / Decimal(x.denominator)).quantize(q, rounding=ROUND_HALF_UP)
    ry = (Decimal(y.numerator) / Decimal(y.denominator)).quantize(q, rounding=ROUND_HALF_UP)
    return rx == ry


def test_fast_path_agrees_with_math_verify_on_generated_numbers():
    values = [Fraction(n, d) for n in (-12, -3, 0, 1, 2, 5, 7, 25, 1250, 123456) for d in (1, 2, 4, 5, 8)]
    values += [Fraction(1, 3), Fraction(333333, 1000000), Fraction(3333333, 10000000)]
    answered = 0
    for i, x in enumerate(values):
        for y in values[i % 7 :: 7]:
            for a in _forms(x)[:3]:
                for g in _forms(y)[-2:]:
                    fast = fast_verdict(a, g)
                    if fast is None:
                        continue
                    answered += 1
                    assert fast is _math_verify(a, g), (a, g)
                    assert fast is (x == y or ("." in a + g and _rounds_equal(x, y))), (a, g)
    assert answered > 200


def _constants(rng) -> list[tuple[str, float]]:
    """Random closed-form constants, with their values computed here, independently of both graders."""
    k, n, p, q = rng.randint(1, 9), rng.choice([2, 3, 5, 6, 7]), rng.randint(1, 12), rng.randint(2, 9)
    return [
        (str(k), k),
        (f"\\frac{{{p}}}{{{q}}}", p / q),
        (f"\\sqrt{{{n}}}", n**0.5),
        (f"{k}\\sqrt{{{n}}}", k * n**0.5),
        (f"{k}\\pi", k * math.pi),
        (f"\\frac{{{k}\\sqrt{{{n}}}}}{{{q}}}", k * n**0.5 / q),
        (f"2^{{{k}}}", 2.0**k),
        (f"-\\frac{{\\pi}}{{{q}}}", -math.pi / q),
        (f"{p} - \\sqrt{{{n}}}", p - n**0.5),
    ]


def test_fast_path_never_contradicts_math_verify_on_generated_constants():
    rng = random.Random(0)
    pool_ = [c for _ in range(12) for c in _constants(rng)]
    answered = 0
    for _ in range(250):
        (a, va), (g, vg) = rng.choice(pool_), rng.choice(pool_)
        if rng.random() < 0.3:  # tuples of two
            (a2, va2), (g2, vg2) = rng.choice(pool_), rng.choice(pool_)
            a, g, va, vg = f"({a}, {a2})", f"({g}, {g2})", (va, va2), (vg, vg2)
        fast = fast_verdict(a, g)
        if fast is None or a == g:  # identical texts are equal by the string rule
            continue
        answered += 1
        assert fast is False and va != vg, (a, g)  # the evaluator only ever says "different"
        assert _math_verify(a, g) is False, (a, g)
    assert answered > 150


def _polynomial(rng) -> tuple[str, tuple[int, ...]]:
    """A random polynomial in x with its coefficients (the mathematics, known here)."""
    coefficients = tuple(rng.randint(-4, 4) for _ in range(3))
    text = f"{coefficients[0]}x^2 + {coefficients[1]}x + {coefficients[2]}".replace("+ -", "- ")
    return text, coefficients


def test_fast_path_never_contradicts_math_verify_on_generated_polynomials():
    rng = random.Random(1)
    answered = 0
    for _ in range(120):
        (a, ca), (g, cg) = _polynomial(rng), _polynomial(rng)
        if rng.random() < 0.3:
            cg, g = (
                ca,
                f"{ca[2]} + {ca[1]}x + {ca[0]}x^2".replace("+ -", "- "),
            )  # the same polynomial, reordered
        fast = fast_verdict(a, g)
        if fast is None:
            continue
        answered += 1
        assert fast is False and ca != cg, (a, g)
        assert _math_verify(a, g) is False, (a, g)
    assert answered > 60


def _union(rng) -> tuple[str, object]:
    """A random union of intervals as text, with the set itself built by SymPy (the mathematics)."""
    import sympy

    points = sorted(rng.sample(range(-6, 7), 2 * rng.randint(1, 3)))
    texts, parts = [], []
    for k in range(0, len(points), 2):
        low, high = points[k], points[k + 1]
        closed_low, closed_high = rng.random() < 0.5, rng.random() < 0.5
        if k == 0 and rng.random() < 0.3:
            low, closed_low = None, False
        start = "-\\infty" if low is None else str(low)
        texts.append(("[" if closed_low else "(") + f"{start}, {high}" + ("]" if closed_high else ")"))
        parts.append(sympy.Interval(-sympy.oo if low is None else low, high, not closed_low, not closed_high))
    return " \\cup ".join(texts), sympy.Union(*parts)


def test_fast_path_never_contradicts_math_verify_on_generated_unions():
    rng = random.Random(2)
    answered = 0
    for _ in range(80):
        (a, set_a), (g, set_g) = _union(rng), _union(rng)
        if rng.random() < 0.2:
            a, set_a = g, set_g
        fast = fast_verdict(a, g)
        if fast is None or a == g:
            continue
        answered += 1
        assert fast is False and set_a != set_g, (a, g)
        assert _math_verify(a, g) is False, (a, g)
    assert answered > 40


# Left sides of a gold equation, as math-verify reads them: symbols alone (an assignment, compared by its
# right side), or holding an integer of its own (an equation, equal to no value).
_ASSIGNED_LEFTS = ["a_1 + a_2", "f^{-1}(x)", "f(x)", "g_{2}(x)", "x + y", "AB", "x^{-1}", "\\frac{a}{b}", "k"]
_EQUATION_LEFTS = ["2x + z - 5", "x + 1", "3y", "x^2 - 4", "2a - b", "k + 10", "x - 1 + 1"]
_RIGHT_SIDES = ["7", "-4", "\\frac{3}{2}", "2\\sqrt{3}", "x+1", "\\frac{x-3}{2}", "3x^2"]  # all different


def test_fast_path_never_contradicts_math_verify_on_generated_gold_equations():
    from rewards.grading.grade import _verdict

    rng = random.Random(3)
    answered = 0
    for _ in range(120):
        assigned = rng.random() < 0.5
        left = rng.choice(_ASSIGNED_LEFTS if assigned else _EQUATION_LEFTS)
        right = rng.choice(_RIGHT_SIDES)
        answer = right if rng.random() < 0.5 else rng.choice(_RIGHT_SIDES)
        a, g = normalize(answer), normalize_gold(f"{left} = {right}")
        equal = assigned and answer == right
        assert _math_verify(a, g) is equal, (a, g)
        verdict = _verdict(a, g)
        assert verdict in (None, equal), (a, g)
        answered += verdict is not None
    assert answered > 30


@pytest.mark.parametrize(
    ("completion", "gold"),
    [("\\boxed{TUESDAY}", "Tuesday"), ("\\boxed{evelyn}", "Evelyn"), ("\\boxed{1A_{16}}", "1A")],
)
def test_a_verdict_of_our_own_is_the_same_before_the_gold_is_known_to_parse(completion, gold, monkeypatch):
    # A word or a numeral in a base is decided here, not by math-verify; the first grading of a gold, before
    # any worker has said that it parses, must give the same verdict as the next.
    monkeypatch.setattr("rewards.grading.grade._PARSEABLE", {})
    first = correctness_reward([completion] * 4, answer=[gold] * 4)
    again = correctness_reward([completion] * 4, answer=[gold] * 4)
    assert first == again == [1.0] * 4
    assert grade("lorem ipsum " * 5000 + completion, gold).correct  # long: extracted in a worker


def test_batch_equals_one_by_one():
    completions = [
        "\\boxed{025}",
        "\\boxed{\\sqrt{4}}",
        "no answer",
        "\\boxed{(1,2)}",
        "The answer is 7.",
        "\\boxed{5}",
    ]
    golds = ["25", "2", "3", "(1, 2)", ["7", "seven"], "6"]
    assert grade_batch(completions, golds) == [grade(c, g) for c, g in zip(completions, golds)]


def test_strict_mode_needs_the_template_format():
    tagged = "<think>\nwork\n</think>\n<answer>\n\\boxed{7}\n</answer>"
    untagged = "<think>\nwork\n</think>\n\\boxed{7}"
    assert strict_correctness_reward([tagged, untagged], answer=["7", "7"], template=["open-r1"] * 2) == [
        1.0,
        0.0,
    ]
    assert correctness_reward([tagged, untagged], answer=["7", "7"], template=["open-r1"] * 2) == [1.0, 1.0]


# -- gold handling -----------------------------------------------------------------------------------


@pytest.mark.parametrize("gold", ["}{", "", "   "])
def test_unparseable_gold_gives_none_and_is_counted(gold):
    metrics = Metrics()
    rewards = correctness_reward(
        ["\\boxed{1}", "\\boxed{2}", "no answer"], answer=[gold, "2", gold], log_metric=metrics
    )
    assert rewards == [None, 1.0, None]
    assert metrics.values["rewards/unparseable_gold"] == 2
    assert grade("\\boxed{}{}", gold).gold_ok is False


def test_gold_is_normalised_once_per_question():
    from rewards.grading.grade import _gold_texts

    before = _gold_texts.cache_info().misses
    grade_batch([f"\\boxed{{{k}}}" for k in range(16)], ["\\dfrac{7}{3}"] * 16)
    assert _gold_texts.cache_info().misses - before <= 1


def test_numeric_golds_from_datasets():
    assert grade("\\boxed{18}", 18.0).correct  # AMC stores floats
    assert grade("\\boxed{25}", "025").correct  # AIME keeps leading zeros
    assert grade("\\boxed{\\frac{9}{32}}", ["$\\frac{9}{32}$"]).correct  # OlympiadBench lists with $...$
    import numpy as np

    assert grade_batch(["\\boxed{7}"], [np.array(["seven", "7"])])[
        0
    ].correct  # a list column read from parquet


@pytest.mark.parametrize(
    ("answer", "gold", "equal"),
    [
        # numerals in a base: math-verify drops the subscript; values decide
        ("20412_5", "20412_5", True),
        ("20412_{5}", "20412_5", True),
        ("20412", "20412_5", True),
        ("20412_6", "20412_5", False),
        ("1357", "20412_5", False),
        ("-37_7", "-37_8", False),
        ("10_2", "2_{10}", True),
        ("0.0011_{3}", "0.0011_{2}", False),  # fractional digits: values decide too
        ("0.1_2", "0.5_{10}", True),
        ("1.1_0", "1011_{2}", False),  # no base 0: a verdict, not a crash
        # tiny numbers: rounding to 6 decimal places would make them all equal
        ("10.224 \\times 10^{-19}", "8.224 \\times 10^{-19}", False),
        ("0.8224 \\times 10^{-18}", "8.224 \\times 10^{-19}", True),
        ("8.22 \\times 10^{-19}", "8.224 \\times 10^{-19}", False),  # as 8.22 vs 8.224 at ordinary scale
        ("0", "\\frac{1}{2004!}", False),
        ("\\frac{2}{2^{98}}", "\\frac{1}{2^{98}}", False),
        # gold forms fixed by normalisation
        ("34", "34\\text{ sq. units}", True),
        ("\\frac{\\pi}{4} + 2 - \\sqrt{2}", "\\frac \\pi4 + 2 - \\sqrt2", True),
        ("\\frac{1}{29322216}", "\\dfrac{1}{29,\\!322,\\!216}", True),
        ("n^{2}-n-1", "$m_{\\max }=n^{2}-n-1$", True),
        ("\\frac{2}{3}", "\\$\\dfrac23 \\approx \\$0.67", True),
        ("8.24", "\\approx 8.24 \\text{ mph}", True),
    ],
)
def test_grading_fixes_found_by_the_gold_audit(answer, gold, equal):
    assert grade(f"\\boxed{{{answer}}}", gold).correct is equal


# -- log hygiene -------------------------------------------------------------------------------------


def test_math_verify_logs_are_truncated(caplog):
    huge = "x" * 100_000
    with caplog.at_level(logging.WARNING):
        logging.getLogger("math_verify.parser").warning(f"Timeout during parsing: {huge}")
        logging.getLogger("math_verify.grader").warning("Timeout is disabled as timeout_seconds is None")
    assert len(caplog.records) == 1
    assert len(caplog.records[0].getMessage()) < 400


# -- no false negative where math-verify's reading agrees ------------------------------------

# (gold, boxed answer, right?) for each kind of answer that needs a rule of the grader's; the wrong ones are
# the same forms with a changed value, so that a rule that accepts everything fails.
KINDS = {
    "thousands mark and a space": [
        ("12345", "12,\\! 345", True),
        ("1234567", "1,\\! 234,\\! 567", True),
        ("12,\\! 345", "12345", True),
        ("12346", "12,\\! 345", False),
    ],
    "thousands groups set apart by spaces, or led by a zero": [
        ("1000", "1 000", True),
        ("1000", "1\\ 000", True),
        ("12345", "12 345", True),
        ("(1000)", "(1,000)", True),
        ("(1,0)", "(1,000)", False),
        ("123", "1 2 3", False),
        ("1020", "10 20", False),
    ],
    "temperature scales": [
        ("100^\\circ C", "100°C", True),
        ("100^\\circ C", "100", True),
        ("100^\\circ C", "100^\\circ F", False),
        ("100^\\circ C", "101^\\circ C", False),
    ],
    "a relation of one variable against an interval": [
        ("(2, \\infty)", "x > 2", True),
        ("[-1, 3)", "-1 \\le t < 3", True),
        ("(2, \\infty)", "x > 3", False),
        ("(-\\infty, -2) \\cup (2, \\infty)", "x^2 > 4", False),
    ],
    "decimal comma": [
        ("3.14", "3,14", True),
        ("0.5", "0,5", True),
        ("2.75", "2,75", True),
        ("3.14", "3,15", False),
        ("2, 6", "2.6", False),
        ("1000", "1,000", True),
        # a gold with a comma is a list ("enter all the values, separated by commas"), never a decimal
        ("8,12", "8.12", False),
        ("0,5", "0.5", False),
        ("-1,1", "-1.1", False),
    ],
    "unit after a closed form or with a slash": [
        ("9\\pi", "9\\pi \\text{ cm}^2", True),
        ("2\\sqrt{5}", "2\\sqrt{5}\\text{ cm}", True),
        ("\\frac{3}{4}", "\\frac{3}{4} \\text{ cm}", True),
        ("\\frac{\\pi}{3}", "\\frac{\\pi}{3}\\text{ rad}", True),
        ("12", "12 \\text{ m/s}", True),
        ("12", "12\\text{ cm}.", True),
        ("8\\pi", "9\\pi \\text{ cm}^2", False),
        ("2\\sqrt{6}", "2\\sqrt{5}\\text{ cm}", False),
        ("5", "2+3\\mathrm{i}", False),  # the imaginary unit is no unit, nor is e
        ("\\frac{1}{2}", "\\frac{1}{2}\\mathrm{e}^{2}", False),
        ("\\frac{1}{2}\\mathrm{e}^{2}", "\\frac{e^{2}}{2}", True),
        ("\\sqrt{2}", "\\sqrt{2}\\text{ is not possible}", False),  # nor are words that deny
    ],
    "several equations against a tuple or a list": [
        ("(3, 4)", "a = 3, b = 4", True),
        ("2, 3", "x=2, x=3", True),
        ("(3, 5)", "a = 3, b = 4", False),
        ("4", "a = 3, b = 4", False),
    ],
    "a sentence that denies or bounds": [
        ("3", "\\text{not } 3", False),
        ("3", "\\text{cannot be } 3", False),
        ("3", "\\text{Less than } 3", False),
        ("3", "\\text{at least } 3", False),
        ("3", "\\text{The answer is } 3", True),
        ("3", "\\text{The greater root is } 3", True),
        ("5", "5\\text{ more}", True),  # "how many more": after the number it is a unit
        ("15", "\\text{The number of primes less than fifty is } 15", True),  # bounds a word, not 15
        ("99", "\\text{The largest n with at most two digits is } 99", True),
    ],
    "a gold that is a word": [
        ("\\text{Evelyn}", "\\text{Evelyn}", True),
        ("\\text{Evelyn}", "evelyn", True),
        ("\\text{Sunday}", "\\textbf{Sunday}", True),
        ("\\text{Evelyn}", "Evelyn1", False),  # not the word times one
        ("\\text{Sunday}", "Sundya", False),  # not a product of letters: an anagram is another answer
        ("xyz", "zyx", True),  # a product is
    ],
    "relation commands": [
        ("x \\neq \\pm 1", "x != \\pm 1", True),
        ("x \\gt 1000", "x > 1,000", True),
        ("x \\geq 3", "\\text{all } x \\geq 3", True),
        ("x \\ne \\pm 1", "x \\neq \\pm 1", True),
        ("x \\neq \\pm 1", "x != \\pm 2", False),
        ("x > 5", "x \\gt 4", False),
        ("x \\gt 1000", "x > 1,001", False),
    ],
    "equation in another form": [
        ("y = 2x + 3", "2x - y + 3 = 0", True),
        ("y = -\\frac{1}{2}x + 3", "x + 2y = 6", True),
        ("x + 2y = 6", "y = -\\frac{1}{2}x + 3", True),
        ("y = 2x + 3", "y - 2x = 3", True),
        ("y = 2x + 3", "2x + 3", True),
        ("y = 2x + 3", "2x - y + 4 = 0", False),
        ("y = 2x + 3", "x + 2y = 6", False),
    ],
    "matrix after a sentence": [
        (
            "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
            "\\text{The vector is } \\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
            True,
        ),
        (
            "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
            "\\text{The matrix is } \\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
            True,
        ),
        (
            "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
            "\\text{so } \\mathbf{v} = \\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
            True,
        ),
        (
            "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
            "\\text{The vector is } \\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}",
            False,
        ),
    ],
    "digits set apart by thin spaces": [
        ("1000000", "1\\,000\\,000", True),
        ("12345", "12\\;345", True),
        ("3.14159", "3.141\\,59", True),
        ("123", "1\\,2\\,3", False),  # groups of one digit: a list, as `1 2 3` is
        ("1020", "10\\,20", False),
        ("3.14159265", "3.141\\,592\\,65", True),  # decimals in groups of three
        ("0.0000015", "0.000\\,001\\,5", True),
        ("1000000", "1{,}000\\,000", True),  # a thousands mark, then a thin space
        ("1000000", "1,\\!000\\,000", True),
    ],
    "a unit after each element or after the bracket": [
        ("(3, 4)", "(3\\text{ cm}, 4\\text{ cm})", True),
        ("(3, 4)", "(3 \\mathrm{~cm}, 4 \\mathrm{~cm})", True),
        ("(3, 4)", "(3, 4) \\mathrm{~cm}", True),
        ("[3, 4]", "[3 \\text{ s}, 4 \\text{ s}]", True),
        ("\\{3, 4\\}", "\\{3 \\text{ cm}, 4 \\text{ cm}\\}", True),
        ("3, 4", "3\\text{ cm}, 4\\text{ cm}", True),
        ("(3, 4)", "(3\\text{ cm}, 5\\text{ cm})", False),
        ("(3, 5)", "(3, 4) \\mathrm{~cm}", False),
    ],
    "a percent and its number": [
        ("12.5", "12.5\\%", True),
        ("7.2\\%", "7.2", True),
        ("237.5\\%", "2.375", True),
        ("0.125", "12.5\\%", True),
        ("12.5", "12.6\\%", False),
        ("7.2\\%", "7.3", False),
        ("7.2\\%", "0.73", False),
    ],
    "degree command": [
        ("45", "45\\degree", True),
        ("90", "90^\\degree", True),
        ("90", "90^{\\degree}", True),
        ("(30, 60)", "(30\\degree, 60\\degree)", True),
        ("100^\\circ C", "100\\degree F", False),
        ("45", "46\\degree", False),
    ],
    "approx with a variable on its left": [
        ("2.24", "\\text{so } x \\approx 2.24", True),
        ("2.24", "x \\approx 2.24", True),
        ("3.5", "\\text{The answer is } t \\approx 3.5", True),
        ("2.24", "x \\approx 2.25", False),
        ("\\frac{2}{3}", "\\frac{2}{3} \\approx 0.67", True),
    ],
}
KIND_CASES = [(kind, *case) for kind, cases in KINDS.items() for case in cases]


@pytest.mark.parametrize(("kind", "gold", "answer", "right"), KIND_CASES)
def test_answer_forms_math_verify_reads_right(kind, gold, answer, right):
    verdict = grade(f"So the answer is \\boxed{{{answer}}}.", gold)
    assert verdict.gold_ok and verdict.correct is right, (kind, verdict)


@pytest.mark.parametrize(
    ("gold", "answer", "wrong"),
    [
        # intervals in decimals against exact bounds: right before the fast path was widened, kept right
        ("[\\frac{1}{4}, \\frac{3}{2})", "[0.25, 1.5)", "[0.25, 1.6)"),
        (
            "(-\\infty, \\frac{1}{2}) \\cup (2, \\infty)",
            "(-\\infty, 0.5) \\cup (2, \\infty)",
            "(-\\infty, 0.6) \\cup (2, \\infty)",
        ),
        ("(-\\frac{3}{2}, \\frac{9}{4}]", "(-1.5, 2.25]", "(-1.5, 2.26]"),
        ("(2, \\frac{10}{3})", "(2, 3.333333)", "(2, 3.33)"),
    ],
)
def test_intervals_in_decimals(gold, answer, wrong):
    assert grade(f"\\boxed{{{answer}}}", gold).correct
    assert not grade(f"\\boxed{{{wrong}}}", gold).correct


def test_where_the_new_readings_agree_with_math_verify():
    # Each right answer above is one math-verify itself accepts on our normalised texts (no rule of ours
    # decides it alone), except the decimal comma, which math-verify reads as a set of two numbers, a
    # word, which it reads as text, lower-cased, only before normalisation (`\text{Evelyn}` is `evelyn`),
    # and a relation against an interval, which it reads as a set only when asked (`relation_as_set`).
    for kind, gold, answer, right in KIND_CASES:
        if right and kind not in (
            "decimal comma",
            "a gold that is a word",
            "a relation of one variable against an interval",
            "a percent and its number",
        ):
            assert _math_verify(normalize(answer), normalize_gold(gold)), (kind, gold, answer)


SEVERAL_BOXES = "The solutions are \\boxed{1} and \\boxed{-2}."


@pytest.mark.parametrize("gold", ["\\{1, -2\\}", "-2, 1", "(1, -2)"])
def test_several_boxes_form_the_gold_set_only_when_asked(gold):
    assert not grade(SEVERAL_BOXES, gold).correct  # the paper's rule: the last box
    assert not grade(SEVERAL_BOXES, gold, strict=True).correct
    assert grade(SEVERAL_BOXES, gold, join_boxes=True).correct
    assert grade(SEVERAL_BOXES, gold, join_boxes=True, strict=True).correct
    assert not grade("The solutions are \\boxed{1} and \\boxed{-3}.", gold, join_boxes=True).correct


def test_a_recipe_opts_into_the_set_reading_by_naming_its_reward():
    from rewards import get_reward_funcs

    plain, joined = get_reward_funcs(["correctness", "correctness_joined_boxes"])
    golds = ["\\{1, -2\\}", "-2"]
    assert plain([SEVERAL_BOXES] * 2, answer=golds) == [0.0, 1.0]
    assert joined([SEVERAL_BOXES] * 2, answer=golds) == [1.0, 1.0]


def test_several_boxes_option_keeps_the_last_box_when_the_boxes_repeat_one_answer():
    # The same tuple boxed twice is one answer, not the pair of tuples; two different tuples are a list.
    points = "The points are \\boxed{(1, 2)} and \\boxed{(3, 4)}."
    assert grade(points, "(1, 2), (3, 4)", join_boxes=True).correct
    assert grade("So \\boxed{15600}, that is \\boxed{15,600}.", "15,600", join_boxes=True).correct
    assert grade("The point is \\boxed{(3, 4)}, i.e. \\boxed{(3,4)}.", "(3, 4)", join_boxes=True).correct
    assert grade("So \\boxed{\\{1,2\\}}, that is \\boxed{\\{1, 2\\}}.", "\\{1, 2\\}", join_boxes=True).correct


def test_several_boxes_option_keeps_the_last_box_for_a_single_gold():
    assert grade(SEVERAL_BOXES, "-2", join_boxes=True).correct
    assert not grade(SEVERAL_BOXES, "1", join_boxes=True).correct
    # boxes of an earlier paragraph are not part of the answer
    earlier = "Try \\boxed{5}.\n\nThe solutions are \\boxed{1} and \\boxed{-2}."
    assert not grade(earlier, "5, 1, -2", join_boxes=True).correct


def test_several_boxes_option_still_reads_the_last_box_alone():
    from rewards import get_reward_funcs

    (joined,) = get_reward_funcs(["correctness_joined_boxes"])
    completions = [
        "We found $a=\\boxed{3}$ earlier, so the pair is \\boxed{(3, 4)}.",
        "Check \\boxed{12}. Final: \\boxed{\\{3, 4\\}}",
    ]
    assert joined(completions, answer=["(3, 4)", "\\{3, 4\\}"]) == [1.0, 1.0]
    assert joined(completions, answer=["(3, 5)", "\\{3, 5\\}"]) == [0.0, 0.0]
    long = "lorem ipsum " * 5000 + completions[0]  # extracted in a worker
    assert grade(long, "(3, 4)", join_boxes=True).correct
    assert grade(long, "(3, (3, 4))", join_boxes=True).correct  # the joined reading still counts there


def test_evaluation_keeps_the_last_box_rule():
    import inspect

    from prompt_aug.evaluate import score_completions

    # Evaluation grades the last box only: a set answer written as several boxes is wrong there, and its last
    # box alone is right, though grade(..., join_boxes=True) would read the set.
    assert grade(SEVERAL_BOXES, "1, -2", join_boxes=True).correct
    verdicts = score_completions([SEVERAL_BOXES, SEVERAL_BOXES], [["1, -2"], ["-2"]], ["qwen-math"] * 2)
    assert [v["correct"] for v in verdicts] == [False, True]
    assert inspect.signature(grade).parameters["join_boxes"].default is False


# -- each new fast-path rule is sound (math-verify agrees wherever it answers) ----------------

# (answer, gold): pairs each new rule settles as different; math-verify must say different too.
NEW_RULES = {
    "non-constant expression vs constants": [
        ("5x-3", "( -1, \\frac{35}{12} )"),
        ("\\frac{8t}{3}", "[2,5)"),
        ("\\frac{1}{b}", "(-\\frac{3}{10}, -\\frac{10}{3})"),
        ("x^2", "\\{1, 4\\}"),
    ],
    "complex numbers": [
        ("1", "-3 + 6i"),
        ("-5 + 6i", "-3 + 6i"),
        ("\\frac{1}{5} + \\frac{3}{4}i", "\\frac{1}{5} + \\frac{3}{5}i"),
        ("292i", "408.04"),
        ("6-3i", "80"),
        ("-128 - 128 \\sqrt{3} i", "2"),
    ],
    "equation by its right side": [
        ("2x - y + 2z - 18 = 0", "181"),
        ("y = -\\frac{5}{2} x - \\frac{29}{4}", "-\\frac{9}{2}"),
        ("y = 2x", "4"),
    ],
    "choice letter vs number": [("(A)", "39"), ("(B)", "9"), ("7", "C")],
    "assignments of the same variable": [
        ("y = 2x + 4", "y = 2x + 3"),
        ("y = x^2 - 1", "y = -3x + 30"),
        ("k = n + 2", "k = n + 1"),
    ],
    "integer sums": [("0-14", "-13"), ("2 + 3", "6")],
    "gold equation against a constant": [
        ("13", "2x + z - 5 = 0"),
        ("2", "AB=12+12\\sqrt{3}"),
        ("\\frac{24}{35}", "2x + z - 5 = 0"),
    ],
    "matrices": [
        ("108", "\\begin{pmatrix} 1 & -1 \\\\ 1 & 1 \\end{pmatrix}"),
        (
            "\\begin{pmatrix} 1 & -0 \\\\ 1 & 1 \\end{pmatrix}",
            "\\begin{pmatrix} 1 & -1 \\\\ 1 & 1 \\end{pmatrix}",
        ),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 & 2 \\end{pmatrix}"),
    ],
    "percents and mixed numbers": [
        ("1023", "20\\%"),
        ("21\\%", "20\\%"),
        ("65\\%", "35"),
        ("3 \\frac{3}{8}", "15"),
        ("-15\\frac{3}{5}", "8"),
        ("129\\frac{1}{3}", "-338016"),
    ],
    "interval against a number": [("[3,\\infty)", "32"), ("[-36,104]", "2 - 2 \\sqrt{2}")],
    "inequality against a number": [("-80 <= g(x) <= 82", "80"), ("5", "x > 3"), ("x >= 2", "2")],
    "unions with a degenerate piece": [
        ("(-\\infty,2) \\cup (4,4)", "(-\\infty,2) \\cup (2,4)"),
        ("(-\\infty, -2) \\cup (2, 1) \\cup (2, 4)", "(-\\infty, -2) \\cup (0, 1) \\cup (2, 4)"),
    ],
    "complex constant against a function": [("\\frac{2}{25} - \\frac{14}{25}i", "-8x^2+13x+20")],
    "points against a union": [
        ("0, 3, -1, 4", "(-\\infty, -4) \\cup (-4, \\infty)"),
        ("\\{1, 2\\}", "(0, 1) \\cup (2, 3)"),
        ("\\sqrt[4]{8}", "(-\\infty, -4) \\cup (-4, \\infty)"),
    ],
    "gold equation against an expression": [("xy", "2x + z - 5 = 0"), ("x^2", "y = x^3"), ("x", "2x = 2")],
    "choice letter against an expression": [
        ("(D)", "225\\sqrt{11}"),
        ("2x^2 - 12x + 20", "(D)"),
        ("3 \\frac{3}{8}", "(D)"),
    ],
    "numeral in a base vs another shape": [
        ("1200_{7}", "0.20"),
        ("10200_{3}", "(-\\infty,2) \\cup (2,4)"),
        ("861_{12}", "4\\sqrt{3}"),
    ],
}


@pytest.mark.parametrize(
    ("rule", "answer", "gold"), [(r, a, g) for r, cases in NEW_RULES.items() for a, g in cases]
)
def test_new_fast_path_rules_say_different_only_where_math_verify_does(rule, answer, gold):
    from rewards.grading.grade import _verdict

    assert _verdict(answer, gold) is False, rule
    assert _math_verify(answer, gold) is False, rule


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("x - x + 1", "1"),
        ("x + 1", "(1, y)"),
        ("6i", "0 + 6i"),
        ("-3 + 6i", "-3 + 6i"),
        ("y = 2x", "2x"),
        ("(E)", "3"),
        ("0-14", "-14"),
        ("1200_{7}", "1200"),
        ("x = \\frac{y - 3}{2}", "y = 2x + 3"),
        ("y = 2y + 1", "y = 3"),
        ("(0,1) \\cup (1,1) \\cup (1,2)", "(0,2)"),
        ("(0, 2)", "(0, 1) \\cup [1, 2)"),
        ("x^3", "y = x^3"),
        ("x > 3", "(3, \\infty)"),
        ("20", "20\\%"),
        ("0.2", "20\\%"),
        ("12+12\\sqrt{3}", "AB=12+12\\sqrt{3}"),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
        ("\\frac{100}{3}", "33 \\frac{1}{3}"),
    ],
)
def test_new_fast_path_rules_leave_or_accept_the_equal_ones(answer, gold):
    from rewards.grading.grade import _verdict

    assert _verdict(answer, gold) is not False
    if _verdict(answer, gold) is True:
        assert _math_verify(answer, gold) or answer.endswith(
            "_{7}"
        )  # a base numeral: read in the gold's base


def test_a_number_with_a_unit_outside_text_is_read_as_math_verify_reads_it():
    # math-verify drops the units it knows (`5 cm` is 5); the letters are no variables.
    for answer, gold in [
        ("5 cm", "5"),
        ("5cm", "5"),
        ("5 \\, cm", "5"),
        ("6 days", "6"),
        ("3 kg", "3"),
        ("12 ft", "12"),
    ]:
        assert grade(f"\\boxed{{{answer}}}", gold).correct, answer
        assert _math_verify(normalize(answer), gold), answer
    for answer, gold in [("7 cm", "5"), ("6 days", "7"), ("2x", "2")]:
        assert not grade(f"\\boxed{{{answer}}}", gold).correct, answer


def test_a_unit_after_a_tie_goes_with_its_wrapper():
    assert normalize("5\\mathrm{~cm}") == normalize("5\\text{\\ cm}") == normalize("5~\\text{cm}") == "5"
    assert grade("\\boxed{5\\mathrm{~cm}}", "5").correct
    assert not grade("\\boxed{5\\mathrm{~cm}}", "6").correct
    assert normalize("3\\mathrm{~i}") == "3~i"  # the imaginary unit is still no unit


def test_a_choice_letter_in_lower_case_is_the_letter():
    for answer, gold in [("b", "B"), ("(b)", "(B)"), ("c", "\\text{(C)}"), ("(d)", "D")]:
        assert grade(f"\\boxed{{{answer}}}", gold).correct, answer
        assert _math_verify(normalize(answer), normalize_gold(gold)), answer
    for answer, gold in [("b", "C"), ("(a)", "(B)"), ("c", "3")]:
        assert not grade(f"\\boxed{{{answer}}}", gold).correct, answer
    # Other letters are still told apart here, whatever their case.
    assert fast_verdict("b", "C") is False and fast_verdict("(a)", "(B)") is False


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(
    ("boxed", "gold", "right"),
    [
        ("\\textbf{(C)}\\ 142", "142", True),  # AMC golds are the value
        ("\\textbf{(C) }142", "142", True),
        ("\\text{(C)}~\\frac{1}{2}", "\\frac12", True),
        ("(C)\\qquad 142", "142.0", True),
        ("\\textbf{(C)}\\ 142", "\\text{(C)}", True),  # MATH golds are the letter
        ("\\textbf{(C)}\\ 141", "142", False),
        ("\\textbf{(B)}\\ 142", "\\text{(C)}", False),
        ("\\textbf{(C)}\\ 142", "141", False),
        ("(A) \\text{ and } (B)", "\\text{(A)}", False),  # two choices are no choice
        ("(A), 5", "\\text{(A)}", False),
        ("(C) 142", "(C) 142", True),  # a gold written the same way
        ("\\textbf{(C)}\\ 142", "\\textbf{(C)}\\ 142", True),
        ("(E) \\frac{1}{2}", "\\textbf{(E) }\\frac{1}{2}", True),
        ("(D)\\ 18", "\\mathrm{(D)}\\ 18", True),
        ("(C) 141", "(C) 142", False),
        ("(B) 142", "(C) 142", False),
    ],
)
def test_a_choice_boxed_with_its_value_is_read_as_the_gold_asks(boxed, gold, right, strict):
    assert grade(f"so $\\boxed{{{boxed}}}$", gold, strict=strict).correct is right


@pytest.mark.parametrize(
    ("answer", "gold", "right"),
    [
        ("1950", "1950^\\circ C\n", True),  # a Minerva gold
        ("1950^\\circ \\text{C}", "1950^\\circ C", True),
        ("1950 { }^{\\circ} \\mathrm{C}", "1950", True),
        ("1950\\,^{\\circ}\\mathrm{C}", "1950", True),
        ("1950°C", "1950", True),
        ("77^\\circ F", "77", True),
        ("1951", "1950^\\circ C", False),
        ("1951^\\circ C", "1950", False),
        ("1950 C", "1950", False),  # no degree sign: C may be a constant
        ("100 \\text{ }^\\circ \\text{C}", "100", True),  # the braces of \\text{ } are the command's
        ("100\\text{ }^{\\circ}\\text{C}", "100", True),
        ("100~^{\\circ}\\mathrm{C}", "100", True),
        ("100", "100 \\text{ }^\\circ \\text{C}", True),
        ("101 \\text{ }^\\circ \\text{C}", "100", False),
        ("101~^{\\circ}\\mathrm{C}", "100", False),
    ],
)
def test_degrees_celsius_are_a_unit_on_either_side(answer, gold, right):
    assert grade(f"\\boxed{{{answer}}}", gold, strict=True).correct is right


def test_a_temperature_unit_goes_only_where_a_value_ends():
    assert normalize("(20^\\circ C, 30^\\circ F)") == "(20, 30)"
    assert normalize("30^\\circ C = 5") != "30 = 5"
    assert normalize("\\angle C = 30^\\circ") == "\\angle C = 30"


# (answer, gold, right?): a temperature's scale is compared where both sides write one; a value written
# without a scale is compared by its value, as in `test_degrees_celsius_are_a_unit_on_either_side`.
TEMPERATURE_SCALES = [
    ("100^\\circ C", "100^\\circ F", False),
    ("100^\\circ F", "100^\\circ C", False),
    ("100\\text{ }^{\\circ}\\text{F}", "100^\\circ C", False),
    ("1950°F", "1950^\\circ C\n", False),  # the Minerva gold
    ("100^\\circ \\text{Fahrenheit}", "100^\\circ C", False),
    ("T = 100^\\circ F", "100^{\\circ} \\mathrm{C}", False),
    ("212^\\circ F", "100^\\circ C", False),  # the same temperature, but no scale is converted
    ("101^\\circ C", "100^\\circ C", False),
    ("101", "100^\\circ F", False),
    ("100^\\circ C", "100^\\circ C", True),
    ("100°C", "100^{\\circ} \\mathrm{C}", True),
    ("T = 100^\\circ F", "100 \\text{ }^\\circ \\text{F}", True),
    ("100", "100^\\circ F", True),
    ("100^\\circ F", "100", True),
]


def test_a_temperature_in_another_scale_is_wrong():
    mismatches = [
        (answer, gold)
        for answer, gold, right in TEMPERATURE_SCALES
        for verdict in (
            grade(f"\\boxed{{{answer}}}", gold, strict=True),
            grade(f"The final answer is ${answer}$. I hope it is correct.", gold),
            grade("lorem ipsum " * 5000 + f"\\boxed{{{answer}}}", gold),  # long: graded in a worker
        )
        if verdict.correct is not right or not verdict.gold_ok
    ]
    assert mismatches == []


def test_a_list_gold_accepts_a_temperature_in_the_scale_of_one_of_its_elements():
    golds = ["100^\\circ C", "212^\\circ F"]
    assert grade("\\boxed{212^\\circ F}", golds).correct
    assert grade("\\boxed{100^\\circ C}", golds).correct
    assert not grade("\\boxed{100^\\circ F}", golds).correct
    assert not grade("\\boxed{212^\\circ C}", golds).correct


def test_the_worker_compares_temperature_scales_too():
    from rewards.grading.verify import check

    celsius, fahrenheit = normalize("100^\\circ C"), normalize("100^\\circ F")
    assert check((fahrenheit, (celsius,))) == (False, (True,), False)
    assert check((celsius, (celsius,))) == (True, (True,), False)
    assert check(("100", (fahrenheit,))) == (True, (True,), False)
    assert check((fahrenheit, ("100",))) == (True, (True,), False)


# (answer, gold, right?): thousands groups set apart by a space, `\ `, `\,` or a tie are one number; digits
# that are not such groups are not (a list, or a number and more).
SPACED_THOUSANDS = [
    ("1 000", "1000", True),
    ("1\\ 000", "1000", True),
    ("1\\,000", "1000", True),
    ("1~000", "1000", True),
    ("1 000 000", "1000000", True),
    ("12 345", "12345", True),
    ("-12 345.5", "-12345.5", True),
    ("1000", "1 000", True),
    ("1 000", "100", False),
    ("1 000", "1", False),
    ("12 345", "12346", False),
    ("1 000 000", "100000", False),
    ("1 2 3", "123", False),
    ("10 20", "1020", False),
    ("1 234 5", "12345", False),
    ("12 34", "1234", False),
    ("1234 567", "1234567", False),
]


def test_thousands_groups_set_apart_by_a_space_are_one_number():
    mismatches = [
        (answer, gold)
        for answer, gold, right in SPACED_THOUSANDS
        for verdict in (
            grade(f"\\boxed{{{answer}}}", gold, strict=True),
            grade(f"The answer is ${answer}$.", gold),
        )
        if verdict.correct is not right or not verdict.gold_ok
    ]
    assert mismatches == []
    assert [normalize(text) for text in ("1 000 000", "12\\ 345", "1 2 3", "10 20", "x1 000", "0.5 100")] == [
        "1000000",
        "12345",
        "1 2 3",
        "10 20",
        "x1 000",
        "0.5 100",
    ]


# (answer, gold, right?): `1,000` with a group led by a zero is one number inside brackets too. Pairs written
# without a space after the comma stay pairs where no group is led by a zero (MATH's golds write `(4,112)`).
# `(1,000)` against `(1000)` is right: a tuple's element is not written `000`, so `(1,000)` can only be the
# number 1000 in brackets, which is what `(1000)` is (math-verify reads both as the number, like `1000`).
BRACKETED_THOUSANDS = [
    ("(1,000)", "(1,0)", False),
    ("(1,000)", "(1, 0)", False),
    ("(1,0)", "(1,000)", False),
    ("(1,001)", "(1,1)", False),
    ("(1,000, 2)", "(1, 0, 2)", False),
    ("(1,000)", "(1001)", False),
    ("(1,000)", "(1000)", True),
    ("(1,000)", "1000", True),
    ("(2,050, 7)", "(2050, 7)", True),
    ("1,000", "1000", True),
    ("(1,2)", "(1,2)", True),
    ("(1,500)", "(1, 500)", True),
    ("(4,112)", "(4, 112)", True),
    ("(1,500)", "1500", False),
]


def test_thousands_groups_led_by_a_zero_inside_brackets_are_one_number():
    mismatches = [
        (answer, gold)
        for answer, gold, right in BRACKETED_THOUSANDS
        if grade(f"\\boxed{{{answer}}}", gold).correct is not right
    ]
    assert mismatches == []
    assert normalize("(1,000)") == "(1000)" and normalize("(4,112)") == "(4,112)"


# (answer, gold, right?): a relation between one variable and constants is the set it defines, against a
# gold that is certainly a set of reals; an inequality in an expression restates a question and stays wrong.
RELATIONS_AS_SETS = [
    ("x > 2", "(2,\\infty)", True),
    ("2 < x", "(2, \\infty)", True),
    ("x \\neq 2", "(-\\infty,2)\\cup(2,\\infty)", True),
    ("x \\leq -1", "(-\\infty, -1]", True),
    ("x > 3", "(2,\\infty)", False),
    ("x < 2", "(2,\\infty)", False),
    ("x \\geq 2", "(2,\\infty)", False),
    ("x > 2", "[2,\\infty)", False),
    ("x^2 > 4", "(-\\infty,-2)\\cup(2,\\infty)", False),
    ("x + y > 2", "(2,\\infty)", False),
    ("1 < x < 2", "(1,2)", False),  # `(1, 2)` may be a point of the plane
]


def test_a_relation_of_one_variable_equals_the_interval_it_defines():
    mismatches = [
        (answer, gold)
        for answer, gold, right in RELATIONS_AS_SETS
        if grade(f"\\boxed{{{answer}}}", gold).correct is not right
    ]
    assert mismatches == []


@pytest.mark.parametrize(
    ("answer", "gold", "right"),
    [
        ("5 dollars", "5", True),  # words math-verify's unit list misses
        ("5", "5 dollars", True),
        ("3.25 dollars", "3.25\\text{ dollars}", True),
        ("18 integers", "18", True),
        ("40 points.", "40", True),
        ("\\frac{1}{2} dollar", "\\frac12", True),
        ("6 dollars", "5", False),
        ("5", "6 dollars", False),
        ("17 integers", "18", False),
        ("x dollars", "5", False),
    ],
)
def test_bare_unit_words_math_verify_misses_go_on_either_side(answer, gold, right):
    assert grade(f"\\boxed{{{answer}}}", gold, strict=True).correct is right
    assert grade(f"The answer is {answer}.", gold).correct is right


# (answer, gold, right?): a scale word multiplies the number before it; a question may also count in that
# scale ("How many million tons of apples are used for apple juice?", gold `2.2`, in MATH), so the number as
# written is right too. Any other value is wrong.
SCALE_WORDS = [
    ("3 \\text{ million}", "3000000", True),
    ("5\\text{ thousand}", "5000", True),
    ("\\$20 \\text{ million}", "20,\\!000,\\!000", True),  # a MATH gold ("$30 million in damage")
    ("20 million dollars", "20000000", True),
    ("\\text{20 million}", "20000000", True),
    ("20 \\mathrm{~million}", "20000000", True),
    ("54 \\text{ thousand square meters}", "54000", True),  # "to the nearest thousand square meters"
    ("1.5 \\text{ billion}", "1500000000", True),
    ("-4 \\text{ Thousand}", "-4000", True),
    ("x = 2.5 \\text{ millions}", "2500000", True),
    ("2.2 \\text{ million tons}", "2.2", True),
    ("3 \\text{ million}", "3", True),
    ("3 \\text{ million}", "3000", False),
    ("3 \\text{ million}", "3001000", False),
    ("3 \\text{ thousand}", "3000000", False),
    ("2.3 \\text{ million}", "2.2", False),
    ("2.3 \\text{ million}", "2200000", False),
    ("5 \\text{ thousandths}", "5000", False),  # not a scale word
]


@pytest.mark.parametrize(("answer", "gold", "right"), SCALE_WORDS)
def test_a_scale_word_multiplies_the_number_before_it(answer, gold, right):
    assert grade(f"\\boxed{{{answer}}}", gold, strict=True).correct is right
    assert grade(f"The answer is ${answer}$.", gold).correct is right


def test_a_scale_word_is_read_in_a_worker_as_in_process():
    padding = "x" * (IN_PROCESS_MAX_CHARS + 1)  # extracted in a worker
    assert grade(f"{padding} \\boxed{{3 \\text{{ million}}}}", "3000000").correct
    assert grade(f"{padding} \\boxed{{3 \\text{{ million}}}}", "3").correct
    assert not grade(f"{padding} \\boxed{{3 \\text{{ million}}}}", "3000").correct


@pytest.mark.parametrize(
    ("answer", "gold", "right"),
    [
        ("602000000000000000000000", "6.02 \\times 10^{23}", True),
        ("6.02e23", "6.02 \\times 10^{23}", True),
        ("6.02 \\times 10^{23}", "602000000000000000000000", True),
        ("60200000000", "6.02 \\times 10^{10}", True),
        ("2998000000000000", "2.998 \\cdot 10^{15}", True),
        ("602000000000000000000001", "6.02 \\times 10^{23}", False),
        ("603000000000000000000000", "6.02 \\times 10^{23}", False),
        ("60300000000", "6.02 \\times 10^{10}", False),
        ("6.02 \\times 10^{22}", "602000000000000000000000", False),
    ],
)
def test_a_decimal_in_scientific_notation_equals_its_exact_value(answer, gold, right):
    # Equal values written two ways; math-verify reads the decimal as a float and misses some of them.
    assert grade(f"\\boxed{{{answer}}}", gold, strict=True).correct is right


@pytest.mark.parametrize(
    ("answer", "gold", "right"),
    [
        ("6.43 \\times 10^{16} \\text{ cm}^{-3}", "6.43 \\times 10^{16}", True),
        ("6.43 \\times 10^{16}", "6.43 \\times 10^{16} \\text{ cm}^{-3}", True),  # a Minerva gold
        ("3 \\text{ s}^{-1}", "3", True),
        ("15000 \\text{ kcal m}^{-2} \\text{yr}^{-1}", "15000", True),
        ("15000", "15000 \\text{ kcal m}^{-2} \\text{yr}^{-1}\n", True),  # a Minerva gold
        ("6.44 \\times 10^{16} \\text{ cm}^{-3}", "6.43 \\times 10^{16}", False),
        ("15001", "15000 \\text{ kcal m}^{-2} \\text{yr}^{-1}", False),
    ],
)
def test_units_with_negative_powers_and_compound_units_go(answer, gold, right):
    assert grade(f"\\boxed{{{answer}}}", gold, strict=True).correct is right


def test_golds_newly_known_parseable_are_parseable():
    for text in ("(D)", "2x + z - 5 = 0", "\\begin{pmatrix} 1 & -1 \\\\ 1 & 1 \\end{pmatrix}", "-3 + 6i"):
        assert surely_parseable(text) and parse_text(text) is not None, text


def test_integer_sums_are_equal_as_math_verify_reads_them():
    assert fast_verdict("0-14", "-14") is True and _math_verify("0-14", "-14")


# (answer, gold) as written, where math-verify says equal and the fast path may only defer to it.
MATH_VERIFY_SAYS_EQUAL = {
    "a unit after an expression": [
        ("2k \\text{ cm}", "2k"),
        ("2k \\text{ cm}", "2k \\text{ m}"),
        ("n\\text{ ways}", "n"),
        ("2\\pi r\\text{ m}", "2\\pi r"),
        ("x m", "x"),
        ("y = -2x \\text{ cm}", "y = -2x"),
        ("\\frac{1}{\\sqrt{2}}", "\\frac{1}{\\sqrt{2}}c"),  # the gold's `c` is a unit to math-verify
    ],
    "a word in a wrapper, after a name or before a unit": [
        ("\\textit{Evelyn}", "\\text{Evelyn}"),
        ("\\mathbf{Evelyn}", "\\text{Evelyn}"),
        ("\\textbf{\\text{Evelyn}}", "\\text{Evelyn}"),
        ("x = Evelyn", "\\text{Evelyn}"),
        ("\\mathbf{Even}", "\\text{even}"),
        ("\\textit{Sunday}", "\\text{Sunday}"),
        ("None cm", "None"),
    ],
    "a gold assigning to a function, subscripted symbols or a sum of symbols": [
        ("\\frac{x-3}{2}", "f^{-1}(x) = \\frac{x-3}{2}"),
        ("x+1", "g^{-1}(x)=x+1"),
        ("7", "a_1 + a_2 = 7"),
        ("3", "x_{1} + x_{2} = 3"),
        ("3", "f_1(x) = 3"),
        ("3", "x + y = 3"),
        ("3", "x^{-1} = 3"),
    ],
}
# (answer, gold) where math-verify says different: a leading zero before a thousands separator is a
# decimal comma to it (`058,500` is 58.5).
MATH_VERIFY_SAYS_DIFFERENT = [("058,500", "58,500"), ("061,328", "61,328"), ("0,500", "500")]


@pytest.mark.parametrize(
    ("kind", "answer", "gold"), [(k, a, g) for k, cases in MATH_VERIFY_SAYS_EQUAL.items() for a, g in cases]
)
def test_fast_path_defers_where_math_verify_says_equal(kind, answer, gold):
    from rewards.grading.grade import _verdict

    a, g = normalize(answer), normalize_gold(gold)
    assert _math_verify(a, g) is True, kind
    assert _verdict(a, g) is not False, (kind, a, g)
    assert grade(f"\\boxed{{{answer}}}", gold).correct, kind


@pytest.mark.parametrize(("answer", "gold"), MATH_VERIFY_SAYS_DIFFERENT)
def test_a_leading_zero_before_a_thousands_separator_is_left_to_math_verify(answer, gold):
    assert _math_verify(answer, gold) is False
    assert fast_verdict(answer, gold) is None
    assert not grade(f"\\boxed{{{answer}}}", gold).correct


def test_near_misses_of_units_words_and_thousands_are_still_decided_here():
    from rewards.grading.grade import _verdict

    for answer, gold in [
        ("2k \\text{ cm}", "3k"),
        ("2k", "3k"),
        ("7 cm", "5"),
        ("5i", "5"),
        ("x + y", "x + 2y"),
        ("\\textit{Emily}", "\\text{Evelyn}"),
        ("x = Emily", "\\text{Evelyn}"),
        ("Emily", "\\text{Evelyn}"),
    ]:
        a, g = normalize(answer), normalize_gold(gold)
        assert _math_verify(a, g) is False and _verdict(a, g) is False, (a, g)
    for answer, gold in [
        ("\\text{Even}", "even"),
        ("058500", "58500"),
        ("58,500", "58500"),
        ("1,000", "1000"),
    ]:
        assert _verdict(normalize(answer), normalize_gold(gold)) is True, answer


def test_units_dropped_here_include_the_one_letter_units_math_verify_drops():
    from latex2sympy2_extended.math_normalization import units

    from rewards.grading.fastpath import _ONE_LETTER_UNITS

    assert {u for u in units if len(u) == 1} <= _ONE_LETTER_UNITS


# -- the gold side of the API -----------------------------------------------------


@pytest.mark.parametrize("gold", [None, float("nan"), "\\frac{", "x^{2", ["\\frac{", None]])
def test_missing_or_malformed_gold_is_not_ok(gold):
    for completion in ("\\boxed{None}", "\\boxed{\\frac{}", "\\boxed{1}", "no answer"):
        verdict = grade(completion, gold)
        assert verdict.gold_ok is False and verdict.correct is False, (gold, completion)


def test_a_list_gold_with_one_malformed_element_uses_the_others():
    assert grade("\\boxed{1}", ["\\frac{", "1"]).correct
    assert correctness_reward(["\\boxed{None}", "\\boxed{2}"], answer=[None, "2"]) == [None, 1.0]


# -- words around the answer ------------------------------------------------------------------------

MATRIX = "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"


@pytest.mark.parametrize(
    ("boxed", "gold"),
    [
        # words before the number that deny, bound or change it: the number alone is not the answer
        ("\\text{square root of } 3", "3"),
        ("\\text{less than or equal to } 3", "3"),
        ("\\text{less than or equal } 3", "3"),
        ("\\text{greater than or equal to } 3", "3"),
        ("\\text{half of } 3", "3"),
        ("\\text{multiples of } 3", "3"),
        ("\\text{NO } 3", "3"),
        ("\\text{False, } 3", "3"),
        ("\\text{Wrong, } 3", "3"),
        ("\\text{Incorrect: } 3", "3"),
        ("\\text{Neither, } 3", "3"),
        ("\\text{anything but } 3", "3"),
        ("\\text{any number other than } 3", "3"),
        ("\\text{up to } 3", "3"),
        ("\\text{twice } 3", "3"),
        ("\\text{the reciprocal of } 3", "3"),
        ("\\text{divisible by } 3", "3"),
        # and before a matrix
        ("\\text{not } " + MATRIX, MATRIX),
        ("\\text{not equal to } " + MATRIX, MATRIX),
        ("\\text{the transpose of } " + MATRIX, MATRIX),
        ("\\text{anything but } " + MATRIX, MATRIX),
        ("not " + MATRIX, MATRIX),
    ],
)
def test_words_that_deny_or_change_the_answer_are_kept(boxed, gold):
    assert not grade(f"so $\\boxed{{{boxed}}}$", gold).correct


@pytest.mark.parametrize(
    ("boxed", "gold"),
    [
        ("\\text{The answer is } 3", "3"),
        ("\\text{so } 3", "3"),
        ("\\text{Thus, the answer is } 3", "3"),
        ("\\text{Therefore } 3", "3"),
        ("\\text{Final answer: } 3", "3"),
        ("\\text{The answer is: } 3", "3"),
        ("\\text{She has } 12", "12"),
        ("\\text{There are } 12", "12"),
        ("\\text{The answer is } x = 3", "3"),
        ("\\text{The area is approximately } 28.27", "28.27"),
        ("\\text{Approximately } 0.33", "0.33"),
        ("\\text{Exactly } 5", "5"),
        ("\\text{In total, } 12", "12"),
        ("\\text{It will take } 3 \\text{ days}", "3"),
        ("\\text{She needs } 7 \\text{ more}", "7"),
        ("\\text{He can buy } 6", "6"),
        ("\\text{all } x \\geq 3", "x \\geq 3"),
        ("\\text{The vector is } " + MATRIX, MATRIX),
        ("\\text{so } \\mathbf{v} = " + MATRIX, MATRIX),
        ("The vector is " + MATRIX, MATRIX),
        ("\\mathbf{v} = " + MATRIX, MATRIX),
    ],
)
def test_words_that_introduce_the_answer_are_dropped(boxed, gold):
    assert grade(f"so $\\boxed{{{boxed}}}$", gold).correct


@pytest.mark.parametrize(
    ("completion", "gold", "right"),
    [
        ("The roots are $\\boxed{2 \\text{ and } -5}$.", "2, -5", True),
        ("$\\boxed{-3 \\text{ and } -2}$", "\\{-3,-2\\}", True),
        ("$\\boxed{2 \\text{ and } \\sqrt{3}}$", "2, \\sqrt{3}", True),
        ("$\\boxed{-2.5 \\text{ and } -5}$", "-2.5, -5", True),
        ("\\boxed{-3, -5}", "-3 \\text{ and } -5", True),
        ("\\boxed{\\{-3,-5\\}}", "-3 \\text{ and } -5", True),
        ("$\\boxed{-1 \\text{ and } -7}$", "-2,-1", False),
        ("$\\boxed{2 \\text{ and } 5}$", "2, -5", False),
        ("\\boxed{-3, -4}", "-3 \\text{ and } -5", False),
    ],
)
def test_values_joined_by_and_are_a_list(completion, gold, right):
    assert grade(completion, gold).correct is right


def test_the_fast_path_reads_no_product_of_letters_in_and_or():
    assert fast_verdict("2 and -5", "2, -5") is None and fast_verdict("-3, -5", "-3 and -5") is None
    assert fast_verdict("2 or -5", "2, -5") is None
    assert fast_verdict("2band", "3") is False  # a product of letters is still one


@pytest.mark.parametrize(
    ("boxed", "gold", "right"),
    [
        ("12.25 \\text{(approx.)}", "12.25", True),
        ("7 \\text{ (approximately)}", "7", True),
        ("\\frac{1}{2} \\text{ (exact)}", "\\frac12", True),
        ("3.14 \\text{ (rounded to two decimal places)}", "3.14", True),
        ("(-1, 8) \\text{(approx.)}", "(-1,8)", True),
        ("\\textbf{(B)} \\text{(approx.)}", "\\text{(B)}", False),  # math-verify: text, not the choice
        ("12.25 \\text{(approx.)}", "12.5", False),
        ("\\frac{1}{2} \\text{ (exact)}", "\\frac13", False),
    ],
)
def test_a_note_on_how_the_value_is_given_goes(boxed, gold, right):
    assert grade(f"$\\boxed{{{boxed}}}$", gold).correct is right


def test_a_note_that_says_more_than_how_the_value_is_given_stays():
    assert normalize("7 \\text{ (not exact)}") != "7" and normalize("3 \\text{ (or more)}") != "3"
    assert normalize("\\text{(}1, 2\\text{)}") == "(1, 2)"


@pytest.mark.parametrize(
    ("boxed", "gold", "right"),
    [
        ("12 \\text{ (since the sum is even)}", "12", True),
        ("12 \\ (\\text{because } 3 \\cdot 4 = 12)", "12", True),
        ("\\frac{1}{2} \\text{ (by symmetry)}", "0.5", True),
        ("(2, 3) \\text{ (since } x > 0)", "(2,3)", True),
        ("12 \\text{ (as required)}.", "12", True),
        ("13 \\text{ (since the sum is odd)}", "12", False),
        ("\\frac{1}{3} \\text{ (by symmetry)}", "0.5", False),
        ("12 \\text{ (as well as 13)}", "12", False),  # another value, not a reason
        ("12 \\text{ (if } x > 0)", "12", False),  # a condition
        ("12 \\text{ (or 13)}", "12", False),
        ("12 \\text{ (not 13)}", "12", False),
    ],
)
def test_a_reason_in_parentheses_after_the_value_goes(boxed, gold, right):
    assert grade(f"$\\boxed{{{boxed}}}$", gold, strict=True).correct is right
    assert grade(f"$\\boxed{{{boxed}}}$", gold).correct is right


def test_a_line_of_abbreviations_is_read_in_linear_time():
    # Each full stop after an abbreviation (`No.`) once re-read the whole line before it: 12,000 took 17 s,
    # and this line (100,000) would take about 20 minutes. Read linearly, it takes well under a second.
    abbreviations = "No. " * 100_000
    assert extract_lenient("Let me check. The answer is " + abbreviations) == abbreviations.rstrip(" .")
    assert extract_lenient("The answer is " + "e.g. St. vs. " * 30_000 + "7. Then 8.").endswith("vs. 7")
    assert not grade("Let me check. The answer is " + "No. " * 12_000, "5").correct


def test_fast_path_docstrings_show_and_test_latex_fractions():
    for func in (fastpath._different_assignments, fastpath._readings):
        assert "\f" not in func.__doc__ and "\\frac{" in func.__doc__
    # the example compares the fraction, as written in LaTeX, not a form feed followed by `rac`
    assert '"x = \\\\frac{y - 3}{2}"' in fastpath._different_assignments.__doc__


# -- reading the answer out of the text -------------------------------------------------------------

MINERVA = "Final Answer: The final answer is $%s$. I hope it is correct."


def test_a_box_in_the_minerva_sentence_is_read_as_a_box():
    assert extract_lenient(MINERVA % "\\boxed{20412_6}") == "20412_{6}"
    assert extract_lenient(MINERVA % "\\boxed{\\dfrac{1}{2}}") == "\\frac{1}{2}"
    assert not grade(MINERVA % "\\boxed{20412_6}", "20412_5").correct  # another base
    assert grade(MINERVA % "\\boxed{20412_5}", "20412_5").correct
    assert grade(MINERVA % "\\boxed{3,14}", "3.14").correct  # a decimal comma
    assert extract_lenient(MINERVA % "7") == "7"


def test_an_answer_on_the_line_after_the_phrase_is_read():
    assert extract_lenient("The final answer is:\n\n42") == "42"
    assert extract_lenient("The answer is\n\\[ 42 \\]") == "42"
    assert extract_lenient("The final answer is:\n$$\n\\frac{1}{2}\n$$") == "\\frac{1}{2}"
    assert grade("The final answer is:\n\n42", "42").correct
    assert not grade("The final answer is:\n\n41", "42").correct
    # nothing after the phrase: the last number
    assert extract_lenient("We count 17 cases. The final answer is:\n\n") == "17"


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("The answer is 7 because 2+3=5.", "7"),
        ("Thus the answer is 12, as required.", "12"),
        ("The answer is 3 since x = 3.", "3"),
        ("The answer is $\\frac{1}{2}$, which is the probability.", "\\frac{1}{2}"),
        ("The answer is 4; the rest follows.", "4"),
        ("The answer is **7**, as required.", "7"),
        ("The answer is (3, 4), since both work.", "(3, 4)"),
        ("The answer is [1, 2), as shown.", "[1, 2)"),
    ],
)
def test_a_justification_after_the_answer_is_not_part_of_it(completion, answer):
    assert extract_lenient(completion) == answer


@pytest.mark.parametrize(
    "answer",
    [
        "(1, 2)",
        "\\{1, 2\\}",
        "1, 2, 3",
        "1, 2, and 3",
        "1, 2, or 3",
        "x = 1, y = 2",
        "AB=9, CD=4",
        "x = 1, yz = 2",
        "Monday, Tuesday",
        "x=1; y=2",
    ],
)
def test_an_answer_with_commas_is_cut_only_at_its_justification(answer):
    assert extract_lenient(f"The answer is {answer}, as shown.") == answer
    assert extract_lenient(f"The answer is {answer} because it works.") == answer


def test_a_justification_neither_makes_a_wrong_answer_right_nor_a_right_one_wrong():
    assert grade("The answer is x=1; y=2.", "(1, 2)").correct  # a semicolon between the parts is no cut
    assert not grade("The answer is 7 because 2+3=5.", "5").correct
    assert grade("The answer is 7 because 2+3=5.", "7").correct
    assert grade("Thus the answer is 12, as required.", "12").correct
    assert not grade("Thus the answer is 12, as required.", "13").correct


def test_a_label_before_a_relation_stays_with_its_value():
    assert normalize("\\text{Area } = 25") == "Area = 25"
    assert normalize("\\text{Area } < 25") == "Area < 25"
    assert grade("\\boxed{\\text{Area } = 25}", "25").correct
    assert not grade("\\boxed{\\text{Area } = 26}", "25").correct


def test_sized_delimiters_go_but_arrows_stay():
    assert normalize("A \\rightarrow B") == "A \\rightarrow B"
    assert normalize("\\leftarrow") == "\\leftarrow" and normalize("\\leftrightarrow") == "\\leftrightarrow"
    assert normalize("\\left. 3 \\right.") == "3"
    assert normalize("\\left( 1, 2 \\right)") == "( 1, 2 )"
    assert grade("\\boxed{\\left. 3 \\right.}", "3").correct


def test_the_last_number_joins_digits_only_across_thousands_groups():
    assert extract_lenient("So the point is (3,4)") == "4"
    assert extract_lenient("It costs 12,5 euros") == "5"
    assert extract_lenient("we get 3 apples and 1,250 pears") == "1250"
    assert extract_lenient("a loss of \u22121,000,000.5") == "-1000000.5"
    assert not grade("So the point is (3,4)", "34").correct
    assert not grade("It costs 12,5 euros", "125").correct


def test_a_bool_gold_and_the_equal_number_are_different_golds():
    from rewards.grading.grade import _gold_texts

    _gold_texts.cache_clear()
    assert grade("\\boxed{True}", True).correct
    assert [g.correct for g in grade_batch(["\\boxed{1}", "\\boxed{0}"], [1.0, 0.0])] == [True, True]
    assert [g.correct for g in grade_batch(["\\boxed{1}"], [[1.0]])] == [True]
    _gold_texts.cache_clear()
    assert grade("\\boxed{1}", 1.0).correct and grade("\\boxed{0}", [0.0]).correct
    assert grade("\\boxed{True}", True).correct and grade("\\boxed{False}", [False]).correct
