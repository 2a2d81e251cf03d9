from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import SHARED_TOKENIZERS, at, lint_fixture, lint_text, needs_shared, prove_fixture, prove_text

from tmpl_lint.cli import main
from tmpl_lint.inputs import TemplateSource


def test_fixture_last_user_message_blocks():
    codes, findings = lint_fixture("PC003_future_dependent_render.jinja")
    assert codes == [("PC003", 11, 37), ("PC003", 14, 16)]
    assert "`user_messages[-1]`" in findings[0].message
    assert "`loop.last`" in findings[1].message


def test_fixture_look_ahead_scan():
    codes, findings = lint_fixture("PC003_lookahead.jinja")
    assert codes == [("PC003", 4, 27)]
    assert "looks ahead" in findings[0].message


def test_group_closure_is_not_reported():
    assert lint_fixture("clean_group_closure.jinja")[0] == []


@pytest.mark.parametrize(
    ("source", "anchors"),
    [
        # the generation prompt inside the loop: noop
        ("{% for m in messages %}{{ m.content }}{% if loop.last and add_generation_prompt %}<bot>{% endif %}{% endfor %}", []),
        # loop.last in a loop over tools, not messages: noop
        ("{% for t in tools %}{{ t.name }}{% if not loop.last %},{% endif %}{% endfor %}", []),
        # the next message alone decides: reported
        (
            "{% for m in messages %}{{ m.content }}{% if loop.nextitem and loop.nextitem.role == 'user' %}<eot>{% endif %}{% endfor %}",
            ["loop.nextitem"],
        ),
        # comparing the index with the message count
        (
            "{% for m in messages %}{% if loop.index0 == messages|length - 1 %}[last]{% endif %}{{ m.content }}{% endfor %}",
            ["messages|length"],
        ),
        # a forward range over indices
        (
            "{% for m in messages %}{% for k in range(loop.index0 + 1, messages|length) %}{{ messages[k].role }}{% endfor %}{% endfor %}",
            ["range("],
        ),
    ],
)
def test_cases(source, anchors):
    assert lint_text(source)[0] == [at("PC003", source, anchor) for anchor in anchors]


# -- loop.last where only the reply itself can be last (issue 14) --------------------------

