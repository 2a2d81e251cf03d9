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
import importlib.util
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from .. import sealed
from ..config import cache_directory
from ..sealed import check_private
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
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return "-"
    prefix, suffix = f"{package}-", ".dist-info"
    with contextlib.suppress(OSError):
        for name in os.listdir(Path(spec.origin).parent.parent):
            if name.startswith(prefix) and name.endswith(suffix) and "-" not in name[len(prefix) : -len(suffix)]:
                return name[len(prefix) : -len(suffix)]
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 -- 15 ms: only where no .dist-info is beside

    try:
        return version(package)
    except PackageNotFoundError:
        return "-"


# Entries are read and written through folders opened without following a link, each
# checked to be this user's and writable by no one else: the cache is untrusted input (a CI
# cache restored from another branch, a shared home). An entry that is a link, not a regular
# file, not this user's, too large, or that does not load, is a miss; one is written whole
# under a temporary name beside it and renamed over it, so that a link planted under its
# name is replaced, never written through.
FOLDER = "gguf-tokenizers"
ENTRY = "tokenizer.json"  # in a folder of its own, as a tokenizer directory holds it
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def _entry_folder(key: str, create: bool) -> Iterator[int]:
    """The folder of entry ``key``, opened (a descriptor), or OSError. The cache directory
    itself is opened as configured (a link the user made to another disk is theirs); every
    folder inside it is opened without following a link."""
    root = cache_directory()
    if create:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    opened = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        check_private(opened[-1], str(root))
        for name in (FOLDER, key):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=opened[-1])
            opened.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NO_FOLLOW, dir_fd=opened[-1]))
            check_private(opened[-1], name)
        yield opened[-1]
    finally:
        for descriptor in opened:
            os.close(descriptor)


def entry_folder(key: str) -> Path | None:
    """The folder holding entry ``key`` as a tokenizer directory holds tokenizer.json (a Hub
    model's tokenizer is loaded from it in each proof), when it holds it as a regular file."""
    try:
        with _entry_folder(key, create=False) as folder:
            if stat.S_ISREG(os.stat(ENTRY, dir_fd=folder, follow_symlinks=False).st_mode):
                return cache_directory() / FOLDER / key
    except OSError:
        pass
    return None


def read_entry(key: str, limit: int) -> str | None:
    """The text of entry ``key``, or None: missing, a link, not a regular file of this
    user's, over ``limit`` bytes, or not text."""
    try:
        with _entry_folder(key, create=False) as folder:
            data = sealed.read_entry(folder, ENTRY, limit)
    except OSError:
        return None
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def write_entry(key: str, text: str) -> None:
    """``text`` as entry ``key``, whole or not at all; a file that cannot be written costs
    the next run a build, nothing more."""
    data = text.encode("utf-8")
    try:
        with _entry_folder(key, create=True) as folder:
            # a rename replaces a link at the entry's name; it never writes through it
            sealed.write_entry(folder, ENTRY, data)
    except OSError:
        pass
