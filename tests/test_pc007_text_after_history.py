from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import CORPUS, SHARED_TEMPLATES, at, lint_fixture, lint_text, needs_shared

from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.cli import main
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.proofs import Cause, ProofStatus

FIXTURE = "PC007_text_after_history.jinja"


def prove(text: str, engine: str = "vllm"):
    return lint_source(TemplateSource(Path("t.jinja"), None, text, "jinja"), prove=ProveOptions(engine=engine))


def test_fixture_closer_after_the_loop_is_found_at_its_flag():
    codes, findings = lint_fixture(FIXTURE)
    assert codes == [("PC007", 29, 8)]
    # the tool-call branch (line 8) turns the flag off without the tag; the user branch
    # (line 5) does too, but a user message does not follow a tool result in an agent loop
    assert "'<｜tool▁outputs▁end｜>'" in findings[0].message
    assert "`ns.is_tool`" in findings[0].message and "(line 8, column 17)" in findings[0].message


def test_fixture_is_proven_at_the_tool_result_a_tool_call_follows():
    findings = prove((CORPUS / FIXTURE).read_text(encoding="utf-8"))
    assert [finding.code for finding in findings] == ["PC007"]
    proof = findings[0].proof
    assert proof.status is ProofStatus.PROVEN
    divergence = proof.divergence
    # call 1 ends with the first tool result (message 2) and the closing tag; call 2 renders
    # the second tool call there instead
    assert (divergence.scenario, divergence.call, divergence.cause) == ("agent, chained tool calls", 1, Cause.HISTORY_REWRITE)
    assert (divergence.message_index, divergence.role) == (2, "tool")
    shared = (
        "<｜User｜>Is it warmer in Paris or in Rome?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18 C, sunny"
        "<｜tool▁output▁end｜><｜"
    )
    assert divergence.first_divergence == len(shared)


def test_fix_closes_the_group_where_the_flag_is_turned_off(tmp_path):
    original = (CORPUS / FIXTURE).read_text(encoding="utf-8")
    path = tmp_path / FIXTURE
    path.write_text(original, encoding="utf-8")
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes"])
    assert "fixed PC007 [text-after-history]" in result.stdout
    closer = '{%- if ns.is_tool %}{{- "<｜tool▁outputs▁end｜>" }}{%- endif %}'
    lines = original.splitlines(keepends=True)
    for line in (5, 8):  # the user and tool-call branches, before their `set ns.is_tool = false`
        lines[line - 1] = lines[line - 1].replace("{%- set ns.is_tool = false %}", closer + "{%- set ns.is_tool = false %}")
    assert path.read_text(encoding="utf-8") == "".join(lines)
    assert result.exit_code == 0
    # and the fixed template is stable in every scenario
    assert prove(path.read_text(encoding="utf-8")) == []


TOOL_LOOP = (
    "{%- set ns = namespace(in_tool=false) %}\n"
    "{%- for m in messages %}\n"
    "{%- if m.role == 'tool' %}{% if not ns.in_tool %}[{% endif %}{% set ns.in_tool = true %}{{ m.content }},\n"
    "{%- elif m.role == 'assistant' %}{% if ns.in_tool %}]{% set ns.in_tool = false %}{% endif %}<bot>{{ m.content }}</s>\n"
    "{%- else %}{% set ns.in_tool = false %}<user>{{ m.content }}</s>\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if ns.in_tool %}]{% endif %}\n"
    "{%- if add_generation_prompt and not ns.in_tool %}<bot>{% endif %}\n"
)


def test_group_every_reply_closes_the_same_way_is_not_reported():
    # Apertus' shape: whatever the assistant turn that follows, it prints "]" first. The
    # user branch turns the flag off without it, but a user message does not follow a
    # tool result in an agent loop.
    assert lint_text(TOOL_LOOP)[0] == []
    assert prove(TOOL_LOOP) == []


def test_flag_nothing_turns_off_is_reported():
    source = TOOL_LOOP.replace("{% if ns.in_tool %}]{% set ns.in_tool = false %}{% endif %}", "").replace(
        "{% set ns.in_tool = false %}", ""
    )
    codes, findings = lint_text(source)
    assert codes == [at("PC007", source, "ns.in_tool %}]")]
    assert "nothing turns it off" in findings[0].message


