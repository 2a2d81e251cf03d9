import pytest
from helpers import at, lint_fixture, lint_text

pytestmark = pytest.mark.no_fork


def test_fixture():
    codes, findings = lint_fixture("PC000_syntax_error.jinja")
    assert codes == [("PC000", 3, 5)]  # the unknown tag's name: `{%- endif %}`
    assert "unknown tag 'endif'" in findings[0].message
    assert findings[0].severity == "error"


@pytest.mark.parametrize(
    "source",
    [
        # transformers' extension tag parses
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
        # loop controls are enabled
        "{% for m in messages %}{% if m.role == 'x' %}{% continue %}{% endif %}{{ m.content }}{% endfor %}",
    ],
)
def test_transformers_syntax_parses(source):
    assert lint_text(source)[0] == []


def test_unclosed_block_reports_last_line():
    codes, _ = lint_text("{% if messages %}\nhello\n")
    assert codes == [("PC000", 2, 1)]


@pytest.mark.parametrize(
    ("source", "anchor", "nth"),
    [
        # the lexer stops at a `}` that closes nothing: column 37, counted by hand
        ("{% for m in messages %}{{ m.content }\n{% endfor %}\n", "}\n", 0),
        ("hi\n{% if x %}{{ x ) }}{% endif %}\n", ")", 0),
        # the parser stops at the second `}}`, not the first on the line
        ("{{ a }}{{ b + }}\n", "}}", 1),
        ("{% if x %}{{ x | }}{% endif %}", "}}", 0),
        ("{% for m in messages %}\n{% if x %}\n  {% endfor %}\n", "endfor", 0),
    ],
)
def test_a_syntax_error_points_at_its_column(source, anchor, nth):
    assert lint_text(source)[0] == [at("PC000", source, anchor, nth)]


def test_the_stray_brace_is_at_column_37():
    assert lint_text("{% for m in messages %}{{ m.content }\n{% endfor %}\n")[0] == [("PC000", 1, 37)]
