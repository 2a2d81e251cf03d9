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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from .analysis import Site
from .engines import HARMONY, EngineError, Prompt, engine_tokenizer, render_prompt
from .findings import Finding, Outcome, Switch
from .jinja_env import random_draws
from .proofs import AFTER_MESSAGES, BEFORE_MESSAGES, Cause, Divergence, Proof, SwitchValues, snippet
from .render import DEFAULT_LIMITS, FrozenClock, RenderError, RenderLimitExceeded, RenderLimits, render_session
from .rules import BY_CODE, RULES, reporting
from .scenarios import SWITCH_NAME, THINKING_ON_OFF, Call, Scenario, ScenarioKind, drop_reasoning, scenarios
from .tokenizer import Tokenizer, common_prefix_length

DEFAULT_SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}

COMPACT_SEPARATORS = (",", ":")
# A reasoning block's opening tag: <think>, <thinking>, <|begin_of_thought|>, <reasoning>...
REASONING_BLOCK = re.compile(r"<[^<>\s]*(?:think|thought|reason)[^<>\s]*>", re.IGNORECASE)


# A prompt's length units, in order: token ids, or the characters of its text.
Units = list[int] | str


@dataclass
class Measure:
    """Token ids from the tokenizer, or characters when there is none (unit "char")."""

    tokenizer: Tokenizer | None
    # Token ids by text, where the caller keeps them: a proof encodes one prompt in several
    # scenarios, and a fix's candidates render most prompts as the original did (half of
    # a fix's encoding was of texts it had encoded already). None: none kept (replay
    # encodes a log's many texts once each).
    encoded: dict[str, list[int]] | None = None

    @property
    def unit(self) -> str:
        return "token" if self.tokenizer else "char"

    def ids(self, text: str) -> list[int]:
        if not self.tokenizer:
            return list(map(ord, text))
        if self.encoded is None:
            return self.tokenizer.encode(text)
        ids = self.encoded.get(text)
        if ids is None:
            ids = self.encoded[text] = self.tokenizer.encode(text)
        return list(ids)  # the caller's own: the kept ids serve the next caller too

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if prompt.token_ids is not None:
            return list(prompt.token_ids)  # the engine's own tokenization
        return self.ids(prompt.text)

    # What a proof measures prefixes in: token ids, or in characters the text itself. A str
    # compares, slices and concatenates as C memory does; the list of its code points that
    # ``ids`` makes (for a caller that mixes them with logged token ids) was a tenth of a
    # proof without a tokenizer, which is every template of an audit.
    def units(self, text: str) -> Units:
        return self.ids(text) if self.tokenizer else text

    def start_of(self, index: int, pieces: list[tuple[str, Units]]) -> int | None:
        """Where unit ``index`` of the pieces' units, concatenated, starts in their texts,
        concatenated (a prompt, and the reply generated after it); None where the tokenizer
        gives no offsets, or a piece's ids are not its text's encoding (an engine's own)."""
        offset = 0
        for text, units in pieces:
            if index < len(units):
                if not self.tokenizer:
                    return offset + index
                if self.ids(text) != list(units):
                    return None
                start = self.tokenizer.token_start(text, index)
                return None if start is None else offset + start
            index -= len(units)
            offset += len(text)
        return None

    def prompt_units(self, prompt: Prompt) -> Units:
        return prompt.text if prompt.token_ids is None and not self.tokenizer else self.prompt_ids(prompt)


def tokenizer_identity(tokenizer: Tokenizer | None) -> tuple[str, str] | None:
    """What names a tokenizer across processes: its kind and where it was loaded from (a
    directory), or for a GGUF's own tokenizer its vocabulary's cache key (the same in each
    quantisation of the model). None: measured in characters."""
    if tokenizer is None:
        return None
    where = getattr(tokenizer, "identity", None) or str(getattr(tokenizer, "directory", ""))
    return f"{type(tokenizer).__name__}:{getattr(tokenizer, 'kind', '')}", where


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


@dataclass(frozen=True)
class ServedRequest:
    """One request of a scenario as vLLM's prefix cache serves it: its prompt tokens (vLLM's
    queries), those served from cache (its hits), and those it would serve had the prompt
    extended what the session's previous request left computed (its prompt and reply)."""

    queries: int
    hits: int
    ideal_hits: int


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
        failed = [result for result in self.results if result.error is not None and result.scenario.name not in rendered]
        return tuple(dict.fromkeys((result.scenario.name, result.error) for result in failed))

    def scenario(self, name: str) -> Scenario | None:
        return next((result.scenario for result in self.results if result.scenario.name == name), None)

    def rates(self, scenario: str) -> tuple[float, float] | None:
        """The projected hit rate of a rendered scenario (check a), and its ideal; None for a
        scenario without whole prompts compared (the argument replay compares tool calls)."""
        result = next((result for result in self.rendered if result.scenario.name == scenario), None)
        if result is None or not result.requests:
            return None
        return result.hit_rate()


