"""The compiled-code cache of render.py: a template's code is compiled once and kept on disk
for the runs that meet the same text again, and a cache that is off, unusable or damaged
costs a compile, never a wrong render or an error."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest
from click.testing import CliRunner

from tmpl_lint import render
from tmpl_lint.cli import main

CORPUS = Path(__file__).resolve().parents[1] / "corpus"

TEXT = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
RENDERED = "[user] hi\n[assistant] hello\n"

# One process compiles TEXT and renders it; COMPILES says whether jinja2 compiled it there.
SCRIPT = f"""
import jinja2
from tmpl_lint.render import compile_template
compiled = []
compile = jinja2.Environment.compile
jinja2.Environment.compile = lambda *args, **kwargs: compiled.append(1) or compile(*args, **kwargs)
print(repr(compile_template({TEXT!r}).render(messages={MESSAGES!r})), len(compiled))
"""


def run_process(environment: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environment, timeout=60)
    assert done.stderr == ""
    return done.stdout


def without_cache_settings() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ("TMPL_LINT_CACHE_DIR", "TMPL_LINT_NO_CACHE")}


def test_a_second_process_loads_the_code_the_first_compiled(tmp_path):
    environment = {**without_cache_settings(), "TMPL_LINT_CACHE_DIR": str(tmp_path / "cache")}
    assert run_process(environment) == f"{RENDERED!r} 1\n"
    assert len(list((tmp_path / "cache" / "code").glob("*.code"))) == 1
    assert run_process(environment) == f"{RENDERED!r} 0\n"


def test_processes_compiling_the_same_text_at_once_leave_one_whole_file(tmp_path):
    # pre-commit and --jobs start several at once: each writes whole or not at all (jinja2
    # writes a temporary file and renames it), so a reader never meets half a file.
    environment = {**without_cache_settings(), "TMPL_LINT_CACHE_DIR": str(tmp_path / "cache")}
    started = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
        )
        for _ in range(6)
    ]
    outputs = [process.communicate(timeout=60) for process in started]
    assert all(stderr == "" and stdout.startswith(f"{RENDERED!r} ") for stdout, stderr in outputs)
    assert [path.name.endswith(".code") for path in (tmp_path / "cache" / "code").iterdir()] == [True]
    assert run_process(environment) == f"{RENDERED!r} 0\n"


def test_turned_off_it_compiles_every_time_and_writes_nothing(tmp_path):
    environment = {**without_cache_settings(), "TMPL_LINT_CACHE_DIR": str(tmp_path / "cache"), "TMPL_LINT_NO_CACHE": "1"}
    assert run_process(environment) == f"{RENDERED!r} 1\n"
    assert run_process(environment) == f"{RENDERED!r} 1\n"
    assert not (tmp_path / "cache").exists()


@pytest.fixture
def compiles(tmp_path, monkeypatch) -> Iterator[list[str]]:
    """This process with a fresh cache in tmp_path/cache; the texts jinja2 compiles."""
    monkeypatch.setenv("TMPL_LINT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TMPL_LINT_NO_CACHE", raising=False)
    render._code_cache.cache_clear()
    monkeypatch.setattr(render, "_COMPILED", {})
    compiled: list[str] = []
    compile = jinja2.Environment.compile

    def counting(self, source, *args, **kwargs):
        compiled.append(source)
        return compile(self, source, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    yield compiled
    render._code_cache.cache_clear()  # the next test's process looks for its cache again


def forget_this_process(monkeypatch) -> None:
    """As a new process starts: nothing compiled in memory, the cache looked for again."""
    render._code_cache.cache_clear()
    monkeypatch.setattr(render, "_COMPILED", {})


def test_a_changed_text_is_compiled_again(compiles, monkeypatch):
    render.compile_template(TEXT)
    forget_this_process(monkeypatch)
    changed = TEXT.replace("] ", "]: ")
    assert render.compile_template(changed).render(messages=MESSAGES) == RENDERED.replace("] ", "]: ")
    assert compiles == [TEXT, changed]


def test_a_damaged_file_is_compiled_again_and_replaced(compiles, monkeypatch, tmp_path):
    render.compile_template(TEXT)
    (cached,) = (tmp_path / "cache" / "code").glob("*.code")
    whole = cached.read_bytes()
    for damaged in (b"", b"not a cache file", whole[: len(whole) // 2]):
        cached.write_bytes(damaged)
        forget_this_process(monkeypatch)
        assert render.compile_template(TEXT).render(messages=MESSAGES) == RENDERED
        assert cached.read_bytes() == whole
    assert compiles == [TEXT] * 4


def test_a_directory_it_cannot_make_means_no_cache_and_no_error(compiles, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TMPL_LINT_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    assert render.compile_template(TEXT).render(messages=MESSAGES) == RENDERED
    forget_this_process(monkeypatch)
    assert render.compile_template(TEXT).render(messages=MESSAGES) == RENDERED
    assert compiles == [TEXT, TEXT]


def test_the_key_changes_with_the_code_that_compiles(tmp_path, monkeypatch):
    """Code compiled by another code generator (a jinja_env.py or render.py changed in
    development, another jinja2) is never served."""
    key = render._code_key()
    for module in (render, render.jinja_env):
        changed = tmp_path / Path(module.__file__).name
        changed.write_bytes(Path(module.__file__).read_bytes() + b"\n")
        with monkeypatch.context() as patch:
            patch.setattr(module, "__file__", str(changed))
            assert render._code_key() != key
    with monkeypatch.context() as patch:
        patch.setattr(jinja2, "__version__", jinja2.__version__ + ".post1")
        assert render._code_key() != key
    assert render._code_key() == key


def test_a_text_with_a_lone_surrogate_is_cached_too(compiles, monkeypatch, tmp_path):
    # A file that is not valid UTF-8 is read with surrogateescape and linted as read.
    text = TEXT + "\udc80"
    assert render.compile_template(text).render(messages=MESSAGES) == RENDERED + "\udc80"
    forget_this_process(monkeypatch)
    assert render.compile_template(text).render(messages=MESSAGES) == RENDERED + "\udc80"
    assert compiles == [text]
    assert len(list((tmp_path / "cache" / "code").glob("*.code"))) == 1


def cached_files(cache: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((cache / "code").glob("*"))}


def test_no_cache_neither_reads_nor_writes_and_lasts_one_run(compiles, tmp_path):
    # A proven check renders (and so compiles) the template; a damaged file is replaced
    # when read, so one left as it was was neither read nor written.
    template = CORPUS / "PC002_history_rewrite.jinja"
    cache = tmp_path / "cache"
    assert CliRunner().invoke(main, [str(template), "--no-cache"]).exit_code == 1
    assert cached_files(cache) == {}
    assert CliRunner().invoke(main, [str(template)]).exit_code == 1
    written = cached_files(cache)
    assert len(written) == 1
    for name in written:
        (cache / "code" / name).write_bytes(b"damaged")
    assert CliRunner().invoke(main, [str(template), "--no-cache"]).exit_code == 1
    assert cached_files(cache) == dict.fromkeys(written, b"damaged")
    assert CliRunner().invoke(main, [str(template)]).exit_code == 1  # the next run uses the cache again
    assert cached_files(cache) == written


def test_audit_no_cache_keeps_nothing(compiles, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_text((CORPUS / "PC002_history_rewrite.jinja").read_text())
    assert CliRunner().invoke(main, ["audit", str(model), "--no-cache"]).exit_code == 1
    assert not (tmp_path / "cache").exists()
    assert CliRunner().invoke(main, ["audit", str(model)]).exit_code == 1
    assert len(cached_files(tmp_path / "cache")) == 1
    assert (tmp_path / "cache" / "audit.jsonl").is_file()


# -- the cache is untrusted input: code read back runs only when it is authenticated ---------


class Planted:
    """What an attacker's pickle runs when it is loaded: it writes ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def tmpl_lint(*args: str, environment: dict[str, str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "tmpl_lint", *args]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)


