"""What a run logs: per-template metrics over a log line of several rounds, the console line, logs.jsonl."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from prompt_aug import train
from prompt_aug.metrics import TemplateMetrics

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes/smoke/tiny_cpu.yaml")


def trl_log(buffer: dict[str, list[float]]) -> dict[str, float | None]:
    """What TRL 1.16's ``GRPOTrainer.log`` makes of its metric buffer: each key's mean without NaN (None when
    nothing is left), then the buffer emptied."""
    logged = {}
    for key, values in buffer.items():
        valid = [v for v in values if not math.isnan(v)]
        logged[key] = sum(valid) / len(valid) if valid else None
    buffer.clear()
    return logged


def _trainer(buffers: dict) -> SimpleNamespace:
    from rewards.registry import REGISTRY

    return SimpleNamespace(
        reward_funcs=[REGISTRY["correctness"]], reward_func_names=["correctness_reward"],
        metric_buffer=lambda mode: buffers[mode],
    )  # fmt: skip


def _round(
    metrics: TemplateMetrics, trainer: SimpleNamespace, rows: dict[str, list[float]], mode: str
) -> None:
    """One round (or evaluation batch): each template's rows, by their correctness reward (NaN: ungraded);
    every row 10 tokens long, half of each template's truncated, none looping."""
    names = [name for name, rewards in rows.items() for _ in rewards]
    rewards = torch.tensor([[r] for values in rows.values() for r in values])
    n = len(names)
    metrics.append(trainer, names, rewards, torch.full((n,), 10.0), torch.arange(n) % 2 == 0, mode)
    metrics.append_repetition(trainer, names, torch.zeros(n), mode)


def test_a_log_line_of_several_rounds_averages_over_their_completions():
    """Template a: 1 of 1 right in the first round, 0 of 3 in the second: 1 of 4 right over the line, not the
    rounds' mean 0.5; its count is per round (4 / 2), and the counts add up to a round's size."""
    buffers: dict = defaultdict(lambda: defaultdict(list))
    trainer, metrics = _trainer(buffers), TemplateMetrics(["a", "b", "c"])
    _round(metrics, trainer, {"a": [1.0], "b": [1.0, 1.0, 0.0]}, "train")
    _round(metrics, trainer, {"a": [0.0, 0.0, 0.0], "b": [float("nan")]}, "train")
    logged = trl_log(buffers["train"])
    assert logged["templates/a/accuracy"] == pytest.approx(1 / 4)
    assert logged["templates/b/accuracy"] == pytest.approx(2 / 3)  # the ungraded row is left out
    assert logged["templates/a/count"] == 2.0 and logged["templates/b/count"] == 2.0
    assert logged["completions/accuracy"] == pytest.approx(3 / 7)  # 3 of the 7 graded rows
    assert logged["templates/a/rewards/correctness_reward"] == pytest.approx(1 / 4)
    assert logged["templates/a/truncated_ratio"] == pytest.approx(3 / 4)  # its first row, then 2 of 3
    assert not [k for k in logged if k.startswith("templates/c/")]  # drawn in neither round: no key, not 0
    # The next line starts afresh: the earlier rounds are in no value of it.
    _round(metrics, trainer, {"c": [1.0, 1.0, 1.0, 1.0]}, "train")
    logged = trl_log(buffers["train"])
    assert logged["templates/c/accuracy"] == 1.0 and logged["templates/c/count"] == 4.0
    assert not [k for k in logged if k.startswith(("templates/a/", "templates/b/"))]


def test_a_template_drawn_in_a_later_round_of_the_line_counts_per_round_of_the_line():
    buffers: dict = defaultdict(lambda: defaultdict(list))
    trainer, metrics = _trainer(buffers), TemplateMetrics(["a", "b"])
    for rows in ({"a": [1.0, 1.0]}, {"a": [1.0, 1.0]}, {"b": [0.0, 1.0]}):
        _round(metrics, trainer, rows, "train")
    logged = trl_log(buffers["train"])
    assert logged["templates/a/count"] == pytest.approx(4 / 3)
    assert logged["templates/b/count"] == pytest.approx(2 / 3)


def test_an_evaluation_averages_over_its_rows_whatever_its_batch_sizes():
    """An evaluation scores each batch as a round of its own; a short last batch weighs by its rows. The
    training buffer is a window of its own."""
    buffers: dict = defaultdict(lambda: defaultdict(list))
    trainer, metrics = _trainer(buffers), TemplateMetrics(["a"])
    _round(metrics, trainer, {"a": [1.0]}, "train")
    _round(metrics, trainer, {"a": [0.0, 0.0, 0.0, 0.0, 0.0]}, "eval")
    _round(metrics, trainer, {"a": [1.0]}, "eval")
    assert trl_log(buffers["eval"])["templates/a/accuracy"] == pytest.approx(1 / 6)
    assert trl_log(buffers["train"])["templates/a/accuracy"] == 1.0


def test_per_template_entropy_is_over_every_token_of_the_line():
    """Two optimizer steps in one log line: template a has 1 token of entropy 1 in the first, 3 of entropy 5
    in the second: (1 + 15) / 4, not the steps' mean 3."""
    from accelerate import Accelerator

    buffers: dict = defaultdict(lambda: defaultdict(list))
    accelerator = Accelerator(cpu=True)
    trainer = SimpleNamespace(
        accelerator=accelerator, model=torch.nn.Linear(1, 1), metric_buffer=lambda mode: buffers[mode]
    )
    metrics = TemplateMetrics(["a", "b"])
    for entropy, width in ((1.0, 1), (5.0, 3)):
        mask = torch.tensor([[1] * width + [0] * (3 - width)])
        inputs = {"template_index": torch.tensor([0])}
        metrics.add_entropy(trainer, torch.full((1, 3), entropy), mask, inputs)  # sync_gradients: a step
    logged = trl_log(buffers["train"])
    assert logged["templates/a/entropy"] == pytest.approx(16 / 4)
    assert "templates/b/entropy" not in logged


