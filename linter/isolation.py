"""Running untrusted work (parsing, analysing, compiling and rendering one template) in a
child process, so that a hostile template cannot hang the batch or exhaust its memory: the
child has an address-space limit, and the parent stops it after a wall-clock limit.

Every command runs its per-template work through here (check, --fix, --diff, audit) or
runs whole in one such child (diff, replay): one limit policy. ``parallel_map`` runs
several at once; interrupted (Ctrl-C, SIGTERM, to the whole group or to the main process
alone), it kills the children and starts no more, so the process stops at once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import resource
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MEMORY_BYTES = 8 * 1024**3
WALL_SECONDS = 120.0


class IsolationError(Exception):
    pass


class _Children:
    """The children running now, so that an interruption can stop every one of them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running: set = set()
        self.stopping = False

    def add(self, process) -> None:
        with self.lock:
            self.running.add(process)
            stopping = self.stopping
        if stopping:  # started while an interruption was stopping the others
            process.kill()

    def discard(self, process) -> None:
        with self.lock:
            self.running.discard(process)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            running = list(self.running)
        for process in running:
            with contextlib.suppress(OSError, ValueError):
                process.kill()

    def resume(self) -> None:
        with self.lock:
            self.stopping = False


CHILDREN = _Children()


def _child(connection, function: Callable, args: tuple, memory: int, seconds: float | None) -> None:
    with contextlib.suppress(ValueError, OSError):  # a lower hard limit already applies
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if seconds is not None:
        # The parent kills the child at the wall-clock limit; CPU time is the backstop should
        # the parent itself be killed first.
        with contextlib.suppress(ValueError, OSError):
            cpu = int(seconds) + 5
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    try:
        connection.send(("ok", function(*args)))
    except MemoryError:
        connection.send(("error", "ran out of memory"))
    except BaseException as error:  # noqa: BLE001 - reported to the parent as text
        connection.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        connection.close()


_DEFAULT: Any = object()


def run_isolated(function: Callable, args: tuple, seconds: float | None = _DEFAULT, memory: int = _DEFAULT) -> Any:
    """``function(*args)`` in a forked child; its result must be picklable. ``seconds``
    None: no wall-clock limit (the work bounds its own steps, as each render does); by
    default WALL_SECONDS and MEMORY_BYTES, read when called."""
    seconds = WALL_SECONDS if seconds is _DEFAULT else seconds
    memory = MEMORY_BYTES if memory is _DEFAULT else memory
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, function, args, memory, seconds), daemon=True)
    process.start()
    CHILDREN.add(process)
    sender.close()
    try:
        if not receiver.poll(seconds):
            raise IsolationError(f"took over {seconds:g} s")
        try:
            status, value = receiver.recv()
        except EOFError:
            raise IsolationError(f"the worker died (exit code {process.exitcode})") from None
    except BaseException:
        process.kill()  # interrupted, or over the limit: the child goes with the wait for it
        process.join()
        raise
    finally:
        receiver.close()
        # A child that answered is exiting; multiprocessing reaps it (at the next start, or
        # at exit, killing it if it is still there), so its exit is not waited for here.
        CHILDREN.discard(process)
    if status != "ok":
        raise IsolationError(value)
    return value


def parallel_map(function: Callable, items: Iterable, jobs: int) -> list:
    """``[function(item) for item in items]``, ``jobs`` at a time in threads (each thread
    waiting on its child). An interruption kills the children, cancels what has not
    started, and is raised once the threads are done, which is at once."""
    items = list(items)
    if jobs <= 1 or len(items) <= 1:
        try:
            return [function(item) for item in items]
        except BaseException:
            CHILDREN.stop()
            CHILDREN.resume()
            raise
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = [pool.submit(function, item) for item in items]
        return [future.result() for future in futures]
    except BaseException:
        CHILDREN.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        CHILDREN.resume()
        raise
    finally:
        pool.shutdown(wait=True)
