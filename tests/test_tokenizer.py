"""Loading tokenizers: gpt-oss's tokenizer.json is encoded by openai-harmony's built-in
vocabulary instead of being parsed, and gives the ids the file itself gives, on the real
file of ../shared."""

from __future__ import annotations

import hashlib
import json
import os
import random
from datetime import datetime

import pytest
from helpers import SHARED_TEMPLATES, SHARED_TOKENIZERS, needs_shared

from tmpl_lint.render import FrozenClock, RenderError, render
from tmpl_lint.scenarios import scenarios
from tmpl_lint.tokenizer import HarmonyVocabularyTokenizer, Tokenizer, load_tokenizer

pytestmark = needs_shared
GPT_OSS = SHARED_TOKENIZERS / "gpt-oss"
# Text that stresses the pre-tokenizer and the added tokens: contractions in either case, digits
# in runs, every kind of whitespace, combining marks, emoji sequences, CJK, the file's added
# tokens, openai-harmony's special tokens the file does not have, half a marker.
PIECES = [
    "Hello", " world", "'s", "'LL", "'Re", "123456", "3.14", "\n", "\n\n", "\r\n", "\t", "  ", "\u00a0", "\u3000",
    "\u2028", "\u0085", "e\u0301", "🎉", "👍🏽", "👨\u200d👩\u200d👧", "日本語", "Привет", "ﬁ", "ǅ", "x²", "_-_", "{\"a\": [1, 2]}",
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>", "<|endofprompt|>",
    "<|startoftext|>", "<|endoftext|>", "<|reserved_200017|>", "<|reserved_200802|>", "<|start", "|>", "<|", "<<|end|>>",
]  # fmt: skip


@pytest.fixture(scope="module")
def file_ids():
    from tokenizers import Tokenizer as FastTokenizer

    parsed = FastTokenizer.from_file(str(GPT_OSS / "tokenizer.json"))
    return lambda text: parsed.encode(text, add_special_tokens=False).ids


def test_gpt_oss_tokenizer_file_is_encoded_by_openai_harmony_without_parsing_it():
    load_tokenizer.cache_clear()
    tokenizer = load_tokenizer(GPT_OSS)
    assert isinstance(tokenizer, HarmonyVocabularyTokenizer)
    assert tokenizer._backend is None  # not parsed
    assert tokenizer.encode("<|start|>user<|message|>Hi<|end|>") == [200006, 1428, 200008, 12194, 200007]
    assert tokenizer.special_tokens == {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}
    # what needs the file itself (decoding, replay's incremental tokenization) still has it
    assert tokenizer.backend.decode([200006, 1428, 200008], skip_special_tokens=False) == "<|start|>user<|message|>"
    assert tokenizer._backend is not None


def test_other_tokenizer_files_are_parsed():
    tokenizer = load_tokenizer(SHARED_TOKENIZERS / "qwen3")
    assert type(tokenizer) is Tokenizer and tokenizer.backend is not None


def test_a_changed_gpt_oss_file_is_parsed_not_taken_for_harmony(tmp_path):
    data = bytearray((GPT_OSS / "tokenizer.json").read_bytes())
    at = data.index(b'"<|endofprompt|>"')
    data[at + 1 : at + 16] = b"<|endofpromp!|>"  # same size, another added token
    (tmp_path / "tokenizer.json").write_bytes(bytes(data))
    tokenizer = load_tokenizer(tmp_path)
    assert type(tokenizer) is Tokenizer
    assert tokenizer.encode("<|endofpromp!|>") == [200018]


def test_random_text_encodes_as_the_file_does(file_ids):
    tokenizer = load_tokenizer(GPT_OSS)
    rng = random.Random(19)
    for _ in range(3000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 30)))
        assert tokenizer.encode(text) == file_ids(text), repr(text)


def test_every_character_class_encodes_as_the_file_does(file_ids):
    tokenizer = load_tokenizer(GPT_OSS)
    # every code point of the Basic Multilingual Plane and a stretch of emoji, in runs mixed with letters and spaces
    points = [chr(point) for point in range(0x20, 0x10000) if not 0xD800 <= point < 0xE000] + [
        chr(point) for point in range(0x1F300, 0x1FAFF)
    ]
    for start in range(0, len(points), 64):
        run = points[start : start + 64]
        for text in ("".join(run), " ".join(run), "a" + "b ".join(run) + "'s"):
            assert tokenizer.encode(text) == file_ids(text), repr(text)


def test_every_shared_template_render_encodes_as_the_file_does(file_ids):
    """The texts a proof tokenizes: each shared template rendered for the last call of each of
    the prover's scenarios (the earlier calls' renders are mostly its prefixes), with
    gpt-oss's special tokens."""
    tokenizer = load_tokenizer(GPT_OSS)
    clock = FrozenClock(datetime(2026, 3, 1, 12))
    compared = 0
    for path in sorted(SHARED_TEMPLATES.glob("*.jinja")):
        template = path.read_text(encoding="utf-8")
        for scenario in scenarios({}):
            call = scenario.calls[-1]
            clock.set(call.clock)
            try:
                text = render(template, call.messages, clock=clock, tools=scenario.tools, special_tokens=tokenizer.special_tokens)
            except RenderError:
                continue
            assert tokenizer.encode(text) == file_ids(text), f"{path.name}, {scenario.name}"
            compared += 1
        assert tokenizer.encode(template) == file_ids(template), path.name
    assert compared > 1000, compared


def cached_repo(root, name: str, data: bytes, config: dict):
    """A model as the Hugging Face cache holds it: snapshot files are links to blobs named by
    the sha256 of their content."""
    repo = root / f"models--org--{name}"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for filename, content in (("tokenizer.json", data), ("tokenizer_config.json", json.dumps(config).encode())):
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        (snapshot / filename).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def test_repos_that_share_a_tokenizer_file_share_its_loaded_tokenizer(tmp_path):
    data = (SHARED_TOKENIZERS / "qwen2.5" / "tokenizer.json").read_bytes()
    first = load_tokenizer(cached_repo(tmp_path, "first", data, {"eos_token": "<|im_end|>"}))
    second = load_tokenizer(cached_repo(tmp_path, "second", data, {"eos_token": "<|endoftext|>"}))
    assert first.backend is second.backend  # loaded once
    assert (first.special_tokens, second.special_tokens) == ({"eos_token": "<|im_end|>"}, {"eos_token": "<|endoftext|>"})
    changed = data.replace(b'"<|im_end|>"', b'"<|im_END|>"', 1)
    third = load_tokenizer(cached_repo(tmp_path, "third", changed, {}))
    assert third.backend is not first.backend
    assert first.encode("<|im_end|>") == [151645] and third.encode("<|im_end|>") != [151645]


def test_a_tokenizer_beside_the_template_that_cannot_be_used_is_named_in_the_proofs(tmp_path):
    # Beside the template a tokenizer is optional (the proofs are measured in characters
    # without it), but a user who put one there must hear why their figures are not in tokens.
    import json as json_module

    from click.testing import CliRunner
    from helpers import CORPUS

    from tmpl_lint.cli import main

    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_text((CORPUS / "PC001_live_clock.jinja").read_text())
    (model / "tokenizer.json").write_text("garbage\n")
    result = CliRunner().invoke(main, [str(model), "--format", "json"])
    (finding,) = json_module.loads(result.stdout)
    assert (result.exit_code, finding["code"], finding["proof"]["unit"]) == (1, "PC001", "char")
    expected = (
        f"measured in characters: the tokenizer beside the template could not be used: {model / 'tokenizer.json'}: cannot load: "
    )
    assert finding["proof"]["note"].startswith(expected)
