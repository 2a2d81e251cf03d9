"""What a serving engine does to a chat request before the template sees it, one module per
engine.

A proof is only as true as the token ids it compares, and an engine does not hand the
request to the template untouched. ``hf`` is transformers' ``apply_chat_template`` as
called directly; ``vllm`` is vLLM 0.33's chat preprocessing (vllm.py), and its gpt-oss
path renders with openai-harmony instead of the template (harmony.py); ``sglang`` is
SGLang 0.5.23's (sglang.py); ``llamacpp`` is llama-server's, whose own template engine
renders (llamacpp.py), as it renders every GGUF's template. Each module ends
in its engine's profile: version, renderer, tokenization, cache model. This module picks
which one renders a request (``request_prompt`` for a request as a client sent it).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..render import DEFAULT_LIMITS, RenderLimits, render
from ..requests import REASONING_KEYS
from . import hf, llamacpp, sglang, vllm
from .base import ENGINES, HARMONY, HARMONY_MARKUP, LLAMACPP, EngineProfile, EngineRefusal, Prompt

PROFILES: dict[str, EngineProfile] = {
    profile.name: profile for profile in (vllm.PROFILE, sglang.PROFILE, llamacpp.PROFILE, hf.PROFILE)
}


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
    if engine == "sglang":
        return sglang.prepare(messages, merged)
    if engine == "llamacpp":
        return llamacpp.prepare(messages, merged)
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
    continue_final_message: bool = False,
) -> Prompt:
    """The prompt ``engine`` would tokenize for a request.

    Without a generation prompt the conversation is taken to end in the model's latest
    reply as it was generated (the prover's "reply as generated"). ``continue_final_message``:
    the render stops where the last message's text ends, as transformers cuts it (vLLM and
    SGLang call transformers for it).
    """
    if engine == HARMONY:
        from .harmony import harmony_encoding, harmony_prompt_ids  # noqa: PLC0415 -- gpt-oss only: off the lint path

        ids = harmony_prompt_ids(messages, tools, clock(), add_generation_prompt, reasoning_effort)
        return Prompt(harmony_encoding().decode_utf8(ids), tuple(ids))
    prepared, merged = prepare(engine, template, messages, kwargs, server_kwargs, reasoning_effort)
    if continue_final_message:
        prepared = [*prepared[:-1], hf.tagged(prepared[-1] if prepared else None)]
        add_generation_prompt = False
    if engine == LLAMACPP:
        text = llamacpp.render_request(
            template,
            prepared,
            clock=clock,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            special_tokens=special_tokens,
            template_kwargs=merged,
            limits=limits,
        )
        return Prompt(hf.cut_at_tag(text) if continue_final_message else text)
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
    return Prompt(hf.cut_at_tag(text) if continue_final_message else text)


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


def engine_tokenizer(engine: str):
    """The tokenizer an engine brings itself, when it renders without the template."""
    if engine != HARMONY:
        return None
    from .harmony import HarmonyTokenizer  # noqa: PLC0415 -- gpt-oss only: off the lint path

    return HarmonyTokenizer()


def profile_of(engine: str) -> EngineProfile:
    """The profile of an --engine value, or of what resolve_engine made of it."""
    return vllm.PROFILE if engine == HARMONY else PROFILES[engine]


def engine_for_cache(engine: str | None, cache_model: str | None) -> tuple[str, str]:
    """The engine and cache model of a run: the cache model follows the engine, and
    ``--cache-model sglang`` alone means SGLang serves the model (its request handling)."""
    if engine is None:
        engine = "sglang" if cache_model == "sglang" else "vllm"
    return engine, cache_model or PROFILES[engine].cache_model


def request_prompt(
    engine: str,
    template: str,
    body: dict[str, Any],
    *,
    clock: Callable[[], datetime],
    special_tokens: dict[str, Any] | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
    server_kwargs: dict[str, Any] | None = None,
) -> Prompt:
    """What ``engine`` feeds the model for a chat-completions request body: the engine's
    refusal (EngineRefusal) or its prompt. ``render``, ``diff``, ``replay`` and ``validate``
    all render a request through here."""
    profile = profile_of(engine)
    refused = profile.refusal(body)
    if refused is not None:
        raise refused
    continuing = bool(body.get("continue_final_message"))
    generation_prompt = bool(body.get("add_generation_prompt", True))
    if engine == HARMONY:
        # vLLM renders gpt-oss for completion whatever the request says
        # (online_renderer.py _make_request_with_harmony: render_for_completion)
        generation_prompt, continuing = True, False
    elif continuing and generation_prompt and profile.validators:
        raise EngineRefusal(profile, "continue_final_message", "cannot be true together with add_generation_prompt")
    kwargs = body.get("chat_template_kwargs")
    effort = body.get("reasoning_effort")
    return render_prompt(
        engine,
        template,
        body["messages"],
        clock=clock,
        tools=body.get("tools"),
        kwargs=kwargs if isinstance(kwargs, dict) else None,
        add_generation_prompt=generation_prompt and not continuing,
        special_tokens=special_tokens,
        limits=limits,
        reasoning_effort=effort if isinstance(effort, str) else None,
        server_kwargs=server_kwargs,
        continue_final_message=continuing,
    )


# --- what an engine passes of a message's reasoning ------------------------------------


def passed_reasoning(engine: str, field: str) -> tuple[str, ...]:
    """The names under which ``engine`` hands the template an assistant message's ``field``
    as a client sent it; empty where it drops it: its profile's answer
    (``EngineProfile.passes_reasoning``). gpt-oss renders through harmony, no template."""
    if engine == HARMONY:
        return ()
    return profile_of(engine).passes_reasoning(field)


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
            fate = f"which {profile_of(engine).label} {fate}"
            parts.append(f"{requests:,} request {'messages carry' if requests != 1 else 'message carries'} `{name}`, {fate}")
        if replies:
            parts.append(
                f"{replies:,} logged {'replies carry' if replies != 1 else 'reply carries'} `{name}`, read as the reply's reasoning"
            )
    return "; ".join(parts) or None
