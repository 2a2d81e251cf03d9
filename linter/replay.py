"""``tmpl-lint replay LOG``: the projected prefix-cache hit rate of real agent traffic.

LOG is JSON lines: a chat completion request body per line, or ``{"request": body,
"response": ..., "timestamp": ...}`` with the response the model gave (an OpenAI chat
completion, a message, or ``{"token_ids": [...]}``). Calls are grouped into sessions by a
field (``--session-key user`` or ``metadata.session_id``) or, without one, by prefix
continuity: a call continues the session whose last call's messages it extends.

For each consecutive pair of calls of a session, the prompt of call N+1 is compared with
prompt N (and, where the response is logged, with prompt N plus the generated reply): the
first divergence, its cause and the tokens reusable in full blocks. The serving engine's
own hit-rate line is token-weighted over its last 1,000 requests of all traffic; this is
per session, against the ideal of a clean extension.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .engines import EngineError, engine_tokenizer, render_prompt
from .proofs import Divergence
from .prover import Measure, compare_prompts, reply_start
from .render import FrozenClock, RenderError


class ReplayError(Exception):
    pass


@dataclass
class Call:
    line: int
    body: dict[str, Any]
    response: Any = None
    timestamp: datetime | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body["messages"]


@dataclass
class Session:
    key: str
    calls: list[Call] = field(default_factory=list)
    pairs: list[Divergence] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return sum(pair.lost_tokens for pair in self.pairs)


def _timestamp(value: Any) -> datetime | None:
    """A logged time (seconds since the epoch, or ISO 8601) as naive UTC; None when absent;
    ValueError when it is no time at all."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=UTC).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"timestamp {value!r} is out of range") from None
    if not isinstance(value, str):
        raise ValueError(f"timestamp {value!r} is neither a number nor a string")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.replace(tzinfo=None) if parsed.tzinfo is None else parsed.astimezone(UTC).replace(tzinfo=None)


# A traffic log is not a template: it may be large, but each line is one request.
MAX_LINE_BYTES = 64 * 1024 * 1024


def read_log(path: Path) -> tuple[list[Call], list[ReplayError]]:
    """The calls of a JSON-lines log, and one error for each line that is not one (the
    rest are replayed). A log may be a regular file or a pipe (``<(zcat log.gz)``)."""
    import stat

    calls, problems = [], []
    try:
        with open(path, "rb") as stream:
            if not (stat.S_ISREG(os.fstat(stream.fileno()).st_mode) or stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode)):
                raise ReplayError(f"{path}: not a regular file or a pipe")
            number = 0
            while line := stream.readline(MAX_LINE_BYTES + 1):
                number += 1
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    raise ReplayError(f"{path}:{number}: line over {MAX_LINE_BYTES} bytes; stopped reading")
                try:
                    call = _call(number, line)
                except ReplayError as error:
                    problems.append(ReplayError(f"{path}:{number}: {error}"))
                    continue
                if call is not None:
                    calls.append(call)
    except OSError as error:
        raise ReplayError(f"{path}: cannot read: {error.strerror or error}") from None
    return calls, problems