def served_requests(prompts: list[list[int]], generated: list[list[int]], block_size: int) -> list[ServedRequest]:
    """A scenario's requests, one session in order, through vLLM's block pool (unbounded):
    what its PrefixCacheStats count for each. The ideal is what each would hit had its prompt
    extended the previous request's prompt and reply (but the last sampled token, never fed
    back), at most num_tokens - 1 looked up."""
    from .kv_cache import CacheRequest, VllmPrefixCache

    cache = VllmPrefixCache(block_size)
    out, computed = [], None
    for prompt, reply in zip(prompts, generated):
        served = cache.serve(CacheRequest(0, prompt, reply))
        ideal = 0 if computed is None else full_blocks(min(computed, len(prompt) - 1), block_size)
        out.append(ServedRequest(len(prompt), served.hit, max(ideal, served.hit)))
        computed = len(prompt) + max(len(reply) - 1, 0)
    return out


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
    shared = common_prefix_length(a, b)
    if shared < min(len(a), len(b)):
        return shared
    return None if len(a) <= len(b) else len(b)


def reply_start(prompt: str, with_reply: str, bare: str | None = None) -> int:
    """Where the reply begins in the render that ends with it: after what it shares with the
    prompt, but never inside a tag (`<think>` against `</think>` share only "<").

    ``bare`` is the conversation rendered without a generation prompt. Where the two part
    inside it, before the generation prompt (the last message renders otherwise once a reply
    follows it: a `loop.last` test), the model still wrote only what follows prompt N: the
    reply starts where the render, past that point, prints the generation prompt (or the
    longest start of it), not at the text the two share, which would put the rest of the
    last message and a second header in the reply."""
    shared = common_prefix_length(prompt, with_reply)
    opener = common_prefix_length(bare, prompt) if bare is not None else shared
    if shared < opener:
        shared = _after_longest_start(prompt[opener:], with_reply, shared)
    return _outside_tags(with_reply, shared)


def _outside_tags(text: str, shared: int) -> int:
    for opening, closing in (("<", ">"), ("[", "]")):
        start = text.rfind(opening, 0, shared)
        if start >= 0 and closing not in text[start:shared]:
            shared = start
    return shared


def _after_longest_start(wanted: str, text: str, parted: int) -> int:
    """Where ``text`` first finishes the longest start of ``wanted`` it prints past
    ``parted`` (an occurrence may begin before: Command R's "<|START_OF_TURN_TOKEN|>" is
    shared, its "<|CHATBOT_TOKEN|>" is not); ``parted`` if none."""
    for length in range(len(wanted), 0, -1):
        position = text.find(wanted[:length], max(0, parted - length + 1))
        if position >= 0:
            return position + length
    return parted


def last_message_mark(prompt: str, with_reply: str, bare: str | None) -> str:
    """What prompt N prints after its last message only while it is the last (`{% if
    loop.last %} (latest){% endif %}`): the text where prompt N parts from the render with
    the reply, before both print the same closing markup again. Empty where they part
    anywhere else. The render gives the reply the same mark as the newest message; the
    model does not write it."""
    if bare is None:
        return ""
    shared = _outside_tags(with_reply, common_prefix_length(prompt, with_reply))
    tail = prompt[shared : common_prefix_length(bare, prompt)]
    for length in range(1, len(tail)):
        if with_reply.startswith(tail[length:], shared):
            return tail[:length]
    return ""


def generation_prompt_span(prompt: str, without_prompt: str) -> tuple[int, int]:
    """Where the generation prompt sits in ``prompt`` (start, end): after the text it shares
    with the same request rendered without one (``without_prompt``). What ``compare_prompts``
    needs to tell the markup closing the last message from the prompt that opens the reply;
    check, diff and replay all find it this way."""
    return common_prefix_length(without_prompt, prompt), len(prompt)


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
            found.append(("tool_calls.function.arguments", json.dumps(arguments)))  # `tojson` of the string
            parsed = _parsed(arguments)
            if parsed is not None:  # vLLM parses the string into a mapping before rendering
                found.append(("tool_calls.function.arguments", json.dumps(parsed)))
                found.append(("tool_calls.function.arguments", str(parsed)))  # printed as is: {'city': 'Paris'}
        elif arguments is not None:
            found.append(("tool_calls.function.arguments", json.dumps(arguments)))
            found.append(("tool_calls.function.arguments", json.dumps(arguments, separators=(",", ":"))))
            found.append(("tool_calls.function.arguments", str(arguments)))
    return [(name, text) for name, text in found if text]


