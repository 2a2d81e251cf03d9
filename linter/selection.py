"""Which findings a run reports: codes selected and ignored, per-file ignores, suppression
comments in the template, and how the model writes tool-call arguments (which decides
whether re-serialising them changes anything). One ``Selection`` decides for check, ``--fix``,
``--diff`` and ``audit`` alike (``lint_with_facts`` applies it).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .analysis.locations import SourceMap


class SelectionError(ValueError):
    pass


@dataclass(frozen=True)
class Selection:
    """Which codes run, by prefix, the most specific prefix winning (as in ruff)."""

    select: tuple[str, ...] = ("PC",)
    ignore: tuple[str, ...] = ()
    # (file pattern, codes) pairs, patterns matched relative to ``root`` (the config's folder).
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    root: Path | None = None
    # The command line's --ignore over a configuration's selection, a later layer as in ruff:
    # a code it names is off however specifically the configuration selects it.
    also_ignore: tuple[str, ...] = ()
    # How the model writes tool-call arguments (--tool-args-style, the tool-args-style key):
    # "compact" or "spaced"; None where the run does not say. It decides which `tojson` of
    # arguments replays what the model wrote (PC004), in the static lint as in the proofs.
    tool_args_style: str | None = None

    @classmethod
    def parse(
        cls,
        select: Iterable[str] | None,
        ignore: Iterable[str] | None,
        per_file_ignores: dict[str, list[str]] | None = None,
        root: Path | None = None,
        also_ignore: Iterable[str] | None = None,
    ) -> Selection:
        per_file_codes = [code for codes in (per_file_ignores or {}).values() for code in codes]
        for value in (*(select or ()), *(ignore or ()), *(also_ignore or ()), *per_file_codes):
            # `--select ""` (a script's empty variable) or `PC001,` selected every rule, as no
            # --select does; ruff refuses an empty selector.
            if not all(part.strip() for part in value.split(",")):
                raise SelectionError(
                    f"empty rule code or prefix in {value!r}: name codes such as PC001 or prefixes such as PC00, separated by commas"
                )
        chosen = tuple(_codes(select)) or ("PC",)
        ignored = tuple(_codes(ignore))
        later = tuple(_codes(also_ignore))
        per_file = tuple((pattern, tuple(_codes(codes))) for pattern, codes in (per_file_ignores or {}).items())
        for prefix in chosen + ignored + later + tuple(code for _, codes in per_file for code in codes):
            _check_known(prefix)
        chosen = tuple("PC" if prefix == "ALL" else prefix for prefix in chosen)
        return cls(chosen, ignored, per_file, root, tuple("PC" if prefix == "ALL" else prefix for prefix in later))

    def includes(self, code: str) -> bool:
        if any(code.startswith(prefix) for prefix in self.also_ignore):
            return False
        best_select = max((len(p) for p in self.select if code.startswith(p)), default=-1)
        best_ignore = max((len(p) for p in self.ignore if code.startswith(p)), default=-1)
        return best_select > best_ignore

    def checks_any(self, prefix: str) -> bool:
        """Whether a rule whose code starts with ``prefix`` (or any rule, for ALL) runs."""
        from .rules import RULES

        return any(self.includes(rule.RULE.code) for rule in RULES if prefix == "ALL" or rule.RULE.code.startswith(prefix))

    def runs_every_code_on(self, path: Path | str) -> bool:
        """Whether every code runs on ``path``: all selected, none ignored there. The folder
        the config was found in (``root``) does not select anything, so it is not compared."""
        here = self.for_path(path)
        return (here.select, here.ignore, here.also_ignore) == (Selection().select, (), ())

    def for_path(self, path: Path | str) -> Selection:
        """This selection with the per-file ignores that match ``path`` added to ``ignore``."""
        if not self.per_file_ignores:
            return self
        candidate = Path(path)
        try:
            relative = candidate.resolve().relative_to(self.root.resolve()).as_posix() if self.root else candidate.as_posix()
        except ValueError:
            relative = candidate.as_posix()
        extra = [
            code
            for pattern, codes in self.per_file_ignores
            if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(candidate.name, pattern)
            for code in codes
        ]
        return replace(self, ignore=self.ignore + tuple(extra), per_file_ignores=(), root=None)


def _codes(values: Iterable[str] | None):
    for value in values or ():
        for part in value.split(","):
            if part.strip():
                yield part.strip().upper()


def _check_known(prefix: str) -> None:
    if not _known(prefix):
        raise SelectionError(f"unknown rule code or prefix: {prefix}")


def _known(prefix: str) -> bool:
    from .rules import RULES

    return prefix == "ALL" or any(rule.RULE.code.startswith(prefix) for rule in RULES)


# Inside a Jinja comment: `{# tmpl-lint: ignore[PC001, PC004] #}` or `{# tmpl-lint: ignore-file #}`.
SUPPRESSION = re.compile(r"\s*tmpl-lint:\s*(ignore-file|ignore)(?:\[([A-Za-z0-9,\s]*)\])?\s*$")


@dataclass
class Suppression:
    line: int
    column: int
    codes: tuple[str, ...]  # empty: every code
    whole_file: bool
    used: bool = field(default=False, compare=False)
    # The codes it names that suppressed a finding: one naming several may use some only.
    used_codes: set[str] = field(default_factory=set, compare=False)

    def covers(self, code: str, line: int) -> bool:
        return (self.whole_file or self.line == line) and (not self.codes or any(code.startswith(c) for c in self.codes))

    def suppress(self, code: str) -> None:
        """Record that it suppressed a finding of ``code``."""
        self.used = True
        self.used_codes.update(c for c in self.codes if code.startswith(c))

    def unused_codes(self, silencer: str, selection: Selection) -> tuple[str, ...]:
        """The rule codes it names that suppressed nothing, as ruff names a noqa's unused
        codes one by one: all of them where it suppressed nothing at all. In one that is used,
        ``silencer`` (PC900's code) is kept on purpose, not unused. A code the run does not
        check (``selection``) is not judged: this run cannot tell whether it would suppress
        something (the pre-commit hooks' own ``--ignore PC103`` made a suppression of PC103
        that the plain check needs fail the hook)."""
        judged = [code for code in self.codes if _known(code) and selection.checks_any(code)]
        if not self.used:
            return tuple(judged)
        return tuple(code for code in judged if code not in self.used_codes and code != silencer)

    def idle(self, silencer: str, selection: Selection) -> bool:
        """Whether it suppresses nothing that this run checks."""
        if not self.codes:
            return not self.used
        return bool(self.unused_codes(silencer, selection))

    @property
    def unknown(self) -> tuple[str, ...]:
        """The codes it names that no rule has (a typo: `PC04`), which suppress nothing even
        where the others do, as ruff says of a noqa."""
        return tuple(code for code in self.codes if not _known(code))

    def describe(self, unused: tuple[str, ...]) -> str:
        """Why it is reported: the codes it names that no rule has, and ``unused``, the rule
        codes that suppress nothing."""
        where = "this template" if self.whole_file else "this line"
        if self.unknown:
            named = ", ".join(self.unknown)
            said = f"the suppression names {named}, which {'is' if len(self.unknown) == 1 else 'are'} no rule code"
            return (
                f"{said}, and {', '.join(unused)} suppresses nothing on {where}" if unused else f"{said}: it suppresses nothing"
            )
        what = ", ".join(unused) or "all codes"
        return f"the suppression of {what} suppresses nothing on {where}"


def suppressions(source_map: SourceMap) -> list[Suppression]:
    """The suppression comments of a template, from the lexer's comment tokens: text that
    only looks like one inside a string literal suppresses nothing."""
    if "tmpl-lint" not in source_map.text:  # most templates: no need to lex for positions
        return []
    found = []
    opening = None
    for token in source_map.tokens:
        if token.kind == "comment_begin":
            opening = token
        elif token.kind == "comment" and opening is not None:
            match = SUPPRESSION.match(token.value.rstrip("-"))
            if match:
                codes = tuple(_codes([match.group(2) or ""]))
                column = source_map.column_of_offset(opening.offset)
                found.append(Suppression(opening.line, column, codes, match.group(1) == "ignore-file"))
            opening = None
    return found
