"""PC100: a divergence the prover measures and no rule explains."""

from pathlib import Path

import pytest
from helpers import CORPUS

from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.inputs import TemplateSource

pytestmark = pytest.mark.no_fork


def prove(text: str):
    return lint_source(TemplateSource(Path("t.jinja"), None, text, "jinja"), prove=ProveOptions())


def test_fixture_diverges_at_the_header_the_message_count_decides_before_any_message():
    # A printed count is PC003's now; a header the count only chooses is not.
    (finding,) = prove((CORPUS / "PC100_unstable_render.jinja").read_text())
    assert (finding.code, finding.line, finding.column) == ("PC100", 1, 1)
    divergence = finding.proof.divergence
    # the first character that differs is "New" against "Continued", counted by hand
    assert divergence.first_divergence == len("<|im_start|>system\n")
    assert (divergence.unit, divergence.cause) == ("char", "system")
    assert divergence.reusable_tokens == 16  # one full 16-character block before it


def test_a_static_rule_that_explains_the_divergence_leaves_no_pc100():
    text = '{{- strftime_now("%Y-%m-%d") }}{% for m in messages %}{{ m.content }}{% endfor %}'
    assert [f.code for f in prove(text)] == ["PC001"]
