"""A request rendered offline as an engine would serve it: what ``tmpl-lint render`` prints,
and what ``validate`` compares with the engine's own answer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .engines import engine_tokenizer, profile_of, request_prompt
from .engines.base import EngineError, EngineRefusal
from .proving.measure import resolve_special_tokens
from .render import FrozenClock, RenderError


@dataclass(frozen=True)
class Rendered:
    """What the engine would feed the model: the offline twin of vLLM's
    /v1/chat/completions/render. ``token_ids`` is None without a tokenizer."""

    text: str
    token_ids: list[int] | None
    engine: str  # the engine and version modelled, e.g. "vLLM 0.33.0"

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "engine": self.engine}


def render_request(engine, template, body, special, tokenizer, server_kwargs=None) -> Rendered | str:
    """One request through the engine's profile, or the one line saying why it is refused."""
    profile = profile_of(engine)
    try:
        prompt = request_prompt(
            engine,
            template,
            body,
            clock=FrozenClock(datetime.now()),
            special_tokens=resolve_special_tokens(tokenizer, special),
            server_kwargs=server_kwargs,
        )
    except EngineRefusal as error:
        return str(error)
    except (RenderError, EngineError) as error:
        # The server answers 400 with the template's own message (vLLM: ValueError from
        # apply_chat_template).
        return f"{profile.label} answers {profile.refusal_status}: the template refuses the request: {error}"
    ids = prompt.token_ids
    if ids is None:
        measuring = tokenizer or engine_tokenizer(engine)
        ids = tuple(measuring.encode(prompt.text)) if measuring is not None else None
    return Rendered(prompt.text, list(ids) if ids is not None else None, profile.label)
