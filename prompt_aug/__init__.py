"""Prompt-augmented GRPO on TRL: a template bank, a group-consistent augmenting collator, and a thin
`GRPOTrainer` subclass. Entry points: ``python -m prompt_aug.train``, ``prompt_aug.data``,
``prompt_aug.evaluate``, ``prompt_aug.plot``."""

__version__ = "0.1.0"
