"""--fix and --diff: verified edits, only the template changes, atomic writes."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import CORPUS, PROJECT, SHARED, SHARED_TEMPLATES, SHARED_TOKENIZERS, built_once, log_verifiers, needs_shared

from tmpl_lint.checker import lint_source
from tmpl_lint.cli import main
from tmpl_lint.containers import json_template_span
from tmpl_lint.fix.verify import Verifier
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.proving.session import Prover
from tmpl_lint.render import FrozenClock, render
from tmpl_lint.sources import collect

FIXTURES = PROJECT / "tests" / "fixtures"
FROZEN = "2026-01-15"


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def copy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)
    for path in [target, *target.rglob("*")] if target.is_dir() else [target]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return target


def single_turn(text: str, at: datetime) -> str:
    return render(
        text,
        [{"role": "user", "content": "Hello"}],
        clock=FrozenClock(at),
        add_generation_prompt=True,
        special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
    )


# -- fixtures written here ----------------------------------------------------------------


def test_live_clock_fix_on_a_jinja_file(tmp_path):
    path = copy(CORPUS / "PC001_live_clock.jinja", tmp_path)
    original = path.read_bytes()
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--frozen-date", FROZEN, "--no-prove")
    assert code == 0
    assert out.startswith(
        f"{path}:3:28: fixed PC001 [live-clock]: the model sees the date 2026-01-15 instead of today's unless the caller passes date_string\n"
    )
    patched = path.read_text()
    assert patched.startswith('{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n')
    assert '"Current date: " + date_string + "\\n\\n"' in patched
    # only the edits: the rest of the file is the original, line for line
    assert patched.split("\n", 1)[1] == original.decode().replace('strftime_now("%Y-%m-%d")', "date_string")
    # renders exactly as the original did on the frozen date
    assert single_turn(patched, datetime(2026, 5, 5)) == single_turn(original.decode(), datetime(2026, 1, 15, 9))
    # the caller can still pass the real date
    assert "Current date: 2026-05-05" in render(
        patched,
        [{"role": "user", "content": "x"}],
        clock=FrozenClock(datetime.now()),
        template_kwargs={"date_string": "2026-05-05"},
    )


def test_diff_prints_and_writes_nothing(tmp_path):
    path = copy(CORPUS / "PC004_tool_args_reserialized.jinja", tmp_path)
    before = path.read_bytes()
    code, out, err = run(str(path), "--diff", "--unsafe-fixes", "--no-prove")
    assert path.read_bytes() == before
    name = Path(os.path.relpath(path)).as_posix()  # named from the working directory, outside it too
    assert out.startswith(f"--- a/{name}\n+++ b/{name}\n@@ -2,7 +2,7 @@\n")  # the patch, and only it
    assert (
        '+        {{- \'<tool_call>{"name": "\' + call.name + \'", "arguments": \' + (call.arguments if call.arguments is string else call.arguments | tojson(separators=(",", ":"))) + \'}</tool_call>\' }}\n'
        in out
    )
    assert err.startswith(f"{path}:5:89: would fix PC004 [tool-args-reserialized]: ")
    # nothing remains after the fix (the template now names the separators its model writes),
    # which is not on disk yet
    assert err.endswith("All checks pass once the fixes above are applied.\n")
    assert code == 1  # as ruff: --diff exits 1 when it would change a file


def test_diff_counts_what_remains_once_its_fixes_are_applied(tmp_path):
    # A switch's default made stable would leave the break for deployments that pass the other
    # value (issue 33): the fix reads the scanned position as "before every message" instead,
    # whatever the switch says. --diff wrote nothing, so its summary is of the fixes unapplied.
    path = copy(CORPUS / "PC002_history_rewrite_switch.jinja", tmp_path)
    code, _, err = run(str(path), "--diff", "--unsafe-fixes", "--no-prove")
    assert code == 1
    assert err.splitlines()[-1] == "All checks pass once the fixes above are applied."
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    assert (code, out.splitlines()[-1]) == (0, "Found 1 finding (1 fixed, 0 remaining).")


def test_second_fix_is_a_no_op(tmp_path):
    path = copy(CORPUS / "PC002_history_rewrite_switch.jinja", tmp_path)
    run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    once = path.read_bytes()
    assert b"(keep_history_reasoning or loop.index0 > -1)" in once
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    assert path.read_bytes() == once
    assert "fixed" not in out.replace("not fixed", "")
    assert (code, out.splitlines()[-1]) == (0, "All checks passed!")


def test_history_rewrite_fix_without_switch_keeps_reasoning(tmp_path):
    path = copy(CORPUS / "PC002_history_rewrite.jinja", tmp_path)
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    assert "fixed PC002 [history-rewrite]" in out
    patched = path.read_text()
    assert "loop.index0 > -1 and reasoning" in patched
    assert code == 0


def test_unfixable_look_ahead_is_explained_and_untouched(tmp_path):
    path = copy(CORPUS / "PC003_future_dependent_render.jinja", tmp_path)
    before = path.read_bytes()
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    assert path.read_bytes() == before
    assert f"{path}:14:16: not fixed PC003 [future-dependent-render]: no edit keeps the model's trained format" in out
    assert code == 1


def test_a_fix_that_drops_tool_results_from_the_prompt_is_refused(tmp_path):
    # The look-ahead groups each tool result under the call that asked for it, and its tag
    # reads like reasoning, so the PC003 fix tries reading it as "no later message". That
    # ends the divergence, and every tool result with it: the "agent" scenario's tool
    # message (message 2, "18 C, sunny") would never reach the model.
    path = copy(CORPUS / "PC003_tool_results_grouped.jinja", tmp_path)
    before = path.read_bytes()
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes")
    assert path.read_bytes() == before
    assert out.splitlines()[0] == (
        f"{path}:10:14: not fixed PC003 [future-dependent-render]: the patched template leaves out text of "
        "message 2 (tool) that the original prints: '18 C, sunny' in \"agent\""
    )
    assert code == 1


# A reply's parallel tool results printed as one group: from the first result, a look-ahead
# gathers the results that follow it (as Command A does), and marks them seen. The PC003 fix
# reads the look-ahead as "no later message" (the assistant's <|think|> makes it look like
# one that drops reasoning): each result then opens a group of its own, every result still
# printed. The prover's scenarios call one tool at a time: only --strict makes the fix.
PARALLEL_RESULTS_GROUPED = """\
{%- set seen = namespace(ids=[]) %}
{%- for message in messages %}
{%- if message.role == 'user' %}<|user|>{{ message.content }}<|end|>
{%- elif message.role == 'assistant' %}<|assistant|>{% if message.tool_calls %}<|think|>{{ message.reasoning_content }}<|/think|>{% for tc in message.tool_calls %}<call>{{ tc.function.name }}</call>{% endfor %}{% else %}{{ message.content }}{% endif %}<|end|>
{%- elif message.role == 'tool' and message.tool_call_id not in seen.ids %}<|results|>{{ message.content }}
{%- set stopped = namespace(value=false) %}
{%- for later in messages[loop.index0 + 1:] %}
{%- if not stopped.value and later.role == 'tool' %}, {{ later.content }}{%- set seen.ids = seen.ids + [later.tool_call_id] %}
{%- else %}{%- set stopped.value = true %}{%- endif %}
{%- endfor %}<|/results|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}
"""


@pytest.mark.parametrize("flag", ["--strict", "--no-prove"])
def test_a_fix_that_splits_a_replys_parallel_tool_results_is_refused(tmp_path, flag):
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "weather", "arguments": {}}} for i in range(2)]
    parallel = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "tool_calls": calls, "reasoning_content": "Both at once."},
        {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    rendered = render(PARALLEL_RESULTS_GROUPED, parallel, clock=FrozenClock(datetime(2026, 1, 1)))
    assert rendered.endswith("<|end|><|results|>sunny, rain<|/results|>")  # one group, as trained
    path = tmp_path / "grouped.jinja"
    path.write_text(PARALLEL_RESULTS_GROUPED)
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", flag)
    assert path.read_text() == PARALLEL_RESULTS_GROUPED
    assert out.splitlines()[0] == (
        f"{path}:7:18: not fixed PC003 [future-dependent-render]: the patched template joins a reply's parallel tool "
        "results otherwise: between '18 C, sunny' and '24 C, clear', ', ' becomes '<|/results|><|results|>' in "
        '"agent, parallel tool calls"'
    )
    assert code == 1


# The last user message carries the request's RAG documents, and past turns keep reasoning
# only after it. The PC002 fix reads the scanned position as -1 everywhere: reasoning stays,
# and the documents are printed after no message at all. The prover's scenarios send no
# documents, so only the verifier's renders with them can see that.
DOCUMENTS_ON_THE_LAST_QUERY = """\
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|user|>{{ m.content }}{% if loop.index0 == ns.last_user and documents %}<docs>{% for d in documents %}{{ d.text }}{% endfor %}</docs>{% endif %}<|end|>
{%- elif m.role == 'assistant' %}<|assistant|>{% if loop.index0 > ns.last_user and m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|end|>
{%- elif m.role == 'tool' %}<|tool|>{{ m.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}
"""


def test_a_fix_that_leaves_out_the_documents_is_refused(tmp_path):
    path = tmp_path / "rag.jinja"
    path.write_text(DOCUMENTS_ON_THE_LAST_QUERY)
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes")
    assert path.read_text() == DOCUMENTS_ON_THE_LAST_QUERY
    first = out.splitlines()[0]
    match = re.fullmatch(
        rf"{re.escape(str(path))}:4:71: not fixed PC002 \[history-rewrite\]: the patched template leaves out text of "
        r"the documents that the original prints: '(.+)' in \"chat, with documents\"",
        first,
    )
    assert match is not None, first
    from tmpl_lint.fix.verify import DOCUMENTS

    # the quoted text is one of the documents the verifier sends, which the original prints
    # on the last user message
    assert match[1] in {document["text"] for document in DOCUMENTS}
    last_query = [{"role": "user", "content": "Summarise the report."}]
    rendered = render(DOCUMENTS_ON_THE_LAST_QUERY, last_query, clock=FrozenClock(datetime(2026, 1, 1)), documents=DOCUMENTS)
    assert f"<docs>{''.join(document['text'] for document in DOCUMENTS)}</docs>" in rendered
    assert code == 1


def test_a_fix_that_leaves_out_a_variable_the_caller_passes_is_refused(tmp_path):
    # As above with a keyword the caller passes (chat_template_kwargs), which transformers
    # hands the template as it hands documents: the scenarios set none.
    template = DOCUMENTS_ON_THE_LAST_QUERY.replace(
        " and documents %}<docs>{% for d in documents %}{{ d.text }}{% endfor %}</docs>",
        ' %}{{ house_rules | default("") }}',
    )
    path = tmp_path / "rules.jinja"
    path.write_text(template)
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes")
    assert path.read_text() == template
    first = out.splitlines()[0]
    match = re.fullmatch(
        rf"{re.escape(str(path))}:4:71: not fixed PC002 \[history-rewrite\]: the patched template leaves out text of "
        r"the caller's `house_rules` that the original prints: '(.+)' in \"chat, with the caller's variables\"",
        first,
    )
    assert match is not None, first
    last_query = [{"role": "user", "content": "Hi"}]
    rendered = render(template, last_query, clock=FrozenClock(datetime(2026, 1, 1)), template_kwargs={"house_rules": match[1]})
    assert match[1] in rendered
    assert code == 1


def test_a_history_rewrite_fix_keeps_documents_printed_at_the_top(tmp_path):
    # Documents printed once before the messages do not move with the last query: the fix
    # is made, and the documents still render.
    template = DOCUMENTS_ON_THE_LAST_QUERY.replace(
        "{% if loop.index0 == ns.last_user and documents %}", "{% if false %}"
    ).replace(
        "{%- for m in messages %}\n",
        "{%- if documents %}<docs>{% for d in documents %}{{ d.text }}{% endfor %}</docs>{% endif %}\n{%- for m in messages %}\n",
        1,
    )
    path = tmp_path / "rag.jinja"
    path.write_text(template)
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes")
    assert out.splitlines()[0].endswith(
        "fixed PC002 [history-rewrite]: every assistant turn keeps its reasoning in history, whatever follows it (`ns.last_user` no longer decides)"
    )
    assert code == 0
    documents = [{"text": "Q3 revenue was 12M."}]
    last_query = [{"role": "user", "content": "Summarise the report."}]
    assert "<docs>Q3 revenue was 12M.</docs>" in render(
        path.read_text(), last_query, clock=FrozenClock(datetime(2026, 1, 1)), documents=documents
    )


@needs_shared
def test_a_fix_refused_for_a_finding_still_there_says_where(tmp_path):
    # Gemma 4 scans ahead for tool results twice (lines 280 and 354): one PC003, the second
    # scan its related place. Reading the first as "no later message" leaves the second
    # standing alone; the reason names it, at its `range(`.
    path = tmp_path / "gemma.jinja"
    shutil.copyfile(SHARED_TEMPLATES / "google--gemma-4-31B-it.jinja", path)
    second = path.read_text().splitlines()[353]
    assert second.lstrip().startswith("{%- for j in range(loop.index0 + 1")
    code, _, err = run(str(path), "--diff", "--unsafe-fixes", "--no-prove")  # the patch on stdout, what was done on stderr
    assert (
        f"{path}:280:30: not fixed PC003 [future-dependent-render]: PC003 is still found in the patched template, "
        f"at line 354, column {second.index('range(') + 1} of the patched template"
    ) in err.splitlines()
    assert code == 1


def test_failed_verification_leaves_the_file_untouched(tmp_path, monkeypatch):
    path = copy(CORPUS / "PC001_live_clock.jinja", tmp_path)
    before = path.read_bytes()
    monkeypatch.setattr(Verifier, "check", lambda self, patched, fixed: "a single-turn conversation would render differently")
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    assert path.read_bytes() == before
    assert "not fixed PC001 [live-clock]: a single-turn conversation would render differently" in out
    assert code == 1


def test_read_only_file_is_an_error_and_untouched(tmp_path):
    path = copy(CORPUS / "PC001_live_clock.jinja", tmp_path)
    before = path.read_bytes()
    path.chmod(0o444)
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    assert code == 2
    assert err == f"tmpl-lint: error: {path}: the file is read-only; nothing written\n"
    # not "found by the proof, not from a pattern a fix edits": its fix was made, not written
    assert out.splitlines()[0] == f"{path}:3:28: not fixed PC001 [live-clock]: the file could not be written (see the error)"
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]


def test_python_source_survives_byte_for_byte_outside_the_template(tmp_path):
    path = copy(FIXTURES / "embedded_template.py", tmp_path)
    before = path.read_text()
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    column = before.splitlines()[5].index("strftime_now") + 1  # the call, in the file's line 6
    assert f"{path}:6:{column}: fixed PC001 [live-clock] (template chat_template@6): " in out
    after = path.read_text()
    old_literal = "\"{{- 'Today: ' + strftime_now('%Y-%m-%d') + '\\\\n' }}"
    assert old_literal in before and old_literal not in after
    prefix, suffix = before.split(old_literal)
    assert after.startswith(prefix) and after.endswith(suffix.split("\n", 1)[1])
    # the other two literals are untouched
    assert after.count('chat_template = """{%- for m in messages %}') == 1
    assert "chat_template='{{ messages[0].content }}'" in after
    (source,) = [s for s in collect([path])[0] if s.name == "chat_template@6"]
    assert source.text.startswith('{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n')


def test_yaml_survives_byte_for_byte_outside_the_template(tmp_path):
    path = copy(FIXTURES / "embedded_template.yaml", tmp_path)
    before = path.read_text().splitlines(keepends=True)
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    column = before[5].index("strftime_now") + 1  # a literal block: the template's line 1 is the file's line 6
    assert f"{path}:6:{column}: fixed PC001 [live-clock] (template model.chat_template): " in out
    after = path.read_text().splitlines(keepends=True)
    # everything but the block scalar's lines is identical, comments and order included
    assert after[:5] == before[:5]
    assert after[-6:] == before[-6:]
    assert after[5] == '    {%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n'
    assert after[6] == '    {%- set date_line = "Current date: " + date_string %}\n'
    assert after[7:-6] == before[6:-6]


# -- real templates from ../shared ---------------------------------------------------------

# (template, whether the fixer must refuse a look-ahead the model was trained on)
REAL = [
    ("Qwen--Qwen3-0.6B.jinja", False),
    ("Qwen--Qwen3-0.6B--rev-2025-05-19.jinja", False),
    ("openai--gpt-oss-120b.jinja", False),
    ("zai-org--GLM-5.2.jinja", False),
    # Mistral's tool list and system prompt sit on the last user message by design
    ("mistralai--Mistral-Small-3.2-24B-Instruct-2506.jinja", True),
    ("ibm-granite--granite-3.3-2b-instruct.jinja", False),
]


@needs_shared
@pytest.mark.parametrize(("name", "trained_look_ahead"), REAL)
def test_real_templates_fixed_and_proven_stable(tmp_path, name, trained_look_ahead):
    path = copy(SHARED_TEMPLATES / name, tmp_path)
    original = path.read_text()
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--frozen-date", FROZEN, "--no-prove")
    assert err == ""
    patched = path.read_text()
    assert ("no edit keeps the model's trained format" in out) == trained_look_ahead
    # what still applies by default: no live clock, no history rewrite, and no look-ahead
    # but the ones the fix declared it must leave (Mistral's last-message blocks)
    (source,), _ = collect([path])
    remaining = [f for f in lint_source(source) if not (f.switch and f.switch.default_is_stable)]
    assert not {f.code for f in remaining} & {"PC001", "PC002"}
    assert ("PC003" in {f.code for f in remaining}) == trained_look_ahead
    # and the prover, rendering every scenario, sees no earlier message change but those
    report = Prover(patched, None).run({})
    rewrites = [d for d in report.divergences() if d.cause in ("system", "history-rewrite") and not d.in_reply]
    assert bool(rewrites) == trained_look_ahead
    # a single turn renders as the original did on the fix date
    assert single_turn(patched, datetime(2027, 7, 7)) == single_turn(original, datetime(2026, 1, 15, 12))
    # a second run changes nothing
    run(str(path), "--fix", "--unsafe-fixes", "--frozen-date", FROZEN, "--no-prove")
    assert path.read_text() == patched


@needs_shared
def test_mistral_small_keeps_its_trained_last_message_blocks(tmp_path):
    path = copy(SHARED_TEMPLATES / "mistralai--Mistral-Small-3.2-24B-Instruct-2506.jinja", tmp_path)
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert "fixed PC001 [live-clock]" in out
    assert "not fixed PC003 [future-dependent-render]: no edit keeps the model's trained format" in out


def results_in_one_turn(text: str) -> bool:
    """Whether Command A renders one call's two parallel results in one turn (with a
    document: the branch the template prints them in)."""
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "weather", "arguments": {"city": city}}}
        for i, city in enumerate(["Paris", "Rome"])
    ]
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "tool_calls": calls, "tool_plan": "Look both up."},
        {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    rendered = render(
        text,
        messages,
        clock=FrozenClock(datetime(2026, 1, 15, 12)),
        documents=[{"title": "Notes", "text": "none"}],
        add_generation_prompt=True,
        special_tokens={"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"},
    )
    return "<|END_TOOL_RESULT|>" not in rendered[rendered.index('"sunny"') : rendered.index('"rain"')]


@needs_shared
def test_a_finding_the_proof_does_not_reproduce_is_tried_only_under_strict(tmp_path):
    # Command A prints a call's parallel tool results as one turn, looking ahead from the
    # first at the results after it. The analysis sees a look-ahead (PC003); no render shows
    # it moving history (ORACLE.tsv: chat and agent differ in the tail only). Removing the
    # look-ahead would split the turn the model was trained on: --fix makes a fix only for
    # what fails the run, so only --strict (where unreproduced findings fail) tries this one,
    # and the verifier, rendering a reply's parallel calls, refuses it.
    name = "CohereLabs--c4ai-command-a-03-2025.jinja"
    oracle = [line.split("\t") for line in (SHARED / "corpus" / "ORACLE.tsv").read_text().splitlines()]
    assert [row[1:3] for row in oracle if row[0] == name] == [["tail", "tail"]]
    path = copy(SHARED_TEMPLATES / name, tmp_path)
    original = path.read_text()
    code, _, err = run(str(path), "--fix", "--unsafe-fixes", "--format", "json", "--frozen-date", FROZEN)
    assert (code, path.read_text()) == (0, original)
    assert (
        f"{path}:148:20: not fixed PC003 [future-dependent-render]: the proof did not reproduce it in 12 scenarios, "
        "so nothing shows an edit is needed (--strict fixes it too)"
    ) in err.splitlines()
    # --strict tries the fix, and its verifier sees the group split (with a document: the
    # branch that prints tool results): not fixed either
    code, _, err = run(str(path), "--fix", "--unsafe-fixes", "--strict", "--format", "json", "--frozen-date", FROZEN)
    assert (code, path.read_text()) == (1, original)
    assert results_in_one_turn(original)
    assert (
        f"{path}:148:20: not fixed PC003 [future-dependent-render]: the patched template joins a reply's parallel tool "
        "results otherwise: between '18 C, sunny' and '24 C, clear', ',' becomes '\\n]<|END_TOOL_RESULT|><|END_OF_TURN_TOKE…' "
        'in "agent, parallel tool calls, with documents"'
    ) in err.splitlines()


def fixed_once(shared_folder: Path, directory: Path) -> Path:
    """A copy of the model folder ``directory`` after `tmpl-lint --fix --frozen-date FROZEN
    -q`, made once per run (xdist's workers share it, see helpers.built_once): Qwen3's fix
    verifies with its real tokenizer, a second of CPU, which two tests below only read."""

    def fix(folder: Path) -> None:
        run(str(copy(directory, folder)), "--fix", "--unsafe-fixes", "--frozen-date", FROZEN, "-q")

    return built_once(shared_folder, f"fixed-{directory.name}", fix) / directory.name


@needs_shared
@pytest.mark.parametrize(
    "directory", [SHARED_TOKENIZERS / "qwen3", SHARED / "corpus" / "configs" / "deepseek-ai--DeepSeek-R1-Distill-Qwen-32B"]
)
def test_tokenizer_config_changes_only_the_template(tmp_path, shared_folder, directory):
    before = (directory / "tokenizer_config.json").read_text()
    after = (fixed_once(shared_folder, directory) / "tokenizer_config.json").read_text()
    old, new = json_template_span(before, None), json_template_span(after, None)
    assert before[: old.start] == after[: new.start]
    assert before[old.end :] == after[new.end :]
    document = json.loads(after)
    assert {k for k in document if document[k] != json.loads(before)[k]} <= {"chat_template"}
    again = copy(fixed_once(shared_folder, directory), tmp_path)  # a copy: the fixed folder is shared
    run(str(again), "--fix", "--unsafe-fixes", "--frozen-date", FROZEN, "-q")
    assert (again / "tokenizer_config.json").read_text() == after


@needs_shared
def test_fixed_tokenizer_config_loads_in_transformers(shared_folder):
    transformers = pytest.importorskip("transformers")
    target = fixed_once(shared_folder, SHARED_TOKENIZERS / "qwen3")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(target))
    (source,), _ = collect([target])
    assert tokenizer.chat_template == source.text
    assert "loop.index0 > -1" in tokenizer.chat_template


