"""The contract between the engine and a rule module.

A rule module declares ``RULE`` (a ``RuleInfo``: its code, name, default ``Severity``,
summary, and which divergences prove its findings), its page (the module docstring), and
the optional hooks below, each a function of the signature its Protocol gives. The registry
(``tmpl_lint.rules``) resolves every module once into a ``Rule``, whose hooks are the
module's functions or None: the engine asks ``rule.fix is not None``, never ``hasattr``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from tmpl_lint.analysis.facts import Label, Site, Sources
from tmpl_lint.findings import READS, Finding, FixSafety, Message, Outcome, switch_candidates
from tmpl_lint.proofs import Cause, Divergence

if TYPE_CHECKING:
    from tmpl_lint.analysis.facts import Facts
    from tmpl_lint.edits import Fix
    from tmpl_lint.fix.verify import Verifier
    from tmpl_lint.proofs import Proof
    from tmpl_lint.proving.session import ProofReport


class Severity(StrEnum):
    """A rule's default severity, as ruff and SARIF name them; info never fails a run."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class RuleInfo:
    """What a rule declares about itself: its code, name, default severity and one-line
    summary; which divergences prove its findings; which its verified fix must remove."""

    code: str
    name: str
    severity: Severity
    summary: str
    # A finding is proven by a divergence of one of these causes...
    proven_by: frozenset[Cause] = frozenset()
    # ...in a scenario of one of these kinds (empty: any scenario)...
    proven_in: frozenset[str] = frozenset()
    # ...at a turn where a message of one of these roles arrived (empty: any turn): what
    # moves the pattern (a new user query moves the last query's position).
    moved_by: frozenset[str] = frozenset()
    # Of those causes, the ones this rule explains when another rule's finding is proven by
    # the same divergence (None: all of them). A reply rewritten once a message follows it
    # is the generation prompt's mismatch too, but the rewrite explains it.
    explains: frozenset[Cause] | None = None
    # A fix of this rule verifies only when check b shows no divergence that proves it. False
    # for rules whose fix is verified otherwise (the rule module's ``verify_fix``).
    fix_removes_proof: bool = True
    # Its findings make two renders of one request differ, so no fix can be verified.
    makes_renders_incomparable: bool = False
    # The engine's own outcome this rule reports, for rules the prover or checker raise.
    reports: Outcome | None = None
    # Why no edit of the template can fix its findings, said where ``--fix`` leaves one the
    # proof found (None: "found by the proof, not from a pattern a fix edits", said alike
    # for every such rule); a finding of a pattern says its rule has no fix, or why not.
    no_fix: str | None = None
    # Whether its fix (the rule module's ``fix``) keeps what the model sees: None for a rule
    # without one. Its page's "Fix safety" section says which, and why.
    fix_safety: FixSafety | None = None
    # The global functions and filters whose values its ``check`` matches (the analysis'
    # ``CALL`` and ``FILTER`` labels, named after them): the registry labels them all.
    sources: Sources = Sources()

    def proves(self, divergence: Divergence) -> bool:
        """Whether ``divergence`` shows this rule's pattern. One of no scenario (logged
        traffic, a diff of two real requests) may be of any kind: a clock moves there too."""
        if divergence.scenario_kind == "setting-changed" and "setting-changed" not in self.proven_in:
            return False  # the client changed the request: only the rule that names that explains it
        return (
            divergence.cause in self.proven_by
            and (not self.proven_in or not divergence.scenario_kind or divergence.scenario_kind in self.proven_in)
            and (not self.moved_by or bool(self.moved_by.intersection(divergence.arrived)))
        )

    def explanation_rank(self, divergence: Divergence) -> int:
        """How well this rule explains a divergence it proves, against another rule that proves
        it too (higher explains): the generation prompt's rule where the divergence is in the
        text the prompt printed, then one that names the cause, then one that names what moved."""
        explains = self.proven_by if self.explains is None else self.explains
        # One break, one named rule: a divergence in the text the generation prompt printed is
        # the generation prompt's, whatever pattern sits nearby (OLMo's thinker opens
        # "<think>\n" beside a `loop.last`; Qwen3.5's "<think>\n", which history drops with
        # the reasoning once the next query arrives).
        at_prompt = divergence.in_generation_prompt and Cause.GENERATION_PROMPT in self.proven_by
        return 4 * at_prompt + 2 * (divergence.cause in explains) + bool(self.moved_by)

    def at(self, site: Site, message: Message, labels=(), severity: str | None = None) -> Finding:
        """A finding of this rule at ``site``; ``labels`` name the variables that may decide it."""
        return Finding(
            code=self.code,
            name=self.name,
            severity=severity or self.severity,
            line=site.line,
            column=site.column,
            body=message,
            candidates=switch_candidates(labels),
            site=site,
            related=tuple(
                label.site for label in labels if isinstance(label, Label) and label.site is not None and label.kind in READS
            ),
            hypothesis=self.reports is None,
        )


