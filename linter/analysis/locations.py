"""Exact positions in a template source.

Jinja nodes carry a line number only. The lexer's token stream (``Lexer.tokeniter``)
yields every token's text in source order, so finding each token's text forward from the
previous one gives its offset, and from the offset a 1-based column. Whitespace control
(``-``) and ``lstrip_blocks`` only shorten data tokens, which is why a forward search is
enough.
"""

from __future__ import annotations

import bisect
import re
from typing import NamedTuple

import jinja2
from jinja2 import nodes

_NEWLINE = re.compile(r"\r\n|\r|\n")


class Token(NamedTuple):
    offset: int
    line: int
    kind: str
    value: str

    @property
    def end(self) -> int:
        return self.offset + len(self.value)


class SourceMap:
    def __init__(
        self, text: str, environment: jinja2.Environment, tree: nodes.Template | None = None, raw_tokens: list | None = None
    ):
        self.text = text
        self._environment = environment
        self._tree = tree
        self._raw_tokens = raw_tokens  # (line, kind, value) from the parse's own lexing pass
        self._line_starts: list[int] | None = None
        # Tokens are located lazily, in order, only as far as the lines asked about.
        self._raw: list | None = None  # (line, kind, value), lexed again only if the parse kept none
        self._offsets: list[int] = []  # per raw token located so far; -1: its text was not found
        self._search_from = 0
        self._by_line: dict[int, list[Token]] = {}
        self._tokens: list[Token] | None = None
        self._occurrence: dict[int, int] | None = None
        self._literal_occurrence: dict[int, int] | None = None
        self._literal_count: dict[tuple, int] = {}
        self._memo: dict[object, object] = {}

    def memo(self, key: object, compute):
        """Facts about the parsed template that every analysis of it shares."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # Locating tokens costs half as much as lexing, and most templates need no position
    # at all, so tokens are located on the first question about a column, and only up to
    # the line asked about.

    @property
    def line_starts(self) -> list[int]:
        if self._line_starts is None:
            starts = [0]
            for match in _NEWLINE.finditer(self.text):
                starts.append(match.end())
            self._line_starts = starts
        return self._line_starts

    def _raw_tokens_list(self) -> list:
        if self._raw is None:
            if self._raw_tokens is not None:
                self._raw = self._raw_tokens
            else:
                self._raw = []
                try:
                    for token in self._environment.lexer.tokeniter(self.text, None):
                        self._raw.append(token)
                except jinja2.TemplateSyntaxError:
                    pass  # a template that does not lex has no nodes to locate either
        return self._raw

    def _locate(self, through: int) -> None:
        """Offsets of the first ``through`` raw tokens: each token's text found forward
        from the end of the previous one."""
        raw, offsets, text = self._raw_tokens_list(), self._offsets, self.text
        search_from = self._search_from
        for index in range(len(offsets), min(through, len(raw))):
            value = raw[index][2]
            offset = text.find(value, search_from)
            offsets.append(offset)
            if offset >= 0:
                search_from = offset + len(value)
        self._search_from = search_from

    def _on_line(self, line: int) -> list[Token]:
        if line not in self._by_line:
            raw = self._raw_tokens_list()
            first = bisect.bisect_left(raw, line, key=_line_of)
            last = bisect.bisect_right(raw, line, lo=first, key=_line_of)
            self._locate(last)
            self._by_line[line] = [
                Token(self._offsets[index], line, raw[index][1], raw[index][2])
                for index in range(first, last)
                if self._offsets[index] >= 0
            ]
        return self._by_line[line]

    @property
    def tokens(self) -> list[Token]:
        if self._tokens is None:
            raw = self._raw_tokens_list()
            self._locate(len(raw))
            self._tokens = [
                Token(offset, line, kind, value) for offset, (line, kind, value) in zip(self._offsets, raw) if offset >= 0
            ]
        return self._tokens

    def line_text(self, line: int) -> str:
        if not 1 <= line <= len(self.line_starts):
            return ""
        start = self.line_starts[line - 1]
        end = self.line_starts[line] if line < len(self.line_starts) else len(self.text)
        return self.text[start:end].rstrip("\r\n")

    def column_of_offset(self, offset: int) -> int:
        line_index = bisect.bisect_right(self.line_starts, offset) - 1
        return offset - self.line_starts[line_index] + 1

    def name_token(self, node: nodes.Name | nodes.Filter | nodes.NSRef) -> Token | None:
        """The lexer token of a Name node, a filter's name or a namespace reference's namespace
        (the n-th such name on its line)."""
        same_name = [token for token in self._on_line(node.lineno) if token.kind == "name" and token.value == node.name]
        if len(same_name) == 1:
            # Every Name and Filter node has a name token of its own on its line, so the
            # only token of that name is this node's: no numbering needed.
            return same_name[0]
        if self._occurrence is None:
            self._occurrence = {}
            if self._tree is not None:
                self._number_names(self._tree, self._occurrence)
        wanted = self._occurrence.get(id(node), 0)
        return same_name[wanted] if wanted < len(same_name) else None

    def position(self, node: nodes.Node) -> tuple[int, int]:
        """(line, column) of a filter's name, else of the node's leftmost name, else of the
        line's first code token."""
        anchor = node if isinstance(node, nodes.Filter) else leftmost_name(node)
        if anchor is not None:
            token = self.name_token(anchor)
            if token is not None:
                return token.line, self.column_of_offset(token.offset)
        line = getattr(node, "lineno", 1) or 1
        for token in self._on_line(line):
            if token.kind not in ("data", "whitespace", "block_begin", "variable_begin"):
                return line, self.column_of_offset(token.offset)
        return line, 1

    def literal_position(self, node: nodes.Const | nodes.TemplateData) -> tuple[int, int] | None:
        """(line, column) of a string literal's opening quote, or of the first character of
        template text that is not whitespace (text may start with the end of the line before
        it). None where no token of the line is the node's alone: two string tokens the parser
        joins (`'a' 'b'`), or text whose line endings the source writes as ``\\r\\n``."""
        if isinstance(node, nodes.Const):
            kind, value = "string", node.value
        else:
            kind, value = "data", node.data
        if not isinstance(value, str):
            return None
        lineno = getattr(node, "lineno", 1) or 1
        same_value = [token for token in self._on_line(lineno) if token.kind == kind and self._decoded(token) == value]
        if self._literal_occurrence is None:
            self._literal_occurrence = {}
            if self._tree is not None:
                self._number_literals(self._tree, self._literal_occurrence)
        if len(same_value) != self._literal_count.get((lineno, kind, value), 0):
            return None  # a token of the line was not located, or is not one node's
        token = same_value[self._literal_occurrence.get(id(node), 0)]
        offset = token.offset
        if kind == "data":
            offset += len(token.value) - len(token.value.lstrip())
            if offset == token.end:
                offset = token.offset
        line = bisect.bisect_right(self.line_starts, offset)
        return line, self.column_of_offset(offset)

    def _decoded(self, token: Token) -> str | None:
        """A string or data token's value as the parser reads it (quotes and escapes gone)."""
        try:
            (wrapped,) = self._environment.lexer.wrap(iter([(token.line, token.kind, token.value)]))
        except (jinja2.TemplateSyntaxError, ValueError):
            return None
        return wrapped.value

    def _number_literals(self, tree: nodes.Node, occurrence: dict[int, int]) -> None:
        """Number each string literal and text node among those of its line, kind and value,
        in source order (see ``_number_names``), and count them."""
        counters = self._literal_count
        stack: list[nodes.Node] = [tree]
        while stack:
            node = stack.pop()
            stack.extend(reversed(children_in_source_order(node)))
            if isinstance(node, nodes.Const) and isinstance(node.value, str):
                key = (node.lineno, "string", node.value)
            elif isinstance(node, nodes.TemplateData):
                key = (node.lineno, "data", node.data)
            else:
                continue
            occurrence[id(node)] = counters.get(key, 0)
            counters[key] = counters.get(key, 0) + 1

    def _number_names(self, tree: nodes.Node, occurrence: dict[int, int]) -> None:
        """Number each Name and Filter node among those of its name on its line, in source
        order. Without recursion: templates nest deeper than Python's stack."""
        counters: dict[tuple[int, str], int] = {}
        stack: list = [tree]
        while stack:
            item = stack.pop()
            if type(item) is tuple:  # a filter, numbered once its input is
                node = item[0]
            else:
                node = item
                children = children_in_source_order(node)
                if isinstance(node, nodes.Filter) and node.node is not None:
                    # A filter's name follows its input in the source, so number it after the input.
                    stack.extend(reversed([child for child in children if child is not node.node]))
                    stack.append((node,))
                    stack.append(node.node)
                    continue
                stack.extend(reversed(children))
                # `{% set ns.x = ... %}` writes the name `ns` without a Name node: counted too,
                # or a later `ns` on the line would be matched with it.
                if not isinstance(node, (nodes.Name, nodes.Filter, nodes.NSRef)):
                    continue
            key = (node.lineno, node.name)
            occurrence[id(node)] = counters.get(key, 0)
            counters[key] = counters.get(key, 0) + 1


