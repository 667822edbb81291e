"""Entry point of ``python -m prompt_aug.evaluate`` and ``prompt-aug-eval``; the code is in `prompt_aug.evaluation`."""

from .evaluation.runner import *  # noqa: F403
from .evaluation.runner import main

if __name__ == "__main__":
    main()
