"""``tmpl-lint validate LOG --server URL``: each logged request sent to a running engine's
render endpoint and its token ids compared with what the offline profile renders, so a
user checks tmpl-lint's model against their own engine version.

vLLM's ``POST /v1/chat/completions/render`` (``vllm serve`` and ``vllm launch render``)
answers the token ids it would feed the model without generating (server.py asks it, and
falls back to a one-token generation with ``return_token_ids`` where it is off). llama-server's
``POST /apply-template`` answers the prompt text (``--engine llamacpp``): the texts are
compared. SGLang has no chat render endpoint (its ``/v1/tokenize`` takes text, not a chat
request): it cannot be asked.

Bounded: one deadline for the whole run (what is not asked by then is said), and
server.py's limits on each request (its deadline, its response size cap, redirects only to
the server's own host).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .offline import Rendered, render_request
from .server import ServerError, ServerRefused, ServerUnreachable


@dataclass(frozen=True)
class Answer:
    """One side's answer to a request: its prompt (token ids, text, or both), or a refusal
    (one line)."""

    ids: tuple[int, ...] | None = None
    refusal: str | None = None
    text: str | None = None


@dataclass(frozen=True)
class Check:
    line: int
    offline: Answer
    server: Answer

    @property
    def unit(self) -> str:
        """What is compared: token ids where the server answers them, else the text."""
        return "text" if self.server.ids is None and self.server.refusal is None else "token"

    @property
    def agrees(self) -> bool:
        if self.offline.refusal is not None or self.server.refusal is not None:
            return self.offline.refusal is not None and self.server.refusal is not None
        if self.unit == "text":
            return self.offline.text == self.server.text
        return self.offline.ids == self.server.ids

    @property
    def place(self) -> int | None:
        """The first token (or character) where the two differ (the shorter's length where
        one extends the other); None where they agree or one side refused."""
        a, b = (self.offline.text, self.server.text) if self.unit == "text" else (self.offline.ids, self.server.ids)
        if self.agrees or a is None or b is None:
            return None
        return next((index for index, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass
class Validation:
    engine: str  # the profile, e.g. "vLLM 0.33.0"
    server: str
    requests: int  # in the log
    checks: list[Check] = field(default_factory=list)
    unanswered: list[tuple[int, str]] = field(default_factory=list)  # (line, why): no answer to compare
    stopped: str | None = None  # the run's deadline passed before every request was asked

    @property
    def agreed(self) -> int:
        return sum(check.agrees for check in self.checks)

    @property
    def disagreements(self) -> list[Check]:
        return [check for check in self.checks if not check.agrees]


def offline_answers(engine: str, template: str, bodies: list[dict[str, Any]], special, tokenizer, server_kwargs) -> list[Answer]:
    """What the profile answers each request (run in a limited child: rendering is
    untrusted code)."""
    answers = []
    for body in bodies:
        outcome = render_request(engine, template, body, special, tokenizer, server_kwargs)
        if isinstance(outcome, Rendered):
            ids = tuple(outcome.token_ids) if outcome.token_ids is not None else None
            answers.append(Answer(ids=ids, text=outcome.text))
        else:
            answers.append(Answer(refusal=outcome))
    return answers


def ask_server(
    ask: Callable[[dict[str, Any]], Answer],
    lines: list[int],
    bodies: list[dict[str, Any]],
    deadline_seconds: float,
    end: float | None = None,
) -> tuple[list[tuple[int, Answer]], list[tuple[int, str]], str | None]:
    """The server's answer to each request (``ask``), in log order, until the run's deadline
    (``end``, monotonic: ``deadline_seconds`` from now unless given; ``ask`` bounds each
    request by what is left of it)."""
    answered: list[tuple[int, Answer]] = []
    unanswered: list[tuple[int, str]] = []
    end = time.monotonic() + deadline_seconds if end is None else end
    for position, (line, body) in enumerate(zip(lines, bodies)):
        if time.monotonic() >= end:
            return (
                answered,
                unanswered,
                f"the {deadline_seconds:g} s deadline passed: {len(bodies) - position} requests not asked",
            )
        try:
            answered.append((line, ask(body)))
        except ServerRefused as error:
            answered.append((line, Answer(refusal=str(error))))
        except ServerUnreachable as error:
            # One line for the run, not one per request: none of the rest would reach it.
            unanswered.append((line, str(error)))
            return answered, unanswered, f"{error}: {len(bodies) - position - 1} requests not asked"
        except ServerError as error:
            unanswered.append((line, str(error)))
    return answered, unanswered, None


def _size(answer: Answer) -> str:
    return f"{len(answer.ids)} tokens" if answer.ids is not None else f"{len(answer.text or '')} characters"


def _character(text: str | None, place: int) -> str:
    return "(end)" if text is None or place >= len(text) else repr(text[place : place + 12])


def _token(decode, ids: tuple[int, ...] | None, place: int) -> str:
    if ids is None or place >= len(ids):
        return "(end)"
    shown = f"{ids[place]}"
    if decode is not None:
        # a token the tokenizer cannot show: its id says it
        with contextlib.suppress(Exception):
            shown += f" {decode([ids[place]])!r}"
    return shown


def describe(check: Check, decode=None) -> str:
    """Where and how one request disagrees, in one line."""
    offline, server = check.offline, check.server
    if offline.refusal is not None and server.refusal is None:
        return f"the profile refuses ({offline.refusal}); the server renders {_size(server)}"
    if server.refusal is not None and offline.refusal is None:
        return f"the server refuses ({server.refusal}); the profile renders {_size(offline)}"
    if check.unit == "text":
        place = check.place
        assert place is not None
        return (
            f"character {place} of {len(offline.text or '')} (profile) / {len(server.text or '')} (server): "
            f"profile {_character(offline.text, place)}, server {_character(server.text, place)}"
        )
    if offline.ids is None:
        return "the profile gives no token ids (no tokenizer: give --tokenizer)"
    place = check.place
    assert place is not None
    return (
        f"token {place} of {len(offline.ids)} (profile) / {len(server.ids or ())} (server): "
        f"profile {_token(decode, offline.ids, place)}, server {_token(decode, server.ids, place)}"
    )


def text_report(validation: Validation, log: str, decode=None, shown: int = 10) -> str:
    checked = len(validation.checks)
    lines = [
        f"validate: {validation.agreed} of {checked} requests agree with {validation.server} "
        f"(offline profile: {validation.engine}; {validation.requests} in the log)"
    ]
    for check in validation.disagreements[:shown]:
        lines.append(f"  {log}:{check.line}: {describe(check, decode)}")
    more = len(validation.disagreements) - shown
    if more > 0:
        lines.append(f"  ... and {more} more disagreements")
    for line, why in validation.unanswered:
        lines.append(f"  {log}:{line}: not compared: {why}")
    if validation.stopped:
        lines.append(f"  stopped: {validation.stopped}")
    return "\n".join(lines) + "\n"


def to_json(validation: Validation, decode=None) -> dict[str, Any]:
    return {
        "engine": validation.engine,
        "server": validation.server,
        "requests": validation.requests,
        "checked": len(validation.checks),
        "agreed": validation.agreed,
        "disagreements": [
            {"line": check.line, check.unit: check.place, "detail": describe(check, decode)} for check in validation.disagreements
        ],
        "unanswered": [{"line": line, "error": why} for line, why in validation.unanswered],
        "stopped": validation.stopped,
    }
