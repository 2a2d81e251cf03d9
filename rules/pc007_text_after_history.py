r"""## What it does
Finds text printed after the loop over messages that is not part of the generation prompt:
- a closing tag printed after the loop only while the last message left a flag on, such as
  DeepSeek-R1's `<｜tool▁outputs▁end｜>` while the last message is a tool result, where a
  message that can follow (a tool call) turns the flag off without printing the tag;
- text printed after the loop on every turn (an instruction block after the messages),
  unless the loop prints it at the start of a message too (a role header the reply
  renders with); a value printed there (a date, a template variable) too, shown by its
  expression (`'Today: {{ strftime_now("%Y") }}\n'`). Where the value is the clock, the
  clock's change is PC001's; how the value moves behind each new message is this rule's,
  and it moves with the clock stopped.

A flag that every following assistant message turns off by printing the same tag is a
group closed the same way whatever comes next: not reported. A message role that never
follows a tool result in an agent loop (a user message) is not required to close it.

## Why is this bad?
At turn N the text is the end of the prompt, right after the last message. At turn N+1
the new messages are rendered where it was, and it moves after them, or disappears (the
tool call that follows turned the flag off). The prompt of turn N+1 stops matching the
prompt of turn N at the end of the last message, and the serving engine recomputes the
reply and everything after that point on every such turn.

## Example
```jinja
{%- set ns = namespace(is_tool=false) %}
{%- for message in messages %}
    {%- if message.role == "tool" %}
        {%- set ns.is_tool = true %}
        {{- "<｜tool▁output▁begin｜>" + message.content + "<｜tool▁output▁end｜>" }}
    {%- elif message.role == "assistant" and message.tool_calls %}
        {%- set ns.is_tool = false %}
        {{- "<｜Assistant｜><｜tool▁calls▁begin｜>..." }}
    {%- endif %}
{%- endfor %}
{%- if ns.is_tool %}
    {{- "<｜tool▁outputs▁end｜>" }}
{%- endif %}
```

## Use instead
```jinja
{%- set ns = namespace(is_tool=false) %}
{%- for message in messages %}
    {%- if message.role == "tool" %}
        {%- set ns.is_tool = true %}
        {{- "<｜tool▁output▁begin｜>" + message.content + "<｜tool▁output▁end｜>" }}
    {%- elif message.role == "assistant" and message.tool_calls %}
        {%- if ns.is_tool %}{{- "<｜tool▁outputs▁end｜>" }}{%- endif %}
        {%- set ns.is_tool = false %}
        {{- "<｜Assistant｜><｜tool▁calls▁begin｜>..." }}
    {%- endif %}
{%- endfor %}
{%- if ns.is_tool %}
    {{- "<｜tool▁outputs▁end｜>" }}
{%- endif %}
```

## Fix safety
This fix is safe: `--fix` applies it, because the model sees the reply as the template printed it on the earlier turn.
The fix prints the closing tag where each branch that turns the flag off without it
does so, right before that assignment, and leaves the tag after the loop as it is. A
conversation whose last message is a tool result renders exactly as before; a tool
result followed by a tool call (or a user message) now shows the closing tag the
template printed there on the earlier turn, which is the model family's documented
format. Text printed after the messages on every turn has no edit that keeps the model's
trained format: no automatic fix, the finding says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from jinja2 import nodes

from tmpl_lint.analysis.facts import Facts, FlagReset, LabelKind, Sink, Site
from tmpl_lint.analysis.locations import Token, leftmost_name
from tmpl_lint.edits import Edit, Fix, jinja_literal
from tmpl_lint.findings import Finding, FixSafety, Message
from tmpl_lint.proofs import Cause

from ._contract import RuleInfo, Severity

RULE = RuleInfo(
    "PC007",
    "text-after-history",
    Severity.WARNING,
    "text printed after the messages moves or vanishes once a new message arrives",
    proven_by=frozenset({Cause.HISTORY_REWRITE}),
    fix_safety=FixSafety.SAFE,
)


@dataclass(frozen=True)
class LeftOpen(Message):
    text = (
        "{printed} is printed after the messages only while the last message left `{flag}` "
        "on, and {how}: the next turn renders that reply where the text was, so the prompt diverges "
        "at the end of the last message"
    )
    printed: str  # the text, as _printed words it
    flag: str
    turned_off_at: str | None  # where a reply that can follow turns the flag off, if one does

    def __str__(self) -> str:
        how = (
            f"a reply that can follow turns it off without printing it ({self.turned_off_at})"
            if self.turned_off_at is not None
            else "nothing turns it off"
        )
        return self.text.format(printed=self.printed, flag=self.flag, how=how)


@dataclass(frozen=True)
class AfterHistory(Message):
    text = (
        "{printed} is printed after the messages, outside the generation prompt: the next turn "
        "renders its new messages before it, so the prompt diverges at the end of the last message"
    )
    printed: str


def check(facts: Facts) -> list[Finding]:
    rendered = [index for index, sink in enumerate(facts.sinks) if sink.loops]
    if not rendered:
        return []
    history = [sink for sink in facts.sinks if sink.loops]
    findings: list[Finding] = []
    for sink in facts.sinks[rendered[-1] + 1 :]:
        if sink.loops or not (sink.text.strip() or sink.unknown) or _in_generation_prompt(sink):
            continue
        flag = _flag(sink)
        if flag is not None:
            resets = [reset for reset in facts.flag_resets(flag.loop) if reset.name == flag.name]
            if resets and not _open(resets, sink.text, roles={"assistant"}):
                continue  # every reply that can follow closes the group with the same text
            places = (
                ", ".join(_place(facts, reset) for reset in _open(resets, sink.text, roles={"assistant"})) if resets else None
            )
            message = LeftOpen(_printed(facts, sink), flag.name, places)
            findings.append(RULE.at(flag.site, message, sink.all_labels()))
        elif sink.unknown or not any(other.text.startswith(sink.text) for other in history):
            findings.append(RULE.at(_text_site(facts, sink), AfterHistory(_printed(facts, sink)), sink.all_labels()))
    return findings


def _text_site(facts: Facts, sink: Sink) -> Site:
    """Where the text ``sink`` prints starts, when it is template text: the lexer's data
    tokens are the template's text nodes, one for one and in order."""
    first = sink.node.nodes[0] if isinstance(sink.node, nodes.Output) and sink.node.nodes else None
    if isinstance(first, nodes.TemplateData):
        texts = facts.nodes_of(nodes.TemplateData)
        tokens = [token for token in facts.source_map.tokens if token.kind == "data"]
        if len(texts) == len(tokens):
            token = tokens[next(index for index, text in enumerate(texts) if text is first)]
            column = facts.source_map.column_of_offset(token.offset)
            return Site(token.line, sink.text, sink.node, facts.source_map, fixed_column=column)
    return facts.site(sink.node, sink.text)


