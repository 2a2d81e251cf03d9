"""Shared test helpers: paths to the bundled corpus and to ../shared (absent in a fresh clone)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest
from filelock import FileLock

from tmpl_lint.checker import ProveOptions, lint_source
from tmpl_lint.inputs import TemplateSource

PROJECT = Path(__file__).resolve().parents[1]
CORPUS = PROJECT / "corpus"
SHARED = PROJECT.parent / "shared"
SHARED_TEMPLATES = SHARED / "corpus" / "templates"
SHARED_TOKENIZERS = SHARED / "tokenizers"

needs_shared = pytest.mark.skipif(not SHARED_TEMPLATES.is_dir(), reason="../shared is not present (fresh clone)")


# Loading a real tokenizer takes up to a second and a half; tests only read them, so each
# process loads each one once.
@cache
def shared_tokenizer(name: str):
    """tmpl-lint's tokenizer of ../shared/tokenizers/NAME."""
    from tmpl_lint.tokenizer import load_tokenizer

    return load_tokenizer(SHARED_TOKENIZERS / name)


class CountingBackend:
    """A ``tokenizers`` backend that counts the characters it is asked to encode, one text at
    a time or in a batch (as ``PrefixEncoder``'s pieces ask)."""

    def __init__(self, backend):
        self.backend = backend
        self.characters = 0

    def encode(self, text, **kwargs):
        self.characters += len(text)
        return self.backend.encode(text, **kwargs)

    def encode_batch(self, texts, **kwargs):
        self.characters += sum(map(len, texts))
        return self.backend.encode_batch(texts, **kwargs)

    def encode_batch_fast(self, texts, **kwargs):
        self.characters += sum(map(len, texts))
        return self.backend.encode_batch_fast(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.backend, name)


@cache
def transformers_tokenizer(name: str):
    """transformers' tokenizer of ../shared/tokenizers/NAME: the independent computation."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(SHARED_TOKENIZERS / name))


def lint_text(text: str, name: str = "inline.jinja"):
    """Findings for a template given as text, as (code, line, column) tuples and the findings."""
    findings = lint_source(TemplateSource(Path(name), None, text, "jinja"))
    return [(f.code, f.line, f.column) for f in findings], findings


def lint_fixture(name: str):
    path = CORPUS / name
    return lint_text(path.read_text(encoding="utf-8"), str(path))


def prove_text(text: str, engine: str = "hf", name: str = "inline.jinja"):
    """Findings for a template given as text, each with its proof (characters, no tokenizer).
    ``hf`` renders the template as transformers does; ``vllm`` applies vLLM's preprocessing."""
    findings = lint_source(TemplateSource(Path(name), None, text, "jinja"), prove=ProveOptions(engine=engine))
    return [(f.code, f.line, f.column) for f in findings], findings


def prove_fixture(name: str, engine: str = "hf"):
    path = CORPUS / name
    return prove_text(path.read_text(encoding="utf-8"), engine, str(path))


def at(code: str, source: str, anchor: str, nth: int = 0) -> tuple[str, int, int]:
    """(code, line, column) of the nth occurrence of ``anchor`` in ``source``, counted by hand."""
    offset = -1
    for _ in range(nth + 1):
        offset = source.index(anchor, offset + 1)
    line = source.count("\n", 0, offset) + 1
    column = offset - (source.rfind("\n", 0, offset) + 1) + 1
    return (code, line, column)


def built_once(shared: Path, name: str, build: Callable[[Path], None]) -> Path:
    """``shared/name``, built by ``build`` in whichever worker asks first; a worker that asks
    meanwhile waits for it. A build that fails leaves no mark, and the next asker tries again."""
    target, built = shared / name, shared / f"{name}.built"
    with FileLock(shared / f"{name}.lock"):
        if not built.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            build(target)
            built.touch()
    return target


