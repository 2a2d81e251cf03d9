"""Why a hosted API did not serve what a session had sent before, worked by hand from each
provider's published rules (kv_cache.hosted cites the pages): expired by the TTL, under
the minimum, past the last whole step or unit, the previous reply (prompts only are
cached), or no cache_control breakpoint after it. None of it is eviction (capacity).
Token ids are made up: only where two prompts part matters."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import CORPUS

from tmpl_lint.cli import main
from tmpl_lint.kv_cache.hosted import Breakpoint, Miss, TimedRequest, make_hosted_cache


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def served(cache, session, prompt, time, **extra):
    result = cache.serve(TimedRequest(session, prompt, time=time, **extra))
    return result.hit, result.misses


def test_openai_partial_step_reply_expiry_and_minimum():
    cache = make_hosted_cache("openai")  # 1,024 minimum, steps of 128, 300 s
    first, reply = tokens(0, 1100), tokens(5000, 101)  # the reply's last token is never computed: 100
    # A session's first request: nothing of it was sent before.
    assert served(cache, "a", first, 0, generated=reply) == (0, ())
    # 60 s on, the prompt sends it all back and 200 more: 1,400 tokens. Step 1024 was written
    # (1152 > 1100 was not): hit 1024. Tokens 1024-1099 lie past the last whole step of the
    # previous prompt, 1100-1199 are the reply, which OpenAI never cached.
    second = first + reply[:100] + tokens(9000, 200)
    assert served(cache, "a", second, 60) == (1024, ((Miss.PARTIAL, 76), (Miss.REPLY, 100)))
    # 301 s after steps 1024, 1152 and 1280 were written: expired, all 1,280 of them; then
    # 1280-1399, past the last whole step (the second request generated nothing logged).
    third = second + tokens(9500, 100)
    assert served(cache, "a", third, 361) == (0, ((Miss.EXPIRED, 1280), (Miss.PARTIAL, 120)))
    # A prompt under 1,024 is never cached; the next one shares only those 1,000.
    assert served(cache, "b", tokens(20000, 1000), 362) == (0, ())
    assert served(cache, "b", tokens(20000, 1000) + tokens(7000, 300), 363) == (0, ((Miss.MINIMUM, 1000),))


def test_openai_keeps_the_chain_of_a_prompt_under_the_minimum():
    # s sends 1,500 x's, then 900 y's (under the minimum), then the 900 y's and 300 z's with
    # the hint that it shares 900 with the previous prompt. Those 1,200 write steps 1024 and
    # 1152 under their own keys, so t sending the same prompt hits 1152 that s computed.
    cache = make_hosted_cache("openai")
    served(cache, "s", [1] * 1500, 0)
    served(cache, "s", [2] * 900, 1, shared=0)
    served(cache, "s", [2] * 900 + [3] * 300, 2, shared=900)
    result = cache.serve(TimedRequest("t", [2] * 900 + [3] * 300, time=3))
    assert (result.hit, result.shared) == (1152, 1152)


def test_anthropic_unmarked_minimum_expired_and_reply():
    cache = make_hosted_cache("anthropic", minimum=1024)
    prompt = tokens(0, 2000)
    # A breakpoint at 800, under the minimum: not written.
    assert served(cache, "a", prompt, 0, breakpoints=(Breakpoint(800),)) == (0, ())
    # Nothing was cached at any mark of the previous prompt: its 2,000 shared tokens are unmarked.
    second = prompt + tokens(5000, 100)
    assert served(cache, "a", second, 10, breakpoints=(Breakpoint(2000),)) == (0, ((Miss.UNMARKED, 2000),))
    # 390 s later the 5-minute entry at 2000 has expired; 2000-2099 had no mark.
    third = second + tokens(6000, 50)
    assert served(cache, "a", third, 400, breakpoints=(Breakpoint(2100),), block_ends=(2000,)) == (
        0,
        ((Miss.EXPIRED, 2000), (Miss.UNMARKED, 100)),
    )
    # Sharing 900 tokens, under the minimum: no mark could have cached them.
    short = tokens(30000, 900)
    served(cache, "b", short, 401, breakpoints=(Breakpoint(900),))
    assert served(cache, "b", short + tokens(31000, 50), 402, breakpoints=(Breakpoint(950),)) == (0, ((Miss.MINIMUM, 900),))
    # No breakpoint at all: nothing read; the previous reply (20 computed tokens) never cached.
    first = tokens(40000, 1500)
    served(cache, "c", first, 403, generated=tokens(41000, 21))
    assert served(cache, "c", first + tokens(41000, 20) + tokens(42000, 30), 404) == (
        0,
        ((Miss.UNMARKED, 1500), (Miss.REPLY, 20)),
    )


def test_gemini_reply_expiry_and_minimum():
    cache = make_hosted_cache("gemini", model="gemini-2.5-flash", ttl=100)  # 2,048
    first = tokens(0, 3000)
    served(cache, "a", first, 0, generated=tokens(9000, 11))
    # Every prefix of the 3,000 is cached: hit 3000; the 10 computed reply tokens are not.
    second = first + tokens(9000, 10) + tokens(9100, 100)
    assert served(cache, "a", second, 50) == (3000, ((Miss.REPLY, 10),))
    # 150 s after the last use, past the 100 s given: every prefix of the 3,110 expired.
    assert served(cache, "a", second + tokens(9200, 100), 200) == (0, ((Miss.EXPIRED, 3110),))
    # Sharing 1,500 with the previous prompt: under the minimum.
    served(cache, "b", tokens(50000, 1500), 201)
    assert served(cache, "b", tokens(50000, 1500) + tokens(51000, 1000), 202) == (0, ((Miss.MINIMUM, 1500),))


def test_deepseek_partial_unit_and_expiry():
    cache = make_hosted_cache("deepseek", ttl=100)
    a, b, reply = tokens(0, 100), tokens(1000, 50), tokens(5000, 20)
    served(cache, "s", a + b, 0, generated=reply)  # units at 150 and 169
    # The reply rendered otherwise from its 10th token: the input unit, 150; the output unit
    # at 169 is not matched whole (tokens 150-168 of the session's own).
    assert served(cache, "s", a + b + reply[:10] + tokens(7000, 9), 10) == (150, ((Miss.PARTIAL, 19),))
    # 490 s later every unit has expired: the longest it holds ends at 169 (the second prompt's).
    assert served(cache, "s", a + b + reply[:10] + tokens(7000, 9) + tokens(8000, 30), 500) == (0, ((Miss.EXPIRED, 169),))


# --- through replay: every prompt token by cause -----------------------------------------------

START = 1_770_000_000
SYSTEM = "x" * 1100
REPLY = "r" * 150


def write_log(path, system_content, gaps=(60,)):
    """One session: a system prompt and "hi", answered with REPLY; then "more" (and "again")."""
    turns = ["hi", "more", "again"][: len(gaps) + 1]
    times = [START]
    for gap in gaps:
        times.append(times[-1] + gap)
    history = [{"role": "system", "content": system_content}]
    lines = []
    for turn, time in zip(turns, times, strict=True):
        history = history + [{"role": "user", "content": turn}]
        reply = {"role": "assistant", "content": REPLY}
        request = {"user": "u", "messages": history}
        lines.append(json.dumps({"timestamp": time, "request": request, "response": {"choices": [{"message": reply}]}}))
        history = history + [reply]
    path.write_text("\n".join(lines) + "\n")


# ChatML in characters (clean_chatml.jinja): <|im_start|>system\n (19) + 1100 + <|im_end|>\n (11)
# = 1130; <|im_start|>user\nhi<|im_end|>\n (30) and the generation prompt <|im_start|>assistant\n
# (22): the first prompt is 1182. Its reply as generated is REPLY<|im_end|> (160), 159 of them
# computed: the session has 1,341 characters computed. The second prompt adds REPLY<|im_end|>\n
# (161), <|im_start|>user\nmore<|im_end|>\n (32) and 22: 1397, sending back all 1,341.
FIRST, SECOND, COMPUTED = 1182, 1397, 1182 + 159


def causes(log, *flags):
    result = CliRunner().invoke(
        main,
        ["replay", str(log), "--template", str(CORPUS / "clean_chatml.jinja"), "--session-key", "user", "--format", "json"]
        + list(flags),
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["template"]
    assert report["prefix_cache_queries"] == FIRST + SECOND
    assert sum(report["tokens_by_cause"].values()) == FIRST + SECOND
    return {cause: count for cause, count in report["tokens_by_cause"].items() if count}, report


def test_openai_through_replay(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log, SYSTEM)
    # The first prompt writes steps 1024 and 1152; the second (1,397) hits 1152. The session
    # sent 1,341 before, and in whole steps of 128 up to 1280 (the 61 past it are a partial
    # step): 1152-1181 past the previous prompt's last whole step, 1182-1279 its reply.
    found, report = causes(log, "--cache-model", "openai")
    assert found == {"hit": 1152, "cold": FIRST + SECOND - COMPUTED, "partial-block": 30 + 61, "reply": 98}
    # None of it is avoidable but the template's and the client's (none here).
    assert report["ideal_hit_rate"] == pytest.approx(report["prefix_cache_hit_rate"]) == 1152 / (FIRST + SECOND)


def test_gemini_through_replay(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log, SYSTEM)
    # Both prompts are under gemini-2.5-flash's minimum of 2,048: all 1,341 sent before.
    found, _ = causes(log, "--cache-model", "gemini", "--api-model", "gemini-2.5-flash")
    assert found == {"cold": FIRST + SECOND - COMPUTED, "minimum": COMPUTED}


def test_anthropic_through_replay(tmp_path):
    log = tmp_path / "log.jsonl"
    marked = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    write_log(log, marked)
    # The mark ends the system message at 1130: written, then hit 60 s on. 1130-1181 had no
    # mark; 1182-1340 are the reply.
    found, report = causes(log, "--cache-model", "anthropic", "--api-model", "claude-sonnet-4-5")
    assert found == {"hit": 1130, "cold": FIRST + SECOND - COMPUTED, "unmarked": 52, "reply": 159}
    # Unmarked tokens are the client's to mark: the ideal counts them as hits.
    assert report["ideal_hit_rate"] == pytest.approx((1130 + 52) / (FIRST + SECOND))
    # 301 s on, past the 5 minutes: the 1,130 expired.
    write_log(log, marked, gaps=(301,))
    found, report = causes(log, "--cache-model", "anthropic", "--api-model", "claude-sonnet-4-5")
    assert found == {"cold": FIRST + SECOND - COMPUTED, "expired": 1130, "unmarked": 52, "reply": 159}
    assert report["lost_tokens"] == 1130 + 52
    assert [cause["cause"] for cause in report["causes"]] == []  # no eviction, no template, no client


def test_deepseek_through_replay(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log, SYSTEM, gaps=(60,))
    # The output unit ends at 1,341, which the second prompt holds whole: nothing lost.
    found, _ = causes(log, "--cache-model", "deepseek")
    assert found == {"hit": COMPUTED, "cold": FIRST + SECOND - COMPUTED}
    # Kept 30 s: expired at the second request.
    found, _ = causes(log, "--cache-model", "deepseek", "--cache-ttl", "30")
    assert found == {"cold": FIRST + SECOND - COMPUTED, "expired": COMPUTED}


def test_the_text_report_lists_only_the_provider_s_causes(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log, SYSTEM)
    args = ["replay", str(log), "--template", str(CORPUS / "clean_chatml.jinja"), "--session-key", "user"]
    out = CliRunner().invoke(main, [*args, "--cache-model", "openai"]).stdout
    listed = [line.split()[0] for line in out.split("by cause:\n")[1].splitlines() if line.startswith("    ")]
    assert listed == ["hit", "shared-hit", "cold", "partial-block", "template", "client", "expired", "minimum", "reply"]
    assert "  ideal, nothing lost to template, client or expired: " in out
    assert "    reply                    98   3.8%  the previous reply: the API caches what prompts sent" in out
    # An engine's report is as it was: no hosted causes, in the text or the JSON.
    out = CliRunner().invoke(main, args).stdout
    assert "  ideal, nothing lost to template, client or capacity: " in out
    assert "expired" not in out and "unmarked" not in out
    report = json.loads(CliRunner().invoke(main, [*args, "--format", "json"]).stdout)["template"]
    assert list(report["tokens_by_cause"]) == [
        "hit", "shared-hit", "cold", "partial-block", "template", "client", "capacity", "routing", "layers"
    ]  # fmt: skip
