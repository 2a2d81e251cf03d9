"""llama.cpp b10775's llama-server: its own chat-template engine renders (below), its slot
cache is kv_cache's ``LlamaCppSlots``, and its profile ends this module.

llama.cpp does not render with Jinja2. Its ``common/jinja`` (lexer, parser, runtime, caps)
and ``common_chat_template_direct_apply_impl`` (common/chat.cpp) run the template: a
capabilities probe, a message normaliser (content made a string or typed parts as the
template takes them; a null content becomes ""), ``enable_thinking`` always defined (true
unless the request says), ``add_generation_prompt`` defined only when on, and
``preserve_reasoning`` as llama-server's CLI defaults it. Its filters, tests, whitespace and
errors are its own: about one render in nine of the shared corpus differs from Jinja2's.

So tmpl-lint runs that code itself: llama.cpp b10775's engine compiled to WebAssembly,
shipped in ggufdoctor (MIT, pinned exactly in pyproject.toml), run by wasmtime. Only the
module's bytes are used, checked against their sha256 below, and driven through its four
exports (``gd_alloc``, ``gd_render``, ``gd_out_len``, ``gd_free``: JSON in, JSON out); a
ggufdoctor that ships another module fails loudly here, and one whose module renders
differently fails tests/test_llamacpp_golden.py (670 renders by llama.cpp's engine).

Each render is a fresh instance in a store of its own, bounded before it starts: a
wall-clock limit (wasmtime's epoch interruption, the render's ``RenderLimits.seconds``), a
ceiling on its linear memory, a wasm stack limit, and the printed size. The module gets
WASI with nothing in it: no files, no environment, no arguments, no output streams.

llama-server's request handling above that function is ``request_context``: the extra
context it adds (``date_string`` and ``datetime`` from its clock), the request's
``chat_template_kwargs``, and the vocabulary's ``bos_token`` and ``eos_token`` (the only
special tokens llama.cpp hands a template), and its clock: the module fixes
``strftime_now`` at 2026-01-01, where llama-server reads the time, so a template that calls
it is given one that reads the render's clock (``with_clock``). Not modelled: the
``common_chat_msg`` round trip (unknown message keys dropped, tool-call arguments re-read),
the per-family rewrites llama.cpp picks by sniffing a template (Gemma 4, DeepSeek V4,
gpt-oss...), and the leading-BOS strip (its tokenizer adds the BOS back).
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache, lru_cache
from typing import Any

from .. import render, sealed
from ..config import cache_directory
from ..render import DEFAULT_LIMITS, RenderError, RenderLimitExceeded, RenderLimits, copy_request
from .base import EngineProfile

BUILD = "b10775"  # llama.cpp's build the module was compiled from (commit 67a17c17)
PACKAGE = "ggufdoctor"
PACKAGE_VERSION = "0.3.0"
MODULE_SHA256 = "4de88e68f8792347f1328be3ea377aa15100f2df7d2daf07fa6bee067d9c516f"
INSTALL_HINT = "pip install 'tmpl-lint[prove]'"

# A real template's render peaks under half a MiB of the module's memory; a render that asks
# for more than this is stopped (the module's allocator fails, and it says so).
MEMORY_BYTES = 256 * 1024**2
STACK_BYTES = 1024**2  # wasm stack: a template recursing without end traps here
# What the module's answer may be: the render (at most max_bytes characters, four bytes each
# in UTF-8, escaped in JSON as six) and a few fields.
_ANSWER_SLACK = 64 * 1024


@dataclass(frozen=True)
class Refusal:
    """llama.cpp's engine declined to render: the template did not parse (``stage`` "lexer"
    or "parser"), called ``raise_exception`` ("raise"), or failed while rendering
    ("render"). ``message`` is the engine's own."""

    stage: str
    message: str

    def __str__(self) -> str:
        # As llama-server's error names it: the template's own message, or the engine's.
        if self.stage in ("lexer", "parser"):
            return f"compile:{self.stage}: {self.message}"
        return f"{self.stage}:{self.message}"


