"""``tmpl-lint audit``: which models of a fleet will break their prefix cache, and what it costs.

Only the files a template needs are fetched (through huggingface_hub, so ``HF_TOKEN``,
``HF_HOME``, ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE=1`` behave as usual). GGUF models are
never downloaded: their templates come from the Hub's model info, or the first split's
header read by HTTP range (gguf.py); GGUF files already in the local cache are read there.
Identical templates are analysed once: a fleet of fine-tunes costs its number of distinct
templates. Analyses run in parallel, each in its own limited process, and land in a
results cache keyed by the template's hash and the options, so an interrupted audit
resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import sealed
from .checker import ProveOptions, lint_isolated, ready_to_fork
from .config import cache_directory
from .engines.base import ENGINE_ENVIRONMENT
from .gguf.format import tokenizer_digest
from .gguf.hub import HubGGUFError, hub_templates
from .gguf.models import model_for
from .inputs import SourceError, TemplateSource, read_text
from .isolation import calls_as_submitted, long_lived_workers, start_workers
from .selection import Selection
from .sources import collect, model_type_beside
from .tokenizer import TokenizerError, find_tokenizer_directory, load_tokenizer, one_line

TEMPLATE_FILES = ["tokenizer_config.json", "chat_template.jinja", "chat_template.json", "additional_chat_templates/*.jinja"]
# What tmpl-lint's tokenizer loader reads: tokenizer.json, else (through transformers) a
# SentencePiece model with its special tokens.
TOKENIZER_FILES = ["tokenizer.json", "tokenizer.model", "special_tokens_map.json"]


@dataclass
class TemplateResult:
    """The analysis of one distinct template, shared by every repo that has it."""

    key: str
    findings: list[dict[str, Any]]

    @property
    def codes(self) -> list[str]:
        return sorted({finding["code"] for finding in self.findings})

    def worst_proof(self) -> tuple[dict[str, Any] | None, bool]:
        """The proof whose scenario hits least, and whether a request as callers send it
        meets it: a failing finding's that breaks with every variable unset where one is
        proven (what a default deployment gets), else one that breaks only under a switch
        value (it fails too: a deployment may set it; thinking=true, say), else an
        informational one's."""
        proven = [
            f
            for f in self.findings
            if f.get("proof") and f["proof"].get("status") == "proven" and "first_divergence" in f["proof"]
        ]
        failing = [f for f in proven if f.get("fails")]
        by_default = [f for f in failing if not _stable_by_default(f)]
        candidates = by_default or failing or proven
        worst = min((f["proof"] for f in candidates), key=lambda proof: proof.get("hit_rate", 1.0), default=None)
        return worst, bool(by_default) or worst is None


def _stable_by_default(finding: dict[str, Any]) -> bool:
    """A finding whose proof shows it only under a switch value, stable with it unset."""
    return any(values.get("default") == "stable" for values in finding["proof"].get("switches", ()))


@dataclass
class RepoResult:
    repo: str
    revision: str | None = None
    templates: list[tuple[str | None, str]] = field(default_factory=list)  # (template name, analysis key)
    error: str | None = None
    warning: str | None = None  # said on its row and on stderr; the audit of the repo goes on


@dataclass
class Audit:
    repos: list[RepoResult]
    analyses: dict[str, TemplateResult]
    analysed_now: int = 0  # distinct templates analysed in this run (not from the cache)


def parse_repo(spec: str) -> tuple[str, str | None]:
    repo, _, revision = spec.partition("@")
    return repo, revision or None


# What git refuses in a ref name (git check-ref-format): with these gone, a revision cannot
# name a path outside the cache's refs/ folder (``../../x``), nor an absolute one.
_BAD_REVISION = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|//|@\{|^/|/$|^\.|/\.|\.lock(/|$)|\.$")


