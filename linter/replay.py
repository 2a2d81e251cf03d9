"""``tmpl-lint replay LOG``: the hit rate a serving engine's prefix cache reports on logged
traffic, and why every prompt token it recomputes is recomputed.

LOG is JSON lines: a chat completion request body per line, or ``{"request": body,
"response": ..., "timestamp": ...}`` with the response the model gave (an OpenAI chat
completion, a message, or ``{"token_ids": [...]}``; vLLM's ``return_token_ids`` puts the
generated ids in ``choices[0].token_ids``). Requests are replayed in arrival order: by
``timestamp`` where the log has one (a line without one keeps its place), else in file
order. A timestamp is seconds since the epoch (a number, or a string of digits) or ISO
8601; 0 is a time like any other, 1970-01-01 00:00 UTC, and the template's clock shows that
date. Anything else is an error on that line, which is left out. They are grouped into sessions by a field (``--session-key user``), else by prefix
continuity.

Two passes:

1. Each session alone (``--jobs`` sessions at a time): every request is rendered as the
   engine renders it and tokenized, only the text after what it shares with the session's
   previous prompt (``PrefixEncoder``); the reply as the model generated it: its logged ids
   or message, else the assistant message the session's next request sends back after it
   (``carried_replies``), else none, which the report says. Where a prompt stops extending what the session's previous request left
   computed, the request is rendered once more with the client's own changes undone (the
   previous messages and reply as they were, its tools and options), to tell the tokens the
   client cost from those the template costs, and the rule and message responsible.
2. All requests in arrival order through one cache model (``kv_cache``: vLLM's block pool,
   SGLang's radix tree or llama.cpp's slots) at each capacity asked for. The headline is the
   engine's own figure: vLLM's "Prefix cache hit rate", hits / queries in tokens over every
   request (``PrefixCacheStats``). Each prompt token not served from cache gets one cause:
   cold (the session had not sent it before), partial block (the engine caches whole blocks
   and computes the last token), template, client, or capacity (its blocks were evicted);
   hits on blocks another session computed (a shared system prompt and tools) are counted
   apart.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import html
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from .engines import engine_tokenizer, prepare, render_prompt, request_prompt
from .engines.base import ENGINES, HARMONY, EngineError, Prompt
from .findings import Finding, Outcome
from .hosted_cache import ANTHROPIC_BREAKPOINTS, HOSTED_MODELS, TimedRequest, breakpoints_of, make_hosted_cache
from .kv_cache import CacheError, CacheModel, LlamaCppSlots, make_cache
from .proofs import AFTER_MESSAGES, BEFORE_MESSAGES, Cause
from .proving.attribution import explaining_code
from .proving.divergence import compare_prompts, generation_prompt_span, last_message_mark, reply_start
from .proving.measure import Measure
from .proving.replies import STOP_MARKER, Reply, stop_after_reply, unmarked
from .render import FrozenClock, RenderError
from .rules import reporting
from .tokenizer import Encoded, PrefixEncoder, Tokenizer, common_prefix_length

# Below this many requests, forking workers costs more than it saves.
PARALLEL_MINIMUM = 200


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
    from .requests import request_problem

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


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message as a template would see it: no empty fields, and a content of one text
    part as its text (vLLM hands a template the same for both: engines._content)."""
    plain = {key: value for key, value in message.items() if value is not None and value != [] and value != {}}
    content = plain.get("content")
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        part = content[0]
        if part.get("type", "text") == "text" and set(part) <= {"type", "text"} and isinstance(part.get("text"), str):
            plain["content"] = part["text"]
    return plain


def _without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in _plain(message).items() if key not in REASONING_KEYS}


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
        messages = [_without_reasoning(message) for message in call.messages]
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


class ReplySource(StrEnum):
    """Where the reply a request generated comes from: vLLM (and SGLang, llama.cpp) cache
    the blocks of every reply, so one left out counts as cold what the engine serves."""

    LOGGED = "logged"
    LATER_REQUEST = "from a later request"  # not logged: the assistant message the session sent back
    LAST = "not modelled, last of its session"  # not logged, and no later request
    UNKNOWN = "not modelled"  # not logged, and no later request of the session sends it back


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
        last = _without_reasoning(call.messages[-1]) if isinstance(call.messages[-1], dict) else None
        candidates = with_assistant.get(count, [])
        for later in candidates[bisect.bisect_right(candidates, number) :]:
            before = calls[later].messages[count - 1]
            if last is not None and isinstance(before, dict) and _without_reasoning(before) == last:
                found = calls[later].messages[count]
                break
        carried.append(found)
    return carried


# --- why a prompt departs from what its session computed -----------------------------


class TokenCause(StrEnum):
    """Where each prompt token came from, or why it was computed."""

    HIT = "hit"  # from blocks this session's requests computed
    SHARED = "shared-hit"  # from blocks another session computed (a shared system prompt, tools)
    COLD = "cold"  # first sight: the session had not sent these tokens before
    PARTIAL = "partial-block"  # sent before, but in a block the engine does not cache, or the last token
    TEMPLATE = "template"  # the template renders the same history differently
    CLIENT = "client"  # the client changed what it sent
    CAPACITY = "capacity"  # cached once, evicted since


LOST = (TokenCause.TEMPLATE, TokenCause.CLIENT, TokenCause.CAPACITY)
CAUSE_NOTES = {
    TokenCause.HIT: "from blocks the session's own requests computed",
    TokenCause.SHARED: "from blocks another session computed (a shared system prompt and tools)",
    TokenCause.COLD: "first sight: not sent by the session before",
    TokenCause.PARTIAL: "sent before, but in a partial block, or the one token the engine always computes",
    TokenCause.TEMPLATE: "the template rendered the same history differently",
    TokenCause.CLIENT: "the client changed what it sent",
    TokenCause.CAPACITY: "cached once, evicted before the session came back",
}


