"""gpt-oss on vLLM: openai-harmony renders the prompt, not the template.

vLLM's server renders gpt-oss with openai-harmony (package ``oss-harmony``) and never reads
its Jinja template. This module mirrors ``_make_request_with_harmony`` in
``vllm/renderers/online_renderer.py`` and ``vllm/entrypoints/openai/parser/harmony_utils.py``
(``build_harmony_preamble``, ``parse_chat_inputs_to_harmony_messages``,
``auto_drop_analysis_messages``, ``render_for_completion`` and its legacy tool-call
headers). The system message carries the server's date unless ``VLLM_SYSTEM_START_DATE``
pins it; both that variable and ``VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS`` are read from
this process's environment, as the server reads its own. ``engines.resolve_engine`` decides
when vLLM takes this path.
"""

from __future__ import annotations

import os
from datetime import datetime
from functools import lru_cache
from typing import Any

from .base import EngineError


@lru_cache(maxsize=1)
def harmony_encoding():
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding  # noqa: PLC0415 -- 0.3 s: gpt-oss only
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


def _flag(name: str) -> bool:
    return bool(int(os.environ.get(name, "0") or "0"))


def _flatten_text(content: Any) -> str | None:
    """Text parts of a content field joined without separator; None when there are none."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [part if isinstance(part, str) else part.get("text") for part in content if isinstance(part, (str, dict))]
    found: list[str] = [text for text in texts if text is not None]
    return "".join(found) if found else None


def _system_message(date: str, instructions: str | None = None, reasoning_effort: str | None = None):
    from openai_harmony import Message, ReasoningEffort, Role, SystemContent  # noqa: PLC0415 -- 0.3 s: gpt-oss only

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
    from openai_harmony import DeveloperContent, Message, Role, ToolDescription  # noqa: PLC0415 -- 0.3 s: gpt-oss only

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
    from openai_harmony import Author, Message, Role, TextContent  # noqa: PLC0415 -- 0.3 s: gpt-oss only

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
    harmony_encoding()  # first: says how to install openai-harmony when it is missing
    from openai_harmony import HarmonyError  # noqa: PLC0415 -- 0.3 s: gpt-oss only

    history = harmony_history(messages, tools, now, add_generation_prompt, reasoning_effort)
    try:
        return render_by_message(history, add_generation_prompt)
    except HarmonyError as error:
        raise EngineError(f"openai-harmony cannot render the request: {error}") from None


def harmony_history(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    now: datetime,
    add_generation_prompt: bool = True,
    reasoning_effort: str | None = None,
) -> list:
    """The harmony messages vLLM renders for a request: preamble, history, old analysis dropped."""
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
    if add_generation_prompt:
        return _drop_old_analysis(history)
    # The latest reply keeps its own analysis: the model generated it.
    reply = len(history)
    while reply > 0 and history[reply - 1].author.role == "assistant":
        reply -= 1
    return _drop_old_analysis(history[:reply]) + history[reply:]


def render_by_message(history: list, add_generation_prompt: bool) -> list[int]:
    """What openai-harmony's ``render_conversation`` (``..._for_completion``) renders,
    message by message: it renders each message on its own (told whether the conversation
    has function tools) and joins them, then adds ``<|start|>assistant`` for a completion.
    A proof renders every conversation again with one more message, so each message's ids
    are remembered: most of a harmony proof was openai-harmony rendering the same messages.
    ``render_whole_conversation`` is the reference a test compares this with."""
    from openai_harmony import DeveloperContent  # noqa: PLC0415 -- 0.3 s: gpt-oss only

    function_tools = any(
        isinstance(content, DeveloperContent)
        and content.tools
        and content.tools.get("functions")
        and content.tools["functions"].tools
        for message in history
        for content in message.content
    )
    ids: list[int] = []
    for message in history:
        ids += _message_ids(message, bool(function_tools))
    if add_generation_prompt:
        ids += _completion_start()
    return ids


_MESSAGE_IDS: dict[tuple[str, bool], list[int]] = {}
_MESSAGE_IDS_KEPT = 4096  # a proof renders a few hundred distinct messages


def _message_ids(message, function_tools: bool) -> list[int]:
    from openai_harmony import RenderOptions  # noqa: PLC0415 -- 0.3 s: gpt-oss only

    key = (message.to_json(), function_tools)
    ids = _MESSAGE_IDS.get(key)
    if ids is None:
        rendered = harmony_encoding().render(message, RenderOptions(conversation_has_function_tools=function_tools))
        ids = _legacy_tool_call_headers(rendered)  # a header never spans two messages
        if len(_MESSAGE_IDS) >= _MESSAGE_IDS_KEPT:
            _MESSAGE_IDS.clear()
        _MESSAGE_IDS[key] = ids
    return ids


@lru_cache(maxsize=1)
def _completion_start() -> tuple[int, ...]:
    from openai_harmony import Conversation, Role  # noqa: PLC0415 -- 0.3 s: gpt-oss only

    return tuple(harmony_encoding().render_conversation_for_completion(Conversation.from_messages([]), Role.ASSISTANT))


def render_whole_conversation(history: list, add_generation_prompt: bool) -> list[int]:
    """openai-harmony's own conversation render of ``history`` (analysis already dropped)."""
    from openai_harmony import Conversation, RenderConversationConfig, Role  # noqa: PLC0415 -- 0.3 s: gpt-oss only

    encoding, config = harmony_encoding(), RenderConversationConfig(auto_drop_analysis=False)
    conversation = Conversation.from_messages(history)
    if add_generation_prompt:
        ids = encoding.render_conversation_for_completion(conversation, Role.ASSISTANT, config=config)
    else:
        ids = encoding.render_conversation(conversation, config=config)
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
