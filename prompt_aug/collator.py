"""The augmenting collator: rewrite each row of a generation round under a drawn template.

GRPO scores every completion against the other completions of its group, so all rollouts of a
question must see the same template, including when the group is split across processes. TRL's
`RepeatSampler` hands each row to the collator `num_generations` times, possibly on different ranks,
so the draw cannot be random per sample (nor use Python's per-process salted ``hash()``). We draw
from a stable hash of ``(seed, epoch, uid)``: the same on every rank, new each epoch, and
reproduced exactly on resume.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import math
from itertools import accumulate
from typing import Any

from .sources import content_text, is_conversation, last_user_message, other_blocks
from .templates import DEFAULT_EVAL_TEMPLATE, Template

# Columns the collator writes: the template's name and its format rules, which the reward functions
# read (see `rewards.formats`). A row that already has one of them is refused rather than overwritten.
FORMAT_COLUMNS = ("template", "answer_rule", "format_markers")
# What TRL passes every reward function besides a row's columns (it withholds `prompt` and `completion`).
TRL_REWARD_ARGUMENTS = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
)


def image_column(dataset: Any) -> str | None:
    """The column TRL would read as a row's images, which a rendered text prompt cannot carry, or None: an
    ``image`` column (even all None), or an ``images`` one with a row whose list is not empty (TRL ignores a
    column of empty lists). Of a dataset that cannot be read whole (streamed), only an ``image`` column.

    >>> from datasets import Dataset
    >>> image_column(Dataset.from_dict({"prompt": ["2+2?"], "images": [[]]})) is None
    True
    """
    names = getattr(dataset, "column_names", None) or []
    if "image" in names:
        return "image"
    if "images" in names and hasattr(dataset, "__len__") and any(v != [] for v in dataset["images"]):
        return "images"
    return None


def augmentation_refusal(
    train_dataset: Any, eval_dataset: Any, *, tools: Any, environment_factories: Any, rollout_func: Any
) -> str | None:
    """Why prompt augmentation cannot run with these arguments of TRL's trainer, or None. Augmentation hands
    TRL each prompt rendered as text, so it refuses, by name, what TRL runs on a prompt's messages: tools
    (given, or an environment's methods) and environments, whose observations extend the last user turn, and
    a rollout function on a conversational training set (given the messages to template itself); and images
    TRL would hand the model beside the prompt (`image_column`, of the training or an evaluation set) or
    that a first prompt's user turn holds (a later row's stops its round, `row_question`)."""
    given = []
    if environment_factories is not None:  # its methods are among `tools`
        given.append("environment_factory")
    elif tools:
        given.append("tools")
    first = _first_prompt(train_dataset)
    if rollout_func is not None and is_conversation(first):
        given.append("rollout_func (with a conversational dataset)")
    if given:
        return (
            f"{' and '.join(given)} need TRL's conversational prompts, but prompt augmentation hands TRL "
            "each prompt rendered as text; pass args=PromptAugGRPOConfig(..., prompt_augmentation=False) to "
            "train on the dataset's prompts as GRPOTrainer does"
        )
    named = [("train_dataset", train_dataset)]
    if isinstance(eval_dataset, dict):
        named += [(f"eval_dataset[{name!r}]", dataset) for name, dataset in eval_dataset.items()]
    elif eval_dataset is not None:
        named.append(("eval_dataset", eval_dataset))
    for name, dataset in named:
        asked = "question" not in (getattr(dataset, "column_names", None) or [])  # else `prompt` is not asked
        first = _first_prompt(dataset) if asked else None
        message = last_user_message(first) if is_conversation(first) else None
        blocks = other_blocks(message.get("content")) if message is not None else []
        if blocks:
            return f"{name}'s first `prompt` {not_text_message(blocks)}"
        column = image_column(dataset)
        if column is not None:
            return (
                f"{name} has a column {column!r}, which TRL reads as each row's images, but prompt "
                "augmentation hands TRL text prompts, which cannot carry them; remove the column "
                f"(dataset.remove_columns({column!r})), or pass args=PromptAugGRPOConfig(..., "
                "prompt_augmentation=False) to train on the images as GRPOTrainer does"
            )
    return None


def _first_prompt(dataset: Any) -> Any:
    """The ``prompt`` of a dataset's first row, or None (no such column, no rows, or a streamed dataset)."""
    names = getattr(dataset, "column_names", None) or []
    if "prompt" not in names or not hasattr(dataset, "__len__") or not len(dataset):
        return None
    return dataset[0]["prompt"]