def spec_problem(spec: str) -> str | None:
    """Why ``org/name[@revision]`` is not one, checked before any path is built from it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # noqa: PLC0415 -- an extra: local folders need none

    repo, revision = parse_repo(spec)
    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        if spec.startswith(("/", "./", "../", "~")) or spec in (".", ".."):
            return "no such folder"  # written as a path: the folder is what is missing
        return f"not a valid repo id: {error}"
    if "@" in spec and (revision is None or _BAD_REVISION.search(revision)):
        return f"not a valid revision: {revision or ''!r} (a branch, tag or commit hash)"
    return None


def fetch(spec: str, with_tokenizer: bool) -> tuple[Path, str | None]:
    """The snapshot folder holding a repo's template files, and its commit."""
    from huggingface_hub import snapshot_download  # noqa: PLC0415 -- an extra (audit): local folders need none

    problem = spec_problem(spec)
    if problem:
        raise InvalidSpec(problem)
    repo, revision = parse_repo(spec)
    # config.json: its model_type tells how vLLM renders the model (gpt-oss: openai-harmony).
    patterns = TEMPLATE_FILES + ["config.json"] + (TOKENIZER_FILES if with_tokenizer else [])
    folder = Path(snapshot_download(repo_id=repo, revision=revision, allow_patterns=patterns))
    problem = snapshot_problem(folder)
    if problem:
        raise InvalidSpec(problem)
    return folder, folder.name


# A commit as the Hub names it: what a snapshot folder's name is.
_COMMIT = re.compile(r"[0-9a-f]{40}")


def snapshot_problem(folder: Path) -> str | None:
    """Why a snapshot folder of the Hugging Face cache is not read, or None. The cache is
    untrusted input: offline, huggingface_hub takes the commit from a refs/ file as written
    and joins it to snapshots/ (``../../x`` named a folder outside the cache), and a
    snapshot's files are links that may point anywhere. A snapshot is a folder named by a
    commit in its entry's snapshots/, whose files are inside that entry."""
    snapshots = folder.parent
    if snapshots.name != "snapshots" or not _COMMIT.fullmatch(folder.name) or ".." in folder.parts:
        return f"the Hugging Face cache names {folder} as its snapshot, which is no commit's folder: not read"
    entry = snapshots.parent.resolve()
    for where, folders, files in os.walk(folder):
        for name in folders + files:
            path = Path(where) / name
            target = path.resolve()
            if target != entry and entry not in target.parents:
                return f"the Hugging Face cache's {path.relative_to(folder)} links outside its entry ({target}): not read"
    return None


class InvalidSpec(ValueError):
    pass


def offline() -> bool:
    from huggingface_hub import constants  # noqa: PLC0415 -- an extra (audit): local folders need none

    return bool(constants.HF_HUB_OFFLINE)


def describe_error(error: Exception) -> str:
    """One line for a per-repo failure: gated, missing, offline and not cached..."""
    if isinstance(error, InvalidSpec):
        return str(error)
    name = type(error).__name__
    messages = {
        "GatedRepoError": "gated: accept the license on the Hub and set HF_TOKEN",
        "RepositoryNotFoundError": "not found (or private: set HF_TOKEN)",
        "RevisionNotFoundError": "revision not found",
        "LocalEntryNotFoundError": "not in the local cache, and offline (HF_HUB_OFFLINE=1) or unreachable",
        "OfflineModeIsEnabled": "offline (HF_HUB_OFFLINE=1) and not cached",
        "HFValidationError": "not a valid repo id",
    }
    if name in messages:
        return messages[name]
    return f"{name}: {one_line(error)}"


class NoHubCache(Exception):
    """``--from-cache`` and no Hugging Face cache to read: the audit cannot start (as a
    ``--from-file`` it cannot read)."""


_WHERE_THE_CACHE_IS = "--from-cache reads $HF_HUB_CACHE, else $HF_HOME/hub"


@dataclass(frozen=True)
class CachedRepo:
    """A model repo in the local Hugging Face cache."""

    repo_id: str
    entry: str  # the cache folder, models--org--name
    folder: Path | None  # its snapshot (main's, else the newest); None when the entry cannot be read
    commit: str | None
    # Why huggingface_hub cannot read the entry (a blob missing, as a download cut short
    # leaves it): its scan passes such a repo over, and the audit says so on its row.
    problem: str | None = None


