"""The abstract interpreter: one pass over a template's Jinja AST that builds the facts
every rule queries.

The pass is an abstract interpretation: each expression evaluates to a ``Value``, the set
of ``Label``s saying what it depends on (a call of a global function or a filter a rule
declares, the number of messages, a scan over all messages, a template variable...) plus a
constant when one is known. Labels flow through ``{% set %}``, namespaces, macros, loop
variables and filters; a ``{{ ... }}`` that prints a value, or prints anything under a
condition, is a ``Sink`` that records the labels of what it prints and of every decision that
led to it. Rules then ask questions of the sinks: does a call of `strftime_now` reach output,
does a message's render depend on where the last user query is.

Known constants fold (``and``/``or`` short-circuit, ``if`` takes one branch; see folding.py),
which is how a switch is checked: analyse again with ``clear_thinking=False`` and see whether
the finding is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from jinja2 import nodes

from ..jinja_env import PARSE_ENVIRONMENT
from .facts import (
    KNOWN_GLOBALS,
    LIST_FILTERS,
    LOOP_LAST_ATTRS,
    NO_SOURCES,
    SCANS,
    Control,
    Facts,
    JsonUse,
    Label,
    LabelKind,
    Sink,
    Sources,
    expression_text,
    printed_literals,
    tested_roles,
)
from .folding import FOLDABLE_FILTERS, MAX_FOLDED_ITEMS, fold_binary, fold_compare, fold_test
from .locations import SourceMap, child_nodes
from .parsing import parse
from .reuse import Trace, top_level_scan
from .values import (
    NOTHING,
    UNDEFINED,
    UNKNOWN,
    GlobalRef,
    LoopRef,
    MacroRef,
    NamespaceRef,
    Record,
    Value,
    after_branch,
    either_of,
    merge_labels,
    truth_of,
    union_of,
)


def analyze(
    text: str,
    tree: nodes.Template | None = None,
    source_map: SourceMap | None = None,
    assumptions: Mapping[str, object] | None = None,
    *,
    record: bool = False,
    reusing: Sequence[Trace] = (),
    sources: Sources = NO_SOURCES,
) -> Facts:
    """The facts of one pass. ``record`` keeps the states between top-level statements
    (``facts.trace``); an analysis under one assumption ``reusing`` other analyses' traces
    takes over the statements the assumption leaves as they were there (see Trace).
    ``sources``: the calls and filters to label (the rules' registry's ``SOURCES``)."""
    error = None
    if tree is None:
        tree, error = parse(text)
    if source_map is None:
        source_map = SourceMap(text, PARSE_ENVIRONMENT, tree)
    facts = Facts(text, tree, source_map, error, assumptions=dict(assumptions or {}), sources=sources)
    if tree is not None:
        if record:
            facts.trace = Trace(facts)
        try:
            Interpreter(facts).run(tree, reusing)
        except RecursionError:
            facts.too_deep = True  # what was recorded before stands; the rest is not analysed
            facts.trace = None
    return facts


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


class Interpreter:
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
        tree = facts.tree
        assert tree is not None, "only a parsed template is interpreted"
        self.namespace_loops = facts.source_map.memo("namespace_loops", lambda: _namespace_loops(tree))
        self.literals: dict[int, list[str]] = facts.source_map.memo("literal_strings", dict)
        self.test_roles: dict[tuple, tuple] = facts.source_map.memo("test_roles", dict)

    # -- statements ------------------------------------------------------------------

    def run(self, tree: nodes.Template, reusing: Sequence[Trace] = ()) -> None:
        trace = self.facts.trace
        assumed = list(self.facts.assumptions)
        if len(assumed) != 1:
            reusing = ()
        own: Label | None = None
        if reusing:
            own = Label(LabelKind.VARIABLE, name=assumed[0])
            reusing = [other for other in reusing if other.usable_for(own)]
        if trace is None and not reusing:
            self.block(tree.body)
            return
        reads = top_level_scan(self.facts)[0] if reusing else ()
        for index, statement in enumerate(tree.body):
            if trace is not None:
                trace.record(self)
            other = None if own is None else next((o for o in reusing if o.matches(self, index, reads[index], own)), None)
            if other is not None and own is not None:
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
        """``printed_literals(node)``, worked out once for every analysis of the template."""
        strings = self.literals.get(id(node))
        if strings is None:
            strings = self.literals[id(node)] = printed_literals(node)
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
        accumulated = {label.loop for label in labels if label.kind is LabelKind.ACCUMULATED and label.loop is not None}
        loops += tuple(sorted(accumulated - set(loops)))
        roles = frozenset.intersection(*self.roles) if self.roles else None
        self.facts.sinks.append(Sink(node, labels, tuple(self.controls), loops, text, roles, unknown))

    def stmt_Assign(self, node: nodes.Assign) -> None:
        self.assign(node.target, self.expr(node.node), node)

    def stmt_AssignBlock(self, node: nodes.AssignBlock) -> None:
        captured = self.capture(node.body)
        if node.filter is not None:
            captured = union_of(captured, self.expr_filter_chain(node.filter))
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
                value = after_branch(self.namespaces.get(key), value)
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
            truth = truth_of(value)
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
        """``tested_roles`` of a test, and its exact roles: worked out once for every analysis."""
        key = (id(test), subject)
        found = self.test_roles.get(key)
        if found is None:
            found = self.test_roles[key] = (tested_roles(test, subject=subject), tested_roles(test, exact=True, subject=subject))
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
                merged_vars[key] = after_branch(merged_vars.get(key), value) if key in merged_vars else value
            assigned_ns = [(key, value) for key, value in namespaces.items() if before_ns.get(key) is not value]
            for field_key, value in assigned_ns:
                merged_ns[field_key] = after_branch(merged_ns.get(field_key), value) if field_key in merged_ns else value
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
                self.namespaces[key] = after_branch(before_ns.get(key), value) if key in before_ns else Value(value.labels)
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
        return union_of(*(self.expr(child) for child in child_nodes(node) if isinstance(child, nodes.Expr)))

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
            if name in self.facts.sources.calls:  # the function itself, which a list or a namespace may hold
                return Value(frozenset({Label(LabelKind.FUNCTION, name=name)}), GlobalRef(name))
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
        return Value(const=Record((cast(nodes.Const, pair.key).value, self.expr(pair.value)) for pair in node.items))

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
            labels = set(base.labels) | set(union_of(*bounds).labels)
            if base.has(LabelKind.MESSAGES) and arg.start is not None and self.mentions_current_index(arg.start):
                labels.add(Label(LabelKind.LOOKAHEAD, self.facts.site(node, expression_text(node.node) + "[...:]")))
            elif base.has(LabelKind.MESSAGES) and _negative(arg.start) and not _negative(arg.step):
                # A window on the last messages (`messages[-4:]`): each new message pushes the
                # oldest out, so what the prompt starts with depends on how many follow.
                # _negative: a negative constant, written -4 (Neg of a Const) or folded (a Const)
                start = (
                    cast(nodes.Const, arg.start.node).value
                    if isinstance(arg.start, nodes.Neg)
                    else -cast(nodes.Const, arg.start).value
                )
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
            return Value(union_of(base, key).labels | {Label(LabelKind.TOOL_CALL)})
        return union_of(base, key)

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
            called = self.sources_called(held) if held is not None else frozenset()
            if called:
                return self.source_call(node, func, args, kwargs, called)
            if func.attr == "get" and args:
                if isinstance(base.const, (NamespaceRef, LoopRef)):
                    return NOTHING
                key = args[0].const
                if isinstance(key, str):
                    return merge_labels(self.member(base, key), *args[1:])
            return union_of(base, *args, *kwargs.values(), *extra)
        if isinstance(func, nodes.Name) and self.undefined_source(func.name):
            return self.source_call(node, func, args, kwargs, frozenset({func.name}))
        callee = self.expr(func)
        target = callee.const
        called = self.sources_called(callee)
        if called:
            # Called through a name it was set to (`{% set clock = strftime_now %}`), or read
            # out of a list (`clocks[0](...)`).
            return self.source_call(node, func, args, kwargs, called)
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
        return union_of(callee, *args, *kwargs.values(), *extra)

    def source_call(
        self, node: nodes.Call, func: nodes.Expr, args: list[Value], kwargs: dict[str, Value], called: frozenset[str]
    ) -> Value:
        """A call of a global function a rule matches (one of ``called``, where the value
        called may hold either): labelled with the function's name where it is called
        (``func``, as the source writes it), its one argument recorded where that folds to one
        string. It returns what its arguments depend on, and nothing of the value called."""
        text = expression_text(func)
        argument = args[0].const if len(args) == 1 and not kwargs and isinstance(args[0].const, str) else None
        calls = self.facts.call_arguments
        if id(node) in calls and calls[id(node)] != argument:
            argument = None  # a loop run twice, or branches, gave it two arguments
        calls[id(node)] = argument
        site = self.facts.site(func, text)
        return Value(frozenset(Label(LabelKind.CALL, site, name) for name in called) | union_of(*args).labels)

    def sources_called(self, callee: Value) -> frozenset[str]:
        """The global functions a rule matches that a value called may be: a known global
        (`strftime_now`, also read out of a list or a namespace that holds it), or a name the
        template neither defines nor is passed (`now`)."""
        if isinstance(callee.const, GlobalRef):
            return frozenset({callee.const.name}) & self.facts.sources.calls
        return frozenset(
            label.name
            for label in callee.labels
            if label.name is not None
            and (label.kind is LabelKind.FUNCTION or (label.kind is LabelKind.VARIABLE and self.undefined_source(label.name)))
        )

    def undefined_source(self, name: str) -> bool:
        """Whether ``name`` is a global function a rule matches that the template neither
        defines nor is passed."""
        return (
            name in self.facts.sources.calls
            and name not in self.facts.source_map.memo("declared", lambda: _declared_names(self.facts))
            and name not in self.facts.assumptions
        )

    def call_macro(self, macro: nodes.Macro, args: list[Value], kwargs: dict[str, Value]) -> Value:
        key = (id(macro), tuple(value.labels for value in args), tuple(sorted((k, v.labels) for k, v in kwargs.items())))
        if key in self.macro_cache:
            return self.macro_cache[key]
        if self.macro_depth >= self.MAX_MACRO_DEPTH:
            return union_of(*args, *kwargs.values())
        self.macro_cache[key] = union_of(*args, *kwargs.values())  # recursion sees the arguments only
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
            return either_of(value, fallback)
        if name == "tojson":
            self.facts.json_uses.append(JsonUse(node, value.labels, tuple(self.controls)))
            return union_of(value, *args)
        if name in self.facts.sources.filters:
            site = self.facts.site(node, f"|{name}")
            return Value(value.data() | {Label(LabelKind.FILTER, site, name)})
        if value.has(LabelKind.MESSAGES):
            subject = node.node
            assert subject is not None, "a filter applied to a value has a subject (expr_Filter)"
            site = self.facts.site(subject, f"{expression_text(subject)}|{name}")
            if name in ("length", LabelKind.COUNT):
                return Value(value.data() | {Label(LabelKind.COUNT, site)})
            if name == "last":
                return Value(value.data() | {Label(LabelKind.LAST, site), Label(LabelKind.MESSAGE)})
            if name == "first":
                return Value(value.data() | {Label(LabelKind.MESSAGE), Label(LabelKind.FIRST_MESSAGE)})
            if name in LIST_FILTERS:
                return Value(value.labels | union_of(*args).labels)
        if value.known and not args and name in FOLDABLE_FILTERS and not isinstance(value.const, Record):
            try:
                return Value(const=FOLDABLE_FILTERS[name](value.const))
            except Exception:
                pass
        return union_of(value, *args)

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
            folded = fold_test(name, value.const, [arg.const for arg in args])
            if folded is not None:
                return Value(const=folded)
        if name in ("none", "defined", "undefined"):
            value = _presence_of_next(value)
        labels = set(union_of(value, *args).labels)
        if name == "string" and value.has(LabelKind.TOOL_ARGS):
            labels.add(Label(LabelKind.STRING_GUARD))
        return Value(frozenset(labels))

    def expr_And(self, node: nodes.And) -> Value:
        left = self.expr(node.left)
        truth = truth_of(left)
        if truth is False:
            return left
        right = self.expr(node.right)
        if truth is True:
            return right
        if truth_of(right) is False:
            # False whichever side it returns (`is_after_last_user and thinking` with thinking
            # false): a branch it guards never runs. Printed, it is one of two falsy values.
            return Value(left.data() | right.data(), right.const)
        return union_of(left, right)

    def expr_Or(self, node: nodes.Or) -> Value:
        left = self.expr(node.left)
        truth = truth_of(left)
        if truth is True:
            return left
        right = self.expr(node.right)
        if truth is False:
            return right
        return either_of(left, right)

    def expr_Not(self, node: nodes.Not) -> Value:
        value = _presence_of_next(self.expr(node.node))
        truth = truth_of(value)
        return Value(const=not truth) if truth is not None else Value(value.data())

    def expr_CondExpr(self, node: nodes.CondExpr) -> Value:
        test = self.expr(node.test)
        truth = truth_of(test)
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
        return Value(either_of(first, second).labels | test.data())

    def expr_Compare(self, node: nodes.Compare) -> Value:
        values = [self.expr(node.expr)] + [self.expr(operand.expr) for operand in node.ops]
        if all(value.known and value.const is not UNDEFINED for value in values):
            folded = fold_compare(values[0].const, [(op.op, value.const) for op, value in zip(node.ops, values[1:])])
            if folded is not None:
                return Value(const=folded)
        compared = self.positions_compared(union_of(*values))
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
            return {label.loop for label in value.labels if label.kind is LabelKind.LOOP_INDEX and label.loop is not None}

        return inner if indexes(left) == {inner} and indexes(right) and indexes(right) <= outer else None

    def expr_BinExpr(self, node: nodes.BinExpr) -> Value:
        left, right = self.expr(node.left), self.expr(node.right)
        if left.known and right.known and UNDEFINED not in (left.const, right.const):
            try:
                return Value(const=fold_binary(node.operator, left.const, right.const))
            except Exception:
                pass
        if isinstance(node, nodes.Add) and (left.has(LabelKind.MESSAGES) or right.has(LabelKind.MESSAGES)):
            # Messages joined with more messages (`ns.msgs + [message]`, Mistral's
            # `loop_messages + [{'role': '__sentinel__'}]`) are still a list of messages.
            return Value(union_of(left, right).labels | {Label(LabelKind.MESSAGES)})
        return union_of(left, right)

    def expr_List(self, node: nodes.List) -> Value:
        """A list literal: with a message in it (`[message]`, or a dict literal with a role,
        as a template merging messages writes one), a list of messages, which a namespace copy
        of the messages is built from."""
        items = [self.expr(item) for item in node.items]
        merged = union_of(*items)
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
        texts = [value.const for value in values if value.known and isinstance(value.const, str)]
        if len(texts) == len(values) and sum(len(text) for text in texts) <= MAX_FOLDED_ITEMS:
            return Value(const="".join(texts))
        return union_of(*values)


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
    operands: list[nodes.Expr] = []
    pending: list[nodes.Expr] = [node.node]
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


def _keeps_first(loop: LoopRef, assignment: nodes.Node, source_map: SourceMap) -> bool:
    """Whether a position assigned in ``loop`` ends as the first match in message order (a
    forward loop that stops at its match, a backward one that does not): appending
    messages does not move it, once there is a match."""
    return loop.backwards != (id(assignment) in loop.assigned_once(source_map))


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
    if _is_range(iterable) and isinstance(iterable, nodes.Call) and len(iterable.args) == 3:
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
        if not (isinstance(read, nodes.Getitem) and isinstance(read.node, nodes.Name) and read.node.name == "messages"):
            continue
        if from_the_end(read.arg) or (isinstance(read.arg, nodes.Name) and read.arg.name in indices):
            return True
    return False


def _negative(node: nodes.Node | None) -> bool:
    if isinstance(node, nodes.Neg):
        return isinstance(node.node, nodes.Const) and isinstance(node.node.value, (int, float)) and node.node.value > 0
    return isinstance(node, nodes.Const) and isinstance(node.value, (int, float)) and node.value < 0


def _handlers(prefix: str) -> dict[type, Callable[..., Any]]:
    """Handlers by node class: ``stmt_Output`` handles exactly ``nodes.Output`` (a dict lookup
    per node, rather than building a method name for every node visited)."""
    return {
        getattr(nodes, name[len(prefix) :]): handler
        for name, handler in vars(Interpreter).items()
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
        Interpreter.expr_BinExpr,
    )
)


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
