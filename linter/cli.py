"""The ``tmpl-lint`` command line."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from . import __version__
from .config import MAX_BLOCK_SIZE, MAX_SLOTS
from .engines.base import ENGINES
from .render import RenderLimits
from .report.github import github_report
from .report.json import json_report
from .report.output import write_report
from .report.progress import ProgressBar
from .report.sarif import sarif_report
from .report.statistics import statistics_json, statistics_report
from .report.text import text_report
from .rules import RULES, lookup, page
from .runner import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, CheckOptions, FixLine, FixMode, OptionsError, RunError, run_check
from .stopping import INTERRUPTED, TERMINATED, Terminated, stopped_by, terminated


class Interrupted(BaseException):
    """Ctrl-C on its way out of click's main(), past its handler: click answers a
    KeyboardInterrupt with a blank line on stderr (to end a terminal's ^C) before its Abort,
    and tmpl-lint says one line, "tmpl-lint: interrupted", whenever Ctrl-C lands."""


class DefaultCommandGroup(click.Group):
    """``tmpl-lint PATH...`` means ``tmpl-lint check PATH...``, as ``ruff PATH`` once did."""

    default_command = "check"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)

    # Parsing the arguments and running the command: all of main()'s time but a few lines.
    def make_context(self, *args, **kwargs) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt as interrupt:
            raise Interrupted from interrupt

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as interrupt:
            raise Interrupted from interrupt


@click.group(cls=DefaultCommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tmpl-lint")
def main() -> None:
    """Find and fix chat-template patterns that break the serving engine's prefix cache.

    `tmpl-lint PATH...` lints tokenizer_config.json, chat_template.jinja / .json, *.jinja
    files, model directories and directories of them.

    \b
    Example:
      tmpl-lint path/to/model/            # lint and prove
      tmpl-lint path/to/model/ --fix      # apply the safe fixes
    """


# An empty argument is Path(""), which is "." (a script's unset variable linted, or
# audited, the working directory): it names nothing, and is a usage error.
EMPTY_PATH = "an empty path names no file or folder (the working directory is '.')"


class NamedPath(click.Path):
    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value:
            self.fail(EMPTY_PATH, param, ctx)
        return super().convert(value, param, ctx)


class RepoOrFolder(click.ParamType):
    """An audit's argument: a repo id or a model folder, not empty."""

    name = "text"

    def convert(self, value, param, ctx):
        if not value:
            self.fail("an empty argument names no repo or folder (the working directory is '.')", param, ctx)
        return value


def file_path(**checks) -> click.Path:
    """click's Path without its readability check, which is a usage error that stops the
    whole batch: the code that reads a file says why it cannot, in one line, and the other
    inputs are still read. An empty path is a usage error."""
    return NamedPath(path_type=Path, readable=False, **checks)


class FiniteRange(click.FloatRange):
    """click's FloatRange, and a finite number: ``nan`` passes every bound click checks
    (it compares false with all of them), and ``inf`` passes one without a maximum."""

    name = "finite float range"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


# One --engine for every command that renders: check, diff, audit, render and replay.
ENGINE_HELP = (
    "What serves the model: vllm (vLLM 0.33.0), sglang (SGLang 0.5.23), llamacpp (llama.cpp b10775) or hf "
    "(transformers, no engine): its request handling, renderer, tokenization and cache model. "
    "A GGUF's template is rendered as llama.cpp renders it, under any engine but hf."
)
engine_option = click.option("--engine", type=click.Choice(list(ENGINES)), default="vllm", show_default=True, help=ENGINE_HELP)


# Bounded before parsing: json.loads recurses once per level, and a value parsed just under Python's recursion
# limit would overflow later when it is copied into each request.
MAX_JSON_NESTING = 64


def _json_nesting(text: str) -> int:
    """How deep JSON text nests arrays and objects (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


class JsonObject(click.ParamType):
    """A JSON object given on the command line, as vLLM's own flag takes it."""

    name = "JSON"

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        if _json_nesting(value) > MAX_JSON_NESTING:
            self.fail(f"is nested more than {MAX_JSON_NESTING} deep (template variables are shallow)", param, ctx)
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            self.fail(f"{value!r} is not JSON: {error.msg}", param, ctx)
        if not isinstance(parsed, dict):
            self.fail(f"{value!r} is not a JSON object", param, ctx)
        return parsed


server_kwargs_option = click.option(
    "--default-chat-template-kwargs",
    "server_kwargs",
    type=JsonObject(),
    help="The server's own --default-chat-template-kwargs: template variables every request "
    "gets unless it sets them (vLLM merges a request's chat_template_kwargs over them).",
)


config_option = click.option(
    "--config",
    "config_path",
    type=file_path(dir_okay=False),
    help="pyproject.toml or .tmpl-lint.yaml (default: the nearest).",
)


TEXT_FORMATS = ("concise", "full", "text")


def use_colour() -> bool:
    return "NO_COLOR" not in os.environ and sys.stdout.isatty()


@main.command()
@click.argument("paths", nargs=-1, required=True, type=file_path())
@click.option(
    "--output-format",
    "--format",
    "output_format",
    type=click.Choice(["concise", "full", "text", "json", "sarif", "github"]),
    default="concise",
    show_default=True,
    help="concise: a line per finding and one for its proof; full: the source line, both renders where the prompts "
    "part, related places and notes under each proof (as ruff's --output-format full); text is concise.",
)
@click.option("-o", "--output", type=file_path(dir_okay=False), help="Write the report to FILE instead of standard output.")
@click.option("--select", multiple=True, metavar="CODES", help="Codes or prefixes to enable (comma-separated).")
@click.option("--ignore", multiple=True, metavar="CODES", help="Codes or prefixes to disable (comma-separated).")
@config_option
@click.option("--statistics", is_flag=True, help="Print the number of findings per code.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option(
    "--strict/--no-strict",
    default=None,
    help="Findings the proof did not reproduce fail the run too (by default they are reported and do not); "
    "--no-strict overrides strict = true in the configuration.",
)
@click.option("-q", "--quiet", is_flag=True, help="Print findings only, without source lines, proofs or summary.")
@click.option("--no-prove", is_flag=True, help="Static lint only: do not render turn pairs to prove findings.")
@click.option(
    "--tokenizer",
    type=file_path(file_okay=False),
    help="Tokenizer directory for proofs (default: beside the template; else characters).",
)
@click.option(
    "--block-size",
    type=click.IntRange(1, MAX_BLOCK_SIZE),
    help="KV cache block size for reusable-token figures (default: the configuration's, else 16).",
)
@click.option(
    "--fix", "apply_fixes", is_flag=True, help="Rewrite templates with verified safe fixes (only the template changes)."
)
@click.option(
    "--unsafe-fixes/--no-unsafe-fixes",
    default=None,
    help="With --fix or --diff, make unsafe fixes too: those that change what the model sees (a frozen date, "
    "reasoning kept in history); --no-unsafe-fixes overrides unsafe-fixes = true in the configuration.",
)
@click.option("--diff", "show_diff", is_flag=True, help="Print the fixes as a unified diff; write nothing.")
@click.option(
    "--frozen-date",
    type=click.DateTime(["%Y-%m-%d"]),
    help="Date a fixed template renders instead of the clock (default: today).",
)
@click.option(
    "--render-timeout", type=FiniteRange(0.01, 3600), default=2.0, show_default=True, help="Seconds one render may take."
)
@click.option(
    "--render-max-bytes",
    type=click.IntRange(1, 1 << 32),
    default=1_000_000,
    show_default=True,
    help="Characters one render may print, and the largest string or list it may build with ~, + or *.",
)
@engine_option
@click.option(
    "--tool-args-style",
    type=click.Choice(["compact", "spaced"]),
    help='How the model writes tool-call arguments: compact ({"city":"Paris"}) or spaced ({"city": "Paris"}, '
    "as tojson writes them). PC004 is checked and proven against it, and --fix writes mappings that way "
    "(default: the configuration's tool-args-style, else compact).",
)
@click.option(
    "--jobs",
    type=click.IntRange(1),
    default=os.cpu_count() or 1,
    show_default=True,
    help="Processes at work at once: templates linted or proven, files fixed.",
)
@click.option(
    "--gguf-copy",
    type=NamedPath(readable=False),  # the text as given: a trailing / says a folder, which a Path forgets
    metavar="PATH",
    help="With --fix: also write a new GGUF with the fixed templates in its metadata, at PATH "
    "(a new file, or a folder for a copy under the model's name: one that exists, or one named with a trailing /, "
    "created); the model itself is never rewritten.",
)
@click.option("--no-cache", is_flag=True, help="Neither read nor write compiled templates in tmpl-lint's cache.")
@click.option(
    "--chat-template-kwargs",
    "--default-chat-template-kwargs",
    "chat_template_kwargs",
    type=JsonObject(),
    help="The deployment's template variables, as vLLM's --default-chat-template-kwargs: every request is proven "
    "with them, and only at those values (default: the configuration's chat-template-kwargs; without, every value "
    "of every switch the template reads is proven, and a break under any fails).",
)
def check(
    paths,
    output_format,
    output,
    select,
    ignore,
    config_path,
    statistics,
    exit_zero,
    strict,
    quiet,
    no_prove,
    tokenizer,
    block_size,
    apply_fixes,
    unsafe_fixes,
    show_diff,
    frozen_date,
    render_timeout,
    render_max_bytes,
    engine,
    tool_args_style,
    jobs,
    gguf_copy,
    no_cache,
    chat_template_kwargs,
) -> None:
    """Lint chat templates and prove each finding by rendering turn pairs.

    \b
    Example:
      tmpl-lint check path/to/model/ --diff --unsafe-fixes | git apply
    """
    if gguf_copy is not None and (not apply_fixes or show_diff):
        raise click.UsageError("--gguf-copy writes a fixed model: it needs --fix (and no --diff)")
    if statistics and output_format in ("sarif", "github"):
        raise click.UsageError(f"--statistics is not supported with --format {output_format} (use concise or json)")
    options = CheckOptions(
        paths=tuple(paths),
        select=select,
        ignore=ignore,
        config_path=config_path,
        strict=strict,
        exit_zero=exit_zero,
        quiet=quiet,
        prove=not no_prove,
        tokenizer=tokenizer,
        block_size=block_size,
        fix=FixMode.DIFF if show_diff else FixMode.WRITE if apply_fixes else FixMode.NONE,
        frozen_date=frozen_date.date() if frozen_date else None,
        limits=RenderLimits(render_timeout, render_max_bytes),
        engine=engine,
        tool_args_style=tool_args_style,
        chat_template_kwargs=chat_template_kwargs,
        jobs=jobs,
        gguf_copy=_copy_target(gguf_copy),
        cache=not no_cache,
        unsafe_fixes=unsafe_fixes,
    )
    # Standard output carries one thing a program can read: the report in a machine format,
    # else --diff's patch; what --fix says and the text report then go to standard error.
    machine = output_format not in TEXT_FORMATS and output is None

    def print_fix_line(line: FixLine) -> None:
        if line.patch:
            click.echo(line.text, nl=False, err=machine)
        else:
            click.echo(line.text, err=machine or show_diff)

    with command_errors():
        result = run_check(options, on_fix_line=print_fix_line)
    for warning in result.warnings:
        click.echo(f"tmpl-lint: warning: {warning}", err=True)
    for problem in result.errors:
        click.echo(f"tmpl-lint: error: {problem}", err=True)
    findings, strict = result.findings, result.strict
    colour = use_colour() and output is None
    if statistics:
        report = statistics_json(findings, strict) if output_format == "json" else statistics_report(findings, strict)
    elif output_format == "json":
        report = json_report(findings, strict)
    elif output_format == "sarif":
        report = sarif_report(findings, strict, result.errors)
    elif output_format == "github":
        report = github_report(findings, strict, result.errors)
    else:
        report = text_report(
            findings,
            result.notes,
            colour,
            quiet,
            strict,
            linted=len(result.linted),
            unread=result.unread,
            unwritten=result.unwritten,
            unapplied=result.would_change,
            full=output_format == "full",
            # pre-commit sets PRE_COMMIT=1 for its hooks: there a commit's output shows what
            # fails it, and informational findings are counted, not printed.
            hide_info=bool(os.environ.get("PRE_COMMIT")),
            fixed=result.fixed if result.fix is FixMode.WRITE else None,
            unsafe_fixes=result.unsafe_fixes,
        )
    if output is not None:
        from .writes import WriteError  # noqa: PLC0415 -- --output-file only

        try:
            write_report(output, report)
        except WriteError as error:
            click.echo(f"tmpl-lint: error: cannot write the report: {error}", err=True)
            sys.exit(EXIT_ERROR)
    else:
        click.echo(report, nl=False, color=colour, err=show_diff and not machine)
    sys.exit(result.status)


@main.command()
@click.argument("code")
def rule(code) -> None:
    """Print a rule's page: what it does, why it breaks the cache, examples, the fix.

    \b
    Example:
      tmpl-lint rule PC002
    """
    found = lookup(code)
    if found is None:
        click.echo(f"tmpl-lint: error: unknown rule {code!r} (see `tmpl-lint rules`)", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(page(found), nl=False)


@main.command()
def rules() -> None:
    """List every rule: code, name, default severity, its fix (safe or unsafe) and summary.

    \b
    Example:
      tmpl-lint rules
    """
    for rule in RULES:
        info = rule.RULE
        fix = f"{info.fix_safety}-fix" if info.fix_safety is not None else "-"
        click.echo(f"{info.code}  {info.name:28} {info.severity:8} {fix:10}  {info.summary}")


@main.command()
@click.argument("turn1", type=file_path(dir_okay=False))
@click.argument("turn2", type=file_path(dir_okay=False))
@click.option(
    "--tokenizer",
    type=file_path(file_okay=False),
    help="Tokenizer directory (its template is used unless --template).",
)
@click.option("--template", type=file_path(), help="Template file or model directory to render with.")
@click.option("--server", metavar="URL", help="Ask a running vLLM for the token ids (render endpoint).")
@click.option("--model", help="Served model name for --server (default: the only one served).")
@click.option(
    "--block-size", type=click.IntRange(1, MAX_BLOCK_SIZE), help="vLLM's block size (default: the configuration's, else 16)."
)
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@engine_option
@server_kwargs_option
@config_option
def diff(turn1, turn2, tokenizer, template, server, model, block_size, output_format, engine, server_kwargs, config_path) -> None:
    """Where two consecutive requests of a session diverge (first token, reusable blocks, cause).

    \b
    Example:
      tmpl-lint diff turn1.json turn2.json --tokenizer path/to/model
    """
    from .commands import DiffOptions, run_diff  # noqa: PLC0415 -- a command's pipeline: not for check or --help
    from .diff import client_change, diff_text, dumps  # noqa: PLC0415 -- a command's pipeline: not for check or --help

    options = DiffOptions(turn1, turn2, template, tokenizer, server, model, block_size, engine, config_path, server_kwargs)
    with command_errors():
        divergence, rendered_by = run_diff(options, note_on_stderr)
    change = client_change(turn1, turn2)
    if output_format == "json":
        click.echo(dumps(divergence, change, None if server else rendered_by), nl=False)
    else:
        # Which engine rendered the two requests, as replay names it (its JSON's "engine").
        click.echo(diff_text(divergence, change) + f"requests as {rendered_by} renders them\n", nl=False)
    sys.exit(EXIT_CLEAN if divergence.first_divergence is None else EXIT_FINDINGS)


@main.command()
@click.argument("request", type=file_path(dir_okay=False))
@click.option("--template", type=file_path(), help="Template file, tokenizer_config.json (its bos/eos too) or model directory.")
@click.option(
    "--tokenizer", type=file_path(file_okay=False), help="Tokenizer directory (its template is used unless --template)."
)
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@engine_option
@server_kwargs_option
@config_option
def render(request, template, tokenizer, output_format, engine, server_kwargs, config_path) -> None:
    """What the engine would feed the model for a chat-completions REQUEST: the prompt text
    and token ids, or the engine's refusal (exit 2). The offline twin of vLLM's
    /v1/chat/completions/render.

    \b
    Example:
      tmpl-lint render request.json --tokenizer path/to/model --engine sglang
    """
    from .commands import Refused, RenderOptions, run_render  # noqa: PLC0415 -- a command's pipeline: not for check or --help

    options = RenderOptions(request, template, tokenizer, engine, config_path, server_kwargs)
    with command_errors(Refused):
        rendered = run_render(options, note_on_stderr)
    if output_format == "json":
        click.echo(json.dumps(rendered.to_json(), ensure_ascii=False))
    else:
        # The prompt as it is, then one line saying whose render it is, then its token ids.
        click.echo(rendered.text, nl=not rendered.text.endswith("\n"))
        if rendered.token_ids is None:
            click.echo(f"--- {rendered.engine}; no token ids without --tokenizer ---")
        else:
            click.echo(f"--- {rendered.engine}: {len(rendered.token_ids)} tokens ---")
            click.echo(json.dumps(rendered.token_ids))
    sys.exit(EXIT_CLEAN)


@main.command()
@click.argument("log", type=file_path(dir_okay=False))
@click.option(
    "--server",
    metavar="URL",
    required=True,
    help="A running vLLM (its /v1/chat/completions/render), or llama-server with --engine llamacpp (its /apply-template).",
)
@click.option("--model", help="Served model name (default: the request's if served, else the only one served).")
@click.option("--template", type=file_path(), help="Template file, tokenizer_config.json or model directory.")
@click.option(
    "--tokenizer", type=file_path(file_okay=False), help="Tokenizer directory (its template is used unless --template)."
)
@click.option(
    "--deadline",
    type=FiniteRange(0, 86400, min_open=True),
    default=600,
    show_default=True,
    help="Seconds for the whole run; requests not asked by then are said.",
)
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@engine_option
@server_kwargs_option
@config_option
def validate(log, server, model, template, tokenizer, deadline, output_format, engine, server_kwargs, config_path) -> None:
    """Send each request of LOG to a running engine's render endpoint and compare its token
    ids with the offline profile: the agreement, and the first disagreements with their
    places. How to check tmpl-lint's model against your own engine version.

    \b
    Example:
      tmpl-lint validate traffic.jsonl --server http://localhost:8000 --tokenizer path/to/model
    """
    from .commands import ValidateOptions, run_validate  # noqa: PLC0415 -- a command's pipeline: not for check or --help
    from .validate import text_report, to_json  # noqa: PLC0415 -- a command's pipeline: not for check or --help

    options = ValidateOptions(log, server, template, tokenizer, engine, model, deadline, config_path, server_kwargs)
    with command_errors():
        result = run_validate(options, note_on_stderr)
    for problem in result.problems:
        click.echo(f"tmpl-lint: error: {problem}", err=True)
    if output_format == "json":
        click.echo(json.dumps(to_json(result.validation, result.decode), indent=2))
    else:
        click.echo(text_report(result.validation, str(log), result.decode), nl=False)
    sys.exit(result.status)


@main.command()
@click.argument("specs", nargs=-1, type=RepoOrFolder())
@click.option("--from-file", type=file_path(dir_okay=False), help="Repo ids, one a line.")
@click.option("--search", help="Hub search query (huggingface_hub list_models).")
@click.option("--author", help="Every model of this organisation or user.")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True, help="How many models --search/--author lists.")
@click.option("--from-cache", is_flag=True, help="Every model in the local Hugging Face cache.")
@click.option(
    "--jobs", type=click.IntRange(1), default=os.cpu_count() or 1, show_default=True, help="Templates analysed at once."
)
@click.option("--tokens", is_flag=True, help="Also fetch tokenizer.json and measure in tokens.")
@click.option("--no-prove", is_flag=True, help="Static lint only.")
@click.option("--no-dedupe", is_flag=True, help="Analyse identical templates again for every repo (for benchmarks).")
@click.option(
    "--cache-file",
    type=file_path(dir_okay=False),
    help="Results cache (default: ~/.cache/tmpl-lint/audit.jsonl).",
)
@click.option("--no-cache", is_flag=True, help="Neither read nor write the results cache nor compiled templates.")
@click.option(
    "--format", "output_format", type=click.Choice(["table", "json", "jsonl", "markdown"]), default="table", show_default=True
)
@click.option("--html", "html_file", type=file_path(dir_okay=False), help="Also write a self-contained HTML report.")
@engine_option
@config_option
def audit(
    specs,
    from_file,
    search,
    author,
    limit,
    from_cache,
    jobs,
    tokens,
    no_prove,
    no_dedupe,
    cache_file,
    no_cache,
    output_format,
    html_file,
    engine,
    config_path,
) -> None:
    """Audit Hugging Face model repos (org/name[@revision]), cached models or local model folders.

    \b
    Example:
      tmpl-lint audit Qwen/Qwen3-8B --tokens
    """
    from .commands import AuditOptions, run_audit  # noqa: PLC0415 -- a command's pipeline: not for check or --help
    from .report.audit import html_page, print_audit  # noqa: PLC0415 -- a command's pipeline: not for check or --help

    options = AuditOptions(
        repo_ids=tuple(spec for spec in specs if not Path(spec).is_dir()),
        local=tuple(Path(spec) for spec in specs if Path(spec).is_dir()),
        from_file=from_file,
        search=search,
        author=author,
        limit=limit,
        from_cache=from_cache,
        jobs=jobs,
        tokens=tokens,
        prove=not no_prove,
        dedupe=not no_dedupe,
        cache_file=cache_file,
        use_cache=not no_cache,
        engine=engine,
        config_path=config_path,
    )
    with command_errors(), ProgressBar("analysing templates", None) as bar:
        run = run_audit(options, bar.advance)
    result, table = run.audit, run.rows
    # Where every repo is an error, its line says all there is: no table of errors, nor a
    # line saying no template was found (the machine-read formats still print their rows).
    only_errors = bool(result.repos) and all(repo.error for repo in result.repos)
    if not (only_errors and output_format == "table"):
        print_audit(result, table, output_format)
    for repo in result.repos:
        if repo.error:
            click.echo(f"tmpl-lint: error: {repo.repo}: {repo.error}", err=True)
        elif repo.warning:
            click.echo(f"tmpl-lint: warning: {repo.repo}: {repo.warning}", err=True)
    for problem in run.cache_problems:
        click.echo(f"tmpl-lint: error: {problem}", err=True)
    status = run.status
    if html_file:
        from .writes import WriteError  # noqa: PLC0415 -- --html only

        try:
            write_report(html_file, html_page(table))
        except WriteError as error:
            click.echo(f"tmpl-lint: error: cannot write the report: {error}", err=True)
            status = EXIT_ERROR
    if not result.analyses and not only_errors:
        audited = len(result.repos)
        click.echo(
            f"tmpl-lint: error: no chat template found in the {audited} {'repo' if audited == 1 else 'repos'} audited", err=True
        )
    sys.exit(status)


@main.command()
@click.argument("log", type=file_path(dir_okay=False))
@click.option(
    "--tokenizer",
    type=file_path(file_okay=False),
    help="Tokenizer directory (its template is used unless --template).",
)
@click.option("--template", type=file_path(), help="Template file or model directory.")
@click.option("--compare", type=file_path(), help="A second template (a --fix output, say), replayed on the same cache.")
@click.option("--session-key", help="Field naming the session (e.g. user, metadata.session_id); default: prefix continuity.")
@click.option("--server", metavar="URL", help="Token ids from a running vLLM's render endpoint.")
@click.option("--model", help="Served model name for --server.")
@click.option(
    "--engine",
    type=click.Choice(list(ENGINES)),
    help=ENGINE_HELP + " Default: vllm, or sglang with --cache-model sglang.",
)
@click.option(
    "--cache-model",
    type=click.Choice(["vllm", "sglang", "llamacpp", "openai", "anthropic", "gemini", "deepseek"]),
    help="Whose KV cache to replay: vLLM's block pool, SGLang's radix tree, llama.cpp's slots, or a hosted API's "
    "prompt cache by its published rules (openai, anthropic, gemini, deepseek). "
    "Default: the engine's (--cache-model sglang alone also means SGLang's request handling).",
)
@click.option(
    "--api-model",
    help="The hosted model, for its minimum cacheable prompt (anthropic: claude-sonnet-4-5...; gemini: gemini-2.5-flash...).",
)
@click.option(
    "--cache-ttl",
    type=FiniteRange(0, 365 * 86400, min_open=True),
    help="Seconds a hosted API's cache lives after its last use (openai: 300 by default; gemini, deepseek: no expiry).",
)
@click.option(
    "--cluster",
    metavar="ADDRESS",
    envvar="TMPL_LINT_CLUSTER",
    help="A Dask scheduler (tcp://host:8786; or TMPL_LINT_CLUSTER): sessions rendered and pools simulated on its "
    "workers. Needs tmpl-lint[cluster]. Default: this machine.",
)
@click.option(
    "--block-size", type=click.IntRange(1, MAX_BLOCK_SIZE), help="vLLM's block size (default: the configuration's, else 16)."
)
@click.option(
    "--cache-blocks",
    metavar="N[,N...]",
    help="Pool size in vLLM blocks (num_gpu_blocks, null block included); several sizes: the hit-rate curve. Default: unbounded.",
)
@click.option(
    "--kv-cache-gib",
    # At most a pebibyte: any more is no engine's, and its tokens would overflow a float.
    type=FiniteRange(0, 1 << 20, min_open=True),
    help="KV-cache memory of the engine instead: blocks = GiB * 2^30 / (block size * bytes per token).",
)
@click.option(
    "--model-config",
    type=file_path(dir_okay=False),
    help="The model's config.json: its KV-cache groups (sliding-window, Mamba layers) and the bytes per token of --kv-cache-gib.",
)
@click.option("--num-layers", type=click.IntRange(1), help="Layers, for --kv-cache-gib (overrides --model-config).")
@click.option("--num-kv-heads", type=click.IntRange(1), help="KV heads, for --kv-cache-gib (overrides --model-config).")
@click.option("--head-dim", type=click.IntRange(1), help="Head dimension, for --kv-cache-gib (overrides --model-config).")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="vLLM's --kv-cache-dtype (auto: the model's dtype).")
@click.option("--page-size", type=click.IntRange(1), default=1, show_default=True, help="SGLang's page size.")
@click.option(
    "--slots",
    type=click.IntRange(1, MAX_SLOTS),
    help="llama.cpp: slots the sessions share (--parallel); default one per session.",
)
@click.option("--cache-reuse", type=click.IntRange(0), default=0, show_default=True, help="llama.cpp's --cache-reuse N.")
@click.option(
    "--jobs",
    type=click.IntRange(1),
    default=os.cpu_count() or 1,
    show_default=True,
    help="Sessions rendered, and fleet replicas simulated, at once.",
)
@click.option(
    "--replicas", type=click.IntRange(1, 4096), default=1, show_default=True, help="Engine replicas, each its own cache."
)
@click.option(
    "--router",
    type=click.Choice(["round-robin", "session", "prefix", "kv"]),
    help="How requests reach the --replicas: in turn (default), by session, llm-d's prefix scorer, Dynamo's KV router.",
)
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "--html",
    "html_file",
    type=file_path(dir_okay=False),
    help="Page with the hit-rate curve and the tokens the worst sessions lost.",
)
@server_kwargs_option
@config_option
def replay(
    log,
    tokenizer,
    template,
    compare,
    session_key,
    server,
    model,
    engine,
    cache_model,
    api_model,
    cache_ttl,
    cluster,
    block_size,
    cache_blocks,
    kv_cache_gib,
    model_config,
    num_layers,
    num_kv_heads,
    head_dim,
    kv_cache_dtype,
    page_size,
    slots,
    cache_reuse,
    jobs,
    replicas,
    router,
    output_format,
    html_file,
    server_kwargs,
    config_path,
) -> None:
    """Prefix-cache hit rate of logged traffic as the engine would report it, and why every
    recomputed token was recomputed; before and after a fix.

    \b
    Example:
      tmpl-lint replay traffic.jsonl --tokenizer path/to/model --compare fixed/chat_template.jinja
    """
    from .commands import ReplayOptions, run_replay  # noqa: PLC0415 -- a command's pipeline: not for check or --help
    from .replay.simulate import text_report as replay_text  # noqa: PLC0415 -- a command's pipeline: not for check or --help

    options = ReplayOptions(
        log,
        template,
        compare=compare,
        tokenizer=tokenizer,
        session_key=session_key,
        server=server,
        model=model,
        engine=engine,
        cache_model=cache_model,
        api_model=api_model,
        cache_ttl=cache_ttl,
        cluster=cluster,
        block_size=block_size,
        cache_blocks=cache_blocks,
        kv_cache_gib=kv_cache_gib,
        model_config=model_config,
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        kv_cache_dtype=kv_cache_dtype,
        page_size=page_size,
        slots=slots,
        cache_reuse=cache_reuse,
        jobs=jobs,
        replicas=replicas,
        router=router,
        config_path=config_path,
        server_kwargs=server_kwargs,
    )
    with command_errors():
        result = run_replay(options, note_on_stderr)
    for problem in result.problems:
        click.echo(f"tmpl-lint: error: {problem}", err=True)
    if output_format == "json":
        click.echo(json.dumps({label: summary.to_json() for label, summary in result.summaries}, indent=2))
    else:
        click.echo(replay_text(result.summaries), nl=False)
    if html_file:
        from .report.replay import html_report  # noqa: PLC0415 -- --html only
        from .writes import WriteError  # noqa: PLC0415 -- --html only

        try:
            write_report(html_file, html_report(result.named(), str(log), options.described()))
        except WriteError as error:
            click.echo(f"tmpl-lint: error: cannot write the page: {error}", err=True)
            sys.exit(EXIT_ERROR)
    sys.exit(result.status)


