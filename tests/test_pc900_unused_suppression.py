import pytest
from helpers import CORPUS, at, lint_fixture, lint_text

pytestmark = pytest.mark.no_fork


def test_line_suppression():
    source = '{{ strftime_now("%Y") }} {# tmpl-lint: ignore[PC001] #}\n{{ strftime_now("%d") }}\n'
    assert lint_text(source)[0] == [("PC001", 2, 4)]


def test_file_suppression_and_all_codes():
    source = '{# tmpl-lint: ignore-file[PC001] #}\n{{ strftime_now("%Y") }}\n{{ strftime_now("%d") }}\n'
    assert lint_text(source)[0] == []
    source = '{{ strftime_now("%Y") }}{# tmpl-lint: ignore #}\n'
    assert lint_text(source)[0] == []


def test_unused_suppression_is_reported():
    source = "{{ messages[0].content }} {#- tmpl-lint: ignore[PC004] -#}\n"
    codes, findings = lint_text(source)
    assert codes == [at("PC900", source, "{#-")]
    assert findings[0].message == "the suppression of PC004 suppresses nothing on this line"


def test_a_suppression_of_pc900_on_the_line_silences_it_as_ruff_s_noqa_of_ruf100():
    source = "{{ messages[0].content }} {# tmpl-lint: ignore[PC004] #}{# tmpl-lint: ignore[PC900] #}\n"
    assert lint_text(source)[0] == []
    # alone, a suppression of PC900 that silences nothing is itself unused
    source = "{{ messages[0].content }} {# tmpl-lint: ignore[PC900] #}\n"
    codes, findings = lint_text(source)
    assert codes == [at("PC900", source, "{#")]
    assert findings[0].message == "the suppression of PC900 suppresses nothing on this line"


def test_a_code_no_rule_has_is_named_as_such():
    # `PC04` for PC004: it would suppress nothing, and says why
    source = '{{ strftime_now("%Y") }} {# tmpl-lint: ignore[PC04, PC001] #}\n'
    codes, findings = lint_text(source)
    assert codes == [at("PC900", source, "{#")]
    assert findings[0].message == "the suppression names PC04, which is no rule code: it suppresses nothing"


def test_suppression_of_another_code_does_not_hide():
    source = '{{ strftime_now("%Y") }} {# tmpl-lint: ignore[PC004] #}\n'
    assert [code for code, _, _ in lint_text(source)[0]] == ["PC001", "PC900"]


def test_suppression_text_inside_a_string_suppresses_nothing():
    source = '{{ strftime_now("%Y") }}{{ "{# tmpl-lint: ignore #}" }}\n'
    assert lint_text(source)[0] == [("PC001", 1, 4)]


def test_fixture():
    path = CORPUS / "PC900_unused_suppression.jinja"
    source = path.read_text()
    assert lint_fixture("PC900_unused_suppression.jinja")[0] == [at("PC900", source, "{#-")]


def test_a_code_that_suppresses_nothing_is_named_where_the_others_suppress_something():
    """ruff names a noqa's unused codes one by one: `ignore[PC003, PC001]` suppresses the
    PC003 of its line, and its PC001 suppresses nothing."""
    source = "{%- for m in messages -%}{{ m.content }}{% if loop.last %}(X){% endif %}{# tmpl-lint: ignore[PC003, PC001] #}{%- endfor -%}\n"
    codes, findings = lint_text(source)
    assert codes == [at("PC900", source, "{#")]
    assert findings[0].message == "the suppression of PC001 suppresses nothing on this line"
    # a code no rule has, and a rule's code that suppresses nothing, both said
    source = source.replace("PC003, PC001", "PC003, PC04, PC001")
    codes, findings = lint_text(source)
    assert codes == [at("PC900", source, "{#")]
    assert findings[0].message == "the suppression names PC04, which is no rule code, and PC001 suppresses nothing on this line"
    # every code used: nothing to say
    assert lint_text(source.replace("PC003, PC04, PC001", "PC003"))[0] == []


def test_a_template_that_does_not_parse_reports_no_suppression_unused_but_a_code_no_rule_has():
    """Line 2 does not parse: the rules never saw line 1's live clock, so its suppression
    cannot be said to suppress nothing. A typo is one whatever the template."""
    source = '{{ strftime_now("%Y") }}{# tmpl-lint: ignore[PC001] #}\n{% for m in messages %}{{ m.content }}{% endif %}\n'
    assert lint_text(source)[0] == [at("PC000", source, "endif")]
    source = source.replace("PC001", "PC01")
    codes, findings = lint_text(source)
    assert codes == [at("PC900", source, "{#"), at("PC000", source, "endif")]
    assert findings[0].message == "the suppression names PC01, which is no rule code: it suppresses nothing"


def test_a_code_the_run_does_not_check_is_not_judged_unused():
    # The hooks run `tmpl-lint --ignore PC103`: a suppression of PC103 that the plain check
    # needs (gpt-oss) must not fail the hook as unused, nor one a project's ignore covers.
    from pathlib import Path

    from tmpl_lint.checker import lint_source
    from tmpl_lint.inputs import TemplateSource
    from tmpl_lint.selection import Selection

    source = '{{ messages[0].content }} {# tmpl-lint: ignore[PC004, PC001] #}\n{{ strftime_now("%Y") }}\n'
    template = TemplateSource(Path("inline.jinja"), None, source, "jinja")

    def unused(selection):
        return [(f.line, f.column, f.message) for f in lint_source(template, selection) if f.code == "PC900"]

    column = source.index("{#") + 1
    assert unused(Selection()) == [(1, column, "the suppression of PC004, PC001 suppresses nothing on this line")]
    # PC004 is not checked: only PC001 is judged, and it suppresses nothing on line 1
    assert unused(Selection.parse(None, ["PC004"])) == [(1, column, "the suppression of PC001 suppresses nothing on this line")]
    # neither is checked (the command line's --ignore over everything else): nothing to judge
    assert unused(Selection.parse(None, None, also_ignore=["PC004", "PC001"])) == []
