"""Self-repetition: does a completion end in a loop (the same n-gram over and over until it is cut off)?

A collapsing policy often stops answering and repeats a phrase until ``max_completion_length`` cuts it;
the share of such completions is a collapse signal (the ``repetition`` signal of the collapse guard, and
``templates/<name>/repetition`` per template). Works on any sequence: token ids in training, strings in
the examples below. A completion that ends with a stop token after a loop is not counted: it ended.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_PERIOD = 64  # longest repeated n-gram looked for, in tokens
MIN_REPEATS = (
    3  # the n-gram must occur at least this many times in a row (a cut-off last copy counts in part)
)
MIN_SPAN = 16  # and the looping tail must be at least this long, so "!!!" or "0000" is not a loop


def trailing_loop(
    seq: Sequence, max_period: int = MAX_PERIOD, min_repeats: int = MIN_REPEATS, min_span: int = MIN_SPAN
) -> int:
    """The length of the n-gram that ``seq`` ends repeating, or 0 if it does not end in a loop.

    The tail of ``seq`` loops with period ``p`` when each of its items equals the one ``p`` before it;
    the loop counts when that tail spans at least ``min_repeats * p`` items and at least ``min_span``.
    The tail may stop part way through a copy (a completion cut at the length limit). The shortest
    period is returned.

    >>> trailing_loop("Let x = 2. So so so so so so so so so so so", min_span=10)
    3
    >>> trailing_loop("The answer is 4. The answer is 4. The answer is 4. The ans", min_span=10)
    17
    >>> trailing_loop("The answer is 4. The answer is 4. So the answer is \\\\boxed{4}.", min_span=10)
    0
    >>> trailing_loop([5, 7, 1, 2, 1, 2, 1, 2, 1, 2], min_span=6)
    2
    """
    n = len(seq)
    for period in range(1, min(max_period, n // min_repeats) + 1):
        needed = max(min_repeats * period, min_span)
        if needed > n:
            continue
        # Walk back from the end while each item repeats the one `period` earlier; stop once long enough.
        i = n - 1
        stop = n - needed + period  # the tail [stop - period, n) is `needed` long
        while i >= stop and seq[i] == seq[i - period]:
            i -= 1
        if i < stop:
            return period
    return 0


def ends_in_loop(seq: Sequence, **kwargs: int) -> bool:
    """Whether ``seq`` ends repeating an n-gram (see `trailing_loop` for the rule and its keyword arguments).

    >>> ends_in_loop([9, 4] + [3, 1, 4] * 6), ends_in_loop([9, 4] + [3, 1, 4] * 6 + [0])
    (True, False)
    """
    return trailing_loop(seq, **kwargs) > 0
