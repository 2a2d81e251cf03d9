"""The real pre-commit program runs this repository's hooks in temporary git repositories:
the README's snippet as written, and the hooks of .pre-commit-hooks.yaml installed by
pre-commit itself. A bad template fails, the fix hook repairs it, and stock Qwen3 and
gpt-oss configs pass once fixed. (The hook repository and pre-commit's environment, built
once per session, are in conftest.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PRE_COMMIT, SESSION_ENVIRONMENT, configured, consumer, needs_pre_commit, readme_snippet, with_store
from helpers import CORPUS, SHARED_TOKENIZERS, needs_shared

pytestmark = [needs_pre_commit, pytest.mark.no_fork(long=True)]


def run_hooks(repo: Path, env, *hooks: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PRE_COMMIT, "run", *hooks, "--all-files"], cwd=repo, env=env, capture_output=True, text=True, timeout=900
    )


def hook_lines(result) -> list[str]:
    """pre-commit's one status line per hook: 'tmpl-lint....Passed' as ('tmpl-lint', 'Passed')."""
    return [
        (match.group(1), match.group(2))
        for match in re.finditer(
            r"^(tmpl-lint(?: \(fix\))?)\.+(Passed|Failed|\(no files to check\)Skipped)$", result.stdout, re.M
        )
    ]


def test_bad_template_fails_and_fix_hook_repairs_it(tmp_path, hook_repository, environment):
    # PC007's fix is safe: the fix hook makes it
    repo = consumer(tmp_path, hook_repository, {"chat_template.jinja": CORPUS / "PC007_text_after_history.jinja"})
    checked = run_hooks(repo, environment, "tmpl-lint")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert hook_lines(checked) == [("tmpl-lint", "Failed")]
    assert "chat_template.jinja:29:8: PC007 [text-after-history]" in checked.stdout
    assert "[*] 1 fixable with --fix" in checked.stdout

    fixed = run_hooks(repo, environment, "tmpl-lint-fix")
    assert fixed.returncode == 1  # pre-commit fails a hook that modifies files
    assert "files were modified by this hook" in fixed.stdout
    assert "chat_template.jinja:29:8: fixed PC007 [text-after-history]" in fixed.stdout

    again = run_hooks(repo, environment, "tmpl-lint")
    assert again.returncode == 0, again.stdout
    assert hook_lines(again) == [("tmpl-lint", "Passed")]


def test_the_fix_hook_makes_an_unsafe_fix_only_where_the_project_asks(tmp_path, hook_repository, environment):
    # PC001's fix freezes the date the model sees: unsafe, left by the fix hook...
    repo = consumer(tmp_path / "a", hook_repository, {"chat_template.jinja": CORPUS / "PC001_live_clock.jinja"})
    left = run_hooks(repo, environment, "tmpl-lint-fix")
    assert left.returncode == 1
    assert hook_lines(left) == [("tmpl-lint (fix)", "Failed")]
    assert "files were modified by this hook" not in left.stdout
    assert "[*] 1 fixable with --fix --unsafe-fixes" in left.stdout
    assert "strftime_now" in (repo / "chat_template.jinja").read_text()
    # ...and made where the project's configuration says unsafe-fixes = true
    (tmp_path / "settings").mkdir()  # not above the first repository, whose run would find it
    settings = tmp_path / "settings" / "pyproject.toml"
    settings.write_text("[tool.tmpl-lint]\nunsafe-fixes = true\n")
    repo = consumer(
        tmp_path / "b", hook_repository, {"chat_template.jinja": CORPUS / "PC001_live_clock.jinja", "pyproject.toml": settings}
    )
    fixed = run_hooks(repo, environment, "tmpl-lint-fix")
    assert "chat_template.jinja:3:28: fixed PC001 [live-clock]" in fixed.stdout
    assert "strftime_now" not in (repo / "chat_template.jinja").read_text()


