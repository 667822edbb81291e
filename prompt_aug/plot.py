"""Training curves as pictures: ``python -m prompt_aug.plot RUN_DIR [RUN_DIR ...] -o curves.png``.

Also the ``prompt-aug-plot`` script. Each RUN_DIR is a training output folder; its
``trainer_state.json`` (or that of its last ``checkpoint-*``) gives the logged metrics, and
``eval/results.json`` (written by ``prompt-aug-eval``) the final evaluation. Several runs are overlaid,
one colour per run, named by their folders. Panels without data in any run are left out. Where the
collapse guard fired (``collapse/fired/<signal>`` in the log), every panel has a dotted line, labelled
with the signal on the first panel.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display needed
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from .templates import DEFAULT_EVAL_TEMPLATE

# (panel title, y label, metric keys: the first key a run has is drawn, whether the values are fractions)
CURVES: list[tuple[str, str, list[str], bool]] = [
    ("Entropy", "nats / token", ["entropy"], False),
    (
        "Training accuracy",
        "correctness reward",
        ["rewards/correctness_reward/mean", "rewards/strict_correctness_reward/mean"],
        True,
    ),
    ("Total reward", "reward", ["reward"], False),
    ("Completion length", "tokens", ["completions/mean_length"], False),
    ("Truncation rate", "fraction cut at the length limit", ["completions/clipped_ratio"], True),
]
_TEMPLATE_ACCURACY = re.compile(r"^templates/(.+)/accuracy$")


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


def find_trainer_state(run_dir: str | Path) -> Path:
    """``run_dir/trainer_state.json``, else the one in the highest-numbered ``checkpoint-*`` folder."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PlotError(f"{run_dir}: no such folder")
    if (run_dir / "trainer_state.json").is_file():
        return run_dir / "trainer_state.json"
    checkpoints = [
        p
        for p in run_dir.glob("checkpoint-*")
        if p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").is_file()
    ]
    if not checkpoints:
        raise PlotError(f"{run_dir}: no trainer_state.json, in the folder or in a checkpoint-* folder")
    return max(checkpoints, key=lambda p: int(p.name.split("-")[-1])) / "trainer_state.json"


def load_run(run_dir: str | Path, name: str | None = None) -> Run:
    """Read a run folder's trainer state and, when present, ``eval/results.json``."""
    state = json.loads(find_trainer_state(run_dir).read_text())
    history = [e for e in state.get("log_history", []) if "step" in e]
    results_path = Path(run_dir) / "eval" / "results.json"
    keys = sorted({k for e in history for k in e if _TEMPLATE_ACCURACY.match(k)})
    return Run(
        name=name or Path(run_dir).resolve().name,
        path=Path(run_dir),
        history=history,
        eval_results=json.loads(results_path.read_text()) if results_path.is_file() else None,
        final_step=int(state.get("global_step") or max((e["step"] for e in history), default=0)),
        template_keys=keys,
    )


def series(history: list[dict[str, Any]], key: str, smooth: int = 1) -> tuple[list[int], list[float]]:
    """The (steps, values) of ``key`` where logged; ``smooth > 1`` takes a trailing mean over that many points.

    >>> series([{"step": 1, "a": 1.0}, {"step": 2}, {"step": 3, "a": 3.0}], "a", smooth=2)
    ([1, 3], [1.0, 2.0])
    """
    points = [
        (int(e["step"]), float(e[key]))
        for e in history
        if isinstance(e.get(key), (int, float)) and not math.isnan(e[key])
    ]
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    if smooth > 1:
        windows = [values[max(0, i - smooth + 1) : i + 1] for i in range(len(values))]
        values = [sum(w) / len(w) for w in windows]
    return steps, values


def _final_eval(run: Run) -> tuple[str, float, float] | None:
    """(template, macro, micro) from the run's ``eval/results.json``, for the paper's template if it ran."""
    results = (run.eval_results or {}).get("results") or {}
    if not results:
        return None
    template = DEFAULT_EVAL_TEMPLATE if DEFAULT_EVAL_TEMPLATE in results else next(iter(results))
    return template, results[template]["macro"], results[template]["micro"]


def _unique_names(run_dirs: list[str | Path]) -> list[str]:
    names = [Path(d).resolve().name for d in run_dirs]
    return [
        f"{Path(d).resolve().parent.name}/{n}" if names.count(n) > 1 else n for d, n in zip(run_dirs, names)
    ]


