"""SGLang 0.5.23's request handling: messages reach the template whole. ``reasoning_content``
is a field of its message model (``srt/entrypoints/openai/protocol.py``), ``serving_chat.py``
passes the messages on as sent, and every non-empty key survives
(``jinja_template_utils.py``); transformers' ``apply_chat_template`` renders them. Its radix
cache is kv_cache's ``SglangRadixCache``. Its server's request validation is not modelled:
nothing is refused here that the template renders."""

from __future__ import annotations

from typing import Any

from .base import EngineProfile
from .hf import as_template_sees


def prepare(messages: list[dict[str, Any]], merged: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and template variables SGLang renders: the request's own."""
    return list(messages), merged


PROFILE = EngineProfile(
    name="sglang",
    product="SGLang",
    version="0.5.23",
    cache_model="sglang",
    renderer="transformers' apply_chat_template on the messages as sent",
    tokenization="the rendered text, add_special_tokens=False",
    template_message=as_template_sees,
)
