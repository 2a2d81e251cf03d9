"""What a proof found: the typed evidence the prover hands to findings, reporters, the fixer,
audit, diff and replay.

A ``Divergence`` is one measured pair of consecutive model calls. A ``Proof`` is a finding's
verdict: proven (with the divergence that shows it, or the evidence that does), not reproduced
(the scenarios tried showed nothing of its cause), or not provable (why nothing could be
rendered). Each has one constructor and one JSON encoding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any


class Cause(StrEnum):
    """Where the next call's prompt stops extending the previous one, by what changed there."""

    CLEAN = "clean-extension"  # no divergence
    SYSTEM = "system"  # before or inside the first message: the whole cache is lost
    HISTORY_REWRITE = "history-rewrite"  # a message that was already history renders differently
    # Text after the last message and before the generation prompt renders differently where
    # no message was added (one conversation sent twice, the clock stepped between).
    AFTER_HISTORY = "after-history"
    TOOL_ARGUMENTS = "tool-arguments"  # a tool call's arguments re-serialised
    GENERATION_PROMPT = "generation-prompt"  # the reply's opener or the reply itself renders differently
    # The reply renders one way while it is the newest message and another once a message
    # follows it: a history rewrite that lands on the reply just generated.
    REPLY_REWRITE = "reply-rewrite"
    UNKNOWN = "unknown"  # no rendered text to locate the divergence in


# The field of a divergence outside every message (its message_index and role are None):
# before the first message's text (the template's own system block, the first header), or
# after the last message's text and before the generation prompt.
BEFORE_MESSAGES = "before-messages"
AFTER_MESSAGES = "after-messages"


class ProofStatus(StrEnum):
    PROVEN = "proven"
    NOT_REPRODUCED = "not-reproduced"
    NOT_PROVABLE = "not-provable"


# Characters of each render shown either side of where a divergence falls.
SNIPPET = 48


def snippet(text: str, offset: int) -> str:
    start = max(0, offset - SNIPPET)
    return ("…" if start else "") + text[start : offset + SNIPPET]


@dataclass(frozen=True)
class Divergence:
    scenario: str
    call: int  # index of call N; the pair is N, N+1
    # "a": prompt N vs N+1; "b": prompt N + the reply as generated vs N+1; "c": a tool call's
    # arguments as the model wrote them vs their render in N+1; "d": prompt N + the reply as
    # it renders while it is the newest message (what follows its end marker included) vs N+1
    check: str
    unit: str  # "token", or "char" without a tokenizer
    block_size: int
    first_divergence: int | None
    first_divergence_char: int | None
    prompt_tokens: tuple[int, int]
    reusable_tokens: int
    ideal_tokens: int
    message_index: int | None
    role: str | None
    field: str | None
    cause: Cause
    before: str = ""
    after: str = ""
    reply_index: int | None = None  # index of call N's reply in call N+1's messages
    scenario_kind: str = ""  # chat, agent, clock, arguments... (see scenarios.py)
    arrived: tuple[str, ...] = ()  # roles of the messages that came after call N's reply
    # The divergence is only how the model's format writes a reply once it is history: its
    # reasoning (or empty reasoning block) left out (gpt-oss's analysis, Qwen3's
    # <think></think>), or the end marker it generated (<|return|>) written as history's
    # (<|end|>). It costs that reply, not the history before it.
    # "reasoning", "reasoning-block", "end-marker" or "after-end-marker" (only what the
    # template prints after the newest reply's end marker, check d); "" otherwise
    reply_as_trained: str = ""
    # The first difference is in the text the generation prompt printed (an opener such as
    # "<think>\n" history does not replay), not in the reply generated after it.
    in_generation_prompt: bool = False
    # The texts agree where the tokens part: the same text split into other tokens (the
    # generation prompt's "\n" that history's "\n\n" takes in).
    split_differently: bool = False

    @property
    def after_from_divergence(self) -> str:
        """The next turn's excerpt from where the divergence falls on (``after`` is
        ``snippet(next_text, first_divergence_char)``)."""
        char = self.first_divergence_char or 0
        return self.after[SNIPPET + 1 if char > SNIPPET else char :]

    @property
    def in_reply(self) -> bool:
        """The divergence is inside the reply just generated, not in earlier history."""
        return self.message_index is not None and self.reply_index is not None and self.message_index >= self.reply_index

    @property
    def place(self) -> str:
        """Where it falls, in words: "message 1 (assistant, markup)", "before the first
        message", "after the last message"."""
        if self.field == BEFORE_MESSAGES:
            return "before the first message"
        if self.field == AFTER_MESSAGES:
            return "after the last message"
        if self.message_index is None:
            return "somewhere in the prompt"  # no rendered text to locate it in
        return f"message {self.message_index} ({self.role}, {self.field})"

    @property
    def lost_tokens(self) -> int:
        return self.ideal_tokens - self.reusable_tokens

    @property
    def reusable_without_rollback(self) -> int:
        """An engine that cannot roll back recurrent state reuses the whole prefix or nothing."""
        return self.ideal_tokens if self.first_divergence is None else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            # The calls as the text report numbers them ("calls 3->4"): counted from 1.
            "pair": [self.call + 1, self.call + 2],
            "check": self.check,
            "unit": self.unit,
            "block_size": self.block_size,
            "first_divergence": self.first_divergence,
            "first_divergence_char": self.first_divergence_char,
            # Named by what they count: prompt_tokens in tokens, prompt_chars where the proof
            # measured in characters (no tokenizer), as "unit" says.
            f"prompt_{self.unit}s": list(self.prompt_tokens),
            f"reusable_{self.unit}s": self.reusable_tokens,
            f"lost_{self.unit}s": self.lost_tokens,
            f"reusable_{self.unit}s_without_rollback": self.reusable_without_rollback,
            "message_index": self.message_index,
            "role": self.role,
            "field": self.field,
            "cause": str(self.cause),
            "arrived": list(self.arrived),
            "renders": {"before": self.before, "after": self.after},
        }


