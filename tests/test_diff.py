"""`tmpl-lint diff`: two request bodies, rendered locally or through a vLLM render endpoint
(a local HTTP server that speaks the documented request and response)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner
from helpers import (
    CORPUS,
    SHARED_TEMPLATES,
    SHARED_TOKENIZERS,
    needs_permissions,
    needs_shared,
    run_unprivileged,
    transformers_tokenizer,
)

from tmpl_lint.cli import main
from tmpl_lint.server import ServerError, VLLMServer, prompt_token_ids

USER_1 = {"role": "user", "content": "What is 2+2?"}
REPLY = {
    "role": "assistant",
    "content": "4",
    "reasoning": "Two and two make four.",
    "reasoning_content": "Two and two make four.",
}
USER_2 = {"role": "user", "content": "And 3+3?"}


def write_turns(tmp_path, first, second):
    paths = []
    for name, body in (("turn1.json", first), ("turn2.json", second)):
        path = tmp_path / name
        path.write_text(json.dumps(body))
        paths.append(str(path))
    return paths


def run(*args):
    result = CliRunner().invoke(main, ["diff", *args])
    return result.exit_code, result.stdout, result.stderr


def test_clean_extension_in_characters(tmp_path):
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1, REPLY, USER_2]})
    code, out, _ = run(*turns, "--template", str(CORPUS / "clean_chatml.jinja"), "--format", "json")
    assert code == 0
    result = json.loads(out)
    assert result["first_divergence_token"] is None
    assert result["unit"] == "char"
    first_len, second_len = result["prompt_tokens"]
    assert result["reusable_tokens"] == first_len // 16 * 16
    assert result["cause"] == "clean-extension"


def test_an_unreadable_extra_template_does_not_stop_a_diff_of_the_one_in_force(tmp_path):
    # A model folder whose default template reads fine, beside an empty extra template: the
    # server renders the default, and the diff is of it (the extra one's error was the
    # whole answer).
    model = tmp_path / "model"
    (model / "additional_chat_templates").mkdir(parents=True)
    (model / "chat_template.jinja").write_text((CORPUS / "clean_chatml.jinja").read_text())
    (model / "additional_chat_templates" / "draft.jinja").write_text("")
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1, REPLY, USER_2]})
    code, out, err = run(*turns, "--template", str(model), "--format", "json")
    # (the note says which reasoning fields the requests carry, and what the engine passes)
    assert (code, [line for line in err.splitlines() if not line.startswith("tmpl-lint: note: ")]) == (0, [])
    assert json.loads(out)["cause"] == "clean-extension"


def test_history_rewrite_in_characters(tmp_path):
    turns = write_turns(tmp_path, {"messages": [USER_1, REPLY]}, {"messages": [USER_1, REPLY, USER_2]})
    code, out, _ = run(*turns, "--template", str(CORPUS / "PC002_history_rewrite.jinja"), "--format", "json", "--block-size", "4")
    assert code == 1
    result = json.loads(out)
    # the assistant turn rendered with its reasoning in turn 1, without it in turn 2
    assert result["first_divergence_token"] == result["first_divergence_char"]
    assert (result["message_index"], result["role"], result["cause"]) == (1, "assistant", "history-rewrite")
    assert result["reusable_tokens"] == result["first_divergence_token"] // 4 * 4
    assert result["block_size"] == 4


@pytest.mark.skipif(not SHARED_TOKENIZERS.is_dir(), reason="../shared is not present (fresh clone)")
def test_qwen3_tokens_against_transformers(tmp_path):
    pytest.importorskip("transformers")
    first = {"messages": [USER_1, REPLY], "chat_template_kwargs": {"enable_thinking": True}}
    second = {"messages": [USER_1, REPLY, USER_2]}
    turns = write_turns(tmp_path, first, second)
    code, out, _ = run(*turns, "--tokenizer", str(SHARED_TOKENIZERS / "qwen3"), "--format", "json")
    assert code == 1
    result = json.loads(out)
    tokenizer = transformers_tokenizer("qwen3")
    ids = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                body["messages"], add_generation_prompt=True, tokenize=False, **body.get("chat_template_kwargs", {})
            ),
            add_special_tokens=False,
        )
        for body in (first, second)
    ]
    expected = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
    assert result["first_divergence_token"] == expected
    assert result["prompt_tokens"] == [len(ids[0]), len(ids[1])]
    assert result["unit"] == "token"
    assert (result["message_index"], result["role"]) == (1, "assistant")


@needs_shared
def test_the_same_text_split_into_other_tokens_is_placed_where_the_token_starts(tmp_path):
    # Qwen3.5 opens the reply with "<think>\n"; once a tool result follows, history prints
    # "<think>\n\n</think>": turn 1's text is a prefix of turn 2's, but its last token, "\n",
    # is part of "\n\n" there. Placed where that token starts, as transformers' tokenizer
    # offsets say (diff placed it one character on, at the end of turn 1).
    pytest.importorskip("transformers")
    user = {"role": "user", "content": "What is the weather in Paris?"}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    reply = {"role": "assistant", "content": "Checking the weather in Paris.", "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather.", "parameters": {}}}]
    first, second = {"messages": [user], "tools": tools}, {"messages": [user, reply, result], "tools": tools}
    template = SHARED_TEMPLATES / "Qwen--Qwen3.5-4B.jinja"
    turns = write_turns(tmp_path, first, second)
    # transformers' own render is the truth here, and it takes arguments as an object (vLLM answers 400)
    args = ("--template", str(template), "--tokenizer", str(SHARED_TOKENIZERS / "qwen3"), "--format", "json", "--engine", "hf")
    code, out, _ = run(*turns, *args)
    assert code == 1
    found = json.loads(out)
    tokenizer = transformers_tokenizer("qwen3")
    text = tokenizer.apply_chat_template(
        first["messages"], tools=tools, chat_template=template.read_text(), add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<think>\n")
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert (found["first_divergence_token"], found["first_divergence_char"]) == (len(offsets) - 1, offsets[-1][0])
    assert found["cause"] == "generation-prompt"


@needs_shared
def test_the_server_s_default_chat_template_kwargs_render_as_written_into_each_request(tmp_path):
    kwargs = {"enable_thinking": False}
    plain = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1, REPLY, USER_2]})
    written = [tmp_path / name for name in ("written1.json", "written2.json")]
    written[0].write_text(json.dumps({"messages": [USER_1], "chat_template_kwargs": kwargs}))
    written[1].write_text(json.dumps({"messages": [USER_1, REPLY, USER_2], "chat_template_kwargs": kwargs}))
    args = ("--tokenizer", str(SHARED_TOKENIZERS / "qwen3"), "--format", "json")
    told = run(*plain, *args, "--default-chat-template-kwargs", json.dumps(kwargs))
    each = run(*map(str, written), *args)
    untold = run(*plain, *args)
    assert told == each
    assert json.loads(told[1])["prompt_tokens"] != json.loads(untold[1])["prompt_tokens"]


def test_bad_request_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": "nope"}')
    code, _, err = run(str(bad), str(bad), "--template", str(CORPUS / "clean_chatml.jinja"))
    assert code == 2
    assert err == f"tmpl-lint: error: {bad}: expected a chat completion request with a non-empty messages list\n"


@needs_permissions
def test_an_unreadable_turn_is_one_error_line(tmp_path):
    first, second = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1]})
    os.chmod(second, 0)
    result = run_unprivileged("diff", first, second, "--template", str(CORPUS / "clean_chatml.jinja"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"tmpl-lint: error: {second}: permission denied\n"


def test_a_template_that_does_not_parse_is_blamed_not_the_request(tmp_path):
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1, REPLY, USER_2]})
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }\n{% endfor %}\n")  # the stray } is at column 37
    code, out, err = run(*turns, "--template", str(bad))
    assert (code, out) == (2, "")
    # (the reasoning fields the requests carry are said in a note of their own)
    assert errors(err) == [f"tmpl-lint: error: {bad}:1:37: the template does not parse: unexpected '}}'"]
    # inside tokenizer_config.json: the template's own line and column, after the file
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "hi\n" + bad.read_text()}))
    code, _, err = run(*turns, "--template", str(config))
    assert code == 2
    assert errors(err) == [
        f"tmpl-lint: error: {config}: template line 2, column 37: the template does not parse: unexpected '}}'"
    ]


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("tmpl-lint: note:")]


def test_needs_a_template_or_server(tmp_path):
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1]})
    code, _, err = run(*turns)
    assert code == 2
    assert "give --template or --tokenizer" in err


# -- the vLLM client against a local server --------------------------------------------


class FakeVLLM(BaseHTTPRequestHandler):
    """Speaks /v1/models, /v1/chat/completions/render and /v1/chat/completions."""

    models = ["served-model"]
    render_enabled = True
    render_status = 200
    ids_answer = None  # what the render endpoint answers as token_ids, instead of the ids
    seen: list = []

    def log_message(self, *args):
        pass

    def reply(self, status, document):
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": name, "object": "model"} for name in self.models]})
        else:
            self.reply(404, {"detail": "Not Found"})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, request))
        ids = [100 + len(message["content"]) for message in request["messages"]]
        if request["model"] not in self.models:
            # as vLLM answers a model it does not serve
            message = f"The model `{request['model']}` does not exist."
            self.reply(404, {"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}})
        elif self.path == "/v1/chat/completions/render":
            if not self.render_enabled:
                self.reply(404, {"detail": "Not Found"})
            elif self.render_status != 200:
                self.reply(self.render_status, {"error": {"message": "model does not exist", "code": self.render_status}})
            else:
                ids = ids if self.ids_answer is None else self.ids_answer
                self.reply(200, {"request_id": "r1", "token_ids": ids, "sampling_params": {}, "model": request["model"]})
        elif self.path == "/v1/chat/completions":
            assert request["max_tokens"] == 1 and request["return_token_ids"] is True
            self.reply(200, {"choices": [{"index": 0, "message": {"content": "x"}, "token_ids": [7]}], "prompt_token_ids": ids})
        else:
            self.reply(404, {"detail": "Not Found"})


@contextlib.contextmanager
def serving():
    """A FakeVLLM on a free local port: (its handler class, its URL)."""
    handler = type("Handler", (FakeVLLM,), {"seen": [], "models": ["served-model"], "render_enabled": True, "render_status": 200})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # shutdown() waits for the loop's next poll: at the default 0.5 s, half a second per test
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield handler, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def server():
    with serving() as running:
        yield running


def test_render_endpoint_gives_token_ids_and_model_from_v1_models(server):
    handler, url = server
    assert prompt_token_ids(url, {"messages": [USER_1, USER_2]}) == [112, 108]
    path, request = handler.seen[-1]
    assert path == "/v1/chat/completions/render"
    assert request["model"] == "served-model"


def test_falls_back_to_return_token_ids_when_render_is_off(server):
    handler, url = server
    handler.render_enabled = False
    assert prompt_token_ids(url, {"messages": [USER_1]}) == [112]
    assert [path for path, _ in handler.seen] == ["/v1/chat/completions/render", "/v1/chat/completions"]


def test_several_models_need_model(server):
    handler, url = server
    handler.models = ["a", "b"]
    with pytest.raises(ServerError, match=r"serves several models \(a, b\): pass --model"):
        prompt_token_ids(url, {"messages": [USER_1]})
    assert prompt_token_ids(url, {"messages": [USER_1]}, model="b") == [112]


def test_server_error_message_is_reported(server):
    handler, url = server
    handler.render_status = 400
    with pytest.raises(ServerError, match="answered HTTP 400: model does not exist"):
        prompt_token_ids(url, {"messages": [USER_1]}, model="served-model")


def test_a_model_the_server_does_not_serve_is_reported_as_such(server):
    handler, url = server
    with pytest.raises(ServerError) as raised:
        prompt_token_ids(url, {"messages": [USER_1]}, model="x")
    assert str(raised.value) == f"{url} does not serve model 'x' (HTTP 404: The model `x` does not exist.): pass --model"
    # not mistaken for a render endpoint that is off: no fallback asked
    assert [path for path, _ in handler.seen] == ["/v1/chat/completions/render"]


def test_the_served_model_replaces_one_it_does_not_serve_and_says_so(server, tmp_path):
    handler, url = server
    turns = write_turns(
        tmp_path, {"model": "Qwen/Qwen3-8B", "messages": [USER_1]}, {"model": "Qwen/Qwen3-8B", "messages": [USER_1, USER_2]}
    )
    code, out, err = run(*turns, "--server", url, "--format", "json")
    assert code == 0
    assert json.loads(out)["first_divergence_token"] is None
    assert (
        err
        == f"tmpl-lint: note: {url} does not serve 'Qwen/Qwen3-8B', the request's model: using 'served-model', the model it serves\n"
    )
    assert [request["model"] for _, request in handler.seen] == ["served-model", "served-model"]
    # a model it serves is used as the request names it, with nothing to say
    handler.models = ["served-model", "Qwen/Qwen3-8B"]
    code, _, err = run(*turns, "--server", url)
    assert (code, err) == (0, "")
    assert handler.seen[-1][1]["model"] == "Qwen/Qwen3-8B"
    # several served, none the request's: the user chooses
    handler.models = ["a", "b"]
    code, _, err = run(*turns, "--server", url)
    assert (code, err) == (2, f"tmpl-lint: error: {url} serves several models (a, b), not 'Qwen/Qwen3-8B': pass --model\n")


def test_diff_with_a_model_it_does_not_serve_exits_2_naming_it(server, tmp_path):
    handler, url = server
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1]})
    code, _, err = run(*turns, "--server", url, "--model", "nope")
    assert code == 2
    assert (
        err == f"tmpl-lint: error: {url} does not serve model 'nope' (HTTP 404: The model `nope` does not exist.): pass --model\n"
    )


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(ServerError, match="cannot reach http://127.0.0.1:9/v1/models"):
        prompt_token_ids("http://127.0.0.1:9", {"messages": [USER_1]})


def test_diff_through_the_server(server, tmp_path):
    handler, url = server
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_2, USER_1]})
    code, out, _ = run(*turns, "--server", url, "--format", "json")
    assert code == 1
    result = json.loads(out)
    assert result["first_divergence_token"] == 0
    assert result["prompt_tokens"] == [1, 2]
    assert result["unit"] == "token"


@pytest.mark.parametrize("ids", [["112", "108"], [None], [112, None], [1.5], [True], [-1], [2**40], "112", {"0": 112}])
def test_token_ids_a_server_answers_that_are_not_ids_are_one_error_line(server, tmp_path, ids):
    # Strings or nulls compared as tokens said "clean extension" and exit 0.
    handler, url = server
    handler.ids_answer = ids
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1, USER_2]})
    code, out, err = run(*turns, "--server", url)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert err.startswith(f"tmpl-lint: error: {url}/v1/chat/completions/render answered ")
    assert ("without token ids" in err) == (not isinstance(ids, list))


@contextlib.contextmanager
def raw_server(answer):
    """A TCP server on a free local port that reads each request's head and then calls
    ``answer(connection)``, in a thread per connection: its URL."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    stop = threading.Event()

    def handle(connection):
        with connection:
            connection.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                head += chunk
            with contextlib.suppress(OSError):
                answer(connection)

    def serve():
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=handle, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_a_server_that_answers_a_byte_at_a_time_is_stopped_at_the_request_deadline(tmp_path, monkeypatch):
    # The timeout was per read: a byte every 50 ms never met it, however long the answer took.
    import time

    from tmpl_lint import server as client

    monkeypatch.setattr(client, "TIMEOUT_SECONDS", 1.0)
    body = json.dumps({"object": "list", "data": [{"id": "served-model"}]}).encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    def trickle(connection):
        for byte in answer:
            connection.sendall(bytes([byte]))
            time.sleep(0.05)  # the whole answer: about 6 s

    with raw_server(trickle) as url:
        turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1, USER_2]})
        started = time.monotonic()
        code, out, err = run(*turns, "--server", url)
        elapsed = time.monotonic() - started
    assert (code, out, err) == (2, "", f"tmpl-lint: error: {url}/v1/models did not answer within 1 s\n")
    assert elapsed < 3


