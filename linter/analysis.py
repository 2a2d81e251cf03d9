"""One pass over a template's Jinja AST that builds the facts every rule queries.

The pass is an abstract interpretation: each expression evaluates to a ``Value``, the set
of ``Label``s saying what it depends on (the clock, the number of messages, a scan over all
messages, a template variable...) plus a constant when one is known. Labels flow through
``{% set %}``, namespaces, macros, loop variables and filters; a ``{{ ... }}`` that prints a
value, or prints anything under a condition, is a ``Sink`` that records the labels of what
it prints and of every decision that led to it. Rules then ask questions of the sinks: does
the clock reach output, does a message's render depend on where the last user query is.

Known constants fold (``and``/``or`` short-circuit, ``if`` takes one branch), which is how
a switch is checked: analyse again with ``clear_thinking=False`` and see whether the
finding is gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import jinja2
from jinja2 import nodes
from jinja2.lexer import TokenStream
from jinja2.nodes import EvalContext
from jinja2.parser import Parser

from .jinja_env import PARSE_ENVIRONMENT
from .locations import SourceMap, child_nodes, descendants, preorder


class _Sentinel:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


UNKNOWN = _Sentinel("UNKNOWN")
# A template variable the caller did not pass: ``is defined`` is false, ``default()`` applies.
UNDEFINED = _Sentinel("UNDEFINED")

# Globals that read the wall clock. transformers installs strftime_now; the others are
# names other runtimes (or custom renderers) expose with the same meaning.
CLOCK_GLOBALS = frozenset(
    {"strftime_now", "now", "today", "utcnow", "datetime_now", "current_date", "current_time", "get_current_date"}
)
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
    CLOCK = "clock"
    # A value that holds a clock function itself, not the time it reads (`[strftime_now]`,
    # `namespace(clock=strftime_now)`): whatever is called out of it reads the clock.
    CLOCK_FUNCTION = "clock_function"
    RANDOM = "random"
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

    __hash__ = object.__hash__


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


def argument_separators(facts: Facts) -> tuple[str, str] | None:
    """The separators a template names for ``tojson`` of tool-call arguments, if it names
    any: a template that states how it writes arguments is taken to write them as its model
    does."""
    for use in facts.json_uses:
        if use.separators is not None and any(label.kind is LabelKind.TOOL_ARGS for label in use.labels):
            return use.separators
    return None


# How a model writes tool-call arguments (``--tool-args-style``, the ``tool-args-style`` key):
# compact, {"city":"Paris"}, or spaced, {"city": "Paris"}, as `tojson` writes by default.
TOOL_ARGS_STYLES: dict[str, tuple[str, str]] = {"compact": (",", ":"), "spaced": (", ", ": ")}
DEFAULT_TOOL_ARGS_STYLE = "compact"
TOJSON_SEPARATORS = (", ", ": ")  # transformers' `tojson` names none: json.dumps' own


def model_separators(facts: Facts) -> tuple[str, str]:
    """How the model writes tool-call arguments: as the run says (``--tool-args-style``, the
    ``tool-args-style`` key: ``facts.tool_args_style``), else as the template says where it
    names the separators it writes them with, else compact."""
    if facts.tool_args_style is not None:
        return TOOL_ARGS_STYLES[facts.tool_args_style]
    return argument_separators(facts) or TOOL_ARGS_STYLES[DEFAULT_TOOL_ARGS_STYLE]


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
    # The format each clock call was given, by id of the call, where the analysis folded it
    # to one constant string (`{% set fmt = '%Y-%m-%d' %}` then `strftime_now(fmt)`); None
    # where it is not one constant. Only statements this analysis ran itself record here.
    clock_formats: dict[int, str | None] = field(default_factory=dict)
    # How the run says the model writes tool-call arguments, None where it does not (see
    # ``model_separators``): set by the lint from its selection, before the rules run.
    tool_args_style: str | None = None

    def site(self, node: nodes.Node, text: str) -> Site:
        return Site(getattr(node, "lineno", 1) or 1, text, node, self.source_map)

    def nodes_of(self, *types: type[nodes.Node]) -> list[nodes.Node]:
        """The template's nodes of ``types`` in ``find_all``'s order: every question a rule or
        the switch trials ask of the tree filters one shared walk instead of walking again."""
        if self.tree is None:
            return []
        every = self.walk()[0]
        return self.source_map.memo(("nodes_of", types), lambda: [node for node in every if isinstance(node, types)])

    def walk(self) -> tuple[list[nodes.Node], list[int]]:
        """Every node of the template in ``find_all``'s order, with where each one's
        subtree ends (see ``locations.preorder``): the one walk of the whole tree."""
        return self.source_map.memo("preorder", lambda: preorder(self.tree))

    def flag_resets(self, loop: int) -> tuple[FlagReset, ...]:
        """The namespace flags the loop ``loop`` turns off, and what each branch that does prints."""
        if self.tree is None:
            return ()
        return self.source_map.memo("flag_resets", lambda: _flag_resets(self.tree)).get(loop, ())


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


def analyze(
    text: str,
    tree: nodes.Template | None = None,
    source_map: SourceMap | None = None,
    assumptions: Mapping[str, object] | None = None,
    *,
    record: bool = False,
    reusing: Sequence[Trace] = (),
) -> Facts:
    """The facts of one pass. ``record`` keeps the states between top-level statements
    (``facts.trace``); an analysis under one assumption ``reusing`` other analyses' traces
    takes over the statements the assumption leaves as they were there (see Trace)."""
    error = None
    if tree is None:
        tree, error = parse(text)
    if source_map is None:
        source_map = SourceMap(text, PARSE_ENVIRONMENT, tree)
    facts = Facts(text, tree, source_map, error, assumptions=dict(assumptions or {}))
    if tree is not None:
        if record:
            facts.trace = Trace(facts)
        try:
            _Interpreter(facts).run(tree, reusing)
        except RecursionError:
            facts.too_deep = True  # what was recorded before stands; the rest is not analysed
            facts.trace = None
    return facts


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

    def record(self, interpreter: _Interpreter) -> None:
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
        if len(self.states) != len(self.facts.tree.body) + 1:
            return False
        keys = self.states[-1].macro_cache
        return len({_key_without(key, own) for key in keys}) == len(keys)

    def matches(self, interpreter: _Interpreter, index: int, reads: _Reads, own: Label) -> bool:
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
            elif not _same_value(theirs, mine, own):
                return False
            elif isinstance(mine.const, NamespaceRef):
                namespaces.add(mine.const.key)
        if namespaces and not _same_namespaces(before.namespaces, interpreter.namespaces, namespaces, own):
            return False
        if reads.macros is not None and not reads.macros:
            return True
        theirs = {
            _key_without(key, own): value
            for key, value in before.macro_cache.items()
            if reads.macros is None or key[0] in reads.macros
        }
        mine = {key: value for key, value in interpreter.macro_cache.items() if reads.macros is None or key[0] in reads.macros}
        return _same_values(theirs, mine, own)

    def replay(self, interpreter: _Interpreter, index: int, own: Label) -> None:
        """Do in ``interpreter`` what top-level statement ``index`` did in this trace."""
        before, after = self.states[index], self.states[index + 1]
        for name, value in after.variables.items():
            if before.variables.get(name) is not value:
                interpreter.scope.vars[name] = _without(value, own)
        for key, value in after.namespaces.items():
            if before.namespaces.get(key) is not value:
                interpreter.namespaces[key] = _without(value, own)
        for key, value in after.macro_cache.items():
            if before.macro_cache.get(key) is not value:
                interpreter.macro_cache[_key_without(key, own)] = _without(value, own)
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
    return facts.source_map.memo("top_level_scan", lambda: _scan_top_level(facts.tree, *facts.walk()))


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


class _Scope:
    def __init__(self, parent: _Scope | None = None):
        self.parent = parent
        self.vars: dict[str, Value] = {}

    def lookup(self, name: str) -> Value | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.vars:
                return scope.vars[name]
            scope = scope.parent
        return None


def _union(*values: Value) -> Value:
    labels: set[Label] = set()
    for value in values:
        labels |= value.data()
    return Value(frozenset(labels))


def _either(*values: Value) -> Value:
    """A value that is one of ``values`` (``a or b``, ``a if t else b``): structure is kept."""
    labels: set[Label] = set()
    for value in values:
        labels |= value.labels
    return Value(frozenset(labels))


def _merge(old: Value | None, new: Value) -> Value:
    """The value after a branch that may or may not have run."""
    if old is None:
        return Value(new.labels, UNKNOWN)
    const = old.const if old.known and new.known and _same(old.const, new.const) else UNKNOWN
    return Value(old.labels | new.labels, const)


def _without(value: Value, label: Label) -> Value:
    return Value(value.labels - {label}, value.const) if label in value.labels else value


def _same_value(theirs: Value, mine: Value, own: Label) -> bool:
    """``mine`` is ``theirs`` without the label ``own``."""
    if theirs is mine:
        return True
    if theirs.const is not mine.const and not _same(theirs.const, mine.const):
        return False
    return mine.labels == (theirs.labels - {own} if own in theirs.labels else theirs.labels)


def _same_values(theirs: dict, mine: dict, own: Label) -> bool:
    if theirs.keys() != mine.keys():
        return False
    return all(_same_value(value, mine[key], own) for key, value in theirs.items())


def _same_namespaces(theirs: dict, mine: dict, reachable: set[int], own: Label) -> bool:
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
        if not _same_values(their_entries, my_entries, own):
            return False
        pending.extend(value.const.key for value in my_entries.values() if isinstance(value.const, NamespaceRef))
    return True


def _same(a: object, b: object) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _truth(value: Value) -> bool | None:
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


class _Interpreter:
    MAX_MACRO_DEPTH = 4

    def __init__(self, facts: Facts):
        self.facts = facts
        self.scope = _Scope()
        self.namespaces: dict[tuple[int, str], Value] = {}
        self.controls: list[Control] = []
        self.loops: list[LoopRef] = []
        self.collectors: list[set[Label]] = []
        self.roles: list[frozenset[str]] = []  # role constraints of the branches being run
        self.message_names: list[str] = []  # the loop variable of each loop over messages
        self.macro_cache: dict[tuple, Value] = {}
        self.undeclared: dict[str, Value] = {}  # what reading each undeclared name gives
        self.macro_depth = 0
        # The namespace fields each active loop over messages builds up (``ns.out = ns.out + ...``).
        self.accumulating: dict[int, set[tuple[int, str]]] = {}
        self.namespace_loops = facts.source_map.memo("namespace_loops", lambda: _namespace_loops(facts.tree))
        self.literals: dict[int, list[str]] = facts.source_map.memo("literal_strings", dict)
        self.test_roles: dict[tuple, tuple] = facts.source_map.memo("test_roles", dict)

    # -- statements ------------------------------------------------------------------

    def run(self, tree: nodes.Template, reusing: Sequence[Trace] = ()) -> None:
        trace = self.facts.trace
        assumed = list(self.facts.assumptions)
        if len(assumed) != 1:
            reusing = ()
        own = Label(LabelKind.VARIABLE, name=assumed[0]) if reusing else None
        reusing = [other for other in reusing if other.usable_for(own)]
        if trace is None and not reusing:
            self.block(tree.body)
            return
        reads = top_level_scan(self.facts)[0] if reusing else ()
        for index, statement in enumerate(tree.body):
            if trace is not None:
                trace.record(self)
            other = next((other for other in reusing if other.matches(self, index, reads[index], own)), None)
            if other is not None:
                other.replay(self, index, own)
                self.facts.taken_over += 1
            else:
                self.statement(statement)
        if trace is not None:
            trace.record(self)

    def block(self, body: Iterable[nodes.Node]) -> None:
        for index, statement in enumerate(body):
            if type(statement) is nodes.If and _skips_rest(statement):
                # `{% if test %}{% continue %}{% endif %}` then the rest: the rest runs only
                # where the test is false, as if it were the test's `else`.
                labels = self.stmt_If(statement)
                self.controls.append(Control(statement, labels))
                try:
                    self.block(list(body)[index + 1 :])
                finally:
                    self.controls.pop()
                return
            handler = _STATEMENTS.get(type(statement))  # ``statement``, without its call
            if handler is not None:
                handler(self, statement)
            else:
                self.statement(statement)

    def statement(self, node: nodes.Node) -> None:
        handler = _STATEMENTS.get(type(node))
        if handler is not None:
            handler(self, node)
        elif isinstance(node, nodes.Stmt):
            for child in child_nodes(node):
                if isinstance(child, nodes.Stmt):
                    self.statement(child)

    def stmt_Output(self, node: nodes.Output) -> None:
        labels: set[Label] = set()
        text: list[str] = []
        unknown: list[nodes.Expr] = []
        for child in node.nodes:
            if isinstance(child, nodes.TemplateData):
                text.append(child.data)
                continue
            value = self.expr(child)
            labels |= value.data()
            if value.known and isinstance(value.const, str):
                text.append(value.const)
            else:
                text.extend(self.literal_strings(child))
                # `raise_exception(...)` prints nothing (it has no label), and a choice of
                # literals (`"\n" if tools`) prints one of those in ``text``.
                if value.labels and not only_literals(child):
                    unknown.append(child)
        self.emit(node, frozenset(labels), "".join(text), tuple(unknown))

    def literal_strings(self, node: nodes.Node) -> list[str]:
        """``_literal_strings(node)``, worked out once for every analysis of the template."""
        strings = self.literals.get(id(node))
        if strings is None:
            strings = self.literals[id(node)] = _literal_strings(node)
        return strings

    def emit(self, node: nodes.Node, labels: frozenset[Label], text: str, unknown: tuple[nodes.Expr, ...] = ()) -> None:
        if self.collectors:
            collected = self.collectors[-1]
            collected |= labels
            for control in self.controls:
                collected |= control.labels
            return
        loops = tuple(loop.loop for loop in self.loops if loop.over_messages)
        # Printing what a loop accumulated prints what each of its messages added.
        accumulated = {label.loop for label in labels if label.kind is LabelKind.ACCUMULATED}
        loops += tuple(sorted(accumulated - set(loops)))
        roles = frozenset.intersection(*self.roles) if self.roles else None
        self.facts.sinks.append(Sink(node, labels, tuple(self.controls), loops, text, roles, unknown))

    def stmt_Assign(self, node: nodes.Assign) -> None:
        self.assign(node.target, self.expr(node.node), node)

    def stmt_AssignBlock(self, node: nodes.AssignBlock) -> None:
        captured = self.capture(node.body)
        if node.filter is not None:
            captured = _union(captured, self.expr_filter_chain(node.filter))
        self.assign(node.target, captured, node)

    def assign(self, target: nodes.Node, value: Value, node: nodes.Node) -> None:
        control_labels = self.control_labels()
        if control_labels:
            value = Value(value.labels | control_labels, value.const)
        if isinstance(target, nodes.Name):
            self.scope.vars[target.name] = value
        elif isinstance(target, nodes.Tuple):
            for item in target.items:
                self.assign(item, Value(value.data()), node)
        elif isinstance(target, nodes.NSRef):
            holder = self.scope.lookup(target.name)
            if holder is None or not isinstance(holder.const, NamespaceRef):
                return
            namespace = holder.const
            scanning = [loop for loop in self.loops if loop.over_messages and loop.loop not in namespace.loops]
            # A forward scan already carries its look-ahead label; a full scan becomes a fact.
            if scanning and not any(loop.looks_ahead for loop in scanning):
                value = self.scanned(scanning[-1], target, value, node)
            key = (namespace.key, target.attr)
            if self.controls or scanning:
                value = _merge(self.namespaces.get(key), value)
            if scanning and _accumulates(node, target):
                for active in scanning:
                    self.accumulating.setdefault(active.loop, set()).add(key)
            self.namespaces[key] = value

    def copied_messages(self, loop: LoopRef, value: Value) -> Value:
        """The messages copied into a list one by one (`ns.msgs = ns.msgs + [message]`,
        filtered or merged on the way): after the loop it is the messages, in order, and a
        loop over the copy renders them as a loop over `messages` does, not a fact a scan
        found. What decided which messages were copied stays in its labels (a `loop.last`
        among them), but for the state the copying loop itself carries (Mistral's group of
        same-role messages merged into one, `ns_c.tool_calls`): that is the copy being made."""
        inside = loop.loops_inside(self.facts.source_map)
        carried = SCANS | {LabelKind.ACCUMULATED}
        return Value(frozenset(label for label in value.labels if not (label.kind in carried and label.loop in inside)))

    def scanned(self, loop: LoopRef, target: nodes.NSRef, value: Value, node: nodes.Node) -> Value:
        """A value assigned while iterating messages into a namespace that outlives the
        loop: after the loop it holds a fact about the whole list, e.g. the position of the
        last user query when the assigned value is a loop index. A position that ends as the
        first match in message order is a fact about a prefix, which new messages keep."""
        if _increments(node, target) and self.controls and self.controls[-1].node is loop.node:
            # `{% set ns.n = ns.n + 1 %}` on every message, under no test: after the loop it
            # is the number of messages, as `messages|length` is, not a position found.
            # Named, with its loop: it is reported where it is read after the loop (read_scan).
            name = f"{target.name}.{target.attr}"
            return Value(value.labels | {Label(LabelKind.COUNT, self.facts.site(node, name), name, loop.loop)}, value.const)
        is_position = any(label.kind is LabelKind.LOOP_INDEX and label.loop == loop.loop for label in value.labels)
        earlier_only = any(label.kind is LabelKind.BEFORE_CURRENT and label.loop == loop.loop for label in value.labels)
        if earlier_only or (is_position and _keeps_first(loop, node, self.facts.source_map)):
            # Counted from either end (`messages|length - 1 - loop.index0`), it is one fixed
            # place; found among the messages before the one rendered, later ones never move it.
            kept = {label for label in value.labels if label.loop != loop.loop and label.kind is not LabelKind.COUNT}
            return Value(frozenset(kept), value.const)
        name = f"{target.name}.{target.attr}"
        site = self.facts.site(node, name)
        scan = Label(LabelKind.SCAN_POSITION if is_position else LabelKind.SCAN_FLAG, site, name, loop.loop)
        labels = {scan}
        if _accumulates(node, target):
            labels.add(Label(LabelKind.ACCUMULATED, site, name, loop.loop))
        return Value(value.labels | labels, value.const)

    def control_labels(self) -> frozenset[Label]:
        labels: set[Label] = set()
        for control in self.controls:
            labels |= control.labels
        return frozenset(labels)

    def stmt_If(self, node: nodes.If) -> frozenset[Label]:
        """Run the branches that may be taken; the labels of the tests that choose."""
        branches = [(node.test, node.body)] + [(elif_.test, elif_.body) for elif_ in node.elif_]
        chain: set[Label] = set()
        taken: list[list[nodes.Node]] = []
        roles: list[frozenset[str] | None] = []
        subject = self.message_names[-1] if self.message_names else None
        exact: set[str] = set()  # roles an earlier test takes whatever else holds
        certain = False
        for test, body in branches:
            value = _presence_of_next(self.expr(test))
            truth = _truth(value)
            if truth is False:
                continue
            chain |= value.data()
            taken.append(body)
            admitted, admitted_exactly = self.roles_of(test, subject) if subject else (None, None)
            roles.append(admitted)
            exact |= admitted_exactly or set()
            if truth is True:
                certain = True
                break
        if not certain:
            taken.append(node.else_)
            roles.append(frozenset({"other"}) if "assistant" in exact else None)
        if certain and len(taken) == 1:
            self.block(taken[0])
            return frozenset(chain)
        self.branches(node, frozenset(chain), taken, roles)
        return frozenset(chain)

    def roles_of(self, test: nodes.Node, subject: str) -> tuple[frozenset[str] | None, frozenset[str] | None]:
        """``_roles`` of a test, and its exact roles: worked out once for every analysis."""
        key = (id(test), subject)
        found = self.test_roles.get(key)
        if found is None:
            found = self.test_roles[key] = (_roles(test, subject=subject), _roles(test, exact=True, subject=subject))
        return found

    def branches(
        self,
        node: nodes.Node,
        labels: frozenset[Label],
        bodies: list[list[nodes.Node]],
        roles: list[frozenset[str] | None] | None = None,
    ) -> None:
        """Run each possible body from the same state, then merge what they assigned."""
        before_vars = dict(self.scope.vars)
        before_ns = dict(self.namespaces)
        results = []
        control = Control(node, labels)
        for index, body in enumerate(bodies):
            if not body:  # an absent ``else``: the state as it was, with nothing to copy or merge
                results.append((before_vars, before_ns))
                continue
            self.scope.vars = dict(before_vars)
            self.namespaces = dict(before_ns)
            self.controls.append(control)
            role = roles[index] if roles else None
            if role is not None:
                self.roles.append(role)
            try:
                self.block(body)
            finally:
                self.controls.pop()
                if role is not None:
                    self.roles.pop()
            results.append((self.scope.vars, self.namespaces))
        merged_vars = dict(before_vars)
        merged_ns = dict(before_ns)
        for variables, namespaces in results:
            if variables is before_vars and namespaces is before_ns:
                continue
            # What the branch assigned (most of the state it carries is as it was before).
            assigned = [(key, value) for key, value in variables.items() if before_vars.get(key) is not value]
            for key, value in assigned:
                merged_vars[key] = _merge(merged_vars.get(key), value) if key in merged_vars else value
            assigned = [(key, value) for key, value in namespaces.items() if before_ns.get(key) is not value]
            for key, value in assigned:
                merged_ns[key] = _merge(merged_ns.get(key), value) if key in merged_ns else value
        # A name first set in only some branches is unknown afterwards.
        for key in [key for key in merged_vars if key not in before_vars]:
            if not all(key in variables for variables, _ in results):
                merged_vars[key] = Value(merged_vars[key].labels, UNKNOWN)
        self.scope.vars = merged_vars
        self.namespaces = merged_ns

    def stmt_For(self, node: nodes.For) -> None:
        iterable = self.expr(node.iter)
        # A loop over messages, or over their indices (`range(messages|length)`).
        by_index = _is_range(node.iter) and iterable.has(LabelKind.COUNT)
        over_messages = iterable.has(LabelKind.MESSAGES) or by_index
        if by_index and self.mentions_active_index(iterable):
            # `range(loop.index0 + 1, messages|length)`: the indices after the current message.
            site = self.facts.site(node.iter, expression_text(node.iter))
            iterable = Value(iterable.labels | {Label(LabelKind.LOOKAHEAD, site)}, iterable.const)
        backwards = _backwards(node.iter) or _reads_from_the_end(node)
        loop = LoopRef(id(node), over_messages, iterable.has(LabelKind.LOOKAHEAD), backwards, node)
        element = self.element_of(iterable)
        if by_index:
            # The element is an index; the count it ranges over says nothing about any one message.
            kept = {label for label in element.labels if label.kind is not LabelKind.COUNT}
            element = Value(frozenset(kept | {Label(LabelKind.LOOP_INDEX, loop=loop.loop)}))
        control = Control(node, iterable.data())
        assigns_namespace = id(node) in self.namespace_loops
        before_ns = dict(self.namespaces)
        outer = self.scope
        # Twice when the body carries state between iterations in a namespace, so a value
        # set late in one iteration is seen by the code before it in the next.
        outer_roles = self.roles
        if over_messages:
            self.message_names.append(node.target.name if isinstance(node.target, nodes.Name) else "")
            self.roles = []  # a role an outer branch tested is another message's
        for _ in range(2 if assigns_namespace else 1):
            self.scope = _Scope(outer)
            self.bind_target(node.target, element)
            self.scope.vars["loop"] = Value(const=loop)
            self.loops.append(loop)
            self.controls.append(control)
            try:
                if node.test is not None:
                    test = self.expr(node.test)
                    self.controls.append(Control(node.test, test.data()))
                    try:
                        self.block(node.body)
                    finally:
                        self.controls.pop()
                else:
                    self.block(node.body)
            finally:
                self.controls.pop()
                self.loops.pop()
                self.scope = outer
        if over_messages:
            self.message_names.pop()
            self.roles = outer_roles
        # The loop may run zero times: what it set in namespaces merges with what was there.
        for key, value in list(self.namespaces.items()):
            if before_ns.get(key) is not value:
                self.namespaces[key] = _merge(before_ns.get(key), value) if key in before_ns else Value(value.labels)
        for key in self.accumulating.pop(loop.loop, ()):
            copy = self.namespaces.get(key)
            if over_messages and copy is not None and copy.has(LabelKind.MESSAGES):
                self.namespaces[key] = self.copied_messages(loop, copy)
        self.block(node.else_)

    def bind_target(self, target: nodes.Node, element: Value) -> None:
        if isinstance(target, nodes.Name):
            self.scope.vars[target.name] = element
        elif isinstance(target, nodes.Tuple):
            for item in target.items:
                self.bind_target(item, Value(element.data()))

    def element_of(self, iterable: Value) -> Value:
        labels = set(iterable.data())
        if iterable.has(LabelKind.MESSAGES):
            labels.add(Label(LabelKind.MESSAGE))
        if iterable.has(LabelKind.TOOL_CALLS):
            labels.add(Label(LabelKind.TOOL_CALL))
        return Value(frozenset(labels))

    def stmt_Macro(self, node: nodes.Macro) -> None:
        self.scope.vars[node.name] = Value(const=MacroRef(node))

    def stmt_CallBlock(self, node: nodes.CallBlock) -> None:
        self.block(node.body)

    def stmt_FilterBlock(self, node: nodes.FilterBlock) -> None:
        self.block(node.body)

    def stmt_With(self, node: nodes.With) -> None:
        outer = self.scope
        self.scope = _Scope(outer)
        try:
            for target, value in zip(node.targets, node.values):
                self.bind_target(target, self.expr(value))
            self.block(node.body)
        finally:
            self.scope = outer

    def stmt_Block(self, node: nodes.Block) -> None:
        self.block(node.body)

    def stmt_Scope(self, node: nodes.Scope) -> None:
        self.block(node.body)

    def stmt_ScopedEvalContextModifier(self, node: nodes.ScopedEvalContextModifier) -> None:
        self.block(node.body)

    def capture(self, body: list[nodes.Node]) -> Value:
        collected: set[Label] = set()
        self.collectors.append(collected)
        try:
            self.block(body)
        finally:
            self.collectors.pop()
        return Value(frozenset(collected))

    # -- expressions -----------------------------------------------------------------

    def expr(self, node: nodes.Node) -> Value:
        handler = _EXPRESSIONS.get(type(node))
        if handler is not None:
            return handler(self, node)
        return _union(*(self.expr(child) for child in child_nodes(node) if isinstance(child, nodes.Expr)))

    def expr_Const(self, node: nodes.Const) -> Value:
        return Value(const=node.value)

    def expr_TemplateData(self, node: nodes.TemplateData) -> Value:
        return Value(const=node.data)

    def expr_Name(self, node: nodes.Name) -> Value:
        name = node.name
        found = self.scope.lookup(name)
        if found is not None:
            return found
        if name in self.facts.assumptions:
            return Value(const=self.facts.assumptions[name])
        if name in KNOWN_GLOBALS:
            if name in CLOCK_GLOBALS:  # the clock itself, which a list or a namespace may hold
                return Value(frozenset({Label(LabelKind.CLOCK_FUNCTION, name=name)}), GlobalRef(name))
            return Value(const=GlobalRef(name))
        value = self.undeclared.get(name)
        if value is None:  # one value per name: it is immutable, and read again and again
            self.facts.variables.add(name)
            label = Label(LabelKind.MESSAGES) if name == "messages" else Label(LabelKind.VARIABLE, name=name)
            value = self.undeclared[name] = Value(frozenset({label}))
        return value

    def expr_Dict(self, node: nodes.Dict) -> Value:
        if not all(isinstance(pair.key, nodes.Const) and isinstance(pair.key.value, str) for pair in node.items):
            return NOTHING
        return Value(const=Record((pair.key.value, self.expr(pair.value)) for pair in node.items))

    def expr_Getattr(self, node: nodes.Getattr) -> Value:
        base = self.expr(node.node)
        if isinstance(base.const, Record):
            return base.const.get(node.attr, NOTHING)
        if isinstance(base.const, NamespaceRef):
            value = self.namespaces.get((base.const.key, node.attr), NOTHING)
            return self.read_scan(value, node)

        if isinstance(base.const, LoopRef):
            return self.loop_attribute(base.const, node.attr, node)
        return self.member(base, node.attr)

    def expr_Getitem(self, node: nodes.Getitem) -> Value:
        base = self.expr(node.node)
        arg = node.arg
        if isinstance(arg, nodes.Slice):
            bounds = [self.expr(part) for part in (arg.start, arg.stop, arg.step) if part is not None]
            labels = set(base.labels) | set(_union(*bounds).labels)
            if base.has(LabelKind.MESSAGES) and arg.start is not None and self.mentions_current_index(arg.start):
                labels.add(Label(LabelKind.LOOKAHEAD, self.facts.site(node, expression_text(node.node) + "[...:]")))
            elif base.has(LabelKind.MESSAGES) and _negative(arg.start) and not _negative(arg.step):
                # A window on the last messages (`messages[-4:]`): each new message pushes the
                # oldest out, so what the prompt starts with depends on how many follow.
                start = arg.start.node.value if isinstance(arg.start, nodes.Neg) else -arg.start.value
                window = f"{expression_text(node.node)}[-{start}:]"
                labels.add(Label(LabelKind.LOOKAHEAD, self.facts.site(node, window), name="window"))
            if base.has(LabelKind.MESSAGES):
                return Value(_as_positions(frozenset(labels)))  # messages cut at a scanned fact
            return Value(frozenset(labels))
        key = self.expr(arg)
        if isinstance(base.const, Record) and isinstance(key.const, str):
            return base.const.get(key.const, NOTHING)
        if isinstance(base.const, NamespaceRef) and isinstance(key.const, str):
            return self.read_scan(self.namespaces.get((base.const.key, key.const), NOTHING), node)
        if isinstance(base.const, LoopRef) and isinstance(key.const, str):
            return self.loop_attribute(base.const, key.const, node)
        if base.has(LabelKind.MESSAGES):
            labels = set(base.data()) | {Label(LabelKind.MESSAGE)}
            if isinstance(key.const, int):
                if key.const < 0:
                    labels.add(Label(LabelKind.LAST, self.facts.site(node, expression_text(node))))
                elif key.const == 0:
                    labels.add(Label(LabelKind.FIRST_MESSAGE))
            elif self.is_next_index(arg) and not self.counts_from_a_slice_of(node.node):
                labels.add(Label(LabelKind.NEXT, self.facts.site(node, expression_text(node.node) + "[next]")))
            else:
                labels |= key.data()
            return Value(frozenset(labels))
        if isinstance(key.const, str):
            return self.member(base, key.const)
        if base.has(LabelKind.TOOL_CALLS):
            return Value(_union(base, key).labels | {Label(LabelKind.TOOL_CALL)})
        return _union(base, key)

    def member(self, base: Value, attr: str) -> Value:
        data = set(base.data())
        if base.has(LabelKind.MESSAGE):
            if attr == "tool_calls":
                data.add(Label(LabelKind.TOOL_CALLS))
        elif base.has(LabelKind.TOOL_CALLS):
            data.add(Label(LabelKind.TOOL_CALL))
        elif base.has(LabelKind.TOOL_CALL):
            if attr == "function":
                data.add(Label(LabelKind.TOOL_CALL))
            elif attr == "arguments":
                data.add(Label(LabelKind.TOOL_ARGS))
        return Value(frozenset(data))

    def read_scan(self, value: Value, node: nodes.Node) -> Value:
        """A namespace read: scan facts are reported where they are read.

        Read inside the loop that assigns it, a namespace value is running state (it
        depends on the messages so far), not a fact about the whole list.
        """
        if any(label.kind in (LabelKind.LOOKAHEAD, LabelKind.LAST, LabelKind.NEXT) for label in value.labels):
            # Where a look-ahead fact is read is where a fix can replace it.
            read = Label(LabelKind.NAMESPACE_READ, self.facts.site(node, expression_text(node)), expression_text(node))
            value = Value(value.labels | {read}, value.const)
        if not any(label.kind in SCANS or (label.kind is LabelKind.COUNT and label.loop is not None) for label in value.labels):
            return value
        active = {loop.loop for loop in self.loops}
        labels = set()
        for label in value.labels:
            if label.kind is LabelKind.COUNT and label.loop is not None and label.origin is None and label.loop not in active:
                # A namespace count of the messages (``scanned``), first read after its loop:
                # the read is what makes a message render differently, so it is reported there.
                labels.add(Label(label.kind, self.facts.site(node, label.name or ""), label.name, label.loop, label.site))
            elif label.kind in SCANS and label.origin is None:
                if label.loop in active:
                    continue
                # First read after the scan: reported here, and where a fix replaces it. A
                # fact already read (copied, then built into this value) keeps that read.
                labels.add(Label(label.kind, self.facts.site(node, label.name or ""), label.name, label.loop, label.site))
            elif label.kind in SCANS and label.loop in active:
                continue
            else:
                labels.add(label)
        return Value(frozenset(labels), value.const)

    def loop_attribute(self, loop: LoopRef, attr: str, node: nodes.Node) -> Value:
        if not loop.over_messages:
            return NOTHING
        site = self.facts.site(node, f"loop.{attr}")
        if attr in LOOP_LAST_ATTRS:
            last = Label(LabelKind.LAST, site, loop=loop.loop)
            if attr.startswith("revindex"):  # the index counted from the end: a position too
                return Value(frozenset({last, Label(LabelKind.LOOP_INDEX, loop=loop.loop)}))
            return Value(frozenset({last}))
        if attr == "nextitem":
            return Value(frozenset({Label(LabelKind.NEXT, site, loop=loop.loop), Label(LabelKind.MESSAGE)}))
        if attr == "previtem":
            return Value(frozenset({Label(LabelKind.LOOP_INDEX, loop=loop.loop), Label(LabelKind.MESSAGE)}))
        return Value(frozenset({Label(LabelKind.LOOP_INDEX, loop=loop.loop)}))

    def positions_compared(self, value: Value) -> Value:
        """A scanned fact compared with the index of the message being rendered is a
        position, whatever the scan assigned (a counter, `loop.revindex0`...)."""
        return Value(_as_positions(value.labels), value.const) if self.mentions_active_index(value) else value

    def mentions_current_index(self, node: nodes.Node) -> bool:
        return self.mentions_active_index(self.expr(node))

    def mentions_active_index(self, value: Value) -> bool:
        current = {loop.loop for loop in self.loops if loop.over_messages}
        return any(label.kind is LabelKind.LOOP_INDEX and label.loop in current for label in value.labels)

    def is_next_index(self, node: nodes.Node) -> bool:
        """``loop.index`` or ``loop.index0 + 1``: the message after the current one."""
        if isinstance(node, nodes.Getattr) and node.attr == "index":
            base = self.expr(node.node)
            return isinstance(base.const, LoopRef) and base.const.over_messages
        if isinstance(node, nodes.Add):
            return self.mentions_current_index(node)
        return False

    def counts_from_a_slice_of(self, listed: nodes.Node) -> bool:
        """Whether the loop rendering the message iterates a slice of ``listed`` that may
        start past its first item (Bielik's `for message in messages[loop_start_index:]`):
        then `listed[loop.index0 + 1]` is not the next message but, with a system message
        sliced off, the current one, and a test of its role does not close a group."""
        loops = [loop for loop in self.loops if loop.over_messages]
        iterable = loops[-1].node.iter if loops and loops[-1].node is not None else None
        if not (isinstance(iterable, nodes.Getitem) and isinstance(iterable.arg, nodes.Slice)):
            return False
        start = iterable.arg.start
        if start is None or (isinstance(start, nodes.Const) and start.value == 0):
            return False
        return iterable.node == listed

    def expr_Call(self, node: nodes.Call) -> Value:
        func = node.node
        args = [self.expr(arg) for arg in node.args]
        kwargs = {keyword.key: self.expr(keyword.value) for keyword in node.kwargs}
        extra = [self.expr(part) for part in (node.dyn_args, node.dyn_kwargs) if part is not None]
        if isinstance(func, nodes.Getattr):
            base = self.expr(func.node)
            held = None  # a function kept in a namespace or a dict literal (`ns.clock(...)`)
            if isinstance(base.const, NamespaceRef):
                held = self.namespaces.get((base.const.key, func.attr))
            elif isinstance(base.const, Record):
                held = base.const.get(func.attr)
            if held is not None and self.is_clock(held):
                return self.clock_call(node, func, args, kwargs)
            if func.attr == "get" and args:
                if isinstance(base.const, (NamespaceRef, LoopRef)):
                    return NOTHING
                key = args[0].const
                if isinstance(key, str):
                    return _merge_labels(self.member(base, key), *args[1:])
            return _union(base, *args, *kwargs.values(), *extra)
        if (
            isinstance(func, nodes.Name)
            and func.name in CLOCK_GLOBALS
            and func.name not in self.facts.source_map.memo("declared", lambda: _declared_names(self.facts))
            and func.name not in self.facts.assumptions
        ):
            return self.clock_call(node, func, args, kwargs)
        callee = self.expr(func)
        target = callee.const
        if self.is_clock(callee):
            # A clock called through a name it was set to (`{% set clock = strftime_now %}`),
            # or read out of a list (`clocks[0](...)`).
            return self.clock_call(node, func, args, kwargs)
        if isinstance(target, MacroRef):
            return self.call_macro(target.node, args, kwargs)
        if isinstance(target, GlobalRef):
            if target.name == "raise_exception":
                return NOTHING
            if target.name == "namespace":
                namespace = NamespaceRef(id(node), tuple(loop.loop for loop in self.loops if loop.over_messages))
                for key, value in kwargs.items():
                    self.namespaces[(namespace.key, key)] = value
                return Value(const=namespace)
            if target.name == "lipsum":
                return Value(frozenset({Label(LabelKind.RANDOM, self.facts.site(func, "lipsum"), "lipsum")}))
        return _union(callee, *args, *kwargs.values(), *extra)

    def clock_call(self, node: nodes.Call, func: nodes.Expr, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """A call that reads the clock: labelled where it is called (``func``, named as the
        source writes it), with the format it was given where that folds to one string."""
        name = expression_text(func)
        format = args[0].const if len(args) == 1 and not kwargs and isinstance(args[0].const, str) else None
        calls = self.facts.clock_formats
        if id(node) in calls and calls[id(node)] != format:
            format = None  # a loop run twice, or branches, gave it two formats
        calls[id(node)] = format
        return Value(frozenset({Label(LabelKind.CLOCK, self.facts.site(func, name), name)}) | _union(*args).labels)

    def is_clock(self, callee: Value) -> bool:
        """Whether a value called is a clock global: `strftime_now` (a known global, also
        read out of a list or a namespace that holds it), or a clock name the template
        neither defines nor is passed (`now`)."""
        if isinstance(callee.const, GlobalRef):
            return callee.const.name in CLOCK_GLOBALS
        if callee.has(LabelKind.CLOCK_FUNCTION):
            return True
        return any(
            label.kind is LabelKind.VARIABLE
            and label.name in CLOCK_GLOBALS
            and label.name not in self.facts.source_map.memo("declared", lambda: _declared_names(self.facts))
            and label.name not in self.facts.assumptions
            for label in callee.labels
        )

    def call_macro(self, macro: nodes.Macro, args: list[Value], kwargs: dict[str, Value]) -> Value:
        key = (id(macro), tuple(value.labels for value in args), tuple(sorted((k, v.labels) for k, v in kwargs.items())))
        if key in self.macro_cache:
            return self.macro_cache[key]
        if self.macro_depth >= self.MAX_MACRO_DEPTH:
            return _union(*args, *kwargs.values())
        self.macro_cache[key] = _union(*args, *kwargs.values())  # recursion sees the arguments only
        outer_scope, outer_controls, outer_loops = self.scope, self.controls, self.loops
        outer_roles, outer_names = self.roles, self.message_names
        self.roles, self.message_names = [], []
        self.scope = _Scope(_root(outer_scope))
        self.controls, self.loops = [], []
        for index, parameter in enumerate(macro.args):
            if index < len(args):
                value = args[index]
            elif parameter.name in kwargs:
                value = kwargs[parameter.name]
            else:
                default_index = index - (len(macro.args) - len(macro.defaults))
                value = self.expr(macro.defaults[default_index]) if default_index >= 0 else Value(const=UNDEFINED)
            self.scope.vars[parameter.name] = value
        self.macro_depth += 1
        try:
            result = self.capture(macro.body)
        finally:
            self.macro_depth -= 1
            self.scope, self.controls, self.loops = outer_scope, outer_controls, outer_loops
            self.roles, self.message_names = outer_roles, outer_names
        self.macro_cache[key] = result
        return result

    def expr_Filter(self, node: nodes.Filter) -> Value:
        if node.node is None:
            return NOTHING
        return self.apply_filter(node, self.expr(node.node))

    def expr_filter_chain(self, node: nodes.Filter) -> Value:
        return NOTHING if node.node is None else self.expr(node)

    def apply_filter(self, node: nodes.Filter, value: Value) -> Value:
        name = node.name
        args = [self.expr(arg) for arg in node.args] + [self.expr(keyword.value) for keyword in node.kwargs]
        if name in ("default", "d"):
            fallback = args[0] if args else Value(const="")
            if value.const is UNDEFINED:
                return fallback
            if value.known:
                return value
            return _either(value, fallback)
        if name == "tojson":
            self.facts.json_uses.append(JsonUse(node, value.labels, tuple(self.controls)))
            return _union(value, *args)
        if name in (LabelKind.RANDOM, "shuffle"):
            site = self.facts.site(node, f"|{name}")
            return Value(value.data() | {Label(LabelKind.RANDOM, site, name)})
        if value.has(LabelKind.MESSAGES):
            site = self.facts.site(node.node, f"{expression_text(node.node)}|{name}")
            if name in ("length", LabelKind.COUNT):
                return Value(value.data() | {Label(LabelKind.COUNT, site)})
            if name == "last":
                return Value(value.data() | {Label(LabelKind.LAST, site), Label(LabelKind.MESSAGE)})
            if name == "first":
                return Value(value.data() | {Label(LabelKind.MESSAGE), Label(LabelKind.FIRST_MESSAGE)})
            if name in LIST_FILTERS:
                return Value(value.labels | _union(*args).labels)
        if value.known and not args and name in _FOLDABLE_FILTERS and not isinstance(value.const, Record):
            try:
                return Value(const=_FOLDABLE_FILTERS[name](value.const))
            except Exception:
                pass
        return _union(value, *args)

    def expr_Test(self, node: nodes.Test) -> Value:
        value = self.expr(node.node)
        args = [self.expr(arg) for arg in node.args]
        name = node.name
        if name in ("defined", "undefined"):
            if value.known:
                defined = value.const is not UNDEFINED
                return Value(const=defined if name == "defined" else not defined)
            return Value(value.data())
        if value.known and value.const is not UNDEFINED and all(arg.known for arg in args):
            folded = _fold_test(name, value.const, [arg.const for arg in args])
            if folded is not None:
                return Value(const=folded)
        if name in ("none", "defined", "undefined"):
            value = _presence_of_next(value)
        labels = set(_union(value, *args).labels)
        if name == "string" and value.has(LabelKind.TOOL_ARGS):
            labels.add(Label(LabelKind.STRING_GUARD))
        return Value(frozenset(labels))

    def expr_And(self, node: nodes.And) -> Value:
        left = self.expr(node.left)
        truth = _truth(left)
        if truth is False:
            return left
        right = self.expr(node.right)
        if truth is True:
            return right
        if _truth(right) is False:
            # False whichever side it returns (`is_after_last_user and thinking` with thinking
            # false): a branch it guards never runs. Printed, it is one of two falsy values.
            return Value(left.data() | right.data(), right.const)
        return _union(left, right)

    def expr_Or(self, node: nodes.Or) -> Value:
        left = self.expr(node.left)
        truth = _truth(left)
        if truth is True:
            return left
        right = self.expr(node.right)
        if truth is False:
            return right
        return _either(left, right)

    def expr_Not(self, node: nodes.Not) -> Value:
        value = _presence_of_next(self.expr(node.node))
        truth = _truth(value)
        return Value(const=not truth) if truth is not None else Value(value.data())

    def expr_CondExpr(self, node: nodes.CondExpr) -> Value:
        test = self.expr(node.test)
        truth = _truth(test)
        if truth is True:
            return self.expr(node.expr1)
        if truth is False:
            return self.expr(node.expr2) if node.expr2 is not None else Value(const="")
        self.controls.append(Control(node, test.data()))
        try:
            first = self.expr(node.expr1)
            second = self.expr(node.expr2) if node.expr2 is not None else NOTHING
        finally:
            self.controls.pop()
        return Value(_either(first, second).labels | test.data())

    def expr_Compare(self, node: nodes.Compare) -> Value:
        values = [self.expr(node.expr)] + [self.expr(operand.expr) for operand in node.ops]
        if all(value.known and value.const is not UNDEFINED for value in values):
            folded = _fold_compare(values[0].const, [(op.op, value.const) for op, value in zip(node.ops, values[1:])])
            if folded is not None:
                return Value(const=folded)
        compared = self.positions_compared(_union(*values))
        inner = self.before_current(node, values)
        return Value(compared.labels | {Label(LabelKind.BEFORE_CURRENT, loop=inner)}, compared.const) if inner else compared

    def before_current(self, node: nodes.Compare, values: list[Value]) -> int | None:
        """The inner message loop ``inner.index < outer.index`` restricts to the messages
        before the outer loop's current one, if the comparison is that."""
        message_loops = [loop.loop for loop in self.loops if loop.over_messages]
        if len(node.ops) != 1 or len(message_loops) < 2:
            return None
        inner, outer = message_loops[-1], set(message_loops[:-1])
        left, right = values
        if node.ops[0].op in ("gt", "gteq"):
            left, right = right, left
        elif node.ops[0].op not in ("lt", "lteq"):
            return None

        def indexes(value: Value) -> set[int]:
            return {label.loop for label in value.labels if label.kind is LabelKind.LOOP_INDEX}

        return inner if indexes(left) == {inner} and indexes(right) and indexes(right) <= outer else None

    def expr_BinExpr(self, node: nodes.BinExpr) -> Value:
        left, right = self.expr(node.left), self.expr(node.right)
        if left.known and right.known and UNDEFINED not in (left.const, right.const):
            try:
                return Value(const=_fold_binary(node.operator, left.const, right.const))
            except Exception:
                pass
        if isinstance(node, nodes.Add) and (left.has(LabelKind.MESSAGES) or right.has(LabelKind.MESSAGES)):
            # Messages joined with more messages (`ns.msgs + [message]`, Mistral's
            # `loop_messages + [{'role': '__sentinel__'}]`) are still a list of messages.
            return Value(_union(left, right).labels | {Label(LabelKind.MESSAGES)})
        return _union(left, right)

    def expr_List(self, node: nodes.List) -> Value:
        """A list literal: with a message in it (`[message]`, or a dict literal with a role,
        as a template merging messages writes one), a list of messages, which a namespace copy
        of the messages is built from."""
        items = [self.expr(item) for item in node.items]
        merged = _union(*items)
        if any(item.has(LabelKind.MESSAGE) or (isinstance(item.const, Record) and "role" in item.const) for item in items):
            return Value(merged.labels | {Label(LabelKind.MESSAGES)})
        return merged

    def expr_Neg(self, node: nodes.Neg) -> Value:
        value = self.expr(node.node)
        if isinstance(value.const, (int, float)) and not isinstance(value.const, bool):
            return Value(const=-value.const)
        return Value(value.data())

    def expr_Concat(self, node: nodes.Concat) -> Value:
        values = [self.expr(child) for child in node.nodes]
        strings = all(value.known and isinstance(value.const, str) for value in values)
        if strings and sum(len(value.const) for value in values) <= MAX_FOLDED_ITEMS:
            return Value(const="".join(value.const for value in values))
        return _union(*values)


def _presence_of_next(value: Value) -> Value:
    """A test of whether the next message is there at all (`messages[loop.index] if not
    loop.last else none`, then `is none`, `not nxt`): the look-ahead decides, not a field of
    that message (a role that closes a group, which PC003 leaves alone), so the `loop.last`
    guarding the read is not taken for one paired with such a field."""
    if not (value.has(LabelKind.MESSAGE) and value.has(LabelKind.NEXT) and value.has(LabelKind.LAST)):
        return value
    return Value(frozenset(label for label in value.labels if label.kind is not LabelKind.LAST), value.const)


def _as_positions(labels: frozenset[Label]) -> frozenset[Label]:
    if not any(label.kind is LabelKind.SCAN_FLAG for label in labels):
        return labels
    return frozenset(
        Label(LabelKind.SCAN_POSITION, label.site, label.name, label.loop, label.origin)
        if label.kind is LabelKind.SCAN_FLAG
        else label
        for label in labels
    )


def _is_field(operand: nodes.Node, target: nodes.NSRef) -> bool:
    """``ns.n`` read where ``{% set ns.n = ... %}`` writes it."""
    return (
        isinstance(operand, nodes.Getattr)
        and isinstance(operand.node, nodes.Name)
        and (operand.node.name, operand.attr) == (target.name, target.attr)
    )


def _increments(node: nodes.Node, target: nodes.NSRef) -> bool:
    """``{% set ns.n = ns.n + 1 %}``: the field counts up by a number."""
    if not isinstance(node, nodes.Assign) or not isinstance(node.node, nodes.Add):
        return False
    operands = (node.node.left, node.node.right)
    own = [operand for operand in operands if _is_field(operand, target)]
    numbers = [
        operand
        for operand in operands
        if isinstance(operand, nodes.Const) and isinstance(operand.value, int) and not isinstance(operand.value, bool)
    ]
    return len(own) == 1 and len(numbers) == 1


def _accumulates(node: nodes.Node, target: nodes.NSRef) -> bool:
    """``{% set ns.out = ns.out + ... %}``: the field is built up from its own value (text or
    a list, not a number)."""
    if not isinstance(node, nodes.Assign) or not isinstance(node.node, (nodes.Add, nodes.Concat)):
        return False
    operands, pending = [], [node.node]
    while pending:
        operand = pending.pop()
        if isinstance(operand, nodes.Add):
            pending += [operand.left, operand.right]
        elif isinstance(operand, nodes.Concat):
            pending += operand.nodes
        else:
            operands.append(operand)
    own = [operand for operand in operands if _is_field(operand, target)]
    others = [operand for operand in operands if operand not in own]
    numeric = all(isinstance(operand, nodes.Const) and isinstance(operand.value, (int, float)) for operand in others)
    return bool(own) and not numeric


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
                    walk(body, loops, _roles(test) or roles)
                    taken |= _roles(test, exact=True) or set()
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
            yield from [child.data] if isinstance(child, nodes.TemplateData) else _literal_strings(child)
    elif isinstance(statement, nodes.If):
        for body in [statement.body, *(e.body for e in statement.elif_), statement.else_]:
            for inner in body:
                yield from _printed_text(inner)


def _roles(test: nodes.Node, exact: bool = False, subject: str | None = None) -> frozenset[str] | None:
    """The message roles a test admits, where it compares a ``.role`` (of ``subject``, when
    given) with constants; ``exact``: only where it admits every message of those roles."""
    if isinstance(test, nodes.And):
        if exact:
            return None
        left, right = _roles(test.left, subject=subject), _roles(test.right, subject=subject)
        return left & right if left is not None and right is not None else left or right
    if isinstance(test, nodes.Or):
        left, right = _roles(test.left, exact, subject), _roles(test.right, exact, subject)
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
    return subject is None or (isinstance(node.node, nodes.Name) and node.node.name == subject)


def _keeps_first(loop: LoopRef, assignment: nodes.Node, source_map: SourceMap) -> bool:
    """Whether a position assigned in ``loop`` ends as the first match in message order (a
    forward loop that stops at its match, a backward one that does not): appending
    messages does not move it, once there is a match."""
    return loop.backwards != (id(assignment) in loop.assigned_once(source_map))


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


def _backwards(iterable: nodes.Node) -> bool:
    """Whether a loop's iterable runs from the last item to the first."""
    while isinstance(iterable, nodes.Filter) and iterable.node is not None:
        if iterable.name == "reverse":
            return True
        if iterable.name not in ("list", "selectattr", "rejectattr", "select", "reject"):
            return False
        iterable = iterable.node
    if isinstance(iterable, nodes.Getitem) and isinstance(iterable.arg, nodes.Slice):
        return _negative(iterable.arg.step)
    if _is_range(iterable) and len(iterable.args) == 3:
        return _negative(iterable.args[2])
    return False


def _reads_from_the_end(loop: nodes.For) -> bool:
    """Whether a forward loop reads the messages from the last to the first: its body takes
    ``messages[(messages|length - 1) - loop.index0]`` (unsloth's Qwen3, for engines without
    ``[::-1]``), directly or through a name it sets to that index."""

    def from_the_end(index: nodes.Node) -> bool:
        if not isinstance(index, nodes.Sub):
            return False
        counts = any(isinstance(n, nodes.Filter) and n.name in ("length", "count") for n in index.left.find_all(nodes.Filter))
        counts = counts or (isinstance(index.left, nodes.Filter) and index.left.name in ("length", "count"))
        right = [index.right, *index.right.find_all(nodes.Getattr)]
        stepped = any(
            isinstance(n, nodes.Getattr)
            and isinstance(n.node, nodes.Name)
            and n.node.name == "loop"
            and n.attr.startswith("index")
            for n in right
        )
        return counts and stepped

    statements = [statement for statement in loop.body if isinstance(statement, nodes.Assign)]
    indices = {
        statement.target.name
        for statement in statements
        if isinstance(statement.target, nodes.Name) and from_the_end(statement.node)
    }
    for statement in statements:
        read = statement.node
        indexed = isinstance(read, nodes.Getitem) and isinstance(read.node, nodes.Name) and read.node.name == "messages"
        if indexed and (from_the_end(read.arg) or (isinstance(read.arg, nodes.Name) and read.arg.name in indices)):
            return True
    return False


def _negative(node: nodes.Node | None) -> bool:
    if isinstance(node, nodes.Neg):
        return isinstance(node.node, nodes.Const) and isinstance(node.node.value, (int, float)) and node.node.value > 0
    return isinstance(node, nodes.Const) and isinstance(node.value, (int, float)) and node.value < 0


def _handlers(prefix: str) -> dict[type, object]:
    """Handlers by node class: ``stmt_Output`` handles exactly ``nodes.Output`` (a dict lookup,
    where building the method name for every node cost a tenth of the analysis)."""
    return {
        getattr(nodes, name[len(prefix) :]): handler
        for name, handler in vars(_Interpreter).items()
        if name.startswith(prefix) and isinstance(getattr(nodes, name[len(prefix) :], None), type)
    }


_STATEMENTS = _handlers("stmt_")


def _skips_rest(node: nodes.If) -> bool:
    """Whether a branch of the ``if`` ends with `{% continue %}` or `{% break %}`: what
    follows it in the loop body runs only where that branch is not taken."""
    bodies = [node.body, *(branch.body for branch in node.elif_), node.else_]
    return any(body and type(body[-1]) in (nodes.Continue, nodes.Break) for body in bodies)


_EXPRESSIONS = _handlers("expr_")
# The parser never makes a bare BinExpr, only its operator classes; without these entries
# `{% set n = 2 * 3 %}` or `range(4 - 1)` fell through to the generic union and never folded.
_EXPRESSIONS.update(
    dict.fromkeys(
        (nodes.Add, nodes.Sub, nodes.Mul, nodes.Div, nodes.FloorDiv, nodes.Mod, nodes.Pow),
        _Interpreter.expr_BinExpr,
    )
)


def _merge_labels(value: Value, *others: Value) -> Value:
    return Value(value.labels | _union(*others).labels)


def _literal_strings(node: nodes.Node) -> list[str]:
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
            parts.extend(_literal_strings(child))
        return parts
    return []


def only_literals(node: nodes.Node | None) -> bool:
    """Whether ``node`` prints nothing but its string literals: literals joined, or chosen
    between by a test."""
    if node is None:  # `"x" if test` with no else prints nothing otherwise
        return True
    if isinstance(node, nodes.Const):
        return isinstance(node.value, str)
    if isinstance(node, nodes.CondExpr):
        return only_literals(node.expr1) and only_literals(node.expr2)
    if isinstance(node, (nodes.Add, nodes.Concat)):
        return all(only_literals(child) for child in child_nodes(node))
    return False


def _is_range(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and node.node.name == "range"


def _root(scope: _Scope) -> _Scope:
    while scope.parent is not None:
        scope = scope.parent
    return scope


def _declared_names(facts: Facts) -> set[str]:
    names = {node.name for node in facts.nodes_of(nodes.Name) if node.ctx in ("store", "param")}
    names |= {node.name for node in facts.nodes_of(nodes.Macro)}
    return names


def _namespace_loops(tree: nodes.Template) -> set[int]:
    """The ids of the loops that hold a ``{% set ns.attr = ... %}``: the only place jinja's
    parser puts a namespace reference (``NSRef``) is the target of a ``set``, so the walk
    visits statements only, not the expressions under them (most of the tree), and without
    recursion: templates nest deeper than Python's stack."""
    found: set[int] = set()
    stack: list[tuple[nodes.Node, tuple[int, ...]]] = [(tree, ())]
    while stack:
        node, loops = stack.pop()
        if isinstance(node, (nodes.Assign, nodes.AssignBlock)) and isinstance(node.target, nodes.NSRef):
            found.update(loops)
        if isinstance(node, nodes.For):
            loops = (*loops, id(node))
        stack.extend((child, loops) for child in child_nodes(node) if isinstance(child, nodes.Stmt))
    return found


_BINARY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b if not isinstance(a, str) else _raise(),  # '%0999999999d' % 1
    "**": lambda a, b: a**b if abs(b) < 64 else _raise(),
}
# Folding is analysis, not rendering: a constant larger than this is left unknown, so that
# `'a' * 10**9` or a string doubled by each of forty `{% set %}`s costs nothing here.
MAX_FOLDED_ITEMS = 100_000
MAX_FOLDED_BITS = 100_000


def _fold_binary(operator: str, left: object, right: object) -> object:
    sized = (str, list, tuple)
    if operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        if len(left) + len(right) > MAX_FOLDED_ITEMS:
            _raise()
    elif operator == "*":
        for sequence, count in ((left, right), (right, left)):
            if isinstance(sequence, sized) and isinstance(count, int) and len(sequence) * abs(count) > MAX_FOLDED_ITEMS:
                _raise()
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_FOLDED_BITS:
            _raise()
    elif (
        operator == "**" and isinstance(left, int) and isinstance(right, int) and left.bit_length() * abs(right) > MAX_FOLDED_BITS
    ):
        _raise()
    return _BINARY[operator](left, right)


_FOLDABLE_FILTERS = {
    "string": str,
    "lower": lambda v: v.lower(),
    "upper": lambda v: v.upper(),
    "trim": lambda v: v.strip(),
    "length": len,
    "bool": bool,
    "int": int,
}


def _raise():
    raise ValueError("too large")


_TESTS = {
    "none": lambda value, args: value is None,
    "true": lambda value, args: value is True,
    "false": lambda value, args: value is False,
    "boolean": lambda value, args: isinstance(value, bool),
    "string": lambda value, args: isinstance(value, str),
    "number": lambda value, args: isinstance(value, (int, float)) and not isinstance(value, bool),
    "integer": lambda value, args: isinstance(value, int) and not isinstance(value, bool),
    "mapping": lambda value, args: isinstance(value, dict),
    "equalto": lambda value, args: value == args[0],
    "eq": lambda value, args: value == args[0],
    "sameas": lambda value, args: value is args[0],
}


def _fold_test(name: str, value: object, args: list[object]) -> bool | None:
    test = _TESTS.get(name)
    if test is None or isinstance(value, (MacroRef, GlobalRef, NamespaceRef, LoopRef)):
        return None
    try:
        return bool(test(value, args))
    except Exception:
        return None


_COMPARISONS = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "lteq": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "gteq": lambda a, b: a >= b,
    "in": lambda a, b: a in b,
    "notin": lambda a, b: a not in b,
}


def _fold_compare(first: object, ops: list[tuple[str, object]]) -> bool | None:
    operators = _COMPARISONS
    left = first
    try:
        for op, right in ops:
            if isinstance(left, (MacroRef, GlobalRef, NamespaceRef, LoopRef)) or op not in operators:
                return None
            if not operators[op](left, right):
                return False
            left = right
    except Exception:
        return None
    return True
