"""Finding the chat templates in the paths a user names.

Accepted inputs, as transformers reads them: ``tokenizer_config.json`` (``chat_template``
a string or a list of ``{"name", "template"}``), ``chat_template.jinja``,
``additional_chat_templates/*.jinja``, ``chat_template.json`` (``{"chat_template": ...}``),
any ``*.jinja`` / ``*.j2`` file (named on the command line, ``*.jinja2``, ``*.tmpl`` and a
file without an extension too: a file of another kind is skipped with a warning), a model directory (transformers' precedence: a
``chat_template.jinja`` file overrides ``chat_template.json``, which overrides the
tokenizer config's entry), GGUF models (``*.gguf``: the templates in their metadata, see
gguf.py), and any directory, walked recursively.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .inputs import GGUF_SUFFIX, NothingToLint, SourceError, TemplateSource, load_json, parse_json, read_text

TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_JINJA = "chat_template.jinja"
CHAT_TEMPLATE_JSON = "chat_template.json"
ADDITIONAL_TEMPLATES_DIR = "additional_chat_templates"
TEMPLATE_SUFFIXES = (".jinja", ".j2")
MODEL_DIR_MARKERS = (CHAT_TEMPLATE_JINJA, CHAT_TEMPLATE_JSON, TOKENIZER_CONFIG)


# The templates read from one input, and the parts of it that could not be read.
Found = tuple[list[TemplateSource], list[SourceError]]


def collect(paths: list[Path], any_file_is_a_template: bool = False) -> tuple[list[TemplateSource], list[SourceError]]:
    """Every template under ``paths``, in a stable order, and the files that failed.
    ``any_file_is_a_template``: a named file of any extension is read as a template (``diff
    --template FILE`` says it is one); else only the extensions a template has."""
    sources: list[TemplateSource] = []
    errors: list[SourceError] = []
    for path in paths:
        try:
            if path.is_dir():
                _collect_directory(path, sources, errors)
            elif path.exists():
                _extend(sources, errors, read_file(path, any_file_is_a_template))
            elif path.is_symlink():
                raise SourceError(path, _broken_link(path))
            else:
                raise SourceError(path, "no such file or directory")
        except SourceError as error:
            errors.append(error)
        except OSError as error:  # a folder that may be listed but not searched: Path.is_file raises
            errors.append(SourceError(Path(error.filename or path), _reason(error)))
    return _once_each(sources), _each_error_once(errors)


def _extend(sources: list[TemplateSource], errors: list[SourceError], found: Found) -> None:
    sources.extend(found[0])
    errors.extend(found[1])


def _once_each(sources: list[TemplateSource]) -> list[TemplateSource]:
    """Each template once, where it was first found: a file named twice, through a link, or
    beside the folder holding it (or the tokenizer config that loads it), is linted and
    fixed once."""
    return _first_of_each(sources, lambda source: (_identity(source.path), source.name))


def _each_error_once(errors: list[SourceError]) -> list[SourceError]:
    """Each error once: a file named twice, through a link, or with its folder, is one
    input that could not be read, as it is one template linted."""
    return _first_of_each(errors, lambda error: (_identity(error.path), error.message))


def _first_of_each(items: list, key: Callable) -> list:
    seen: set = set()
    kept = []
    for item in items:
        if key(item) not in seen:
            seen.add(key(item))
            kept.append(item)
    return kept


def _identity(path: Path) -> object:
    """Which file ``path`` is: its device and inode, so that two hard links to one file
    (two names, no link between them) are one; where it cannot be looked at, its real path."""
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return _real(path)
    return (status.st_dev, status.st_ino)


def _real(path: Path) -> Path:
    """The file ``path`` names, through links; as written where the links loop."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a loop: Python 3.11 raises RuntimeError, 3.13 OSError
        return Path(os.path.abspath(path))


def _reason(error: OSError) -> str:
    """An operating-system error as the other input errors say it."""
    return "permission denied" if isinstance(error, PermissionError) else error.strerror or str(error)


