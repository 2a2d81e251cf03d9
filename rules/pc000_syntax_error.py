r"""## What it does
Reports a template that does not parse in the Jinja environment transformers and vLLM
render chat templates with (sandboxed, `trim_blocks`, `lstrip_blocks`, `loopcontrols`,
the `{% generation %}` tag).

## Why is this bad?
A template that does not parse cannot serve a single request, cached or not. Every other
rule needs the syntax tree, so none of them runs on this template.

## Example
```jinja
{%- for message in messages %}
    {{- message.content }}
{%- endif %}
```

## Use instead
```jinja
{%- for message in messages %}
    {{- message.content }}
{%- endfor %}
```

## Fix safety
No automatic fix: only the author knows what the template meant.
"""

from __future__ import annotations

from tmpl_lint.analysis.facts import Facts, Site
from tmpl_lint.findings import Finding, Outcome

from ._contract import RuleInfo, Severity

RULE = RuleInfo("PC000", "syntax-error", Severity.ERROR, "the template does not parse", reports=Outcome.SYNTAX_ERROR)


def check(facts: Facts) -> list[Finding]:
    error = facts.syntax_error
    if error is None:
        return []
    line = error.lineno or 1
    return [RULE.at(Site(line, "", fixed_column=1), f"template does not parse: {error.message}")]
