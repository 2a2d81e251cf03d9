"""gpt-oss as vLLM's server renders it: openai-harmony, not the template (tmpl_lint.engines).

The expected renders were checked against a vLLM 0.33.0 render server (bench/vllm_peer.py
does it for every prover scenario); these tests need neither vLLM nor ../shared.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from helpers import CORPUS, needs_shared, shared_tokenizer

from tmpl_lint.engines import engine_tokenizer, render_prompt, resolve_engine
from tmpl_lint.engines.base import HARMONY, EngineError
from tmpl_lint.engines.harmony import (
    HarmonyTokenizer,
    harmony_encoding,
    harmony_history,
    harmony_prompt_ids,
    render_by_message,
    render_whole_conversation,
)
from tmpl_lint.render import FrozenClock
from tmpl_lint.scenarios import scenarios

FIXTURE = CORPUS / "PC103_engine_render_unstable.jinja"
HARMONY_TEMPLATE = FIXTURE.read_text()
NOON = datetime(2026, 3, 1, 12, 0)
SYSTEM = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: {date}\n\nReasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.{tools}<|end|>"
)
TOOLS_NOTE = "\nCalls to these tools must go to the commentary channel: 'functions'."
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object", "properties": {}}},
    }
]


def text(messages, tools=None, at=NOON, add_generation_prompt=True):
    return render_prompt(
        HARMONY, HARMONY_TEMPLATE, messages, clock=FrozenClock(at), tools=tools, add_generation_prompt=add_generation_prompt
    ).text


def call(arguments, reasoning=None):
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}],
    }
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def test_vllm_renders_gpt_oss_with_harmony_by_model_type_else_by_markup():
    chatml = (CORPUS / "clean_chatml.jinja").read_text()
    assert resolve_engine("vllm", HARMONY_TEMPLATE) == HARMONY  # no config.json: the markup says gpt-oss
    assert resolve_engine("vllm", chatml) == "vllm"
    assert resolve_engine("hf", HARMONY_TEMPLATE) == "hf"
    # config.json's model_type is what vLLM reads, whatever the template looks like
    assert resolve_engine("vllm", chatml, "gpt_oss") == HARMONY
    assert resolve_engine("vllm", HARMONY_TEMPLATE, "qwen3") == "vllm"
    assert isinstance(engine_tokenizer(HARMONY), HarmonyTokenizer)
    assert engine_tokenizer("vllm") is None


def test_system_message_becomes_developer_instructions_and_the_date_is_the_servers():
    rendered = text([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert rendered == (
        SYSTEM.format(date="2026-03-01", tools="")
        # no "\n\n" after the instructions, unlike the gpt-oss template
        + "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
        + "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    )


def test_the_date_moves_at_midnight_unless_the_server_pins_it(monkeypatch):
    chat = [{"role": "user", "content": "Hi"}]
    assert "Current date: 2026-03-02" in text(chat, at=datetime(2026, 3, 2, 0, 0, 10))
    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", "2026-01-01")
    assert text(chat, at=NOON) == text(chat, at=datetime(2026, 3, 2, 0, 0, 10))
    assert "Current date: 2026-01-01" in text(chat)


def test_tool_calls_replay_their_argument_bytes_under_the_legacy_header():
    rendered = text(
        [
            {"role": "user", "content": "Paris?"},
            call('{"city":"Paris"}'),
            {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        ],
        tools=TOOLS,
    )
    assert rendered.endswith(
        "<|start|>user<|message|>Paris?<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}<|call|>'
        "<|start|>functions.get_weather<|channel|>commentary to=assistant<|message|>18 C<|end|><|start|>assistant"
    )
    assert rendered.startswith(SYSTEM.format(date="2026-03-01", tools=TOOLS_NOTE))


def test_analysis_before_the_last_final_answer_is_dropped():
    answered = {"role": "assistant", "content": "Paris.", "reasoning_content": "Capital of France."}
    history = [{"role": "user", "content": "Capital?"}, answered, {"role": "user", "content": "Weather?"}]
    assert "Capital of France." not in text(history)
    # analysis after the last final answer (the tool call being worked on) stays
    ongoing = history + [
        call('{"city":"Paris"}', reasoning="Use the tool."),
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
    ]
    assert "<|start|>assistant<|channel|>analysis<|message|>Use the tool.<|end|>" in text(ongoing, tools=TOOLS)


def test_the_reply_as_generated_keeps_its_own_analysis():
    reply = {"role": "assistant", "content": "Paris.", "reasoning_content": "Capital of France."}
    conversation = [{"role": "user", "content": "Capital?"}, reply]
    assert text(conversation, add_generation_prompt=False).endswith(
        "<|start|>assistant<|channel|>analysis<|message|>Capital of France.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Paris.<|end|>"
    )
    assert "Capital of France." not in text(conversation + [{"role": "user", "content": "Sure?"}])


@pytest.mark.parametrize("arguments", [{"city": "Paris"}, None])
def test_arguments_that_are_not_strings_are_rejected_like_vllms_server(arguments):
    with pytest.raises(EngineError, match="JSON string"):
        text([{"role": "user", "content": "Paris?"}, call(arguments)])


def test_decoded_text_encodes_back_to_the_same_ids():
    """The prover measures the decoded render; it must give harmony's own ids back."""
    tokens = HarmonyTokenizer()
    checked = 0
    for scenario in scenarios({}, arguments_as_string=True):
        for model_call in scenario.calls:
            for generation_prompt in (True, False):
                ids = harmony_prompt_ids(model_call.messages, scenario.tools, model_call.clock, generation_prompt)
                assert tokens.encode(harmony_encoding().decode_utf8(ids)) == ids
                checked += 1
    # every call of the scenarios, both ways: three chats of 3 calls, three agents of 5, the
    # chained agent's 4, the argument replay's 5, and the clock's 4 shapes of a probe and 8
    # steps of 2 calls each: 9 + 15 + 4 + 5 + 72 = 105
    assert checked == 2 * sum(len(scenario.calls) for scenario in scenarios({}, arguments_as_string=True)) == 2 * 105


