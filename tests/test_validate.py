"""``tmpl-lint validate`` against a stub render server on 127.0.0.1 that answers what vLLM
0.33.0's own render server answered (../shared/engine-golden/vllm-0.33.0.jsonl): the token
ids, or its 400. The stub only replays the golden file; a test changes one answer to see
the disagreement found at its place."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner
from helpers import SHARED, SHARED_TOKENIZERS

from tmpl_lint import server as server_module
from tmpl_lint.cli import main

GOLDEN = SHARED / "engine-golden" / "vllm-0.33.0.jsonl"
needs_golden = pytest.mark.skipif(not GOLDEN.is_file(), reason="../shared is not present (fresh clone)")


def _key(body: dict) -> str:
    return json.dumps({key: value for key, value in body.items() if key != "model"}, sort_keys=True)


def _golden(tokenizer: str) -> list[dict]:
    lines = [json.loads(line) for line in GOLDEN.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [line for line in lines if line["tokenizer"] == tokenizer]


class Served:
    """A stub server on 127.0.0.1 for the length of a ``with``: ``url`` is where it listens."""

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.http.shutdown()
        self.http.server_close()


class Quiet(BaseHTTPRequestHandler):
    """A handler that logs nothing and answers JSON."""

    def log_message(self, *args):
        pass

    def _send(self, status: int, document) -> None:
        data = document if isinstance(document, bytes) else json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Stub(Served):
    """A render server that answers each golden request as vLLM did."""

    def __init__(self, lines: list[dict], changed: dict[str, int] | None = None, delay: float = 0.0, redirect: str | None = None):
        self.answers = {_key(line["request"]): line for line in lines}
        self.changed = changed or {}  # case -> token index whose id the stub changes
        self.delay, self.redirect = delay, redirect
        self.asked = 0
        stub = self

        class Handler(Quiet):
            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "served-model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.asked += 1
                time.sleep(stub.delay)
                if stub.redirect:
                    self.send_response(307)
                    self.send_header("Location", stub.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                line = stub.answers.get(_key(body))
                if line is None:
                    self._send(500, {"error": {"message": "not in the golden file"}})
                elif "error" in line:
                    self._send(line["error"]["status"], line["error"]["body"].encode())
                else:
                    ids = list(line["token_ids"])
                    if line["case"] in stub.changed:
                        ids[stub.changed[line["case"]]] += 1
                    self._send(200, {"request_id": "x", "token_ids": ids})

        self.serve(Handler)


def _log(tmp_path, lines: list[dict]):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"request": {**line["request"], "model": "served-model"}}) + "\n" for line in lines))
    return log


def _validate(log, url, tokenizer, *more):
    args = ["validate", str(log), "--server", url, "--tokenizer", str(SHARED_TOKENIZERS / tokenizer), *more]
    return CliRunner().invoke(main, args)


@needs_golden
@pytest.mark.parametrize("tokenizer", ["qwen3", "mistral-nemo"])
def test_every_golden_request_agrees_with_vllm_s_answers(tmp_path, tokenizer):
    lines = _golden(tokenizer)
    with Stub(lines) as stub:
        result = _validate(_log(tmp_path, lines), stub.url, tokenizer, "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["checked"], report["agreed"], report["disagreements"]) == (len(lines), len(lines), [])
    assert report["engine"] == "vLLM 0.33.0"
    assert stub.asked == len(lines)


@needs_golden
def test_a_disagreement_is_found_at_its_token(tmp_path):
    lines = _golden("qwen3")
    with Stub(lines, changed={"multi-turn-reasoning-agent": 167}) as stub:
        log = _log(tmp_path, lines)
        result = _validate(log, stub.url, "qwen3")
    assert result.exit_code == 1
    out = result.stdout.splitlines()
    assert out[0].startswith(f"validate: {len(lines) - 1} of {len(lines)} requests agree with {stub.url}")
    number = next(n for n, line in enumerate(lines, 1) if line["case"] == "multi-turn-reasoning-agent")
    line = next(line for line in lines if line["case"] == "multi-turn-reasoning-agent")
    assert out[1].startswith(
        f"  {log}:{number}: token 167 of {len(line['token_ids'])} (profile) / {len(line['token_ids'])} (server)"
    )
    assert f"profile {line['token_ids'][167]} " in out[1]
    assert f"server {line['token_ids'][167] + 1} " in out[1]


@needs_golden
def test_a_refusal_on_one_side_only_is_a_disagreement(tmp_path):
    refused = next(line for line in _golden("mistral-nemo") if "error" in line)
    rendered = {**refused, "error": None, "token_ids": [1, 2, 3]}
    del rendered["error"]
    with Stub([rendered]) as stub:
        result = _validate(_log(tmp_path, [refused]), stub.url, "mistral-nemo")
    assert result.exit_code == 1
    assert "the profile refuses (vLLM 0.33.0 answers 400: " in result.stdout
    assert "the server renders 3 tokens" in result.stdout


@needs_golden
def test_the_run_stops_at_its_deadline_and_says_what_was_not_asked(tmp_path):
    lines = _golden("qwen3")[:4]
    with Stub(lines, delay=0.6) as stub:
        result = _validate(_log(tmp_path, lines), stub.url, "qwen3", "--deadline", "1")
    assert result.exit_code == 2
    assert stub.asked == 2
    assert "  stopped: the 1 s deadline passed: 2 requests not asked" in result.stdout.splitlines()


@needs_golden
def test_a_server_error_is_said_per_request_and_the_rest_are_compared(tmp_path):
    lines = _golden("qwen3")[:3]
    unknown = {"request": {"messages": [{"role": "user", "content": "not in the golden file"}]}, "case": "x"}
    with Stub(lines) as stub:
        result = _validate(_log(tmp_path, [*lines, unknown]), stub.url, "qwen3")
    assert result.exit_code == 2
    assert result.stdout.splitlines()[0].startswith("validate: 3 of 3 requests agree")
    assert "log.jsonl:4: not compared: " in result.stdout
    assert "answered HTTP 500: not in the golden file" in result.stdout


@needs_golden
@pytest.mark.skipif(
    not hasattr(server_module, "MAX_RESPONSE_BYTES"), reason="server.py's bounded client (issue 34's) is not merged here"
)
def test_a_redirect_to_another_host_is_refused(tmp_path):
    lines = _golden("qwen3")[:1]
    with Stub(lines, redirect="http://localhost:9/v1/chat/completions/render") as stub:
        result = _validate(_log(tmp_path, lines), stub.url, "qwen3")
    assert result.exit_code == 2
    assert "redirects to another host" in result.stdout


LIVE = os.environ.get("TMPL_LINT_VLLM_RENDER_URL")


@needs_golden
@pytest.mark.skipif(not LIVE, reason="no running vLLM render server (set TMPL_LINT_VLLM_RENDER_URL to one serving qwen3)")
def test_a_running_vllm_render_server_agrees_with_the_profile(tmp_path):
    # vllm launch render MODEL_DIR --enable-auto-tool-choice --tool-call-parser hermes, where
    # MODEL_DIR holds ../shared/tokenizers/qwen3 and a Qwen3 config.json (see the README)
    for log in (_log(tmp_path, _golden("qwen3")), SHARED / "engine-golden" / "replay" / "agents.jsonl"):
        result = _validate(log, LIVE, "qwen3", "--format", "json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert report["agreed"] == report["checked"] == report["requests"]


LLAMACPP_GOLDEN = SHARED / "engine-golden" / "llamacpp-b10775.jsonl"


class LlamaStub(Served):
    """A llama-server whose /apply-template answers what llama.cpp b10775's own template
    engine rendered (../shared/engine-golden/llamacpp-b10775.jsonl), keyed by the messages."""

    def __init__(self, texts: dict[str, str]):
        self.texts = texts
        stub = self

        class Handler(Quiet):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = stub.texts.get(json.dumps(body["messages"], sort_keys=True)) if self.path == "/apply-template" else None
                self._send(*((200, {"prompt": text}) if text is not None else (404, {"error": {"message": "unknown"}})))

        self.serve(Handler)


@pytest.mark.skipif(not LLAMACPP_GOLDEN.is_file(), reason="../shared is not present (fresh clone)")
def test_llama_server_s_apply_template_text_is_compared_character_by_character(tmp_path):
    lines = [json.loads(line) for line in LLAMACPP_GOLDEN.read_text(encoding="utf-8").splitlines() if line.strip()]
    line = next(
        line
        for line in lines
        if line["template"] == "Qwen--Qwen2.5-7B-Instruct.jinja" and line["conversation"] == "chat" and "text" in line
    )
    context = line["context"]
    template = (SHARED / "corpus" / "templates" / line["template"]).read_text(encoding="utf-8")
    config = tmp_path / "tokenizer_config.json"
    config.write_text(
        json.dumps({"chat_template": template, "bos_token": context["bos_token"], "eos_token": context["eos_token"]})
    )
    log = tmp_path / "log.jsonl"
    request = {"messages": context["messages"], "add_generation_prompt": context["add_generation_prompt"]}
    log.write_text(json.dumps({"request": request}) + "\n")
    key = json.dumps(context["messages"], sort_keys=True)
    args = ["validate", str(log), "--template", str(config), "--engine", "llamacpp", "--format", "json"]
    # this conversation renders alike under jinja2 and llama.cpp's engine: agreement
    with LlamaStub({key: line["text"]}) as stub:
        result = CliRunner().invoke(main, [*args, "--server", stub.url])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["engine"], report["agreed"], report["checked"]) == ("llama.cpp b10775", 1, 1)
    # one character changed where the last user message starts: found there
    place = line["text"].rindex("Tell me a joke.")
    changed = line["text"][:place] + "t" + line["text"][place + 1 :]
    with LlamaStub({key: changed}) as stub:
        result = CliRunner().invoke(main, [*args, "--server", stub.url])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert [entry["text"] for entry in report["disagreements"]] == [place]


def test_an_engine_without_a_render_endpoint_is_a_usage_error(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    args = ["validate", str(log), "--template", str(template), "--server", "http://127.0.0.1:9", "--engine", "sglang"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--engine sglang: no render endpoint to ask (vLLM's and llama-server's are)" in result.stderr


def test_a_server_that_cannot_be_reached_is_said_once_not_per_request(tmp_path):
    import socket

    from helpers import CORPUS

    with socket.socket() as probe:  # a port nothing listens on: bound, then closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n" for i in range(3)))
    args = ["validate", str(log), "--template", str(CORPUS / "clean_chatml.jinja"), "--engine", "llamacpp"]
    result = CliRunner().invoke(main, [*args, "--server", f"http://127.0.0.1:{port}"])
    assert result.exit_code == 2, result.output
    assert result.stdout.count("cannot reach") == 2  # the first request's line, and the run's
    assert result.stdout.count("not compared") == 1
    assert "2 requests not asked" in result.stdout
