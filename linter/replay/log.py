"""The log of ``tmpl-lint replay``: its lines read as calls (a chat completion request, the
reply the model gave, when it arrived), put in arrival order and grouped into sessions.

LOG is JSON lines: a chat completion request body per line, or ``{"request": body,
"response": ..., "timestamp": ...}`` with the response the model gave (an OpenAI chat
completion, a message, or ``{"token_ids": [...]}``; vLLM's ``return_token_ids`` puts the
generated ids in ``choices[0].token_ids``). Requests are replayed in arrival order: by
``timestamp`` where the log has one (a line without one keeps its place), else in file
order. A timestamp is seconds since the epoch (a number, or a string of digits) or ISO
8601; 0 is a time like any other, 1970-01-01 00:00 UTC, and the template's clock shows that
date. Anything else is an error on that line, which is left out. They are grouped into
sessions by a field (``--session-key user``), else by prefix continuity.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..tokenizer import common_prefix_length


class ReplayError(Exception):
    pass


@dataclass
class Call:
    line: int
    body: dict[str, Any]
    response: Any = None
    timestamp: datetime | None = None
    order: int = 0  # arrival position

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body["messages"]

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return self.body.get("tools")

    @property
    def options(self) -> tuple[Any, Any]:
        """What else of the request reaches the template."""
        return self.body.get("chat_template_kwargs") or {}, self.body.get("reasoning_effort")

    @property
    def salt(self) -> str | None:
        salt = self.body.get("cache_salt")
        return salt if isinstance(salt, str) else None


@dataclass
class Session:
    key: str
    calls: list[Call] = field(default_factory=list)


_EPOCH_SECONDS = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def _timestamp(value: Any) -> datetime | None:
    """A logged time (seconds since the epoch, as a number or a string of digits, or ISO
    8601) as naive UTC; None when absent; ValueError when it is no time at all. 0 is
    1970-01-01 00:00: a logger's placeholder cannot be told from it, and guessing the
    current time instead would move the template's clock within a session."""
    if value is None:
        return None
    if isinstance(value, str) and _EPOCH_SECONDS.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=UTC).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"timestamp {value!r} is out of range") from None
    if not isinstance(value, str):
        raise ValueError(f"timestamp {value!r} is neither a number nor a string")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"timestamp {value!r} is not a time: seconds since the epoch or ISO 8601 (2026-03-01T09:00:00Z)"
        ) from None
    return parsed.replace(tzinfo=None) if parsed.tzinfo is None else parsed.astimezone(UTC).replace(tzinfo=None)


# A traffic log is not a template: it may be large, but each line is one request.
MAX_LINE_BYTES = 64 * 1024 * 1024


def read_log(path: Path) -> tuple[list[Call], list[ReplayError]]:
    """The calls of a JSON-lines log in arrival order, and one error for each line that is
    not one (the rest are replayed). A log may be a regular file or a pipe
    (``<(zcat log.gz)``)."""
    import stat

    calls, problems = [], []
    try:
        with open(path, "rb") as stream:
            if not (stat.S_ISREG(os.fstat(stream.fileno()).st_mode) or stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode)):
                raise ReplayError(f"{path}: not a regular file or a pipe")
            number = 0
            while line := stream.readline(MAX_LINE_BYTES + 1):
                number += 1
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    raise ReplayError(f"{path}:{number}: line over {MAX_LINE_BYTES} bytes; stopped reading")
                try:
                    call = _call(number, line)
                except ReplayError as error:
                    problems.append(ReplayError(f"{path}:{number}: {error}"))
                    continue
                if call is not None:
                    calls.append(call)
    except OSError as error:
        raise ReplayError(f"{path}: cannot read: {error.strerror or error}") from None
    return arrival_order(calls), problems


