"""Evaluate a model on the paper's five math benchmarks: ``python -m prompt_aug.evaluate --model M``.

Also the ``prompt-aug-eval`` script. The suite is ``lkevinzc/math-eval`` (AIME24, AMC, MATH500,
Minerva, OlympiadBench), or a local ``save_to_disk`` copy with ``--data_dir``. Every completion is
graded by the training grader in strict mode (the paper's rule: the last ``\\boxed{}``, inside
``<answer>`` for tag templates). This module is the command line; it loads the questions
(`benchmarks`), generates and grades them (`backends`, `runner`, resumable) and writes the tables (`report`).

Writes into ``--output`` (default ``<model>/eval`` for a local model, where the model card finds
``results.md``):

* ``completions.jsonl``: one record per generated answer (prompt, completion, extracted answer,
  verdict, finish reason, benchmark, template, run, index, sample). A rerun skips what is there and was
  made for today's prompt, and grades it again where its gold answer changed.
* ``results.json``: accuracy per benchmark, template and run, with macro and micro averages.
* ``results.md``: the paper-layout table; with several templates, the robustness table too.
* ``settings.json``: the model's weights and the settings its completions were made with; a rerun with
  other settings is refused, as it would mix them.

A file of one of these names that prompt-aug-eval did not write (a file of one's own, or a folder) is never
written over or deleted, ``--overwrite`` or not: the evaluation is refused before the model loads. With
``--overwrite`` the folder's completions and tables are discarded only once the model has loaded, so an
evaluation that fails to start leaves them as they were.

Launched as several processes (``torchrun --nproc_per_node 8 -m prompt_aug.evaluate ...`` or
``accelerate launch --num_processes 8 -m prompt_aug.evaluate ...``), one per GPU, the processes share the
questions and the main process writes the same files as one process would (see `runner.deal`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..adapters import AdapterError, adapter_base, check_adapter_base, is_adapter
from ..model_card import weights_fingerprint
from ..sources import (
    SourceError,
    check_source,
    file_in_the_way,
    hub_revision,
    is_hub_id,
    resolve_local_model,
)
from ..templates import DEFAULT_EVAL_TEMPLATE, TemplateError, renderer_keys_refusal, with_opened_markers
from .backends import (
    STOP_RULES,
    Backend,
    HFBackend,
    VLLMBackend,
    check_vllm_installed,
    default_backend,
    load_tokenizer,
    model_context_length,
    rope_scaled,
    vllm_max_model_len,
)
from .benchmarks import (
    BENCHMARKS,
    HUB_SUITE,
    EvalError,
    benchmark_place,
    check_distinct,
    hub_dataset,
    load_benchmark,
    parse_benchmarks,
    parse_templates,
)
from .report import PAPER_MAX_MODEL_LEN, TABLE_HEAD, protocol_differences, render_tables, summarize
from .runner import (
    Processes,
    completions_made,
    fold_shards,
    generate_and_grade,
    join_processes,
    not_records,
    read_records,
    respell_question_sets,
    samples_depend_on_batch_size,
    shard_paths,
    write_atomically,
)

# One logger for all of evaluation, under the name it had before the split.
logger = logging.getLogger("prompt_aug.evaluate")

RECORDS_FILE, RESULTS_FILE, TABLE_FILE, SETTINGS_FILE = (
    "completions.jsonl",
    "results.json",
    "results.md",
    "settings.json",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="prompt-aug-eval", description=__doc__.split("\n\n")[0], formatter_class=_DefaultsShown
    )
    parser.add_argument("--model", required=True, help="Local model folder or Hub id.")
    parser.add_argument(
        "--benchmarks",
        default=",".join(BENCHMARKS),
        help=f"Comma list of {', '.join(BENCHMARKS)}, or question sets: a .jsonl/.json/.parquet/.csv file, a "
        "save_to_disk folder or a Hub dataset id, with a question and a gold column (--question_column, "
        "--answer_column).",
    )
    parser.add_argument(
        "--question_column",
        default=None,
        help="The question column of the question sets (default: the first of question, problem, query, "
        "input), as in training.",
    )
    parser.add_argument(
        "--answer_column",
        default=None,
        help="The gold column of the question sets (default: the first of answer, ground_truth, "
        "final_answer, target, solution); a solution column is read for its last \\boxed{}, as in training.",
    )
    parser.add_argument(
        "--template", default=DEFAULT_EVAL_TEMPLATE, help="A template, a comma list, or `all`."
    )
    parser.add_argument(
        "--templates_file", default=None, help="A YAML template bank replacing the built-in one."
    )
    parser.add_argument(
        "--chat_template",
        default=None,
        help="The chat template prompts render through, set on the tokenizer: chatml, a Jinja template, or "
        "the path of a .jinja file (as the recipe key chat_template). Needed for a model whose tokenizer has "
        "none (a base model); replaces the tokenizer's own otherwise. A model trained with chat_template "
        "keeps it in its folder.",
    )
    parser.add_argument(
        "--chat_template_kwargs",
        type=_json_mapping,
        default=None,
        help="Extra arguments for the chat template, as JSON, e.g. '{\"enable_thinking\": false}' for Qwen3 "
        "(as the recipe key chat_template_kwargs): evaluate with the training run's to ask as it asked.",
    )
    parser.add_argument("--runs", type=int, default=1, help="Runs to average (the paper: 5).")
    parser.add_argument(
        "--n",
        "--samples",
        type=int,
        default=1,
        help="Samples per question and run (pass@n; needs sampling). Under torchrun or accelerate launch "
        "write --samples: their parsers take --n for an abbreviation of their own options and stop.",
    )
    parser.add_argument("--max_tokens", type=int, default=3000, help="New tokens per completion.")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy.")
    parser.add_argument(
        "--top_p", type=float, default=1.0, help="Nucleus sampling: the probability mass kept."
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="Sampling seed. With vllm each question, template and run draws from its own seed derived from "
        "it; hf samples a batch jointly from its first question's seed, so its samples also depend on "
        "--batch_size.",
    )
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
    parser.add_argument(
        "--batch_size",
        type=int,
        default=None,
        help="Prompts per generate call (default: 16 for hf, 1024 for vllm). A rerun may give another one "
        "(a smaller one after running out of memory): it keeps the completions made and batches the rest. "
        "Not when hf samples (--temperature > 0): its samples depend on the batch size (see --seed), which "
        "settings.json then records, so a rerun with another one is refused as other settings are.",
    )
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "auto", "float16", "float32"),
        default="bfloat16",
        help="Model dtype: bfloat16 (the paper), auto (the dtype the checkpoint's config names, on either "
        "backend), float16, float32.",
    )
    parser.add_argument(
        "--tensor_parallel_size",
        type=int,
        default=1,
        help="vLLM: GPUs per engine. Launched as several processes, each this many consecutive processes "
        "drive one engine.",
    )
    parser.add_argument(
        "--max_model_len",
        type=int,
        default=None,
        help="vLLM context. Default: the model's context, capped at the longest prompt + --max_tokens. A "
        "context that leaves a prompt less room than --max_tokens cuts its completion shorter: results "
        "record it, and say the run is not the paper's protocol.",
    )
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.9, help="vLLM.")
    parser.add_argument(
        "--enforce_eager",
        action="store_true",
        help="vLLM: run the model eagerly, with no torch.compile and no CUDA graphs. The engine starts in "
        "seconds instead of minutes on CPU (SmolLM2-135M on 2 cores: 33 s against 220 s); on a GPU it "
        "generates slower.",
    )
    parser.add_argument("--data_dir", default=None, help=f"A local save_to_disk copy of {HUB_SUITE}.")
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="Only the first N questions of each benchmark (rows with no question or gold are not counted).",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="Default: <model>/eval (local model) or eval/<model name>. A rerun into the same folder resumes "
        "where it stopped.",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Discard the completions and tables an earlier evaluation wrote in --output, once the model has "
        "loaded. Files prompt-aug-eval did not write are never deleted.",
    )
    parser.add_argument("--no_progress", action="store_true", help="No progress bar.")
    args = parser.parse_args(argv)
    for flag in ("runs", "n", "max_tokens", "limit", "batch_size", "tensor_parallel_size", "max_model_len"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag} must be at least 1 (got {value})")
    output = Path(args.output) if args.output is not None else default_output(args.model)
    blocker = file_in_the_way(output)
    if blocker is not None:
        where = "is a file" if blocker == output else f"lies under the file {blocker}"
        named = "--output" if args.output is not None else f"--output (by default, from --model {args.model})"
        parser.error(f"{named} {output} {where}; give a folder with --output (it is made if missing)")
    if not args.temperature >= 0:  # also NaN
        parser.error(f"--temperature must be at least 0 (got {args.temperature}); 0 is greedy")
    if not 0 < args.top_p <= 1:
        parser.error(f"--top_p must be in (0, 1] (got {args.top_p})")
    if args.n > 1 and args.temperature == 0:
        parser.error("--n > 1 needs sampling: set --temperature > 0")
    return args


class _DefaultsShown(argparse.HelpFormatter):
    """Help that ends each option with its default, where it has one its help does not already give."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if unset or "default" in text.lower():
            return text
        return f"{text} (default: %(default)s)".lstrip()


