r"""## What it does
Reports a template whose render ran longer or printed more than the render limits allow
(`--render-timeout`, default 2 s per render; `--render-max-bytes`, default 1,000,000
characters), or that could not be analysed (nesting too deep). Nested `range` loops,
exponential string growth and runaway recursion end here, within seconds, instead of
hanging the lint.

## Why is this bad?
Chat templates from the Hub are untrusted code, and every serving engine renders them on
every request. A template that takes seconds to render adds those seconds to every
request's latency before the prefix cache is even consulted; one that prints megabytes
fills the context with them.

## Example
```jinja
{%- for i in range(100000) %}{%- for j in range(100000) %}{%- endfor %}{%- endfor %}
```

## Use instead
```jinja
{%- for message in messages %}{{ message.content }}{%- endfor %}
```

## Fix safety
No automatic fix. No other finding of the template is proven once a limit is hit.
"""

from __future__ import annotations

from dataclasses import dataclass

from tmpl_lint.analysis.facts import Site
from tmpl_lint.findings import Finding, Message, Outcome

from ._contract import RuleInfo, Severity

# Produced by the prover and the analysis when a limit stops them.
RULE = RuleInfo(
    "PC101",
    "render-limit-exceeded",
    Severity.ERROR,
    "rendering exceeded the time or size limit",
    reports=Outcome.RENDER_LIMIT_EXCEEDED,
)


@dataclass(frozen=True)
class LintingStopped(Message):
    text = "linting this template stopped: {why}"
    why: str  # the limit the child process hit, or the tokenizer's error


@dataclass(frozen=True)
class RenderLimit(Message):
    text = 'render limit exceeded in "{scenario}": {error}'
    scenario: str
    error: str | None


def stopped(site: Site, why: str) -> Finding:
    """The finding for a template whose lint a limit (or a tokenizer's panic) stopped."""
    return RULE.at(site, LintingStopped(why))


def limit_exceeded(site: Site, scenario: str, error: str | None) -> Finding:
    """The finding for a template whose render in ``scenario`` exceeded a limit."""
    return RULE.at(site, RenderLimit(scenario, error))


@dataclass(frozen=True)
class TooDeep(Message):
    text = "the template is nested too deeply to analyse; what follows the limit is not checked"


def check(facts) -> list:
    if not facts.too_deep:
        return []
    return [RULE.at(Site(1, "", fixed_column=1), TooDeep())]