def test_an_endless_answer_is_read_no_further_than_the_size_cap(tmp_path, monkeypatch):
    # GET /v1/models was read whole: an endless body ended in MemoryError.
    from tmpl_lint import server as client

    monkeypatch.setattr(client, "MAX_RESPONSE_BYTES", 1 << 20)
    sent = []

    def endless(connection):
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[")
        chunk = b"0," * 32768
        for _ in range(4096):  # 256 MB, should it be read whole
            connection.sendall(chunk)
            sent.append(len(chunk))

    with raw_server(endless) as url:
        turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1, USER_2]})
        code, out, err = run(*turns, "--server", url)
    assert (code, out, err) == (
        2,
        "",
        f"tmpl-lint: error: {url}/v1/models answered more than {1 << 20} bytes: not read further\n",
    )
    assert sum(sent) < 64 << 20  # the server was stopped, not drained


def test_a_redirect_to_another_host_is_refused_and_one_to_the_same_is_followed(server, tmp_path):
    handler, url = server
    port = url.rsplit(":", 1)[1]
    moved = {"/v1/models": f"http://localhost:{port}/v1/models"}  # another host name: refused

    class Redirecting(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/real/models":
                body = json.dumps({"data": [{"id": "behind-a-redirect"}]}).encode()
                self.send_response(200)
            else:
                body = b""
                self.send_response(302)
                self.send_header("Location", moved[self.path])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True).start()
    try:
        front = f"http://127.0.0.1:{httpd.server_address[1]}"
        turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1, USER_2]})
        code, out, err = run(*turns, "--server", front)
        assert (code, out) == (2, "")
        assert err == f"tmpl-lint: error: {front}/v1/models redirects to another host ({moved['/v1/models']}): refused\n"
        assert handler.seen == []
        moved["/v1/models"] = "/real/models"  # the same host: followed
        assert VLLMServer(front).served() == ["behind-a-redirect"]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_diff_server_unreachable_exit_2(tmp_path):
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1]})
    code, _, err = run(*turns, "--server", "http://127.0.0.1:9")
    assert code == 2
    assert err.startswith("tmpl-lint: error: cannot reach http://127.0.0.1:9/v1/models")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("notaurl", "is not an http:// or https:// URL with a host (such as http://localhost:8000)"),
        ("localhost:8000", "is not an http:// or https:// URL with a host (such as http://localhost:8000)"),
        ("http://localhost:port", "is not a URL: Port could not be cast to integer value as 'port'"),
    ],
)
def test_a_server_that_is_not_a_url_is_a_usage_error_naming_it(tmp_path, url, reason):
    # urllib's ValueError was an internal error
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1]})
    code, out, err = run(*turns, "--server", url)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == f"Error: --server {url!r} {reason}"
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"messages": [USER_1]}) + "\n")
    result = CliRunner().invoke(main, ["replay", str(log), "--template", str(CORPUS / "clean_chatml.jinja"), "--server", url])
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1] == f"Error: --server {url!r} {reason}"


