"""Statistics and tables: accuracy per template, benchmark and run (`summarize`), the paper's protocol and
how a run departs from it, and ``results.md`` (`render_tables`)."""

from __future__ import annotations

import math
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..templates import DEFAULT_EVAL_TEMPLATE
from .benchmarks import BENCHMARKS, SUITE_QUESTIONS, benchmark_title

# The paper's evaluation (its evaluate_model.py, run 5 times): vLLM in bfloat16, greedy, the qwen-math
# template through the model's own chat template, at most 3,000 new tokens, one sample per question, every
# question, the mean of 5 runs, and generation that stops only at the model's EOS, on the suite's five
# benchmarks. Its vLLM context was 4,096 tokens (`PAPER_MAX_MODEL_LEN`), Qwen2.5-Math-1.5B's own: a context
# that cuts a completion shorter than that one would is recorded, and is not the paper's protocol.
PAPER_MAX_MODEL_LEN = 4096
PAPER_PROTOCOL: dict[str, Any] = {
    "backend": "vllm",
    "dtype": "bfloat16",
    "template": DEFAULT_EVAL_TEMPLATE,
    "temperature": 0.0,
    "max_tokens": 3000,
    "max_model_len": None,  # recorded only when it cuts a completion shorter than the paper's context would
    "n": 1,
    "runs": 5,
    "limit": None,
    "templates_file": None,
    "chat_template": None,  # --chat_template: the tokenizer's own replaced
    "chat_template_kwargs": None,  # --chat_template_kwargs: the chat template's defaults changed
    "stop": "eos",
    "benchmarks": ",".join(BENCHMARKS),  # the five of the suite, as --benchmarks lists them
}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


# How every ``results.md`` begins: what tells a table of prompt-aug-eval's from another file of that name.
TABLE_HEAD = "Accuracy (%), strict grading (last `\\boxed{}`)"

# How `protocol_differences` names a paper setting that is None.
PAPER_NONE = {
    "limit": "every question",
    "max_model_len": f"{PAPER_MAX_MODEL_LEN}, or room for max_tokens after every prompt",
    "chat_template": "the model's own",
    "chat_template_kwargs": "the chat template's defaults",
}


