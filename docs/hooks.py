"""MkDocs hook: the pages that are generated, not written.

The rule pages are ``tmpl_lint.rules.page(rule)`` for every rule in the registry, the text
``tmpl-lint rule CODE`` prints; the rules' index is the registry's table; the command-line
reference is each command's ``--help``. Nothing generated is written into ``docs/``: the
pages exist only in the build, so they cannot drift from the code (tests/test_docs.py
compares them with the installed CLI's output).
"""

from __future__ import annotations

import click
from mkdocs.structure.files import File

from tmpl_lint.cli import main
from tmpl_lint.rules import RULES, page

RULES_NAV_TITLE = "Rules"
# The width click wraps help to on an 80-column terminal: min(columns, 80) - 2.
HELP_WIDTH = 78


def rule_path(rule) -> str:
    return f"rules/{rule.RULE.code}.md"


def rules_index() -> str:
    """Every rule with its name, default severity, whether it has a fix, and its summary."""
    lines = [
        "# Rules",
        "",
        "Every rule tmpl-lint has, as `tmpl-lint rules` lists them. Each page is the text "
        "`tmpl-lint rule CODE` prints. Proofs decide what fails a run: see [Proofs and verdicts](../proofs.md).",
        "",
        "| code | name | severity | fix | what it flags |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rule in RULES:
        info = rule.RULE
        fix = "yes" if rule.fix is not None else ""
        lines.append(f"| [{info.code}]({info.code}.md) | {info.name} | {info.severity} | {fix} | {info.summary} |")
    return "\n".join(lines) + "\n"


def command_help(name: str | None) -> str:
    """``tmpl-lint [NAME] --help`` as click prints it on an 80-column terminal."""
    root = click.Context(main, info_name="tmpl-lint", terminal_width=HELP_WIDTH, **main.context_settings)
    if name is None:
        return main.get_help(root) + "\n"
    command = main.commands[name]
    context = click.Context(command, info_name=name, parent=root, terminal_width=HELP_WIDTH)
    return command.get_help(context) + "\n"


def cli_reference() -> str:
    sections = [
        "# Command line",
        "",
        "Each command's `--help`, generated from the command itself when this site was built. "
        "`tmpl-lint PATH...` is `tmpl-lint check PATH...`. Settings that a configuration file can hold "
        "are in [Configuration](configuration.md).",
        "",
        "## tmpl-lint",
        "",
        "```text",
        command_help(None) + "```",
    ]
    for name in main.commands:
        sections += ["", f"## tmpl-lint {name}", "", "```text", command_help(name) + "```"]
    return "\n".join(sections) + "\n"


def generated_pages() -> dict[str, str]:
    """Path under docs/ -> Markdown, for every generated page."""
    pages = {"rules/index.md": rules_index(), "cli.md": cli_reference()}
    pages.update({rule_path(rule): page(rule) for rule in RULES})
    return pages


def on_config(config):
    """The Rules section of the navigation: the index, then one page per rule."""
    entries = [{"All rules": "rules/index.md"}] + [{f"{rule.RULE.code} {rule.RULE.name}": rule_path(rule)} for rule in RULES]
    for position, item in enumerate(config.nav or []):
        if isinstance(item, dict) and RULES_NAV_TITLE in item:
            config.nav[position] = {RULES_NAV_TITLE: entries}
    return config


def on_files(files, config):
    for path, text in generated_pages().items():
        files.append(File.generated(config, path, content=text))
    return files
