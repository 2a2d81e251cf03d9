"""``tmpl-lint diff TURN1.json TURN2.json``: where two real requests of a session diverge.

Both request bodies (OpenAI chat format: ``messages``, ``tools``,
``chat_template_kwargs``) are rendered with the generation prompt, as a server renders
them, tokenized, and compared: the first diverging token, the tokens reusable in full
blocks, and the message, field and cause. With ``--server`` a running vLLM supplies the
token ids instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard

from .analysis.interpreter import analyze
from .analysis.parsing import parse
from .engines import engine_tokenizer, render_prompt, request_prompt
from .engines.base import EngineError, EngineRefusal, Prompt
from .findings import Outcome, quoted_name
from .inputs import TemplateSource, load_json
from .proofs import BEFORE_MESSAGES, Cause, Divergence, snippet
from .proving.divergence import classify, compare_prompts, generation_prompt_span, locate
from .proving.measure import Measure, resolve_special_tokens
from .proving.replies import message_fields
from .render import FrozenClock, RenderError
from .report.text import divergence_lines
from .requests import ClientChange, Request, RequestError, read_request
from .requests import client_change as change_between
from .rules import reporting
from .sources import ADDITIONAL_TEMPLATES_DIR, collect
from .tokenizer import Tokenizer, special_tokens_from_config


def template_in_force(path: Path) -> TemplateSource:
    """The template in force at ``path`` (a file, GGUF or model directory)."""
    sources, errors = collect([path], any_file_is_a_template=True)
    # The template in force is the first found outside additional_chat_templates/: an
    # unreadable extra template there does not change what the server renders.
    in_force = [source for source in sources if source.path.parent.name != ADDITIONAL_TEMPLATES_DIR]
    if not in_force and errors:
        raise RequestError(str(errors[0]))
    if not in_force:
        raise RequestError(f"{path}: no chat template")
    source = in_force[0]
    problem = syntax_error_at(source.text)
    if problem is not None:
        # Said of the template, once: not of the first request rendered with it. Where the
        # file is the template, at its place as editors read it; else at the template's own.
        line, column, message = problem
        if source.container == "jinja":
            where = f"{quoted_name(source.path)}:{line}:{column}"
        else:
            named = f" {quoted_name(source.name)}" if source.name else ""
            where = f"{quoted_name(source.path)}: template{named} line {line}, column {column}"
        raise RequestError(f"{where}: the template does not parse: {message}")
    return source


def read_template(path: Path) -> tuple[str, dict[str, Any]]:
    """The template in force at ``path`` (a file or model directory) and its special tokens."""
    source = template_in_force(path)
    return source.text, special_tokens_of(source)


def special_tokens_of(source: TemplateSource) -> dict[str, Any]:
    """The special tokens the file holding ``source`` names (a tokenizer config's, a GGUF's)."""
    special: dict[str, Any] = {}
    if source.container == "json":
        document = load_json(source.path)
        special = special_tokens_from_config(document) if isinstance(document, dict) else {}
    elif source.container == "gguf":
        from .gguf.tokenizer import metadata_special_tokens  # noqa: PLC0415 -- the GGUF reader: only for a .gguf

        special = metadata_special_tokens(source.path)
    return special


def syntax_error_at(text: str) -> tuple[int, int, str] | None:
    """(line, column, Jinja's message) where the text is no template, as PC000 places it;
    None where it parses."""
    tree, error = parse(text)
    if error is None:
        return None
    (finding,) = reporting(Outcome.SYNTAX_ERROR).check(analyze(text))
    return finding.line, finding.column, error.message or "syntax error"


def diff_requests(
    first: Request,
    second: Request,
    template: str | None,
    special_tokens: dict[str, Any],
    tokenizer: Tokenizer | None,
    block_size: int,
    server_ids=None,
    engine: str = "vllm",
    server_kwargs: dict[str, Any] | None = None,
) -> Divergence:
    measure = Measure(tokenizer or engine_tokenizer(engine))
    prompts: list[Prompt] = []
    opener: tuple[int, int] | None = None
    if template is not None:
        clock = FrozenClock(datetime.now())  # both rendered at one instant, as one server would now
        tokens = resolve_special_tokens(tokenizer, special_tokens)

        def render(request: Request, generation_prompt: bool) -> Prompt:
            try:
                return render_prompt(
                    engine,
                    template,
                    request.messages,
                    clock=clock,
                    tools=request.tools,
                    kwargs=request.kwargs,
                    add_generation_prompt=generation_prompt,
                    special_tokens=tokens,
                    reasoning_effort=request.body.get("reasoning_effort"),
                    server_kwargs=server_kwargs,
                )
            except (RenderError, EngineError) as error:
                raise RequestError(f"{request.path}: the template fails on this request: {error}") from None

        def as_sent(request: Request) -> Prompt:
            """The request as the engine renders it: ``tmpl-lint render``'s function."""
            try:
                return request_prompt(
                    engine, template, request.body, clock=clock, special_tokens=tokens, server_kwargs=server_kwargs
                )
            except EngineRefusal as error:  # the engine's own answer, naming the field
                raise RequestError(f"{request.path}: {error}") from None
            except (RenderError, EngineError) as error:
                raise RequestError(f"{request.path}: the template fails on this request: {error}") from None

        prompts = [as_sent(first), as_sent(second)]
        # Where turn 1's generation prompt starts, as the prover finds it: a divergence before it
        # is in the last message's closing markup (a `loop.last` test), not the generation prompt.
        opener = generation_prompt_span(prompts[0].text, render(first, False).text)
    texts: list[str | None] = [prompt.text for prompt in prompts] if prompts else [None, None]
    token_start = None
    if server_ids is not None:
        ids = [server_ids(request.body) for request in (first, second)]
        unit = "token"
    else:
        ids = [measure.prompt_ids(prompt) for prompt in prompts]
        unit = measure.unit
        if texts[0] is not None:
            token_start = partial(measure.start_of, pieces=[(texts[0], ids[0])])
    divergence = compare_prompts(
        "diff",
        0,
        "a",
        texts[0],
        ids[0],
        texts[1],
        ids[1],
        second.messages,
        len(first.messages),
        unit,
        block_size,
        opener,
        token_start=token_start,
    )
    if divergence.first_divergence is None and len(ids[1]) < len(ids[0]):
        return _went_back(divergence, texts[0], texts[1], first.messages, len(ids[1]))
    if divergence.field == "markup" and texts[0] is not None and texts[1] is not None:
        return _in_tools(divergence, (texts[0], texts[1]), (first, second))
    return divergence


# The field of a divergence in the tools a template prints between two messages' texts.
TOOLS = "tools"


def _went_back(divergence: Divergence, first_text: str | None, second_text: str | None, messages: list, end: int) -> Divergence:
    """Turn 2 renders as a prefix of turn 1, shorter: the session went back (the client
    removed or cut messages). Turn 1 is no prefix of turn 2, so the prompts part where
    turn 2 ends: located in turn 1's messages, where turn 1 goes on."""
    if first_text is None or second_text is None:
        return replace(divergence, first_divergence=end, cause=Cause.UNKNOWN)
    char = len(second_text)
    index, role, field_name = locate(first_text, messages, char)
    if index is not None and index >= len(messages):  # past every message: turn 1's generation prompt
        index, role, field_name = None, None, None
    first_fields = [first_text.find(text) for _, text in message_fields(messages[0])] if messages else []
    first_start = min([found for found in first_fields if found >= 0], default=0)
    cause = classify(index, role, field_name, len(messages), char, first_start)
    return replace(
        divergence,
        first_divergence=end,
        first_divergence_char=char,
        message_index=index,
        role=role,
        field=field_name,
        cause=cause,
        before=snippet(first_text, char),
        after=snippet(second_text, char),
    )


def went_back(divergence: Divergence) -> bool:
    """Whether turn 2 ends where turn 1 goes on (``_went_back``): its message is numbered in turn 1."""
    first, second = divergence.prompt_tokens
    return divergence.first_divergence is not None and divergence.first_divergence == second < first


def _tool_texts(tools: list[dict[str, Any]] | None) -> list[str]:
    """What of each tool a template prints (its name, description, parameter names), as
    written and as JSON writes it inside a string."""
    texts: list[str] = []
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        function = function if isinstance(function, dict) else {}
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        for text in [function.get("name"), function.get("description"), *(properties or {})]:
            if isinstance(text, str) and text:
                texts.extend({text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]})
    return texts


