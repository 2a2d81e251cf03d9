"""The edits rules propose: a switch's default set first, and when the template's own
default for it must not be overridden."""

from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from helpers import SHARED_TEMPLATES, needs_shared
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tmpl_lint.cli import main
from tmpl_lint.edits import OwnDefault, own_default, switch_default_fix
from tmpl_lint.findings import Switch

THINKING_FROM_ENABLE_THINKING = """\
{%- if thinking is not defined %}
  {%- if enable_thinking is defined %}
    {%- set thinking = enable_thinking %}
  {%- else %}
    {%- set thinking = false %}
  {%- endif %}
{%- endif %}
"""
# Reasoning is kept only after the last user message, and only when thinking: PC002 with the
# switch thinking (the analysis cannot tell what enable_thinking, unknown, makes the default).
BODY = """\
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == "user" %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
  {%- if m.role == "assistant" %}
    {{- "<|assistant|>" }}
    {%- if thinking and loop.index0 > ns.last_user and m.reasoning_content %}{{- "<think>" + m.reasoning_content + "</think>" }}{%- endif %}
    {{- m.content + "<|end|>" }}
  {%- else %}
    {{- "<|" + m.role + "|>" + m.content + "<|end|>" }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- "<|assistant|>" }}{%- if thinking %}{{- "<think>" }}{%- endif %}{%- endif %}
"""

THINKING_OFF = SimpleNamespace(switch=Switch("thinking", False, False, True))


def test_no_default_is_set_first_where_the_template_sets_it_from_another_variable():
    fix = switch_default_fix(THINKING_FROM_ENABLE_THINKING + BODY, THINKING_OFF)
    assert fix.alternatives == []
    assert fix.unfixable == (
        "the template gives thinking its own default at line 1, from enable_thinking: "
        "a default for thinking set first would stop enable_thinking from setting it"
    )


@pytest.mark.parametrize(
    "test",
    ["thinking is not defined", "not thinking is defined", "thinking is undefined", "x is defined and not thinking is defined"],
)
def test_each_way_of_asking_whether_the_caller_passed_it_is_the_templates_own_default(test):
    text = f"{{% set x = 1 %}}\n{{% if {test} %}}{{% set thinking = reasoning_effort == 'high' %}}{{% endif %}}{{{{ thinking }}}}"
    assert own_default(text, "thinking") == OwnDefault(2, ("reasoning_effort",))


@pytest.mark.parametrize(
    "text",
    [
        # a constant default: the header only replaces it (what the fix is for)
        "{% if thinking is not defined %}{% set thinking = true %}{% endif %}",
        # from the template's own names, and a global: nothing a caller passes
        "{% set mode = 'deep' %}{% if thinking is not defined %}{% set thinking = namespace(on=mode == 'deep').on %}{% endif %}",
        # another variable read where thinking IS passed: not the default
        "{% if thinking is not defined %}{% set thinking = true %}{% else %}{% set thinking = enable_thinking %}{% endif %}",
        # a block that reads enable_thinking but sets another variable
        "{% if thinking is not defined %}{% set effort = enable_thinking %}{% endif %}",
        # no default at all
        "{{ thinking }}",
    ],
)
def test_a_default_for_the_switch_is_still_set_first_where_no_other_variable_decides_it(text):
    fix = switch_default_fix(text, THINKING_OFF)
    assert fix.unfixable is None
    assert fix.title == "thinking now defaults to false; callers can still pass it"
    (edits,) = fix.alternatives
    assert [(edit.start, edit.end, edit.text) for edit in edits] == [
        (0, 0, "{%- if thinking is not defined %}{%- set thinking = false %}{%- endif %}\n")
    ]


def test_fix_keeps_the_alias_and_says_why(tmp_path):
    # The switch's default is no fix (a deployment may pass thinking=true, issue 33): PC002 is
    # fixed by keeping reasoning whatever the switch says, and the alias stays as it was.
    path = tmp_path / "chat_template.jinja"
    original = THINKING_FROM_ENABLE_THINKING + BODY
    path.write_text(original)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove"])
    assert result.exit_code == 0
    assert any(line.startswith(f"{path}:13:39: fixed PC002 [history-rewrite]: ") for line in result.stdout.splitlines())
    fixed = path.read_text()
    assert fixed.startswith(THINKING_FROM_ENABLE_THINKING) and fixed != original
    # and the default alone, the fallback, still says why it is refused
    fix = switch_default_fix(original, SimpleNamespace(switch=Switch("thinking", False, False, True)))
    assert fix.unfixable == (
        "the template gives thinking its own default at line 1, from enable_thinking: "
        "a default for thinking set first would stop enable_thinking from setting it"
    )


@needs_shared
def test_strict_fix_of_deepseek_v3_2_leaves_enable_thinking_turning_thinking_on(tmp_path):
    # --fix --strict put `thinking = false` first, and enable_thinking=true (what
    # vLLM sets from reasoning_effort) no longer turned thinking on: the generation prompt
    # ended '<think></think>' instead of '<think>'.
    original = (SHARED_TEMPLATES / "deepseek-ai--DeepSeek-V3.2.jinja").read_text()
    path = tmp_path / "chat_template.jinja"
    path.write_text(original)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--strict"])
    # PC002 is fixed by keeping reasoning, not by a default for thinking (issue 33)
    assert any(line.startswith(f"{path}:55:48: fixed PC002 [history-rewrite]: ") for line in result.stdout.splitlines())
    fixed = path.read_text()
    assert fixed.splitlines()[4:6] == original.splitlines()[4:6]  # enable_thinking still sets thinking
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    rendered = environment.from_string(fixed).render(
        messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True, bos_token="<BOS>", enable_thinking=True
    )
    assert rendered.endswith("Hi<｜Assistant｜><think>")
