r"""## What it does
Finds tool-call arguments that pass through `tojson`: `tool_call.arguments|tojson`, or a
whole tool call or `function` object serialised with its arguments inside. transformers'
`tojson` is `json.dumps` with its default separators `", "` and `": "`. Behind an
`is string` pass-through too: vLLM passes every argument string as a mapping, so the
pass-through never fires there, and the proof decides (with `--engine hf`, which passes the
string, it does not reproduce it).

## Why is this bad?
The model generated compact JSON such as `{"city":"Boston"}`. A framework that parsed it
into a mapping and sends it back replays `{"city": "Boston"}`: two more spaces, different
tokens, and the prompt of the next turn stops matching the previous prompt plus the reply
at that tool call. vLLM parses every argument string into a mapping before rendering, so
under vLLM the `is string` pass-through never fires and the re-serialisation always happens.

## Example
```jinja
{%- for message in messages %}
    {{- message.content or "" }}
    {%- for tool_call in message.tool_calls or [] %}
        {%- set tool_call = tool_call.function %}
        {{- '{"name": "' + tool_call.name + '", "arguments": ' + tool_call.arguments | tojson + '}' }}
    {%- endfor %}
{%- endfor %}
```

## Use instead
```jinja
{%- for message in messages %}
    {{- message.content or "" }}
    {%- for tool_call in message.tool_calls or [] %}
        {%- set tool_call = tool_call.function %}
        {%- if tool_call.arguments is string %}
            {%- set arguments = tool_call.arguments %}
        {%- else %}
            {%- set arguments = tool_call.arguments | tojson(separators=(",", ":")) %}
        {%- endif %}
        {{- '{"name": "' + tool_call.name + '", "arguments": ' + arguments + '}' }}
    {%- endfor %}
{%- endfor %}
```

The proof replays the compact JSON the model wrote (`{"city":"Paris"}`) as the client
sends it back (the string; the parsed mapping where the template takes no string) and
compares it with how the next call renders that tool call. Arguments it shows re-serialised
where the analysis saw no `tojson` (a serialisation the template writes itself, or the
mapping printed as it is, `{{ arguments }}`: Python's `{'city': 'Paris'}` under vLLM) are
reported here too, where the template first reads `arguments`.

## Fix safety
This fix is unsafe: `--fix` applies it only with `--unsafe-fixes` (or `unsafe-fixes = true`), because mappings are then written with the separators of `--tool-args-style`, which the model sees.
The fix adds the `is string` pass-through where there is none, so a client that keeps the
model's raw argument string replays it byte for byte, and names the separators mappings
are written with (vLLM always passes a mapping): `--tool-args-style compact` (the default,
`{"city":"Paris"}`, what the proof assumes the model wrote) or `spaced` (`{"city": "Paris"}`,
for a model that writes `", "` and `": "`); separators the template names that are not the
model's are replaced. It changes what the model sees for mappings when the style is
compact: choose the style the model generates (and check with the same style).

## Options
`--tool-args-style compact|spaced` (or `tool-args-style = "spaced"` in the configuration,
which the pre-commit hooks read) says how the model writes arguments: `compact`
(`{"city":"Paris"}`) or `spaced` (`{"city": "Paris"}`, as `tojson` writes them by
default). The check and its proof take it as what the model wrote, and `--fix` writes
mappings that way. So for a model that writes spaced JSON a plain `tojson` passes (a
mapping replays as written), and `--fix` has nothing to rewrite.

Without the option, a template that names the separators (`tojson(separators=(",", ":"))`,
or `(", ", ": ")`) states how its model writes arguments and is taken at its word: no
finding, and the proof replays arguments written with those separators. A plain `tojson`
states nothing (its separators are the filter's default, not a choice), so the model is
taken to write compact JSON, the option's default: `tojson` and `tojson(separators=(", ", ": "))` render the same text, and only the
second passes without the option, because only it says how its model writes. One setting
covers every template of a run (a repository may hold several models), so a template's own
word stands for its model unless the run says otherwise; with the option given, it is the
model's way for every template, and a template that names other separators is reported
(`which writes them with "," and ":" separators: the replay differs from the spaced JSON
the model generated`), and its fix replaces them.

Whatever the separators, a string passed to `tojson` (transformers and `--engine hf` pass
the client's string on; vLLM never does) is JSON-encoded a second time, `"{\"city\":...}"`;
where the proof shows that, the message says so instead of naming separators. Where the
proof's scenario recomputes no token (its arguments end in the reply's last partial block,
which no cache holds whole), the proof's note says why the figure is 0 there and what it
costs where the arguments end earlier.
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass, replace
from typing import ClassVar

from jinja2 import nodes

from tmpl_lint.analysis.facts import Facts, LabelKind, Site
from tmpl_lint.analysis.separators import TOJSON_SEPARATORS, TOOL_ARGS_STYLES, model_separators
from tmpl_lint.edits import Edit, Fix, filter_span
from tmpl_lint.findings import Finding, FixSafety, Message
from tmpl_lint.proofs import Cause, Divergence, Proof
from tmpl_lint.scenarios import ScenarioKind

from ._contract import RuleInfo, Severity

RULE = RuleInfo(
    "PC004",
    "tool-args-reserialized",
    Severity.WARNING,
    "tool-call arguments are re-serialised with tojson",
    proven_by=frozenset({Cause.TOOL_ARGUMENTS}),
    fix_removes_proof=False,
    fix_safety=FixSafety.UNSAFE,
)


# How a model writes tool-call arguments, by --tool-args-style: the separators a fix names.
SEPARATORS = TOOL_ARGS_STYLES
# What the message says to do: the fixable count says whether --fix can (the message
# promises no fix the rule may decline: a whole tool call serialised at once).
REMEDY = 'say how the model writes them with --tool-args-style (compact, the default, or spaced for ", " and ": ")'


@dataclass(frozen=True)
class _SeparatorsMessage(Message):
    what: str  # "tool-call arguments", or a whole tool call
    written: tuple[str, str]  # the separators the `tojson` writes
    model: tuple[str, str]  # the separators the model writes
    remedy: ClassVar[str] = REMEDY

    @property
    def written_as(self) -> str:
        return _pair(self.written)

    @property
    def model_json(self) -> str:
        return _json_of(self.model)


@dataclass(frozen=True)
class GuardedReserialised(_SeparatorsMessage):
    text = (
        "{what} pass through `tojson` when they are not a string: a mapping (vLLM always passes one) replays "
        "with {written_as} separators, not as a model writing {model_json} wrote it; {remedy}"
    )


@dataclass(frozen=True)
class Reserialised(_SeparatorsMessage):
    text = (
        "{what} pass through `tojson`, which {verb} them with {written_as} separators: "
        "the replay differs from the {model_json} the model generated; {remedy}"
    )
    verb: str = "re-serialises"  # "writes" where the `tojson` names its separators
    # What the proof shows where it is not separators (``describe``): an argument string
    # JSON-encoded a second time, as the replay prints it, and the object the model wrote.
    encoded_twice: tuple[str, str | None] | None = None

    def __str__(self) -> str:
        if self.encoded_twice is None:
            return super().__str__()
        encoded, written = self.encoded_twice
        return (
            f"{self.what} pass through `tojson`, which JSON-encodes an argument string a second time: the replay shows "
            f"{encoded} where the model wrote {written}; {self.remedy}"
        )


@dataclass(frozen=True)
class ReplayedAs(Message):
    text = (
        "tool-call arguments replay as {printed!r} where the model wrote {written!r}: found by the proof, the "
        "template re-serialises them (vLLM passes them as a mapping)"
    )
    printed: str | None
    written: str | None


def check(facts: Facts) -> list[Finding]:
    findings: dict[tuple[int, int], Finding] = {}
    model = model_separators(facts)
    for use in facts.json_uses:
        kinds = {label.kind for label in use.labels}
        if not kinds & {LabelKind.TOOL_ARGS, LabelKind.TOOL_CALL}:
            continue
        written = _written_with(use)
        if written is None or written == model:
            # Written as the model writes them (`tojson` names no separators and the model
            # writes spaced JSON, or the template names the model's), or in a layout of the
            # template's own (indent): taken at its word. A string passed through `tojson`
            # is JSON-encoded again all the same, which the proof finds on its own.
            continue
        site = facts.site(use.node, "tojson")
        what = "tool-call arguments" if LabelKind.TOOL_ARGS in kinds else "a tool call (with its arguments)"
        message: Message
        if _guarded(use):
            message = GuardedReserialised(what, written, model)
        else:
            message = Reserialised(what, written, model, "re-serialises" if use.separators is None else "writes")
        key = (site.line, site.column)
        previous = findings.get(key)
        # The same filter seen through several macro calls: unguarded anywhere says so.
        if previous is None or not _guarded(use):
            findings[key] = RULE.at(site, message, use.labels)
    return list(findings.values())


def _written_with(use) -> tuple[str, str] | None:
    """The separators a `tojson` writes a mapping with: those it names, else `tojson`'s own
    (`", "` and `": "`); None for a layout of its own (indent, or separators the analysis
    cannot read)."""
    if use.separators is not None:
        return use.separators
    return None if use.names_layout else TOJSON_SEPARATORS


def _pair(separators: tuple[str, str]) -> str:
    return " and ".join(json.dumps(part) for part in separators)


def _json_of(separators: tuple[str, str]) -> str:
    """The model's JSON in words: "compact JSON", "spaced JSON"."""
    named = next((style for style, pair in SEPARATORS.items() if pair == separators), None)
    return f"{named} JSON" if named else f"JSON with {_pair(separators)} separators"


