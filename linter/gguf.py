"""GGUF models: the chat templates in a file's metadata, the tokenizer it describes, fixes.

llama.cpp, LM Studio and Ollama's GGUF imports read the chat template from the metadata:
``tokenizer.chat_template`` (reported as ``model.gguf:default``) and named
``tokenizer.chat_template.<name>`` variants (``model.gguf:<name>``; llama.cpp uses
``tool_use`` for requests with tools). A split model (``*-00001-of-0000N.gguf``) keeps its
metadata in the first split.

Linting maps the file and walks only the header and the key-value metadata: the tensor data
(tens of GB) is never read, so a GGUF lints in the time its metadata takes to walk. The
``gguf`` package (the ``[gguf]`` extra) is not what reads it: ``gguf.GGUFReader`` builds a
numpy array for every vocabulary entry (13 s for 150k tokens), importing the package costs
0.2 s (numpy), and even its constants module alone takes longer to execute (thousands of
enum members) than the whole walk. The dozen values of the format the walk needs are
below, and a test holds them equal to gguf's. gguf writes the ``--gguf-copy`` files.

``--fix`` never rewrites a model: each fixed template is written beside it
(``<model>.chat_template.jinja``, for llama.cpp's ``--jinja --chat-template-file``).
``--gguf-copy`` writes a NEW GGUF with the fixed metadata, streamed through gguf's own
writer, and reads it back before it appears under its name. Both are created through
writes.py like every other write (its lock, then ``create``): nothing is ever overwritten.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import itertools
import mmap
import os
import re
import shutil
import stat
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import writes
from .config import cache_directory
from .findings import quoted_name
from .inputs import GGUF_SUFFIX, NothingToLint, SourceError, TemplateSource
from .writes import WriteError

INSTALL_HINT = "pip install 'tmpl-lint[gguf]'"
DEFAULT_NAME = "default"  # gguf's writer files a template named "default" under tokenizer.chat_template
SPLIT_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
COMPANION_NAME = re.compile(r"^(?P<stem>.+)\.chat_template(?:\.(?P<name>[^.]+))?\.jinja$")
# Real metadata (a 256k vocabulary with scores and merges) is tens of MB; past this, a header
# is corrupt, and following it would read the tensor data.
MAX_METADATA_BYTES = 512 * 1024 * 1024


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
# The special tokens a template sees, and the metadata keys holding their ids.
SPECIAL_TOKEN_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}
# What building the file's tokenizer reads in full; every other array is only stepped over.
TOKENIZER_ARRAYS = frozenset({TOKENS_KEY, "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"})


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
        found = [(name, text) for name, text, problem in self._template_entries() if problem is None]
        return sorted(found, key=lambda pair: pair[0] != DEFAULT_NAME)

    def template_problems(self) -> list[str]:
        """Why each ``tokenizer.chat_template*`` entry that is no template cannot be read: it
        is its own error, and the model's other templates are still read (as llama.cpp reads
        the default whatever a variant holds)."""
        return [problem for _name, _text, problem in self._template_entries() if problem is not None]

    def _template_entries(self) -> list[tuple[str, str, str | None]]:
        """(name, text, why it cannot be read or None) of every chat template entry."""
        entries: list[tuple[str, str, str | None]] = []
        for key, entry in self.fields.items():
            if key == CHAT_TEMPLATE_KEY:
                name = DEFAULT_NAME
            elif key.startswith(CHAT_TEMPLATE_KEY + "."):
                name = key[len(CHAT_TEMPLATE_KEY) + 1 :]
            else:
                continue
            if entry.type != ValueType.STRING:
                entries.append((name, "", f"{key} is {type_name(entry)}, expected a string"))
            elif not entry.value.strip():
                entries.append((name, "", f"{key} is empty"))
            else:
                entries.append((name, entry.value, None))
        return entries


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
    except struct.error:
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
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # only a copy reads the tensor table

    if metadata.tensor_count > (len(buffer) - position) // 24:
        raise Truncated("the tensor table runs past the end")
    for _ in range(metadata.tensor_count):
        name, position = string_at(position, "a tensor name")
        (dimensions,) = u32.unpack_from(buffer, position)
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
        metadata.tensors.append(TensorInfo(name, dims, ggml_type, offset, elements // block * block_bytes))
    alignment = metadata.value(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{ALIGNMENT_KEY} is {alignment!r}, not a power of two")
    metadata.data_start = -(-position // alignment) * alignment


def read_metadata(path: Path, keep_arrays: frozenset[str] | set[str] = frozenset(), with_tensors: bool = False) -> Metadata:
    """A local GGUF's metadata, through a memory map: only the pages the header covers are read."""
    return _with_metadata(path, lambda mapped, metadata: metadata, keep_arrays, with_tensors)


