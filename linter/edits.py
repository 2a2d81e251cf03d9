"""Minimal edits to a template source at exact spans, as rules propose them.

A rule's ``fix`` returns a ``Fix``: a one-line description of what the model will now see
differently and one or more alternative edit lists (the fixer keeps the first alternative
that verifies), or the reason it cannot fix. Edits are offsets into the original text;
insertions at one offset are kept in order, overlapping replacements are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import time

from jinja2 import nodes

from .analysis.facts import KNOWN_GLOBALS, Facts, Site
from .analysis.locations import SourceMap, Token, leftmost_name
from .analysis.parsing import parse

# The time of day of a fix's frozen date: a fix that freezes a clock freezes it then, and
# the fix's verifier renders the original with its clock then, so that a fixed clock that
# shows the hour ("%H:%M", "%p") renders as the original did on the single-turn check.
FROZEN_TIME_OF_DAY = time(12, 0)


@dataclass(frozen=True)
class Edit:
    start: int
    end: int
    text: str  # a line break in it ("\n") is written as the template's own (see apply_edits)


@dataclass
class Fix:
    title: str = ""
    alternatives: list[list[Edit]] = field(default_factory=list)
    unfixable: str | None = None

    @classmethod
    def refuse(cls, reason: str) -> Fix:
        return cls(unfixable=reason)


class OverlappingEdits(ValueError):
    pass


def apply_edits(text: str, edits: list[Edit]) -> str:
    """``text`` with ``edits`` made, each line break they insert written as ``text``'s own: a
    line added to a template saved with CRLF ends in CRLF (Jinja reads both alike, but a
    fix changes nothing else, and mixed line endings would be a change)."""
    ordered = sorted(enumerate(edits), key=lambda item: (item[1].start, item[1].end, item[0]))
    newline = line_ending(text)
    out: list[str] = []
    position = 0
    for _, edit in ordered:
        if edit.start < position:
            raise OverlappingEdits(f"edits overlap at offset {edit.start}")
        out.append(text[position : edit.start])
        out.append(edit.text if newline == "\n" else _LONE_LINE_FEED.sub(newline, edit.text))
        position = edit.end
    out.append(text[position:])
    return "".join(out)


_LONE_LINE_FEED = re.compile(r"(?<!\r)\n")


def line_ending(text: str) -> str:
    """The line break ``text`` uses most: "\r\n", "\n" or "\r"; "\n" where it has none."""
    crlf = text.count("\r\n")
    counts = {"\n": text.count("\n") - crlf, "\r\n": crlf, "\r": text.count("\r") - crlf}
    return max(counts, key=lambda ending: (counts[ending], ending == "\n"))


def _postfix_depth(node: nodes.Node) -> int:
    """How many `.attr`, `[...]` and `(...)` follow the leftmost name up to ``node``."""
    depth = 0
    while isinstance(node, (nodes.Getattr, nodes.Getitem, nodes.Call)):
        depth += 1
        node = node.node
    return depth if isinstance(node, nodes.Name) else -1


def _closing(tokens: list[Token], index: int) -> int:
    """Index of the bracket closing the one at ``index``."""
    opening = tokens[index].value
    closing = {"(": ")", "[": "]", "{": "}"}[opening]
    depth = 0
    for position in range(index, len(tokens)):
        value = tokens[position].value
        if tokens[position].kind == "operator" and value == opening:
            depth += 1
        elif tokens[position].kind == "operator" and value == closing:
            depth -= 1
            if depth == 0:
                return position
    raise ValueError("unbalanced brackets")


def expression_span(source_map: SourceMap, node: nodes.Node) -> tuple[int, int] | None:
    """Source offsets of a name with its attribute, subscript and call chain (``ns.x``,
    ``loop.last``, ``messages[-1]``, ``strftime_now("%Y")``), or None."""
    depth = _postfix_depth(node)
    anchor = leftmost_name(node)
    if depth < 0 or anchor is None:
        return None
    token = source_map.name_token(anchor)
    if token is None:
        return None
    tokens = [t for t in source_map.tokens if t.kind != "whitespace"]
    index = tokens.index(token)
    end = token.end
    for _ in range(depth):
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        if following is None or following.kind != "operator":
            return None
        if following.value == "." and index + 2 < len(tokens) and tokens[index + 2].kind == "name":
            index += 2
        elif following.value in ("[", "("):
            index = _closing(tokens, index + 1)
        else:
            return None
        end = tokens[index].end
    return token.offset, end


def filter_span(source_map: SourceMap, node: nodes.Filter) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(span of the filtered expression, span of ``| name(args)``) for ``expr | name``."""
    if node.node is None:
        return None
    inner = expression_span(source_map, node.node)
    name = source_map.name_token(node)
    if inner is None or name is None:
        return None
    tokens = [t for t in source_map.tokens if t.kind != "whitespace"]
    index = tokens.index(name)
    pipe = tokens[index - 1]
    if pipe.value != "|":
        return None
    end = name.end
    if index + 1 < len(tokens) and tokens[index + 1].value == "(":
        end = tokens[_closing(tokens, index + 1)].end
    return inner, (pipe.offset, end)


