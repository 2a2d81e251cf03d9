import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from helpers import CORPUS, needs_permissions, run_unprivileged, wait_for_children

from tmpl_lint.cli import main


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_text_output_is_ruff_style_with_source_line():
    code, out, _ = run("--output-format", "full", str(CORPUS / "PC001_live_clock.jinja"))
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == (
        f"{CORPUS / 'PC001_live_clock.jinja'}:3:28: PC001 [live-clock] `strftime_now(...)` puts the current time "
        "into the prompt: the prefix cache goes cold whenever the rendered date changes; the rendered prompt changes "
        "per day: it changed when the clock moved a day"
    )
    assert lines[1] == '    3 |     {{- "Current date: " + strftime_now("%Y-%m-%d") + "\\n\\n" }}'
    assert lines[2] == "      | " + " " * 27 + "^"
    assert lines[-2:] == ["Found 1 finding (1 failing).", "[*] 1 fixable with --fix --unsafe-fixes"]


def test_clean_exit_zero():
    code, out, _ = run(str(CORPUS / "clean_chatml.jinja"))
    assert (code, out) == (0, "All checks passed!\n")


def test_json_fields():
    code, out, _ = run("--format", "json", str(CORPUS / "PC002_history_rewrite_switch.jinja"))
    assert code == 1
    (finding,) = json.loads(out)
    assert finding["code"] == "PC002"
    assert finding["name"] == "history-rewrite"
    assert finding["severity"] == "warning"
    assert finding["path"] == str(CORPUS / "PC002_history_rewrite_switch.jinja")
    assert finding["template"] is None
    assert (finding["line"], finding["column"]) == (11, 87)
    assert finding["switch"] == {"name": "keep_history_reasoning", "stable_value": True, "default_is_stable": False}
    assert finding["message"].startswith("how a message renders depends on `ns.last_user`")


def test_named_templates_are_reported_under_their_name(tmp_path):
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "{{ strftime_now('%Y') }}"}]}))
    code, out, _ = run("--output-format", "full", str(config), "-q")
    assert code == 1
    assert (
        out
        == f"{config}:1:{config.read_text().index('strftime_now') + 1}: PC001 [live-clock] (template tool_use) `strftime_now(...)` puts the current time into the prompt: the prefix cache goes cold whenever the rendered date changes; the rendered prompt changes per year: it changed when the clock moved a year\n"
    )


def test_select_and_ignore_by_prefix():
    target = str(CORPUS / "PC003_future_dependent_render.jinja")
    assert run("--select", "PC001", target)[0] == 0
    assert run("--ignore", "PC00", target)[0] == 0
    code, out, _ = run("--ignore", "PC", "--select", "PC003", target, "--format", "json")
    assert code == 1 and {f["code"] for f in json.loads(out)} == {"PC003"}


def test_unknown_code_is_a_usage_error():
    code, _, err = run("--select", "XY1", str(CORPUS))
    assert code == 2
    assert "unknown rule code or prefix: XY1" in err


def test_input_errors_exit_2_and_the_rest_is_linted(tmp_path):
    bad = tmp_path / "tokenizer_config.json"
    bad.write_text("{oops")
    code, out, err = run(str(bad), str(CORPUS / "PC001_live_clock.jinja"), "-q")
    assert code == 2
    assert "PC001" in out
    assert err == f"tmpl-lint: error: {bad}: invalid JSON: Expecting property name enclosed in double quotes (line 1, column 2)\n"


@needs_permissions
def test_an_unreadable_file_or_folder_named_is_one_error_line_and_the_rest_is_linted(tmp_path):
    # click's own readability check was a three-line usage error that stopped the batch
    unreadable = tmp_path / "unreadable.jinja"
    unreadable.write_text("{{ messages }}")
    unreadable.chmod(0)
    unsearchable = tmp_path / "model"  # listed, but its files cannot be reached
    unsearchable.mkdir()
    (unsearchable / "chat_template.jinja").write_text("{{ messages }}")
    unsearchable.chmod(0o644)
    live_clock = str(CORPUS / "PC001_live_clock.jinja")
    result = run_unprivileged(str(unreadable), str(unsearchable), live_clock, "-q", "--no-prove")
    assert result.returncode == 2
    assert result.stderr == (
        f"tmpl-lint: error: {unreadable}: permission denied\ntmpl-lint: error: {unsearchable}: permission denied\n"
    )
    assert result.stdout.startswith(f"{live_clock}:3:28: PC001 [live-clock] ")


