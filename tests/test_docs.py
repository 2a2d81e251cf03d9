"""The documentation says what the program says: the site's rule pages are what
`tmpl-lint rule CODE` prints, its command-line page is what `--help` prints, the README's
rule table is the registry, and the configuration page names every key the loader takes.

The CLI's output is the truth the built site is compared with: the installed console script
in a subprocess for the help pages and the rules' list (click wraps help to the terminal it
finds, which click's test runner fixes at 80 columns), and click's runner in this process
for the rule pages, each printed whole as the registry's page, at no width.
The site is built for real (`mkdocs build --strict`), once for the module; without mkdocs
(the `docs` extra) these tests skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import PROJECT

from tmpl_lint.cli import main
from tmpl_lint.config import KEYS
from tmpl_lint.rules import RULES

pytest.importorskip("mkdocs", reason="the docs extra (mkdocs-material) is not installed")
pytest.importorskip("material", reason="the docs extra (mkdocs-material) is not installed")

# The installed console script, as a user runs it (its help names the program `tmpl-lint`).
TMPL_LINT = [shutil.which("tmpl-lint", path=os.path.dirname(sys.executable)) or shutil.which("tmpl-lint") or "tmpl-lint"]


def cli(*args: str) -> str:
    """What the installed tmpl-lint prints on an 80-column terminal."""
    result = subprocess.run([*TMPL_LINT, *args], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as CI builds it: strict, so a broken link or a missing page fails."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def article(page: Path) -> str:
    """The body of a built page: what the theme puts in its <article>, around the content."""
    built = page.read_text(encoding="utf-8")
    return re.search(r'<article class="md-content__inner md-typeset">(.*?)</article>', built, re.DOTALL).group(1).strip()


@pytest.fixture(scope="module")
def to_html():
    """Markdown as this site's configuration renders it (its extensions and their settings)."""
    import markdown
    from mkdocs.config import load_config

    config = load_config(str(PROJECT / "mkdocs.yml"))
    return lambda text: markdown.Markdown(extensions=config.markdown_extensions, extension_configs=config.mdx_configs).convert(
        text
    )


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.RULE.code)
def test_each_rule_page_of_the_site_is_what_tmpl_lint_rule_prints(site, to_html, rule):
    result = CliRunner().invoke(main, ["rule", rule.RULE.code])
    assert (result.exit_code, result.stderr) == (0, "")
    printed = result.stdout
    assert printed.startswith(f"# {rule.RULE.name} ({rule.RULE.code})\n")
    built = article(site / "rules" / rule.RULE.code / "index.html")
    # the page's whole body is the CLI's text, rendered: nothing added, left out or changed
    assert built == to_html(printed).strip()


def test_the_installed_script_prints_a_rule_page_as_the_runner_reads_it():
    # The page with the most characters outside ASCII: what a process's own standard output
    # would have to encode.
    from tmpl_lint.rules import page

    rule = max(RULES, key=lambda rule: sum(not character.isascii() for character in page(rule)))
    assert cli("rule", rule.RULE.code) == CliRunner().invoke(main, ["rule", rule.RULE.code]).stdout


def test_the_rules_index_lists_the_registry_and_links_every_page(site):
    built = (site / "rules" / "index.html").read_text(encoding="utf-8")
    rows = re.findall(r'<tr>\s*<td><a href="([^"]+)">(PC\d{3})</a></td>\s*<td>([^<]+)</td>', built)
    assert [(code, name) for _, code, name in rows] == [(rule.RULE.code, rule.RULE.name) for rule in RULES]
    for href, code, _ in rows:
        assert href == f"{code}/"
    listed = [line.split()[:2] for line in cli("rules").splitlines()]
    assert listed == [[code, name] for _, code, name in rows]


def test_the_command_line_page_is_each_commands_help(site, to_html):
    built = (site / "cli" / "index.html").read_text(encoding="utf-8")
    for name in [None, *main.commands]:
        printed = cli(*([name] if name else []), "--help")
        assert to_html(f"```text\n{printed}```") in built, f"tmpl-lint {name or ''} --help"


def test_the_configuration_page_documents_every_key_the_loader_takes():
    text = (PROJECT / "docs" / "configuration.md").read_text(encoding="utf-8")
    documented = re.findall(r"^\| `([a-z-]+)` \|", text, re.MULTILINE)
    assert sorted(documented) == sorted(KEYS)


def test_the_readme_keeps_no_rule_table_by_hand():
    # Adding a rule is its module, fixture and test: the rule list a reader sees is generated
    # (the site's Rules section, `tmpl-lint rules`), never a table to keep in step.
    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    assert not re.findall(r"^\| PC\d{3} \|", readme, re.MULTILINE)
    assert "`tmpl-lint rules`" in readme


def test_the_readme_starts_with_the_two_commands():
    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    assert readme.startswith(
        '# tmpl-lint\n\n```sh\npip install . && tmpl-lint corpus/\npip install -e ".[test]" && python -m pytest\n```\n'
    )
