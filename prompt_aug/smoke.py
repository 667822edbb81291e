"""Offline stand-ins for the smoke recipe and the tests: a tiny random Qwen2 model with a small
ChatML tokenizer built in code, and generated math questions with known answers.

Nothing here touches the Hub. The questions are produced by this module (arithmetic, fractions,
linear equations, powers, remainders), written as LaTeX.
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

TINY_MODEL_NAME = "tiny-random-qwen2"
SYNTHETIC_DATASET_NAME = "synthetic"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _frac(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def synthetic_problems(n: int = 256, seed: int = 0) -> list[dict[str, str]]:
    """``n`` generated questions with gold answers, as rows ``{"question", "answer", "uid"}``.

    >>> rows = synthetic_problems(5)
    >>> sorted(rows[0]), len({r["uid"] for r in rows})
    (['answer', 'question', 'uid'], 5)
    """
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            a, b = rng.randint(10, 999), rng.randint(10, 999)
            op = rng.choice(["+", "-", "\\times"])
            value = a + b if op == "+" else a - b if op == "-" else a * b
            question, answer = f"Compute ${a} {op} {b}$.", str(value)
        elif kind == 1:
            a, b, c, d = rng.randint(1, 9), rng.randint(2, 9), rng.randint(1, 9), rng.randint(2, 9)
            question = (
                f"What is $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$? "
                "Express your answer as a common fraction in lowest terms."
            )
            answer = _frac(Fraction(a, b) + Fraction(c, d))
        elif kind == 2:
            a, x, b = rng.randint(2, 12), rng.randint(-20, 20), rng.randint(-30, 30)
            sign = "+" if b >= 0 else "-"
            question = f"Solve for $x$: ${a}x {sign} {abs(b)} = {a * x + b}$."
            answer = str(x)
        elif kind == 3:
            base, exp = rng.randint(2, 9), rng.randint(2, 5)
            question, answer = f"Evaluate ${base}^{{{exp}}}$.", str(base**exp)
        else:
            a, m = rng.randint(100, 9999), rng.randint(3, 17)
            question, answer = f"What is the remainder when ${a}$ is divided by ${m}$?", str(a % m)
        rows.append({"question": question, "answer": answer, "uid": f"synthetic-{seed}-{i:05d}"})
    return rows


def build_tiny_tokenizer(extra_text: list[str] | None = None):
    """A byte-level BPE tokenizer (ChatML chat template, ``<|im_end|>`` as EOS), trained in code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from .templates import load_templates

    corpus = [r["question"] + " " + r["answer"] for r in synthetic_problems(500)]
    for template in load_templates().values():
        corpus += [template.system, template.user, template.prefill, *template.markers]
    corpus += extra_text or []
    corpus += ["Let's think step by step. The final answer is \\boxed{42}. So x = 5, 3/4, 0.25."]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
        padding_side="left",
    )


def build_tiny_model(path: str | Path, seed: int = 0) -> Path:
    """Build (once) and save a tiny random Qwen2 model and its tokenizer under ``path``; return ``path``.

    A later call finds the saved files and returns at once.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 32: vLLM's CPU attention takes 32, 64, ... (not 16)
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tokenizer.pad_token_id,
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