def _guarded(use) -> bool:
    """Behind an `is string` pass-through: a string replays byte for byte, a mapping does not."""
    return any(label.kind is LabelKind.STRING_GUARD for control in use.controls for label in control.labels)


# `separators=(",", ":")` as a tojson call names it: a tuple or a list of two string literals.
_STRING = r"""(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')"""
NAMED_SEPARATORS = re.compile(rf"separators\s*=\s*[\(\[]\s*{_STRING}\s*,\s*{_STRING}\s*,?\s*[\)\]]")


def fix(facts: Facts, finding: Finding, options) -> Fix:
    """``args | tojson`` becomes ``(args if args is string else args | tojson(separators=...))``,
    the separators the model writes; behind an existing pass-through, only the separators."""
    site = finding.site
    if site is None:  # every PC004 finding the analysis makes is placed
        return Fix.refuse("cannot locate the serialised arguments in the source")
    use = next((use for use in facts.json_uses if use.node is site.node), None)
    if use is None or not any(label.kind is LabelKind.TOOL_ARGS for label in use.labels):
        return Fix.refuse(
            "the whole tool call is serialised (its name with its arguments), so the arguments cannot be written on their own: "
            "write them apart, as the rule's page shows, or pass --tool-args-style spaced if the model writes spaced JSON"
        )
    spans = filter_span(facts.source_map, use.node)
    if spans is None:
        return Fix.refuse("cannot locate the tojson call in the source")
    (start, end), (pipe, filter_end) = spans
    argument = facts.text[start:end]
    call = facts.text[pipe:filter_end].rstrip()
    model = model_separators(facts)  # --tool-args-style, else the template's word, else compact
    separators = "separators=({}, {})".format(*(json.dumps(part) for part in model))
    if use.separators is not None:  # it names other separators than the model's: those are replaced
        named = list(NAMED_SEPARATORS.finditer(call))
        if len(named) != 1:
            return Fix.refuse("cannot locate the separators the tojson call names in the source")
        serialised = f"{argument} {call[: named[0].start()]}{separators}{call[named[0].end() :]}"
    elif not call.endswith(")"):
        serialised = f"{argument} | tojson({separators})"
    else:  # tojson(...) with arguments of its own: the separators join them
        joiner = "" if call.replace(" ", "").endswith("()") else ", "
        serialised = f"{argument} {call[:-1].rstrip()}{joiner}{separators})"
    shown = json.dumps({"city": "Paris"}, separators=model)
    if _guarded(use):  # behind an `is string` pass-through already
        title = f"a mapping of tool-call arguments (vLLM always passes one) renders as the model writes it: {shown}"
        return Fix(title, [[Edit(start, filter_end, serialised)]])
    title = f"tool-call arguments render as the model writes them: a string byte for byte, a mapping as {shown}"
    return Fix(title, [[Edit(start, filter_end, f"({argument} if {argument} is string else {serialised})")]])


