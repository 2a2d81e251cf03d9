"""Which finding a proof's divergences prove: a finding is proven when some pair diverges
for the cause its rule describes, under the switch values the template supports; a
divergence no finding explains is reported through the rule for unexplained divergences."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from ..analysis.facts import Site
from ..findings import Attribution, Finding, Outcome, Switch
from ..proofs import Cause, Divergence, Proof, SwitchValues
from ..rules import BY_CODE, RULES, Rule, reporting
from ..scenarios import ScenarioKind
from .session import ProofReport, ScenarioResult


def _worst(divergences: list[Divergence]) -> Divergence:
    return max(divergences, key=lambda d: (d.lost_tokens, -d.call))


def _typical_worst(divergences: list[Divergence], report: ProofReport, switch: Switch | None = None) -> Divergence:
    """The worst divergence of a request as callers send it by default, if any shows it; for
    a finding that applies only when a caller sets ``switch`` (its default stable), the
    worst of a request that sets it, if any shows it."""
    if switch is not None and switch.default_is_stable:
        switched = [d for d in divergences if switch.name in _kwargs(d, report)]
        return _worst(switched or divergences)
    default = [d for d in divergences if not _kwargs(d, report)]
    return _worst(default or divergences)


def _first_shown(divergences: list[Divergence], report: ProofReport) -> Divergence:
    """The worst divergence of the first scenario that shows one (the plainest: a chat before
    an agent, a request as callers send it before a variable set): what a finding the proof
    found describes."""
    order = {result.scenario.name: position for position, result in enumerate(report.results)}
    first = min(order.get(d.scenario, len(order)) for d in divergences)
    return _worst([d for d in divergences if order.get(d.scenario, len(order)) == first])


def _kwargs(divergence: Divergence, report: ProofReport) -> dict[str, Any]:
    scenario = report.scenario(divergence.scenario)
    return scenario.kwargs if scenario is not None else {}


def name_other_switches(switch: Switch | None, proof: Proof | None, report: ProofReport) -> Switch | None:
    """An informational finding shown by renders that set another variable, its own left
    unset (`enable_thinking=true`, which DeepSeek-V3.2 copies into `thinking`): "leave it
    unset" alone would not avoid it; its message names them all. The finding's switch, so named."""
    if switch is None or not switch.default_is_stable or proof is None:
        return switch
    others = {}
    for name, _ in proof.explains:
        scenario = report.scenario(name)
        kwargs = scenario.kwargs if scenario is not None else {}
        if kwargs and switch.name not in kwargs:
            others.update(kwargs)
    return replace(switch, also=tuple(sorted(others.items()))) if others else switch


def name_the_switch_shown(switch: Switch | None, divergences: list[Divergence], report: ProofReport) -> Switch | None:
    """A finding whose divergences all come from a template variable set to a value (none
    from a request as callers send it) names the switch that shows it (the analysis's own
    switch, its default now called stable since the renders show that, where it named one).
    It keeps its severity: a deployment may set that value (the switch policy, README).
    The finding's switch, so named."""
    if not divergences or (switch is not None and switch.default_is_stable):
        return switch
    asked = [_kwargs(d, report) for d in divergences]
    if not all(asked):
        return switch
    if switch is not None:
        unstable = next((kwargs[switch.name] for kwargs in asked if switch.name in kwargs), switch.unstable_value)
        return Switch(switch.name, switch.stable_value, True, unstable)
    (name, value), *_ = sorted(asked[0].items())
    return Switch(name, None, True, value)


class Attributed(NamedTuple):
    """What a proof makes of a template's findings: an ``Attribution`` for each of them (in
    their order), and the findings the proof itself found, each with its own."""

    outcomes: list[Attribution]
    found: list[tuple[Finding, Attribution]]


