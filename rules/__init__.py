"""The rules, one module each: its docs (the module docstring), ``RULE`` and ``check``.

``check(facts)`` receives the facts of one analysis pass (``tmpl_lint.analysis``) and
returns findings; rules never walk the template themselves.
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
)

RULES = (
    pc000_syntax_error,
    pc001_live_clock,
    pc002_history_rewrite,
    pc003_future_dependent_render,
    pc004_tool_args_reserialized,
    pc005_nondeterministic_render,
    pc006_generation_prompt_mismatch,
)
BY_CODE = {rule.RULE.code: rule for rule in RULES}
BY_NAME = {rule.RULE.name: rule for rule in RULES}


def lookup(code_or_name: str):
    """The rule module for a code (``PC002``) or name (``history-rewrite``), or None."""
    return BY_CODE.get(code_or_name.upper()) or BY_NAME.get(code_or_name.lower())
