"""Findings as ruff-style text: one line per finding, its source line, its proof, and a
summary."""

from __future__ import annotations

import os
import textwrap
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from ..findings import Finding, FixSafety, Verdict
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
    *,
    full: bool = True,
    hide_info: bool = False,
    fixed: int | None = None,
    unsafe_fixes: bool = False,
) -> str:
    """ruff's text report; ``linted`` templates were read, ``unread`` inputs could not be,
    and ``unwritten`` files --fix meant to write could not be written; ``unapplied``: the
    findings are of the templates as --diff's fixes would leave them.

    ``full`` (``--output-format full``): each finding's source line, its whole proof (both
    renders, related places, the proof's notes). Otherwise concise: a finding's line and
    its proof's, wrapped to be read, and each note once. ``hide_info`` (a pre-commit run)
    counts informational findings without printing them. ``fixed``: how many findings
    --fix fixed (None: not a --fix run)."""
    out: list[str] = []

    def style(text: str, **options) -> str:
        return click.style(text, **options) if colour else text

    for note in dict.fromkeys(notes):
        if not quiet:
            out.append(style(f"note: {note}", dim=True))
    proof_notes: dict[str, None] = {}
    for finding in findings:
        if hide_info and finding.verdict(strict) is Verdict.INFO:
            continue
        colour_of = SEVERITY_COLOURS.get(finding.severity) if finding.fails(strict) else SEVERITY_COLOURS["info"]
        code = style(finding.code, fg=colour_of, bold=True)
        named = finding.template_label()
        if not full:
            # The place, code and name stay on the first line, as grep and editors read them.
            place = f"{finding.location()}: {finding.code} [{finding.name}] "
            message = f"{named}{finding.reported_message(short=True)}"
            lines = [place + message] if quiet else _wrapped(message, "    ", place)  # -q: a line per finding, for scripts
            lines[0] = (
                lines[0]
                .replace(finding.location(), style(finding.location(), bold=True), 1)
                .replace(f" {finding.code} ", f" {code} ", 1)
            )
            out.extend(lines)
            if quiet or finding.proof is None:
                continue
            out.append("    " + proof_summary(finding.proof))  # one line: its words are ours, its length bounded
            if finding.proof.note:
                proof_notes[finding.proof.note] = None
            continue
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
    if not quiet:
        out.extend(style(line, dim=True) for note in proof_notes for line in _wrapped(f"note: {note}", "      "))
    if not quiet and (linted != 0 or unread or unwritten):
        out.append(summary(findings, strict, unread, unapplied, unwritten, fixed=fixed, hidden_info=hide_info))
        fixable = fixable_line(findings, strict, unsafe_fixes, fixing=fixed is not None or unapplied)
        if fixable:
            out.append(fixable)
        by_hand = sorted({finding.code for finding in findings if finding.fails(strict) and not finding.fixable(strict)})
        if by_hand and fixed is not None:
            # What --fix left: how to get the run to pass.
            out.append(
                f"Left to fix by hand: {', '.join(by_hand)} (`tmpl-lint rule CODE` shows what to write instead; "
                "`{# tmpl-lint: ignore[CODE] #}` on its line suppresses one)."
            )
    return "\n".join(out) + ("\n" if out else "")


# Concise lines are wrapped at this width (continuation lines indented), whatever the
# terminal: a pre-commit hook's output is read on one, after the run.
WIDTH = 120


def _wrapped(text: str, indent: str, first: str = "") -> list[str]:
    """``first`` + ``text`` on lines of at most WIDTH characters where ``text`` has spaces to
    break at (a quoted render without one stays whole; ``first`` is never broken);
    continuation lines indented."""
    if len(first) + len(text) <= WIDTH:
        return [first + text]
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
        drop_whitespace=True,
    ) or [first.rstrip()]


