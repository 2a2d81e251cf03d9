"""Issue 33: findings for the settings deployments run.

- a break proven under any switch value fails the run, and names the values that break and
  those that are stable; a project's pinned chat-template-kwargs are the only values proven;
- a loss bounded whatever the session's length (only the reply's end-of-turn marker) is info,
  with the bound stated;
- one break, one named rule: a divergence in the generation prompt's own text is PC006's.

Each fixture prints what it tests by construction (read it): the expectations are that text.
"""

import json
from pathlib import Path

from click.testing import CliRunner
from helpers import CORPUS, SHARED_TEMPLATES, needs_shared

from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.cli import main
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.proofs import ProofStatus

THINKING_OFF = "PC006_breaks_when_thinking_off.jinja"


def prove(name: str, **options):
    text = (CORPUS / name).read_text(encoding="utf-8")
    return lint_source(TemplateSource(Path(name), None, text, "jinja"), prove=ProveOptions(engine="hf", **options))


def by_code(findings, code: str):
    (finding,) = [finding for finding in findings if finding.code == code]
    return finding


def test_a_template_stable_by_default_that_breaks_with_thinking_off_fails_and_names_the_value():
    finding = by_code(prove(THINKING_OFF), "PC006")
    assert (finding.severity, finding.fails(), finding.proof.status) == ("warning", True, ProofStatus.PROVEN)
    (values,) = finding.proof.switches
    # the template prints the empty think block only when enable_thinking is false
    assert (values.name, values.breaks, values.stable, values.default) == ("enable_thinking", (False,), (True,), "stable")
    assert "breaks when enable_thinking=false (stable when true or unset)" in finding.full_message()
    assert finding.proof.divergence.scenario in ("chat, enable_thinking=false", "agent, enable_thinking=false")


def test_a_pinned_value_is_the_only_one_proven():
    stable = by_code(prove(THINKING_OFF, pinned=(("enable_thinking", True),)), "PC006")
    assert stable.fails() is False and stable.proof.status is ProofStatus.NOT_REPRODUCED
    assert not any("enable_thinking=" in scenario for scenario in stable.proof.scenarios)
    broken = by_code(prove(THINKING_OFF, pinned=(("enable_thinking", False),)), "PC006")
    assert broken.fails() is True
    # the deployment's requests are the plain scenarios, carrying the pinned value
    assert "=" not in broken.proof.divergence.scenario


def test_the_configuration_and_the_flag_pin_the_deployment(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text((CORPUS / THINKING_OFF).read_text(encoding="utf-8"), encoding="utf-8")
    runner = CliRunner()

    def failing(*args: str) -> list[str]:
        result = runner.invoke(main, ["check", str(template), "--format", "json", "--engine", "hf", *args])
        return [finding["code"] for finding in json.loads(result.stdout) if finding["fails"]]

    assert failing() == ["PC006"]
    assert failing("--chat-template-kwargs", '{"enable_thinking": true}') == []
    assert failing("--chat-template-kwargs", '{"enable_thinking": false}') == ["PC006"]
    config = tmp_path / ".tmpl-lint.yaml"
    config.write_text("chat-template-kwargs:\n  enable_thinking: true\n", encoding="utf-8")
    assert failing("--config", str(config)) == []
    config.write_text("chat-template-kwargs: [1]\n", encoding="utf-8")
    result = runner.invoke(main, ["check", str(template), "--config", str(config)])
    assert result.exit_code == 2 and "chat-template-kwargs must map template variables to values" in result.output


def test_an_end_marker_written_otherwise_in_history_is_bounded_and_informational():
    finding = by_code(prove("PC003_end_marker_bounded.jinja"), "PC003")
    assert (finding.severity, finding.fails(), finding.proof.status) == ("info", False, ProofStatus.PROVEN)
    # "</s>" (newest) against "<|im_end|>\n" (history): one 16-character block at most
    assert finding.proof.bound.startswith("only the reply's end-of-turn marker differs: at most 1 block of 16 chars a turn")
    assert "bounded: " in finding.full_message()
    assert finding.proof.divergence.before.endswith("</s>")


def test_a_break_at_the_generation_prompt_is_pc006_whatever_sits_nearby():
    findings = prove("PC006_thinker_beside_loop_last.jinja")
    pc006, pc003 = by_code(findings, "PC006"), by_code(findings, "PC003")
    assert pc006.fails() is True and pc006.line == 12  # the generation prompt's "<think>\n"
    # the loop.last end marker alone is left to PC003, bounded
    assert (pc003.fails(), pc003.severity) == (False, "info")
    assert all(not scenario.endswith("changed between calls") for scenario, _ in pc006.proof.explains)


@needs_shared
def test_harmony_analysis_drop_is_named_under_both_engines():
    # The oracle: gpt-oss's agent history diverges ("history"); the template drops a turn's
    # analysis once a later final answer exists (its look-ahead over loop_messages[loop.index:]).
    text = (SHARED_TEMPLATES / "openai--gpt-oss-120b.jinja").read_text(encoding="utf-8")
    assert "loop_messages[loop.index:]" in text
    source = TemplateSource(Path("openai--gpt-oss-120b.jinja"), None, text, "jinja")
    for engine in ("hf", "vllm"):
        findings = lint_source(source, prove=ProveOptions(engine=engine))
        pc003 = by_code(findings, "PC003")
        assert pc003.fails() and "harmony's analysis drop" in pc003.message, engine
        # under vLLM, its own harmony render's history rewrite is the same break: related to PC003
        standalone = [(f.code, str(f.proof.cause)) for f in findings if f.code == "PC103"]
        assert ("PC103", "history-rewrite") not in standalone, engine
        if engine == "vllm":
            assert [(f.code, str(f.proof.cause)) for f in pc003.related_findings] == [("PC103", "history-rewrite")]


def test_text_after_the_newest_reply_end_marker_is_bounded_info():
    # The reply as the newest message renders "Paris.<|end|>\n</s>"; the next turn has
    # "Paris.<|end|>\n<|user|>": a model stops at <|end|> and never generates the "</s>".
    (finding,) = prove("PC006_eos_after_newest_reply.jinja")
    assert (finding.code, finding.severity, finding.fails()) == ("PC006", "info", False)
    divergence = finding.proof.divergence
    assert divergence.check == "d" and divergence.reply_as_trained == "after-end-marker"
    assert divergence.before.endswith("Paris.<|end|>\n</s>")
    assert finding.proof.bound.startswith("only what follows the reply's end-of-turn marker differs: at most 1 block")
    assert "'</s>' after its end-of-turn marker" in finding.message
