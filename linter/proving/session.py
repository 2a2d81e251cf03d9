"""Proving findings: render consecutive model calls of synthetic sessions and diff token
ids.

For each consecutive pair of calls N, N+1 of a scenario two checks run:

- (a) prompt N against prompt N+1, both with the generation prompt: the classic check;
- (b) prompt N plus the reply as the model generated it against prompt N+1: what a cache
  that keeps generated tokens (vLLM does) can reuse.

Each gives the first diverging token (and character), the message, role and field it falls
in, a cause class, the tokens reusable in full blocks (vLLM hashes full blocks only, each
chained on its parent) and the tokens recomputed beyond the ideal (divergence.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any

from ..engines import engine_tokenizer, render_prompt
from ..engines.base import HARMONY, EngineError, Prompt
from ..findings import Finding, Switch
from ..jinja_env import random_draws
from ..proofs import Cause, Divergence
from ..render import DEFAULT_LIMITS, FrozenClock, RenderError, RenderLimitExceeded, RenderLimits, render_session
from ..rules import BY_CODE
from ..scenarios import SWITCH_NAME, THINKING_ON_OFF, Call, Scenario, ScenarioKind, drop_reasoning, scenarios
from ..tokenizer import Tokenizer, common_prefix_length
from .divergence import compare_prompts, first_difference, generation_prompt_span, last_message_mark, reply_start
from .measure import Measure, ServedRequest, concatenated, resolve_special_tokens, served_requests, tokenizer_identity
from .replies import Reply, argument_separators_of, as_written, as_written_in, stop_after_reply, unmarked


@dataclass(frozen=True)
class ProofKey:
    """Everything a proof's renders and token ids depend on but the request: the template,
    whose renderer, the special tokens it sees, the render limits, the tokenizer."""

    template: str
    engine: str
    special_tokens: str  # as sorted JSON
    limits: RenderLimits
    tokenizer: tuple[str, str] | None
    pinned: str = "{}"  # the deployment's chat-template-kwargs, as sorted JSON


@dataclass
class Recorded:
    """What a proof rendered and encoded, for another proof of the same template with the
    same inputs (``key``) to take instead of computing it again: ``--fix`` verifies the
    fixed template with the proof the check that follows makes, less its switch values."""

    key: ProofKey
    prompts: dict[str, Prompt]  # by request (Prover.request_key)
    encoded: dict[str, list[int]]  # token ids by text


@dataclass
class ScenarioResult:
    scenario: Scenario
    divergences: list[Divergence] = field(default_factory=list)
    error: str | None = None
    limit_exceeded: bool = False
    requests: list[ServedRequest] = field(default_factory=list)  # every call, the first included

    @property
    def diverged(self) -> bool:
        return any(d.first_divergence is not None for d in self.divergences)

    def hit_rate(self) -> tuple[float, float]:
        """The projected hit rate as vLLM reports it over the scenario's requests (hits /
        queries, the first request included, its replies cached), and its ideal."""
        queries = sum(request.queries for request in self.requests)
        if not queries:
            return 0.0, 0.0
        hits = sum(request.hits for request in self.requests)
        return hits / queries, sum(request.ideal_hits for request in self.requests) / queries


@dataclass
class ProofReport:
    unit: str
    results: list[ScenarioResult]
    deterministic: bool = True
    note: str | None = None  # said under every proof (which renderer, when it is not the engine's)
    # The project's chat-template-kwargs: every request carried them (its deployment).
    pinned: dict[str, Any] = field(default_factory=dict)

    @property
    def rendered(self) -> list[ScenarioResult]:
        return [result for result in self.results if result.error is None]

    def divergences(self) -> list[Divergence]:
        """The divergences to explain. Where the client changed a setting between two calls,
        only one before the end of the first message is the template's (PC008): after the
        history, a changed request costs what a changed request costs."""
        return [
            d
            for result in self.rendered
            for d in result.divergences
            if d.first_divergence is not None and (d.scenario_kind != ScenarioKind.SETTING_CHANGED or d.cause is Cause.SYSTEM)
        ]

    @property
    def sessions(self) -> list[ScenarioResult]:
        """The rendered scenarios that send one setting throughout (not a setting changed)."""
        return [result for result in self.rendered if result.scenario.kind is not ScenarioKind.SETTING_CHANGED]

    def tried(self) -> tuple[str, ...]:
        """The scenarios rendered, by name: what a finding not reproduced was tried on."""
        return tuple(result.scenario.name for result in self.rendered)

    def unrendered(self) -> tuple[tuple[str, str], ...]:
        """The scenarios that could not be rendered, and why: what a finding not reproduced
        was not tried on (DeepSeek-R1 concatenates tool-call arguments as a string, and
        every tool-calling request fails once vLLM passes them as a mapping)."""
        rendered = set(self.tried())  # a scenario whose fallback rendered was tried
        failed = [
            (result.scenario.name, result.error)
            for result in self.results
            if result.error is not None and result.scenario.name not in rendered
        ]
        return tuple(dict.fromkeys(failed))

    def scenario(self, name: str) -> Scenario | None:
        return next((result.scenario for result in self.results if result.scenario.name == name), None)

    def rates(self, scenario: str) -> tuple[float, float] | None:
        """The projected hit rate of a rendered scenario (check a), and its ideal; None for a
        scenario without whole prompts compared (the argument replay compares tool calls)."""
        result = next((result for result in self.rendered if result.scenario.name == scenario), None)
        if result is None or not result.requests:
            return None
        return result.hit_rate()


class Prover:
    def __init__(
        self,
        template: str,
        tokenizer: Tokenizer | None,
        block_size: int = 16,
        special_tokens=None,
        limits: RenderLimits = DEFAULT_LIMITS,
        engine: str = "hf",
        separators: tuple[str, str] | None = None,
        measure: Measure | None = None,
        recalled: Recorded | None = None,
        pinned: dict[str, Any] | None = None,
    ):
        """``separators``: how the model writes tool-call arguments (``model_separators``),
        where the caller has analysed the template already; ``measure``: another proof's,
        whose encoded texts this one reuses when it measures with the same tokenizer;
        ``recalled``: what another process's proof of the template recorded, taken only
        where its key is this proof's; ``pinned``: the deployment's chat-template-kwargs, which
        every request carries (as vLLM's --default-chat-template-kwargs: a scenario's own
        variables go over them)."""
        self.template = template
        self.pinned = dict(pinned or {})
        self.limits = limits
        self.engine = engine
        measured_with = tokenizer or engine_tokenizer(engine)
        self.measure = measure if measure is not None and measure.tokenizer is measured_with else Measure(measured_with, {})
        self.block_size = block_size
        self.special_tokens = resolve_special_tokens(tokenizer, special_tokens)
        self.clock = FrozenClock(datetime(2026, 3, 1, 12, 0, 0))
        self._renders: dict[str, Prompt] | None = None
        # The request whose render drew most from a random source, and how many times: the
        # one the determinism check renders again (see ``deterministic``).
        self._drawing: tuple[int, tuple[Scenario, list[dict[str, Any]], datetime, bool] | None] = (0, None)
        self._model_separators = separators
        self.key = ProofKey(
            template,
            engine,
            json.dumps(self.special_tokens, sort_keys=True, default=repr),
            limits,
            tokenizer_identity(self.measure.tokenizer),
            json.dumps(self.pinned, sort_keys=True, default=repr),
        )
        self._recalled: dict[str, Prompt] = {}
        if recalled is not None and recalled.key == self.key:
            self._recalled = recalled.prompts
            if self.measure.encoded is not None:
                self.measure.encoded.update(recalled.encoded)
        self._recordable: dict[str, Prompt] | None = None  # the last run's renders, where it can be recorded

    @staticmethod
    def request_key(scenario: Scenario, messages: list[dict[str, Any]], at: datetime, generation_prompt: bool) -> str:
        """What names a request among a template's renders. A request is JSON data, which
        ``repr`` writes exactly, in its keys' order (a template may print a mapping in that
        order, so two orders are two requests), and in two thirds of the time sorted JSON
        took: keys are made for every render a proof asks for."""
        return repr((messages, at, generation_prompt, scenario.tools, scenario.kwargs))

    def recorded(self) -> Recorded | None:
        """What the last run rendered and encoded, for another proof of this key; None where
        another run might not repeat it (a render over a limit, random output)."""
        if self._recordable is None:
            return None
        return Recorded(self.key, dict(self._recordable), dict(self.measure.encoded or {}))

    def render(self, scenario: Scenario, messages: list[dict[str, Any]], at: datetime, generation_prompt: bool) -> Prompt:
        """The prompt for one request, rendered once per request while ``_renders`` keeps
        them: scenarios repeat requests (the chat scenarios again for the second shape of
        tool-call arguments, say)."""
        key = None
        if self._renders is not None:
            key = self.request_key(scenario, messages, at, generation_prompt)
            if key in self._renders:
                return self._renders[key]
            if key in self._recalled:  # rendered for the same key in another process
                self._renders[key] = self._recalled[key]
                return self._renders[key]
        self.clock.set(at)
        draws = random_draws()
        try:
            prompt = render_prompt(
                self.engine,
                self.template,
                messages,
                clock=self.clock,
                tools=scenario.tools,
                kwargs=scenario.kwargs,
                server_kwargs=self.pinned,
                add_generation_prompt=generation_prompt,
                special_tokens=self.special_tokens,
                limits=self.limits,
            )
        except EngineError as error:
            raise RenderError(f"{self.engine} rejects the request: {error}") from None
        finally:
            draws = random_draws() - draws
            if draws > self._drawing[0]:
                self._drawing = (draws, (scenario, messages, at, generation_prompt))
        if key is not None and self._renders is not None:
            self._renders[key] = prompt
        return prompt

    def run(self, switches: dict[str, list[Any]], clocked: frozenset[str] = frozenset()) -> ProofReport:
        # One SIGALRM handler for all the proof's renders, each still arming its own time
        # limit: swapping the handler per render was most of what the limit cost.
        # A pinned variable is rendered at its pinned value only: that is the deployment.
        switches = {name: values for name, values in switches.items() if name not in self.pinned}
        with render_session():
            report = self._run(switches, clocked)
        report.pinned = dict(self.pinned)
        return report

    def _run(self, switches: dict[str, list[Any]], clocked: frozenset[str]) -> ProofReport:
        self._renders, self._recordable, self._drawing = {}, None, (0, None)
        report = self.run_scenarios(switches, clocked)
        if any(result.limit_exceeded for result in report.results):
            return report  # no more seconds spent on it
        renders, self._renders = self._renders, None  # the determinism check renders one request twenty times
        # openai-harmony runs no template code: twenty renders of one request would prove nothing.
        report.deterministic = self.engine == HARMONY or self.deterministic()
        if report.deterministic:
            self._recordable = renders
        else:
            # Every render of a random template is a draw of its own: none is reused.
            report = self.run_scenarios(switches, clocked)
            report.deterministic = False
        return report

    def run_scenarios(self, switches: dict[str, list[Any]], clocked: frozenset[str] = frozenset()) -> ProofReport:
        results: list[ScenarioResult] = []
        # Harmony takes arguments only as the JSON strings of the OpenAI API.
        shapes = (True,) if self.engine == HARMONY else (False, True)
        for arguments_as_string in shapes:
            results = []
            by_name: dict[str, ScenarioResult] = {}
            stepping: dict[str, str] = {}  # the probe whose steps measure the clock, by switch values
            stepped: set[str] = set()  # switch values whose clock a step has changed already
            for scenario in scenarios(switches, arguments_as_string, clocked, "think" in self.template.lower()):
                if not scenario.kwargs and any(v is False and THINKING_ON_OFF.search(n) for n, v in self.pinned.items()):
                    drop_reasoning(scenario)  # deployed with thinking off, the model writes none
                if scenario.refines is not None:
                    # The clock's steps, finest first, only after a probe that changed the render,
                    # for one shape (the clock's format is the same in all), and only until one
                    # changes it: that is how often the prompt changes.
                    probe = by_name.get(scenario.refines)
                    values = json.dumps(scenario.kwargs, sort_keys=True, default=str)
                    if probe is None or not probe.diverged or values in stepped:
                        continue
                    if stepping.setdefault(values, scenario.refines) != scenario.refines:
                        continue
                result = self.run_scenario(scenario)
                if scenario.refines is not None and result.diverged:
                    stepped.add(json.dumps(scenario.kwargs, sort_keys=True, default=str))
                if result.error is not None and not result.limit_exceeded and scenario.fallback is not None:
                    result = self.run_scenario(scenario.fallback)
                results.append(result)
                by_name[scenario.name] = result
                if result.limit_exceeded:
                    return ProofReport(self.measure.unit, results)  # no more seconds spent on it
            if any(result.error is None for result in results if result.scenario.kind is ScenarioKind.AGENT):
                break
        return ProofReport(self.measure.unit, results)

    def deterministic(self) -> bool:
        """Whether the scenarios' renders come out the same every time. Renders that drew
        nothing random do (the ``random`` filter and ``lipsum()`` are all a sandboxed
        template can draw from); otherwise the request that drew most is rendered twenty
        times, wherever it was: a pick made only when tools are given shows in an agent's
        request, never in a bare chat's."""
        _, drawing = self._drawing
        if drawing is None:
            return True
        scenario, messages, at, generation_prompt = drawing
        try:
            first = self.render(scenario, messages, at, generation_prompt)
            # Enough renders that a two-way random choice shows itself (all equal: 2**-19).
            return all(self.render(scenario, messages, at, generation_prompt) == first for _ in range(19))
        except RenderError:
            return True  # a template that fails here fails the scenarios too, and says why there

    def run_scenario(self, scenario: Scenario) -> ScenarioResult:
        if scenario.kind is ScenarioKind.ARGUMENTS:
            return self.run_arguments(scenario)
        result = ScenarioResult(scenario)

        def sent(call: Call) -> Scenario:  # the scenario as this call sends it (its own variables)
            return scenario if call.kwargs is None else replace(scenario, kwargs={**scenario.kwargs, **call.kwargs})

        try:
            prompts = [self.render(sent(call), call.messages, call.clock, True) for call in scenario.calls]
            replies = [self.generated(sent(call), call, prompt.text) for call, prompt in zip(scenario.calls, prompts)]
            ids = [self.measure.prompt_units(prompt) for prompt in prompts]
            generated = [self.measure.units(reply.text if reply is not None else "") for reply in replies]
            result.requests = served_requests(ids, generated, self.block_size)
            for index in range(len(prompts) - 1):
                call, following = scenario.calls[index], scenario.calls[index + 1]
                reply = replies[index]
                text = prompts[index].text
                # (check, cached text and ids, and the pieces they were measured in)
                checks = [("a", text, ids[index], [(text, ids[index])])]
                if reply is not None:
                    pieces = [(text, ids[index]), (reply.text, generated[index])]
                    checks.append(("b", text + reply.text, concatenated(ids[index], generated[index]), pieces))
                    # Check d: the reply as it renders while it is the newest message, with what
                    # the template prints after its end-of-turn marker then (an eos_token, the
                    # next turn's header), where history prints something else: what a
                    # transformers render of the conversation compares, at most the marker's
                    # block (a model stops at the marker). Only where the reply extends (b) clean.
                    trailing = reply.latest[reply.end :]
                    cached_d = text + reply.text + trailing
                    following_text = prompts[index + 1].text
                    if trailing and following_text.startswith(text + reply.text) and not following_text.startswith(cached_d):
                        trailing_ids = self.measure.units(trailing)
                        checks.append(
                            (
                                "d",
                                cached_d,
                                concatenated(concatenated(ids[index], generated[index]), trailing_ids),
                                pieces + [(trailing, trailing_ids)],
                            )
                        )
                for check, cached_text, cached_ids, pieces in checks:
                    opener = None
                    if first_difference(cached_ids, ids[index + 1]) is not None:
                        # Where the generation prompt sits in prompt N: after the text it shares
                        # with the same conversation rendered without one. Rendered only for a
                        # pair that diverges.
                        bare = self.render(sent(call), call.messages, call.clock, False).text
                        opener = generation_prompt_span(text, bare)
                    result.divergences.append(
                        compare_prompts(
                            scenario.name,
                            index,
                            check,
                            cached_text,
                            cached_ids,
                            prompts[index + 1].text,
                            ids[index + 1],
                            following.messages,
                            len(call.messages),
                            self.measure.unit,
                            self.block_size,
                            opener,
                            scenario.kind,
                            latest=reply,
                            token_start=partial(self.measure.start_of, pieces=pieces),
                        )
                    )
        except RenderError as error:
            result.error = str(error)
            result.limit_exceeded = isinstance(error, RenderLimitExceeded)
            result.divergences = []
            result.requests = []
        return result

    def run_arguments(self, scenario: Scenario) -> ScenarioResult:
        """Check c: each tool call's arguments as the model wrote them (compact JSON) against
        how call N+1 renders them in history; the rest of the prompt is the other scenarios'
        business, so a divergence before the tool call cannot hide this one."""
        result = ScenarioResult(scenario)
        try:
            for index, call in enumerate(scenario.calls[:-1]):
                reply = call.reply
                if reply is None or not reply.get("tool_calls"):
                    continue
                following = scenario.calls[index + 1]
                next_prompt = self.render(scenario, following.messages, following.clock, True)
                next_text = next_prompt.text
                cached_text = as_written_in(next_text, reply, self.model_separators())
                if cached_text is None:
                    continue  # printed in a form of its own (XML parameters...): nothing to compare
                result.divergences.append(
                    compare_prompts(
                        scenario.name,
                        index,
                        "c",
                        cached_text,
                        self.measure.units(cached_text),
                        next_text,
                        self.measure.prompt_units(next_prompt),
                        following.messages,
                        len(call.messages),
                        self.measure.unit,
                        self.block_size,
                        None,
                        scenario.kind,
                    )
                )
        except RenderError as error:
            result.error = str(error)
            result.limit_exceeded = isinstance(error, RenderLimitExceeded)
            result.divergences = []
        return result

    def model_separators(self) -> tuple[str, str]:
        """How the model writes tool-call arguments (see ``argument_separators_of``)."""
        if self._model_separators is None:
            self._model_separators = argument_separators_of(self.template)
        return self._model_separators

    def generated(self, scenario: Scenario, call: Call, prompt: str) -> Reply | None:
        """What the model wrote after the generation prompt: the template's render of its reply
        as the latest turn, from where that render leaves the prompt to the end-of-turn
        marker; with tool-call arguments as the model wrote them, and the reply's own text
        where the template prints none of it."""
        if call.reply is None:
            return None
        with_reply = self.render(scenario, call.messages + [call.reply], call.clock, False).text
        bare = None
        if common_prefix_length(prompt, with_reply) < len(prompt):
            # Rendered only where the two part before prompt N ends: was it in the history?
            bare = self.render(scenario, call.messages, call.clock, False).text
        start = reply_start(prompt, with_reply, bare)
        text = stop_after_reply(with_reply[start:], call.reply)
        end = start + len(text)
        text = unmarked(text, last_message_mark(prompt, with_reply, bare))
        if not text.strip() and isinstance(call.reply.get("content"), str):
            text = call.reply["content"]  # never replayed: the model still wrote it
        if scenario.compact_arguments:
            text = as_written(text, call.reply, self.model_separators())
        return Reply(text, with_reply, end)


