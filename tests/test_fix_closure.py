"""Fix closure over the shared corpus: after --fix, a plain run reports none of the
findings the fixer said it fixed, nothing new fails, and every finding of a fixable rule
was either fixed or declined with a reason (ruff's "fix sometimes available").

The 67 templates are fixed in chunks, one test each, so the run can be spread over
workers (pytest -n) and a failure names its templates. The command runs in this process
(click's runner): what is tested is what the fixes do, not how a process starts, and 32
interpreters starting and importing the renderer were a third of this file's time.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from helpers import SHARED_TEMPLATES, needs_shared

from tmpl_lint.cli import main
from tmpl_lint.rules import RULES

pytestmark = needs_shared

FIXABLE = {rule.RULE.code for rule in RULES if rule.fix is not None}
TEMPLATES = sorted(SHARED_TEMPLATES.glob("*.jinja")) if SHARED_TEMPLATES.is_dir() else []
CHUNKS = 8
FOUND_BY_PROOF = "found by the proof, not from a pattern a fix edits"
FIX_LINE = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+):(?P<column>\d+): (?P<verb>fixed|not fixed) (?P<code>PC\d{3}) \[[\w-]+\]: (?P<said>.+)$"
)
# The template lines a fix edited, under its line: "   97 - old" and "   97 + new".
EDITED_LINE = re.compile(r"^ *\d+ [-+] ")


def lint(directory: Path, *args: str) -> Result:
    result = CliRunner().invoke(main, [str(directory), "--format", "json", "--frozen-date", "2026-01-15", *args])
    # the command ended as it means to (an exit code), not on an exception of its own
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def by_template(findings: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for finding in findings:
        grouped.setdefault(Path(finding["path"]).name, []).append(finding)
    return grouped


def fails(finding: dict) -> bool:
    return finding["fails"]


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_fix_closure(tmp_path, chunk):
    names = [path.name for path in TEMPLATES[chunk::CHUNKS]]
    assert names, "the shared corpus has templates"
    for name in names:
        shutil.copyfile(SHARED_TEMPLATES / name, tmp_path / name)
        (tmp_path / name).chmod(0o644)
    before = lint(tmp_path)
    assert before.exit_code in (0, 1), before.stderr
    found_before = by_template(json.loads(before.stdout))
    # What the fixer works from: the static findings (a proven run folds findings one
    # divergence shows into one, and adds those only its proof finds).
    static = lint(tmp_path, "--no-prove")
    static_before = by_template(json.loads(static.stdout))

    fixing = lint(tmp_path, "--fix", "--unsafe-fixes")
    # --fix --format json: standard output is the report of what remains, and only that
    remaining_after_fix = json.loads(fixing.stdout)
    said: dict[str, Counter] = {}
    declined_at: set[tuple[str, int, int]] = set()
    for line in fixing.stderr.splitlines():
        if EDITED_LINE.match(line):
            continue
        match = FIX_LINE.match(line)
        assert match, f"--fix says something that is not a fix line: {line!r}"
        assert match["said"].strip(), line  # a fix says what it changes; a declined one why
        # A failing finding the proof found (no pattern for a fix to edit) says so after the lint.
        verb = "found by the proof" if match["said"].startswith(FOUND_BY_PROOF) else match["verb"]
        said.setdefault(Path(match["path"]).name, Counter())[(verb, match["code"])] += 1
        if match["verb"] == "not fixed":
            declined_at.add((Path(match["path"]).name, int(match["line"]), int(match["column"])))

    after = lint(tmp_path)
    assert json.loads(after.stdout) == remaining_after_fix  # what --fix reported is what the file now holds
    found_after = by_template(remaining_after_fix)
    assert after.exit_code == (1 if any(fails(f) for f in remaining_after_fix) else 0)

    for name in names:
        told = said.get(name, Counter())
        was, now = found_before.get(name, []), found_after.get(name, [])
        # no finding of a fixable rule is fixed or declined that the lint did not find, and a
        # declined one is said at a place the check reports (not at another's related location)
        for code in FIXABLE:
            count = sum(1 for finding in static_before.get(name, []) if finding["code"] == code)
            assert told[("fixed", code)] + told[("not fixed", code)] <= count, (name, code)
        reported = {(name, finding["line"], finding["column"]) for finding in now}
        assert {place for place in declined_at if place[0] == name} <= reported, name
        # every failure left after --fix was said to be left, with its reason: those --fix
        # worked from as "not fixed", those the proof found itself as found by the proof
        for code in {f["code"] for f in now if fails(f)}:
            failing = sum(1 for f in now if f["code"] == code and fails(f))
            assert failing <= told[("not fixed", code)] + told[("found by the proof", code)], (name, code)
            assert told[("found by the proof", code)] <= failing, (name, code)
        for code in FIXABLE:
            if not told[("fixed", code)]:
                continue  # not fixed here: whatever stays is what was there (checked below)
            declined = told[("not fixed", code)]
            # what stays of a rule the fixer fixed is a finding it declined, or one that now
            # applies only to a caller who opts in (the switch's default became stable)
            stays = [f for f in now if f["code"] == code and not (f["switch"] or {}).get("default_is_stable")]
            assert len(stays) <= declined, (name, code, [f["message"] for f in stays])
        # nothing fails that did not fail before the fix, or was not shown as a failing
        # finding's related location: a pattern whose divergence only shows behind another
        # rule's (Gemma 4's look-ahead at tool results, behind the empty thought channel its
        # history drops) is proven once that one is fixed
        failing_before = {finding["code"] for finding in was if fails(finding)}
        failing_before |= {related["code"] for finding in was if fails(finding) for related in finding.get("related", [])}
        # or shown only in scenarios a failing finding showed diverging before: a pair's first
        # difference is the earliest, and a later one in it shows once that is fixed (gpt-oss's
        # final answer losing its analysis, behind the earlier turns' analysis its look-ahead
        # dropped: PC003's before the fix, PC006's after)
        shown_before = {
            pair["scenario"] for finding in was if fails(finding) for pair in (finding["proof"] or {}).get("explains", ())
        }
        new = [
            f"{f['code']}: {f['message']}"
            for f in now
            if fails(f)
            and f["code"] not in failing_before
            and not {pair["scenario"] for pair in (f["proof"] or {}).get("explains", ())} <= shown_before
        ]
        assert new == [], name
