"""How a run stops on a signal. Ctrl-C raises Python's KeyboardInterrupt and SIGTERM raises
``Terminated``, both in the main thread, so that cleanup runs (temporary files removed,
children killed) and the run can say what it had written before it stopped. Standard
library only: ``__main__`` installs the SIGTERM handler before the command's modules load.
"""

from __future__ import annotations

from typing import NamedTuple


class Terminated(SystemExit):
    """SIGTERM (what `timeout`, CI cancellation and container stops send): exit 143. A
    SystemExit, so that it passes wherever an exit passes; a class of its own, so that the
    run tells it from other exits, as it tells Ctrl-C, and names the files it had fixed."""


def terminated(signum, frame):
    raise Terminated(128 + signum)


class Stop(NamedTuple):
    word: str  # said as "tmpl-lint: <word>"
    status: int


INTERRUPTED = Stop("interrupted", 130)
TERMINATED = Stop("terminated", 143)


def stopped_by(error: BaseException | None) -> Stop | None:
    """The signal ``error`` is, also as Python 3.11 wraps it in a RuntimeError when it lands
    in a __set_name__ (each dataclass field has one, run as its class is made while modules
    load); None for any other error."""
    if isinstance(error, RuntimeError):
        error = error.__cause__
    if isinstance(error, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(error, Terminated):
        return TERMINATED
    return None