def _broken_link(path: Path) -> str:
    """Why a symbolic link leads nowhere: a loop (as a walk says it), or a missing target."""
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python 3.11 says a loop so; 3.13 raises OSError(ELOOP)
        return "Too many levels of symbolic links"
    except OSError as error:
        if error.errno == errno.ELOOP and error.strerror is not None:
            return error.strerror
    return "broken symbolic link"


def _collect_directory(root: Path, sources: list[TemplateSource], errors: list[SourceError]) -> None:
    def on_error(error: OSError) -> None:
        errors.append(SourceError(Path(error.filename or root), _reason(error)))

    # os.walk does not follow symbolic links to directories, so a link loop cannot trap it.
    for directory, subdirs, files in os.walk(root, onerror=on_error):
        subdirs.sort()
        here = Path(directory)
        try:
            model_directory = is_model_directory(here)
        except OSError as error:  # listed, but its files cannot be reached: one error for the folder
            errors.append(SourceError(here, _reason(error)))
            subdirs.clear()
            continue
        if model_directory:
            try:
                _extend(sources, errors, read_model_directory(here))
            except SourceError as error:
                errors.append(error)
            if ADDITIONAL_TEMPLATES_DIR in subdirs:
                subdirs.remove(ADDITIONAL_TEMPLATES_DIR)
            claimed = set(MODEL_DIR_MARKERS)
        else:
            claimed = set()
        for name in sorted(files):
            if name.endswith(GGUF_SUFFIX):
                _collect_gguf(here / name, sources, errors)
                continue
            if name in claimed or not name.endswith(TEMPLATE_SUFFIXES) or _beside_its_model(here / name):
                continue
            try:
                _extend(sources, errors, read_file(here / name))
            except SourceError as error:
                errors.append(error)


def _beside_its_model(path: Path) -> bool:
    """A fixed template --fix wrote beside a GGUF: read with the model, in place of the
    template in its metadata."""
    from .gguf.models import gguf_beside  # noqa: PLC0415 -- the GGUF reader: only beside a .gguf

    return path.name.endswith(".jinja") and gguf_beside(path) is not None


def _collect_gguf(path: Path, sources: list[TemplateSource], errors: list[SourceError]) -> None:
    from .gguf.models import is_later_split, read_templates  # noqa: PLC0415 -- the GGUF reader: only for a .gguf

    if is_later_split(path):
        return  # its metadata, templates included, is read from the first split
    try:
        _extend(sources, errors, read_templates(path, required=False))
    except SourceError as error:
        errors.append(error)


def is_model_directory(path: Path) -> bool:
    # A marker that is a broken link (a cache snapshot whose download was cut short) makes one
    # too: its error line is said (read_model_directory), not passed over.
    return any((path / marker).is_file() or (path / marker).is_symlink() for marker in MODEL_DIR_MARKERS)


def read_model_directory(path: Path) -> Found:
    """The templates transformers would load from a model directory, the default first, and
    the files among them that cannot be read: one unreadable extra template (an empty draft in
    ``additional_chat_templates``) is its own error, and hides none of the others."""
    candidates = [
        path / CHAT_TEMPLATE_JINJA,
        path / CHAT_TEMPLATE_JSON,
        path / TOKENIZER_CONFIG,
    ]
    present = [candidate for candidate in candidates if candidate.is_file()]
    # A link to nowhere is an error line; transformers, finding no file there, loads the next
    # one, which is linted as the one in force.
    broken = [
        SourceError(candidate, _broken_link(candidate))
        for candidate in candidates
        if candidate.is_symlink() and not candidate.exists()
    ]
    if broken and not present:
        return [], broken
    in_force: list[TemplateSource] = []
    unread: list[SourceError] = []
    shadowed: list[str] = []
    for candidate in present:
        if not in_force and not unread:
            try:
                in_force = _read_optional(candidate)
            except SourceError as error:
                # The file in force cannot be read, as transformers would fail to load it: the
                # ones it overrides are not in force, and are not linted in its place.
                unread.append(error)
            continue
        try:
            if in_force and _read_optional(candidate):
                shadowed.append(candidate.name)
        except SourceError:
            pass  # a file that is not in force cannot break the lint of the one that is
    if not in_force and not unread and not (path / ADDITIONAL_TEMPLATES_DIR).is_dir():
        if present == [path / TOKENIZER_CONFIG]:
            return [], []  # a base model: nothing to lint, and a walk passes it over
        names = ", ".join(candidate.name for candidate in present)
        raise SourceError(path, f"no chat template in {names}")
    if shadowed:
        note = f"{in_force[0].path.name} is in force; it overrides the template in {', '.join(shadowed)}"
        in_force = [_with_note(source, note) for source in in_force]
    additional: list[TemplateSource] = []
    for file in sorted((path / ADDITIONAL_TEMPLATES_DIR).glob("*.jinja")):
        try:
            additional.append(_read_jinja(file, name=file.stem))
        except SourceError as error:
            unread.append(error)
    return in_force + additional, broken + unread