def plot_runs(
    run_dirs: list[str | Path], output: str | Path, smooth: int = 1, title: str | None = None
) -> Path:
    """Draw the training curves of ``run_dirs`` into the image ``output`` (PNG, PDF, SVG by suffix)."""
    runs = [load_run(d, n) for d, n in zip(run_dirs, _unique_names(run_dirs))]
    colors = {run.name: plt.get_cmap("tab10")(i % 10) for i, run in enumerate(runs)}

    panels: list[tuple[str, Any]] = []
    for panel_title, ylabel, keys, fraction in CURVES:
        drawn = {run.name: next((k for k in keys if series(run.history, k)[0]), None) for run in runs}
        if any(drawn.values()):
            panels.append((panel_title, (ylabel, drawn, fraction)))
    if any(series(r.history, "eval/macro")[0] or _final_eval(r) for r in runs):
        panels.append(("Evaluation (strict, greedy)", None))
    panels += [(f"Per-template training accuracy: {r.name}", r) for r in runs if r.template_keys]
    if not panels:
        raise PlotError(f"nothing to plot: no known metric in {[str(r.path) for r in runs]}")

    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    height = 3.7 * nrows
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, height), squeeze=False)
    last_step = max([r.final_step for r in runs] + [e["step"] for r in runs for e in r.history])
    for ax, (panel_title, spec) in zip(axes.flat, panels):
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xlim(0, max(last_step, 1) * 1.03)
        if isinstance(spec, Run):
            _draw_templates(ax, spec, smooth)
            _fraction_axis(ax)
        elif spec is None:
            _draw_eval(ax, runs, colors)
            _fraction_axis(ax)
        else:
            ylabel, drawn, fraction = spec
            ax.set_ylabel(ylabel)
            for run in runs:
                if drawn[run.name]:
                    steps, values = series(run.history, drawn[run.name], smooth)
                    ax.plot(steps, values, color=colors[run.name], marker="." if len(steps) < 30 else None)
            if fraction:
                _fraction_axis(ax)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    _mark_collapse(list(zip(axes.flat, [spec for _, spec in panels])), runs, colors)

    # Title, then the run legend, then the panels; sizes in inches turned into figure fractions.
    title_h, legend_h = (0.4 if title else 0.0), 0.3 * math.ceil(len(runs) / 4)
    if title:
        fig.suptitle(title, y=1 - 0.08 / height, va="top")
    handles = [plt.Line2D([], [], color=colors[r.name], label=r.name) for r in runs]
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - title_h / height),
        ncol=min(len(runs), 4),
        frameon=False,
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - (title_h + legend_h) / height))
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


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


def _mark_collapse(panels: list[tuple[Any, Any]], runs: list[Run], colors: dict[str, Any]) -> None:
    """A dotted vertical line in the run's colour at each firing, on each panel (a per-template panel: its
    own run only); the signal names are written on the first panel."""
    for index, (ax, spec) in enumerate(panels):
        for run in runs:
            if isinstance(spec, Run) and spec is not run:
                continue
            for step, signal in collapse_events(run.history):
                ax.axvline(step, color=colors[run.name], linestyle=":", linewidth=1.5, alpha=0.9)
                if index == 0:
                    ax.annotate(f"{signal}", (step, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                                ha="right", va="top", fontsize=7, color=colors[run.name])


def _fraction_axis(ax: Any) -> None:
    """A y axis for values in [0, 1]: from just below 0, at least up to 0.1."""
    _, top = ax.get_ylim()
    ax.set_ylim(-0.02, min(max(top * 1.05, 0.1), 1.02))


def _draw_eval(ax: Any, runs: list[Run], colors: dict[str, Any]) -> None:
    """Macro (solid) and micro (dashed) accuracy logged during training; final evaluation as stars."""
    ax.set_ylabel("accuracy")
    for run in runs:
        for key, style in (("eval/macro", "-"), ("eval/micro", "--")):
            steps, values = series(run.history, key)
            if steps:
                ax.plot(steps, values, style, color=colors[run.name], marker=".")
        final = _final_eval(run)
        if final:
            ax.plot([run.final_step], [final[1]], "*", color=colors[run.name], markersize=12)
            ax.plot([run.final_step], [final[2]], "P", color=colors[run.name], markersize=8)
    legend = [
        plt.Line2D([], [], color="gray", linestyle="-", label="macro (during training)"),
        plt.Line2D([], [], color="gray", linestyle="--", label="micro (during training)"),
        plt.Line2D([], [], color="gray", marker="*", linestyle="", markersize=10, label="final macro"),
        plt.Line2D([], [], color="gray", marker="P", linestyle="", label="final micro"),
    ]
    ax.legend(handles=legend, fontsize=7)


def _draw_templates(ax: Any, run: Run, smooth: int) -> None:
    """One line per template: the fraction of its rollouts graded correct."""
    ax.set_ylabel("correctness reward")
    cmap = plt.get_cmap("tab20")
    for i, key in enumerate(run.template_keys):
        steps, values = series(run.history, key, smooth)
        name = _TEMPLATE_ACCURACY.match(key).group(1)
        ax.plot(
            steps,
            values,
            color=cmap(i % 20),
            label=name,
            linewidth=1,
            marker="." if len(steps) < 30 else None,
        )
    ax.legend(fontsize=6, ncol=2, loc="best")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="prompt-aug-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="Training output folders.")
    parser.add_argument("-o", "--output", default="curves.png", help="Image file (PNG, PDF or SVG).")
    parser.add_argument("--smooth", type=int, default=1, help="Trailing mean over this many logged points.")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        path = plot_runs(args.runs, args.output, smooth=args.smooth, title=args.title)
    except PlotError as err:
        raise SystemExit(f"prompt-aug-plot: error: {err}") from None
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
