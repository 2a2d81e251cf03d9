"""The HTML page of ``tmpl-lint replay --html``: its table and SVG charts."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..kv_cache.fleet import FleetFigures
    from ..replay.simulate import Summary

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
WIDTH, HEIGHT, LEFT, BOTTOM, TOP, RIGHT = 760, 380, 70, 50, 20, 20


def _axes(x_label: str, y_label: str, x_ticks: list[tuple[float, str]], y_ticks: list[tuple[float, str]]) -> str:
    """Axis lines, ticks and labels; tick positions are fractions of the plot area."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="#444"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#444"/>',
    ]
    for fraction, text in x_ticks:
        x = LEFT + fraction * plot_w
        parts.append(f'<line x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 5}" stroke="#444"/>')
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle" font-size="11">{html.escape(text)}</text>')
    for fraction, text in y_ticks:
        y = TOP + plot_h - fraction * plot_h
        parts.append(f'<line x1="{LEFT - 5}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" stroke="#444"/>')
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{html.escape(text)}</text>')
    parts.append(
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle" font-size="12">{html.escape(x_label)}</text>'
    )
    parts.append(
        f'<text transform="translate(16,{TOP + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle" font-size="12">'
        f"{html.escape(y_label)}</text>"
    )
    return "".join(parts)


def _legend(entries: list[tuple[str, str, bool]]) -> str:
    items = []
    for text, colour, dashed in entries:
        dash = ' stroke-dasharray="6 3"' if dashed else ""
        items.append(
            f'<li><svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" stroke="{colour}" stroke-width="3"{dash}/>'
            f"</svg> {html.escape(text)}</li>"
        )
    return f'<ul style="list-style:none;padding-left:0">{"".join(items)}</ul>'


def _sweep_chart(results: list[tuple[str, Summary]]) -> str:
    points = sorted({point.capacity_blocks for _, summary in results for point in summary.sweep if point.capacity_blocks})
    if len(points) < 2:
        return ""
    low, high = math.log(points[0]), math.log(points[-1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(blocks: int) -> float:
        return (math.log(blocks) - low) / (high - low) if high > low else 0.5

    lines, legend = [], []
    for index, (label, summary) in enumerate(results):
        colour = COLOURS[index % len(COLOURS)]
        # (an unbounded point has no place on the capacity axis)
        fitted = [(point.capacity_blocks, point.hit_rate) for point in summary.sweep if point.capacity_blocks and not point.error]
        coordinates = [(LEFT + x(blocks) * plot_w, TOP + plot_h - rate * plot_h) for blocks, rate in fitted]
        dash = ' stroke-dasharray="6 3"' if index else ""
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} '
            f'points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in coordinates)}"/>'
        )
        lines.extend(
            f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.5" fill="{colour}"><title>{html.escape(label)}: '
            f"{blocks} blocks, {rate:.1%}</title></circle>"
            for (a, b), (blocks, rate) in zip(coordinates, fitted)
        )
        legend.append((f"{label}: {summary.cache_model}", colour, bool(index)))
    axes = _axes(
        "KV cache capacity (--cache-blocks, log scale)",
        "prefix cache hit rate",
        [(x(blocks), f"{blocks:,}") for blocks in points],
        [(step / 4, f"{step * 25}%") for step in range(5)],
    )
    return (
        "<h2>Hit rate by cache capacity</h2>"
        + _legend(legend)
        + f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">{axes}{"".join(lines)}</svg>'
    )


