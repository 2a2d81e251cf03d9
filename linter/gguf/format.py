"""The GGUF format: reading a file's header and key-value metadata.

Linting maps the file and walks only the header and the key-value metadata: the tensor data
(tens of GB) is never read, so a GGUF lints in the time its metadata takes to walk. The
``gguf`` package (the ``[gguf]`` extra) is not what reads it: ``gguf.GGUFReader`` builds a
numpy array for every vocabulary entry (13 s for 150k tokens), importing the package costs
0.2 s (numpy), and even its constants module alone takes longer to execute (thousands of
enum members) than the whole walk. The dozen values of the format the walk needs are
below, and a test holds them equal to gguf's. gguf writes the ``--gguf-copy`` files
(writing.py).
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

DEFAULT_NAME = "default"  # gguf's writer files a template named "default" under tokenizer.chat_template
# Real metadata (a 256k vocabulary with scores and merges) is tens of MB; past this, a header
# is corrupt, and following it would read the tensor data.
MAX_METADATA_BYTES = 512 * 1024 * 1024
# A real array (a 256k vocabulary, its scores, types and merges) holds under a million items;
# past this, a count is corrupt, and decoding it would allocate tens of bytes per item.
MAX_ARRAY_ITEMS = 1 << 24
MAX_DIMENSIONS = 4  # of a tensor (GGML_MAX_DIMS)


# -- the format (gguf.constants; tests/test_gguf.py holds these to it) ---------------------


class ValueType(enum.IntEnum):
    """Metadata value types, by their codes in the file (gguf.GGUFValueType)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct formats of the fixed-size types; STRING and ARRAY are variable-length
SCALAR_FORMATS = {
    ValueType.UINT8: "B",
    ValueType.INT8: "b",
    ValueType.UINT16: "H",
    ValueType.INT16: "h",
    ValueType.UINT32: "I",
    ValueType.INT32: "i",
    ValueType.FLOAT32: "f",
    ValueType.BOOL: "?",
    ValueType.UINT64: "Q",
    ValueType.INT64: "q",
    ValueType.FLOAT64: "d",
}
GGUF_MAGIC = 0x46554747  # b"GGUF", read as a little-endian uint32
DEFAULT_ALIGNMENT = 32  # of the tensor data, unless general.alignment says otherwise
ALIGNMENT_KEY = "general.alignment"
ARCHITECTURE_KEY = "general.architecture"
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"  # the default; variants add ".<name>"
TOKENS_KEY = "tokenizer.ggml.tokens"
MERGES_KEY = "tokenizer.ggml.merges"
# The special tokens a template sees, and the metadata keys holding their ids.
SPECIAL_TOKEN_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}
# What building the file's tokenizer reads in full; every other array is only stepped over.
TOKENIZER_ARRAYS = frozenset({TOKENS_KEY, MERGES_KEY, "tokenizer.ggml.token_type", "tokenizer.ggml.scores"})


class GGUFError(Exception):
    """A file that is not a readable GGUF, said in one line."""


class Truncated(GGUFError):
    """The bytes end inside the metadata: a cut file, or a range read that needs more."""


class _EveryKey(frozenset):
    def __contains__(self, key: object) -> bool:
        return True


EVERY_ARRAY = _EveryKey()  # ``keep_arrays`` for a copy: decode them all


# -- reading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    type: ValueType
    # Scalars and strings as Python values; arrays as lists when asked for, else None.
    value: Any
    item_type: ValueType | None = None  # an array's
    count: int = 0  # an array's length
    span: tuple[int, int] = (0, 0)  # where the value's bytes lie, for comparing copies exactly


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section
    nbytes: int