def test_text_after_the_messages_on_every_turn_is_reported_and_not_fixable(tmp_path):
    source = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
        "<|system|>Answer with a JSON list of actions.<|end|>"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    codes, findings = lint_text(source)
    assert codes == [("PC007", 1, source.index("<|system|>") + 1)]
    assert "outside the generation prompt" in findings[0].message
    proven = prove(source)
    assert [finding.code for finding in proven] == ["PC007"]
    divergence = proven[0].proof.divergence
    # the most it costs, counted by hand: the narrated agent's call 1 plus its reply (the
    # model writes "Checking the weather in Paris.<|end|>" after <|assistant|>): 109 + 37 =
    # 146 chars, 144 in full 16-char blocks; call 2 renders the reply where the instruction
    # block was, after the user message (message 0), at char 46 (block 32): 112 recomputed.
    # The agent's call 2 and the chained agent's call 3 lose 112 too; the first call is shown.
    assert (divergence.scenario, divergence.call, divergence.check) == ("agent, narrated tool calls", 0, "b")
    assert (divergence.message_index, divergence.role, divergence.cause) == (0, "user", Cause.HISTORY_REWRITE)
    prompt = "<|user|>What is the weather in Paris?<|end|><|system|>Answer with a JSON list of actions.<|end|><|assistant|>"
    assert divergence.prompt_tokens[0] == len(prompt + "Checking the weather in Paris.<|end|>") == 146
    assert divergence.first_divergence == len("<|user|>What is the weather in Paris?<|end|><|") == 46
    assert (divergence.reusable_tokens, divergence.lost_tokens) == (32, 112)
    path = tmp_path / "t.jinja"
    path.write_text(source, encoding="utf-8")
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove"])
    assert "not fixed PC007 [text-after-history]: no edit keeps the model's trained format" in result.stdout
    assert path.read_text(encoding="utf-8") == source


@pytest.mark.parametrize(
    "after",
    [
        # the reply's header printed after the loop on every turn: the reply starts with it
        "<|assistant|>",
        # only whitespace
        "\n",
        # the generation prompt
        "{% if add_generation_prompt %}<|assistant|>{% endif %}",
    ],
)
def test_text_the_next_message_starts_with_is_not_reported(after):
    source = (
        "{% for m in messages %}{% if m.role == 'assistant' %}<|assistant|>{{ m.content }}<|end|>"
        "{% else %}<|user|>{{ m.content }}<|end|>{% endif %}{% endfor %}" + after
    )
    assert lint_text(source)[0] == []
    # nothing fails; a header printed after the newest reply's end marker even without a
    # generation prompt ("<|assistant|>", where the next turn has "<|user|>") is at most a
    # bounded, informational PC006 (check d), never PC007
    assert [(f.code, f.fails()) for f in prove(source) if f.code != "PC006" or f.fails()] == []
    assert all(f.proof.bound for f in prove(source))


@needs_shared
def test_deepseek_r1_closer_is_found_and_proven_as_transformers_renders_it():
    # ORACLE.tsv (transformers' renderer): agent "history,tail". Under vLLM the agent
    # scenarios do not render at all (its arguments reach the template as mappings, which
    # the template concatenates to strings), so the proof is as transformers renders it.
    text = (SHARED_TEMPLATES / "deepseek-ai--DeepSeek-R1.jinja").read_text(encoding="utf-8")
    findings = [finding for finding in prove(text, engine="hf") if finding.code == "PC007"]
    assert [(finding.line, finding.column) for finding in findings] == [
        (1, text.index("ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}") + 1)
    ]
    divergence = findings[0].proof.divergence
    assert (divergence.scenario, divergence.cause, divergence.message_index, divergence.role) == (
        "agent, chained tool calls",
        Cause.HISTORY_REWRITE,
        2,
        "tool",
    )


@needs_shared
def test_deepseek_v3_closes_tool_results_in_every_reply_and_is_not_reported():
    # ORACLE.tsv: agent "stable".
    path = SHARED_TEMPLATES / "deepseek-ai--DeepSeek-V3-0324.jinja"
    codes, _ = lint_text(path.read_text(encoding="utf-8"))
    assert [code for code, _, _ in codes if code == "PC007"] == []


# -- a value printed after the messages: the template's text around it says what moves ------

HISTORY_LOOP = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
GENERATION_PROMPT = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


