"""Pass 1 of ``tmpl-lint replay``: each session alone (``tracing`` runs ``--jobs`` of them at a time).

Every request is rendered as the engine renders it and tokenized, only the text after what
it shares with the session's previous prompt (``PrefixEncoder``); the reply as the model
generated it: its logged ids or message, else the assistant message the session's next
request sends back after it (``log.carried_reply``), else none, which the report says.
Where a prompt stops extending what the session's previous request left computed, the
request is rendered once more with the client's own changes undone (the previous messages
and reply as they were, its tools and options), to tell the tokens the client cost from
those the template costs, and the rule and message responsible.
"""

from __future__ import annotations

import functools
import json
import re
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..checker import lint_source
from ..engines import engine_tokenizer, passed_reasoning, prepare, render_prompt, request_prompt
from ..engines.base import ENGINES, HARMONY, EngineError, Prompt
from ..findings import Finding, Outcome
from ..inputs import TemplateSource
from ..kv_cache.hosted import ANTHROPIC_BREAKPOINTS, Breakpoint, breakpoints_of
from ..kv_cache.pools import CacheError
from ..proofs import AFTER_MESSAGES, BEFORE_MESSAGES, Cause
from ..proving.attribution import explaining_code
from ..proving.divergence import compare_prompts, first_difference, generation_prompt_span, last_message_mark, reply_start
from ..proving.measure import Measure
from ..proving.replies import STOP_MARKER, Reply, stop_after_reply, unmarked
from ..render import FrozenClock, RenderError
from ..requests import REASONING_KEYS, ClientChange, client_change, reasoning_of, without_reasoning
from ..rules import reporting
from ..tokenizer import Encoded, HarmonyVocabularyTokenizer, PrefixEncoder, Tokenizer, common_prefix_length
from .log import Call, Entry, Log, ReplayError, Session, carried_reply, generated_ids, reply_message


class ReplySource(StrEnum):
    """Where the reply a request generated comes from: vLLM (and SGLang, llama.cpp) cache
    the blocks of every reply, so one left out counts as cold what the engine serves."""

    LOGGED = "logged"
    LATER_REQUEST = "from a later request"  # not logged: the assistant message the session sent back
    LAST = "not modelled, last of its session"  # not logged, and no later request
    UNKNOWN = "not modelled"  # not logged, and no later request of the session sends it back


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
    ROUTING = "routing"  # cached on another replica than the one the router chose
    LAYERS = "layers"  # hybrid models: full attention held them, the sliding-window or Mamba layers did not
    # Hosted APIs (kv_cache.hosted.Miss): tokens sent before that the API's rules did not serve.
    EXPIRED = "expired"  # cached, but the entry's TTL ran out before the session came back
    MINIMUM = "minimum"  # the prompt, or what it shares with the previous one, is under the API's minimum
    REPLY = "reply"  # the previous reply: the API caches prompts, not what the model generated
    UNMARKED = "unmarked"  # Anthropic: no cached cache_control breakpoint this request reads ends after them


