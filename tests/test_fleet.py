"""Fleets of replicas behind routers, and hybrid models' KV-cache groups, on a few
requests in blocks of 4 tokens: every figure below is worked out by hand in the comments."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import two_requests_sharing_37_characters

from tmpl_lint.cli import main
from tmpl_lint.kv_cache.fleet import Fleet, make_router
from tmpl_lint.kv_cache.hybrid import FULL, MAMBA, SLIDING, Group, HybridPrefixCache, Layout, layout_from_model_config
from tmpl_lint.kv_cache.pools import CacheError, CacheRequest, VllmPrefixCache

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
    served = cache.serve(CacheRequest("a", prompt_b))
    assert (served.hit, served.layers) == (16, 4)  # full attention alone: 20
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
        ({"sliding_window": 4096}, [(SLIDING, 4096)]),  # Mistral 7B v0.1: every layer
        ({"sliding_window": 4096, "use_sliding_window": False}, [(FULL, None)]),  # Qwen2, Qwen3
    ],
)
def test_the_model_config_gives_vllm_s_groups(config, groups):
    layout = layout_from_model_config(config, 16)
    assert [(group.kind, group.sliding_window) for group in layout.groups] == groups


def test_sliding_layers_without_a_window_are_an_error():
    with pytest.raises(CacheError, match="sliding_window"):
        layout_from_model_config({"layer_types": ["sliding_attention", "full_attention"]}, 16)


# --- through the command: characters as tokens (a template that prints each message) -------


def replay_json(*args):
    result = CliRunner().invoke(main, ["replay", *map(str, args), "--session-key", "user", "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["template"]


CAUSES_ZERO = dict.fromkeys(
    ["hit", "shared-hit", "cold", "partial-block", "template", "client", "capacity", "routing", "layers"], 0
)


def test_the_second_request_on_the_other_replica_loses_the_shared_blocks_to_routing(tmp_path):
    # blocks of 16: request 1 -> replica 0, request 2 -> replica 1, which holds nothing; replica 0
    # held the 2 full blocks of the 37 shared characters: 32 lost to routing, not to capacity
    template, log = two_requests_sharing_37_characters(tmp_path)
    report = replay_json(log, "--template", template, "--replicas", "2", "--router", "round-robin")
    assert (report["prefix_cache_queries"], report["prefix_cache_hits"]) == (114, 0)
    assert report["tokens_by_cause"] == CAUSES_ZERO | {"cold": 57, "partial-block": 9, "client": 16, "routing": 32}
    fleet = report["fleet"]
    assert (fleet["replicas"], fleet["router"], fleet["lost_to_routing"], fleet["imbalance"]) == (2, "round-robin", 32, 1.0)
    assert [(r["requests"], r["prefix_cache_queries"], r["prefix_cache_hits"]) for r in fleet["per_replica"]] == [
        (1, 57, 0),
        (1, 57, 0),
    ]
    # by session: both on replica 0, the 32 hit
    report = replay_json(log, "--template", template, "--replicas", "2", "--router", "session")
    assert (report["prefix_cache_hits"], report["fleet"]["lost_to_routing"], report["fleet"]["imbalance"]) == (32, 0, 2.0)


def test_a_sliding_window_model_keeps_no_window_where_the_requests_part(tmp_path):
    # blocks of 4, window 8: full attention holds the 36 shared characters (9 blocks); the
    # window layers cached only the 2 blocks before request 1's replay boundary (56), so
    # request 2 hits nothing: 36 characters lost to the layers, not to capacity
    template, log = two_requests_sharing_37_characters(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}))
    report = replay_json(log, "--template", template, "--block-size", "4", "--model-config", config)
    assert (report["prefix_cache_queries"], report["prefix_cache_hits"]) == (114, 0)
    assert report["tokens_by_cause"] == CAUSES_ZERO | {"cold": 57, "partial-block": 1, "client": 20, "layers": 36}
    assert report["kv_cache_groups"] == "sliding window 8, full attention"
    # the same without the config: full attention alone hits the 36
    assert replay_json(log, "--template", template, "--block-size", "4")["prefix_cache_hits"] == 36


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--cache-model", "sglang"], "modelled for vLLM only"),
        (["--kv-cache-gib", "1"], "give --cache-blocks"),
        (["--router", "kv"], "--router chooses between replicas: it needs --replicas N"),
    ],
)
def test_a_hybrid_model_with_another_engine_or_a_memory_size_is_a_usage_error(tmp_path, flags, message):
    template, log = two_requests_sharing_37_characters(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hybrid_override_pattern": "MM*"}))
    result = CliRunner().invoke(main, ["replay", str(log), "--template", str(template), "--model-config", str(config), *flags])
    assert result.exit_code == 2
    assert message in result.stderr


def test_a_fleet_of_hybrid_replicas_counts_what_another_replica_held():
    fleet = Fleet([HybridPrefixCache(SLIDING_LAYOUT) for _ in range(2)], make_router("round-robin", 2, 4))
    fleet.serve(CacheRequest("a", PROMPT_A, REPLY_A))
    served = fleet.serve(CacheRequest("a", PROMPT_A + REPLY_A + [300, 301, 302]))
    # replica 1 holds nothing; replica 0 would have served 16 (the window blocks 2-3)
    assert (served.hit, served.elsewhere) == (0, 16)
