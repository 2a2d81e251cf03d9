"""Replay's independent stages on a Dask cluster: ``--cluster ADDRESS`` or
``TMPL_LINT_CLUSTER=ADDRESS`` (a scheduler's ``tcp://host:8786``); neither: the local run.

The stages split where the work is independent:

1. Rendering and tokenizing, with each session's attribution, are per session: the sessions
   are dealt into shares by the bytes of their lines (the largest first, each to the
   lightest share), a few per worker thread so that a worker done early takes another's,
   and each share runs on a worker, where the template still runs in a limited child
   (isolation.py), as it does locally. The tracer (with its tokenizer) goes to each worker
   once, not with each share. A share's child starts from the tokenizer's caches the same
   worker thread's previous share ended with (``_WARM``), so that only a worker's first
   share tokenizes its vocabulary cold.
2. The traces stay on the workers that made them, as the block of pickled traces each
   child made (``Spilled`` says where each is). The client fetches them one share at a
   time, as each share finishes, and writes the block as it is to a ``TraceStore``
   (temporary files without a name, as the local run's tracing children write them): it
   never holds more than one share's traces, and never unpickles them to spill them.
3. Each pool's simulation runs its requests in arrival order over the traces' token ids;
   pools are independent of each other (each capacity swept), so each runs as one task,
   which gets every share from the workers that traced them. A fleet whose router reads
   no cache (round-robin, session, prefix: ``Router.reads_caches``) is split further, its
   replicas dealt into one task for each worker thread: each task routes the log itself,
   serves its replicas' requests, and looks its replicas up at the others'
   (``replay.simulate.simulate_replicas``). The kv router reads every replica's cache at
   every request: its fleet is one task. A single pool is simulated on the client, over
   the spilled traces.
4. The figures are merged on the client, reading the spilled traces in arrival order: the
   problems sorted, the replicas' parts in arrival order (``merge_replicas``), the
   summaries in the order of their capacities. The result is the local run's, byte for
   byte.

Dask rather than Ray: ``dask[distributed]`` is pure Python (about 25 MB installed with its
dependencies, 15 s to install on this machine), runs the plain functions replay already has
with no actor model or object store to fit them into, and starts a local cluster of worker
processes for a test in seconds; Ray's wheel alone is 79 MB, compiled, with a raylet and
GCS to start. The scheduler address is the only thing to configure.
"""

from __future__ import annotations

import contextlib
import gc
import io
import multiprocessing
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .engines.base import HARMONY
from .isolation import run_isolated
from .replay.log import ReplayError, parse_line
from .replay.simulate import first_fitting, merge_pool_tasks, pool_tasks, run_pool_task
from .replay.tracing import Spilled, TemplateError, TraceStore, _compiles, _spill, _spill_problem, _trace_group

CLUSTER_ENV = "TMPL_LINT_CLUSTER"
CONNECT_TIMEOUT = "30s"  # to reach the scheduler


class ClusterError(Exception):
    """The cluster cannot be reached, or the extra is not installed."""


def cluster_address(option: str | None = None) -> str | None:
    """The scheduler to run on: the flag, else the environment variable; None: local."""
    address = option if option is not None else os.environ.get(CLUSTER_ENV)
    return address.strip() or None if address is not None else None


# The schemes a Dask scheduler listens on.
SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


def address_problem(address: str) -> str | None:
    """Why ``address`` names no scheduler, before a client is made for it: a malformed one
    would otherwise wait out the connect timeout and leave a half-made client behind."""
    from distributed.comm.addressing import parse_address, parse_host_port  # noqa: PLC0415 -- the optional [cluster] extra

    try:
        scheme, location = parse_address(address, strict=True)
        parse_host_port(location)
    except ValueError as error:
        return f"not a scheduler address ({error}): give SCHEME://HOST:PORT, e.g. tcp://scheduler:8786"
    if scheme not in SCHEMES:
        return f"a Dask scheduler listens on {', '.join(SCHEMES)}, not {scheme}: e.g. tcp://scheduler:8786"
    return None


