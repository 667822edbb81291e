"""LoRA adapter folders: merging one into its base, and a recorded base model that is not there."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from lora_tools import save_lora_adapter

from prompt_aug.adapters import AdapterError, main, merge

REPO = Path(__file__).resolve().parents[1]


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_merged_adapter_computes_what_base_plus_adapter_computes_and_keeps_the_runs_files(
    tiny_model_dir, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    bank = "## Template bank\n\nabel\n"
    card = f'---\nlibrary_name: transformers\n---\n\n# run\n\nm = A.from_pretrained("{folder}")\n\n{bank}'
    (folder / "README.md").write_text(card)  # the run's card
    out = merge(folder)
    assert out == tmp_path / "run-merged" and not (out / "adapter_config.json").exists()
    expected = (
        f'---\nlibrary_name: transformers\n---\n\n# run-merged\n\nm = A.from_pretrained("{out}")\n\n{bank}'
    )
    assert (out / "README.md").read_text() == expected  # its own title, and loading from the merged folder
    ids = torch.tensor([[1, 7, 9, 3, 11]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected = _logits(
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), folder), ids
    )
    merged = _logits(AutoModelForCausalLM.from_pretrained(out), ids)
    torch.testing.assert_close(merged, expected, rtol=1e-4, atol=1e-4)
    assert (merged - _logits(base, ids)).abs().max() > 1e-2  # the adapter did change the model
    config = GenerationConfig.from_pretrained(out)
    assert (config.eos_token_id, config.max_new_tokens) == ([2, 5], 7)  # the run's, not the base's
    assert (
        AutoTokenizer.from_pretrained(out).chat_template
        == AutoTokenizer.from_pretrained(folder).chat_template
    )
    assert not list(tmp_path.glob(".run-merged.partial-*"))
    umask = os.umask(0o022)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # as any folder made here, not the owner's alone
    modes = {path.name: path.stat().st_mode & 0o777 for path in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~umask}  # as any file made here


def test_an_adapter_on_a_vision_language_model_merges_into_the_whole_model(tiny_model_dir, tmp_path):
    """Mistral 3 is no causal LM to transformers' auto class: the base loads as a vision-language model, and
    the merged folder computes what base plus adapter compute."""
    from peft import PeftModel
    from test_models import _tiny_vision_language
    from transformers import AutoModelForImageTextToText

    base = _tiny_vision_language(tmp_path / "mistral3", "mistral3", tiny_model_dir)
    folder = save_lora_adapter(base, tmp_path / "run", model_class=AutoModelForImageTextToText)
    out = merge(folder, dtype="float32")
    ids = torch.tensor([[1, 7, 9, 3, 11]])
    adapted = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(base), folder)
    merged = AutoModelForImageTextToText.from_pretrained(out)
    assert type(merged).__name__ == "Mistral3ForConditionalGeneration"
    torch.testing.assert_close(_logits(merged, ids), _logits(adapted, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
@pytest.mark.parametrize("trained_on", ["AutoModelForCausalLM", "AutoModelForImageTextToText"])
def test_an_adapter_applies_whether_trained_on_the_text_model_or_the_whole_vision_language_model(
    trained_on, safe, tiny_model_dir, tmp_path
):
    """A Qwen3.5 checkpoint loads as its text model (the causal-LM auto class) or whole (TRL's class, from its
    config's architectures), whose modules are named apart. An adapter trained on either is merged into, and
    evaluated on, the model it was trained on; PEFT skipped the modules it could not find with a warning,
    leaving the base model."""
    import transformers
    from peft import PeftModel
    from test_models import _tiny_vision_language

    from prompt_aug.evaluation.backends import HFBackend

    base = _tiny_vision_language(tmp_path / "qwen3_5", "qwen3_5", tiny_model_dir)
    trained_class = getattr(transformers, trained_on)
    folder = save_lora_adapter(base, tmp_path / "run", model_class=trained_class, safe_serialization=safe)
    ids = torch.tensor([[1, 7, 9, 3, 11]])
    expected = _logits(PeftModel.from_pretrained(trained_class.from_pretrained(base), folder), ids)
    assert (expected - _logits(trained_class.from_pretrained(base), ids)).abs().max() > 1e-2
    merged = trained_class.from_pretrained(merge(folder, dtype="float32"))
    torch.testing.assert_close(_logits(merged, ids), expected, rtol=1e-4, atol=1e-4)
    evaluated = HFBackend.load(str(folder), dtype="float32", device="cpu").model
    torch.testing.assert_close(_logits(evaluated, ids), expected, rtol=1e-4, atol=1e-4)


def test_the_modules_an_adapter_adapts_are_read_from_its_weights_as_the_trained_model_named_them(tmp_path):
    """Linear and embedding LoRA, and parameters adapted in place (``lora_target_parameters``: a MoE's
    experts, saved under ``base_layer``), each name the module of the model it was trained on; other keys
    do not."""
    from safetensors.torch import save_file

    from prompt_aug.adapters import adapted_modules

    keys = [
        "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_B.weight",
        "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight",
        "base_model.model.model.embed_tokens.lora_embedding_A",
        "base_model.model.lm_head.modules_to_save.weight",
    ]
    (tmp_path / "adapter_config.json").write_text("{}")
    save_file({key: torch.zeros(1) for key in keys}, str(tmp_path / "adapter_model.safetensors"))
    assert adapted_modules(tmp_path) == {
        "model.language_model.layers.0.self_attn.q_proj", "model.layers.1.mlp.experts", "model.embed_tokens",
    }  # fmt: skip


def test_a_merged_models_card_is_a_full_models_with_no_evaluation_of_the_adapters(tiny_model_dir, tmp_path):
    """The adapter's evaluation is another model's: the merged card has none until the merged folder is
    evaluated; its metadata is a full model's (no adapter or lora tag, no local base_model the Hub would
    refuse)."""
    from huggingface_hub import ModelCard

    from prompt_aug.model_card import NO_EVALUATION

    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    (folder / "README.md").write_text(
        f"---\nbase_model: {tiny_model_dir}\nlibrary_name: peft\ntags:\n"
        f"- base_model:adapter:{tiny_model_dir}\n- lora\n- trl\n"
        "model-index:\n- name: run\n  results:\n  - task:\n      type: text-generation\n"
        "    dataset:\n      name: AIME24\n      type: lkevinzc/math-eval\n    metrics:\n"
        "    - type: accuracy\n      value: 40.0\n---\n\n# run\n\n## Evaluation\n\n| Model | AIME24 |\n"
        "|---|---:|\n| run | 40.0 |\n\n## Template bank\n\nabel\n"
    )
    card = ModelCard((merge(folder) / "README.md").read_text())
    assert card.data.to_dict() == {
        "library_name": "transformers",
        "tags": ["trl"],
        "model_name": "run-merged",
    }
    assert card.text == f"\n# run-merged\n\n## Evaluation\n\n{NO_EVALUATION}\n\n## Template bank\n\nabel\n"


def test_a_relative_base_read_from_elsewhere_is_one_line_and_base_gives_the_way_out(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    shutil.copytree(tiny_model_dir, tmp_path / "base")
    monkeypatch.chdir(tmp_path)
    folder = save_lora_adapter(Path("base"), tmp_path / "run", recorded="./base")
    monkeypatch.chdir(tmp_path / "run")  # ./base is not here
    message = _refusal(["merge", str(folder)])
    assert "'./base' is not there" in message and str(folder) in message
    assert "run from the folder it was trained in" in message  # a relative path: where it is read from
    assert message.endswith("or pass --base <folder or Hub id>") and "\n" not in message
    assert not (tmp_path / "run-merged").exists()
    main(["merge", str(folder), "--base", str(tmp_path / "base")])
    assert capsys.readouterr().out.strip() == str(tmp_path / "run-merged")
    assert (tmp_path / "run-merged" / "config.json").is_file()


def test_an_adapter_saved_without_a_tokenizer_merges_with_its_bases(tiny_model_dir, tmp_path):
    """An adapter saved by PEFT alone holds no tokenizer: the merged model takes its base's (chat template
    included), so vLLM and ``from_pretrained`` load it."""
    from transformers import AutoTokenizer

    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    for path in folder.iterdir():
        if path.name.startswith(("tokenizer", "chat_template", "special_tokens", "vocab", "merges")):
            path.unlink()
    out = merge(folder)
    base = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == base.chat_template and tokenizer.get_vocab() == base.get_vocab()
    # Evaluated as it is, the adapter takes its base's tokenizer too.
    from prompt_aug.evaluation.backends import load_tokenizer

    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.chat_template == base.chat_template and tokenizer.get_vocab() == base.get_vocab()


def test_merge_refuses_a_folder_that_is_no_adapter_and_an_output_that_is_not_empty(tiny_model_dir, tmp_path):
    with pytest.raises(AdapterError, match="a full model .*nothing to merge"):
        merge(tiny_model_dir)
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("keep me")
    with pytest.raises(AdapterError, match="taken exists and is not empty"):
        merge(folder, output=taken)
    assert (taken / "notes.txt").read_text() == "keep me" and len(list(taken.iterdir())) == 1
    notes = taken / "notes.txt"
    for output in (notes, notes / "out"):  # refused before the base loads, not by mkdir after the merge
        message = _refusal(["merge", str(folder), "--output", str(output)])
        assert message.startswith(f"prompt_aug.adapters: error: --output {output}")
        assert f"{notes} is a file, not a folder; pass another --output" in message and "\n" not in message
    assert notes.read_text() == "keep me"


def test_merge_of_what_is_no_adapter_says_what_it_is_and_what_to_give(tiny_model_dir, tmp_path):
    """A misspelt folder names the close one; a file, a full model (nothing to merge) and a LoRA run that
    stopped before saving its adapter (its last checkpoint) each say so, in one line, writing nothing."""
    run = tmp_path / "lora-run"
    for step in (2, 10):  # the last is checkpoint-10, not checkpoint-2 (a numeric order, not the names')
        save_lora_adapter(tiny_model_dir, run / f"checkpoint-{step}")
    (tmp_path / "notes.txt").write_text("keep")
    cases = {
        tmp_path / "lora-rnu": f"{tmp_path / 'lora-rnu'}: no such folder; did you mean {run}?",
        tmp_path / "notes.txt": f"{tmp_path / 'notes.txt'}: a file, not a LoRA adapter folder",
        tiny_model_dir: f"{tiny_model_dir}: a full model (config.json, no adapter_config.json), not a LoRA "
        "adapter: there is nothing to merge",
        run: f"{run}: no adapter_config.json (the run saved no final adapter, stopped early?); merge one of "
        f"its checkpoints, the last being {run / 'checkpoint-10'}",
    }
    for folder, expected in cases.items():
        message = _refusal(["merge", str(folder)])
        assert message.startswith(f"prompt_aug.adapters: error: {expected}") and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora-run", "notes.txt"]


def test_a_base_other_than_the_recorded_one_still_there_is_merged_as_asked_and_warned_of(
    tiny_model_dir, tmp_path, monkeypatch, caplog
):
    """The adapter applied to another model of the same shapes (its merged copy, a sibling fine-tune) loads
    without error: the merge names both models. The recorded base by another path, or its weights in another
    folder, is no other model."""
    from transformers import AutoModelForCausalLM

    from prompt_aug.demo.smoke import build_tiny_model

    other = build_tiny_model(tmp_path / "other", seed=1)  # same shapes, other weights
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    with caplog.at_level("WARNING", logger="prompt_aug"):
        merge(folder, base=str(other), output=tmp_path / "onto-other")
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"--base {other}: the adapter in {folder} was trained on {tiny_model_dir}")
    assert "leave --base out" in warning and (tmp_path / "onto-other" / "config.json").is_file()
    caplog.clear()
    monkeypatch.chdir(tiny_model_dir.parent)
    with caplog.at_level("WARNING", logger="prompt_aug"):
        merge(folder, base=f"./{tiny_model_dir.name}", output=tmp_path / "onto-its-own")
        copy = tmp_path / "copy"
        AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(copy)  # the same weights
        merge(folder, base=str(copy), output=tmp_path / "onto-a-copy")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_an_output_another_process_fills_during_the_merge_is_left_as_it_is_in_one_line(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Checked free before the base loads, then written by another merge (or anything else) while this one
    computes: its files stay, and the message says so, with no partial folder left beside it."""
    from prompt_aug import adapters

    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    target = tmp_path / "run-merged"
    copy = shutil.copy2

    def copy_while_another_writes(source, destination):
        target.mkdir(exist_ok=True)
        (target / "theirs.txt").write_text("keep")
        return copy(source, destination)

    monkeypatch.setattr(adapters.shutil, "copy2", copy_while_another_writes)
    with pytest.raises(AdapterError) as err:
        merge(folder)
    assert str(err.value).startswith(f"--output {target}: written by another process during the merge")
    assert "\n" not in str(err.value) and sorted(p.name for p in target.iterdir()) == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run-merged"]