def wait_for_children(pid: int, count: int, within: float = 60) -> list[int]:
    """The pids of process ``pid``'s children, as soon as there are ``count`` of them (the
    workers tmpl-lint forks to render in), or those there are after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        listed = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
        children = [int(child) for child in listed.split()]
        if len(children) >= count or time.monotonic() > deadline:
            return children
        time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid`` has spent (user and system), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until_working(pids: list[int], seconds: float = 0.2, within: float = 60) -> None:
    """Until ``pids`` have spent ``seconds`` of CPU between them: past their start, at the work
    they were forked for (a render that runs on), however loaded the machine is."""
    deadline = time.monotonic() + within
    while sum(map(cpu_seconds, pids)) < seconds and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sum(map(cpu_seconds, pids)) >= seconds, [cpu_seconds(pid) for pid in pids]


@contextlib.contextmanager
def lock_held(path: Path) -> Iterator[Callable[[], None]]:
    """Holds tmpl-lint's lock of ``path`` (writes.locked) and yields a function that returns
    once another process has opened the lock's file (Linux's inotify), which it does to take
    the lock: the process is then waiting for it. A minute without, and it fails."""
    from tmpl_lint import writes

    with writes.locked(path):
        folder = str(writes.lock_directory()) + os.sep
        opened = set()
        for descriptor in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own, closed by now
                opened.add(os.readlink(f"/proc/self/fd/{descriptor}"))
        (lock_file,) = {name for name in opened if name.startswith(folder)}  # the one this process holds
        libc = ctypes.CDLL(None, use_errno=True)
        watch = libc.inotify_init1(os.O_CLOEXEC)
        assert watch >= 0, os.strerror(ctypes.get_errno())
        try:
            assert libc.inotify_add_watch(watch, os.fsencode(lock_file), _IN_OPEN) >= 0, os.strerror(ctypes.get_errno())

            def asked() -> None:
                assert select.select([watch], [], [], 60)[0], f"no process opened {lock_file} within a minute"

            yield asked
        finally:
            os.close(watch)


_IN_OPEN = 0x20


# Root reads any file whatever its mode: a test of an unreadable file runs tmpl-lint as root
# without the capabilities that override permissions (setpriv), or as the user it is.
UNPRIVILEGED = (
    ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--inh-caps=-all"] if os.geteuid() == 0 else []
)
needs_permissions = pytest.mark.skipif(
    os.geteuid() == 0 and not shutil.which("setpriv"), reason="root reads any file, and setpriv is not here to drop that"
)


def run_unprivileged(*args: str, **options) -> subprocess.CompletedProcess:
    """``tmpl-lint ARGS`` in a process that file permissions apply to."""
    command = [*UNPRIVILEGED, sys.executable, "-m", "tmpl_lint", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"}, **options)


def log_verifiers(monkeypatch, log: Path, name: Callable = lambda source: source.path.name) -> Path:
    """Write a line to ``log`` for each fix Verifier made, naming its template by
    ``name(source)``: the fixes run in forked workers, so they are counted in a file."""
    from tmpl_lint.fix.verify import Verifier

    real_init = Verifier.__init__

    def logged(self, source, *args, **kwargs):
        with log.open("a") as stream:
            stream.write(f"{name(source)}\n")
        real_init(self, source, *args, **kwargs)

    monkeypatch.setattr(Verifier, "__init__", logged)
    return log


def qwen3_and_its_fix(folder: Path) -> tuple[Path, Path]:
    """Qwen3's template and a copy `tmpl-lint --fix` changed (the replays compare the two)."""
    from click.testing import CliRunner

    from tmpl_lint.cli import main

    original, fixed = folder / "qwen3.jinja", folder / "fixed.jinja"
    shutil.copyfile(SHARED_TEMPLATES / "Qwen--Qwen3-0.6B.jinja", original)
    shutil.copyfile(original, fixed)
    assert CliRunner().invoke(main, [str(fixed), "--fix", "--unsafe-fixes", "--no-prove", "-q"]).exit_code in (0, 1)
    assert fixed.read_text() != original.read_text()
    return original, fixed


def signal_after(put: str) -> str:
    """A tmpl-lint run for ``python -c`` whose ``os.<put>`` (replace, link) raises the signal
    numbered by argv[1] right after it puts the file named by argv[2] in place: a signal
    held while the file is put in place, which takes effect once it is."""
    return f"""
import os, signal, sys
number, target, put = int(sys.argv.pop(1)), sys.argv.pop(1), os.{put}
def put_then_signal(source, destination, *args, **kwargs):
    put(source, destination, *args, **kwargs)
    if os.fspath(destination) == target:
        signal.raise_signal(number)
os.{put} = put_then_signal
from tmpl_lint.__main__ import run
sys.argv[0] = "tmpl-lint"
run()
"""


def without_edits(text: str) -> str:
    """A --fix run's output without the template lines each fix shows it edited ("    5 - old",
    "    5 + new"), for tests of what it says; tests/test_fix_safety.py checks those lines."""
    return "".join(line for line in text.splitlines(keepends=True) if not re.match(r" *\d+ [-+] ", line))


def chromium_dom(page: Path, profile: Path) -> str:
    """The DOM headless Chromium builds from ``page``: a report's page read as a browser
    reads it. Skips where no Chromium is installed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.skip("no chromium on this machine")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
    command = [chromium, *flags, "--no-first-run", f"--user-data-dir={profile}", "--dump-dom", page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout


def two_requests_sharing_37_characters(tmp_path: Path) -> tuple[Path, Path]:
    """A template that prints each message's text, and a log of one session's two requests
    whose one message shares its first 37 characters (then 20 A's, then 20 B's); no
    replies logged. Replay's figures on it are counted by hand in the tests that use it."""
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(
            json.dumps({"user": "s", "messages": [{"role": "user", "content": "y" * 37 + tail * 20}]}) + "\n" for tail in "AB"
        )
    )
    return template, log