def _json_mapping(text: str) -> dict[str, Any]:
    """A ``--chat_template_kwargs`` value: a JSON object, refused by `renderer_keys_refusal` if it must."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"not a JSON object: {text!r}; give e.g. '{{\"enable_thinking\": false}}'"
        )
    if problem := renderer_keys_refusal(value, None):
        raise argparse.ArgumentTypeError(problem)
    return value


def default_output(model: str) -> Path:
    """``<model>/eval`` for a local model folder, else ``eval/<last part of the Hub id>``."""
    return Path(model) / "eval" if Path(model).is_dir() else Path("eval") / model.rstrip("/").split("/")[-1]


# Settings that folders written before the `--stop` flag lack: they were made with the `turn` rule.
SETTINGS_BEFORE_STOP_FLAG = {"stop": "turn"}
# Settings that say which model made the completions, not how it was asked.
MODEL_KEYS = {"model", "weights", "base_weights"}
# Settings that may name a local file: kept as its absolute path, so that any spelling of it is the same.
FILE_SETTINGS = ("templates_file", "chat_template")


def file_place(value: str | None) -> str | None:
    """A flag's value that names a local file as that file's absolute path; any other value as it is.

    >>> file_place("chatml"), file_place(None)
    ('chatml', None)
    """
    if not isinstance(value, str) or "{" in value:  # None, or a Jinja template
        return value
    path = Path(value).expanduser()
    return str(path.resolve()) if path.is_file() else value


def weights_of(model: str) -> str | None:
    """What tells the weights of ``model`` apart: a local folder's `weights_fingerprint`, a Hub model's commit
    (``revision <sha>``, `hub_revision`); None when neither is known."""
    if Path(model).expanduser().is_dir() or not is_hub_id(model):  # a folder named like an id is read there
        return weights_fingerprint(model)
    revision = hub_revision(model)
    return f"revision {revision}" if revision else None


@contextlib.contextmanager
def _folder_held(output: Path) -> Iterator[None]:
    """Hold ``output`` (created if missing) for one evaluation: a second one started into the same folder,
    whose records and tables this one writes, is refused in one line. A lock on the folder itself, so no file
    is left there; where the file system takes no such lock (some network file systems), nothing is held."""
    import fcntl

    try:
        output.mkdir(parents=True, exist_ok=True)
        folder = os.open(output, os.O_RDONLY)
    except OSError as err:  # a read-only place (a shared model folder), no permission
        raise EvalError(
            f"--output {output}: cannot make or open that folder ({err.strerror or type(err).__name__}); "
            "pass an --output this evaluation can write to"
        ) from None
    try:
        try:
            fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EvalError(
                f"{output}: another evaluation is writing there; wait for it to end, or pass another --output"
            ) from None
        except OSError as err:
            logger.debug("%s: not locked (%s)", output, err)
        yield
    finally:
        os.close(folder)  # releases the lock


# What every ``results.json`` of prompt-aug-eval holds (`_check_coverage` reads them): what tells it from
# another file of that name.
RESULTS_KEYS = ("benchmarks", "templates", "runs", "results")


def _not_ours(path: Path) -> str | None:
    """Why ``path``, of a name an evaluation writes, is not a file prompt-aug-eval wrote there; None where it
    is one, or where there is nothing. Told by content: records (`not_records`), settings with a ``model``,
    results with `RESULTS_KEYS`, a table that begins with `TABLE_HEAD`."""
    if not path.is_file():
        if path.is_dir():
            return "a folder"
        return "not a file" if path.exists() or path.is_symlink() else None
    try:
        if path.name == TABLE_FILE:
            with path.open(encoding="utf-8") as handle:
                head = handle.read(len(TABLE_HEAD))
            return None if head == TABLE_HEAD else "not a table of prompt-aug-eval"
        if path.name not in (RESULTS_FILE, SETTINGS_FILE):  # the records and their shards
            return not_records(path)
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:  # UnicodeDecodeError too
        return "not JSON" if path.suffix == ".json" else "not UTF-8 text"
    keys = RESULTS_KEYS if path.name == RESULTS_FILE else ("model",)
    missing = [key for key in keys if not isinstance(value, dict) or key not in value]
    return f"no {', '.join(missing)}" if missing else None


def _check_own_files(output: Path) -> None:
    """Every file in ``output`` that an evaluation writes, appends to or deletes (records, shards, settings,
    tables) must be one prompt-aug-eval wrote (`_not_ours`); `EvalError` naming the first that is not. A
    ``settings.json`` that cannot be read beside records is their own, damaged: `_read_settings` names it."""
    records = output / RECORDS_FILE
    made = [*shard_paths(records), records]
    beside_records = any(path.is_file() and path.stat().st_size for path in made)
    for path in (*made, output / SETTINGS_FILE, output / RESULTS_FILE, output / TABLE_FILE):
        why = _not_ours(path)
        if why is None or (path.name == SETTINGS_FILE and path.is_file() and beside_records):
            continue  # beside records (checked first: prompt-aug-eval's), a damaged settings.json is theirs
        raise EvalError(
            f"{path}: not written by prompt-aug-eval ({why}), and this evaluation would write over it; move "
            "it, or pass another --output (--overwrite replaces prompt-aug-eval's own files only)"
        )


def _compare_settings(output: Path, settings: dict[str, Any], overwrite: bool) -> bool:
    """Completions already in ``output`` must come from the same model (its folder's name and its weights,
    `weights_fingerprint`) and decoding settings; `EvalError` naming what changed. Returns whether the tables
    in ``output`` are of an evaluation with other settings, to be deleted by `_take_folder`. Deletes and
    writes nothing."""
    path, records = output / SETTINGS_FILE, output / RECORDS_FILE
    previous = _read_settings(path) if path.is_file() and not overwrite else None
    # The previous settings as today's would state them: an older folder's lack newer keys, and may name a
    # file by a relative path (resolved from the working folder).
    before = {**SETTINGS_BEFORE_STOP_FLAG, **(previous or {})}
    before.update({key: file_place(before.get(key)) for key in FILE_SETTINGS})
    has_records = records.is_file() or bool(shard_paths(records))
    batch_size = settings.get("batch_size")
    if previous is not None and "batch_size" not in previous:  # made before it was recorded
        before["batch_size"] = batch_size
        if batch_size is not None and has_records:
            logger.warning(
                "%s does not record the --batch_size its sampled completions were made in (written by an "
                "older version): they are taken as made in batches of %d; pass --overwrite if they were not",
                path, batch_size,
            )  # fmt: skip
    if previous is not None and has_records:
        for key in ("weights", "base_weights"):
            then, now, what = before.get(key), settings[key], key.replace("_", " ")
            if then != now and None in (then, now):  # nothing to compare the weights with
                unknown = (
                    f"does not record which {what} made its completions (written by an older version)"
                    if then is None
                    else f"records the {what} {then}, and which {settings['model']} has now is unknown"
                )
                before[key] = now
                logger.warning(
                    "%s %s: they are taken as %s's; pass --overwrite if the model changed since",
                    path, unknown, settings["model"],
                )  # fmt: skip
        changed = {k: (before.get(k), v) for k, v in settings.items() if before.get(k) != v}
        if changed:
            # Flags can be given again; other weights cannot be had back.
            resume = "rerun with the earlier values to resume them, " if set(changed) - MODEL_KEYS else ""
            raise EvalError(
                f"{output} holds completions made with other settings ({changed}, as (before, now)); "
                f"{resume}pass another --output, or --overwrite to discard them"
            )
    return previous is not None and any(before.get(k) != v for k, v in settings.items())


def _take_folder(output: Path, settings: dict[str, Any], overwrite: bool, stale_tables: bool) -> None:
    """Make ``output`` this evaluation's, once its model has loaded: with ``overwrite`` delete the records
    (and leftover shards); with ``overwrite`` or ``stale_tables`` (`_compare_settings`) the tables too,
    which a card or a plot must not show as this evaluation's should it stop before it writes its own; then
    write ``settings.json``. `_check_own_files` has made sure that these are prompt-aug-eval's own files."""
    records = output / RECORDS_FILE
    if overwrite:
        for old in (records, *shard_paths(records)):
            old.unlink(missing_ok=True)
    if overwrite or stale_tables:
        for old in (output / RESULTS_FILE, output / TABLE_FILE):
            old.unlink(missing_ok=True)
    output.mkdir(parents=True, exist_ok=True)
    write_atomically(output / SETTINGS_FILE, json.dumps(settings, indent=2) + "\n")


