"""Measuring prompts: in token ids or characters, and as vLLM's prefix cache serves a
session's requests (full blocks, each chained on its parent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ..engines.base import Prompt
from ..kv_cache.pools import CacheRequest, VllmPrefixCache
from ..tokenizer import Tokenizer

DEFAULT_SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


# A prompt's length units, in order: token ids, or the characters of its text.
Units = list[int] | str


@dataclass
class Measure:
    """Token ids from the tokenizer, or characters when there is none (unit "char")."""

    tokenizer: Tokenizer | None
    # Token ids by text, where the caller keeps them: a proof encodes one prompt in several
    # scenarios, and a fix's candidates render most prompts as the original did (half of
    # a fix's encoding was of texts it had encoded already). None: none kept (replay
    # encodes a log's many texts once each).
    encoded: dict[str, list[int]] | None = None

    @property
    def unit(self) -> str:
        return "token" if self.tokenizer else "char"

    def ids(self, text: str) -> list[int]:
        if not self.tokenizer:
            return list(map(ord, text))
        if self.encoded is None:
            return self.tokenizer.encode(text)
        ids = self.encoded.get(text)
        if ids is None:
            ids = self.encoded[text] = self.tokenizer.encode(text)
        return list(ids)  # the caller's own: the kept ids serve the next caller too

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if prompt.token_ids is not None:
            return list(prompt.token_ids)  # the engine's own tokenization
        return self.ids(prompt.text)

    # What a proof measures prefixes in: token ids, or in characters the text itself. A str
    # compares, slices and concatenates as C memory does; the list of its code points that
    # ``ids`` makes (for a caller that mixes them with logged token ids) costs as much as a
    # good part of a proof without a tokenizer, which is every template of an audit.
    def units(self, text: str) -> Units:
        return self.ids(text) if self.tokenizer else text

    def start_of(self, index: int, pieces: list[tuple[str, Units]]) -> int | None:
        """Where unit ``index`` of the pieces' units, concatenated, starts in their texts,
        concatenated (a prompt, and the reply generated after it); None where the tokenizer
        gives no offsets, or a piece's ids are not its text's encoding (an engine's own)."""
        offset = 0
        for text, units in pieces:
            if index < len(units):
                if not self.tokenizer:
                    return offset + index
                if self.ids(text) != list(units):
                    return None
                start = self.tokenizer.token_start(text, index)
                return None if start is None else offset + start
            index -= len(units)
            offset += len(text)
        return None

    def prompt_units(self, prompt: Prompt) -> Units:
        return prompt.text if prompt.token_ids is None and not self.tokenizer else self.prompt_ids(prompt)


def tokenizer_identity(tokenizer: Tokenizer | None) -> tuple[str, str] | None:
    """What names a tokenizer across processes: its kind and where it was loaded from (a
    directory), or for a GGUF's own tokenizer its vocabulary's cache key (the same in each
    quantisation of the model). None: measured in characters."""
    if tokenizer is None:
        return None
    where = getattr(tokenizer, "identity", None) or str(getattr(tokenizer, "directory", ""))
    return f"{type(tokenizer).__name__}:{getattr(tokenizer, 'kind', '')}", where


@dataclass(frozen=True)
class ServedRequest:
    """One request of a scenario as vLLM's prefix cache serves it: its prompt tokens (vLLM's
    queries), those served from cache (its hits), and those it would serve had the prompt
    extended what the session's previous request left computed (its prompt and reply)."""

    queries: int
    hits: int
    ideal_hits: int


def served_requests(prompts: list[Units], generated: list[Units], block_size: int) -> list[ServedRequest]:
    """A scenario's requests, one session in order, through vLLM's block pool (unbounded):
    what its PrefixCacheStats count for each. The ideal is what each would hit had its prompt
    extended the previous request's prompt and reply (but the last sampled token, never fed
    back), at most num_tokens - 1 looked up."""
    cache = VllmPrefixCache(block_size)
    out, computed = [], None
    for prompt, reply in zip(prompts, generated):
        # Characters serve as units as ids do: the cache only slices, compares and hashes them.
        served = cache.serve(CacheRequest(0, cast(list[int], prompt), cast(list[int], reply)))
        ideal = 0 if computed is None else full_blocks(min(computed, len(prompt) - 1), block_size)
        out.append(ServedRequest(len(prompt), served.hit, max(ideal, served.hit)))
        computed = len(prompt) + max(len(reply) - 1, 0)
    return out


def concatenated(first: Units, second: Units) -> Units:
    """Two measures one after the other: both token ids or both characters, as one Measure
    measures every text of a proof."""
    return first + second  # type: ignore[operator]  # never a list and a str: see above


def resolve_special_tokens(tokenizer: Tokenizer | None, from_config: dict[str, Any] | None) -> dict[str, Any]:
    """What the template sees as bos_token, eos_token...: the tokenizer's when there is one
    (exactly, none added), else the template's config's, else placeholders."""
    if tokenizer is not None:
        return dict(tokenizer.special_tokens)
    if from_config:
        return dict(from_config)
    return dict(DEFAULT_SPECIAL_TOKENS)


def full_blocks(count: int, block_size: int) -> int:
    return (count // block_size) * block_size
