"""Rendering a chat template exactly as transformers' ``apply_chat_template(tokenize=False)``.

The steps mirror ``transformers.utils.chat_template_utils.render_jinja_template`` and
``PreTrainedTokenizerBase.apply_chat_template``: keys whose value is None are dropped from
each message, reasoning given under ``reasoning_content``, ``thinking`` or ``reasoning``
is offered under ``thinking`` and ``reasoning_content`` both, and the template sees
``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the tokenizer's
special tokens, overridden by the caller's keyword arguments. A test renders every
template of the shared corpus both ways and compares the bytes.

What differs is the clock: ``strftime_now`` reads the ``clock`` given here.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import signal
import threading
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import cache, partial
from typing import Any

import jinja2
import jinja2.bccache

from . import jinja_env
from .config import cache_directory
from .jinja_env import Clock, make_environment

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class RenderError(Exception):
    """The template refused the conversation (``raise_exception``) or failed while rendering."""


class RenderLimitExceeded(RenderError):
    """A render ran longer, or printed more, than the limits allow."""


@dataclass(frozen=True)
class RenderLimits:
    """Per render. Real templates render in milliseconds and a few kilobytes."""

    seconds: float = 2.0
    max_bytes: int = 1_000_000


DEFAULT_LIMITS = RenderLimits()


class FrozenClock:
    """A clock that reads a fixed instant; ``set`` moves it (to cross midnight, say)."""

    def __init__(self, instant: datetime):
        self.instant = instant

    def __call__(self) -> datetime:
        return self.instant

    def set(self, instant: datetime) -> None:
        self.instant = instant


# The clock of the render under way. A template is compiled once per text and limits (a
# compile costs as much as a dozen renders, and every proof made a clock of its own), and
# each render says which clock ``strftime_now`` reads; per thread, as context variables are.
_RENDER_CLOCK: ContextVar[Clock] = ContextVar("render_clock")


def _render_clock_now() -> datetime:
    return _RENDER_CLOCK.get()()


_COMPILED: dict[tuple[str, RenderLimits], jinja2.Template] = {}
_COMPILED_KEPT = 256


def _compile(text: str, limits: RenderLimits, tree: jinja2.nodes.Template | None) -> jinja2.Template:
    key = (text, limits)
    template = _COMPILED.get(key)
    if template is None:
        environment = make_environment(_render_clock_now)
        environment.intercepted_binops = frozenset({"*", "**", "+"})
        environment.call_binop = partial(_bounded_binop, environment, limits)
        environment.joined = partial(_bounded_join, limits)
        code = _compiled_code(environment, text, tree)
        # The globals as a plain dict, not jinja2's ChainMap over the environment's: every
        # render starts its context from them, and reading a ChainMap key by key costs a
        # short render dearly. The ChainMap only matters where the environment's globals change
        # after the template is made; this environment is the template's own and never does.
        globals_ = dict(environment.make_globals(None))
        template = environment.template_class.from_code(environment, code, globals_)
        if len(_COMPILED) >= _COMPILED_KEPT:
            _COMPILED.clear()
        _COMPILED[key] = template
    return template


# -- compiled code kept between runs -----------------------------------------------------
# Compiling a template to Python is a third of proving it (jinja generates and compiles
# its code: 50 ms for a long template), and a linter meets the same files run after run
# (pre-commit on every commit, CI, --fix and then the check). jinja2's own file cache keeps
# the code per template text in "code" under tmpl-lint's cache (config.cache_directory),
# written atomically; tmpl-lint keys it by jinja2's version and by the bytes of the two
# modules that make the environment and compile with it, so a code generator changed in
# development is never served old code. TMPL_LINT_NO_CACHE=1 turns it off for every run,
# --no-cache for one (keep_compiled_code).

_kept = True  # this run's choice: False under --no-cache


def keep_compiled_code(enabled: bool) -> None:
    """Whether this run reads and writes compiled code (``--no-cache``: neither). Set before
    the work starts: the processes forked for it inherit the choice."""
    global _kept
    _kept = enabled


def _compiled_code(environment: jinja2.Environment, text: str, tree: jinja2.nodes.Template | None):
    found = _code_cache() if _kept else None
    if found is None:
        return environment.compile(text if tree is None else tree)
    cache, code_key = found
    # surrogatepass: a template read with a lone surrogate is linted as read, so cached too
    text_key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    bucket = jinja2.bccache.Bucket(environment, f"{code_key}-{text_key}", "")
    try:
        cache.load_bytecode(bucket)
    except Exception:  # noqa: BLE001 - a damaged or foreign file is a miss, compiled again
        bucket.reset()
    if bucket.code is None:
        bucket.code = environment.compile(text if tree is None else tree)
        with contextlib.suppress(OSError):  # a full disk or a read-only directory: no cache
            cache.dump_bytecode(bucket)
    return bucket.code


@cache
def _code_cache() -> tuple[jinja2.BytecodeCache, str] | None:
    """The cache and the key of this code generator, or None: turned off, or no directory.
    Looked for once a process (its workers, forked later, inherit the answer)."""
    if os.environ.get("TMPL_LINT_NO_CACHE"):
        return None
    try:
        directory = cache_directory() / "code"
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return jinja2.FileSystemBytecodeCache(str(directory), "%s.code"), _code_key()
    except (OSError, RuntimeError):  # RuntimeError: no home directory to find a cache in
        return None


def _code_key() -> str:
    """What the compiled code depends on besides the template's text."""
    digest = hashlib.sha256(jinja2.__version__.encode())
    for module in (__file__, jinja_env.__file__):
        with open(module, "rb") as source:
            digest.update(source.read())
    return digest.hexdigest()[:32]


