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

import json
import os
import re
import stat
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..requests import Request, reasoning_fields, request_problem, without_reasoning
from ..tokenizer import common_prefix_length


class ReplayError(Exception):
    pass


@dataclass
class Call(Request):
    """A logged request: its line, the response the model gave, and when it arrived."""

    line: int = 0
    response: Any = None
    timestamp: datetime | None = None
    order: int = 0  # arrival position


@dataclass(frozen=True, slots=True)
class Entry:
    """One request of the log, as little as grouping and ordering need: where its line is
    (it is read again when its session is replayed), when it arrived, and its session."""

    line: int
    offset: int
    size: int
    timestamp: datetime | None
    key: str | None = None  # the value of --session-key
    order: int = 0  # arrival position
    carried: tuple[int, int] | None = None  # (order of a later request, message position): its reply sent back


@dataclass
class Session:
    key: str
    entries: list[Entry] = field(default_factory=list)


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
            raise ValueError(f"timestamp {_shown(value)} is out of range") from None
    if not isinstance(value, str):
        raise ValueError(f"timestamp {_shown(value)} is neither a number nor a string")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        # A time zone's offset can take the first or last day past what a date holds.
        return parsed.replace(tzinfo=None) if parsed.tzinfo is None else parsed.astimezone(UTC).replace(tzinfo=None)
    except ValueError:
        raise ValueError(
            f"timestamp {_shown(value)} is not a time: seconds since the epoch or ISO 8601 (2026-03-01T09:00:00Z)"
        ) from None
    except OverflowError:
        raise ValueError(f"timestamp {_shown(value)} is out of range: in UTC it falls outside years 1 to 9999") from None


def _shown(value: Any) -> str:
    """A logged value for an error line: never a page of digits."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 128 else f"of {len(str(abs(value)))} digits"
    return text if len(text) <= 60 else text[:57] + "..."


# A traffic log is not a template: it may be large, but each line is one request.
MAX_LINE_BYTES = 64 * 1024 * 1024
# A token id is an index into a vocabulary: engines keep them in 32 bits.
MAX_TOKEN_ID = 2**32 - 1


class Log:
    """A log read once, line by line: its requests' entries in arrival order, an error for
    each line that is not one, and each request read again from its line when its session
    is replayed, so that memory holds the sessions being replayed, never the whole log. A
    pipe (``<(zcat log.gz)``) is copied to a temporary file as it is read."""

    def __init__(self, path: Path, session_key: str | None = None):
        self.path = path
        self.entries: list[Entry] = []
        self.problems: list[ReplayError] = []
        self.models: dict[str | None, None] = {}  # the "model" fields (None: absent), in file order, for --server
        # field -> messages carrying reasoning under it, in the requests and in the logged replies
        self.requests_carry: Counter[str] = Counter()
        self.replies_carry: Counter[str] = Counter()
        self._file: Any = None
        self._read(session_key)

    def _read(self, session_key: str | None) -> None:
        try:
            with open(self.path, "rb") as stream:
                mode = os.fstat(stream.fileno()).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
                    raise ReplayError(f"{self.path}: not a regular file or a pipe")
                # Read again until the replay ends (``close``): the file itself, or a pipe's copy.
                copy = None if stat.S_ISREG(mode) else tempfile.TemporaryFile(prefix="tmpl-lint-replay-")  # noqa: SIM115
                self._file = copy or os.fdopen(os.dup(stream.fileno()), "rb")
                self._scan(stream, copy, session_key)
        except OSError as error:
            raise ReplayError(f"{self.path}: cannot read: {error.strerror or error}") from None
        self.entries = arrival_order(self.entries)

    def _scan(self, stream: Any, copy: Any, session_key: str | None) -> None:
        number = offset = 0
        first = True
        while line := stream.readline(MAX_LINE_BYTES + 1):
            number += 1
            if copy is not None:
                copy.write(line)
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                raise ReplayError(f"{self.path}:{number}: line over {MAX_LINE_BYTES} bytes; stopped reading")
            if first and line.strip():
                first = False
                if line.lstrip().startswith(b"["):
                    raise ReplayError(
                        f"{self.path}: a JSON array, not JSON Lines: replay reads one request object per line "
                        f"(jq -c '.[]' {self.path} writes them so)"
                    )
            try:
                call = parse_line(number, line)
            except ReplayError as error:
                self.problems.append(ReplayError(f"{self.path}:{number}: {error}"))
            else:
                if call is not None:
                    key = None
                    if session_key:
                        found = _lookup(call.body, session_key)
                        key = None if found is None else sys.intern(str(found))  # one string a session, not a request
                    model = call.body.get("model")
                    self.models.setdefault(model if isinstance(model, str) else None)
                    self._count_reasoning(call)
                    self.entries.append(Entry(number, offset, len(line), call.timestamp, key))
            offset += len(line)
        if copy is not None:
            copy.flush()

    def _count_reasoning(self, call: Call) -> None:
        self.requests_carry.update(reasoning_fields(call.messages))
        reply = reply_message(call.response)
        if reply is not None:
            self.replies_carry.update(reasoning_fields([reply]))

    def line(self, entry: Entry) -> bytes:
        """The bytes of ``entry``'s line, read again."""
        return os.pread(self._file.fileno(), entry.size, entry.offset)

    def call(self, entry: Entry) -> Call:
        """The request of ``entry``, read again from its line."""
        line = self.line(entry)
        call = parse_line(entry.line, line)  # ReplayError: the file changed under the replay
        if call is None:
            raise ReplayError("the line changed while it was replayed")
        call.order = entry.order
        return call

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_log(path: Path, session_key: str | None = None) -> Log:
    """The log at ``path``, read once (see ``Log``)."""
    return Log(path, session_key)


