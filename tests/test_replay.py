"""`tmpl-lint replay` on a generated multi-session log, checked against transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import datetime

import pytest
from click.testing import CliRunner
from helpers import SHARED_TEMPLATES, SHARED_TOKENIZERS, needs_shared

from tmpl_lint.cli import main
from tmpl_lint.prover import first_difference, full_blocks
from tmpl_lint.scenarios import TOOLS, agent, chat

pytestmark = needs_shared
transformers = pytest.importorskip("transformers")

MODELS = [("Qwen--Qwen3-0.6B.jinja", "qwen3"), ("openai--gpt-oss-120b.jinja", "gpt-oss")]


def build_log(path):
    """Three sessions: an agent loop, a chat, and a chat that crosses midnight."""
    entries = []
    stamps = {
        "alice": [datetime(2026, 3, 1, 10, minute) for minute in range(10)],
        "bob": [datetime(2026, 3, 1, 11, minute) for minute in range(10)],
        "carol": [datetime(2026, 3, 1, 23, 59, 40), datetime(2026, 3, 2, 0, 0, 20), datetime(2026, 3, 2, 0, 1)],
    }
    sessions = {"alice": (agent(False, False), TOOLS), "bob": (chat(True), None), "carol": (chat(False), None)}
    # interleaved, as a proxy logs concurrent sessions
    for index in range(5):
        for user, (calls, tools) in sessions.items():
            if index < len(calls):
                body = {"model": "m", "user": user, "messages": calls[index].messages}
                if tools:
                    body["tools"] = tools
                entries.append({"timestamp": stamps[user][index].isoformat(), "request": body})
    path.write_text("\n".join(json.dumps(entry) for entry in entries) + "\n")
    return entries


def independent_rate(entries, template, tokenizer, monkeypatch):
    from transformers.utils import chat_template_utils

    by_user = {}
    for entry in entries:
        by_user.setdefault(entry["request"]["user"], []).append(entry)
    reusable = ideal = total = 0
    for calls in by_user.values():
        ids = []
        for entry in calls:
            instant = datetime.fromisoformat(entry["timestamp"])

            class Frozen(datetime):
                @classmethod
                def now(cls, tz=None, instant=instant):
                    return instant

            monkeypatch.setattr(chat_template_utils, "datetime", Frozen)
            text = tokenizer.apply_chat_template(
                entry["request"]["messages"],
                tools=entry["request"].get("tools"),
                chat_template=template,
                add_generation_prompt=True,
                tokenize=False,
            )
            ids.append(tokenizer.encode(text, add_special_tokens=False))
        for earlier, later in zip(ids, ids[1:]):
            position = first_difference(earlier, later)
            reusable += full_blocks(len(earlier) if position is None else position, 16)
            ideal += full_blocks(len(earlier), 16)
            total += len(later)
    return reusable / total, ideal / total


@pytest.mark.parametrize(("template_name", "tokenizer_name"), MODELS)
def test_projected_hit_rate_matches_an_independent_computation_and_the_fix_reaches_the_ideal(
    tmp_path, monkeypatch, template_name, tokenizer_name
):
    log = tmp_path / "traffic.jsonl"
    entries = build_log(log)
    template = tmp_path / "original.jinja"
    shutil.copyfile(SHARED_TEMPLATES / template_name, template)
    fixed = tmp_path / "fixed.jinja"
    shutil.copyfile(template, fixed)
    assert CliRunner().invoke(main, [str(fixed), "--fix", "--no-prove", "-q"]).exit_code in (0, 1)

    result = CliRunner().invoke(
        main,
        [
            "replay",
            str(log),
            "--tokenizer",
            str(SHARED_TOKENIZERS / tokenizer_name),
            "--template",
            str(template),
            "--compare",
            str(fixed),
            "--session-key",
            "user",
            "--engine",
            "hf",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(SHARED_TOKENIZERS / tokenizer_name))
    expected_rate, expected_ideal = independent_rate(entries, template.read_text(), tokenizer, monkeypatch)
    original = report["template"]
    assert original["sessions"] == 3 and original["unit"] == "token"
    assert original["hit_rate"] == pytest.approx(expected_rate, abs=1e-9)
    assert original["ideal_hit_rate"] == pytest.approx(expected_ideal, abs=1e-9)
    assert original["hit_rate"] < original["ideal_hit_rate"]
    after = report["compare"]
    assert after["hit_rate"] == pytest.approx(after["ideal_hit_rate"])
    assert after["top_causes"] == []


def test_sessions_by_prefix_continuity_and_html(tmp_path):
    log = tmp_path / "traffic.jsonl"
    build_log(log)
    page = tmp_path / "replay.html"
    result = CliRunner().invoke(
        main,
        [
            "replay",
            str(log),
            "--template",
            str(SHARED_TEMPLATES / "Qwen--Qwen3-0.6B.jinja"),
            "--format",
            "json",
            "--html",
            str(page),
        ],
    )
    report = json.loads(result.stdout)["template"]
    assert report["sessions"] == 3  # found without --session-key
    assert report["unit"] == "char"
    assert report["worst_sessions"]
    assert "<polyline" in page.read_text()


def test_logged_responses_enter_the_check(tmp_path):
    """With the reply logged, the compact arguments the model wrote are what the cache holds."""
    calls = agent(False, False)
    reply = dict(calls[0].reply)
    reply["tool_calls"] = [dict(reply["tool_calls"][0], function={"name": "get_weather", "arguments": '{"city":"Paris"}'})]
    lines = [
        {"request": {"messages": calls[0].messages, "tools": TOOLS, "user": "u"}, "response": {"choices": [{"message": reply}]}},
        {"request": {"messages": calls[1].messages, "tools": TOOLS, "user": "u"}},
    ]
    log = tmp_path / "traffic.jsonl"
    log.write_text("\n".join(json.dumps(line) for line in lines))
    result = CliRunner().invoke(
        main, ["replay", str(log), "--template", str(SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja"), "--format", "json"]
    )
    report = json.loads(result.stdout)["template"]
    assert [cause["cause"] for cause in report["top_causes"]] == ["tool-arguments"]


def test_bad_log_is_a_one_line_error(tmp_path):
    log = tmp_path / "bad.jsonl"
    log.write_text('{"messages": []}\n')
    result = CliRunner().invoke(
        main, ["replay", str(log), "--template", str(SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja")]
    )
    assert result.exit_code == 2
    assert result.stderr == f"tmpl-lint: error: {log}:1: no messages in this request\n"


def test_records_of_the_wrong_types_are_one_error_each_and_the_rest_replays(tmp_path):
    user = {"role": "user", "content": "hi"}
    good = [
        {"request": {"messages": [user], "user": "u"}},
        {"request": {"messages": [user, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}], "user": "u"}},
    ]
    bad = [
        ('{"messages": [{"role": "user", "content": "hi"}], "timestamp": 1e300}', "timestamp 1e+300 is out of range"),
        ('{"messages": [1, 2]}', "every message must be an object with a role"),
        (
            '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "x"}',
            "chat_template_kwargs must be an object",
        ),
        ('{"messages": [{"role": "user", "content": "x"}], "tools": 5}', "tools must be a list of objects"),
        ('{"messages": [{"role": "user", "content": "x"}], "timestamp": [1]}', "timestamp [1] is neither a number nor a string"),
        (
            '{"request": {"messages": [{"role": "user", "content": "x"}]}, "response": {"token_ids": ["a", 1e400]}}',
            "response token_ids must be a list of token ids (non-negative integers)",
        ),
        ("[" * 100_000 + "]" * 100_000, "invalid JSON: nested too deeply to read"),
        ("{oops", "invalid JSON: Expecting property name enclosed in double quotes"),
    ]
    log = tmp_path / "traffic.jsonl"
    lines = [json.dumps(good[0])] + [line for line, _ in bad] + [json.dumps(good[1])]
    log.write_text("\n".join(lines) + "\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tmpl_lint",
            "replay",
            str(log),
            "--template",
            str(SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja"),
            "--session-key",
            "user",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stderr == "".join(f"tmpl-lint: error: {log}:{number}: {reason}\n" for number, (_, reason) in enumerate(bad, 2))
    report = json.loads(result.stdout)["template"]
    assert (report["sessions"], report["pairs"]) == (1, 1)  # the two good calls, one session
    assert result.returncode == 2


def test_a_choice_that_is_not_an_object_is_no_reply():
    from tmpl_lint.replay import reply_message

    assert reply_message({"choices": [5]}) is None
    assert reply_message({"choices": [{"message": {"role": "assistant", "content": "x"}}]}) == {
        "role": "assistant",
        "content": "x",
    }
