"""What a hosted API's prompt cache serves, replayed from its published rules.

Four models beside ``kv_cache``'s engines, each fed every request in arrival order with the
time the log gives it, and answering how many prompt tokens the provider would report as
cached. Each follows the provider's own documentation as read on 2026-12-07; a rule the
documentation does not publish is a parameter, named below, never a guess made silently.

- ``openai`` (developers.openai.com/api/docs/guides/prompt-caching; the retention sentence
  as Azure OpenAI's page words it, learn.microsoft.com/azure/foundry/openai/how-to/prompt-caching):
  prompts of 1,024 tokens or more are cached; in-memory retention clears a prefix after 5
  to 10 minutes of inactivity and always within an hour. A hit is the longest cached prefix
  of 1,024 + 128·k tokens (``OPENAI_STEP``): OpenAI's "Prompt Caching 201" cookbook
  (developers.openai.com/cookbook/examples/prompt_caching_201, read 2026-12-07) says "you can
  get a match until the first mismatched token in 128 token blocks", and notes that it covers
  models before GPT-5.6, for which the guide above is to be read instead. Modelled:
  a prefix lives ``ttl`` seconds after its last use, 300 by default (the published lower
  bound; 600 and 3,600 bound it from above).
- ``anthropic`` (platform.claude.com/docs/en/build-with-claude/prompt-caching): only prefixes
  that end at a ``cache_control`` breakpoint are written, at most 4 per request, each only if
  it holds at least the model's minimum (``ANTHROPIC_MINIMUM``); a read checks each
  breakpoint and the content-block boundaries up to 20 blocks before it; an entry lives 5
  minutes (``"ttl": "1h"``: an hour) after its last use, refreshed by each hit. A request
  without a breakpoint caches nothing, as the API does (top-level ``cache_control`` puts
  one on the last cacheable block).
- ``gemini`` (ai.google.dev/gemini-api/docs/caching, page updated 2026-10-13): implicit
  caching of prompt prefixes for prompts of at least the model's minimum
  (``GEMINI_MINIMUM``). Google publishes neither the hit granularity nor how long an
  implicit cache lives ("send requests with similar prefix in a short amount of time"):
  modelled at token granularity, a hit no shorter than the minimum, and no expiry unless
  ``ttl`` is given (so an upper bound).
- ``deepseek`` (api-docs.deepseek.com/guides/kv_cache): each request persists two cache
  prefix units, at the end of its input and at the end of its output, and a prefix it shares
  with an earlier request but does not fully match is persisted as a unit of its own; a
  request hits only a unit it matches whole, the longest. Units carved "at fixed token
  intervals" in long inputs are not modelled: the page gives no interval. No expiry unless
  ``ttl`` is given.

Replies: OpenAI, Anthropic and Gemini document caching of the prompt only, so a reply is
never cached here (the next turn hits up to the previous prompt); DeepSeek's output unit
holds the reply's tokens but the last, whose KV is never computed (as ``CacheRequest.computed``).

Tokens not served: each model says why each prompt token past its hit was not served
(``HostedServed.misses``, in prompt order), so replay counts none of them as evicted:
``expired`` (a cache entry held them, but its TTL ran out before the request), ``minimum``
(the prompt, or what it shares with the previous one, is under the minimum),
``partial-block`` (past OpenAI's last whole 128-token step, or DeepSeek's last whole unit),
``reply`` (the previous reply: OpenAI, Anthropic and Gemini cache the prompt only) and
``unmarked`` (Anthropic: no breakpoint of the minimum length or more, read by this request,
ends after them).

Not modelled: OpenAI's routing of prompts by a hash of their first ~256 tokens to one of many
machines (and ``prompt_cache_key``), its extended 24-hour retention, Anthropic's 20-block
lookback as more than the block ends the log gives, images and tools as separate cache
keys, organisation and workspace isolation (every session here shares one cache), and
explicit Gemini ``cachedContents``.

Prefixes are keyed by Python's 64-bit hash chained token by token, as ``kv_cache`` keys
vLLM's blocks: a collision among a few million prefixes is about as unlikely.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..tokenizer import common_prefix_length
from .pools import CacheError, CacheRequest, Served

HOSTED_MODELS = ("openai", "anthropic", "gemini", "deepseek")

OPENAI_MINIMUM = 1024
OPENAI_STEP = 128
OPENAI_TTL = 300.0  # seconds: "within 5 to 10 minutes of inactivity"; 600 or 3600 bound it from above

ANTHROPIC_BREAKPOINTS = 4
ANTHROPIC_LOOKBACK = 20  # content blocks checked before each breakpoint
ANTHROPIC_TTLS = {"5m": 300.0, "1h": 3600.0}
# Minimum cacheable prompt by model, as platform.claude.com lists it (read 2026-12-07; the
# 512-token tier of Claude Opus 5 as LiteLLM's table of 2026-10-07 gives it).
ANTHROPIC_MINIMUM = {
    "claude-opus-5": 512,
    "claude-sonnet-4-6": 1024,
    "claude-sonnet-4-5": 1024,
    "claude-opus-4-1": 1024,
    "claude-opus-4": 1024,
    "claude-sonnet-4": 1024,
    "claude-3-7-sonnet": 1024,
    "claude-haiku-3-5": 2048,
    "claude-haiku-3": 2048,
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-haiku-4-5": 4096,
}

# Minimum input tokens for implicit caching, as ai.google.dev lists them (updated 2026-10-13).
GEMINI_MINIMUM = {
    "gemini-2.5-flash": 2048,
    "gemini-2.5-pro": 2048,
    "gemini-3.1-pro-preview": 4096,
    "gemini-3.5-flash": 4096,
    "gemini-3.6-flash": 4096,
    "gemini-3.7-flash": 4096,
    "gemini-3.8-flash": 4096,
}


class Miss(StrEnum):
    """Why a hosted API did not serve a prompt token the session had sent before (the
    values are replay's causes, ``replay.attribution.TokenCause``)."""

    EXPIRED = "expired"  # cached, but the entry's TTL ran out before this request
    MINIMUM = "minimum"  # the prompt, or the prefix it shares, is under the API's minimum
    PARTIAL = "partial-block"  # past the last whole step (OpenAI) or unit (DeepSeek)
    REPLY = "reply"  # generated by the model: the API caches prompts only
    UNMARKED = "unmarked"  # Anthropic: no cached breakpoint this request reads ends after it


# The misses each provider's rules can give.
MISSES = {
    "openai": (Miss.EXPIRED, Miss.MINIMUM, Miss.PARTIAL, Miss.REPLY),
    "anthropic": (Miss.EXPIRED, Miss.MINIMUM, Miss.UNMARKED, Miss.REPLY),
    "gemini": (Miss.EXPIRED, Miss.MINIMUM, Miss.REPLY),
    "deepseek": (Miss.EXPIRED, Miss.PARTIAL),
}


@dataclass(frozen=True)
class HostedServed(Served):
    """``Served`` with why the session's own earlier tokens past the hit were not served:
    (miss, tokens) runs in prompt order from the hit, up to where the previous prompt stops
    being shared, or past the previous reply where the whole previous prompt is (the reply
    assumed sent back; replay counts only what the session did send back)."""

    misses: tuple[tuple[Miss, int], ...] = ()


def _runs(hit: int, marks: list[tuple[Miss, int]], end: int) -> tuple[tuple[Miss, int], ...]:
    """(miss, tokens) from ``hit`` to ``end``, each miss up to its mark (marks in order;
    one at or below where the previous stopped is empty)."""
    runs, start = [], hit
    for miss, upto in marks:
        upto = min(upto, end)
        if upto > start:
            runs.append((miss, upto - start))
            start = upto
    return tuple(runs)


@dataclass(frozen=True)
class Breakpoint:
    """An Anthropic ``cache_control`` mark: the prompt's first ``position`` tokens end at it."""

    position: int
    ttl: float = ANTHROPIC_TTLS["5m"]


@dataclass(frozen=True)
class TimedRequest(CacheRequest):
    """A request with the time it arrived (seconds; None: the log has none, and nothing
    expires before it) and, for Anthropic, its breakpoints and content-block ends as token
    positions in the prompt."""

    time: float | None = None
    breakpoints: tuple[Breakpoint, ...] = ()
    block_ends: tuple[int, ...] = ()


@dataclass
class _Entry:
    owner: Hashable
    last_used: float
    ttl: float | None

    def live(self, now: float) -> bool:
        return self.ttl is None or now - self.last_used <= self.ttl


@dataclass
class _Chain:
    tokens: list[int]
    hashes: list[int]  # hashes[p]: the key of the first p tokens


class _PrefixCache:
    """Prefixes by their chained hash, each with who wrote it and when it was last used.
    An expired entry is kept (and written over): it tells a token lost to the TTL from one
    never cached."""

    granularity = 1

    def __init__(self, ttl: float | None):
        self.ttl = ttl
        self.entries: dict[int, _Entry] = {}
        self.chains: dict[Hashable, _Chain] = {}
        self.now = float("-inf")
        self.sent: dict[Hashable, tuple[int, int]] = {}  # the session's previous prompt and computed reply, in tokens
        # Of the current request: the tokens it shares with its session's previous prompt, and
        # how far its session's own earlier tokens reach in it (the reply too, where it sends
        # the whole previous prompt back).
        self.shared = self.own = 0

    def _clock(self, request: CacheRequest) -> float:
        time = getattr(request, "time", None)
        if time is not None:
            if time < self.now:
                raise CacheError(f"requests arrive out of order ({time} after {self.now})")
            self.now = time
        return self.now

    def _hashes(self, request: CacheRequest, tokens: list[int]) -> list[int]:
        """Keys of every prefix of ``tokens``, reusing the session's previous chain for the
        tokens it shares (``request.shared``, else compared)."""
        previous = self.chains.get(request.session)
        kept = 0
        if previous is not None:
            limit = min(len(previous.tokens), len(tokens))
            if request.shared is not None and request.shared <= limit:
                kept = request.shared
            else:
                while kept < limit and previous.tokens[kept] == tokens[kept]:
                    kept += 1
        sent = self.sent.get(request.session)
        self.sent[request.session] = (len(request.prompt), max(len(request.generated) - 1, 0))
        self.shared = self.own = 0
        if previous is not None and sent is not None:
            length, reply = sent
            self.shared = min(kept, length)  # the chain may hold the reply (DeepSeek)
            self.own = min(length + reply if self.shared == length else self.shared, len(request.prompt))
        hashes = previous.hashes[: kept + 1] if previous is not None else [hash((request.salt,))]
        parent = hashes[-1]
        for token in tokens[kept:]:
            parent = hash((parent, token))
            hashes.append(parent)
        self.chains[request.session] = _Chain(tokens, hashes)
        return hashes

    def _live(self, key: int, now: float) -> _Entry | None:
        entry = self.entries.get(key)
        return entry if entry is not None and entry.live(now) else None

    def _hit(self, hashes: list[int], positions: Iterable[int], now: float) -> tuple[int, Hashable, int]:
        """The longest of ``positions`` whose prefix is cached and live, refreshed (0 if
        none), its writer, and the longest cached at all, live or expired."""
        held = 0
        for position in sorted(set(positions), reverse=True):
            entry = self.entries.get(hashes[position])
            if entry is None:
                continue
            held = held or position
            if entry.live(now):
                entry.last_used = now
                return position, entry.owner, held
        return 0, None, held

    def _write(self, hashes: list[int], positions: Iterable[int], session: Hashable, now: float, ttl: float | None) -> None:
        for position in positions:
            entry = self._live(hashes[position], now)
            if entry is None:
                self.entries[hashes[position]] = _Entry(session, now, ttl)
            else:
                entry.last_used = now

    def _served(self, hit: int, owner: Hashable, session: Hashable, marks: list[tuple[Miss, int]]) -> HostedServed:
        """The hit, the part of it another session computed, and why the session's own
        tokens past it were not served: each of ``marks`` (miss, up to) in order from the hit."""
        return HostedServed(hit, hit if hit and owner != session else 0, misses=_runs(hit, marks, self.own))


class OpenAIPromptCache(_PrefixCache):
    """OpenAI's automatic prompt caching (see the module docstring)."""

    metric = "usage.prompt_tokens_details.cached_tokens / prompt_tokens"
    granularity = OPENAI_STEP

    def __init__(self, ttl: float | None = OPENAI_TTL):
        super().__init__(ttl)

    def serve(self, request: CacheRequest) -> HostedServed:
        now = self._clock(request)
        prompt = request.prompt
        hashes = self._hashes(request, prompt)
        if len(prompt) < OPENAI_MINIMUM:
            return self._served(0, None, request.session, [(Miss.MINIMUM, self.own)])
        steps = range(OPENAI_MINIMUM, len(prompt) + 1, OPENAI_STEP)
        hit, owner, held = self._hit(hashes, steps, now)
        # Every step of the prompt is cached (a hit refreshes the shorter steps too).
        self._write(hashes, steps, request.session, now, self.ttl)
        # Past what an entry held: under the minimum, else past the previous prompt's last
        # whole step, then its reply.
        return self._served(
            hit,
            owner,
            request.session,
            [
                (Miss.EXPIRED, held),
                (Miss.MINIMUM if self.shared < OPENAI_MINIMUM else Miss.PARTIAL, self.shared),
                (Miss.REPLY, self.own),
            ],
        )


class AnthropicPromptCache(_PrefixCache):
    """Anthropic's ``cache_control`` breakpoints (see the module docstring)."""

    metric = "usage.cache_read_input_tokens / input tokens"

    def __init__(self, minimum: int):
        super().__init__(None)  # each entry keeps its breakpoint's TTL
        self.minimum = minimum

    def serve(self, request: CacheRequest) -> HostedServed:
        now = self._clock(request)
        # A mark at the very start covers nothing (a render that parts from the prompt at once).
        breakpoints = tuple(mark for mark in getattr(request, "breakpoints", ()) if mark.position > 0)
        if len(breakpoints) > ANTHROPIC_BREAKPOINTS:
            raise CacheError(
                f"a request has {len(breakpoints)} cache_control breakpoints: the API allows {ANTHROPIC_BREAKPOINTS}"
            )
        prompt = request.prompt
        if any(mark.position > len(prompt) for mark in breakpoints):
            raise CacheError("a cache_control breakpoint lies outside its prompt")
        hashes = self._hashes(request, prompt)
        if not breakpoints:  # nothing read, nothing written
            return self._served(0, None, request.session, [(Miss.UNMARKED, self.shared), (Miss.REPLY, self.own)])
        ends = sorted(set(getattr(request, "block_ends", ())) & set(range(1, len(prompt) + 1)))
        candidates = set()
        for mark in breakpoints:
            before = [end for end in ends if end < mark.position]
            candidates.add(mark.position)
            candidates.update(before[-ANTHROPIC_LOOKBACK:])
        hit, owner, held = self._hit(hashes, candidates, now)
        for mark in breakpoints:
            if mark.position >= self.minimum:
                self._write(hashes, [mark.position], request.session, now, mark.ttl)
        # Past what an entry held: under the minimum (no mark could cache what the prompt
        # shares), else no cached mark this request reads ends after them; then the reply.
        return self._served(
            hit,
            owner,
            request.session,
            [
                (Miss.EXPIRED, held),
                (Miss.MINIMUM if self.shared < self.minimum else Miss.UNMARKED, self.shared),
                (Miss.REPLY, self.own),
            ],
        )


class GeminiImplicitCache(_PrefixCache):
    """Gemini's implicit caching (see the module docstring)."""

    metric = "usage_metadata.cached_content_token_count / prompt_token_count"

    def __init__(self, minimum: int, ttl: float | None = None):
        super().__init__(ttl)
        self.minimum = minimum

    def _longest(self, hashes: list[int], cached: Callable[[int], bool]) -> int:
        """Every prefix of a cached prompt is cached and refreshed with it: the cached ones
        form one run from the minimum up, so the longest is found by bisection (0: none)."""
        low, high = self.minimum - 1, len(hashes) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if cached(hashes[middle]):
                low = middle
            else:
                high = middle - 1
        return low if low >= self.minimum else 0

    def serve(self, request: CacheRequest) -> HostedServed:
        now = self._clock(request)
        prompt = request.prompt
        hashes = self._hashes(request, prompt)
        if len(prompt) < self.minimum:
            return self._served(0, None, request.session, [(Miss.MINIMUM, self.own)])
        hit = self._longest(hashes, lambda key: self._live(key, now) is not None)
        held = self._longest(hashes, lambda key: key in self.entries)
        owner = self.entries[hashes[hit]].owner if hit else None
        self._write(hashes, range(self.minimum, len(prompt) + 1), request.session, now, self.ttl)
        # Every prefix from the minimum up to the previous prompt was cached: past what an
        # entry held, only a prefix shared under the minimum, or the reply.
        return self._served(
            hit, owner, request.session, [(Miss.EXPIRED, held), (Miss.MINIMUM, self.shared), (Miss.REPLY, self.own)]
        )


class DeepSeekContextCache(_PrefixCache):
    """DeepSeek's cache prefix units on disk (see the module docstring)."""

    metric = "usage.prompt_cache_hit_tokens / prompt_tokens"

    def __init__(self, ttl: float | None = None):
        super().__init__(ttl)
        self.seen: set[int] = set()  # every prefix an earlier request sent or computed

    def serve(self, request: CacheRequest) -> HostedServed:
        now = self._clock(request)
        prompt = request.prompt
        computed = prompt + request.generated[: max(len(request.generated) - 1, 0)]
        hashes = self._hashes(request, computed)
        hit, owner, held = self._hit(hashes, range(1, len(prompt) + 1), now)
        # A prefix shared with an earlier request, longer than the unit it hit, becomes a unit.
        low, high = hit, len(prompt)
        while low < high:
            middle = (low + high + 1) // 2
            if hashes[middle] in self.seen:
                low = middle
            else:
                high = middle - 1
        units = [position for position in (low, len(prompt), len(computed)) if position > hit]
        self._write(hashes, units, request.session, now, self.ttl)
        self.seen.update(hashes[1:])
        # Past what a unit held, no unit it matches whole ends (the reply is cached).
        return self._served(hit, owner, request.session, [(Miss.EXPIRED, held), (Miss.PARTIAL, self.own)])


def make_hosted_cache(provider: str, model: str | None = None, ttl: float | None = None, minimum: int | None = None):
    """A fresh cache of ``provider``; ``model`` picks its minimum from the published table,
    ``minimum`` gives it where the table does not have the model; ``ttl`` overrides the
    modelled lifetime in seconds (Anthropic's comes from each breakpoint)."""
    if provider == "openai":
        return OpenAIPromptCache(OPENAI_TTL if ttl is None else ttl)
    if provider == "deepseek":
        return DeepSeekContextCache(ttl)
    if provider in ("anthropic", "gemini"):
        table = ANTHROPIC_MINIMUM if provider == "anthropic" else GEMINI_MINIMUM
        if minimum is None:
            if model not in table:
                raise CacheError(
                    f"--cache-model {provider} needs the model for its minimum cacheable prompt "
                    f"(known: {', '.join(table)}), or the minimum in tokens"
                )
            minimum = table[model]
        return AnthropicPromptCache(minimum) if provider == "anthropic" else GeminiImplicitCache(minimum, ttl)
    raise CacheError(f"unknown hosted cache model {provider!r} (known: {', '.join(HOSTED_MODELS)})")


# --- Anthropic's marks in a logged request ----------------------------------------------


@dataclass(frozen=True)
class Mark:
    """Where a logged Messages API request carries ``cache_control``: on a tool, a system
    block or a message's content block (``index`` None: the request's top level, which
    marks its last cacheable block)."""

    place: str  # "tools", "system", "messages" or "request"
    index: int | None = None
    block: int | None = None
    ttl: float = ANTHROPIC_TTLS["5m"]


def _ttl(control: Any) -> float:
    value = control.get("ttl", "5m") if isinstance(control, dict) else "5m"
    if value not in ANTHROPIC_TTLS:
        raise CacheError(f"cache_control ttl {value!r} is not one the API takes ({', '.join(ANTHROPIC_TTLS)})")
    return ANTHROPIC_TTLS[value]


def cache_control_marks(body: dict[str, Any]) -> list[Mark]:
    """The request's ``cache_control`` marks in prompt order: tools, system, messages."""
    marks = []
    for index, tool in enumerate(body.get("tools") or ()):
        if isinstance(tool, dict) and "cache_control" in tool:
            marks.append(Mark("tools", index, None, _ttl(tool["cache_control"])))
    system = body.get("system")
    for block, part in enumerate(system if isinstance(system, list) else ()):
        if isinstance(part, dict) and "cache_control" in part:
            marks.append(Mark("system", None, block, _ttl(part["cache_control"])))
    for index, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        for block, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict) and "cache_control" in part:
                marks.append(Mark("messages", index, block, _ttl(part["cache_control"])))
    if "cache_control" in body:
        marks.append(Mark("request", None, None, _ttl(body["cache_control"])))
    return marks


