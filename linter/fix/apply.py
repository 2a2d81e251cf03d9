"""Fixing one template: each finding's fix, verified (verify.py), applied in turn, and the
chain of fixes a template takes."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..checker import lint_with_facts
from ..edits import Edit, Fix, OverlappingEdits, apply_edits
from ..findings import Finding, FixSafety
from ..inputs import TemplateSource
from ..proving.session import Recorded
from ..rules import BY_CODE
from ..selection import Selection
from ..suppressions import suppressions
from .options import NO_AUTOMATIC_FIX, FixOptions, Linted
from .verify import Verdicts, Verification


@dataclass
class TemplateFix:
    source: TemplateSource
    patched: str
    applied: list[tuple[Finding, str]] = field(default_factory=list)
    skipped: list[tuple[Finding, str]] = field(default_factory=list)
    # Findings whose rule's fix is unsafe, left without --unsafe-fixes (counted, not said one by one).
    withheld: list[Finding] = field(default_factory=list)
    # Why the verified fixes cannot be kept (the template cannot be put back into its file,
    # or fixing it ran over the limits): said once for the template.
    refusal: str | None = None
    # What verifying the fixes answered, for another file of the run with the same template.
    verdicts: Verdicts | None = None
    # What the verifier's proof of the template as patched rendered and encoded, for the
    # check that follows the fix (its proof renders those requests again), where it has one.
    recorded: Recorded | None = None

    @property
    def changed(self) -> bool:
        return self.refusal is None and self.patched != self.source.text

    @property
    def now(self) -> TemplateSource:
        """The template as the file holds it once the fixes are in."""
        source = self.source
        return TemplateSource(source.path, source.name, self.patched, source.container, source.note) if self.changed else source


def fix_template(
    source: TemplateSource, options: FixOptions, selection: Selection = Selection(), recalled: tuple[Verdicts, ...] = ()
) -> TemplateFix:
    """``recalled``: what earlier fixes of the run verified for templates of the same text."""
    facts, findings = lint_with_facts(source, selection)
    result = TemplateFix(source, source.text)
    if facts.tree is None:
        result.skipped = [(finding, "the template does not parse") for finding in findings]
        return result
    random = [finding for finding in findings if BY_CODE[finding.code].RULE.makes_renders_incomparable]
    if random:
        # Random output makes two renders differ: no fix could be verified.
        unverifiable = f"the template prints random text ({random[0].code}): fixes cannot be verified"
        result.skipped = [(finding, unverifiable) for finding in findings]
        return result
    chosen: list[Edit] = []
    pending: list[tuple[Finding, Fix]] = []
    for finding in sorted(findings, key=lambda f: (f.code, f.line, f.column)):
        rule = BY_CODE.get(finding.code)
        fix = rule.fix(facts, finding, options) if rule is not None and rule.fix is not None else None
        if fix is None:
            result.skipped.append((finding, NO_AUTOMATIC_FIX))
        elif fix.unfixable:
            result.skipped.append((finding, fix.unfixable))
        elif rule is not None and rule.RULE.fix_safety is not FixSafety.SAFE and not options.unsafe_fixes:
            result.withheld.append(finding)
        else:
            pending.append((finding, fix))
    if not pending:
        return result
    # The lint above is the verifier's own when every code is selected and no comment
    # suppresses any (the verifier counts suppressed patterns too): the places its
    # findings keep are not read by the verifier.
    everything = selection.runs_every_code_on(source.path) and not suppressions(facts.source_map)
    verifier = Verification(source, options, Linted(facts, findings) if everything else None, recalled)
    result.verdicts = verifier.verdicts
    if not options.unreproduced:
        for finding, fix in list(pending):
            unreproduced = verifier.unreproduced(finding)
            if unreproduced is not None:
                result.skipped.append((finding, unreproduced))
                pending.remove((finding, fix))
    reasons: dict[int, str] = {}
    # The fixes in when each finding's candidates were last tried: with the same ones in,
    # they would give the same patched templates and fail the same way.
    tried: dict[int, tuple[Edit, ...]] = {}
    # A fix that fails alone may verify once another is in (two tojson calls feeding one
    # render), so passes repeat while any fix gets in: a second --fix then has nothing to do.
    progress = True
    while pending and progress:
        progress = False
        for finding, fix in list(pending):
            if tried.get(id(finding)) == tuple(chosen):
                continue
            tried[id(finding)] = tuple(chosen)
            for alternative in fix.alternatives:
                edits = list(dict.fromkeys(chosen + alternative))
                try:
                    patched = apply_edits(source.text, edits)
                except OverlappingEdits as error:
                    reasons[id(finding)] = str(error)
                    continue
                reason = verifier.check(patched, [f for f, _ in result.applied] + [finding])
                if reason is None:
                    chosen = edits
                    result.patched = patched
                    result.applied.append((finding, fix.title))
                    pending.remove((finding, fix))
                    progress = True
                    break
                reasons.setdefault(id(finding), reason)  # the first candidate's: the most direct edit
    for finding, _fix in pending:
        result.skipped.append((finding, reasons.get(id(finding), "no candidate edit")))
    result.recorded = verifier.recorded(result.patched) if options.send_renders else None
    return result