class EngineUnavailable(RenderError):
    """llama.cpp's engine is not installed, or is not the module this version pins."""


@dataclass(frozen=True)
class _Runtime:
    engine: Any
    linker: Any
    module: Any


class _Watchdog:
    """Stops a render that passes its time: one thread a process, told of each render as it
    starts and ends, that ticks the engine's epoch when a render's deadline passes (a timer
    thread a render cost more wall time than the render). Renders take turns (``turn``),
    and the tick is given under the lock that says which render is running, so it never
    stops the next one."""

    def __init__(self):
        self.turn = threading.Lock()
        self.state = threading.Condition()
        self.running: tuple[object, float, Any] | None = None  # (render, deadline, engine)
        self.pid = 0

    def started(self, render: object, seconds: float, engine: Any) -> None:
        with self.state:
            if self.pid != os.getpid():  # the first render of this process (a worker forked)
                self.pid = os.getpid()
                threading.Thread(target=self._watch, name="llama.cpp render limit", daemon=True).start()
            self.running = (render, time.monotonic() + seconds, engine)
            self.state.notify()

    def ended(self) -> None:
        with self.state:
            self.running = None

    def _watch(self) -> None:
        with self.state:
            while True:
                if self.running is None:
                    self.state.wait()
                    continue
                render, deadline, engine = self.running
                left = deadline - time.monotonic()
                if left > 0:
                    self.state.wait(left)
                elif self.running is not None and self.running[0] is render:
                    engine.increment_epoch()
                    self.running = None


_WATCHDOG = _Watchdog()
# A fork while the watchdog held its lock would leave the child's locked for good.
os.register_at_fork(after_in_child=lambda: globals().update(_WATCHDOG=_Watchdog()))


