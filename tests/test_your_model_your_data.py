"""Your model, your data (docs/your-model-your-data.md): a chat template for a base model, a system prompt,
dataset mixtures with per-source columns, rewards by dotted path and TRL's rewards by name, and the example
recipe."""

from __future__ import annotations

import json
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from trl import ModelConfig

from prompt_aug import models, train
from prompt_aug.data import DataError, load_train_dataset
from prompt_aug.recipe import PromptAugScriptArguments
from prompt_aug.sources import SourceError, read_training_data
from prompt_aug.templates import CHATML_TEMPLATE, TemplateError, load_templates, templates_for
from rewards.registry import TRL_REWARDS, TRLConvention, format_reward, get_reward_funcs

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "recipes/examples/your_model_your_data.yaml"
DOC = REPO / "docs/your-model-your-data.md"
SMOKE = REPO / "recipes/smoke/tiny_cpu.yaml"


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny model with a tokenizer that has no chat template, as a base model's."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("base") / "base-model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert AutoTokenizer.from_pretrained(folder).chat_template is None
    return folder


def _args(tmp_path):
    from prompt_aug.config import PromptAugGRPOConfig

    return PromptAugGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")


# -- Chat template ------------------------------------------------------------------------------------


def test_a_tokenizer_without_chat_template_asks_for_one_in_one_line(base_model_dir, tmp_path):
    with pytest.raises(models.ModelArgsError) as err:
        models.load_tokenizer(str(base_model_dir), ModelConfig(model_name_or_path="base"), _args(tmp_path))
    message = str(err.value)
    assert "\n" not in message and "no chat template" in message and "set `chat_template`" in message


def test_the_training_command_stops_with_that_line(base_model_dir, tmp_path):
    with pytest.raises(SystemExit) as err:
        train.main([
            "--config", str(SMOKE), "--model_name_or_path", str(base_model_dir),
            "--output_dir", str(tmp_path / "run"),
        ])  # fmt: skip
    message = str(err.value)
    assert message.startswith("prompt-aug-train: error: model_name_or_path ") and "\n" not in message
    assert (
        "set `chat_template` in the recipe: `chatml`, a Jinja template, or the path of a .jinja file"
        in message
    )


def test_a_model_folder_saved_without_its_tokenizer_stops_the_training_command(tiny_model_dir, tmp_path):
    """``model.save_pretrained`` alone leaves no tokenizer files; transformers then loads a tokenizer of an
    empty vocabulary that reads every prompt as no tokens. The command stops in one line naming the folder."""
    folder = tmp_path / "weights-only"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, folder / name)
    with pytest.raises(SystemExit) as err:
        train.main(
            [
                "--config",
                str(SMOKE),
                "--model_name_or_path",
                str(folder),
                "--output_dir",
                str(tmp_path / "run"),
            ]
        )
    assert str(err.value) == (
        f"prompt-aug-train: error: model_name_or_path {folder}: its tokenizer turns text into no tokens (no "
        "tokenizer files beside the weights?); save the tokenizer into that folder "
        "(tokenizer.save_pretrained) or point at a folder that has one"
    )
    assert not (tmp_path / "run").exists()


def test_offline_a_model_not_in_the_cache_stops_in_one_line(tmp_path):
    with pytest.raises(SourceError) as err:  # offline: conftest sets HF_HUB_OFFLINE
        models.load_tokenizer("nobody-here/no-such-model", ModelConfig(), _args(tmp_path))
    message = str(err.value)
    assert message.startswith("model_name_or_path nobody-here/no-such-model: not in the Hugging Face cache")
    assert "\n" not in message


def test_offline_a_hub_model_is_looked_for_in_the_cache_before_the_run_starts(tmp_path, monkeypatch):
    """Offline (conftest), the command's check of ``model_name_or_path``: a Hub id with no snapshot in the
    Hugging Face cache stops in one line; one with a snapshot (any revision) passes."""
    from huggingface_hub import constants

    from prompt_aug.sources import check_source

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(SourceError) as err:
        check_source("model_name_or_path", "nobody-here/no-such-model", model=True)
    message = str(err.value)
    assert message.startswith("model_name_or_path nobody-here/no-such-model: not in the Hugging Face cache")
    assert "\n" not in message
    (tmp_path / "hub" / "models--nobody-here--no-such-model" / "snapshots" / "0123abc").mkdir(parents=True)
    check_source("model_name_or_path", "nobody-here/no-such-model", model=True)


def test_only_an_uncached_hub_model_is_downloaded_by_the_main_process_first(tmp_path, monkeypatch):
    """The training command loads a model main-process-first only when loading downloads it: a Hub id with no
    snapshot in the cache; a cached one, a local folder or a folder named like an id is read where it is."""
    from huggingface_hub import constants

    from prompt_aug.sources import downloads_model

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert downloads_model("nobody-here/no-such-model")
    (tmp_path / "hub" / "models--nobody-here--no-such-model" / "snapshots" / "0123abc").mkdir(parents=True)
    assert not downloads_model("nobody-here/no-such-model")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert not downloads_model("org/model") and not downloads_model(str(tmp_path / "org" / "model"))


@pytest.mark.parametrize("form", ["name", "file", "jinja"])
def test_chat_template_is_set_on_the_tokenizer_by_name_file_or_text(form, base_model_dir, tmp_path):
    jinja = tmp_path / "mine.jinja"
    jinja.write_text(CHATML_TEMPLATE.replace("<|im_start|>", "<|im_start|>[file]"))
    value, expected = {
        "name": ("chatml", CHATML_TEMPLATE),
        "file": (str(jinja), jinja.read_text()),
        "jinja": ("{% for m in messages %}{{ m['content'] }}|{% endfor %}", None),
    }[form]
    tokenizer = models.load_tokenizer(str(base_model_dir), ModelConfig(), _args(tmp_path), value)
    assert tokenizer.chat_template == (expected or value)
    text = load_templates()["qwen-math"].render("What is 2 + 2?", tokenizer)
    assert "What is 2 + 2?" in text


