"""Several replicas of one engine behind a router, each replica with its own cache.

Every request goes to one replica, chosen by the router in arrival order, and that
replica's cache model (``kv_cache``) serves it exactly as a lone engine would. A
request's hit can only come from its own replica: tokens another replica held and the
chosen one did not are *lost to routing*.

Routers:

- ``round-robin``: the i-th request (0-based, arrival order) goes to replica i mod N.
- ``session``: every request of a session goes to replica (0-based arrival index of the
  session's first request) mod N: sticky sessions pinned where the session started.
- ``prefix``: the approximate prefix-cache scorer of llm-d's inference scheduler (the
  Gateway API Inference Extension's ``prefix-cache-scorer``,
  kubernetes-sigs/gateway-api-inference-extension,
  pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go). The router never sees the
  engines' caches: it hashes the prompt in blocks (chained, each on its parent's hash; at
  most ``MaxPrefixBlocksToMatch`` = 256 blocks) and remembers, per replica, the hashes of
  the requests it sent there, in an LRU of ``LRUCapacityPerServer`` = 31,250 entries. A
  replica's score is the number of leading blocks it remembers over the prompt's blocks;
  the highest score wins. llm-d hashes the prompt's *text* in blocks of 64 bytes
  ("vLLM's block of 16 tokens, about 4 characters a token"); here the token ids are hashed
  in blocks of the engine's block size, which is what those 64 bytes stand for.
- ``kv``: NVIDIA Dynamo's KV router (ai-dynamo/dynamo, lib/llm/src/kv_router/scheduler.rs,
  ``DefaultWorkerSelector::select_worker`` and ``softmax_sample``, since moved to
  lib/kv-router/src/scheduling/selector.rs; docs.nvidia.com/dynamo, "Router Guide",
  "Routing Concepts: Cost Calculation"). With KV events the router knows each worker's cached blocks, so the
  overlap here is the longest run of the prompt's blocks the replica's own cache holds. A
  worker's cost (lower wins) is::

      logit = overlap_score_weight × prefill_blocks + decode_blocks
      prefill_blocks = (active prefill tokens + prompt tokens − overlap × block) / block
      decode_blocks  = active decode blocks + the request's blocks

  with Dynamo's defaults ``overlap_score_weight`` = 1.0 and ``router_temperature`` = 0
  (the lowest cost, no sampling).

Ties (every router but round-robin and session can tie): Dynamo and llm-d pick at random
among the best; here the replica with the fewest requests so far, then the lowest index,
so a replay is reproducible and ties still spread the load.

Not modelled: load. Replay serves one request at a time, so no request is in flight when
the next is routed: Dynamo's active prefill and decode load and llm-d's queue and
KV-utilisation scorers are the same on every replica, and ``kv`` and ``prefix`` route by
cache overlap alone (ties spread by request count). Nor are replicas failing, scaling, or
their caches being warmed by traffic outside the log.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field

from ..tokenizer import common_prefix_length
from .hybrid import HybridPrefixCache
from .pools import CacheError, CacheModel, CacheRequest, LlamaCppSlots, Served, SglangRadixCache, VllmPrefixCache, chain_seed

ROUTERS = ("round-robin", "session", "prefix", "kv")

# llm-d's prefix-cache-scorer defaults (plugin.go: DefaultMaxPrefixBlocks, DefaultLRUCapacityPerServer).
PREFIX_MAX_BLOCKS = 256
PREFIX_LRU_PER_REPLICA = 31_250
# Dynamo's KvRouterConfig defaults.
KV_OVERLAP_SCORE_WEIGHT = 1.0


def block_hashes(prompt: list[int], block_size: int, salt: str | None = None, limit: int | None = None) -> list[int]:
    """The chained hashes of the prompt's full blocks, as ``VllmPrefixCache`` keys them."""
    parent, out = chain_seed(salt), list[int]()
    end = len(prompt) - block_size + 1
    for start in range(0, end, block_size):
        if limit is not None and len(out) == limit:
            break
        parent = hash((parent, tuple(prompt[start : start + block_size])))
        out.append(parent)
    return out


def _chain(prompt: list[int], block_size: int, salt: str | None) -> Iterator[int]:
    """``block_hashes``, one block at a time."""
    parent = chain_seed(salt)
    for start in range(0, len(prompt) - block_size + 1, block_size):
        parent = hash((parent, tuple(prompt[start : start + block_size])))
        yield parent


