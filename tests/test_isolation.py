"""Long-lived limited workers (isolation.long_lived_workers): each applies the limits once
and serves call after call; a call that breaks a limit ends its worker, which the next call
replaces, and is reported as a child of its own reports it. Real processes throughout."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest
from helpers import CORPUS, wait_for_children

from tmpl_lint import isolation
from tmpl_lint.isolation import IsolationError, long_lived_workers, parallel_map, run_isolated

GIB = 1024**3
# What one call in a worker left for the next one to see (module state lives with the process).
_LEFT = []


def mapped() -> int:
    """What this process maps now, which RLIMIT_AS counts: a worker forked from it starts
    with all of it. A pytest worker that has loaded tokenizers maps over a GiB, so limits
    are given above it, or the tests would hang on what ran before them."""
    with open("/proc/self/statm", "rb") as stream:
        return int(stream.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def pid_and_limits() -> tuple[int, tuple[int, int], tuple[int, int], float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (
        os.getpid(),
        resource.getrlimit(resource.RLIMIT_AS),
        resource.getrlimit(resource.RLIMIT_CPU),
        usage.ru_utime + usage.ru_stime,
    )


def spend_cpu(seconds: float) -> int:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return os.getpid()


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def allocate(size: int) -> int:
    return len(bytearray(size))


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def fail() -> None:
    raise ValueError("no such thing")


def unpicklable_result():
    return lambda: None


def out_of_memory_after_an_earlier_call() -> int:
    """Runs out of memory only where an earlier call ran: what that call left, not itself."""
    if _LEFT:
        raise MemoryError
    _LEFT.append(1)
    return os.getpid()


def test_one_worker_serves_call_after_call_under_the_limits():
    limit = 2 * (GIB + mapped())  # a worker is retired once it maps over half its limit
    with long_lived_workers():
        seen = [run_isolated(pid_and_limits, (), seconds=30, memory=limit) for _ in range(5)]
    assert len({pid for pid, *_ in seen}) == 1 and seen[0][0] != os.getpid()
    for _, memory, (cpu_soft, _), used in seen:
        assert memory == (limit, limit)
        # the CPU backstop is counted from what the worker has spent on earlier calls
        assert int(used) + 30 + 5 - 1 <= cpu_soft <= int(used) + 30 + 5 + 1


def test_the_cpu_limit_of_a_worker_follows_what_it_has_spent():
    with long_lived_workers():
        first, _, (first_limit, _), _ = run_isolated(pid_and_limits, (), seconds=10)
        assert run_isolated(spend_cpu, (1.5,), seconds=10) == first
        again, _, (second_limit, _), _ = run_isolated(pid_and_limits, (), seconds=10)
    assert again == first and second_limit >= first_limit + 1


def test_a_call_over_the_wall_clock_limit_ends_its_worker_only():
    with long_lived_workers():
        before = run_isolated(os.getpid, (), seconds=30)
        start = time.monotonic()
        with pytest.raises(IsolationError, match=r"^took over 1 s$"):
            run_isolated(sleep, (60,), seconds=1)
        assert time.monotonic() - start < 10
        after = run_isolated(os.getpid, (), seconds=30)
    assert after != before


def test_running_out_of_memory_is_reported_as_a_child_of_its_own_reports_it():
    # Twice what this process maps plus a GiB: a worker is retired once it maps over half its
    # limit, so only the allocation below (over the whole limit) may retire it.
    limit = 2 * (GIB + mapped())
    with long_lived_workers():
        before = run_isolated(os.getpid, (), memory=limit)
        assert run_isolated(os.getpid, (), memory=limit) == before  # a call within the limits keeps it
        with pytest.raises(IsolationError, match=r"^ran out of memory$"):
            run_isolated(allocate, (limit,), memory=limit)
        assert run_isolated(allocate, (1000,), memory=limit) == 1000
        after = run_isolated(os.getpid, (), memory=limit)
    assert after != before
    with pytest.raises(IsolationError, match=r"^ran out of memory$"):  # the same, without workers
        run_isolated(allocate, (limit,), memory=limit)


def test_memory_run_out_in_a_used_worker_is_decided_by_a_fresh_child():
    with long_lived_workers():
        first = run_isolated(out_of_memory_after_an_earlier_call, ())
        # the worker of the first call runs out; a fresh child, forked from this process, does not
        second = run_isolated(out_of_memory_after_an_earlier_call, ())
    assert first != second != os.getpid()


def test_a_worker_that_dies_is_reported_and_replaced():
    with long_lived_workers():
        before = run_isolated(os.getpid, ())
        with pytest.raises(IsolationError, match=rf"^the worker died \(exit code -{int(signal.SIGKILL)}\)$"):
            run_isolated(die, ())
        after = run_isolated(os.getpid, ())
    assert after != before


def test_errors_read_as_a_child_of_its_own_says_them():
    for workers in (True, False):
        with long_lived_workers() if workers else contextlib.nullcontext():
            with pytest.raises(IsolationError, match=r"^ValueError: no such thing$"):
                run_isolated(fail, ())
            with pytest.raises(IsolationError, match=r"^(PicklingError|AttributeError): .*lambda"):
                run_isolated(unpicklable_result, ())


def test_what_cannot_be_sent_to_a_worker_runs_in_a_child_of_its_own():
    local = 41
    with long_lived_workers():
        assert run_isolated(lambda: (local + 1, os.getpid()), ())[0] == 42


def test_workers_serve_parallel_calls_and_stop_on_leaving():
    with long_lived_workers():
        pids = parallel_map(lambda _: run_isolated(spend_cpu, (0.05,)), range(12), 2)
        workers = list(isolation._WORKERS.started)
    assert len(set(pids)) == len(workers) <= 2
    assert all(not worker.process.is_alive() for worker in workers)
    assert isolation._WORKERS is None


def test_ctrl_c_stops_an_audit_and_its_workers(tmp_path):
    hostile = (CORPUS.parent / "tests" / "hostile" / "nested_loops.jinja").read_text()
    models = []
    for index in range(12):  # each renders to its 2 s limit: the audit runs for a while
        (tmp_path / str(index)).mkdir()
        (tmp_path / str(index) / "chat_template.jinja").write_text(f"{hostile}{{# {index} #}}")
        models.append(str(tmp_path / str(index)))
    process = subprocess.Popen(
        [sys.executable, "-m", "tmpl_lint", "audit", *models, "--no-cache"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    # Ctrl-C once the workers are rendering (the first template for 2 s)
    assert wait_for_children(process.pid, 1)
    time.sleep(0.5)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert (process.returncode, err) == (130, "tmpl-lint: interrupted\n")
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):  # nothing of the group is left running
        os.killpg(process.pid, 0)


def test_audit_reports_a_template_over_the_limit_and_goes_on(tmp_path):
    models = []
    for name, template in (
        ("a", (CORPUS / "clean_chatml.jinja").read_text()),
        (
            "b",
            "{{ 'a'|center(10000000000) }}{% for m in messages %}{{ m.content }}{% endfor %}",
        ),  # 10 GB, refused before it is made
        ("c", (CORPUS / "clean_chatml.jinja").read_text() + "\n"),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "chat_template.jinja").write_text(template)
        models.append(str(tmp_path / name))
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", "audit", *models, "--no-cache", "--format", "json", "--jobs", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    rows = json.loads(result.stdout)["rows"]
    assert [row["codes"] for row in rows] == [[], ["PC101"], []]
    (finding,) = rows[1]["findings"]
    assert finding["message"] == 'render limit exceeded in "chat": center asks for 10000000000 characters, over the 1000000 limit'


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # exited, not yet reaped
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
def test_workers_of_a_killed_parent_exit():
    script = (
        "import os, sys, time\n"
        "from tmpl_lint.isolation import long_lived_workers, parallel_map, run_isolated\n"
        "with long_lived_workers():\n"
        "    pids = parallel_map(lambda _: run_isolated(time.sleep, (0.5,)) or run_isolated(os.getpid, ()), range(2), 2)\n"
        "    print(*set(pids), flush=True)\n"
        "    time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert workers and not any(map(_gone, workers))
    parent.kill()  # no chance to stop its workers
    parent.wait()
    deadline = time.monotonic() + 10
    while not all(map(_gone, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(map(_gone, workers))
