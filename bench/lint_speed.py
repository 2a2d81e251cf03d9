"""Static lint speed over the shared corpus: ms per template in-process, and the cold CLI.

Goals (issue 2): under 15 ms per template in-process, under 0.3 s for a cold `tmpl-lint`
on one file. Run: python bench/lint_speed.py [TEMPLATES_DIR]

A cold start is timed as a user meets it: with the modules' bytecode cached (pip writes it
at install; one untimed run writes it for an editable install), and also without, as in an
environment that sets PYTHONDONTWRITEBYTECODE (each start then compiles every module).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tmpl_lint.checker import lint_source
from tmpl_lint.sources import collect

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "templates"


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if not root.is_dir():
        sys.exit(f"no templates at {root} (pass a directory of templates)")
    sources, _ = collect([root])
    for source in sources:  # warm imports and caches once
        lint_source(source)
    per_template = []
    for source in sources:
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            lint_source(source)
            runs.append(time.perf_counter() - start)
        per_template.append((min(runs) * 1000, source.path.name))
    times = sorted(ms for ms, _ in per_template)
    print(f"templates: {len(sources)}")
    print(
        f"in-process ms/template: mean {statistics.mean(times):.1f}, median {statistics.median(times):.1f}, "
        f"p90 {times[int(len(times) * 0.9)]:.1f}, max {times[-1]:.1f}  (goal < 15)"
    )
    for ms, name in sorted(per_template, reverse=True)[:5]:
        print(f"  slowest: {ms:6.1f} ms  {name}")
    one = sources[0].path
    cached = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    uncached = {**cached, "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "tmpl_lint", str(one), "-q"]
    subprocess.run(command, capture_output=True, env=cached)  # writes the bytecode once
    runs = (
        ("static lint", ["--no-prove"], cached),
        ("static lint, no bytecode cache", ["--no-prove"], uncached),
        ("with proof, in characters", [], cached),
    )
    for label, flags, env in runs:
        walls = []
        for _ in range(5):
            start = time.perf_counter()
            subprocess.run(command + flags, capture_output=True, env=env)
            walls.append(time.perf_counter() - start)
        goal = "  (goal < 0.3)" if label == "static lint" else ""
        print(f"cold CLI on one file ({one.name}), {label}: median {statistics.median(walls):.3f} s{goal}")


if __name__ == "__main__":
    main()
