"""Synthetic agent sessions to render, turn after turn.

A scenario is a list of model calls. Each call is the conversation sent to the model; all
but the last carry the reply the model generated, and the next call's conversation is this
one plus that reply plus what came back (a user message, tool results). Shapes vary where
templates disagree (a system message or not, arguments as a mapping or a JSON string), and
the prover keeps the first shape a template accepts, as minja and llama.cpp probe
templates.

Clock scenarios send one conversation twice, the clock stepped between the two calls (with
and without tools and a system message, where a live date hides under `if tools` or in a
default system prompt): whatever differs is the clock's. A first probe steps every field of
the clock at once; only where it changes the render is the clock stepped again, by a second,
a minute, an hour, half a day (across noon), a day, a week, a month and a year, finest first
and until one changes it (in the first shape that showed it), so that the finding can say how
often the prompt changes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from .render import copy_request

MIDDAY = datetime(2026, 3, 1, 12, 0, 0)


@dataclass(frozen=True)
class ClockStep:
    """How far the clock moves between two calls, and how often a render that changes with
    it (and with no smaller step) changes its prompt."""

    name: str  # "a minute"
    later: datetime
    granularity: str  # "per minute"
    earlier: datetime = MIDDAY  # the first call's clock


# Finest first. Each step changes one field of the clock and nothing coarser: 12:00:00 ->
# 12:01:00 changes the minute, not the hour. MIDDAY is a Sunday, where a week begins for %U
# and ends for %W, so the day is stepped Monday -> Tuesday, inside both weeks; and the half
# day from midnight to noon (AM -> PM, the same date).
CLOCK_STEPS = (
    ClockStep("a second", MIDDAY + timedelta(seconds=1), "per request"),
    ClockStep("a minute", MIDDAY + timedelta(minutes=1), "per minute"),
    ClockStep("an hour", MIDDAY + timedelta(hours=1), "per hour"),
    ClockStep("half a day", MIDDAY, "twice a day", earlier=MIDDAY - timedelta(hours=12)),
    ClockStep("a day", MIDDAY + timedelta(days=2), "per day", earlier=MIDDAY + timedelta(days=1)),
    ClockStep("a week", MIDDAY + timedelta(weeks=1), "per week"),
    ClockStep("a month", MIDDAY.replace(month=MIDDAY.month + 1), "per month"),
    ClockStep("a year", MIDDAY.replace(year=MIDDAY.year + 1), "per year"),
)
# Every field at once, AM -> PM and the week numbers included: the probe that decides whether
# the steps are worth rendering. 2026-03-01 12:00:00 (Sunday) -> 2027-04-02 11:01:01 (Friday).
EVERYTHING_LATER = datetime(2027, 4, 2, 11, 1, 1)

# Nine alphanumerics: Mistral's templates reject anything else, and others accept it.
CALL_IDS = ("Ab3dE6gH9", "Xy7wV5uT3")
SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    }
]
# Variables that turn reasoning on or off, or keep it in history: tried at both values.
SWITCH_NAME = re.compile(r"think|reason|preserve|clear|truncate|history", re.IGNORECASE)
# Switches that turn reasoning itself on or off (not the ones that keep it in history).
THINKING_ON_OFF = re.compile(r"^(enable_)?(thinking|reasoning)$", re.IGNORECASE)


@dataclass
class Call:
    messages: list[dict[str, Any]]
    reply: dict[str, Any] | None
    clock: datetime = MIDDAY
    kwargs: dict[str, Any] | None = None  # this call's own template variables (a setting changed between calls)


class ScenarioKind(StrEnum):
    """What a scenario exercises: rules declare the kinds their proof must come from."""

    CHAT = "chat"
    AGENT = "agent"
    CLOCK = "clock"  # the same conversation, the clock stepped between calls
    ARGUMENTS = "arguments"  # tool-call arguments the model wrote, replayed by the client
    # One session whose second call changes a per-request setting: only a rule that names
    # this kind proves what it shows (the client changed the request, not the history).
    SETTING_CHANGED = "setting-changed"


@dataclass
class Scenario:
    name: str
    calls: list[Call]
    tools: list[dict[str, Any]] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    # The model wrote its tool-call arguments as compact JSON ({"city":"Paris"}), and the
    # client sends them back as a mapping: the replay check for PC004.
    compact_arguments: bool = False
    kind: ScenarioKind = ScenarioKind.CHAT
    # Rendered only when this scenario (by name) diverged: the clock's steps after its probe.
    refines: str | None = None
    clock_step: ClockStep | None = None
    # Run instead when this scenario cannot be rendered (arguments as a mapping where the
    # template refuses strings).
    fallback: Scenario | None = None


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(content: str, reasoning: str) -> dict[str, Any]:
    # Reasoning under both names clients send: transformers copies reasoning_content to
    # `thinking` for gpt-oss, and some templates (Solar Open) read `reasoning`.
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "reasoning": reasoning}


def raw_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """The reply as a client that keeps the model's raw text sends it back: the reasoning
    inside ``content`` between think tags, no reasoning field."""
    reasoning = message.pop("reasoning_content", None)
    message.pop("reasoning", None)
    if reasoning:
        message["content"] = f"<think>\n{reasoning}\n</think>\n\n{message['content']}"
    return message


def tool_call(call_id: str, city: str, reasoning: str, arguments_as_string: bool, compact: bool = False) -> dict[str, Any]:
    arguments: Any = {"city": city}
    if arguments_as_string:
        arguments = json.dumps(arguments, separators=(",", ":")) if compact else json.dumps(arguments)
    message = answer("", reasoning)
    message["tool_calls"] = [{"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]
    return message


def tool_result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": "get_weather", "content": text}


def session(head: list[dict[str, Any]], steps: list[tuple[dict[str, Any], list[dict[str, Any]]]], clocks=None) -> list[Call]:
    """Calls from an opening conversation and (reply, what follows the reply) steps."""
    calls = []
    messages = list(head)
    for index, (reply, following) in enumerate(steps):
        clock = clocks[index] if clocks else MIDDAY
        calls.append(Call(copy_request(messages), copy_request(reply), clock))
        messages = messages + [reply] + following
    clock = clocks[len(steps)] if clocks else MIDDAY
    calls.append(Call(copy_request(messages), None, clock))
    return calls


def chat_head(system: bool) -> list[dict[str, Any]]:
    return ([SYSTEM] if system else []) + [user("What is the capital of France?")]


def agent_head(system: bool) -> list[dict[str, Any]]:
    return ([SYSTEM] if system else []) + [user("What is the weather in Paris?")]


def chat(system: bool, clocks=None, reasoning_in_content: bool = False) -> list[Call]:
    """Three user queries answered with reasoning. ``reasoning_in_content``: the client
    replays the model's raw ``<think>...</think>`` inside ``content`` (many do)."""
    replies = [answer("Paris.", "The user asks for a capital; France's is Paris."), answer("Rome.", "Italy's capital is Rome.")]
    if reasoning_in_content:
        replies = [raw_reasoning(reply) for reply in replies]
    return session(
        chat_head(system),
        [(replies[0], [user("And of Italy?")]), (replies[1], [user("Thanks. Which is larger?")])],
        clocks,
    )