@needs_permissions
def test_an_unsearchable_tokenizer_folder_is_one_error_line(tmp_path):
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer_config.json").write_text("{}")
    tokenizer.chmod(0o644)
    result = run_unprivileged(str(CORPUS / "clean_chatml.jinja"), "--tokenizer", str(tokenizer))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"tmpl-lint: error: {tokenizer}: permission denied\n"


def test_a_newline_in_a_file_name_is_quoted_as_git_quotes_it_and_splits_no_line(tmp_path):
    template = tmp_path / "nl\nx.jinja"
    template.write_text((CORPUS / "PC001_live_clock.jinja").read_text())
    missing = tmp_path / "gone\tz.jinja"
    code, out, err = run("--output-format", "full", str(template), str(missing), "-q", "--no-prove")
    assert code == 2
    assert out.splitlines() == [
        f'"{tmp_path}/nl\\nx.jinja":3:28: PC001 [live-clock] (not proven: --no-prove) `strftime_now(...)` puts the '
        "current time into the prompt: the prefix cache goes cold whenever the rendered date changes"
    ]
    assert err == f'tmpl-lint: error: "{tmp_path}/gone\\tz.jinja": no such file or directory\n'
    code, out, _ = run(
        "--output-format", "full", str(template), "-q", "--no-prove", "--fix", "--unsafe-fixes", "--frozen-date", "2026-01-15"
    )
    assert out.splitlines()[0].startswith(f'"{tmp_path}/nl\\nx.jinja":3:28: fixed PC001 [live-clock]: ')


def test_statistics_and_exit_zero():
    # The PC003 fixtures, not the whole corpus: the count is theirs, and proving the rest cost
    # seconds. They fail a run without --exit-zero.
    fixtures = [str(path) for path in sorted(CORPUS.glob("PC003_*.jinja"))]
    assert run("--statistics", *fixtures)[0] == 1
    code, out, _ = run("--statistics", "--exit-zero", *fixtures)
    assert code == 0
    # five fixtures; PC003_future_dependent_render's two findings share one divergence and count
    # once; PC003_unproven_same_text_either_way's renders the same text either way: not
    # reproduced, as the summary says (the row said "(info)")
    assert "    4\tPC003\t[future-dependent-render]\n    1\tPC003\t[future-dependent-render] (not reproduced)\n" in out


def test_statistics_count_what_does_not_fail_on_a_row_of_its_own():
    # PC003_end_marker_bounded's PC003 is informational: only the reply's end marker differs
    # (</s> newest, <|im_end|> in history), a bounded loss. PC006_generation_prompt_mismatch's
    # PC006 opens only with enable_thinking=false, a value a deployment may set: it fails, as
    # PC001 does.
    fixtures = ["PC003_end_marker_bounded.jinja", "PC006_generation_prompt_mismatch.jinja", "PC001_live_clock.jinja"]
    paths = [str(CORPUS / name) for name in fixtures]
    code, out, _ = run("--statistics", *paths)
    assert (code, out) == (
        1,
        "    1\tPC001\t[live-clock]\n    1\tPC003\t[future-dependent-render] (info)\n"
        "    1\tPC006\t[generation-prompt-mismatch]\n",
    )


def test_statistics_say_each_verdict_as_the_summary_counts_it():
    # PC003_unproven_same_text_either_way's PC003 is not reproduced, the bounded PC003 is info.
    fixtures = [
        "PC003_end_marker_bounded.jinja",
        "PC006_generation_prompt_mismatch.jinja",
        "PC001_live_clock.jinja",
        "PC003_unproven_same_text_either_way.jinja",
    ]
    paths = [str(CORPUS / name) for name in fixtures]
    assert run(*paths)[1].splitlines()[-2] == "Found 4 findings (2 failing, 1 not reproduced, 1 info)."
    code, out, _ = run("--statistics", *paths)
    assert (code, out.splitlines()[1:3]) == (
        1,
        ["    1\tPC003\t[future-dependent-render] (not reproduced)", "    1\tPC003\t[future-dependent-render] (info)"],
    )
    code, out, _ = run("--output-format", "full", "--statistics", "--format", "json", *paths)
    assert code == 1
    assert json.loads(out) == [
        {"code": "PC001", "name": "live-clock", "count": 1, "fails": True, "verdict": "failing"},
        {"code": "PC003", "name": "future-dependent-render", "count": 1, "fails": False, "verdict": "not reproduced"},
        {"code": "PC003", "name": "future-dependent-render", "count": 1, "fails": False, "verdict": "info"},
        {"code": "PC006", "name": "generation-prompt-mismatch", "count": 1, "fails": True, "verdict": "failing"},
    ]


