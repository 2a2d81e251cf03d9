"""Verifying a fix before it is applied: the fixed template must render every other
conversation as the original did, prove its finding gone, and bring no new one."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any

from ..analysis.facts import LabelKind
from ..analysis.reuse import top_level_scan
from ..analysis.separators import model_separators
from ..checker import _compared_constants, lint_with_facts, prover_inputs, source_engine
from ..edits import FROZEN_TIME_OF_DAY
from ..engines.base import HARMONY
from ..engines.vllm import content_format
from ..findings import Finding, assemble
from ..inputs import TemplateSource
from ..jinja_env import REQUEST_VARIABLES
from ..proofs import Cause, ProofStatus
from ..proving.attribution import attach_proofs
from ..proving.measure import Measure, resolve_special_tokens, tokenizer_identity
from ..proving.session import Prover, Recorded
from ..render import FrozenClock, RenderError, RenderLimitExceeded, compile_template, render
from ..rules import BY_CODE
from ..scenarios import PARALLEL_RESULTS, TOOLS, Scenario, ScenarioKind, parallel_agent
from ..selection import Selection
from ..tokenizer import Tokenizer, common_prefix_length
from .options import FixOptions, Linted, applies_by_default


@dataclass(frozen=True)
class ProvingInputs:
    """What a Verifier proves a template's candidates with, besides their text."""

    tokenizer: Tokenizer | None
    special: dict[str, Any]
    engine: str

    @classmethod
    def of(cls, source: TemplateSource, options: FixOptions) -> ProvingInputs:
        tokenizer, config, _ = prover_inputs(source, options.tokenizer)
        # The fix is proven as the check proves the template: where vLLM renders the model
        # without it (openai-harmony), the template is proven as transformers renders it.
        engine = source_engine(options.engine, source)
        return cls(tokenizer, resolve_special_tokens(tokenizer, config), "hf" if engine == HARMONY else engine)


@dataclass(frozen=True)
class VerificationKey:
    """Everything a Verifier's answers depend on but the question: the original text, the
    fix options, and what it proves with. Where a run meets one template text in several
    files (four containers, a model's copies) and these agree, its answers are the same."""

    text: str
    options: FixOptions
    tokenizer: tuple[str, str] | None  # (kind, directory) of the tokenizer; None: characters
    special: str  # the special tokens the template sees, as sorted JSON
    engine: str

    @classmethod
    def of(cls, source: TemplateSource, options: FixOptions, proving: ProvingInputs) -> VerificationKey:
        special = json.dumps(proving.special, sort_keys=True, default=repr)
        return cls(source.text, options, tokenizer_identity(proving.tokenizer), special, proving.engine)


# A check's question: the patched text, and the fixed findings as the check counts them
# (how many of each code, and whether each applies by default).
CheckQuestion = tuple[str, tuple[tuple[tuple[str, bool], int], ...]]


@dataclass
class Verdicts:
    """A Verifier's answers under one key, returned with a fix so that the next file of the
    run holding the same template is not verified again. Only answers another run would
    repeat are kept: none from a Verifier whose renders ran over a limit or came out random."""

    key: VerificationKey
    unreproduced: dict[tuple[str, int, int], str | None] = field(default_factory=dict)
    checks: dict[CheckQuestion, str | None] = field(default_factory=dict)


