"""A fleet's replicas simulated apart (``run_replicas``, one process or cluster task each) and
merged equal the whole ``Fleet`` run in one process: request by request, and in every byte
of the reports. The truth here is the sequential ``Fleet``, whose figures test_fleet.py
counts by hand and test_fleet_golden.py holds to vLLM's own KVCacheManager (with --jobs 2
there, the split path too)."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace

import pytest
from helpers import CORPUS
from test_cluster import write_log

from tmpl_lint.diff import read_template
from tmpl_lint.kv_cache.fleet import (
    Fleet,
    FleetFigures,
    SessionChains,
    block_hashes,
    cached_prefix,
    first_error,
    held_elsewhere,
    make_router,
    run_replicas,
    served_in_order,
)
from tmpl_lint.kv_cache.hybrid import FULL, SLIDING, Group, HybridPrefixCache, Layout
from tmpl_lint.kv_cache.pools import CacheError, CacheRequest, LlamaCppSlots, SglangRadixCache, VllmPrefixCache
from tmpl_lint.replay.attribution import Tracer
from tmpl_lint.replay.log import read_log, sessions
from tmpl_lint.replay.simulate import CacheSettings, PoolTask, pool_tasks, replay, text_report
from tmpl_lint.report.replay import html_report
from tmpl_lint.tokenizer import common_prefix_length

SPLIT_ROUTERS = ["round-robin", "session", "prefix"]


def hand_made_log(seed: int = 5, sessions_count: int = 9, turns: int = 5) -> list[tuple[CacheRequest, bool]]:
    """Interleaved sessions in blocks of 4: every prompt opens with one of two system prompts
    (3 blocks), then grows turn by turn by what the session sent and the reply; one session in
    three rewrites an early message at its third turn (a departure), and each request's reply
    is logged; each follow-up carries the hint replay gives (the tokens it shares with the
    session's previous prompt), one in four a shorter one. With each request: whether it is
    its session's last."""
    rng = random.Random(seed)
    systems = [list(range(1, 13)), list(range(101, 113))]
    plans = []
    for number in range(sessions_count):
        prompt = list(systems[number % 2])
        requests, previous = [], None
        for turn in range(rng.randrange(2, turns + 1)):
            if number % 3 == 0 and turn == 2:
                prompt[14] = 999  # the session's history changes: nothing past it hits
            prompt = prompt + [1000 * number + 10 * turn + k for k in range(rng.randrange(2, 9))]
            reply = [500_000 + 1000 * number + 10 * turn + k for k in range(rng.randrange(1, 7))]
            shared = None if previous is None else common_prefix_length(previous, prompt)
            if shared is not None and rng.random() < 0.25:
                shared = rng.randrange(shared + 1)
            requests.append(CacheRequest(f"s{number}", list(prompt), reply, shared=shared))
            previous = list(prompt)
            prompt = prompt + reply
        plans.append(requests)
    order = [number for number, requests in enumerate(plans) for _ in requests]
    rng.shuffle(order)
    taken = [0] * len(plans)
    out = []
    for number in order:
        request = plans[number][taken[number]]
        taken[number] += 1
        out.append((request, taken[number] == len(plans[number])))
    return out


def sequential(make, router: str, replicas: int, log) -> tuple[list[tuple[int, object]], Fleet, tuple[int, str] | None]:
    fleet = Fleet([make() for _ in range(replicas)], make_router(router, replicas, 4))
    out = []
    for index, (request, last) in enumerate(log):
        try:
            served = fleet.serve(request)
        except CacheError as error:
            return out, fleet, (index, str(error))
        if last:
            fleet.finish(request.session)
        out.append((fleet.routes[-1], served))
    return out, fleet, None


def split(make, router: str, replicas: int, log, groups: list[tuple[int, ...]]):
    runs = [run_replicas({replica: make() for replica in group}, make_router(router, replicas, 4), iter(log)) for group in groups]
    merged = list(served_in_order(runs))
    figures = FleetFigures(make_router(router, replicas, 4), replicas)
    for (request, _), (replica, served) in zip(log, merged):
        figures.count(replica, request.session, len(request.prompt), served.hit, served.hit + served.elsewhere)
    return merged, figures, first_error(runs)


CACHES = {
    "vllm unbounded": lambda: VllmPrefixCache(block_size=4),
    "vllm 18 blocks": lambda: VllmPrefixCache(block_size=4, num_blocks=18),
    "sglang 80 tokens": lambda: SglangRadixCache(page_size=1, capacity_tokens=80),
    "llamacpp": lambda: LlamaCppSlots(),
    "hybrid 34 blocks": lambda: HybridPrefixCache(Layout((Group(SLIDING, 8), Group(FULL)), 4), 34),
}


@pytest.mark.parametrize("router", SPLIT_ROUTERS)
@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("groups", [[(0,), (1,), (2,)], [(0, 2), (1,)], [(2, 1, 0)]])
def test_replicas_apart_serve_what_the_whole_fleet_serves(router, cache, groups):
    log = hand_made_log()
    expected, fleet, expected_error = sequential(CACHES[cache], router, 3, log)
    merged, figures, error = split(CACHES[cache], router, 3, log, groups)
    assert merged == expected
    assert error == expected_error is None
    assert figures.to_json() == fleet.to_json() and figures.describe("token") == fleet.describe("token")
    assert figures.routes == fleet.routes


def test_the_hand_made_log_loses_to_routing_and_to_evictions():
    """What the equality above rests on: every router spreads the log (prefix: the two
    system prompts' sessions apart), round-robin loses tokens another replica held, and the
    bounded pools evict (their hits fall below the unbounded pool's)."""
    log = hand_made_log()
    for router in SPLIT_ROUTERS:
        _, fleet, _ = sequential(CACHES["vllm unbounded"], router, 3, log)
        assert len(set(fleet.routes)) == (2 if router == "prefix" else 3), router
    unbounded = sequential(CACHES["vllm unbounded"], "round-robin", 3, log)[1]
    assert unbounded.lost_to_routing > 0
    for bounded, whole in [
        ("vllm 18 blocks", lambda: VllmPrefixCache(block_size=4)),
        ("sglang 80 tokens", lambda: SglangRadixCache(page_size=1)),
        ("hybrid 34 blocks", lambda: HybridPrefixCache(Layout((Group(SLIDING, 8), Group(FULL)), 4))),
    ]:
        hits = [sum(f.hits for f in sequential(make, "session", 3, log)[1].replicas) for make in (CACHES[bounded], whole)]
        assert hits[0] < hits[1], bounded
    session = sequential(CACHES["vllm 18 blocks"], "session", 3, log)[1]
    assert session.lost_to_routing > 0  # the other system prompt's sessions: the shared blocks sat elsewhere


@pytest.mark.parametrize("router", SPLIT_ROUTERS)
def test_a_request_that_does_not_fit_stops_the_merge_where_the_fleet_stops(router):
    log = hand_made_log()
    make = lambda: VllmPrefixCache(block_size=4, num_blocks=9)  # noqa: E731 - one line per cache, as CACHES
    expected, _, expected_error = sequential(make, router, 3, log)
    merged, _, error = split(make, router, 3, log, [(0,), (1, 2)])
    assert expected_error is not None and "pool holds 8" in expected_error[1]
    assert (merged, error) == (expected, expected_error)


def test_the_kv_router_reads_the_caches_so_its_fleet_is_not_split():
    with pytest.raises(CacheError, match="cannot be simulated apart"):
        run_replicas({0: VllmPrefixCache(4)}, make_router("kv", 2, 4), iter(hand_made_log()))
    settings = CacheSettings("vllm", 4, replicas=4, router="kv")
    assert pool_tasks(settings, [None, 40], 2) == [PoolTask(0, None), PoolTask(1, 40)]
    assert pool_tasks(CacheSettings("vllm", 4), [None], 2) == [PoolTask(0, None)]  # one replica: one simulation
    assert pool_tasks(CacheSettings("vllm", 4, replicas=3, router="session"), [None], 2) == [
        PoolTask(0, None, (0, 2)),
        PoolTask(0, None, (1,)),
    ]


@pytest.mark.parametrize("cache", list(CACHES))
def test_a_lookup_changes_no_later_figure(cache):
    """The lost-to-routing lookups touch nothing: a pool looked up at every other request's
    prompt (each before it is served, and a stranger's as well) serves every request as a
    pool never looked up, in a bounded pool that evicts by recency too."""
    log = [request for request, _ in hand_made_log()]
    plain, looked = CACHES[cache](), CACHES[cache]()
    held = 0
    for number, request in enumerate(log):
        for other in log[max(0, number - 6) : number + 6]:
            held += cached_prefix(looked, other) + held_elsewhere([looked], other) + cached_prefix(looked, other, cap=False)
        assert looked.serve(request) == plain.serve(request), number
    assert held > 0  # the lookups found something: they could have moved it


@pytest.mark.parametrize("cap", [True, False])
def test_a_lookup_without_the_hashes_is_the_lookup_with_them(cap):
    pools = [VllmPrefixCache(block_size=4), VllmPrefixCache(block_size=4, num_blocks=20)]
    for request, _ in hand_made_log():
        for pool in pools:
            hashes = block_hashes(request.prompt, 4, request.salt)
            assert cached_prefix(pool, request, None, cap) == cached_prefix(pool, request, hashes, cap)
        assert held_elsewhere(pools, request) == max(cached_prefix(pool, request) for pool in pools)
        pools[0].serve(request)
        pools[1].serve(request)


def test_a_session_s_chain_reuses_what_its_previous_prompt_shares_and_no_more():
    """The lookups' memo of each session's hashes: read in part or whole, through a
    rewritten history, a shorter hint, a salt that changes, and a session finished and begun
    again, each prompt's chain is the one hashed from scratch."""
    chains = SessionChains(4)
    rng = random.Random(1)
    log = [request for request, _ in hand_made_log()]
    log.append(replace(log[-1], salt="tenant-b"))  # the same prompt, another salt: no block is the same
    for number, request in enumerate(log):
        chain = chains.chain(request)
        read = list(itertools.islice(chain, rng.randrange(0, 16)))  # a lookup stops where no replica holds a block
        expected = block_hashes(request.prompt, 4, request.salt)
        assert read == expected[: len(read)], number
        if number % 3 == 0 or number == len(log) - 1:
            assert read + list(chain) == expected, number
        if number == 10:
            chains.finish(request.session)


# --- through replay: every byte of the reports ---------------------------------------------


def reports(summary, problems) -> bytes:
    results = [("template", summary)]
    page = html_report(results, "log.jsonl", "")
    return (
        json.dumps({"summary": summary.to_json(), "problems": problems}, sort_keys=True).encode()
        + (text_report(results) + page).encode()
    )


@pytest.mark.parametrize(
    "settings",
    [
        CacheSettings("vllm", 4, replicas=4, router="session"),
        CacheSettings("vllm", 4, replicas=4, router="round-robin"),
        CacheSettings("vllm", 4, replicas=3, router="prefix"),
        CacheSettings("vllm", 4, replicas=3, router="kv"),
        CacheSettings("sglang", 1, replicas=2, router="round-robin"),
    ],
    ids=lambda settings: f"{settings.model}-{settings.replicas}-{settings.router}",
)
def test_replay_with_jobs_splits_the_fleet_and_equals_the_one_process_run_byte_for_byte(tmp_path, settings):
    log = tmp_path / "log.jsonl"
    write_log(log, count=14)
    text, special = read_template(CORPUS / "PC001_clock_per_minute.jinja")
    # unbounded; 200 blocks (1,000 tokens) a replica evict; 30 (60) cannot hold a request
    capacities = [None, 200, 30] if settings.model == "vllm" else [None, 1000, 60]
    with read_log(log, "user") as opened:
        groups = sessions(opened, "user")
        one = replay(Tracer(text, None, special, "vllm"), opened, groups, settings, capacities, 1)
        two = replay(Tracer(text, None, special, "vllm"), opened, groups, settings, capacities, 2)
    assert reports(*two) == reports(*one)
    summary = one[0]
    assert [point.error is not None for point in summary.sweep] == [False, False, True]
    assert summary.sweep[1].tokens["capacity"] > 0  # the middle capacity evicts
    if settings.router == "round-robin":
        assert summary.fleet.lost_to_routing > 0
