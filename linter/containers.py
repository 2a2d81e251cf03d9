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
import difflib
import json
import re
from dataclasses import dataclass
from json.decoder import WHITESPACE, scanstring
from pathlib import Path

TEMPLATE_KEYS = ("chat_template", "chat_template_jinja")
_DECODER = json.JSONDecoder()


class ContainerError(Exception):
    pass


# -- JSON --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    start: int
    end: int


def _skip(text: str, index: int) -> int:
    return WHITESPACE.match(text, index).end()


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
        key, key_end = scanstring(text, index + 1)
        key_span = Span(index, key_end)
        index = _skip(text, key_end)
        if text[index : index + 1] != ":":
            raise ContainerError(f"expected ':' at offset {index}")
        value_start = _skip(text, index + 1)
        try:
            _, value_end = _DECODER.raw_decode(text, value_start)
        except json.JSONDecodeError as error:
            raise ContainerError(str(error)) from None
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


def json_template_line(text: str, name: str | None) -> int:
    """1-based line of the template's key (or its list entry) in the JSON file."""
    try:
        span = json_template_span(text, name)
    except ContainerError:
        return 1
    if name is None:
        spans, _ = object_spans(text)
        return text.count("\n", 0, spans["chat_template"][0].start) + 1
    return text.count("\n", 0, span.start) + 1


def replace_json_template(text: str, name: str | None, template: str) -> str:
    span = json_template_span(text, name)
    original = text[span.start : span.end]
    # Keep the file's escaping: \\uXXXX for non-ASCII only if that is how it was written.
    ascii_only = not any(ord(char) > 127 for char in original) and any(ord(char) > 127 for char in json.loads(original))
    encoded = json.dumps(template, ensure_ascii=ascii_only)
    return text[: span.start] + encoded + text[span.end :]


# -- Python ------------------------------------------------------------------------------


def _target_name(node) -> str | None:
    import libcst as cst

    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            return index.value.evaluated_value
    return None


def _python_literals(module):
    """(name, line, SimpleString node) of every string literal assigned to chat_template."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    found = []

    def record(name: str | None, value) -> None:
        if name in TEMPLATE_KEYS and isinstance(value, cst.SimpleString) and "f" not in value.prefix.lower():
            found.append((name, positions[value].start.line, value))

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
                record(node.key.evaluated_value, node.value)

    wrapper.module.visit(Finder())
    return wrapper.module, found


def python_templates(text: str) -> list[tuple[str, str]]:
    """(name, template) pairs; a name is the assigned key and its line: ``chat_template@12``."""
    import libcst as cst

    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as error:
        raise ContainerError(f"not valid Python: {error.message} (line {error.raw_line})") from None
    _, found = _python_literals(module)
    return [(f"{name}@{line}", literal.evaluated_value) for name, line, literal in found]


def _python_literal(original: str, template: str) -> str:
    """A literal for ``template`` in the original literal's prefix and quotes, where it can be."""
    match = re.match(r"(?i)([rbu]*)('''|\"\"\"|'|\")", original)
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
    if ast.literal_eval(candidate) != template:
        candidate = repr(template)
    return candidate


def replace_python_template(text: str, name: str, template: str) -> str:
    import libcst as cst

    module = cst.parse_module(text)
    module, found = _python_literals(module)
    targets = {id(literal) for key, line, literal in found if f"{key}@{line}" == name}
    if not targets:
        raise ContainerError(f"no chat template literal {name}")

    class Replace(cst.CSTTransformer):
        def leave_SimpleString(self, original_node, updated_node):
            if id(original_node) in targets:
                return updated_node.with_changes(value=_python_literal(original_node.value, template))
            return updated_node

    return module.visit(Replace()).code


# -- YAML --------------------------------------------------------------------------------


def _yaml():
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 1 << 20  # never fold long lines the file did not fold
    return yaml


