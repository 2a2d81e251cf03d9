import pytest
from helpers import at, lint_fixture, lint_text


def test_fixture_unguarded_is_a_warning():
    codes, findings = lint_fixture("PC004_tool_args_reserialized.jinja")
    assert codes == [("PC004", 5, 89)]
    assert findings[0].severity == "warning"


def test_fixture_guarded_is_info():
    codes, findings = lint_fixture("PC004_tool_args_guarded.jinja")
    assert codes == [("PC004", 8, 43)]
    assert findings[0].severity == "info"


@pytest.mark.parametrize(
    ("source", "anchors"),
    [
        # the whole function object, arguments inside
        ("{% for m in messages %}{% for c in m.tool_calls %}{{ c.function | tojson }}{% endfor %}{% endfor %}", ["tojson"]),
        # first tool call by index, then .function
        ("{% for m in messages %}{% set c = m.tool_calls[0].function %}{{ c.arguments|tojson }}{% endfor %}", ["tojson"]),
        # guarded with a ternary
        (
            "{% for m in messages %}{% for c in m.tool_calls %}{{ c.arguments if c.arguments is string else c.arguments|tojson }}{% endfor %}{% endfor %}",
            ["tojson"],
        ),
        # tool schemas are not arguments: noop
        ("{% for t in tools %}{{ t | tojson }}{% endfor %}", []),
        # tool-call names are not arguments: noop
        ("{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.name | tojson }}{% endfor %}{% endfor %}", []),
    ],
)
def test_cases(source, anchors):
    assert lint_text(source)[0] == [at("PC004", source, anchor) for anchor in anchors]


def test_guarded_severity_per_case():
    _, findings = lint_text(
        "{% for m in messages %}{% for c in m.tool_calls %}{{ c.arguments if c.arguments is string else c.arguments|tojson }}{% endfor %}{% endfor %}"
    )
    assert findings[0].severity == "info"
