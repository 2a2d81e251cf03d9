"""Replay on a real local Dask cluster of two worker processes equals the local run, byte for
byte. Skipped where the ``cluster`` extra (dask[distributed]) is not installed."""

from __future__ import annotations

import json
import os
import random
from datetime import datetime, timedelta

import pytest
from helpers import CORPUS, SHARED_TOKENIZERS, needs_shared, shared_tokenizer

distributed = pytest.importorskip("distributed")

from tmpl_lint.cluster import (  # noqa: E402
    SHARES_PER_THREAD,
    ClusterCosts,
    ClusterError,
    cluster_address,
    cluster_map,
    connected,
    log_bytes,
    replay_on_cluster,
    shares_of,
    trace_on_cluster,
)
from tmpl_lint.diff import read_template  # noqa: E402
from tmpl_lint.replay.attribution import Tracer  # noqa: E402
from tmpl_lint.replay.log import read_log, sessions  # noqa: E402
from tmpl_lint.replay.simulate import CacheSettings, replay  # noqa: E402
from tmpl_lint.replay.tracing import TraceStore, trace_sessions  # noqa: E402


def write_log(path, count=12, turns=4, seed=3):
    """Interleaved sessions, turns 37 s apart (a clock printed to the minute moves within
    a session), timestamps out of file order."""
    rng = random.Random(seed)
    start = datetime(2026, 3, 1, 9)
    entries = []
    for number in range(count):
        history = [{"role": "system", "content": "You track orders."}]
        for turn in range(rng.randrange(1, turns + 1)):
            history = history + [{"role": "user", "content": f"Order {number}-{turn}? " * rng.randrange(1, 5)}]
            reply = {"role": "assistant", "content": f"Ships {turn}.", "reasoning_content": f"Check {number}-{turn}. " * 3}
            entries.append(
                {
                    "timestamp": (start + timedelta(seconds=37 * turn + number)).isoformat(),
                    "request": {"user": f"s{number}", "messages": history},
                    "response": {"choices": [{"message": reply}]},
                }
            )
            history = history + [reply]
    rng.shuffle(entries)
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))


@pytest.fixture(scope="module")
def local_cluster():
    import dask

    # Replay's renders run in a limited child of the worker: a worker must be allowed children.
    with dask.config.set({"distributed.worker.daemon": False}):
        cluster = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0"
        )
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.parametrize(
    "template, settings",
    [
        ("PC001_clock_per_minute.jinja", CacheSettings("vllm", 4)),
        ("clean_chatml.jinja", CacheSettings("vllm", 4)),
        # fleets: split into one task per worker (each with some replicas), merged on the client
        ("PC001_clock_per_minute.jinja", CacheSettings("vllm", 4, replicas=4, router="session")),
        ("PC001_clock_per_minute.jinja", CacheSettings("vllm", 4, replicas=3, router="round-robin")),
        ("clean_chatml.jinja", CacheSettings("vllm", 4, replicas=3, router="prefix")),
        ("clean_chatml.jinja", CacheSettings("vllm", 4, replicas=2, router="kv")),  # not split: one task a capacity
    ],
    ids=lambda value: value if isinstance(value, str) else f"{value.replicas}-{value.router}",
)
def test_the_cluster_run_equals_the_local_run_byte_for_byte(tmp_path, local_cluster, template, settings):
    log = tmp_path / "log.jsonl"
    write_log(log)
    text, special = read_template(CORPUS / template)
    capacities = [None, 40, 200]  # 40 blocks hold too little: an error, the same on both

    def report(summary, problems):
        return json.dumps({"summary": summary.to_json(), "problems": problems}, sort_keys=True).encode()

    with read_log(log, "user") as opened:
        assert not opened.problems
        groups = sessions(opened, "user")
        local = report(*replay(Tracer(text, None, special, "vllm"), opened, groups, settings, capacities, 1))
        address = local_cluster.scheduler_address
        distributed_run = report(
            *replay_on_cluster(address, Tracer(text, None, special, "vllm"), opened, groups, settings, capacities, 2)
        )
        requests = len(opened.entries)
    assert distributed_run == local
    figures = json.loads(local)["summary"]
    assert figures["requests"] == requests
    if template.startswith("PC001"):  # the clock's losses were attributed on the workers too
        assert figures["tokens_by_cause"]["template"] > 0 and figures["causes"]
    if settings.router == "round-robin" and settings.replicas > 1:  # the merge took the other replicas' lookups
        assert figures["fleet"]["lost_to_routing"] > 0 and figures["tokens_by_cause"]["routing"] > 0


def test_the_tasks_ran_in_two_other_processes(local_cluster):
    pids = cluster_map(local_cluster.scheduler_address, _pid, list(range(8)))
    assert os.getpid() not in pids
    with distributed.Client(local_cluster.scheduler_address) as client:
        workers = client.run(os.getpid)
    assert len(set(workers.values())) == 2 and set(pids) <= set(workers.values())


