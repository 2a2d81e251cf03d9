"""What a serving engine does to a chat request before the template sees it.

A proof is only as true as the token ids it compares, and an engine does not hand the
request to the template untouched. ``hf`` is transformers' ``apply_chat_template`` as
called directly. ``vllm`` mirrors vLLM 0.33's chat preprocessing:

- ``vllm/renderers/chat_utils/chat_message.py`` ``_postprocess_messages``: in assistant
  messages, tool-call ``arguments`` strings are parsed into mappings (empty or null
  arguments, malformed JSON and JSON that is not an object all become ``{}``), and an
  empty ``tool_calls`` list is dropped;
- request validation against the OpenAI types, which leaves a tool call's ``function`` as
  ``{"arguments", "name"}`` in that order (visible to templates that print
  ``function|tojson``, such as Mistral Nemo's);
- ``parse_chat_message_content``: a list of content parts is flattened to one string
  (text parts joined with newlines) unless the template iterates over the parts itself
  (vLLM's "openai" content format, detected from the template);
- the request's ``chat_template_kwargs`` are merged over the server's
  ``--default-chat-template-kwargs``.

vLLM then calls transformers' ``apply_chat_template``, so rendering itself is unchanged.
When vLLM changes these steps, this module is the one to update. Not mirrored: vLLM renders
gpt-oss through openai-harmony rather than the Jinja template, so gpt-oss requests with a
system or developer message, or with analysis in history, tokenize differently there
(bench/vllm_peer.py measures it).
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Any

from jinja2 import nodes

ENGINES = ("vllm", "hf")


class EngineError(ValueError):
    """The engine would reject the request (vLLM answers 400)."""


@lru_cache(maxsize=64)
def content_format(template: str) -> str:
    """"openai" when the template loops over a message's content parts, else "string"."""
    from .analysis import parse

    tree, _ = parse(template)
    if tree is None:
        return "string"
    for loop in tree.find_all(nodes.For):
        iterable = loop.iter
        while isinstance(iterable, nodes.Filter) and iterable.node is not None:
            iterable = iterable.node
        if isinstance(iterable, nodes.Getattr) and iterable.attr == "content":
            return "openai"
        if isinstance(iterable, nodes.Getitem) and isinstance(iterable.arg, nodes.Const) and iterable.arg.value == "content":
            return "openai"
    return "string"


def parse_arguments(arguments: Any) -> dict[str, Any]:
    """Tool-call arguments as vLLM hands them to the template: always a mapping."""
    if not arguments:
        return {}
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def _ordered(mapping: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    first = {key: mapping[key] for key in order if key in mapping}
    return {**first, **{key: value for key, value in mapping.items() if key not in first}}


def _flatten(content: Any, form: str) -> Any:
    if not isinstance(content, list):
        return content
    if form == "openai":
        return [part if isinstance(part, dict) else {"type": "text", "text": str(part)} for part in content]
    texts = [part.get("text", "") for part in content if isinstance(part, dict) and part.get("type", "text") == "text"]
    return "\n".join(texts)


def prepare(engine: str, template: str, messages: list[dict[str, Any]], kwargs: dict[str, Any] | None = None,
            server_kwargs: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and template variables ``engine`` would render for a request."""
    merged = {**(server_kwargs or {}), **(kwargs or {})}
    if engine == "hf":
        return copy.deepcopy(messages), merged
    if engine != "vllm":
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    form = content_format(template)
    prepared = []
    for original in messages:
        message = copy.deepcopy(original)
        if "content" in message:
            message["content"] = _flatten(message["content"], form)
        if message.get("role") == "assistant" and "tool_calls" in message:
            calls = message["tool_calls"]
            if isinstance(calls, list) and not calls:
                message.pop("tool_calls")
            elif isinstance(calls, list):
                for position, call in enumerate(calls):
                    if not isinstance(call, dict):
                        raise EngineError("assistant tool_calls entries must be objects")
                    function = call.get("function")
                    if call.get("type", "function") != "function" or not isinstance(function, dict):
                        raise EngineError("chat completions only support assistant tool_calls of type 'function'")
                    function["arguments"] = parse_arguments(function.get("arguments"))
                    # vLLM validates the request against the OpenAI types, whose fields come
                    # in this order; a template that prints `function|tojson` shows it.
                    call["function"] = _ordered(function, ("arguments", "name"))
                    calls[position] = _ordered(call, ("id", "function", "type"))
        prepared.append(message)
    return prepared, merged