def summarize(records: list[dict[str, Any]], benchmarks: list[str], templates: list[str]) -> dict[str, Any]:
    """Accuracy per template × benchmark (and per run), macro and micro per template, spread across templates.

    Returns ``{"results": {template: {"benchmarks": {benchmark: {...}}, "macro", "micro", ...}}}``, plus
    ``"spread"`` and ``"std"`` (per benchmark, macro and micro) when there are several templates.

    Accuracy is over every graded answer (all runs and samples); macro is the mean of the benchmark
    accuracies, micro is correct answers over all answers.
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[(record["template"], record["benchmark"])].append(record)
    per_template: dict[str, Any] = {}
    for template in templates:
        by_benchmark: dict[str, Any] = {}
        correct_all = total_all = 0
        for benchmark in benchmarks:
            rows = groups[(template, benchmark)]
            correct = sum(bool(r["correct"]) for r in rows)
            by_run: dict[int, list[bool]] = defaultdict(list)
            for r in rows:
                by_run[int(r["run"])].append(bool(r["correct"]))
            runs = [
                {"run": run, "accuracy": _mean([float(c) for c in v]), "correct": sum(v), "n": len(v)}
                for run, v in sorted(by_run.items())
            ]
            entry: dict[str, Any] = {
                "accuracy": correct / len(rows) if rows else float("nan"),
                "correct": correct,
                "n": len(rows),
                "questions": len({int(r["index"]) for r in rows}),
                "runs": runs,
            }
            if len(runs) > 1:
                entry["std_over_runs"] = statistics.pstdev([r["accuracy"] for r in runs])
            samples: dict[tuple[int, int], list[bool]] = defaultdict(list)
            for r in rows:
                samples[(int(r["run"]), int(r["index"]))].append(bool(r["correct"]))
            n = max((len(v) for v in samples.values()), default=1)
            if n > 1:
                entry[f"pass@{n}"] = _mean([float(any(v)) for v in samples.values()])
            by_benchmark[benchmark] = entry
            correct_all += correct
            total_all += len(rows)
        per_template[template] = {
            "benchmarks": by_benchmark,
            "macro": _mean([e["accuracy"] for e in by_benchmark.values()]),
            "micro": correct_all / total_all if total_all else float("nan"),
            "correct": correct_all,
            "n": total_all,
        }
    summary: dict[str, Any] = {"results": per_template}
    if len(templates) > 1:
        columns = {b: [per_template[t]["benchmarks"][b]["accuracy"] for t in templates] for b in benchmarks}
        columns["macro"] = [per_template[t]["macro"] for t in templates]
        columns["micro"] = [per_template[t]["micro"] for t in templates]
        summary["spread"] = {k: max(v) - min(v) for k, v in columns.items()}
        summary["std"] = {k: statistics.pstdev(v) for k, v in columns.items()}
    return summary


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100 * value:.1f}"


def protocol_differences(settings: dict[str, Any]) -> list[str]:
    """How an evaluation's settings depart from `PAPER_PROTOCOL`, one ``"key X (paper: Y)"`` per setting, and
    one ``"questions B N (paper: M)"`` per suite benchmark ``B`` whose count in ``settings["questions"]``
    (questions asked, per benchmark) is not the suite's (`SUITE_QUESTIONS`; a copy of the suite that holds
    others), unless a ``limit`` already departs.

    >>> protocol_differences({**PAPER_PROTOCOL})
    []
    >>> protocol_differences({**PAPER_PROTOCOL, "runs": 1, "limit": 50})
    ['runs 1 (paper: 5)', 'limit 50 (paper: every question)']
    >>> protocol_differences({**PAPER_PROTOCOL, "benchmarks": "aime24"})
    ['benchmarks aime24 (paper: aime24,amc,math500,minerva,olympiadbench)']
    >>> protocol_differences({**PAPER_PROTOCOL, "max_model_len": 1024})
    ['max_model_len 1024 (paper: 4096, or room for max_tokens after every prompt)']
    >>> protocol_differences({**PAPER_PROTOCOL, "questions": {**SUITE_QUESTIONS, "aime24": 3}})
    ['questions aime24 3 (paper: 30)']
    """
    out = []
    for key, paper in PAPER_PROTOCOL.items():
        value = settings.get(key)
        if value != paper:
            shown = PAPER_NONE.get(key, paper) if paper is None else paper
            out.append(f"{key} {_file_names(value)} (paper: {shown})")
    if settings.get("limit") is None:
        for name, asked in (settings.get("questions") or {}).items():
            if name in SUITE_QUESTIONS and asked != SUITE_QUESTIONS[name]:
                out.append(f"questions {name} {asked} (paper: {SUITE_QUESTIONS[name]})")
    return out


def _file_names(value: Any) -> Any:
    """``value`` with each name in it (comma-separated where several) as `shown_name` shows it.

    >>> _file_names("amc,/home/me/sums.jsonl"), _file_names(4096)
    ('amc,sums.jsonl', 4096)
    """
    return ",".join(map(shown_name, value.split(","))) if isinstance(value, str) else value


def shown_name(name: str) -> str:
    """A benchmark or file as tables and pictures show it: an absolute path (a local question set or
    templates file) by its file name, since they go into a model card, which names no home folder.

    >>> shown_name("/home/me/sums.jsonl"), shown_name("amc")
    ('sums.jsonl', 'amc')
    """
    return Path(name).name if os.path.isabs(name) else name


def protocol_line(settings: dict[str, Any]) -> str:
    """The protocol sentence of ``results.md``: what ran, and whether it is the paper's protocol."""
    limit = settings.get("limit")
    ran = (
        f"Protocol: backend {settings.get('backend')}, dtype {settings.get('dtype')}, "
        f"template `{settings.get('template')}`, temperature {settings.get('temperature')}, "
        f"max_tokens {settings.get('max_tokens')}, n {settings.get('n')}, runs {settings.get('runs')}, "
        f"stop {settings.get('stop')}, "
        + (
            "every question"
            if limit is None
            else f"**--limit {limit}: only the first {limit} questions per benchmark**"
        )
        + "."
    )
    differences = protocol_differences(settings)
    if not differences:
        return ran + (
            " This is the paper's protocol (mean of 5 greedy vLLM runs in bfloat16, stopping at EOS only)."
        )
    differs = "; ".join(differences)
    return f"{ran} **Not the paper's protocol**: {differs}. Do not compare with the paper's table."


