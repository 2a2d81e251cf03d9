"""The rules, one module each, found by name (``pcNNN_*.py``): adding a rule is adding its
module, its fixture under ``corpus/`` and its test; nothing in the engine names a rule code.

A rule module holds its page (the module docstring), ``RULE`` (a ``RuleInfo``: code, name,
severity, summary, which divergences prove it, what its fix must remove), and as it needs:

- ``check(facts)``: findings from the facts of one analysis pass (``tmpl_lint.analysis``);
  rules never walk the template themselves;
- ``fix(facts, finding, options)``: the edits that would fix a finding (``tmpl_lint.edits.Fix``);
- ``prove(report)``: the proof of a finding when no divergence shows it (a ``Proof``);
- ``verify_fix(verifier, patched)``: a check of its own a fix must pass (the reason, or None).

Rules the engine itself reports (a syntax error, a render that fails, a divergence no rule
explains...) declare what they report (``RuleInfo.reports``), and the engine asks for them
by that (``reporting``).
"""

from __future__ import annotations

import importlib
import pkgutil
import re

from tmpl_lint.findings import Outcome

_MODULE = re.compile(r"pc\d{3}_\w+$")

RULES = tuple(
    sorted(
        (
            importlib.import_module(f"{__name__}.{info.name}")
            for info in pkgutil.iter_modules(__path__)
            if _MODULE.match(info.name)
        ),
        key=lambda rule: rule.RULE.code,
    )
)
# The rules that read the analysis' facts.
STATIC = tuple(rule for rule in RULES if hasattr(rule, "check"))
BY_CODE = {rule.RULE.code: rule for rule in RULES}
BY_NAME = {rule.RULE.name: rule for rule in RULES}
_BY_OUTCOME = {rule.RULE.reports: rule for rule in RULES if rule.RULE.reports is not None}


def lookup(code_or_name: str):
    """The rule module for a code (``PC002``) or name (``history-rewrite``), or None."""
    return BY_CODE.get(code_or_name.upper()) or BY_NAME.get(code_or_name.lower())


def reporting(outcome: Outcome):
    """The rule module that reports ``outcome``."""
    return _BY_OUTCOME[outcome]


SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety")


def page(rule) -> str:
    """The rule's page, as `tmpl-lint rule CODE` prints it."""
    info = rule.RULE
    fixable = "Fix is sometimes available." if hasattr(rule, "fix") else "No automatic fix."
    return f"# {info.name} ({info.code})\n\n{info.summary[0].upper()}{info.summary[1:]}. {fixable}\n\n{rule.__doc__.strip()}\n"