def _pid(_item):
    return os.getpid()


def test_the_address_comes_from_the_flag_else_the_environment(monkeypatch):
    monkeypatch.delenv("TMPL_LINT_CLUSTER", raising=False)
    assert cluster_address(None) is None
    monkeypatch.setenv("TMPL_LINT_CLUSTER", "tcp://127.0.0.1:8786")
    assert cluster_address(None) == "tcp://127.0.0.1:8786"
    assert cluster_address("tcp://127.0.0.1:9999") == "tcp://127.0.0.1:9999"
    monkeypatch.setenv("TMPL_LINT_CLUSTER", " ")
    assert cluster_address(None) is None


def test_an_unreachable_scheduler_is_one_error(monkeypatch):
    monkeypatch.setattr("tmpl_lint.cluster.CONNECT_TIMEOUT", "2s")
    with pytest.raises(ClusterError, match="cannot reach the scheduler"):
        cluster_map("tcp://127.0.0.1:9", _pid, [1])


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("notanaddress", "not a scheduler address"),
        ("tcp://scheduler", "missing port number"),
        ("http://127.0.0.1:8786", "not http"),
    ],
)
def test_an_address_that_names_no_scheduler_is_one_line_at_once(tmp_path, address, said):
    # A malformed address used to wait out the 60 s connect timeout, then print the
    # half-made client's traceback.
    import subprocess
    import sys
    import time

    log = tmp_path / "log.jsonl"
    write_log(log, count=2)
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", "replay", str(log), "--template", str(CORPUS / "clean_chatml.jinja")]
        + ["--session-key", "user", "--cluster", address],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.monotonic() - start < 20
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"tmpl-lint: error: --cluster {address}: ") and said in result.stderr


def test_shares_deal_the_longest_sessions_first():
    # 9 to share 0 (loads 9, 0); 7 to 1 (9, 7); 5 to 1 (9, 12); 3 to 0 (12, 12); 1 to the first of equals, 0.
    assert shares_of([5, 9, 1, 7, 3], 2) == [[1, 4, 2], [3, 0]]


def test_the_environment_variable_runs_the_command_on_the_cluster(tmp_path, local_cluster, monkeypatch):
    """The whole command, its JSON report byte for byte, with TMPL_LINT_CLUSTER set and not."""
    from click.testing import CliRunner

    from tmpl_lint.cli import main

    log = tmp_path / "log.jsonl"
    write_log(log, count=40)
    command = ["replay", str(log), "--template", str(CORPUS / "PC001_clock_per_minute.jinja"), "--session-key", "user"]
    command += ["--block-size", "4", "--cache-blocks", "60,400", "--format", "json", "--jobs", "2"]
    monkeypatch.delenv("TMPL_LINT_CLUSTER", raising=False)
    local = CliRunner().invoke(main, command)
    monkeypatch.setenv("TMPL_LINT_CLUSTER", local_cluster.scheduler_address)
    before = len(local_cluster.scheduler.transition_log)
    clustered = CliRunner().invoke(main, command)
    assert len(local_cluster.scheduler.transition_log) > before  # the scheduler ran its tasks
    assert local.exit_code == clustered.exit_code == 0, (local.output, clustered.output)
    assert clustered.stdout_bytes == local.stdout_bytes
    assert json.loads(local.stdout)["template"]["requests"] > 40


def test_the_shares_are_dealt_by_log_bytes_several_to_each_worker(tmp_path, local_cluster):
    """Sessions of one long request beside sessions of many short ones: dealt by their
    requests they would not share the work out; by the bytes of their lines they do. Each
    worker thread gets SHARES_PER_THREAD shares, and both workers take some."""
    log = tmp_path / "log.jsonl"
    lines = []
    for number in range(12):
        long = number < 4
        history = [{"role": "system", "content": "You track orders."}]
        for turn in range(1 if long else 5):
            history = history + [{"role": "user", "content": ("Order? " * (900 if long else 6)) + str(number)}]
            lines.append(json.dumps({"request": {"user": f"s{number}", "messages": history}}) + "\n")
            history = history + [{"role": "assistant", "content": f"Ships {turn}."}]
    log.write_text("".join(lines))
    bytes_of, requests_of = {}, {}
    for line in lines:  # each session's bytes, from the file's own lines
        user = json.loads(line)["request"]["user"]
        bytes_of[user] = bytes_of.get(user, 0) + len(line.encode())
        requests_of[user] = requests_of.get(user, 0) + 1
    users = sorted(bytes_of)
    shares = SHARES_PER_THREAD * 2

    def loads(sizes):
        return sorted(sum(bytes_of[users[i]] for i in part) for part in shares_of(sizes, shares))

    by_bytes = loads([bytes_of[user] for user in users])
    assert by_bytes != loads([requests_of[user] for user in users])  # the two ways differ on this log
    text, special = read_template(CORPUS / "clean_chatml.jinja")
    costs = ClusterCosts()
    with read_log(log, "user") as opened:
        groups = sessions(opened, "user")
        settings = CacheSettings("vllm", 4)
        local = replay(Tracer(text, None, special, "vllm"), opened, groups, settings, [None], 1)
        clustered = replay_on_cluster(
            local_cluster.scheduler_address, Tracer(text, None, special, "vllm"), opened, groups, settings, [None], None, costs
        )
    assert clustered[0].to_json() == local[0].to_json()
    assert sorted(share.log_bytes for share in costs.shares) == by_bytes
    assert sum(share.requests for share in costs.shares) == len(lines)
    assert len({share.worker for share in costs.shares}) == 2
    assert all(share.child_cpu > 0 and share.end >= share.start for share in costs.shares)


