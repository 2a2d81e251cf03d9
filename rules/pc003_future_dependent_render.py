r"""## What it does
Finds a message whose render depends on the messages after it:
- look-ahead scans, such as gpt-oss's `future_final_message` over `loop_messages[loop.index:]`;
- content emitted only while a message is the last one (`loop.last`, `messages[-1]`,
  `loop.revindex`, comparing the index with `messages|length`), other than the
  generation prompt (a test that also reads `add_generation_prompt`);
- blocks attached to the last user message, such as Mistral's `[AVAILABLE_TOOLS]` and
  system prompt on `user_messages[-1]`;
- facts about the whole list computed by an earlier scan and read while rendering;
- the number of messages printed outside the loop over them (`messages|length` in a system
  block): the text it is in changes with every turn;
- a window on the last messages (`messages[-4:]`): each new message pushes the oldest out,
  so the prompt renders differently from its start every turn.

A test that pairs `loop.last` with the next message's role (`loop.last or
messages[loop.index0 + 1].role != "tool"`) closes a group of same-role messages; it is
not reported, because the group is closed the same way once the next message arrives;
unless the loop runs over a slice (`messages[start:]`) and the next message is read from
the whole list, where with a system message sliced off `messages[loop.index0 + 1]` is the
current message, and `loop.last` alone decides.
Nor is `loop.last` (or the next message) in a branch only assistant messages take where
it decides the reply's reasoning (QwQ's `split('</think>')` unless the turn is last) or
only markup or a flag (an end marker printed only when it is not): an assistant message
is last only while it is the reply just written, so what changes is how the reply
replays, which the generation prompt's rule (PC006) is about. Where it cuts or changes
the reply's text otherwise (`{% if loop.last %}{{ m.content }}{% else %}{{ m.content[:20] }}{% endif %}`),
it is reported: the reply renders differently once a message follows it. Nor is a
separator the loop prints after every message but the last (`{% if not loop.last %}{{ "\n" }}{% endif %}`
as its last statement): the last message is followed by the generation prompt instead, and
where that does not start with the separator the prompt differs at the reply's opener.

## Why is this bad?
At turn N the message is last; at turn N+1 it is not, so it renders differently and the
prompt of turn N+1 stops matching the prompt of turn N at that message. Every token after
it is recomputed on every turn.

## Example
```jinja
{%- if messages[0].role == "system" %}
    {%- set system_message = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message.role == "user" and loop.last and system_message is defined %}
        {{- "[INST]" + system_message + "\n\n" + message.content + "[/INST]" }}
    {%- elif message.role == "user" %}
        {{- "[INST]" + message.content + "[/INST]" }}
    {%- elif message.role == "assistant" %}
        {{- message.content + "</s>" }}
    {%- endif %}
{%- endfor %}
```

## Use instead
```jinja
{%- if messages[0].role == "system" %}
    {%- set system_message = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message.role == "user" and loop.first and system_message is defined %}
        {{- "[INST]" + system_message + "\n\n" + message.content + "[/INST]" }}
    {%- elif message.role == "user" %}
        {{- "[INST]" + message.content + "[/INST]" }}
    {%- elif message.role == "assistant" %}
        {{- message.content + "</s>" }}
    {%- endif %}
{%- endfor %}
```

## Fix safety
This fix is unsafe: `--fix` applies it only with `--unsafe-fixes` (or `unsafe-fixes = true`), because the model then sees its earlier analysis.
Look-ahead that drops reasoning (gpt-oss analysis) is fixed by keeping it for every turn
that has it; the model then sees its earlier analysis. Blocks a model was trained to see
on the last user message (Mistral's tool list and system prompt) have no edit that keeps
the trained format: no automatic fix, the finding says so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

from jinja2 import nodes

from tmpl_lint.analysis.facts import Control, Facts, Label, LabelKind, Sink
from tmpl_lint.analysis.interpreter import only_literals
from tmpl_lint.analysis.locations import descendants
from tmpl_lint.edits import Fix, replace_at, switch_default_fix
from tmpl_lint.findings import Finding, FixSafety, Message
from tmpl_lint.proofs import Cause, Proof

from ._contract import RuleInfo, Severity

# A look-ahead can move text to the very start (Mistral's tool list before the first user
# message while it is the last one), which the divergence's position calls "system".
RULE = RuleInfo(
    "PC003",
    "future-dependent-render",
    Severity.WARNING,
    "a message renders differently once later messages exist",
    proven_by=frozenset({Cause.HISTORY_REWRITE, Cause.REPLY_REWRITE, Cause.SYSTEM}),
    fix_safety=FixSafety.UNSAFE,
)


@dataclass(frozen=True)
class FutureDependent(Message):
    """A PC003 message; the proof adds that the break is harmony's analysis drop, where it is."""

    harmony_drop: bool = field(default=False, kw_only=True)

    def __str__(self) -> str:
        said = super().__str__()
        return f"{said}: {HARMONY_DROP}" if self.harmony_drop else said


