"""The README's promises about installing: the quick start, the extras (each named, and a
missing one named in one line), the version.

tmpl-lint installed without extras is pre-commit's environment for this repository
(conftest.py), built once per session.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import tomllib

import pytest
from click.testing import CliRunner
from conftest import needs_pre_commit
from helpers import CORPUS, PROJECT

from tmpl_lint import __version__
from tmpl_lint.cli import main

pytestmark = pytest.mark.no_fork(long=True)

README = (PROJECT / "README.md").read_text(encoding="utf-8")


def test_version_is_one_figure_everywhere():
    assert importlib.metadata.version("tmpl-lint") == __version__
    result = CliRunner().invoke(main, ["--version"])
    assert result.stdout == f"tmpl-lint, version {__version__}\n"


def test_every_extra_is_named_in_the_readme_with_what_it_installs():
    declared = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    rows = dict(re.findall(r"^\| `tmpl-lint\[(\w+)\]` \| ([^|]+) \|", README, re.MULTILINE))
    assert set(rows) == set(declared) - {"test"}
    for extra, packages in rows.items():
        if extra == "all":
            # every extra a user runs tmpl-lint with (not the docs or the test suite)
            (everything,) = declared["all"]
            assert set(everything.removeprefix("tmpl-lint[").removesuffix("]").split(",")) == set(declared) - {
                "all",
                "docs",
                "test",
            }
            continue
        names = [re.match(r"[\w.-]+", requirement).group(0).replace("_", "-") for requirement in declared[extra]]
        assert [name.strip().replace("_", "-") for name in packages.split(",")] == names


@needs_pre_commit
def test_quick_start_lints_the_corpus_without_extras(installed):
    command = re.search(r"```sh\npip install \. && (tmpl-lint [^\n]+)\n", README).group(1)
    assert command == "tmpl-lint corpus/"
    result = subprocess.run([str(installed / "tmpl-lint"), "corpus/"], cwd=PROJECT, capture_output=True, text=True)
    assert result.returncode == 1  # the corpus has problems on purpose, as the README says
    summary, fixable = result.stdout.splitlines()[-2:]
    assert re.fullmatch(r"Found \d+ findings \(\d+ failing(, \d+ not reproduced)?(, \d+ info)?\)\.", summary)
    assert re.fullmatch(r"\[\*\] \d+ fixable with --fix \(\d+ more with --unsafe-fixes\)", fixable)
    assert result.stderr == ""


@needs_pre_commit
def test_a_missing_extra_is_one_line_naming_it(installed, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "chat_template.jinja").write_bytes((CORPUS / "clean_chatml.jinja").read_bytes())
    audit = subprocess.run(
        [str(installed / "tmpl-lint"), "audit", str(model), "--no-cache", "--no-prove"], capture_output=True, text=True
    )
    assert audit.returncode == 2
    assert audit.stderr in {
        f"tmpl-lint: error: {module} is not installed; it comes with tmpl-lint[audit]: pip install 'tmpl-lint[audit]'\n"
        for module in ("rich", "huggingface_hub")
    }
    (tmp_path / "serving.py").write_text('chat_template = "{{ messages[0].content }}"\n')
    embedded = subprocess.run([str(installed / "tmpl-lint"), str(tmp_path / "serving.py")], capture_output=True, text=True)
    assert embedded.returncode == 2
    assert embedded.stderr == (
        f"tmpl-lint: error: {tmp_path / 'serving.py'}: reading templates from this file needs libcst: pip install 'tmpl-lint[fix]'\n"
    )


def test_the_readme_names_every_core_dependency():
    # "The base install brings ...": what `pip install .` installs, oss-harmony by its
    # package name (openai-harmony is the name users search for).
    declared = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["dependencies"]
    paragraph = re.search(r"^The base install brings (.+?)\n\n", README, re.MULTILINE | re.DOTALL).group(1)
    for requirement in declared:
        name = re.match(r"[\w.-]+", requirement).group(0)
        assert name in paragraph, f"{name} is a dependency the README's install section does not name"