def _bounded_join(limits: RenderLimits, value):
    """``a ~ b`` as usual, unless it made a string larger than a render may print."""
    if len(value) > limits.max_bytes:
        raise RenderLimitExceeded(f"a string joined with ~ reached {len(value)} characters, over the {limits.max_bytes} limit")
    return value


def _bounded_binop(environment, limits: RenderLimits, context, operator: str, left, right):
    """``*``, ``**`` and ``+`` as usual, unless the result would be larger than a render may
    print (a string doubled forty times was gigabytes before the time limit stopped it)."""
    if operator == "+":
        if (
            isinstance(left, (str, list, tuple))
            and isinstance(right, (str, list, tuple))
            and len(left) + len(right) > limits.max_bytes
        ):
            raise RenderLimitExceeded(f"a sum would make {len(left) + len(right)} items, over the {limits.max_bytes} limit")
        return left + right
    if operator == "*":
        for sequence, count in ((left, right), (right, left)):
            if isinstance(sequence, (str, list, tuple)) and isinstance(count, int) and len(sequence) * count > limits.max_bytes:
                raise RenderLimitExceeded(
                    f"a repetition would make {len(sequence) * count} items, over the {limits.max_bytes} limit"
                )
    if operator == "**" and isinstance(left, (int, float)) and isinstance(right, (int, float)) and abs(left) > 1 and right > 256:
        raise RenderLimitExceeded(f"{left} ** {right} is too large to compute")
    return environment.binop_table[operator](left, right)


# -- the time limit ----------------------------------------------------------------------
# A render is interrupted by SIGALRM from an interval timer, where signals can reach it (the
# main thread). Installing the handler and putting the caller's back is most of what the
# limit costs a render (signal.signal turns each handler it returns into an enum member, or
# fails to, at some microseconds a call): a caller that renders many times (a proof) opens a
# ``render_session``, which installs the handler once, and its renders only arm the timer.
# Each render still has its own limit, counted from its own start.

_TIMED = hasattr(signal, "setitimer")
_IN_SESSION = object()  # what _arm returns when the session's handler stays installed
_session_depth = 0  # open render_sessions (in the main thread: the only one that arms)
_armed_seconds = 0.0  # the limit of the render the timer is armed for, for the message


def _expire(signum, frame):
    raise RenderLimitExceeded(f"rendering took over {_armed_seconds:g} s")


def _in_main_thread() -> bool:
    return _TIMED and threading.current_thread() is threading.main_thread()


@contextmanager
def render_session():
    """Renders inside share one SIGALRM handler (each still arms its own timer), and the
    caller's handler is back after the block. Elsewhere than the main thread, nothing."""
    global _session_depth
    if not _in_main_thread() or _session_depth:
        yield
        return
    previous = signal.signal(signal.SIGALRM, _expire)
    _session_depth += 1
    try:
        yield
    finally:
        _session_depth -= 1
        signal.signal(signal.SIGALRM, previous)


