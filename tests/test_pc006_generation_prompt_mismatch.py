import json

import pytest
from click.testing import CliRunner
from helpers import (
    CORPUS,
    SHARED_TEMPLATES,
    SHARED_TOKENIZERS,
    at,
    lint_fixture,
    lint_text,
    needs_shared,
    prove_fixture,
    prove_text,
)

from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.cli import main
from tmpl_lint.fix.verify import found_by_proof
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.proving.session import Prover


def test_fixture_with_default_stable_switch():
    codes, findings = lint_fixture("PC006_generation_prompt_mismatch.jinja")
    assert codes == [("PC006", 12, 13)]
    switch = findings[0].switch
    assert switch.name == "enable_thinking"
    assert switch.default_is_stable is True
    assert switch.unstable_value is False
    assert (
        "breaks when enable_thinking=false: leave enable_thinking unset" in findings[0].full_message()
    )  # unproven: the analysis's


def test_history_that_prints_the_opener_every_turn_is_clean():
    source = (
        "{% for m in messages %}{% if m.role == 'assistant' %}<think>{{ m.reasoning_content }}</think>{{ m.content }}"
        "{% else %}{{ m.content }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant><think>{% endif %}"
    )
    assert lint_text(source)[0] == []


def test_generation_prompt_without_opener_is_clean():
    assert lint_fixture("clean_chatml.jinja")[0] == []


# Nemotron 3's shape: reasoning or not, every turn prints an opener, but a turn without
# reasoning prints "<think></think>" where the reply was opened with "<think>\n".
EMPTY_OPENER_DIFFERS = (
    "{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% if m.reasoning_content %}{{ '<think>\\n' + m.reasoning_content + '</think>' }}{% else %}{{ '<think></think>' }}{% endif %}"
    "{{ m.content }}{% else %}{{ m.content }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<assistant><think>\\n' }}{% endif %}"
)


def test_an_empty_opener_that_differs_from_the_generation_prompt_is_reported():
    codes, findings = lint_text(EMPTY_OPENER_DIFFERS)
    assert [(code, line) for code, line, _ in codes] == [("PC006", 1)]
    assert "history prints '<think></think>' for some turns" in findings[0].message


def test_an_empty_opener_matching_the_generation_prompt_is_clean():
    matching = EMPTY_OPENER_DIFFERS.replace("{{ '<think></think>' }}", "{{ '<think>\\n</think>' }}")
    assert lint_text(matching)[0] == []


# Seed-OSS's shape: the opener is built with `+` from names set to constants. Arithmetic
# must fold (the parser makes Add, not BinExpr) for the analysis to read the opener at all.
OPENER_BUILT_WITH_PLUS = (
    "{%- set think_begin = '<seed:think>' %}{%- set think_end = '</seed:think>' %}"
    "{% for m in messages %}{{ m.role + '\\n' + m.content }}{% endfor %}\n"
    "{%- if add_generation_prompt %}{{ 'assistant\\n' }}{{ think_begin + '\\n' + 'no thinking' + think_end }}{% endif %}"
)


def test_an_opener_built_with_plus_from_constants_is_read():
    codes, findings = lint_text(OPENER_BUILT_WITH_PLUS)
    assert [(code, line) for code, line, _ in codes] == [("PC006", 2)]
    assert "opens the reply with '<seed:think>\\nno thinking</seed:think>'" in findings[0].message
    assert "history never prints '<seed:think>'" in findings[0].message


@pytest.mark.parametrize(
    ("condition", "opens"),
    [("2 * 3 == 6", True), ("2 * 3 == 7", False), ("7 % 2 == 0", False), ("3 - 1 == 5", False), ("2 ** 3 == 8", True)],
)
def test_a_branch_that_arithmetic_on_constants_rules_out_prints_no_opener(condition, opens):
    source = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}\n"
        "{%- if add_generation_prompt %}assistant: {% if " + condition + " %}<think>{% endif %}{% endif %}"
    )
    assert [(code, line) for code, line, _ in lint_text(source)[0]] == ([("PC006", 2)] if opens else [])