@dataclass(frozen=True)
class _Flag:
    """A scanned namespace flag: its name ("ns.flag"), its loop and where it is read."""

    name: str
    loop: int | None
    site: Site


def _flag(sink: Sink) -> _Flag | None:
    """The scanned namespace flag that decides whether ``sink`` prints, if one does."""
    flags = [
        _Flag(label.name, label.loop, label.site)
        for control in sink.controls
        for label in control.labels
        if label.kind is LabelKind.SCAN_FLAG and label.site is not None and label.name
    ]
    return min(flags, key=lambda flag: (flag.site.line, flag.site.column)) if flags else None


def _open(resets: list[FlagReset], text: str, roles: set[str] | None = None) -> list[FlagReset]:
    """The resets whose branch does not print ``text``, among those for ``roles`` (or
    for a role the tests do not say)."""
    return [reset for reset in resets if text not in reset.text and (roles is None or reset.roles is None or reset.roles & roles)]


def _place(facts: Facts, reset: FlagReset) -> str:
    token = _namespace_token(facts, reset)
    if token is None:
        return f"line {reset.node.lineno}"
    return f"line {token.line}, column {facts.source_map.column_of_offset(token.offset)}"


def _in_generation_prompt(sink: Sink) -> bool:
    return any(
        label.kind is LabelKind.VARIABLE and label.name == "add_generation_prompt"
        for control in sink.controls
        for label in control.labels
    )


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _printed(facts: Facts, sink: Sink) -> str:
    """What ``sink`` prints: its text, or where a value only the render knows is part of it
    (a clock, a template variable), the template's own text, expressions in their braces:
    `'Today: {{ strftime_now("%Y") }}\\n'`, not `'Today: \\n'`."""
    if not sink.unknown or not isinstance(sink.node, nodes.Output):
        return _shown(sink.text)
    return _shown("".join(_piece(facts, child) for child in sink.node.nodes))


