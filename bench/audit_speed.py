"""Audit throughput: templates per second over 200 cached repos built from the shared
corpus (fine-tunes share templates), with and without deduplication.

Run: python bench/audit_speed.py [--prove]
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


def main() -> None:
    if not SHARED.is_dir():
        sys.exit(f"needs {SHARED}")
    prove = "--prove" in sys.argv
    with tempfile.TemporaryDirectory() as home:
        distinct = build(Path(home))
        env = {**os.environ, "HF_HOME": home, "HF_HUB_OFFLINE": "1"}
        for label, extra in (("deduplicated", []), ("every repo analysed", ["--no-dedupe"])):
            start = time.perf_counter()
            result = subprocess.run(
                [sys.executable, "-m", "tmpl_lint", "audit", "--from-cache", "--no-cache", "--format", "json", *extra]
                + ([] if prove else ["--no-prove"]),
                capture_output=True,
                text=True,
                env=env,
            )
            elapsed = time.perf_counter() - start
            report = json.loads(result.stdout)
            print(
                f"{label:20} {REPOS} repos ({distinct} distinct templates), {report['analysed_templates']} analysed "
                f"in {elapsed:.1f} s: {REPOS / elapsed:.1f} repo templates/s ({'with' if prove else 'without'} proofs)"
            )


if __name__ == "__main__":
    main()
