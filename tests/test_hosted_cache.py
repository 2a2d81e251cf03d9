"""The hosted-API cache models against hit counts worked by hand from each provider's
published rules (hosted_cache's docstring cites the pages). Token ids are made up: only
where two prompts part matters."""

from __future__ import annotations

import pytest

from tmpl_lint.kv_cache.hosted import (
    Breakpoint,
    Mark,
    TimedRequest,
    breakpoints_of,
    cache_control_marks,
    make_hosted_cache,
)
from tmpl_lint.kv_cache.pools import CacheError


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def served(cache, session, prompt, time, **extra):
    result = cache.serve(TimedRequest(session, prompt, time=time, **extra))
    return result.hit, result.shared


def test_openai_steps_minimum_and_retention():
    cache = make_hosted_cache("openai")  # 5 minutes of inactivity
    base = tokens(0, 1500)
    # 1,300 tokens: nothing cached yet; steps 1024, 1152, 1280 are written.
    assert served(cache, "a", base[:1300], 0) == (0, 0)
    # 1,500 tokens sharing the 1,300: the longest cached step is 1280 (1408 is not cached yet).
    assert served(cache, "a", base, 60) == (1280, 0)
    # 301 s after the last use of every step: all gone.
    assert served(cache, "b", base, 361) == (0, 0)
    # Below 1,024 tokens a prompt is never cached, even one sent before.
    assert served(cache, "b", base[:1000], 362) == (0, 0)
    # Parting at token 1,100 (b's prompt of 361 wrote 1024..1408): the longest step before it is 1024,
    # computed by session b.
    parted = base[:1100] + tokens(90_000, 400)
    assert served(cache, "c", parted, 400) == (1024, 1024)


def test_openai_ttl_is_from_last_use():
    cache = make_hosted_cache("openai", ttl=300)
    prompt = tokens(0, 1100)
    assert served(cache, "a", prompt, 0)[0] == 0
    assert served(cache, "a", prompt, 299)[0] == 1024  # used again: lives to 599
    assert served(cache, "a", prompt, 598)[0] == 1024
    assert served(cache, "a", prompt, 899)[0] == 0  # 301 s since its last use


def test_anthropic_breakpoints_minimum_and_ttls():
    cache = make_hosted_cache("anthropic", model="claude-sonnet-4-5")  # minimum 1,024
    prompt = tokens(0, 3000)
    # Breakpoints at 1000 (under the minimum: not written) and 2000 (1 hour).
    first = (Breakpoint(1000), Breakpoint(2000, 3600))
    assert served(cache, "a", prompt, 0, breakpoints=first) == (0, 0)
    # At 600 s: the breakpoint at 2500 is not cached, but the block end 2000 before it is.
    second = prompt[:2500] + tokens(50_000, 300)
    ends = (500, 1000, 1500, 2000)
    assert served(cache, "b", second, 600, breakpoints=(Breakpoint(2500),), block_ends=ends) == (2000, 2000)
    # At 1000 s: 2500 (5 minutes, written at 600) has expired; 2000 (1 hour, used at 600) has not.
    third = second[:2600] + tokens(60_000, 100)
    assert served(cache, "a", third, 1000, breakpoints=(Breakpoint(2600),), block_ends=(2000, 2500)) == (2000, 0)
    # No breakpoint: the API caches nothing and reads nothing.
    assert served(cache, "a", third, 1001) == (0, 0)


def test_anthropic_lookback_is_twenty_blocks():
    def hit(block_ends, breakpoint):
        cache = make_hosted_cache("anthropic", minimum=1024)
        prompt = tokens(0, 1400)
        served(cache, "a", prompt, 0, breakpoints=(Breakpoint(1100),))
        return served(cache, "a", prompt, 1, breakpoints=(Breakpoint(breakpoint),), block_ends=block_ends)[0]

    # 20 block ends before the breakpoint, 1100 the earliest of them: found.
    assert hit(tuple(range(1100, 1300, 10)), 1300) == 1100
    # 21 of them: 1100 is the 21st back, not checked.
    assert hit(tuple(range(1100, 1310, 10)), 1310) == 0


def test_anthropic_refuses_a_fifth_breakpoint_and_unknown_models():
    cache = make_hosted_cache("anthropic", model="claude-haiku-4-5")
    assert cache.minimum == 4096
    marks = tuple(Breakpoint(position) for position in (10, 20, 30, 40, 50))
    with pytest.raises(CacheError, match="5 cache_control breakpoints"):
        cache.serve(TimedRequest("a", tokens(0, 60), time=0, breakpoints=marks))
    with pytest.raises(CacheError, match="minimum cacheable prompt"):
        make_hosted_cache("anthropic", model="claude-unknown")


