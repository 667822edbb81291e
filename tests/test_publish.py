"""Publishing: the model card, W&B (offline) and the push to the Hub.

One smoke run with ``--report_to wandb`` and ``WANDB_MODE=offline`` (a subprocess, so W&B and its service
process are set up exactly as for a user) feeds the card and W&B tests. W&B 0.2x+ writes no
``wandb-summary.json`` for offline runs; the run's transaction log (``run-*.wandb``) is read with W&B's own
reader, ``wandb leet inspect --json``, which prints every record (history rows included) as JSON.

The Hub is not faked where a test claims a push works: with the Hub client in offline mode, a push-enabled
run trains and its push fails in one line, and a real push test runs only when ``PROMPT_AUG_TEST_HUB_REPO``
names a repository you can write to (``HF_TOKEN`` set, network on). One test records the Hub client's
create and upload calls instead of sending them, to count the uploads a run makes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launch import train_command

from prompt_aug import train
from prompt_aug.model_card import (
    EVAL_TABLE_PATH,
    ModelCardInfo,
    extend_trl_card,
    latest_metrics,
    render_model_card,
    weights_fingerprint,
)
from prompt_aug.templates import load_templates, select_templates

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "recipes/smoke/tiny_cpu.yaml"
PROJECT = "prompt-aug-test"


def _run_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp),
        WANDB_PROJECT=PROJECT,
        WANDB_SILENT="true",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory):
    """A smoke run reporting to W&B offline: (output_dir, W&B run folder)."""
    pytest.importorskip("wandb")
    tmp = tmp_path_factory.mktemp("publish")
    out = tmp / "out"
    cmd = train_command(out, "--report_to", "wandb")
    proc = subprocess.run(
        cmd, check=False, cwd=REPO, env=_run_env(tmp), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = sorted((tmp / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, f"expected one offline W&B run under {tmp / 'wandb'}, found {runs}"
    return out, runs[0]


def _log_history(out: Path) -> list[dict]:
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


# ---------------------------------------------------------------------------------------------
# Model card


def test_card_has_base_model_recipe_templates_steps_and_final_metrics(wandb_run):
    out, _ = wandb_run
    card = (out / "README.md").read_text()
    # A model built in code has no Hub id: no base_model in the front matter (the Hub refuses one that is no
    # id); the text names it, TRL's title names this run's folder, and the quick start loads from it.
    assert "base_model:" not in card.split("---")[1] and "datasets:" not in card.split("---")[1]
    assert "# Model Card for out\n" in card and "fine-tuned version of `tiny-random-qwen2`" in card
    assert f'model="{out}"' in card and "None" not in card.replace("None yet", "")
    assert SMOKE.read_text().strip() in card  # the recipe, verbatim
    assert "# command-line overrides: --output_dir" in card and "--report_to wandb" in card
    for name in load_templates():
        assert f"\n| {name} | 0.077 |" in card, name  # 13 templates, uniform
    assert "- Optimizer steps: 4\n" in card
    # This launch's rounds: 1 process, 16 / 4 = 4 questions a round, 2 optimizer steps a round.
    assert (
        "- Processes: 1\n- Each round: 4 questions, 16 completions\n- Rounds: 2 trained, 2 planned\n" in card
    )
    metrics = {key: value for key, (value, _) in latest_metrics(_log_history(out)).items()}
    assert metrics and any(k.endswith("/accuracy") for k in metrics)
    for key in ("reward", "entropy"):
        assert f"| {key} | {metrics[key]:.4g} | " in card
    for key in (k for k in metrics if k.startswith("templates/") and k.endswith("/accuracy")):
        assert f"| {key} | {metrics[key]:.4g} | " in card
    assert "No evaluation results yet" in card
    # TRL's card is extended, not replaced: its tags, framework versions and citations stay.
    front = card.split("---")[1]
    assert "- grpo" in front and "- prompt-augmentation" in front
    assert "Framework versions" in card and "url     = {https://github.com/huggingface/trl}" in card
    assert card.index("## Template bank") < card.index("Framework versions")


def _evaluated(folder: Path, table_path: Path, table: str, weights: str | None = "these") -> None:
    """As `prompt-aug-eval --model folder` leaves it: a weights file in ``folder`` and, under it,
    ``table_path`` with a ``settings.json`` that records the weights that made it (``"these"``: the folder's;
    None: no record, as an evaluation folder made before the record was kept)."""
    if not (folder / "model.safetensors").is_file():
        (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (folder / table_path).parent.mkdir(parents=True, exist_ok=True)
    (folder / table_path).write_text(table + "\n")
    made_by = weights_fingerprint(folder) if weights == "these" else weights
    settings = {"model": folder.name} | ({} if made_by is None else {"weights": made_by})
    (folder / table_path).parent.joinpath("settings.json").write_text(json.dumps(settings))


def test_card_includes_eval_results_when_present(tmp_path):
    table = "| benchmark | qwen-math | mean of 13 templates |\n|---|---|---|\n| MATH-500 | 71.2 | 68.9 |"
    _evaluated(tmp_path, EVAL_TABLE_PATH, table)
    templates, weights = select_templates(load_templates(), ["qwen-math", "abel"], [3, 1])
    info = ModelCardInfo(
        base_model="Qwen/Qwen2.5-Math-1.5B",
        recipe="learning_rate: 1.0e-6\n",
        templates=templates,
        weights=weights,
        dataset="hkust-nlp/SimpleRL-Zoo-Data (simplelr_qwen_level3to5)",
        num_rows=8521,
    )
    history = [{"reward": 0.4, "templates/abel/accuracy": 0.5, "step": 80}]
    card = render_model_card(info, tmp_path, 80, history, hub_model_id="someone/prompt-aug-1.5b")
    assert table in card and "No evaluation results yet" not in card
    assert "- Optimizer steps: 80" in card
    assert "| qwen-math | 0.750 |" in card and "| abel | 0.250 |" in card
    assert "| templates/abel/accuracy | 0.5 | 80 |" in card
    assert "```yaml\nlearning_rate: 1.0e-6\n```" in card


def test_trls_card_gets_base_model_only_as_a_hub_id_and_loses_its_nones():
    """`extend_trl_card` on TRL's card as TRL writes it without a Hub repository or a base model id: the
    front matter gets ``base_model`` where it is a Hub id only, and the "None" of TRL's link and quick start
    become the base model's name and where the model loads from."""
    trl_card = (
        "---\nlibrary_name: transformers\ntags:\n- grpo\n---\n\n# Model Card for run\n\n"
        "This model is a fine-tuned version of [None](https://huggingface.co/None).\n\n## Quick start\n\n"
        'generator = pipeline("text-generation", model="None", device_map="auto")\n'
    )
    ours = "---\nlicense: other\n---\n# ours\n\n## Training\n"
    hub = extend_trl_card(trl_card, ours, "Qwen/Qwen2.5-Math-1.5B", "/runs/run")
    assert hub.startswith("---\nbase_model: Qwen/Qwen2.5-Math-1.5B\nlibrary_name: transformers\n")
    local = extend_trl_card(trl_card, ours, "/models/base", "/runs/run")
    assert "base_model" not in local.split("---")[1]
    assert "fine-tuned version of `/models/base`." in local and 'model="/runs/run"' in local
    assert "None" not in local and local.index("## Training") < local.index("## Quick start")