def test_merge_refuses_a_base_that_is_an_adapter_and_an_adapter_without_weights(tiny_model_dir, tmp_path):
    """Both fail in one line before anything loads: PEFT would take an adapter given as the base for a
    version mismatch, and a folder without adapter weights for a Hub id."""
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    other = save_lora_adapter(tiny_model_dir, tmp_path / "other")
    message = _refusal(["merge", str(folder), "--base", str(other)])
    assert message.startswith(f"prompt_aug.adapters: error: --base {other}: a PEFT adapter folder")
    assert "merge it first" in message and "\n" not in message
    assert not (tmp_path / "run-merged").exists()
    (folder / "adapter_model.safetensors").unlink()
    message = _refusal(["merge", str(folder), "--base", str(tiny_model_dir)])
    assert message.startswith(f"prompt_aug.adapters: error: {folder}: adapter_config.json but no adapter")
    assert "adapter_model.safetensors" in message and "\n" not in message
    assert not (tmp_path / "run-merged").exists()


def test_a_checkpoints_merge_goes_beside_the_run_and_a_relative_folder_works(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Merged into the run's folder, ``checkpoint-N-merged`` would be taken for a checkpoint (rotation and
    --overwrite_output_dir delete it): it goes beside the run. ``.`` names the folder one stands in."""
    checkpoint = save_lora_adapter(tiny_model_dir, tmp_path / "run" / "checkpoint-4")
    assert merge(checkpoint) == tmp_path / "run-checkpoint-4-merged"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint-4"]
    monkeypatch.chdir(save_lora_adapter(tiny_model_dir, tmp_path / "mine"))
    assert merge(".") == tmp_path / "mine-merged" and (tmp_path / "mine-merged" / "config.json").is_file()


def test_evaluating_an_adapter_refuses_vllm_and_a_missing_base_before_loading(tiny_model_dir, tmp_path):
    from prompt_aug.evaluate import main as evaluate

    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    rest = ["--benchmarks", "aime24", "--output", str(tmp_path / "eval"), "--no_progress"]
    with pytest.raises(
        SystemExit, match=r"a LoRA adapter, which vLLM does not load.*prompt_aug.adapters merge"
    ):
        evaluate(["--model", str(folder), *rest, "--backend", "vllm"])
    moved = save_lora_adapter(tiny_model_dir, tmp_path / "moved", recorded=str(tmp_path / "gone"))
    with pytest.raises(SystemExit, match=r"base model '.*gone' is not there"):
        evaluate(["--model", str(moved), *rest, "--backend", "hf"])
    # Offline (conftest), a Hub id the cache does not hold: one line too, before anything is written.
    hub = save_lora_adapter(tiny_model_dir, tmp_path / "hub", recorded="nobody-here/no-such-base")
    with pytest.raises(SystemExit, match=r"^prompt-aug-eval: error: --model .*hub: its LoRA adapter's base"):
        evaluate(["--model", str(hub), *rest, "--backend", "hf"])
    assert not (tmp_path / "eval").exists()


def test_training_on_an_adapter_folder_stops_in_one_line_and_its_merged_folder_trains(
    tiny_model_dir, tmp_path
):
    """Loaded from an adapter folder, the model is the base with that adapter, and TRL's new LoRA adapter
    takes its name: the saved adapter records the base alone and computes another model than the one
    trained. The folder is refused, with use_peft or without, whether its base is there or gone; merged, it
    trains: one optimizer step through the entry point moves every weight."""
    from safetensors.torch import load_file
    from trl import ModelConfig

    from prompt_aug import train
    from prompt_aug.models import ModelArgsError, resolve_model_path

    args = type("Args", (), {"output_dir": str(tmp_path / "out"), "seed": 0})()
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    gone = save_lora_adapter(tiny_model_dir, tmp_path / "moved", recorded=str(tmp_path / "gone"))
    for adapter in (folder, gone):
        for use_peft in (True, False):
            with pytest.raises(ModelArgsError) as err:
                resolve_model_path(ModelConfig(model_name_or_path=str(adapter), use_peft=use_peft), args)
            message = str(err.value)
            assert message.startswith(f"model_name_or_path {adapter}: a PEFT adapter folder"), message
            assert f"python -m prompt_aug.adapters merge {adapter}" in message and "\n" not in message
    merged = merge(folder)
    assert resolve_model_path(ModelConfig(model_name_or_path=str(merged), use_peft=True), args) == str(merged)
    # One optimizer step of the smoke recipe on the merged folder, with a reward whose groups have spread.
    out = tmp_path / "trained"
    train.main([
        "--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"), "--model_name_or_path", str(merged),
        "--output_dir", str(out), "--max_steps", "1", "--steps_per_generation", "1",
        "--max_completion_length", "8", "--save_strategy", "no", "--learning_rate", "1e-2",
        "--reward_funcs", "fault_harness:text_hash_reward",
    ])  # fmt: skip
    before, after = load_file(merged / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    still = [name for name in before if torch.equal(before[name], after[name])]
    assert not still, f"tensors one step left unchanged: {still}"


def test_an_adapter_config_without_a_base_or_that_does_not_parse_is_one_line_naming_it(
    tiny_model_dir, tmp_path, capsys
):
    """No recorded base: merge names the folder and says to pass --base, which then works; the evaluation
    refuses it before loading. A config that does not parse: the error names the file."""
    from prompt_aug.evaluate import main as evaluate

    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    message = _refusal(["merge", str(folder)])
    assert f"merge {folder}: a LoRA adapter whose adapter_config.json records no base model" in message
    assert message.endswith("; pass --base <folder or Hub id>") and "\n" not in message
    assert not (tmp_path / "run-merged").exists()
    rest = ["--benchmarks", "aime24", "--output", str(tmp_path / "eval"), "--no_progress", "--backend", "hf"]
    with pytest.raises(SystemExit, match=r"^prompt-aug-eval: error: --model .*run: .* records no base model"):
        evaluate(["--model", str(folder), *rest])
    main(["merge", str(folder), "--base", str(tiny_model_dir)])
    assert capsys.readouterr().out.strip() == str(tmp_path / "run-merged")
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "base_model_name_or_pa')  # cut short
    for argv in (["merge", str(folder)], ["merge", str(folder), "--base", str(tiny_model_dir)]):
        message = _refusal([*argv, "--output", str(tmp_path / "again")])
        assert message.startswith(
            f"prompt_aug.adapters: error: {folder / 'adapter_config.json'}: not valid JSON"
        )
        assert "\n" not in message
    assert not (tmp_path / "again").exists()


def test_a_lora_runs_card_keeps_peft_metadata_and_its_merged_card_a_full_models(tiny_model_dir, tmp_path):
    """TRL writes its card after PEFT has written its own: the trainer's card of a PEFT model still says
    ``library_name: peft`` with the ``lora`` tag and, for a base with a Hub id, ``base_model:adapter:<id>``
    (never a local path); merged, the card is a full model's."""
    from datasets import Dataset
    from huggingface_hub import ModelCard
    from peft import LoraConfig

    from prompt_aug import PromptAugGRPOConfig, PromptAugGRPOTrainer
    from prompt_aug.model_card import ModelCardInfo
    from prompt_aug.templates import load_templates, select_templates
    from rewards import correctness_reward

    out = tmp_path / "run"
    args = PromptAugGRPOConfig(
        output_dir=str(out), per_device_train_batch_size=4, num_generations=4, max_steps=1,
        max_completion_length=8, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
    )  # fmt: skip
    templates, weights = select_templates(load_templates(), ["qwen-math", "abel"])
    hub_base = "Qwen/Qwen2.5-Math-1.5B"  # as a recipe names its base; the weights are the tiny model's
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=correctness_reward, args=args,
        train_dataset=Dataset.from_dict({"question": ["What is 1 + 1?"] * 4, "answer": ["2"] * 4}),
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
        model_card=ModelCardInfo(hub_base, "use_peft: true\n", templates, weights, "synthetic", 4),
    )  # fmt: skip
    trainer.save_model(str(out))  # as prompt-aug-train ends a run: PEFT's card, then the trainer's
    trainer.create_model_card()
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "peft" and card.data.base_model == hub_base
    assert {"lora", f"base_model:adapter:{hub_base}", "trl", "grpo", "prompt-augmentation"} <= set(
        card.data.tags
    )
    assert "## Template bank" in card.text and "# Model Card for run" in card.text  # ours and TRL's
    assert "<!-- prompt-aug card sha256:" in (out / "README.md").read_text()  # the run's card, as written
    merged = ModelCard.load(merge(out) / "README.md")
    assert merged.data.library_name == "transformers"
    assert "prompt-aug card sha256" not in merged.text  # the run card's digest is not this card's
    assert not [t for t in merged.data.tags if t.startswith("base_model:adapter:") or t == "lora"]
    trainer.model_card_info.base_model = str(tiny_model_dir)  # a base known by its local path only
    trainer.create_model_card()
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "peft" and "lora" in card.data.tags
    assert card.data.base_model is None and not [t for t in card.data.tags if "base_model:" in t]


