"""A finding is built once: frozen, completed by ``findings.assemble``, and what the proof
adds to its message is a field of the message, not text appended to it."""

import dataclasses
import pickle
from pathlib import Path

import pytest
from helpers import CORPUS, at, prove_fixture

from tmpl_lint.checker import lint_with_facts
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.rules.pc003_future_dependent_render import HARMONY_DROP, LooksAhead

LOOK_AHEAD = (CORPUS / "PC003_lookahead.jinja").read_text(encoding="utf-8")
# what PC003's check says of `messages[loop.index:]`, written out by hand
SAID = "`messages[...:]` looks ahead at later messages: this message renders differently once they exist"


def test_a_finding_crosses_processes_without_its_places_in_the_parse_tree():
    _, (finding,) = lint_with_facts(TemplateSource(Path("t.jinja"), None, LOOK_AHEAD, "jinja"))
    assert (finding.code, finding.line, finding.column) == at("PC003", LOOK_AHEAD, "messages[loop.index:]")
    assert finding.site is not None and finding.site.node is not None  # a fix edits there
    crossed = pickle.loads(pickle.dumps(finding))
    assert (crossed.site, crossed.related) == (None, ())
    assert crossed == finding and crossed.message == finding.message == SAID
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.message = "edited"  # type: ignore[misc]


def test_the_proof_names_harmonys_analysis_drop_as_a_field_of_the_message():
    # The look-ahead drops the reasoning of turns answered since: the proof's divergence
    # shows "<|channel|>analysis" left out of the next turn.
    codes, (finding,) = prove_fixture("PC003_lookahead.jinja")
    assert codes == [at("PC003", LOOK_AHEAD, "messages[loop.index:]")]
    assert finding.body == LooksAhead("messages[...:]", harmony_drop=True)
    assert finding.message == f"{SAID}: {HARMONY_DROP}"
    assert str(dataclasses.replace(finding.body, harmony_drop=False)) == SAID