@pytest.mark.parametrize(
    ("template", "engine", "verified_with"),
    [
        ("PC004_tool_args_reserialized.jinja", "vllm", "vllm"),
        ("PC004_tool_args_reserialized.jinja", "hf", "hf"),
        # vLLM renders harmony-markup models without the template: the fix is proven as
        # the check proves the template itself, with transformers' renderer.
        ("PC103_engine_render_unstable.jinja", "vllm", "hf"),
    ],
)
def test_fix_is_verified_with_the_engine_of_the_check(template, engine, verified_with):
    from tmpl_lint.fix.options import FixOptions

    (source,), _ = collect([CORPUS / template])
    verifier = Verifier(source, FixOptions(datetime(2026, 1, 1).date(), engine=engine))
    assert verifier.engine == verified_with


def test_a_patch_that_leaves_out_the_tool_definitions_is_refused(tmp_path):
    from tmpl_lint.fix.options import FixOptions

    template = tmp_path / "tools.jinja"
    tools_block = "{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }}: {{ t.function.description }}\n{% endfor %}</tools>{% endif %}"
    history = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    template.write_text(tools_block + history)
    (source,), _ = collect([template])
    verifier = Verifier(source, FixOptions(datetime(2026, 1, 1).date(), engine="hf"))
    assert verifier.lost_text(source.text) is None
    reason = verifier.lost_text(history)
    match = re.fullmatch(
        r"the patched template leaves out text of the tool definitions that the original prints: '(.+)' in \"(.+)\"", reason
    )
    assert match is not None, reason
    (scenario,) = [s for s in verifier.rendered_scenarios() if s.name == match[2]]
    assert match[1] in {tool["function"][key] for tool in scenario.tools for key in ("name", "description")}