def _refusal(argv: list[str]) -> str:
    """The message ``prompt_aug.adapters`` stops with on ``argv``."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return str(exit_info.value.code)


def _safetensors_keys(folder: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        return set(weights.keys())


def test_a_lora_on_the_lm_head_of_a_tied_base_changes_the_lm_head_alone(tiny_model_dir, tmp_path):
    """The tiny base ties lm_head to embed_tokens. Merged into that shared weight, an lm_head delta would
    change the input embeddings too: the merged model is saved untied and computes what base plus adapter
    computes. An adapter that touches neither keeps its base's tied embeddings."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    assert AutoConfig.from_pretrained(tiny_model_dir).tie_word_embeddings
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "head", targets=("q_proj", "lm_head"))
    out = merge(folder)
    ids = torch.tensor([[1, 7, 9, 3, 11]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected = _logits(
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), folder), ids
    )
    merged = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(_logits(merged, ids), expected, rtol=0, atol=1e-5)
    assert not merged.config.tie_word_embeddings and "lm_head.weight" in _safetensors_keys(out)
    torch.testing.assert_close(merged.get_input_embeddings().weight, base.get_input_embeddings().weight)
    assert (merged.lm_head.weight - base.lm_head.weight).abs().max() > 1e-2  # the adapter did change it
    untouched = merge(save_lora_adapter(tiny_model_dir, tmp_path / "attention"))
    assert AutoConfig.from_pretrained(untouched).tie_word_embeddings
    assert "lm_head.weight" not in _safetensors_keys(untouched)