def test_the_requests_reasoning_effort_is_rendered_as_vllm_does(tmp_path):
    # vLLM turns thinking off for reasoning_effort "none"; transformers never sees the field.
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}{{ m.content }};{% endfor %}{% if enable_thinking is false %}<nothink>{% endif %}"
    )
    turns = write_turns(tmp_path, {"messages": [USER_1], "reasoning_effort": "none"}, {"messages": [USER_1, REPLY, USER_2]})
    code, out, _ = run(*turns, "--template", str(template), "--format", "json")
    assert (code, json.loads(out)["first_divergence_char"]) == (1, len("What is 2+2?;"))
    code, out, _ = run(*turns, "--template", str(template), "--format", "json", "--engine", "hf")
    assert (code, json.loads(out)["first_divergence_char"]) == (0, None)


# -- figures as vLLM counts them: full blocks, at most num_tokens - 1 looked up ---------------

PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"  # the contents, nothing else


def diff_of(tmp_path, first: str, second: str, *args: str):
    template = tmp_path / "plain.jinja"
    template.write_text(PLAIN)
    turns = write_turns(
        tmp_path, {"messages": [{"role": "user", "content": first}]}, {"messages": [{"role": "user", "content": second}]}
    )
    return run(*turns, "--template", str(template), *args)


