"""End to end: the smoke recipe trains on CPU and logs what a user watches."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from prompt_aug import train

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes/smoke/tiny_cpu.yaml")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "run"
    log = logging.FileHandler(out.parent / "prompt_aug.log")  # beside the run: what its logger said
    logging.getLogger("prompt_aug").addHandler(log)
    try:
        with (
            pytest.MonkeyPatch.context() as patch
        ):  # the run puts the token in its environment: put back after
            patch.setenv("HF_TOKEN", "")
            patch.delenv("HF_TOKEN")
            patch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)  # as `python -m prompt_aug.train` runs
            train.main([
                "--config", SMOKE, "--output_dir", str(out), "--hub_token", HUB_TOKEN,
                "--model_init_kwargs", json.dumps({"token": HUB_TOKEN}),  # a gated model's, given alike
            ])  # fmt: skip
    finally:
        logging.getLogger("prompt_aug").removeHandler(log)
        log.close()
    return out


HUB_TOKEN = "hf_NeverPublishedSmokeToken"


def test_a_hub_token_is_in_no_file_the_run_writes(smoke_run):
    """Checkpoints, the model folder and the card are what a push uploads: the token given on the command
    line, as ``hub_token`` and in ``model_init_kwargs``, is in none of them (the Trainer would pickle it into
    training_args.bin)."""
    files = [p for p in smoke_run.rglob("*") if p.is_file()]
    assert any(p.name == "training_args.bin" for p in files) and any(p.name == "README.md" for p in files)
    assert [p for p in files if HUB_TOKEN.encode() in p.read_bytes()] == []


def test_a_model_token_other_than_the_hub_token_is_refused_before_the_run(tmp_path, monkeypatch):
    """Both are read from HF_TOKEN once taken out of the arguments (which checkpoints pickle): two cannot."""
    monkeypatch.setenv("HF_TOKEN", "hf_TheEnvironmentsOwnToken")
    with pytest.raises(SystemExit) as err:
        train.main([
            "--config", SMOKE, "--output_dir", str(tmp_path / "run"),
            "--model_init_kwargs", json.dumps({"token": "hf_AnotherTokenForTheModel"}),
        ])  # fmt: skip
    assert str(err.value) == (
        "prompt-aug-train: error: model_init_kwargs: its token is not the one in HF_TOKEN (or hub_token), "
        "and every checkpoint's training_args.bin would carry it; give the one token through HF_TOKEN"
    )
    assert not (tmp_path / "run").exists()


def test_the_run_logs_the_mixed_precision_its_accelerator_trains_in(smoke_run):
    lines = (smoke_run.parent / "prompt_aug.log").read_text().splitlines()
    said = [line for line in lines if line.startswith("mixed precision:")]
    assert said == ["mixed precision: no (fp32 compute: the recipe's bf16 and fp16 are false)"]


# The launcher's words: `accelerate launch` passes its config's (or --mixed_precision's) precision in this.
AMP = "the launcher's ACCELERATE_MIXED_PRECISION={} (accelerate launch: its config or --mixed_precision)"


# The warning's two shapes: a recipe in fp32 whose launcher's precision applies, and a recipe's that wins.
def _fp32_recipe(launcher: str, keys: str) -> str:
    return (
        f"the recipe has bf16: false and fp16: false (fp32), but {AMP.format(launcher)} applies when both "
        f"are false, so this run trains in {launcher} mixed precision; to make them agree, launch with "
        f"`accelerate launch --mixed_precision no`, or set {keys} in the recipe"
    )


def _recipe_wins(used: str, launcher: str, keys: str) -> str:
    return (
        f"the recipe's {used}: true overrides {AMP.format(launcher)}, so this run trains in {used} mixed "
        f"precision; to make them agree, launch with `accelerate launch --mixed_precision {used}`, or set "
        f"{keys} in the recipe"
    )


@pytest.mark.parametrize(
    ("bf16", "fp16", "launcher", "trains_in", "warning"),
    [
        (False, False, None, "no", None),  # python -m prompt_aug.train, torchrun
        (False, False, "no", "no", None),
        (None, False, None, "bf16", None),  # TRL's bf16 is true unless set
        (True, False, "bf16", "bf16", None),
        (False, False, "bf16", "bf16", _fp32_recipe("bf16", "bf16: true")),
        (False, False, "FP16", "fp16", _fp32_recipe("fp16", "fp16: true and bf16: false")),
        (True, False, "no", "bf16", None),  # accelerate launch with no config: "no" is its default, no choice
        (True, False, "fp16", "bf16", _recipe_wins("bf16", "fp16", "fp16: true and bf16: false")),
        (False, True, "bf16", "fp16", _recipe_wins("fp16", "bf16", "bf16: true")),
    ],
)
def test_the_precision_is_the_trainers_and_a_launcher_that_contradicts_the_recipe_is_named(
    tmp_path, monkeypatch, bf16, fp16, launcher, trains_in, warning
):
    """transformers takes the recipe's fp16 or bf16 when true, else the launcher's precision: a recipe's bf16:
    false does not turn off accelerate's bf16, and says so in one line naming both and the two ways out."""
    from prompt_aug import PromptAugGRPOConfig
    from prompt_aug.train import mixed_precision

    if launcher is None:
        monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher)
    args = PromptAugGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=bf16, fp16=fp16, report_to="none")
    precision, _, warned = mixed_precision(args, dict(os.environ))
    assert precision == trains_in == args.mixed_precision.lower()  # the Trainer hands it to its Accelerator
    assert warned == (None if warning is None else f"mixed precision: {warning}")