def _yaml_places(node, path=()):
    """(path, mapping, key) of every template key at any depth."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(node, CommentedMap):
        for key, value in node.items():
            if key in TEMPLATE_KEYS and isinstance(value, str):
                yield path + (str(key),), node, key
            else:
                yield from _yaml_places(value, path + (str(key),))
    elif isinstance(node, CommentedSeq):
        for index, value in enumerate(node):
            yield from _yaml_places(value, path + (str(index),))


def yaml_templates(text: str) -> list[tuple[str, str]]:
    from ruamel.yaml import YAMLError

    try:
        document = _yaml().load(text)
    except YAMLError as error:
        raise ContainerError(f"not valid YAML: {str(error).splitlines()[0]}") from None
    return [(".".join(path), str(mapping[key])) for path, mapping, key in _yaml_places(document)]


def replace_yaml_template(text: str, name: str, template: str) -> str:
    import io

    from ruamel.yaml.scalarstring import FoldedScalarString, LiteralScalarString
    from ruamel.yaml.util import load_yaml_guess_indent

    yaml = _yaml()
    _, sequence_indent, sequence_offset = load_yaml_guess_indent(text)
    key_indents = [len(match.group(1)) for match in re.finditer(r"(?m)^( +)[^\s#-][^:\n]*:", text)]
    mapping_indent = min(key_indents, default=2)
    # Write mappings and sequences indented as the file has them.
    yaml.indent(
        mapping=mapping_indent,
        sequence=sequence_indent or mapping_indent + (sequence_offset or 0),
        offset=sequence_offset or 0,
    )
    document = yaml.load(text)
    for path, mapping, key in _yaml_places(document):
        if ".".join(path) == name:
            old = mapping[key]
            style = type(old) if isinstance(old, (LiteralScalarString, FoldedScalarString)) else None
            mapping[key] = style(template) if style else type(old)(template) if type(old) is not str else template
            break
    else:
        raise ContainerError(f"no template at {name}")
    out = io.StringIO()
    yaml.dump(document, out)
    updated = out.getvalue()
    # Round-tripping can restyle parts of a file it did not need to touch; refuse rather
    # than rewrite more than the template.
    changes = [
        op for op in difflib.SequenceMatcher(None, text.splitlines(), updated.splitlines()).get_opcodes() if op[0] != "equal"
    ]
    if len(changes) > 1:
        raise ContainerError("rewriting the template would reformat other parts of this YAML file; nothing written")
    return updated


def read_container(path: Path, text: str) -> list[tuple[str | None, str]]:
    """Templates in a Python or YAML file."""
    if path.suffix == ".py":
        return python_templates(text)
    return yaml_templates(text)


def replace_in_container(path: Path, text: str, name: str | None, template: str, container: str) -> str:
    if container == "json":
        return replace_json_template(text, name, template)
    if container == "python":
        return replace_python_template(text, name, template)
    if container == "yaml":
        return replace_yaml_template(text, name, template)
    return template


def file_line(path: Path, container: str, name: str | None, template_line: int) -> int:
    """The line in the file on disk for a template line (for a template inside JSON, the
    line of its ``chat_template`` key or list entry)."""
    if container == "jinja":
        return template_line
    if container == "gguf":
        return 1  # a binary file: its lines mean nothing (and it may be tens of GB)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return template_line
    if container == "json":
        return json_template_line(text, name)
    if container == "python" and name and "@" in name:
        return python_template_line(text, name, template_line)
    if container == "yaml" and name:
        return yaml_template_line(text, name, template_line)
    return template_line


def python_template_line(text: str, name: str, template_line: int) -> int:
    r"""Where the template's line starts in the file: a newline in the literal's source moves
    both, an escaped ``\n`` only the template, a backslash line continuation only the file."""
    import libcst as cst

    try:
        _, found = _python_literals(cst.parse_module(text))
    except cst.ParserSyntaxError:
        return template_line
    start = int(name.rsplit("@", 1)[1])
    literal = next((node for key, line, node in found if f"{key}@{line}" == name), None)
    if literal is None:
        return start
    prefix, quote = re.match(r"(?i)([rbu]*)('''|\"\"\"|'|\")", literal.value).groups()
    body = literal.value[len(prefix) + len(quote) : -len(quote)]
    raw = "r" in prefix.lower()
    value_line, file_line, index = 1, start, 0
    while value_line < template_line and index < len(body):
        char = body[index]
        if char == "\\" and not raw and index + 1 < len(body):
            escaped = body[index + 1]
            value_line += escaped == "n"
            file_line += escaped == "\n"
            index += 2
            continue
        if char == "\n":
            value_line += 1
            file_line += 1
        index += 1
    return file_line


def yaml_template_line(text: str, name: str, template_line: int) -> int:
    """A literal block (``|``) holds the template line for line below its key; any other
    scalar is reported at its key's line."""
    from ruamel.yaml import YAMLError
    from ruamel.yaml.scalarstring import LiteralScalarString

    try:
        document = _yaml().load(text)
    except YAMLError:
        return template_line
    for path, mapping, key in _yaml_places(document):
        if ".".join(path) == name:
            key_line = mapping.lc.key(key)[0] + 1
            return key_line + template_line if isinstance(mapping[key], LiteralScalarString) else key_line
    return template_line