@contextlib.contextmanager
def connected(address: str) -> Iterator[Any]:
    """A client of the scheduler at ``address``, closed on leaving; ClusterError where there
    is none to reach or Dask is not installed."""
    try:
        from distributed import Client  # noqa: PLC0415 -- the optional [cluster] extra
    except ImportError:
        raise ClusterError(f"--cluster {address}: needs Dask's distributed scheduler: pip install 'tmpl-lint[cluster]'") from None
    problem = address_problem(address)
    if problem:
        raise ClusterError(f"--cluster {address}: {problem}")
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as error:
        raise ClusterError(f"--cluster {address}: cannot reach the scheduler: {error}") from None
    try:
        yield client
    finally:
        client.close()


def map_on(client: Any, function: Callable, items: Sequence[Any], common: Any = None) -> list[Any]:
    """``[function(item) for item in items]`` as tasks of ``client``'s cluster, in order; with
    ``common``, ``function(common, item)``, ``common`` sent to each worker once (and made
    into its object there once), not once per task."""
    # pure=False: two tasks with equal arguments are still two tasks.
    if common is None:
        return client.gather(client.map(function, list(items), pure=False))
    [scattered] = client.scatter([common], broadcast=True, hash=False)
    return client.gather(client.map(function, [scattered] * len(items), list(items), pure=False))


def cluster_map(address: str, function: Callable, items: Sequence[Any], common: Any = None) -> list[Any]:
    """``map_on`` the cluster at ``address``."""
    with connected(address) as client:
        return map_on(client, function, items, common)


def shares_of(sizes: Sequence[int], count: int) -> list[list[int]]:
    """Indices dealt into ``count`` shares: the largest first, each to the lightest share."""
    count = max(1, min(count, len(sizes)))
    loads = [0] * count
    parts: list[list[int]] = [[] for _ in range(count)]
    for index in sorted(range(len(sizes)), key=lambda i: sizes[i], reverse=True):
        lightest = loads.index(min(loads))
        parts[lightest].append(index)
        loads[lightest] += sizes[index]
    return [part for part in parts if part]


class ShareLog:
    """The lines of one share's sessions, read on the client and sent with the share: what
    the share's sessions read of the log (``Log.call`` and ``Log.entries[order]``), so that a
    worker needs no copy of the log file."""

    def __init__(self, log: Any, sessions: list[Any]):
        self.entries = {entry.order: entry for session in sessions for entry in session.entries}
        self.lines = {order: log.line(entry) for order, entry in self.entries.items()}

    def call(self, entry: Any) -> Any:

        call = parse_line(entry.line, self.lines[entry.order])
        if call is None:
            raise ReplayError("the line changed while it was replayed")
        call.order = entry.order
        return call


@dataclass(frozen=True, slots=True)
class ShareCost:
    """What one share of the sessions cost on the worker that traced it. CPU seconds beside
    the wall clock: on a shared machine the wall clock also counts the other work's turns."""

    share: int
    worker: int  # the worker's process id
    requests: int
    log_bytes: int  # of its sessions' lines
    start: float  # the worker's wall clock (time.time) when the share began, and ended
    end: float
    worker_cpu: float  # the worker's thread: forking the child, waiting, reading the traces back
    child_cpu: float  # the limited child: rendering, tokenizing and attributing the share