@dataclass
class Metadata:
    version: int
    byte_order: str  # "<" or ">", as struct spells them
    fields: dict[str, Field]
    tensor_count: int
    tensors: list[TensorInfo] = field(default_factory=list)  # read only when asked
    data_start: int | None = None

    def value(self, key: str, default: Any = None) -> Any:
        found = self.fields.get(key)
        return default if found is None or found.value is None else found.value

    def templates(self) -> list[tuple[str, str]]:
        """(name, text) of every chat template that can be read, the default first."""
        found = [(entry.name, entry.text) for entry in self.template_entries() if entry.problem is None and not entry.ignored]
        return sorted(found, key=lambda pair: pair[0] != DEFAULT_NAME)

    def template_problems(self) -> list[str]:
        """Why each ``tokenizer.chat_template*`` entry that is no template cannot be read: it
        is its own error, and the model's other templates are still read (as llama.cpp reads
        the default whatever a variant holds)."""
        return [entry.problem for entry in self.template_entries() if entry.problem is not None]

    def ignored_templates(self) -> list[str]:
        """Why each template entry that llama.cpp never reads is not linted, said as a warning."""
        return [entry.ignored for entry in self.template_entries() if entry.ignored is not None]

    def template_entries(self) -> list[TemplateEntry]:
        entries: list[TemplateEntry] = []
        for key, entry in self.fields.items():
            if key == CHAT_TEMPLATE_KEY:
                name = DEFAULT_NAME
            elif key.startswith(CHAT_TEMPLATE_KEY + "."):
                name = key[len(CHAT_TEMPLATE_KEY) + 1 :]
            else:
                continue
            if key == CHAT_TEMPLATE_KEY + "." + DEFAULT_NAME:
                # llama.cpp reads its default from tokenizer.chat_template and each variant
                # by the name asked for (only "tool_use"): a variant named "default" is never
                # read, and what the model serves is the other entry, or none.
                entries.append(
                    TemplateEntry(
                        name,
                        "",
                        ignored=f"{key} is never read by llama.cpp (its default template is {CHAT_TEMPLATE_KEY}): not linted",
                    )
                )
            elif not NAME.fullmatch(name):
                entries.append(
                    TemplateEntry(
                        name,
                        "",
                        f"{key}: the name {name!r} cannot name a file (a separator, a control character, a leading dot or over 100 characters); not read",
                    )
                )
            elif entry.type != ValueType.STRING:
                entries.append(TemplateEntry(name, "", f"{key} is {type_name(entry)}, expected a string"))
            elif not entry.value.strip():
                entries.append(TemplateEntry(name, "", f"{key} is empty"))
            else:
                entries.append(TemplateEntry(name, entry.value))
        return entries


# A template variant's name ("tool_use", "rag") becomes part of a file name (the fixed
# template beside the model) and of every report line: no separator, control character or
# leading dot, and short enough to fit in a file name.
NAME = re.compile(r"[^./\\\x00-\x1f\x7f][^/\\\x00-\x1f\x7f]{0,99}")


@dataclass(frozen=True)
class TemplateEntry:
    """One ``tokenizer.chat_template*`` entry: a template to lint, or why it is not one
    (``problem``: an error) or is not read by llama.cpp (``ignored``: a warning)."""

    name: str
    text: str
    problem: str | None = None
    ignored: str | None = None


def type_name(entry: Field) -> str:
    if entry.item_type is not None:
        return f"an array of {entry.item_type.name.lower()}"
    return f"a {entry.type.name.lower()}"


