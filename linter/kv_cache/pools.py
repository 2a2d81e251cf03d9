"""What a serving engine's KV cache keeps between requests, replayed one request at a time.

Three models, each fed the token ids of every request in arrival order and answering how
many prompt tokens it served from cache:

- ``vllm``: vLLM v1's ``KVCacheManager`` and ``BlockPool`` (vllm/v1/core/kv_cache_manager.py,
  block_pool.py, kv_cache_utils.py). One pool of blocks for all requests. A full block of
  ``block_size`` tokens is cached under a hash chained on its parent's (and, for the first
  block, the request's ``cache_salt``); partial blocks are never cached. Lookup walks the
  prompt's chain and stops at the first block not cached, capped so that at least one
  prompt token is computed (``num_tokens - 1``, rounded down to whole blocks). Blocks the
  request fills, those of the reply included, are cached under their hash; the last
  sampled token is never fed back, so it has no KV. Two blocks may hold the same hash
  (a block recomputed under the cap); lookup takes the older. A finished request frees its
  blocks in reverse order to the tail of the free queue, unhashed blocks to its head;
  allocation takes from the head, evicting a cached block only when no empty one is left,
  least recently freed first; a hit takes a block back out of the queue. Block 0 is vLLM's
  null block, so a pool of N blocks holds N - 1.
- ``sglang``: SGLang's ``RadixCache`` (python/sglang/srt/mem_cache/radix_cache.py): a radix
  tree over token ids shared by all requests, ``page_size`` tokens per page (1 by default).
  Matching is capped at ``len(prompt) - 1`` and splits the node it stops inside; a finished
  request inserts its prompt and reply but the last token, and the part already in the
  tree is freed again. When the pool lacks room, unlocked leaves are evicted least recently
  used first, whole, until the shortfall is covered.
- ``llamacpp``: llama.cpp's server (tools/server/server-context.cpp): each slot keeps the
  tokens of its last request and reuses their longest common prefix with the next prompt,
  all but the last token when everything matches. With ``cache_reuse`` (``--cache-reuse N``)
  chunks of at least N tokens that match further on are shifted into place. One slot per
  session by default; with ``slots`` the sessions share that many, each request taking
  the idle slot whose tokens cover more than 10% of its prompt best
  (``--slot-prompt-similarity`` 0.1), else the least recently used one.

Not modelled: concurrency (every request finishes before the next arrives, so no request
holds blocks another wants, and generated blocks are cached before the next request is
admitted), chunked prefill and preemption (they change when blocks are cached within a
request, not what is cached after it), multimodal inputs and LoRA adapters as hash keys
(sliding-window and hybrid Mamba models' cache groups are hybrid.py's), KV offloading and
connectors, SGLang's hierarchical cache, llama.cpp's host-memory prompt cache
(``--cache-ram``) and context shift. A request that needs more KV than the pool or slot
holds is refused, as the engine refuses to start or answers 400.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import math
from array import array
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..inputs import SourceError, read_bytes
from ..tokenizer import common_prefix_length

CACHE_MODELS = ("vllm", "sglang", "llamacpp")
GIB = 1 << 30


class CacheError(Exception):
    """The capacity cannot be computed, or a request does not fit in it."""


@dataclass(frozen=True)
class CacheRequest:
    """One request as the engine's cache sees it."""

    session: Hashable
    prompt: list[int]
    generated: list[int] = field(default_factory=list)  # what the model generated, as logged
    salt: str | None = None  # vLLM's per-request cache_salt
    # Leading prompt tokens known equal to the session's previous prompt (None: compare).
    shared: int | None = None

    @property
    def computed(self) -> int:
        """Tokens whose KV the request leaves computed: the last sampled one never is."""
        return len(self.prompt) + max(len(self.generated) - 1, 0)