def tokenizer_digest(model: Path) -> str | None:
    """A hash of the raw ``tokenizer.ggml.*`` values: models that tokenize alike hash alike
    (every quantization of one model), whatever else their metadata says."""

    def digest(mapped, metadata: Metadata) -> str:
        hashed = hashlib.sha256()
        for key in sorted(key for key in metadata.fields if key.startswith("tokenizer.ggml.")):
            hashed.update(key.encode() + b"\0" + mapped[slice(*metadata.fields[key].span)])
        return hashed.hexdigest()

    try:
        return _with_metadata(model, digest)
    except GGUFError:
        return None


def _with_metadata(path: Path, use, keep_arrays=frozenset(), with_tensors: bool = False):
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


# -- sources -------------------------------------------------------------------------------


def is_later_split(path: Path) -> bool:
    """A split after the first: its metadata lives in split 1."""
    match = SPLIT_NAME.search(path.name)
    return match is not None and int(match.group(1)) != 1


def first_split(path: Path) -> Path:
    match = SPLIT_NAME.search(path.name)
    if match is None or int(match.group(1)) == 1:
        return path
    first = path.with_name(f"{path.name[: match.start()]}-00001-of-{match.group(2)}.gguf")
    if not first.is_file():
        raise SourceError(
            path,
            f"split {int(match.group(1))} of {int(match.group(2))}: the metadata is in the first split, {first.name}, which is not there",
        )
    return first


def model_stem(path: Path) -> str:
    """The model's name: the file name without ``.gguf`` and the split counter."""
    match = SPLIT_NAME.search(path.name)
    return path.name[: match.start()] if match else path.name[: -len(GGUF_SUFFIX)]


def companion_path(model: Path, name: str | None) -> Path:
    """Where ``--fix`` writes a fixed template: ``<model>.chat_template[.<name>].jinja``."""
    suffix = "" if name in (None, DEFAULT_NAME) else f".{name}"
    return model.with_name(f"{model_stem(model)}.chat_template{suffix}.jinja")


def gguf_beside(template: Path) -> Path | None:
    """The GGUF a ``<model>.chat_template*.jinja`` was fixed out of, when it is there."""
    match = COMPANION_NAME.match(template.name)
    if match is None:
        return None
    single = template.with_name(match.group("stem") + GGUF_SUFFIX)
    if single.is_file():
        return single
    splits = sorted(template.parent.glob(f"{glob_escape(match.group('stem'))}-00001-of-*.gguf"))
    return splits[0] if splits else None


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def read_templates(path: Path, required: bool = True) -> tuple[list[TemplateSource], list[SourceError]]:
    """Every chat template in a GGUF's metadata (the first split's, for a split model), and
    an error for each template entry that cannot be read (the others are still linted).

    ``required`` False is a directory walk: a GGUF without a template (a vision projector,
    an embedding model) is not a template file there, and is passed over.
    """
    first = first_split(path)
    try:
        metadata = read_metadata(first)
    except GGUFError as error:
        raise SourceError(first, str(error)) from None
    pairs = metadata.templates()
    unread = [SourceError(first, problem) for problem in metadata.template_problems()]
    if not pairs and not unread and required:
        # Named on the command line, as a base model's tokenizer_config.json: nothing to lint.
        raise NothingToLint(
            first,
            "no chat template in its metadata (tokenizer.chat_template): nothing to lint"
            " (a base model, an embedding model or a vision projector holds none)",
        )
    return [TemplateSource(first, name, text, "gguf", _companion_note(first, name)) for name, text in pairs], unread


def _companion_note(model: Path, name: str) -> str | None:
    """Said where --fix wrote this template's fix beside the model: the check reads the
    model's metadata, which --fix never rewrites, and the fixed file is what llama.cpp
    serves only when told to."""
    try:
        companion = companion_path(model, name)
        if not companion.is_file():
            return None
    except OSError:
        return None
    return f"{quoted_name(companion.name)} beside the model holds a fixed {name} template; {_kept_in_metadata(name)}"