def _check_settings(output: Path, settings: dict[str, Any], overwrite: bool) -> None:
    """`_compare_settings`, then `_take_folder` at once (`run_evaluation` takes the folder only once the model
    has loaded)."""
    _take_folder(output, settings, overwrite, _compare_settings(output, settings, overwrite))


def _read_settings(path: Path) -> dict[str, Any]:
    """The settings an earlier evaluation wrote to ``path``; `EvalError` naming it when it is damaged."""
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        settings, why = None, f"not JSON ({err})"
    else:
        why = "not a JSON object"
    if not isinstance(settings, dict):
        raise EvalError(
            f"{path}: {why}; delete it (the completions beside it are then resumed as this evaluation's) or "
            "pass --overwrite"
        )
    return settings


def _check_coverage(
    output: Path, args: argparse.Namespace, benchmarks: list[str], templates: list[str]
) -> None:
    """An evaluation into a folder whose tables cover what this one does not (other benchmarks or templates,
    more runs, more questions than its ``--limit``) would replace them with its own: refused, in one line,
    before `_take_folder` deletes any tables (whatever the completions and settings beside them). With
    ``--overwrite`` nothing is kept, so nothing is refused."""
    if args.overwrite:
        return
    try:
        before = json.loads((output / RESULTS_FILE).read_text())
        before["benchmarks"] = [benchmark_place(b) for b in before["benchmarks"]]  # as today's are given
        lost = [
            f"{key} {sorted(set(before[key]) - set(now))}"
            for key, now in (("benchmarks", benchmarks), ("templates", templates))
            if set(before[key]) - set(now)
        ]
        if args.runs < int(before["runs"]):
            lost.append(f"runs {before['runs']}")
        asked = before["results"][before.get("main_template") or before["templates"][0]]["benchmarks"]
        most = max(int(entry["questions"]) for entry in asked.values())
        if args.limit is not None and args.limit < most:
            lost.append(f"{most} questions of a benchmark")
    except (OSError, ValueError, LookupError, TypeError):  # none, or not one to keep
        return
    if lost:
        raise EvalError(
            f"{output} holds the tables of an evaluation this one does not cover ({', '.join(lost)}), which "
            "it would replace: pass another --output (for a quick check), that evaluation's flags, or "
            "--overwrite"
        )


