"""The model card (``README.md`` in the output folder) written at the end of training and pushed to the Hub.

After ``prompt-aug-eval --model OUT`` has written ``OUT/eval/results.md`` (and, for the robustness run,
``OUT/eval-templates/results.md``), refresh the card's evaluation section, and the ``model-index`` the Hub
shows on the model's page, with ``python -m prompt_aug.model_card OUT``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewards.controls import ACCURACY_MEAN_KEYS

from .records import ACCURACY_KEY, generated_first, is_number
from .templates import DEFAULT_EVAL_TEMPLATE, Template

# The evaluation entry point writes its markdown table here, under the trained model's folder.
EVAL_TABLE_PATH = Path("eval") / "results.md"
# ... and here for the robustness run over all templates (README: ``--template all --output
# OUT/eval-templates``).
ROBUSTNESS_TABLE_PATH = Path("eval-templates") / "results.md"
# Log keys of a run's training accuracy; the card, the console line, the plot and the collapse guard read the
# first a run logs: the share right (`ACCURACY_KEY`), then (logs written before it) the correctness rewards'
# and controls' means.
ACCURACY_KEYS: tuple[str, ...] = (ACCURACY_KEY, *ACCURACY_MEAN_KEYS)
# Each row shows the first of its keys logged: with dynamic sampling, TRL's reward, accuracy and truncation
# cover only the trained groups, and the same metrics over everything generated come first.
_CARD_METRICS = (
    generated_first(["reward"]), generated_first(ACCURACY_KEYS), ("entropy",),
    ("completions/mean_length",), generated_first(["completions/clipped_ratio"]),
)  # fmt: skip
NO_EVALUATION = (
    "No evaluation results yet: run `prompt-aug-eval --model <this model>` (see the project README)."
)
OTHER_WEIGHTS = (
    "`{folder}/` holds an evaluation of other weights than these (an earlier state of this run?): run the "
    "command that made it again with `--overwrite`."
)
UNRECORDED_WEIGHTS = "(`{folder}/settings.json` does not record which weights this evaluation was made by.)"
_EXAMPLE_QUESTION = "What is the remainder when 2024 is divided by 7?"  # the card's "How to prompt"
# The files a model folder keeps its weights in (full weights or a PEFT adapter).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# The paper the method is from, cited in the card's "Citations" beside TRL's entries.
PAPER_BIBTEX = """@misc{lu2026promptaugmentation,
    title         = {{Prompt Augmentation Scales up GRPO Training on Mathematical Reasoning}},
    author        = {Wenquan Lu and Hai Huang and Randall Balestriero},
    year          = 2026,
    eprint        = {2602.03190},
    archivePrefix = {arXiv},
    url           = {https://arxiv.org/abs/2602.03190},
}"""
# Where a README.md of the user's own found in the output folder is kept: transformers' Hub push and the
# ``hf upload`` command a failed push prints leave out names starting with ``_``.
OWN_README = "_README.md"
# The last line of a card training writes: the digest of everything above it, so that a card edited by hand
# since (`edited_card`) is told from one training may write over, and kept.
_SEAL = re.compile(r"^<!-- prompt-aug card sha256:([0-9a-f]{64}) -->$\n?", re.MULTILINE)
# A Hugging Face access token (``hf_`` and letters and digits): the card's recipe shows any as ``hf_***``,
# wherever it stands (``model_init_kwargs: {token: hf_...}``, a comment), beside `cli.hide_tokens`, which
# hides the values of keys ending in ``_token``.
_HF_TOKEN = re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{20,}(?![A-Za-z0-9])")
# The value of a key named ``token`` (``model_init_kwargs: {token: ...}``, JSON's ``{"token": "..."}``), any
# case, whatever its shape: one not shown as hidden already, and no YAML or JSON true, false or null (the
# stored login's token, or none: a value a command must keep). The quotes around a value stay.
_BARE_TOKEN = re.compile(
    r"""(?imx)
    ( (?: ^ | (?<=[{,]) ) [ \t]* (["']?) token \2 [ \t]* : [ \t]* )  # a key (a line's, a mapping's), colon
    (?: (["']) (?! (?:hf_)?\*\*\*\3 ) [^"'\n]+ \3       # a quoted value, not hidden already
      | (?! (?:hf_)?\*\*\* | (?:true|false|null|~) (?![^\s,}\]\#]) )  # or a bare one, nor true, false, null
        [^\s,}\]\#"']+ )
    """
)
# How the recipe's lines for the command-line overrides start (`cli.recipe_text`), one a launch of the run.
OVERRIDES_LINE = "# command-line overrides"
# A heading of the renderer's own (`render_model_card`): a card with it is ours (`readme_owner`).
_TEMPLATE_BANK = "## Template bank"


def weights_fingerprint(folder: str | Path) -> str | None:
    """A short digest of the weights in model ``folder``: each weight file's name and size, and 64 spans of
    4 KiB spread over it (training changes every span; reading them costs milliseconds at any size). None
    where ``folder`` is not a folder (a Hub id) or holds no weight file.

    The evaluation records it in ``settings.json`` so that completions of other weights (a run trained
    further, another model in a folder of the same name) are not taken for these, and the card shows an
    evaluation only if it was made by the weights beside it.
    """
    import hashlib

    folder = Path(folder)
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size};".encode())
        with file.open("rb") as handle:
            for k in range(64):
                handle.seek(size * k // 64)
                digest.update(handle.read(4096))
    return digest.hexdigest()[:16]


@dataclass
class ModelCardInfo:
    """What the card says beyond what the trainer knows."""

    base_model: str
    recipe: str
    templates: list[Template]
    weights: list[float]
    dataset: str
    num_rows: int
    eval_template: str = "qwen-math"
    # The evaluation template as training resolved it (from the bank in use or the built-in one, with the
    # recipe's system_prompt): the card's "How to prompt". None: the bank's template named eval_template.
    prompt_template: Template | None = None
    dataset_id: str | None = None  # the Hub id the card's metadata names, where the data has exactly one
    # Off: the baseline arm, every question under the one template in ``templates`` (`model_card_info`: the
    # recipe's ``prompt_augmentation: false``, or one training template).
    prompt_augmentation: bool = True
    tags: list[str] | None = None  # None: `default_tags`
    # This launch's rounds, a `prompt_aug.batches.BatchArithmetic` (processes, questions and completions per
    # round, rounds planned; not imported here: that module reads the data sources); None: not shown.
    arithmetic: Any = None
    chat_template_kwargs: dict[str, Any] | None = None  # what training rendered the chat template with
    # The transformers class the card's "How to prompt" loads the model with; `PromptAugGRPOTrainer` sets it
    # from its model (`prompt_aug.sources.auto_class_name`): AutoModelForImageTextToText for a vision-language
    # checkpoint loaded whole.
    model_class: str = "AutoModelForCausalLM"

    def __post_init__(self) -> None:
        if self.tags is None:
            self.tags = default_tags(self.prompt_augmentation)


def default_tags(prompt_augmentation: bool) -> list[str]:
    """The card's tags: ``prompt-augmentation`` only for a run that trained with it.

    >>> default_tags(True), default_tags(False)
    (['trl', 'grpo', 'prompt-augmentation', 'math'], ['trl', 'grpo', 'math'])
    """
    return ["trl", "grpo", *(["prompt-augmentation"] if prompt_augmentation else []), "math"]


def model_card_info(
    script_args: Any,
    model_args: Any,
    args: Any,
    recipe: str,
    templates: list[Template],
    weights: list[float],
    num_rows: int,
    prompt_template: Template | None = None,
    arithmetic: Any = None,
) -> ModelCardInfo:
    """What the card says about a recipe's run: base model, recipe text, template bank, dataset, whether
    prompt augmentation was on (``args.prompt_augmentation`` and more than one template in ``templates``: a
    recipe of one, ``templates: [qwen-math]``, is the single-template baseline), the evaluation template as
    training resolved it (``prompt_template``, `templates.templates_for`) with its
    ``args.chat_template_kwargs``, and this launch's rounds (``arithmetic``, `batches.batch_arithmetic`)."""
    config = f" ({script_args.dataset_config})" if script_args.dataset_config else ""
    mixture = script_args.dataset_mixture
    paths = [s.path for s in mixture.datasets] if mixture else [script_args.dataset_name]
    dataset = " + ".join(paths) if mixture else paths[0] + config
    ids = {hub_id_of(path) for path in paths} - {None}
    return ModelCardInfo(
        base_model=model_args.model_name_or_path,
        recipe=recipe,
        templates=templates,
        weights=weights,
        dataset=dataset,
        num_rows=num_rows,
        eval_template=args.eval_template,
        dataset_id=ids.pop() if len(ids) == 1 else None,
        prompt_template=prompt_template,
        prompt_augmentation=args.prompt_augmentation and len({t.name for t in templates}) > 1,
        arithmetic=arithmetic,
        chat_template_kwargs=args.chat_template_kwargs,
    )


def latest_metrics(log_history: list[dict[str, Any]]) -> dict[str, tuple[float, int | None]]:
    """The last logged value of each training metric, with the step it was logged at.

    A template not drawn in the last rounds keeps an older value, so its step can be well before the end.

    >>> latest_metrics(
    ...     [{"reward": 0.1, "templates/abel/accuracy": 1.0, "step": 1}, {"reward": 0.5, "step": 2}]
    ... )
    {'reward': (0.5, 2), 'templates/abel/accuracy': (1.0, 1)}
    """
    latest: dict[str, tuple[float, int | None]] = {}
    for entry in log_history:
        for key, value in entry.items():
            if key not in ("step", "epoch") and isinstance(value, (int, float)):
                latest[key] = (value, entry.get("step"))
    return latest


def render_model_card(
    info: ModelCardInfo,
    output_dir: str | Path,
    global_step: int,
    log_history: list[dict[str, Any]],
    hub_model_id: str | None = None,
    stopped: str | None = None,
) -> str:
    """Our sections of the card, which `extend_trl_card` puts into TRL's (whose front matter and title stand):
    introduction, data, steps and rounds (and the collapse guard's firings, and ``stopped``: why training
    stopped early), final metrics, eval table, template bank, usage, recipe."""
    output_dir = Path(output_dir)
    metrics = latest_metrics(log_history)
    load_from = hub_model_id or str(output_dir)  # where `from_pretrained` finds it: the Hub, or this folder
    template = info.prompt_template or next(
        (t for t in info.templates if t.name == info.eval_template), info.templates[0]
    )
    lines = [
        *_introduction(info),
        "",
        "## Training",
        "",
        f"- Dataset: {info.dataset}, {info.num_rows} questions after filtering",
        f"- License: none set in this card's metadata; see the base model's, `{info.base_model}`",
        f"- Optimizer steps: {global_step}",
        *_round_lines(info.arithmetic, log_history),
        *_collapse_lines(log_history, stopped),
        "",
        "### Final training metrics",
        "",
        "Last logged value of each metric; a template not drawn in the last rounds shows an earlier step.",
        "",
        "| metric | value | step |",
        "|---|---|---|",
    ]
    logged = [[k for k in keys if k in metrics] for keys in _CARD_METRICS]
    shown = [keys[0] for keys in logged if keys]
    shown += sorted(k for k in metrics if k.startswith("templates/") and k.endswith("/accuracy"))
    lines += [f"| {key} | {metrics[key][0]:.4g} | {metrics[key][1]} |" for key in shown] or [
        "| (none logged) | | |"
    ]
    lines += ["", *_evaluation_section(output_dir)]
    lines += [
        "",
        _TEMPLATE_BANK,
        "",
        *(
            []
            if info.prompt_augmentation
            else ["Prompt augmentation off: every training question was asked under this one template.", ""]
        ),
        "| template | weight | prefill | format markers |",
        "|---|---|---|---|",
    ]
    for t, w in zip(info.templates, info.weights):
        markers = ", ".join(f"`{json.dumps(m)[1:-1]}`" for m in t.markers) or "(free form)"
        prefill = f"`{json.dumps(t.prefill)[1:-1]}`" if t.prefill else ""
        lines.append(f"| {t.name} | {w:.3f} | {prefill} | {markers} |")
    lines += [
        "",
        "## How to prompt",
        "",
        f"As the evaluation template `{template.name}` lays a question out in training:",
        "",
        "```python",
        f"from transformers import {info.model_class}, AutoTokenizer",
        "",
        f'tok = AutoTokenizer.from_pretrained("{load_from}")',
        f'model = {info.model_class}.from_pretrained("{load_from}")',
        "messages = [",
        *[f"    {turn!r}," for turn in template.messages(_EXAMPLE_QUESTION)],
        "]",
        "text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True"
        + _keyword_text(info.chat_template_kwargs or {})
        + ")"
        + (f" + {template.prefill!r}" if template.prefill else ""),
        "# As in training: a tokenizer that adds a BOS itself (Llama, Gemma) gets the chat template's once",
        "bos = tok.bos_token",
        "if bos and text.startswith(bos) and tok('').input_ids[:1] == [tok.bos_token_id]:",
        "    text = text[len(bos):]",
        "out = model.generate(**tok(text, return_tensors='pt'), max_new_tokens=1024)",
        "print(tok.decode(out[0], skip_special_tokens=True))",
        "```",
        "",
        "## Recipe",
        "",
        "```yaml",
        without_hub_tokens(info.recipe).strip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def without_hub_tokens(text: str) -> str:
    """``text`` with each Hugging Face access token in it shown as ``hf_***``, and the value of a key named
    ``token`` of any other shape as ``***``.

    >>> without_hub_tokens("model_init_kwargs: {token: hf_" + "a1" * 17 + "}  # hf_x")
    'model_init_kwargs: {token: hf_***}  # hf_x'
    >>> without_hub_tokens('{token: oauth-1, revision: main} {"token": "oauth-2"} {"token": true}')
    '{token: ***, revision: main} {"token": "***"} {"token": true}'
    >>> without_hub_tokens("# pad token: <eos>; system_prompt: 'Each token: one step'")  # no key named token
    "# pad token: <eos>; system_prompt: 'Each token: one step'"
    """
    text = _HF_TOKEN.sub("hf_***", text)
    return _BARE_TOKEN.sub(
        lambda m: m.group(1) + (f"{m.group(3)}***{m.group(3)}" if m.group(3) else "***"), text
    )


def recorded_overrides(folder: str | Path) -> list[str] | None:
    """The command-line overrides lines (`OVERRIDES_LINE`) that end the recipe of the model card in
    ``folder`` (``README.md``, which training writes at each checkpoint): one a launch of the run that wrote
    it, in their order. None where no card with a recipe section is there.
    """
    try:
        card = (Path(folder) / "README.md").read_text(errors="replace")
    except OSError:
        return None
    recipe = re.search(r"^## Recipe\n\n```yaml\n(.*?)^```$", card, re.MULTILINE | re.DOTALL)
    if recipe is None:
        return None
    found: list[str] = []
    for line in reversed(recipe.group(1).splitlines()):
        if not line.startswith(OVERRIDES_LINE):
            break
        found.insert(0, line)
    return found


def _round_lines(arithmetic: Any, log_history: list[dict[str, Any]]) -> list[str]:
    """The card's lines on this launch's rounds: processes, questions and completions a round, and the rounds
    trained (the last logged ``round``) and planned.

    >>> from prompt_aug.batches import BatchArithmetic
    >>> _round_lines(BatchArithmetic(4, 8, 32, 32, 1.0, 9, 30), [{"step": 12, "round": 12}])
    ['- Processes: 4', '- Each round: 8 questions, 32 completions', '- Rounds: 12 trained, 30 planned']
    >>> _round_lines(BatchArithmetic(4, 8, 32, 32, 1.0, 9, 30), [])[-1]
    '- Rounds: 30 planned'
    """
    if arithmetic is None:
        return []
    logged = [int(e["round"]) for e in log_history if is_number(e.get("round"))]
    rounds = [f"{max(logged)} trained"] if logged else []  # nothing logged yet: a save before the first log
    rounds += [f"{arithmetic.total_rounds} planned"] if arithmetic.total_rounds is not None else []
    each = f"{arithmetic.questions_per_round} questions, {arithmetic.completions_per_round} completions"
    return [
        f"- Processes: {arithmetic.processes}",
        f"- Each round: {each}",
        *([f"- Rounds: {', '.join(rounds)}"] if rounds else []),
    ]


def _keyword_text(kwargs: dict[str, Any]) -> str:
    """``kwargs`` as the keyword arguments of a call in the card's snippet (after others).

    >>> _keyword_text({"enable_thinking": False}), _keyword_text({})
    (', enable_thinking=False', '')
    """
    if all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        return "".join(f", {k}={v!r}" for k, v in kwargs.items())
    return f", **{kwargs!r}"


def _collapse_lines(log_history: list[dict[str, Any]], stopped: str | None) -> list[str]:
    """The card's lines on the collapse guard: where each signal fired (``collapse/fired/<signal>`` in the
    log), and ``stopped``, why training stopped before ``max_steps``.

    >>> _collapse_lines([{"step": 8, "round": 2, "collapse/fired/entropy": 1.0}], "entropy below 0.05")
    ['- Collapse guard fired: entropy at step 8 (round 2)', '- Stopped early: entropy below 0.05']
    """
    fired = [
        f"{key.split('/', 2)[2]} at step {entry.get('step')} (round {entry.get('round')})"
        for entry in log_history
        for key in entry
        if key.startswith("collapse/fired/")
    ]
    lines = [f"- Collapse guard fired: {', '.join(fired)}"] if fired else []
    return lines + ([f"- Stopped early: {stopped}"] if stopped else [])


def _introduction(info: ModelCardInfo) -> list[str]:
    """The card's first paragraph: how the training questions were laid out."""
    if not info.prompt_augmentation:
        return [
            f"`{info.base_model}` fine-tuned with GRPO, every training question asked under one template,",
            f"`{info.templates[0].name}`: the single-template baseline of prompt augmentation (Lu, Huang,",
            "Balestriero 2026, arXiv 2602.03190), which was off (one training template). Trained with",
            "prompt-aug-grpo on TRL.",
        ]
    return [
        f"`{info.base_model}` fine-tuned with GRPO and prompt augmentation (Lu, Huang, Balestriero 2026,",
        "arXiv 2602.03190): each training question was rewritten under a reasoning template drawn at",
        "random from the bank below, with one template per GRPO group. Trained with prompt-aug-grpo",
        "on TRL.",
    ]


def _split_front_matter(card: str) -> tuple[list[str], list[str]]:
    """A card's YAML front matter lines (with both ``---``) and the lines after it."""
    lines = card.split("\n")
    if lines and lines[0] == "---" and "---" in lines[1:]:
        end = lines.index("---", 1) + 1
        return lines[:end], lines[end:]
    return [], lines


def hub_id_of(value: str | None) -> str | None:
    """``value`` where it names a model or dataset on the Hub (``owner/name``), else None: a local path or a
    model or set built in code has no Hub page, and the Hub refuses a card whose ``base_model`` or
    ``datasets`` is not an id.

    >>> [hub_id_of(v) for v in ["Qwen/Qwen2.5-Math-1.5B", "/data/run/model", "tiny-random-qwen2", "a/b c"]]
    ['Qwen/Qwen2.5-Math-1.5B', None, None, None]
    """
    from .sources import is_hub_id, looks_local

    return value if value and is_hub_id(value) and not looks_local(value) else None


def extend_trl_card(trl_card: str, ours: str, base_model: str, load_from: str) -> str:
    """TRL's card with ours (`render_model_card`) inside it: TRL's front matter (with ``base_model`` added
    where TRL left it out and it is a Hub id, `hub_id_of`, and without TRL's ``licence: license``
    placeholder, which names no license), title and introduction, then our sections (training, metrics,
    evaluation, template bank, how to prompt, recipe), then TRL's own sections (quick start, training
    procedure with the W&B link, framework versions, citations, the paper's first). TRL's tags already
    include ours: the trainer passes them to TRL. Where TRL had no base model id or no Hub id for this
    model, its introduction names the base model as text and its quick start loads from ``load_from``, where
    it wrote "None"."""
    front, body = _split_front_matter(trl_card)
    front = [line for line in front if not line.startswith("licence:")]  # TRL's placeholder, no license
    hub_base = hub_id_of(base_model)
    if front and hub_base and not any(line.startswith("base_model:") for line in front):
        front = [front[0], f"base_model: {hub_base}", *front[1:]]
    body = [
        line.replace("[None](https://huggingface.co/None)", f"`{base_model}`").replace(
            'model="None"', f'model="{load_from}"'
        )
        for line in body
    ]
    first = next((i for i, line in enumerate(body) if line.startswith("## ")), len(body))
    citation = ["Cite prompt augmentation as:", "", "```bibtex", PAPER_BIBTEX, "```", ""]
    if "## Citations" in body:
        at = body.index("## Citations") + 1
        body = [*body[:at], "", *citation[:-1], *body[at:]]
    else:
        body = [*body, "", "## Citations", "", *citation]
    return "\n".join([*front, *body[:first], "", *ours.split("\n"), *body[first:]])


def evaluation_results(output_dir: str | Path) -> list[Any]:
    """The Hub's evaluation metadata (``huggingface_hub.EvalResult``s, the card's ``model-index``) from
    ``output_dir/eval/results.json``: accuracy in percent on each benchmark under the evaluation's main
    template (``qwen-math`` where it ran), as its table shows it. Empty where there is no such file, where
    it does not record that the weights in ``output_dir`` made it, where it ran on the first questions only
    (``--limit``: not the benchmark's accuracy), and for a benchmark with no Hub dataset (a question set in a
    local file: the evaluation records ``hub_datasets``; one written before it did has none, and running
    the same ``prompt-aug-eval`` again rewrites it from its completions). Each metric's name says how the
    answers were made: template, sampling, new-token budget, samples and runs."""
    from huggingface_hub import EvalResult

    folder = Path(output_dir) / EVAL_TABLE_PATH.parent
    if weights_match(output_dir, evaluation_made_by(folder)) is not True:
        return []
    try:
        results = json.loads((folder / "results.json").read_text())
        templates, settings = results["templates"], results["settings"]
        template = results.get("main_template") or (  # recorded since the model-index; else the same rule
            DEFAULT_EVAL_TEMPLATE if DEFAULT_EVAL_TEMPLATE in templates else templates[0]
        )
        benchmarks = results["results"][template]["benchmarks"]
        datasets = results.get("hub_datasets") or {}
    except (OSError, ValueError, LookupError, TypeError):  # none, cut short, or not the evaluation's
        return []
    if results.get("limit") is not None:
        return []
    runs = results.get("runs") or 1
    temperature, n = settings.get("temperature") or 0, settings.get("n") or 1
    how = (
        ", ".join(
            [f"accuracy ({template} template", "greedy" if not temperature else f"temperature {temperature}"]
            + [f"at most {settings['max_tokens']} new tokens"] * bool(settings.get("max_tokens"))
            + [f"{n} samples a question"] * (n > 1)
            + [f"{runs} runs"] * (runs > 1)
        )
        + ")"
    )
    found = []
    for benchmark, entry in benchmarks.items():
        dataset = datasets.get(benchmark)
        if dataset and entry["n"]:
            found.append(
                EvalResult(
                    task_type="text-generation",
                    dataset_type=dataset["type"],
                    dataset_name=dataset["name"],
                    dataset_split=dataset.get("split"),
                    metric_type="accuracy",
                    metric_value=round(100 * entry["accuracy"], 1),
                    metric_name=how,
                )
            )
    return found


class CardError(ValueError):
    """A model card that cannot be read; the message names the file and what to fix."""


def _parsed(card: str, where: str | Path) -> Any:
    """``card`` as a ``huggingface_hub.ModelCard``: its front matter parsed, the text kept as it is.

    Raises:
        CardError: the front matter is not YAML (a hand edit gone wrong); names ``where``.
    """
    import yaml
    from huggingface_hub import ModelCard

    try:
        return ModelCard(card, ignore_metadata_errors=True)
    except (yaml.YAMLError, ValueError) as err:
        first = str(err).strip().split("\n")[0]
        raise CardError(
            f"{where}: its front matter (the YAML between the first two --- lines) does not parse ({first}); "
            "fix it and run again"
        ) from None


def with_model_index(card: str, output_dir: str | Path, model_name: str) -> str:
    """``card`` with its ``model-index`` (the Hub's evaluation metadata) made from `evaluation_results`:
    written, replaced, or taken away where the evaluation beside it no longer holds for these weights. The
    rest of the front matter and the text are kept; a card with no index before or after is unchanged.

    Raises:
        CardError: the card's front matter does not parse.
    """
    parsed = _parsed(card, Path(output_dir) / "README.md")
    results = evaluation_results(output_dir)
    if not results and parsed.data.eval_results is None:
        return card
    parsed.data.eval_results = results or None
    # The card's name (TRL's ``model_name``), which the Hub's format keeps in the index while there is one.
    parsed.data.model_name = parsed.data.model_name or (model_name if results else None)
    return parsed.content


def with_evaluation(card: str, output_dir: str | Path, add: bool = True) -> str:
    """``card`` with its ``## Evaluation`` section and its ``model-index`` made anew from the evaluations in
    ``output_dir`` (`_evaluation_section`, `with_model_index`); a card without the section (TRL's alone) gets
    it at its end where ``add``. The rest of the card is kept.

    Raises:
        CardError: the card's front matter does not parse.
    """
    output_dir = Path(output_dir)
    lines = card.split("\n")
    section = _evaluation_section(output_dir) + [""]
    if "## Evaluation" in lines:
        start = lines.index("## Evaluation")
        # The next section ends it: the renderer's ``## Template bank``, or one the user added after it (a
        # card of TRL's alone has its section at the end); the tables carry no level-2 heading of their own
        # (`_evaluation_section`: the robustness table's is ``###``).
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    elif add:  # a card of TRL's alone (a trainer given no model_card): the section goes at its end
        start = end = len(lines)
        section = ["", *section]
    else:
        start = end = len(lines)
        section = []
    return with_model_index("\n".join(lines[:start] + section + lines[end:]), output_dir, output_dir.name)


def full_model_card(card: str, target: Path) -> str:
    """A LoRA run's card (``card``) for the full model merged from it into ``target``: its evaluation section
    and model-index made anew for ``target`` (which holds no evaluation yet: the adapter's numbers are
    another model's), and its front matter a full model's: its ``model_name`` the folder's,
    ``library_name: transformers``, no ``base_model:adapter:`` tag (the Hub's model tree would list it as an
    adapter) nor ``lora`` tag (its search would list it among adapters), and ``base_model`` only as a Hub id
    (`hub_id_of`: the Hub refuses a local path there).

    Raises:
        CardError: the card's front matter does not parse.
    """
    # The adapter's digest line goes: it was the digest of the adapter run's card, not of this one.
    parsed = _parsed(with_evaluation(_SEAL.sub("", card), target, add=False), target / "README.md")
    parsed.data.library_name = "transformers"
    if parsed.data.model_name:
        parsed.data.model_name = target.name
    tags = [t for t in parsed.data.tags or [] if t != "lora" and not str(t).startswith("base_model:adapter:")]
    parsed.data.tags = tags or None
    base = parsed.data.base_model
    if base is not None:
        kept = [b for b in ([base] if isinstance(base, str) else base) if hub_id_of(b)]
        parsed.data.base_model = (kept[0] if len(kept) == 1 else kept) if kept else None
    return parsed.content


def with_adapter_metadata(card: str, model: Any, where: str | Path) -> str:
    """``card`` (TRL's, ours in it) with the metadata PEFT gives an adapter's card, where ``model`` is a PEFT
    model: ``library_name: peft``, the tag ``lora`` for a LoRA adapter, and ``base_model:adapter:<id>``
    where the card's ``base_model`` is a Hub id (the Hub's model tree lists the model as its adapter; a
    local path has no page). Any other ``card`` is returned as it is.

    Raises:
        CardError: the card's front matter does not parse; names ``where``.
    """
    config = getattr(model, "active_peft_config", None)
    if config is None:
        return card
    parsed = _parsed(card, where)
    parsed.data.library_name = "peft"
    tags = list(parsed.data.tags or [])
    method = str(getattr(config.peft_type, "value", config.peft_type))
    base = parsed.data.base_model
    extra = ["lora"] if method == "LORA" else []
    if isinstance(base, str) and hub_id_of(base):
        extra.append(f"base_model:adapter:{base}")
    parsed.data.tags = tags + [t for t in extra if t not in tags]
    return parsed.content


def evaluation_made_by(folder: Path) -> str | None:
    """The weights that made the evaluation in ``folder`` (``eval/``, ``eval-templates/``), as its
    ``results.json`` records them (else its ``settings.json``, written first); None where neither does (an
    evaluation of an older version)."""
    for path, keys in (
        (folder / "results.json", ("settings", "weights")),
        (folder / "settings.json", ("weights",)),
    ):
        try:
            value = json.loads(path.read_text())
            for key in keys:
                value = value.get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if value is not None:
            return value
    return None


def weights_match(output_dir: str | Path, made_by: str | None) -> bool | None:
    """Whether the weights in ``output_dir`` are the ones ``made_by`` (`weights_fingerprint`) names; None
    where that cannot be told: no record, or no weights in ``output_dir`` to compare."""
    these = weights_fingerprint(output_dir) if made_by is not None else None
    return None if these is None else made_by == these


def _evaluation_section(output_dir: Path) -> list[str]:
    """The card's evaluation: the tables in ``eval/`` and ``eval-templates/`` made by the weights in
    ``output_dir``; a table made by other weights (an earlier state of a run trained further) is left out,
    saying so, and one whose weights are not recorded (an older version's) is shown with a note."""
    lines = ["## Evaluation", ""]
    tables = ((EVAL_TABLE_PATH, None), (ROBUSTNESS_TABLE_PATH, "### Robustness across templates"))
    for path, heading in tables:
        table = Path(output_dir) / path
        if not table.is_file():
            if heading is None:
                lines.append(NO_EVALUATION)
            continue
        lines += ["", heading, ""] if heading else []
        made_by = evaluation_made_by(table.parent)
        if made_by is not None and weights_match(output_dir, made_by) is not True:
            lines.append(OTHER_WEIGHTS.format(folder=path.parent))
            continue
        lines.append(table.read_text().strip())
        if made_by is None:
            lines += ["", UNRECORDED_WEIGHTS.format(folder=path.parent)]
    return lines


def refresh_evaluation(output_dir: str | Path) -> Path:
    """Rewrite the ``## Evaluation`` section of ``output_dir/README.md`` from ``output_dir/eval/results.md``
    and ``output_dir/eval-templates/results.md`` (the robustness table), whichever exist.

    The front matter's ``model-index`` follows the evaluation (`with_model_index`); everything else in the
    card (recipe, metrics, template bank) is kept as written at the end of training.

    Raises:
        FileNotFoundError: no card, or no evaluation, in ``output_dir``.
        CardError: the README.md there is no model card (no front matter), or its front matter does not
            parse.
    """
    output_dir = Path(output_dir)
    card_path = output_dir / "README.md"
    if not output_dir.is_dir():
        raise FileNotFoundError(f"no folder {output_dir}: give the output folder of a training run")
    if not card_path.is_file():
        raise FileNotFoundError(
            f"no model card {card_path}: training writes it into its output folder at the end (a checkpoint "
            "folder has none); give that folder"
        )
    if not any((output_dir / p).is_file() for p in (EVAL_TABLE_PATH, ROBUSTNESS_TABLE_PATH)):
        raise FileNotFoundError(
            f"no {output_dir / EVAL_TABLE_PATH}: run prompt-aug-eval --model {output_dir}"
        )
    card = card_path.read_text()
    if not card.startswith("---"):  # every card has front matter (a hand-edited one too); notes have none
        raise CardError(
            f"{card_path} is no model card (it has no front matter), so it was left as it is; give the "
            "output folder of a training run"
        )
    seal = _last_seal(card)
    refreshed = with_evaluation(_SEAL.sub("", card), output_dir.resolve())
    if seal is None:  # a card of no digest (TRL's alone) stays so
        card_path.write_text(refreshed)
    elif edited_card(card):  # its edits and its old digest line stay: training keeps it aside still
        card_path.write_text(refreshed.rstrip("\n") + "\n" + seal.group(0).rstrip("\n") + "\n")
    else:
        card_path.write_text(sealed(refreshed))
    return card_path


def main(argv: list[str] | None = None) -> None:
    """``python -m prompt_aug.model_card OUT``: put OUT/eval/results.md and OUT/eval-templates/results.md into
    the card OUT/README.md."""
    parser = argparse.ArgumentParser(prog="python -m prompt_aug.model_card", description=main.__doc__)
    parser.add_argument("output_dir", help="a training output folder (README.md and eval/results.md)")
    try:
        path = refresh_evaluation(parser.parse_args(argv).output_dir)
    except (OSError, CardError) as err:  # no card or evaluation, one that cannot be read or written or parsed
        parser.exit(1, f"{parser.prog}: error: {err}\n")
    print(f"updated {path}")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sealed(card: str) -> str:
    """``card`` ending in a line that holds the digest of the rest (a digest line there before is replaced),
    an HTML comment, which the Hub does not show.

    >>> edited_card(sealed("---\\n---\\n# run\\n")), edited_card(sealed("---\\n---\\n# run\\n") + "mine\\n")
    (False, True)
    """
    body = _SEAL.sub("", card).rstrip("\n") + "\n"
    return f"{body}<!-- prompt-aug card sha256:{_digest(body)} -->\n"


def _last_seal(text: str) -> re.Match[str] | None:
    """``text``'s last digest line (`sealed`), or None."""
    seals = list(_SEAL.finditer(text))
    return seals[-1] if seals else None


def edited_card(text: str) -> bool:
    """Whether ``text``, a README.md, is a card training wrote (`sealed`) and edited by hand since: what
    comes before its digest line no longer matches it, or something follows it. A card without one (TRL's
    alone, PEFT's) is not known to be edited."""
    seal = _last_seal(text)
    if seal is None:
        return False
    return _digest(text[: seal.start()]) != seal.group(1) or bool(text[seal.end() :].strip())


def is_model_card(text: str) -> bool:
    r"""Whether ``text``, a README.md, is a model card a trainer wrote (its front matter has transformers' and
    TRL's ``generated_from_trainer`` tag, or PEFT's ``library_name: peft``), or empty.

    >>> is_model_card("---\ntags:\n- generated_from_trainer\n---\n# run"), is_model_card("# My notes\n")
    (True, False)
    """
    front, _ = _split_front_matter(text)
    marks = {"- generated_from_trainer", "library_name: peft"}
    return not text.strip() or any(line.strip() in marks for line in front)


def readme_owner(path: Path) -> str | None:
    """Why the README.md ``path`` is the user's, not a card for training to write over: it is no model card
    (`is_model_card`), or a card edited by hand (`edited_card`); None where it is neither, or cannot be read
    (the card's write says why)."""
    try:
        text = path.read_text(errors="replace") if path.is_file() else None
    except OSError:
        return None
    if text is None:
        return None
    if not is_model_card(text):
        return "is not a model card (the user's own?)"
    if edited_card(text):
        return "is a model card edited by hand since training wrote it"
    if _last_seal(text) is None and _TEMPLATE_BANK in text.split("\n"):
        # Training seals every card it writes; ours without its digest line had it taken out by hand.
        return "is a model card without its digest line (taken out by hand, or written before cards had one)"
    return None


def keep_own_readme(output_dir: str | Path) -> Path | None:
    """Move the user's own README.md in ``output_dir`` (`readme_owner`) to `OWN_README` (``_README-2.md`` and
    on where that is taken), so that the card written there does not overwrite it; where it went, or None
    where there was nothing to keep."""
    path = Path(output_dir) / "README.md"
    why = readme_owner(path)
    if why is None:
        return None
    stem, suffix = Path(OWN_README).stem, Path(OWN_README).suffix
    names = itertools.chain([OWN_README], (f"{stem}-{n}{suffix}" for n in itertools.count(2)))
    kept = next(path.with_name(n) for n in names if not path.with_name(n).exists())
    path.rename(kept)
    logging.getLogger("prompt_aug").warning(
        "%s %s: moved to %s, which Hub pushes leave out, so that the model card can be written there",
        path, why, kept
    )  # fmt: skip
    return kept


class ModelCardMixin:
    """A `transformers.Trainer` mixin whose model card is TRL's plus ours (``self.model_card_info``: the
    recipe, the template bank, the metrics and the evaluation table); without that info, TRL's card alone.
    A PEFT model's card keeps PEFT's metadata, which TRL's card would overwrite (`with_adapter_metadata`).
    A README.md of the user's own in the output folder is moved aside first (`keep_own_readme`), before a
    save of the model there or the card."""

    model_card_info: ModelCardInfo | None = None

    # Why: a PEFT model's save writes PEFT's card into the folder, over a README.md there, before ours is
    # written: a user's own README in the output folder is moved aside first. A card training wrote there (at
    # a checkpoint) is put back as it was after the save: PEFT rewrites its front matter (a local base path
    # as ``base_model``, its own tags) and its last line, so that the card would no longer match its digest
    # and be taken for one edited by hand (moved to _README.md, with a false warning, at every LoRA run's
    # end). Ours already carries PEFT's metadata (`with_adapter_metadata`).
    def save_model(self, output_dir: str | None = None, *args: Any, **kwargs: Any) -> None:
        folder = output_dir if output_dir is not None else self.args.output_dir
        card_path, card = Path(folder) / "README.md", None
        if self.is_world_process_zero() and Path(folder).resolve() == Path(self.args.output_dir).resolve():
            keep_own_readme(folder)
            try:
                card = card_path.read_bytes() if card_path.is_file() else None
            except OSError:  # unreadable: the card's own write later says why
                card = None
        super().save_model(output_dir, *args, **kwargs)
        if card is not None and card_path.is_file() and card_path.read_bytes() != card:
            card_path.write_bytes(card)

    # Why: TRL writes its card (base model, W&B link, framework versions, citations) at every checkpoint and
    # inside `push_to_hub`; ours adds the recipe, the template bank, the metrics and the evaluation table.
    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
    ) -> None:
        info = self.model_card_info
        path = Path(self.args.output_dir) / "README.md"
        if self.is_world_process_zero():
            keep_own_readme(self.args.output_dir)
        if info is None:
            super().create_model_card(model_name, dataset_name, tags)
            if self.is_world_process_zero() and path.is_file():
                path.write_text(sealed(with_adapter_metadata(path.read_text(), self.model, path)))
            return
        extra = [tags] if isinstance(tags, str) else list(tags or [])
        hub_model_id = getattr(self, "hub_model_id", None) or self.args.hub_model_id  # full id once pushed
        # TRL titles the card "Model Card for {model_name}"; named as transformers' push_to_hub names it.
        model_name = model_name or (hub_model_id or str(Path(self.args.output_dir).resolve())).split("/")[-1]
        # TRL puts the dataset into the card's metadata, which the Hub checks: a Hub id or none (our section
        # names the data as the recipe gave it).
        super().create_model_card(model_name, dataset_name or info.dataset_id, [*info.tags, *extra])
        if not self.is_world_process_zero():
            return
        guard = getattr(getattr(self, "features", None), "guard", None)
        stopped = guard.stop_reason if guard is not None else None
        ours = render_model_card(
            info, self.args.output_dir, self.state.global_step, self.state.log_history, hub_model_id, stopped
        )
        load_from = hub_model_id or str(self.args.output_dir)
        card = extend_trl_card(path.read_text(), ours, info.base_model, load_from)
        try:
            card = with_model_index(
                with_adapter_metadata(card, self.model, path), self.args.output_dir, model_name
            )
        except CardError as err:  # at a checkpoint save: the card goes without its index, the run on
            logging.getLogger("prompt_aug").warning(
                "%s; the card is written without its model-index (and a PEFT model's adapter metadata)", err
            )
        path.write_text(sealed(card))


if __name__ == "__main__":
    main()
