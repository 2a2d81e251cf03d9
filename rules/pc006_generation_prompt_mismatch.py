r"""## What it does
Finds a generation prompt, or a reply as the model generated it, that history does not
render the same way: the generation prompt opens the reply with text (`<think>\n`, an
empty `<think></think>`, a channel header, a stray newline) that the same assistant turn no
longer starts with once it is history, or history never replays the reply at all. The rule reads the literal text the template prints under
`add_generation_prompt`; where it holds such an opener tag, it looks for the loop over
messages printing that tag for every past assistant turn. A tag printed only for some
turns (after the last user query, while the message is last) or not at all is reported,
and so is a tag history prints with other text after it (Nemotron 3 writes `<think></think>`
for a turn without reasoning where the reply was opened with `<think>\n`). The finding
stands at the literal the opener is written in; where the generation prompt chooses between
openers (`'<think></think>' if not enable_thinking else '<think>'`), it quotes the one the
default render prints, or each where the template does not decide it alone.
Where no literal opener shows it (a whitespace difference, a header history never prints),
the proof finds it: a divergence inside the generation prompt or the reply that no other
finding explains is reported here, at the `add_generation_prompt` test. A reply that
renders differently once a message follows it is reported by the rule that names that
rewrite (PC002, PC003) when one does, with this finding as a related location; a finding of
an opener stands for that opener (and the reasoning block it opens) only, so a rewrite of
the reply elsewhere that no other rule names is found by the proof, apart from it.

## Why is this bad?
The engine cached the prompt and the reply it generated after the opener. On the next
turn the history renders that reply without the opener, so the prompt diverges at the
start of the last reply and the reply's tokens are recomputed every turn. Engines that
cannot roll back a recurrent state (hybrid and recurrent models: Qwen3.5-class, Jamba,
Nemotron-H) can only reuse a cache entry whose whole prompt matches, so there the whole
context is recomputed every turn.

## Example
```jinja
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<think>\n\n</think>\n\n' }}
{%- endif %}
```

## Use instead
```jinja
{%- for message in messages %}
    {%- if message.role == "assistant" %}
        {{- '<|im_start|>assistant\n<think>\n\n</think>\n\n' + message.content + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
```

## Fix safety
No automatic fix: whether history should print the opener, or the generation prompt leave
it out, is the model's trained format, which only its authors know. Make the history render
of an assistant turn start with the opener the generation prompt used, as in *Use instead*:
the model then sees its past turns exactly as it generated them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from jinja2 import nodes

from tmpl_lint.analysis.facts import KNOWN_GLOBALS, Facts, LabelKind, Sink, Site
from tmpl_lint.analysis.interpreter import analyze
from tmpl_lint.analysis.locations import children_in_source_order, descendants
from tmpl_lint.analysis.values import UNDEFINED
from tmpl_lint.findings import Finding, Message
from tmpl_lint.proofs import Cause, Divergence

from ._contract import RuleInfo, Severity

# A reply rewritten once a message follows it is a mismatch with what was generated too; a
# rule that names the rewrite explains it where one is found.
RULE = RuleInfo(
    "PC006",
    "generation-prompt-mismatch",
    Severity.WARNING,
    "the generation prompt and the reply as generated are not how history renders the turn",
    proven_by=frozenset({Cause.GENERATION_PROMPT, Cause.REPLY_REWRITE}),
    explains=frozenset({Cause.GENERATION_PROMPT}),
)


@dataclass(frozen=True)
class OpenerMismatch(Message):
    text = (
        "the generation prompt opens the reply with {quoted} but {how}: the reply's cache is "
        "lost every turn (the whole context on models that cannot roll back)"
    )
    openers: tuple[str, ...]  # what the generation prompt opens the reply with
    tag: str  # the tag history prints otherwise ("other"), or only for some turns, or never
    history: str  # "other", "some turns" or "never"

    @property
    def quoted(self) -> str:
        return repr(self.openers[0]) if len(self.openers) == 1 else "one of " + ", ".join(map(repr, self.openers))

    @property
    def how(self) -> str:
        if self.history == "other":
            return f"history prints {self.tag!r} for some turns (a turn without reasoning, say)"
        if self.history == "some turns":
            return f"history prints {self.tag!r} only for some turns (it depends on later messages)"
        return f"history never prints {self.tag!r}"


@dataclass(frozen=True)
class AfterEndMarker(Message):
    text = (
        "while the reply is the newest message the template prints {cached!r} after its end-of-turn marker, where "
        "the next turn has {following!r} ({where}): a model stops at the marker and never generates it"
    )
    cached: str
    following: str
    where: str


@dataclass(frozen=True)
class NotAsGenerated(Message):
    text = (
        "history does not render the turn as it was generated after the generation prompt: "
        "at {where} the cached prompt has {cached!r} where the next turn has {following!r}; the reply's "
        "cache is lost every turn (the whole context on models that cannot roll back)"
    )
    where: str
    cached: str
    following: str


@dataclass(frozen=True)
class SplitOtherwise(Message):
    text = (
        "history does not render the turn as it was generated after the generation prompt: "
        "at {where} the next turn prints the same text as the cached prompt, {shown!r}, but its tokens part "
        "otherwise (the generation prompt's last {unit} is taken into a longer one); the reply's "
        "cache is lost every turn (the whole context on models that cannot roll back)"
    )
    where: str
    shown: str
    unit: str


# A tag a generation prompt can open the reply with beyond the role header.
OPENER_TAG = re.compile(r"<[^<>\s]*(?:think|channel|reason)[^<>\s]*>", re.IGNORECASE)
# Labels that make a past turn render one way now and another way later.
POSITION_DEPENDENT = frozenset(
    {LabelKind.SCAN_POSITION, LabelKind.SCAN_FLAG, LabelKind.LAST, LabelKind.COUNT, LabelKind.LOOKAHEAD, LabelKind.NEXT}
)


def check(facts: Facts) -> list[Finding]:
    prompt_sinks = [sink for sink in facts.sinks if not sink.loops and _in_generation_prompt(sink)]
    prompt_text = "".join(sink.text for sink in prompt_sinks)
    opener = OPENER_TAG.search(prompt_text)
    if opener is None:
        return []
    tag = opener.group(0)
    first = next(sink for sink in prompt_sinks if tag in sink.text)
    openers, site = _opened_with(facts, first, tag)
    opened_with = openers[0]
    history_sinks = [sink for sink in facts.sinks if sink.loops and tag in sink.text]
    other = _other_opener(history_sinks, tag, opened_with)
    if other is not None:
        message = OpenerMismatch(tuple(openers), other, "other")
    elif any(_every_turn(sink) for sink in history_sinks):
        return []
    elif history_sinks:
        message = OpenerMismatch(tuple(openers), tag, "some turns")
    else:
        message = OpenerMismatch(tuple(openers), tag, "never")
    labels = frozenset().union(*(sink.all_labels() for sink in prompt_sinks))
    return [RULE.at(site, message, labels)]


# A literal an output prints as it is written: a string constant or template text.
LiteralNode = nodes.Const | nodes.TemplateData
# What every render is given: the default render passes these and leaves the rest unset.
PASSED = frozenset({"messages", "add_generation_prompt"})
# Names jinja itself binds (in a loop, a macro, a call block).
JINJA_NAMES = frozenset({"loop", "caller", "varargs", "kwargs"})
# More texts than this from one output (a chain of choices) are not told apart.
MAX_CHOICES = 16


def _opened_with(facts: Facts, sink: Sink, tag: str) -> tuple[list[str], Site]:
    """What the output ``sink`` opens the reply with, from ``tag`` on, and where it is written.

    ``sink.text`` joins every literal the output holds, so a choice between openers
    (`'<think></think>' if not enable_thinking else '<think>'`) reads as both glued together,
    which no render prints. Each text the output can print is told apart instead. Where they
    open the reply differently, the opener is the one the analysis decided (a switch trial
    sets the variable), else the one the default render prints, else each is named. The
    place is the literal the tag is written in (the default render's where it chooses), the
    same in every switch trial; else (the text comes through names) the output's first name."""
    choices = _choices(sink.node)
    holding = [choice for choice in choices or () if tag in _text(choice)]
    if not holding or choices is None:  # the opener comes through a name, or is built across literals
        literal = _first_literal_with(sink.node, tag)
        site = (literal and _literal_site(facts, literal, tag)) or facts.site(sink.node, tag)
        return [sink.text[sink.text.index(tag) :]], site
    by_opener: dict[str, tuple[LiteralNode, ...]] = {}
    for choice in holding:
        by_opener.setdefault(_from(_text(choice), tag), choice)
    placed = holding[0]
    if len(by_opener) > 1:
        default = _default_choice(facts, sink, choices)
        if default is not None and tag in _text(default):
            placed = default
        decided = next((choice for choice in holding if _text(choice) == sink.text), None)
        chosen = decided or (default if placed is default else None)
        if chosen is not None:
            by_opener = {_from(_text(chosen), tag): chosen}
    site = _literal_site(facts, _literal_holding(placed, tag), tag) or facts.site(sink.node, tag)
    return list(by_opener), site


def _choices(node: nodes.Node) -> list[tuple[LiteralNode, ...]] | None:
    """Every text ``node`` can print, as the literals it is made of; None where it prints
    anything else (a name, a call) or more texts than are worth telling apart."""
    if isinstance(node, nodes.TemplateData) or (isinstance(node, nodes.Const) and isinstance(node.value, str)):
        return [(node,)]
    if isinstance(node, nodes.CondExpr):
        first = _choices(node.expr1)
        second = _choices(node.expr2) if node.expr2 is not None else [()]
        if first is None or second is None or len(first) + len(second) > MAX_CHOICES:
            return None
        return first + second
    if isinstance(node, (nodes.Output, nodes.Concat, nodes.Add)):
        parts = node.nodes if isinstance(node, (nodes.Output, nodes.Concat)) else [node.left, node.right]
        joined: list[tuple[LiteralNode, ...]] = [()]
        for part in parts:
            options = _choices(part)
            if options is None or len(joined) * len(options) > MAX_CHOICES:
                return None
            joined = [before + option for before in joined for option in options]
        return joined
    return None


def _text(choice: tuple[LiteralNode, ...]) -> str:
    return "".join(literal.value if isinstance(literal, nodes.Const) else literal.data for literal in choice)


def _from(text: str, tag: str) -> str:
    return text[text.index(tag) :]


def _default_choice(facts: Facts, sink: Sink, choices: list[tuple[LiteralNode, ...]]) -> tuple[LiteralNode, ...] | None:
    """The choice the default render prints: the output's text when the template is analysed
    with every variable it reads unset (the messages and the generation prompt's own test
    apart), where that decides it. Worked out once per template, from its syntax and not from
    the analysis at hand: a switch trial's assumption must not move the finding."""
    if facts.tree is None:
        return None

    def printed() -> set[str]:
        read = {name.name for name in facts.nodes_of(nodes.Name) if name.ctx == "load"}
        # A name the template sets is read from its scope first: unset, it is what an
        # `is defined` test before the set sees.
        unset = dict.fromkeys(sorted(read - KNOWN_GLOBALS - PASSED - JINJA_NAMES), UNDEFINED)
        default = analyze(facts.text, facts.tree, facts.source_map, unset, sources=facts.sources)
        return {other.text for other in default.sinks if other.node is sink.node}

    texts = facts.source_map.memo(("PC006 default render", id(sink.node)), printed)
    if len(texts) != 1:
        return None
    (text,) = texts
    return next((choice for choice in choices if _text(choice) == text), None)


def _literal_holding(choice: tuple[LiteralNode, ...], tag: str) -> LiteralNode:
    """The literal of ``choice`` the tag starts in."""
    start = _text(choice).index(tag)
    for literal in choice:
        start -= len(_text((literal,)))
        if start < 0:
            return literal
    raise ValueError(f"{tag!r} is not in the choice")


def _first_literal_with(node: nodes.Node, tag: str) -> LiteralNode | None:
    """The first literal under ``node``, in source order, that holds the whole tag: where an
    output that also prints names (`'<|im_start|>' + role + '\\n<think>'`) writes it."""
    stack = [node]
    while stack:
        current = stack.pop()
        if (
            isinstance(current, nodes.TemplateData) or (isinstance(current, nodes.Const) and isinstance(current.value, str))
        ) and tag in _text((current,)):
            return current
        stack.extend(reversed(children_in_source_order(current)))
    return None


def _literal_site(facts: Facts, literal: LiteralNode, tag: str) -> Site | None:
    position = facts.source_map.literal_position(literal)
    if position is None:
        return None
    line, column = position
    return Site(line, tag, literal, facts.source_map, fixed_column=column)


def _other_opener(history_sinks: list[Sink], tag: str, opened_with: str) -> str | None:
    """A literal opener history prints instead of the generation prompt's: its tag followed
    by other text, such as `<think></think>` where the reply was opened with `<think>\n`."""
    for sink in history_sinks:
        start = sink.text.index(tag)
        printed = sink.text[start : start + len(opened_with)]
        if not opened_with.startswith(printed) and not printed.startswith(opened_with):
            closing = sink.text.find(">", start + len(tag))  # shown up to the tag after it
            return sink.text[start : closing + 1] if 0 <= closing < start + 40 else printed
    return None


def _in_generation_prompt(sink: Sink) -> bool:
    return any(
        label.kind is LabelKind.VARIABLE and label.name == "add_generation_prompt"
        for control in sink.controls
        for label in control.labels
    )


def _every_turn(sink: Sink) -> bool:
    return not any(
        label.kind in POSITION_DEPENDENT and label.loop not in sink.loops
        for label in sink.all_labels()
        if label.kind in (LabelKind.SCAN_POSITION, LabelKind.SCAN_FLAG)
    ) and not any(
        label.kind in POSITION_DEPENDENT - {LabelKind.SCAN_POSITION, LabelKind.SCAN_FLAG} for label in sink.all_labels()
    )


def shown_by(finding: Finding, divergence: Divergence) -> bool:
    """Whether a divergence this rule proves shows ``finding``. One found by its proof stands
    for every such divergence. One of ``check`` stands for an opener: it is shown where the
    text the generation prompt printed differs, or an opener tag is what differs; a reply
    rewritten elsewhere (a `loop.last` suffix on the reply) is not its
    pattern, and is reported apart (by its own finding, or found by the proof here). The
    reply's reasoning, or its reasoning block, left out of history is the opener's too: the
    block it opened is what history prints only for some turns. The same text split into
    other tokens is no opener's: history prints what the opener printed."""
    if not finding.hypothesis:
        return True
    if divergence.split_differently:
        return False
    if divergence.in_generation_prompt:
        return True
    if divergence.reply_as_trained in ("reasoning", "reasoning-block"):
        return True
    common = len(os.path.commonprefix([divergence.before, divergence.after]))
    return any(_tag_at(text, common) for text in (divergence.before, divergence.after))


def _tag_at(text: str, offset: int) -> bool:
    """Whether an opener tag starts at ``offset`` of ``text``, or spans it ("<think>" against
    "<|im_end|>": they share the "<")."""
    start = text.rfind("<", 0, offset + 1)
    if start < 0 or ">" in text[start:offset]:
        start = offset
    return OPENER_TAG.match(text, start) is not None


def found_by_proof(facts: Facts | None, divergence: Divergence) -> Finding:
    """A mismatch no literal opener shows (a stray newline, a header history never prints, a
    reply never replayed) is found by its proof, and reported at the test of
    `add_generation_prompt` that prints the generation prompt."""
    common = len(os.path.commonprefix([divergence.before, divergence.after]))
    cached, following = divergence.before[common:][:24], divergence.after[common:][:24]
    where = divergence.place
    if divergence.check == "d":
        # Only what the template prints after the newest reply's end-of-turn marker, quoted
        # from the start of the tag it parts in ("</s>" against "<|user|>", not "/s>").
        opened = divergence.before.rfind("<", 0, common + 1)
        if opened >= 0 and ">" not in divergence.before[opened:common]:
            cached, following = divergence.before[opened:][:24], divergence.after[opened:][:24]
        return RULE.at(_generation_prompt_site(facts), AfterEndMarker(cached, following, where))
    if divergence.split_differently:
        # Both texts agree there: what differs is where the tokens part.
        message: Message = SplitOtherwise(where, divergence.after_from_divergence[:24], divergence.unit)
    else:
        message = NotAsGenerated(where, cached, following)
    return RULE.at(_generation_prompt_site(facts), message)


def _generation_prompt_site(facts: Facts | None) -> Site:
    """The last `add_generation_prompt` test outside the loop over messages, else the last
    inside it (Apriel prints the prompt on the loop's last message), else line 1."""
    if facts is None or facts.tree is None:
        return Site(1, "", fixed_column=1)
    in_loops = {id(node) for loop in facts.nodes_of(nodes.For) for node in descendants(loop) if isinstance(node, nodes.Name)}
    tests = [
        name
        for branch in facts.nodes_of(nodes.If)
        for name in [branch.test, *descendants(branch.test)]
        if isinstance(name, nodes.Name) and name.name == "add_generation_prompt"
    ]
    outside = [name for name in tests if id(name) not in in_loops]
    if not tests:
        return Site(1, "", fixed_column=1)
    return facts.site((outside or tests)[-1], "add_generation_prompt")
