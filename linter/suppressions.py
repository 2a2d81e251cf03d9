"""Suppression comments in a template: ``{# tmpl-lint: ignore[PC001, PC004] #}`` on a
line, ``{# tmpl-lint: ignore-file #}`` anywhere; found from the lexer's comment tokens, and
what each one suppressed in a run. Which codes a run checks is the ``Selection``'s (the
rules' registry is above this module: rules read suppressions too)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .analysis.locations import SourceMap

if TYPE_CHECKING:
    from .selection import Selection


def codes_in(values: Iterable[str] | None):
    """The codes of comma-separated lists, upper-cased: ``["pc001, PC004"]`` is PC001, PC004."""
    for value in values or ():
        for part in value.split(","):
            if part.strip():
                yield part.strip().upper()


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
        judged = [code for code in self.codes if selection.knows(code) and selection.checks_any(code)]
        if not self.used:
            return tuple(judged)
        return tuple(code for code in judged if code not in self.used_codes and code != silencer)

    def idle(self, silencer: str, selection: Selection) -> bool:
        """Whether it suppresses nothing that this run checks."""
        if not self.codes:
            return not self.used
        return bool(self.unused_codes(silencer, selection))

    def unknown_codes(self, selection: Selection) -> tuple[str, ...]:
        """The codes it names that no rule has (a typo: `PC04`), which suppress nothing even
        where the others do, as ruff says of a noqa."""
        return tuple(code for code in self.codes if not selection.knows(code))


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
                codes = tuple(codes_in([match.group(2) or ""]))
                column = source_map.column_of_offset(opening.offset)
                found.append(Suppression(opening.line, column, codes, match.group(1) == "ignore-file"))
            opening = None
    return found
