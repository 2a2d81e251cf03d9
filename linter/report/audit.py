"""``tmpl-lint audit``'s report: one row per template (or per repo without one), as a table
on a terminal, JSON, JSON lines, Markdown, or a self-contained HTML page with a chart."""

from __future__ import annotations

import html
import json
import os
import sys
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from ..audit import Audit


def rows(audit: Audit) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for repo in audit.repos:
        if repo.error or not repo.templates:  # a row of its own, before the templates it has
            out.append(
                {
                    "repo": repo.repo,
                    "revision": repo.revision,
                    "template": None,
                    "codes": [],
                    "error": repo.error,
                    # a base model holds none: said on its row, and it fails nothing
                    "warning": repo.warning or (None if repo.error else "no chat template"),
                    "first_divergence": None,
                    "hit_rate": None,
                    "ideal_hit_rate": None,
                    "hit_rate_note": None,
                    "hit_rate_opt_in": None,
                    "findings": [],
                }
            )
        for name, key in repo.templates:
            analysis = audit.analyses[key]
            proof, by_default = analysis.worst_proof()
            out.append(
                {
                    "repo": repo.repo,
                    "revision": repo.revision,
                    "template": name,
                    "codes": analysis.codes,
                    "error": None,
                    "warning": repo.warning,
                    "first_divergence": proof["first_divergence"] if proof else None,
                    "unit": proof["unit"] if proof else None,
                    "hit_rate": proof.get("hit_rate") if proof else None,
                    "ideal_hit_rate": proof.get("ideal_hit_rate") if proof else None,
                    "hit_rate_note": _no_hit_rate(proof),
                    # where only a caller's opt-in meets the divergence: the scenario that shows it
                    "hit_rate_opt_in": None if by_default or proof is None else proof["scenario"],
                    "findings": analysis.findings,
                }
            )
    return out


def _no_hit_rate(proof: dict[str, Any] | None) -> str | None:
    """Why a template with a proven divergence has no projected hit rate: its proof's
    scenario replays one tool call's arguments (PC004's), not a session of requests whose
    hits vLLM would count. None when there is a rate, or no proven divergence to rate."""
    if proof is None or proof.get("hit_rate") is not None:
        return None
    if proof.get("check") == "c":
        return "n/a: proven on a tool call, not a session"
    return f"n/a: {proof.get('scenario')!r} is not a session of requests"


def cells(row: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """One report row as text: repo, template, findings, first divergence, hit rate."""
    # As --statistics and the summary say them: a code none of whose findings fails the run
    # is marked "(not reproduced)" or "(info)", or both.
    said: dict[str, set[str]] = {}
    for finding in row.get("findings", ()):
        said.setdefault(finding["code"], set()).add(_verdict_word(finding))
    codes = ", ".join(_marked(code, said.get(code, {"info"})) for code in row["codes"])
    if row["error"]:
        findings = f"error: {row['error']}"
    elif row["template"] is None:
        findings = row["warning"] or "no chat template"
    else:
        findings = codes or "clean"
    divergence = "" if row["first_divergence"] is None else f"{row['unit']} {row['first_divergence']}"
    if row["hit_rate"] is not None:
        rate = f"{row['hit_rate']:.1%} (ideal {row['ideal_hit_rate']:.1%})"
        if row.get("hit_rate_opt_in"):
            rate += f" only in {row['hit_rate_opt_in']!r}"
    else:
        rate = row["hit_rate_note"] or ""
    return row["repo"], row["template"] or "", findings, divergence, rate


def _verdict_word(finding: dict[str, Any]) -> str:
    """A finding's verdict (as JSON) in the summary's words."""
    if finding.get("fails"):
        return "failing"
    return "info" if finding.get("severity") == "info" else "not reproduced"


def _marked(code: str, words: set[str]) -> str:
    if "failing" in words:
        return code
    return f"{code} ({', '.join(word for word in ('not reproduced', 'info') if word in words)})"


def markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| repo | template | findings | first divergence | projected hit rate |", "| --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in table]
    return "\n".join(lines) + "\n"


def html_page(table: list[dict[str, Any]]) -> str:
    """One self-contained page: the table and an inline SVG chart of hit rate per model."""
    body = ["<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells(row)) + "</tr>" for row in table]
    # What a default deployment gets: a figure only a caller's opt-in meets is not ranked.
    charted = [row for row in table if row["hit_rate"] is not None and not row.get("hit_rate_opt_in")]
    bar_height, width = 18, 640
    bars = []
    for index, row in enumerate(charted):
        y = index * (bar_height + 4)
        label = html.escape(f"{row['repo']}{':' + row['template'] if row['template'] else ''}")
        bars.append(
            f'<text x="0" y="{y + 13}" font-size="11">{label}</text>'
            f'<rect x="260" y="{y}" width="{row["ideal_hit_rate"] * (width - 300):.1f}" height="{bar_height}" fill="#ddd"/>'
            f'<rect x="260" y="{y}" width="{row["hit_rate"] * (width - 300):.1f}" height="{bar_height}" fill="#3a7"/>'
            f'<text x="{262 + row["hit_rate"] * (width - 300):.1f}" y="{y + 13}" font-size="11">{row["hit_rate"]:.0%}</text>'
        )
    chart = f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{max(1, len(charted)) * (bar_height + 4)}">{"".join(bars)}</svg>'
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>tmpl-lint audit</title>'
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}</style>"
        "</head><body><h1>tmpl-lint audit</h1>"
        "<h2>Projected prefix-cache hit rate per model (green; grey: clean-extension ideal)</h2>"
        f'{chart}<h2>Templates</h2><table id="audit"><thead><tr><th>repo</th><th>template</th><th>findings</th>'
        f"<th>first divergence</th><th>projected hit rate</th></tr></thead><tbody>{''.join(body)}</tbody></table></body></html>\n"
    )


def print_audit(result: Audit, table: list[dict[str, Any]], output_format: str) -> None:
    """The report on standard output: ``table`` (rich's, on a terminal as wide as it is),
    ``json``, ``jsonl`` or ``markdown``."""
    if output_format == "json":
        click.echo(
            json.dumps(
                {"analysed_templates": result.analysed_now, "distinct_templates": len(result.analyses), "rows": table}, indent=2
            )
        )
    elif output_format == "jsonl":
        for row in table:
            click.echo(json.dumps(row))
    elif output_format == "markdown":
        click.echo(markdown(table), nl=False)
    else:
        from rich.console import Console  # noqa: PLC0415 -- an extra (audit): only for the table
        from rich.table import Table  # noqa: PLC0415 -- an extra (audit), with Console above

        view = Table("repo", "template", "findings", "first divergence", "projected hit rate")
        for row in table:
            view.add_row(*cells(row))
        Console(no_color="NO_COLOR" in os.environ, width=200 if not sys.stdout.isatty() else None).print(view)
        repos, distinct = len(result.repos), len(result.analyses)
        click.echo(
            f"{repos} repo{'s' if repos != 1 else ''}, {distinct} distinct template{'s' if distinct != 1 else ''}, "
            f"{result.analysed_now} analysed now"
        )
