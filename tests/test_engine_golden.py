"""Every request vLLM 0.33.0's own render server rendered (../shared/engine-golden/
vllm-0.33.0.jsonl) through the offline vLLM profile: the same token ids, or a refusal where
vLLM refused. The server is the truth; nothing here is tmpl-lint's own output."""

from __future__ import annotations

import json
from functools import cache

import pytest
from helpers import SHARED, SHARED_TOKENIZERS, shared_tokenizer

from tmpl_lint.diff import read_template
from tmpl_lint.engines import resolve_engine
from tmpl_lint.offline import Rendered, render_request

GOLDEN = SHARED / "engine-golden" / "vllm-0.33.0.jsonl"
needs_golden = pytest.mark.skipif(not GOLDEN.is_file(), reason="../shared is not present (fresh clone)")

# The day the golden server ran: vLLM stamps its clock's date into every gpt-oss system
# message, and VLLM_SYSTEM_START_DATE is vLLM's own setting that pins it.
SERVER_DATE = "2026-12-07"


def _lines() -> list[dict]:
    if not GOLDEN.is_file():
        return []
    return [json.loads(line) for line in GOLDEN.read_text(encoding="utf-8").splitlines() if line.strip()]


LINES = _lines()


@cache
def _template(name: str) -> tuple[str, dict]:
    return read_template(SHARED_TOKENIZERS / name)


def _vllm_message(error: dict) -> str:
    """The message of vLLM's error body (JSON, possibly cut short)."""
    try:
        return json.loads(error["body"])["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return error["body"]


@needs_golden
def test_the_golden_file_holds_154_requests():
    assert len(LINES) == 154


@needs_golden
@pytest.mark.parametrize("line", LINES, ids=[f"{line['tokenizer']}:{line['case']}" for line in LINES])
def test_vllm_profile_equals_vllm_render_server(line, monkeypatch):
    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", SERVER_DATE)
    text, special = _template(line["tokenizer"])
    tokenizer = shared_tokenizer(line["tokenizer"])
    # gpt-oss's folder has no config.json: its template's harmony markup says gpt-oss
    engine = resolve_engine("vllm", text, None)
    outcome = render_request(engine, text, line["request"], special, tokenizer)
    if "error" in line:
        assert line["error"]["status"] == 400
        assert isinstance(outcome, str), f"vLLM refused {line['case']}; the profile rendered it"
        assert "\n" not in outcome
        assert outcome.startswith("vLLM 0.33.0 answers 400: ")
        assert _vllm_message(line["error"]) in outcome
    else:
        assert isinstance(outcome, Rendered), f"vLLM rendered {line['case']}; the profile refused: {outcome}"
        assert outcome.engine == "vLLM 0.33.0"
        assert outcome.token_ids == line["token_ids"]
