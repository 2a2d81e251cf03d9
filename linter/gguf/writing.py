"""Writing a GGUF's fixes: ``--fix`` never rewrites a model: each fixed template is written
beside it (``<model>.chat_template.jinja``, for llama.cpp's ``--jinja --chat-template-file``).
``--gguf-copy`` writes a NEW GGUF with the fixed metadata, streamed through gguf's own
writer, and reads it back before it appears under its name. Both are created through
writes.py like every other write (its lock, then ``create``): nothing is ever overwritten.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shlex
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .. import writes
from ..findings import quoted_name
from ..inputs import TemplateSource
from ..writes import WriteError
from .format import ALIGNMENT_KEY, DEFAULT_ALIGNMENT, DEFAULT_NAME, EVERY_ARRAY, GGUFError, Metadata, read_metadata
from .models import SPLIT_NAME, companion_path

INSTALL_HINT = "pip install 'tmpl-lint[gguf]'"


class CompanionTaken(WriteError):
    """A different file holds the name a fixed template is written under: it is never replaced."""

    def __init__(self, target: Path):
        self.target = target
        super().__init__(
            f"{target}: already exists and differs from the fixed template; tmpl-lint does not overwrite it (remove it to write the fix)"
        )

    @property
    def reason(self) -> str:
        """Why the fix is not (or would not be) written, said of each finding it fixes."""
        return f"{self.target} exists and differs from the fixed template; tmpl-lint does not overwrite it (remove it to write the fix)"


def _already_written(target: Path, data: bytes) -> bool:
    """True when ``target`` holds ``data``, False when nothing has its name; anything else
    there (another file, a link, a folder) raises CompanionTaken."""
    if not os.path.lexists(target):
        return False
    if target.is_file() and not target.is_symlink():
        with contextlib.suppress(OSError):
            if target.read_bytes() == data:
                return True
    raise CompanionTaken(target)


def write_companion(model: Path, name: str | None, text: str) -> tuple[Path, bool]:
    """Write a fixed template beside its GGUF; (its path, whether it was written now). The
    same fix already there is left alone; a different file there is an error."""
    target = companion_path(model, name)
    data = writes.encode(target, text)

    def fill(temporary: str) -> None:
        with open(temporary, "wb") as stream:
            stream.write(data)
        if Path(temporary).read_bytes() != data:
            raise WriteError(f"{target}: the written template does not read back; nothing written")

    with writes.locked(target):  # another tmpl-lint fixing the same model waits, then finds it written
        if _already_written(target, data):
            return target, False
        writes.create(target, fill)
    return target, True


@dataclass(frozen=True)
class CopyTarget:
    """Where ``--gguf-copy`` writes: a file, or a folder for a copy under the model's name.
    A folder is one that exists, or one named with a trailing separator (``fixed/``), which
    is created when the copy is written, as the README's example promises; a path loses
    that separator once it is a Path, so the text as given decides."""

    path: Path
    folder: bool

    @classmethod
    def given(cls, text: str) -> CopyTarget:
        path = Path(text)
        try:
            existing = path.is_dir()
        except OSError:  # under a folder that cannot be searched: problem() says so
            existing = False
        return cls(path, text.endswith(tuple(filter(None, (os.sep, os.altsep)))) or existing)

    def destination(self, model: Path) -> Path:
        return self.path / model.name if self.folder else self.path

    def problem(self) -> str | None:
        """Why no copy can be written there, said before anything is written: the folder it
        goes in (only the folder named with a trailing separator is created) is missing, not
        a folder, or cannot be searched."""
        try:
            return self._problem()
        except OSError as error:  # Python 3.11's is_dir raises under an unsearchable folder
            return f"{error.filename or self.path}: {error.strerror or error}"

    def _problem(self) -> str | None:
        if self.folder and self.path.exists() and not self.path.is_dir():
            return f"{self.path}: not a folder (--gguf-copy names a folder with a trailing {os.sep})"
        containing = self.path.parent
        if self.folder and self.path.is_dir() or containing.is_dir():
            return None
        reason = "not a folder" if containing.exists() else "no such folder"
        return f"{self.path}: {reason}: {containing}"

    def make_folder(self) -> bool:
        """Create the folder the copy goes in, where it was named to be made; whether it was."""
        if not self.folder or self.path.is_dir():
            return False
        try:
            self.path.mkdir()
        except OSError as error:
            raise WriteError(f"{self.path}: cannot create the folder: {error.strerror or error}") from None
        return True


def write_copy(model: Path, templates: dict[str, str], destination: Path) -> None:
    """A new GGUF at ``destination``: ``model`` with the named templates replaced in its
    metadata (``templates`` maps a template name to its new text) and everything else as
    it was. Streamed through gguf's writer; read back and compared before it appears."""
    try:
        import gguf  # noqa: PLC0415 -- an extra, 0.2 s: only as a GGUF is written
    except ImportError:
        raise WriteError(f"{destination}: writing a GGUF needs the gguf package: {INSTALL_HINT}") from None
    keys = gguf.Keys.Tokenizer
    replaced = {
        keys.CHAT_TEMPLATE if name == DEFAULT_NAME else keys.CHAT_TEMPLATE_N.format(name=name): text
        for name, text in templates.items()
    }
    size = model.stat().st_size
    free = shutil.disk_usage(destination.parent).free
    if free < size + (1 << 20):
        raise WriteError(f"{destination}: {free} bytes free in {destination.parent}, the copy needs about {size}")
    try:
        original = read_metadata(model, EVERY_ARRAY, with_tensors=True)
    except GGUFError as error:
        raise WriteError(f"{model}: {error}") from None
    # gguf's writer pads each tensor's data to the alignment, as llama.cpp's does: a model
    # written so holds that much. Empty tensors, each padded, would make a copy far larger.
    alignment = original.value(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
    laid_out = original.data_start + sum(-(-tensor.nbytes // alignment) * alignment for tensor in original.tensors)
    if laid_out > size + alignment:
        raise WriteError(
            f"{model}: its tensors padded to {ALIGNMENT_KEY} take {laid_out} bytes, more than the file's {size}: corrupt"
        )
    missing = set(replaced) - set(original.fields)
    if missing:
        raise WriteError(f"{model}: no {', '.join(sorted(missing))} in its metadata to replace")

    def fill(temporary: str) -> None:
        _stream_copy(gguf, model, original, Path(temporary), replaced)
        _check_copy(model, original, Path(temporary), replaced)

    with writes.locked(destination):
        writes.create(destination, fill, stat.S_IMODE(model.stat().st_mode))


def _stream_copy(gguf, model: Path, original: Metadata, temporary: Path, replaced: dict[str, str]) -> None:
    """gguf's writer writes header, metadata, tensor table, then each tensor from a read-only
    map of the original (pages read as they are written), as its gguf_new_metadata script
    does; the values come from this module's reader (gguf's own reader builds a numpy array
    per vocabulary entry: 13 s for a 150k vocabulary)."""
    import numpy  # noqa: PLC0415 -- 0.1 s: only as a GGUF is written (gguf's writer loaded it)

    endianess = gguf.GGUFEndian.LITTLE if original.byte_order == "<" else gguf.GGUFEndian.BIG
    architecture_key = gguf.Keys.General.ARCHITECTURE
    writer = gguf.GGUFWriter(temporary, original.value(architecture_key, ""), endianess=endianess)
    try:
        for key, entry in original.fields.items():
            if key == architecture_key:
                continue  # the writer writes it first
            if key == gguf.Keys.General.ALIGNMENT:
                writer.data_alignment = entry.value
            try:
                writer.add_key_value(key, replaced.get(key, entry.value), entry.type, sub_type=entry.item_type)
            except ValueError as error:
                raise WriteError(f"{model}: gguf's writer cannot copy {key}: {error}") from None
        for tensor in original.tensors:
            # numpy order is ggml's reversed; the given type is written as is
            writer.add_tensor_info(tensor.name, tuple(reversed(tensor.dims)), numpy.float32, tensor.nbytes, tensor.ggml_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        data = numpy.memmap(model, dtype=numpy.uint8, mode="r")
        assert original.data_start is not None  # read with its tensors
        for tensor in original.tensors:
            start = original.data_start + tensor.offset
            writer.write_tensor_data(data[start : start + tensor.nbytes], tensor_endianess=endianess)
        del data
    finally:
        writer.close()


SAMPLE_BYTES = 4096


def _check_copy(model: Path, original: Metadata, temporary: Path, replaced: dict[str, str]) -> None:
    """The copy reads back as the original with only the replaced templates changed: every
    other value byte for byte, the same tensors, and each tensor's first and last bytes
    equal (a full comparison would read the model twice more)."""
    try:
        copy = read_metadata(temporary, with_tensors=True)
    except GGUFError as error:
        raise WriteError(f"the copy does not read back: {error}") from None

    def fail(what: str):
        raise WriteError(f"the copy of {model} does not read back as written: {what}; nothing written")

    if set(copy.fields) != set(original.fields):
        fail("its metadata keys differ")
    if [(t.name, t.dims, t.ggml_type, t.nbytes) for t in copy.tensors] != [
        (t.name, t.dims, t.ggml_type, t.nbytes) for t in original.tensors
    ]:
        fail("its tensor table differs")
    with (
        open(model, "rb") as source_stream,
        open(temporary, "rb") as copy_stream,
        mmap.mmap(source_stream.fileno(), 0, access=mmap.ACCESS_READ) as source,
        mmap.mmap(copy_stream.fileno(), 0, access=mmap.ACCESS_READ) as written,
    ):
        for key, before in original.fields.items():
            after = copy.fields[key]
            if key in replaced:
                if after.value != replaced[key]:
                    fail(f"{key} is not the fixed template")
                continue
            if (after.type, after.item_type, after.count) != (before.type, before.item_type, before.count):
                fail(f"{key} changed type")
            if source[slice(*before.span)] != written[slice(*after.span)]:
                fail(f"{key} changed")
        assert original.data_start is not None and copy.data_start is not None  # both read with their tensors
        for tensor_before, tensor_after in zip(original.tensors, copy.tensors):
            start_a, start_b = original.data_start + tensor_before.offset, copy.data_start + tensor_after.offset
            if start_b + tensor_after.nbytes > len(written):
                fail(f"tensor {tensor_before.name} is cut short")
            length = min(SAMPLE_BYTES, tensor_before.nbytes)
            for skip in (0, tensor_before.nbytes - length):
                if source[start_a + skip : start_a + skip + length] != written[start_b + skip : start_b + skip + length]:
                    fail(f"tensor {tensor_before.name} differs")


# -- --fix on a GGUF ---------------------------------------------------------------------------


@dataclass
class PlacedFix:
    """One GGUF template's fix (fix.apply.TemplateFix) beside the model: what ``--fix`` did with
    it, or what ``--diff`` shows it would do."""

    target: Path  # the file the fix goes to
    now: TemplateSource  # the template as it now is, for the lint that follows
    lines: list[str] = field(default_factory=list)  # what was written where, and how llama.cpp reads it
    new_file: tuple[Path, str] | None = None  # --diff: the file --fix would create, and its text
    error: WriteError | None = None  # why the fix is not (or would not be) written: it is not made
    fresh: bool = True  # False: the same fixed template was already there, nothing was written

    @property
    def reason(self) -> str:
        """Why the fix is not made, said of each finding it fixes."""
        return self.error.reason if isinstance(self.error, CompanionTaken) else str(self.error)


def place_fix(model: Path, fix, write: bool, names: set[str | None]) -> PlacedFix:
    """Write the changed ``fix`` of one of ``model``'s templates (``names``, all of them)
    beside it; without ``write``, the file that would be created (none if it is there)."""
    target = companion_path(model, fix.source.name)
    if not write:
        try:
            there = _already_written(target, writes.encode(target, fix.patched))
        except WriteError as error:
            return PlacedFix(target, fix.source, error=error)
        return PlacedFix(target, _patched(fix), new_file=None if there else (target, fix.patched), fresh=not there)
    try:
        target, fresh = write_companion(model, fix.source.name, fix.patched)
    except WriteError as error:
        return PlacedFix(target, fix.source, error=error)
    placed = PlacedFix(target, TemplateSource(target, None, fix.patched, "jinja"), fresh=fresh)
    lines = placed.lines
    lines.append(companion_line(model, fix.source.name, target, fresh))
    if fix.source.name == DEFAULT_NAME:
        lines.append(f"  llama.cpp: llama-server -m {shell_word(model)} --jinja --chat-template-file {shell_word(target)}")
        if "tool_use" in names:
            lines.append(
                "  note: with --chat-template-file, llama.cpp renders requests with tools with it too, "
                "instead of the model's tool_use template"
            )
    else:
        lines.append(
            f"  llama.cpp reads the {fix.source.name} template only from the model's metadata: "
            "--gguf-copy PATH writes a GGUF that carries the fix"
        )
    return placed


def shell_word(path: Path) -> str:
    """``path`` as a word of a shell command to copy: as it is when the shell reads it so,
    else quoted, in bash's $'...' form where it holds a character that would split the
    printed line (the report's C-quoting, which a shell does not read)."""
    quoted = quoted_name(path)
    if quoted == str(path):
        return shlex.quote(quoted)
    return "$'" + quoted[1:-1].replace("'", "\\'") + "'"


def copy_with_fixes(model: Path, changed: list, copy_to: CopyTarget) -> list[str]:
    """``--gguf-copy``: a new GGUF carrying the ``changed`` fixes (fix.apply.TemplateFix); the
    lines to print. Raises WriteError."""
    if not changed:
        return [f"{model}: nothing fixed; no copy written"]
    destination = copy_to.destination(model)
    made = copy_to.make_folder()
    try:
        write_copy(model, {fix.source.name: fix.patched for fix in changed}, destination)
    except WriteError:
        if made:  # a copy that is not written leaves nothing behind, its new folder included
            with contextlib.suppress(OSError):
                copy_to.path.rmdir()
        raise
    return copy_lines(model, destination)


def copy_lines(model: Path, destination: Path) -> list[str]:
    """What is said of a copy written to ``destination``."""
    lines = [
        f"{quoted_name(model)}: wrote {quoted_name(destination)}, a copy with the fixed templates in its metadata (tensors unchanged)",
        f"  llama.cpp: llama-server -m {shell_word(destination)} --jinja",
    ]
    if SPLIT_NAME.search(model.name):
        lines.append(f"  the other splits are unchanged: put them (or links to them) beside {destination.name}")
    return lines


def companion_line(model: Path, name: str | None, target: Path, fresh: bool = True) -> str:
    """What is said of a fixed template put beside its model (or found there)."""
    return f"{quoted_name(model)}:{name}: {'wrote' if fresh else 'already written:'} the fixed template to {quoted_name(target)}"


def written_beside(model: Path, fix) -> Path | None:
    """Where the fixed template of ``fix`` is beside ``model``, if it is there now."""
    target = companion_path(model, fix.source.name)
    return target if _already_written(target, writes.encode(target, fix.patched)) else None


def _patched(fix) -> TemplateSource:
    return TemplateSource(fix.source.path, fix.source.name, fix.patched, "gguf")
