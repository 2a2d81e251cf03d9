r"""## What it does
Reports a template that does not parse in the Jinja environment transformers and vLLM
render chat templates with (sandboxed, `trim_blocks`, `lstrip_blocks`, `loopcontrols`,
the `{% generation %}` tag).

## Why is this bad?
A template that does not parse cannot serve a single request, cached or not. Every other
rule needs the syntax tree, so none of them runs on this template.

## Example
```jinja
{%- for message in messages %}
    {{- message.content }}
{%- endif %}
```

## Use instead
```jinja
{%- for message in messages %}
    {{- message.content }}
{%- endfor %}
```

## Fix safety
No automatic fix: only the author knows what the template meant.
"""

from __future__ import annotations

from dataclasses import dataclass

from jinja2 import TemplateSyntaxError
from jinja2.lexer import TokenStream
from jinja2.parser import Parser

from tmpl_lint.analysis.facts import Facts, Site
from tmpl_lint.findings import Finding, Message, Outcome
from tmpl_lint.jinja_env import PARSE_ENVIRONMENT

from ._contract import RuleInfo, Severity

RULE = RuleInfo("PC000", "syntax-error", Severity.ERROR, "the template does not parse", reports=Outcome.SYNTAX_ERROR)


@dataclass(frozen=True)
class DoesNotParse(Message):
    text = "template does not parse: {error}"
    error: str | None  # jinja's own message


def check(facts: Facts) -> list[Finding]:
    error = facts.syntax_error
    if error is None:
        return []
    line = error.lineno or 1
    return [RULE.at(Site(line, "", fixed_column=_column(facts, line, error.message or "")), DoesNotParse(error.message))]


def _column(facts: Facts, line: int, message: str) -> int:
    """Where on its line the error is: Jinja says only the line. Where the parser stopped,
    the token it could not take; where the lexer stopped, the first character after the
    last token it read (a stray `}`); else 1."""
    source_map = facts.source_map
    starts = source_map.line_starts
    if line > len(starts):
        return 1
    line_start = starts[line - 1]
    line_end = starts[line] if line < len(starts) else len(facts.text) + 1
    raw = []
    try:
        raw = list(PARSE_ENVIRONMENT.lexer.tokeniter(facts.text, None))
    except TemplateSyntaxError:  # the lexer's own error: it stopped after the last token it read
        located = source_map.tokens
        stopped = located[-1].end if located else 0
        while stopped < len(facts.text) and facts.text[stopped] in " \t":
            stopped += 1
        return stopped - line_start + 1 if line_start <= stopped < line_end else 1
    taken: list = []

    def counted():
        for token in raw:
            taken.append(token)
            yield token

    parser = Parser(PARSE_ENVIRONMENT, facts.text)
    parser.stream = TokenStream(PARSE_ENVIRONMENT.lexer.wrap(counted()), None, None)
    try:
        parser.subparse()
    except TemplateSyntaxError:
        current = parser.stream.current
        # The token the parser stood at: the last one read with its line and text (a
        # look-ahead may have read one more).
        for index in range(len(taken) - 1, -1, -1):
            token_line, _, value = taken[index]
            if token_line == current.lineno == line and value == current.value:
                nth = sum(1 for other in taken[:index] if other[0] == line and other[2] == value)
                same = [token for token in source_map.tokens if token.line == line and token.value == value]
                if nth < len(same):
                    return same[nth].offset - line_start + 1
                break
    except RecursionError:
        pass
    return 1