def proof_summary(proof: Proof) -> str:
    """A proof on one line: where the next turn stops extending the prompt and what that
    costs, or why nothing was shown."""
    if proof.status is ProofStatus.NOT_PROVABLE:
        return f"proof: not provable: {proof.reason}"
    if proof.status is ProofStatus.NOT_REPRODUCED:
        return (
            f"proof: not reproduced in {len(proof.scenarios)} scenarios (unit: {proof.unit}): "
            "does not fail the run (--strict makes it fail)"
        )
    divergence = proof.divergence
    if divergence is None:
        return f"proof: proven ({proof.evidence})"
    unit, cached = divergence.unit, divergence.prompt_tokens[0]
    return (
        f'proof: calls {divergence.call + 1}->{divergence.call + 2} of "{divergence.scenario}" part at {unit} '
        f"{divergence.first_divergence}, {divergence.place}: {divergence.lost_tokens} of {cached} {unit}s recomputed"
    )


def fixable_line(findings: Sequence[Finding], strict: bool, unsafe_fixes: bool, fixing: bool) -> str | None:
    """ruff's "[*] 2 fixable with --fix (1 more with --unsafe-fixes)". After --fix (or
    --diff), a safe fix still offered is one that did not verify: only the unsafe ones left
    are counted, when --unsafe-fixes was not given."""
    counts = Counter(finding.fix.safety for finding in findings if finding.fixable(strict) and finding.fix is not None)
    safe, unsafe = counts[FixSafety.SAFE], counts[FixSafety.UNSAFE]
    if fixing:
        safe, unsafe = 0, 0 if unsafe_fixes else unsafe
    elif unsafe_fixes:
        safe, unsafe = safe + unsafe, 0
    if safe and unsafe:
        return f"[*] {safe} fixable with --fix ({unsafe} more with --unsafe-fixes)"
    if safe:
        return f"[*] {safe} fixable with --fix"
    if unsafe:
        return f"[*] {unsafe} fixable with --fix --unsafe-fixes"
    return None


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
        f"{divergence.lost_tokens} recomputed every turn; "
        f"{divergence.reusable_without_rollback} on a model that cannot roll back its state (a hybrid model reuses "
        "all of a prefix or none)" + rates,
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
    findings: Sequence[Finding],
    strict: bool = False,
    unread: int = 0,
    unapplied: bool = False,
    unwritten: int = 0,
    *,
    fixed: int | None = None,
    hidden_info: bool = False,
) -> str:
    """ "Found 4 findings (1 failing, 2 not reproduced, 1 info)."; failing findings that no
    render showed (--no-prove, not provable, --strict) are counted as unproven after a ";".
    "All checks passed!" only when every input was read (and every fix written) and nothing
    was found. ``unapplied``: the findings are of the templates as --diff's fixes would leave
    them, which are not on disk (the run fails until they are). ``fixed``: after --fix, as
    ruff says it: "Found 3 findings (1 fixed, 2 remaining: 2 failing)."; ``hidden_info``:
    the info findings were counted, not printed (a pre-commit run)."""
    failures = [
        *([f"{unread} input{'s' if unread != 1 else ''} could not be read"] if unread else []),
        *([f"{unwritten} file{'s' if unwritten != 1 else ''} could not be written"] if unwritten else []),
    ]
    failed_part = f"; {', '.join(failures)} (see the errors above)" if failures else ""
    once = " once the fixes above are applied" if unapplied else ""
    if fixed and not findings:
        noun = "finding" if fixed == 1 else "findings"
        return f"Found {fixed} {noun} ({fixed} fixed, 0 remaining){failed_part}."
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
    if hidden_info and verdicts[Verdict.INFO]:
        parts[-1] += ", not shown in a pre-commit run"
    unproven_part = f"; {unproven} of the failing unproven" if unproven else ""
    if fixed:
        total = fixed + len(findings)
        return (
            f"Found {total} {'finding' if total == 1 else 'findings'} ({fixed} fixed, {len(findings)} remaining: "
            f"{', '.join(parts)}{unproven_part}){failed_part}."
        )
    noun = "finding" if len(findings) == 1 else "findings"
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
