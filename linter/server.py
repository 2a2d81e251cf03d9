"""Asking a running vLLM for the token ids it would feed the model.

``POST /v1/chat/completions/render`` takes a chat completion request and returns the
GenerateRequest the engine would run (its ``token_ids``) without generating. Servers
without it are asked through ``/v1/chat/completions`` with ``return_token_ids`` and
``max_tokens: 1``, whose response carries ``prompt_token_ids``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

TIMEOUT_SECONDS = 60


class ServerError(Exception):
    pass


class ServerURLError(ServerError):
    """A --server that is not a URL tmpl-lint can ask: the caller's mistake, a usage error."""


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode("utf-8"), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            return response.status, _json(response.read(), url)
    except urllib.error.HTTPError as error:
        return error.code, _json(error.read(), url, strict=False)
    except urllib.error.URLError as error:
        raise ServerError(f"cannot reach {url}: {error.reason}") from None
    except (TimeoutError, OSError) as error:
        raise ServerError(f"cannot reach {url}: {error}") from None


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


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            return _json(response.read(), url)
    except urllib.error.HTTPError as error:
        raise ServerError(f"{url} answered HTTP {error.code}") from None
    except urllib.error.URLError as error:
        raise ServerError(f"cannot reach {url}: {error.reason}") from None
    except (TimeoutError, OSError) as error:
        raise ServerError(f"cannot reach {url}: {error}") from None


def _json(data: bytes, url: str, strict: bool = True) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        if strict:
            raise ServerError(f"{url} did not answer with JSON") from None
        return None


def find_key(document: Any, key: str) -> Any:
    """The first non-null value under ``key`` anywhere in a JSON document."""
    if isinstance(document, dict):
        if document.get(key) is not None:
            return document[key]
        values = document.values()
    elif isinstance(document, list):
        values = document
    else:
        return None
    for value in values:
        found = find_key(value, key)
        if found is not None:
            return found
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


class VLLMServer:
    """A running vLLM, asked for the token ids it would feed the model.

    The model named in each request is the one its body names, unless ``--model`` says
    otherwise; one the server does not serve (``GET /v1/models``) is replaced by the one it
    does, and ``note`` says so (once per model)."""

    def __init__(self, base_url: str, model: str | None = None, note=None):
        _check_url(base_url)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.note = note or (lambda text: None)
        self._served: list[str] | None = None
        self._replaced: dict[str | None, str] = {}

    def served(self) -> list[str]:
        if self._served is None:
            listing = _get(f"{self.base_url}/v1/models")
            entries = listing.get("data", []) if isinstance(listing, dict) else []
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
        status, document = _post(f"{base_url}/v1/chat/completions/render", body)
        if status == 200:
            ids = find_key(document, "token_ids") or find_key(document, "prompt_token_ids")
            if isinstance(ids, list):
                return ids
            raise ServerError(f"{base_url}/v1/chat/completions/render answered without token ids")
        if _model_not_found(status, document):
            raise ServerError(f"{base_url} does not serve model {model!r} (HTTP 404{_error_text(document)}): pass --model")
        if status not in (404, 405):
            raise ServerError(f"{base_url}/v1/chat/completions/render answered HTTP {status}{_error_text(document)}")
        # The render endpoint is off: the generation path with one token returns the prompt ids.
        fallback = {**body, "max_tokens": 1, "temperature": 0, "return_token_ids": True, "stream": False}
        status, document = _post(f"{base_url}/v1/chat/completions", fallback)
        if _model_not_found(status, document):
            raise ServerError(f"{base_url} does not serve model {model!r} (HTTP 404{_error_text(document)}): pass --model")
        if status != 200:
            raise ServerError(
                f"{base_url}: the render endpoint is off and /v1/chat/completions answered HTTP {status}{_error_text(document)}"
            )
        ids = find_key(document, "prompt_token_ids")
        if not isinstance(ids, list):
            raise ServerError(f"{base_url}/v1/chat/completions returned no prompt_token_ids (is return_token_ids supported?)")
        return ids


def prompt_token_ids(base_url: str, request: dict[str, Any], model: str | None = None) -> list[int]:
    """The token ids ``base_url`` would feed the model for ``request`` (one question)."""
    return VLLMServer(base_url, model).prompt_token_ids(request)
