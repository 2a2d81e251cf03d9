"""Running one template's lint and proof in a child process, so that a hostile template
cannot hang the batch or exhaust its memory: the child has an address-space limit, and
the parent stops it after a wall-clock limit."""

from __future__ import annotations

import contextlib
import multiprocessing
import resource
from collections.abc import Callable
from typing import Any

MEMORY_BYTES = 8 * 1024**3
WALL_SECONDS = 120.0


class IsolationError(Exception):
    pass


def _child(connection, function: Callable, args: tuple, memory: int) -> None:
    with contextlib.suppress(ValueError, OSError):  # a lower hard limit already applies
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        connection.send(("ok", function(*args)))
    except MemoryError:
        connection.send(("error", "ran out of memory"))
    except BaseException as error:  # noqa: BLE001 - reported to the parent as text
        connection.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        connection.close()


def run_isolated(function: Callable, args: tuple, seconds: float = WALL_SECONDS, memory: int = MEMORY_BYTES) -> Any:
    """``function(*args)`` in a forked child; its result must be picklable."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, function, args, memory), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(seconds):
            process.kill()
            raise IsolationError(f"took over {seconds:g} s")
        try:
            status, value = receiver.recv()
        except EOFError:
            raise IsolationError(f"the worker died (exit code {process.exitcode})") from None
    finally:
        receiver.close()
        process.join(5)
        if process.is_alive():
            process.kill()
    if status != "ok":
        raise IsolationError(value)
    return value
