"""What the commands do, without printing any of it: the CLI parses its options into an
options object, calls the runner and prints what comes back.

``run_check`` (``tmpl-lint check``) reads the configuration, collects the templates, fixes
them (``--fix`` writes, ``--diff`` only shows), lints and proves each in its own limited
process, and returns a ``CheckResult``: the findings of each template, what the fixes said,
the inputs it could not read and the exit status. ``run_diff``, ``run_replay`` and
``run_audit`` do the work of ``tmpl-lint diff``, ``replay`` and ``audit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checker import ProveOptions, lint_isolated, lint_many_isolated, ready_to_fork
from .config import Config, ConfigError, find_config, load_config
from .findings import Finding
from .progress import ProgressBar
from .render import DEFAULT_LIMITS, RenderLimits
from .selection import Selection, SelectionError
from .sources import TemplateSource, collect
from .tokenizer import TokenizerError

if TYPE_CHECKING:
    from .audit import Audit
    from .fixer import FixOptions, TemplateFix
    from .proofs import Divergence
    from .replay import Summary

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class RunError(Exception):
    """The run cannot start (a configuration or tokenizer that cannot be read): one line."""


class OptionsError(RunError):
    """Options that contradict each other, or the paths they are given: a usage error."""


class FixMode(Enum):
    NONE = "none"
    WRITE = "write"  # --fix
    DIFF = "diff"  # --diff: the patch is shown, nothing is written


@dataclass(frozen=True)
class CheckOptions:
    """``tmpl-lint check``'s options; None where the configuration file decides."""

    paths: tuple[Path, ...]
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    config_path: Path | None = None  # None: the nearest configuration to the working directory
    strict: bool = False
    exit_zero: bool = False
    quiet: bool = False
    prove: bool = True
    tokenizer: Path | None = None
    block_size: int | None = None
    fix: FixMode = FixMode.NONE
    frozen_date: date | None = None
    limits: RenderLimits = DEFAULT_LIMITS
    engine: str = "vllm"
    tool_args_style: str | None = None
    jobs: int = 1
    gguf_copy: Path | None = None


@dataclass(frozen=True)
class FixLine:
    """One thing the fixes have to say, in order: a message (fixed, would fix, not fixed,
    what was written where) or, with ``patch``, a file's unified diff."""

    text: str
    patch: bool = False


@dataclass
class LintedSource:
    source: TemplateSource  # as the lint read it: after --fix, the template as written
    findings: list[Finding]


@dataclass
class CheckResult:
    linted: list[LintedSource] = field(default_factory=list)
    fix_lines: list[FixLine] = field(default_factory=list)
    would_change: bool = False  # --diff: some file would change
    errors: list[str] = field(default_factory=list)  # inputs not read or not written; the run went on
    warnings: list[str] = field(default_factory=list)
    strict: bool = False  # as the options and the configuration decide it
    exit_zero: bool = False

    @property
    def findings(self) -> list[Finding]:
        return [finding for linted in self.linted for finding in linted.findings]

    @property
    def notes(self) -> list[str]:
        return [f"{linted.source.path.parent}: {linted.source.note}" for linted in self.linted if linted.source.note]

    @property
    def status(self) -> int:
        """2 when an input could not be read or written; else, as ruff, 1 when a finding
        fails the run (the proof decides: Finding.verdict) or --diff would change a file."""
        if self.errors:
            return EXIT_ERROR
        failing = any(finding.fails(self.strict) for finding in self.findings)
        return EXIT_FINDINGS if (failing and not self.exit_zero) or self.would_change else EXIT_CLEAN