def parse_line(number: int, line: bytes) -> Call | None:
    """The call of one line, None for a blank one; ReplayError says why it is none."""
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
    except ValueError:  # an integer of over sys.get_int_max_str_digits() digits
        raise ReplayError(f"invalid JSON: a number of over {sys.get_int_max_str_digits():,} digits") from None
    if not isinstance(entry, dict):
        raise ReplayError("expected a JSON object")
    body = entry.get("request", entry)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ReplayError("no messages in this request")
    problem = request_problem(body)
    if problem:
        raise ReplayError(problem)
    _check_arguments(body)
    response = entry.get("response")
    for where, ids in _logged_ids(response):
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ReplayError(f"{where} must be a list of token ids (non-negative integers)")
        beyond = next((i for i in ids if i > MAX_TOKEN_ID), None)
        if beyond is not None:
            raise ReplayError(f"{where}: token id {_shown(beyond)} is over {MAX_TOKEN_ID}, beyond any vocabulary")
    try:
        # Present is present: a timestamp of 0 is not absent.
        logged = entry.get("timestamp")
        timestamp = _timestamp(body.get("created") if logged is None else logged)
    except ValueError as error:
        raise ReplayError(str(error)) from None
    return Call(body, line=number, response=response, timestamp=timestamp)


def _check_arguments(body: dict[str, Any]) -> None:
    """Tool-call arguments written as a JSON string are parsed when the request is rendered
    and compared: nested too deeply to parse, they are refused here, as the line would be."""
    for message in body["messages"]:
        tool_calls = message.get("tool_calls")
        for tool_call in tool_calls if isinstance(tool_calls, list) else ():
            function = tool_call.get("function") if isinstance(tool_call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if not isinstance(arguments, str) or not arguments.lstrip().startswith(("{", "[")):
                continue
            try:
                json.loads(arguments)
            except RecursionError:
                raise ReplayError("tool-call arguments nested too deeply to read") from None
            except ValueError:
                continue  # not JSON: rendered as the text it is


def _logged_ids(response: Any) -> list[tuple[str, Any]]:
    """The token id lists a response logs, each with where it is: ``token_ids`` must be
    one; ids in the first choice are read where they are a list of integers."""
    found = []
    if isinstance(response, dict):
        if "token_ids" in response:
            found.append(("response token_ids", response["token_ids"]))
        choices = response.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        ids = choice.get("token_ids")
        if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            found.append(("response choices[0].token_ids", ids))
    return found


def arrival_order(entries: list[Entry]) -> list[Entry]:
    """By timestamp, stably; a request without one arrives with the one logged before it."""
    latest = datetime.min
    keyed = []
    for entry in entries:
        latest = entry.timestamp or latest
        keyed.append((latest, entry))
    keyed.sort(key=lambda pair: pair[0])
    return [replace(entry, order=order) for order, (_, entry) in enumerate(keyed)]


def _lookup(document: dict[str, Any], dotted: str) -> Any:
    value: Any = document
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def sessions(log: Log, session_key: str | None) -> list[Session]:
    """Sessions in order of their first request, each request's entry saying where its reply
    is sent back (``Entry.carried``). Without a key, a request continues the session whose
    last request's messages it starts with (reasoning aside: clients drop it); failing that,
    the most recent of those that open with the same messages (the system prompt and first
    user message) and share most with it: a client that edits history stays in its session.

    The requests are read one at a time, in arrival order; what is kept of each session is
    its last request's message hashes and the requests whose reply no later one has sent
    back yet."""
    if session_key and log.entries and all(entry.key is None for entry in log.entries):
        raise ReplayError(f"--session-key {session_key}: no request has it, so it names no session")
    ordered: list[Session] = []
    found: dict[str, Session] = {}
    by_last: dict[int, list[Session]] = defaultdict(list)  # the last request's messages -> sessions
    by_opening: dict[int, list[Session]] = defaultdict(list)
    last: dict[int, tuple[int, list[int]]] = {}  # id(session) -> (its key in by_last, message hashes)
    # id(session) -> message count -> hash of the last message -> requests whose reply is not sent back yet
    waiting: dict[int, dict[int, dict[int, list[int]]]] = defaultdict(dict)
    carried: dict[int, tuple[int, int]] = {}  # order -> (order of the request sending its reply back, position)
    for entry in log.entries:
        try:
            call = log.call(entry)
            hashed = _Hashed(call.messages)
            home = found.get("(none)" if entry.key is None else entry.key) if session_key else None
            if session_key and home is None:
                key = "(none)" if entry.key is None else entry.key
                home = found[key] = Session(key)
                ordered.append(home)
            elif not session_key:
                hashes = hashed.all()
                chain = [0]
                for value in hashes:
                    chain.append(hash((chain[-1], value)))
                opening = next((i for i, m in enumerate(call.messages) if m.get("role") not in ("system", "developer")), 0) + 1
                for length in range(len(hashes) - 1, opening - 1, -1):
                    if by_last.get(chain[length]):
                        home = by_last[chain[length]][-1]
                        break
                if home is None:
                    best = opening - 1
                    for session in reversed(by_opening[chain[opening]][-32:]):
                        shared = common_prefix_length(last[id(session)][1], hashes)
                        if shared > best and len(hashes) > shared:
                            home, best = session, shared
                if home is None:
                    home = Session(f"session-{len(ordered) + 1}")
                    ordered.append(home)
                    by_opening[chain[opening]].append(home)
                else:
                    by_last[last[id(home)][0]].remove(home)
                by_last[chain[-1]].append(home)
                last[id(home)] = (chain[-1], hashes)
            # Earlier requests of the session whose reply this one sends back: an assistant
            # message right after what was their last message (see ``carried_reply``).
            spots = waiting[id(home)]
            for count in [count for count in spots if count < len(call.messages)]:
                if call.messages[count].get("role") == "assistant":
                    for order in spots[count].pop(hashed[count - 1], ()):
                        carried[order] = (entry.order, count)
                    if not spots[count]:
                        del spots[count]
            spots.setdefault(len(call.messages), {}).setdefault(hashed[len(call.messages) - 1], []).append(entry.order)
        except (ReplayError, RecursionError) as error:
            why = "nested too deeply to compare" if isinstance(error, RecursionError) else error
            log.problems.append(ReplayError(f"{log.path}:{entry.line}: {why}"))
            continue
        assert home is not None  # each branch above finds the request's session or opens one
        home.entries.append(entry)
    for session in ordered:
        for position, entry in enumerate(session.entries):
            if entry.order in carried:
                # One object for the entry, the log's and its session's: not two a request.
                session.entries[position] = log.entries[entry.order] = replace(entry, carried=carried[entry.order])
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


class _Hashed:
    """A request's messages' hashes (reasoning aside), each computed when first asked for."""

    def __init__(self, messages: list[dict[str, Any]]):
        self.messages = messages
        self.known: dict[int, int] = {}

    def __getitem__(self, index: int) -> int:
        if index not in self.known:
            message = without_reasoning(self.messages[index])
            self.known[index] = hash(json.dumps(message, sort_keys=True, default=str))
        return self.known[index]

    def all(self) -> list[int]:
        return [self[index] for index in range(len(self.messages))]


def carried_reply(log: Log, entry: Entry, later: Call | None = None) -> dict[str, Any] | None:
    """The assistant message the first later request of the session carries right after
    ``entry``'s messages: the reply the model generated for it, as the client sent it back
    (``later``: that request, where the caller has read it). The message before it must be
    the request's last (reasoning aside); a request that went another way (a message
    edited, removed, inserted) does not carry it there, and vLLM's chained block hashes
    would not hit its blocks either."""
    if entry.carried is None:
        return None
    order, position = entry.carried
    if later is None or later.order != order:
        later = log.call(log.entries[order])
    return later.messages[position]
