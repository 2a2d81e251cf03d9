"""The real pre-commit program runs this repository's hooks (pre-commit try-repo) in a
temporary git repository: a bad template fails, the fix hook repairs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from helpers import CORPUS, PROJECT

pre_commit = shutil.which("pre-commit") or (shutil.which("pre-commit", path=os.path.dirname(sys.executable)))
pytestmark = pytest.mark.skipif(not pre_commit or not (PROJECT / ".git").exists(), reason="needs pre-commit and a git checkout")


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def try_repo(hook, cwd, env):
    return subprocess.run(
        [pre_commit, "try-repo", str(PROJECT), hook, "--files", "chat_template.jinja"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_bad_template_fails_and_fix_hook_repairs_it(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    git("config", "user.email", "test@example.invalid", cwd=repo)
    git("config", "user.name", "test", cwd=repo)
    shutil.copyfile(CORPUS / "PC001_live_clock.jinja", repo / "chat_template.jinja")
    git("add", ".", cwd=repo)
    identity = {
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.invalid",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.invalid",
    }
    env = {**os.environ, **identity, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "NO_COLOR": "1"}

    checked = try_repo("tmpl-lint", repo, env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "tmpl-lint....." in checked.stdout and "Failed" in checked.stdout
    assert "chat_template.jinja:3:28: PC001 [live-clock]" in checked.stdout

    fixed = try_repo("tmpl-lint-fix", repo, env)
    assert fixed.returncode == 1  # pre-commit fails a hook that modifies files
    assert "files were modified by this hook" in fixed.stdout
    assert "fixed PC001 [live-clock]" in fixed.stdout
    assert "strftime_now" not in (repo / "chat_template.jinja").read_text()

    again = try_repo("tmpl-lint", repo, env)
    assert again.returncode == 0, again.stdout
    assert "Passed" in again.stdout

    # A template vLLM never reads (gpt-oss's harmony markup) does not fail on vLLM's own
    # render: PC103 is not the file's to fix.
    shutil.copyfile(CORPUS / "PC103_engine_render_unstable.jinja", repo / "chat_template.jinja")
    engine_only = try_repo("tmpl-lint", repo, env)
    assert engine_only.returncode == 0, engine_only.stdout
    assert "PC103" not in engine_only.stdout
