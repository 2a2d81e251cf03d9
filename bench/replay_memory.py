"""Replay's peak memory against the size of its log, beside its floor in the same run.

Two shapes of log, each written to a temporary folder at each size asked for, in arrival
order, with a bounded number of sessions live at any time (the log grows by sessions, as a
day of traffic does):

- ``sharegpt``: conversations of 1 to 8 turns of real prose (paragraphs of the standard
  library's sources, as bench/replay_speed.py's ShareGPT-shaped log), a new one every 10
  seconds, a turn every 45 seconds: about 36 live at once. Replies logged as messages.
- ``agent``: coding agents of 40 calls, 8 live at once, each call sending the whole
  history back with one more tool result (a source file of the standard library), the
  replies logged as tool calls.

``tmpl-lint replay`` runs on each log as a child of a fresh process, which prints its
``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the peak resident memory of the largest process
of the run (the main process or a renderer it forked). Beside it, the peak of the run's
processes' summed proportional set size (PSS: pages a fork shares are counted once),
sampled every 0.2 s, and the floor: a child that only imports tmpl_lint and loads the
tokenizer. Qwen3's template and tokenizer from ../shared.

``--where MB`` runs replay in one process (``--jobs 1``) under tracemalloc on a log of
that size and prints the largest holders at the peak of each stage.

Run: python bench/replay_memory.py [--shape sharegpt|agent|both] [--cache-blocks N] [MB ...]  (default 50 150 500)
     python bench/replay_memory.py --gb         (adds 1,000 MB)
     python bench/replay_memory.py --where 50 [--shape agent]
"""

from __future__ import annotations

import heapq
import json
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from replay_speed import READ_FILE_TOOLS, paragraphs, words_of

SHARED = Path(__file__).resolve().parents[2] / "shared"
TOKENIZER = SHARED / "tokenizers" / "qwen3"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
START = 1_770_000_000

MEASURED = """
import os, resource, subprocess, sys, time
process = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
peak_pss = 0

def tree(pid):
    found = [pid]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:  # children are forked from any thread (parallel_map's)
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                for child in children.read().split():
                    found += tree(int(child))
        except OSError:
            pass
    return found

while process.poll() is None:
    total = 0
    for pid in tree(process.pid):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                total += sum(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))
        except OSError:
            pass
    peak_pss = max(peak_pss, total)
    time.sleep(0.2)
error = process.stderr.read().decode(errors="replace")
print(process.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, peak_pss)
print(error[-2000:], file=sys.stderr)
"""

FLOOR = """
import sys
from pathlib import Path
import tmpl_lint.cli, tmpl_lint.commands
from tmpl_lint.tokenizer import load_tokenizer
load_tokenizer(Path(sys.argv[1]))
"""

WHERE = """
import sys, tracemalloc
from pathlib import Path
tracemalloc.start(1)
from tmpl_lint.replay import simulate, attribution
stages = []

def snapshot(name):
    current, peak = tracemalloc.get_traced_memory()
    stages.append((name, current, peak, tracemalloc.take_snapshot()))
    tracemalloc.reset_peak()

original_trace, original_simulate = simulate.trace_sessions, simulate.simulate

def trace_sessions(*args, **kwargs):
    snapshot("before tracing (log read, sessions grouped)")
    out = original_trace(*args, **kwargs)
    snapshot("traces gathered")
    return out

def simulated(*args, **kwargs):
    out = original_simulate(*args, **kwargs)
    snapshot("simulated")
    return out

simulate.trace_sessions, simulate.simulate = trace_sessions, simulated
from tmpl_lint.cli import main
try:
    main(["replay", sys.argv[1], "--tokenizer", sys.argv[2], "--session-key", "user", "--jobs", "1", "--format", "json"])
except SystemExit:
    pass
for name, current, peak, taken in stages:
    print(f"== {name}: traced now {current / 1e6:.1f} MB, peak since the last stage {peak / 1e6:.1f} MB", file=sys.stderr)
    for stat in taken.statistics("lineno")[:12]:
        frame = stat.traceback[0]
        print(f"   {stat.size / 1e6:8.1f} MB {stat.count:>10,} blocks  {frame.filename.split('site-packages/')[-1]}:{frame.lineno}",
              file=sys.stderr)
"""


def sharegpt_log(path: Path, megabytes: float, seed: int = 37) -> int:
    """Conversations of prose, a new one every 10 s, written in arrival order; its requests."""
    rng = random.Random(seed)
    texts = paragraphs()

    def prose(low: int, high: int) -> str:
        return words_of(rng, texts, low, high)

    pending: list[tuple[int, int, str]] = []  # (timestamp, sequence, line)
    written = requests = number = 0
    with path.open("w") as stream:
        while written < megabytes * 1e6:
            start = START + 10 * number
            while pending and pending[0][0] < start:
                line = heapq.heappop(pending)[2]
                stream.write(line)
                written, requests = written + len(line), requests + 1
            history: list[dict] = []
            for turn in range(rng.randrange(1, 9)):
                history = history + [{"role": "user", "content": prose(10, 150)}]
                reply = {"role": "assistant", "content": prose(30, 300)}
                request = {"user": f"c{number}", "model": "m", "messages": history}
                entry = {"timestamp": start + 45 * turn, "request": request, "response": {"choices": [{"message": reply}]}}
                heapq.heappush(pending, (start + 45 * turn, number * 8 + turn, json.dumps(entry) + "\n"))
                history = history + [reply]
            number += 1
    return requests


