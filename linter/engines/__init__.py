"""What a serving engine does to a chat request before the template sees it, one module per
engine.

A proof is only as true as the token ids it compares, and an engine does not hand the
request to the template untouched. ``hf`` is transformers' ``apply_chat_template`` as
called directly; ``vllm`` is vLLM 0.33's chat preprocessing (vllm.py), and its gpt-oss
path renders with openai-harmony instead of the template (harmony.py); ``llamacpp`` is
llama-server, whose own template engine renders (llamacpp.py). This module picks which one
renders a request.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..render import DEFAULT_LIMITS, RenderLimits, render
from . import hf, vllm
from .base import ENGINES, HARMONY, HARMONY_MARKUP, LLAMACPP, Prompt


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
    if engine in ("hf", LLAMACPP):  # llama-server: the messages as sent (llamacpp.py says what is not modelled)
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
    if engine == LLAMACPP:
        # wasmtime and the engine's module load only where a request is rendered as llama.cpp does
        from .llamacpp import render_request

        return Prompt(
            render_request(
                template,
                prepared,
                clock=clock,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                special_tokens=special_tokens,
                template_kwargs=merged,
                limits=limits,
            )
        )
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


def resolve_engine(engine: str, template: str, model_type: str | None = None, gguf: bool = False) -> str:
    """What renders a request for this model under ``engine``: vLLM renders gpt-oss
    (``model_type`` "gpt_oss", as its config.json says) with openai-harmony. Without a
    config.json, a template written in harmony's markup stands for gpt-oss. A GGUF's
    template (``gguf``: read from a GGUF, or beside one for ``--chat-template-file``) is
    rendered as llama.cpp renders it, unless ``hf`` asks for transformers'."""
    if gguf and engine != "hf":
        return LLAMACPP
    if engine != "vllm":
        return engine
    if model_type is not None:
        return HARMONY if model_type == "gpt_oss" else engine
    return HARMONY if all(marker in template for marker in HARMONY_MARKUP) else engine


def source_engine(engine: str, source) -> str:
    """``resolve_engine`` for a template source: its model's config.json beside it, and
    whether it is a GGUF's."""
    # Where the GGUF and config.json are looked for: only when proving
    from ..gguf import model_for
    from ..sources import model_type_beside

    gguf = source.container == "gguf" or model_for(source) is not None  # a Hub GGUF's too
    return resolve_engine(engine, source.text, model_type_beside(source.path), gguf=gguf)


def engine_tokenizer(engine: str):
    """The tokenizer an engine brings itself, when it renders without the template."""
    if engine != HARMONY:
        return None
    # openai-harmony loads its vocabulary on import: only for gpt-oss
    from .harmony import HarmonyTokenizer

    return HarmonyTokenizer()
