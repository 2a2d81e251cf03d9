"""Fix safety as ruff has it: each rule's fix is safe or unsafe; ``--fix`` (and the fix
hook) applies the safe ones, ``--unsafe-fixes`` (or ``unsafe-fixes = true``) the rest. The
check ends with what is fixable, ``--fix`` with what it fixed and what remains, and every
fix shows the template lines it edited."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers import CORPUS, SHARED_TEMPLATES, needs_shared

from tmpl_lint.cli import main
from tmpl_lint.rules import RULES

PROJECT = Path(__file__).resolve().parents[1]
FROZEN = "2026-01-15"

# Decided from each rule's "Fix safety" section: a fix is safe when the model sees what it
# saw before (PC007 prints the closing tag the template printed on the earlier turn); it is
# unsafe when the model then sees something else: a frozen date (PC001), its earlier
# reasoning (PC002, PC003), arguments written with other separators (PC004).
SAFETY = {"PC001": "unsafe", "PC002": "unsafe", "PC003": "unsafe", "PC004": "unsafe", "PC007": "safe"}


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def three_files(tmp_path, monkeypatch):
    """a: PC007 (a safe fix), b: PC002 (unsafe), c: PC001 (unsafe)."""
    for name, fixture in (
        ("a.jinja", "PC007_text_after_history.jinja"),
        ("b.jinja", "PC002_history_rewrite.jinja"),
        ("c.jinja", "PC001_live_clock.jinja"),
    ):
        shutil.copyfile(CORPUS / fixture, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return {name: (tmp_path / name).read_bytes() for name in ("a.jinja", "b.jinja", "c.jinja")}


def test_every_fix_declares_its_safety_and_its_page_says_it():
    fixable = {rule.RULE.code: rule.RULE.fix_safety for rule in RULES if rule.RULE.fix_safety is not None}
    assert {code: str(safety) for code, safety in fixable.items()} == SAFETY
    for rule in RULES:
        code, out, _ = run("rule", rule.RULE.code)
        assert code == 0
        section = out.split("## Fix safety", 1)[1].split("\n## ", 1)[0]
        expected = SAFETY.get(rule.RULE.code)
        if expected == "safe":
            assert "This fix is safe" in section, rule.RULE.code
        elif expected == "unsafe":
            assert "This fix is unsafe" in section and "--unsafe-fixes" in section, rule.RULE.code
        else:
            assert "No automatic fix" in section, rule.RULE.code


def test_rules_lists_each_fix_s_safety():
    code, out, _ = run("rules")
    assert code == 0
    columns = {line.split()[0]: line.split()[3] for line in out.splitlines()}
    assert {code: columns[code] for code in SAFETY} == {code: f"{safety}-fix" for code, safety in SAFETY.items()}
    assert columns["PC006"] != "safe-fix" and columns["PC006"] != "unsafe-fix"


def test_the_check_ends_with_what_is_fixable(tmp_path, monkeypatch):
    three_files(tmp_path, monkeypatch)
    code, out, _ = run("a.jinja", "b.jinja", "c.jinja", "--frozen-date", FROZEN)
    assert code == 1
    assert out.splitlines()[-2:] == ["Found 3 findings (3 failing).", "[*] 1 fixable with --fix (2 more with --unsafe-fixes)"]
    code, out, _ = run("b.jinja", "c.jinja")
    assert out.splitlines()[-1] == "[*] 2 fixable with --fix --unsafe-fixes"
    code, out, _ = run("a.jinja", "b.jinja", "c.jinja", "--unsafe-fixes")
    assert out.splitlines()[-1] == "[*] 3 fixable with --fix"


def test_a_finding_without_a_fix_counts_as_none():
    code, out, _ = run(
        str(CORPUS / "PC006_generation_prompt_mismatch.jinja"), str(CORPUS / "PC005_nondeterministic_render.jinja")
    )
    assert code == 1
    assert not any(line.startswith("[*]") for line in out.splitlines())


def test_fix_applies_safe_fixes_only_and_says_what_remains(tmp_path, monkeypatch):
    original = three_files(tmp_path, monkeypatch)
    code, out, err = run("a.jinja", "b.jinja", "c.jinja", "--fix", "--frozen-date", FROZEN)
    assert code == 1  # PC002 and PC001 still fail
    assert (tmp_path / "a.jinja").read_bytes() != original["a.jinja"]
    assert (tmp_path / "b.jinja").read_bytes() == original["b.jinja"]
    assert (tmp_path / "c.jinja").read_bytes() == original["c.jinja"]
    lines = out.splitlines()
    assert lines[0].startswith("a.jinja:29:8: fixed PC007 [text-after-history]: ")
    assert not any(": fixed PC00" in line for line in lines if not line.startswith("a.jinja"))
    assert lines[-2:] == ["Found 3 findings (1 fixed, 2 remaining: 2 failing).", "[*] 2 fixable with --fix --unsafe-fixes"]


def test_unsafe_fixes_applies_the_rest(tmp_path, monkeypatch):
    original = three_files(tmp_path, monkeypatch)
    code, out, _ = run("a.jinja", "b.jinja", "c.jinja", "--fix", "--unsafe-fixes", "--frozen-date", FROZEN)
    assert code == 0
    assert all((tmp_path / name).read_bytes() != before for name, before in original.items())
    assert out.splitlines()[-1] == "Found 3 findings (3 fixed, 0 remaining)."


def test_unsafe_fixes_from_the_configuration(tmp_path, monkeypatch):
    original = three_files(tmp_path, monkeypatch)
    (tmp_path / "pyproject.toml").write_text("[tool.tmpl-lint]\nunsafe-fixes = true\n")
    code, out, _ = run("b.jinja", "--fix", "--frozen-date", FROZEN)
    assert code == 0
    assert (tmp_path / "b.jinja").read_bytes() != original["b.jinja"]
    assert out.splitlines()[-1] == "Found 1 finding (1 fixed, 0 remaining)."
    # --no-unsafe-fixes overrides the file, as ruff's does
    code, out, _ = run("c.jinja", "--fix", "--no-unsafe-fixes", "--frozen-date", FROZEN)
    assert code == 1
    assert (tmp_path / "c.jinja").read_bytes() == original["c.jinja"]


def test_the_fix_hook_applies_safe_fixes_only():
    hooks = {hook["id"]: hook for hook in yaml.safe_load((PROJECT / ".pre-commit-hooks.yaml").read_text())}
    assert hooks["tmpl-lint-fix"]["entry"].split()[:2] == ["tmpl-lint", "--fix"]
    assert "--unsafe-fixes" not in hooks["tmpl-lint-fix"]["entry"]


def test_each_fix_prints_the_template_lines_it_edited(tmp_path, monkeypatch):
    before = three_files(tmp_path, monkeypatch)["a.jinja"].decode().splitlines()
    code, out, _ = run("a.jinja", "--fix", "--frozen-date", FROZEN)
    assert code == 0
    after = (tmp_path / "a.jinja").read_text().splitlines()
    assert len(before) == len(after)  # this fix edits lines in place: the same numbers
    edited = [number for number, (old, new) in enumerate(zip(before, after), 1) if old != new]
    assert edited == [5, 8]
    expected = []
    for number in edited:
        expected += [f"{number:>5} - {before[number - 1]}", f"{number:>5} + {after[number - 1]}"]
    lines = out.splitlines()
    assert lines[1 : 1 + len(expected)] == expected


def test_a_one_line_json_template_is_reviewed_by_its_own_lines(tmp_path, monkeypatch):
    text = (CORPUS / "PC007_text_after_history.jinja").read_text()
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": text}, ensure_ascii=False))
    monkeypatch.chdir(tmp_path)
    code, patch, err = run("tokenizer_config.json", "--diff", "--frozen-date", FROZEN)
    assert code == 1
    # The patch is of the file: its one line holding the template, removed and added; it applies.
    assert patch.count("\n-{") == 1 and patch.count("\n+{") == 1
    applies = subprocess.run(["git", "apply", "--check"], input=patch, text=True, cwd=tmp_path, capture_output=True)
    assert (applies.returncode, applies.stderr) == (0, "")
    # The fix lines (on standard error under --diff) show the template's own lines 5 and 8.
    lines = err.splitlines()
    assert lines[0].startswith("tokenizer_config.json:1:")
    assert " would fix PC007 [text-after-history]: " in lines[0]
    original = text.splitlines()
    assert lines[1] == f"    5 - {original[4]}"
    assert lines[2].startswith("    5 +         {%- if ns.is_tool %}")
    assert lines[3] == f"    8 - {original[7]}"


def test_a_template_written_on_one_line_is_shown_around_what_changed(tmp_path, monkeypatch):
    # The fixture's lines joined: one template line of 1,500 characters, edited in two places.
    text = (CORPUS / "PC007_text_after_history.jinja").read_text().replace("\n", "")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": text}, ensure_ascii=False))
    monkeypatch.chdir(tmp_path)
    code, _, err = run("tokenizer_config.json", "--diff")
    assert code == 1
    removed, added = err.splitlines()[1:3]
    # The lines part after "{%- " of the first `{%- set ns.is_tool = false %}` (the fix
    # writes "{%- if ns.is_tool %}..." there), and meet again at the second's "{%- set".
    first_edit = text.index("{%- set ns.is_tool = false %}") + len("{%- ")
    last_edit_end = text.rindex("{%- set ns.is_tool = false %}", 0, text.index("{%- for tool in"))
    # from 40 characters before the first edit to 40 after the last, cut with "…" either side
    assert removed == f"    1 - …{text[first_edit - 40 : last_edit_end + 40]}…"
    assert added.startswith(f"    1 + …{text[first_edit - 40 : first_edit]}if ns.is_tool %}}")
    assert added.endswith("…") and len(added) < len(text)


@pytest.mark.parametrize("output_format", ["json", "sarif"])
def test_machine_formats_carry_each_fix_s_applicability(tmp_path, monkeypatch, output_format):
    three_files(tmp_path, monkeypatch)
    shutil.copyfile(CORPUS / "PC006_generation_prompt_mismatch.jinja", tmp_path / "d.jinja")
    code, out, _ = run("a.jinja", "b.jinja", "d.jinja", "--format", output_format)
    assert code == 1
    if output_format == "json":
        fixes = {finding["code"]: finding["fix"] for finding in json.loads(out)}
    else:
        results = json.loads(out)["runs"][0]["results"]
        fixes = {result["ruleId"]: result["properties"]["fix"] for result in results}
    assert fixes["PC007"]["applicability"] == "safe"
    assert fixes["PC002"]["applicability"] == "unsafe"
    assert fixes["PC006"] is None


@needs_shared
def test_mistral_nemo_promises_no_fix_its_fixer_declines_and_fix_speaks_of_what_check_lists(tmp_path, monkeypatch):
    """Mistral Nemo: its PC004 message promised that --fix rewrites the arguments, and --fix
    then said "not fixed"; --fix also said "not fixed" of a PC003 at 51:16, which the check
    shows only as the 27:50 finding's related location."""
    shutil.copyfile(SHARED_TEMPLATES / "mistralai--Mistral-Nemo-Instruct-2407.jinja", tmp_path / "chat_template.jinja")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("chat_template.jinja", "--format", "json")
    assert code == 1
    findings = json.loads(out)
    assert [(f["code"], f["line"], f["column"]) for f in findings] == [("PC003", 27, 50), ("PC004", 59, 46)]
    assert [(r["line"], r["column"]) for r in findings[0]["related"]] == [(51, 16)]
    assert [f["fix"] for f in findings] == [None, None]  # neither rule makes an edit here
    pc004 = findings[1]
    assert "--fix" not in pc004["message"]
    code, text, _ = run("chat_template.jinja", "-q")
    pc004_line = text.splitlines()[1]
    assert pc004_line.endswith(
        "; no automatic fix: the whole tool call is serialised (its name with its arguments), so the arguments cannot be "
        "written on their own: write them apart, as the rule's page shows, or pass --tool-args-style spaced if the model "
        "writes spaced JSON"
    )
    code, out, _ = run("chat_template.jinja", "--fix", "--unsafe-fixes")
    assert code == 1
    said = [line for line in out.splitlines() if ": not fixed " in line]
    assert [line.split(": not fixed ")[0] for line in said] == ["chat_template.jinja:27:50", "chat_template.jinja:59:46"]
    assert out.splitlines()[-1] == (
        "Left to fix by hand: PC003, PC004 (`tmpl-lint rule CODE` shows what to write instead; "
        "`{# tmpl-lint: ignore[CODE] #}` on its line suppresses one)."
    )
