"""What the analysis hands the rules: the labels a value may depend on, the sites they come
from, the sinks that print them, and the ``Facts`` of one pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING, TypeVar

import jinja2
from jinja2 import nodes
from jinja2.nodes import EvalContext

from ..jinja_env import PARSE_ENVIRONMENT
from .locations import SourceMap, child_nodes, preorder

if TYPE_CHECKING:
    from .reuse import Trace

AnyNode = TypeVar("AnyNode", bound=nodes.Node)

KNOWN_GLOBALS = frozenset({"raise_exception", "strftime_now", "dict", "namespace", "range", "lipsum", "cycler", "joiner"})


# Label kinds that describe what a value *is* (the messages list, one message, its tool
# calls) rather than what it depends on: they do not survive arithmetic or printing.
class LabelKind(StrEnum):
    """What a label says about a value: where it comes from, or what it depends on."""

    MESSAGES = "messages"
    MESSAGE = "message"
    TOOL_CALLS = "tool_calls"
    TOOL_CALL = "tool_call"
    TOOL_ARGS = "tool_args"
    VARIABLE = "variable"
    LOOKAHEAD = "lookahead"
    LOOP_INDEX = "loop_index"
    SCAN_POSITION = "scan_position"
    SCAN_FLAG = "scan_flag"
    # Text a loop over messages builds up in a namespace (``ns.out = ns.out + ...``): where
    # it is printed, each message's piece is printed, as if inside that loop.
    ACCUMULATED = "accumulated"
    # A decision that admits, in an inner loop over messages, only the messages before the
    # one the outer loop renders (DeepSeek-V3.2's `loop.index0 < outer_index`).
    BEFORE_CURRENT = "before_current"
    NAMESPACE_READ = "namespace_read"
    LAST = "last"
    NEXT = "next"
    FIRST_MESSAGE = "first_message"
    # What a call of a global function a rule matches returns (``Sources.calls``): named
    # after the function, placed where the source writes the call (`strftime_now`, `ns.clock`).
    CALL = "call"
    # A value that holds such a function itself, not what a call returns (`[strftime_now]`,
    # `namespace(clock=strftime_now)`): whatever is called out of it is a call of that function.
    FUNCTION = "function"
    # What a filter a rule matches returns (``Sources.filters``), named after the filter.
    FILTER = "filter"
    COUNT = "count"
    STRING_GUARD = "string_guard"


STRUCTURAL = frozenset({LabelKind.MESSAGES, LabelKind.MESSAGE, LabelKind.TOOL_CALLS, LabelKind.TOOL_CALL, LabelKind.TOOL_ARGS})
SCANS = frozenset({LabelKind.SCAN_POSITION, LabelKind.SCAN_FLAG})
# Sequence filters that keep the messages list a messages list.
LIST_FILTERS = frozenset(
    {"list", "reverse", "selectattr", "rejectattr", "select", "reject", "sort", "unique", "batch", "slice", "map"}
)
# Loop attributes and what they depend on in a loop over messages.
LOOP_LAST_ATTRS = frozenset({LabelKind.LAST, "length", "revindex", "revindex0"})


@dataclass(frozen=True)
class Site:
    """A place in the template. The column is found only when asked for (see SourceMap)."""

    line: int
    text: str
    node: nodes.Node | None = field(default=None, compare=False, repr=False)
    source_map: SourceMap | None = field(default=None, compare=False, repr=False)
    fixed_column: int | None = field(default=None, compare=False, repr=False)

    @cached_property
    def column(self) -> int:
        if self.fixed_column is not None:
            return self.fixed_column
        if self.node is None or self.source_map is None:
            return 1
        line, column = self.source_map.position(self.node)
        return column if line == self.line else 1


@dataclass(frozen=True)
class Label:
    kind: LabelKind
    site: Site | None = None
    name: str | None = None
    loop: int | None = None  # id of the loop over messages the label is about
    origin: Site | None = None  # for a scan read: where the scan assigned it


@dataclass(frozen=True)
class Sources:
    """The global functions and filters whose values the rules match (the registry builds one
    from every rule's declaration): the analysis labels each call of such a function (and
    follows the function itself through names, lists and namespaces) and each application of
    such a filter, and knows nothing else of what they mean."""

    calls: frozenset[str] = frozenset()
    filters: frozenset[str] = frozenset()


NO_SOURCES = Sources()


@dataclass(frozen=True)
class Control:
    """A decision that output depends on: an ``if`` chain, a ``for`` iterable, a ternary."""

    node: nodes.Node
    labels: frozenset[Label]


@dataclass(frozen=True)
class Sink:
    """A ``{{ ... }}`` (or literal text) that reaches the rendered prompt."""

    node: nodes.Node
    labels: frozenset[Label]
    controls: tuple[Control, ...]
    loops: tuple[int, ...]  # message loops active here, outermost first
    text: str  # the literal text it prints, where known
    # The roles of the message being rendered for which it prints, where the branches that
    # lead to it compare the loop's message role with constants (None: any role).
    roles: frozenset[str] | None = None
    # The expressions it prints whose value only the render knows (a clock, a template
    # variable): ``text`` holds none of their value, only their string literals.
    unknown: tuple[nodes.Expr, ...] = ()

    def all_labels(self) -> frozenset[Label]:
        merged = self.__dict__.get("_all_labels")  # frozen, and every rule asks
        if merged is None:
            merged = set(self.labels)
            for control in self.controls:
                merged |= control.labels
            merged = self.__dict__["_all_labels"] = frozenset(merged)
        return merged


@dataclass(frozen=True)
class JsonUse:
    """A ``|tojson`` and what its input is."""

    node: nodes.Filter
    labels: frozenset[Label]
    controls: tuple[Control, ...]

    @property
    def separators(self) -> tuple[str, str] | None:
        """The separators the call names (``tojson(separators=(",", ":"))``), else None."""
        return declared_separators(self.node)

    @property
    def names_layout(self) -> bool:
        """The call names its JSON layout (separators or indent): the template states how
        the JSON it writes looks."""
        return any(keyword.key in ("separators", "indent") for keyword in self.node.kwargs) or len(self.node.args) >= 2


def declared_separators(node: nodes.Filter) -> tuple[str, str] | None:
    for keyword in node.kwargs:
        if keyword.key == "separators":
            try:
                value = keyword.value.as_const(EvalContext(PARSE_ENVIRONMENT))  # the tree has no environment
            except nodes.Impossible:
                return None
            if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(part, str) for part in value):
                return (value[0], value[1])
    return None


@dataclass(frozen=True)
class FlagReset:
    """``{% set ns.flag = false %}`` in a loop: where a group of messages that turned a
    namespace flag on (DeepSeek's ``ns.is_tool`` over consecutive tool results) ends."""

    name: str  # "ns.flag", as a scan label names it
    loop: int  # id of the loop it is in
    node: nodes.Assign
    text: str  # the literal text its branch prints: what closes the group there
    roles: frozenset[str] | None  # the message roles its branch is for, where the tests say


@dataclass
class Facts:
    text: str
    tree: nodes.Template | None
    source_map: SourceMap
    syntax_error: jinja2.TemplateSyntaxError | None = None
    sinks: list[Sink] = field(default_factory=list)
    json_uses: list[JsonUse] = field(default_factory=list)
    variables: set[str] = field(default_factory=set)  # undeclared names the template reads
    assumptions: Mapping[str, object] = field(default_factory=dict)
    too_deep: bool = False  # the analysis stopped at Python's recursion limit
    trace: Trace | None = None  # the top-level states, when recorded (see Trace)
    taken_over: int = 0  # top-level statements taken from another analysis' trace
    # What the analysis labels (the registry's, from every rule; none by default).
    sources: Sources = field(default_factory=Sources)
    # The one argument each labelled call was given, by id of the call, where the analysis
    # folded it to one constant string (`{% set fmt = '%Y-%m-%d' %}` then `strftime_now(fmt)`);
    # None where it is not one constant. Only statements this analysis ran itself record here.
    call_arguments: dict[int, str | None] = field(default_factory=dict)
    # How the run says the model writes tool-call arguments, None where it does not (see
    # ``model_separators``): set by the lint from its selection, before the rules run.
    tool_args_style: str | None = None

    def site(self, node: nodes.Node, text: str) -> Site:
        return Site(getattr(node, "lineno", 1) or 1, text, node, self.source_map)

    def nodes_of(self, *types: type[AnyNode]) -> list[AnyNode]:
        """The template's nodes of ``types`` in ``find_all``'s order: every question a rule or
        the switch trials ask of the tree filters one shared walk instead of walking again."""
        if self.tree is None:
            return []
        every = self.walk()[0]
        return self.source_map.memo(("nodes_of", types), lambda: [node for node in every if isinstance(node, types)])

    def walk(self) -> tuple[list[nodes.Node], list[int]]:
        """Every node of the template in ``find_all``'s order, with where each one's
        subtree ends (see ``locations.preorder``): the one walk of the whole tree."""
        tree = self.tree
        assert tree is not None, "walked only once parsed"
        return self.source_map.memo("preorder", lambda: preorder(tree))

    def flag_resets(self, loop: int | None) -> tuple[FlagReset, ...]:
        """The namespace flags the loop ``loop`` turns off, and what each branch that does prints
        (none for no loop)."""
        if self.tree is None:
            return ()
        return self.source_map.memo("flag_resets", lambda: _flag_resets(self.tree)).get(loop, ())


def expression_text(node: nodes.Node) -> str:
    """A short source-like rendering of a name or attribute chain, for messages."""
    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.Getattr):
        return f"{expression_text(node.node)}.{node.attr}"
    if isinstance(node, nodes.Getitem):
        if isinstance(node.arg, nodes.Const):
            inner = repr(node.arg.value)
        elif isinstance(node.arg, nodes.Neg) and isinstance(node.arg.node, nodes.Const):
            inner = f"-{node.arg.node.value!r}"
        else:
            inner = "..."
        return f"{expression_text(node.node)}[{inner}]"
    if isinstance(node, nodes.NSRef):
        return f"{node.name}.{node.attr}"
    if isinstance(node, nodes.Call):
        return f"{expression_text(node.node)}(...)"
    if isinstance(node, nodes.Filter):
        return f"{expression_text(node.node) if node.node else ''}|{node.name}"
    return type(node).__name__


