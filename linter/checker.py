"""Linting one template: parse once, analyse once, run the selected rules, name the switches."""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, replace
from datetime import date
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from jinja2 import nodes

from .analysis.facts import Facts, Site
from .analysis.interpreter import analyze
from .analysis.locations import SourceMap
from .analysis.parsing import parse_with_tokens
from .analysis.reuse import top_level_scan
from .analysis.separators import model_separators
from .analysis.values import UNDEFINED
from .engines import resolve_engine
from .engines.base import HARMONY, LLAMACPP, EngineError
from .engines.llamacpp import ready
from .engines.vllm import content_format
from .findings import Attribution, Finding, FixOffer, Outcome, Place, Switch, assemble
from .inputs import SourceError, TemplateSource, load_json
from .isolation import IsolationError, parallel_map, run_isolated
from .jinja_env import PARSE_ENVIRONMENT
from .placement import placement
from .proofs import Cause, Proof
from .render import DEFAULT_LIMITS, RenderError, RenderLimits, compile_template
from .rules import BY_CODE, SOURCES, STATIC, TRIAL_VALUES, reporting
from .selection import Selection
from .sources import model_type_beside
from .suppressions import Suppression, suppressions

if TYPE_CHECKING:
    from .proving.session import Recorded


@dataclass(frozen=True)
class ProveOptions:
    """Render and diff to prove findings; without a tokenizer, measure in characters."""

    tokenizer: Path | None = None  # a directory; None looks beside the template
    block_size: int = 16
    limits: RenderLimits = DEFAULT_LIMITS
    engine: str = "vllm"  # whose request preprocessing to apply (see engines/)
    # The deployment's chat-template-kwargs (--chat-template-kwargs, the configuration's):
    # every request carries them, and their variables are proven at those values only.
    pinned: tuple[tuple[str, Any], ...] = ()


def lint_isolated(
    source: TemplateSource,
    selection: Selection,
    prove: ProveOptions | None,
    recalled: Recorded | None = None,
    tokenizer_errors: bool = False,
) -> list[Finding]:
    """``lint_source`` in a child process with time and memory limits (see isolation.py);
    a template that exceeds them is reported as a render limit exceeded. A tokenizer that
    fails on a rendered text (a panic in the tokenizers library) is a TokenizerError where
    ``tokenizer_errors`` asks for one (the caller's error line), else reported so too."""
    from .tokenizer import TokenizerError  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it

    try:
        found = run_isolated(_lint_or_tokenizer_failure, (source, selection, prove, recalled))
        if not isinstance(found, TokenizerFailure):
            return found
        if tokenizer_errors:
            raise TokenizerError(found.message)
        stopped = f"TokenizerError: {found.message}"
    except IsolationError as error:
        stopped = str(error)
    finding = reporting(Outcome.RENDER_LIMIT_EXCEEDED).stopped(Site(1, "", fixed_column=1), stopped)
    placed = placement(source.path, source.container, source.name, source.text, source.file_text)
    file_line, file_column = placed.position(1, 1) if placed is not None else (None, None)
    finding = assemble(finding, place=Place(str(source.path), source.name, file_line=file_line, file_column=file_column))
    return [finding] if selection.includes(finding.code) else []


@dataclass(frozen=True)
class TokenizerFailure:
    """A TokenizerError of a child, crossing to its parent as such."""

    message: str


def _lint_or_tokenizer_failure(source, selection, prove, recalled):
    from .tokenizer import TokenizerError  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it

    try:
        return lint_source(source, selection, prove, recalled)
    except TokenizerError as error:
        return TokenizerFailure(str(error))


# Templates the static lint sends to a worker at a time, about: the long-lived workers
# (isolation.long_lived_workers) take batch after batch, so that a worker that drew the
# costly templates is not waited for while the other idles, no call nears the per-call
# time limit, and a batch a hostile template stops is linted again one template per child
# cheaply. A batch holds MIN_BATCH templates at least: fewer are not worth a call of their own.
STATIC_BATCH = 6
MIN_BATCH = 4