# How a switch value reads in a message: JSON's literals, as chat_template_kwargs takes them.
def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, int, float, str)) or value is None else repr(value)


@dataclass(frozen=True)
class SwitchValues:
    """What the renders showed of one finding under each value of one template variable:
    the values whose scenarios the finding's divergence came from, and the values rendered
    without it. ``default`` says the same of the requests that leave every variable as the
    deployment sends it (unset, or the project's pinned ``chat-template-kwargs``): "breaks",
    "stable", or None where nothing was rendered so."""

    name: str
    breaks: tuple[Any, ...]
    stable: tuple[Any, ...]
    default: str | None = None
    pinned: bool = False  # the default requests carry the project's own values

    def text(self) -> str:
        """ "breaks when enable_thinking=false (stable when true or unset)"."""
        broken = " or ".join(f"{self.name}={_literal(value)}" for value in self.breaks)
        steady = [_literal(value) for value in self.stable]
        unset = "as deployed" if self.pinned else "unset"
        if self.default == "breaks":
            broken += f" or {unset}"
        elif self.default == "stable":
            steady.append(unset)
        return f"breaks when {broken}" + (f" (stable when {' or '.join(steady)})" if steady else "")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "breaks": list(self.breaks), "stable": list(self.stable), "default": self.default}


@dataclass(frozen=True)
class Proof:
    status: ProofStatus
    unit: str
    divergence: Divergence | None = None  # proven by a measured divergence
    evidence: str | None = None  # proven otherwise (PC005: "twenty renders of one request")
    hit_rate: float | None = None  # the proving scenario's projected hit rate, and its ideal
    ideal_hit_rate: float | None = None
    scenarios: tuple[str, ...] = ()  # not reproduced: the scenarios rendered
    unrendered: tuple[tuple[str, str], ...] = ()  # not reproduced: (scenario, error) of those that failed
    reason: str | None = None  # not provable: why nothing could be rendered
    note: str | None = None  # said under every proof (which renderer, when it is not the engine's)
    # Every (scenario, cause) whose divergence this finding explains, the proving one first.
    explains: tuple[tuple[str, Cause], ...] = ()
    # The switch values the renders showed it under and without (see SwitchValues).
    switches: tuple[SwitchValues, ...] = ()
    # The loss per turn is bounded whatever the session's length (only the reply's end
    # marker differs): what it costs at most, in words; None when it grows with the session.
    bound: str | None = None

    @classmethod
    def proven(cls, divergence: Divergence, rates: tuple[float, float] | None = None) -> Proof:
        hit_rate, ideal = (round(rates[0], 4), round(rates[1], 4)) if rates else (None, None)
        return cls(ProofStatus.PROVEN, divergence.unit, divergence, hit_rate=hit_rate, ideal_hit_rate=ideal)

    @classmethod
    def proven_by(cls, unit: str, evidence: str) -> Proof:
        return cls(ProofStatus.PROVEN, unit, evidence=evidence)

    @classmethod
    def not_reproduced(cls, unit: str, scenarios: tuple[str, ...], unrendered: tuple[tuple[str, str], ...] = ()) -> Proof:
        return cls(ProofStatus.NOT_REPRODUCED, unit, scenarios=tuple(scenarios), unrendered=tuple(unrendered))

    @classmethod
    def not_provable(cls, unit: str, reason: str) -> Proof:
        return cls(ProofStatus.NOT_PROVABLE, unit, reason=reason)

    @property
    def is_proven(self) -> bool:
        return self.status is ProofStatus.PROVEN

    @property
    def cause(self) -> Cause | None:
        return self.divergence.cause if self.divergence is not None else None

    def explaining(self, divergences) -> Proof:
        """This proof, saying which scenarios' divergences (and of which causes) it explains."""
        pairs = [] if self.divergence is None else [(self.divergence.scenario, self.divergence.cause)]
        for divergence in divergences:
            if (divergence.scenario, divergence.cause) not in pairs:
                pairs.append((divergence.scenario, divergence.cause))
        return replace(self, explains=tuple(pairs))

    def with_note(self, note: str | None) -> Proof:
        return replace(self, note=note)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": str(self.status), "unit": self.unit}
        if self.divergence is not None:
            out.update(self.divergence.to_json())
        if self.evidence is not None:
            out["evidence"] = self.evidence
        if self.explains:
            out["explains"] = [{"scenario": scenario, "cause": str(cause)} for scenario, cause in self.explains]
        if self.hit_rate is not None:
            out["hit_rate"] = self.hit_rate
            out["ideal_hit_rate"] = self.ideal_hit_rate
        if self.status is ProofStatus.NOT_REPRODUCED:
            out["scenarios"] = list(self.scenarios)
            if self.unrendered:
                out["not_rendered"] = [{"scenario": scenario, "error": error} for scenario, error in self.unrendered]
        if self.reason is not None:
            out["reason"] = self.reason
        if self.note is not None:
            out["note"] = self.note
        if self.switches:
            out["switches"] = [values.to_json() for values in self.switches]
        if self.bound is not None:
            out["bound"] = self.bound
        return out