def test_the_readme_snippet_works_as_written(tmp_path):
    # Copied as it is: no URL or tag to fill in, only the check hook on. It runs the
    # tmpl-lint installed where the commit is made (here, this test's).
    environment = {
        **with_store(tmp_path / "home"),
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), SESSION_ENVIRONMENT.get("PATH", "")]),
    }
    snippet = readme_snippet()
    # PC007's fix is safe, so the fixing entry, which makes safe fixes only, makes it
    repo = configured(tmp_path, snippet, {"chat_template.jinja": CORPUS / "PC007_text_after_history.jinja"})
    checked = run_hooks(repo, environment)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert hook_lines(checked) == [("tmpl-lint", "Failed")]
    assert checked.stdout.count("chat_template.jinja:29:8: PC007 [text-after-history]") == 1

    # the alternative the snippet names in its comment: the same hook, fixing
    fixing = re.search(r"# to rewrite templates with verified fixes instead: (.+)\n", snippet).group(1)
    (repo / ".pre-commit-config.yaml").write_text(re.sub(r"entry: .+", f"entry: {fixing}", snippet))
    fixed = run_hooks(repo, environment)
    assert fixed.returncode == 1  # pre-commit fails a hook that modifies files
    assert "files were modified by this hook" in fixed.stdout
    assert (repo / "chat_template.jinja").read_bytes() != (CORPUS / "PC007_text_after_history.jinja").read_bytes()

    (repo / ".pre-commit-config.yaml").write_text(snippet)
    again = run_hooks(repo, environment)
    assert again.returncode == 0, again.stdout + again.stderr
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
def test_a_stock_config_is_fixed_as_far_as_fixes_go_and_says_what_is_left(tmp_path, hook_repository, environment, model, files):
    # Their fixes change what the model sees (reasoning kept in history): the project takes them.
    settings = tmp_path / "pyproject.toml"
    settings.write_text("[tool.tmpl-lint]\nunsafe-fixes = true\n")
    repo = consumer(
        tmp_path,
        hook_repository,
        {**{f"{model}/{name}": SHARED_TOKENIZERS / model / name for name in files}, "pyproject.toml": settings},
    )
    first = run_hooks(repo, environment)
    # the check fails on the stock template, the fix hook rewrites it
    assert first.returncode == 1, first.stdout + first.stderr
    assert hook_lines(first) == [("tmpl-lint", "Failed"), ("tmpl-lint (fix)", "Failed")]
    assert "files were modified by this hook" in first.stdout
    second = run_hooks(repo, environment)
    # The fix hook has nothing left to make (it changes no file a second time), and both still
    # fail, as ruff --fix does while findings remain: ORACLE.tsv gives both models a break in the
    # generation prompt or the reply itself ("tail", in chat and agent), which no edit of
    # history mends: PC006, said to have no fix rather than promised one.
    assert hook_lines(second) == [("tmpl-lint", "Failed"), ("tmpl-lint (fix)", "Failed")], second.stdout
    assert "files were modified by this hook" not in second.stdout
    assert "not fixed PC006 [generation-prompt-mismatch]" in second.stdout
    assert "fixable with --fix" not in second.stdout


def test_a_base_models_tokenizer_config_does_not_fail_the_hook(tmp_path, hook_repository, environment):
    # A repo that keeps a base model beside a chat model: the hook's files pattern names both
    # tokenizer configs, and the base model's holds no template to lint.
    base = tmp_path / "base_tokenizer_config.json"
    base.write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    repo = consumer(
        tmp_path,
        hook_repository,
        {"base/tokenizer_config.json": base, "chat/chat_template.jinja": CORPUS / "clean_chatml.jinja"},
    )
    checked = run_hooks(repo, environment, "tmpl-lint")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert hook_lines(checked) == [("tmpl-lint", "Passed")]


def test_the_hooks_keep_a_projects_own_ignore(tmp_path, hook_repository, environment):
    # The hooks pass --ignore PC103 on the command line; the project's [tool.tmpl-lint] ignore
    # of PC001 still holds: the check passes and the fix hook leaves the file as it was.
    settings = tmp_path / "pyproject.toml"
    settings.write_text('[tool.tmpl-lint]\nignore = ["PC001"]\n')
    repo = consumer(
        tmp_path, hook_repository, {"chat_template.jinja": CORPUS / "PC001_live_clock.jinja", "pyproject.toml": settings}
    )
    before = (repo / "chat_template.jinja").read_bytes()
    result = run_hooks(repo, environment, "tmpl-lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert hook_lines(result) == [("tmpl-lint", "Passed")]
    fixed = run_hooks(repo, environment, "tmpl-lint-fix")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert hook_lines(fixed) == [("tmpl-lint (fix)", "Passed")]
    assert (repo / "chat_template.jinja").read_bytes() == before


def test_the_hooks_read_a_tmpl_lint_yaml(tmp_path, hook_repository, environment):
    # .tmpl-lint.yaml needs ruamel.yaml, which the hooks install: without it every commit of
    # a project configured there failed, exit 2, advising `pip install 'tmpl-lint[fix]'`.
    settings = tmp_path / "settings.yaml"
    settings.write_text("ignore: [PC001]\n")
    repo = consumer(
        tmp_path, hook_repository, {"chat_template.jinja": CORPUS / "PC001_live_clock.jinja", ".tmpl-lint.yaml": settings}
    )
    result = run_hooks(repo, environment, "tmpl-lint", "--verbose")
    assert result.returncode == 0, result.stdout + result.stderr
    assert hook_lines(result) == [("tmpl-lint", "Passed")]
    assert "All checks passed!" in result.stdout
