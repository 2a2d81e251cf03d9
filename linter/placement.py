"""Where a template's characters sit in the file that holds it.

A finding's line and column are the template's own (what the rules see). Editors, SARIF,
GitHub annotations and ``path:line:col`` readers want the file's: for a template inside
``tokenizer_config.json`` that is the line of the JSON string and the column of the
character inside it, escapes counted. Each character of the template is mapped to its
offset in the file by walking the literal that holds it (a JSON string, a Python string
literal); a YAML literal block holds the template line for line, indented.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path

_NEWLINE = re.compile(r"\r\n|\r|\n")


def _line_starts(text: str) -> list[int]:
    return [0] + [match.end() for match in _NEWLINE.finditer(text)]


@dataclass(frozen=True)
class Placement:
    """Maps template (line, column) to file (line, column), both 1-based."""

    # The offset at which each line starts, in the template and in the file: read only with
    # ``offsets``.
    template_starts: list[int]
    file_starts: list[int]
    # The file offset of each template character, and one past the last; None: the file
    # holds the template line for line, each ``indent`` columns in, from ``first_line``.
    offsets: list[int] | None = None
    first_line: int = 1
    indent: int = 0
    # A scalar whose layout does not keep the template's lines (a quoted YAML string): every
    # character is placed at its key.
    fixed: tuple[int, int] | None = None

    def position(self, line: int, column: int) -> tuple[int, int]:
        if self.fixed is not None:
            return self.fixed
        if self.offsets is None:
            return self.first_line + line - 1, column + self.indent
        line = min(max(line, 1), len(self.template_starts))
        index = min(self.template_starts[line - 1] + column - 1, len(self.offsets) - 1)
        offset = self.offsets[max(index, 0)]
        file_line = bisect.bisect_right(self.file_starts, offset)
        return file_line, offset - self.file_starts[file_line - 1] + 1


def placement(path: Path, container: str, name: str | None, template: str, file_text: str | None = None) -> Placement | None:
    """Where ``template`` sits in its file (read from ``path`` unless ``file_text``), or
    None when the file no longer holds it as read."""
    if container == "jinja":
        # The file is the template, line for line: no offsets to map, so no lines to find
        # (a scan of the whole template, for each template with a finding).
        return Placement([], [])
    if container not in ("json", "python", "yaml"):
        # a GGUF's template is placed by its own lines; its file (tens of GB) is never read
        return None
    starts = _line_starts(template)
    if file_text is None:
        try:
            file_text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None
    file_starts = _line_starts(file_text)
    offsets: list[int] | None
    try:
        if container == "json":
            offsets = _json_offsets(file_text, name)
        elif container == "python":
            offsets = _python_offsets(file_text, name)
        else:
            return _yaml_placement(file_text, name, starts, file_starts)
    except Exception:  # noqa: BLE001 - a file that changed under us is placed nowhere, not an error
        return None
    if offsets is None or len(offsets) != len(template) + 1:
        return None
    return Placement(starts, file_starts, offsets)


def _json_offsets(text: str, name: str | None) -> list[int]:
    from .containers import json_template_span  # noqa: PLC0415 -- 15 ms: JSON, Python and YAML only

    span = json_template_span(text, name)
    index, end = span.start + 1, span.end - 1
    offsets: list[int] = []
    while index < end:
        offsets.append(index)
        if text[index] != "\\":
            index += 1
        elif text[index + 1] != "u":
            index += 2
        elif _is_surrogate_pair(text, index):
            index += 12  # one character written as two \u escapes
        else:
            index += 6
    offsets.append(end)
    return offsets


def _is_surrogate_pair(text: str, index: int) -> bool:
    high = int(text[index + 2 : index + 6], 16)
    if not 0xD800 <= high < 0xDC00 or text[index + 6 : index + 8] != "\\u":
        return False
    return 0xDC00 <= int(text[index + 8 : index + 12], 16) < 0xE000


_SIMPLE_ESCAPES = set("\\'\"abfnrtv")
_ESCAPE_LENGTHS = {"x": 4, "u": 6, "U": 10}


def _python_offsets(text: str, name: str | None) -> list[int] | None:
    from .containers import QUOTED_LITERAL, parse_python, python_literals  # noqa: PLC0415 -- 15 ms: JSON, Python and YAML only

    _, found, _ = python_literals(parse_python(text))
    literal = next((node for key, node in found if key == name), None)
    parts = _simple_strings(literal)
    if not parts or name is None:  # a literal is found only by its name
        return None
    # The name holds the literal's line, and its column where the line holds two.
    where = name.rsplit("@", 1)[1].split(":")
    line, column = int(where[0]), int(where[1]) if len(where) > 1 else 1
    position = _line_starts(text)[line - 1] + column - 1
    offsets: list[int] = []
    for part in parts:  # adjacent literals ('a' 'b'), in the order the file holds them
        start = text.find(part.value, position)
        if start < 0:
            return None
        offsets.extend(_string_offsets(text, start, part.value))
        position = start + len(part.value)
    last = QUOTED_LITERAL.match(parts[-1].value)
    if last is None:
        return None
    offsets.append(position - len(last.group(2)))
    return offsets


def _simple_strings(node) -> list | None:
    """The plain string literals a literal is made of: itself, or the parts of adjacent
    literals ('a' 'b'); None for anything else (an f-string)."""
    import libcst as cst  # noqa: PLC0415 -- an extra (fix), 0.2 s: only for a template inside Python

    if isinstance(node, cst.SimpleString):
        return [node]
    if isinstance(node, cst.ConcatenatedString):
        left, right = _simple_strings(node.left), _simple_strings(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _string_offsets(text: str, start: int, value: str) -> list[int]:
    """The file offset of each character of the string literal ``value`` written at ``start``."""
    from .containers import QUOTED_LITERAL  # noqa: PLC0415 -- 15 ms: JSON, Python and YAML only

    literal = QUOTED_LITERAL.match(value)
    if literal is None:  # placed nowhere, as any file that changed under us
        raise ValueError(f"not a string literal: {value[:40]!r}")
    prefix, quote = literal.groups()
    index = start + len(prefix) + len(quote)
    end = start + len(value) - len(quote)
    raw = "r" in prefix.lower()
    offsets: list[int] = []
    while index < end:
        char = text[index]
        if char != "\\" or raw:
            offsets.append(index)
            index += 1
            continue
        escaped = text[index + 1]
        if escaped == "\n":
            index += 2  # a line continuation: no character
        elif escaped in _SIMPLE_ESCAPES:
            offsets.append(index)
            index += 2
        elif escaped in _ESCAPE_LENGTHS:
            offsets.append(index)
            index += _ESCAPE_LENGTHS[escaped]
        elif escaped == "N":
            offsets.append(index)
            index = text.index("}", index) + 1
        elif escaped in "01234567":
            offsets.append(index)
            following = text[index + 1 : index + 4]
            index += 1 + len(following) - len(following.lstrip("01234567"))  # up to three octal digits
        else:  # an unknown escape keeps its backslash
            offsets.extend([index, index + 1])
            index += 2
    return offsets


def _yaml_placement(text: str, name: str | None, starts: list[int], file_starts: list[int]) -> Placement | None:
    from ruamel.yaml.scalarstring import LiteralScalarString  # noqa: PLC0415 -- an extra (fix): YAML only

    from .containers import round_trip_yaml, yaml_places  # noqa: PLC0415 -- 15 ms: JSON, Python and YAML only

    for path, mapping, key in yaml_places(round_trip_yaml().load(text)):
        if ".".join(path) != name:
            continue
        key_line = mapping.lc.key(key)[0] + 1
        if not isinstance(mapping[key], LiteralScalarString):
            return Placement(starts, file_starts, fixed=(key_line, mapping.lc.key(key)[1] + 1))
        body = text.splitlines()[key_line] if key_line < len(file_starts) else ""
        indent = len(body) - len(body.lstrip(" "))
        return Placement(starts, file_starts, None, key_line + 1, indent)
    return None