@dataclass(frozen=True)
class PrintedCount(FutureDependent):
    text = "`{expression}` prints the number of messages: the text it is in renders differently once later messages exist"
    expression: str


@dataclass(frozen=True)
class Window(FutureDependent):
    text = (
        "`{expression}` keeps only the last messages: each new one pushes the oldest out, "
        "so the prompt renders differently from its start every turn"
    )
    expression: str


@dataclass(frozen=True)
class LooksAhead(FutureDependent):
    text = "`{expression}` looks ahead at later messages: this message renders differently once they exist"
    expression: str


@dataclass(frozen=True)
class WhileLast(FutureDependent):
    text = (
        "`{expression}`{counted} makes a message render differently while it is the last one: "
        "the next turn renders it again without that"
    )
    expression: str
    counted_at: int | None  # the line the count is computed at, where it is not the expression's

    @property
    def counted(self) -> str:
        return f" (counted at line {self.counted_at})" if self.counted_at is not None else ""


@dataclass(frozen=True)
class NextMessage(FutureDependent):
    text = "`{expression}` makes a message render differently once the next message exists"
    expression: str


@dataclass(frozen=True)
class ScannedFlag(FutureDependent):
    text = (
        "`{name}`{origin} is computed by scanning all messages, so an earlier message renders "
        "differently once later messages exist"
    )
    name: str | None
    set_at: int | None  # the line the flag is set at

    @property
    def origin(self) -> str:
        return f" (set at line {self.set_at})" if self.set_at is not None else ""


def check(facts: Facts) -> list[Finding]:
    findings: dict[tuple[int, int], Finding] = {}
    # Many sinks share a decision, a loop nest and roles, and so its first look-ahead.
    first_look_ahead: dict[tuple, tuple[Label, FutureDependent] | None] = {}
    for sink in facts.sinks:
        if not sink.loops:
            counted = _printed_count(sink, facts)
            if counted is not None and counted.site is not None and (counted.site.line, counted.site.column) not in findings:
                message = PrintedCount(counted.site.text)
                findings[(counted.site.line, counted.site.column)] = RULE.at(counted.site, message, sink.all_labels())
            continue
        for group in [sink.labels] + [
            control.labels for control in sink.controls if not _separator_after_the_message(control, sink, facts)
        ]:
            # One finding per decision, at its first look-ahead.
            decision = (group, sink.loops, sink.roles)
            if decision not in first_look_ahead:
                first_look_ahead[decision] = next(_look_aheads(group, sink, facts), None)
            found = first_look_ahead[decision]
            if found is not None:
                label, worded = found
                if label.site is None:  # _look_aheads yields labels with a site only
                    continue
                key = (label.site.line, label.site.column)
                if key not in findings:
                    findings[key] = RULE.at(label.site, worded, sink.all_labels())
    return list(findings.values())


def _printed_count(sink: Sink, facts: Facts) -> Label | None:
    """The count of the messages a sink outside the loops over them prints (a system block
    saying `messages|length`), if it prints one and is not the generation prompt's. A count
    tested (`messages|length > 0`) only decides, and a value set under that test carries it."""
    if any(label.kind is LabelKind.VARIABLE and label.name == "add_generation_prompt" for label in sink.all_labels()):
        return None
    tested = _tested(facts)
    counts = [
        label
        for label in sink.labels
        if label.kind is LabelKind.COUNT and label.site is not None and id(label.site.node) not in tested
    ]
    return min(counts, key=_order) if counts else None


def _tested(facts: Facts) -> frozenset[int]:
    """The nodes inside a comparison, a test (`is ...`) or the test of an `if`."""

    def find() -> frozenset[int]:
        found = set(_decisions(facts))
        for compared in facts.nodes_of(nodes.Compare, nodes.Test):
            found.update(id(inner) for inner in descendants(compared))
        return frozenset(found)

    return facts.source_map.memo("pc003_tested", find)


