"""Every recipe key is honoured or refused: each field of TRL's `ModelConfig`, of `PromptAugScriptArguments`
and of `PromptAugGRPOConfig`'s own fields (those not inherited from `GRPOConfig`) is set to a value other
than its default, and the run's code path either does something different (the observation differs from the
default's) or refuses it in one line naming the key.

The tables below say, for each field, what changes and where it is observed. A field that appears in one of
those classes and in no table fails `test_every_field_is_in_a_table`: add a case (or a refusal) for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import PartialState
from datasets import Dataset
from trl import GRPOConfig, ModelConfig, get_peft_config

from prompt_aug import models, train
from prompt_aug.batches import batch_arithmetic
from prompt_aug.cli import UsageError, prepare_output_dir
from prompt_aug.config import (
    FEATURES,
    KEYS,
    SIGNALS,
    PromptAugGRPOConfig,
    planned_processes,
    trainer_settings,
)
from prompt_aug.data import DataError, load_train_dataset
from prompt_aug.evaluation.callback import EvalCallback
from prompt_aug.extensions.collapse import CollapseGuard
from prompt_aug.extensions.stabilisers import OptimizerResetCallback
from prompt_aug.recipe import PromptAugScriptArguments
from prompt_aug.sources import SourceError, read_training_data
from prompt_aug.templates import load_templates, templates_for
from prompt_aug.trainer import PromptAugGRPOTrainer
from rewards import correctness_reward, format_reward, get_reward_funcs


def _own_fields(cls: type, parent: type | None = None) -> set[str]:
    inherited = {f.name for f in dataclasses.fields(parent)} if parent else set()
    return {f.name for f in dataclasses.fields(cls)} - inherited


def _default(cls: type, name: str) -> Any:
    spec = next(f for f in dataclasses.fields(cls) if f.name == name)
    return spec.default_factory() if spec.default is dataclasses.MISSING else spec.default


def _refused(call, key: str) -> None:
    """``call`` raises a `ValueError` (the recipe errors all are) whose message is one line naming ``key``."""
    with pytest.raises(ValueError) as err:
        call()
    message = str(err.value)
    assert key in message and "\n" not in message, message


# -- ModelConfig: load kwargs, LoRA config, quantization, or a one-line refusal --------------------------

# field -> (the keys it needs to act, a non-default value). The observation is what the run passes on: the
# model folder, `from_pretrained`'s keyword arguments and the LoRA config handed to the trainer.
MODEL_CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "model_name_or_path": ({}, "someone/other-model"),
    "model_revision": ({}, "v2"),
    "dtype": ({}, "bfloat16"),
    "attn_implementation": ({}, "sdpa"),
    "use_peft": ({}, True),
    "lora_r": ({"use_peft": True}, 8),
    "lora_alpha": ({"use_peft": True}, 7),
    "lora_dropout": ({"use_peft": True}, 0.3),
    "lora_target_modules": ({"use_peft": True}, ["q_proj"]),
    "lora_target_parameters": ({"use_peft": True}, ["mlp.experts.down_proj"]),
    "lora_modules_to_save": ({"use_peft": True}, ["lm_head"]),
    "use_rslora": ({"use_peft": True}, True),
    "use_dora": ({"use_peft": True}, True),
    "load_in_8bit": ({"use_peft": True}, True),
    "load_in_4bit": ({"use_peft": True}, True),
    "bnb_4bit_quant_type": ({"use_peft": True, "load_in_4bit": True}, "fp4"),
    "use_bnb_nested_quant": ({"use_peft": True, "load_in_4bit": True}, True),
    "bnb_4bit_quant_storage": ({"use_peft": True, "load_in_4bit": True}, "bfloat16"),
}
# Fields refused whatever else is set: field -> (non-default value, the keys set beside it).
MODEL_REFUSED: dict[str, tuple[Any, dict[str, Any]]] = {
    "lora_task_type": ("SEQ_CLS", {"use_peft": True}),
}


@pytest.fixture(scope="module")
def script_config(tmp_path_factory) -> PromptAugGRPOConfig:
    out = tmp_path_factory.mktemp("keys")
    return PromptAugGRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none")


@pytest.fixture
def fake_gpu_with_bitsandbytes(monkeypatch):
    """What a CUDA machine with bitsandbytes looks like to the checks (the model itself never loads here)."""
    monkeypatch.setattr(models, "has_bitsandbytes", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def _model_effect(args: Any, **values: Any) -> dict[str, Any]:
    model_args = ModelConfig(**{"model_name_or_path": "someone/model", **values})
    models.check_model_args(model_args)
    kwargs = models.model_kwargs(model_args, args)
    quantization = kwargs.pop("quantization_config", None)
    peft = get_peft_config(model_args)
    return {
        "path": models.resolve_model_path(model_args, args),
        "kwargs": kwargs,
        "quantization": quantization.to_dict() if quantization is not None else None,
        "peft": peft.to_dict() if peft is not None else None,
    }


@pytest.mark.parametrize("field", sorted(MODEL_CASES))
def test_a_model_config_key_changes_what_is_loaded(field, script_config, fake_gpu_with_bitsandbytes):
    needs, value = MODEL_CASES[field]
    assert value != _default(ModelConfig, field)
    base = _model_effect(script_config, **needs)
    assert _model_effect(script_config, **needs, **{field: value}) != base


@pytest.mark.parametrize("field", sorted(f for f, (needs, _) in MODEL_CASES.items() if needs))
def test_a_model_config_key_without_the_key_it_needs_is_refused(
    field, script_config, fake_gpu_with_bitsandbytes
):
    needs, value = MODEL_CASES[field]
    missing = dict(list(needs.items())[:-1])  # drop the last key it needs (load_in_4bit, else use_peft)
    _refused(lambda: _model_effect(script_config, **missing, **{field: value}), field)


@pytest.mark.parametrize("field", sorted(MODEL_REFUSED))
def test_an_unsupported_model_config_value_is_refused(field, script_config):
    value, beside = MODEL_REFUSED[field]
    _refused(lambda: _model_effect(script_config, **beside, **{field: value}), field)


def test_quantized_loading_goes_through_trls_quantization_config_and_a_device_map(
    script_config, fake_gpu_with_bitsandbytes
):
    effect = _model_effect(script_config, use_peft=True, load_in_4bit=True, bnb_4bit_quant_type="nf4")
    assert effect["quantization"]["load_in_4bit"] and effect["quantization"]["bnb_4bit_quant_type"] == "nf4"
    assert effect["kwargs"]["device_map"] == {"": PartialState().local_process_index}
    assert _model_effect(script_config, use_peft=True, load_in_8bit=True)["quantization"]["load_in_8bit"]


def test_a_recipes_model_init_kwargs_reach_the_loaded_model(tiny_model_dir, tmp_path):
    """GRPOConfig's ``model_init_kwargs``, read from a recipe, go on top of what ModelConfig asks for."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"model_name_or_path: {tiny_model_dir}\ndataset_name: synthetic\noutput_dir: {tmp_path / 'out'}\n"
        "use_cpu: true\nbf16: false\nreport_to: none\ndtype: float32\n"
        "model_init_kwargs: {dtype: bfloat16, attn_implementation: eager}\n"
    )
    _, args, model_args, _ = train.parse_args(["--config", str(recipe)])
    model = models.load_model(str(tiny_model_dir), model_args, args)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config._attn_implementation == "eager"
    args.model_init_kwargs = None
    plain = models.load_model(str(tiny_model_dir), model_args, args)
    assert {p.dtype for p in plain.parameters()} == {torch.float32}
    assert plain.config._attn_implementation != "eager"


