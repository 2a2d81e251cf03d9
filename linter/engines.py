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
except for gpt-oss: vLLM's server renders it with openai-harmony (package ``oss-harmony``)
and never reads its Jinja template. That path mirrors ``_make_request_with_harmony`` in
``vllm/renderers/online_renderer.py`` and ``vllm/entrypoints/openai/parser/harmony_utils.py``
(``build_harmony_preamble``, ``parse_chat_inputs_to_harmony_messages``,
``auto_drop_analysis_messages``, ``render_for_completion`` and its legacy tool-call
headers). vLLM picks it by the model's ``model_type`` (``gpt_oss``); where no config.json
says it, a template written in harmony's markup stands for a gpt-oss model
(``resolve_engine``). The system message carries the server's date unless
``VLLM_SYSTEM_START_DATE`` pins it; both that variable and
``VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS`` are read from this process's environment, as
the server reads its own.

When vLLM changes these steps, this module is the one to update; bench/vllm_peer.py
measures the match against a running server.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import nodes

from .render import DEFAULT_LIMITS, RenderLimits, render

ENGINES = ("vllm", "hf")


class EngineError(ValueError):
    """The engine would reject the request (vLLM answers 400)."""


@lru_cache(maxsize=64)
def content_format(template: str) -> str:
    """ "openai" when the template loops over a message's content parts, else "string"."""
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
        return copy.deepcopy(messages), merged
    if engine != "vllm":
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    if reasoning_effort is not None:
        merged["reasoning_effort"] = reasoning_effort
        if "enable_thinking" not in (kwargs or {}):
            merged["enable_thinking"] = reasoning_effort != "none"
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


class RenderedPrompt(str):
    """A prompt's text that also carries the token ids the engine itself produced, where it
    tokenizes piece by piece (harmony encodes message text as text: a literal "<|end|>" in
    a message is not the special token its decoded text would encode to)."""

    token_ids: list[int]

    def __new__(cls, text: str, token_ids: list[int]):
        prompt = super().__new__(cls, text)
        prompt.token_ids = token_ids
        return prompt


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
) -> str:
    """The prompt ``engine`` would tokenize for a request, as text.

    Without a generation prompt the conversation is taken to end in the model's latest
    reply as it was generated (the prover's "reply as generated").
    """
    if engine == HARMONY:
        ids = harmony_prompt_ids(messages, tools, clock(), add_generation_prompt, reasoning_effort)
        return RenderedPrompt(harmony_encoding().decode_utf8(ids), ids)
    prepared, merged = prepare(engine, template, messages, kwargs, reasoning_effort=reasoning_effort)
    return render(
        template,
        prepared,
        clock=clock,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        special_tokens=special_tokens,
        template_kwargs=merged,
        limits=limits,
    )


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


@lru_cache(maxsize=1)
def harmony_encoding():
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    except ImportError:
        raise EngineError(
            "vLLM renders gpt-oss with openai-harmony, which is not installed (pip install 'oss-harmony>=0.0.11')"
        ) from None
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


class HarmonyTokenizer:
    """gpt-oss's o200k_harmony as openai-harmony encodes it (its vocabulary is built in), so
    harmony renders measure in tokens without a tokenizer file."""

    def encode(self, text: str) -> list[int]:
        return harmony_encoding().encode(text, allowed_special=_special_tokens(), disallowed_special=())


@lru_cache(maxsize=1)
def _special_tokens() -> frozenset[str]:
    return frozenset(harmony_encoding().special_tokens_set)


def engine_tokenizer(engine: str) -> HarmonyTokenizer | None:
    """The tokenizer an engine brings itself, when it renders without the template."""
    return HarmonyTokenizer() if engine == HARMONY else None


def _flag(name: str) -> bool:
    return bool(int(os.environ.get(name, "0") or "0"))