def replace_at(facts: Facts, site: Site, text: str) -> Edit | None:
    """An edit replacing the expression at ``site``, or None when the source there is not
    the expression the site names (a value that reached it through another name)."""
    if site.node is None or (span := expression_span(facts.source_map, site.node)) is None:
        return None
    anchor = leftmost_name(site.node)
    word = re.match(r"\w*", site.text)  # always matches, if only the empty string
    if anchor is None or word is None or word.group(0) != anchor.name:
        return None
    return Edit(span[0], span[1], text)


def default_header(text: str, name: str, literal: str) -> Edit:
    """``name`` defaults to ``literal`` unless the caller passes it; prints nothing. It goes
    first in ``text``, after a byte order mark: the mark stays the file's first bytes."""
    start = 1 if text.startswith("\ufeff") else 0
    return Edit(start, start, f"{{%- if {name} is not defined %}}{{%- set {name} = {literal} %}}{{%- endif %}}\n")


def jinja_literal(value) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "none"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def switch_default_fix(text: str, finding) -> Fix | None:
    """The fix that only changes the default of the switch the lint named, if there is one."""
    switch = finding.switch
    if switch is None:
        return None
    if switch.default_is_stable:
        return Fix.refuse(f"stable by default; only callers passing {switch.name}={jinja_literal(switch.unstable_value)} see it")
    if switch.stable_value is None:
        return None
    own = own_default(text, switch.name)
    if own is not None:
        # DeepSeek-V3.2 sets thinking from enable_thinking when thinking is not passed (what
        # vLLM sets from reasoning_effort): a header first would make that code dead, and
        # enable_thinking=true would no longer turn thinking on.
        readers = " and ".join(own.reads)
        return Fix.refuse(
            f"the template gives {switch.name} its own default at line {own.line}, from {readers}: "
            f"a default for {switch.name} set first would stop {readers} from setting it"
        )
    title = f"{switch.name} now defaults to {jinja_literal(switch.stable_value)}; callers can still pass it"
    return Fix(title, [[default_header(text, switch.name, jinja_literal(switch.stable_value))]])


@dataclass(frozen=True)
class OwnDefault:
    """Where a template sets a variable when the caller does not pass it, and the other
    variables a caller may pass that decide the value it sets there."""

    line: int
    reads: tuple[str, ...]


def own_default(text: str, name: str) -> OwnDefault | None:
    """The first ``{% if name is not defined %}`` block that sets ``name`` from variables a
    caller may pass (names the template never assigns), else None. A default for ``name``
    put first would leave those variables no say; a constant default it only replaces."""
    tree, _ = parse(text)
    if tree is None:
        return None
    assigned = {node.name for node in tree.find_all(nodes.Name) if node.ctx in ("store", "param")}
    assigned |= {node.name for node in tree.find_all(nodes.Macro)}
    for branch in tree.find_all(nodes.If):
        if not any(_is_undefined_test(test, name) for test in [branch.test, *branch.test.find_all(nodes.Expr)]):
            continue
        body = [node for statement in branch.body for node in [statement, *statement.find_all(nodes.Node)]]
        if not any(
            isinstance(node, (nodes.Assign, nodes.AssignBlock))
            and isinstance(node.target, nodes.Name)
            and node.target.name == name
            for node in body
        ):
            continue
        reads = [
            node.name
            for node in body
            if isinstance(node, nodes.Name)
            and node.ctx == "load"
            and node.name != name
            and node.name not in assigned
            and node.name not in KNOWN_GLOBALS
        ]
        if reads:
            return OwnDefault(branch.lineno, tuple(dict.fromkeys(reads)))
    return None


def _is_undefined_test(test: nodes.Node, name: str) -> bool:
    """``name is not defined``, ``not name is defined`` or ``name is undefined``."""
    if isinstance(test, nodes.Not):
        test, wanted = test.node, "defined"
    else:
        wanted = "undefined"
    return isinstance(test, nodes.Test) and test.name == wanted and isinstance(test.node, nodes.Name) and test.node.name == name
