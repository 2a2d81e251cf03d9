"""A tokenizer that cannot measure text: a folder holding tokenizer_config.json without the
files its vocabulary is in (a partial download, a clone without LFS) loads in transformers as
a tokenizer of the config's added tokens alone, which encodes text to nothing. Measured in it,
every divergence vanished and a failing finding passed as "not reproduced". Named by
the user it is one error line and exit 2; found beside a template the proofs are measured in
characters and say why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import CORPUS

from tmpl_lint.cli import main
from tmpl_lint.tokenizer import PROBE_TEXT, TokenizerError, load_tokenizer

# Qwen2.5's config as a repo without its tokenizer.json, vocab.json and merges.txt has it
# (two of its added tokens kept).
QWEN_CONFIG = {
    "tokenizer_class": "Qwen2Tokenizer",
    "added_tokens_decoder": {
        "151643": {"content": "<|endoftext|>", "special": True},
        "151644": {"content": "<|im_start|>", "special": True},
    },
    "eos_token": "<|endoftext|>",
}
TOOL_ARGS = CORPUS / "PC004_tool_args_reserialized.jinja"


def run(*args):
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    return result.exit_code, result.stdout, result.stderr


def config_only(folder: Path) -> Path:
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps(QWEN_CONFIG))
    return folder


def without_vocabulary(folder: Path, unknown: bool = False) -> Path:
    """A tokenizer.json whose model has no vocabulary but its added tokens (as transformers
    saves the tokenizer it builds from a config alone), or with ``unknown`` only an unknown
    token, which every word becomes."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    if unknown:
        tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    else:
        tokenizer = Tokenizer(models.BPE({}, []))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    folder.mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def no_vocabulary(folder: Path, encoded: str, size: int) -> str:
    return (
        f"{folder.resolve()}: the tokenizer has no vocabulary to measure text in: it encodes {PROBE_TEXT!r} to {encoded} "
        f"({size} tokens in all; is its tokenizer.json, vocab.json or tokenizer.model missing?)"
    )


def test_a_config_without_its_vocabulary_given_to_check_is_one_error_line(tmp_path):
    pytest.importorskip("transformers")
    folder = config_only(tmp_path / "tok")
    code, out, err = run(TOOL_ARGS, "--tokenizer", folder)
    assert (code, out) == (2, "")
    assert err == f"tmpl-lint: error: {no_vocabulary(folder, 'no tokens', 2)}\n"


def test_a_configured_tokenizer_without_its_vocabulary_is_one_error_line(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    config_only(tmp_path / "models")
    (tmp_path / "pyproject.toml").write_text('[tool.tmpl-lint]\ntokenizer = "models"\n')
    monkeypatch.chdir(tmp_path)
    code, out, err = run(TOOL_ARGS)
    assert (code, out) == (2, "")
    assert err == f"tmpl-lint: error: {no_vocabulary(tmp_path / 'models', 'no tokens', 2)}\n"


def test_diff_and_replay_with_a_tokenizer_without_vocabulary_are_one_error_line(tmp_path):
    pytest.importorskip("transformers")
    folder = config_only(tmp_path / "tok")
    user = {"role": "user", "content": "What is the weather in Paris?"}
    first, second, log = tmp_path / "1.json", tmp_path / "2.json", tmp_path / "log.jsonl"
    first.write_text(json.dumps({"messages": [user]}))
    second.write_text(json.dumps({"messages": [user, {"role": "assistant", "content": "Sunny."}, user]}))
    log.write_text(first.read_text() + "\n" + second.read_text() + "\n")
    expected = (2, "", f"tmpl-lint: error: {no_vocabulary(folder, 'no tokens', 2)}\n")
    template = CORPUS / "clean_chatml.jinja"
    assert run("diff", first, second, "--template", template, "--tokenizer", folder) == expected
    assert run("replay", log, "--template", template, "--tokenizer", folder) == expected


@pytest.mark.parametrize(("unknown", "encoded", "size"), [(False, "no tokens", 2), (True, "its unknown token only", 1)])
def test_a_tokenizer_without_vocabulary_beside_the_template_leaves_the_proofs_in_characters(tmp_path, unknown, encoded, size):
    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_text(TOOL_ARGS.read_text())
    without_vocabulary(model, unknown)
    code, out, _ = run(model, "--format", "json")
    (finding,) = json.loads(out)
    assert (code, finding["code"], finding["fails"], finding["proof"]["status"]) == (1, "PC004", True, "proven")
    assert finding["proof"]["unit"] == "char"
    assert finding["proof"]["note"] == (
        f"measured in characters: the tokenizer beside the template could not be used: {no_vocabulary(model, encoded, size)}"
    )


def test_audit_tokens_with_a_tokenizer_without_vocabulary_says_the_figures_are_characters(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_text(TOOL_ARGS.read_text())
    without_vocabulary(model)
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", "audit", str(model), "--tokens", "--no-cache", "--format", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    reason = f"--tokens: {no_vocabulary(model, 'no tokens', 2)}; figures are in characters"
    assert result.stderr == f"tmpl-lint: warning: {model}: {reason}\n"
    (row,) = json.loads(result.stdout)["rows"]
    assert {finding["proof"]["unit"] for finding in row["findings"]} == {"char"}


def test_a_small_vocabulary_that_encodes_text_is_a_tokenizer(tmp_path):
    # What is refused is a tokenizer that turns ordinary text into nothing, not a small one:
    # a byte-level BPE with its 256 symbols and no merges measures every character.
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE({symbol: index for index, symbol in enumerate(sorted(alphabet))}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert len(load_tokenizer(tmp_path).encode(PROBE_TEXT)) == len(PROBE_TEXT.encode())


def test_the_loading_function_refuses_it_whoever_calls(tmp_path):
    folder = without_vocabulary(tmp_path / "tok")
    with pytest.raises(TokenizerError) as raised:
        load_tokenizer(folder)
    assert str(raised.value) == no_vocabulary(folder, "no tokens", 2)
