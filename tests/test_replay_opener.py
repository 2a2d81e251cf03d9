"""Where a prompt departs at or after the previous prompt's end, replay names the departure
without rendering the previous request without a generation prompt (``Tracer.opener``): on
every shared template, the departures, their reasons and the requests left out equal those
found with that render, for sessions that depart in their replies, in history, in the
system prompt and by the client's edits."""

from __future__ import annotations

import json

import pytest
from helpers import SHARED_TEMPLATES, needs_shared

from tmpl_lint.diff import read_template
from tmpl_lint.proving.divergence import generation_prompt_span
from tmpl_lint.replay.attribution import Tracer
from tmpl_lint.replay.log import read_log, sessions

pytestmark = needs_shared
TEMPLATES = sorted(SHARED_TEMPLATES.glob("*.jinja")) if SHARED_TEMPLATES.is_dir() else []
WEATHER = {
    "type": "function",
    "function": {"name": "weather", "description": "Weather", "parameters": {"type": "object", "properties": {}}},
}


class Rendering(Tracer):
    """The opener always from the render without a generation prompt."""

    def opener(self, previous, cached_text, next_text, latest):
        return generation_prompt_span(previous.prompt.text, self.bare(previous.call))


def log_lines() -> list[dict]:
    """Sessions of plain replies, replies with reasoning, a tool call, a client's edit of an
    earlier message, and a changed system prompt."""
    lines = []
    for name, reasoning in (("plain", False), ("thinking", True)):
        history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
        for turn in range(3):
            reply = {"role": "assistant", "content": f"Sunny, {20 + turn} degrees.\nAnything else?"}
            if reasoning:
                reply["reasoning_content"] = f"The user asks about turn {turn}."
            lines.append({"request": {"user": name, "messages": history}, "response": {"choices": [{"message": reply}]}})
            history = [*history, reply, {"role": "user", "content": f"And tomorrow {turn}?"}]
    history = [{"role": "user", "content": "Weather?"}]
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    reply = {"role": "assistant", "content": "", "tool_calls": [call]}
    lines.append(
        {"request": {"user": "tools", "messages": history, "tools": [WEATHER]}, "response": {"choices": [{"message": reply}]}}
    )
    history = [*history, reply, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    lines.append({"request": {"user": "tools", "messages": history, "tools": [WEATHER]}})
    edited = [{"role": "user", "content": "Weather in Rome?"}]
    lines.append(
        {
            "request": {"user": "edit", "messages": edited},
            "response": {"choices": [{"message": {"role": "assistant", "content": "Warm."}}]},
        }
    )
    edited = [
        {"role": "user", "content": "Weather in Rome, Italy?"},
        {"role": "assistant", "content": "Warm."},
        {"role": "user", "content": "Ok"},
    ]
    lines.append({"request": {"user": "edit", "messages": edited}})
    system = [{"role": "system", "content": "Today is Monday."}, {"role": "user", "content": "Hi"}]
    lines.append(
        {
            "request": {"user": "system", "messages": system},
            "response": {"choices": [{"message": {"role": "assistant", "content": "Hello"}}]},
        }
    )
    system = [
        {"role": "system", "content": "Today is Tuesday."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    lines.append({"request": {"user": "system", "messages": [*system, {"role": "user", "content": "Bye"}]}})
    return lines


def traced(tracer: Tracer, path) -> list:
    found = []
    with read_log(path, "user") as log:
        for index, session in enumerate(sessions(log, "user")):
            traces, problems = tracer.trace(index, session, log)
            found.append(([(t.departure, t.template_departure, t.reasons, t.generated.tolist()) for t in traces], problems))
    return found


@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_departures_equal_those_found_with_the_render(path, tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in log_lines()))
    text, special = read_template(path)
    expected = traced(Rendering(text, None, special, "vllm"), log)
    assert traced(Tracer(text, None, special, "vllm"), log) == expected


def test_the_shortcut_and_the_render_both_run(tmp_path):
    """Across the templates, departures named without the render, and with it."""
    taken = {"shortcut": 0, "render": 0}

    class Counting(Tracer):
        def opener(self, previous, cached_text, next_text, latest):
            span = super().opener(previous, cached_text, next_text, latest)
            taken["shortcut" if span == (len(previous.prompt.text),) * 2 else "render"] += 1
            return span

    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in log_lines()))
    for path in TEMPLATES:
        text, special = read_template(path)
        traced(Counting(text, None, special, "vllm"), log)
    assert taken["shortcut"] > 20 and taken["render"] > 20, taken