def test_code_planted_in_the_cache_never_runs(tmp_path):
    # jinja2's file cache read a file as a magic header and a pickle: any file at the name a
    # public install computes ran as code, outside the sandbox, in a plain check.
    import pickle

    import jinja2.bccache

    environment = {
        **without_cache_settings(),
        "TMPL_LINT_CACHE_DIR": str(tmp_path / "cache"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    template = str(CORPUS / "PC002_history_rewrite.jinja")
    first = tmpl_lint(template, environment=environment)
    assert first.returncode == 1
    entries = list((tmp_path / "cache" / "code").iterdir())
    assert entries
    marker = tmp_path / "ran"
    planted = jinja2.bccache.bc_magic + pickle.dumps(Planted(marker))
    for entry in entries:
        entry.write_bytes(planted)
    again = tmpl_lint(template, environment=environment)
    assert not marker.exists()
    assert (again.returncode, again.stdout, again.stderr) == (1, first.stdout, first.stderr)
    assert all(entry.read_bytes() != planted for entry in entries)  # a miss, compiled and kept again


def test_code_sealed_with_another_key_or_for_another_text_is_not_loaded(compiles, monkeypatch, tmp_path):
    import hashlib
    import hmac
    import marshal

    from tmpl_lint import sealed

    render.compile_template(TEXT)
    (entry,) = (tmp_path / "cache" / "code").glob("*.code")
    evil = render.make_environment().compile("EVIL")
    data = marshal.dumps(evil)
    purpose, name = render._CODE_PURPOSE, entry.name
    other_key = hmac.new(b"\1" * 32, purpose + b"\0" + name.encode() + b"\0" + data, hashlib.sha256).digest()
    for forged in (
        other_key + data,  # a key of the attacker's own
        sealed.seal(purpose, name.replace("-", "-0", 1), data),  # this user's seal, of another entry
        sealed.seal(b"another purpose", name, data),
        data,  # no seal at all
    ):
        entry.write_bytes(forged)
        forget_this_process(monkeypatch)
        assert render.compile_template(TEXT).render(messages=MESSAGES) == RENDERED
    assert compiles == [TEXT, "EVIL"] + [TEXT] * 4


def test_a_symbolic_link_in_the_cache_is_never_followed(compiles, monkeypatch, tmp_path):
    render.compile_template(TEXT)
    (entry,) = (tmp_path / "cache" / "code").glob("*.code")
    outside = tmp_path / "outside"
    outside.write_bytes(entry.read_bytes())  # even an entry this user sealed
    kept = outside.read_bytes()
    entry.unlink()
    entry.symlink_to(outside)
    forget_this_process(monkeypatch)
    assert render.compile_template(TEXT).render(messages=MESSAGES) == RENDERED
    assert compiles == [TEXT, TEXT]
    assert not entry.is_symlink() and entry.read_bytes() == kept  # replaced by a file, not written through
    assert outside.read_bytes() == kept


def test_a_cache_folder_others_may_write_or_a_link_is_not_used(compiles, monkeypatch, tmp_path):
    render.compile_template(TEXT)
    folder = tmp_path / "cache" / "code"
    (entry,) = folder.glob("*.code")
    folder.chmod(0o777)
    entry.unlink()
    forget_this_process(monkeypatch)
    render.compile_template(TEXT)
    assert list(folder.iterdir()) == []  # nothing written there either
    folder.chmod(0o700)
    render.compile_template(TEXT)  # (this process found no cache: compiles in memory)
    forget_this_process(monkeypatch)
    render.compile_template(TEXT)
    (entry,) = folder.glob("*.code")
    real = tmp_path / "elsewhere"
    folder.rename(real)
    folder.symlink_to(real)
    forget_this_process(monkeypatch)
    render.compile_template(TEXT)
    assert compiles == [TEXT, TEXT, TEXT, TEXT]


def test_the_key_is_private_and_kept_outside_the_cache(compiles, monkeypatch, tmp_path):
    from tmpl_lint import sealed

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    sealed.secret.cache_clear()
    try:
        render.compile_template(TEXT)
        key = tmp_path / "state" / "tmpl-lint" / "cache-key"
        assert (key.stat().st_mode & 0o777, key.parent.stat().st_mode & 0o777, key.stat().st_size) == (0o600, 0o700, 32)
        assert len(list((tmp_path / "cache" / "code").glob("*.code"))) == 1
        # A key another user could read is no key: the cache is not used.
        key.chmod(0o644)
        sealed.secret.cache_clear()
        forget_this_process(monkeypatch)
        render.compile_template(TEXT)
        # Nor is a key kept inside the cache, where whoever writes the cache could read it.
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "cache" / "state"))
        sealed.secret.cache_clear()
        forget_this_process(monkeypatch)
        render.compile_template(TEXT)
        assert not (tmp_path / "cache" / "state").exists()
        assert compiles == [TEXT, TEXT, TEXT]
    finally:
        sealed.secret.cache_clear()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_folder_or_key_of_another_user_is_not_used(compiles, monkeypatch, tmp_path):
    from tmpl_lint import sealed

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # a key of this test's: others' runs keep theirs
    sealed.secret.cache_clear()
    render.compile_template(TEXT)
    folder = tmp_path / "cache" / "code"
    os.chown(folder, 65534, 65534)  # nobody's: whoever that is may write there
    forget_this_process(monkeypatch)
    render.compile_template(TEXT)
    os.chown(folder, 0, 0)
    key = sealed.key_path()
    os.chown(key, 65534, 65534)
    sealed.secret.cache_clear()
    try:
        forget_this_process(monkeypatch)
        render.compile_template(TEXT)
        assert compiles == [TEXT, TEXT, TEXT]
    finally:
        sealed.secret.cache_clear()