@needs_shared
def test_gpt_oss_tokenizer_file_encodes_harmony_renders_identically():
    tokenizer = shared_tokenizer("gpt-oss")
    scenario = next(s for s in scenarios({}, arguments_as_string=True) if s.name == "agent with system")
    for model_call in scenario.calls:
        ids = harmony_prompt_ids(model_call.messages, scenario.tools, model_call.clock)
        assert tokenizer.encode(harmony_encoding().decode_utf8(ids)) == ids


def test_diff_under_vllm_measures_harmony_tokens_without_a_tokenizer(tmp_path):
    from click.testing import CliRunner

    from tmpl_lint.cli import main

    first = [
        {"role": "user", "content": "Paris?"},
        call('{"city":"Paris"}', reasoning="Use the tool."),
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
    ]
    second = first + [{"role": "assistant", "content": "18 C."}, {"role": "user", "content": "Thanks"}]
    for name, messages in (("t1.json", first), ("t2.json", second)):
        (tmp_path / name).write_text(json.dumps({"messages": messages, "tools": TOOLS}))
    result = CliRunner().invoke(
        main, ["diff", str(tmp_path / "t1.json"), str(tmp_path / "t2.json"), "--template", str(FIXTURE), "--format", "json"]
    )
    assert result.exit_code == 1, result.output  # a divergence, as `diff` exits
    divergence = json.loads(result.stdout)
    assert "not this template" in result.stderr  # the template does not decide what vLLM renders
    # The tool call's analysis is dropped once a final answer follows: the turn diverges
    # right after "<|start|>assistant" of that analysis.
    before = text(first, tools=TOOLS, at=datetime.now())
    cut = before.index("<|start|>assistant<|channel|>analysis")
    expected = len(HarmonyTokenizer().encode(before[:cut])) + 2
    assert (divergence["unit"], divergence["first_divergence_token"]) == ("token", expected)
    assert (divergence["message_index"], divergence["role"], divergence["cause"]) == (1, "assistant", "history-rewrite")


def test_the_requests_reasoning_effort_sets_harmonys_and_none_is_refused():
    chat = [{"role": "user", "content": "Hi"}]
    rendered = render_prompt(HARMONY, HARMONY_TEMPLATE, chat, clock=FrozenClock(NOON), reasoning_effort="high")
    assert "\n\nReasoning: high\n\n" in rendered.text
    with pytest.raises(EngineError, match="not supported by Harmony"):
        render_prompt(HARMONY, HARMONY_TEMPLATE, chat, clock=FrozenClock(NOON), reasoning_effort="none")


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"role": "function", "content": "x"}, "no role 'function'"),
        ({"role": "user", "content": ["a", {"type": "text", "text": "b"}]}, "list of content parts"),
        ({"role": "user", "content": 5}, "list of content parts"),
    ],
)
def test_requests_vllm_refuses_are_refused_with_a_reason(message, error):
    with pytest.raises(EngineError, match=error):
        text([message])


def test_special_token_text_inside_a_message_is_measured_as_harmony_encodes_it():
    # Harmony encodes a message's text as text: a literal "<|end|>" there is three ordinary
    # tokens, while its decoded text would encode to the special token. Checked against
    # vLLM 0.33's server.
    from tmpl_lint.proving.measure import Measure

    chat = [{"role": "user", "content": "say <|end|> please"}]
    expected = harmony_prompt_ids(chat, None, NOON)
    prompt = render_prompt(HARMONY, HARMONY_TEMPLATE, chat, clock=FrozenClock(NOON))
    assert prompt.token_ids == tuple(expected)
    assert Measure(HarmonyTokenizer()).prompt_ids(prompt) == expected
    assert HarmonyTokenizer().encode(prompt.text) != expected  # what re-encoding the text would give


@pytest.mark.parametrize("system_instructions", ["0", "1"])
@pytest.mark.parametrize("effort", [None, "high"])
def test_message_by_message_render_is_openai_harmonys_conversation_render(monkeypatch, system_instructions, effort):
    """Harmony proofs render message by message, remembering each message's ids; every
    request a proof makes renders as openai-harmony's own conversation render does."""
    monkeypatch.setenv("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS", system_instructions)
    compared = 0
    for scenario in scenarios({}, arguments_as_string=True):
        for call in scenario.calls:
            requests = [(call.messages, True), (call.messages, False)]
            if call.reply is not None:
                requests.append((call.messages + [call.reply], False))
            for messages, generation_prompt in requests:
                history = harmony_history(messages, scenario.tools, call.clock, generation_prompt, effort)
                assert render_by_message(history, generation_prompt) == render_whole_conversation(history, generation_prompt)
                compared += 1
    assert compared > 60
