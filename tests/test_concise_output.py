"""The text report, concise by default as ruff's: a finding's line (wrapped to be read) and
its proof's; ``--output-format full`` for the source line, both renders and the notes under
each proof; notes once; informational findings counted, not printed, in a pre-commit run;
``-q`` one line per finding. And the check's JSON says what the text says."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from helpers import CORPUS, SHARED_TEMPLATES, needs_shared

from tmpl_lint.cli import main

CLOCK = str(CORPUS / "PC001_live_clock.jinja")
# informational: what follows the newest reply's end marker differs, a bounded loss
INFO = str(CORPUS / "PC006_eos_after_newest_reply.jinja")
SWITCHED = str(CORPUS / "PC006_generation_prompt_mismatch.jinja")  # breaks when enable_thinking=false
# The fixture's system block holds the date: "Current date: 2026-03-02" against "...03", the
# first character that differs is the day's last digit, char 68 (counted by hand: the
# knowledge line is 26 characters, "<|im_start|>system\n" 19, "Current date: 2026-03-0" 23).
CLOCK_PROOF = (
    '    proof: calls 1->2 of "clock, a day later" part at char 68, before the first message: 96 of 162 chars recomputed'
)


def run(*args, env=None):
    result = CliRunner(env=env).invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_concise_is_the_default_a_finding_s_line_and_its_proof_s(tmp_path, monkeypatch):
    shutil.copyfile(CLOCK, tmp_path / "c.jinja")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("c.jinja")
    assert code == 1
    lines = out.splitlines()
    # wrapped at 120 columns, at a space; the next line indented
    assert lines == [
        "c.jinja:3:28: PC001 [live-clock] `strftime_now(...)` puts the current time into the prompt: the prefix cache goes cold",
        "    whenever the rendered date changes; the rendered prompt changes per day: it changed when the clock moved a day",
        CLOCK_PROOF,
        "Found 1 finding (1 failing).",
        "[*] 1 fixable with --fix --unsafe-fixes",
    ]
    # "text" is the concise report too
    assert run("c.jinja", "--format", "text")[1] == out


def test_long_messages_are_wrapped_and_the_switch_advice_is_short(tmp_path, monkeypatch):
    # A short path, so that the 120 columns are the message's (a long path keeps its place
    # whole on the first line: test_a_long_path_keeps_place_code_and_name_on_the_first_line).
    shutil.copyfile(SWITCHED, tmp_path / "s.jinja")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("s.jinja")
    assert code == 1
    head = [line for line in out.splitlines() if not line.startswith("    proof: ")][:-1]
    assert all(len(line) <= 120 for line in head), head
    assert head[0].startswith("s.jinja:12:13: PC006 [generation-prompt-mismatch] ")
    assert all(line.startswith("    ") for line in head[1:])
    # the advice, without how to pass the value (per request, server-wide): that is full's
    joined = " ".join(line.strip() for line in head)
    assert joined.endswith("breaks when enable_thinking=false (stable when true or unset); set enable_thinking=true to avoid it")
    assert "chat_template_kwargs" not in out
    full = run("s.jinja", "--output-format", "full")[1]
    assert '(per request: chat_template_kwargs={"enable_thinking": true}; vLLM server-wide:' in full


def test_full_shows_the_source_line_the_renders_and_the_rollback_figure_explained():
    code, out, _ = run(CLOCK, "--output-format", "full")
    assert code == 1
    lines = out.splitlines()
    assert lines[1] == '    3 |     {{- "Current date: " + strftime_now("%Y-%m-%d") + "\\n\\n" }}'
    assert lines[3].startswith(
        '      proof: proven in "clock, a day later", calls 1->2 (prompt N vs N+1): first divergence at char 68'
    )
    assert "0 on a model that cannot roll back its state (a hybrid model reuses all of a prefix or none)" in lines[4]
    assert any(line.startswith("        N   | ") for line in lines)
    # the concise report says nothing of rollback
    assert "roll back" not in run(CLOCK)[1]


def test_quiet_is_one_line_per_finding():
    code, out, _ = run(CLOCK, INFO, "-q")
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{CLOCK}:3:28: PC001 [live-clock] ") and lines[0].endswith("when the clock moved a day")
    assert lines[1].startswith(f"{INFO}:5:8: PC006 ")


def test_a_pre_commit_run_counts_informational_findings_without_printing_them():
    code, out, _ = run(CLOCK, INFO, env={"PRE_COMMIT": "1"})
    assert code == 1
    assert "PC006" not in out
    assert out.splitlines()[-2:] == [
        "Found 2 findings (1 failing, 1 info, not shown in a pre-commit run).",
        "[*] 1 fixable with --fix --unsafe-fixes",
    ]
    # outside pre-commit it is printed, with its proof
    code, out, _ = run(CLOCK, INFO)
    assert f"{INFO}:5:8: PC006 " in out
    assert out.splitlines()[-2] == "Found 2 findings (1 failing, 1 info)."


def test_the_json_pair_is_numbered_as_the_text_and_figures_are_named_by_their_unit():
    out = run(CLOCK, "--format", "json")[1]
    (finding,) = json.loads(out)
    proof = finding["proof"]
    assert proof["pair"] == [1, 2]  # "calls 1->2"
    assert proof["unit"] == "char"
    assert (proof["prompt_chars"], proof["lost_chars"]) == ([162, 162], 96)
    assert proof["reusable_chars"] == 64  # char 68's block starts at 64
    assert not any(key.endswith("_tokens") or "_tokens_" in key for key in proof)


@needs_shared
def test_a_note_said_under_every_proof_is_said_once_in_the_concise_report(tmp_path):
    # gpt-oss templates are rendered as transformers renders them, and every proof says so
    templates = sorted(SHARED_TEMPLATES.glob("openai--gpt-oss*.jinja"))
    assert templates
    note = "rendered as transformers renders the template; vLLM renders this model with openai-harmony instead (PC103)"
    full = run(*map(str, templates), "--output-format", "full")[1]
    concise = run(*map(str, templates))[1]
    assert full.count(note) >= 2
    assert concise.count(note) == 1
    assert f"note: {note}" in concise.splitlines()


@pytest.mark.parametrize("fixture", ["PC002_history_rewrite.jinja", "PC003_future_dependent_render.jinja"])
def test_every_concise_proof_is_one_line(fixture):
    out = run(str(CORPUS / fixture))[1]
    proofs = [line for line in out.splitlines() if line.startswith("    proof: ")]
    assert proofs
    index = out.splitlines().index(proofs[0])
    following = out.splitlines()[index + 1]
    assert not following.startswith("      ")  # nothing of the proof wrapped onto the next line


def test_a_long_path_keeps_place_code_and_name_on_the_first_line(tmp_path):
    # grep and editors read "path:line:col: CODE [name]" from one line, however long the path
    folder = tmp_path.joinpath(*["deep"] * 30)
    folder.mkdir(parents=True)
    template = folder / "c.jinja"
    shutil.copyfile(CLOCK, template)
    code, out, _ = run(str(template), "--no-prove")
    assert code == 1
    first = out.splitlines()[0]
    assert len(f"{template}:3:28: PC001 [live-clock] ") > 120
    assert first.startswith(f"{template}:3:28: PC001 [live-clock] ")
