"""Audit throughput: distinct templates per second over 200 cached repos built from the
shared corpus (fine-tunes share templates, deduplication on), with proofs against the
same audit without them (its floor), in the same run.

Goal (issue 19): at least 20 distinct templates/s with proofs on 2 cores. The two audits
run in turn, best of 3 each; CPU time (user + system of the audit and its children, the
kernel's accounting) is printed beside the wall time: on a shared machine it is the steadier.
Run: python bench/audit_speed.py
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"
REPOS = 200
GOAL = 20
RUNS = 3


def build(home: Path) -> int:
    templates = sorted((SHARED / "corpus" / "templates").glob("*.jinja"))
    hub = home / "hub"
    for index in range(REPOS):
        origin = templates[index % len(templates)]
        repo = f"bench/model-{index:03d}"
        root = hub / ("models--" + repo.replace("/", "--"))
        commit = hashlib.sha1(repo.encode()).hexdigest()
        snapshot = root / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (root / "refs").mkdir()
        (root / "refs" / "main").write_text(commit)
        data = origin.read_bytes()
        (root / "blobs").mkdir()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / "chat_template.jinja").symlink_to(os.path.relpath(blob, snapshot))
    return len(templates)


def run(env: dict[str, str], extra: list[str]) -> tuple[float, float, dict]:
    """(wall, cpu) seconds of one audit, and its report."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", "audit", "--from-cache", "--no-cache", "--format", "json", *extra],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), json.loads(result.stdout)


def main() -> None:
    if not SHARED.is_dir():
        sys.exit(f"needs {SHARED}")
    with tempfile.TemporaryDirectory() as home:
        distinct = build(Path(home))
        env = {**os.environ, "HF_HOME": home, "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as after pip install
        env["TMPL_LINT_NO_CACHE"] = "1"  # each audit compiles its templates: the runs measure the same work
        run(env, ["--no-prove"])  # untimed: writes the bytecode
        load_before = os.getloadavg()[0]
        kinds = (("without proofs", ["--no-prove"]), ("with proofs", []))
        runs = [[run(env, extra) for _, extra in kinds] for _ in range(RUNS)]
        figures = {}
        for index, (label, _) in enumerate(kinds):
            wall = min(each[index][0] for each in runs)
            cpu = min(each[index][1] for each in runs)
            analysed = runs[0][index][2]["analysed_templates"]
            figures[label] = (analysed / wall, cpu)
            print(
                f"{label:15} {REPOS} repos ({distinct} distinct templates), deduplicated: {analysed} analysed in "
                f"{wall:.1f} s wall, {cpu:.1f} s cpu: {analysed / wall:.1f} distinct templates/s, "
                f"{REPOS / wall:.1f} repo templates/s"
            )
        (proven, proven_cpu), (static, static_cpu) = figures["with proofs"], figures["without proofs"]
        # Other processes on the machine take cores from the audit's two workers: the wall
        # figures are this machine's at this load, not the code's alone.
        print(f"load average (1 min) before the runs {load_before:.2f}, after {os.getloadavg()[0]:.2f}")
        print(
            f"with proofs: {proven:.1f} distinct templates/s against {static:.1f} without (the static floor): "
            f"{static / proven:.2f}x the floor's time wall, {proven_cpu / static_cpu:.2f}x cpu "
            f"(best of {RUNS}, in turn; {os.cpu_count()} CPUs; goal >= {GOAL} with proofs)"
        )


if __name__ == "__main__":
    main()
