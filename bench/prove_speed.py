"""Proof speed: time to prove one template with its tokenizer loaded, and the cold CLI.

Goals (issue 3): under 0.2 s per template in-process, under 1.5 s for a cold
`tmpl-lint TEMPLATE --tokenizer DIR`. Run: python bench/prove_speed.py

The cold CLI runs with the modules' bytecode cached, as after `pip install` (see
lint_speed.py). gpt-oss is proven twice under the default engine: on its template, and as
vLLM renders it with openai-harmony (PC103).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.sources import collect
from tmpl_lint.tokenizer import load_tokenizer

SHARED = Path(__file__).resolve().parents[2] / "shared"
CASES = [
    ("Qwen--Qwen3-0.6B.jinja", "qwen3"),
    ("Qwen--Qwen2.5-7B-Instruct.jinja", "qwen2.5"),
    ("openai--gpt-oss-120b.jinja", "gpt-oss"),
    ("mistralai--Mistral-Nemo-Instruct-2407.jinja", "mistral-nemo"),
]


def main() -> None:
    if not SHARED.is_dir():
        sys.exit(f"needs {SHARED}")
    for template, tokenizer in CASES:
        (source,), _ = collect([SHARED / "corpus" / "templates" / template])
        directory = SHARED / "tokenizers" / tokenizer
        start = time.perf_counter()
        load_tokenizer(directory)
        loaded = time.perf_counter() - start
        options = ProveOptions(directory)
        lint_source(source, prove=options)  # first run compiles the template
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            lint_source(source, prove=options)
            runs.append(time.perf_counter() - start)
        command = [sys.executable, "-m", "tmpl_lint", str(source.path), "--tokenizer", str(directory), "-q"]
        cached = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run(command, capture_output=True, env=cached)  # writes the bytecode once
        walls = []
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run(command, capture_output=True, env=cached)
            walls.append(time.perf_counter() - start)
        print(
            f"{template:48} tokenizer load {loaded:5.2f} s | prove (warm) median {statistics.median(runs):.3f} s "
            f"(goal < 0.2) | cold CLI with proof {statistics.median(walls):.2f} s (goal < 1.5)"
        )


if __name__ == "__main__":
    main()
