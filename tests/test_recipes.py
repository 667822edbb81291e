"""Recipes: every shipped YAML parses (dry run, CPU), and its header's batch arithmetic is what it computes.

Header convention, one line per process count a recipe documents::

    # dry-run (8 processes): questions 128, completions 1024, optimizer steps 4, completions/step 256, \
rounds/epoch 66, total rounds 3960

The numbers must equal `prompt_aug.batches.batch_arithmetic` for that process count.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from prompt_aug import train
from prompt_aug.batches import batch_arithmetic
from prompt_aug.cli import wants_dry_run
from prompt_aug.records import optimizer_steps_per_round

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted(REPO.glob("recipes/**/*.yaml"))
PAPER = REPO / "recipes/qwen2.5-math-1.5b"
DRY_RUN_LINE = re.compile(
    r"^# dry-run \((?P<processes>\d+) process(?:es)?\): questions (?P<questions>\d+), "
    r"completions (?P<completions>\d+), "
    r"optimizer steps (?P<steps>[\d.]+), completions/step (?P<per_step>\d+), rounds/epoch (?P<rounds>\d+), "
    r"total rounds (?P<total>\d+)\s*$"
)


def _ids(paths):
    return [str(p.relative_to(REPO / "recipes")) for p in paths]


def _header(path: Path) -> list[str]:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def _dry_run_lines(path: Path) -> list[dict[str, str]]:
    return [m.groupdict() for line in _header(path) if (m := DRY_RUN_LINE.match(line))]


def _parse(path: Path, processes: int, *extra: str):
    return train.parse_args(["--config", str(path), "--dry_run", "--num_processes", str(processes), *extra])


def test_recipes_are_found():
    names = {p.name for p in RECIPES}
    assert {
        "tiny_cpu.yaml",
        "prompt_aug.yaml",
        "dapo_single_template.yaml",
        "grpo_single_template.yaml",
        "prompt_aug_lora_1gpu.yaml",
    } <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=_ids(RECIPES))
def test_no_shipped_recipe_sets_a_key_that_does_nothing(recipe):
    processes = int(_dry_run_lines(recipe)[0]["processes"]) if _dry_run_lines(recipe) else 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _parse(recipe, processes)
    assert [str(w.message) for w in caught if "no effect" in str(w.message)] == []


@pytest.mark.parametrize("recipe", RECIPES, ids=_ids(RECIPES))
def test_a_recipe_that_records_completions_logs_every_round(recipe):
    # TRL keeps one round's completions for its next log line: a line every N rounds records 1 in N.
    processes = int(_dry_run_lines(recipe)[0]["processes"]) if _dry_run_lines(recipe) else 1
    args = _parse(recipe, processes).training_args
    if args.log_completions:
        assert args.logging_steps <= optimizer_steps_per_round(args), (args.logging_steps, recipe.name)


@pytest.mark.parametrize("recipe", RECIPES, ids=_ids(RECIPES))
def test_dry_run_parses_and_prints_the_table(recipe, capsys):
    processes = int(_dry_run_lines(recipe)[0]["processes"]) if _dry_run_lines(recipe) else 1
    train.main(["--config", str(recipe), "--dry_run", "--num_processes", str(processes)])
    out = capsys.readouterr().out
    for row in (
        "processes",
        "questions per round",
        "completions per round",
        "optimizer steps per round",
        "rounds per epoch",
        "total rounds",
    ):
        assert row in out, row
    assert "?" not in out, "a shipped recipe should know its row count (dataset_num_rows)"


def test_a_dry_run_that_no_count_reached_says_it_planned_one_process(monkeypatch, capsys):
    # The paper's recipe is for 8 processes; its dry run without a count shows one process's round, and
    # says so rather than leave 16 questions a round to be read as the recipe's.
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    paper = str(REPO / "recipes/qwen2.5-math-1.5b/prompt_aug.yaml")
    train.main(["--config", paper, "--dry_run"])
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["processes", "1"]
    assert out.splitlines()[-1] == f"(one process: {train.ONE_PROCESS_HINT})"
    train.main(["--config", paper, "--dry_run", "--num_processes", "8"])
    assert "one process" not in capsys.readouterr().out
    train.main(["--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"), "--dry_run"])  # a CPU recipe: one
    assert "one process" not in capsys.readouterr().out


@pytest.mark.parametrize("recipe", RECIPES, ids=_ids(RECIPES))
def test_header_comment_block_and_its_numbers_match_the_arithmetic(recipe):
    header = _header(recipe)
    assert header, f"{recipe} must start with a comment block"
    text = "\n".join(header)
    for needed in ("Reproduces:", "Hardware:", "Batch arithmetic"):
        assert needed in text, f"{recipe.name}: header lacks {needed!r}"
    if recipe.parent == PAPER:
        assert re.search(r"wall-clock", text, re.IGNORECASE), (
            f"{recipe.name}: header must state the expected wall-clock"
        )
    claims = _dry_run_lines(recipe)
    assert claims, f"{recipe.name}: header needs a machine-readable '# dry-run (N processes): ...' line"
    for claim in claims:
        processes = int(claim["processes"])
        script_args, args, _, _ = _parse(recipe, processes)
        got = batch_arithmetic(args, script_args)
        assert got.processes == processes
        assert got.questions_per_round == int(claim["questions"]), claim
        assert got.completions_per_round == int(claim["completions"]), claim
        assert got.optimizer_steps_per_round == float(claim["steps"]), claim
        assert got.completions_per_optimizer_step == int(claim["per_step"]), claim
        assert got.rounds_per_epoch == int(claim["rounds"]), claim
        assert got.total_rounds == int(claim["total"]), claim


def test_paper_recipe_on_8_processes_is_128_questions_1024_completions_4_steps():
    script_args, args, _, _ = _parse(PAPER / "prompt_aug.yaml", 8)
    got = batch_arithmetic(args, script_args)
    assert (got.questions_per_round, got.completions_per_round, got.optimizer_steps_per_round) == (
        128,
        1024,
        4,
    )
    assert got.completions_per_optimizer_step == 256
    assert (got.rounds_per_epoch, got.total_rounds) == (66, 3960)
    # Checkpoint every 20 rounds.
    assert args.save_steps == 20 * got.optimizer_steps_per_round


def test_paper_recipe_values():
    r = yaml.safe_load((PAPER / "prompt_aug.yaml").read_text())
    expected = {
        "model_name_or_path": "Qwen/Qwen2.5-Math-1.5B",
        "dataset_name": "hkust-nlp/SimpleRL-Zoo-Data",
        "dataset_config": "simplelr_qwen_level3to5",
        "dataset_num_rows": 8523,
        "templates": None,  # the whole bank
        "template_weights": None,  # uniform
        "reward_funcs": ["correctness", "format"],
        "stop_tokens": ["<|endoftext|>"],  # the paper's stop rule: EOS only (docs/reproduce.md, "Stop rule")
        "reward_cut_tokens": [],  # verl's reward decodes without special tokens: nothing is cut
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 4,
        "steps_per_generation": 16,
        "num_generations": 8,
        "num_iterations": 1,
        "num_train_epochs": 60,
        "learning_rate": 1e-6,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.01,
        "max_grad_norm": 1.0,
        "bf16": True,
        "beta": 0.0,
        "entropy_coef": 0.0,
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "mask_truncated_completions": False,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_prompt_length": 1024,
        "max_completion_length": 3072,
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_max_model_length": 4096,
        "save_steps": 80,
        "save_total_limit": 3,
        "delta": 3.0,
        "vllm_importance_sampling_correction": False,
        "wandb_completions_rows": 16,
        "report_to": "wandb",
        "log_completions": True,
        "gradient_checkpointing": True,
    }
    assert {k: r.get(k) for k in expected} == expected
    assert "generation_batch_size" not in r, "use steps_per_generation so the round follows the process count"
    assert r["max_prompt_length"] + r["max_completion_length"] == r["vllm_max_model_length"]


def _keys(name: str) -> dict:
    return yaml.safe_load((PAPER / name).read_text())


def _diff(a: dict, b: dict) -> dict:
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def test_single_template_variants_differ_from_the_paper_run_only_where_they_should():
    paper, dapo, grpo = (
        _keys("prompt_aug.yaml"),
        _keys("dapo_single_template.yaml"),
        _keys("grpo_single_template.yaml"),
    )
    naming = {"output_dir", "run_name"}
    assert set(_diff(paper, dapo)) - naming == {"templates"}
    assert dapo["templates"] == ["qwen-math"]
    assert _diff(dapo, grpo).keys() - naming == {
        "beta",
        "epsilon_high",
        "use_bias_correction_kl",
        "num_train_epochs",
    }
    assert grpo["beta"] == 0.001 and "epsilon_high" not in grpo and grpo["epsilon"] == 0.2
    assert grpo["num_train_epochs"] == 20 and grpo["use_bias_correction_kl"] is False


def test_grpo_baseline_parses_to_symmetric_clip_and_k3_kl():
    args = _parse(PAPER / "grpo_single_template.yaml", 8).training_args
    assert args.epsilon_high is None  # TRL then clips at 1 + epsilon on both sides
    assert args.beta == 0.001 and args.loss_type == "dapo"


def test_lora_recipe_is_one_gpu_32_questions_256_completions_4_steps_of_64():
    script_args, args, model_args, _ = _parse(PAPER / "prompt_aug_lora_1gpu.yaml", 1)
    got = batch_arithmetic(args, script_args)
    assert (got.questions_per_round, got.completions_per_round) == (32, 256)
    assert (got.optimizer_steps_per_round, got.completions_per_optimizer_step) == (4, 64)
    assert model_args.use_peft and model_args.lora_target_modules in ("all-linear", ["all-linear"])
    assert args.use_vllm and args.vllm_mode == "colocate"
    from trl import get_peft_config

    assert get_peft_config(model_args) is not None


def test_full_1gpu_recipe_is_64_questions_2_paper_steps_of_256_for_300_rounds():
    script_args, args, model_args, _ = _parse(PAPER / "prompt_aug_1gpu_full.yaml", 1)
    got = batch_arithmetic(args, script_args)
    assert (got.questions_per_round, got.completions_per_round) == (64, 512)
    assert (got.optimizer_steps_per_round, got.completions_per_optimizer_step) == (2, 256)
    assert (got.rounds_per_epoch, got.total_rounds) == (133, 300)
    assert not model_args.use_peft and args.learning_rate == 1e-6  # full fine-tuning at the paper's lr
    assert args.save_steps == 40  # every 20 rounds, as the paper saved


@pytest.mark.parametrize("recipe", ["prompt_aug.yaml", "dapo_single_template.yaml"])
def test_8_gpu_short_run_override_gives_300_paper_rounds(recipe):
    # docs/reproduce.md, "Quick runs": the paper recipe and its single-template ablation for 300 rounds.
    script_args, args, _, _ = _parse(PAPER / recipe, 8, "--max_steps", "1200")
    got = batch_arithmetic(args, script_args)
    assert (got.questions_per_round, got.completions_per_round, got.optimizer_steps_per_round) == (
        128,
        1024,
        4,
    )
    assert got.total_rounds == 300


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only parse failure the dry run avoids")
def test_bf16_recipe_fails_to_parse_on_cpu_without_dry_run_and_dry_run_keeps_bf16():
    with pytest.raises(ValueError, match="bf16"):
        train.parse_args(["--config", str(PAPER / "prompt_aug.yaml")])
    args = _parse(PAPER / "prompt_aug.yaml", 8).training_args
    assert args.bf16 and args.use_vllm  # the recipe's values are untouched
    assert args.use_cpu  # only the dry run adds this


def test_wants_dry_run_forms():
    assert wants_dry_run(["--config", "r.yaml", "--dry_run"])
    assert wants_dry_run(["--dry_run", "--num_processes", "8"])
    assert wants_dry_run(["--dry_run", "true"]) and wants_dry_run(["--dry_run=True"])
    assert not wants_dry_run(["--dry_run", "false"]) and not wants_dry_run(["--dry_run=no"])
    assert not wants_dry_run(["--config", "r.yaml"])
    assert wants_dry_run(["--dry-run"]) and not wants_dry_run(["--dry-run=false"])  # the parser takes dashes


def test_a_dry_run_asked_by_a_dashed_flag_or_by_the_recipe_parses_a_bf16_recipe_on_cpu(tmp_path):
    """Both spellings the parser accepts, and a ``dry_run: true`` key in the recipe, get the CPU parse."""
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only parse failure the dry run avoids")
    paper = ["--config", str(PAPER / "prompt_aug.yaml"), "--num_processes", "8"]
    assert train.parse_args([*paper, "--dry-run"]).training_args.bf16
    recipe = tmp_path / "dry.yaml"
    recipe.write_text((PAPER / "prompt_aug.yaml").read_text() + "\ndry_run: true\nnum_processes: 8\n")
    parsed = train.parse_args(["--config", str(recipe)])
    assert parsed.training_args.bf16 and parsed.training_args.use_cpu
    recipe.write_text((PAPER / "prompt_aug.yaml").read_text() + "\ndry_run: 1\nnum_processes: 8\n")
    assert train.parse_args(["--config", str(recipe)]).training_args.use_cpu  # YAML's 1, true to the parser


def test_a_dry_run_checks_the_batch_keys_as_its_process_count_will_run_them(tmp_path):
    """TRL derives steps_per_generation from generation_batch_size and checks divisibility by its own process
    count, which is 1 in a dry run; ``--num_processes N`` must give what N processes will get."""
    smoke = ["--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"), "--dry_run"]
    keys = ["--per_device_train_batch_size", "2", "--steps_per_generation", "1", "--num_generations", "4"]
    with pytest.raises(
        SystemExit, match=r"num_generations \(4\) must divide the completions per round.* = 2;"
    ):
        train.main([*smoke, *keys, "--num_processes", "1"])  # 2 completions a round: not one group of 4
    args = train.parse_args([*smoke, *keys, "--num_processes", "2"]).training_args  # 4: one group
    assert (args.generation_batch_size, args.steps_per_generation) == (4, 1)
    recipe = tmp_path / "two.yaml"  # the count may come from the recipe file too
    recipe.write_text((REPO / "recipes/smoke/tiny_cpu.yaml").read_text() + "\nnum_processes: 2\n")
    args = train.parse_args(["--config", str(recipe), "--dry_run", *keys]).training_args
    assert args.generation_batch_size == 4
    paper = ["--config", str(PAPER / "prompt_aug.yaml"), "--dry_run", "--num_processes", "8"]
    global_batch = ["--steps_per_generation", "null", "--generation_batch_size", "1024"]
    parsed = train.parse_args([*paper, *global_batch])
    assert parsed.training_args.steps_per_generation == 16  # 1024 / (8 per device x 8 processes)
    assert batch_arithmetic(parsed.training_args, parsed.script_args).completions_per_round == 1024
    assert parsed.training_args.world_size == 1  # the planned count holds only while the recipe parses


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--num_processes", "0"], "num_processes: must be at least 1, got 0"),
        (["--num_processes", "-2"], "num_processes: must be at least 1, got -2"),
        (["--dataset_num_rows", "-10"], "dataset_num_rows: must be at least 1, got -10"),
        (["--num_synthetic", "-5"], "num_synthetic: must be at least 1, got -5"),
        (["--max_prompt_length", "-1"], "max_prompt_length: a token count (0 or null: no limit), got -1"),
        (["--max_bad_row_share", "2"], "max_bad_row_share: a share of the rows read, from 0 to 1"),
    ],
)
def test_a_count_the_batch_arithmetic_reads_below_one_is_refused_not_shown_as_negative_rounds(extra, message):
    smoke = ["--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"), "--dry_run"]
    with pytest.raises(SystemExit) as exit_info:
        train.main([*smoke, *extra])
    assert message in str(exit_info.value.code)


def test_a_real_run_counts_its_own_processes_not_the_recipes_dry_run_count(tmp_path, caplog):
    # num_processes plans a dry run; 128 would make a round of 512 questions, more than the 256 rows.
    out = tmp_path / "run"
    with caplog.at_level("INFO", logger="prompt_aug"):
        status = train.train(["--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"), "--output_dir", str(out),
                              "--max_steps", "1", "--num_processes", "128"])  # fmt: skip
    assert status == 0
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 1
    table = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("batch arithmetic"))
    assert re.search(r"questions per round +4\b", table), table


def test_num_synthetic_with_a_built_in_set_of_fixed_rows_is_refused_naming_the_recipe(tmp_path):
    recipe = tmp_path / "adds.yaml"  # synthetic-addition: 55 questions, whatever num_synthetic says
    recipe.write_text((REPO / "recipes/smoke/learn_cpu.yaml").read_text() + "\nnum_synthetic: 100\n")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", str(recipe), "--dry_run"])
    assert str(exit_info.value.code).endswith(
        f"{recipe}: num_synthetic sizes only the built-in set `synthetic`, and dataset_name is "
        "'synthetic-addition': remove num_synthetic"
    )


def test_the_dry_run_counts_a_built_in_set_without_its_held_out_questions(tmp_path, capsys):
    # learn_cpu.yaml trains synthetic-addition's 55 questions less 10 held out: 45 // 4 = 11 rounds an epoch.
    recipe = tmp_path / "learn.yaml"
    recipe.write_text(
        (REPO / "recipes/smoke/learn_cpu.yaml").read_text().replace("dataset_num_rows: 45\n", "")
    )
    train.main(["--config", str(recipe), "--dry_run"])
    assert re.search(r"rounds per epoch +11\n", capsys.readouterr().out)


def test_unknown_recipe_key_is_an_error_naming_the_key(tmp_path):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text((PAPER / "prompt_aug.yaml").read_text() + "\nlora_rnak: 16\n")
    with pytest.raises(SystemExit, match=r"typo.yaml: unknown key .lora_rnak.; did you mean .lora_r.\?"):
        train.main(["--config", str(recipe), "--dry_run", "--num_processes", "8"])


# ---------------------------------------------------------------------------------------------
# Accelerate configs

ACCELERATE_CONFIGS = sorted((REPO / "accelerate_configs").glob("*.yaml"))
DISTRIBUTED = {
    "single_gpu.yaml": ("NO", 1),
    "ddp.yaml": ("MULTI_GPU", 8),
    "zero2.yaml": ("DEEPSPEED", 8),
    "zero3.yaml": ("DEEPSPEED", 8),
    "fsdp.yaml": ("FSDP", 8),
    "zero2_vllm_server.yaml": ("DEEPSPEED", 7),
}


def test_accelerate_configs_are_all_there():
    assert set(DISTRIBUTED) == {p.name for p in ACCELERATE_CONFIGS}


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=[p.name for p in ACCELERATE_CONFIGS])
def test_accelerate_config_loads_with_the_keys_accelerate_needs(path):
    raw = yaml.safe_load(path.read_text())
    for key in (
        "compute_environment",
        "distributed_type",
        "num_processes",
        "num_machines",
        "machine_rank",
        "mixed_precision",
        "main_training_function",
        "use_cpu",
    ):
        assert key in raw, f"{path.name} lacks {key}"
    distributed, processes = DISTRIBUTED[path.name]
    assert (raw["distributed_type"], raw["num_processes"], raw["mixed_precision"]) == (
        distributed,
        processes,
        "bf16",
    )
    assert raw["compute_environment"] == "LOCAL_MACHINE" and raw["use_cpu"] is False
    # accelerate's own loader accepts it (it rejects unknown keys and bad enum values).
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    assert config.distributed_type.value == distributed and config.num_processes == processes
    if distributed == "DEEPSPEED":
        assert raw["deepspeed_config"]["zero_stage"] == (3 if "zero3" in path.name else 2)
    if distributed == "FSDP":
        assert raw["fsdp_config"]["fsdp_version"] == 2
