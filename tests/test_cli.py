"""A newcomer's command line: short errors that say what to do, and a run folder that is never mixed.

Recipe errors, missing paths and an unreachable Hub are checked without training; the run-folder tests train
the smoke recipe for 2 steps (a few seconds); the console test runs training in a subprocess and stops it
with Ctrl-C (SIGINT), as a user would (about 20 s).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import warnings
from pathlib import Path

import pytest
from launch import train_command

from prompt_aug import faults, train
from prompt_aug.templates import TemplateError, load_templates

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "recipes/smoke/tiny_cpu.yaml"
# A subprocess test waits on the events it needs; this ceiling only stops a hung run from hanging the suite
# (a busy 2-core box makes a run slower, never a failure).
SAFETY_CEILING_S = 15 * 60


def _recipe(tmp_path: Path, old: str = "", new: str = "", extra: str = "") -> Path:
    text = SMOKE.read_text()
    if old:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "recipe.yaml"
    path.write_text(text + extra)
    return path


def _error(argv: list[str], capsys) -> str:
    """The one-line error `prompt-aug-train` exits with; nothing else may be printed (no usage text)."""
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    message = str(exit_info.value.code)
    assert message.startswith("prompt-aug-train: error: ") and "\n" not in message, message
    captured = capsys.readouterr()
    assert "usage:" not in captured.err + captured.out
    return message


# ---------------------------------------------------------------------------------------------
# Recipe errors


def test_misspelled_key_names_the_key_the_file_and_the_closest_key(tmp_path, capsys):
    recipe = _recipe(tmp_path, extra="\ntemplate_wieghts: [1, 2]\n")
    message = _error(["--config", str(recipe), "--output_dir", str(tmp_path / "out")], capsys)
    assert f"{recipe}: unknown key 'template_wieghts'; did you mean 'template_weights'?" in message
    message = _error(["--config", str(SMOKE), "--lerning_rate", "1e-5"], capsys)
    assert "command line: unknown option --lerning_rate; did you mean 'learning_rate'?" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("torch_dtype: bfloat16", "'torch_dtype' is 'dtype' in this transformers and TRL"),
        (
            "wandb_project: mine",
            "W&B reads it from the environment here: export WANDB_PROJECT=... before launching",
        ),
        (
            "wandb_entity: team",
            "W&B reads it from the environment here: export WANDB_ENTITY=... before launching",
        ),
        (
            "dataset_prompt_column: problem",
            "'dataset_prompt_column' is 'question_column' here (open-r1 calls it dataset_prompt_column)",
        ),
        (
            "dataset_train_split: train",
            "'dataset_train_split' is 'dataset_split' here (TRL's scripts call it dataset_train_split)",
        ),
        (
            "max_response_length: 512",
            "'max_response_length' is 'max_completion_length' here (verl calls it max_response_length)",
        ),
        (
            "max_new_tokens: 512",
            "'max_new_tokens' is 'max_completion_length' here (generation calls it max_new_tokens)",
        ),
        ("lora_rank: 16", "'lora_rank' is 'lora_r' here (verl and OpenRLHF call it lora_rank)"),
        ("use_lora: true", "'use_lora' is 'use_peft' here, as in TRL's ModelConfig"),
        (
            "train_batch_size: 8",
            (
                "'train_batch_size' is 'generation_batch_size' here: completions a round; verl's "
                "train_batch_size counts questions (--dry_run shows both)"
            ),
        ),
        ("model: Qwen/Qwen2.5-Math-1.5B", "'model' is 'model_name_or_path' here, as in TRL's ModelConfig"),
        ("dataset: synthetic", "'dataset' is 'dataset_name' here, as in TRL's scripts"),
        ("lr: 1e-6", "'lr' is 'learning_rate' here"),
        ("kl_coef: 0.001", "'kl_coef' is 'beta' here: the KL penalty's coefficient"),
        ("epochs: 2", "'epochs' is 'num_train_epochs' here"),
        (
            "rollout_n: 8",
            "'rollout_n' is 'num_generations' here: completions per question (verl's rollout.n)",
        ),
    ],
)
def test_a_key_renamed_since_open_r1_or_older_recipes_gives_its_new_name(tmp_path, capsys, line, says):
    recipe = _recipe(tmp_path, extra=f"\n{line}\n")
    key = line.split(":")[0]
    message = _error(["--config", str(recipe), "--dry_run"], capsys)
    assert message.endswith(f"error: {recipe}: unknown key {key!r}; {says}"), message
    message = _error(["--config", str(SMOKE), "--dry_run", f"--{key}", line.split(": ")[1]], capsys)
    assert message.endswith(f"error: command line: unknown option --{key}; {says}"), message


def test_each_rename_leads_from_a_key_no_recipe_has_to_one_it_has():
    from prompt_aug.cli import RENAMED_KEYS

    known = train.make_parser().option_names()
    assert sorted(old for old in RENAMED_KEYS if old in known) == []
    assert sorted(new for new, _ in RENAMED_KEYS.values() if new not in known) == []


def test_no_recipe_or_a_stray_word_says_what_to_give(capsys):
    message = _error([], capsys)
    assert (
        message
        == "prompt-aug-train: error: no recipe: give one with --config RECIPE.yaml (recipes/ has examples)"
    )
    message = _error(["--config", str(SMOKE), "extra_positional"], capsys)
    assert message == (
        "prompt-aug-train: error: command line: 'extra_positional' belongs to no option; give keys as "
        "--key value"
    )


def test_help_starts_with_the_recipe_flag(capsys):
    with pytest.raises(SystemExit) as done:
        train.main(["--help"])
    assert done.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("usage: ") and lines[0].endswith(" --config RECIPE.yaml [--key value ...]")
    assert "Train with a recipe: --config RECIPE.yaml (recipes/ has examples)." in " ".join(lines[:6])


def test_a_value_of_the_wrong_type_names_key_value_and_file(tmp_path, capsys):
    recipe = _recipe(tmp_path, "num_generations: 4", 'num_generations: "eight"')
    message = _error(["--config", str(recipe)], capsys)
    assert f"{recipe}: num_generations: invalid int value: 'eight'" in message
    message = _error(["--config", str(SMOKE), "--num_generations", "eight"], capsys)
    assert "command line: num_generations: invalid int value: 'eight'" in message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("template_weights: [heavy]", "template_weights: item 'heavy' is not a float"),
        ("templates: [{name: abel}]", "templates: item {'name': 'abel'} is not a str"),
        ("debug: foo", "debug: item 'foo' is not a DebugOption"),
    ],
)
def test_a_wrong_list_item_names_key_and_file(tmp_path, capsys, line, expected):
    recipe = _recipe(tmp_path, extra=f"\n{line}\n")
    assert f"{recipe}: {expected}" in _error(["--config", str(recipe), "--dry_run"], capsys)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("num_generations: 4", "num_generations: [4, 8]", "num_generations: one value, got a list [4, 8]"),
        (
            "num_generations: 4",
            "num_generations: {per_question: 4}",
            "num_generations: one value, got a mapping",
        ),
        ("dataset_name: synthetic", "dataset_name: [synthetic, x]", "dataset_name: one value, got a list"),
        ("log_completions: true", "log_completions: [true]", "log_completions: one value, got a list"),
        ("num_generations: 4", "num_generations: 4.5", "num_generations: 4.5 is not an int"),
        ("max_steps: 4", "max_steps: true", "max_steps: True is not an int"),
        ("learning_rate: 1.0e-4", "learning_rate: false", "learning_rate: False is not a float"),
        ("learning_rate: 1.0e-4", "learning_rate:", "learning_rate: no value; give one, or remove the line"),
        (
            "per_device_train_batch_size: 8",
            "per_device_train_batch_size:",
            "per_device_train_batch_size: no value",
        ),
    ],
)
def test_a_scalar_key_given_a_list_a_mapping_or_no_value_names_key_and_file(
    tmp_path, capsys, old, new, expected
):
    # YAML hands these over unconverted (argparse converts text only): a traceback, or silently taken.
    recipe = _recipe(tmp_path, old, new)
    assert f"{recipe}: {expected}" in _error(["--config", str(recipe), "--dry_run"], capsys)


def test_a_whole_number_written_with_a_point_is_an_int(tmp_path):
    from prompt_aug.train import parse_args

    recipe = _recipe(tmp_path, "per_device_train_batch_size: 8", "per_device_train_batch_size: 8.0")
    args = parse_args(["--config", str(recipe), "--dry_run"]).training_args
    assert args.per_device_train_batch_size == 8 and type(args.per_device_train_batch_size) is int


def test_a_key_given_twice_in_a_recipe_warns_naming_both_lines(tmp_path):
    from prompt_aug.train import parse_args

    recipe = _recipe(tmp_path, extra="\nnum_generations: 8\n")  # YAML keeps the last one, silently
    text = recipe.read_text().splitlines()
    first, last = [i for i, line in enumerate(text, 1) if line.startswith("num_generations:")]
    expected = f"{recipe}: num_generations is set twice (lines {first} and {last}); the later one counts"
    with pytest.warns(UserWarning, match=re.escape(expected)):
        args = parse_args(["--config", str(recipe), "--dry_run"]).training_args
    assert args.num_generations == 8
    # A key a `<<:` merge brings into a mapping is no key given twice, though YAML folds it into the mapping
    # (here the anchored one, used again after).
    from prompt_aug.cli import _read_config

    merged = tmp_path / "merged.yaml"
    merged.write_text("x: {<<: &a {k: 1, <<: {k: 2}}}\ny: *a\nz: {<<: *a, k: 3}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _read_config(str(merged)) == {"x": {"k": 2}, "y": {"k": 1}, "z": {"k": 3}}


def test_a_value_from_the_command_line_is_blamed_on_the_command_line(tmp_path, capsys):
    message = _error(["--config", str(SMOKE), "--dry_run", "--trim_padding", "nonsense"], capsys)
    assert "error: command line: trim_padding: 'nonsense' is not one of" in message
    # The file sets num_generations too (4); then one that does not divide the file's batch keys.
    message = _error(["--config", str(SMOKE), "--dry_run", "--num_generations", "0"], capsys)
    assert f"error: command line --num_generations, overriding {SMOKE}: num_generations: must be" in message
    message = _error(["--config", str(SMOKE), "--dry_run", "--num_generations", "3"], capsys)
    assert f"error: {SMOKE} and command line --num_generations: num_generations (3) must divide" in message
    # A mixture source's own key is the file's, though the command line sets the top-level key of its name.
    mixture = "dataset_mixture: {datasets: [{path: a.jsonl, question_column: 3}]}"
    recipe = _recipe(tmp_path, "dataset_name: synthetic", mixture)
    message = _error(["--config", str(recipe), "--dry_run", "--question_column", "problem"], capsys)
    assert f"error: {recipe}: dataset_mixture.datasets[0].question_column: text, got 3" in message


def test_null_on_the_command_line_unsets_a_recipe_key_that_may_be_unset(tmp_path):
    from prompt_aug.train import parse_args

    recipe = _recipe(tmp_path, extra="\nquestion_column: problem\ndataset_levels: [Level 3]\n")
    for word in ("null", "NULL", "~", "None"):  # YAML's nulls and Python's, any case
        script_args, _, _, _ = parse_args(["--config", str(recipe), "--question_column", word])
        assert script_args.question_column is None, word
    script_args, args, _, _ = parse_args(
        ["--config", str(recipe), "--question_column=null", "--dataset_levels", "null", "--bf16", "null"]
    )
    assert script_args.question_column is None and script_args.dataset_levels is None
    assert args.bf16 is True  # unset: TRL's default
    # The last word for a key wins, as for any other value.
    script_args, _, _, _ = parse_args(
        ["--config", str(recipe), "--question_column", "null", "--question_column", "q"]
    )
    assert script_args.question_column == "q"
    # Only the command line's words: a recipe's quoted "null" is the text null.
    quoted = _recipe(tmp_path, extra='\nquestion_column: "null"\n')
    assert parse_args(["--config", str(quoted)])[0].question_column == "null"
    # A key that takes none as a value of its own keeps it.
    _, args, _, _ = parse_args(["--config", str(recipe), "--report_to", "none", "--scale_rewards", "none"])
    assert args.report_to == [] and args.scale_rewards == "none"


def test_a_recipe_that_names_its_dataset_switches_to_a_mixture_on_the_command_line(capsys):
    mixture = json.dumps({"datasets": [{"path": "a.jsonl"}, {"path": "b.jsonl"}]})
    message = _error(["--config", str(SMOKE), "--dry_run", "--dataset_mixture", mixture], capsys)
    assert message.endswith(
        "dataset_mixture and dataset_name are both set: a mixture names its sources itself (path, name, "
        "split per source); remove dataset_name (on the command line: --dataset_name null)"
    )
    train.main(["--config", str(SMOKE), "--dry_run", "--dataset_name", "null", "--dataset_mixture", mixture])
    assert "questions per round             4" in capsys.readouterr().out


def test_null_for_a_key_that_always_takes_a_value_is_one_line_naming_it(capsys):
    message = _error(["--config", str(SMOKE), "--dry_run", "--dataset_split", "null"], capsys)
    assert message == (
        "prompt-aug-train: error: command line: dataset_split: null would unset it, but dataset_split always "
        "takes a value (here 'train'); give one, or leave --dataset_split out"
    )
    message = _error(["--config", str(SMOKE), "--dry_run", "--max_steps", "~"], capsys)
    assert message == (
        "prompt-aug-train: error: command line: max_steps: ~ would unset it, but max_steps always takes a "
        "value (here 4); give one, or leave --max_steps out"
    )
    # report_to takes none for no integration; null would name an integration None.
    message = _error(["--config", str(SMOKE), "--dry_run", "--report_to", "null"], capsys)
    assert message.startswith("prompt-aug-train: error: command line: report_to: null would unset it, but ")
    assert message.endswith("give one, or leave --report_to out")


def test_the_config_flag_takes_its_path_either_way_and_once(tmp_path, capsys):
    from prompt_aug.cli import recipe_text

    train.main([f"--config={SMOKE}", "--dry_run"])
    assert "questions per round             4" in capsys.readouterr().out
    assert SMOKE.read_text() in recipe_text([f"--config={SMOKE}", "--max_steps", "2"])  # the model card's
    message = _error(["--dry_run", "--config"], capsys)
    assert "--config: give the recipe's path, as --config RECIPE.yaml" in message
    other = REPO / "recipes/smoke/learn_cpu.yaml"
    message = _error(["--config", str(SMOKE), "--dry_run", "--config", str(other)], capsys)
    assert f"--config is given twice ({SMOKE}, {other}); give one recipe" in message
    message = _error(["--config", str(tmp_path), "--dry_run"], capsys)
    assert f"--config: {tmp_path} is a folder; give the recipe file in it" in message


def test_list_keys_in_a_recipe_are_read_as_on_the_command_line(tmp_path):
    from prompt_aug.train import parse_args

    # One value is a list of one (it was read letter by letter); items convert (levels match str(level)).
    recipe = _recipe(
        tmp_path,
        "reward_funcs: [correctness, format]",
        "reward_funcs: format",
        extra='\nstop_tokens: "<|im_end|>"\ntemplate_weights: 1\ntemplates: abel\ndataset_levels: [3, 4]\n',
    )
    script_args, args, _, _ = parse_args(["--config", str(recipe)])
    assert script_args.reward_funcs == ["format"] and args.stop_tokens == ["<|im_end|>"]
    assert args.templates == ["abel"] and args.template_weights == [1.0]
    assert script_args.dataset_levels == ["3", "4"]


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (
            "temperature: 1.0",
            "temperature: 0",
            (
                "temperature: must be above 0 (GRPO samples its completions; 1.0 samples as the model does), "
                "got 0"
            ),
        ),
        ("learning_rate: 1.0e-4", "learning_rate: -1.0e-5", "learning_rate: must be at least 0, got -1e-05"),
        ("", "adam_beta1: 1.5", "adam_beta1: must be at least 0 and below 1, got 1.5"),
        ("", "num_iterations: 0", "num_iterations: must be at least 1, got 0"),
        (
            "max_steps: 4",
            "max_steps: -1\nnum_train_epochs: 0",
            (
                "num_train_epochs: 0 with max_steps -1 trains no optimizer step; set num_train_epochs above "
                "0, or max_steps to the steps to train"
            ),
        ),
        (
            "reward_funcs: [correctness, format]",
            "reward_funcs: []",
            (
                "reward_funcs: none given; name at least one, e.g. [correctness, format], or a function as "
                "package.module:function"
            ),
        ),
        (
            "",
            "dtype: float33",
            "dtype: invalid choice: 'float33' (choose from 'auto', 'bfloat16', 'float16', 'float32')",
        ),
        (
            "",
            "logging_strategy: no",
            (
                "logging_strategy: invalid choice: False (choose from 'no', 'steps', 'epoch'); YAML reads an "
                "unquoted no, yes, on or off as a boolean: quote it"
            ),
        ),
        (
            "report_to: none",
            "report_to: wandbb",
            "report_to: 'wandbb' is not one of azure_ml, comet_ml, mlflow,",
        ),
    ],
)
def test_a_value_training_refused_only_once_started_is_one_line_naming_the_file(
    tmp_path, capsys, old, new, says
):
    """Each of these once failed with a traceback after the model had loaded, or trained nothing and exited 0;
    with --overwrite_output_dir true the earlier run was deleted first."""
    from fault_harness import tiny_checkpoint

    recipe = _recipe(tmp_path, old, new) if old else _recipe(tmp_path, extra=f"\n{new}\n")
    run = tmp_path / "run"
    tiny_checkpoint(run / "checkpoint-2", 2)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    argv = ["--config", str(recipe), "--output_dir", str(run), "--overwrite_output_dir", "true"]
    message = _error(argv, capsys)
    assert message.startswith(f"prompt-aug-train: error: {recipe}: {says}"), message
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_recipe_without_a_model_is_refused_before_the_data_is_read(tmp_path, capsys):
    recipe = _recipe(tmp_path, "model_name_or_path: tiny-random-qwen2\n", "")
    expected = (
        f"prompt-aug-train: error: {recipe}: model_name_or_path is not set: give a Hub id, a local model "
        "folder, or a built-in model (tiny-random-qwen2, small-random-qwen2)"
    )
    absent = tmp_path / "no-such-data"  # reading it would fail: the model is refused first
    argv = ["--config", str(recipe), "--output_dir", str(tmp_path / "out"), "--dataset_name", str(absent)]
    assert _error(argv, capsys) == expected
    assert _error([*argv, "--dry_run"], capsys) == expected  # the launch would refuse it: so does the dry run
    assert not (tmp_path / "out").exists()


def test_an_output_dir_that_is_a_file_is_refused_and_the_file_kept(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    message = _error(["--config", str(SMOKE), "--output_dir", str(notes)], capsys)
    assert message == (
        f"prompt-aug-train: error: output_dir {notes} is a file, not a folder; choose another --output_dir"
    )
    message = _error(["--config", str(SMOKE), "--output_dir", str(notes / "run")], capsys)
    assert message == (
        f"prompt-aug-train: error: output_dir {notes / 'run'} lies under {notes}, a file, not a folder; "
        "choose another --output_dir"
    )
    assert notes.read_text() == "mine"


def test_the_run_logs_the_recipe_keys_its_command_line_overrides(tmp_path, capsys, caplog):
    argv = ["--config", str(SMOKE), "--output_dir", str(tmp_path / "out"), "--learning_rate=2e-5"]
    absent = str(tmp_path / "no-such-data")  # stops the run once it has started
    with caplog.at_level("INFO", logger="prompt_aug"):
        _error([*argv, "--max-steps", "3", "--dataset_name", absent, "--max_steps", "2"], capsys)
    lines = [r.getMessage() for r in caplog.records if "command line" in r.getMessage()]
    assert lines == [
        "keys set on the command line, over the recipe's: output_dir, learning_rate, max_steps, dataset_name"
    ]


def test_groups_that_do_not_fill_the_batch_name_the_keys_to_change(tmp_path, capsys):
    recipe = _recipe(tmp_path, "num_generations: 4", "num_generations: 3")
    message = _error(["--config", str(recipe)], capsys)
    assert str(recipe) in message and "num_generations (3)" in message and "= 16" in message
    for key in ("per_device_train_batch_size", "steps_per_generation"):
        assert key in message
    assert "generation_batch_size" not in message.split("=")[0]  # a key this recipe never set is not blamed


def test_data_that_fills_no_round_stops_before_the_model_loads(tmp_path, capsys):
    # The smoke recipe's round asks 16 / 4 = 4 questions; the sampler keeps whole rounds, so 3 train nothing.
    questions = tmp_path / "few.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    questions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    message = _error(
        ["--config", str(SMOKE), "--dataset_name", str(questions), "--output_dir", str(out)], capsys
    )
    assert f"dataset {questions}: 3 rows read, 3 kept: fewer questions than one round's 4" in message
    assert not list(out.glob("*.safetensors"))  # nothing trained, nothing saved
    # Five questions fill a round, but not once the learning demo holds two of them out.
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]
    questions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["--config", str(SMOKE), "--dataset_name", str(questions), "--output_dir", str(out)]
    message = _error([*argv, "--heldout_questions", "2", "--overwrite_output_dir", "true"], capsys)
    assert "5 rows read, 5 kept; heldout_questions holds 2 out: fewer questions than one round's 4" in message
    assert "lower heldout_questions" in message and not list(out.glob("*.safetensors"))
    # Each question twice: two held out take four rows, and the two left fill no round either.
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)] * 2
    questions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    message = _error([*argv, "--heldout_questions", "2", "--overwrite_output_dir", "true"], capsys)
    assert "heldout_questions=2 leaves 2 rows to train on" in message and "round's 4" in message, message
    assert not list(out.glob("*.safetensors"))


def test_lora_target_modules_the_model_lacks_are_one_line_naming_its_layers(tmp_path, capsys):
    argv = ["--config", str(SMOKE), "--output_dir", str(tmp_path / "out"), "--use_peft", "true",
            "--lora_target_modules", "qproj"]  # fmt: skip
    message = _error(argv, capsys)
    assert (
        "lora_target_modules" in message
        and "qproj" in message
        and "no module of the model matches" in message
    )
    assert "'q_proj'" in message and "all-linear" in message


def test_a_lora_run_resumed_on_another_base_model_stops_before_it_trains(tmp_path, capsys):
    from prompt_aug.demo.smoke import build_tiny_model

    out = tmp_path / "out"
    run = ["--config", str(SMOKE), "--output_dir", str(out), "--use_peft", "true", "--save_steps", "2"]
    train.main([*run, "--max_steps", "2"])
    other = build_tiny_model(tmp_path / "other", seed=1)  # the same shapes, other weights
    resumed = [*run, "--max_steps", "4", "--resume_from_checkpoint", "true"]
    resumed += ["--model_name_or_path", str(other)]
    message = _error(resumed, capsys)
    assert f"{out / 'checkpoint-2'}'s adapter was trained on {out / 'tiny-random-qwen2'}" in message
    assert f"not on model_name_or_path {other}; resume with the model the run was started with" in message
    assert not (out / "checkpoint-4").exists()


def test_lora_without_target_modules_on_a_model_type_peft_has_no_defaults_for_is_one_line(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, Olmo2Config

    from prompt_aug.sources import builtin_tokenizer

    tokenizer = builtin_tokenizer()
    config = Olmo2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    model_dir = tmp_path / "tiny-olmo2"
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    argv = ["--config", str(SMOKE), "--output_dir", str(tmp_path / "out"), "--use_peft", "true",
            "--model_name_or_path", str(model_dir)]  # fmt: skip
    message = _error(argv, capsys)
    assert "lora_target_modules: not set, and PEFT has no default modules for model type 'olmo2'" in message
    assert "all-linear" in message and "'q_proj'" in message
    # Another error that mentions target_modules, or one without LoRA, is not taken for it.
    from trl import ModelConfig

    from prompt_aug.train import _lora_target_error

    other = ValueError("`target_modules` and `lm_head`: cast_lm_head_to_fp32 needs ...")
    assert _lora_target_error(other, None, ModelConfig(use_peft=True)) is None
    peft_words = ValueError("Please specify `target_modules` in `peft_config`")
    assert _lora_target_error(peft_words, None, ModelConfig(use_peft=False)) is None


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (
            ["--templates", "abel", "no-such"],
            "templates: unknown template(s) ['no-such']; the bank has ['abel'",
        ),
        (["--reward_funcs", "correctnes"], "unknown reward_funcs ['correctnes']; registered: ['correctness'"),
        (
            ["--reward_funcs", "no_such_module:f"],
            (
                "reward_funcs: cannot load 'no_such_module:f' (No module named 'no_such_module'; looked for "
                f"no_such_module.py or no_such_module/ in {os.getcwd()} (the launch folder) and on sys.path)"
            ),
        ),
        (  # the module loads, the function is misspelt: what the module has instead
            ["--reward_funcs", "rewards.registry:format_rewrd"],
            "reward_funcs: 'rewards.registry:format_rewrd': ",
        ),
    ],
)
def test_a_bad_template_or_reward_name_is_one_line_before_anything_loads(tmp_path, capsys, option, expected):
    message = _error(["--config", str(SMOKE), "--output_dir", str(tmp_path / "o"), *option], capsys)
    assert expected in message
    if "format_rewrd" in expected:
        assert "registry.py has no 'format_rewrd'; its functions are [" in message
        assert "'format_reward'" in message and "package.module" not in message
    assert not (tmp_path / "o").exists()


def test_a_dataset_without_the_named_column_is_one_line_listing_the_columns(tmp_path, capsys):
    import pandas as pd

    data = tmp_path / "data"
    data.mkdir()
    pd.DataFrame({"problem": ["What is $1+1$?"], "answer": ["2"]}).to_parquet(data / "train.parquet")
    argv = ["--config", str(SMOKE), "--output_dir", str(tmp_path / "o"), "--dataset_name", str(data)]
    message = _error([*argv, "--question_column", "question_text"], capsys)
    assert f"dataset_name {data}: " in message and "question_text" in message and "'problem'" in message


def test_invalid_recipe_and_templates_yaml_name_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: x\n  user: {question}\n   system: [\n")
    message = _error(["--config", str(bad)], capsys)
    assert f"{bad}: not valid YAML" in message and f'in "{bad}", line' in message
    with pytest.raises(TemplateError, match=f"{bad}: not valid YAML.*line 3"):
        load_templates(bad)


# ---------------------------------------------------------------------------------------------
# Paths and the Hub


@pytest.mark.parametrize("path", ["/no/such/model", "./no-such-model", "../no-such/model", "outputs-x/a/b"])
def test_a_missing_local_model_fails_at_once_with_no_such_folder(tmp_path, capsys, path):
    message = _error(
        ["--config", str(SMOKE), "--output_dir", str(tmp_path / "o"), "--model_name_or_path", path], capsys
    )
    assert f"model_name_or_path: no such folder '{path}'" in message


def test_a_local_model_folder_with_no_model_in_it_fails_at_once(tmp_path, capsys):
    (tmp_path / "outputs").mkdir()  # the runs' parent folder, say, not a run
    message = _error(
        ["--config", str(SMOKE), "--output_dir", str(tmp_path / "o"), "--model_name_or_path",
         str(tmp_path / "outputs")], capsys,
    )  # fmt: skip
    assert (
        f"model_name_or_path {tmp_path / 'outputs'}: a folder with no config.json or adapter_config"
        in message
    )


@pytest.mark.parametrize("key", ["dataset_name", "eval_data_dir"])
def test_a_missing_local_dataset_fails_at_once_naming_the_key(tmp_path, capsys, key):
    message = _error(
        ["--config", str(SMOKE), "--output_dir", str(tmp_path / "o"), f"--{key}", "./nodata"], capsys
    )
    assert f"{key}: no such folder './nodata'" in message


@pytest.mark.parametrize(
    "name, expected",
    [
        ("{tmp}/missing.jsonl", "question set {tmp}/missing.jsonl: no such file"),
        (
            "someone/missing-questions",
            "question set someone/missing-questions: could not load it from the Hugging Face Hub (",
        ),
        # a set whose question column has another name: the recipe key to set, not the command's flag
        ("{tmp}/odd.jsonl", "question set {tmp}/odd.jsonl: none of the columns"),
    ],
)
def test_an_evaluation_set_that_cannot_load_fails_before_the_model_is_built(tmp_path, capsys, name, expected):
    # Offline (HF_HUB_OFFLINE=1, tests/conftest.py), the Hub set fails at once: before the model is built,
    # not at the first evaluation, after training has run that long.
    name, expected = name.format(tmp=tmp_path), expected.format(tmp=tmp_path)
    (tmp_path / "odd.jsonl").write_text('{"statement": "Compute $1 + 1$.", "answer": "2"}\n')
    out = tmp_path / "o"
    message = _error(
        [
            "--config",
            str(SMOKE),
            "--output_dir",
            str(out),
            "--eval_benchmarks",
            name,
            "--eval_every_steps",
            "1",
        ],
        capsys,
    )
    assert message.startswith("prompt-aug-train: error: " + expected), message
    assert "--question_column" not in message and ("odd" not in name or "eval_question_column" in message)
    assert not (out / "tiny-random-qwen2").exists()


@pytest.mark.parametrize("key", ["model_name_or_path", "dataset_name"])
def test_an_unreachable_hub_fails_fast_and_suggests_offline_mode(
    tmp_path, capsys, unreachable_hub, monkeypatch, key
):
    from huggingface_hub import constants

    # A Hub endpoint that hangs up on every connection, counting them: the Hub clients, asked, would try
    # again and again (a minute of retries); the check tries once.
    listener = socket.create_server(("127.0.0.1", 0))
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    connections = []

    def hang_up() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener closed: the test is over
                return
            connections.append(conn)
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        message = _error(
            ["--config", str(SMOKE), "--output_dir", str(tmp_path / "o"), f"--{key}", "someone/missing"],
            capsys,
        )
    finally:
        listener.close()
    assert f"{key}: cannot reach the Hugging Face Hub ({endpoint})" in message
    assert "HF_HUB_OFFLINE=1" in message and "local folder" in message
    assert len(connections) == 1  # one probe, no client's retries
    assert not (tmp_path / "o").exists()


def test_a_misspelt_local_file_is_named_not_blamed_on_the_hub(tmp_path, capsys, unreachable_hub, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text('{"question": "What is 1 + 1?", "answer": "2"}\n')
    argv = ["--config", str(SMOKE), "--output_dir", str(tmp_path / "o"), "--dataset_name"]
    message = _error([*argv, "mine.jsonnl"], capsys)
    assert message.endswith(
        f"error: dataset_name: no file or folder 'mine.jsonnl' in {tmp_path}; did you mean 'mine.jsonl'?"
    )
    message = _error([*argv, "questions.arrow"], capsys)
    assert message.endswith(
        f"error: dataset_name: no file or folder 'questions.arrow' in {tmp_path}; fix the name, or give a "
        "Hub id (owner/name)"
    )
    message = _error([*argv, "./mine.json"], capsys)
    assert message.endswith(
        f"error: dataset_name: no such file './mine.json' (resolved to {tmp_path / 'mine.json'}); did you "
        "mean './mine.jsonl'?"
    )


def test_a_chat_template_file_that_is_missing_is_named_before_the_model_is_built(tmp_path, capsys):
    out = tmp_path / "o"
    message = _error(
        [
            "--config",
            str(SMOKE),
            "--output_dir",
            str(out),
            "--chat_template",
            str(tmp_path / "missing.jinja"),
        ],
        capsys,
    )
    assert message.endswith(
        f"error: command line: chat_template: no such file '{tmp_path / 'missing.jinja'}' (resolved to "
        f"{tmp_path / 'missing.jinja'}); give the path of a .jinja file, a named template (chatml) or the "
        "Jinja text"
    )
    assert not (out / "tiny-random-qwen2").exists()


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("smollm2-135m-instruc", "smollm2-135m-instruct"),
        ("SmolLM2-135M-Instruct", "smollm2-135m-instruct"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m-instruct"),  # offline, not in the cache
        ("tiny-random-qwen", "tiny-random-qwen2"),
    ],
)
def test_a_misspelt_model_name_names_the_model_meant(tmp_path, capsys, given, meant):
    argv = ["--config", str(SMOKE), "--output_dir", str(tmp_path / "out"), "--model_name_or_path", given]
    message = _error(argv, capsys)
    assert f"model_name_or_path {given!r}: no model of that name here; did you mean {meant!r}?" in message


@pytest.mark.parametrize("name", ["synthetic", "synthetic-addition", "synthetic-digit-sums"])
def test_built_in_datasets_are_generated_not_fetched(tmp_path, capsys, unreachable_hub, name):
    run = tmp_path / "o"
    (run / "checkpoint-1").mkdir(parents=True)  # stops the run at the output-folder check, after the sources
    message = _error(["--config", str(SMOKE), "--output_dir", str(run), "--dataset_name", name], capsys)
    assert "already holds a run" in message  # not "dataset_name: cannot reach the Hugging Face Hub"


# ---------------------------------------------------------------------------------------------
# The run folder


def test_a_run_that_failed_before_its_first_round_leaves_a_folder_that_takes_a_new_run(tmp_path):
    from prompt_aug.cli import UsageError, check_output_dir

    # TRL makes completions/ when the trainer is built; a run that failed before it logged left it empty.
    (tmp_path / "completions").mkdir()
    assert check_output_dir(tmp_path, resume=False, overwrite=False) == []
    (tmp_path / "completions" / "completions_00001.parquet").write_bytes(b"rows")
    with pytest.raises(UsageError, match=r"already holds a run \(completions\)"):
        check_output_dir(tmp_path, resume=False, overwrite=False)


def test_an_overwrite_deletes_the_earlier_runs_card_but_not_a_readme_of_the_users_own(tmp_path, caplog):
    from prompt_aug.cli import check_output_dir

    (tmp_path / "logs.jsonl").write_text("{}\n")
    (tmp_path / "README.md").write_text("---\ntags:\n- generated_from_trainer\n---\n# an earlier run\n")
    assert tmp_path / "README.md" in check_output_dir(tmp_path, resume=False, overwrite=True)
    (tmp_path / "README.md").write_text("# My notes on this run\n")
    with caplog.at_level("WARNING", logger="prompt_aug"):
        assert check_output_dir(tmp_path, resume=False, overwrite=True) == [tmp_path / "logs.jsonl"]
    assert (
        f"{tmp_path / 'README.md'} is not a model card (the user's own?): training moves it to _README.md"
        in (caplog.text)
    )


def _train(out: Path, *extra: str) -> None:
    train.main(["--config", str(SMOKE), "--output_dir", str(out), *extra])


def test_a_warm_start_into_a_folder_that_holds_a_run_is_refused_unless_it_is_replaced(tmp_path):
    from prompt_aug.cli import UsageError, check_output_dir

    # Only a checkpoint inside the folder continues its run; one from elsewhere would mix two runs there,
    # and save_total_limit would delete the other run's checkpoints.
    (tmp_path / "logs.jsonl").write_text("{}\n")
    other = str(tmp_path.parent / "other" / "checkpoint-100")
    with pytest.raises(
        UsageError,
        match=r"already holds a run \(logs.jsonl\), and resume_from_checkpoint .*checkpoint-100 "
        r"lies outside it; to start from that checkpoint here, add --overwrite_output_dir true",
    ):
        check_output_dir(tmp_path, resume=False, overwrite=False, warm_start=other)
    assert check_output_dir(tmp_path, resume=False, overwrite=True, warm_start=other) == [
        tmp_path / "logs.jsonl"
    ]
    assert check_output_dir(tmp_path / "new", resume=False, overwrite=False, warm_start=other) == []


def test_the_resume_command_after_an_interruption_drops_a_bare_overwrite_flag_alone(tmp_path):
    from fault_harness import tiny_checkpoint

    from prompt_aug.cli import interrupted_message

    run = tmp_path / "run"
    argv = ["--config", str(SMOKE), "--output_dir", str(run)]
    # A bare --overwrite_output_dir (a boolean) does not take the next flag with it.
    message = interrupted_message(str(run), 3, 10, [*argv, "--overwrite_output_dir", "--max_steps", "10"])
    assert "No checkpoint was saved" in message
    tiny_checkpoint(run / "checkpoint-2", 2)
    for dropped in (
        ["--overwrite_output_dir"],
        ["--overwrite_output_dir", "true"],
        ["--overwrite-output-dir=1"],
    ):
        message = interrupted_message(str(run), 3, 10, [*argv, *dropped, "--max_steps", "10"])
        assert message.endswith(f"--output_dir {run} --max_steps 10 --resume_from_checkpoint true"), message


def test_a_hub_token_in_the_recipe_or_on_the_command_line_is_hidden_in_the_card_and_the_resume_hint(
    tmp_path,
):
    """The model card (`recipe_text`) is published and the resume hint printed: a token's value shows as
    ``***`` in each form a recipe or a command line gives it; every other key stays as given."""
    from fault_harness import tiny_checkpoint

    from prompt_aug.cli import interrupted_message, recipe_text

    # YAML's other ways of writing a value: a folded block, a value on the next line, a tag.
    for extra in (
        "hub_token: >-\n  hf_BLOCK_123\n",
        "hub_token:\n  hf_NEXT_LINE_1\n",
        "hub_token: !!str hf_TAGGED_1\n",
    ):
        assert "hf_" not in recipe_text(["--config", str(_recipe(tmp_path, extra=extra))])
    recipe = _recipe(tmp_path, extra="hub_token: hf_FILE  # mine\nenv: {HF_TOKEN: 'hf_ENV', A: 1}\n")
    run = tmp_path / "run"
    argv = ["--config", str(recipe), "--output_dir", str(run), "--hub_token", "hf_CLI", "--hub-token=hf_EQ",
            "--hub-token", "hf_DASH", "--max_steps", "10"]  # fmt: skip
    card = recipe_text(argv)
    assert "hf_" not in card and "hub_token: ***  # mine\nenv: {HF_TOKEN: ***, A: 1}" in card
    assert "--hub_token *** --hub-token=*** --hub-token *** --max_steps 10" in card
    assert SMOKE.read_text() in card  # the rest of the recipe as it was
    tiny_checkpoint(run / "checkpoint-2", 2)
    message = interrupted_message(str(run), 3, 10, argv)
    assert (
        "hf_" not in message and "--hub_token *** --hub-token=*** --hub-token *** --max_steps 10" in message
    )
    assert message.endswith("(*** stands for the token given: put it back, or set HF_TOKEN instead.)")


def test_a_token_under_a_bare_token_key_is_hidden_in_the_card_and_the_resume_hint(tmp_path):
    """A gated base model's token reaches the loader as ``model_init_kwargs: {token: ...}`` (a recipe's YAML,
    or JSON on the command line): hidden whatever its shape, not only a ``hf_...`` one; other keys stay."""
    from fault_harness import tiny_checkpoint

    from prompt_aug.cli import interrupted_message, recipe_text

    for extra in (
        "model_init_kwargs:\n  token: oauth-SECRET-in-a-block\n  revision: main\n",
        "model_init_kwargs: {token: oauth-SECRET-in-a-flow, revision: main}\n",
        "model_init_kwargs: {'Token': 'oauth-SECRET-quoted', revision: main}\n",
    ):
        card = recipe_text(["--config", str(_recipe(tmp_path, extra=extra))])
        assert "SECRET" not in card and "revision: main" in card, card
    run = tmp_path / "run"
    kwargs = '{"token": "oauth-SECRET-on-the-command-line", "revision": "main"}'
    argv = [
        "--config",
        str(SMOKE),
        "--output_dir",
        str(run),
        "--max_steps",
        "10",
        "--model_init_kwargs",
        kwargs,
    ]
    card = recipe_text(argv)
    assert "SECRET" not in card and '"revision": "main"}' in card, card
    tiny_checkpoint(run / "checkpoint-2", 2)
    message = interrupted_message(str(run), 3, 10, argv)
    assert "SECRET" not in message and '"revision": "main"}' in message, message
    assert message.endswith("(*** stands for the token given: put it back, or set HF_TOKEN instead.)")
    # A token key that names no token (true: the stored login's) keeps its value, so the command still runs.
    flag = ["--model_init_kwargs", '{"token": true}']
    assert '{"token": true}' in interrupted_message(str(run), 3, 10, [*argv[:6], *flag])


def test_a_resumed_launchs_recipe_keeps_the_earlier_launches_overrides_that_trained_its_steps(tmp_path):
    """The card's recipe of a resumed launch: the overrides of the launches before it, as the run's card
    records them, less a launch that resumed at the checkpoint's step or later (its steps were dropped), then
    its own with the step; without a card there, it says that the earlier ones are not known."""
    from prompt_aug.cli import recipe_text

    run = tmp_path / "run"
    argv = ["--config", str(SMOKE), "--output_dir", str(run), "--resume_from_checkpoint", "true"]
    text = recipe_text(argv, str(run / "checkpoint-200"))
    assert text.endswith(
        f"\n# command-line overrides before step 200: not known (no model card in {run})\n"
        f"# command-line overrides, resumed at step 200: --output_dir {run} --resume_from_checkpoint true\n"
    )
    run.mkdir()
    (run / "README.md").write_text(
        "---\ntags:\n- generated_from_trainer\n---\n\n## Recipe\n\n```yaml\nseed: 1\n"
        "# command-line overrides: --learning_rate 5e-7\n"
        "# command-line overrides, resumed at step 100: --resume_from_checkpoint true --beta 0.1\n"
        "# command-line overrides, resumed at step 300: --resume_from_checkpoint true\n"
        "```\n\n## Citations\n\n```bibtex\n@misc{x}\n```\n"
    )
    text = recipe_text(argv, str(run / "checkpoint-200"))
    assert text.endswith(
        "\n# command-line overrides: --learning_rate 5e-7\n"
        "# command-line overrides, resumed at step 100: --resume_from_checkpoint true --beta 0.1\n"
        f"# command-line overrides, resumed at step 200: --output_dir {run} --resume_from_checkpoint true\n"
    )
    assert SMOKE.read_text() in text
    # A launch that resumes with no override (the recipe file says resume_from_checkpoint) says so: the
    # last launch's overrides are not taken for the ones its steps trained under.
    assert recipe_text(["--config", str(SMOKE)], str(run / "checkpoint-200")).endswith(
        "# command-line overrides, resumed at step 100: --resume_from_checkpoint true --beta 0.1\n"
        "# command-line overrides, resumed at step 200: none\n"
    )


def test_the_interruption_message_finds_the_checkpoint_of_a_run_that_saves_only_the_model(tmp_path):
    from fault_harness import tiny_checkpoint

    from prompt_aug.cli import interrupted_message

    # save_only_model writes no optimizer state: the run's checkpoint is complete without it, and the
    # message must not say that none was saved (and suggest --overwrite_output_dir true).
    run = tmp_path / "run"
    argv = ["--config", str(SMOKE), "--output_dir", str(run)]
    (tiny_checkpoint(run / "checkpoint-2", 2) / "optimizer.pt").unlink()
    assert "No checkpoint was saved" in interrupted_message(str(run), 3, 10, argv)
    message = interrupted_message(str(run), 3, 10, argv, optimizer=False)
    assert f"Last checkpoint: {run / 'checkpoint-2'}." in message


def test_the_interruption_message_skips_a_checkpoint_missing_a_process_rng_state(tmp_path, monkeypatch):
    """On several processes each writes its own RNG state; a checkpoint whose save was cut short before
    process 1 wrote its file (and before ``launch.json``) is one a resume skips: the message names the one
    before it, judged with the run's process count (given, or the launcher's WORLD_SIZE)."""
    import torch
    from fault_harness import tiny_checkpoint

    from prompt_aug.cli import interrupted_message

    run = tmp_path / "run"
    argv = ["--config", str(SMOKE), "--output_dir", str(run)]
    for step, ranks in ((2, (0, 1)), (4, (0,))):
        folder = tiny_checkpoint(run / f"checkpoint-{step}", step)
        for rank in ranks:
            torch.save({}, folder / f"rng_state_{rank}.pth")
    complete = f"Last checkpoint: {run / 'checkpoint-2'}."
    assert complete in interrupted_message(str(run), 5, 10, argv, processes=2)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun and accelerate launch set it
    assert complete in interrupted_message(str(run), 5, 10, argv)


def test_the_interruption_message_skips_a_checkpoint_whose_adaptive_entropy_state_was_cut_short(tmp_path):
    from fault_harness import tiny_checkpoint

    from prompt_aug.cli import interrupted_message
    from prompt_aug.faults import ENTROPY_FILE

    run = tmp_path / "run"
    argv = ["--config", str(SMOKE), "--output_dir", str(run)]
    tiny_checkpoint(run / "checkpoint-2", 2)
    (tiny_checkpoint(run / "checkpoint-4", 4) / ENTROPY_FILE).write_text('{"entropy_co')
    assert f"Last checkpoint: {run / 'checkpoint-4'}." in interrupted_message(str(run), 5, 10, argv)
    message = interrupted_message(str(run), 5, 10, argv, entropy=True)  # a use_adaptive_entropy run
    assert f"Last checkpoint: {run / 'checkpoint-2'}." in message


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (["--question_column", "question_text"], "question_text"),  # the data, after the folder is checked
        (
            ["--use_peft", "true", "--lora_target_modules", "qproj"],
            "no module of the model matches",
        ),  # PEFT's
        (
            ["--temperature", "0"],
            f"command line --temperature, overriding {SMOKE}: temperature: must be above 0",
        ),
        (
            ["--learning_rate=-1e-5"],
            f"--learning_rate, overriding {SMOKE}: learning_rate: must be at least 0, got -1e-05",
        ),
        (["--adam_beta1", "1.5"], "command line: adam_beta1: must be at least 0 and below 1, got 1.5"),
        (["--num_iterations", "0"], "command line: num_iterations: must be at least 1, got 0"),
        (
            ["--report_to", "wandbb"],
            f"command line --report_to, overriding {SMOKE}: report_to: 'wandbb' is not",
        ),
    ],
)
def test_overwrite_leaves_the_earlier_run_as_it_was_when_a_later_check_fails(tmp_path, capsys, bad, says):
    """``--overwrite_output_dir true`` deletes the earlier run only once every check has passed: a typo in
    another key stops the run with its one line and the old checkpoints, model and completions stay."""
    import pandas as pd
    from fault_harness import tiny_checkpoint

    data = tmp_path / "data"
    data.mkdir()
    rows = {"question": [f"What is {i} + 1?" for i in range(8)], "answer": [str(i + 1) for i in range(8)]}
    pd.DataFrame(rows).to_parquet(data / "train.parquet")
    run = tmp_path / "run"
    tiny_checkpoint(run / "checkpoint-2", 2)
    (run / "model.safetensors").write_bytes(b"the earlier run's weights")
    (run / "completions").mkdir()
    (run / "completions" / "completions_00002.parquet").write_bytes(b"old")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    argv = ["--config", str(SMOKE), "--output_dir", str(run), "--dataset_name", str(data)]
    message = _error([*argv, "--overwrite_output_dir", "true", *bad], capsys)
    assert says in message
    assert {p: p.read_bytes() for p in before if p.is_file()} == before


def test_overwrite_refuses_a_model_it_would_delete_from_the_earlier_run(tmp_path, capsys, tiny_model_dir):
    """A model read from the earlier run's checkpoint would be deleted under the run that reads it (and the
    card would name a folder that is gone): refused in one line naming the key, nothing deleted."""
    run = tmp_path / "run"
    checkpoint = run / "checkpoint-2"
    shutil.copytree(tiny_model_dir, checkpoint)  # the earlier run's model, as a checkpoint holds it
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    argv = ["--config", str(SMOKE), "--output_dir", str(run), "--overwrite_output_dir", "true"]
    message = _error([*argv, "--model_name_or_path", str(checkpoint)], capsys)
    assert (
        f"error: model_name_or_path: {checkpoint} lies in {checkpoint}, which --overwrite_output_dir"
        in message
    )
    assert {p: p.read_bytes() for p in before} == before


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    _train(out, "--max_steps", "2")
    return out


def _state(run: Path) -> dict:
    return json.loads((run / "trainer_state.json").read_text())


@pytest.mark.slow
def test_training_into_a_folder_that_holds_a_run_is_refused_and_names_both_ways_out(two_step_run, capsys):
    before = {p: p.stat().st_mtime_ns for p in two_step_run.rglob("*") if p.is_file()}
    message = _error(["--config", str(SMOKE), "--output_dir", str(two_step_run), "--max_steps", "1"], capsys)
    assert "already holds a run" in message and "checkpoint-2" in message
    assert "--resume_from_checkpoint true" in message and "--overwrite_output_dir true" in message
    assert {p: p.stat().st_mtime_ns for p in two_step_run.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_overwrite_replaces_the_whole_earlier_run(two_step_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_step_run, run)
    shutil.copytree(run / "checkpoint-2", run / "checkpoint-12")  # a longer earlier run's late checkpoint
    (run / "completions" / "completions_00011.parquet").write_bytes(b"old")
    demo = [run / name for name in ("before_after.md", "before_after.json", "heldout.jsonl")]
    for path in demo:  # the learning demo's files of the earlier run; this one does not write them
        path.write_text("old")
    _train(run, "--max_steps", "1", "--save_steps", "1", "--overwrite_output_dir", "true")
    assert not any(path.exists() for path in demo)
    assert (run / "tiny-random-qwen2" / "config.json").is_file()  # the built-in model it was built into
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"]
    assert sorted(p.name for p in (run / "completions").iterdir()) == ["completions_00001.parquet"]
    assert _state(run)["global_step"] == 1 and len(_state(run)["log_history"]) == 2  # 1 step + the summary
    assert [json.loads(line)["step"] for line in (run / "logs.jsonl").read_text().splitlines()] == [1, 1]
    assert faults.resolve_resume("true", str(run)) == str(run / "checkpoint-1")


@pytest.mark.slow
def test_resume_says_which_checkpoint_it_loaded(two_step_run, tmp_path, caplog):
    run = tmp_path / "run"
    shutil.copytree(two_step_run, run)
    with (run / "logs.jsonl").open("a") as log:  # an interrupted run logged step 3 after checkpoint-2
        log.write(json.dumps({"step": 3, "stale": True}) + "\n")
    with caplog.at_level("INFO", logger="prompt_aug"):
        _train(run, "--max_steps", "3", "--resume_from_checkpoint", "true")
    assert f"resuming from {run / 'checkpoint-2'} (step 2)" in caplog.text
    assert _state(run)["global_step"] == 3
    entries = [json.loads(line) for line in (run / "logs.jsonl").read_text().splitlines()]
    # each step once, and one end-of-training summary: the resumed run's (the first start's is dropped)
    assert [e["step"] for e in entries] == [1, 2, 3, 3] and not any("stale" in e for e in entries)
    assert ["train_runtime" in e for e in entries] == [False, False, False, True]


@pytest.mark.slow
def test_resuming_a_checkpoint_already_at_max_steps_is_refused_before_the_model_loads(
    two_step_run, tmp_path, capsys, monkeypatch
):
    run = tmp_path / "run"
    shutil.copytree(two_step_run, run)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    loads = []
    monkeypatch.setattr(train, "load_model", lambda *a, **k: loads.append(a))  # a probe: never to be called
    argv = ["--config", str(SMOKE), "--output_dir", str(run)]
    message = _error([*argv, "--max_steps", "2", "--resume_from_checkpoint", "true"], capsys)
    assert message.endswith(
        f"error: resume_from_checkpoint: {run / 'checkpoint-2'} is already at step 2 of max_steps 2, the "
        "run's end (its weights are there): raise max_steps (the recipe's or --max_steps) to train on"
    )
    message = _error(
        [*argv, "--max_steps", "1", "--resume_from_checkpoint", str(run / "checkpoint-2")], capsys
    )
    assert f"{run / 'checkpoint-2'} is already at step 2 of max_steps 1, the run's end" in message
    assert loads == []
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_resume_and_overwrite_together_are_refused(two_step_run, capsys):
    message = _error(
        [
            "--config",
            str(SMOKE),
            "--output_dir",
            str(two_step_run),
            "--resume_from_checkpoint",
            "true",
            "--overwrite_output_dir",
            "true",
        ],
        capsys,
    )
    assert "pick one" in message


# ---------------------------------------------------------------------------------------------
# The console, as a user sees it


@pytest.mark.slow
def test_console_shows_compact_lines_no_checkpointing_deprecation_and_how_to_resume_after_ctrl_c(tmp_path):
    out = tmp_path / "run"
    cmd = train_command(out, "--max_steps", "400", "--save_steps", "1")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        # Unbuffered, so each log line reaches the pipe as it is written: with a block-buffered pipe, step 5's
        # line arrived only when the buffer filled or at exit, and Ctrl-C then hit a run already finishing.
        "PYTHONUNBUFFERED": "1",
    }
    # A job started in the background by a non-interactive shell (`bash -c '... &'`, nohup) inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: Ctrl-C would do nothing. Give the run
    # the default disposition, as a terminal's foreground job has.
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 (no threads yet here)
    )
    # Wait on events, not on a budget sized for an idle machine: read both pipes as they fill, send Ctrl-C
    # once step 5 is logged and its checkpoint written (3 generation rounds: the warnings had 3 chances to
    # repeat), then wait for the exit. SAFETY_CEILING_S only keeps a hung run from hanging the suite.
    lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
    step_5_logged = threading.Event()

    def read(name: str, pipe) -> None:
        for line in pipe:
            lines[name].append(line)
            if "| step 5/400 |" in line:
                step_5_logged.set()

    readers = [threading.Thread(target=read, args=item, daemon=True)
               for item in (("stdout", proc.stdout), ("stderr", proc.stderr))]  # fmt: skip
    for reader in readers:
        reader.start()
    ceiling = time.monotonic() + SAFETY_CEILING_S
    while proc.poll() is None and time.monotonic() < ceiling:
        if step_5_logged.is_set() and (out / "checkpoint-5" / "trainer_state.json").is_file():
            break
        time.sleep(0.2)
    assert proc.poll() is None, "training ended before step 5:\n" + "".join(lines["stderr"])[-3000:]
    if time.monotonic() >= ceiling:
        proc.kill()
        pytest.fail(f"step 5 not logged within the {SAFETY_CEILING_S} s safety ceiling")
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=max(ceiling - time.monotonic(), 60))
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"no exit after Ctrl-C within the {SAFETY_CEILING_S} s safety ceiling")
    for reader in readers:
        reader.join()
    stdout, stderr = "".join(lines["stdout"]), "".join(lines["stderr"])
    console = stdout + stderr
    assert proc.returncode == 130, console[-3000:]
    assert "Traceback" not in console
    assert "Interrupted at step" in stderr and "Last checkpoint: " in stderr
    assert f"--output_dir {out} --max_steps 400 --save_steps 1 --resume_from_checkpoint true" in stderr
    # One compact line per logged step, not the dict of every metric.
    assert "round 1 | step 1/400 | reward " in console and "round 2 | step 3/400 | reward " in console
    assert "'completions/mean_length'" not in console and "templates/" not in console
    # transformers' renamed-API warnings of the gradient-checkpointing names (the recipe's key, TRL's calls of
    # `is_gradient_checkpointing` every round) are not shown.
    deprecated = re.findall(r"FutureWarning: `(\w+)` is deprecated", console)
    assert not [name for name in deprecated if "gradient_checkpointing" in name], deprecated
    # The full metrics are in the log file.
    first = json.loads((out / "logs.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1 and any(k.startswith("templates/") for k in first) and "entropy" in first


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--reward_funcs", "corectness"], "reward_funcs"),
        (["--reward_funcs", "my_rewards_absent.brevity"], "my_rewards_absent"),
        (["--templates_file", "absent_templates.yaml"], "absent_templates.yaml"),
        (["--eval_template", "no-such-template"], "no-such-template"),
        (
            ["--reward_funcs", "correctness", "format", "--reward_weights", "1", "2", "3"],
            (
                "reward_weights: 3 weights [1.0, 2.0, 3.0] for 2 reward_funcs ['correctness_reward', "
                "'format_reward']; give one weight per reward function"
            ),
        ),
        (
            ["--reward_funcs", "format", "correctness", "rewards.registry:format_reward"],
            "reward_funcs: entries 1 and 3 are both named 'format_reward'",
        ),
    ],
)
def test_the_dry_run_refuses_what_the_launch_would(extra, expected, tmp_path, capsys):
    # The dry run is how a recipe is checked without a GPU: a name the launch refuses, it refuses too, in the
    # launch's own words.
    out = tmp_path / "out"
    dry = _error(["--config", str(SMOKE), "--output_dir", str(out), "--dry_run", *extra], capsys)
    assert expected in dry and "Traceback" not in dry
    assert _error(["--config", str(SMOKE), "--output_dir", str(out), *extra], capsys) == dry
    assert not out.exists()


def test_a_bad_templates_file_names_where_the_key_was_set(tmp_path, capsys):
    # The file's own error starts with its path: the key is named first, so the line says whether the recipe
    # or the command line gave it.
    bank = tmp_path / "bank.yaml"
    bank.write_text("- name: a\n  user: '{question}'\n  name: b\n")
    message = _error(["--config", str(SMOKE), "--dry_run", "--templates_file", str(bank)], capsys)
    assert message.startswith(f"prompt-aug-train: error: command line: templates_file: {bank}: line 3: "), (
        message
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"{SMOKE.read_text()}\ntemplates_file: {bank}\n")
    message = _error(["--config", str(recipe), "--dry_run"], capsys)
    assert message.startswith(f"prompt-aug-train: error: {recipe}: templates_file: {bank}: line 3: "), message
