r"""## What it does
Finds output that differs between two renders of the same request: the `random` and
`shuffle` filters, `lipsum()`, and anything computed from them that reaches the prompt.

## Why is this bad?
A prefix cache hit needs the same tokens for the same history. A random pick in the
system block or in a past turn changes the prompt on every request, so nothing after it is
ever reused, not even between two identical requests.

## Example
```jinja
{{- ["Be concise.", "Be helpful."] | random }}
```

## Use instead
```jinja
{{- "Be concise." }}
```

## Fix safety
No automatic fix: choosing one of the alternatives changes what the model sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from tmpl_lint.analysis.facts import Facts, LabelKind, Sources
from tmpl_lint.findings import Finding, Message
from tmpl_lint.proofs import Proof

from ._contract import RuleInfo, Severity

RULE = RuleInfo(
    "PC005",
    "nondeterministic-render",
    Severity.WARNING,
    "output differs between identical renders",
    makes_renders_incomparable=True,
    # The only sources of randomness a sandboxed template reaches.
    sources=Sources(calls=frozenset({"lipsum"}), filters=frozenset({"random", "shuffle"})),
)


@dataclass(frozen=True)
class RandomOutput(Message):
    text = "`{name}` makes two renders of the same request differ"
    name: str | None


def check(facts: Facts) -> list[Finding]:
    findings: dict[tuple[int, int], Finding] = {}
    for sink in facts.sinks:
        labels = sink.all_labels()
        for label in labels:
            if label.site is not None and (
                (label.kind is LabelKind.CALL and label.name in RULE.sources.calls)
                or (label.kind is LabelKind.FILTER and label.name in RULE.sources.filters)
            ):
                key = (label.site.line, label.site.column)
                findings.setdefault(key, RULE.at(label.site, RandomOutput(label.name), labels))
    return list(findings.values())


def prove(report, finding: Finding) -> tuple[Proof, Message]:
    """Random output is shown by rendering one request twenty times, not by a turn pair."""
    evidence = "twenty renders of one request"
    if report.deterministic:
        return Proof.not_reproduced(report.unit, (evidence,)), finding.body
    return Proof.proven_by(report.unit, evidence), finding.body