def _with_note(source: TemplateSource, note: str) -> TemplateSource:
    return TemplateSource(source.path, source.name, source.text, source.container, note)


def _read_optional(path: Path) -> list[TemplateSource]:
    """Templates in a model directory's file; a JSON file without one is not an error there."""
    if path.suffix == ".json":
        return _read_json(path, required=False)
    return [_read_jinja(path)]


EMBEDDING_SUFFIXES = (".py", ".yaml", ".yml")
# Named on the command line, these are templates too (a walk reads TEMPLATE_SUFFIXES only).
# "" is a file without an extension, read as ruff reads one as Python: its user named it.
NAMED_TEMPLATE_SUFFIXES = (*TEMPLATE_SUFFIXES, ".jinja2", ".tmpl", "")


def read_file(path: Path, any_file_is_a_template: bool = False) -> Found:
    """The templates a named file holds, and the parts of it that cannot be read (a model
    directory's unreadable extra template, a GGUF's template that is not a string); raises
    SourceError when the file itself cannot be read as a template."""
    if path.suffix == GGUF_SUFFIX:
        from .gguf.models import read_templates  # noqa: PLC0415 -- the GGUF reader: only for a .gguf

        return read_templates(path)
    if path.suffix == ".json":
        found = _read_json(path, required=True)
        if not found and template_file_beside(path):
            # Named as the tokenizer (`tmpl-lint tokenizer_config.json`), a config that keeps its
            # template in a file beside it is linted as transformers loads it: that file's.
            in_directory, unread = read_model_directory(path.parent)
            loaded = [source for source in in_directory if source.path.parent == path.parent]
            if not loaded:  # the file in force is unread: its error line says so
                return in_directory, unread
            note = f"{path.name} holds no chat template: transformers loads {loaded[0].path.name} beside it"
            return [_with_note(source, note) if source in loaded else source for source in in_directory], unread
        # Named on its own (pre-commit names each file a commit touches), a file another
        # beside it overrides is linted, and the note says which one transformers reads.
        precedence = [CHAT_TEMPLATE_JINJA, CHAT_TEMPLATE_JSON, TOKENIZER_CONFIG]
        if path.name in precedence[1:]:
            above = [name for name in precedence[: precedence.index(path.name)] if (path.parent / name).is_file()]
            if above:
                note = f"{above[0]} is in force; it overrides the template in {path.name}"
                found = [_with_note(source, note) for source in found]
        return found, []
    if path.suffix in EMBEDDING_SUFFIXES:
        return _read_embedded(path), []
    if any_file_is_a_template or path.suffix.lower() in NAMED_TEMPLATE_SUFFIXES:
        return [_read_jinja(path)], []
    # Plain text is a valid Jinja template, and would "pass".
    raise NothingToLint(path, f"not a chat template: tmpl-lint does not read {path.suffix} files (name a template .jinja)")


def _read_embedded(path: Path, text: str | None = None) -> list[TemplateSource]:
    """Templates assigned to chat_template in Python source or YAML (given explicitly)."""
    from .containers import ContainerError, read_container  # noqa: PLC0415 -- 15 ms: only for Python or YAML

    text = read_text(path) if text is None else text
    try:
        found, passed_over = read_container(path, text)
    except ContainerError as error:
        raise SourceError(path, str(error)) from None
    except ImportError as error:
        raise SourceError(path, f"reading templates from this file needs {error.name}: pip install 'tmpl-lint[fix]'") from None
    if not found:
        raise SourceError(path, "no string assigned to chat_template")
    container = "python" if path.suffix == ".py" else "yaml"
    sources = [TemplateSource(path, name, template, container) for name, template in found]
    if passed_over:  # said once, with the file's first template
        sources[0] = _with_note(sources[0], f"{path.name}: passed over: {'; '.join(passed_over)}")
    return sources


