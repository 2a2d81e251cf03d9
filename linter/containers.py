"""Templates inside other files: JSON configs, Python source, YAML; finding and rewriting
them so that only the template's own bytes change.

- JSON: the exact span of the ``chat_template`` value (or of one named entry's
  ``template``) is found with the standard library's JSON scanner, and only that span is
  replaced; every other byte of the file stays as it was.
- Python: string literals assigned to ``chat_template`` (a name, an attribute, a dict key
  or a keyword argument), found and rewritten with libcst, formatting and comments kept.
- YAML: values of ``chat_template`` / ``chat_template_jinja`` keys at any depth, rewritten
  with ruamel.yaml's round-trip mode, comments, key order and block style kept.
"""

from __future__ import annotations

import ast
import copy
import difflib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .edits import line_ending

if TYPE_CHECKING:
    import libcst as cst

TEMPLATE_KEYS = ("chat_template", "chat_template_jinja")
_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace (RFC 8259), as the json module skips it


class ContainerError(Exception):
    pass


# -- JSON --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    start: int
    end: int


def _skip(text: str, index: int) -> int:
    whitespace = _WHITESPACE.match(text, index)
    assert whitespace is not None  # the pattern matches the empty string
    return whitespace.end()


def object_spans(text: str, start: int = 0) -> tuple[dict[str, tuple[Span, Span]], int]:
    """Spans of each (key, value) of the JSON object at ``start``, and the end of the object."""
    index = _skip(text, start)
    if text[index : index + 1] != "{":
        raise ContainerError("expected a JSON object")
    index = _skip(text, index + 1)
    spans: dict[str, tuple[Span, Span]] = {}
    if text[index : index + 1] == "}":
        return spans, index + 1
    while True:
        if text[index : index + 1] != '"':
            raise ContainerError(f"expected a key at offset {index}")
        key, key_end = _DECODER.raw_decode(text, index)  # a string: the key
        key_span = Span(index, key_end)
        index = _skip(text, key_end)
        if text[index : index + 1] != ":":
            raise ContainerError(f"expected ':' at offset {index}")
        value_start = _skip(text, index + 1)
        try:
            _, value_end = _DECODER.raw_decode(text, value_start)
        except json.JSONDecodeError as error:
            raise ContainerError(str(error)) from None
        except RecursionError:
            raise ContainerError("nested too deeply to read") from None
        spans[key] = (key_span, Span(value_start, value_end))
        index = _skip(text, value_end)
        if text[index : index + 1] == ",":
            index = _skip(text, index + 1)
            continue
        if text[index : index + 1] == "}":
            return spans, index + 1
        raise ContainerError(f"expected ',' or '}}' at offset {index}")


def json_template_span(text: str, name: str | None) -> Span:
    """Where the template named ``name`` (None: the single string) sits in a JSON file."""
    spans, _ = object_spans(text)
    if "chat_template" not in spans:
        raise ContainerError("no chat_template key")
    value = spans["chat_template"][1]
    if name is None:
        if text[value.start] != '"':
            raise ContainerError("chat_template is not a string")
        return value
    index = _skip(text, value.start + 1)  # inside the list
    while text[index : index + 1] == "{":
        entry, end = object_spans(text, index)
        entry_name = json.loads(text[entry["name"][1].start : entry["name"][1].end]) if "name" in entry else None
        if entry_name == name and "template" in entry:
            return entry["template"][1]
        index = _skip(text, end)
        if text[index : index + 1] == ",":
            index = _skip(text, index + 1)
    raise ContainerError(f"no template named {name!r}")


