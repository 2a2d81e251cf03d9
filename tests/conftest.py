"""Session fixtures: this project as pre-commit installs it.

pre-commit installs a hook repository into an environment of its own, which takes most of
the time of a pre-commit test: one repository (this working tree, committed and tagged
with the version) and one environment serve the whole session. The environment is
also this project installed the way a user installs it, without extras (test_packaging).

Under pytest-xdist each worker has its own session, so both are built in a folder the
workers share, by the first worker that needs them, while the other waits for it (the
recipe of xdist's documentation): once per run, not once per worker. The build starts in
the background as the session starts (when a selected test needs it), so that its quarter
of a minute of installing overlaps other tests instead of holding the workers that wait.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

# Byte code is cached for this run and the processes it starts, even where the environment
# says PYTHONDONTWRITEBYTECODE (these machines do): without the cache every xdist worker
# rewrites each test module's asserts and compiles tmpl-lint from source, and so does every
# tmpl-lint the tests run, seconds of CPU per worker and a tenth of one per process. Set
# here, before the test modules are imported and the workers started (they inherit it).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# tmpl-lint's cache (compiled templates, tokenizers built from GGUF files) is, for this run, a
# directory of its own, made by the process that starts the run: xdist's workers and every
# tmpl-lint the tests start inherit it, so they share what one of them compiled or built (a
# Qwen2.5 tokenizer takes seconds to build), no run is served what an earlier one kept, and
# the user's cache is never touched.
TEST_CODE_CACHE = None if "PYTEST_XDIST_WORKER" in os.environ else tempfile.mkdtemp(prefix="tmpl-lint-tests-")
if TEST_CODE_CACHE is not None:
    os.environ["TMPL_LINT_CACHE_DIR"] = TEST_CODE_CACHE
    os.environ.pop("TMPL_LINT_NO_CACHE", None)
    # The key that authenticates cache entries (linter/sealed.py) lives outside the cache,
    # in $XDG_STATE_HOME: a folder of this run too, never the user's.
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="tmpl-lint-tests-state-")
# The environment as the session starts: the pre-commit build runs in a thread beside tests
# that monkeypatch os.environ (HOME, XDG_CACHE_HOME...), and must not inherit their values.
SESSION_ENVIRONMENT = dict(os.environ)

from helpers import PROJECT, built_once  # noqa: E402

from tmpl_lint import __version__  # noqa: E402

PRE_COMMIT = shutil.which("pre-commit") or shutil.which("pre-commit", path=os.path.dirname(sys.executable))
needs_pre_commit = pytest.mark.skipif(
    not PRE_COMMIT or not (PROJECT / ".git").exists(), reason="needs pre-commit and a git checkout"
)


def readme_snippet() -> str:
    """The README's .pre-commit-config.yaml, as a user copies it."""
    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    return re.search(r"```yaml\n(# \.pre-commit-config\.yaml\n.*?)```", readme, re.DOTALL).group(1)


# The tag the hook repository is given: the version, as a release would be tagged.
HOOK_REV = f"v{__version__}"
# pre-commit installing this repository's hooks (.pre-commit-hooks.yaml) itself, as the
# publishers' guide shows it for a repository URL: both hooks, which the tests run by id.
MANAGED_CONFIG = """repos:
  - repo: {repository}
    rev: {rev}
    hooks:
      - id: tmpl-lint
      - id: tmpl-lint-fix
"""


def git(*args, cwd, env=None):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env or SESSION_ENVIRONMENT)


IDENTITY = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


@pytest.fixture(scope="session")
def shared_folder(tmp_path_factory) -> Path:
    """A folder of this run that every xdist worker sees: the parent of the workers' own
    base folders, or without xdist the session's (its parent is every run's)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def snapshot_this_tree(snapshot: Path) -> None:
    """This working tree as pre-commit fetches a hook repository: committed (uncommitted
    changes included) and tagged with the version."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=PROJECT).stdout.split("\0")
    for name in filter(None, listed):
        source = PROJECT / name
        if source.is_file():
            (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, snapshot / name)
    environment = {**SESSION_ENVIRONMENT, **IDENTITY}
    git("init", "-q", cwd=snapshot)
    git("add", ".", cwd=snapshot)
    git("commit", "-qm", "snapshot", cwd=snapshot, env=environment)
    git("tag", HOOK_REV, cwd=snapshot)


def hook_repository_in(shared: Path) -> Path:
    return built_once(shared, "tmpl-lint", snapshot_this_tree)


