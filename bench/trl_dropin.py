"""TRL's own GRPO tests with `PromptAugGRPOTrainer` as a drop-in: runs TRL's ``tests/test_grpo_trainer.py``
twice, once as written (TRL's `GRPOTrainer` and `GRPOConfig`) and once with `PromptAugGRPOTrainer` and
`PromptAugGRPOConfig` in their place, and compares the outcomes test by test.

    python bench/trl_dropin.py --trl-git /work/.mirror/huggingface+trl/repo        # TRL's tests at HEAD
    python bench/trl_dropin.py --trl-tests ~/src/trl/tests -k "loss_types or peft"  # a checkout, a subset

Run by hand, not in CI: TRL's tests are not on PyPI, so it needs TRL's source, as a git directory
(``--trl-git``, read at ``--rev``) or TRL's ``tests`` folder (``--trl-tests``). The few files it needs are
copied into a temporary folder (``--out``), never into this repository. Each run is one pytest process
(``-q -p no:cacheprovider -rA``, a ``--timeout`` per test), one after the other; ``-k`` selects the same
tests for both.

The tests fetch models and data from the Hub; here they get offline stand-ins:

* models: tiny random models built from transformers configs (`MODELS`: the Qwen2 policy and reward model
  most tests use, Qwen3, Llama, Gemma 2 and a few MoE models), saved in an offline Hub cache
  (``HF_HUB_CACHE``, ``HF_HUB_OFFLINE=1``) under the ids the tests load, e.g.
  ``trl-internal-testing/tiny-Qwen2ForCausalLM-2.5``. They share one ChatML tokenizer built in code
  (`prompt_aug.demo.smoke.build_tiny_tokenizer`) whose special tokens have Qwen2.5's ids in Qwen2.5's
  vocabulary size, as the tests hard-code them. Other ids (VLMs, remote code) are absent, and their tests
  fail in both runs: not runnable here.
* data: this file is also the pytest plugin of both runs (``-p trl_dropin``). It makes
  ``datasets.load_dataset("trl-internal-testing/zen", config)`` return the lines of the Zen of Python
  (Python's ``this`` module) cut into prompts, with the Hub set's columns and splits (17 train, 2 test rows;
  ``streaming=True`` gives iterable datasets); any other call is left alone.

In the second run the plugin puts our classes in ``trl.GRPOTrainer`` and ``trl.GRPOConfig`` (where the tests
import them from) before the test module is imported, and fails the run if, after collection, the test
module holds anything else. Prints a table (test, TRL's outcome, ours), the counts, and the tests that pass
with TRL's trainer but not with ours, each with our failure's message; ``--out`` keeps both runs' outcomes
(``trl.json``, ``ours.json``) and logs.
"""

from __future__ import annotations

import argparse
import ast
import codecs
import contextlib
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_FILE = "test_grpo_trainer.py"
# What the test file needs from TRL's tests folder (it imports `.testing_utils`; the conftest's fixtures force
# use_cpu on a machine without an accelerator).
TEST_FILES = ("__init__.py", "conftest.py", "testing_utils.py", "testing_constants.py", TEST_FILE)
ORG = "trl-internal-testing"

MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 16}
GLM4_MOE = {"n_routed_experts": 4, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}
# The stand-in models: Hub id (under ORG) -> (model type, architecture, config keys beyond `SHAPE`).
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "tiny-Qwen2ForCausalLM-2.5": ("qwen2", "Qwen2ForCausalLM", {}),
    "tiny-Qwen2ForSequenceClassification-2.5": ("qwen2", "Qwen2ForSequenceClassification", {"num_labels": 1}),
    "tiny-Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM", {}),
    "tiny-Qwen3ForSequenceClassification": ("qwen3", "Qwen3ForSequenceClassification", {"num_labels": 1}),
    "tiny-LlamaForSequenceClassification-3.2": ("llama", "LlamaForSequenceClassification", {"num_labels": 1}),
    "tiny-Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM", {}),
    "tiny-Cohere2ForCausalLM": ("cohere2", "Cohere2ForCausalLM", {}),
    "tiny-Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM", {**MOE, "num_experts": 4}),
    "tiny-GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM", {**MOE, "num_local_experts": 4}),
    "tiny-Glm4MoeForCausalLM": ("glm4_moe", "Glm4MoeForCausalLM", {**MOE, **GLM4_MOE}),
}
# TRL's own tiny models' shape (its scripts/generate_tiny_models), in bfloat16 as they are.
SHAPE = {
    "hidden_size": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 2,
    "num_hidden_layers": 2, "intermediate_size": 32, "max_position_embeddings": 2048,
}  # fmt: skip
# Qwen2.5's vocabulary size and special-token ids (test_train_with_mask_truncated_completions writes them).
VOCAB_SIZE = 151936
SPECIAL_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}

