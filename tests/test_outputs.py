"""What a script reads: standard output holds one format in every mode, --diff is a patch
of the real file that git apply and patch -p1 apply, and every outcome is said honestly."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from helpers import CORPUS, SHARED_TOKENIZERS, needs_shared

from tmpl_lint.cli import main

FROZEN = "2026-01-15"


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)


def repository(tmp_path, files):
    """A git repository holding ``files`` (name: source path), committed."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, source in files.items():
        shutil.copyfile(source, repo / name)
        (repo / name).chmod(0o644)
    git("init", "-q", cwd=repo)
    git("add", ".", cwd=repo)
    git("-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-qm", "start", cwd=repo)
    return repo


def fixed_bytes(repo, name, monkeypatch):
    """What --fix writes for ``name``, leaving the repository as it was."""
    original = (repo / name).read_bytes()
    monkeypatch.chdir(repo)
    run(name, "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    written = (repo / name).read_bytes()
    (repo / name).write_bytes(original)
    return written


def check_patch_applies(repo, name, patch, expected):
    (repo.parent / "fix.patch").write_text(patch)
    git("apply", "--check", str(repo.parent / "fix.patch"), cwd=repo)
    git("apply", str(repo.parent / "fix.patch"), cwd=repo)
    assert (repo / name).read_bytes() == expected
    git("checkout", "-q", name, cwd=repo)
    subprocess.run(["patch", "-p1", "-s", "-i", str(repo.parent / "fix.patch")], cwd=repo, check=True)
    assert (repo / name).read_bytes() == expected


CASES = [
    ("chat_template.jinja", CORPUS / "PC004_tool_args_reserialized.jinja"),
    ("chat_template.jinja", CORPUS / "PC001_live_clock.jinja"),
]


@pytest.mark.parametrize(("name", "source"), CASES)
def test_diff_is_the_patch_fix_would_write_and_nothing_else(tmp_path, monkeypatch, name, source):
    repo = repository(tmp_path, {name: source})
    expected = fixed_bytes(repo, name, monkeypatch)
    assert expected != source.read_bytes()
    code, out, err = run(name, "--diff", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert code == 1  # as ruff: --diff exits 1 when it would change a file
    assert out.startswith(f"--- a/{name}\n+++ b/{name}\n@@ ")
    assert " would fix " in err and ": fixed " not in err
    assert (repo / name).read_bytes() == source.read_bytes()  # --diff writes nothing
    check_patch_applies(repo, name, out, expected)


def test_diff_of_a_file_without_a_final_newline_applies(tmp_path, monkeypatch):
    source = tmp_path / "source.jinja"
    source.write_text("{%- for m in messages %}{{ m.content }}{%- endfor %}\n{{- 'Date: ' + strftime_now('%Y-%m-%d') }}")
    repo = repository(tmp_path, {"chat_template.jinja": source})
    expected = fixed_bytes(repo, "chat_template.jinja", monkeypatch)
    code, out, _ = run("chat_template.jinja", "--diff", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert out.endswith("\n\\ No newline at end of file\n")
    check_patch_applies(repo, "chat_template.jinja", out, expected)


@needs_shared
def test_diff_of_a_stock_qwen3_config_is_file_relative_and_applies(tmp_path, monkeypatch):
    name = "tokenizer_config.json"
    repo = repository(tmp_path, {name: SHARED_TOKENIZERS / "qwen3" / name})
    expected = fixed_bytes(repo, name, monkeypatch)
    code, out, err = run(name, "--diff", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    # The template is the value on line 230 of the file: the hunk is there, not at a template line.
    assert out.startswith(f"--- a/{name}\n+++ b/{name}\n@@ -227,7 +227,7 @@\n")
    assert out.count("\n-") == 1 and out.count("\n+") == 2  # one line of the file changes
    check_patch_applies(repo, name, out, expected)


def fixed_by(path, monkeypatch):
    """What --fix writes to ``path`` (run from where the caller is), leaving it as it was."""
    original = path.read_bytes()
    assert run(str(path), "--fix", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)[0] == 0
    written = path.read_bytes()
    path.write_bytes(original)
    assert written != original
    return written


def apply_with(command, patch, cwd):
    return subprocess.run(command, input=patch, text=True, cwd=cwd, capture_output=True)


@pytest.mark.parametrize("given", ["absolute", "relative"])
def test_diff_of_a_file_outside_the_working_directory_applies_from_there(tmp_path, monkeypatch, given):
    # Named relative to where tmpl-lint ran (ruff prints the absolute path, git diff
    # --no-index "a/tmp/...": neither applies from there). git apply takes a path leading
    # out of the directory with --unsafe-paths; GNU patch takes none.
    (tmp_path / "tok").mkdir()
    (tmp_path / "elsewhere").mkdir()
    path = tmp_path / "tok" / "abs.jinja"
    shutil.copyfile(CORPUS / "PC001_live_clock.jinja", path)
    monkeypatch.chdir(tmp_path / "elsewhere")
    expected = fixed_by(path, monkeypatch)
    code, out, _ = run(
        str(path) if given == "absolute" else "../tok/abs.jinja",
        "--diff",
        "--unsafe-fixes",
        "--no-prove",
        "--frozen-date",
        FROZEN,
    )
    assert code == 1
    assert out.startswith("--- a/../tok/abs.jinja\n+++ b/../tok/abs.jinja\n@@ -1,6 +1,7 @@\n")
    applied = apply_with(["git", "apply", "--unsafe-paths"], out, tmp_path / "elsewhere")
    assert (applied.returncode, applied.stderr) == (0, "")
    assert path.read_bytes() == expected


def test_diff_through_a_symbolic_link_names_the_file_fix_writes_and_applies(tmp_path, monkeypatch):
    """A Hugging Face cache snapshot links its files into blobs/: --fix writes through the
    link, so the patch names the blob (git apply would patch the link, patch refuses it)."""
    repo = tmp_path / "repo"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "rev1").mkdir(parents=True)
    shutil.copyfile(CORPUS / "PC001_live_clock.jinja", repo / "blobs" / "abc")
    (repo / "snapshots" / "rev1" / "chat_template.jinja").symlink_to("../../blobs/abc")
    git("init", "-q", cwd=repo)
    git("add", ".", cwd=repo)
    git("-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-qm", "start", cwd=repo)
    monkeypatch.chdir(repo)
    expected = fixed_by(repo / "blobs" / "abc", monkeypatch)
    code, out, _ = run("snapshots/rev1", "--diff", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert (code, out.splitlines()[:2]) == (1, ["--- a/blobs/abc", "+++ b/blobs/abc"])
    check_patch_applies(repo, "blobs/abc", out, expected)
    assert (repo / "snapshots" / "rev1" / "chat_template.jinja").is_symlink()


def test_diff_from_a_subdirectory_of_a_repository_applies_there_to_a_sibling(tmp_path, monkeypatch):
    # git apply run in a subdirectory of a repository prefixes the names with it, and passes
    # over (silently) an absolute name: "sub/../other/x.jinja" is the file.
    repo = repository(tmp_path, {"x.jinja": CORPUS / "PC001_live_clock.jinja"})
    (repo / "other").mkdir()
    (repo / "sub").mkdir()
    git("mv", "x.jinja", "other/x.jinja", cwd=repo)
    git("-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-qm", "move", cwd=repo)
    path = repo / "other" / "x.jinja"
    monkeypatch.chdir(repo / "sub")
    expected = fixed_by(path, monkeypatch)
    code, out, _ = run(str(path), "--diff", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert out.startswith("--- a/../other/x.jinja\n+++ b/../other/x.jinja\n")
    applied = apply_with(["git", "apply", "--unsafe-paths"], out, repo / "sub")
    assert (applied.returncode, applied.stderr) == (0, "")
    assert path.read_bytes() == expected


@pytest.mark.parametrize(
    ("name", "header"),
    [
        # git's convention: a name with a space ends at a tab, which patch reads it up to
        ("sp ace \u00fc#1.jinja", "a/sp ace \u00fc#1.jinja\t"),
        ("\u00fc.jinja", "a/\u00fc.jinja"),
        # a quote, a backslash or a control character: C-quoted, as git writes it
        ('q"b\\s\tt.jinja', '"a/q\\"b\\\\s\\tt.jinja"'),
    ],
)
def test_diff_of_an_awkward_file_name_applies_with_git_and_patch(tmp_path, monkeypatch, name, header):
    repo = repository(tmp_path, {name: CORPUS / "PC001_live_clock.jinja"})
    expected = fixed_bytes(repo, name, monkeypatch)
    code, out, _ = run(name, "--diff", "--unsafe-fixes", "--no-prove", "--frozen-date", FROZEN)
    assert code == 1
    assert out.startswith(f"--- {header}\n+++ {header.replace('a/', 'b/', 1)}\n@@ ")
    check_patch_applies(repo, name, out, expected)


@pytest.mark.parametrize(
    "mode", [[], ["--fix", "--unsafe-fixes"], ["--diff", "--unsafe-fixes"], ["-q"], ["--fix", "--unsafe-fixes", "-q"]]
)
def test_json_stdout_parses_in_every_mode(tmp_path, monkeypatch, mode):
    shutil.copyfile(CORPUS / "PC002_history_rewrite_switch.jinja", tmp_path / "a.jinja")
    shutil.copyfile(CORPUS / "PC006_generation_prompt_mismatch.jinja", tmp_path / "b.jinja")
    monkeypatch.chdir(tmp_path)
    code, out, err = run("a.jinja", "b.jinja", "missing.jinja", "--format", "json", "--no-prove", *mode)
    findings = json.loads(out)
    fixing = bool(mode) and mode[0] in ("--fix", "--diff")
    # --fix and --diff keep every turn's reasoning whatever PC002's switch says; PC006 (only
    # with enable_thinking=false, a value a deployment may set) has no fix and stays
    found = {(finding["code"], finding["severity"]) for finding in findings}
    assert found == ({("PC006", "warning")} if fixing else {("PC002", "warning"), ("PC006", "warning")})
    assert code == 2  # the missing input
    assert "tmpl-lint: error: missing.jinja: no such file or directory\n" in err
    if fixing:
        verb = "fixed" if mode[0] == "--fix" else "would fix"
        assert f"a.jinja:11:87: {verb} PC002 [history-rewrite]" in err
    expected_patch = "--- a/a.jinja" in err
    assert expected_patch == (mode[:1] == ["--diff"])  # the patch goes where the report does not


@pytest.mark.parametrize("output_format", ["sarif", "github"])
def test_sarif_and_github_stdout_hold_only_their_format_when_fixing(tmp_path, monkeypatch, output_format):
    shutil.copyfile(CORPUS / "PC006_generation_prompt_mismatch.jinja", tmp_path / "b.jinja")
    shutil.copyfile(CORPUS / "PC001_live_clock.jinja", tmp_path / "a.jinja")
    monkeypatch.chdir(tmp_path)
    code, out, err = run("a.jinja", "b.jinja", "--fix", "--unsafe-fixes", "--no-prove", "--format", output_format)
    if output_format == "sarif":
        results = json.loads(out)["runs"][0]["results"]
        assert [result["ruleId"] for result in results] == ["PC006"]
    else:
        # PC006 breaks when enable_thinking=false, a value a deployment may set: a warning
        assert out.splitlines() and all(line.startswith("::warning file=b.jinja,") for line in out.splitlines())
    assert "a.jinja:3:28: fixed PC001 [live-clock]" in err


def test_no_templates_found_is_a_warning_and_nothing_passes(tmp_path):
    code, out, err = run(str(tmp_path), "--no-prove")
    assert (code, out, err) == (0, "", "tmpl-lint: warning: no chat templates found in the given paths\n")
    code, out, err = run(str(tmp_path), "--no-prove", "--format", "json")
    assert (code, json.loads(out)) == (0, [])


def test_an_input_error_is_never_followed_by_all_checks_passed(tmp_path):
    missing = tmp_path / "missing.jinja"
    code, out, err = run(str(missing), str(CORPUS / "clean_chatml.jinja"), "--no-prove")
    assert code == 2
    assert out == "No findings; 1 input could not be read (see the errors above).\n"
    assert err == f"tmpl-lint: error: {missing}: no such file or directory\n"
    code, out, _ = run(str(missing), str(CORPUS / "PC001_live_clock.jinja"), "--no-prove")
    assert out.splitlines()[-2] == (
        "Found 1 finding (1 failing; 1 of the failing unproven); 1 input could not be read (see the errors above)."
    )


def read_terminal(primary: int) -> bytes:
    """All that a process drew on the terminal whose other end it held, until it closed it."""
    import os

    drawn = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the terminal closed with the process
            return drawn
        if not chunk:
            return drawn
        drawn += chunk


def test_a_long_run_shows_progress_on_a_terminal_only(tmp_path):
    import os
    import pty
    import sys

    # A run long enough for the bar (it appears after about a second) at little cost: two
    # quick templates and one whose render never ends, stopped by the render limit. The
    # limit is wall-clock time, so the run lasts over two seconds on any machine.
    templates = tmp_path / "templates"
    templates.mkdir()
    for name in ("clean_chatml.jinja", "PC001_live_clock.jinja"):
        shutil.copyfile(CORPUS / name, templates / name)
    shutil.copyfile(CORPUS.parent / "tests" / "hostile" / "nested_loops.jinja", templates / "nested_loops.jinja")
    command = [sys.executable, "-m", "tmpl_lint", str(templates), "--jobs", "1", "--render-timeout", "2"]
    environment = {**os.environ, "COLUMNS": "100"}
    # stderr a terminal: the bar is drawn there, and standard output is the report alone.
    primary, secondary = pty.openpty()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=secondary, env=environment)
    os.close(secondary)
    # stderr a pipe, at the same time: nothing but what the run has to say
    quiet = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment)
    drawn = read_terminal(primary)
    out = process.stdout.read().decode()
    process.wait()
    os.close(primary)
    quiet_out, quiet_err = (stream.decode() for stream in quiet.communicate(timeout=120))
    assert b"proving templates" in drawn
    assert b"/3" in drawn  # the templates' count
    assert "proving templates" not in out
    assert "PC101" in out  # the run lasted the render limit
    assert quiet_err == ""
    assert quiet_out == out
    # -q on a terminal: quiet, no bar either
    primary, secondary = pty.openpty()
    process = subprocess.Popen([*command, "-q"], stdout=subprocess.PIPE, stderr=secondary, env=environment)
    os.close(secondary)
    drawn = read_terminal(primary)
    out = process.stdout.read().decode()
    process.wait()
    os.close(primary)
    assert "PC101" in out
    assert drawn == b""