# -- found by the proof -------------------------------------------------------------------

# What every chat scenario's first call renders before the reply: counted by hand.
CHATML_FIRST_TURN = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_a_stray_newline_no_opener_shows_is_found_by_the_proof_at_the_generation_prompt():
    assert lint_fixture("PC006_stray_newline.jinja")[0] == []  # the analysis sees nothing
    codes, (finding,) = prove_fixture("PC006_stray_newline.jinja")
    assert codes == [("PC006", 7, 8)]  # `add_generation_prompt` in `{%- if add_generation_prompt %}`
    assert finding.severity == "warning" and finding.fails()
    divergence = finding.proof.divergence
    assert (divergence.scenario, divergence.call, divergence.check) == ("chat", 0, "b")
    # prompt N + the reply: "assistant\n\nParis."; history: "assistant\nParis."
    assert divergence.first_divergence == len(CHATML_FIRST_TURN)
    assert (divergence.message_index, divergence.role, divergence.cause) == (1, "assistant", "generation-prompt")
    assert "the cached prompt has '\\nParis.<|im_end|>' where the next turn has 'Paris.<|im_end|>\\n<|im_st'" in (finding.message)


def test_a_header_history_never_prints_is_found_by_the_proof():
    codes, (finding,) = prove_fixture("PC006_header_never_replayed.jinja")
    assert codes == [("PC006", 9, 8)]
    divergence = finding.proof.divergence
    assert divergence.first_divergence == len("USER: What is the capital of France?\n")
    assert (divergence.message_index, divergence.cause) == (1, "generation-prompt")
    # the reply the model wrote counts, though the template never prints it
    assert divergence.before.endswith("ASSISTANT:Paris.")


def test_a_default_that_drops_reasoning_with_the_opener_leaves_the_switched_opener_its_own():
    # The analysis: an opener mismatch only when enable_thinking=false, "leave it unset".
    _, static = lint_fixture("PC006_default_still_opens.jinja")
    pc006 = next(f for f in static if f.code == "PC006")
    assert (pc006.severity, pc006.switch.default_is_stable, pc006.switch.unstable_value) == ("warning", True, False)
    # The renders: by default history drops "<think>\n" and the reasoning written after it
    # once the next query arrives, the last-query rewrite's (keeping reasoning wins it
    # back); that refutes nothing of the opener's claim. With enable_thinking=false history
    # drops only "<think>\n\n</think>\n\n", which the generation prompt printed, and goes on
    # with the answer: the opener's own divergence.
    # Issue 33, one break, one named rule: where the first difference is in the text the
    # generation prompt printed ("<think>\n" by default), the break is PC006's whatever
    # rewrite sits nearby; PC002 keeps the earlier turns it rewrites (the agent's).
    codes, (pc002, pc006) = prove_fixture("PC006_default_still_opens.jinja")
    assert codes == [("PC002", 14, 58), ("PC006", 23, 13)]
    assert pc002.fails(False) and ("agent", "history-rewrite") in pc002.proof.explains
    assert (pc006.severity, pc006.fails(False), pc006.related_findings) == ("warning", True, ())
    assert {("chat", "reply-rewrite"), ("chat, enable_thinking=false", "generation-prompt")} <= set(pc006.proof.explains)


def test_a_value_whose_renders_diverge_is_not_advised():
    # the false branch opens " <think></think>", the true branch " <think>": history
    # prints neither. The analysis sees the first only, and advised "pass true"; the renders
    # with true diverge, so only leaving it unset is advised.
    source = (
        "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n\n{% endfor %}"
        "{%- if add_generation_prompt %}assistant:"
        "{% if enable_thinking is defined and enable_thinking is false %} <think></think>{% endif %}"
        "{% if enable_thinking is defined and enable_thinking is true %} <think>{% endif %}{% endif %}"
    )
    _, static = lint_text(source)
    assert static[0].switch.stable_value is True  # the analysis's advice
    codes, (finding,) = prove_text(source)
    assert codes == [at("PC006", source, "<think></think>")]
    assert (finding.severity, finding.switch.stable_value, finding.switch.default_is_stable) == ("warning", None, True)
    assert finding.full_message().endswith(
        "breaks when enable_thinking=true or enable_thinking=false (stable when unset); leave enable_thinking unset to avoid it"
    )
    assert ("agent, enable_thinking=true", "generation-prompt") in finding.proof.explains