@pytest.mark.parametrize(
    ("after", "anchor", "shown"),
    [
        # the year, printed alone: its literal text is only a newline
        ('{{ strftime_now("%Y") }}\n', "strftime_now", "'{{ strftime_now(\"%Y\") }}\\n'"),
        # a template variable with a default: no clock at all (/tmp/qa8/tt/f.jinja of the QA)
        ("{{ date_string }}", "date_string }}", "'{{ date_string }}'"),
    ],
)
def test_a_value_printed_after_the_messages_is_reported_and_proven_by_the_turn_that_moves_it(after, anchor, shown):
    head = '{%- if date_string is not defined %}{%- set date_string = "2026" %}{%- endif %}' if "date_string" in after else ""
    source = head + HISTORY_LOOP + after + GENERATION_PROMPT
    codes, findings = lint_text(source)
    assert at("PC007", source, anchor) in codes
    (finding,) = [finding for finding in findings if finding.code == "PC007"]
    assert f"{shown} is printed after the messages" in finding.message
    proven = prove(source, engine="hf")
    assert "PC100" not in [finding.code for finding in proven]
    (text_after,) = [finding for finding in proven if finding.code == "PC007"]
    assert text_after.fails()
    # chat, call 1 -> 2: the value printed after the user message is where call 2 prints the reply
    assert ("chat", Cause.HISTORY_REWRITE) in text_after.proof.explains
    divergence = text_after.proof.divergence
    assert divergence.cause is Cause.HISTORY_REWRITE and divergence.scenario_kind != "clock"


def test_the_clock_after_the_messages_is_the_clocks_in_the_clock_scenarios_and_the_moves_otherwise():
    # /tmp/qa8/tt/e.jinja of the QA: PC100 "and no rule explains why" for the chat's turns.
    source = HISTORY_LOOP + '{{ strftime_now("%Y") }}\n' + GENERATION_PROMPT
    proven = prove(source, engine="hf")
    by_code = {finding.code: finding for finding in proven}
    assert sorted(by_code) == ["PC001", "PC007"]
    assert all(finding.fails() for finding in proven)
    # the clock moved a year between two sends of one conversation: PC001's
    assert by_code["PC001"].proof.divergence.scenario_kind == "clock"
    assert by_code["PC001"].proof.divergence.before.endswith("France?<|im_end|>\n2026\n<|im_start|>assistant\n")
    # the clock stands still in the turns (every call at midday): the year moves behind the
    # new messages, which PC001's fix (a fixed date_string) would not change
    assert {scenario for scenario, _ in by_code["PC007"].proof.explains} >= {"chat", "agent"}
    assert not any(scenario.startswith("clock") for scenario, _ in by_code["PC007"].proof.explains)


def test_text_with_a_value_in_it_is_shown_with_that_value_s_expression():
    # /tmp/qa8/tt/d.jinja of the QA: the message said 'Today: \n'
    source = HISTORY_LOOP + 'Today: {{ strftime_now("%Y") }}\n' + GENERATION_PROMPT
    codes, findings = lint_text(source)
    assert at("PC007", source, "Today") in codes
    (finding,) = [finding for finding in findings if finding.code == "PC007"]
    assert finding.message.startswith("'Today: {{ strftime_now(\"%Y\") }}\\n' is printed after the messages")


def test_a_literal_printed_in_braces_beside_a_value_is_shown_as_it_prints():
    # a string printed as {{ "Today: " }} shows as the text it prints, not as '{{ ... }}'
    source = HISTORY_LOOP + '{{ "Today: " }}{{ strftime_now("%Y") }}\n' + GENERATION_PROMPT
    (finding,) = [finding for finding in lint_text(source)[1] if finding.code == "PC007"]
    assert finding.message.startswith("'Today: {{ strftime_now(\"%Y\") }}\\n' is printed after the messages")


def test_a_refusal_after_the_messages_prints_nothing_and_is_not_reported():
    source = HISTORY_LOOP + "{% if messages[-1].role == 'assistant' %}{{ raise_exception('no') }}{% endif %}" + GENERATION_PROMPT
    assert lint_text(source)[0] == []


def test_a_choice_of_blank_literals_after_the_messages_is_whitespace_and_not_reported():
    source = HISTORY_LOOP + '{{ "\\n" if tools else "" }}' + GENERATION_PROMPT
    assert lint_text(source)[0] == []
