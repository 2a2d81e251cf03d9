"""Replay throughput: requests per second over a 10,000-request log (500 agent sessions of
20 calls, Qwen3 template and tokenizer). Run: python bench/replay_speed.py"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"
SESSIONS, CALLS = 500, 20


def main() -> None:
    if not SHARED.is_dir():
        sys.exit(f"needs {SHARED}")
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "traffic.jsonl"
        with log.open("w") as stream:
            for session in range(SESSIONS):
                messages = [{"role": "system", "content": f"You are agent {session}."}]
                for call in range(CALLS):
                    messages = messages + [{"role": "user", "content": f"Step {call}: what next?"}]
                    stream.write(json.dumps({"request": {"user": f"s{session}", "messages": messages}}) + "\n")
                    messages = messages + [
                        {
                            "role": "assistant",
                            "content": f"Done step {call}.",
                            "reasoning_content": f"Thinking about step {call}.",
                        }
                    ]
        start = time.perf_counter()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "tmpl_lint",
                "replay",
                str(log),
                "--tokenizer",
                str(SHARED / "tokenizers" / "qwen3"),
                "--session-key",
                "user",
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - start
        figures = json.loads(result.stdout)["template"]
        print(
            f"{SESSIONS * CALLS} requests in {elapsed:.1f} s: {SESSIONS * CALLS / elapsed:.0f} requests/s "
            f"(projected hit rate {figures['hit_rate']:.1%}, ideal {figures['ideal_hit_rate']:.1%})"
        )


if __name__ == "__main__":
    main()