def parse(buffer, keep_arrays: frozenset[str] | set[str] = frozenset(), with_tensors: bool = False) -> Metadata:
    """The metadata at the start of ``buffer`` (bytes or a memory map of the whole file).

    Arrays named in ``keep_arrays`` are decoded; every other array is stepped over without
    decoding. Raises Truncated when ``buffer`` ends inside what is read.
    """
    size = len(buffer)
    if size >= 4 and struct.unpack_from("<I", buffer, 0)[0] != GGUF_MAGIC:
        raise GGUFError("not a GGUF file (it does not start with the GGUF magic)")
    if size < 24:
        raise Truncated("the header runs past the end")
    order = "<"
    version = struct.unpack_from("<I", buffer, 4)[0]
    if version & 0xFFFF == 0:  # written on a big-endian machine
        order = ">"
        version = struct.unpack_from(">I", buffer, 4)[0]
    if version not in (2, 3):
        raise GGUFError(f"GGUF version {version} is not supported (versions 2 and 3 are)")
    tensor_count, kv_count = struct.unpack_from(order + "QQ", buffer, 8)
    u32, u64 = struct.Struct(order + "I"), struct.Struct(order + "Q")
    scalars = {kind: struct.Struct(order + fmt) for kind, fmt in SCALAR_FORMATS.items()}
    string_type, array_type = ValueType.STRING, ValueType.ARRAY

    def string_at(position: int, what: str) -> tuple[str, int]:
        (length,) = u64.unpack_from(buffer, position)
        end = position + 8 + length
        if end > size:
            raise Truncated(f"{what} runs past the end")
        try:
            return bytes(buffer[position + 8 : end]).decode("utf-8"), end
        except UnicodeDecodeError as error:
            raise GGUFError(f"{what} is not valid UTF-8 (byte {error.start})") from None

    fields: dict[str, Field] = {}
    position = 24
    try:
        for _ in range(kv_count):
            key, position = string_at(position, "a metadata key")
            raw_type = u32.unpack_from(buffer, position)[0]
            position += 4
            start = position
            try:
                kind = ValueType(raw_type)
            except ValueError:
                raise GGUFError(f"{key} has an unknown value type {raw_type}") from None
            if kind in scalars:
                value = scalars[kind].unpack_from(buffer, position)[0]
                position += scalars[kind].size
                entry = Field(kind, value, span=(start, position))
            elif kind == string_type:
                value, position = string_at(position, key)
                entry = Field(kind, value, span=(start, position))
            else:  # an array
                raw_item = u32.unpack_from(buffer, position)[0]
                count = u64.unpack_from(buffer, position + 4)[0]
                position += 12
                try:
                    item = ValueType(raw_item)
                except ValueError:
                    raise GGUFError(f"{key} is an array of unknown type {raw_item}") from None
                if count > size - position:  # every element takes at least a byte
                    raise Truncated(f"{key} runs past the end")
                if count > MAX_ARRAY_ITEMS:
                    raise GGUFError(f"{key} holds {count} items, over the {MAX_ARRAY_ITEMS} of any real GGUF: corrupt")
                values = None
                if item in scalars:
                    width = scalars[item].size
                    if key in keep_arrays:
                        values = list(struct.unpack_from(f"{order}{count}{SCALAR_FORMATS[item]}", buffer, position))
                    position += count * width
                elif item == string_type:
                    if key in keep_arrays:
                        values = []
                        for _ in range(count):
                            text, position = string_at(position, key)
                            values.append(text)
                    else:  # variable length: nothing to do but step over each (the hot loop)
                        position = skip_strings(buffer, position, count, order)
                else:
                    raise GGUFError(f"{key} is an array of {item.name.lower()}, which GGUF metadata does not nest")
                if position > size:
                    raise Truncated(f"{key} runs past the end")
                entry = Field(array_type, values, item, count, (start, position))
            if key in fields:
                raise GGUFError(f"the metadata holds {key} twice")
            fields[key] = entry
            if position > MAX_METADATA_BYTES:
                raise GGUFError(f"the metadata is over {MAX_METADATA_BYTES >> 20} MiB: a corrupt header")
        metadata = Metadata(version, order, fields, tensor_count)
        if with_tensors:
            _read_tensor_infos(buffer, metadata, position, string_at, u32, u64)
    except (struct.error, OverflowError):  # a read past the end, or at a length no file reaches
        raise Truncated("the metadata runs past the end") from None
    return metadata


# A vocabulary (150k tokens, as many merges) is most of a model's metadata, and stepping over
# its strings one by one in Python is most of a lint's time on a GGUF. _short_strings matches
# exactly RUN consecutive GGUF strings of under SHORT bytes each, in the regex engine: each
# string's first (little-endian) length byte selects the one alternative that can match it, the
# seven bytes after it must be zero, then exactly that many bytes of text follow. The strings
# have one parse, so a run either matches exactly as the walk one by one steps, or does not
# match (a longer string in it, or the end of the bytes) and is walked one by one. Compiling
# costs a few ms, paid only for an array long enough to gain from it.
RUN = 256
SHORT = 128  # a token or merge is rarely longer; fewer alternatives compile faster
SHORT_STRINGS_FROM = 4 * RUN  # items in an array before the run pattern is worth compiling


@lru_cache(maxsize=1)
def _short_strings() -> re.Pattern[bytes]:
    # The commonest lengths of tokens and merges (about 8 bytes) are tried first; NUL bytes are
    # written as themselves, which the pattern parser reads faster than escapes.
    lengths = sorted(range(SHORT), key=lambda length: (abs(length - 8), length))
    one = [re.escape(bytes([length])) + bytes(7) + b".{%d}" % length for length in lengths]
    return re.compile(b"(?:" + b"|".join(one) + b"){%d}+" % RUN, re.DOTALL)


