"""Putting fixes back into the files that hold the templates: every template of a file
fixed, the file rewritten once (through writes.py), or the unified diff printed instead."""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import writes
from ..containers import ContainerError, replace_in_container
from ..findings import quoted_name
from ..inputs import SourceError, TemplateSource
from ..isolation import IsolationError, interrupted, parallel_map, run_isolated
from ..selection import Selection
from ..sources import reread
from ..stopping import Terminated
from ..writes import WriteError
from .apply import TemplateFix, fix_template
from .options import FixOptions
from .verify import Verdicts


@dataclass
class FileFix:
    """One file's fixes and what became of them."""

    path: Path
    fixes: list[TemplateFix] = field(default_factory=list)
    original: str = ""  # the file's text as read for the fix
    updated: str = ""  # with the fixed templates put back: what --fix writes, --diff shows
    written: bool = False
    error: SourceError | WriteError | None = None
    made: bool = False  # the file was read again and its fixes made (before any error writing it)

    @property
    def changed(self) -> bool:
        return self.error is None and self.updated != self.original


def fix_isolated(
    source: TemplateSource, options: FixOptions, selection: Selection = Selection(), recalled: tuple[Verdicts, ...] = ()
) -> TemplateFix:
    """``fix_template`` in a limited child process, as check proves in one (the patched
    templates are parsed, compiled and rendered there)."""
    try:
        return run_isolated(fix_template, (source, options, selection, recalled))
    except IsolationError as error:
        if interrupted():  # killed by Ctrl-C or SIGTERM, not by a limit: its file is not written
            raise
        return TemplateFix(source, source.text, refusal=f"fixing this template stopped: {error}")


def fix_files(
    sources: list[TemplateSource], options: FixOptions, selection: Selection, write: bool, advance=None, jobs: int = 1
) -> list[FileFix]:
    """Fix the templates of each file; with ``write``, write each changed file; call
    ``advance`` as each file is done. Files are fixed ``jobs`` at a time."""
    by_path: dict[Path, list[TemplateSource]] = {}
    for source in sources:
        by_path.setdefault(source.path, []).append(source)

    finished: dict[Path, FileFix] = {}

    def fix_chain(paths: list[Path]) -> None:
        # What verifying each template text answered, by text: a template in several files
        # (copies of a model's config) is proven once, not once a file.
        recalled: dict[str, list[Verdicts]] = {}
        for path in paths:
            if interrupted():  # another chain was interrupted: no file more is fixed
                raise KeyboardInterrupt
            finished[path] = _fix_file(path, by_path[path], options, selection, write, recalled)
            if advance is not None:
                advance()

    try:
        parallel_map(fix_chain, _chains(by_path), jobs)
    except FixesInterrupted as stopped:  # from _fix_file: the signal landed as its file was put in place
        finished.update((fixed.path, fixed) for fixed in stopped.done)
        raise FixesInterrupted([finished[path] for path in by_path if path in finished], stopped.stop) from None
    except (KeyboardInterrupt, Terminated) as stop:
        raise FixesInterrupted([finished[path] for path in by_path if path in finished], stop) from None
    return [finished[path] for path in by_path]


class FixesInterrupted(BaseException):
    """Ctrl-C or SIGTERM during ``fix_files``: ``done`` are the files it had fixed (and
    written) by then, which the run still names before it raises ``stop`` again (the
    KeyboardInterrupt or Terminated) and says "interrupted" or "terminated"."""

    def __init__(self, done: list[FileFix], stop: KeyboardInterrupt | Terminated):
        super().__init__()
        self.done = done
        self.stop = stop


def _chains(by_path: dict[Path, list[TemplateSource]]) -> list[list[Path]]:
    """The files in chains fixed one after another, in their order: files that share a
    template text are in one chain (its verification is then recalled, not repeated), and
    chains go at once."""
    order = {path: index for index, path in enumerate(by_path)}
    chain_of_text: dict[str, int] = {}
    # A chain merged into another is emptied: None.
    chains: list[list[Path] | None] = []
    for path, found in by_path.items():
        joined = sorted({chain_of_text[source.text] for source in found if source.text in chain_of_text})
        if joined:
            number = joined[0]
            merged = chains[number]
            assert merged is not None, "chain_of_text names chains not merged away"
            for other in joined[1:]:  # this file ties chains together: they become one
                absorbed = chains[other]
                assert absorbed is not None, "chain_of_text names chains not merged away"
                merged = sorted(merged + absorbed, key=order.__getitem__)
                chains[other] = None
                chain_of_text.update({text: number for text, owner in chain_of_text.items() if owner == other})
            merged.append(path)
            chains[number] = merged
        else:
            number = len(chains)
            chains.append([path])
        chain_of_text.update({source.text: number for source in found})
    return [chain for chain in chains if chain is not None]


