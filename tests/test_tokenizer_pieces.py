"""Pieces: a text encoded piece by piece, cut where the pre-tokenizer always cuts, gives the
ids of one whole ``encode`` on the real tokenizers, for hostile texts; a cut rule that is
wrong is caught by the same comparison."""

from __future__ import annotations

import json
import random
import re

import pytest
from helpers import SHARED_TOKENIZERS, CountingBackend, needs_shared, shared_tokenizer
from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

from tmpl_lint.tokenizer import PIECE_RULES, PieceRule, Pieces, PrefixEncoder, Tokenizer, piece_rule

pytestmark = needs_shared

# Each model with a Split regex of PIECE_RULES; Mistral 7B's Metaspace is encoded whole.
MODELS = ["qwen3", "qwen2.5", "gpt-oss", "mistral-nemo"]
QWEN_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# What stresses a cut after a newline: whitespace of every kind (and what Python calls
# whitespace but the regexes do not, \x1c), "/" (o200k's punctuation takes "[\r\n/]*"),
# combining marks and Hangul jamo that NFC composes, digits (1 or 3 a pre-token),
# contractions, emoji sequences, added tokens and text that is almost one.
FRAGMENTS = [
    "\n", "\n", "\n\n", "\r\n", "\r", " ", "  ", "\t", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2028", "\u3000",
    "/", "//", "\n/", ".\n/", "?\n\n/", "\u0301", "e\u0301", "A\u030a", "\u0308", "\u0345", "\u1100", "\u1161", "\u11a8",
    "ﬁ", "1", "23", "4567", "'s", "'LL", "don't", "I'M", "🎉", "👨\u200d👩\u200d👧", "日本語", "héllo", "WORLD", "x", "Hello",
    ".", "...", "!\n", ")\n", "\n)", "-", "#", "<", "|>", "<|im_end", "<|im_end|>", "<|im_start|>", "<think>", "</think>",
    "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "[INST]", "[/INST]", "</s>", "<SPECIAL_10>", "\n<|im_start|>",
]  # fmt: skip


# Few characters, densely: every short mix of newlines, whitespace and what follows them.
DENSE = ["\n", "\n", " ", "\t", "\r", "/", "a", ".", "\u0301", "1", "'", "<|im_end|>"]


# Every ASCII character (the words' regex is written for ASCII), and the fragments above that are ASCII.
ASCII = [chr(code) for code in range(128)] + [fragment for fragment in FRAGMENTS if fragment.isascii()] * 2


def hostile_texts(seed: str, count: int = 600) -> list[str]:
    rng = random.Random(seed)
    texts = ["", "\n", "x\n", "\nx", "\n\nx", " \nx", "a\n/b", "a.\n/b", "\n\u0301", "\r\nx"]
    for _ in range(count):
        texts.append("".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(1, 40))))
        texts.append("".join(rng.choice(DENSE) for _ in range(rng.randrange(1, 12))))
        # ASCII alone: encoded pre-token by pre-token
        texts.append("".join(rng.choice(ASCII) for _ in range(rng.randrange(1, 40))))
    return texts


def mismatches(pieces: Pieces, texts: list[str]) -> list[str]:
    """The texts whose piece-by-piece ids, or added tokens' places, are not one whole encode's;
    each text also encoded from a random added token on, and once more with its pieces kept."""
    backend = pieces.tokenizer.backend
    wrong = []
    for text in texts:
        whole = backend.encode(text, add_special_tokens=False)
        added = [(whole.offsets[index][0], index) for index, token in enumerate(whole.ids) if token in pieces.added_ids]
        for _ in range(2):  # the second time, from the kept pieces
            encoded = pieces.encode(text)
            if encoded is None or encoded != (whole.ids, added):
                wrong.append(text)
                break
    return wrong


