"""vLLM's KV cache for hybrid models: several KV-cache groups sharing one block pool.

A model whose layers are not all full attention (gpt-oss: sliding-window layers beside
full-attention ones; Mamba2 or linear-attention hybrids) gets one KV-cache group per
kind of layer, and vLLM's ``HybridKVCacheCoordinator`` (vllm/v1/core/kv_cache_coordinator.py,
single_type_kv_cache_manager.py, block_pool.py, vLLM 0.33.0) serves them from one pool.
This module replays that, block for block:

- One ``BlockPool`` of ``num_blocks`` (block 0 the null block) shared by every group;
  each group allocates its own blocks for the same tokens, and a cached block is keyed by
  (block hash, group), so each group's copy is evicted on its own.
- A hit must hold in every group: starting at ``prompt - 1``, each group in turn (full
  attention first) may shorten the length, until none does. Full attention: the longest
  run of cached blocks from the start. Sliding window: scanning right to left, the first
  place where the ``cdiv(window - 1, block)`` blocks before it are all cached (or a shorter
  run from the very start). Mamba: scanning right to left, the first block boundary whose
  one state block is cached.
- What is cached: full attention caches every full block, the reply's too. Sliding-window
  and Mamba groups (``prefix_cache_retention_interval`` 0, vLLM's default) cache only what
  can serve a hit at a reachable boundary: the replay boundary (``prompt - 1`` rounded
  down to the scheduler block) and the request's shared-prefix junction; the window's
  blocks ending there, or the one Mamba state block. Never blocks of generated tokens.
- The shared-prefix junction: when full attention hits further than a sparse group, the
  request remembers where full attention stopped and caches its sparse blocks there too.
- Freeing: before each step a request's sliding-window blocks outside the window go back
  to the pool (cached ones to the tail of the free queue, the rest to its head); Mamba
  "align" keeps only the running state block. But a prefill step allocates the whole
  prompt's window blocks at once.
- Steps: a prompt is prefilled in steps of at most ``max_num_batched_tokens``; with Mamba
  groups each step ends on a block boundary and stops at the reachable boundaries
  (``Scheduler._mamba_block_aligned_split``), so the state there is computed. Then one
  step per generated token but the last; then the request is freed.

Not modelled: chunked-local attention, cross attention, EAGLE/MTP drafts, KV connectors,
a positive ``prefix_cache_retention_interval``, partial (sub-block) hits, and different
block sizes per group (every group here has the scheduler's block size, which is how vLLM
pads a Mamba state page to an attention page).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from .pools import CacheError, CacheRequest, Served, chain_seed

FULL, SLIDING, MAMBA = "full", "sliding_window", "mamba"
MAX_NUM_BATCHED_TOKENS = 8192  # `vllm serve`'s default on H100/H200-class GPUs


@dataclass(frozen=True)
class Group:
    kind: str  # FULL, SLIDING or MAMBA
    sliding_window: int | None = None

    @property
    def window(self) -> int:
        """The sliding window in tokens: a SLIDING group is made with one."""
        assert self.sliding_window is not None, "only a sliding-window group has a window"
        return self.sliding_window


@dataclass(frozen=True)
class Layout:
    """A model's KV-cache groups and the block size they share."""

    groups: tuple[Group, ...]
    block_size: int = 16

    @property
    def hybrid(self) -> bool:
        return any(group.kind != FULL for group in self.groups)

    def describe(self) -> str:
        names = {FULL: "full attention", MAMBA: "Mamba (state)"}
        kinds = [names.get(group.kind) or f"sliding window {group.sliding_window}" for group in self.groups]
        return ", ".join(f"{count} × {kind}" if count > 1 else kind for kind, count in _runs(kinds))


