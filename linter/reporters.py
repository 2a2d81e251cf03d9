"""Writing findings out: ruff-style text and JSON."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

import click

from .findings import Finding

SEVERITY_COLOURS = {"error": "red", "warning": "yellow", "info": "cyan"}
MAX_SHOWN_LINE = 120


def text_report(findings: Sequence[Finding], notes: Sequence[str], colour: bool, quiet: bool = False) -> str:
    out: list[str] = []

    def style(text: str, **options) -> str:
        return click.style(text, **options) if colour else text

    for note in notes:
        if not quiet:
            out.append(style(f"note: {note}", dim=True))
    for finding in findings:
        code = style(finding.code, fg=SEVERITY_COLOURS.get(finding.severity), bold=True)
        out.append(f"{style(finding.location(), bold=True)}: {code} [{finding.name}] {finding.full_message()}")
        if quiet or not finding.source_line:
            continue
        shown, caret = _excerpt(finding.source_line, finding.column)
        gutter = f"{finding.line:>5} | "
        out.append(gutter + shown)
        out.append(" " * (len(gutter) - 2) + "| " + " " * caret + style("^", fg="red", bold=True))
        if finding.proof:
            out.extend("      " + line for line in proof_lines(finding.proof))
    if not quiet:
        out.append(summary(findings))
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


def proof_lines(proof: dict) -> list[str]:
    """The proof under a finding: where the next turn stops matching, and both renders there."""
    status = proof.get("status")
    unit = proof.get("unit", "token")
    if status == "not-provable":
        return [f"proof: not provable: {proof.get('reason')}"]
    if status != "proven":
        return [f"proof: not reproduced ({proof.get('scenarios', 0)} scenarios rendered, unit: {unit})"]
    if "first_divergence" not in proof:
        return [f"proof: proven ({proof.get('scenario')})"]
    first = proof["first_divergence"]
    block = proof["block_size"]
    cached, following = proof["prompt_tokens"]
    check = "prompt N vs N+1" if proof["check"] == "a" else "prompt N + generated reply vs N+1"
    pair = proof["pair"]
    units = f"{unit}s"
    lines = [
        f"proof: proven in \"{proof['scenario']}\", calls {pair[0] + 1}->{pair[1] + 1} ({check}): "
        f"first divergence at {unit} {first} (char {proof['first_divergence_char']}), message {proof['message_index']} "
        f"({proof['role']}, {proof['field']}), cause {proof['cause']}",
        f"       {proof['reusable_tokens']} of {cached} {units} reusable in {block}-{unit} blocks, "
        f"{proof['lost_tokens']} recomputed every turn; without rollback (hybrid models) "
        f"{proof['reusable_tokens_without_rollback']} reusable"
        + (f"; scenario hit rate {proof['hit_rate']:.1%} (ideal {proof['ideal_hit_rate']:.1%})" if "hit_rate" in proof else ""),
    ]
    before, after = proof["renders"]["before"], proof["renders"]["after"]
    common = _escaped(before[: _common_prefix(before, after)])
    lines.append(f"  N   | {_escaped(before)}")
    lines.append(f"  N+1 | {_escaped(after)}")
    lines.append(f"      | {' ' * len(common)}^ {unit} {first}; its block starts at {unit} {first // block * block}")
    return lines


def _common_prefix(a: str, b: str) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


def _escaped(text: str) -> str:
    """One line: control characters written as escapes, everything else as it is."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def summary(findings: Sequence[Finding]) -> str:
    if not findings:
        return "All checks passed!"
    counts = Counter(finding.severity for finding in findings)
    parts = [f"{counts[severity]} {severity}{'s' if counts[severity] != 1 else ''}" for severity in ("error", "warning", "info") if counts[severity]]
    noun = "finding" if len(findings) == 1 else "findings"
    return f"Found {len(findings)} {noun} ({', '.join(parts)})."


def statistics_report(findings: Sequence[Finding]) -> str:
    counts = Counter((finding.code, finding.name) for finding in findings)
    return "".join(f"{count:>5}\t{code}\t[{name}]\n" for (code, name), count in sorted(counts.items()))


def json_report(findings: Sequence[Finding]) -> str:
    return json.dumps([finding.to_json() for finding in findings], indent=2, ensure_ascii=False) + "\n"
