"""Findings JSON of fixed template sets, and one digest per set: run before and after a change
that must not alter behaviour (a refactor), then compare the digests or `diff -r` the folders.

    python bench/findings_identity.py OUT_DIR

Sets: the bundled corpus/, the hostile templates (tests/hostile), and the shared corpus
(../shared/corpus/templates, skipped when absent), each linted statically (--no-prove) and with
proofs; corpus/ proven with the qwen3 tokenizer and under the hf engine; and the fixes `--diff` prints for corpus/. Each run goes through the installed
`tmpl-lint` command in a subprocess, exactly as a user runs it, from the repository root so
paths in the JSON are the same on every checkout.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# resolved: the same path in the JSON from every worktree, whichever link leads to it
SHARED = (ROOT.parent / "shared").resolve()
if not SHARED.is_dir():
    SHARED = Path("/work/shared")

SETS = {
    "corpus": ["corpus/"],
    "hostile": ["tests/hostile/"],
    "shared": [str(SHARED / "corpus" / "templates")],
}


# Every set but the hostile one: see runs().
SLOW_OK = ["--render-timeout", "120"]


def runs():
    for name, paths in SETS.items():
        if not Path(ROOT, paths[0]).exists():
            print(f"{name}: absent, skipped", file=sys.stderr)
            continue
        base = ["check", "--format", "json", "--no-cache", "--jobs", "2", *paths]
        if name != "hostile":
            # A render of these takes milliseconds: a machine under load must not turn one
            # into a render-limit finding (the hostile set keeps the default: its limits are
            # what it tests).
            base += SLOW_OK
        yield f"{name}-static", [*base, "--no-prove"]
        yield f"{name}-proved", base
    tokenizers = SHARED / "tokenizers"
    if (tokenizers / "qwen3").is_dir():
        yield (
            "corpus-proved-qwen3",
            ["check", "--format", "json", "--no-cache", "--tokenizer", str(tokenizers / "qwen3"), *SLOW_OK, "corpus/"],
        )
    yield "corpus-proved-hf", ["check", "--format", "json", "--no-cache", "--engine", "hf", *SLOW_OK, "corpus/"]
    yield "corpus-fix-diff", ["check", "--diff", "--no-cache", "--jobs", "2", "--frozen-date", "2026-01-01", *SLOW_OK, "corpus/"]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("tmpl-lint")
    for name, args in runs():
        done = subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, timeout=1800)
        (out / f"{name}.out").write_bytes(done.stdout)
        (out / f"{name}.err").write_bytes(done.stderr)
        digest = hashlib.sha256(done.stdout).hexdigest()[:16]
        errors = hashlib.sha256(done.stderr).hexdigest()[:8]
        print(f"{name:<20} exit {done.returncode}  {len(done.stdout):>8} bytes  sha256 {digest}  stderr {errors}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
