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
import marshal
import os
import re
import signal
import string
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import cache, partial
from pathlib import Path
from typing import Any

import jinja2
from jinja2.runtime import Context

from . import jinja_env, sealed
from .config import cache_directory
from .jinja_env import ChatTemplateSandbox, Clock, make_environment

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
        environment = make_environment(_render_clock_now, partial(RenderSandbox, limits))
        _bound_filters(environment, limits)
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
# (pre-commit on every commit, CI, --fix and then the check). The code is kept per template
# text in "code" under tmpl-lint's cache (config.cache_directory), keyed by jinja2's version
# and by the bytes of the two modules that make the environment and compile with it, so a
# code generator changed in development is never served old code. Code read back runs
# outside the sandbox, so an entry is loaded only when its MAC verifies (sealed.py): jinja2's
# own file cache unpickles whatever the file holds. TMPL_LINT_NO_CACHE=1 turns it off for
# every run, --no-cache for one (keep_compiled_code).

_kept = True  # this run's choice: False under --no-cache
_CODE_PURPOSE = b"tmpl-lint compiled template code 1"
MAX_CODE_BYTES = 64 * 1024 * 1024  # a template is at most 10 MB; its code a few times that


def keep_compiled_code(enabled: bool) -> None:
    """Whether this run reads and writes compiled code (``--no-cache``: neither). Set before
    the work starts: the processes forked for it inherit the choice."""
    global _kept
    _kept = enabled


def kept_compiled_code() -> bool:
    """Whether this run reads and writes compiled code (not under --no-cache)."""
    return _kept


def _compiled_code(environment: jinja2.Environment, text: str, tree: jinja2.nodes.Template | None):
    found = _code_cache() if _kept else None
    if found is None:
        return environment.compile(text if tree is None else tree)
    directory, code_key = found
    # surrogatepass: a template read with a lone surrogate is linted as read, so cached too
    name = f"{code_key}-{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()}.code"
    code = _load_code(directory, name)
    if code is None:
        code = environment.compile(text if tree is None else tree)
        with contextlib.suppress(OSError, sealed.NoKey), sealed.private_directory(directory) as folder:
            sealed.write_entry(folder, name, sealed.seal(_CODE_PURPOSE, name, marshal.dumps(code)))
    return code


def _load_code(directory: Path, name: str):
    """The code kept as ``name``, or None: missing, unauthenticated, damaged or foreign."""
    try:
        with sealed.private_directory(directory) as folder:
            kept = sealed.read_entry(folder, name, MAX_CODE_BYTES)
        data = sealed.unseal(_CODE_PURPOSE, name, kept) if kept is not None else None
        code = marshal.loads(data) if data is not None else None
    except (OSError, sealed.NoKey, ValueError, EOFError, TypeError):
        return None
    return code if isinstance(code, types.CodeType) else None


@cache
def _code_cache() -> tuple[Path, str] | None:
    """The cache's folder and the key of this code generator, or None: turned off, no
    directory, or no key to authenticate code with (sealed.secret). Looked for once a
    process (its workers, forked later, inherit the answer)."""
    if os.environ.get("TMPL_LINT_NO_CACHE"):
        return None
    try:
        directory = cache_directory() / "code"
        with sealed.private_directory(directory):
            pass
        sealed.secret()
        return directory, _code_key()
    except (OSError, RuntimeError, sealed.NoKey):  # RuntimeError: no home directory to find a cache in
        return None


def _code_key() -> str:
    """What the compiled code depends on besides the template's text."""
    digest = hashlib.sha256(f"{jinja2.__version__} {sys.version}".encode())
    for module in (__file__, jinja_env.__file__):
        with open(module, "rb") as source:
            digest.update(source.read())
    return digest.hexdigest()[:32]


# -- sizes checked before they are allocated ------------------------------------------------
# A filter or a str method that makes a string of a size it is given (a width, a count, a
# separator repeated per item) is checked against the render's size limit before it runs:
# the limit on what a render prints acts only after the string exists, and
# ``'a'|center(3000000000)`` is 3 GB by then.


def _over(limits: RenderLimits, size: int, what: str, unit: str = "characters", at_least: str = "") -> None:
    if size > limits.max_bytes:
        raise RenderLimitExceeded(f"{what} asks for {at_least}{size} {unit}, over the {limits.max_bytes} limit")


def _width(value) -> int:
    return value if isinstance(value, int) else 0


# The widths and precisions of %-conversions (``%10s``, ``%-*.*f``, ``%(name)08d``).
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def _check_digits(limits: RenderLimits, digits: str, what: str) -> None:
    if len(digits) > 18 or int(digits) > limits.max_bytes:  # a width of a thousand digits is no width either
        raise RenderLimitExceeded(f"{what} has a width or precision of {digits[:20]}, over the {limits.max_bytes} limit")