def attach_proofs(
    findings: list[Finding], report: ProofReport, facts=None, switches: Sequence[Switch | None] | None = None
) -> Attributed:
    """What the proof makes of each finding, and the findings the proof itself found.

    A divergence that several findings' rules prove is explained by one of them (the rule
    that names its cause, then the one that names what moved it, then the first in the
    template); the others point at it and are folded into that finding as related
    locations. A divergence no finding explains becomes a finding of the rule that can be
    found by proof for it (a generation-prompt mismatch), or else of the rule for
    unexplained divergences, which says where the render changed. ``switches``: the
    findings' switches as the switch trials named them, where they are not the findings' own.
    """
    unit = report.unit
    named = [finding.switch for finding in findings] if switches is None else list(switches)
    limited = [result for result in report.results if result.limit_exceeded]
    if limited:
        limit = reporting(Outcome.RENDER_LIMIT_EXCEEDED).limit_exceeded(
            _TEMPLATE_START, limited[0].scenario.name, limited[0].error
        )
        reason = limit.message
        return Attributed(
            [Attribution.of(finding, switch, Proof.not_provable(unit, reason)) for finding, switch in zip(findings, named)],
            [(limit, Attribution.of(limit, proof=Proof.not_provable(unit, reason)))],
        )
    divergences = report.divergences()
    errors = [result.error for result in report.results if result.error]
    if not report.rendered:
        reason = errors[0] if errors else "the template does not parse"
        failed: list[tuple[Finding, Attribution]] = []
        if errors:
            failure = reporting(Outcome.RENDER_ERROR).failure(_TEMPLATE_START, errors[0])
            failed.append((failure, Attribution.of(failure, proof=Proof.not_provable(unit, errors[0]))))
        return Attributed(
            [Attribution.of(finding, switch, Proof.not_provable(unit, reason)) for finding, switch in zip(findings, named)],
            failed,
        )
    explained: set[int] = set()
    if not report.deterministic:
        # Random output diverges anywhere; the rule that found the randomness accounts for all of it.
        explained |= set(range(len(divergences)))
    outcomes: dict[int, Attribution] = {}
    generic = []
    refuted: set[int] = set()  # findings whose "leave it unset" the renders refuted
    switch_of: dict[int, Switch | None] = {}
    for finding, switch in zip(findings, named):
        rule = BY_CODE[finding.code]
        if switch is not None:
            others = [BY_CODE[other.code].RULE for other in findings if other is not finding]
            switch, refutes = verify_switch(finding, switch, rule.RULE, report, others)
            if refutes:
                refuted.add(id(finding))
        switch_of[id(finding)] = switch
        if rule.prove is not None:
            proof, body = rule.prove(report, finding)
            severity = finding.severity
            if proof.is_proven:
                shown = {index for index, d in enumerate(divergences) if rule.RULE.proves(d)}
                explained |= shown
                proof = proof.explaining([divergences[index] for index in sorted(shown)])
                proof, severity = settle(proof, severity, [divergences[index] for index in sorted(shown)], report)
            outcomes[id(finding)] = Attribution(proof, switch, severity, finding.hypothesis, body)
        else:
            generic.append(finding)
    # A divergence a rule of its own proof accounts for (the clock's, random output's) is not
    # another rule's to explain.
    matching = {
        id(finding): {
            i
            for i, d in enumerate(divergences)
            if i not in explained and shows(finding, d) and not _unswitched_format(switch_of[id(finding)], d, report)
        }
        for finding in generic
    }
    explainer: dict[int, Finding] = {}
    for index, divergence in enumerate(divergences):
        candidates = [finding for finding in generic if index in matching[id(finding)]]
        if candidates:
            explainer[index] = best_explainer(candidates, divergence)
    explained |= set(explainer)
    for finding in generic:
        switch = switch_of[id(finding)]
        own = [divergences[i] for i, chosen in explainer.items() if chosen is finding]
        explained_by = None
        if own:
            worst = _typical_worst(own, report, switch)
        elif matching[id(finding)]:
            worst = _typical_worst([divergences[i] for i in matching[id(finding)]], report, switch)
            explained_by = explainer[divergences.index(worst)]
        else:
            proof = Proof.not_reproduced(unit, report.tried(), report.unrendered())
            outcomes[id(finding)] = Attribution(proof, switch, finding.severity, finding.hypothesis, finding.body)
            continue
        proof = Proof.proven(worst, report.rates(worst.scenario)).explaining(own)
        if id(finding) not in refuted:  # its own divergences may all be switched; the default's show it too
            switch = name_the_switch_shown(switch, own or [worst], report)
        proof, severity = settle(proof, finding.severity, own or [worst], report)
        outcomes[id(finding)] = Attribution(proof, switch, severity, finding.hypothesis, finding.body, explained_by)
    attributed = [
        replace(
            outcomes[id(finding)], switch=name_other_switches(outcomes[id(finding)].switch, outcomes[id(finding)].proof, report)
        )
        for finding in findings
    ]
    found = found_by_proof([d for i, d in enumerate(divergences) if i not in explained], report, facts)
    if report.note:
        attributed = [_noted(outcome, report.note) for outcome in attributed]
        found = [(finding, _noted(outcome, report.note)) for finding, outcome in found]
    return Attributed(
        [described(finding, outcome) for finding, outcome in zip(findings, attributed)],
        [(finding, described(finding, outcome)) for finding, outcome in found],
    )


