"""The reasoning-template bank: load, validate and render templates.

Templates are data (``templates.yaml`` beside this file, or a user's own YAML file of the same
shape). A template renders through the tokenizer's own chat template, then its assistant prefill
is appended, so the bank works with any chat model.

>>> bank = load_templates()
>>> len(bank), bank["open-r1-teacher"].prefill
(13, '<think>\\n')
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from rewards.formats import ANSWER_RULES

# Tokens that end a completion, in training (the `stop_tokens` recipe key) and in evaluation: the end of a
# ChatML turn and the end of text.
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")

DEFAULT_TEMPLATES_FILE = Path(__file__).with_name("templates.yaml")
DEFAULT_EVAL_TEMPLATE = "qwen-math"
QUESTION_SLOT = "{question}"
# The chat template the `chat_template: chatml` recipe key names: ChatML, as Qwen and SmolLM2 use it.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
NAMED_CHAT_TEMPLATES = {"chatml": CHATML_TEMPLATE}
NO_CHAT_TEMPLATE_HINT = (
    "set `chat_template` in the recipe: `chatml`, a Jinja template, or the path of a .jinja file"
)
RENDER_FIX_HINT = (
    "set `chat_template` to one that renders it (e.g. `chatml`), or draw only templates this one renders "
    "(`templates`, `templates_file`, `eval_template`)"
)
_FIELDS = {"name", "system", "user", "prefill", "answer", "markers"}
# Arguments of ``apply_chat_template`` that `Template.render` sets itself (``chat_template_kwargs`` may not).
RENDERER_KEYS = ("conversation", "tokenize", "add_generation_prompt")


class TemplateError(ValueError):
    """A template is malformed; the message names it."""


class RepeatedKeyError(yaml.YAMLError):
    """A YAML mapping of a templates file sets one key twice (YAML itself would keep the last silently)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that repeats one of its own keys (`RepeatedKeyError`). Keys
    brought in by a merge (``<<: *anchor``) may be set again, as YAML's merge allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
            except TypeError:  # unhashable: SafeLoader refuses it in its own words
                continue
            if repeated:
                line = key_node.start_mark.line + 1
                raise RepeatedKeyError(
                    f"line {line}: {_entry_label(node)} sets `{key}` twice; start each template with its own "
                    f"`- name:` list item, or keep one `{key}`"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _entry_label(node: yaml.MappingNode) -> str:
    """A mapping of a templates file as a message names it: ``template 'a' (from line 1)``."""
    names = [v.value for k, v in node.value if k.value == "name" and isinstance(v, yaml.ScalarNode)]
    what = f"template {names[0]!r}" if names else "the entry"
    return f"{what} (from line {node.start_mark.line + 1})"


@dataclass(frozen=True)
class Template:
    """One reasoning format.

    Attributes:
        name: Unique id; stored in the ``template`` column of augmented rows.
        system: System-turn text ("" for no system turn).
        user: User-turn text with exactly one ``{question}`` slot.
        prefill: Text the assistant turn starts with ("" for none).
        answer: ``"boxed"`` (last ``\\boxed{}``) or ``"tag"`` (last ``\\boxed{}`` inside ``<answer>``).
        markers: Format markers, each expected exactly once in a completion.
    """

    name: str
    system: str
    user: str
    prefill: str = ""
    answer: str = "boxed"
    markers: tuple[str, ...] = field(default_factory=tuple)

    def opening(self, tokenizer: Any, **chat_template_kwargs: Any) -> str:
        """What a completion under this template continues: what the chat template adds after the
        conversation (its generation prompt: ``<|im_start|>assistant\\n``, an R1 distill's ``<think>\\n``,
        Qwen3's ``<think>\\n\\n</think>`` with thinking off), then the prefill `render` adds to it."""
        messages = self.messages("What is 1 + 1?")
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **chat_template_kwargs
        )
        tail = self._generation_prompt(messages, text, tokenizer, chat_template_kwargs)
        return tail + self._prefill_after(tail)

    def _generation_prompt(
        self, messages: list[dict[str, str]], text: str, tokenizer: Any, chat_template_kwargs: dict[str, Any]
    ) -> str:
        """What the chat template adds after the conversation in ``text``, its render of ``messages`` with a
        generation prompt ("" where that render does not begin with the conversation's own)."""
        conversation = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=False, **chat_template_kwargs
        )
        return text[len(conversation) :] if text.startswith(conversation) else ""

    def _prefill_after(self, generation_prompt: str) -> str:
        """The prefill to add after ``generation_prompt``: none where that already ends with it."""
        prefill = self.prefill
        return "" if prefill.strip() and generation_prompt.rstrip().endswith(prefill.strip()) else prefill

    def markers_to_write(self, opening: str) -> tuple[str, ...]:
        """The `markers` a completion is to write after ``opening`` (`opening`): all but the first ones that
        the opening already writes, in their order (the completion continues them, and would score only by
        writing them again).

        >>> t = Template("t", "", "{question}", markers=("<think>\\n", "\\n</think>\\n", "<answer>"))
        >>> t.markers_to_write("<|assistant|><think>\\n"), t.markers_to_write("<|assistant|>")[0]
        (('\\n</think>\\n', '<answer>'), '<think>\\n')
        >>> t.markers_to_write("<|assistant|><think>\\n\\n</think>\\n\\n")  # thinking switched off
        ('<answer>',)
        """
        at, written = 0, 0
        for marker in self.markers:
            found = opening.find(marker.strip(), at) if marker.strip() else -1
            if found < 0:
                break
            at, written = found + len(marker.strip()), written + 1
        return self.markers[written:]

    def messages(self, question: str) -> list[dict[str, str]]:
        """The chat messages for ``question`` (without the prefill)."""
        turns = [{"role": "system", "content": self.system}] if self.system else []
        turns.append({"role": "user", "content": self.user.replace(QUESTION_SLOT, question)})
        return turns

    def render(self, question: str, tokenizer: Any, **chat_template_kwargs: Any) -> str:
        """The full prompt text: the tokenizer's chat template with a generation prompt, then the prefill,
        unless the generation prompt already ends with it (a chat template that opens ``<think>`` itself, as
        DeepSeek-R1 distills' do, gets no second one).

        ``chat_template_kwargs`` go to ``apply_chat_template`` (e.g. ``enable_thinking=False``); the
        `RENDERER_KEYS` among them are refused (`TemplateError`).
        """
        if problem := renderer_keys_refusal(chat_template_kwargs):
            raise TemplateError(problem)
        messages = self.messages(question)
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **chat_template_kwargs
        )
        prefill = self.prefill
        if prefill.strip() and text.rstrip().endswith(prefill.strip()):
            # Already there only where the generation prompt (what the chat template adds after the
            # conversation) ends with it, not where the question happens to end so.
            prefill = self._prefill_after(
                self._generation_prompt(messages, text, tokenizer, chat_template_kwargs)
            )
        # Tokenizers that add a BOS token on their own (Llama, Gemma) would otherwise get it twice,
        # once from the chat template and once when TRL tokenizes this text.
        bos = getattr(tokenizer, "bos_token", None)
        if bos and text.startswith(bos) and tokenizer("").input_ids[:1] == [tokenizer.bos_token_id]:
            text = text[len(bos) :]
        return text + prefill


