"""The stop rule in training: generation runs on to the model's EOS and the trained completion keeps every
generated token; the rewards grade TRL's text, decoded without special tokens, so an ``<|im_end|>`` is dropped
and what follows it graded (as the paper's verl reward decodes it: the paper recipes' ``reward_cut_tokens:
[]``), unless ``reward_cut_tokens`` cuts the text there (our default for other recipes)."""

from __future__ import annotations

import pytest
from chain_model import build_turn_then_eos_model
from datasets import Dataset

from prompt_aug.collator import PromptAugmentationCollator
from prompt_aug.config import PromptAugGRPOConfig
from prompt_aug.templates import load_templates
from prompt_aug.trainer import PromptAugGRPOTrainer
from rewards import correctness_reward


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_turn_then_eos_model(tmp_path_factory.mktemp("chain") / "turn-then-eos")


def _first_round(model_dir, tmp_path, reward_cut_tokens):
    """One optimizer step; returns what the reward functions were handed and the round's rewards."""
    from transformers import AutoTokenizer

    seen: dict = {}

    def recording_reward(completions, completion_ids, **kwargs):
        seen["completions"], seen["completion_ids"] = list(completions), [list(ids) for ids in completion_ids]
        return [0.0] * len(completions)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    collator = PromptAugmentationCollator([load_templates()["qwen-math"]], tokenizer, seed=0)
    args = PromptAugGRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=12,
        max_steps=1, learning_rate=1e-6, report_to="none", save_strategy="no", logging_steps=1, use_cpu=True,
        bf16=False, stop_tokens=[], reward_cut_tokens=reward_cut_tokens or [],
    )  # fmt: skip
    trainer = PromptAugGRPOTrainer(
        model=str(model_dir),
        reward_funcs=[correctness_reward, recording_reward],
        args=args,
        train_dataset=Dataset.from_list([{"question": "What is $4 + 5$?", "answer": "9"}] * 4),
        processing_class=tokenizer,
        prompt_collator=collator,
    )
    trainer.train()
    seen["rewards"] = trainer._round_rewards[:, 0].tolist()
    seen["tokens"] = [tokenizer.convert_ids_to_tokens(ids) for ids in seen["completion_ids"]]
    return seen


def test_rewards_grade_the_text_up_to_im_end_while_the_whole_completion_is_kept(model_dir, tmp_path):
    # The model writes "7", <|im_end|>, "\boxed{9}", <|endoftext|>; it stops only at its EOS, <|endoftext|>.
    whole = ["7", "<|im_end|>", "\\", "boxed", "{", "9", "}", "<|endoftext|>"]
    cut = _first_round(model_dir, tmp_path / "cut", ["<|im_end|>"])
    assert cut["tokens"] == [whole, whole]  # generated (and trained) past <|im_end|>
    assert cut["completions"] == ["7", "7"]  # graded up to it: "7" is wrong (gold 9)
    assert cut["rewards"] == [0.0, 0.0]

    uncut = _first_round(model_dir, tmp_path / "uncut", None)
    assert uncut["tokens"] == [whole, whole]
    assert uncut["completions"] == ["7\\boxed{9}", "7\\boxed{9}"]  # TRL's text: the box after the turn counts
    assert uncut["rewards"] == [1.0, 1.0]
