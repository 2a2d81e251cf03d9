"""A GGUF model on disk: its name, its splits, the templates its metadata holds, and the
fixed templates ``--fix`` puts beside it."""

from __future__ import annotations

import re
from pathlib import Path

from ..findings import quoted_name
from ..inputs import GGUF_SUFFIX, NothingToLint, SourceError, TemplateSource
from .format import DEFAULT_NAME, GGUFError, read_metadata

SPLIT_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
COMPANION_NAME = re.compile(r"^(?P<stem>.+)\.chat_template(?:\.(?P<name>[^.]+))?\.jinja$")


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
    an error for each template entry that cannot be read (the others are still linted), and
    a warning for each that llama.cpp never reads.

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
    unread += [NothingToLint(first, ignored) for ignored in metadata.ignored_templates()]
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