@pytest.mark.parametrize("flag", ["load_in_4bit", "load_in_8bit"])
def test_quantization_without_bitsandbytes_or_a_gpu_is_refused_in_one_line(flag, script_config, monkeypatch):
    model_args = ModelConfig(model_name_or_path="someone/model", use_peft=True, **{flag: True})
    monkeypatch.setattr(models, "has_bitsandbytes", lambda: False)
    with pytest.raises(models.ModelArgsError) as err:
        models.check_model_args(model_args)
    assert str(err.value) == (
        f"{flag}: needs the bitsandbytes package (pip install bitsandbytes) and a CUDA GPU; install it "
        f"there, or remove {flag} to train unquantized"
    )
    monkeypatch.setattr(models, "has_bitsandbytes", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(models.ModelArgsError, match=f"^{flag}: bitsandbytes quantization needs a CUDA GPU"):
        models.check_model_args(model_args)
    models.check_model_args(model_args, devices=False)  # a dry run on a CPU machine parses it
    with pytest.raises(models.ModelArgsError, match=f"^{flag}: .*add use_peft: true$"):
        models.check_model_args(ModelConfig(**{flag: True}), devices=False)


def test_an_fsdp_launch_refuses_at_parse_what_it_cannot_run(tmp_path, monkeypatch):
    """Under an FSDP launch (accelerate's environment): evaluation during training, and a reference model
    (beta > 0, no LoRA) under fsdp_cpu_ram_efficient_loading, which loads it as zeros on all but the first
    process; each in one line before anything loads. Without that loading, or with LoRA, beta runs."""
    from prompt_aug import train

    smoke = str(Path(__file__).resolve().parents[1] / "recipes/smoke/tiny_cpu.yaml")
    questions = tmp_path / "sums.jsonl"
    questions.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    evaluating = ["--eval_every_steps", "1", "--eval_benchmarks", str(questions)]
    shards = "evaluation during training generates with each process's whole model, which FSDP shards"
    with pytest.raises(SystemExit, match=shards):
        train.main(["--config", smoke, "--dry_run", *evaluating])
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")
    zeros = r"^prompt-aug-train: error: command line --beta, overriding .*: beta > 0 under FSDP with fsdp_cpu"
    with pytest.raises(SystemExit, match=zeros):
        train.main(["--config", smoke, "--dry_run", "--beta", "0.01"])
    train.main(["--config", smoke, "--dry_run", "--beta", "0.01", "--use_peft", "true"])  # not refused
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
    train.main(["--config", smoke, "--dry_run", "--beta", "0.01"])


def test_a_model_key_refused_names_the_recipe_file_that_set_it(tmp_path):
    """A ModelConfig key's refusal says where it was set, as every other key's does: the recipe file, or the
    command line over it."""
    from prompt_aug import train

    recipe = tmp_path / "qlora.yaml"
    smoke = Path(__file__).resolve().parents[1] / "recipes/smoke/tiny_cpu.yaml"
    recipe.write_text(smoke.read_text() + "\nload_in_4bit: true\n")
    with pytest.raises(SystemExit) as err:
        train.main(["--config", str(recipe), "--dry_run"])
    assert str(err.value) == (
        f"prompt-aug-train: error: {recipe}: load_in_4bit: a quantized model trains only through LoRA "
        "adapters (QLoRA); add use_peft: true"
    )
    with pytest.raises(SystemExit) as err:
        train.main(["--config", str(recipe), "--dry_run", "--use_peft", "true", "--dtype", "auto"])
    assert str(err.value).startswith(
        f"prompt-aug-train: error: {recipe} and command line --dtype: dtype: auto"
    )


@pytest.mark.skipif(
    models.has_bitsandbytes() and torch.cuda.is_available(), reason="this machine can load 4-bit models"
)
def test_the_training_command_refuses_quantization_here_in_one_line(tmp_path):
    """Without bitsandbytes or CUDA, `prompt-aug-train` stops before anything loads."""
    recipe = Path(__file__).resolve().parents[1] / "recipes/smoke/tiny_cpu.yaml"
    with pytest.raises(SystemExit) as err:
        train.main([
            "--config", str(recipe), "--output_dir", str(tmp_path / "run"), "--use_peft", "true",
            "--load_in_4bit", "true",
        ])  # fmt: skip
    message = str(err.value)
    assert message.startswith("prompt-aug-train: error: load_in_4bit: ") and "\n" not in message
    assert ("pip install bitsandbytes" in message) or ("CUDA GPU" in message)
    assert not (tmp_path / "run").exists()


# -- PromptAugScriptArguments: the data, the tokenizer, the rewards, how the run starts ----------------


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Local datasets shaped so that each data key picks different rows."""
    root = tmp_path_factory.mktemp("data")
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1), "level": str(i % 2)} for i in range(6)]
    _write(root / "a" / "train.jsonl", rows)
    _write(root / "a" / "test.jsonl", rows[:2])
    _write(root / "a" / "sub" / "train.jsonl", rows[3:])
    _write(root / "b" / "train.jsonl", [{**r, "question": r["question"] + " Be exact."} for r in rows])
    _write(  # `question` and `answer` under other names: a column named so would be refused beside q2 / a2
        root / "cols" / "train.jsonl",
        [
            {
                "problem": r["question"],
                "final_answer": r["answer"],
                "q2": f"Compute {i} * 2.",
                "a2": str(2 * i),
            }
            for i, r in enumerate(rows)
        ],
    )
    long = [*rows, {"question": "Explain " + "very " * 80 + "long.", "answer": "1"}]
    _write(root / "long" / "train.jsonl", long)
    _write(root / "bad" / "train.jsonl", [*rows, {"question": "What is 0 + 0?", "answer": ""}])  # 1 of 7 bad
    run = root / "used"
    run.mkdir()
    (run / "trainer_state.json").write_text("{}")
    return root


def _loaded_rows(script_args, args, tokenizer) -> list[dict[str, Any]]:
    templates, _, eval_template = templates_for(args)
    read = read_training_data(script_args, seed=args.seed)
    dataset, report = load_train_dataset(read, script_args, args, templates, eval_template, tokenizer)
    return [*dataset.to_list(), str(report)]


# field -> (base keys, keys with the field changed, what is observed). `S` is the script's arguments, `A` the
# trainer config, `tok` the tiny model's folder and tokenizer.
def _script_cases(data: Path) -> dict[str, tuple[dict, dict, Any]]:
    a, mixture = str(data / "a"), {"datasets": [{"path": str(data / "a")}, {"path": str(data / "b")}]}
    rows = lambda S, A, tok: _loaded_rows(S, A, tok[1])
    return {
        "dataset_name": ({"dataset_name": a}, {"dataset_name": str(data / "b")}, rows),
        "dataset_config": ({"dataset_name": a}, {"dataset_name": a, "dataset_config": "sub"}, rows),
        "dataset_split": ({"dataset_name": a}, {"dataset_name": a, "dataset_split": "test"}, rows),
        "question_column": (
            {"dataset_name": str(data / "cols")},
            {"dataset_name": str(data / "cols"), "question_column": "q2"},
            rows,
        ),
        "answer_column": (
            {"dataset_name": str(data / "cols")},
            {"dataset_name": str(data / "cols"), "answer_column": "a2"},
            rows,
        ),
        "dataset_levels": ({"dataset_name": a}, {"dataset_name": a, "dataset_levels": ["1"]}, rows),
        "dataset_mixture": ({"dataset_name": a}, {"dataset_mixture": mixture}, rows),
        "num_synthetic": (
            {"dataset_name": "synthetic"},
            {"dataset_name": "synthetic", "num_synthetic": 5},
            rows,
        ),
        "max_prompt_length": (
            {"dataset_name": str(data / "long")},
            {"dataset_name": str(data / "long"), "max_prompt_length": 60},
            rows,
        ),
        "max_bad_row_share": (
            {"dataset_name": str(data / "bad")},
            {"dataset_name": str(data / "bad"), "max_bad_row_share": 0.5},
            lambda S, A, tok: _rows_or_refusal(S, A, tok[1]),
        ),
        "dataset_num_rows": ({}, {"dataset_num_rows": 100}, lambda S, A, tok: batch_arithmetic(A, S).table()),
        "num_processes": ({}, {"num_processes": 4}, lambda S, A, tok: batch_arithmetic(A, S).table()),
        "chat_template": (
            {},
            {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"},
            lambda S, A, tok: models.load_tokenizer(tok[0], ModelConfig(), A, S.chat_template).chat_template,
        ),
        "reward_funcs": (
            {},
            {"reward_funcs": ["strict_correctness", "think_format_reward"]},
            lambda S, A, tok: [f.__name__ for f in get_reward_funcs(S.reward_funcs)],
        ),
        "soft_punish_cache": (
            {"reward_funcs": ["get_soft_overlong_punishment"]},
            {"reward_funcs": ["get_soft_overlong_punishment"], "soft_punish_cache": 300},
            lambda S, A, tok: train.reward_functions(S, A)[0][0](
                ["x"] * 3,
                completion_ids=[[1] * (A.max_completion_length - k) for k in (0, 100, 280)],
                answer=["4"] * 3,
            ),
        ),
        "overwrite_output_dir": (
            {"dataset_name": a},
            {"dataset_name": a, "overwrite_output_dir": True},
            lambda S, A, tok: _prepare(S, str(data / "used")),
        ),
        "dry_run": ({}, {"dry_run": True}, None),  # its own test below
    }


def _rows_or_refusal(script_args, args, tokenizer) -> Any:
    try:
        return _loaded_rows(script_args, args, tokenizer)
    except (DataError, SourceError) as err:
        return f"refused: {err}"


def _prepare(script_args, output_dir: str) -> str:
    args = argparse.Namespace(output_dir=output_dir, resume_from_checkpoint=None, eval_data_dir=None)
    try:
        prepare_output_dir(
            script_args, args, ModelConfig(model_name_or_path="tiny-random-qwen2"), PartialState()
        )
    except UsageError as err:
        return f"refused: {err}"
    return "prepared"


@pytest.mark.parametrize("field", sorted(f for f, case in _script_cases(Path()).items() if case[2]))
def test_a_script_key_changes_what_the_run_reads(field, data, tiny_model_dir, tokenizer, script_config):
    base, changed, observe = _script_cases(data)[field]
    assert changed[field] != _default(PromptAugScriptArguments, field)
    before = observe(PromptAugScriptArguments(**base), script_config, (tiny_model_dir, tokenizer))
    after = observe(PromptAugScriptArguments(**changed), script_config, (tiny_model_dir, tokenizer))
    assert after != before


def test_dry_run_prints_the_arithmetic_where_a_run_would_start(tmp_path, capsys):
    argv = ["--model_name_or_path", "tiny-random-qwen2", "--output_dir", str(tmp_path), "--use_cpu", "true"]
    with pytest.raises(SystemExit, match="dataset_name is not set"):
        train.main(argv)
    train.main([*argv, "--dry_run"])
    assert "questions per round" in capsys.readouterr().out


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"dataset_name": "x", "dataset_mixture": {"datasets": [{"path": "y"}]}}, "dataset_name"),
        ({"dataset_mixture": {"datasets": [{"path": "y"}]}, "dataset_split": "test"}, "dataset_split"),
        ({"dataset_mixture": {"datasets": [{"path": "y"}]}, "dataset_config": "c"}, "dataset_config"),
        ({"dataset_mixture": {"datasets": [{"path": "y", "weight": 1}]}}, "weight"),
        ({"dataset_mixture": {"datasets": [{"path": "y"}], "streaming": True}}, "streaming"),
        ({"dataset_mixture": {"datasets": [{"path": "y"}], "test_split_size": 0.1}}, "test_split_size"),
        ({"dataset_mixture": {"datasets": [{"path": "y", "fraction": 1}, {"path": "z"}]}}, "fraction"),
        ({"dataset_mixture": {"datasets": []}}, "dataset_mixture.datasets"),
        ({"dataset_mixture": {"sources": []}}, "sources"),
        ({"dataset_name": "my/data", "num_synthetic": 10}, "num_synthetic"),
    ],
)
def test_script_keys_that_cannot_work_together_are_refused(keys, message):
    _refused(lambda: PromptAugScriptArguments(**keys), message)


@pytest.mark.parametrize(
    "source, message",
    [
        (
            {"path": ["a.jsonl", "b.jsonl"]},
            "dataset_mixture.datasets[0].path: text (a path or a Hub id), got [",
        ),
        ({"path": None}, "dataset_mixture.datasets[0].path: text (a path or a Hub id), got None"),
        ({"path": "y", "split": ["train"]}, "dataset_mixture.datasets[0].split: text, got ['train']"),
        ({"path": "y", "question_column": 3}, "dataset_mixture.datasets[0].question_column: text, got 3"),
        ({"path": "y", "columns": "question"}, "dataset_mixture.datasets[0].columns: a list of column names"),
        ({"path": "y", "dataset_levels": {"a": 1}}, "dataset_mixture.datasets[0].dataset_levels: a list"),
    ],
)
def test_a_mixture_source_key_of_the_wrong_type_is_refused_naming_it(source, message):
    _refused(lambda: PromptAugScriptArguments(dataset_mixture={"datasets": [source]}), message)


def test_a_mixture_sources_levels_are_read_as_the_top_level_key_is():
    # One value is a list of one, not its letters; numbers match str(level).
    mixture = {"datasets": [{"path": "y", "dataset_levels": "Level 3"}, {"path": "z", "dataset_levels": 3}]}
    sources = PromptAugScriptArguments(dataset_mixture=mixture).dataset_mixture.datasets
    assert [s.dataset_levels for s in sources] == [["Level 3"], ["3"]]


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("num_generations", 0, "num_generations: must be at least 2, got 0"),
        ("num_generations", None, "num_generations: no value; give a whole number of at least 2, or remove"),
        ("per_device_train_batch_size", 0, "per_device_train_batch_size: must be at least 1, got 0"),
        ("per_device_train_batch_size", -8, "per_device_train_batch_size: must be at least 1, got -8"),
        ("gradient_accumulation_steps", 0, "gradient_accumulation_steps: must be at least 1, got 0"),
        ("steps_per_generation", -2, "steps_per_generation: must be at least 1, got -2"),
        ("loss_type", "dapoo", "loss_type: 'dapoo' is not one of grpo, dr_grpo, dapo, bnpo, cispo"),
        ("scale_rewards", "grp", "scale_rewards: 'grp' is not one of group, batch, none"),
        ("eval_every_steps", -1, "eval_every_steps: must be at least 0, got -1"),
        ("eval_limit", -3, "eval_limit: must be at least 1, got -3"),
        ("eval_max_tokens", 0, "eval_max_tokens: must be at least 1, got 0"),
        # A budget below one token would make every row its own packed call.
        ("packing_max_tokens", 0, "packing_max_tokens: must be at least 1, got 0"),
        ("remove_unused_columns", True, "remove_unused_columns: true would drop every column but prompt"),
    ],
)
def test_a_batch_loss_or_evaluation_key_that_cannot_run_is_refused_when_parsed(key, value, message, tmp_path):
    # Else a traceback in TRL's own checks, a negative batch, or a failure only after the model has loaded.
    def parse():
        PromptAugGRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **{key: value}
        )

    _refused(parse, message)


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "temperature",
            0.0,
            (
                "temperature: must be above 0 (GRPO samples its completions; 1.0 samples as the model does), "
                "got 0.0"
            ),
        ),
        (
            "temperature",
            float("nan"),
            "temperature: must be above 0 (GRPO samples its completions; 1.0 samples",
        ),
        ("learning_rate", -1e-5, "learning_rate: must be at least 0, got -1e-05"),
        ("adam_epsilon", -1e-8, "adam_epsilon: must be at least 0, got -1e-08"),
        ("weight_decay", -0.1, "weight_decay: must be at least 0, got -0.1"),
        ("adam_beta1", 1.5, "adam_beta1: must be at least 0 and below 1, got 1.5"),
        ("adam_beta2", 1.0, "adam_beta2: must be at least 0 and below 1, got 1.0"),
        ("adam_beta2", -0.1, "adam_beta2: must be at least 0 and below 1, got -0.1"),
        ("num_iterations", 0, "num_iterations: must be at least 1, got 0"),
        (
            "num_train_epochs",
            0,
            (
                "num_train_epochs: 0 with max_steps -1 trains no optimizer step; set num_train_epochs above "
                "0, or max_steps to the steps to train"
            ),
        ),
        (
            "max_steps",
            0,
            "max_steps: 0 trains no optimizer step; set the steps to train, or -1 to train num_train_epochs",
        ),
        ("report_to", "wandbb", "report_to: 'wandbb' is not one of azure_ml, comet_ml, mlflow,"),
        ("report_to", ["tensorboard", "W&B"], "report_to: 'W&B' is not one of azure_ml,"),
        ("report_to", ["none", "wandb"], "report_to: none cannot be combined with other integrations; give"),
        ("top_p", 1.5, "top_p: must be above 0 and at most 1, got 1.5"),
        ("top_p", 0.0, "top_p: must be above 0 and at most 1, got 0.0"),
        ("min_p", 2.0, "min_p: must be at least 0 and at most 1, got 2.0"),
        ("learning_rate", None, "learning_rate: no value; give a number, or remove the line"),
        ("max_completion_length", 0, "max_completion_length: must be at least 1, got 0"),
        ("packing_pad_to_multiple_of", -8, "packing_pad_to_multiple_of: must be at least 1, got -8"),
        ("save_strategy", "best", "save_strategy: best needs metric_for_best_model"),
        ("model_init_kwargs", "auto", "model_init_kwargs: 'auto' is not a mapping; give key: value lines"),
        ("model_init_kwargs", [1, 2], "model_init_kwargs: [1, 2] is not a mapping"),
        ("model_init_kwargs", "{bad", "model_init_kwargs: not a JSON object (Expecting property name"),
        ("chat_template_kwargs", "notjson", "chat_template_kwargs: 'notjson' is not a mapping"),
        ("lr_scheduler_kwargs", "x", "lr_scheduler_kwargs: 'x' is not a mapping"),
        (
            "chat_template_kwargs",
            {"enable_thinking": False, "add_generation_prompt": False},
            "chat_template_kwargs: 'add_generation_prompt' is set by the prompt rendering itself;",
        ),
        (
            "chat_template_kwargs",
            '{"tokenize": true}',
            "chat_template_kwargs: 'tokenize' is set by the prompt",
        ),
    ],
)
def test_a_value_training_would_refuse_only_once_started_is_refused_when_parsed(
    key, value, message, tmp_path
):
    # torch's optimizer refuses these bounds, TRL divides by the temperature, the Trainer refuses an unknown
    # integration: each only once the model has loaded. Zero iterations or epochs trained nothing, exit 0.
    settings = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "report_to": "none", key: value}
    _refused(lambda: PromptAugGRPOConfig(**settings), message)


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"fp16": True, "skip_minibatch_ratio_above": 2.0},
            "skip_minibatch_ratio_above is not supported with fp16 (its gradient scaler cannot step over",
        ),
        (
            {"loss_type": "vespo", "use_vllm": True},
            "loss_type: vespo with use_vllm needs vllm_importance_sampling_mode token_truncate or token_mask",
        ),
        (
            {"use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": 3},
            "vllm_tensor_parallel_size: 3 must divide the 4 processes with vllm_mode colocate",
        ),
        (  # TRL's client would ask for //health, which the server answers 404, and retry forever
            {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://node1:8000/"},
            (
                "vllm_server_base_url: http://node1:8000/ ends in '/', and TRL's client appends its paths to "
                "it (http://node1:8000//health, which the server does not serve, so it waits forever); set "
                "it to http://node1:8000"
            ),
        ),
    ],
)
def test_keys_that_trl_refuses_together_once_the_model_has_loaded_are_refused_when_parsed(
    settings, message, tmp_path
):
    # The stabilisers and TRL's vLLM generation refuse these as the trainer is built; TRL's own conditions.
    base = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "report_to": "none"}
    with planned_processes(4):
        _refused(lambda: PromptAugGRPOConfig(**base, **settings), message)


def test_what_trl_takes_beside_those_refusals_still_parses(tmp_path):
    base = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "report_to": "none"}
    with planned_processes(4):
        for settings in (
            {"loss_type": "vespo", "use_vllm": True, "vllm_importance_sampling_mode": "token_mask"},
            {"loss_type": "vespo", "use_vllm": True, "vllm_importance_sampling_correction": False},
            {"use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": 2},
            {"use_vllm": True, "vllm_mode": "server", "vllm_tensor_parallel_size": 3},
            {"save_strategy": "best", "metric_for_best_model": "loss"},
            {"top_p": 1.0, "min_p": 0.0, "max_completion_length": 1, "packing_pad_to_multiple_of": 1},
            {"model_init_kwargs": '{"dtype": "float32"}', "chat_template_kwargs": {"enable_thinking": False}},
        ):
            PromptAugGRPOConfig(**base, **settings)
    assert PromptAugGRPOConfig(**base, model_init_kwargs='{"dtype": "float32"}').model_init_kwargs == {
        "dtype": "float32"
    }


def test_the_bounds_of_what_training_takes_still_parse(tmp_path):
    config = PromptAugGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=["tensorboard"], temperature=0.01,
        learning_rate=0.0, adam_beta1=0.0, num_train_epochs=0, max_steps=3, num_iterations=1,
    )  # fmt: skip
    assert (config.max_steps, config.num_train_epochs, config.report_to) == (3, 0, ["tensorboard"])


@pytest.mark.parametrize(
    "key, value, message",
    [
        # Generation: transformers refuses these at the first round, after the model has loaded; an unset
        # length fails in the round's metrics (torch.full_like of None).
        ("max_completion_length", None, "max_completion_length: no value; give a number, or remove the line"),
        ("repetition_penalty", 0.0, "repetition_penalty: must be above 0, got 0.0"),
        ("top_k", -1, "top_k: must be at least 0, got -1 (0 keeps every token, as -1 does in vLLM and verl)"),
        # The loss: a quantile below 0 fails torch.quantile at the first step; above 1 masks nothing.
        ("top_entropy_quantile", -0.5, "top_entropy_quantile: must be at least 0 and at most 1, got -0.5"),
        ("top_entropy_quantile", 1.5, "top_entropy_quantile: must be at least 0 and at most 1, got 1.5"),
        # Trained without a word, on the wrong objective: a KL bonus, clip bounds on the wrong side of 1.
        ("beta", -0.1, "beta: must be at least 0, got -0.1"),
        ("epsilon", -0.2, "epsilon: must be at least 0, got -0.2"),
        ("epsilon_high", -1.0, "epsilon_high: must be at least 0, got -1.0"),
        # pandas refuses a negative sample at the first W&B table upload.
        ("wandb_completions_rows", -1, "wandb_completions_rows: must be at least 0, got -1"),
    ],
)
def test_a_generation_or_loss_value_that_fails_in_training_is_refused_when_parsed(
    key, value, message, tmp_path
):
    settings = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "report_to": "none", key: value}
    _refused(lambda: PromptAugGRPOConfig(**settings), message)


def test_the_bounds_of_the_generation_and_loss_values_still_parse(tmp_path):
    config = PromptAugGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", repetition_penalty=0.5,
        top_k=0, top_entropy_quantile=0.0, beta=0.0, epsilon=0.0, epsilon_high=None,
        wandb_completions_rows=0, max_completion_length=1,
    )  # fmt: skip
    assert (config.top_k, config.epsilon_high, config.wandb_completions_rows) == (0, None, 0)
    assert PromptAugGRPOConfig(output_dir=str(tmp_path), top_entropy_quantile=1.0, use_cpu=True, bf16=False)


def test_sync_ref_model_with_lora_is_refused_naming_the_recipe_and_the_flag():
    # TRL's trainer refuses it (NotImplementedError, a traceback) once the model has loaded: under LoRA the
    # reference is the base with the adapter off, so there is no reference model to sync.
    recipe = Path(__file__).resolve().parents[1] / "recipes/qwen2.5-math-1.5b/prompt_aug_prorl.yaml"
    argv = ["--config", str(recipe), "--dry_run", "--num_processes", "8"]
    with pytest.raises(UsageError) as err:
        train.parse_args([*argv, "--use_peft", "true"])
    message = str(err.value)
    assert message.startswith(f"{recipe} and command line --use_peft: sync_ref_model: true with use_peft")
    assert "set sync_ref_model: false" in message and "\n" not in message
    assert train.parse_args([*argv, "--sync_ref_model", "false", "--reset_optimizer_on_ref_sync", "false",
                             "--use_peft", "true"])  # fmt: skip


def test_soft_punish_cache_without_the_overlong_penalty_warns_that_it_does_nothing():
    with pytest.warns(UserWarning) as caught:
        PromptAugScriptArguments(soft_punish_cache=512)
    (line,) = [str(w.message) for w in caught]
    assert line.startswith("soft_punish_cache: no effect, since reward_funcs has no ")
    assert "get_soft_overlong_punishment" in line and "\n" not in line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PromptAugScriptArguments(
            reward_funcs=["correctness", "get_soft_overlong_punishment"], soft_punish_cache=512
        )


def test_a_recipe_without_reward_functions_is_refused():
    _refused(lambda: PromptAugScriptArguments(reward_funcs=[]), "reward_funcs: none given; name at least one")


def test_the_loss_types_accepted_are_those_trls_trainer_knows():
    # The list is TRL's, written down because TRL has no list of them; its trainer's branches must agree.
    import re

    import trl.trainer.grpo_trainer as grpo

    from prompt_aug.config import LOSS_TYPES

    source = Path(grpo.__file__).read_text()
    named = set(re.findall(r'loss_type == "(\w+)"', source))
    for listed in re.findall(r"loss_type in \[([^\]]*)\]", source):
        named |= set(re.findall(r'"(\w+)"', listed))
    assert named == set(LOSS_TYPES)


# -- PromptAugGRPOConfig's own fields: what the trainer sets up from them ------------------------------

BANK, SUMS, SUITE = "<bank.yaml>", "<sums.jsonl>", "<suite>"  # files the `build_trainer` fixture writes
EVAL = {"eval_benchmarks": [SUMS], "eval_every_steps": 5}


def _guard(t):
    return next((c.specs for c in t.callback_handler.callbacks if isinstance(c, CollapseGuard)), None)


def _spec(name: str, part: str):
    return lambda t: [getattr(s, part) for s in _guard(t) or [] if s.name == name]


def _evaluator(part: str):
    return lambda t: next(
        (getattr(c, part) for c in t.callback_handler.callbacks if isinstance(c, EvalCallback)), None
    )


def _sampler(part: str):
    return lambda t: t.features.dynamic_sampling and getattr(t.features.dynamic_sampling, part)


def _collapse_cases() -> dict[str, tuple[dict[str, Any], Any, Any]]:
    cases = {}
    signals = [
        ("entropy", "floor", 0.5, "rounds", {}),
        ("accuracy", "drop", 0.2, "rounds", {}),
        ("truncation", "ceiling", 0.9, "rounds", {}),
        ("repetition", "ceiling", 0.8, "rounds", {}),
        ("eval", "drop", 0.1, "evaluations", EVAL),
    ]
    for name, kind, threshold, window, needs in signals:
        on = {**needs, f"collapse_{name}_{kind}": threshold}
        cases[f"collapse_{name}_{kind}"] = (needs, threshold, _spec(name, "threshold"))
        cases[f"collapse_{name}_{window}"] = (on, 7, _spec(name, "window"))
        cases[f"collapse_{name}_action"] = (on, "log", _spec(name, "action"))
    cases["collapse_accuracy_metric"] = (
        {"collapse_accuracy_drop": 0.2},
        "rewards/format_reward/mean",
        _spec("accuracy", "keys"),
    )
    return cases


# field -> (the keys it needs to act, a non-default value, what the trainer made of it). A trainer is built
# with the keys it needs and one with the field changed too: what is observed must differ.
TRAINER_CASES: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "prompt_augmentation": ({}, False, lambda t: t.prompt_collator is None),
    "templates": ({}, ["abel", "open-r1"], lambda t: [x.name for x in t.prompt_collator.templates]),
    "template_weights": (
        {"templates": ["abel", "open-r1"]},
        [3.0, 1.0],
        lambda t: t.prompt_collator._cumulative,
    ),
    "templates_file": ({}, BANK, lambda t: [x.user for x in t.prompt_collator.templates]),
    "eval_template": ({}, "open-r1", lambda t: t.prompt_collator.eval_template.name),
    "system_prompt": ({}, "You are careful.", lambda t: [x.system for x in t.prompt_collator.templates]),
    "stop_tokens": ({}, ["<|im_start|>"], lambda t: sorted(t.eos_token_ids)),  # the EOS are both defaults
    "reward_cut_tokens": ({}, ["<|endoftext|>"], lambda t: sorted(t.reward_cut_ids)),
    "eval_benchmarks": ({"eval_every_steps": 5}, [SUMS], _evaluator("benchmarks")),
    "eval_every_steps": ({"eval_benchmarks": [SUMS]}, 5, _evaluator("every_n_steps")),
    "eval_data_dir": (EVAL, SUITE, _evaluator("data_dir")),
    "eval_limit": (EVAL, 1, _evaluator("limit")),
    "eval_max_tokens": (EVAL, 8, _evaluator("max_tokens")),
    "eval_question_column": (EVAL, "other", lambda t: [p.question for p in _evaluator("problems")(t)()]),
    "eval_answer_column": (EVAL, "gold", lambda t: [p.gold for p in _evaluator("problems")(t)()]),
    "dynamic_sampling": ({}, True, lambda t: t.features.dynamic_sampling is None),
    "dynamic_sampling_signal": ({"dynamic_sampling": True}, "format_reward", _sampler("signal_index")),
    "dynamic_sampling_max_passes": ({"dynamic_sampling": True}, 2, _sampler("max_passes")),
    "dynamic_sampling_std_tol": ({"dynamic_sampling": True}, 1e-3, _sampler("std_tol")),
    **_collapse_cases(),
    "reset_optimizer_on_ref_sync": (
        {"beta": 0.04, "sync_ref_model": True},
        True,
        lambda t: any(isinstance(c, OptimizerResetCallback) for c in t.callback_handler.callbacks),
    ),
    "skip_minibatch_ratio_above": (
        {},
        2.0,
        lambda t: t.features.minibatch_skip and t.features.minibatch_skip.threshold,
    ),
    "trim_padding": ({}, "off", lambda t: t.padding_free.mode),  # the default, auto, is packed on CPU
    "packing_max_tokens": ({}, 4096, lambda t: t.padding_free.max_tokens),
    "packing_pad_to_multiple_of": ({}, 8, lambda t: t.padding_free.pad_to_multiple_of),
    # On CPU too the packed path gets the varlen attention function, which reads shared prompts.
    "packing_share_prompts": (
        {"trim_padding": "packed"},
        True,
        lambda t: (t.padding_free.share_prompts, t.padding_free.attention),
    ),
    "wandb_completions_rows": ({}, 3, lambda t: t.wandb_completions_rows),
    "save_on_preemption": ({}, False, lambda t: t.preemption is not None),
}


@pytest.fixture(scope="module")
def build_trainer(tmp_path_factory, tiny_model_dir):
    """A trainer on the tiny model with the given keys set (files named by placeholder written here)."""
    tmp = tmp_path_factory.mktemp("trainers")
    # Its other columns give a second question and gold, for eval_question_column and eval_answer_column.
    _write(
        tmp / "sums.jsonl",
        [{"question": "What is 2 + 2?", "answer": "4", "other": "What is 3 + 3?", "gold": "6"}],
    )
    (tmp / "bank.yaml").write_text(
        "- {name: plain, system: 'Box the answer.', user: 'Q: {question}'}\n"
        "- {name: tagged, system: '', user: '{question} Answer in <answer> tags.', answer: tag, "
        "markers: ['<answer>', '</answer>']}\n"
    )
    files = {BANK: str(tmp / "bank.yaml"), SUMS: str(tmp / "sums.jsonl"), SUITE: str(tmp)}

    def place(value):
        return [place(v) for v in value] if isinstance(value, list) else files.get(value, value)

    def build(settings: dict[str, Any]) -> PromptAugGRPOTrainer:
        args = PromptAugGRPOConfig(
            output_dir=str(tmp / "out"), per_device_train_batch_size=4, num_generations=4, max_steps=1,
            max_completion_length=8, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
            **{key: place(value) for key, value in settings.items()},
        )  # fmt: skip
        return PromptAugGRPOTrainer(
            model=str(tiny_model_dir), reward_funcs=[correctness_reward, format_reward], args=args,
            train_dataset=Dataset.from_dict({"question": ["What is 1 + 1?"] * 4, "answer": ["2"] * 4}),
        )  # fmt: skip

    return build


def test_stop_and_cut_tokens_the_vocabulary_lacks_are_named_in_a_warning(build_trainer, caplog):
    """A value the recipe set whose tokens are not single tokens of the vocabulary (a tag that splits, a
    misspelt special token) is skipped with one warning naming the key; the ChatML default is quiet."""
    with caplog.at_level("WARNING", logger="prompt_aug"):
        trainer = build_trainer(
            {"stop_tokens": ["<|im_end|>", "</answer>"], "reward_cut_tokens": ["<|eot_id|>"]}
        )
    lines = [r.getMessage() for r in caplog.records if "vocabulary" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("stop_tokens: ['</answer>'] is not one token")
    assert lines[1].startswith("reward_cut_tokens: ['<|eot_id|>'] is not one token")
    assert trainer.reward_cut_ids == set()  # skipped
    caplog.clear()
    with caplog.at_level("WARNING", logger="prompt_aug"):
        build_trainer({})
    assert not [r for r in caplog.records if "vocabulary" in r.getMessage()]


@pytest.mark.parametrize("field", sorted(TRAINER_CASES))
def test_a_trainer_key_changes_what_the_trainer_sets_up(field, build_trainer):
    needs, value, observe = TRAINER_CASES[field]
    assert value != _default(PromptAugGRPOConfig, field)
    assert observe(build_trainer({**needs, field: value})) != observe(build_trainer(needs)), field


def test_system_prompt_goes_before_each_template_system_text(build_trainer):
    trainer = build_trainer(
        {"templates_file": BANK, "eval_template": "open-r1", "system_prompt": "Be careful."}
    )
    systems = {t.name: t.system for t in trainer.prompt_collator.templates}
    assert systems == {"plain": "Be careful.\n\nBox the answer.", "tagged": "Be careful."}
    open_r1 = load_templates()["open-r1"]  # not in the file's bank: the built-in one
    assert trainer.prompt_collator.eval_template.system == "Be careful.\n\n" + open_r1.system


# -- The tables cover every field --------------------------------------------------------------------


def test_every_field_is_in_a_table(tmp_path):
    assert _own_fields(ModelConfig) == set(MODEL_CASES) | set(MODEL_REFUSED), (
        "a ModelConfig field without a case: add it to MODEL_CASES (what it changes) or refuse it"
    )
    script_fields = set(_script_cases(tmp_path))
    assert _own_fields(PromptAugScriptArguments) == script_fields, (
        "a PromptAugScriptArguments field without a case in _script_cases"
    )
    own = _own_fields(PromptAugGRPOConfig, GRPOConfig)
    assert own == set(TRAINER_CASES), "a PromptAugGRPOConfig field without an entry in TRAINER_CASES"


# -- Keys that only a feature reads: set while it is off, they warn ---------------------------------------

# key -> (a value away from its default, the keys that turn its feature on)
_EVAL_ON = ["--eval_every_steps", "5", "--eval_benchmarks", "[math500]"]
INERT_CASES: dict[str, tuple[str, list[str]]] = {
    "templates": ("[abel]", ["--prompt_augmentation", "true"]),
    "dynamic_sampling_std_tol": ("0.5", ["--dynamic_sampling", "true"]),
    "eval_limit": ("3", ["--eval_every_steps", "5", "--eval_benchmarks", "[math500]"]),
    "packing_pad_to_multiple_of": ("64", ["--trim_padding", "packed"]),
    "collapse_truncation_rounds": ("5", ["--collapse_truncation_ceiling", "0.5"]),
    "collapse_eval_action": ("stop", ["--collapse_eval_drop", "0.1", *_EVAL_ON]),
    "wandb_completions_rows": ("4", ["--log_completions", "true", "--report_to", "wandb"]),
}
OFF = {
    "templates": ["--prompt_augmentation", "false"],
    "dynamic_sampling_std_tol": [],
    "eval_limit": [],
    "packing_pad_to_multiple_of": ["--trim_padding", "trim"],
    "collapse_truncation_rounds": [],
    "collapse_eval_action": [],
    "wandb_completions_rows": ["--log_completions", "true"],
}


def test_every_key_read_only_by_a_feature_names_one_the_table_knows():
    gated = {name: info.feature for name, info in KEYS.items() if info.feature is not None}
    assert set(gated.values()) <= set(FEATURES)
    # Every key of the guard's signals but the threshold that turns one on is read only while it is on.
    for signal, (threshold, window) in SIGNALS.items():
        keys = [k for k in KEYS if k.startswith(f"collapse_{signal}_") and k != threshold]
        assert window in keys and all(gated.get(k) == f"the collapse guard's {signal} signal" for k in keys)


def test_a_plain_grpo_config_reads_as_ours_with_trls_behaviour(tmp_path):
    plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, seed=3)
    settings = trainer_settings(plain)
    assert settings.stop_tokens == [] and settings.reward_cut_tokens == []  # TRL: the model's EOS alone
    assert (
        settings.prompt_augmentation and settings.trim_padding == "auto" and settings.eval_benchmarks is None
    )
    assert settings.seed == 3 and settings.output_dir == str(tmp_path)  # TRL's own fields, as they are
    ours = PromptAugGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert trainer_settings(ours) is ours and ours.stop_tokens != []


def _config_warnings(tmp_path, *argv: str) -> list[str]:
    base = [
        "--config",
        str(Path(__file__).resolve().parents[1] / "recipes/smoke/tiny_cpu.yaml"),
        "--output_dir",
        str(tmp_path),
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train.parse_args([*base, *argv])
    return [str(w.message) for w in caught if "no effect" in str(w.message)]


@pytest.mark.parametrize("key", sorted(INERT_CASES))
def test_a_key_set_while_its_feature_is_off_warns_in_one_line_naming_it(key, tmp_path):
    value, turn_on = INERT_CASES[key]
    assert _config_warnings(tmp_path, *OFF[key]) == []
    (line,) = _config_warnings(tmp_path, *OFF[key], f"--{key}", value)
    assert line.startswith(f"{key}: no effect, since ") and "\n" not in line, line
    assert _config_warnings(tmp_path, *OFF[key], f"--{key}", value, *turn_on) == []


def test_a_vllm_context_shorter_than_prompt_and_completion_is_refused_when_parsed():
    # vLLM ends a completion at its context (finish reason "length", short of max_completion_length) and
    # refuses a prompt longer than it, in the middle of the run.
    recipe = Path(__file__).resolve().parents[1] / "recipes/qwen2.5-math-1.5b/prompt_aug.yaml"
    argv = ["--config", str(recipe), "--dry_run", "--num_processes", "8"]
    with pytest.raises(UsageError) as err:
        train.parse_args([*argv, "--max_completion_length", "3584"])
    message = str(err.value)
    assert "vllm_max_model_length: 4096 is less than max_prompt_length 1024 + max_completion_length 3584" in (
        message
    )
    assert message.endswith("raise it to 4608, or lower the other two") and "\n" not in message
    # The paper's own lengths fill the context exactly; without vLLM the key does nothing.
    assert train.parse_args(argv)
    assert train.parse_args([*argv, "--max_completion_length", "3584", "--use_vllm", "false"])
