"""vLLM 0.33's chat preprocessing, before the template sees a request.

- ``vllm/renderers/chat_utils/chat_message.py`` ``_postprocess_messages``: in assistant
  messages, tool-call ``arguments`` strings are parsed into mappings (empty or null
  arguments, malformed JSON and JSON that is not an object all become ``{}``), and an
  empty ``tool_calls`` list is dropped (the server's request validation answers 400 to
  arguments that are not strings, measured; ``LLM.chat`` takes them, and so does ``prepare``:
  the server's answer is ``PROFILE.refusal``, which ``request_prompt`` asks first);
- ``ChatCompletionRequest._normalize_messages_before``: a client's ``reasoning_content`` is
  ``reasoning`` before the parser reads it;
- ``renderers/hf.py``: a ``developer`` message becomes ``system`` for a template that never
  names the role, and the system messages are merged into one at the start;
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

When vLLM changes these steps, this module is the one to update: ``PROFILE`` at its end names
the version. tests/test_engine_golden.py holds it to vLLM 0.33.0's own render server, and
``tmpl-lint validate`` checks it against a running one.
"""

from __future__ import annotations

import json
from typing import Any

from jinja2 import nodes

from ..analysis.parsing import parse
from .base import EngineError, EngineProfile

_CONTENT_FORMATS: dict[str, str] = {}
_CONTENT_FORMATS_KEPT = 64


def content_format(template: str, tree: nodes.Template | None = None) -> str:
    """ "openai" when the template loops over a message's content parts, else "string".
    Kept per template text; ``tree`` is its parse where the caller has one (a proof asks
    first, with the lint's: a proof does not parse the template twice)."""
    form = _CONTENT_FORMATS.get(template)
    if form is None:
        if tree is None:
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


# Content part types whose text vLLM's chat parsing keeps, and the field it reads.
_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}


def _content(content: Any, form: str) -> Any:
    """A message's content as vLLM's chat parsing hands it to the template: its text parts
    (a string is one), joined by "\n" for a template that prints content as text, or as
    {"type": "text", "text": ...} parts for one that loops over them ("openai"); a null
    content has none. Other parts (media) pass as sent: not modelled."""
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = content
    else:
        return content
    kept = []
    for part in parts:
        if isinstance(part, str):
            kept.append(part)
        elif isinstance(part, dict) and part.get("type", "text") in _TEXT_PARTS:
            text = part.get(_TEXT_PARTS[part.get("type", "text")])
            if text is not None:  # vLLM skips a text part without text
                kept.append(text)
        elif form == "openai":
            kept.append(part)
    if form == "openai":
        return [{"type": "text", "text": part} if isinstance(part, str) else part for part in kept]
    return "\n".join(part for part in kept if isinstance(part, str))


