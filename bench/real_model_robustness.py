"""How much a model's accuracy depends on the template it is asked under.

Runs ``prompt-aug-eval --template all`` (greedy, hf backend, float32) on a question file for each model,
then regrades the saved completions leniently (the `correctness` reward's rule) beside the evaluator's
strict rule (the last ``\\boxed{}``), and prints per model the mean over the 13 templates, the spread
(best minus worst template) and the standard deviation across templates, then one row per template.

    python bench/real_model_robustness.py --questions outputs/smollm2-135m/prompt_aug_cpu/heldout.jsonl \\
        --models base=smollm2-135m-instruct 13-templates=outputs/smollm2-135m/prompt_aug_cpu \\
        --out outputs/robustness

Each evaluation resumes from its ``completions.jsonl`` under ``--out/LABEL``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # this checkout's prompt_aug, not an installed one

from prompt_aug.evaluation.cli import parse_args, run_evaluation
from rewards.grading.grade import grade_batch


def evaluate(model: str, questions: str, output: Path, max_tokens: int) -> list[dict]:
    """Every template's greedy completions of ``questions`` by ``model``, as evaluation records."""
    argv = ["--model", model, "--benchmarks", questions, "--template", "all", "--backend", "hf"]
    argv += ["--dtype", "float32", "--max_tokens", str(max_tokens), "--output", str(output), "--no_progress"]
    run_evaluation(parse_args(argv))
    return [json.loads(line) for line in (output / "completions.jsonl").read_text().splitlines()]


def per_template(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per template: strict and lenient accuracy and the mean format score."""
    lenient = grade_batch([r["completion"] for r in records], [r["gold"] for r in records],
                          [r["template"] for r in records])  # fmt: skip
    groups: dict[str, list[tuple[dict, object]]] = defaultdict(list)
    for record, grade in zip(records, lenient):
        groups[record["template"]].append((record, grade))
    return {
        name: {
            "strict": statistics.mean(float(r["correct"]) for r, _ in rows),
            "lenient": statistics.mean(float(g.correct) for _, g in rows),
            "format": statistics.mean(g.format_score for _, g in rows),
        }
        for name, rows in groups.items()
    }


def spread_row(label: str, scores: dict[str, dict[str, float]]) -> str:
    cells = [label]
    for metric in ("strict", "lenient", "format"):
        values = [s[metric] for s in scores.values()]
        cells += [f"{statistics.mean(values):.2f}", f"{max(values) - min(values):.2f}",
                  f"{statistics.pstdev(values):.2f}"]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", required=True, help="A .jsonl with question and answer columns.")
    parser.add_argument("--models", nargs="+", required=True, help="LABEL=MODEL (a folder or a known name).")
    parser.add_argument("--out", default="outputs/robustness")
    parser.add_argument("--max_tokens", type=int, default=64)
    args = parser.parse_args()
    scores = {}
    for pair in args.models:
        label, _, model = pair.partition("=")
        if not model:
            parser.error(f"--models: {pair!r} is not LABEL=MODEL")
        scores[label] = per_template(evaluate(model, args.questions, Path(args.out) / label, args.max_tokens))
    metrics = ("strict", "lenient", "format")
    print("| model | " + " | ".join(f"{m} mean | {m} spread | {m} std" for m in metrics) + " |")
    print("|---|" + "---:|" * 9)
    for label, table in scores.items():
        print(spread_row(label, table))
    print()
    print("| template | " + " | ".join(f"{label} strict / lenient / format" for label in scores) + " |")
    print("|---|" + "---|" * len(scores))
    for name in next(iter(scores.values())):
        cells = [" / ".join(f"{s[name][m]:.2f}" for m in metrics) for s in scores.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    Path(args.out, "robustness.json").write_text(json.dumps(scores, indent=2) + "\n")


if __name__ == "__main__":
    main()