def cached_prefix(cache: CacheModel, request: CacheRequest, hashes: Iterable[int] | None = None, cap: bool = True) -> int:
    """The prompt tokens ``cache`` would serve ``request`` now, without serving it: what
    the cache holds (``cap``: less the one token every engine computes)."""
    prompt = request.prompt
    if isinstance(cache, VllmPrefixCache):
        size = cache.block_size
        limit = (len(prompt) - 1) // size if cap else len(prompt) // size
        found = 0
        # Without the hashes, each block is hashed only once the blocks before it are held:
        # a replica holding none of the prompt costs one hash, not the prompt's.
        for block_hash in itertools.islice(_chain(prompt, size, request.salt) if hashes is None else hashes, limit):
            if not cache.holds(block_hash):
                break
            found += 1
        return found * size
    if isinstance(cache, SglangRadixCache):
        page = cache.page_size
        limit = (len(prompt) - 1) // page * page if cap else len(prompt) // page * page
        node, position = cache.root, 0
        while position < limit:
            child = node.children.get(cache._key(prompt, position))
            if child is None:
                break
            length = min(len(child.key), limit - position)
            matched = common_prefix_length(child.key, prompt[position : position + length]) // page * page
            position += matched
            if matched < len(child.key):
                break
            node = child
        return position
    if isinstance(cache, HybridPrefixCache):
        return cache.peek(request, cap)
    if isinstance(cache, LlamaCppSlots):
        slots = cache.shared_slots if cache.shared_slots is not None else [cache.by_session.get(request.session)]
        best = max((common_prefix_length(slot.tokens, prompt) for slot in slots if slot is not None), default=0)
        return min(best, len(prompt) - 1) if cap and prompt else best
    raise CacheError(f"no replica overlap for {type(cache).__name__}")


class SessionChains:
    """Each live session's last prompt's block hashes, as far as the lookups needed them:
    a prompt that extends its session's previous one (``CacheRequest.shared``, the tokens
    it is known to share with it) is hashed only past them. Session by session in arrival
    order, whichever replica served each request."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.known: dict[Hashable, tuple[str | None, list[int]]] = {}

    def chain(self, request: CacheRequest) -> Iterator[int]:
        """``request``'s block hashes, computed as they are read (kept for its session's next request)."""
        salt, known = self.known.pop(request.session, (request.salt, []))
        if request.shared is None or salt != request.salt:
            known = []
        else:
            del known[request.shared // self.block_size :]
        self.known[request.session] = (request.salt, known)
        return self._extended(known, request.prompt, request.salt)

    def _extended(self, known: list[int], prompt: list[int], salt: str | None) -> Iterator[int]:
        yield from known
        size = self.block_size
        parent = known[-1] if known else chain_seed(salt)
        for start in range(len(known) * size, len(prompt) - size + 1, size):
            parent = hash((parent, tuple(prompt[start : start + size])))
            known.append(parent)
            yield parent

    def finish(self, session: Hashable) -> None:
        self.known.pop(session, None)


def held_elsewhere(caches: list[CacheModel], request: CacheRequest, hashes: Iterable[int] | None = None) -> int:
    """The most of ``request``'s prompt one of ``caches`` would serve it now, without
    serving it (``cached_prefix``; nothing in any cache is touched). Over vLLM pools each
    block is hashed once, and only once a pool holds every block before it; a pool is read
    past the longest run found so far only if it holds that run's next block."""
    pools = [cache for cache in caches if isinstance(cache, VllmPrefixCache)]
    best = max((cached_prefix(cache, request, hashes) for cache in caches if cache not in pools), default=0)
    if not pools:
        return best
    size, prompt = pools[0].block_size, request.prompt
    limit = (len(prompt) - 1) // size
    chain = iter(_chain(prompt, size, request.salt) if hashes is None else hashes)
    known: list[int] = []  # the chain as far as it was read

    def block(index: int) -> int | None:
        while len(known) <= index:
            block_hash = next(chain, None)
            if block_hash is None:
                return None
            known.append(block_hash)
        return known[index]

    found = 0  # the longest run of leading blocks one pool holds
    for pool in pools:
        if found == limit:
            break
        if found:  # a longer run needs the block after the longest so far
            after = block(found)
            if after is None or not pool.holds(after):
                continue
        run = 0
        while run < limit:
            block_hash = block(run)
            if block_hash is None or not pool.holds(block_hash):
                break
            run += 1
        found = max(found, run)
    return max(best, found * size)