def _text_spans(text: str, messages: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """(message index, start, end) of each message's printed text, found in order."""
    spans, cursor = [], 0
    for index, message in enumerate(messages):
        found = [(start, start + len(value)) for _, value in message_fields(message) if (start := text.find(value, cursor)) >= 0]
        if found:
            spans.append((index, min(start for start, _ in found), max(stop for _, stop in found)))
            cursor = spans[-1][2]
    return spans


# A marker that closes a turn: <|im_end|>, <|eot_id|>, </s>, Gemma's <turn|>, Mistral's [/INST].
# Not the openers a reply may also stop at (Gemma's <|tool>, which opens the tools inside its
# system turn; [AVAILABLE_TOOLS]): they part nothing from the text before them.
END_OF_TURN = re.compile(r"<\|[^|<>]{1,40}\|>|<｜[^｜]{1,40}｜>|</s>|<[a-z_]{1,20}\|>|\[/[A-Z_]{2,20}\]")


def _in_tools(divergence: Divergence, texts: tuple[str, str], turns: tuple[Request, Request]) -> Divergence:
    """A divergence between two messages' texts that falls in the tools the template prints
    there (Qwen3 prints them in the system turn, after the system prompt), located as such:
    not in the markup of the message whose text comes next. The tools belong to the message
    before them where no end-of-turn marker parts them from its text (the system turn), else
    to the message after them (Mistral prints them before the last user message)."""
    char = divergence.first_divergence_char
    if char is None:
        return divergence
    # Turn 2's render first: its messages number the divergence; turn 1's where only it
    # printed the tools (the client removed them).
    for text, request in reversed(list(zip(texts, turns))):
        spans = _text_spans(text, request.messages)
        before = [span for span in spans if span[2] <= char]
        after = [span for span in spans if span[1] > char]
        if not before or not after:
            continue
        (owner_before, _, gap_start), (owner_after, gap_end, _) = before[-1], after[0]
        found = [
            (start, start + len(value))
            for value in _tool_texts(request.tools)
            if (start := text.find(value, gap_start, gap_end)) >= 0
        ]
        if not found or char >= max(stop for _, stop in found):
            continue
        parted = END_OF_TURN.search(text, gap_start, min(start for start, _ in found)) is not None
        owner = owner_after if parted else owner_before
        role = request.messages[owner].get("role")
        cause = Cause.SYSTEM if owner == 0 and role in ("system", "developer") else divergence.cause
        return replace(divergence, message_index=owner, role=role, field=TOOLS, cause=cause)
    return divergence


def client_change(first: Path, second: Path) -> ClientChange | None:
    """What the client changed between the two requests, if anything, before any message it
    added (as replay tells it): a diverging prompt is then the client's doing, not the
    template's, where the change comes at or before the divergence."""
    try:
        before, after = read_request(first), read_request(second)
    except RequestError:
        return None
    return change_between(before, None, after)


def explains(change: ClientChange | None, divergence: Divergence) -> TypeGuard[ClientChange]:
    """Whether the client's change comes at or before where the prompts diverge."""
    if change is None or divergence.first_divergence is None:
        return False
    if change.message_index is None:  # the tools, system prompt or options: before every message
        return True
    if divergence.field == BEFORE_MESSAGES:
        # The first message's header is printed before its text: a change to that message
        # (its role, a system prompt dropped) shows there; a later message's cannot.
        return change.message_index == 0
    return divergence.message_index is None or change.message_index <= divergence.message_index


def diff_json(divergence: Divergence, change: ClientChange | None = None) -> dict[str, Any]:
    client = change.to_json() if explains(change, divergence) else None
    numbering = {"numbered_in": "previous"} if went_back(divergence) and divergence.message_index is not None else {}
    return {
        "first_divergence_token": divergence.first_divergence,
        "first_divergence_char": divergence.first_divergence_char,
        "prompt_tokens": list(divergence.prompt_tokens),
        "reusable_tokens": divergence.reusable_tokens,
        "lost_tokens": divergence.lost_tokens,
        "block_size": divergence.block_size,
        "unit": divergence.unit,
        "message_index": divergence.message_index,
        **numbering,  # message_index counts turn 1's messages: turn 2 ends where turn 1 goes on
        "role": divergence.role,
        "field": divergence.field,
        "cause": str(divergence.cause),
        "renders": {"before": divergence.before, "after": divergence.after},
        "client_change": client,  # the client changed what it sent there: not the template's doing
    }


def diff_text(divergence: Divergence, change: ClientChange | None = None) -> str:
    unit = divergence.unit
    first, second = divergence.prompt_tokens
    if divergence.first_divergence is None:
        # All of a turn 2 no longer than turn 1 is cached, but vLLM computes its last token.
        capped = f" (vLLM computes at least the last {unit})" if second <= first else ""
        if second == first:  # (a shorter turn 2 is no extension: ``_went_back``)
            relation = f"turn 2 is turn 1 again ({first} {unit}s)"
        else:
            relation = f"turn 1 ({first} {unit}s) is a prefix of turn 2 ({second} {unit}s)"
        return (
            f"clean extension: {relation}; {divergence.reusable_tokens} {unit}s reusable in "
            f"{divergence.block_size}-{unit} blocks{capped}\n"
        )
    lines = divergence_lines(divergence)
    explained = change if explains(change, divergence) else None  # the client's change, where it explains it
    back = went_back(divergence)
    # Where a message was inserted, removed or moved, the same number names different
    # messages in the two turns: each number then says whose it is.
    turns = back or (
        explained is not None
        and (explained.in_previous or explained.moved_to is not None or explained.detail == "message inserted")
    )
    turn = ("turn 1's " if back else "turn 2's ") if turns else ""
    where = (
        divergence.place
        if divergence.message_index is None
        else f"{turn}message {divergence.message_index}, {divergence.role}, {divergence.field}"
    )
    if back:
        lines[0] = (
            f"turn 2 ({second} {unit}s) is a prefix of turn 1 ({first} {unit}s): it ends at {unit} "
            f"{divergence.first_divergence} ({where}), where turn 1 goes on; cause {divergence.cause}"
        )
    else:
        lines[0] = f"first divergence at {unit} {divergence.first_divergence} of {first} ({where}); cause {divergence.cause}"
    if explained is not None:
        lines[0] = (
            lines[0].rsplit("; cause ", 1)[0]
            + f"; cause client: {explained.detail}{_client_place(explained, turns)}, not the template"
        )
        # One change of the client's, not something the template does on every turn.
        lines[1] = lines[1].replace(" recomputed every turn;", " recomputed;")
    return "\n".join(lines) + "\n"


def _client_place(change: ClientChange, turns: bool) -> str:
    """Where the client's change is: " (turn 1's message 2, assistant, now turn 2's message 3)"."""
    if change.message_index is None:
        return ""
    turn = ("turn 1's " if change.in_previous else "turn 2's ") if turns else ""
    moved = f", now turn 2's message {change.moved_to}" if change.moved_to is not None else ""
    return f" ({turn}message {change.message_index}, {change.role}{moved})"


def dumps(divergence: Divergence, change: ClientChange | None = None, engine: str | None = None) -> str:
    """The JSON report; ``engine`` names the profile that rendered the two requests."""
    document = diff_json(divergence, change)
    if engine:
        document["engine"] = engine
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
