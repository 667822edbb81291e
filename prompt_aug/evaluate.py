"""The entry point ``python -m prompt_aug.evaluate`` (also the ``prompt-aug-eval`` script).

The code lives in `prompt_aug.evaluation`, one module per job: ``benchmarks`` (loading), ``backends``
(hf, vLLM), ``runner`` (generate and grade, resumable, shared by several processes), ``report``
(statistics, tables), ``cli`` (the command) and ``callback`` (`EvalCallback`, during training). This module
only re-exports their public names, so ``from prompt_aug.evaluate import X`` keeps working, and runs `main`.
"""

from __future__ import annotations

from .evaluation.backends import (
    CONTEXT_KEYS,
    STOP_RULES,
    Backend,
    Generation,
    HFBackend,
    VLLMBackend,
    default_backend,
    load_tokenizer,
    model_context_length,
    stop_rule_tokens,
    stop_token_ids,
    vllm_max_model_len,
)
from .evaluation.benchmarks import (
    ANSWER_FIELD,
    BENCHMARKS,
    HUB_SUITE,
    QUESTION_FIELD,
    QUESTION_SET_FILES,
    EvalError,
    Problem,
    benchmark_title,
    check_distinct,
    is_question_set,
    load_benchmark,
    metric_name,
    normalize_gold,
    parse_benchmarks,
    parse_templates,
)
from .evaluation.callback import EvalCallback, check_unsharded, sharding_error
from .evaluation.cli import (
    RECORDS_FILE,
    RESULTS_FILE,
    SETTINGS_BEFORE_STOP_FLAG,
    SETTINGS_FILE,
    TABLE_FILE,
    default_output,
    main,
    parse_args,
    run_evaluation,
)
from .evaluation.report import PAPER_PROTOCOL, protocol_differences, protocol_line, render_tables, summarize
from .evaluation.runner import (
    Processes,
    RecordKey,
    deal,
    fold_shards,
    generate_and_grade,
    join_processes,
    read_records,
    score_completions,
    shard_path,
    shard_paths,
)

__all__ = [
    "ANSWER_FIELD",
    "BENCHMARKS",
    "CONTEXT_KEYS",
    "HUB_SUITE",
    "PAPER_PROTOCOL",
    "QUESTION_FIELD",
    "QUESTION_SET_FILES",
    "RECORDS_FILE",
    "RESULTS_FILE",
    "SETTINGS_BEFORE_STOP_FLAG",
    "SETTINGS_FILE",
    "STOP_RULES",
    "TABLE_FILE",
    "Backend",
    "EvalCallback",
    "EvalError",
    "Generation",
    "HFBackend",
    "Problem",
    "Processes",
    "RecordKey",
    "VLLMBackend",
    "benchmark_title",
    "check_distinct",
    "check_unsharded",
    "deal",
    "default_backend",
    "default_output",
    "fold_shards",
    "generate_and_grade",
    "is_question_set",
    "join_processes",
    "load_benchmark",
    "load_tokenizer",
    "main",
    "metric_name",
    "model_context_length",
    "normalize_gold",
    "parse_args",
    "parse_benchmarks",
    "parse_templates",
    "protocol_differences",
    "protocol_line",
    "read_records",
    "render_tables",
    "run_evaluation",
    "score_completions",
    "shard_path",
    "shard_paths",
    "sharding_error",
    "stop_rule_tokens",
    "stop_token_ids",
    "summarize",
    "vllm_max_model_len",
]

if __name__ == "__main__":
    main()
