"""Replay's peak memory against the size of its log, beside its floor in the same run.

The main process's peak resident memory (VmHWM) replaying generated agent logs of growing
size (each request sends the whole history back, as agents do), against the floor: the
same command on the first 20 lines (imports, the tokenizer, the template). The log is
streamed: the figure should grow with the sessions being replayed, not with the log.
The template stamps the time on every prompt, so every prompt is recomputed whole and the
traces are as large as they get. Qwen3's tokenizer from ../shared.
Run: python bench/replay_memory.py [MB ...]   (default 10 30)
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"
TOKENIZER = SHARED / "tokenizers" / "qwen3"
TEMPLATE = (
    "{{ 'Now: ' + strftime_now('%Y-%m-%d %H:%M:%S') + '\\n' }}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = [
    "the",
    "order",
    "ships",
    "tomorrow",
    "from",
    "our",
    "warehouse",
    "please",
    "wait",
    "while",
    "we",
    "check",
    "tracking",
    "number",
    "status",
]


def write_log(path: Path, megabytes: float, sessions: int = 20) -> int:
    """Interleaved sessions of short turns until the log holds ``megabytes``; its line count."""
    rng, start = random.Random(1), datetime(2026, 3, 1, 9)
    histories = {s: [{"role": "system", "content": "You are the support agent of a shop. " * 20}] for s in range(sessions)}
    written = lines = turn = 0
    with path.open("w") as stream:
        while written < megabytes * 1e6:
            for s in range(sessions):
                history = histories[s]
                history.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(3))})
                reply = {"role": "assistant", "content": " ".join(rng.choice(WORDS) for _ in range(4))}
                line = json.dumps(
                    {
                        "timestamp": (start + timedelta(minutes=turn, seconds=s)).isoformat(),
                        "request": {"model": "m", "user": f"u{s}", "messages": history},
                        "response": {"choices": [{"message": reply}]},
                    }
                )
                stream.write(line + "\n")
                written, lines = written + len(line) + 1, lines + 1
                history.append(reply)
            turn += 1
    return lines


def peak(log: Path, template: Path) -> tuple[int, float]:
    """Its main process's peak RSS in MB, and its wall time."""
    command = [sys.executable, "-m", "tmpl_lint", "replay", str(log), "--template", str(template)]
    command += ["--tokenizer", str(TOKENIZER), "--session-key", "user", "--jobs", "2"]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    high = 0
    while process.poll() is None:
        try:
            with open(f"/proc/{process.pid}/status") as status:
                high = max([high] + [int(line.split()[1]) for line in status if line.startswith("VmHWM")])
        except OSError:
            pass
        time.sleep(0.1)
    if process.returncode != 0:
        raise SystemExit(f"replay exited {process.returncode}")
    return high // 1024, time.monotonic() - started


def main() -> None:
    sizes = [float(size) for size in sys.argv[1:]] or [10.0, 30.0]
    with tempfile.TemporaryDirectory() as folder:
        template = Path(folder) / "clock.jinja"
        template.write_text(TEMPLATE)
        for size in sizes:
            log = Path(folder) / "log.jsonl"
            lines = write_log(log, size)
            small = Path(folder) / "small.jsonl"
            small.write_text("".join(log.read_text().splitlines(keepends=True)[:20]))
            floor, _ = peak(small, template)
            high, elapsed = peak(log, template)
            megabytes = log.stat().st_size / 1e6
            print(
                f"log {megabytes:5.1f} MB ({lines:,} requests): main process peak {high:,} MB "
                f"({high / megabytes:.1f}x the log), floor (20 requests) {floor:,} MB, above it {high - floor:,} MB; {elapsed:.1f} s"
            )


if __name__ == "__main__":
    main()
