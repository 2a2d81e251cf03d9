"""Findings as ruff-style text: one line per finding, its source line, its proof, and a
summary."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from ..findings import Finding, Verdict
from ..proofs import Divergence, Proof, ProofStatus

if TYPE_CHECKING:
    pass

SEVERITY_COLOURS = {"error": "red", "warning": "yellow", "info": "cyan"}
MAX_SHOWN_LINE = 120


def text_report(
    findings: Sequence[Finding],
    notes: Sequence[str],
    colour: bool,
    quiet: bool = False,
    strict: bool = False,
    linted: int | None = None,
    unread: int = 0,
    unapplied: bool = False,
    unwritten: int = 0,
) -> str:
    """ruff's text report; ``linted`` templates were read, ``unread`` inputs could not be,
    and ``unwritten`` files --fix meant to write could not be written; ``unapplied``: the
    findings are of the templates as --diff's fixes would leave them."""
    out: list[str] = []

    def style(text: str, **options) -> str:
        return click.style(text, **options) if colour else text

    for note in notes:
        if not quiet:
            out.append(style(f"note: {note}", dim=True))
    for finding in findings:
        colour_of = SEVERITY_COLOURS.get(finding.severity) if finding.fails(strict) else SEVERITY_COLOURS["info"]
        code = style(finding.code, fg=colour_of, bold=True)
        named = finding.template_label()
        out.append(f"{style(finding.location(), bold=True)}: {code} [{finding.name}] {named}{finding.reported_message()}")
        if quiet or not finding.source_line:
            continue
        shown, caret = _excerpt(finding.source_line, finding.column)
        # A template inside another file is shown by its own lines, and says so.
        in_file = finding.file_line is None or (finding.file_line, finding.file_column) == (finding.line, finding.column)
        gutter = f"{finding.line:>5} | " if in_file else f"template line {finding.line} | "
        out.append(gutter + shown)
        out.append(" " * (len(gutter) - 2) + "| " + " " * caret + style("^", fg="red", bold=True))
        if finding.proof:
            out.extend("      " + line for line in proof_lines(finding.proof))
        for other in finding.related_findings:
            out.append(
                f"      related: {':'.join(map(str, file_position(other)))}: {other.code} [{other.name}] shows the same divergence: "
                f"{other.message}"
            )
    if not quiet and (linted != 0 or unread or unwritten):
        out.append(summary(findings, strict, unread, unapplied, unwritten))
    return "\n".join(out) + ("\n" if out else "")