def _flag_resets(tree: nodes.Template) -> dict[int, tuple[FlagReset, ...]]:
    """Every ``{% set ns.flag = <false> %}`` inside a loop, filed under each loop around it
    (a reset in a loop over tool calls runs while the loop over messages renders one)."""
    found: dict[int, list[FlagReset]] = {}

    def walk(statements: list[nodes.Node], loops: tuple[nodes.For, ...], roles: frozenset[str] | None) -> None:
        printed = "".join(text for statement in statements for text in _printed_text(statement))
        for statement in statements:
            if isinstance(statement, nodes.For):
                walk(statement.body, (*loops, statement), roles)
                walk(statement.else_, loops, roles)
            elif isinstance(statement, nodes.If):
                taken: set[str] = set()  # roles an earlier branch takes whatever else holds
                for test, body in [(statement.test, statement.body), *((e.test, e.body) for e in statement.elif_)]:
                    walk(body, loops, tested_roles(test) or roles)
                    taken |= tested_roles(test, exact=True) or set()
                # `else` after `if role == "assistant"`: no assistant message gets there
                walk(statement.else_, loops, frozenset({"other"}) if "assistant" in taken else roles)
            elif (
                loops
                and isinstance(statement, nodes.Assign)
                and isinstance(statement.target, nodes.NSRef)
                and isinstance(statement.node, nodes.Const)
                and not statement.node.value
            ):
                name = f"{statement.target.name}.{statement.target.attr}"
                for loop in loops:
                    found.setdefault(id(loop), []).append(FlagReset(name, id(loop), statement, printed, roles))
            elif isinstance(statement, nodes.Macro):
                walk(statement.body, (), None)
            else:
                walk([child for child in child_nodes(statement) if isinstance(child, nodes.Stmt)], loops, roles)

    walk(tree.body, (), None)
    return {loop: tuple(resets) for loop, resets in found.items()}