def _arm(seconds: float):
    """Start the render's timer: None where it cannot run (not the main thread), else what
    ``_disarm`` puts back."""
    global _armed_seconds
    if not _in_main_thread():
        return None
    _armed_seconds = seconds
    previous = _IN_SESSION if _session_depth else signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    return previous


def _disarm(previous) -> None:
    if previous is None:
        return
    signal.setitimer(signal.ITIMER_REAL, 0)
    if previous is not _IN_SESSION:
        signal.signal(signal.SIGALRM, previous)


def compile_template(
    text: str, limits: RenderLimits = DEFAULT_LIMITS, tree: jinja2.nodes.Template | None = None
) -> jinja2.Template:
    """The template compiled for rendering, once per text and limits. ``tree``: its parse,
    where the caller has one (a proof compiles the lint's instead of parsing again, a fifth
    of a proof): jinja2 compiles a parse as it compiles the text it parses, and the parse
    environment is this one's but for the clock (tests/test_render_equivalence.py compares
    the code)."""
    try:
        return _compile(text, limits, tree)
    except jinja2.TemplateSyntaxError as error:
        raise RenderError(f"template does not parse: {error.message} (line {error.lineno})") from None
    except RecursionError:
        raise RenderLimitExceeded("the template is nested too deeply to compile") from None


# What a request holds that is its own copy already: immutable, and a template reaches
# nothing through it.
_LEAVES = frozenset({str, int, float, bool, type(None)})


def copy_request(value: Any) -> Any:
    """A copy of request data through which a template cannot reach the caller's. JSON
    data (all a request holds) is rebuilt as transformers rebuilds it, without
    ``deepcopy``'s memo (a fifth of a proof); anything else is deep-copied. Most values are
    strings: they are kept without a call each."""
    kind = type(value)
    if kind is dict:
        return {key: item if type(item) in _LEAVES else copy_request(item) for key, item in value.items()}
    if kind is list:
        return [item if type(item) in _LEAVES else copy_request(item) for item in value]
    if kind in _LEAVES:
        return value
    return copy.deepcopy(value)


def prepare_messages(messages: Sequence[Mapping[str, Any]], reasoning_aliases: bool = True) -> list[dict[str, Any]]:
    """The messages a template sees: copies, null fields left out; ``reasoning_aliases``:
    a message's reasoning under each name templates read it by (vLLM's own rebuild gives
    `reasoning` and `reasoning_content` only, and nothing more reaches its template)."""
    prepared = []
    for message in messages:
        plain = {
            key: value if type(value) in _LEAVES else copy_request(value) for key, value in message.items() if value is not None
        }
        for field in REASONING_FIELDS if reasoning_aliases else ():
            reasoning = plain.get(field)
            if reasoning is not None:
                plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
                break
        prepared.append(plain)
    return prepared


def render(
    text: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    clock: Clock,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    special_tokens: Mapping[str, Any] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
    reasoning_aliases: bool = True,
) -> str:
    template = compile_template(text, limits)
    variables = {**(special_tokens or {}), **(template_kwargs or {})}
    reading = _RENDER_CLOCK.set(clock)
    try:
        alarm = _arm(limits.seconds)
        try:
            chunks: list[str] = []
            size = 0
            for chunk in template.generate(
                messages=prepare_messages(messages, reasoning_aliases),
                tools=copy_request(list(tools)) if tools is not None else None,
                documents=copy_request(list(documents)) if documents is not None else None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            ):
                size += len(chunk)
                if size > limits.max_bytes:
                    raise RenderLimitExceeded(f"the render printed over {limits.max_bytes} characters")
                chunks.append(chunk)
            return "".join(chunks)
        finally:
            _disarm(alarm)  # before the errors are told apart: the timer only ever stops a render
    except RenderLimitExceeded:
        raise
    except MemoryError:
        raise RenderLimitExceeded("the render ran out of memory") from None
    except jinja2.TemplateError as error:
        raise RenderError(str(error) or type(error).__name__) from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as error:
        raise RenderError(f"{type(error).__name__}: {error}") from None
    except RecursionError:
        raise RenderLimitExceeded("recursion too deep") from None
    finally:
        _RENDER_CLOCK.reset(reading)
