"""The model's own reply as the next request carries it back: tool-call arguments as the
model wrote them, and where a generated reply stops."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..analysis.interpreter import analyze
from ..analysis.separators import argument_separators

COMPACT_SEPARATORS = (",", ":")


def message_fields(message: dict[str, Any]) -> list[tuple[str, str]]:
    """The texts of a message that a template prints, by field name."""
    found: list[tuple[str, str]] = []
    content = message.get("content")
    if isinstance(content, str):
        found.append(("content", content))
    elif isinstance(content, list):
        found.extend(("content", part.get("text", "")) for part in content if isinstance(part, dict))
    reasoning = message.get("reasoning_content") or message.get("reasoning") or message.get("thinking")
    if isinstance(reasoning, str):
        found.append(("reasoning_content", reasoning))
    for call in message.get("tool_calls") or ():
        function = call.get("function", call)
        arguments = function.get("arguments")
        found.append(("tool_calls.function.name", function.get("name") or ""))
        if isinstance(arguments, str):
            found.append(("tool_calls.function.arguments", arguments))
            found.append(("tool_calls.function.arguments", json.dumps(arguments)))  # `tojson` of the string
            parsed = _parsed(arguments)
            if parsed is not None:  # vLLM parses the string into a mapping before rendering
                found.append(("tool_calls.function.arguments", json.dumps(parsed)))
                found.append(("tool_calls.function.arguments", str(parsed)))  # printed as is: {'city': 'Paris'}
        elif arguments is not None:
            found.append(("tool_calls.function.arguments", json.dumps(arguments)))
            found.append(("tool_calls.function.arguments", json.dumps(arguments, separators=(",", ":"))))
            found.append(("tool_calls.function.arguments", str(arguments)))
    return [(name, text) for name, text in found if text]


def _parsed(arguments: str) -> Any:
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


_SEPARATORS: dict[str, tuple[str, str]] = {}
_SEPARATORS_KEPT = 64


def argument_separators_of(template: str, facts=None) -> tuple[str, str]:
    """How the model writes tool-call arguments: compact ({"city":"Paris"}), unless the
    template names the separators it writes them with (a fix with --tool-args-style does).
    Kept per template text; ``facts`` is its analysis where the caller has one (a proof of a
    template just linted analysed it again only for this)."""
    separators = _SEPARATORS.get(template)
    if separators is None:
        separators = argument_separators(facts if facts is not None else analyze(template)) or COMPACT_SEPARATORS
        if len(_SEPARATORS) >= _SEPARATORS_KEPT:
            _SEPARATORS.clear()
        _SEPARATORS[template] = separators
    return separators


@dataclass(frozen=True)
class Reply:
    """The reply as the model generated it (``text``), and the render of call N's
    conversation with the reply as its latest turn (``latest``), whose reply ends at
    ``end``: how the reply renders while it is the newest message."""

    text: str
    latest: str
    end: int


def _argument_forms(reply: dict[str, Any], separators: tuple[str, str]):
    """For each tool call of ``reply`` whose arguments are JSON: the arguments as the model
    wrote them (compact JSON) and the forms a render may print instead (a string passed
    through `tojson`, then the mapping re-serialised with and without ASCII escapes, and the
    mapping printed as it is, `{{ arguments }}` or `| string`: Python's {'city': 'Paris'})."""
    for tool in reply.get("tool_calls") or ():
        arguments = tool["function"]["arguments"]
        mapping = _parsed(arguments) if isinstance(arguments, str) else arguments
        if mapping is None:
            continue
        # (compact too: a template may name compact separators for a model that writes spaced JSON)
        printed = [
            json.dumps(mapping),
            json.dumps(mapping, ensure_ascii=False),
            json.dumps(mapping, separators=(",", ":")),
            str(mapping),
        ]
        if isinstance(arguments, str):
            printed.insert(0, json.dumps(arguments))
        yield json.dumps(mapping, separators=separators), printed


def as_written_in(next_text: str, reply: dict[str, Any], separators: tuple[str, str] = (",", ":")) -> str | None:
    """What a cache that kept the generated tokens holds: ``next_text`` up to where it prints
    the reply's first tool-call arguments, those arguments as the model wrote them, and the
    rest of the reply to its end-of-turn marker. None when the render prints them in no
    form of the mapping (JSON, or Python's own)."""
    for written, printed in _argument_forms(reply, separators):
        found = [(next_text.find(form), form) for form in (written, *printed) if form in next_text]
        if not found:
            continue
        position, form = min(found)
        after = next_text[position + len(form) :]
        marker = STOP_MARKER.search(after)  # the rest of the reply, to its end-of-turn marker
        return next_text[:position] + written + (after[: marker.end()] if marker else "")
    return None


def as_written(text: str, reply: dict[str, Any], separators: tuple[str, str] = (",", ":")) -> str:
    """``text`` with each tool call's arguments as the model wrote them (compact JSON),
    wherever the render printed them otherwise: re-serialised from a mapping, or a string
    passed through `tojson`."""
    for written, printed in _argument_forms(reply, separators):
        for form in printed:
            if form in text:
                text = text.replace(form, written)
                break
    return text


# An end-of-turn marker: <|im_end|>, <|end|>, <|eot_id|>, </s>, [/TOOL_CALLS], <｜end▁of▁sentence｜>...
STOP_MARKER = re.compile(r"<\|[^|<>]{1,40}\|>|<｜[^｜]{1,40}｜>|</s>|<[a-z_]{1,20}\|>|<\|[a-z_]{1,20}>|\[/?[A-Z_]{2,20}\]")


def ends_in_marker(cached_text: str, char: int) -> bool:
    """Whether all that is cached from ``char`` on is the stop marker that ends it."""
    return any(
        marker.start() <= char and marker.end() == len(cached_text)
        for marker in STOP_MARKER.finditer(cached_text, max(0, char - 48))
    )


def stop_after_reply(text: str, reply: dict[str, Any]) -> str:
    """The reply as generated: what the template prints up to the reply's last text, and on
    to the first end-of-turn marker after it, inclusive. The model writes what its turn
    closes with (a tool call's closing brace and tag) and stops at the marker; whatever the
    template adds after it (a newline, an end-of-conversation token) was not generated."""
    end = -1
    for _, value in message_fields(reply):
        for variant in {value, value.strip()}:
            found = text.rfind(variant)
            if found >= 0 and variant:
                end = max(end, found + len(variant))
    if end < 0:  # the template printed none of the reply (a tool call it cannot show)
        first = STOP_MARKER.search(text)
        return text[: first.end()] if first else text
    marker = STOP_MARKER.search(text, end)
    return text[: marker.end()] if marker else text[:end]


def unmarked(reply: str, mark: str) -> str:
    """The reply without the mark the render gives the newest message before its end marker
    (see ``last_message_mark``): the model wrote its text and the marker, not the mark."""
    if not mark:
        return reply
    closing = next((marker for marker in STOP_MARKER.finditer(reply) if marker.end() == len(reply)), None)
    body = reply[: closing.start()] if closing else reply
    if not body.endswith(mark):
        return reply
    return body[: len(body) - len(mark)] + reply[len(body) :]
