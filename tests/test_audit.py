"""`tmpl-lint audit` over a real Hugging Face cache layout built on disk, offline."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import CORPUS, SHARED, SHARED_TEMPLATES, built_once, chromium_dom, needs_shared

from tmpl_lint.checker import lint_source
from tmpl_lint.cli import main
from tmpl_lint.sources import collect

# The audits run in this process (audit) fork their workers from it; the tests that only
# start programs (audit_process, chromium) or run in the worker say so (conftest.dealing_order).
pytestmark = needs_shared
no_fork_long = pytest.mark.no_fork(long=True)
pytest.importorskip("huggingface_hub")

REPOS = {
    # repo id: {file in the repo: source of its bytes}
    "qwen/qwen3-chat": {"tokenizer_config.json": SHARED / "tokenizers" / "qwen3" / "tokenizer_config.json"},
    "someone/qwen3-finetune": {"tokenizer_config.json": SHARED / "tokenizers" / "qwen3" / "tokenizer_config.json"},
    "openai/oss-like": {"chat_template.jinja": SHARED_TEMPLATES / "openai--gpt-oss-120b.jinja"},
    "qwen/qwen25-chat": {"chat_template.jinja": SHARED_TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja"},
    "sakura/qwen25-finetune": {
        "tokenizer_config.json": SHARED / "corpus" / "configs" / "SakuraLLM--Sakura-14B-Qwen2.5-v1.0" / "tokenizer_config.json"
    },
    "mistral/nemo-like": {"chat_template.jinja": SHARED_TEMPLATES / "mistralai--Mistral-Nemo-Instruct-2407.jinja"},
}


def build_cache(home: Path) -> Path:
    """The models--org--name/{blobs,refs,snapshots} layout huggingface_hub writes."""
    hub = home / "hub"
    for _index, (repo, files) in enumerate(REPOS.items()):
        root = hub / ("models--" + repo.replace("/", "--"))
        commit = hashlib.sha1(repo.encode()).hexdigest()
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text(commit)
        snapshot = root / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (root / "blobs").mkdir(exist_ok=True)
        for name, origin in files.items():
            data = origin.read_bytes()
            blob = root / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    return hub


def audit_process(home, *args, cwd=None) -> subprocess.CompletedProcess:
    """`tmpl-lint audit ARGS` in a process of its own, with HF_HOME=home and HF_HUB_OFFLINE=1
    in its environment, as a user runs it."""
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", "audit", *args], capture_output=True, text=True, env=env, timeout=600, cwd=cwd
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def audit(home, *args, cwd=None) -> subprocess.CompletedProcess:
    """`tmpl-lint audit ARGS` with HF_HOME=home and HF_HUB_OFFLINE=1, in this process (a
    process start and its imports cost several times the audit of a small cache).
    huggingface_hub reads its environment once, into its constants module, which it reads at
    each call: the module is executed again under that environment, as a process started with
    it executes it, and again after. The tests that run audit_process show a real process
    reading the variables."""
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(home))
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("NO_COLOR", "1")
        for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
            patch.delenv(name, raising=False)  # each would decide over the two above
        if cwd is not None:
            patch.chdir(cwd)
        try:
            importlib.reload(constants)
            assert constants.HF_HUB_OFFLINE  # never the network
            assert Path(constants.HF_HUB_CACHE) == Path(home) / "hub"
            result = CliRunner().invoke(main, ["audit", *map(str, args)])
        finally:
            patch.undo()
            importlib.reload(constants)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return subprocess.CompletedProcess(["tmpl-lint", "audit", *args], result.exit_code, result.stdout, result.stderr)


def direct_codes(path: Path) -> set[str]:
    sources, _ = collect([path])
    return {finding.code for finding in lint_source(sources[0])}


def from_cache_audit(shared_folder: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """`audit --from-cache --no-cache --no-prove --format json --html PAGE` over
    build_cache's layout, and PAGE: run once a run (helpers.built_once, which xdist's
    workers share) for the two tests that read it, the report's rows and the HTML page.
    (test_results_cache_resumes reads a --from-cache JSON report written without --html.)"""

    def run_audit(folder: Path) -> None:
        build_cache(folder)
        ran = audit_process(
            folder, "--from-cache", "--no-cache", "--no-prove", "--format", "json", "--html", str(folder / "audit.html")
        )
        (folder / "run.json").write_text(json.dumps([ran.returncode, ran.stdout, ran.stderr]))

    folder = built_once(shared_folder, "audit-from-cache", run_audit)
    returncode, stdout, stderr = json.loads((folder / "run.json").read_text())
    return subprocess.CompletedProcess([], returncode, stdout, stderr), folder / "audit.html"


@no_fork_long
def test_from_cache_reports_every_repo_and_analyses_duplicates_once(shared_folder):
    result, _ = from_cache_audit(shared_folder)
    report = json.loads(result.stdout)
    rows = {row["repo"]: row for row in report["rows"]}
    assert sorted(rows) == sorted(REPOS)
    # two Qwen3 copies and a Qwen2.5 template shared with a fine-tune: 4 distinct of 6
    assert report["distinct_templates"] == 4
    assert report["analysed_templates"] == 4
    for repo, files in REPOS.items():
        ((name, origin),) = files.items()
        assert set(rows[repo]["codes"]) == direct_codes(origin), repo
    assert result.returncode == 1


@no_fork_long
def test_named_repos_offline_and_a_missing_one_does_not_stop_the_batch(tmp_path):
    build_cache(tmp_path)
    result = audit_process(
        tmp_path, "qwen/qwen3-chat", "nobody/missing-model", "mistral/nemo-like", "--format", "json", "--no-cache", "--no-prove"
    )
    rows = {row["repo"]: row for row in json.loads(result.stdout)["rows"]}
    assert rows["nobody/missing-model"]["error"] == "not in the local cache, and offline (HF_HUB_OFFLINE=1) or unreachable"
    assert set(rows["qwen/qwen3-chat"]["codes"]) == direct_codes(SHARED / "tokenizers" / "qwen3" / "tokenizer_config.json")
    assert "PC003" in rows["mistral/nemo-like"]["codes"]
    # the repo that could not be read is an input error: one line, and exit 2 once the rest is done
    assert result.stderr == (
        "tmpl-lint: error: nobody/missing-model: not in the local cache, and offline (HF_HUB_OFFLINE=1) or unreachable\n"
    )
    assert result.returncode == 2


def test_results_cache_resumes(tmp_path):
    build_cache(tmp_path)
    cache_file = tmp_path / "results.jsonl"
    first = json.loads(audit(tmp_path, "--from-cache", "--format", "json", "--no-prove", "--cache-file", str(cache_file)).stdout)
    assert first["analysed_templates"] == 4
    # an interruption leaves a cut line: it is ignored, the rest is reused
    with cache_file.open("a") as stream:
        stream.write('{"key": "abc", "findi')
    second = json.loads(audit(tmp_path, "--from-cache", "--format", "json", "--no-prove", "--cache-file", str(cache_file)).stdout)
    assert second["analysed_templates"] == 0
    assert [row["codes"] for row in second["rows"]] == [row["codes"] for row in first["rows"]]


def planted_results(cache_file: Path, lines) -> None:
    """Replace the results cache with ``lines(key)`` for each analysis key it held: what
    anything that can write the cache could plant there (the keys are computable)."""
    keys = sorted(set(re.findall(r'"key": "([0-9a-f]{64})"', cache_file.read_text())))
    assert keys
    cache_file.write_text("".join(line + "\n" for key in keys for line in lines(key)))


def test_a_planted_clean_result_does_not_make_a_failing_template_pass(tmp_path):
    build_cache(tmp_path)
    cache_file = tmp_path / "results.jsonl"
    arguments = ("--from-cache", "--format", "json", "--no-prove", "--cache-file", str(cache_file))
    first = audit(tmp_path, *arguments)
    assert first.returncode == 1 and any(row["codes"] for row in json.loads(first.stdout)["rows"])

    def clean(key):
        entry = json.dumps({"key": key, "findings": []})
        return [entry, f"{'0' * 64} {entry}", f"{hashlib.sha256(entry.encode()).hexdigest()} {entry}"]

    planted_results(cache_file, clean)
    second = audit(tmp_path, *arguments)
    assert (second.returncode, second.stderr) == (1, first.stderr)
    report = json.loads(second.stdout)
    assert report["rows"] == json.loads(first.stdout)["rows"]
    assert report["analysed_templates"] == 4  # analysed again: no planted line is taken


def test_a_damaged_results_cache_line_is_a_miss_not_a_crash(tmp_path):
    build_cache(tmp_path)
    cache_file = tmp_path / "results.jsonl"
    arguments = ("--from-cache", "--format", "json", "--no-prove", "--cache-file", str(cache_file))
    first = audit(tmp_path, *arguments)

    def damaged(key):
        return [
            json.dumps({"key": key, "findings": "PC002"}),
            json.dumps({"key": key, "findings": [1, None]}),
            json.dumps({"key": key, "findings": [{"proof": 3}]}),
            json.dumps([key]),
            json.dumps({"key": key}),
            "\x00\xff" + key,
        ]

    planted_results(cache_file, damaged)
    second = audit(tmp_path, *arguments)
    assert (second.returncode, second.stderr) == (first.returncode, first.stderr)
    assert json.loads(second.stdout)["rows"] == json.loads(first.stdout)["rows"]


def test_a_results_cache_that_is_a_symbolic_link_is_never_written_through(tmp_path):
    build_cache(tmp_path)
    target = tmp_path / "victim"
    target.write_text("keep me\n")
    link = tmp_path / "results.jsonl"
    link.symlink_to(target)
    result = audit(tmp_path, "qwen/qwen25-chat", "--format", "json", "--no-prove", "--cache-file", str(link))
    assert target.read_text() == "keep me\n"
    (row,) = json.loads(result.stdout)["rows"]
    assert row["error"] is None and row["codes"]
    assert result.stderr == (
        f"tmpl-lint: error: {link}: cannot read the results cache: it is a symbolic link (a cache file is never followed)\n"
    )
    assert result.returncode == 2


def test_results_are_kept_in_tmpl_lints_cache_directory(tmp_path, monkeypatch):
    # One place for everything tmpl-lint keeps (TMPL_LINT_CACHE_DIR, else XDG_CACHE_HOME...).
    build_cache(tmp_path)
    monkeypatch.setenv("TMPL_LINT_CACHE_DIR", str(tmp_path / "kept"))
    first = json.loads(audit(tmp_path, "--from-cache", "--format", "json", "--no-prove").stdout)
    assert first["analysed_templates"] == 4
    assert len((tmp_path / "kept" / "audit.jsonl").read_text().splitlines()) == 4
    second = json.loads(audit(tmp_path, "--from-cache", "--format", "json", "--no-prove").stdout)
    assert second["analysed_templates"] == 0


def test_markdown_and_proven_hit_rates(tmp_path):
    build_cache(tmp_path)
    result = audit(tmp_path, "qwen/qwen3-chat", "qwen/qwen25-chat", "--format", "markdown", "--no-cache")
    lines = result.stdout.splitlines()
    assert lines[0] == "| repo | template | findings | first divergence | projected hit rate |"
    qwen3 = next(line for line in lines if line.startswith("| qwen/qwen3-chat"))
    assert "PC002" in qwen3 and "char " in qwen3 and "ideal" in qwen3


def test_every_report_says_why_a_cell_is_empty_and_what_a_finding_that_does_not_fail_is(tmp_path):
    """Qwen2.5's only failing finding is PC004, proven on a tool call's arguments, which
    has no session hit rate: the cell said nothing. Jamba's PC002 is not reproduced, and the
    findings column called it "(info)" where the summary and --statistics say "not reproduced"."""
    models = []
    for name, origin in (("qwen25", "Qwen--Qwen2.5-7B-Instruct.jinja"), ("jamba", "ai21labs--AI21-Jamba-Mini-1.6.jinja")):
        models.append(tmp_path / name)
        models[-1].mkdir()
        shutil.copyfile(SHARED_TEMPLATES / origin, models[-1] / "chat_template.jinja")
    reason = "n/a: proven on a tool call, not a session"
    qwen, jamba = (
        [str(models[0]), "chat_template.jinja", "PC004", "char 839", reason],
        [str(models[1]), "chat_template.jinja", "PC002 (not reproduced), PC004", "char 507", reason],
    )
    rows = json.loads(audit(tmp_path, *map(str, models), "--format", "json", "--no-cache").stdout)["rows"]
    assert [(row["codes"], row["first_divergence"], row["hit_rate"], row["hit_rate_note"]) for row in rows] == [
        (["PC004"], 839, None, reason),
        (["PC002", "PC004"], 507, None, reason),
    ]
    page = tmp_path / "audit.html"
    markdown = audit(tmp_path, *map(str, models), "--format", "markdown", "--html", str(page), "--no-cache").stdout
    assert markdown.splitlines()[2:] == ["| " + " | ".join(cells) + " |" for cells in (qwen, jamba)]
    body = page.read_text().split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    assert body == "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>" for cells in (qwen, jamba))
    # named from their folder: the table's rows fit on one line each at any test's tmp_path
    table = audit(tmp_path, "qwen25", "jamba", "--no-cache", cwd=tmp_path).stdout.splitlines()
    shown = [[cell.strip() for cell in line.strip("│").split("│")] for line in table if line.startswith("│")]
    assert shown == [["qwen25", *qwen[1:]], ["jamba", *jamba[1:]]]


def test_a_hit_rate_only_a_callers_opt_in_meets_is_said_so_and_not_ranked(tmp_path):
    """DeepSeek-V3.1 checks clean by default; its one finding shows only with
    thinking=true (it fails: a deployment may set it, issue 33). Its projected hit rate came
    from that scenario unmarked, and ranked it below a template that fails by default (Qwen3, PC002)."""
    models = []
    for name, origin in (("ds", "deepseek-ai--DeepSeek-V3.1.jinja"), ("q3", "Qwen--Qwen3-0.6B.jinja")):
        models.append(tmp_path / name)
        models[-1].mkdir()
        shutil.copyfile(SHARED_TEMPLATES / origin, models[-1] / "chat_template.jinja")
    rows = json.loads(audit(tmp_path, *map(str, models), "--format", "json", "--no-cache").stdout)["rows"]
    assert [(row["codes"], row["hit_rate_opt_in"]) for row in rows] == [
        (["PC006"], "chat, thinking=true"),
        (["PC002", "PC004", "PC006"], None),
    ]
    assert [finding["fails"] for finding in rows[0]["findings"]] == [True]
    page = tmp_path / "audit.html"
    markdown = audit(tmp_path, *map(str, models), "--format", "markdown", "--html", str(page), "--no-cache").stdout
    deepseek = markdown.splitlines()[2]
    assert deepseek.endswith(f"{rows[0]['hit_rate']:.1%} (ideal {rows[0]['ideal_hit_rate']:.1%}) only in 'chat, thinking=true' |")
    chart = page.read_text().split("<svg", 1)[1].split("</svg>", 1)[0]
    assert str(models[1]) in chart and str(models[0]) not in chart  # only what a default deployment gets is ranked


@no_fork_long
def test_html_report_opens_in_headless_chromium(tmp_path, shared_folder):
    _, page = from_cache_audit(shared_folder)
    assert page.is_file()
    dom = chromium_dom(page, tmp_path / "profile")
    body = dom.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    assert body.count("<tr>") == len(REPOS)
    assert "<svg" in dom


@pytest.mark.no_fork
def test_cache_key_changes_with_the_vllm_server_settings(monkeypatch, tmp_path):
    from tmpl_lint.audit import template_key
    from tmpl_lint.checker import ProveOptions, Selection
    from tmpl_lint.inputs import TemplateSource

    source = TemplateSource(tmp_path / "chat_template.jinja", None, "{{ x }}", "jinja")
    monkeypatch.delenv("VLLM_SYSTEM_START_DATE", raising=False)
    proven, static = template_key(source, ProveOptions(), Selection()), template_key(source, None, Selection())
    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", "2026-01-01")
    assert template_key(source, ProveOptions(), Selection()) != proven
    assert template_key(source, None, Selection()) == static  # a static lint renders nothing


@pytest.mark.no_fork
def test_cache_key_changes_with_the_model_type_and_tokenizer_beside_the_template(tmp_path):
    from tmpl_lint.audit import template_key
    from tmpl_lint.checker import ProveOptions, Selection
    from tmpl_lint.inputs import TemplateSource

    keys = []
    for name, files in {
        "bare": {},
        "gpt-oss": {"config.json": '{"model_type": "gpt_oss"}'},
        "qwen-tokenizer": {"tokenizer.json": '{"v": 1}'},
        "other-tokenizer": {"tokenizer.json": '{"v": 2}'},
        "same-as-bare": {},
    }.items():
        (tmp_path / name).mkdir()
        for file, text in files.items():
            (tmp_path / name / file).write_text(text)
        source = TemplateSource(tmp_path / name / "chat_template.jinja", None, "{{ x }}", "jinja")
        keys.append(template_key(source, ProveOptions(), Selection()))
    assert len(set(keys[:4])) == 4  # each changes what a proof renders or measures
    assert keys[4] == keys[0]


def test_revisions_and_repo_ids_are_checked_before_any_path_is_built(tmp_path):
    hub = build_cache(tmp_path)
    # What 'refs/../../x' would name: a file outside the repo's refs/ holding a real commit.
    commit = hashlib.sha1(b"qwen/qwen3-chat").hexdigest()
    (hub / "x").write_text(commit)
    result = audit(
        tmp_path, "qwen/qwen3-chat@../../x", "../qwen3-chat", "qwen/qwen3-chat@", "org/../x", "--format", "json", "--no-cache"
    )
    rows = [(row["repo"], row["error"]) for row in json.loads(result.stdout)["rows"]]
    assert rows == [
        ("qwen/qwen3-chat@../../x", "not a valid revision: '../../x' (a branch, tag or commit hash)"),
        # written as a path, and no such folder: no repo id either, and said as what it is
        ("../qwen3-chat", "no such folder"),
        ("qwen/qwen3-chat@", "not a valid revision: '' (a branch, tag or commit hash)"),
        (  # a path inside a repo id is still checked as an id
            "org/../x",
            "not a valid repo id: Repo id must be in the form 'repo_name' or 'namespace/repo_name': 'org/../x'. "
            "Use `repo_type` argument if needed.",
        ),
    ]
    # one line per bad spec, and no line after them repeating that nothing was audited
    assert result.stderr.splitlines() == [f"tmpl-lint: error: {repo}: {error}" for repo, error in rows]
    assert result.returncode == 2
    # a branch with a slash, a tag and a commit are revisions
    good = audit(tmp_path, f"qwen/qwen3-chat@{commit}", "--format", "json", "--no-cache", "--no-prove")
    assert json.loads(good.stdout)["rows"][0]["error"] is None
    assert good.returncode == 1


def test_an_audit_that_finds_no_template_says_so_and_exits_2(tmp_path):
    empty = tmp_path / "base-model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    result = audit(tmp_path, str(empty), "--format", "json", "--no-cache")
    # the row of a base model is a warning (README: "a row saying so and fails nothing"); the
    # audit as a whole found nothing to audit: that is the error
    rows = json.loads(result.stdout)["rows"]
    assert [(row["error"], row["warning"]) for row in rows] == [(None, "no chat template")]
    assert result.stderr == "tmpl-lint: error: no chat template found in the 1 repo audited\n"
    assert result.returncode == 2


def test_a_results_cache_on_a_full_disk_is_one_error_and_the_audit_goes_on(tmp_path):
    build_cache(tmp_path)
    result = audit(tmp_path, "qwen/qwen25-chat", "--format", "json", "--no-prove", "--cache-file", "/dev/full")
    (row,) = json.loads(result.stdout)["rows"]
    assert row["repo"] == "qwen/qwen25-chat" and row["error"] is None and row["codes"]
    assert result.stderr == "tmpl-lint: error: /dev/full: cannot write the results cache: No space left on device\n"
    assert result.returncode == 2


def test_the_template_column_names_the_file_the_template_is_in(tmp_path):
    build_cache(tmp_path)
    result = audit(tmp_path, "--from-cache", "--format", "json", "--no-cache", "--no-prove")
    templates = {row["repo"]: row["template"] for row in json.loads(result.stdout)["rows"]}
    assert templates == {repo: next(iter(files)) for repo, files in REPOS.items()}
    table = audit(tmp_path, "--from-cache", "--no-cache", "--no-prove")
    line = next(line for line in table.stdout.splitlines() if "qwen/qwen3-chat" in line)
    assert "tokenizer_config.json" in line


def test_tokens_without_a_tokenizer_says_the_figures_are_characters(tmp_path):
    build_cache(tmp_path)
    result = audit(tmp_path, "--from-cache", "--tokens", "--format", "json", "--no-cache")
    reason = "--tokens: the repo has no tokenizer.json or tokenizer.model; figures are in characters"
    assert result.stderr.splitlines() == [f"tmpl-lint: warning: {repo}: {reason}" for repo in sorted(REPOS)]
    rows = json.loads(result.stdout)["rows"]
    assert {row["warning"] for row in rows} == {reason}
    # (vLLM's openai-harmony render of gpt-oss is measured in harmony's own tokens, tokenizer or not)
    template_units = {finding["proof"]["unit"] for row in rows for finding in row["findings"] if finding["code"] != "PC103"}
    assert template_units == {"char"}


def test_audit_and_check_measure_a_template_alike(tmp_path):
    model = tmp_path / "qwen3"
    shutil.copytree(SHARED / "tokenizers" / "qwen3", model)
    checked = CliRunner(env={"NO_COLOR": "1"}).invoke(main, [str(model), "--format", "json"])
    audited = audit(tmp_path, str(model), "--tokens", "--format", "json", "--no-cache")
    assert audited.stderr == ""  # the tokenizer beside the template loads: no warning
    (row,) = json.loads(audited.stdout)["rows"]
    assert row["template"] == "tokenizer_config.json"

    def figures(findings):
        return [(f["code"], f["proof"]["unit"], f["proof"]["prompt_tokens"], f["proof"]["first_divergence"]) for f in findings]

    assert figures(row["findings"]) == figures(json.loads(checked.stdout))
    assert {unit for _, unit, _, _ in figures(row["findings"])} == {"token"}


def test_the_configuration_gives_the_block_size_of_the_projected_figures(tmp_path, monkeypatch):
    # PC002's fixture first diverges at char 84 (the proof's own figure, either block size):
    # in vLLM's blocks of 16, 80 characters are reusable; in the project's blocks of 4, 84.
    model = tmp_path / "m"
    model.mkdir()
    shutil.copy(CORPUS / "PC002_history_rewrite.jinja", model / "chat_template.jinja")
    monkeypatch.chdir(tmp_path)

    def proof():
        result = CliRunner().invoke(main, ["audit", "m", "--format", "json", "--no-cache", "--jobs", "1"])
        assert result.exit_code == 1, result.output
        (row,) = json.loads(result.stdout)["rows"]
        found = row["findings"][0]["proof"]
        return found["block_size"], found["first_divergence"], found["reusable_chars"]  # no tokenizer: characters

    assert proof() == (16, 84, 80)
    (tmp_path / ".tmpl-lint.yaml").write_text("block-size: 4\n")
    assert proof() == (4, 84, 84)


def test_an_informational_finding_does_not_fail_the_audit_as_it_does_not_fail_check(tmp_path, monkeypatch):
    # PC003_end_marker_bounded's only divergence is the reply's end marker (</s> newest,
    # <|im_end|> in history): a bounded loss, informational; check exits 0, and so does the audit.
    model = tmp_path / "m"
    model.mkdir()
    shutil.copy(CORPUS / "PC003_end_marker_bounded.jinja", model / "chat_template.jinja")
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(main, ["m"]).exit_code == 0
    result = CliRunner().invoke(main, ["audit", "m", "--format", "markdown", "--no-cache", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "| m | chat_template.jinja | PC003 (info) |" in result.stdout


def test_a_cache_folder_whose_name_is_no_repo_id_is_passed_over_with_a_warning(tmp_path):
    # a folder renamed by hand: as an id on the command line, "evil/x<script>" is no repo id
    hub = build_cache(tmp_path)
    real = next(hub.iterdir())
    shutil.copytree(real, hub / "models--evil--x<script>", symlinks=True)
    result = audit(tmp_path, "--from-cache", "--format", "json", "--no-cache", "--no-prove")
    rows = {row["repo"]: row for row in json.loads(result.stdout)["rows"]}
    assert sorted(rows) == sorted([*REPOS, "evil/x<script>"])
    evil = rows["evil/x<script>"]
    assert (evil["error"], evil["template"], evil["findings"]) == (None, None, [])
    assert evil["warning"].startswith("passed over: not a valid repo id: ")
    assert evil["warning"].endswith("(the cache folder models--evil--x<script>)")
    assert f"tmpl-lint: warning: evil/x<script>: {evil['warning']}\n" in result.stderr


def test_an_unreadable_extra_template_is_the_repos_error_and_its_other_templates_are_audited(tmp_path):
    model = tmp_path / "m"
    (model / "additional_chat_templates").mkdir(parents=True)
    shutil.copyfile(CORPUS / "PC001_live_clock.jinja", model / "chat_template.jinja")
    shutil.copyfile(CORPUS / "clean_chatml.jinja", model / "additional_chat_templates" / "tool_use.jinja")
    (model / "additional_chat_templates" / "draft.jinja").write_bytes(b"")
    result = audit(tmp_path, str(model), "--format", "json", "--no-cache", "--no-prove")
    rows = [(row["template"], row["codes"], row["error"]) for row in json.loads(result.stdout)["rows"]]
    assert rows == [
        (None, [], "additional_chat_templates/draft.jinja: empty chat template"),
        ("chat_template.jinja", ["PC001"], None),
        ("additional_chat_templates/tool_use.jinja", [], None),
    ]
    assert result.stderr == f"tmpl-lint: error: {model}: additional_chat_templates/draft.jinja: empty chat template\n"
    assert result.returncode == 2


def test_a_cached_repo_with_a_missing_blob_has_a_row_and_an_error_line(tmp_path):
    # huggingface_hub's scan_cache_dir leaves such a repo out of its list, and says why only
    # in a warning: the audit passed it over and exited as if it were not there
    hub = build_cache(tmp_path)
    root = hub / "models--qwen--qwen25-chat"
    snapshot = next((root / "snapshots").iterdir())
    (snapshot / "tokenizer.json").symlink_to(os.path.relpath(root / "blobs" / "gone", snapshot))  # a download cut short
    result = audit(tmp_path, "--from-cache", "--format", "json", "--no-cache", "--no-prove")
    rows = {row["repo"]: row for row in json.loads(result.stdout)["rows"]}
    assert sorted(rows) == sorted(REPOS)
    problem = (
        f"its cache entry is corrupt, so it is not audited: Blob missing (broken symlink): {(root / 'blobs' / 'gone').resolve()}"
    )
    broken = rows["qwen/qwen25-chat"]
    assert (broken["error"], broken["template"], broken["codes"]) == (problem, None, [])
    assert all(rows[repo]["error"] is None and rows[repo]["template"] for repo in REPOS if repo != "qwen/qwen25-chat")
    assert result.stderr == f"tmpl-lint: error: qwen/qwen25-chat: {problem}\n"
    assert result.returncode == 2


def test_a_download_under_way_is_passed_over_and_a_broken_repo_names_only_its_own_blob(tmp_path):
    # An entry with no snapshots/ holds nothing yet (a download under way or cut short before
    # its first file): passed over, as before. Two broken repos, one name the start of the
    # other's: each error names its own missing blob only.
    hub = build_cache(tmp_path)
    partial = hub / "models--org--partial" / "blobs"
    partial.mkdir(parents=True)
    (partial / "deadbeef.incomplete").write_bytes(b"")
    root = hub / "models--qwen--qwen25-chat"
    twin = hub / "models--qwen--qwen25-chat2"
    shutil.copytree(root, twin, symlinks=True)
    for entry, gone in ((root, "gone"), (twin, "gone2")):
        snapshot = next((entry / "snapshots").iterdir())
        (snapshot / "tokenizer.json").symlink_to(os.path.relpath(entry / "blobs" / gone, snapshot))
    result = audit(tmp_path, "--from-cache", "--format", "json", "--no-cache", "--no-prove")
    rows = {row["repo"]: row for row in json.loads(result.stdout)["rows"]}
    assert sorted(rows) == sorted([*REPOS, "qwen/qwen25-chat2"])
    for repo, entry, gone in (("qwen/qwen25-chat", root, "gone"), ("qwen/qwen25-chat2", twin, "gone2")):
        assert rows[repo]["error"] == (
            "its cache entry is corrupt, so it is not audited: Blob missing (broken symlink): "
            f"{(entry / 'blobs' / gone).resolve()}"
        )
    assert result.returncode == 2


def test_a_repo_is_downloaded_while_the_templates_found_before_it_are_analysed(tmp_path, monkeypatch):
    # The second download waits for the first repo's analysis: an audit that analysed only
    # once every repo was downloaded never gets there (the wait gives up, the repo errs).
    import threading

    from tmpl_lint import audit as auditing
    from tmpl_lint.selection import Selection

    folders = {}
    for repo, template in (("org/first", "clean_chatml.jinja"), ("org/second", "PC001_live_clock.jinja")):
        folders[repo] = tmp_path / repo.replace("/", "--")
        folders[repo].mkdir()
        shutil.copy(CORPUS / template, folders[repo] / "chat_template.jinja")
    analysed = threading.Event()

    class Cache(auditing.ResultsCache):
        def add(self, key, findings):
            super().add(key, findings)
            analysed.set()

    def fetch(spec, with_tokenizer):
        if spec == "org/second" and not analysed.wait(60):
            raise TimeoutError("the first repo was not analysed while this one downloaded")
        return folders[spec], "0" * 40

    monkeypatch.setattr(auditing, "fetch", fetch)
    monkeypatch.setattr(auditing, "offline", lambda: True)
    done = auditing.run_audit(["org/first", "org/second"], [], False, Selection(), None, 2, Cache(None))
    assert [(repo.repo, repo.error) for repo in done.repos] == [("org/first", None), ("org/second", None)]
    assert [done.analyses[key].codes for repo in done.repos for _, key in repo.templates] == [[], ["PC001"]]


# -- the Hugging Face cache is untrusted input: nothing outside it is read -------------------


def planted_entry(hub: Path, repo: str, ref: str | None = None, links: dict[str, Path] | None = None) -> Path:
    """A models--org--name entry whose refs/main says ``ref`` (default: its commit), with
    snapshot files linked to ``links``."""
    root = hub / ("models--" + repo.replace("/", "--"))
    commit = hashlib.sha1(repo.encode()).hexdigest()
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(ref or commit)
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, target in (links or {}).items():
        (snapshot / name).symlink_to(target)
    return root


def outside_model(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(CORPUS / "clean_chatml.jinja", outside / "chat_template.jinja")
    return outside


def test_a_ref_naming_a_folder_outside_the_cache_is_not_read(tmp_path):
    # Offline, huggingface_hub joined refs/main's text to snapshots/ as written: the audit
    # read a template outside the cache, audited it and exited 0.
    hub = build_cache(tmp_path)
    outside_model(tmp_path)
    planted_entry(hub, "evil/escape", ref="../../../outside")
    for spec in ("evil/escape", "evil/escape@main"):
        result = audit(tmp_path, spec, "qwen/qwen25-chat", "--format", "json", "--no-cache", "--no-prove")
        row, other = json.loads(result.stdout)["rows"]
        assert other["repo"] == "qwen/qwen25-chat" and other["error"] is None and other["codes"]  # the rest is audited
        said = f"the Hugging Face cache names {hub}/models--evil--escape/snapshots/../../../outside as its snapshot, which is no commit's folder: not read"
        assert (row["repo"], row["error"], row["codes"]) == (spec, said, [])
        assert result.stderr == f"tmpl-lint: error: {spec}: {said}\n"
        assert result.returncode == 2


def test_a_snapshot_file_linked_outside_the_cache_is_not_read(tmp_path):
    hub = build_cache(tmp_path)
    outside = outside_model(tmp_path)
    planted_entry(hub, "evil/links", links={"chat_template.jinja": outside / "chat_template.jinja"})
    said = f"the Hugging Face cache's chat_template.jinja links outside its entry ({outside / 'chat_template.jinja'}): not read"
    named = audit(tmp_path, "evil/links", "--format", "json", "--no-cache", "--no-prove")
    (row,) = json.loads(named.stdout)["rows"]
    assert (row["error"], named.returncode) == (said, 2)
    every = audit(tmp_path, "--from-cache", "--format", "json", "--no-cache", "--no-prove")
    rows = {row["repo"]: row for row in json.loads(every.stdout)["rows"]}
    assert rows["evil/links"]["error"] == said
    assert all(row["error"] is None for repo, row in rows.items() if repo != "evil/links")  # the rest are audited
    assert every.returncode == 2