def _with_blocks(message: dict[str, Any], blocks: int) -> dict[str, Any]:
    """The message with its first ``blocks`` content blocks, their marks left out."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    kept = [{key: value for key, value in part.items() if key != "cache_control"} for part in content[:blocks]]
    return {**message, "content": kept}


def breakpoints_of(
    body: dict[str, Any], prompt: list[int], render: Callable[[list[dict[str, Any]]], list[int]]
) -> tuple[tuple[Breakpoint, ...], tuple[int, ...]]:
    """The request's ``cache_control`` marks on its messages as token positions in ``prompt``,
    and the ends of the 20 content blocks before each (Anthropic's lookback).

    ``render(messages)`` is the token ids of the messages rendered as the engine renders
    them, with no generation prompt: a mark's position is where that render of the
    messages up to the marked block parts from the prompt, a token boundary both share.
    A top-level mark falls on the end of the last message. Marks on tools and on a
    top-level ``system`` are not placed (a chat template renders them elsewhere): they are
    left out, so the figure is a lower bound for a log that carries them."""
    messages = body.get("messages") or []
    sizes = [len(m["content"]) if isinstance(m, dict) and isinstance(m.get("content"), list) else 1 for m in messages]
    order = [(index, block) for index, size in enumerate(sizes) for block in range(size)]

    def end_of(index: int, block: int) -> int:
        kept = [_with_blocks(message, sizes[number]) for number, message in enumerate(messages[:index])]
        ids = render([*kept, _with_blocks(messages[index], block + 1)])
        return common_prefix_length(ids, prompt)

    marks: list[Breakpoint] = []
    ends: set[int] = set()
    for mark in cache_control_marks(body):
        place: tuple[int, int]
        if mark.place == "messages" and mark.index is not None and mark.block is not None:
            place = (mark.index, mark.block)
        elif mark.place == "request" and messages:
            place = order[-1]
        else:
            continue
        marks.append(Breakpoint(end_of(*place), mark.ttl))
        before = order[: order.index(place)][-ANTHROPIC_LOOKBACK:]
        ends.update(end_of(*block) for block in before)
    return tuple(marks), tuple(sorted(ends))
