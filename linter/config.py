"""Configuration: ``[tool.tmpl-lint]`` in pyproject.toml, or ``.tmpl-lint.yaml``; and where
tmpl-lint keeps its cache.

The nearest file from the working directory upward is used (``.tmpl-lint.yaml`` first in
a folder), or the one given with ``--config``. Command-line flags override it. An unknown
key is an error that names it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

KEYS = ("select", "ignore", "per-file-ignores", "block-size", "frozen-date", "tokenizer", "strict")
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


def cache_directory() -> Path:
    """tmpl-lint's cache: $TMPL_LINT_CACHE_DIR, else tmpl-lint in $XDG_CACHE_HOME (~/.cache)."""
    if os.environ.get("TMPL_LINT_CACHE_DIR"):
        return Path(os.environ["TMPL_LINT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "tmpl-lint"


def find_config(start: Path) -> Path | None:
    for directory in [start, *start.parents]:
        if (directory / YAML_NAME).is_file():
            return directory / YAML_NAME
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file():
            try:
                text = pyproject.read_text(encoding="utf-8")
                # Most projects' pyproject.toml never names us: no need to parse it.
                if "tmpl-lint" in text and "tmpl-lint" in _toml(text).get("tool", {}):
                    return pyproject
            except (ValueError, UnicodeDecodeError, OSError):  # TOMLDecodeError is a ValueError
                continue
    return None


def _toml(text: str) -> dict:
    import tomllib  # only where a config is read: most runs read none

    return tomllib.loads(text)


def _read(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read: {error}") from None
    if path.suffix == ".toml":
        try:
            table = _toml(text).get("tool", {}).get("tmpl-lint")
        except ValueError as error:  # TOMLDecodeError
            raise ConfigError(f"{path}: invalid TOML: {error}") from None
        if table is None:
            raise ConfigError(f"{path}: no [tool.tmpl-lint] table")
        return table
    try:
        from ruamel.yaml import YAML, YAMLError
    except ImportError:
        raise ConfigError(f"{path}: reading YAML configuration needs ruamel.yaml: pip install 'tmpl-lint[fix]'") from None
    try:
        document = YAML(typ="safe").load(text)
    except YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {str(error).splitlines()[0]}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    return document


def _codes(path: Path, key: str, value) -> list[str]:
    if isinstance(value, str):
        value = [part for part in value.split(",")]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{path}: {key} must be a list of codes")
    return [item.strip() for item in value if item.strip()]


def load_config(path: Path) -> Config:
    table = _read(path)
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
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
        config.block_size = size
    if "frozen-date" in table:
        value = table["frozen-date"]
        if isinstance(value, date):
            config.frozen_date = value
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
    return config
