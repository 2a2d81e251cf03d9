r"""## What it does
Reports a suppression comment that suppresses nothing: `{# tmpl-lint: ignore[PC004] #}` on
a line with no PC004 finding, or `{# tmpl-lint: ignore-file[PC001] #}` in a template with
no PC001 finding; a code in one that suppresses nothing while its other codes do
(`ignore[PC003, PC001]` on a line with a PC003 finding and none of PC001: PC001 is named, as
ruff names a noqa's unused codes); and a code in one that no rule has (`ignore[PC04]`, a
typo), even where its other codes suppress something. In a template that does not parse the
rules do not see it all, so only a code no rule has is reported; a code the run does not
check (`--select`, `--ignore`, the configuration) is not judged either: the pre-commit hooks
run `--ignore PC103`, and the `ignore[PC103]` the plain check needs must not fail them. As
ruff's `noqa: RUF100`,
a suppression naming PC900 on the line (or `ignore-file[PC900]`) silences it: one kept on
purpose, for a finding that comes and goes with a switch, say.

## Why is this bad?
A stale suppression hides the next real finding of that code on its line, and tells the
reader that a problem exists where there is none.

## Example
```jinja
{%- for message in messages %}
    {{- message.content }}  {# tmpl-lint: ignore[PC004] #}
{%- endfor %}
```

## Use instead
```jinja
{%- for message in messages %}
    {{- message.content }}
{%- endfor %}
```

## Fix safety
No automatic fix: remove the comment by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from tmpl_lint.analysis.facts import Site
from tmpl_lint.findings import Finding, Message, Outcome

from ._contract import RuleInfo, Severity

# Produced by the checker after suppressions apply (tmpl_lint.checker.apply_suppressions).
RULE = RuleInfo(
    "PC900",
    "unused-suppression",
    Severity.WARNING,
    "a suppression comment suppresses nothing",
    reports=Outcome.UNUSED_SUPPRESSION,
)


@dataclass(frozen=True)
class UnusedSuppression(Message):
    unused: tuple[str, ...]  # the rule codes it names that suppress nothing (none: all codes)
    unknown: tuple[str, ...]  # the codes it names that no rule has
    whole_file: bool  # an ignore-file

    def __str__(self) -> str:
        where = "this template" if self.whole_file else "this line"
        if self.unknown:
            named = ", ".join(self.unknown)
            said = f"the suppression names {named}, which {'is' if len(self.unknown) == 1 else 'are'} no rule code"
            if self.unused:
                return f"{said}, and {', '.join(self.unused)} suppresses nothing on {where}"
            return f"{said}: it suppresses nothing"
        what = ", ".join(self.unused) or "all codes"
        return f"the suppression of {what} suppresses nothing on {where}"


def unused(site: Site, codes: tuple[str, ...], unknown: tuple[str, ...], whole_file: bool) -> Finding:
    """The finding for a suppression that suppresses nothing (``codes``), or names codes no
    rule has (``unknown``)."""
    return RULE.at(site, UnusedSuppression(codes, unknown, whole_file))