def test_the_precision_line_says_where_the_accelerators_precision_comes_from():
    from types import SimpleNamespace

    from prompt_aug.train import precision_line

    fp32, bf16 = SimpleNamespace(bf16=False, fp16=False), SimpleNamespace(bf16=True, fp16=False)
    launched = {"ACCELERATE_MIXED_PRECISION": "bf16"}
    assert precision_line("bf16", fp32, launched) == (
        "mixed precision: bf16 (the launcher's ACCELERATE_MIXED_PRECISION=bf16, which applies as the "
        "recipe's bf16 and fp16 are false)"
    )
    assert precision_line("bf16", bf16, {}) == "mixed precision: bf16 (the recipe's bf16: true)"
    # An accelerator that decided otherwise (DeepSpeed reads its own config) is not explained by the recipe.
    assert precision_line("no", bf16, {}) == (
        "mixed precision: no (the accelerator's own choice: a DeepSpeed config's fp16 / bf16 sections, or no "
        "fp8 on this GPU)"
    )


def test_a_launcher_precision_against_the_recipes_is_warned_before_anything_loads(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # as accelerate_configs/single_gpu.yaml sets it
    absent = str(tmp_path / "no-such-data")  # stops the run once it has started
    with caplog.at_level("INFO", logger="prompt_aug"), pytest.raises(SystemExit, match="no-such-data"):
        train.main(["--config", SMOKE, "--output_dir", str(tmp_path / "out"), "--dataset_name", absent])
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warned if w.startswith("mixed precision:")] == [
        (
            "mixed precision: the recipe has bf16: false and fp16: false (fp32), but the launcher's "
            "ACCELERATE_MIXED_PRECISION=bf16 (accelerate launch: its config or --mixed_precision) applies "
            "when both are false, so this run trains in bf16 mixed precision; to make them agree, launch "
            "with `accelerate launch --mixed_precision no`, or set bf16: true in the recipe"
        )
    ]


def test_skipping_mini_batches_under_a_launchers_fp16_is_refused_before_anything_loads(monkeypatch):
    # fp16 from the launcher brings the gradient scaler as the recipe's fp16 does, which a skip would crash.
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    with pytest.raises(
        SystemExit,
        match="^prompt-aug-train: error: [^\n]*skip_minibatch_ratio_above is not "
        "supported with fp16, which the launcher's ACCELERATE_MIXED_PRECISION=fp16 sets",
    ):
        train.main(["--config", SMOKE, "--dry_run", "--skip_minibatch_ratio_above", "2"])
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    train.main(["--config", SMOKE, "--dry_run", "--skip_minibatch_ratio_above", "2"])  # no scaler: taken


def test_smoke_run_writes_checkpoint_state_and_records(smoke_run):
    assert (smoke_run / "checkpoint-4" / "trainer_state.json").is_file()
    assert (smoke_run / "model.safetensors").is_file()
    assert sorted(p.name for p in (smoke_run / "completions").glob("*.parquet"))
    assert (smoke_run / "README.md").read_text().count("tiny-random-qwen2") >= 1