def with_opened_markers(template: Template, tokenizer: Any, **chat_template_kwargs: Any) -> Template:
    """``template`` with the markers a completion is to write under ``tokenizer``'s chat template
    (`Template.markers_to_write`), as training's rows carry them, so that an evaluation's format score is
    training's. A template that does not render is returned as it is: rendering it says why."""
    try:
        opening = template.opening(tokenizer, **chat_template_kwargs)
    except Exception:  # noqa: BLE001 - the chat template's own error, raised where the prompts are rendered
        return template
    markers = template.markers_to_write(opening)
    return template if markers == template.markers else dataclasses.replace(template, markers=markers)


def renderer_keys_refusal(chat_template_kwargs: Any, name: str | None = "chat_template_kwargs") -> str | None:
    """Why ``chat_template_kwargs`` cannot render a prompt (it sets one of the `RENDERER_KEYS`), or ``None``;
    the reason starts with ``name`` unless it is ``None``.

    >>> renderer_keys_refusal({"enable_thinking": False}) is None
    True
    >>> renderer_keys_refusal({"add_generation_prompt": False})
    "chat_template_kwargs: 'add_generation_prompt' is set by the prompt rendering itself; leave it out"
    """
    taken = [key for key in RENDERER_KEYS if key in (chat_template_kwargs or {})]
    if not taken:
        return None
    return f"{name + ': ' if name else ''}{taken[0]!r} is set by the prompt rendering itself; leave it out"


