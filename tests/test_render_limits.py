"""The render time limit: each render has its own timer, inside a render_session or not, and
the caller's SIGALRM handler is back afterwards; a template cannot change the caller's
request."""

from __future__ import annotations

import signal
import threading
from datetime import datetime

import pytest
from helpers import PROJECT

from tmpl_lint.render import RenderError, RenderLimitExceeded, RenderLimits, render, render_session

SLOW = (PROJECT / "tests" / "hostile" / "nested_loops.jinja").read_text()
USER = [{"role": "user", "content": "hi"}]
DISARMED = (0.0, 0.0)


class TimerReadingClock:
    """A clock that notes, each time a render reads it, how long the render's timer has left."""

    def __init__(self):
        self.left: list[float] = []

    def __call__(self) -> datetime:
        self.left.append(signal.getitimer(signal.ITIMER_REAL)[0])
        return datetime(2026, 1, 1)


def callers_handler(signum, frame):
    raise AssertionError("the caller's handler ran")


@pytest.fixture
def caller_handler():
    previous = signal.signal(signal.SIGALRM, callers_handler)
    yield callers_handler
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_a_render_arms_its_timer_and_puts_the_callers_handler_back(caller_handler):
    clock = TimerReadingClock()
    assert render("{{ strftime_now('%Y') }}", USER, clock=clock, limits=RenderLimits(seconds=5)) == "2026"
    (left,) = clock.left
    assert 4 < left <= 5
    assert signal.getsignal(signal.SIGALRM) is caller_handler
    assert signal.getitimer(signal.ITIMER_REAL) == DISARMED
    with pytest.raises(RenderError, match="refused"):
        render("{{ raise_exception('refused') }}", USER, clock=clock)
    with pytest.raises(RenderLimitExceeded, match=r"^rendering took over 0.2 s$"):
        render(SLOW, USER, clock=clock, limits=RenderLimits(seconds=0.2))
    assert signal.getsignal(signal.SIGALRM) is caller_handler
    assert signal.getitimer(signal.ITIMER_REAL) == DISARMED


def test_in_a_session_each_render_has_its_own_limit_from_its_own_start(caller_handler):
    clock = TimerReadingClock()
    with render_session():
        for seconds in (5, 3, 5):
            render("{{ strftime_now('%Y') }}", USER, clock=clock, limits=RenderLimits(seconds=seconds))
            assert signal.getitimer(signal.ITIMER_REAL) == DISARMED  # between renders, no timer runs
        with pytest.raises(RenderLimitExceeded, match=r"^rendering took over 0.2 s$"):
            render(SLOW, USER, clock=clock, limits=RenderLimits(seconds=0.2))
        # the render after one stopped by its limit has its whole limit again
        render("{{ strftime_now('%Y') }}", USER, clock=clock, limits=RenderLimits(seconds=4))
    first, second, third, after_stop = clock.left
    assert 4 < first <= 5 and 2 < second <= 3 and 4 < third <= 5 and 3 < after_stop <= 4
    assert signal.getsignal(signal.SIGALRM) is caller_handler
    assert signal.getitimer(signal.ITIMER_REAL) == DISARMED


def test_a_session_puts_the_callers_handler_back_after_an_error(caller_handler):
    with pytest.raises(RenderError), render_session():
        with render_session():  # nested: the outer one keeps the handler
            render("{{ raise_exception('no') }}", USER, clock=TimerReadingClock())
        render("{{ raise_exception('no') }}", USER, clock=TimerReadingClock())
    assert signal.getsignal(signal.SIGALRM) is caller_handler


def test_outside_the_main_thread_a_render_arms_no_timer(caller_handler):
    clock, outcome = TimerReadingClock(), []

    def in_thread():
        with render_session():
            outcome.append(render("{{ strftime_now('%Y') }}", USER, clock=clock))

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert outcome == ["2026"] and clock.left == [0.0]
    assert signal.getsignal(signal.SIGALRM) is caller_handler


