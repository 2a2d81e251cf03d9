"""The runner behind ``tmpl-lint check``: options in, a typed result out (findings per
template, what the fixes said, the inputs not read, the exit status), nothing printed.
The CLI tests check what is printed; these check what the run decided."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from datetime import date
from pathlib import Path

import pytest
from helpers import CORPUS, at

from tmpl_lint.commands import AuditOptions, DiffOptions, ReplayOptions, run_audit, run_diff, run_replay
from tmpl_lint.runner import (
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_FINDINGS,
    CheckOptions,
    FixLine,
    FixMode,
    InputError,
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
    assert result.errors == [InputError(missing, f"{missing}: no such file or directory")]
    assert result.errors[0].message == "no such file or directory"
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
    # Layered as ruff: an --ignore adds to the file's ignore; a --select replaces it.
    ignoring = run_check(CheckOptions((path,), prove=False, ignore=("PC002",)))
    assert places(ignoring) == {path.name: []}
    selected = run_check(CheckOptions((path,), prove=False, select=("PC001",)))
    assert places(selected) == {path.name: [("PC001", 3, 28)]}


def test_fix_writes_says_each_fix_as_it_is_decided_and_lints_the_file_as_written(tmp_path):
    path = copy("PC001_live_clock.jinja", tmp_path)
    original = path.read_text()
    heard: list[FixLine] = []
    result = run_check(
        CheckOptions((path,), prove=False, fix=FixMode.WRITE, frozen_date=FROZEN, unsafe_fixes=True), on_fix_line=heard.append
    )
    header = '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}'
    old = original.splitlines()[2]
    new = old.replace('strftime_now("%Y-%m-%d")', "date_string")
    # the fix, then the template lines it edited: a line added at the top, line 3 (now 4) rewritten
    assert result.fix_lines == [
        FixLine(f"{path}:3:28: fixed {CLOCK_FIX}"),
        FixLine(f"    1 + {header}"),
        FixLine(f"    3 - {old}"),
        FixLine(f"    4 + {new}"),
    ]
    assert heard == result.fix_lines
    assert path.read_text() == (
        '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n'
        + original.replace('strftime_now("%Y-%m-%d")', "date_string")
    )
    assert (places(result), result.would_change, result.status) == ({path.name: []}, False, EXIT_CLEAN)


def test_diff_writes_nothing_gives_the_patch_and_exits_1(tmp_path):
    path = copy("PC001_live_clock.jinja", tmp_path)
    before = path.read_bytes()
    result = run_check(CheckOptions((path,), prove=False, fix=FixMode.DIFF, frozen_date=FROZEN, unsafe_fixes=True))
    assert path.read_bytes() == before
    message, *_edited, patch = result.fix_lines
    assert message == FixLine(f"{path}:3:28: would fix {CLOCK_FIX}")
    assert patch.patch
    assert patch.text.startswith(f"--- a/{path.name}\n+++ b/{path.name}\n@@ -1,6 +1,7 @@\n")
    # the lint reads the template as the patch would leave it: nothing left to find
    assert places(result) == {path.name: []}
    assert (result.would_change, result.status) == (True, EXIT_FINDINGS)
    # --exit-zero covers the patch as ruff's does: the patch is still given, the exit is 0
    result = run_check(
        CheckOptions((path,), prove=False, fix=FixMode.DIFF, frozen_date=FROZEN, exit_zero=True, unsafe_fixes=True)
    )
    assert (path.read_bytes(), result.fix_lines[-1].text, result.status) == (before, patch.text, EXIT_CLEAN)


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


# -- diff and replay -------------------------------------------------------------------------

USER_HI = {"role": "user", "content": "Hi"}
# clean_chatml.jinja's render of [USER_HI] with the generation prompt, written out by hand.
CHATML_HI = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def write_json(path: Path, document) -> Path:
    path.write_text(json.dumps(document))
    return path


def test_diff_measures_a_clean_extension_in_characters_without_a_tokenizer(tmp_path):
    first = write_json(tmp_path / "1.json", {"messages": [USER_HI]})
    turn = [USER_HI, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}]
    second = write_json(tmp_path / "2.json", {"messages": turn})
    divergence, rendered_by = run_diff(DiffOptions(first, second, template=CORPUS / "clean_chatml.jinja"))
    assert rendered_by == "vLLM 0.33.0"
    following = CHATML_HI + "Hello<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n"
    assert (divergence.first_divergence, divergence.unit) == (None, "char")
    assert divergence.prompt_tokens == (len(CHATML_HI), len(following))


def test_diff_without_a_template_or_a_server_is_a_usage_error_and_a_bad_request_a_run_error(tmp_path):
    first = write_json(tmp_path / "1.json", {"messages": [USER_HI]})
    with pytest.raises(OptionsError, match="give --template or --tokenizer"):
        run_diff(DiffOptions(first, first))
    empty = write_json(tmp_path / "empty.json", {"messages": []})
    with pytest.raises(RunError, match="non-empty messages list") as raised:
        run_diff(DiffOptions(empty, first, template=CORPUS / "clean_chatml.jinja"))
    assert not isinstance(raised.value, OptionsError)


def test_diff_says_when_vllm_renders_the_model_without_its_template(tmp_path):
    first = write_json(tmp_path / "1.json", {"messages": [USER_HI]})
    heard: list[str] = []
    run_diff(DiffOptions(first, first, template=CORPUS / "PC103_engine_render_unstable.jinja"), heard.append)
    assert heard == ["vLLM renders this model (gpt-oss) with openai-harmony, not this template; --engine hf renders the template"]


def test_replay_gives_a_summary_per_template_and_the_lines_it_could_not_replay(tmp_path):
    reply = {"role": "assistant", "content": "Hello"}
    entries = [
        {"request": {"messages": [USER_HI]}, "response": {"choices": [{"message": reply}]}},
        {"request": {"messages": [USER_HI, reply, {"role": "user", "content": "More"}]}},
        {"request": {"messages": "not a list"}},
    ]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    chatml = CORPUS / "clean_chatml.jinja"
    result = run_replay(ReplayOptions(log, chatml, compare=chatml))
    assert [label for label, _ in result.summaries] == ["template", "compare"]
    assert [(summary.requests, summary.sessions) for _, summary in result.summaries] == [(2, 1), (2, 1)]
    assert result.problems == [f"{log}:3: no messages in this request"]
    assert result.status == EXIT_ERROR


def test_replay_on_llamacpp_with_a_capacity_needs_slots(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"request": {"messages": [USER_HI]}}) + "\n")
    options = ReplayOptions(log, CORPUS / "clean_chatml.jinja", cache_model="llamacpp", cache_blocks="4")
    with pytest.raises(OptionsError, match="give --slots"):
        run_replay(options)
    assert run_replay(replace(options, slots=1)).status == EXIT_CLEAN


# -- audit -----------------------------------------------------------------------------------


def model_folder(directory: Path, fixture: str) -> Path:
    directory.mkdir()
    shutil.copyfile(CORPUS / fixture, directory / "chat_template.jinja")
    return directory


def test_audit_of_local_folders_gives_a_row_per_template_and_exits_1_on_findings(tmp_path):
    clock = model_folder(tmp_path / "clock", "PC001_live_clock.jinja")
    clean = model_folder(tmp_path / "clean", "clean_chatml.jinja")
    run = run_audit(AuditOptions(local=(clock, clean), prove=False, use_cache=False))
    assert [(row["repo"], row["codes"]) for row in run.rows] == [(str(clock), ["PC001"]), (str(clean), [])]
    assert (run.audit.analysed_now, run.cache_problems, run.status) == (2, [], EXIT_FINDINGS)


def test_audit_without_any_template_exits_2_and_without_names_is_a_usage_error(tmp_path):
    (tmp_path / "empty").mkdir()
    run = run_audit(AuditOptions(local=(tmp_path / "empty",), prove=False, use_cache=False))
    assert (run.audit.analyses, run.status) == ({}, EXIT_ERROR)
    with pytest.raises(OptionsError, match="name repos"):
        run_audit(AuditOptions(use_cache=False))
    with pytest.raises(RunError, match="nope.txt"):
        run_audit(AuditOptions(from_file=tmp_path / "nope.txt", use_cache=False))


def test_an_audit_of_a_base_model_says_it_has_no_template_and_does_not_fail(tmp_path):
    # A local Hugging Face cache holds base models: a row says so, the findings decide.
    base = tmp_path / "base"
    base.mkdir()
    (base / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    clean = model_folder(tmp_path / "clean", "clean_chatml.jinja")
    run = run_audit(AuditOptions(local=(base, clean), prove=False, use_cache=False))
    assert [(row["repo"], row["error"], row["warning"], row["codes"]) for row in run.rows] == [
        (str(base), None, "no chat template", []),
        (str(clean), None, None, []),
    ]
    assert [repo.error for repo in run.audit.repos] == [None, None]
    assert run.status == EXIT_CLEAN


def test_a_static_lint_imports_neither_the_proof_stack_nor_the_other_commands():
    # A pre-commit hook lints on every commit: what it never uses it must not import. One
    # template needs no threads to wait on its children (concurrent.futures brings logging).
    import subprocess
    import sys

    heavy = ("transformers", "tokenizers", "huggingface_hub", "openai_harmony", "numpy", "concurrent")
    others = ("tmpl_lint.commands", "tmpl_lint.writes", "tmpl_lint.tokenizer", "tmpl_lint.audit", "tmpl_lint.replay")
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['tmpl-lint', '--no-prove', '-q', {str(CORPUS / 'clean_chatml.jinja')!r}]\n"
        "try:\n"
        "    runpy.run_module('tmpl_lint', run_name='__main__')\n"
        "except SystemExit as done:\n"
        f"    loaded = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r} or m in {others!r})\n"
        "    print(done.code, loaded)\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (ran.stdout, ran.stderr) == ("0 []\n", "")


def test_after_fix_a_failing_finding_the_proof_found_is_said_though_a_pattern_of_its_code_was():
    # A template where --fix fixed one PC004 pattern (a `tojson` it saw) and the proof found
    # another re-serialisation no pattern shows: the second still fails, and says why.
    from tmpl_lint.findings import Finding
    from tmpl_lint.inputs import TemplateSource
    from tmpl_lint.proofs import Proof
    from tmpl_lint.rules.pc004_tool_args_reserialized import ReplayedAs
    from tmpl_lint.runner import CheckResult, LintedSource, _Fixing

    def finding(line: int, found_by_proof: bool) -> Finding:
        # proven: it fails the run
        proof = Proof.proven_by("char", "a render")
        return Finding(
            "PC004",
            "tool-args-reserialized",
            "warning",
            line,
            1,
            ReplayedAs('{"city": "Paris"}', '{"city":"Paris"}'),
            path="t.jinja",
            hypothesis=not found_by_proof,
            proof=proof,
        )

    fixing = _Fixing(None, None, True, False, None, CheckResult(), None, jobs=1)
    fixing.say_finding(finding(9, found_by_proof=False), "fixed", "written as the model writes them")
    left = finding(3, found_by_proof=True)
    fixing.say_unaddressed([LintedSource(TemplateSource(Path("t.jinja"), None, "", "jinja"), [left])])
    assert [line.text for line in fixing.result.fix_lines] == [
        "t.jinja:9:1: fixed PC004 [tool-args-reserialized]: written as the model writes them",
        "t.jinja:3:1: not fixed PC004 [tool-args-reserialized]: found by the proof, not from a pattern a fix edits: no automatic fix",
    ]