def replace_json_template(text: str, name: str | None, template: str) -> str:
    """``text`` with the template value replaced by ``template``, its bytes changed only
    where the template changed: what the fix left alone keeps the file's own escapes
    (``\\/``, ``\\u003c``...), and the new text is escaped as the file escapes."""
    span = json_template_span(text, name)
    original = text[span.start : span.end]
    old = json.loads(original)
    starts, every_slash_escaped = _decoded_starts(original)
    # Keep the file's escaping: \\uXXXX for non-ASCII only if that is how it was written.
    ascii_only = not any(ord(char) > 127 for char in original) and any(ord(char) > 127 for char in old)

    def written(new: str) -> str:
        literal = json.dumps(new, ensure_ascii=ascii_only)[1:-1]
        return _escape_surrogates(literal.replace("/", "\\/") if every_slash_escaped else literal)  # dumps writes no "\\/"

    pieces = ['"']
    for kept, a, b, c, d in _changes(old, template):
        pieces.append(original[starts[a] : starts[b]] if kept else written(template[c:d]))
    pieces.append('"')
    return text[: span.start] + "".join(pieces) + text[span.end :]


_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")


def _changes(old: str, new: str) -> Iterator[tuple[bool, int, int, int, int]]:
    """``old`` turned into ``new`` as runs (kept, old start, old end, new start, new end):
    the lines they share, then within the lines that differ the words and characters they
    share, are kept; the rest is new. A fix edits a few places of a long template (a
    one-line template is one line), so lines alone would rewrite most of it."""

    def runs(a: int, c: int, old_parts: list[str], new_parts: list[str], finer) -> Iterator[tuple[bool, int, int, int, int]]:
        old_at, new_at = _part_starts(a, old_parts), _part_starts(c, new_parts)
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old_parts, new_parts, autojunk=False).get_opcodes():
            if tag == "equal":
                yield True, old_at[i1], old_at[i2], new_at[j1], new_at[j2]
            else:
                yield from finer(old_at[i1], old_at[i2], new_at[j1], new_at[j2])

    def characters(a: int, b: int, c: int, d: int) -> Iterator[tuple[bool, int, int, int, int]]:
        same = len(os.path.commonprefix([old[a:b], new[c:d]]))
        tail = len(os.path.commonprefix([old[a + same : b][::-1], new[c + same : d][::-1]]))
        yield True, a, a + same, c, c + same
        yield False, a + same, b - tail, c + same, d - tail
        yield True, b - tail, b, d - tail, d

    def words(a: int, b: int, c: int, d: int) -> Iterator[tuple[bool, int, int, int, int]]:
        yield from runs(a, c, _TOKEN.findall(old[a:b]), _TOKEN.findall(new[c:d]), characters)

    yield from runs(0, 0, old.splitlines(keepends=True), new.splitlines(keepends=True), words)


def _part_starts(start: int, parts: list[str]) -> list[int]:
    starts = [start]
    for part in parts:
        starts.append(starts[-1] + len(part))
    return starts


def _decoded_starts(literal: str) -> tuple[list[int], bool]:
    """Where each character of the JSON string ``literal`` (quotes included) starts in it,
    then where the closing quote is; and whether the file escapes every "/" (and has one)."""
    starts = []
    slashes = escaped_slashes = 0
    index = 1
    while index < len(literal) - 1:
        starts.append(index)
        if literal[index] != "\\":
            slashes += literal[index] == "/"
            index += 1
        elif literal[index + 1] != "u":
            escaped_slashes += literal[index + 1] == "/"
            index += 2
        elif 0xD800 <= int(literal[index + 2 : index + 6], 16) < 0xDC00 and literal[index + 6 : index + 8] == "\\u":
            low = int(literal[index + 8 : index + 12], 16)
            index += 12 if 0xDC00 <= low < 0xE000 else 6  # a pair is one character, as json.loads reads it
        else:
            index += 6
    starts.append(len(literal) - 1)
    return starts, escaped_slashes > 0 and slashes == 0


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogates(literal: str) -> str:
    r"""A lone surrogate (a JSON ``\ud800`` escape read into the template) as its escape
    again: UTF-8 cannot hold it raw."""
    return _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", literal)


# -- Python ------------------------------------------------------------------------------


def _target_name(node) -> str | None:
    import libcst as cst  # noqa: PLC0415 -- libcst: the optional [fix] extra

    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            return _text(index.value)
    return None


def _text(literal: cst.SimpleString) -> str | None:
    """The string a ``str`` literal holds; None for a bytes literal (no key of a template)."""
    value = literal.evaluated_value
    return value if isinstance(value, str) else None


