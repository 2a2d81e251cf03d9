"""The runner behind ``tmpl-lint check``: options in, a typed result out (findings per
template, what the fixes said, the inputs not read, the exit status), nothing printed.
The CLI tests check what is printed; these check what the run decided."""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path

import pytest
from helpers import CORPUS, at

from tmpl_lint.runner import (
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_FINDINGS,
    CheckOptions,
    FixLine,
    FixMode,
    OptionsError,
    RunError,
    run_check,
)

FROZEN = date(2026, 1, 15)
# What the PC001 fix says of the fixture, at the fixture's `strftime_now` (line 3, column 28).
CLOCK_FIX = "PC001 [live-clock]: the model sees the date 2026-01-15 instead of today's unless the caller passes date_string"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Run where no configuration file is found but the test's own."""
    monkeypatch.chdir(tmp_path)


def copy(name: str, directory: Path) -> Path:
    target = directory / name
    shutil.copyfile(CORPUS / name, target)
    return target


def places(result) -> dict[str, list[tuple[str, int, int]]]:
    return {linted.source.path.name: [(f.code, f.line, f.column) for f in linted.findings] for linted in result.linted}


def test_findings_come_per_template_and_a_failing_one_exits_1(tmp_path):
    clock = copy("PC001_live_clock.jinja", tmp_path)
    copy("clean_chatml.jinja", tmp_path)
    result = run_check(CheckOptions((tmp_path,), prove=False))
    assert places(result) == {
        "PC001_live_clock.jinja": [at("PC001", clock.read_text(), "strftime_now")],
        "clean_chatml.jinja": [],
    }
    assert (result.errors, result.warnings, result.fix_lines, result.would_change) == ([], [], [], False)
    assert result.status == EXIT_FINDINGS


def test_exit_zero_keeps_the_findings_and_exits_0(tmp_path):
    copy("PC001_live_clock.jinja", tmp_path)
    result = run_check(CheckOptions((tmp_path,), prove=False, exit_zero=True))
    assert [finding.code for finding in result.findings] == ["PC001"]
    assert result.status == EXIT_CLEAN


def test_a_path_not_read_is_an_error_line_and_exit_2_and_the_batch_goes_on(tmp_path):
    missing = tmp_path / "missing.jinja"
    copy("PC001_live_clock.jinja", tmp_path)
    result = run_check(CheckOptions((missing, tmp_path / "PC001_live_clock.jinja"), prove=False))
    assert result.errors == [f"{missing}: no such file or directory"]
    assert places(result) == {"PC001_live_clock.jinja": [("PC001", 3, 28)]}
    assert result.status == EXIT_ERROR


def test_no_template_found_is_a_warning_and_exits_0(tmp_path):
    (tmp_path / "notes.txt").write_text("no template here\n")
    result = run_check(CheckOptions((tmp_path,), prove=False))
    assert (result.linted, result.errors) == ([], [])
    assert result.warnings == ["no chat templates found in the given paths"]
    assert result.status == EXIT_CLEAN


def test_a_finding_the_proof_does_not_reproduce_fails_only_when_strict(tmp_path):
    # The fixture's own comment: both branches print the same text, so the proof does not
    # reproduce the PC003 the analysis sees.
    path = copy("PC003_unproven_same_text_either_way.jinja", tmp_path)
    relaxed = run_check(CheckOptions((path,), engine="hf"))
    assert places(relaxed) == {path.name: [at("PC003", path.read_text(), "loop.last %}")]}
    assert relaxed.status == EXIT_CLEAN
    strict = run_check(CheckOptions((path,), engine="hf", strict=True))
    assert (strict.strict, strict.status) == (True, EXIT_FINDINGS)


def test_strict_and_ignore_come_from_the_configuration_unless_options_say(tmp_path):
    path = copy("PC001_live_clock.jinja", tmp_path)
    (tmp_path / ".tmpl-lint.yaml").write_text("ignore: [PC001]\nstrict: true\n")
    configured = run_check(CheckOptions((path,), prove=False))
    assert (places(configured), configured.strict, configured.status) == ({path.name: []}, True, EXIT_CLEAN)
    selected = run_check(CheckOptions((path,), prove=False, ignore=("PC002",)))
    assert places(selected) == {path.name: [("PC001", 3, 28)]}


def test_fix_writes_says_each_fix_as_it_is_decided_and_lints_the_file_as_written(tmp_path):
    path = copy("PC001_live_clock.jinja", tmp_path)
    original = path.read_text()
    heard: list[FixLine] = []
    result = run_check(CheckOptions((path,), prove=False, fix=FixMode.WRITE, frozen_date=FROZEN), on_fix_line=heard.append)
    assert result.fix_lines == [FixLine(f"{path}:3:28: fixed {CLOCK_FIX}")]
    assert heard == result.fix_lines
    assert path.read_text() == (
        '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n'
        + original.replace('strftime_now("%Y-%m-%d")', "date_string")
    )
    assert (places(result), result.would_change, result.status) == ({path.name: []}, False, EXIT_CLEAN)


def test_diff_writes_nothing_gives_the_patch_and_exits_1(tmp_path):
    path = copy("PC001_live_clock.jinja", tmp_path)
    before = path.read_bytes()
    result = run_check(CheckOptions((path,), prove=False, fix=FixMode.DIFF, frozen_date=FROZEN))
    assert path.read_bytes() == before
    message, patch = result.fix_lines
    assert message == FixLine(f"{path}:3:28: would fix {CLOCK_FIX}")
    assert patch.patch
    assert patch.text.startswith(f"--- a/{path.name}\n+++ b/{path.name}\n@@ -1,6 +1,7 @@\n")
    # the lint reads the template as the patch would leave it: nothing left to find
    assert places(result) == {path.name: []}
    assert (result.would_change, result.status) == (True, EXIT_FINDINGS)


def test_options_that_cannot_run_raise_before_anything_is_read(tmp_path):
    path = copy("PC001_live_clock.jinja", tmp_path)
    with pytest.raises(OptionsError, match="XX1"):
        run_check(CheckOptions((path,), select=("XX1",)))
    with pytest.raises(RunError, match="no such tokenizer directory"):
        run_check(CheckOptions((path,), tokenizer=tmp_path / "nodir"))
    (tmp_path / ".tmpl-lint.yaml").write_text("block-size: -3\n")
    with pytest.raises(RunError) as raised:
        run_check(CheckOptions((path,), prove=False))
    assert not isinstance(raised.value, OptionsError)  # a configuration error, not a usage error