def backend_with_regex(regex: str):
    """Qwen3's tokenizer with another Split regex: where a pre-tokenizer cuts depends on its
    regex alone, whatever the vocabulary."""
    config = json.loads((SHARED_TOKENIZERS / "qwen3" / "tokenizer.json").read_text())
    config["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = regex
    return FastTokenizer.from_str(json.dumps(config))


@pytest.mark.parametrize("directory", MODELS)
def test_pieces_encode_as_one_whole_encode(directory):
    tokenizer = shared_tokenizer(directory)
    rule = piece_rule(tokenizer.backend)
    assert rule is not None
    assert mismatches(Pieces(tokenizer, rule), hostile_texts(directory)) == []


def test_llama3_regex_pieces_encode_as_one_whole_encode():
    backend = backend_with_regex(LLAMA3_REGEX)
    rule = piece_rule(backend)
    assert rule is PIECE_RULES[LLAMA3_REGEX]
    tokenizer = Tokenizer(SHARED_TOKENIZERS / "qwen3", backend)
    assert mismatches(Pieces(tokenizer, rule), hostile_texts("llama3")) == []


@pytest.mark.parametrize(
    ("directory", "wrong_cut", "text"),
    [
        # after every newline: "\n\n" is one pre-token, and so is " \n"
        ("qwen3", r"(?<=\n)", "a\n\nb"),
        # after a newline before anything but whitespace, "/" too: o200k's ".\n/" is one pre-token
        ("gpt-oss", r"(?<=\n)(?=[^\s])", "x.\n/y"),
        ("mistral-nemo", r"(?<=\n)(?=[^\s])", "x.\n/y"),
        # after a newline whatever follows a space: "\n \n" is one pre-token
        ("qwen2.5", r"(?<=\n)(?=[^\n\r])", "a\n \nb"),
    ],
)
def test_a_wrong_cut_is_caught(directory, wrong_cut, text):
    """The comparison above fails for a rule that cuts where the pre-tokenizer does not."""
    tokenizer = shared_tokenizer(directory)
    rule = piece_rule(tokenizer.backend)
    wrong = PieceRule(re.compile(wrong_cut), rule.words)
    assert mismatches(Pieces(tokenizer, wrong), [text]) == [text]
    assert mismatches(Pieces(tokenizer, wrong), hostile_texts(directory)) != []
    assert mismatches(Pieces(tokenizer, rule), [text]) == []


@pytest.mark.parametrize(
    ("directory", "right", "wrong", "text"),
    [
        # Oniguruma's \s holds \v and \f
        ("qwen3", r"\t\n\x0b\x0c\r ", r"\t\n\r ", "  \x0b"),
        # without the lookahead, a run of spaces before a word keeps its last space
        ("qwen3", r"(?![^\t\n\x0b\x0c\r ])", "", "a   b"),
        # o200k's numbers are three digits (a regex that cuts less is harmless: the library
        # pre-tokenizes each word it is given; one that cuts more is not)
        ("gpt-oss", "[0-9]{1,3}", "[0-9]{1,2}", "12345"),
    ],
)
def test_a_wrong_word_regex_is_caught(directory, right, wrong, text):
    """The comparison above fails for an ASCII regex that pre-tokenizes otherwise."""
    tokenizer = shared_tokenizer(directory)
    rule = piece_rule(tokenizer.backend)
    assert right in rule.words.pattern
    wrong_rule = PieceRule(rule.cuts, re.compile(rule.words.pattern.replace(right, wrong), re.ASCII))
    assert mismatches(Pieces(tokenizer, wrong_rule), [text]) == [text]
    assert mismatches(Pieces(tokenizer, wrong_rule), hostile_texts(directory)) != []
    assert mismatches(Pieces(tokenizer, rule), [text]) == []


def tiny_backend(regex: str):
    """A two-letter vocabulary with a Split regex and Qwen3's shape of pre-tokenizer and added
    token: what ``piece_rule`` reads, without loading a real vocabulary."""
    backend = FastTokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.add_special_tokens([AddedToken("<|im_end|>", normalized=False)])
    return backend


def test_tokenizers_not_shown_safe_are_encoded_whole():
    # Metaspace puts "▁" before the first piece only
    assert piece_rule(shared_tokenizer("mistral-7b-v0.3").backend) is None
    assert PrefixEncoder(shared_tokenizer("mistral-7b-v0.3")).pieces is None
    # a regex not in PIECE_RULES (GPT-2's)
    gpt2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
    assert piece_rule(tiny_backend(gpt2)) is None
    assert piece_rule(tiny_backend(LLAMA3_REGEX)) is not None
    # an added token that takes the whitespace before it reaches across a cut
    stripping = tiny_backend(LLAMA3_REGEX)
    stripping.add_tokens([AddedToken("<mask>", lstrip=True)])
    assert piece_rule(stripping) is None
    truncating = tiny_backend(LLAMA3_REGEX)
    truncating.enable_truncation(16)
    assert piece_rule(truncating) is None
    folding = tiny_backend(LLAMA3_REGEX)
    folding.normalizer = normalizers.NFKC()
    assert piece_rule(folding) is None
    literal = tiny_backend(LLAMA3_REGEX)
    literal.encode_special_tokens = True  # "<|im_end|>" is then text, not the added token
    assert piece_rule(literal) is None


def test_a_reply_is_tokenized_once_for_itself_and_the_next_prompt():
    real = shared_tokenizer("qwen3")
    counting = CountingBackend(real.backend)
    encoder = PrefixEncoder(Tokenizer(real.directory, counting, real.special_tokens))
    reply = "Paris is sunny.\nIt is 21 degrees, and it's windy / dry.\n\nAnything else?"
    question = "And in Rome?"
    first = encoder.encode("<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n")
    generated = encoder.ids(f"<think>\n\n</think>\n\n{reply}<|im_end|>")
    assert generated == real.backend.encode(f"<think>\n\n</think>\n\n{reply}<|im_end|>", add_special_tokens=False).ids
    counting.characters = 0
    text = f"{first.text}{reply}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    second = encoder.encode(text, first)
    assert second.ids == real.encode(text)
    # at most the question: not the reply again, nor "user\n", kept from the first prompt
    assert 0 < counting.characters <= len(question)