AS_TRAINED = CORPUS / "PC006_reply_as_trained.jinja"


def test_a_reply_whose_reasoning_history_leaves_out_as_trained_fails():
    # Every past answer loses its reasoning, as gpt-oss's format drops a final answer's
    # analysis: the reply just generated differs from its history render, and each turn
    # recomputes it: more than its end marker, so no bounded loss (issue 33).
    codes, (finding,) = prove_fixture("PC006_reply_as_trained.jinja")
    assert codes == [("PC006", 8, 8)]  # found by the proof, at the generation prompt's test
    assert (finding.severity, finding.fails(), finding.proof.bound) == ("warning", True, None)
    divergence = finding.proof.divergence
    # "<|user|>What is the capital of France?<|end|><|assistant|>" is 58 characters: the reply's
    # "<think>" is where the history render ("Paris.") parts from what the model generated.
    assert (divergence.check, divergence.first_divergence, divergence.message_index) == ("b", 58, 1)
    assert divergence.reply_as_trained == "reasoning"
    result = CliRunner().invoke(main, [str(AS_TRAINED)])
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == "Found 1 finding (1 failing)."


def test_the_fixer_counts_it_as_failing_and_other_divergences_too():
    text = AS_TRAINED.read_text()
    assert found_by_proof(Prover(text, None).run({}), []) == {("PC006", "reply-rewrite")}
    # The same template counting its turns in the system line: every turn rewrites the start.
    counting = "{{- 'turns: ' ~ (messages|length) ~ '\\n' }}" + text
    assert ("PC100", "system") in found_by_proof(Prover(counting, None).run({}), [])


