"""llama.cpp b10775's llama-server: its slot cache is kv_cache's ``LlamaCppSlots``. Its own
template engine (``common/jinja``, its message normaliser, ``enable_thinking`` on by
default) is issue 32's item 4: until it renders here, the template renders with jinja2 as
transformers configures it, and ``renderer`` says so."""

from __future__ import annotations

from typing import Any

from .base import EngineProfile
from .hf import as_template_sees


def prepare(messages: list[dict[str, Any]], merged: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and template variables rendered for llama-server: the request's own."""
    return list(messages), merged


PROFILE = EngineProfile(
    name="llamacpp",
    product="llama.cpp",
    version="b10775",
    cache_model="llamacpp",
    renderer="jinja2 as transformers configures it (not llama.cpp's own template engine)",
    tokenization="the rendered text",
    template_message=as_template_sees,
)