# -- only the template's bytes change ------------------------------------------------------

DISTANT = """%YAML 1.2
---
# serving config: hand-written, odd spacing on purpose
"model" :   {name: "x/y",  max_len: 8192}
templates:
  - name:    default
    chat_template: |  # the template in force
      {%- for m in messages %}
      {{- m.role + ": " + m.content + "\\n" }}
      {%- endfor %}
      {%- if add_generation_prompt %}
      {{- "assistant: " }}
      {%- endif %}
      {{- "\\n(today is " + strftime_now("%Y-%m-%d") + ")" }}

    # a comment inside the item, after a blank line
    weight:   2     # aligned comment
  - {name: other,   weight: 1}
anchors: &a [1,   2]
again: *a
...
"""


def test_yaml_with_distant_edits_changes_no_byte_outside_the_template(tmp_path):
    path = tmp_path / "serving.yaml"
    path.write_text(DISTANT)
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert err == ""
    (line,) = [number for number, text in enumerate(DISTANT.splitlines(), 1) if "strftime_now" in text]
    column = DISTANT.splitlines()[line - 1].index("strftime_now") + 1  # the template's line 7, in the file
    assert f"{path}:{line}:{column}: fixed PC001 [live-clock] (template templates.0.chat_template): " in out
    after = path.read_text()
    # the fix edits the template's first line and its last, far apart; around the block's
    # lines not one byte changes
    head = DISTANT[: DISTANT.index("      {%- for m in messages %}")]
    tail = DISTANT[DISTANT.index("\n    # a comment inside the item") :]
    assert after.startswith(head) and after.endswith(tail)
    block = after[len(head) : len(after) - len(tail)]
    assert block == (
        '      {%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n'
        + DISTANT[len(head) : len(DISTANT) - len(tail)].replace('strftime_now("%Y-%m-%d")', "date_string")
    )