def empty_tokenizer_problem(tokenizer: Any) -> str | None:
    """Why ``tokenizer`` cannot read prompts, or ``None``. A model folder saved without its tokenizer files
    (``model.save_pretrained`` alone) loads in transformers as a tokenizer of an empty vocabulary that
    turns every text into no tokens at all; training and evaluation would run on empty prompts."""
    if tokenizer("1 + 1 = 2", add_special_tokens=False)["input_ids"]:
        return None
    return (
        "its tokenizer turns text into no tokens (no tokenizer files beside the weights?); save the "
        "tokenizer into that folder (tokenizer.save_pretrained) or point at a folder that has one"
    )


def chat_template_text(value: str) -> str:
    """The Jinja text of a ``chat_template`` recipe value: a name of `NAMED_CHAT_TEMPLATES` (``chatml``), the
    path of a file, or the template itself.

    >>> chat_template_text("chatml") == CHATML_TEMPLATE
    True
    """
    if value in NAMED_CHAT_TEMPLATES:
        return NAMED_CHAT_TEMPLATES[value]
    if "{" in value:  # Jinja
        return value
    path = Path(value).expanduser()
    if not path.is_file() and (path.suffix == ".jinja" or "/" in value or path.exists()):
        what = "a folder" if path.is_dir() else "no such file"
        raise TemplateError(
            f"chat_template: {what} {value!r} (resolved to {path.resolve()}); give the path of a .jinja "
            f"file, a named template ({', '.join(NAMED_CHAT_TEMPLATES)}) or the Jinja text"
        )
    if not path.is_file():
        raise TemplateError(
            f"chat_template: {value!r} is neither a named template ({', '.join(NAMED_CHAT_TEMPLATES)}), a "
            "file, nor a Jinja template"
        )
    return path.read_text()


def _parse_entry(entry: Any, index: int, source: str) -> Template:
    if not isinstance(entry, dict) or "name" not in entry:
        raise TemplateError(f"{source}: entry #{index} must be a mapping with a `name`, got {entry!r}")
    name = entry["name"]
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise TemplateError(
            f"{source}: entry #{index} has `name` {name!r}; it must be non-empty text without '/' (it names "
            "the template's metrics, templates/<name>/...)"
        )
    unknown = set(entry) - _FIELDS
    if unknown:
        raise TemplateError(
            f"template {name!r} ({source}): unknown field(s) {sorted(unknown)}; allowed: {sorted(_FIELDS)}"
        )
    if entry.get("user") is None:  # absent, or `user:` with nothing after it
        raise TemplateError(
            f"template {name!r} ({source}): missing `user` (text with a {QUESTION_SLOT} slot)"
        )
    for key in ("user", "system", "prefill"):
        value = entry.get(key)
        if value is not None and not isinstance(value, str):
            hint = f'; quote it: {key}: "{{question}} ..."' if isinstance(value, dict) else ""
            raise TemplateError(
                f"template {name!r} ({source}): `{key}` must be text, got {type(value).__name__} "
                f"{value!r}{hint}"
            )
    user = entry["user"]
    if user.count(QUESTION_SLOT) != 1:
        raise TemplateError(
            f"template {name!r} ({source}): `user` must contain {QUESTION_SLOT} exactly once, "
            f"found {user.count(QUESTION_SLOT)}"
        )
    answer = entry.get("answer", "boxed")
    if answer not in ANSWER_RULES:
        raise TemplateError(
            f"template {name!r} ({source}): `answer` must be one of {ANSWER_RULES}, got {answer!r}"
        )
    if QUESTION_SLOT in str(entry.get("system") or "") + str(entry.get("prefill") or ""):
        raise TemplateError(
            f"template {name!r} ({source}): {QUESTION_SLOT} is filled in `user` only; remove it from "
            "`system` and `prefill`"
        )
    markers = entry.get("markers") or []
    if not isinstance(markers, list) or not all(isinstance(m, str) and m for m in markers):
        raise TemplateError(
            f"template {name!r} ({source}): `markers` must be a list of non-empty strings, got {markers!r}"
            + ("; write it as a list: markers: [...]" if isinstance(markers, str) else "")
        )
    repeated = sorted({m for m in markers if markers.count(m) > 1})
    if repeated:
        raise TemplateError(f"template {name!r} ({source}): `markers` lists {repeated} more than once")
    prefill = str(entry.get("prefill") or "")
    # In the prefill, or opening with it (prefill `<think>`, marker `<think>\n`): only a repeat would score.
    prefilled = [
        m for m in markers if m in prefill or (prefill.strip() and m.lstrip().startswith(prefill.strip()))
    ]
    if prefilled:
        raise TemplateError(
            f"template {name!r} ({source}): marker(s) {prefilled} are in the prefill, which the completion "
            "continues rather than repeats, so only a completion that writes them again would score; "
            "remove them from `markers`"
        )
    return Template(
        name=name,
        system=str(entry.get("system") or ""),
        user=user,
        prefill=str(entry.get("prefill") or ""),
        answer=answer,
        markers=tuple(markers),
    )


