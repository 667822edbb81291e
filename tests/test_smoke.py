"""The built-in tiny model and its tokenizer, as `prompt_aug.train` loads them from the output folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from prompt_aug import train
from prompt_aug.demo.smoke import (
    addition_problems,
    build_tiny_model,
    build_tiny_tokenizer,
    synthetic_problems,
)
from prompt_aug.models import resolve_model_path

REPO = Path(__file__).resolve().parents[1]
TEXTS = [
    "Compute $12 + 345$.",
    "<|im_start|>user\nWhat is $\\frac{3}{4} + \\frac{1}{2}$?<|im_end|>\n<|im_start|>assistant\n",
    "<think>\n7 + 2 = 9.\n</think>\n<answer>\n\\boxed{9}\n</answer><|im_end|>",
    "Let's verify step by step: 1024 - 17 = 1007, x = -5, café",
]


def test_reloaded_tokenizer_encodes_exactly_as_the_built_one(tiny_model_dir):
    built = build_tiny_tokenizer()
    reloaded = AutoTokenizer.from_pretrained(tiny_model_dir)  # what prompt_aug.train does
    for text in (
        TEXTS + [r["question"] for r in synthetic_problems(50)] + [r["question"] for r in addition_problems()]
    ):
        assert reloaded(text).input_ids == built(text).input_ids, text
        assert reloaded.decode(built(text).input_ids) == text
    assert (
        (reloaded.eos_token, reloaded.pad_token)
        == (built.eos_token, built.pad_token)
        == ("<|im_end|>", "<|endoftext|>")
    )
    messages = [{"role": "user", "content": "Compute $3 + 4$."}]
    assert reloaded.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == built.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _embedding(folder: Path) -> torch.Tensor:
    return load_file(str(folder / "model.safetensors"))["model.embed_tokens.weight"]


def test_tiny_model_cache_is_keyed_by_seed(tmp_path):
    args = ["--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"), "--output_dir", str(tmp_path)]
    _, training_args, model_args, _ = train.parse_args(args + ["--seed", "0"])
    first = Path(resolve_model_path(model_args, training_args))
    seed0 = _embedding(first)
    assert Path(resolve_model_path(model_args, training_args)) == first  # same settings: reused
    assert torch.equal(_embedding(first), seed0)

    _, training_args, model_args, _ = train.parse_args(args + ["--seed", "1"])
    second = Path(resolve_model_path(model_args, training_args))
    assert not torch.equal(_embedding(second), seed0), "a rerun with another seed reused the seed-0 model"
    assert json.loads((second / "build.json").read_text())["seed"] == 1


def test_tiny_model_built_with_another_shape_is_rebuilt(tmp_path):
    folder = tmp_path / "tiny-random-qwen2"
    tokenizer = build_tiny_tokenizer()
    # A folder as an older build left it: another attention shape, no build record.
    Qwen2ForCausalLM(
        Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    ).save_pretrained(folder)  # fmt: skip
    tokenizer.save_pretrained(folder)
    build_tiny_model(folder, seed=0)
    config = AutoConfig.from_pretrained(folder)
    assert (config.num_attention_heads, config.num_key_value_heads) == (2, 1)


def test_tiny_model_keeps_its_shape(tiny_model_dir):
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert (config.hidden_size, config.num_hidden_layers) == (64, 2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (2, 1)


def test_smoke_recipe_turns_gradient_checkpointing_off():
    training_args = train.parse_args(["--config", str(REPO / "recipes/smoke/tiny_cpu.yaml")]).training_args
    assert training_args.gradient_checkpointing is False
    training_args = train.parse_args(["--config", str(REPO / "recipes/smoke/learn_cpu.yaml")]).training_args
    assert training_args.gradient_checkpointing is False


def test_the_learning_recipe_builds_its_own_model_shape_beside_the_smoke_one(tmp_path):
    args = ["--config", str(REPO / "recipes/smoke/learn_cpu.yaml"), "--output_dir", str(tmp_path)]
    _, training_args, model_args, _ = train.parse_args(args)
    folder = Path(resolve_model_path(model_args, training_args))
    assert folder == tmp_path / "small-random-qwen2"
    config = AutoConfig.from_pretrained(folder)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (128, 4, 4)
    assert config.hidden_size // config.num_attention_heads == 32  # a head size vLLM's CPU attention takes
    with pytest.raises(ValueError, match="no built-in model 'huge-random-qwen2'; the built-in ones are"):
        build_tiny_model(tmp_path / "x", name="huge-random-qwen2")


def test_a_tiny_model_whose_build_record_cannot_be_read_is_rebuilt(tmp_path):
    """A build.json cut short (a build killed while writing it) is no traceback: the folder is rebuilt."""
    folder = build_tiny_model(tmp_path / "tiny-random-qwen2", seed=0)
    seed0 = _embedding(folder)
    (folder / "build.json").write_text('{"fingerprint": "12')
    assert build_tiny_model(folder, seed=0) == folder
    assert json.loads((folder / "build.json").read_text())["seed"] == 0
    assert torch.equal(_embedding(folder), seed0)


@pytest.mark.parametrize("record", [None, "{not json", '{"target": "release"}'])
def test_a_folder_of_the_model_name_that_no_build_made_is_refused_and_left_as_it_is(tmp_path, record):
    """A folder of one's own under the built-in model's name (with or without a build.json of another
    program) is not written into: one line names the folder and what to do."""
    folder = tmp_path / "tiny-random-qwen2"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 30}')
    if record is not None:
        (folder / "build.json").write_text(record)
    before = {p.name: p.read_text() for p in folder.iterdir()}
    with pytest.raises(SystemExit) as err:
        train.main(["--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"), "--output_dir", str(tmp_path)])
    message = str(err.value.code)
    assert message == (
        f"prompt-aug-train: error: model_name_or_path tiny-random-qwen2: {folder} holds files that no build "
        "of it wrote, and building the model there would overwrite them; move it, or choose another "
        "--output_dir"
    )
    assert {p.name: p.read_text() for p in folder.iterdir()} == before


def test_a_file_of_the_model_name_is_refused_naming_it(tmp_path):
    from prompt_aug.sources import SourceError

    taken = tmp_path / "tiny-random-qwen2"
    taken.write_text("mine")
    with pytest.raises(SourceError) as err:
        build_tiny_model(taken, seed=0)
    assert str(err.value).startswith(f"model_name_or_path tiny-random-qwen2: {taken} is a file,")
    assert taken.read_text() == "mine"