def _sessions_chart(results: list[tuple[str, Summary]]) -> str:
    series = [(label, figures) for label, summary in results for figures in summary.worst() if figures.cumulative_lost]
    if not series:
        return "<p>No session lost any tokens to the template, the client or capacity.</p>"
    peak = max(max(figures.cumulative_lost) for _, figures in series) or 1
    turns = max(len(figures.cumulative_lost) for _, figures in series)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    unit = results[0][1].unit
    keys = list(dict.fromkeys(figures.key for _, figures in series))
    lines, legend = [], []
    for label, figures in series:
        colour = COLOURS[keys.index(figures.key) % len(COLOURS)]
        dashed = label != results[0][0]
        points = " ".join(
            f"{LEFT + (turn + 1) / turns * plot_w:.1f},{TOP + plot_h - value / peak * plot_h:.1f}"
            for turn, value in enumerate(figures.cumulative_lost)
        )
        dash = ' stroke-dasharray="6 3"' if dashed else ""
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{LEFT},{TOP + plot_h} {points}">'
            f"<title>{html.escape(label)}: session {html.escape(figures.key)}</title></polyline>"
        )
        legend.append((f"{label}: session {figures.key} ({figures.lost:,} {unit}s lost)", colour, dashed))
    x_ticks = [(turn / turns, str(turn)) for turn in sorted({0, turns // 2, turns})]
    y_ticks = [(step / 4, f"{round(peak * step / 4):,}") for step in range(5)]
    axes = _axes("request of the session", f"{unit}s lost, cumulative", x_ticks, y_ticks)
    return (
        "<h2>Worst sessions: tokens lost to template, client and capacity</h2>"
        + _legend(legend)
        + f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">{axes}{"".join(lines)}</svg>'
    )


def _cell(text: str, header: bool = False) -> str:
    tag = "th" if header else "td"
    return f"<{tag}>{html.escape(text)}</{tag}>"


def _table(name: str, header: list[str], rows: list[list[str]]) -> str:
    """A table the tests and a reader's scripts find by its class."""
    head = "<tr>" + "".join(_cell(text, True) for text in header) + "</tr>"
    body = "".join("<tr>" + "".join(_cell(text) for text in row) + "</tr>" for row in rows)
    return f'<table class="{name}"><thead>{head}</thead><tbody>{body}</tbody></table>'


def _causes_section(label: str, summary: Summary) -> str:
    """What the text report says of one template's headline run beside the hit rate: the
    cache's notes (hybrid groups, Anthropic's marks, replies) and the prompt tokens by cause."""
    notes = [note for note in (summary.groups_note, summary.marks_note) if note]
    replies = summary.replies_note()
    if replies:
        notes.append(f"replies: {replies}")
    listed = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
    unit = summary.unit
    rows = [
        [
            str(cause),
            f"{summary.tokens[cause]:,}",
            f"{summary.tokens[cause] / summary.queries:.1%}" if summary.queries else "n/a",
            note,
        ]
        for cause, note in summary.reported_causes()
    ]
    table = _table("causes", ["cause", f"prompt {unit}s", "share", "meaning"], rows)
    return (
        f"<h2>Prompt {html.escape(unit)}s by cause: {html.escape(label)} ({html.escape(summary.capacity_text)})</h2>"
        + (f"<ul>{listed}</ul>" if listed else "")
        + table
    )


def _replica_chart(fleet: FleetFigures, colour: str) -> str:
    """Each replica's hit rate as a bar, the fleet's as a dashed line across."""
    count = len(fleet.replicas)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / count
    bars = []
    for figures in fleet.replicas:
        height = figures.hit_rate * plot_h
        bars.append(
            f'<rect x="{LEFT + figures.replica * slot + slot * 0.15:.1f}" y="{TOP + plot_h - height:.1f}" '
            f'width="{slot * 0.7:.1f}" height="{height:.1f}" fill="{colour}"><title>replica {figures.replica}: '
            f"{figures.hit_rate:.1%} ({figures.hits:,} of {figures.queries:,})</title></rect>"
        )
    hits = sum(figures.hits for figures in fleet.replicas)
    queries = sum(figures.queries for figures in fleet.replicas)
    rate = hits / queries if queries else 0.0
    y = TOP + plot_h - rate * plot_h
    bars.append(
        f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#444" stroke-width="2" stroke-dasharray="6 3">'
        f"<title>fleet: {rate:.1%}</title></line>"
    )
    every = max(1, -(-count // 16))  # at most 16 labels under the bars
    x_ticks = [((replica + 0.5) / count, str(replica)) for replica in range(0, count, every)]
    axes = _axes("replica", "prefix cache hit rate", x_ticks, [(step / 4, f"{step * 25}%") for step in range(5)])
    legend = _legend([("each replica", colour, False), (f"the fleet: {rate:.1%}", "#444", True)])
    return legend + f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">{axes}{"".join(bars)}</svg>'


def _fleet_section(label: str, summary: Summary, colour: str) -> str:
    """The replicas behind the router: the figures ``Fleet.describe`` gives the text report."""
    fleet, unit = summary.fleet, summary.unit
    if fleet is None:
        return ""
    overview = _table(
        "fleet",
        ["figure", "value"],
        [
            ["replicas", str(len(fleet.replicas))],
            ["router", fleet.router.name],
            ["fleet hit rate", f"{summary.hit_rate:.1%}"],
            [f"prefix cache hits / queries ({unit}s)", f"{summary.hits:,} / {summary.queries:,}"],
            [f"imbalance: the busiest replica's prompt {unit}s over the mean", f"{fleet.imbalance:.2f}"],
            [f"{unit}s lost to routing", f"{fleet.lost_to_routing:,}"],
        ],
    )
    replicas = _table(
        "replicas",
        ["replica", "requests", "sessions", f"prompt {unit}s", f"hit {unit}s", "hit rate", f"lost to routing ({unit}s)"],
        [
            [
                str(figures.replica),
                f"{figures.requests:,}",
                f"{len(figures.sessions):,}",
                f"{figures.queries:,}",
                f"{figures.hits:,}",
                f"{figures.hit_rate:.1%}",
                f"{figures.lost_to_routing:,}",
            ]
            for figures in fleet.replicas
        ],
    )
    why = (
        f"<p>Lost to routing: prompt {html.escape(unit)}s another replica held when the router chose this one, other "
        "sessions' shared prefixes included; the cause table's routing row counts the session's own.</p>"
    )
    return (
        f"<h2>Fleet: {html.escape(label)} ({html.escape(summary.capacity_text)})</h2>{overview}{why}{replicas}"
        f"<h3>Hit rate by replica</h3>{_replica_chart(fleet, colour)}"
    )


def html_report(results: list[tuple[str, Summary]], log: str = "", options: str = "") -> str:
    """One self-contained page: what was replayed (the log, the options, each template by
    its file name, the label of its series), the figures at each capacity, each template's
    prompt tokens by cause with the text report's notes, its fleet's replicas (with
    ``--replicas``), the hit-rate curve over the capacities swept, and the tokens the worst
    sessions lost, request by request."""
    rows = []
    for label, summary in results:
        for point in summary.sweep or [summary]:
            figures = (
                ["does not fit a request", "", ""]
                if point.error
                else [f"{point.hit_rate:.1%}", f"{point.steady_hit_rate:.1%}", f"{point.ideal_hit_rate:.1%}"]
            )
            cells = [label, point.cache_model, point.capacity_text, *figures]
            rows.append("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells) + "</tr>")
    table = (
        "<table><tr><th>template</th><th>cache</th><th>capacity</th><th>prefix cache hit rate (every request)</th>"
        f"<th>steady state</th><th>ideal</th></tr>{''.join(rows)}</table>"
    )
    sections = "".join(
        _causes_section(label, summary) + _fleet_section(label, summary, COLOURS[index % len(COLOURS)])
        for index, (label, summary) in enumerate(results)
    )
    what = ""
    if log:
        what += f"<p>Log: <code>{html.escape(log)}</code></p>"
    if options:
        what += f"<p>Options: <code>{html.escape(options)}</code></p>"
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>tmpl-lint replay</title>'
        "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:left}</style></head><body>"
        f"<h1>tmpl-lint replay</h1>{what}{table}{sections}{_sweep_chart(results)}{_sessions_chart(results)}</body></html>\n"
    )