def metadata_note(model: Path, name: str, written: bool, fresh: bool = True) -> str:
    """Said of a template of ``model`` whose fix --fix wrote (``written``; ``fresh`` False:
    found written by an earlier run) or --diff would write beside it: the lint that follows
    reads the model's metadata, as the next check will."""
    companion = quoted_name(companion_path(model, name).name)
    if not written:
        done = f"the patch writes its fix to {companion} beside the model"
    elif fresh:
        done = f"--fix wrote its fix to {companion} beside the model"
    else:
        done = f"its fix is already beside the model, in {companion} (an earlier --fix wrote it)"
    return f"{done}; {_kept_in_metadata(name)}"


def _kept_in_metadata(name: str) -> str:
    served = (
        "llama.cpp serves the fixed file with --chat-template-file"
        if name == DEFAULT_NAME
        else f"llama.cpp reads the {name} template only from the model's metadata"
    )
    return (
        f"this is the one in the model's metadata, which --fix never rewrites ({served}; "
        "--fix --gguf-copy writes a model that carries the fix)"
    )


def model_for(source: TemplateSource) -> Path | None:
    """The local GGUF whose metadata a template came from, or was fixed out of."""
    if source.container == "gguf":
        return source.path if source.path.is_file() else None
    if source.container == "jinja":
        return gguf_beside(source.path)
    return None


# -- the file's own tokenizer ----------------------------------------------------------------


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
        return _with_metadata(model, lambda mapped, metadata: tokenizer_in(mapped, metadata, model))
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
    from .tokenizer import Tokenizer

    description = f"token ids of the tokenizer in {name}'s metadata ({kind}, {tokens.count} tokens)"
    entry = _cache_entry(key)
    tokenizer = Tokenizer(model, backend, special, identity=f"gguf:{key}")
    return OwnTokenizer(tokenizer, special, description, entry.parent if entry.is_file() else None)


# -- the built tokenizers, cached on disk ------------------------------------------------------
#
# Building a tokenizer from GGUF metadata (importing transformers, converting 150k tokens and
# merges) takes seconds; loading the tokenizer.json it makes takes a tenth of that. Each built
# tokenizer is kept as tokenizer.json under the user's cache, named by a hash of everything
# the build reads (every tokenizer.ggml.* value, with its type, and the architecture) and of
# the versions of the code that builds it: every quantization of a model shares one entry, and
# an upgrade builds afresh. An entry that does not load, or loads with another vocabulary
# size, is built again and replaced; one that cannot be written costs the next run a build.

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


def _cache_entry(key: str) -> Path:
    # a folder holding tokenizer.json, as a tokenizer directory does
    return cache_directory() / "gguf-tokenizers" / key / "tokenizer.json"


def cached_tokenizer(key: str, vocabulary_size: int):
    """The tokenizer cached under ``key``, or None: absent, unreadable, or not this vocabulary."""
    try:
        from tokenizers import Tokenizer as FastTokenizer
    except ImportError:
        return None  # the build says what to install
    try:
        backend = FastTokenizer.from_file(str(_cache_entry(key)))
    except Exception:  # noqa: BLE001 - tokenizers raises bare Exceptions for missing and bad files
        return None
    return backend if backend.get_vocab_size(with_added_tokens=True) == vocabulary_size else None


def store_tokenizer(key: str, backend) -> None:
    entry = _cache_entry(key)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        writes.write_file(entry, backend.to_str())  # whole or not at all: a reader never sees half
    except (OSError, WriteError):
        pass  # the next run builds it again


def preload_tokenizers(sources: list[TemplateSource]) -> None:
    for model in dict.fromkeys(model_for(source) for source in sources if source.container in ("gguf", "jinja")):
        if model is not None:
            own_tokenizer(model)


def metadata_special_tokens(model: Path) -> dict[str, str]:
    """bos_token, eos_token... of a GGUF, without building its tokenizer."""
    try:
        return _with_metadata(model, lambda mapped, metadata: special_tokens(metadata, mapped))
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


