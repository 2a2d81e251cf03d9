"""QA defects on main (session 13), each shown through the real CLI process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import CORPUS, SHARED_TEMPLATES, needs_shared

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


@needs_shared
def test_pc002_fix_keeps_nemotron_medium_effort_on_the_last_turn(tmp_path):
    """Reading ns.last_user_idx as -1 stops the history rewrite and drops the last user turn's
    "{reasoning effort: efficient}" for every request that sets medium_effort, which the
    prover's scenarios never set: the verifier renders a single turn at each switch the
    template reads, and refuses the fix."""
    original = (SHARED_TEMPLATES / "nvidia--Nemotron-3.5.jinja").read_text()
    template = tmp_path / "n.jinja"
    template.write_text(original)
    request = tmp_path / "me.json"
    request.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"medium_effort": True}})
    )
    fixed = cli("check", str(template), "--fix", "--no-cache", timeout=600)
    assert fixed.returncode == 1
    reason = "a single-turn conversation would render differently with medium_effort=true"
    assert f"{template}:114:92: not fixed PC002 [history-rewrite]: {reason}" in fixed.stdout.splitlines()
    assert template.read_text() == original
    rendered = cli("render", str(request), "--template", str(template), "--engine", "hf")
    assert rendered.returncode == 0
    assert [line for line in rendered.stdout.splitlines() if "reasoning effort" in line] == [
        "{reasoning effort: efficient}<|im_end|>"
    ]