ASSISTANT_LAST = (
    "{%- for m in messages %}\n"
    "{%- if m.role == 'assistant' %}\n"
    "{%- set content = m.content %}\n"
    "{%- if not loop.last %}{% set content = m.content.split('</think>')[-1] %}{% endif %}\n"
    "<|assistant|>{{ content }}<|end|>{% if not loop.last %}{{ '\\n' }}{% endif %}\n"
    "{%- else %}<|{{ m.role }}|>{{ m.content }}<|end|>\n"
    "{% endif %}\n"
    "{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_last_assistant_turn_split_and_separator_after_its_end_marker_are_not_reported():
    # QwQ strips reasoning unless the turn is last; Apriel prints the separator after the
    # end marker unless it is last. An assistant turn is last only while it is the reply
    # just written, so neither changes history.
    assert lint_text(ASSISTANT_LAST)[0] == []


def test_last_assistant_turn_changes_only_the_reply_when_rendered():
    from pathlib import Path

    from tmpl_lint.checker import ProveOptions, lint_source
    from tmpl_lint.proofs import Cause
    from tmpl_lint.proving.session import Prover

    source = ASSISTANT_LAST.replace("{{ content }}", "<think>{{ m.reasoning_content }}</think>{{ content }}")
    causes = {d.cause for d in Prover(source, None).run({}).divergences()}
    assert Cause.HISTORY_REWRITE not in causes
    findings = lint_source(TemplateSource(Path("t.jinja"), None, source, "jinja"), prove=ProveOptions())
    assert [f.code for f in findings if f.code in ("PC002", "PC003", "PC100")] == []


@pytest.mark.parametrize(
    "branch",
    [
        "{%- if m.role == 'user' %}",  # a user message is last at every turn: reported
        "{%- if m.role == 'assistant' or m.role == 'tool' %}",  # a tool result can be last too
        "{%- if messages[0].role == 'assistant' %}",  # another message's role says nothing
    ],
)
def test_last_in_other_branches_is_still_reported(branch):
    source = ASSISTANT_LAST.replace("{%- if m.role == 'assistant' %}", branch)
    assert lint_text(source)[0] == [at("PC003", source, "loop.last %}{% set"), at("PC003", source, "loop.last %}{{")]


@pytest.mark.parametrize("opener", ["\\n<|assistant|>", "<|assistant|>"])
def test_separator_after_every_message_but_the_last_is_not_a_history_rewrite(opener):
    from tmpl_lint.proofs import Cause
    from tmpl_lint.proving.session import Prover

    source = (
        "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% if not loop.last %}{{ '\\n' }}{% endif %}"
        "{%- endfor %}{% if add_generation_prompt %}{{ '" + opener + "' }}{% endif %}"
    )
    assert lint_text(source)[0] == []
    # a generation prompt without the separator differs from history at the reply's opener
    causes = {d.cause for d in Prover(source, None).run({}).divergences()} - {Cause.CLEAN}
    assert causes == (set() if opener.startswith("\\n") else {Cause.GENERATION_PROMPT})


def test_separator_inside_a_message_is_reported():
    source = (
        "{%- for m in messages %}<|{{ m.role }}|>{% if not loop.last %}{{ '\\n' }}{% endif %}{{ m.content }}<|end|>"
        "{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    assert lint_text(source)[0] == [at("PC003", source, "loop.last")]


# -- proofs ------------------------------------------------------------------------------


def test_reasoning_replayed_in_content_and_cut_from_all_but_the_last_turn_is_proven():
    codes, (finding,) = prove_fixture("PC003_reasoning_in_content_dropped.jinja")
    assert codes == [("PC003", 6, 48)]
    # only a client that replays the raw "<think>...</think>" in content shows it
    assert finding.proof.explains == (("chat, reasoning replayed in content", "reply-rewrite"),)
    divergence = finding.proof.divergence
    assert (divergence.call, divergence.check, divergence.message_index) == (0, "b", 1)
    assert divergence.first_divergence == len(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert divergence.arrived == ("user",)


def test_a_loop_last_whose_branches_print_the_same_text_is_not_reproduced():
    codes, (finding,) = prove_fixture("PC003_unproven_same_text_either_way.jinja")
    assert codes == [("PC003", 5, 12)]
    assert finding.proof.status == "not-reproduced"
    assert not finding.fails() and finding.fails(strict=True)


def test_two_findings_at_one_divergence_fail_once():
    codes, (finding,) = prove_fixture("PC003_future_dependent_render.jinja")
    assert codes == [("PC003", 11, 37)]
    assert [(f.code, f.line, f.column) for f in finding.related_findings] == [("PC003", 14, 16)]
    assert finding.to_json()["related"] == [
        {
            "code": "PC003",
            "name": "future-dependent-render",
            "line": 14,  # in the file (a .jinja file: the template's own place)
            "column": 16,
            "template_line": 14,
            "template_column": 16,
            "message": finding.related_findings[0].message,
        }
    ]


def test_an_index_variable_is_advised_an_index_not_true():
    source = (
        "{%- if real_last_index is not defined %}{%- set real_last_index = messages|length - 1 %}{%- endif %}\n"
        "{%- for message in messages %}\n"
        "{%- if loop.index0 == real_last_index and message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}\n"
        "{{- message.content }}\n"
        "{%- endfor %}"
    )
    codes, (finding,) = lint_text(source)
    assert codes == [at("PC003", source, "messages|length")]
    assert (finding.switch.name, finding.switch.stable_value) == ("real_last_index", -1)
    assert "set real_last_index=-1 to avoid it" in finding.full_message()
    assert "true" not in finding.full_message()


# A tool result is printed only while it is among the last two messages.
LOOK_AHEAD_SKIPPED = (
    "{%- for m in messages -%}\n"
    "{%- if m.role == 'tool' and loop.index0 < messages|length - 2 %}{% continue %}{% endif -%}\n"
    "<|{{ m.role }}|>{{ m.content }}<|end|>\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt %}<|assistant|>{% endif -%}\n"
)


@pytest.mark.parametrize("skip", ["{% continue %}{% endif -%}\n", "{% else -%}\n"])
def test_a_look_ahead_that_skips_the_rest_of_the_loop_is_pc003(skip):
    """`{% if test %}{% continue %}{% endif %}` then the rest is the rest under the test's
    `else`: the analysis follows the loop control, so the proof's divergence is PC003's, not
    an unexplained PC100."""
    source = LOOK_AHEAD_SKIPPED.replace("{% continue %}{% endif -%}\n", skip)
    if skip.startswith("{% else"):
        source = source.replace("<|end|>\n{%- endfor", "<|end|>\n{%- endif -%}\n{%- endfor")
    codes, findings = prove_text(source)
    assert codes == [at("PC003", source, "messages|length")]
    assert findings[0].proof.is_proven


def test_a_namespace_count_of_every_message_is_a_count_not_a_scanned_position():
    """`ns.n` counts every message: compared with `loop.index` it marks the last message, as
    `messages|length` does. One PC003, not a PC002 for a scanned position and a PC100 for the
    divergence it cannot explain. Reported where the comparison reads it, which is what makes
    the last message render differently, naming the line that counted it."""
    source = (
        "{%- set ns = namespace(n=0) -%}\n"
        "{%- for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor -%}\n"
        "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if loop.index == ns.n %} (latest){% endif %}<|end|>"
        "{% endfor -%}\n"
        "{%- if add_generation_prompt %}<|assistant|>{% endif -%}\n"
    )
    codes, findings = prove_text(source)
    assert codes == [at("PC003", source, "ns.n %}")]
    assert findings[0].message.startswith("`ns.n` (counted at line 2) makes a message render differently")
    assert findings[0].proof.is_proven
    # counted only under a test, it is a count of some messages: still a scan (PC002's)
    conditional = source.replace("{% set ns.n = ns.n + 1 %}", "{% if m.role == 'user' %}{% set ns.n = ns.n + 1 %}{% endif %}")
    assert "PC003" not in [code for code, _, _ in lint_text(conditional)[0]]


# -- messages copied into a namespace list (Mistral-7B-v0.3) ---------------------

# Mistral-7B-v0.3's shape: the messages other than system copied into `ns_sys.filtered`, the
# user messages counted over the copy, and the system prompt printed on the user message
# whose count reaches that total: the last one.
COPIED_MESSAGES = (
    "{%- set ns_sys = namespace(system='', filtered=[]) %}\n"
    "{%- for message in messages %}{% if message.role == 'system' %}{% set ns_sys.system = message.content %}"
    "{% else %}{% set ns_sys.filtered = ns_sys.filtered + [message] %}{% endif %}{% endfor %}\n"
    "{%- set ns = namespace(max_idx_user=-1, index=0) %}\n"
    "{%- for message in ns_sys.filtered %}{% if message.role == 'user' %}{% set ns.max_idx_user = ns.max_idx_user + 1 %}"
    "{% endif %}{% endfor %}\n"
    "{%- for message in ns_sys.filtered %}\n"
    "{%- if message.role == 'user' %}[INST] {% if ns.index == ns.max_idx_user and ns_sys.system %}{{ ns_sys.system }}\n\n"
    "{% endif %}{{ message.content }}[/INST]{% set ns.index = ns.index + 1 %}\n"
    "{%- else %}{{ message.content }}</s>{% endif %}\n"
    "{%- endfor %}"
)


def test_a_loop_over_a_namespace_copy_of_the_messages_renders_messages():
    """The copy is the messages: the count over it is a scan of all messages, read where
    the system prompt is placed on the last user message. Before, the data flow stopped at
    the copy, and the proof's divergence was PC100 'no rule explains why' at 1:1."""
    codes, findings = prove_text(COPIED_MESSAGES)
    assert codes == [at("PC003", COPIED_MESSAGES, "ns.max_idx_user and")]
    assert findings[0].message.startswith("`ns.max_idx_user` (set at line 4) is computed by scanning all messages")
    assert findings[0].proof.is_proven


def test_state_the_copying_loop_carries_is_not_a_scan_of_the_copy():
    """Mistral-7B-v0.3 merges runs of same-role messages while it copies them (a group list
    and a namespace made per group): that is how the copy is made, not a fact about later
    messages that each copied message then depends on."""
    source = (
        "{%- set ns = namespace(messages=[], group=[], role=none) %}\n"
        "{%- for message in messages + [{'role': '__end__'}] %}\n"
        "{%- if message.role != ns.role %}\n"
        "{%- if ns.role is not none %}{% set merged = namespace(parts=[]) %}"
        "{% for m in ns.group %}{% set merged.parts = merged.parts + [m.content] %}{% endfor %}"
        "{% set ns.messages = ns.messages + [{'role': ns.role, 'content': merged.parts|join('\\n')}] %}{% endif %}\n"
        "{%- set ns.group = [message] %}{% set ns.role = message.role %}\n"
        "{%- else %}{% set ns.group = ns.group + [message] %}{% endif %}\n"
        "{%- endfor %}\n"
        "{%- for message in ns.messages %}<|{{ message.role }}|>{{ message.content }}"
        "{% if loop.last %}(newest){% endif %}<|end|>{% endfor %}"
    )
    assert lint_text(source)[0] == [at("PC003", source, "loop.last")]


@needs_shared
def test_mistral_7b_v03_system_prompt_on_the_last_user_message_is_pc003_and_its_arguments_pc004():
    """The real template: its messages are copied twice into namespace lists before the loop
    that renders them. The system prompt and tool list go on the user message whose count
    reaches `ns.max_idx_user`, the last one: PC003 there (no automatic fix: trained so), and
    the arguments' `tojson` a static, fixable PC004. It was two PC100 and a PC004 found by the
    proof only."""
    import json
    import subprocess
    import sys

    folder = SHARED_TOKENIZERS / "mistral-7b-v0.3"
    text = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    ran = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", str(folder), "--format", "json"], capture_output=True, text=True, timeout=300
    )
    found = json.loads(ran.stdout)
    assert [(f["code"], f["line"], f["column"]) for f in found] == [
        at("PC003", text, "ns.max_idx_user) and has_tools"),
        at("PC004", text, "tojson|safe"),
    ]
    assert all(f["fails"] and f["proof"]["status"] == "proven" for f in found)
    related = {(r["code"], r["line"], r["column"]) for r in found[0]["related"]}
    assert at("PC003", text, "ns.max_idx_user) and system_message") in related


# -- a reply cut once a message follows it ------------------------------------------

REPLY_CUT = (
    "{%- for m in messages %}\n"
    "{%- if m.role == 'assistant' %}\n"
    "{{- '<|assistant|>' }}\n"
    "{%- if NEWEST %}{{- m.content }}{%- else %}{{- m.content[:12] }}{%- endif %}\n"
    "{{- '<|end|>\\n' }}\n"
    "{%- else %}\n"
    "{{- '<|' + m.role + '|>' + m.content + '<|end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
)


@pytest.mark.parametrize(
    ("newest", "anchor"),
    [
        ("loop.last", "loop.last"),
        ("loop.revindex == 1", "loop.revindex"),
        ("loop.index0 == messages|length - 1", "messages|length"),
    ],
)
def test_a_reply_cut_in_an_assistant_only_branch_once_a_message_follows_is_pc003(newest, anchor):
    """Only assistant messages take the branch, but what it decides is the reply's own text
    (cut to 12 characters in history), not its reasoning or markup: PC003 at the test, found
    statically and proven, where the proof had fallen back to PC006 at the generation prompt."""
    source = REPLY_CUT.replace("NEWEST", newest)
    assert lint_text(source)[0] == [at("PC003", source, anchor)]
    codes, findings = prove_text(source)
    assert codes == [at("PC003", source, anchor)]
    assert findings[0].proof.is_proven
    assert ("agent", "reply-rewrite") in findings[0].proof.explains


# -- a group closure that reads the next message off by one (Bielik-11B-v3.0) --------

OFF_BY_ONE = (
    "{%- if messages[0].role == 'system' %}<|sys|>{{ messages[0].content }}\n{% set start = 1 %}"
    "{%- else %}{% set start = 0 %}{% endif %}\n"
    "{%- for message in messages[START:] %}\n"
    "{%- if message.role == 'tool' %}<|out|>{{ message.content }}\n"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|end|>\n{% endif %}\n"
    "{%- else %}<|{{ message.role }}|>{{ message.content or '' }}<|end|>\n{% endif %}\n"
    "{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_the_next_message_read_from_the_list_the_loop_slices_is_not_the_next_one():
    """The loop runs over `messages[start:]` and reads `messages[loop.index0 + 1]`: with the
    system message sliced off that is the current message, so the end marker after a tool
    result is printed only while it is `loop.last`. Not a group closure: PC003 at loop.last."""
    source = OFF_BY_ONE.replace("START", "start")
    assert lint_text(source)[0] == [at("PC003", source, "loop.last")]
    codes, findings = prove_text(source)
    assert codes == [at("PC003", source, "loop.last")]
    assert findings[0].proof.is_proven


@pytest.mark.parametrize("start", ["", "0"])
def test_the_next_message_of_a_loop_from_the_first_message_still_closes_a_group(start):
    source = OFF_BY_ONE.replace("START", start)
    assert lint_text(source)[0] == []


def test_the_number_of_messages_printed_in_the_system_block_is_pc003():
    """The system block says how many messages there are: it renders differently at every
    turn. It was PC100 'no rule explains why', where PC003 names `messages|length` in a loop. No edit keeps the text, and the fix says that."""
    source = (
        "{%- set context = 'the ' + (messages|length|string) + ' message day' %}\n"
        "{{- '<|system|>Context: ' + context + '<|end|>\\n' }}\n"
        "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}"
        "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    assert lint_text(source)[0] == [at("PC003", source, "messages|length")]
    codes, findings = prove_text(source)
    assert codes == [at("PC003", source, "messages|length")]
    assert findings[0].proof.is_proven
    from tmpl_lint.checker import lint_with_facts
    from tmpl_lint.rules import BY_CODE

    facts, (finding,) = lint_with_facts(TemplateSource(Path("t.jinja"), None, source, "jinja"))
    assert BY_CODE["PC003"].fix(facts, finding, None).unfixable == (
        "the template prints the number of messages: no edit keeps the text it wrote"
    )


@pytest.mark.parametrize(
    "decision",
    [
        "{% if messages|length > 0 %}<|system|>hello<|end|>\n{% endif %}",  # decides, prints no count
        # Llama 3.1: a value set under the test carries the count's label, not the count
        "{% if messages|length != 0 %}{% set first = messages[0].content %}{% endif %}{{ first }}",
        "{% if add_generation_prompt %}<|assistant|>turn {{ messages|length }}{% endif %}",  # the generation prompt's
    ],
)
def test_a_count_outside_the_loop_that_is_not_printed_before_messages_is_not_this(decision):
    source = "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}" + decision
    assert "PC003" not in [code for code, _, _ in lint_text(source)[0]]


GUARDED_NEXT = (
    "{%- for m in messages %}\n"
    "{%- set nxt = messages[loop.index] if not loop.last else none %}\n"
    "<|{{ m.role }}|>{{ m.content }}{% if TEST %} [latest]{% endif %}<|end|>\n"
    "{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

pytestmark = pytest.mark.no_fork


@pytest.mark.parametrize("test", ["nxt is none", "not nxt"])
def test_a_next_message_read_behind_loop_last_and_tested_for_presence_is_pc003_at_the_look_ahead(test):
    """`messages[loop.index] if not loop.last else none`, then `nxt is none`: the message is
    marked while nothing follows it. The `loop.last` guarding the read looked like one paired
    with the next message's role (a group closed the same way once it arrives), so nothing
    was reported, and the proof's divergence was PC100 at 1:1."""
    source = GUARDED_NEXT.replace("TEST", test)
    assert lint_text(source)[0] == [at("PC003", source, "messages[loop.index]")]
    codes, findings = prove_text(source)
    assert codes == [at("PC003", source, "messages[loop.index]")]
    assert findings[0].proof.is_proven
    assert findings[0].message == "`messages[next]` makes a message render differently once the next message exists"


def test_the_role_of_a_next_message_read_behind_loop_last_still_closes_a_group():
    source = GUARDED_NEXT.replace("TEST", "nxt is none or nxt.role != 'tool'")
    assert lint_text(source)[0] == []


def test_a_window_on_the_last_messages_is_pc003_at_the_slice():
    # each new message pushes the oldest out of `messages[-4:]`, so the prompt renders
    # differently from its start every turn. It was two PC100 at 1:1, "no rule explains why".
    source = (
        "{%- for message in messages[-4:] %}<|{{ message.role }}|>{{ message.content }}<|end|>\n{% endfor %}"
        "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    codes, (finding,) = prove_text(source)
    assert codes == [at("PC003", source, "messages[-4:]")]
    assert finding.message == (
        "`messages[-4:]` keeps only the last messages: each new one pushes the oldest out, "
        "so the prompt renders differently from its start every turn"
    )
    assert finding.fails(False) and finding.proof.is_proven


def test_a_count_on_every_message_is_refused_for_what_it_is(tmp_path):
    # the refusal said the model "was trained to see this on the last message
    # only", Mistral's tool list's reason, of a countdown printed on every message.
    path = tmp_path / "countdown.jinja"
    path.write_text(
        "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }} ({{ messages|length - loop.index }} later)<|end|>\n{% endfor %}"
    )
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes"])
    assert result.exit_code == 1
    assert (
        f"{path}:1:61: not fixed PC003 [future-dependent-render]: the template prints a count of the messages in each one: "
        "no edit keeps the text it wrote"
    ) in result.stdout.splitlines()
