"""Loading a tokenizer once per process and encoding rendered prompts as a server does.

``tokenizer.json`` loads through ``tokenizers`` (a fraction of a second, no transformers
import); a directory without one falls back to transformers' AutoTokenizer. Text is
encoded with ``add_special_tokens=False``, as vLLM encodes a rendered chat prompt: the
template itself writes the BOS token.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import json
import os
import re
import tempfile
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Any

from .engines.base import EngineError
from .inputs import SourceError, load_json

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TokenizerError(Exception):
    pass


# -- panics in Rust ------------------------------------------------------------------------
# ``tokenizers`` panics where its Rust code meets what it cannot handle (a pre-tokenizer
# regex that backtracks past Oniguruma's retry limit): Rust's panic hook prints the panic
# and a backtrace on file descriptor 2, and pyo3 raises PanicException, a BaseException that
# no ``except Exception`` catches. Every call into the library is made inside
# ``rust_panics_as_errors``: the descriptor points at a file of this process's meanwhile,
# whose bytes are passed on to standard error unless the call panicked, and a panic is a
# TokenizerError (one line, the command's exit 2).

_QUIET = threading.RLock()  # one redirection at a time: a second would save the first's file as the descriptor
_sink: tuple[int, int] | None = None  # (pid, descriptor): a forked child makes its own


def _sink_descriptor() -> int:
    """An unnamed file of this process (a forked child's writes would interleave with its
    parent's in a file it inherited)."""
    global _sink
    if _sink is None or _sink[0] != os.getpid():
        descriptor, path = tempfile.mkstemp(prefix="tmpl-lint-stderr-")
        os.unlink(path)
        _sink = (os.getpid(), descriptor)
    return _sink[1]


def _is_panic(error: BaseException) -> bool:
    return type(error).__name__ == "PanicException"


@contextmanager
def rust_panics_as_errors(what: str):
    """Within: what the tokenizers library prints on panic goes nowhere, and the panic is a
    TokenizerError saying ``what`` failed."""
    with _QUIET:
        try:
            sink = _sink_descriptor()
            saved = os.dup(2)
        except OSError:  # no descriptors left, say: the call as it is
            yield
            return
        os.dup2(sink, 2)
        panicked = False
        try:
            yield
        except BaseException as error:
            if not _is_panic(error):
                raise
            panicked = True
            raise TokenizerError(f"{what}: {one_line(error)} (the tokenizers library panicked)") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            _pass_on(sink, panicked)


def _pass_on(sink: int, panicked: bool) -> None:
    """What reached descriptor 2 during the call (another thread's message, a library's
    warning), written where it was meant to go; not a panic's report."""
    size = os.lseek(sink, 0, os.SEEK_END)
    if not size:
        return
    os.lseek(sink, 0, os.SEEK_SET)
    written = os.read(sink, size)
    os.lseek(sink, 0, os.SEEK_SET)
    os.ftruncate(sink, 0)
    if not panicked:
        with contextlib.suppress(OSError):
            os.write(2, written)


@dataclass
class Tokenizer:
    """Encodes text to token ids; ``special_tokens`` are what the template sees as variables."""

    directory: Path
    backend: Any
    special_tokens: dict[str, Any] = field(default_factory=dict)
    kind: str = "tokenizers"
    # What names it across processes where its directory does not: a GGUF's tokenizer by the
    # cache key of its vocabulary, which the model's quantisations share.
    identity: str | None = None

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        with rust_panics_as_errors(f"{self.directory}: the tokenizer cannot encode a text"):
            if self.kind == "tokenizers":
                return self.backend.encode(text, add_special_tokens=False).ids
            return list(self.backend.encode(text, add_special_tokens=False))

    def token_start(self, text: str, index: int) -> int | None:
        """Where token ``index`` of ``encode(text)`` starts in ``text`` (a character offset),
        from the backend's offsets; None where it gives none (a slow tokenizer)."""
        try:
            with rust_panics_as_errors(f"{self.directory}: the tokenizer cannot encode a text"):
                if self.kind == "tokenizers":
                    offsets = self.backend.encode(text, add_special_tokens=False).offsets
                else:
                    offsets = self.backend(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        except Exception:  # noqa: BLE001 - transformers' slow tokenizers raise NotImplementedError, among others
            return None
        return offsets[index][0] if index < len(offsets) else None


# gpt-oss's tokenizer.json, by size and sha256: the BPE of openai-harmony's o200k_harmony
# with its own added tokens. tests/test_tokenizer.py encodes text with the file and with
# openai-harmony and compares the ids.
HARMONY_VOCABULARY_FILES = frozenset({(11988440, "5d166cf76a735006c818d9bbd4e4052ec03011c243969a1b6d6697685bc77b70")})


class HarmonyVocabularyTokenizer(Tokenizer):
    """A tokenizer.json that is one of ``HARMONY_VOCABULARY_FILES``, encoded by
    openai-harmony's built-in vocabulary instead of being parsed: parsing its 12 MB was most
    of a cold gpt-oss proof, which loads openai-harmony for vLLM's render anyway. Its added
    tokens are split out of the text first, as ``tokenizers`` does, and each piece between
    them is encoded as ordinary text. ``backend`` (the file as ``tokenizers`` loads it) is
    loaded only when something asks for it: replay's incremental tokenization, decoding."""

    def __init__(self, directory: Path, backend: Any, special_tokens: dict[str, Any], kind: str = "tokenizers", *, added):
        self._backend = backend
        super().__init__(directory, backend, special_tokens, kind)
        self.added: dict[str, int] = added
        longest_first = sorted(added, key=len, reverse=True)
        self._added_token = re.compile("|".join(map(re.escape, longest_first))) if added else None

    def __repr__(self) -> str:  # the dataclass's would load the file, to show it
        return f"{type(self).__name__}({str(self.directory)!r})"

    @property
    def backend(self) -> Any:
        if self._backend is None:
            self._backend = _load_file(self.directory / "tokenizer.json")
        return self._backend

    @backend.setter
    def backend(self, value: Any) -> None:
        self._backend = value

    def encode(self, text: str) -> list[int]:
        from .engines.harmony import harmony_encoding  # noqa: PLC0415 -- openai-harmony, loaded only for gpt-oss's vocabulary

        encoding = harmony_encoding()
        ids: list[int] = []
        start = 0
        for match in self._added_token.finditer(text) if self._added_token is not None else ():
            if match.start() > start:
                ids += encoding.encode(text[start : match.start()], disallowed_special=())
            ids.append(self.added[match.group()])
            start = match.end()
        if start < len(text):
            ids += encoding.encode(text[start:], disallowed_special=())
        return ids


def _harmony_vocabulary(directory: Path, tokenizer_file: Path, special: dict[str, Any]) -> Tokenizer | None:
    """gpt-oss's tokenizer.json, encoded by openai-harmony (see HarmonyVocabularyTokenizer);
    None for any other file, or without openai-harmony."""
    try:
        if not any(size == tokenizer_file.stat().st_size for size, _ in HARMONY_VOCABULARY_FILES):
            return None
        data = tokenizer_file.read_bytes()
    except OSError:
        return None
    if (len(data), hashlib.sha256(data).hexdigest()) not in HARMONY_VOCABULARY_FILES:
        return None
    from .engines.harmony import harmony_encoding  # noqa: PLC0415 -- openai-harmony, loaded only for gpt-oss's vocabulary

    try:
        harmony_encoding()  # loaded here, once, as a parsed file would be: proving processes inherit it
    except EngineError:
        return None
    # The file is known byte for byte: its added tokens are read without parsing the rest.
    text = data.decode("utf-8")
    listed, _ = json.JSONDecoder().raw_decode(text, text.index("[", text.index('"added_tokens"')))
    added = {token["content"]: token["id"] for token in listed}
    return HarmonyVocabularyTokenizer(directory, None, special, added=added)


def _load_file(tokenizer_file: Path) -> Any:
    """The file as ``tokenizers`` loads it, once per content where the content is known
    without reading it (``content_key``): an audit's repos often share their base model's
    tokenizer, and a long-lived worker proves many of them."""
    key = content_key(tokenizer_file)
    backend = _LOADED.get(key)
    if backend is None:
        try:
            from tokenizers import Tokenizer as FastTokenizer  # noqa: PLC0415 -- a lint that proves nothing never loads it
        except ImportError:
            raise TokenizerError(
                "proving with a tokenizer needs the 'tokenizers' package, a dependency of tmpl-lint: pip install tokenizers"
            ) from None
        try:
            with rust_panics_as_errors(f"{tokenizer_file}: cannot load"):
                backend = FastTokenizer.from_file(str(tokenizer_file))
        except TokenizerError:
            raise
        except Exception as error:  # tokenizers raises bare Exceptions for bad files
            raise TokenizerError(f"{tokenizer_file}: cannot load: {one_line(error)}") from None
        if len(_LOADED) >= _LOADED_KEPT:
            _LOADED.clear()
        _LOADED[key] = backend
    return backend


_LOADED: dict[str, Any] = {}
_LOADED_KEPT = 8
_BLOB_NAME = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def content_key(path: Path) -> str:
    """What names a file's content without reading it: in the Hugging Face cache a file is a
    link to a blob named by the hash of its content (sha256 for LFS files, git's sha1 for
    others), shared by every repo that has that file; elsewhere the file's own path."""
    resolved = path.resolve()
    if resolved.parent.name == "blobs" and _BLOB_NAME.fullmatch(resolved.name):
        return f"blob:{resolved.name}"
    return str(resolved)


def special_tokens_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer's special tokens as transformers hands them to the template
    (``special_tokens_map``: the named ones that are set, not the additional list)."""
    tokens: dict[str, Any] = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens


def read_tokenizer_config(directory: Path) -> dict[str, Any]:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        config = load_json(path)
    except SourceError as error:
        raise TokenizerError(f"cannot read tokenizer config: {error}") from None
    return config if isinstance(config, dict) else {}


def one_line(error: BaseException) -> str:
    """An exception's whole message on one line (transformers' span several)."""
    return " ".join(str(error).split()) or type(error).__name__


# The files transformers builds a tokenizer from (besides *.tiktoken): a folder with none
# holds no tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


@lru_cache(maxsize=16)
def load_tokenizer(directory: Path) -> Tokenizer:
    """The tokenizer in ``directory``, one that measures text (see ``measures_text``); else
    TokenizerError, one line saying why. Every command loads its tokenizers here."""
    directory = Path(directory).resolve()
    try:
        tokenizer = _load_tokenizer(directory)
    except PermissionError:  # a folder that may not be searched: its files' Path.is_file raises
        raise TokenizerError(f"{directory}: permission denied") from None
    if not isinstance(tokenizer, HarmonyVocabularyTokenizer):  # a file known byte for byte
        measures_text(tokenizer)
    return tokenizer


# Ordinary words, digits and punctuation, as any model's vocabulary holds them.
PROBE_TEXT = "The weather in Paris is sunny today, 21 degrees."


def measures_text(tokenizer: Tokenizer) -> None:
    """Raise TokenizerError unless the tokenizer turns ordinary text into tokens: it must
    encode PROBE_TEXT to at least one id that is not its unknown token. A tokenizer without
    a vocabulary fails this: a folder that holds tokenizer_config.json but not the files
    its vocabulary is in (a partial download, a clone without LFS), from which transformers
    builds a tokenizer of the config's added tokens alone, which encodes text to nothing.
    Measured in it every prompt would be the same few ids, every divergence would vanish,
    and a failing finding would pass as not reproduced."""
    try:
        ids = tokenizer.encode(PROBE_TEXT)
    except TokenizerError:
        raise
    except Exception as error:  # noqa: BLE001 - a backend that cannot encode cannot measure either
        raise TokenizerError(f"{tokenizer.directory}: the tokenizer cannot encode text: {one_line(error)}") from None
    unknown = _unknown_id(tokenizer)
    if any(token != unknown for token in ids):
        return
    encoded = "no tokens" if not ids else "its unknown token only"
    raise TokenizerError(
        f"{tokenizer.directory}: the tokenizer has no vocabulary to measure text in: it encodes {PROBE_TEXT!r} "
        f"to {encoded} ({_size(tokenizer)} tokens in all; is its tokenizer.json, vocab.json or tokenizer.model missing?)"
    )


def _unknown_id(tokenizer: Tokenizer) -> int | None:
    backend = tokenizer.backend
    if tokenizer.kind != "tokenizers":
        return getattr(backend, "unk_token_id", None)
    unknown = getattr(backend.model, "unk_token", None) or tokenizer.special_tokens.get("unk_token")
    return backend.token_to_id(unknown) if isinstance(unknown, str) else None


def _size(tokenizer: Tokenizer) -> int:
    if tokenizer.kind == "tokenizers":
        return tokenizer.backend.get_vocab_size(with_added_tokens=True)
    return len(tokenizer.backend)


def _load_tokenizer(directory: Path) -> Tokenizer:
    if not directory.is_dir():
        raise TokenizerError(f"{directory}: no such tokenizer directory")
    config = read_tokenizer_config(directory)
    special = special_tokens_from_config(config)
    tokenizer_file = directory / "tokenizer.json"
    if tokenizer_file.is_file():
        return _harmony_vocabulary(directory, tokenizer_file, special) or Tokenizer(
            directory, _load_file(tokenizer_file), special
        )
    if not any((directory / name).is_file() for name in TOKENIZER_FILES) and not any(directory.glob("*.tiktoken")):
        # transformers would say it cannot convert a slow tokenizer without sentencepiece
        raise TokenizerError(f"{directory}: no tokenizer here (no {', '.join(TOKENIZER_FILES)})")
    # transformers says on import that PyTorch is missing: true, and beside the point here.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        from transformers import AutoTokenizer  # noqa: PLC0415 -- the fallback: seconds to import, and optional
    except ImportError:
        raise TokenizerError(f"{directory}: no tokenizer.json, and transformers is not installed for the fallback") from None
    try:
        backend = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as error:
        raise TokenizerError(f"{directory}: cannot load tokenizer: {one_line(error)}") from None
    special = {key: getattr(backend, key) for key in SPECIAL_TOKEN_KEYS if isinstance(getattr(backend, key, None), str)}
    return Tokenizer(directory, backend, special, kind="transformers")


def find_tokenizer_directory(template_path: Path) -> Path | None:
    """The model directory beside a template, when it holds a tokenizer."""
    directory = template_path.parent
    if directory.name == "additional_chat_templates":
        directory = directory.parent
    if (directory / "tokenizer.json").is_file() or (directory / "tokenizer.model").is_file():
        return directory
    return None


def common_prefix_length(a, b, start: int = 0) -> int:
    """How many leading items (characters, token ids) two sequences share, given that the
    first ``start`` are known equal. Compares growing slices, so the work is done by C
    comparisons, not a Python loop: replay compares prompts of 100k tokens per request."""
    if type(a) is not type(b):  # a tuple's slice never equals a list's
        a, b = list(a), list(b)
    limit = min(len(a), len(b))
    low, step = min(start, limit), 256
    while low < limit:
        high = min(limit, low + step)
        if a[low:high] != b[low:high]:
            break
        low, step = high, step * 2
    else:
        return limit
    while high - low > 32:  # the first difference is in [low, high)
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    while low < high and a[low] == b[low]:
        low += 1
    return low


@dataclass(frozen=True)
class Encoded:
    """A prompt's text and token ids, with the places the next prompt's tokenization may
    resume from: ``anchors`` are (character offset, token index) of each atomic special
    token, ascending."""

    text: str
    ids: list[int]
    anchors: tuple[tuple[int, int], ...] = ()


# --- tokenizing a text in pieces ------------------------------------------------------
#
# ``tokenizers`` encodes a text in three steps, each on what the one before left: the added
# tokens are split out of the raw text (leftmost, the longest where several start at one
# place); each piece between them is normalized and cut into pre-tokens by the
# pre-tokenizer; the model maps each pre-token to ids alone. So a text can be cut, and each
# piece encoded alone, wherever no added token and no pre-token spans the cut. For the
# Split regexes below, a "\n" followed by a character that is not whitespace always ends a
# pre-token: no alternative matches a "\n" followed by such a character (``[\r\n]*``,
# ``[\r\n]+`` and ``\s`` runs stop there; the letter runs' optional first character is
# never a "\n"), and none looks behind. The o200k-style regexes (gpt-oss's, Mistral's
# Tekken) write ``[\r\n/]*`` after punctuation, so there a "/" continues the pre-token and
# is no cut. NFC never joins a character to a "\n" before it. Python's ``\s`` holds every
# character the regexes' ``\s`` does (and more: a cut is then only skipped).
#
# A piece of ASCII text is cut further, into the pre-tokens themselves, by the same regex
# written for ASCII (where NFC changes nothing and the classes are plain: letters A-Z and
# a-z, digits 0-9, Oniguruma's \s the six characters \t \n \v \f \r and space), and each
# pre-token's ids are kept: prose and code repeat their words, and the model maps each
# pre-token alone. A pre-token given alone to the library is one pre-token again: an
# alternative that failed on it inside the text can match it alone only by the lookahead
# ``(?!\S)`` at its end, that is whole. (A regex that cut less would still be exact, the
# library pre-tokenizing each word again; one that cut more would not: the tests show it.)
_AFTER_NEWLINE = re.compile(r"(?<=\n)(?=[^\s])")
_AFTER_NEWLINE_NO_SLASH = re.compile(r"(?<=\n)(?=[^\s/])")
_S, _L, _N = r"\t\n\x0b\x0c\r ", "A-Za-z", "0-9"
_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_SPACES = rf"[{_S}]*[\r\n]+|[{_S}]+(?![^{_S}])|[{_S}]+"
_O200K_WORDS = rf"[^\r\n{_L}{_N}]?[A-Z]*[a-z]+{{0}}|[^\r\n{_L}{_N}]?[A-Z]+[a-z]*{{0}}"


@dataclass(frozen=True)
class PieceRule:
    """Where a text may be cut (``cuts``), and its ASCII pieces' pre-tokens (``words``)."""

    cuts: re.Pattern[str]
    words: re.Pattern[str]


PIECE_RULES = {
    # Qwen2, Qwen2.5, Qwen3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": PieceRule(
        _AFTER_NEWLINE,
        re.compile(rf"{_CONTRACTIONS}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]| ?[^{_S}{_L}{_N}]+[\r\n]*|{_SPACES}", re.ASCII),
    ),
    # Llama 3, cl100k_base
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": PieceRule(
        _AFTER_NEWLINE,
        re.compile(rf"{_CONTRACTIONS}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]{{1,3}}| ?[^{_S}{_L}{_N}]+[\r\n]*|{_SPACES}", re.ASCII),
    ),
    # gpt-oss (o200k_harmony)
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+": PieceRule(
        _AFTER_NEWLINE_NO_SLASH,
        re.compile(_O200K_WORDS.format(f"{_CONTRACTIONS}?") + rf"|[{_N}]{{1,3}}| ?[^{_S}{_L}{_N}]+[\r\n/]*|{_SPACES}", re.ASCII),
    ),
    # Mistral's Tekken (Mistral Nemo)
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+": PieceRule(
        _AFTER_NEWLINE_NO_SLASH,
        re.compile(_O200K_WORDS.format("") + rf"|[{_N}]| ?[^{_S}{_L}{_N}]+[\r\n/]*|{_SPACES}", re.ASCII),
    ),
}


