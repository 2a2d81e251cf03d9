"""Static lint speed against its floor: jinja2 parsing the same templates, whole process.

Goal (issue 19): `tmpl-lint DIR --no-prove` within 1.5x of a process that only parses the
same templates with jinja2 (same interpreter, the environment transformers renders in),
best of 5 runs each, run in turn so both meet the same machine (the median of the five
paired ratios is printed too: one lucky run does not move it). The same pair is timed on
one file, as a pre-commit hook meets it. Run: python bench/lint_speed.py [TEMPLATES_DIR]

Both run with the modules' bytecode cached, as after `pip install` (one untimed run of
each writes it for an editable install), since this environment may set
PYTHONDONTWRITEBYTECODE. CPU time (user + system, from the kernel's accounting of the
finished children) is printed beside the wall time: on a shared machine it is the steadier.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "templates"
RUNS = 5
GOAL = 1.5

# The floor: read the templates tmpl-lint would read and parse each with jinja2 in the
# environment chat templates run in; nothing else.
FLOOR = """
import sys
from pathlib import Path
import jinja2
from tmpl_lint.jinja_env import PARSE_ENVIRONMENT
from tmpl_lint.sources import collect
sources, _ = collect([Path(p) for p in sys.argv[1:]])
for source in sources:
    try:
        PARSE_ENVIRONMENT.parse(source.text)
    except jinja2.TemplateSyntaxError:
        pass
"""


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one run of ``command``, cpu from the kernel's accounting."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compare(label: str, lint: list[str], floor: list[str], env: dict[str, str]) -> float:
    for command in (lint, floor):  # untimed: writes the bytecode, warms the file cache
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    lint_runs, floor_runs = [], []
    for _ in range(RUNS):  # in turn, so that each pair meets the same machine
        lint_runs.append(timed(lint, env))
        floor_runs.append(timed(floor, env))
    print(f"{label}:")
    ratio = 0.0
    for index, measure in enumerate(("wall", "cpu")):
        lints = [run[index] for run in lint_runs]
        floors = [run[index] for run in floor_runs]
        best = min(lints) / min(floors)
        paired = statistics.median(mine / theirs for mine, theirs in zip(lints, floors))
        ratio = ratio or best
        print(
            f"  {measure:4}: static lint {min(lints):.3f} s (median {statistics.median(lints):.3f}), "
            f"jinja2 parse floor {min(floors):.3f} s (median {statistics.median(floors):.3f}): "
            f"{best:.2f}x best of {RUNS}, {paired:.2f}x median of the paired runs (goal <= {GOAL}x)"
        )
    return ratio


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if not root.is_dir():
        sys.exit(f"no templates at {root} (pass a directory of templates)")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    lint = [sys.executable, "-m", "tmpl_lint", "--no-prove", "-q"]
    floor = [sys.executable, "-c", FLOOR]
    count = len([path for path in root.rglob("*") if path.is_file()])
    compare(f"{root.name} ({count} files)", lint + [str(root)], floor + [str(root)], env)
    one = min(root.glob("*.jinja"), key=lambda path: path.name)
    compare(f"one file ({one.name})", lint + [str(one)], floor + [str(one)], env)


if __name__ == "__main__":
    main()