def test_merge_in_float32_keeps_a_small_delta_that_a_bf16_base_rounds(tiny_model_dir, tmp_path):
    """Merged in the base's bf16, W + dW is rounded to bf16 and a small LoRA delta is mostly lost; with
    --dtype float32 the merged weight is W + dW as PEFT computes it."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    bf16 = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).save_pretrained(bf16)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(bf16)
    folder = save_lora_adapter(bf16, tmp_path / "run", scale=1e-4)
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.float32), folder
    )
    layer = adapted.base_model.model.model.layers[0].self_attn.q_proj
    exact = layer.base_layer.weight.detach() + layer.get_delta_weight("default").detach()

    def q_proj(out: Path) -> torch.Tensor:
        return AutoModelForCausalLM.from_pretrained(out).model.layers[0].self_attn.q_proj.weight.detach()

    main(["merge", str(folder), "--dtype", "float32", "--output", str(tmp_path / "float32")])
    assert AutoConfig.from_pretrained(tmp_path / "float32").dtype == torch.float32
    torch.testing.assert_close(q_proj(tmp_path / "float32"), exact, rtol=0, atol=1e-7)
    rounded = merge(folder, output=tmp_path / "bf16-merged")  # the default: the base's dtype, as stored
    assert AutoConfig.from_pretrained(rounded).dtype == torch.bfloat16
    delta = exact - layer.base_layer.weight.detach()
    kept = q_proj(rounded).float() - layer.base_layer.weight.detach()
    assert (kept - delta).norm() > 0.1 * delta.norm()  # what --dtype float32 is for
    with pytest.raises(SystemExit):
        main(["merge", str(folder), "--dtype", "int8"])


def test_a_base_of_other_shapes_is_one_line_naming_where_it_came_from(tiny_model_dir, tmp_path):
    from prompt_aug.demo.smoke import build_tiny_model

    other = build_tiny_model(tmp_path / "other", name="small-random-qwen2")  # hidden 128, not 64
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    message = _refusal(["merge", str(folder), "--base", str(other)])
    assert message.startswith(f"prompt_aug.adapters: error: --base {other}: not the model the adapter in")
    assert "q_proj.lora_A is [4, 64] in the adapter, [4, 128] in the base" in message
    assert message.endswith("pass --base the model it was trained on")
    assert "\n" not in message
    moved = save_lora_adapter(tiny_model_dir, tmp_path / "moved", recorded=str(other))
    with pytest.raises(
        AdapterError, match=rf"^merge {moved}: its LoRA adapter's base model {other}: not the"
    ):
        merge(moved)
    assert not (tmp_path / "run-merged").exists() and not (tmp_path / "moved-merged").exists()


def test_a_recorded_base_that_cannot_be_had_is_named_as_recorded_and_base_is_the_way_out(
    tiny_model_dir, tmp_path, unreachable_hub
):
    """The message names the adapter's recorded base (the user passed no --base) and ends with --base; only a
    relative recorded path is said to depend on the folder it is read from."""
    hub = save_lora_adapter(tiny_model_dir, tmp_path / "hub", recorded="nobody-here/no-such-base")
    gone = save_lora_adapter(tiny_model_dir, tmp_path / "moved", recorded=str(tmp_path / "gone"))
    for folder, why in ((hub, "cannot reach the Hugging Face Hub"), (gone, "is not there")):
        message = _refusal(["merge", str(folder)])
        assert message.startswith(f"prompt_aug.adapters: error: merge {folder}: ") and why in message
        assert message.endswith("pass --base <folder or Hub id>") and "\n" not in message
        assert "set merge" not in message and "run from the folder" not in message
    with pytest.raises(SystemExit) as exit_info:
        main(["merge", str(hub), "--base", "nobody-here/no-such-base"])
    assert str(exit_info.value.code).startswith("prompt_aug.adapters: error: --base: cannot reach the")


def test_a_recorded_base_fetched_on_another_machine_names_the_fetched_models_short_name(
    tiny_model_dir, tmp_path, monkeypatch
):
    """An adapter trained on a fetched model records that machine's folder; here the short name finds this
    machine's copy."""
    from prompt_aug.sources import HOME_ENV, MARKER_FILE, default_dir, marker_text

    name = "smollm2-135m-instruct"
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    shutil.copytree(tiny_model_dir, default_dir(name))
    (default_dir(name) / MARKER_FILE).write_text(marker_text(name))
    elsewhere = f"/home/someone/.cache/prompt_aug/models/{name}"
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run", recorded=elsewhere)
    message = _refusal(["merge", str(folder)])
    assert message.startswith(f"prompt_aug.adapters: error: merge {folder}: a LoRA adapter whose base model")
    assert message.endswith(
        f"pass --base <folder or Hub id> (it is the fetched model {name}: --base {name} names it here, once "
        f"`python -m prompt_aug.models fetch {name}` has run)"
    )
    assert merge(folder, base=name) == tmp_path / "run-merged"