# The Zen of Python cut into prompts: words kept per line (the first 12 as test_grpo_trainer.py expects them).
ZEN_WORDS = (4, 2, 3, 1, 4, 3, 1, 4, 3, 3, 2, 6, 3, 4, 2, 3, 5, 5, 3)
ZEN_TRAIN_ROWS = 17
ZEN_CONFIGS = (
    "standard_prompt_only", "conversational_prompt_only", "standard_prompt_completion",
    "conversational_prompt_completion",
)  # fmt: skip
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")

# The default selection (``--all``: the whole file). On 2 shared CPU cores a training test takes about 30 s
# with TRL's trainer and 90 s with ours (its templates make a Zen prompt of 13 tokens 49-103 tokens long,
# and on CPU TRL's fused head scores prompt positions too), so: every test that trains no model, and
# training tests covering each loss type, evaluation, iterable data, several iterations, PEFT, a MoE model,
# conversational data, reward models and functions (lists, weights, None, extra columns, logging), the KL
# term, padding, masking, entropy, importance sampling and chat-template arguments. An entry selects the
# tests whose id (after the file's ``::``) is it, or starts with it and ``::`` or ``[``.
SUBSET = (
    "TestGetHighEntropyMask",
    "TestGRPORolloutDispatch",
    "TestTransformersContinuousBatchingContract",
    *(
        f"TestGRPOTrainer::{name}"
        for name in f"""
        test_init_minimal test_trust_remote_code test_init_with_eval_dataset test_evaluate_with_eval_dataset
        test_iterable_dataset_requires_dispatch_batches_false test_iterable_dataset_forces_num_workers_zero
        test_iterable_eval_keeps_map_style_train_workers test_liger_kernel_with_peft_lm_head_raises
        test_liger_kernel_with_peft_non_lm_head_target_allowed
        test_liger_kernel_with_peft_prompt_learning_raises
        test_liger_kernel_with_peft_modules_to_save_lm_head_allowed test_get_off_policy_mask
        test_get_off_policy_mask_padding test_entropy_bonus_flows_gradients test_no_reward_source_raises
        test_warning_raised_sequence_level_with_token_summed_loss test_dataset_required_without_environment
        test_environment_owned_data_requires_max_steps test_multiple_environments_without_dataset_raises
        test_mismatched_reward_processing_classes_length test_correct_reward_processing_classes_list
        test_single_reward_model_with_single_processing_class

        test_train[{ORG}/tiny-Qwen2ForCausalLM-2.5] test_train[{ORG}/tiny-Qwen3MoeForCausalLM]
        test_train_dataset_format test_train_loss_types test_train_with_eval
        test_train_with_num_generations_eval test_train_with_iterable_dataset test_train_multiple_iterations
        test_train_peft_config
        test_train_peft_model test_train_different_reward_model test_train_reward_func_conversational
        test_train_multiple_reward_funcs_with_None_output test_train_multiple_reward_funcs_with_weights
        test_reward_metric_reflects_reward_weights test_train_multiple_mixed_reward_funcs
        test_train_reward_func_additional_column test_train_beta_non_zero test_train_with_pad_to_multiple_of
        test_train_with_mask_truncated_completions test_warning_raised_all_rewards_none
        test_train_with_adaptive_entropy test_train_with_entropy_filter test_train_reward_func_with_log_extra
        test_train_reward_func_with_log_metric test_prepare_input_called_with_correct_data
        test_train_sequence_importance_sampling test_train_with_chat_template_kwargs
        test_train_with_cast_lm_head_to_fp32[{ORG}/tiny-Qwen3ForCausalLM]
        """.split()
    ),
)