def test_log_history_has_entropy_finite_loss_and_per_template_metrics(smoke_run):
    history = json.loads((smoke_run / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "loss" in h]
    assert len(steps) == 4 and all(math.isfinite(float(h["loss"])) for h in steps)
    assert all("entropy" in h for h in steps)
    keys = {k for h in history for k in h}
    names = {k.split("/")[1] for k in keys if k.startswith("templates/")}
    assert names, "no per-template metrics logged"
    for name in names:
        for metric in ("accuracy", "format", "mean_length", "truncated_ratio", "count"):
            assert f"templates/{name}/{metric}" in keys, (name, metric)
        for reward_name in ("correctness_reward", "format_reward"):  # every reward function, by TRL's name
            assert f"templates/{name}/rewards/{reward_name}" in keys, (name, reward_name)


def test_per_template_metrics_match_the_completion_records(smoke_run):
    history = {
        h["step"]: h for h in json.loads((smoke_run / "trainer_state.json").read_text())["log_history"]
    }
    # steps_per_generation=2: rounds are generated at steps 1 and 3, each logged at its own step.
    for step in (1, 3):
        records = pd.read_parquet(smoke_run / "completions" / f"completions_{step:05d}.parquet")
        assert len(records) == 16
        for name, group in records.groupby("template"):
            logged = history[step]
            assert logged[f"templates/{name}/count"] == len(group)
            assert logged[f"templates/{name}/format"] == pytest.approx(group["format_reward"].mean())
            assert logged[f"templates/{name}/accuracy"] == pytest.approx(group["correctness_reward"].mean())
            assert 1 <= logged[f"templates/{name}/mean_length"] <= 32
        assert sum(v for k, v in history[step].items() if k.endswith("/count")) == 16
        assert history[step]["completions/accuracy"] == pytest.approx(records["correctness_reward"].mean())


def test_per_template_metrics_follow_a_reward_named_by_import_path(tmp_path):
    out = tmp_path / "run"
    rewards = ["correctness", "rewards.controls:shuffled_format_reward"]
    train.main(["--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--reward_funcs", *rewards])
    history = {h["step"]: h for h in json.loads((out / "trainer_state.json").read_text())["log_history"]}
    records = pd.read_parquet(out / "completions" / "completions_00001.parquet")
    for name, group in records.groupby("template"):
        logged = history[1][f"templates/{name}/rewards/shuffled_format_reward"]
        assert logged == pytest.approx(group["shuffled_format_reward"].mean())


def test_a_reward_named_like_a_per_template_metric_keeps_its_own_key():
    """Reward means go under ``rewards/``: a function named ``count`` neither replaces the template's row
    count nor is averaged into another metric."""
    from collections import defaultdict
    from types import SimpleNamespace

    import torch

    from prompt_aug.metrics import TemplateMetrics

    def count(completions, **kwargs):
        return [0.5] * len(completions)

    buffers: dict = defaultdict(lambda: defaultdict(list))
    trainer = SimpleNamespace(
        reward_funcs=[count], reward_func_names=["count"], metric_buffer=lambda mode: buffers[mode]
    )
    rewards = torch.tensor([[0.5], [0.5], [0.5]])
    TemplateMetrics(["a"]).append(
        trainer, ["a", "a", "a"], rewards, torch.tensor([3.0, 5, 4]), torch.zeros(3), "train"
    )
    logged = buffers["train"]
    assert logged["templates/a/count"] == [3.0] and logged["templates/a/rewards/count"] == [0.5]
    assert logged["templates/a/mean_length"] == [4.0]


def test_per_template_accuracy_under_the_plus_minus_5_reward_is_the_share_right():
    """``correctness_pm5`` scores +5 / -5; the template's accuracy is still the share of right answers, and
    its own mean stays in its units under ``rewards/``."""
    from collections import defaultdict
    from types import SimpleNamespace

    import torch

    from prompt_aug.metrics import TemplateMetrics
    from rewards.registry import REGISTRY

    buffers: dict = defaultdict(lambda: defaultdict(list))
    trainer = SimpleNamespace(
        reward_funcs=[REGISTRY["format"], REGISTRY["correctness_pm5"]],
        reward_func_names=["format_reward", "correctness_pm5_reward"],
        metric_buffer=lambda mode: buffers[mode],
    )
    rewards = torch.tensor([[1.0, 5.0], [0.0, -5.0], [1.0, -5.0], [1.0, 5.0], [1.0, float("nan")]])
    TemplateMetrics(["a", "b"]).append(
        trainer, ["a", "a", "a", "b", "b"], rewards, torch.ones(5), torch.zeros(5), "train"
    )
    logged = buffers["train"]
    assert logged["templates/a/accuracy"] == [pytest.approx(1 / 3)]
    assert logged["templates/b/accuracy"] == [1.0]  # the ungraded row (None, NaN) is left out
    assert logged["templates/a/rewards/correctness_pm5_reward"] == [pytest.approx(-5 / 3)]
    assert logged["templates/a/format"] == [pytest.approx(2 / 3)]
    assert logged["completions/accuracy"] == [0.5]  # the round's share right: 2 of the 4 graded rows
    # Under dynamic sampling (``kept`` given) the rows are everything generated, and the key says so.
    TemplateMetrics(["a", "b"]).append(
        trainer, ["a", "a", "a", "b", "b"], rewards, torch.ones(5), torch.zeros(5), "eval", kept=torch.ones(5)
    )
    assert buffers["eval"]["dynamic_sampling/generated/completions/accuracy"] == [0.5]
    assert "completions/accuracy" not in buffers["eval"]


def test_the_console_plot_and_collapse_guard_read_the_share_right_not_the_plus_minus_5_total():
    """A ``correctness_pm5`` run's ``reward`` is on a +5 / -5 scale; the run's accuracy is the share right."""
    from types import SimpleNamespace

    from prompt_aug.extensions.collapse import guard_from_args
    from prompt_aug.logging_utils import compact_line
    from prompt_aug.plot import CURVES

    logs = {"reward": -1.25, "rewards/correctness_pm5_reward/mean": -1.25, "completions/accuracy": 0.375}
    args = SimpleNamespace(steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1)
    assert "accuracy 0.375" in compact_line(logs, 1, 2, args)
    accuracy_curve = next(keys for title, _, keys, _ in CURVES if title == "Training accuracy")
    assert next(k for k in accuracy_curve if k in logs) == "completions/accuracy"
    pm5 = ["--config", SMOKE, "--dry_run", "--reward_funcs", "correctness_pm5", "format"]
    guard = guard_from_args(train.parse_args(pm5).training_args, 1.0)
    spec = next(spec for spec in guard.specs if spec.name == "accuracy")
    assert next(k for k in spec.keys if k in logs) == "completions/accuracy"


def test_completion_records_have_one_template_per_step_and_uid(smoke_run):
    records = pd.concat(pd.read_parquet(p) for p in sorted((smoke_run / "completions").glob("*.parquet")))
    assert {"template", "uid", "step", "prompt", "completion"} <= set(records.columns)
    groups = records.groupby(["step", "uid"])
    assert (groups["template"].nunique() == 1).all()
    assert (groups.size() == 4).all()  # num_generations rollouts per question
    for _, row in records.head(20).iterrows():
        assert row["prompt"].endswith("<|im_start|>assistant\n" + _prefill(row["template"]))


def _prefill(name: str) -> str:
    from prompt_aug.templates import get_template

    return get_template(name).prefill


@pytest.mark.slow
def test_the_final_model_and_card_are_saved_before_the_after_scores_generate(tmp_path, monkeypatch):
    """The learning demo's "after" scores generate once training has ended; a failure there (out of memory,
    Ctrl-C) leaves the trained model and its card on disk."""
    from prompt_aug.demo.warmstart import BeforeAfter

    def measure(self, when: str, model, tokenizer) -> None:  # "before" skipped: the test needs "after" only
        if when == "after":
            raise RuntimeError("out of memory while scoring after GRPO")

    monkeypatch.setattr(BeforeAfter, "measure", measure)
    out = tmp_path / "run"
    argv = ["--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "no"]
    with pytest.raises(RuntimeError, match="while scoring after GRPO"):
        train.main([*argv, "--before_after", "true"])
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert "- Optimizer steps: 2\n" in (out / "README.md").read_text()
    assert not (out / "before_after.md").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--eval_strategy", "steps"],
            "eval_strategy: steps evaluates an eval_dataset, which prompt-aug-train",
        ),
        (
            ["--save_strategy", "best", "--metric_for_best_model", "reward"],
            "save_strategy: best saves when the Trainer's evaluation finds a better",
        ),
        (
            ["--fp16", "true", "--skip_minibatch_ratio_above", "2"],
            "skip_minibatch_ratio_above is not supported ",
        ),
        (
            ["--loss_type", "vespo", "--use_vllm", "true"],
            "loss_type: vespo with use_vllm needs vllm_importance_",
        ),
        (
            ["--use_vllm", "true", "--vllm_tensor_parallel_size", "3", "--num_processes", "2"],
            "vllm_tensor_parallel_size: 3 must divide the 2 processes with vllm_mode colocate",
        ),
    ],
)
def test_keys_the_trainer_refuses_once_built_are_refused_by_the_dry_run_in_one_line(flags, message, capsys):
    # Else a traceback from the Trainer, TRL or the stabilisers after the data and the model have loaded.
    with pytest.raises(SystemExit, match=f"^prompt-aug-train: error: [^\\n]*{message}") as exit_:
        train.main(["--config", SMOKE, "--dry_run", *flags])
    assert "\n" not in str(exit_.value) and "questions per round" not in capsys.readouterr().out