def test_an_uncached_recorded_hub_base_offline_names_the_adapter_and_base(tiny_model_dir, tmp_path):
    hub = save_lora_adapter(tiny_model_dir, tmp_path / "hub", recorded="nobody-here/no-such-base")
    with pytest.raises(AdapterError) as err:
        merge(hub)
    assert str(err.value) == (
        f"merge {hub}: its LoRA adapter's base model nobody-here/no-such-base: not in the Hugging Face cache "
        "(HF_HUB_OFFLINE=1); run once online, or pass --base <folder or Hub id>"
    )
    with pytest.raises(Exception, match=r"^--base nobody-here/no-such-base: not in the Hugging Face cache"):
        merge(hub, base="nobody-here/no-such-base")


def test_a_checkpoints_placeholder_card_is_not_carried(tiny_model_dir, tmp_path):
    """PEFT writes a placeholder card into each checkpoint (an adapter's, "Model Card for Model ID"): the
    merged full model gets no card rather than that one."""
    checkpoint = save_lora_adapter(tiny_model_dir, tmp_path / "run" / "checkpoint-4")
    assert "Model Card for Model ID" in (checkpoint / "README.md").read_text()
    assert not (merge(checkpoint) / "README.md").exists()


def test_base_takes_a_fetched_models_short_name_as_training_and_evaluation_do(
    tiny_model_dir, tmp_path, monkeypatch
):
    """``--base smollm2-135m-instruct`` is the folder that ``python -m prompt_aug.models fetch`` wrote (here a
    tiny model put there, with the fetch's marker), not a Hub id to reach; unfetched, the fetch command is
    named."""
    from prompt_aug.sources import HOME_ENV, MARKER_FILE, default_dir, marker_text

    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    message = _refusal(["merge", str(folder), "--base", "smollm2-135m-instruct"])
    assert "'smollm2-135m-instruct' is not fetched yet" in message
    assert "python -m prompt_aug.models fetch smollm2-135m-instruct" in message and "\n" not in message
    fetched = default_dir("smollm2-135m-instruct")
    shutil.copytree(tiny_model_dir, fetched)
    (fetched / MARKER_FILE).write_text(marker_text("smollm2-135m-instruct"))
    out = merge(folder, base="smollm2-135m-instruct", output=tmp_path / "merged")
    ids = torch.tensor([[1, 7, 9, 3, 11]])
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    expected = _logits(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(fetched), folder), ids)
    torch.testing.assert_close(_logits(AutoModelForCausalLM.from_pretrained(out), ids), expected)


