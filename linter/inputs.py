"""What tmpl-lint reads from the paths a user names: a template and where it came from, the
one error a file that cannot be read gives, and the bounded reads every reader of a
user's file goes through (a regular file, at most MAX_FILE_BYTES, decoded as transformers
decodes it)."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

GGUF_SUFFIX = ".gguf"

# Real templates are under 100 kB; anything this large is not a template and would only
# exhaust memory.
MAX_FILE_BYTES = 10 * 1024 * 1024
_FILE_KINDS = (
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
)


@dataclass(frozen=True)
class TemplateSource:
    path: Path
    # The template's name inside a list of named templates, or an additional template's
    # file stem; None for the single default template of a file.
    name: str | None
    text: str
    # "jinja" (the file is the template), "json" (the value of the file's chat_template
    # key), "python" or "yaml" (a string assigned to chat_template in that file), "gguf"
    # (a tokenizer.chat_template* value in a GGUF's metadata).
    container: str
    # Which file is in force when a model directory holds several, or None.
    note: str | None = None
    # The special tokens the template renders with, when they come with it rather than from
    # a file beside it (a GGUF's metadata read over the network): (name, token) pairs.
    special_tokens: tuple[tuple[str, str], ...] = ()
    # A tokenizer directory to measure it with, when none is beside it (a Hub GGUF's
    # tokenizer, built from its metadata into tmpl-lint's cache).
    tokenizer_directory: Path | None = None
    # The file's text as it holds this template, when it is not the file on disk (what
    # --diff would write): where findings are placed in the file.
    file_text: str | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        return f"{self.path}:{self.name}" if self.name else str(self.path)


class SourceError(Exception):
    """A file that should hold a template but cannot be read as one."""

    def __init__(self, path: Path, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class NothingToLint(SourceError):
    """A named file that holds no template, as such a file may: a base model's
    ``tokenizer_config.json`` (pre-commit names every one a commit touches), or a file of a
    kind tmpl-lint does not read (``README.txt``). A run that lints says so in a warning, as
    ruff passes over a file it does not lint; a command that needs a template reports it as
    an error."""


def read_bytes(path: Path, limit: int = MAX_FILE_BYTES, kind: str = "a template") -> tuple[bytes, os.stat_result]:
    """A regular file's bytes, at most ``limit`` of them, and its status as read.

    A FIFO is opened without waiting for a writer and a device is never read: both are
    refused by what the open descriptor is, not by the path (which may change). The size
    is checked on what was read, not on ``st_size``, which a special or growing file can
    misstate.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except IsADirectoryError:
        raise SourceError(path, "is a directory") from None
    except PermissionError:
        raise SourceError(path, "permission denied") from None
    except FileNotFoundError:
        raise SourceError(path, "broken symbolic link" if path.is_symlink() else "no such file or directory") from None
    except OSError as error:
        raise SourceError(path, error.strerror or str(error)) from None
    try:
        status = os.fstat(descriptor)
        for is_kind, message in _FILE_KINDS:
            if is_kind(status.st_mode):
                raise SourceError(path, message)
        data = read_at_most(descriptor, limit)
    except OSError as error:
        raise SourceError(path, error.strerror or str(error)) from None
    finally:
        os.close(descriptor)
    if data is None:
        raise SourceError(path, f"file is over the {limit}-byte limit for {kind}")
    return data, status


def read_at_most(descriptor: int, limit: int) -> bytes | None:
    """What an open file holds, or None if it holds more than ``limit`` bytes: read in
    chunks, one byte past the limit at most, never sized by what fstat says."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(descriptor, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks) if size <= limit else None


def decode(path: Path, data: bytes) -> str:
    """A file's bytes as text, exactly (line endings kept), or a SourceError saying why not."""
    if b"\x00" in data:
        raise SourceError(path, "binary file (contains NUL bytes), not a template")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SourceError(path, f"not valid UTF-8 (byte {error.start})") from None


def read_text(path: Path) -> str:
    """A file's text, exactly (line endings kept), or a SourceError saying why not."""
    return decode(path, read_bytes(path)[0])


def load_json(path: Path) -> object:
    return parse_json(path, read_text(path))


def parse_json(path: Path, text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise SourceError(path, f"invalid JSON: {error.msg} (line {error.lineno}, column {error.colno})") from None
    except RecursionError:
        raise SourceError(path, "invalid JSON: nested too deeply to read") from None
