"""Replies replay did not get from the log as messages: vLLM caches the blocks of every reply
it generates (all but the last token), so a log of request bodies only must still model
them, from the assistant message the session sends back, or say which it does not; and a
reply logged as token ids only must name the same causes as the same reply logged as a
message."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import SHARED_TOKENIZERS, needs_shared, qwen3_and_its_fix, transformers_tokenizer
from test_kv_cache import straightforward_vllm
from test_replay import QWEN3, build_log

from tmpl_lint.cli import main

pytestmark = needs_shared
transformers = pytest.importorskip("transformers")

QWEN25 = SHARED_TOKENIZERS / "qwen2.5"
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 6}
QUESTIONS = ["Tell me about caching in LLM servers.", "And what breaks it?", "Thanks!"]
ANSWERS = [
    "Prefix caching reuses the KV cache of an identical token prefix across requests, saving prefill compute "
    "for every turn of a long agent session. " * 2,
    "Any change in an earlier token voids every later block, because each block hash is chained on its parent block hash. " * 2,
    "You're welcome; keep templates stable and the cache will pay off. " * 2,
]
VLLM = "vllm:prefix_cache_hits / vllm:prefix_cache_queries"


def replay(*args):
    return CliRunner().invoke(main, ["replay", *map(str, args)])


def requests_only(path):
    """One three-turn chat session, logged as request bodies only (a proxy's log): each
    request carries the answers the model gave to the ones before."""
    messages, bodies = [SYSTEM], []
    for question, answer in zip(QUESTIONS, ANSWERS):
        messages = messages + [{"role": "user", "content": question}]
        bodies.append({"model": "q", "user": "a", "messages": messages})
        messages = messages + [{"role": "assistant", "content": answer}]
    path.write_text("".join(json.dumps(body) + "\n" for body in bodies))
    return bodies


def vllm_hits(bodies, tokenizer, block_size=16):
    """vLLM by its definition: each prompt as transformers renders it, each reply the ids the
    model generated (the answer and its <|im_end|>), cached but for the last."""
    requests = []
    for body, answer in zip(bodies, ANSWERS):
        text = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
        generated = tokenizer.encode(answer + "<|im_end|>", add_special_tokens=False)
        requests.append((tokenizer.encode(text, add_special_tokens=False), generated))
    hits = straightforward_vllm(requests, block_size, None)
    return sum(hits), sum(len(prompt) for prompt, _ in requests)


def test_a_log_without_replies_models_the_replies_the_session_sent_back(tmp_path):
    log = tmp_path / "requests.jsonl"
    bodies = requests_only(log)
    hits, queries = vllm_hits(bodies, transformers_tokenizer("qwen2.5"))
    # QA's hand model of vLLM on the same traffic: 288 of 382 (the replies counted cold: 176)
    assert (hits, queries) == (288, 382)

    result = replay(log, "--tokenizer", QWEN25, "--session-key", "user", "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["template"]
    assert (report["prefix_cache_hits"], report["prefix_cache_queries"]) == (288, 382)
    assert (report["metric"], report["engine_figure"]) == (VLLM, True)
    # the first two replies come from the requests after them; the third none sends back
    assert report["replies"] == {
        "logged": 0,
        "from_next_request": 2,
        "not_modelled": 1,
        "not_modelled_last_of_session": 1,
    }
    text = replay(log, "--tokenizer", QWEN25, "--session-key", "user").stdout.splitlines()
    assert text[1] == f"  Prefix cache hit rate: 75.4% ({VLLM}, every request: 288 of 382 tokens)"
    assert text[4] == (
        "  replies: 2 not logged: taken from the next request of the session that sends it back "
        "(its assistant message, rendered as generated); not modelled for 1 request (1 the last of its session)"
    )


def test_a_reply_not_modelled_in_a_bounded_pool_is_not_labelled_the_engines_figure(tmp_path):
    """In a bounded pool the last reply's blocks take room vLLM gives them: the figure is not
    vLLM's, and the label says so."""
    log = tmp_path / "requests.jsonl"
    requests_only(log)
    result = replay(log, "--tokenizer", QWEN25, "--session-key", "user", "--cache-blocks", "1000", "--format", "json")
    report = json.loads(result.stdout)["template"]
    assert report["engine_figure"] is False
    assert report["metric"] == f"hits / queries; not {VLLM}: the engine caches the replies not modelled"
    text = replay(log, "--tokenizer", QWEN25, "--session-key", "user", "--cache-blocks", "1000").stdout.splitlines()
    assert text[1] == (
        f"  Prefix cache hit rate: 75.4% (hits / queries; not {VLLM}: the engine caches the replies not modelled, "
        "every request: 288 of 382 tokens)"
    )


def test_a_reply_no_later_request_sends_back_is_said_and_a_retry_still_finds_the_next(tmp_path):
    """The client edits the first question and asks again (no reply sent back after the
    first), then goes on: the first reply is not modelled, the second is taken from the
    third request. Unbounded, nothing could hit the first reply's blocks (chained hashes:
    only a request sending that prompt and reply), so the figure is vLLM's."""
    edited = {"role": "user", "content": "Tell me about caching in LLM inference servers."}
    first = [SYSTEM, {"role": "user", "content": QUESTIONS[0]}]
    second = [SYSTEM, edited]
    third = second + [{"role": "assistant", "content": ANSWERS[0]}, {"role": "user", "content": QUESTIONS[1]}]
    bodies = [{"user": "a", "messages": messages} for messages in (first, second, third)]
    log = tmp_path / "requests.jsonl"
    log.write_text("".join(json.dumps(body) + "\n" for body in bodies))
    tokenizer = transformers_tokenizer("qwen2.5")
    # the first reply is anything: unbounded, nothing sends it back
    generated = [
        tokenizer.encode(text, add_special_tokens=False) for text in ("Whatever.<|im_end|>", ANSWERS[0] + "<|im_end|>", "x")
    ]
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False), add_special_tokens=False
        )
        for body in bodies
    ]
    hits = sum(straightforward_vllm(list(zip(prompts, generated)), 16, None))
    result = replay(log, "--tokenizer", QWEN25, "--session-key", "user", "--format", "json")
    report = json.loads(result.stdout)["template"]
    assert (report["prefix_cache_hits"], report["prefix_cache_queries"]) == (hits, sum(map(len, prompts)))
    assert report["replies"] == {"logged": 0, "from_next_request": 1, "not_modelled": 2, "not_modelled_last_of_session": 1}
    assert (report["metric"], report["engine_figure"]) == (VLLM, True)
    text = replay(log, "--tokenizer", QWEN25, "--session-key", "user").stdout
    assert "not modelled for 2 requests (1 the last of its session, 1 sent back by no later request)\n" in text


