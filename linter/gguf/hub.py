"""GGUF repos on the Hugging Face Hub: their chat templates, read without downloading a model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import cache_directory
from ..inputs import GGUF_SUFFIX, TemplateSource
from .format import DEFAULT_NAME, MAX_METADATA_BYTES, GGUFError, Metadata, Truncated, parse
from .models import is_later_split
from .tokenizer import special_tokens, tokenizer_in

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
    from huggingface_hub import HfApi  # noqa: PLC0415 -- an extra (audit), 0.3 s: only for the Hub

    info = HfApi().model_info(repo, revision=revision, expand=["gguf", "siblings"])
    names = sorted(sibling.rfilename for sibling in info.siblings or () if sibling.rfilename.endswith(GGUF_SUFFIX))
    # vision projectors (mmproj) carry no template
    models = [name for name in names if not is_later_split(Path(name)) and "mmproj" not in Path(name).name.lower()]
    if not models:
        return HubTemplates([])
    summary = info.gguf if isinstance(info.gguf, dict) else {}
    text = summary.get("chat_template")
    if isinstance(text, str) and text.strip() and not tokens:
        bos_eos = tuple((key, summary[key]) for key in ("bos_token", "eos_token") if isinstance(summary.get(key), str))
        # the summary does not say which of the repo's files it describes
        return HubTemplates([TemplateSource(Path(repo) / "gguf", DEFAULT_NAME, text, "gguf", special_tokens=bos_eos)])
    data, metadata = read_hub_metadata(repo, models[0], revision)
    pairs = metadata.templates()
    unread = [f"{models[0]}: {problem}" for problem in metadata.template_problems() + metadata.ignored_templates()]
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
    from huggingface_hub import HfFileSystem  # noqa: PLC0415 -- an extra (audit), 0.3 s: only for the Hub

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
