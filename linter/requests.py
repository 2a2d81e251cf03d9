"""A chat-completion request as a client sends it: read from a file and checked for what
tmpl-lint can render (``messages``, ``tools``, ``chat_template_kwargs``, ``reasoning_effort``),
its messages as a template sees them, and what a client changed between two requests of a
session. ``diff`` reads its two requests here, and ``replay`` each logged one (a ``Call``
is a request with its place in the log)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from .inputs import SourceError, load_json


class RequestError(Exception):
    pass


@dataclass
class Request:
    body: dict[str, Any]
    path: Path | None = None  # the file it was read from, where it has one

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body["messages"]

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return self.body.get("tools")

    @property
    def kwargs(self) -> dict[str, Any]:
        return self.body.get("chat_template_kwargs") or {}

    @property
    def options(self) -> tuple[Any, Any]:
        """What else of the request reaches the template."""
        return self.kwargs, self.body.get("reasoning_effort")

    @property
    def salt(self) -> str | None:
        salt = self.body.get("cache_salt")
        return salt if isinstance(salt, str) else None


def read_request(path: Path) -> Request:
    try:
        body = load_json(path)
    except SourceError as error:
        raise RequestError(str(error)) from None
    problem = request_problem(body)
    if problem:
        raise RequestError(f"{path}: {problem}")
    return Request(cast(dict[str, Any], body), path)  # a mapping: request_problem says so


def request_problem(body: Any) -> str | None:
    """Why ``body`` is not a chat completion request tmpl-lint can render, or None."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        return "expected a chat completion request with a non-empty messages list"
    if not all(isinstance(message, dict) and isinstance(message.get("role"), str) for message in body["messages"]):
        return "every message must be an object with a role"
    if body.get("tools") is not None and not (
        isinstance(body["tools"], list) and all(isinstance(tool, dict) for tool in body["tools"])
    ):
        return "tools must be a list of objects"
    if body.get("chat_template_kwargs") is not None and not isinstance(body["chat_template_kwargs"], dict):
        return "chat_template_kwargs must be an object"
    if body.get("reasoning_effort") is not None and not isinstance(body["reasoning_effort"], str):
        return "reasoning_effort must be a string"
    return None


# --- messages as a template sees them ---------------------------------------------------

# The names a reasoning block comes back under: vLLM 0.33 returns `reasoning`, SGLang,
# DeepSeek's API and older vLLM `reasoning_content`, others `thinking`.
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message as a template would see it: no empty fields, and a content of one text
    part as its text (vLLM hands a template the same for both: engines.vllm.content_format)."""
    plain = {key: value for key, value in message.items() if value is not None and value != [] and value != {}}
    content = plain.get("content")
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        part = content[0]
        if part.get("type", "text") == "text" and set(part) <= {"type", "text"} and isinstance(part.get("text"), str):
            plain["content"] = part["text"]
    return plain


def without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in plain(message).items() if key not in REASONING_KEYS}


def reasoning_of(message: dict[str, Any]) -> tuple[str, str] | None:
    """A message's reasoning and the name it is under, whichever of REASONING_KEYS that is
    (the first, where several hold text), or None."""
    return next(((key, message[key]) for key in REASONING_KEYS if isinstance(message.get(key), str) and message[key]), None)


def reasoning_fields(messages: list[dict[str, Any]]) -> dict[str, int]:
    """How many of ``messages`` carry reasoning under each of REASONING_KEYS."""
    counts: dict[str, int] = {}
    for message in messages:
        for key in REASONING_KEYS:
            if message.get(key):
                counts[key] = counts.get(key, 0) + 1
    return counts


# --- what a client changed --------------------------------------------------------------


@dataclass(frozen=True)
class ClientChange:
    """The earliest change a client made to what it sent before: a prompt that departs there
    is the client's doing, not the template's."""

    detail: str  # "tools changed", "reasoning dropped", "message removed"...
    message_index: int | None = None  # in the later request's messages, unless ``in_previous``
    role: str | None = None
    # A message removed or moved is numbered where it was, in the earlier request: the
    # later request's message of that number is another one.
    in_previous: bool = False
    moved_to: int | None = None  # where a moved message is in the later request

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cause": "client",
            "detail": self.detail,
            "message_index": self.message_index,
            "role": self.role,
            "field": None,
        }
        if self.in_previous:
            out["numbered_in"] = "previous"  # message_index counts the earlier request's messages
        if self.moved_to is not None:
            out["moved_to"] = self.moved_to
        return out


def client_change(previous: Request, reply: dict[str, Any] | None, request: Request) -> ClientChange | None:
    """What the client changed, if anything: the earliest change it made to the previous
    request's messages (and the reply, where known), tools and options."""
    if (previous.tools or None) != (request.tools or None):
        return ClientChange("tools changed")
    expected = previous.messages + ([reply] if reply is not None else [])
    sent = request.messages
    for index, (old, new) in enumerate(zip(expected, sent)):
        old_plain, new_plain = plain(old), plain(new)
        if old_plain == new_plain:
            continue
        role = old.get("role")
        if index == 0 and role in ("system", "developer"):
            detail = "system prompt changed"
        elif without_reasoning(old) == without_reasoning(new) and any(old_plain.get(key) for key in REASONING_KEYS):
            detail = "reasoning dropped" if not any(new_plain.get(key) for key in REASONING_KEYS) else "reasoning edited"
        elif _same_arguments(old_plain, new_plain):
            detail = "tool-call arguments re-serialized"
        else:
            # The expected message sent later, and the one sent here expected later: moved;
            # only the first: one put before it; only the second: it is gone.
            sent_later = next((later for later in range(index + 1, len(sent)) if plain(sent[later]) == old_plain), None)
            expected_later = any(plain(later) == new_plain for later in expected[index + 1 :])
            if sent_later is not None and expected_later:
                return ClientChange("messages reordered", index, role, in_previous=True, moved_to=sent_later)
            if sent_later is not None:
                return ClientChange("message inserted", index, new.get("role"))
            if expected_later or new.get("role") != role:  # another kind of message in its place: it is gone
                return ClientChange("message removed", index, role, in_previous=True)
            detail = "message edited"
        return ClientChange(detail, index, role)
    if len(sent) < len(expected):
        index = len(sent)
        return ClientChange("message removed", index, expected[index].get("role"), in_previous=True)
    if previous.options != request.options:
        return ClientChange("request options changed")
    return None


def _same_arguments(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Equal but for how tool-call arguments are written."""

    def parsed(message: dict[str, Any]) -> Any:
        calls = []
        for call in message.get("tool_calls") or ():
            function = dict(call.get("function") or {}) if isinstance(call, dict) else {}
            if isinstance(function.get("arguments"), str):
                with contextlib.suppress(ValueError, RecursionError):  # not JSON: compared as the text it is
                    function["arguments"] = json.loads(function["arguments"])
            calls.append({**call, "function": function} if isinstance(call, dict) else call)
        return {**message, "tool_calls": calls}

    return bool(old.get("tool_calls")) and old != new and parsed(old) == parsed(new)
