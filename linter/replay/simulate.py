"""Pass 2 of ``tmpl-lint replay``: all requests in arrival order through one cache model
(``kv_cache``: vLLM's block pool, SGLang's radix tree or llama.cpp's slots) at each capacity
asked for.

The headline is the engine's own figure: vLLM's "Prefix cache hit rate", hits / queries in
tokens over every request (``PrefixCacheStats``). Each prompt token not served from cache
gets one cause: cold (the session had not sent it before), partial block (the engine caches
whole blocks and computes the last token), template, client, or capacity (its blocks were
evicted); hits on blocks another session computed (a shared system prompt and tools) are
counted apart.
"""

from __future__ import annotations

import gc
import resource
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ..isolation import parallel_map, run_isolated
from ..kv_cache.fleet import Fleet, FleetFigures, ReplicaRun, first_error, make_router, run_replicas, served_in_order
from ..kv_cache.hosted import HOSTED_MODELS, MISSES, HostedServed, Miss, TimedRequest, make_hosted_cache
from ..kv_cache.hybrid import HybridPrefixCache, Layout
from ..kv_cache.pools import CacheError, CacheModel, LlamaCppSlots, Served, make_cache
from .attribution import CAUSE_NOTES, LOST, ReplySource, TokenCause, Trace, Tracer
from .log import Log, ReplayError, Session
from .tracing import TraceStore, trace_sessions

# --- pass 2: all requests through one cache ------------------------------------------

# Causes only a hosted API's rules give (kv_cache.hosted.Miss; partial blocks are every cache's).
HOSTED_CAUSES = frozenset(TokenCause(miss) for miss in Miss if miss is not Miss.PARTIAL)


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


class PerRequest:
    """(log line, prompt tokens, hit tokens) of each request replayed, in arrival order, as
    three arrays: 24 bytes a request, where a tuple of three ints took over 100."""

    def __init__(self) -> None:
        self.lines, self.prompts, self.hits = array("q"), array("q"), array("q")

    def append(self, row: tuple[int, int, int]) -> None:
        line, prompt, hit = row
        self.lines.append(line)
        self.prompts.append(prompt)
        self.hits.append(hit)

    def __len__(self) -> int:
        return len(self.lines)

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return zip(self.lines, self.prompts, self.hits)

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        return self.lines[index], self.prompts[index], self.hits[index]


@dataclass
class SessionFigures:
    key: str
    requests: int = 0
    tokens: Counter = field(default_factory=Counter)
    cumulative_lost: array = field(default_factory=lambda: array("q"))  # 8 bytes a request
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
    requests: int = 0  # replayed
    sessions: int = 0  # with a request replayed
    grouped: int = 0  # in the log, replayed or not
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
    per_request: PerRequest = field(default_factory=lambda: PerRequest())  # (log line, prompt tokens, hit tokens)
    engine: str = ""  # whose request handling rendered the log, and its version (engines.EngineProfile.label)
    fleet: FleetFigures | None = None  # with --replicas: each replica's figures
    layout: Layout | None = None  # a hybrid model's KV-cache groups
    marked: int = 0  # requests carrying cache_control breakpoints (what Anthropic caches at)

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
            parts.append(f"not modelled for {count_of(self.unmodelled_replies, 'request')} ({', '.join(why)})")
        return "; ".join(parts) or None

    @property
    def capacity_text(self) -> str:
        """The cache's granularity and capacity, as the reports name them."""
        size = self.granularity
        if self.cache_model in HOSTED_MODELS:
            return "the provider's published rules, by the log's timestamps"
        if self.cache_model == "vllm":
            pool = "unbounded pool" if self.capacity_blocks is None else f"{self.capacity_blocks} blocks"
            return f"blocks of {size}, {pool}"
        if self.capacity_blocks is None:
            return "unbounded" if self.cache_model == "llamacpp" else f"page size {size}, unbounded"
        return f"{self.capacity_blocks} blocks' worth of tokens"

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def steady_hit_rate(self) -> float:
        return self.steady_hits / self.steady_queries if self.steady_queries else 0.0

    @property
    def ideal_hit_rate(self) -> float:
        # cold, partial blocks, and what a hosted API's rules never cache
        unavoidable = self.queries - self.hits - sum(self.tokens[cause] for cause in LOST)
        return 1 - unavoidable / self.queries if self.queries else 0.0

    @property
    def groups_note(self) -> str | None:
        return None if self.layout is None else f"KV-cache groups sharing the pool: {self.layout.describe()}"

    @property
    def marks_note(self) -> str | None:
        if self.cache_model != "anthropic" or self.marked:
            return None
        return (
            "no request carries a cache_control breakpoint: Anthropic caches a prompt only at its breakpoints, "
            "so nothing was cached (counted below as unmarked)"
        )

    def reported_causes(self) -> list[tuple[TokenCause, str]]:
        """The causes the reports list, each with its note: none that cannot occur in this cache."""
        hosted = [TokenCause(miss) for miss in MISSES.get(self.cache_model, ())]
        return [
            (cause, CAUSE_NOTES[cause])
            for cause in self.json_causes()
            # no routing without replicas, no layers without sparse layers, no eviction at a hosted API
            if not (cause is TokenCause.ROUTING and self.fleet is None)
            and not (cause is TokenCause.LAYERS and self.layout is None)
            and not (cause is TokenCause.CAPACITY and self.cache_model in HOSTED_MODELS)
            and not (cause in HOSTED_CAUSES and cause not in hosted)
        ]

    def json_causes(self) -> list[TokenCause]:
        """The causes of the JSON report: the hosted APIs' own only for a hosted API."""
        return [cause for cause in TokenCause if cause not in HOSTED_CAUSES or self.cache_model in HOSTED_MODELS]

    @property
    def ideal_label(self) -> str:
        lost = [str(cause) for cause, _ in self.reported_causes() if cause in LOST]
        return f"ideal, nothing lost to {', '.join(lost[:-1])} or {lost[-1]}"

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
                "tokens_by_cause": {str(cause): self.tokens[cause] for cause in self.json_causes()},
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
        if self.fleet is not None:
            out["fleet"] = self.fleet.to_json()
        if self.layout is not None:
            out["kv_cache_groups"] = self.layout.describe()
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
        "cumulative_lost": list(figures.cumulative_lost),
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