def run_check(options: CheckOptions, on_fix_line: Callable[[FixLine], None] | None = None) -> CheckResult:
    """Fix, lint and prove the templates under ``options.paths``. ``on_fix_line`` hears each
    fix line as it is decided, before the proofs run: an interrupted run has told what it
    wrote. Raises OptionsError or RunError when the run cannot start."""
    config = _config(options.config_path)
    try:
        root = config.path.parent if config.path else None
        selection = Selection.parse(
            list(options.select) or config.select, list(options.ignore) or config.ignore, config.per_file_ignores, root
        )
    except SelectionError as error:
        raise OptionsError(str(error)) from None
    tokenizer = options.tokenizer or config.tokenizer
    block_size = options.block_size or config.block_size or 16
    result = CheckResult(strict=options.strict or config.strict, exit_zero=options.exit_zero)
    prove = ProveOptions(tokenizer, block_size, options.limits, options.engine) if options.prove else None
    if prove is not None and tokenizer is not None:
        from .tokenizer import load_tokenizer

        try:
            # Once, here: a bad directory is the caller's mistake, not each template's, and
            # the processes that prove each template inherit it loaded.
            load_tokenizer(tokenizer)
        except TokenizerError as error:
            raise RunError(str(error)) from None
    sources, errors = collect(list(options.paths))
    result.errors = [str(error) for error in errors]
    gguf_copy = options.gguf_copy
    if gguf_copy is not None and not gguf_copy.is_dir() and len({s.path for s in sources if s.container == "gguf"}) > 1:
        raise OptionsError("--gguf-copy names one file, and several GGUF models are given: name a directory")
    if not sources and not errors:
        result.warnings.append("no chat templates found in the given paths")
    fixing = None
    if options.fix is not FixMode.NONE:
        from .fixer import FixOptions

        frozen = options.frozen_date or config.frozen_date or datetime.now().date()
        fix_options = FixOptions(frozen, tokenizer, block_size, options.tool_args_style, options.engine, options.limits)
        fixing = _Fixing(fix_options, selection, options.fix is FixMode.WRITE, options.quiet, gguf_copy, result, on_fix_line)
    # Templates are untrusted code: each is fixed, parsed, analysed (and proven) in a limited
    # process, several at once. The processes are long-lived workers that serve the fixes
    # and then the lint (a fork per template cost a small template as much as its proof,
    # and started it with cold caches); what every one of them needs is made ready before
    # the first is forked: the tokenizers the proofs measure with, and openai-harmony's
    # vocabulary (loaded once here, not by each worker that proves a gpt-oss template).
    if prove and tokenizer is None:
        from .gguf import preload_tokenizers

        preload_tokenizers(sources)
    ready_to_fork(sources, prove)
    from .isolation import long_lived_workers, parallel_map

    with long_lived_workers():
        if fixing is not None:
            sources = fixing.run(sources)
        if prove:

            def proven(source):
                found = lint_isolated(source, selection, prove)
                bar.advance()
                return found

            with ProgressBar("proving templates", len(sources)) as bar:
                found_by_source = parallel_map(proven, sources, options.jobs)
        else:
            found_by_source = lint_many_isolated(sources, selection, options.jobs)
    result.linted = [LintedSource(source, found) for source, found in zip(sources, found_by_source)]
    return result


def _config(path: Path | None) -> Config:
    try:
        config = load_config(path) if path else None
        if config is None:
            found = find_config(Path.cwd())
            config = load_config(found) if found else Config()
    except ConfigError as error:
        raise RunError(str(error)) from None
    return config


