"""Writes (writes.py): the file the user meant, whole, with nothing else changed, or not
at all and saying why. What is a process's behaviour (locks between runs, signals) is
tested with real processes."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import CORPUS, PROJECT, lock_held, signal_after, wait_for_children, wait_until_working, without_edits

from tmpl_lint import writes
from tmpl_lint.cli import main
from tmpl_lint.containers import json_template_span
from tmpl_lint.fix import files as fixer
from tmpl_lint.writes import WriteError

CLOCK = "{{- 'Today: ' + strftime_now('%Y-%m-%d') + '\\n' }}{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{%- endfor %}"
HOSTILE = PROJECT / "tests" / "hostile"


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def tmpl_lint(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tmpl_lint", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        **kwargs,
    )


def live_clock(directory: Path, name: str = "chat_template.jinja") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    shutil.copyfile(CORPUS / "PC001_live_clock.jinja", path)
    return path


def fixed_once(tmp_path: Path, source: Path) -> bytes:
    """What one --fix run makes of ``source``, on a copy in a folder of its own."""
    alone = tmp_path / "alone"
    alone.mkdir()
    copy = alone / source.name
    shutil.copyfile(source, copy)
    assert run(str(copy), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15")[0] == 0
    return copy.read_bytes()


def leftovers(directory: Path, *keep: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if directory / name not in keep)


# -- concurrent writers ------------------------------------------------------------------


def test_two_concurrent_fixes_on_one_file_take_turns(tmp_path):
    path = live_clock(tmp_path / "repo")
    expected = fixed_once(tmp_path, path)
    runs = [tmpl_lint(path, "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15") for _ in range(2)]
    results = [(process.communicate(timeout=120), process.returncode) for process in runs]
    results = [(code, out, err) for (out, err), code in results]
    assert [code for code, _, _ in results] == [0, 0]
    assert all(err == "" for _, _, err in results)
    # one run fixed the file; the other waited for the lock, read the fixed file and found
    # nothing left to fix
    fixed = [out for _, out, _ in results if "fixed PC001 [live-clock]" in out]
    assert len(fixed) == 1
    assert path.read_bytes() == expected
    assert leftovers(path.parent, path) == []


def test_a_fix_waits_for_the_lock_and_fixes_what_the_holder_wrote(tmp_path):
    path = live_clock(tmp_path)
    with lock_held(path) as asked:
        process = tmpl_lint(path, "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15")
        asked()  # the run opened the lock's file to take the lock
        time.sleep(0.3)
        assert process.poll() is None  # still waiting for the lock
        # the holder writes its own change meanwhile
        text = path.read_text().replace("Knowledge cutoff: 2024-06", "Knowledge cutoff: 2025-01")
        path.write_text(text)
    _, err = process.communicate(timeout=120)
    assert (process.returncode, err) == (0, "")
    after = path.read_text()
    assert "Knowledge cutoff: 2025-01" in after  # the holder's change is not lost
    assert "strftime_now" not in after and "date_string" in after  # and the fix is in


def test_a_file_changed_after_it_was_read_is_not_overwritten(tmp_path, monkeypatch):
    path = live_clock(tmp_path)
    saved_by_editor = path.read_text() + "{# saved in an editor while tmpl-lint was fixing #}\n"
    fix_isolated = fixer.fix_isolated

    def fix_while_an_editor_saves(source, *arguments):
        result = fix_isolated(source, *arguments)
        path.write_text(saved_by_editor)
        return result

    monkeypatch.setattr(fixer, "fix_isolated", fix_while_an_editor_saves)
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    assert code == 2
    assert err == (
        f"tmpl-lint: error: {path}: changed since it was read (another program wrote it); nothing written, run tmpl-lint again\n"
    )
    # the finding its fix edits was not fixed because the file could not be written, not
    # because no fix edits it
    assert out.splitlines()[0] == f"{path}:3:28: not fixed PC001 [live-clock]: the file could not be written (see the error)"
    assert "fixed PC001" not in out.replace("not fixed", "")
    assert path.read_text() == saved_by_editor
    assert leftovers(tmp_path, path) == []


def lock_folder_blocked(tmp_path: Path, monkeypatch) -> Path:
    """A file where tmpl-lint's lock folder goes: no lock can be taken. Returns that file."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    blocker = runtime / f"tmpl-lint-{os.getuid()}"
    blocker.write_text("a file where the lock folder goes")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return blocker