def python_literals(module):
    """(name, literal node) of every string literal assigned to chat_template. A name is the
    key and the literal's line, ``chat_template@12``, and its column too where one line
    holds two (``chat_template@12:40``). A literal may be two or more adjacent strings."""
    import libcst as cst  # noqa: PLC0415 -- libcst: the optional [fix] extra
    from libcst.metadata import MetadataWrapper, PositionProvider  # noqa: PLC0415 -- libcst: the optional [fix] extra

    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    found = []
    unread = []  # (key, line, what it is) of a template built by code: f-string, `+`

    def record(key: str | None, value) -> None:
        # f-strings evaluate to None, bytes to bytes: neither is a template to read.
        literal = isinstance(value, (cst.SimpleString, cst.ConcatenatedString)) and isinstance(value.evaluated_value, str)
        if key in TEMPLATE_KEYS and literal:
            start = positions[value].start
            found.append((key, start.line, start.column + 1, value))
        elif key in TEMPLATE_KEYS and isinstance(
            value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString, cst.BinaryOperation)
        ):
            if isinstance(value, cst.BinaryOperation):
                what = "an expression built with +"
            elif isinstance(value, (cst.SimpleString, cst.ConcatenatedString)) and isinstance(value.evaluated_value, bytes):
                what = "a bytes literal"  # a tokenizer takes a str
            else:
                what = "an f-string"
            unread.append((key, positions[value].start.line, what))

    class Finder(cst.CSTVisitor):
        def visit_Assign(self, node) -> None:
            for target in node.targets:
                record(_target_name(target.target), node.value)

        def visit_AnnAssign(self, node) -> None:
            if node.value is not None:
                record(_target_name(node.target), node.value)

        def visit_Arg(self, node) -> None:
            if node.keyword is not None:
                record(node.keyword.value, node.value)

        def visit_DictElement(self, node) -> None:
            if isinstance(node.key, cst.SimpleString):
                record(_text(node.key), node.value)

    wrapper.module.visit(Finder())
    lines = [(key, line) for key, line, _, _ in found]
    named = [
        (f"{key}@{line}" if lines.count((key, line)) == 1 else f"{key}@{line}:{column}", literal)
        for key, line, column, literal in found
    ]
    passed_over = [
        f"{key} at line {line} is {what}: tmpl-lint reads a template written as a string literal" for key, line, what in unread
    ]
    return wrapper.module, named, passed_over


def parse_python(text: str):
    import libcst as cst  # noqa: PLC0415 -- libcst: the optional [fix] extra

    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as error:
        raise ContainerError(f"not valid Python: {error.message} (line {error.raw_line})") from None
    except cst.CSTValidationError as error:
        # What libcst parses and Python does not compile ("a" b"b": adjacent str and bytes
        # literals): Python's own words and line, which libcst's error does not give.
        raise ContainerError(f"not valid Python: {_python_syntax_error(text) or error}") from None
    except RecursionError:
        raise ContainerError("not readable as Python: nested too deeply") from None


def _python_syntax_error(text: str) -> str | None:
    try:
        ast.parse(text)
    except SyntaxError as error:
        return f"{error.msg} (line {error.lineno})"
    except (ValueError, RecursionError, MemoryError):
        return None
    return None