def test_fix_leaves_a_switched_opener_it_has_no_fix_for_failing(tmp_path, monkeypatch):
    # Only with enable_thinking=false, a value a deployment may set: it fails (issue 33), and
    # --fix, which has no fix for it, leaves it as it was and says what breaks.
    source = (
        "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{%- endfor %}\n"
        "{%- if add_generation_prompt %}<|assistant|>"
        "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}{%- endif %}\n"
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jinja").write_text(source)
    fixed = CliRunner().invoke(main, ["t.jinja", "--fix", "--unsafe-fixes", "--output-format", "full"])
    _, line, column = at("PC006", source, "<think></think>")
    assert fixed.exit_code == 1
    (said,) = [text for text in fixed.stdout.splitlines() if text.startswith(f"t.jinja:{line}:{column}: PC006")]
    assert "breaks when enable_thinking=false (stable when true or unset)" in said
    assert (tmp_path / "t.jinja").read_text() == source
    assert fixed.stdout.endswith(
        "Found 1 finding (1 failing).\nLeft to fix by hand: PC006 (`tmpl-lint rule CODE` shows what to write instead; "
        "`{# tmpl-lint: ignore[CODE] #}` on its line suppresses one).\n"
    )


@needs_shared
def test_found_by_proof_it_stands_at_the_test_that_prints_the_generation_prompt_even_inside_the_loop():
    # Apriel prints the generation prompt on the loop's last message; ORACLE.tsv: the tail
    # differs in chat and agent. The finding stood at line 1, on a comment.
    path = SHARED_TEMPLATES / "ServiceNow-AI--Apriel-1.6-15b-Thinker.jinja"
    text = path.read_text()
    line = "    {%- if loop.last and add_generation_prompt and message['role'] != 'assistant' -%}"
    number = text.splitlines().index(line) + 1
    codes, _ = prove_text(text, "vllm", str(path))
    assert ("PC006", number, line.index("add_generation_prompt") + 1) in codes


@needs_shared
def test_the_same_text_split_into_other_tokens_is_placed_where_the_token_starts():
    # Qwen3.5's generation prompt ends "<think>\n" (token 198); the model writes "\n"
    # (198) and history prints "<think>\n\n" ("\n\n" is 271). The texts agree; the tokens
    # part at the prompt's last token: 268, char 1235 (counted with transformers' renderer
    # and the tokenizers library, not tmpl-lint). It was placed at the end of the text.
    path = SHARED_TEMPLATES / "Qwen--Qwen3.5-4B.jinja"
    text = path.read_text(encoding="utf-8")
    source = TemplateSource(path, None, text, "jinja")
    findings = lint_source(source, prove=ProveOptions(tokenizer=SHARED_TOKENIZERS / "qwen3"))
    (split,) = [f for f in findings if f.code == "PC006" and f.proof.divergence.split_differently]
    assert (split.line, split.column) == (147, 8)  # found by the proof, at the add_generation_prompt test
    divergence = split.proof.divergence
    assert (divergence.scenario, divergence.first_divergence, divergence.first_divergence_char) == (
        "agent, narrated tool calls",
        268,
        1235,
    )
    assert divergence.cause == "generation-prompt"
    assert "the next turn prints the same text as the cached prompt, '\\n\\n</think>\\n\\nChecking the', but its tokens part" in (
        split.message
    )


@needs_shared
def test_a_switched_opener_is_not_proven_by_a_rewrite_another_rule_explains():
    # Qwen3 prints '<think>\n\n</think>\n\n' at line 83 only under `enable_thinking is false`;
    # by default its generation prompt opens nothing. The default scenarios' reply rewrites
    # are its reasoning dropped once the next user query arrives (PC002's last-query rewrite,
    # line 39) and an empty think block left out (the model's format): neither refutes
    # "only when enable_thinking=false". It was failing, proven by "agent, narrated tool calls".
    # With thinking off, history leaves out only the block the generation prompt opened and
    # goes on with all the model wrote: the prompt's divergence, not a rewrite of the reply
    # (replay named it PC002, whose fix wins none of it back).
    text = (SHARED_TEMPLATES / "Qwen--Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    assert text.splitlines()[81:83] == [
        "    {%- if enable_thinking is defined and enable_thinking is false %}",
        "        {{- '<think>\\n\\n</think>\\n\\n' }}",
    ]
    # The empty think block the model writes itself (narrated tool calls, the switch unset)
    # is not what the switch turns on: it is found by the proof, at the generation prompt's
    # test, as the model's format (the switched finding listed that scenario).
    codes, findings = prove_text(text, engine="vllm")
    assert codes == [("PC002", 39, 30), ("PC004", 62, 47), ("PC006", 80, 8), ("PC006", 83, 13)]
    as_trained, pc006 = findings[2:]
    # issue 33: the dropped empty block costs the reply every turn, not only its end marker
    assert (as_trained.severity, as_trained.switch, as_trained.proof.bound) == ("warning", None, None)
    assert {scenario for scenario, _ in as_trained.proof.explains} == {"agent, narrated tool calls"}
    assert (pc006.severity, pc006.fails(False)) == ("warning", True)
    assert "breaks when enable_thinking=false (stable when true or unset)" in pc006.full_message()
    assert (pc006.switch.name, pc006.switch.default_is_stable, pc006.switch.unstable_value) == ("enable_thinking", True, False)
    divergence = pc006.proof.divergence
    assert (divergence.scenario, divergence.cause) == ("agent, enable_thinking=false", "generation-prompt")
    assert {scenario for scenario, _ in pc006.proof.explains} == {"agent, enable_thinking=false", "chat, enable_thinking=false"}
    assert [f.fails(False) for f in findings[:2]] == [True, True]


# The opener only under enable_thinking=false, and, apart from it, ` [END]` printed on the
# last message when it is the assistant's: the reply as generated ends with it, history not.
OPENER_AND_LAST_SUFFIX = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}{% if loop.last and m.role == 'assistant' %} [END]{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_the_opener_finding_does_not_adopt_a_reply_rewrite_that_is_not_its_opener():
    """The [END] rewrite diverges in every scenario, enable_thinking or not; it is not the
    opener's pattern. The opener finding keeps what the renders show of it (only when
    enable_thinking=false: informational, with the advice); the [END] divergence is found by
    the proof at the generation prompt's test, and fails the run."""
    source = OPENER_AND_LAST_SUFFIX
    codes, findings = prove_text(source)
    opener_at = at("PC006", source, "<think>")  # the text it quotes, not the line's `if`
    prompt_test_at = at("PC006", source, "add_generation_prompt")
    assert sorted(codes) == sorted([opener_at, prompt_test_at])
    opener = next(finding for finding in findings if (finding.code, finding.line, finding.column) == opener_at)
    assert (opener.severity, opener.fails()) == ("warning", True)  # a deployment may set it (issue 33)
    assert (opener.switch.name, opener.switch.default_is_stable, opener.switch.unstable_value) == ("enable_thinking", True, False)
    assert "breaks when enable_thinking=false (stable when true or unset)" in opener.full_message()
    assert opener.proof.is_proven and opener.proof.divergence.in_generation_prompt
    suffix = next(finding for finding in findings if (finding.code, finding.line, finding.column) == prompt_test_at)
    assert suffix.severity == "warning" and suffix.proof.is_proven
    assert "' [END]'" in suffix.message
    assert suffix.proof.divergence.cause == "reply-rewrite"


# -- what the generation prompt opens the reply with, and where it is written ---------------

# GLM-5.2's shape (zai-org--GLM-5.2.jinja:120): the opener is a choice between two literals.
CHOSEN_OPENER = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{{ '<think></think>' if (enable_thinking is defined and not enable_thinking) else '<think>' }}\n"
    "{%- endif %}"
)


