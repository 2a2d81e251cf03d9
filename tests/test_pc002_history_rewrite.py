from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import CORPUS, SHARED_TEMPLATES, at, lint_fixture, lint_text, needs_shared, prove_fixture, prove_text

from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.cli import main
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.proofs import Cause, ProofStatus


def test_fixture_renamed_scan_is_found():
    codes, findings = lint_fixture("PC002_history_rewrite.jinja")
    assert codes == [("PC002", 13, 48)]
    assert "`state.newest_query` (set at line 6)" in findings[0].message
    assert findings[0].switch is None


def test_fixture_switch_named_with_stable_value():
    codes, findings = lint_fixture("PC002_history_rewrite_switch.jinja")
    assert codes == [("PC002", 11, 87)]
    switch = findings[0].switch
    assert (switch.name, switch.stable_value, switch.default_is_stable) == ("keep_history_reasoning", True, False)


def test_variable_named_last_query_index_that_changes_nothing():
    assert lint_fixture("clean_unused_last_query_index.jinja")[0] == []


def test_running_state_inside_the_render_loop_is_not_a_scan():
    source = (
        "{% set ns = namespace(seen_user=false) %}"
        "{% for m in messages %}"
        "{% if ns.seen_user %}{{ m.content }}{% endif %}"
        "{% if m.role == 'user' %}{% set ns.seen_user = true %}{% endif %}"
        "{% endfor %}"
    )
    assert lint_text(source)[0] == []


def test_scan_over_indices_is_found():
    source = (
        "{% set ns = namespace(last=-1) %}\n"
        "{% for i in range(messages|length) %}{% if messages[i].role == 'user' %}{% set ns.last = i %}{% endif %}{% endfor %}\n"
        "{% for m in messages %}{% if loop.index0 >= ns.last %}{{ m.reasoning_content }}{% endif %}{{ m.content }}{% endfor %}\n"
    )
    assert lint_text(source)[0] == [at("PC002", source, "ns.last %}")]


def test_split_of_messages_at_a_scanned_position_is_found():
    source = (
        "{% set ns = namespace(cut=0) %}\n"
        "{% for m in messages %}{% if m.role == 'user' %}{% set ns.cut = loop.index0 %}{% endif %}{% endfor %}\n"
        "{% for m in messages[:ns.cut] %}{{ m.content }}{% endfor %}\n"
    )
    assert lint_text(source)[0] == [at("PC002", source, "ns.cut]")]


# -- the last query's position reaching a turn through data flow (issue 14) --------------


def _render_loop(condition: str) -> str:
    return (
        "{% for m in messages %}"
        f"{{% if {condition} %}}{{{{ m.reasoning_content }}}}{{% endif %}}{{{{ m.content }}}}"
        "{% endfor %}\n"
    )


@pytest.mark.parametrize(
    ("fixture", "place"),
    [
        # a reverse scan that stops at the newest user query ({% break %})
        ("PC002_reverse_scan_break.jinja", (10, 58)),
        # the scanned position copied into a plain variable: reported where the scan is read
        ("PC002_copied_index.jinja", (8, 16)),
        # a boolean derived from the position decides the render
        ("PC002_boolean_flag.jinja", (9, 34)),
        # position -> copy -> flag -> what a namespace string accumulates -> printed after the loop
        ("PC002_accumulator.jinja", (8, 18)),
    ],
)
def test_fixture_idioms_are_found_where_the_scan_is_read(fixture, place):
    codes, findings = lint_fixture(fixture)
    assert codes == [("PC002", *place)]
    assert "(set at line 5)" in findings[0].message


@pytest.mark.parametrize(
    "fixture",
    ["PC002_reverse_scan_break.jinja", "PC002_copied_index.jinja", "PC002_boolean_flag.jinja", "PC002_accumulator.jinja"],
)
def test_fixture_idioms_are_proven_at_the_first_reasoning_turn(fixture):
    path = CORPUS / fixture
    findings = lint_source(TemplateSource(path, None, path.read_text(encoding="utf-8"), "jinja"), prove=ProveOptions())
    assert [finding.code for finding in findings] == ["PC002"]
    proof = findings[0].proof
    assert proof.status is ProofStatus.PROVEN
    divergence = proof.divergence
    assert (divergence.cause, divergence.message_index, divergence.role) == (Cause.HISTORY_REWRITE, 1, "assistant")
    # The first of the chained agent's two tool calls: shown with its reasoning until the
    # next user query moves the position (call 3); the renders share everything up to its
    # "<" ("<think>" vs "<|im_end|>"). The longest prompt it costs is the worst.
    shared = "<|im_start|>user\nIs it warmer in Paris or in Rome?<|im_end|>\n<|im_start|>assistant\n<"
    assert (divergence.scenario, divergence.call, divergence.first_divergence) == (
        "agent, chained tool calls",
        2,
        len(shared),
    )