def test_a_resumed_adapter_is_held_to_the_base_it_records_where_that_can_be_told(tiny_model_dir, tmp_path):
    from prompt_aug.adapters import resumed_base_problem
    from prompt_aug.demo.smoke import build_tiny_model

    checkpoint = save_lora_adapter(tiny_model_dir, tmp_path / "checkpoint-2")
    copy = Path(shutil.copytree(tiny_model_dir, tmp_path / "copy"))
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert resumed_base_problem(checkpoint, str(tiny_model_dir)) is None
    assert resumed_base_problem(checkpoint, str(copy)) is None  # another folder, the same weights
    assert "was trained on" in resumed_base_problem(checkpoint, str(other))
    hub = save_lora_adapter(tiny_model_dir, tmp_path / "hub", recorded="Qwen/Qwen2.5-Math-1.5B")
    assert resumed_base_problem(hub, "qwen/qwen2.5-math-1.5b") is None
    larger = resumed_base_problem(hub, "Qwen/Qwen2.5-Math-7B")
    assert "not on model_name_or_path Qwen/Qwen2.5-Math-7B" in larger
    assert resumed_base_problem(hub, str(tiny_model_dir)) is None  # a local copy of the Hub model, perhaps
    moved = save_lora_adapter(tiny_model_dir, tmp_path / "moved", recorded="/elsewhere/models/base")
    assert resumed_base_problem(moved, str(other)) is None  # recorded on another machine: not told apart


