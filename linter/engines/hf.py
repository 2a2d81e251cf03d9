"""transformers' ``apply_chat_template`` called directly: the request reaches the template
as it was sent, its ``chat_template_kwargs`` as template variables."""

from __future__ import annotations

from typing import Any


def prepare(messages: list[dict[str, Any]], merged: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and template variables transformers renders: the request's own."""
    return list(messages), merged
