"""The rules, one module each: its page (the module docstring), ``RULE``, and where the
rule is static, ``check`` and ``fix``.

``check(facts)`` receives the facts of one analysis pass (``tmpl_lint.analysis``) and
returns findings; rules never walk the template themselves. ``fix(facts, finding,
options)`` returns the edits that would fix a finding (``tmpl_lint.edits.Fix``).
"""

from __future__ import annotations

from . import (
    pc000_syntax_error,
    pc001_live_clock,
    pc002_history_rewrite,
    pc003_future_dependent_render,
    pc004_tool_args_reserialized,
    pc005_nondeterministic_render,
    pc006_generation_prompt_mismatch,
    pc100_unstable_render,
    pc101_render_limit_exceeded,
    pc102_render_error,
    pc103_engine_render_unstable,
    pc900_unused_suppression,
)

RULES = (
    pc000_syntax_error,
    pc001_live_clock,
    pc002_history_rewrite,
    pc003_future_dependent_render,
    pc004_tool_args_reserialized,
    pc005_nondeterministic_render,
    pc006_generation_prompt_mismatch,
    pc100_unstable_render,
    pc101_render_limit_exceeded,
    pc102_render_error,
    pc103_engine_render_unstable,
    pc900_unused_suppression,
)
# The rules that read the analysis' facts; PC100 comes from the prover, PC900 from the
# checker's suppressions.
STATIC = tuple(rule for rule in RULES if hasattr(rule, "check"))
BY_CODE = {rule.RULE.code: rule for rule in RULES}
BY_NAME = {rule.RULE.name: rule for rule in RULES}


def lookup(code_or_name: str):
    """The rule module for a code (``PC002``) or name (``history-rewrite``), or None."""
    return BY_CODE.get(code_or_name.upper()) or BY_NAME.get(code_or_name.lower())


SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety")


def page(rule) -> str:
    """The rule's page, as `tmpl-lint rule CODE` prints it."""
    info = rule.RULE
    fixable = "Fix is sometimes available." if hasattr(rule, "fix") else "No automatic fix."
    return f"# {info.name} ({info.code})\n\n{info.summary[0].upper()}{info.summary[1:]}. {fixable}\n\n{rule.__doc__.strip()}\n"