def python_templates(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, template) pairs, see ``python_literals`` for the names; and why each template
    built by code (an f-string, a ``+``) was passed over."""
    try:
        _, found, passed_over = python_literals(parse_python(text))
    except RecursionError:
        raise ContainerError("not readable as Python: nested too deeply") from None
    if not found and passed_over:
        raise ContainerError(passed_over[0])
    return [(name, literal.evaluated_value) for name, literal in found], passed_over


# A Python string literal's prefix and opening quote.
QUOTED_LITERAL = re.compile(r"(?i)([rbu]*)('''|\"\"\"|'|\")")


def _python_literal(original: str, template: str, newline: str = "\n") -> str:
    """A literal for ``template`` in the original literal's prefix and quotes, where it can be;
    a line break a triple-quoted literal holds raw is written as ``newline``, the file's own
    (Python reads a CRLF in a literal as "\n", so the template holds "\n" there)."""
    match = QUOTED_LITERAL.match(original)
    assert match is not None, "a literal libcst parsed starts with its prefix and quote"
    prefix, quote = match.group(1), match.group(2)
    raw = "r" in prefix.lower()
    if raw and quote not in template and not template.endswith("\\") and (len(quote) == 3 or "\n" not in template):
        candidate = f"{prefix}{quote}{template}{quote}"
    else:
        body = template.replace("\\", "\\\\")
        if len(quote) == 3:
            body = body.replace(quote, "\\" + quote[0] * 3)
            if body.endswith(quote[0]):
                body = body[:-1] + "\\" + quote[0]
        else:
            body = body.replace(quote, "\\" + quote).replace("\n", "\\n").replace("\r", "\\r")
        candidate = f"{prefix.replace('r', '').replace('R', '')}{quote}{body}{quote}"
    # repr() escapes what a source file cannot hold raw (a lone surrogate, say).
    if _SURROGATE.search(candidate) or ast.literal_eval(candidate) != template:
        return repr(template)
    if len(quote) == 3 and newline != "\n":
        candidate = candidate.replace("\n", newline)  # what literal_eval read back as "\n"
    return candidate


def replace_python_template(text: str, name: str, template: str) -> str:
    import libcst as cst  # noqa: PLC0415 -- libcst: the optional [fix] extra

    try:
        module, found, _ = python_literals(parse_python(text))
    except RecursionError:
        raise ContainerError("not readable as Python: nested too deeply") from None
    targets = [literal for key, literal in found if key == name]
    if not targets:
        raise ContainerError(f"no chat template literal {name}")
    (target,) = targets
    if isinstance(target, cst.ConcatenatedString):
        parts = 0
        node: cst.BaseString = target
        while isinstance(node, cst.ConcatenatedString):
            parts, node = parts + 1, node.right
        raise ContainerError(
            f"the template {name} is written as {parts + 1} adjacent string literals; tmpl-lint rewrites a single "
            "literal only: join them into one and run --fix again"
        )

    newline = line_ending(text)

    class Replace(cst.CSTTransformer):
        def leave_SimpleString(self, original_node, updated_node):
            if original_node is target:
                return updated_node.with_changes(value=_python_literal(original_node.value, template, newline))
            return updated_node

    code = module.visit(Replace()).code
    # libcst reads a leading byte-order mark and does not write it back: every other byte stays.
    return "\ufeff" + code if text.startswith("\ufeff") and not code.startswith("\ufeff") else code


# -- YAML --------------------------------------------------------------------------------


def round_trip_yaml():
    """ruamel.yaml in round-trip mode, keeping quotes and long lines as the file has them."""
    from ruamel.yaml import YAML  # noqa: PLC0415 -- ruamel.yaml: the optional [fix] extra

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 1 << 20  # never fold long lines the file did not fold
    return yaml


def yaml_places(node, path=(), seen=None):
    """(path, mapping, key) of every template key at any depth, each where it is written: a
    mapping an alias repeats is walked once, and a key a merge (`<<: *defaults`) brings in
    is its anchor's, not another template."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq  # noqa: PLC0415 -- ruamel.yaml: the optional [fix] extra

    seen = set() if seen is None else seen
    if isinstance(node, (CommentedMap, CommentedSeq)):
        if id(node) in seen:
            return
        seen.add(id(node))
    if isinstance(node, CommentedMap):
        own = getattr(node, "_ok", None)  # ruamel's own keys, without merged ones
        for key, value in node.items():
            if own is not None and key not in own:
                continue
            if key in TEMPLATE_KEYS and isinstance(value, str):
                yield path + (str(key),), node, key
            else:
                yield from yaml_places(value, path + (str(key),), seen)
    elif isinstance(node, CommentedSeq):
        for index, value in enumerate(node):
            yield from yaml_places(value, path + (str(index),), seen)