def test_the_same_request_again_recomputes_its_last_block(tmp_path):
    # 32 characters, all cached: vLLM looks up 31, so one block of 16 hits, not two.
    code, out, _ = diff_of(tmp_path, "x" * 32, "x" * 32, "--format", "json")
    result = json.loads(out)
    assert (code, result["first_divergence_token"], result["prompt_tokens"]) == (0, None, [32, 32])
    assert (result["reusable_tokens"], result["lost_tokens"]) == (16, 0)
    code, out, _ = diff_of(tmp_path, "x" * 32, "x" * 32)
    assert out == (
        "clean extension: turn 2 is turn 1 again (32 chars); 16 chars reusable in 16-char blocks "
        "(vLLM computes at least the last char)\nrequests as vLLM 0.33.0 renders them\n"
    )


def test_a_shorter_turn_2_is_a_prefix_of_turn_1_not_the_other_way(tmp_path):
    # Turn 1 is no prefix of turn 2 (the client cut the message): not a clean extension,
    # exit 1 (README), the prompts part where turn 2 ends.
    code, out, _ = diff_of(tmp_path, "z" * 40, "z" * 32)
    assert (code, out.splitlines()[0]) == (
        1,
        "turn 2 (32 chars) is a prefix of turn 1 (40 chars): it ends at char 32 (turn 1's message 0, user, content), "
        "where turn 1 goes on; cause client: message edited (turn 2's message 0, user), not the template",
    )
    code, out, _ = diff_of(tmp_path, "z" * 40, "z" * 32, "--format", "json")
    assert (json.loads(out)["reusable_tokens"], json.loads(out)["lost_tokens"]) == (16, 0)


