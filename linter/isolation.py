"""Running untrusted work (parsing, analysing, compiling and rendering one template) in a
child process, so that a hostile template cannot hang the batch or exhaust its memory: the
child has an address-space limit, and the parent stops it after a wall-clock limit.

Every command runs its per-template work through here (check, --fix, --diff, audit) or
runs whole in one such child (diff, replay): one limit policy. ``parallel_map`` runs
several at once; interrupted (Ctrl-C, SIGTERM, to the whole group or to the main process
alone), it kills the children and starts no more, so the process stops at once.

A fork per template cost an audit as much as its proofs (and every child started with
cold caches): inside ``long_lived_workers()`` each child applies the limits once and runs
one call after another. A call that breaks a limit ends its child, which the next call
replaces, and is reported as a child of its own would report it.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import pickle
import resource
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import Future

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


def interrupted() -> bool:
    """Whether an interruption is stopping the children: a call that failed now failed for
    that, not for what it was given, and nothing more is to be started or written."""
    return CHILDREN.stopping


def _limit_memory(memory: int) -> None:
    with contextlib.suppress(ValueError, OSError):  # a lower hard limit already applies
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))


def _limit_cpu(seconds: float | None) -> None:
    """The parent kills the child at the wall-clock limit; CPU time is the backstop should
    the parent itself be killed first."""
    if seconds is None:
        return
    with contextlib.suppress(ValueError, OSError):
        cpu = int(seconds) + 5
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))


_PR_SET_PDEATHSIG = 1
_prctl: Any = None


def _load_prctl() -> None:
    """Linux's prctl, loaded in the parent once so that each forked child only calls it."""
    global _prctl
    if _prctl is None:
        try:
            import ctypes  # noqa: PLC0415 -- for the first fork: --help loads this module and forks nothing

            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):  # not Linux: children still stop at their CPU limit
            _prctl = False


