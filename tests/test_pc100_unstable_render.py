"""PC100: a divergence the prover measures and no rule explains.

``PC100_reply_reasoning_dropped.jinja`` drops the reasoning of every past answer, as gpt-oss's
format does for final answers: only the reply just generated differs from its history render,
so that finding is informational (the model's format, costing the reply and not the history
before it).
"""

from pathlib import Path

from click.testing import CliRunner
from helpers import CORPUS

from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.cli import main
from tmpl_lint.fixer import found_by_proof
from tmpl_lint.prover import Prover
from tmpl_lint.sources import TemplateSource, collect


def prove(text: str):
    return lint_source(TemplateSource(Path("t.jinja"), None, text, "jinja"), prove=ProveOptions())


def test_fixture_diverges_at_the_turn_count_before_any_message():
    (finding,) = prove((CORPUS / "PC100_unstable_render.jinja").read_text())
    assert (finding.code, finding.line, finding.column) == ("PC100", 1, 1)
    divergence = finding.proof.divergence
    # the first character that differs is the count's digit, counted by hand
    assert divergence.first_divergence == len("<|im_start|>system\nTurns so far: ")
    assert (divergence.unit, divergence.cause) == ("char", "system")
    assert divergence.reusable_tokens == 32  # two full 16-character blocks before it


def test_a_static_rule_that_explains_the_divergence_leaves_no_pc100():
    text = '{{- strftime_now("%Y-%m-%d") }}{% for m in messages %}{{ m.content }}{% endfor %}'
    assert [f.code for f in prove(text)] == ["PC001"]


REPLY = CORPUS / "PC100_reply_reasoning_dropped.jinja"


def test_the_reply_s_own_reasoning_left_out_of_history_is_informational():
    (source,), _ = collect([REPLY])
    (finding,) = lint_source(source, prove=ProveOptions())
    assert (finding.code, finding.severity, finding.line, finding.column) == ("PC100", "info", 1, 1)
    assert finding.message == (
        "history leaves out the reasoning of the reply the model just generated, as the model's format has it: "
        "each turn recomputes that reply, not the history before it"
    )
    divergence = finding.proof.divergence
    # "<|user|>What is the capital of France?<|end|><|assistant|>" is 58 characters: the reply's
    # "<think>" is where the history render ("Paris.") parts from what the model generated.
    assert (divergence.check, divergence.first_divergence, divergence.message_index) == ("b", 58, 1)
    assert divergence.drops_reply_reasoning
    result = CliRunner().invoke(main, [str(REPLY)])
    assert result.exit_code == 0  # informational findings never fail a run
    assert result.stdout.splitlines()[-1] == "Found 1 finding (1 info)."


def test_the_fixer_does_not_count_it_as_failing_and_other_divergences_do():
    text = REPLY.read_text()
    assert found_by_proof(Prover(text, None).run({}), []) == set()
    # The same template counting its turns in the system line: every turn rewrites the start.
    counting = "{{- 'turns: ' ~ (messages|length) ~ '\\n' }}" + text
    assert found_by_proof(Prover(counting, None).run({}), []) == {("PC100", "system")}