def _check_widths_given(limits: RenderLimits, values, what: str) -> None:
    """A width taken from the values (``*``, or a nested ``{}`` in a format spec): any
    integer among them is taken to be one."""
    for value in values:
        if type(value) is int and value > limits.max_bytes:
            raise RenderLimitExceeded(f"{what} has a width or precision of {value}, over the {limits.max_bytes} limit")


def _check_percent_format(limits: RenderLimits, text: str, values) -> None:
    starred = False
    for match in _PERCENT_SPEC.finditer(text) if "%" in text else ():
        for group in match.groups():
            if group == "*":
                starred = True
            elif group:
                _check_digits(limits, group, "a %-format")
    if starred:
        given = values.values() if isinstance(values, dict) else values if isinstance(values, tuple) else (values,)
        _check_widths_given(limits, given, "a %-format")


def _check_str_format(limits: RenderLimits, text: str, args, kwargs) -> None:
    """``str.format``'s fields: each spec's width and precision (nested fields resolve to
    the values given)."""
    nested = False
    pending = [text]
    while pending:
        try:
            fields = list(string.Formatter().parse(pending.pop()))
        except ValueError:
            return  # str.format refuses it too, with its own message
        for _, _, spec, _ in fields:
            if spec:
                nested = nested or "{" in spec
                for digits in _DIGITS.findall(spec):
                    _check_digits(limits, digits, "str.format")
                if "{" in spec:
                    pending.append(spec)
    if nested:
        _check_widths_given(limits, [*args, *kwargs.values()], "str.format")


def _replaced_size(text: str, old, new, count) -> int:
    if not isinstance(old, str) or not isinstance(new, str):
        return len(text)
    found = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(text) + found * (len(new) - len(old))


def _joined_size(separator: str, items: list) -> int:
    return max(0, len(items) - 1) * len(separator) + sum(len(item) for item in items if isinstance(item, str))