def found_by_proof(facts: Facts | None, divergence: Divergence) -> Finding:
    """Arguments the replay shows re-serialised where no `tojson` the analysis follows does
    it (a guard the analysis does not read, a serialisation of its own): reported where the
    template first reads `arguments`."""
    common = len(os.path.commonprefix([divergence.before, divergence.after]))
    written, printed = _object_at(divergence.before, common), _object_at(divergence.after, common)
    return RULE.at(_first_arguments_read(facts), ReplayedAs(printed, written))


def describe(message: Message, proof: Proof) -> tuple[Message, Proof]:
    """Say what the proof shows where the pattern alone could not tell: an argument string
    JSON-encoded a second time (transformers, and `--engine hf`, pass the string on), not
    separators; and why a proof that fails costs no token in its scenario."""
    divergence = proof.divergence
    if divergence is None or divergence.cause is not Cause.TOOL_ARGUMENTS:
        return message, proof
    common = len(os.path.commonprefix([divergence.before, divergence.after]))
    encoded = _string_at(divergence.after, common)
    if encoded is not None and isinstance(message, Reserialised):
        message = replace(message, encoded_twice=(encoded, _object_at(divergence.before, common)))
    unit, block, first = divergence.unit, divergence.block_size, divergence.first_divergence
    cached = divergence.prompt_tokens[0]
    start = cached // block * block  # the reply's last partial block, where the cached text ends
    if divergence.lost_tokens == 0 and first is not None and first >= start:
        why = (
            f"0 recomputed here: the replay first differs at {unit} {first}, in the last partial "
            f"block of the reply as written ({unit}s {start}-{cached - 1}), which the cache never holds (it keeps full "
            "blocks only); where the arguments end a block or more before the reply does (a longer argument, text "
            "after the call), every block from the one the difference falls in is recomputed on every turn"
        )
        note = proof.note
        proof = proof.with_note(f"{note}; {why}" if note else why)
    return message, proof