def test_json_changes_no_byte_outside_the_template_value(tmp_path):
    template = "{%- for m in messages %}{{ m.content }}{%- endfor %}{{ strftime_now('%d %b') }}"
    literal = json.dumps(template)
    head = '{\r\n\t"name" :"caf\\u00e9",\r\n\t"chat_template":[{"name":"default","template":"{{ messages }}"} ,\r\n\t\t{"template" : '
    tail = ', "name":"tool_use"}],  "eos_token":"</s>"\r\n}'
    path = tmp_path / "tokenizer_config.json"
    path.write_bytes((head + literal + tail).encode())
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    # the date, fixed, is still printed after the messages: PC007, which no edit fixes
    assert (code, err) == (1, "")
    assert "fixed PC001 [live-clock]" in out and "not fixed PC007 [text-after-history]" in out
    after = path.read_bytes().decode()
    assert after.startswith(head) and after.endswith(tail)
    fixed = json.loads(after[len(head) : len(after) - len(tail)])
    assert fixed == '{%- if date_string is not defined %}{%- set date_string = "15 Jan" %}{%- endif %}\n' + template.replace(
        "strftime_now('%d %b')", "date_string"
    )


def test_json_escapes_outside_the_edit_are_kept_and_the_edit_escapes_as_the_file(tmp_path):
    """A file written with every "/" as "\\/" and "<" as "\\u003c" (HTML-safe writers) keeps
    them: only the characters the fix changes are written, escaped as the file escapes."""
    template = "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{%- endfor %}{{ strftime_now('%d/%m') }}"
    literal = json.dumps(template).replace("/", "\\/").replace("<", "\\u003c")
    path = tmp_path / "tokenizer_config.json"
    path.write_text('{"chat_template": ' + literal + "}\n")
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert "fixed PC001 [live-clock]" in out and err == ""
    header = '{%- if date_string is not defined %}{%- set date_string = "15/01" %}{%- endif %}\n'
    fixed = header + template.replace("strftime_now('%d/%m')", "date_string")
    # every "<" of the fixed template is one of the file's (kept as \\u003c); the header's "/"
    # is new, written as "\\/" as the file writes them
    assert path.read_text() == '{"chat_template": ' + json.dumps(fixed).replace("/", "\\/").replace("<", "\\u003c") + "}\n"


