r"""## What it does
Finds tool-call arguments that pass through `tojson`: `tool_call.arguments|tojson`, or a
whole tool call or `function` object serialised with its arguments inside. transformers'
`tojson` is `json.dumps` with its default separators `", "` and `": "`. Without an
`is string` pass-through the finding is a warning; with one it is informational.

## Why is this bad?
The model generated compact JSON such as `{"city":"Boston"}`. A framework that parsed it
into a mapping and sends it back replays `{"city": "Boston"}`: two more spaces, different
tokens, and the prompt of the next turn stops matching the previous prompt plus the reply
at that tool call. vLLM parses every argument string into a mapping before rendering, so
under vLLM the `is string` pass-through never fires and the re-serialisation always happens.

## Example
```jinja
{{- '{"name": "' + tool_call.name + '", "arguments": ' + tool_call.arguments | tojson + '}' }}
```

## Use instead
```jinja
{%- if tool_call.arguments is string %}
    {{- tool_call.arguments }}
{%- else %}
    {{- tool_call.arguments | tojson }}
{%- endif %}
```

The proof replays the compact JSON the model wrote (`{"city":"Paris"}`) as the client
sends it back (the string; the parsed mapping where the template takes no string) and
compares it with how the next call renders that tool call. Arguments it shows re-serialised
where the analysis saw no `tojson` (a serialisation the template writes itself) are reported
here too, where the template first reads `arguments`.

## Fix safety
The fix adds the `is string` pass-through. Frameworks that keep the model's raw argument
string then replay it byte for byte; mappings render as before.
"""

from __future__ import annotations

import os

from jinja2 import nodes

from tmpl_lint.analysis import Facts, LabelKind, Site
from tmpl_lint.edits import Edit, Fix, filter_span
from tmpl_lint.findings import Finding, RuleInfo
from tmpl_lint.proofs import Cause, Divergence

RULE = RuleInfo(
    "PC004",
    "tool-args-reserialized",
    "warning",
    "tool-call arguments are re-serialised with tojson",
    proven_by=frozenset({Cause.TOOL_ARGUMENTS}),
    fix_removes_proof=False,
)


def check(facts: Facts) -> list[Finding]:
    findings: dict[tuple[int, int], Finding] = {}
    for use in facts.json_uses:
        kinds = {label.kind for label in use.labels}
        if not kinds & {LabelKind.TOOL_ARGS, LabelKind.TOOL_CALL}:
            continue
        guarded = any(label.kind is LabelKind.STRING_GUARD for control in use.controls for label in control.labels)
        site = facts.site(use.node, "tojson")
        what = "tool-call arguments" if LabelKind.TOOL_ARGS in kinds else "a tool call (with its arguments)"
        if guarded:
            message = (
                f"{what} pass through `tojson` when they are not a string: a mapping replays with "
                '", " and ": " separators (vLLM always passes a mapping)'
            )
            severity = "info"
        else:
            message = (
                f'{what} pass through `tojson`, which re-serialises them with ", " and ": " separators: '
                "the replay differs from the JSON the model generated"
            )
            severity = None
        key = (site.line, site.column)
        previous = findings.get(key)
        # The same filter seen through several macro calls: unguarded anywhere wins.
        if previous is None or (previous.severity == "info" and severity is None):
            findings[key] = RULE.at(site, message, use.labels, severity=severity)
    return list(findings.values())


def fix(facts: Facts, finding: Finding, options) -> Fix:
    """Wrap ``args | tojson`` as ``(args if args is string else args | tojson)``."""
    if finding.severity == "info":
        return Fix.refuse("already passes strings through")
    use = next((use for use in facts.json_uses if use.node is finding.site.node), None)
    if use is None or not any(label.kind is LabelKind.TOOL_ARGS for label in use.labels):
        return Fix.refuse("the whole tool call is serialised, so its arguments have no string pass-through")
    spans = filter_span(facts.source_map, use.node)
    if spans is None:
        return Fix.refuse("cannot locate the tojson call in the source")
    (start, end), (_, filter_end) = spans
    argument = facts.text[start:end]
    serialised = facts.text[start:filter_end]
    style = getattr(options, "tool_args_style", None)
    if style == "compact":
        # vLLM parses every argument string into a mapping, so the pass-through never
        # fires there: write mappings the way the model wrote them.
        serialised = f'{argument} | tojson(separators=(",", ":"))'
        title = 'arguments render as compact JSON ({"city":"Paris"}), as the model generates them; strings pass through'
    else:
        title = "arguments given as a string (the model's own JSON) render byte for byte; mappings render as before"
    replacement = f"({argument} if {argument} is string else {serialised})"
    return Fix(title, [[Edit(start, filter_end, replacement)]])


def found_by_proof(facts: Facts | None, divergence: Divergence) -> Finding:
    """Arguments the replay shows re-serialised where no `tojson` the analysis follows does
    it (a guard the analysis does not read, a serialisation of its own): reported where the
    template first reads `arguments`."""
    common = len(os.path.commonprefix([divergence.before, divergence.after]))
    written, printed = _object_at(divergence.before, common), _object_at(divergence.after, common)
    message = (
        f"tool-call arguments replay as {printed!r} where the model wrote {written!r}: found by the proof, the "
        "template re-serialises them (vLLM passes them as a mapping)"
    )
    return RULE.at(_first_arguments_read(facts), message)


def _object_at(text: str, offset: int) -> str:
    """The JSON object around ``offset`` in a proof's snippet (the arguments), as printed."""
    start = text.rfind("{", 0, offset + 1)
    end = text.find("}", offset)
    return text[start : end + 1] if start >= 0 and end >= 0 else text[offset : offset + 24]


def _first_arguments_read(facts: Facts | None) -> Site:
    if facts is None or facts.tree is None:
        return Site(1, "", fixed_column=1)
    reads = [
        node
        for node in facts.tree.find_all((nodes.Getattr, nodes.Getitem))
        if getattr(node, "attr", None) == "arguments"
        or (isinstance(getattr(node, "arg", None), nodes.Const) and node.arg.value == "arguments")
    ]
    if not reads:
        return Site(1, "", fixed_column=1)
    first = min(reads, key=lambda node: node.lineno)
    return facts.site(first, "arguments")


# The arguments as a model writes them: a string the client sends back as it came.
COMPACT_ARGUMENTS = '{"city":"Paris"}'


def verify_fix(verifier, patched: str) -> str | None:
    """The fixed template replays a compact argument string byte for byte (the proof's
    tool-arguments divergence may have other causes the fix leaves alone)."""
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "Ab3dE6gH9", "type": "function", "function": {"name": "get_weather", "arguments": COMPACT_ARGUMENTS}}
            ],
        },
        {"role": "tool", "tool_call_id": "Ab3dE6gH9", "name": "get_weather", "content": "sunny"},
    ]
    rendered = verifier.render(patched, messages)
    if rendered is None or COMPACT_ARGUMENTS not in rendered:
        return "arguments given as a string are still re-serialised"
    return None
