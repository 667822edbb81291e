"""The names of a process's native threads, read from /proc (Linux): what the gloo teardown tests look for."""

from __future__ import annotations

import os
from pathlib import Path


def thread_names() -> list[str]:
    """Sorted names of this process's native threads (gloo names its own: ``pt_gloo_runloop``,
    ``gloo_tcp_loop``)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(names)