def _rebuilt(message: Any, form: str) -> dict[str, Any]:
    """A message as vLLM's chat parsing rebuilds it for the template (vllm/entrypoints/
    chat_utils.py: _parse_chat_message_content, _postprocess_messages): role and content;
    an assistant's tool calls (arguments parsed to a mapping; none where the list is
    empty) and `reasoning` (a client's `reasoning_content` where it sent no `reasoning`),
    copied to `reasoning_content`; a tool's tool_call_id and its text parts joined into one string; a `name` or `task` that is a string; a
    developer's tools. Nothing else the client sent reaches the template."""
    if not isinstance(message, dict):
        raise EngineError("messages entries must be objects")
    role = message.get("role")
    content = _content(message.get("content"), form)
    rebuilt: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant":
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            rebuilt["tool_calls"] = [_validated_call(call) for call in calls]
        elif calls is not None and not isinstance(calls, list):
            rebuilt["tool_calls"] = calls
        # ChatCompletionRequest._normalize_messages_before renames a client's
        # `reasoning_content` to `reasoning` (unless `reasoning` is set) before the parser
        # reads `reasoning` and hands it on under both names.
        reasoning = message.get("reasoning")
        if reasoning is None:
            reasoning = message.get("reasoning_content")
        if reasoning is not None:
            rebuilt["reasoning"] = rebuilt["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            rebuilt["tool_call_id"] = message["tool_call_id"]
        if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text" for part in content):
            rebuilt["content"] = "\n".join(part.get("text", "") for part in content)
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            rebuilt[key] = message[key]
    if role == "developer":
        rebuilt["tools"] = message.get("tools")
    return rebuilt


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


def vllm_tools(tools: list[Any] | None) -> list[Any] | None:
    """The tools as vLLM hands them to the template: the ``model_dump()`` of each one's
    request type (ChatCompletionToolsParam, FunctionDefinition), their fields first in
    declared order, unset ones null (a tool without a description has ``description:
    null``), then what else the client sent."""
    if tools is None:
        return None
    dumped = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            dumped.append(tool)  # vLLM answers 400: the request is the client's to fix
            continue
        declared = {key: function.get(key) for key in ("name", "description", "parameters")}
        function = {**declared, **{key: value for key, value in function.items() if key not in declared}}
        others = {key: value for key, value in tool.items() if key not in ("type", "function")}
        dumped.append({"type": tool.get("type", "function"), "function": function, **others})
    return dumped


def prepare(
    template: str,
    messages: list[dict[str, Any]],
    merged: dict[str, Any],
    request_kwargs: dict[str, Any],
    reasoning_effort: str | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and template variables vLLM renders for a request. ``merged``: the
    request's ``chat_template_kwargs`` over the server's defaults; ``reasoning_effort``, the
    request's own field, is handed to the template and, unless the request sets
    ``enable_thinking``, turns thinking on for any effort but "none"."""
    # What changes below is replaced, never changed in place: ``render`` copies what it is
    # given (the copy a template cannot reach the caller's data through), so a second copy
    # here would only cost time.
    if reasoning_effort is not None:
        merged["reasoning_effort"] = reasoning_effort
        if "enable_thinking" not in request_kwargs:
            merged["enable_thinking"] = reasoning_effort != "none"
    form = content_format(template)
    rebuilt = [_rebuilt(message, form) for message in messages]
    if any(message["role"] == "developer" for message in rebuilt) and not _reads_developer(template):
        rebuilt = _systems_consolidated(_developer_as_system(rebuilt))
    return rebuilt, merged


def _reads_developer(template: str) -> bool:
    """vLLM's own test (renderers/hf.py ``_detect_developer_role_support``): the template
    names the role as a quoted string."""
    return '"developer"' in template or "'developer'" in template


def _developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A developer message, for a template without the role, becomes a system message (its
    tools dropped): renderers/hf.py ``_convert_developer_to_system``."""
    return [
        {key: value for key, value in message.items() if key != "tools"} | {"role": "system"}
        if message["role"] == "developer"
        else message
        for message in messages
    ]


def _systems_consolidated(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every system message merged into one at the start, their texts joined by a blank
    line (renderers/hf.py ``_consolidate_system_messages``); unchanged when the only system
    message is already first."""
    texts: list[str] = []
    others: list[dict[str, Any]] = []
    merge = False
    for index, message in enumerate(messages):
        if message["role"] != "system":
            others.append(message)
            continue
        merge = merge or index > 0 or bool(texts)
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "\n".join(
                part if isinstance(part, str) else part["text"]
                for part in content
                if isinstance(part, str) or (isinstance(part, dict) and "text" in part)
            )
        if content:
            texts.append(content)
    if not merge:
        return messages
    return [{"role": "system", "content": "\n\n".join(texts)}, *others]


# --- the server's request validation: what it answers 400 -----------------------------


def _empty_tools(body: dict[str, Any]) -> tuple[str, str] | None:
    # ChatCompletionRequest.check_tool_usage
    if body.get("tools") == []:
        return "tools", "must not be an empty array; give at least one tool or leave the field out"
    return None


def _generation_prompt_and_continue(body: dict[str, Any]) -> tuple[str, str] | None:
    # ChatCompletionRequest.check_generation_prompt (both given); transformers refuses the
    # pair too when add_generation_prompt is left at vLLM's default, true (request_prompt)
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        return "continue_final_message", "cannot be true together with add_generation_prompt"
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", bool: "a boolean", int: "a number", float: "a number"}.get(type(value), "text")


def _message_types(body: dict[str, Any]) -> tuple[str, str] | None:
    """What the request's message types (OpenAI's, and vLLM's CustomChatCompletionMessageParam)
    do not admit: null content outside assistant messages; a tool call without its id, its
    type "function", or a function with a name and arguments as a string (a running vLLM
    0.33.0 answers 400 to each: ``tmpl-lint validate``)."""
    messages = body.get("messages")
    for index, message in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(message, dict):
            continue
        if "content" in message and message["content"] is None and message.get("role") != "assistant":
            return f"messages[{index}].content", "must be a string or a list of content parts, not null"
        calls = message.get("tool_calls")
        for number, call in enumerate(calls if isinstance(calls, list) else ()):
            where = f"messages[{index}].tool_calls[{number}]"
            if not isinstance(call, dict):
                return where, f"must be an object, not {_kind(call)}"
            function = call.get("function")
            for field, value, wanted in (
                ("id", call.get("id"), "a string"),
                ("type", call.get("type"), '"function"'),
                ("function", function, "an object"),
            ):
                if value is None:
                    return f"{where}.{field}", f"is required ({wanted})"
            if call["type"] != "function":
                return f"{where}.type", f'must be "function", not {json.dumps(call["type"])}'
            if not isinstance(function, dict):
                return f"{where}.function", f"must be an object, not {_kind(function)}"
            for field in ("name", "arguments"):
                if field not in function:
                    return f"{where}.function.{field}", "is required (a string)"
                if not isinstance(function[field], str):
                    wanted = "a string of JSON text" if field == "arguments" else "a string"
                    return f"{where}.function.{field}", f"must be {wanted}, not {_kind(function[field])}"
    return None


PROFILE = EngineProfile(
    name="vllm",
    template_message=lambda message: _rebuilt(message, "string"),
    product="vLLM",
    version="0.33.0",
    cache_model="vllm",
    renderer="transformers' apply_chat_template after vLLM's chat parser; openai-harmony for gpt-oss",
    tokenization="the rendered text, add_special_tokens=False",
    validators=(_empty_tools, _generation_prompt_and_continue, _message_types),
)