def _copy_target(given: str | None):
    if given is None:
        return None
    from .gguf.writing import CopyTarget  # noqa: PLC0415 -- GGUF writing: --gguf-copy only

    return CopyTarget.given(given)


@contextlib.contextmanager
def command_errors(*also: type[Exception]) -> Iterator[None]:
    """A command's run: its usage errors as click's (exit 2 with the usage), a run error (or
    one of ``also``) as one error line and exit 2."""
    failures: tuple[type[Exception], ...] = (RunError, *also)
    try:
        yield
    except OptionsError as error:
        raise click.UsageError(str(error)) from None
    except failures as error:
        click.echo(f"tmpl-lint: error: {error}", err=True)
        sys.exit(EXIT_ERROR)


def note_on_stderr(text: str) -> None:
    click.echo(f"tmpl-lint: note: {text}", err=True)


def run() -> None:
    """The command: every failure ends in a one-line message and exit 2, never a traceback;
    Ctrl-C says "interrupted" and exits 130, SIGTERM says "terminated" and exits 143, once
    temporary files are gone and children stopped (the entry point, ``__main__.run``,
    handles both before this module is loaded)."""
    # Text from a template or a request can hold a lone surrogate, which no terminal
    # encoding can print: it is shown escaped rather than ending the run.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    # As __main__.run does first: again here for a console script made before that was the
    # entry point (an editable install not redone), which still calls this function.
    signal.signal(signal.SIGTERM, terminated)
    try:
        status = main(standalone_mode=False)
    except (KeyboardInterrupt, Interrupted, click.exceptions.Abort):
        click.echo(f"tmpl-lint: {INTERRUPTED.word}", err=True)
        sys.exit(INTERRUPTED.status)
    except Terminated:
        click.echo(f"tmpl-lint: {TERMINATED.word}", err=True)
        sys.exit(TERMINATED.status)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except SystemExit:
        raise
    except Exception as error:  # noqa: BLE001 - the last line of defence for users
        if (stop := stopped_by(error)) is not None:  # a RuntimeError, on Python 3.11 (see stopped_by)
            click.echo(f"tmpl-lint: {stop.word}", err=True)
            sys.exit(stop.status)
        if os.environ.get("TMPL_LINT_DEBUG"):
            raise
        if isinstance(error, ModuleNotFoundError):
            from .extras import missing_message  # noqa: PLC0415 -- an error's path only

            # An optional part not installed: which extra installs it.
            message = missing_message(error)
            if message is not None:
                click.echo(f"tmpl-lint: error: {message}", err=True)
                sys.exit(EXIT_ERROR)
        click.echo(
            f"tmpl-lint: internal error: {type(error).__name__}: {error} (TMPL_LINT_DEBUG=1 shows the traceback)", err=True
        )
        sys.exit(EXIT_ERROR)
    sys.exit(status if isinstance(status, int) else EXIT_CLEAN)