def _check_str_method(limits: RenderLimits, text: str, name: str, args: tuple, kwargs: dict):
    """The items of a ``join`` (consumed here, so passed on as a list), after checking the
    size of what the method would make."""
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _over(limits, _width(args[0]), f"str.{name}")
    elif name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        _over(limits, len(text) + text.count("\t") * _width(tabsize), "str.expandtabs")
    elif name == "replace" and len(args) >= 2:
        _over(limits, _replaced_size(text, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count")), "str.replace")
    elif name == "join" and len(args) == 1:
        items = list(args[0])
        _over(limits, _joined_size(text, items), "str.join")
        return (items,)
    return args


class RenderSandbox(ChatTemplateSandbox):
    """The environment a template is compiled in for rendering: the chat template sandbox,
    whose operators, calls (str methods, ``lipsum``) and ``str.format`` check the sizes of
    this section against the render's limits before they run."""

    # Each is compiled to a call_binop call, where it is bounded.
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, limits: RenderLimits, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits

    def joined(self, value: str) -> str:
        """``a ~ b`` as usual, unless it made a string larger than a render may print."""
        limits = self.limits
        if len(value) > limits.max_bytes:
            raise RenderLimitExceeded(
                f"a string joined with ~ reached {len(value)} characters, over the {limits.max_bytes} limit"
            )
        return value

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        """``*``, ``**``, ``+`` and ``%`` as usual, unless the result would be larger than a
        render may print (a string doubled forty times was gigabytes before the time limit
        stopped it; ``'%3000000000s' % x`` is as large as its width)."""
        limits = self.limits
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
                if (
                    isinstance(sequence, (str, list, tuple))
                    and isinstance(count, int)
                    and len(sequence) * count > limits.max_bytes
                ):
                    raise RenderLimitExceeded(
                        f"a repetition would make {len(sequence) * count} items, over the {limits.max_bytes} limit"
                    )
        if (
            operator == "**"
            and isinstance(left, (int, float))
            and isinstance(right, (int, float))
            and abs(left) > 1
            and right > 256
        ):
            raise RenderLimitExceeded(f"{left} ** {right} is too large to compute")
        if operator == "%" and isinstance(left, str):
            _check_percent_format(limits, left, right)
        return self.binop_table[operator](left, right)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        kind = type(obj)
        if (kind is types.BuiltinMethodType or kind is types.MethodType) and isinstance(obj.__self__, str):
            args = _check_str_method(self.limits, obj.__self__, obj.__name__, args, kwargs)
        elif obj is self.globals["lipsum"]:
            with contextlib.suppress(TypeError):  # arguments lipsum refuses: its own error
                _over(self.limits, _lipsum_size(*args, **kwargs), "lipsum")
        return super().call(context, obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        limits = self.limits
        text = value.__self__

        def bounded(*args: Any, **kwargs: Any) -> str:
            if value.__name__ == "format_map" and len(args) == 1 and isinstance(args[0], dict):
                _check_str_format(limits, text, (), args[0])
            else:
                _check_str_format(limits, text, args, kwargs)
            return wrapper(*args, **kwargs)

        return bounded


def _bound_filters(environment: ChatTemplateSandbox, limits: RenderLimits) -> None:
    """Put the checks of this section into the filters of a render environment that size
    their output."""
    filters = environment.filters

    def center(value, width=80):
        _over(limits, _width(width), "center")

    def indent(s, width=4, first=False, blank=False):
        indention = len(width) if isinstance(width, str) else _width(width)
        text = str(s)
        _over(limits, len(text) + (text.count("\n") + 1) * indention, "indent")  # jinja2 indents each line

    def format_(value, *args, **kwargs):
        _check_percent_format(limits, str(value), kwargs or args)

    def join(value, *rest, **kwargs):
        d = rest[0] if rest else kwargs.get("d", "")
        attribute = rest[1] if len(rest) > 1 else kwargs.get("attribute")
        items = list(value)  # consumed here: passed on as a list
        _over(limits, _joined_size(str(d), items if attribute is None else []), "join")
        return (items, *rest)

    def replace(s, old, new, count=None):
        _over(limits, _replaced_size(str(s), str(old), str(new), count), "replace")

    def batch(value, linecount, fill_with=None):
        if fill_with is not None:
            _over(limits, _width(linecount), "batch", "items")

    def slice_(value, slices, fill_with=None):
        _over(limits, _width(slices), "slice", "items")

    def wordwrap(s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
        separator = len(wrapstring) if isinstance(wrapstring, str) else 1
        if separator > 1:
            text = str(s)
            _over(limits, len(text) + (len(text) + 1) * separator, "wordwrap")

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        if indent or separators:
            _check_json_layout(limits, value, indent, separators)

    checks = {"center": center, "indent": indent, "format": format_, "join": join, "replace": replace, "batch": batch}
    checks.update(slice=slice_, wordwrap=wordwrap, tojson=tojson)
    for name, check in checks.items():
        filters[name] = _checked_filter(filters[name], check)


def _checked_filter(original, check):
    """``original`` (a filter), after ``check`` has seen its arguments: ``check`` takes the
    filter's own parameters (past the environment or context jinja2 passes some filters),
    and returns the arguments to pass on instead, if any."""
    pass_arg = getattr(original, "jinja_pass_arg", None)
    if pass_arg is None:

        def checked(*args, **kwargs):
            return original(*(check(*args, **kwargs) or args), **kwargs)

        return checked

    def checked_passing(passed, *args, **kwargs):
        return original(passed, *(check(*args, **kwargs) or args), **kwargs)

    # Marked as the original is (jinja2.pass_context, say), so jinja2 passes the same argument first.
    return _PASSING[pass_arg.name](checked_passing)


# jinja2's decorators for a filter that takes the context, eval context or environment first.
_PASSING = {"context": jinja2.pass_context, "eval_context": jinja2.pass_eval_context, "environment": jinja2.pass_environment}


def _lipsum_size(n=5, html=True, min=20, max=100) -> int:  # noqa: A002 - lipsum's own names
    """More than lipsum's paragraphs of words can hold (a word and its space: under 16)."""
    return _width(n) * (_width(max) if _width(max) > _width(min) else _width(min)) * 16


def _check_json_layout(limits: RenderLimits, value, indent, separators) -> None:
    """What ``json.dumps`` adds for an indent and separators, counted before it writes:
    per item of a container its separators, and with an indent a line break and the
    item's depth in indents; per non-empty container a line for its closing bracket."""
    step = len(indent) if isinstance(indent, str) else _width(indent)
    newline = 0 if indent is None else 1
    if isinstance(separators, (tuple, list)) and len(separators) == 2:
        item_separator, key_separator = (len(str(part)) for part in separators)
    else:
        item_separator, key_separator = (1 if indent is not None else 2), 2
    size = 0
    pending = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, dict):
            children = list(node.values())
            size += len(children) * key_separator
        elif isinstance(node, (list, tuple)):
            children = list(node)
        else:
            continue
        if children:
            size += len(children) * (item_separator + newline + (depth + 1) * step) + newline + depth * step
        if size > limits.max_bytes:
            _over(limits, size, "tojson's layout", at_least="at least ")  # counted so far
        pending.extend((child, depth + 1) for child in children)


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