def test_a_file_whose_lock_cannot_be_taken_says_each_finding_is_not_fixed_for_that(tmp_path, monkeypatch):
    # the fixes are never made: no finding is "found by the proof, not from a pattern"
    path = live_clock(tmp_path / "model")
    blocker = lock_folder_blocked(tmp_path, monkeypatch)
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    assert code == 2
    assert err == f"tmpl-lint: error: {blocker}: cannot hold lock files: File exists\n"
    assert out.splitlines()[0] == f"{path}:3:28: not fixed PC001 [live-clock]: the file could not be written (see the error)"
    assert path.read_bytes() == (CORPUS / "PC001_live_clock.jinja").read_bytes()


def test_a_file_whose_lock_cannot_be_taken_says_no_fix_where_its_rule_has_none(tmp_path, monkeypatch):
    # line 1's clock has a fix, which could not be written; line 3's opener (PC006, at the
    # text `<|assistant|><think>` that writes it) has no fix at all, and says so as it does
    # when the lock is taken
    path = tmp_path / "t.jinja"
    path.write_text(
        '{{ strftime_now("%Y-%m-%d") }}\n{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{%- endfor %}\n'
        "{%- if add_generation_prompt %}<|assistant|><think>\n{%- endif %}\n"
    )
    lock_folder_blocked(tmp_path, monkeypatch)
    code, out, _ = run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    assert code == 2
    assert out.splitlines()[:2] == [
        f"{path}:1:4: not fixed PC001 [live-clock]: the file could not be written (see the error)",
        f"{path}:3:32: not fixed PC006 [generation-prompt-mismatch]: no automatic fix for this rule",
    ]


def test_a_file_that_cannot_be_read_again_to_be_fixed_says_so_for_each_finding(tmp_path, monkeypatch):
    path = live_clock(tmp_path)
    read = writes.read

    def read_after_an_editor_broke_it(target):
        path.write_bytes(b"\xff" + (CORPUS / "PC001_live_clock.jinja").read_bytes())
        return read(target)

    monkeypatch.setattr(writes, "read", read_after_an_editor_broke_it)
    code, out, err = run(str(path), "--fix", "--unsafe-fixes", "--no-prove")
    assert code == 2
    assert err == f"tmpl-lint: error: {path}: not valid UTF-8 (byte 0)\n"
    assert out.splitlines()[0] == f"{path}:3:28: not fixed PC001 [live-clock]: the file could not be read again (see the error)"


# -- signals -------------------------------------------------------------------------------


def test_sigterm_during_a_write_leaves_no_temporary_file_and_the_target_whole(tmp_path):
    path = tmp_path / "tokenizer_config.json"
    # Near the 10 MiB limit, so that writing and syncing take long enough to be caught at. The
    # bulk is beside the template, not in it: the fix before the write takes a fraction of a
    # second, where a template of 9 MiB took seconds to lint and fix.
    path.write_text(json.dumps({"chat_template": CLOCK, "padding": "x" * (9 * 1024 * 1024)}, indent=2) + "\n")
    original = path.read_bytes()
    process = tmpl_lint(path, "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15")
    caught = False
    while process.poll() is None:
        if any(name.endswith(".tmp") for name in os.listdir(tmp_path)):
            process.send_signal(signal.SIGTERM)
            caught = True
            break
        # The temporary file lives for tens of milliseconds: polling every millisecond sees
        # it, and leaves the core to the process rather than spinning on it.
        time.sleep(0.001)
    out, err = process.communicate(timeout=120)
    code = process.returncode
    assert caught, "the write ended before a temporary file was seen"
    assert (code, err) == (143, "tmpl-lint: terminated\n")
    assert leftovers(tmp_path, path) == []
    after = path.read_bytes()
    # Whole: the original or, had the signal come after the rename, the whole fix (worked out
    # only then: fixing 9 MiB takes seconds); named as fixed exactly when it was written.
    assert after == original or after == fixed_once(tmp_path, saved(tmp_path / "original", path.name, original))
    assert (" fixed PC001 " in out) == (after != original)