def _yaml_problem(error: Exception) -> str:
    first = str(error).splitlines()[0]
    if "expected a single document" in first:  # valid YAML, which tmpl-lint does not read
        return "holds several YAML documents (---); tmpl-lint reads a file of one"
    return f"not valid YAML: {first}"


def yaml_templates(text: str) -> list[tuple[str, str]]:
    from ruamel.yaml import YAMLError  # noqa: PLC0415 -- ruamel.yaml: the optional [fix] extra

    try:
        document = round_trip_yaml().load(text)
        return [(".".join(path), str(mapping[key])) for path, mapping, key in yaml_places(document)]
    except YAMLError as error:
        raise ContainerError(_yaml_problem(error)) from None
    except RecursionError:
        raise ContainerError("not readable as YAML: nested too deeply") from None


def _yaml_node(root, name: str):
    """(key node, value node) of the template at ``name`` in a composed YAML document."""
    from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode  # noqa: PLC0415 -- ruamel.yaml: the optional [fix] extra

    def walk(node, path):
        if isinstance(node, MappingNode):
            for key, value in node.value:
                here = path + (str(key.value),)
                if key.value in TEMPLATE_KEYS and isinstance(value, ScalarNode):
                    if ".".join(here) == name:
                        return key, value
                    continue
                found = walk(value, here)
                if found:
                    return found
        elif isinstance(node, SequenceNode):
            for index, value in enumerate(node.value):
                found = walk(value, path + (str(index),))
                if found:
                    return found
        return None

    return walk(root, ())


# What a literal block scalar can hold: YAML's printable characters, less those it reads as
# line breaks (\r, NEL, LS, PS) and the byte-order mark.
_BLOCK_UNSAFE = re.compile("[^\t\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")
_DOUBLE_QUOTED_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_BLOCK_HEADER = re.compile(r"[|>]([1-9]?)([+-]?)([1-9]?)")


def _double_quoted(template: str) -> str:
    """``template`` as a one-line YAML double-quoted scalar, escaping what is not printable."""

    def escape(char: str) -> str:
        if char in _DOUBLE_QUOTED_ESCAPES:
            return _DOUBLE_QUOTED_ESCAPES[char]
        if _BLOCK_UNSAFE.match(char):
            code = ord(char)
            return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        return char

    return '"' + "".join(escape(char) for char in template) + '"'


@dataclass(frozen=True)
class _Block:
    """How a block scalar is laid out in the file, to write another in its place."""

    indent: int  # spaces before each content line
    parent_indent: int  # the column of its key
    comment: str  # what follows the header's indicators on its line (a comment, spaces)
    trailing: str  # blank lines after the content that belong to the file, not the value
    newline: str
    final_break: bool  # False when the block ends the file without a line break


def _block(text: str, key, value) -> _Block:
    span = text[value.start_mark.index : value.end_mark.index]
    header, _, body = span.partition("\n")
    indicators = _BLOCK_HEADER.match(header)
    assert indicators is not None, "a block scalar starts with | or >"
    explicit = indicators.group(1) or indicators.group(3)
    content = [line for line in body.split("\n") if line.strip(" \r")]
    if explicit:
        indent = key.start_mark.column + int(explicit)
    elif content:
        indent = len(content[0]) - len(content[0].lstrip(" "))
    else:
        indent = key.start_mark.column + 2
    trailing = ""
    if indicators.group(2) != "+":  # kept blank lines are the value's, not the file's
        offset = end_of_content = 0
        for line in body.split("\n"):
            offset += len(line) + 1
            if line.strip(" \r"):
                end_of_content = min(offset, len(body))
        trailing = body[end_of_content:]
    newline = "\r\n" if header.endswith("\r") else "\n"
    comment = header[indicators.end() :].removesuffix("\r")
    return _Block(indent, key.start_mark.column, comment, trailing, newline, span.endswith("\n"))