def _runs(items: list[str]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for item in items:
        if out and out[-1][0] == item:
            out[-1] = (item, out[-1][1] + 1)
        else:
            out.append((item, 1))
    return out


def groups_from_golden(config: dict[str, Any]) -> Layout:
    """The layout of a ``kv_cache_config`` as vLLM printed it (engine-golden)."""
    kinds = {"FullAttentionSpec": FULL, "SlidingWindowSpec": SLIDING, "MambaSpec": MAMBA}
    groups = tuple(Group(kinds[group["spec"]], group.get("sliding_window")) for group in config["groups"])
    return Layout(groups, config["scheduler_block_size"])


def layout_from_model_config(config: dict[str, Any], block_size: int = 16) -> Layout:
    """The KV-cache groups vLLM builds from a model's config.json: a group per kind of layer,
    as many groups of a kind as it takes to hold its layers in groups of the smallest
    kind's size (``kv_cache_planning.get_global_kv_cache_groups``)."""
    layer_types = config.get("layer_types") or config.get("layers_block_type") or config.get("hybrid_override_pattern")
    if isinstance(layer_types, str):  # Nemotron-H's pattern: M Mamba, * attention, - MLP
        layer_types = [{"M": "mamba", "*": "attention"}.get(char) for char in layer_types if char in "M*"]
    window = config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        window = None
    if not isinstance(layer_types, list) or not layer_types:
        # Every layer alike: a sliding window (Mistral 7B v0.1) unless the config turns it off (Qwen2, Qwen3).
        if window is not None and config.get("use_sliding_window", True) is not False:
            return Layout((Group(SLIDING, window),), block_size)
        return Layout((Group(FULL),), block_size)
    counts: dict[Group, int] = {}
    for kind in layer_types:
        kind = str(kind).lower()
        if kind in ("sliding_attention", "sliding_window", "local", "local_attention"):
            if window is None:
                raise CacheError("the model config has sliding-window layers but no sliding_window size")
            group = Group(SLIDING, window)
        elif kind in ("mamba", "mamba2", "linear_attention", "linear", "ssm", "gated_deltanet"):
            group = Group(MAMBA)
        elif kind in ("full_attention", "attention", "global", "hybrid"):
            group = Group(FULL)
        else:
            raise CacheError(f"the model config names a layer type replay does not know: {kind!r}")
        counts[group] = counts.get(group, 0) + 1
    if len(counts) == 1:
        return Layout((next(iter(counts)),), block_size)
    size = min(counts.values())
    groups: list[Group] = []
    # vLLM orders the groups by the layers' order in the model; sparse kinds first is what
    # gpt-oss and Nemotron-H give (their first layer is sliding / Mamba).
    for group, count in sorted(counts.items(), key=lambda item: item[0].kind == FULL):
        groups.extend([group] * math.ceil(count / size))
    return Layout(tuple(groups), block_size)


class _Block:
    __slots__ = ("key", "owner", "refs")

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None  # (block hash, group) while cached
        self.owner: Hashable = None  # the session whose request cached it
        self.refs = 0


class _Pool:
    """vLLM's BlockPool. Its free queue, evicted from the head, holds the blocks without a
    hash first (never used, or freed uncached: those go to the head) and then the cached
    ones in the order they were freed: so here a stack of the former, a count of blocks not
    yet made (nothing is allocated before it is used) and an ordered set of the latter."""

    def __init__(self, num_blocks: int | None):
        # None: unbounded, a fresh block whenever one is needed, so nothing is ever evicted.
        self.bounded = num_blocks is not None
        self.null = _Block()
        self.unmade = num_blocks - 1 if num_blocks is not None else 0
        self.spare: list[_Block] = []
        self.evictable: OrderedDict[_Block, None] = OrderedDict()
        self.cached: dict[tuple[int, int], dict[_Block, None]] = {}

    @property
    def free(self) -> int:
        return self.unmade + len(self.spare) + len(self.evictable)

    def get_cached(self, block_hash: int, group: int) -> _Block | None:
        found = self.cached.get((block_hash, group))
        return next(iter(found)) if found else None

    def cached_block(self, block_hash: int, group: int) -> _Block:
        """A block the caller has just found cached (``get_cached``)."""
        block = self.get_cached(block_hash, group)
        assert block is not None, "looked up after it was found cached"
        return block

    def new_blocks(self, count: int) -> list[_Block]:
        if self.bounded and count > self.free:
            raise CacheError(f"the pool has {self.free} free blocks and a step needs {count}: vLLM cannot schedule it")
        out = []
        for _ in range(count):
            if self.spare:
                block = self.spare.pop()
            elif self.unmade or not self.bounded:
                block = _Block()
                self.unmade -= self.bounded
            else:
                block = self.evictable.popitem(last=False)[0]
                key = block.key
                assert key is not None, "an evictable block is cached under its key"
                holders = self.cached[key]
                del holders[block]
                if not holders:
                    del self.cached[key]
                block.key = block.owner = None
            block.refs = 1
            out.append(block)
        return out

    def touch(self, blocks: list[_Block]) -> None:
        for block in blocks:
            if block is self.null:
                continue
            if block.refs == 0 and self.bounded:
                del self.evictable[block]
            block.refs += 1

    def release(self, ordered: list[_Block]) -> None:
        """free_blocks: the first of ``ordered`` is evicted first among the cached ones."""
        for block in ordered:
            if block is self.null:
                continue
            block.refs -= 1
            if block.refs == 0 and self.bounded:
                if block.key is None:
                    self.spare.append(block)
                else:
                    self.evictable[block] = None

    def cache(self, block: _Block, block_hash: int, group: int, owner: Hashable) -> None:
        if block is self.null or block.key is not None:
            return
        block.key, block.owner = (block_hash, group), owner
        self.cached.setdefault(block.key, {})[block] = None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class HybridPrefixCache:
    """vLLM's hybrid KV-cache coordinator over one pool (see the module docstring).
    ``num_blocks`` None: a pool nothing is ever evicted from."""

    metric = "vllm:prefix_cache_hits / vllm:prefix_cache_queries"

    def __init__(self, layout: Layout, num_blocks: int | None = None, max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS):
        if num_blocks is not None and num_blocks < 2:
            raise CacheError("a vLLM pool needs at least 2 blocks (block 0 is the null block)")
        self.layout = layout
        self.granularity = self.block_size = layout.block_size
        self.pool = _Pool(num_blocks)
        self.step_tokens = max_num_batched_tokens

    # --- lookup ------------------------------------------------------------------

    def _hashes(self, tokens: list[int], salt: str | None) -> list[int]:
        size, parent, out = self.block_size, chain_seed(salt), []
        for start in range(0, len(tokens) - size + 1, size):
            parent = hash((parent, tuple(tokens[start : start + size])))
            out.append(parent)
        return out

    def _find(self, group: int, hashes: list[int], length: int) -> tuple[list[_Block], int]:
        """The group's longest hit no longer than ``length`` tokens, and its blocks
        (the null block where the group needs none)."""
        pool, size, spec = self.pool, self.block_size, self.layout.groups[group]
        limit = length // size
        if spec.kind == FULL:
            blocks = []
            for block_hash in hashes[:limit]:
                block = pool.get_cached(block_hash, group)
                if block is None:
                    break
                blocks.append(block)
            return blocks, len(blocks) * size
        if spec.kind == SLIDING:
            need = _cdiv(spec.window - 1, size)
            run = 0
            for index in range(limit - 1, -1, -1):
                block = pool.get_cached(hashes[index], group)
                if block is None:
                    run = 0
                    continue
                run += 1
                if run >= need:
                    end = index + run
                    blocks = [pool.null] * index + [pool.cached_block(hashes[i], group) for i in range(index, end)]
                    return blocks, end * size
            blocks = [pool.cached_block(hashes[i], group) for i in range(run)]
            return blocks, run * size
        for index in range(limit - 1, -1, -1):  # Mamba: one state block at the boundary
            block = pool.get_cached(hashes[index], group)
            if block is not None:
                return [pool.null] * index + [block], (index + 1) * size
        return [], 0

    def _longest_hit(self, hashes: list[int], max_length: int) -> tuple[list[list[_Block]], int, int]:
        """HybridKVCacheCoordinator.find_longest_cache_hit: the hit all groups agree on,
        each group's blocks, and where full attention alone would have stopped."""
        order = sorted(range(len(self.layout.groups)), key=lambda g: self.layout.groups[g].kind != FULL)
        length, full_length = max_length, None
        found: dict[int, list[_Block]] = {}
        while True:
            changed = False
            for group in order:
                blocks, hit = self._find(group, hashes, length)
                found[group] = blocks
                if full_length is None and self.layout.groups[group].kind == FULL:
                    full_length = hit
                if hit < length:
                    length, changed = hit, True
            if not changed:
                break
        size = self.block_size
        out = []
        for group in range(len(self.layout.groups)):
            blocks = found[group][: length // size]
            out.append(blocks)
        return out, length, full_length if full_length is not None else length

    # --- one request ---------------------------------------------------------------

    def serve(self, request: CacheRequest) -> Served:
        prompt, size = request.prompt, self.block_size
        if not prompt:
            return Served(0)
        tokens = prompt + request.generated[: max(len(request.generated) - 1, 0)]
        hashes = self._hashes(tokens, request.salt)
        prompt_blocks = len(prompt) // size
        computed_blocks, hit, full_hit = self._longest_hit(hashes[:prompt_blocks], len(prompt) - 1)
        junction = full_hit if full_hit > hit else 0
        # Another session's blocks: counted in the group that holds the most (full attention's, if any).
        densest = max(computed_blocks, key=lambda blocks: sum(block is not self.pool.null for block in blocks))
        shared = sum(1 for block in densest if block.owner not in (None, request.session))
        self._run(request, tokens, hashes, computed_blocks, hit, junction)
        return Served(hit, min(hit, shared * size), layers=full_hit - hit)

    def peek(self, request: CacheRequest, cap: bool = True) -> int:
        """The hit ``request`` would get now, without serving it."""
        prompt = request.prompt
        hashes = self._hashes(prompt, request.salt)
        return self._longest_hit(hashes, len(prompt) - 1 if cap else len(prompt))[1]

    def _boundaries(self, prompt_tokens: int, junction: int) -> list[int]:
        size = self.block_size
        out = [(prompt_tokens - 1) // size * size]
        if junction:
            out.append(junction // size * size)
        return out

    def _steps(self, prompt_tokens: int, hit: int, boundaries: list[int]) -> list[int]:
        """Where each prefill step ends."""
        mamba = any(group.kind == MAMBA for group in self.layout.groups)
        stops = sorted({b for b in boundaries if b > hit} | {prompt_tokens}) if mamba else [prompt_tokens]
        ends, at = [], hit
        for stop in stops:
            while at < stop:
                end = min(stop, at + self.step_tokens)
                if mamba and end < stop:
                    end = end // self.block_size * self.block_size
                ends.append(end)
                at = end
        return ends

    def _run(
        self,
        request: CacheRequest,
        tokens: list[int],
        hashes: list[int],
        computed_blocks: list[list[_Block]],
        hit: int,
        junction: int,
    ) -> None:
        """The request's steps (prefill, then one a generated token), then its free."""
        pool, size, groups = self.pool, self.block_size, self.layout.groups
        prompt_tokens = len(request.prompt)
        boundaries = self._boundaries(prompt_tokens, junction)
        tables: list[list[_Block]] = []
        for blocks in computed_blocks:
            pool.touch(blocks)
            tables.append(list(blocks))
        cached_upto = [len(blocks) for blocks in computed_blocks]
        state_index: list[int | None] = [len(blocks) - 1 if blocks else None for blocks in computed_blocks]
        computed = hit
        ends = self._steps(prompt_tokens, hit, boundaries) + list(range(prompt_tokens + 1, len(tokens) + 1))
        try:
            for end in ends:
                for group, spec in enumerate(groups):
                    self._skip(group, spec, tables[group], computed, state_index)
                for group, spec in enumerate(groups):
                    self._allocate(group, spec, tables[group], end, state_index)
                for group, spec in enumerate(groups):
                    full = min(end, len(tokens)) // size
                    for index in range(cached_upto[group], full):
                        if spec.kind == FULL or self._reachable(spec, index, boundaries):
                            block = tables[group][index]
                            pool.cache(block, hashes[index], group, request.session)
                    cached_upto[group] = max(cached_upto[group], full)
                computed = end
        finally:
            for table in tables:
                pool.release(list(reversed(table)))

    def _reachable(self, spec: Group, index: int, boundaries: list[int]) -> bool:
        size = self.block_size
        for boundary in boundaries:
            end = boundary // size
            if spec.kind == MAMBA and index == end - 1:
                return True
            if spec.kind == SLIDING and end - _cdiv(spec.window - 1, size) <= index < end:
                return True
        return False

    def _skip(self, group: int, spec: Group, table: list[_Block], computed: int, state_index: list[int | None]) -> None:
        """remove_skipped_blocks: what the next step no longer reads goes back to the pool."""
        if spec.kind == FULL:
            return
        pool, size = self.pool, self.block_size
        skipped = computed - spec.window + 1 if spec.kind == SLIDING else computed - 1
        if skipped > 0:
            last = min(skipped // size, len(table))
            freed = []
            for index in range(last - 1, -1, -1):
                if table[index] is pool.null:
                    break
                freed.append(table[index])
                table[index] = pool.null
            pool.release(freed)
        if spec.kind == MAMBA:
            state = state_index[group]
            if state is not None and state < _cdiv(computed, size) - 1 and table[state] is not pool.null:
                pool.release([table[state]])
                table[state] = pool.null

    def _allocate(self, group: int, spec: Group, table: list[_Block], tokens: int, state_index: list[int | None]) -> None:
        """allocate_new_blocks: slots for ``tokens``; a Mamba "align" group adds one running
        state block where the step crosses into a new block, the blocks between null."""
        pool, size = self.pool, self.block_size
        required = _cdiv(tokens, size)
        if spec.kind != MAMBA:
            if required > len(table):
                table.extend(pool.new_blocks(required - len(table)))
            return
        if required <= len(table):
            return
        previous = len(table)
        if previous > 0:  # the block holding the state so far: freed once the step is done
            state_index[group] = previous - 1
        if previous < required - 1:
            table.extend([pool.null] * (required - 1 - previous))
        table.extend(pool.new_blocks(required - len(table)))


def read_layout(config: dict[str, Any], block_size: int) -> Layout:
    """The layout of a model config.json as ``--model-config`` reads it."""
    try:
        return layout_from_model_config(config, block_size)
    except (TypeError, ValueError) as error:
        raise CacheError(f"cannot read the model's KV-cache groups: {error}") from None