def _parsed(arguments: str) -> Any:
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def locate(text: str, messages: list[dict[str, Any]], offset: int) -> tuple[int | None, str | None, str | None]:
    """Message index, role and field the character ``offset`` falls in: no message, and the
    field ``BEFORE_MESSAGES``, before the text of the first message (the template's own
    system block); past every message's text, the first of the last messages that printed no
    text, else the message to come and its generation prompt (``compare_prompts`` tells the
    markup closing the last message from it)."""
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
            if cursor == 0 and offset < min(start for start, _, _ in spans):
                return None, None, BEFORE_MESSAGES  # no message's text comes before it
            return index, message.get("role"), "markup"
        cursor = end
        unseen = None
    if unseen is not None:
        # Past the text of every message that printed any, and a message after them printed
        # none (its content emptied, an image only): that message is where it changed, not
        # one to come.
        return unseen, messages[unseen].get("role"), "markup"
    return len(messages), "assistant", "generation-prompt"


def classify(
    index: int | None, role: str | None, field_name: str | None, reply_index: int, offset: int, first_start: int
) -> Cause:
    if field_name == BEFORE_MESSAGES:
        return Cause.SYSTEM
    if index is None:
        return Cause.CLEAN
    if offset < first_start or (index == 0 and role == "system"):
        return Cause.SYSTEM
    if field_name and field_name.startswith("tool_calls.function.arguments"):
        return Cause.TOOL_ARGUMENTS
    if index >= reply_index and field_name in ("markup", "generation-prompt"):
        return Cause.GENERATION_PROMPT
    return Cause.HISTORY_REWRITE


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
        if key is not None:
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
                    checks.append(("b", text + reply.text, ids[index] + generated[index], pieces))
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
                            token_start=lambda position, pieces=pieces: self.measure.start_of(position, pieces),
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
                if not (call.reply or {}).get("tool_calls"):
                    continue
                following = scenario.calls[index + 1]
                next_prompt = self.render(scenario, following.messages, following.clock, True)
                next_text = next_prompt.text
                cached_text = as_written_in(next_text, call.reply, self.model_separators())
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


_SEPARATORS: dict[str, tuple[str, str]] = {}
_SEPARATORS_KEPT = 64


def argument_separators_of(template: str, facts=None) -> tuple[str, str]:
    """How the model writes tool-call arguments: compact ({"city":"Paris"}), unless the
    template names the separators it writes them with (a fix with --tool-args-style does).
    Kept per template text; ``facts`` is its analysis where the caller has one (a proof of a
    template just linted analysed it again only for this)."""
    separators = _SEPARATORS.get(template)
    if separators is None:
        from .analysis import analyze, argument_separators

        separators = argument_separators(facts if facts is not None else analyze(template)) or COMPACT_SEPARATORS
        if len(_SEPARATORS) >= _SEPARATORS_KEPT:
            _SEPARATORS.clear()
        _SEPARATORS[template] = separators
    return separators


@dataclass(frozen=True)
class Reply:
    """The reply as the model generated it (``text``), and the render of call N's
    conversation with the reply as its latest turn (``latest``), whose reply ends at
    ``end``: how the reply renders while it is the newest message."""

    text: str
    latest: str
    end: int


def _argument_forms(reply: dict[str, Any], separators: tuple[str, str]):
    """For each tool call of ``reply`` whose arguments are JSON: the arguments as the model
    wrote them (compact JSON) and the forms a render may print instead (a string passed
    through `tojson`, then the mapping re-serialised with and without ASCII escapes, and the
    mapping printed as it is, `{{ arguments }}` or `| string`: Python's {'city': 'Paris'})."""
    for tool in reply.get("tool_calls") or ():
        arguments = tool["function"]["arguments"]
        mapping = _parsed(arguments) if isinstance(arguments, str) else arguments
        if mapping is None:
            continue
        # (compact too: a template may name compact separators for a model that writes spaced JSON)
        printed = [
            json.dumps(mapping),
            json.dumps(mapping, ensure_ascii=False),
            json.dumps(mapping, separators=(",", ":")),
            str(mapping),
        ]
        if isinstance(arguments, str):
            printed.insert(0, json.dumps(arguments))
        yield json.dumps(mapping, separators=separators), printed