def test_a_choice_of_openers_quotes_the_one_the_default_render_prints_where_it_is_written():
    codes, (finding,) = lint_text(CHOSEN_OPENER)
    # enable_thinking unset: the test is false, the else branch prints '<think>'. It quoted
    # '<think></think><think>' (both branches glued), which no render prints.
    assert finding.message.startswith("the generation prompt opens the reply with '<think>' but history never prints")
    assert codes == [at("PC006", CHOSEN_OPENER, "'<think>'")]  # it stood at `enable_thinking`
    # Either value of the switch still opens a '<think>' history never prints: no advice,
    # and the place does not move with the value tried (a trial at another place passed for
    # a trial without the finding).
    assert finding.switch is None


# History opens every reply with "<think>\n"; the generation prompt too, but only with
# enable_thinking=false: by default it opens an empty block.
OPENER_MATCHING_ONLY_WHEN_SWITCHED = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{{ '<think>\\n' + m.reasoning_content + '</think>' }}{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{{ '<think>\\n' if (enable_thinking is defined and not enable_thinking) else '<think></think>' }}{%- endif %}"
)


def test_a_choice_of_openers_is_decided_by_the_switch_trial_at_one_place():
    codes, (finding,) = lint_text(OPENER_MATCHING_ONLY_WHEN_SWITCHED)
    assert codes == [at("PC006", OPENER_MATCHING_ONLY_WHEN_SWITCHED, "'<think></think>'")]
    assert "opens the reply with '<think></think>' but history prints '<think>\\n" in finding.message
    # The trial with enable_thinking=false reads the branch it takes, and the finding is gone;
    # the other trials find it at the same place (where it moved with the branch the trial
    # took, every trial lost it and no switch was named).
    assert (finding.switch.name, finding.switch.stable_value, finding.switch.default_is_stable) == (
        "enable_thinking",
        False,
        False,
    )


