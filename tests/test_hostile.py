"""Hostile templates (written for these tests in tests/hostile/): every one is reported,
none hangs, none escapes the sandbox."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime

import pytest
from helpers import PROJECT

from tmpl_lint.render import FrozenClock, RenderError, RenderLimitExceeded, RenderLimits, render

HOSTILE = PROJECT / "tests" / "hostile"
ESCAPES = sorted(HOSTILE.glob("escape_*.jinja"))
LIMITED = ["nested_loops", "exponential_growth", "huge_output", "runaway_recursion", "giant_repetition"]
CLOCK = FrozenClock(datetime(2026, 1, 1))
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path", ESCAPES, ids=lambda path: path.stem)
def test_sandbox_escapes_are_blocked(path):
    try:
        output = render(path.read_text(), USER, clock=CLOCK)
    except RenderError as error:
        assert (
            "unsafe" in str(error) or "underscore" in str(error) or "has no attribute" in str(error) or "undefined" in str(error)
        )
        return
    # rendered: then nothing of the interpreter leaked
    for leak in ("<class", "<module", "<function", "built-in", "uid=", "__builtins__", "os.popen"):
        assert leak not in output


@pytest.mark.parametrize("name", LIMITED)
def test_limits_stop_hostile_renders_within_seconds(name):
    start = time.monotonic()
    with pytest.raises(RenderError) as caught:
        render((HOSTILE / f"{name}.jinja").read_text(), USER, clock=CLOCK, limits=RenderLimits(seconds=1.0, max_bytes=100_000))
    assert time.monotonic() - start < 5
    assert isinstance(caught.value, RenderLimitExceeded)


def test_deeply_nested_template_is_reported_not_crashed(tmp_path):
    path = tmp_path / "deep.jinja"
    path.write_text("{% if x %}" * 3000 + "a" + "{% endif %}" * 3000)
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", str(path), "--format", "json"], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in result.stderr
    assert {f["code"] for f in json.loads(result.stdout)} <= {"PC000", "PC101"}
    assert result.returncode == 1


def test_the_whole_hostile_corpus_is_reported_and_nothing_hangs():
    start = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tmpl_lint",
            str(HOSTILE),
            "--format",
            "json",
            "--render-timeout",
            "1",
            "--render-max-bytes",
            "100000",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    elapsed = time.monotonic() - start
    assert "Traceback" not in result.stderr
    assert result.returncode == 2  # the malformed files are input errors
    errors = result.stderr.splitlines()
    assert any("truncated/tokenizer_config.json: invalid JSON" in line for line in errors)
    assert any("binary.jinja: binary file" in line for line in errors)
    by_file = {}
    for finding in json.loads(result.stdout):
        by_file.setdefault(finding["path"].rsplit("/", 1)[-1], set()).add(finding["code"])
    for name in LIMITED:
        assert "PC101" in by_file[f"{name}.jinja"], name
    for path in ESCAPES:
        assert "PC102" in by_file[path.name], path.name
    print(f"hostile corpus: {len(list(HOSTILE.iterdir()))} files in {elapsed:.1f} s")


def test_remembered_attribute_verdicts_refuse_every_time():
    # The sandbox remembers verdicts by (type, attribute): a refusal must hold on every
    # render, and a permitted attribute of another type must not inherit it.
    clock = FrozenClock(datetime(2026, 3, 1))
    mutate = "{% set items = [] %}{{ items.append(1) }}"
    for _ in range(2):
        with pytest.raises(RenderError, match="unsafe|not safely callable|access"):
            render(mutate, [], clock=clock)
    assert render("{{ 'a,b'.split(',') | join('+') }}", [], clock=clock) == "a+b"
    assert render("{{ {'append': 1}.append }}", [], clock=clock) == "1"  # a key, not list.append