def test_37_shared_characters_reuse_two_blocks(tmp_path):
    code, out, _ = diff_of(tmp_path, "y" * 37 + "A" * 20, "y" * 37 + "B" * 20, "--format", "json")
    result = json.loads(out)
    assert (code, result["first_divergence_token"], result["prompt_tokens"]) == (1, 37, [57, 57])
    # 48 would be cached had nothing changed (57 - 1 = 56 looked up: 3 blocks); 32 are.
    assert (result["reusable_tokens"], result["lost_tokens"]) == (32, 16)
    # turn 2 of 48: looked up to 47, so only 2 blocks could have hit: nothing lost to the change
    code, out, _ = diff_of(tmp_path, "y" * 37 + "A" * 20, "y" * 37 + "B" * 11, "--format", "json")
    result = json.loads(out)
    assert (result["prompt_tokens"], result["reusable_tokens"], result["lost_tokens"]) == ([57, 48], 32, 0)


@needs_shared
def test_qwen3_the_same_request_twice_hits_all_but_the_block_of_its_last_token(tmp_path):
    pytest.importorskip("transformers")
    body = {"messages": [USER_1, REPLY, USER_2]}
    turns = write_turns(tmp_path, body, body)
    code, out, _ = run(*turns, "--tokenizer", str(SHARED_TOKENIZERS / "qwen3"), "--format", "json")
    result = json.loads(out)
    tokenizer = transformers_tokenizer("qwen3")
    text = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
    length = len(tokenizer.encode(text, add_special_tokens=False))
    assert length == 32  # two full blocks: the cap on the last token costs one of them
    assert (code, result["prompt_tokens"], result["unit"]) == (0, [32, 32], "token")
    assert result["reusable_tokens"] == 16  # vLLM's get_computed_blocks looks up 31 tokens


def test_a_message_the_client_edited_is_the_clients_cause_not_the_templates(tmp_path):
    code, out, _ = diff_of(tmp_path, "y" * 37 + "A" * 20, "y" * 37 + "B" * 20)
    assert code == 1
    assert out.splitlines()[0] == (
        "first divergence at char 37 of 57 (message 0, user, content); cause client: message edited (message 0, user), "
        "not the template"
    )
    code, out, _ = diff_of(tmp_path, "y" * 37 + "A" * 20, "y" * 37 + "B" * 20, "--format", "json")
    assert json.loads(out)["client_change"] == {
        "cause": "client",
        "detail": "message edited",
        "message_index": 0,
        "role": "user",
        "field": None,
    }


def test_a_request_that_repeats_the_previous_messages_has_no_client_change(tmp_path):
    turns = write_turns(tmp_path, {"messages": [USER_1, REPLY]}, {"messages": [USER_1, REPLY, USER_2]})
    code, out, _ = run(*turns, "--template", str(CORPUS / "PC002_history_rewrite.jinja"), "--format", "json")
    result = json.loads(out)
    assert (code, result["cause"], result["client_change"]) == (1, "history-rewrite", None)


