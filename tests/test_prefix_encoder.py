"""PrefixEncoder: tokenizing only what a prompt adds gives the ids of tokenizing it whole,
on the real tokenizers, for prompts rendered by their own templates."""

from __future__ import annotations

import random
from datetime import datetime

import pytest
from helpers import SHARED_TOKENIZERS, CountingBackend, needs_shared, shared_tokenizer

from tmpl_lint.diff import read_template
from tmpl_lint.render import FrozenClock, render
from tmpl_lint.tokenizer import PrefixEncoder, Tokenizer, common_prefix_length

pytestmark = needs_shared

MODELS = ["qwen3", "qwen2.5", "gpt-oss", "mistral-nemo", "mistral-7b-v0.3"]  # each with its own template
# Text that stresses boundaries: merges across spaces and newlines, multi-byte characters,
# special tokens written inside messages, Metaspace's "▁".
PIECES = ["héllo", "  spaced", "\n\n", "日本語", "🎉", "<|im_end|>", "[INST]", "</s>", "\t", "▁x", "'s", "123", "\r\n", " "]


def conversation(rng: random.Random, turns: int):
    """Prompts of one session, each extending the last, with an occasional client edit."""
    messages = [{"role": "system", "content": "You answer briefly. " + rng.choice(PIECES)}]
    for _ in range(turns):
        messages = messages + [{"role": "user", "content": "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 25)))}]
        if len(messages) > 4 and rng.random() < 0.25:
            index = rng.randrange(1, len(messages) - 1)
            messages[index] = {**messages[index], "content": messages[index]["content"] + rng.choice(PIECES)}
        yield messages
        reply = {"role": "assistant", "content": "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 25)))}
        if rng.random() < 0.5:
            reply["reasoning_content"] = "thinking " + rng.choice(PIECES)
        messages = messages + [reply]


@pytest.mark.parametrize("pieces", [True, False], ids=["in pieces", "from anchors only"])
@pytest.mark.parametrize("directory", MODELS)
def test_incremental_ids_equal_full_tokenization(directory, pieces):
    tokenizer = shared_tokenizer(directory)
    template, _ = read_template(SHARED_TOKENIZERS / directory)
    counting = CountingBackend(tokenizer.backend)
    # the file as tokenizers loads it (gpt-oss's whole tokenizations are openai-harmony's)
    encoder = PrefixEncoder(Tokenizer(tokenizer.directory, counting, tokenizer.special_tokens, tokenizer.kind))
    assert (encoder.pieces is not None) == (directory != "mistral-7b-v0.3")  # Metaspace is encoded whole
    if not pieces:
        encoder.pieces = None
    rng = random.Random(directory)
    clock = FrozenClock(datetime(2026, 3, 1, 12))
    previous, rendered = None, 0
    for messages in conversation(rng, 30):
        text = render(template, messages, clock=clock, add_generation_prompt=True, special_tokens=tokenizer.special_tokens)
        encoded = encoder.encode(text, previous)
        assert encoded.ids == tokenizer.encode(text), f"turn {len(messages)}"
        previous, rendered = encoded, rendered + len(text)
    # it tokenized little more than what each prompt added, not every prompt whole
    assert counting.characters < rendered / 2


def test_without_a_tokenizer_ids_are_characters():
    encoder = PrefixEncoder(None)
    first = encoder.encode("héllo wörld")
    second = encoder.encode("héllo wörld, again", first)
    assert second.ids == [ord(char) for char in "héllo wörld, again"]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [("", "", 0), ("abc", "abd", 2), ("abc", "abc", 3), ("abc", "abcdef", 3), ("x" * 5000 + "y", "x" * 5000 + "z", 5000)],
)
def test_common_prefix_length(a, b, expected):
    assert common_prefix_length(a, b) == expected
    assert common_prefix_length(list(a), list(b)) == expected
    assert common_prefix_length(tuple(a), list(b)) == expected  # a tuple's slice never equals a list's
