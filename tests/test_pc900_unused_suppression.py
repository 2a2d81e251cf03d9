from helpers import CORPUS, at, lint_fixture, lint_text


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