class Ledger:
    """(arrival index, hit, shared, layers) of each request one replica served, in arrival
    order, in one array: 32 bytes a request."""

    def __init__(self) -> None:
        self.rows = array("q")

    def append(self, index: int, served: Served) -> None:
        self.rows.extend((index, served.hit, served.shared, served.layers))

    def __iter__(self) -> Iterator[tuple[int, Served]]:
        rows = self.rows
        for at in range(0, len(rows), 4):
            yield rows[at], Served(rows[at + 1], rows[at + 2], layers=rows[at + 3])


@dataclass
class ReplicaRun:
    """What some replicas of a fleet made of the log, simulated apart from the others
    (``run_replicas``): what each served, and, at each request routed to none of them that
    one of them held some of, the most of its prompt one held (arrival index, tokens)."""

    served: dict[int, Ledger]  # replica -> its requests
    held_at: array = field(default_factory=lambda: array("q"))
    held: array = field(default_factory=lambda: array("q"))
    error: tuple[int, str] | None = None  # the arrival index of the request that did not fit, and why


def run_replicas(caches: dict[int, CacheModel], router: Router, requests: Iterable[tuple[CacheRequest, bool]]) -> ReplicaRun:
    """The replicas ``caches`` (by number, of a fleet of ``router.replicas``) apart from
    the others: each serves the requests ``router`` sends it, exactly as in the whole
    ``Fleet``, which it can only where routing reads no cache (``reads_caches``): then
    every replica's requests follow from the requests alone, and its cache from them.
    ``requests``: every request of the log in arrival order, each with whether it is its
    session's last. At a request routed elsewhere each replica is only looked up
    (``held_elsewhere``), for the tokens lost to routing; ``served_in_order`` merges."""
    if router.reads_caches:
        raise CacheError(f"the {router.name} router reads every replica's cache: its replicas cannot be simulated apart")
    figures = FleetFigures(router, router.replicas)  # the requests each replica had: the routers' ties read them
    last_replica: dict[Hashable, int] = {}
    first = next(iter(caches.values()))
    chains = SessionChains(first.block_size) if isinstance(first, VllmPrefixCache) else None
    run = ReplicaRun({replica: Ledger() for replica in caches})
    for index, (request, last) in enumerate(requests):
        replica = router.route(index, request, figures)
        router.routed(replica, request)
        figures.replicas[replica].requests += 1
        session = request.session
        hashes = None if chains is None else chains.chain(request)
        if last_replica.get(session, replica) != replica:
            request = dataclasses.replace(request, shared=None)  # as Fleet.serve
        last_replica[session] = replica
        held = held_elsewhere([cache for number, cache in caches.items() if number != replica], request, hashes)
        if held:
            run.held_at.append(index)
            run.held.append(held)
        cache = caches.get(replica)
        if cache is not None:
            try:
                served = cache.serve(request)
            except CacheError as error:
                run.error = (index, str(error))
                return run
            run.served[replica].append(index, served)
        if last:  # as Fleet.finish
            for cache in caches.values():
                finish = getattr(cache, "finish", None)
                if finish is not None:
                    finish(session)
            last_replica.pop(session, None)
            router.finish(session)
            if chains is not None:
                chains.finish(session)
    return run


def first_error(runs: list[ReplicaRun]) -> tuple[int, str] | None:
    """The first request (arrival index, why) of ``run_replicas``' parts that did not fit:
    where the whole ``Fleet`` stops."""
    return min((run.error for run in runs if run.error is not None), default=None)


def _numbered(replica: int, ledger: Ledger) -> Iterator[tuple[int, int, Served]]:
    for index, served in ledger:
        yield index, replica, served


def served_in_order(runs: list[ReplicaRun]) -> Iterator[tuple[int, Served]]:
    """``run_replicas``' parts, which together cover every replica, merged into what the
    whole ``Fleet`` serves: each request's replica and ``Served`` in arrival order, its
    ``elsewhere`` the tokens lost to routing (beyond the hit, the most another replica
    held), up to ``first_error``."""
    stop = first_error(runs)
    served = heapq.merge(*[_numbered(replica, ledger) for run in runs for replica, ledger in run.served.items()])
    held = heapq.merge(*[zip(run.held_at, run.held) for run in runs])
    pending = next(held, None)
    for index, replica, one in served:
        if stop is not None and index >= stop[0]:
            return
        elsewhere = 0
        while pending is not None and pending[0] <= index:
            if pending[0] == index:
                elsewhere = max(elsewhere, pending[1])
            pending = next(held, None)
        yield replica, dataclasses.replace(one, elsewhere=max(0, elsewhere - one.hit))


