"""Exact token indices with the real tokenizers of ../shared, checked against an independent
computation: transformers' own apply_chat_template and tokenizer, with the clock frozen."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from helpers import SHARED_TEMPLATES, SHARED_TOKENIZERS, shared_tokenizer, transformers_tokenizer

from tmpl_lint.proving.divergence import first_difference
from tmpl_lint.proving.session import Prover
from tmpl_lint.scenarios import scenarios

pytestmark = pytest.mark.skipif(not SHARED_TOKENIZERS.is_dir(), reason="../shared is not present (fresh clone)")
transformers = pytest.importorskip("transformers")


def freeze_transformers_clock(monkeypatch, instant):
    from transformers.utils import chat_template_utils

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return instant

    monkeypatch.setattr(chat_template_utils, "datetime", Frozen)


def hf_ids(tokenizer, template, call, tools, monkeypatch):
    freeze_transformers_clock(monkeypatch, call.clock)
    text = tokenizer.apply_chat_template(
        call.messages, tools=tools, chat_template=template, add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def scenario_named(name):
    return next(scenario for scenario in scenarios({}) if scenario.name == name)


def check_a(template, tokenizer_name, scenario_name):
    prover = Prover(template, shared_tokenizer(tokenizer_name))
    result = prover.run_scenario(scenario_named(scenario_name))
    assert result.error is None
    return [d for d in result.divergences if d.check == "a"]


def independent_divergences(tokenizer_name, template, scenario_name, monkeypatch):
    scenario = scenario_named(scenario_name)
    tokenizer = transformers_tokenizer(tokenizer_name)
    ids = [hf_ids(tokenizer, template, call, scenario.tools, monkeypatch) for call in scenario.calls]
    return [first_difference(a, b) for a, b in zip(ids, ids[1:])], ids


def test_qwen3_agent_loop_diverges_at_the_first_assistant_turn_of_the_earlier_query(monkeypatch):
    template = (SHARED_TEMPLATES / "Qwen--Qwen3-0.6B.jinja").read_text()
    expected, ids = independent_divergences("qwen3", template, "agent", monkeypatch)
    divergences = check_a(template, "qwen3", "agent")
    assert [d.first_divergence for d in divergences] == expected
    # calls 2 -> 3: the second user query arrives and the first assistant turn loses its reasoning
    second = divergences[1]
    assert second.first_divergence is not None
    assert (second.message_index, second.role, second.cause) == (1, "assistant", "history-rewrite")
    assert second.prompt_tokens == (len(ids[1]), len(ids[2]))
    assert second.reusable_tokens == second.first_divergence // 16 * 16


def test_gpt_oss_drops_analysis_after_a_final_answer(monkeypatch):
    template = (SHARED_TEMPLATES / "openai--gpt-oss-120b.jinja").read_text()
    expected, _ = independent_divergences("gpt-oss", template, "agent", monkeypatch)
    divergences = check_a(template, "gpt-oss", "agent")
    assert [d.first_divergence for d in divergences] == expected
    dropped = divergences[1]  # the final answer now exists: the tool call's analysis vanishes
    assert dropped.first_divergence is not None
    assert (dropped.message_index, dropped.role, dropped.cause) == (1, "assistant", "history-rewrite")
    assert "analysis" in dropped.before and "analysis" not in dropped.after[len(dropped.before) - 60 :]


@pytest.mark.parametrize(("step", "moves"), [("a second", False), ("a minute", False), ("a day", True)])
def test_gpt_oss_date_moves_with_the_day_only(monkeypatch, step, moves):
    template = (SHARED_TEMPLATES / "openai--gpt-oss-120b.jinja").read_text()
    name = f"clock with system, {step} later"
    expected, ids = independent_divergences("gpt-oss", template, name, monkeypatch)
    (divergence,) = check_a(template, "gpt-oss", name)
    assert [divergence.first_divergence] == expected
    if moves:
        assert divergence.first_divergence is not None and divergence.first_divergence < 40
        assert divergence.cause == "system"
    else:
        assert divergence.first_divergence is None


def test_mistral_nemo_tool_list_moves_to_the_last_user_message(monkeypatch):
    template = (SHARED_TOKENIZERS / "mistral-nemo" / "chat_template.jinja").read_text()
    expected, _ = independent_divergences("mistral-nemo", template, "agent", monkeypatch)
    divergences = check_a(template, "mistral-nemo", "agent")
    assert [d.first_divergence for d in divergences] == expected
    moved = divergences[1]
    assert moved.first_divergence == 1  # right after <s>: [AVAILABLE_TOOLS] now sits before the second query
    assert "[AVAILABLE_TOOLS]" in moved.before


@pytest.mark.parametrize("scenario_name", ["chat", "agent", "chat with system", "agent with system"])
def test_qwen25_is_a_clean_extension(monkeypatch, scenario_name):
    template = (SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja").read_text()
    expected, _ = independent_divergences("qwen2.5", template, scenario_name, monkeypatch)
    divergences = check_a(template, "qwen2.5", scenario_name)
    assert expected == [None] * len(expected)
    assert [d.first_divergence for d in divergences] == expected
    assert all(d.cause == "clean-extension" and d.reusable_tokens == d.ideal_tokens for d in divergences)


@pytest.mark.parametrize("name", ["qwen3", "qwen2.5", "gpt-oss", "mistral-nemo", "mistral-7b-v0.3"])
def test_tokenizers_backend_matches_transformers(name):
    ours = shared_tokenizer(name)
    theirs = transformers_tokenizer(name)
    text = '<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n[INST]Hi[/INST] 18 C, sunny\n\n{"city": "Paris"}'
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
    assert ours.special_tokens == {k: v for k, v in theirs.special_tokens_map.items() if isinstance(v, str)}


def test_a_tool_call_reply_is_measured_to_its_end_marker_in_tokens_too(tmp_path):
    # The reply as generated ended at its last text (the arguments), before the call's
    # closing brace and tag the model also writes: in characters a prefix of the next
    # prompt, in tokens a different last token (`"}` against `"}}`). Qwen3 fixed by --fix then
    # failed PC006 with its tokenizer and passed without one (QA, 2026-12-01).
    from click.testing import CliRunner

    from tmpl_lint.cli import main

    path = tmp_path / "chat_template.jinja"
    path.write_text((SHARED_TEMPLATES / "Qwen--Qwen3-0.6B.jinja").read_text())
    CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "-q", "--frozen-date", "2026-01-15"])
    fixed = path.read_text()
    tokenizer = shared_tokenizer("qwen3")
    agent = scenario_named("agent")
    prover = Prover(fixed, tokenizer)
    prompt = prover.render(agent, agent.calls[0].messages, agent.calls[0].clock, True)
    assert prover.generated(agent, agent.calls[0], prompt.text).text.endswith(
        '"arguments": {"city":"Paris"}}\n</tool_call><|im_end|>'
    )
    assert [d for d in prover.run_scenario(agent).divergences if d.first_divergence is not None] == []
    verdicts = []
    for tokens in ((), ("--tokenizer", str(SHARED_TOKENIZERS / "qwen3"))):
        ran = CliRunner().invoke(main, [str(path), "--format", "json", *tokens])
        verdicts.append([(f["code"], f["severity"], f["fails"], (f["switch"] or {}).get("name")) for f in json.loads(ran.stdout)])
        verdicts[-1].append(ran.exit_code)
    # the same verdicts in characters and in tokens: the empty think block the model writes
    # itself and history drops (found by the proof), and the one the generation prompt opens
    # with enable_thinking=false, a value a deployment may set (issue 33): both fail
    assert verdicts[0] == verdicts[1] == [("PC006", "warning", True, None), ("PC006", "warning", True, "enable_thinking"), 1]


# The last message is marked while it is the last (/tmp/qa5 d06): once a reply follows it,
# the render with the reply parts from prompt N inside that message.
MARKS_THE_LATEST = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}{% if loop.last %} (latest){% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_generated_reply_starts_where_prompt_n_ends_when_the_last_message_renders_otherwise(monkeypatch):
    # Independently: prompt N by transformers, and the reply as the model writes it after
    # the generation prompt: its text and <|im_end|>, nothing of the message before it.
    scenario = scenario_named("agent, narrated tool calls")
    tokenizer = transformers_tokenizer("qwen3")
    prompts = [hf_ids(tokenizer, MARKS_THE_LATEST, call, scenario.tools, monkeypatch) for call in scenario.calls]
    replies = [tokenizer.encode(call.reply["content"] + "<|im_end|>", add_special_tokens=False) for call in scenario.calls[:-1]]
    result = Prover(MARKS_THE_LATEST, shared_tokenizer("qwen3")).run_scenario(scenario)
    with_replies = [d for d in result.divergences if d.check == "b"]
    cached = [prompt + reply for prompt, reply in zip(prompts, replies)]
    assert [d.prompt_tokens for d in with_replies] == [(len(a), len(b)) for a, b in zip(cached, prompts[1:])]
    assert [d.prompt_tokens[0] for d in with_replies] == [25, 51, 71, 97]  # QA's hand count
    assert [d.first_divergence for d in with_replies] == [first_difference(a, b) for a, b in zip(cached, prompts[1:])]
    # recomputed: the full blocks N + reply leaves for N+1 (at most all but its last token) past the divergence
    assert [d.lost_tokens for d in with_replies] == [
        min(len(a), len(b) - 1) // 16 * 16 - first_difference(a, b) // 16 * 16 for a, b in zip(cached, prompts[1:])
    ]
    assert with_replies[0].lost_tokens == 16
    # the ideal: each request hits all the previous one left computed (its prompt, its reply but the last token)
    computed = [None] + [len(prompt) + len(reply) - 1 for prompt, reply in zip(prompts, replies)]
    ideal = sum(0 if before is None else min(before, len(prompt) - 1) // 16 * 16 for before, prompt in zip(computed, prompts))
    assert result.hit_rate()[1] == pytest.approx(ideal / sum(map(len, prompts)))
    assert round(result.hit_rate()[1], 3) == 0.713  # QA's hand figure (hand_hit_rate.py)