def cached_repos(cache_dir: Path | None = None) -> list[CachedRepo]:
    """Every model in the local Hugging Face cache, those it cannot read included."""
    from huggingface_hub import constants, scan_cache_dir  # noqa: PLC0415 -- an extra (audit): local folders need none
    from huggingface_hub.utils import CacheNotFound  # noqa: PLC0415 -- an extra (audit): local folders need none

    folder = Path(cache_dir or constants.HF_HUB_CACHE)
    try:
        info = scan_cache_dir(folder)
        scanned = {Path(repo.repo_path).name for repo in info.repos}
        # scan_cache_dir leaves a repo it cannot read out of its list, and says why only in
        # a warning naming a path inside it.
        # An entry without snapshots/ holds nothing downloaded yet (a download under way or
        # cut short, only .no_exist/ records): passed over, as the scan passes over it.
        unreadable = sorted(
            entry
            for entry in folder.resolve().iterdir()
            if entry.name.startswith("models--") and entry.name not in scanned and (entry / "snapshots").is_dir()
        )
    except CacheNotFound:
        raise NoHubCache(f"{folder}: no Hugging Face cache here ({_WHERE_THE_CACHE_IS})") from None
    except ValueError:  # huggingface_hub's word for a file where the folder should be
        raise NoHubCache(f"{folder}: not a folder, so not a Hugging Face cache ({_WHERE_THE_CACHE_IS})") from None
    except OSError as error:
        raise NoHubCache(f"{folder}: cannot read the Hugging Face cache: {error.strerror or error}") from None
    found = []
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revisions = sorted(repo.revisions, key=lambda revision: ("main" not in revision.refs, -revision.last_modified))
        found.append(
            CachedRepo(repo.repo_id, Path(repo.repo_path).name, Path(revisions[0].snapshot_path), revisions[0].commit_hash)
        )
    for entry in unreadable:
        said = [str(warning) for warning in info.warnings if _names(str(warning), entry)]
        why = "; ".join(said) or "huggingface_hub's scan_cache_dir cannot read it"
        repo_id = entry.name.removeprefix("models--").replace("--", "/")
        found.append(CachedRepo(repo_id, entry.name, None, None, f"its cache entry is corrupt, so it is not audited: {why}"))
    return sorted(found, key=lambda repo: repo.repo_id)


def _names(text: str, entry: Path) -> bool:
    """Whether ``text`` names ``entry`` or a path inside it (not another entry whose name
    starts with it: models--org--m2 under models--org--m)."""
    return f"{entry}{os.sep}" in text or text.rstrip("'\")").endswith(str(entry))


def template_key(source: TemplateSource, options: ProveOptions | None, selection: Selection) -> str:
    """What decides a template's analysis: equal keys share one analysis across repos."""
    # The server settings the vLLM engine reads from the environment change its renders too,
    # as do the model type beside the template (which renderer vLLM uses) and the tokenizer
    # beside it (what proofs measure in).
    server = {name: os.environ.get(name) for name in ENGINE_ENVIRONMENT} if options else None
    material = json.dumps(
        {
            "template": source.text,
            "prove": asdict(options) if options else None,
            "server": server,
            "model_type": model_type_beside(source.path) if options else None,
            "tokenizer": _tokenizer_digest(source) if options and options.tokenizer is None else None,
            "special_tokens": source.special_tokens if options else None,
            "select": selection.select,
            "ignore": selection.ignore,
        },
        default=str,
        sort_keys=True,
    )
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


def _tokenizer_digest(source: TemplateSource) -> str | None:
    """The content hash of the tokenizer a proof would find beside the template (or in the
    GGUF it comes from), if any."""
    if (model := model_for(source)) is not None:
        return tokenizer_digest(model)
    if source.tokenizer_directory is not None:
        return source.tokenizer_directory.name  # a hash of what it was built from
    directory = find_tokenizer_directory(source.path)
    if directory is None:
        return None
    digest = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        with contextlib.suppress(OSError):
            digest.update(name.encode() + b"\0" + (directory / name).read_bytes())
    return digest.hexdigest()


