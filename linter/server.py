"""Asking a running vLLM for the token ids it would feed the model.

``POST /v1/chat/completions/render`` takes a chat completion request and returns the
GenerateRequest the engine would run (its ``token_ids``) without generating. Servers
without it are asked through ``/v1/chat/completions`` with ``return_token_ids`` and
``max_tokens: 1``, whose response carries ``prompt_token_ids``.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

# One deadline and one size cap per request, whatever the server does: the deadline covers
# connecting, sending and every byte of the answer (a socket timeout alone is per read, so
# a server that answers a byte a second is never timed out), and the answer is read no
# further than the cap (an endless body was read whole).
TIMEOUT_SECONDS = 60.0
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a render of a million tokens is under 10 MB of JSON
# Token ids as engines use them: vocabularies are far smaller than 2**31.
MAX_TOKEN_ID = 2**31 - 1


class ServerError(Exception):
    pass


class ServerURLError(ServerError):
    """A --server that is not a URL tmpl-lint can ask: the caller's mistake, a usage error."""


class ServerUnreachable(ServerError):
    """No connection to the server: the requests after this one would not reach it either."""


class ServerRefused(ServerError):
    """The server answered the request HTTP 400: the engine refuses it (``validate``
    compares that with the profile's refusal)."""


class _Deadline:
    """The end of one request: at it, every connection the request opened is shut, which
    ends a read that is waiting on it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        return max(0.001, self.at - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            self._shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError, ValueError):
            sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def _watched(base: type[http.client.HTTPConnection], deadline: _Deadline):
    """``base`` whose connections connect within what is left of ``deadline`` and are shut
    at it (an HTTPS handshake is bounded per read only: the deadline watches the socket it
    makes from then on)."""

    class Connection(base):  # type: ignore[misc, valid-type]
        def connect(self) -> None:
            self.timeout = deadline.left()
            super().connect()
            deadline.watch(self.sock)

    return Connection


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(_watched(http.client.HTTPConnection, self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self.deadline = deadline

    def https_open(self, req):
        return self.do_open(_watched(http.client.HTTPSConnection, self.deadline), req, context=self._context)


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects are followed on the server's own scheme, host and port only: the request
    (a conversation, perhaps an API key in a proxy's headers) goes nowhere else."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if _origin(newurl) != _origin(req.full_url):
            raise ServerError(f"{req.full_url} redirects to another host ({newurl}): refused")
        return super().redirect_request(req, fp, code, msg, headers, newurl)

    def http_error_302(self, req, fp, code, msg, headers):
        _read_capped(fp, req.full_url)  # urllib reads a redirect's body whole: within the cap first
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _request(url: str, body: dict[str, Any] | None = None, seconds: float = TIMEOUT_SECONDS) -> tuple[int, bytes]:
    """The status and body of one GET (or, with ``body``, POST) within ``seconds`` and the
    size cap; ServerError where there is none."""
    deadline = _Deadline(seconds)
    opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline), _SameHostRedirects())
    if body is None:
        request = urllib.request.Request(url)
    else:
        data = json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        try:
            response = opener.open(request, timeout=deadline.left())
            status = response.status
        except urllib.error.HTTPError as error:
            response, status = error, error.code
        with response:
            data = _read_capped(response, url) if getattr(response, "fp", None) is not None else b""
    except ServerError:
        raise
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as error:
        if deadline.expired:
            raise ServerError(f"{url} did not answer within {seconds:.3g} s") from None
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        # No connection at all (refused, no route, no such host) holds for every later
        # request too; a timeout or a dropped answer may be this request's alone.
        unreachable = isinstance(reason, (ConnectionRefusedError, socket.gaierror)) or (
            isinstance(reason, OSError) and reason.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)
        )
        failure = ServerUnreachable if unreachable else ServerError
        raise failure(f"cannot reach {url}: {reason or type(error).__name__}") from None
    finally:
        deadline.cancel()
    if deadline.expired:  # the answer ended because the deadline shut its connection
        raise ServerError(f"{url} did not answer within {seconds:.3g} s")
    return status, data


def _read_capped(response, url: str) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = response.read(min(1 << 16, MAX_RESPONSE_BYTES + 1 - size))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise ServerError(f"{url} answered more than {MAX_RESPONSE_BYTES} bytes: not read further")
        chunks.append(chunk)


def _post(url: str, body: dict[str, Any], seconds: float = TIMEOUT_SECONDS) -> tuple[int, Any]:
    status, data = _request(url, body, seconds)
    return status, _json(data, url, strict=status == 200)


def _check_url(url: str) -> None:
    """Raise ServerURLError unless ``url`` is an http(s) URL with a host (urllib would raise
    ValueError for a missing scheme, http.client InvalidURL for a port that is no number)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number
    except ValueError as error:
        raise ServerURLError(f"--server {url!r} is not a URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerURLError(f"--server {url!r} is not an http:// or https:// URL with a host (such as http://localhost:8000)")


def _get(url: str, seconds: float = TIMEOUT_SECONDS) -> Any:
    status, data = _request(url, seconds=seconds)
    if status != 200:
        raise ServerError(f"{url} answered HTTP {status}")
    return _json(data, url)


def _json(data: bytes, url: str, strict: bool = True) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        if strict:
            raise ServerError(f"{url} did not answer with JSON") from None
        return None


def _token_ids(ids: Any, where: str, missing: str) -> list[int]:
    """``ids`` if it is a list of token ids; else ServerError: a server that answers ids as
    strings or nulls would be compared as if they were tokens."""
    if not isinstance(ids, list):
        raise ServerError(missing)
    for index, token in enumerate(ids):
        if type(token) is not int or not 0 <= token <= MAX_TOKEN_ID:
            shown = repr(token) if len(repr(token)) <= 40 else repr(token)[:37] + "..."
            raise ServerError(f"{where} answered a token id that is none: {shown} at index {index} (ids are integers from 0)")
    return ids


def find_key(document: Any, key: str) -> Any:
    """The first non-null value under ``key`` anywhere in a JSON document (depth first, in
    document order; without recursion: a server's JSON may be nested as deep as it likes)."""
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get(key) is not None:
                return node[key]
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return None


def _error_text(document: Any) -> str:
    message = find_key(document, "message") if document is not None else None
    return f": {message}" if message else ""


def _model_not_found(status: int, document: Any) -> bool:
    """vLLM's answer to a model it does not serve (HTTP 404 with an error naming the model),
    as against a path it does not have (FastAPI's 404 ``{"detail": "Not Found"}``)."""
    if status != 404 or document is None:
        return False
    kind = find_key(document, "type") or ""
    message = find_key(document, "message") or ""
    return ("NotFound" in str(kind) and "model" in str(message).lower()) or "does not exist" in str(message)


def _seconds_left(ends_at: float | None) -> float:
    """A request's deadline: its own, or what is left of the run's (``ends_at``, monotonic)
    where that is sooner: validate's --deadline bounds the whole run, not each request."""
    if ends_at is None:
        return TIMEOUT_SECONDS
    left = ends_at - time.monotonic()
    if left <= 0:
        raise ServerError("the run's deadline passed before the request was sent")
    return min(TIMEOUT_SECONDS, left)


class VLLMServer:
    """A running vLLM, asked for the token ids it would feed the model.

    The model named in each request is the one its body names, unless ``--model`` says
    otherwise; one the server does not serve (``GET /v1/models``) is replaced by the one it
    does, and ``note`` says so (once per model)."""

    def __init__(self, base_url: str, model: str | None = None, note=None, ends_at: float | None = None):
        _check_url(base_url)
        self.base_url = base_url.rstrip("/")
        self.ends_at = ends_at  # the run's deadline (time.monotonic()), if it has one
        self.model = model
        self.note = note or (lambda text: None)
        self._served: list[str] | None = None
        self._replaced: dict[str | None, str] = {}

    def served(self) -> list[str]:
        if self._served is None:
            listing = _get(f"{self.base_url}/v1/models", _seconds_left(self.ends_at))
            entries = listing.get("data") if isinstance(listing, dict) else None
            entries = entries if isinstance(entries, list) else []
            self._served = [entry["id"] for entry in entries if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
        return self._served

    def model_for(self, requested: str | None) -> str:
        """The model to name: --model, else the request's if served, else the only one served."""
        if self.model:
            return self.model
        if requested in self._replaced:
            return self._replaced[requested]
        try:
            served = self.served()
        except ServerError:
            if requested:
                return requested  # no listing to check it against (not a vLLM?): as the request says
            raise
        if requested in served:
            return requested
        if not served:
            raise ServerError(f"{self.base_url}/v1/models lists no model")
        if len(served) > 1:
            asked = f", not {requested!r}" if requested else ""
            raise ServerError(f"{self.base_url} serves several models ({', '.join(served)}){asked}: pass --model")
        if requested:
            self.note(
                f"{self.base_url} does not serve {requested!r}, the request's model: using {served[0]!r}, the model it serves"
            )
        self._replaced[requested] = served[0]
        return served[0]

    def discover(self, requested) -> None:
        """Choose the model for each model the requests name (and say so where it is
        replaced) before any request is sent."""
        for name in dict.fromkeys(requested):
            self.model_for(name if isinstance(name, str) else None)

    def prompt_token_ids(self, request: dict[str, Any]) -> list[int]:
        base_url = self.base_url
        requested = request.get("model")
        model = self.model_for(requested if isinstance(requested, str) else None)
        body = {**request, "model": model}
        status, document = _post(f"{base_url}/v1/chat/completions/render", body, _seconds_left(self.ends_at))
        if status == 200:
            where = f"{base_url}/v1/chat/completions/render"
            ids = find_key(document, "token_ids") or find_key(document, "prompt_token_ids")
            return _token_ids(ids, where, f"{where} answered without token ids")
        if _model_not_found(status, document):
            raise ServerError(f"{base_url} does not serve model {model!r} (HTTP 404{_error_text(document)}): pass --model")
        if status == 400:
            raise ServerRefused(f"{base_url}/v1/chat/completions/render answered HTTP 400{_error_text(document)}")
        if status not in (404, 405):
            raise ServerError(f"{base_url}/v1/chat/completions/render answered HTTP {status}{_error_text(document)}")
        # The render endpoint is off: the generation path with one token returns the prompt ids.
        fallback = {**body, "max_tokens": 1, "temperature": 0, "return_token_ids": True, "stream": False}
        status, document = _post(f"{base_url}/v1/chat/completions", fallback, _seconds_left(self.ends_at))
        if _model_not_found(status, document):
            raise ServerError(f"{base_url} does not serve model {model!r} (HTTP 404{_error_text(document)}): pass --model")
        if status != 200:
            raise ServerError(
                f"{base_url}: the render endpoint is off and /v1/chat/completions answered HTTP {status}{_error_text(document)}"
            )
        where = f"{base_url}/v1/chat/completions"
        missing = f"{where} returned no prompt_token_ids (is return_token_ids supported?)"
        return _token_ids(find_key(document, "prompt_token_ids"), where, missing)


class LlamaServer:
    """A running llama-server, asked for the prompt text it would feed the model:
    ``POST /apply-template`` applies its chat template to a chat-completions request without
    generating and answers ``{"prompt": text}`` (it has no endpoint that answers a chat
    request's token ids)."""

    def __init__(self, base_url: str, ends_at: float | None = None):
        _check_url(base_url)
        self.base_url = base_url.rstrip("/")
        self.ends_at = ends_at  # the run's deadline (time.monotonic()), if it has one

    def prompt_text(self, request: dict[str, Any]) -> str:
        url = f"{self.base_url}/apply-template"
        status, document = _post(url, request, _seconds_left(self.ends_at))
        if status == 400:
            raise ServerRefused(f"{url} answered HTTP 400{_error_text(document)}")
        if status != 200:
            raise ServerError(f"{url} answered HTTP {status}{_error_text(document)}")
        prompt = document.get("prompt") if isinstance(document, dict) else None
        if not isinstance(prompt, str):
            raise ServerError(f"{url} answered without a prompt (is this a llama-server?)")
        return prompt


def prompt_token_ids(base_url: str, request: dict[str, Any], model: str | None = None) -> list[int]:
    """The token ids ``base_url`` would feed the model for ``request`` (one question)."""
    return VLLMServer(base_url, model).prompt_token_ids(request)
