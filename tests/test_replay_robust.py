"""`tmpl-lint replay` on hostile or mistaken input: one bad log line is one error line and the
report covers the rest; resources are bounded before they are allocated; a killed replay
leaves no child computing. No ../shared needed: templates are written here and measured in
characters (no tokenizer)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from click.testing import CliRunner

from tmpl_lint.cli import main

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def replay(*args):
    return CliRunner().invoke(main, ["replay", *map(str, args)])


def request(user, content, timestamp="2026-03-01T09:00:00Z", **extra):
    return {"timestamp": timestamp, "request": {"user": user, "messages": [{"role": "user", "content": content}]}, **extra}


def write_log(path, entries):
    path.write_text("".join((entry if isinstance(entry, str) else json.dumps(entry)) + "\n" for entry in entries))
    return path


def template(tmp_path, text=CHATML):
    path = tmp_path / "chatml.jinja"
    path.write_text(text)
    return path


# "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n": 55 characters.
HELLO_CHARS = 55


def test_one_bad_line_of_each_kind_is_one_error_line_and_the_rest_is_reported(tmp_path):
    """Tool-call arguments nested 1,500 deep, a token id of 10^30, an ISO timestamp whose
    offset takes it before year 1, and a number of 5,000 digits: each line gets exactly
    one error line naming it, and the two good requests are reported."""
    deep = "[" * 1500 + "]" * 1500
    tool_call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": ' + deep + "}"}}
    nested = {
        "timestamp": "2026-03-01T09:00:01Z",
        "request": {
            "user": "b",
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [tool_call]},
                {"role": "tool", "content": "ok"},
            ],
        },
    }
    huge_id = request("c", "hi", "2026-03-01T09:00:02Z", response={"token_ids": [1, 10**30]})
    edge = request("d", "hi", "0001-01-01T00:00:00+01:00")
    huge_number = '{"timestamp": 1' + "0" * 5000 + ', "request": {"user": "e", "messages": [{"role": "user", "content": "hi"}]}}'
    log = write_log(tmp_path / "log.jsonl", [request("a", "hello"), nested, huge_id, edge, huge_number, request("f", "hello")])
    result = replay(log, "--template", template(tmp_path), "--session-key", "user", "--format", "json")
    assert result.stderr.splitlines() == [
        f"tmpl-lint: error: {log}:2: tool-call arguments nested too deeply to read",
        f"tmpl-lint: error: {log}:3: response token_ids: token id 1000000000000000000000000000000 is over 4294967295, beyond any vocabulary",
        f"tmpl-lint: error: {log}:4: timestamp '0001-01-01T00:00:00+01:00' is out of range: in UTC it falls outside years 1 to 9999",
        f"tmpl-lint: error: {log}:5: invalid JSON: a number of over 4,300 digits",
    ]
    assert result.exit_code == 2
    report = json.loads(result.stdout)["template"]
    assert (report["requests"], report["sessions"]) == (2, 2)
    # Two sessions, one request each: all cold but the 16-character block of the other's.
    assert report["prefix_cache_queries"] == 2 * HELLO_CHARS
    assert report["prefix_cache_hits"] == 48


def test_a_json_array_is_one_error_line(tmp_path):
    """A pretty-printed JSON array of requests (as `json.dump(requests, f, indent=2)` writes
    it) is one error naming what it is, not an error per line and an all-zero report."""
    log = tmp_path / "requests.json"
    log.write_text(json.dumps([request("a", "hello")["request"], request("b", "hello")["request"]], indent=2))
    result = replay(log, "--template", template(tmp_path))
    assert result.stderr.splitlines() == [
        f"tmpl-lint: error: {log}: a JSON array, not JSON Lines: replay reads one request object per line "
        f"(jq -c '.[]' {log} writes them so)"
    ]
    assert (result.exit_code, result.stdout) == (2, "")


def test_the_headline_counts_the_sessions_replayed(tmp_path):
    """A session whose only request the template refuses is no session of the figures: never
    "1 request in 2 sessions"."""
    text = "{% if messages[0].content == 'boom' %}{{ raise_exception('no') }}{% endif %}" + CHATML
    log = write_log(tmp_path / "log.jsonl", [request("a", "hello"), request("b", "boom", "2026-03-01T09:00:01Z")])
    result = replay(log, "--template", template(tmp_path, text), "--session-key", "user")
    assert result.exit_code == 2
    assert (
        result.stdout.splitlines()[0]
        == "template: 1 request in 1 session, vLLM prefix cache (blocks of 16, unbounded pool), requests as vLLM 0.33.0 handles them"
    )


def test_slots_are_bounded_before_they_are_allocated(tmp_path):
    log = write_log(tmp_path / "log.jsonl", [request("a", "hello")])
    result = replay(log, "--template", template(tmp_path), "--cache-model", "llamacpp", "--slots", "1000000000")
    assert result.exit_code == 2
    assert "Invalid value for '--slots': 1000000000 is not in the range 1<=x<=65536." in result.output
    assert "MemoryError" not in result.output


def _descendants(pid):
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        for task in os.listdir(f"/proc/{parent}/task") if os.path.isdir(f"/proc/{parent}/task") else ():
            try:
                with open(f"/proc/{parent}/task/{task}/children") as stream:
                    children = [int(child) for child in stream.read().split()]
            except OSError:
                continue
            found.extend(children)
            stack.extend(children)
    return found


def _running(pid):
    """Alive and not a zombie waiting for a reaper."""
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_render_children_die_with_a_killed_replay(tmp_path):
    """SIGKILL of `tmpl-lint replay` while its children render: within a few seconds no
    child is left computing (they used to run on for a minute)."""
    # Each render loops for a while, under the render limit: the children are busy for long.
    slow = (
        "{% set ns = namespace(n=0) %}{% for i in range(500) %}{% for j in range(300) %}{% set ns.n = ns.n + 1 %}"
        "{% endfor %}{% endfor %}" + CHATML
    )
    log = write_log(
        tmp_path / "log.jsonl",
        [
            request(f"u{number}", f"question {number}", f"2026-03-01T09:{number // 60:02d}:{number % 60:02d}Z")
            for number in range(240)
        ],
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "tmpl_lint", "replay", str(log), "--template", str(template(tmp_path, slow)), "--jobs", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    children = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(children) < 2 and process.poll() is None:
            time.sleep(0.1)
            children = _descendants(process.pid)
        assert len(children) == 2, "replay did not start its two render children"
        time.sleep(0.5)  # rendering now
        assert all(_running(child) for child in children)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_running(child) for child in children):
            time.sleep(0.1)
        assert [child for child in children if _running(child)] == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for child in children:  # a failed run leaves nothing behind either
            if _running(child):
                os.kill(child, signal.SIGKILL)


def two_turns(tmp_path):
    """One session: "hello", then "hello", the reply "hi", "again"; no reply logged (the
    first one's is taken from the second request)."""
    first = [{"role": "user", "content": "hello"}]
    second = first + [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]
    return write_log(
        tmp_path / "log.jsonl",
        [
            {"timestamp": "2026-03-01T09:00:00Z", "request": {"user": "u", "messages": first}},
            {"timestamp": "2026-03-01T09:01:00Z", "request": {"user": "u", "messages": second}},
        ],
    )


def test_compare_prints_the_delta(tmp_path):
    """CHATML: the second prompt (123 characters) extends the first (55) and its reply
    "hi<|im_end|>", of which 66 characters are cached (the last generated one never is): 4
    blocks, 64 hits of 178, 36.0%. A template that prints the message count first departs
    at character 0: no hit, and the 64 characters the session had computed are the
    template's loss."""
    log = two_turns(tmp_path)
    counting = tmp_path / "counting.jinja"
    counting.write_text("{{ messages | length }}" + CHATML)
    result = replay(log, "--template", template(tmp_path), "--compare", counting, "--session-key", "user")
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout.splitlines()[-1] == (
        "compare against template: hit rate 36.0% -> 0.0% (-36.0 points); chars lost 0 -> 64, to the template 0 -> 64"
    )


def test_a_template_that_does_not_parse_is_one_error(tmp_path):
    log = two_turns(tmp_path)
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }\n")
    result = replay(log, "--template", broken, "--session-key", "user")
    assert result.stderr.splitlines() == [f"tmpl-lint: error: {broken}:1:37: the template does not parse: unexpected '}}'"]
    assert (result.exit_code, result.stdout) == (2, "")