def test_the_card_names_no_license_it_does_not_know_and_cites_the_paper(tmp_path):
    """TRL's card as TRL 1.16 writes it carries ``licence: license`` in its front matter, a placeholder that
    names no license: ours drops it and says that no license is set, pointing to the base model's; its
    citations put the paper's entry (arXiv 2602.03190) before GRPO's and TRL's."""
    from trl.trainer.utils import generate_model_card

    trl_card = str(
        generate_model_card(
            base_model="Qwen/Qwen2.5-Math-1.5B", model_name="run", hub_model_id="me/run", dataset_name=None,
            tags=["trl", "grpo"], wandb_url=None, trackio_url=None, trainer_name="GRPO",
            trainer_citation="@article{shao2024}", paper_title="DeepSeekMath", paper_id="2402.03300",
        )
    )  # fmt: skip
    info = dataclasses.replace(_card_info(), base_model="Qwen/Qwen2.5-Math-1.5B")
    card = extend_trl_card(trl_card, render_model_card(info, tmp_path, 4, []), info.base_model, "me/run")
    front = card.split("---")[1]
    assert "licence" not in front and "license" not in front
    assert (
        "- License: none set in this card's metadata; see the base model's, `Qwen/Qwen2.5-Math-1.5B`\n"
        in card
    )
    citations = card[card.index("## Citations") :]
    assert citations.startswith("## Citations\n\nCite prompt augmentation as:\n\n```bibtex\n@misc{")
    assert "author        = {Wenquan Lu and Hai Huang and Randall Balestriero}" in citations
    assert "eprint        = {2602.03190}" in citations and "year          = 2026" in citations
    assert citations.index("2602.03190") < citations.index("Cite GRPO as:") < citations.index("Cite TRL as:")
    # A card without TRL's citations (another TRL version) gets the section at its end.
    bare = extend_trl_card("---\ntags:\n- grpo\n---\n# run\n", "## Training\n", "base", "/runs/run")
    assert bare.rstrip().endswith("url           = {https://arxiv.org/abs/2602.03190},\n}\n```")


def test_a_readme_of_the_users_own_in_the_output_folder_is_kept_not_overwritten(tmp_path):
    """A README.md already in output_dir that is no model card (the user's notes) is moved to _README.md,
    which Hub pushes leave out, before the card is written; the card written again (a checkpoint, then the
    end of training) replaces only the card."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("# My notes\n\nlr sweep, run 3\n")
    train.main(["--config", str(SMOKE), "--output_dir", str(out), "--max_steps", "2"])
    assert (out / "_README.md").read_text() == "# My notes\n\nlr sweep, run 3\n"
    card = (out / "README.md").read_text()
    assert "- generated_from_trainer" in card.split("---")[1] and "- Optimizer steps: 2\n" in card
    assert (out / "checkpoint-2").is_dir() and not (out / "_README-2.md").exists()
    assert sorted(p.name for p in out.glob("*README*")) == ["README.md", "_README.md"]
    # A LoRA run that saves no checkpoint before its end: PEFT's save would write its card over the notes
    # (adding its front matter to them) before ours is written.
    lora = tmp_path / "lora"
    lora.mkdir()
    (lora / "README.md").write_text("# My notes\n\nlr sweep, run 4\n")
    train.main(["--config", str(SMOKE), "--output_dir", str(lora), "--max_steps", "2", "--use_peft", "true",
                "--save_strategy", "no"])  # fmt: skip
    assert (lora / "_README.md").read_text() == "# My notes\n\nlr sweep, run 4\n"
    assert "library_name: peft" in (lora / "README.md").read_text().split("---")[1]


def test_a_card_edited_by_hand_is_kept_when_a_resumed_run_writes_its_card_again(tmp_path, caplog):
    """The card training writes ends in a digest of itself: a card edited since (the user's notes added to it
    before a push) is moved to _README.md when a resumed run writes its card again, not written over; a
    card as training wrote it is replaced, as before."""
    from prompt_aug.model_card import edited_card

    out = tmp_path / "out"
    train.main(["--config", str(SMOKE), "--output_dir", str(out), "--max_steps", "2"])
    card = (out / "README.md").read_text()
    assert card.splitlines()[-1].startswith("<!-- prompt-aug card sha256:") and not edited_card(card)
    edited = card.replace("- Optimizer steps: 2\n", "- Optimizer steps: 2 (then a learning-rate sweep)\n")
    assert edited != card and edited_card(edited)
    (out / "README.md").write_text(edited)
    resume = ["--config", str(SMOKE), "--output_dir", str(out), "--resume_from_checkpoint", "true"]
    with caplog.at_level("WARNING", logger="prompt_aug"):
        train.main([*resume, "--max_steps", "4"])
    assert (out / "_README.md").read_text() == edited
    assert "is a model card edited by hand since training wrote it: moved to" in caplog.text
    card = (out / "README.md").read_text()
    assert "- Optimizer steps: 4\n" in card and not edited_card(card)
    train.main([*resume, "--max_steps", "6"])  # a card as training wrote it: replaced, nothing kept
    assert sorted(p.name for p in out.glob("*README*")) == ["README.md", "_README.md"]
    assert "- Optimizer steps: 6\n" in (out / "README.md").read_text()


@pytest.mark.parametrize(
    ("dataset_name", "sources", "expected"),
    [
        ("hkust-nlp/SimpleRL-Zoo-Data", None, "hkust-nlp/SimpleRL-Zoo-Data"),  # its config is not in the id
        ("/data/simplerl_level3to5", None, None),
        ("synthetic", None, None),
        (None, ["me/train-a", "/data/b.jsonl"], "me/train-a"),
        (None, ["me/train-a", "me/train-b"], None),  # TRL's card names one dataset
    ],
)
def test_the_cards_metadata_names_the_data_only_by_a_hub_id(dataset_name, sources, expected):
    """What TRL's card gets as its dataset (its metadata's ``datasets``, which the Hub checks): the Hub id
    of the recipe's one Hub source, never a local path, a built-in set or the id with its subset."""
    from types import SimpleNamespace

    from prompt_aug.model_card import model_card_info

    mixture = (
        None if sources is None else SimpleNamespace(datasets=[SimpleNamespace(path=p) for p in sources])
    )
    script_args = SimpleNamespace(
        dataset_name=dataset_name, dataset_config="simplelr_qwen_level3to5", dataset_mixture=mixture
    )
    info = model_card_info(
        script_args, SimpleNamespace(model_name_or_path="Qwen/Qwen2.5-Math-1.5B"),
        SimpleNamespace(eval_template="qwen-math", prompt_augmentation=True, chat_template_kwargs=None),
        "seed: 1\n", [], [], 10,
    )  # fmt: skip
    assert info.dataset_id == expected
    if dataset_name and sources is None:
        assert info.dataset == f"{dataset_name} (simplelr_qwen_level3to5)"  # the card's own text keeps it


