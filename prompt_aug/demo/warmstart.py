"""The learning demo's pieces: a supervised warm start before GRPO, and a before/after table.

A random tiny model never answers right, so GRPO sees no reward spread and nothing trains. The
warm start (``warmstart_steps`` > 0) teaches it the task's shape in a few hundred supervised steps:
each example is a question rendered under a template drawn from the bank, with a short correct
answer (``a + b = s.`` then ``\\boxed{s}``) laid out in that template's format only part of the time
(``warmstart_wellformed``). GRPO then has something to improve: the format score and correctness.

With ``before_after: true``, every template is scored on the trained questions and on
``heldout_questions`` questions kept out of both stages, before GRPO and after it; the table is
printed and written to ``before_after.md`` / ``before_after.json`` in ``output_dir``, and the held-out
questions to ``heldout.jsonl`` there (``prompt-aug-eval --benchmarks`` reads it).

Used by `prompt_aug.train` (recipe ``recipes/smoke/learn_cpu.yaml``).
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rewards.grading.grade import grade_batch

from ..evaluation.backends import HFBackend
from ..templates import Template

logger = logging.getLogger("prompt_aug")

_INLINE_MATH = re.compile(r"\$([^$]+)\$")
METRICS = ("correctness", "strict", "format")  # the before/after table's columns, per question set


def target_text(
    template: Template, question: str, answer: str, wellformed: bool, boxed: str | None = None
) -> str:
    """A short completion of ``question`` under ``template`` (after its prefill).

    The reasoning is the question's first ``$...$`` expression and its value ``answer``; the boxed
    answer is ``boxed`` (default: ``answer``, a correct completion).
    Well-formed, the two go around the template's markers: the reasoning before the first closing
    marker (one containing ``</``), the answer before the last one; with no closing marker, the
    markers sit between them. Otherwise the markers are left out.

    >>> from prompt_aug.templates import get_template
    >>> target_text(get_template("open-r1"), "Compute $2 + 3$.", "5", True)
    '<think>\\n2 + 3 = 5.\\n</think>\\n\\n<answer>\\n\\\\boxed{5}\\n</answer>'
    >>> target_text(get_template("lm_eval_prompt1"), "Compute $2 + 3$.", "5", True)
    '2 + 3 = 5. The final answer is: \\\\boxed{5}'
    >>> target_text(get_template("open-r1"), "Compute $2 + 3$.", "5", False)
    '2 + 3 = 5. \\\\boxed{5}'
    >>> target_text(get_template("abel"), "Compute $2 + 3$.", "5", True, boxed="7")
    '2 + 3 = 5. \\\\boxed{7}'
    """
    found = _INLINE_MATH.search(question)
    reasoning = f"{found.group(1).strip()} = {answer}." if found else f"The answer is {answer}."
    boxed = f"\\boxed{{{answer if boxed is None else boxed}}}"
    markers = list(template.markers)
    if not wellformed or not markers:
        return f"{reasoning} {boxed}"
    closing = [i for i, m in enumerate(markers) if "</" in m]
    if not closing:
        return f"{reasoning} {' '.join(markers)} {boxed}"
    text = ""
    for i, marker in enumerate(markers):
        if i == closing[0]:
            text += reasoning
        if i == closing[-1]:
            text += boxed
        text += marker
    return text


def split_heldout(dataset: Any, n: int, seed: int) -> tuple[Any, Any | None]:
    """``(trained, heldout)``: ``n`` questions drawn with ``seed`` set aside (``None`` when ``n`` is 0).

    The draw is over the distinct texts of the ``question`` column: a held-out question keeps its first row,
    and none of its rows is trained on. Where every question is distinct, row ``i`` is question ``i``.
    Raises `prompt_aug.sources.SourceError` (a `ValueError`) when no question would be left to train on.
    """
    if n <= 0:
        return dataset, None
    column = dataset["question"] if "question" in dataset.column_names else range(len(dataset))
    texts = [text if isinstance(text, (str, int)) else repr(text) for text in column]  # hashable
    first: dict[Any, int] = {}
    for i, text in enumerate(texts):
        first.setdefault(text, i)
    if n >= len(first):
        from ..sources import SourceError  # a ValueError the command reports in one line

        rows = f"{len(dataset)} rows" + (f", {len(first)} questions" if len(first) < len(dataset) else "")
        raise SourceError(
            f"heldout_questions={n} leaves no training questions (the dataset has {rows}); lower it"
        )
    distinct = list(first)
    drawn = {distinct[k] for k in random.Random(seed).sample(range(len(distinct)), n)}
    held = sorted(first[text] for text in drawn)
    kept = [i for i, text in enumerate(texts) if text not in drawn]
    return dataset.select(kept), dataset.select(held)


def first_gold(answer: Any) -> str:
    """The answer a warm-start target boxes: the gold, or the first of a row's several acceptable golds.

    >>> first_gold("5"), first_gold(["1/2", "0.5"])
    ('5', '1/2')
    """
    if isinstance(answer, (list, tuple)):
        return str(answer[0]) if answer else ""
    return str(answer)


def draw_targets(
    rows: list[dict[str, Any]],
    templates: list[Template],
    *,
    wellformed: float,
    answer_correct: float,
    seed: int,
) -> Iterator[tuple[int, int, str]]:
    """Endless warm-start examples ``(row index, template index, target text)``, drawn with ``seed``.

    Each draws a row and a template uniformly; the target is in the template's layout with probability
    ``wellformed``, and boxes the row's answer (`first_gold`) with probability ``answer_correct``, else
    another answer of ``rows`` (the working stays right: the model can learn to box what it worked out).

    >>> import itertools
    >>> from prompt_aug.templates import get_template
    >>> rows = [
    ...     {"question": "Compute $2 + 3$.", "answer": "5"},
    ...     {"question": "Compute $1 + 1$.", "answer": "2"},
    ... ]
    >>> draws = draw_targets(rows, [get_template("abel")], wellformed=1.0, answer_correct=0.0, seed=0)
    >>> sorted({text for _, _, text in itertools.islice(draws, 20)})  # every box holds the other answer
    ['1 + 1 = 2. \\\\boxed{5}', '2 + 3 = 5. \\\\boxed{2}']
    """
    rng = random.Random(seed)
    answers = sorted({first_gold(row["answer"]) for row in rows})
    while True:
        i, j = rng.randrange(len(rows)), rng.randrange(len(templates))
        good, right = rng.random() < wellformed, rng.random() < answer_correct
        gold = first_gold(rows[i]["answer"])
        boxed = gold if right or len(answers) < 2 else rng.choice([a for a in answers if a != gold])
        yield i, j, target_text(templates[j], rows[i]["question"], gold, good, boxed=boxed)


def prompt_ids(
    tokenizer: Any,
    rows: list[dict[str, Any]],
    templates: list[Template],
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[list[list[int]]]:
    """The token ids of every row's question under every template, ``[row][template]``, rendered with
    ``chat_template_kwargs`` as training renders them: each prompt is tokenized once (rendering through the
    chat template is the slow part)."""
    kwargs = chat_template_kwargs or {}
    return [
        tokenizer([t.render(row["question"], tokenizer, **kwargs) for t in templates]).input_ids
        for row in rows
    ]


def warm_start(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    templates: list[Template],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    wellformed: float,
    seed: int,
    answer_correct: float = 1.0,
    prompts: list[list[list[int]]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[float]:
    """Supervised steps on ``rows`` (``question``, ``answer``) under random templates; returns the losses.

    The targets come from `draw_targets` (``wellformed``, ``answer_correct``). AdamW with cosine decay
    to 0; the loss is on the completion tokens (and the closing EOS) only. ``prompts``: `prompt_ids` of
    ``rows`` and ``templates`` when the caller has them already; else they are rendered here with
    ``chat_template_kwargs`` (the recipe's, as training renders its prompts).
    """
    from transformers import get_cosine_schedule_with_warmup

    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos

    prompts = prompt_ids(tokenizer, rows, templates, chat_template_kwargs) if prompts is None else prompts
    targets = draw_targets(rows, templates, wellformed=wellformed, answer_correct=answer_correct, seed=seed)
    completions: dict[str, list[int]] = {}

    def example() -> tuple[list[int], list[int]]:
        i, j, text = next(targets)
        if text not in completions:
            completions[text] = tokenizer(text).input_ids + [eos]
        return prompts[i][j], completions[text]

    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    schedule = get_cosine_schedule_with_warmup(optimizer, 0, steps)
    device = next(model.parameters()).device
    model.train()
    losses = []
    for _ in range(steps):
        batch = [example() for _ in range(batch_size)]
        width = max(len(p) + len(c) for p, c in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (p, c) in enumerate(batch):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            labels[i, len(p) : len(p) + len(c)] = torch.tensor(c)
            mask[i, : len(p) + len(c)] = 1
        out = model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            labels=labels.to(device),
            use_cache=False,
        )
        out.loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
    return losses


def warm_start_key(model: Any, tokenizer: Any, rows: list[dict[str, Any]], templates: list[Template], *,
                   prompts: list[list[list[int]]] | None = None, **settings: Any) -> str:  # fmt: skip
    """A digest of everything `warm_start` reads or that changes its floats: the model (class, configuration,
    attention, weights), the tokenizer (the whole of a fast one's definition, its special ids), the prompts as
    token ids (``prompts``, or `prompt_ids` made here) and the answers, the settings (seed included), this
    file, and where it runs (device, the CPU's instruction set, torch's threads, the versions of torch and
    transformers)."""
    import hashlib

    import transformers

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    facts = {
        "model": [
            type(model).__name__,
            model.config.to_json_string(),
            getattr(model.config, "_attn_implementation", None),
        ],
        "tokenizer": backend.to_str() if backend is not None else sorted(tokenizer.get_vocab().items()),
        "special": [tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id],
        "prompts": prompt_ids(tokenizer, rows, templates) if prompts is None else prompts,
        "answers": [row["answer"] for row in rows],
        "templates": [repr(t) for t in templates],  # draw_targets writes the targets from them
        "settings": sorted(settings.items()),
        "code": Path(__file__).read_text(),
        "where": [
            next(model.parameters()).device.type,
            torch.backends.cpu.get_cpu_capability(),
            torch.get_num_threads(),
            torch.__version__,
            transformers.__version__,
        ],
    }
    digest.update(json.dumps(facts, default=str).encode())
    return digest.hexdigest()[:20]


def cached_warm_start(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], templates: list[Template], cache: str | Path,
    chat_template_kwargs: dict[str, Any] | None = None, **settings: Any,
) -> tuple[list[float], Path | None]:  # fmt: skip
    """`warm_start` through the folder ``cache``: the weights it leaves (its losses, torch's random state) are
    saved there
    under `warm_start_key`, and a later run with the same key loads them instead of training. A run making
    the same key holds a lock on it, so a run started beside it (the control of the same seed) waits and
    then loads. The prompts are rendered with ``chat_template_kwargs`` (and keyed as rendered). Returns the
    losses and the file loaded from (None: trained here)."""
    import fcntl

    folder = Path(cache).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    # For the key, and for training on a miss.
    prompts = prompt_ids(tokenizer, rows, templates, chat_template_kwargs)
    key = warm_start_key(model, tokenizer, rows, templates, prompts=prompts, **settings)
    path = folder / f"warmstart-{key}.pt"
    with open(folder / f"warmstart-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when its process dies
        if path.is_file():
            saved = torch.load(path, map_location=next(model.parameters()).device, weights_only=True)
            model.load_state_dict(saved["weights"])
            model.train()  # as warm_start leaves it, and torch's random streams too
            torch.random.set_rng_state(saved["rng"])
            if saved.get("cuda_rng"):
                torch.cuda.set_rng_state_all(saved["cuda_rng"])
            return saved["losses"], path
        losses = warm_start(model, tokenizer, rows, templates, prompts=prompts, **settings)
        partial = path.with_suffix(".partial")
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
        saved = {"weights": model.state_dict(), "losses": losses, "rng": torch.random.get_rng_state(),
                 "cuda_rng": cuda_rng}  # fmt: skip
        torch.save(saved, partial)
        partial.replace(path)  # whole or absent: a run killed while saving leaves no file to load
        return losses, None


def score(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    templates: list[Template],
    *,
    max_tokens: int,
    temperature: float,
    seed: int,
    batch_size: int = 128,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> dict[str, dict[str, float]]:
    """Per template: mean correctness of one sampled answer per row, lenient (the training rule) and
    strict (the paper's evaluation rule: the last ``\\boxed{}``), and its format score. The prompts are
    rendered with ``chat_template_kwargs``, as training renders them."""
    backend = HFBackend(model, tokenizer)
    pairs = [(row, template) for template in templates for row in rows]
    completions: list[str] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        outputs = backend.generate(
            [t.render(r["question"], tokenizer, **(chat_template_kwargs or {})) for r, t in chunk],
            [seed + start],
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=1.0,
            n=1,
        )
        completions += [samples[0][0] for samples in outputs]
    golds, names = [r["answer"] for r, _ in pairs], [t for _, t in pairs]
    lenient, strict = (
        grade_batch(completions, golds, names),
        grade_batch(completions, golds, names, strict=True),
    )
    result: dict[str, dict[str, float]] = {}
    for template in templates:
        mine = [i for i, (_, t) in enumerate(pairs) if t is template]
        result[template.name] = {
            "correctness": sum(bool(lenient[i].correct) for i in mine) / len(mine),
            "strict": sum(bool(strict[i].correct) for i in mine) / len(mine),
            "format": sum(lenient[i].format_score for i in mine) / len(mine),
        }
    return result


@dataclass
class BeforeAfter:
    """Scores of every template on the trained and held-out questions, before and after GRPO."""

    templates: list[Template]
    sets: dict[str, list[dict[str, Any]]]
    max_tokens: int
    temperature: float
    seed: int
    scores: dict[str, dict[str, dict[str, dict[str, float]]]] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # the recipe's, as training renders

    def measure(self, when: str, model: Any, tokenizer: Any) -> None:
        """Score the model now and file it under ``when`` (``"before"`` or ``"after"``).

        The global random state is restored afterwards, so scoring does not change the training run.
        """
        # Generation seeds every CUDA device too (torch.manual_seed); their states come back as well.
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            self.scores[when] = self._score_all(model, tokenizer)

    def _score_all(self, model: Any, tokenizer: Any) -> dict[str, dict[str, dict[str, float]]]:
        return {
            name: score(
                model, tokenizer, rows, self.templates,
                max_tokens=self.max_tokens, temperature=self.temperature, seed=self.seed,
                chat_template_kwargs=self.chat_template_kwargs,
            )
            for name, rows in self.sets.items()
        }  # fmt: skip

    def summary(self, when: str, question_set: str, metric: str, markers_only: bool = False) -> float | None:
        """Mean of ``metric`` over templates (those with format markers only, if asked); None when there is
        no such template."""
        names = [t.name for t in self.templates if t.markers or not markers_only]
        values = [self.scores[when][question_set][n][metric] for n in names]
        return sum(values) / len(values) if values else None

    def table(self) -> str:
        """Markdown: one row per template, then the means; cells are ``before → after``."""
        heads = [(s, m) for s in self.sets for m in METRICS]
        lines = [
            f"Before → after GRPO: mean correctness (`correctness`: the training rule, lenient; `strict`: "
            f"the paper's last `\\boxed{{}}`) and format score of one answer "
            f"per question sampled at temperature {self.temperature:g}, at most {self.max_tokens} tokens; "
            + ", ".join(f"{s}: {len(rows)} questions" for s, rows in self.sets.items())
            + ".",
            "",
            "| template | " + " | ".join(f"{s} {m}" for s, m in heads) + " |",
            "|---|" + "---:|" * len(heads),
        ]

        def cell(before: float, after: float) -> str:
            return f"{before:.2f} → {after:.2f}"

        for t in self.templates:
            cells = [cell(*(self.scores[w][s][t.name][m] for w in ("before", "after"))) for s, m in heads]
            lines.append(f"| {t.name} | " + " | ".join(cells) + " |")
        means = [("**all templates**", False)]
        if any(t.markers for t in self.templates):  # a bank without markers has no such mean
            means.append(("**marker templates**", True))
        for label, markers_only in means:
            cells = [
                cell(*(self.summary(w, s, m, markers_only) for w in ("before", "after"))) for s, m in heads
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def write(self, output_dir: str | Path) -> Path:
        """Write ``before_after.md`` and ``before_after.json`` into ``output_dir``; return the ``.md``
        path."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        means = (False, True) if any(t.markers for t in self.templates) else (False,)  # as `table`
        summary = {
            f"{w}/{s}/{m}{'/marker_templates' if mk else ''}": self.summary(w, s, m, mk)
            for w in self.scores for s in self.sets for m in METRICS for mk in means
        }  # fmt: skip
        (out / "before_after.json").write_text(
            json.dumps({"summary": summary, "scores": self.scores, "questions": self.sets}, indent=2) + "\n"
        )
        (out / "before_after.md").write_text(self.table())
        if "held-out" in self.sets:  # for `prompt-aug-eval --benchmarks OUTPUT_DIR/heldout.jsonl`
            rows = self.sets["held-out"]
            (out / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return out / "before_after.md"


def prepare(
    model: Any, tokenizer: Any, dataset: Any, templates: list[Template], script_args: Any, training_args: Any
) -> tuple[Any, BeforeAfter | None]:
    """Before GRPO: set the held-out questions aside, warm-start the model, score it.

    Returns the training dataset and the `BeforeAfter` to finish after training (``None`` when
    ``before_after`` is off). Does nothing when none of ``warmstart_steps``, ``before_after`` and
    ``heldout_questions`` is set. Without ``before_after``, the held-out questions are kept out of training
    and not scored here (a scorer of one's own draws them again: `split_heldout`, the run's seed).
    """
    if not (script_args.warmstart_steps > 0 or script_args.before_after or script_args.heldout_questions):
        return dataset, None
    dataset, heldout = split_heldout(dataset, script_args.heldout_questions, training_args.seed)
    if heldout is not None and not script_args.before_after:
        logger.info(
            "heldout_questions: %d questions kept out of training and, before_after being off, not scored "
            "in this run (set before_after: true to score them and write heldout.jsonl)",
            len(heldout),
        )
    rows = dataset.to_list()
    kwargs = dict(getattr(training_args, "chat_template_kwargs", None) or {})  # as training renders prompts
    if script_args.warmstart_steps > 0:
        settings = {
            "steps": script_args.warmstart_steps,
            "batch_size": script_args.warmstart_batch_size,
            "learning_rate": script_args.warmstart_learning_rate,
            "wellformed": script_args.warmstart_wellformed,
            "answer_correct": script_args.warmstart_answer_correct,
            "seed": training_args.seed,
        }
        loaded = None
        logger.info(  # it runs for a minute or more on a CPU before GRPO logs anything
            "warm start: %d supervised steps of %d rows before GRPO (or loaded from warmstart_cache)",
            script_args.warmstart_steps,
            script_args.warmstart_batch_size,
        )
        if script_args.cache:
            losses, loaded = cached_warm_start(
                model, tokenizer, rows, templates, script_args.cache, kwargs, **settings
            )
        else:
            losses = warm_start(model, tokenizer, rows, templates, chat_template_kwargs=kwargs, **settings)
        logger.info(
            "warm start: %d steps, loss %.3f → %.3f%s",
            len(losses),
            losses[0],
            sum(losses[-10:]) / len(losses[-10:]),
            f" (loaded from {loaded}: the same model, questions and settings)" if loaded else "",
        )
    if not script_args.before_after:
        return dataset, None
    sets = {"trained": rows}
    if heldout is not None:
        sets["held-out"] = heldout.to_list()
    check = BeforeAfter(
        templates, sets, training_args.max_completion_length, training_args.temperature, training_args.seed,
        chat_template_kwargs=kwargs,
    )  # fmt: skip
    logger.info("before_after: scoring the model before GRPO on %s", ", ".join(sets))
    check.measure("before", model, tokenizer)
    return dataset, check
