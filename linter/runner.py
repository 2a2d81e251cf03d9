"""What the commands do, without printing any of it: the CLI parses its options into an
options object, calls the runner and prints what comes back.

``run_check`` (``tmpl-lint check``) reads the configuration, collects the templates, fixes
them (``--fix`` writes, ``--diff`` only shows), lints and proves them in long-lived limited
workers (``isolation.long_lived_workers``), and returns a ``CheckResult``: the findings of
each template, what the fixes said, the inputs it could not read and the exit status. ``tmpl-lint diff``, ``replay`` and
``audit`` run from ``commands.py``: a pre-commit hook runs check on every commit, and pays
for importing no more than check needs.
"""

from __future__ import annotations

import difflib
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from .checker import ProveOptions, lint_isolated, lint_many_isolated, ready_to_fork
from .config import Config, ConfigError, find_config, load_config
from .findings import Finding, quoted_name
from .inputs import NothingToLint, SourceError, TemplateSource
from .isolation import long_lived_workers, parallel_map
from .render import DEFAULT_LIMITS, RenderLimits, keep_compiled_code
from .report.progress import ProgressBar
from .rules import BY_CODE
from .selection import Selection, SelectionError
from .sources import collect
from .stopping import Terminated

if TYPE_CHECKING:
    from .fix.apply import TemplateFix
    from .fix.files import FileFix
    from .fix.options import FixOptions
    from .gguf.writing import CopyTarget
    from .proving.session import Recorded

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
    strict: bool | None = None  # None: as the configuration says (false without one)
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
    chat_template_kwargs: dict | None = None  # None: as the configuration says (every value proven without)
    jobs: int = 1
    gguf_copy: CopyTarget | None = None
    cache: bool = True  # False: --no-cache, no compiled code read or written
    unsafe_fixes: bool | None = None  # None: as the configuration says (false without one)


@dataclass(frozen=True)
class FixLine:
    """One thing the fixes have to say, in order: a message (fixed, would fix, not fixed,
    what was written where) or, with ``patch``, a file's unified diff."""

    text: str
    patch: bool = False


@dataclass(frozen=True)
class InputError:
    """A file the run could not read, or could not write: one error line, exit 2."""

    path: Path
    line: str  # printed after "tmpl-lint: error: ", the path first as a rule
    write: bool = False  # a file --fix could not write (a read-only template, a copy's name taken)

    @classmethod
    def of(cls, path: Path, error: Exception, write: bool) -> InputError:
        return cls(getattr(error, "path", path), str(error), write)

    def __str__(self) -> str:
        return _quoting_path(self.path, self.line)

    @property
    def message(self) -> str:
        """The line without the path it starts with, for a report that names the file apart."""
        prefix = f"{self.path}: "
        return self.line.removeprefix(prefix)


def _quoting_path(path: Path, line: str) -> str:
    """``line``, its leading ``path`` quoted as the report names files (a newline in a name
    would split the line)."""
    prefix = f"{path}: "
    return f"{quoted_name(path)}: {line.removeprefix(prefix)}" if line.startswith(prefix) else line


@dataclass
class LintedSource:
    source: TemplateSource  # as the lint read it: after --fix, the template as written
    findings: list[Finding]


@dataclass
class CheckResult:
    linted: list[LintedSource] = field(default_factory=list)
    fix_lines: list[FixLine] = field(default_factory=list)
    would_change: bool = False  # --diff: some file would change
    errors: list[InputError] = field(default_factory=list)  # inputs not read or not written; the run went on
    warnings: list[str] = field(default_factory=list)
    strict: bool = False  # as the options and the configuration decide it
    exit_zero: bool = False
    fix: FixMode = FixMode.NONE
    fixed: int = 0  # findings --fix fixed
    unsafe_fixes: bool = False  # --unsafe-fixes, or the configuration's unsafe-fixes

    @property
    def findings(self) -> list[Finding]:
        return [finding for linted in self.linted for finding in linted.findings]

    @property
    def notes(self) -> list[str]:
        return [_in_folder(linted.source.path.parent, linted.source.note) for linted in self.linted if linted.source.note]

    @property
    def unread(self) -> int:
        return sum(1 for error in self.errors if not error.write)

    @property
    def unwritten(self) -> int:
        return sum(1 for error in self.errors if error.write)

    @property
    def status(self) -> int:
        """2 when an input could not be read or written; else, as ruff, 1 when a finding
        fails the run (the proof decides: Finding.verdict) or --diff would change a file,
        unless --exit-zero (which, as ruff's, covers --diff too)."""
        if self.errors:
            return EXIT_ERROR
        if self.exit_zero:
            return EXIT_CLEAN
        failing = any(finding.fails(self.strict) for finding in self.findings)
        return EXIT_FINDINGS if failing or self.would_change else EXIT_CLEAN


