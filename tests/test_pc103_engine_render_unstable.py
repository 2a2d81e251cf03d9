"""PC103 engine-render-unstable: vLLM renders gpt-oss with openai-harmony, not the template.

The fixture is a stable template in harmony's markup: clean where the template is
rendered, unstable where vLLM renders the model itself.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from helpers import CORPUS, SHARED_TEMPLATES, needs_shared

from tmpl_lint.checker import ProveOptions, Selection, lint_source
from tmpl_lint.cli import main
from tmpl_lint.sources import collect

pytestmark = pytest.mark.no_fork

FIXTURE = CORPUS / "PC103_engine_render_unstable.jinja"


def proven(engine, path=FIXTURE):
    (source,), _ = collect([path])
    return lint_source(source, Selection(), ProveOptions(engine=engine))


def test_vllm_proves_its_own_render_and_not_the_template(monkeypatch):
    monkeypatch.delenv("VLLM_SYSTEM_START_DATE", raising=False)
    findings = proven("vllm")
    assert [(f.code, f.line) for f in findings] == [("PC103", 1), ("PC103", 1)]
    by_cause = {f.proof.cause: f.proof.divergence for f in findings}
    assert sorted(by_cause) == ["history-rewrite", "system"]
    # the year of "Current date: 2026-03-01" is token 31 of the harmony system message, measured
    # in harmony's tokens; the clock moved by a year and a day, with tools (the longest prompt)
    dated = by_cause["system"]
    assert (dated.scenario, dated.unit, dated.first_divergence, dated.reusable_tokens) == (
        "clock with tools, everything later",
        "token",
        31,
        16,
    )
    dropped = by_cause["history-rewrite"]
    # the first of two chained tool calls loses its analysis once the final answer follows
    assert (dropped.scenario, dropped.message_index, dropped.role, dropped.call) == (
        "agent, chained tool calls",
        1,
        "assistant",
        2,
    )
    assert "VLLM_SYSTEM_START_DATE" in next(f.message for f in findings if f.proof.cause == "system")


def test_a_pinned_server_date_leaves_only_the_dropped_analysis(monkeypatch):
    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", "2026-01-01")
    findings = proven("vllm")
    assert [(f.code, f.proof.cause) for f in findings] == [("PC103", "history-rewrite")]


def test_the_template_itself_is_clean_where_it_is_rendered():
    assert proven("hf") == []


@needs_shared
def test_gpt_oss_template_findings_are_proven_on_the_template_with_a_note(monkeypatch):
    monkeypatch.delenv("VLLM_SYSTEM_START_DATE", raising=False)
    findings = proven("vllm", SHARED_TEMPLATES / "openai--gpt-oss-120b.jinja")
    # vLLM's own render dropping the analysis is the template's PC003 break (its related
    # location); its date in the system message stands alone; reasoning_effort is printed in
    # the system message (PC008)
    assert [f.code for f in findings] == ["PC103", "PC001", "PC008", "PC003", "PC004"]
    assert (findings[0].proof.cause, [(f.code, f.proof.cause) for f in findings[3].related_findings]) == (
        "system",
        [("PC103", "history-rewrite")],
    )
    template_proofs = [f.proof for f in findings if f.code != "PC103"]
    assert all(proof.status == "proven" and "openai-harmony" in proof.note for proof in template_proofs)
    # PC004 is proven on the template: the compact string the model wrote, replayed as sent,
    # comes back through `tojson` as a quoted string
    assert (template_proofs[3].divergence.scenario, template_proofs[3].cause) == (
        "compact tool arguments replayed as sent",
        "tool-arguments",
    )


def test_the_note_is_printed_under_the_proof():
    from tmpl_lint.proofs import Proof
    from tmpl_lint.report.text import proof_lines

    proof = Proof.not_reproduced("token", ("chat", "agent")).with_note("rendered elsewhere")
    lines = proof_lines(proof)
    assert lines == [
        'proof: not reproduced in 2 scenarios (unit: token), so it does not fail the run (--strict makes it fail); tried: "chat", "agent"',
        "       note: rendered elsewhere",
    ]


def test_without_openai_harmony_the_engine_render_is_not_provable_and_says_why(monkeypatch):
    from tmpl_lint.engines.harmony import harmony_encoding

    harmony_encoding.cache_clear()
    monkeypatch.setitem(__import__("sys").modules, "openai_harmony", None)
    try:
        findings = proven("vllm")
    finally:
        harmony_encoding.cache_clear()
    assert [(f.code, f.proof.status) for f in findings] == [("PC103", "not-provable")]
    assert "pip install 'oss-harmony" in findings[0].proof.reason


def model_directory(directory, template, model_type):
    directory.mkdir()
    (directory / "chat_template.jinja").write_text((CORPUS / template).read_text())
    (directory / "config.json").write_text(f'{{"architectures": ["X"], "model_type": "{model_type}"}}')
    return directory / "chat_template.jinja"


def test_config_json_model_type_decides_as_it_does_for_vllm(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_SYSTEM_START_DATE", raising=False)
    # a gpt-oss model with a ChatML template: vLLM still renders it with harmony
    gpt_oss = model_directory(tmp_path / "a", "clean_chatml.jinja", "gpt_oss")
    assert sorted(f.proof.cause for f in proven("vllm", gpt_oss)) == ["history-rewrite", "system"]
    # harmony markup on another model: vLLM renders the template, which is stable
    qwen = model_directory(tmp_path / "b", "PC103_engine_render_unstable.jinja", "qwen3")
    assert proven("vllm", qwen) == []


def test_model_type_is_read_from_the_model_directory(tmp_path):
    from tmpl_lint.sources import model_type_beside

    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "config.json").write_text('{"model_type": "gpt_oss"}')
    assert model_type_beside(tmp_path / "tokenizer_config.json") == "gpt_oss"
    assert model_type_beside(tmp_path / "additional_chat_templates" / "tool_use.jinja") == "gpt_oss"
    assert model_type_beside(tmp_path) == "gpt_oss"
    (tmp_path / "config.json").write_text("{not json")
    assert model_type_beside(tmp_path / "tokenizer_config.json") is None
    assert model_type_beside(tmp_path / "additional_chat_templates" / "missing" / "x.jinja") is None


def test_fix_says_no_edit_of_the_template_changes_the_engines_render(tmp_path, monkeypatch):
    # Both divergences are the engine's (its date, its dropped analysis): the template has
    # nothing to edit, and the line for each says so, with the cause that tells them apart.
    monkeypatch.delenv("VLLM_SYSTEM_START_DATE", raising=False)
    path = tmp_path / "harmony.jinja"
    path.write_bytes(FIXTURE.read_bytes())
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes"])
    assert path.read_bytes() == FIXTURE.read_bytes()
    why = "the engine renders this model with its own code, not the template: no edit of the template changes it"
    assert [line for line in result.stdout.splitlines() if "not fixed" in line] == [
        f"{path}:1:1: not fixed PC103 [engine-render-unstable]: {why} (the history-rewrite divergence)",
        f"{path}:1:1: not fixed PC103 [engine-render-unstable]: {why} (the system divergence)",
    ]
    assert result.exit_code == 1
