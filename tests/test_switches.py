"""Switch trials: a trial that takes statements over from another analysis' trace finds
exactly what analysing the whole template again finds (the reference path,
``reanalyse=True``), on every shared template, the corpus fixtures and generated templates.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import CORPUS, SHARED_TEMPLATES, needs_shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tmpl_lint.analysis import analyze, parse_with_tokens
from tmpl_lint.checker import SwitchTrials, name_switches, run_rules
from tmpl_lint.jinja_env import PARSE_ENVIRONMENT
from tmpl_lint.locations import SourceMap
from tmpl_lint.rules import STATIC


def compare_paths(text: str) -> tuple[int, int]:
    """Asserts both paths agree on every trial and on the switches named; returns (trials
    run, statements the fast path took over)."""
    tree, _, raw = parse_with_tokens(text)
    assert tree is not None
    source_map = SourceMap(text, PARSE_ENVIRONMENT, tree, raw)
    facts = analyze(text, tree, source_map, record=True)
    fast = SwitchTrials(facts, STATIC, run_rules(facts, STATIC))
    reference = SwitchTrials(facts, STATIC, run_rules(facts, STATIC), reanalyse=True)
    trials = 0
    for name in sorted(set().union(*(finding.candidates for finding in fast.findings))):
        for value in fast.values(name):
            assert fast.keys(name, value) == reference.keys(name, value), (name, value)
            trials += 1
    assert reference.taken_over == 0
    with_reuse, whole = run_rules(facts, STATIC), run_rules(facts, STATIC)
    name_switches(with_reuse, fast)  # the trials above, and any a finding's own values add
    name_switches(whole, reference)
    assert [(f.key, f.switch, f.severity) for f in with_reuse] == [(f.key, f.switch, f.severity) for f in whole]
    return trials, fast.taken_over


@needs_shared
def test_shared_templates_trials_match_reanalysis():
    trials = taken_over = 0
    for path in sorted(SHARED_TEMPLATES.glob("*.jinja")):
        counted, reused = compare_paths(path.read_text(encoding="utf-8"))
        trials, taken_over = trials + counted, taken_over + reused
    assert trials > 100  # a score of the shared templates have switch candidates
    assert taken_over > trials  # most trials take several statements over


@pytest.mark.parametrize(
    "path",
    [path for path in sorted(CORPUS.glob("*.jinja")) if path.name != "PC000_syntax_error.jinja"],
    ids=lambda path: path.name,
)
def test_corpus_fixture_trials_match_reanalysis(path: Path):
    compare_paths(path.read_text(encoding="utf-8"))


SWITCH_READ_LATE = """\
{%- macro render(message) -%}<|{{ message.role }}|>{{ message.content }}{%- endmacro -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}{%- if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif -%}{%- endfor -%}
{%- for message in messages -%}
{%- if message.role == 'assistant' and loop.index0 < ns.last_user and not keep_reasoning %}{{ render(message) }}
{%- else %}<think>{{ message.reasoning_content }}</think>{{ render(message) }}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% else %}<think>{% endif %}{% endif -%}
"""


def test_statements_before_the_switch_is_read_are_taken_over():
    tree, _, raw = parse_with_tokens(SWITCH_READ_LATE)
    source_map = SourceMap(SWITCH_READ_LATE, PARSE_ENVIRONMENT, tree, raw)
    facts = analyze(SWITCH_READ_LATE, tree, source_map, record=True)
    trial = analyze(SWITCH_READ_LATE, tree, source_map, {"enable_thinking": False}, reusing=[facts.trace])
    # macro, namespace, scan loop, render loop: all four read nothing enable_thinking decides
    assert trial.taken_over == 4
    assert len(tree.body) == 5
    compare_paths(SWITCH_READ_LATE)


MACRO_READS_THE_SWITCH = """\
{%- macro show(m, is_last) -%}{% if not keep and is_last %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}{%- endmacro -%}
{%- for message in messages -%}<|{{ message.role }}|>{{ show(message, loop.last) }}{%- endfor -%}
"""


def test_a_statement_calling_a_macro_that_reads_the_switch_is_analysed_again():
    tree, _, raw = parse_with_tokens(MACRO_READS_THE_SWITCH)
    source_map = SourceMap(MACRO_READS_THE_SWITCH, PARSE_ENVIRONMENT, tree, raw)
    facts = analyze(MACRO_READS_THE_SWITCH, tree, source_map, record=True)
    findings = run_rules(facts, STATIC)
    name_switches(findings, SwitchTrials(facts, STATIC, findings))
    # the look-ahead inside the macro is gone when keep is true: the loop that calls it
    # must not be taken over from the plain analysis
    assert [(finding.code, finding.switch.name, finding.switch.stable_value) for finding in findings] == [("PC003", "keep", True)]
    trial = analyze(MACRO_READS_THE_SWITCH, tree, source_map, {"keep": True}, reusing=[facts.trace])
    assert trial.taken_over == 1  # the macro definition only
    compare_paths(MACRO_READS_THE_SWITCH)


HEADERS = [
    "{%- set thinking = thinking | default(false) -%}",
    "{%- if not thinking is defined %}{% set thinking = true %}{% endif -%}",
    "{%- set mode = mode if mode is defined else 'auto' -%}",
    "",
]
MACROS = [
    "{%- macro show(m) -%}{% if thinking %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}{%- endmacro -%}",
    "{%- macro show(m) -%}{{ m.content }}{% if mode == 'all' %}{{ m.reasoning_content }}{% endif %}{%- endmacro -%}",
    "{%- macro show(m) -%}{{ m.content | tojson }}{%- endmacro -%}",
    "{%- macro show(m) -%}{% if not thinking and m.role == 'assistant' %}{{ m.content }}{% endif %}{%- endmacro -%}",
]
CONDITIONS = [
    "thinking",
    "mode == 'all'",
    "loop.last",
    "loop.index0 > ns.mark",
    "not thinking and loop.last",
    "message.tool_calls",
    "preserve is defined and preserve",
]
BODIES = [
    "{{ show(message) }}",
    "{{ show(loop.last and message) }}",
    "<think>{{ message.reasoning_content }}</think>{{ show(message) }}",
    "{{ message.tool_calls[0].function.arguments | tojson }}",
    "{{ strftime_now('%Y') if thinking else '' }}",
    "{% set ns.count = ns.count + 1 %}{{ message.content }}",
]
TAILS = [
    "{%- if add_generation_prompt %}<|a|>{% if thinking %}<think>{% endif %}{% endif -%}",
    "{%- if add_generation_prompt %}<|a|><think>{% endif -%}",
    "",
]


@st.composite
def switch_templates(draw) -> str:
    parts = [draw(st.sampled_from(HEADERS)), draw(st.sampled_from(MACROS))]
    parts.append("{%- set ns = namespace(mark=-1, count=0) -%}")
    if draw(st.booleans()):
        parts.append(
            "{%- for message in messages %}{% if message.role == 'user' %}{% set ns.mark = loop.index0 %}{% endif %}{% endfor -%}"
        )
    parts.append("{%- for message in messages -%}")
    for _ in range(draw(st.integers(1, 3))):
        parts.append("{%- if " + draw(st.sampled_from(CONDITIONS)) + " %}" + draw(st.sampled_from(BODIES)))
        parts.append("{%- else %}" + draw(st.sampled_from(BODIES)) + "{%- endif -%}")
    parts.append("{%- endfor -%}")
    parts.append(draw(st.sampled_from(TAILS)))
    return "\n".join(parts)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(switch_templates())
def test_generated_templates_trials_match_reanalysis(text: str):
    compare_paths(text)