def run_check(options: CheckOptions, on_fix_line: Callable[[FixLine], None] | None = None) -> CheckResult:
    """Fix, lint and prove the templates under ``options.paths``. ``on_fix_line`` hears each
    fix line as it is decided, before the proofs run: an interrupted run has told what it
    wrote. Raises OptionsError or RunError when the run cannot start."""
    keep_compiled_code(options.cache)
    config = read_config(options.config_path)
    root = config.path.parent if config.path else None
    try:  # a code the configuration names is its file's mistake, not the command line's
        selection = Selection.parse(config.select, config.ignore, config.per_file_ignores, root)
    except SelectionError as error:
        raise RunError(f"{config.path}: {error}") from None
    try:
        # Layered as ruff does: the command line's --select replaces the configuration's
        # select and ignore; its --ignore alone adds to them (the pre-commit hooks pass
        # --ignore PC103, and a project's own ignores still hold).
        if options.select:
            selection = Selection.parse(options.select, options.ignore, config.per_file_ignores, root)
        elif options.ignore:
            selection = Selection.parse(config.select, config.ignore, config.per_file_ignores, root, options.ignore)
    except SelectionError as error:
        raise OptionsError(str(error)) from None
    # How the model writes tool-call arguments: the check proves PC004 against it, and --fix writes it.
    tool_args_style = options.tool_args_style or config.tool_args_style  # None: the template's word, else compact
    selection = replace(selection, tool_args_style=tool_args_style)
    block_size, tokenizer = config.layered(options.block_size, options.tokenizer)
    strict = config.strict if options.strict is None else options.strict  # the flag, either way, over the file
    unsafe_fixes = config.unsafe_fixes if options.unsafe_fixes is None else options.unsafe_fixes
    result = CheckResult(strict=strict, exit_zero=options.exit_zero, fix=options.fix, unsafe_fixes=unsafe_fixes)
    pinned = options.chat_template_kwargs if options.chat_template_kwargs is not None else config.chat_template_kwargs
    pinned_items = tuple(sorted((pinned or {}).items()))
    prove = ProveOptions(tokenizer, block_size, options.limits, options.engine, pinned_items) if options.prove else None
    if prove is not None and tokenizer is not None:
        from .tokenizer import TokenizerError, load_tokenizer  # noqa: PLC0415 -- proofs only (not --help, not --no-prove)

        try:
            # Once, here: a bad directory is the caller's mistake, not each template's, and
            # the processes that prove each template inherit it loaded.
            load_tokenizer(tokenizer)
        except TokenizerError as error:
            raise RunError(str(error)) from None
    sources, errors = collect(list(options.paths))
    result.errors = [InputError(error.path, str(error)) for error in errors if not isinstance(error, NothingToLint)]
    result.warnings = [_quoting_path(error.path, str(error)) for error in errors if isinstance(error, NothingToLint)]
    gguf_copy = options.gguf_copy
    if gguf_copy is not None and not gguf_copy.folder and len({s.path for s in sources if s.container == "gguf"}) > 1:
        raise OptionsError("--gguf-copy names one file, and several GGUF models are given: name a directory")
    if gguf_copy is not None and gguf_copy.problem() is not None:
        # Said before any fix is written: the command as given cannot do what it says.
        raise RunError(gguf_copy.problem())
    if not sources and not errors:
        result.warnings.append("no chat templates found in the given paths")
    fixing = None
    if options.fix is not FixMode.NONE:
        from .fix.options import FixOptions  # noqa: PLC0415 -- the fix pipeline: --fix and --diff only

        frozen = options.frozen_date or config.frozen_date or datetime.now().date()
        # A fix is made for what fails the run: a finding the proof does not reproduce fails it
        # only under --strict, and every one does without proofs.
        unreproduced = result.strict or not options.prove
        fix_options = FixOptions(
            frozen,
            tokenizer,
            block_size,
            tool_args_style,
            options.engine,
            options.limits,
            unreproduced,
            send_renders=prove is not None,
            unsafe_fixes=unsafe_fixes,
        )
        fixing = _Fixing(
            fix_options, selection, options.fix is FixMode.WRITE, options.quiet, gguf_copy, result, on_fix_line, options.jobs
        )
    # Templates are untrusted code: each is fixed, parsed, analysed (and proven) in a limited
    # process, several at once. The processes are long-lived workers that serve the fixes
    # and then the lint (a fork per template cost a small template as much as its proof,
    # and started it with cold caches); what every one of them needs is made ready before
    # the first is forked: the tokenizers the proofs measure with, and openai-harmony's
    # vocabulary (loaded once here, not by each worker that proves a gpt-oss template).
    if prove and tokenizer is None:
        from .gguf.tokenizer import preload_tokenizers  # noqa: PLC0415 -- the GGUF reader: GGUF models only

        preload_tokenizers(sources)
    ready_to_fork(sources, prove)
    with long_lived_workers():
        if fixing is not None:
            sources = fixing.run(sources)
        if prove:
            recorded = fixing.recorded if fixing is not None else {}

            def proven(source):
                from .tokenizer import TokenizerError  # noqa: PLC0415 -- proofs only (not --help, not --no-prove)

                try:
                    found = lint_isolated(source, selection, prove, recorded.pop((str(source.path), source.name), None), True)
                except TokenizerError as error:  # it failed on this template's renders: its error line
                    result.errors.append(InputError(source.path, f"{source.path}: cannot be proven: {error}"))
                    found = []
                bar.advance()
                return found

            with ProgressBar("proving templates", len(sources), quiet=options.quiet) as bar:
                found_by_source = parallel_map(proven, sources, options.jobs)
        else:
            found_by_source = lint_many_isolated(sources, selection, options.jobs)
    result.linted = [LintedSource(source, found) for source, found in zip(sources, found_by_source)]
    if fixing is not None:
        fixing.say_unaddressed(result.linted)
    return result