def test_chatml_on_a_vocabulary_without_its_markers_warns_that_turns_will_not_stop(
    tiny_model_dir, tmp_path, caplog
):
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as token_models
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "</s>", "What", "is", "2", "+", "?"]
    core = Tokenizer(token_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "plain-vocab"
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", eos_token="</s>").save_pretrained(
        folder
    )
    with caplog.at_level("WARNING", logger="prompt_aug"):
        models.load_tokenizer(
            str(folder), ModelConfig(model_name_or_path=str(folder)), _args(tmp_path), "chatml"
        )
    assert (
        "chat_template: chatml writes ['<|im_start|>', '<|im_end|>'], which are not single tokens"
        in caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="prompt_aug"):  # a vocabulary that has them: nothing to say
        models.load_tokenizer(str(tiny_model_dir), ModelConfig(), _args(tmp_path), "chatml")
    assert "chat_template" not in caplog.text


def test_chat_template_replaces_a_chat_models_own(tiny_model_dir, tmp_path):
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    tokenizer = models.load_tokenizer(str(tiny_model_dir), ModelConfig(), _args(tmp_path), plain)
    assert load_templates()["qwen-math"].render("Q?", tokenizer).startswith("system: Please reason")


def test_a_chat_template_that_is_no_name_file_or_template_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(TemplateError, match="^chat_template: 'chatlm' is neither"):
        models.load_tokenizer(str(tiny_model_dir), ModelConfig(), _args(tmp_path), "chatlm")


def test_the_data_preview_renders_with_the_recipes_chat_template_and_system_prompt(
    base_model_dir, tmp_path, capsys
):
    from prompt_aug import data

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"problem": "What is 3 + 4?", "final_answer": "7"}) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model_name_or_path: {base_model_dir}\nchat_template: chatml\nsystem_prompt: Be terse.\n"
        "templates: [qwen-math]\n"
    )
    data.main(["--dataset", str(questions), "--config", str(recipe)])
    out = capsys.readouterr().out
    assert "<|im_start|>system\nBe terse.\n\nPlease reason step by step" in out and "What is 3 + 4?" in out


# -- System prompt ------------------------------------------------------------------------------------


def test_system_prompt_goes_before_the_templates_system_text_and_renders(tokenizer, tmp_path):
    args = _args(tmp_path)
    args.system_prompt = "You are terse."
    templates, _, eval_template = templates_for(args)
    builtin = load_templates()
    for template in [*templates, eval_template]:
        assert template.system == "You are terse.\n\n" + builtin[template.name].system
        assert (
            template.user == builtin[template.name].user
            and template.markers == builtin[template.name].markers
        )
    text = templates[0].render("What is 1 + 1?", tokenizer)
    assert text.index("You are terse.") < text.index(builtin[templates[0].name].system)
    args.prompt_augmentation = False  # the evaluation template alone, with the system prompt too
    assert templates_for(args)[0][0].system.startswith("You are terse.\n\n")


# -- Mixtures -----------------------------------------------------------------------------------------


@pytest.fixture
def two_sets(tmp_path) -> dict[str, Path]:
    """Two small question sets of different shapes: a JSON-lines file with its own column names, and a parquet
    folder with MATH-like levels and a list of golds in one row."""
    algebra = tmp_path / "algebra.jsonl"
    algebra.write_text(
        "".join(
            json.dumps({"problem": f"Solve x + {i} = {2 * i}.", "final_answer": str(i)}) + "\n"
            for i in range(1, 5)
        )
    )
    folder = tmp_path / "geometry"
    folder.mkdir()
    pd.DataFrame(
        {
            "question": ["Area of a 2 by 3 rectangle?", "Angles in a triangle sum to?", "Sides of a square?"],
            "answer": [["6"], ["180", "\\pi"], ["4"]],
            "level": ["Level 1", "Level 5", "Level 5"],
        }
    ).to_parquet(folder / "train.parquet")
    return {"algebra": algebra, "geometry": folder}


