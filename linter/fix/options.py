"""What a fix run is asked to do, the lint a fix starts from, and which fixes apply by
default (safe fixes, as ruff's)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path

from ..analysis.facts import Facts
from ..findings import Finding
from ..render import DEFAULT_LIMITS, RenderLimits


@dataclass(frozen=True)
class FixOptions:
    frozen_date: date
    tokenizer: Path | None = None
    block_size: int = 16
    # "compact" or "spaced": how the model writes tool-call arguments, which the fix writes
    # mappings with (PC004) and its verifying lint and proofs take as the check does; None:
    # as the template names it, else compact (analysis.separators.model_separators).
    tool_args_style: str | None = None
    engine: str = "vllm"  # whose request preprocessing the verifying proofs apply, as the check's
    limits: RenderLimits = DEFAULT_LIMITS  # each render's, as check's proofs have them
    # Fix findings the proof does not reproduce too: they fail the run under --strict and
    # --no-prove. Otherwise a fix is made only for what a render shows (see
    # Verifier.unreproduced).
    unreproduced: bool = False
    # The check that follows proves the template as fixed, and takes over what the verifier
    # rendered for it (TemplateFix.recorded); without proofs that is not sent back at all.
    send_renders: bool = True
    # Make unsafe fixes too (--unsafe-fixes): those that change what the model sees.
    unsafe_fixes: bool = False


@dataclass
class Linted:
    """A template text's findings as ``lint_source`` reports them (without their places in
    the parse tree), and the analysis they came from."""

    facts: Facts
    findings: list[Finding]


NO_AUTOMATIC_FIX = "no automatic fix for this rule"


def applies_by_default(finding: Finding) -> bool:
    """Not informational. A finding that applies only when a caller sets a switch to a value
    applies too: a deployment may set it (the switch policy, issue 33)."""
    return finding.severity != "info"
