"""Text never changes how a request is read: brackets, braces, ``<think>`` and quotes in a
message are plain text (issue 32, item 8). A user's unclosed ``[`` once moved where replay
took the model's reply to start, and booked tokens vLLM hits as generation-prompt losses."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import SHARED_TOKENIZERS, needs_shared, transformers_tokenizer

from tmpl_lint.cli import main
from tmpl_lint.engines import prepare

BLOCK = 16

# What users write: code, regexes, citations, JSON, comparisons, a literal tag, quotes.
TURNS = [
    ("What does arr[i mean, and is x < y here?", "It indexes arr at i; and x < y compares them."),
    ("And the regex [a-z? See [1] and [2", "A character class [a-z] matches one lowercase letter."),
    ('Then {"a": [1, 2} and <think> in my text, and \'quotes" too?', "Unbalanced JSON, a literal tag, and quotes."),
    ("Last: ]][[ {{ }} </think> [/INST] <|im_end|", "All of that is text to me."),
]


def _log(tmp_path):
    messages, lines = [], []
    for user, reply in TURNS:
        messages.append({"role": "user", "content": user})
        lines.append(
            {
                "request": {"messages": list(messages), "user": "s1"},
                "response": {"choices": [{"message": {"role": "assistant", "content": reply}}]},
            }
        )
        messages.append({"role": "assistant", "content": reply})
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return log, lines


def _vllm_hits_by_hand(name: str, lines: list[dict]) -> list[int]:
    """Each request's hit on vLLM's block pool, unbounded: the longest run of whole blocks
    it shares with what an earlier request left computed (its prompt and its reply up to
    and including <|im_end|>, but the last sampled token), capped so one prompt token is
    computed. Prompts rendered by transformers, as vLLM renders these plain messages."""
    tokenizer = transformers_tokenizer(name)
    computed, hits = [], []
    for line in lines:
        messages = line["request"]["messages"]
        reply = line["response"]["choices"][0]["message"]
        prompt_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        with_reply = tokenizer.apply_chat_template([*messages, reply], tokenize=False)
        assert with_reply.startswith(prompt_text)
        generated_text = with_reply[len(prompt_text) : with_reply.index("<|im_end|>", len(prompt_text)) + len("<|im_end|>")]
        prompt = tokenizer.encode(prompt_text, add_special_tokens=False)
        generated = tokenizer.encode(generated_text, add_special_tokens=False)
        best = 0
        for earlier in computed:
            shared = 0
            while shared < min(len(earlier), len(prompt)) and earlier[shared] == prompt[shared]:
                shared += 1
            best = max(best, shared)
        hits.append(min(best // BLOCK * BLOCK, (len(prompt) - 1) // BLOCK * BLOCK))
        computed.append(prompt + generated[:-1])
    return hits


@needs_shared
def test_brackets_braces_tags_and_quotes_in_user_text_replay_as_vllm_hits_them(tmp_path):
    from tmpl_lint.commands import ReplayOptions, run_replay

    log, lines = _log(tmp_path)
    options = ReplayOptions(log, None, tokenizer=SHARED_TOKENIZERS / "qwen2.5", session_key="user", jobs=1)
    result = run_replay(options)
    assert result.problems == []
    summary = result.summaries[0][1]
    assert [hit for _, _, hit in sorted(summary.per_request)] == _vllm_hits_by_hand("qwen2.5", lines)
    assert summary.departures == {}  # nothing booked to the template


@needs_shared
def test_render_prints_such_text_as_transformers_does(tmp_path):
    messages = [{"role": "user", "content": user} for user, _ in TURNS[:1]]
    for user, reply in TURNS:
        messages = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": user}]
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"messages": messages}))
    result = CliRunner().invoke(
        main, ["render", str(request), "--tokenizer", str(SHARED_TOKENIZERS / "qwen2.5"), "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    rendered = json.loads(result.stdout)
    tokenizer = transformers_tokenizer("qwen2.5")
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered["text"] == expected
    assert rendered["token_ids"] == tokenizer.encode(expected, add_special_tokens=False)


@pytest.mark.parametrize("text", ["[1, 2, 3]", '{"city": "Paris"}', "['a', 'b']", "<think>x</think>", '"quoted"', "None"])
def test_the_vllm_profile_never_parses_message_text(text):
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    sent = [{"role": role, "content": text} for role in ("system", "user", "assistant", "tool")]
    messages, _ = prepare("vllm", template, sent)
    assert [message["content"] for message in messages] == [text] * 4


@needs_shared
def test_diff_of_turns_with_such_text_is_a_clean_extension(tmp_path):
    first = {"messages": [{"role": "user", "content": TURNS[1][0]}]}
    second = {
        "messages": [*first["messages"], {"role": "assistant", "content": TURNS[1][1]}, {"role": "user", "content": TURNS[2][0]}]
    }
    paths = []
    for name, body in (("turn1.json", first), ("turn2.json", second)):
        (tmp_path / name).write_text(json.dumps(body))
        paths.append(str(tmp_path / name))
    result = CliRunner().invoke(main, ["diff", *paths, "--tokenizer", str(SHARED_TOKENIZERS / "qwen2.5"), "--format", "json"])
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout)["first_divergence_token"] is None