def test_a_json_template_value_is_rewritten_only_where_it_changed():
    """Random edits of random strings in both escaping styles: the value reads back as the
    new template, and the literal keeps every byte before and after the changed part."""
    import random

    from tmpl_lint.containers import replace_json_template

    generator = random.Random(7)
    alphabet = ["a", "/", "\\", '"', "\n", "\u00e9", "\U0001f600", "<", "\ud800"]
    for _ in range(2000):
        old = "".join(generator.choice(alphabet) for _ in range(generator.randint(0, 8)))
        new = "".join(generator.choice(alphabet) for _ in range(generator.randint(0, 8)))
        for literal in (json.dumps(old), json.dumps(old, ensure_ascii=False).replace("/", "\\/")):
            written = replace_json_template('{"chat_template": ' + literal + "}", None, new)
            assert json.loads(written)["chat_template"] == new
            same_start = len(os.path.commonprefix([old, new]))
            if same_start == len(old) == len(new):
                assert written == '{"chat_template": ' + literal + "}"


def test_two_python_literals_on_one_line_are_each_fixed_as_themselves(tmp_path):
    path = tmp_path / "configs.py"
    first, second = "{{ strftime_now('%Y') }}", "{{ strftime_now('%d') }}"
    path.write_text(f'a = dict(chat_template="{first}"); b = dict(chat_template="{second}")\n')
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert (code, err) == (0, "")
    assert out.count("fixed PC001") == 2
    (a_literal, b_literal) = [node.value.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.keyword)]
    assert a_literal == '{%- if date_string is not defined %}{%- set date_string = "2026" %}{%- endif %}\n{{ date_string }}'
    assert b_literal == '{%- if date_string is not defined %}{%- set date_string = "15" %}{%- endif %}\n{{ date_string }}'


def test_a_template_written_as_adjacent_python_literals_is_refused_once(tmp_path):
    path = tmp_path / "config.py"
    before = 'chat_template = (\n    "{{ strftime_now(\'%Y\') }}"\n    "{% for m in messages %}{{ m.content }}{% endfor %}"\n)\n'
    path.write_text(before)
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--output-format", "full")
    assert path.read_text() == before
    assert err == ""
    assert out.splitlines()[0] == (
        f"{path}:chat_template@2: not fixed: the template chat_template@2 is written as 2 adjacent string literals; "
        "tmpl-lint rewrites a single literal only: join them into one and run --fix again"
    )
    assert "fixed" not in out.replace("not fixed", "")
    assert f"{path}:2:9: PC001 [live-clock] (template chat_template@2)" in out  # still reported, where the file holds it
    assert code == 1
    # proven, the PC001 fails after --fix: the refusal is its reason, said once, not another
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--frozen-date", FROZEN)
    assert (code, [line for line in out.splitlines() if "not fixed" in line]) == (1, [out.splitlines()[0]])


