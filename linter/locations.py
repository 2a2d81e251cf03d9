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
from dataclasses import dataclass

import jinja2
from jinja2 import nodes

_NEWLINE = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Token:
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
        self._tokens: list[Token] | None = None
        self._by_line: dict[int, list[Token]] = {}
        self._occurrence: dict[int, int] = {}
        self._memo: dict[object, object] = {}

    def memo(self, key: object, compute):
        """Facts about the parsed template that every analysis of it shares."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # Lexing again and numbering names costs as much as parsing, and most templates need
    # no position at all, so both happen on the first question about a column.

    @property
    def line_starts(self) -> list[int]:
        if self._line_starts is None:
            starts = [0]
            for match in _NEWLINE.finditer(self.text):
                starts.append(match.end())
            self._line_starts = starts
        return self._line_starts

    @property
    def tokens(self) -> list[Token]:
        if self._tokens is None:
            self._tokens = []
            try:
                position = 0
                raw = self._raw_tokens if self._raw_tokens is not None else self._environment.lexer.tokeniter(self.text, None)
                for line, kind, value in raw:
                    offset = self.text.find(value, position)
                    if offset < 0:
                        continue
                    self._tokens.append(Token(offset, line, kind, value))
                    position = offset + len(value)
            except jinja2.TemplateSyntaxError:
                pass  # a template that does not lex has no nodes to locate either
            for token in self._tokens:
                self._by_line.setdefault(token.line, []).append(token)
            if self._tree is not None:
                self._number_names(self._tree)
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

    def name_token(self, node: nodes.Name | nodes.Filter) -> Token | None:
        """The lexer token of a Name node or a filter's name (the n-th such name on its line)."""
        self.tokens  # noqa: B018 - lexes on first use
        wanted = self._occurrence.get(id(node), 0)
        seen = 0
        for token in self._by_line.get(node.lineno, ()):
            if token.kind == "name" and token.value == node.name:
                if seen == wanted:
                    return token
                seen += 1
        return None

    def position(self, node: nodes.Node) -> tuple[int, int]:
        """(line, column) of a filter's name, else of the node's leftmost name, else of the
        line's first code token."""
        anchor = node if isinstance(node, nodes.Filter) else leftmost_name(node)
        if anchor is not None:
            token = self.name_token(anchor)
            if token is not None:
                return token.line, self.column_of_offset(token.offset)
        line = getattr(node, "lineno", 1) or 1
        self.tokens  # noqa: B018 - lexes on first use
        for token in self._by_line.get(line, ()):
            if token.kind not in ("data", "whitespace", "block_begin", "variable_begin"):
                return line, self.column_of_offset(token.offset)
        return line, 1

    def _number_names(self, tree: nodes.Node) -> None:
        counters: dict[tuple[int, str], int] = {}

        def visit(node: nodes.Node) -> None:
            # A filter's name follows its input in the source, so number it after the input.
            children = children_in_source_order(node)
            if isinstance(node, nodes.Filter) and node.node is not None:
                visit(node.node)
                children = [child for child in children if child is not node.node]
            # `{% set ns.x = ... %}` writes the name `ns` without a Name node: counted too,
            # or a later `ns` on the line would be matched with it.
            if isinstance(node, (nodes.Name, nodes.Filter, nodes.NSRef)):
                key = (node.lineno, node.name)
                self._occurrence[id(node)] = counters.get(key, 0)
                counters[key] = counters.get(key, 0) + 1
            for child in children:
                visit(child)

        visit(tree)


def children_in_source_order(node: nodes.Node):
    if isinstance(node, nodes.CondExpr):  # written `expr1 if test else expr2`
        return [child for child in (node.expr1, node.test, node.expr2) if child is not None]
    if isinstance(node, nodes.For):  # written `for target in iter if test`
        ordered = [node.target, node.iter] + ([node.test] if node.test else [])
        return ordered + list(node.body) + list(node.else_)
    return list(node.iter_child_nodes())


def leftmost_name(node: nodes.Node) -> nodes.Name | None:
    if isinstance(node, nodes.Name):
        return node
    for child in children_in_source_order(node):
        found = leftmost_name(child)
        if found is not None:
            return found
    return None
