r"""## What it does
Finds the current time reaching the rendered prompt: `strftime_now(...)` (or another
clock global, also called through a name it was set to, `{% set clock = strftime_now %}`,
or out of a namespace or a list that holds it, `ns.clock(...)`, `clocks[0](...)`; reported
at the call) whose value is printed, directly or through `{% set %}`, a macro, a namespace, or a
default system prompt used only when the request has no system message.
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
This fix is unsafe: `--fix` applies it only with `--unsafe-fixes` (or `unsafe-fixes = true`), because the model then sees a fixed date instead of today's.
The fix freezes the clock at a fixed default (noon of the fix date, or of `--frozen-date`)
and lets callers pass it: every call that reaches the prompt is replaced, each in its own
format, through one variable per format named after what it shows (`date_string`, or
`weekday_string`, `time_string`, `datetime_string`). The model sees a fixed date instead
of today's unless the caller passes one; nothing else in the prompt changes. A call's format
is a literal or a variable the template sets to one (`{% set fmt = '%Y-%m-%d' %}`); one a
caller may pass, or that branches set apart, is not fixed: the finding says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import date, datetime

from jinja2 import nodes

from tmpl_lint.analysis.facts import Facts, Label, LabelKind, Sources, expression_text
from tmpl_lint.analysis.values import UNDEFINED
from tmpl_lint.edits import FROZEN_TIME_OF_DAY, Edit, Fix, default_header, expression_span, jinja_literal
from tmpl_lint.findings import Finding, FixSafety, Message
from tmpl_lint.proofs import Cause, Proof
from tmpl_lint.scenarios import CLOCK_STEPS, ClockStep, ScenarioKind
from tmpl_lint.suppressions import suppressions

from ._contract import RuleInfo, Severity

# Globals that read the wall clock. transformers installs strftime_now; the others are
# names other runtimes (or custom renderers) expose with the same meaning.
CLOCK_GLOBALS = frozenset(
    {"strftime_now", "now", "today", "utcnow", "datetime_now", "current_date", "current_time", "get_current_date"}
)
# Template variables a caller passes the clock's value in (`date_string`, `current_time`).
DATE_LIKE = re.compile(r"date|time|today|now", re.IGNORECASE)

# Clock scenarios send one conversation twice: whatever changes before the generation
# prompt is the clock's, before the first message, in any message or after the last.
RULE = RuleInfo(
    "PC001",
    "live-clock",
    Severity.WARNING,
    "the current time reaches the rendered prompt",
    proven_by=frozenset({Cause.SYSTEM, Cause.HISTORY_REWRITE, Cause.AFTER_HISTORY}),
    proven_in=frozenset({ScenarioKind.CLOCK}),
    fix_safety=FixSafety.UNSAFE,
    sources=Sources(calls=CLOCK_GLOBALS),
)


def _is_clock(label: Label) -> bool:
    """A call of a clock global (the label's site names the call as the source writes it)."""
    return label.kind is LabelKind.CALL and label.name in CLOCK_GLOBALS and label.site is not None


@dataclass(frozen=True)
class LiveClock(Message):
    text = "`{call}(...)` puts the current time into {where}: the prefix cache goes cold whenever the rendered date changes"
    call: str | None
    where: str  # the prompt, or its default system prompt
    # What the proof measured: the smallest step of the clock that changed the prompt...
    step: ClockStep | None = None
    # ...or, where it changed only the generation prompt, the first such divergence
    # (scenario, unit, position).
    only_generation_prompt: tuple[str, str, int | None] | None = None

    def __str__(self) -> str:
        said = self.text.format(call=self.call, where=self.where)
        if self.only_generation_prompt is not None:
            scenario, unit, position = self.only_generation_prompt
            said += (
                f'; the clock changes only the generation prompt ("{scenario}", {unit} '
                f"{position}), which the next turn replaces with the reply: no cached prefix is lost"
            )
        if self.step is not None:
            said += f"; the rendered prompt changes {self.step.granularity}: it changed when the clock moved {self.step.name}"
        return said


def check(facts: Facts) -> list[Finding]:
    findings: dict[tuple[int, int], Finding] = {}
    for sink in facts.sinks:
        labels = sink.all_labels()
        for label in labels:
            if not _is_clock(label) or label.site is None:
                continue
            key = (label.site.line, label.site.column)
            if key in findings:
                continue
            where = "the prompt"
            if any(other.kind is LabelKind.FIRST_MESSAGE for other in labels):
                where = "the default system prompt (used when the request has no system message)"
            findings[key] = RULE.at(label.site, LiveClock(label.site.text, where), labels)
    return list(findings.values())


def prove(report, finding: Finding) -> tuple[Proof, Message]:
    """Proven by the smallest step of the clock that changed the prompt, which the message
    names: how often the prompt changes."""
    message = finding.body
    assert isinstance(message, LiveClock)  # every PC001 finding is check's
    matching = [divergence for divergence in report.divergences() if RULE.proves(divergence)]
    if not matching:
        in_generation_prompt = [
            divergence
            for divergence in report.divergences()
            if divergence.cause is Cause.GENERATION_PROMPT
            and (scenario := report.scenario(divergence.scenario)) is not None
            and scenario.kind is ScenarioKind.CLOCK
        ]
        if in_generation_prompt:
            # The clock moved the prompt, but only where the next turn puts the reply: say so,
            # rather than that nothing changed.
            first = in_generation_prompt[0]
            said = replace(message, only_generation_prompt=(first.scenario, first.unit, first.first_divergence))
            return Proof.not_reproduced(report.unit, report.tried(), report.unrendered()), said
        return Proof.not_reproduced(report.unit, report.tried(), report.unrendered()), message
    stepped = []
    for divergence in matching:
        scenario = report.scenario(divergence.scenario)
        if scenario is not None and scenario.clock_step is not None:
            stepped.append((scenario.clock_step, divergence))
    if not stepped:
        chosen = max(matching, key=lambda divergence: divergence.lost_tokens)
        return Proof.proven(chosen, report.rates(chosen.scenario)), message
    finest = min(CLOCK_STEPS.index(step) for step, _ in stepped)  # the steps run finest first
    step, chosen = max(
        ((step, divergence) for step, divergence in stepped if CLOCK_STEPS.index(step) == finest),
        key=lambda pair: pair[1].lost_tokens,
    )
    return Proof.proven(chosen, report.rates(chosen.scenario)), replace(message, step=step)


# strftime directives by what they show: a value callers pass is named after it, so that a
# weekday never lands in ``date_string``. %c and %s show both a date and a time of day.
_DIRECTIVE = re.compile(r"%[-_0^#]?([A-Za-z])")
_TIME_OF_DAY = frozenset("HIMSpfXTRrklPcs")
_DATE = frozenset("YyCGgmbBhdejUWVxFDcs")
_WEEKDAY = frozenset("aAuw")


@dataclass(frozen=True)
class _Shows:
    """What a clock format shows: the words the fix's title says it with, and the name of
    the variable a caller passes it in."""

    noun: str
    variable: str
    dated: bool  # "instead of today's", else "instead of the current one"


def _shows(format: str) -> _Shows:
    directives = set(_DIRECTIVE.findall(format))
    timed, dated = bool(directives & _TIME_OF_DAY), bool(directives & _DATE)
    if timed and dated:
        return _Shows("the date and time", "datetime_string", False)
    if timed:
        return _Shows("the time", "time_string", False)
    if directives & _WEEKDAY and not dated:
        return _Shows("the weekday", "weekday_string", True)
    return _Shows("the date", "date_string", True)


def fix(facts: Facts, finding: Finding, options) -> Fix:
    """Replace every call of the clock that reaches the prompt with the fix date (at noon) in
    the call's own format, which callers can override: through the variable the template
    already assigns it to or names as a switch, else through a new variable set once at the
    top, one per format and named after what it shows (``date_string``, ``weekday_string``,
    ``time_string``, ``datetime_string``).

    Every call, not only the finding's: two calls on one line are one finding, and a fix of
    one call would leave the clock live in the other; calls in two formats frozen apart
    would show two moments."""
    site = finding.site
    if site is None:  # every PC001 finding is placed by the analysis
        return Fix.refuse("cannot locate the clock call in the source")
    name = site.text
    printed_lines = {
        label.site.line
        for sink in facts.sinks
        for label in sink.all_labels()
        if _is_clock(label) and label.site is not None and label.site.text == name
    }
    # A call on a line whose PC001 is suppressed is left as it is: its clock is wanted.
    suppressed = suppressions(facts.source_map)
    calls = [
        call
        for call in facts.nodes_of(nodes.Call)
        if isinstance(call.node, (nodes.Name, nodes.Getattr, nodes.Getitem))
        and expression_text(call.node) == name  # `strftime_now`, an alias, `ns.clock`, `clocks[0]`
        and call.lineno in printed_lines
        and not any(suppression.covers(RULE.code, call.lineno) for suppression in suppressed)
    ]
    if not any(call.node is site.node for call in calls):
        return Fix.refuse("cannot locate the clock call in the source")
    moment = datetime.combine(options.frozen_date, FROZEN_TIME_OF_DAY)
    replaced: list[tuple[int, int, str, str | None]] = []  # (start, end, format, the caller's variable)
    for call in calls:
        format = _format(facts, call)
        if format is None:
            return Fix.refuse(f"the clock's format at line {call.lineno} is not a literal string, nor a variable set to one")
        span = expression_span(facts.source_map, call)
        if span is None:
            return Fix.refuse(f"cannot locate the clock call at line {call.lineno} in the source")
        assigned_to = next(
            (
                assign.target.name
                for assign in facts.nodes_of(nodes.Assign)
                if assign.node is call and isinstance(assign.target, nodes.Name) and assign.target.name in facts.variables
            ),
            None,
        )
        if assigned_to is None and call.node is site.node and finding.switch is not None:
            assigned_to = finding.switch.name
        replaced.append((span[0], span[1], format, assigned_to))
    replaced.sort()
    headers: list[Edit] = []
    edits: list[Edit] = []
    shown: dict[tuple[str, str], _Shows] = {}  # (frozen text, variable) -> what it shows, in the template's order
    new_variables: dict[str, str] = {}  # format -> the variable set at the top for it
    taken: set[str] = set()
    for start, end, format, caller_variable in replaced:
        frozen = moment.strftime(format)
        shows = _shows(format)
        if caller_variable is not None:
            edits.append(Edit(start, end, jinja_literal(frozen)))
            variable = caller_variable
        else:
            if format not in new_variables:
                new_variables[format] = _free_name(facts, shows.variable, taken)
                taken.add(new_variables[format])
                headers.append(default_header(facts.text, new_variables[format], jinja_literal(frozen)))
            variable = new_variables[format]
            edits.append(Edit(start, end, variable))
        shown.setdefault((frozen, variable), shows)
    return Fix(_title(shown), [headers + edits])


def _format(facts: Facts, call: nodes.Call) -> str | None:
    """The one format a clock call is given: a literal string, or what the analysis folded
    its argument to (a variable set to a literal, `{% set fmt = '%Y-%m-%d' %}`); None for a
    format the render decides (a template variable a caller may pass, two branches)."""
    if len(call.args) != 1 or call.kwargs or call.dyn_args or call.dyn_kwargs:
        return None
    if isinstance(call.args[0], nodes.Const):
        return call.args[0].value if isinstance(call.args[0].value, str) else None
    return facts.call_arguments.get(id(call))


def trial_values(facts: Facts, name: str, finding: Finding | None) -> list[object] | None:
    """For a date-like name: unset, and a fixed date as the template's own clock call writes
    it ("26 Jul 2024", not ISO)."""
    if not DATE_LIKE.search(name):
        return None
    return [UNDEFINED, date.today().strftime(_clock_format(finding, facts))]


def _clock_format(finding: Finding | None, facts: Facts) -> str:
    """The strftime format of the clock call a finding is at, else of the template's first
    clock call with a literal format, else ISO (2026-03-01)."""
    calls = [
        node
        for node in facts.nodes_of(nodes.Call)
        if isinstance(node.node, nodes.Name) and node.node.name in CLOCK_GLOBALS and node.args
    ]
    at = finding.site.node if finding is not None and finding.site is not None else None
    calls.sort(key=lambda node: node is not at)
    for call in calls:
        if isinstance(call.args[0], nodes.Const) and isinstance(call.args[0].value, str):
            return call.args[0].value
    return "%Y-%m-%d"


def _title(shown: dict[tuple[str, str], _Shows]) -> str:
    """What the model now sees, and what the caller passes to see the real time instead."""
    seen = " and ".join(f"{shows.noun} {frozen}" for (frozen, _), shows in shown.items())
    variables = " and ".join(dict.fromkeys(variable for _, variable in shown))
    instead = "today's" if next(iter(shown.values())).dated else "the current one"
    if len(shown) > 1:
        instead = "the current ones"
    return f"the model sees {seen} instead of {instead} unless the caller passes {variables}"


def _free_name(facts: Facts, wanted: str, taken: set[str]) -> str:
    used = facts.variables | {node.name for node in facts.nodes_of(nodes.Name)} | taken
    name, number = wanted, 1
    while name in used:
        number += 1
        name = f"{wanted}_{number}"
    return name
