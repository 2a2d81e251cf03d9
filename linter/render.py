"""Rendering a chat template exactly as transformers' ``apply_chat_template(tokenize=False)``.

The steps mirror ``transformers.utils.chat_template_utils.render_jinja_template`` and
``PreTrainedTokenizerBase.apply_chat_template``: keys whose value is None are dropped from
each message, reasoning given under ``reasoning_content``, ``thinking`` or ``reasoning``
is offered under ``thinking`` and ``reasoning_content`` both, and the template sees
``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the tokenizer's
special tokens, overridden by the caller's keyword arguments. A test renders every
template of the shared corpus both ways and compares the bytes.

What differs is the clock: ``strftime_now`` reads the ``clock`` given here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2

from .jinja_env import Clock, make_environment

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class RenderError(Exception):
    """The template refused the conversation (``raise_exception``) or failed while rendering."""


class FrozenClock:
    """A clock that reads a fixed instant; ``set`` moves it (to cross midnight, say)."""

    def __init__(self, instant: datetime):
        self.instant = instant

    def __call__(self) -> datetime:
        return self.instant

    def set(self, instant: datetime) -> None:
        self.instant = instant


@lru_cache(maxsize=256)
def _compile(text: str, clock: Clock) -> jinja2.Template:
    return make_environment(clock).from_string(text)


def compile_template(text: str, clock: Clock) -> jinja2.Template:
    try:
        return _compile(text, clock)
    except jinja2.TemplateSyntaxError as error:
        raise RenderError(f"template does not parse: {error.message} (line {error.lineno})") from None


def prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    prepared = []
    for message in messages:
        plain = {key: copy.deepcopy(value) for key, value in message.items() if value is not None}
        reasoning = next((plain[key] for key in REASONING_FIELDS if plain.get(key) is not None), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        prepared.append(plain)
    return prepared


def render(
    text: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    clock: Clock,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    special_tokens: Mapping[str, Any] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    template = compile_template(text, clock)
    variables = {**(special_tokens or {}), **(template_kwargs or {})}
    try:
        return template.render(
            messages=prepare_messages(messages),
            tools=copy.deepcopy(list(tools)) if tools is not None else None,
            documents=copy.deepcopy(list(documents)) if documents is not None else None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.TemplateError as error:
        raise RenderError(str(error) or type(error).__name__) from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as error:
        raise RenderError(f"{type(error).__name__}: {error}") from None
    except RecursionError:
        raise RenderError("recursion too deep") from None
