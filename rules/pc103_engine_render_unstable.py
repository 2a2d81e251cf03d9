r"""## What it does
Reports a model that the serving engine renders with its own code instead of the chat
template, when that render does not extend the previous prompt. vLLM serves gpt-oss this
way: its server builds the prompt with openai-harmony and never reads the Jinja template
(it goes by config.json's `model_type`; without a config.json beside the template, a
template in harmony's markup is taken for gpt-oss).
Under `--engine vllm` the prover renders its sessions as vLLM's server does and diffs the
token ids; one finding per cause, with the proof. The template's own findings are then
proven on the template (as transformers, llama.cpp and others render it), because editing
the template changes nothing on vLLM.

## Why is this bad?
Same cost as any unstable render: every block after the first diverging token is
recomputed on every turn. vLLM 0.33 writes the server's date into the harmony system
message of every request (`Current date: ...`), so every cached session goes cold at
midnight, and it drops the analysis of turns answered since, so the tokens the model
generated as reasoning are never reused.

## Example
A template in openai-harmony's markup, as gpt-oss ships it:
```jinja
{%- for message in messages %}
    {{- "<|start|>" + message.role + "<|channel|>final<|message|>" + message.content + "<|end|>" }}
{%- endfor %}
{%- if add_generation_prompt %}{{- "<|start|>assistant" }}{%- endif %}
```
served as vLLM serves it by default:
```console
$ vllm serve openai/gpt-oss-120b
```

## Use instead
```console
$ VLLM_SYSTEM_START_DATE=2026-01-01 vllm serve openai/gpt-oss-120b
```
The dropped analysis is harmony's format (the model is trained to see no reasoning of
answered turns); expect those tokens to be recomputed.

## Fix safety
No automatic fix: the cause is in the engine, not in the file, so the pre-commit hooks
leave this rule out. tmpl-lint reads
`VLLM_SYSTEM_START_DATE` and `VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS` from its own
environment, as the server does, to check a server started with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tmpl_lint.analysis.facts import Site
from tmpl_lint.findings import Finding, Message, Outcome
from tmpl_lint.proofs import Cause

from ._contract import RuleInfo, Severity

# Produced by the prover (tmpl_lint.proving.attribution.engine_findings), not by a static check.
RULE = RuleInfo(
    "PC103",
    "engine-render-unstable",
    Severity.WARNING,
    "the engine's own render does not extend the previous prompt",
    reports=Outcome.ENGINE_RENDER_UNSTABLE,
    no_fix="the engine renders this model with its own code, not the template: no edit of the template changes it",
)


# What the engine does for each cause of divergence, where it is known.
ADVICE = {
    Cause.SYSTEM: "vLLM writes the server's date into the system message of every request (pin it with VLLM_SYSTEM_START_DATE)",
    Cause.HISTORY_REWRITE: "vLLM drops the analysis of turns answered since (openai-harmony's format)",
    Cause.REPLY_REWRITE: "vLLM drops the analysis of turns answered since (openai-harmony's format)",
}


def advice(cause: Cause) -> str:
    """What the engine does that causes a divergence of ``cause``."""
    return ADVICE.get(cause, "the engine renders this model without the template")


@dataclass(frozen=True)
class Unchecked(Message):
    text = "the engine renders this model without the template, and its render could not be checked: {reason}"
    reason: str


@dataclass(frozen=True)
class EngineUnstable(Message):
    text = "the engine's own render does not extend the previous prompt ({cause}): {advice}"
    cause: Cause

    @property
    def advice(self) -> str:
        return advice(self.cause)


def unchecked(site: Site, reason: str) -> Finding:
    """The finding for an engine's render of the model that could not be checked."""
    return RULE.at(site, Unchecked(reason))


def unstable(site: Site, cause: Cause) -> Finding:
    """The finding for a cause of divergence in the engine's own render."""
    return RULE.at(site, EngineUnstable(cause))
