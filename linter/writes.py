"""Writing the file a user meant: completely, with nothing else changed, or not at all and
saying why. Every command that writes a file goes through here.

- ``locked(path)`` holds an advisory lock (filelock) on the file for the whole read, fix
  and write, so two tmpl-lint runs on one file take turns instead of losing an update. The
  lock file is named after the target's real path and lives in a private folder, never
  beside the target.
- ``read(path)`` takes a ``Snapshot``: the bytes, read through symbolic links, and the
  status of the file they came from.
- ``replace(snapshot, text)`` compares and swaps: right before the new bytes land, the file
  is read again, and if it is not the file and the bytes the snapshot saw (an editor saved
  it, another tool rewrote it), nothing is written. Otherwise the bytes go to a temporary
  file in the target's folder, which is fsynced, given the target's mode and owner, and
  renamed over it; then the folder is fsynced. A symbolic link is written through to its
  target (a Hugging Face cache snapshot links into ``blobs/``). Where a rename would split
  hard links or lose an owner this process cannot give away, the bytes are written in place
  instead, once a copy of the old bytes is safe on disk beside it.
- ``create(path, fill)`` makes a file that must not exist (a fixed template beside a GGUF,
  a new GGUF): it is filled as a temporary file beside it, synced, and appears under its
  name by a hard link, which fails if the name was taken meanwhile: nothing is overwritten.
- Every write ends the same way (``_land``): a temporary file in the target's folder, given
  its mode and synced, put in place, the folder synced.
- SIGINT and SIGTERM wait for the rename or the in-place write to finish (the file is
  then whole, old or new); a temporary file is removed on every failure and interruption.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .inputs import SourceError, decode, read_bytes

# How long a --fix waits for another process (another tmpl-lint) that holds the lock.
LOCK_WAIT_SECONDS = 600.0


class WriteError(Exception):
    pass


@dataclass(frozen=True)
class Snapshot:
    """A file as it was read for a fix: what a write compares against before it swaps."""

    path: Path  # as the user named it
    target: Path  # the file it names, symbolic links resolved
    data: bytes
    text: str
    status: os.stat_result


def real_target(path: Path) -> Path:
    try:
        return Path(os.path.realpath(path, strict=True))
    except FileNotFoundError:
        raise WriteError(f"{path}: the file vanished before it could be written") from None
    except OSError as error:
        raise WriteError(f"{path}: {error.strerror or error}") from None


def read(path: Path) -> Snapshot:
    target = real_target(path)
    try:
        data, status = read_bytes(target)
        return Snapshot(path, target, data, decode(path, data), status)
    except SourceError as error:
        raise SourceError(path, error.message) from None


def lock_directory() -> Path:
    """This user's private folder of lock files (in XDG_RUNTIME_DIR, else the temp folder)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    directory = Path(base) / f"tmpl-lint-{os.getuid()}"
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        status = os.lstat(directory)
    except OSError as error:
        raise WriteError(f"{directory}: cannot hold lock files: {error.strerror}") from None
    # Another user's folder, or one others can write, would let them hold or break our locks.
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid() or status.st_mode & 0o022:
        raise WriteError(f"{directory}: not a private folder of this user; cannot lock files safely")
    return directory


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the advisory lock of the file ``path`` names (through symbolic links; a file
    still to be created, by the name it will have)."""
    from filelock import FileLock, Timeout  # noqa: PLC0415 -- 40 ms: only as --fix rewrites (--output-file takes no lock)

    name = hashlib.sha256(os.fsencode(os.path.realpath(path))).hexdigest()[:32]
    lock = FileLock(str(lock_directory() / f"{name}.lock"), timeout=LOCK_WAIT_SECONDS)
    try:
        lock.acquire()
    except Timeout:
        raise WriteError(
            f"{path}: another process has held its lock for {LOCK_WAIT_SECONDS:g} s (another tmpl-lint --fix?); nothing written"
        ) from None
    try:
        yield
    finally:
        lock.release()


def replace(snapshot: Snapshot, text: str) -> None:
    """Write ``text`` over the file ``snapshot`` was read from, if it still holds what was read."""
    path, target, status = snapshot.path, snapshot.target, snapshot.status
    data = encode(path, text)
    if not status.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise WriteError(f"{path}: the file is read-only; nothing written")
    if status.st_nlink > 1:
        _write_in_place(snapshot, data)
        return

    def fill(descriptor: int, _: str) -> None:
        _write_all(descriptor, data)
        if not _keep_owner(descriptor, status):
            raise _OwnerNotKept

    def swap(temporary: str, target: Path) -> None:
        _check_unchanged(snapshot)
        os.replace(temporary, target)

    try:
        _land(path, target, fill, stat.S_IMODE(status.st_mode), swap, "; the file is unchanged")
    except _OwnerNotKept:
        # Only root may give a file away: renaming ours over it would change its owner.
        _write_in_place(snapshot, data)


class _OwnerNotKept(Exception):
    pass


def write_file(path: Path, text: str) -> None:
    """Write a file tmpl-lint produces (a report): whole or not at all, through symbolic
    links, keeping an existing file's mode. A pipe or device (``/dev/stdout``) is written to
    as it is."""
    data = encode(path, text)
    try:
        existing = os.stat(path)
    except FileNotFoundError:
        existing = None
    except OSError as error:
        raise WriteError(f"{path}: cannot write: {error.strerror}") from None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                _write_all(descriptor, data)
            finally:
                os.close(descriptor)
        except OSError as error:
            raise WriteError(f"{path}: cannot write: {error.strerror or error}") from None
        return
    mode = stat.S_IMODE(existing.st_mode) if existing is not None else _new_file_mode()
    _land(path, Path(os.path.realpath(path)), lambda descriptor, _: _write_all(descriptor, data), mode, os.replace, "")


def create(path: Path, fill: Callable[[str], None], mode: int | None = None) -> None:
    """Create ``path``, which must not exist, whole or not at all; nothing is ever
    overwritten. Call it under ``locked(path)``.

    ``fill(name)`` writes the new file's bytes into the temporary file of that name (by
    name: gguf's writer opens its own file) and may check what it wrote, raising WriteError
    to write nothing. The file gets ``mode`` (by default what the umask leaves of 0o666), is
    synced, and appears under ``path`` by a hard link, which fails if another program took
    the name meanwhile. On a file system without hard links it is renamed into place, the
    name checked free right before.
    """
    if os.path.lexists(path):
        raise WriteError(f"{path}: already exists; tmpl-lint does not overwrite it")
    taken = f"{path}: appeared while it was written; tmpl-lint does not overwrite it"

    def link(temporary: str, target: Path) -> None:
        try:
            os.link(temporary, target)
        except FileExistsError:
            raise WriteError(taken) from None
        except OSError:  # no hard links here (FAT, some network file systems)
            if os.path.lexists(target):
                raise WriteError(taken) from None
            os.rename(temporary, target)
            return
        with contextlib.suppress(OSError):  # the file is in place; a stray name is only untidy
            os.unlink(temporary)

    target = Path(os.path.realpath(path))
    _land(
        path, target, lambda _, temporary: fill(temporary), _new_file_mode() if mode is None else mode, link, "; nothing written"
    )


def _land(
    path: Path,
    target: Path,
    fill: Callable[[int, str], None],
    mode: int,
    put: Callable[[str, Path], None],
    unchanged: str,
) -> None:
    """How every write ends: ``fill(descriptor, name)`` writes a temporary file in the
    target's folder, which gets ``mode`` and is synced; ``put(name, target)`` puts it in
    place (and takes its name away) with SIGINT and SIGTERM held; the folder is synced. The
    temporary file is removed on every failure and interruption; an OSError is one line
    ending in ``unchanged``."""
    pending: str | None = None
    try:
        # Held, so that a signal cannot land between the file's creation and `pending`
        # naming it: the finally below removes whatever `pending` names.
        with _signals_held():
            try:
                descriptor, pending = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            except OSError as error:
                # Each write creates its file beside the target first: a folder that takes no
                # new files (/proc, one without write permission) cannot be written to.
                raise WriteError(
                    f"{path}: its folder {target.parent} does not take new files ({error.strerror}); nothing written"
                ) from None
        temporary = pending
        try:
            fill(descriptor, temporary)
            os.fchmod(descriptor, mode)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        with _signals_held():
            put(temporary, target)
            pending = None
        _fsync_directory(target.parent)
    except OSError as error:
        raise WriteError(f"{path}: cannot write: {error.strerror or error}{unchanged}") from None
    finally:
        if pending is not None:
            with contextlib.suppress(OSError):
                os.unlink(pending)


def _new_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def encode(path: Path, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise WriteError(
            f"{path}: the text to write has a lone surrogate at character {error.start}, which UTF-8 cannot hold; nothing written"
        ) from None


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


def _keep_owner(descriptor: int, status: os.stat_result) -> bool:
    """Give the new file the old one's owner and group; False if this process may not."""
    now = os.fstat(descriptor)
    if (now.st_uid, now.st_gid) == (status.st_uid, status.st_gid):
        return True
    try:
        os.fchown(descriptor, status.st_uid, status.st_gid)
    except PermissionError:
        return False
    return True


