r"""## What it does
Reports a template that fails on every conversation the prover renders: plain chat, with
and without a system message, an agent loop with tool calls (arguments as a mapping and as
a JSON string). The finding carries the template's own error message, for instance the
sandbox refusing an attribute (`access to attribute '__class__' of 'str' object is
unsafe`) or the template's `raise_exception`.

## Why is this bad?
A serving engine cannot render any request with this template, so there is no cache to
keep. Sandbox refusals mean the template tries to reach Python internals, which no chat
template needs: treat it as hostile.

## Example
```jinja
{{- ''.__class__.__mro__[1].__subclasses__() }}
```

## Use instead
```jinja
{%- for message in messages %}{{ message.content }}{%- endfor %}
```

## Fix safety
No automatic fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from tmpl_lint.analysis.facts import Site
from tmpl_lint.findings import Finding, Message, Outcome

from ._contract import RuleInfo, Severity

# Produced by the prover when no scenario renders.
RULE = RuleInfo(
    "PC102", "render-error", Severity.ERROR, "the template fails on every conversation tried", reports=Outcome.RENDER_ERROR
)


@dataclass(frozen=True)
class FailsEverywhere(Message):
    text = "the template fails on every conversation tried: {error}"
    error: str  # the template's own error, from the first conversation


def failure(site: Site, error: str) -> Finding:
    """The finding for a template no conversation renders with."""
    return RULE.at(site, FailsEverywhere(error))