def pre_commit_home_in(shared: Path) -> Path:
    """pre-commit's home, with the hooks of ``hook_repository_in(shared)`` installed."""
    hook_repository = hook_repository_in(shared)

    def install_hooks(home: Path) -> None:
        repo = consumer(home / "install", hook_repository, {})
        subprocess.run(
            [PRE_COMMIT, "install-hooks"], cwd=repo, env=with_store(home), check=True, capture_output=True, timeout=900
        )

    return built_once(shared, "pre-commit-home", install_hooks)


@pytest.fixture(scope="session", autouse=True)
def pre_commit_built_ahead(request, shared_folder):
    """Starts building pre-commit's environment in a thread as the session starts, if a
    selected test needs it. A failed build is left to the fixture below, which builds
    again and fails the test that needs it."""
    if not PRE_COMMIT or not (PROJECT / ".git").exists():
        yield
        return
    if not any("environment" in item.fixturenames for item in request.session.items):
        yield
        return

    def build() -> None:
        with contextlib.suppress(Exception):  # said by the fixture, which builds it again
            pre_commit_home_in(shared_folder)

    builder = threading.Thread(target=build, name="pre-commit environment", daemon=True)
    builder.start()
    yield
    builder.join()  # no install left running after the session


@pytest.fixture(scope="session")
def hook_repository(shared_folder) -> Path:
    return hook_repository_in(shared_folder)


def with_store(home: Path) -> dict[str, str]:
    """The environment pre-commit runs in, with its store (hook environments) in ``home``."""
    return {**SESSION_ENVIRONMENT, **IDENTITY, "PRE_COMMIT_HOME": str(home / "store"), "NO_COLOR": "1"}


@pytest.fixture(scope="session")
def environment(shared_folder) -> dict[str, str]:
    """pre-commit's environment, with the hooks installed once for the run."""
    return with_store(pre_commit_home_in(shared_folder))


def consumer(root: Path, hook_repository: Path, files: dict[str, Path]) -> Path:
    """A git repository whose pre-commit config installs ``hook_repository``'s hooks, with
    ``files`` (name: source), committed."""
    return configured(root, MANAGED_CONFIG.format(repository=hook_repository, rev=HOOK_REV), files)


def configured(root: Path, config: str, files: dict[str, Path]) -> Path:
    """A git repository with ``config`` as its .pre-commit-config.yaml and ``files`` (name:
    source), committed."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / ".pre-commit-config.yaml").write_text(config)
    for name, source in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, repo / name)
        (repo / name).chmod(0o644)
    git("init", "-q", cwd=repo)
    git("add", ".", cwd=repo)
    git("-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-qm", "start", "--no-verify", cwd=repo)
    return repo


@pytest.fixture(scope="session")
def installed(environment) -> Path:
    """The bin directory of pre-commit's environment: tmpl-lint installed without extras."""
    (found,) = Path(environment["PRE_COMMIT_HOME"]).glob("repo*/py_env-*/bin/tmpl-lint")
    return found.parent


@pytest.fixture
def llamacpp_engine():
    """Skips where llama.cpp's engine cannot render: asked as a test starts, not as its
    module is collected, where every xdist worker compiled the engine at once (seconds of CPU
    each); under xdist it is compiled into the run's cache as the workers start
    (``compile_llamacpp``), and they load it."""
    from tmpl_lint.engines import llamacpp

    why = llamacpp.available()
    if why is not None:
        pytest.skip(why)


def compile_llamacpp() -> None:
    """llama.cpp's engine compiled into the run's cache (seconds of CPU), where the workers
    and every tmpl-lint the tests start load it; not installed, its tests skip."""
    with contextlib.suppress(Exception):
        from tmpl_lint.engines import llamacpp

        llamacpp.ready()


COMPILING: list[threading.Thread] = []


def pytest_xdist_setupnodes(config, specs):
    """Under xdist, the process that deals the tests compiles llama.cpp's engine while the
    workers start and collect, once for the run: a test module asking whether it renders as
    it was collected had each worker compile it, both at once, and a tmpl-lint started before
    any test asked compiles it too."""
    if TEST_CODE_CACHE is not None:
        COMPILING.append(threading.Thread(target=compile_llamacpp, name="llama.cpp engine", daemon=True))
        COMPILING[-1].start()


def pytest_unconfigure(config):
    for thread in COMPILING:
        thread.join()  # it writes into the cache removed below
    if TEST_CODE_CACHE is not None:
        shutil.rmtree(TEST_CODE_CACHE, ignore_errors=True)


