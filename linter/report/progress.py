"""A progress bar on standard error for runs long enough to need one.

Shown only when standard error is a terminal and the run has lasted about a second (a
pre-commit hook or a pipe sees nothing), drawn by rich when it is installed, and erased
when the run ends, so that nothing of it stays in the output.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

DELAY = 1.0  # seconds before a bar appears: quick runs print nothing extra


class ProgressBar:
    def __init__(self, description: str, total: int | None, delay: float = DELAY, quiet: bool = False):
        """``total``: the steps to come; None when unknown (a bar without an end)."""
        self.description = description
        self.total = total
        self.done = 0
        self._lock = threading.Lock()
        self._bar: Any = None  # rich's Progress, once shown (rich is optional)
        self._task: Any = None
        self._timer: threading.Timer | None = None
        if total != 0 and not quiet and sys.stderr.isatty():  # -q: nothing but the findings
            self._timer = threading.Timer(delay, self._show)
            self._timer.daemon = True

    def __enter__(self) -> ProgressBar:
        if self._timer is not None:
            self._timer.start()
        return self

    def __exit__(self, *exc_info) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            if self._bar is not None:
                self._bar.stop()
            self._timer = self._bar = None

    def advance(self) -> None:
        with self._lock:
            self.done += 1
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)

    def _show(self) -> None:
        try:
            from rich.console import Console  # noqa: PLC0415 -- an extra (audit), 70 ms: only once a bar shows
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415 -- an extra
        except ImportError:
            return  # rich comes with tmpl-lint[audit]; without it, no bar
        with self._lock:
            if self._timer is None:  # the run ended while the timer fired
                return
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._task = self._bar.add_task(self.description, total=self.total, completed=self.done)
            self._bar.start()
