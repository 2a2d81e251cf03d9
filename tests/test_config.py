"""[tool.tmpl-lint] in pyproject.toml and .tmpl-lint.yaml; flags override them."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from helpers import CORPUS

from tmpl_lint.cli import main


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def codes(out):
    return sorted(f["code"] for f in json.loads(out))


def setup(tmp_path, monkeypatch, config_name, config_text):
    shutil.copyfile(CORPUS / "PC003_future_dependent_render.jinja", tmp_path / "a.jinja")
    shutil.copyfile(CORPUS / "PC001_live_clock.jinja", tmp_path / "b.jinja")
    (tmp_path / config_name).write_text(config_text)
    monkeypatch.chdir(tmp_path)


def test_pyproject_select_and_per_file_ignores(tmp_path, monkeypatch):
    setup(
        tmp_path,
        monkeypatch,
        "pyproject.toml",
        '[tool.tmpl-lint]\nselect = ["PC001", "PC003"]\nper-file-ignores = { "a.jinja" = ["PC003"] }\n',
    )
    code, out, _ = run("a.jinja", "b.jinja", "--format", "json", "--no-prove")
    assert codes(out) == ["PC001"]


def test_flags_override_the_file(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", '[tool.tmpl-lint]\nselect = ["PC001"]\n')
    code, out, _ = run("a.jinja", "b.jinja", "--format", "json", "--no-prove", "--select", "PC003")
    assert codes(out) == ["PC003", "PC003"]


def test_yaml_config_with_block_size(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, ".tmpl-lint.yaml", "# project settings\nignore: [PC003]\nblock-size: 4\n")
    code, out, _ = run("a.jinja", "b.jinja", "--format", "json")
    findings = json.loads(out)
    assert [f["code"] for f in findings] == ["PC001"]
    assert findings[0]["proof"]["block_size"] == 4


def test_frozen_date_from_config(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, ".tmpl-lint.yaml", "frozen-date: 2025-12-24\n")
    run("b.jinja", "--fix", "--unsafe-fixes", "--no-prove")
    assert '{%- set date_string = "2025-12-24" %}' in (tmp_path / "b.jinja").read_text()


def test_unknown_key_is_an_error_naming_it(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", '[tool.tmpl-lint]\nselekt = ["PC001"]\n')
    code, _, err = run("a.jinja")
    assert code == 2
    assert err.startswith(f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: unknown key 'selekt'")


@pytest.mark.parametrize(
    ("key", "meant"), [("selekt", "select"), ("block_size", "block-size"), ("unsafe-fix", "unsafe-fixes"), ("strikt", "strict")]
)
def test_a_mistyped_key_gets_a_did_you_mean(tmp_path, monkeypatch, key, meant):
    setup(tmp_path, monkeypatch, "pyproject.toml", f"[tool.tmpl-lint]\n{key} = true\n")
    code, out, err = run("a.jinja")
    assert (code, out) == (2, "")
    assert err == f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: unknown key {key!r}: did you mean {meant!r}?\n"


def test_a_key_like_no_known_one_lists_the_known_keys(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, ".tmpl-lint.yaml", "colour: red\n")
    code, _, err = run("a.jinja")
    assert code == 2
    assert err == (
        f"tmpl-lint: error: {tmp_path / '.tmpl-lint.yaml'}: unknown key 'colour' (known: select, ignore, per-file-ignores, "
        "block-size, frozen-date, tokenizer, strict, tool-args-style, chat-template-kwargs, unsafe-fixes)\n"
    )


def test_unsafe_fixes_must_be_a_boolean(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", '[tool.tmpl-lint]\nunsafe-fixes = "yes"\n')
    code, _, err = run("a.jinja")
    assert (code, err) == (2, f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: unsafe-fixes must be true or false\n")


def test_bad_value_is_an_error(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, ".tmpl-lint.yaml", "block-size: -3\n")
    code, _, err = run("a.jinja")
    assert code == 2
    assert "block-size must be a positive integer" in err


@pytest.mark.parametrize(
    ("name", "text", "key", "kind"),
    [
        ("pyproject.toml", '[tool.tmpl-lint]\nignore = "PC001"\n', "ignore", "a string"),
        (".tmpl-lint.yaml", "ignore: PC001\n", "ignore", "a string"),
        (".tmpl-lint.yaml", "select: PC001, PC003\n", "select", "a string"),
        (
            "pyproject.toml",
            '[tool.tmpl-lint]\nper-file-ignores = { "a.jinja" = "PC003" }\n',
            "per-file-ignores.a.jinja",
            "a string",
        ),
        (".tmpl-lint.yaml", "select: [1]\n", "select", "a list of other values"),
        (".tmpl-lint.yaml", "ignore:\n", "ignore", "empty (null)"),
    ],
)
def test_codes_that_are_not_a_list_are_one_error_line_naming_the_file(tmp_path, monkeypatch, name, text, key, kind):
    # a string was split on commas: accepted, as ruff does not
    setup(tmp_path, monkeypatch, name, text)
    assert run("a.jinja", "b.jinja", "--no-prove") == (
        2,
        "",
        f'tmpl-lint: error: {tmp_path / name}: {key} must be a list of codes, such as ["PC001"], not {kind}\n',
    )


def test_explicit_config_file(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "elsewhere.yaml", "select: [PC001]\n")
    (tmp_path / "elsewhere.yaml").rename(tmp_path / ".tmpl-lint.yaml")
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    code, out, _ = run(str(tmp_path / "a.jinja"), str(tmp_path / "b.jinja"), "--format", "json", "--no-prove")
    assert codes(out) == ["PC001"]  # found by walking up from the working directory
    code, out, _ = run(str(tmp_path / "a.jinja"), "--format", "json", "--no-prove", "--config", str(tmp_path / ".tmpl-lint.yaml"))
    assert codes(out) == []


def test_per_file_ignores_apply_to_diff_and_fix(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", '[tool.tmpl-lint]\nper-file-ignores = { "b.jinja" = ["PC001"] }\n')
    before = (tmp_path / "b.jinja").read_bytes()
    code, out, err = run("b.jinja", "--diff", "--unsafe-fixes", "--no-prove")
    # --diff: standard output is the patch (none), the report goes to standard error
    assert (code, out, err) == (0, "", "All checks passed!\n")
    run("b.jinja", "--fix", "--unsafe-fixes", "--no-prove")
    assert (tmp_path / "b.jinja").read_bytes() == before


def test_per_file_ignores_name_known_codes(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", '[tool.tmpl-lint]\nper-file-ignores = { "b.jinja" = ["PC999"] }\n')
    code, _, err = run("b.jinja", "--no-prove")
    assert code == 2
    assert "unknown rule code or prefix: PC999" in err


# -- a configuration file that cannot be read: one error line, exit 2, as ruff --------------


def test_an_invalid_pyproject_toml_is_one_error_line_naming_the_file_and_line(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", "[tool.tmpl-lint\n")
    assert run("a.jinja", "--no-prove") == (
        2,
        "",
        f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: invalid TOML: "
        "Expected ']' at the end of a table declaration (at line 1, column 16)\n",
    )


def test_an_invalid_pyproject_toml_of_another_tool_is_an_error_too(tmp_path, monkeypatch):
    # It is the nearest configuration candidate: whether it configures tmpl-lint cannot be
    # known without reading it (ruff errors here too).
    setup(tmp_path, monkeypatch, "pyproject.toml", "[tool.black]\nline-length = \n")
    assert run("a.jinja", "--no-prove") == (
        2,
        "",
        f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: invalid TOML: Invalid value (at line 2, column 15)\n",
    )


def test_a_pyproject_toml_that_is_not_utf8_is_one_error_line(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", "")
    (tmp_path / "pyproject.toml").write_bytes(b"[tool.black]\nname = '\xff'\n")
    assert run("a.jinja", "--no-prove") == (
        2,
        "",
        f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: invalid TOML: not valid UTF-8 (byte 21)\n",
    )


def test_a_tool_tmpl_lint_that_is_not_a_table_is_one_error_line(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", "[tool]\ntmpl-lint = 3\n")
    assert run("a.jinja", "--no-prove") == (
        2,
        "",
        f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: [tool.tmpl-lint] must be a table, not an integer\n",
    )
    (tmp_path / "pyproject.toml").write_text('tool = "tmpl-lint"\n')
    assert run("a.jinja", "--no-prove") == (
        2,
        "",
        f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: invalid pyproject.toml: tool must be a table, not a string\n",
    )


def test_a_nearer_configuration_is_in_force_and_an_invalid_one_further_up_is_not_read(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", "[tool.tmpl-lint\n")
    nearer = tmp_path / "sub"
    nearer.mkdir()
    (nearer / ".tmpl-lint.yaml").write_text("select: [PC001]\n")
    monkeypatch.chdir(nearer)
    code, out, err = run(str(tmp_path / "a.jinja"), str(tmp_path / "b.jinja"), "--format", "json", "--no-prove")
    assert (code, err, codes(out)) == (1, "", ["PC001"])


# -- the command line over the configuration, layered as ruff layers them ---------------------


def test_a_command_line_ignore_adds_to_the_configurations_ignore(tmp_path, monkeypatch):
    # The pre-commit hooks run `tmpl-lint --ignore PC103`: a project's `ignore` must still hold.
    setup(tmp_path, monkeypatch, ".tmpl-lint.yaml", "ignore: [PC001]\n")
    code, out, _ = run("a.jinja", "b.jinja", "--format", "json", "--no-prove", "--ignore", "PC103")
    assert (code, codes(out)) == (1, ["PC003", "PC003"])


def test_a_command_line_ignore_adds_to_the_configurations_select(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", '[tool.tmpl-lint]\nselect = ["PC001", "PC003"]\n')
    code, out, _ = run("a.jinja", "b.jinja", "--format", "json", "--no-prove", "--ignore", "PC0")
    assert (code, codes(out)) == (0, [])  # PC0 is off, however specifically the file selects PC001


def test_the_fix_hooks_command_leaves_what_the_configuration_ignores(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", '[tool.tmpl-lint]\nignore = ["PC001"]\n')
    before = (tmp_path / "b.jinja").read_bytes()
    code, _, _ = run("b.jinja", "--fix", "--unsafe-fixes", "--no-prove", "--ignore", "PC103")
    assert code == 0
    assert (tmp_path / "b.jinja").read_bytes() == before


def test_a_command_line_select_replaces_the_configurations_select_and_ignore(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, ".tmpl-lint.yaml", "select: [PC003]\nignore: [PC001]\n")
    code, out, _ = run("a.jinja", "b.jinja", "--format", "json", "--no-prove", "--select", "PC001")
    assert (code, codes(out)) == (1, ["PC001"])


def test_an_unknown_code_in_the_configuration_is_one_error_line_naming_the_file(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, ".tmpl-lint.yaml", "select: [PC999]\n")
    code, out, err = run("a.jinja", "--no-prove")
    assert (code, out) == (2, "")
    assert err == f"tmpl-lint: error: {tmp_path / '.tmpl-lint.yaml'}: unknown rule code or prefix: PC999\n"


def test_a_yaml_date_that_is_no_date_is_one_error_line(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, ".tmpl-lint.yaml", "frozen-date: 2026-13-01\n")
    code, out, err = run("b.jinja", "--fix", "--unsafe-fixes", "--no-prove")
    assert (code, out) == (2, "")
    assert err.startswith(f"tmpl-lint: error: {tmp_path / '.tmpl-lint.yaml'}: invalid YAML: ")
    assert err.count("\n") == 1 and "internal error" not in err


def test_a_frozen_date_of_another_type_is_one_error_line(tmp_path, monkeypatch):
    for value, shown in (("20260101", "20260101"), ("2026-01-01T10:00:00", "'2026-01-01T10:00:00'")):
        setup(tmp_path, monkeypatch, "pyproject.toml", f"[tool.tmpl-lint]\nfrozen-date = {value}\n")
        code, out, err = run("b.jinja", "--fix", "--unsafe-fixes", "--no-prove")
        assert (code, out) == (2, "")
        assert err == f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: frozen-date must be YYYY-MM-DD, not {shown}\n"
        assert "strftime_now" in (tmp_path / "b.jinja").read_text()


def test_a_duplicate_yaml_key_is_named_with_its_line(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, ".tmpl-lint.yaml", "block-size: 4\nblock-size: 8\n")
    code, out, err = run("b.jinja", "--no-prove")
    assert (code, out) == (2, "")
    assert err == (
        f'tmpl-lint: error: {tmp_path / ".tmpl-lint.yaml"}: invalid YAML: found duplicate key "block-size" '
        'with value "8" (original value: "4") (at line 2, column 1)\n'
    )


def test_no_strict_on_the_command_line_overrides_strict_in_the_configuration(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", "[tool.tmpl-lint]\nstrict = true\n")
    shutil.copyfile(CORPUS / "PC003_unproven_same_text_either_way.jinja", tmp_path / "unproven.jinja")
    code, out, _ = run("unproven.jinja")
    assert (code, out.splitlines()[-1]) == (1, "Found 1 finding (1 failing; 1 of the failing unproven).")
    code, out, _ = run("unproven.jinja", "--no-strict")
    assert (code, out.splitlines()[-1]) == (0, "Found 1 finding (0 failing, 1 not reproduced).")


EMPTY_CODE = "empty rule code or prefix in {!r}: name codes such as PC001 or prefixes such as PC00, separated by commas"


@pytest.mark.parametrize(
    ("flags", "value"),
    [(["--select", ""], ""), (["--select", ","], ","), (["--select", "PC001,"], "PC001,"), (["--ignore", ""], "")],
)
def test_an_empty_code_on_the_command_line_is_a_usage_error(tmp_path, monkeypatch, flags, value):
    # `--select ""` (a script's empty variable) selected every rule, as no --select does
    setup(tmp_path, monkeypatch, "pyproject.toml", "[tool.other]\n")
    code, out, err = run("a.jinja", "--no-prove", *flags)
    assert (code, out, err.splitlines()[-1]) == (2, "", "Error: " + EMPTY_CODE.format(value))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('[tool.tmpl-lint]\nselect = [""]\n', ""),
        ('[tool.tmpl-lint]\nignore = ["PC001", " "]\n', " "),
        ('[tool.tmpl-lint]\nper-file-ignores = { "a.jinja" = ["PC003,"] }\n', "PC003,"),
    ],
)
def test_an_empty_code_in_the_configuration_is_one_error_line_naming_the_file(tmp_path, monkeypatch, text, value):
    setup(tmp_path, monkeypatch, "pyproject.toml", text)
    code, out, err = run("a.jinja", "--no-prove")
    assert (code, out) == (2, "")
    assert err == f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: {EMPTY_CODE.format(value.strip())}\n"


def test_the_configurations_block_size_has_the_flags_bounds(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch, "pyproject.toml", "[tool.tmpl-lint]\nblock-size = 100000000\n")
    code, out, err = run("a.jinja", "--no-prove")
    assert (code, out) == (2, "")
    assert (
        err
        == f"tmpl-lint: error: {tmp_path / 'pyproject.toml'}: block-size 100000000 is over 1048576, the largest --block-size takes\n"
    )
    code, _, err = run("a.jinja", "--no-prove", "--block-size", "100000000")
    assert (code, err.splitlines()[-1]) == (
        2,
        "Error: Invalid value for '--block-size': 100000000 is not in the range 1<=x<=1048576.",
    )
    (tmp_path / "pyproject.toml").write_text("[tool.tmpl-lint]\nblock-size = 1048576\n")
    code, out, _ = run("b.jinja", "--format", "json")
    assert code == 1
    assert json.loads(out)[0]["proof"]["block_size"] == 1048576


@pytest.mark.parametrize(("text", "shown"), [('"tight"', "'tight'"), ("true", "True"), ('["spaced"]', "['spaced']")])
def test_a_tool_args_style_that_is_none_is_one_error_line_naming_the_file(tmp_path, monkeypatch, text, shown):
    setup(tmp_path, monkeypatch, "pyproject.toml", f"[tool.tmpl-lint]\ntool-args-style = {text}\n")
    assert run("a.jinja", "--no-prove") == (
        2,
        "",
        f'tmpl-lint: error: {tmp_path / "pyproject.toml"}: tool-args-style must be "compact" or "spaced", not {shown}\n',
    )


# -- a configuration named on the command line is read as a regular file, within a cap ----


def tmpl_lint_process(*args, cwd):
    import os
    import subprocess
    import sys

    # A process of its own: the FIFO waited for a writer forever, /dev/zero was read without end.
    return subprocess.run(
        [sys.executable, "-m", "tmpl_lint", *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd, env=os.environ
    )


@pytest.mark.parametrize("name", ["settings.yaml", "pyproject.toml"])
def test_a_configuration_that_is_a_fifo_or_a_device_is_one_error_line(tmp_path, name):
    import os

    shutil.copyfile(CORPUS / "PC001_live_clock.jinja", tmp_path / "b.jinja")
    fifo = tmp_path / name
    os.mkfifo(fifo)
    device = tmp_path / f"zero-{name}"
    device.symlink_to("/dev/zero")
    turns = []
    for turn in ("1", "2"):
        (tmp_path / f"turn{turn}.json").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
        turns.append(tmp_path / f"turn{turn}.json")
    for path, why in (
        (fifo, "is a FIFO (named pipe), not a regular file"),
        (device, "is a character device, not a regular file"),
    ):
        for command in (["b.jinja"], ["diff", *turns, "--template", "b.jinja"]):
            result = tmpl_lint_process(*command, "--config", path, cwd=tmp_path)
            assert (result.returncode, result.stdout, result.stderr) == (2, "", f"tmpl-lint: error: {path}: cannot read: {why}\n")


def test_a_configuration_over_the_cap_is_one_error_line(tmp_path, monkeypatch):
    from tmpl_lint import config

    shutil.copyfile(CORPUS / "PC001_live_clock.jinja", tmp_path / "b.jinja")
    big = tmp_path / ".tmpl-lint.yaml"
    big.write_text("# " + "x" * config.MAX_CONFIG_BYTES + "\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run("b.jinja", "--config", str(big))
    assert (code, out, err) == (
        2,
        "",
        f"tmpl-lint: error: {big}: cannot read: file is over the 1048576-byte limit for a configuration\n",
    )


def test_a_model_config_that_is_a_fifo_or_a_device_is_one_error_line(tmp_path):
    import os

    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    for path, why in (
        (fifo, "is a FIFO (named pipe), not a regular file"),
        ("/dev/zero", "is a character device, not a regular file"),
    ):
        result = tmpl_lint_process(
            "replay",
            log,
            "--template",
            CORPUS / "clean_chatml.jinja",
            "--kv-cache-gib",
            "1",
            "--model-config",
            path,
            cwd=tmp_path,
        )
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr == f"tmpl-lint: error: {path}: cannot read model config: {why}\n"