def agent_log(path: Path, megabytes: float, live: int = 8, calls: int = 40) -> int:
    """Agents of ``calls`` calls, ``live`` at a time, each replaced by a new one when it ends; its requests."""
    files = sorted(p for p in STDLIB.glob("*.py") if 2400 < p.stat().st_size < 4400)
    tools = READ_FILE_TOOLS
    started = 0
    agents: list[tuple[int, list[dict], int]] = []  # (number, history, calls made)

    def new_agent() -> tuple[int, list[dict], int]:
        nonlocal started
        started += 1
        history = [
            {"role": "system", "content": "You are a coding agent. Read files with the tools and answer precisely."},
            {"role": "user", "content": f"Task {started}: review the standard library."},
        ]
        return started, history, 0

    agents = [new_agent() for _ in range(live)]
    written = requests = tick = 0
    with path.open("w") as stream:
        while written < megabytes * 1e6:
            tick += 1
            for slot, (number, history, made) in enumerate(agents):
                source = files[(number * 7 + made) % len(files)]
                call_id = f"call_{number}_{made}"
                reply = {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": f"I should read {source.name} next.",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "read_file", "arguments": json.dumps({"path": source.name})},
                        }
                    ],
                }
                request = {"user": f"a{number}", "model": "m", "tools": tools, "messages": history}
                line = json.dumps(
                    {"timestamp": START + tick * 60 + slot, "request": request, "response": {"choices": [{"message": reply}]}}
                )
                stream.write(line + "\n")
                written, requests = written + len(line) + 1, requests + 1
                history = history + [reply, {"role": "tool", "tool_call_id": call_id, "content": source.read_text()}]
                agents[slot] = new_agent() if made + 1 == calls else (number, history, made + 1)
    return requests


def measured(command: list[str]) -> tuple[int, int, float]:
    """The run's largest process's peak RSS and its processes' peak summed PSS, in MB, and its seconds."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", MEASURED, *command], capture_output=True, text=True)
    elapsed = time.monotonic() - started
    code, rss, pss = map(int, result.stdout.split())
    if code != 0:
        sys.exit(f"{' '.join(command[:5])}...: exit {code}\n{result.stderr}")
    return rss // 1024, pss // 1024, elapsed


def replay_command(log: Path, extra: list[str]) -> list[str]:
    command = [sys.executable, "-m", "tmpl_lint", "replay", str(log), "--tokenizer", str(TOKENIZER)]
    return command + ["--session-key", "user", "--jobs", str(min(2, os.cpu_count() or 1)), "--format", "json", *extra]


def main() -> None:
    if not TOKENIZER.is_dir():
        sys.exit(f"needs {TOKENIZER}")
    arguments = sys.argv[1:]
    shape = arguments[arguments.index("--shape") + 1] if "--shape" in arguments else None
    writers = {"sharegpt": sharegpt_log, "agent": agent_log}
    if "--where" in arguments:
        size = float(arguments[arguments.index("--where") + 1])
        with tempfile.TemporaryDirectory() as folder:
            log = Path(folder) / "log.jsonl"
            requests = writers[shape or "sharegpt"](log, size)
            print(f"{shape or 'sharegpt'} log {log.stat().st_size / 1e6:.0f} MB, {requests:,} requests", flush=True)
            subprocess.run([sys.executable, "-c", WHERE, str(log), str(TOKENIZER)], check=True)
        return
    extra = (
        arguments[arguments.index("--cache-blocks") : arguments.index("--cache-blocks") + 2]
        if "--cache-blocks" in arguments
        else []
    )
    numbers = [
        arg
        for index, arg in enumerate(arguments)
        if not arg.startswith("--") and arguments[index - 1] not in ("--shape", "--cache-blocks")
    ]
    sizes = [float(size) for size in numbers] or [50.0, 150.0, 500.0]
    if "--gb" in arguments:
        sizes.append(1000.0)
    shapes = ["sharegpt", "agent"] if shape in (None, "both") else [shape]
    floor, _, _ = measured([sys.executable, "-c", FLOOR, str(TOKENIZER)])
    print(f"floor (imports tmpl_lint, loads the tokenizer): {floor:,} MB", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "log.jsonl"
        for name in shapes:
            for size in sizes:
                requests = writers[name](log, size)
                megabytes = log.stat().st_size / 1e6
                rss, pss, elapsed = measured(replay_command(log, extra))
                print(
                    f"{name:8}{' ' + ' '.join(extra) if extra else ''} log {megabytes:7,.0f} MB ({requests:>9,} requests): peak RSS {rss:>6,} MB "
                    f"({rss / megabytes:4.2f}x the log, {rss - floor:>6,} MB above the floor), "
                    f"peak PSS of all its processes {pss:>6,} MB; {elapsed:6.0f} s (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
                log.unlink()


if __name__ == "__main__":
    main()
