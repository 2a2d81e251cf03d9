"""Proving findings: render consecutive model calls of synthetic sessions and diff token ids.

For each consecutive pair of calls N, N+1 of a scenario two checks run:

- (a) prompt N against prompt N+1, both with the generation prompt: the classic check;
- (b) prompt N plus the reply as the model generated it against prompt N+1: what a cache
  that keeps generated tokens (vLLM does) can reuse.

Each gives the first diverging token (and character), the message, role and field it falls
in, a cause class, the tokens reusable in full blocks (vLLM hashes full blocks only, each
chained on its parent) and the tokens recomputed beyond the ideal. A finding is proven when
some pair diverges for the cause its rule describes; a divergence no finding explains is
reported through the rule for unexplained divergences.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .analysis import Site
from .engines import HARMONY, EngineError, RenderedPrompt, engine_tokenizer, render_prompt
from .findings import Finding, Outcome
from .proofs import Cause, Divergence, Proof
from .render import DEFAULT_LIMITS, FrozenClock, RenderError, RenderLimitExceeded, RenderLimits
from .rules import BY_CODE, reporting
from .scenarios import SWITCH_NAME, Call, Scenario, scenarios
from .tokenizer import Tokenizer

DEFAULT_SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}

SNIPPET = 48


@dataclass
class Measure:
    """Token ids from the tokenizer, or characters when there is none (unit "char")."""

    tokenizer: Tokenizer | None

    @property
    def unit(self) -> str:
        return "token" if self.tokenizer else "char"

    def ids(self, text: str) -> list[int]:
        if isinstance(text, RenderedPrompt):
            return list(text.token_ids)  # the engine's own tokenization
        return self.tokenizer.encode(text) if self.tokenizer else list(map(ord, text))


@dataclass
class ScenarioResult:
    scenario: Scenario
    divergences: list[Divergence] = field(default_factory=list)
    error: str | None = None
    limit_exceeded: bool = False

    def hit_rate(self, check: str = "a") -> tuple[float, float]:
        """Token-weighted projected hit rate and its clean-extension ideal over the scenario."""
        pairs = [d for d in self.divergences if d.check == check]
        total = sum(d.prompt_tokens[1] for d in pairs)
        if not total:
            return 0.0, 0.0
        return sum(d.reusable_tokens for d in pairs) / total, sum(d.ideal_tokens for d in pairs) / total


@dataclass
class ProofReport:
    unit: str
    results: list[ScenarioResult]
    deterministic: bool = True
    note: str | None = None  # said under every proof (which renderer, when it is not the engine's)

    @property
    def rendered(self) -> list[ScenarioResult]:
        return [result for result in self.results if result.error is None]

    def divergences(self) -> list[Divergence]:
        return [d for result in self.rendered for d in result.divergences if d.first_divergence is not None]

    def rates(self, scenario: str) -> tuple[float, float] | None:
        """The projected hit rate of a rendered scenario (check a), and its ideal."""
        return next((result.hit_rate("a") for result in self.rendered if result.scenario.name == scenario), None)


def resolve_special_tokens(tokenizer: Tokenizer | None, from_config: dict[str, Any] | None) -> dict[str, Any]:
    """What the template sees as bos_token, eos_token...: the tokenizer's when there is one
    (exactly, none added), else the template's config's, else placeholders."""
    if tokenizer is not None:
        return dict(tokenizer.special_tokens)
    if from_config:
        return dict(from_config)
    return dict(DEFAULT_SPECIAL_TOKENS)


def first_difference(a: list, b: list) -> int | None:
    """Index of the first difference, or None when ``a`` is a prefix of ``b``."""
    shared = common_prefix(a, b)
    if shared < min(len(a), len(b)):
        return shared
    return None if len(a) <= len(b) else len(b)


def common_prefix(a, b) -> int:
    """How many leading items (characters, token ids) ``a`` and ``b`` share: slices are
    compared in halves, at C speed, rather than item by item in Python."""
    if type(a) is not type(b):  # a tuple's slice never equals a list's
        a, b = list(a), list(b)
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while high - low > 1:  # a[:low] == b[:low], a[:high] != b[:high]
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    return low


def reply_start(prompt: str, with_reply: str) -> int:
    """Where the reply begins in the render that ends with it: after what it shares with the
    prompt, but never inside a tag (`<think>` against `</think>` share only "<")."""
    shared = common_prefix(prompt, with_reply)
    for opening, closing in (("<", ">"), ("[", "]")):
        start = with_reply.rfind(opening, 0, shared)
        if start >= 0 and closing not in with_reply[start:shared]:
            shared = start
    return shared


def full_blocks(count: int, block_size: int) -> int:
    return (count // block_size) * block_size


def message_fields(message: dict[str, Any]) -> list[tuple[str, str]]:
    """The texts of a message that a template prints, by field name."""
    found: list[tuple[str, str]] = []
    content = message.get("content")
    if isinstance(content, str):
        found.append(("content", content))
    elif isinstance(content, list):
        found.extend(("content", part.get("text", "")) for part in content if isinstance(part, dict))
    reasoning = message.get("reasoning_content") or message.get("reasoning") or message.get("thinking")
    if isinstance(reasoning, str):
        found.append(("reasoning_content", reasoning))
    for call in message.get("tool_calls") or ():
        function = call.get("function", call)
        arguments = function.get("arguments")
        found.append(("tool_calls.function.name", function.get("name") or ""))
        if isinstance(arguments, str):
            found.append(("tool_calls.function.arguments", arguments))
        elif arguments is not None:
            found.append(("tool_calls.function.arguments", json.dumps(arguments)))
            found.append(("tool_calls.function.arguments", json.dumps(arguments, separators=(",", ":"))))
    return [(name, text) for name, text in found if text]


def locate(text: str, messages: list[dict[str, Any]], offset: int) -> tuple[int | None, str | None, str | None]:
    """Message index, role and field the character ``offset`` falls in."""
    cursor = 0
    unseen: int | None = None  # the first message since the last located one with nothing printed
    for index, message in enumerate(messages):
        spans = []
        for name, value in message_fields(message):
            position = text.find(value, cursor)
            if position >= 0:
                spans.append((position, position + len(value), name))
        if not spans:
            unseen = index if unseen is None else unseen
            continue
        end = max(stop for _, stop, _ in spans)
        if offset < end:
            for start, stop, name in spans:
                if start <= offset < stop:
                    return index, message.get("role"), name
            if unseen is not None and offset < min(start for start, _, _ in spans):
                # Between the last located message and this one's text: the message whose
                # text went missing (its reasoning dropped, say) is where it changed.
                return unseen, messages[unseen].get("role"), "markup"
            return index, message.get("role"), "markup"
        cursor = end
        unseen = None
    return len(messages), "assistant", "generation-prompt"


def classify(
    index: int | None, role: str | None, field_name: str | None, reply_index: int, offset: int, first_start: int
) -> Cause:
    if index is None:
        return Cause.CLEAN
    if offset < first_start or (index == 0 and role == "system"):
        return Cause.SYSTEM
    if field_name and field_name.startswith("tool_calls.function.arguments"):
        return Cause.TOOL_ARGUMENTS
    if index >= reply_index and field_name in ("markup", "generation-prompt"):
        return Cause.GENERATION_PROMPT
    return Cause.HISTORY_REWRITE


def snippet(text: str, offset: int) -> str:
    start = max(0, offset - SNIPPET)
    return ("…" if start else "") + text[start : offset + SNIPPET]


class Prover:
    def __init__(
        self,
        template: str,
        tokenizer: Tokenizer | None,
        block_size: int = 16,
        special_tokens=None,
        limits: RenderLimits = DEFAULT_LIMITS,
        engine: str = "hf",
    ):
        self.template = template
        self.limits = limits
        self.engine = engine
        self.measure = Measure(tokenizer or engine_tokenizer(engine))
        self.block_size = block_size
        self.special_tokens = resolve_special_tokens(tokenizer, special_tokens)
        self.clock = FrozenClock(datetime(2026, 3, 1, 12, 0, 0))
        self._renders: dict[str, str] | None = None

    def render(self, scenario: Scenario, messages: list[dict[str, Any]], at: datetime, generation_prompt: bool) -> str:
        """The prompt for one request, rendered once per request while ``_renders`` keeps
        them: scenarios repeat requests (the chat scenarios again for the second shape of
        tool-call arguments, say)."""
        key = None
        if self._renders is not None:
            try:
                key = json.dumps([messages, at.isoformat(), generation_prompt, scenario.tools, scenario.kwargs], sort_keys=True)
            except (TypeError, ValueError):
                key = None
            if key in self._renders:
                return self._renders[key]
        self.clock.set(at)
        try:
            text = render_prompt(
                self.engine,
                self.template,
                messages,
                clock=self.clock,
                tools=scenario.tools,
                kwargs=scenario.kwargs,
                add_generation_prompt=generation_prompt,
                special_tokens=self.special_tokens,
                limits=self.limits,
            )
        except EngineError as error:
            raise RenderError(f"{self.engine} rejects the request: {error}") from None
        if key is not None:
            self._renders[key] = text
        return text

    def run(self, switches: dict[str, list[Any]]) -> ProofReport:
        self._renders = {}
        report = self.run_scenarios(switches)
        if any(result.limit_exceeded for result in report.results):
            return report  # no more seconds spent on it
        self._renders = None  # the determinism check renders one request twenty times
        # openai-harmony runs no template code: twenty renders of one request would prove nothing.
        report.deterministic = self.engine == HARMONY or self.deterministic()
        if not report.deterministic:
            # Every render of a random template is a draw of its own: none is reused.
            report = self.run_scenarios(switches)
            report.deterministic = False
        return report

    def run_scenarios(self, switches: dict[str, list[Any]]) -> ProofReport:
        results: list[ScenarioResult] = []
        # Harmony takes arguments only as the JSON strings of the OpenAI API.
        shapes = (True,) if self.engine == HARMONY else (False, True)
        for arguments_as_string in shapes:
            results = []
            for scenario in scenarios(switches, arguments_as_string):
                results.append(self.run_scenario(scenario))
                if results[-1].limit_exceeded:
                    return ProofReport(self.measure.unit, results)
            if any(result.error is None for result in results if "agent" in result.scenario.name):
                break
        return ProofReport(self.measure.unit, results)

    def deterministic(self) -> bool:
        chat = Scenario("determinism", [Call([{"role": "user", "content": "Hi"}], None)])
        try:
            first = self.render(chat, chat.calls[0].messages, chat.calls[0].clock, True)
            # Enough renders that a two-way random choice shows itself (all equal: 2**-19).
            return all(self.render(chat, chat.calls[0].messages, chat.calls[0].clock, True) == first for _ in range(19))
        except RenderError:
            return True  # a template that fails here fails the scenarios too, and says why there

    def run_scenario(self, scenario: Scenario) -> ScenarioResult:
        result = ScenarioResult(scenario)
        try:
            prompts = [self.render(scenario, call.messages, call.clock, True) for call in scenario.calls]
            bare = [self.render(scenario, call.messages, call.clock, False) for call in scenario.calls[:-1]]
            generated = [self.generated_text(scenario, call, prompt) for call, prompt in zip(scenario.calls, prompts)]
        except RenderError as error:
            result.error = str(error)
            result.limit_exceeded = isinstance(error, RenderLimitExceeded)
            return result
        ids = [self.measure.ids(prompt) for prompt in prompts]
        for index in range(len(prompts) - 1):
            call, following = scenario.calls[index], scenario.calls[index + 1]
            # Where the generation prompt sits in prompt N: after the text it shares with
            # the same conversation rendered without one.
            opener = (common_prefix(bare[index], prompts[index]), len(prompts[index]))
            for check, cached_text, cached_ids in (
                ("a", prompts[index], ids[index]),
                ("b", prompts[index] + generated[index], ids[index] + self.measure.ids(generated[index])),
            ):
                result.divergences.append(
                    compare_prompts(
                        scenario.name,
                        index,
                        check,
                        cached_text,
                        cached_ids,
                        prompts[index + 1],
                        ids[index + 1],
                        following.messages,
                        len(call.messages),
                        self.measure.unit,
                        self.block_size,
                        opener,
                        scenario.kind,
                    )
                )
        return result

    def generated_text(self, scenario: Scenario, call: Call, prompt: str) -> str:
        """What the model wrote after the generation prompt: its reply as the latest turn."""
        if call.reply is None:
            return ""
        with_reply = self.render(scenario, call.messages + [call.reply], call.clock, False)
        text = stop_after_reply(with_reply[reply_start(prompt, with_reply) :], call.reply)
        if scenario.compact_arguments:
            for tool in call.reply.get("tool_calls") or ():
                arguments = tool["function"]["arguments"]
                if isinstance(arguments, str):
                    arguments = json.loads(arguments)
                text = text.replace(json.dumps(arguments), json.dumps(arguments, separators=(",", ":")))
        return text


# An end-of-turn marker: <|im_end|>, <|end|>, <|eot_id|>, </s>, [/TOOL_CALLS], <｜end▁of▁sentence｜>...
STOP_MARKER = re.compile(r"<\|[^|<>]{1,40}\|>|<｜[^｜]{1,40}｜>|</s>|<[a-z_]{1,20}\|>|<\|[a-z_]{1,20}>|\[/?[A-Z_]{2,20}\]")


def stop_after_reply(text: str, reply: dict[str, Any]) -> str:
    """The reply as generated: what the template prints after the reply's last text, up to
    and including one end-of-turn marker. The model stops there; whatever the template adds
    after it (a newline, an end-of-conversation token) was not generated."""
    end = -1
    for _, value in message_fields(reply):
        for variant in {value, value.strip()}:
            found = text.rfind(variant)
            if found >= 0 and variant:
                end = max(end, found + len(variant))
    if end < 0:  # the template printed none of the reply (a tool call it cannot show)
        first = STOP_MARKER.search(text)
        return text[: first.end()] if first else text
    marker = STOP_MARKER.match(text, end)
    return text[: marker.end()] if marker else text[:end]


def compare_prompts(
    scenario: str,
    index: int,
    check: str,
    cached_text: str | None,
    cached_ids: list[int],
    next_text: str | None,
    next_ids: list[int],
    next_messages: list[dict[str, Any]],
    reply_index: int,
    unit: str,
    block_size: int,
    generation_prompt: tuple[int, int] | None = None,
    scenario_kind: str = "",
) -> Divergence:
    """Where ``next_ids`` stops extending ``cached_ids``, and why, from the rendered texts.

    ``generation_prompt`` is the (start, end) of the generation prompt in ``cached_text``.
    """
    kind = {"scenario_kind": scenario_kind}
    position = first_difference(cached_ids, next_ids)
    ideal = full_blocks(len(cached_ids), block_size)
    lengths = (len(cached_ids), len(next_ids))
    if position is None:
        return Divergence(
            scenario, index, check, unit, block_size, None, None, lengths, ideal, ideal, None, None, None, Cause.CLEAN, **kind
        )
    reusable = full_blocks(position, block_size)
    if cached_text is None or next_text is None:
        return Divergence(
            scenario,
            index,
            check,
            unit,
            block_size,
            position,
            None,
            lengths,
            reusable,
            ideal,
            None,
            None,
            None,
            Cause.UNKNOWN,
            **kind,
        )
    char = first_difference(cached_text, next_text)
    char = char if char is not None else min(len(cached_text), len(next_text))
    message_index, role, field_name = locate(next_text, next_messages, char)
    first_fields = [next_text.find(text) for _, text in message_fields(next_messages[0])] if next_messages else []
    first_start = min([found for found in first_fields if found >= 0], default=0)
    cause = classify(message_index, role, field_name, reply_index, char, first_start)
    if generation_prompt is not None and generation_prompt[0] <= char < generation_prompt[1]:
        cause = Cause.GENERATION_PROMPT  # the opener the reply was generated after is not in its history
    elif (
        generation_prompt is not None
        and char < generation_prompt[0]
        and message_index is not None
        and message_index >= reply_index > 0
    ):
        # Before prompt N's opener, so still inside its last message: the markup that closes
        # it changed once a message came after it (a `loop.last` test, say).
        message_index, field_name, cause = reply_index - 1, "markup", Cause.HISTORY_REWRITE
        role = next_messages[message_index].get("role")
    elif cause is Cause.GENERATION_PROMPT and message_index < len(next_messages):
        # The reply's own reasoning, cached as generated, is missing from its history render.
        reasoning = dict(message_fields(next_messages[message_index])).get("reasoning_content")
        if reasoning and reasoning in cached_text[char:] and reasoning not in next_text[char:]:
            cause = Cause.HISTORY_REWRITE
    return Divergence(
        scenario,
        index,
        check,
        unit,
        block_size,
        position,
        char,
        lengths,
        reusable,
        ideal,
        message_index,
        role,
        field_name,
        cause,
        snippet(cached_text, char),
        snippet(next_text, char),
        reply_index,
        **kind,
    )


def switch_values(findings: list[Finding], variables: set[str]) -> dict[str, list[Any]]:
    """The template variables to render at each value: switches the lint named, and any
    variable that looks like a reasoning switch, at true and false."""
    values: dict[str, list[Any]] = {}
    for finding in findings:
        if finding.switch is not None:
            chosen = [finding.switch.stable_value, finding.switch.unstable_value]
            values[finding.switch.name] = [value for value in chosen if value is not None] or [True, False]
    for name in variables:
        if SWITCH_NAME.search(name) and name not in values:
            values[name] = [True, False]
    return values


def attach_proofs(findings: list[Finding], report: ProofReport) -> list[Finding]:
    """Give each finding its proof; return findings of unexplained divergence for causes none explains."""
    unit = report.unit
    limited = [result for result in report.results if result.limit_exceeded]
    if limited:
        reason = f'render limit exceeded in "{limited[0].scenario.name}": {limited[0].error}'
        for finding in findings:
            finding.proof = Proof.not_provable(unit, reason)
        extra = reporting(Outcome.RENDER_LIMIT_EXCEEDED).RULE.at(_TEMPLATE_START, reason)
        extra.proof = Proof.not_provable(unit, reason)
        return [extra]
    divergences = report.divergences()
    explained: set[Cause] = set()
    errors = [result.error for result in report.results if result.error]
    extra: list[Finding] = []
    if not report.rendered and errors:
        failure = reporting(Outcome.RENDER_ERROR).RULE.at(
            _TEMPLATE_START, f"the template fails on every conversation tried: {errors[0]}"
        )
        failure.proof = Proof.not_provable(unit, errors[0])
        extra.append(failure)
    if not report.deterministic:
        # Random output diverges anywhere; the rule that found the randomness accounts for all of it.
        explained |= {d.cause for d in divergences}
    tried = tuple(result.scenario.name for result in report.rendered)
    for finding in findings:
        rule = BY_CODE[finding.code]
        if not report.rendered:
            finding.proof = Proof.not_provable(unit, errors[0] if errors else "the template does not parse")
            continue
        if hasattr(rule, "prove"):
            finding.proof = rule.prove(report)
            continue
        explained |= rule.RULE.proven_by
        matching = [d for d in divergences if rule.RULE.proves(d)]
        if not matching:
            finding.proof = Proof.not_reproduced(unit, tried)
            continue
        worst = max(matching, key=lambda d: (d.lost_tokens, -d.call))
        finding.proof = Proof.proven(worst, report.rates(worst.scenario))
    if report.note:
        for finding in findings:
            finding.proof = finding.proof.with_note(report.note)
    unexplained = reporting(Outcome.UNEXPLAINED_DIVERGENCE).RULE
    for cause in sorted({d.cause for d in divergences} - explained):
        worst = max((d for d in divergences if d.cause == cause), key=lambda d: (d.lost_tokens, -d.call))
        finding = unexplained.at(
            _TEMPLATE_START, f"the next turn does not extend the previous prompt ({cause}) and no rule explains why"
        )
        finding.proof = Proof.proven(worst, report.rates(worst.scenario))
        extra.append(finding)
    return extra


# Where findings about the render as a whole stand: the cause is not at one place in the source.
_TEMPLATE_START = Site(1, "", fixed_column=1)


def engine_findings(report: ProofReport) -> list[Finding]:
    """A finding for each cause of divergence in a render the engine makes without the template."""
    engine_render = reporting(Outcome.ENGINE_RENDER_UNSTABLE)
    if not report.rendered:
        reason = next((result.error for result in report.results if result.error), "nothing rendered")
        finding = engine_render.RULE.at(
            _TEMPLATE_START, f"the engine renders this model without the template, and its render could not be checked: {reason}"
        )
        finding.proof = Proof.not_provable(report.unit, reason)
        return [finding]
    found = []
    divergences = report.divergences()
    for cause in sorted({d.cause for d in divergences}):
        worst = max((d for d in divergences if d.cause == cause), key=lambda d: (d.lost_tokens, -d.call))
        finding = engine_render.RULE.at(
            _TEMPLATE_START,
            f"the engine's own render does not extend the previous prompt ({cause}): {engine_render.advice(cause)}",
        )
        finding.proof = Proof.proven(worst, report.rates(worst.scenario))
        found.append(finding)
    return found