def _model_tokenizer(args: argparse.Namespace) -> Any:
    """The model's tokenizer with ``--chat_template``; `EvalError` when it has no chat template to render the
    prompts through."""
    tokenizer = load_tokenizer(args.model, args.chat_template)
    if tokenizer.chat_template is None:
        raise EvalError(
            f"--model {args.model}: its tokenizer has no chat template (a base model?), and prompts render "
            "through one; pass --chat_template chatml (or a Jinja template, or the path of a .jinja file)"
        )
    return tokenizer


def run_evaluation(args: argparse.Namespace) -> dict[str, Any]:
    """Everything `main` does; returns the content of ``results.json`` (on every process of a launch)."""
    started = time.perf_counter()
    benchmarks = parse_benchmarks(args.benchmarks)
    check_distinct(benchmarks)
    benchmarks = [benchmark_place(b) for b in benchmarks]  # a local question set by its absolute path
    templates = parse_templates(args.template, args.templates_file)
    # A known local model's name (prompt_aug.models) is its fetched folder, but results go to eval/<name>.
    output = Path(args.output) if args.output else default_output(args.model)
    model_name = Path(args.model).resolve().name if Path(args.model).is_dir() else args.model
    args.model = resolve_local_model(args.model, key="--model")
    # A missing folder, an unreachable Hub or (offline) an uncached Hub id fails before any load.
    check_source("--model", args.model, model=True)
    backend_name = args.backend or default_backend()
    if is_adapter(args.model):
        try:
            check_adapter_base("--model", args.model)
        except AdapterError as err:
            raise EvalError(str(err)) from None
        if backend_name == "vllm":
            raise EvalError(
                f"--model {args.model}: a LoRA adapter, which vLLM does not load as a model; merge it first "
                f"(python -m prompt_aug.adapters merge {args.model}) and evaluate the merged folder, or pass "
                "--backend hf"
            )
    tokenizer = _model_tokenizer(args)
    # Markers the chat template's generation prompt writes (an R1 distill's <think>) are not the completion's.
    kwargs = args.chat_template_kwargs or {}
    templates = [with_opened_markers(t, tokenizer, **kwargs) for t in templates]
    columns = (args.question_column, args.answer_column)
    problems = [p for b in benchmarks for p in load_benchmark(b, args.data_dir, args.limit, *columns)]
    vllm = backend_name == "vllm"
    max_model_len, longest = _vllm_context(args, tokenizer, templates, problems) if vllm else (None, 0)
    if vllm:  # before the folder is touched
        check_vllm_installed()
    # The context is recorded when it can cut a completion shorter than the paper's would (its context was
    # PAPER_MAX_MODEL_LEN); None when it cuts none or no more (the hf backend never cuts).
    cuts = max_model_len is not None and longest + args.max_tokens > max_model_len
    shorter = cuts and max_model_len < min(PAPER_MAX_MODEL_LEN, longest + args.max_tokens)
    sampling = args.temperature > 0
    settings = {
        "model": model_name,
        "weights": weights_of(args.model),
        # An adapter's completions are its base model's too: other base weights make other completions.
        "base_weights": weights_of(adapter_base(args.model)) if is_adapter(args.model) else None,
        "backend": backend_name,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p if sampling else 1.0,
        "n": args.n,
        "seed": args.seed if sampling else None,
        # hf samples a batch jointly: its samples depend on the batch size too.
        "batch_size": (args.batch_size or HFBackend.default_batch_size)
        if samples_depend_on_batch_size(backend_name, args.temperature)
        else None,
        "templates_file": file_place(args.templates_file),
        "chat_template": file_place(args.chat_template),
        "chat_template_kwargs": args.chat_template_kwargs or None,
        "stop": args.stop,
        "max_model_len": max_model_len if shorter else None,
        "question_column": args.question_column,
        "answer_column": args.answer_column,
    }
    processes = join_processes(engine=vllm, ranks_per_engine=args.tensor_parallel_size if vllm else 1)
    if cuts and processes.main:
        logger.warning(
            "max_model_len %d leaves the longest prompt (%d tokens) room for %d new tokens, fewer than "
            "--max_tokens %d: completions can be cut short%s",
            max_model_len, longest, max_model_len - longest, args.max_tokens,
            ", more than in the paper's protocol" if shorter else " (as in the paper's, at 4096)",
        )  # fmt: skip
    with contextlib.ExitStack() as held:  # the folder, held by the main process until the end
        # The main process checks the folder; every process stops with its verdict. Nothing in it is
        # deleted before the model has loaded.
        error, before, stale_tables = None, set(), False
        if processes.main:
            try:
                held.enter_context(_folder_held(output))
                _check_own_files(output)
                _check_coverage(output, args, benchmarks, [t.name for t in templates])
                stale_tables = _compare_settings(output, settings, args.overwrite)
                if not args.overwrite:  # else the records are discarded (`_take_folder`)
                    fold_shards(output / RECORDS_FILE)
                    # What the folder holds; a bad line stops every process now, before the model loads.
                    before = completions_made(respell_question_sets(output / RECORDS_FILE, benchmarks))
            except EvalError as err:
                error = str(err)
        error = processes.broadcast(error)
        if error:
            raise EvalError(error)

        from safetensors import SafetensorError

        try:
            backend = _load_backend(args, backend_name, max_model_len, processes, tokenizer)
        except (OSError, SafetensorError) as err:  # files missing, unreadable or cut short
            why = (str(err).strip() or type(err).__name__).splitlines()[0]
            raise EvalError(
                f"--model {args.model}: the model does not load ({why}); fix --model (the completions and "
                f"tables in {output} are kept)"
            ) from err
        processes.barrier()  # every process has its model: the folder can be taken
        if processes.main:
            _take_folder(output, settings, args.overwrite, stale_tables)
        args.overwrite = False  # the folder holds this evaluation's completions only: a rerun resumes them
        logger.info(
            "model %s, backend %s, %d questions × %d template(s) × %d run(s) → %s%s",
            args.model,
            backend_name,
            len(problems),
            len(templates),
            args.runs,
            output,
            f" (on {processes.size} processes)" if processes.size > 1 else "",
        )

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
            processes=processes,
            chat_template_kwargs=args.chat_template_kwargs,
        )
        results = None
        if processes.main:
            results, table = _summary(args, records, benchmarks, templates, settings, model_name)
            results["new_completions"] = len(completions_made(read_records(output / RECORDS_FILE)) - before)
            results["seconds"] = round(time.perf_counter() - started, 2)
            write_atomically(output / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
            write_atomically(output / TABLE_FILE, table)
            print(table)
            print(f"wrote {output / RESULTS_FILE}, {output / TABLE_FILE}, {output / RECORDS_FILE}")
        results = processes.broadcast(results)
        processes.close()
        return results


def _vllm_context(
    args: argparse.Namespace, tokenizer: Any, templates: list[Any], problems: list[Any]
) -> tuple[int, int]:
    """The ``max_model_len`` vLLM is asked for (`vllm_max_model_len`) and the longest prompt, in tokens.

    Raises:
        EvalError: a prompt leaves no room for a completion in that context (before the engine loads).
    """
    kwargs = args.chat_template_kwargs or {}
    asked = [(t, p) for t in templates for p in problems]
    prompts = [t.render(p.question, tokenizer, **kwargs) for t, p in asked]
    lengths = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
    longest = max(lengths, default=0)
    context = model_context_length(args.model)
    longer = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true")
    if (
        args.max_model_len
        and context
        and args.max_model_len > context
        and not (rope_scaled(args.model) or longer)
    ):
        raise EvalError(  # vLLM would refuse it with a traceback once the engine starts loading
            f"--max_model_len {args.max_model_len} is above the context of --model {args.model} ({context} "
            "tokens, its config's); pass at most that, leave --max_model_len out, or set "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to run past it (vLLM warns the outputs may be wrong)"
        )
    max_model_len = vllm_max_model_len(args.max_model_len, longest, args.max_tokens, context)
    logger.info(
        "vLLM max_model_len %s (model context %s; longest prompt %d + --max_tokens %d)",
        max_model_len, context, longest, args.max_tokens,
    )  # fmt: skip
    if longest >= max_model_len:
        template, problem = asked[lengths.index(longest)]
        given = "--max_model_len" if args.max_model_len else "the model's context, max_model_len"
        wider = longest + args.max_tokens
        fix = (
            f"pass --max_model_len {wider} (the prompt + --max_tokens), or "
            if context is None or wider <= context
            else ""  # the model cannot hold it
        )
        raise EvalError(
            f"the longest prompt ({longest} tokens, {problem.benchmark} question {problem.index}, template "
            f"{template.name}) leaves no room for a completion in {given} {max_model_len}: {fix}leave "
            f"{problem.benchmark} out of --benchmarks"
        )
    return max_model_len, longest


def _load_backend(
    args: argparse.Namespace,
    backend_name: str,
    max_model_len: int | None,
    processes: Processes,
    tokenizer: Any,
) -> Backend:
    """The generation backend, with ``tokenizer`` (the model's, with ``--chat_template``); with several
    processes, each on its own GPU."""
    if backend_name == "vllm":
        backend: Backend = VLLMBackend(
            args.model,
            tensor_parallel_size=args.tensor_parallel_size,
            max_model_len=max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            seed=args.seed,
            dtype=args.dtype,
            stop=args.stop,
            external_launcher=processes.size > 1,
            enforce_eager=args.enforce_eager,
            tokenizer=tokenizer,
        )
        return backend
    import torch

    device = f"cuda:{processes.local_rank}" if processes.size > 1 and torch.cuda.is_available() else None
    return HFBackend.load(args.model, args.dtype, args.stop, device=device, tokenizer=tokenizer)


def _summary(
    args: argparse.Namespace,
    records: list[dict[str, Any]],
    benchmarks: list[str],
    templates: list[Any],
    settings: dict[str, Any],
    model_name: str,
) -> tuple[dict[str, Any], str]:
    """The content of ``results.json`` (less its timing keys) and of ``results.md``."""
    names = [t.name for t in templates]
    summary = summarize(records, benchmarks, names)
    main_template = DEFAULT_EVAL_TEMPLATE if DEFAULT_EVAL_TEMPLATE in names else names[0]
    asked = summary["results"][main_template]["benchmarks"]
    protocol = {**settings, "runs": args.runs, "limit": args.limit, "template": main_template,
                "benchmarks": ",".join(benchmarks),
                "questions": {b: asked[b]["questions"] for b in benchmarks}}  # fmt: skip
    table = render_tables(summary, benchmarks, model_name, protocol)
    results = {
        "model": args.model,
        "backend": settings["backend"],
        "benchmarks": benchmarks,
        "templates": names,
        "runs": args.runs,
        "limit": args.limit,
        "settings": settings,
        "paper_protocol": not protocol_differences(protocol),
        "main_template": main_template,  # the table's and the card's model-index
        # The card's model-index: where each benchmark lives on the Hub, if these are its questions.
        "hub_datasets": {b: hub_dataset(b, asked[b]["questions"]) for b in benchmarks},
        **summary,
    }
    return results, table


def main(argv: list[str] | None = None) -> None:
    # Under torchrun / accelerate launch, only the main process logs what goes well.
    main_process = os.environ.get("RANK", "0") == "0"
    logging.basicConfig(
        level=logging.INFO if main_process else logging.WARNING, format="%(asctime)s %(name)s: %(message)s"
    )
    args = parse_args(argv)
    overwrite = args.overwrite  # `run_evaluation` clears it once the folder is taken
    try:
        run_evaluation(args)
    except (EvalError, SourceError, TemplateError) as err:
        raise SystemExit(f"prompt-aug-eval: error: {err}") from None
    except KeyboardInterrupt:  # the completions written so far are kept; the same command goes on
        if main_process:
            again = "the same command without --overwrite" if overwrite else "the same command"
            print(
                f"\nprompt-aug-eval: interrupted; the completions written so far are kept, and {again} "
                "resumes from them",
                file=sys.stderr,
            )
        raise SystemExit(130) from None