def _excerpt(line: str, column: int) -> tuple[str, int]:
    """The source line, cut to a window around the column, and the caret's offset in it."""
    line = line.replace("\t", " ")
    start = 0
    if len(line) > MAX_SHOWN_LINE:
        start = max(0, min(column - 1 - MAX_SHOWN_LINE // 3, len(line) - MAX_SHOWN_LINE))
        shown = line[start : start + MAX_SHOWN_LINE]
        shown = ("…" if start else "") + shown + ("…" if start + MAX_SHOWN_LINE < len(line) else "")
        return shown, column - 1 - start + (1 if start else 0)
    return line, column - 1


def proof_lines(proof: Proof) -> list[str]:
    """The proof under a finding: where the next turn stops matching, and both renders there."""
    lines = _proof_lines(proof)
    if proof.note:
        lines.append(f"       note: {proof.note}")
    return lines


def _proof_lines(proof: Proof) -> list[str]:
    unit = proof.unit
    if proof.status is ProofStatus.NOT_PROVABLE:
        return [f"proof: not provable: {proof.reason}"]
    if proof.status is ProofStatus.NOT_REPRODUCED:
        lines = [
            f"proof: not reproduced in {len(proof.scenarios)} scenarios (unit: {unit}), so it does not fail the run "
            "(--strict makes it fail); tried: " + ", ".join(f'"{name}"' for name in proof.scenarios)
        ]
        by_error: dict[str, list[str]] = {}
        for scenario, error in proof.unrendered:
            by_error.setdefault(error, []).append(scenario)
        for error, scenarios in by_error.items():
            named = ", ".join(f'"{name}"' for name in scenarios)
            lines.append(
                f"       not tried: {named}: the template cannot render {'it' if len(scenarios) == 1 else 'them'}: {error}"
            )
        return lines
    divergence = proof.divergence
    if divergence is None:
        return [f"proof: proven ({proof.evidence})"]
    return divergence_lines(divergence, proof)


def divergence_lines(divergence: Divergence, proof: Proof | None = None) -> list[str]:
    """Where two prompts part, what it costs, and both renders there."""
    unit, first, block = divergence.unit, divergence.first_divergence, divergence.block_size
    cached, _ = divergence.prompt_tokens
    check = {
        "a": "prompt N vs N+1",
        "b": "prompt N + generated reply vs N+1",
        "c": "the tool call as the model wrote it vs its render in N+1",
        "d": "prompt N + the reply as rendered while newest vs N+1",
    }.get(divergence.check, divergence.check)
    rates = (
        f"; scenario hit rate {proof.hit_rate:.1%} (ideal {proof.ideal_hit_rate:.1%})"
        if proof is not None and proof.hit_rate is not None
        else ""
    )
    lines = [
        f'proof: proven in "{divergence.scenario}", calls {divergence.call + 1}->{divergence.call + 2} ({check}): '
        f"first divergence at {unit} {first}"
        + (f" (char {divergence.first_divergence_char})" if unit != "char" else "")
        + f", {divergence.place}, cause {divergence.cause}",
        f"       {divergence.reusable_tokens} of {cached} {unit}s reusable in {block}-{unit} blocks, "
        f"{divergence.lost_tokens} recomputed every turn; without rollback (hybrid models) "
        f"{divergence.reusable_without_rollback} reusable" + rates,
    ]
    before, after = divergence.before, divergence.after
    common = _escaped(os.path.commonprefix([before, after]))
    lines.append(f"  N   | {_escaped(before)}")
    lines.append(f"  N+1 | {_escaped(after)}")
    assert first is not None, "only prompts that part are shown"
    lines.append(f"      | {' ' * len(common)}^ {unit} {first}; its block starts at {unit} {first // block * block}")
    return lines


def _escaped(text: str) -> str:
    """One line: control characters written as escapes, everything else as it is."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def summary(
    findings: Sequence[Finding], strict: bool = False, unread: int = 0, unapplied: bool = False, unwritten: int = 0
) -> str:
    """ "Found 4 findings (1 failing, 2 not reproduced, 1 info)."; failing findings that no
    render showed (--no-prove, not provable, --strict) are counted as unproven after a ";".
    "All checks passed!" only when every input was read (and every fix written) and nothing
    was found. ``unapplied``: the findings are of the templates as --diff's fixes would leave
    them, which are not on disk (the run fails until they are)."""
    failures = [
        *([f"{unread} input{'s' if unread != 1 else ''} could not be read"] if unread else []),
        *([f"{unwritten} file{'s' if unwritten != 1 else ''} could not be written"] if unwritten else []),
    ]
    failed_part = f"; {', '.join(failures)} (see the errors above)" if failures else ""
    once = " once the fixes above are applied" if unapplied else ""
    if not findings:
        if failures:
            return f"No findings{once}{failed_part}."
        return f"All checks pass{once}." if unapplied else "All checks passed!"
    verdicts = Counter(finding.verdict(strict) for finding in findings)
    unproven = sum(1 for finding in findings if finding.fails(strict) and finding.unproven)
    parts = [f"{verdicts[Verdict.FAILS]} {VERDICT_WORDS[Verdict.FAILS]}"]
    parts += [
        f"{verdicts[verdict]} {VERDICT_WORDS[verdict]}" for verdict in (Verdict.UNPROVEN, Verdict.INFO) if verdicts[verdict]
    ]
    noun = "finding" if len(findings) == 1 else "findings"
    unproven_part = f"; {unproven} of the failing unproven" if unproven else ""
    return f"Found {len(findings)} {noun}{once} ({', '.join(parts)}{unproven_part}){failed_part}."


# What the summary calls the findings of each verdict; --statistics says the same.
VERDICT_WORDS = {Verdict.FAILS: "failing", Verdict.UNPROVEN: "not reproduced", Verdict.INFO: "info"}


def level(finding: Finding, strict: bool = False) -> str:
    """The severity a report shows: the rule's, or "info" for a finding that does not fail."""
    return finding.severity if finding.fails(strict) else "info"


def file_position(finding: Finding) -> tuple[int, int]:
    """Where the finding is in the file on disk; the file's start where the template has
    no place in it as text (a GGUF's metadata)."""
    if finding.file_line is not None and finding.file_column is not None:
        return finding.file_line, finding.file_column
    return 1, 1
