"""One walk over a parsed template, and fast child lists.

jinja2's ``Node.find_all`` and ``iter_child_nodes`` are generators stacked on generators
(``iter_fields`` checks its filters for every field of every node); walking a tree with
them cost a third of the analysis. ``TreeIndex`` walks the tree once, without recursion
(templates can nest deeper than Python's stack), and answers the analysis' questions
about it (nodes of a type, in ``find_all``'s order; does a subtree hold a node of a type)
by lookup.
"""

from __future__ import annotations

import bisect

from jinja2 import nodes


def child_nodes(node: nodes.Node) -> list[nodes.Node]:
    """``list(node.iter_child_nodes())``, without its generators."""
    children = []
    for name in node.fields:
        item = getattr(node, name, None)
        if isinstance(item, list):
            children.extend(child for child in item if isinstance(child, nodes.Node))
        elif isinstance(item, nodes.Node):
            children.append(item)
    return children


class TreeIndex:
    """Every node of a tree in document order (``find_all``'s), grouped by type."""

    def __init__(self, tree: nodes.Node):
        order: list[nodes.Node] = []
        end: list[int] = []  # per node: the index just past its subtree in ``order``
        by_type: dict[type, list[int]] = {}
        Node = nodes.Node
        stack: list = [tree]
        while stack:
            node = stack.pop()
            if type(node) is int:  # leaving the subtree of order[node]
                end[node] = len(order)
                continue
            index = len(order)
            order.append(node)
            end.append(index + 1)
            kind = type(node)
            if kind in by_type:
                by_type[kind].append(index)
            else:
                by_type[kind] = [index]
            stack.append(index)
            children = []
            for name in node.fields:
                item = getattr(node, name, None)
                if isinstance(item, list):
                    children.extend(child for child in item if isinstance(child, Node))
                elif isinstance(item, Node):
                    children.append(item)
            children.reverse()
            stack.extend(children)
        self._order = order
        self._end = end
        self._position = {id(node): index for index, node in enumerate(order)}
        self._by_type = by_type
        self._of_kind: dict[type, list[int]] = {}

    def _indices(self, kind: type) -> list[int]:
        if kind not in self._of_kind:
            found = (index for node_type, indices in self._by_type.items() if issubclass(node_type, kind) for index in indices)
            self._of_kind[kind] = sorted(found)
        return self._of_kind[kind]

    def find_all(self, kind: type) -> list[nodes.Node]:
        """``tree.find_all(kind)``: the nodes below the root that are a ``kind``, in order."""
        return [self._order[index] for index in self._indices(kind) if index > 0]

    def contains(self, node: nodes.Node, kind: type) -> bool:
        """``any(node.find_all(kind))`` for a node of this tree."""
        start = self._position[id(node)]
        indices = self._indices(kind)
        first = bisect.bisect_right(indices, start)
        return first < len(indices) and indices[first] < self._end[start]
