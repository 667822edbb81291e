"""Starting accuracy of a model on digit sums, sampled under all 13 templates: what a GRPO run starts from.

Renders ``n`` questions "What is a + b?" (question i under template i mod 13), samples one completion each
with hf ``generate`` (temperature, top_p 1, no top-k) and grades it as training does (lenient: the
`correctness` reward) and as evaluation does (strict), with the format score and the share cut at
``--max_tokens``. The numbers in the header of ``recipes/smollm2-135m/prompt_aug_cpu.yaml`` come from::

    python bench/real_model_start.py --task random --seed 0    # any digits 1-9
    python bench/real_model_start.py --task recipe --seed 1    # the recipe's 45 pairs, 1 <= a <= b <= 9

(SmolLM2-135M-Instruct fetched with ``python -m prompt_aug.models fetch smollm2-135m-instruct``; 52
completions of 64 tokens took 300-380 s on 2 cores shared with other jobs.)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # this checkout's prompt_aug, not an installed one

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from prompt_aug.demo.smoke import digit_sum_problems
from prompt_aug.sources import resolve_local_model
from prompt_aug.templates import load_templates
from rewards import grade_batch


def questions(task: str, n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (question, gold) pairs: random digits 1-9 (``random``) or drawn from the recipe's 45
    (``recipe``)."""
    rng = random.Random(seed)
    if task == "recipe":
        rows = digit_sum_problems()
        return [(r["question"], r["answer"]) for r in (rng.choice(rows) for _ in range(n))]
    pairs = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(n)]
    return [(f"What is {a} + {b}?", str(a + b)) for a, b in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model folder or a fetched name")
    parser.add_argument("--task", choices=["random", "recipe"], default="recipe")
    parser.add_argument("--n", type=int, default=52)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max_tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=26)
    args = parser.parse_args()

    path = resolve_local_model(args.model, key="--model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    bank = list(load_templates().values())
    rows = [
        (bank[i % len(bank)], q, gold) for i, (q, gold) in enumerate(questions(args.task, args.n, args.seed))
    ]
    prompts = [template.render(q, tokenizer) for template, q, _ in rows]
    eos = model.generation_config.eos_token_id  # what generate stops at: one id, a list, or none
    stops = {eos} if isinstance(eos, int) else set(eos or [])
    torch.manual_seed(args.seed)
    started, outputs = time.perf_counter(), []
    for start in range(0, len(prompts), args.batch_size):
        batch = tokenizer(prompts[start : start + args.batch_size], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=args.max_tokens, do_sample=args.temperature > 0,
                                 temperature=args.temperature or None, top_p=1.0, top_k=0)  # fmt: skip
        outputs += out[:, batch.input_ids.shape[1] :].tolist()
    seconds = time.perf_counter() - started
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in outputs]
    names, golds = [t.name for t, _, _ in rows], [gold for _, _, gold in rows]
    lenient, strict = grade_batch(texts, golds, names), grade_batch(texts, golds, names, strict=True)
    n = len(rows)
    print(json.dumps({
        "model": args.model, "task": args.task, "n": n, "temperature": args.temperature,
        "max_tokens": args.max_tokens, "seed": args.seed,
        "lenient": round(sum(g.correct for g in lenient) / n, 3),
        "strict": round(sum(g.correct for g in strict) / n, 3),
        "format": round(sum(g.format_score for g in lenient) / n, 3),
        "truncated": round(sum(not stops & set(ids) for ids in outputs) / n, 3),
        "seconds": round(seconds, 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