def _namespace_token(facts: Facts, reset: FlagReset) -> Token | None:
    """The token of the namespace in ``{% set ns.flag = ... %}`` (a reset's target is always
    a namespace reference)."""
    target = reset.node.target
    return facts.source_map.name_token(target) if isinstance(target, nodes.NSRef) else None


def _piece(facts: Facts, child: nodes.Node) -> str:
    """One part of what an output prints: text and string literals as they print, else the
    expression in its braces."""
    if isinstance(child, nodes.TemplateData):
        return child.data
    if isinstance(child, nodes.Const) and isinstance(child.value, str):
        return child.value
    return "{{ " + _source_of(facts, child) + " }}"


def _source_of(facts: Facts, expression: nodes.Node) -> str:
    """The source of the ``{{ ... }}`` that prints ``expression``, without its braces; "..."
    where it cannot be found."""
    anchor = leftmost_name(expression)
    token = facts.source_map.name_token(anchor) if anchor is not None else None
    if token is None:
        return "..."
    tokens = facts.source_map.tokens
    index = tokens.index(token)
    begin = next((t for t in reversed(tokens[:index]) if t.kind == "variable_begin"), None)
    end = next((t for t in tokens[index:] if t.kind == "variable_end"), None)
    if begin is None or end is None:
        return "..."
    return facts.text[begin.end : end.offset].strip().strip("-+").strip()


def fix(facts: Facts, finding: Finding, options) -> Fix:
    """Close the group where each branch turns the flag off without closing it."""
    site = finding.site
    if site is None:  # every PC007 finding the analysis makes is placed
        return Fix.refuse("cannot locate the flag in the source")
    found = [
        (sink, flag)
        for sink in facts.sinks
        if not sink.loops and (flag := _flag(sink)) is not None and flag.site.node is site.node
    ]
    if not found:
        return Fix.refuse("no edit keeps the model's trained format: it was trained to see this after the messages")
    sink, flag = found[0]
    resets = _open([reset for reset in facts.flag_resets(flag.loop) if reset.name == flag.name], sink.text)
    if not resets:
        return Fix.refuse(f"nothing turns `{flag.name}` off: there is no place to close the group")
    edits = []
    for reset in resets:
        offset = _statement_start(facts, reset)
        if offset is None:
            return Fix.refuse(f"cannot locate the assignment at line {reset.node.lineno}")
        opening = "{%-" if facts.text.startswith("{%-", offset) else "{%"
        closer = f"{opening} if {flag.name} %}}{{{{- {jinja_literal(sink.text)} }}}}{{%- endif %}}"
        edits.append(Edit(offset, offset, closer))
    title = f"{_shown(sink.text)} is also printed where `{flag.name}` is turned off, as after the loop"
    return Fix(title, [edits])


def _statement_start(facts: Facts, reset: FlagReset) -> int | None:
    """Offset of the ``{%`` that opens the ``{% set ns.flag = ... %}`` of ``reset``."""
    token = _namespace_token(facts, reset)
    if token is None:
        return None
    tokens = facts.source_map.tokens
    for index in range(tokens.index(token) - 1, -1, -1):
        if tokens[index].kind == "block_begin":
            return tokens[index].offset
    return None