def as_written_in(next_text: str, reply: dict[str, Any], separators: tuple[str, str] = (",", ":")) -> str | None:
    """What a cache that kept the generated tokens holds: ``next_text`` up to where it prints
    the reply's first tool-call arguments, those arguments as the model wrote them, and the
    rest of the reply to its end-of-turn marker. None when the render prints them in no
    form of the mapping (JSON, or Python's own)."""
    for written, printed in _argument_forms(reply, separators):
        found = [(next_text.find(form), form) for form in (written, *printed) if form in next_text]
        if not found:
            continue
        position, form = min(found)
        after = next_text[position + len(form) :]
        marker = STOP_MARKER.search(after)  # the rest of the reply, to its end-of-turn marker
        return next_text[:position] + written + (after[: marker.end()] if marker else "")
    return None


def as_written(text: str, reply: dict[str, Any], separators: tuple[str, str] = (",", ":")) -> str:
    """``text`` with each tool call's arguments as the model wrote them (compact JSON),
    wherever the render printed them otherwise: re-serialised from a mapping, or a string
    passed through `tojson`."""
    for written, printed in _argument_forms(reply, separators):
        for form in printed:
            if form in text:
                text = text.replace(form, written)
                break
    return text


# An end-of-turn marker: <|im_end|>, <|end|>, <|eot_id|>, </s>, [/TOOL_CALLS], <｜end▁of▁sentence｜>...
STOP_MARKER = re.compile(r"<\|[^|<>]{1,40}\|>|<｜[^｜]{1,40}｜>|</s>|<[a-z_]{1,20}\|>|<\|[a-z_]{1,20}>|\[/?[A-Z_]{2,20}\]")


def _ends_in_marker(cached_text: str, char: int) -> bool:
    """Whether all that is cached from ``char`` on is the stop marker that ends it."""
    return any(
        marker.start() <= char and marker.end() == len(cached_text)
        for marker in STOP_MARKER.finditer(cached_text, max(0, char - 48))
    )


def stop_after_reply(text: str, reply: dict[str, Any]) -> str:
    """The reply as generated: what the template prints up to the reply's last text, and on
    to the first end-of-turn marker after it, inclusive. The model writes what its turn
    closes with (a tool call's closing brace and tag) and stops at the marker; whatever the
    template adds after it (a newline, an end-of-conversation token) was not generated."""
    end = -1
    for _, value in message_fields(reply):
        for variant in {value, value.strip()}:
            found = text.rfind(variant)
            if found >= 0 and variant:
                end = max(end, found + len(variant))
    if end < 0:  # the template printed none of the reply (a tool call it cannot show)
        first = STOP_MARKER.search(text)
        return text[: first.end()] if first else text
    marker = STOP_MARKER.search(text, end)
    return text[: marker.end()] if marker else text[:end]


