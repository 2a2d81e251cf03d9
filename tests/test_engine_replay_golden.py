"""Replay of ../shared/engine-golden/replay/agents.jsonl against what vLLM 0.33.0's own
KVCacheManager and SGLang 0.5.23's own RadixCache did with the same log (expected.json):
the same hit, request by request, unbounded and at two capacities that evict. No --engine
flag: the cache model implies the engine."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import SHARED, SHARED_TOKENIZERS, needs_shared

from tmpl_lint.cli import main
from tmpl_lint.commands import ReplayOptions, run_replay

REPLAY = SHARED / "engine-golden" / "replay"
needs_golden = pytest.mark.skipif(not (REPLAY / "expected.json").is_file(), reason="../shared is not present (fresh clone)")


def _runs() -> list[tuple[str, dict]]:
    if not (REPLAY / "expected.json").is_file():
        return []
    expected = json.loads((REPLAY / "expected.json").read_text(encoding="utf-8"))
    return [(engine, run) for engine in ("vllm", "sglang") for run in expected[engine]["runs"]]


RUNS = _runs()


def _blocks(run: dict) -> int | None:
    return run["cache_blocks"] if "cache_blocks" in run else run["cache_blocks_flag"]


@needs_shared
@needs_golden
@pytest.mark.parametrize("engine, run", RUNS, ids=[f"{engine}-{_blocks(run) or 'unbounded'}" for engine, run in RUNS])
def test_replay_hits_what_the_engines_own_cache_hit_request_by_request(engine, run):
    blocks = _blocks(run)
    options = ReplayOptions(
        REPLAY / "agents.jsonl",
        None,
        tokenizer=SHARED_TOKENIZERS / "qwen3",
        session_key="user",
        cache_model="sglang" if engine == "sglang" else None,  # vLLM: no flag at all
        cache_blocks=str(blocks) if blocks else None,
        jobs=1,
    )
    result = run_replay(options)
    assert result.problems == []
    summary = result.summaries[0][1]
    # rows: [log line, prompt tokens, hit tokens]; SGLang's also name the session
    expected = [(row[0], row[-2], row[-1]) for row in run["per_request"]]
    assert sorted(summary.per_request) == expected
    assert (summary.queries, summary.hits) == (run["queried_tokens"], run["hit_tokens"])


@needs_shared
@needs_golden
@pytest.mark.parametrize("flags, engine", [((), "vllm"), (("--cache-model", "sglang"), "sglang")])
def test_the_command_without_an_engine_flag_reports_the_engines_figure(flags, engine):
    args = ["replay", str(REPLAY / "agents.jsonl"), "--tokenizer", str(SHARED_TOKENIZERS / "qwen3")]
    result = CliRunner().invoke(main, [*args, "--session-key", "user", "--jobs", "1", *flags, "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["template"]
    unbounded = next(run for name, run in RUNS if name == engine and _blocks(run) is None)
    assert (report["prefix_cache_queries"], report["prefix_cache_hits"]) == (unbounded["queried_tokens"], unbounded["hit_tokens"])
