"""The page of ``tmpl-lint replay --html``: its fleet, cause and note sections read back
with html.parser and compared with the JSON report of the same run, and, on the golden log,
with what vLLM's own KVCacheManager hit on each replica (expected-replicas.json)."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner
from helpers import CORPUS, chromium_dom
from test_fleet_golden import REPLICAS, _fleet_setups, _replay, needs_golden

from tmpl_lint.cli import main
from tmpl_lint.report.replay import html_report


class Page(HTMLParser):
    """The page's tables by class (rows of cell texts, header row first), its headings and
    its list items, as a browser reads the text (entities decoded)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[list[str]]]] = {}
        self.headings: list[str] = []
        self.items: list[str] = []
        self.rects = 0
        self._table: list[list[str]] | None = None
        self._text: list[str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "table":
            self._table = []
            self.tables.setdefault(attributes.get("class") or "", []).append(self._table)
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th", "h2", "li"):
            self._text = []
        elif tag == "rect":
            self.rects += 1

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._text is not None and self._table is not None:
            self._table[-1].append("".join(self._text))
            self._text = None
        elif tag == "h2" and self._text is not None:
            self.headings.append("".join(self._text))
            self._text = None
        elif tag == "li" and self._text is not None:
            self.items.append("".join(self._text).strip())
            self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)


def number(cell: str) -> int:
    return int(cell.replace(",", ""))


def rate(cell: str) -> float:
    assert cell.endswith("%"), cell
    return float(cell[:-1]) / 100


def fleet_rows(page: Page, index: int = 0) -> tuple[dict[str, str], list[dict[str, str]]]:
    overview = {row[0]: row[1] for row in page.tables["fleet"][index][1:]}
    header, *rows = page.tables["replicas"][index]
    return overview, [dict(zip(header, row, strict=True)) for row in rows]


def assert_fleet_equals_json(page: Page, report: dict, index: int = 0) -> None:
    fleet, unit = report["fleet"], report["unit"]
    overview, replicas = fleet_rows(page, index)
    assert number(overview["replicas"]) == fleet["replicas"]
    assert overview["router"] == fleet["router"]
    assert abs(rate(overview["fleet hit rate"]) - report["prefix_cache_hit_rate"]) <= 0.0005
    hits, queries = overview[f"prefix cache hits / queries ({unit}s)"].split(" / ")
    assert (number(hits), number(queries)) == (report["prefix_cache_hits"], report["prefix_cache_queries"])
    assert abs(float(overview[f"imbalance: the busiest replica's prompt {unit}s over the mean"]) - fleet["imbalance"]) <= 0.005
    assert number(overview[f"{unit}s lost to routing"]) == fleet["lost_to_routing"]
    assert len(replicas) == len(fleet["per_replica"])
    for row, expected in zip(replicas, fleet["per_replica"], strict=True):
        assert [number(row[name]) for name in ("replica", "requests", "sessions", f"prompt {unit}s", f"hit {unit}s")] == [
            expected[key] for key in ("replica", "requests", "sessions", "prefix_cache_queries", "prefix_cache_hits")
        ]
        assert abs(rate(row["hit rate"]) - expected["prefix_cache_hit_rate"]) <= 0.0005
        assert number(row[f"lost to routing ({unit}s)"]) == expected["lost_to_routing"]


def causes_of(page: Page, index: int = 0) -> dict[str, int]:
    _, *rows = page.tables["causes"][index]
    return {row[0]: number(row[1]) for row in rows}


# --- a small log, characters as tokens --------------------------------------------------------

PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"
SYSTEM = "S" * 40  # every session's first 40 characters: 2 blocks of 16 and a partial one


def write_log(path, sessions: int = 3, turns: int = 3) -> None:
    """Interleaved sessions, each turn extending the last; no replies logged."""
    lines = []
    for turn in range(turns):
        for session in range(sessions):
            content = SYSTEM + "".join(chr(ord("a") + session) * (10 + 7 * step) for step in range(turn + 1))
            lines.append(json.dumps({"user": f"s{session}", "messages": [{"role": "user", "content": content}]}))
    path.write_text("\n".join(lines) + "\n")