@pytest.mark.parametrize("output_format", ["sarif", "github"])
def test_statistics_in_sarif_or_github_is_a_usage_error(output_format):
    code, out, err = run("--statistics", "--format", output_format, str(CORPUS / "PC001_live_clock.jinja"))
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == f"Error: --statistics is not supported with --format {output_format} (use concise or json)"


def test_explicit_check_subcommand_and_module_entry_point():
    assert run("check", str(CORPUS / "clean_chatml.jinja"))[0] == 0
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", str(CORPUS / "clean_chatml.jinja")],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert (result.returncode, result.stdout) == (0, "All checks passed!\n")


def test_missing_path_is_a_clear_error():
    code, _, err = run("does/not/exist.jinja")
    assert code == 2
    assert err == "tmpl-lint: error: does/not/exist.jinja: no such file or directory\n"


def test_a_bad_tokenizer_directory_is_one_error_not_a_finding_per_template(tmp_path):
    code, out, err = run(
        str(CORPUS / "clean_chatml.jinja"), str(CORPUS / "PC001_live_clock.jinja"), "--tokenizer", str(tmp_path / "missing")
    )
    assert (code, out) == (2, "")
    assert err == f"tmpl-lint: error: {tmp_path / 'missing'}: no such tokenizer directory\n"