def _final(traces: Iterable[Trace]) -> dict[int, int]:
    """Each session's last request (arrival position)."""
    return traces.final if isinstance(traces, TraceStore) else {trace.session: trace.order for trace in traces}


def requests_of(traces: Iterable[Trace], final: dict[int, int]) -> Iterator[tuple[Trace, TimedRequest, bool]]:
    """Each trace in arrival order with its request as the cache sees it (the whole prompt,
    rebuilt from what the session's previous prompt shares and the tail), and whether it is
    its session's last. The live sessions' last prompts are held, 4 bytes a token."""
    prompts: dict[int, array] = {}
    for trace in traces:
        earlier = prompts.pop(trace.session, None)
        prompt = earlier[: trace.shared] + trace.tail if earlier is not None and trace.shared else trace.tail
        last = final[trace.session] == trace.order
        if not last:
            prompts[trace.session] = prompt
        request = TimedRequest(
            trace.session,
            prompt.tolist(),
            trace.generated.tolist(),
            trace.salt,
            None if trace.first else trace.shared,
            trace.time,
            trace.breakpoints,
            trace.block_ends,
        )
        yield trace, request, last


def _started(
    cache: CacheModel, keys: list[str], model: str, unit: str, capacity_blocks: int | None, sessions: int
) -> tuple[Summary, list[SessionFigures]]:
    """An empty summary of ``cache`` (one replica's, for a fleet), and each session's figures."""
    summary = Summary(model, cache.metric, unit, cache.granularity, capacity_blocks, sessions=sessions)
    summary.grouped = len(keys)
    summary.bounded = capacity_blocks is not None or (isinstance(cache, LlamaCppSlots) and cache.shared_slots is not None)
    return summary, [SessionFigures(key) for key in keys]


def _count(summary: Summary, figures: list[SessionFigures], trace: Trace, served: Served) -> None:
    """One request served: its tokens by cause, in the summary and its session's figures."""
    split = split_tokens(trace, served.hit, served.shared, summary.granularity)
    moves = [(TokenCause.ROUTING, served.elsewhere), (TokenCause.LAYERS, served.layers)]
    if isinstance(served, HostedServed):  # in prompt order from the hit, as capacity's tokens lie
        moves += [(TokenCause(miss), tokens) for miss, tokens in served.misses]
    for cause, tokens in moves:
        # not evicted: on another replica, in no sparse layer, or never cached by the API's rules
        moved = min(split[TokenCause.CAPACITY], tokens)
        split[TokenCause.CAPACITY] -= moved
        split[cause] += moved
    summary.requests += 1
    summary.marked += bool(trace.breakpoints)
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
    if trace.reasons and session.first_departure is None:  # what the report says of it: not its token ids
        session.first_departure = (replace(trace, tail=array("I"), generated=array("I")), session.requests)
    for cause, detail in [(reason.cause, reason.detail) for reason in trace.reasons] + [(TokenCause.CAPACITY, "evicted")]:
        if split[cause]:
            summary.departures[(cause, detail)] += split[cause]
            summary.departure_requests[(cause, detail)] += 1