# -- writing ---------------------------------------------------------------------------------


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
        import gguf
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
    import numpy

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
        for before, after in zip(original.tensors, copy.tensors):
            start_a, start_b = original.data_start + before.offset, copy.data_start + after.offset
            if start_b + after.nbytes > len(written):
                fail(f"tensor {before.name} is cut short")
            length = min(SAMPLE_BYTES, before.nbytes)
            for skip in (0, before.nbytes - length):
                if source[start_a + skip : start_a + skip + length] != written[start_b + skip : start_b + skip + length]:
                    fail(f"tensor {before.name} differs")


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
    import shlex

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


# -- GGUF repos on the Hub -------------------------------------------------------------------

FIRST_READ_BYTES = 1 << 20


class HubGGUFError(Exception):
    pass


@dataclass(frozen=True)
class HubTemplates:
    sources: list[TemplateSource]
    tokens_problem: str | None = None  # why ``tokens`` was asked and the figures are in characters
    # Why each template entry that is no template cannot be read (the others are audited).
    unread: list[str] = field(default_factory=list)


def hub_templates(repo: str, revision: str | None, tokens: bool = False) -> HubTemplates:
    """The chat templates of a Hub repo's GGUF models, without downloading one.

    The Hub's model info carries the default template of the repo's GGUF (its ``gguf``
    expansion, with BOS and EOS); a repo it says nothing for, or whose figures are wanted
    in ``tokens``, has the first split of its first model read from the start, by HTTP
    range, just past the metadata, which holds the model's tokenizer: it is built (or found
    in tmpl-lint's cache) and the templates' proofs are measured with it.
    """
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, revision=revision, expand=["gguf", "siblings"])
    names = sorted(sibling.rfilename for sibling in info.siblings or () if sibling.rfilename.endswith(GGUF_SUFFIX))
    # vision projectors (mmproj) carry no template
    models = [name for name in names if not is_later_split(Path(name)) and "mmproj" not in Path(name).name.lower()]
    if not models:
        return HubTemplates([])
    summary = info.gguf if isinstance(info.gguf, dict) else {}
    text = summary.get("chat_template")
    if isinstance(text, str) and text.strip() and not tokens:
        special = tuple((key, summary[key]) for key in ("bos_token", "eos_token") if isinstance(summary.get(key), str))
        # the summary does not say which of the repo's files it describes
        return HubTemplates([TemplateSource(Path(repo) / "gguf", DEFAULT_NAME, text, "gguf", special_tokens=special)])
    data, metadata = read_hub_metadata(repo, models[0], revision)
    pairs = metadata.templates()
    unread = [f"{models[0]}: {problem}" for problem in metadata.template_problems()]
    if unread and not pairs:
        raise HubGGUFError("; ".join(unread))
    directory, problem = None, None
    if tokens:
        own = tokenizer_in(data, metadata, Path(models[0]))
        special, directory = own.special_tokens, own.directory
        if own.tokenizer is None:
            problem = f"--tokens: {own.description.removeprefix('measured in characters: ')}; figures are in characters"
        elif directory is None:
            problem = f"--tokens: the tokenizer of {models[0]} cannot be kept in {cache_directory()}; figures are in characters"
    else:
        special = special_tokens(metadata, data)
    special_pairs = tuple(special.items())
    sources = [
        TemplateSource(Path(repo) / models[0], name, text, "gguf", special_tokens=special_pairs, tokenizer_directory=directory)
        for name, text in pairs
    ]
    return HubTemplates(sources, problem, unread)


def read_hub_metadata(repo: str, filename: str, revision: str | None) -> tuple[bytes, Metadata]:
    """A Hub GGUF's first bytes and its metadata, read from its start in growing ranges until
    the metadata parses (arrays stepped over: ``parse`` them again to decode some)."""
    from huggingface_hub import HfFileSystem

    data = bytearray()
    wanted = FIRST_READ_BYTES
    with HfFileSystem().open(f"{repo}/{filename}", "rb", revision=revision) as stream:  # range requests
        while True:
            chunk = stream.read(wanted - len(data))
            data += chunk
            try:
                read = bytes(data)
                return read, parse(read)
            except Truncated:
                if not chunk:
                    raise HubGGUFError(f"{filename}: the file ends inside its metadata") from None
                if wanted >= MAX_METADATA_BYTES:
                    raise HubGGUFError(f"{filename}: metadata over {MAX_METADATA_BYTES >> 20} MiB") from None
                wanted *= 2
            except GGUFError as error:
                raise HubGGUFError(f"{filename}: {error}") from None