def _die_with_parent(parent: int) -> None:
    """SIGKILL this child when the thread that forked it ends, which a SIGKILL of the parent
    ends too: a killed command leaves nothing computing. Only for a child that thread waits
    for to the end; the parent may have died before this was set, hence the check after."""
    if _prctl:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _child(connection, function: Callable, args: tuple, memory: int, seconds: float | None, parent: int) -> None:
    _die_with_parent(parent)
    _limit_memory(memory)
    _limit_cpu(seconds)
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
    default WALL_SECONDS and MEMORY_BYTES, read when called. Inside ``long_lived_workers()``
    a worker runs it, when the function and its arguments can be sent to one."""
    seconds = WALL_SECONDS if seconds is _DEFAULT else seconds
    memory = MEMORY_BYTES if memory is _DEFAULT else memory
    workers = _WORKERS
    if workers is not None:
        try:
            task = pickle.dumps((function, args, seconds))
        except Exception:  # noqa: BLE001 - a function defined in place, say: a child of its own
            task = None
        if task is not None:
            return workers.run(task, seconds, memory)
    return _run_in_new_child(function, args, seconds, memory)


def _run_in_new_child(function: Callable, args: tuple, seconds: float | None, memory: int) -> Any:
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    _load_prctl()
    process = context.Process(target=_child, args=(sender, function, args, memory, seconds, os.getpid()), daemon=True)
    process.start()
    CHILDREN.add(process)
    sender.close()
    try:
        if not receiver.poll(seconds):
            raise IsolationError(f"took over {seconds:g} s")
        try:
            status, value = receiver.recv()
        except (EOFError, ConnectionResetError):  # it died answering (killed, out of memory)
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


class _Worker:
    """A limited child that runs calls one after another, sent to it pickled."""

    def __init__(self, memory: int):
        context = multiprocessing.get_context("fork")
        self.connection, child_end = context.Pipe()
        # Forked by a thread that ends before the worker's last call, a worker only checks
        # that its parent is there while idle; forked by the main thread, it dies with it.
        _load_prctl()
        dies = threading.current_thread() is threading.main_thread()
        self.process = context.Process(target=_serve, args=(child_end, self.connection, os.getpid(), memory, dies), daemon=True)
        self.process.start()
        child_end.close()
        CHILDREN.add(self.process)

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.process.kill()
        self.process.join()
        self.connection.close()
        CHILDREN.discard(self.process)


# A worker that has grown to this share of its address-space limit retires after its call:
# what its earlier calls left (caches, a tokenizer per repo) must not make a later template
# run out of memory that a fresh child would have rendered.
_RETIRE_AT = 0.5


# How often an idle worker checks that its parent is still there (other children may hold
# the parent's end of its pipe open, so the end of the pipe does not always say so).
_PARENT_CHECK_SECONDS = 1.0


def _serve(connection, parent_end, parent: int, memory: int, dies_with_parent: bool) -> None:
    if dies_with_parent:
        _die_with_parent(parent)
    parent_end.close()
    _limit_memory(memory)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    try:
        while True:
            while not connection.poll(_PARENT_CHECK_SECONDS):
                if os.getppid() != parent:
                    return  # the parent was killed: nobody will ask for more
            try:
                task = connection.recv_bytes()
            except EOFError:
                return  # the parent is gone
            if not task:
                return  # the parent is done with this worker
            function, args, seconds = pickle.loads(task)
            if seconds is not None:
                # As a child of its own would have (_limit_cpu), counted from what this one
                # has spent; only the soft limit (SIGXCPU ends the process): a hard limit
                # lowered for one call could not be raised for the next.
                usage = resource.getrusage(resource.RUSAGE_SELF)
                cpu = int(usage.ru_utime + usage.ru_stime + seconds) + 5
                with contextlib.suppress(ValueError, OSError):
                    resource.setrlimit(resource.RLIMIT_CPU, (cpu if hard == resource.RLIM_INFINITY else min(cpu, hard), hard))
            try:
                status, value = "ok", function(*args)
            except MemoryError:
                status, value = "error", "ran out of memory"
            except BaseException as error:  # noqa: BLE001 - reported to the parent as text
                status, value = "error", f"{type(error).__name__}: {error}"
            retiring = status != "ok" or _address_space() > memory * _RETIRE_AT
            try:
                connection.send((status, value, retiring))
            except MemoryError:
                connection.send(("error", "ran out of memory", True))
                return
            except Exception as error:  # noqa: BLE001 - a result that cannot be sent (unpicklable) is an error too
                connection.send(("error", f"{type(error).__name__}: {error}", True))
                return
            if retiring:
                return  # whatever broke a limit here, or grew, goes with this process
    except BaseException:  # noqa: BLE001 - interrupted while waiting or answering: the parent reports it
        return
    finally:
        connection.close()


def _address_space() -> int:
    """This process's virtual memory in bytes (what RLIMIT_AS limits), where /proc says it."""
    try:
        with open("/proc/self/statm", "rb") as stream:
            return int(stream.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Workers:
    """The idle workers of a ``long_lived_workers()`` block, by memory limit."""

    def __init__(self):
        self.lock = threading.Lock()
        self.idle: dict[int, list[_Worker]] = {}
        self.started: list[_Worker] = []

    def take(self, memory: int) -> tuple[_Worker, bool]:
        """An idle worker for this limit (and whether it is fresh), else a new one."""
        with self.lock:
            idle = self.idle.setdefault(memory, [])
            while idle:
                worker = idle.pop()
                if worker.process.is_alive():
                    return worker, False
                worker.stop()
        worker = _Worker(memory)
        with self.lock:
            self.started.append(worker)
        return worker, True

    def start(self, count: int, memory: int) -> None:
        """Fork ``count`` idle workers now, from the calling thread."""
        for _ in range(count):
            worker = _Worker(memory)
            with self.lock:
                self.started.append(worker)
            self.give_back(worker, memory)

    def give_back(self, worker: _Worker, memory: int) -> None:
        with self.lock:
            self.idle.setdefault(memory, []).append(worker)

    def run(self, task: bytes, seconds: float | None, memory: int) -> Any:
        worker, fresh = self.take(memory)
        try:
            worker.connection.send_bytes(task)
        except OSError:  # it died while idle (the machine's out-of-memory killer, say)
            worker.stop()
            if fresh:
                raise IsolationError(f"the worker died (exit code {worker.process.exitcode})") from None
            return self.run(task, seconds, memory)
        except BaseException:
            worker.stop()
            raise
        try:
            if not worker.connection.poll(seconds):
                raise IsolationError(f"took over {seconds:g} s")
            try:
                status, value, retiring = worker.connection.recv()
            except (EOFError, ConnectionResetError):  # it died answering (killed, out of memory)
                worker.process.join()
                raise IsolationError(f"the worker died (exit code {worker.process.exitcode})") from None
        except BaseException:
            worker.stop()  # interrupted, or over the limit: the worker goes with the wait for it
            raise
        if retiring:
            worker.stop()
        else:
            self.give_back(worker, memory)
        if status == "ok":
            return value
        if value == "ran out of memory" and not fresh:
            # Perhaps only with what this worker's earlier calls left: a fresh child decides.
            function, args, seconds = pickle.loads(task)
            return _run_in_new_child(function, args, seconds, memory)
        raise IsolationError(value)

    def close(self) -> None:
        for worker in self.started:
            with contextlib.suppress(OSError, ValueError):
                worker.connection.send_bytes(b"")  # no more calls: the worker exits
        for worker in self.started:
            worker.process.join(timeout=1)
            worker.stop()


_WORKERS: _Workers | None = None


@contextlib.contextmanager
def long_lived_workers() -> Iterator[None]:
    """Within: ``run_isolated`` runs its calls in children that each apply the limits once
    and serve call after call (one at a time), instead of a fork per call. They are forked
    as first needed, from the process as it is then (make it ready first: see
    checker.ready_to_fork), and stopped on leaving."""
    global _WORKERS
    outer, _WORKERS = _WORKERS, _Workers()
    try:
        yield
    finally:
        workers, _WORKERS = _WORKERS, outer
        workers.close()


def start_workers(count: int) -> None:
    """Fork the workers of this ``long_lived_workers()`` block now, from this thread, rather
    than as threads first need them: while other threads call, this one may be in an
    import or a download, holding a lock that a child forked then would find held forever."""
    if _WORKERS is not None:
        # What the parent made since checker.ready_to_fork froze its objects (an audit's
        # cache scan and the modules it imported) is frozen too: a child's collections would
        # otherwise walk it, and copy every page it is on.
        gc.freeze()
        _WORKERS.start(count, MEMORY_BYTES)


def parallel_map(function: Callable, items: Iterable, jobs: int) -> list:
    """``[function(item) for item in items]``, ``jobs`` at a time in threads (each thread
    waiting on its child). An interruption kills the children, cancels what has not
    started, and is raised once the threads are done, which is at once."""
    items = list(items)
    with calls_as_submitted(function, jobs if len(items) > 1 else 1) as submit:  # one item needs no thread
        futures = [submit(item) for item in items]
    return [future.result() for future in futures]


class _Finished:
    """A call made at once, answering as its Future would (without importing
    concurrent.futures: a one-template run makes no threads)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def result(self) -> Any:
        return self.value


@contextlib.contextmanager
def calls_as_submitted(function: Callable, jobs: int) -> Iterator[Callable[[Any], Future | _Finished]]:
    """Within: ``submit(item)`` starts ``function(item)`` (``jobs`` at a time, in threads)
    while the caller goes on finding the next item: an audit downloads repo after repo as
    the templates found so far are proven. On leaving, every call has finished. The first
    failure stops the rest at once and is raised, by the next ``submit`` or on leaving:
    calls still running would go on writing what they fix. An interruption kills the
    children and cancels what has not started."""
    if jobs <= 1:

        def call(item: Any) -> _Finished:
            return _Finished(function(item))

        try:
            yield call
        except BaseException:
            CHILDREN.stop()
            CHILDREN.resume()
            raise
        return
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait  # noqa: PLC0415 -- 3 ms: one template needs none

    pool = ThreadPoolExecutor(max_workers=jobs)
    futures: list[Future] = []
    failed: list[BaseException] = []

    def note_failure(future: Future) -> None:
        if not future.cancelled() and (error := future.exception()) is not None:
            failed.append(error)

    def submit(item: Any) -> Future:
        if failed:
            raise failed[0]
        future = pool.submit(function, item)
        future.add_done_callback(note_failure)
        futures.append(future)
        return future

    try:
        yield submit
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for future in done:
            if (error := future.exception()) is not None:
                raise error
    except BaseException:
        CHILDREN.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        CHILDREN.resume()
        raise
    finally:
        pool.shutdown(wait=True)
