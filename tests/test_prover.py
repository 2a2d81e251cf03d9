"""The prover on fixtures written here, measured in characters (no tokenizer needed)."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from helpers import CORPUS, prove_text

from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.proofs import AFTER_MESSAGES, BEFORE_MESSAGES, Cause
from tmpl_lint.proving.divergence import compare_prompts, first_difference, last_message_mark, locate, reply_start
from tmpl_lint.proving.measure import full_blocks
from tmpl_lint.proving.replies import stop_after_reply
from tmpl_lint.proving.session import Prover
from tmpl_lint.scenarios import scenarios


def prove(name):
    path = CORPUS / name
    source = TemplateSource(path, None, path.read_text(encoding="utf-8"), "jinja")
    return lint_source(source, prove=ProveOptions())


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [([1, 2, 3], [1, 2, 3, 4], None), ([1, 2, 3], [1, 9, 3], 1), ([1, 2, 3], [1, 2], 2), ([], [5], None)],
)
def test_first_difference(a, b, expected):
    assert first_difference(a, b) == expected


def test_full_blocks_only():
    # the design doc's example: block size 4, 10 matching tokens reuse 2 blocks
    assert full_blocks(10, 4) == 8
    assert full_blocks(15, 16) == 0


def test_compare_prompts_figures_and_location():
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi", "reasoning_content": "think"}]
    cached = "<u>hello</u><a><r>think</r>hi</a>"
    following = "<u>hello</u><a>hi</a><u>next</u>"
    divergence = compare_prompts(
        "t", 0, "a", cached, [ord(c) for c in cached], following, [ord(c) for c in following], messages, 1, "char", 4
    )
    assert divergence.first_divergence == cached.index("<r>")
    assert divergence.reusable_tokens == 12  # 15 matching chars, 3 full blocks of 4
    # 33 cached, 32 following: vLLM looks up at most 31 of them (one is always computed), 7 blocks
    assert (len(cached), len(following)) == (33, 32)
    assert divergence.ideal_tokens == 28
    assert divergence.lost_tokens == 16
    assert (divergence.message_index, divergence.role, divergence.field, divergence.cause) == (
        1,
        "assistant",
        "content",
        "history-rewrite",
    )
    assert divergence.reusable_without_rollback == 0


def test_locate_fields():
    text = "S<u>hello</u><a>hi</a>"
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    assert locate(text, messages, text.index("ello")) == (0, "user", "content")
    assert locate(text, messages, text.index("</u>")) == (1, "assistant", "markup")
    assert locate(text, messages, len(text)) == (2, "assistant", "generation-prompt")


def test_history_rewrite_fixture_is_proven_in_characters():
    (finding,) = prove("PC002_history_rewrite.jinja")
    proof = finding.proof
    assert proof.status == "proven"
    assert proof.unit == "char"
    divergence = proof.divergence
    assert divergence.cause == "history-rewrite"
    assert divergence.role == "assistant"
    assert divergence.reusable_tokens == divergence.first_divergence // 16 * 16
    cached, following = divergence.prompt_tokens  # vLLM looks up at most following - 1
    assert divergence.lost_tokens == min(cached, following - 1) // 16 * 16 - divergence.reusable_tokens


def test_live_clock_fixture_is_proven_when_the_clock_moves_a_day():
    (finding,) = prove("PC001_live_clock.jinja")
    assert finding.proof.status == "proven"
    assert finding.proof.divergence.scenario == "clock, a day later"
    assert finding.proof.cause == "system"
    # the day steps Monday -> Tuesday (MIDDAY is a Sunday: see CLOCK_STEPS)
    assert "2026-03-02" in finding.proof.divergence.before and "2026-03-03" in finding.proof.divergence.after
    assert finding.message.endswith("; the rendered prompt changes per day: it changed when the clock moved a day")


def test_nondeterministic_fixture_is_proven():
    (finding,) = prove("PC005_nondeterministic_render.jinja")
    assert finding.proof.status == "proven"


def test_syntax_error_is_not_provable():
    (finding,) = prove("PC000_syntax_error.jinja")
    assert finding.proof.status == "not-provable"


def test_generation_prompt_mismatch_is_proven_with_the_unstable_switch_value():
    (finding,) = prove("PC006_generation_prompt_mismatch.jinja")
    assert finding.proof.status == "proven"
    assert finding.proof.divergence.scenario.endswith("enable_thinking=false")
    assert finding.proof.cause == "generation-prompt"


def test_clean_template_extends_every_turn():
    text = (CORPUS / "clean_group_closure.jinja").read_text()
    report = Prover(text, None).run({})
    assert report.rendered
    assert report.divergences() == []


def test_template_that_rejects_everything_is_not_provable():
    source = TemplateSource(Path("x.jinja"), None, "{{ raise_exception('only for training') }}{{ strftime_now('%Y') }}", "jinja")
    findings = lint_source(source, prove=ProveOptions())
    assert [f.code for f in findings] == ["PC102", "PC001"]
    assert findings[0].message == "the template fails on every conversation tried: only for training"
    assert findings[1].proof.to_json() == {"status": "not-provable", "unit": "char", "reason": "only for training"}


def test_unexplained_divergence_is_pc100():
    # the system block says "many" from the fifth message on: no rule knows this pattern (a
    # count printed there is PC003's); chat's calls 1 and 2 send 1 and 3 messages, call 3 five
    source = TemplateSource(
        Path("x.jinja"),
        None,
        "{{ 'turns: many' if messages|length > 3 else 'turns: few' }}{% for m in messages %}{{ m.content }}{% endfor %}",
        "jinja",
    )
    findings = lint_source(source, prove=ProveOptions())
    assert [f.code for f in findings] == ["PC100"]
    assert findings[0].proof.status == "proven"
    assert findings[0].proof.cause == "system"
    # it says where the render changed: the count, printed before the loop, is no message's
    assert findings[0].message == (
        'the next turn does not extend the previous prompt: the text before the first message renders differently in "chat", '
        "calls 2->3 (system), and no rule explains why"
    )
    assert (findings[0].proof.divergence.message_index, findings[0].proof.divergence.role) == (None, None)


CLOSES_DIFFERENTLY_WHEN_LAST = (
    "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if not loop.last %}<|sep|>{% endif %}<|end|>{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_markup_closing_the_last_message_is_history_not_the_generation_prompt():
    # The divergence sits after the user's text and before prompt N's opener: the user
    # message closes differently once it is no longer last (Hermes 3's tool responses).
    prover = Prover(CLOSES_DIFFERENTLY_WHEN_LAST, None)
    chat = next(s for s in scenarios({}) if s.name == "chat")
    result = prover.run_scenario(chat)
    first = next(d for d in result.divergences if d.check == "a")
    # "<|end|>" against "<|sep|>": the first two characters still match
    assert first.first_divergence == len("<|user|>What is the capital of France?<|")
    assert (first.message_index, first.role, first.field, first.cause) == (0, "user", "markup", "history-rewrite")


def test_a_loop_last_closing_is_proven_as_pc003():
    source = TemplateSource(Path("closing.jinja"), None, CLOSES_DIFFERENTLY_WHEN_LAST, "jinja")
    findings = lint_source(source, prove=ProveOptions())
    assert [(f.code, f.proof.status, f.proof.cause) for f in findings] == [("PC003", "proven", "history-rewrite")]


@pytest.mark.parametrize(
    ("prompt", "with_reply", "start"),
    [
        ("<A><think>", "<A></think>Paris.", len("<A>")),  # "<think>" and "</think>" share "<" only
        ("<A>\n", "<A>\nParis.", len("<A>\n")),
        ("[INST]Q[/INST]", "[INST]Q[/INST] Paris.", len("[INST]Q[/INST]")),
        ("x[TOOL_CALLS]", "x[TOOL_RESULTS]", len("x")),
    ],
)
def test_the_reply_starts_after_the_shared_text_never_inside_a_tag(prompt, with_reply, start):
    assert reply_start(prompt, with_reply) == start


@pytest.mark.parametrize(
    ("prompt", "bare", "with_reply", "start", "mark"),
    [
        # the last message is marked while it is the last: once the reply follows it, the
        # two part inside that message, and the reply starts after the generation prompt
        ("<U>hi (latest)<E><A>", "<U>hi (latest)<E>", "<U>hi<E><A>Paris. (latest)<E>", len("<U>hi<E><A>"), " (latest)"),
        # a tool result closed otherwise once something follows it (Hermes-3's newline)
        ("<T>18 C<E><A>", "<T>18 C<E>", "<T>18 C\n<E><A><call>", len("<T>18 C\n<E><A>"), ""),
        # the generation prompt opens a think block history does not print: its longest start
        ("<T>18 C<E><A><think>", "<T>18 C<E>", "<T>18 C\n<E><A>Paris.<E>", len("<T>18 C\n<E><A>"), ""),
        # parted in the generation prompt, not in history: as without ``bare``
        ("<U>hi<E><A><think>", "<U>hi<E>", "<U>hi<E><A></think>Paris.", len("<U>hi<E><A>"), ""),
    ],
)
def test_the_reply_starts_where_the_generation_prompt_ends_when_history_parts_first(prompt, bare, with_reply, start, mark):
    assert reply_start(prompt, with_reply, bare) == start
    assert last_message_mark(prompt, with_reply, bare) == mark


PARIS_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
}
PARIS = {"role": "assistant", "content": "Paris."}


@pytest.mark.parametrize(
    ("reply", "rendered", "generated"),
    [
        # Qwen3: the arguments are the reply's last text, then the call closes and the turn ends
        (
            PARIS_CALL,
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n',
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        ),
        # Phi-3: the end-of-conversation token after the turn's marker was never generated
        (PARIS, "Paris.<|end|>\n<|endoftext|>", "Paris.<|end|>"),
        # no marker after the reply: up to its last text
        (PARIS, "Paris.\n", "Paris."),
    ],
)
def test_the_reply_as_generated_runs_to_the_first_end_of_turn_marker_after_its_text(reply, rendered, generated):
    assert stop_after_reply(rendered, reply) == generated


# DeepSeek-R1 distills' idiom: a closing tag printed after the loop only while the last
# message is a tool result; the assistant turn that follows the result never prints it.
CLOSES_TOOL_OUTPUTS_AFTER_THE_LOOP = (
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}<｜Assistant｜><｜tool▁calls▁begin｜>"
    "{{ m.tool_calls[0].function.name }}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    "{%- elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>"
    "{%- elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if messages[-1].role == 'tool' %}<｜tool▁outputs▁end｜>{% endif %}"
    "{%- if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)

pytestmark = pytest.mark.no_fork


def test_a_tool_result_as_the_last_message_then_an_assistant_turn_shows_an_after_loop_closer():
    prover = Prover(CLOSES_TOOL_OUTPUTS_AFTER_THE_LOOP, None)
    agent = next(s for s in scenarios({}) if s.name == "agent")
    result = prover.run_scenario(agent)
    diverging = [d for d in result.divergences if d.first_divergence is not None]
    # calls 2 -> 3 and 4 -> 5: each time the tool result was the last message
    assert sorted({(d.call, d.check) for d in diverging}) == [(1, "a"), (1, "b"), (3, "a"), (3, "b")]
    first = next(d for d in diverging if (d.call, d.check) == (1, "b"))
    prefix = (
        "<｜User｜>What is the weather in Paris?<｜Assistant｜><｜tool▁calls▁begin｜>get_weather"
        "<｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁output▁begin｜>18 C, sunny<｜tool▁output▁end｜>"
    )
    assert first.first_divergence == len(prefix + "<｜")  # "<｜tool▁outputs▁end｜>" against "<｜Assistant｜>"
    assert (first.message_index, first.role, first.field, first.cause) == (2, "tool", "markup", "history-rewrite")
    assert first.arrived == ("user",)


def test_each_distinct_request_is_rendered_once(monkeypatch):
    import json

    from tmpl_lint.proving import session as proving

    requests = []
    render_prompt = proving.render_prompt

    def counting(engine, template, messages, **options):
        if messages != [{"role": "user", "content": "Hi"}]:  # the determinism check repeats by design
            request = [messages, options["clock"](), options["tools"], options["kwargs"], options["add_generation_prompt"]]
            requests.append(json.dumps(request, sort_keys=True, default=str))
        return render_prompt(engine, template, messages, **options)

    monkeypatch.setattr(proving, "render_prompt", counting)
    text = (CORPUS / "PC002_history_rewrite_switch.jinja").read_text()
    Prover(text, None).run({"keep_history_reasoning": [True, False]})
    # the compact-argument replay shares the agent session's calls, a clock probe's first
    # call is a chat's first: none of them is rendered twice
    assert requests and len(requests) == len(set(requests))


def test_renders_that_draw_nothing_random_are_not_repeated_to_show_they_are_deterministic(monkeypatch):
    from tmpl_lint.proving import session as proving

    rendered = []
    render_prompt = proving.render_prompt

    def counting(engine, template, messages, **options):
        rendered.append(json.dumps([messages, options["clock"](), options["tools"], options["kwargs"]], default=str))
        return render_prompt(engine, template, messages, **options)

    monkeypatch.setattr(proving, "render_prompt", counting)
    report = Prover((CORPUS / "clean_chatml.jinja").read_text(), None).run({})
    assert report.deterministic and report.rendered
    assert max(Counter(rendered).values()) <= 2  # with and without the generation prompt


def test_a_reply_rewritten_once_it_is_history_is_told_from_a_generation_prompt_mismatch():
    # The reply renders with its reasoning while it is the newest message and without it
    # after: a rewrite, though the divergence falls inside the generation prompt's reply.
    keeps_reasoning_while_last = (
        "{%- for m in messages %}<|{{ m.role }}|>"
        "{%- if m.role == 'assistant' and loop.last %}<think>{{ m.reasoning_content }}</think>{% endif %}"
        "{{ m.content }}<|end|>{% endfor %}"
        "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    (finding,) = prove_text(keeps_reasoning_while_last)[1]
    # only the reply can be the last assistant message, so no history rule reads it: the
    # proof finds it, a mismatch between the reply as generated and its history
    assert (finding.code, finding.proof.cause) == ("PC006", "reply-rewrite")
    # The same reply never rendered with its reasoning, but opened with "<think>": the
    # generation prompt's.
    opens_a_think_history_never_prints = (
        "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
        "{%- if add_generation_prompt %}<|assistant|><think>{% endif %}"
    )
    (finding,) = prove_text(opens_a_think_history_never_prints)[1]
    assert (finding.code, finding.proof.cause) == ("PC006", "generation-prompt")
    divergence = finding.proof.divergence
    assert divergence.before[len(os.path.commonprefix([divergence.before, divergence.after])) :].startswith("<think>")


# -- the projected hit rate is vLLM's: hits / queries over every request ----------------------


def test_served_requests_count_as_vllms_prefix_cache_stats():
    from tmpl_lint.proving.measure import ServedRequest, served_requests

    first, reply = list(range(20)), list(range(100, 130))  # 20 + 29 fed back: 3 blocks cached
    second = first + reply + [7, 8, 9]  # 53 tokens: 52 looked up, 3 blocks hit
    again = list(second)  # sent again: 52 looked up, the same 3 blocks
    edited = second[:37] + [500] * 23  # 37 tokens shared: 2 blocks
    requests = served_requests([first, second, again, edited], [reply, [], [], []], 16)
    assert requests == [
        ServedRequest(20, 0, 0),  # the first request counts: 20 queries, no hit
        ServedRequest(53, 48, 48),
        ServedRequest(53, 48, 48),  # all of it cached, but vLLM computes the last token's block
        ServedRequest(60, 32, 48),
    ]


def test_a_scenarios_hit_rate_includes_its_first_request_and_the_replies_blocks():
    # Contents only, in characters: "What is the capital of France?" (30), reply "Paris." (6,
    # 5 fed back: 35 computed, 2 blocks), then 49 characters (2 blocks hit, 3 cached with
    # "Rome" fed back), then 78 (3 blocks hit). vLLM: (0 + 32 + 48) / (30 + 49 + 78).
    prover = Prover("{% for m in messages %}{{ m.content }}{% endfor %}", None)
    (chat,) = [scenario for scenario in scenarios({}, True, frozenset(), False) if scenario.name == "chat"]
    result = prover.run_scenario(chat)
    assert [(r.queries, r.hits) for r in result.requests] == [(30, 0), (49, 32), (78, 48)]
    assert result.hit_rate() == (80 / 157, 80 / 157)


# -- a divergence outside every message names none ---------------------------------------

USER = [{"role": "user", "content": "hello"}]


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_a_divergence_before_the_first_message_names_no_message():
    # the template's own block, printed before the loop, with the time in it
    cached, following = "<sys>12:00</sys><u>hello</u><a>", "<sys>12:01</sys><u>hello</u><a>"
    divergence = compare_prompts(
        "clock", 0, "a", cached, chars(cached), following, chars(following), USER, 1, "char", 4, (len(cached) - 3, len(cached))
    )
    assert divergence.first_divergence == len("<sys>12:0")
    assert (divergence.message_index, divergence.role, divergence.field) == (None, None, BEFORE_MESSAGES)
    assert divergence.cause is Cause.SYSTEM
    assert divergence.place == "before the first message"
    assert locate(following, USER, 0) == (None, None, BEFORE_MESSAGES)


def test_a_divergence_after_the_last_message_of_a_conversation_sent_again_names_no_message():
    # the clock's scenarios send one conversation twice: no message came after the user's,
    # so the text printed after it is not its closing markup rewritten by a new message
    cached, following = "<u>hello</u>Today: 2026\n<a>", "<u>hello</u>Today: 2027\n<a>"
    opener = (len("<u>hello</u>Today: 2026\n"), len(cached))
    divergence = compare_prompts("clock", 0, "a", cached, chars(cached), following, chars(following), USER, 1, "char", 4, opener)
    assert divergence.first_divergence == len("<u>hello</u>Today: 202")
    assert (divergence.message_index, divergence.role, divergence.field) == (None, None, AFTER_MESSAGES)
    assert divergence.cause is Cause.AFTER_HISTORY
    assert divergence.place == "after the last message"
    assert not divergence.in_reply


def test_the_same_place_once_a_message_arrived_is_the_last_messages_closing_markup():
    # with a reply after it, the markup that closes the user message is history rewritten
    # (or PC007's text after the loop, which the renders alone cannot tell apart)
    cached = "<u>hello</u>Today: 2026\n<a>"
    following = "<u>hello</u><a>hi</a>Today: 2026\n<a>"
    messages = USER + [{"role": "assistant", "content": "hi"}]
    opener = (len("<u>hello</u>Today: 2026\n"), len(cached))
    divergence = compare_prompts(
        "chat", 0, "a", cached, chars(cached), following, chars(following), messages, 1, "char", 4, opener
    )
    assert divergence.first_divergence == len("<u>hello</u>")
    assert (divergence.message_index, divergence.role, divergence.field, divergence.cause) == (
        0,
        "user",
        "markup",
        Cause.HISTORY_REWRITE,
    )


class _Backend:
    """A tokenizers backend whose ids are the characters' code points."""

    def encode(self, text: str, add_special_tokens: bool = False):
        from types import SimpleNamespace

        return SimpleNamespace(ids=list(map(ord, text)))


