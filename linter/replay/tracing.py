"""Pass 1's processes: the sessions dealt to ``--jobs`` limited children (isolation.py),
each tracing its share with the ``Tracer`` and writing the traces to a temporary file it
inherited, as it makes them (``TraceStore``); the simulation reads them back in arrival
order, so memory follows the live sessions, not the log. A template that does not
compile is one error, said before any request is rendered.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import multiprocessing
import os
import pickle
import tempfile
import threading
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..engines.base import HARMONY
from ..isolation import parallel_map, run_isolated
from ..render import RenderError, compile_template
from .attribution import Trace, Tracer
from .log import Log, ReplayError, Session

# Below this many requests, forking workers costs more than it saves.
PARALLEL_MINIMUM = 200


@dataclass
class Spilled:
    """Where a tracing child wrote its traces (``TraceStore``): each trace's arrival
    position, offset and size in the child's file, in the order written; ``error`` where
    the file could not be written (no space left)."""

    orders: array = field(default_factory=lambda: array("q"))
    offsets: array = field(default_factory=lambda: array("q"))
    sizes: array = field(default_factory=lambda: array("q"))
    sessions: array = field(default_factory=lambda: array("q"))
    error: str | None = None


def _trace_group(
    tracer: Tracer,
    log: Log,
    groups: list[Session],
    indices: list[int],
    done: Any = None,
    share: int = 0,
    spill: Any = None,
) -> tuple[list[Trace] | Spilled, list[tuple[int, str]]]:
    """The traces of the sessions at ``indices``, and the requests left out; with ``spill``
    (a file of ``TraceStore``, inherited across the fork), each session's traces are
    written there as soon as they are made, and only where they are is returned: a child
    then holds one session's."""
    traces: list[Trace] = []
    problems: list[tuple[int, str]] = []
    spilled = Spilled()
    stream = None if spill is None else open(os.dup(spill.fileno()), "wb", buffering=1 << 20)  # noqa: SIM115 - closed below
    try:
        for index in indices:
            traced, failed = tracer.trace(index, groups[index], log)
            problems.extend(failed)
            if stream is None:
                traces.extend(traced)
            else:
                spilled.error = _spill(stream, traced, spilled)
                if spilled.error is not None:
                    break  # the run stops with it: no more sessions to render
            if done is not None:
                done[share] += len(groups[index].entries)
        if stream is not None and spilled.error is None:
            try:
                stream.flush()
            except OSError as error:
                spilled.error = _spill_problem(error)
    finally:
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    return (traces if spill is None else spilled), problems


def _spill(stream: Any, traces: list[Trace], spilled: Spilled) -> str | None:
    """``traces`` written to ``stream``, where ``spilled`` finds them; or why they cannot be."""
    try:
        for trace in traces:
            data = pickle.dumps(trace, pickle.HIGHEST_PROTOCOL)
            spilled.orders.append(trace.order)
            spilled.offsets.append(stream.tell())
            spilled.sizes.append(len(data))
            spilled.sessions.append(trace.session)
            stream.write(data)
    except OSError as error:
        return _spill_problem(error)
    return None


def _spill_problem(error: OSError) -> str:
    folder = tempfile.gettempdir()
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"no space left in {folder} for the replay's traces (about 4 bytes a token the log adds): "
            "free some, or set TMPDIR to a folder with room"
        )
    return f"cannot write the replay's traces in {folder}: {error.strerror or error}"