@pytest.mark.parametrize(
    ("scan", "anchor"),
    [
        # the reverse index counted by loop.revindex0
        (
            "{% for m in messages|reverse %}{% if m.role == 'user' %}{% set ns.idx = loop.revindex0 %}{% break %}{% endif %}"
            "{% endfor %}\n",
            "ns.idx %}",
        ),
        # a range stepping down over indices, with break
        (
            "{% for i in range(messages|length - 1, -1, -1) %}{% if messages[i].role == 'user' %}{% set ns.idx = i %}"
            "{% break %}{% endif %}{% endfor %}\n",
            "ns.idx %}",
        ),
        # a counter, not a loop index: a position because the render compares it with one
        (
            "{% for m in messages|reverse %}{% if not ns.found %}{% set ns.idx = ns.idx - 1 %}{% endif %}"
            "{% if m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}\n",
            "ns.idx %}",
        ),
    ],
)
def test_position_of_the_newest_query_found_by_other_scans(scan, anchor):
    source = "{% set ns = namespace(idx=messages|length, found=false) %}\n" + scan + _render_loop("loop.index0 > ns.idx")
    codes, findings = lint_text(source)
    assert codes == [at("PC002", source, anchor)]
    assert "`ns.idx` (set at line 2)" in findings[0].message


@pytest.mark.parametrize(
    "scan",
    [
        # a forward scan that stops at its first match: the first user query never moves
        "{% for m in messages %}{% if m.role == 'user' %}{% set ns.first = loop.index0 %}{% break %}{% endif %}{% endfor %}\n",
        # a reverse scan that does not stop: it ends on the first user query too
        "{% for m in messages|reverse %}{% if m.role == 'user' %}{% set ns.first = messages|length - 1 - loop.index0 %}"
        "{% endif %}{% endfor %}\n",
        # a forward scan whose guard its own branch turns off
        "{% for m in messages %}{% if ns.searching and m.role == 'user' %}{% set ns.first = loop.index0 %}"
        "{% set ns.searching = false %}{% endif %}{% endfor %}\n",
    ],
)
def test_position_of_the_first_user_query_is_stable(scan):
    source = (
        "{% set ns = namespace(first=0, searching=true) %}\n"
        + scan
        + "{% for m in messages %}{% if loop.index0 == ns.first %}<|system|>{% endif %}"
        "<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}\n"
    )
    assert lint_text(source)[0] == []
    # and the renders agree: no divergence for any rule to explain
    assert lint_source(TemplateSource(Path("t.jinja"), None, source, "jinja"), prove=ProveOptions()) == []


def test_accumulator_fix_replaces_the_one_read_of_the_scan(tmp_path):
    original = (CORPUS / "PC002_accumulator.jinja").read_text(encoding="utf-8")
    path = tmp_path / "PC002_accumulator.jinja"
    path.write_text(original, encoding="utf-8")
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove"])
    assert "fixed PC002 [history-rewrite]" in result.stdout
    assert path.read_text(encoding="utf-8") == original.replace(
        "{%- set newest = ns.last_query_index %}", "{%- set newest = -1 %}"
    )
    assert result.exit_code == 0


def test_column_of_a_read_after_a_namespace_write_on_the_same_line():
    # One-line templates (DeepSeek's) write `ns.x` and read `ns.y` on one line: the read's
    # column is its own, not that of the `ns` the write names.
    source = (
        "{% set ns = namespace(idx=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.idx = loop.index0 %}"
        "{% endif %}{% endfor %}{% for m in messages %}{% set ns.seen = true %}{% if loop.index0 > ns.idx %}"
        "{{ m.reasoning_content }}{% endif %}{{ m.content }}{% endfor %}"
    )
    assert lint_text(source)[0] == [at("PC002", source, "ns.idx %}")]


def _tool_results_numbered(bound: str) -> str:
    """DeepSeek-V3.2's shape: each tool result finds its tool call by scanning the messages."""
    return (
        "{% for m in messages %}\n"
        "{% if m.role == 'tool' %}{% set outer = loop.index0 %}{% set found = namespace(at=-1) %}\n"
        "{% for p in messages %}{% if p.role == 'assistant' and p.tool_calls and " + bound + " %}"
        "{% set found.at = loop.index0 %}{% endif %}{% endfor %}\n"
        "<result n={{ outer - found.at }}>{{ m.content }}</result>\n"
        "{% else %}<{{ m.role }}>{{ m.content }}</s>{% endif %}\n"
        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )


def test_a_scan_of_the_messages_before_the_rendered_one_is_stable():
    source = _tool_results_numbered("loop.index0 < outer")
    assert lint_text(source)[0] == []
    assert lint_source(TemplateSource(Path("t.jinja"), None, source, "jinja"), prove=ProveOptions()) == []


def test_a_scan_of_the_messages_after_the_rendered_one_is_reported():
    source = _tool_results_numbered("loop.index0 > outer")
    assert lint_text(source)[0] == [at("PC002", source, "found.at }}")]


def test_switch_that_turns_the_decision_off_after_the_position_is_named():
    # DeepSeek-V3.2's shape: `is_after_last_user and thinking`, thinking false unless passed.
    # `x and false` is false whatever x is, so the default is stable.
    source = (
        "{% if show_thinking is not defined %}{% set show_thinking = false %}{% endif %}\n"
        "{% set ns = namespace(idx=-1) %}\n"
        "{% for m in messages %}{% if m.role == 'user' %}{% set ns.idx = loop.index0 %}{% endif %}{% endfor %}\n"
        "{% for m in messages %}{% set after = loop.index0 > ns.idx %}"
        "{% if after and show_thinking %}{{ m.reasoning_content }}{% endif %}{{ m.content }}{% endfor %}\n"
    )
    codes, findings = lint_text(source)
    assert codes == [at("PC002", source, "ns.idx %}{% if")]
    switch = findings[0].switch
    assert (switch.name, switch.default_is_stable, switch.unstable_value) == ("show_thinking", True, True)
    # a deployment may pass show_thinking=true: the finding keeps its severity (issue 33)
    assert findings[0].severity == "warning"


def test_the_advised_value_is_checked_by_rendering_and_kept():
    (finding,) = prove_fixture("PC002_history_rewrite_switch.jinja")[1]
    assert finding.proof.status == "proven"
    assert (finding.switch.name, finding.switch.stable_value, finding.switch.default_is_stable) == (
        "keep_history_reasoning",
        True,
        False,
    )
    # proven where a new user query arrives, never with keep_history_reasoning=true
    scenarios = {scenario for scenario, _ in finding.proof.explains}
    assert "chat" in scenarios and not [name for name in scenarios if "keep_history_reasoning=true" in name]
    assert finding.proof.divergence.arrived[-1] == "user"


@needs_shared
def test_a_switch_another_variable_sets_is_named_with_it():
    # DeepSeek-V3.2 sets `thinking` from `enable_thinking` where `thinking` is unset
    # (lines 4-10). Its last-query rewrite shows with thinking=true and with
    # enable_thinking=true: "leave thinking unset" alone would not avoid it.
    text = (SHARED_TEMPLATES / "deepseek-ai--DeepSeek-V3.2.jinja").read_text(encoding="utf-8")
    assert text.splitlines()[4:6] == ["  {%- if enable_thinking is defined -%}", "    {%- set thinking = enable_thinking -%}"]
    codes, findings = prove_text(text, engine="vllm")
    (finding,) = [f for f in findings if f.code == "PC002"]
    # a break under a value a deployment may set fails the run, naming each (issue 33)
    assert finding.fails() is True
    assert finding.full_message().endswith(
        "breaks when enable_thinking=true (stable when false or unset); breaks when thinking=true (stable when false or unset); "
        """set thinking=false to avoid it (per request: chat_template_kwargs={"thinking": false}; vLLM server-wide: """
        """--default-chat-template-kwargs '{"thinking": false}')"""
    )
    assert finding.switch.to_json()["also"] == [{"name": "enable_thinking", "value": True}]
    assert {scenario for scenario, _ in finding.proof.explains} >= {"agent, enable_thinking=true", "agent, thinking=true"}


def test_a_reverse_scan_written_as_an_index_from_the_end_is_named():
    # Issue 33 (unsloth's Qwen3): the loop runs forward over messages but reads
    # messages[(messages|length - 1) - loop.index0], so its first match is the last user query,
    # which the next query moves. It was PC100 in the agent, calls 2->3.
    source = (CORPUS / "PC002_reverse_scan_by_index.jinja").read_text(encoding="utf-8")
    codes, findings = prove_fixture("PC002_reverse_scan_by_index.jinja")
    assert codes == [at("PC002", source, "ns.last_query_index and message.reasoning_content")]
    (finding,) = findings
    assert finding.fails() and finding.proof.is_proven
    # the agent's new user query arrives between calls 2 and 3 (pair index 1)
    assert ("agent", "history-rewrite") in finding.proof.explains
    assert "PC100" not in [code for code, _, _ in codes]