def test_diff_exits_1_and_applies_with_patch(tmp_path):
    path = copy(CORPUS / "PC001_live_clock.jinja", tmp_path)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{{ strftime_now('%Y') }}\n{{ messages }}"}, indent=2))
    before = {file: file.read_bytes() for file in (path, config)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tmpl_lint",
            path.name,
            config.name,
            "--diff",
            "--unsafe-fixes",
            "--no-prove",
            "-q",
            "--frozen-date",
            FROZEN,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    # what would be fixed goes to stderr; stdout is the patch and nothing else
    assert result.stderr.splitlines() == [
        "PC001_live_clock.jinja:3:28: would fix PC001 [live-clock]: the model sees the date 2026-01-15 instead of "
        "today's unless the caller passes date_string",
        f"tokenizer_config.json:2:{config.read_text().splitlines()[1].index('strftime_now') + 1}: would fix PC001 "
        "[live-clock]: the model sees the date 2026 instead of today's unless the caller passes date_string",
    ]
    assert {file: file.read_bytes() for file in before} == before  # --diff writes nothing
    patch = result.stdout
    assert patch.startswith("--- a/PC001_live_clock.jinja\n+++ b/PC001_live_clock.jinja\n")
    assert subprocess.run(["patch", "-p1", "--quiet"], input=patch, text=True, cwd=tmp_path).returncode == 0
    fixed = {file: file.read_bytes() for file in before}
    for file, data in before.items():
        file.write_bytes(data)
    assert run(str(path), str(config), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)[0] == 0
    assert {file: file.read_bytes() for file in before} == fixed  # the diff is what --fix writes
    clean = run(str(CORPUS / "clean_chatml.jinja"), "--diff", "--unsafe-fixes", "--no-prove")
    assert clean[0] == 0


@needs_shared
@pytest.mark.parametrize("style", ["compact", "spaced"])
def test_tool_args_style_on_a_stock_qwen3_config_is_what_the_finding_advises(tmp_path, style):
    # Qwen3 already passes strings through: the finding names --fix and the style; the fix
    # for a model that writes compact JSON names the separators, and for one that writes
    # spaced JSON, as Qwen3's `tojson` does, there is nothing to fix.
    config = copy(SHARED_TOKENIZERS / "qwen3" / "tokenizer_config.json", tmp_path)
    code, out, _ = run(str(config), "--format", "json", "--no-prove")
    (advice,) = [finding["message"] for finding in json.loads(out) if finding["code"] == "PC004"]
    assert advice.endswith(
        'say how the model writes them with --tool-args-style (compact, the default, or spaced for ", " and ": ")'
    )
    code, out, err = run(str(config), "--fix", "--unsafe-fixes", "--no-prove", "--tool-args-style", style, "--format", "json")
    fixed = (
        "fixed PC004 [tool-args-reserialized]: a mapping of tool-call arguments (vLLM always passes one) renders as the "
        'model writes it: {"city":"Paris"}\n'
    )
    assert (fixed in err, "PC004" in err) == ((True, True) if style == "compact" else (False, False))
    assert [finding["code"] for finding in json.loads(out) if finding["code"] == "PC004"] == []
    written = 'tool_call.arguments | tojson(separators=(",", ":"))' if style == "compact" else "tool_call.arguments | tojson }}"
    assert written in json.loads(config.read_text())["chat_template"]


def test_a_config_folder_does_not_cost_the_fix_a_second_lint(monkeypatch):
    # With every code selected the fixer's own lint is the verifier's; a config found in a
    # folder (the usual pre-commit set-up) selects the same codes and must reuse it too.
    from datetime import date

    from tmpl_lint.fix import apply, verify
    from tmpl_lint.fix.options import FixOptions
    from tmpl_lint.selection import Selection

    (source,), _ = collect([CORPUS / "PC001_live_clock.jinja"])
    counts = []
    for selection in (Selection(), Selection.parse(None, None, {}, PROJECT)):
        lints = []
        for module in (apply, verify):  # the fix's own lint and the verifier's
            monkeypatch.setattr(
                module,
                "lint_with_facts",
                lambda *a, _real=module.lint_with_facts, _lints=lints, **k: _lints.append(1) or _real(*a, **k),
            )
        fixed = apply.fix_template(source, FixOptions(date(2026, 1, 15), unsafe_fixes=True), selection)
        monkeypatch.undo()
        counts.append((len(lints), len(fixed.applied)))
    assert counts[1] == counts[0]
    assert counts[0][1] == 1
    # ignoring a code there is another selection: the verifier lints for itself
    assert not Selection.parse(None, ["PC005"], {}, PROJECT).runs_every_code_on(source.path)
    assert Selection.parse(None, None, {"*.jinja": ["PC005"]}, PROJECT).runs_every_code_on(CORPUS / "x.yaml")


def test_a_failing_finding_the_proof_found_says_why_fix_left_it(tmp_path):
    # The header the generation prompt opens with ('ASSISTANT:', line 10) is never printed
    # by history: no pattern shows it, the proof finds it (PC006 at the generation-prompt
    # test, 9:8), and --fix has nothing to edit. It fails the run after --fix: a line says why.
    template = copy(CORPUS / "PC006_header_never_replayed.jinja", tmp_path)
    original = template.read_bytes()
    code, out, _ = run(str(template), "--fix", "--unsafe-fixes")
    assert code == 1
    assert (
        f"{template}:9:8: not fixed PC006 [generation-prompt-mismatch]: found by the proof, not from a pattern a fix edits: no automatic fix\n"
        in out
    )
    assert template.read_bytes() == original


# -- a line a fix inserts ends as the template's own lines do ---------------------------------

# A clock before the loop: PC001's fix sets date_string on a line of its own at the top.
CLOCK_LINES = ['{{- "Today: " + strftime_now("%Y") }}', "{%- for m in messages %}", "{{- m.content }}", "{%- endfor %}"]
HEADER = '{%- if date_string is not defined %}{%- set date_string = "2026" %}{%- endif %}'


def fixed_lines() -> list[str]:
    """The template fixed by hand: the header line first, the clock replaced by date_string."""
    return [HEADER] + [line.replace('strftime_now("%Y")', "date_string") for line in CLOCK_LINES]


def lone_line_feeds(data: bytes) -> int:
    return data.count(b"\n") - data.count(b"\r\n")


def test_a_crlf_template_gets_its_inserted_line_in_crlf(tmp_path):
    path = tmp_path / "chat_template.jinja"
    path.write_bytes("\r\n".join(CLOCK_LINES).encode() + b"\r\n")
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert (code, err) == (0, "")
    assert "fixed PC001 [live-clock]" in out
    assert path.read_bytes() == ("\r\n".join(fixed_lines()) + "\r\n").encode()
    assert lone_line_feeds(path.read_bytes()) == 0


@pytest.mark.parametrize("newline", ["\r\n", "\n"])
def test_a_template_in_json_gets_its_own_line_ending_not_the_files(tmp_path, newline):
    # the file's own lines end in CRLF either way; the template's are in its string
    template = newline.join(CLOCK_LINES) + newline
    path = tmp_path / "tokenizer_config.json"
    path.write_bytes(b'{\r\n  "chat_template": ' + json.dumps(template).encode() + b',\r\n  "eos_token": "</s>"\r\n}\r\n')
    code, _, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert (code, err) == (0, "")
    after = path.read_bytes()
    assert after.startswith(b'{\r\n  "chat_template": ') and after.endswith(b',\r\n  "eos_token": "</s>"\r\n}\r\n')
    assert json.loads(after)["chat_template"] == newline.join(fixed_lines()) + newline
    assert lone_line_feeds(after) == 0  # escaped inside the string, CRLF outside it


def test_a_yaml_block_in_a_crlf_file_keeps_crlf_on_every_line(tmp_path):
    text = "models:\r\n  - name: a\r\n    chat_template: |\r\n" + "".join(f"      {line}\r\n" for line in CLOCK_LINES)
    path = tmp_path / "serving.yaml"
    path.write_bytes((text + "other: 1\r\n").encode())
    code, _, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert (code, err) == (0, "")
    block = "".join(f"      {line}\r\n" for line in fixed_lines())
    assert path.read_bytes() == ("models:\r\n  - name: a\r\n    chat_template: |\r\n" + block + "other: 1\r\n").encode()


@pytest.mark.parametrize(
    "lines",
    [
        CLOCK_LINES,  # a literal over several lines
        ["".join(CLOCK_LINES)],  # one line, which the fix makes two
    ],
)
def test_a_triple_quoted_python_template_in_a_crlf_file_keeps_crlf(tmp_path, lines):
    path = tmp_path / "serving.py"
    path.write_bytes(('chat_template = """' + "\r\n".join(lines) + '"""\r\nOTHER = 1\r\n').encode())
    code, _, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert (code, err) == (0, "")
    fixed = [HEADER] + [line.replace('strftime_now("%Y")', "date_string") for line in lines]
    assert path.read_bytes() == ('chat_template = """' + "\r\n".join(fixed) + '"""\r\nOTHER = 1\r\n').encode()


def test_a_python_file_keeps_its_byte_order_mark(tmp_path):
    # libcst does not write a leading BOM back: --fix and --diff dropped the three bytes
    path = tmp_path / "serving.py"
    path.write_bytes(b"\xef\xbb\xbf# bom\nchat_template = '" + "".join(CLOCK_LINES).encode() + b"'\nOTHER = 1\n")
    code, out, _ = run(str(path), "--diff", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert code == 1
    assert [line for line in out.splitlines() if "# bom" in line] == [" \ufeff# bom"]  # context, not changed
    code, _, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    fixed = HEADER + "\n" + "".join(line.replace('strftime_now("%Y")', "date_string") for line in CLOCK_LINES)
    assert (code, err) == (0, "")
    assert path.read_bytes() == b"\xef\xbb\xbf# bom\nchat_template = " + repr(fixed).encode() + b"\nOTHER = 1\n"


@pytest.mark.parametrize(
    ("text", "inserted", "expected"),
    [
        ("a\r\nb\r\n", "x\n", "x\r\na\r\nb\r\n"),  # CRLF template: the new line too
        ("a\r\nb\r\n", "x\r\n", "x\r\na\r\nb\r\n"),  # already CRLF: not doubled
        ("a\nb\n", "x\n", "x\na\nb\n"),
        ("ab", "x\n", "x\nab"),  # no line break to follow: "\n"
        ("a\r\nb\r\nc\n", "x\n", "x\r\na\r\nb\r\nc\n"),  # mixed: the one most lines use
    ],
)
def test_an_edit_inserts_line_breaks_as_the_template_writes_them(text, inserted, expected):
    from tmpl_lint.edits import Edit, apply_edits

    assert apply_edits(text, [Edit(0, 0, inserted)]) == expected


def test_a_suppressed_clock_still_explains_its_divergence_and_does_not_block_another_fix(tmp_path):
    # Line 1's clock is suppressed (left as it is); line 2's is fixed. The check after the fix
    # still sees line 1's clock: its divergence is its own, not one "no finding explains"
    # (the fix was refused: "would report PC100 (a system divergence no finding explains)").
    path = tmp_path / "s2.jinja"
    first = "{{- 'Date: ' + strftime_now('%Y') }}{# tmpl-lint: ignore[PC001] #}\n"
    path.write_text(first + "{% for m in messages %}{{ m.content }}{% endfor %}{{ strftime_now('%Y') }}\n")
    code, _, _ = run(str(path), "--fix", "--unsafe-fixes", "--frozen-date", FROZEN)
    assert path.read_text() == (
        '{%- if date_string is not defined %}{%- set date_string = "2026" %}{%- endif %}\n'
        + first
        + "{% for m in messages %}{{ m.content }}{% endfor %}{{ date_string }}\n"
    )
    assert code == 1  # what is printed after the messages is still there: PC007, which has no fix


# -- a template text met in several files is verified once ---------------------------------


def test_a_template_in_several_files_of_a_run_is_verified_once(tmp_path, monkeypatch):
    """Verifying is most of a fix: the second file holding the same template (another copy
    of a model) recalls the first one's answers, and is fixed alike. Another text is
    verified on its own."""
    made = log_verifiers(monkeypatch, tmp_path / "verifiers made", lambda source: source.path.parent.name)
    text = (CORPUS / "PC001_live_clock.jinja").read_text()
    paths = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        paths.append(tmp_path / name / "chat_template.jinja")
        paths[-1].write_text(text)
    (tmp_path / "c").mkdir()
    paths.append(tmp_path / "c" / "chat_template.jinja")
    paths[-1].write_text(text.replace("Knowledge cutoff", "Cutoff"))
    code, out, _ = run(*map(str, paths), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert sorted(made.read_text().splitlines()) == ["a", "c"]  # a and c are fixed at once
    assert paths[0].read_text() == paths[1].read_text() != text
    assert paths[2].read_text() == paths[0].read_text().replace("Knowledge cutoff", "Cutoff")
    for path in paths:
        assert f"{path}:3:28: fixed PC001 [live-clock]: " in out
    assert code == 0


def test_files_are_fixed_jobs_at_a_time_and_copies_of_a_text_one_after_another(tmp_path, monkeypatch):
    """With --jobs 2, a verifier of a's text and one of c's run at once: each waits (up to
    ten seconds) for the other to start. b holds a's text: it comes after a, and recalls."""
    import time

    made = tmp_path / "verifiers made"
    real_init = Verifier.__init__

    def meeting(self, source, *args, **kwargs):
        name = source.path.parent.name
        (tmp_path / f"started {name}").touch()
        other = tmp_path / ("started c" if name == "a" else "started a")
        deadline = time.monotonic() + 10
        while not other.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with made.open("a") as log:  # the fixes run in forked workers: logged in a file
            log.write(f"{name} {'met' if other.exists() else 'alone'}\n")
        real_init(self, source, *args, **kwargs)

    monkeypatch.setattr(Verifier, "__init__", meeting)
    text = (CORPUS / "PC001_live_clock.jinja").read_text()
    paths = []
    for name, content in (("a", text), ("b", text), ("c", text.replace("Knowledge cutoff", "Cutoff"))):
        (tmp_path / name).mkdir()
        paths.append(tmp_path / name / "chat_template.jinja")
        paths[-1].write_text(content)
    code, out, _ = run(*map(str, paths), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN, "--jobs", "2")
    assert sorted(made.read_text().splitlines()) == ["a met", "c met"]
    assert [line.split(":")[0] for line in out.splitlines() if " fixed PC001 " in line] == list(map(str, paths))
    assert paths[0].read_text() == paths[1].read_text() != text
    assert code == 0


def test_files_sharing_a_text_are_one_chain_in_file_order():
    """A file holding a text of two chains (two named templates) ties them into one."""
    from tmpl_lint.fix.files import _chains

    def source(path: str, text: str) -> TemplateSource:
        return TemplateSource(Path(path), None, text, "jinja")

    by_path = {
        Path("1"): [source("1", "x")],
        Path("2"): [source("2", "y")],
        Path("3"): [source("3", "z")],
        Path("4"): [source("4", "x")],
        Path("5"): [source("5", "y"), source("5", "x")],
    }
    assert _chains(by_path) == [[Path("1"), Path("2"), Path("4"), Path("5")], [Path("3")]]


def test_recalled_verdicts_answer_only_the_same_text_and_inputs(tmp_path):
    """Answers recalled under another key would be stale: a verdict forged for the template
    as a .jinja file is heard there, and not by the same text in a tokenizer config whose
    special tokens it renders with, nor under other options, nor by another text asking
    the same questions."""
    from datetime import date

    from tmpl_lint.fix.apply import fix_template
    from tmpl_lint.fix.options import FixOptions
    from tmpl_lint.fix.verify import Verdicts

    text = (CORPUS / "PC001_live_clock.jinja").read_text()
    (tmp_path / "jinja").mkdir()
    (tmp_path / "jinja" / "chat_template.jinja").write_text(text)
    (tmp_path / "json").mkdir()
    config = {"chat_template": text, "bos_token": "<|begin|>", "eos_token": "<|end|>"}
    (tmp_path / "json" / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "chat_template.jinja").write_text(text.replace("Knowledge cutoff", "Cutoff"))
    (as_jinja,), _ = collect([tmp_path / "jinja" / "chat_template.jinja"])
    (as_json,), _ = collect([tmp_path / "json" / "tokenizer_config.json"])
    (other,), _ = collect([tmp_path / "other" / "chat_template.jinja"])
    options = FixOptions(date(2026, 1, 15), unsafe_fixes=True)

    fresh = fix_template(as_jinja, options)
    assert [finding.code for finding, _ in fresh.applied] == ["PC001"] and fresh.verdicts.checks
    forged = Verdicts(fresh.verdicts.key, dict(fresh.verdicts.unreproduced), {q: "forged" for q in fresh.verdicts.checks})
    recalled = fix_template(as_jinja, options, recalled=(forged,))
    assert ([finding.code for finding, reason in recalled.skipped if reason == "forged"], recalled.patched) == (["PC001"], text)

    for source, other_options in (
        (as_json, options),
        (as_jinja, FixOptions(date(2026, 1, 15), block_size=32, unsafe_fixes=True)),
    ):
        fixed = fix_template(source, other_options, recalled=(forged,))
        assert [finding.code for finding, _ in fixed.applied] == ["PC001"]
        assert fixed.patched == fresh.patched
    # Another text's own questions, filed under this text's key: not heard by it.
    asked = fix_template(other, options).verdicts.checks
    misfiled = Verdicts(fresh.verdicts.key, {}, {q: "forged" for q in asked})
    fixed = fix_template(other, options, recalled=(misfiled,))
    assert [finding.code for finding, _ in fixed.applied] == ["PC001"] and fixed.patched != other.text


def test_answers_of_a_verifier_over_a_render_limit_are_not_kept():
    """A render over a limit may not be over it in another process (the time limit): what
    such a verification answered is not recalled for the next file."""
    from datetime import date

    from tmpl_lint.fix.apply import fix_template
    from tmpl_lint.fix.options import FixOptions
    from tmpl_lint.render import RenderLimits

    (source,), _ = collect([CORPUS / "PC001_live_clock.jinja"])
    fixed = fix_template(source, FixOptions(date(2026, 1, 15), limits=RenderLimits(max_bytes=300), unsafe_fixes=True))
    assert [finding.code for finding, _ in fixed.applied] == ["PC001"]  # verified: the check was asked
    assert (fixed.verdicts.checks, fixed.verdicts.unreproduced) == ({}, {})


def test_the_check_after_a_fix_renders_no_request_the_fix_proved_already(tmp_path, monkeypatch):
    """The verifier proves the fixed template; the check that follows proves it again with
    its switch values: what the verifier rendered comes with the fix, and each request of
    the fixed template is rendered once in the run."""
    from collections import Counter

    from tmpl_lint.proving import session as proving

    log = tmp_path / "requests rendered"
    render_prompt = proving.render_prompt

    def logged(engine, template, messages, **options):
        if messages != [{"role": "user", "content": "Hi"}]:  # the determinism check renders afresh by design
            request = [engine, template, messages, options["clock"](), options["tools"], options["kwargs"]]
            with log.open("a") as stream:  # rendered in forked workers: logged in a file
                stream.write(json.dumps([*request, options["add_generation_prompt"]], sort_keys=True, default=str) + "\n")
        return render_prompt(engine, template, messages, **options)

    monkeypatch.setattr(proving, "render_prompt", logged)
    path = copy(CORPUS / "PC001_live_clock.jinja", tmp_path)
    _, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--frozen-date", FROZEN)
    fixed = path.read_text()
    assert f"{path}:3:28: fixed PC001 [live-clock]: " in out
    of_fixed = Counter(line for line in log.read_text().splitlines() if json.loads(line)[1] == fixed)
    assert of_fixed and max(of_fixed.values()) == 1


@pytest.mark.parametrize(("flags", "sent_back"), [((), True), (("--no-prove",), False)])
def test_the_verifiers_renders_come_back_only_for_a_check_that_proves(tmp_path, monkeypatch, flags, sent_back):
    """What the verifier rendered is sent back from the worker for the check to take over;
    a check without proofs has no use for it (several MB over a corpus in tokens)."""
    from tmpl_lint.fix import files as fixer

    log = tmp_path / "sent back"
    fix_template = fixer.fix_template

    def logged(*args, **kwargs):
        result = fix_template(*args, **kwargs)
        with log.open("a") as stream:  # fixed in forked workers: logged in a file
            stream.write(f"{result.recorded is not None}\n")
        return result

    monkeypatch.setattr(fixer, "fix_template", logged)
    path = copy(CORPUS / "PC001_live_clock.jinja", tmp_path)
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--frozen-date", FROZEN, *flags)
    assert f"{path}:3:28: fixed PC001 [live-clock]: " in out and code == 0
    assert log.read_text() == f"{sent_back}\n"