@dataclass
class ReplicaFigures:
    """One replica's share of the log."""

    replica: int
    requests: int = 0
    sessions: dict[Hashable, None] = field(default_factory=dict)  # in the order first seen
    queries: int = 0
    hits: int = 0
    lost_to_routing: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class Router:
    """Chooses the replica of each request, in arrival order."""

    name = ""
    # Whether routing reads the replicas' caches. A router that does not routes each request
    # by the requests before it alone, so each replica can be simulated apart (run_replicas).
    reads_caches = False

    def __init__(self, replicas: int):
        self.replicas = replicas

    def route(self, index: int, request: CacheRequest, fleet: FleetFigures) -> int:
        raise NotImplementedError

    def routed(self, replica: int, request: CacheRequest) -> None:
        """What the router remembers of where it sent ``request``."""

    def finish(self, session: Hashable) -> None:
        """What the router kept for ``session`` alone, which sends no more requests."""

    def best(self, scores: list[float], fleet: FleetFigures) -> int:
        """The highest score; among equals the replica with the fewest requests, then the first."""
        return max(range(self.replicas), key=lambda r: (scores[r], -fleet.replicas[r].requests, -r))


class RoundRobin(Router):
    name = "round-robin"

    def route(self, index: int, request: CacheRequest, fleet: FleetFigures) -> int:
        return index % self.replicas


class SessionAffinity(Router):
    name = "session"

    def __init__(self, replicas: int):
        super().__init__(replicas)
        self.home: dict[Hashable, int] = {}

    def route(self, index: int, request: CacheRequest, fleet: FleetFigures) -> int:
        return self.home.setdefault(request.session, index % self.replicas)

    def finish(self, session: Hashable) -> None:
        self.home.pop(session, None)


class ApproximatePrefix(Router):
    """llm-d's approximate prefix-cache scorer (see the module docstring)."""

    name = "prefix"

    def __init__(
        self, replicas: int, block_size: int, max_blocks: int = PREFIX_MAX_BLOCKS, capacity: int = PREFIX_LRU_PER_REPLICA
    ):
        super().__init__(replicas)
        self.block_size, self.max_blocks, self.capacity = block_size, max_blocks, capacity
        self.seen: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
        self.hashes: list[int] = []

    def route(self, index: int, request: CacheRequest, fleet: FleetFigures) -> int:
        self.hashes = block_hashes(request.prompt, self.block_size, request.salt, self.max_blocks)
        total = len(self.hashes)
        scores = []
        for seen in self.seen:
            matched = 0
            for block_hash in self.hashes:
                if block_hash not in seen:
                    break
                matched += 1
            scores.append(matched / total if total else 0.0)
        return self.best(scores, fleet)

    def routed(self, replica: int, request: CacheRequest) -> None:
        seen = self.seen[replica]
        for block_hash in self.hashes:
            seen[block_hash] = None
            seen.move_to_end(block_hash)
        while len(seen) > self.capacity:
            seen.popitem(last=False)