# The values OpenAI's API (and vLLM's) takes for reasoning_effort, where a template compares it with none.
EFFORTS = ["low", "medium", "high"]


def switch_values(
    findings: list[Finding],
    variables: set[str],
    compared: dict[str, list[Any]] | None = None,
    switches: Sequence[Switch | None] | None = None,
) -> dict[str, list[Any]]:
    """The template variables to render at each value: switches the lint named, at the values
    it named, and every variable that looks like a reasoning switch, at the constants the
    template compares it with (``compared``: reasoning_effort's "low", "high"...), else at
    true and false. Both of llama.cpp's and vLLM's defaults for enable_thinking (true; unset)
    are among them: a deployment may run any value the template reads (the switch policy).
    ``switches``: the findings' switches, where they are not the findings' own (the checker's
    switch trials name them before the findings are assembled)."""
    compared = compared or {}
    values: dict[str, list[Any]] = {}
    for switch in _switches(findings, switches):
        if switch is not None:
            chosen = [switch.stable_value, switch.unstable_value]
            values[switch.name] = [value for value in chosen if value is not None] or [True, False]
    for name in sorted(variables):
        if SWITCH_NAME.search(name):
            tried = values.setdefault(name, [])
            # The constants it is compared with, and the usual values where they are not two.
            usual = EFFORTS if "effort" in name.lower() else [True, False]
            chosen = list(compared.get(name) or [])
            for value in chosen + (usual if len(chosen) < 2 else []):
                if value not in tried:
                    tried.append(value)
    return values


def clocked_switches(findings: list[Finding], switches: Sequence[Switch | None] | None = None) -> frozenset[str]:
    """Switches of findings proven only by the clock: their values are tried on the clock too."""
    return frozenset(
        switch.name
        for finding, switch in zip(findings, _switches(findings, switches))
        if switch is not None and ScenarioKind.CLOCK in BY_CODE[finding.code].RULE.proven_in
    )


def _switches(findings: list[Finding], switches: Sequence[Switch | None] | None) -> Sequence[Switch | None]:
    return [finding.switch for finding in findings] if switches is None else switches
