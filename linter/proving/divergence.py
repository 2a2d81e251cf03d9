"""Where two consecutive prompts diverge: the first differing token and character, the
message, role and field it falls in, and a cause class. The one text and token diffing
core: the prover, ``diff`` and ``replay`` all compare prompts here."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ..proofs import AFTER_MESSAGES, BEFORE_MESSAGES, Cause, Divergence, snippet
from ..tokenizer import common_prefix_length
from .measure import Units, full_blocks
from .replies import Reply, ends_in_marker, message_fields

# A reasoning block's opening tag: <think>, <thinking>, <|begin_of_thought|>, <reasoning>...
REASONING_BLOCK = re.compile(r"<[^<>\s]*(?:think|thought|reason)[^<>\s]*>", re.IGNORECASE)


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
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
    """``shared``, or the start of the markup tag it falls inside (``<think>`` against
    ``</think>``, ``[TOOL_CALLS]``). A tag is one word: an opening bracket in a message's
    text (``arr[i``, ``x < y``) with whitespace after it opens no tag, and never moves
    where a reply starts."""
    for opening, closing in (("<", ">"), ("[", "]")):
        start = text.rfind(opening, 0, shared)
        if start >= 0 and closing not in text[start:shared] and not any(char.isspace() for char in text[start:shared]):
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


def compare_prompts(
    scenario: str,
    index: int,
    check: str,
    cached_text: str | None,
    cached_ids: Units,
    next_text: str | None,
    next_ids: Units,
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
            scenario,
            index,
            check,
            unit,
            block_size,
            None,
            None,
            lengths,
            ideal,
            ideal,
            None,
            None,
            None,
            Cause.CLEAN,
            scenario_kind=scenario_kind,
            arrived=arrived,
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
            scenario_kind=scenario_kind,
            arrived=arrived,
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
                    generation_prompt is not None  # as opener_start is
                    and char < generation_prompt[1]
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
        reasoning = dict(message_fields(next_messages[message_index])).get("reasoning_content") or ""
        dropped_text = bool(reasoning) and reasoning in cached_text[char:] and reasoning not in next_text[char:]
        dropped_block = REASONING_BLOCK.match(cached_text, char) is not None and REASONING_BLOCK.match(next_text, char) is None
        end_marker = ends_in_marker(cached_text, char)
        kinds = (("reasoning", dropped_text), ("reasoning-block", dropped_block), ("end-marker", end_marker))
        reply_as_trained = next((kind for kind, found in kinds if found), "")
    if check == "d":
        # Only text printed after the reply's end-of-turn marker differs (see Prover.run_scenario).
        reply_as_trained = "after-end-marker"
    elif check == "b" and not reply_as_trained and ends_in_marker(cached_text, char):
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
        scenario_kind=scenario_kind,
        arrived=arrived,
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