@cache
def _runtime() -> _Runtime:
    """The module compiled, once a process (a second or two: done before workers fork,
    see ``ready``)."""
    try:
        from importlib import resources  # noqa: PLC0415 -- with wasmtime, only when llama.cpp's engine renders

        import wasmtime  # noqa: PLC0415 -- 30 ms: only when llama.cpp's engine renders
    except ImportError:
        raise EngineUnavailable(
            f"rendering as llama.cpp needs its template engine, which is not installed ({INSTALL_HINT})"
        ) from None
    try:
        data = resources.files(f"{PACKAGE}.engine_data").joinpath("llamacpp-jinja.wasm").read_bytes()
    except (ImportError, OSError) as error:
        raise EngineUnavailable(
            f"rendering as llama.cpp needs its template engine from {PACKAGE} {PACKAGE_VERSION}, which cannot be read "
            f"({error}; {INSTALL_HINT})"
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != MODULE_SHA256:
        raise EngineUnavailable(
            f"{PACKAGE}'s llama.cpp module is not llama.cpp {BUILD}'s (sha256 {digest[:12]}, expected {MODULE_SHA256[:12]}): "
            f"install {PACKAGE}=={PACKAGE_VERSION} ({INSTALL_HINT})"
        )
    config = wasmtime.Config()
    config.wasm_exceptions = True  # the engine's C++ exceptions are wasm exceptions
    config.epoch_interruption = True
    config.max_wasm_stack = STACK_BYTES
    # Single-threaded: a compiler thread pool does not survive the fork of a worker.
    config.parallel_compilation = False
    # Address space for one memory at its ceiling, not wasmtime's 4 GiB + guard: renders
    # run in children with an address-space limit (isolation.MEMORY_BYTES).
    config.memory_reservation = MEMORY_BYTES
    config.memory_guard_size = 64 * 1024
    config.memory_reservation_for_growth = 0
    engine = wasmtime.Engine(config)
    module = _module(wasmtime, engine, data)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    runtime = _Runtime(engine, linker, linker.instantiate_pre(module))
    # Freed before the interpreter tears wasmtime's module down, which would make their
    # finalizers print errors at exit.
    atexit.register(lambda: [part.close() for part in (runtime.module, module, linker, engine)])
    return runtime


# -- the compiled module, kept between runs ----------------------------------------------------
# Compiling the module is two seconds of CPU, every process; loading it compiled, a few
# milliseconds. It is machine code run outside any sandbox, so it is kept as the compiled
# Jinja code is (render.py): in tmpl-lint's cache, loaded only where its MAC under this
# user's key verifies (sealed.py), named by the module, wasmtime's version and the settings
# it was compiled with; --no-cache and TMPL_LINT_NO_CACHE=1 turn it off.

_MODULE_PURPOSE = b"tmpl-lint llama.cpp engine compiled by wasmtime 1"
_SETTINGS = f"exceptions,epoch,stack{STACK_BYTES},memory{MEMORY_BYTES},guard65536,serial"
MAX_COMPILED_BYTES = 64 * 1024 * 1024  # 4 MB as compiled


def _module(wasmtime, engine, data: bytes):
    if not render.kept_compiled_code() or os.environ.get("TMPL_LINT_NO_CACHE"):
        return wasmtime.Module(engine, data)
    version = hashlib.sha256(f"{MODULE_SHA256} {_installed('wasmtime')} {_SETTINGS}".encode()).hexdigest()[:32]
    name = f"llamacpp-{BUILD}-{version}.cwasm"
    try:
        directory = cache_directory() / "llamacpp"
    except RuntimeError:  # no home directory to find a cache in
        return wasmtime.Module(engine, data)
    try:
        with sealed.private_directory(directory) as folder:
            kept = sealed.read_entry(folder, name, MAX_COMPILED_BYTES)
        compiled = sealed.unseal(_MODULE_PURPOSE, name, kept) if kept is not None else None
        if compiled is not None:
            return wasmtime.Module.deserialize(engine, compiled)
    except (OSError, sealed.NoKey, wasmtime.WasmtimeError):  # a miss: compiled again, and kept
        pass
    module = wasmtime.Module(engine, data)
    with contextlib.suppress(OSError, sealed.NoKey), sealed.private_directory(directory) as folder:
        sealed.write_entry(folder, name, sealed.seal(_MODULE_PURPOSE, name, module.serialize()))
    return module


def _installed(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 -- 15 ms: only as a compiled module is cached

    try:
        return version(package)
    except PackageNotFoundError:
        return "-"


def ready() -> None:
    """Compile the module now, in the parent, so that workers forked later inherit it;
    not installed, each render says so."""
    with contextlib.suppress(EngineUnavailable):
        _runtime()


def available() -> str | None:
    """None when the engine can render, else why not."""
    try:
        _runtime()
    except EngineUnavailable as error:
        return str(error)
    return None


def render_llamacpp(template: str, context: Mapping[str, Any], limits: RenderLimits = DEFAULT_LIMITS) -> str | Refusal:
    """What llama.cpp b10775's ``common_chat_template_direct_apply_impl`` renders for
    ``context`` (messages, tools, add_generation_prompt, bos_token, eos_token and any other
    variable), with llama-server's ``preserve_reasoning`` default: the text, or the engine's
    refusal. RenderLimitExceeded when the render passes ``limits`` or the memory ceiling;
    EngineUnavailable when the engine is not installed."""
    runtime = _runtime()
    import wasmtime  # noqa: PLC0415 -- 30 ms: only when llama.cpp's engine renders (_runtime loaded it)

    payload = json.dumps({"template": template, "context": context, "normalize": True}, default=_unserialisable).encode(
        "utf-8", "surrogatepass"
    )
    watchdog = _WATCHDOG
    with watchdog.turn:
        store = wasmtime.Store(runtime.engine)
        store.set_limits(memory_size=MEMORY_BYTES)
        store.set_wasi(wasmtime.WasiConfig())  # nothing: no files, environment, arguments or streams
        store.set_epoch_deadline(1)
        watchdog.started(store, limits.seconds, runtime.engine)
        try:
            answer = _run(store, runtime, payload, limits)
        except wasmtime.Trap as trap:
            raise RenderLimitExceeded(_trap_reason(trap, limits)) from None
        except wasmtime.WasmtimeError as error:
            raise RenderError(f"llama.cpp's engine failed: {_first_line(str(error))}") from None
        finally:
            watchdog.ended()
    return _answer(answer, limits)


def _unserialisable(value: Any) -> Any:
    raise RenderError(f"llama.cpp's engine takes JSON data only, not {type(value).__name__}")


def _run(store, runtime: _Runtime, payload: bytes, limits: RenderLimits) -> bytes:
    exports = runtime.module.instantiate(store).exports(store)
    exports["_initialize"](store)
    memory = exports["memory"]
    given = exports["gd_alloc"](store, len(payload))
    if not given:
        raise RenderLimitExceeded(f"the request ({len(payload)} bytes) does not fit in the engine's {MEMORY_BYTES >> 20} MiB")
    memory.write(store, payload, given)
    at = exports["gd_render"](store, given, len(payload))
    size = exports["gd_out_len"](store)
    if size > limits.max_bytes * 6 + _ANSWER_SLACK:
        raise RenderLimitExceeded(f"the render printed over {limits.max_bytes} characters")
    return bytes(memory.read(store, at, at + size))


def _trap_reason(trap, limits: RenderLimits) -> str:
    text = str(trap)
    if "interrupt" in text:
        return f"rendering took over {limits.seconds:g} s"
    # The C++ stack lives in the module's memory, below its data: run past, it reads out of bounds.
    if "stack" in text or "out of bounds memory access" in text:
        return "recursion too deep (llama.cpp's engine ran out of stack)"
    return f"llama.cpp's engine stopped: {_first_line(text.split('Caused by:')[-1])}"


def _answer(raw: bytes, limits: RenderLimits) -> str | Refusal:
    try:
        answer = json.loads(raw)
        ok, text = answer["ok"], answer.get("text")
    except (ValueError, KeyError, TypeError):
        raise RenderError("llama.cpp's engine gave an answer that is not its format") from None
    if ok:
        if not isinstance(text, str):
            raise RenderError("llama.cpp's engine gave an answer that is not its format")
        if len(text) > limits.max_bytes:
            raise RenderLimitExceeded(f"the render printed over {limits.max_bytes} characters")
        return text
    stage, error = str(answer.get("stage", "render")), str(answer.get("error", ""))
    if "bad_alloc" in error:
        raise RenderLimitExceeded(f"the render ran out of memory ({MEMORY_BYTES >> 20} MiB)")
    if stage in ("lexer", "parser"):
        return Refusal(stage, _first_line(error))
    if stage == "raise":
        return Refusal(stage, error)
    # The runtime wraps the failure in the template lines it passed through; its last line says what failed.
    return Refusal("render", _last_line(error))


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text.strip()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text.strip()


# -- llama-server's request handling ------------------------------------------------------


def request_context(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    clock: Callable[[], datetime],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, Any] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The context llama-server hands ``common_chat_template_direct_apply_impl`` for a chat
    request: the messages and tools as sent, the vocabulary's ``bos_token`` and
    ``eos_token``, ``common_chat_extra_context()``'s ``datetime`` ("%b %d %Y") and
    ``date_string`` ("%d %b %Y") from its clock, then the request's
    ``chat_template_kwargs`` over them."""
    special = special_tokens or {}
    now = clock()
    _, formats = with_clock(template)
    context: dict[str, Any] = {"messages": copy_request(list(messages))}
    if tools is not None:
        context["tools"] = copy_request(list(tools))
    context["add_generation_prompt"] = add_generation_prompt
    for name in ("bos_token", "eos_token"):
        context[name] = special.get(name) or ""
    context["datetime"] = now.strftime("%b %d %Y")
    context["date_string"] = now.strftime("%d %b %Y")
    context.update(copy_request(dict(template_kwargs or {})))
    if formats is not None:
        context[_CLOCK] = {form: now.strftime(form) for form in formats}
    return context


def render_request(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    clock: Callable[[], datetime],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, Any] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
) -> str:
    """The prompt llama-server renders for a chat request; its engine's refusal is a
    RenderError naming it, as a template's own refusal is under Jinja2."""
    context = request_context(
        template,
        messages,
        clock=clock,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        special_tokens=special_tokens,
        template_kwargs=template_kwargs,
    )
    rendered = render_llamacpp(with_clock(template)[0], context, limits)
    if isinstance(rendered, Refusal):
        raise RenderError(f"llama.cpp {BUILD} refuses to render: {rendered}")
    return rendered


# -- llama-server's clock -------------------------------------------------------------------
# llama-server renders ``strftime_now(format)`` at the time of the request; the module, at
# 2026-01-01 00:00. A template that calls it is rendered with each call made to a macro that
# prints the render's time in that format, given in the context by format: the template is
# still parsed and run by llama.cpp's engine, and only the clock is the render's. Formats
# that are not string literals print nothing (not modelled).

_MACRO = "tmpl_lint_strftime_now"
_CLOCK = "tmpl_lint_clock"
_DEFINITION = f"{{% macro {_MACRO}(format) %}}{{{{ {_CLOCK}[format] }}}}{{% endmacro %}}"
_TAG = re.compile(r"\{[{%#]")
_CODE = re.compile(
    r"""(?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")|(?P<name>[A-Za-z_][A-Za-z_0-9]*)|(?P<end>[-+]?[}%]\})|.""", re.S
)
_CALL = re.compile(r"""\s*\(\s*('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


@lru_cache(maxsize=64)
def with_clock(template: str) -> tuple[str, frozenset[str] | None]:
    """``template`` with its ``strftime_now`` calls made to read the render's clock, and the
    formats they print; the template itself and None where it has none to make."""
    if "strftime_now" not in template:
        return template, None
    pieces: list[str] = []
    formats: set[str] = set()
    position, changed = 0, False
    while (tag := _TAG.search(template, position)) is not None:
        pieces.append(template[position : tag.start()])
        opener = tag.group()
        if opener == "{#":
            end = template.find("#}", tag.end())
            end = len(template) if end < 0 else end + 2
            pieces.append(template[tag.start() : end])
            position = end
            continue
        pieces.append(opener)
        position = tag.end()
        closer = "}}" if opener == "{{" else "%}"
        for token in _CODE.finditer(template, position):
            position = token.end()
            if token.group("end") is not None and token.group().endswith(closer):
                pieces.append(token.group())
                break
            if token.group("name") == "strftime_now":
                pieces.append(_MACRO)
                changed = True
                call = _CALL.match(template, token.end())
                if call is not None:
                    with contextlib.suppress(ValueError, SyntaxError):
                        formats.add(ast.literal_eval(call.group(1)))
                continue
            pieces.append(token.group())
    pieces.append(template[position:])
    if not changed:
        return template, None
    text = "".join(pieces)
    # The definition prints nothing, and takes no line: a newline the template starts with
    # would be trimmed after its tag (trim_blocks), so one more goes first.
    return _DEFINITION + ("\n" if text.startswith(("\n", "\r\n")) else "") + text, frozenset(
        form for form in formats if isinstance(form, str)
    )


# -- the profile ------------------------------------------------------------------------------


def prepare(messages: list[dict[str, Any]], merged: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and template variables rendered for llama-server: the request's own
    (what its ``common_chat_msg`` round trip changes is not modelled; see above)."""
    return list(messages), merged


def as_template_sees(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the template sees it here: as sent (a null content is the engine's to
    make "")."""
    return copy_request(message)


PROFILE = EngineProfile(
    name="llamacpp",
    product="llama.cpp",
    version=BUILD,
    cache_model="llamacpp",
    renderer=f"llama.cpp {BUILD}'s own template engine (common/jinja, WebAssembly from {PACKAGE} {PACKAGE_VERSION})",
    tokenization="the rendered text",
    template_message=as_template_sees,
)