def agent(system: bool, arguments_as_string: bool, narrated: bool = False, compact: bool = False) -> list[Call]:
    """Tool calls across two user queries. ``narrated``: the tool-call replies say something
    ("Checking the weather.") instead of reasoning, as many models do. ``compact``: argument
    strings as models write them, without spaces."""
    first, second = CALL_IDS
    head = agent_head(system)

    def calling(call_id: str, city: str, reasoning: str) -> dict[str, Any]:
        message = tool_call(call_id, city, reasoning, arguments_as_string, compact)
        if narrated:
            message["content"] = f"Checking the weather in {city}."
            for key in ("reasoning_content", "reasoning"):
                message.pop(key)
        return message

    return session(
        head,
        [
            (calling(first, "Paris", "I need the weather tool for Paris."), [tool_result(first, "18 C, sunny")]),
            (answer("It is 18 C and sunny in Paris.", "The tool says 18 C and sunny."), [user("And in Rome?")]),
            (calling(second, "Rome", "Same tool, for Rome."), [tool_result(second, "24 C, clear")]),
            (answer("It is 24 C and clear in Rome.", "The tool says 24 C and clear."), [user("Thanks!")]),
        ],
    )


def chained_agent(arguments_as_string: bool) -> list[Call]:
    """Two tool calls in a row before the answer: the model reads one tool result and calls
    a tool again, as agents do. A tool result is then followed by a tool call, not only by
    an answer (DeepSeek-R1's closing tag after the loop is missed there)."""
    first, second = CALL_IDS
    return session(
        [user("Is it warmer in Paris or in Rome?")],
        [
            (tool_call(first, "Paris", "First the weather in Paris.", arguments_as_string), [tool_result(first, "18 C, sunny")]),
            (tool_call(second, "Rome", "Now the weather in Rome.", arguments_as_string), [tool_result(second, "24 C, clear")]),
            (answer("Rome is warmer: 24 C against 18 C.", "Rome 24 C, Paris 18 C."), [user("Thanks!")]),
        ],
    )


