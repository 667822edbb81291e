"""The grading machinery beneath the rewards: answer extraction (``extract``), math-verify equivalence
(``verify``), its in-process fast path (``fastpath``), the worker pool (``pool``) and the graders that tie
them together (``grade``: `grade`, `grade_batch`). The reward functions and ``rewards.grade`` /
``rewards.grade_batch`` are in the ``rewards`` package above."""