@pytest.mark.parametrize("cache", ["missing", "a file"])
def test_audit_from_cache_without_a_hugging_face_cache_is_one_error_line(tmp_path, cache):
    pytest.importorskip("huggingface_hub")
    home = tmp_path / "hf"
    if cache == "a file":
        home.mkdir()
        (home / "hub").write_text("")
    environment = {key: value for key, value in os.environ.items() if key != "HF_HUB_CACHE"}
    result = subprocess.run(
        [sys.executable, "-m", "tmpl_lint", "audit", "--from-cache", "--no-cache", "Qwen/Qwen3-8B"],
        capture_output=True,
        text=True,
        env={**environment, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    reason = {
        "missing": "no Hugging Face cache here (--from-cache reads $HF_HUB_CACHE, else $HF_HOME/hub)",
        "a file": "not a folder, so not a Hugging Face cache (--from-cache reads $HF_HUB_CACHE, else $HF_HOME/hub)",
    }[cache]
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"tmpl-lint: error: {home / 'hub'}: {reason}\n"


def test_templates_proven_at_once_report_as_one_after_another():
    # A lower time limit than the default: the PC101 fixture now meets the size limit at once,
    # and the other templates render in milliseconds, far inside either.
    limit = ("--render-timeout", "1")
    one = run(str(CORPUS), "--format", "json", "--jobs", "1", *limit)
    several = run(str(CORPUS), "--format", "json", "--jobs", "3", *limit)
    assert one[0] == several[0] == 1
    assert json.loads(one[1]) == json.loads(several[1])
    assert len({finding["path"] for finding in json.loads(one[1])}) > 10  # many templates, each in order


def test_a_tokenizer_error_is_one_whole_line(tmp_path):
    transformers = pytest.importorskip("transformers")
    directory = tmp_path / "tokenizer"
    directory.mkdir()
    (directory / "tokenizer_config.json").write_text("{}")  # no tokenizer.json, nothing to build one from
    with pytest.raises(Exception) as raised:
        transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    message = str(raised.value)
    assert "\n" in message  # transformers' message spans lines: all of them must be said
    code, out, err = run(str(CORPUS / "clean_chatml.jinja"), "--tokenizer", str(directory))
    assert (code, out) == (2, "")
    assert err == f"tmpl-lint: error: {directory.resolve()}: cannot load tokenizer: {' '.join(message.split())}\n"


def test_a_folder_without_tokenizer_files_says_so(tmp_path):
    # transformers would answer that a slow tokenizer needs sentencepiece to convert
    code, out, err = run(str(CORPUS / "clean_chatml.jinja"), "--tokenizer", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == (
        f"tmpl-lint: error: {tmp_path.resolve()}: no tokenizer here "
        "(no tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json, vocab.txt)\n"
    )


@pytest.mark.parametrize(
    ("number", "code", "message"),
    [(signal.SIGINT, 130, ["tmpl-lint: interrupted"]), (signal.SIGTERM, 143, ["tmpl-lint: terminated"])],
)
@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_a_signal_while_the_modules_load_is_as_later_not_a_traceback(entry, number, code, message):
    # Python says each import as it completes (PYTHONPROFILEIMPORTTIME), so Ctrl-C lands
    # while the command's own modules still load: right after click, which cli imports first.
    script = Path(sys.executable).with_name("tmpl-lint")
    command = [str(script)] if entry == "console script" else [sys.executable, "-m", "tmpl_lint"]
    process = subprocess.Popen(
        [*command, str(CORPUS / "clean_chatml.jinja")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1", "NO_COLOR": "1"},
    )
    imported = []
    for line in process.stderr:
        imported.append(line.rsplit("|", 1)[-1].strip())
        if imported[-1] == "click":
            process.send_signal(number)
            break
    assert "tmpl_lint.cli" not in imported  # still loading it
    out, err = process.communicate(timeout=60)
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert (process.returncode, out, said) == (code, "", message)


def test_ctrl_c_is_130_not_clicks_aborted(tmp_path):
    # SIGINT to the process group, as a terminal sends it on Ctrl-C.
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tmpl_lint",
            str(CORPUS.parent / "tests" / "hostile" / "nested_loops.jinja"),
            "--render-timeout",
            "100",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    # Ctrl-C once the template is rendering in the prover's child (it would for 100 s)
    assert len(wait_for_children(process.pid, 1)) == 1
    time.sleep(0.5)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert err == "tmpl-lint: interrupted\n"  # one line: no blank one before, as click's main() says


# Imported by Python's site as the child starts (it is first on PYTHONPATH): as tmpl_lint.cli
# is about to load, once the entry point handles signals, it says it is waiting and waits for
# Ctrl-C in a place where Python treats exceptions apart (WAIT_IN). The line is said from
# within that place, so Ctrl-C cannot land between the line and it.
WAIT_AS_THE_COMMAND_LOADS = """
import os, sys, time


def wait():
    sys.stderr.write("waiting\\n")
    sys.stderr.flush()
    time.sleep(30)


class WaitInDel:
    def __del__(self):
        wait()


class WaitInSetName:
    def __set_name__(self, owner, name):
        wait()


class WaitAsTheCommandLoads:
    def find_spec(self, name, path=None, target=None):
        if name == "tmpl_lint.cli":
            sys.meta_path.remove(self)
            place = os.environ["WAIT_IN"]
            if place == "exec":
                exec("wait()")
            elif place == "__del__":
                WaitInDel()
            else:
                type("Owner", (), {"attribute": WaitInSetName()})
        return None


sys.meta_path.insert(0, WaitAsTheCommandLoads())
"""


@pytest.mark.parametrize(
    "place",
    [
        # exec() of a string, as dataclasses and namedtuple make their methods as modules
        # load: CPython (3.13 and before) flags a KeyboardInterrupt leaving it as unhandled
        # even once caught, and `python -m` then killed itself with SIGINT after saying
        # "interrupted": -2, in about 1 run in 60 of the load-time test above under load.
        "exec",
        # importlib drops its module locks by weakref callbacks: Python says "Exception
        # ignored in: ... KeyboardInterrupt" there, and the lint went on to its end, exit 0.
        "__del__",
        # Each dataclass field has one: Python 3.11 wraps what it raises in a RuntimeError,
        # a traceback and exit 1.
        "__set_name__",
    ],
)
def test_ctrl_c_where_python_treats_exceptions_apart_is_130_and_one_line(tmp_path, place):
    (tmp_path / "sitecustomize.py").write_text(WAIT_AS_THE_COMMAND_LOADS)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    process = subprocess.Popen(
        [sys.executable, "-m", "tmpl_lint", str(CORPUS / "clean_chatml.jinja")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path, "WAIT_IN": place, "NO_COLOR": "1"},
    )
    assert process.stderr.readline() == "waiting\n"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert (process.returncode, out, err) == (130, "", "tmpl-lint: interrupted\n")


CLEAN = str(CORPUS / "clean_chatml.jinja")


@pytest.mark.parametrize(
    ("command", "value", "message"),
    [
        # a clean template with nan seconds to render failed every render: PC102, exit 1
        (["check", CLEAN, "--render-timeout"], "nan", "Invalid value for '--render-timeout': 'nan' is not a finite number."),
        (["check", CLEAN, "--render-timeout"], "-nan", "Invalid value for '--render-timeout': '-nan' is not a finite number."),
        (
            ["check", CLEAN, "--render-timeout"],
            "inf",
            "Invalid value for '--render-timeout': inf is not in the range 0.01<=x<=3600.",
        ),
        # replay's figures went through int(): an internal error
        (["replay", "log.jsonl", "--kv-cache-gib"], "nan", "Invalid value for '--kv-cache-gib': 'nan' is not a finite number."),
        (
            ["replay", "log.jsonl", "--kv-cache-gib"],
            "inf",
            "Invalid value for '--kv-cache-gib': inf is not in the range 0<x<=1048576.",
        ),
        (
            ["replay", "log.jsonl", "--kv-cache-gib"],
            "1e300",
            "Invalid value for '--kv-cache-gib': 1e+300 is not in the range 0<x<=1048576.",
        ),
    ],
)
def test_a_number_flag_that_is_not_a_finite_number_is_a_usage_error(command, value, message):
    code, out, err = run(*command, value)
    assert (code, out, err.splitlines()[-1]) == (2, "", f"Error: {message}")


def test_every_float_option_of_every_command_refuses_nan_and_inf():
    floats = {
        (name, option.opts[0])
        for name, command in main.commands.items()
        for option in command.params
        if isinstance(option.type, click.types.FloatParamType)
    }
    assert floats == {
        ("check", "--render-timeout"),
        ("replay", "--cache-ttl"),
        ("replay", "--kv-cache-gib"),
        ("validate", "--deadline"),
    }
    for name, flag in sorted(floats):
        for value in ("nan", "inf", "-inf"):
            code, _, err = run(name, "x", flag, value)
            assert (code, err.splitlines()[-1].startswith(f"Error: Invalid value for '{flag}': ")) == (2, True), (name, value)


def test_every_path_option_of_every_command_refuses_an_empty_path(tmp_path, monkeypatch):
    # `--gguf-copy ""` wrote ./MODEL.gguf: each option that names a file or folder says so
    monkeypatch.chdir(tmp_path)
    paths = sorted(
        (name, " / ".join(f"'{opt}'" for opt in option.opts))
        for name, command in main.commands.items()
        for option in command.params
        if isinstance(option, click.Option) and isinstance(option.type, click.Path)
    )
    assert ("check", "'--gguf-copy'") in paths
    for name, shown in paths:
        code, _, err = run(name, "x", shown.split(" / ")[0].strip("'"), "")
        assert (code, err.splitlines()[-1]) == (
            2,
            f"Error: Invalid value for {shown}: an empty path names no file or folder (the working directory is '.')",
        ), (name, shown)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # Path("") is "." : an unset variable in a script linted, or audited, the working directory
        (["check", ""], "Invalid value for 'PATHS...': an empty path names no file or folder (the working directory is '.')"),
        ([""], "Invalid value for 'PATHS...': an empty path names no file or folder (the working directory is '.')"),
        (
            ["check", CLEAN, "--config", ""],
            "Invalid value for '--config': an empty path names no file or folder (the working directory is '.')",
        ),
        (
            ["audit", ""],
            "Invalid value for '[SPECS]...': an empty argument names no repo or folder (the working directory is '.')",
        ),
    ],
)
def test_an_empty_path_is_a_usage_error_not_the_working_directory(tmp_path, monkeypatch, args, message):
    shutil.copyfile(CORPUS / "PC001_live_clock.jinja", tmp_path / "chat_template.jinja")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(*args)
    assert (code, out, err.splitlines()[-1]) == (2, "", f"Error: {message}")


def test_a_template_name_holding_a_newline_is_quoted_and_splits_no_line(tmp_path):
    config = tmp_path / "tokenizer_config.json"
    clock = '{{ strftime_now("%Y") }}{% for m in messages %}{{ m.content }}{% endfor %}'
    config.write_text(json.dumps({"chat_template": [{"name": 'a\nb"', "template": clock}]}))
    code, out, _ = run("--output-format", "full", str(config), "--no-prove", "-q")
    assert code == 1
    assert out.splitlines() == [
        f'{config}:1:55: PC001 [live-clock] (template "a\\nb\\"") (not proven: --no-prove) `strftime_now(...)` puts the '
        "current time into the prompt: the prefix cache goes cold whenever the rendered date changes",
    ]
    code, out, _ = run(
        "--output-format", "full", str(config), "--no-prove", "-q", "--fix", "--unsafe-fixes", "--frozen-date", "2026-01-15"
    )
    assert out.splitlines()[0] == (
        f'{config}:1:55: fixed PC001 [live-clock] (template "a\\nb\\""): the model sees the date 2026 instead of '
        "today's unless the caller passes date_string"
    )