def stable_uniform(seed: int, epoch: int, uid: str) -> float:
    """A number in [0, 1) that depends only on ``(seed, epoch, uid)``, identical across processes.

    >>> stable_uniform(0, 0, "q1") == stable_uniform(0, 0, "q1")
    True
    """
    digest = hashlib.blake2b(f"{seed}\x1f{epoch}\x1f{uid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def row_question(row: dict[str, Any]) -> str:
    """The question of a row: its ``question`` column, else its ``prompt`` (text, or the last user turn).

    >>> row_question(
    ...     {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]}
    ... )
    '2+2?'
    """
    if "question" in row:
        if _missing(row["question"]):
            raise ValueError(
                f"a row's `question` is missing ({row['question']!r}); drop the row or fill its question"
            )
        return str(row["question"])
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        message = last_user_message(prompt)
        if message is None:
            raise ValueError(f"the row's `prompt` has no user turn to augment: {prompt!r}")
        blocks = other_blocks(message.get("content"))
        if blocks:
            raise ValueError(f"the row's `prompt` {not_text_message(blocks)}")
        return content_text(message.get("content"))
    raise KeyError(f"row has neither a `question` nor a `prompt` column; it has {sorted(row)}")


def not_text_message(blocks: list[str]) -> str:
    """What a prompt with content ``blocks`` that are not text is told (after the name of the prompt)."""
    return (
        f"has {', '.join(sorted(set(blocks)))} content in its user turn, which the text prompt that "
        "augmentation renders cannot carry; pass prompt_augmentation=False to train on the prompt's messages "
        "as GRPOTrainer does"
    )


def row_uid(row: dict[str, Any], question: str) -> str:
    """The row's ``uid`` column, else (no column, or a missing or empty id) a stable id derived from the
    question text: rows whose ids are all None would otherwise share one template draw.

    >>> row_uid({}, "2+2?") == row_uid({"uid": None}, "2+2?") != row_uid({"uid": float("nan")}, "2+3?")
    True
    """
    given = given_uid(row.get("uid"))
    if given is not None:
        return given
    return "q-" + hashlib.blake2b(question.encode(), digest_size=8).hexdigest()


def given_uid(value: Any) -> str | None:
    """A ``uid`` cell as the row's id, or None where it holds none (None, NaN or empty text).

    >>> given_uid(7), given_uid(""), given_uid(float("nan"))
    ('7', None, None)
    """
    return None if _missing(value) or not str(value) else str(value)


def _missing(value: Any) -> bool:
    """Whether a cell holds no value: None or a float NaN (how pandas and Arrow give an empty cell)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def format_columns(template: Template, opening: str | None = None) -> dict[str, Any]:
    """The columns that carry ``template``'s format rules to the reward functions; given what completions
    continue (`Template.opening`), without the markers it already writes (`Template.markers_to_write`)."""
    return {
        "template": template.name,
        "answer_rule": template.answer,
        "format_markers": list(template.markers if opening is None else template.markers_to_write(opening)),
    }


class PromptAugmentationCollator:
    """Rewrites rows' ``prompt`` under a template drawn per (seed, epoch, uid) and adds its format rules.

    Args:
        templates: The templates to draw from.
        tokenizer: Renders prompts through its chat template.
        weights: Sampling weights (normalised or not); uniform if ``None``.
        seed: The draw seed (use the training seed).
        eval_template: The one template used in eval mode (``training=False``).
        chat_template_kwargs: Extra arguments for ``apply_chat_template`` (TRL's
            ``args.chat_template_kwargs``).

    A row gives its question through ``question``, else through ``prompt`` (text, or messages: the last
    user turn), and its id through ``uid``, else one derived from the question. Each output row has
    ``prompt`` (the rendered text, prefill included), ``question``, ``uid`` and the `FORMAT_COLUMNS`;
    other columns pass through unchanged.
    """

    def __init__(
        self,
        templates: list[Template],
        tokenizer: Any,
        weights: list[float] | None = None,
        seed: int = 0,
        eval_template: Template | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not templates:
            raise ValueError("PromptAugmentationCollator needs at least one template")
        weights = list(weights) if weights is not None else [1.0] * len(templates)
        if len(weights) != len(templates):
            raise ValueError(f"{len(weights)} weights for {len(templates)} templates")
        # `not >=`: NaN is refused too; an infinite weight (or sum) would leave the draw NaN cut-offs
        if any(not 0 <= w < math.inf for w in weights) or not 0 < sum(weights) < math.inf:
            raise ValueError(f"weights {weights}: give finite non-negative numbers with a positive sum")
        self.templates = list(templates)
        self.tokenizer = tokenizer
        self.seed = seed
        total = float(sum(weights))
        self._cumulative = [w / total for w in accumulate(weights)]
        if eval_template is None:
            by_name = {t.name: t for t in templates}
            eval_template = by_name.get(DEFAULT_EVAL_TEMPLATE, templates[0])
        self.eval_template = eval_template
        named: dict[str, Template] = {}
        for template in (*self.templates, eval_template):
            known = named.setdefault(template.name, template)
            if known != template:  # rows carry the name alone: reward prompts and metrics look it up
                fields = [
                    f.name
                    for f in dataclasses.fields(Template)
                    if getattr(known, f.name) != getattr(template, f.name)
                ]
                raise ValueError(
                    f"two templates named {template.name!r} (of templates and eval_template) differ in "
                    f"{', '.join(fields)}; give each its own name"
                )
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._openings: dict[str, str] = {}

    def draw(self, uid: str, epoch: int = 0) -> Template:
        """The template for row ``uid`` in ``epoch``."""
        u = stable_uniform(self.seed, epoch, str(uid))
        index = min(bisect.bisect_right(self._cumulative, u), len(self.templates) - 1)
        return self.templates[index]

    def opening(self, template: Template) -> str:
        """`Template.opening` under this tokenizer, once per template."""
        if template.name not in self._openings:
            self._openings[template.name] = template.opening(self.tokenizer, **self.chat_template_kwargs)
        return self._openings[template.name]

    def template_named(self, name: str) -> Template:
        """The template called ``name`` among those drawn from and the evaluation template."""
        known = {t.name: t for t in (*self.templates, self.eval_template)}
        if name not in known:
            raise KeyError(
                f"template {name!r} is neither drawn from nor the evaluation template: {list(known)}"
            )
        return known[name]

    def template_for(self, uid: str, epoch: int = 0, training: bool = True) -> Template:
        """The template of row ``uid``: drawn in training, the evaluation template otherwise."""
        return self.draw(uid, epoch) if training else self.eval_template

    def __call__(
        self, rows: list[dict[str, Any]], epoch: int = 0, training: bool = True
    ) -> list[dict[str, Any]]:
        """Return new rows rendered under their templates (see the class docstring for the columns)."""
        out = []
        for row in rows:
            taken = [c for c in FORMAT_COLUMNS if c in row]
            if taken:
                raise ValueError(
                    f"dataset column(s) {taken} would be overwritten by prompt augmentation, which writes "
                    f"{list(FORMAT_COLUMNS)}; rename them or turn augmentation off"
                )
            question = row_question(row)
            uid = row_uid(row, question)
            template = self.template_for(uid, epoch, training)
            prompt = template.render(question, self.tokenizer, **self.chat_template_kwargs)
            out.append(
                {
                    **row,
                    "prompt": prompt,
                    "question": question,
                    "uid": uid,
                    **format_columns(template, self.opening(template)),
                }
            )
        return out

    def conversational_reward_inputs(
        self, rows: list[dict[str, Any]], completions: list[str]
    ) -> tuple[list[list[dict[str, str]]], list[list[dict[str, str]]]]:
        """A conversational dataset's reward inputs: each row's question as the messages of its template (its
        system turn, if any, and its user turn; no prefill), and each completion as TRL's conversational form
        ``[{"role": "assistant", "content": text}]``."""
        prompts = [self.template_named(row["template"]).messages(row["question"]) for row in rows]
        return prompts, [[{"role": "assistant", "content": text}] for text in completions]


def cut_completions(
    completions: list[Any], completion_ids: list[list[int]], cut_ids: set[int], tokenizer: Any
) -> list[Any]:
    """Each completion's text up to the first token of ``cut_ids`` (decoded as TRL decodes: without special
    tokens); completions without one are unchanged. A conversational completion keeps its form."""
    if not cut_ids:
        return completions
    out = []
    for completion, ids in zip(completions, completion_ids, strict=True):
        end = next((k for k, token in enumerate(ids) if token in cut_ids), None)
        if end is not None:
            text = tokenizer.decode(list(ids[:end]), skip_special_tokens=True)
            if isinstance(completion, list):  # TRL's conversational form: the assistant message is last
                completion = [*completion[:-1], {**completion[-1], "content": text}]
            else:
                completion = text
        out.append(completion)
    return out