def unmarked(reply: str, mark: str) -> str:
    """The reply without the mark the render gives the newest message before its end marker
    (see ``last_message_mark``): the model wrote its text and the marker, not the mark."""
    if not mark:
        return reply
    closing = next((marker for marker in STOP_MARKER.finditer(reply) if marker.end() == len(reply)), None)
    body = reply[: closing.start()] if closing else reply
    if not body.endswith(mark):
        return reply
    return body[: len(body) - len(mark)] + reply[len(body) :]


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
    *,
    latest: Reply | None = None,
    token_start: Callable[[int], int | None] | None = None,
) -> Divergence:
    """Where ``next_ids`` stops extending ``cached_ids``, and why, from the rendered texts.

    ``generation_prompt`` is the (start, end) of the generation prompt in ``cached_text``;
    ``latest`` how the reply rendered while it was the newest message; ``token_start`` where
    a token of ``cached_ids`` starts in ``cached_text``. A divergence in the
    generation prompt or the reply is the generation prompt's (history never renders the
    reply as it was generated), unless the reply itself renders differently now that it is
    no longer the newest message: then history was rewritten.
    """
    arrived = tuple(str(message.get("role")) for message in next_messages[reply_index + 1 :])
    kind = {"scenario_kind": scenario_kind, "arrived": arrived}
    position = first_difference(cached_ids, next_ids)
    # vLLM computes at least one prompt token (get_computed_blocks looks up num_tokens - 1):
    # a prompt all in the cache, sent again or cut short, still recomputes its last block.
    ideal = full_blocks(min(len(cached_ids), len(next_ids) - 1), block_size) if next_ids else 0
    lengths = (len(cached_ids), len(next_ids))
    if position is not None and position == len(next_ids):
        # The next prompt is all in the cache (it stops where the cached one went on): nothing
        # of it diverges, whatever of the cache goes unused.
        position = None
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
    split_differently = char is None
    if char is None and token_start is not None:
        # The texts agree as far as the shorter goes and the tokens do not: the same text,
        # split otherwise where the prompts part (the generation prompt's "\n" that the next
        # turn's "\n\n" takes in). Placed where the token that differs starts.
        char = token_start(position)
    char = char if char is not None else min(len(cached_text), len(next_text))
    message_index, role, field_name = locate(next_text, next_messages, char)
    first_fields = [next_text.find(text) for _, text in message_fields(next_messages[0])] if next_messages else []
    first_start = min([found for found in first_fields if found >= 0], default=0)
    cause = classify(message_index, role, field_name, reply_index, char, first_start)
    opener_start = generation_prompt[0] if generation_prompt is not None else None
    if opener_start is not None and char >= opener_start and cause not in (Cause.SYSTEM, Cause.TOOL_ARGUMENTS):
        # In the generation prompt the reply was generated after, or in the reply itself: the
        # generation prompt's, unless the reply renders one way while it is the newest
        # message and another once something follows it (then history rewrote it). History
        # that goes on with what the model wrote, right where the prompts part, left out
        # only the template's own opener (Qwen3's empty think block with thinking off):
        # nothing generated was rewritten, and keeping reasoning would win nothing back.
        cause = Cause.GENERATION_PROMPT
        if latest is not None and reply_index < len(next_messages):
            moved = first_difference(latest.latest, next_text)
            if (
                moved is not None
                and opener_start <= moved < latest.end
                and not (
                    char < generation_prompt[1]
                    and resumes_with(next_text, opener_start, char, latest.text, next_messages[reply_index])
                )
            ):
                cause = Cause.REPLY_REWRITE
        if message_index is None or message_index > reply_index:
            message_index, field_name = reply_index, "markup"
            role = next_messages[reply_index].get("role") if reply_index < len(next_messages) else "assistant"
    elif opener_start is not None and char < opener_start and message_index is not None and message_index >= reply_index > 0:
        if reply_index < len(next_messages):
            # Before prompt N's opener, so still inside its last message: the markup that
            # closes it changed once a message came after it (a `loop.last` test, say).
            message_index, field_name, cause = reply_index - 1, "markup", Cause.HISTORY_REWRITE
            role = next_messages[message_index].get("role")
        else:
            # The same conversation again (the clock's scenarios): nothing came after the last
            # message, and what changed is printed after its text, before the opener.
            message_index, role, field_name, cause = None, None, AFTER_MESSAGES, Cause.AFTER_HISTORY
    reply_as_trained = ""
    if message_index is not None and message_index == reply_index and message_index < len(next_messages):
        # The reply's reasoning, or its (empty) reasoning block, as generated, is what its
        # history render leaves out (gpt-oss's analysis; Qwen3's empty <think></think>); or
        # only its end marker differs (gpt-oss generates <|return|>, history writes <|end|>:
        # a generated stop token is never fed back, so never cached).
        reasoning = dict(message_fields(next_messages[message_index])).get("reasoning_content")
        dropped_text = bool(reasoning) and reasoning in cached_text[char:] and reasoning not in next_text[char:]
        dropped_block = REASONING_BLOCK.match(cached_text, char) is not None and REASONING_BLOCK.match(next_text, char) is None
        end_marker = _ends_in_marker(cached_text, char)
        kinds = (("reasoning", dropped_text), ("reasoning-block", dropped_block), ("end-marker", end_marker))
        reply_as_trained = next((kind for kind, found in kinds if found), "")
    elif check == "b" and _ends_in_marker(cached_text, char):
        # Where two replies render alike (two tool calls with no text), the place found may be
        # the other one; what is cached after the divergence is still only the marker.
        reply_as_trained = "end-marker"
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
        reply_as_trained=reply_as_trained,
        in_generation_prompt=generation_prompt is not None and generation_prompt[0] <= char < generation_prompt[1],
        split_differently=split_differently,
        **kind,
    )


