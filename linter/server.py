"""Asking a running vLLM for the token ids it would feed the model.

``POST /v1/chat/completions/render`` takes a chat completion request and returns the
GenerateRequest the engine would run (its ``token_ids``) without generating. Servers
without it are asked through ``/v1/chat/completions`` with ``return_token_ids`` and
``max_tokens: 1``, whose response carries ``prompt_token_ids``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

TIMEOUT_SECONDS = 60


class ServerError(Exception):
    pass


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


def served_model(base_url: str, model: str | None) -> str:
    """The model to name in requests: given, or the only one the server serves."""
    if model:
        return model
    listing = _get(f"{base_url}/v1/models")
    names = [entry.get("id") for entry in (listing or {}).get("data", []) if isinstance(entry, dict)]
    if len(names) == 1:
        return names[0]
    if not names:
        raise ServerError(f"{base_url}/v1/models lists no model")
    raise ServerError(f"{base_url} serves several models ({', '.join(names)}): pass --model")


def _error_text(document: Any) -> str:
    message = find_key(document, "message") if document is not None else None
    return f": {message}" if message else ""


def prompt_token_ids(base_url: str, request: dict[str, Any], model: str | None = None) -> list[int]:
    base_url = base_url.rstrip("/")
    body = {**request, "model": served_model(base_url, model or request.get("model"))}
    status, document = _post(f"{base_url}/v1/chat/completions/render", body)
    if status == 200:
        ids = find_key(document, "token_ids") or find_key(document, "prompt_token_ids")
        if isinstance(ids, list):
            return ids
        raise ServerError(f"{base_url}/v1/chat/completions/render answered without token ids")
    if status not in (404, 405):
        raise ServerError(f"{base_url}/v1/chat/completions/render answered HTTP {status}{_error_text(document)}")
    # The render endpoint is off: the generation path with one token returns the prompt ids.
    fallback = {**body, "max_tokens": 1, "temperature": 0, "return_token_ids": True, "stream": False}
    status, document = _post(f"{base_url}/v1/chat/completions", fallback)
    if status != 200:
        raise ServerError(
            f"{base_url}: the render endpoint is off and /v1/chat/completions answered HTTP {status}{_error_text(document)}"
        )
    ids = find_key(document, "prompt_token_ids")
    if not isinstance(ids, list):
        raise ServerError(f"{base_url}/v1/chat/completions returned no prompt_token_ids (is return_token_ids supported?)")
    return ids