def run(tmp_path, *flags, template_name="plain.jinja", lines=None):
    template = tmp_path / template_name
    template.write_text(PLAIN)
    log = tmp_path / "log.jsonl"
    if lines is None:
        write_log(log)
    else:
        log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    page = tmp_path / "replay.html"
    result = CliRunner().invoke(
        main,
        ["replay", str(log), "--template", str(template), "--session-key", "user", "--format", "json", "--html", str(page)]
        + [str(flag) for flag in flags],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["template"], page


@pytest.mark.parametrize("router", ["round-robin", "session", "prefix", "kv"])
def test_the_page_s_fleet_figures_are_the_json_report_s(tmp_path, router):
    report, page = run(tmp_path, "--replicas", "3", "--router", router, "--cache-blocks", "12,400")
    read = Page(page.read_text(encoding="utf-8"))
    assert_fleet_equals_json(read, report)
    assert causes_of(read) == {cause: tokens for cause, tokens in report["tokens_by_cause"].items() if cause != "layers"}
    assert sum(causes_of(read).values()) == report["prefix_cache_queries"]
    # the headline capacity: the first of the sweep that holds every request, as in the JSON
    assert f"Fleet: {tmp_path / 'plain.jinja'} (blocks of 16, {report['capacity_blocks']} blocks)" in read.headings
    assert read.rects == 3  # a bar per replica


def test_each_template_of_a_comparison_has_its_fleet_section(tmp_path):
    other = tmp_path / "other.jinja"
    other.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")  # 2 more characters per message
    report, page = run(tmp_path, "--replicas", "2", "--router", "session", "--compare", other)
    read = Page(page.read_text(encoding="utf-8"))
    assert len(read.tables["fleet"]) == len(read.tables["causes"]) == 2
    full = json.loads(
        CliRunner()
        .invoke(
            main,
            ["replay", str(tmp_path / "log.jsonl"), "--template", str(tmp_path / "plain.jinja"), "--compare", str(other)]
            + ["--session-key", "user", "--format", "json", "--replicas", "2", "--router", "session"],
        )
        .stdout
    )
    assert full["template"] == report
    assert_fleet_equals_json(read, full["template"], 0)
    assert_fleet_equals_json(read, full["compare"], 1)
    assert full["compare"]["prefix_cache_queries"] == report["prefix_cache_queries"] + 2 * 9


def test_round_robin_s_figures_worked_by_hand_are_on_the_page(tmp_path):
    # Blocks of 16. Prompts: 40 S's, then the session's letter (a, b, c) 10, 27 and 51 times:
    # 50, 67 and 91 characters, each turn extending the last. The 9 requests s0 s1 s2 s0 s1 s2
    # s0 s1 s2 go to replicas 0 1 0 1 0 1 0 1 0. "held" is what the other replica would hit
    # (full blocks, at least one character computed), lost to routing where above the hit.
    #   replica 0: s0 50 cold 0; s2 50 hits the 2 S blocks, 32 (held elsewhere: 32);
    #              s1 67 hits 32 (replica 1 holds s1's first 3 blocks: 48, 16 lost);
    #              s0 91 hits its first prompt's 3 blocks, 48 (replica 1 holds 4 of s0's second: 16 lost);
    #              s2 91 likewise 48, 16 lost.  5 requests, 349 queried, 160 hit, 48 lost.
    #   replica 1: s1 50 cold 0 (replica 0 holds the S blocks: 32 lost); s0 67 hits 32 (48 held: 16 lost);
    #              s2 67 hits 32 (16 lost); s1 91 hits 48 (replica 0 holds 64 of s1's second: 16 lost).
    #              4 requests, 275 queried, 112 hit, 80 lost.
    report, page = run(tmp_path, "--replicas", "2", "--router", "round-robin")
    overview, replicas = fleet_rows(Page(page.read_text(encoding="utf-8")))
    assert [
        (row["requests"], row["sessions"], row["prompt chars"], row["hit chars"], row["lost to routing (chars)"])
        for row in replicas
    ] == [("5", "3", "349", "160", "48"), ("4", "3", "275", "112", "80")]
    assert overview["fleet hit rate"] == f"{272 / 624:.1%}"
    assert overview["chars lost to routing"] == "128"
    assert overview["imbalance: the busiest replica's prompt chars over the mean"] == f"{349 / 312:.2f}"
    assert (report["prefix_cache_hits"], report["fleet"]["lost_to_routing"]) == (272, 128)


def test_no_fleet_section_without_replicas_and_the_cause_table_without_routing(tmp_path):
    report, page = run(tmp_path)
    read = Page(page.read_text(encoding="utf-8"))
    assert "fleet" not in read.tables and "replicas" not in read.tables
    assert "routing" not in causes_of(read) and "layers" not in causes_of(read)
    assert causes_of(read) == {cause: tokens for cause, tokens in report["tokens_by_cause"].items() if cause in causes_of(read)}


def test_a_hybrid_model_s_groups_and_layers_are_on_the_page(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}))
    # one session whose second message keeps the first's 37 characters only (tests/test_fleet.py
    # works the 36 the sliding-window layers lose by hand)
    edited = [{"user": "s", "messages": [{"role": "user", "content": "y" * 37 + tail * 20}]} for tail in "AB"]
    report, page = run(tmp_path, "--block-size", "4", "--model-config", config, lines=edited)
    read = Page(page.read_text(encoding="utf-8"))
    assert f"KV-cache groups sharing the pool: {report['kv_cache_groups']}" in read.items
    assert report["kv_cache_groups"] == "sliding window 8, full attention"
    assert causes_of(read)["layers"] == report["tokens_by_cause"]["layers"] == 36
    assert causes_of(read) == {cause: tokens for cause, tokens in report["tokens_by_cause"].items() if cause != "routing"}


