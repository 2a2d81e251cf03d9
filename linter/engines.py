"""What a serving engine does to a chat request before the template sees it.

A proof is only as true as the token ids it compares, and an engine does not hand the
request to the template untouched. ``hf`` is transformers' ``apply_chat_template`` as
called directly. ``vllm`` mirrors vLLM 0.33's chat preprocessing:

- ``vllm/renderers/chat_utils/chat_message.py`` ``_postprocess_messages``: in assistant
  messages, tool-call ``arguments`` strings are parsed into mappings (empty or null
  arguments, malformed JSON and JSON that is not an object all become ``{}``), and an
  empty ``tool_calls`` list is dropped (the server's request validation answers 400 to
  arguments that are not strings, measured; ``LLM.chat`` takes them, and so does this);
- request validation against the OpenAI types, which leaves a tool call's ``function`` as
  ``{"arguments", "name"}`` in that order (visible to templates that print
  ``function|tojson``, such as Mistral Nemo's);
- ``parse_chat_message_content``: a list of content parts is flattened to one string
  (text parts joined with newlines) unless the template iterates over the parts itself
  (vLLM's "openai" content format, detected from the template);
- the request's ``chat_template_kwargs`` are merged over the server's
  ``--default-chat-template-kwargs``;
- ``ChatCompletionRequest.build_chat_params`` (``.../chat_completion/protocol.py``): the
  request's own ``reasoning_effort`` is handed to the template, and turns
  ``enable_thinking`` off for "none" (on otherwise) unless the request's kwargs set it.

vLLM then calls transformers' ``apply_chat_template``, so rendering itself is unchanged,
except for gpt-oss: vLLM's server renders it with openai-harmony and never reads its Jinja
template (``harmony.py``). vLLM picks that path by the model's ``model_type``
(``gpt_oss``); where no config.json says it, a template written in harmony's markup stands
for a gpt-oss model (``resolve_engine``).

When vLLM changes these steps, this module is the one to update; bench/vllm_peer.py
measures the match against a running server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2 import nodes

from .render import DEFAULT_LIMITS, RenderLimits, copy_request, render

ENGINES = ("vllm", "hf")


class EngineError(ValueError):
    """The engine would reject the request (vLLM answers 400)."""


_CONTENT_FORMATS: dict[str, str] = {}
_CONTENT_FORMATS_KEPT = 64


def content_format(template: str, tree: nodes.Template | None = None) -> str:
    """ "openai" when the template loops over a message's content parts, else "string".
    Kept per template text; ``tree`` is its parse where the caller has one (a proof asks
    first, with the lint's: parsing again was a tenth of a proof)."""
    form = _CONTENT_FORMATS.get(template)
    if form is None:
        if tree is None:
            from .analysis import parse

            tree, _ = parse(template)
        form = _content_format_of(tree)
        if len(_CONTENT_FORMATS) >= _CONTENT_FORMATS_KEPT:
            _CONTENT_FORMATS.clear()
        _CONTENT_FORMATS[template] = form
    return form


def _content_format_of(tree: nodes.Template | None) -> str:
    if tree is None:
        return "string"
    # One walk over the statements, with a list for a stack: a loop is a statement, and
    # no expression holds one, so expressions are not entered. jinja2's find_all enters
    # every node through three nested generators a level (find_all, iter_child_nodes,
    # iter_fields): walking a long template that way cost as much as a few renders of it.
    pending: list[nodes.Node] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, nodes.For) and _iterates_content(node.iter):
            return "openai"
        for name in node.fields:
            child = getattr(node, name)
            if isinstance(child, list):
                pending.extend(item for item in child if isinstance(item, nodes.Node) and not isinstance(item, nodes.Expr))
            elif isinstance(child, nodes.Node) and not isinstance(child, nodes.Expr):
                pending.append(child)
    return "string"


def _iterates_content(iterable: nodes.Node) -> bool:
    """Whether a loop runs over ``<something>.content`` or ``<something>['content']``,
    through any filters."""
    while isinstance(iterable, nodes.Filter) and iterable.node is not None:
        iterable = iterable.node
    if isinstance(iterable, nodes.Getattr) and iterable.attr == "content":
        return True
    return isinstance(iterable, nodes.Getitem) and isinstance(iterable.arg, nodes.Const) and iterable.arg.value == "content"


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
    """``mapping`` with the keys of ``order`` first, in that order, then the others as they
    came (a key merged again keeps its place)."""
    return {**{key: mapping[key] for key in order if key in mapping}, **mapping}