class ResultsCache:
    """Analyses on disk, one line each, appended as they finish. The file is untrusted input
    (sealed.py): a line is ``MAC JSON``, and one whose MAC does not verify under this user's
    key (planted, damaged, cut short by an interruption, or from another machine) is a miss,
    analysed again. The file is never followed through a symbolic link, and is read line by
    line within limits."""

    PURPOSE = b"tmpl-lint audit result 1"
    MAX_LINE_BYTES = 16 * 1024 * 1024
    MAX_FILE_BYTES = 512 * 1024 * 1024  # read no further: what lies beyond is analysed again

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, list[dict[str, Any]]] = {}
        self.problems: list[str] = []  # a cache that cannot be read or written: said once, the audit goes on
        self.lock = threading.Lock()  # analyses finish in several threads; lines must not interleave
        if path is None:
            return
        try:
            sealed.secret()
        except sealed.NoKey as error:
            self.problems.append(f"{path}: cannot keep a results cache without a key to authenticate it: {error}")
            return
        try:
            self._read(path)
        except OSError as error:
            self.problems.append(f"{path}: cannot read the results cache: {_os_problem(error)}")

    def _read(self, path: Path) -> None:
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
        except FileNotFoundError:
            return
        with os.fdopen(descriptor, "rb") as stream:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return  # a device or a FIFO named as the file: nothing to read (written to, as asked)
            read = 0
            while read < self.MAX_FILE_BYTES:
                line = stream.readline(self.MAX_LINE_BYTES + 1)
                if not line:
                    break
                read += len(line)
                if len(line) > self.MAX_LINE_BYTES:  # too long to be one of ours: passed over to its end
                    while line and not line.endswith(b"\n") and read < self.MAX_FILE_BYTES:
                        line = stream.readline(self.MAX_LINE_BYTES + 1)
                        read += len(line)
                    continue
                self._take(line)

    def _take(self, line: bytes) -> None:
        """Keep the analysis on ``line`` if it is one this user's key sealed."""
        seal, _, data = line.rstrip(b"\n").partition(b" ")
        try:
            if not sealed.verifies(self.PURPOSE, "", data, bytes.fromhex(seal.decode("ascii"))):
                return
            entry = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return
        if not isinstance(entry, dict):
            return
        findings = entry.get("findings")
        if (
            isinstance(entry.get("key"), str)
            and isinstance(findings, list)
            and all(isinstance(finding, dict) and isinstance(finding.get("code"), str) for finding in findings)
        ):
            self.entries[entry["key"]] = findings

    def add(self, key: str, findings: list[dict[str, Any]]) -> None:
        with self.lock:
            self.entries[key] = findings
            if self.path and not self.problems:
                self._append(self.path, key, findings)

    def _append(self, path: Path, key: str, findings: list[dict[str, Any]]) -> None:
        data = json.dumps({"key": key, "findings": findings}).encode("utf-8")
        line = sealed.mac(self.PURPOSE, "", data).hex().encode("ascii") + b" " + data + b"\n"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
            descriptor = os.open(path, flags, 0o600)
            try:
                view = memoryview(line)
                while view:  # one write for the line where it fits (O_APPEND: lines of other audits do not interleave)
                    view = view[os.write(descriptor, view) :]
            finally:
                os.close(descriptor)
        except OSError as error:
            self.problems.append(f"{path}: cannot write the results cache: {_os_problem(error)}")


