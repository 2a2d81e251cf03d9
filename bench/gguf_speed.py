"""Linting a GGUF whose tensor data is large, next to linting the same template as a .jinja.

The GGUF holds Qwen2.5's template and tokenizer metadata (151k tokens and merges, as llama.cpp
writes them; a synthetic vocabulary of the same size without ../shared) and declares 8 GiB of
tensor data, a sparse file. Goal (issue 20): the cold CLI on the GGUF within 1.2x of the cold
CLI on the .jinja. Also printed: the metadata walk in-process against the same metadata with
no tensor data (the tensor data must cost nothing), and proofs: with the GGUF's tokenizer read
from tmpl-lint's cache (as every run after the first), and built from the metadata (the first).

Run: python bench/gguf_speed.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared"
QWEN = SHARED / "tokenizers" / "qwen2.5"
TEMPLATE = SHARED / "corpus" / "templates" / "Qwen--Qwen2.5-7B-Instruct.jinja"
TENSOR_BYTES = 8 << 30
RUNS = 7


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    if not (QWEN / "tokenizer.json").is_file():
        tokens = [f"tok{index}" for index in range(151_665)]
        return tokens, [1] * len(tokens), [f"t ok{index}" for index in range(151_387)]
    document = json.loads((QWEN / "tokenizer.json").read_text(encoding="utf-8"))
    added = {token["id"]: token for token in document["added_tokens"]}
    size = max(max(document["model"]["vocab"].values()), max(added)) + 1
    tokens, types = [""] * size, [1] * size
    for token, index in document["model"]["vocab"].items():
        tokens[index] = token
    for index, token in added.items():
        tokens[index], types[index] = token["content"], 3 if token["special"] else 4
    return tokens, types, [m if isinstance(m, str) else " ".join(m) for m in document["model"]["merges"]]


def write(path: Path, template: str, tensor_bytes: int, with_tokenizer: bool) -> None:
    """Metadata, one F16 tensor of ``tensor_bytes`` declared, and the file extended to hold
    it without writing it (a hole)."""
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_name("bench")
    if with_tokenizer:
        tokens, types, merges = vocabulary()
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(151643)
        writer.add_eos_token_id(151645)
    writer.add_chat_template(template)
    writer.add_tensor_info("token_embd.weight", (tensor_bytes // 2,), np.dtype(np.float16), tensor_bytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with open(path, "r+b") as stream:
        end = stream.seek(0, os.SEEK_END)
        stream.truncate(-(-end // 32) * 32 + tensor_bytes)


# Timed as a user meets it: with the modules' bytecode cached (pip writes it at install; the
# untimed first runs write it for an editable install), as bench/lint_speed.py does.
CACHED = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def cold(args: list[str], cache: Path | None = None) -> float:
    """One tmpl-lint process; ``cache``: its tokenizer cache (the bench's own, else the one
    set in main)."""
    env = CACHED if cache is None else {**CACHED, "TMPL_LINT_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tmpl_lint", *args, "-q"], capture_output=True, check=False, env=env)
    return time.perf_counter() - start


def compare(label: str, gguf_args: list[str], jinja_args: list[str], goal: str = "") -> None:
    cold(gguf_args), cold(jinja_args)  # bytecode and page cache, untimed
    on_gguf, on_jinja = [], []
    for _ in range(RUNS):  # interleaved, so load on the machine falls on both alike
        on_gguf.append(cold(gguf_args))
        on_jinja.append(cold(jinja_args))
    a, b = statistics.median(on_gguf), statistics.median(on_jinja)
    print(f"{label}: GGUF {a:.3f} s, .jinja {b:.3f} s: {a / b:.2f}x{goal}")


def main() -> None:
    from tmpl_lint.gguf.format import read_metadata

    template = (
        TEMPLATE.read_text() if TEMPLATE.is_file() else (Path(__file__).parents[1] / "corpus" / "clean_chatml.jinja").read_text()
    )
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        CACHED["TMPL_LINT_CACHE_DIR"] = str(root / "cache")  # never the user's
        big, small, bare = root / "big.gguf", root / "small.gguf", root / "bare.gguf"
        write(big, template, TENSOR_BYTES, with_tokenizer=True)
        write(small, template, 32, with_tokenizer=True)
        write(bare, template, TENSOR_BYTES, with_tokenizer=False)
        model_dir = root / "model"
        model_dir.mkdir()
        (model_dir / "chat_template.jinja").write_text(template)
        jinja = model_dir / "chat_template.jinja"
        metadata_bytes = small.stat().st_size - 32
        print(f"GGUF: {big.stat().st_size / (1 << 30):.1f} GiB ({metadata_bytes / (1 << 20):.1f} MiB of metadata), sparse")

        walks = {}
        for path in (small, big) * 3:
            start = time.perf_counter()
            read_metadata(path).templates()
            walks.setdefault(path, []).append(time.perf_counter() - start)
        print(
            f"metadata walk in-process: {min(walks[big]) * 1000:.1f} ms with 8 GiB of tensor data, "
            f"{min(walks[small]) * 1000:.1f} ms with 32 bytes (floor)"
        )
        compare("cold CLI, static lint", [str(big), "--no-prove"], [str(jinja), "--no-prove"], "  (goal <= 1.2x)")
        compare("cold CLI, proof in characters (GGUF without tokenizer metadata)", [str(bare)], [str(jinja)], "  (goal <= 1.2x)")
        if (QWEN / "tokenizer.json").is_file():
            (model_dir / "tokenizer.json").symlink_to(QWEN / "tokenizer.json")
            compare(
                "cold CLI, proof in tokens (GGUF: its tokenizer from the cache; .jinja: tokenizer.json beside)",
                [str(big)],
                [str(jinja)],
            )
            builds = [cold([str(big)], root / f"empty-cache-{run}") for run in range(3)]
            print(f"cold CLI, proof in tokens, the GGUF's tokenizer built (cache empty): {statistics.median(builds):.3f} s")


if __name__ == "__main__":
    main()