def piece_rule(backend: Any) -> PieceRule | None:
    """How a text may be encoded in pieces for ``backend`` (a ``tokenizers.Tokenizer``; see
    PIECE_RULES), or None: a normalizer, pre-tokenizer, added token or setting (truncation,
    padding, dropout) this was not shown for."""
    try:
        normalizer = None if backend.normalizer is None else json.loads(backend.normalizer.__getstate__())
        pre = None if backend.pre_tokenizer is None else json.loads(backend.pre_tokenizer.__getstate__())
        added = backend.get_added_tokens_decoder().values()
        if backend.truncation is not None or backend.padding is not None or getattr(backend.model, "dropout", None):
            return None
        if getattr(backend, "encode_special_tokens", False):  # special tokens encoded as text
            return None
    except Exception:  # noqa: BLE001 - a backend that does not say what it does is encoded whole
        return None
    if normalizer not in (None, {"type": "NFC"}) or not isinstance(pre, dict) or pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if split != {
        "type": "Split",
        "pattern": {"Regex": split.get("pattern", {}).get("Regex")},
        "behavior": "Isolated",
        "invert": False,
    }:
        return None
    if {key: value for key, value in byte_level.items() if key != "trim_offsets"} != {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "use_regex": False,
    }:
        return None
    # Added tokens matched on the raw text, never stretching over whitespace beside them.
    if any(token.normalized or token.lstrip or token.rstrip or token.single_word or not token.content for token in added):
        return None
    return PIECE_RULES.get(split["pattern"]["Regex"])


