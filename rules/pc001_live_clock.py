"""## What it does
Finds the current time reaching the rendered prompt: `strftime_now(...)` (or another
clock global) whose value is printed, directly or through `{% set %}`, a macro, a
namespace, or a default system prompt used only when the request has no system message.
A clock value that is computed but never printed (Llama 4's `date_string`) is not
reported, and neither is a fixed default (Llama 3.1's `date_string = "26 Jul 2024"`).

## Why is this bad?
The date sits in the system block, in the first cache block of every prompt. At local
midnight its text changes, the hash of block 0 changes, and because every block hash is
chained on its parent, the serving engine's whole prefix cache goes cold at once: every
live session recomputes its full context on its next turn, with no log line saying why.

## Example
```jinja
{{- "Current date: " + strftime_now("%Y-%m-%d") + "\n\n" }}
```

## Use instead
```jinja
{%- if date_string is not defined %}{%- set date_string = "2026-01-01" %}{%- endif %}
{{- "Current date: " + date_string + "\n\n" }}
```
and pass the real date once per session: `chat_template_kwargs={"date_string": ...}`.

## Fix safety
The fix freezes the date at a fixed default (the fix date, or `--frozen-date`) and lets
callers pass `date_string`. The model sees a fixed date instead of today's unless the
caller passes one; nothing else in the prompt changes.
"""

from __future__ import annotations

from tmpl_lint.analysis import Facts
from tmpl_lint.findings import Finding, RuleInfo

RULE = RuleInfo("PC001", "live-clock", "warning", "the current time reaches the rendered prompt")


def check(facts: Facts) -> list[Finding]:
    findings: dict[tuple[int, int], Finding] = {}
    for sink in facts.sinks:
        labels = sink.all_labels()
        for label in labels:
            if label.kind != "clock" or label.site is None:
                continue
            key = (label.site.line, label.site.column)
            if key in findings:
                continue
            where = "the prompt"
            if any(other.kind == "first_message" for other in labels):
                where = "the default system prompt (used when the request has no system message)"
            message = (
                f"`{label.name}(...)` puts the current time into {where}: "
                "the prefix cache goes cold whenever the rendered date changes"
            )
            findings[key] = RULE.at(label.site, message, labels)
    return list(findings.values())