@dataclass(frozen=True)
class Served:
    """What the cache gave a request: ``hit`` prompt tokens, ``shared`` of them computed
    by another session's requests."""

    hit: int
    shared: int = 0
    elsewhere: int = 0  # in a fleet: prompt tokens beyond ``hit`` another replica held
    layers: int = 0  # hybrid models: tokens beyond ``hit`` full attention held, the other layers not


class CacheModel(Protocol):
    granularity: int  # a hit is a multiple of it (block or page size)
    metric: str  # the engine's own name for its hit-rate figure

    def serve(self, request: CacheRequest) -> Served: ...


# A model may also have ``finish(session)``: told after a session's last request, it drops
# what it kept for that session alone (a chain, a slot), which no other request reads.


# --- capacity ------------------------------------------------------------------------

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
}


@dataclass(frozen=True)
class KVShape:
    """What the KV cache of one token costs: ``2 (K and V) × layers × KV heads × head dim ×
    dtype bytes``, or for multi-head latent attention (DeepSeek) ``layers × (kv_lora_rank +
    qk_rope_head_dim) × dtype bytes``, as vLLM sizes a block's page."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    latent_dim: int | None = None  # MLA: one compressed latent per token and layer

    @property
    def bytes_per_token(self) -> int:
        if self.latent_dim is not None:
            return self.layers * self.latent_dim * self.dtype_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def tokens_in(self, gib: float) -> int:
        return int(gib * GIB) // self.bytes_per_token


# A model's config.json is a few kilobytes.
MAX_MODEL_CONFIG_BYTES = 1024 * 1024


def read_model_config(path: Path) -> dict[str, Any]:
    try:
        # A regular file, read no further than the cap: a FIFO waited for a writer forever,
        # /dev/zero was read without end.
        config = json.loads(read_bytes(Path(path), MAX_MODEL_CONFIG_BYTES, "a model config")[0].decode("utf-8"))
    except SourceError as error:
        raise CacheError(f"{path}: cannot read model config: {error.message}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise CacheError(f"{path}: cannot read model config: {error}") from None
    if not isinstance(config, dict):
        raise CacheError(f"{path}: a model config is a JSON object")
    # Multimodal configs keep the language model's figures under text_config.
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def kv_shape(
    config: dict[str, Any] | None,
    kv_cache_dtype: str = "auto",
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
) -> KVShape:
    """The shape from a model's config.json, each figure overridable by a flag."""
    config = config or {}

    def number(*keys: str) -> int | None:
        for key in keys:
            value = config.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    heads = number("num_attention_heads")
    hidden = number("hidden_size")
    layers = layers or number("num_hidden_layers", "n_layer", "num_layers")
    kv_heads = kv_heads or number("num_key_value_heads") or heads
    head_dim = head_dim or number("head_dim") or (hidden // heads if hidden and heads else None)
    # "auto" stores the KV cache in the model's own dtype, as vLLM does.
    dtype = (config.get("torch_dtype") or config.get("dtype") or "bfloat16") if kv_cache_dtype == "auto" else kv_cache_dtype
    dtype_bytes = DTYPE_BYTES.get(str(dtype).removeprefix("torch."))
    if dtype_bytes is None:
        raise CacheError(f"unknown KV cache dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
    latent = number("kv_lora_rank")
    if latent is not None and layers:
        return KVShape(layers, 1, 0, dtype_bytes, latent + (number("qk_rope_head_dim") or 0))
    if not (layers and kv_heads and head_dim):
        missing = [name for name, value in (("layers", layers), ("KV heads", kv_heads), ("head dim", head_dim)) if not value]
        raise CacheError(
            f"the KV cache size per token needs the model's {', '.join(missing)}: give --model-config config.json "
            "or --num-layers, --num-kv-heads and --head-dim"
        )
    return KVShape(layers, kv_heads, head_dim, dtype_bytes)


# --- vLLM ----------------------------------------------------------------------------

IN_USE = -1  # the free batch of a block a request holds


def chain_seed(salt: str | None) -> int:
    """The parent hash of a prompt's first block; a cache salt changes every block after it."""
    if salt is None:
        return 0
    return int.from_bytes(hashlib.sha256(salt.encode("utf-8", "surrogatepass")).digest()[:8], "big")


@dataclass
class _Chain:
    """A session's previous prompt, its blocks' hashes, and which of the blocks its
    request found or left cached were another session's (by position in the chain)."""

    prompt: list[int]
    hashes: list[int]
    salt: str | None
    others: list[int] = field(default_factory=list)


class _Slots:
    """Block hashes and their owners' numbers in two arrays (open addressing, linear
    probing, at most three quarters full). 0: an empty slot."""

    def __init__(self, slots: int):
        self.keys = array("q", [0]) * slots
        self.owners = array("i", [0]) * slots
        self.mask = slots - 1
        self.used = 0

    def find(self, key: int) -> int:
        keys, owners, mask = self.keys, self.owners, self.mask
        index = key & mask
        while True:
            owner = owners[index]
            if not owner or keys[index] == key:
                return owner
            index = (index + 1) & mask

    def setdefault(self, key: int, owner: int) -> int:
        keys, owners, mask = self.keys, self.owners, self.mask
        index = key & mask
        while True:
            found = owners[index]
            if not found:
                keys[index], owners[index] = key, owner
                self.used += 1
                if self.used * 4 > (mask + 1) * 3:
                    self._grow()
                return owner
            if keys[index] == key:
                return found
            index = (index + 1) & mask

    def _grow(self) -> None:
        old_keys, old_owners = self.keys, self.owners
        slots = 2 * len(old_keys)
        self.keys, self.owners, self.mask = array("q", [0]) * slots, array("i", [0]) * slots, slots - 1
        keys, owners, mask = self.keys, self.owners, self.mask
        for key, owner in zip(old_keys, old_owners):
            if owner:
                index = key & mask
                while owners[index]:
                    index = (index + 1) & mask
                keys[index], owners[index] = key, owner


class _BlockTable:
    """The blocks an unbounded vLLM pool holds: each block hash with the number of the
    session that first computed it, 12 bytes a slot (a dict of int keys took about 90 a
    block), and an unbounded pool holds every distinct block of the log. The table is 256
    tables, by the hash's top byte, each grown on its own: growing copies one of them, not
    the whole table (a 1 GB log's 7 million blocks would hold both copies of 200 MB at
    once). Sessions are numbered from 1 as they come; a finished session's number is never
    given again, so its blocks are another session's to every later request, as they are."""

    SEGMENTS = 256

    def __init__(self, slots: int = 1 << 4):
        self.segments = [_Slots(slots) for _ in range(self.SEGMENTS)]
        self.numbers: dict[Hashable, int] = {}  # the live sessions'
        self.counter = itertools.count(1)

    @property
    def used(self) -> int:
        return sum(segment.used for segment in self.segments)

    @property
    def slots(self) -> int:
        return sum(len(segment.keys) for segment in self.segments)

    def number(self, session: Hashable) -> int:
        number = self.numbers.get(session)
        if number is None:
            number = self.numbers[session] = next(self.counter)
            if number >= 1 << 31:
                raise CacheError("over 2**31 sessions: more than an unbounded pool's table numbers")
        return number

    def finish(self, session: Hashable) -> None:
        self.numbers.pop(session, None)

    def find(self, key: int) -> int:
        """The number of the session that computed the block of hash ``key``; 0: none is cached."""
        return self.segments[(key >> 56) & 255].find(key)

    def setdefault(self, key: int, owner: int) -> int:
        """The owner of ``key``'s block, ``owner`` where it was not cached (it is now)."""
        return self.segments[(key >> 56) & 255].setdefault(key, owner)


class VllmPrefixCache:
    """vLLM v1's block pool (see the module docstring). ``num_blocks`` None: unbounded.

    A block's hash is Python's 64-bit hash of (parent hash, block tokens), where vLLM
    uses sha256 of the same: a collision among a few million blocks is about as likely as
    one in vLLM's builtin-hash mode."""

    metric = "vllm:prefix_cache_hits / vllm:prefix_cache_queries"

    def __init__(self, block_size: int = 16, num_blocks: int | None = None):
        if num_blocks is not None and num_blocks < 2:
            raise CacheError("a vLLM pool needs at least 2 blocks (block 0 is the null block)")
        self.granularity = self.block_size = block_size
        self.usable = None if num_blocks is None else num_blocks - 1
        self.lookup: dict[int, int] = {}  # hash -> the block lookups find (the oldest cached)
        # Unbounded, nothing is evicted and no block needs a name: each hash and its owner.
        self.table = _BlockTable() if num_blocks is None else None
        self.duplicates: dict[int, list[int]] = {}  # hash -> younger blocks with the same hash
        self.hash_of: dict[int, int] = {}  # cached block -> its hash
        self.owner: dict[int, Hashable] = {}  # cached block -> the session that computed it
        self.freed_in: dict[int, int] = {}  # cached block -> its free batch, or IN_USE
        self.batches: deque[tuple[int, list[int]]] = deque()  # free batches, oldest first
        self.batch_position = 0  # how far eviction has read the oldest batch
        self.chains: dict[Hashable, _Chain] = {}
        self.counter = itertools.count(1)

    def holds(self, block_hash: int) -> bool:
        """Whether a block of ``block_hash`` is cached."""
        return self.table.find(block_hash) != 0 if self.table is not None else block_hash in self.lookup

    def serve(self, request: CacheRequest) -> Served:
        if self.table is not None:
            return self._serve_unbounded(request, self.table)
        size, session, lookup = self.block_size, request.session, self.lookup
        chain, _, _ = self._prompt_chain(request)
        # get_computed_blocks: the longest cached run of the chain, leaving one token to compute.
        limit = max(0, (len(request.prompt) - 1) // size)
        found = list(map(lookup.__contains__, itertools.islice(chain, limit)))
        hit_blocks = found.index(False) if False in found else len(found)
        held = list(map(lookup.__getitem__, chain[:hit_blocks]))
        shared = hit_blocks - list(map(self.owner.__getitem__, held)).count(session)
        computed = request.computed
        self.freed_in.update(dict.fromkeys(held, IN_USE))  # touch: out of the free queue
        # allocate_slots: the rest of the prompt and the reply, evicting only what is short.
        self._make_room(-(-computed // size), hit_blocks, request)
        # cache_full_blocks: every block the request filled, the reply's too.
        full = computed // size
        hashes = chain if full == len(chain) else chain + self._reply_hashes(chain, request, full)
        new_blocks = [next(self.counter) for _ in range(hit_blocks, full)]
        for block, block_hash in zip(new_blocks, hashes[hit_blocks:]):
            self.hash_of[block] = block_hash
            self.owner[block] = session
            first = lookup.setdefault(block_hash, block)
            if first != block:  # vLLM caches it beside the older block, not in its place
                self.duplicates.setdefault(block_hash, []).append(block)
        # free: tail blocks first, so they are evicted before the head of the prompt
        # (the partial block, never hashed, goes back to the head of the queue: room).
        held.extend(new_blocks)
        held.reverse()
        batch = next(self.counter)
        self.freed_in.update(dict.fromkeys(held, batch))
        self.batches.append((batch, held))
        return Served(hit_blocks * size, shared * size)

    def _serve_unbounded(self, request: CacheRequest, table: _BlockTable) -> Served:
        """``serve`` where nothing is evicted: the pool still holds every block the
        session's previous request found or left, and looks each hash up to the same block,
        so only the rest of the chain is looked up; which of the blocks were another
        session's is kept with the chain (``_Chain.others``)."""
        size = self.block_size
        me = table.number(request.session)
        chain, kept, earlier_others = self._prompt_chain(request)
        limit = max(0, (len(request.prompt) - 1) // size)
        start = min(kept, limit)
        others = [position for position in earlier_others if position < start]
        hit_blocks = start
        for block_hash in itertools.islice(chain, start, limit):
            owner = table.find(block_hash)
            if not owner:
                break
            if owner != me:
                others.append(hit_blocks)
            hit_blocks += 1
        shared = len(others)
        full = request.computed // size
        hashes = chain if full == len(chain) else chain + self._reply_hashes(chain, request, full)
        # Each hash once, under the session that first computed it (the owner of the block
        # lookups find); a younger block of the same hash is never looked up.
        for position, block_hash in zip(range(hit_blocks, full), hashes[hit_blocks:]):
            if table.setdefault(block_hash, me) != me:
                others.append(position)
        self.chains[request.session].others = others
        return Served(hit_blocks * size, shared * size)

    def finish(self, session: Hashable) -> None:
        """``session`` sends no more requests: its previous prompt and chain go (its blocks stay)."""
        self.chains.pop(session, None)
        if self.table is not None:
            self.table.finish(session)

    def _prompt_chain(self, request: CacheRequest) -> tuple[list[int], int, list[int]]:
        """The prompt's full-block hashes, reusing the session's previous chain for the
        tokens its previous prompt shares; how many it reused; the previous ``others``."""
        size, prompt = self.block_size, request.prompt
        previous = self.chains.get(request.session)
        if previous is not None and previous.salt == request.salt:
            shared = common_prefix_length(previous.prompt, prompt) if request.shared is None else request.shared
            kept = min(shared // size, len(previous.hashes))
            hashes, others = previous.hashes[:kept], previous.others
        else:
            kept, hashes, others = 0, [], []
        parent = hashes[-1] if hashes else chain_seed(request.salt)
        for start in range(kept * size, len(prompt) - size + 1, size):
            parent = hash((parent, tuple(prompt[start : start + size])))
            hashes.append(parent)
        self.chains[request.session] = _Chain(prompt, hashes, request.salt)
        return hashes, kept, others

    def _reply_hashes(self, chain: list[int], request: CacheRequest, full: int) -> list[int]:
        size = self.block_size
        start = len(chain) * size
        tokens = request.prompt[start:] + request.generated[: max(len(request.generated) - 1, 0)]
        parent = chain[-1] if chain else chain_seed(request.salt)
        out = []
        for offset in range(0, (full - len(chain)) * size, size):
            parent = hash((parent, tuple(tokens[offset : offset + size])))
            out.append(parent)
        return out

    def _make_room(self, blocks: int, held: int, request: CacheRequest) -> None:
        """Room for a request of ``blocks`` blocks, ``held`` of them hits it already holds."""
        usable = self.usable
        if usable is None:  # an unbounded pool has room for all
            return
        if blocks > usable:
            raise CacheError(
                f"a request needs {blocks} blocks ({request.computed} tokens) and the pool holds {usable}: "
                "vLLM does not start with a max_model_len that does not fit"
            )
        short = (blocks - held) - (usable - len(self.hash_of))
        while short > 0:
            batch, queued = self.batches[0]
            position = self.batch_position
            while position < len(queued) and short > 0:
                block = queued[position]
                position += 1
                if self.freed_in.get(block) == batch:
                    self._evict(block)
                    short -= 1
            if position == len(queued):
                self.batches.popleft()
                position = 0
            self.batch_position = position

    def _evict(self, block: int) -> None:
        block_hash = self.hash_of.pop(block)
        del self.freed_in[block], self.owner[block]
        younger = self.duplicates.get(block_hash)
        if self.lookup[block_hash] == block:
            if younger:
                self.lookup[block_hash] = younger.pop(0)
            else:
                del self.lookup[block_hash]
        else:
            self.duplicates[block_hash].remove(block)  # a block not looked up is a younger duplicate
        if younger is not None and not younger:
            del self.duplicates[block_hash]


# --- SGLang --------------------------------------------------------------------------


class _Node:
    __slots__ = ("children", "parent", "key", "last_access", "locks", "owner", "order")

    def __init__(self, key: list[int], parent: _Node | None, owner: Hashable, order: int, last_access: int):
        self.children: dict[Hashable, _Node] = {}
        self.parent = parent
        self.key = key  # the token ids on the edge from the parent
        self.last_access = last_access
        self.locks = 0
        self.owner = owner
        self.order = order  # creation order: ties in eviction go to the older node


class SglangRadixCache:
    """SGLang's radix cache (see the module docstring). ``capacity_tokens`` None: unbounded.

    SGLang collects the leaves into a heap at each eviction; here a heap of leaves lives
    across requests, an entry going stale when its node is used again, splits or goes."""

    metric = "sglang:cache_hit_rate (cached prompt tokens / prompt tokens)"

    def __init__(self, page_size: int = 1, capacity_tokens: int | None = None):
        self.granularity = self.page_size = page_size
        self.capacity = capacity_tokens
        self.clock = 0
        self.counter = itertools.count()
        self.root = _Node([], None, None, next(self.counter), 0)
        self.size = 0  # tokens held by the tree
        self.leaves: list[tuple[int, int, _Node]] = []  # (last access, creation order, node)

    def serve(self, request: CacheRequest) -> Served:
        self.clock += 1
        prompt, page = request.prompt, self.page_size
        path, hit = self._match(prompt, (len(prompt) - 1) // page * page)
        shared = sum(len(node.key) for node in path if node.owner != request.session)
        if self.capacity is not None:
            if request.computed > self.capacity:
                raise CacheError(
                    f"a request needs {request.computed} tokens of KV and the pool holds {self.capacity}: "
                    "SGLang does not admit it"
                )
            for node in path:  # the matched prefix is locked while the request runs
                node.locks += 1
            self._evict(request.computed - hit - (self.capacity - self.size))
            for node in path:
                node.locks -= 1
        # After prefill the scheduler inserts the prompt (cache_unfinished_req), at finish the
        # prompt and what was generated but the last sampled token (cache_finished_req): the
        # tree keeps a node boundary where the prompt ends, so eviction, which takes whole
        # leaves, can drop a reply and keep its prompt.
        self._insert(prompt[: len(prompt) // page * page], request.session)
        tokens = prompt + request.generated[: max(len(request.generated) - 1, 0)]
        self._insert(tokens[: len(tokens) // page * page], request.session)
        return Served(hit, shared)

    def _key(self, tokens: list[int], position: int = 0) -> Hashable:
        return tokens[position] if self.page_size == 1 else tuple(tokens[position : position + self.page_size])

    def _touch(self, node: _Node) -> None:
        node.last_access = self.clock
        if not node.children:
            heapq.heappush(self.leaves, (node.last_access, node.order, node))

    def _match(self, tokens: list[int], limit: int) -> tuple[list[_Node], int]:
        node, position, path = self.root, 0, []
        while position < limit:
            child = node.children.get(self._key(tokens, position))
            if child is None:
                break
            self._touch(child)
            length = min(len(child.key), limit - position)
            matched = common_prefix_length(child.key, tokens[position : position + length]) // self.page_size * self.page_size
            if matched < len(child.key):
                child = self._split(child, matched)  # also where the capped prompt ends inside it
            path.append(child)
            position += matched
            node = child
            if matched < length:
                break
        return path, position

    def _split(self, child: _Node, length: int) -> _Node:
        parent = child.parent
        assert parent is not None  # only a child is split, never the root
        head = _Node(child.key[:length], parent, child.owner, next(self.counter), self.clock)
        head.locks = child.locks
        child.key = child.key[length:]
        child.parent = head
        head.children[self._key(child.key)] = child
        parent.children[self._key(head.key)] = head
        return head

    def _insert(self, tokens: list[int], session: Hashable) -> None:
        node, position = self.root, 0
        while position < len(tokens):
            child = node.children.get(self._key(tokens, position))
            if child is None:
                leaf = _Node(tokens[position:], node, session, next(self.counter), self.clock)
                node.children[self._key(leaf.key)] = leaf
                self.size += len(leaf.key)
                self._touch(leaf)
                return
            self._touch(child)
            matched = common_prefix_length(child.key, tokens[position : position + len(child.key)])
            matched = matched // self.page_size * self.page_size
            if matched < len(child.key):
                child = self._split(child, matched)
            position += matched
            node = child

    def _evict(self, short: int) -> None:
        """Whole leaves, least recently used first, until ``short`` tokens are free."""
        locked = []
        while short > 0 and self.leaves:
            entry = heapq.heappop(self.leaves)
            last_access, _, node = entry
            if node.parent is None or node.children or last_access != node.last_access:
                continue  # evicted, no longer a leaf, or used since
            if node.locks:
                locked.append(entry)
                continue
            parent = node.parent
            del parent.children[self._key(node.key)]
            node.parent = None
            self.size -= len(node.key)
            short -= len(node.key)
            if not parent.children and parent is not self.root:
                heapq.heappush(self.leaves, (parent.last_access, parent.order, parent))
        for entry in locked:
            heapq.heappush(self.leaves, entry)
        if short > 0:
            raise CacheError("the request holds more KV than the pool has")


# --- llama.cpp -----------------------------------------------------------------------

SLOT_PROMPT_SIMILARITY = 0.1  # llama-server's default --slot-prompt-similarity


@dataclass
class _Slot:
    tokens: list[int] = field(default_factory=list)
    session: Hashable = None
    last_used: int = -1


class LlamaCppSlots:
    """llama.cpp server slots (see the module docstring). ``slots`` None: one per session,
    unbounded; else that many slots of ``slot_tokens`` each (None: unbounded)."""

    metric = "cached prompt tokens (timings.cache_n / prompt tokens)"
    granularity = 1

    def __init__(self, slots: int | None = None, slot_tokens: int | None = None, cache_reuse: int = 0):
        self.slot_tokens = slot_tokens
        self.cache_reuse = cache_reuse
        self.shared_slots = [_Slot() for _ in range(slots)] if slots else None
        self.by_session: dict[Hashable, _Slot] = {}
        self.clock = 0

    def serve(self, request: CacheRequest) -> Served:
        self.clock += 1
        prompt = request.prompt
        if self.slot_tokens is not None and len(prompt) >= self.slot_tokens:
            raise CacheError(
                f"a request of {len(prompt)} tokens does not fit a slot of {self.slot_tokens}: "
                "llama-server answers that it exceeds the available context size"
            )
        slot = self._slot(request)
        past = common_prefix_length(slot.tokens, prompt)
        if self.cache_reuse > 0:
            past = self._reuse_chunks(slot.tokens, prompt, past)
        if past == len(prompt) and past > 0:
            past -= 1  # at least one token is evaluated, for the logits
        shared = past if slot.session is not None and slot.session != request.session else 0
        tokens = prompt + request.generated[: max(len(request.generated) - 1, 0)]
        slot.tokens = tokens[: self.slot_tokens] if self.slot_tokens is not None else tokens
        slot.session, slot.last_used = request.session, self.clock
        return Served(past, shared)

    def finish(self, session: Hashable) -> None:
        """``session`` sends no more requests: a slot of its own is never looked at again."""
        self.by_session.pop(session, None)

    def _slot(self, request: CacheRequest) -> _Slot:
        if self.shared_slots is None:
            return self.by_session.setdefault(request.session, _Slot())
        prompt, best, chosen = request.prompt, 0.0, None
        for slot in self.shared_slots:
            if slot.tokens:
                similarity = common_prefix_length(slot.tokens, prompt) / len(prompt)
                if similarity > best and similarity > SLOT_PROMPT_SIMILARITY:
                    best, chosen = similarity, slot
        if chosen is None:  # least recently used; among equals the last, as llama-server scans
            chosen = min(reversed(self.shared_slots), key=lambda slot: slot.last_used)
        return chosen

    def _reuse_chunks(self, cached: list[int], prompt: list[int], past: int) -> int:
        """llama-server's --cache-reuse: chunks of the slot's tokens that match the prompt
        further on, at least ``cache_reuse`` long, shifted into place."""
        head_cached = head_prompt = past
        while head_cached < len(cached) and head_prompt < len(prompt):
            if cached[head_cached] != prompt[head_prompt]:
                head_cached += 1
                continue
            match = 1
            while (
                head_cached + match < len(cached)
                and head_prompt + match < len(prompt)
                and cached[head_cached + match] == prompt[head_prompt + match]
            ):
                match += 1
            if match >= self.cache_reuse:
                past += match
                head_cached += match
                head_prompt += match
            else:
                head_cached += 1
        return past


def make_cache(
    model: str,
    block_size: int = 16,
    capacity_blocks: int | None = None,
    page_size: int = 1,
    slots: int | None = None,
    cache_reuse: int = 0,
) -> CacheModel:
    """A fresh cache of ``model``. ``capacity_blocks`` counts vLLM blocks of ``block_size``
    tokens (block 0 included, as vLLM's num_gpu_blocks); the other models get the same
    memory, ``capacity_blocks × block_size`` tokens, llama.cpp split evenly over its slots."""
    tokens = None if capacity_blocks is None else capacity_blocks * block_size
    if model == "vllm":
        return VllmPrefixCache(block_size, capacity_blocks)
    if model == "sglang":
        return SglangRadixCache(page_size, tokens)
    if model == "llamacpp":
        if tokens is not None and not slots:
            raise CacheError("with --cache-model llamacpp a capacity is split over --slots N; give it")
        return LlamaCppSlots(slots, None if tokens is None or slots is None else tokens // slots, cache_reuse)
    raise CacheError(f"unknown cache model {model!r} (known: {', '.join(CACHE_MODELS)})")


def blocks_for_memory(gib: float, shape: KVShape, block_size: int) -> int:
    return max(0, math.floor(shape.tokens_in(gib) / block_size))


def capacities(
    cache_blocks: str | None,
    kv_cache_gib: float | None,
    block_size: int,
    shape: KVShape | None = None,
) -> list[int | None]:
    """The pool sizes to replay, in vLLM blocks: ``--cache-blocks 1000,4000,16000`` or the
    blocks ``--kv-cache-gib`` holds; none given, one unbounded pool."""
    if cache_blocks is not None and kv_cache_gib is not None:
        raise CacheError("give --cache-blocks or --kv-cache-gib, not both")
    if kv_cache_gib is not None:
        if shape is None:
            raise CacheError(
                "--kv-cache-gib needs the KV size per token: --model-config or --num-layers/--num-kv-heads/--head-dim"
            )
        blocks = blocks_for_memory(kv_cache_gib, shape, block_size)
        if blocks < 2:
            raise CacheError(
                f"--kv-cache-gib {kv_cache_gib:g} holds {blocks} blocks of {block_size} tokens at "
                f"{shape.bytes_per_token} bytes per token: too few to cache anything"
            )
        return [blocks]
    if cache_blocks is None:
        return [None]
    sizes: list[int | None] = []
    for part in cache_blocks.split(","):
        try:
            size = int(part.strip().replace("_", ""))
        except ValueError:
            raise CacheError(f"--cache-blocks: {part.strip()!r} is not a number of blocks") from None
        if size < 2:
            raise CacheError(f"--cache-blocks: {size} blocks hold nothing (block 0 is vLLM's null block)")
        sizes.append(size)
    return sizes