def static_batches(sources: list[TemplateSource], jobs: int) -> list[list[int]]:
    """The indices of ``sources`` in batches for ``jobs`` workers, costliest first: a
    template's cost goes with its length, and the batches are taken in order, so the long
    ones start at once and the short ones fill the gaps at the end."""
    count = len(sources)
    if count == 0:
        return []
    batches = max(1, min(max(jobs, -(-count // STATIC_BATCH)), count // MIN_BATCH))
    order = sorted(range(count), key=lambda index: -len(sources[index].text))
    return [order[number * count // batches : (number + 1) * count // batches] for number in range(batches)]


def lint_many_isolated(sources: list[TemplateSource], selection: Selection, jobs: int) -> list[list[Finding]]:
    """The static lint of each of ``sources``, under the limits ``lint_isolated`` applies,
    a batch of templates per call to a worker. A batch that exceeds them is linted again one
    template per child, so that the template at fault gets the PC101 and the others their findings."""

    def lint_batch(batch: list[TemplateSource]) -> list[list[Finding]]:
        try:
            return run_isolated(_lint_batch_for_parent, (batch, selection))
        except IsolationError:
            return [lint_isolated(source, selection, None) for source in batch]

    batches = static_batches(sources, jobs)
    found: list[list[Finding]] = [[] for _ in sources]
    results = parallel_map(lint_batch, [[sources[index] for index in batch] for batch in batches], jobs)
    for batch, result in zip(batches, results):
        for index, findings in zip(batch, result):
            found[index] = findings
    return found


def _lint_batch_for_parent(sources: list[TemplateSource], selection: Selection) -> list[list[Finding]]:
    return [lint_source(source, selection) for source in sources]


def ready_to_fork(sources: list[TemplateSource], prove: ProveOptions | None, *, long_lived: bool = False) -> None:
    """Do once in the parent what each isolated child would otherwise do again: import
    what the threads and children import (so no thread holds a module lock when another
    forks), build jinja's lexer (shared by every environment of these settings), and load
    openai-harmony's vocabulary when a template is rendered through it (0.7 s a child).
    ``long_lived``: the children are long-lived workers (isolation.long_lived_workers),
    each of which loads that vocabulary once if a template of its own needs it, while the
    others go on: loaded here, every template waited for it. ``check`` does not pass it:
    its workers all start at once, so loading the vocabulary here costs it once, not once
    a worker."""
    PARSE_ENVIRONMENT.lexer  # noqa: B018 - built on first use, then cached by jinja
    if prove is not None:
        _ready_to_prove(sources, prove, load_harmony=not long_lived)
    # What the parent holds now, the children only read: out of the collector's sight, a
    # child's collections do not touch (and so copy) every page the parent had.
    gc.freeze()


def _ready_to_prove(sources: list[TemplateSource], prove: ProveOptions, load_harmony: bool) -> None:
    from .engines.harmony import harmony_encoding  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it

    # Imported before the children fork, not again in each of them.
    from .proving import attribution, session  # noqa: F401, PLC0415

    engines = {source_engine(prove.engine, source) for source in sources}
    if load_harmony and HARMONY in engines:
        with contextlib.suppress(EngineError):  # not installed: each template says so
            harmony_encoding()
    if LLAMACPP in engines:  # compiled once here (a second or two), not in every worker
        ready()


def lint_source(
    source: TemplateSource,
    selection: Selection = Selection(),
    prove: ProveOptions | None = None,
    recalled: Recorded | None = None,
) -> list[Finding]:
    """The findings as reported, without their places in the parse tree (``lint_with_facts``
    keeps them, for fixes): a batch would otherwise keep every template's tree alive, and
    the garbage collector walked them all again and again (a seventh of a static run); nor
    need they cross processes. ``recalled``: see ``prove_findings``."""
    return lint_with_facts(source, selection, prove, recalled=recalled, sites=False)[1]


def lint_with_facts(
    source: TemplateSource,
    selection: Selection = Selection(),
    prove: ProveOptions | None = None,
    *,
    suppress: bool = True,
    recalled: Recorded | None = None,
    sites: bool = True,
) -> tuple[Facts, list[Finding]]:
    """``suppress`` False keeps what the template's suppression comments hide (and reports
    none of them unused): a fix's verification counts the patterns still in the template.
    ``sites`` False leaves out the findings' places in the parse tree (``lint_source``)."""
    tree, error, raw_tokens = parse_with_tokens(source.text)
    source_map = SourceMap(source.text, PARSE_ENVIRONMENT, tree, raw_tokens)
    facts = analyze(source.text, tree, source_map, record=True, sources=SOURCES)
    facts.tool_args_style = selection.tool_args_style
    if error is not None:
        facts.syntax_error = error
    # Every rule runs: a divergence that an ignored rule explains is still explained, not unexplained.
    drafts = run_rules(facts, STATIC)
    switches = name_switches(drafts, SwitchTrials(facts, STATIC, drafts))
    facts.trace = None  # the switch trials were its only use
    if prove is not None and tree is not None:
        attributed = prove_findings(source, drafts, switches, facts, prove, recalled)
    else:
        unparsed = Proof.not_provable("char", "the template does not parse") if prove is not None else None
        attributed = [(draft, Attribution.of(draft, switch, unparsed)) for draft, switch in zip(drafts, switches)]
    outcomes = {id(finding): outcome for finding, outcome in attributed}
    selection = selection.for_path(source.path)
    findings = [finding for finding, _ in attributed if selection.includes(finding.code)]
    if suppress:
        findings = apply_suppressions(findings, source_map, selection, complete=tree is not None)
    placed = placement(source.path, source.container, source.name, source.text, source.file_text) if findings else None
    options = OfferOptions(date.today(), selection.tool_args_style)

    def made(finding: Finding, related: tuple[Finding, ...] = ()) -> Finding:
        position = placed.position(finding.line, finding.column) if placed is not None else (None, None)
        place = Place(str(source.path), source.name, source_map.line_text(finding.line), *position)
        offer = partial(fix_offer, facts, options=options) if tree is not None else None
        return assemble(finding, outcomes.get(id(finding)), place, related, offer, sites)

    kept, explained = fold_related(findings, outcomes)
    findings = [made(finding, tuple(made(other) for other in explained.get(id(finding), ()))) for finding in kept]
    findings.sort(key=lambda finding: (finding.line, finding.column, finding.code))
    return facts, findings


@dataclass(frozen=True)
class OfferOptions:
    """What a rule's fix reads of --fix's options (``fix.options.FixOptions``, a layer above)
    to say what it would edit."""

    frozen_date: date
    tool_args_style: str | None = None


def fix_offer(facts: Facts, finding: Finding, options: OfferOptions) -> FixOffer | None:
    """What the finding's rule's fix would do, or why it makes none (None: the rule has no
    fix): the check counts what ``--fix`` can do, and a finding promises no fix its rule
    declines. (The edit is verified only when ``--fix`` makes it.)"""
    rule = BY_CODE.get(finding.code)
    if rule is None or rule.RULE.fix_safety is None or rule.fix is None:
        return None
    fix = rule.fix(facts, finding, options)
    return FixOffer(None, fix.unfixable) if fix.unfixable else FixOffer(rule.RULE.fix_safety, fix.title)


def fold_related(findings: list[Finding], outcomes: dict[int, Attribution]) -> tuple[list[Finding], dict[int, list[Finding]]]:
    """One divergence, one failing finding: a finding whose proven divergence another
    reported finding explains becomes that finding's related location. Where the explaining
    finding is not reported (ignored, suppressed), it stands on its own. The findings that
    stand, and by the ``id`` of each, those it explains."""
    reported = {id(finding) for finding in findings}
    kept = []
    explained: dict[int, list[Finding]] = {}
    for finding in findings:
        outcome = outcomes.get(id(finding))
        by = outcome.explained_by if outcome is not None else None
        if by is not None and id(by) in reported:
            explained.setdefault(id(by), []).append(finding)
        else:
            kept.append(finding)
    return kept, explained


def run_rules(facts: Facts, rules) -> list[Finding]:
    findings: list[Finding] = []
    seen: set[tuple[str, int, int]] = set()
    for rule in rules:
        for finding in rule.check(facts):
            if finding.key not in seen:
                seen.add(finding.key)
                findings.append(finding)
    return findings


class SwitchTrials:
    """The template analysed again with one variable assumed: the values worth trying for
    a variable, and the finding positions each leaves.

    A trial takes over the top-level statements that read what they read in the plain
    analysis (``facts.trace``, when recorded) or in an earlier trial of the same variable
    (see ``analysis.Trace``); ``reanalyse`` analyses every trial whole: the reference the
    faster way is tested against. Only the rules of findings that name the variable run.
    """

    def __init__(self, facts: Facts, rules, findings: list[Finding], *, reanalyse: bool = False):
        self.facts = facts
        self.rules = rules
        self.findings = findings
        self.reanalyse = reanalyse
        self._outcomes: dict[tuple[str, object], set[tuple[str, int, int]]] = {}
        self._traces: dict[str, list] = {}  # per variable: the traces its trials may take over from
        self.taken_over = 0  # top-level statements the trials took over instead of analysing

    def values(self, name: str, finding: Finding | None = None) -> list[object]:
        """What a rule that knows the variable's meaning offers (``trial_values``: a date
        for a date-like name), else unset (the default), the constants the template compares
        it with, and true and false, or -1 for a variable it uses as a number."""
        for offer in TRIAL_VALUES:
            offered = offer(self.facts, name, finding)
            if offered is not None:
                return offered
        compared = self.facts.source_map.memo("compared_constants", lambda: _compared_constants(top_level_scan(self.facts)[1]))
        numeric = self.facts.source_map.memo("numeric_names", lambda: _numeric_names(self.facts))
        if name in numeric:  # an index or a count: true and false are no values to suggest for it
            return [UNDEFINED, *dict.fromkeys([*compared.get(name, ()), -1])]
        return [UNDEFINED, *compared.get(name, ()), True, False]

    def keys(self, name: str, value: object) -> set[tuple[str, int, int]]:
        """The positions of the findings (of the codes that name ``name`` as a candidate)
        when the template is analysed with ``name`` set to ``value``."""
        key = (name, value)
        if key not in self._outcomes:
            facts = self.facts
            reusing = [] if self.reanalyse or facts.trace is None else self._traces.setdefault(name, [facts.trace])
            assumed = analyze(
                facts.text,
                facts.tree,
                facts.source_map,
                {name: value},
                record=bool(reusing),
                reusing=reusing,
                sources=facts.sources,
            )
            if assumed.trace is not None:
                reusing.append(assumed.trace)
            assumed.tool_args_style = facts.tool_args_style  # the run's, as the plain analysis had it
            self.taken_over += assumed.taken_over
            codes = {finding.code for finding in self.findings if name in finding.candidates}
            rules = [rule for rule in self.rules if rule.RULE.code in codes]
            self._outcomes[key] = {finding.key for finding in run_rules(assumed, rules)}
        return self._outcomes[key]


def name_switches(findings: list[Finding], trials: SwitchTrials) -> list[Switch | None]:
    """For each finding, a template variable whose value makes it disappear, if any (None).

    The template is analysed again (``trials``) with the variable unset (the default), true,
    false, or (for date-like names) a fixed string; a value under which the finding is gone
    is stable.
    """
    return [_switch_of(finding, trials) if trials.facts.tree is not None else None for finding in findings]


def _switch_of(finding: Finding, trials: SwitchTrials) -> Switch | None:
    for name in sorted(finding.candidates):
        values = trials.values(name, finding)
        stable = [value for value in values if finding.key not in trials.keys(name, value)]
        if not stable or len(stable) == len(values):
            continue
        default_is_stable = UNDEFINED in stable
        chosen = [value for value in stable if value is not UNDEFINED]
        unstable = [value for value in values if value not in stable and value is not UNDEFINED]
        # A deployment may set any value the template reads: the finding keeps its severity
        # (the proof renders every value and names those that break).
        return Switch(name, chosen[0] if chosen else None, default_is_stable, unstable[0] if unstable else None)
    return None


def _compared_constants(compares: list[nodes.Compare]) -> dict[str, list[object]]:
    """Constants each variable is compared with (``mode == "all"``): the values worth trying."""
    found: dict[str, list[object]] = {}
    for compare in compares:
        operands = [compare.expr] + [operand.expr for operand in compare.ops]
        names = [operand.name for operand in operands if isinstance(operand, nodes.Name)]
        constants = [operand.value for operand in operands if isinstance(operand, nodes.Const)]
        for name in names:
            for constant in constants:
                if (
                    isinstance(constant, (str, int))
                    and not isinstance(constant, bool)
                    and constant not in found.setdefault(name, [])
                ):
                    found[name].append(constant)
    return found


_ARITHMETIC = (nodes.Add, nodes.Sub, nodes.Mul, nodes.Div, nodes.FloorDiv, nodes.Mod)
_ORDERING = frozenset({"lt", "lteq", "gt", "gteq"})
_LOOP_NUMBERS = frozenset({"index", "index0", "revindex", "revindex0", "length"})


def _is_number(node) -> bool:
    """An expression whose value is a number: arithmetic, an integer, a loop counter, a length."""
    if isinstance(node, _ARITHMETIC):
        return True
    if isinstance(node, nodes.Const):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, nodes.Getattr):
        return isinstance(node.node, nodes.Name) and node.node.name == "loop" and node.attr in _LOOP_NUMBERS
    return isinstance(node, nodes.Filter) and node.name in ("length", "count")


def _numeric_names(facts: Facts) -> set[str]:
    """Variables the template uses as numbers: in arithmetic, as an index, ordered, compared
    with or assigned a number."""
    found: set[str] = set()
    for node in facts.nodes_of(*_ARITHMETIC):
        found |= {side.name for side in (node.left, node.right) if isinstance(side, nodes.Name)}
    for getitem in facts.nodes_of(nodes.Getitem):
        if isinstance(getitem.arg, nodes.Name):
            found.add(getitem.arg.name)
    for compare in facts.nodes_of(nodes.Compare):
        operands = [compare.expr] + [operand.expr for operand in compare.ops]
        if any(operand.op in _ORDERING for operand in compare.ops) or any(map(_is_number, operands)):
            found |= {operand.name for operand in operands if isinstance(operand, nodes.Name)}
    for assign in facts.nodes_of(nodes.Assign):
        if isinstance(assign.target, nodes.Name) and _is_number(assign.node):
            found.add(assign.target.name)
    return found


class ProverInputs(NamedTuple):
    tokenizer: Any  # tokenizer.Tokenizer, or None: measured in characters
    special_tokens: dict
    # Why a tokenizer beside the template was not used, for the proofs to say.
    note: str | None = None


def prover_inputs(source: TemplateSource, tokenizer_directory: Path | None) -> ProverInputs:
    """The tokenizer to measure with (the one given, else one beside the template when it
    loads, else none: characters, and a note saying why) and the special tokens the
    template's config names."""
    from .gguf.models import model_for  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it
    from .gguf.tokenizer import own_tokenizer  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it
    from .tokenizer import (  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it
        TokenizerError,
        find_tokenizer_directory,
        load_tokenizer,
        special_tokens_from_config,
    )

    tokenizer, note = None, None
    if (model := model_for(source)) is not None:
        # A GGUF carries its own tokenizer and special tokens (a fixed template beside it too).
        own = own_tokenizer(model)
        mine = load_tokenizer(tokenizer_directory) if tokenizer_directory is not None else own.tokenizer
        return ProverInputs(mine, own.special_tokens)
    if tokenizer_directory is not None:
        tokenizer = load_tokenizer(tokenizer_directory)
    elif (beside := source.tokenizer_directory or find_tokenizer_directory(source.path)) is not None:
        try:
            tokenizer = load_tokenizer(beside)
        except TokenizerError as error:
            # Optional beside the template: measured in characters, and the proofs say why.
            note = f"measured in characters: the tokenizer beside the template could not be used: {error}"
    special: dict = dict(source.special_tokens)
    if source.container == "json":
        try:
            document = load_json(source.path)
            special = special_tokens_from_config(document) if isinstance(document, dict) else {}
        except SourceError:
            special = {}
    return ProverInputs(tokenizer, special, note)


def source_engine(engine: str, source: TemplateSource) -> str:
    """What renders ``source``'s template under ``engine`` (``resolve_engine``): its model's
    config.json beside it, and whether it is a GGUF's (read from one, a Hub GGUF's too, or
    beside one for ``--chat-template-file``)."""
    from .gguf.models import model_for  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it

    gguf = source.container == "gguf" or model_for(source) is not None
    return resolve_engine(engine, source.text, model_type_beside(source.path), gguf=gguf)


def prove_findings(
    source: TemplateSource,
    findings: list[Finding],
    switches: list[Switch | None],
    facts: Facts,
    options: ProveOptions,
    recalled: Recorded | None = None,
) -> list[tuple[Finding, Attribution]]:
    """Each of ``findings`` (whose switches the switch trials named: ``switches``) with what
    the proof makes of it, then the findings the proof itself found with theirs.
    ``recalled``: what ``--fix`` recorded proving this template as fixed, which the proof
    of the template (as the engine renders it, or as transformers does) takes where its
    key (template, engine, special tokens, limits, tokenizer) is the same."""
    from .gguf.models import model_for  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it
    from .gguf.tokenizer import own_tokenizer  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it
    from .proving.attribution import attach_proofs, engine_findings  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it
    from .proving.session import Prover, clocked_switches, switch_values  # noqa: PLC0415 -- the proof stack: a static lint (the hook) never loads it

    engine = source_engine(options.engine, source)
    tokenizer, special, tokenizer_note = prover_inputs(source, options.tokenizer)
    compared = facts.source_map.memo("compared_constants", lambda: _compared_constants(top_level_scan(facts)[1]))
    values = switch_values(findings, facts.variables, compared, switches), clocked_switches(findings, switches)
    pinned = dict(options.pinned)
    # What the renders would analyse or parse the template again for, from the lint's own analysis.
    separators = model_separators(facts)
    content_format(source.text, facts.tree)
    with contextlib.suppress(RenderError):  # each render says it, as it would have
        compile_template(source.text, options.limits, facts.tree)
    if engine != HARMONY:
        prover = Prover(
            source.text,
            tokenizer,
            options.block_size,
            special,
            options.limits,
            engine,
            separators,
            recalled=recalled,
            pinned=pinned,
        )
        report = prover.run(*values)
        if options.tokenizer is None and (model := model_for(source)) is not None:
            report.note = own_tokenizer(model).description  # whose ids, or why characters
        elif tokenizer_note is not None:
            report.note = tokenizer_note
        attributed = attach_proofs(findings, report, facts, switches)
        return [*zip(findings, attributed.outcomes), *attributed.found]
    # vLLM renders this model without the template: the template's findings are proven as
    # the engines that do read it render it, and vLLM's own render gets its own findings.
    on_template = Prover(
        source.text, tokenizer, options.block_size, special, options.limits, "hf", separators, recalled=recalled, pinned=pinned
    )
    report = on_template.run(*values)
    engine_rule = reporting(Outcome.ENGINE_RENDER_UNSTABLE).RULE.code
    report.note = (
        f"rendered as transformers renders the template; vLLM renders this model with openai-harmony instead ({engine_rule})"
    )
    if tokenizer_note is not None:
        report.note += f"; {tokenizer_note}"
    attributed = attach_proofs(findings, report, facts, switches)
    template = [*zip(findings, attributed.outcomes), *attributed.found]
    on_engine = Prover(source.text, tokenizer, options.block_size, special, options.limits, engine, separators, pinned=pinned)
    return template + fold_engine_into_template(engine_findings(on_engine.run({})), template)


def fold_engine_into_template(
    engine: list[tuple[Finding, Attribution]], template: list[tuple[Finding, Attribution]]
) -> list[tuple[Finding, Attribution]]:
    """One break, one named rule: where vLLM's own render of a harmony model rewrites history
    as the template's proven finding does (the analysis a final answer drops), that finding
    names it and the engine's is its related location."""
    rewrites = (Cause.HISTORY_REWRITE, Cause.REPLY_REWRITE)
    named = [
        other
        for other, outcome in template
        if outcome.proof is not None
        and outcome.proof.is_proven
        and assemble(other, outcome).fails()
        and any(cause in rewrites for _, cause in outcome.proof.explains)
    ]
    return [
        (finding, replace(outcome, explained_by=named[0]))
        if named and outcome.proof is not None and outcome.proof.cause in rewrites
        else (finding, outcome)
        for finding, outcome in engine
    ]


def apply_suppressions(
    findings: list[Finding], source_map: SourceMap, selection: Selection, complete: bool = True
) -> list[Finding]:
    """Drop findings a ``{# tmpl-lint: ignore[CODE] #}`` on their line, or an
    ``ignore-file`` anywhere, suppresses; report suppressions that suppress nothing, code by
    code. ``complete`` False: the template does not parse, so the rules did not see it all and
    no suppression can be said to suppress nothing (a code no rule has still can)."""
    found = suppressions(source_map)
    if not found:
        return findings
    kept = []
    for finding in findings:
        matched = [suppression for suppression in found if suppression.covers(finding.code, finding.line)]
        for suppression in matched:
            suppression.suppress(finding.code)
        if not matched:
            kept.append(finding)
    unused = reporting(Outcome.UNUSED_SUPPRESSION).RULE

    def idle(suppression: Suppression) -> bool:
        return complete and suppression.idle(unused.code, selection)

    if selection.includes(unused.code):
        candidates = [suppression for suppression in found if idle(suppression) or suppression.unknown_codes(selection)]
        silenced = set()
        for suppression in candidates:
            # as ruff's noqa of RUF100: a suppression naming PC900 on the line silences it
            silencers = [
                other
                for other in found
                if other is not suppression and other.codes and other.covers(unused.code, suppression.line)
            ]
            if silencers:
                silenced.add(id(suppression))
            for other in silencers:
                other.suppress(unused.code)
        for suppression in candidates:
            if id(suppression) in silenced or not (idle(suppression) or suppression.unknown_codes(selection)):
                continue  # silenced, or a suppression of PC900 that silenced another
            codes = suppression.unused_codes(unused.code, selection) if idle(suppression) else ()
            where = Site(suppression.line, "", fixed_column=suppression.column)
            kept.append(
                reporting(Outcome.UNUSED_SUPPRESSION).unused(
                    where, codes, suppression.unknown_codes(selection), suppression.whole_file
                )
            )
    return kept
