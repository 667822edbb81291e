"""Fidelity: the tables of docs/reproduce.md ("Fidelity to the paper's run") are what the recipes parse to.

The page is the one source of truth. Each `### ...` table names what it checks in its heading (a recipe
file, or the evaluation command); each backticked ``key: value`` in its "Our keys" / "Our flags" column
is YAML, compared with the parsed recipe (TRL and transformers defaults included) or with the parsed
``prompt-aug-eval`` command. Keys of the dry-run arithmetic (``questions_per_round``, ...) are computed
by `prompt_aug.batches.batch_arithmetic` on the recipe's process count.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from prompt_aug import evaluate, train
from prompt_aug.batches import batch_arithmetic

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs/reproduce.md"
PAPER = REPO / "recipes/qwen2.5-math-1.5b"
UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")
ITEM = re.compile(r"`([A-Za-z_][\w-]*|--[\w-]+): ([^`]*)`")
ARITHMETIC = {"questions_per_round", "completions_per_round", "completions_per_optimizer_step",
              "optimizer_steps_per_round", "rounds_per_epoch", "total_rounds"}  # fmt: skip
# The LoRA recipe is not a paper run: these rows are its own (model, batch, learning rate, length).
LORA_OWN = {"dtype", "questions_per_round", "completions_per_optimizer_step", "gradient_accumulation_steps",
            "steps_per_generation", "learning_rate", "num_train_epochs", "total_rounds"}  # fmt: skip
# The short full fine-tuning run on one GPU: half the paper's round, 2 of the paper's optimizer steps per
# round, for 300 rounds (max_steps 600).
FULL_1GPU_OWN = {"questions_per_round", "per_device_train_batch_size", "steps_per_generation",
                 "gradient_accumulation_steps", "optimizer_steps_per_round", "save_steps", "max_steps",
                 "total_rounds"}  # fmt: skip


def fidelity_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """``{heading: rows}`` of the tables under "## Fidelity to the paper's run" (a row: column -> cell)."""
    section = text.split("## Fidelity to the paper's run", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, list[dict[str, str]]] = {}
    heading = None
    header: list[str] | None = None
    for line in section.splitlines():
        if line.startswith("### "):
            heading, header = line[4:].strip(), None
        elif line.startswith("|") and heading is not None:
            # A cell writes a literal pipe as `\|` (Markdown); split on the other pipes only.
            cells = [c.strip().replace("\\|", "|") for c in UNESCAPED_PIPE.split(line.strip()[1:-1])]
            if header is None:
                header = cells
            elif not set(line) <= set("|-: "):
                assert len(cells) == len(header), f"{heading}: row {line!r} has {len(cells)} cells"
                tables.setdefault(heading, []).append(dict(zip(header, cells)))
    return tables


def expected_values(rows: list[dict[str, str]], column: str) -> dict[str, object]:
    """The ``key: value`` items of one column, values parsed as YAML."""
    out: dict[str, object] = {}
    for row in rows:
        for key, value in ITEM.findall(row[column]):
            out[key] = yaml.safe_load(value)
    return out


TABLES = fidelity_tables(DOC.read_text())


def _table(recipe: str, tables: dict[str, list[dict[str, str]]] = TABLES) -> list[dict[str, str]]:
    """The rows of the table whose heading names ``recipes/qwen2.5-math-1.5b/<recipe>``."""
    suffix = f"`recipes/qwen2.5-math-1.5b/{recipe}`"
    return next(rows for heading, rows in tables.items() if heading.endswith(suffix))


MAIN = _table("prompt_aug.yaml")


def _parsed(recipe: Path, processes: int) -> dict[str, object]:
    script_args, args, model_args, demo_args = train.parse_args(
        ["--config", str(recipe), "--dry_run", "--num_processes", str(processes)]
    )
    arithmetic = batch_arithmetic(args, script_args)
    values: dict[str, object] = {}
    for obj in (model_args, args, demo_args, script_args):
        values.update(vars(obj))
    values.update({k: getattr(arithmetic, k) for k in ARITHMETIC})
    values["optim"] = str(args.optim.value)
    return values


def _check(recipe: Path, expected: dict[str, object], processes: int = 8) -> None:
    got = _parsed(recipe, processes)
    unknown = sorted(k for k in expected if k not in got)
    assert not unknown, f"docs/reproduce.md names keys that are not recipe keys: {unknown}"
    wrong = {k: (v, got[k]) for k, v in expected.items() if got[k] != v}
    assert not wrong, f"{recipe.name} differs from the fidelity table (table, recipe): {wrong}"


def test_the_tables_are_there_and_cover_every_fidelity_setting():
    settings = {row["Setting"] for row in MAIN}
    for needed in ("Training data", "Prompt length", "Completion length", "Questions per round", "Mini-batch",
                   "Optimizer", "Clip", "Dual clip", "Loss aggregation", "Advantage", "KL", "Entropy bonus",
                   "Rollout sampling", "Stop rule", "Epochs", "Save cadence",
                   "Rollout vs trainer mismatch"):  # fmt: skip
        assert needed in settings, needed
    assert len(expected_values(MAIN, "Our keys")) >= 40
    evaluation = next(rows for heading, rows in TABLES.items() if heading.startswith("Evaluation"))
    assert {"Engine", "Precision", "Decoding", "Runs", "Length"} <= {row["Setting"] for row in evaluation}


def test_main_recipe_matches_every_row():
    _check(PAPER / "prompt_aug.yaml", expected_values(MAIN, "Our keys"))


@pytest.mark.parametrize("recipe", ["dapo_single_template.yaml", "grpo_single_template.yaml"])
def test_variant_recipes_match_the_main_rows_and_their_own(recipe):
    expected = {**expected_values(MAIN, "Our keys"), **expected_values(_table(recipe), "Our keys")}
    _check(PAPER / recipe, expected)


def test_lora_recipe_keeps_the_loss_rollout_and_fidelity_rows():
    expected = {k: v for k, v in expected_values(MAIN, "Our keys").items() if k not in LORA_OWN}
    _check(PAPER / "prompt_aug_lora_1gpu.yaml", expected, processes=1)


def test_full_1gpu_recipe_keeps_every_row_but_the_batch():
    expected = {k: v for k, v in expected_values(MAIN, "Our keys").items() if k not in FULL_1GPU_OWN}
    _check(PAPER / "prompt_aug_1gpu_full.yaml", expected, processes=1)


def test_fidelity_settings_are_written_in_every_paper_recipe_not_left_to_defaults():
    for recipe in sorted(PAPER.glob("*.yaml")):
        raw = yaml.safe_load(recipe.read_text())
        assert raw["vllm_importance_sampling_correction"] is False, recipe.name
        assert raw["delta"] == 3.0 and raw["save_total_limit"] >= 1, recipe.name
        assert raw["wandb_completions_rows"] is not None, f"{recipe.name}: W&B table must be off or sampled"
        # The paper's stop rule, written out: its vLLM rollouts stop at EOS only, and its reward grades the
        # response decoded without special tokens, <|im_end|> dropped and what follows it kept.
        assert raw["stop_tokens"] == ["<|endoftext|>"], recipe.name
        assert raw["reward_cut_tokens"] == [], recipe.name
    grpo = yaml.safe_load((PAPER / "grpo_single_template.yaml").read_text())
    assert grpo["use_bias_correction_kl"] is False and grpo["num_train_epochs"] == 20


def test_evaluation_command_matches_the_evaluation_table():
    heading, rows = next((h, r) for h, r in TABLES.items() if h.startswith("Evaluation"))
    command = re.search(r"`prompt-aug-eval (--model M[^`]*)`", heading).group(1).split()
    args = vars(evaluate.parse_args(command))
    expected = expected_values(rows, "Our flags")
    wrong = {k: (v, args[k[2:]]) for k, v in expected.items() if args[k[2:]] != v}
    assert not wrong, f"prompt-aug-eval differs from the evaluation table (table, parsed): {wrong}"
    protocol = {k: args[k] for k in evaluate.PAPER_PROTOCOL if k in args}
    assert evaluate.protocol_differences({**protocol, "template": args["template"]}) == []


def test_paper_recipe_headers_state_the_round_to_step_mapping():
    for recipe in sorted(PAPER.glob("*.yaml")):
        header = "\n".join(line for line in recipe.read_text().splitlines() if line.startswith("#"))
        assert "Rounds and steps" in header and "`round`" in header, recipe.name
        if "1gpu" not in recipe.name:  # the one-GPU recipes have rounds of their own size
            assert "paper step N = our checkpoint-4N" in header, recipe.name


def test_a_drifted_table_is_caught(tmp_path):
    # Guards the parser: a changed value in the page must fail the comparison.
    drifted = DOC.read_text().replace("`delta: 3.0`", "`delta: 2.0`")
    rows = _table("prompt_aug.yaml", fidelity_tables(drifted))
    with pytest.raises(AssertionError, match="delta"):
        _check(PAPER / "prompt_aug.yaml", expected_values(rows, "Our keys"))


def test_a_paper_recipe_cut_short_by_max_steps_is_caught(tmp_path):
    # The run's length is a fidelity row: a copy of the paper recipe stopped at 1000 optimizer steps fails.
    short = tmp_path / "prompt_aug.yaml"
    short.write_text((PAPER / "prompt_aug.yaml").read_text().replace("max_steps: -1", "max_steps: 1000"))
    with pytest.raises(AssertionError, match=r"'max_steps': \(-1, 1000\), 'total_rounds': \(3960, 250\)"):
        _check(short, expected_values(MAIN, "Our keys"))