def test_a_proof_takes_what_another_recorded_only_for_the_same_template_and_inputs():
    """--fix hands the check's proof what its verifier rendered and encoded proving the fixed
    template. Taken for another template, or other inputs, it would prove the wrong renders:
    forged renders and ids recorded for one template are taken by a proof of that template
    with the same inputs (the recall is live), and by none of another text, other special
    tokens, limits, engine or tokenizer, which prove as if nothing were recorded."""
    from dataclasses import replace

    from tmpl_lint.engines.base import Prompt
    from tmpl_lint.render import RenderLimits
    from tmpl_lint.tokenizer import Tokenizer

    def divergences(prover: Prover) -> list[tuple]:
        report = prover.run({})
        return [(d.scenario, d.call, d.check, d.first_divergence, d.cause) for d in report.divergences()]

    text = (CORPUS / "PC002_history_rewrite.jinja").read_text()
    other = text.replace("<|im_start|>", "<|turn|>")
    assert other != text
    recorder = Prover(text, None)
    recorder.run({})
    recorded = recorder.recorded()
    forged = replace(recorded, prompts={request: Prompt("forged") for request in recorded.prompts})
    fresh = divergences(Prover(text, None))
    assert fresh and divergences(Prover(text, None, recalled=forged)) != fresh  # taken
    for changed in (
        {"template": other},
        {"special_tokens": {"bos_token": "<B>", "eos_token": "</B>"}},
        {"limits": RenderLimits(seconds=3.0)},
        {"engine": "vllm"},
    ):
        arguments = {"template": text, "tokenizer": None, **changed}
        assert divergences(Prover(**arguments, recalled=forged)) == divergences(Prover(**arguments)), changed

    # Token ids recorded with one tokenizer are not another's.
    first, second = (Tokenizer(Path(name), _Backend(), {"bos_token": "<s>"}) for name in ("first", "second"))
    recorder = Prover(text, first)
    recorder.run({})
    recorded = recorder.recorded()
    forged = replace(recorded, encoded={encoded: [1] for encoded in recorded.encoded})
    fresh = divergences(Prover(text, first))
    assert fresh and divergences(Prover(text, first, recalled=forged)) != fresh  # taken
    assert divergences(Prover(text, second, recalled=forged)) == divergences(Prover(text, second))