def write_prose_log(path, count=24, seed=5):
    """Sessions of prose drawn from one vocabulary: a word one share tokenized comes again in
    the shares after it, which start from the caches the one before left."""
    rng = random.Random(seed)
    words = [f"{rng.choice(['re', 'un', 'over', ''])}{rng.choice(['load', 'ship', 'track', 'pack', 'bill'])}" for _ in range(60)]
    words += ["naïve", "café", "→", "日本語", "  ", "\n", "3.14", "don't"]
    lines = []
    for number in range(count):
        history = [{"role": "system", "content": "You track orders."}]
        for _ in range(rng.randrange(1, 5)):
            history = history + [{"role": "user", "content": " ".join(rng.choices(words, k=rng.randrange(5, 60)))}]
            lines.append(json.dumps({"request": {"user": f"s{number}", "messages": history}}) + "\n")
            history = history + [{"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randrange(5, 40)))}]
    path.write_text("".join(lines))


@needs_shared
def test_shares_that_start_from_the_previous_shares_caches_trace_the_local_ids(tmp_path, local_cluster):
    """A real tokenizer encoded in pieces (Qwen3's): each worker traces four shares in turn,
    each share's child starting from the tokenizer caches the one before it ended with; every
    trace (its token ids, departures, replies) equals the local run's, one process, cold."""
    tokenizer = shared_tokenizer("qwen3")
    text, _ = read_template(SHARED_TOKENIZERS / "qwen3")
    log = tmp_path / "log.jsonl"
    write_prose_log(log)

    def tracer():
        return Tracer(text, tokenizer, tokenizer.special_tokens, "vllm")

    assert tracer().encoder.pieces is not None  # the caches handed on are this tokenizer's
    costs = ClusterCosts()
    with read_log(log, "user") as opened:
        groups = sessions(opened, "user")
        local, local_problems = trace_sessions(tracer(), opened, groups, 1)
        with connected(local_cluster.scheduler_address) as client, TraceStore(len(opened.entries)) as store:
            _, problems = trace_on_cluster(client, tracer(), opened, groups, store, 8, costs)
            clustered = list(store)
    assert len(clustered) == len(local) == len(opened.entries) and not problems and not local_problems
    assert clustered == local
    assert sum(len(trace.tail) for trace in local) > 1000
    by_worker = [sum(share.worker == pid for share in costs.shares) for pid in {share.worker for share in costs.shares}]
    assert len(costs.shares) == 8 and min(by_worker) >= 2, by_worker  # each worker handed its caches on
    assert sorted(share.log_bytes for share in costs.shares) == sorted(
        sum(log_bytes(groups[index]) for index in part) for part in shares_of([log_bytes(group) for group in groups], 8)
    )


@needs_shared
def test_pieces_warmed_with_anothers_caches_encode_as_the_tokenizer(monkeypatch):
    """The hand-off the cluster's shares rely on: a Pieces started from another's caches asks
    the library only for words that one did not keep, and its ids are the tokenizer's own."""
    from tmpl_lint.tokenizer import PrefixEncoder

    tokenizer = shared_tokenizer("qwen3")
    first, second = PrefixEncoder(tokenizer).pieces, PrefixEncoder(tokenizer).pieces
    assert first is not None and second is not None
    known = "the order ships today and the bill follows"
    first.encode(known)
    second.warm(first.caches())
    asked = []
    batch = second._batch
    monkeypatch.setattr(second, "_batch", lambda texts: asked.extend(texts) or batch(texts))
    text = "the order ships tomorrow; the bill follows later"  # ASCII: encoded word by word
    ids, _ = second.encode(text)
    assert ids == tokenizer.encode(text)
    assert sorted(asked) == [" later", " tomorrow", ";"]  # the words the first had not met
