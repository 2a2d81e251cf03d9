"""GGUF input is untrusted: sizes read from a file are checked against it before anything is
allocated, the tokenizer it describes is built in a limited child and must measure text, the
tokenizer cache never follows a link, and one bad model is one error line (issue 34)."""

from __future__ import annotations

import json
import os
import resource
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CORPUS
from test_gguf import CLEAN, CLOCK, FROZEN_FIX, run, write_gguf

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")
pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

REWRITE = (CORPUS / "PC002_history_rewrite.jinja").read_text()
# "Ġt" is " t" in the byte-level alphabet: one merge, so that the converter has merges to read
BYTE_TOKENS = [*sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet()), "Ġt", "<|im_start|>", "<|im_end|>"]
TEXT = "Hi the <|im_end|>"


def byte_level_gguf(path: Path, template: str = CLOCK) -> Path:
    """A GGUF whose byte-level BPE (its 256 byte symbols, one merge, two control tokens)
    transformers builds in milliseconds."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(BYTE_TOKENS)
    writer.add_token_types([1] * 257 + [3, 3])
    writer.add_token_merges(["Ġ t"])
    writer.add_bos_token_id(257)
    writer.add_eos_token_id(258)
    writer.add_chat_template(template)
    writer.add_tensor("t", np.arange(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def expected_ids(text: str) -> list[int]:
    """``text`` in BYTE_TOKENS' ids, by hand: each byte's symbol, " t" merged, specials whole."""
    symbol = dict(zip(range(256), _byte_order(), strict=True))
    ids, rest = [], text
    while rest:
        if rest.startswith("<|im_end|>"):
            ids.append(BYTE_TOKENS.index("<|im_end|>"))
            rest = rest[len("<|im_end|>") :]
        elif rest.startswith(" t"):
            ids.append(BYTE_TOKENS.index("Ġt"))
            rest = rest[2:]
        else:
            ids += [BYTE_TOKENS.index(symbol[byte]) for byte in rest[0].encode()]
            rest = rest[1:]
    return ids


def _byte_order() -> list[str]:
    # GPT-2's bytes-to-unicode: printable bytes stand for themselves, the others are shifted
    # past 255 in order
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = iter(range(256, 512))
    return [chr(byte) if byte in printable else chr(next(shifted)) for byte in range(256)]


def own(model: Path):
    from tmpl_lint.gguf import tokenizer

    tokenizer._own_tokenizer.cache_clear()  # as a new run starts
    return tokenizer.own_tokenizer(model)


def entry_folder_of(cache: Path, model: Path) -> Path:
    from tmpl_lint.gguf.cache import cache_key
    from tmpl_lint.gguf.format import with_metadata

    return cache / "gguf-tokenizers" / with_metadata(model, cache_key)


def private_folders(cache: Path, model: Path) -> Path:
    folder = entry_folder_of(cache, model)
    folder.mkdir(parents=True, mode=0o700)
    for made in (cache, cache / "gguf-tokenizers", folder):
        made.chmod(0o700)
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("TMPL_LINT_CACHE_DIR", str(folder))
    return folder


def test_the_byte_level_model_measures_in_its_own_tokens(tmp_path, cache):
    model = byte_level_gguf(tmp_path / "m.gguf")
    found = own(model)
    assert found.description == "token ids of the tokenizer in m.gguf's metadata (gpt2, 259 tokens)"
    assert found.tokenizer.encode(TEXT) == expected_ids(TEXT)
    entry = entry_folder_of(cache, model) / "tokenizer.json"
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600 and entry.stat().st_size < 64 * 1024


# -- 2: the tokenizer cache ------------------------------------------------------------------------


def test_a_link_planted_at_a_cache_entry_is_replaced_never_written_through(tmp_path, cache):
    model = byte_level_gguf(tmp_path / "m.gguf")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    entry = private_folders(cache, model) / "tokenizer.json"
    entry.symlink_to(victim)
    found = own(model)
    assert found.tokenizer.encode(TEXT) == expected_ids(TEXT)
    assert victim.read_text() == "precious"
    assert stat.S_ISREG(entry.lstat().st_mode)  # the link itself was replaced by the entry
    assert json.loads(entry.read_text())["model"]["type"] == "BPE"


def test_a_folder_planted_as_a_link_in_the_cache_is_never_followed(tmp_path, cache):
    model = byte_level_gguf(tmp_path / "m.gguf")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    # a tokenizer of the same size that reads every text as its unknown token: used, it
    # would measure every prompt as the same ids
    planted = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(259)}, unk_token="w0"))
    (elsewhere / "tokenizer.json").write_text(planted.to_str())
    before = (elsewhere / "tokenizer.json").read_bytes()
    folder = entry_folder_of(cache, model)
    folder.parent.mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    folder.symlink_to(elsewhere)
    found = own(model)
    assert found.tokenizer.encode(TEXT) == expected_ids(TEXT)
    assert found.directory is None  # nothing kept where a link leads
    assert (elsewhere / "tokenizer.json").read_bytes() == before
    assert os.listdir(elsewhere) == ["tokenizer.json"]


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_cache_folder_others_may_write_is_neither_read_nor_written(tmp_path, cache, mode):
    model = byte_level_gguf(tmp_path / "m.gguf")
    folder = private_folders(cache, model)
    planted = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(259)}, unk_token="w0"))
    (folder / "tokenizer.json").write_text(planted.to_str())
    before = (folder / "tokenizer.json").read_bytes()
    cache.chmod(mode)
    found = own(model)
    assert found.tokenizer.encode(TEXT) == expected_ids(TEXT)  # built, not read
    assert (folder / "tokenizer.json").read_bytes() == before  # nor written


@pytest.mark.parametrize(
    "damage",
    [
        lambda entry: entry.write_bytes(b"\xff\xfe not text"),
        lambda entry: entry.write_text('{"version": "1.0", "model": {"type": "BPE", "vo'),  # cut short
        lambda entry: entry.write_text("[]"),
        lambda entry: entry.mkdir(),
    ],
    ids=["not-utf8", "cut-short", "not-a-tokenizer", "a-folder"],
)
def test_a_damaged_cache_entry_is_a_miss(tmp_path, cache, damage):
    model = byte_level_gguf(tmp_path / "m.gguf")
    entry = private_folders(cache, model) / "tokenizer.json"
    damage(entry)
    found = own(model)
    assert found.tokenizer.encode(TEXT) == expected_ids(TEXT)
    if not entry.is_dir():  # rebuilt and kept in its place
        assert json.loads(entry.read_text())["model"]["type"] == "BPE"


def test_a_fifo_at_a_cache_entry_is_a_miss_without_waiting(tmp_path, cache):
    """A real run: reading the FIFO would wait for a writer forever."""
    model = byte_level_gguf(tmp_path / "m.gguf", REWRITE)
    entry = private_folders(cache, model) / "tokenizer.json"
    os.mkfifo(entry)
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", str(model), "--format", "json"], capture_output=True, text=True, timeout=120
    )
    assert (result.returncode, result.stderr) == (1, "")
    (finding,) = json.loads(result.stdout)
    assert (finding["code"], finding["proof"]["unit"]) == ("PC002", "token")
    assert stat.S_ISREG(entry.lstat().st_mode)


# -- 3: a vocabulary that measures nothing ------------------------------------------------------------


def one_token_gguf(path: Path, kind: str) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model(kind)
    writer.add_token_list(["x"])
    writer.add_token_scores([0.0])
    writer.add_token_types([1])
    if kind == "gpt2":
        writer.add_token_merges([])
    writer.add_chat_template(REWRITE)
    writer.add_tensor("t", np.arange(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_gguf_vocabulary_that_measures_no_text_leaves_the_proof_in_characters(tmp_path, cache, kind):
    """A vocabulary of one token encodes every prompt to nothing: measured in it, PC002's
    rewrite vanished and the run passed. It is refused as a tokenizer.json would be."""
    model = one_token_gguf(tmp_path / "m.gguf", kind)
    plain = tmp_path / "plain.jinja"
    plain.write_text(REWRITE)
    code, out, _ = run(model, "--format", "json")
    (finding,) = json.loads(out)
    assert (code, finding["code"], finding["proof"]["status"], finding["proof"]["unit"]) == (1, "PC002", "proven", "char")
    assert finding["proof"]["note"] == (
        "measured in characters: the tokenizer in m.gguf's metadata cannot be used: the tokenizer has no vocabulary to "
        "measure text in: it encodes 'The weather in Paris is sunny today, 21 degrees.' to no tokens"
    )
    _, out, _ = run(plain, "--format", "json")
    (in_plain,) = json.loads(out)
    assert {key: finding["proof"][key] for key in ("status", "first_divergence")} == {
        key: in_plain["proof"][key] for key in ("status", "first_divergence")
    }


# -- 4: the default variant llama.cpp never reads ---------------------------------------------------


def variants_gguf(path: Path, entries: dict[str, str]) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    for key, text in entries.items():
        writer.add_string(key, text)
    writer.add_tensor("t", np.arange(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


IGNORED = (
    "tokenizer.chat_template.default is never read by llama.cpp (its default template is tokenizer.chat_template): not linted"
)


@pytest.mark.parametrize(
    ("entries", "code", "first"),
    [
        ({"tokenizer.chat_template": CLEAN, "tokenizer.chat_template.default": CLOCK}, 0, ""),
        ({"tokenizer.chat_template.default": CLEAN, "tokenizer.chat_template": CLOCK}, 1, ":default:3:28: PC001 [live-clock]"),
        ({"tokenizer.chat_template.default": CLOCK}, 0, ""),
    ],
    ids=["served-clean", "served-clock", "only-default-variant"],
)
def test_the_template_llama_cpp_serves_is_linted_and_the_default_variant_said_to_be_ignored(tmp_path, entries, code, first):
    """llama.cpp's common_chat_templates_init reads tokenizer.chat_template (name nullptr) and
    tokenizer.chat_template.tool_use; llama_model_chat_template builds the key of a variant
    from the name asked for. Nothing asks for "default"."""
    model = variants_gguf(tmp_path / "m.gguf", entries)
    got, out, err = run(model, "--no-prove", "-q")
    assert (got, err) == (code, f"tmpl-lint: warning: {model}: {IGNORED}\n")
    assert out.startswith(f"{model}{first}" if first.startswith(":") else first)


# -- 13: a template name that cannot name a file -----------------------------------------------------


@pytest.mark.parametrize("name", ["a/b", "../x", "", "a\nb", "x" * 101])
def test_a_variant_name_that_cannot_name_a_file_is_one_error_and_the_batch_continues(tmp_path, name):
    model = variants_gguf(tmp_path / "m.gguf", {"tokenizer.chat_template": CLEAN, f"tokenizer.chat_template.{name}": CLOCK})
    good = write_gguf(tmp_path / "good.gguf", CLOCK)
    code, out, err = run(model, good, "--no-prove", "-q")
    assert code == 2
    assert err == (
        f"tmpl-lint: error: {model}: tokenizer.chat_template.{name}: the name {name!r} cannot name a file "
        "(a separator, a control character, a leading dot or over 100 characters); not read\n"
    )
    assert out.startswith(f"{good}:default:3:28: PC001")  # the other file is reported
    assert "m.gguf:default" not in out  # and the model's own default template linted (clean)
    code, _, _ = run(model, good, "--fix", "--unsafe-fixes", "--no-prove", *FROZEN_FIX, "-q")
    assert code == 2 and (tmp_path / "good.chat_template.jinja").is_file()


# -- 8 and 14: sizes read from the file, for --gguf-copy -----------------------------------------------


def capped(memory: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return limit


def copy_under_cap(model: Path, out: Path, memory: int = 1 << 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tmpl_lint", str(model), "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "-q"]
        + ["--gguf-copy", f"{out}{os.sep}"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=capped(memory),
        env={**os.environ, "NO_COLOR": "1"},
    )


def with_alignment(path: Path, exponent: int) -> Path:
    """An 8 kB model with two empty tensors, general.alignment patched to 2**exponent: its
    copy was padded out to the alignment (2**28: 2.4 GB of memory, a 256 MB file)."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_custom_alignment(64)
    writer.add_chat_template(CLOCK)
    writer.add_string("general.description", "x" * 7000)
    writer.add_tensor("a", np.zeros((0,), dtype=np.float32))
    writer.add_tensor("b", np.zeros((0,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = bytearray(path.read_bytes())
    at = data.index(b"general.alignment") + len(b"general.alignment")
    assert struct.unpack_from("<II", data, at) == (4, 64)  # a uint32, 64
    struct.pack_into("<I", data, at + 4, 1 << exponent)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("exponent", [28, 30])
def test_an_alignment_past_the_files_size_is_one_error_line_within_a_memory_cap(tmp_path, exponent):
    model = with_alignment(tmp_path / "m.gguf", exponent)
    result = copy_under_cap(model, tmp_path / "out")
    size = model.stat().st_size
    assert size < 8192
    assert (result.returncode, result.stderr) == (
        2,
        f"tmpl-lint: error: {model}: general.alignment is {1 << exponent}, more than the file's {size} bytes: corrupt\n",
    )
    assert not (tmp_path / "out").exists()


def test_a_model_cut_short_in_its_tensor_data_is_one_error_line_and_no_copy(tmp_path):
    """A partial download: the metadata is whole, the last tensor is not."""
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    with open(model, "r+b") as stream:
        stream.truncate(model.stat().st_size - 100)
    code, out, err = run(
        model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "-q", "--gguf-copy", f"{tmp_path / 'out'}{os.sep}"
    )
    assert (code, err) == (
        2,
        f"tmpl-lint: error: {model}: the data of tensor blk.0.attn_q.weight runs past the end of the file: truncated or corrupt\n",
    )
    assert not (tmp_path / "out").exists()
    assert (tmp_path / "m.chat_template.jinja").is_file()  # the fix beside it needs no tensor


def test_tensors_laid_over_one_region_are_refused_before_the_copy_is_written(tmp_path):
    """Every tensor's offset patched to 0: each lies inside the file, but a copy writes each
    in full (a thousand 4 kB tensors over one region of a 40 kB file: 4 MB)."""
    from tmpl_lint.gguf.format import read_metadata

    model = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(model, "llama")
    writer.add_chat_template(CLOCK)
    for index in range(64):
        writer.add_tensor(f"t{index}", np.zeros((1024,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = bytearray(model.read_bytes())
    for index in range(64):
        name = f"t{index}".encode()
        at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name) + 4 + 8 + 4  # past name, dims, type
        data[at : at + 8] = bytes(8)
    model.write_bytes(data[: read_metadata(model, with_tensors=True).data_start + 4096])
    code, _, err = run(
        model, "--fix", "--unsafe-fixes", *FROZEN_FIX, "--no-prove", "-q", "--gguf-copy", f"{tmp_path / 'out'}{os.sep}"
    )
    size = model.stat().st_size
    laid_out = read_metadata(model, with_tensors=True).data_start + 64 * 4096
    assert (code, err) == (
        2,
        f"tmpl-lint: error: {model}: its tensors padded to general.alignment take {laid_out} bytes, "
        f"more than the file's {size}: corrupt\n",
    )
    assert not (tmp_path / "out").exists()


# -- 7: building the tokenizer ------------------------------------------------------------------------


def staircase_gguf(path: Path, longest: int) -> Path:
    """Tokens "a", "aa", ... up to ``longest``, with scores and no merges: the converter
    derives a merge from every pair of tokens that makes another, about longest**3/6
    characters of them (longest 1000: a 0.5 MB file, 1.3 GB to build, a 323 MB entry)."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["a" * length for length in range(1, longest + 1)])
    writer.add_token_scores([-float(length) for length in range(longest)])
    writer.add_token_types([1] * longest)
    writer.add_chat_template(REWRITE)
    writer.add_tensor("t", np.arange(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


PEAK = (
    "import resource, subprocess, sys\n"
    "result = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(result.returncode, peak, result.stdout, sep='\\n', end='')\n"
    "sys.stderr.write(result.stderr)\n"
)


@pytest.mark.parametrize("longest", [1000, 1450])
def test_a_vocabulary_that_implies_unbounded_merges_is_refused_before_the_build(tmp_path, cache, longest):
    """Run under a 3 GB address-space cap, where the 1.1 MB one aborted with a Rust
    out-of-memory backtrace (exit 134); the peak of every process of the run is measured."""
    model = staircase_gguf(tmp_path / "m.gguf", longest)
    assert model.stat().st_size < 1_200_000
    result = subprocess.run(
        [sys.executable, "-c", PEAK, sys.executable, "-m", "tmpl_lint", str(model), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=capped(3 << 30),
    )
    code, peak, out = result.stdout.split("\n", 2)
    assert (int(code), result.stderr) == (1, "")
    assert int(peak) < 400 * 1024  # KB: the lint itself, never the 1.3 GB build
    (finding,) = json.loads(out)
    implied = sum(length**2 for length in range(1, longest + 1))
    assert (finding["proof"]["status"], finding["proof"]["unit"]) == ("proven", "char")
    assert finding["proof"]["note"] == (
        "measured in characters: the tokenizer in this GGUF lists no merges, and the ones its tokens imply could take "
        f"{implied} characters (over 67108864; real vocabularies take under a fifth of that)"
    )
    assert not (cache / "gguf-tokenizers").exists()  # nothing kept


OUT_OF_MEMORY = (
    "import sys\n"
    "from pathlib import Path\n"
    "from tmpl_lint import isolation\n"
    "isolation.MEMORY_BYTES = int(sys.argv[1])\n"
    "from tmpl_lint.gguf.tokenizer import own_tokenizer\n"
    "print(own_tokenizer(Path(sys.argv[2])).description)\n"
)


def test_a_tokenizer_build_that_runs_out_of_memory_is_one_note_never_a_backtrace(tmp_path, cache):
    """A build within the implied-merges bound (550 tokens: 55M characters) in a child limited
    to 250 MB: it fails where the allocation does (Python's MemoryError, a Rust panic or
    abort), and says so in one line; the process that asked goes on, and prints nothing else."""
    model = staircase_gguf(tmp_path / "m.gguf", 550)
    result = subprocess.run(
        [sys.executable, "-c", OUT_OF_MEMORY, str(250 << 20), str(model)], capture_output=True, text=True, timeout=300
    )
    assert (result.returncode, result.stderr) == (0, "")
    (said,) = result.stdout.splitlines()
    assert said.startswith("measured in characters: ")
    assert any(why in said for why in ("MemoryError", "ran out of memory", "PanicException")), said
    assert not (cache / "gguf-tokenizers").exists()


def test_a_string_length_no_file_reaches_is_one_error_line_and_the_batch_continues(tmp_path):
    """Found by tests/test_gguf_fuzz.py: a vocabulary entry's length of 2**63 stepped the walk
    past what an offset can hold (OverflowError, an internal error)."""
    model = write_gguf(tmp_path / "m.gguf", CLOCK, tokens=("llama", ["first-token", "b", "c"], 0, 1))
    data = bytearray(model.read_bytes())
    at = data.index(len("first-token").to_bytes(8, "little") + b"first-token")
    data[at : at + 8] = (1 << 63).to_bytes(8, "little")
    model.write_bytes(data)
    good = write_gguf(tmp_path / "good.gguf", CLOCK)
    code, out, err = run(model, good, "--no-prove", "-q")
    assert (code, err) == (2, f"tmpl-lint: error: {model}: the metadata runs past the end of the file: truncated or corrupt\n")
    assert out.startswith(f"{good}:default:3:28: PC001")
