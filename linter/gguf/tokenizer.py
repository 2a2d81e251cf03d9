"""The tokenizer a GGUF's metadata describes (``tokenizer.ggml.*``), built by
transformers' GGUF converter, and the special tokens a template sees."""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..inputs import TemplateSource
from ..isolation import IsolationError, run_isolated
from ..tokenizer import Tokenizer, TokenizerError, measures_text, rust_panics_as_errors
from .cache import cache_key, entry_folder, read_entry, write_entry
from .format import (
    ARCHITECTURE_KEY,
    MERGES_KEY,
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
    model's map or a Hub model's first range), from tmpl-lint's cache, else built (in a
    child process, under the limits of a render) and cached; one that cannot measure text
    (``tokenizer.measures_text``) is not used: the proofs are in characters, and say why."""
    name = model.name
    special = special_tokens(metadata, buffer)
    tokens = metadata.fields.get(TOKENS_KEY)
    if tokens is None or tokens.item_type != ValueType.STRING or not tokens.count:
        return OwnTokenizer(None, special, f"measured in characters: {name} has no tokenizer in its metadata")
    try:
        from tokenizers import Tokenizer as FastTokenizer  # noqa: PLC0415 -- only as a GGUF's tokenizer is built
    except ImportError:
        return OwnTokenizer(None, special, f"measured in characters: {BUILD_HINT}")
    kind = metadata.value("tokenizer.ggml.model", "?")
    key = cache_key(buffer, metadata)
    limit = json_limit(metadata)
    backend = _loaded(FastTokenizer, read_entry(key, limit), tokens.count)
    if backend is None:
        try:
            text = built_json(buffer, metadata, limit)
        except GGUFError as error:
            return OwnTokenizer(None, special, f"measured in characters: {error}")
        backend = _loaded(FastTokenizer, text, None)
        if backend is None:
            return OwnTokenizer(
                None, special, f"measured in characters: the tokenizer built from {name}'s metadata does not load"
            )
        write_entry(key, text)
    tokenizer = Tokenizer(model, backend, special, identity=f"gguf:{key}")
    try:
        measures_text(tokenizer)
    except TokenizerError as error:
        # said of a tokenizer directory: the files it names are not a GGUF's
        reason = str(error).removeprefix(f"{model}: ")
        if reason.endswith("missing?)"):
            reason = reason.rsplit(" (", 1)[0]
        return OwnTokenizer(None, special, f"measured in characters: the tokenizer in {name}'s metadata cannot be used: {reason}")
    description = f"token ids of the tokenizer in {name}'s metadata ({kind}, {tokens.count} tokens)"
    return OwnTokenizer(tokenizer, special, description, entry_folder(key))


def _loaded(fast_tokenizer, text: str | None, vocabulary_size: int | None):
    """The tokenizer ``text`` (a tokenizer.json) holds, or None: no text, one that does not
    load, or (a cache entry) one of another vocabulary size."""
    if text is None:
        return None
    try:
        with rust_panics_as_errors("loading a tokenizer"):
            backend = fast_tokenizer.from_str(text)
    except Exception:  # noqa: BLE001 - tokenizers raises bare Exceptions; a panic is a TokenizerError here
        return None
    if vocabulary_size is not None and backend.get_vocab_size(with_added_tokens=True) != vocabulary_size:
        return None
    return backend


# -- building, in a child process ---------------------------------------------------------------
#
# transformers' converter allocates by what the vocabulary implies, not by its size in the
# file: without merges in the file, it derives them from every pair of tokens that makes
# another (a 0.5 MB vocabulary of "a", "aa", "aaa"... implies 500k merges of up to 1000
# characters: 1.3 GB, and a 323 MB tokenizer.json). So the counts are checked before the
# arrays are decoded, what the merges can add up to before the converter runs, and the built
# tokenizer.json's size before it is kept; and the build runs in a child process under the
# memory and time limits of a render, whose death (a Rust abort when memory runs out) is one
# line here.

MAX_VOCABULARY = 1 << 21  # tokens, and merges (real vocabularies hold up to ~260k)
# What derived merges can add up to, in characters: the sum of each token's length squared
# (each token splits into at most its length of pairs, each as long as it). Real
# vocabularies: 9M (Qwen2.5's 151k tokens), 13M (gpt-oss's 200k).
MAX_DERIVED_MERGE_CHARACTERS = 1 << 26
BUILD_HINT = "building a tokenizer from GGUF metadata needs transformers: pip install 'tmpl-lint[prove]'"


def json_limit(metadata: Metadata) -> int:
    """The largest tokenizer.json the tokenizer in ``metadata`` may make: real ones are about
    the size of their tokenizer.ggml.* values (Qwen2.5: 7 MB of each), up to a few times it."""
    described = sum(entry.span[1] - entry.span[0] for key, entry in metadata.fields.items() if key.startswith("tokenizer.ggml."))
    return (16 << 20) + 32 * described


def built_json(buffer, metadata: Metadata, limit: int) -> str:
    """The tokenizer.json of the tokenizer ``metadata`` describes, built in a child process;
    GGUFError says why there is none, in one line."""
    for key in (TOKENS_KEY, MERGES_KEY):
        entry = metadata.fields.get(key)
        if entry is not None and entry.count > MAX_VOCABULARY:
            raise GGUFError(f"{key} holds {entry.count} items, over the {MAX_VOCABULARY} tmpl-lint builds a tokenizer from")
    if multiprocessing.current_process().daemon:
        # Already one of isolation's children, under its limits (a --fix verifying a model's
        # template, which may not fork children of its own): built here.
        outcome, text = _build_json(buffer, limit)
    else:
        try:
            outcome, text = run_isolated(_build_json, (buffer, limit))
        except IsolationError as error:
            if str(error) == "ran out of memory" or str(error).startswith("the worker died"):
                raise GGUFError(f"building the tokenizer in this GGUF ran out of memory ({error})") from None
            raise GGUFError(f"building the tokenizer in this GGUF failed: {error}") from None
    if outcome != "ok":
        raise GGUFError(text)
    return text


def _build_json(buffer, limit: int) -> tuple[str, str]:
    """In the child: ("ok", tokenizer.json), or ("refused", why)."""
    try:
        metadata = parse(buffer, TOKENIZER_ARRAYS)
        tokens = metadata.value(TOKENS_KEY) or []
        if metadata.value(MERGES_KEY) is None:
            derived = sum(len(token) ** 2 for token in tokens)
            if derived > MAX_DERIVED_MERGE_CHARACTERS:
                return "refused", (
                    f"the tokenizer in this GGUF lists no merges, and the ones its tokens imply could take {derived} characters "
                    f"(over {MAX_DERIVED_MERGE_CHARACTERS}; real vocabularies take under a fifth of that)"
                )
        # what a Rust panic prints goes nowhere (an abort's too: the child ends with it)
        with rust_panics_as_errors("building the tokenizer in this GGUF"):
            text = build_tokenizer(metadata).to_str()
    except (GGUFError, TokenizerError) as error:
        return "refused", str(error)
    except MemoryError:
        return "refused", "building the tokenizer in this GGUF ran out of memory"
    if len(text) > limit:
        return "refused", f"the tokenizer built from this GGUF is {len(text)} characters of JSON, over {limit} for its vocabulary"
    return "ok", text


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


def _gguf_converter() -> tuple[Any, Any]:
    """transformers' GGUF tokenizer mapping and converter, from the module that holds them in
    the installed version (by name: the types of the one not installed are unknown)."""
    for name in ("transformers.integrations.gguf.gguf_tokenizer_mapping", "transformers.integrations.ggml"):  # 5.x, 4.x
        try:
            module = importlib.import_module(name)
            return module.GGUF_TOKENIZER_MAPPING, module.convert_gguf_tokenizer
        except (ImportError, AttributeError):
            continue
    raise GGUFError(BUILD_HINT)


def build_tokenizer(metadata: Metadata):
    """A ``tokenizers.Tokenizer`` from ``tokenizer.ggml.*``, built by transformers' own GGUF
    converter (the one ``from_pretrained(gguf_file=...)`` uses; that entry point imports
    torch to read the file, which is why the metadata is handed over here)."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    mapping, convert_gguf_tokenizer = _gguf_converter()
    renames = mapping["tokenizer"]
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