def _call(number: int, line: bytes) -> Call | None:
    from ..diff import request_problem

    if not line.strip():
        return None
    try:
        entry = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ReplayError(f"not valid UTF-8 (byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise ReplayError(f"invalid JSON: {error.msg}") from None
    except RecursionError:
        raise ReplayError("invalid JSON: nested too deeply to read") from None
    if not isinstance(entry, dict):
        raise ReplayError("expected a JSON object")
    body = entry.get("request", entry)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ReplayError("no messages in this request")
    problem = request_problem(body)
    if problem:
        raise ReplayError(problem)
    response = entry.get("response")
    if isinstance(response, dict) and "token_ids" in response:
        ids = response["token_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ReplayError("response token_ids must be a list of token ids (non-negative integers)")
    try:
        # Present is present: a timestamp of 0 is not absent.
        logged = entry.get("timestamp")
        timestamp = _timestamp(body.get("created") if logged is None else logged)
    except ValueError as error:
        raise ReplayError(str(error)) from None
    return Call(number, body, response, timestamp)


def arrival_order(calls: list[Call]) -> list[Call]:
    """By timestamp, stably; a call without one arrives with the call logged before it."""
    latest = datetime.min
    keyed = []
    for call in calls:
        latest = call.timestamp or latest
        keyed.append((latest, call))
    keyed.sort(key=lambda pair: pair[0])
    for order, (_, call) in enumerate(keyed):
        call.order = order
    return [call for _, call in keyed]


def _lookup(document: dict[str, Any], dotted: str) -> Any:
    value: Any = document
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message as a template would see it: no empty fields, and a content of one text
    part as its text (vLLM hands a template the same for both: engines._content)."""
    plain = {key: value for key, value in message.items() if value is not None and value != [] and value != {}}
    content = plain.get("content")
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        part = content[0]
        if part.get("type", "text") == "text" and set(part) <= {"type", "text"} and isinstance(part.get("text"), str):
            plain["content"] = part["text"]
    return plain


def without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in plain(message).items() if key not in REASONING_KEYS}


def sessions(calls: list[Call], session_key: str | None) -> list[Session]:
    """Sessions in order of their first request. Without a key, a request continues the
    session whose last request's messages it starts with (reasoning aside: clients drop
    it); failing that, the most recent of those that open with the same messages (the
    system prompt and first user message) and share most with it: a client that edits
    history stays in its session."""
    found: dict[str, Session] = {}
    if session_key:
        if calls and all(_lookup(call.body, session_key) is None for call in calls):
            raise ReplayError(f"--session-key {session_key}: no request has it, so it names no session")
        for call in calls:
            key = _lookup(call.body, session_key)
            key = "(none)" if key is None else str(key)
            found.setdefault(key, Session(key)).calls.append(call)
        return list(found.values())
    ordered: list[Session] = []
    by_last: dict[int, list[Session]] = defaultdict(list)  # the last request's messages -> sessions
    by_opening: dict[int, list[Session]] = defaultdict(list)
    last: dict[int, tuple[int, list[dict[str, Any]]]] = {}  # id(session) -> (its key in by_last, messages)
    for call in calls:
        messages = [without_reasoning(message) for message in call.messages]
        chain = [0]
        for message in messages:
            chain.append(hash((chain[-1], json.dumps(message, sort_keys=True, default=str))))
        opening = next((i for i, m in enumerate(messages) if m.get("role") not in ("system", "developer")), 0) + 1
        home = None
        for length in range(len(messages) - 1, opening - 1, -1):
            if by_last.get(chain[length]):
                home = by_last[chain[length]][-1]
                break
        if home is None:
            best = opening - 1
            for session in reversed(by_opening[chain[opening]][-32:]):
                previous = last[id(session)][1]
                shared = common_prefix_length(previous, messages)
                if shared > best and len(messages) > shared:
                    home, best = session, shared
        if home is None:
            home = Session(f"session-{len(ordered) + 1}")
            ordered.append(home)
            by_opening[chain[opening]].append(home)
        else:
            by_last[last[id(home)][0]].remove(home)
        home.calls.append(call)
        by_last[chain[-1]].append(home)
        last[id(home)] = (chain[-1], messages)
    return ordered


def reply_message(response: Any) -> dict[str, Any] | None:
    """The assistant message of a logged response, in any of the usual shapes."""
    if not isinstance(response, dict):
        return None
    if isinstance(response.get("choices"), list) and response["choices"]:
        choice = response["choices"][0]
        message = choice.get("message") if isinstance(choice, dict) else None
        return message if isinstance(message, dict) else None
    if response.get("role") == "assistant":
        return response
    return None


def generated_ids(response: Any) -> list[int] | None:
    """The token ids the model generated, where the log has them."""
    if not isinstance(response, dict):
        return None
    ids = response.get("token_ids")
    if ids is None and isinstance(response.get("choices"), list) and response["choices"]:
        choice = response["choices"][0]
        ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if isinstance(ids, list) and all(isinstance(token, int) and not isinstance(token, bool) for token in ids):
        return ids
    return None


def carried_replies(calls: list[Call]) -> list[dict[str, Any] | None]:
    """For each of a session's requests, the assistant message the first later request of
    the session carries right after its messages: the reply the model generated for it, as
    the client sent it back. The message before it must be the request's last (reasoning
    aside); a request that went another way (a message edited, removed, inserted) does not
    carry it there, and vLLM's chained block hashes would not hit its blocks either."""
    with_assistant: dict[int, list[int]] = defaultdict(list)  # position -> later requests with an assistant there
    for number, call in enumerate(calls):
        for position, message in enumerate(call.messages):
            if position and isinstance(message, dict) and message.get("role") == "assistant":
                with_assistant[position].append(number)
    carried: list[dict[str, Any] | None] = []
    for number, call in enumerate(calls):
        count, found = len(call.messages), None
        last = without_reasoning(call.messages[-1]) if isinstance(call.messages[-1], dict) else None
        candidates = with_assistant.get(count, [])
        for later in candidates[bisect.bisect_right(candidates, number) :]:
            before = calls[later].messages[count - 1]
            if last is not None and isinstance(before, dict) and without_reasoning(before) == last:
                found = calls[later].messages[count]
                break
        carried.append(found)
    return carried