def test_a_trainer_built_in_code_still_takes_the_trainers_own_evaluation(tiny_model_dir, tmp_path):
    """prompt-aug-train refuses ``eval_strategy`` (it passes no eval_dataset); a trainer built in code is
    given one, as GRPOTrainer is, and evaluates it."""
    from datasets import Dataset

    from prompt_aug import PromptAugGRPOConfig, PromptAugGRPOTrainer

    args = PromptAugGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", eval_strategy="steps",
        eval_steps=2, per_device_train_batch_size=2, num_generations=2, per_device_eval_batch_size=2,
        max_completion_length=4,
    )  # fmt: skip
    assert args.eval_strategy == "steps"
    questions = Dataset.from_dict({"question": ["What is 1 + 1?", "What is 2 + 2?"], "answer": ["2", "4"]})

    def two(completions, **kwargs):
        return [2.0] * len(completions)

    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=two, args=args, train_dataset=questions,
        eval_dataset=questions,
    )  # fmt: skip
    assert trainer.evaluate()["eval_reward"] == 2.0


def test_recipe_keys_turn_on_evaluation_during_training(tmp_path):
    import datasets

    suite = tmp_path / "suite"
    datasets.DatasetDict(
        {
            "math": datasets.Dataset.from_dict(
                {"problem": ["What is $2+2$?", "What is $3+3$?"], "answer": ["4", "6"]}
            )
        }
    ).save_to_disk(str(suite))
    out = tmp_path / "run"
    train.main([
        "--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "no",
        "--eval_benchmarks", "math500", "--eval_every_steps", "2", "--eval_data_dir", str(suite),
        "--eval_max_tokens", "8",
    ])  # fmt: skip
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    evaluated = [h for h in history if "eval/math500/accuracy" in h]
    assert [h["step"] for h in evaluated] == [2]
    assert {"eval/macro", "eval/micro"} <= set(evaluated[0])