def _in_folder(folder: Path, note: str) -> str:
    """A note about the files of ``folder``, which names it unless it is the working directory."""
    return note if folder == Path(".") else f"{quoted_name(folder)}: {note}"


def read_config(path: Path | None) -> Config:
    """The configuration ``path`` names, else the nearest to the working directory, else the
    defaults. Raises RunError (one line naming the file) when it cannot be read."""
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
    gguf_copy: CopyTarget | None
    result: CheckResult
    on_line: Callable[[FixLine], None] | None
    jobs: int
    # (path, template, code, whether a pattern found it) of every finding a line has said
    # was fixed or not, and why.
    addressed: set[tuple[str, str | None, str, bool]] = field(default_factory=set)
    # (path, template) of the templates whose every fix was refused, with the reason said once.
    refused: set[tuple[str, str | None]] = field(default_factory=set)
    # Why the findings of a file --fix could not write (or read again) are not fixed, by its
    # path: the error line says why, and a finding its fix would have edited says that.
    unwritten: dict[str, str] = field(default_factory=dict)
    # By (path, template): what verifying its fixes recorded proving the template as it now
    # is, for the check's proof (which takes it only for the same template and inputs).
    recorded: dict[tuple[str, str | None], Recorded] = field(default_factory=dict)
    # Why a finding's fix was not made, by (path, template, code): said once the check has
    # proven the template, for the findings it reports (not for one it shows as another's
    # related location), each at its place then.
    skipped: dict[tuple[str, str | None, str], list[tuple[int, str]]] = field(default_factory=dict)
    # (path, template, code) of the findings whose unsafe fix was left: counted, not said.
    withheld: set[tuple[str, str | None, str]] = field(default_factory=set)
    # The template a GGUF model's fix was made in, by the (path, template) the check reads
    # instead: the companion file beside the model.
    read_as: dict[tuple[str, str | None], tuple[str, str | None]] = field(default_factory=dict)

    def say(self, text: str, patch: bool = False) -> None:
        line = FixLine(text, patch)
        self.result.fix_lines.append(line)
        if self.on_line is not None:
            self.on_line(line)

    def run(self, sources: list[TemplateSource]) -> list[TemplateSource]:
        """Fix every file; return the templates as they now are, for the lint that follows."""
        from .fix.files import FixesInterrupted, fix_files  # noqa: PLC0415 -- the fix pipeline: --fix and --diff only

        now: list[TemplateSource] = []
        if self.gguf_copy is not None and self.write:
            # A copy carries fixes in the model's metadata: a fixed template beside a model
            # stands for the metadata's, which is fixed again (and found written beside it).
            from .gguf.models import metadata_template  # noqa: PLC0415 -- the GGUF reader: GGUF models only

            sources = [metadata_template(source) or source for source in sources]
        files = [source for source in sources if source.container != "gguf"]
        try:
            with ProgressBar("fixing templates", len({source.path for source in files}), quiet=self.quiet) as bar:
                fixed_files = fix_files(files, self.options, self.selection, self.write, bar.advance, self.jobs)
        except FixesInterrupted as stopped:
            # The files written before Ctrl-C or SIGTERM are named, then the run says it was
            # interrupted or terminated: a user (or a hook, or CI) must be able to tell what
            # changed on disk. --diff wrote nothing, and prints no patch of part of the
            # files, which `| git apply` would take.
            for fixed in stopped.done if self.write else ():
                self.say_file(fixed)
            raise stopped.stop from None
        for fixed in fixed_files:
            now.extend(self.say_file(fixed))
        models = [source for source in sources if source.container == "gguf"]
        if models:
            now.extend(self.fix_models(models))
        return now

    def say_file(self, fixed: FileFix) -> list[TemplateSource]:
        """Say what became of one file's fixes; return its templates as they now are."""
        from .fix.files import unified_diff  # noqa: PLC0415 -- the fix pipeline: --fix and --diff only

        unfixed = None
        if fixed.error is not None:
            # a file gone or changed when it was read again to be fixed, else a failed write
            wrote = not isinstance(fixed.error, SourceError)
            unfixed = "the file could not be " + ("written" if wrote else "read again") + " (see the error)"
            if not fixed.made:
                # Its fixes were never made (its lock not taken, the file not read again):
                # every finding of it is not fixed for that reason.
                self.unwritten[str(fixed.path)] = unfixed
        for fix in fixed.fixes:
            if fix.refusal:
                self.say_refused(fix)
            elif unfixed is None:
                self.say_fixed(fix)
            else:
                for finding, _title in fix.applied:
                    self.say_finding(finding, "not fixed", unfixed)
            self.say_skipped(fix)
        if fixed.error is not None:
            self.result.errors.append(InputError.of(fixed.path, fixed.error, write=wrote))
            return [fix.source for fix in fixed.fixes]
        if not self.write and fixed.changed:
            self.say(unified_diff(fixed.path, fixed.original, fixed.updated), patch=True)
        self.result.would_change = self.result.would_change or (not self.write and fixed.changed)
        for fix in fixed.fixes:
            if fix.recorded is not None and fix.refusal is None:
                self.recorded[(str(fix.now.path), fix.now.name)] = fix.recorded
        # Under --diff the file on disk is not what the lint that follows reads: its
        # findings are placed in the file as it would be.
        return [replace(fix.now, file_text=None if self.write else fixed.updated) for fix in fixed.fixes]

    def fix_models(self, models: list[TemplateSource]) -> list[TemplateSource]:
        """GGUF models are never rewritten in place: the fixed templates go beside the model
        (``--diff`` shows them as new files), or into a new copy (``--gguf-copy``). What is
        linted after is the model's metadata as it stays."""
        from .fix.files import fix_recalling, unified_diff  # noqa: PLC0415 -- the fix pipeline: --fix and --diff only
        from .fix.verify import Verdicts  # noqa: PLC0415 -- the fix pipeline: --fix and --diff only
        from .gguf.models import companion_note, diff_note  # noqa: PLC0415 -- the GGUF reader: GGUF models only
        from .gguf.writing import companion_line, copy_lines, copy_with_fixes, place_fix, written_beside  # noqa: PLC0415 -- GGUF only
        from .writes import WriteError  # noqa: PLC0415 -- the fix pipeline: --fix and --diff only

        by_model: dict[Path, list[TemplateSource]] = {}
        for source in models:
            by_model.setdefault(source.path, []).append(source)
        now: list[TemplateSource] = []
        # A model's quantisations carry one template: verified for the first, recalled after.
        recalled: dict[str, list[Verdicts]] = {}
        for model, found in by_model.items():
            fixes = [fix_recalling(source, self.options, self.selection, recalled) for source in found]
            names = {fix.source.name for fix in fixes}
            placed_all = True
            for fix in fixes:
                if fix.refusal:
                    self.say_refused(fix)
                if not fix.changed:
                    self.say_skipped(fix)
                    now.append(fix.source)
                    continue
                # Said as each file is written (or found written), and "fixed" only then.
                try:
                    placed = place_fix(model, fix, self.write, names)
                except (KeyboardInterrupt, Terminated):
                    # Held while the file was linked into place, a signal takes effect as that
                    # ends: the fixed template is then beside the model, and named before the
                    # run says it stopped.
                    target = written_beside(model, fix) if self.write else None
                    if target is not None:
                        self.say_fixed(fix)
                        self.say(companion_line(model, fix.source.name, target))
                    raise
                if placed.error is None:
                    # "fixed" only when written: a fixed template already beside the model is not
                    self.say_fixed(fix, None if placed.fresh else "fixed in the companion file")
                else:
                    placed_all = False
                    for finding, _title in fix.applied:
                        self.say_finding(finding, "not fixed", placed.reason)
                    self.result.errors.append(InputError.of(placed.target, placed.error, write=True))
                self.say_skipped(fix)
                for line in placed.lines:
                    self.say(line)
                if placed.new_file is not None:
                    self.say(unified_diff(placed.new_file[0], None, placed.new_file[1]), patch=True)
                    self.result.would_change = True
                # The lint that follows reads the fixed template beside the model, as the next
                # check will (llama-server serves it with --chat-template-file).
                if placed.error is None:
                    note = companion_note(model, fix.source.name) if self.write else diff_note(model, fix.source.name)
                    now.append(replace(placed.now, note=note))
                    # what was not fixed in the model's template is said of the file the check reads
                    self.read_as[(str(placed.now.path), placed.now.name)] = (str(fix.source.path), fix.source.name)
                else:
                    now.append(fix.source)
            if self.write and self.gguf_copy is not None:
                if not placed_all:
                    self.say(f"{model}: no copy written: a fixed template could not be written beside the model")
                    continue
                destination = self.gguf_copy.destination(model)
                existed = destination.exists()
                try:
                    for line in copy_with_fixes(model, [fix for fix in fixes if fix.changed], self.gguf_copy):
                        self.say(line)
                except (KeyboardInterrupt, Terminated):
                    if not existed and destination.exists():  # the copy was put in place as the signal came
                        for line in copy_lines(model, destination):
                            self.say(line)
                    raise
                except WriteError as error:
                    self.result.errors.append(InputError.of(self.gguf_copy.destination(model), error, write=True))
        return now

    def say_fixed(self, fix: TemplateFix, done: str | None = None) -> None:
        done = done or ("fixed" if self.write else "would fix")
        for finding, title in fix.applied:
            self.say_finding(finding, done, title)
        if done == "fixed":
            self.result.fixed += len(fix.applied)
        if done in ("fixed", "would fix") and fix.applied and fix.changed and not self.quiet:
            # The template's own lines, before and after: a template held on one line of a
            # JSON file is reviewed here, where the file's patch shows the whole line.
            for line in edited_lines(fix.source.text, fix.patched):
                self.say(line)

    def say_skipped(self, fix: TemplateFix) -> None:
        from .fix.options import NO_AUTOMATIC_FIX  # noqa: PLC0415 -- the fix pipeline: --fix and --diff only

        for finding in fix.withheld:
            self.withheld.add((str(finding.path), finding.template, finding.code))
        for finding, reason in fix.skipped if not self.quiet else ():
            # An informational finding of a rule without a fix fails nothing and had nothing
            # to try: "not fixed" read as a failure left behind. Its own line says the rest.
            if finding.severity != "info" or reason != NO_AUTOMATIC_FIX:
                key = (str(finding.path), finding.template, finding.code)
                self.skipped.setdefault(key, []).append((finding.line, reason))

    def say_refused(self, fix: TemplateFix) -> None:
        """A template none of whose fixes can be written (adjacent Python literals, a YAML
        alias): said once, for all its findings."""
        self.refused.add((str(fix.source.path), fix.source.name))
        source = fix.source
        label = f"{quoted_name(source.path)}:{quoted_name(source.name)}" if source.name else quoted_name(source.path)
        self.say(f"{label}: not fixed: {fix.refusal}")

    def say_finding(self, finding: Finding, verb: str, why: str) -> None:
        self.addressed.add((str(finding.path), finding.template, finding.code, finding.hypothesis))
        self.say(f"{_headline(finding, verb)}: {why}")

    def say_unaddressed(self, linted: list[LintedSource]) -> None:
        """The fixes work from the findings the template's patterns show; one the proof found
        itself (arguments re-serialised where no `tojson` shows it, a header history never
        prints, a rewrite no rule names) has no pattern for them to edit. It still fails the
        run after ``--fix``, so it says why it was left."""
        from .fix.options import NO_AUTOMATIC_FIX  # noqa: PLC0415 -- the fix pipeline: --fix and --diff only

        for item in linted:
            for finding in item.findings:
                fixed_in = self.read_as.get((str(finding.path), finding.template), (str(finding.path), finding.template))
                key = (*fixed_in, finding.code)
                left = self.skipped.get(key)
                if not left:
                    continue
                # The skipped fix of this code nearest the finding (a fix above it may have
                # moved its line).
                nearest = min(left, key=lambda entry: abs(entry[0] - finding.line))
                left.remove(nearest)
                self.say_finding(finding, "not fixed", nearest[1])
        unaddressed = [
            finding
            for item in linted
            for finding in item.findings
            if finding.fails(self.result.strict)
            and (str(finding.path), finding.template, finding.code, finding.hypothesis) not in self.addressed
            and (str(finding.path), finding.template) not in self.refused
            and (*self.read_as.get((str(finding.path), finding.template), (str(finding.path), finding.template)), finding.code)
            not in self.withheld
        ]
        at_one_place = Counter((finding.location(), finding.code) for finding in unaddressed)
        for finding in unaddressed if not self.quiet else ():
            rule = BY_CODE[finding.code]
            if finding.hypothesis and rule.fix is None:
                why = NO_AUTOMATIC_FIX  # as the fixes say it, when they run
            else:
                why = (
                    (self.unwritten.get(str(finding.path)) if finding.hypothesis else None)
                    or rule.RULE.no_fix
                    or "found by the proof, not from a pattern a fix edits: no automatic fix"
                )
            if at_one_place[(finding.location(), finding.code)] > 1 and finding.proof is not None:
                why += f" (the {finding.proof.cause} divergence)"  # two causes at one place (PC103's date and analysis)
            self.say_finding(finding, "not fixed", why)


