"""GGUF models: templates read from the metadata, proofs in the file's own token ids, fixes
written beside the model or into a new GGUF, never in place."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import (
    CORPUS,
    SHARED_TEMPLATES,
    SHARED_TOKENIZERS,
    at,
    built_once,
    lock_held,
    log_verifiers,
    needs_permissions,
    needs_shared,
    run_unprivileged,
    signal_after,
    without_edits,
)

from tmpl_lint.cli import main
from tmpl_lint.inputs import NothingToLint, SourceError
from tmpl_lint.sources import collect

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

CLOCK = (CORPUS / "PC001_live_clock.jinja").read_text()
TOOL_ARGS = (CORPUS / "PC004_tool_args_reserialized.jinja").read_text()
CLEAN = (CORPUS / "clean_chatml.jinja").read_text()
FROZEN = "2026-01-15"
# --frozen-date fixes PC001 with a date_string a request may pass. llama-server defines
# date_string itself, from its clock, so that fix does not hold where a GGUF is rendered as
# llama.cpp renders it (the default), and is not made: these tests of how fixes are written
# fix as transformers renders.
FROZEN_FIX = ("--frozen-date", FROZEN, "--engine", "hf")
QWEN = SHARED_TOKENIZERS / "qwen2.5"


def write_gguf(
    path: Path, templates=None, tokenizer: Path | None = None, alignment: int | None = None, extra=None, tokens=None
) -> Path:
    """A small GGUF as llama.cpp's converter lays one out: metadata, then a few tensors
    (f32, f16 and a Q8_0 block) with distinct bytes."""
    writer = gguf.GGUFWriter(path, "qwen2")
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_name("test model")
    writer.add_context_length(4096)
    if tokenizer is not None:
        add_tokenizer(writer, tokenizer)
    if tokens is not None:  # (model name, tokens, bos id, eos id): a vocabulary without merges
        kind, vocabulary, bos, eos = tokens
        writer.add_tokenizer_model(kind)
        writer.add_token_list(vocabulary)
        writer.add_bos_token_id(bos)
        writer.add_eos_token_id(eos)
    if templates is not None:
        writer.add_chat_template(templates)
    for key, value in (extra or {}).items():
        writer.add_key_value(key, value, gguf.GGUFValueType.UINT32)
    writer.add_tensor("token_embd.weight", np.arange(96, dtype=np.float32).reshape(3, 32))
    writer.add_tensor("output_norm.weight", np.linspace(-1, 1, 40).astype(np.float16))
    q8 = np.frombuffer(bytes(range(34)) * 2, dtype=np.uint8).reshape(1, 68)  # two Q8_0 blocks of 32 values
    writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_tokenizer(writer, directory: Path) -> None:
    """tokenizer.ggml.* as llama.cpp's convert_hf_to_gguf writes them for a byte-level BPE."""
    document = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab = document["model"]["vocab"]
    added = {token["id"]: token for token in document["added_tokens"]}
    size = max(max(vocab.values()), max(added)) + 1
    tokens = [""] * size
    types = [1] * size  # NORMAL
    for token, index in vocab.items():
        tokens[index] = token
    for index, token in added.items():
        tokens[index] = token["content"]
        types[index] = 3 if token["special"] else 4  # CONTROL, USER_DEFINED
    ids = {token["content"]: index for index, token in added.items()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in document["model"]["merges"]])
    writer.add_bos_token_id(ids["<|endoftext|>"])
    writer.add_eos_token_id(ids[config["eos_token"]])
    writer.add_add_bos_token(False)


@pytest.fixture(scope="session")
def small_qwen(tmp_path_factory) -> Path:
    """Qwen2.5's tokenizer cut to its first 2000 merges (and the tokens they make), its added
    tokens renumbered after them: a byte-level BPE that llama.cpp's converter writes and
    transformers builds as it does the real one, in milliseconds instead of seconds. For tests
    of the GGUF tokenizer's cache, where what is measured is builds, not Qwen's vocabulary."""
    folder = tmp_path_factory.mktemp("small-qwen")
    document = json.loads((QWEN / "tokenizer.json").read_text(encoding="utf-8"))
    merges = document["model"]["merges"][:2000]
    kept = 256 + len(merges)  # Qwen's ids: the 256 byte symbols, then one token per merge in order
    vocab = {token: index for token, index in document["model"]["vocab"].items() if index < kept}
    assert all(part in vocab for merge in merges for part in merge.split(" "))
    document["model"].update(vocab=vocab, merges=merges)
    for index, token in enumerate(document["added_tokens"]):
        token["id"] = kept + index
    (folder / "tokenizer.json").write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    shutil.copyfile(QWEN / "tokenizer_config.json", folder / "tokenizer_config.json")
    return folder


