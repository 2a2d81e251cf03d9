"""Constant folding: operators, filters, tests and comparisons on known constants, bounded
in the size of what they build."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .values import GlobalRef, LoopRef, MacroRef, NamespaceRef

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


def fold_binary(operator: str, left: object, right: object) -> object:
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


FOLDABLE_FILTERS: dict[str, Callable[[Any], Any]] = {
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


def fold_test(name: str, value: object, args: list[object]) -> bool | None:
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


def fold_compare(first: object, ops: list[tuple[str, object]]) -> bool | None:
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
