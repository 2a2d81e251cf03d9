r"""## What it does
Finds an earlier message whose render depends on where the last user query is: a scan over
all messages records a position (Qwen3's reverse scan into `ns.last_query_index`, GLM's
`ns.last_user_index`, Nemotron's `last_user_idx`...), and the loop that renders the
messages compares each message's index with it. The check follows data, not names: the
position is followed through a reverse scan that stops with `{% break %}`, copies into
plain variables (`{% set last = ns.last_query_index %}`), booleans derived from it
(`{% set keep = loop.index0 > last %}`) and text a namespace accumulates under such a
flag and prints after the loop. A variable merely called `last_query_index` that changes
no output is not reported, nor is a scan that ends on the *first* match in message order
(a forward scan that stops, a reverse one that does not): new messages never move it.

## Why is this bad?
The next user message moves the recorded position. Every assistant turn before it then
renders differently (typically without its reasoning), so the next prompt stops matching
the previous one at the first rewritten assistant turn, a few dozen tokens in, and the
serving engine recomputes everything after that point on every turn of the session.

## Example
```jinja
{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- if message.role == "user" %}
        {%- set ns.last_query_index = (messages|length - 1) - loop.index0 %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "assistant" and loop.index0 > ns.last_query_index %}
        {{- "<think>" + message.reasoning_content + "</think>" }}
    {%- endif %}
    {{- message.content }}
{%- endfor %}
```

## Use instead
```jinja
{%- for message in messages %}
    {%- if message.role == "assistant" and message.reasoning_content %}
        {{- "<think>" + message.reasoning_content + "</think>" }}
    {%- endif %}
    {{- message.content }}
{%- endfor %}
```

## Fix safety
This fix is unsafe: `--fix` applies it only with `--unsafe-fixes` (or `unsafe-fixes = true`), because the model then sees its earlier reasoning and the prompt grows.
The fix keeps reasoning for every assistant turn that has it, whatever a switch says; only
where that edit cannot be made does it set a history switch's default (`clear_thinking`,
`preserve_thinking`, `truncate_history_thinking`) to the stable value. The model then
sees its earlier reasoning in later turns, which some models were not trained on; the
prompt grows by the kept reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from tmpl_lint.analysis.facts import Facts, LabelKind
from tmpl_lint.edits import Fix, replace_at, switch_default_fix
from tmpl_lint.findings import Finding, FixSafety, Message
from tmpl_lint.proofs import Cause

from ._contract import RuleInfo, Severity

RULE = RuleInfo(
    "PC002",
    "history-rewrite",
    Severity.WARNING,
    "an earlier message renders differently once a new user message arrives",
    proven_by=frozenset({Cause.HISTORY_REWRITE, Cause.REPLY_REWRITE}),
    moved_by=frozenset({"user"}),  # only a new user query moves the last query's position
    fix_safety=FixSafety.UNSAFE,
)


@dataclass(frozen=True)
class ScannedPosition(Message):
    text = (
        "how a message renders depends on `{name}`{origin}, a position found by scanning all "
        "messages: the next user message moves it and rewrites earlier turns"
    )
    name: str | None
    set_at: int | None  # the line the position is set at

    @property
    def origin(self) -> str:
        return f" (set at line {self.set_at})" if self.set_at is not None else ""


def check(facts: Facts) -> list[Finding]:
    # One finding per scanned position, at its first use while rendering messages.
    findings: dict[tuple, Finding] = {}
    for sink in facts.sinks:
        if not sink.loops:
            continue
        labels = sink.all_labels()
        # Only the positions are put in order: a column is worked out only where needed.
        scanned = [
            label
            for label in labels
            if label.kind is LabelKind.SCAN_POSITION and label.site is not None and label.loop not in sink.loops
        ]
        for label in sorted(scanned, key=_by_place):
            assert label.site is not None  # only placed labels are scanned
            key = (label.name, label.origin)
            if key in findings and _by_place(findings[key]) <= _by_place(label):
                continue
            message = ScannedPosition(label.name, label.origin.line if label.origin else None)
            findings[key] = RULE.at(label.site, message, labels)
    return list(findings.values())


def _by_place(item) -> tuple[int, int]:
    site = getattr(item, "site", None)
    if site is not None:
        return (site.line, site.column)
    return (getattr(item, "line", 0), getattr(item, "column", 0))


def fix(facts: Facts, finding: Finding, options) -> Fix:
    """Read the scanned position as "before every message", so every assistant turn keeps its
    reasoning, whatever a switch says; else set the template's own switch to its stable
    default (which fixes only the requests that leave it unset: verified, it is refused when
    a value a deployment may pass still breaks)."""
    if finding.site is None:  # every PC002 finding is placed by the analysis
        return Fix.refuse("cannot locate the scanned position in the source")
    name = finding.site.text
    reads = {}
    for sink in facts.sinks:
        for label in sink.all_labels():
            if (
                label.kind is LabelKind.SCAN_POSITION
                and label.name == name
                and label.site is not None
                and label.site.node is not None
            ):
                reads[(label.site.line, label.site.column)] = label.site
    title = f"every assistant turn keeps its reasoning in history, whatever follows it (`{name}` no longer decides)"
    alternatives = []
    for constant in ("-1", "(messages|length)"):
        # Reads where the source is the position itself (a value that reached another name
        # is left to the verifier: the divergence must go).
        edits = [edit for site in reads.values() if (edit := replace_at(facts, site, constant)) is not None]
        if edits:
            alternatives.append(edits)
    if alternatives:
        return Fix(title, alternatives)
    return switch_default_fix(facts.text, finding) or Fix.refuse(f"cannot locate the reads of `{name}`")