def test_a_baseline_runs_card_says_it_trained_on_one_template_and_is_not_tagged_prompt_augmentation(
    tmp_path,
):
    """A ``prompt_augmentation: false`` run (the paper's baseline arm) asks every question under its
    evaluation template: its card says that, draws from no bank, shows the share graded right, and lacks the
    ``prompt-augmentation`` tag that an augmented run of the same recipe has."""
    from types import SimpleNamespace

    from prompt_aug.model_card import model_card_info
    from prompt_aug.templates import templates_for

    cards, tags = {}, {}
    for augmented in (True, False):
        args = SimpleNamespace(
            templates_file=None, templates=None, template_weights=None, eval_template="qwen-math",
            system_prompt=None, prompt_augmentation=augmented, chat_template_kwargs=None,
        )  # fmt: skip
        templates, weights, eval_template = templates_for(args)
        info = model_card_info(
            SimpleNamespace(dataset_name="synthetic", dataset_config=None, dataset_mixture=None),
            SimpleNamespace(model_name_or_path="Qwen/Qwen2.5-Math-1.5B"), args, "seed: 1\n", templates,
            weights, 3, eval_template,
        )  # fmt: skip
        cards[augmented] = render_model_card(
            info, tmp_path / str(augmented), 1, [{"step": 1, "completions/accuracy": 0.5}]
        )
        tags[augmented] = info.tags  # the trainer hands them to TRL's card
    baseline, augmented = cards[False], cards[True]
    assert tags[False] == ["trl", "grpo", "math"]
    assert tags[True] == ["trl", "grpo", "prompt-augmentation", "math"]
    intro = baseline.split("## Training")[0]
    assert "every training question asked under one template,\n`qwen-math`" in intro
    assert "prompt augmentation (Lu, Huang,\nBalestriero 2026, arXiv 2602.03190), which was off" in intro
    assert "drawn at" not in baseline and "fine-tuned with GRPO and prompt augmentation" not in intro
    assert "| completions/accuracy | 0.5 | 1 |" in baseline  # its only accuracy: no per-template rows
    bank = baseline.split("## Template bank")[1].split("## How to prompt")[0]
    assert "every training question was asked under this one template" in bank
    assert [row.split(" | ")[0] for row in bank.splitlines() if row.startswith("| ")][1:] == ["| qwen-math"]
    assert "drawn at\nrandom from the bank below" in augmented


@pytest.mark.parametrize(
    ("recipe", "augmented"),
    [
        ("qwen2.5-math-1.5b/grpo_single_template.yaml", False),
        ("qwen2.5-math-1.5b/dapo_single_template.yaml", False),
        ("smollm2-135m/ablation_one_template.yaml", False),
        ("qwen2.5-math-1.5b/prompt_aug.yaml", True),
    ],
)
def test_a_single_template_recipes_card_says_it_trained_on_one_template(tmp_path, recipe, augmented):
    """The baseline recipes leave ``prompt_augmentation`` on and name one template (``templates:
    [qwen-math]``): their cards say every question was asked under it and lack the ``prompt-augmentation``
    tag, as ``prompt_augmentation: false`` does; the bank's recipe keeps both."""
    from prompt_aug.model_card import model_card_info
    from prompt_aug.templates import templates_for

    script_args, args, model_args, _ = train.parse_args(
        ["--config", str(REPO / "recipes" / recipe), "--dry_run"]
    )
    assert args.prompt_augmentation  # the key is on in all four: the template count decides
    templates, weights, eval_template = templates_for(args)
    info = model_card_info(script_args, model_args, args, "seed: 1\n", templates, weights, 3, eval_template)
    intro = render_model_card(info, tmp_path, 1, []).split("## Training")[0]
    assert ("prompt-augmentation" in info.tags) is augmented
    assert ("drawn at\nrandom from the bank below" in intro) is augmented
    assert ("every training question asked under one template,\n`qwen-math`" in intro) is not augmented