def fix_recalling(
    source: TemplateSource, options: FixOptions, selection: Selection, recalled: dict[str, list[Verdicts]]
) -> TemplateFix:
    """``fix_isolated``, recalling what verifying the same text answered before in this run
    (``recalled``, by text), and adding what it answered."""
    fix = fix_isolated(source, options, selection, tuple(recalled.get(source.text, ())))
    if fix.verdicts is not None:
        known = recalled.setdefault(source.text, [])
        known[:] = [verdicts for verdicts in known if verdicts.key != fix.verdicts.key] + [fix.verdicts]
    return fix


def _fix_file(
    path: Path,
    found: list[TemplateSource],
    options: FixOptions,
    selection: Selection,
    write: bool,
    recalled: dict[str, list[Verdicts]],
) -> FileFix:
    result = FileFix(path, [TemplateFix(source, source.text) for source in found])
    try:
        # Read, fix and write under the file's lock: another tmpl-lint fixing this file
        # waits, then reads what this one wrote.
        with writes.locked(path) if write else contextlib.nullcontext():
            snapshot = writes.read(path)
            result.original = result.updated = snapshot.text
            result.fixes = [fix_recalling(source, options, selection, recalled) for source in reread(found, snapshot.text)]
            result.made = True
            result.updated = put_back(snapshot.text, result.fixes)
            if write and result.updated != snapshot.text:
                if interrupted():  # a signal came while another file was being fixed: nothing more is written
                    raise KeyboardInterrupt
                try:
                    writes.replace(snapshot, result.updated)
                except (KeyboardInterrupt, Terminated) as stop:
                    # Held while the new bytes were put in place, a signal takes effect as
                    # that ends: the file is then written, and named with the others.
                    result.written = _rewritten(snapshot)
                    raise FixesInterrupted([result] if result.written else [], stop) from None
                result.written = True
    except (SourceError, WriteError) as error:
        result.error = error
    return result


def _rewritten(snapshot: writes.Snapshot) -> bool:
    """Whether the file no longer holds the bytes it was fixed from (its lock is held: what
    changed them is this run's write)."""
    try:
        return snapshot.target.read_bytes() != snapshot.data
    except OSError:
        return False


def put_back(text: str, fixes: list[TemplateFix]) -> str:
    """``text`` (a file's) with each changed template in place. A template that cannot be
    put back without changing more of the file is refused, and the others still go in."""
    # Last first: a Python literal that gains lines would move the line its followers are named by.
    for fix in reversed(fixes):
        if not fix.changed:
            continue
        if fix.source.container == "jinja":
            text = fix.patched
            continue
        try:
            text = replace_in_container(text, fix.source.name, fix.patched, fix.source.container)
        except ContainerError as error:
            fix.refusal = str(error)
    return text


def unified_diff(path: Path, before: str | None, after: str) -> str:
    """The change to a file as a patch applied from the working directory: ``a/`` and ``b/``
    then the path relative to it, as git writes names (``git apply`` and ``patch -p1`` take
    it). A file outside the working directory is named through ``..``, which ``git apply
    --unsafe-paths`` takes (ruff's absolute name and git diff --no-index's ``a/tmp/...``
    apply from no directory but the root, and GNU patch takes no name leading out of its
    directory). ``before`` None: the file does not exist yet (``--- /dev/null``). A file
    named through a symbolic link is named as the file the link leads to, which is what
    ``--fix`` writes (git apply would patch the link itself, and GNU patch refuses a link)."""

    def quoted(name: str) -> str:
        # As git writes a name, so that git apply and GNU patch read the same one back
        # (quoted_name); then a tab when it holds a space, where patch would otherwise end
        # the name.
        name = quoted_name(name)
        return name + ("\t" if " " in name else "")

    name = Path(os.path.relpath(os.path.abspath(path) if before is None else os.path.realpath(path))).as_posix()
    # Lines end at \n only, as patch reads them (str.splitlines also splits at \x0c, \u2028...).
    hunks = list(difflib.unified_diff(_lines(before or ""), _lines(after)))[2:]
    if not hunks:
        return ""
    old = "/dev/null" if before is None else quoted(f"a/{name}")
    lines = [f"--- {old}\n", f"+++ {quoted(f'b/{name}')}\n", *hunks]
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _lines(text: str) -> list[str]:
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)
