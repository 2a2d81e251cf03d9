"""`tmpl-lint replay` on generated multi-session logs, its figures checked against an
independent computation: transformers renders, a full tokenization and a straightforward
chained-hash pool (test_kv_cache.straightforward_vllm)."""

from __future__ import annotations

import json
import os
import random
import re
import stat
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from click.testing import CliRunner
from helpers import (
    CORPUS,
    SHARED_TEMPLATES,
    SHARED_TOKENIZERS,
    needs_shared,
    qwen3_and_its_fix,
    transformers_tokenizer,
    two_requests_sharing_37_characters,
)
from test_kv_cache import straightforward_vllm

from tmpl_lint.cli import main
from tmpl_lint.scenarios import TOOLS, agent

pytestmark = needs_shared
transformers = pytest.importorskip("transformers")

QWEN3 = SHARED_TOKENIZERS / "qwen3"
# Keeps every turn's reasoning: a clean extension when the client sends history back as is.
STABLE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SYSTEM = "You are the support agent of a large online shop. " * 8  # shared by every session, several blocks
DROPPING = "s4"  # the client that sends the history back without the reasoning


@pytest.fixture
def tokenizer():
    return transformers_tokenizer("qwen3")


def build_log(path, tokenizer, sessions=5, turns=5, seed=7):
    """Interleaved chat sessions with a shared system prompt, every response logged with
    the ids the model generated; written out of arrival order (timestamps decide)."""
    rng = random.Random(seed)
    start = datetime(2026, 3, 1, 9)
    entries = []
    for number in range(sessions):
        user = f"s{number}"
        history = [{"role": "system", "content": SYSTEM}]
        for turn in range(turns):
            history = history + [{"role": "user", "content": f"Order {number}-{turn}: where is it? " * rng.randrange(1, 6)}]
            reasoning = f"The user {user} asks about order {number}-{turn}. " * rng.randrange(1, 4)
            content = f"Order {number}-{turn} ships tomorrow." + " Thanks for waiting." * rng.randrange(0, 4)
            generated = tokenizer.encode(f"<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>", add_special_tokens=False)
            # vLLM's responses carry the reasoning as `reasoning` (its chat parsing reads no
            # other name back) and, for older clients, as `reasoning_content` too.
            reply = {"role": "assistant", "content": content, "reasoning": reasoning, "reasoning_content": reasoning}
            entries.append(
                {
                    "timestamp": (start + timedelta(minutes=turn, seconds=number)).isoformat(),
                    "request": {"model": "m", "user": user, "messages": history},
                    "response": {"choices": [{"message": reply, "token_ids": generated}]},
                }
            )
            sent = {"role": "assistant", "content": content} if user == DROPPING else reply
            history = history + [sent]
    shuffled = list(entries)
    random.Random(seed).shuffle(shuffled)
    path.write_text("".join(json.dumps(entry) + "\n" for entry in shuffled))
    return sorted(entries, key=lambda entry: entry["timestamp"])


