"""Audit throughput: distinct templates per second over 200 cached repos built from the
shared corpus (fine-tunes share templates, deduplication on), with proofs against the
same audit without them (its floor), in the same run.

Goal (issue 19): at least 20 distinct templates/s with proofs on 2 cores.
Run: python bench/audit_speed.py
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"
REPOS = 200
GOAL = 20


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


def run(env: dict[str, str], extra: list[str]) -> tuple[float, dict]:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", "audit", "--from-cache", "--no-cache", "--format", "json", *extra],
        capture_output=True,
        text=True,
        env=env,
    )
    return time.perf_counter() - start, json.loads(result.stdout)


def main() -> None:
    if not SHARED.is_dir():
        sys.exit(f"needs {SHARED}")
    with tempfile.TemporaryDirectory() as home:
        distinct = build(Path(home))
        env = {**os.environ, "HF_HOME": home, "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as after pip install
        run(env, ["--no-prove"])  # untimed: writes the bytecode
        figures = {}
        for label, extra in (("without proofs", ["--no-prove"]), ("with proofs", [])):
            elapsed, report = run(env, extra)
            analysed = report["analysed_templates"]
            figures[label] = analysed / elapsed
            print(
                f"{label:15} {REPOS} repos ({distinct} distinct templates), deduplicated: {analysed} analysed in "
                f"{elapsed:.1f} s: {analysed / elapsed:.1f} distinct templates/s, {REPOS / elapsed:.1f} repo templates/s"
            )
        print(
            f"with proofs: {figures['with proofs']:.1f} distinct templates/s against {figures['without proofs']:.1f} without "
            f"(the static floor; {os.cpu_count()} CPUs; goal >= {GOAL} with proofs)"
        )


if __name__ == "__main__":
    main()
