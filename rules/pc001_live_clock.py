r"""## What it does
Finds the current time reaching the rendered prompt: `strftime_now(...)` (or another
clock global) whose value is printed, directly or through `{% set %}`, a macro, a
namespace, or a default system prompt used only when the request has no system message.
A clock value that is computed but never printed (Llama 4's `date_string`) is not
reported, and neither is a fixed default (Llama 3.1's `date_string = "26 Jul 2024"`).
The proof sends one conversation twice with the clock stepped between the calls, with and
without tools and a system message (a date can hide under `if tools` or in a default
system prompt), by a second, a minute, an hour, half a day (across noon), a day, a week, a
month and a year, and the finding says how often the prompt changes: per request, per
minute, per hour, twice a day (AM/PM), per day, per week, per month or per year.

## Why is this bad?
The date sits in the system block, in the first cache block of every prompt. When its text
changes (at local midnight for a date; every minute, or every request, for a clock with
minutes or seconds: the proof says which), the hash of block 0 changes, and because every block hash is
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
The fix freezes the clock at a fixed default (noon of the fix date, or of `--frozen-date`)
and lets callers pass `date_string`. The model sees a fixed date instead of today's unless the
caller passes one; nothing else in the prompt changes.
"""

from __future__ import annotations

from datetime import datetime, time

from jinja2 import nodes

from tmpl_lint.analysis import Facts, LabelKind
from tmpl_lint.edits import Edit, Fix, default_header, expression_span, jinja_literal
from tmpl_lint.findings import Finding, RuleInfo
from tmpl_lint.proofs import Cause, Proof
from tmpl_lint.scenarios import CLOCK_STEPS, ScenarioKind

# Clock scenarios send one conversation twice: whatever changes before the generation
# prompt is the clock's, before the first message, in any message or after the last.
RULE = RuleInfo(
    "PC001",
    "live-clock",
    "warning",
    "the current time reaches the rendered prompt",
    proven_by=frozenset({Cause.SYSTEM, Cause.HISTORY_REWRITE, Cause.AFTER_HISTORY}),
    proven_in=frozenset({ScenarioKind.CLOCK}),
)


def check(facts: Facts) -> list[Finding]:
    findings: dict[tuple[int, int], Finding] = {}
    for sink in facts.sinks:
        labels = sink.all_labels()
        for label in labels:
            if label.kind is not LabelKind.CLOCK or label.site is None:
                continue
            key = (label.site.line, label.site.column)
            if key in findings:
                continue
            where = "the prompt"
            if any(other.kind is LabelKind.FIRST_MESSAGE for other in labels):
                where = "the default system prompt (used when the request has no system message)"
            message = (
                f"`{label.name}(...)` puts the current time into {where}: "
                "the prefix cache goes cold whenever the rendered date changes"
            )
            findings[key] = RULE.at(label.site, message, labels)
    return list(findings.values())


def prove(report, finding: Finding) -> Proof:
    """Proven by the smallest step of the clock that changed the prompt, which the message
    names: how often the prompt changes."""
    matching = [divergence for divergence in report.divergences() if RULE.proves(divergence)]
    if not matching:
        return Proof.not_reproduced(report.unit, report.tried(), report.unrendered())
    stepped = []
    for divergence in matching:
        scenario = report.scenario(divergence.scenario)
        if scenario is not None and scenario.clock_step is not None:
            stepped.append((scenario.clock_step, divergence))
    if not stepped:
        chosen = max(matching, key=lambda divergence: divergence.lost_tokens)
        return Proof.proven(chosen, report.rates(chosen.scenario))
    finest = min(CLOCK_STEPS.index(step) for step, _ in stepped)  # the steps run finest first
    step, chosen = max(
        ((step, divergence) for step, divergence in stepped if CLOCK_STEPS.index(step) == finest),
        key=lambda pair: pair[1].lost_tokens,
    )
    finding.message += f"; the rendered prompt changes {step.granularity}: it changed when the clock moved {step.name}"
    return Proof.proven(chosen, report.rates(chosen.scenario))


# The moment the fix freezes the clock at: the fixer's Verifier renders the original with
# its clock at noon of the fix date (fixer.Verifier.clock), and the fix is kept only if a
# single-turn conversation renders the same. At midnight, every format with the hour or
# AM/PM ("%H:%M", "%p") printed differently there, and such clocks were never fixed.
FROZEN_TIME_OF_DAY = time(12, 0)


def fix(facts: Facts, finding: Finding, options) -> Fix:
    """Replace the clock call with the fix date in the call's own format, which callers can
    override: through the variable the template already assigns it to or names as a switch,
    else through a new ``date_string`` set once at the top."""
    site = finding.site
    call = next((call for call in facts.nodes_of(nodes.Call) if call.node is site.node), None)
    if (
        call is None
        or len(call.args) != 1
        or not isinstance(call.args[0], nodes.Const)
        or not isinstance(call.args[0].value, str)
    ):
        return Fix.refuse("the clock's format is not a literal string")
    span = expression_span(facts.source_map, call)
    if span is None:
        return Fix.refuse("cannot locate the clock call in the source")
    frozen = datetime.combine(options.frozen_date, FROZEN_TIME_OF_DAY).strftime(call.args[0].value)
    literal = jinja_literal(frozen)
    assigned_to = next(
        (
            assign.target.name
            for assign in facts.nodes_of(nodes.Assign)
            if assign.node is call and isinstance(assign.target, nodes.Name) and assign.target.name in facts.variables
        ),
        None,
    )
    caller_variable = assigned_to or (finding.switch.name if finding.switch else None)
    if caller_variable:
        title = f"the model sees the date {frozen} instead of today's unless the caller passes {caller_variable}"
        return Fix(title, [[Edit(span[0], span[1], literal)]])
    variable = _free_name(facts, "date_string")
    title = f"the model sees the date {frozen} instead of today's unless the caller passes {variable}"
    return Fix(title, [[default_header(facts.text, variable, literal), Edit(span[0], span[1], variable)]])


def _free_name(facts: Facts, wanted: str) -> str:
    used = facts.variables | {node.name for node in facts.nodes_of(nodes.Name)}
    name, number = wanted, 1
    while name in used:
        number += 1
        name = f"{wanted}_{number}"
    return name