@dataclass
class _Fixing:
    """``--fix`` and ``--diff`` over the collected templates: what each file's fixes did goes
    into ``result``, line by line."""

    options: FixOptions
    selection: Selection
    write: bool
    quiet: bool
    gguf_copy: Path | None
    result: CheckResult
    on_line: Callable[[FixLine], None] | None

    def say(self, text: str, patch: bool = False) -> None:
        line = FixLine(text, patch)
        self.result.fix_lines.append(line)
        if self.on_line is not None:
            self.on_line(line)

    def run(self, sources: list[TemplateSource]) -> list[TemplateSource]:
        """Fix every file; return the templates as they now are, for the lint that follows."""
        from .fixer import fix_files, unified_diff

        now: list[TemplateSource] = []
        files = [source for source in sources if source.container != "gguf"]
        with ProgressBar("fixing templates", len({source.path for source in files})) as bar:
            fixed_files = fix_files(files, self.options, self.selection, self.write, bar.advance)
        for fixed in fixed_files:
            for fix in fixed.fixes:
                if fix.refusal:
                    self.say(f"{fix.source.label}: not fixed: {fix.refusal}")
                elif fixed.error is None:
                    self.say_fixed(fix)
                self.say_skipped(fix)
            if fixed.error is not None:
                self.result.errors.append(str(fixed.error))
                now.extend(fix.source for fix in fixed.fixes)
                continue
            if not self.write and fixed.changed:
                self.say(unified_diff(fixed.path, fixed.original, fixed.updated), patch=True)
            self.result.would_change = self.result.would_change or (not self.write and fixed.changed)
            # Under --diff the file on disk is not what the lint that follows reads: its
            # findings are placed in the file as it would be.
            now.extend(replace(fix.now, file_text=None if self.write else fixed.updated) for fix in fixed.fixes)
        models = [source for source in sources if source.container == "gguf"]
        if models:
            now.extend(self.fix_models(models))
        return now

    def fix_models(self, models: list[TemplateSource]) -> list[TemplateSource]:
        """GGUF models are never rewritten in place: the fixed templates go beside the model,
        or into a new copy (``--gguf-copy``)."""
        from .fixer import fix_isolated, unified_diff
        from .gguf import apply_fixes
        from .writes import WriteError

        by_model: dict[Path, list[TemplateSource]] = {}
        for source in models:
            by_model.setdefault(source.path, []).append(source)
        now: list[TemplateSource] = []
        for model, found in by_model.items():
            fixes = [fix_isolated(source, self.options, self.selection) for source in found]
            for fix in fixes:
                self.say_fixed(fix)
                self.say_skipped(fix)
                if not self.write and fix.changed:
                    self.say(unified_diff(Path(fix.source.label), fix.source.text, fix.patched), patch=True)
                    self.result.would_change = True
            try:
                lines, current = apply_fixes(model, fixes, self.write, self.gguf_copy)
            except WriteError as error:
                self.result.errors.append(str(error))
                now.extend(fix.source for fix in fixes)
                continue
            for line in lines:
                self.say(line)
            now.extend(current)
        return now

    def say_fixed(self, fix: TemplateFix) -> None:
        done = "fixed" if self.write else "would fix"
        for finding, title in fix.applied:
            self.say(f"{_headline(finding, done)}: {title}")

    def say_skipped(self, fix: TemplateFix) -> None:
        for finding, reason in fix.skipped if not self.quiet else ():
            self.say(f"{_headline(finding, 'not fixed')}: {reason}")


def _headline(finding: Finding, verb: str) -> str:
    """``path:line:col: fixed PC001 [live-clock] (template NAME)``."""
    return f"{finding.location()}: {verb} {finding.code} [{finding.name}] {finding.template_label()}".rstrip()


# --- tmpl-lint diff -----------------------------------------------------------------------


@dataclass(frozen=True)
class DiffOptions:
    first: Path
    second: Path
    template: Path | None = None  # a template file or model directory; None: the tokenizer's
    tokenizer: Path | None = None
    server: str | None = None
    model: str | None = None
    block_size: int = 16
    engine: str = "vllm"


