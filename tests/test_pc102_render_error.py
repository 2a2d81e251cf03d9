"""PC102: a template that fails on every conversation tried cannot be proven, and says why."""

from pathlib import Path

import pytest
from helpers import CORPUS

from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.inputs import TemplateSource

pytestmark = pytest.mark.no_fork


def test_fixture_reports_the_templates_own_error():
    path = CORPUS / "PC102_render_error.jinja"
    findings = lint_source(TemplateSource(path, None, path.read_text(), "jinja"), prove=ProveOptions())
    assert [(f.code, f.line, f.column) for f in findings] == [("PC102", 1, 1)]
    reason = "This template is for training data, not for chat requests."
    assert findings[0].message == f"the template fails on every conversation tried: {reason}"
    assert (findings[0].proof.status, findings[0].proof.reason) == ("not-provable", reason)


def test_a_template_that_renders_some_conversations_is_not_pc102():
    text = "{% if tools %}{{ raise_exception('no tools') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    findings = lint_source(TemplateSource(Path("t.jinja"), None, text, "jinja"), prove=ProveOptions())
    assert findings == []
