"""A GGUF model on disk: its name, its splits, the templates its metadata holds, and the
fixed templates ``--fix`` puts beside it."""

from __future__ import annotations

import re
from pathlib import Path

from ..findings import quoted_name
from ..inputs import GGUF_SUFFIX, NothingToLint, SourceError, TemplateSource, read_text
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
    sources: list[TemplateSource] = []
    for name, text in pairs:
        companion = _companion(first, name)
        if companion is None:
            sources.append(TemplateSource(first, name, text, "gguf"))
            continue
        # The fixed template --fix wrote beside the model is what llama-server serves (with
        # --chat-template-file): it is the one checked, and fixed again if need be.
        try:
            sources.append(TemplateSource(companion, None, read_text(companion), "jinja", companion_note(first, name)))
        except SourceError as error:
            unread.append(error)
    return sources, unread


def _companion(model: Path, name: str) -> Path | None:
    """The fixed template of ``name`` beside ``model``, when there is one."""
    try:
        companion = companion_path(model, name)
        return companion if companion.is_file() else None
    except OSError:
        return None


def metadata_template(source: TemplateSource) -> TemplateSource | None:
    """The template in a model's metadata that ``source``, a fixed template beside the
    model, is checked instead of; None for any other source."""
    if source.container != "jinja" or (model := gguf_beside(source.path)) is None:
        return None
    match = COMPANION_NAME.match(source.path.name)
    name = (match.group("name") if match else None) or DEFAULT_NAME
    try:
        text = dict(read_metadata(model).templates()).get(name)
    except GGUFError:
        return None
    return TemplateSource(model, name, text, "gguf") if text is not None else None


def companion_note(model: Path, name: str | None) -> str:
    """Said of a fixed template beside its model, checked instead of the one in the model's
    metadata (which --fix never rewrites); a template of no name is the default one, as for
    ``companion_path``."""
    companion = quoted_name(companion_path(model, name).name)
    name = name or DEFAULT_NAME
    if name == DEFAULT_NAME:
        served = "llama-server serves it with --chat-template-file (and then no template of the model's metadata)"
    else:
        served = f"llama.cpp reads the {name} template only from the model's metadata: --fix --gguf-copy writes a model that carries it"
    return f"{companion} is checked instead of the {name} template in {quoted_name(model.name)}'s metadata: {served}"


def diff_note(model: Path, name: str | None) -> str:
    """Said of a template of ``model`` whose fix --diff would write beside it."""
    companion = quoted_name(companion_path(model, name).name)
    return f"the patch writes its fix to {companion} beside the model, which the next check reads instead of the model's metadata"


def model_for(source: TemplateSource) -> Path | None:
    """The local GGUF whose metadata a template came from, or was fixed out of."""
    if source.container == "gguf":
        return source.path if source.path.is_file() else None
    if source.container == "jinja":
        return gguf_beside(source.path)
    return None