def _read_jinja(path: Path, name: str | None = None, text: str | None = None) -> TemplateSource:
    text = read_text(path) if text is None else text
    if not text.strip():
        raise SourceError(path, "empty chat template")
    return TemplateSource(path, name, text, "jinja")


def _read_json(path: Path, required: bool, text: str | None = None) -> list[TemplateSource]:
    document = load_json(path) if text is None else parse_json(path, text)
    if not isinstance(document, dict):
        raise SourceError(path, "expected a JSON object with a chat_template key")
    if "chat_template" not in document or document["chat_template"] is None:
        # A tokenizer config whose model keeps its template in a file beside it (gpt-oss:
        # chat_template.jinja) holds none, as transformers reads it: nothing to lint here.
        if required and not template_file_beside(path):
            if path.name == TOKENIZER_CONFIG:
                raise NothingToLint(path, "no chat_template key: nothing to lint (a base model holds no chat template)")
            raise SourceError(path, "no chat_template key")
        return []
    return [TemplateSource(path, name, text, "json") for name, text in named_templates(path, document["chat_template"])]


def reread(previous: list[TemplateSource], text: str) -> list[TemplateSource]:
    """The templates of one file as ``text`` (the file read again) now holds them; the
    names and note of ``previous`` (that file's templates as first read) carry over."""
    first = previous[0]
    if first.container == "jinja":
        found = [_read_jinja(first.path, first.name, text)]
    elif first.container == "json":
        found = _read_json(first.path, True, text)
    else:
        found = _read_embedded(first.path, text)
    return [replace(source, note=first.note) for source in found]


def template_file_beside(path: Path) -> bool:
    """``path`` is a tokenizer config beside the chat_template.jinja or .json that
    transformers reads instead of it."""
    return path.name == TOKENIZER_CONFIG and any(
        (path.parent / name).is_file() for name in (CHAT_TEMPLATE_JINJA, CHAT_TEMPLATE_JSON)
    )


def named_templates(path: Path, value: object) -> list[tuple[str | None, str]]:
    """``chat_template`` as (name, text) pairs: one unnamed string or a list of named ones."""
    if isinstance(value, str):
        if not value.strip():
            raise SourceError(path, "empty chat template")
        return [(None, value)]
    if not isinstance(value, list):
        raise SourceError(path, f"chat_template is a {_json_type(value)}, expected a string or a list of named templates")
    pairs: list[tuple[str | None, str]] = []
    seen: set[str] = set()
    for index, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise SourceError(path, f"chat_template[{index}] is a {_json_type(entry)}, expected an object")
        name, text = entry.get("name"), entry.get("template")
        if not isinstance(name, str) or not name:
            raise SourceError(path, f"chat_template[{index}] has no name")
        if name in seen:
            raise SourceError(path, f"chat_template names {name!r} twice")
        if not isinstance(text, str):
            raise SourceError(path, f"chat_template {name!r} is a {_json_type(text)}, expected a string")
        if not text.strip():
            raise SourceError(path, f"chat_template {name!r} is empty")
        seen.add(name)
        pairs.append((name, text))
    if not pairs:
        raise SourceError(path, "chat_template is an empty list")
    return pairs


def _json_type(value: object) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def model_type_beside(path: Path) -> str | None:
    """The ``model_type`` of the config.json in the model directory holding ``path`` (what
    vLLM reads to choose how to render), or None when there is none to read."""
    directory = path if path.is_dir() else path.parent
    if directory.name == "additional_chat_templates":
        directory = directory.parent
    try:
        config = json.loads(read_text(directory / "config.json"))
    except (SourceError, ValueError, RecursionError):
        return None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return model_type if isinstance(model_type, str) else None