def _recipe(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(SMOKE.read_text().replace("dataset_name: synthetic\nnum_synthetic: 256\n", "") + body)
    return path


def _load(recipe: Path, tokenizer, *extra: str):
    script_args, args, _, _ = train.parse_args(["--config", str(recipe), "--dry_run", *extra])
    templates, _, eval_template = templates_for(args)
    read = read_training_data(script_args, seed=args.seed)
    return load_train_dataset(read, script_args, args, templates, eval_template, tokenizer)


def _two_set_mixture(two_sets: dict, geometry_level: str) -> str:
    """A recipe's mixture of the algebra set (its own column names) and the geometry set at one level."""
    return f"""
dataset_mixture:
  datasets:
    - path: {two_sets["algebra"]}
      question_column: problem
      answer_column: final_answer
    - path: {two_sets["geometry"]}
      dataset_levels: [{geometry_level}]
"""


def test_a_mixture_of_two_local_sets_maps_each_with_its_own_columns(two_sets, tmp_path, tokenizer):
    recipe = _recipe(
        tmp_path,
        _two_set_mixture(two_sets, "Level 5"),
    )
    rows, report = _load(recipe, tokenizer)
    # Geometry's `level` is kept for the reward functions; algebra has none, so its rows have None.
    assert rows.column_names == ["question", "answer", "uid", "level"]
    assert rows["level"] == [None] * 4 + ["Level 5"] * 2
    assert len(rows) == 4 + 2
    # One source has lists of golds, so every gold is a list.
    assert rows[0]["question"] == "Solve x + 1 = 2." and rows[0]["answer"] == ["1"]
    assert rows[-1]["answer"] == ["4"] and rows[-2]["answer"] == ["180", "\\pi"]
    uids = rows["uid"]
    assert len(set(uids)) == len(uids)
    assert [u.split(":")[0] for u in uids] == ["0"] * 4 + ["1"] * 2
    text = str(report)
    assert "algebra.jsonl (4 rows)" in text and "geometry (2 rows)" in text and "level not in" in text
    # Which columns each source's question and gold come from, and what else reaches the rewards.
    assert (
        f"\n  columns: {two_sets['algebra']}: question <- 'problem', gold <- 'final_answer'; "
        f"{two_sets['geometry']}: question <- 'question', gold <- 'answer'; "
        "also to the rewards: level (string)\n"
    ) in text
    assert "appear more than once" not in text
    # The uids are stable: a second load gives the same.
    assert _load(recipe, tokenizer)[0]["uid"] == uids


def test_mixture_fractions_keep_trls_meaning_and_top_level_columns_are_defaults(
    two_sets, tmp_path, tokenizer
):
    recipe = _recipe(
        tmp_path,
        f"""
question_column: problem
answer_column: final_answer
dataset_mixture:
  datasets:
    - path: json
      data_files: [{two_sets["algebra"]}]
      fraction: 3
    - path: {two_sets["geometry"]}
      question_column: question
      answer_column: answer
      fraction: 1
""",
    )
    rows, report = _load(recipe, tokenizer)
    # 4 algebra rows at a share of 3/4 allow a mixture of 5 (geometry's 3 rows would allow 12): 4 + 1.
    sources = [u.split(":")[0] for u in rows["uid"]]
    assert sources.count("0") == 4 and sources.count("1") == 1
    # The 2 geometry rows left out are counted, as every other row not trained on is.
    assert f"dropped 2: {two_sets['geometry']}: beyond its fraction of the mixture" in str(report)


def test_a_mixtures_prompts_over_the_limit_are_counted_by_source(tmp_path, tokenizer):
    long = "Compute " + " + ".join(["1"] * 400) + "."
    short = tmp_path / "short.jsonl"
    mixed = tmp_path / "mixed.jsonl"
    short.write_text(
        "".join(json.dumps({"question": f"{i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3))
    )
    rows = [("1 + 1?", "2"), (long, "400"), (long + " ", "400")]
    mixed.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    recipe = _recipe(tmp_path, f"dataset_mixture:\n  datasets:\n    - path: {short}\n    - path: {mixed}\n")
    rows, report = _load(recipe, tokenizer, "--max_prompt_length", "400")
    assert len(rows) == 4 and report.rows == 4  # which rows are kept does not change
    text = str(report)
    assert f"dropped 2: {mixed}: prompt longer than 400 tokens" in text
    assert f"{short}: prompt longer" not in text and "dropped 2: prompt longer" not in text


def test_a_mixtures_shares_hold_for_the_rows_left_once_long_prompts_are_dropped(tmp_path, tokenizer):
    # 6 short rows each; 4 of the second source's are too long: at 1:1 the mixture is 2 + 2, not 6 + 2.
    long = "Compute " + " + ".join(["1"] * 400) + "."
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text(
        "".join(json.dumps({"question": f"{i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(6))
    )
    questions = [f"{i} + 2?" for i in range(2)] + [long + " " * i for i in range(4)]
    second.write_text("".join(json.dumps({"question": q, "answer": "3"}) + "\n" for q in questions))
    body = (
        f"dataset_mixture:\n  datasets:\n    - path: {first}\n      fraction: 0.5\n"
        f"    - path: {second}\n      fraction: 0.5\n"
    )
    rows, report = _load(_recipe(tmp_path, body), tokenizer, "--max_prompt_length", "400")
    sources = [u.split(":")[0] for u in rows["uid"]]
    assert sources.count("0") == sources.count("1") == 2
    text = str(report)
    assert f"dropped 4: {second}: prompt longer than 400 tokens" in text
    assert f"dropped 4: {first}: beyond its fraction of the mixture" in text
    assert f"{first} (2 rows), {second} (2 rows)" in text  # the rows each source gives the mixture


def test_a_mixture_source_whose_prompts_are_all_too_long_gives_none_unless_it_has_a_share(
    tmp_path, tokenizer
):
    long = "Compute " + " + ".join(["1"] * 400) + "."
    short, tall = tmp_path / "short.jsonl", tmp_path / "tall.jsonl"
    short.write_text(
        "".join(json.dumps({"question": f"{i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(4))
    )
    tall.write_text(
        "".join(json.dumps({"question": long + " " * i, "answer": "400"}) + "\n" for i in range(3))
    )
    body = f"dataset_mixture:\n  datasets:\n    - path: {short}\n    - path: {tall}\n"
    rows, report = _load(_recipe(tmp_path, body), tokenizer, "--max_prompt_length", "400")
    assert len(rows) == 4 and f"dropped 3: {tall}: prompt longer than 400 tokens" in str(report)

    def shared(first: float, second: float) -> Path:
        return _recipe(
            tmp_path,
            f"dataset_mixture:\n  datasets:\n    - path: {short}\n      fraction: {first}\n"
            f"    - path: {tall}\n      fraction: {second}\n",
        )

    with pytest.raises(
        DataError, match=r"^dataset_mixture.datasets\[1\] \(.*tall.jsonl\): all 3 rows left dropped"
    ):
        _load(shared(0.5, 0.5), tokenizer, "--max_prompt_length", "400")
    rows, _ = _load(shared(0.5, 0), tokenizer, "--max_prompt_length", "400")
    assert len(rows) == 4  # a share of 0: nothing is asked of it


def test_a_mixture_from_the_command_line_as_json(two_sets, tmp_path, tokenizer):
    mixture = {"datasets": [{"path": str(two_sets["geometry"])}, {"path": str(two_sets["geometry"])}]}
    rows, _ = _load(_recipe(tmp_path, ""), tokenizer, "--dataset_mixture", json.dumps(mixture))
    assert len(rows) == 6 and len(set(rows["uid"])) == 6  # the same set twice: still distinct uids


def test_a_mixture_source_without_the_column_names_the_source(two_sets, tmp_path, tokenizer):
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"text": "What is 1 + 1?", "gold": "2"}) + "\n")
    recipe = _recipe(
        tmp_path, f"dataset_mixture:\n  datasets:\n    - path: {two_sets['geometry']}\n    - path: {odd}\n"
    )
    with pytest.raises(
        DataError, match=r"^dataset_mixture.datasets\[1\] \(.*odd.jsonl\): no question column"
    ):
        _load(recipe, tokenizer)


@pytest.mark.parametrize(
    "extra, message, error",
    [
        # the source's path follows its key, or (read as stored) its folder follows what is not there
        ("      columns: [question, notes]\n", r" \(.*splits\): columns \['notes'\] not found", DataError),
        ("      split: dev\n", r": no 'dev' file in .*splits;", SourceError),
    ],
)
def test_a_mixture_source_that_lacks_a_column_or_split_names_the_source(
    tmp_path, tokenizer, extra, message, error
):
    folder = tmp_path / "splits"
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text(
            json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n"
        )
    recipe = _recipe(tmp_path, f"dataset_mixture:\n  datasets:\n    - path: {folder}\n{extra}")
    with pytest.raises(error, match=rf"^dataset_mixture.datasets\[0\]{message}"):
        _load(recipe, tokenizer)


def test_a_missing_mixture_file_stops_the_run_in_one_line(tmp_path):
    recipe = _recipe(tmp_path, f"dataset_mixture:\n  datasets:\n    - path: {tmp_path / 'nowhere.jsonl'}\n")
    with pytest.raises(SystemExit, match=r"dataset_mixture.datasets\[0\].path: no such file"):
        train.main(["--config", str(recipe), "--output_dir", str(tmp_path / "run")])
    recipe = _recipe(
        tmp_path,
        f"dataset_mixture:\n  datasets:\n    - path: json\n      data_files: {tmp_path / 'gone.jsonl'}\n",
    )
    with pytest.raises(SystemExit, match=r"dataset_mixture.datasets\[0\].data_files: no such file"):
        train.main(["--config", str(recipe), "--output_dir", str(tmp_path / "run")])


def test_a_mixture_source_that_keeps_no_row_is_named_with_why(two_sets, tmp_path, tokenizer):
    recipe = _recipe(
        tmp_path,
        _two_set_mixture(two_sets, "Level 9"),
    )
    with pytest.raises(DataError) as err:
        _load(recipe, tokenizer)
    message = str(err.value)
    assert (
        message.startswith(r"dataset_mixture.datasets[1] (") and "geometry): kept 0 of its 3 rows" in message
    )
    assert "(dropped 3: level not in ['Level 9'])" in message and "\n" not in message


@pytest.mark.parametrize(
    "fractions, message",
    [
        (
            [0, 0],
            r"^dataset_mixture.datasets: every source's fraction is 0; give at least one source a share",
        ),
        ([0.5, "0.5"], r"^dataset_mixture.datasets\[1\].fraction: .*number >= 0, got '0.5'"),
        ([-1, 1], r"^dataset_mixture.datasets\[0\].fraction: .*number >= 0, got -1"),
        ([True, 1], r"^dataset_mixture.datasets\[0\].fraction: .*number >= 0, got True"),
    ],
)
def test_mixture_fractions_must_be_shares_when_the_recipe_is_parsed(fractions, message):
    from prompt_aug.mixture import dataset_mixture

    with pytest.raises(ValueError, match=message):
        dataset_mixture(
            {"datasets": [{"path": f"d{i}.jsonl", "fraction": f} for i, f in enumerate(fractions)]}
        )


def test_a_fraction_given_as_text_stops_the_run_before_any_data_is_read(tmp_path):
    recipe = _recipe(
        tmp_path,
        f"dataset_mixture:\n  datasets:\n    - path: {tmp_path / 'absent.jsonl'}\n      fraction: '0.5'\n",
    )
    with pytest.raises(SystemExit, match=r"dataset_mixture.datasets\[0\].fraction: .*number >= 0") as err:
        train.main(["--config", str(recipe), "--output_dir", str(tmp_path / "run")])
    assert "\n" not in str(err.value)


def test_a_mixture_parses_into_trls_mixture_config():
    from trl import DatasetMixtureConfig
    from trl.scripts.utils import DatasetConfig

    script_args = PromptAugScriptArguments(
        dataset_mixture={"datasets": [{"path": "a", "split": "test", "dataset_levels": [4]}]}
    )
    mixture = script_args.dataset_mixture
    assert isinstance(mixture, DatasetMixtureConfig) and isinstance(mixture.datasets[0], DatasetConfig)
    assert mixture.datasets[0].split == "test" and mixture.datasets[0].dataset_levels == ["4"]


def test_a_mixture_built_in_code_with_trls_classes_is_checked_and_mapped_as_a_recipes_is():
    from trl import DatasetMixtureConfig
    from trl.scripts.utils import DatasetConfig

    from prompt_aug.mixture import MixtureSource

    built = DatasetMixtureConfig(datasets=[DatasetConfig(path="a.jsonl", split="test", fraction=0.5)])
    mixture = PromptAugScriptArguments(dataset_mixture=built).dataset_mixture
    source = mixture.datasets[0]
    assert isinstance(source, MixtureSource) and (source.path, source.split, source.fraction) == (
        "a.jsonl",
        "test",
        0.5,
    )
    assert source.question_column is None  # the top-level key's, as a recipe's source
    streamed = DatasetMixtureConfig(datasets=[DatasetConfig(path="a.jsonl")], streaming=True)
    with pytest.raises(ValueError, match=r"^dataset_mixture.streaming: not supported"):
        PromptAugScriptArguments(dataset_mixture=streamed)


def test_text_a_parquet_file_holds_as_large_string_mixes_with_text_read_from_json_lines(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # pandas writes text columns as large_string; the JSON reader gives string. Both are text.
    table = pa.table(
        {
            "question": pa.array(["What is 3 + 4?"], pa.large_string()),
            "answer": pa.array(["7"], pa.large_string()),
            "source": pa.array(["parquet"], pa.large_string()),
        }
    )
    pq.write_table(table, tmp_path / "wide.parquet")
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"question": "What is 2 + 2?", "answer": "4", "source": "jsonl"}) + "\n")
    body = f"dataset_mixture:\n  datasets:\n    - path: {tmp_path / 'wide.parquet'}\n    - path: {plain}\n"
    rows, _ = _load(_recipe(tmp_path, body), tokenizer)
    assert sorted(rows["source"]) == ["jsonl", "parquet"] and sorted(rows["answer"]) == ["4", "7"]


def test_a_column_only_some_sources_have_is_none_in_the_others_and_one_type_is_required(
    two_sets, tmp_path, tokenizer
):
    graded = tmp_path / "graded.jsonl"
    graded.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2", "difficulty": 3}) + "\n")
    body = f"dataset_mixture:\n  datasets:\n    - path: {graded}\n    - path: {two_sets['geometry']}\n"
    rows, _ = _load(_recipe(tmp_path, body), tokenizer)
    assert rows.column_names == ["question", "answer", "uid", "difficulty", "level"]
    assert rows["difficulty"] == [3, None, None, None] and rows["level"] == [
        None,
        "Level 1",
        "Level 5",
        "Level 5",
    ]
    worded = tmp_path / "worded.jsonl"
    worded.write_text(json.dumps({"question": "What is 2 + 2?", "answer": "4", "difficulty": "hard"}) + "\n")
    body = f"dataset_mixture:\n  datasets:\n    - path: {graded}\n    - path: {worded}\n"
    with pytest.raises(DataError, match=r"^dataset_mixture: column 'difficulty' is int64 in datasets\[0\]"):
        _load(_recipe(tmp_path, body), tokenizer)
    # Numbers of two kinds take the wider: 3 in one file, 2.5 in another are both float64.
    halves = tmp_path / "halves.jsonl"
    halves.write_text(json.dumps({"question": "What is 5 + 5?", "answer": "10", "difficulty": 2.5}) + "\n")
    body = f"dataset_mixture:\n  datasets:\n    - path: {graded}\n    - path: {halves}\n"
    rows, report = _load(_recipe(tmp_path, body), tokenizer)
    assert sorted(rows["difficulty"]) == [2.5, 3.0] and rows.features["difficulty"].dtype == "float64"
    assert (
        f"note: column 'difficulty': int64 in datasets[0] ({graded}) is read as float64, the type another "
        "source gives it; its whole numbers reach the rewards as floats (3.0)"
    ) in str(report)
    # ... unless a value does not fit the wider type (an integer past 2**53 as a float): one line, naming it.
    huge = tmp_path / "huge.jsonl"
    big = {"question": "What is 6 + 6?", "answer": "12", "difficulty": 2**53 + 1}
    huge.write_text(json.dumps(big) + "\n")
    body = f"dataset_mixture:\n  datasets:\n    - path: {huge}\n    - path: {halves}\n"
    with pytest.raises(DataError, match=r"^dataset_mixture: column 'difficulty' of datasets\[0\] \(.*huge"):
        _load(_recipe(tmp_path, body), tokenizer)
    # A column with no value in one source (Arrow's null type) is as if that source lacked it, first or not.
    unrated = tmp_path / "unrated.jsonl"
    unrated.write_text(json.dumps({"question": "What is 3 + 3?", "answer": "6", "difficulty": None}) + "\n")
    for order in ([unrated, graded], [graded, unrated]):
        body = "dataset_mixture:\n  datasets:\n" + "".join(f"    - path: {p}\n" for p in order)
        rows, _ = _load(_recipe(tmp_path, body), tokenizer)
        assert (
            sorted(rows["difficulty"], key=str) == [3, None] and rows.features["difficulty"].dtype == "int64"
        )


def test_a_column_of_empty_lists_or_null_fields_in_one_source_takes_the_others_type(tmp_path, tokenizer):
    # Every `tests` list of one source is empty, and every `meta.unit` is null: Arrow types them as lists
    # of null and a null field, which hold no value of another type; the reward gets each row's own values.
    empty = tmp_path / "empty.jsonl"
    empty.write_text(
        json.dumps({"question": "What is 1 + 1?", "answer": "2", "tests": [], "meta": {"unit": None}}) + "\n"
    )
    full = tmp_path / "full.jsonl"
    full.write_text(
        json.dumps({"question": "What is 2 + 2?", "answer": "4", "tests": ["x"], "meta": {"unit": "m"}})
        + "\n"
    )
    for order in ([empty, full], [full, empty]):
        body = "dataset_mixture:\n  datasets:\n" + "".join(f"    - path: {p}\n" for p in order)
        rows, _ = _load(_recipe(tmp_path, body), tokenizer)
        by_question = {row["question"]: row for row in rows}
        assert by_question["What is 1 + 1?"]["tests"] == []
        assert by_question["What is 2 + 2?"]["tests"] == ["x"]
        assert by_question["What is 1 + 1?"]["meta"] == {"unit": None}
        assert by_question["What is 2 + 2?"]["meta"] == {"unit": "m"}
    # Lists of one type and of another still differ.
    worded = tmp_path / "worded.jsonl"
    worded.write_text(json.dumps({"question": "What is 3 + 3?", "answer": "6", "tests": [3]}) + "\n")
    body = f"dataset_mixture:\n  datasets:\n    - path: {full}\n    - path: {worded}\n"
    with pytest.raises(DataError, match=r"^dataset_mixture: column 'tests' is List\(Value\('string'\)\)"):
        _load(_recipe(tmp_path, body), tokenizer)


# -- Rewards ------------------------------------------------------------------------------------------


def test_a_dotted_path_names_the_same_function_as_a_colon_path():
    dotted, colon = get_reward_funcs(["rewards.registry.format_reward", "rewards.registry:format_reward"])
    assert dotted is colon is format_reward


def test_a_reward_module_in_the_launch_folder_is_found_by_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_udata.py").write_text(
        "def brevity(completions, **kwargs):\n    return [1.0 / (1 + len(c)) for c in completions]\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (func,) = get_reward_funcs(["my_rewards_udata.brevity"])
    assert func(["abc"]) == [0.25]


def test_a_rewards_py_in_the_launch_folder_is_named_as_what_hides_or_is_hidden(tmp_path):
    # open-r1 calls its reward file rewards.py; ours is an installed package of that name. Run from that
    # folder, `python -m` puts the file first (it hides the package); the console script does not (the
    # recipe's rewards.brevity is then looked up in the package). Each says so in one line.
    mine = tmp_path / "rewards.py"
    mine.write_text("def brevity(completions, **kwargs):\n    return [0.0 for c in completions]\n")
    argv = ["--config", str(SMOKE), "--reward_funcs", "rewards.brevity", "--dry_run"]
    scripts = Path(sys.executable).parent
    run = lambda cmd: subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    module = run([sys.executable, "-m", "prompt_aug.train", *argv])
    assert module.returncode != 0
    assert f"{mine} hides prompt-aug-grpo's own `rewards` package" in module.stderr.strip().splitlines()[-1]
    script = run([str(scripts / "prompt-aug-train"), *argv])
    assert script.returncode != 0 and "Traceback" not in script.stderr, script.stderr[-2000:]
    assert f"'rewards' is the installed {REPO / 'rewards' / '__init__.py'}, not your {mine};" in script.stderr


def test_trls_rewards_by_name_are_trls_and_read_this_packages_rows():
    import trl.rewards

    funcs = get_reward_funcs(list(TRL_REWARDS))
    assert all(isinstance(f, TRLConvention) for f in funcs)
    names = ["accuracy_reward", "reasoning_accuracy_reward", "think_format_reward"]
    assert [f.__name__ for f in funcs] == [*names, "soft_overlong_punishment_reward"]
    accuracy, reasoning, think, overlong = funcs
    assert accuracy.func is trl.rewards.accuracy_reward
    # Text completions (prompt augmentation) and the gold in `answer`, as this package's rows have them.
    completions = ["So \\boxed{4}.", "So \\boxed{5}.", "It is \\boxed{\\frac{1}{2}}."]
    golds = ["4", "4", ["180", "\\frac{1}{2}"]]  # any of several golds counts
    assert accuracy(completions, answer=golds, template=["qwen-math"] * 3) == [1.0, 0.0, 1.0]
    # Golds as this package's rows hold them (bare LaTeX, AMC's floats): TRL's parse finds math only in $...$.
    golds = ["\\sqrt{2}", "(1,2]", "3\\sqrt{2}", 18.0, "x^2+1"]
    completions = [f"So $\\boxed{{{a}}}$." for a in ["\\sqrt{2}", "(1,2]", "3\\sqrt{2}", "18", "1+x^2"]]
    assert accuracy(completions, answer=golds) == [1.0] * 5
    assert accuracy(["So \\boxed{2\\sqrt{3}}."], answer=["3\\sqrt{2}"]) == [0.0]
    assert reasoning(["<think>hm</think> \\boxed{4}"], answer=["4"]) == [1.0]
    assert think(["<think>\nx\n</think>\nSo 4.", "So 4."], answer=["4", "4"]) == [1.0, 0.0]
    assert overlong(["x", "y"], completion_ids=[[1] * 1152, [1] * 10], answer=["4", "4"]) == [-0.5, 0.0]
    # Conversational completions pass through untouched. A dataset's own worked `solution` beside the gold
    # is not what TRL's reward grades against: it would take the first expression of the working, $x = 2$.
    worked = ["We have $x = 2$, so $x^2 + 8 = 12$."]
    assert accuracy([[{"content": "\\boxed{12}"}]], solution=worked, answer=["12"]) == [1.0]
    assert trl.rewards.accuracy_reward([[{"content": "\\boxed{12}"}]], solution=worked) == [0.0]
    assert pickle.loads(pickle.dumps(accuracy)).func is trl.rewards.accuracy_reward  # spawned workers


def test_a_trl_reward_by_path_is_adapted_too_and_unknown_names_list_trls():
    (func,) = get_reward_funcs(["trl.rewards.accuracy_reward"])
    assert isinstance(func, TRLConvention) and func(["\\boxed{2}"], answer=["2"]) == [1.0]
    with pytest.raises(ValueError, match="think_format_reward"):
        get_reward_funcs(["accuracy"])


DIFFICULTY_REWARD = """
import functools


def difficulty_reward(completions, difficulty, tests, **kwargs):
    if any(d is None for d in difficulty):
        raise ValueError("no difficulty")
    assert all(isinstance(t, list) for t in tests)
    return [float(d) for d in difficulty]


def scaled_difficulty(completions, difficulty, scale, **kwargs):
    return [scale * float(d) for d in difficulty]


half_difficulty = functools.partial(scaled_difficulty, scale=0.5)  # TRL names it scaled_difficulty
"""


def test_a_reward_by_import_path_reads_the_datasets_own_columns_and_trls_reward_by_name_trains(
    tmp_path, monkeypatch, caplog
):
    (tmp_path / "column_rewards.py").write_text(DIFFICULTY_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    questions = tmp_path / "graded.jsonl"
    rows = [
        {"problem": f"What is {i} + {i}?", "final_answer": str(2 * i), "difficulty": i, "tests": [str(2 * i)]}
        for i in range(1, 9)
    ]
    questions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = _recipe(
        tmp_path,
        f"dataset_name: {questions}\nquestion_column: problem\nanswer_column: final_answer\n"
        "reward_funcs: [correctness, column_rewards:difficulty_reward, accuracy_reward, "
        "column_rewards:half_difficulty]\n",
    )
    out = tmp_path / "run"
    train.main([
        "--config", str(recipe), "--output_dir", str(out), "--max_steps", "1", "--save_strategy", "no",
        "--max_completion_length", "8",
    ])  # fmt: skip
    records = pd.read_parquet(out / "completions" / "completions_00001.parquet")
    assert {"difficulty_reward", "accuracy_reward", "correctness_reward"} <= set(records)
    assert set(records["difficulty_reward"]) <= {float(i) for i in range(1, 9)}
    assert (records["scaled_difficulty"] == records["difficulty_reward"] / 2).all()
    # The batch arithmetic logged before training counts the rows as loaded (no dataset_num_rows here).
    assert re.search(r"rounds per epoch +\d+\n", caplog.text), caplog.text[-2000:]


def test_a_reward_needing_a_column_the_data_lacks_stops_before_the_model_loads(tmp_path, monkeypatch):
    (tmp_path / "column_rewards.py").write_text(DIFFICULTY_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    questions = tmp_path / "plain.jsonl"
    questions.write_text(
        "".join(json.dumps({"problem": f"{i} + {i}?", "solution": str(2 * i)}) + "\n" for i in range(8))
    )
    recipe = _recipe(
        tmp_path,
        f"dataset_name: {questions}\nquestion_column: problem\nanswer_column: solution\n"
        "reward_funcs: [correctness, column_rewards:difficulty_reward]\n",
    )

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(train, "load_model", no_model)
    with pytest.raises(
        SystemExit,
        match=r"reward function 'difficulty_reward' needs `difficulty`, `tests`, "
        r"which no column .* receive the columns \['answer', .*'question', .*\]",
    ):
        train.main(["--config", str(recipe), "--output_dir", str(tmp_path / "run"), "--max_steps", "1"])


# -- All together: the tiny model as a base model, trained for one round ------------------------------


def test_a_base_model_with_chatml_a_system_prompt_a_mixture_and_trl_rewards_trains(
    two_sets, base_model_dir, tmp_path
):
    recipe = _recipe(
        tmp_path,
        f"""
chat_template: chatml
system_prompt: "You are terse."
templates: [qwen-math, open-r1]
reward_funcs: [correctness, rewards.registry.format_reward, accuracy_reward, think_format_reward]
dataset_mixture:
  datasets:
    - path: {two_sets["algebra"]}
      question_column: problem
      answer_column: final_answer
    - path: {two_sets["geometry"]}
""",
    )
    out = tmp_path / "run"
    train.main([
        "--config", str(recipe), "--model_name_or_path", str(base_model_dir), "--output_dir", str(out),
        "--max_steps", "2", "--save_strategy", "no", "--max_completion_length", "8",
    ])  # fmt: skip
    records = pd.read_parquet(out / "completions" / "completions_00001.parquet")
    assert {"accuracy_reward", "think_format_reward", "format_reward", "correctness_reward"} <= set(records)
    assert records["prompt"].str.startswith("<|im_start|>system\nYou are terse.\n\n").all()
    assert set(records["uid"].str.split(":").str[0]) <= {"0", "1"}
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).chat_template == CHATML_TEMPLATE  # saved with the model
    card = (out / "README.md").read_text()
    assert "algebra.jsonl" in card and "geometry" in card


# -- The example recipe and the doc -------------------------------------------------------------------


def test_the_example_recipe_dry_runs_from_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "prompt_aug.train", "--config", str(EXAMPLE), "--dry_run"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "questions per round             16" in done.stdout
        and "rounds per epoch                250" in done.stdout
    )


def test_the_soft_overlong_penalty_follows_the_recipes_completion_length():
    # trl grpo fixes 1280 and 256: at a limit of 3072 every answer past 1024 tokens would lose reward.
    (overlong,) = get_reward_funcs(
        ["get_soft_overlong_punishment"], max_completion_length=3072, soft_punish_cache=512
    )
    lengths = [2000, 2560, 2816, 3072]
    scores = overlong(["x"] * 4, completion_ids=[[1] * n for n in lengths], answer=["4"] * 4)
    assert scores == [0.0, 0.0, -0.5, -1.0]
    # Unset, the ramp is 256 tokens, or a quarter of a shorter limit: 8 of 32.
    (short,) = get_reward_funcs(["get_soft_overlong_punishment"], max_completion_length=32)
    scores = short(["x"] * 3, completion_ids=[[1] * n for n in (24, 28, 32)], answer=["4"] * 3)
    assert scores == [0.0, -0.5, -1.0]
    # Through the recipe: the key is checked against the length, in the dry run too.
    with pytest.raises(SystemExit, match="soft_punish_cache 4096 must be above 0 and below max_completion"):
        train.main(["--config", str(EXAMPLE), "--dry_run", "--soft_punish_cache", "4096"])


def test_the_example_recipe_sets_what_the_doc_explains():
    script_args, args, _, _ = train.parse_args(["--config", str(EXAMPLE), "--dry_run"])
    first, second = script_args.dataset_mixture.datasets
    assert (first.question_column, first.answer_column) == ("problem", "final_answer")
    assert second.dataset_levels == ["Level 4", "Level 5"] and first.fraction == second.fraction == 0.5
    assert script_args.chat_template == "chatml" and args.system_prompt
    assert "get_soft_overlong_punishment" in script_args.reward_funcs
    assert args.max_completion_length == 1280 and script_args.soft_punish_cache == 256
    doc = DOC.read_text()
    assert "recipes/examples/your_model_your_data.yaml" in doc
    keys = ("chat_template", "system_prompt", "dataset_mixture", "question_column", "templates_file")
    for key in (*keys, *TRL_REWARDS):
        assert f"`{key}`" in doc or f"{key}:" in doc, key


def test_each_mixture_the_doc_shows_is_one_the_recipe_parser_takes():
    import re

    import yaml

    from prompt_aug.mixture import dataset_mixture

    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    mixtures = [yaml.safe_load(b)["dataset_mixture"] for b in blocks if b.startswith("dataset_mixture:")]
    assert mixtures, "the doc shows no dataset_mixture block"
    for mixture in mixtures:
        config = dataset_mixture(mixture)  # raises, naming the key, on what a recipe could not hold
        assert len(config.datasets) == len(mixture["datasets"])


def test_a_lora_runs_saved_adapter_keeps_the_recipes_stop_tokens(tmp_path):
    """A PEFT model saves its adapter alone; its folder (and each checkpoint's) also gets the generation
    config with the recipe's stop_tokens, and the evaluation's hf backend stops where training stopped."""
    from prompt_aug.evaluation.backends import HFBackend

    out = tmp_path / "lora"
    train.main(["--config", str(SMOKE), "--output_dir", str(out), "--use_peft", "true", "--lora_r", "4",
                "--lora_target_modules", "q_proj", "v_proj", "--stop_tokens", "<|im_start|>",
                "--save_strategy", "steps", "--save_steps", "2"])  # fmt: skip
    checkpoint = next(out.glob("checkpoint-*"))
    for folder in (out, checkpoint):
        assert (folder / "adapter_config.json").is_file() and (folder / "generation_config.json").is_file()
        backend = HFBackend.load(str(folder), "float32", stop="eos")
        start = backend.tokenizer.convert_tokens_to_ids("<|im_start|>")
        assert start in backend.stop_ids, folder


def test_a_checkpoint_resumes_only_under_the_peft_settings_it_was_trained_with(tmp_path):
    """A LoRA run's checkpoint resumed without use_peft, or with another lora_r, stops before loading in one
    line naming the keys (the Trainer failed deep in loading weights or the optimizer); full weights
    resumed with use_peft too; the run's own settings resume."""
    from prompt_aug.cli import UsageError, check_resume_peft

    out = tmp_path / "lora"
    lora = ["--use_peft", "true", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"]
    base = ["--config", str(SMOKE), "--output_dir", str(out), "--save_strategy", "steps", "--save_steps", "2"]
    train.main([*base, *lora])
    resume = ["--resume_from_checkpoint", "true", "--max_steps", "6"]
    with pytest.raises(SystemExit) as exit_info:
        train.main([*base, *resume])
    message = str(exit_info.value.code)
    assert "holds a LoRA adapter, but use_peft is off" in message and "\n" not in message
    with pytest.raises(SystemExit, match=r"lora_r 8 \(the checkpoint's: 4\)"):
        train.main([*base, *resume, *lora[:2], "--lora_r", "8", *lora[4:]])
    checkpoint = str(next(out.glob("checkpoint-*")))
    with pytest.raises(
        UsageError, match=r"lora_target_modules \['k_proj'\] \(the checkpoint's: \['q_proj', 'v_proj'\]\)"
    ):
        check_resume_peft(checkpoint, ModelConfig(use_peft=True, lora_r=4, lora_target_modules=["k_proj"]))
    check_resume_peft(
        checkpoint, ModelConfig(use_peft=True, lora_r=4, lora_target_modules=["v_proj", "q_proj"])
    )
    check_resume_peft(checkpoint, ModelConfig(use_peft=True, lora_r=4, lora_target_modules=["all-linear"]))
    # PEFT keeps the recipe's config on resume and loads only the weights: another scale would rescale them.
    for key, now, then in (("lora_alpha", 64, 32), ("use_rslora", True, False), ("lora_modules_to_save",
                           ["lm_head"], [])):  # fmt: skip
        with pytest.raises(
            UsageError, match=rf"{key} {re.escape(str(now))} \(the checkpoint's: {re.escape(str(then))}\)"
        ):
            check_resume_peft(checkpoint, ModelConfig(use_peft=True, lora_r=4, **{key: now}))
    full = tmp_path / "full" / "checkpoint-2"
    full.mkdir(parents=True)
    with pytest.raises(UsageError, match="holds full weights, but use_peft is on"):
        check_resume_peft(str(full), ModelConfig(use_peft=True))
    train.main([*base, *resume, *lora])  # the run's own settings
    assert (out / "checkpoint-6").is_dir()


def test_a_mixture_whose_gold_mappings_differ_in_type_reads_each_gold_and_leaves_the_mappings_out(
    tmp_path, tokenizer
):
    # Two verl-layout files: one keeps each gold as text, the other as a list of golds. Their reward_model
    # columns cannot be one type, yet both sources' golds are read.
    for name, golds in (("text", ["3", "5"]), ("lists", [["7"], ["9", "nine"]])):
        pd.DataFrame(
            {
                "prompt": [[{"role": "user", "content": f"{name} question {i}?"}] for i in range(2)],
                "reward_model": [{"ground_truth": g, "style": "rule"} for g in golds],
            }
        ).to_parquet(tmp_path / f"{name}.parquet")
    recipe = _recipe(
        tmp_path,
        f"dataset_mixture:\n  datasets:\n    - path: {tmp_path / 'text.parquet'}\n"
        f"    - path: {tmp_path / 'lists.parquet'}\n",
    )
    rows, report = _load(recipe, tokenizer)
    assert rows["answer"] == [["3"], ["5"], ["7"], ["9", "nine"]]
    assert "reward_model" not in rows.column_names
    assert (
        "column 'reward_model', which holds the gold, has another type in datasets[1] "
        f"({tmp_path / 'lists.parquet'}) than in datasets[0] ({tmp_path / 'text.parquet'}); it is left out "
        "of the mixture (each source's gold is read already)"
    ) in str(report)