def _literal_block(template: str, layout: _Block) -> str | None:
    """``template`` as a literal block scalar laid out as ``layout``, or None if a block
    cannot hold it."""
    if _BLOCK_UNSAFE.search(template) or not template.strip():
        return None
    ending = len(template) - len(template.rstrip("\n"))
    body = template.split("\n")[: -1 if ending else None]
    chomping = "-" if ending == 0 else "" if ending == 1 else "+"
    # Content starting with a space (or a blank first line) cannot set the indentation itself.
    step = layout.indent - layout.parent_indent
    indicator = str(step) if body[0].startswith(" ") or not body[0].strip() else ""
    if indicator and not 1 <= step <= 9:
        return None
    lines = "".join((" " * layout.indent + line if line else "") + layout.newline for line in body)
    if chomping == "-" and not layout.final_break:
        lines = lines.removesuffix(layout.newline)
    # Blank lines kept at the end are the template's own now.
    return f"|{indicator}{chomping}{layout.comment}{layout.newline}{lines}{layout.trailing if chomping != '+' else ''}"


def replace_yaml_template(text: str, name: str, template: str) -> str:
    """Put ``template`` in place of the scalar at ``name`` and change no other byte: only the
    value's own text is written (a block scalar becomes a literal block at its indentation,
    a quoted value stays quoted, else double quotes), and the result is read back to check
    that it holds the new template and every other value as before."""
    from ruamel.yaml import YAML, YAMLError  # noqa: PLC0415 -- ruamel.yaml: the optional [fix] extra

    safe = YAML(typ="safe", pure=True)
    try:
        root = round_trip_yaml().compose(text)
        found = _yaml_node(root, name) if root is not None else None
        original = safe.load(text)
    except YAMLError as error:
        raise ContainerError(_yaml_problem(error)) from None
    except RecursionError:
        raise ContainerError("not readable as YAML: nested too deeply") from None
    if found is None:
        raise ContainerError(f"no template at {name}")
    key, value = found
    if value.anchor is not None:
        raise ContainerError(f"the template at {name} is a YAML anchor that other keys may share; nothing written")
    candidates = []
    if value.style in ("|", ">"):
        layout = _block(text, key, value)
        candidates.append(_literal_block(template, layout))
        # The block's span ends past its line break and the blank lines after it.
        candidates.append(_double_quoted(template) + layout.comment + layout.newline + layout.trailing)
    else:
        if value.style == "'" and "\n" not in template and not _BLOCK_UNSAFE.search(template):
            candidates.append("'" + template.replace("'", "''") + "'")
        elif value.style is None and "\n" not in template:
            candidates.append(template)
        candidates.append(_double_quoted(template))
    start, end = value.start_mark.index, value.end_mark.index
    for replacement in candidates:
        if replacement is None:
            continue
        updated = text[:start] + replacement + text[end:]
        try:
            written = safe.load(updated)
        except (YAMLError, RecursionError):
            continue
        if _at(written, name) == template and _without(written, name) == _without(original, name):
            return updated
    raise ContainerError(f"cannot write the template at {name} back without changing more of this YAML file; nothing written")


def _at(document, name: str):
    for part in name.split("."):
        if isinstance(document, list):
            document = document[int(part)] if part.isdigit() and int(part) < len(document) else None
        elif isinstance(document, dict):
            document = document.get(part)
        else:
            return None
    return document


def _without(document, name: str):
    """A copy of ``document`` with the value at ``name`` blanked, to compare the rest."""
    document = copy.deepcopy(document)
    *parents, last = name.split(".")
    holder = _at(document, ".".join(parents)) if parents else document
    if isinstance(holder, dict) and last in holder:
        holder[last] = None
    return document


def read_container(path: Path, text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Templates in a Python or YAML file, and why any it holds was passed over."""
    if path.suffix == ".py":
        return python_templates(text)
    return yaml_templates(text), []


def replace_in_container(text: str, name: str | None, template: str, container: str) -> str:
    if container == "json":
        return replace_json_template(text, name, template)
    if container in ("python", "yaml"):
        if name is None:  # read_container names every template of these files
            raise ContainerError(f"no unnamed template in a {container} file")
        if container == "python":
            return replace_python_template(text, name, template)
        return replace_yaml_template(text, name, template)
    return template