def _line_of(raw_token: tuple) -> int:
    return raw_token[0]


# Fields that never hold a node, in any of jinja's node classes: names, operators, flags.
_SCALAR_FIELDS = frozenset(
    {"name", "attr", "ctx", "op", "data", "recursive", "scoped", "required", "with_context", "ignore_missing"}
)
# Per node class, the fields that may hold nodes: a Const's, Name's or text's none.
_NODE_FIELDS: dict[type, tuple[str, ...]] = {nodes.Const: ()}


def child_nodes(node: nodes.Node) -> list[nodes.Node]:
    """``list(node.iter_child_nodes())`` without its generators (``iter_fields`` checks its
    filters for every field of every node) nor the fields that hold no node: the analysis
    asks for children often."""
    fields = _NODE_FIELDS.get(type(node))
    if fields is None:
        fields = _NODE_FIELDS[type(node)] = tuple(name for name in node.fields if name not in _SCALAR_FIELDS)
    children: list[nodes.Node] = []
    for name in fields:
        item = getattr(node, name, None)
        if isinstance(item, list):
            children.extend(child for child in item if isinstance(child, nodes.Node))
        elif isinstance(item, nodes.Node):
            children.append(item)
    return children


def descendants(node: nodes.Node) -> list[nodes.Node]:
    """The nodes under ``node`` in ``find_all``'s order, from one walk without generators
    (or recursion: templates nest deeper than Python's stack)."""
    found: list[nodes.Node] = []
    stack = child_nodes(node)
    stack.reverse()
    while stack:
        current = stack.pop()
        found.append(current)
        children = child_nodes(current)
        children.reverse()
        stack.extend(children)
    return found