def _check_unchanged(snapshot: Snapshot) -> None:
    """Refuse unless the path still names the file the snapshot read, holding its bytes."""
    changed = f"{snapshot.path}: changed since it was read (another program wrote it); nothing written, run tmpl-lint again"
    try:
        if Path(os.path.realpath(snapshot.path, strict=True)) != snapshot.target:
            raise WriteError(changed)
        data, status = read_bytes(snapshot.target, limit=len(snapshot.data))
    except (OSError, SourceError):
        raise WriteError(changed) from None
    if (status.st_dev, status.st_ino) != (snapshot.status.st_dev, snapshot.status.st_ino) or data != snapshot.data:
        raise WriteError(changed)


def _write_in_place(snapshot: Snapshot, data: bytes) -> None:
    """Overwrite the target's own bytes (its inode, links and owner stay), after a copy of
    the old bytes is safe on disk: if the write fails part-way the old bytes are put back,
    and if even that fails they are still in the copy, which the error names."""
    path, target = snapshot.path, snapshot.target
    try:
        descriptor, backup = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".orig")
    except OSError as error:
        raise WriteError(f"{path}: cannot keep a copy of it before writing in place: {error.strerror}; nothing written") from None
    try:
        try:
            _write_all(descriptor, snapshot.data)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(backup)
        raise WriteError(f"{path}: cannot keep a copy of it before writing in place: {error.strerror}; nothing written") from None
    keep_backup = False
    try:
        with _signals_held():
            _check_unchanged(snapshot)
            try:
                descriptor = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
            except OSError as error:
                raise WriteError(f"{path}: cannot write: {error.strerror}; the file is unchanged") from None
            try:
                _overwrite(descriptor, data)
            except OSError as error:
                try:
                    _overwrite(descriptor, snapshot.data)
                except OSError:
                    keep_backup = True
                    raise WriteError(
                        f"{path}: the write failed part-way ({error.strerror}) and so did putting the old bytes back; "
                        f"they are in {backup}"
                    ) from None
                raise WriteError(f"{path}: cannot write: {error.strerror}; the file is unchanged") from None
            finally:
                os.close(descriptor)
        _fsync_directory(target.parent)
    finally:
        if not keep_backup:
            with contextlib.suppress(OSError):
                os.unlink(backup)


def _overwrite(descriptor: int, data: bytes) -> None:
    os.lseek(descriptor, 0, os.SEEK_SET)
    _write_all(descriptor, data)
    os.ftruncate(descriptor, len(data))
    os.fsync(descriptor)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable, where the file system can sync a folder (the new bytes are
    already synced and in place: a folder that cannot be synced is not an error)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done, then take effect as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs signal handlers in the main thread only: none can land here
        return
    received: list[int] = []
    numbers = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.signal(number, lambda number, frame: received.append(number)) for number in numbers}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if received:
            signal.raise_signal(received[0])