class Verifier:
    """Checks a patched template against the original."""

    def __init__(
        self, source: TemplateSource, options: FixOptions, linted: Linted | None = None, proving: ProvingInputs | None = None
    ):
        """``linted``: the original's lint with the default selection, where the caller has it;
        ``proving``: ``ProvingInputs.of(source, options)``, where the caller has it."""
        self.source = source
        self.options = options
        proving = proving or ProvingInputs.of(source, options)
        self.tokenizer, self.special, self.engine = proving.tokenizer, proving.special, proving.engine
        self.block_size = options.block_size
        self.limits = options.limits
        # Renders so far whose outcome another run might not repeat (over a time limit, or
        # random): while there are none, this Verifier's answers can be recalled (Verdicts).
        self.unrepeatable = 0
        self.measure: Measure | None = None  # the proofs' token ids, kept from one to the next
        self.last_recorded: Recorded | None = None  # what the last proof rendered and encoded
        self.clock = FrozenClock(datetime.combine(options.frozen_date, FROZEN_TIME_OF_DAY))
        self._linted: tuple[str, Linted] | None = (source.text, linted) if linted is not None else None
        original = self.findings(source.text)
        self.original_report = self.prove(source.text)
        self.original_recorded = self.last_recorded
        self.original_rendered = {result.scenario.name for result in self.original_report.rendered}
        self.original_codes = self.severe_codes(original)
        self.original_keys = {finding.key for finding in original}
        # The original's findings with their proofs: which the proof shows, and what it finds itself.
        attributed = attach_proofs(original, self.original_report)
        proven = [assemble(finding, outcome) for finding, outcome in zip(original, attributed.outcomes)]
        extra = [assemble(finding, outcome) for finding, outcome in attributed.found]
        self.original_found_by_proof = _failing_causes(extra) if self.original_report.rendered else set()
        self._shown = {finding.key: finding.proof for finding in proven if finding.unproven}
        # Per scenario the original rendered: the text of its messages its whole conversation prints.
        self._printed: list[tuple[Request, list[tuple[str, str]]]] | None = None
        self.original_single_turns = self.single_turns(source.text)
        self.switch_settings = self._switch_settings()
        self._switched_turns: list[str | None] | None = None

    def unreproduced(self, finding: Finding) -> str | None:
        """Why the original's proof does not show ``finding`` (a hypothesis no render
        reproduced, or could not check), else None. A fix for it would change what the model
        sees with nothing to show it is needed: the look-ahead a template uses to group
        parallel tool results looks like one that drops reasoning, and removing it splits
        the group."""
        if finding.key not in self._shown:
            return None
        proof = self._shown[finding.key]
        if proof is None or proof.status is not ProofStatus.NOT_REPRODUCED:
            return None  # not provable: the verification says why no fix can be checked
        return (
            f"the proof did not reproduce it in {len(proof.scenarios)} scenarios, so nothing shows an edit is needed "
            "(--strict fixes it too)"
        )

    def prove(self, text: str):
        # The proof renders from the lint's parse and takes its argument separators: each
        # candidate is parsed and analysed once, not again for its proof.
        self.ready_to_render(text)
        separators = model_separators(self.lint(text).facts)
        prover = Prover(text, self.tokenizer, self.block_size, self.special, self.limits, self.engine, separators, self.measure)
        self.measure = prover.measure  # the candidates render most prompts as the original does
        report = prover.run({})
        self.last_recorded = prover.recorded()
        if not report.deterministic or any(result.limit_exceeded for result in report.results):
            self.unrepeatable += 1
        return report

    def findings(self, text: str) -> list[Finding]:
        return self.lint(text).findings

    def lint(self, text: str) -> Linted:
        """``text``'s findings as ``lint_source`` reports them, and the analysis they came from.
        The last text's is kept: a candidate is parsed, linted and proven from one lint."""
        if self._linted is not None and self._linted[0] == text:
            return self._linted[1]
        # A suppressed pattern is still in the template: it still explains its divergence
        # (a fix of another finding must not be refused for leaving it unexplained).
        source = TemplateSource(self.source.path, self.source.name, text, self.source.container)
        style = Selection(tool_args_style=self.options.tool_args_style)  # how the model writes arguments, as the check's
        facts, findings = lint_with_facts(source, style, suppress=False, sites=False)
        linted = Linted(facts, findings)
        self._linted = (text, linted)
        return linted

    def still_found_at(self, found: list[Finding], code: str) -> str:
        """Where the patched template still has a ``code`` finding: one the original had
        not at that place first (an edit that ends one look-ahead lets another, folded into
        it before, stand on its own)."""
        same = sorted((finding for finding in found if finding.code == code), key=lambda f: f.key in self.original_keys)
        if not same:
            return ""
        return f", at line {same[0].line}, column {same[0].column} of the patched template"

    @staticmethod
    def severe_codes(findings: list[Finding]) -> Counter:
        """Findings by (code, whether they apply by default): a fix of a finding that applies
        must leave one fewer that applies; a fix of an informational one, one fewer at all."""
        return Counter((finding.code, applies_by_default(finding)) for finding in findings)

    def ready_to_render(self, text: str) -> None:
        """Renders of ``text`` compile the lint's parse instead of parsing it again (once a
        candidate gets as far as rendering: most fail on their findings first)."""
        tree = self.lint(text).facts.tree
        if tree is not None:
            with contextlib.suppress(RenderError):  # each render says it, as it would have
                compile_template(text, self.limits, tree)
            content_format(text, tree)

    def _switch_settings(self) -> list[dict[str, Any]]:
        """No variables, then each variable the original reads that a request does not carry,
        alone at each constant the template compares it with, else true. A fix may change
        history turns only: a switch the prover's scenarios never set (Nemotron's
        medium_effort) still prints text on the last turn, and a fix that reads the last user
        message's position as -1 would drop it for every request that sets it."""
        facts = self.lint(self.source.text).facts
        compared = facts.source_map.memo("compared_constants", lambda: _compared_constants(top_level_scan(facts)[1]))
        switches = sorted(facts.variables - REQUEST_VARIABLES - set(self.special))
        return [{name: value} for name in switches for value in compared.get(name) or [True]]

    def switched_turn(self, patched: str) -> str | None:
        """The first switch setting at which ``patched`` renders a single turn otherwise than
        the original does (said as ``name=value``), else None."""
        if self._switched_turns is None:
            self._switched_turns = self.single_turns(self.source.text, self.switch_settings)
        now = self.single_turns(patched, self.switch_settings)
        for index, (before, after) in enumerate(zip(self._switched_turns, now)):
            if before != after:
                ((name, value),) = self.switch_settings[index // len(SINGLE_TURNS)].items()
                return f"{name}={json.dumps(value)}"
        return None

    def single_turns(self, text: str, settings: list[dict[str, Any]] | None = None) -> list[str | None]:
        """``text``'s render of each of SINGLE_TURNS, for each of ``settings`` (template
        variables; default: none)."""
        self.ready_to_render(text)
        out: list[str | None] = []
        for kwargs, messages in ((kwargs, messages) for kwargs in settings or [{}] for messages in SINGLE_TURNS):
            try:
                out.append(
                    render(
                        text,
                        messages,
                        clock=self.clock,
                        add_generation_prompt=True,
                        special_tokens=self.special,
                        limits=self.limits,
                        template_kwargs=kwargs,
                    )
                )
            except RenderError as error:
                self.unrepeatable += isinstance(error, RenderLimitExceeded)
                out.append(None)
        return out

    def check(self, patched: str, fixed: list[Finding]) -> str | None:
        """None if ``patched`` verifies for the ``fixed`` findings, else the reason: that of
        the first of CHECKS it fails (cheapest first; the proof only once the rest pass)."""
        candidate = Candidate(self, patched, fixed)
        return next((reason for named_check in CHECKS if (reason := named_check(candidate)) is not None), None)

    def lost_text(self, patched: str) -> str | None:
        """Why ``patched`` leaves out of a whole conversation text of its request (messages,
        tools, documents, the caller's variables) that the original prints, else None.
        Removing a look-ahead that groups tool results under the call that asked for them
        stops the prover's divergence, and the tool results with it: the model would never
        see them. Reading a scanned position as -1 keeps reasoning, and the documents
        printed on the last user message go with it."""
        if self._printed is None:
            self._printed = []
            for request in self.requests():
                rendered = self.render(self.source.text, request.messages, request.tools, request.kwargs, request.documents)
                if rendered is not None:
                    printed = [(what, text) for what, text in request.strings() if text in rendered]
                    # The longest first: a short one ("city") may be printed only inside a longer.
                    printed.sort(key=lambda item: -len(item[1]))
                    self._printed.append((request, printed))
        for request, printed in self._printed:
            rendered = self.render(patched, request.messages, request.tools, request.kwargs, request.documents)
            if rendered is None:
                continue  # said as a scenario the patched template no longer renders
            for what, text in printed:
                if text not in rendered:
                    return (
                        f"the patched template leaves out text of {what} that the original prints: "
                        f'{_quoted_excerpt(text)} in "{request.name}"'
                    )
        return None

    def requests(self) -> list[Request]:
        """The whole conversations ``lost_text`` renders: each scenario the original rendered,
        and again with what transformers' apply_chat_template also hands a template from the
        request but the scenarios never send (they prove the prompt's stability, which
        neither changes): RAG documents, and the caller's keyword variables as text."""
        rendered = self.rendered_scenarios()
        found = [Request.of(scenario) for scenario in rendered]
        # A chat and an agent conversation, the first of each the original rendered: the
        # others, the clock's and the arguments' scenarios repeat their turns, and each
        # variant costs a render of each for every candidate edit.
        conversations = []
        for kind in (ScenarioKind.CHAT, ScenarioKind.AGENT):
            conversations += [request for request, scenario in zip(found, rendered) if scenario.kind is kind][:1]
        facts = self.lint(self.source.text).facts
        if "documents" in facts.variables:
            found += [replace(request, name=f"{request.name}, with documents", documents=DOCUMENTS) for request in conversations]
        # Only the variables whose value reaches printed text: one only tested (a switch)
        # has no text to leave out, and most templates' only variable is such a switch.
        printed = {
            label.name
            for sink in facts.sinks
            for label in sink.labels
            if label.kind is LabelKind.VARIABLE and label.name is not None
        }
        passed = sorted(printed & facts.variables - REQUEST_VARIABLES - set(self.special))
        if passed:
            # A text each, all at once: a render per variable would cost a render per variable
            # and conversation, for what is a rare place to print one.
            given = {name: f"{name} as the caller passes it" for name in passed}
            found += [
                replace(request, name=f"{request.name}, with the caller's variables", kwargs={**request.kwargs, **given})
                for request in conversations
            ]
        return found + [request for request, _ in self.parallel_results]

    def regrouped(self, patched: str) -> str | None:
        """Why ``patched`` prints a reply's parallel tool results otherwise than the original
        does (the text between the two changes), else None. The look-ahead that gathers a
        call's results into one turn (Command A) looks like one that drops reasoning, and
        reading it as "no later message" splits them into turns of their own, a format the
        model was never trained on: the prover's scenarios call one tool at a time and
        cannot see it, and the results are all still printed."""
        for request, between in self.parallel_results:
            rendered = self.render(patched, request.messages, request.tools, request.kwargs, request.documents)
            if rendered is None:
                return f"the patched template no longer renders: {request.name}"
            now = _between_parallel_results(rendered)
            if now is None or now == between:
                continue  # a result left out is said by lost_text
            # Only what differs: the two often share the markup around the results.
            shared = common_prefix_length(between, now)
            before, after = between[shared:], now[shared:]
            tail = common_prefix_length(before[::-1], after[::-1])
            before, after = before[: len(before) - tail], after[: len(after) - tail]
            first, second = PARALLEL_RESULTS
            return (
                f"the patched template joins a reply's parallel tool results otherwise: between {first!r} and "
                f'{second!r}, {_quoted_excerpt(before)} becomes {_quoted_excerpt(after)} in "{request.name}"'
            )
        return None

    @cached_property
    def parallel_results(self) -> list[tuple[Request, str]]:
        """The parallel-calls conversation, without documents and with them where the template
        reads them (Command A prints tool results only in a request with documents), each in
        the first shape of arguments the original prints both results in, and what it prints
        between the two."""
        found = []
        with_documents = "documents" in self.lint(self.source.text).facts.variables
        for documents in (None, DOCUMENTS) if with_documents else (None,):
            for arguments_as_string in (False, True):
                name = "agent, parallel tool calls" + (", with documents" if documents else "")
                messages = _history(Scenario(name, parallel_agent(arguments_as_string)))
                request = Request(name, messages, TOOLS, documents=documents)
                rendered = self.render(self.source.text, request.messages, request.tools, documents=documents)
                between = _between_parallel_results(rendered) if rendered is not None else None
                if between is not None:
                    found.append((request, between))
                    break
        return found

    def render(self, text: str, messages: list[dict], tools=None, kwargs=None, documents=None) -> str | None:
        """``text`` rendered at the fix date without a generation prompt, or None if it fails."""
        try:
            return render(
                text,
                messages,
                clock=self.clock,
                tools=tools,
                documents=documents,
                template_kwargs=kwargs,
                special_tokens=self.special,
                limits=self.limits,
            )
        except RenderError as error:
            self.unrepeatable += isinstance(error, RenderLimitExceeded)
            return None

    def rendered_scenarios(self):
        """The scenarios the original template rendered: conversations in shapes it accepts."""
        return [result.scenario for result in self.original_report.rendered]


@dataclass
class Candidate:
    """A patched template under verification, with what the checks ask of it computed once,
    as the first check that needs it asks."""

    verifier: Verifier
    patched: str
    fixed: list[Finding]

    @cached_property
    def linted(self) -> Linted:
        return self.verifier.lint(self.patched)

    @cached_property
    def codes(self) -> Counter:
        return self.verifier.severe_codes(self.linted.findings)

    @cached_property
    def report(self):
        return self.verifier.prove(self.patched)

    @cached_property
    def fixed_rules(self) -> list:
        return [BY_CODE[code] for code in {finding.code for finding in self.fixed}]

    @cached_property
    def fixes_replies(self) -> bool:
        """A reply that renders differently as history than as generated is the model's own
        format (gpt-oss drops a final answer's analysis by design): only a fix of a rule the
        generation prompt proves is asked to change it."""
        return any(Cause.GENERATION_PROMPT in rule.RULE.proven_by for rule in self.fixed_rules)


def parses(candidate: Candidate) -> str | None:
    error = candidate.linted.facts.syntax_error
    return None if error is None else f"the patched template does not parse: {error.message}"


def fixed_findings_gone(candidate: Candidate) -> str | None:
    """Each fixed finding is found once less (a fix that applies by default: among those that
    apply by default)."""
    verifier, codes = candidate.verifier, candidate.codes
    for (code, applies), count in Counter((finding.code, applies_by_default(finding)) for finding in candidate.fixed).items():
        now = codes[(code, True)] + (0 if applies else codes[(code, False)])
        before = verifier.original_codes[(code, True)] + (0 if applies else verifier.original_codes[(code, False)])
        if now > before - count:
            return f"{code} is still found in the patched template{verifier.still_found_at(candidate.linted.findings, code)}"
    return None


def no_new_findings(candidate: Candidate) -> str | None:
    fixed_codes = {finding.code for finding in candidate.fixed}
    codes, original = candidate.codes, candidate.verifier.original_codes
    for code, applies in codes:
        if applies and code not in fixed_codes and codes[(code, True)] > original[(code, True)]:
            return f"the patched template has a {code} finding the original does not"
    return None


def single_turn_unchanged(candidate: Candidate) -> str | None:
    if candidate.verifier.single_turns(candidate.patched) != candidate.verifier.original_single_turns:
        return "a single-turn conversation would render differently"
    return None


def keeps_last_turn_at_each_switch(candidate: Candidate) -> str | None:
    """A fix may change history turns only: at each switch the template reads, the last
    (only) turn renders as before."""
    setting = candidate.verifier.switched_turn(candidate.patched)
    return None if setting is None else f"a single-turn conversation would render differently with {setting}"


def keeps_request_text(candidate: Candidate) -> str | None:
    return candidate.verifier.lost_text(candidate.patched)


def keeps_parallel_results(candidate: Candidate) -> str | None:
    return candidate.verifier.regrouped(candidate.patched)


def still_renders(candidate: Candidate) -> str | None:
    """Scenarios rendered before that fail now (a clock step is rendered only when its probe
    changed the render, so one the fix made stable is not tried at all)."""
    failed = {result.scenario.name for result in candidate.report.results if result.error}
    missing = candidate.verifier.original_rendered & failed
    return f"the patched template no longer renders: {', '.join(sorted(missing))}" if missing else None


def proof_gone(candidate: Candidate) -> str | None:
    """No check-b divergence left that a fixed rule's proof shows, unless another finding
    still explains it (it cannot be asked to vanish)."""
    fixed_rules = candidate.fixed_rules
    fixed_codes = {rule.RULE.code for rule in fixed_rules}
    still_found = [BY_CODE[code].RULE for code, _ in candidate.codes if code not in fixed_codes]
    for divergence in candidate.report.divergences():
        if divergence.check != "b" or (divergence.in_reply and not candidate.fixes_replies):
            continue
        if any(rule.proves(divergence) for rule in still_found):
            continue
        if any(rule.RULE.fix_removes_proof and rule.RULE.proves(divergence) for rule in fixed_rules):
            return f'the prover still finds a {divergence.cause} divergence in "{divergence.scenario}"'
    return None


def nothing_unexplained(candidate: Candidate) -> str | None:
    """What the check after the fix reports: no divergence left that no finding explains (a
    fix that removes the finding explaining it must remove the divergence too). The model's
    own format (a reply's reasoning left out once it is history) is left by a fix of anything
    but the generation prompt: said as found by the proof, not a reason to refuse the fix
    that wins history back."""
    added = found_by_proof(candidate.report, candidate.linted.findings, model_format=candidate.fixes_replies)
    for code, cause in sorted(added - candidate.verifier.original_found_by_proof):
        return f"the check after the fix would report {code} (a {cause} divergence no finding explains)"
    return None


def rules_own_checks(candidate: Candidate) -> str | None:
    """The check a fixed rule makes of its own fix (``verify_fix``)."""
    for rule in candidate.fixed_rules:
        reason = rule.verify_fix(candidate.verifier, candidate.patched) if rule.verify_fix is not None else None
        if reason is not None:
            return reason
    return None


SINGLE_TURNS = (
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
)

# What a fix must pass, in order: the cheap ones first, the proof's once the others pass.
CHECKS: tuple[Callable[[Candidate], str | None], ...] = (
    parses,
    fixed_findings_gone,
    no_new_findings,
    single_turn_unchanged,
    keeps_request_text,
    keeps_parallel_results,
    keeps_last_turn_at_each_switch,
    still_renders,
    proof_gone,
    nothing_unexplained,
    rules_own_checks,
)


def _between_parallel_results(rendered: str) -> str | None:
    """What ``rendered`` prints between the two parallel tool results, if it prints them in order."""
    first, second = PARALLEL_RESULTS
    start = rendered.find(first)
    end = rendered.find(second, start + len(first)) if start >= 0 else -1
    return rendered[start + len(first) : end] if end >= 0 else None


def _history(scenario: Scenario) -> list[dict]:
    """The scenario's whole conversation: its last request's messages and the reply to it."""
    last = scenario.calls[-1]
    return [*last.messages, *([last.reply] if last.reply else [])]


@dataclass(frozen=True)
class Request:
    """A whole conversation as a caller sends it, for the verifier to see what of it a patched
    template leaves out: the messages and the reply, and what else the template is handed."""

    name: str
    messages: list[dict]
    tools: list[dict] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    documents: list[dict] | None = None

    @classmethod
    def of(cls, scenario: Scenario) -> Request:
        return cls(scenario.name, _history(scenario), scenario.tools, dict(scenario.kwargs))

    def strings(self) -> list[tuple[str, str]]:
        """(whose, text) of every string of the request a template may print: the tools'
        names, descriptions and parameters, each message's content, reasoning, tool calls'
        names and arguments (roles and short markers apart), the documents, and the
        caller's variables."""
        owners: list[tuple[str, Any]] = [("the tool definitions", self.tools or []), ("the documents", self.documents or [])]
        owners += [
            (f"message {index} ({message.get('role', '?')})", [value for key, value in message.items() if key != "role"])
            for index, message in enumerate(self.messages)
        ]
        owners += [(f"the caller's `{name}`", value) for name, value in self.kwargs.items()]
        found: list[tuple[str, str]] = []
        for whose, owner in owners:
            stack: list = [owner]
            while stack:
                value = stack.pop()
                if isinstance(value, str) and len(value) >= 3:
                    found.append((whose, value))
                elif isinstance(value, dict):
                    stack.extend(value.values())
                elif isinstance(value, list):
                    stack.extend(value)
        return found


# What a RAG request hands the template besides its messages (transformers' `documents`),
# under the keys templates read: Granite's doc_id, Jamba's title and text, the rest as JSON.
DOCUMENTS = [
    {"doc_id": "1", "title": "Quarterly report", "text": "Third-quarter revenue was 12 million."},
    {"doc_id": "2", "title": "Office notes", "text": "The Lyon office opens in May."},
]


def _quoted_excerpt(text: str, width: int = 40) -> str:
    return repr(text if len(text) <= width else text[: width - 1] + "…")


class Verification:
    """A template's Verifier, asked only what the run has not answered yet for the same key
    (``recalled``: the Verdicts earlier fixes of the run returned for this text). The
    Verifier, which proves the original, is made at the first question not recalled."""

    def __init__(self, source: TemplateSource, options: FixOptions, linted: Linted | None, recalled: tuple[Verdicts, ...]):
        self.source, self.options, self.linted = source, options, linted
        self.proving = ProvingInputs.of(source, options)
        key = VerificationKey.of(source, options, self.proving)
        self.verdicts = next((verdicts for verdicts in recalled if verdicts.key == key), None) or Verdicts(key)
        self._verifier: Verifier | None = None
        self._accepted: dict[str, Recorded | None] = {}  # by patched text: what proving it recorded

    @property
    def verifier(self) -> Verifier:
        if self._verifier is None:
            self._verifier = Verifier(self.source, self.options, self.linted, self.proving)
        return self._verifier

    def unreproduced(self, finding: Finding) -> str | None:
        if finding.key in self.verdicts.unreproduced:
            return self.verdicts.unreproduced[finding.key]
        reason = self.verifier.unreproduced(finding)
        if not self.verifier.unrepeatable:
            self.verdicts.unreproduced[finding.key] = reason
        return reason

    def check(self, patched: str, fixed: list[Finding]) -> str | None:
        counted = Counter((finding.code, applies_by_default(finding)) for finding in fixed)
        question: CheckQuestion = (patched, tuple(sorted(counted.items())))
        if question in self.verdicts.checks:
            return self.verdicts.checks[question]
        reason = self.verifier.check(patched, fixed)
        if not self.verifier.unrepeatable:
            self.verdicts.checks[question] = reason
        if reason is None:  # a verified candidate was proven last
            self._accepted[patched] = self.verifier.last_recorded
        return reason

    def recorded(self, text: str) -> Recorded | None:
        """What proving ``text`` (the original, or a verified candidate) recorded, if this
        fix proved it."""
        if self._verifier is None:
            return None
        if text == self.source.text:
            return self._verifier.original_recorded
        return self._accepted.get(text)


def found_by_proof(report, findings: list[Finding], model_format: bool = True) -> set[tuple[str, str]]:
    """(code, cause) of each failing finding the proof itself would add to ``findings``: a
    divergence no finding explains (PC100), or one a rule finds by its proof. ``model_format``
    False leaves out those that are only the reply's own reasoning left out of history."""
    if not report.rendered:
        return set()
    found = [assemble(finding, outcome) for finding, outcome in attach_proofs(findings, report).found]
    if not model_format:
        found = [
            finding
            for finding in found
            if finding.proof is None
            or finding.proof.divergence is None
            or finding.proof.divergence.reply_as_trained not in ("reasoning", "reasoning-block")
        ]
    return _failing_causes(found)


def _failing_causes(found: list[Finding]) -> set[tuple[str, str]]:
    return {(finding.code, str(finding.proof.cause)) for finding in found if finding.fails() and finding.proof is not None}
