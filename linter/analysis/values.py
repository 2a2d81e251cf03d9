"""The value model of the analysis: what an expression evaluates to (its labels and, where
known, a constant), and the structures values take (records, macros, globals, namespaces,
loops)."""

from __future__ import annotations

from dataclasses import dataclass, field

from jinja2 import nodes

from .facts import STRUCTURAL, Label, LabelKind
from .locations import SourceMap, child_nodes, descendants


class _Sentinel:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


UNKNOWN = _Sentinel("UNKNOWN")
# A template variable the caller did not pass: ``is defined`` is false, ``default()`` applies.
UNDEFINED = _Sentinel("UNDEFINED")


@dataclass(frozen=True)
class Value:
    labels: frozenset[Label] = frozenset()
    const: object = UNKNOWN

    @property
    def known(self) -> bool:
        return self.const is not UNKNOWN

    def data(self) -> frozenset[Label]:
        """Labels that describe dependence, not structure."""
        cached = self.__dict__.get("_data")
        if cached is None:
            if any(label.kind in STRUCTURAL for label in self.labels):
                cached = frozenset(label for label in self.labels if label.kind not in STRUCTURAL)
            else:
                cached = self.labels  # the same set: no need to hash every label again
            self.__dict__["_data"] = cached  # frozen, and data() is asked again and again
        return cached

    def has(self, kind: LabelKind) -> bool:
        kinds = self.__dict__.get("_kinds")
        if kinds is None:
            kinds = self.__dict__["_kinds"] = frozenset(label.kind for label in self.labels)
        return kind in kinds


NOTHING = Value()


class Record(dict):
    """A dict literal with constant string keys, each key to what the analysis knows of its
    value: reading a key back (``{'content': call}['content']``, or in a macro the dict was
    passed to) gives that value, where a union of them lost what it is (a tool call).

    A dict, so that its truth, length, ``in`` and ``is mapping`` fold as the literal's do;
    hashed by identity, as a Value holding it may be (a frozen dataclass hashes its const)."""

    __hash__ = object.__hash__  # type: ignore[assignment]  # dict sets it to None: unhashable


@dataclass(frozen=True)
class MacroRef:
    node: nodes.Macro


@dataclass(frozen=True)
class GlobalRef:
    name: str


@dataclass(frozen=True)
class NamespaceRef:
    key: int
    loops: tuple[int, ...]  # message loops active where the namespace was created


@dataclass(frozen=True)
class LoopRef:
    loop: int
    over_messages: bool
    looks_ahead: bool = False
    backwards: bool = False  # `messages|reverse`, `messages[::-1]`, a range stepping down
    node: nodes.For | None = field(default=None, compare=False, repr=False)

    def loops_inside(self, source_map: SourceMap) -> frozenset[int]:
        """This loop and the loops nested in its body, by id."""
        if self.node is None:
            return frozenset({self.loop})
        node = self.node
        return source_map.memo(
            ("loops_inside", self.loop),
            lambda: frozenset({self.loop} | {id(inner) for inner in descendants(node) if isinstance(inner, nodes.For)}),
        )

    def assigned_once(self, source_map: SourceMap) -> frozenset[int]:
        """Assignments that run for one message only: before a `{% break %}`, or under a guard
        the same branch turns off (`{% if ns.searching and ... %}{% set ns.searching = false %}`).
        Asked only of a position a scan assigns: found then, not for every loop."""
        if self.node is None:
            return frozenset()
        body = self.node.body
        return source_map.memo(("assigned_once", self.loop), lambda: _assigned_once(body))


def union_of(*values: Value) -> Value:
    labels: set[Label] = set()
    for value in values:
        labels |= value.data()
    return Value(frozenset(labels))


def either_of(*values: Value) -> Value:
    """A value that is one of ``values`` (``a or b``, ``a if t else b``): structure is kept."""
    labels: set[Label] = set()
    for value in values:
        labels |= value.labels
    return Value(frozenset(labels))


