"""QA defects on main (session 13), each shown through the real CLI process."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from helpers import CORPUS, SHARED, SHARED_TEMPLATES, needs_shared

DEEP = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"


def cli(*args: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tmpl_lint", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


@pytest.fixture
def request_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["check", "TEMPLATE", "--chat-template-kwargs"],
        ["check", "TEMPLATE", "--default-chat-template-kwargs"],
        ["render", "REQUEST", "--template", "TEMPLATE", "--default-chat-template-kwargs"],
        ["diff", "REQUEST", "REQUEST", "--template", "TEMPLATE", "--default-chat-template-kwargs"],
        ["replay", "REQUEST", "--template", "TEMPLATE", "--default-chat-template-kwargs"],
        ["validate", "REQUEST", "--server", "http://127.0.0.1:9", "--default-chat-template-kwargs"],
    ],
)
def test_deeply_nested_template_kwargs_are_one_usage_error(command, request_file):
    template = str(CORPUS / "clean_chatml.jinja")
    args = [{"TEMPLATE": template, "REQUEST": str(request_file)}.get(arg, arg) for arg in command]
    result = cli(*args, DEEP)
    assert result.returncode == 2
    assert "RecursionError" not in result.stderr and "internal error" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].endswith("is nested more than 64 deep (template variables are shallow)")
    assert result.stdout == ""


@needs_shared
def test_pc002_fix_keeps_nemotron_medium_effort_on_the_last_turn(tmp_path):
    """Reading ns.last_user_idx as -1 stops the history rewrite and drops the last user turn's
    "{reasoning effort: efficient}" for every request that sets medium_effort, which the
    prover's scenarios never set: the verifier renders a single turn at each switch the
    template reads, and refuses the fix."""
    original = (SHARED_TEMPLATES / "nvidia--Nemotron-3.5.jinja").read_text()
    template = tmp_path / "n.jinja"
    template.write_text(original)
    request = tmp_path / "me.json"
    request.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"medium_effort": True}})
    )
    fixed = cli("check", str(template), "--fix", "--unsafe-fixes", "--no-cache", timeout=600)
    assert fixed.returncode == 1
    reason = "a single-turn conversation would render differently with medium_effort=true"
    assert f"{template}:114:92: not fixed PC002 [history-rewrite]: {reason}" in fixed.stdout.splitlines()
    assert template.read_text() == original
    rendered = cli("render", str(request), "--template", str(template), "--engine", "hf")
    assert rendered.returncode == 0
    assert [line for line in rendered.stdout.splitlines() if "reasoning effort" in line] == [
        "{reasoning effort: efficient}<|im_end|>"
    ]


class TrickleServer:
    """A render server on 127.0.0.1 that answers every request one byte a second (a socket
    timeout per read never fires), in its own process."""

    SCRIPT = """
import socket, sys, threading, time
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print(listener.getsockname()[1], flush=True)
def trickle(conn):
    try:
        conn.recv(65536)
        for byte in b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: 100000\\r\\n\\r\\n" + b" " * 100000:
            conn.sendall(bytes([byte]))
            time.sleep(1)
    except OSError:
        pass
    finally:
        conn.close()
while True:
    conn, _ = listener.accept()
    threading.Thread(target=trickle, args=(conn,), daemon=True).start()
"""

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", self.SCRIPT], stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.process.stdout.readline().strip()}"
        return self

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_validate_deadline_bounds_the_whole_run_against_a_server_that_trickles(tmp_path, engine):
    log = tmp_path / "two.jsonl"
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    log.write_text(json.dumps({"request": request}) + "\n" + json.dumps({"request": request}) + "\n")
    template = str(CORPUS / "clean_chatml.jinja")
    # --model: no GET /v1/models first (it trickles too).
    with TrickleServer() as server:
        started = time.monotonic()
        result = cli("validate", str(log), "--server", server.url, "--template", template, "--engine", engine,
                     "--model", "m", "--deadline", "3", timeout=120)  # fmt: skip
        took = time.monotonic() - started
    assert result.returncode == 2, result.stdout + result.stderr
    # Before: each request had its own 60 s (two requests, about 120 s).
    assert took < 3 + 10, took
    lines = result.stdout.splitlines()
    assert "  stopped: the 3 s deadline passed: 1 requests not asked" in lines, result.stdout
    said = [line for line in lines if line.startswith(f"  {log}:1: not compared: {server.url}/")]
    assert len(said) == 1 and " did not answer within " in said[0], result.stdout


LLAMACPP_GOLDEN = SHARED / "engine-golden" / "llamacpp-b10775.jsonl"
# Golden lines (1-based) where llama.cpp's render differs from transformers' (jinja2): Command R+
# tool use, EXAONE 4.0, DeepSeek-R1 (reasoning history) and Gemma 4.
DIFFERS_FROM_JINJA2 = [11, 61, 245, 331]


@pytest.mark.skipif(not LLAMACPP_GOLDEN.is_file(), reason="../shared is not present (fresh clone)")
@pytest.mark.parametrize("number", DIFFERS_FROM_JINJA2)
def test_render_with_engine_llamacpp_is_llama_cpps_render(tmp_path, number):
    line = json.loads(LLAMACPP_GOLDEN.read_text(encoding="utf-8").splitlines()[number - 1])
    context = line["context"]
    assert context["add_generation_prompt"] and line["error"] is None
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps({"messages": context["messages"], **({"tools": context["tools"]} if "tools" in context else {})})
    )
    template = str(SHARED_TEMPLATES / line["template"])
    rendered = {
        engine: cli("render", str(request), "--template", template, "--engine", engine, "--format", "json")
        for engine in ("llamacpp", "hf")
    }
    assert rendered["llamacpp"].returncode == 0, rendered["llamacpp"].stderr
    assert json.loads(rendered["llamacpp"].stdout)["text"] == line["text"]
    # The line tells the engines apart: transformers' jinja2 renders it otherwise, or refuses it.
    hf = rendered["hf"]
    assert (json.loads(hf.stdout)["text"] if hf.returncode == 0 else hf.stderr) != line["text"]


THINKING = "{{ enable_thinking if enable_thinking is defined else 'undef' }}"


def test_llamacpp_s_default_enable_thinking_in_render_and_diff_which_names_its_engine(tmp_path, request_file):
    template = tmp_path / "t.jinja"
    template.write_text(THINKING)
    rendered = cli("render", str(request_file), "--template", str(template), "--engine", "llamacpp")
    assert (rendered.returncode, rendered.stdout) == (0, "True\n--- llama.cpp b10775; no token ids without --tokenizer ---\n")
    for engine, chars, label in (("llamacpp", 4, "llama.cpp b10775"), ("hf", 5, "transformers")):
        diffed = cli("diff", str(request_file), str(request_file), "--template", str(template), "--engine", engine)
        assert diffed.returncode == 0, diffed.stderr
        lines = diffed.stdout.splitlines()
        assert lines[0].startswith(f"clean extension: turn 2 is turn 1 again ({chars} chars);")
        assert lines[1:] == [f"requests as {label} renders them"]


def test_an_audit_of_a_missing_folder_is_one_error_line(tmp_path):
    result = cli("audit", "./nothing-here", "--no-cache", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "tmpl-lint: error: ./nothing-here: no such folder\n"


def test_a_report_into_a_folder_that_takes_no_new_files_says_so(tmp_path):
    result = cli("check", str(CORPUS / "clean_chatml.jinja"), "-o", "/proc/version")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "tmpl-lint: error: cannot write the report: /proc/version: its folder /proc does not take new files "
        "(No such file or directory); nothing written\n"
    )