def _section(caption: str, columns: list[str]) -> list[str]:
    """A blank line, ``caption``, a blank line and the head of a table of templates by ``columns``."""
    return ["", caption, "", "| Template | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]


def render_tables(
    summary: dict[str, Any], benchmarks: list[str], model_name: str, settings: dict[str, Any]
) -> str:
    """``results.md``: the paper-layout table, the robustness table when several templates ran, and pass@n
    per template when each question was sampled n > 1 times."""
    per_template = summary["results"]
    templates = list(per_template)
    main = DEFAULT_EVAL_TEMPLATE if DEFAULT_EVAL_TEMPLATE in per_template else templates[0]
    heads = [benchmark_title(b) for b in benchmarks]
    decoding = (
        "greedy"
        if settings["temperature"] == 0
        else f"temperature {settings['temperature']}, top-p {settings['top_p']}"
    )
    runs = settings["runs"]
    limit = settings.get("limit")
    lines = [
        f"{TABLE_HEAD}, template `{main}`, {decoding}, "
        f"at most {settings['max_tokens']} new tokens, mean of {runs} run{'s' if runs != 1 else ''}"
        + (f" × {settings['n']} samples" if settings["n"] > 1 else "")
        + ". Macro: mean of the benchmarks; micro: over all questions.",
        "",
        protocol_line({**settings, "template": main}),
        "",
        "| Model | " + " | ".join(heads) + " | **Macro** | **Micro** |",
        "|---|" + "---:|" * (len(heads) + 2),
    ]
    row = per_template[main]
    cells = [_pct(row["benchmarks"][b]["accuracy"]) for b in benchmarks]
    label = model_name if limit is None else f"{model_name} (first {limit} questions per benchmark)"
    lines.append(
        f"| {label} | " + " | ".join(cells) + f" | **{_pct(row['macro'])}** | **{_pct(row['micro'])}** |"
    )
    if len(templates) > 1:
        lines += _section(
            f"Robustness across {len(templates)} templates: accuracy (%) per evaluation template; "
            "spread is max − min, std the population standard deviation across templates.",
            [*heads, "**Macro**", "**Micro**"],
        )
        for name in templates:
            t = per_template[name]
            cells = [_pct(t["benchmarks"][b]["accuracy"]) for b in benchmarks]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {_pct(t['macro'])} | {_pct(t['micro'])} |")
        for label, key in (("**spread (max − min)**", "spread"), ("**std**", "std")):
            values = summary[key]
            cells = [_pct(values[b]) for b in [*benchmarks, "macro", "micro"]]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    n = settings["n"]
    if n > 1:
        key = f"pass@{n}"
        lines += _section(
            f"{key} (%): a question counts when any of its {n} samples is correct, averaged over runs. "
            "Macro: mean of the benchmarks.",
            [*heads, "**Macro**"],
        )
        for name in templates:
            values = [per_template[name]["benchmarks"][b].get(key, float("nan")) for b in benchmarks]
            cells = [_pct(v) for v in values]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | **{_pct(_mean(values))}** |")
    return "\n".join(lines) + "\n"
