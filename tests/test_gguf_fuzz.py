"""The GGUF reader fuzzed (issue 34): a valid model built here, its counts, lengths, types and
alignment rewritten by hypothesis, and cut short. Every outcome is a clean error (one line)
or what gguf's own reader reads, in bounded time and memory: the examples run in one child
process under an address-space cap, which reports its peak."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_gguf import CLOCK, TOOL_ARGS

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")
pytest.importorskip("hypothesis")

EXAMPLES = 300
MEMORY_CAP = 1 << 30  # address space of the child running the examples
PEAK_LIMIT_KB = 400 * 1024


def valid_model(path: Path) -> Path:
    """Every kind of value the reader walks: scalars, strings, a string array long enough for
    the run pattern (over 1024 items), scalar arrays, two templates, an alignment, and tensors
    of a plain and a block-quantized type."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_custom_alignment(64)
    writer.add_chat_template([{"name": "default", "template": CLOCK}, {"name": "tool_use", "template": TOOL_ARGS}])
    tokens = [f"t{index}" for index in range(1100)] + ["é" * 40, "x" * 200]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_scores([float(-index) for index in range(len(tokens))])
    writer.add_bos_token_id(3)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_bool("general.flag", True)
    writer.add_float64("general.ratio", 0.5)
    writer.add_int8("general.small", -3)
    writer.add_tensor("token_embd.weight", np.arange(96, dtype=np.float32).reshape(3, 32))
    q8 = np.frombuffer(bytes(range(34)) * 2, dtype=np.uint8).reshape(1, 68)
    writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def mutation_sites(path: Path) -> list[tuple[int, int]]:
    """(offset, width) of every count, length, type and integer value in the file, as gguf's
    own reader finds them: the header's counts, each key's length and value type, a string's
    length, an array's item type, count and first length, the alignment, and each tensor's
    name length, dimensions, type and offset."""
    reader = gguf.GGUFReader(path)
    base = reader.data.ctypes.data
    sites = set()
    for field in [*reader.fields.values(), *(tensor.field for tensor in reader.tensors)]:
        for part in field.parts[:7]:  # an array's first item's length is its 6th part
            if part.dtype in (np.uint32, np.uint64, np.int32, np.int64) and part.nbytes in (4, 8):
                sites.add((part.ctypes.data - base, part.nbytes))
    return sorted(sites)


def fuzz_reader(model: str, examples: int) -> None:
    """Run in a child under the cap: each example is the valid model with one to three integer
    fields rewritten, sometimes cut short; read as a lint reads it, as --gguf-copy reads it,
    and for its special tokens and tokenizer digest."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tmpl_lint.gguf.format import EVERY_ARRAY, GGUFError, read_metadata, tokenizer_digest
    from tmpl_lint.gguf.models import read_templates
    from tmpl_lint.gguf.tokenizer import metadata_special_tokens
    from tmpl_lint.sources import SourceError

    original = Path(model).read_bytes()
    sites = mutation_sites(Path(model))
    size = len(original)
    interesting = [0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 31, 32, 64, 255, 1 << 16, size - 1, size, size + 1, 1 << 28, 1 << 30]
    interesting += [(1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 63, (1 << 64) - 1]
    folder = Path(tempfile.mkdtemp(prefix="gguf-fuzz-"))
    path = folder / "m.gguf"

    mutation = st.tuples(st.sampled_from(sites), st.one_of(st.sampled_from(interesting), st.integers(0, (1 << 64) - 1)))

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(mutation, min_size=1, max_size=3), st.one_of(st.none(), st.integers(0, size)))
    def read_mutated(changes, cut):
        data = bytearray(original)
        for (offset, width), value in changes:
            data[offset : offset + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
        path.write_bytes(bytes(data[:cut]))
        try:
            sources, unread = read_templates(path)
        except SourceError as error:  # the file is one error line
            assert "\n" not in str(error) and str(error).startswith(f"{path}: "), str(error)
            sources, unread = [], []
        for error in unread:
            assert "\n" not in str(error), str(error)
        try:
            metadata = read_metadata(path, EVERY_ARRAY, with_tensors=True)
        except GGUFError as error:
            assert "\n" not in str(error), str(error)
            metadata = None
        if metadata is not None:  # what a copy would be sized from lies inside the file
            written = len(data[:cut])
            assert metadata.data_start <= written
            for tensor in metadata.tensors:
                assert metadata.data_start + tensor.offset + tensor.nbytes <= written
        assert isinstance(metadata_special_tokens(path), dict)
        tokenizer_digest(path)
        if sources:
            # read as gguf's reader reads the same entries (it loops over each count in
            # Python, so only where this reader accepted the file: the counts fit in it)
            try:
                truth = gguf.GGUFReader(path)
            except Exception:  # noqa: BLE001 - gguf's reader refuses files this one reads (cut tensor data)
                return
            for source in sources:
                key = "tokenizer.chat_template" + ("" if source.name == "default" else f".{source.name}")
                assert truth.fields[key].contents() == source.text

    read_mutated()
    # VmHWM is this process image's own peak: getrusage's would carry the size of the pytest
    # worker it was forked from across exec.
    status = Path("/proc/self/status").read_text()
    print(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def test_the_gguf_reader_fuzzed_gives_a_clean_error_or_what_gguf_reads(tmp_path):
    model = valid_model(tmp_path / "m.gguf")
    assert len(mutation_sites(model)) > 50

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    result = subprocess.run(
        [sys.executable, "-c", f"import test_gguf_fuzz as t; t.fuzz_reader({str(model)!r}, {EXAMPLES})"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=300,  # the examples take about 5 s; the bound is for a loaded machine
        preexec_fn=capped,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert int(result.stdout.split()[-1]) < PEAK_LIMIT_KB