def preorder(node: nodes.Node) -> tuple[list[nodes.Node], list[int]]:
    """``descendants(node)``, and for each the index just past its own descendants: a
    subtree is a slice, so one walk serves every question about any part of the tree."""
    found: list[nodes.Node] = []
    ends: list[int] = []
    stack: list = child_nodes(node)
    stack.reverse()
    while stack:
        current = stack.pop()
        if type(current) is int:  # every node under the one at this index is found
            ends[current] = len(found)
            continue
        stack.append(len(found))
        found.append(current)
        ends.append(0)
        children = child_nodes(current)
        children.reverse()
        stack.extend(children)
    return found, ends


def children_in_source_order(node: nodes.Node):
    if isinstance(node, nodes.CondExpr):  # written `expr1 if test else expr2`
        return [child for child in (node.expr1, node.test, node.expr2) if child is not None]
    if isinstance(node, nodes.For):  # written `for target in iter if test`
        ordered = [node.target, node.iter] + ([node.test] if node.test else [])
        return ordered + list(node.body) + list(node.else_)
    return child_nodes(node)


def leftmost_name(node: nodes.Node) -> nodes.Name | None:
    if isinstance(node, nodes.Name):
        return node
    for child in children_in_source_order(node):
        found = leftmost_name(child)
        if found is not None:
            return found
    return None
