"""Loading a tokenizer once per process and encoding rendered prompts as a server does.

``tokenizer.json`` loads through ``tokenizers`` (a fraction of a second, no transformers
import); a directory without one falls back to transformers' AutoTokenizer. Text is
encoded with ``add_special_tokens=False``, as vLLM encodes a rendered chat prompt: the
template itself writes the BOS token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TokenizerError(Exception):
    pass


@dataclass
class Tokenizer:
    """Encodes text to token ids; ``special_tokens`` are what the template sees as variables."""

    directory: Path
    backend: Any
    special_tokens: dict[str, Any] = field(default_factory=dict)
    kind: str = "tokenizers"

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        if self.kind == "tokenizers":
            return self.backend.encode(text, add_special_tokens=False).ids
        return list(self.backend.encode(text, add_special_tokens=False))


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
    from .sources import SourceError, load_json

    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        config = load_json(path)
    except SourceError as error:
        raise TokenizerError(f"cannot read tokenizer config: {error}") from None
    return config if isinstance(config, dict) else {}


def one_line(error: Exception) -> str:
    """An exception's whole message on one line (transformers' span several)."""
    return " ".join(str(error).split()) or type(error).__name__


@lru_cache(maxsize=16)
def load_tokenizer(directory: Path) -> Tokenizer:
    directory = Path(directory).resolve()
    if not directory.is_dir():
        raise TokenizerError(f"{directory}: no such tokenizer directory")
    config = read_tokenizer_config(directory)
    special = special_tokens_from_config(config)
    tokenizer_file = directory / "tokenizer.json"
    if tokenizer_file.is_file():
        try:
            from tokenizers import Tokenizer as FastTokenizer
        except ImportError:
            raise TokenizerError(
                "proving with a tokenizer needs the 'tokenizers' package: pip install 'tmpl-lint[prove]'"
            ) from None
        try:
            return Tokenizer(directory, FastTokenizer.from_file(str(tokenizer_file)), special)
        except Exception as error:  # tokenizers raises bare Exceptions for bad files
            raise TokenizerError(f"{tokenizer_file}: cannot load: {one_line(error)}") from None
    # transformers says on import that PyTorch is missing: true, and beside the point here.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        from transformers import AutoTokenizer
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