@pytest.fixture(scope="session")
def qwen_gguf(shared_folder) -> Path:
    """A GGUF of Qwen2.5-7B-Instruct's template with Qwen2.5's whole tokenizer, written once
    per run (a 150k-token vocabulary and its merges take the writer a second): tests copy it
    under the name they need. Its tokenizer is built once too, in the run's tmpl-lint cache."""

    def write(folder: Path) -> None:
        write_gguf(folder / "qwen.gguf", (SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja").read_text(), tokenizer=QWEN)

    return built_once(shared_folder, "qwen-gguf", write) / "qwen.gguf"


def run(*args):
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert "Traceback" not in result.stderr, result.stderr
    return result.exit_code, result.stdout, result.stderr


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- reading -----------------------------------------------------------------------------------


def test_every_template_in_the_metadata_is_found_by_name(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", [{"name": "default", "template": CLOCK}, {"name": "tool_use", "template": TOOL_ARGS}])
    sources, errors = collect([model])
    assert errors == []
    assert [(s.path, s.name, s.container, s.text) for s in sources] == [
        (model, "default", "gguf", CLOCK),
        (model, "tool_use", "gguf", TOOL_ARGS),
    ]
    assert [s.label for s in sources] == [f"{model}:default", f"{model}:tool_use"]


def test_findings_and_lines_are_the_templates_own(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", [{"name": "default", "template": CLOCK}, {"name": "tool_use", "template": TOOL_ARGS}])
    code, out, _ = run(model, "--no-prove", "--format", "json")
    assert code == 1
    # The template has no lines in the binary file: JSON gives its own, and no file position.
    assert {(f["line"], f["column"]) for f in json.loads(out)} == {(None, None)}
    found = [(f["template"], f["code"], f["template_line"], f["template_column"]) for f in json.loads(out)]
    clock = at("PC001", CLOCK, 'strftime_now("%Y-%m-%d")')
    tool_args = at("PC004", TOOL_ARGS, "tojson")
    assert (clock, tool_args) == (("PC001", 3, 28), ("PC004", 5, 89))
    assert found == [("default", *clock), ("tool_use", *tool_args)]
    code, out, _ = run(model, "--no-prove", "-q")
    assert out.splitlines()[0].startswith(f"{model}:default:3:28: PC001 [live-clock]")
    assert out.splitlines()[1].startswith(f"{model}:tool_use:5:89: PC004 [tool-args-reserialized]")


def test_a_single_string_template_is_the_default(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", CLEAN)
    sources, errors = collect([model])
    assert (errors, [(s.name, s.text) for s in sources]) == ([], [("default", CLEAN)])
    assert run(model, "--no-prove")[0] == 0


def test_tensor_data_is_never_read(tmp_path):
    """The file is cut inside its tensor data: gguf's own reader refuses it, the template lints."""
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    with open(model, "r+b") as stream:
        stream.truncate(model.stat().st_size - 100)
    with pytest.raises(ValueError):
        gguf.GGUFReader(model)
    code, out, _ = run(model, "--no-prove", "-q")
    assert code == 1 and out.startswith(f"{model}:default:3:28: PC001 [live-clock]")


def test_a_finding_is_placed_without_reading_the_model_as_a_file(tmp_path, monkeypatch):
    """Only the metadata map reads a model: reading it whole (to place a finding, as a JSON
    file's are) would read tens of GB. The lint's children are forked, so they see the patch."""
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    real_read_bytes = Path.read_bytes

    def read_bytes(self):
        if self.suffix == ".gguf":
            raise RuntimeError(f"{self} read whole")
        return real_read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    code, out, _ = run(model, "--no-prove", "-q")
    assert (code, out.splitlines()[0].split(" (")[0]) == (1, f"{model}:default:3:28: PC001 [live-clock]")


def test_directory_walk_reads_first_splits_and_passes_over_projectors(tmp_path):
    first = write_gguf(tmp_path / "Model-Q4_K_M-00001-of-00002.gguf", CLOCK)
    write_gguf(tmp_path / "Model-Q4_K_M-00002-of-00002.gguf")  # later splits carry no template
    write_gguf(tmp_path / "mmproj-Model-f16.gguf")  # a vision projector: no template either
    sources, errors = collect([tmp_path])
    assert errors == []
    assert [(s.path, s.name) for s in sources] == [(first, "default")]


def test_a_later_split_named_reads_the_first(tmp_path):
    first = write_gguf(tmp_path / "Model-00001-of-00003.gguf", CLOCK)
    second = write_gguf(tmp_path / "Model-00002-of-00003.gguf")
    sources, errors = collect([second])
    assert errors == [] and [(s.path, s.name) for s in sources] == [(first, "default")]
    first.unlink()
    sources, errors = collect([second])
    assert sources == []
    assert [str(e) for e in errors] == [
        f"{second}: split 2 of 3: the metadata is in the first split, Model-00001-of-00003.gguf, which is not there"
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda p: p.write_bytes(b"not a model at all, but long enough to hold a header"),
            "not a GGUF file (it does not start with the GGUF magic)",
        ),
        (lambda p: p.write_bytes(b""), "empty file"),
        (
            lambda p: p.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16)),
            "GGUF version 1 is not supported (versions 2 and 3 are)",
        ),
        (lambda p: write_gguf(p, extra={"tokenizer.chat_template": 7}), "tokenizer.chat_template is a uint32, expected a string"),
        (
            lambda p: p.write_bytes(write_gguf(p.with_suffix(".tmp"), CLOCK).read_bytes()[:300]),
            "tokenizer.chat_template runs past the end of the file: truncated or corrupt",
        ),
    ],
)
def test_a_bad_gguf_is_one_error_line_and_the_batch_continues(tmp_path, make, message):
    bad = tmp_path / "bad.gguf"
    make(bad)
    good = write_gguf(tmp_path / "good.gguf", CLOCK)
    sources, errors = collect([bad])
    assert sources == []
    assert [(type(e), str(e)) for e in errors] == [(SourceError, f"{bad}: {message}")]
    code, out, err = run(bad, good, "--no-prove", "-q")
    assert code == 2
    assert err == f"tmpl-lint: error: {bad}: {message}\n"
    assert out.startswith(f"{good}:default:3:28: PC001")


NO_TEMPLATE = (
    "no chat template in its metadata (tokenizer.chat_template): nothing to lint"
    " (a base model, an embedding model or a vision projector holds none)"
)


def test_a_named_gguf_without_a_template_is_a_warning_as_a_base_models_tokenizer_config(tmp_path):
    embedding = write_gguf(tmp_path / "embedding.gguf")
    good = write_gguf(tmp_path / "good.gguf", CLOCK)
    sources, errors = collect([embedding])
    assert (sources, [(type(e), str(e)) for e in errors]) == ([], [(NothingToLint, f"{embedding}: {NO_TEMPLATE}")])
    code, out, err = run(embedding, good, "--no-prove", "-q")
    assert (code, err) == (1, f"tmpl-lint: warning: {embedding}: {NO_TEMPLATE}\n")
    assert out.startswith(f"{good}:default:3:28: PC001")
    code, out, err = run(embedding, "--no-prove")
    assert (code, out, err) == (0, "", f"tmpl-lint: warning: {embedding}: {NO_TEMPLATE}\n")


def test_without_the_gguf_package_reading_works_and_the_copy_names_the_extra(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    script = (
        "import sys; sys.modules['gguf'] = None; from tmpl_lint.cli import run; sys.argv = ['tmpl-lint', *sys.argv[1:]]; run()"
    )

    def without_gguf(*args):
        return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=120)

    result = without_gguf(model, "--no-prove", "-q")
    assert (result.returncode, result.stderr) == (1, "")
    assert result.stdout.startswith(f"{model}:default:3:28: PC001")
    result = without_gguf(model, "--no-prove", "-q", "--fix", "--unsafe-fixes", *FROZEN_FIX, "--gguf-copy", tmp_path / "c.gguf")
    assert result.returncode == 2
    assert (
        result.stderr
        == f"tmpl-lint: error: {tmp_path / 'c.gguf'}: writing a GGUF needs the gguf package: pip install 'tmpl-lint[gguf]'\n"
    )
    assert not (tmp_path / "c.gguf").exists()


def test_the_format_values_are_ggufs():
    from tmpl_lint.gguf import format as reader

    assert {member.name: member.value for member in reader.ValueType} == {
        member.name: member.value for member in gguf.GGUFValueType
    }
    assert reader.GGUF_MAGIC == gguf.GGUF_MAGIC
    assert reader.DEFAULT_ALIGNMENT == gguf.GGUF_DEFAULT_ALIGNMENT
    assert (reader.ALIGNMENT_KEY, reader.ARCHITECTURE_KEY) == (gguf.Keys.General.ALIGNMENT, gguf.Keys.General.ARCHITECTURE)
    assert (reader.CHAT_TEMPLATE_KEY, reader.TOKENS_KEY) == (gguf.Keys.Tokenizer.CHAT_TEMPLATE, gguf.Keys.Tokenizer.LIST)
    assert reader.SPECIAL_TOKEN_IDS == {
        "bos_token": gguf.Keys.Tokenizer.BOS_ID,
        "eos_token": gguf.Keys.Tokenizer.EOS_ID,
        "unk_token": gguf.Keys.Tokenizer.UNK_ID,
        "pad_token": gguf.Keys.Tokenizer.PAD_ID,
    }


def crafted_vocabulary() -> list[str]:
    """Tokens the run pattern must step over exactly: every length around its limits (0, 127,
    128, 255, 256 and longer bytes, multi-byte characters), and tokens whose text is itself a
    GGUF key and string value (a fake chat template a byte search would find first)."""
    fake = "tokenizer.chat_template"
    forged = (len(fake).to_bytes(8, "little") + fake.encode() + (8).to_bytes(4, "little") + (9).to_bytes(8, "little")).decode(
        "latin-1"
    ) + "{{ bad }}"
    lengths = [0, 1, 2, 7, 8, 126, 127, 128, 129, 255, 256, 300]
    tokens = [("é" * (n // 2) + "x" * (n % 2)) if n % 3 == 0 else "t" * n for n in lengths]
    tokens += [forged, "\x00" * 8, "\x05" + "\x00" * 7 + "abcde"]
    tokens += [f"tok{index}" for index in range(3100)]  # past the run pattern's threshold, runs of 256 and a rest
    tokens.insert(1500, "L" * 200)  # one long token inside a run: that run is walked one by one
    return tokens


@pytest.mark.parametrize("count", [2900 + 15, 1023, 256 * 12])
def test_the_vocabulary_walk_matches_ggufs_reader_on_crafted_tokens(tmp_path, count):
    from tmpl_lint.gguf import format as reader
    from tmpl_lint.gguf.tokenizer import metadata_special_tokens

    tokens = crafted_vocabulary()[: count + 1]
    model = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(model, "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_merges(list(reversed(tokens)))
    bos = min(1500, count - 3)  # the long token, inside a run, where there is one
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(len(tokens) - 1)  # the last
    writer.add_unk_token_id(12)  # the forged one
    writer.add_pad_token_id(len(tokens))  # past the end: no pad_token
    writer.add_chat_template(CLOCK)
    writer.add_uint32("after.the.vocabulary", 7)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    metadata = reader.read_metadata(model, {reader.TOKENS_KEY})
    truth = gguf.GGUFReader(model)
    assert metadata.templates() == [("default", CLOCK)]
    assert metadata.value(reader.TOKENS_KEY) == tokens
    assert metadata.value("after.the.vocabulary") == 7
    # read at their ids, the vocabulary stepped over
    assert metadata_special_tokens(model) == {
        "bos_token": tokens[bos],
        "eos_token": tokens[-1],
        "unk_token": tokens[12],
    }
    assert set(metadata.fields) == {key for key in truth.fields if not key.startswith("GGUF.")}
    assert metadata.fields["tokenizer.ggml.merges"].count == len(tokens)
    merges = truth.fields["tokenizer.ggml.merges"]
    assert metadata.fields["tokenizer.ggml.merges"].span[1] == merges.offset + sum(part.nbytes for part in merges.parts)


def test_the_run_pattern_takes_exactly_a_run_of_short_strings():
    from tmpl_lint.gguf.format import RUN, _short_strings

    def packed(strings):
        return b"".join(len(text).to_bytes(8, "little") + text for text in strings)

    short = [bytes([65 + n % 26]) * (n % 128) for n in range(RUN)]
    assert _short_strings().match(packed(short) + packed([b"next"])).end() == len(packed(short))
    for longer in (b"y" * 300, b"z" * 256, b"w" * 128):  # 300 and 256 share their low byte with 44 and 0
        assert _short_strings().match(packed([*short[:-1], longer])) is None
    assert _short_strings().match(packed(short[:-1])) is None  # one string short of a run


# -- proofs --------------------------------------------------------------------------------------


def test_without_a_tokenizer_the_proof_is_in_characters_and_says_why(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    code, out, _ = run(model, "--format", "json")
    (finding,) = json.loads(out)
    assert finding["proof"]["status"] == "proven"
    assert finding["proof"]["unit"] == "char"
    assert finding["proof"]["note"] == "measured in characters: m.gguf has no tokenizer in its metadata"


@needs_shared
def test_the_files_own_tokenizer_gives_the_models_token_ids(tmp_path, qwen_gguf):
    from tokenizers import Tokenizer

    from tmpl_lint.gguf.tokenizer import own_tokenizer
    from tmpl_lint.render import FrozenClock, render

    model = Path(shutil.copyfile(qwen_gguf, tmp_path / "qwen.gguf"))
    own = own_tokenizer(model)
    assert own.special_tokens == {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    assert own.description == "token ids of the tokenizer in qwen.gguf's metadata (gpt2, 151665 tokens)"
    reference = Tokenizer.from_file(str(QWEN / "tokenizer.json"))
    template = (SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja").read_text()
    conversation = [
        {"role": "system", "content": "You are Qwen.  Answer\n\n\tbriefly."},
        {"role": "user", "content": "Wetter in München? 東京は？ 12345 don't"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"c": "M"}}}],
        },
        {"role": "tool", "content": '{"t": 21.5}'},
    ]
    text = render(
        template,
        conversation,
        clock=FrozenClock(datetime(2026, 1, 15)),
        add_generation_prompt=True,
        special_tokens=own.special_tokens,
    )
    ids = own.tokenizer.encode(text)
    assert ids == reference.encode(text, add_special_tokens=False).ids
    assert ids[0] == reference.token_to_id("<|im_start|>")


@needs_shared
def test_a_built_tokenizer_is_cached_on_disk_and_a_bad_entry_is_built_again(tmp_path, monkeypatch, small_qwen):
    from tokenizers import Tokenizer

    from tmpl_lint.gguf import tokenizer as module

    cache = tmp_path / "cache"
    monkeypatch.setenv("TMPL_LINT_CACHE_DIR", str(cache))
    log = tmp_path / "builds"
    log.touch()
    build = module.build_tokenizer

    def counted(metadata):  # in the child the build runs in: counted in a file
        with log.open("a") as stream:
            stream.write("built\n")
        return build(metadata)

    monkeypatch.setattr(module, "build_tokenizer", counted)
    text = "<|im_start|>user\nWetter in München? 東京は？ 12345 don't<|im_end|>\n<|im_start|>assistant\n"
    expected = Tokenizer.from_file(str(small_qwen / "tokenizer.json")).encode(text, add_special_tokens=False).ids

    class Builds:
        def __len__(self) -> int:
            return len(log.read_text().splitlines())

    builds = Builds()

    def ids(model: Path) -> list[int]:
        module._own_tokenizer.cache_clear()  # as a new process starts
        own = module.own_tokenizer(model)
        assert own.description.startswith("token ids of the tokenizer in")
        return own.tokenizer.encode(text)

    model = write_gguf(tmp_path / "qwen.gguf", CLOCK, tokenizer=small_qwen)
    assert (ids(model), len(builds)) == (expected, 1)
    (folder,) = (cache / "gguf-tokenizers").iterdir()
    entry = folder / "tokenizer.json"
    assert Tokenizer.from_file(str(entry)).encode(text, add_special_tokens=False).ids == expected
    assert (ids(model), len(builds)) == (expected, 1)  # read from the cache, not built
    # another quantization of the model: other metadata, the same tokenizer, the same entry
    other = write_gguf(tmp_path / "qwen-q8.gguf", TOOL_ARGS, tokenizer=small_qwen, extra={"general.file_type": 7})
    assert (ids(other), len(builds)) == (expected, 1)
    assert list((cache / "gguf-tokenizers").iterdir()) == [folder]
    # an entry cut short, or of another vocabulary, is built again and replaced
    whole = entry.read_bytes()
    entry.write_bytes(whole[: len(whole) // 2])
    assert (ids(model), len(builds)) == (expected, 2)
    assert entry.read_bytes() == whole
    from tokenizers.models import BPE

    entry.write_text(Tokenizer(BPE({"a": 0}, [])).to_str())  # loads, with one token
    assert (ids(model), len(builds)) == (expected, 3)
    assert entry.read_bytes() == whole
    # a cache that cannot be written costs the build, nothing more
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TMPL_LINT_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    assert (ids(model), len(builds)) == (expected, 4)


def test_the_cache_directory_follows_the_override_then_xdg(tmp_path, monkeypatch):
    from tmpl_lint.config import cache_directory

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TMPL_LINT_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_directory() == tmp_path / "mine"
    monkeypatch.delenv("TMPL_LINT_CACHE_DIR")
    assert cache_directory() == tmp_path / "xdg" / "tmpl-lint"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the XDG spec: ignored
    assert cache_directory() == tmp_path / "home" / ".cache" / "tmpl-lint"


def test_bos_and_eos_come_from_the_metadata_when_its_tokenizer_cannot_be_built(tmp_path):
    from tmpl_lint.checker import prover_inputs
    from tmpl_lint.proving.measure import DEFAULT_SPECIAL_TOKENS

    bos = "<|begin_of_text|>"
    template = "{{ bos_token }}" + CLOCK
    model = write_gguf(tmp_path / "m.gguf", template, tokens=("no-such-tokenizer", [bos, "</s>", "x"], 0, 1))
    (source,) = collect([model])[0]
    assert prover_inputs(source, None) == (None, {"bos_token": bos, "eos_token": "</s>"}, None)
    plain = tmp_path / "plain.jinja"  # the same template, rendered with placeholder tokens
    plain.write_text(template)
    _, out, _ = run(model, "--format", "json", "--select", "PC001")
    (finding,) = json.loads(out)
    _, out, _ = run(plain, "--format", "json", "--select", "PC001")
    (placeholder,) = json.loads(out)
    assert finding["proof"]["unit"] == "char"
    assert finding["proof"]["note"].startswith("measured in characters: transformers cannot build the tokenizer in this GGUF: ")
    # the render starts with the metadata's BOS: the divergence moves by the difference in length
    shift = len(bos) - len(DEFAULT_SPECIAL_TOKENS["bos_token"])
    assert shift != 0
    assert finding["proof"]["first_divergence"] == placeholder["proof"]["first_divergence"] + shift


def test_diff_and_replay_take_bos_and_eos_from_a_gguf_template(tmp_path):
    from tmpl_lint.diff import read_template

    model = write_gguf(tmp_path / "m.gguf", CLEAN, tokens=("llama", ["<unk>", "<s>", "</s>"], 1, 2))
    assert read_template(model) == (CLEAN, {"bos_token": "<s>", "eos_token": "</s>"})


@needs_shared
def test_proof_in_the_files_token_ids_matches_the_tokenizer_json(tmp_path, qwen_gguf):
    """ORACLE.tsv: Qwen2.5-7B-Instruct re-serialises tool arguments ("spaced"): PC004, proven in tokens."""
    template = (SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja").read_text()
    model = Path(shutil.copyfile(qwen_gguf, tmp_path / "qwen.gguf"))  # this template, with Qwen2.5's tokenizer
    plain = tmp_path / "qwen.jinja"
    plain.write_text(template)
    _, out, _ = run(model, "--format", "json", "--select", "PC004")
    (from_gguf,) = json.loads(out)
    # a GGUF's template is rendered as llama.cpp renders it: the plain template, the same way
    _, out, _ = run(plain, "--format", "json", "--select", "PC004", "--tokenizer", QWEN, "--engine", "llamacpp")
    (from_json,) = json.loads(out)
    assert from_gguf["proof"]["status"] == "proven" and from_gguf["proof"]["unit"] == "token"
    assert from_gguf["proof"].pop("note") == "token ids of the tokenizer in qwen.gguf's metadata (gpt2, 151665 tokens)"
    assert from_gguf["proof"] == from_json["proof"]


# -- --fix -----------------------------------------------------------------------------------------


def test_a_finding_fix_declined_in_a_model_is_said_once_with_its_reason(tmp_path):
    # Text after the messages (PC007) has no fix: said once for the model's template, not
    # again for the fixed template beside it, which the lint after --fix reads.
    prompt = CLOCK.index("{%- if add_generation_prompt %}")
    model = write_gguf(tmp_path / "m.gguf", CLOCK[:prompt] + "Remember: be brief.\n" + CLOCK[prompt:])
    code, out, _ = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX)
    declined = [line for line in out.splitlines() if "not fixed PC007" in line]
    assert code == 1
    # said where the check finds it: in the fixed template beside the model, which the check
    # reads (PC001's fix added a line above it)
    assert declined == [
        f"{tmp_path / 'm.chat_template.jinja'}:{CLOCK[:prompt].count(chr(10)) + 2}:1: not fixed PC007 [text-after-history]: "
        "no edit keeps the model's trained format: it was trained to see this after the messages"
    ]


def test_fix_writes_the_template_beside_the_model_and_the_check_reads_it_as_llama_server_serves_it(tmp_path):
    """Issue 35: a model fixed beside goes green. llama-server started with the printed
    --chat-template-file serves the fixed file, so the check reads it instead of the
    model's metadata, and says so; "already fixed" is never said beside a failing finding."""
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    before = sha(model)
    reference = tmp_path / "reference.jinja"
    reference.write_text(CLOCK)
    assert run(reference, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove")[0] == 0
    code, out, err = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove")
    companion = tmp_path / "m.chat_template.jinja"
    checked_instead = (
        f"note: {tmp_path}: m.chat_template.jinja is checked instead of the default template in m.gguf's metadata: "
        "llama-server serves it with --chat-template-file (and then no template of the model's metadata)"
    )
    assert (code, err) == (0, "")
    assert sha(model) == before
    assert companion.read_bytes() == reference.read_bytes()
    assert companion.read_text().startswith(
        '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n'
    )
    assert without_edits(out).splitlines() == [
        f"{model}:default:3:28: fixed PC001 [live-clock]: the model sees the date 2026-01-15 instead of today's unless the caller passes date_string",
        f"{model}:default: wrote the fixed template to {companion}",
        f"  llama.cpp: llama-server -m {model} --jinja --chat-template-file {companion}",
        checked_instead,
        "Found 1 finding (1 fixed, 0 remaining).",
    ]
    # again, and the check: the fixed file is what is read; nothing to fix, nothing "fixed"
    for flags in (["--fix", "--unsafe-fixes"], []):
        code, out, _ = run(model, *flags, *FROZEN_FIX, "--no-prove")
        assert (code, out.splitlines()) == (0, [checked_instead, "All checks passed!"])
    # the folder as CI checks it: green, the fixed file read once, with its model
    code, out, _ = run(tmp_path / "m.gguf", tmp_path, "--no-prove")
    assert (code, out.splitlines()) == (0, [checked_instead, "All checks passed!"])
    # the file broken again fails the check where it is, and --fix fixes it there
    companion.write_text(CLOCK)
    code, out, _ = run(model, "--no-prove", "-q")
    assert code == 1 and out.startswith(f"{companion}:3:28: PC001 [live-clock]")
    code, out, _ = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "-q")
    assert (code, companion.read_bytes()) == (0, reference.read_bytes())
    assert out.startswith(f"{companion}:3:28: fixed PC001 [live-clock]")
    assert sha(model) == before


@pytest.mark.parametrize("with_tokenizer", [False, pytest.param(True, marks=needs_shared)])
def test_quantisations_of_one_template_are_verified_once(tmp_path, monkeypatch, request, with_tokenizer):
    """Two GGUF files of one model (two quantisations) carry the same template, and the same
    tokenizer: the first is verified, the second recalls its answers and is fixed alike."""
    made = log_verifiers(monkeypatch, tmp_path / "verifiers made")
    tokenizer = request.getfixturevalue("small_qwen") if with_tokenizer else None
    models = [write_gguf(tmp_path / f"m-{kind}.gguf", CLOCK, tokenizer=tokenizer) for kind in ("Q4_K_M", "Q8_0")]
    code, out, err = run(*models, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove")
    assert (code, err) == (0, "")  # the check after reads the fixed templates beside the models
    assert made.read_text() == "m-Q4_K_M.gguf\n"
    companions = [tmp_path / f"m-{kind}.chat_template.jinja" for kind in ("Q4_K_M", "Q8_0")]
    assert companions[0].read_text() == companions[1].read_text() != CLOCK
    for model in models:
        assert f"{model}:default:3:28: fixed PC001 [live-clock]: " in out


def test_fixed_variant_is_written_and_llama_cpp_limits_said(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", [{"name": "default", "template": CLOCK}, {"name": "tool_use", "template": TOOL_ARGS}])
    code, out, _ = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "-q")
    assert (tmp_path / "m.chat_template.tool_use.jinja").is_file()
    assert (
        "  note: with --chat-template-file, llama.cpp renders requests with tools with it too, instead of the model's tool_use template"
        in out
    )
    assert (
        "  llama.cpp reads the tool_use template only from the model's metadata: --gguf-copy PATH writes a GGUF that carries the fix"
        in out
    )


def test_the_companion_template_is_proven_with_the_models_tokens(tmp_path):
    write_gguf(tmp_path / "m.gguf", CLOCK)
    assert run(tmp_path / "m.gguf", "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove")[0] == 0  # the fixed file is checked
    (tmp_path / "m.chat_template.jinja").write_text(CLOCK)  # as if broken again
    code, out, _ = run(tmp_path / "m.chat_template.jinja", "--format", "json")
    assert json.loads(out)[0]["proof"]["note"] == "measured in characters: m.gguf has no tokenizer in its metadata"


def test_diff_is_the_new_files_fix_writes_and_git_and_patch_create_them(tmp_path, monkeypatch):
    model = write_gguf(tmp_path / "m.gguf", [{"name": "default", "template": CLOCK}, {"name": "tool_use", "template": TOOL_ARGS}])
    monkeypatch.chdir(tmp_path)
    before, model_bytes = sorted(os.listdir(tmp_path)), sha(model)
    code, out, err = run("m.gguf", "--diff", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "-q")
    assert sorted(os.listdir(tmp_path)) == before  # --diff writes nothing
    assert code == 1  # as ruff's --diff: a change it would make is a finding
    assert [line for line in out.splitlines() if line.startswith(("---", "+++", "@@"))] == [
        "--- /dev/null",
        "+++ b/m.chat_template.jinja",
        f"@@ -0,0 +1,{len(CLOCK.splitlines()) + 1} @@",
        "--- /dev/null",
        "+++ b/m.chat_template.tool_use.jinja",
        f"@@ -0,0 +1,{len(TOOL_ARGS.splitlines())} @@",
    ]
    assert err.startswith("m.gguf:default:3:28: would fix PC001 [live-clock]: ")
    companions = [tmp_path / "m.chat_template.jinja", tmp_path / "m.chat_template.tool_use.jinja"]
    assert run("m.gguf", "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove")[0] == 0  # the fixed files are checked
    written = [path.read_bytes() for path in companions]
    for command in (["git", "apply"], ["patch", "-p1", "-s"]):
        for path in companions:
            path.unlink()
        assert subprocess.run(command, input=out, text=True, cwd=tmp_path, capture_output=True).returncode == 0
        assert [path.read_bytes() for path in companions] == written  # the diff is what --fix writes
    assert sha(model) == model_bytes


@pytest.mark.parametrize("mode", ["--fix", "--diff"])
def test_fixed_is_never_said_of_a_companion_that_is_not_written(tmp_path, monkeypatch, mode):
    write_gguf(tmp_path / "m.gguf", [{"name": "default", "template": CLOCK}, {"name": "tool_use", "template": TOOL_ARGS}])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.chat_template.jinja").mkdir()  # a folder of the user's, under the file's name
    code, out, err = run("m.gguf", mode, "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "-q")
    assert code == 2
    assert (tmp_path / "m.chat_template.jinja").is_dir()
    said = (out + err).splitlines() if mode == "--fix" else err.splitlines()
    verb = "fixed" if mode == "--fix" else "would fix"
    # the default template's fix goes nowhere; the tool_use one is written (or would be)
    assert said[0] == (
        "m.gguf:default:3:28: not fixed PC001 [live-clock]: m.chat_template.jinja exists and differs from the "
        "fixed template; tmpl-lint does not overwrite it (remove it to write the fix)"
    )
    assert said[1].startswith(f"m.gguf:tool_use:5:89: {verb} PC004 [tool-args-reserialized]: ")
    assert f": {verb} PC001" not in out + err
    assert "tmpl-lint: error: m.chat_template.jinja: already exists and differs from the fixed template; " in err
    if mode == "--diff":
        assert out.startswith("--- /dev/null\n+++ b/m.chat_template.tool_use.jinja\n")
        assert "m.chat_template.jinja\n" not in out
    else:
        assert (tmp_path / "m.chat_template.tool_use.jinja").is_file()


def test_split_model_fix_and_copy_are_named_after_the_model(tmp_path):
    first = write_gguf(tmp_path / "Model-Q4-00001-of-00002.gguf", CLOCK)
    second = write_gguf(tmp_path / "Model-Q4-00002-of-00002.gguf")
    out_dir = tmp_path / "fixed"
    out_dir.mkdir()
    code, out, _ = run(second, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", out_dir)
    companion = tmp_path / "Model-Q4.chat_template.jinja"
    copy = out_dir / first.name
    assert code == 0 and companion.is_file() and copy.is_file()
    assert f"  llama.cpp: llama-server -m {first} --jinja --chat-template-file {companion}" in out
    assert f"  the other splits are unchanged: put them (or links to them) beside {first.name}" in out
    assert fields(copy)["tokenizer.chat_template"][1] == companion.read_text()
    assert tensors(copy) == tensors(first)
    # the fixed template is proven with the model it was fixed out of
    from tmpl_lint.gguf.models import model_for

    assert model_for(collect([companion])[0][0]) == first


def test_sarif_points_at_the_gguf_without_reading_it_as_text(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    code, out, _ = run(model, "--no-prove", "--format", "sarif")
    (result,) = json.loads(out)["runs"][0]["results"]
    location = result["locations"][0]["physicalLocation"]
    assert location["region"]["startLine"] == 1
    assert result["properties"]["templateLine"] == 3


# -- --gguf-copy -----------------------------------------------------------------------------------


def fields(path: Path) -> dict:
    """Every metadata value as gguf's own reader reads it."""
    reader = gguf.GGUFReader(path)
    return {name: (field.types, field.contents()) for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def tensors(path: Path) -> list:
    return [(t.name, t.tensor_type, t.shape.tolist(), t.data.tobytes()) for t in gguf.GGUFReader(path).tensors]


@pytest.mark.parametrize("alignment", [None, 64])
def test_gguf_copy_carries_the_fixed_templates_and_the_same_tensors(tmp_path, alignment):
    model = write_gguf(
        tmp_path / "m.gguf",
        [{"name": "default", "template": CLOCK}, {"name": "tool_use", "template": TOOL_ARGS}],
        alignment=alignment,
    )
    model.chmod(0o640)
    before = sha(model)
    copy = tmp_path / "out" / "fixed.gguf"
    copy.parent.mkdir()
    code, out, err = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", copy)
    assert err == ""
    assert (
        f"{model}: wrote {copy}, a copy with the fixed templates in its metadata (tensors unchanged)\n  llama.cpp: llama-server -m {copy} --jinja\n"
        in out
    )
    assert sha(model) == before
    fixed_default = (tmp_path / "m.chat_template.jinja").read_text()
    fixed_tool_use = (tmp_path / "m.chat_template.tool_use.jinja").read_text()
    assert fixed_default != CLOCK and fixed_tool_use != TOOL_ARGS
    original, written = fields(model), fields(copy)
    assert written.pop("tokenizer.chat_template")[1] == fixed_default
    assert written.pop("tokenizer.chat_template.tool_use")[1] == fixed_tool_use
    del original["tokenizer.chat_template"], original["tokenizer.chat_template.tool_use"]
    assert written == original
    assert tensors(copy) == tensors(model)
    assert gguf.GGUFReader(copy).alignment == (alignment or 32)
    assert copy.stat().st_mode & 0o777 == 0o640
    assert sorted(os.listdir(copy.parent)) == ["fixed.gguf"]  # no temporary left behind
    # what it holds lints as fixed
    assert collect([copy])[0][0].text == fixed_default


def test_gguf_copy_into_a_directory_takes_the_models_name(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    out_dir = tmp_path / "fixed"
    out_dir.mkdir()
    code, _, _ = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", out_dir)
    assert code == 0  # the fixed template beside the model is checked; the copy carries the fix
    assert fields(out_dir / "m.gguf")["tokenizer.chat_template"][1] == (tmp_path / "m.chat_template.jinja").read_text()


def test_gguf_copy_into_a_folder_named_with_a_trailing_slash_creates_it(tmp_path):
    # as the README's example: --gguf-copy fixed/ writes fixed/m.gguf (it wrote a file named fixed)
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    code, out, err = run(
        model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", f"{tmp_path / 'fixed'}{os.sep}"
    )
    assert (code, err) == (0, "")
    copy = tmp_path / "fixed" / "m.gguf"
    assert f"{model}: wrote {copy}, a copy with the fixed templates in its metadata (tensors unchanged)\n" in out
    assert fields(copy)["tokenizer.chat_template"][1] == (tmp_path / "m.chat_template.jinja").read_text()


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("nodir/sub/x.gguf", "no such folder: {tmp}/nodir/sub"),
        ("nodir/fixed/", "no such folder: {tmp}/nodir"),
        ("m.gguf/", "not a folder (--gguf-copy names a folder with a trailing /)"),
    ],
)
def test_gguf_copy_where_it_cannot_go_is_one_line_before_anything_is_written(tmp_path, given, reason):
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    before = sorted(os.listdir(tmp_path))
    code, out, err = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", f"{tmp_path}/{given}")
    assert (code, out) == (2, "")
    assert err == f"tmpl-lint: error: {tmp_path / given}: {reason.format(tmp=tmp_path)}\n"
    assert sorted(os.listdir(tmp_path)) == before  # not even the fixed template beside the model


def test_gguf_copy_never_overwrites(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    before = sha(model)
    taken = tmp_path / "taken.gguf"
    taken.write_bytes(b"precious")
    code, out, err = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", taken)
    assert code == 2
    assert err == f"tmpl-lint: error: {taken}: already exists; tmpl-lint does not overwrite it\n"
    # the fix beside the model was written (and is what the check reads); the copy was not
    assert out.splitlines()[-1] == "Found 1 finding (1 fixed, 0 remaining); 1 file could not be written (see the errors above)."
    assert taken.read_bytes() == b"precious"
    # the model's own folder as the destination names the model itself
    code, _, err = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", tmp_path)
    assert code == 2 and err == f"tmpl-lint: error: {model}: already exists; tmpl-lint does not overwrite it\n"
    assert sha(model) == before


def test_gguf_copy_needs_fix(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    for flags in ([], ["--diff", "--unsafe-fixes"], ["--fix", "--diff", "--unsafe-fixes"]):
        code, _, err = run(model, *flags, "--gguf-copy", tmp_path / "c.gguf")
        assert code == 2 and "--gguf-copy writes a fixed model: it needs --fix (and no --diff)" in err
    assert not (tmp_path / "c.gguf").exists()


def test_a_copy_that_does_not_read_back_never_appears(tmp_path, monkeypatch):
    import tmpl_lint.gguf.writing as module

    real = module._stream_copy

    def corrupt(gguf_module, model, original, temporary, replaced):
        real(gguf_module, model, original, temporary, replaced)
        last = gguf.GGUFReader(temporary).tensors[-1]
        with open(temporary, "r+b") as stream:  # the last tensor's last byte flipped
            stream.seek(last.data_offset + last.n_bytes - 1)
            byte = stream.read(1)
            stream.seek(-1, os.SEEK_CUR)
            stream.write(bytes([byte[0] ^ 0xFF]))

    monkeypatch.setattr(module, "_stream_copy", corrupt)
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, _, err = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", out_dir / "c.gguf")
    assert code == 2
    assert err == (
        f"tmpl-lint: error: the copy of {model} does not read back as written: tensor blk.0.attn_q.weight differs; nothing written\n"
    )
    assert os.listdir(out_dir) == []
    # a folder made for the copy goes with it
    code, _, _ = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", f"{tmp_path / 'new'}{os.sep}")
    assert code == 2 and not (tmp_path / "new").exists()


def fixing(*args) -> subprocess.Popen:
    """A real tmpl-lint --fix process, its lines read as it prints them."""
    return subprocess.Popen(
        [sys.executable, "-m", "tmpl_lint", *map(str, args), "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"},
    )


def fixed_reference(tmp_path: Path, text: str) -> bytes:
    reference = tmp_path / "reference" / "chat_template.jinja"
    reference.parent.mkdir()
    reference.write_text(text)
    assert run(reference, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove")[0] == 0
    return reference.read_bytes()


def said_lines(process, count: int) -> list[str]:
    """The next ``count`` lines a --fix process says, past the template lines its fixes edited."""
    said: list[str] = []
    while len(said) < count:
        line = process.stdout.readline()
        if not without_edits(line):
            continue
        said.append(line)
    return said


def test_a_fix_waits_for_the_lock_on_the_companion_and_finds_it_written(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", [{"name": "default", "template": CLOCK}, {"name": "tool_use", "template": TOOL_ARGS}])
    companion = tmp_path / "m.chat_template.tool_use.jinja"
    expected = fixed_reference(tmp_path, TOOL_ARGS)
    with lock_held(companion) as asked:
        process = fixing(model)
        # the default template's lines, said once its file is written; the tool_use
        # template's file is written next, which takes the lock first
        said = said_lines(process, 4)
        assert said[0].startswith(f"{model}:default:3:28: fixed PC001 [live-clock]")
        assert said[3].startswith("  note: with --chat-template-file")
        asked()  # the run opened the lock's file to take the lock
        time.sleep(0.3)
        assert process.poll() is None
        companion.write_bytes(expected)  # another tmpl-lint, holding the lock, wrote the same fix
    out, err = process.communicate(timeout=120)
    assert (process.returncode, err) == (0, "")
    assert out.splitlines()[:2] == [  # the other one wrote it: "fixed in the companion file", not "fixed"
        f"{model}:tool_use:5:89: fixed in the companion file PC004 [tool-args-reserialized]: tool-call arguments render as the model writes "
        'them: a string byte for byte, a mapping as {"city":"Paris"}',
        f"{model}:tool_use: already written: the fixed template to {companion}",
    ]
    assert companion.read_bytes() == expected
    assert sorted(os.listdir(tmp_path)) == ["m.chat_template.jinja", "m.chat_template.tool_use.jinja", "m.gguf", "reference"]


def test_a_copy_waits_for_the_lock_and_never_overwrites_what_appeared(tmp_path):
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    destination = out_dir / "c.gguf"
    with lock_held(destination) as asked:
        process = fixing(model, "--gguf-copy", destination)
        # the companion's lines, said once it is written; the copy is written next
        said = said_lines(process, 3)
        assert said[0].startswith(f"{model}:default:3:28: fixed PC001 [live-clock]")
        assert (
            said[2] == f"  llama.cpp: llama-server -m {model} --jinja --chat-template-file {tmp_path / 'm.chat_template.jinja'}\n"
        )
        asked()  # the run opened the lock's file to take the lock
        time.sleep(0.3)
        assert process.poll() is None
        destination.write_bytes(b"precious")
    _, err = process.communicate(timeout=120)
    assert (process.returncode, err) == (2, f"tmpl-lint: error: {destination}: already exists; tmpl-lint does not overwrite it\n")
    assert destination.read_bytes() == b"precious"
    assert os.listdir(out_dir) == ["c.gguf"]


def test_sigterm_during_a_copy_leaves_neither_the_copy_nor_a_temporary_file(tmp_path):
    """The model declares 512 MiB of tensor data (a sparse file), which the copy writes out."""
    model = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(model, "llama")
    writer.add_chat_template(CLOCK)
    size = 512 << 20
    writer.add_tensor_info("token_embd.weight", (size // 2,), np.dtype(np.float16), size)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with open(model, "r+b") as stream:
        stream.truncate(-(-stream.seek(0, os.SEEK_END) // 32) * 32 + size)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    process = fixing(model, "--gguf-copy", out_dir / "c.gguf")
    deadline = time.monotonic() + 120
    while not any(name.endswith(".tmp") for name in os.listdir(out_dir)):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert (process.returncode, err) == (128 + signal.SIGTERM, "tmpl-lint: terminated\n")
    assert os.listdir(out_dir) == []


# -- audit ---------------------------------------------------------------------------------------


def cached_repo(hub: Path, repo: str, files: dict[str, Path]) -> None:
    """A repo in the models--org--name/{blobs,refs,snapshots} layout huggingface_hub writes."""
    root = hub / ("models--" + repo.replace("/", "--"))
    commit = hashlib.sha1(repo.encode()).hexdigest()
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir()
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for name, origin in files.items():
        data = origin.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))


def test_audit_reads_gguf_models_in_the_local_cache_and_dedupes_them(tmp_path):
    pytest.importorskip("huggingface_hub")
    model = write_gguf(
        tmp_path / "Model-Q4_K_M.gguf", [{"name": "default", "template": CLOCK}, {"name": "tool_use", "template": TOOL_ARGS}]
    )
    jinja = tmp_path / "chat_template.jinja"
    jinja.write_text(CLOCK)
    cached_repo(tmp_path / "hub", "someone/Model-GGUF", {"Model-Q4_K_M.gguf": model})
    cached_repo(tmp_path / "hub", "someone/Model", {"chat_template.jinja": jinja})
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", "audit", "--from-cache", "--format", "json", "--no-cache", "--no-prove"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    rows = [(row["repo"], row["template"], row["codes"]) for row in report["rows"]]
    assert rows == [
        ("someone/Model", "chat_template.jinja", ["PC001"]),
        ("someone/Model-GGUF", "Model-Q4_K_M.gguf:default", ["PC001"]),
        ("someone/Model-GGUF", "Model-Q4_K_M.gguf:tool_use", ["PC004"]),
    ]
    # the GGUF's default template and the repo's chat_template.jinja are one analysis
    assert (report["distinct_templates"], report["analysed_templates"]) == (2, 2)
    assert result.returncode == 1


class FakeHub:
    """huggingface_hub's model info, snapshot download and HfFileSystem reads, answered from
    local files, recording what was asked."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path
        self.infos: dict[str, object] = {}
        self.files: dict[str, Path] = {}  # "repo/file" -> local file
        self.snapshots: dict[str, Path] = {}
        self.opened: list[tuple[str, str | None]] = []
        self.bytes_read = 0

    def repo(self, repo: str, gguf_summary: dict | None, files: dict[str, Path]) -> None:
        from types import SimpleNamespace

        commit = hashlib.sha1(repo.encode()).hexdigest()
        # As huggingface_hub lays its cache out: the audit reads only a commit's folder there.
        snapshot = self.root / f"models--{repo.replace('/', '--')}" / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for name, origin in files.items():
            self.files[f"{repo}/{name}"] = origin
            if not name.endswith(".gguf"):  # the audit's allow_patterns leave the models out
                (snapshot / name).write_bytes(origin.read_bytes())
        self.snapshots[repo] = snapshot
        siblings = [SimpleNamespace(rfilename=name) for name in files]
        self.infos[repo] = SimpleNamespace(gguf=gguf_summary, siblings=siblings)

    def install(self, monkeypatch) -> None:
        import huggingface_hub
        from huggingface_hub import constants as hub_constants

        hub = self

        def model_info(self, repo_id, revision=None, expand=None, **_):
            assert "gguf" in expand and "siblings" in expand
            assert revision == hashlib.sha1(repo_id.encode()).hexdigest()
            return hub.infos[repo_id]

        class Counting:
            def __init__(self, path):
                self.stream = open(path, "rb")  # noqa: SIM115 - closed by __exit__

            def read(self, size=-1):
                data = self.stream.read(size)
                hub.bytes_read += len(data)
                return data

            def __enter__(self):
                return self

            def __exit__(self, *_):
                self.stream.close()

        def open_remote(self, path, mode="rb", revision=None, **_):
            hub.opened.append((path, revision))
            return Counting(hub.files[path])

        monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(
            huggingface_hub, "snapshot_download", lambda repo_id, revision=None, allow_patterns=None: str(hub.snapshots[repo_id])
        )
        monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
        monkeypatch.setattr(huggingface_hub.HfFileSystem, "open", open_remote)


def test_audit_of_hub_gguf_repos_reads_metadata_never_models(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from tmpl_lint.audit import ResultsCache, run_audit
    from tmpl_lint.selection import Selection

    hub = FakeHub(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("# a model")
    # 1: the Hub's gguf summary carries the default template
    hub.repo(
        "org/summary-GGUF", {"chat_template": CLOCK, "bos_token": "<s>", "eos_token": "</s>", "total": 7}, {"a.gguf": readme}
    )
    # 2: no template in the summary: the first split's header, by range, past a projector and split 2
    first = write_gguf(
        tmp_path / "big-00001-of-00002.gguf",
        [{"name": "default", "template": CLOCK}, {"name": "tool_use", "template": TOOL_ARGS}],
    )
    with open(first, "r+b") as stream:
        stream.truncate(256 << 20)  # tensor data the audit must not fetch (sparse)
    hub.repo(
        "org/header-GGUF",
        {"total": 7},
        {"mmproj-f16.gguf": readme, "big-00002-of-00002.gguf": readme, "big-00001-of-00002.gguf": first, "README.md": readme},
    )
    # 3: a transformers repo with the same template as the others' default
    jinja = tmp_path / "chat_template.jinja"
    jinja.write_text(CLOCK)
    hub.repo("org/plain", None, {"chat_template.jinja": jinja})
    # 4: a file named .gguf that is not one
    hub.repo("org/broken-GGUF", None, {"x.gguf": readme})
    hub.install(monkeypatch)

    specs = ["org/summary-GGUF", "org/header-GGUF", "org/plain", "org/broken-GGUF"]
    result = run_audit(specs, [], False, Selection(), None, 1, ResultsCache(None))
    by_repo = {repo.repo: repo for repo in result.repos}
    assert [name for name, _ in by_repo["org/summary-GGUF"].templates] == ["gguf:default"]
    assert [name for name, _ in by_repo["org/header-GGUF"].templates] == [
        "big-00001-of-00002.gguf:default",
        "big-00001-of-00002.gguf:tool_use",
    ]
    assert [name for name, _ in by_repo["org/plain"].templates] == ["chat_template.jinja"]
    assert by_repo["org/broken-GGUF"].error == "x.gguf: not a GGUF file (it does not start with the GGUF magic)"
    assert hub.opened == [
        ("org/header-GGUF/big-00001-of-00002.gguf", hashlib.sha1(b"org/header-GGUF").hexdigest()),
        ("org/broken-GGUF/x.gguf", hashlib.sha1(b"org/broken-GGUF").hexdigest()),
    ]
    assert hub.bytes_read < 2 << 20  # the first read covers the metadata, not the 256 MiB
    keys = {key for repo in result.repos for _, key in repo.templates}
    assert (len(keys), result.analysed_now) == (2, 2)  # three copies of one template, one other
    codes = {name: result.analyses[key].codes for repo in result.repos for name, key in repo.templates}
    assert codes == {
        "gguf:default": ["PC001"],
        "big-00001-of-00002.gguf:default": ["PC001"],
        "big-00001-of-00002.gguf:tool_use": ["PC004"],
        "chat_template.jinja": ["PC001"],
    }


def test_a_failed_lookup_of_gguf_files_is_a_warning_beside_templates_the_repo_has(tmp_path, monkeypatch):
    # A rate limit on the Hub's model_info: a repo whose own chat_template.jinja was
    # downloaded is audited, with the failed lookup said on its row; a GGUF-only repo has
    # nothing else to audit, and the failure is its error.
    pytest.importorskip("huggingface_hub")
    import huggingface_hub

    from tmpl_lint.audit import ResultsCache, run_audit
    from tmpl_lint.selection import Selection

    hub = FakeHub(tmp_path)
    jinja = tmp_path / "chat_template.jinja"
    jinja.write_text(CLOCK)
    hub.repo("org/plain", None, {"chat_template.jinja": jinja})
    hub.repo("org/only-GGUF", None, {"x.gguf": jinja})
    hub.install(monkeypatch)

    def rate_limited(self, repo_id, **_):
        raise RuntimeError("429 Too Many Requests")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", rate_limited)
    result = run_audit(["org/plain", "org/only-GGUF"], [], False, Selection(), None, 1, ResultsCache(None))
    plain, only = sorted(result.repos, key=lambda repo: repo.repo)[::-1]
    assert (plain.repo, plain.error, [name for name, _ in plain.templates]) == ("org/plain", None, ["chat_template.jinja"])
    assert plain.warning == "its GGUF files were not looked up: GGUF metadata: RuntimeError: 429 Too Many Requests"
    assert (only.repo, only.templates) == ("org/only-GGUF", [])
    assert only.error == "GGUF metadata: RuntimeError: 429 Too Many Requests"


def test_hub_summary_special_tokens_reach_the_render(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from tmpl_lint.checker import prover_inputs
    from tmpl_lint.gguf.hub import hub_templates

    hub = FakeHub(tmp_path)
    hub.repo(
        "org/m-GGUF",
        {"chat_template": "{{ bos_token }}x", "bos_token": "<s>", "eos_token": "</s>"},
        {"m.gguf": CORPUS / "clean_chatml.jinja"},
    )
    hub.install(monkeypatch)
    (source,) = hub_templates("org/m-GGUF", hashlib.sha1(b"org/m-GGUF").hexdigest()).sources
    assert (source.name, source.text, source.container) == ("default", "{{ bos_token }}x", "gguf")
    assert prover_inputs(source, None) == (None, {"bos_token": "<s>", "eos_token": "</s>"}, None)


@needs_shared
def test_audit_tokens_measures_hub_gguf_models_in_their_own_tokens(tmp_path, monkeypatch, qwen_gguf):
    """ORACLE.tsv: Qwen2.5-7B-Instruct re-serialises tool arguments ("spaced"): PC004. Its GGUF
    on the Hub is measured in the tokenizer read from its first range, as its tokenizer.json."""
    pytest.importorskip("huggingface_hub")
    from tmpl_lint.audit import ResultsCache, run_audit
    from tmpl_lint.checker import ProveOptions
    from tmpl_lint.selection import Selection

    template = (SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja").read_text()
    model = Path(shutil.copyfile(qwen_gguf, tmp_path / "qwen2.5-7b-instruct-q4_k_m.gguf"))  # this template, Qwen2.5's tokenizer
    metadata_end = model.stat().st_size
    with open(model, "r+b") as stream:
        stream.truncate(256 << 20)  # tensor data the audit must not fetch (sparse)
    hub = FakeHub(tmp_path)
    # the summary carries the template, but not the tokenizer: the first range is read anyway
    hub.repo("org/Qwen-GGUF", {"chat_template": template, "total": 7}, {"qwen2.5-7b-instruct-q4_k_m.gguf": model})
    no_tokenizer = write_gguf(tmp_path / "bare.gguf", template)
    hub.repo("org/bare-GGUF", {"total": 7}, {"bare.gguf": no_tokenizer})
    hub.install(monkeypatch)

    selection = Selection(select=("PC004",))
    audit = run_audit(["org/Qwen-GGUF", "org/bare-GGUF"], [], False, selection, ProveOptions(), 1, ResultsCache(None), True)
    qwen, bare = audit.repos
    assert [name for name, _ in qwen.templates] == ["qwen2.5-7b-instruct-q4_k_m.gguf:default"]
    assert qwen.warning is None
    assert bare.warning == "--tokens: bare.gguf has no tokenizer in its metadata; figures are in characters"
    assert hub.bytes_read < 2 * metadata_end  # ranges that double until the metadata parses, not the 256 MiB
    (finding,) = audit.analyses[qwen.templates[0][1]].findings
    (in_characters,) = audit.analyses[bare.templates[0][1]].findings
    plain = tmp_path / "qwen.jinja"
    plain.write_text(template)
    # a GGUF's template is rendered as llama.cpp renders it: the plain template, the same way
    _, out, _ = run(plain, "--format", "json", "--select", "PC004", "--tokenizer", QWEN, "--engine", "llamacpp")
    (from_json,) = json.loads(out)
    assert finding["proof"]["unit"] == "token" and in_characters["proof"]["unit"] == "char"
    assert finding["proof"] == from_json["proof"]


def test_audit_key_follows_the_models_tokenizer_not_the_rest_of_its_metadata(tmp_path):
    from tmpl_lint.audit import template_key
    from tmpl_lint.checker import ProveOptions
    from tmpl_lint.selection import Selection

    def key_of(path: Path, **kwargs) -> str:
        (source,) = collect([write_gguf(path, CLOCK, **kwargs)])[0]
        return template_key(source, ProveOptions(), Selection())

    q4 = key_of(tmp_path / "m-Q4_K_M.gguf", extra={"tokenizer.ggml.bos_token_id": 1})
    q8 = key_of(tmp_path / "m-Q8_0.gguf", extra={"tokenizer.ggml.bos_token_id": 1}, alignment=64)
    other = key_of(tmp_path / "other.gguf", extra={"tokenizer.ggml.bos_token_id": 2})
    assert q4 == q8  # quantizations of one model: one analysis
    assert other != q4  # another tokenizer measures differently


def test_a_fifo_named_like_a_model_is_refused_without_waiting(tmp_path):
    import os
    import subprocess
    import sys

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", str(fifo), "--no-prove"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"tmpl-lint: error: {fifo}: not a regular file"]


@needs_permissions
# (a copy named straight inside it, locked/x.gguf, fails as it is written: one line, exit 2)
@pytest.mark.parametrize("named", ["locked/sub/", "locked/sub/x.gguf"])
def test_gguf_copy_under_a_folder_that_cannot_be_searched_is_one_line_before_anything_is_written(tmp_path, named):
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o600)  # readable, not searchable: what is in it cannot be looked at
    try:
        result = run_unprivileged(
            str(model), "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", named, cwd=tmp_path
        )
    finally:
        locked.chmod(0o755)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("tmpl-lint: error: locked/") and result.stderr.endswith(": Permission denied\n")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "m.chat_template.jinja").exists()


def test_names_with_a_newline_are_quoted_in_the_fix_and_copy_lines_and_the_commands_read_back(tmp_path):
    model = write_gguf(tmp_path / "a\nb.gguf", CLOCK)
    code, out, _ = run(model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "--gguf-copy", f"{tmp_path}/out/")
    companion, copy = tmp_path / "a\nb.chat_template.jinja", tmp_path / "out" / "a\nb.gguf"
    assert code == 0 and companion.is_file() and copy.is_file()
    lines = without_edits(out).splitlines()
    quoted = '"' + str(tmp_path) + "/a\\nb"
    assert lines[1] == f'{quoted}.gguf":default: wrote the fixed template to {quoted}.chat_template.jinja"'
    assert lines[3].startswith(f'{quoted}.gguf": wrote "{tmp_path}/out/a\\nb.gguf", a copy')
    # each llama.cpp command, run by bash, names the files it was printed for
    for line, files in ((lines[2], [model, companion]), (lines[4], [copy])):
        command = line.removeprefix("  llama.cpp: ")
        listed = subprocess.run(["bash", "-c", f"printf '%s\\0' {command}"], capture_output=True, check=True).stdout
        named = [Path(word.decode()) for word in listed.split(b"\0")[:-1] if word.decode().startswith(str(tmp_path))]
        assert named == files, line


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tokenizer.chat_template.tool_use": 5}, "tokenizer.chat_template.tool_use is a uint32, expected a string"),
        ({"tokenizer.chat_template": 7}, "tokenizer.chat_template is a uint32, expected a string"),
    ],
)
def test_a_template_entry_that_is_no_string_is_its_own_error_and_hides_no_other(tmp_path, extra, message):
    model = tmp_path / "v.gguf"
    writer = gguf.GGUFWriter(model, "llama")
    name = "rag" if "tokenizer.chat_template" in extra else "default"
    writer.add_string("tokenizer.chat_template" + ("" if name == "default" else f".{name}"), CLOCK)
    for key, value in extra.items():
        writer.add_uint32(key, value)
    writer.add_tensor("t", np.arange(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    sources, errors = collect([model])
    assert [(s.path, s.name, s.text) for s in sources] == [(model, name, CLOCK)]
    assert [(type(e), str(e)) for e in errors] == [(SourceError, f"{model}: {message}")]
    code, out, err = run(model, "--no-prove", "-q")
    assert code == 2
    assert err == f"tmpl-lint: error: {model}: {message}\n"
    assert out.startswith(f"{model}:{name}:3:28: PC001 [live-clock]")


SIGNAL_AS_LINKED = signal_after("link")


@pytest.mark.parametrize(
    ("number", "code", "said"),
    [(signal.SIGINT, 130, "tmpl-lint: interrupted\n"), (signal.SIGTERM, 143, "tmpl-lint: terminated\n")],
)
@pytest.mark.parametrize("copy", [False, True])
def test_a_signal_as_a_fixed_template_or_copy_is_put_in_place_names_it(tmp_path, number, code, said, copy):
    """The signal that came while the file was linked into place takes effect once it is:
    the fixed template beside the model, or the copy, is then there, and named before the
    run says it stopped (QA8: a GGUF's were not)."""
    from tmpl_lint.gguf.models import companion_path

    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    beside = companion_path(model, None)
    destination = tmp_path / "copy.gguf"
    target = destination if copy else beside
    extra = ["--gguf-copy", str(destination)] if copy else []
    process = subprocess.run(
        [
            sys.executable,
            "-c",
            SIGNAL_AS_LINKED,
            str(int(number)),
            os.path.realpath(target),
            str(model),
            "--fix",
            "--unsafe-fixes",
            "--no-prove",
        ]
        + [*FROZEN_FIX, *extra],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=120,
    )
    assert (process.returncode, process.stderr) == (code, said)
    assert target.is_file()
    lines = process.stdout.splitlines()
    assert f"{model}:default: wrote the fixed template to {beside}" in lines
    assert [line.split(" [")[0] for line in lines if " fixed PC001" in line] == [f"{model}:default:3:28: fixed PC001"]
    assert (f"{model}: wrote {destination}, a copy with the fixed templates in its metadata (tensors unchanged)" in lines) == copy
