"""QA defects on main (session 13), each shown through the real CLI process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import CORPUS

DEEP = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"


def cli(*args: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tmpl_lint", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


@pytest.fixture
def request_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["check", "TEMPLATE", "--chat-template-kwargs"],
        ["check", "TEMPLATE", "--default-chat-template-kwargs"],
        ["render", "REQUEST", "--template", "TEMPLATE", "--default-chat-template-kwargs"],
        ["diff", "REQUEST", "REQUEST", "--template", "TEMPLATE", "--default-chat-template-kwargs"],
        ["replay", "REQUEST", "--template", "TEMPLATE", "--default-chat-template-kwargs"],
        ["validate", "REQUEST", "--server", "http://127.0.0.1:9", "--default-chat-template-kwargs"],
    ],
)
def test_deeply_nested_template_kwargs_are_one_usage_error(command, request_file):
    template = str(CORPUS / "clean_chatml.jinja")
    args = [{"TEMPLATE": template, "REQUEST": str(request_file)}.get(arg, arg) for arg in command]
    result = cli(*args, DEEP)
    assert result.returncode == 2
    assert "RecursionError" not in result.stderr and "internal error" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].endswith("is nested more than 64 deep (template variables are shallow)")
    assert result.stdout == ""