def _finished(summary: Summary, figures: list[SessionFigures], one: CacheModel, fleet: FleetFigures | None) -> Summary:
    summary.per_session = figures
    summary.fleet = fleet
    summary.layout = one.layout if isinstance(one, HybridPrefixCache) else None
    return summary


def simulate(
    traces: Iterable[Trace], cache: CacheModel, keys: list[str], model: str, unit: str, capacity_blocks: int | None
) -> Summary:
    """Every request, in arrival order (``traces``: a list in that order, or the
    ``TraceStore`` the tracing children wrote), through ``cache``. A session counts once
    one of its requests is replayed (one whose every request the template refused is no
    session of the figures); its prompt is held until its last request, then the cache is
    told it is done (``finish``: what it kept for that session alone goes)."""
    final = _final(traces)
    one = cache.caches[0] if isinstance(cache, Fleet) else cache
    summary, figures = _started(one, keys, model, unit, capacity_blocks, len(final))
    finish = getattr(cache, "finish", None)
    for trace, request, last in requests_of(traces, final):
        try:
            served = cache.serve(request)
        except CacheError as error:
            summary.error = f"line {trace.line}: {error}"
            return summary
        if last and finish is not None:
            finish(trace.session)
        _count(summary, figures, trace, served)
    return _finished(summary, figures, one, cache if isinstance(cache, Fleet) else None)


# --- a fleet's replicas apart ----------------------------------------------------------


def simulate_replicas(
    traces: Iterable[Trace], settings: CacheSettings, capacity: int | None, replicas: tuple[int, ...]
) -> ReplicaRun:
    """``replicas`` of ``settings``' fleet, at ``capacity`` blocks each, over the whole log
    apart from the other replicas (``kv_cache.fleet.run_replicas``): a process or a
    cluster's task of its own. The log is read whole: each replica is looked up at the
    requests routed elsewhere, for the tokens lost to routing."""
    caches = {replica: settings.one(capacity) for replica in replicas}
    router = make_router(settings.router, settings.replicas, settings.block_size)
    return run_replicas(caches, router, ((request, last) for _, request, last in requests_of(traces, _final(traces))))


def merge_replicas(
    traces: Iterable[Trace], runs: list[ReplicaRun], settings: CacheSettings, keys: list[str], unit: str, capacity: int | None
) -> Summary:
    """The summary ``simulate`` gives of ``settings``' whole fleet, from ``simulate_replicas``
    of every replica: the same, byte for byte."""
    final = _final(traces)
    one = settings.one(capacity)  # its kind's figures (metric, granularity): it serves nothing
    summary, figures = _started(one, keys, settings.model, unit, capacity, len(final))
    fleet = FleetFigures(make_router(settings.router, settings.replicas, settings.block_size), settings.replicas)
    error = first_error(runs)
    served = served_in_order(runs)
    for index, trace in enumerate(traces):
        if error is not None and index == error[0]:
            summary.error = f"line {trace.line}: {error[1]}"
            return summary
        replica, one_served = next(served)
        fleet.count(replica, trace.session, trace.prompt_tokens, one_served.hit, one_served.hit + one_served.elsewhere)
        _count(summary, figures, trace, one_served)
    return _finished(summary, figures, one, fleet)


@dataclass(frozen=True)
class PoolTask:
    """One simulation of a replay: the pool at ``capacity`` blocks whole (``replicas``
    None: a single pool, or a fleet whose router reads the caches), or some replicas of a
    fleet apart from the others."""

    pool: int  # which of the capacities asked for
    capacity: int | None
    replicas: tuple[int, ...] | None = None