def test_an_evaluation_template_the_chat_template_cannot_render_stops_before_the_model_loads(
    tmp_path, monkeypatch
):
    # A bank of one's own without system turns renders under a chat template that refuses them; the
    # evaluation's qwen-math (from the built-in bank) does not, which would fail at the first evaluation.
    import datasets

    suite = tmp_path / "suite"
    datasets.DatasetDict(
        {"math": datasets.Dataset.from_dict({"problem": ["What is $2+2$?"], "answer": ["4"]})}
    ).save_to_disk(str(suite))
    bank = tmp_path / "bank.yaml"
    bank.write_text("- {name: plain, user: 'Q: {question}'}\n")
    no_system = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system turns') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}"
    )

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(train, "load_model", no_model)
    base = ["--config", SMOKE, "--templates_file", str(bank), "--chat_template", no_system]
    evaluating = ["--eval_benchmarks", "math500", "--eval_every_steps", "2", "--eval_data_dir", str(suite)]
    with pytest.raises(SystemExit) as refused:
        train.main([*base, *evaluating, "--output_dir", str(tmp_path / "run")])
    assert "template 'qwen-math' failed to render with the tokenizer: no system turns" in str(refused.value)
    with pytest.raises(AssertionError, match="the model was loaded"):  # without evaluation it trains
        train.main([*base, "--output_dir", str(tmp_path / "plain")])