def load_templates(path: str | Path | None = None, tokenizer: Any = None) -> dict[str, Template]:
    """Load a template bank, keyed by name, in file order.

    Args:
        path: A YAML list of templates; ``None`` loads the 13 built-in ones.
        tokenizer: If given, every template must render with it (a failure names the template).

    Raises:
        TemplateError: On duplicate names, a field set twice in one entry, a missing or repeated
            ``{question}``, a bad field, or a failed render. The message names the template.
    """
    source = Path(path).expanduser() if path is not None else DEFAULT_TEMPLATES_FILE
    if source.is_dir():
        raise TemplateError(f"templates_file: {source} is a folder; give a YAML file of templates")
    if not source.is_file():
        raise TemplateError(
            f"templates_file: no such file {source} (resolved to {source.expanduser().resolve()}: a relative "
            "path is read from the folder the run is launched in); fix the path"
        )
    try:
        with source.open() as handle:  # a stream, so YAML's error names the file
            entries = yaml.load(handle, Loader=_UniqueKeyLoader)
    except RepeatedKeyError as err:
        raise TemplateError(f"{source}: {err}") from None
    except yaml.YAMLError as err:
        raise TemplateError(f"{source}: not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(entries, list) or not entries:
        raise TemplateError(f"{source}: expected a non-empty YAML list of templates")
    bank: dict[str, Template] = {}
    for index, entry in enumerate(entries):
        template = _parse_entry(entry, index, str(source))
        if template.name in bank:
            raise TemplateError(f"template {template.name!r} ({source}): duplicate name")
        bank[template.name] = template
    if tokenizer is not None:
        check_renders(bank.values(), tokenizer)
    return bank


def check_renders(templates: Any, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
    """Render each template with a probe question (with ``chat_template_kwargs``, as training renders); raise
    `TemplateError` naming the first that fails."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TemplateError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template, and templates "
            f"render through `apply_chat_template`: {NO_CHAT_TEMPLATE_HINT} (in code: set "
            "`tokenizer.chat_template`)"
        )
    for template in templates:
        try:
            text = template.render("What is 1 + 1?", tokenizer, **(chat_template_kwargs or {}))
        except Exception as err:  # the tokenizer's Jinja template can raise anything
            raise TemplateError(
                f"template {template.name!r} failed to render with the tokenizer: {err}; {RENDER_FIX_HINT}"
            ) from err
        if "What is 1 + 1?" not in text:
            raise TemplateError(
                f"template {template.name!r}: the rendered prompt lost the question; {RENDER_FIX_HINT}"
            )


def get_template(name: str, path: str | Path | None = None) -> Template:
    """The template ``name`` of the bank at ``path`` (the built-in bank by default); read from the file.

    >>> get_template("open-r1-teacher").prefill
    '<think>\\n'
    """
    bank = load_templates(path)
    if name not in bank:
        raise TemplateError(
            f"unknown template {name!r} in {path or DEFAULT_TEMPLATES_FILE}; it has {list(bank)}"
        )
    return bank[name]


def select_templates(
    bank: dict[str, Template], names: list[str] | None = None, weights: list[float] | None = None
) -> tuple[list[Template], list[float]]:
    """Pick a subset of ``bank`` (all by default) with sampling weights (uniform by default).

    >>> chosen, w = select_templates(load_templates(), ["qwen-math", "abel"], [3, 1])
    >>> [t.name for t in chosen], w
    (['qwen-math', 'abel'], [0.75, 0.25])
    """
    if names is not None and not list(names):  # a list left empty (all commented out?), not "all"
        raise TemplateError(
            "templates: the list is empty; name at least one template, or leave the key out to draw from "
            "the whole bank"
        )
    names = list(bank) if names is None else list(names)
    missing = [n for n in names if n not in bank]
    if missing:
        raise TemplateError(f"templates: unknown template(s) {missing}; the bank has {list(bank)}")
    if len(set(names)) != len(names):
        raise TemplateError(f"templates: listed twice: {sorted({n for n in names if names.count(n) > 1})}")
    if weights is None:
        weights = [1.0] * len(names)
    if len(weights) != len(names):
        raise TemplateError(f"template_weights has {len(weights)} values for {len(names)} templates {names}")
    if not all(isinstance(w, int | float) and 0 <= w < math.inf for w in weights) or sum(weights) <= 0:
        raise TemplateError(
            f"template_weights must be finite non-negative numbers with a positive sum, got {weights}"
        )
    total = float(sum(weights))
    return [bank[n] for n in names], [w / total for w in weights]


def resolve_eval_template(args: Any, bank: dict[str, Template]) -> Template:
    """The ``eval_template`` of ``args``: from the bank in use, else from the built-in bank (the paper
    evaluates with ``qwen-math`` whatever the training bank).

    Raises:
        TemplateError: the name is in neither bank; the message names the key and lists the bank.
    """
    name = args.eval_template
    builtin = load_templates() if args.templates_file else bank
    template = bank.get(name) or builtin.get(name)
    if template is None:
        where = f"{args.templates_file} or the built-in bank" if args.templates_file else "the bank"
        names = list(dict.fromkeys([*bank, *builtin]))
        raise TemplateError(f"eval_template {name!r} is not in {where}; choose one of {names}")
    return template


def with_system_prompt(template: Template, system_prompt: str | None) -> Template:
    """``template`` with ``system_prompt`` put before its own system text (a blank line between them), or as
    the system turn of a template that has none. The template's own text stays: it says how to lay out and
    mark the answer, which its format reward checks.

    >>> with_system_prompt(Template("t", "Box the answer.", "{question}"), "You are terse.").system
    'You are terse.\\n\\nBox the answer.'
    >>> with_system_prompt(Template("t", "", "{question}"), "You are terse.").system
    'You are terse.'
    """
    if not system_prompt:
        return template
    system = f"{system_prompt}\n\n{template.system}" if template.system else system_prompt
    return replace(template, system=system)


def templates_for(args: Any) -> tuple[list[Template], list[float], Template]:
    """The templates drawn in training, their weights and the evaluation template, from the keys
    ``templates_file``, ``templates``, ``template_weights``, ``eval_template`` and ``prompt_augmentation``
    (off: the evaluation template alone), each with ``system_prompt`` put before its system text.

    Raises:
        TemplateError: a bad file, name or weight; the message names the key.
    """
    try:
        bank = load_templates(args.templates_file)
    except TemplateError as err:  # named by its key, so that a recipe's error says where the key was set
        text = str(err)
        if args.templates_file is None or text.startswith("templates_file:"):
            raise
        raise TemplateError(f"templates_file: {text}") from None
    eval_template = with_system_prompt(resolve_eval_template(args, bank), args.system_prompt)
    if not args.prompt_augmentation:
        return [eval_template], [1.0], eval_template
    templates, weights = select_templates(bank, args.templates, args.template_weights)
    return [with_system_prompt(t, args.system_prompt) for t in templates], weights, eval_template