def _bos_adding_model(folder: Path) -> None:
    """A tiny Llama-style model and tokenizer in ``folder``, built in code: the tokenizer adds a BOS to
    every text and its chat template starts with one too, as Llama's and Gemma's do."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "system", "user", "assistant", ":"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>"
    )
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tok.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(words), hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)


@pytest.mark.parametrize("eval_template", ["qwen-math", "open-r1-teacher"])  # no prefill, a prefill
def test_the_cards_snippet_prompts_with_the_tokens_training_gave(tmp_path, capsys, eval_template):
    """The card's "How to prompt" code, run as it is on a model whose tokenizer adds a BOS: the prompt it
    generates from is the token ids training gave the same question (one BOS, not the chat template's and
    the tokenizer's)."""
    import re

    from prompt_aug.model_card import _EXAMPLE_QUESTION

    _bos_adding_model(tmp_path)
    info = _card_info()
    info.prompt_template = load_templates()[eval_template]
    card = render_model_card(info, tmp_path, 1, [])
    (snippet,) = re.findall(r"## How to prompt\n.*?```python\n(.*?)```", card, re.DOTALL)
    namespace: dict = {}
    exec(snippet, namespace)  # noqa: S102 - the card's own code, as a reader runs it
    tok = namespace["tok"]
    assert tok("").input_ids == [tok.bos_token_id]  # this tokenizer adds a BOS itself
    # As TRL 1.16 tokenizes a text prompt: processing_class(text=prompts).
    trained = tok(text=[info.prompt_template.render(_EXAMPLE_QUESTION, tok)])["input_ids"][0]
    assert trained[:2] == [tok.bos_token_id, tok.convert_tokens_to_ids("system")]
    assert namespace["out"][0][: len(trained)].tolist() == trained
    assert capsys.readouterr().out  # it printed the completion


def _card_info() -> ModelCardInfo:
    templates, weights = select_templates(load_templates(), ["qwen-math", "abel"])
    return ModelCardInfo(
        base_model="base",
        recipe="seed: 1\n",
        templates=templates,
        weights=weights,
        dataset="synthetic",
        num_rows=3,
    )


def test_card_snippet_loads_from_the_hub_id_or_the_folder_path(tmp_path):
    out = tmp_path / "outputs" / "qwen2.5-math-1.5b" / "prompt_aug"
    history = [{"reward": 0.4, "step": 8}]
    local = render_model_card(_card_info(), out, 8, history)
    assert f'AutoModelForCausalLM.from_pretrained("{out}")' in local
    assert f'AutoTokenizer.from_pretrained("{out}")' in local
    pushed = render_model_card(_card_info(), out, 8, history, hub_model_id="someone/prompt-aug-1.5b")
    assert 'AutoModelForCausalLM.from_pretrained("someone/prompt-aug-1.5b")' in pushed


def test_card_prompts_as_training_laid_out_its_evaluation_template_whatever_the_bank_draws(tmp_path):
    """The bank draws abel and simplerl, training evaluates under qwen-math: the card's snippet is
    qwen-math's. Under simplerl, the question goes into the template's user text, as training put it."""
    from types import SimpleNamespace

    from prompt_aug.templates import templates_for

    args = SimpleNamespace(
        templates_file=None, templates=["abel", "simplerl"], template_weights=None, eval_template="qwen-math",
        prompt_augmentation=True, system_prompt="Be brief.",
    )  # fmt: skip
    templates, weights, eval_template = templates_for(args)
    info = ModelCardInfo(
        "base", "seed: 1\n", templates, weights, "synthetic", 3, prompt_template=eval_template
    )
    how = render_model_card(info, tmp_path, 1, []).split("## How to prompt")[1].split("## Recipe")[0]
    assert "evaluation template `qwen-math`" in how and "Please reason step by step" in how
    assert "Be brief." in how and "one step at a time" not in how  # abel's system text
    args.eval_template = "simplerl"
    info.prompt_template = templates_for(args)[2]
    how = render_model_card(info, tmp_path, 1, []).split("## How to prompt")[1].split("## Recipe")[0]
    question = "What is the remainder when 2024 is divided by 7?"
    assert f"'content': '{question}\\nReason through it step by step" in how


def test_card_prompts_with_the_chat_template_kwargs_training_used(tmp_path):
    """A recipe's ``chat_template_kwargs`` (``enable_thinking: false``) lay the question out in training: the
    card's snippet passes them too."""
    from types import SimpleNamespace

    from prompt_aug.model_card import model_card_info

    script_args = SimpleNamespace(dataset_name="synthetic", dataset_config=None, dataset_mixture=None)
    args = SimpleNamespace(
        eval_template="qwen-math", prompt_augmentation=True, chat_template_kwargs={"enable_thinking": False}
    )
    info = _card_info()
    info = model_card_info(
        script_args, SimpleNamespace(model_name_or_path="base"), args, "seed: 1\n", info.templates,
        info.weights, 3,
    )  # fmt: skip
    how = render_model_card(info, tmp_path, 1, []).split("## How to prompt")[1]
    assert "add_generation_prompt=True, enable_thinking=False)" in how
    info.chat_template_kwargs = {"reasoning-effort": "low"}  # not a keyword: passed as a mapping
    how = render_model_card(info, tmp_path, 1, []).split("## How to prompt")[1]
    assert "add_generation_prompt=True, **{'reasoning-effort': 'low'})" in how
    info.chat_template_kwargs = None
    assert "add_generation_prompt=True)\n" in render_model_card(info, tmp_path, 1, [])


def test_card_states_the_launchs_processes_questions_and_completions_a_round_and_rounds(tmp_path):
    """A recipe whose header describes 8 processes, launched on 4: the card says what trained, from the
    arithmetic training computed for this launch."""
    from types import SimpleNamespace

    from prompt_aug.batches import batch_arithmetic
    from prompt_aug.model_card import model_card_info

    args = SimpleNamespace(
        per_device_train_batch_size=4, steps_per_generation=2, gradient_accumulation_steps=2,
        num_generations=8, num_iterations=1, max_steps=20, num_train_epochs=1, eval_template="qwen-math",
        prompt_augmentation=True, chat_template_kwargs=None,
    )  # fmt: skip
    script_args = SimpleNamespace(
        dataset_name="synthetic", dataset_config=None, dataset_mixture=None, dataset_num_rows=None,
        num_synthetic=256, num_processes=8,
    )  # fmt: skip
    info = _card_info()
    arithmetic = batch_arithmetic(args, script_args, num_processes=4, rows=256)
    info = model_card_info(
        script_args, SimpleNamespace(model_name_or_path="base"), args, "num_processes: 8\n", info.templates,
        info.weights, 256, None, arithmetic,
    )  # fmt: skip
    card = render_model_card(info, tmp_path, 6, [{"step": 6, "round": 6}])
    assert "- Optimizer steps: 6\n- Processes: 4\n- Each round: 4 questions, 32 completions\n" in card
    assert "- Rounds: 6 trained, 20 planned\n" in card


def test_a_base_model_path_yaml_would_misread_and_a_results_file_of_another_shape_leave_the_card_whole(
    tmp_path,
):
    from huggingface_hub import ModelCard

    from prompt_aug.model_card import evaluation_results

    info = _card_info()
    info.base_model = "/models/qwen: v2"  # a colon and a space: plain YAML would read a mapping
    trl_card = (
        "---\nlibrary_name: transformers\ntags:\n- grpo\n---\n\n# Model Card for run\n\n## Quick start\n"
    )
    ours = render_model_card(info, tmp_path, 1, [])
    card = ModelCard(extend_trl_card(trl_card, ours, info.base_model, str(tmp_path)))
    assert card.data.base_model is None and "`/models/qwen: v2` fine-tuned" in card.text
    assert "- grpo" in card.content
    table = "| Model | MATH500 |\n|---|---:|\n| run | 50.0 |"
    _evaluated(tmp_path, EVAL_TABLE_PATH, table)
    made_by = json.loads((tmp_path / "eval" / "settings.json").read_text())
    for shape in ({"templates": []}, {"templates": ["abel"], "results": {}}, {"templates": ["abel"]}):
        (tmp_path / "eval" / "results.json").write_text(json.dumps({"settings": made_by, **shape}))
        assert evaluation_results(tmp_path) == []
        assert table in render_model_card(_card_info(), tmp_path, 1, [])


def test_card_rows_say_which_step_each_metric_is_from(tmp_path):
    # abel was last drawn at step 3; the card must not present it as the step-8 value.
    history = [
        {"step": 3, "reward": 0.2, "templates/abel/accuracy": 0.25, "templates/qwen-math/accuracy": 0.5},
        {"step": 8, "reward": 0.4, "templates/qwen-math/accuracy": 0.75},
    ]
    card = render_model_card(_card_info(), tmp_path, 8, history)
    assert "| metric | value | step |" in card
    assert "| templates/abel/accuracy | 0.25 | 3 |" in card
    assert "| templates/qwen-math/accuracy | 0.75 | 8 |" in card and "| reward | 0.4 | 8 |" in card


def test_card_metrics_cover_everything_generated_and_name_the_collapse_guards_firings(tmp_path):
    # With dynamic sampling, TRL's reward and truncation cover the trained groups only: the card shows those,
    # and the share graded right, over everything generated. Accuracy rows are that share and the templates'
    # (not the guard's statistic, nor an evaluation during training, which may be of earlier weights and a
    # subset).
    history = [
        {"step": 4, "round": 1, "reward": 0.5, "dynamic_sampling/generated/reward": 0.9,
         "completions/clipped_ratio": 0.0, "dynamic_sampling/generated/completions/clipped_ratio": 0.3,
         "completions/accuracy": 0.5, "dynamic_sampling/generated/completions/accuracy": 0.35,
         "templates/abel/accuracy": 0.25, "eval/math500/accuracy": 0.4, "collapse/accuracy": 0.2},
        {"step": 8, "round": 2, "entropy": 0.01, "collapse/entropy": 2.0, "collapse/fired/entropy": 1.0},
    ]  # fmt: skip
    stopped = "collapse guard stopped training at step 8 (round 2): entropy below the floor"
    card = render_model_card(_card_info(), tmp_path, 8, history, stopped=stopped)
    assert "| dynamic_sampling/generated/reward | 0.9 | 4 |" in card and "| reward |" not in card
    assert "| dynamic_sampling/generated/completions/clipped_ratio | 0.3 | 4 |" in card
    assert "| dynamic_sampling/generated/completions/accuracy | 0.35 | 4 |" in card
    assert "| completions/accuracy |" not in card
    assert "| templates/abel/accuracy | 0.25 | 4 |" in card
    assert "eval/math500/accuracy" not in card and "collapse/accuracy" not in card
    assert "- Collapse guard fired: entropy at step 8 (round 2)" in card
    assert f"- Stopped early: {stopped}" in card


def test_card_includes_the_robustness_table_when_eval_templates_exists(tmp_path):
    from prompt_aug.model_card import ROBUSTNESS_TABLE_PATH

    robustness = "| Template | MATH500 |\n|---|---:|\n| abel | 60.0 |\n| **spread (max − min)** | 4.0 |"
    _evaluated(tmp_path, ROBUSTNESS_TABLE_PATH, robustness)
    card = render_model_card(_card_info(), tmp_path, 4, [{"reward": 0.1, "step": 4}])
    assert "### Robustness across templates\n\n" + robustness in card
    assert card.index("## Evaluation") < card.index(robustness) < card.index("## Template bank")


def test_card_leaves_out_an_evaluation_of_other_weights(tmp_path):
    """An evaluation made by other weights (a run trained further since) is not shown as this model's: the
    card says so and how to evaluate again. One that does not record its weights (made by an older version)
    is shown, with a note; one made by these weights is shown as it is."""
    table = "| Model | MATH500 |\n|---|---:|\n| base | 50.0 |"
    history = [{"reward": 0.1, "step": 4}]
    _evaluated(tmp_path, EVAL_TABLE_PATH, table, weights="0123456789abcdef")
    card = render_model_card(_card_info(), tmp_path, 4, history)
    assert table not in card and "No evaluation results yet" not in card
    assert "`eval/` holds an evaluation of other weights than these" in card
    assert "run the command that made it again with `--overwrite`" in card
    _evaluated(tmp_path, EVAL_TABLE_PATH, table, weights=None)
    card = render_model_card(_card_info(), tmp_path, 4, history)
    assert table in card and "`eval/settings.json` does not record which weights" in card
    _evaluated(tmp_path, EVAL_TABLE_PATH, table)
    card = render_model_card(_card_info(), tmp_path, 4, history)
    assert table in card and "does not record" not in card and "other weights" not in card


def test_an_evaluation_started_again_takes_the_old_tables_away_and_the_card_reads_the_tables_own_record(
    tmp_path,
):
    # Evaluated, trained further, evaluated again with --overwrite and stopped before it wrote its tables:
    # the old tables must not be shown as the new weights' (settings.json already names the new ones).
    from prompt_aug.evaluation.cli import _check_settings

    table = "| Model | MATH500 |\n|---|---:|\n| run | 50.0 |"
    _evaluated(tmp_path, EVAL_TABLE_PATH, table)
    eval_dir = (tmp_path / EVAL_TABLE_PATH).parent
    old = json.loads((eval_dir / "settings.json").read_text())
    (eval_dir / "results.json").write_text(json.dumps({"settings": old}))
    (tmp_path / "model.safetensors").write_bytes(bytes(range(255, -1, -1)) * 64)  # trained further
    new = {**old, "weights": weights_fingerprint(tmp_path)}
    card = render_model_card(_card_info(), tmp_path, 4, [{"reward": 0.1, "step": 4}])
    assert table not in card  # the table's own record names the old weights
    (eval_dir / "settings.json").write_text(json.dumps(new))  # as a stopped re-run leaves it
    card = render_model_card(_card_info(), tmp_path, 4, [{"reward": 0.1, "step": 4}])
    assert table not in card and "`eval/` holds an evaluation of other weights than these" in card
    _check_settings(eval_dir, new, overwrite=True)
    assert not (eval_dir / "results.json").exists() and not (eval_dir / "results.md").exists()
    (eval_dir / "results.md").write_text(table)  # other settings, no completions yet: the same
    _check_settings(eval_dir, {**new, "max_tokens": 8}, overwrite=False)
    assert not (eval_dir / "results.md").exists()


def test_refresh_adds_the_section_to_trls_card_and_a_folder_without_a_card_is_one_line(tmp_path, capsys):
    """A card of TRL's alone (a trainer given no model_card) gets the evaluation section at its end; a
    folder with no card (a checkpoint) stops the command in one line that says where the card is."""
    from prompt_aug import model_card

    trl_card = "---\nlibrary_name: transformers\n---\n\n# Model Card for run\n\n## Quick start\n"
    (tmp_path / "README.md").write_text(trl_card)
    table = "| Model | MATH500 |\n|---|---:|\n| run | 50.0 |"
    _evaluated(tmp_path, EVAL_TABLE_PATH, table)
    model_card.main([str(tmp_path)])
    card = (tmp_path / "README.md").read_text()
    assert card.startswith(trl_card) and card.index("## Evaluation") < card.index(table)
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        model_card.main([str(checkpoint)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1
    assert (
        f"error: no model card {checkpoint / 'README.md'}: training writes it into its output folder" in err
    )
    broken = "---\nlicense: [apache-2.0\n---\n\n# run\n"  # a hand edit gone wrong
    (tmp_path / "README.md").write_text(broken)
    with pytest.raises(SystemExit) as exit_info:
        model_card.main([str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1
    assert "README.md: its front matter (the YAML between the first two --- lines) does not parse" in err
    assert (tmp_path / "README.md").read_text() == broken


def test_refresh_keeps_the_sections_the_user_added_after_the_evaluation(tmp_path):
    """A section of the user's own after ``## Evaluation`` (before the template bank, or after the section
    a card of TRL's alone got at its end) is kept when the evaluation is refreshed; only the tables change."""
    from prompt_aug import model_card

    limits = "## Limitations\n\nNot for use outside competition math.\n"
    front = "---\nlibrary_name: transformers\n---\n\n"
    ours = front + render_model_card(_card_info(), tmp_path, 4, [{"reward": 0.25, "step": 4}])
    trl_card = front + "# Model Card for run\n\n## Quick start\n"
    old = "| Model | MATH500 |\n|---|---:|\n| run | 50.0 |"
    new = "| Model | MATH500 |\n|---|---:|\n| run | 61.0 |"
    for card in (ours.replace("## Template bank", limits + "\n## Template bank"), trl_card):
        (tmp_path / "README.md").write_text(card)
        _evaluated(tmp_path, EVAL_TABLE_PATH, old)
        model_card.main([str(tmp_path)])
        refreshed = (tmp_path / "README.md").read_text()
        if card == trl_card:  # the section now ends it, and the user adds theirs after
            (tmp_path / "README.md").write_text(refreshed + "\n" + limits)
        else:
            assert limits in refreshed and old in refreshed
        _evaluated(tmp_path, EVAL_TABLE_PATH, new)
        model_card.main([str(tmp_path)])
        refreshed = (tmp_path / "README.md").read_text()
        assert limits in refreshed and new in refreshed and old not in refreshed
        assert refreshed.index("## Evaluation") < refreshed.index(new) < refreshed.index("## Limitations")
        assert "## Template bank" in refreshed or card == trl_card


def test_refresh_of_a_folder_that_is_not_there_says_so(tmp_path, capsys):
    from prompt_aug import model_card

    with pytest.raises(SystemExit) as exit_info:
        model_card.main([str(tmp_path / "outptus")])  # a typo
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1
    assert f"error: no folder {tmp_path / 'outptus'}: give the output folder of a training run" in err


def test_a_card_whose_digest_line_was_taken_out_by_hand_is_kept_not_overwritten(tmp_path):
    """The digest line is an HTML comment the Hub does not show: a user editing the card may delete it. Such a
    card (ours: its template bank is there) is kept aside before a card is written there, as an edited one
    is; a card as training wrote it, and one of TRL's alone, are not."""
    from prompt_aug.model_card import keep_own_readme, readme_owner, sealed

    card = "---\ntags:\n- generated_from_trainer\n---\n\n" + render_model_card(_card_info(), tmp_path, 4, [])
    readme = tmp_path / "README.md"
    readme.write_text(sealed(card))
    assert readme_owner(readme) is None and keep_own_readme(tmp_path) is None
    edited = sealed(card).splitlines(keepends=True)[:-1]  # its digest line deleted
    edited = "".join(edited).replace("- Optimizer steps: 4\n", "- Optimizer steps: 4 (then a sweep)\n")
    readme.write_text(edited)
    assert readme_owner(readme) == (
        "is a model card without its digest line (taken out by hand, or written before cards had one)"
    )
    assert keep_own_readme(tmp_path) == tmp_path / "_README.md"
    assert (tmp_path / "_README.md").read_text() == edited and not readme.exists()
    readme.write_text("---\ntags:\n- generated_from_trainer\n---\n\n# Model Card for run\n")  # TRL's alone
    assert readme_owner(readme) is None


def test_the_cards_recipe_shows_no_hub_token_given_under_another_key(tmp_path):
    """A Hub token reaches the model loader as ``model_init_kwargs: {token: ...}`` too (a gated base model),
    a key that does not end in ``_token``: the card, which is published, shows it as ``hf_***``."""
    token = "hf_" + "Ab3" * 11 + "x"
    info = _card_info()
    info.recipe = (
        f"model_init_kwargs: {{token: {token}}}\nseed: 1\n"
        f'# command-line overrides: --model_init_kwargs {{"token": "{token}"}}\n'
    )
    card = render_model_card(info, tmp_path, 1, [])
    assert token not in card and "hf_Ab3" not in card
    assert "model_init_kwargs: {token: hf_***}\nseed: 1\n" in card
    assert '--model_init_kwargs {"token": "hf_***"}' in card


def test_the_cards_recipe_shows_no_token_of_another_shape_under_a_bare_token_key(tmp_path):
    """A token that is not ``hf_``-shaped (an OAuth token, one of another registry) under a bare ``token``
    key, as a recipe or a command line gives it: the published card shows neither; other keys stay."""
    info = _card_info()
    info.recipe = (
        "model_init_kwargs: {token: oauth-SECRET-flow, revision: main}\n"
        "env:\n  token: 'oauth-SECRET-block'\nseed: 1\n"
        '# command-line overrides: --model_init_kwargs {"token": "oauth-SECRET-json", "revision": "main"}\n'
    )
    card = render_model_card(info, tmp_path, 1, [])
    assert "SECRET" not in card
    assert "model_init_kwargs: {token: ***, revision: main}" in card and "seed: 1" in card
    assert '--model_init_kwargs {"token": "***", "revision": "main"}' in card


def test_a_lora_runs_card_written_at_a_checkpoint_is_not_taken_for_one_edited_by_hand(tmp_path, caplog):
    """A LoRA run writes its card at each checkpoint; its final save is PEFT's, which rewrites a README.md
    there (its own front matter). The card must then be replaced as training wrote it, not moved to
    _README.md as if edited by hand."""
    out = tmp_path / "lora"
    with caplog.at_level("WARNING", logger="prompt_aug"):
        train.main(
            ["--config", str(SMOKE), "--output_dir", str(out), "--max_steps", "2", "--use_peft", "true"]
        )
    assert (out / "checkpoint-2").is_dir()  # the card was written there before the final save
    assert "edited by hand" not in caplog.text
    assert sorted(p.name for p in out.glob("*README*")) == ["README.md"]
    front = (out / "README.md").read_text().split("---")[1]
    assert "library_name: peft" in front and "- lora" in front and "- generated_from_trainer" in front
    assert "base_model" not in front  # the base is a model built in code: no Hub id


# ---------------------------------------------------------------------------------------------
# W&B, offline


def _wandb_records(run_dir: Path) -> list[dict]:
    wandb_cli = shutil.which("wandb", path=str(Path(sys.executable).parent)) or shutil.which("wandb")
    if wandb_cli is None:
        pytest.skip("the wandb command-line tool is not installed")
    proc = subprocess.run(
        [wandb_cli, "leet", "inspect", "--json", str(run_dir)],
        check=False,
        capture_output=True,
        text=True,
        timeout=15 * 60,
    )  # a ceiling against a hang; it returns when done
    if proc.returncode != 0 and "No such command" in proc.stderr:
        summary = run_dir / "files" / "wandb-summary.json"  # older W&B clients write it for offline runs
        if summary.is_file():
            return [{"type": "summary", "summary": json.loads(summary.read_text())}]
        pytest.fail(f"this W&B client has neither `wandb leet inspect` nor {summary}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_wandb_offline_run_receives_per_template_metrics(wandb_run):
    out, run_dir = wandb_run
    records = _wandb_records(run_dir)
    history = [r["history"]["item"] for r in records if r.get("type") == "history"]
    summary_only = not history  # older clients write no history records for an offline run
    if summary_only:
        history = [r["summary"] for r in records if r.get("type") == "summary"]
    logged = {k for row in history for k in row}
    trained = {k for entry in _log_history(out) for k in entry if k.startswith("templates/")}
    assert trained, "the trainer logged no per-template metrics"
    missing = sorted(k for k in trained if f"train/{k}" not in logged)
    assert not missing, f"per-template metrics missing from the W&B run: {missing[:5]}"
    if summary_only:
        return
    # Same numbers as the trainer's log, step by step (every W&B row carries train/global_step).
    assert all("train/global_step" in row for row in history), "a W&B history row without its step"
    compared = 0
    for entry in _log_history(out):
        expected = {f"train/{k}": v for k, v in entry.items() if k.startswith("templates/")}
        if not expected:
            continue
        rows = [r for r in history if r["train/global_step"] == entry["step"] and expected.keys() <= r.keys()]
        assert rows, f"no W&B history row with the per-template metrics of step {entry['step']}"
        assert {k: rows[0][k] for k in expected} == pytest.approx(expected)
        compared += 1
    assert compared == 4  # each of the smoke run's 4 optimizer steps (its entropy, and a round's metrics)


def test_wandb_offline_run_is_in_the_project_and_has_the_completion_table(wandb_run):
    _, run_dir = wandb_run
    records = _wandb_records(run_dir)
    runs = [r["run"] for r in records if r.get("type") == "run"]
    if any(r.get("type") != "summary" for r in records):  # older clients: the summary file only
        assert [r["project"] for r in runs] == [PROJECT], runs
    tables = sorted((run_dir / "files" / "media" / "table").glob("completions_*.table.json"))
    assert tables, "log_completions should log a completions table to W&B"
    columns = json.loads(tables[-1].read_text())["columns"]
    assert {"template", "uid", "completion"} <= set(columns)


# ---------------------------------------------------------------------------------------------
# Hub


FAKE_TOKEN = "hf_NotARealTokenForTests"


def _no_token_anywhere(monkeypatch, tmp_path: Path) -> None:
    """No Hugging Face token in the environment, and a Hugging Face home without a token file."""
    from huggingface_hub import constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.setenv(var, "")  # recorded, so that a token a run puts there is taken away after
        monkeypatch.delenv(var)
    home = tmp_path / "hf-home"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_TOKEN_PATH", str(home / "token"))
    # The client reads where its token file is once, at import: point that at the empty home too.
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))


def test_push_to_hub_without_a_token_is_refused_before_anything_loads(tmp_path, monkeypatch):
    """Without a token the push could only fail at the end of the run: refused at once, in one line."""
    _no_token_anywhere(monkeypatch, tmp_path)
    out = tmp_path / "out"
    argv = ["--config", str(SMOKE), "--output_dir", str(out), "--push_to_hub", "true"]
    argv += ["--hub_model_id", "me/x"]
    with pytest.raises(SystemExit) as err:
        train.main(argv)
    assert str(err.value) == (
        "prompt-aug-train: error: push_to_hub: no Hugging Face token: run `hf auth login` or set HF_TOKEN, "
        "or set push_to_hub false"
    )
    assert not out.exists()  # nothing read, loaded or written
    # A recipe's hub_token is a token too: this run gets past the check, to the data it cannot find.
    absent = str(tmp_path / "no-such-data")
    with pytest.raises(SystemExit, match="no-such-data"):
        train.main([*argv, "--hub_token", FAKE_TOKEN, "--dataset_name", absent])


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--hub_model_id", "me/x y"], "hub_model_id: 'me/x y' is not a Hub repository id"),
        (["--hub_model_id", "a/b/c"], "hub_model_id: 'a/b/c' is not a Hub repository id"),
        # Without hub_model_id the repository is named after the output folder.
        ([], "hub_model_id: not set, and output_dir's name 'my run' is not a Hub repository id"),
    ],
)
def test_a_malformed_hub_repository_id_is_refused_before_anything_loads(tmp_path, monkeypatch, flags, says):
    """The repository is created only once the trainer is built, after the data and the model have loaded: a
    name the Hub refuses fails at once, in one line naming the key and the value."""
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    out = tmp_path / "my run"
    argv = ["--config", str(SMOKE), "--output_dir", str(out), "--push_to_hub", "true", *flags]
    argv += ["--dataset_name", str(tmp_path / "no-such-data")]  # reached only after the check
    with pytest.raises(SystemExit) as err:
        train.main(argv)
    message = str(err.value)
    assert message.startswith(f"prompt-aug-train: error: {says}"), message
    assert "\n" not in message and "no-such-data" not in message
    assert not out.exists()


def test_a_token_in_the_environment_or_the_token_file_is_enough_to_start_a_push(tmp_path, monkeypatch):
    from prompt_aug.train import hub_token_problem

    _no_token_anywhere(monkeypatch, tmp_path)
    assert hub_token_problem().startswith("push_to_hub: no Hugging Face token")
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    assert hub_token_problem() is None
    monkeypatch.delenv("HF_TOKEN")
    (tmp_path / "hf-home" / "token").write_text(FAKE_TOKEN)  # as `hf auth login` leaves it
    assert hub_token_problem() is None


def test_push_to_hub_reaches_the_hub_client_and_a_failed_push_keeps_the_model(tmp_path, monkeypatch):
    """With the Hub client offline, a push-enabled run trains (an unreachable Hub at start-up is a warning,
    so a long run is not lost to a network blip), then its push reaches the Hub client, fails, and says so in
    one line with the command to push later; the model and card stay on disk.

    This shows the wiring (push_to_hub/hub_model_id reach the Hub client) without faking the Hub; the upload
    itself is covered by the opt-in test below.
    """
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the client's own switch: nothing leaves
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)  # a token is there; the Hub is not
    out = tmp_path / "out"
    with pytest.raises(
        SystemExit, match="push_to_hub: the upload to prompt-aug-tests/never-created failed"
    ) as err:
        train.main(
            ["--config", str(SMOKE), "--output_dir", str(out), "--max_steps", "1", "--push_to_hub", "true",
             "--hub_model_id", "prompt-aug-tests/never-created"]
        )  # fmt: skip
    assert "\n" not in str(err.value) and "hf upload prompt-aug-tests/never-created" in str(err.value)
    assert (out / "model.safetensors").exists() and (out / "README.md").exists()


def test_a_pushed_run_uploads_once_at_the_end_with_its_card(tmp_path, monkeypatch):
    """transformers' ``save_model`` pushes too when ``push_to_hub`` is on: the end of a run saves the model,
    writes its card, then uploads once. The Hub client's create and upload are recorded here, not sent."""
    from types import SimpleNamespace

    from huggingface_hub import HfApi

    uploads = []

    def upload_folder(self, *, repo_id, folder_path, commit_message=None, run_as_future=False, **kwargs):
        uploads.append((repo_id, commit_message, sorted(p.name for p in Path(folder_path).iterdir())))
        done = SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0")
        if run_as_future:  # a checkpoint's push, in the background
            future = concurrent.futures.Future()
            future.set_result(done)
            return future
        return done

    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: SimpleNamespace(repo_id=repo_id))
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)  # a run with a token is not refused at the start
    out = tmp_path / "out"
    train.main(
        ["--config", str(SMOKE), "--output_dir", str(out), "--max_steps", "1", "--push_to_hub", "true",
         "--hub_model_id", "prompt-aug-tests/once"]
    )  # fmt: skip
    final = [(repo, message, files) for repo, message, files in uploads if "in progress" not in message]
    assert [(repo, message) for repo, message, _ in final] == [
        ("prompt-aug-tests/once", "prompt-aug GRPO, 1 steps")
    ]
    assert {"README.md", "model.safetensors"} <= set(final[0][2])