@pytest.mark.slow
def test_wandb_gets_a_sampled_completions_table_and_parquet_keeps_every_row(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    import wandb

    out = tmp_path / "run"
    try:
        train.main([
            "--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "no",
            "--max_completion_length", "8", "--report_to", "wandb", "--wandb_completions_rows", "3",
        ])  # fmt: skip
    finally:
        wandb.finish()  # the Trainer leaves the run open; later tests must not log into it
        wandb.teardown()  # nor keep this test's WANDB_DIR, which wandb reads once per process
    tables = sorted(tmp_path.glob("wandb/offline-run-*/files/media/table/completions_*.table.json"))
    rows = [len(json.loads(t.read_text())["data"]) for t in tables]
    assert rows == [3, 3], rows  # one 3-row sample per logged round-step, not TRL's 16 rows
    columns = json.loads(tables[0].read_text())["columns"]
    assert {"template", "uid", "round", "completion"} <= set(columns)
    for step in (1, 2):
        assert len(pd.read_parquet(out / "completions" / f"completions_{step:05d}.parquet")) == 16


def test_a_completion_ending_in_the_pad_token_is_not_counted_as_truncated():
    """As TRL's ``completions/clipped_ratio``: a completion ends at a stop token or at the pad token."""
    from collections import defaultdict
    from types import SimpleNamespace

    import torch
    from accelerate import Accelerator

    from prompt_aug.metrics import TemplateMetrics

    eos, pad = 2, 0
    buffers: dict = defaultdict(lambda: defaultdict(list))
    trainer = SimpleNamespace(
        accelerator=Accelerator(cpu=True), eos_token_ids=[eos], max_completion_length=4,
        text_tokenizer=SimpleNamespace(pad_token_id=pad), reward_funcs=[], reward_func_names=[],
        metric_buffer=lambda mode: buffers[mode],
    )  # fmt: skip
    ids = torch.tensor([[5, 6, eos, pad], [5, pad, 7, 8], [5, 6, 7, pad], [5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    rows = [{"template": "a"}] * 4
    TemplateMetrics(["a"]).log_round(
        trainer, rows, {"completion_ids": ids, "completion_mask": mask}, None, "train"
    )
    assert buffers["train"]["templates/a/truncated_ratio"] == [0.5]  # the second and the last


def _recipe_block(card: str) -> str:
    """The model card's recipe section: the yaml block under ``## Recipe``."""
    return card.split("\n## Recipe\n\n```yaml\n", 1)[1].split("\n```", 1)[0]


def test_a_resumed_runs_card_shows_the_overrides_of_every_launch(tmp_path, monkeypatch):
    """A run started with an override and resumed without it trained its first steps with that value: the
    card's recipe shows each launch's overrides, the resumed one's with the step it resumed at."""
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    out = tmp_path / "run"
    first = ["--config", SMOKE, "--output_dir", str(out), "--save_steps", "1"]
    train.main([*first, "--max_steps", "1", "--learning_rate", "5e-7"])
    train.main(
        ["--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--resume_from_checkpoint", "true"]
    )
    block = _recipe_block((out / "README.md").read_text())
    resumed = f"--output_dir {out} --max_steps 2 --resume_from_checkpoint true"
    assert block.splitlines()[-2:] == [
        f"# command-line overrides: --output_dir {out} --save_steps 1 --max_steps 1 --learning_rate 5e-7",
        f"# command-line overrides, resumed at step 1: {resumed}",
    ], block
    # A third launch keeps both lines, and adds its own.
    train.main(
        ["--config", SMOKE, "--output_dir", str(out), "--max_steps", "3", "--resume_from_checkpoint", "true"]
    )
    lines = _recipe_block((out / "README.md").read_text()).splitlines()
    third = f"--output_dir {out} --max_steps 3 --resume_from_checkpoint true"
    assert lines[-3:] == [*block.splitlines()[-2:], f"# command-line overrides, resumed at step 2: {third}"]
