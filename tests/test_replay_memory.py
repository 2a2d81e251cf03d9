"""Replay's memory bounded by the live sessions (issue 37): the traces spilled to temporary
files without a name that no exit leaves behind, a write that fails said in one line, and the
unbounded vLLM pool's compact table equal to the pool's own blocks. No ../shared needed:
templates are written here and measured in characters (no tokenizer)."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tmpl_lint.cli import main
from tmpl_lint.kv_cache.pools import CacheRequest, VllmPrefixCache
from tmpl_lint.replay import tracing

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Each render loops for a while, under the render limit: a replay of a few hundred requests lasts.
SLOW = (
    "{% set ns = namespace(n=0) %}{% for i in range(300) %}{% for j in range(300) %}{% set ns.n = ns.n + 1 %}"
    "{% endfor %}{% endfor %}" + CHATML
)


def chat_log(path, sessions=40, turns=6):
    """Sessions of growing conversations, interleaved in time, replies logged."""
    lines = []
    for session in range(sessions):
        history = [{"role": "system", "content": "You are a helpful assistant. " * 4}]
        for turn in range(turns):
            history = history + [{"role": "user", "content": f"question {turn} of session {session}"}]
            reply = {"role": "assistant", "content": f"answer {turn} to {session}, at some length. " * 3}
            stamp = 1_770_000_000 + 60 * turn + session
            entry = {"timestamp": stamp, "request": {"user": f"u{session}", "messages": history}, "response": reply}
            lines.append((stamp, json.dumps(entry)))
            history = history + [reply]
    path.write_text("".join(line + "\n" for _, line in sorted(lines)))
    return path


def test_the_unbounded_pool_serves_as_a_pool_too_large_to_evict(tmp_path):
    """The unbounded pool's table (hash and owner, grown as it fills) against the pool's own
    blocks, bounded far above what the requests fill: nothing is evicted there either, so
    every hit and every hit on another session's blocks is the same, request by request,
    also once sessions are finished and new ones come."""
    rng = random.Random(37)
    openings = [[rng.randrange(1000) for _ in range(rng.randrange(20, 90))] for _ in range(5)]
    unbounded, bounded = VllmPrefixCache(16, None), VllmPrefixCache(16, 10**6)
    prompts: dict[int, list[int]] = {}
    live = list(range(12))
    next_session = 12
    for number in range(1500):
        session = rng.choice(live)
        if session not in prompts:
            prompts[session] = list(rng.choice(openings))
        prompt = prompts[session] + [rng.randrange(1000) for _ in range(rng.randrange(1, 60))]
        if rng.random() < 0.1:  # the client edits its history: a departure
            prompt[rng.randrange(len(prompt))] = 5000
        generated = [rng.randrange(1000) for _ in range(rng.randrange(0, 40))]
        request = CacheRequest(session, prompt, generated, None, None)
        assert unbounded.serve(request) == bounded.serve(request), number
        prompts[session] = prompt + generated[:-1]
        if rng.random() < 0.05:  # the session ends; another starts
            unbounded.finish(session)
            bounded.finish(session)
            live.remove(session)
            live.append(next_session)
            next_session += 1
    assert unbounded.table is not None and unbounded.table.slots > 4096  # its tables grew
    assert unbounded.table.used == len(bounded.lookup)


def test_the_traces_lie_in_files_without_a_name(tmp_path, monkeypatch):
    """While the simulation reads them, the traces are in files of 0600 that no folder
    names (so no exit, not even SIGKILL, can leave them behind), one a child."""
    import tempfile

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    seen = []
    add = tracing.TraceStore.add

    def add_and_look(self, share, spilled):
        add(self, share, spilled)
        status = os.fstat(self.files[share].fileno())
        seen.append((stat.S_IMODE(status.st_mode), status.st_nlink, status.st_size > 0, os.listdir(temporary)))

    monkeypatch.setattr(tracing.TraceStore, "add", add_and_look)
    log = chat_log(tmp_path / "log.jsonl")
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    result = CliRunner().invoke(main, ["replay", str(log), "--template", str(template), "--session-key", "user", "--jobs", "2"])
    assert result.exit_code == 0, result.output
    assert "240 requests in 40 sessions" in result.output
    assert seen == [(0o600, 0, True, []), (0o600, 0, True, [])]  # two children, a file each


def _run(tmp_path, template_text, *, preexec=None):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    log = chat_log(tmp_path / "log.jsonl")
    template = tmp_path / "t.jinja"
    template.write_text(template_text)
    command = [sys.executable, "-m", "tmpl_lint", "replay", str(log), "--template", str(template), "--session-key", "user"]
    environment = {**os.environ, "TMPDIR": str(temporary)}
    process = subprocess.Popen(
        [*command, "--jobs", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        preexec_fn=preexec,
    )
    return process, temporary


@pytest.mark.parametrize(
    ("signal_number", "status", "word"),
    [(signal.SIGTERM, 143, "tmpl-lint: terminated"), (signal.SIGINT, 130, "tmpl-lint: interrupted"), (signal.SIGKILL, -9, None)],
)
def test_a_signal_while_tracing_leaves_no_traces(tmp_path, signal_number, status, word):
    """SIGTERM, Ctrl-C or SIGKILL to `tmpl-lint replay` while its children write their
    traces: the run says so in one line (SIGKILL: it cannot), and its children are gone
    with nothing left in the temporary folder."""
    process, temporary = _run(tmp_path, SLOW)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None and len(_children(process.pid)) < 2:
            time.sleep(0.05)
        children = _children(process.pid)
        assert len(children) == 2, "replay did not start its two render children"
        time.sleep(1.0)  # rendering and writing traces now
        process.send_signal(signal_number)
        _, error = process.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{child}").exists() for child in children):
            time.sleep(0.1)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == status
    if word is not None:
        assert error.strip().splitlines()[-1] == word
    assert list(temporary.iterdir()) == []


def _children(pid):
    """Its children, forked by any of its threads (parallel_map forks from threads)."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += children.read_text().split()
        except OSError:
            continue
    return found


def test_traces_that_cannot_be_written_are_one_error_line(tmp_path):
    """A temporary folder with no room for the traces (here: files limited to 4 kB): one
    line saying so and what to do, exit 2, no traceback, nothing left behind."""

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    process, temporary = _run(tmp_path, CHATML, preexec=small_files)
    output, error = process.communicate(timeout=120)
    assert process.returncode == 2, (output, error)
    assert "Traceback" not in error
    (line,) = error.strip().splitlines()
    assert "cannot write the replay's traces in " in line and "File too large" in line, line
    assert list(temporary.iterdir()) == []