def _printed_text(statement: nodes.Node):
    """The literal text a statement prints, in source order, through its ``if`` branches."""
    if isinstance(statement, nodes.Output):
        for child in statement.nodes:
            yield from [child.data] if isinstance(child, nodes.TemplateData) else printed_literals(child)
    elif isinstance(statement, nodes.If):
        for body in [statement.body, *(e.body for e in statement.elif_), statement.else_]:
            for inner in body:
                yield from _printed_text(inner)


def tested_roles(test: nodes.Node, exact: bool = False, subject: str | None = None) -> frozenset[str] | None:
    """The message roles a test admits, where it compares a ``.role`` (of ``subject``, when
    given) with constants; ``exact``: only where it admits every message of those roles."""
    if isinstance(test, nodes.And):
        if exact:
            return None
        left, right = tested_roles(test.left, subject=subject), tested_roles(test.right, subject=subject)
        return left & right if left is not None and right is not None else left or right
    if isinstance(test, nodes.Or):
        left, right = tested_roles(test.left, exact, subject), tested_roles(test.right, exact, subject)
        return left | right if left is not None and right is not None else None
    if isinstance(test, nodes.Compare) and len(test.ops) == 1 and test.ops[0].op == "eq":
        sides = [test.expr, test.ops[0].expr]
        constants = [side.value for side in sides if isinstance(side, nodes.Const) and isinstance(side.value, str)]
        if constants and any(_is_role(side, subject) for side in sides):
            return frozenset(constants)
    return None


def _is_role(node: nodes.Node, subject: str | None = None) -> bool:
    if isinstance(node, nodes.Filter) and node.name == "lower" and node.node is not None:
        node = node.node
    by_attribute = isinstance(node, nodes.Getattr) and node.attr == "role"
    by_key = isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == "role"
    if not (by_attribute or by_key):
        return False
    owner = getattr(node, "node", None)  # the Getattr's or Getitem's subject
    return subject is None or (isinstance(owner, nodes.Name) and owner.name == subject)


def printed_literals(node: nodes.Node) -> list[str]:
    """The string literals an expression concatenates into what it prints, in source order."""
    if isinstance(node, nodes.Const):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, (nodes.Add, nodes.Concat, nodes.CondExpr, nodes.Filter)):
        parts = []
        for child in child_nodes(node):
            if isinstance(node, nodes.CondExpr) and child is node.test:
                continue
            if isinstance(node, nodes.Filter) and child is not node.node:
                continue
            parts.extend(printed_literals(child))
        return parts
    return []