# -- the optional hooks -------------------------------------------------------------------


class Check(Protocol):
    """``check(facts)``: the findings of one analysis pass; rules never walk the template."""

    def __call__(self, facts: Facts, /) -> list[Finding]: ...


class FixEdits(Protocol):
    """``fix(facts, finding, options)``: the edits that would fix a finding, or why it makes none
    (``Fix.refuse``)."""

    def __call__(self, facts: Facts, finding: Finding, options: Any, /) -> Fix: ...


class Prove(Protocol):
    """``prove(report, finding)``: the finding's proof where the rule chooses it (or where no
    divergence shows it: random output), and its message as the proof tells it."""

    def __call__(self, report: ProofReport, finding: Finding, /) -> tuple[Proof, Message]: ...


class FoundByProof(Protocol):
    """``found_by_proof(facts, divergence)``: a finding for a divergence no static finding
    explains, at the place in the template the rule knows."""

    def __call__(self, facts: Facts, divergence: Divergence, /) -> Finding: ...


class VerifyFix(Protocol):
    """``verify_fix(verifier, patched)``: a check of its own a fix must pass: why it fails,
    or None."""

    def __call__(self, verifier: Verifier, patched: str, /) -> str | None: ...


class ShownBy(Protocol):
    """``shown_by(finding, divergence)``: whether a divergence the rule proves shows this
    finding, where one finding stands for less than every divergence the rule proves."""

    def __call__(self, finding: Finding, divergence: Divergence, /) -> bool: ...


class Describe(Protocol):
    """``describe(message, proof)``: once a finding has its proof, its message and proof as
    they say what the proof shows, where the static pattern alone could not tell."""

    def __call__(self, message: Message, proof: Proof, /) -> tuple[Message, Proof]: ...


class TrialValues(Protocol):
    """``trial_values(facts, name, finding)``: the values worth trying for a template variable
    the rule knows the meaning of (unset among them), where its switch trials should try
    those rather than the constants the template compares it with; else None."""

    def __call__(self, facts: Facts, name: str, finding: Finding | None, /) -> list[object] | None: ...


HOOKS = ("check", "fix", "prove", "found_by_proof", "verify_fix", "shown_by", "describe", "trial_values")


@dataclass(frozen=True)
class Rule:
    """A rule module as the registry resolved it, once: its ``RULE``, its page, and each
    optional hook (None where the module has none)."""

    RULE: RuleInfo
    module: ModuleType
    check: Check | None = None
    fix: FixEdits | None = None
    prove: Prove | None = None
    found_by_proof: FoundByProof | None = None
    verify_fix: VerifyFix | None = None
    shown_by: ShownBy | None = None
    describe: Describe | None = None
    trial_values: TrialValues | None = None

    @classmethod
    def of(cls, module: ModuleType) -> Rule:
        return cls(module.RULE, module, **{hook: getattr(module, hook, None) for hook in HOOKS})

    @property
    def doc(self) -> str:
        """The rule's page as its module's docstring writes it."""
        return self.module.__doc__ or ""
