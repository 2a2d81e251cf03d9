"""Reusing one analysis in another: the states between top-level statements, and what each
statement reads, so that a switch trial analyses only the statements its assumption
changes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from jinja2 import nodes

from .facts import Facts, Label
from .values import NamespaceRef, Value, same_namespaces, same_value, same_values, without_label

if TYPE_CHECKING:
    from .interpreter import Interpreter


@dataclass
class _State:
    """The interpreter's state before a top-level statement (at the top level no control,
    loop, capture or macro call is active)."""

    variables: dict[str, Value]
    namespaces: dict[tuple[int, str], Value]
    macro_cache: dict[tuple, Value]
    sinks: int
    json_uses: int


class Trace:
    """The states of one analysis between the template's top-level statements.

    An analysis that assumes a value for one variable differs from another only where
    what a statement reads differs: a statement that reads the same values (apart from
    the assumed variable's own ``variable`` label, which no step of the analysis looks at:
    it only names switch candidates) does the same thing, so its effect is taken from the
    other analysis' trace instead of analysed again. The facts taken over keep that label,
    which no rule's finding position depends on; the trial's ``variables`` are not kept.
    """

    def __init__(self, facts: Facts):
        self.facts = facts
        self.states: list[_State] = []

    def record(self, interpreter: Interpreter) -> None:
        self.states.append(
            _State(
                dict(interpreter.scope.vars),
                dict(interpreter.namespaces),
                dict(interpreter.macro_cache),
                len(self.facts.sinks),
                len(self.facts.json_uses),
            )
        )

    def usable_for(self, own: Label) -> bool:
        """Whether an analysis without the label ``own`` may take statements over: the
        trace is complete, and no two calls it cached differ only by that label (the
        macro call cache is keyed by the arguments' labels)."""
        tree = self.facts.tree
        assert tree is not None, "a trace is recorded only for a parsed template"
        if len(self.states) != len(tree.body) + 1:
            return False
        keys = self.states[-1].macro_cache
        return len({_key_without(key, own) for key in keys}) == len(keys)

    def matches(self, interpreter: Interpreter, index: int, reads: _Reads, own: Label) -> bool:
        """Whether top-level statement ``index`` reads in ``interpreter`` what it read in
        this trace's analysis, up to the label ``own``."""
        before = self.states[index]
        here = interpreter.scope.vars
        namespaces = set(reads.created_namespaces)
        for name in reads.names:
            theirs, mine = before.variables.get(name), here.get(name)
            if theirs is None or mine is None:
                if theirs is not mine or name == own.name:
                    return False  # set in one analysis only, or read as the assumption
            elif not same_value(theirs, mine, own):
                return False
            elif isinstance(mine.const, NamespaceRef):
                namespaces.add(mine.const.key)
        if namespaces and not same_namespaces(before.namespaces, interpreter.namespaces, namespaces, own):
            return False
        if reads.macros is not None and not reads.macros:
            return True
        their_calls = {
            _key_without(key, own): value
            for key, value in before.macro_cache.items()
            if reads.macros is None or key[0] in reads.macros
        }
        my_calls = {
            key: value for key, value in interpreter.macro_cache.items() if reads.macros is None or key[0] in reads.macros
        }
        return same_values(their_calls, my_calls, own)

    def replay(self, interpreter: Interpreter, index: int, own: Label) -> None:
        """Do in ``interpreter`` what top-level statement ``index`` did in this trace."""
        before, after = self.states[index], self.states[index + 1]
        for name, value in after.variables.items():
            if before.variables.get(name) is not value:
                interpreter.scope.vars[name] = without_label(value, own)
        for key, value in after.namespaces.items():
            if before.namespaces.get(key) is not value:
                interpreter.namespaces[key] = without_label(value, own)
        for key, value in after.macro_cache.items():
            if before.macro_cache.get(key) is not value:
                interpreter.macro_cache[_key_without(key, own)] = without_label(value, own)
        interpreter.facts.sinks.extend(self.facts.sinks[before.sinks : after.sinks])
        interpreter.facts.json_uses.extend(self.facts.json_uses[before.json_uses : after.json_uses])


def _key_without(key: tuple, own: Label) -> tuple:
    """A macro call cache key without the label ``own`` in its arguments' labels."""
    macro, positional, keywords = key
    if not any(own in labels for labels in positional) and not any(own in labels for _, labels in keywords):
        return key
    return (macro, tuple(labels - {own} for labels in positional), tuple((name, labels - {own}) for name, labels in keywords))


@dataclass(frozen=True)
class _Reads:
    """What one top-level statement may read of the state the analysis carries between
    statements: scope names (read or written: a branch merges with what was there), the
    macros it may run (None: any), whose cached calls it may reuse and whose bodies read
    the top-level scope, and the namespaces it creates (a macro's namespace keeps the
    entries of its earlier calls)."""

    names: frozenset[str]
    macros: frozenset[int] | None
    created_namespaces: frozenset[int]


def top_level_scan(facts: Facts) -> tuple[list[_Reads], list[nodes.Compare]]:
    """The reads of each top-level statement, and every comparison in the template in
    document order (the constants a switch is compared with are values worth trying):
    one walk, shared by the switch trials."""
    tree = facts.tree
    assert tree is not None, "scanned only once parsed"
    return facts.source_map.memo("top_level_scan", lambda: _scan_top_level(tree, *facts.walk()))


def _scan_top_level(tree: nodes.Template, every: list[nodes.Node], ends: list[int]) -> tuple[list[_Reads], list[nodes.Compare]]:
    """The reads of each top-level statement, found in its syntax (and that of the macros
    it may call): a superset of what any analysis of it reads. ``every`` and ``ends``:
    the tree's nodes in order, and where each subtree ends (``Facts.walk``)."""
    compares: list[nodes.Compare] = []
    macros: dict[str, list[nodes.Macro]] = {}
    assigned: set[str] = set()  # a name also assigned may hold any macro when called
    scans: dict[int, tuple[set[str], set[str] | None, set[int]]] = {}

    def scan(start: int) -> tuple[set[str], set[str] | None, set[int]]:
        """Names, the names of the callees (None: a callee that may be any macro) and
        the namespace() calls under the node at ``start`` (in document order, as find_all
        walks); macro bodies are scanned on their own."""
        names: set[str] = set()
        callees: set[str] | None = set()
        created: set[int] = set()
        index, end = start, ends[start]
        while index < end:
            node = every[index]
            if isinstance(node, nodes.Macro) and index != start:
                names.add(node.name)  # defined here: its body runs only when called
                macros.setdefault(node.name, []).append(node)
                scans[id(node)] = scan(index)
                index = ends[index]
                continue
            index += 1
            if isinstance(node, (nodes.Name, nodes.NSRef)):
                names.add(node.name)
                if isinstance(node, nodes.Name) and node.ctx in ("store", "param"):
                    assigned.add(node.name)
            elif isinstance(node, nodes.Call):
                callee = node.node
                if isinstance(callee, nodes.Name):
                    if callee.name == "namespace":
                        created.add(id(node))
                    if callees is not None:
                        callees.add(callee.name)
                elif not isinstance(callee, nodes.Getattr):  # a method call never runs a macro
                    callees = None
            elif isinstance(node, nodes.Compare):
                compares.append(node)
        return names, callees, created

    starts, index = [], 0  # where each top-level statement is in ``every``
    for _ in tree.body:
        starts.append(index)
        index = ends[index]
    statements = [scan(start) for start in starts]
    for statement, scanned in zip(tree.body, statements):
        if isinstance(statement, nodes.Macro):  # a top-level macro was scanned as its statement
            macros.setdefault(statement.name, []).append(statement)
            scans[id(statement)] = scanned
    every_macro = [macro for found in macros.values() for macro in found]

    def macros_called(callees: set[str] | None) -> list[nodes.Macro] | None:
        if callees is None or callees & assigned:
            return None
        return [macro for name in callees if name in macros for macro in macros[name]]

    reads = []
    for statement, (names, callees, created) in zip(tree.body, statements):
        if isinstance(statement, nodes.Macro):
            reads.append(_Reads(frozenset(), frozenset(), frozenset()))  # binds its name, reads nothing
            continue
        names, created = set(names), set(created)
        pending = macros_called(callees)
        run_any = pending is None
        pending = every_macro if pending is None else pending
        run: set[int] = set()
        while pending:
            macro = pending.pop()
            if id(macro) in run:
                continue
            run.add(id(macro))
            body_names, body_callees, body_created = scans[id(macro)]
            names |= body_names
            created |= body_created
            called = macros_called(body_callees)
            if called is None:
                run_any = True
                called = every_macro
            pending = pending + called
        reads.append(_Reads(frozenset(names), None if run_any else frozenset(run), frozenset(created)))
    return reads, compares
