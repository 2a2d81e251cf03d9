"""The tokenizer a GGUF's metadata describes (``tokenizer.ggml.*``), built by
transformers' GGUF converter, and the special tokens a template sees."""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..inputs import TemplateSource
from .cache import cache_entry, cache_key, cached_tokenizer, store_tokenizer
from .format import (
    ARCHITECTURE_KEY,
    SPECIAL_TOKEN_IDS,
    TOKENIZER_ARRAYS,
    TOKENS_KEY,
    GGUFError,
    Metadata,
    ValueType,
    parse,
    skip_strings,
    with_metadata,
)
from .models import model_for


@dataclass(frozen=True)
class OwnTokenizer:
    tokenizer: Any  # tokenizer.Tokenizer, or None: measure characters
    special_tokens: dict[str, str]
    # Said under every proof: whose token ids these are, or why they are characters.
    description: str
    # The cache entry holding it as tokenizer.json (for a Hub model's, read in each proof).
    directory: Path | None = None


def own_tokenizer(model: Path) -> OwnTokenizer:
    status = model.stat()
    return _own_tokenizer(model.resolve(), status.st_size, status.st_mtime_ns)


@lru_cache(maxsize=8)
def _own_tokenizer(model: Path, _size: int, _mtime: int) -> OwnTokenizer:
    try:
        return with_metadata(model, lambda mapped, metadata: tokenizer_in(mapped, metadata, model))
    except GGUFError as error:
        return OwnTokenizer(None, {}, f"measured in characters: cannot read the tokenizer in {model.name}: {error}")


def tokenizer_in(buffer, metadata: Metadata, model: Path) -> OwnTokenizer:
    """The tokenizer ``metadata`` describes (``buffer``: the bytes it was read from, a local
    model's map or a Hub model's first range), from tmpl-lint's cache, else built and cached."""
    name = model.name
    special = special_tokens(metadata, buffer)
    tokens = metadata.fields.get(TOKENS_KEY)
    if tokens is None or tokens.item_type != ValueType.STRING or not tokens.count:
        return OwnTokenizer(None, special, f"measured in characters: {name} has no tokenizer in its metadata")
    kind = metadata.value("tokenizer.ggml.model", "?")
    key = cache_key(buffer, metadata)
    backend = cached_tokenizer(key, tokens.count)
    if backend is None:
        try:
            backend = build_tokenizer(parse(buffer, TOKENIZER_ARRAYS))
        except GGUFError as error:
            return OwnTokenizer(None, special, f"measured in characters: {error}")
        store_tokenizer(key, backend)
    from ..tokenizer import Tokenizer

    description = f"token ids of the tokenizer in {name}'s metadata ({kind}, {tokens.count} tokens)"
    entry = cache_entry(key)
    tokenizer = Tokenizer(model, backend, special, identity=f"gguf:{key}")
    return OwnTokenizer(tokenizer, special, description, entry.parent if entry.is_file() else None)


def preload_tokenizers(sources: list[TemplateSource]) -> None:
    for model in dict.fromkeys(model_for(source) for source in sources if source.container in ("gguf", "jinja")):
        if model is not None:
            own_tokenizer(model)


def metadata_special_tokens(model: Path) -> dict[str, str]:
    """bos_token, eos_token... of a GGUF, without building its tokenizer."""
    try:
        return with_metadata(model, lambda mapped, metadata: special_tokens(metadata, mapped))
    except GGUFError:
        return {}


def special_tokens(metadata: Metadata, buffer=None) -> dict[str, str]:
    """bos_token, eos_token... as the metadata names them by id: looked up in the decoded
    vocabulary, or read at their ids from ``buffer`` (the file's bytes) where the vocabulary
    was stepped over (decoding 150k tokens to find four costs a tenth of a second)."""
    ids = {}
    for variable, key in SPECIAL_TOKEN_IDS.items():
        index = metadata.value(key)
        if isinstance(index, int) and not isinstance(index, bool):
            ids[variable] = index
    tokens = metadata.value(TOKENS_KEY)
    if tokens is not None:
        return {variable: tokens[index] for variable, index in ids.items() if 0 <= index < len(tokens)}
    if buffer is None:
        return {}
    found = _tokens_at(buffer, metadata, set(ids.values()))
    return {variable: found[index] for variable, index in ids.items() if index in found}


def _tokens_at(buffer, metadata: Metadata, indices: set[int]) -> dict[int, str]:
    """The vocabulary's tokens at ``indices``, stepping over the others."""
    entry = metadata.fields.get(TOKENS_KEY)
    if entry is None or entry.item_type != ValueType.STRING:
        return {}
    unpack = struct.Struct(metadata.byte_order + "Q").unpack_from
    position, passed, found = entry.span[0] + 12, 0, {}  # past the item type and count
    for index in sorted(index for index in indices if 0 <= index < entry.count):
        position = skip_strings(buffer, position, index - passed, metadata.byte_order)
        (length,) = unpack(buffer, position)
        with contextlib.suppress(UnicodeDecodeError):  # a token that is not text is no token to show
            found[index] = bytes(buffer[position + 8 : position + 8 + length]).decode("utf-8")
        position, passed = position + 8 + length, index + 1
    return found


def build_tokenizer(metadata: Metadata):
    """A ``tokenizers.Tokenizer`` from ``tokenizer.ggml.*``, built by transformers' own GGUF
    converter (the one ``from_pretrained(gguf_file=...)`` uses; that entry point imports
    torch to read the file, which is why the metadata is handed over here)."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    except ImportError:
        try:  # transformers 4.x
            from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
        except ImportError:
            raise GGUFError(
                "building a tokenizer from GGUF metadata needs transformers: pip install 'tmpl-lint[prove]'"
            ) from None
    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    tokenizer_dict = {
        name: metadata.value(f"tokenizer.{key}")
        for key, name in renames.items()
        if metadata.value(f"tokenizer.{key}") is not None
    }
    architecture = metadata.value(ARCHITECTURE_KEY, "")
    try:
        backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    except Exception as error:  # noqa: BLE001 - the converter raises whatever the vocabulary trips
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise GGUFError(f"transformers cannot build the tokenizer in this GGUF: {first_line}") from None
    return backend
