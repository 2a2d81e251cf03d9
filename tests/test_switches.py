"""Switch trials: a trial that takes statements over from another analysis' trace finds
exactly what analysing the whole template again finds (the reference path,
``reanalyse=True``), on every shared template, the corpus fixtures and generated templates.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
from helpers import CORPUS, SHARED_TEMPLATES, needs_shared, prove_text
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tmpl_lint.analysis.interpreter import analyze
from tmpl_lint.analysis.locations import SourceMap
from tmpl_lint.analysis.parsing import parse_with_tokens
from tmpl_lint.checker import SwitchTrials, name_switches, run_rules
from tmpl_lint.jinja_env import PARSE_ENVIRONMENT
from tmpl_lint.rules import SOURCES, STATIC

pytestmark = pytest.mark.no_fork


class BothPaths(NamedTuple):
    """What the fast path (taking statements over) and the reference (every trial analysed
    whole) find: per trial (name, value) the finding positions, then every finding with the
    switch it names and its severity."""

    fast: list
    reference: list
    taken_over: int  # statements the fast path took over
    trials: int


def both_paths(text: str) -> BothPaths:
    tree, _, raw = parse_with_tokens(text)
    assert tree is not None
    source_map = SourceMap(text, PARSE_ENVIRONMENT, tree, raw)
    facts = analyze(text, tree, source_map, record=True, sources=SOURCES)
    fast = SwitchTrials(facts, STATIC, run_rules(facts, STATIC))
    reference = SwitchTrials(facts, STATIC, run_rules(facts, STATIC), reanalyse=True)
    wanted = [
        (name, value) for name in sorted(set().union(*(f.candidates for f in fast.findings))) for value in fast.values(name)
    ]
    found = []
    for trials in (fast, reference):
        findings = run_rules(facts, STATIC)
        switches = name_switches(findings, trials)  # the trials below, and any a finding's own values add
        found.append(
            [(wanted_trial, trials.keys(*wanted_trial)) for wanted_trial in wanted]
            + [(f.key, switch, f.severity) for f, switch in zip(findings, switches)]
        )
    assert reference.taken_over == 0  # the reference analyses every trial whole
    return BothPaths(found[0], found[1], fast.taken_over, len(wanted))


@needs_shared
def test_shared_templates_trials_match_reanalysis():
    trials = taken_over = 0
    for path in sorted(SHARED_TEMPLATES.glob("*.jinja")):
        compared = both_paths(path.read_text(encoding="utf-8"))
        assert compared.fast == compared.reference, path.name
        trials, taken_over = trials + compared.trials, taken_over + compared.taken_over
    assert trials > 100  # a score of the shared templates have switch candidates
    assert taken_over > trials  # most trials take several statements over


@pytest.mark.parametrize(
    "path",
    [path for path in sorted(CORPUS.glob("*.jinja")) if path.name != "PC000_syntax_error.jinja"],
    ids=lambda path: path.name,
)
def test_corpus_fixture_trials_match_reanalysis(path: Path):
    compared = both_paths(path.read_text(encoding="utf-8"))
    assert compared.fast == compared.reference


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
    facts = analyze(SWITCH_READ_LATE, tree, source_map, record=True, sources=SOURCES)
    trial = analyze(SWITCH_READ_LATE, tree, source_map, {"enable_thinking": False}, reusing=[facts.trace], sources=SOURCES)
    # macro, namespace, scan loop, render loop: all four read nothing enable_thinking decides
    assert trial.taken_over == 4
    assert len(tree.body) == 5
    compared = both_paths(SWITCH_READ_LATE)
    assert compared.fast == compared.reference


CLOCK_NAMED_SWITCH = """\
{%- set ns = namespace(last=-1) -%}
{%- for message in messages %}{% if message.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor -%}
{%- if current_date is defined %}Today: {{ current_date }}{% else %}Today: {{ current_date() }}{% endif -%}
{%- for message in messages %}<|{{ message.role }}|>{{ message.content }}{% endfor -%}
"""


def test_a_clock_named_switch_takes_over_what_does_not_read_it():
    # `current_date` is read as a variable and called as a clock: only the statement that
    # names it is analysed again; the namespace, the scan and the render loop are taken over.
    tree, _, raw = parse_with_tokens(CLOCK_NAMED_SWITCH)
    source_map = SourceMap(CLOCK_NAMED_SWITCH, PARSE_ENVIRONMENT, tree, raw)
    facts = analyze(CLOCK_NAMED_SWITCH, tree, source_map, record=True, sources=SOURCES)
    trial = analyze(CLOCK_NAMED_SWITCH, tree, source_map, {"current_date": "26 Jul 2024"}, reusing=[facts.trace], sources=SOURCES)
    assert (trial.taken_over, len(tree.body)) == (3, 4)
    compared = both_paths(CLOCK_NAMED_SWITCH)
    assert compared.fast == compared.reference
    assert compared.trials == 2  # unset, and a date as the template's own clock call writes it


MACRO_READS_THE_SWITCH = """\
{%- macro show(m, is_last) -%}{% if not keep and is_last %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}{%- endmacro -%}
{%- for message in messages -%}<|{{ message.role }}|>{{ show(message, loop.last) }}{%- endfor -%}
"""


def test_a_statement_calling_a_macro_that_reads_the_switch_is_analysed_again():
    tree, _, raw = parse_with_tokens(MACRO_READS_THE_SWITCH)
    source_map = SourceMap(MACRO_READS_THE_SWITCH, PARSE_ENVIRONMENT, tree, raw)
    facts = analyze(MACRO_READS_THE_SWITCH, tree, source_map, record=True, sources=SOURCES)
    findings = run_rules(facts, STATIC)
    switches = name_switches(findings, SwitchTrials(facts, STATIC, findings))
    # the look-ahead inside the macro is gone when keep is true: the loop that calls it
    # must not be taken over from the plain analysis
    assert [(finding.code, switch.name, switch.stable_value) for finding, switch in zip(findings, switches)] == [
        ("PC003", "keep", True)
    ]
    trial = analyze(MACRO_READS_THE_SWITCH, tree, source_map, {"keep": True}, reusing=[facts.trace], sources=SOURCES)
    assert trial.taken_over == 1  # the macro definition only
    compared = both_paths(MACRO_READS_THE_SWITCH)
    assert compared.fast == compared.reference


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
    compared = both_paths(text)
    assert compared.fast == compared.reference


def test_a_value_every_render_fails_on_is_not_advised():
    """`system_message` is concatenated as a string, yet the analysis tries it as a number
    (-1): both scenarios with system_message=-1 fail to render (str + int), so "only when
    system_message=-1: leave it unset" names a value no request can use. The claim is
    withdrawn: the finding keeps its severity, unproven, without the advice."""
    source = (
        "{%- for message in messages %}\n"
        '    {%- if message.role == "user" and loop.last and system_message is defined %}\n'
        '        {{- "[INST]" + system_message + "\\n\\n" + message.content + "[/INST]" }}\n'
        '    {%- elif message.role == "user" %}\n'
        '        {{- "[INST]" + message.content + "[/INST]" }}\n'
        "    {%- endif %}\n"
        "{%- endfor %}\n"
    )
    codes, findings = prove_text(source)
    (finding,) = [finding for finding in findings if finding.code == "PC003"]
    assert finding.proof.status == "not-reproduced"
    assert {name for name, _ in finding.proof.unrendered} == {"chat, system_message=-1", "agent, system_message=-1"}
    assert finding.switch is None
    assert finding.severity == "warning"
    assert "system_message=-1" not in finding.full_message()
