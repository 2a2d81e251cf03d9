"""Fleets of replicas behind routers, and hybrid models' KV-cache groups, on a few
requests in blocks of 4 tokens: every figure below is worked out by hand in the comments."""

from __future__ import annotations

import pytest

from tmpl_lint.fleet import Fleet, make_router
from tmpl_lint.hybrid import FULL, MAMBA, SLIDING, Group, HybridPrefixCache, Layout, layout_from_model_config
from tmpl_lint.kv_cache import CacheError, CacheRequest, VllmPrefixCache

SYSTEM = list(range(1, 9))  # two blocks of 4 every session shares


def interleaved():
    # a, b, a, b: each follow-up extends its session's first prompt past a partial block
    return [
        CacheRequest("a", SYSTEM + [10, 11, 12]),
        CacheRequest("b", SYSTEM + [20, 21, 22]),
        CacheRequest("a", SYSTEM + [10, 11, 12, 13, 14, 15, 16]),
        CacheRequest("b", SYSTEM + [20, 21, 22, 23, 24, 25, 26]),
    ]


def run(router, requests, replicas=2):
    fleet = Fleet([VllmPrefixCache(block_size=4) for _ in range(replicas)], make_router(router, replicas, 4))
    hits = [fleet.serve(request).hit for request in requests]
    return fleet, hits


def test_round_robin_splits_the_shared_prompt_and_counts_what_the_other_replica_held():
    fleet, hits = run("round-robin", interleaved())
    # 0 -> r0 (cold), 1 -> r1 (cold: the system prompt sits on r0), 2 -> r0 and 3 -> r1 hit the
    # two system blocks (their third block was partial when first sent: never cached)
    assert fleet.routes == [0, 1, 0, 1]
    assert hits == [0, 0, 8, 8]
    assert fleet.lost_to_routing == 8  # request 1: r0 held the 8 system tokens
    assert [(r.requests, r.queries, r.hits, r.lost_to_routing) for r in fleet.replicas] == [(2, 26, 8, 0), (2, 26, 8, 8)]
    assert fleet.imbalance == 1.0


def test_session_affinity_pins_a_session_where_its_first_request_arrived():
    requests = interleaved()
    requests = [requests[0], requests[2], requests[1], requests[3]]  # a, a, b, b
    fleet, hits = run("session", requests)
    # a's first request is the 0th (replica 0), b's the 2nd: 2 mod 2 = replica 0 as well
    assert fleet.routes == [0, 0, 0, 0]
    assert hits == [0, 8, 8, 8]
    assert fleet.imbalance == 2.0  # all the prompt tokens on one of two replicas: twice the mean
    assert [len(r.sessions) for r in fleet.replicas] == [2, 0]


@pytest.mark.parametrize("router", ["prefix", "kv"])
def test_prefix_aware_routers_follow_the_cached_system_prompt(router):
    fleet, hits = run(router, interleaved())
    # request 0: nothing cached anywhere, a tie, replica 0; then every request shares its
    # first two blocks with replica 0 and no other
    assert fleet.routes == [0, 0, 0, 0]
    assert hits == [0, 8, 8, 8]
    assert fleet.lost_to_routing == 0


@pytest.mark.parametrize("router", ["prefix", "kv"])
def test_a_tie_goes_to_the_replica_with_fewer_requests(router):
    fleet, _ = run(router, [CacheRequest("a", [1, 2, 3, 4, 5]), CacheRequest("b", [9, 9, 9, 9, 9])])
    assert fleet.routes == [0, 1]


def test_one_replica_is_the_pool_itself():
    requests = interleaved()
    pool = VllmPrefixCache(block_size=4, num_blocks=6)
    fleet = Fleet([VllmPrefixCache(block_size=4, num_blocks=6)], make_router("round-robin", 1, 4))
    assert [fleet.serve(r) for r in requests] == [pool.serve(r) for r in requests]
    assert fleet.lost_to_routing == 0


def test_an_unknown_router_is_an_error():
    with pytest.raises(CacheError, match="unknown router"):
        make_router("random", 2, 4)