def after_branch(old: Value | None, new: Value) -> Value:
    """The value after a branch that may or may not have run."""
    if old is None:
        return Value(new.labels, UNKNOWN)
    const = old.const if old.known and new.known and _same(old.const, new.const) else UNKNOWN
    return Value(old.labels | new.labels, const)


def without_label(value: Value, label: Label) -> Value:
    return Value(value.labels - {label}, value.const) if label in value.labels else value


def same_value(theirs: Value, mine: Value, own: Label) -> bool:
    """``mine`` is ``theirs`` without the label ``own``."""
    if theirs is mine:
        return True
    if theirs.const is not mine.const and not _same(theirs.const, mine.const):
        return False
    return mine.labels == (theirs.labels - {own} if own in theirs.labels else theirs.labels)


def same_values(theirs: dict, mine: dict, own: Label) -> bool:
    if theirs.keys() != mine.keys():
        return False
    return all(same_value(value, mine[key], own) for key, value in theirs.items())


def same_namespaces(theirs: dict, mine: dict, reachable: set[int], own: Label) -> bool:
    """The entries of the namespaces ``reachable`` (and of those their entries hold) are the
    same up to the label ``own``."""
    pending, seen = list(reachable), set()
    while pending:
        key = pending.pop()
        if key in seen:
            continue
        seen.add(key)
        their_entries = {name: value for (space, name), value in theirs.items() if space == key}
        my_entries = {name: value for (space, name), value in mine.items() if space == key}
        if not same_values(their_entries, my_entries, own):
            return False
        pending.extend(value.const.key for value in my_entries.values() if isinstance(value.const, NamespaceRef))
    return True


def _same(a: object, b: object) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def truth_of(value: Value) -> bool | None:
    if not value.known:
        return None
    if value.const is UNDEFINED:
        return False
    if isinstance(value.const, (MacroRef, GlobalRef, NamespaceRef, LoopRef)):
        return True
    try:
        return bool(value.const)
    except Exception:
        return None


def _assigned_once(body: list[nodes.Node]) -> frozenset[int]:
    """The namespace assignments in a loop body that run for one item only: in a block
    that ends the loop (``{% break %}``), or in an ``if`` branch that turns off a
    namespace flag its own test reads."""
    once: set[int] = set()

    def assignments(statements: list[nodes.Node]):
        for statement in statements:
            if isinstance(statement, nodes.Assign) and isinstance(statement.target, nodes.NSRef):
                yield statement
            elif isinstance(statement, nodes.If):
                for branch in [statement.body, *(elif_.body for elif_ in statement.elif_), statement.else_]:
                    yield from assignments(branch)
            elif not isinstance(statement, (nodes.For, nodes.Macro)):
                yield from assignments([child for child in child_nodes(statement) if isinstance(child, nodes.Stmt)])

    def walk(statements: list[nodes.Node]) -> None:
        if any(isinstance(statement, nodes.Break) for statement in statements):
            once.update(id(assignment) for assignment in assignments(statements))
        for statement in statements:
            if isinstance(statement, nodes.If):
                for test, branch in [(statement.test, statement.body), *((e.test, e.body) for e in statement.elif_)]:
                    read = {
                        (n.node.name, n.attr)
                        for n in descendants(test)
                        if isinstance(n, nodes.Getattr) and isinstance(n.node, nodes.Name)
                    }
                    set_here = [a for a in assignments(branch) if (a.target.name, a.target.attr) in read]
                    if set_here:
                        once.update(id(assignment) for assignment in assignments(branch))
                    walk(branch)
                walk(statement.else_)
            elif not isinstance(statement, (nodes.For, nodes.Macro)):
                walk([child for child in child_nodes(statement) if isinstance(child, nodes.Stmt)])

    walk(body)
    return frozenset(once)


def merge_labels(value: Value, *others: Value) -> Value:
    return Value(value.labels | union_of(*others).labels)