def test_a_divergence_before_the_first_message_is_not_a_later_edit_of_the_clients(tmp_path):
    # The template counts the messages before printing any: turn 2 parts from turn 1 there,
    # before message 1, which the client edited. The edit comes after: the template's cause.
    template = tmp_path / "count.jinja"
    template.write_text("turns: {{ messages|length }}|{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    edited = dict(REPLY, content="four")
    first, second = {"messages": [USER_1, REPLY, USER_2]}, {"messages": [USER_1, edited, USER_2, REPLY, USER_2]}
    turns = write_turns(tmp_path, first, second)
    code, out, _ = run(*turns, "--template", str(template))
    assert code == 1
    length = len("turns: 3|<user>What is 2+2?<assistant>4<user>And 3+3?")
    assert out.splitlines()[0] == f"first divergence at char 7 of {length} (before the first message); cause system"
    code, out, _ = run(*turns, "--template", str(template), "--format", "json")
    result = json.loads(out)
    assert (result["message_index"], result["field"], result["cause"], result["client_change"]) == (
        None,
        "before-messages",
        "system",
        None,
    )


def test_the_configuration_gives_the_block_size_and_a_flag_overrides_it(tmp_path, monkeypatch):
    # A project that runs vLLM with --block-size 4 says so once, for check and diff alike.
    turns = write_turns(tmp_path, {"messages": [USER_1, REPLY]}, {"messages": [USER_1, REPLY, USER_2]})
    (tmp_path / ".tmpl-lint.yaml").write_text("block-size: 4\n")
    monkeypatch.chdir(tmp_path)
    template = str(CORPUS / "PC002_history_rewrite.jinja")
    code, out, _ = run(*turns, "--template", template, "--format", "json")
    assert (code, json.loads(out)["block_size"]) == (1, 4)
    code, out, _ = run(*turns, "--template", template, "--format", "json", "--block-size", "8")
    assert (code, json.loads(out)["block_size"]) == (1, 8)
    (tmp_path / ".tmpl-lint.yaml").write_text("block-size: 0\n")
    code, out, err = run(*turns, "--template", template)
    assert (code, out) == (2, "")
    assert err == f"tmpl-lint: error: {tmp_path / '.tmpl-lint.yaml'}: block-size must be a positive integer\n"


@pytest.mark.skipif(not SHARED_TOKENIZERS.is_dir(), reason="../shared is not present (fresh clone)")
def test_the_configuration_gives_the_tokenizer_and_with_it_the_template(tmp_path, monkeypatch):
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [USER_1, REPLY, USER_2]})
    (tmp_path / ".tmpl-lint.yaml").write_text(f"tokenizer: {SHARED_TOKENIZERS / 'qwen3'}\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(*turns, "--format", "json")
    result = json.loads(out)
    errors = [line for line in err.splitlines() if not line.startswith("tmpl-lint: note: ")]  # (the reasoning fields')
    assert (code, errors, result["unit"]) == (0, [], "token")
    ids = transformers_tokenizer("qwen3").apply_chat_template([USER_1], tokenize=True, add_generation_prompt=True)["input_ids"]
    assert result["prompt_tokens"][0] == len(ids)


def test_a_change_to_the_first_messages_role_is_the_clients_though_it_shows_before_its_text(tmp_path):
    # ChatML prints message 0's role header before its text: a client that sends the system
    # prompt as "developer" next turn parts the prompts at char 12, "before the first
    # message"'s text, and that is the client's change of message 0, not the template's.
    template = tmp_path / "chatml.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    system = {"role": "system", "content": "Be brief."}
    first = {"messages": [system, USER_1]}
    second = {"messages": [dict(system, role="developer"), USER_1, REPLY, USER_2]}
    turns = write_turns(tmp_path, first, second)
    # transformers renders the role as sent; vLLM 0.33 turns "developer" into "system" for a
    # template that never names the role (its render server does: engine-golden developer-role)
    code, out, _ = run(*turns, "--template", str(template), "--format", "json", "--engine", "hf")
    result = json.loads(out)
    assert (code, result["first_divergence_char"]) == (1, len("<|im_start|>"))
    assert result["client_change"]["message_index"] == 0
    code, out, _ = run(*turns, "--template", str(template), "--format", "json")
    assert (code, json.loads(out)["first_divergence_char"]) == (0, None)


# The latest message marked while it is last: ` (latest)` is printed before its <|im_end|>.
LAST_MARKED = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}{% if loop.last %} (latest){% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_last_message_rewrite_is_placed_in_that_message_as_check_places_it(tmp_path):
    """Turn 1's last message (the user's, message 1) closes with ` (latest)`; turn 2 prints
    it without. The divergence is in message 1's markup, a history rewrite (check: PC003),
    not in the reply of turn 2 nor its generation prompt."""
    template = tmp_path / "last.jinja"
    template.write_text(LAST_MARKED)
    system = {"role": "system", "content": "You are helpful."}
    turns = write_turns(
        tmp_path, {"messages": [system, USER_1]}, {"messages": [system, USER_1, {"role": "assistant", "content": "4."}, USER_2]}
    )
    code, out, _ = run(*turns, "--template", str(template), "--format", "json")
    assert code == 1
    result = json.loads(out)
    # <|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2? then " (latest)"
    assert result["first_divergence_char"] == len(
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?"
    )
    assert (result["message_index"], result["role"], result["field"], result["cause"]) == (1, "user", "markup", "history-rewrite")


@pytest.mark.parametrize("content", ["", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]])
def test_a_message_that_no_longer_prints_text_is_where_the_prompts_diverge(tmp_path, content):
    """The only message's text "What is 2+2?" becomes empty, or an image: the divergence is in
    message 0, the message the client edited, not in a message 1 that does not exist."""
    template = tmp_path / "parts.jinja"
    template.write_text(
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.content is string %}{{ m.content }}{% else %}{% for part in m.content %}"
        "{% if part.type == 'text' %}{{ part.text }}{% else %}<image>{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    turns = write_turns(tmp_path, {"messages": [USER_1]}, {"messages": [{"role": "user", "content": content}]})
    code, out, _ = run(*turns, "--template", str(template), "--format", "json")
    assert code == 1
    result = json.loads(out)
    assert result["first_divergence_char"] == len("<|im_start|>user\n")
    assert (result["message_index"], result["role"], result["field"]) == (0, "user", "markup")
    assert (result["client_change"]["message_index"], result["client_change"]["detail"]) == (0, "message edited")