def edited_lines(before: str, after: str) -> list[str]:
    """The lines of a template a fix edited, as ``    5 - old`` and ``    5 + new`` (each
    numbered in its own text). A long line (a template written on one line) is shown around
    what changed in it, as ``git diff --word-diff`` would point there."""
    old, new = before.splitlines(), after.splitlines()
    lines = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        removed, added = old[i1:i2], new[j1:j2]
        pairs = zip(removed, added) if len(removed) == len(added) else ()
        windows = [_changed_window(one, other) for one, other in pairs]
        removed = [window[0] for window in windows] or [_cut(line) for line in removed]
        added = [window[1] for window in windows] or [_cut(line) for line in added]
        lines += [f"{number:>5} - {line}" for number, line in zip(range(i1 + 1, i2 + 1), removed)]
        lines += [f"{number:>5} + {line}" for number, line in zip(range(j1 + 1, j2 + 1), added)]
    return lines


# Context kept on each side of what a fix changed in a long line.
EDIT_CONTEXT = 40


def _changed_window(old: str, new: str) -> tuple[str, str]:
    """Both lines cut to what differs between them and some context, "…" where cut."""
    if max(len(old), len(new)) <= 2 * EDIT_CONTEXT + 40:
        return old, new
    prefix = len(os.path.commonprefix([old, new]))
    suffix = len(os.path.commonprefix([old[prefix:][::-1], new[prefix:][::-1]]))
    start = max(0, prefix - EDIT_CONTEXT)

    def window(line: str) -> str:
        end = min(len(line), len(line) - suffix + EDIT_CONTEXT)
        return ("…" if start else "") + line[start:end] + ("…" if end < len(line) else "")

    return window(old), window(new)


def _cut(line: str) -> str:
    return line if len(line) <= 2 * EDIT_CONTEXT + 40 else line[: 2 * EDIT_CONTEXT + 40] + "…"


def _headline(finding: Finding, verb: str) -> str:
    """``path:line:col: fixed PC001 [live-clock] (template NAME)``."""
    return f"{finding.location()}: {verb} {finding.code} [{finding.name}] {finding.template_label()}".rstrip()
