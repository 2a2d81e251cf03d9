"""The built GGUF tokenizers, kept on disk under the user's cache.

Building a tokenizer from GGUF metadata (importing transformers, converting 150k tokens and
merges) takes seconds; loading the tokenizer.json it makes takes a tenth of that. Each built
tokenizer is kept as tokenizer.json under the user's cache, named by a hash of everything
the build reads (every tokenizer.ggml.* value, with its type, and the architecture) and of
the versions of the code that builds it: every quantization of a model shares one entry, and
an upgrade builds afresh. An entry that does not load, or loads with another vocabulary
size, is built again and replaced; one that cannot be written costs the next run a build.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from .. import writes
from ..config import cache_directory
from ..writes import WriteError
from .format import ARCHITECTURE_KEY, Metadata

CACHE_FORMAT = "1"  # of an entry: changed when what is stored changes


def cache_key(mapped, metadata: Metadata) -> str:
    hashed = hashlib.sha256(CACHE_FORMAT.encode())
    for package in ("transformers", "tokenizers"):
        hashed.update(f"\0{package} {installed_version(package)}".encode())
    hashed.update(b"\0" + str(metadata.value(ARCHITECTURE_KEY, "")).encode())
    for key in sorted(key for key in metadata.fields if key.startswith("tokenizer.ggml.")):
        entry = metadata.fields[key]
        kind = f"{entry.type.value}.{entry.item_type.value if entry.item_type is not None else ''}"
        hashed.update(f"\0{key}\0{kind}\0".encode() + mapped[slice(*entry.span)])
    return hashed.hexdigest()


def installed_version(package: str) -> str:
    """A package's version as installed, from the name of its .dist-info folder beside it:
    what importlib.metadata reads, without the 0.05-0.1 s its import takes; else from
    importlib.metadata ("-": not installed)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return "-"
    prefix, suffix = f"{package}-", ".dist-info"
    with contextlib.suppress(OSError):
        for name in os.listdir(Path(spec.origin).parent.parent):
            if name.startswith(prefix) and name.endswith(suffix) and "-" not in name[len(prefix) : -len(suffix)]:
                return name[len(prefix) : -len(suffix)]
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "-"


def cache_entry(key: str) -> Path:
    # a folder holding tokenizer.json, as a tokenizer directory does
    return cache_directory() / "gguf-tokenizers" / key / "tokenizer.json"


def cached_tokenizer(key: str, vocabulary_size: int):
    """The tokenizer cached under ``key``, or None: absent, unreadable, or not this vocabulary."""
    try:
        from tokenizers import Tokenizer as FastTokenizer
    except ImportError:
        return None  # the build says what to install
    try:
        backend = FastTokenizer.from_file(str(cache_entry(key)))
    except Exception:  # noqa: BLE001 - tokenizers raises bare Exceptions for missing and bad files
        return None
    return backend if backend.get_vocab_size(with_added_tokens=True) == vocabulary_size else None


def store_tokenizer(key: str, backend) -> None:
    entry = cache_entry(key)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        writes.write_file(entry, backend.to_str())  # whole or not at all: a reader never sees half
    except (OSError, WriteError):
        pass  # the next run builds it again
