"""Evaluation on the paper's five math benchmarks (``prompt-aug-eval``); the modules are split by job."""
