"""What every engine module shares: the engines an option names, what a profile says of
its engine, the prompt one renders, the error a request the engine would reject raises."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# llama-server (llamacpp.py): llama.cpp's own template engine renders, as it renders every
# template read from a GGUF (``resolve_engine``).
LLAMACPP = "llamacpp"
ENGINES = ("vllm", "sglang", LLAMACPP, "hf")


class EngineError(ValueError):
    """The engine would reject the request (vLLM answers 400)."""


@dataclass(frozen=True)
class EngineProfile:
    """One engine version: its request handling (``validators``, then its module's
    ``prepare``), what renders its templates, how it tokenizes, and the cache model that
    serves it. A new engine version is a new profile in its engine's module."""

    name: str  # the --engine value
    product: str
    version: str
    cache_model: str  # kv_cache's model of its prefix cache
    renderer: str  # what renders the template
    tokenization: str
    # One assistant message as the template sees it (what ``passes_reasoning`` asks)
    template_message: Callable[[dict[str, Any]], dict[str, Any]]
    refusal_status: str = "400"
    # The server's request validation: each gives (field, why) for a request it answers
    # with an error, else None
    validators: tuple[Callable[[dict[str, Any]], tuple[str, str] | None], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.product} {self.version}" if self.version else self.product

    def refusal(self, body: dict[str, Any]) -> EngineRefusal | None:
        """The engine's answer to a request it does not render, or None."""
        for validator in self.validators:
            found = validator(body)
            if found is not None:
                return EngineRefusal(self, *found)
        return None

    def passes_reasoning(self, field: str) -> tuple[str, ...]:
        """The names under which the template sees an assistant message's ``field``
        (``reasoning_content``, ``reasoning``, ``thinking``...) as a client sent it; empty
        where the engine drops it. Asked of the model itself, so it says what renders do."""
        mark = "\0reasoning\0"
        seen = self.template_message({"role": "assistant", "content": "", field: mark})
        return tuple(sorted(key for key, value in seen.items() if value == mark))


class EngineRefusal(EngineError):
    """The engine's server answers the request with an error instead of rendering it: one
    line naming the field, as the server's own message does."""

    def __init__(self, profile: EngineProfile, field: str, reason: str):
        super().__init__(f"{profile.label} answers {profile.refusal_status}: {field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: its text, and the token ids the engine itself produced where it
    tokenizes piece by piece (harmony encodes message text as text: a literal "<|end|>" in
    a message is not the special token its decoded text would encode to). ``token_ids`` is
    None where the engine tokenizes the whole text, as vLLM does a template's render."""

    text: str
    token_ids: tuple[int, ...] | None = None


# --- gpt-oss on vLLM: openai-harmony, not the template -------------------------------

HARMONY_MARKUP = ("<|start|>", "<|channel|>", "<|message|>")
# vLLM's settings that change a harmony render, read from the environment as the server does.
ENGINE_ENVIRONMENT = ("VLLM_SYSTEM_START_DATE", "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS")


# The renderer vLLM's server uses for gpt-oss, in place of the template. Not an --engine
# choice: resolve_engine picks it for "vllm" where vLLM would.
HARMONY = "vllm-harmony"