@pytest.mark.parametrize(
    ("targets", "lora"),
    [
        (("q_proj", "v_proj"), {"modules_to_save": ["lm_head"], "bias": "all", "use_rslora": True}),
        (("q_proj", "v_proj"), {"use_dora": True}),
        (("q_proj",), {"trainable_token_indices": [3, 5]}),
        (("q_proj", "embed_tokens", "lm_head"), {"ensure_weight_tying": True}),
    ],
    ids=["modules-to-save-bias-rslora", "dora", "trainable-tokens", "tied-lora"],
)
def test_a_merged_adapter_of_each_kind_computes_what_base_plus_adapter_computes(
    tiny_model_dir, tmp_path, targets, lora
):
    """PEFT acts on both tied embeddings where it sees the base tied, as in training (trainable tokens, and
    LoRA with ensure_weight_tying): the merge folds in what the adapter-applied tied base computes."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run", targets=targets, **lora)
    out = merge(folder)
    ids = torch.tensor([[1, 7, 9, 3, 11, 5]])  # tokens 3 and 5 are the trainable ones
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), folder)
    expected = _logits(adapted.eval(), ids)
    merged = _logits(AutoModelForCausalLM.from_pretrained(out).eval(), ids)
    torch.testing.assert_close(merged, expected, rtol=1e-4, atol=1e-4)
    base = _logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), ids)
    assert (merged - base).abs().max() > 1e-2  # the adapter did change the model


def test_an_adapter_peft_cannot_fold_in_is_refused_not_saved_half_merged(tiny_model_dir, tmp_path):
    """Trainable tokens beside a LoRA on the tied lm_head: PEFT's merge leaves its wrapper in the model,
    which saved would hold keys no loader reads. Refused in one line, naming the layer, writing nothing;
    merged, were PEFT to fold it, it would have to compute what base plus adapter computes."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder = save_lora_adapter(
        tiny_model_dir, tmp_path / "run", targets=("q_proj", "lm_head"), trainable_token_indices=[3, 5]
    )
    try:
        out = merge(folder)
    except AdapterError as err:
        assert str(err).startswith(f"{folder}: PEFT cannot fold this adapter into its base (lm_head ")
        assert "evaluate the adapter folder as it is" in str(err) and "\n" not in str(err)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
        return
    ids = torch.tensor([[1, 7, 9, 3, 11, 5]])
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), folder)
    torch.testing.assert_close(
        _logits(AutoModelForCausalLM.from_pretrained(out).eval(), ids),
        _logits(adapted.eval(), ids),
        rtol=1e-4,
        atol=1e-4,
    )