def _noted(outcome: Attribution, note: str) -> Attribution:
    return outcome if outcome.proof is None else replace(outcome, proof=outcome.proof.with_note(note))


def described(finding: Finding, outcome: Attribution) -> Attribution:
    """A proven finding as its rule says what the proof shows (the ``describe`` hook), where
    the static pattern alone could not tell."""
    rule = BY_CODE.get(finding.code)
    if rule is None or rule.describe is None or outcome.proof is None or not outcome.proof.is_proven:
        return outcome
    body, proof = rule.describe(outcome.body, outcome.proof)
    return replace(outcome, body=body, proof=proof)


def _unswitched_format(switch: Switch | None, divergence: Divergence, report: ProofReport) -> bool:
    """A divergence that is only the model's format (the reasoning or empty reasoning block
    it wrote, which history leaves out), in a scenario that leaves the finding's switch
    unset: not what the switch turns on (Qwen3's "only when enable_thinking=false" must not
    list a scenario without it). It stays informational, found by the proof."""
    if switch is None or not switch.default_is_stable or divergence.in_generation_prompt:
        return False
    if divergence.reply_as_trained not in ("reasoning", "reasoning-block"):
        return False
    scenario = report.scenario(divergence.scenario)
    return scenario is not None and switch.name not in scenario.kwargs


def shows(finding: Finding, divergence: Divergence) -> bool:
    """Whether ``divergence`` shows ``finding``: its rule proves it, and, where the rule
    narrows what one finding of its stands for (``shown_by``: PC006's opener finding is shown
    only where the opener differs, not by any reply rewrite), the finding's claim does."""
    rule = BY_CODE[finding.code]
    if not rule.RULE.proves(divergence):
        return False
    return rule.shown_by is None or rule.shown_by(finding, divergence)


def best_explainer(candidates: list[Finding], divergence: Divergence) -> Finding:
    """Of findings whose rules all prove ``divergence``, the one that explains it: the rule
    that names its cause, then the one that names what moved it, then the first in the
    template."""
    return max(candidates, key=lambda f: (BY_CODE[f.code].RULE.explanation_rank(divergence), -f.line, -f.column))


def rule_found_by_proof(divergence: Divergence) -> Rule | None:
    """The rule that reports ``divergence`` where no finding explains it: the first that can
    be found by its proof and proves it (a generation-prompt mismatch), else None (the rule
    for unexplained divergences)."""
    return next((rule for rule in RULES if rule.found_by_proof is not None and rule.RULE.proves(divergence)), None)


def explaining_code(divergence: Divergence, findings: list[Finding]) -> str:
    """The code of the rule a check of the template names for ``divergence``, chosen as
    ``attach_proofs`` chooses: the finding whose rule explains it best, else the rule found
    by proof for it, else the rule for unexplained divergences. Replay names the rule of a
    divergence in logged traffic with it, so check and replay never disagree."""
    explaining = [finding for finding in findings if shows(finding, divergence)]
    if explaining:
        return best_explainer(explaining, divergence).code
    rule = rule_found_by_proof(divergence) or reporting(Outcome.UNEXPLAINED_DIVERGENCE)
    return rule.RULE.code


def found_by_proof(divergences: list[Divergence], report: ProofReport, facts) -> list[tuple[Finding, Attribution]]:
    """Findings for divergences no static finding explains: one per rule that can be found by
    its proof (it says where in the template), else one per cause of the rule for
    unexplained divergences, saying which message and field changed."""
    found: list[tuple[Finding, Attribution]] = []
    for rule in RULES:
        if rule.found_by_proof is None:
            continue  # rule_found_by_proof names no such rule: it claims nothing
        claimed = [d for d in divergences if rule_found_by_proof(d) is rule]
        divergences = [d for d in divergences if d not in claimed]
        # One finding per setting a session changed (each names its own), else one per rule.
        groups: dict[str, list[Divergence]] = {}
        for divergence in claimed:
            key = divergence.scenario if divergence.scenario_kind == ScenarioKind.SETTING_CHANGED else ""
            groups.setdefault(key, []).append(divergence)
        for group in groups.values():
            worst = _first_shown(group, report)
            finding = rule.found_by_proof(facts, worst)
            proof, severity = settle(
                Proof.proven(worst, report.rates(worst.scenario)).explaining(group), finding.severity, group, report
            )
            switch = name_the_switch_shown(finding.switch, group, report)
            # the render found it: no pattern in the template stands for it (no hypothesis)
            found.append((finding, Attribution(proof, switch, severity, False, finding.body)))
    unexplained = reporting(Outcome.UNEXPLAINED_DIVERGENCE)
    for cause in sorted({d.cause for d in divergences}):
        claimed = [d for d in divergences if d.cause == cause]
        worst = _first_shown(claimed, report)
        finding = unexplained.unexplained(_TEMPLATE_START, worst)
        proof, severity = settle(
            Proof.proven(worst, report.rates(worst.scenario)).explaining(claimed), finding.severity, claimed, report
        )
        switch = name_the_switch_shown(finding.switch, claimed, report)
        found.append((finding, Attribution(proof, switch, severity, finding.hypothesis, finding.body)))
    return found