def resumes_with(text: str, since: int, at: int, generated: str, reply: dict[str, Any]) -> bool:
    """Whether ``text``, which parts from the prompt at ``at``, goes on from there (or from a
    little earlier, after ``since``: `<think>` and `<tool_call>` share their first letters)
    with the reply as the model generated it, as far as the first of the reply's texts
    (content, reasoning, a tool call's name) is whole: only what the template printed before
    the reply is missing, not what the model wrote. (Further on, the reply may differ for
    reasons of its own: its arguments re-serialised.)"""
    found = [(start, start + len(value)) for _, value in message_fields(reply) if value and (start := generated.find(value)) >= 0]
    if not found:
        return False
    whole = min(found)[1]
    return any(
        common_prefix_length(generated, text[start : start + whole]) >= whole
        for start in range(at, max(since, at - whole) - 1, -1)
    )


# The values OpenAI's API (and vLLM's) takes for reasoning_effort, where a template compares it with none.
EFFORTS = ["low", "medium", "high"]


def switch_values(
    findings: list[Finding], variables: set[str], compared: dict[str, list[Any]] | None = None
) -> dict[str, list[Any]]:
    """The template variables to render at each value: switches the lint named, at the values
    it named, and every variable that looks like a reasoning switch, at the constants the
    template compares it with (``compared``: reasoning_effort's "low", "high"...), else at
    true and false. Both of llama.cpp's and vLLM's defaults for enable_thinking (true; unset)
    are among them: a deployment may run any value the template reads (the switch policy)."""
    compared = compared or {}
    values: dict[str, list[Any]] = {}
    for finding in findings:
        if finding.switch is not None:
            chosen = [finding.switch.stable_value, finding.switch.unstable_value]
            values[finding.switch.name] = [value for value in chosen if value is not None] or [True, False]
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


def clocked_switches(findings: list[Finding]) -> frozenset[str]:
    """Switches of findings proven only by the clock: their values are tried on the clock too."""
    return frozenset(
        finding.switch.name
        for finding in findings
        if finding.switch is not None and ScenarioKind.CLOCK in BY_CODE[finding.code].RULE.proven_in
    )


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


def name_other_switches(finding: Finding, report: ProofReport) -> None:
    """An informational finding shown by renders that set another variable, its own left
    unset (`enable_thinking=true`, which DeepSeek-V3.2 copies into `thinking`): "leave it
    unset" alone would not avoid it; its message names them all."""
    switch = finding.switch
    if switch is None or not switch.default_is_stable or finding.proof is None:
        return
    others = {}
    for name, _ in finding.proof.explains:
        scenario = report.scenario(name)
        kwargs = scenario.kwargs if scenario is not None else {}
        if kwargs and switch.name not in kwargs:
            others.update(kwargs)
    if others:
        finding.switch = replace(switch, also=tuple(sorted(others.items())))


def only_when_asked(finding: Finding, divergences: list[Divergence], report: ProofReport) -> None:
    """A finding whose divergences all come from a template variable set to a value (none
    from a request as callers send it) names the switch that shows it (the analysis's own
    switch, its default now called stable since the renders show that, where it named one).
    It keeps its severity: a deployment may set that value (the switch policy, README)."""
    if not divergences or (finding.switch is not None and finding.switch.default_is_stable):
        return
    asked = [_kwargs(d, report) for d in divergences]
    if not all(asked):
        return
    switch = finding.switch
    if switch is not None:
        unstable = next((kwargs[switch.name] for kwargs in asked if switch.name in kwargs), switch.unstable_value)
        finding.switch = Switch(switch.name, switch.stable_value, True, unstable)
    else:
        (name, value), *_ = sorted(asked[0].items())
        finding.switch = Switch(name, None, True, value)


