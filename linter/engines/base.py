"""What every engine module shares: the engines an option names, the prompt one renders, the
error a request the engine would reject raises."""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("vllm", "hf")


class EngineError(ValueError):
    """The engine would reject the request (vLLM answers 400)."""


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
