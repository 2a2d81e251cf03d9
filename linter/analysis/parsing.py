"""Parsing a template once, keeping the lexer's raw tokens for exact columns."""

from __future__ import annotations

import jinja2
from jinja2 import nodes
from jinja2.lexer import TokenStream
from jinja2.parser import Parser

from ..jinja_env import PARSE_ENVIRONMENT


def parse(text: str) -> tuple[nodes.Template | None, jinja2.TemplateSyntaxError | None]:
    tree, error, _ = parse_with_tokens(text)
    return tree, error


def parse_with_tokens(text: str) -> tuple[nodes.Template | None, jinja2.TemplateSyntaxError | None, list | None]:
    """Parse from one lexing pass whose raw tokens are kept: the source map reuses them
    for exact columns instead of lexing the template a second time."""
    environment = PARSE_ENVIRONMENT
    raw: list | None = None
    try:
        raw = list(environment.lexer.tokeniter(text, None))
        parser = Parser(environment, text)  # lexes lazily: only its first token
        parser.stream = TokenStream(environment.lexer.wrap(iter(raw)), None, None)
        # ``parser.parse()`` would also walk the tree to set each node's environment, which
        # only compiling and ``as_const`` without a context use (a twelfth of a parse).
        return nodes.Template(parser.subparse(), lineno=1), None, raw
    except jinja2.TemplateSyntaxError as error:
        return None, error, raw
    except RecursionError:
        return None, jinja2.TemplateSyntaxError("the template is nested too deeply to parse", 1), raw