def _look_aheads(group: frozenset[Label], sink: Sink, facts: Facts):
    """The labels of one decision that make it depend on later messages, with a message
    (what it says depends on the group, the sink's loops and its roles only)."""
    kinds = {label.kind for label in group}
    generation_prompt = any(label.kind is LabelKind.VARIABLE and label.name == "add_generation_prompt" for label in group)
    closes_group = bool(kinds & {LabelKind.LAST, LabelKind.COUNT}) and LabelKind.NEXT in kinds
    history_rewrite = any(label.kind is LabelKind.SCAN_POSITION and label.loop not in sink.loops for label in group)
    active_index = any(label.kind is LabelKind.LOOP_INDEX and label.loop in sink.loops for label in group)
    # An assistant message is last, or has no next message, only while it is the reply just
    # written: what changes is how the reply itself replays (the generation prompt's
    # business, PC006), not history. `messages[-1]` is another message: still reported.
    reply_only = sink.roles is not None and sink.roles <= {"assistant"}
    rendered = sink.loops[-1] if sink.loops else None

    def message(label: Label) -> FutureDependent | None:
        if label.site is None:  # asked of labels with a site only (below)
            return None
        if (
            reply_only
            and (
                (label.kind in (LabelKind.LAST, LabelKind.NEXT) and label.loop == rendered)
                or (label.kind is LabelKind.COUNT and active_index)
            )
            and _reasoning_or_markup(facts, label)
        ):
            return None
        if label.kind is LabelKind.LOOKAHEAD and label.name == "window":
            return Window(label.site.text)
        if label.kind is LabelKind.LOOKAHEAD:
            return LooksAhead(label.site.text)
        if label.kind in (LabelKind.LAST, LabelKind.COUNT) and not (generation_prompt or closes_group or history_rewrite):
            if label.kind is LabelKind.COUNT and not active_index:
                return None
            return WhileLast(label.site.text, label.origin.line if label.origin else None)
        if label.kind is LabelKind.NEXT and not closes_group:
            return NextMessage(label.site.text)
        if label.kind is LabelKind.SCAN_FLAG and label.loop not in sink.loops and not history_rewrite:
            return ScannedFlag(label.name, label.origin.line if label.origin else None)
        return None

    # Only the look-aheads are put in order: a column is worked out only where needed.
    found = [(label, text) for label in group if label.site is not None and (text := message(label)) is not None]
    for label, text in sorted(found, key=lambda item: _order(item[0])):
        yield label, text


def _reasoning_or_markup(facts: Facts, label: Label) -> bool:
    """Whether the decision a reply-only look-ahead makes is about the reply's reasoning
    (QwQ's `split('</think>')`, Apriel's `[BEGIN FINAL RESPONSE]`, reasoning printed while
    the turn is last), which the generation prompt's rule explains, or only picks markup or
    a flag (an end marker, a separator, `{% set add_tool_id = false %}`): anything else it
    rewrites in the reply, its text cut while a message follows, is that message rendering
    differently once later messages exist."""
    node = label.site.node if label.site is not None else None
    decision = _decisions(facts).get(id(node)) if node is not None else None
    if decision is None:
        return True  # not a test of an `if`: nothing to tell it by, as before
    parts: list[nodes.Node | None]  # an inline `if` may have no else
    if isinstance(decision, nodes.If):
        parts = [decision.test, *decision.body, *decision.else_]
    else:
        parts = [decision.test, decision.expr1, decision.expr2]
    under = [inner for part in parts if part is not None for inner in [part, *descendants(part)]]
    for inner in under:
        if isinstance(inner, nodes.Const) and isinstance(inner.value, str) and REASONING_MARKERS.search(inner.value):
            return True
        if isinstance(inner, nodes.Getattr) and REASONING_MARKERS.search(inner.attr):
            return True
    chosen = [inner for inner in under if isinstance(inner, (nodes.Output, nodes.Assign, nodes.AssignBlock))]
    return bool(chosen) and all(_markup_or_flag(inner) for inner in chosen)


# What separates a reply's reasoning from its answer, or names the reasoning.
REASONING_MARKERS = re.compile(r"think|analysis|reason|thought|final response", re.IGNORECASE)


def _markup_or_flag(statement: nodes.Node) -> bool:
    """Literal text printed (`{{ '\n' }}`, an end marker), or a constant assigned (a flag)."""
    if isinstance(statement, nodes.Output):
        return all(isinstance(child, nodes.TemplateData) or only_literals(child) for child in statement.nodes)
    return isinstance(statement, nodes.Assign) and isinstance(statement.node, nodes.Const)


def _decisions(facts: Facts) -> dict[int, nodes.If | nodes.CondExpr]:
    """Each node inside the test of an `if` or inline `if`, to the innermost one."""

    def find() -> dict[int, nodes.If | nodes.CondExpr]:
        found: dict[int, nodes.If | nodes.CondExpr] = {}
        decisions: list[nodes.If | nodes.CondExpr] = facts.nodes_of(nodes.If, nodes.CondExpr)
        for decision in decisions:  # outer ones first
            for inner in [decision.test, *descendants(decision.test)]:
                found[id(inner)] = decision
        return found

    return facts.source_map.memo("pc003_decisions", find)