def bound_of(claimed: list[Divergence]) -> str | None:
    """What a loss costs at most per turn when it is bounded whatever the session's length:
    every divergence is only the reply's end-of-turn marker, written one way while the reply
    is the newest message and another in history (gpt-oss's <|return|> and <|end|>, OLMo's
    </s> and <|im_end|>). A generated stop token is never fed back, so it costs at most the
    block that holds it; None when any divergence costs more (reasoning dropped, a message
    rewritten), which grows with the session or with the reply."""
    kinds = {divergence.reply_as_trained for divergence in claimed}
    if not claimed or not kinds <= {"end-marker", "after-end-marker"}:
        return None
    worst = _worst(claimed)
    blocks = max(1, -(-worst.lost_tokens // worst.block_size))
    what = "the reply's end-of-turn marker" if kinds == {"end-marker"} else "what follows the reply's end-of-turn marker"
    if kinds == {"end-marker", "after-end-marker"}:
        what = "the reply's end-of-turn marker and what follows it"
    return (
        f"only {what} differs: at most {blocks} block{'s' if blocks > 1 else ''} "
        f"of {worst.block_size} {worst.unit}s a turn, whatever the session's length (measured: {worst.lost_tokens})"
    )


def settle(proof: Proof, severity: str, claimed: list[Divergence], report: ProofReport) -> tuple[Proof, str]:
    """The one place a proven divergence becomes a finding's severity (the rule's,
    ``severity``, else info) and what its proof says beyond the divergence (issue 33): the
    switch values it breaks and is stable under, and, where its loss is bounded, the bound,
    which makes it informational. Any value that breaks fails the run (unless the project
    pinned its deployment's values)."""
    if not proof.is_proven:
        return proof, severity
    bound = bound_of(claimed)
    return replace(proof, switches=measured_switches(proof, report), bound=bound), severity if bound is None else "info"


def measured_switches(proof: Proof, report: ProofReport) -> tuple[SwitchValues, ...]:
    """For each variable the scenarios set, the values whose scenarios this proof's
    divergences came from and the values rendered without them, where some break and the
    finding is not the same whatever the value."""
    breaking = {scenario for scenario, _ in proof.explains}
    if proof.divergence is not None:
        breaking.add(proof.divergence.scenario)
    by_kwargs: dict[str, list[ScenarioResult]] = {}
    for result in report.sessions:
        by_kwargs.setdefault(json.dumps(result.scenario.kwargs, sort_keys=True, default=repr), []).append(result)

    def verdict(results: list[ScenarioResult]) -> str | None:
        if not results:
            return None
        return "breaks" if any(result.scenario.name in breaking for result in results) else "stable"

    default = verdict(by_kwargs.get("{}", []))
    names = dict.fromkeys(name for result in report.sessions for name in result.scenario.kwargs)
    found = []
    for name in names:
        values = dict.fromkeys(
            json.dumps(result.scenario.kwargs[name], default=repr)
            for result in report.sessions
            if list(result.scenario.kwargs) == [name]
        )
        breaks: list[Any] = []
        stable: list[Any] = []
        for value in values:
            said = verdict(by_kwargs.get(json.dumps({name: json.loads(value)}, sort_keys=True, default=repr), []))
            (breaks if said == "breaks" else stable if said == "stable" else []).append(json.loads(value))
        if breaks and (stable or default == "stable"):
            found.append(SwitchValues(name, tuple(breaks), tuple(stable), default, pinned=bool(report.pinned)))
    return tuple(found)


def verify_switch(finding: Finding, switch: Switch, rule, report: ProofReport, others=()) -> tuple[Switch | None, bool]:
    """Check a switch's advice by the renders: the default is called stable only if the
    scenarios rendered without the variable show none of the rule's divergences, and a value
    is advised only if the scenarios rendered with it show none. A claim the renders refute
    is withdrawn, and so is
    one naming a value every render with it fails on; one no scenario could check stays as
    the analysis made it.

    A divergence in the reply generated after the generation prompt that the rule of another
    finding in ``others`` explains better (Qwen3's reasoning, dropped once a user message
    arrives, is PC002's, not the switched generation prompt's of PC006) is that finding's:
    it refutes nothing here. So is one that starts in the text the generation prompt printed
    where history dropped the model's reasoning with it (Qwen3.5's "<think>\n" opener): only
    one that drops the prompt's own text alone is the prompt's whoever else explains it.
    The switch the renders leave the finding (None: no advice stands), and whether the
    renders without the variable show the rule's divergences: the finding is no caller's opt-in."""

    def explained_elsewhere(divergence: Divergence) -> bool:
        if divergence.in_generation_prompt and divergence.cause is not Cause.REPLY_REWRITE:
            return False
        rank = rule.explanation_rank(divergence)
        return any(other.proves(divergence) and other.explanation_rank(divergence) > rank for other in others)

    def diverges(kwargs: dict[str, Any]) -> bool | None:
        rendered = [
            result
            for result in report.sessions
            if result.scenario.kwargs == kwargs and (not rule.proven_in or result.scenario.kind in rule.proven_in)
        ]
        if not rendered:
            return None
        # An empty reasoning block or an end marker history writes its own way is the model's
        # format, not what a switch decides (see bound_of), unless the generation prompt
        # printed it: then the template opened it.
        return any(
            d.first_divergence is not None
            and shows(finding, d)
            and (d.in_generation_prompt or d.reply_as_trained not in ("reasoning-block", "end-marker", "after-end-marker"))
            and not explained_elsewhere(d)
            for result in rendered
            for d in result.divergences
        )

    def fails(value: Any) -> bool:
        # Every scenario rendered with the variable at ``value`` failed: a request that sets it
        # gets an error, not a prompt, so the value is nothing to advise nor to warn of.
        tried = [result for result in report.results if result.scenario.kwargs == {switch.name: value}]
        return bool(tried) and all(result.error is not None for result in tried)

    if switch.stable_value is not None and fails(switch.stable_value):
        if not switch.default_is_stable:
            return None, False  # "set it to a value that fails" is no advice
        switch = Switch(switch.name, None, True, switch.unstable_value)
    if switch.default_is_stable and switch.unstable_value is not None and fails(switch.unstable_value):
        # "breaks when <a value the template fails on>": no caller meets the pattern that way.
        return None, False
    advised_diverges = diverges({switch.name: switch.stable_value}) if switch.stable_value is not None else None
    if switch.default_is_stable and diverges({}):
        if switch.stable_value is not None and advised_diverges is False:
            return Switch(switch.name, switch.stable_value, False, switch.unstable_value), True
        return None, True
    if advised_diverges:
        # "pass X=Y" where the renders with X=Y diverge: the advice would turn it on.
        return (Switch(switch.name, None, True, switch.unstable_value) if switch.default_is_stable else None), False
    return switch, False


# Where findings about the render as a whole stand: the cause is not at one place in the source.
_TEMPLATE_START = Site(1, "", fixed_column=1)


def engine_findings(report: ProofReport) -> list[tuple[Finding, Attribution]]:
    """A finding for each cause of divergence in a render the engine makes without the template."""
    engine_render = reporting(Outcome.ENGINE_RENDER_UNSTABLE)
    if not report.rendered:
        reason = next((result.error for result in report.results if result.error), "nothing rendered")
        finding = engine_render.unchecked(_TEMPLATE_START, reason)
        return [(finding, Attribution.of(finding, proof=Proof.not_provable(report.unit, reason)))]
    found = []
    divergences = report.divergences()
    # A reply rewritten once it is history is the engine dropping what it drops from history.
    grouped = {d: Cause.HISTORY_REWRITE if d.cause is Cause.REPLY_REWRITE else d.cause for d in divergences}
    for cause in sorted(set(grouped.values())):
        worst = _worst([d for d in divergences if grouped[d] == cause])
        finding = engine_render.unstable(_TEMPLATE_START, cause)
        found.append((finding, Attribution.of(finding, proof=Proof.proven(worst, report.rates(worst.scenario)))))
    return found