# -- the stand-ins ---------------------------------------------------------------------------------------


def qwen_ids_tokenizer() -> Any:
    """The package's tiny ChatML tokenizer with ``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>`` at
    Qwen2.5's ids (the other tokens keep their order from 0)."""
    from transformers import Qwen2Tokenizer

    sys.path.insert(0, str(REPO))
    from prompt_aug.demo.smoke import build_tiny_tokenizer

    tiny = build_tiny_tokenizer()
    trained = json.loads(tiny.backend_tokenizer.to_str())["model"]
    ordinary = sorted((i, token) for token, i in trained["vocab"].items() if token not in SPECIAL_IDS)
    vocab = {token: k for k, (_, token) in enumerate(ordinary)} | SPECIAL_IDS
    return Qwen2Tokenizer(
        vocab=vocab, merges=[tuple(m) for m in trained["merges"]], unk_token=None, eos_token="<|im_end|>",
        pad_token="<|endoftext|>", extra_special_tokens=["<|im_start|>"], chat_template=tiny.chat_template,
        padding_side="left",
    )  # fmt: skip


def build_hub_cache(cache: Path) -> list[str]:
    """Save every model of `MODELS` with the tokenizer in ``cache`` as the Hub client caches a download
    (``models--ORG--NAME/snapshots/<commit>/``, ``refs/main``), so that an offline ``from_pretrained(id)``
    finds it. Returns the ids built."""
    import torch
    import transformers
    from transformers import AutoConfig, GenerationConfig

    tokenizer = qwen_ids_tokenizer()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    built = []
    for name, (model_type, architecture, extra) in MODELS.items():
        folder = cache / f"models--{ORG}--{name}"
        commit = hashlib.sha1(name.encode()).hexdigest()
        snapshot = folder / "snapshots" / commit
        config = AutoConfig.for_model(
            model_type, **SHAPE, **extra, vocab_size=VOCAB_SIZE, eos_token_id=eos, pad_token_id=pad,
            bos_token_id=None,
        )  # fmt: skip
        torch.manual_seed(0)
        model = getattr(transformers, architecture)(config).to(torch.bfloat16)
        if model.can_generate():
            model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad)
        model.save_pretrained(snapshot)
        tokenizer.save_pretrained(snapshot)
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(commit)
        built.append(f"{ORG}/{name}")
    return built


def zen_lines() -> list[str]:
    """The 19 aphorisms of the Zen of Python, from Python's ``this`` module (which prints them on import)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13").splitlines()[2:]


def zen_dataset(config: str) -> Any:
    """The stand-in for ``load_dataset("trl-internal-testing/zen", config)``: a `DatasetDict` of train and
    test rows, each line cut after `ZEN_WORDS` words into ``prompt`` (and the rest into ``completion``), as
    text (``standard_*``) or as one user and one assistant message (``conversational_*``)."""
    from datasets import Dataset, DatasetDict

    rows = []
    for line, words in zip(zen_lines(), ZEN_WORDS, strict=True):
        prompt = " ".join(line.split()[:words])
        completion = line[len(prompt) :]
        if config.startswith("conversational"):
            row = {
                "prompt": [{"role": "user", "content": prompt}],
                "completion": [{"role": "assistant", "content": completion.strip()}],
            }
        else:
            row = {"prompt": prompt, "completion": completion}
        if config.endswith("prompt_only"):
            del row["completion"]
        rows.append(row)
    return DatasetDict(
        train=Dataset.from_list(rows[:ZEN_TRAIN_ROWS]), test=Dataset.from_list(rows[ZEN_TRAIN_ROWS:])
    )


def patch_load_dataset() -> None:
    """Make ``datasets.load_dataset`` serve ``trl-internal-testing/zen`` (`ZEN_CONFIGS`) by `zen_dataset`."""
    import datasets

    hub_load = datasets.load_dataset

    def load_dataset(path: str, name: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if path != f"{ORG}/zen" or name not in ZEN_CONFIGS or args:
            return hub_load(path, name, *args, **kwargs)
        splits = zen_dataset(name)
        if kwargs.get("streaming"):
            splits = datasets.IterableDatasetDict({k: v.to_iterable_dataset() for k, v in splits.items()})
        split = kwargs.get("split")
        return splits if split is None else splits[split]

    datasets.load_dataset = load_dataset


# -- the pytest plugin (loaded in each run with -p trl_dropin) ---------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trl_dropin")
    group.addoption("--dropin-trainer", choices=("trl", "ours"), default="trl", help="whose GRPOTrainer")
    group.addoption("--dropin-results", default=None, help="JSON file for each test's outcome")
    group.addoption("--dropin-timeout", type=int, default=0, help="seconds per test (0: none)")
    group.addoption(
        "--dropin-select", default=None, help="a file of test ids to run, one a line (see SUBSET)"
    )


def expected_classes(trainer: str) -> tuple[type, type]:
    """The (trainer, config) classes a run's tests must use."""
    if trainer == "ours":
        from prompt_aug.config import PromptAugGRPOConfig
        from prompt_aug.trainer import PromptAugGRPOTrainer

        return PromptAugGRPOTrainer, PromptAugGRPOConfig
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    return GRPOTrainer, GRPOConfig


