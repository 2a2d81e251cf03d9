"""Synthetic agent sessions to render, turn after turn.

A scenario is a list of model calls. Each call is the conversation sent to the model; all
but the last carry the reply the model generated, and the next call's conversation is this
one plus that reply plus what came back (a user message, tool results). Shapes vary where
templates disagree (a system message or not, arguments as a mapping or a JSON string), and
the prover keeps the first shape a template accepts, as minja and llama.cpp probe
templates.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

MIDDAY = datetime(2026, 3, 1, 12, 0, 0)
BEFORE_MIDNIGHT = datetime(2026, 3, 1, 23, 59, 50)
AFTER_MIDNIGHT = datetime(2026, 3, 2, 0, 0, 10)

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


class ScenarioKind(StrEnum):
    """What a scenario exercises: rules declare the kinds their proof must come from."""

    CHAT = "chat"
    AGENT = "agent"
    CLOCK = "clock"  # the same conversation, the clock stepped between calls
    ARGUMENTS = "arguments"  # tool-call arguments the model wrote, replayed by the client


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


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(content: str, reasoning: str) -> dict[str, Any]:
    # Reasoning under both names clients send: transformers copies reasoning_content to
    # `thinking` for gpt-oss, and some templates (Solar Open) read `reasoning`.
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "reasoning": reasoning}


def tool_call(call_id: str, city: str, reasoning: str, arguments_as_string: bool) -> dict[str, Any]:
    arguments: Any = {"city": city}
    if arguments_as_string:
        arguments = json.dumps(arguments)
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
        calls.append(Call(copy.deepcopy(messages), copy.deepcopy(reply), clock))
        messages = messages + [reply] + following
    clock = clocks[len(steps)] if clocks else MIDDAY
    calls.append(Call(copy.deepcopy(messages), None, clock))
    return calls


def chat(system: bool, clocks=None) -> list[Call]:
    head = ([SYSTEM] if system else []) + [user("What is the capital of France?")]
    return session(
        head,
        [
            (answer("Paris.", "The user asks for a capital; France's is Paris."), [user("And of Italy?")]),
            (answer("Rome.", "Italy's capital is Rome."), [user("Thanks. Which is larger?")]),
        ],
        clocks,
    )


def agent(system: bool, arguments_as_string: bool, narrated: bool = False) -> list[Call]:
    """Tool calls across two user queries. ``narrated``: the tool-call replies say something
    ("Checking the weather.") instead of reasoning, as many models do."""
    first, second = CALL_IDS
    head = ([SYSTEM] if system else []) + [user("What is the weather in Paris?")]

    def calling(call_id: str, city: str, reasoning: str) -> dict[str, Any]:
        message = tool_call(call_id, city, reasoning, arguments_as_string)
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


def scenarios(switches: dict[str, list[Any]], arguments_as_string: bool = False) -> list[Scenario]:
    """Every scenario the prover renders, for one shape of tool-call arguments."""
    found = [
        Scenario("chat", chat(system=False)),
        Scenario("chat with system", chat(system=True)),
        Scenario("agent", agent(system=False, arguments_as_string=arguments_as_string), TOOLS, kind=ScenarioKind.AGENT),
        Scenario(
            "agent with system", agent(system=True, arguments_as_string=arguments_as_string), TOOLS, kind=ScenarioKind.AGENT
        ),
        Scenario("agent, narrated tool calls", agent(False, arguments_as_string, narrated=True), TOOLS, kind=ScenarioKind.AGENT),
        Scenario("agent, chained tool calls", chained_agent(arguments_as_string), TOOLS, kind=ScenarioKind.AGENT),
        Scenario(
            "midnight", chat(system=False, clocks=[BEFORE_MIDNIGHT, AFTER_MIDNIGHT, AFTER_MIDNIGHT]), kind=ScenarioKind.CLOCK
        ),
    ]
    if not arguments_as_string:
        # A template that takes arguments only as strings gets back the string the model
        # wrote; the replay of a parsed mapping applies where mappings render.
        found.append(
            Scenario(
                "compact tool arguments replayed as a mapping",
                agent(False, False),
                TOOLS,
                compact_arguments=True,
                kind=ScenarioKind.ARGUMENTS,
            )
        )
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
    return found


def drop_reasoning(scenario: Scenario) -> None:
    for call in scenario.calls:
        for message in call.messages + ([call.reply] if call.reply else []):
            for key in ("reasoning_content", "reasoning"):
                message.pop(key, None)