def run_diff(options: DiffOptions, note: Callable[[str], None] = lambda text: None) -> Divergence:
    """Where the second request stops extending the first, rendered as ``options.engine``
    would (or as a running vLLM tokenizes them). ``note`` hears what the user should know
    (a model vLLM renders without the template, a served model replaced). Raises
    OptionsError or RunError."""
    from .diff import RequestError, diff_requests, read_request, read_template
    from .engines import EngineError
    from .isolation import IsolationError, run_isolated
    from .render import RenderError
    from .server import ServerError, VLLMServer
    from .tokenizer import load_tokenizer

    try:
        first, second = read_request(options.first), read_request(options.second)
        template_source = options.template or options.tokenizer
        text, special = read_template(template_source) if template_source is not None else (None, {})
        if text is None and options.server is None:
            raise OptionsError("give --template or --tokenizer (a directory with a chat template), or --server")
        loaded = load_tokenizer(options.tokenizer) if options.tokenizer is not None else None
        vllm = VLLMServer(options.server, options.model, note) if options.server else None
        if vllm is not None:
            vllm.discover(request.body.get("model") for request in (first, second))
        server_ids = vllm.prompt_token_ids if vllm is not None else None
        engine = engine_for(options.engine, text, template_source, note) if text is not None else options.engine
        # Rendering is untrusted code: in a child with check's memory limit; each render has
        # its own time and size limits.
        arguments = (first, second, text, special, loaded, options.block_size, server_ids, engine)
        divergence = run_isolated(_diff_or_error, (diff_requests, arguments), seconds=None)
        if isinstance(divergence, str):
            raise RequestError(divergence)
    except (RequestError, RenderError, ServerError, TokenizerError, EngineError) as error:
        raise RunError(str(error)) from None
    except IsolationError as error:
        raise RunError(f"diff stopped: {error}") from None
    return divergence


def _diff_or_error(function, args):
    """``function(*args)``, or the message of the error it raised (to cross from the child)."""
    from .diff import RequestError
    from .engines import EngineError
    from .render import RenderError
    from .server import ServerError

    try:
        return function(*args)
    except (RequestError, RenderError, ServerError, TokenizerError, EngineError) as error:
        return str(error)


def engine_for(engine: str, template: str, path: Path, note: Callable[[str], None]) -> str:
    """What renders requests for the model of ``path``, saying so when vLLM ignores the template."""
    from .engines import HARMONY, resolve_engine
    from .sources import model_type_beside

    resolved = resolve_engine(engine, template, model_type_beside(path))
    if resolved == HARMONY:
        note("vLLM renders this model (gpt-oss) with openai-harmony, not this template; --engine hf renders the template")
    return resolved


# --- tmpl-lint replay ---------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOptions:
    log: Path
    template: Path  # a template file or model directory
    compare: Path | None = None  # a second template replayed on the same cache
    tokenizer: Path | None = None
    session_key: str | None = None
    server: str | None = None
    model: str | None = None
    engine: str = "vllm"
    cache_model: str = "vllm"
    block_size: int = 16
    cache_blocks: str | None = None  # "N[,N...]": several sizes sweep the hit-rate curve
    kv_cache_gib: float | None = None
    model_config: Path | None = None
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    kv_cache_dtype: str = "auto"
    page_size: int = 1
    slots: int | None = None
    cache_reuse: int = 0
    jobs: int = 1


@dataclass
class ReplayResult:
    summaries: list[tuple[str, Summary]]  # ("template", ...) and, with --compare, ("compare", ...)
    problems: list[str]  # the log's lines not replayed, each said once: "LOG:LINE: why"

    @property
    def status(self) -> int:
        return EXIT_ERROR if self.problems else EXIT_CLEAN