def test_per_template_entropy_of_bf16_entropies_counts_every_token():
    """A bf16 model's entropies are bf16: a completion of 3,001 tokens counts 3,001 of them, not the 3,008
    that bf16 rounds the count to, and their sum is not rounded either."""
    from prompt_aug.metrics import grouped_token_sums

    entropies = torch.full((1, 3100), 0.3, dtype=torch.bfloat16)
    mask = torch.zeros(1, 3100, dtype=torch.long)
    mask[0, :3001] = 1
    sums = grouped_token_sums(entropies, mask, torch.tensor([0]), 1)
    assert sums[1, 0].item() == 3001
    assert sums[0, 0].item() == pytest.approx(3001 * entropies[0, 0].item(), rel=1e-6)


@pytest.fixture(scope="module")
def rounds_and_window(tmp_path_factory):
    """The smoke recipe for 8 optimizer steps (4 rounds of 16 completions, 2 steps each), logged at every
    step, and the same run logged once, at step 8: one line over the 4 rounds."""
    root = tmp_path_factory.mktemp("window")
    common = ["--config", SMOKE, "--max_steps", "8", "--save_steps", "8"]
    train.main([*common, "--output_dir", str(root / "each")])
    train.main([*common, "--output_dir", str(root / "window"), "--logging_steps", "8"])

    def history(run: str) -> list[dict]:
        return json.loads((root / run / "trainer_state.json").read_text())["log_history"]

    return history("each"), next(e for e in history("window") if e["step"] == 8 and "loss" in e)


def test_a_real_log_line_of_four_rounds_pools_their_completions(rounds_and_window):
    each, window = rounds_and_window
    rounds = [e for e in each if any(k.endswith("/count") for k in e)]
    assert len(rounds) == 4
    names = {
        k.split("/")[1] for e in rounds for k in e if k.startswith("templates/") and k.endswith("/count")
    }
    assert {k.split("/")[1] for k in window if k.startswith("templates/")} == names
    for name in names:
        drawn = [e for e in rounds if f"templates/{name}/count" in e]
        rows = sum(e[f"templates/{name}/count"] for e in drawn)
        assert window[f"templates/{name}/count"] == pytest.approx(rows / 4)
        for metric in ("mean_length", "truncated_ratio", "format", "repetition"):
            pooled = sum(e[f"templates/{name}/{metric}"] * e[f"templates/{name}/count"] for e in drawn) / rows
            assert window[f"templates/{name}/{metric}"] == pytest.approx(pooled, abs=1e-5), (name, metric)
    assert sum(v for k, v in window.items() if k.endswith("/count")) == pytest.approx(16)


def test_a_trl_evaluation_prints_its_watched_metrics_on_one_line(tiny_model_dir, tmp_path):
    """TRL's evaluation (``eval_strategy``) logs its metrics as ``eval_*``: the console line shows them as the
    training line does, after ``eval``, not the first keys of the entry (runtime, samples per second)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from prompt_aug import PromptAugGRPOTrainer
    from prompt_aug.logging_utils import compact_line

    def distinct_characters(completions: list[str], **kwargs: object) -> list[float]:
        return [float(len(set(c))) for c in completions]

    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=3, num_generations=3, max_completion_length=8,
        report_to="none", max_steps=2, save_strategy="no", logging_steps=1, use_cpu=True, bf16=False,
        eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=3,
    )  # fmt: skip
    questions = Dataset.from_dict({"prompt": ["What is 2+2?", "What is 3*3?", "What is 10-4?"]})
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=distinct_characters, args=args,
        train_dataset=questions, eval_dataset=questions,
    )  # fmt: skip
    trainer.train()
    (evaluated,) = [e for e in trainer.state.log_history if "eval_loss" in e]
    line = compact_line(evaluated, evaluated["step"], 2, trainer.args)
    expected = f"round 2 | step 2/2 | eval reward {evaluated['eval_reward']:.3f} | entropy "
    assert line.startswith(expected), line
    assert "truncated" in line and line.endswith(" s") and "eval_" not in line, line


def test_a_dynamic_sampling_line_shows_the_share_of_groups_kept():
    from prompt_aug.logging_utils import compact_line

    args = SimpleNamespace(steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1)
    logs = {"loss": 0.0, "dynamic_sampling/generated/reward": 0.5, "dynamic_sampling/kept_share": 0.4}
    assert compact_line(logs, 3, 8, args) == "round 3 | step 3/8 | reward 0.500 | kept 0.40"


@pytest.mark.parametrize(
    "command",
    [
        ["prompt_aug.train", "--config", SMOKE, "--templates", "nosuch"],
        ["prompt_aug.data", "--dataset", "no-such-file.jsonl", "--config", SMOKE],
    ],
)
def test_a_refused_command_prints_its_one_line_and_no_deprecation_of_trls(command):
    """A recipe keeps ``gradient_checkpointing`` (the GPU pins' transformers has no new name for it), which
    transformers 5.24 warns of: the warning would stand before every one-line error."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prompt-aug-"), done.stderr[-2000:]