def pool_tasks(settings: CacheSettings, capacities: list[int | None], parts: int) -> list[PoolTask]:
    """The simulations of ``capacities``: a fleet whose router reads no cache in ``parts``
    tasks a capacity (its replicas dealt in turn), anything else one task a capacity."""
    parts = min(parts, settings.replicas)
    if parts < 2 or make_router(settings.router, settings.replicas, settings.block_size).reads_caches:
        return [PoolTask(pool, capacity) for pool, capacity in enumerate(capacities)]
    return [
        PoolTask(pool, capacity, tuple(range(part, settings.replicas, parts)))
        for pool, capacity in enumerate(capacities)
        for part in range(parts)
    ]


def run_pool_task(common: tuple[Any, ...], task: PoolTask) -> Summary | ReplicaRun:
    """``task`` over ``common``: (traces, settings, keys, unit)."""
    traces, settings, keys, unit = common
    if task.replicas is None:
        return simulate(traces, settings.cache(task.capacity), keys, settings.model, unit, task.capacity)
    return simulate_replicas(traces, settings, task.capacity, task.replicas)


def merge_pool_tasks(common: tuple[Any, ...], tasks: list[PoolTask], results: list[Summary | ReplicaRun]) -> list[Summary]:
    """Each capacity's summary, in the order of ``tasks``' capacities, from their results."""
    traces, settings, keys, unit = common
    done: dict[int, Summary | list[ReplicaRun]] = {}
    capacities: dict[int, int | None] = {}
    for task, result in zip(tasks, results, strict=True):
        capacities[task.pool] = task.capacity
        if isinstance(result, Summary):
            done[task.pool] = result
        else:
            parts = done.setdefault(task.pool, [])
            assert isinstance(parts, list)
            parts.append(result)
    return [
        result if isinstance(result, Summary) else merge_replicas(traces, result, settings, keys, unit, capacities[pool])
        for pool, result in sorted(done.items())
    ]


# --- the text report -----------------------------------------------------------------

ENGINE_NAMES = {
    "vllm": "vLLM prefix cache",
    "sglang": "SGLang radix cache",
    "llamacpp": "llama.cpp slots",
    "openai": "OpenAI prompt caching",
    "anthropic": "Anthropic prompt caching",
    "gemini": "Gemini implicit caching",
    "deepseek": "DeepSeek context caching",
}


