"""A chat-completion request as a client sends it: read from a file and checked for what
tmpl-lint can render (``messages``, ``tools``, ``chat_template_kwargs``, ``reasoning_effort``).
``diff`` reads its two requests here, and ``replay`` checks each logged request here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .inputs import SourceError, load_json


class RequestError(Exception):
    pass


@dataclass
class Request:
    path: Path
    body: dict[str, Any]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body["messages"]

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return self.body.get("tools")

    @property
    def kwargs(self) -> dict[str, Any]:
        return self.body.get("chat_template_kwargs") or {}


def read_request(path: Path) -> Request:
    try:
        body = load_json(path)
    except SourceError as error:
        raise RequestError(str(error)) from None
    problem = request_problem(body)
    if problem:
        raise RequestError(f"{path}: {problem}")
    return Request(path, body)


def request_problem(body: Any) -> str | None:
    """Why ``body`` is not a chat completion request tmpl-lint can render, or None."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        return "expected a chat completion request with a non-empty messages list"
    if not all(isinstance(message, dict) and isinstance(message.get("role"), str) for message in body["messages"]):
        return "every message must be an object with a role"
    if body.get("tools") is not None and not (
        isinstance(body["tools"], list) and all(isinstance(tool, dict) for tool in body["tools"])
    ):
        return "tools must be a list of objects"
    if body.get("chat_template_kwargs") is not None and not isinstance(body["chat_template_kwargs"], dict):
        return "chat_template_kwargs must be an object"
    if body.get("reasoning_effort") is not None and not isinstance(body["reasoning_effort"], str):
        return "reasoning_effort must be a string"
    return None