def test_a_quantized_base_is_refused_before_it_loads(tiny_model_dir, tmp_path):
    """Folded into 4-bit (or fp8, GPTQ...) weights, the delta is rounded away, and on a machine without the
    quantization library transformers asks to install it: the merge names the base and asks for the
    unquantized one, whether the adapter records it or --base gives it."""
    quantized = Path(shutil.copytree(tiny_model_dir, tmp_path / "base-4bit"))
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (quantized / "config.json").write_text(json.dumps(config))
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run", recorded=str(quantized))
    expected = "a quantized model (bitsandbytes), which the adapter's delta cannot be folded into"
    message = _refusal(["merge", str(folder)])
    assert message.startswith(f"prompt_aug.adapters: error: merge {folder}: its LoRA adapter's base model")
    assert f"{quantized}: {expected}" in message and "\n" not in message
    assert message.endswith("pass --base the unquantized model it was quantized from")
    message = _refusal(["merge", str(folder), "--base", str(quantized)])
    assert message.startswith(f"prompt_aug.adapters: error: --base {quantized}: {expected}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base-4bit", "run"]
    assert merge(folder, base=str(tiny_model_dir)) == tmp_path / "run-merged"


def test_a_base_of_another_architecture_is_one_line_naming_the_missing_modules(tiny_model_dir, tmp_path):
    """A GPT-2 has no q_proj or v_proj: PEFT's refusal becomes one line naming --base and the modules."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    other = tmp_path / "gpt2"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=1, n_head=4, n_positions=64)
    GPT2LMHeadModel(config).save_pretrained(other)
    tokenizer.save_pretrained(other)
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    message = _refusal(["merge", str(folder), "--base", str(other)])
    assert message.startswith(f"prompt_aug.adapters: error: --base {other}: not the model the adapter in")
    assert "'q_proj'" in message and "'v_proj'" in message and "are not in the base" in message
    assert message.endswith("pass --base the model it was trained on") and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2", "run"]


@pytest.mark.parametrize("lora", [{}, {"use_dora": True}], ids=["lora", "dora"])
def test_the_hf_evaluation_runs_an_adapter_folder_as_peft_runs_it_with_its_own_generation_config(
    tiny_model_dir, tmp_path, lora
):
    """``prompt-aug-eval --model <adapter folder>`` (hf backend) computes what PEFT computes on the base (a
    DoRA adapter too, whose magnitudes transformers' own adapter loading drops), and generates under the
    folder's generation config (the run's stop ids and length), not the base's."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from prompt_aug.evaluation.backends import HFBackend

    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run", **lora)
    backend = HFBackend.load(str(folder), device="cpu")
    ids = torch.tensor([[1, 7, 9, 3, 11]])
    expected = _logits(
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), folder), ids
    )
    torch.testing.assert_close(_logits(backend.model, ids), expected, rtol=1e-5, atol=1e-5)
    holder = backend.model.get_base_model() if hasattr(backend.model, "get_base_model") else backend.model
    assert (holder.generation_config.eos_token_id, holder.generation_config.max_new_tokens) == ([2, 5], 7)