def count_of(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def text_report(results: list[tuple[str, Summary]]) -> str:
    lines = []
    for label, summary in results:
        unit = summary.unit
        lines.append(
            f"{label}: {count_of(summary.requests, 'request')} in {count_of(summary.sessions, 'session')}, "
            f"{ENGINE_NAMES[summary.cache_model]} ({summary.capacity_text})"
            + (f", requests as {summary.engine} handles them" if summary.engine else "")
        )
        name = "Prefix cache hit rate" if summary.cache_model == "vllm" else "cache hit rate"
        if not summary.queries:  # a rate of nothing is no 0.0%: the template rendered no request
            why = "no request could be rendered" if summary.grouped else "no request in the log could be read"
            lines.append(f"  {name}: n/a ({why})")
        else:
            lines.append(
                f"  {name}: {summary.hit_rate:.1%} ({summary.metric_label}, every request: "
                f"{summary.hits:,} of {summary.queries:,} {unit}s)"
            )
            steady = f"{summary.steady_hit_rate:.1%}" if summary.steady_queries else "n/a (no session sent a second request)"
            lines.append(f"  steady state, each session's first request left out: {steady}")
            lines.append(f"  {summary.ideal_label}: {summary.ideal_hit_rate:.1%}")
            if summary.groups_note:
                lines.append(f"  {summary.groups_note}")
            if summary.fleet is not None:
                lines.extend(summary.fleet.describe(unit))
            if summary.marks_note:
                lines.append(f"  {summary.marks_note}")
            note = summary.replies_note()
            if note:
                lines.append(f"  replies: {note}")
        lines.append(f"  prompt {unit}s by cause:")
        for cause, note in summary.reported_causes():
            count = summary.tokens[cause]
            share = count / summary.queries if summary.queries else 0.0
            lines.append(f"    {cause:<14} {count:>12,} {share:>6.1%}  {note}")
        for (cause, detail), tokens in summary.departures.most_common():
            requests = summary.departure_requests[(cause, detail)]
            lines.append(f"  lost to {cause} {detail}: {tokens:,} {unit}s in {count_of(requests, 'request')}")
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
    if len(results) == 2:
        lines.append(delta_line(results))
    return "\n".join(lines) + "\n"


def delta_line(results: list[tuple[str, Summary]]) -> str:
    """What the second template changes against the first, at the same cache."""
    (first_label, first), (second_label, second) = results
    rates = ("n/a" if not summary.queries else f"{summary.hit_rate:.1%}" for summary in (first, second))
    line = f"{second_label} against {first_label}: hit rate {' -> '.join(rates)}"
    if first.queries and second.queries:
        line += f" ({(second.hit_rate - first.hit_rate) * 100:+.1f} points)"
    unit = first.unit
    lost = [sum(summary.tokens[cause] for cause in LOST) for summary in (first, second)]
    template = [summary.tokens[TokenCause.TEMPLATE] for summary in (first, second)]
    line += f"; {unit}s lost {lost[0]:,} -> {lost[1]:,}, to the template {template[0]:,} -> {template[1]:,}"
    return line


# --- the command ---------------------------------------------------------------------


@dataclass(frozen=True)
class CacheSettings:
    model: str = "vllm"
    block_size: int = 16
    page_size: int = 1
    slots: int | None = None
    cache_reuse: int = 0
    replicas: int = 1
    router: str = "round-robin"
    layout: Layout | None = None  # a hybrid model's KV-cache groups (vLLM)
    api_model: str | None = None  # a hosted API's model, for its minimum cacheable prompt
    ttl: float | None = None  # seconds a hosted API's cache lives after its last use (None: modelled default)

    def cache(self, capacity: int | None) -> CacheModel:
        """A fresh cache at ``capacity`` blocks (of each replica)."""

        if self.replicas == 1:
            return self.one(capacity)
        return Fleet([self.one(capacity) for _ in range(self.replicas)], make_router(self.router, self.replicas, self.block_size))

    def one(self, capacity: int | None) -> CacheModel:
        """A fresh cache of one replica at ``capacity`` blocks."""
        if self.model in HOSTED_MODELS:
            return make_hosted_cache(self.model, self.api_model, self.ttl)
        if self.layout is not None:
            return HybridPrefixCache(self.layout, capacity)
        return make_cache(self.model, self.block_size, capacity, self.page_size, self.slots, self.cache_reuse)


def replay(
    tracer: Tracer,
    log: Log,
    groups: list[Session],
    settings: CacheSettings,
    capacities: list[int | None],
    jobs: int = 1,
    progress: Callable[[int], Any] | None = None,
) -> tuple[Summary, list[tuple[int, str]]]:
    """The log through ``settings``' cache at each capacity: the summary of the first
    capacity that holds every request, with all of them as its sweep. ``progress``
    opens the progress bar (``trace_sessions``). The traces are spilled to temporary files
    without a name and read back at each capacity, so that memory holds the sessions live
    at each point of the log, not the log's traces. With ``jobs`` above 1, a fleet whose
    router reads no cache is simulated in up to ``jobs`` children, each with some of its
    replicas (``pool_tasks``), each reading the traces back itself; the merge is the
    one-process run's, byte for byte."""
    with TraceStore(len(log.entries)) as store:
        traces, problems = trace_sessions(tracer, log, groups, jobs, progress, store)
        common = (traces, settings, [group.key for group in groups], tracer.unit)
        tasks = pool_tasks(settings, capacities, jobs)
        if all(task.replicas is None for task in tasks):  # one pool a capacity, here, one after the other
            results = [run_pool_task(common, task) for task in tasks]
        else:  # a fleet's replicas apart, in children
            results = _in_children(common, tasks, jobs)
        summaries = merge_pool_tasks(common, tasks, results)
    return first_fitting(summaries), problems


def _in_children(common: tuple[Any, ...], tasks: list[PoolTask], jobs: int) -> list[Summary | ReplicaRun]:
    """``run_pool_task`` of each task, ``jobs`` at a time, each in a child forked for it,
    which reads the traces from the store it inherits. The simulation runs no template: the
    child has no limit but the machine's."""

    def run(task: PoolTask) -> Summary | ReplicaRun:
        return run_isolated(run_pool_task, (common, task), seconds=None, memory=resource.RLIM_INFINITY)

    gc.freeze()  # the parent's objects, inherited: no collection in a child walks (and copies) them
    try:
        return parallel_map(run, tasks, jobs)
    finally:
        gc.unfreeze()


def first_fitting(summaries: list[Summary]) -> Summary:
    """The summary of the first capacity that holds every request, with all of them as its
    sweep; ReplayError where none does."""
    fitting = [summary for summary in summaries if not summary.error]
    if not fitting:
        raise ReplayError(summaries[0].error)
    if len(summaries) > 1:
        fitting[0].sweep = summaries
    return fitting[0]