@needs_shared
def test_glm_5_2_quotes_the_opener_its_default_render_prints():
    # It read "opens the reply with '<think></think><think>'", at `enable_thinking`.
    lines = (SHARED_TEMPLATES / "zai-org--GLM-5.2.jinja").read_text(encoding="utf-8").splitlines()
    number = lines.index(
        "    <|assistant|>{{- '<think></think>' if (enable_thinking is defined and not enable_thinking) else '<think>' -}}"
    )
    _, findings = lint_text("\n".join(lines))
    (finding,) = [finding for finding in findings if finding.code == "PC006"]
    assert (finding.line, finding.column) == (number + 1, lines[number].index("'<think>' -}}") + 1)
    assert finding.message.startswith("the generation prompt opens the reply with '<think>' but")


def test_a_choice_the_analysis_cannot_decide_names_every_opener():
    source = CHOSEN_OPENER.replace("(enable_thinking is defined and not enable_thinking)", "messages|length > 2")
    codes, (finding,) = lint_text(source)
    assert "opens the reply with one of '<think></think>', '<think>' but" in finding.message
    assert codes == [at("PC006", source, "'<think></think>'")]


def test_a_choice_whose_default_opens_nothing_quotes_the_opener_it_can_print():
    # GLM-4.6's shape: the empty think block only with enable_thinking=false.
    source = CHOSEN_OPENER.replace("else '<think>'", "else ''")
    codes, (finding,) = lint_text(source)
    assert finding.message.startswith("the generation prompt opens the reply with '<think></think>' but")
    assert codes == [at("PC006", source, "'<think></think>'")]
    assert (finding.switch.name, finding.switch.default_is_stable) == ("enable_thinking", True)


# The generation prompt on the line that ends the loop: no name in the output that prints it.
AFTER_ENDFOR = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}{%- endif %}"
)


LAST_TURN_OPENER = (
    "{% for m in messages %}{% if loop.last %}{{ '<think>\\n' }}{% endif %}{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<think>\\n' }}{% endif %}"
)


@pytest.mark.parametrize(
    ("source", "anchor", "nth"),
    [
        (AFTER_ENDFOR, "'<|im_start|>assistant", 0),  # it stood at `endfor`
        # template text after other text on the line: it stood at column 1
        ("x{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}", "<|im_start|>", 0),
        # an output that also prints a name: it stood at the name
        (
            "{% if add_generation_prompt %}{{ '<|im_start|>' + role_name + '\\n<think>\\n' }}{% endif %}",
            "'\\n<think>",
            0,
        ),
        # history prints the same literal, on the last message only: the second one is the prompt's
        (LAST_TURN_OPENER, "'<think>\\n'", 1),
    ],
)
def test_an_opener_without_a_name_stands_at_the_literal_that_writes_it(source, anchor, nth):
    codes, _ = lint_text(source)
    assert [place for place in codes if place[0] == "PC006"] == [at("PC006", source, anchor, nth)]


def test_the_place_is_the_same_in_json_sarif_and_the_fix_lines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jinja").write_text(AFTER_ENDFOR)
    _, line, column = at("PC006", AFTER_ENDFOR, "'<|im_start|>assistant")
    runner = CliRunner()
    (finding,) = json.loads(runner.invoke(main, ["t.jinja", "--no-prove", "--format", "json"]).stdout)
    assert (finding["line"], finding["column"]) == (line, column)
    sarif = json.loads(runner.invoke(main, ["t.jinja", "--no-prove", "--format", "sarif"]).stdout)
    (result,) = sarif["runs"][0]["results"]
    region = result["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (line, column)
    fixed = runner.invoke(main, ["t.jinja", "--no-prove", "--fix", "--unsafe-fixes"])
    assert f"t.jinja:{line}:{column}: not fixed PC006 [generation-prompt-mismatch]" in fixed.stdout


@needs_shared
def test_deepseek_r1_one_line_template_places_it_at_its_generation_prompt():
    # One line of 2,600 characters; it stood at column 4, `{% if not add_generation_prompt is defined %}`.
    text = (SHARED_TEMPLATES / "deepseek-ai--DeepSeek-R1.jinja").read_text(encoding="utf-8")
    codes, findings = lint_text(text)
    column = text.index("{{'<｜Assistant｜><think>\\n'}}") + len("{{") + 1
    assert ("PC006", 1, column) in codes