def _os_problem(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "it is a symbolic link (a cache file is never followed)"
    return error.strerror or str(error)


def run_audit(
    specs: list[str],
    local_dirs: list[Path],
    from_cache: bool,
    selection: Selection,
    prove: ProveOptions | None,
    jobs: int,
    cache: ResultsCache,
    with_tokenizer: bool = False,
    dedupe: bool = True,
    progress=None,
) -> Audit:
    repos: list[RepoResult] = []
    pending: dict[str, TemplateSource] = {}

    def analyse_and_keep(item: tuple[str, TemplateSource]) -> None:
        key, source = item
        findings = lint_isolated(source, selection, prove)
        # Kept as each finishes: an interrupted audit resumes from here.
        cache.add(key, [finding.to_json() | {"path": None} for finding in findings])
        if progress:
            progress()

    ready_to_fork([], prove, long_lived=True)
    # The templates are analysed as they are found: a repo is downloaded while the ones
    # before it are proven.
    with long_lived_workers(), calls_as_submitted(analyse_and_keep, max(1, jobs)) as submit:
        for result, folder, from_hub in _places(specs, local_dirs, from_cache, with_tokenizer, repos):
            for key, source in _templates_of(result, folder, from_hub, selection, prove, with_tokenizer, dedupe):
                if key not in cache.entries and key not in pending:
                    if not pending and jobs > 1:
                        start_workers(jobs)
                    pending[key] = source
                    submit((key, source))
    analyses = {key: TemplateResult(key, cache.entries[key]) for result in repos for _, key in result.templates}
    return Audit(repos, analyses, len(pending))


def _places(
    specs: list[str], local_dirs: list[Path], from_cache: bool, with_tokenizer: bool, repos: list[RepoResult]
) -> Iterator[tuple[RepoResult, Path, bool]]:
    """Each repo's folder as it is found or downloaded, with whether it was named by id (its
    GGUF models may be only on the Hub); every repo, readable or not, joins ``repos``."""
    if from_cache:
        for cached in cached_repos():
            result = RepoResult(cached.repo_id, cached.commit)
            repos.append(result)
            # A cache folder named by hand is no repo's: checked as an id named on the command
            # line is, and passed over (the cache is the user's, not the audit's input).
            problem = spec_problem(cached.repo_id)
            if problem is not None:
                result.warning = f"passed over: {problem} (the cache folder {cached.entry})"
                continue
            if cached.folder is None:
                result.error = cached.problem
                continue
            result.error = snapshot_problem(cached.folder)
            if result.error:
                continue
            yield result, cached.folder, False
    for spec in specs:
        result = RepoResult(spec)
        repos.append(result)
        try:
            folder, result.revision = fetch(spec, with_tokenizer)
        except Exception as error:  # noqa: BLE001 - every hub failure is reported for its repo
            result.error = describe_error(error)
            continue
        yield result, folder, True
    for directory in local_dirs:
        result = RepoResult(str(directory))
        repos.append(result)
        yield result, directory, False


def _templates_of(
    result: RepoResult,
    folder: Path,
    hub: bool,
    selection: Selection,
    prove: ProveOptions | None,
    with_tokenizer: bool,
    dedupe: bool,
) -> Iterator[tuple[str, TemplateSource]]:
    """The repo's templates with their analysis keys; what cannot be read is its error."""
    sources, errors = collect([folder])
    hub_problem = lookup_problem = None
    if hub and not offline() and not any(source.container == "gguf" for source in sources):
        # GGUF models are not downloaded: their templates come from the Hub's metadata.
        try:
            found = hub_templates(parse_repo(result.repo)[0], result.revision, tokens=with_tokenizer and prove is not None)
            sources += found.sources
            errors += [SourceError(Path(result.repo), problem) for problem in found.unread]
            hub_problem = found.tokens_problem
        except Exception as error:  # noqa: BLE001 - every hub failure is reported for its repo
            why = str(error) if isinstance(error, HubGGUFError) else f"GGUF metadata: {describe_error(error)}"
            if sources:
                # The repo's own templates are audited; a lookup of GGUF files that failed
                # (a rate limit) is said on its row, and does not fail them.
                lookup_problem = f"its GGUF files were not looked up: {why}"
            else:
                errors.append(SourceError(Path(result.repo), why))
    if errors:
        # A file of the repo that cannot be read is its error; its other templates are
        # still audited (a repo with any error fails the audit).
        result.error = "; ".join(_in_repo(error, folder) for error in errors)
        if not sources:
            return
    if with_tokenizer and prove is not None:
        result.warning = _tokens_problem([source for source in sources if source.container != "gguf"]) or hub_problem
    result.warning = result.warning or lookup_problem
    for source in sources:
        key = template_key(source, prove, selection)
        if not dedupe:
            key = f"{key}:{result.repo}"
        result.templates.append((template_label(source, folder), key))
        yield key, source


def template_label(source: TemplateSource, folder: Path) -> str:
    """Which template of a repo a row is: its file, and its name in a list of named
    templates (a GGUF's templates are named with their file: a repo holds several models)."""
    if source.container == "gguf":
        return f"{source.path.name}:{source.name}"
    try:
        where = source.path.relative_to(folder).as_posix()
    except ValueError:
        where = source.path.name
    return f"{where}:{source.name}" if source.name and source.container != "jinja" else where


def _in_repo(error: SourceError, folder: Path) -> str:
    """An error of one file of a repo, naming the file inside the repo as the template
    column does (one of several files, it would say nothing of which)."""
    try:
        where = error.path.relative_to(folder)
    except ValueError:  # not a file of the folder (the Hub's metadata of a GGUF)
        return error.message
    return error.message if where == Path(".") else f"{where.as_posix()}: {error.message}"


def _tokens_problem(sources: list[TemplateSource]) -> str | None:
    """Why --tokens cannot measure these templates in tokens, or None when it can."""
    if not sources:
        return None
    directory = find_tokenizer_directory(sources[0].path)
    if directory is None:
        return "--tokens: the repo has no tokenizer.json or tokenizer.model; figures are in characters"
    try:
        load_tokenizer(directory)
    except TokenizerError as error:
        return f"--tokens: {error}; figures are in characters"
    return None


def default_cache_path() -> Path:
    return cache_directory() / "audit.jsonl"


def read_repo_list(path: Path) -> list[str]:
    try:
        lines = read_text(path).splitlines()
    except SourceError as error:
        raise SourceError(path, f"cannot read the repo list: {error.message}") from None
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