def run_replay(options: ReplayOptions, note: Callable[[str], None] = lambda text: None) -> ReplayResult:
    """The log through the cache model, once per template. ``note`` hears what the user
    should know as it is found. Raises OptionsError or RunError."""
    from . import kv_cache
    from . import replay as replaying
    from .diff import RequestError, read_template
    from .isolation import IsolationError
    from .prover import resolve_special_tokens
    from .server import ServerError, VLLMServer
    from .tokenizer import load_tokenizer

    try:
        shape = None
        if options.kv_cache_gib is not None:
            config = kv_cache.read_model_config(options.model_config) if options.model_config else None
            shape = kv_cache.kv_shape(config, options.kv_cache_dtype, options.num_layers, options.num_kv_heads, options.head_dim)
        capacities = kv_cache.capacities(options.cache_blocks, options.kv_cache_gib, options.block_size, shape)
        if options.cache_model == "llamacpp" and capacities != [None] and not options.slots:
            raise OptionsError("with --cache-model llamacpp a capacity is split over --slots N; give --slots")
        settings = replaying.CacheSettings(
            options.cache_model, options.block_size, options.page_size, options.slots, options.cache_reuse
        )
        calls, unread = replaying.read_log(options.log)
        loaded = load_tokenizer(options.tokenizer) if options.tokenizer else None
        templates = [("template", options.template, *read_template(options.template))]
        if options.compare:
            templates.append(("compare", options.compare, *read_template(options.compare)))
        vllm = VLLMServer(options.server, options.model, note) if options.server else None
        if vllm is not None:
            vllm.discover(call.body.get("model") for call in calls)
        server_ids = vllm.prompt_token_ids if vllm is not None else None
        groups = replaying.sessions(calls, options.session_key)
        summaries, failed = [], []
        for label, path, text, special in templates:
            renderer = engine_for(options.engine, text, path, note)
            tracer = replaying.Tracer(text, loaded, resolve_special_tokens(loaded, special), renderer, server_ids)
            summary, refused = replaying.replay(tracer, groups, settings, capacities, 1 if options.server else options.jobs)
            summaries.append((label, summary))
            failed.extend(f"{options.log}:{line}: {reason}" for line, reason in refused)
    except (replaying.ReplayError, RequestError, ServerError, TokenizerError, kv_cache.CacheError) as error:
        raise RunError(str(error)) from None
    except IsolationError as error:
        raise RunError(f"replay stopped: {error}") from None
    return ReplayResult(summaries, list(dict.fromkeys([*map(str, unread), *failed])))


# --- tmpl-lint audit ----------------------------------------------------------------------


@dataclass(frozen=True)
class AuditOptions:
    repo_ids: tuple[str, ...] = ()  # org/name[@revision]
    local: tuple[Path, ...] = ()  # model folders
    from_file: Path | None = None  # repo ids, one a line
    search: str | None = None  # a Hub search query
    author: str | None = None
    limit: int = 50  # models --search/--author lists
    from_cache: bool = False  # every model in the local Hugging Face cache
    jobs: int = 1
    tokens: bool = False
    prove: bool = True
    dedupe: bool = True
    cache_file: Path | None = None  # None: the default results cache
    use_cache: bool = True
    engine: str = "vllm"


@dataclass
class AuditRun:
    audit: Audit
    rows: list[dict[str, Any]]  # one a template, or a repo without one
    cache_problems: list[str]  # a results cache that could not be read or written

    @property
    def status(self) -> int:
        """2 when a repo or the cache could not be read, or no repo had a template; else 1
        when a template has findings."""
        if any(repo.error for repo in self.audit.repos) or self.cache_problems or not self.audit.analyses:
            return EXIT_ERROR
        return EXIT_FINDINGS if any(row["codes"] for row in self.rows) else EXIT_CLEAN


def run_audit(options: AuditOptions, advance: Callable[[], None] | None = None) -> AuditRun:
    """Audit the repos and folders ``options`` names; ``advance`` is called as each template
    is analysed. Raises OptionsError or RunError."""
    from . import audit as auditing
    from .sources import SourceError

    repo_ids = list(options.repo_ids)
    try:
        if options.from_file:
            repo_ids += auditing.read_repo_list(options.from_file)
        if options.search or options.author:
            from huggingface_hub import list_models

            repo_ids += [model.id for model in list_models(search=options.search, author=options.author, limit=options.limit)]
    except SourceError as error:
        raise RunError(str(error)) from None
    except Exception as error:  # noqa: BLE001 - a hub listing failure is one line
        raise RunError(f"cannot list models: {auditing.describe_error(error)}") from None
    if not (repo_ids or options.local or options.from_cache):
        raise OptionsError("name repos, --from-file, --search/--author, --from-cache or local model folders")
    prove = ProveOptions(None, 16, RenderLimits(), options.engine) if options.prove else None
    cache = auditing.ResultsCache((options.cache_file or auditing.default_cache_path()) if options.use_cache else None)
    audit = auditing.run_audit(
        repo_ids,
        list(options.local),
        options.from_cache,
        Selection(),
        prove,
        options.jobs,
        cache,
        options.tokens,
        options.dedupe,
        advance,
    )
    return AuditRun(audit, auditing.rows(audit), cache.problems)