def _flatten_text(content: Any) -> str | None:
    """Text parts of a content field joined without separator; None when there are none."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [part if isinstance(part, str) else part.get("text") for part in content if isinstance(part, (str, dict))]
    texts = [text for text in texts if text is not None]
    return "".join(texts) if texts else None


def _system_message(date: str, instructions: str | None = None, reasoning_effort: str | None = None):
    from openai_harmony import Message, ReasoningEffort, Role, SystemContent

    content = SystemContent.new()
    if instructions is not None and _flag("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"):
        content = content.with_model_identity(
            f"{content.model_identity}\n{instructions}" if content.model_identity else instructions
        )
    if reasoning_effort is not None:
        if reasoning_effort not in ("low", "medium", "high"):
            raise EngineError(f"reasoning_effort={reasoning_effort!r} is not supported by Harmony (low, medium, high)")
        content = content.with_reasoning_effort(ReasoningEffort[reasoning_effort.upper()])
    # vLLM stamps the server's date here on every request unless VLLM_SYSTEM_START_DATE pins it.
    content = content.with_conversation_start_date(os.environ.get("VLLM_SYSTEM_START_DATE") or date)
    return Message.from_role_and_content(Role.SYSTEM, content)


def _developer_message(instructions: str | None, tools: list[dict[str, Any]] | None):
    from openai_harmony import DeveloperContent, Message, Role, ToolDescription

    content = DeveloperContent.new()
    if instructions is not None and not _flag("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"):
        content = content.with_instructions(instructions)
    functions = []
    for tool in tools or ():
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in ("web_search_preview", "code_interpreter", "container"):
            continue
        if kind != "function" or not isinstance(tool.get("function"), dict):
            raise EngineError(f"tool type {kind!r} is not supported")
        function = tool["function"]
        functions.append(
            ToolDescription.new(
                name=function.get("name", ""),
                description=function.get("description") or "",
                parameters=function.get("parameters"),
            )
        )
    if functions:
        content = content.with_function_tools(functions)
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _harmony_messages(message: dict[str, Any], tool_names: dict[str, str], date: str) -> list:
    """One chat-completions message as the harmony messages vLLM turns it into."""
    from openai_harmony import Author, Message, Role, TextContent

    role = message.get("role")
    reasoning = message.get("reasoning")
    out = []
    if role == "assistant" and message.get("tool_calls"):
        narration = _flatten_text(message.get("content"))
        if narration:
            out.append(Message.from_role_and_content(Role.ASSISTANT, narration).with_channel("commentary"))
        if reasoning:
            out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
        for call in message["tool_calls"]:
            function = call.get("function", {})
            out.append(
                Message.from_role_and_content(Role.ASSISTANT, function.get("arguments") or "")
                .with_channel("commentary")
                .with_recipient(f"functions.{function.get('name', '')}")
                .with_content_type("json")
            )
        return out
    if role == "tool":
        name = tool_names.get(message.get("tool_call_id", ""), "")
        author = Author.new(Role.TOOL, f"functions.{name}")
        text = _flatten_text(message.get("content")) or ""
        return [Message.from_author_and_content(author, text).with_channel("commentary").with_recipient("assistant")]
    if role == "assistant" and reasoning:
        out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
    content = message.get("content") or ""
    parts = (
        [TextContent(text=content)] if isinstance(content, str) else [TextContent(text=part.get("text", "")) for part in content]
    )
    if role == "assistant":
        if parts and parts[0].text:
            out.append(Message.from_role_and_contents(Role.ASSISTANT, parts).with_channel("final"))
    elif role in ("system", "developer"):
        instructions = _flatten_text(message.get("content"))
        if instructions is not None:
            if role == "system" and _flag("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"):
                out.append(_system_message(date, instructions))
            else:
                out.append(_developer_message(instructions, None))
    else:
        out.append(Message.from_role_and_contents(Role(role), parts))
    return out


def _drop_old_analysis(messages: list) -> list:
    """Analysis before the last final answer is dropped: it led to an answer already given."""
    finals = [
        index for index, message in enumerate(messages) if message.author.role == "assistant" and message.channel == "final"
    ]
    last = finals[-1] if finals else -1
    return [message for index, message in enumerate(messages) if not (index < last and message.channel == "analysis")]


@lru_cache(maxsize=1)
def _marker_ids() -> tuple[int, int, int, int]:
    """``<|start|>``, ``<|channel|>``, ``<|constrain|>``, ``<|message|>``."""
    encoding = harmony_encoding()
    return tuple(
        encoding.encode(marker, allowed_special="all")[0]
        for marker in ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>")
    )


def _legacy_tool_call_headers(ids: list[int]) -> list[int]:
    """``<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>``
    becomes ``<|start|>assistant to=functions.f<|channel|>commentary json<|message|>``: vLLM
    writes earlier tool calls in the header gpt-oss was trained on."""
    encoding = harmony_encoding()
    start, channel, constrain, body = _marker_ids()
    out: list[int] = []
    index = 0
    while index < len(ids):
        try:
            if ids[index] != start:
                raise ValueError
            end = ids.index(body, index + 1)
            at_channel = ids.index(channel, index + 1, end)
            at_constrain = ids.index(constrain, at_channel + 1, end)
        except ValueError:
            out.append(ids[index])
            index += 1
            continue
        header = ids[index + 1 : end]
        author = encoding.decode(ids[index + 1 : at_channel])
        channel_and_recipient = encoding.decode(ids[at_channel + 1 : at_constrain])
        content_type = encoding.decode(ids[at_constrain + 1 : end])
        if author == "assistant" and " to=" in channel_and_recipient and channel_and_recipient.endswith(" "):
            channel_name, recipient = channel_and_recipient[:-1].split(" to=", 1)
            if channel_name and recipient and content_type:
                header = (
                    encoding.encode(f"assistant to={recipient}", disallowed_special=())
                    + [channel]
                    + encoding.encode(f"{channel_name} {content_type}", disallowed_special=())
                )
        out += [start, *header, body]
        index = end + 1
    return out


def harmony_prompt_ids(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    now: datetime,
    add_generation_prompt: bool = True,
    reasoning_effort: str | None = None,
) -> list[int]:
    """Token ids vLLM's server renders for a gpt-oss chat-completions request."""
    encoding = harmony_encoding()  # first: says how to install openai-harmony when it is missing
    from openai_harmony import Conversation, HarmonyError, RenderConversationConfig, Role

    messages = [_validated(message) for message in messages]
    date = now.strftime("%Y-%m-%d")
    instructions = None
    if messages and messages[0].get("role") in ("system", "developer"):
        instructions, messages = _flatten_text(messages[0].get("content")), messages[1:]
    system_instructions = instructions if _flag("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS") else None
    developer_instructions = None if system_instructions is not None else instructions
    preamble = [_system_message(date, system_instructions, reasoning_effort)]
    if developer_instructions or tools:
        preamble.append(_developer_message(developer_instructions, tools))
    tool_names = {
        call.get("id"): call.get("function", {}).get("name") for message in messages for call in message.get("tool_calls") or ()
    }
    history = preamble + [part for message in messages for part in _harmony_messages(message, tool_names, date)]
    config = RenderConversationConfig(auto_drop_analysis=False)
    try:
        if add_generation_prompt:
            ids = encoding.render_conversation_for_completion(
                Conversation.from_messages(_drop_old_analysis(history)), Role.ASSISTANT, config=config
            )
        else:
            # The latest reply keeps its own analysis: the model generated it.
            reply = len(history)
            while reply > 0 and history[reply - 1].author.role == "assistant":
                reply -= 1
            ids = encoding.render_conversation(
                Conversation.from_messages(_drop_old_analysis(history[:reply]) + history[reply:]), config=config
            )
    except HarmonyError as error:
        raise EngineError(f"openai-harmony cannot render the request: {error}") from None
    return _legacy_tool_call_headers(ids)


def _validated(message: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's request validation leaves of a message: arguments must be JSON strings,
    and ``reasoning_content`` is read as ``reasoning``."""
    message = dict(message)
    if message.get("role") not in ("system", "developer", "user", "assistant", "tool"):
        raise EngineError(f"openai-harmony has no role {message.get('role')!r}")
    content = message.get("content")
    if not (
        content is None
        or isinstance(content, str)
        or (isinstance(content, list) and all(isinstance(part, dict) for part in content))
    ):
        raise EngineError("message content must be a string or a list of content parts (objects)")
    for call in message.get("tool_calls") or ():
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise EngineError("assistant tool_calls entries must be objects")
        if not isinstance(call["function"].get("arguments"), str):
            raise EngineError("tool-call arguments must be a JSON string (vLLM answers 400)")
    reasoning = message.pop("reasoning_content", None)
    if reasoning is not None and message.get("reasoning") is None:
        message["reasoning"] = reasoning
    return message
