import pytest
from helpers import at, lint_fixture, lint_text


def test_fixture_clock_through_macro():
    codes, findings = lint_fixture("PC001_live_clock.jinja")
    assert codes == [("PC001", 3, 28)]
    assert findings[0].switch is None
    assert findings[0].source_line.strip().startswith('{{- "Current date: "')


def test_fixture_default_system_prompt_names_the_switch():
    codes, findings = lint_fixture("PC001_live_clock_default_system.jinja")
    assert codes == [("PC001", 2, 21)]
    finding = findings[0]
    assert "default system prompt" in finding.message
    assert finding.switch.name == "today"
    assert finding.switch.default_is_stable is False
    assert isinstance(finding.switch.stable_value, str)
    assert "chat_template_kwargs" in finding.full_message()
    assert "--default-chat-template-kwargs" in finding.full_message()


@pytest.mark.parametrize("fixture", ["clean_clock_never_printed.jinja", "clean_fixed_date_default.jinja"])
def test_clean_fixtures(fixture):
    assert lint_fixture(fixture)[0] == []


@pytest.mark.parametrize(
    ("source", "anchors"),
    [
        # printed directly
        ('{{ strftime_now("%Y") }}', ["strftime_now"]),
        # through a set and a namespace
        ('{% set ns = namespace(d=strftime_now("%Y")) %}{{ "x" + ns.d }}', ["strftime_now"]),
        # decides what is printed without being printed
        ('{% if strftime_now("%d") == "01" %}monthly{% endif %}', ["strftime_now"]),
        # computed, never printed: noop
        ('{% set today = strftime_now("%Y") %}{{ messages[0].content }}', []),
        # a local macro that shadows the name is not the clock: noop
        ("{% macro strftime_now(f) %}2024{% endmacro %}{{ strftime_now('%Y') }}", []),
        # a template variable named like a date, not a call: noop
        ("{{ current_date }}", []),
    ],
)
def test_cases(source, anchors):
    assert lint_text(source)[0] == [at("PC001", source, anchor) for anchor in anchors]
