"""PC008: a per-request setting printed before the history, proven by a session whose second
call changes it. Expected offsets are counted by hand from the fixture's text."""

import shutil
import subprocess
import sys
from pathlib import Path

from helpers import CORPUS, SHARED_TEMPLATES, needs_shared

from rules.pc008_switch_before_history import changed_settings, client_change
from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.proofs import Cause, ProofStatus

FIXTURE = "PC008_switch_before_history.jinja"


def prove(text: str, engine: str = "hf", **options):
    return lint_source(TemplateSource(Path("t.jinja"), None, text, "jinja"), prove=ProveOptions(engine=engine, **options))


def test_a_changed_reasoning_effort_is_proven_before_the_first_message():
    (finding,) = prove((CORPUS / FIXTURE).read_text(encoding="utf-8"))
    assert (finding.code, finding.severity, finding.fails(), finding.line) == ("PC008", "warning", True, 2)
    divergence = finding.proof.divergence
    assert finding.proof.status is ProofStatus.PROVEN
    assert divergence.scenario == "chat, reasoning_effort changed between calls"
    assert divergence.cause is Cause.SYSTEM
    # "<|system|>Reasoning Effort: " is 28 characters: "Low" and "Medium" part there
    assert divergence.first_divergence_char == 28
    assert divergence.reusable_tokens == 16  # one whole 16-character block before it
    assert f"{divergence.lost_tokens} of {divergence.ideal_tokens} chars recomputed" in finding.message
    assert "`reasoning_effort` is printed before the conversation's history" in finding.message


def test_a_thinking_line_before_the_history_is_proven_too():
    (finding,) = prove((CORPUS / "PC008_thinking_line_before_history.jinja").read_text(encoding="utf-8"))
    assert (finding.code, finding.fails()) == ("PC008", True)
    # "<|begin|>Thinking: o" is shared: "n" against "ff" at character 20
    assert finding.proof.divergence.first_divergence_char == 20


def test_a_pinned_setting_is_never_changed_so_nothing_is_proven():
    findings = prove((CORPUS / FIXTURE).read_text(encoding="utf-8"), pinned=(("reasoning_effort", "high"),))
    assert findings == []


def test_a_setting_changed_only_after_the_history_is_no_finding_of_it():
    text = (
        "{%- for message in messages %}<|{{ message.role }}|>{{ message.content }}<|end|>{% endfor -%}"
        "{%- if add_generation_prompt %}<|assistant|>{% endif -%}"
        "{{- '' if reasoning_effort is defined else '' }}"
    )
    assert prove(text) == []


@needs_shared
def test_gpt_oss_reasoning_line_in_its_system_message():
    text = (SHARED_TEMPLATES / "openai--gpt-oss-120b.jinja").read_text(encoding="utf-8")
    pc008 = [finding for finding in prove(text) if finding.code == "PC008"]
    assert len(pc008) == 1 and "`reasoning_effort`" in pc008[0].message
    # the template prints "Reasoning: " + reasoning_effort in its system message (line 206)
    assert "Reasoning: low" in pc008[0].proof.divergence.before or "Reasoning: low" in pc008[0].proof.divergence.after


def test_what_replay_says_of_a_client_change():
    assert changed_settings({"reasoning_effort": "low"}, {"reasoning_effort": "high", "x": 1}) == ["reasoning_effort", "x"]
    assert changed_settings({"a": 1}, {"a": 1}) == []
    assert client_change(["reasoning_effort"], 812) == "reasoning_effort changed between calls: 812 tokens"


@needs_shared
def test_glm_reasoning_effort_line_each_setting_its_own_finding():
    # GLM-5.2 opens with "<|system|>Reasoning Effort: High|Max" (lines 2-3) when thinking is on.
    text = (SHARED_TEMPLATES / "zai-org--GLM-5.2.jinja").read_text(encoding="utf-8")
    assert "<|system|>Reasoning Effort: " in text.splitlines()[2]
    named = sorted(finding.message.split("`")[1] for finding in prove(text) if finding.code == "PC008")
    assert named == ["enable_thinking", "reasoning_effort"]


def test_unsafe_fixes_do_not_move_the_setting_and_the_line_says_so(tmp_path):
    """ruff's split: --unsafe-fixes makes the fixes that change what the model sees; moving
    PC008's setting is made by none, and the refusal must not read as if it were unsafe."""
    template = shutil.copy(CORPUS / "PC008_switch_before_history.jinja", tmp_path / "t.jinja")
    before = Path(template).read_bytes()
    run = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", str(template), "--fix", "--unsafe-fixes", "--engine", "hf"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and Path(template).read_bytes() == before
    assert "an edit no fix makes (not even with --unsafe-fixes)" in run.stdout + run.stderr