class Tally:
    """Request data that is not JSON, with a method that changes it."""

    def __init__(self):
        self.count = 0

    def bump(self) -> int:
        self.count += 1
        return self.count


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.append(messages[0]) }}",
        "{{ messages[0].update({'content': 'changed'}) }}",
        "{{ messages[0].pop('content') }}",
        "{{ messages[0].setdefault('name', 'x') }}",
        "{{ tools[0].clear() }}",
        "{{ documents.reverse() }}",
        "{{ messages[0]['parts'].sort() }}",
        "{% set m = messages[0] %}{% set m.content = 'changed' %}",
    ],
)
def test_a_template_cannot_change_the_callers_request_data(source):
    messages = [{"role": "user", "content": "hi", "parts": [3, 1, 2]}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    documents = [{"title": "a"}, {"title": "b"}]
    before = repr((messages, tools, documents))
    with pytest.raises(RenderError, match=r"is unsafe\.$|^cannot assign attribute on non-namespace object$"):
        render(source, messages, tools=tools, documents=documents, clock=TimerReadingClock())
    assert repr((messages, tools, documents)) == before


def test_a_template_calls_methods_of_other_request_data_on_a_copy():
    tally = Tally()
    messages = [{"role": "user", "content": "hi", "tally": tally}]
    assert render("{{ messages[0].tally.bump() }}{{ messages[0].tally.bump() }}", messages, clock=TimerReadingClock()) == "12"
    assert tally.count == 0


# -- sizes asked of a filter or a str method are checked before the string is made -----------

# (template, what the refusal says it asked for), each a string or list far over the 1 MB
# render limit; rendered in a child under 1 GiB of address space, where making any of them
# would run out of memory instead.
OVERSIZED = [
    ("{{ 'a'|center(3000000000) }}", "center asks for 3000000000 characters"),
    ("{{ 'a'.center(3000000000) }}", "str.center asks for 3000000000 characters"),
    ("{{ 'a'.ljust(3000000000) }}", "str.ljust asks for 3000000000 characters"),
    ("{{ 'a'.rjust(3000000000, '-') }}", "str.rjust asks for 3000000000 characters"),
    ("{{ '1'.zfill(3000000000) }}", "str.zfill asks for 3000000000 characters"),
    ("{{ '%3000000000s'|format('a') }}", "a %-format has a width or precision of 3000000000"),
    ("{{ '%.3000000000f'|format(1.5) }}", "a %-format has a width or precision of 3000000000"),
    ("{{ '%3000000000s' % 'a' }}", "a %-format has a width or precision of 3000000000"),
    ("{{ '%*s' % (3000000000, 'a') }}", "a %-format has a width or precision of 3000000000"),
    ("{{ '%(x)3000000000s' % {'x': 'a'} }}", "a %-format has a width or precision of 3000000000"),
    ("{{ '{:>3000000000}'.format('a') }}", "str.format has a width or precision of 3000000000"),
    ("{{ '{:>{w}}'.format('a', w=3000000000) }}", "str.format has a width or precision of 3000000000"),
    ("{{ '{x:>{w}}'.format_map({'x': 'a', 'w': 3000000000}) }}", "str.format has a width or precision of 3000000000"),
    ("{{ 'a'|indent(3000000000, true) }}", "indent asks for 3000000001 characters"),
    ("{{ ('a\n' * 500000)|indent(4000) }}", "indent asks for 2001004000 characters"),
    ("{{ ('x' * 1000000).replace('', 'y' * 1000) }}", "str.replace asks for 1001001000 characters"),
    ("{{ ('x' * 1000000)|replace('x', 'y' * 1000) }}", "replace asks for 1000000000 characters"),
    ("{{ range(100000)|join('x' * 1000000) }}", "join asks for 99999000000 characters"),
    ("{{ ('x' * 1000000).join(['ab'] * 100000) }}", "str.join asks for 99999200000 characters"),
    ("{{ [1]|batch(3000000000, 'x')|list }}", "batch asks for 3000000000 items"),
    ("{{ [1]|slice(300000000)|list }}", "slice asks for 300000000 items"),
    ("{{ ('\t' * 1000).expandtabs(3000000) }}", "str.expandtabs asks for 3000001000 characters"),
    ("{{ lipsum(3000000000) }}", "lipsum asks for 4800000000000 characters"),
    # counted level by level, and said as soon as it is over: the outer list's item is a
    # separator, a line break and an indent, and its closing bracket a line break
    ("{{ [[[[1]]]]|tojson(indent=300000000) }}", "tojson's layout asks for at least 300000003 characters"),
    ("{{ range(1000)|list|tojson(separators=(',' * 1000000, ':')) }}", "tojson's layout asks for at least 1000000000 characters"),
    ("{{ ('a ' * 100000)|wordwrap(1, wrapstring='x' * 1000) }}", "wordwrap asks for 200201000 characters"),
]

CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from datetime import datetime
from tmpl_lint.render import FrozenClock, RenderError, render
said = []
for text in json.loads(sys.stdin.read()):
    try:
        said.append(["rendered", len(render(text, [], clock=FrozenClock(datetime(2026, 1, 1))))])
    except RenderError as error:
        said.append([type(error).__name__, str(error)])
print(json.dumps(said))
"""


def test_a_size_a_filter_or_method_is_asked_for_is_refused_before_it_is_made():
    import json
    import os
    import subprocess
    import sys

    environment = {**os.environ, "TMPL_LINT_NO_CACHE": "1"}
    texts = [text for text, _ in OVERSIZED]
    done = subprocess.run(
        [sys.executable, "-c", CHILD], input=json.dumps(texts), capture_output=True, text=True, timeout=120, env=environment
    )
    assert done.stderr == ""
    said = json.loads(done.stdout)
    assert said == [["RenderLimitExceeded", f"{asked}, over the 1000000 limit"] for _, asked in OVERSIZED]


@pytest.mark.parametrize(
    ("text", "rendered"),
    [
        ("{{ 'a'|center(5) }}|{{ 'a'.ljust(3) }}|{{ '7'.zfill(3) }}", "  a  |a  |007"),
        ("{{ '%5s|%-3d|%.2f|%*d' % ('a', 7, 1.5, 3, 4) }}|{{ '%s!'|format('x') }}", "    a|7  |1.50|  4|x!"),
        ("{{ '{:>5}|{:.{}f}'.format('a', 1.25, 1) }}", "    a|1.2"),
        ("{{ 'a\nb'|indent(2, true) }}|{{ [1, 2]|join(d=', ') }}|{{ 'aXa'|replace('X', '--') }}", "  a\n  b|1, 2|a--a"),
        ("{{ [1, 2, 3]|batch(2, 0)|list }}|{{ [1, 2, 3]|slice(2)|list }}", "[[1, 2], [3, 0]]|[[1, 2], [3]]"),
        ("{{ {'a': [1]}|tojson(indent=2) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}", '{\n  "a": [\n    1\n  ]\n}|[1,2]'),
        (
            "{{ 'a b c'|wordwrap(1, wrapstring='<br>') }}|{{ 'a\tb'.expandtabs(4) }}|{{ '-'.join(['a', 'b']) }}",
            "a<br>b<br>c|a   b|a-b",
        ),
    ],
)
def test_sizes_within_the_limit_render_as_jinja_renders_them(text, rendered):
    assert render(text, USER, clock=lambda: datetime(2026, 1, 1)) == rendered
