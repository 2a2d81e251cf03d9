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