# Turn 1 of a session, then turn 2 with a message inserted, one moved, one removed.
BRACKETED = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)
SESSION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi, what is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"},
]
OOPS = {"role": "user", "content": "oops"}
LATER = [{"role": "assistant", "content": "6."}, {"role": "user", "content": "Thanks"}]


@pytest.mark.parametrize(
    ("second", "client", "json_change"),
    [
        (
            [*SESSION[:2], OOPS, *SESSION[2:], *LATER],
            "message inserted (turn 2's message 2, user)",
            {"detail": "message inserted", "message_index": 2, "role": "user"},
        ),
        (
            [*SESSION[:2], SESSION[3], SESSION[2], *LATER],
            "messages reordered (turn 1's message 2, assistant, now turn 2's message 3)",
            {"detail": "messages reordered", "message_index": 2, "role": "assistant", "numbered_in": "previous", "moved_to": 3},
        ),
        (
            [*SESSION[:2], SESSION[3], *LATER],
            "message removed (turn 1's message 2, assistant)",
            {"detail": "message removed", "message_index": 2, "role": "assistant", "numbered_in": "previous"},
        ),
    ],
)
def test_an_inserted_a_moved_and_a_removed_message_are_named_so_in_each_turns_numbering(tmp_path, second, client, json_change):
    """Turn 2's message 2 is a user message in all three; the client's change is named for
    what it is, and a number that counts turn 1's messages says so."""
    template = tmp_path / "bracketed.jinja"
    template.write_text(BRACKETED)
    turns = write_turns(tmp_path, {"messages": SESSION}, {"messages": second})
    code, out, _ = run(*turns, "--template", str(template))
    at = len("[system]Be brief.\n[user]Hi, what is 2+2?\n[")  # where "assistant" and "user" part
    length = len("".join(f"[{m['role']}]{m['content']}\n" for m in SESSION) + "[assistant]")
    assert code == 1
    assert out.splitlines()[0] == (
        f"first divergence at char {at} of {length} (turn 2's message 2, user, markup); cause client: {client}, not the template"
    )
    code, out, _ = run(*turns, "--template", str(template), "--format", "json")
    assert json.loads(out)["client_change"] == {"cause": "client", "field": None, **json_change}


def test_a_turn_2_that_drops_turn_1s_last_messages_is_no_prefix_and_says_the_client_removed_them(tmp_path):
    """Turn 2 sends turn 1's first two messages only: its render is a prefix of turn 1's,
    but turn 1 is no prefix of turn 2, so (README) it is not a clean extension and exits 1.
    Where turn 2 ends turn 1 goes on with message 2, the reply the client removed."""
    template = tmp_path / "bracketed.jinja"
    template.write_text(BRACKETED)
    turns = write_turns(tmp_path, {"messages": SESSION}, {"messages": SESSION[:2]})
    second = "[system]Be brief.\n[user]Hi, what is 2+2?\n[assistant]"
    first = "".join(f"[{m['role']}]{m['content']}\n" for m in SESSION) + "[assistant]"
    assert first.startswith(second)
    code, out, _ = run(*turns, "--template", str(template))
    assert code == 1
    reusable = (len(second) - 1) // 16 * 16  # vLLM looks up all but turn 2's last char
    assert out.splitlines()[:2] == [
        f"turn 2 ({len(second)} chars) is a prefix of turn 1 ({len(first)} chars): it ends at char {len(second)} "
        "(turn 1's message 2, assistant, content), where turn 1 goes on; cause client: message removed "
        "(turn 1's message 2, assistant), not the template",
        f"       {reusable} of {len(first)} chars reusable in 16-char blocks, 0 recomputed; "
        "0 on a model that cannot roll back its state (a hybrid model reuses all of a prefix or none)",
    ]
    code, out, _ = run(*turns, "--template", str(template), "--format", "json")
    result = json.loads(out)
    assert code == 1
    assert (result["first_divergence_token"], result["message_index"], result["numbered_in"], result["role"]) == (
        len(second),
        2,
        "previous",
        "assistant",
    )
    assert result["client_change"] == {
        "cause": "client",
        "detail": "message removed",
        "message_index": 2,
        "role": "assistant",
        "field": None,
        "numbered_in": "previous",
    }


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SYSTEM = {"role": "system", "content": "You are a helpful assistant that answers questions about the weather with care."}
QUESTION = {"role": "user", "content": "What is the weather in Paris today? Please be precise."}


def tool_edited_between(tmp_path, template_text: str):
    """A template, and two turns of one conversation whose tool's description the client
    edited between them."""
    template = tmp_path / "tools.jinja"
    template.write_text(template_text)
    edited = {**TOOL, "function": {**TOOL["function"], "description": "Get the weather"}}
    turns = write_turns(
        tmp_path, {"messages": [SYSTEM, QUESTION], "tools": [TOOL]}, {"messages": [SYSTEM, QUESTION], "tools": [edited]}
    )
    return template, turns