def test_a_progress_bar_on_a_terminal(tmp_path):
    """On a terminal, a replay that lasts over a second shows a bar naming the template and
    counting requests; piped, it shows none (the other tests)."""
    import pty

    slow = (
        "{% set ns = namespace(n=0) %}{% for i in range(400) %}{% for j in range(300) %}{% set ns.n = ns.n + 1 %}"
        "{% endfor %}{% endfor %}" + CHATML
    )
    log = write_log(
        tmp_path / "log.jsonl",
        # 24 requests of ~0.1 s each: the run outlasts the bar's 1 s delay even on an idle
        # machine with the template's code cached, while no render nears its time limit
        [request(f"u{number}", f"question {number}", f"2026-03-01T09:00:{number:02d}Z") for number in range(24)],
    )
    path = template(tmp_path, slow)
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "tmpl_lint", "replay", str(log), "--template", str(path), "--jobs", "1"],
        stdout=subprocess.DEVNULL,
        stderr=terminal,
        env={**os.environ, "COLUMNS": "200", "TERM": "xterm"},
    )
    os.close(terminal)
    shown = b""
    try:
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            shown += chunk
    finally:
        process.wait(timeout=120)
        os.close(controller)
    assert process.returncode == 0
    assert f"replaying {path}".encode() in shown
    assert re.search(rb"\d+/24", shown)