def _string_at(text: str, offset: int) -> str | None:
    """The JSON string literal that starts at ``offset``, as printed, if one does."""
    if not text.startswith('"', offset):
        return None
    try:
        _, end = json.JSONDecoder().raw_decode(text, offset)
    except ValueError:
        return None
    return text[offset:end]


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
        for node in facts.nodes_of(nodes.Getattr, nodes.Getitem)
        if getattr(node, "attr", None) == "arguments"
        or (isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == "arguments")
    ]
    if not reads:
        return Site(1, "", fixed_column=1)
    first = min(reads, key=lambda node: node.lineno)
    return facts.site(first, "arguments")


# The arguments as a model writes them: a string the client sends back as it came.
COMPACT_ARGUMENTS = '{"city":"Paris"}'


def verify_fix(verifier, patched: str) -> str | None:
    """In a conversation with tool calls the original template rendered, the fixed one
    replays an argument string byte for byte and writes a mapping with the separators of the
    style asked for (the proof's tool-arguments divergence may have other causes the fix
    leaves alone)."""
    mapping = json.loads(COMPACT_ARGUMENTS)
    # as the fix wrote them: the model's separators (the original's lint says how it writes them)
    written = json.dumps(mapping, separators=model_separators(verifier.lint(verifier.source.text).facts))
    conversations = [
        scenario
        for scenario in verifier.rendered_scenarios()
        if scenario.kind is ScenarioKind.AGENT and any(message.get("tool_calls") for message in scenario.calls[-1].messages)
    ]

    def render(text: str, scenario, arguments) -> str | None:
        messages = copy.deepcopy(scenario.calls[-1].messages)
        for message in messages:
            for call in message.get("tool_calls") or ():
                call["function"]["arguments"] = copy.deepcopy(arguments)
        return verifier.render(text, messages, scenario.tools, scenario.kwargs)

    # Where the original prints the arguments at all (some templates show tool calls only
    # with fields of their own).
    printing = [
        scenario
        for scenario in conversations
        if '"Paris"' in (render(verifier.source.text, scenario, COMPACT_ARGUMENTS) or "")
        or '"Paris"' in (render(verifier.source.text, scenario, mapping) or "")
    ]
    if not printing:
        return "no conversation the template renders prints tool-call arguments, so the fix cannot be checked"
    scenario = printing[0]
    for arguments, expected in ((COMPACT_ARGUMENTS, COMPACT_ARGUMENTS), (mapping, written)):
        rendered = render(patched, scenario, arguments)
        if rendered is None:
            return f'the fixed template no longer renders "{scenario.name}"'
        if expected not in rendered:
            if isinstance(arguments, str):
                return "arguments given as a string are still re-serialised"
            return f"a mapping of arguments is not written as {written}"
    return None
