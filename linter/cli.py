"""The ``tmpl-lint`` command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from . import __version__
from .checker import Selection, SelectionError, lint_source
from .reporters import json_report, statistics_report, text_report
from .sources import collect

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class DefaultCommandGroup(click.Group):
    """``tmpl-lint PATH...`` means ``tmpl-lint check PATH...``, as ``ruff PATH`` once did."""

    default_command = "check"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


@click.group(cls=DefaultCommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tmpl-lint")
def main() -> None:
    """Find and fix chat-template patterns that break the serving engine's prefix cache.

    `tmpl-lint PATH...` lints tokenizer_config.json, chat_template.jinja / .json, *.jinja
    files, model directories and directories of them.
    """


def use_colour() -> bool:
    return "NO_COLOR" not in os.environ and sys.stdout.isatty()


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--select", multiple=True, metavar="CODES", help="Codes or prefixes to enable (comma-separated).")
@click.option("--ignore", multiple=True, metavar="CODES", help="Codes or prefixes to disable (comma-separated).")
@click.option("--statistics", is_flag=True, help="Print the number of findings per code.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("-q", "--quiet", is_flag=True, help="Print findings only, without source lines or summary.")
def check(paths, output_format, select, ignore, statistics, exit_zero, quiet) -> None:
    """Lint chat templates."""
    try:
        selection = Selection.parse(list(select), list(ignore))
    except SelectionError as error:
        raise click.UsageError(str(error)) from None
    sources, errors = collect(list(paths))
    findings = []
    notes = []
    for source in sources:
        if source.note:
            notes.append(f"{source.path.parent}: {source.note}")
        findings.extend(lint_source(source, selection))
    for error in errors:
        click.echo(f"tmpl-lint: error: {error}", err=True)
    if statistics:
        click.echo(statistics_report(findings), nl=False)
    elif output_format == "json":
        click.echo(json_report(findings), nl=False)
    else:
        colour = use_colour()
        click.echo(text_report(findings, notes, colour, quiet), nl=False, color=colour)
    if errors:
        sys.exit(EXIT_ERROR)
    sys.exit(EXIT_FINDINGS if findings and not exit_zero else EXIT_CLEAN)


def run() -> None:
    """Entry point: every failure ends in a one-line message and exit 2, never a traceback."""
    try:
        main(standalone_mode=True)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        click.echo("tmpl-lint: interrupted", err=True)
        sys.exit(130)
    except Exception as error:  # noqa: BLE001 - the last line of defence for users
        if os.environ.get("TMPL_LINT_DEBUG"):
            raise
        click.echo(f"tmpl-lint: internal error: {type(error).__name__}: {error} (TMPL_LINT_DEBUG=1 shows the traceback)", err=True)
        sys.exit(EXIT_ERROR)