class Pieces:
    """Encodes a text as ``tokenizers`` does, piece by piece (see PIECE_RULES): the added
    tokens split out as ``tokenizers`` splits them, the text between them cut at the rule's
    cuts, each piece's ids kept (the most recently used, up to ``KEPT_CHARACTERS``), and an
    ASCII piece encoded pre-token by pre-token, each pre-token's ids kept (up to
    ``KEPT_WORDS``). A reply's text is then tokenized once for the reply as generated and the
    next prompt that holds it, and a word once while it is kept."""

    KEPT_CHARACTERS = 1 << 20
    KEPT_PIECES = 4096
    LONGEST_KEPT = 1 << 16
    KEPT_WORDS = 1 << 16
    LONGEST_WORD = 64

    def __init__(self, tokenizer: Tokenizer, rule: PieceRule):
        self.tokenizer = tokenizer
        self.rule = rule
        added = tokenizer.backend.get_added_tokens_decoder()
        self.added = {token.content: token_id for token_id, token in added.items()}
        self.added_ids = frozenset(self.added.values())
        # Leftmost, and the longest of those starting there: as tokenizers' matcher.
        longest_first = sorted(self.added, key=len, reverse=True)
        self.added_token = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None
        self.kept: OrderedDict[str, list[int]] = OrderedDict()
        self.characters = 0
        self.words: dict[str, list[int]] = {}
        batch = getattr(tokenizer.backend, "encode_batch_fast", None) or tokenizer.backend.encode_batch
        self._batch = functools.partial(batch, add_special_tokens=False)

    def encode(self, text: str, start: int = 0) -> tuple[list[int], list[tuple[int, int]]] | None:
        """``text[start:]``'s ids, and (offset in ``text``, index in the ids) of each added
        token among them; None where a piece between them encodes to an added token's id
        (a vocabulary that holds one as an ordinary token), which would be no anchor."""
        parts: list[str | int] = []  # pieces of text, and added tokens' ids
        added: list[int] = []  # the offsets of the added tokens in ``parts``
        position = start
        cuts = self.rule.cuts
        for match in self.added_token.finditer(text, start) if self.added_token is not None else ():
            if match.start() > position:
                parts.extend(cuts.split(text[position : match.start()]))
            parts.append(self.added[match.group()])
            added.append(match.start())
            position = match.end()
        if position < len(text):
            parts.extend(cuts.split(text[position:]))
        kept = self.kept
        missing = list(dict.fromkeys(part for part in parts if type(part) is str and part not in kept))
        found = self._encode_pieces(missing) if missing else {}
        if found is None:
            return None
        ids: list[int] = []
        anchors: list[tuple[int, int]] = []
        offsets = iter(added)
        for part in parts:
            if isinstance(part, int):
                anchors.append((next(offsets), len(ids)))
                ids.append(part)
                continue
            piece_ids = found.get(part)
            if piece_ids is None:
                piece_ids = kept[part]
                kept.move_to_end(part)
            ids.extend(piece_ids)
        for piece, piece_ids in found.items():
            self._keep(piece, piece_ids)
        return ids, anchors

    def _encode_pieces(self, pieces: list[str]) -> dict[str, list[int]] | None:
        """Each piece's ids: an ASCII piece's from its pre-tokens', a word at a time, the
        rest (and the words not kept) in one call of the library."""
        words = self.words
        split: dict[str, list[str]] = {}
        asked: dict[str, None] = {}  # the texts the library encodes, once each
        for piece in pieces:
            if piece.isascii():
                found = self.rule.words.findall(piece)
                if sum(map(len, found)) == len(piece):  # the regex leaves no character out
                    split[piece] = found
                    asked.update(dict.fromkeys(set(found).difference(words)))
                    continue
            asked[piece] = None
        encoded: dict[str, list[int]] = {}
        if asked:
            with rust_panics_as_errors(f"{self.tokenizer.directory}: the tokenizer cannot encode a text"):
                encodings = self._batch(list(asked))
            encoded = {text: encoding.ids for text, encoding in zip(asked, encodings)}
            if any(not self.added_ids.isdisjoint(ids) for ids in encoded.values()):
                return None
        # Every word of these pieces is kept while their ids are joined (each kept text's ids
        # are its whole encode's, a word's or a piece's alike); the long ones, and all once
        # there are more than KEPT_WORDS, are let go after.
        words.update(encoded)
        out = {
            piece: encoded[piece] if piece not in split else list(chain.from_iterable(map(words.__getitem__, split[piece])))
            for piece in pieces
        }
        if len(words) > self.KEPT_WORDS:
            words.clear()
        else:
            for text in encoded:
                if len(text) > self.LONGEST_WORD:
                    del words[text]
        return out

    def caches(self) -> tuple[OrderedDict[str, list[int]], int, dict[str, list[int]]]:
        """What this object keeps (pieces, their characters, words), for ``warm``: another
        process tracing more of the same log then starts with them."""
        return self.kept, self.characters, self.words

    def warm(self, caches: tuple[OrderedDict[str, list[int]], int, dict[str, list[int]]]) -> None:
        """Start from ``caches`` (``caches()`` of a Pieces of the same tokenizer and rule)."""
        self.kept, self.characters, self.words = caches

    def _keep(self, piece: str, ids: list[int]) -> None:
        if len(piece) > self.LONGEST_KEPT:
            return
        self.kept[piece] = ids
        self.characters += len(piece)
        while self.characters > self.KEPT_CHARACTERS or len(self.kept) > self.KEPT_PIECES:
            dropped, _ = self.kept.popitem(last=False)
            self.characters -= len(dropped)


