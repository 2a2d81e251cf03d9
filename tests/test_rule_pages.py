import json

import pytest
from click.testing import CliRunner

from tmpl_lint.cli import main
from tmpl_lint.rules import RULES, SECTIONS, page

pytestmark = pytest.mark.no_fork


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.RULE.code)
def test_every_rule_page_has_every_section_with_content(rule):
    text = page(rule)
    positions = []
    for section in SECTIONS:
        heading = f"## {section}\n"
        assert heading in text, f"{rule.RULE.code} has no {section!r}"
        positions.append(text.index(heading))
        body = text.split(heading, 1)[1].split("\n## ", 1)[0]
        assert body.strip(), f"{rule.RULE.code}: {section!r} is empty"
    assert positions == sorted(positions)
    assert "```jinja" in text.split("## Example", 1)[1].split("## Use instead", 1)[0]


def test_rule_command_prints_the_page_by_code_or_name():
    result = CliRunner().invoke(main, ["rule", "PC002"])
    assert result.exit_code == 0
    assert result.stdout.startswith("# history-rewrite (PC002)\n")
    assert CliRunner().invoke(main, ["rule", "history-rewrite"]).stdout == result.stdout


def test_unknown_rule_is_an_error():
    result = CliRunner().invoke(main, ["rule", "PC777"])
    assert result.exit_code == 2
    assert result.stderr == "tmpl-lint: error: unknown rule 'PC777' (see `tmpl-lint rules`)\n"


def test_rules_lists_every_code():
    result = CliRunner().invoke(main, ["rules"])
    assert [line.split()[0] for line in result.stdout.splitlines()] == [rule.RULE.code for rule in RULES]


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.RULE.code)
def test_examples_show_escapes_as_written(rule):
    # A "\n" in an example must stay two characters, not break the string across lines.
    blocks = page(rule).split("```jinja\n")[1:]
    for block in blocks:
        for line in block.split("```", 1)[0].splitlines():
            assert line.count('"') % 2 == 0 and line.count("'") % 2 == 0, f"{rule.RULE.code}: {line!r}"


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.RULE.code)
def test_every_rule_has_its_fixture_and_its_test_file_beside_it(rule):
    from helpers import CORPUS, PROJECT

    module = rule.module.__name__.rsplit(".", 1)[1]  # pc002_history_rewrite
    assert module == f"{rule.RULE.code.lower()}_{rule.RULE.name.replace('-', '_')}"
    assert (PROJECT / "tests" / f"test_{module}.py").is_file()
    assert list(CORPUS.glob(f"{rule.RULE.code}_*.jinja")), f"no corpus/{rule.RULE.code}_*.jinja"


def test_the_registry_finds_every_rule_module():
    from helpers import PROJECT

    modules = sorted(path.stem for path in (PROJECT / "rules").glob("pc[0-9][0-9][0-9]_*.py"))
    assert [rule.module.__name__.rsplit(".", 1)[1] for rule in RULES] == modules
    assert len({rule.RULE.code for rule in RULES}) == len(RULES)


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.RULE.code)
def test_every_page_states_what_fails_the_run(rule):
    text = page(rule)
    if rule.RULE.reports is None:
        assert "did not reproduce it, it is reported as unproven" in text
        assert "`--strict` makes it fail" in text and "`--no-prove`" in text
    else:
        assert "its findings fail the run at their severity" in text


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.RULE.code)
def test_fix_safety_says_no_automatic_fix_exactly_when_the_rule_has_none(rule):
    # PC006's page described a fix that `--fix` says does not exist ("no automatic fix for
    # this rule").
    safety = page(rule).split("## Fix safety\n", 1)[1]
    listed = CliRunner().invoke(main, ["rules"]).stdout
    (row,) = [line for line in listed.splitlines() if line.startswith(rule.RULE.code + " ")]
    has_fix = rule.fix is not None
    assert safety.startswith("No automatic fix") is not has_fix
    # a fix declares its safety, which `tmpl-lint rules` lists and the page's section opens with
    assert (rule.RULE.fix_safety is not None) is has_fix
    assert (f" {rule.RULE.fix_safety}-fix " in f" {row} ") is has_fix
    assert safety.startswith(f"This fix is {rule.RULE.fix_safety}") is has_fix
    assert ("Fix is sometimes available." in page(rule)) is has_fix


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.RULE.code)
def test_every_rule_page_s_example_renders_and_is_reported_by_its_rule(rule, tmp_path):
    """`tmpl-lint check` on the page's Example reports the rule, and a rule whose findings
    the proof checks has its Example proven (PC002's reverse scan without `break` was not
    flagged at all; PC003's was not reproduced). The Example renders: PC007's and PC900's
    were fragments that failed on every conversation (PC102, and PC007 "not provable")."""
    example = page(rule).split("## Example\n", 1)[1].split("## Use instead", 1)[0]
    path = tmp_path / "example.jinja"
    path.write_text(example.split("```jinja\n", 1)[1].split("```", 1)[0])
    result = CliRunner().invoke(main, ["check", str(path), "--format", "json"])
    findings = json.loads(result.stdout)
    reported = [finding for finding in findings if finding["code"] == rule.RULE.code]
    assert reported, f"{rule.RULE.code}: its Example is not reported by it"
    if rule.RULE.code != "PC102":
        assert "PC102" not in {finding["code"] for finding in findings}, f"{rule.RULE.code}: its Example does not render"
    assert [finding["unproven"] for finding in reported] == [False] * len(reported)
    if rule.RULE.reports is None:  # a hypothesis of the analysis, which the renders check
        assert {finding["proof"]["status"] for finding in reported} == {"proven"}, f"{rule.RULE.code}: not proven"


def use_instead(rule) -> str:
    """The template of a page's "Use instead", or "" where it shows none (PC103: a server setting)."""
    section = page(rule).split("## Use instead\n", 1)[-1].split("\n## ", 1)[0] if "## Use instead" in page(rule) else ""
    return section.split("```jinja\n", 1)[1].split("```", 1)[0] if "```jinja\n" in section else ""


@pytest.mark.parametrize("rule", [rule for rule in RULES if use_instead(rule)], ids=lambda rule: rule.RULE.code)
def test_every_rule_page_s_use_instead_renders_and_passes(rule, tmp_path):
    """The page's "Use instead" is a template `tmpl-lint check` passes: it renders (PC004's,
    PC007's and PC900's were fragments that failed on every conversation, PC102) and its
    rule does not report it."""
    path = tmp_path / "instead.jinja"
    path.write_text(use_instead(rule))
    result = CliRunner().invoke(main, ["check", str(path), "--format", "json"])
    assert [(finding["code"], finding["fails"]) for finding in json.loads(result.stdout)] == []
    assert result.exit_code == 0