def token_ids_only(source, destination):
    """The same log with each reply as vLLM's return_token_ids alone: no message."""
    lines = []
    for line in source.read_text().splitlines():
        entry = json.loads(line)
        entry["response"] = {"token_ids": entry["response"]["choices"][0]["token_ids"]}
        lines.append(json.dumps(entry))
    destination.write_text("\n".join(lines) + "\n")


def causes(report):
    return [(cause["cause"], cause["detail"]) for cause in report["causes"] if cause["cause"] != "capacity"]


def test_replies_as_token_ids_name_the_causes_replies_as_messages_name(tmp_path):
    """Qwen3 drops the reasoning of answered turns: a rewrite of the reply (PC002, as check's
    proof names scenario "chat"), not the generation prompt's (PC006). Fixed, only the
    client that drops reasoning_content loses it: the client's, not the template's. The same
    for replies logged as messages and as ids, with the same figures."""
    tokenizer = transformers_tokenizer("qwen3")
    messages_log = tmp_path / "messages.jsonl"
    build_log(messages_log, tokenizer, sessions=5, turns=3)
    ids_log = tmp_path / "ids.jsonl"
    token_ids_only(messages_log, ids_log)
    original, fixed = qwen3_and_its_fix(tmp_path)
    reports = {}
    for name, log in (("messages", messages_log), ("ids", ids_log)):
        result = replay(
            log, "--tokenizer", QWEN3, "--template", original, "--compare", fixed, "--session-key", "user", "--format", "json"
        )
        assert result.exit_code == 0, result.output
        reports[name] = json.loads(result.stdout)
    for report in reports.values():
        assert causes(report["template"]) == [("template", "PC002 reply-rewrite")]
        assert causes(report["compare"]) == [("client", "reasoning dropped")]
    assert [report["template"]["replies"]["logged"] for report in reports.values()] == [15, 15]
    for side in ("template", "compare"):
        assert reports["ids"][side]["tokens_by_cause"] == reports["messages"][side]["tokens_by_cause"]
        first = [session["first_departure"] for session in reports["ids"][side]["worst_sessions"]]
        assert first == [session["first_departure"] for session in reports["messages"][side]["worst_sessions"]]


def test_ids_no_message_renders_as_make_the_cause_uncertain(tmp_path):
    """Replies that reasoned (<think>...</think>) through Qwen2.5's template, which prints no
    reasoning for any message: no message renders as those ids, so the departure (the
    reasoning is not in the next prompt) is named, and said uncertain."""
    tokenizer = transformers_tokenizer("qwen2.5")
    bodies = requests_only(tmp_path / "requests.jsonl")
    generated = [
        f"<think>\nThe user said: {body['messages'][-1]['content']}\n</think>\n\n{answer}<|im_end|>"
        for body, answer in zip(bodies, ANSWERS)
    ]
    lines = [
        {"request": body, "response": {"token_ids": tokenizer.encode(text, add_special_tokens=False)}}
        for body, text in zip(bodies, generated)
    ]
    log = tmp_path / "ids.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = json.loads(replay(log, "--tokenizer", QWEN25, "--session-key", "user", "--format", "json").stdout)["template"]
    (departure,) = report["causes"]
    assert departure["cause"] == "template"
    assert departure["detail"].endswith(" (cause uncertain: the reply is logged as token ids that no message renders as)")
    assert departure["requests"] == 2
