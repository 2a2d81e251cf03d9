"""What a serving engine does to a chat request before the template sees it, one module per
engine.

A proof is only as true as the token ids it compares, and an engine does not hand the
request to the template untouched. ``hf`` is transformers' ``apply_chat_template`` as
called directly; ``vllm`` is vLLM 0.33's chat preprocessing (vllm.py), and its gpt-oss
path renders with openai-harmony instead of the template (harmony.py). This module picks
which one renders a request.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..render import DEFAULT_LIMITS, RenderLimits, render
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
