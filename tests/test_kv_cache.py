"""The engines' cache models, each against a computation written here from the engine's
documented behaviour, not from tmpl-lint's code."""

from __future__ import annotations

import hashlib
import itertools
import json
import random

import pytest

from tmpl_lint.kv_cache.pools import (
    CacheError,
    CacheRequest,
    KVShape,
    LlamaCppSlots,
    SglangRadixCache,
    VllmPrefixCache,
    blocks_for_memory,
    capacities,
    kv_shape,
    make_cache,
)

pytestmark = pytest.mark.no_fork


def straightforward_vllm(requests, block_size, num_blocks):
    """vLLM's pool the plain way: a list as the free queue (head first), sha256 chains,
    every hash mapped to its blocks in the order they were cached. Hits per request."""
    free = list(range(1, num_blocks)) if num_blocks else None  # block 0 is the null block
    fresh = itertools.count(1)
    hash_of: dict[int, bytes] = {}
    blocks_of: dict[bytes, list[int]] = {}
    hits = []
    for prompt, generated in requests:
        computed = prompt + generated[:-1]
        chain, parent = [], b""
        for start in range(0, len(computed) - block_size + 1, block_size):
            parent = hashlib.sha256(parent + json.dumps(computed[start : start + block_size]).encode()).digest()
            chain.append(parent)
        hit = 0
        while hit < (len(prompt) - 1) // block_size and blocks_of.get(chain[hit]):
            hit += 1
        held = [blocks_of[block_hash][0] for block_hash in chain[:hit]]
        needed = -(-len(computed) // block_size) - hit
        if free is None:
            new = [next(fresh) for _ in range(needed)]
        else:
            for block in held:
                if block in free:
                    free.remove(block)
            assert needed <= len(free)
            new = [free.pop(0) for _ in range(needed)]
            for block in new:
                if block in hash_of:  # evicted
                    evicted = hash_of.pop(block)
                    blocks_of[evicted].remove(block)
        for block, block_hash in zip(new, chain[hit : len(computed) // block_size]):
            hash_of[block] = block_hash
            blocks_of.setdefault(block_hash, []).append(block)
        if free is not None:
            for block in reversed(held + new):
                if block in hash_of:
                    free.append(block)
                else:
                    free.insert(0, block)  # never hashed: reused first
        hits.append(hit * block_size)
    return hits


def agent_traffic(seed, sessions=8, turns=12):
    """Interleaved sessions sharing a system prompt; each turn appends the reply (minus
    what a client may drop) and a new message; one session in three retries a prompt."""
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(rng.randrange(20, 70))]
    state = {session: list(system) + [rng.randrange(1000) for _ in range(5)] for session in range(sessions)}
    requests = []
    for _ in range(turns):
        for session in rng.sample(range(sessions), sessions):
            prompt = list(state[session])
            generated = [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]
            requests.append((session, prompt, generated))
            kept = generated[:-1] if session % 3 else generated[: len(generated) // 2]  # a client that drops part
            if session % 3 == 1 and rng.random() < 0.3:
                continue  # the same prompt again next turn
            state[session] = prompt + kept + [rng.randrange(1000) for _ in range(rng.randrange(1, 60))]
    return requests


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("num_blocks", [None, 200, 60, 25])
@pytest.mark.parametrize("block_size", [16, 4])
def test_vllm_pool_hits_what_the_straightforward_pool_hits(seed, num_blocks, block_size):
    requests = agent_traffic(seed)
    longest = max(-(-(len(p) + len(g) - 1) // block_size) for _, p, g in requests)
    if num_blocks is not None and longest > num_blocks - 1:
        num_blocks = longest + 1 + seed  # the pool must hold the longest request
    expected = straightforward_vllm([(p, g) for _, p, g in requests], block_size, num_blocks)
    pool = VllmPrefixCache(block_size, num_blocks)
    got = [pool.serve(CacheRequest(session, prompt, generated)).hit for session, prompt, generated in requests]
    assert got == expected
    if num_blocks is not None and num_blocks < 100:
        assert sum(got) < sum(straightforward_vllm([(p, g) for _, p, g in requests], block_size, None))  # it evicts


def test_vllm_hit_is_capped_so_one_token_is_computed_and_generated_blocks_hit():
    pool = VllmPrefixCache(4)
    assert pool.serve(CacheRequest("a", list(range(8)))).hit == 0
    # the same 8 tokens: at most 7 may hit, in whole blocks: 4
    assert pool.serve(CacheRequest("a", list(range(8)))).hit == 4
    # 9 tokens generated, the last never fed back: 8 + 8 computed, 4 full blocks cached
    assert pool.serve(CacheRequest("b", [50, 51, 52, 53, 54, 55], [60, 61, 62, 63, 64, 65, 66, 67, 68])).hit == 0
    follow = [50, 51, 52, 53, 54, 55, 60, 61, 62, 63, 64, 65, 66, 67, 68, 99]
    assert pool.serve(CacheRequest("b", follow)).hit == 12  # 14 computed before, 3 full blocks of them


def test_vllm_cache_salt_isolates_and_other_sessions_hits_are_shared():
    pool = VllmPrefixCache(4)
    system = list(range(12))
    pool.serve(CacheRequest("a", system + [100, 101]))
    served = pool.serve(CacheRequest("b", system + [200, 201, 202, 203]))
    assert (served.hit, served.shared) == (12, 12)
    assert pool.serve(CacheRequest("c", system + [300], salt="tenant")).hit == 0
    served = pool.serve(CacheRequest("b", system + [200, 201, 202, 203, 204]))
    assert (served.hit, served.shared) == (16, 12)  # its own block after the shared ones


def test_vllm_request_larger_than_the_pool_is_refused():
    pool = VllmPrefixCache(4, num_blocks=3)  # 2 usable
    with pytest.raises(CacheError, match="needs 3 blocks"):
        pool.serve(CacheRequest("a", list(range(9))))


def test_sglang_matches_tokens_caps_and_evicts_least_recently_used_leaves():
    cache = SglangRadixCache(page_size=1, capacity_tokens=20)
    assert cache.serve(CacheRequest("a", [1, 2, 3, 4, 5, 6])).hit == 0
    assert cache.serve(CacheRequest("a", [1, 2, 3, 4, 5, 6])).hit == 5  # all but one token, no blocks
    assert cache.serve(CacheRequest("b", [1, 2, 3, 9, 9])).hit == 3  # splits a's node
    assert cache.size == 8  # [1,2,3] [4,5,6] [9,9]
    # 14 new tokens with 12 free: the least recently used leaf, [4,5,6], goes
    assert cache.serve(CacheRequest("c", list(range(20, 34)))).hit == 0
    assert cache.serve(CacheRequest("a", [1, 2, 3, 4, 5, 6])).hit == 3
    # generated tokens but the last are inserted
    cache = SglangRadixCache()
    cache.serve(CacheRequest("a", [1, 2], [3, 4, 5]))
    assert cache.serve(CacheRequest("a", [1, 2, 3, 4, 5, 6])).hit == 4


def test_sglang_page_size_rounds_down():
    cache = SglangRadixCache(page_size=4)
    cache.serve(CacheRequest("a", list(range(11))))  # 8 tokens inserted: two pages
    assert cache.serve(CacheRequest("a", list(range(10)) + [99])).hit == 8


def test_llamacpp_slot_per_session_common_prefix_and_cache_reuse():
    slots = LlamaCppSlots()
    assert slots.serve(CacheRequest("a", [1, 2, 3, 4, 5], [6, 7])).hit == 0
    assert slots.serve(CacheRequest("a", [1, 2, 3, 4, 5, 6, 8])).hit == 6  # tokens, not blocks
    assert slots.serve(CacheRequest("b", [1, 2, 3])).hit == 0  # its own slot: nothing shared
    assert slots.serve(CacheRequest("b", [1, 2, 3])).hit == 2  # everything matches: one token is evaluated
    # --cache-reuse 3: after the first difference, matching chunks of 3+ are shifted into place
    reuse = LlamaCppSlots(cache_reuse=3)
    reuse.serve(CacheRequest("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert reuse.serve(CacheRequest("a", [1, 2, 4, 5, 6, 7, 9, 10])).hit == 2 + 4
    assert reuse.serve(CacheRequest("a", [1, 2, 4, 5, 6, 7, 9, 10])).hit == 7


def test_llamacpp_shared_slots_pick_by_similarity_then_least_recently_used():
    slots = LlamaCppSlots(slots=2)
    slots.serve(CacheRequest("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]))  # last slot (all unused)
    slots.serve(CacheRequest("b", [20, 21, 22, 23]))  # no similar slot: least recently used
    served = slots.serve(CacheRequest("c", [1, 2, 3, 30, 31]))  # 3/5 of its prompt in a's slot
    assert (served.hit, served.shared) == (3, 3)
    served = slots.serve(CacheRequest("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]))
    assert served.hit == 3  # c took a's slot
    with pytest.raises(CacheError, match="exceeds the available context"):
        LlamaCppSlots(slots=1, slot_tokens=8).serve(CacheRequest("a", list(range(8))))


def test_capacity_from_memory():
    qwen3_8b = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
    shape = kv_shape({**qwen3_8b, "torch_dtype": "bfloat16"})
    assert shape.bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147456
    assert blocks_for_memory(1.0, shape, 16) == (1 << 30) // 147456 // 16 == 455
    assert kv_shape(qwen3_8b, "fp8").bytes_per_token == 73728
    # head_dim from hidden_size / heads; kv heads default to attention heads
    assert kv_shape({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256}).bytes_per_token == 2 * 2 * 4 * 64 * 2
    # multi-head latent attention: one latent per token and layer
    deepseek = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
    assert kv_shape(deepseek).bytes_per_token == 61 * 576 * 2
    assert kv_shape(None, "auto", 2, 2, 64) == KVShape(2, 2, 64, 2)
    with pytest.raises(CacheError, match="layers, KV heads, head dim"):
        kv_shape({})
    assert capacities("1000, 4000,16000", None, 16) == [1000, 4000, 16000]
    assert capacities(None, None, 16) == [None]
    assert capacities(None, 1.0, 16, shape) == [455]
    for bad in ("1000,x", "1"):
        with pytest.raises(CacheError):
            capacities(bad, None, 16)
    with pytest.raises(CacheError, match="not both"):
        capacities("100", 1.0, 16, shape)
    with pytest.raises(CacheError, match="--slots"):
        make_cache("llamacpp", 16, 100)


def test_sglang_keeps_the_prompt_when_eviction_takes_the_reply_after_it():
    # SGLang inserts the prompt after prefill (cache_unfinished_req) and prompt + reply at
    # finish: the prompt ends at a node boundary. Counted by hand, capacity 10 tokens:
    # A leaves [1,2,3,4] -> [5,6] (6 tokens; its last sampled token, 7, never computed);
    # B computes 5 with 4 free, so 1 more is evicted: the least recently used leaf is A's
    # reply [5,6], a whole leaf of 2; A's prompt stays, and A's next turn hits its 4 tokens.
    # One leaf [1..6] would have gone whole, and the next turn would hit nothing.
    from tmpl_lint.kv_cache.pools import CacheRequest, SglangRadixCache

    cache = SglangRadixCache(page_size=1, capacity_tokens=10)
    assert cache.serve(CacheRequest("a", [1, 2, 3, 4], [5, 6, 7])).hit == 0
    assert cache.serve(CacheRequest("b", [9, 9, 9, 9, 9], [8])).hit == 0
    assert cache.size == 9
    assert cache.serve(CacheRequest("a", [1, 2, 3, 4, 7, 7], [1])).hit == 4