@pytest.mark.skipif(
    not os.environ.get("PROMPT_AUG_TEST_HUB_REPO"),
    reason="real Hub upload; set PROMPT_AUG_TEST_HUB_REPO=<user>/<scratch-repo> (and HF_TOKEN) to run it",
)
def test_push_to_hub_uploads_model_and_card(tmp_path):
    from huggingface_hub import HfApi, hf_hub_download

    repo = os.environ["PROMPT_AUG_TEST_HUB_REPO"]
    out = tmp_path / "out"
    cmd = train_command(
        out, "--max_steps", "2", "--push_to_hub", "true", "--hub_model_id", repo, "--hub_private_repo", "true"
    )
    proc = subprocess.run(
        cmd,
        check=False,
        cwd=REPO,
        env=_run_env(tmp_path, HF_HUB_OFFLINE="0"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    files = HfApi().list_repo_files(repo)
    assert "README.md" in files and "model.safetensors" in files
    card = Path(
        hf_hub_download(repo, "README.md", force_download=True, cache_dir=tmp_path / "hf")
    ).read_text()
    assert "prompt augmentation" in card and "- Optimizer steps: 2" in card


def test_refresh_puts_eval_results_into_an_existing_card(tmp_path, capsys):
    from prompt_aug import model_card

    templates, weights = select_templates(load_templates(), ["qwen-math"])
    info = ModelCardInfo(
        base_model="base",
        recipe="seed: 1\n",
        templates=templates,
        weights=weights,
        dataset="synthetic",
        num_rows=3,
    )
    history = [{"reward": 0.25, "step": 4}]
    front = "---\nlibrary_name: transformers\n---\n\n"  # as every card written has
    written = front + render_model_card(info, tmp_path, 4, history)
    (tmp_path / "README.md").write_text(written)
    with pytest.raises(FileNotFoundError, match="prompt-aug-eval"):
        model_card.refresh_evaluation(tmp_path)

    def around_evaluation(card: str) -> tuple[str, str, str]:
        """The card before its evaluation section, the section, and the card after it."""
        before, section = card.split("## Evaluation\n", 1)
        section, after = section.split("\n## ", 1)
        return before, section, after

    assert "No evaluation results yet" in around_evaluation(written)[1]
    old = "| Model | MATH500 |\n|---|---:|\n| base | 50.0 |"
    new = "| Model | MATH500 |\n|---|---:|\n| base | 61.0 |"
    for table, gone in ((old, "No evaluation results yet"), (new, old)):
        _evaluated(tmp_path, EVAL_TABLE_PATH, table)
        model_card.main([str(tmp_path)])  # twice: the second run replaces the first table
        before, section, after = around_evaluation((tmp_path / "README.md").read_text())
        assert table in section and gone not in section, section
        # Everything else is as training wrote it.
        assert (before, after) == (around_evaluation(written)[0], around_evaluation(written)[2])
    assert "updated" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# The training log, logs.jsonl


def test_a_resumed_run_skips_a_last_log_line_cut_short_and_names_any_other_bad_line(tmp_path, caplog):
    """A crash mid-write leaves the last line of logs.jsonl cut short: the resumed run drops it with a
    warning naming the file and goes on. A bad line elsewhere stops it, naming the file and the line."""
    import re
    from types import SimpleNamespace

    from prompt_aug.logging_utils import JsonlLogCallback
    from prompt_aug.records import LogFileError

    log = tmp_path / "logs.jsonl"
    lines = [json.dumps({"step": s, "reward": s / 10}) for s in (4, 8, 12)]
    args = SimpleNamespace(output_dir=str(tmp_path))
    state = SimpleNamespace(is_world_process_zero=True, global_step=16)  # resumed from checkpoint-12
    log.write_text("\n".join(lines) + '\n{"step": 16, "rew')
    with caplog.at_level("WARNING", logger="prompt_aug"):
        JsonlLogCallback().on_log(args, state, None, {"reward": 1.6})
    assert f"{log}: its last line (4) is cut short" in caplog.text
    assert log.read_text().splitlines() == [*lines, '{"step": 16, "reward": 1.6}']
    for bad, what in (("{oops", "not JSON"), ('{"reward": 0.5}', "not a log entry")):
        log.write_text(f"{lines[0]}\n{bad}\n{lines[1]}\n")
        with pytest.raises(LogFileError, match=rf"^{re.escape(str(log))}, line 2: {what}"):
            JsonlLogCallback().on_log(args, state, None, {"reward": 1.6})
        assert log.read_text() == f"{lines[0]}\n{bad}\n{lines[1]}\n"  # left for the user to look at


def test_a_run_resumed_at_its_last_step_keeps_that_steps_entry_and_one_summary(tmp_path):
    from types import SimpleNamespace

    from prompt_aug.logging_utils import JsonlLogCallback

    log = tmp_path / "logs.jsonl"
    steps = [json.dumps({"step": s, "reward": s / 10}) for s in (2, 4)]
    log.write_text(
        "\n".join([*steps, json.dumps({"step": 4, "train_runtime": 9.0}), '{"step": 5, "reward": 1}'])
    )
    args, state = (
        SimpleNamespace(output_dir=str(tmp_path)),
        SimpleNamespace(is_world_process_zero=True, global_step=4),
    )
    callback = JsonlLogCallback()
    callback.on_train_begin(args, state, None)  # from checkpoint-4, the last step: it trains none
    callback.on_log(args, state, None, {"train_runtime": 1.0})
    assert log.read_text().splitlines() == [*steps, '{"step": 4, "train_runtime": 1.0}']


def test_a_save_before_the_first_log_line_writes_its_card_and_checkpoint(tmp_path):
    """TRL writes the card at every save, before the checkpoint: a save before anything was logged
    (logging_steps longer than save_steps) must write both, its card stating the rounds planned."""
    from prompt_aug.records import checkpoint_folders

    out = tmp_path / "run"
    train.main(
        ["--config", str(SMOKE), "--output_dir", str(out), "--max_steps", "2", "--save_steps", "1",
         "--save_strategy", "steps", "--logging_steps", "5"]
    )  # fmt: skip
    assert [p.name for p in checkpoint_folders(out)] == ["checkpoint-2", "checkpoint-1"]
    # max_steps 2 of steps_per_generation 2: one round, as planned
    assert "- Rounds: 1 trained, 1 planned\n" in (out / "README.md").read_text()