def add_missing_availability_checks(tests: Path) -> list[str]:
    """Add to ``trl.import_utils`` each ``is_<package>_available`` that TRL's test files import from it and
    this TRL lacks (TRL 1.16 has no ``is_joblib_available``), true when the package is importable. Returns
    the names added."""
    import importlib
    import importlib.util

    utils = importlib.import_module("trl.import_utils")  # trl is a lazy module: no trl.import_utils attribute
    added = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module == "trl.import_utils"):
                continue
            for name in (alias.name for alias in node.names):
                if hasattr(utils, name) or not re.fullmatch(r"is_(\w+)_available", name):
                    continue
                package = name[len("is_") : -len("_available")]
                setattr(utils, name, lambda p=package: importlib.util.find_spec(p) is not None)
                added.append(name)
    return added


def pytest_configure(config: pytest.Config) -> None:
    patch_load_dataset()
    added = add_missing_availability_checks(config.invocation_params.dir / "tests")
    if added:
        print(f"trl_dropin: added to trl.import_utils for TRL's tests: {', '.join(added)}", flush=True)
    trainer_class, config_class = expected_classes(config.getoption("--dropin-trainer"))
    import trl

    # Where the test file imports them from; TRL's own modules keep referring to TRL's classes.
    trl.GRPOTrainer, trl.GRPOConfig = trainer_class, config_class
    config.pluginmanager.register(Recorder(config, trainer_class, config_class), "trl_dropin_recorder")


def qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def outcome_of(report: pytest.TestReport) -> str | None:
    """The outcome a report settles: the call's, or a setup/teardown failure or a skip at setup."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if xfail:
            return "xpassed" if report.passed else "xfailed"
        return report.outcome
    if report.failed:
        return "error"
    if report.when == "setup" and report.skipped:
        return "xfailed" if xfail else "skipped"
    return None


def message_of(report: pytest.TestReport) -> str:
    """One line saying why a test did not pass (the exception's line, or the skip reason)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr or getattr(report, "wasxfail", ""))
    return " ".join(text.split())[:300]


class Recorder:
    """Checks that the collected test modules use the run's classes, and records each test's outcome."""

    def __init__(self, config: pytest.Config, trainer_class: type, config_class: type) -> None:
        self.path = config.getoption("--dropin-results")
        self.timeout = config.getoption("--dropin-timeout")
        self.classes = {"GRPOTrainer": trainer_class, "GRPOConfig": config_class}
        self.results: dict[str, dict[str, str]] = {}
        self.unmatched: list[str] = []  # selected names this revision of the tests does not have

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        path = config.getoption("--dropin-select")
        if path is None:
            return
        wanted = Path(path).read_text().split("\n")
        keep, drop, found = [], [], set()
        for item in items:
            name = item.nodeid.split("::", 1)[-1]
            chosen = {w for w in wanted if w and (name == w or name.startswith((w + "::", w + "[")))}
            (keep if chosen else drop).append(item)
            found |= chosen
        items[:] = keep
        self.unmatched = [w for w in wanted if w and w not in found]
        config.hook.pytest_deselected(items=drop)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        modules = {item.module for item in session.items if getattr(item, "module", None) is not None}
        for module in modules:
            for name, cls in self.classes.items():
                if getattr(module, name, None) is not cls:
                    raise pytest.UsageError(f"{module.__name__}.{name} is not {qualified(cls)}")
        used = " and ".join(qualified(cls) for cls in self.classes.values())
        print(f"\ntrl_dropin: {len(modules)} test module(s) use {used}", flush=True)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        if not self.timeout:
            return (yield)

        def expire(signum: int, frame: Any) -> None:
            raise TimeoutError(f"trl_dropin: over {self.timeout} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(self.timeout)
        try:
            return (yield)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = outcome_of(report)
        if outcome is None or self.results.get(report.nodeid, {}).get("outcome") == "error":
            return
        entry = {"outcome": outcome, "seconds": f"{report.duration:.1f}"}
        if outcome not in ("passed", "xpassed"):
            entry["message"] = message_of(report)
        self.results[report.nodeid] = entry

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.path:
            classes = {name: qualified(cls) for name, cls in self.classes.items()}
            out = {"classes": classes, "tests": self.results, "unmatched": self.unmatched}
            Path(self.path).write_text(json.dumps(out, indent=1))


# -- the driver --------------------------------------------------------------------------------------------


def extract_tests(args: argparse.Namespace, dest: Path) -> str:
    """Copy `TEST_FILES` from TRL's source into ``dest/tests``; returns where they came from."""
    folder = dest / "tests"
    folder.mkdir(parents=True, exist_ok=True)
    for name in TEST_FILES:
        if args.trl_git:
            git = ["git", "--git-dir", args.trl_git, "show", f"{args.rev}:tests/{name}"]
            text = subprocess.run(git, check=True, capture_output=True, text=True).stdout
        else:
            text = (Path(args.trl_tests) / name).read_text()
        (folder / name).write_text(text)
    if args.trl_git:
        rev = ["git", "--git-dir", args.trl_git, "rev-parse", args.rev]
        commit = subprocess.run(rev, check=True, capture_output=True, text=True).stdout.strip()
        return f"{args.trl_git} at {commit}"
    return str(Path(args.trl_tests).resolve())


def run_tests(trainer: str, args: argparse.Namespace, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """One pytest run of TRL's test file with ``trainer``'s classes, logged to ``work/<trainer>.log``."""
    results = work / f"{trainer}.json"
    command = [
        sys.executable, "-m", "pytest", f"tests/{TEST_FILE}", "-q", "-p", "no:cacheprovider", "-rA",
        "-p", "trl_dropin", f"--dropin-trainer={trainer}", f"--dropin-results={results}",
        f"--dropin-timeout={args.timeout}", "-W", "ignore::DeprecationWarning",
    ]  # fmt: skip
    if args.k:
        command += ["-k", args.k]
    if not args.all:
        (work / "selection.txt").write_text("\n".join(SUBSET) + "\n")
        command.append(f"--dropin-select={work / 'selection.txt'}")
    start = time.monotonic()
    with (work / f"{trainer}.log").open("w") as log:
        code = subprocess.run(
            command, check=False, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    print(f"{trainer}: pytest exited {code} after {time.monotonic() - start:.0f} s ({work / trainer}.log)")
    if not results.is_file():
        raise SystemExit(f"{trainer}: pytest wrote no results; see {work / trainer}.log")
    outcomes = json.loads(results.read_text())
    if outcomes["unmatched"]:
        print(f"{trainer}: selected but not in these tests: {', '.join(outcomes['unmatched'])}")
    return outcomes


def report(trl: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """The table, the counts and the tests that pass with TRL's trainer but not with ours."""
    prefix = f"tests/{TEST_FILE}::"
    ids = list(dict.fromkeys([*trl["tests"], *ours["tests"]]))
    outcome = {
        run: {i: r["tests"].get(i, {}).get("outcome", "absent") for i in ids}
        for run, r in (("trl", trl), ("ours", ours))
    }
    width = max([len(i) - len(prefix) for i in ids] + [4])
    lines = [f"{'test':<{width}}  {'TRL':<8}  ours", "-" * (width + 18)]
    for i in ids:
        mark = "  <-" if outcome["trl"][i] == "passed" and outcome["ours"][i] != "passed" else ""
        lines.append(f"{i.removeprefix(prefix):<{width}}  {outcome['trl'][i]:<8}  {outcome['ours'][i]}{mark}")
    lines += ["", f"{'outcome':<9} {'TRL':>5} {'ours':>5}"]
    counts = {run: Counter(outcome[run].values()) for run in outcome}
    for name in (*OUTCOMES, "absent"):
        if counts["trl"][name] or counts["ours"][name]:
            lines.append(f"{name:<9} {counts['trl'][name]:>5} {counts['ours'][name]:>5}")
    lines.append(f"{'total':<9} {len(ids):>5} {len(ids):>5}")
    pairs = Counter((outcome["trl"][i], outcome["ours"][i]) for i in ids)
    lines += ["", "TRL -> ours: " + ", ".join(f"{a} -> {b}: {n}" for (a, b), n in sorted(pairs.items()))]
    lost = [i for i in ids if outcome["trl"][i] == "passed" and outcome["ours"][i] != "passed"]
    lines += ["", f"pass with TRL's trainer, not with ours: {len(lost)}"]
    for i in lost:
        message = ours["tests"].get(i, {}).get("message", "")
        lines.append(f"  {i.removeprefix(prefix)}: {outcome['ours'][i]}: {message}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trl-git", help="a git directory of TRL's repository (bare or not)")
    source.add_argument("--trl-tests", help="TRL's tests folder")
    parser.add_argument("--rev", default="HEAD", help="the revision of --trl-git whose tests run")
    parser.add_argument("--all", action="store_true", help="the whole test file, not `SUBSET`")
    parser.add_argument("-k", default=None, help="pytest -k expression, the same for both runs")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per test (0: none)")
    parser.add_argument("--out", default=None, help="folder for the tests, models, logs and outcomes")
    parser.add_argument("--runs", default="trl,ours", help="which runs (a rerun reads the other's outcomes)")
    args = parser.parse_args(argv)
    runs = args.runs.split(",")
    if set(runs) - {"trl", "ours"}:
        parser.error(f"--runs {args.runs}: give trl, ours or trl,ours")
    skipped = [run for run in ("trl", "ours") if run not in runs]  # their outcomes are read from --out
    if skipped and args.out is None:
        parser.error(
            f"--runs {args.runs} reads {skipped[0]}.json: give --out, the folder of a {skipped[0]} run"
        )

    work = Path(args.out or tempfile.mkdtemp(prefix="trl-dropin-")).resolve()
    if REPO in (work, *work.parents):
        raise SystemExit(f"--out {work} is inside this repository; TRL's tests are not copied into it")
    for run in skipped:
        if not (work / f"{run}.json").is_file():
            raise SystemExit(f"--out {work} holds no {run}.json: run --runs {run} with this --out first")
    origin = extract_tests(args, work)
    hub = work / "hub"
    print(f"TRL's tests from {origin}; work folder {work}")
    print(f"stand-in models in {hub}: {len(build_hub_cache(hub))}")
    import transformers
    import trl

    print(f"TRL {trl.__version__}, transformers {transformers.__version__}, Python {sys.version.split()[0]}")
    env = {
        **os.environ, "HF_HOME": str(work / "hf"), "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", ""), str(REPO / "bench")]),
    }  # fmt: skip
    outcomes = {}
    for trainer in ("trl", "ours"):
        if trainer in runs:
            outcomes[trainer] = run_tests(trainer, args, work, env)
        else:
            outcomes[trainer] = json.loads((work / f"{trainer}.json").read_text())
    print("\n".join(report(outcomes["trl"], outcomes["ours"])))


if __name__ == "__main__":
    main()
