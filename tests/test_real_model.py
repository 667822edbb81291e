"""SmolLM2-135M-Instruct, a real pretrained model, through templates, generation, GRPO steps and evaluation.

The model is the folder `python -m prompt_aug.models fetch smollm2-135m-instruct` writes (in
``$PROMPT_AUG_HOME/models``, default ``~/.cache/prompt_aug/models``). Absent, these tests are skipped;
with ``PROMPT_AUG_REAL_MODEL=1`` (CI, whose `.ci/run` fetches it first) they fail instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from prompt_aug import evaluate, train
from prompt_aug.sources import MARKER_FILE
from prompt_aug.templates import load_templates

pytestmark = pytest.mark.real_model
NAME = "smollm2-135m-instruct"
IM_END, ENDOFTEXT = 2, 0  # SmolLM2's <|im_end|> and <|endoftext|>
SMOLLM_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM"


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def test_fetched_folder_is_a_plain_model_with_a_pad_apart_from_the_eos(smollm2_dir, tokenizer, model):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert model.num_parameters() == pytest.approx(134.5e6, rel=0.01)
    # The GGUF made <|im_end|> the pad as well; with a pad equal to the EOS, labels masked where the input
    # is the pad lose the stop token too. The fetch writes <|endoftext|> as the pad, as in the tiny models.
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", IM_END)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", ENDOFTEXT)
    assert model.generation_config.eos_token_id == [IM_END, ENDOFTEXT]
    assert model.generation_config.pad_token_id == ENDOFTEXT
    assert tokenizer("").input_ids == []  # no BOS added: the chat template's <|im_start|> is the only one
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in (smollm2_dir / MARKER_FILE).read_text()


def test_all_templates_render_with_their_own_system_turn_and_end_in_their_prefill(tokenizer):
    question = "What is $17 + 25$?"
    bank = load_templates()
    assert len(bank) == 13
    for template in bank.values():
        text = template.render(question, tokenizer)
        ids = tokenizer(text).input_ids
        assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3, (
            template.name
        )  # system, user, assistant
        assert text.count("<|im_start|>system\n") == 1, template.name
        assert SMOLLM_DEFAULT_SYSTEM not in text, (
            f"{template.name}: the chat template injected its own system turn"
        )
        assert text.startswith(f"<|im_start|>system\n{template.system}<|im_end|>\n"), template.name
        # The prompt's tokens end with the assistant header's, then the prefill's as tokenized alone: the
        # prefill does not merge with the header into tokens the model never saw at that boundary.
        tail = tokenizer("<|im_start|>assistant\n").input_ids + tokenizer(template.prefill).input_ids
        assert ids[-len(tail) :] == tail, template.name
        assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n" + template.prefill), template.name


def test_a_template_without_system_turn_gets_the_models_default_one(tokenizer):
    """Documented behaviour: `system: ""` means we add no system turn; SmolLM2's chat template then adds
    its own persona, as it does for any conversation without one (and Qwen's does too)."""
    from prompt_aug.templates import Template

    text = Template(name="bare", system="", user="{question}").render("What is 2 + 3?", tokenizer)
    assert text.count("<|im_start|>system\n") == 1 and SMOLLM_DEFAULT_SYSTEM in text


def test_greedy_generation_stops_at_im_end(tokenizer, model):
    from prompt_aug.templates import Template

    brief = Template(name="brief", system="Answer in one short sentence.", user="{question}")
    prompts = [t.render("What is 2 + 3?", tokenizer) for t in (brief, load_templates()["deepseek-r1"])]
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():  # the saved generation config: stops at <|im_end|> or <|endoftext|>, pads with 0
        out = model.generate(**batch, max_new_tokens=40, do_sample=False)
    completions = out[:, batch.input_ids.shape[1] :].tolist()
    stopped = [c for c in completions if IM_END in c]
    assert stopped, "no greedy completion ended with <|im_end|> within 40 tokens: " + repr(
        tokenizer.batch_decode(completions)
    )
    for c in stopped:
        end = c.index(IM_END)
        assert set(c[end + 1 :]) <= {ENDOFTEXT}, "tokens after <|im_end|> other than padding"
        assert "<|im_start|>" not in tokenizer.decode(c[:end])  # no second turn written before the stop


def _sums(path: Path, pairs: list[tuple[int, int]]) -> Path:
    rows = [
        {"question": f"What is {a} + {b}?", "answer": str(a + b), "uid": f"sum-{a}-{b}"} for a, b in pairs
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_grpo_steps_on_real_text_change_the_weights(smollm2_dir, tmp_path, monkeypatch):
    data = _sums(tmp_path / "sums.jsonl", [(a, b) for a in range(2, 9) for b in range(3, 7)])
    out = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"model_name_or_path: {NAME}\ndataset_name: {data}\nreward_funcs: [correctness, format]\n"
        # templates with format markers: this model writes some of them, so the format reward spreads
        "templates: [lm_eval_prompt4, deepseek-r1, open-r1, reflective]\n"
        f"output_dir: {out}\nseed: 0\nmax_steps: 2\nper_device_train_batch_size: 8\n"
        "gradient_accumulation_steps: 1\nsteps_per_generation: 1\nnum_generations: 4\n"
        "max_completion_length: 32\ntemperature: 0.7\ntop_p: 1.0\nlearning_rate: 1.0e-5\n"
        "lr_scheduler_type: constant\nbeta: 0.0\nloss_type: dapo\nlogging_steps: 1\nsave_strategy: 'no'\n"
        "report_to: none\nlog_completions: true\nnum_completions_to_print: 0\ngradient_checkpointing: false\n"
        "use_cpu: true\nbf16: false\ndataloader_num_workers: 0\n"
    )
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "2"))
    train.main(["--config", str(recipe)])  # the name resolves to the fetched folder

    logs = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert len(logs) == 2
    spread = [e for e in logs if e["frac_reward_zero_std"] < 1]  # a round whose groups are not all flat
    assert spread, "no reward spread in any round: " + json.dumps(logs)[:500]
    assert all(e["grad_norm"] > 0 for e in spread), [
        (e["frac_reward_zero_std"], e["grad_norm"]) for e in logs
    ]
    records = pd.concat(pd.read_parquet(p) for p in sorted((out / "completions").glob("*.parquet")))
    assert len(records) == 16
    words = " ".join(records["completion"].astype(str))
    # Real text: mostly letters, digits and spaces, and words a chat model writes about a sum.
    assert sum(ch.isalnum() or ch.isspace() for ch in words) / len(words) > 0.8, words[:300]
    assert any(w in words.lower() for w in ("answer", "sum", "add", "+", "=")), words[:300]
    assert "<|im_start|>" not in words
    assert records["template"].nunique() >= 2  # 4 questions, each under its drawn template

    before = load_file(str(smollm2_dir / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2, f"only {len(changed)} of {len(before)} tensors changed"


def test_short_evaluation_with_the_hf_backend(smollm2_dir, tmp_path):
    data = _sums(tmp_path / "few.jsonl", [(2, 3), (10, 5)])
    out = tmp_path / "eval"
    evaluate.main(["--model", NAME, "--benchmarks", str(data), "--backend", "hf", "--max_tokens", "32",
                   "--template", "qwen-math,deepseek-r1", "--output", str(out), "--no_progress"])  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["model"] == str(smollm2_dir) and results["settings"]["model"] == NAME
    records = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(records) == 4
    assert all(r["completion"].strip() and "<|im_end|>" not in r["completion"] for r in records)
    assert {r["template"] for r in records} == {"qwen-math", "deepseek-r1"}