@dataclass(frozen=True)
class Departure:
    """Why a prompt stops extending what its session's previous request left computed."""

    cause: TokenCause  # TEMPLATE or CLIENT
    detail: str  # "PC002 history-rewrite", "reasoning dropped"...
    message_index: int | None = None  # in this request's messages, unless ``in_previous``
    role: str | None = None
    field: str | None = None
    before: str = ""
    after: str = ""
    # A message removed or moved is numbered where it was, in the previous request: this
    # request's message of that number is another one.
    in_previous: bool = False
    moved_to: int | None = None  # where a moved message is in this request

    def describe(self) -> str:
        where = ""
        if self.message_index is not None:
            parts = ", ".join(part for part in (self.role, self.field) if part)
            where = f", message {self.message_index}" + (" of the previous request" if self.in_previous else "")
            where += f" ({parts})" if parts else ""
            where += f", now message {self.moved_to}" if self.moved_to is not None else ""
        elif self.field in (BEFORE_MESSAGES, AFTER_MESSAGES):
            where = ", before the first message" if self.field == BEFORE_MESSAGES else ", after the last message"
        return f"{self.cause} {self.detail}{where}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cause": str(self.cause),
            "detail": self.detail,
            "message_index": self.message_index,
            "role": self.role,
            "field": self.field,
        }
        if self.in_previous:
            out["numbered_in"] = "previous"  # message_index counts the previous request's messages
        if self.moved_to is not None:
            out["moved_to"] = self.moved_to
        if self.before or self.after:
            out["renders"] = {"before": self.before, "after": self.after}
        return out


UNCERTAIN = "(cause uncertain: the reply is logged as token ids that no message renders as)"


def client_change(previous: Call, reply: dict[str, Any] | None, call: Call) -> Departure | None:
    """What the client changed, if anything: the earliest change it made to the previous
    request's messages (and the reply, where logged), tools and options."""
    if (previous.tools or None) != (call.tools or None):
        return Departure(TokenCause.CLIENT, "tools changed")
    expected = previous.messages + ([reply] if reply is not None else [])
    sent = call.messages
    for index, (old, new) in enumerate(zip(expected, sent)):
        old_plain, new_plain = _plain(old), _plain(new)
        if old_plain == new_plain:
            continue
        role = old.get("role")
        if index == 0 and role in ("system", "developer"):
            detail = "system prompt changed"
        elif _without_reasoning(old) == _without_reasoning(new) and any(old_plain.get(key) for key in REASONING_KEYS):
            detail = "reasoning dropped" if not any(new_plain.get(key) for key in REASONING_KEYS) else "reasoning edited"
        elif _same_arguments(old_plain, new_plain):
            detail = "tool-call arguments re-serialized"
        else:
            # The expected message sent later, and the one sent here expected later: moved;
            # only the first: one put before it; only the second: it is gone.
            sent_later = next((later for later in range(index + 1, len(sent)) if _plain(sent[later]) == old_plain), None)
            expected_later = any(_plain(later) == new_plain for later in expected[index + 1 :])
            if sent_later is not None and expected_later:
                return Departure(TokenCause.CLIENT, "messages reordered", index, role, in_previous=True, moved_to=sent_later)
            if sent_later is not None:
                return Departure(TokenCause.CLIENT, "message inserted", index, new.get("role"))
            if expected_later or new.get("role") != role:  # another kind of message in its place: it is gone
                return Departure(TokenCause.CLIENT, "message removed", index, role, in_previous=True)
            detail = "message edited"
        return Departure(TokenCause.CLIENT, detail, index, role)
    if len(sent) < len(expected):
        index = len(sent)
        return Departure(TokenCause.CLIENT, "message removed", index, expected[index].get("role"), in_previous=True)
    if previous.options != call.options:
        return Departure(TokenCause.CLIENT, "request options changed")
    return None