def test_gemini_minimum_per_model():
    cache = make_hosted_cache("gemini", model="gemini-2.5-flash")  # 2,048
    prompt = tokens(0, 3000)
    assert served(cache, "a", prompt, 0) == (0, 0)
    # Shares 2,500 tokens: hit at token granularity.
    assert served(cache, "b", prompt[:2500] + tokens(70_000, 300), 10) == (2500, 2500)
    # Shares 2,000: under the minimum, no hit.
    assert served(cache, "b", prompt[:2000] + tokens(80_000, 1000), 20) == (0, 0)
    # A prompt of 2,000 tokens is under the minimum whatever it shares.
    assert served(cache, "a", prompt[:2000], 30) == (0, 0)
    assert make_hosted_cache("gemini", model="gemini-3.1-pro-preview").minimum == 4096


def test_deepseek_whole_units_only():
    cache = make_hosted_cache("deepseek")
    a, b, c, d = tokens(0, 100), tokens(1000, 50), tokens(2000, 60), tokens(3000, 70)
    reply = tokens(5000, 20)
    # Request 1 (A+B, reply of 20): units at 150 (input end) and 169 (output end, last token not computed).
    assert cache.serve(TimedRequest("s1", a + b, reply, time=0)).hit == 0
    # Request 2 (A+C) matches no unit whole (A+B is not its prefix): 0; A, shared with request 1, becomes a unit.
    assert served(cache, "s2", a + c, 1) == (0, 0)
    # Request 3 (A+D) matches the unit A: 100 tokens, persisted from another session's requests.
    assert served(cache, "s3", a + d, 2) == (100, 100)
    # Session 1's next turn carries its reply (19 computed tokens of it) and more: the output unit, 169.
    assert served(cache, "s1", a + b + reply[:19] + tokens(6000, 5), 3) == (169, 0)
    # The same turn with the reply rendered differently from token 10 on: the input unit A+B, 150.
    assert served(cache, "s4", a + b + reply[:10] + tokens(7000, 9), 4) == (150, 150)


def test_cache_control_marks_in_a_logged_request():
    body = {
        "cache_control": {"type": "ephemeral"},
        "tools": [{"name": "read"}, {"name": "write", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "system": [{"type": "text", "text": "You are...", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {}}]},
            {"role": "assistant", "content": "ok"},
        ],
    }
    assert cache_control_marks(body) == [
        Mark("tools", 1, None, 3600.0),
        Mark("system", None, 0, 300.0),
        Mark("messages", 0, 1, 300.0),
        Mark("request", None, None, 300.0),
    ]
    with pytest.raises(CacheError, match="ttl '2h'"):
        cache_control_marks({"messages": [], "cache_control": {"type": "ephemeral", "ttl": "2h"}})


def chatml(messages):
    def text(content):
        return "".join(part["text"] for part in content) if isinstance(content, list) else content

    return "".join(f"<{m['role']}>{text(m['content'])}</{m['role']}>" for m in messages)


def test_marks_become_token_positions_where_the_renders_part():
    body = {
        "cache_control": {"type": "ephemeral"},
        "messages": [
            {"role": "system", "content": "S" * 10},  # <system>SSSSSSSSSS</system>: 27 characters
            {
                "role": "user",
                "content": [{"type": "text", "text": "AAAAA"}, {"type": "text", "text": "BBBBB", "cache_control": {}}],
            },  # <user>AAAAABBBBB</user>: 23, to 50
            {"role": "assistant", "content": "ok"},  # <assistant>ok</assistant>: 25, to 75
            {"role": "user", "content": [{"type": "text", "text": "CCC", "cache_control": {"ttl": "1h"}}]},  # 16, to 91
        ],
    }
    prompt = [ord(char) for char in chatml(body["messages"]) + "<assistant>"]
    marks, ends = breakpoints_of(body, prompt, lambda messages: [ord(char) for char in chatml(messages)])
    # The top-level mark falls on the last block, where the 1-hour mark is.
    assert marks == (Breakpoint(50, 300.0), Breakpoint(91, 3600.0), Breakpoint(91, 300.0))
    # Block ends: the system message (27); the first user block, which parts from the prompt
    # after <user>AAAAA (27 + 6 + 5 = 38); the second (50); the assistant message (75).
    assert ends == (27, 38, 50, 75)
