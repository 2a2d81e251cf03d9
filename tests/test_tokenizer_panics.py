"""A tokenizer whose pre-tokenizer regex backtracks past Oniguruma's retry limit makes the
tokenizers library panic in Rust: pyo3 raises PanicException (a BaseException), and Rust's
panic hook prints the panic and a backtrace on file descriptor 2. No command shows either:
one error line, exit 2 (a diff's exit 1 says the turns diverge)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import CORPUS

pytest.importorskip("tokenizers")

PANIC = "Onig: Regex search error: retry-limit-in-match over (the tokenizers library panicked)"
RUNS_OF_A = "a" * 60


def backtracking_tokenizer(directory, pattern: str):
    """A character-level tokenizer whose pre-tokenizer splits on ``pattern``."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocabulary = {chr(code): index for index, code in enumerate(range(32, 127))}
    vocabulary["\n"] = len(vocabulary)
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="?"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def tmpl_lint(*args, cwd):
    # RUST_BACKTRACE=1: the panic hook prints a whole backtrace, should anything reach it
    environment = {**os.environ, "RUST_BACKTRACE": "1"}
    command = [sys.executable, "-m", "tmpl_lint", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd, env=environment)


def turns(folder, content: str):
    paths = []
    for name in ("turn1.json", "turn2.json"):
        (folder / name).write_text(json.dumps({"messages": [{"role": "user", "content": content}]}))
        paths.append(folder / name)
    return paths


def test_a_tokenizer_that_panics_on_ordinary_text_is_one_error_line(tmp_path):
    # Words followed by a non-word character: exponential for this pattern, on any prose.
    tokenizer = backtracking_tokenizer(tmp_path / "tokenizer", r"(\w+\s?)*$")
    said = f"tmpl-lint: error: {tokenizer}: the tokenizer cannot encode a text: {PANIC}\n"
    template = CORPUS / "clean_chatml.jinja"
    check = tmpl_lint(template, "--tokenizer", tokenizer, cwd=tmp_path)
    assert (check.returncode, check.stdout, check.stderr) == (2, "", said)
    diff = tmpl_lint("diff", *turns(tmp_path, "hello"), "--template", template, "--tokenizer", tokenizer, cwd=tmp_path)
    assert (diff.returncode, diff.stdout, diff.stderr) == (2, "", said)


def test_a_tokenizer_that_panics_on_one_rendered_text_is_that_templates_error_line(tmp_path):
    # Ordinary text encodes (the tokenizer loads); a run of "a" makes it panic.
    tokenizer = backtracking_tokenizer(tmp_path / "tokenizer", r"(a|aa)+c|.")
    panics = tmp_path / "panics.jinja"
    panics.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{{ '" + RUNS_OF_A + "' }}")
    clean = CORPUS / "clean_chatml.jinja"
    check = tmpl_lint(panics, clean, "--tokenizer", tokenizer, "--format", "json", cwd=tmp_path)
    assert check.returncode == 2
    assert json.loads(check.stdout) == []  # the other template was proven, and is clean
    assert (
        check.stderr
        == f"tmpl-lint: error: {panics}: cannot be proven: {tokenizer}: the tokenizer cannot encode a text: {PANIC}\n"
    )
    diff = tmpl_lint("diff", *turns(tmp_path, RUNS_OF_A), "--template", clean, "--tokenizer", tokenizer, cwd=tmp_path)
    assert (diff.returncode, diff.stdout) == (2, "")
    assert diff.stderr == f"tmpl-lint: error: {tokenizer}: the tokenizer cannot encode a text: {PANIC}\n"


def test_what_else_reaches_standard_error_during_a_call_is_passed_on(capfd):
    from tmpl_lint.tokenizer import TokenizerError, rust_panics_as_errors

    with rust_panics_as_errors("calling"):
        os.write(2, b"a warning of the library\n")
    assert capfd.readouterr().err == "a warning of the library\n"

    class PanicException(BaseException):  # as pyo3 names it
        pass

    broke = r"^calling: it broke \(the tokenizers library panicked\)$"
    with pytest.raises(TokenizerError, match=broke), rust_panics_as_errors("calling"):
        os.write(2, b"thread panicked at ...\nstack backtrace:\n")
        raise PanicException("it broke")
    assert capfd.readouterr().err == ""
    with pytest.raises(KeyboardInterrupt), rust_panics_as_errors("calling"):
        raise KeyboardInterrupt
