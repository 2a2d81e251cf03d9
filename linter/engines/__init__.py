"""What a serving engine does to a chat request before the template sees it, one module per
engine.

A proof is only as true as the token ids it compares, and an engine does not hand the
request to the template untouched. ``hf`` is transformers' ``apply_chat_template`` as
called directly; ``vllm`` is vLLM 0.33's chat preprocessing (vllm.py), and its gpt-oss
path renders with openai-harmony instead of the template (harmony.py). This module picks
which one renders a request.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..render import DEFAULT_LIMITS, FrozenClock, RenderLimits, render
from ..requests import REASONING_KEYS
from . import hf, vllm
from .base import ENGINES, HARMONY, HARMONY_MARKUP, Prompt


def prepare(
    engine: str,
    template: str,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any] | None = None,
    server_kwargs: dict[str, Any] | None = None,
    reasoning_effort: str | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and template variables ``engine`` would render for a request.

    ``reasoning_effort`` is the request's own field (not a template variable): vLLM hands it
    to the template and, unless the request sets ``enable_thinking``, turns thinking on for
    any effort but "none".
    """
    merged = {**(server_kwargs or {}), **(kwargs or {})}
    if engine == "hf":
        return hf.prepare(messages, merged)
    if engine == "vllm":
        return vllm.prepare(template, messages, merged, kwargs or {}, reasoning_effort)
    raise ValueError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")


def render_prompt(
    engine: str,
    template: str,
    messages: list[dict[str, Any]],
    *,
    clock: Callable[[], datetime],
    tools: list[dict[str, Any]] | None = None,
    kwargs: dict[str, Any] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: dict[str, Any] | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
    reasoning_effort: str | None = None,
    server_kwargs: dict[str, Any] | None = None,
) -> Prompt:
    """The prompt ``engine`` would tokenize for a request.

    Without a generation prompt the conversation is taken to end in the model's latest
    reply as it was generated (the prover's "reply as generated").
    """
    if engine == HARMONY:
        # openai-harmony loads its vocabulary on import: only for gpt-oss
        from .harmony import harmony_encoding, harmony_prompt_ids

        ids = harmony_prompt_ids(messages, tools, clock(), add_generation_prompt, reasoning_effort)
        return Prompt(harmony_encoding().decode_utf8(ids), tuple(ids))
    prepared, merged = prepare(engine, template, messages, kwargs, server_kwargs, reasoning_effort)
    text = render(
        template,
        prepared,
        clock=clock,
        tools=vllm.vllm_tools(tools) if engine == "vllm" else tools,
        add_generation_prompt=add_generation_prompt,
        special_tokens=special_tokens,
        template_kwargs=merged,
        limits=limits,
        reasoning_aliases=engine != "vllm",
    )
    return Prompt(text)


def resolve_engine(engine: str, template: str, model_type: str | None = None) -> str:
    """What renders a request for this model under ``engine``: vLLM renders gpt-oss
    (``model_type`` "gpt_oss", as its config.json says) with openai-harmony. Without a
    config.json, a template written in harmony's markup stands for gpt-oss."""
    if engine != "vllm":
        return engine
    if model_type is not None:
        return HARMONY if model_type == "gpt_oss" else engine
    return HARMONY if all(marker in template for marker in HARMONY_MARKUP) else engine


def engine_tokenizer(engine: str):
    """The tokenizer an engine brings itself, when it renders without the template."""
    if engine != HARMONY:
        return None
    # openai-harmony loads its vocabulary on import: only for gpt-oss
    from .harmony import HarmonyTokenizer

    return HarmonyTokenizer()


# --- what an engine passes of a message's reasoning ------------------------------------

_PROBE = "\0reasoning\0"
# Prints the names under which the first message holds the probe: what the template sees.
_NAMES_SEEN = "{% for key, value in messages[0].items() %}{% if value == probe %}{{ key }} {% endif %}{% endfor %}"


@functools.cache
def passed_reasoning(engine: str, field: str) -> tuple[str, ...]:
    """The names under which ``engine`` hands the template an assistant message's ``field``
    as a client sent it; empty where it drops it. Asked of the engine's own request path
    (``render_prompt``), so it says what the renders do."""
    if engine == HARMONY:
        return ()
    message = {"role": "assistant", "content": "", field: _PROBE}
    clock = FrozenClock(datetime(2026, 1, 1))
    text = render_prompt(engine, _NAMES_SEEN, [message], clock=clock, kwargs={"probe": _PROBE}, add_generation_prompt=False).text
    return tuple(sorted(text.split()))


def reasoning_note(requests_carry: dict[str, int], replies_carry: dict[str, int], engine: str) -> str | None:
    """What the requests and the logged replies carry of reasoning (messages per field,
    ``requests.reasoning_fields``), and what ``engine`` passes of it to the template: said
    once per run, by replay and diff alike."""
    parts = []
    for name in REASONING_KEYS:
        requests, replies = requests_carry.get(name, 0), replies_carry.get(name, 0)
        if requests:
            passed = " and ".join(f"`{seen}`" for seen in passed_reasoning(engine, name))
            fate = f"passes to the template as {passed}" if passed else "does not pass to the template"
            fate = f"which --engine {engine} {fate}"
            parts.append(f"{requests:,} request {'messages carry' if requests != 1 else 'message carries'} `{name}`, {fate}")
        if replies:
            parts.append(
                f"{replies:,} logged {'replies carry' if replies != 1 else 'reply carries'} `{name}`, read as the reply's reasoning"
            )
    return "; ".join(parts) or None