LOST = (
    TokenCause.TEMPLATE,
    TokenCause.CLIENT,
    TokenCause.CAPACITY,
    TokenCause.ROUTING,
    TokenCause.LAYERS,
    TokenCause.EXPIRED,
    TokenCause.UNMARKED,
)
CAUSE_NOTES = {
    TokenCause.HIT: "from blocks the session's own requests computed",
    TokenCause.SHARED: "from blocks another session computed (a shared system prompt and tools)",
    TokenCause.COLD: "first sight: not sent by the session before",
    TokenCause.PARTIAL: "sent before, but in a partial block, or the one token the engine always computes",
    TokenCause.TEMPLATE: "the template rendered the same history differently",
    TokenCause.CLIENT: "the client changed what it sent",
    TokenCause.CAPACITY: "cached once, evicted before the session came back",
    TokenCause.ROUTING: "the session's own tokens, cached on another replica than the one the router chose",
    TokenCause.LAYERS: "full attention held them; the sliding-window or Mamba layers keep no state there",
    TokenCause.EXPIRED: "cached by the API, but expired (its TTL ran out) before the session came back",
    TokenCause.MINIMUM: "the prompt, or the prefix it shares with the previous one, is under the API's minimum cacheable length",
    TokenCause.REPLY: "the previous reply: the API caches what prompts sent, not what the model generated",
    TokenCause.UNMARKED: "no cache_control breakpoint the API cached and this request reads ends after them",
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

    @classmethod
    def of_client(cls, change: ClientChange) -> Departure:
        return cls(
            TokenCause.CLIENT,
            change.detail,
            change.message_index,
            change.role,
            in_previous=change.in_previous,
            moved_to=change.moved_to,
        )

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
    tail: array  # token ids (ids_array)
    prompt_tokens: int
    generated: array = field(default_factory=lambda: array("I"))
    salt: str | None = None
    first: bool = True
    reply: ReplySource = ReplySource.LOGGED
    previous: int = 0  # tokens the session's previous request left computed
    departure: int | None = None  # the first prompt token that does not extend them
    template_departure: int | None = None  # the same with the client's changes undone
    reasons: tuple[Departure, ...] = ()  # the client's change (if it came first), then the template's
    time: float | None = None  # seconds since the epoch, as logged: hosted caches expire by it
    breakpoints: tuple[Breakpoint, ...] = ()  # Anthropic's cache_control marks as token positions
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
        # The renders a session's next request asks for again (``_kept``): (call, reply or
        # None, value) by the identities of the call and the reply, which it holds on to.
        self._renders: dict[tuple[str, int, int], tuple[Call, Any, Any]] = {}

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
            return self.generated_reasoning(logged), ReplySource.LOGGED
        if generated_ids(call.response) is not None:
            return None, ReplySource.LOGGED  # its message is found where a prompt departs (``attribute``)
        if carried is not None:
            return carried, ReplySource.LATER_REQUEST
        return None, ReplySource.LAST if last else ReplySource.UNKNOWN

    @functools.cached_property
    def reasoning_field(self) -> str | None:
        """The name under which the engine hands a message's reasoning to the template: the
        first of REASONING_KEYS it passes on (asked of the engine, ``passed_reasoning``)."""
        return next((key for key in REASONING_KEYS if passed_reasoning(self.engine, key)), None)

    def generated_reasoning(self, reply: dict[str, Any]) -> dict[str, Any]:
        """A logged reply with its reasoning, under whichever name the engine returned it
        (``reasoning_content``, ``reasoning``, ``thinking``), where the template is handed
        it: the model generated that reasoning, whatever the log calls it."""
        found = reasoning_of(reply)
        if found is None or self.reasoning_field is None or found[0] == self.reasoning_field:
            return reply
        return without_reasoning(reply) | {self.reasoning_field: found[1]}

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
            candidates[:0] = [carried] + ([without_reasoning(carried) | split] if split else [])
        for candidate in candidates:
            try:
                if self.as_generated(call, prompt, candidate)[1] == text:
                    return candidate
            except RenderError:
                continue
        return None

    def _kept(self, kind: str, call: Call, reply: Any, make: Callable[[], Any]) -> Any:
        """``make()``, or what it gave for this call and reply (the same objects) before:
        the reply renders as the newest message for its request (``as_generated``) and again
        when the next request departs (``latest``), and the previous request without a
        generation prompt for its reply's start and again for the departure's. A session's
        requests are traced one after another: the last few are kept."""
        key = (kind, id(call), id(reply))
        kept = self._renders.get(key)
        if kept is not None and kept[0] is call and kept[1] is reply:
            return kept[2]
        value = make()
        self._renders[key] = (call, reply, value)
        while len(self._renders) > 8:
            del self._renders[next(iter(self._renders))]
        return value

    def bare(self, call: Call) -> str:
        """``call``'s messages rendered with no generation prompt."""
        return self._kept("bare", call, None, lambda: self.render(call, call.messages, False).text)

    def with_reply(self, call: Call, prompt: str, reply: dict[str, Any]) -> tuple[str, int, str]:
        """``call``'s messages and ``reply`` rendered with no generation prompt, where the
        reply starts in that render and the mark it gives the reply (``reply_start``)."""

        def make() -> tuple[str, int, str]:
            cleaned = {key: value for key, value in reply.items() if value is not None}
            text = self.render(call, call.messages + [cleaned], False).text
            return (text, *self.reply_start(call, prompt, text))

        return self._kept("reply", call, reply, make)

    def as_generated(self, call: Call, prompt: str, reply: dict[str, Any]) -> tuple[list[int], str]:
        """The template's render of ``reply`` after the generation prompt, up to its
        end-of-turn marker: the reply as the model generated it."""
        with_reply, start, mark = self.with_reply(call, prompt, reply)
        reply = {key: value for key, value in reply.items() if value is not None}
        text = with_reply[start:]
        text = unmarked(_as_generated(_logged_arguments(text, reply), reply), mark)
        return self.reply_ids(text), text

    def reply_ids(self, text: str) -> list[int]:
        """A reply's ids: in pieces where the prompts are (``PrefixEncoder.ids``), so the
        reply's text is tokenized once for it and for the next prompt, which holds it."""
        # (gpt-oss's whole texts are openai-harmony's tokenization: kept so.)
        same = self.encoder.tokenizer is self.measure.tokenizer and not isinstance(
            self.measure.tokenizer, HarmonyVocabularyTokenizer
        )
        ids = self.encoder.ids(text) if same else None
        return self.measure.ids(text) if ids is None else ids

    def reply_start(self, call: Call, prompt: str, with_reply: str) -> tuple[int, str]:
        """Where the reply begins in ``with_reply``, the render ending with it, and the mark
        that render gives it as the newest message, as the prover finds them: where the two
        part before ``prompt`` ends (a `loop.last` mark on the last message), the reply
        still starts after the generation prompt, and the model never wrote the mark."""
        bare = None
        if common_prefix_length(prompt, with_reply) < len(prompt):
            bare = self.bare(call)
        return reply_start(prompt, with_reply, bare), last_message_mark(prompt, with_reply, bare)

    def latest(self, previous: _Previous) -> Reply | None:
        """How the previous request's logged reply renders while it is the newest message
        (the prover's ``Reply``), or None where no reply is logged."""
        if previous.reply is None:
            return None
        with_reply, start, _mark = self.with_reply(previous.call, previous.prompt.text, previous.reply)
        reply = {key: value for key, value in previous.reply.items() if value is not None}
        text = with_reply[start:]
        return Reply(text, with_reply, start + len(_as_generated(text, reply)))

    def trace(self, index: int, session: Session, log: Log) -> tuple[list[Trace], list[tuple[int, str]]]:
        """The session's traces, and (line, why) for each request the template cannot render
        (the engine answers 400 and caches nothing) or that cannot be replayed: the session
        goes on without it. Its requests are read from the log one at a time."""
        traces, problems = [], []
        previous: _Previous | None = None
        upcoming = _read(log, session.entries[0]) if session.entries else None
        for position, entry in enumerate(session.entries):
            call = upcoming
            last = position == len(session.entries) - 1
            upcoming = None if last else _read(log, session.entries[position + 1])
            if isinstance(call, ReplayError):
                problems.append((entry.line, str(call)))
                continue
            assert call is not None  # each entry's request is read before its turn
            try:
                carried = carried_reply(log, entry, upcoming if isinstance(upcoming, Call) else None)
                trace, previous = self.trace_one(index, call, previous, carried, last, problems)
            except RenderError as error:
                problems.append((call.line, f"the template fails on this request: {error}"))
                continue
            except Exception as error:  # noqa: BLE001 - one request nothing above foresaw: it is left out, not the session
                if isinstance(error, ReplayError):
                    problems.append((call.line, str(error)))
                    continue
                problems.append((call.line, f"cannot replay this request: {type(error).__name__}: {error}"))
                continue
            traces.append(trace)
        return traces, problems

    def trace_one(
        self,
        index: int,
        call: Call,
        previous: _Previous | None,
        carried: dict[str, Any] | None,
        last: bool,
        problems: list[tuple[int, str]],
    ) -> tuple[Trace, _Previous]:
        prompt = self.prompt(call, previous.prompt if previous else None)
        reply, source = self.reply_of(call, carried, last)
        try:
            generated, generated_text = self.generated(call, prompt.text, reply)
        except RenderError as error:
            problems.append((call.line, f"the template fails on this request's reply: {error}"))
            generated, generated_text = [], ""
            if source is ReplySource.LATER_REQUEST:
                source = ReplySource.UNKNOWN
        shared = common_prefix_length(previous.prompt.ids, prompt.ids) if previous else 0
        trace = Trace(call.order, call.line, index, shared, ids_array(prompt.ids[shared:]), len(prompt.ids), ids_array(generated))
        trace.salt = call.salt
        trace.reply = source
        if call.timestamp is not None:
            trace.time = call.timestamp.replace(tzinfo=UTC).timestamp()
        if self.marks:
            # The API answers 400 to marks it does not take, and caches nothing of the request.
            try:
                trace.breakpoints, trace.block_ends = breakpoints_of(call.body, prompt.ids, self._message_ids(call))
            except (RenderError, CacheError) as error:
                raise ReplayError(f"its cache_control marks cannot be placed: {error}; left out") from None
            if len(trace.breakpoints) > ANTHROPIC_BREAKPOINTS:
                raise ReplayError(f"{len(trace.breakpoints)} cache_control breakpoints: the API allows 4 (400); left out")
        if previous is not None:
            try:
                self.attribute(trace, previous, call, prompt)
            except RenderError as error:  # the request with the client's changes undone
                problems.append((call.line, f"the template fails on this request as first sent: {error}"))
        return trace, _Previous(call, prompt, generated, generated_text, reply, carried)

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
            reasons.append(Departure.of_client(change))
        if template_departure is not None:
            reasons.append(self.template_reason(previous, clean, clean_messages))
        if previous.reply is None and ids is not None:
            # The reply is ids no message renders as: what the client changed in it, and
            # whether the template rewrites it, cannot be told from the generation prompt's.
            reasons = [replace(reason, detail=f"{reason.detail} {UNCERTAIN}") for reason in reasons]
        trace.reasons = tuple(reasons)

    def opener(self, previous: _Previous, cached_text: str, next_text: str, latest: Reply | None) -> tuple[int, int]:
        """Where the previous prompt's generation prompt sits, for ``compare_prompts``: from
        the previous request rendered without one (``generation_prompt_span``); or, where the
        next prompt parts from the cached text at or after the previous prompt's end, and
        from the reply as the newest message there too (or nowhere), that end, without the
        render. ``compare_prompts`` then decides alike whichever point before that end the
        generation prompt starts at: the divergence is after it, so is where the reply moved,
        and the divergence is not before the prompt's end, where it would look for the reply
        resuming. (Only ``in_generation_prompt``, which a Departure does not keep, differs.)
        Every Qwen3 request with thinking off parts so, at the reply's empty think block."""
        end = len(previous.prompt.text)
        char = first_difference(cached_text, next_text)
        char = min(len(cached_text), len(next_text)) if char is None else char
        moved = first_difference(latest.latest, next_text) if latest is not None else None
        if char >= end and (moved is None or moved >= end):
            return end, end
        return generation_prompt_span(previous.prompt.text, self.bare(previous.call))

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
            latest = self.latest(previous)
            opener = self.opener(previous, cached_text, prompt.text, latest)
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
    return lint_source(TemplateSource(Path("replay.jinja"), None, template, "jinja"))


def _read(log: Log, entry: Entry) -> Call | ReplayError:
    try:
        return log.call(entry)
    except ReplayError as error:
        return error


def ids_array(ids: list[int]) -> array:
    """Token ids as 4 bytes each, not a Python int each."""
    return array("I", ids)