class KvAware(Router):
    """Dynamo's KV router cost (see the module docstring)."""

    name = "kv"
    reads_caches = True

    def __init__(self, replicas: int, block_size: int, overlap_score_weight: float = KV_OVERLAP_SCORE_WEIGHT):
        super().__init__(replicas)
        self.block_size, self.weight = block_size, overlap_score_weight

    def route(self, index: int, request: CacheRequest, fleet: FleetFigures) -> int:
        assert isinstance(fleet, Fleet), "the kv router reads the replicas' caches: it routes only a whole Fleet"
        size, prompt_tokens = self.block_size, len(request.prompt)
        request_blocks = -(-prompt_tokens // size)
        costs = []
        for cache in fleet.caches:
            overlap = cached_prefix(cache, request, fleet.hashes, cap=False) // size
            prefill_blocks = (prompt_tokens - overlap * size) / size  # no prefill in flight: one request at a time
            decode_blocks = request_blocks  # no decode in flight either
            costs.append(-(self.weight * prefill_blocks + decode_blocks))
        return self.best(costs, fleet)


def make_router(name: str, replicas: int, block_size: int) -> Router:
    if name == "round-robin":
        return RoundRobin(replicas)
    if name == "session":
        return SessionAffinity(replicas)
    if name == "prefix":
        return ApproximatePrefix(replicas, block_size)
    if name == "kv":
        return KvAware(replicas, block_size)
    raise CacheError(f"unknown router {name!r} (known: {', '.join(ROUTERS)})")


class FleetFigures:
    """What each replica of a fleet served, as the reports give it: counted as a ``Fleet``
    serves, or where ``run_replicas``' parts are merged."""

    def __init__(self, router: Router, replicas: int):
        self.router = router
        self.replicas = [ReplicaFigures(index) for index in range(replicas)]
        self.routes: list[int] = []  # the replica of each request, in arrival order

    def count(self, replica: int, session: Hashable, queries: int, hit: int, elsewhere: int) -> int:
        """A request of ``queries`` prompt tokens served by ``replica`` with ``hit``, while
        another replica held ``elsewhere``: the tokens lost to routing."""
        lost = max(0, elsewhere - hit)
        figures = self.replicas[replica]
        figures.requests += 1
        figures.sessions.setdefault(session, None)
        figures.queries += queries
        figures.hits += hit
        figures.lost_to_routing += lost
        self.routes.append(replica)
        return lost

    @property
    def lost_to_routing(self) -> int:
        return sum(figures.lost_to_routing for figures in self.replicas)

    @property
    def imbalance(self) -> float:
        """The busiest replica's prompt tokens over the mean (1.0: even)."""
        queries = [figures.queries for figures in self.replicas]
        mean = sum(queries) / len(queries)
        return max(queries) / mean if mean else 1.0

    def to_json(self) -> dict[str, object]:
        return {
            "replicas": len(self.replicas),
            "router": self.router.name,
            "lost_to_routing": self.lost_to_routing,
            "imbalance": self.imbalance,
            "per_replica": [
                {
                    "replica": figures.replica,
                    "requests": figures.requests,
                    "sessions": len(figures.sessions),
                    "prefix_cache_queries": figures.queries,
                    "prefix_cache_hits": figures.hits,
                    "prefix_cache_hit_rate": figures.hit_rate,
                    "lost_to_routing": figures.lost_to_routing,
                }
                for figures in self.replicas
            ],
        }

    def describe(self, unit: str) -> list[str]:
        """The report's lines on the fleet."""
        lines = [
            f"  {len(self.replicas)} replicas, router {self.router.name}: busiest replica {self.imbalance:.2f}× the mean "
            f"prompt {unit}s; {self.lost_to_routing:,} {unit}s lost to routing (another replica held them, other sessions' "
            "shared prefixes included; the cause table's routing row counts the session's own)"
        ]
        for figures in self.replicas:
            lines.append(
                f"    replica {figures.replica}: {figures.requests} requests, {len(figures.sessions)} sessions, "
                f"hit rate {figures.hit_rate:.1%} ({figures.hits:,} of {figures.queries:,})"
            )
        return lines


class Fleet(FleetFigures):
    """N replicas of one cache model behind ``router``; serves as one cache model does."""

    def __init__(self, caches: list[CacheModel], router: Router):
        if not caches:
            raise CacheError("a fleet needs at least one replica")
        super().__init__(router, len(caches))
        self.caches = caches
        self.granularity = caches[0].granularity
        self.metric = caches[0].metric
        self.last_replica: dict[Hashable, int] = {}
        self.count_requests = itertools.count()
        self.hashes: list[int] | None = None  # the current prompt's block hashes, for the kv router
        # Any other router: the lookups for the tokens lost to routing hash what they read.
        first = caches[0]
        self.chains = SessionChains(first.block_size) if isinstance(first, VllmPrefixCache) and not router.reads_caches else None

    def serve(self, request: CacheRequest) -> Served:
        index = next(self.count_requests)
        first = self.caches[0]
        if self.router.reads_caches and isinstance(first, VllmPrefixCache):
            self.hashes = block_hashes(request.prompt, first.block_size, request.salt)
        replica = self.router.route(index, request, self)
        self.router.routed(replica, request)
        hashes = self.chains.chain(request) if self.chains is not None else self.hashes
        if self.last_replica.get(request.session, replica) != replica:
            # The hint compares with the session's previous prompt, which another replica served.
            request = dataclasses.replace(request, shared=None)
        self.last_replica[request.session] = replica
        elsewhere = held_elsewhere([cache for r, cache in enumerate(self.caches) if r != replica], request, hashes)
        served = self.caches[replica].serve(request)
        lost = self.count(replica, request.session, len(request.prompt), served.hit, elsewhere)
        return dataclasses.replace(served, elsewhere=lost)

    def finish(self, session: Hashable) -> None:
        """``session`` sends no more requests: what each replica and the router kept for it alone goes."""
        for cache in self.caches:
            finish = getattr(cache, "finish", None)
            if finish is not None:
                finish(session)
        self.last_replica.pop(session, None)
        self.router.finish(session)
        if self.chains is not None:
            self.chains.finish(session)
