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
import itertools
from collections import OrderedDict
from collections.abc import Hashable
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


def cached_prefix(cache: CacheModel, request: CacheRequest, hashes: list[int] | None = None, cap: bool = True) -> int:
    """The prompt tokens ``cache`` would serve ``request`` now, without serving it: what
    the cache holds (``cap``: less the one token every engine computes)."""
    prompt = request.prompt
    if isinstance(cache, VllmPrefixCache):
        size = cache.block_size
        if hashes is None:
            hashes = block_hashes(prompt, size, request.salt)
        limit = (len(prompt) - 1) // size if cap else len(hashes)
        found = 0
        for block_hash in itertools.islice(hashes, limit):
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

    def __init__(self, replicas: int):
        self.replicas = replicas

    def route(self, index: int, request: CacheRequest, fleet: Fleet) -> int:
        raise NotImplementedError

    def routed(self, replica: int, request: CacheRequest) -> None:
        """What the router remembers of where it sent ``request``."""

    def finish(self, session: Hashable) -> None:
        """What the router kept for ``session`` alone, which sends no more requests."""

    def best(self, scores: list[float], fleet: Fleet) -> int:
        """The highest score; among equals the replica with the fewest requests, then the first."""
        return max(range(self.replicas), key=lambda r: (scores[r], -fleet.replicas[r].requests, -r))


class RoundRobin(Router):
    name = "round-robin"

    def route(self, index: int, request: CacheRequest, fleet: Fleet) -> int:
        return index % self.replicas


class SessionAffinity(Router):
    name = "session"

    def __init__(self, replicas: int):
        super().__init__(replicas)
        self.home: dict[Hashable, int] = {}

    def route(self, index: int, request: CacheRequest, fleet: Fleet) -> int:
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

    def route(self, index: int, request: CacheRequest, fleet: Fleet) -> int:
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

    def __init__(self, replicas: int, block_size: int, overlap_score_weight: float = KV_OVERLAP_SCORE_WEIGHT):
        super().__init__(replicas)
        self.block_size, self.weight = block_size, overlap_score_weight

    def route(self, index: int, request: CacheRequest, fleet: Fleet) -> int:
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


class Fleet:
    """N replicas of one cache model behind ``router``; serves as one cache model does."""

    def __init__(self, caches: list[CacheModel], router: Router):
        if not caches:
            raise CacheError("a fleet needs at least one replica")
        self.caches = caches
        self.router = router
        self.granularity = caches[0].granularity
        self.metric = caches[0].metric
        self.replicas = [ReplicaFigures(index) for index in range(len(caches))]
        self.last_replica: dict[Hashable, int] = {}
        self.count = itertools.count()
        self.hashes: list[int] | None = None  # the current prompt's block hashes, for vLLM replicas
        self.routes: list[int] = []  # the replica of each request, in arrival order

    def serve(self, request: CacheRequest) -> Served:
        index = next(self.count)
        first = self.caches[0]
        self.hashes = block_hashes(request.prompt, first.block_size, request.salt) if isinstance(first, VllmPrefixCache) else None
        replica = self.router.route(index, request, self)
        self.router.routed(replica, request)
        if self.last_replica.get(request.session, replica) != replica:
            # The hint compares with the session's previous prompt, which another replica served.
            request = dataclasses.replace(request, shared=None)
        self.last_replica[request.session] = replica
        elsewhere = 0
        if len(self.caches) > 1:
            elsewhere = max(cached_prefix(cache, request, self.hashes) for r, cache in enumerate(self.caches) if r != replica)
        served = self.caches[replica].serve(request)
        figures = self.replicas[replica]
        figures.requests += 1
        figures.sessions.setdefault(request.session, None)
        figures.queries += len(request.prompt)
        figures.hits += served.hit
        figures.lost_to_routing += max(0, elsewhere - served.hit)
        self.routes.append(replica)
        return dataclasses.replace(served, elsewhere=max(0, elsewhere - served.hit))

    def finish(self, session: Hashable) -> None:
        """``session`` sends no more requests: what each replica and the router kept for it alone goes."""
        for cache in self.caches:
            finish = getattr(cache, "finish", None)
            if finish is not None:
                finish(session)
        self.last_replica.pop(session, None)
        self.router.finish(session)

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
