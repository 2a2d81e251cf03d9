"""Render speed against its floor, measured in the same run.

The requests are the distinct ones the proofs of ../shared/corpus render (no tokenizer,
as the audit proves): recorded once, then each rendered by tmpl-lint as a proof renders it
(the engine's preprocessing, the copy, the limits: ``render_prompt``; alone, and inside one
``render_session`` per template, as a proof can open it), and by the compiled template
alone on the request already prepared (the floor: what the template's own code costs,
all that render.py and engines/ add left out). transformers' ``render_jinja_template``
of the same request is printed for reference. Requests that either refuses are left out.
The ways run in turn, best of 5 rounds; CPU time.
Run: python bench/render_speed.py
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from tmpl_lint import render
from tmpl_lint.checker import lint_with_facts
from tmpl_lint.engines import prepare, render_prompt, resolve_engine
from tmpl_lint.engines.base import HARMONY, EngineError
from tmpl_lint.proving.session import Prover, switch_values
from tmpl_lint.render import FrozenClock, RenderError, compile_template, copy_request, prepare_messages, render_session
from tmpl_lint.sources import collect

SHARED = Path(__file__).resolve().parents[2] / "shared"
ROUNDS = 5


class Recorder(Prover):
    """A prover that notes the arguments of each distinct render it makes, and the
    special tokens it renders with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests = {}

    def render(self, scenario, messages, at, generation_prompt):
        key = self.request_key(scenario, messages, at, generation_prompt)
        self.requests.setdefault(key, (scenario, messages, at, generation_prompt, self.special_tokens))
        return super().render(scenario, messages, at, generation_prompt)


def tmpl_lint_render(template: str, engine: str, request) -> str:
    scenario, messages, at, generation_prompt, special_tokens = request
    return render_prompt(
        engine,
        template,
        messages,
        clock=FrozenClock(at),
        tools=scenario.tools,
        kwargs=scenario.kwargs,
        add_generation_prompt=generation_prompt,
        special_tokens=special_tokens,
    ).text


def template_alone(template: str, engine: str, request) -> str:
    compiled, variables, clock = request
    reading = render._RENDER_CLOCK.set(clock)  # which clock strftime_now reads, as render() says it
    try:
        return "".join(compiled.generate(**variables))
    finally:
        render._RENDER_CLOCK.reset(reading)


def prepared(template: str, engine: str, request):
    """The compiled template and the variables it renders ``request`` with."""
    scenario, messages, at, generation_prompt, special_tokens = request
    messages, kwargs = prepare(engine, template, messages, scenario.kwargs)
    variables = {
        **special_tokens,
        "messages": prepare_messages(messages),
        "tools": copy_request(scenario.tools),
        "documents": None,
        "add_generation_prompt": generation_prompt,
        **kwargs,
    }
    return compile_template(template), variables, FrozenClock(at)


def transformers_render(template: str, engine: str, request) -> str:
    from transformers.utils import chat_template_utils

    scenario, messages, _, generation_prompt, special_tokens = request
    prepared, kwargs = prepare(engine, template, messages, scenario.kwargs)  # the request vLLM would hand it
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[prepared],
        tools=scenario.tools,
        chat_template=template,
        add_generation_prompt=generation_prompt,
        **special_tokens,
        **kwargs,
    )
    return rendered[0]


def renders_both_ways(template: str, engine: str, request) -> bool:
    try:
        tmpl_lint_render(template, engine, request)
        transformers_render(template, engine, request)
    except (RenderError, EngineError, Exception):  # noqa: BLE001 - transformers raises what jinja2 raises
        return False
    return True


def main() -> None:
    if not SHARED.is_dir():
        sys.exit(f"needs {SHARED}")
    sources, _ = collect(sorted((SHARED / "corpus" / "templates").glob("*.jinja")))
    work = []
    for source in sources:
        engine = resolve_engine("vllm", source.text)
        if engine == HARMONY:
            continue  # openai-harmony renders it, not the template
        facts, findings = lint_with_facts(source)
        recorder = Recorder(source.text, None, engine=engine)
        recorder.run(switch_values(findings, facts.variables))
        requests = [request for request in recorder.requests.values() if renders_both_ways(source.text, engine, request)]
        alone = [prepared(source.text, engine, request) for request in requests]
        for request, prepared_request in zip(requests, alone):
            if template_alone(source.text, engine, prepared_request) != tmpl_lint_render(source.text, engine, request):
                sys.exit(f"{source.name}: the floor renders other text than render_prompt")
        work.append((source.text, engine, requests, alone))

    def timed(way, session, alone=False) -> float:
        start = time.process_time()
        for template, engine, requests, prepared_requests in work:
            with session():
                for request in prepared_requests if alone else requests:
                    way(template, engine, request)
        return time.process_time() - start

    ways = {
        "render_prompt": (tmpl_lint_render, contextlib.nullcontext, False),
        "render_prompt in a session": (tmpl_lint_render, render_session, False),
        "template alone (floor)": (template_alone, contextlib.nullcontext, True),
        "transformers (reference)": (transformers_render, contextlib.nullcontext, False),
    }
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(ROUNDS):
        for name, (way, session, alone) in ways.items():
            best[name] = min(best[name], timed(way, session, alone))
    count = sum(len(requests) for _, _, requests, _ in work)
    floor = best["template alone (floor)"]
    print(f"{count} requests of {len(work)} templates, best of {ROUNDS}, CPU:")
    for name, seconds in best.items():
        print(f"  {name:28} {seconds:6.3f} s  {seconds / count * 1e6:6.0f} us a render  {seconds / floor:.2f}x the floor")


if __name__ == "__main__":
    main()