def saved(directory: Path, name: str, data: bytes) -> Path:
    directory.mkdir()
    (directory / name).write_bytes(data)
    return directory / name


@pytest.mark.parametrize(
    ("number", "code", "message"),
    [(signal.SIGINT, 130, "tmpl-lint: interrupted\n"), (signal.SIGTERM, 143, "tmpl-lint: terminated\n")],
)
def test_a_signal_to_the_main_process_alone_stops_it_and_its_children_at_once(number, code, message):
    # Renders that would run for minutes, proven two at a time in children.
    process = tmpl_lint(
        HOSTILE / "nested_loops.jinja", HOSTILE / "exponential_growth.jinja", "--render-timeout", "100", "--jobs", "2"
    )
    children = wait_for_children(process.pid, 2)
    assert len(children) == 2
    wait_until_working(children)  # rendering (the render of the other template may have ended)
    start = time.monotonic()
    process.send_signal(number)  # to the main process only, not its group
    _, err = process.communicate(timeout=30)
    returned = process.returncode
    assert time.monotonic() - start < 5
    assert returned == code
    assert err.endswith(message) and "Aborted!" not in err and "Traceback" not in err
    stopped = time.monotonic() + 0.5  # the children are gone within half a second

    def running() -> list[int]:
        return [pid for pid in children if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)]

    while running() and time.monotonic() < stopped:
        time.sleep(0.02)
    assert running() == []


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_an_interrupted_write_leaves_the_original(tmp_path, monkeypatch):
    path = live_clock(tmp_path)
    path.chmod(0o640)
    before = path.read_bytes()
    snapshot = writes.read(path)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # the process is stopped between writing and renaming

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        writes.replace(snapshot, "new text")
    assert path.read_bytes() == before
    assert leftovers(tmp_path, path) == []


# -- what is written, and where -------------------------------------------------------------