def test_names_on_the_page_are_escaped(tmp_path):
    name = "<b>x&amp;<i>.jinja"
    report, page = run(tmp_path, "--replicas", "2", template_name=name)
    text = page.read_text(encoding="utf-8")
    assert "<b>" not in text
    read = Page(text)
    # the text a browser shows: the name as it is
    assert f"Fleet: {tmp_path / name} (blocks of 16, unbounded pool)" in read.headings
    assert_fleet_equals_json(read, report)


def test_a_hosted_api_s_causes_and_notes_are_on_the_page(tmp_path):
    from test_hosted_causes import SYSTEM as LONG_SYSTEM
    from test_hosted_causes import write_log as write_hosted_log

    log, page = tmp_path / "hosted.jsonl", tmp_path / "hosted.html"
    write_hosted_log(log, LONG_SYSTEM)
    result = CliRunner().invoke(
        main,
        ["replay", str(log), "--template", str(CORPUS / "clean_chatml.jinja"), "--session-key", "user", "--format", "json"]
        + ["--cache-model", "anthropic", "--api-model", "claude-sonnet-4-5", "--html", str(page)],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["template"]
    read = Page(page.read_text(encoding="utf-8"))
    shown = causes_of(read)
    assert shown == {cause: report["tokens_by_cause"][cause] for cause in shown}
    # no eviction at a hosted API, no replicas, no sparse layers
    assert set(report["tokens_by_cause"]) - set(shown) == {"capacity", "routing", "layers"}
    assert shown["unmarked"] == 1182 and shown["reply"] == 159  # tests/test_hosted_causes.py works them by hand
    assert any(item.startswith("no request carries a cache_control breakpoint") for item in read.items)
    assert "fleet" not in read.tables


# --- the golden log: vLLM's own managers, one per replica ------------------------------------


@needs_golden
@pytest.mark.parametrize("replicas, routing", _fleet_setups() or [(0, "")])
def test_the_page_shows_each_replica_s_hits_as_vllm_s_own_manager_counted_them(tmp_path, replicas, routing):
    fleets = [fleet for fleet in REPLICAS["fleets"] if (fleet["replicas"], fleet["routing"]) == (replicas, routing)]
    summaries = _replay(tmp_path, [fleet["cache_blocks"] for fleet in fleets], replicas=replicas, router=routing)
    for fleet in fleets:
        read = Page(html_report([("agents", summaries[fleet["cache_blocks"]])]))
        _, rows = fleet_rows(read)
        assert [
            (number(row["replica"]), number(row["requests"]), number(row["prompt tokens"]), number(row["hit tokens"]))
            for row in rows
        ] == [
            (expected["replica"], expected["requests"], expected["queried_tokens"], expected["hit_tokens"])
            for expected in fleet["per_replica"]
        ], fleet["capacity"]
        assert [number(row["sessions"]) for row in rows] == [len(expected["sessions"]) for expected in fleet["per_replica"]]
        for row, expected in zip(rows, fleet["per_replica"], strict=True):
            assert abs(rate(row["hit rate"]) - expected["hit_rate"]) <= 0.0005


def test_the_fleet_page_opens_in_headless_chromium(tmp_path):
    report, page = run(tmp_path, "--replicas", "3", "--router", "session")
    dom = chromium_dom(page, tmp_path / "profile")
    read = Page(dom)  # the page as the browser built it
    assert_fleet_equals_json(read, report)
    assert read.rects == 3