def _call(number: int, line: bytes) -> Call | None:
    from .diff import request_problem

    if not line.strip():
        return None
    try:
        entry = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ReplayError(f"not valid UTF-8 (byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise ReplayError(f"invalid JSON: {error.msg}") from None
    except RecursionError:
        raise ReplayError("invalid JSON: nested too deeply to read") from None
    if not isinstance(entry, dict):
        raise ReplayError("expected a JSON object")
    body = entry.get("request", entry)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ReplayError("no messages in this request")
    problem = request_problem(body)
    if problem:
        raise ReplayError(problem)
    response = entry.get("response")
    if isinstance(response, dict) and "token_ids" in response:
        ids = response["token_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ReplayError("response token_ids must be a list of token ids (non-negative integers)")
    try:
        timestamp = _timestamp(entry.get("timestamp") or body.get("created"))
    except ValueError as error:
        raise ReplayError(str(error)) from None
    return Call(number, body, response, timestamp)


def _lookup(document: dict[str, Any], dotted: str) -> Any:
    value: Any = document
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def sessions(calls: list[Call], session_key: str | None) -> list[Session]:
    found: dict[str, Session] = {}
    if session_key:
        for call in calls:
            key = _lookup(call.body, session_key)
            key = "(none)" if key is None else str(key)
            found.setdefault(key, Session(key)).calls.append(call)
        return list(found.values())
    # Prefix continuity: a call extends the session whose last call it starts with.
    ordered: list[Session] = []
    for call in calls:
        home = None
        for session in reversed(ordered):
            previous = session.calls[-1].messages
            if len(previous) < len(call.messages) and call.messages[: len(previous)] == previous:
                home = session
                break
        if home is None:
            home = Session(f"session-{len(ordered) + 1}")
            ordered.append(home)
        home.calls.append(call)
    return ordered


def reply_message(response: Any) -> dict[str, Any] | None:
    """The assistant message of a logged response, in any of the usual shapes."""
    if not isinstance(response, dict):
        return None
    if isinstance(response.get("choices"), list) and response["choices"]:
        choice = response["choices"][0]
        message = choice.get("message") if isinstance(choice, dict) else None
        return message if isinstance(message, dict) else None
    if response.get("role") == "assistant":
        return response
    return None


class Replayer:
    def __init__(self, template: str, tokenizer, special_tokens: dict[str, Any], block_size: int, engine: str, server_ids=None):
        self.template = template
        self.measure = Measure(tokenizer or engine_tokenizer(engine))
        self.special = special_tokens
        self.block_size = block_size
        self.engine = engine
        self.server_ids = server_ids
        self.clock = FrozenClock(datetime.now())

    def render(self, call: Call, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        self.clock.set(call.timestamp or datetime.now())
        try:
            return render_prompt(
                self.engine,
                self.template,
                messages,
                clock=self.clock,
                tools=call.body.get("tools"),
                kwargs=call.body.get("chat_template_kwargs"),
                add_generation_prompt=generation_prompt,
                special_tokens=self.special,
                reasoning_effort=call.body.get("reasoning_effort"),
            )
        except EngineError as error:
            raise RenderError(str(error)) from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as error:
            # A logged request of a shape the engine's preprocessing does not expect.
            raise RenderError(f"{type(error).__name__}: {error}") from None

    def prompt(self, call: Call) -> tuple[str, list[int]]:
        text = self.render(call, call.messages, True)
        ids = self.server_ids(call.body) if self.server_ids else self.measure.ids(text)
        return text, ids

    def generated(self, call: Call, prompt: str) -> tuple[str, list[int]] | None:
        if isinstance(call.response, dict) and isinstance(call.response.get("token_ids"), list):
            return "", call.response["token_ids"]
        message = reply_message(call.response)
        if message is None:
            return None
        reply = {key: value for key, value in message.items() if value is not None}
        with_reply = self.render(call, call.messages + [reply], False)
        text = with_reply[reply_start(prompt, with_reply) :]
        # The arguments as the model wrote them, not as the template re-serialises a mapping.
        for tool in reply.get("tool_calls") or ():
            arguments = (tool.get("function") or {}).get("arguments")
            if isinstance(arguments, str):
                with contextlib.suppress(json.JSONDecodeError):
                    text = text.replace(json.dumps(json.loads(arguments)), arguments)
        return text, self.measure.ids(text)

    def replay(self, session: Session) -> list[tuple[int, str]]:
        """Compare each call of ``session`` with the next; a call the template cannot
        render is left out (and returned with its log line and why), the others are still
        compared."""
        rendered, kept, problems = [], [], []
        for call in session.calls:
            try:
                rendered.append(self.prompt(call))
                kept.append(call)
            except RenderError as error:
                problems.append((call.line, f"the template fails on this request: {error}"))
        session.calls = kept
        for index in range(len(session.calls) - 1):
            call, following = session.calls[index], session.calls[index + 1]
            (text, ids), (next_text, next_ids) = rendered[index], rendered[index + 1]
            cached_text, cached_ids, check = text, ids, "a"
            try:
                generated = self.generated(call, text)
            except RenderError as error:
                problems.append((call.line, f"the template fails on this request's reply: {error}"))
                generated = None
            if generated is not None:
                cached_text, cached_ids, check = text + generated[0], ids + generated[1], "b"
            session.pairs.append(
                compare_prompts(
                    session.key,
                    index,
                    check,
                    None if self.server_ids else cached_text,
                    cached_ids,
                    None if self.server_ids else next_text,
                    next_ids,
                    following.messages,
                    len(call.messages),
                    "token" if self.server_ids else self.measure.unit,
                    self.block_size,
                )
            )
        return problems


def replay_all(log: Path, calls: list[Call], renderers: list[tuple[str, Replayer]], session_key: str | None):
    """Every template's summary over the same traffic, and the calls that failed, one line
    each. Run in a limited child process (the templates render there; see isolation.py)."""
    results, problems = [], []
    for label, replayer in renderers:
        groups = sessions(calls, session_key)
        for group in groups:
            problems.extend(f"{log}:{line}: {reason}" for line, reason in replayer.replay(group))
        results.append((label, summary(groups)))
    return results, list(dict.fromkeys(problems))


def summary(replayed: list[Session]) -> dict[str, Any]:
    pairs = [pair for session in replayed for pair in session.pairs]
    total = sum(pair.prompt_tokens[1] for pair in pairs)
    causes: Counter = Counter()
    for pair in pairs:
        if pair.lost_tokens:
            causes[pair.cause] += pair.lost_tokens
    worst = sorted(replayed, key=lambda session: session.lost, reverse=True)[:5]
    return {
        "unit": pairs[0].unit if pairs else "token",
        "sessions": len(replayed),
        "pairs": len(pairs),
        "hit_rate": sum(p.reusable_tokens for p in pairs) / total if total else 0.0,
        "ideal_hit_rate": sum(p.ideal_tokens for p in pairs) / total if total else 0.0,
        "recomputed_per_turn": sum(p.lost_tokens for p in pairs) / len(pairs) if pairs else 0.0,
        "top_causes": [{"cause": cause, "lost_tokens": lost} for cause, lost in causes.most_common()],
        "worst_sessions": [{"session": s.key, "lost_tokens": s.lost, "cumulative_lost": _cumulative(s)} for s in worst if s.lost],
    }


def _cumulative(session: Session) -> list[int]:
    total, out = 0, []
    for pair in session.pairs:
        total += pair.lost_tokens
        out.append(total)
    return out


def text_report(results: list[tuple[str, dict[str, Any]]]) -> str:
    lines = []
    for label, figures in results:
        unit = figures["unit"]
        lines.append(
            f"{label}: {figures['sessions']} sessions, {figures['pairs']} turn pairs: projected hit rate "
            f"{figures['hit_rate']:.1%} (ideal {figures['ideal_hit_rate']:.1%}), "
            f"{figures['recomputed_per_turn']:.0f} {unit}s recomputed per turn beyond the ideal"
        )
        for cause in figures["top_causes"]:
            lines.append(f"  cause {cause['cause']}: {cause['lost_tokens']} {unit}s lost")
        for session in figures["worst_sessions"]:
            lines.append(f"  worst session {session['session']}: {session['lost_tokens']} {unit}s lost")
    return "\n".join(lines) + "\n"


def html_chart(results: list[tuple[str, dict[str, Any]]]) -> str:
    """Cumulative tokens recomputed per turn for the worst sessions, before and after."""
    import html as escape

    colours = ["#c33", "#3a7", "#36c", "#a6c", "#c93"]
    width, height = 720, 360
    series = [(label, s) for label, figures in results for s in figures["worst_sessions"]]
    peak = max((max(s["cumulative_lost"]) for _, s in series if s["cumulative_lost"]), default=1) or 1
    turns = max((len(s["cumulative_lost"]) for _, s in series), default=1) or 1
    lines = []
    for _index, (label, session) in enumerate(series):
        points = " ".join(
            f"{40 + (turn + 1) * (width - 60) / turns:.1f},{height - 30 - value * (height - 60) / peak:.1f}"
            for turn, value in enumerate(session["cumulative_lost"])
        )
        colour = colours[[name for name, _ in results].index(label) % len(colours)]
        dash = "" if label == results[0][0] else ' stroke-dasharray="6 3"'
        lines.append(
            f'<polyline fill="none" stroke="{colour}"{dash} stroke-width="2" points="40,{height - 30} {points}"><title>{escape.escape(label)}: {escape.escape(session["session"])}</title></polyline>'
        )
    legend = "".join(
        f"<li>{escape.escape(label)}: {figures['hit_rate']:.1%} projected hit rate (ideal {figures['ideal_hit_rate']:.1%})</li>"
        for label, figures in results
    )
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>tmpl-lint replay</title></head>'
        '<body style="font-family:sans-serif"><h1>Cumulative tokens recomputed per turn, worst sessions</h1>'
        f'<ul>{legend}</ul><svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        f'<line x1="40" y1="{height - 30}" x2="{width}" y2="{height - 30}" stroke="#999"/>'
        f'<line x1="40" y1="0" x2="40" y2="{height - 30}" stroke="#999"/>{"".join(lines)}</svg></body></html>\n'
    )