def attach_proofs(findings: list[Finding], report: ProofReport, facts=None) -> list[Finding]:
    """Give each finding its proof, and return the findings the proof itself found.

    A divergence that several findings' rules prove is explained by one of them (the rule
    that names its cause, then the one that names what moved it, then the first in the
    template); the others point at it and are folded into that finding as related
    locations. A divergence no finding explains becomes a finding of the rule that can be
    found by proof for it (a generation-prompt mismatch), or else of the rule for
    unexplained divergences, which says where the render changed.
    """
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
    errors = [result.error for result in report.results if result.error]
    extra: list[Finding] = []
    if not report.rendered:
        reason = errors[0] if errors else "the template does not parse"
        if errors:
            failure = reporting(Outcome.RENDER_ERROR).RULE.at(
                _TEMPLATE_START, f"the template fails on every conversation tried: {errors[0]}"
            )
            failure.proof = Proof.not_provable(unit, errors[0])
            extra.append(failure)
        for finding in findings:
            finding.proof = Proof.not_provable(unit, reason)
        return extra
    explained: set[int] = set()
    if not report.deterministic:
        # Random output diverges anywhere; the rule that found the randomness accounts for all of it.
        explained |= set(range(len(divergences)))
    generic = []
    refuted: set[int] = set()  # findings whose "leave it unset" the renders refuted
    for finding in findings:
        rule = BY_CODE[finding.code]
        if finding.switch is not None:
            others = [BY_CODE[other.code].RULE for other in findings if other is not finding]
            if verify_switch(finding, rule.RULE, report, others):
                refuted.add(id(finding))
        if hasattr(rule, "prove"):
            finding.proof = rule.prove(report, finding)
            if finding.proof.is_proven:
                shown = {index for index, d in enumerate(divergences) if rule.RULE.proves(d)}
                explained |= shown
                finding.proof = finding.proof.explaining([divergences[index] for index in sorted(shown)])
                settle(finding, [divergences[index] for index in sorted(shown)], report)
        else:
            generic.append(finding)
    # A divergence a rule of its own proof accounts for (the clock's, random output's) is not
    # another rule's to explain.
    matching = {
        id(finding): {
            i
            for i, d in enumerate(divergences)
            if i not in explained and shows(finding, d) and not _unswitched_format(finding, d, report)
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
        own = [divergences[i] for i, chosen in explainer.items() if chosen is finding]
        if own:
            worst = _typical_worst(own, report, finding.switch)
        elif matching[id(finding)]:
            worst = _typical_worst([divergences[i] for i in matching[id(finding)]], report, finding.switch)
            finding.explained_by = explainer[divergences.index(worst)]
        else:
            finding.proof = Proof.not_reproduced(unit, report.tried(), report.unrendered())
            continue
        finding.proof = Proof.proven(worst, report.rates(worst.scenario)).explaining(own)
        if id(finding) not in refuted:  # its own divergences may all be switched; the default's show it too
            only_when_asked(finding, own or [worst], report)
        settle(finding, own or [worst], report)
    for finding in findings:
        name_other_switches(finding, report)
    extra.extend(found_by_proof([d for i, d in enumerate(divergences) if i not in explained], report, facts))
    if report.note:
        for finding in findings + extra:
            if finding.proof is not None:
                finding.proof = finding.proof.with_note(report.note)
    return extra


def _unswitched_format(finding: Finding, divergence: Divergence, report: ProofReport) -> bool:
    """A divergence that is only the model's format (the reasoning or empty reasoning block
    it wrote, which history leaves out), in a scenario that leaves the finding's switch
    unset: not what the switch turns on (QA8: Qwen3's "only when enable_thinking=false"
    listed a scenario without it). It stays informational, found by the proof."""
    switch = finding.switch
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
    return not hasattr(rule, "shown_by") or rule.shown_by(finding, divergence)


def best_explainer(candidates: list[Finding], divergence: Divergence) -> Finding:
    """Of findings whose rules all prove ``divergence``, the one that explains it: the rule
    that names its cause, then the one that names what moved it, then the first in the
    template."""
    return max(candidates, key=lambda f: (BY_CODE[f.code].RULE.explanation_rank(divergence), -f.line, -f.column))


def rule_found_by_proof(divergence: Divergence):
    """The rule that reports ``divergence`` where no finding explains it: the first that can
    be found by its proof and proves it (a generation-prompt mismatch), else None (the rule
    for unexplained divergences)."""
    return next((rule for rule in RULES if hasattr(rule, "found_by_proof") and rule.RULE.proves(divergence)), None)


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


def found_by_proof(divergences: list[Divergence], report: ProofReport, facts) -> list[Finding]:
    """Findings for divergences no static finding explains: one per rule that can be found by
    its proof (it says where in the template), else one per cause of the rule for
    unexplained divergences, saying which message and field changed."""
    found = []
    for rule in RULES:
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
            finding.hypothesis = False  # the render found it: no pattern in the template stands for it
            finding.proof = Proof.proven(worst, report.rates(worst.scenario)).explaining(group)
            only_when_asked(finding, group, report)
            settle(finding, group, report)
            found.append(finding)
    unexplained = reporting(Outcome.UNEXPLAINED_DIVERGENCE)
    for cause in sorted({d.cause for d in divergences}):
        claimed = [d for d in divergences if d.cause == cause]
        worst = _first_shown(claimed, report)
        where = worst.place if worst.message_index is not None else f"the text {worst.place}"
        finding = unexplained.unexplained(
            _TEMPLATE_START,
            f'the next turn does not extend the previous prompt: {where} renders differently in "{worst.scenario}", '
            f"calls {worst.call + 1}->{worst.call + 2} ({cause}), and no rule explains why",
            claimed,
        )
        finding.proof = Proof.proven(worst, report.rates(worst.scenario)).explaining(claimed)
        only_when_asked(finding, claimed, report)
        settle(finding, claimed, report)
        found.append(finding)
    return found


def bound_of(claimed: list[Divergence]) -> str | None:
    """What a loss costs at most per turn when it is bounded whatever the session's length:
    every divergence is only the reply's end-of-turn marker, written one way while the reply
    is the newest message and another in history (gpt-oss's <|return|> and <|end|>, OLMo's
    </s> and <|im_end|>). A generated stop token is never fed back, so it costs at most the
    block that holds it; None when any divergence costs more (reasoning dropped, a message
    rewritten), which grows with the session or with the reply."""
    if not claimed or not all(divergence.reply_as_trained == "end-marker" for divergence in claimed):
        return None
    worst = _worst(claimed)
    blocks = max(1, -(-worst.lost_tokens // worst.block_size))
    return (
        f"only the reply's end-of-turn marker differs: at most {blocks} block{'s' if blocks > 1 else ''} "
        f"of {worst.block_size} {worst.unit}s a turn, whatever the session's length (measured: {worst.lost_tokens})"
    )


def settle(finding: Finding, claimed: list[Divergence], report: ProofReport) -> None:
    """The one place a proven divergence becomes a finding's severity and what its proof
    says beyond the divergence (issue 33): the switch values it breaks and is stable under,
    and, where its loss is bounded, the bound, which makes it informational. Any value that
    breaks fails the run (unless the project pinned its deployment's values)."""
    if finding.proof is None or not finding.proof.is_proven:
        return
    bound = bound_of(claimed)
    if bound is not None:
        finding.severity = "info"
    finding.proof = replace(finding.proof, switches=measured_switches(finding.proof, report), bound=bound)


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
        breaks, stable = [], []
        for value in values:
            said = verdict(by_kwargs.get(json.dumps({name: json.loads(value)}, sort_keys=True, default=repr), []))
            (breaks if said == "breaks" else stable if said == "stable" else []).append(json.loads(value))
        if breaks and (stable or default == "stable"):
            found.append(SwitchValues(name, tuple(breaks), tuple(stable), default, pinned=bool(report.pinned)))
    return tuple(found)


def verify_switch(finding: Finding, rule, report: ProofReport, others=()) -> bool:
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
    one that drops the prompt's own text alone is the prompt's whoever else explains it. True when the renders without the variable show the rule's
    divergences: the finding is no caller's opt-in."""
    switch = finding.switch

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
        # format, not what a switch decides (see model_format), unless the generation prompt
        # printed it: then the template opened it.
        return any(
            d.first_divergence is not None
            and shows(finding, d)
            and (d.in_generation_prompt or d.reply_as_trained not in ("reasoning-block", "end-marker"))
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
            finding.switch = None  # "set it to a value that fails" is no advice
            return False
        switch = finding.switch = Switch(switch.name, None, True, switch.unstable_value)
    if switch.default_is_stable and switch.unstable_value is not None and fails(switch.unstable_value):
        # "breaks when <a value the template fails on>": no caller meets the pattern that way.
        finding.switch = None
        return False
    advised_diverges = diverges({switch.name: switch.stable_value}) if switch.stable_value is not None else None
    if switch.default_is_stable and diverges({}):
        if switch.stable_value is not None and advised_diverges is False:
            finding.switch = Switch(switch.name, switch.stable_value, False, switch.unstable_value)
        else:
            finding.switch = None
        return True
    if advised_diverges:
        # "pass X=Y" where the renders with X=Y diverge: the advice would turn it on.
        finding.switch = Switch(switch.name, None, True, switch.unstable_value) if switch.default_is_stable else None
    return False


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
    # A reply rewritten once it is history is the engine dropping what it drops from history.
    grouped = {d: Cause.HISTORY_REWRITE if d.cause is Cause.REPLY_REWRITE else d.cause for d in divergences}
    for cause in sorted(set(grouped.values())):
        worst = _worst([d for d in divergences if grouped[d] == cause])
        finding = engine_render.RULE.at(
            _TEMPLATE_START,
            f"the engine's own render does not extend the previous prompt ({cause}): {engine_render.advice(cause)}",
        )
        finding.proof = Proof.proven(worst, report.rates(worst.scenario))
        found.append(finding)
    return found