REASONING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def reasoning_log(tmp_path, reply_field, history_field="reasoning", name="log.jsonl"):
    """One session: "hello", answered "hi" after reasoning "think hard" (logged under
    ``reply_field``), then the history sent back with it under ``history_field``."""
    first = [{"role": "user", "content": "hello"}]
    second = first + [
        {"role": "assistant", "content": "hi", history_field: "think hard"},
        {"role": "user", "content": "again"},
    ]
    reply = {"role": "assistant", "content": "hi", reply_field: "think hard"}
    return write_log(
        tmp_path / name,
        [
            {
                "timestamp": "2026-03-01T09:00:00Z",
                "request": {"user": "u", "messages": first},
                "response": {"choices": [{"message": reply}]},
            },
            {"timestamp": "2026-03-01T09:01:00Z", "request": {"user": "u", "messages": second}},
        ],
    )


def test_a_reply_s_reasoning_is_read_under_any_of_its_names(tmp_path):
    """The model generated "<think>think hard</think>hi<|im_end|>" (37 characters) whatever
    the log calls the field: after the 55-character prompt, 91 characters are cached (the
    last generated one never is), 5 blocks; the second prompt (148) extends them: 80 hits
    of 203, nothing lost. Read under `reasoning_content` alone, a `thinking` reply was
    rendered without its reasoning, and the template was blamed for the difference."""
    path = template(tmp_path, REASONING_TEMPLATE)
    for field in ("reasoning_content", "reasoning", "thinking"):
        log = reasoning_log(tmp_path, field, name=f"{field}.jsonl")
        result = replay(log, "--template", path, "--session-key", "user", "--format", "json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)["template"]
        assert (report["prefix_cache_hits"], report["prefix_cache_queries"], report["lost_tokens"]) == (80, 203, 0), field


def test_the_reasoning_fields_of_the_log_are_said_once(tmp_path):
    """Which fields the log carries, and what the engine passes of each to the template
    (asked of the engine profile; vLLM reads no `thinking`), in one note line."""
    log = reasoning_log(tmp_path, "thinking", history_field="thinking")
    result = replay(log, "--template", template(tmp_path, REASONING_TEMPLATE), "--session-key", "user", "--engine", "vllm")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "tmpl-lint: note: 1 request message carries `thinking`, which vLLM 0.33.0 does not pass to the template; "
        "1 logged reply carries `thinking`, read as the reply's reasoning"
    ]


def test_diff_says_the_reasoning_fields_once(tmp_path):
    """diff reads its requests' reasoning fields as replay does, and says the same once."""
    first = {"messages": [{"role": "user", "content": "hello"}]}
    second = {
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi", "thinking": "think hard"},
            {"role": "user", "content": "again"},
        ]
    }
    paths = []
    for name, body in (("first.json", first), ("second.json", second)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(body))
    result = CliRunner().invoke(
        main, ["diff", *map(str, paths), "--template", str(template(tmp_path, REASONING_TEMPLATE)), "--engine", "vllm"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "tmpl-lint: note: 1 request message carries `thinking`, which vLLM 0.33.0 does not pass to the template"
    ]


def test_a_log_read_from_a_pipe_gives_the_file_s_figures(tmp_path):
    """A log streamed through a pipe (`<(zcat log.gz)`) is read once: its copy serves the
    render children (200 requests or more: two of them), and the figures are the file's."""
    entries = []
    for turn in range(8):
        for user in range(30):
            history = [{"role": "user", "content": f"u{user} turn {number}"} for number in range(turn + 1)]
            entries.append(request(f"u{user}", "x", f"2026-03-01T09:{turn:02d}:{user:02d}Z"))
            entries[-1]["request"]["messages"] = history
    log = write_log(tmp_path / "log.jsonl", entries)
    path = template(tmp_path)
    from_file = replay(log, "--template", path, "--jobs", "2", "--format", "json")
    assert from_file.exit_code == 0, from_file.output
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def feed():  # opening for writing waits for replay to open it for reading
        with open(fifo, "wb") as stream:
            stream.write(log.read_bytes())

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    from_pipe = replay(fifo, "--template", path, "--jobs", "2", "--format", "json")
    writer.join(timeout=30)
    assert from_pipe.exit_code == 0, from_pipe.output
    assert json.loads(from_pipe.stdout) == json.loads(from_file.stdout)
    assert json.loads(from_file.stdout)["template"]["requests"] == 240