class PrefixEncoder:
    """Tokenizes prompts that mostly extend an earlier one: only the text after their
    longest common prefix is tokenized again, from the last special token inside it.

    ``tokenizers`` splits the added tokens out of the text before it normalizes and
    pre-tokenizes the pieces between them, so the ids before a special token do not depend
    on the text after it. Re-tokenizing from the special token itself (not just after it)
    keeps what follows it from being treated as the start of the input (a Metaspace
    pre-tokenizer prepends "▁" to the first piece only). An added token that could match a
    longer added token, or that normalizes, lstrips, rstrips or must be a single word, is
    never used as an anchor; when the tail does not start with the anchor's id, the whole
    text is tokenized. Tests compare every result with a full tokenization on the real
    tokenizers. Where the tokenizer is one ``piece_rule`` knows, what is tokenized is
    tokenized in pieces (``Pieces``), and ``ids`` tokenizes other texts (replies) so that
    the prompts holding them reuse their pieces. Without ``tokenizers`` (transformers'
    fallback) every text is tokenized whole; without a tokenizer ids are characters."""

    def __init__(self, tokenizer: Tokenizer | None):
        self.tokenizer = tokenizer
        self.anchor_ids: frozenset[int] = frozenset()
        self.pieces: Pieces | None = None  # where texts are encoded piece by piece (``piece_rule``)
        if tokenizer is not None and tokenizer.kind == "tokenizers":
            added = tokenizer.backend.get_added_tokens_decoder()
            contents = [token.content for token in added.values()]
            self.anchor_ids = frozenset(
                token_id
                for token_id, token in added.items()
                if not (token.normalized or token.lstrip or token.rstrip or token.single_word)
                and token.content
                and not any(token.content in other and token.content != other for other in contents)
            )
            rule = piece_rule(tokenizer.backend)
            self.pieces = Pieces(tokenizer, rule) if rule is not None else None

    def encode(self, text: str, previous: Encoded | None = None) -> Encoded:
        if self.tokenizer is None:
            shared = common_prefix_length(previous.text, text) if previous is not None else 0
            ids = (previous.ids[:shared] if previous is not None and shared else []) + [ord(char) for char in text[shared:]]
            return Encoded(text, ids)
        tokenizer = self.tokenizer
        if not self.anchor_ids:
            return Encoded(text, tokenizer.encode(text))
        if previous is not None and previous.anchors:
            shared = common_prefix_length(previous.text, text)
            anchors = previous.anchors
            # The last anchor that ends inside the shared text.
            index = bisect.bisect_right(anchors, (shared, -1)) - 1
            while index >= 0 and anchors[index][0] + self._length[previous.ids[anchors[index][1]]] > shared:
                index -= 1
            if index >= 0:
                start, position = anchors[index]
                tail = self._encode_from(tokenizer, text, start, position)
                if tail.ids and tail.ids[0] == previous.ids[position]:
                    return Encoded(text, previous.ids[:position] + tail.ids, anchors[:index] + tail.anchors)
        return self._encode_from(tokenizer, text, 0, 0)

    def ids(self, text: str) -> list[int] | None:
        """``text``'s ids, encoded piece by piece (sharing pieces with the prompts encoded
        here); None where this tokenizer is not encoded in pieces."""
        if self.pieces is None or not text:
            return None if self.pieces is None else []
        encoded = self.pieces.encode(text)
        return None if encoded is None else encoded[0]

    def _encode_from(self, tokenizer: Tokenizer, text: str, start: int, position: int) -> Encoded:
        if self.pieces is not None:
            encoded = self.pieces.encode(text, start)
            if encoded is not None:
                ids, added = encoded
                anchor_ids = self.anchor_ids
                anchors = tuple((offset, position + index) for offset, index in added if ids[index] in anchor_ids)
                return Encoded(text, ids, anchors)
        with rust_panics_as_errors(f"{tokenizer.directory}: the tokenizer cannot encode a text"):
            encoding = tokenizer.backend.encode(text[start:], add_special_tokens=False)
        ids = encoding.ids
        anchor_ids = self.anchor_ids
        anchors = tuple(
            (start + offset[0], position + index)
            for index, (token, offset) in enumerate(zip(ids, encoding.offsets))
            if token in anchor_ids
        )
        return Encoded(text, ids, anchors)

    @functools.cached_property
    def _length(self) -> dict[int, int]:
        """Characters of each anchor token's text."""
        assert self.tokenizer is not None  # anchors come only with a tokenizer
        added = self.tokenizer.backend.get_added_tokens_decoder()
        return {token_id: len(added[token_id].content) for token_id in self.anchor_ids}
