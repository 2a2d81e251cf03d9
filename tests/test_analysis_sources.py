"""The analysis labels the calls and filters the rules declare, and knows nothing of what
they mean: a function or filter no rule declares is followed like any other value, and one
declared is labelled by its name wherever the template calls it (issue 36: rules declare
what they match)."""

from __future__ import annotations

from datetime import date

import pytest
from jinja2 import nodes

from tmpl_lint.analysis.facts import Facts, Label, LabelKind, Sources
from tmpl_lint.analysis.interpreter import analyze
from tmpl_lint.analysis.values import UNDEFINED
from tmpl_lint.checker import SwitchTrials
from tmpl_lint.rules import SOURCES, STATIC, lookup

pytestmark = pytest.mark.no_fork

ROLL = Sources(calls=frozenset({"roll"}), filters=frozenset({"jumble"}))


def printed(facts: Facts, kind: LabelKind) -> set[tuple[str | None, str, int]]:
    """(name, the call or filter as the source writes it, line) of each label of ``kind`` printed."""
    return {
        (label.name, label.site.text, label.site.line)
        for sink in facts.sinks
        for label in sink.all_labels()
        if label.kind is kind and isinstance(label, Label) and label.site is not None
    }


def test_nothing_declared_nothing_labelled():
    facts = analyze("{{ strftime_now('%Y') }}{{ ['a', 'b'] | random }}{{ lipsum(1) }}")
    assert printed(facts, LabelKind.CALL) == printed(facts, LabelKind.FILTER) == set()
    assert facts.call_arguments == {}


def test_a_declared_function_is_labelled_by_its_name_wherever_it_is_called():
    source = (
        "{{ roll('%d') }}\n"  # called by its name
        "{% set r = roll %}{{ r('x') }}\n"  # through a name it was set to
        "{% set ns = namespace(f=roll) %}{{ ns.f() }}\n"  # out of a namespace
        "{% set fmt = 'y' %}{{ [roll][0](fmt) }}\n"  # out of a list, its argument folded
        "{{ ['a'] | jumble }}{{ ['a'] | random }}"
    )
    facts = analyze(source, sources=ROLL)
    assert printed(facts, LabelKind.CALL) == {("roll", "roll", 1), ("roll", "r", 2), ("roll", "ns.f", 3), ("roll", "List[0]", 4)}
    assert printed(facts, LabelKind.FILTER) == {("jumble", "|jumble", 5)}
    arguments = {call.lineno: facts.call_arguments.get(id(call)) for call in facts.nodes_of(nodes.Call)}
    assert arguments == {1: "%d", 2: "x", 3: None, 4: "y"}


def test_a_declared_name_the_template_defines_or_is_passed_is_not_the_function():
    defined = analyze("{% macro roll(n) %}6{% endmacro %}{{ roll(1) }}", sources=ROLL)
    passed = analyze("{{ roll(1) }}", assumptions={"roll": "six"}, sources=ROLL)
    assert printed(defined, LabelKind.CALL) == printed(passed, LabelKind.CALL) == set()


def test_the_registry_labels_what_each_rule_declares():
    clock, random = lookup("PC001"), lookup("PC005")
    assert clock is not None and random is not None
    assert clock.RULE.sources == Sources(
        frozenset({"strftime_now", "now", "today", "utcnow", "datetime_now", "current_date", "current_time", "get_current_date"})
    )
    assert random.RULE.sources == Sources(frozenset({"lipsum"}), frozenset({"random", "shuffle"}))
    # no other rule declares any: the analysis labels these and nothing else
    assert (SOURCES.calls, SOURCES.filters) == (clock.RULE.sources.calls | {"lipsum"}, {"random", "shuffle"})


def test_a_date_like_switch_is_tried_with_a_date_in_the_templates_own_clock_format():
    source = (
        "{% if date_string is not defined %}{% set date_string = strftime_now('%d %b %Y') %}{% endif %}"
        "Today: {{ date_string }}{% if enable_thinking %}<think>{% endif %}"
    )
    facts = analyze(source, sources=SOURCES)
    trials = SwitchTrials(facts, STATIC, [])
    assert trials.values("date_string") == [UNDEFINED, date.today().strftime("%d %b %Y")]
    assert trials.values("enable_thinking") == [UNDEFINED, True, False]