@dataclass(frozen=True, slots=True)
class PoolCost:
    """What one simulation task (``replay.simulate.PoolTask``) cost on its worker: the
    worker's thread, which ran it."""

    worker: int  # the worker's process id
    cpu: float
    wall: float


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of the client: wall seconds, and CPU seconds of its process (which also
    holds a LocalCluster's scheduler, and the client's own event loop) and of the thread
    that ran the phase (the client's serial work)."""

    wall: float
    cpu: float
    thread_cpu: float


@dataclass
class ClusterCosts:
    """Where a cluster run's time went (bench/replay_cluster.py prints it): each phase of the
    client, and each share's costs on its worker."""

    phases: dict[str, Phase] = field(default_factory=dict)
    shares: list[ShareCost] = field(default_factory=list)
    pools: list[PoolCost] = field(default_factory=list)  # the simulations run on workers

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
        try:
            yield
        finally:
            self.phases[name] = Phase(time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - thread)


# Per tracer (the one scattered to this worker), per worker thread: the tokenizer's caches
# (``tokenizer.Pieces``) the thread's last share's child ended with. Its next share's child
# starts from them: each share's child is forked afresh, and one that starts cold tokenizes
# again every word the shares before it learnt. Per thread, so that no child is forked
# while another thread changes what it inherits.
_WARM: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()


def _traced(
    tracer: Any, log: Any, groups: list[Any], indices: list[int], warm: Any
) -> tuple[bytes, Spilled, list[tuple[int, str]], Any, float]:
    """In the limited child: the share's traces, pickled one by one into one block as a
    tracing child spills them (``Spilled`` says where each is): the worker and the client
    pass the block on and write it as it is, never unpickling a trace. Beside it the
    tokenizer's caches, for the thread's next share, and the CPU the child spent (it was
    forked for this share: its count began at zero)."""
    pieces = tracer.encoder.pieces
    if pieces is not None and warm is not None:
        pieces.warm(warm)
    traces, problems = _trace_group(tracer, log, groups, indices)
    assert isinstance(traces, list)  # nothing spilled to a file: a cluster's traces come back in the result
    spilled, block = Spilled(), io.BytesIO()
    spilled.error = _spill(block, traces, spilled)
    return block.getvalue(), spilled, problems, None if pieces is None else pieces.caches(), time.process_time()


def _trace_share(
    tracer: Any, task: tuple[ShareLog, list[Any], list[int], int]
) -> tuple[bytes, Spilled, list[tuple[int, str]], ShareCost]:
    """On a worker: one share's sessions traced in a limited child, as the local run does."""
    if multiprocessing.current_process().daemon:
        raise ClusterError(
            "a worker renders in limited children and a daemonic worker may have none: "
            "start the workers with DASK_DISTRIBUTED__WORKER__DAEMON=False"
        )
    start, cpu = time.time(), time.thread_time()
    log, sessions, indices, share = task
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # The share carries only its own sessions: its indices are the log's, its list is short.
    groups: list[Any] = [None] * (max(indices) + 1)
    for index, session in zip(indices, sessions):
        groups[index] = session
    # As the local run: the worker's objects (the tokenizer, Dask's own), inherited, are
    # frozen so that no collection in the child walks them and copies every page they are on.
    warm = _WARM.setdefault(tracer, {})
    thread = threading.get_ident()
    gc.freeze()
    try:
        block, spilled, problems, warm[thread], child_cpu = run_isolated(
            _traced, (tracer, log, groups, indices, warm.get(thread)), seconds=None
        )
    finally:
        gc.unfreeze()
    cost = ShareCost(
        share, os.getpid(), sum(len(session.entries) for session in sessions), sum(map(log_bytes, sessions)),
        start, time.time(), time.thread_time() - cpu, child_cpu,
    )  # fmt: skip
    return block, spilled, problems, cost


# Each worker thread's part of the log in this many shares: a worker that finishes its
# own takes one that has not started elsewhere (a busier machine, a longer session), and
# what a share costs of its own (a fork, a lint of the template) stays small beside it.
SHARES_PER_THREAD = 4


def log_bytes(session: Any) -> int:
    """The bytes of a session's lines: what its rendering and tokenizing grow with (each
    line holds its request's whole history), which its number of requests does not say."""
    return sum(entry.size for entry in session.entries)


def trace_on_cluster(
    client: Any,
    tracer: Any,
    log: Any,
    groups: list[Any],
    store: TraceStore,
    shares: int | None = None,
    costs: ClusterCosts | None = None,
) -> tuple[list[Any], list[tuple[int, str]]]:
    """The sessions traced on ``client``'s cluster in ``shares`` tasks (None:
    SHARES_PER_THREAD for each of its worker threads): each share's traces are fetched as
    it finishes and spilled to ``store``, which then reads them in arrival order, as
    ``replay.tracing.trace_sessions`` gives them, so that this process never holds more
    than one share's. Returned: the shares as futures, their traces still held by the
    workers (for the simulation tasks: ``_simulate_on_worker``), and the requests the
    template refused."""
    import dask  # noqa: PLC0415 -- the optional [cluster] extra
    from distributed import as_completed  # noqa: PLC0415 -- the optional [cluster] extra

    if tracer.server_ids is not None:
        raise ClusterError("--cluster renders in the workers: it cannot use a --server's own token ids")
    costs = costs if costs is not None else ClusterCosts()
    with costs.phase("compile check"):
        if tracer.engine != HARMONY:  # as the local run: a template that does not compile is one error
            failure = run_isolated(_compiles, (tracer.template,))
            if failure is not None:
                raise TemplateError(failure)
    with costs.phase("deal shares"):
        count = shares or SHARES_PER_THREAD * max(1, sum(client.nthreads().values()))
        parts = shares_of([log_bytes(group) for group in groups], count)
        tasks = []
        for number, part in enumerate(parts):
            sessions = [groups[index] for index in part]
            tasks.append((ShareLog(log, sessions), sessions, part, number))
    problems: list[tuple[int, str]] = []
    with costs.phase("trace on workers"), dask.config.set({"distributed.admin.large-graph-warning-threshold": "2GB"}):
        # The tracer goes to each worker once, and is made into its object (its tokenizer
        # built) there once, not once per share. The shares, the log's lines, go in the task
        # graph, as large as the log: the scheduler can then run a share again elsewhere
        # should its worker be lost, which it cannot do with data scattered to that worker.
        [scattered] = client.scatter([tracer], broadcast=True, hash=False)
        futures = client.map(_trace_share, [scattered] * len(tasks), tasks, pure=False)
        for future in as_completed(futures, loop=client.loop):
            block, spilled, failed, cost = future.result()
            problems.extend(failed)
            costs.shares.append(cost)
            _spill_share(store, cost.share, block, spilled)
            del block  # the next share's are fetched into the room this took
    costs.shares.sort(key=lambda cost: cost.share)
    return futures, sorted(problems)


def _spill_share(store: TraceStore, share: int, block: bytes, spilled: Spilled) -> None:
    """One share's traces (``_traced``'s block) written as they are to the share's own file of
    ``store``, where ``spilled`` says each is, as a tracing child writes them."""
    if spilled.error is None:
        try:
            with open(os.dup(store.file(share).fileno()), "wb", buffering=0) as stream:
                view = memoryview(block)
                while view:
                    view = view[stream.write(view) :]
        except OSError as error:
            spilled.error = _spill_problem(error)
    store.add(share, spilled)


def _share_traces(shares: Sequence[Any]) -> list[Any]:
    """On a worker: every trace of the shares (``_trace_share``'s results), in arrival order."""
    traces = [
        pickle.loads(memoryview(block)[offset : offset + size])
        for block, spilled, _, _ in shares
        for offset, size in zip(spilled.offsets, spilled.sizes)
    ]
    return sorted(traces, key=lambda trace: trace.order)


def _simulate_on_worker(common: tuple[Any, ...], task: Any, shares: list[Any]) -> tuple[Any, PoolCost]:
    """On a worker: one simulation task over the traces of ``shares`` (Dask brings each
    share from the worker that traced it), and what it cost there."""
    start, cpu = time.perf_counter(), time.thread_time()
    result = run_pool_task((_share_traces(shares), *common), task)
    return result, PoolCost(os.getpid(), time.thread_time() - cpu, time.perf_counter() - start)


def replay_on_cluster(
    address: str,
    tracer: Any,
    log: Any,
    groups: list[Any],
    settings: Any,
    capacities: list[int | None],
    shares: int | None = None,
    costs: ClusterCosts | None = None,
) -> tuple[Any, list[tuple[int, str]]]:
    """``replay.simulate.replay`` with its stages on the cluster: the same summary and
    problems. ``shares``: as ``trace_on_cluster``; ``costs``: where the time went is
    recorded there."""
    costs = costs if costs is not None else ClusterCosts()
    with connected(address) as client, TraceStore(len(log.entries)) as store:
        shares_done, problems = trace_on_cluster(client, tracer, log, groups, store, shares, costs)
        settings_keys_unit = (settings, [group.key for group in groups], tracer.unit)
        with costs.phase("simulate pools"):
            tasks = pool_tasks(settings, capacities, max(1, sum(client.nthreads().values())))
            if len(tasks) > 1:
                # Each task's traces come from the workers that traced them, never from here.
                futures = [
                    client.submit(_simulate_on_worker, settings_keys_unit, task, shares_done, pure=False) for task in tasks
                ]
                done = client.gather(futures)
                costs.pools.extend(cost for _, cost in done)
                results = [result for result, _ in done]
            else:  # one task (a single pool): simulated here, over the traces spilled here
                results = [run_pool_task((store, *settings_keys_unit), tasks[0])]
        with costs.phase("merge replicas"):
            summaries = merge_pool_tasks((store, *settings_keys_unit), tasks, results)
    return first_fitting(summaries), problems
