"""Training curves as pictures: ``python -m prompt_aug.plot RUN_DIR [RUN_DIR ...] -o curves.png``.

Also the ``prompt-aug-plot`` script. Each RUN_DIR is a training output folder. Its metrics come from the
history written last among its own ``trainer_state.json``, its ``checkpoint-*`` folders' and its
``logs.jsonl`` (written line by line, so a live or crashed run is drawn past its last checkpoint), or from a
longer one that agrees with it at every step both logged (a finished run resumed to train further has newer
checkpoints than its own state); a longer one that disagrees, a line abandoned by a resume from an earlier
checkpoint, is set aside with a warning. ``eval/results.json`` (written by ``prompt-aug-eval``) gives the
final evaluation, drawn at the step of the folder's weights (not where those weights end a line set aside).
Several runs are overlaid, one colour per run, named by their folders (``--names`` to relabel; ``--groups``,
one per run, to give an arm's seeds one colour and a line style each). Panels without data in any run are
left out.

Per-template panels give each template one colour in every panel, a different one for each name drawn
(built-in templates keep theirs in every picture; other names take the colours left, in the sorted order of
the names drawn), leave a gap where a round did not draw the template, and share one legend below the
panels. ``--x round`` counts generation rounds (the logged ``round`` key) instead of optimizer steps.
Where the collapse guard fired (``collapse/fired/<signal>`` in the log), every panel has a dotted
line, labelled with the signal on the first panel.

With dynamic sampling, the training accuracy, total reward and truncation panels draw those metrics over
every generated completion (``dynamic_sampling/generated/...``), as the per-template panels and the collapse
guard read them, not TRL's over the trained groups only, so a DAPO run compares with a GRPO one; their y
label says so.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display needed
import matplotlib.pyplot as plt
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.colors import hsv_to_rgb
from matplotlib.ticker import MaxNLocator

from .evaluation.report import shown_name
from .model_card import ACCURACY_KEYS, evaluation_made_by, weights_match
from .records import (
    GENERATED,
    LOG_FILE,
    LogFileError,
    checkpoint_folders,
    generated_first,
    is_number,
    read_log_entries,
)
from .templates import DEFAULT_EVAL_TEMPLATE, load_templates

logger = logging.getLogger("prompt_aug.plot")

# (panel title, y label, metric keys: the first key a run has is drawn, whether the values are fractions).
# A dynamic-sampling run's metrics over every generated completion come before TRL's over the trained rows.
CURVES: list[tuple[str, str, list[str], bool]] = [
    ("Entropy", "nats / token", ["entropy"], False),
    (
        "Training accuracy",
        "share graded right",
        list(generated_first(ACCURACY_KEYS)),
        True,
    ),
    ("Total reward", "reward", list(generated_first(["reward"])), False),
    ("Completion length", "tokens", ["completions/mean_length"], False),
    (
        "Truncation rate",
        "fraction cut at the length limit",
        list(generated_first(["completions/clipped_ratio"])),
        True,
    ),
]
# The y label's second line where a run draws a dynamic-sampling key: every rollout, kept or dropped.
GENERATED_NOTE = "(all generated, dynamic sampling)"
_TEMPLATE_ACCURACY = re.compile(r"^templates/([^/]+)/accuracy$")  # not templates/<name>/rewards/accuracy


class PlotError(ValueError):
    """A run folder cannot be plotted; the message names it."""


@dataclass
class Run:
    """One training run: its name, logged history and final evaluation (if any)."""

    name: str
    path: Path
    history: list[dict[str, Any]]
    eval_results: dict[str, Any] | None = None
    final_step: int = 0
    template_keys: list[str] = field(default_factory=list)
    eval_step: int | None = None  # the step of the weights the evaluation was made by (the folder's own)


def find_trainer_state(run_dir: str | Path) -> Path:
    """The newest ``trainer_state.json``, ``run_dir``'s or a ``checkpoint-*`` folder's (`latest_state`)."""
    return latest_state(run_dir)[0]


def latest_state(run_dir: str | Path) -> tuple[Path, dict[str, Any]]:
    """The path and contents of the newest trainer state in ``run_dir`` (`find_trainer_state`).

    Raises:
        PlotError: as `trainer_states`.
    """
    return _newest(trainer_states(run_dir))


def _newest(states: list[tuple[Path, dict[str, Any]]]) -> tuple[Path, dict[str, Any]]:
    """The newest history: the last written (modification time; the highest step, then the first listed, on
    a tie), or the one reaching furthest among those that agree with it at every step both logged (the
    folder's own first on a tie: it holds the end-of-training summary). A history reaching further that
    disagrees (a line abandoned by a resume from an earlier checkpoint) is set aside, in one warning."""
    times = [path.stat().st_mtime_ns for path, _ in states]
    last = max(range(len(states)), key=lambda i: (times[i], _state_step(states[i][1]), -i))
    steps = _steps(states[last][1])
    same_line = [found for found in states if _agree(steps, _steps(found[1]))]
    chosen = max(same_line, key=lambda found: _state_step(found[1]))
    aside = [found for found in states if _state_step(found[1]) > _state_step(chosen[1])]
    if aside:
        longest = max(aside, key=lambda found: _state_step(found[1]))
        logger.warning(
            "drawn from %s (to step %d); %s reaches step %d but logs other values at the steps both have "
            "(a line a resume from an earlier checkpoint abandoned?), set aside",
            chosen[0], _state_step(chosen[1]), longest[0], _state_step(longest[1]),
        )  # fmt: skip
    return chosen


def _steps(state: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Step -> the keys a history logged at that step, the end-of-training summary left out."""
    merged: dict[int, dict[str, Any]] = {}
    for entry in state["log_history"]:
        if "train_runtime" not in entry:
            merged.setdefault(int(entry["step"]), {}).update(entry)
    return merged


def _agree(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> bool:
    """Whether two histories (`_steps`) log the same value of every key both have at every step both have.

    >>> _agree({1: {"x": 1.0, "y": 2.0}, 2: {"x": 3.0}}, {1: {"x": 1.0}, 3: {"x": 9.0}})
    True
    >>> _agree({1: {"x": 1.0}}, {1: {"x": 1.5}}), _agree({1: {"x": math.nan}}, {1: {"x": math.nan}})
    (False, True)
    """
    for step in a.keys() & b.keys():
        for key in a[step].keys() & b[step].keys():
            x, y = a[step][key], b[step][key]
            if x != y and not (
                isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
            ):
                return False
    return True


def trainer_states(run_dir: str | Path, logs: bool = False) -> list[tuple[Path, dict[str, Any]]]:
    """The path and contents of each trainer state in ``run_dir``: its own, then its checkpoints'; with
    ``logs``, then its ``logs.jsonl`` as a state (its lines the log history, its last step the global step;
    a last line cut short, being written, left out). A file that cannot be read (a checkpoint being written)
    is skipped with a warning while another can be.

    Raises:
        PlotError: a file or no such folder, no trainer state (nor, with ``logs``, log) in it, or none that
            can be read; names the folder or file.
    """
    run_dir = Path(run_dir)
    if run_dir.is_file():  # trainer_state.json or logs.jsonl given for its folder
        raise PlotError(
            f"{run_dir}: a file, not a run folder; give the folder that holds it ({run_dir.parent})"
        )
    if not run_dir.is_dir():
        raise PlotError(f"{run_dir}: no such folder")
    candidates = [
        f / "trainer_state.json"
        for f in (run_dir, *checkpoint_folders(run_dir))
        if (f / "trainer_state.json").is_file()
    ]
    log = run_dir / LOG_FILE
    if logs and log.is_file():
        candidates.append(log)
    if not candidates:
        raise PlotError(
            f"{run_dir}: no trainer_state.json, in the folder or in a checkpoint-* folder"
            + (f", and no {LOG_FILE}" if logs else "")
        )
    states, failures = [], []
    for path in candidates:
        try:
            states.append((path, _read_log(path) if path == log else _read_state(path)))
        except PlotError as err:
            failures.append(err)
    if not states:
        raise failures[0]
    for err in failures:
        logger.warning("%s; drawn from another trainer_state.json", err)
    return states


def _state_step(state: dict[str, Any]) -> int:
    """A trainer state's ``global_step``, else the last step its log history has."""
    return int(state.get("global_step") or max((e["step"] for e in state["log_history"]), default=0))


def _read_state(path: Path) -> dict[str, Any]:
    """A ``trainer_state.json``: its ``log_history`` kept to the entries with a numeric ``step``.

    Raises:
        PlotError: it cannot be read, or is not a trainer state; names the file.
    """
    state = _read_json(path, "a file cut short? Plot the run once it has saved again")
    history = state.get("log_history", []) if isinstance(state, dict) else None
    if (
        not isinstance(history, list)
        or not all(isinstance(e, dict) for e in history)
        or not isinstance(state.get("global_step", 0), (int, type(None)))
    ):
        raise PlotError(
            f"{path}: not a trainer state (a JSON object with an integer global_step and a log_history list "
            "of objects); restore or delete it"
        )
    return {**state, "log_history": [e for e in history if is_number(e.get("step"))]}


def _read_log(path: Path) -> dict[str, Any]:
    """A ``logs.jsonl`` as a trainer state: its entries the log history, its last step the global step.

    Raises:
        PlotError: a line other than the last is no log entry; names the file and the line.
    """
    try:
        entries = [entry for _, entry in read_log_entries(path, warn=False)]
    except OSError as err:
        raise PlotError(f"{path}: cannot be read ({err})") from None
    except LogFileError as err:
        raise PlotError(str(err)) from None
    return {"global_step": max((e["step"] for e in entries), default=0), "log_history": entries}


def _read_json(path: Path, again: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise PlotError(f"{path}: cannot be read ({type(err).__name__}: {err}); {again}") from None


def final_evaluation(run_dir: str | Path) -> dict[str, Any] | None:
    """``run_dir/eval/results.json``, where the weights in ``run_dir`` made it (or it does not say which
    weights did, or the folder holds none to compare); None where there is none, or where it is an
    evaluation of other weights (an earlier state of a run trained further), said in one warning."""
    path = Path(run_dir) / "eval" / "results.json"
    if not path.is_file():
        return None
    # prompt-aug-eval writes over none but its own results: this file is moved aside first
    again = f"move it aside and evaluate again: prompt-aug-eval --model {run_dir}"
    results = _read_json(path, again)
    per_template = results.get("results") if isinstance(results, dict) else None
    if not isinstance(per_template, dict) or not all(
        isinstance(r, dict) and all(isinstance(r.get(k), (int, float)) for k in ("macro", "micro"))
        for r in per_template.values()
    ):
        raise PlotError(f"{path}: not prompt-aug-eval's results (no macro and micro per template); {again}")
    settings, benchmarks = results.get("settings") or {}, results.get("benchmarks") or []
    fits = {  # what the eval panel reads beside the results
        "settings": isinstance(settings, dict),
        "settings.temperature": isinstance(settings, dict) and is_number(settings.get("temperature") or 0),
        "runs": is_number(results.get("runs") or 0),
        "limit": is_number(results.get("limit") or 0),
        "benchmarks": isinstance(benchmarks, list) and all(isinstance(b, str) for b in benchmarks),
    }
    wrong = [key for key, fit in fits.items() if not fit]
    if wrong:
        raise PlotError(f"{path}: not prompt-aug-eval's results ({wrong[0]} is of another type); {again}")
    if weights_match(run_dir, evaluation_made_by(path.parent)) is False:
        logger.warning(
            "%s holds an evaluation of other weights than those in %s (trained further since?): not drawn; "
            "evaluate again with prompt-aug-eval --model %s --overwrite", path.parent, run_dir, run_dir
        )  # fmt: skip
        return None
    return results


def load_run(run_dir: str | Path, name: str | None = None) -> Run:
    """Read a run folder's newest history (trainer states and ``logs.jsonl``, `trainer_states`) and, when
    present, its evaluation (`final_evaluation`)."""
    states = trainer_states(run_dir, logs=True)
    _, state = _newest(states)
    history = state["log_history"]
    keys = sorted({k for e in history for k in e if _TEMPLATE_ACCURACY.match(k)})
    # The folder's own weights' state (what its evaluation graded), where it could be read.
    own = Path(run_dir) / "trainer_state.json"
    own_state = next((s for path, s in states if path == own), None)
    own_step = None if own_state is None else _state_step(own_state)
    evaluation = final_evaluation(run_dir)
    set_aside = own_state is not None and (
        own_step > _state_step(state) or not _agree(_steps(own_state), _steps(state))
    )
    if evaluation is not None and set_aside:
        # The folder's weights end a line set aside (`_newest`): their evaluation is not of the line drawn.
        logger.warning(
            "%s holds an evaluation of the weights in %s, which end at step %d a line set aside (a "
            "resume from an earlier checkpoint abandoned it): not drawn; evaluate the resumed run once it "
            "has finished",
            Path(run_dir) / "eval", run_dir, own_step,
        )  # fmt: skip
        evaluation = None
    return Run(
        name=name or Path(run_dir).resolve().name,
        path=Path(run_dir),
        history=history,
        eval_results=evaluation,
        final_step=_state_step(state),
        template_keys=keys,
        eval_step=own_step,
    )


def _has_template_metrics(entry: dict[str, Any]) -> bool:
    return any(_TEMPLATE_ACCURACY.match(k) for k in entry)


def round_axis(history: list[dict[str, Any]]) -> dict[int, float]:
    """Step → generation round, from the logged ``round`` key (an entry without one takes the last seen)."""
    rounds, current = {}, None
    for entry in sorted(history, key=lambda e: e["step"]):
        if isinstance(entry.get("round"), (int, float)):
            current = float(entry["round"])
        if current is not None:
            rounds[int(entry["step"])] = current
    return rounds


def series(
    history: list[dict[str, Any]], key: str, smooth: int = 1, gaps: bool = False, x: str = "step"
) -> tuple[list[float], list[float]]:
    """The (x, values) of ``key`` where logged (a NaN or infinite value, which cannot be drawn, is left out);
    ``smooth > 1`` takes a trailing mean over that many points.

    ``gaps``: a round that logged other templates' metrics but not this one gives a NaN, so the line breaks
    there instead of joining the rounds around it. ``x="round"`` puts points at their generation round, one
    per round: the mean of its optimizer steps' values.

    >>> series([{"step": 1, "a": 1.0}, {"step": 2}, {"step": 3, "a": 3.0}], "a", smooth=2)
    ([1, 3], [1.0, 2.0])
    >>> h = [{"step": 1, "round": 1, "templates/a/accuracy": 0.5},
    ...      {"step": 3, "round": 2, "templates/b/accuracy": 1.0},
    ...      {"step": 5, "round": 3, "templates/a/accuracy": 0.7}]
    >>> series(h, "templates/a/accuracy", gaps=True, x="round")
    ([1.0, 2.0, 3.0], [0.5, nan, 0.7])
    >>> series([{"step": 1, "round": 1, "a": 1.0}, {"step": 2, "a": 3.0}, {"step": 3, "round": 2, "a": 5.0}],
    ...        "a", x="round")
    ([1.0, 2.0], [2.0, 5.0])
    """
    rounds = round_axis(history) if x == "round" else {}
    points = []
    for e in history:
        value = e.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            points.append((int(e["step"]), float(value)))
        elif gaps and _has_template_metrics(e):
            points.append((int(e["step"]), math.nan))
    xs = [rounds.get(s, math.nan) for s, _ in points] if x == "round" else [s for s, _ in points]
    values = [v for _, v in points]
    if x == "round":  # a round's optimizer steps make one point, their mean (a gap only if all are gaps)
        merged: dict[float, list[float]] = {}
        for at, v in zip(xs, values, strict=True):
            merged.setdefault(at, []).append(v)
        xs = list(merged)
        values = [
            sum(f) / len(f) if (f := [v for v in vs if not math.isnan(v)]) else math.nan
            for vs in merged.values()
        ]
    if smooth > 1:  # the mean over the window's logged values; a gap stays a gap
        windows = [
            [w for w in values[max(0, i - smooth + 1) : i + 1] if not math.isnan(w)]
            for i in range(len(values))
        ]
        values = [sum(w) / len(w) if w and not math.isnan(v) else math.nan for w, v in zip(windows, values)]
    return xs, values


def template_colors(names: Iterable[str]) -> dict[str, Any]:
    """A colour for each template name drawn in one picture, each name its own: a built-in template's by its
    bank order (the same in every picture), the others the colours left in the sorted order of ``names``.

    >>> colors = template_colors(["mine", "abel", "yours"])
    >>> colors["abel"] == template_colors(["abel"])["abel"], len(set(colors.values()))
    (True, 3)
    """
    bank, names = _builtin_names(), set(names)
    others = sorted(names - set(bank))
    palette = _palette(len(bank) + len(others))
    colors = {name: palette[bank.index(name)] for name in names & set(bank)}
    return colors | {name: palette[len(bank) + i] for i, name in enumerate(others)}


def _palette(size: int) -> list[Any]:
    """``size`` distinct colours: tab20 (its strong colours first), then tab20b and tab20c, then hues spread
    by the golden ratio."""
    colors = [plt.get_cmap("tab20")(i) for i in _TAB20_ORDER]
    colors += [plt.get_cmap(name)(i) for name in ("tab20b", "tab20c") for i in range(20)]
    extra = max(0, size - len(colors))
    colors += [hsv_to_rgb(((k * 0.618034) % 1.0, 0.75, 0.8)) for k in range(extra)]
    return [tuple(float(c) for c in color[:3]) + (1.0,) for color in colors]


# Line styles of the runs of one group (the fifth run of a group starts again).
_STYLES = ("-", "--", ":", "-.")


def _run_looks(names: list[str], groups: list[str] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The colour and line style of each run (by name): one colour per run, or per group (``groups``, one
    per run) with a line style per run within its group. Colours come from `_palette`, whose first ten are
    tab10's, so every group has its own; without groups, past 10 runs the ten colours come round again, each
    round in the next line style, and past 40 (every style used) the palette's next ten colours.

    >>> colors, styles = _run_looks([f"r{i}" for i in range(41)], None)
    >>> len({(colors[n], styles[n]) for n in colors}), styles["r10"], colors["r10"] == colors["r0"]
    (41, '--', True)
    >>> colors, _ = _run_looks([f"r{i}" for i in range(11)], [f"arm{i}" for i in range(11)])
    >>> len(set(colors.values()))
    11
    """
    colors, styles = {}, {}
    if groups is not None:
        order = list(dict.fromkeys(groups))
        palette = _palette(len(order))
        for i, (name, group) in enumerate(zip(names, groups)):
            colors[name] = palette[order.index(group)]
            styles[name] = _STYLES[groups[:i].count(group) % len(_STYLES)]
        return colors, styles
    cycle = 10 * len(_STYLES)  # runs told apart by the first ten colours in every style
    palette = _palette(10 * (len(names) // cycle + 1))
    for i, name in enumerate(names):
        colors[name] = palette[i % 10 + 10 * (i // cycle)]
        styles[name] = _STYLES[i // 10 % len(_STYLES)]
    return colors, styles


# tab20's ten strong colours first, then their light twins: the first templates look most distinct.
_TAB20_ORDER = [*range(0, 20, 2), *range(1, 20, 2)]


@functools.lru_cache(maxsize=1)
def _builtin_names() -> list[str]:
    return list(load_templates())


def _final_eval(run: Run) -> tuple[str, float, float] | None:
    """(template, macro, micro) from the run's ``eval/results.json``, for the paper's template if it ran."""
    results = (run.eval_results or {}).get("results") or {}
    if not results:
        return None
    template = DEFAULT_EVAL_TEMPLATE if DEFAULT_EVAL_TEMPLATE in results else next(iter(results))
    return template, results[template]["macro"], results[template]["micro"]


def _unique_names(run_dirs: list[str | Path]) -> list[str]:
    """Each run's folder name, with as many folders above it as tell it from the others'.

    >>> _unique_names(["/x/s0/arm/train", "/x/s1/arm/train", "/x/base"])
    ['s0/arm/train', 's1/arm/train', 'base']

    Raises:
        PlotError: one folder is given twice.
    """
    paths = [Path(d).resolve() for d in run_dirs]
    if len(set(paths)) < len(paths):
        twice = next(str(d) for d, p in zip(run_dirs, paths) if paths.count(p) > 1)
        raise PlotError(f"{twice}: given twice; give each run once")

    def tail(path: Path, depth: int) -> str:
        return "/".join(path.parts[-depth:])

    names = []
    for path in paths:
        depth = 1
        while any(tail(other, depth) == tail(path, depth) for other in paths if other != path):
            depth += 1
        names.append(tail(path, depth))
    return names


def _one_per_run(values: list[str] | None, run_dirs: list[str | Path], what: str) -> None:
    if values is not None and len(values) != len(run_dirs):
        raise PlotError(f"{what}: {len(values)} given for {len(run_dirs)} runs; give one per run, in order")


def build_figure(
    run_dirs: list[str | Path],
    smooth: int = 1,
    title: str | None = None,
    x: str = "step",
    names: list[str] | None = None,
    groups: list[str] | None = None,
    templates: bool = True,
) -> Any:
    """The matplotlib figure of the training curves of ``run_dirs``.

    ``smooth``: a trailing mean over this many logged points. ``x`` is ``"step"`` (optimizer steps) or
    ``"round"`` (generation rounds, from the logged ``round`` key). ``names`` label the runs (default:
    their folders). ``groups``, one per run, give the runs of a group (an arm's seeds) one colour, told
    apart by line style. ``templates=False`` leaves out the per-template panels (one per run).
    """
    if smooth < 1:
        raise PlotError(f"--smooth {smooth}: give a number of logged points, 1 or more (1: not smoothed)")
    _one_per_run(names, run_dirs, "--names")
    _one_per_run(groups, run_dirs, "--groups")
    if names is not None and len(set(names)) < len(names):
        raise PlotError(f"--names: {names} repeat a name; give each run its own")
    runs = [load_run(d, n) for d, n in zip(run_dirs, names or _unique_names(run_dirs))]
    unlogged = [str(r.path) for r in runs if not any("train_runtime" not in e for e in r.history)]
    if len(unlogged) == len(runs):
        raise PlotError(
            f"{', '.join(unlogged)}: no training step logged yet (a run in its first logging_steps, or one "
            "that stopped before its first log); plot it once it has logged"
        )
    for path in unlogged:
        logger.warning("%s: no training step logged yet; drawn without it", path)
    if x == "round":
        # A run with no step logged yet is drawn without lines (warned above), under either axis.
        missing = [str(r.path) for r in runs if not round_axis(r.history) and str(r.path) not in unlogged]
        if missing:
            raise PlotError(f"{missing}: no `round` key in the logged history; plot these runs with --x step")
    colors, styles = _run_looks([r.name for r in runs], groups)

    panels: list[tuple[str, Any]] = []
    for panel_title, ylabel, keys, fraction in CURVES:
        drawn = {run.name: next((k for k in keys if series(run.history, k)[0]), None) for run in runs}
        if any(str(k).startswith(GENERATED) for k in drawn.values()):
            ylabel = f"{ylabel}\n{GENERATED_NOTE}"
        if any(drawn.values()):
            panels.append((panel_title, (ylabel, drawn, fraction)))
    has_eval = any(series(r.history, "eval/macro")[0] or _final_eval(r) for r in runs)
    if has_eval:
        panels.append(("Evaluation (strict grading)", None))
    panels += [
        (f"Per-template training accuracy: {r.name}", r) for r in runs if templates and r.template_keys
    ]
    shades = template_colors(_template_name(k) for r in runs if templates for k in r.template_keys)
    if not panels:
        raise PlotError(f"nothing to plot: no known metric in {[str(r.path) for r in runs]}")

    # Legends live outside the panels: runs above them, templates and eval markers below. The figure is as
    # tall as the panels and the legends together, so that many runs do not squeeze the panels; sizes in
    # inches, turned into figure fractions.
    below = _below_legend(shades, has_eval)
    title_h, legend_h = (0.4 if title else 0.0), 0.3 * math.ceil(len(runs) / 4)
    below_h = 0.25 * math.ceil(len(below) / 6) + (0.1 if below else 0.0)
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    height = 3.7 * nrows + title_h + legend_h + below_h
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, height), squeeze=False)
    last = max(_final_x(r, x) for r in runs)
    for ax, (panel_title, spec) in zip(axes.flat, panels):
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("generation round" if x == "round" else "optimizer step")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xlim(0, max(last, 1) * 1.03)
        if isinstance(spec, Run):
            _draw_templates(ax, spec, shades, smooth, x)
            _fraction_axis(ax)
        elif spec is None:
            _draw_eval(ax, runs, colors, x)
            _fraction_axis(ax)
        else:
            ylabel, drawn, fraction = spec
            ax.set_ylabel(ylabel)
            for run in runs:
                if drawn[run.name]:
                    xs, values = series(run.history, drawn[run.name], smooth, x=x)
                    ax.plot(
                        xs,
                        values,
                        styles[run.name],
                        color=colors[run.name],
                        marker="." if len(xs) < 30 else None,
                    )
            if fraction:
                _fraction_axis(ax)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    _mark_collapse(list(zip(axes.flat, [spec for _, spec in panels])), runs, colors, x)

    if title:
        fig.suptitle(title, y=1 - 0.08 / height, va="top")
    handles = [plt.Line2D([], [], linestyle=styles[r.name], color=colors[r.name], label=r.name) for r in runs]
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - title_h / height),
        ncol=min(len(runs), 4),
        frameon=False,
        fontsize=9,
    )
    if below:
        fig.legend(
            handles=below,
            loc="lower center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=min(len(below), 6),
            frameon=False,
            fontsize=8,
        )
    fig.tight_layout(rect=(0, below_h / height, 1, 1 - (title_h + legend_h) / height))
    return fig


def plot_runs(run_dirs: list[str | Path], output: str | Path, **options: Any) -> Path:
    """Draw the training curves of ``run_dirs`` into the image ``output`` (PNG, PDF, SVG by suffix);
    ``options`` are `build_figure`'s (``smooth``, ``title``, ``x``, ``names``, ``groups``, ``templates``).

    Raises:
        PlotError: ``output`` has no image ending or cannot be written, or the runs cannot be drawn.
    """
    output = Path(output)
    kinds = sorted(FigureCanvasBase.get_supported_filetypes())
    if output.suffix.lower().lstrip(".") not in kinds:
        raise PlotError(
            f"--output {output}: give a file name ending in an image type matplotlib writes "
            f"({', '.join(kinds)}); the type is read from the ending"
        )
    fig = build_figure(run_dirs, **options)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(output, dpi=120)
    except OSError as err:  # a folder that cannot be made or written to
        raise PlotError(
            f"--output {output}: cannot write it ({err.strerror or err}); give a path in a folder you can "
            "write to"
        ) from None
    except RuntimeError as err:  # a type whose writer needs a program this machine lacks (pgf: a TeX)
        raise PlotError(
            f"--output {output}: matplotlib cannot write {output.suffix} here ({err}); give another ending, "
            "such as .png, .pdf or .svg"
        ) from None
    finally:
        plt.close(fig)
    return output


def _final_x(run: Run, x: str) -> float:
    steps = [run.final_step] + [e["step"] for e in run.history]
    if x == "round":
        return max(round_axis(run.history).values(), default=0.0)
    return max(steps)


def _eval_x(run: Run, x: str) -> float:
    """Where the final evaluation's markers go: at the step of the weights it graded (the folder's own state;
    a run resumed since, still training, has newer checkpoints), else the run's end."""
    if run.eval_step is None:
        return _final_x(run, x)
    if x == "round":
        rounds = round_axis(run.history)
        return max((r for s, r in rounds.items() if s <= run.eval_step), default=0.0)
    return float(run.eval_step)


def _template_name(key: str) -> str:
    """``abel`` from ``templates/abel/accuracy``."""
    return _TEMPLATE_ACCURACY.match(key).group(1)


def _below_legend(shades: dict[str, Any], has_eval: bool) -> list[Any]:
    """Legend entries shared by the panels: each template drawn (``shades``: its one colour), built-in ones
    in bank order, then the eval markers."""
    names = sorted(
        shades,
        key=lambda n: (_builtin_names().index(n) if n in _builtin_names() else len(_builtin_names()), n),
    )
    handles = [plt.Line2D([], [], color=shades[n], marker=".", label=n) for n in names]
    if has_eval:
        handles += [
            plt.Line2D([], [], color="gray", linestyle="-", label="eval macro (during training)"),
            plt.Line2D([], [], color="gray", linestyle="--", label="eval micro (during training)"),
            plt.Line2D([], [], color="gray", marker="*", linestyle="", markersize=10, label="final macro"),
            plt.Line2D([], [], color="gray", marker="P", linestyle="", label="final micro"),
        ]
    return handles


def collapse_events(history: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(step, signal) for every log line where the collapse guard fired (``collapse/fired/<signal>``).

    >>> collapse_events([{"step": 3, "entropy": 0.1}, {"step": 9, "collapse/fired/entropy": 1.0}])
    [(9, 'entropy')]
    """
    prefix = "collapse/fired/"
    return [
        (int(e["step"]), key[len(prefix) :])
        for e in history
        for key in sorted(e)
        if key.startswith(prefix) and e[key]
    ]


def _mark_collapse(
    panels: list[tuple[Any, Any]], runs: list[Run], colors: dict[str, Any], x: str = "step"
) -> None:
    """A dotted vertical line in the run's colour at each firing, on each panel (a per-template panel: its
    own run only), at its step or, with ``x="round"``, its round; the signal names are written on the first
    panel."""
    for index, (ax, spec) in enumerate(panels):
        for run in runs:
            if isinstance(spec, Run) and spec is not run:
                continue
            rounds = round_axis(run.history) if x == "round" else {}
            for step, signal in collapse_events(run.history):
                where = rounds.get(step, step) if x == "round" else step
                ax.axvline(where, color=colors[run.name], linestyle=":", linewidth=1.5, alpha=0.9)
                if index == 0:
                    ax.annotate(
                        f"{signal}",
                        (where, 1.0),
                        xycoords=("data", "axes fraction"),
                        rotation=90,
                        ha="right",
                        va="top",
                        fontsize=7,
                        color=colors[run.name],
                    )


def _fraction_axis(ax: Any) -> None:
    """A y axis for values in [0, 1]: from just below 0, at least up to 0.1."""
    _, top = ax.get_ylim()
    ax.set_ylim(-0.02, min(max(top * 1.05, 0.1), 1.02))


def _eval_sources(runs: list[Run]) -> str:
    """Where the eval panel's points come from, in a line or two."""
    during = sorted(
        {
            k.split("/")[1]
            for r in runs
            for e in r.history
            for k in e
            if k.startswith("eval/") and k.endswith("/accuracy")
        }
    )
    parts = []
    if during:
        parts.append(f"lines: logged during training ({', '.join(during)}; recipe eval_benchmarks)")
    described = {r.name: _eval_protocol(r) for r in runs if _final_eval(r)}
    if len(set(described.values())) == 1:
        parts.append(
            f"markers: RUN/eval/results.json from prompt-aug-eval ({next(iter(described.values()))})"
        )
    elif described:  # markers of different protocols: each says its own, and that they do not compare
        parts.append("markers: RUN/eval/results.json, not comparable across runs:")
        parts += [f"  {name}: {protocol}" for name, protocol in described.items()]
    return "\n".join(parts)


def _eval_protocol(run: Run) -> str:
    """How a run's final evaluation was made, in a few words: template, decoding, runs, benchmarks, limit."""
    results = run.eval_results or {}
    settings = results.get("settings") or {}
    detail = [f"template {_final_eval(run)[0]}"]
    if settings.get("temperature"):
        detail.append(f"sampled at temperature {settings['temperature']:g}")
    if results.get("runs"):
        detail.append(f"{results['runs']} run{'s' if results['runs'] != 1 else ''}")
    if results.get("benchmarks"):
        detail.append(", ".join(map(shown_name, results["benchmarks"])))
    if results.get("limit"):
        detail.append(f"first {results['limit']} per benchmark")
    return ", ".join(detail)


def _draw_eval(ax: Any, runs: list[Run], colors: dict[str, Any], x: str) -> None:
    """Macro (solid) and micro (dashed) accuracy logged during training; final evaluation as markers."""
    ax.set_ylabel("accuracy")
    for run in runs:
        for key, style in (("eval/macro", "-"), ("eval/micro", "--")):
            xs, values = series(run.history, key, x=x)
            if xs:
                ax.plot(xs, values, style, color=colors[run.name], marker=".")
        final = _final_eval(run)
        if final:
            at = _eval_x(run, x)
            ax.plot([at], [final[1]], "*", color=colors[run.name], markersize=12)
            ax.plot([at], [final[2]], "P", color=colors[run.name], markersize=8)
    ax.text(0.0, -0.3, _eval_sources(runs), transform=ax.transAxes, fontsize=7, va="top", color="dimgray")


def _draw_templates(ax: Any, run: Run, shades: dict[str, Any], smooth: int, x: str) -> None:
    """One line per template in its colour (``shades``): the fraction of its rollouts graded correct, broken
    where it was not drawn."""
    ax.set_ylabel("share graded right")
    for key in run.template_keys:
        xs, values = series(run.history, key, smooth, gaps=True, x=x)
        name = _template_name(key)
        ax.plot(xs, values, color=shades[name], label=name, linewidth=1, marker=".", markersize=3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="prompt-aug-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="Training output folders.")
    parser.add_argument(
        "-o",
        "--output",
        default="curves.png",
        help="Image file: PNG, PDF, SVG or another type matplotlib writes, by its ending.",
    )
    parser.add_argument("--smooth", type=int, default=1, help="Trailing mean over this many logged points.")
    parser.add_argument("--title", default=None)
    parser.add_argument(
        "--x", choices=("step", "round"), default="step",
        help="x axis: optimizer steps, or generation rounds "
             "(the paper's 'steps'; needs the logged `round` key).",
    )  # fmt: skip
    parser.add_argument(
        "--names", nargs="+", default=None, help="A label per run, in order (default: folders)."
    )
    parser.add_argument(
        "--groups", nargs="+", default=None,
        help="A group per run, in order (e.g. the arm of each seed): a group's runs share a colour.",
    )  # fmt: skip
    parser.add_argument(
        "--no_templates", action="store_true", help="Leave out the per-template panels (one per run)."
    )
    args = parser.parse_args(argv)
    try:
        path = plot_runs(
            args.runs, args.output, smooth=args.smooth, title=args.title, x=args.x, names=args.names,
            groups=args.groups, templates=not args.no_templates,
        )  # fmt: skip
    except PlotError as err:
        raise SystemExit(f"prompt-aug-plot: error: {err}") from None
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
