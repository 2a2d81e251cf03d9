import pytest
from helpers import lint_fixture, lint_text

pytestmark = pytest.mark.no_fork


def test_fixture():
    codes, findings = lint_fixture("PC000_syntax_error.jinja")
    assert codes == [("PC000", 3, 1)]
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