# --- hybrid models: block 4, sliding window 8 (a hit needs cdiv(8 - 1, 4) = 2 blocks) ------

SLIDING_LAYOUT = Layout((Group(SLIDING, 8), Group(FULL)), 4)
PROMPT_A = list(range(100, 117))  # 17 tokens
REPLY_A = [200, 201, 202, 203, 204]


def test_a_sliding_window_hit_stops_at_the_previous_prompt_and_the_junction_serves_the_next_session():
    cache = HybridPrefixCache(SLIDING_LAYOUT)
    # A computes 17 + 4 tokens: full attention caches blocks 0-4; the window group only the
    # two blocks before A's replay boundary 16 (blocks 2, 3), nothing of the reply
    assert cache.serve(CacheRequest("a", PROMPT_A, REPLY_A)).hit == 0
    # B sends A's prompt and reply: full attention holds 20 tokens, but block 4 of the window
    # group (A's reply) was never cached: the window hit is blocks 2-3, 16 tokens
    prompt_b = PROMPT_A + REPLY_A + [300, 301, 302]
    assert cache.serve(CacheRequest("a", prompt_b)).hit == 16
    assert VllmPrefixCache(block_size=4).serve(CacheRequest("a", PROMPT_A, REPLY_A)).hit == 0
    # B caches its window blocks at its junction (where full attention stopped: 20) too, so
    # another session sending B's first 20 tokens hits all 20 (blocks 3-4 in the window group)
    served = cache.serve(CacheRequest("c", prompt_b[:20] + [400, 401, 402]))
    assert (served.hit, served.shared) == (20, 20)


def test_full_attention_alone_hits_through_the_reply():
    pool = VllmPrefixCache(block_size=4)
    pool.serve(CacheRequest("a", PROMPT_A, REPLY_A))
    assert pool.serve(CacheRequest("a", PROMPT_A + REPLY_A + [300, 301, 302])).hit == 20


def test_a_mamba_group_hits_only_where_a_state_was_kept():
    cache = HybridPrefixCache(Layout((Group(MAMBA), Group(FULL)), 4))
    prompt = list(range(100, 110))  # 10 tokens: replay boundary 8, the state after block 1
    cache.serve(CacheRequest("a", prompt, [200, 201, 202]))
    # full attention holds 12 tokens (prompt and two reply tokens); the Mamba state sits at 8
    assert cache.serve(CacheRequest("a", prompt + [200, 201, 202, 300, 301])).hit == 8


def test_a_bounded_pool_serves_every_group_from_one_pool():
    # 4 blocks (3 usable): a 9-token prompt needs 3 blocks in each of two groups at once
    with pytest.raises(CacheError, match="cannot schedule"):
        HybridPrefixCache(SLIDING_LAYOUT, num_blocks=4).serve(CacheRequest("a", list(range(9))))
    assert HybridPrefixCache(SLIDING_LAYOUT, num_blocks=7).serve(CacheRequest("a", list(range(9)))).hit == 0


@pytest.mark.parametrize(
    "config, groups",
    [
        ({"layer_types": ["sliding_attention", "full_attention"] * 12, "sliding_window": 128}, [(SLIDING, 128), (FULL, None)]),
        ({"hybrid_override_pattern": "MMM*" * 12}, [(MAMBA, None)] * 3 + [(FULL, None)]),
        ({"layer_types": ["linear_attention"] * 3 + ["full_attention"]}, [(MAMBA, None)] * 3 + [(FULL, None)]),
        ({"num_hidden_layers": 28}, [(FULL, None)]),
    ],
)
def test_the_model_config_gives_vllm_s_groups(config, groups):
    layout = layout_from_model_config(config, 16)
    assert [(group.kind, group.sliding_window) for group in layout.groups] == groups


def test_sliding_layers_without_a_window_are_an_error():
    with pytest.raises(CacheError, match="sliding_window"):
        layout_from_model_config({"layer_types": ["sliding_attention", "full_attention"]}, 16)