class TraceStore:
    """Every replayed request's trace, spilled by the tracing children and read back one at
    a time in arrival order: the simulation then holds the live sessions' prompts, never
    every trace of the log. One file a child, made here before the children are forked
    (they inherit it): a temporary file without a name (``tempfile.TemporaryFile``, 0600,
    in TMPDIR), so no exit, not even SIGKILL, leaves it behind; ``close`` frees it. Arrays
    indexed by arrival position say which file holds each trace and where (13 bytes a
    request)."""

    def __init__(self, count: int):
        self.count = count
        self.share = array("b", [-1]) * count
        self.offset = array("q", [0]) * count
        self.size = array("I", [0]) * count
        self.final: dict[int, int] = {}  # session -> arrival position of its last trace
        self.traces = 0
        self.files: list[Any] = []

    def file(self, share: int) -> Any:
        """The file the child of ``share`` writes to (made when first asked for)."""
        while len(self.files) <= share:
            self.files.append(tempfile.TemporaryFile(prefix="tmpl-lint-traces-"))  # noqa: SIM115 - closed by close()
        return self.files[share]

    def add(self, share: int, spilled: Spilled) -> None:
        if spilled.error is not None:
            raise ReplayError(spilled.error)
        for order, offset, size, session in zip(spilled.orders, spilled.offsets, spilled.sizes, spilled.sessions):
            self.share[order], self.offset[order], self.size[order] = share, offset, size
            self.final[session] = max(order, self.final.get(session, -1))
        self.traces += len(spilled.orders)

    def __len__(self) -> int:
        return self.traces

    def __iter__(self) -> Iterator[Trace]:
        descriptors = [file.fileno() for file in self.files]
        for order in range(self.count):
            share = self.share[order]
            if share >= 0:
                yield pickle.loads(os.pread(descriptors[share], self.size[order], self.offset[order]))

    def close(self) -> None:
        for file in self.files:
            with contextlib.suppress(OSError):
                file.close()
        self.files = []

    def __enter__(self) -> TraceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TemplateError(ReplayError):
    """The template renders no request: said once, not once per request."""


def _compiles(template: str) -> str | None:
    try:
        compile_template(template)
    except RenderError as error:
        return str(error)
    return None


def trace_sessions(
    tracer: Tracer,
    log: Log,
    groups: list[Session],
    jobs: int = 1,
    progress: Callable[[int], Any] | None = None,
    store: TraceStore | None = None,
) -> tuple[list[Trace] | TraceStore, list[tuple[int, str]]]:
    """Every request's trace in arrival order, and the requests the template refused.

    Rendering runs untrusted template code, so it runs in limited child processes
    (isolation.py), ``jobs`` of them at once, each with a share of the sessions (the
    sessions with the most requests first, each to the least loaded share); each child
    reads its sessions' requests from the log itself, and counts the requests it is done
    with where the parent's progress bar reads them (``progress(total)`` opens it: the
    command's, as report.progress draws it; None: no bar). With ``store`` each child writes
    its traces to its file there as it makes them and the store is returned, to be read in
    arrival order; without, they are gathered in a list. A template that does not compile
    raises TemplateError before any request is rendered."""
    if tracer.engine != HARMONY:  # openai-harmony renders gpt-oss without the template
        failure = run_isolated(_compiles, (tracer.template,))
        if failure is not None:
            raise TemplateError(failure)
    requests = sum(len(group.entries) for group in groups)
    shares = max(1, min(jobs, len(groups))) if requests >= PARALLEL_MINIMUM else 1
    loads = [0] * shares
    parts: list[list[int]] = [[] for _ in range(shares)]  # group indices, one list a child
    for index in sorted(range(len(groups)), key=lambda i: len(groups[i].entries), reverse=True):
        lightest = loads.index(min(loads))
        parts[lightest].append(index)
        loads[lightest] += len(groups[index].entries)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the children are forked
    done = multiprocessing.get_context("fork").RawArray("q", shares)  # one counter per child: no lock

    # Each share's file is made before any child is forked: the child inherits it. A file is
    # no argument a long-lived worker could be sent, so each share forks a child of its own.
    files = [None if store is None else store.file(share) for share in range(shares)]

    def share_of(share: int) -> Any:
        return run_isolated(_trace_group, (tracer, log, groups, parts[share], done, share, files[share]), seconds=None)

    gc.freeze()  # the entries, inherited: no collection in a child walks (and copies) them
    try:
        with progress(requests) if progress else contextlib.nullcontext() as bar, _Following(done, bar):
            finished = parallel_map(share_of, range(shares), shares)
    finally:
        gc.unfreeze()
    problems = sorted(problem for _, failed in finished for problem in failed)
    if store is not None:
        for share, (spilled, _) in enumerate(finished):
            store.add(share, spilled)
        return store, problems
    traces = [trace for traced, _ in finished for trace in traced]
    traces.sort(key=lambda trace: trace.order)
    return traces, problems


class _Following:
    """Within: a thread moves ``bar`` on as the children's counters in ``done`` grow."""

    def __init__(self, done: Any, bar: Any, every: float = 0.2):
        self.done, self.bar, self.every = done, bar, every
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)

    def _follow(self) -> None:
        shown = 0
        while not self.stopped.wait(self.every):
            total = sum(self.done)
            for _ in range(total - shown):
                self.bar.advance()
            shown = total

    def __enter__(self) -> _Following:
        if self.bar is not None and self.bar.total:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join()