def independent_hits(entries, template, tokenizer, block_size, num_blocks):
    requests = []
    for entry in entries:
        text = tokenizer.apply_chat_template(
            entry["request"]["messages"], chat_template=template, add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer.encode(text, add_special_tokens=False)
        requests.append((prompt, entry["response"]["choices"][0]["token_ids"]))
    hits = straightforward_vllm(requests, block_size, num_blocks)
    return sum(hits), sum(len(prompt) for prompt, _ in requests)


def replay(*args):
    result = CliRunner().invoke(main, ["replay", *map(str, args)])
    return result


def test_hit_rate_is_what_a_straightforward_pool_hits_at_every_capacity(tmp_path, tokenizer):
    log = tmp_path / "traffic.jsonl"
    entries = build_log(log, tokenizer)
    template = tmp_path / "stable.jinja"
    template.write_text(STABLE)
    unbounded_hits, queries = independent_hits(entries, STABLE, tokenizer, 16, None)
    small, medium = 50, 90  # the largest request needs under 40 blocks, all of them 110
    expected = {blocks: independent_hits(entries, STABLE, tokenizer, 16, blocks)[0] for blocks in (small, medium)}
    assert expected[small] < expected[medium] < unbounded_hits  # eviction costs hits

    result = replay(log, "--tokenizer", QWEN3, "--template", template, "--session-key", "user", "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["template"]
    assert report["capacity_blocks"] is None
    assert (report["prefix_cache_queries"], report["prefix_cache_hits"]) == (queries, unbounded_hits)
    assert report["prefix_cache_hit_rate"] == unbounded_hits / queries

    result = replay(
        log, "--tokenizer", QWEN3, "--template", template, "--session-key", "user", "--cache-blocks", f"{small},{medium}"
    )
    assert result.exit_code == 0, result.output
    assert (
        f"hit rate by --cache-blocks: {small}: {expected[small] / queries:.1%}, {medium}: {expected[medium] / queries:.1%}"
        in result.stdout
    )
    result = replay(
        log,
        "--tokenizer",
        QWEN3,
        "--template",
        template,
        "--session-key",
        "user",
        "--cache-blocks",
        f"{small},{medium}",
        "--format",
        "json",
    )
    report = json.loads(result.stdout)["template"]
    assert report["capacity_blocks"] == small
    assert report["prefix_cache_hits"] == expected[small]
    assert [(point["capacity_blocks"], point["prefix_cache_hit_rate"]) for point in report["sweep"]] == [
        (small, expected[small] / queries),
        (medium, expected[medium] / queries),
    ]


def test_every_token_has_a_cause(tmp_path, tokenizer):
    log = tmp_path / "traffic.jsonl"
    entries = build_log(log, tokenizer)
    template = tmp_path / "stable.jinja"
    template.write_text(STABLE)
    base = [log, "--tokenizer", QWEN3, "--template", template, "--session-key", "user", "--format", "json"]
    report = json.loads(replay(*base).stdout)["template"]
    causes = report["tokens_by_cause"]
    assert sum(causes.values()) == report["prefix_cache_queries"]
    assert causes["hit"] + causes["shared-hit"] == report["prefix_cache_hits"]
    # on every request, four sessions hit the blocks of the shared system prompt that s0 computed
    first_prompts = [
        tokenizer.encode(tokenizer.apply_chat_template(entry["request"]["messages"], chat_template=STABLE, tokenize=False))
        for entry in entries[:2]
    ]
    shared = next(i for i, (a, b) in enumerate(zip(*first_prompts)) if a != b) // 16 * 16
    assert shared >= 80
    assert causes["shared-hit"] == 4 * 5 * shared
    assert causes["template"] == 0 and causes["capacity"] == 0
    assert causes["client"] > 0
    assert [(cause["cause"], cause["detail"], cause["requests"]) for cause in report["causes"]] == [
        ("client", "reasoning dropped", 4)
    ]
    worst = report["worst_sessions"][0]
    assert worst["session"] == DROPPING and worst["lost_tokens"] == causes["client"]
    first = worst["first_departure"]
    dropping = [entry for entry in entries if entry["request"]["user"] == DROPPING]
    assert first["request"] == 2
    assert first["line"] == 1 + [json.loads(line) for line in log.read_text().splitlines()].index(dropping[1])
    assert first["reasons"][0] == {
        "cause": "client",
        "detail": "reasoning dropped",
        "message_index": 2,
        "role": "assistant",
        "field": None,
    }
    # with a pool that must evict, the lost blocks are counted as capacity
    report = json.loads(replay(*base, "--cache-blocks", "50").stdout)["template"]
    assert report["tokens_by_cause"]["capacity"] > 0
    assert sum(report["tokens_by_cause"].values()) == report["prefix_cache_queries"]
    assert ("capacity", "evicted") in [(cause["cause"], cause["detail"]) for cause in report["causes"]]


def test_the_template_rule_and_the_fix_on_the_same_pool(tmp_path, tokenizer):
    """Qwen3 drops the reasoning of answered turns: every session loses the reply it
    generated (PC002), the dropping client's too, since the template drops it anyway.
    Fixed, only the dropping client still loses it."""
    log = tmp_path / "traffic.jsonl"
    entries = build_log(log, tokenizer)
    original, fixed = qwen3_and_its_fix(tmp_path)
    page = tmp_path / "replay.html"
    result = replay(
        log, "--tokenizer", QWEN3, "--template", original, "--compare", fixed, "--session-key", "user",
        "--cache-blocks", "50,90,100000", "--format", "json", "--html", page,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    before, after = report["template"], report["compare"]
    hits, queries = independent_hits(entries, original.read_text(), tokenizer, 16, 50)
    assert (before["prefix_cache_hits"], before["prefix_cache_queries"]) == (hits, queries)
    # The reply rendered with its reasoning while it was the newest message, without it once a
    # user message follows: a rewrite of the reply, as check's proof calls that pair.
    assert [(c["cause"], c["detail"]) for c in before["causes"] if c["cause"] != "capacity"] == [
        ("template", "PC002 reply-rewrite")
    ]
    assert before["tokens_by_cause"]["client"] == 0
    assert [(c["cause"], c["detail"]) for c in after["causes"] if c["cause"] != "capacity"] == [("client", "reasoning dropped")]
    assert after["tokens_by_cause"]["template"] == 0
    # with room for everything the fix pays; in 50 blocks its longer prompts (reasoning kept) evict more
    assert after["sweep"][-1]["prefix_cache_hit_rate"] > before["sweep"][-1]["prefix_cache_hit_rate"]
    assert after["tokens_by_cause"]["capacity"] > before["tokens_by_cause"]["capacity"]

    html_page = page.read_text()
    assert "KV cache capacity (--cache-blocks, log scale)" in html_page and "prefix cache hit rate" in html_page
    assert "tokens lost, cumulative" in html_page and "request of the session" in html_page
    sweep_chart = html_page.split("<h2>Hit rate by cache capacity</h2>")[1].split("<h2>")[0]
    assert sweep_chart.count("<polyline") == 2  # both templates
    # The page names what it replayed: the files, the log and the options.
    assert "<li>" in sweep_chart and f"{original}: vllm" in sweep_chart and f"{fixed}: vllm" in sweep_chart
    assert f"<p>Log: <code>{log}</code></p>" in html_page
    assert (
        f"<p>Options: <code>--template {original} --compare {fixed} --tokenizer {QWEN3} --session-key user "
        "--engine vllm --cache-model vllm --cache-blocks 50,90,100000</code></p>"
    ) in html_page
    # A row for each capacity of each template, not the smallest alone; at 50 blocks the
    # original's rate is the independent pool's.
    rows = re.findall(r"<tr><td>([^<]*)</td><td>vllm</td><td>blocks of 16, (\d+) blocks</td><td>([0-9.]+)%</td>", html_page)
    assert [(name, int(blocks)) for name, blocks, _ in rows] == [
        (str(path), blocks) for path in (original, fixed) for blocks in (50, 90, 100000)
    ]
    assert rows[0][2] == f"{hits / queries:.1%}"[:-1]
    for (_, _, shown), point in zip(rows, before["sweep"] + after["sweep"]):
        assert shown == f"{point['prefix_cache_hit_rate']:.1%}"[:-1]
    sessions_chart = html_page.split("<h2>Worst sessions")[1]
    legend = re.findall(r"<li>.*?</li>", sessions_chart)
    assert any(f"session {DROPPING}" in item for item in legend)  # named in the legend, not only in tooltips
    colours = set(re.findall(r'<polyline fill="none" stroke="(#[0-9a-f]+)"', sessions_chart))
    assert len(colours) == len({re.search(r"session (s\d)", item).group(1) for item in legend})


def test_thinking_off_traffic_loses_the_generation_prompt_s_empty_block_not_reasoning(tmp_path, tokenizer):
    """QA8: Qwen3 sent with enable_thinking=false opens each reply with the empty
    "<think>\n\n</think>\n\n" and history prints the answer without it. The loss is the
    generation prompt's (PC006), the same before and after the PC002 fix, which keeps
    reasoning the model never wrote here."""
    system = {
        "role": "system",
        "content": "You are a helpful assistant for a travel agency. Answer briefly and accurately, and ask when something is unclear.",
    }
    turns = [
        ("What is the capital of France?", "Paris."),
        ("And of Italy?", "Rome."),
        ("Which one is larger by population?", "Paris."),
    ]
    messages, lines = [system], []
    for question, answer in turns:
        messages = [*messages, {"role": "user", "content": question}]
        body = {"model": "m", "user": "u", "messages": messages, "chat_template_kwargs": {"enable_thinking": False}}
        lines.append(json.dumps(body))
        messages = [*messages, {"role": "assistant", "content": answer}]
    log = tmp_path / "traffic.jsonl"
    log.write_text("\n".join(lines) + "\n")
    original, fixed = qwen3_and_its_fix(tmp_path)
    result = replay(
        log, "--tokenizer", QWEN3, "--template", original, "--compare", fixed, "--session-key", "user", "--format", "json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for side in ("template", "compare"):
        causes = [(c["cause"], c["detail"]) for c in report[side]["causes"] if c["cause"] != "capacity"]
        assert causes == [("template", "PC006 generation-prompt")], side
    # 2 of 3 requests send back a reply whose opener history left out: the same loss either way
    assert report["template"]["prefix_cache_hits"] == report["compare"]["prefix_cache_hits"]


def test_the_server_s_default_chat_template_kwargs_are_rendered_as_the_server_renders_them(tmp_path, tokenizer):
    """QA8: a Qwen3 server started with --default-chat-template-kwargs '{"enable_thinking":
    false}' renders every request with it: the same figures as the log with the kwargs written
    into each request, not those of a server without them."""
    plain, written = tmp_path / "plain.jsonl", tmp_path / "written.jsonl"
    entries = build_log(plain, tokenizer, sessions=3, turns=3)
    lines = []
    for entry in entries:
        entry["request"]["chat_template_kwargs"] = {"enable_thinking": False}
        lines.append(json.dumps(entry))
    written.write_text("\n".join(lines) + "\n")
    template = SHARED_TEMPLATES / "Qwen--Qwen3-0.6B.jinja"
    base = ["--tokenizer", QWEN3, "--template", template, "--session-key", "user", "--format", "json"]
    told = json.loads(replay(plain, *base, "--default-chat-template-kwargs", '{"enable_thinking": false}').stdout)["template"]
    each = json.loads(replay(written, *base).stdout)["template"]
    untold = json.loads(replay(plain, *base).stdout)["template"]
    figures = ("prefix_cache_hits", "prefix_cache_queries")
    assert [told[key] for key in figures] == [each[key] for key in figures]
    assert [told[key] for key in figures] != [untold[key] for key in figures]
    result = replay(plain, *base, "--default-chat-template-kwargs", "[1]")
    assert result.exit_code == 2
    assert (
        result.stderr.splitlines()[-1] == "Error: Invalid value for '--default-chat-template-kwargs': '[1]' is not a JSON object"
    )


def test_html_report_follows_the_umask(tmp_path, tokenizer):
    log = tmp_path / "traffic.jsonl"
    build_log(log, tokenizer, sessions=2, turns=2)
    page = tmp_path / "replay.html"
    previous = os.umask(0o022)
    try:
        result = replay(log, "--tokenizer", QWEN3, "--template", SHARED_TEMPLATES / "Qwen--Qwen3-0.6B.jinja", "--html", page)
    finally:
        os.umask(previous)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(page.stat().st_mode) == 0o644


def test_sessions_by_prefix_continuity_survive_a_client_that_drops_reasoning(tmp_path, tokenizer):
    log = tmp_path / "traffic.jsonl"
    build_log(log, tokenizer)
    template = tmp_path / "stable.jinja"
    template.write_text(STABLE)
    keyed = json.loads(
        replay(log, "--tokenizer", QWEN3, "--template", template, "--session-key", "user", "--format", "json").stdout
    )
    found = json.loads(replay(log, "--tokenizer", QWEN3, "--template", template, "--format", "json").stdout)
    assert found["template"]["sessions"] == 5
    assert found["template"]["tokens_by_cause"] == keyed["template"]["tokens_by_cause"]


def test_arrival_order_is_by_timestamp(tmp_path, tokenizer):
    """The same log in another file order gives the same pool figures."""
    log = tmp_path / "traffic.jsonl"
    build_log(log, tokenizer)
    other = tmp_path / "other.jsonl"
    lines = log.read_text().splitlines()
    other.write_text("\n".join(reversed(lines)) + "\n")
    template = tmp_path / "stable.jinja"
    template.write_text(STABLE)
    runs = [
        json.loads(replay(path, "--tokenizer", QWEN3, "--template", template, "--cache-blocks", "50", "--format", "json").stdout)
        for path in (log, other)
    ]
    assert runs[0]["template"]["prefix_cache_hits"] == runs[1]["template"]["prefix_cache_hits"]
    assert runs[0]["template"]["tokens_by_cause"] == runs[1]["template"]["tokens_by_cause"]


@pytest.mark.parametrize("model", ["sglang", "llamacpp"])
def test_other_cache_models(tmp_path, tokenizer, model):
    log = tmp_path / "traffic.jsonl"
    build_log(log, tokenizer)
    template = tmp_path / "stable.jinja"
    template.write_text(STABLE)
    result = replay(
        log, "--tokenizer", QWEN3, "--template", template, "--session-key", "user", "--cache-model", model, "--format", "json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["template"]
    assert report["cache_model"] == model and report["block_size"] == 1
    causes = report["tokens_by_cause"]
    assert sum(causes.values()) == report["prefix_cache_queries"]
    # token granularity: no block rounding, only the one token always computed, at most once a request
    assert causes["partial-block"] <= report["requests"]
    assert causes["client"] > 0
    # SGLang's tree is shared by all sessions; llama.cpp gives each session its own slot
    assert (causes["shared-hit"] > 0) == (model == "sglang")


def test_capacity_from_memory_and_errors(tmp_path, tokenizer):
    log = tmp_path / "traffic.jsonl"
    build_log(log, tokenizer, sessions=2, turns=2)
    template = tmp_path / "stable.jinja"
    template.write_text(STABLE)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64, "torch_dtype": "float16"}))
    # 2 * 2 layers * 2 heads * 64 * 2 bytes = 1024 bytes per token: 1 MiB holds 1024 tokens, 64 blocks
    result = replay(
        log,
        "--tokenizer",
        QWEN3,
        "--template",
        template,
        "--kv-cache-gib",
        1 / 1024,
        "--model-config",
        config,
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["template"]["capacity_blocks"] == 64

    result = replay(log, "--tokenizer", QWEN3, "--template", template, "--cache-blocks", "3")
    assert result.exit_code == 2
    errors = "".join(line for line in result.stderr.splitlines(keepends=True) if not line.startswith("tmpl-lint: note: "))
    assert re.fullmatch(
        r"tmpl-lint: error: line \d+: a request needs \d+ blocks \(\d+ tokens\) and the pool holds 2: "
        r"vLLM does not start with a max_model_len that does not fit\n",
        errors,
    )
    result = replay(log, "--tokenizer", QWEN3, "--template", template, "--kv-cache-gib", "1")
    assert result.exit_code == 2
    assert result.stderr.startswith("tmpl-lint: error: the KV cache size per token needs the model's layers")


def test_logged_responses_enter_the_check(tmp_path):
    """With the reply logged, the compact arguments the model wrote are what the cache holds."""
    calls = agent(False, True)  # arguments as JSON text: vLLM answers 400 to an object
    reply = dict(calls[0].reply)
    reply["tool_calls"] = [dict(reply["tool_calls"][0], function={"name": "get_weather", "arguments": '{"city":"Paris"}'})]
    lines = [
        {"request": {"messages": calls[0].messages, "tools": TOOLS, "user": "u"}, "response": {"choices": [{"message": reply}]}},
        {"request": {"messages": calls[1].messages, "tools": TOOLS, "user": "u"}},
    ]
    log = tmp_path / "traffic.jsonl"
    log.write_text("\n".join(json.dumps(line) for line in lines))
    result = replay(log, "--template", SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja", "--format", "json")
    report = json.loads(result.stdout)["template"]
    assert report["unit"] == "char"
    assert [(cause["cause"], cause["detail"]) for cause in report["causes"]] == [("template", "PC004 tool-arguments")]


def test_bad_log_is_a_one_line_error(tmp_path):
    log = tmp_path / "bad.jsonl"
    log.write_text('{"messages": []}\n')
    result = CliRunner().invoke(
        main, ["replay", str(log), "--template", str(SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja")]
    )
    assert result.exit_code == 2
    assert result.stderr == f"tmpl-lint: error: {log}:1: no messages in this request\n"


def test_an_empty_log_and_a_session_key_no_request_has_are_one_line_errors(tmp_path):
    template = CORPUS / "clean_chatml.jinja"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = replay(empty, "--template", template)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"tmpl-lint: error: {empty}: no requests to replay\n")
    log = tmp_path / "two.jsonl"
    request = {"messages": [{"role": "user", "content": "Hi"}], "user": "ada"}
    log.write_text(json.dumps(request) + "\n" + json.dumps(request) + "\n")
    result = replay(log, "--template", template, "--session-key", "metadata.session_id")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "tmpl-lint: error: --session-key metadata.session_id: no request has it, so it names no session\n"
    result = replay(log, "--template", template, "--session-key", "user")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0].startswith("template: 2 requests in 1 session, ")


def test_a_tool_call_reply_is_generated_through_its_end_of_turn_marker():
    """What the model wrote: the arguments as it wrote them and the closing markup up to
    <|im_end|> (the last token, never fed back, is left out of the cache later)."""
    from tmpl_lint.diff import read_template
    from tmpl_lint.replay.attribution import Tracer
    from tmpl_lint.replay.log import Call, reply_message

    text, special = read_template(SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja")
    tracer = Tracer(text, None, special, "vllm")
    reply = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}],
    }
    call = Call(
        {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
        line=1,
        response={"choices": [{"message": reply}]},
    )
    prompt = tracer.prompt(call, None)
    ids, generated = tracer.generated(call, prompt.text, reply_message(call.response))
    assert generated == '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call><|im_end|>'
    assert ids == [ord(char) for char in generated]


QWEN25 = SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja"
# The model wrote its arguments spaced (as Qwen and Llama write them), in this key order.
SPACED_ARGUMENTS = '{"city": "Paris", "units": "metric", "days": [1, 2], "alerts": true}'


@pytest.mark.parametrize(
    "printed",
    [
        "tool_call.arguments | tojson",  # json.dumps's default spacing, as the model wrote them
        'tool_call.arguments | tojson(separators=(",", ":"))',  # what every PC004 fix writes
        "tool_call.arguments | tojson(sort_keys=True)",  # another key order
        "tool_call.arguments | tojson(indent=2)",
    ],
)
def test_a_reply_keeps_the_logged_arguments_however_the_template_prints_them(printed):
    """The cache holds what the model generated: the arguments string of the log, not the
    template's re-serialisation of the mapping the engine parsed it into, whatever the
    template's separators, key order or indentation."""
    from tmpl_lint.replay.attribution import Tracer
    from tmpl_lint.replay.log import Call, reply_message

    text = QWEN25.read_text().replace("tool_call.arguments | tojson", printed)
    assert printed in text
    tracer = Tracer(text, None, {}, "vllm")
    reply = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": SPACED_ARGUMENTS}}],
    }
    call = Call(
        {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
        line=1,
        response={"choices": [{"message": reply}]},
    )
    prompt = tracer.prompt(call, None)
    _ids, generated = tracer.generated(call, prompt.text, reply_message(call.response))
    assert generated == ('<tool_call>\n{"name": "get_weather", "arguments": ' + SPACED_ARGUMENTS + "}\n</tool_call><|im_end|>")


def test_a_compact_template_costs_a_model_that_writes_spaced_arguments_what_a_hand_replay_says(tmp_path):
    """The d02 case: the model wrote spaced arguments, the template (a PC004 fix) prints them
    compact. The hit rate is what transformers' renders, the logged replies and a plain vLLM
    pool give, and the blocks after the arguments are lost to the template."""
    compact = QWEN25.read_text().replace("tool_call.arguments | tojson", 'tool_call.arguments | tojson(separators=(",", ":"))')
    template = tmp_path / "compact.jinja"
    template.write_text(compact)
    tools = [{"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {"type": "object"}}}]
    arguments = json.dumps({"query": "weather in Paris", "lang": "en", "limit": 10, "fields": ["sky", "wind"], "safe": True})
    user = {"role": "user", "content": "What is the weather in Paris? Please search for it and summarise."}
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": arguments}}],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny, light wind"}
    answer = {"role": "assistant", "content": "It is 18 C and sunny in Paris."}
    steps = [
        ([user], call),
        ([user, call, result], answer),
        ([user, call, result, answer, {"role": "user", "content": "Thanks!"}], None),
    ]
    log = tmp_path / "traffic.jsonl"
    log.write_text(
        "".join(
            json.dumps(
                {"request": {"messages": messages, "tools": tools, "user": "s"}}
                | ({"response": {"choices": [{"message": reply}]}} if reply else {})
            )
            + "\n"
            for messages, reply in steps
        )
    )
    tokenizer = transformers_tokenizer("qwen2.5")
    requests = []
    for messages, reply in steps:
        parsed = json.loads(json.dumps(messages))
        for message in parsed:
            for tool_call in message.get("tool_calls") or ():
                tool_call["function"]["arguments"] = json.loads(tool_call["function"]["arguments"])  # as vLLM does
        text = tokenizer.apply_chat_template(
            parsed, tools=tools, chat_template=compact, add_generation_prompt=True, tokenize=False
        )
        if reply is None:
            written = ""
        elif reply.get("tool_calls"):
            written = '<tool_call>\n{"name": "search", "arguments": ' + arguments + "}\n</tool_call><|im_end|>"
        else:
            written = reply["content"] + "<|im_end|>"
        requests.append((tokenizer.encode(text, add_special_tokens=False), tokenizer.encode(written, add_special_tokens=False)))
    hits = sum(straightforward_vllm(requests, 16, None))
    queries = sum(len(prompt) for prompt, _ in requests)

    outcome = replay(
        log, "--tokenizer", SHARED_TOKENIZERS / "qwen2.5", "--template", template, "--session-key", "user", "--format", "json"
    )
    assert outcome.exit_code == 0, outcome.output
    report = json.loads(outcome.stdout)["template"]
    assert (report["prefix_cache_queries"], report["prefix_cache_hits"]) == (queries, hits)
    assert report["tokens_by_cause"]["template"] > 0
    assert [(cause["cause"], cause["detail"]) for cause in report["causes"]] == [("template", "PC004 tool-arguments")]


def test_a_reply_after_a_marked_last_message_is_what_the_model_wrote():
    """The template marks the newest message (`{% if loop.last %} (latest)`): rendered with
    the reply, the user message loses its mark, so the render parts from the prompt before
    the prompt ends. The model still wrote only its answer and <|im_end|>, after prompt N's
    generation prompt, and never the mark the render gives the reply as the newest."""
    from tmpl_lint.replay.attribution import Tracer
    from tmpl_lint.replay.log import Call, reply_message

    text = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{{ m.content }}{% if loop.last %} (latest){% endif %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tracer = Tracer(text, None, {}, "vllm")
    reply = {"role": "assistant", "content": "Answer 1."}
    call = Call({"messages": [{"role": "user", "content": "Question 1?"}]}, line=1, response={"choices": [{"message": reply}]})
    prompt = tracer.prompt(call, None)
    assert prompt.text == "<|im_start|>user\nQuestion 1? (latest)<|im_end|>\n<|im_start|>assistant\n"
    ids, generated = tracer.generated(call, prompt.text, reply_message(call.response))
    assert generated == "Answer 1.<|im_end|>"
    assert ids == [ord(char) for char in generated]


def test_records_of_the_wrong_types_are_one_error_each_and_the_rest_replays(tmp_path):
    user = {"role": "user", "content": "hi"}
    good = [
        {"request": {"messages": [user], "user": "u"}},
        {"request": {"messages": [user, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}], "user": "u"}},
    ]
    bad = [
        ('{"messages": [{"role": "user", "content": "hi"}], "timestamp": 1e300}', "timestamp 1e+300 is out of range"),
        ('{"messages": [1, 2]}', "every message must be an object with a role"),
        (
            '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "x"}',
            "chat_template_kwargs must be an object",
        ),
        ('{"messages": [{"role": "user", "content": "x"}], "tools": 5}', "tools must be a list of objects"),
        ('{"messages": [{"role": "user", "content": "x"}], "timestamp": [1]}', "timestamp [1] is neither a number nor a string"),
        (
            '{"messages": [{"role": "user", "content": "x"}], "timestamp": "yesterday"}',
            "timestamp 'yesterday' is not a time: seconds since the epoch or ISO 8601 (2026-03-01T09:00:00Z)",
        ),
        (
            '{"request": {"messages": [{"role": "user", "content": "x"}]}, "response": {"token_ids": ["a", 1e400]}}',
            "response token_ids must be a list of token ids (non-negative integers)",
        ),
        ("[" * 100_000 + "]" * 100_000, "invalid JSON: nested too deeply to read"),
        ("{oops", "invalid JSON: Expecting property name enclosed in double quotes"),
    ]
    log = tmp_path / "traffic.jsonl"
    lines = [json.dumps(good[0])] + [line for line, _ in bad] + [json.dumps(good[1])]
    log.write_text("\n".join(lines) + "\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tmpl_lint",
            "replay",
            str(log),
            "--template",
            str(SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja"),
            "--session-key",
            "user",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stderr == "".join(f"tmpl-lint: error: {log}:{number}: {reason}\n" for number, (_, reason) in enumerate(bad, 2))
    report = json.loads(result.stdout)["template"]
    assert (report["sessions"], report["requests"]) == (1, 2)  # the two good calls, one session
    assert result.returncode == 2


def test_a_log_of_which_no_line_can_be_read_says_so_not_that_the_template_failed(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text('{"messages": [1]}\n{oops\n')
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    result = replay(log, "--template", template)
    assert result.exit_code == 2
    assert "  Prefix cache hit rate: n/a (no request in the log could be read)" in result.stdout.splitlines()


def test_a_timestamp_of_0_is_1970_and_the_clock_shows_it(tmp_path):
    """0 is a time (1970-01-01 00:00 UTC), not a missing one: taken as none, the first
    request's clock showed today and the next one's 1970, a date change the template never
    made. A string of digits is seconds too."""
    from tmpl_lint.diff import read_template
    from tmpl_lint.replay.attribution import Tracer
    from tmpl_lint.replay.log import read_log

    template = tmp_path / "dated.jinja"
    template.write_text(
        "{{ 'Today: ' + strftime_now('%Y-%m-%d') + '\\n' }}"
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    first = [{"role": "user", "content": "Hi, what is on the list for today?"}]
    second = first + [{"role": "assistant", "content": "Three things."}, {"role": "user", "content": "Which?"}]
    log = tmp_path / "traffic.jsonl"
    log.write_text(
        json.dumps({"request": {"messages": first, "user": "u", "created": 1764590400}, "timestamp": 0})
        + "\n"
        + json.dumps({"request": {"messages": second, "user": "u"}, "timestamp": "60"})
        + "\n"
    )
    with read_log(log) as read:
        assert read.problems == []
        calls = [read.call(entry) for entry in read.entries]
    assert [call.timestamp for call in calls] == [datetime(1970, 1, 1, 0, 0), datetime(1970, 1, 1, 0, 1)]
    text, special = read_template(template)
    assert Tracer(text, None, special, "vllm").prompt(calls[0], None).text.startswith("Today: 1970-01-01\n<|im_start|>user\n")
    result = replay(log, "--template", template, "--session-key", "user", "--format", "json")
    assert (result.exit_code, result.stderr) == (0, "")
    report = json.loads(result.stdout)["template"]
    assert report["tokens_by_cause"]["template"] == 0
    assert report["causes"] == []


def test_a_choice_that_is_not_an_object_is_no_reply():
    from tmpl_lint.replay.log import reply_message

    assert reply_message({"choices": [5]}) is None
    assert reply_message({"choices": [{"message": {"role": "assistant", "content": "x"}}]}) == {
        "role": "assistant",
        "content": "x",
    }


def test_sessions_traced_in_parallel_give_the_same_report(tmp_path, tokenizer):
    """Forked workers (200 requests and more) report exactly what one process does."""
    log = tmp_path / "traffic.jsonl"
    build_log(log, tokenizer, sessions=20, turns=10)
    template = tmp_path / "stable.jinja"
    template.write_text(STABLE)
    base = [
        log,
        "--tokenizer",
        QWEN3,
        "--template",
        template,
        "--session-key",
        "user",
        "--cache-blocks",
        "120,400",
        "--format",
        "json",
    ]
    serial, parallel = (json.loads(replay(*base, "--jobs", jobs).stdout) for jobs in ("1", "2"))
    assert serial["template"]["requests"] == 200
    assert serial == parallel


@pytest.mark.parametrize(
    ("change", "detail", "index", "described"),
    [
        (
            lambda m: [{"role": "system", "content": "Be terse."}, *m[1:]],
            "system prompt changed",
            0,
            "client system prompt changed, message 0 (system)",
        ),
        (
            lambda m: [*m[:3], {**m[3], "content": "No, the blue one."}, *m[4:]],
            "message edited",
            3,
            "client message edited, message 3 (user)",
        ),
        (
            lambda m: [*m[:2], *m[3:]],
            "message removed",
            2,
            "client message removed, message 2 of the previous request (assistant)",
        ),
        (
            lambda m: [*m[:2], {"role": "user", "content": "Sorry, a shirt in red."}, *m[2:]],
            "message inserted",
            2,
            "client message inserted, message 2 (user)",
        ),
        (
            lambda m: [*m[:2], m[3], m[2], *m[4:]],
            "messages reordered",
            2,
            "client messages reordered, message 2 of the previous request (assistant), now message 3",
        ),
        (
            lambda m: [m[0], m[3], m[2], m[1], *m[4:]],
            "messages reordered",
            1,
            "client messages reordered, message 1 of the previous request (user), now message 3",
        ),
        (
            lambda m: [*m[:2], {key: v for key, v in m[2].items() if key != "reasoning_content"}, *m[3:]],
            "reasoning dropped",
            2,
            "client reasoning dropped, message 2 (assistant)",
        ),
        (
            lambda m: [*m[:4], {**m[4], "reasoning_content": "Hmm."}, *m[5:]],
            "reasoning edited",
            4,
            "client reasoning edited, message 4 (assistant)",
        ),
        (lambda m: m[:4], "message removed", 4, "client message removed, message 4 of the previous request (assistant)"),
    ],
)
def test_what_the_client_changed(change, detail, index, described):
    from tmpl_lint.replay.attribution import Departure
    from tmpl_lint.requests import Request, client_change

    history = [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "A shirt, please."},
        {"role": "assistant", "content": "Which colour?", "reasoning_content": "Ask for the colour."},
        {"role": "user", "content": "Red."},
    ]
    reply = {"role": "assistant", "content": "Red it is.", "reasoning_content": "Confirm.", "refusal": None}
    previous = Request({"messages": history})
    sent = [*history, {key: value for key, value in reply.items() if value is not None}]
    assert client_change(previous, reply, Request({"messages": [*sent, {"role": "user", "content": "Thanks"}]})) is None
    found = client_change(previous, reply, Request({"messages": [*change(sent), {"role": "user", "content": "Thanks"}]}))
    assert (found.to_json()["cause"], found.detail, found.message_index) == ("client", detail, index)
    assert Departure.of_client(found).describe() == described


def test_what_else_the_client_changed():
    from tmpl_lint.requests import Request, client_change

    messages = [{"role": "user", "content": "Weather?"}]
    reply = {
        "role": "assistant",
        "tool_calls": [{"id": "1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Paris"}'}}],
    }
    previous = Request({"messages": messages, "tools": TOOLS})
    echoed = {**reply, "tool_calls": [{**reply["tool_calls"][0], "function": {"name": "w", "arguments": '{"city": "Paris"}'}}]}
    found = client_change(previous, reply, Request({"messages": [*messages, echoed], "tools": TOOLS}))
    assert (found.detail, found.message_index) == ("tool-call arguments re-serialized", 1)
    found = client_change(previous, reply, Request({"messages": [*messages, reply], "tools": TOOLS[:0]}))
    assert (found.detail, found.message_index) == ("tools changed", None)
    options = {"messages": [*messages, reply], "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}
    assert client_change(previous, reply, Request(options)).detail == "request options changed"


def test_replay_through_a_server_uses_the_served_model_and_says_so_once(tmp_path):
    from test_diff import serving

    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    log = tmp_path / "traffic.jsonl"
    calls = [
        {"model": "gpt-4o", "user": "s1", "messages": [{"role": "user", "content": "Hi"}]},
        {
            "model": "gpt-4o",
            "user": "s1",
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Bye"},
            ],
        },
    ]
    log.write_text("".join(json.dumps(call) + "\n" for call in calls))
    with serving() as (handler, url):
        result = CliRunner().invoke(
            main, ["replay", str(log), "--template", str(template), "--server", url, "--session-key", "user", "--format", "json"]
        )
        assert [request["model"] for _, request in handler.seen] == ["served-model", "served-model"]
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"tmpl-lint: note: {url} does not serve 'gpt-4o', the request's model: using 'served-model', the model it serves\n"
    )
    json.loads(result.stdout)


def test_two_requests_sharing_37_characters_by_hand(tmp_path):
    # vLLM, blocks of 16: request 1 queries 57 and hits nothing; request 2 queries 57 and hits
    # the 2 full blocks of the 37 characters it shares: 32 / 114. Had the client not edited
    # the message, 56 looked up: 3 blocks, 48; the last 9 are in a partial block.
    template, log = two_requests_sharing_37_characters(tmp_path)
    result = replay(log, "--template", template, "--session-key", "user", "--format", "json")
    summary = json.loads(result.stdout)["template"]
    assert result.exit_code == 0
    assert (summary["prefix_cache_queries"], summary["prefix_cache_hits"]) == (114, 32)
    assert summary["steady_state_hit_rate"] == 32 / 57
    assert summary["ideal_hit_rate"] == 48 / 114
    assert summary["tokens_by_cause"] == {
        "hit": 32,
        "shared-hit": 0,
        "cold": 57,
        "partial-block": 9,
        "template": 0,
        "client": 16,
        "capacity": 0,
        "routing": 0,
        "layers": 0,
    }
    out = replay(log, "--template", template, "--session-key", "user").stdout
    assert (
        "  Prefix cache hit rate: 28.1% (vllm:prefix_cache_hits / vllm:prefix_cache_queries, every request: 32 of 114 chars)\n"
        in out
    )
    assert "  lost to client message edited: 16 chars in 1 request\n" in out


def test_the_configuration_gives_the_block_size(tmp_path, monkeypatch):
    # The 37 shared characters above in blocks of 4 (the project's vLLM block size, said once
    # in its configuration): 9 full blocks, 36 hits of 114.
    template, log = two_requests_sharing_37_characters(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.tmpl-lint]\nblock-size = 4\n")
    monkeypatch.chdir(tmp_path)
    result = replay(log, "--template", template, "--session-key", "user", "--format", "json")
    summary = json.loads(result.stdout)["template"]
    assert (result.exit_code, summary["block_size"], summary["prefix_cache_hits"]) == (0, 4, 36)
    result = replay(log, "--template", template, "--session-key", "user", "--format", "json", "--block-size", "16")
    summary = json.loads(result.stdout)["template"]
    assert (result.exit_code, summary["block_size"], summary["prefix_cache_hits"]) == (0, 16, 32)
    result = replay(log, "--session-key", "user")
    assert (result.exit_code, result.stderr.splitlines()[-1]) == (
        2,
        "Error: give --template or --tokenizer (a directory with a chat template)",
    )


def test_a_departure_before_the_first_message_says_so_and_names_no_message():
    from tmpl_lint.proofs import BEFORE_MESSAGES
    from tmpl_lint.replay.attribution import Departure, TokenCause

    departure = Departure(TokenCause.TEMPLATE, "PC100 system", None, None, BEFORE_MESSAGES)
    assert departure.describe() == "template PC100 system, before the first message"
    assert departure.to_json()["message_index"] is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--page-size", "4"], "--page-size is SGLang's page size: it needs --cache-model sglang"),
        (["--cache-model", "llamacpp", "--page-size", "3"], "--page-size is SGLang's page size: it needs --cache-model sglang"),
        (["--cache-model", "sglang", "--slots", "3"], "--slots is llama.cpp's: it needs --cache-model llamacpp"),
        (["--cache-reuse", "5"], "--cache-reuse is llama.cpp's: it needs --cache-model llamacpp"),
    ],
)
def test_a_flag_of_another_engines_cache_is_a_usage_error(tmp_path, flags, message):
    # it was accepted, and the figures were those of a run without it
    template, log = two_requests_sharing_37_characters(tmp_path)
    result = replay(log, "--template", template, "--session-key", "user", *flags)
    assert (result.exit_code, result.stderr.splitlines()[-1]) == (2, f"Error: {message}")


def test_both_capacities_given_is_said_before_what_either_needs(tmp_path):
    # --kv-cache-gib needs the model's shape; given with --cache-blocks, the one error is "both"
    template, log = two_requests_sharing_37_characters(tmp_path)
    result = replay(log, "--template", template, "--cache-blocks", "8", "--kv-cache-gib", "1")
    assert (result.exit_code, result.stderr) == (2, "tmpl-lint: error: give --cache-blocks or --kv-cache-gib, not both\n")


def last_marked_log(path, kwargs=None):
    """Two sessions of three turns each, the model's replies logged."""
    system = {"role": "system", "content": "You are helpful."}
    lines = []
    for turn in range(3):
        for user in ("alice", "bob"):
            messages = [system]
            for k in range(turn):
                messages += [
                    {"role": "user", "content": f"{user} question {k}?"},
                    {"role": "assistant", "content": f"Answer {k}."},
                ]
            messages.append({"role": "user", "content": f"{user} question {turn}?"})
            request = {"messages": messages, "user": user} | ({"chat_template_kwargs": kwargs} if kwargs else {})
            reply = {"role": "assistant", "content": f"Answer {turn}."}
            lines.append({"request": request, "response": {"choices": [{"message": reply}]}})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_last_message_rewrite_is_named_by_the_rule_check_names(tmp_path):
    """A `loop.last` test that marks the latest message: check reports PC003, a history
    rewrite in the last message; replay names the same rule, cause and message, not the
    generation prompt of the reply after it (nor PC100)."""
    template = tmp_path / "last.jinja"
    template.write_text(
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{{ m.content }}{% if loop.last %} (latest){% endif %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    check = CliRunner().invoke(main, ["check", str(template), "--format", "json"])
    assert {finding["code"] for finding in json.loads(check.stdout)} == {"PC003"}
    log = tmp_path / "traffic.jsonl"
    last_marked_log(log)
    result = replay(log, "--template", template, "--session-key", "user", "--block-size", "1", "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["template"]
    assert [(cause["cause"], cause["detail"], cause["requests"]) for cause in report["causes"]] == [
        ("template", "PC003 history-rewrite", 4)
    ]
    (reason,) = report["worst_sessions"][0]["first_departure"]["reasons"]
    assert (reason["detail"], reason["message_index"], reason["role"], reason["field"]) == (
        "PC003 history-rewrite",
        1,
        "user",
        "markup",
    )


def test_an_unexplained_generation_prompt_divergence_is_pc006_not_pc100(tmp_path):
    """A generation prompt that prints a newline more only under a variable the scenarios do
    not try: check passes, the traffic that sets it diverges in the generation prompt. The
    README: such a divergence is PC006's (found by proof), never PC100's."""
    template = tmp_path / "spaced.jinja"
    template.write_text(
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        '{% if add_generation_prompt %}<|im_start|>assistant\n{% if style == "spaced" %}{{ "\\n" }}{% endif %}{% endif %}'
    )
    assert CliRunner().invoke(main, ["check", str(template)]).exit_code == 0
    log = tmp_path / "traffic.jsonl"
    last_marked_log(log, {"style": "spaced"})
    result = replay(log, "--template", template, "--session-key", "user", "--block-size", "1", "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["template"]
    assert [(cause["cause"], cause["detail"]) for cause in report["causes"]] == [("template", "PC006 generation-prompt")]


def test_a_compare_template_that_fails_everywhere_is_named_and_rates_nothing(tmp_path):
    """Two templates replay the same lines: an error line says whose failure it is. A template
    that renders no request has no hit rate (not 0.0%), and one request per session leaves
    no steady state to rate."""
    good = tmp_path / "good.jinja"
    good.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    broken = tmp_path / "broken.jinja"
    broken.write_text('{% include "header.jinja" %}{% for m in messages %}{{ m.content }}{% endfor %}')
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(
            json.dumps({"request": {"messages": [{"role": "user", "content": f"question {i}?"}], "user": f"u{i}"}}) + "\n"
            for i in range(2)
        )
    )
    result = replay(log, "--template", good, "--compare", broken, "--session-key", "user")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"tmpl-lint: error: {log}:{line}: {broken}: the template fails on this request: "
        "TypeError: no loader for this environment specified"
        for line in (1, 2)
    ]
    lines = result.stdout.splitlines()
    assert "  steady state, each session's first request left out: n/a (no session sent a second request)" in lines
    compare = lines[lines.index(next(line for line in lines if line.startswith("compare: "))) :]
    assert compare[:2] == [
        "compare: 0 requests in 0 sessions, vLLM prefix cache (blocks of 16, unbounded pool), requests as vLLM 0.33.0 handles them",
        "  Prefix cache hit rate: n/a (no request could be rendered)",
    ]