def _separator_after_the_message(control: Control, sink: Sink, facts: Facts) -> bool:
    """``{% if not loop.last %}{{ "\\n" }}{% endif %}`` as the last statement of the loop: the
    last message is followed by the generation prompt instead. Where that starts with other
    text, the prompt and history differ at the reply's opener (PC006), not in history."""
    node = control.node
    if not (
        isinstance(node, nodes.If)
        and not node.elif_
        and not node.else_
        and node.body == [sink.node]
        and isinstance(node.test, nodes.Not)
        and isinstance(node.test.node, nodes.Getattr)
        and node.test.node.attr == "last"
        and isinstance(node.test.node.node, nodes.Name)
        and node.test.node.node.name == "loop"
    ):
        return False
    loop = next((loop for loop in facts.nodes_of(nodes.For) if id(loop) == sink.loops[-1]), None)
    return loop is not None and bool(loop.body) and loop.body[-1] is node


def _order(label: Label):
    site = label.site
    return (site.line, site.column, label.kind) if site else (0, 0, label.kind)


# What a past turn loses when a look-ahead drops it: reasoning, analysis, thoughts.
REASONING_TEXT = re.compile(r"think|analysis|reason|thought", re.IGNORECASE)


def fix(facts: Facts, finding: Finding, options) -> Fix:
    """Where the look-ahead drops reasoning from past turns, read it as "no later message"
    so the reasoning stays; blocks the model was trained to see on the last message
    (Mistral's tool list and system prompt) have no edit that keeps its format. Where none
    applies, the template's own switch set to its stable default (which fixes only requests
    that leave it unset: verified, it is refused when a value a deployment may pass breaks)."""
    structural = _keep_reasoning(facts, finding)
    if structural.alternatives:
        return structural
    return switch_default_fix(facts.text, finding) or structural


def _keep_reasoning(facts: Facts, finding: Finding) -> Fix:
    if finding.site is None:  # PC003's findings are made at a site (check)
        return Fix.refuse("cannot locate the look-ahead in the source")
    place = (finding.site.line, finding.site.column)
    affected = [
        sink
        for sink in facts.sinks
        if any(label.site is not None and (label.site.line, label.site.column) == place for label in sink.all_labels())
    ]
    if affected and not any(sink.loops for sink in affected):
        return Fix.refuse("the template prints the number of messages: no edit keeps the text it wrote")
    if not any(REASONING_TEXT.search(sink.text) for sink in affected):
        kinds = {
            label.kind
            for sink in affected
            for label in sink.all_labels()
            if label.site is not None and (label.site.line, label.site.column) == place
        }
        if LabelKind.COUNT in kinds:
            # A count on every message (`messages|length - loop.index`): the text is the count.
            return Fix.refuse("the template prints a count of the messages in each one: no edit keeps the text it wrote")
        return Fix.refuse("no edit keeps the model's trained format: it was trained to see this on the last message only")
    alternatives = []
    for site in [finding.site, *finding.related]:
        if site.node is None:
            continue
        for constant in _constants(site.text):
            edit = replace_at(facts, site, constant)
            if edit is not None and [edit] not in alternatives:
                alternatives.append([edit])
    title = "past turns keep their reasoning once later messages exist"
    return Fix(title, alternatives) if alternatives else Fix.refuse("cannot locate the look-ahead in the source")


def _constants(text: str) -> tuple[str, ...]:
    """What to read a look-ahead as, in the order to try: no later messages first."""
    if text.endswith(":]") or text.startswith("range("):
        return ("[]",)
    if text.endswith("[-1]"):
        return ()
    return ("true", "false")


# harmony's channel for a turn's reasoning (gpt-oss): its format drops it from a turn once a
# final answer follows the turn.
HARMONY_ANALYSIS = "<|channel|>analysis"
HARMONY_DROP = (
    "harmony's analysis drop: a turn's reasoning (its analysis channel) is removed once a final answer follows it, "
    "as openai-harmony renders history (vLLM's own render of gpt-oss does the same)"
)


def drops_harmony_analysis(divergence) -> bool:
    """Whether the divergence is a turn's harmony analysis left out of the next turn."""
    common = len(os.path.commonprefix([divergence.before, divergence.after]))
    return (
        HARMONY_ANALYSIS in divergence.before[max(0, common - len(HARMONY_ANALYSIS)) :]
        and HARMONY_ANALYSIS not in (divergence.after[max(0, common - len(HARMONY_ANALYSIS)) : common + len(HARMONY_ANALYSIS)])
    )


def describe(message: Message, proof: Proof) -> tuple[Message, Proof]:
    """Name harmony's analysis drop where the proof shows it (gpt-oss's look-ahead for a
    final answer): the break has a name, not only a look-ahead's."""
    divergence = proof.divergence
    if isinstance(message, FutureDependent) and divergence is not None and drops_harmony_analysis(divergence):
        return replace(message, harmony_drop=True), proof
    return message, proof
