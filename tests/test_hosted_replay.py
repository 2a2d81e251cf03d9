"""``replay --cache-model openai|anthropic|deepseek`` on a small log, the hit counts worked by
hand from the providers' rules (hosted_cache) and the ChatML renders below, in characters
(no tokenizer given: a character is a unit)."""

from __future__ import annotations

import json

from click.testing import CliRunner
from helpers import CORPUS

from tmpl_lint.cli import main

START = 1_770_000_000
SYSTEM = "x" * 1100
# <|im_start|>system\n (19) + 1100 + <|im_end|>\n (11) = 1130; <|im_start|>user\nhi<|im_end|>\n (30): 1160;
# the generation prompt <|im_start|>assistant\n (22): the first prompt is 1182 characters.
# The second adds ok<|im_end|>\n (13), <|im_start|>user\nmore<|im_end|>\n (32) and 22: 1249.
# The third adds 13, <|im_start|>user\nagain<|im_end|>\n (33) and 22: 1317.
QUERIES = 1182 + 1249 + 1317


def write_log(path, system_content, gaps=(60, 301)):
    turns = ["hi", "more", "again"]
    times = [START, START + gaps[0], START + gaps[0] + gaps[1]]
    history = [{"role": "system", "content": system_content}]
    lines = []
    for turn, time in zip(turns, times):
        history = history + [{"role": "user", "content": turn}]
        reply = {"role": "assistant", "content": "ok"}
        lines.append(
            json.dumps(
                {"timestamp": time, "request": {"user": "u", "messages": history}, "response": {"choices": [{"message": reply}]}}
            )
        )
        history = history + [reply]
    path.write_text("\n".join(lines) + "\n")


def figures(log, *flags):
    result = CliRunner().invoke(
        main,
        [
            "replay",
            str(log),
            "--template",
            str(CORPUS / "clean_chatml.jinja"),
            "--session-key",
            "user",
            "--format",
            "json",
            *flags,
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["template"]
    assert report["prefix_cache_queries"] == QUERIES
    return report["prefix_cache_hits"]


def test_openai_steps_and_retention_through_the_log_s_timestamps(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log, SYSTEM)
    # First prompt (1182): steps 1024 and 1152 cached. Second, 60 s on, sharing all 1182: 1152.
    # Third, 301 s after the steps were last used: expired, 0.
    assert figures(log, "--cache-model", "openai") == 1152
    # Kept 600 s: the third shares the second's 1249, whose steps end at 1152 too.
    assert figures(log, "--cache-model", "openai", "--cache-ttl", "600") == 1152 + 1152


def test_deepseek_hits_the_input_and_output_units(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log, SYSTEM)
    # The reply as generated is ok<|im_end|> (12 characters), its last never computed: the first
    # request's output unit is 1182 + 11 = 1193, which the second prompt holds whole; the second's
    # is 1249 + 11 = 1260, which the third holds.
    assert figures(log, "--cache-model", "deepseek") == 1193 + 1260


def test_anthropic_caches_at_the_logged_breakpoint(tmp_path):
    log = tmp_path / "log.jsonl"
    marked = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    write_log(log, marked)
    # The mark ends the system message: 1130 characters, over claude-sonnet-4-5's minimum of 1,024.
    # Written by the first request, hit by the second (60 s on), expired at the third (301 s on).
    assert figures(log, "--cache-model", "anthropic", "--api-model", "claude-sonnet-4-5") == 1130
    write_log(log, [{**marked[0], "cache_control": {"type": "ephemeral", "ttl": "1h"}}])
    assert figures(log, "--cache-model", "anthropic", "--api-model", "claude-sonnet-4-5") == 1130 + 1130
    # Under claude-haiku-4-5's minimum of 4,096: never written.
    assert figures(log, "--cache-model", "anthropic", "--api-model", "claude-haiku-4-5") == 0


def test_hosted_flags_are_refused_where_they_mean_nothing(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log, SYSTEM)
    template = str(CORPUS / "clean_chatml.jinja")
    for flags, message in [
        (["--cache-model", "openai", "--cache-blocks", "100"], "has no --cache-blocks"),
        (["--cache-model", "openai", "--replicas", "2"], "has no --replicas to route between"),
        (["--cache-ttl", "60"], "--cache-ttl is a hosted API's"),
        (["--cache-model", "anthropic"], "needs the model for its minimum"),
    ]:
        result = CliRunner().invoke(main, ["replay", str(log), "--template", template, *flags])
        assert result.exit_code == 2, result.output  # one error line, no traceback
        assert message in result.output and "Traceback" not in result.output, result.output


def test_a_request_with_five_breakpoints_is_left_out_and_the_rest_replayed(tmp_path):
    log = tmp_path / "log.jsonl"
    marked = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    write_log(log, marked)
    lines = log.read_text().splitlines()
    second = json.loads(lines[1])
    # Four more marks on the second request's user message: five in all, which the API refuses.
    second["request"]["messages"][1]["content"] = [{"type": "text", "text": "h", "cache_control": {}}] * 4
    lines[1] = json.dumps(second)
    log.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(
        main,
        ["replay", str(log), "--template", str(CORPUS / "clean_chatml.jinja"), "--session-key", "user", "--format", "json"]
        + ["--cache-model", "anthropic", "--api-model", "claude-sonnet-4-5"],
    )
    assert f"{log}:2: 5 cache_control breakpoints: the API allows 4 (400); left out" in result.stderr
    report = json.loads(result.stdout)["template"]
    # The first and third requests replayed (1182 + 1317); the third's mark expired 361 s after the first's write.
    assert (report["requests"], report["prefix_cache_queries"], report["prefix_cache_hits"]) == (2, 1182 + 1317, 0)


def test_anthropic_without_any_breakpoint_says_so(tmp_path):
    # A log with no cache_control: Anthropic caches nothing, and the report says why instead
    # of leaving the loss to look like eviction.
    log = tmp_path / "log.jsonl"
    write_log(log, SYSTEM)
    args = ["replay", str(log), "--template", str(CORPUS / "clean_chatml.jinja"), "--session-key", "user"]
    result = CliRunner().invoke(main, [*args, "--cache-model", "anthropic", "--api-model", "claude-sonnet-4-5"])
    assert result.exit_code == 0, result.output
    assert "  no request carries a cache_control breakpoint: Anthropic caches a prompt only at its breakpoints" in result.stdout
    marked = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    write_log(log, marked)
    result = CliRunner().invoke(main, [*args, "--cache-model", "anthropic", "--api-model", "claude-sonnet-4-5"])
    assert result.exit_code == 0, result.output
    assert "no request carries a cache_control breakpoint" not in result.stdout
