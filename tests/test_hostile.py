"""Hostile templates (written for these tests in tests/hostile/): every one is reported,
none hangs, none escapes the sandbox."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from helpers import PROJECT

from tmpl_lint.inputs import TemplateSource
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
        render((HOSTILE / f"{name}.jinja").read_text(), USER, clock=CLOCK, limits=RenderLimits(seconds=0.3, max_bytes=100_000))
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


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages[0].role }}|{{ messages[0].missing is defined }}|{{ messages[0].items() | list }}",
        "{{ messages[0].update }}",
        "{{ messages[0].update({'role': 'x'}) }}",
        "{{ messages[0].__class__ }}",
        "{{ messages[0].content.startswith('h') }}|{{ messages[0].content.upper() }}",
        "{{ messages[0].content.format('{}', 1) }}",
        "{{ '{0.__class__}'.format(messages) }}",
        "{{ messages[0].content.__class__ }}",
        "{% set ns = namespace(a=1, b='x', f='{0.__class__}'.format) %}{{ ns.a }}{{ ns.b }}{{ ns.f(1) }}",
        "{% set ns = namespace(a=1) %}{{ ns._Namespace__attrs }}",
        "{% for m in messages %}{{ loop.index0 }}{{ loop.last }}{{ loop.revindex }}{{ loop.length }}{% endfor %}",
        "{% for m in messages %}{{ loop.__class__ }}{% endfor %}",
        "{% for m in messages %}{{ loop.changed(m) }}{{ loop.cycle('a', 'b') }}{% endfor %}",
    ],
)
def test_fast_attribute_paths_give_what_jinja2s_own_sandbox_gives(source):
    """The sandbox's shortcuts for dict keys, str methods, namespace values and loop numbers
    answer exactly as jinja2's immutable sandbox does, refusals included."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from tmpl_lint.jinja_env import make_environment

    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    outcomes = []
    for environment in (make_environment(), ImmutableSandboxedEnvironment()):
        environment.globals.setdefault("namespace", __import__("jinja2").utils.Namespace)
        try:
            outcomes.append(environment.from_string(source).render(messages=messages))
        except Exception as error:  # noqa: BLE001 - the kind of refusal is what is compared
            outcomes.append(type(error).__name__)
    assert outcomes[0] == outcomes[1]


# -- one limit policy: nothing of a template runs outside the limits, in any command -------

# Without the compiled-code cache: the template is compiled in the command, under its limits,
# not loaded as code another test compiled.
COMPILING = {**os.environ, "TMPL_LINT_NO_CACHE": "1"}
FOLDED = "{{ strftime_now('%Y') }}{{ 'a'|center(3000000000) }}{% for m in messages %}{{ m.content }}{% endfor %}"
# Checked against the render's size limit before the string is made (the limit on what a
# render prints acted after: the render ran out of memory, or grew to 2.8 GB without a cap).
REFUSED = "center asks for 3000000000 characters, over the 1000000 limit"
OUT_OF_MEMORY = f'PC101 [render-limit-exceeded] render limit exceeded in "chat": {REFUSED}'


def test_constant_expressions_are_not_evaluated_while_compiling():
    # Jinja folds constants at compile time: `'a'|center(3000000000)` allocated 3 GB there,
    # before any render limit. Compiled under 1 GiB of address space, it must not run.
    script = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
        "from datetime import datetime; from tmpl_lint.render import FrozenClock, compile_template;"
        f"compile_template({FOLDED!r}, FrozenClock(datetime(2026, 1, 1))); print('compiled')"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=COMPILING)
    assert (result.returncode, result.stdout, result.stderr) == (0, "compiled\n", "")