# What the two calls of one reply (parallel_agent) return, in order.
PARALLEL_RESULTS = ("18 C, sunny", "24 C, clear")


def parallel_agent(arguments_as_string: bool) -> list[Call]:
    """One reply that calls the tool for two cities at once, both results sent back together,
    then the answer and a new query. Not among the prover's scenarios (the two results arrive
    in one request: nothing in it moves between turns); the fix's verifier renders it to see
    that a patched template still joins the results as the original did (Command A prints a
    call's parallel results as one turn, by looking ahead from the first)."""
    first, second = CALL_IDS
    calls = tool_call(first, "Paris", "I need the weather tool for Paris and for Rome.", arguments_as_string)
    calls["tool_calls"] += tool_call(second, "Rome", "", arguments_as_string)["tool_calls"]
    return session(
        [user("What is the weather in Paris and in Rome?")],
        [
            (calls, [tool_result(first, PARALLEL_RESULTS[0]), tool_result(second, PARALLEL_RESULTS[1])]),
            (answer("Paris: 18 C and sunny. Rome: 24 C and clear.", "Both tools answered."), [user("Thanks!")]),
        ],
    )


def clock_scenarios(kwargs: dict[str, Any] | None = None) -> list[Scenario]:
    """One conversation sent twice, the clock stepped between the calls, in each shape a live
    date can hide behind: a default system prompt (no system message), `if tools`."""
    kwargs = kwargs or {}
    label = "".join(f", {name}={json.dumps(value)}" for name, value in kwargs.items())
    found = []
    for tools in (False, True):
        for system in (False, True):
            head = agent_head(system) if tools else chat_head(system)
            shape = "clock" + {(False, False): "", (True, False): " with system", (False, True): " with tools"}.get(
                (system, tools), " with system and tools"
            )
            probe = f"{shape}{label}, everything later"
            found.append(
                Scenario(
                    probe,
                    [Call(head, None, MIDDAY), Call(head, None, EVERYTHING_LATER)],
                    TOOLS if tools else None,
                    kwargs=dict(kwargs),
                    kind=ScenarioKind.CLOCK,
                )
            )
            for step in CLOCK_STEPS:
                found.append(
                    Scenario(
                        f"{shape}{label}, {step.name} later",
                        [Call(head, None, step.earlier), Call(head, None, step.later)],
                        TOOLS if tools else None,
                        kwargs=dict(kwargs),
                        kind=ScenarioKind.CLOCK,
                        refines=probe,
                        clock_step=step,
                    )
                )
    return found


