"""Offline stand-ins for the smoke recipe and the tests: a tiny random Qwen2 model with a small
ChatML tokenizer built in code, and generated math questions with known answers.

Nothing here touches the Hub. The questions are produced by this module (arithmetic, fractions,
linear equations, powers, remainders), written as LaTeX.
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

from ..templates import CHATML_TEMPLATE  # the tiny models speak ChatML

TINY_MODEL_NAME = "tiny-random-qwen2"
# The random Qwen2 models built in code, by name: (hidden size, attention heads, KV heads). All have 2 layers,
# heads of size 32 (vLLM's CPU attention takes 32, 64, ..., not 16), tied embeddings and the tokenizer below.
TINY_MODELS = {
    TINY_MODEL_NAME: (64, 2, 1),  # 0.11 M parameters: the smoke recipe, the tests and the engine tier
    "small-random-qwen2": (
        128,
        4,
        4,
    ),  # 0.41 M: the learning demo (hidden 64 rarely learns its task's working)
}
SYNTHETIC_DATASET_NAME = "synthetic"
ADDITION_DATASET_NAME = "synthetic-addition"
DIGIT_SUMS_DATASET_NAME = "synthetic-digit-sums"  # the real-model recipe (recipes/smollm2-135m)
BUILTIN_DATASETS = (SYNTHETIC_DATASET_NAME, ADDITION_DATASET_NAME, DIGIT_SUMS_DATASET_NAME)  # never fetched
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BUILD_RECORD = "build.json"  # what built a model folder (`build_tiny_model`)
# The files a build writes (the model's, the tokenizer's, the record); a folder with others is not a build's.
BUILD_FILES = frozenset(
    {
        BUILD_RECORD, "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json", "added_tokens.json",
        "vocab.json", "merges.txt",
    }
)  # fmt: skip


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


def addition_problems(max_sum: int = 9) -> list[dict[str, str]]:
    """Every "Compute $a + b$." with digits ``a``, ``b`` and ``a + b <= max_sum`` (55 rows for 9).

    The task of the learning demo (``recipes/smoke/learn_cpu.yaml``): small enough for the tiny model.

    >>> rows = addition_problems()
    >>> len(rows), rows[7]
    (55, {'question': 'Compute $0 + 7$.', 'answer': '7', 'uid': 'addition-0-7'})
    """
    return [
        {"question": f"Compute ${a} + {b}$.", "answer": str(a + b), "uid": f"addition-{a}-{b}"}
        for a in range(10)
        for b in range(10)
        if a + b <= max_sum
    ]


def digit_sum_problems() -> list[dict[str, str]]:
    """Every "What is a + b?" with digits ``1 <= a <= b <= 9`` (45 rows), in plain words as a user asks.

    The task of ``recipes/smollm2-135m/prompt_aug_cpu.yaml``: SmolLM2-135M-Instruct answers about one in
    three right when sampled at temperature 0.7 (0.33, lenient; the recipe's header has the measurement).

    >>> rows = digit_sum_problems()
    >>> len(rows), rows[0], rows[-1]["answer"]
    (45, {'question': 'What is 1 + 1?', 'answer': '2', 'uid': 'digit-sum-1-1'}, '18')
    """
    return [
        {"question": f"What is {a} + {b}?", "answer": str(a + b), "uid": f"digit-sum-{a}-{b}"}
        for a in range(1, 10)
        for b in range(a, 10)
    ]


def build_tiny_tokenizer(extra_text: list[str] | None = None):
    """A small byte-level BPE `Qwen2Tokenizer` (ChatML chat template, ``<|im_end|>`` as EOS), trained in code.

    It uses Qwen2's own normalizer and pre-tokenizer (digits split one by one), so the copy that
    `AutoTokenizer` reloads from a Qwen2 model folder (always as `Qwen2Tokenizer`) encodes exactly as
    this one does.
    """
    import json

    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from ..templates import load_templates

    corpus = [r["question"] + " " + r["answer"] for r in synthetic_problems(500)]
    for template in load_templates().values():
        corpus += [template.system, template.user, template.prefill, *template.markers]
    corpus += extra_text or []
    corpus += ["Let's think step by step. The final answer is \\boxed{42}. So x = 5, 3/4, 0.25."]
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    trained = json.loads(bpe.to_str())["model"]
    return Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(m) for m in trained["merges"]],
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>"],
        chat_template=CHATML_TEMPLATE,
        padding_side="left",
    )


def build_tiny_model(path: str | Path, seed: int = 0, name: str = TINY_MODEL_NAME) -> Path:
    """Build and save the random Qwen2 model ``name`` (a key of `TINY_MODELS`) and its tokenizer under
    ``path``.

    Returns ``path``. The folder is a cache keyed by what built it: ``build.json`` records a
    fingerprint of the seed, the model config and the tokenizer. A later call with the same
    fingerprint returns at once; a folder built with another seed, shape or tokenizer (or by an
    older version without ``build.json``, or one whose ``build.json`` cannot be read) is rebuilt in
    place. A folder that no build made (`earlier_build`) is left as it is.

    Raises:
        SourceError: ``path`` is a file, or a folder holding files no build wrote; one line naming it.
    """
    import hashlib
    import json
    import logging

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if name not in TINY_MODELS:
        raise ValueError(f"no built-in model {name!r}; the built-in ones are {', '.join(TINY_MODELS)}")
    hidden, heads, kv_heads = TINY_MODELS[name]
    path = Path(path)
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    built_from = {
        "seed": seed,
        "config": config.to_dict(),
        "tokenizer": tokenizer.backend_tokenizer.to_str(),
        "chat_template": tokenizer.chat_template,
    }
    fingerprint = hashlib.sha256(json.dumps(built_from, sort_keys=True, default=str).encode()).hexdigest()[
        :16
    ]
    record = build_record(path)
    if record is not None and record.get("fingerprint") == fingerprint:
        return path
    if record is None and not earlier_build(path):
        from ..sources import SourceError

        what = "is a file" if path.is_file() else "holds files that no build of it wrote"
        raise SourceError(
            f"model_name_or_path {name}: {path} {what}, and building the model there would overwrite them; "
            "move it, or choose another --output_dir"
        )
    if (path / "config.json").is_file():
        logging.getLogger("prompt_aug").info("rebuilding %s: it was built from other settings", path)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tokenizer.pad_token_id,
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / BUILD_RECORD).write_text(json.dumps({"fingerprint": fingerprint, "seed": seed}, indent=2) + "\n")
    return path


def build_record(path: str | Path) -> dict | None:
    """What ``build.json`` in ``path`` records of the build that made the folder; None where there is no such
    file or it cannot be read as one (another program's ``build.json``, one cut short)."""
    import json

    try:
        record = json.loads((Path(path) / BUILD_RECORD).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) and "fingerprint" in record else None


def earlier_build(path: str | Path) -> bool:
    """Whether ``path`` may be rebuilt without a readable ``build.json``: missing, empty, or holding only the
    files a build writes, with a two-layer Qwen2 configuration if any (as an older build, or one killed
    before it wrote its record, leaves it)."""
    import json

    folder = Path(path)
    if not folder.exists():
        return True
    if not folder.is_dir() or any(not p.is_file() or p.name not in BUILD_FILES for p in folder.iterdir()):
        return False
    if not (folder / "config.json").is_file():
        return True
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    shape = (config.get("model_type"), config.get("num_hidden_layers")) if isinstance(config, dict) else None
    return shape == ("qwen2", 2)
