"""transformers' ``apply_chat_template`` called directly: the request reaches the template
as it was sent, its ``chat_template_kwargs`` as template variables, its reasoning under
each name transformers gives it (``render.prepare_messages``). Also transformers'
``continue_final_message``, which vLLM and SGLang both call it for."""

from __future__ import annotations

from typing import Any

from ..render import prepare_messages
from .base import EngineError, EngineProfile


def prepare(messages: list[dict[str, Any]], merged: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and template variables transformers renders: the request's own."""
    return list(messages), merged


def as_template_sees(message: dict[str, Any]) -> dict[str, Any]:
    return prepare_messages([message])[0]


PROFILE = EngineProfile(
    name="hf",
    product="transformers",
    version="",
    cache_model="vllm",  # no engine: its figures are read on vLLM's block pool
    renderer="transformers' apply_chat_template",
    tokenization="the rendered text, add_special_tokens=False",
    template_message=as_template_sees,
)


# continue_final_message: the last message's text carries this tag, and the render is cut
# where it appears (transformers' utils/chat_template_utils.py, render_jinja_template).
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def tagged(message: dict[str, Any] | None) -> dict[str, Any]:
    """The final message with the tag after its (last) text."""
    content = message.get("content") if message else None
    if isinstance(content, str):
        return {**message, "content": content + CONTINUE_TAG}  # type: ignore[dict-item]
    if isinstance(content, list):
        for index in range(len(content) - 1, -1, -1):
            part = content[index]
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts = [*content[:index], {**part, "text": part["text"] + CONTINUE_TAG}, *content[index + 1 :]]
                return {**message, "content": parts}  # type: ignore[dict-item]
        raise EngineError("continue_final_message: the final message has no text to continue")
    raise EngineError("continue_final_message: the final message has no content to continue")


def cut_at_tag(text: str) -> str:
    """The render up to where the final message's text ends."""
    at = text.rfind(CONTINUE_TAG.strip())
    if at < 0:
        raise EngineError("continue_final_message: the template does not print the final message's text")
    if text[at : at + len(CONTINUE_TAG)] == CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()  # the template trimmed the text's trailing space