def _flatten(content: Any, form: str) -> Any:
    if not isinstance(content, list):
        return content
    if form == "openai":
        return [part if isinstance(part, dict) else {"type": "text", "text": str(part)} for part in content]
    texts = [part.get("text", "") for part in content if isinstance(part, dict) and part.get("type", "text") == "text"]
    return "\n".join(texts)


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
    # What changes below is replaced, never changed in place: ``render`` copies what it is
    # given (the copy a template cannot reach the caller's data through), and copying here
    # as well was a tenth of a proof.
    if engine == "hf":
        return list(messages), merged
    if engine != "vllm":
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    if reasoning_effort is not None:
        merged["reasoning_effort"] = reasoning_effort
        if "enable_thinking" not in (kwargs or {}):
            merged["enable_thinking"] = reasoning_effort != "none"
    form = content_format(template)
    prepared = []
    for message in messages:
        if type(message) is not dict:
            message = copy_request(message)
        # A message that nothing below changes is passed on as it is (render copies it).
        content = message.get("content")
        if isinstance(content, list):
            message = {**message, "content": _flatten(content, form)}
        if message.get("role") == "assistant" and "tool_calls" in message:
            calls = message["tool_calls"]
            if isinstance(calls, list) and not calls:
                message = {key: value for key, value in message.items() if key != "tool_calls"}
            elif isinstance(calls, list):
                message = {**message, "tool_calls": [_validated_call(call) for call in calls]}
        prepared.append(message)
    return prepared, merged


def _validated_call(call: Any) -> dict[str, Any]:
    """An assistant tool call as vLLM's request validation leaves it."""
    if not isinstance(call, dict):
        raise EngineError("assistant tool_calls entries must be objects")
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, dict):
        raise EngineError("chat completions only support assistant tool_calls of type 'function'")
    # vLLM validates the request against the OpenAI types, whose fields come in this
    # order; a template that prints `function|tojson` shows it.
    function = _ordered({**function, "arguments": parse_arguments(function.get("arguments"))}, ("arguments", "name"))
    return _ordered({**call, "function": function}, ("id", "function", "type"))


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: its text, and the token ids the engine itself produced where it
    tokenizes piece by piece (harmony encodes message text as text: a literal "<|end|>" in
    a message is not the special token its decoded text would encode to). ``token_ids`` is
    None where the engine tokenizes the whole text, as vLLM does a template's render."""

    text: str
    token_ids: tuple[int, ...] | None = None


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
) -> Prompt:
    """The prompt ``engine`` would tokenize for a request.

    Without a generation prompt the conversation is taken to end in the model's latest
    reply as it was generated (the prover's "reply as generated").
    """
    if engine == HARMONY:
        from .harmony import harmony_encoding, harmony_prompt_ids

        ids = harmony_prompt_ids(messages, tools, clock(), add_generation_prompt, reasoning_effort)
        return Prompt(harmony_encoding().decode_utf8(ids), tuple(ids))
    prepared, merged = prepare(engine, template, messages, kwargs, reasoning_effort=reasoning_effort)
    text = render(
        template,
        prepared,
        clock=clock,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        special_tokens=special_tokens,
        template_kwargs=merged,
        limits=limits,
    )
    return Prompt(text)


# --- gpt-oss on vLLM: openai-harmony, not the template -------------------------------

HARMONY_MARKUP = ("<|start|>", "<|channel|>", "<|message|>")
# vLLM's settings that change a harmony render, read from the environment as the server does.
ENGINE_ENVIRONMENT = ("VLLM_SYSTEM_START_DATE", "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS")


# The renderer vLLM's server uses for gpt-oss, in place of the template. Not an --engine
# choice: resolve_engine picks it for "vllm" where vLLM would.
HARMONY = "vllm-harmony"


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
    from .harmony import HarmonyTokenizer

    return HarmonyTokenizer()