@needs_shared
def test_a_tools_change_qwen3_prints_in_the_system_turn_is_placed_there(tmp_path):
    """Qwen3 prints the tools in the system turn, after the system prompt: a tool's edited
    description parts the prompts there, in message 0, not in the user message's markup.
    The client's one change is not "recomputed every turn"."""
    pytest.importorskip("transformers")
    edited = {**TOOL, "function": {**TOOL["function"], "description": "Get the weather"}}
    first, second = {"messages": [SYSTEM, QUESTION], "tools": [TOOL]}, {"messages": [SYSTEM, QUESTION], "tools": [edited]}
    turns = write_turns(tmp_path, first, second)
    tokenizer = transformers_tokenizer("qwen3")
    texts = [
        tokenizer.apply_chat_template(b["messages"], tools=b["tools"], add_generation_prompt=True, tokenize=False)
        for b in (first, second)
    ]
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    token = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
    char = next(i for i, (a, b) in enumerate(zip(*texts)) if a != b)
    # inside the system turn: after the system prompt, before the turn ends
    assert texts[1].index(SYSTEM["content"]) + len(SYSTEM["content"]) < char < texts[1].index("<|im_end|>")
    code, out, _ = run(*turns, "--tokenizer", str(SHARED_TOKENIZERS / "qwen3"))
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == (
        f"first divergence at token {token} of {len(ids[0])} (message 0, system, tools); cause client: tools changed, not the template"
    )
    reusable = token // 16 * 16
    ideal = (len(ids[1]) - 1) // 16 * 16
    assert lines[1].startswith(
        f"       {reusable} of {len(ids[0])} tokens reusable in 16-token blocks, {ideal - reusable} recomputed; "
    )
    code, out, _ = run(*turns, "--tokenizer", str(SHARED_TOKENIZERS / "qwen3"), "--format", "json")
    result = json.loads(out)
    assert (result["message_index"], result["role"], result["field"], result["cause"]) == (0, "system", "tools", "system")
    assert result["client_change"] == {
        "cause": "client",
        "detail": "tools changed",
        "message_index": None,
        "role": None,
        "field": None,
    }


def test_tools_opened_by_a_tag_inside_the_system_turn_are_placed_there(tmp_path):
    """Gemma 4 opens the tools with `<|tool>` inside the system turn, before `<turn|>` ends
    it: an opening tag parts nothing from the system prompt (placed in the user
    message, cause history-rewrite)."""
    template, turns = tool_edited_between(
        tmp_path,
        "{% for m in messages %}<|turn>{{ m.role }}\n{{ m.content }}"
        "{% if loop.first and tools %}<|tool>{{ tools|tojson }}<tool|>{% endif %}<turn|>\n{% endfor %}",
    )
    code, out, _ = run(*turns, "--template", str(template), "--format", "json")
    assert code == 1
    result = json.loads(out)
    prefix = f'<|turn>system\n{SYSTEM["content"]}<|tool>[{{"type": "function", "function": {{"name": "get_weather", "description": "Get '
    assert result["first_divergence_char"] == len(prefix)
    assert (result["message_index"], result["role"], result["field"], result["cause"]) == (0, "system", "tools", "system")


@needs_shared
def test_a_string_and_its_one_text_part_are_no_client_change(tmp_path):
    """vLLM wraps a string content into a text part for a template that loops over
    parts (Gemma 4), so a client that sends the system prompt as a string, then as a part,
    changed nothing the template sees. What parts the prompts is Gemma's generation prompt
    (the empty thought channel its history leaves out), not the client."""
    system = "Be brief.\n"
    first = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "What is the capital of France?"}]}
    second = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": system}]},
            {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And Italy?"},
        ]
    }
    turns = write_turns(tmp_path, first, second)
    template = SHARED_TEMPLATES / "google--gemma-4-31B-it.jinja"
    code, out, _ = run(*turns, "--template", str(template), "--format", "json")
    assert code == 1
    result = json.loads(out)
    assert result["client_change"] is None
    assert (result["message_index"], result["role"], result["cause"]) == (2, "assistant", "generation-prompt")


def test_tools_printed_in_the_next_turn_are_placed_in_the_message_after_them(tmp_path):
    """A template that prints the tools at the start of the last user message's turn (as
    Mistral does), after the end-of-turn marker of the message before: the tools belong to
    the user message."""
    template, turns = tool_edited_between(
        tmp_path,
        "{% for m in messages %}{% if loop.last and tools %}[TOOLS]{{ tools|tojson }}[/TOOLS]{% endif %}"
        "[{{ m.role }}]{{ m.content }}</s>{% endfor %}",
    )
    code, out, _ = run(*turns, "--template", str(template))
    prefix = (
        f'[system]{SYSTEM["content"]}</s>[TOOLS][{{"type": "function", "function": {{"name": "get_weather", "description": "Get '
    )
    assert code == 1
    assert out.splitlines()[0].startswith(f"first divergence at char {len(prefix)} of ")
    assert out.splitlines()[0].endswith(" (message 1, user, tools); cause client: tools changed, not the template")