def arguments_scenario(arguments_as_string: bool) -> Scenario:
    """The model wrote compact JSON arguments and the client replays them as it got them: the
    string (the OpenAI API's shape), or the parsed mapping where the template takes no string."""
    replayed_as_mapping = Scenario(
        "compact tool arguments replayed as a mapping",
        agent(False, False),
        TOOLS,
        compact_arguments=True,
        kind=ScenarioKind.ARGUMENTS,
    )
    if not arguments_as_string:
        return replayed_as_mapping
    return Scenario(
        "compact tool arguments replayed as sent",
        agent(False, True, compact=True),
        TOOLS,
        compact_arguments=True,
        kind=ScenarioKind.ARGUMENTS,
        fallback=replayed_as_mapping,
    )


def scenarios(
    switches: dict[str, list[Any]],
    arguments_as_string: bool = False,
    clocked: frozenset[str] = frozenset(),
    reasoning_in_content: bool = True,
) -> list[Scenario]:
    """Every scenario the prover renders, for one shape of tool-call arguments (the replay of
    compact arguments tries strings first whatever the shape). Switches are rendered at each
    value in a chat and an agent session, and on the clock too where they are ``clocked``
    (the switches of findings only the clock proves). ``reasoning_in_content``: the chat whose
    client replays raw ``<think>...</think>`` in content (only a template that names think
    tags can render it otherwise than any other text)."""
    found = [
        Scenario("chat", chat(system=False)),
        Scenario("chat with system", chat(system=True)),
        *(
            [Scenario("chat, reasoning replayed in content", chat(system=False, reasoning_in_content=True))]
            if reasoning_in_content
            else []
        ),
        Scenario("agent", agent(system=False, arguments_as_string=arguments_as_string), TOOLS, kind=ScenarioKind.AGENT),
        Scenario(
            "agent with system", agent(system=True, arguments_as_string=arguments_as_string), TOOLS, kind=ScenarioKind.AGENT
        ),
        Scenario("agent, narrated tool calls", agent(False, arguments_as_string, narrated=True), TOOLS, kind=ScenarioKind.AGENT),
        Scenario("agent, chained tool calls", chained_agent(arguments_as_string), TOOLS, kind=ScenarioKind.AGENT),
        *clock_scenarios(),
        arguments_scenario(True),
    ]
    for name, values in sorted(switches.items()):
        for value in values:
            label = json.dumps(value)
            for scenario in (
                Scenario(f"chat, {name}={label}", chat(system=False), kwargs={name: value}),
                Scenario(
                    f"agent, {name}={label}",
                    agent(False, arguments_as_string),
                    TOOLS,
                    kwargs={name: value},
                    kind=ScenarioKind.AGENT,
                ),
            ):
                if value is False and THINKING_ON_OFF.search(name):
                    drop_reasoning(scenario)  # with thinking off, the model writes none
                found.append(scenario)
            if name in clocked:
                found.extend(clock_scenarios({name: value}))
        if len(values) > 1:
            found.append(setting_changed(name, values[0], values[1]))
    return found


# "chat, reasoning_effort changed between calls": the variable a setting-changed scenario changes.
SETTING_CHANGED_NAME = re.compile(r"^chat, (?P<name>\w+) changed between calls$")


def setting_changed(name: str, first: Any, second: Any) -> Scenario:
    """The chat's first exchange, the second call sending ``name`` at another value: where a
    setting printed before the history voids the cache (PC008's proof)."""
    calls = session(chat_head(False), [(answer("Paris.", "France's capital is Paris."), [user("And of Italy?")])])
    calls[0].kwargs, calls[1].kwargs = {name: first}, {name: second}
    return Scenario(f"chat, {name} changed between calls", calls, kind=ScenarioKind.SETTING_CHANGED)


def drop_reasoning(scenario: Scenario) -> None:
    for call in scenario.calls:
        for message in call.messages + ([call.reply] if call.reply else []):
            for key in ("reasoning_content", "reasoning"):
                message.pop(key, None)
