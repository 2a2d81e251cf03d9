"""Replay renders each text it needs once: a request's reply as the newest message is asked
for again when the next request departs (Qwen3 drops the reply's empty think block from
history), and is not rendered again."""

from __future__ import annotations

import json
from collections import Counter

from helpers import SHARED_TEMPLATES, needs_shared

from tmpl_lint.diff import read_template
from tmpl_lint.replay import attribution
from tmpl_lint.replay.attribution import TokenCause, Tracer
from tmpl_lint.replay.log import read_log, sessions

QWEN3 = SHARED_TEMPLATES / "Qwen--Qwen3-0.6B.jinja"


@needs_shared
def test_a_departing_session_renders_each_text_once(tmp_path, monkeypatch):
    history = [{"role": "user", "content": "What is a prefix cache?"}]
    lines = []
    for turn in range(3):
        reply = {"role": "assistant", "content": f"Answer {turn}: blocks of the prompt kept for the next request."}
        lines.append({"request": {"user": "s", "messages": history}, "response": {"choices": [{"message": reply}]}})
        history = [*history, reply, {"role": "user", "content": f"And question {turn + 1}?"}]
    log_path = tmp_path / "log.jsonl"
    log_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    renders: Counter[tuple[str, bool]] = Counter()
    render_prompt = attribution.render_prompt

    def counted(engine, template, messages, **options):
        renders[(json.dumps(messages, sort_keys=True), options["add_generation_prompt"])] += 1
        return render_prompt(engine, template, messages, **options)

    monkeypatch.setattr(attribution, "render_prompt", counted)
    text, special = read_template(QWEN3)
    tracer = Tracer(text, None, special, "vllm")
    with read_log(log_path, "user") as log:
        (session,) = sessions(log, "user")
        traces, problems = tracer.trace(0, session, log)
    assert problems == []
    # Each later request departs where the reply's empty think block was: the template's.
    assert [trace.departure is not None for trace in traces] == [False, True, True]
    assert all(trace.reasons[0].cause is TokenCause.TEMPLATE for trace in traces[1:])
    # Three replies as the newest message, each once. The first two requests are not
    # rendered without a generation prompt: their departures are at the reply, after the
    # prompt's end, where where the generation prompt starts decides nothing (Tracer.opener).
    assert sorted(renders.values()) == [1] * 3
    assert all(json.loads(messages)[-1]["role"] == "assistant" for messages, _ in renders)
