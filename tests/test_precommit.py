"""The real pre-commit program runs this repository's hooks, configured with the README's
snippet, in temporary git repositories: a bad template fails, the fix hook repairs it, and
stock Qwen3 and gpt-oss configs pass once fixed.

pre-commit installs a hook repository into an environment of its own, which takes most of
the time: one repository (this working tree, committed and tagged with the README's rev)
and one environment serve every test of the session.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CORPUS, PROJECT, SHARED_TOKENIZERS, needs_shared

from tmpl_lint import __version__

pre_commit = shutil.which("pre-commit") or (shutil.which("pre-commit", path=os.path.dirname(sys.executable)))
pytestmark = pytest.mark.skipif(not pre_commit or not (PROJECT / ".git").exists(), reason="needs pre-commit and a git checkout")

IDENTITY = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


def readme_snippet() -> str:
    """The README's .pre-commit-config.yaml, as a user copies it."""
    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    return re.search(r"```yaml\n(# \.pre-commit-config\.yaml\n.*?)```", readme, re.DOTALL).group(1)


def snippet_rev() -> str:
    return re.search(r"^\s+rev: (\S+)$", readme_snippet(), re.MULTILINE).group(1)


def git(*args, cwd, env=None):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env)


@pytest.fixture(scope="session")
def hook_repository(tmp_path_factory) -> Path:
    """This working tree as pre-commit fetches a hook repository: committed (uncommitted
    changes included) and tagged with the README's rev."""
    snapshot = tmp_path_factory.mktemp("tmpl-lint")
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=PROJECT).stdout.split("\0")
    for name in filter(None, listed):
        source = PROJECT / name
        if source.is_file():
            (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, snapshot / name)
    environment = {**os.environ, **IDENTITY}
    git("init", "-q", cwd=snapshot)
    git("add", ".", cwd=snapshot)
    git("commit", "-qm", "snapshot", cwd=snapshot, env=environment)
    git("tag", snippet_rev(), cwd=snapshot)
    return snapshot


@pytest.fixture(scope="session")
def environment(tmp_path_factory, hook_repository) -> dict[str, str]:
    """pre-commit's environment, with the hooks installed once for the session."""
    home = tmp_path_factory.mktemp("pre-commit-home")
    env = {**os.environ, **IDENTITY, "PRE_COMMIT_HOME": str(home), "NO_COLOR": "1"}
    repo = consumer(tmp_path_factory.mktemp("install"), hook_repository, {})
    subprocess.run([pre_commit, "install-hooks"], cwd=repo, env=env, check=True, capture_output=True, timeout=900)
    return env


def consumer(root: Path, hook_repository: Path, files: dict[str, Path]) -> Path:
    """A git repository with the README's pre-commit config and ``files`` (name: source),
    committed."""
    repo = root / "repo"
    repo.mkdir()
    config = readme_snippet().replace(re.search(r"repo: (\S+)", readme_snippet()).group(1), str(hook_repository))
    (repo / ".pre-commit-config.yaml").write_text(config)
    for name, source in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, repo / name)
        (repo / name).chmod(0o644)
    git("init", "-q", cwd=repo)
    git("add", ".", cwd=repo)
    git("-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-qm", "start", "--no-verify", cwd=repo)
    return repo


def run_hooks(repo: Path, env, *hooks: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [pre_commit, "run", *hooks, "--all-files"], cwd=repo, env=env, capture_output=True, text=True, timeout=900
    )


def hook_lines(result) -> list[str]:
    """pre-commit's one status line per hook: 'tmpl-lint....Passed' as ('tmpl-lint', 'Passed')."""
    return [
        (match.group(1), match.group(2))
        for match in re.finditer(r"^(tmpl-lint(?: \(fix\))?)\.+(Passed|Failed|\(no files to check\)Skipped)$", result.stdout, re.M)
    ]


def test_the_readme_snippet_names_a_tag_of_this_repository_and_the_version():
    rev = snippet_rev()
    assert rev == f"v{__version__}"
    found = subprocess.run(["git", "rev-parse", "-q", "--verify", f"refs/tags/{rev}"], cwd=PROJECT, capture_output=True)
    assert found.returncode == 0, f"tag {rev} does not exist: make it on the commit that releases {__version__}"


def test_bad_template_fails_and_fix_hook_repairs_it(tmp_path, hook_repository, environment):
    repo = consumer(tmp_path, hook_repository, {"chat_template.jinja": CORPUS / "PC001_live_clock.jinja"})
    checked = run_hooks(repo, environment, "tmpl-lint")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert hook_lines(checked) == [("tmpl-lint", "Failed")]
    assert "chat_template.jinja:3:28: PC001 [live-clock]" in checked.stdout

    fixed = run_hooks(repo, environment, "tmpl-lint-fix")
    assert fixed.returncode == 1  # pre-commit fails a hook that modifies files
    assert "files were modified by this hook" in fixed.stdout
    assert "chat_template.jinja:3:28: fixed PC001 [live-clock]" in fixed.stdout
    assert "strftime_now" not in (repo / "chat_template.jinja").read_text()

    again = run_hooks(repo, environment, "tmpl-lint")
    assert again.returncode == 0, again.stdout
    assert hook_lines(again) == [("tmpl-lint", "Passed")]


def test_a_template_vllm_never_reads_does_not_fail_on_vllms_render(tmp_path, hook_repository, environment):
    # gpt-oss's harmony markup: PC103 is about the engine, not the file's to fix.
    repo = consumer(tmp_path, hook_repository, {"chat_template.jinja": CORPUS / "PC103_engine_render_unstable.jinja"})
    engine_only = run_hooks(repo, environment, "tmpl-lint")
    assert engine_only.returncode == 0, engine_only.stdout
    assert "PC103" not in engine_only.stdout


@needs_shared
@pytest.mark.parametrize(
    ("model", "files"),
    [
        ("qwen3", ["tokenizer_config.json"]),
        # the template in chat_template.jinja, beside a tokenizer_config.json without one
        ("gpt-oss", ["tokenizer_config.json", "chat_template.jinja"]),
    ],
)
def test_a_stock_config_passes_the_readme_hooks_once_fixed(tmp_path, hook_repository, environment, model, files):
    repo = consumer(tmp_path, hook_repository, {f"{model}/{name}": SHARED_TOKENIZERS / model / name for name in files})
    first = run_hooks(repo, environment)
    # the check fails on the stock template, the fix hook rewrites it
    assert first.returncode == 1, first.stdout + first.stderr
    assert hook_lines(first) == [("tmpl-lint", "Failed"), ("tmpl-lint (fix)", "Failed")]
    assert "files were modified by this hook" in first.stdout
    assert "not fixed" not in first.stdout.replace("not fixed PC006", "")  # every failing finding had a fix
    second = run_hooks(repo, environment)
    assert second.returncode == 0, second.stdout + second.stderr
    assert hook_lines(second) == [("tmpl-lint", "Passed"), ("tmpl-lint (fix)", "Passed")]
