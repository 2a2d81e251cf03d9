"""Configuration: ``[tool.tmpl-lint]`` in pyproject.toml, or ``.tmpl-lint.yaml``; and where
tmpl-lint keeps its cache.

The nearest file from the working directory upward is used (``.tmpl-lint.yaml`` first in
a folder), or the one given with ``--config``. Command-line flags override it. An unknown
key is an error that names it, and so is a file that cannot be parsed: the one in force,
or a pyproject.toml on the way to it (which may configure tmpl-lint: it must be read to
know).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path

from .inputs import SourceError, read_bytes

# The largest block size a flag or the configuration takes (vLLM's are 16 to a few hundred).
MAX_BLOCK_SIZE = 1 << 20
# llama-server's --parallel for replay: each slot is allocated up front; no server runs more.
MAX_SLOTS = 65536
KEYS = (
    "select",
    "ignore",
    "per-file-ignores",
    "block-size",
    "frozen-date",
    "tokenizer",
    "strict",
    "tool-args-style",
    "chat-template-kwargs",
    "unsafe-fixes",
)
# How a model writes tool-call arguments (as --tool-args-style): compact {"city":"Paris"}, spaced {"city": "Paris"}.
TOOL_ARGS_STYLES = ("compact", "spaced")
YAML_NAME = ".tmpl-lint.yaml"


class ConfigError(Exception):
    pass


@dataclass
class Config:
    path: Path | None = None
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    block_size: int | None = None
    frozen_date: date | None = None
    tokenizer: Path | None = None
    strict: bool = False  # findings the proof did not reproduce fail the run too
    tool_args_style: str | None = None  # how the model writes tool-call arguments; None: compact
    # The deployment's template variables (vLLM's --default-chat-template-kwargs): the proof
    # renders every request with them and tries no other value of theirs. None: every value.
    chat_template_kwargs: dict | None = None
    unsafe_fixes: bool = False  # --fix applies the fixes that change what the model sees too

    def layered(self, block_size: int | None, tokenizer: Path | None) -> tuple[int, Path | None]:
        """The block size and tokenizer of a run: the flags', else this file's, else vLLM's
        16 and none (every command layers them so)."""
        return block_size or self.block_size or 16, tokenizer or self.tokenizer


def cache_directory() -> Path:
    """tmpl-lint's cache: $TMPL_LINT_CACHE_DIR, else tmpl-lint in $XDG_CACHE_HOME (~/.cache)."""
    if os.environ.get("TMPL_LINT_CACHE_DIR"):
        return Path(os.environ["TMPL_LINT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "tmpl-lint"


def find_config(start: Path) -> Path | None:
    """The configuration in force: the nearest ``.tmpl-lint.yaml``, or ``pyproject.toml``
    with a ``[tool.tmpl-lint]`` table, from ``start`` upward. As ruff, every pyproject.toml
    met on the way is read to know whether it configures tmpl-lint, so one that cannot be
    read is a ConfigError, whichever tool it is for."""
    for directory in [start, *start.parents]:
        if (directory / YAML_NAME).is_file():
            return directory / YAML_NAME
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file() and _pyproject_table(pyproject) is not None:
            return pyproject
    return None


# A configuration is a few hundred bytes; a pyproject.toml a few kilobytes.
MAX_CONFIG_BYTES = 1024 * 1024


def _read_bytes(path: Path) -> bytes:
    """A configuration file's bytes: a regular file, read no further than MAX_CONFIG_BYTES
    (a FIFO named with --config waited for a writer forever; /dev/zero was read without end)."""
    try:
        return read_bytes(path, MAX_CONFIG_BYTES, "a configuration")[0]
    except SourceError as error:
        raise ConfigError(f"{path}: cannot read: {error.message}") from None


def _pyproject_table(path: Path) -> dict | None:
    """The ``[tool.tmpl-lint]`` table of a pyproject.toml, or None when it has none."""
    import tomllib  # noqa: PLC0415 -- only where a pyproject.toml is met (not --help, nor a run outside a project)

    data = _read_bytes(path)
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: not valid UTF-8 (byte {error.start})") from None
    except tomllib.TOMLDecodeError as error:  # its message ends "(at line L, column C)"
        raise ConfigError(f"{path}: invalid TOML: {error}") from None
    tools = document.get("tool", {})
    if not isinstance(tools, dict):
        raise ConfigError(f"{path}: invalid pyproject.toml: tool must be a table, not {_toml_type(tools)}")
    table = tools.get("tmpl-lint")
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.tmpl-lint] must be a table, not {_toml_type(table)}")
    return table


def _toml_type(value: object) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a float", list: "an array", dict: "a table"}
    return names.get(type(value), "empty (null)" if value is None else "a date or time")


def _read(path: Path) -> dict:
    if path.suffix == ".toml":
        table = _pyproject_table(path)
        if table is None:
            raise ConfigError(f"{path}: no [tool.tmpl-lint] table")
        return table
    try:
        text = _read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: cannot read: {error}") from None
    try:
        from ruamel.yaml import YAML, YAMLError  # noqa: PLC0415 -- an extra (fix), 15 ms: only for a YAML configuration
    except ImportError:
        raise ConfigError(f"{path}: reading YAML configuration needs ruamel.yaml: pip install 'tmpl-lint[fix]'") from None
    try:
        document = YAML(typ="safe").load(text)
    except YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {_yaml_problem(error)}") from None
    except ValueError as error:  # a scalar YAML reads as a date that is none (2026-13-01)
        raise ConfigError(f"{path}: invalid YAML: {error}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    return document


def _yaml_problem(error: Exception) -> str:
    """The problem and where, as TOML's errors say it: a marked error's first line is only
    its context ("while constructing a mapping" for a duplicate key)."""
    problem, mark = getattr(error, "problem", None), getattr(error, "problem_mark", None)
    if not problem:
        return str(error).splitlines()[0]
    where = f" (at line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{problem}{where}"


def _did_you_mean(key: object) -> str:
    """ ": did you mean 'block-size'?" for a key close to a known one (a typo, or block_size
    written with the underscore of Python's names), else the known keys."""
    close = difflib.get_close_matches(str(key).replace("_", "-").lower(), KEYS, n=1, cutoff=0.6)
    return f": did you mean {close[0]!r}?" if close else f" (known: {', '.join(KEYS)})"


def _codes(path: Path, key: str, value) -> list[str]:
    """A list of codes; a string is a wrong type (as ruff says), not a comma-separated list:
    a list is what the README shows, and there is one way to write it."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        kind = "a list of other values" if isinstance(value, list) else _toml_type(value)
        raise ConfigError(f'{path}: {key} must be a list of codes, such as ["PC001"], not {kind}')
    return [item.strip() for item in value]  # an empty one is refused with the selection's words


def load_config(path: Path) -> Config:
    table = _read(path)
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}{_did_you_mean(unknown[0])}")
    config = Config(path=path)
    if "select" in table:
        config.select = _codes(path, "select", table["select"])
    if "ignore" in table:
        config.ignore = _codes(path, "ignore", table["ignore"])
    if "per-file-ignores" in table:
        mapping = table["per-file-ignores"]
        if not isinstance(mapping, dict):
            raise ConfigError(f"{path}: per-file-ignores must map file patterns to codes")
        config.per_file_ignores = {
            str(pattern): _codes(path, f"per-file-ignores.{pattern}", codes) for pattern, codes in mapping.items()
        }
    if "block-size" in table:
        size = table["block-size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"{path}: block-size must be a positive integer")
        if size > MAX_BLOCK_SIZE:  # as --block-size refuses it
            raise ConfigError(f"{path}: block-size {size} is over {MAX_BLOCK_SIZE}, the largest --block-size takes")
        config.block_size = size
    if "frozen-date" in table:
        value = table["frozen-date"]
        if isinstance(value, datetime):  # TOML's 2026-01-01T10:00:00: a moment, not a date
            raise ConfigError(f"{path}: frozen-date must be YYYY-MM-DD, not {value.isoformat()!r}")
        if isinstance(value, date):
            config.frozen_date = value
        elif not isinstance(value, str):
            raise ConfigError(f"{path}: frozen-date must be YYYY-MM-DD, not {value!r}")
        else:
            try:
                config.frozen_date = date.fromisoformat(str(value))
            except ValueError:
                raise ConfigError(f"{path}: frozen-date must be YYYY-MM-DD, not {value!r}") from None
    if "tokenizer" in table:
        if not isinstance(table["tokenizer"], str):
            raise ConfigError(f"{path}: tokenizer must be a directory path")
        config.tokenizer = (path.parent / table["tokenizer"]).resolve()
    if "strict" in table:
        if not isinstance(table["strict"], bool):
            raise ConfigError(f"{path}: strict must be true or false")
        config.strict = table["strict"]
    if "unsafe-fixes" in table:
        if not isinstance(table["unsafe-fixes"], bool):
            raise ConfigError(f"{path}: unsafe-fixes must be true or false")
        config.unsafe_fixes = table["unsafe-fixes"]
    if "tool-args-style" in table:
        style = table["tool-args-style"]
        if style not in TOOL_ARGS_STYLES or not isinstance(style, str):
            raise ConfigError(f'{path}: tool-args-style must be "compact" or "spaced", not {style!r}')
        config.tool_args_style = style
    if "chat-template-kwargs" in table:
        kwargs = table["chat-template-kwargs"]
        if not isinstance(kwargs, dict) or not all(isinstance(name, str) for name in kwargs):
            raise ConfigError(f"{path}: chat-template-kwargs must map template variables to values, not {_toml_type(kwargs)}")
        config.chat_template_kwargs = dict(kwargs)
    return config