def _same_arguments(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Equal but for how tool-call arguments are written."""

    def parsed(message: dict[str, Any]) -> Any:
        calls = []
        for call in message.get("tool_calls") or ():
            function = dict(call.get("function") or {}) if isinstance(call, dict) else {}
            if isinstance(function.get("arguments"), str):
                with contextlib.suppress(json.JSONDecodeError):
                    function["arguments"] = json.loads(function["arguments"])
            calls.append({**call, "function": function} if isinstance(call, dict) else call)
        return {**message, "tool_calls": calls}

    return bool(old.get("tool_calls")) and old != new and parsed(old) == parsed(new)


# --- pass 1: each session alone ------------------------------------------------------


@dataclass
class Trace:
    """One request as its session's replay saw it: its prompt's token ids (as the tokens it
    shares with the session's previous prompt, and the rest), and where and why it departs
    from what the previous request left computed."""

    order: int
    line: int
    session: int
    shared: int
    tail: list[int]
    prompt_tokens: int
    generated: list[int] = field(default_factory=list)
    salt: str | None = None
    first: bool = True
    reply: ReplySource = ReplySource.LOGGED
    previous: int = 0  # tokens the session's previous request left computed
    departure: int | None = None  # the first prompt token that does not extend them
    template_departure: int | None = None  # the same with the client's changes undone
    reasons: tuple[Departure, ...] = ()  # the client's change (if it came first), then the template's
    time: float | None = None  # seconds since the epoch, as logged: hosted caches expire by it
    breakpoints: tuple = ()  # Anthropic's cache_control marks as token positions (hosted_cache.Breakpoint)
    block_ends: tuple[int, ...] = ()  # and the content-block ends before them


@dataclass
class _Previous:
    call: Call
    prompt: Encoded
    generated: list[int]
    generated_text: str
    reply: dict[str, Any] | None
    carried: dict[str, Any] | None = None  # the message a later request sends back for the reply


class Tracer:
    """Renders and tokenizes each request of a session, and says why a prompt departs."""

    def __init__(
        self,
        template: str,
        tokenizer: Tokenizer | None,
        special_tokens: dict[str, Any],
        engine: str,
        server_ids: Callable[[dict[str, Any]], list[int]] | None = None,
        server_kwargs: dict[str, Any] | None = None,
    ):
        self.template = template
        self.server_kwargs = server_kwargs  # the server's --default-chat-template-kwargs
        self.measure = Measure(tokenizer or engine_tokenizer(engine))
        self.encoder = PrefixEncoder(tokenizer)
        self.special = special_tokens
        self.engine = engine
        self.server_ids = server_ids
        self.clock = FrozenClock(datetime.now())
        self.marks = False  # place Anthropic's cache_control marks (--cache-model anthropic)

    @functools.cached_property
    def findings(self) -> list[Finding]:
        """The template's findings, which name the rule of each departure; linted where the
        renders run (a limited child), the first time a prompt departs."""
        return template_findings(self.template)

    @property
    def unit(self) -> str:
        return "token" if self.server_ids else self.measure.unit

    def render(self, call: Call, messages: list[dict[str, Any]], generation_prompt: bool) -> Prompt:
        self.clock.set(call.timestamp or datetime.now())
        try:
            return render_prompt(
                self.engine,
                self.template,
                messages,
                clock=self.clock,
                tools=call.tools,
                kwargs=call.body.get("chat_template_kwargs"),
                add_generation_prompt=generation_prompt,
                special_tokens=self.special,
                reasoning_effort=call.body.get("reasoning_effort"),
                server_kwargs=self.server_kwargs,
            )
        except EngineError as error:
            raise RenderError(str(error)) from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as error:
            # A logged request of a shape the engine's preprocessing does not expect.
            raise RenderError(f"{type(error).__name__}: {error}") from None

    def request(self, call: Call) -> Prompt:
        """The logged request as the engine renders it (engines.request_prompt, as ``render``
        does), or RenderError saying why the engine refuses it."""
        self.clock.set(call.timestamp or datetime.now())
        try:
            return request_prompt(
                self.engine,
                self.template,
                call.body,
                clock=self.clock,
                special_tokens=self.special,
                server_kwargs=self.server_kwargs,
            )
        except EngineError as error:
            raise RenderError(str(error)) from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as error:
            raise RenderError(f"{type(error).__name__}: {error}") from None

    def prompt(self, call: Call, previous: Encoded | None) -> Encoded:
        rendered = self.request(call)
        if self.server_ids:
            return Encoded(rendered.text, self.server_ids(call.body))
        if rendered.token_ids is not None:
            return Encoded(rendered.text, list(rendered.token_ids))  # the engine's own tokenization
        return self.encoder.encode(rendered.text, previous)

    def generated(self, call: Call, prompt: str, reply: dict[str, Any] | None) -> tuple[list[int], str]:
        """The reply as the model generated it: its logged token ids, else the template's
        render of it after the generation prompt, up to its end-of-turn marker."""
        ids = generated_ids(call.response)
        if ids is not None:
            return ids, self.decoded(ids)
        if reply is None:
            return [], ""
        return self.as_generated(call, prompt, reply)

    def decoded(self, ids: list[int]) -> str:
        tokenizer = self.measure.tokenizer
        return tokenizer.backend.decode(ids, skip_special_tokens=False) if isinstance(tokenizer, Tokenizer) else ""

    def reply_of(self, call: Call, carried: dict[str, Any] | None, last: bool) -> tuple[dict[str, Any] | None, ReplySource]:
        """The message ``call``'s reply is, and where it comes from: the log's message; for
        ids alone, none yet (``message_of_ids``); else ``carried``, the assistant
        message a later request of the session sends after the request's messages (the reply
        as the client sent it back: what it dropped, such as reasoning, is not known), else
        none."""
        logged = reply_message(call.response)
        if logged is not None:
            return logged, ReplySource.LOGGED
        if generated_ids(call.response) is not None:
            return None, ReplySource.LOGGED  # its message is found where a prompt departs (``attribute``)
        if carried is not None:
            return carried, ReplySource.LATER_REQUEST
        return None, ReplySource.LAST if last else ReplySource.UNKNOWN

    def message_of_ids(self, call: Call, prompt: str, ids: list[int], carried: dict[str, Any] | None) -> dict[str, Any] | None:
        """The message a reply logged as token ids only is, where one renders as exactly
        those ids decoded: the message the next request carries, or it with the reasoning
        the ids hold (a client that drops reasoning sends it back without), or, with no such
        message (the client edited it), the decoded text split into reasoning and content.
        None where none does: a departure is then named without the reply's message, and
        said to be uncertain."""
        text = self.decoded(ids)
        if not text:
            return None
        reasoning, content = _split_reasoning(_unterminated(text))
        # Under both names: vLLM reads `reasoning` back, transformers' templates `reasoning_content`.
        split = {"reasoning": reasoning, "reasoning_content": reasoning} if reasoning is not None else {}
        candidates = [{"role": "assistant", "content": content} | split]
        if carried is not None:
            candidates[:0] = [carried] + ([_without_reasoning(carried) | split] if split else [])
        for candidate in candidates:
            try:
                if self.as_generated(call, prompt, candidate)[1] == text:
                    return candidate
            except RenderError:
                continue
        return None

    def as_generated(self, call: Call, prompt: str, reply: dict[str, Any]) -> tuple[list[int], str]:
        """The template's render of ``reply`` after the generation prompt, up to its
        end-of-turn marker: the reply as the model generated it."""
        reply = {key: value for key, value in reply.items() if value is not None}
        with_reply = self.render(call, call.messages + [reply], False).text
        start, mark = self.reply_start(call, prompt, with_reply)
        text = with_reply[start:]
        text = unmarked(_as_generated(_logged_arguments(text, reply), reply), mark)
        return self.measure.ids(text), text

    def reply_start(self, call: Call, prompt: str, with_reply: str) -> tuple[int, str]:
        """Where the reply begins in ``with_reply``, the render ending with it, and the mark
        that render gives it as the newest message, as the prover finds them: where the two
        part before ``prompt`` ends (a `loop.last` mark on the last message), the reply
        still starts after the generation prompt, and the model never wrote the mark."""
        bare = None
        if common_prefix_length(prompt, with_reply) < len(prompt):
            bare = self.render(call, call.messages, False).text
        return reply_start(prompt, with_reply, bare), last_message_mark(prompt, with_reply, bare)

    def latest(self, previous: _Previous) -> Reply | None:
        """How the previous request's logged reply renders while it is the newest message
        (the prover's ``Reply``), or None where no reply is logged."""
        if previous.reply is None:
            return None
        reply = {key: value for key, value in previous.reply.items() if value is not None}
        with_reply = self.render(previous.call, previous.call.messages + [reply], False).text
        start, _mark = self.reply_start(previous.call, previous.prompt.text, with_reply)
        text = with_reply[start:]
        return Reply(text, with_reply, start + len(_as_generated(text, reply)))

    def trace(self, index: int, session: Session) -> tuple[list[Trace], list[tuple[int, str]]]:
        """The session's traces, and (line, why) for each request the template cannot render:
        the engine answers 400 and caches nothing, and the session goes on without it."""
        traces, problems = [], []
        previous: _Previous | None = None
        carried = carried_replies(session.calls)
        for position, call in enumerate(session.calls):
            try:
                prompt = self.prompt(call, previous.prompt if previous else None)
            except RenderError as error:
                problems.append((call.line, f"the template fails on this request: {error}"))
                continue
            last = position == len(session.calls) - 1
            reply, source = self.reply_of(call, carried[position], last)
            try:
                generated, generated_text = self.generated(call, prompt.text, reply)
            except RenderError as error:
                problems.append((call.line, f"the template fails on this request's reply: {error}"))
                generated, generated_text = [], ""
                if source is ReplySource.LATER_REQUEST:
                    source = ReplySource.UNKNOWN
            shared = common_prefix_length(previous.prompt.ids, prompt.ids) if previous else 0
            trace = Trace(call.order, call.line, index, shared, prompt.ids[shared:], len(prompt.ids), generated, call.salt)
            trace.reply = source
            if call.timestamp is not None:
                trace.time = call.timestamp.replace(tzinfo=UTC).timestamp()
            if self.marks:
                # The API answers 400 to marks it does not take, and caches nothing of the request.
                try:
                    trace.breakpoints, trace.block_ends = breakpoints_of(call.body, prompt.ids, self._message_ids(call))
                except (RenderError, CacheError) as error:
                    problems.append((call.line, f"its cache_control marks cannot be placed: {error}; left out"))
                    continue
                if len(trace.breakpoints) > ANTHROPIC_BREAKPOINTS:
                    problems.append(
                        (call.line, f"{len(trace.breakpoints)} cache_control breakpoints: the API allows 4 (400); left out")
                    )
                    continue
            if previous is not None:
                try:
                    self.attribute(trace, previous, call, prompt)
                except RenderError as error:  # the request with the client's changes undone
                    problems.append((call.line, f"the template fails on this request as first sent: {error}"))
            traces.append(trace)
            previous = _Previous(call, prompt, generated, generated_text, reply, carried[position])
        return traces, problems

    def _message_ids(self, call: Call) -> Callable[[list[dict[str, Any]]], list[int]]:
        """The token ids of some messages of ``call`` rendered with no generation prompt."""

        def ids(messages: list[dict[str, Any]]) -> list[int]:
            rendered = self.render(call, messages, False)
            if rendered.token_ids is not None:
                return list(rendered.token_ids)
            return self.measure.ids(rendered.text)

        return ids

    def attribute(self, trace: Trace, previous: _Previous, call: Call, prompt: Encoded) -> None:
        trace.first = False
        computed = previous.generated[:-1]  # the last sampled token is never fed back
        trace.previous = len(previous.prompt.ids) + len(computed)
        departure = _departure(previous.prompt.ids, computed, prompt.ids, trace.shared)
        if departure is None:
            return
        trace.departure = departure
        ids = generated_ids(previous.call.response)
        if previous.reply is None and ids is not None:
            previous.reply = self.message_of_ids(previous.call, previous.prompt.text, ids, previous.carried)
        change = client_change(previous.call, previous.reply, call)
        if change is None:
            clean, clean_messages = prompt, call.messages
        else:
            # The request as a client that changed nothing would have sent it.
            expected = previous.call.messages + ([previous.reply] if previous.reply is not None else [])
            clean_messages = expected + call.messages[len(expected) :]
            body = {key: value for key, value in call.body.items() if key not in ("tools", "chat_template_kwargs")}
            body.update({key: previous.call.body[key] for key in ("tools", "chat_template_kwargs") if key in previous.call.body})
            body["messages"] = clean_messages
            body.pop("reasoning_effort", None)
            if "reasoning_effort" in previous.call.body:
                body["reasoning_effort"] = previous.call.body["reasoning_effort"]
            clean = self.prompt(replace(call, body=body), previous.prompt)
        template_departure = departure if clean is prompt else _departure(previous.prompt.ids, computed, clean.ids)
        trace.template_departure = template_departure
        reasons = []
        if change is not None and (template_departure is None or template_departure > departure):
            reasons.append(change)
        if template_departure is not None:
            reasons.append(self.template_reason(previous, clean, clean_messages))
        if previous.reply is None and ids is not None:
            # The reply is ids no message renders as: what the client changed in it, and
            # whether the template rewrites it, cannot be told from the generation prompt's.
            reasons = [replace(reason, detail=f"{reason.detail} {UNCERTAIN}") for reason in reasons]
        trace.reasons = tuple(reasons)

    def template_reason(self, previous: _Previous, prompt: Encoded, messages: list[dict[str, Any]]) -> Departure:
        known = not self.server_ids
        if self.engine in ENGINES:  # locate the divergence in the messages as the template saw them
            messages = prepare(self.engine, self.template, messages)[0]
        cached_text = (
            previous.prompt.text + previous.generated_text
            if known and (previous.generated_text or not previous.generated)
            else None
        )
        opener, latest = None, None
        if cached_text is not None:
            # Where the previous prompt's generation prompt starts, and how its reply rendered
            # while it was the newest message, as check finds them: a divergence before the
            # opener is in the last message's closing markup; one in a reply that renders
            # otherwise once a message follows it is a rewrite of that reply.
            opener = generation_prompt_span(previous.prompt.text, self.render(previous.call, previous.call.messages, False).text)
            latest = self.latest(previous)
        divergence = compare_prompts(
            "replay",
            0,
            "b" if previous.generated else "a",
            cached_text,
            previous.prompt.ids + previous.generated[:-1],
            prompt.text if known else None,
            prompt.ids,
            messages,
            len(previous.call.messages),
            self.unit,
            1,
            opener,
            latest=latest,
        )
        if divergence.cause == Cause.UNKNOWN:
            code = "rule unknown"
        elif self.engine == HARMONY:  # openai-harmony renders the model with its own code
            code = reporting(Outcome.ENGINE_RENDER_UNSTABLE).RULE.code
        else:
            code = explaining_code(divergence, self.findings)
        return Departure(
            TokenCause.TEMPLATE,
            f"{code} {divergence.cause}",
            divergence.message_index,
            divergence.role,
            divergence.field,
            divergence.before,
            divergence.after,
        )


# A reasoning block's closing tag: </think>, </thinking>, </reasoning>...
REASONING_END = re.compile(r"</([^<>\s]*(?:think|thought|reason)[^<>\s]*)>", re.IGNORECASE)


def _split_reasoning(text: str) -> tuple[str | None, str]:
    """A generated text as (reasoning, content), as a reasoning parser splits it: the text
    before the first closing reasoning tag (its opening tag, where the model wrote it,
    left out; a generation prompt may have written it), and what follows. (None, text)
    without one."""
    end = REASONING_END.search(text)
    if end is None:
        return None, text
    reasoning = text[: end.start()]
    opening = f"<{end.group(1)}>"
    if reasoning.lstrip().startswith(opening):
        reasoning = reasoning.lstrip()[len(opening) :]
    return reasoning.strip("\n"), text[end.end() :].lstrip("\n")


def _unterminated(text: str) -> str:
    """``text`` without the end-of-turn marker it ends with."""
    ending = [found for found in STOP_MARKER.finditer(text, max(0, len(text) - 64)) if found.end() == len(text)]
    return text[: ending[0].start()] if ending else text


def _as_generated(text: str, reply: dict[str, Any]) -> str:
    """The reply as the model generated it: what the template prints for it, up to the first
    end-of-turn marker after its last text. A tool call's closing markup (``}``,
    ``</tool_call>``) comes before that marker and was generated too; the prover's
    ``stop_after_reply`` takes a marker only right after the last text."""
    cut = stop_after_reply(text, reply)
    if any(found.end() == len(cut) for found in STOP_MARKER.finditer(cut, max(0, len(cut) - 64))):
        return cut  # it ends with its marker already
    marker = STOP_MARKER.search(text, len(cut))
    return cut if marker is None else text[: marker.end()]


def _logged_arguments(text: str, reply: dict[str, Any]) -> str:
    """``text`` with each tool call's arguments as the log has them, the string the model
    wrote, where the template printed them re-serialised from the mapping the engine parsed
    them into: in any spacing, key order or escaping (``tojson``'s default, a fix's compact
    ``separators=(",", ":")``, gpt-oss's compact form). Each call's arguments are looked for
    after the previous call's; a template that prints them otherwise (key by key, as XML)
    keeps its text, having no JSON of them to swap."""
    decoder = json.JSONDecoder()
    start = 0
    for tool in reply.get("tool_calls") or ():
        arguments = (tool.get("function") or {}).get("arguments") if isinstance(tool, dict) else None
        if not isinstance(arguments, str):
            continue
        try:
            wanted = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            continue
        if not isinstance(wanted, dict):
            continue  # vLLM hands the template {} for these: nothing of the string is printed
        canonical = json.dumps(wanted, sort_keys=True)
        for position in range(start, len(text)):
            if text[position] != "{":
                continue
            try:
                found, end = decoder.raw_decode(text, position)
            except (json.JSONDecodeError, RecursionError):
                continue
            # Compared as canonical JSON: Python's == takes 1 for true and 1.0 for 1.
            if isinstance(found, dict) and json.dumps(found, sort_keys=True) == canonical:
                text = text[:position] + arguments + text[end:]
                start = position + len(arguments)
                break
    return text


def _departure(prompt: list[int], computed: list[int], following: list[int], shared: int | None = None) -> int | None:
    """The first token of ``following`` that does not extend ``prompt + computed``, or None."""
    if shared is None:
        shared = common_prefix_length(prompt, following)
    if shared < len(prompt):
        return shared if shared < len(following) else None
    extra = common_prefix_length(computed, following[len(prompt) : len(prompt) + len(computed)])
    position = len(prompt) + extra
    return position if extra < len(computed) and position < len(following) else None


def template_findings(template: str) -> list[Finding]:
    """The findings a check of ``template`` reports: the same that name each divergence in check."""
    from .checker import lint_source
    from .inputs import TemplateSource

    return lint_source(TemplateSource(Path("replay.jinja"), None, template, "jinja"))


def _trace_group(tracer: Tracer, groups: list[Session], indices: list[int]) -> tuple[list[Trace], list[tuple[int, str]]]:
    traces, problems = [], []
    for index in indices:
        traced, failed = tracer.trace(index, groups[index])
        traces.extend(traced)
        problems.extend(failed)
    return traces, problems


def trace_sessions(tracer: Tracer, groups: list[Session], jobs: int = 1) -> tuple[list[Trace], list[tuple[int, str]]]:
    """Every request's trace in arrival order, and the requests the template refused.

    Rendering runs untrusted template code, so it runs in limited child processes
    (isolation.py), ``jobs`` of them at once, each with a share of the sessions (the
    sessions with the most requests first, each to the least loaded share)."""
    from .isolation import parallel_map, run_isolated

    requests = sum(len(group.calls) for group in groups)
    shares = max(1, min(jobs, len(groups))) if requests >= PARALLEL_MINIMUM else 1
    loads, parts = [0] * shares, [[] for _ in range(shares)]
    for index in sorted(range(len(groups)), key=lambda i: len(groups[i].calls), reverse=True):
        lightest = loads.index(min(loads))
        parts[lightest].append(index)
        loads[lightest] += len(groups[index].calls)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the children are forked
    import gc

    gc.freeze()  # the log's objects, inherited: no collection in a child walks (and copies) them
    try:
        done = parallel_map(lambda part: run_isolated(_trace_group, (tracer, groups, part), seconds=None), parts, shares)
    finally:
        gc.unfreeze()
    traces = [trace for traced, _ in done for trace in traced]
    traces.sort(key=lambda trace: trace.order)
    return traces, sorted(problem for _, failed in done for problem in failed)


# --- pass 2: all requests through one cache ------------------------------------------


def _blocks(count: int, size: int) -> int:
    return count // size * size


def split_tokens(trace: Trace, hit: int, shared: int, granularity: int) -> Counter:
    """Every prompt token of a request by cause (see ``TokenCause``)."""
    size = trace.prompt_tokens
    split = Counter({TokenCause.HIT: hit - shared, TokenCause.SHARED: shared})
    if trace.first:
        split[TokenCause.COLD] = size - hit
        return split
    previous, cap = trace.previous, size - 1
    departure = min(previous, size) if trace.departure is None else trace.departure
    reusable = _blocks(min(departure, previous, cap), granularity)  # the session's own, up to the departure
    ideal = _blocks(min(previous, cap), granularity)  # the session's own, had nothing departed
    low, middle, high = (max(hit, mark) for mark in (reusable, ideal, min(previous, size)))
    split[TokenCause.CAPACITY] = low - hit
    lost = middle - low
    client = 0
    if any(reason.cause is TokenCause.CLIENT for reason in trace.reasons):
        template_at = previous if trace.template_departure is None else trace.template_departure
        client = min(max(hit, _blocks(min(template_at, previous, cap), granularity)), middle) - low
    split[TokenCause.CLIENT] = client
    split[TokenCause.TEMPLATE] = lost - client
    split[TokenCause.PARTIAL] = high - middle
    split[TokenCause.COLD] = size - high
    return split


@dataclass
class SessionFigures:
    key: str
    requests: int = 0
    tokens: Counter = field(default_factory=Counter)
    cumulative_lost: list[int] = field(default_factory=list)
    first_departure: tuple[Trace, int] | None = None  # the trace and its request number in the session

    @property
    def lost(self) -> int:
        return sum(self.tokens[cause] for cause in LOST)


@dataclass
class Summary:
    """What one cache model made of the log at one capacity."""

    cache_model: str
    metric: str
    unit: str
    granularity: int
    capacity_blocks: int | None
    requests: int = 0
    sessions: int = 0
    queries: int = 0
    hits: int = 0
    steady_queries: int = 0
    steady_hits: int = 0
    tokens: Counter = field(default_factory=Counter)
    departures: Counter = field(default_factory=Counter)  # (cause, detail) -> tokens
    departure_requests: Counter = field(default_factory=Counter)  # (cause, detail) -> requests
    per_session: list[SessionFigures] = field(default_factory=list)
    sweep: list[Summary] = field(default_factory=list)
    error: str | None = None  # the capacity could not hold a request
    replies: Counter = field(default_factory=Counter)  # ReplySource -> requests
    bounded: bool = False  # the cache holds less than everything: replies take room in it
    per_request: list[tuple[int, int, int]] = field(default_factory=list)  # (log line, prompt tokens, hit tokens)
    engine: str = ""  # whose request handling rendered the log, and its version (engines.EngineProfile.label)

    @property
    def unmodelled_replies(self) -> int:
        return self.replies[ReplySource.LAST] + self.replies[ReplySource.UNKNOWN]

    @property
    def engine_figure(self) -> bool:
        """Whether the hit rate is the engine's own figure. The engine caches every reply
        (but its last token). A reply is not modelled only where no later request of its
        session sends it back, so in an unbounded cache nothing of the session could hit its
        blocks (chained hashes: only a request sending the same prompt and reply could); in
        a bounded one its blocks take room and evict others."""
        return not (self.bounded and self.unmodelled_replies)

    @property
    def metric_label(self) -> str:
        if self.engine_figure:
            return self.metric
        return f"hits / queries; not {self.metric}: the engine caches the replies not modelled"

    def replies_note(self) -> str | None:
        """What of the replies the figures model, where not all were logged."""
        parts = []
        if self.replies[ReplySource.LATER_REQUEST]:
            count = self.replies[ReplySource.LATER_REQUEST]
            parts.append(
                f"{count} not logged: taken from the next request of the session that sends it back "
                "(its assistant message, rendered as generated)"
            )
        if self.unmodelled_replies:
            why = []
            if self.replies[ReplySource.LAST]:
                why.append(f"{self.replies[ReplySource.LAST]} the last of its session")
            if self.replies[ReplySource.UNKNOWN]:
                why.append(f"{self.replies[ReplySource.UNKNOWN]} sent back by no later request")
            parts.append(f"not modelled for {_count(self.unmodelled_replies, 'request')} ({', '.join(why)})")
        return "; ".join(parts) or None

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def steady_hit_rate(self) -> float:
        return self.steady_hits / self.steady_queries if self.steady_queries else 0.0

    @property
    def ideal_hit_rate(self) -> float:
        unavoidable = self.tokens[TokenCause.COLD] + self.tokens[TokenCause.PARTIAL]
        return 1 - unavoidable / self.queries if self.queries else 0.0

    def worst(self, count: int = 5) -> list[SessionFigures]:
        ranked = sorted((figures for figures in self.per_session if figures.lost), key=lambda f: f.lost, reverse=True)
        return ranked[:count]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": self.engine,
            "cache_model": self.cache_model,
            "metric": self.metric_label,
            "unit": self.unit,
            "block_size": self.granularity,
            "capacity_blocks": self.capacity_blocks,
            "requests": self.requests,
            "sessions": self.sessions,
        }
        out["engine_figure"] = self.engine_figure
        out["replies"] = {
            "logged": self.replies[ReplySource.LOGGED],
            "from_next_request": self.replies[ReplySource.LATER_REQUEST],
            "not_modelled": self.unmodelled_replies,
            "not_modelled_last_of_session": self.replies[ReplySource.LAST],
        }
        out.update(
            {
                "prefix_cache_queries": self.queries,
                "prefix_cache_hits": self.hits,
                "prefix_cache_hit_rate": self.hit_rate,
                "steady_state_hit_rate": self.steady_hit_rate,
                "ideal_hit_rate": self.ideal_hit_rate,
                "tokens_by_cause": {str(cause): self.tokens[cause] for cause in TokenCause},
                "lost_tokens": sum(self.tokens[cause] for cause in LOST),
                "causes": [
                    {
                        "cause": str(cause),
                        "detail": detail,
                        "tokens": tokens,
                        "requests": self.departure_requests[(cause, detail)],
                    }
                    for (cause, detail), tokens in self.departures.most_common()
                ],
                "worst_sessions": [_session_json(figures) for figures in self.worst()],
            }
        )
        if self.sweep:
            out["sweep"] = [
                {"capacity_blocks": point.capacity_blocks, "prefix_cache_hit_rate": None if point.error else point.hit_rate}
                | ({"error": point.error} if point.error else {"capacity_tokens_lost": point.tokens[TokenCause.CAPACITY]})
                for point in self.sweep
            ]
        return out


def _session_json(figures: SessionFigures) -> dict[str, Any]:
    out: dict[str, Any] = {
        "session": figures.key,
        "requests": figures.requests,
        "lost_tokens": figures.lost,
        "by_cause": {str(cause): figures.tokens[cause] for cause in LOST if figures.tokens[cause]},
        "cumulative_lost": figures.cumulative_lost,
    }
    if figures.first_departure is not None:
        trace, number = figures.first_departure
        out["first_departure"] = {
            "line": trace.line,
            "request": number,
            "token": trace.departure,
            "reasons": [reason.to_json() for reason in trace.reasons],
        }
    return out


def simulate(
    traces: list[Trace], cache: CacheModel, keys: list[str], model: str, unit: str, capacity_blocks: int | None
) -> Summary:
    """Every request, in arrival order, through ``cache``."""
    summary = Summary(model, cache.metric, unit, cache.granularity, capacity_blocks, sessions=len(keys))
    summary.bounded = capacity_blocks is not None or (isinstance(cache, LlamaCppSlots) and cache.shared_slots is not None)
    figures = [SessionFigures(key) for key in keys]
    prompts: dict[int, list[int]] = {}
    for trace in traces:
        earlier = prompts.get(trace.session)
        prompt = earlier[: trace.shared] + trace.tail if earlier is not None and trace.shared else trace.tail
        prompts[trace.session] = prompt
        try:
            served = cache.serve(
                TimedRequest(
                    trace.session,
                    prompt,
                    trace.generated,
                    trace.salt,
                    None if trace.first else trace.shared,
                    trace.time,
                    trace.breakpoints,
                    trace.block_ends,
                )
            )
        except CacheError as error:
            summary.error = f"line {trace.line}: {error}"
            return summary
        split = split_tokens(trace, served.hit, served.shared, cache.granularity)
        summary.requests += 1
        summary.per_request.append((trace.line, trace.prompt_tokens, served.hit))
        summary.replies[trace.reply] += 1
        summary.queries += trace.prompt_tokens
        summary.hits += served.hit
        if not trace.first:
            summary.steady_queries += trace.prompt_tokens
            summary.steady_hits += served.hit
        summary.tokens.update(split)
        session = figures[trace.session]
        session.requests += 1
        session.tokens.update(split)
        session.cumulative_lost.append(session.lost)
        if trace.reasons and session.first_departure is None:
            session.first_departure = (trace, session.requests)
        for cause, detail in [(reason.cause, reason.detail) for reason in trace.reasons] + [(TokenCause.CAPACITY, "evicted")]:
            if split[cause]:
                summary.departures[(cause, detail)] += split[cause]
                summary.departure_requests[(cause, detail)] += 1
    summary.per_session = figures
    return summary


# --- reports -------------------------------------------------------------------------

ENGINE_NAMES = {
    "vllm": "vLLM prefix cache",
    "sglang": "SGLang radix cache",
    "llamacpp": "llama.cpp slots",
    "openai": "OpenAI prompt caching",
    "anthropic": "Anthropic prompt caching",
    "gemini": "Gemini implicit caching",
    "deepseek": "DeepSeek context caching",
}


def _capacity(summary: Summary) -> str:
    size = summary.granularity
    if summary.cache_model in HOSTED_MODELS:
        return "the provider's published rules, by the log's timestamps"
    if summary.cache_model == "vllm":
        pool = "unbounded pool" if summary.capacity_blocks is None else f"{summary.capacity_blocks} blocks"
        return f"blocks of {size}, {pool}"
    if summary.capacity_blocks is None:
        return "unbounded" if summary.cache_model == "llamacpp" else f"page size {size}, unbounded"
    return f"{summary.capacity_blocks} blocks' worth of tokens"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def text_report(results: list[tuple[str, Summary]]) -> str:
    lines = []
    for label, summary in results:
        unit = summary.unit
        lines.append(
            f"{label}: {_count(summary.requests, 'request')} in {_count(summary.sessions, 'session')}, "
            f"{ENGINE_NAMES[summary.cache_model]} ({_capacity(summary)})"
            + (f", requests as {summary.engine} handles them" if summary.engine else "")
        )
        name = "Prefix cache hit rate" if summary.cache_model == "vllm" else "cache hit rate"
        if not summary.queries:  # a rate of nothing is no 0.0%: the template rendered no request
            why = "no request could be rendered" if summary.sessions else "no request in the log could be read"
            lines.append(f"  {name}: n/a ({why})")
        else:
            lines.append(
                f"  {name}: {summary.hit_rate:.1%} ({summary.metric_label}, every request: "
                f"{summary.hits:,} of {summary.queries:,} {unit}s)"
            )
            steady = f"{summary.steady_hit_rate:.1%}" if summary.steady_queries else "n/a (no session sent a second request)"
            lines.append(f"  steady state, each session's first request left out: {steady}")
            lines.append(f"  ideal, nothing lost to template, client or capacity: {summary.ideal_hit_rate:.1%}")
            note = summary.replies_note()
            if note:
                lines.append(f"  replies: {note}")
        lines.append(f"  prompt {unit}s by cause:")
        for cause in TokenCause:
            count = summary.tokens[cause]
            share = count / summary.queries if summary.queries else 0.0
            lines.append(f"    {cause:<14} {count:>12,} {share:>6.1%}  {CAUSE_NOTES[cause]}")
        for (cause, detail), tokens in summary.departures.most_common():
            requests = summary.departure_requests[(cause, detail)]
            lines.append(f"  lost to {cause} {detail}: {tokens:,} {unit}s in {_count(requests, 'request')}")
        for figures in summary.worst():
            by_cause = ", ".join(f"{cause} {figures.tokens[cause]:,}" for cause in LOST if figures.tokens[cause])
            line = f"  worst session {figures.key}: {figures.lost:,} {unit}s lost ({by_cause})"
            if figures.first_departure is not None:
                trace, number = figures.first_departure
                reasons = "; ".join(reason.describe() for reason in trace.reasons)
                line += f"; first departs at request {number} (line {trace.line}, {unit} {trace.departure}): {reasons}"
            lines.append(line)
        if summary.sweep:
            points = ", ".join(
                f"{point.capacity_blocks}: {'does not fit' if point.error else f'{point.hit_rate:.1%}'}"
                for point in summary.sweep
            )
            lines.append(f"  hit rate by --cache-blocks: {points}")
    return "\n".join(lines) + "\n"


COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
WIDTH, HEIGHT, LEFT, BOTTOM, TOP, RIGHT = 760, 380, 70, 50, 20, 20


def _axes(x_label: str, y_label: str, x_ticks: list[tuple[float, str]], y_ticks: list[tuple[float, str]]) -> str:
    """Axis lines, ticks and labels; tick positions are fractions of the plot area."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="#444"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#444"/>',
    ]
    for fraction, text in x_ticks:
        x = LEFT + fraction * plot_w
        parts.append(f'<line x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 5}" stroke="#444"/>')
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle" font-size="11">{html.escape(text)}</text>')
    for fraction, text in y_ticks:
        y = TOP + plot_h - fraction * plot_h
        parts.append(f'<line x1="{LEFT - 5}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" stroke="#444"/>')
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{html.escape(text)}</text>')
    parts.append(
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle" font-size="12">{html.escape(x_label)}</text>'
    )
    parts.append(
        f'<text transform="translate(16,{TOP + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle" font-size="12">'
        f"{html.escape(y_label)}</text>"
    )
    return "".join(parts)


def _legend(entries: list[tuple[str, str, bool]]) -> str:
    items = []
    for text, colour, dashed in entries:
        dash = ' stroke-dasharray="6 3"' if dashed else ""
        items.append(
            f'<li><svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" stroke="{colour}" stroke-width="3"{dash}/>'
            f"</svg> {html.escape(text)}</li>"
        )
    return f'<ul style="list-style:none;padding-left:0">{"".join(items)}</ul>'


def _sweep_chart(results: list[tuple[str, Summary]]) -> str:
    points = sorted({point.capacity_blocks for _, summary in results for point in summary.sweep if point.capacity_blocks})
    if len(points) < 2:
        return ""
    import math

    low, high = math.log(points[0]), math.log(points[-1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(blocks: int) -> float:
        return (math.log(blocks) - low) / (high - low) if high > low else 0.5

    lines, legend = [], []
    for index, (label, summary) in enumerate(results):
        colour = COLOURS[index % len(COLOURS)]
        fitted = [(point.capacity_blocks, point.hit_rate) for point in summary.sweep if not point.error]
        coordinates = [(LEFT + x(blocks) * plot_w, TOP + plot_h - rate * plot_h) for blocks, rate in fitted]
        dash = ' stroke-dasharray="6 3"' if index else ""
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} '
            f'points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in coordinates)}"/>'
        )
        lines.extend(
            f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.5" fill="{colour}"><title>{html.escape(label)}: '
            f"{blocks} blocks, {rate:.1%}</title></circle>"
            for (a, b), (blocks, rate) in zip(coordinates, fitted)
        )
        legend.append((f"{label}: {summary.cache_model}", colour, bool(index)))
    axes = _axes(
        "KV cache capacity (--cache-blocks, log scale)",
        "prefix cache hit rate",
        [(x(blocks), f"{blocks:,}") for blocks in points],
        [(step / 4, f"{step * 25}%") for step in range(5)],
    )
    return (
        "<h2>Hit rate by cache capacity</h2>"
        + _legend(legend)
        + f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">{axes}{"".join(lines)}</svg>'
    )


def _sessions_chart(results: list[tuple[str, Summary]]) -> str:
    series = [(label, figures) for label, summary in results for figures in summary.worst() if figures.cumulative_lost]
    if not series:
        return "<p>No session lost any tokens to the template, the client or capacity.</p>"
    peak = max(max(figures.cumulative_lost) for _, figures in series) or 1
    turns = max(len(figures.cumulative_lost) for _, figures in series)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    unit = results[0][1].unit
    keys = list(dict.fromkeys(figures.key for _, figures in series))
    lines, legend = [], []
    for label, figures in series:
        colour = COLOURS[keys.index(figures.key) % len(COLOURS)]
        dashed = label != results[0][0]
        points = " ".join(
            f"{LEFT + (turn + 1) / turns * plot_w:.1f},{TOP + plot_h - value / peak * plot_h:.1f}"
            for turn, value in enumerate(figures.cumulative_lost)
        )
        dash = ' stroke-dasharray="6 3"' if dashed else ""
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{LEFT},{TOP + plot_h} {points}">'
            f"<title>{html.escape(label)}: session {html.escape(figures.key)}</title></polyline>"
        )
        legend.append((f"{label}: session {figures.key} ({figures.lost:,} {unit}s lost)", colour, dashed))
    x_ticks = [(turn / turns, str(turn)) for turn in sorted({0, turns // 2, turns})]
    y_ticks = [(step / 4, f"{round(peak * step / 4):,}") for step in range(5)]
    axes = _axes("request of the session", f"{unit}s lost, cumulative", x_ticks, y_ticks)
    return (
        "<h2>Worst sessions: tokens lost to template, client and capacity</h2>"
        + _legend(legend)
        + f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">{axes}{"".join(lines)}</svg>'
    )


def html_report(results: list[tuple[str, Summary]]) -> str:
    """One self-contained page: the headline figures, the hit-rate curve over the capacities
    swept, and the tokens the worst sessions lost, request by request."""
    rows = "".join(
        f"<tr><td>{html.escape(label)}</td><td>{html.escape(summary.cache_model)}</td>"
        f"<td>{html.escape(_capacity(summary))}</td><td>{summary.hit_rate:.1%}</td>"
        f"<td>{summary.steady_hit_rate:.1%}</td><td>{summary.ideal_hit_rate:.1%}</td></tr>"
        for label, summary in results
    )
    table = (
        "<table><tr><th>template</th><th>cache</th><th>capacity</th><th>prefix cache hit rate (every request)</th>"
        f"<th>steady state</th><th>ideal</th></tr>{rows}</table>"
    )
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>tmpl-lint replay</title>'
        "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:left}</style></head><body>"
        f"<h1>tmpl-lint replay</h1>{table}{_sweep_chart(results)}{_sessions_chart(results)}</body></html>\n"
    )


# --- the command ---------------------------------------------------------------------


@dataclass(frozen=True)
class CacheSettings:
    model: str = "vllm"
    block_size: int = 16
    page_size: int = 1
    slots: int | None = None
    cache_reuse: int = 0
    api_model: str | None = None  # a hosted API's model, for its minimum cacheable prompt
    ttl: float | None = None  # seconds a hosted API's cache lives after its last use (None: modelled default)

    def cache(self, capacity: int | None) -> CacheModel:
        """A fresh cache of this model at ``capacity`` blocks."""
        if self.model in HOSTED_MODELS:
            return make_hosted_cache(self.model, self.api_model, self.ttl)
        return make_cache(self.model, self.block_size, capacity, self.page_size, self.slots, self.cache_reuse)


def replay(
    tracer: Tracer, groups: list[Session], settings: CacheSettings, capacities: list[int | None], jobs: int = 1
) -> tuple[Summary, list[tuple[int, str]]]:
    """The log through ``settings``' cache at each capacity: the summary of the first
    capacity that holds every request, with all of them as its sweep."""
    traces, problems = trace_sessions(tracer, groups, jobs)
    keys = [group.key for group in groups]
    summaries = []
    for capacity in capacities:
        summaries.append(simulate(traces, settings.cache(capacity), keys, settings.model, tracer.unit, capacity))
    fitting = [summary for summary in summaries if not summary.error]
    if not fitting:
        raise ReplayError(summaries[0].error)
    if len(summaries) > 1:
        fitting[0].sweep = summaries
    return fitting[0], problems
