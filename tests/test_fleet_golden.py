"""Replay of ../shared/engine-golden/replay/agents.jsonl against what vLLM 0.33.0's own code
did with it on fleets of replicas (expected-replicas.json: one KVCacheManager per replica)
and on hybrid models (expected-hybrid.json: HybridKVCacheCoordinator over one pool):
the same hit, request by request, unbounded and at the capacities that evict.

No --engine flag: the cache model implies vLLM, which renders these prompts as the truth
files' note says they were."""

from __future__ import annotations

import json

import pytest
from helpers import SHARED, SHARED_TOKENIZERS

from tmpl_lint.commands import ReplayOptions, run_replay
from tmpl_lint.kv_cache.hybrid import groups_from_golden, layout_from_model_config

REPLAY = SHARED / "engine-golden" / "replay"
needs_golden = pytest.mark.skipif(
    not (REPLAY / "expected-replicas.json").is_file(), reason="../shared is not present (fresh clone)"
)


def _truth(name: str) -> dict:
    path = REPLAY / name
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


REPLICAS = _truth("expected-replicas.json")
HYBRID = _truth("expected-hybrid.json")


def _replay(tmp_path, cache_blocks: list[int | None], jobs: int = 1, **options) -> dict[int | None, object]:
    """The summary of each capacity, from one run: unbounded alone, the others as a sweep.
    ``jobs`` 2: a fleet's replicas are simulated in two processes and merged."""
    out = {}
    for group in ([None], [size for size in cache_blocks if size is not None]):
        if not group or (group == [None] and None not in cache_blocks):
            continue
        result = run_replay(
            ReplayOptions(
                REPLAY / "agents.jsonl",
                None,
                tokenizer=SHARED_TOKENIZERS / "qwen3",
                session_key="user",
                cache_blocks=None if group == [None] else ",".join(map(str, group)),
                jobs=jobs,
                **options,
            )
        )
        assert result.problems == []
        summary = result.summaries[0][1]
        for point in summary.sweep or [summary]:
            out[point.capacity_blocks] = point
    return out


def _fleet_setups() -> list[tuple[int, str]]:
    return sorted({(fleet["replicas"], fleet["routing"]) for fleet in REPLICAS.get("fleets", [])})


@needs_golden
@pytest.mark.parametrize("jobs", [1, 2], ids=["one process", "replicas apart"])
@pytest.mark.parametrize("replicas, routing", _fleet_setups() or [(0, "")])
def test_each_replica_hits_what_vllm_s_own_manager_hit_request_by_request(tmp_path, replicas, routing, jobs):
    fleets = [fleet for fleet in REPLICAS["fleets"] if (fleet["replicas"], fleet["routing"]) == (replicas, routing)]
    summaries = _replay(tmp_path, [fleet["cache_blocks"] for fleet in fleets], jobs, replicas=replicas, router=routing)
    for fleet in fleets:
        summary = summaries[fleet["cache_blocks"]]
        rows = [[line, replica, prompt, hit] for (line, prompt, hit), replica in zip(summary.per_request, summary.fleet.routes)]
        assert rows == fleet["per_request"], fleet["capacity"]
        assert (summary.queries, summary.hits) == (fleet["queried_tokens"], fleet["hit_tokens"])
        for figures, expected in zip(summary.fleet.replicas, fleet["per_replica"], strict=True):
            sessions = sorted(summary.per_session[session].key for session in figures.sessions)
            assert (figures.requests, sessions, figures.queries, figures.hits) == (
                expected["requests"],
                sorted(expected["sessions"]),
                expected["queried_tokens"],
                expected["hit_tokens"],
            )


@needs_golden
def test_one_replica_is_the_single_pool(tmp_path):
    summaries = _replay(tmp_path, [None, 1404, 702])
    for run in REPLICAS["single_replica"]:
        summary = summaries[run["cache_blocks"]]
        assert summary.fleet is None
        assert (summary.queries, summary.hits) == (run["queried_tokens"], run["hit_tokens"])


def _hybrid_models() -> list[str]:
    return list(HYBRID.get("models", {})) + (["full_attention"] if HYBRID else [])


def _model_config(name: str) -> dict:
    """The model's own config.json, as a user would give it, for each golden layout."""
    if name == "gpt-oss":
        return {"layer_types": ["sliding_attention", "full_attention"] * 12, "sliding_window": 128}
    if name.startswith("mamba2-hybrid"):
        return {"hybrid_override_pattern": "MMM*" * 12}
    return {"num_hidden_layers": 28}


@needs_golden
@pytest.mark.parametrize("name", _hybrid_models() or ["none"])
def test_a_hybrid_model_hits_what_vllm_s_coordinator_hit_request_by_request(tmp_path, name):
    model = HYBRID["full_attention"] if name == "full_attention" else HYBRID["models"][name]
    block_size = model["kv_cache_config"]["scheduler_block_size"]
    # The config.json a user gives gives the groups vLLM built.
    assert layout_from_model_config(_model_config(name), block_size).groups == groups_from_golden(model["kv_cache_config"]).groups
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_model_config(name)), encoding="utf-8")
    summaries = _replay(tmp_path, [run["cache_blocks"] for run in model["runs"]], model_config=config, block_size=block_size)
    for run in model["runs"]:
        summary = summaries[run["cache_blocks"]]
        assert [list(row) for row in summary.per_request] == run["per_request"], run["capacity"]
        assert (summary.queries, summary.hits) == (run["queried_tokens"], run["hit_tokens"])