# The command runs under a launcher, a fresh interpreter that caps the address space and
# waits for it: a process forked from this test's own (a pytest worker that may hold
# hundreds of MB of tokenizers) would carry that size in its peak, which survives exec.
# The main process gets 1.5 GiB of address space (its children inherit no more): if any
# command evaluated the 3 GB constant there, it would fail with MemoryError.
LAUNCHER = """
import os, resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))
process = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(process.pid, 0)
with open(sys.argv[1], "w") as peak:
    peak.write(str(usage.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(command: list[str], folder: Path, env) -> tuple[subprocess.CompletedProcess, int]:
    """``command``'s result and the peak resident size, in bytes, of its largest process
    (itself or a child it waited for: wait4's accounting)."""
    peak = folder / "peak"
    with open(folder / "stdout", "w+b") as stdout, open(folder / "stderr", "w+b") as stderr:
        launched = [sys.executable, "-c", LAUNCHER, str(peak), *command]
        process = subprocess.Popen(launched, stdout=stdout, stderr=stderr, env=env, start_new_session=True)
        try:
            process.wait(timeout=300)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        stdout.seek(0), stderr.seek(0)
        result = subprocess.CompletedProcess(command, process.returncode, stdout.read().decode(), stderr.read().decode())
    return result, int(peak.read_text())


@pytest.mark.parametrize("command", ["check", "check --no-prove", "--fix", "--diff", "replay", "diff", "audit"])
def test_every_command_runs_a_hostile_template_under_the_limits(tmp_path, command):
    model = tmp_path / "model"
    model.mkdir()
    template = model / "chat_template.jinja"
    template.write_text(FOLDED)
    first = {"messages": [{"role": "user", "content": "hi"}]}
    second = {"messages": [*first["messages"], {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}
    (tmp_path / "turn1.json").write_text(json.dumps(first))
    (tmp_path / "turn2.json").write_text(json.dumps(second))
    (tmp_path / "log.jsonl").write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    arguments = {
        "check": [template, "--output-format", "full"],
        "check --no-prove": [template, "--no-prove"],
        "--fix": [template, "--output-format", "full", "--fix", "--unsafe-fixes", "--frozen-date", "2026-01-15"],
        "--diff": [template, "--output-format", "full", "--diff", "--unsafe-fixes", "--frozen-date", "2026-01-15"],
        "replay": ["replay", tmp_path / "log.jsonl", "--template", template],
        "diff": ["diff", tmp_path / "turn1.json", tmp_path / "turn2.json", "--template", template],
        "audit": ["audit", model, "--no-cache", "--format", "jsonl"],
    }[command]
    start = time.monotonic()
    result, peak = run_measured([sys.executable, "-m", "tmpl_lint", *map(str, arguments)], tmp_path, COMPILING)
    assert time.monotonic() - start < 60
    assert peak < 400 << 20  # every process of the command, at its largest
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    if command == "replay":
        assert result.returncode == 2
        assert result.stderr == "".join(
            f"tmpl-lint: error: {tmp_path / 'log.jsonl'}:{line}: the template fails on this request: {REFUSED}\n"
            for line in (1, 2)
        )
    elif command == "diff":
        assert result.returncode == 2
        assert result.stderr == (f"tmpl-lint: error: {tmp_path / 'turn1.json'}: the template fails on this request: {REFUSED}\n")
    elif command == "audit":
        assert result.returncode == 1
        assert [finding["code"] for finding in json.loads(result.stdout)["findings"]] == ["PC101", "PC001"]
    elif command == "check --no-prove":
        assert result.returncode == 1  # nothing renders without proofs: the live clock alone
        assert "PC001 [live-clock]" in result.stdout and "PC101" not in result.stdout
    else:
        assert result.returncode == 1
        # --diff: standard output is the patch, the report goes to standard error
        report = result.stderr if command == "--diff" else result.stdout
        assert f"{template}:1:1: {OUT_OF_MEMORY}" in report


def test_the_static_lint_is_under_the_wall_clock_limit_too(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from tmpl_lint import checker, isolation
    from tmpl_lint.cli import main

    def hangs(*args):
        time.sleep(600)

    # The lint never ends: any limit stops it, once for the batch and once for the template
    # alone (checker.lint_many_isolated), each a quarter of a second here.
    monkeypatch.setattr(isolation, "WALL_SECONDS", 0.25)
    monkeypatch.setattr(checker, "lint_source", hangs)  # the parse and analysis, in the child
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}")
    start = time.monotonic()
    result = CliRunner().invoke(main, [str(path), "--no-prove", "-q"])
    assert time.monotonic() - start < 10
    assert result.stdout == f"{path}:1:1: PC101 [render-limit-exceeded] linting this template stopped: took over 0.25 s\n"
    assert result.exit_code == 1


@pytest.mark.parametrize(
    ("count", "jobs", "sizes"),
    [
        (67, 2, [5, 6, 5, 6, 5, 6, 6, 5, 6, 5, 6, 6]),  # twelve of about STATIC_BATCH, taken in turn
        (1, 2, [1]),
        (7, 2, [7]),  # too few to be worth a second call
        (8, 2, [4, 4]),
        (8, 4, [4, 4]),  # four processes, but not calls of two templates
        (9, 1, [4, 5]),  # one process takes its calls in turn: no call of every template
        (0, 2, []),
    ],
)
def test_static_batches_cover_every_template_once_longest_first(count, jobs, sizes):
    from tmpl_lint.checker import static_batches

    # Lengths in no order, some of them equal: the batches take the longest first, ties in
    # the given order.
    lengths = [(index * 37) % 11 for index in range(count)]
    sources = [TemplateSource(Path(f"t{index}.jinja"), None, "x" * length, "jinja") for index, length in enumerate(lengths)]
    batches = static_batches(sources, jobs)
    assert [len(batch) for batch in batches] == sizes
    order = [index for batch in batches for index in batch]
    assert sorted(order) == list(range(count))
    assert order == sorted(range(count), key=lambda index: -lengths[index])