# Tests that share what a process keeps, each group run by one xdist worker (nodeid prefixes
# after "tests/"):
# - modules that load the real tokenizers of ../shared (one to three seconds each, kept for
#   the process by helpers.shared_tokenizer, helpers.transformers_tokenizer and module
#   fixtures) and import transformers: dealt one by one, both workers loaded them all (16
#   CPU-s of 64 for these modules, one run);
# - the --fix/--diff fuzz in its four containers, which draw the same templates and share
#   the library's fix of each (test_fuzz.fixed_by_the_library) and the runs of --diff and
#   --fix over the four files (test_fuzz.RUNS);
# - the shared corpus's expectations, which all read one CLI run over the corpus (its report
#   fixture): split between the workers, one of them waited seconds for the other's run.
ONE_WORKER_GROUPS = {
    # in the order they run (dealing_order): those that fork most first, while the worker is
    # smallest (test_replay forks 26 times, test_diff 19), those that load most last
    "real tokenizers": (
        "test_replay.py::",
        "test_diff.py::",
        "test_harmony.py::",
        "test_prover_tokens.py::",
        "test_prefix_encoder.py::",
        "test_tokenizer.py::",
        # issue 32's engine checks: every shared tokenizer, openai-harmony, transformers
        "test_text_is_text.py::",
        "test_render_command.py::",
        "test_validate.py::",
        "test_engine_replay_golden.py::",
        "test_engine_golden.py::",
    ),
    "fix and diff fuzz": ("test_fuzz.py::test_fix_and_diff_change_only_the_template_and_agree[",),
    "shared corpus": ("test_shared_corpus.py::",),
}


def group_of(nodeid: str) -> str | None:
    test = nodeid.removeprefix("tests/")
    return next((name for name, prefixes in ONE_WORKER_GROUPS.items() if test.startswith(prefixes)), None)


# Tests that fork no process of their own (they run in the worker, or start programs, which
# Python starts with vfork) say so with ``@pytest.mark.no_fork`` (a module's ``pytestmark``
# or a test's decorator): after them, the order in which xdist deals the rest. A fork copies
# the worker's page tables and the child's writes copy its pages, so its cost grows with the
# worker: one that has loaded the real tokenizers holds about 1 GB, three to six times
# another, and the tests that fork after them on that worker spent half as much CPU again
# (test_fix_closure's four chunks 21 CPU-s against 13 on the other worker, one run). So the
# tokenizer group is dealt after the tests that fork, but for test_gguf's, and these come
# last: while one worker runs the group the other takes test_gguf's tests and then these,
# and then both do. What the other worker has left as the group starts must be at least as
# long as the group (about 55 CPU-s, -n 0 file by file), or the group's worker ends last:
# these come to about 50 (pre-commit's environment is built beside them, in a thread), and
# test_gguf's 26 make the margin (its worker keeps the tokenizers it builds from GGUF files,
# so they come last of those that fork). The long ones (``no_fork(long=True)``) come first,
# as they are dealt best (they run in the worker: a long one last would leave the other idle).


def dealing_order(item: pytest.Item) -> tuple[int, int]:
    """Where xdist deals a test: the groups that fork first (the fix and diff fuzz is the
    largest unit, the shared corpus the one of most tests), then the tests that fork but
    test_gguf's, then the real tokenizers' group, then test_gguf's tests that fork, then the
    no_fork tests, long first."""
    nodeid = item.nodeid
    group = group_of(nodeid)
    if group in ("fix and diff fuzz", "shared corpus"):
        return (0, 0)
    if group == "real tokenizers":
        test = nodeid.removeprefix("tests/")
        return (2, next(index for index, prefix in enumerate(ONE_WORKER_GROUPS[group]) if test.startswith(prefix)))
    test = nodeid.removeprefix("tests/")
    no_fork = item.get_closest_marker("no_fork")
    if no_fork is not None:
        return (4, 0 if no_fork.kwargs.get("long") else 1)
    # test_gguf builds tokenizers from GGUF files, which its worker keeps (about 200 MB): its
    # tests fork after the others do, while the other worker runs the real tokenizers' group.
    return (3, 0) if test.startswith("test_gguf.py::") else (1, 0)


def pytest_collection_modifyitems(config, items):
    """Under xdist, each worker collects in the dealing order (every worker alike, as xdist
    requires), and the scheduler below deals in collection order. Without xdist the order is
    pytest's own."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=dealing_order)  # stable: pytest's order within


def pytest_xdist_make_scheduler(config, log):
    """xdist's load scheduling (tests dealt one at a time as workers free up), except that each
    group of ONE_WORKER_GROUPS is one unit, run by one worker while the other takes the rest,
    and that units are dealt in collection order (see dealing_order), not largest first.
    (xdist's own --dist loadgroup cannot do this here: it marks a group by rewriting a test's
    nodeid, which pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "load":
        return None  # another --dist asked for on the command line: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the order is dealing_order's

    class LoadWithOneWorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return LoadWithOneWorkerGroups(config, log)
