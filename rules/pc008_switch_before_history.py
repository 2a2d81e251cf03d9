r"""## What it does
Finds a per-request setting (a template variable passed in `chat_template_kwargs`, or
vLLM's `reasoning_effort`) whose value is printed before the conversation's history: in
the system block, or in the first message. The proof renders one session whose second
call sends the setting at another value, and reports where the prompts part (before the
end of the first message) and how many tokens of the cached prefix that voids.

## Why is this bad?
An engine reuses the cache only for an exact token prefix. A setting printed ahead of the
history makes every token after it depend on it: a client that changes it between two
calls of one session (a "Reasoning: high" for a hard question, thinking turned off for a
quick one) recomputes the whole conversation. Reported figures: 54.5 s against 5.4 s to
the first token at 42k tokens, 0% against 95% cache hits.

## Example
```jinja
{{- "<|system|>Reasoning Effort: " + reasoning_effort + "\n" }}
{%- for message in messages %}{{ "<|" + message.role + "|>" + message.content + "\n" }}{% endfor %}
```

## Use instead
Keep the setting the same within a session: per deployment (vLLM's
`--default-chat-template-kwargs`, or the value written into the template), or once per
conversation. Printed after the history instead, it moves once a message follows it (PC007)
or sits in the generation prompt, where a change costs only the reply's opener.
```jinja
{{- "<|system|>Reasoning Effort: High\n" }}
{%- for message in messages %}{{ "<|" + message.role + "|>" + message.content + "\n" }}{% endfor %}
```

## Fix safety
No automatic fix. Moving the setting after the history would be unsafe: it changes the
format the model was trained on. To get to green, keep the setting stable within a session
and suppress the finding on its line (`{# tmpl-lint: ignore[PC008] #}`), or move it after
the history and check the model's replies.
"""

from __future__ import annotations

from dataclasses import dataclass

from jinja2 import nodes

from tmpl_lint.analysis.facts import Facts, Site
from tmpl_lint.findings import Finding, Message
from tmpl_lint.proofs import Cause, Divergence
from tmpl_lint.scenarios import SETTING_CHANGED_NAME, ScenarioKind

from ._contract import RuleInfo, Severity

RULE = RuleInfo(
    "PC008",
    "switch-before-history",
    Severity.WARNING,
    "a per-request setting is printed before the conversation's history",
    proven_by=frozenset({Cause.SYSTEM}),
    proven_in=frozenset({ScenarioKind.SETTING_CHANGED}),
    no_fix="moving the setting after the history changes the format the model was trained on, an edit no fix makes "
    "(not even with --unsafe-fixes): keep it stable within a session, or move it by hand",
)


@dataclass(frozen=True)
class BeforeHistory(Message):
    text = (
        "`{name}` is printed before the conversation's history ({place}): a call that changes it voids "
        "the cached prefix, {lost} of {total} {unit}s recomputed at the second call of "
        "the proof's session, and the whole conversation in a longer one; keep it the same within a session "
        "(per deployment: --default-chat-template-kwargs), or print it after the history"
    )
    name: str
    place: str
    lost: int
    total: int
    unit: str


def found_by_proof(facts: Facts | None, divergence: Divergence) -> Finding:
    """The setting the session changed, at its first read in the template."""
    matched = SETTING_CHANGED_NAME.match(divergence.scenario)
    name = matched["name"] if matched else "a setting"
    message = BeforeHistory(name, divergence.place, divergence.lost_tokens, divergence.ideal_tokens, divergence.unit)
    return RULE.at(_first_read(facts, name), message)


def _first_read(facts: Facts | None, name: str) -> Site:
    if facts is not None and facts.tree is not None:
        for node in facts.nodes_of(nodes.Name):
            if node.name == name and node.ctx == "load":
                return facts.site(node, name)
    return Site(1, "", fixed_column=1)


def changed_settings(before: dict, after: dict) -> list[str]:
    """The settings a client changed between two calls of one session (each call's
    ``chat_template_kwargs``, with ``reasoning_effort`` among them): what ``replay`` names
    when a divergence before the end of the first message follows such a change."""
    return sorted(name for name in set(before) | set(after) if before.get(name, _UNSET) != after.get(name, _UNSET))


def client_change(names: list[str], lost: int, unit: str = "token") -> str:
    """How replay says a loss the client caused: "reasoning_effort changed between calls: 812 tokens"."""
    return f"{', '.join(names)} changed between calls: {lost} {unit}s"


_UNSET = object()
