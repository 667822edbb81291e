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


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_merged_adapter_computes_what_base_plus_adapter_computes_and_keeps_the_runs_files(
    tiny_model_dir, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    card = f'---\nlibrary_name: transformers\n---\n\n# run\n\nm = A.from_pretrained("{folder}")\n'
    (folder / "README.md").write_text(card)  # the run's card
    out = merge(folder)
    assert out == tmp_path / "run-merged" and not (out / "adapter_config.json").exists()
    expected = f'---\nlibrary_name: transformers\n---\n\n# run-merged\n\nm = A.from_pretrained("{out}")\n'
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


def test_a_merged_models_card_is_a_full_models_with_no_evaluation_of_the_adapters(tiny_model_dir, tmp_path):
    """The adapter's evaluation is another model's: the merged card has none until the merged folder is
    evaluated; its metadata is a full model's (no adapter tag, no local base_model the Hub would refuse)."""
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
        "tags": ["lora", "trl"],
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
    with pytest.raises(SystemExit) as exit_info:
        main(["merge", str(folder)])
    message = str(exit_info.value.code)
    assert "'./base' is not there" in message and str(folder) in message and "--base" in message
    assert "\n" not in message
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
    with pytest.raises(AdapterError, match="no adapter_config.json there"):
        merge(tiny_model_dir)
    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("keep me")
    with pytest.raises(AdapterError, match="taken exists and is not empty"):
        merge(folder, output=taken)
    assert (taken / "notes.txt").read_text() == "keep me" and len(list(taken.iterdir())) == 1


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
    trains."""
    from trl import ModelConfig

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


def test_an_adapter_config_without_a_base_or_that_does_not_parse_is_one_line_naming_it(
    tiny_model_dir, tmp_path, capsys
):
    """No recorded base: merge names the folder and says to pass --base, which then works; the evaluation
    refuses it before loading. A config that does not parse: the error names the file."""
    from prompt_aug.evaluate import main as evaluate

    folder = save_lora_adapter(tiny_model_dir, tmp_path / "run")
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    with pytest.raises(SystemExit) as exit_info:
        main(["merge", str(folder)])
    message = str(exit_info.value.code)
    assert f"merge {folder}: a LoRA adapter whose adapter_config.json records no base model" in message
    assert "--base <the base model>" in message and "\n" not in message
    assert not (tmp_path / "run-merged").exists()
    rest = ["--benchmarks", "aime24", "--output", str(tmp_path / "eval"), "--no_progress", "--backend", "hf"]
    with pytest.raises(SystemExit, match=r"^prompt-aug-eval: error: --model .*run: .* records no base model"):
        evaluate(["--model", str(folder), *rest])
    main(["merge", str(folder), "--base", str(tiny_model_dir)])
    assert capsys.readouterr().out.strip() == str(tmp_path / "run-merged")
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "base_model_name_or_pa')  # cut short
    for argv in (["merge", str(folder)], ["merge", str(folder), "--base", str(tiny_model_dir)]):
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--output", str(tmp_path / "again")])
        message = str(exit_info.value.code)
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
    merged = ModelCard.load(merge(out) / "README.md")
    assert merged.data.library_name == "transformers"
    assert not [t for t in merged.data.tags if t.startswith("base_model:adapter:")]
    trainer.model_card_info.base_model = str(tiny_model_dir)  # a base known by its local path only
    trainer.create_model_card()
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "peft" and "lora" in card.data.tags
    assert card.data.base_model is None and not [t for t in card.data.tags if "base_model:" in t]