def skip_strings(buffer, position: int, count: int, order: str) -> int:
    """Where ``count`` GGUF strings from ``position`` end (past the buffer's end if they do)."""
    unpack = struct.Struct(order + "Q").unpack_from
    if count >= SHORT_STRINGS_FROM and order == "<":  # big-endian files (rare) are walked
        match = _short_strings().match
        runs, count = divmod(count, RUN)
        for _ in itertools.repeat(None, runs):
            matched = match(buffer, position)
            if matched is not None:
                position = matched.end()
                continue
            for _ in itertools.repeat(None, RUN):
                position += 8 + unpack(buffer, position)[0]
    for _ in itertools.repeat(None, count):
        position += 8 + unpack(buffer, position)[0]
    return position


def _read_tensor_infos(buffer, metadata: Metadata, position: int, string_at, u32, u64) -> None:
    """The tensor table, each tensor's data checked to lie inside the file (a partial
    download ends inside it) before a copy is sized from it."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: PLC0415 -- an extra, 0.2 s: a copy only

    size = len(buffer)
    if metadata.tensor_count > (size - position) // 24:
        raise Truncated("the tensor table runs past the end")
    for _ in range(metadata.tensor_count):
        name, position = string_at(position, "a tensor name")
        (dimensions,) = u32.unpack_from(buffer, position)
        if dimensions > MAX_DIMENSIONS:
            raise GGUFError(f"tensor {name} has {dimensions} dimensions (ggml has at most {MAX_DIMENSIONS}): corrupt")
        dims = struct.unpack_from(f"{metadata.byte_order}{dimensions}Q", buffer, position + 4)
        position += 4 + 8 * dimensions
        (ggml_type,) = u32.unpack_from(buffer, position)
        (offset,) = u64.unpack_from(buffer, position + 4)
        position += 12
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise GGUFError(f"tensor {name} has an unknown ggml type {ggml_type}") from None
        elements = 1
        for dim in dims:
            elements *= dim
        if elements % block:
            raise GGUFError(f"tensor {name} has {elements} values, not a whole number of its type's blocks of {block}")
        metadata.tensors.append(TensorInfo(name, dims, ggml_type, offset, elements // block * block_bytes))
    alignment = metadata.value(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{ALIGNMENT_KEY} is {alignment!r}, not a power of two")
    # The data section starts at the next multiple of the alignment, inside the file: an
    # alignment past the file's size is a corrupt header, and a copy would pad up to it.
    if alignment > size:
        raise GGUFError(f"{ALIGNMENT_KEY} is {alignment}, more than the file's {size} bytes: corrupt")
    metadata.data_start = -(-position // alignment) * alignment
    for tensor in metadata.tensors:
        if metadata.data_start + tensor.offset + tensor.nbytes > size:
            raise Truncated(f"the data of tensor {tensor.name} runs past the end")


def read_metadata(path: Path, keep_arrays: frozenset[str] | set[str] = frozenset(), with_tensors: bool = False) -> Metadata:
    """A local GGUF's metadata, through a memory map: only the pages the header covers are read."""
    return with_metadata(path, lambda mapped, metadata: metadata, keep_arrays, with_tensors)


def tokenizer_digest(model: Path) -> str | None:
    """A hash of the raw ``tokenizer.ggml.*`` values: models that tokenize alike hash alike
    (every quantization of one model), whatever else their metadata says."""

    def digest(mapped, metadata: Metadata) -> str:
        hashed = hashlib.sha256()
        for key in sorted(key for key in metadata.fields if key.startswith("tokenizer.ggml.")):
            hashed.update(key.encode() + b"\0" + mapped[slice(*metadata.fields[key].span)])
        return hashed.hexdigest()

    try:
        return with_metadata(model, digest)
    except GGUFError:
        return None


def with_metadata(path: Path, use, keep_arrays=frozenset(), with_tensors: bool = False):
    """``use(the file's memory map, its metadata)``, with GGUFError for a file that is not one."""
    try:
        # Opened without waiting (a FIFO would block for a writer), then judged by what was
        # opened: only a regular file is mapped.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(descriptor, "rb") as stream:
            status = os.fstat(stream.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise GGUFError("not a regular file")
            if status.st_size == 0:
                raise GGUFError("empty file")
            with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                try:
                    metadata = parse(mapped, keep_arrays, with_tensors)
                except Truncated as error:
                    raise GGUFError(f"{error} of the file: truncated or corrupt") from None
                return use(mapped, metadata)
    except PermissionError:
        raise GGUFError("permission denied") from None
    except IsADirectoryError:
        raise GGUFError("is a directory") from None
    except OSError as error:
        raise GGUFError(error.strerror or str(error)) from None
