r"""## What it does
Reports a template whose next turn does not extend the previous prompt when no finding
explains why. The prover renders synthetic sessions (chat with reasoning, an agent loop
with tool calls across two user queries, the clock stepped by a second to a year, tool
arguments as the model wrote them, each reasoning switch at both values) and diffs the
token ids of consecutive calls; a divergence no finding explains, and that is not in the
generation prompt or the reply (those are PC006's), becomes this finding, with its proof
and the message, role and field that changed (or the text before the first message, as in
the example below: no message's).

## Why is this bad?
Whatever the mechanism, the prompt of turn N+1 stops matching the prompt of turn N (or the
prompt plus the reply the model generated) at the reported token, so every block after it
is recomputed on every turn. On engines that cannot roll back a recurrent state, the whole
prompt is recomputed.

## Example
```jinja
{{- "Continued conversation. " if messages | length > 1 else "New conversation. " }}
{%- for message in messages %}{{ message.content }}{% endfor %}
```

## Use instead
```jinja
{%- for message in messages %}{{ message.content }}{% endfor %}
```

Where the only divergence is the reply's end-of-turn marker, written one way while the
reply is the newest message and another in history, the loss is bounded (at most the block
that holds the marker, whatever the session's length) and the finding is informational,
with the bound stated. Reasoning left out of a reply once it is history costs the reply,
every turn: it fails.

## Fix safety
No automatic fix: the divergence is measured, not explained. The proof shows both renders
at the first diverging token.
"""

from __future__ import annotations

from dataclasses import dataclass

from tmpl_lint.analysis.facts import Site
from tmpl_lint.findings import Finding, Message, Outcome
from tmpl_lint.proofs import Cause, Divergence

from ._contract import RuleInfo, Severity

# Produced by the prover (tmpl_lint.proving.attribution.attach_proofs), not by a static check.
RULE = RuleInfo(
    "PC100",
    "unstable-render",
    Severity.WARNING,
    "the next turn does not extend the previous prompt",
    reports=Outcome.UNEXPLAINED_DIVERGENCE,
)


@dataclass(frozen=True)
class Unexplained(Message):
    text = (
        'the next turn does not extend the previous prompt: {where} renders differently in "{scenario}", '
        "calls {first_call}->{next_call} ({cause}), and no rule explains why"
    )
    place: str  # the message, role and field that changed, or the text's place
    in_a_message: bool  # False: the text before, between or after the messages
    scenario: str
    call: int  # the first of the two calls (0-based)
    cause: Cause

    @property
    def where(self) -> str:
        return self.place if self.in_a_message else f"the text {self.place}"

    @property
    def first_call(self) -> int:
        return self.call + 1

    @property
    def next_call(self) -> int:
        return self.call + 2


def unexplained(site: Site, worst: Divergence) -> Finding:
    """The finding for divergences no rule explains, of ``worst``'s cause: where ``worst``
    (the first scenario's) renders differently."""
    return RULE.at(site, Unexplained(worst.place, worst.message_index is not None, worst.scenario, worst.call, worst.cause))
