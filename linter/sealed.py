"""Files in tmpl-lint's cache, which is untrusted input.

A cache directory can be written by others than the user who reads it: a CI cache restored
from another branch, a shared home, a file planted by anything that runs as the user. So
nothing read from it decides a verdict or runs as code unless it is authenticated: each
entry carries an HMAC-SHA256 of its name and bytes, keyed by a secret kept outside the
cache (``key_path``, made 0600 on first use in a folder only the user may write). An
entry whose MAC does not verify, or that is cut short, is a miss, never an error.

Entries are read and written through a directory opened without following a symbolic
link and checked to be the user's own and writable by no one else; an entry that is a
symbolic link, not a regular file, not the user's, or larger than its limit is a miss,
and is replaced by a regular file when written (atomically: a reader never sees half).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from functools import cache
from pathlib import Path

from .config import cache_directory
from .inputs import read_at_most

KEY_BYTES = 32
MAC_BYTES = 32  # HMAC-SHA256
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


class NoKey(Exception):
    """No secret to authenticate cache entries with: what is cached cannot be trusted."""


def key_path() -> Path:
    """The secret's file: tmpl-lint/cache-key in $XDG_STATE_HOME (~/.local/state), a place
    that CI caches and shared cache folders do not carry along with ~/.cache."""
    base = os.environ.get("XDG_STATE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "tmpl-lint" / "cache-key"


@cache
def secret() -> bytes:
    """This user's key, made on first use; NoKey says why there is none. Looked for once a
    process (workers forked later inherit it)."""
    try:
        return _secret(key_path())
    except RuntimeError:  # no home directory to keep it in
        raise NoKey("no home directory to keep the cache key in") from None
    except OSError as error:
        raise NoKey(f"{key_path()}: {error.strerror or error}") from None


def _secret(path: Path) -> bytes:
    cache_root = cache_directory().resolve()
    folder = path.parent
    if folder.resolve() == cache_root or cache_root in folder.resolve().parents:
        raise NoKey(f"{path}: the cache key must be kept outside the cache ({cache_root})")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _NO_FOLLOW)
    try:
        _check_private(os.fstat(directory), folder)
        try:
            return _read_key(directory, path)
        except FileNotFoundError:
            pass
        # Made whole under another name and linked into place: two processes making it at
        # once agree on the one linked first, and no reader meets a short key.
        temporary = f".cache-key.{os.getpid()}.{secrets.token_hex(4)}"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o600, dir_fd=directory)
        try:
            os.write(descriptor, secrets.token_bytes(KEY_BYTES))
        finally:
            os.close(descriptor)
        try:
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path.name, src_dir_fd=directory, dst_dir_fd=directory, follow_symlinks=False)
        finally:
            os.unlink(temporary, dir_fd=directory)
        return _read_key(directory, path)
    finally:
        os.close(directory)


def _read_key(directory: int, path: Path) -> bytes:
    descriptor = os.open(path.name, os.O_RDONLY | os.O_NONBLOCK | _NO_FOLLOW, dir_fd=directory)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() or status.st_mode & 0o077:
            raise NoKey(f"{path}: the cache key must be a regular file of this user's, readable by no one else (0600)")
        key = os.read(descriptor, KEY_BYTES + 1)
    finally:
        os.close(descriptor)
    if len(key) != KEY_BYTES:
        raise NoKey(f"{path}: not a cache key ({len(key)} bytes, not {KEY_BYTES}): remove it and one is made again")
    return key


def _check_private(status: os.stat_result, path: Path) -> None:
    if status.st_uid != os.geteuid() or status.st_mode & 0o022:
        raise NoKey(f"{path}: the folder must be this user's and writable by no one else")


def mac(purpose: bytes, name: str, data: bytes) -> bytes:
    """The MAC of ``data`` kept as ``name`` for ``purpose`` (NoKey without a key): an entry
    moved to another name, or to another use, does not verify."""
    message = hmac.new(secret(), purpose + b"\0" + name.encode("utf-8", "surrogatepass") + b"\0", hashlib.sha256)
    message.update(data)
    return message.digest()


def verifies(purpose: bytes, name: str, data: bytes, tag: bytes) -> bool:
    """Whether ``tag`` is the MAC of ``data`` kept as ``name`` for ``purpose``."""
    return hmac.compare_digest(tag, mac(purpose, name, data))


def seal(purpose: bytes, name: str, data: bytes) -> bytes:
    return mac(purpose, name, data) + data


def unseal(purpose: bytes, name: str, sealed: bytes) -> bytes | None:
    """The data of a sealed entry, or None where its MAC does not verify."""
    if len(sealed) < MAC_BYTES:
        return None
    data = sealed[MAC_BYTES:]
    return data if verifies(purpose, name, data, sealed[:MAC_BYTES]) else None


@contextlib.contextmanager
def private_directory(path: Path):
    """``path`` (made 0700 if missing) opened as a directory descriptor, or OSError: a
    symbolic link, or a folder another user owns or may write, is refused."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NO_FOLLOW)
    try:
        check_private(directory, str(path))
        yield directory
    finally:
        os.close(directory)


def check_private(directory: int, name: str) -> None:
    """PermissionError unless the open folder is this user's and writable by no one else."""
    status = os.fstat(directory)
    if status.st_uid != os.geteuid() or status.st_mode & 0o022:
        raise PermissionError(f"{name}: a cache folder must be this user's and writable by no one else")


def read_entry(directory: int, name: str, limit: int) -> bytes | None:
    """The bytes of entry ``name`` in an open ``private_directory``, or None: missing, a
    symbolic link, not a regular file of this user's, or over ``limit`` bytes."""
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NO_FOLLOW, dir_fd=directory)
    except OSError:
        return None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() or status.st_size > limit:
            return None
        return read_at_most(descriptor, limit)
    except OSError:
        return None
    finally:
        os.close(descriptor)


def write_entry(directory: int, name: str, data: bytes) -> None:
    """``data`` as entry ``name``, whole or not at all; what was there (a symbolic link
    included) is replaced, never written through. OSError where it cannot be."""
    temporary = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o600, dir_fd=directory)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view) :]
        finally:
            os.close(descriptor)
        os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=directory)
        raise