def test_hf_cache_symlink_is_written_through_to_its_blob(tmp_path):
    repo = tmp_path / "hub" / "models--x--y"
    blob = repo / "blobs" / "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / ("a" * 40)
    blob.parent.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    original = json.dumps({"bos_token": "<s>", "chat_template": CLOCK, "model_max_length": 4096}, indent=2) + "\n"
    blob.write_text(original)
    link = snapshot / "tokenizer_config.json"
    link.symlink_to(Path("..") / ".." / "blobs" / blob.name)
    code, out, err = run(str(snapshot), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15")
    assert (code, err) == (0, "")
    (line,) = [number for number, text in enumerate(original.splitlines(), 1) if "strftime_now" in text]
    column = original.splitlines()[line - 1].index("strftime_now") + 1  # in the file, escapes counted
    assert f"{link}:{line}:{column}: fixed PC001 [live-clock]" in out
    assert link.is_symlink() and os.readlink(link) == f"../../blobs/{blob.name}"
    after = blob.read_text()
    old, new = json_template_span(original, None), json_template_span(after, None)
    assert after[: new.start] == original[: old.start] and after[new.end :] == original[old.end :]
    assert "strftime_now" not in json.loads(after)["chat_template"]
    assert leftovers(blob.parent, blob) == [] and leftovers(snapshot, link) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another owner needs root")
def test_mode_and_owner_are_kept(tmp_path):
    path = live_clock(tmp_path)
    os.chown(path, 1234, 5678)
    path.chmod(0o640)
    assert run(str(path), "--fix", "--unsafe-fixes", "--no-prove")[0] == 0
    status = path.stat()
    assert "date_string" in path.read_text()
    assert (status.st_uid, status.st_gid, stat.S_IMODE(status.st_mode)) == (1234, 5678, 0o640)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to run without CAP_CHOWN")
def test_an_owner_this_process_cannot_give_is_kept_by_writing_in_place(tmp_path):
    path = live_clock(tmp_path)
    os.chown(path, 1234, 1234)
    path.chmod(0o666)
    inode = path.stat().st_ino
    # root without CAP_CHOWN: it may write the file but not give a new one to uid 1234
    result = subprocess.run(
        [
            "setpriv",
            "--bounding-set",
            "-chown",
            "--inh-caps",
            "-chown",
            sys.executable,
            "-m",
            "tmpl_lint",
            str(path),
            "--fix",
            "--unsafe-fixes",
            "--no-prove",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (0, "")
    status = path.stat()
    assert "date_string" in path.read_text()
    assert (status.st_ino, status.st_uid, status.st_gid, stat.S_IMODE(status.st_mode)) == (inode, 1234, 1234, 0o666)
    assert leftovers(tmp_path, path) == []


def test_hard_links_stay_linked(tmp_path):
    path = live_clock(tmp_path)
    other = tmp_path / "elsewhere.jinja"
    os.link(path, other)
    assert run(str(path), "--fix", "--unsafe-fixes", "--no-prove")[0] == 0
    assert "date_string" in other.read_text()
    assert path.stat().st_ino == other.stat().st_ino and path.stat().st_nlink == 2
    assert leftovers(tmp_path, path, other) == []


def test_a_failed_in_place_write_puts_the_old_bytes_back(tmp_path, monkeypatch):
    path = live_clock(tmp_path)
    os.link(path, tmp_path / "link.jinja")
    before = path.read_bytes()
    snapshot = writes.read(path)
    real_write = os.write

    def half_then_full(descriptor, data):
        if bytes(data[:5]) == b"THE N":  # the new bytes: half of them land, then the disk is full
            real_write(descriptor, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(descriptor, data)

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(WriteError, match="cannot write: No space left on device; the file is unchanged"):
        writes.replace(snapshot, "THE NEW TEXT " * 100)
    assert path.read_bytes() == before
    assert leftovers(tmp_path, path, tmp_path / "link.jinja") == []


def test_a_full_disk_is_one_error_and_the_batch_goes_on(tmp_path, monkeypatch):
    full = live_clock(tmp_path / "full")
    fine = live_clock(tmp_path)
    before = full.read_bytes()
    real_fsync = os.fsync

    def fsync(descriptor):
        if os.path.dirname(os.readlink(f"/proc/self/fd/{descriptor}")) == str(full.parent):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    code, out, err = run(str(full), str(fine), "--fix", "--unsafe-fixes", "--no-prove")
    assert code == 2
    assert err == f"tmpl-lint: error: {full}: cannot write: No space left on device; the file is unchanged\n"
    assert full.read_bytes() == before and leftovers(full.parent, full) == []
    assert "date_string" in fine.read_text()
    assert f"{fine}:3:28: fixed PC001 [live-clock]" in out and f"{full}:3:28: fixed" not in out


def test_a_report_on_a_full_disk_is_one_error():
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", str(CORPUS / "PC001_live_clock.jinja"), "--no-prove", "-o", "/dev/full"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == "tmpl-lint: error: cannot write the report: /dev/full: cannot write: No space left on device\n"


def test_a_lone_surrogate_is_linted_fixed_and_printed_without_an_internal_error(tmp_path):
    config = tmp_path / "tokenizer_config.json"
    template = "{{- '\ud800' + strftime_now('%Y-%m-%d') }}{%- for m in messages %}{{ m.content }}{%- endfor %}"
    config.write_text(json.dumps({"chat_template": template}))  # valid JSON: the surrogate is escaped
    # in the file: the surrogate is written as a six-character escape
    column = config.read_text().index("strftime_now") + 1
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", str(config), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", "2026-01-15"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "internal error" not in result.stderr and result.stderr == ""
    assert f"{config}:1:{column}: fixed PC001 [live-clock]" in result.stdout
    written = json.loads(config.read_bytes().decode("utf-8"))["chat_template"]
    assert written.startswith('{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n')
    assert "'\ud800' + date_string" in written
    assert result.returncode == 0


def test_read_only_file_and_vanished_file_are_errors(tmp_path):
    path = live_clock(tmp_path)
    snapshot = writes.read(path)
    path.chmod(0o444)
    with pytest.raises(WriteError, match="the file is read-only; nothing written"):
        writes.replace(writes.read(path), "x")
    path.unlink()
    with pytest.raises(WriteError, match="the file vanished before it could be written"):
        writes.read(path)
    with pytest.raises(WriteError, match="changed since it was read"):
        writes.replace(snapshot, "x")
    assert leftovers(tmp_path) == []


def test_the_summary_counts_files_not_written_apart_from_inputs_not_read(tmp_path):
    # a write that failed was counted as "1 input could not be read"
    read_only = live_clock(tmp_path)
    read_only.chmod(0o444)
    missing = tmp_path / "missing.jinja"
    code, out, err = run(str(read_only), str(missing), "--fix", "--unsafe-fixes", "--no-prove")
    assert code == 2
    assert err == (
        f"tmpl-lint: error: {missing}: no such file or directory\n"
        f"tmpl-lint: error: {read_only}: the file is read-only; nothing written\n"
    )
    assert out.splitlines()[-1] == (
        "Found 1 finding (1 failing; 1 of the failing unproven); "
        "1 input could not be read, 1 file could not be written (see the errors above)."
    )
    code, out, _ = run(str(read_only), "--fix", "--unsafe-fixes", "--no-prove")
    assert out.splitlines()[-1] == (
        "Found 1 finding (1 failing; 1 of the failing unproven); 1 file could not be written (see the errors above)."
    )


# -- creating a new file -------------------------------------------------------------------


def test_create_writes_a_new_file_with_the_umasks_mode(tmp_path):
    target = tmp_path / "new.jinja"
    old_mask = os.umask(0o027)
    try:
        writes.create(target, lambda name: Path(name).write_bytes(b"made"))
    finally:
        os.umask(old_mask)
    assert target.read_bytes() == b"made"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert leftovers(tmp_path, target) == []


def test_create_never_overwrites_a_name_taken_meanwhile(tmp_path):
    target = tmp_path / "new.jinja"

    def another_program_writes_first(name: str) -> None:
        Path(name).write_bytes(b"ours")
        target.write_bytes(b"theirs")

    with pytest.raises(WriteError) as raised:
        writes.create(target, another_program_writes_first)
    assert str(raised.value) == f"{target}: appeared while it was written; tmpl-lint does not overwrite it"
    assert target.read_bytes() == b"theirs"
    assert leftovers(tmp_path, target) == []
    with pytest.raises(WriteError) as raised:
        writes.create(target, lambda name: Path(name).write_bytes(b"ours"))
    assert str(raised.value) == f"{target}: already exists; tmpl-lint does not overwrite it"
    assert target.read_bytes() == b"theirs"


def test_create_without_hard_links_renames_into_a_free_name(tmp_path, monkeypatch):
    target = tmp_path / "new.jinja"

    def no_hard_links(source, destination):
        raise PermissionError(errno.EPERM, "Operation not permitted")  # as vfat says

    monkeypatch.setattr(os, "link", no_hard_links)
    writes.create(target, lambda name: Path(name).write_bytes(b"made"))
    assert target.read_bytes() == b"made" and leftovers(tmp_path, target) == []
    taken = tmp_path / "taken.jinja"

    def another_program_writes_first(name: str) -> None:
        Path(name).write_bytes(b"ours")
        taken.write_bytes(b"theirs")

    with pytest.raises(WriteError, match="appeared while it was written"):
        writes.create(taken, another_program_writes_first)
    assert taken.read_bytes() == b"theirs" and leftovers(tmp_path, target, taken) == []


def test_create_writes_nothing_when_the_fill_fails(tmp_path, monkeypatch):
    target = tmp_path / "new.jinja"

    def refuses(name: str) -> None:
        Path(name).write_bytes(b"half")
        raise WriteError(f"{target}: does not read back; nothing written")

    with pytest.raises(WriteError, match="does not read back"):
        writes.create(target, refuses)
    real_fsync = os.fsync

    def full(descriptor):
        if os.path.dirname(os.readlink(f"/proc/self/fd/{descriptor}")) == str(tmp_path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(WriteError) as raised:
        writes.create(target, lambda name: Path(name).write_bytes(b"made"))
    assert str(raised.value) == f"{target}: cannot write: No space left on device; nothing written"
    assert leftovers(tmp_path) == []


# As the console script runs, with the fix of the template named "tool_use" held in its
# worker (as a long verification is) once it has said so in a file.
SLOW_TOOL_USE = """
import sys, time
from pathlib import Path
from tmpl_lint.fix import files as fixer
marker, fix_template = Path(sys.argv.pop(1)), fixer.fix_template
def held(source, *args, **kwargs):
    if source.name == "tool_use":
        marker.write_text("verifying")
        time.sleep(60)
    fixed = fix_template(source, *args, **kwargs)
    (marker.parent / f"fixed in {source.path.parent.name}").write_text("")
    return fixed
fixer.fix_template = held
from tmpl_lint.__main__ import run
sys.argv[0] = "tmpl-lint"
run()
"""


def config_and_other_file(folder: Path) -> tuple[Path, Path]:
    """A tokenizer_config.json whose default and tool_use templates read the clock, and a
    chat_template.jinja with another text that does: fixed at the same time (--jobs 2)."""
    clock = (CORPUS / "PC001_live_clock.jinja").read_text()
    config = folder / "m" / "tokenizer_config.json"
    config.parent.mkdir()
    config.write_text(
        json.dumps({"chat_template": [{"name": "default", "template": clock}, {"name": "tool_use", "template": clock}]})
    )
    other = folder / "other" / "chat_template.jinja"
    other.parent.mkdir()
    other.write_text(clock.replace("Current date", "Date"))
    return config, other


def fix_slowly(marker: Path, *paths: Path, mode: str = "--fix") -> subprocess.Popen:
    """``tmpl-lint PATHS --fix --no-prove --jobs 2`` (or ``--diff``) whose tool_use templates
    take a minute to verify, ``marker`` written as one starts, and beside it ``fixed in
    FOLDER`` as the fix of a template of a file in FOLDER is worked out (see SLOW_TOOL_USE)."""
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_TOOL_USE, str(marker), *map(str, paths), mode, "--unsafe-fixes", "--no-prove", "--jobs", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )


# Ctrl-C, and SIGTERM (what `timeout`, CI cancellation and container stops send), stop a run
# alike: each with its line and exit status (SIGTERM during --fix wrote files and said nothing).
STOPS = pytest.mark.parametrize(
    ("number", "code", "said"),
    [(signal.SIGINT, 130, "tmpl-lint: interrupted\n"), (signal.SIGTERM, 143, "tmpl-lint: terminated\n")],
    ids=["SIGINT", "SIGTERM"],
)


@STOPS
def test_a_signal_during_a_fix_of_files_at_once_writes_no_file_it_was_fixing(tmp_path, number, code, said):
    """Two files fixed at once (--jobs 2). A signal while the config's second template is
    being verified, its first already fixed: the config is not written half fixed, and no
    file is fixed after the interruption."""
    clock = (CORPUS / "PC001_live_clock.jinja").read_text()
    config = tmp_path / "m" / "tokenizer_config.json"
    config.parent.mkdir()
    config.write_text(
        json.dumps({"chat_template": [{"name": "default", "template": clock}, {"name": "tool_use", "template": clock + " "}]})
    )
    before = config.read_bytes()
    other = tmp_path / "other" / "chat_template.jinja"  # another text: fixed at the same time
    other.parent.mkdir()
    other.write_text(clock.replace("Current date", "Date"))
    marker = tmp_path / "tool_use is being verified"
    process = fix_slowly(marker, config, other)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists()
    process.send_signal(number)
    _, err = process.communicate(timeout=30)
    assert (process.returncode, err.endswith(said), "Traceback" in err) == (code, True, False)
    assert config.read_bytes() == before


@STOPS
def test_a_signal_during_a_fix_of_files_at_once_names_the_files_it_wrote_before(tmp_path, number, code, said):
    """A signal once one file is written and another is still being verified: the written
    file is named as fixed before "interrupted" or "terminated" (files changed on
    disk, and nothing said so); the one not written is not."""
    config, other = config_and_other_file(tmp_path)
    before = other.read_bytes()
    marker = tmp_path / "tool_use is being verified"
    process = fix_slowly(marker, config, other)
    deadline = time.monotonic() + 60
    while not (marker.exists() and other.read_bytes() != before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists() and other.read_bytes() != before
    process.send_signal(number)
    out, err = process.communicate(timeout=30)
    assert (process.returncode, err) == (code, said)
    column = before.decode().splitlines()[2].index("strftime_now") + 1
    assert [line.split(" [")[0] for line in without_edits(out).splitlines()] == [f"{other}:3:{column}: fixed PC001"]


@STOPS
def test_a_signal_during_a_diff_of_files_at_once_prints_no_patch_of_part_of_them(tmp_path, number, code, said):
    """--diff writes nothing: after a signal it prints no patch of the files it had done,
    which `tmpl-lint --diff | git apply` would apply though the run was stopped."""
    config, other = config_and_other_file(tmp_path)
    marker = tmp_path / "tool_use is being verified"
    process = fix_slowly(marker, config, other, mode="--diff")
    done = tmp_path / f"fixed in {other.parent.name}"
    deadline = time.monotonic() + 60
    while not (marker.exists() and done.exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists() and done.exists()
    # the other file is done: its patch would be printed by now if patches were printed as
    # each file is done (they were, before)
    time.sleep(0.3)
    process.send_signal(number)
    out, err = process.communicate(timeout=30)
    assert (process.returncode, out, err) == (code, "", said)


# writes.py holds SIGINT and SIGTERM while a file is put in place, and the signal takes effect
# as that ends: here it is sent then, every time (argv: the signal, the file's real path).
SIGNAL_AS_PUT_IN_PLACE = signal_after("replace")


@STOPS
def test_a_signal_held_while_the_file_is_put_in_place_lands_after_and_the_file_is_named(tmp_path, number, code, said):
    """One file, fixed in the main thread (where signals land): the signal that came while
    its new bytes were put in place takes effect once they are, and the file, written, is
    named as fixed before the run says it stopped."""
    path = live_clock(tmp_path)
    original = path.read_bytes()
    arguments = [str(int(number)), os.path.realpath(path), str(path), "--fix", "--unsafe-fixes", "--no-prove"]
    process = subprocess.run(
        [sys.executable, "-c", SIGNAL_AS_PUT_IN_PLACE, *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=120,
    )
    assert (process.returncode, process.stderr) == (code, said)
    assert path.read_bytes() != original and leftovers(tmp_path, path) == []
    assert [line.split(" [")[0] for line in without_edits(process.stdout).splitlines()] == [f"{path}:3:28: fixed PC001"]
