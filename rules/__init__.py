"""The rules, one module each, found by name (``pcNNN_*.py``): adding a rule is adding its
module, its fixture under ``corpus/`` and its test; nothing in the engine names a rule code.

A rule module holds its page (the module docstring), ``RULE`` (a ``RuleInfo``: code, name,
``Severity``, summary, which divergences prove it, what its fix must remove), and as it
needs these hooks (their signatures are the Protocols of ``_contract.py``; the registry
resolves each module once into a ``Rule`` whose missing hooks are None):

- ``check(facts)``: findings from the facts of one analysis pass (``tmpl_lint.analysis``);
  rules never walk the template themselves;
- ``fix(facts, finding, options)``: the edits that would fix a finding (``tmpl_lint.edits.Fix``);
- ``prove(report, finding)``: the proof of a finding, where the rule chooses it, or where no
  divergence shows it (random output), with the finding's message as the proof tells it
  (what it measured: how often a clock changes the prompt);
- ``found_by_proof(facts, divergence)``: a finding for a divergence no static finding
  explains, at the place in the template the rule knows (the generation prompt's test);
- ``verify_fix(verifier, patched)``: a check of its own a fix must pass (the reason, or None);
- ``shown_by(finding, divergence)``: whether a divergence the rule proves shows that finding,
  where one finding stands for less than every divergence the rule proves (PC006's opener);
- ``describe(message, proof)``: once the finding has its proof, its message (and the proof,
  with its note) as they say what the proof shows, where the static pattern alone could not
  tell (PC004: a string JSON-encoded again, not separators);
- ``trial_values(facts, name, finding)``: the values a switch trial tries for a variable the
  rule knows the meaning of (PC001: a date-like name gets a date in the template's clock format).

What a rule's ``check`` matches among the calls and filters the analysis cannot tell apart by
itself (the clock's globals, ``random``) it declares (``RuleInfo.sources``); the analysis
labels the union of every rule's declarations (``SOURCES``), naming each after its function.

Rules the engine itself reports (a syntax error, a render that fails, a divergence no rule
explains...) declare what they report (``RuleInfo.reports``), and the engine asks for them
by that (``reporting``).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

from tmpl_lint.analysis.facts import Sources
from tmpl_lint.findings import Outcome

from ._contract import Rule

_MODULE = re.compile(r"pc\d{3}_\w+$")

RULES = tuple(
    sorted(
        (
            Rule.of(importlib.import_module(f"{__name__}.{info.name}"))
            for info in pkgutil.iter_modules(__path__)
            if _MODULE.match(info.name)
        ),
        key=lambda rule: rule.RULE.code,
    )
)
# The rules that read the analysis' facts.
STATIC = tuple(rule for rule in RULES if rule.check is not None)
BY_CODE = {rule.RULE.code: rule for rule in RULES}
BY_NAME = {rule.RULE.name: rule for rule in RULES}
_BY_OUTCOME = {rule.RULE.reports: rule for rule in RULES if rule.RULE.reports is not None}
# What the analysis labels for the rules: every rule's declared calls and filters.
SOURCES = Sources(
    frozenset().union(*(rule.RULE.sources.calls for rule in RULES)),
    frozenset().union(*(rule.RULE.sources.filters for rule in RULES)),
)
# The rules that know what values a template variable takes (see ``trial_values``).
TRIAL_VALUES = tuple(rule.trial_values for rule in RULES if rule.trial_values is not None)


def lookup(code_or_name: str) -> Rule | None:
    """The rule of a code (``PC002``) or name (``history-rewrite``), or None."""
    return BY_CODE.get(code_or_name.upper()) or BY_NAME.get(code_or_name.lower())


def reporting(outcome: Outcome) -> Any:
    """The module of the rule that reports ``outcome``: besides ``RULE``, the engine calls the
    functions such a rule offers for its outcome (PC100's ``unexplained``, PC103's
    ``advice``), which no other rule has."""
    return _BY_OUTCOME[outcome].module


SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety")


# What fails the run (README, "Proofs decide what fails"); the policy itself is
# tmpl_lint.findings.Finding.verdict.
HYPOTHESIS_POLICY = (
    "A finding of this rule is a hypothesis until the proof renders it: proven, it fails the run at its "
    "severity; if the proof ran and did not reproduce it, it is reported as unproven, with the scenarios "
    "tried, and does not fail the run (`--strict` makes it fail); with `--no-prove`, or when nothing could be "
    "rendered, it keeps its severity and says it is unproven. Info findings never fail the run."
)
# What a proof renders, and what a switch value or a bounded loss does to the verdict (issue 33).
SETTINGS_POLICY = (
    "Proven under the settings deployments run: every value of every switch the template reads "
    "(`enable_thinking`, `reasoning_effort`...) is rendered, llama.cpp's default (`enable_thinking=true`) and "
    "vLLM's (unset) among them, and a break proven under any value fails the run; the finding names the "
    'values that break and those that are stable ("breaks when enable_thinking=false (stable when true or '
    "unset)\"). A project that pins its deployment's values (`chat-template-kwargs` in the configuration, or "
    "`--chat-template-kwargs JSON`, with vLLM's `--default-chat-template-kwargs` semantics) has only those "
    "values proven. A proven loss bounded whatever the session's length (only the reply's end-of-turn "
    "marker differs: at most one block a turn) is info, with the bound stated; one that grows with the "
    "session fails."
)
OUTCOME_POLICY = (
    "This rule reports what the run itself found, not a static pattern: its findings fail the run at their "
    "severity (info findings never do)."
)


def page(rule: Rule) -> str:
    """The rule's page, as `tmpl-lint rule CODE` prints it."""
    info = rule.RULE
    fixable = "Fix is sometimes available." if rule.fix is not None else "No automatic fix."
    policy = OUTCOME_POLICY if info.reports is not None else HYPOTHESIS_POLICY
    if info.reports is None or info.proven_by:
        policy += "\n\n" + SETTINGS_POLICY
    summary = f"{info.summary[0].upper()}{info.summary[1:]}. {fixable}"
    return f"# {info.name} ({info.code})\n\n{summary}\n\n{policy}\n\n{rule.doc.strip()}\n"
