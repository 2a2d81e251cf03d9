import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tmpl_lint.cli import main
from tmpl_lint.inputs import NothingToLint, SourceError, TemplateSource, read_bytes
from tmpl_lint.sources import collect

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def test_tokenizer_config_string_and_named_list(tmp_path):
    single = write(tmp_path / "a" / "tokenizer_config.json", {"chat_template": TEMPLATE, "eos_token": "</s>"})
    named = write(
        tmp_path / "b" / "tokenizer_config.json",
        {"chat_template": [{"name": "default", "template": TEMPLATE}, {"name": "tool_use", "template": TEMPLATE + "!"}]},
    )
    sources, errors = collect([single, named])
    assert errors == []
    assert [(s.path, s.name, s.container) for s in sources] == [
        (single, None, "json"),
        (named, "default", "json"),
        (named, "tool_use", "json"),
    ]
    assert sources[2].text == TEMPLATE + "!"


def test_model_directory_precedence_and_additional_templates(tmp_path):
    write(tmp_path / "tokenizer_config.json", {"chat_template": "from config"})
    write(tmp_path / "chat_template.json", {"chat_template": "from chat_template.json"})
    write(tmp_path / "chat_template.jinja", "from jinja file")
    write(tmp_path / "additional_chat_templates" / "rag.jinja", "rag template")
    sources, errors = collect([tmp_path])
    assert errors == []
    assert [(s.path.name, s.name, s.text) for s in sources] == [
        ("chat_template.jinja", None, "from jinja file"),
        ("rag.jinja", "rag", "rag template"),
    ]
    assert (
        sources[0].note
        == "chat_template.jinja is in force; it overrides the template in chat_template.json, tokenizer_config.json"
    )


def test_a_named_file_another_overrides_is_linted_and_says_which_is_in_force(tmp_path):
    # pre-commit names the tokenizer_config.json a commit touches, whatever lies beside it
    write(tmp_path / "tokenizer_config.json", {"chat_template": "from config"})
    write(tmp_path / "chat_template.json", {"chat_template": "from chat_template.json"})
    (config,), _ = collect([tmp_path / "tokenizer_config.json"])
    assert (config.text, config.note) == (
        "from config",
        "chat_template.json is in force; it overrides the template in tokenizer_config.json",
    )
    write(tmp_path / "chat_template.jinja", "from jinja file")
    (config,), _ = collect([tmp_path / "tokenizer_config.json"])
    (json_file,), _ = collect([tmp_path / "chat_template.json"])
    assert config.note == "chat_template.jinja is in force; it overrides the template in tokenizer_config.json"
    assert json_file.note == "chat_template.jinja is in force; it overrides the template in chat_template.json"
    (jinja_file,), _ = collect([tmp_path / "chat_template.jinja"])
    assert jinja_file.note is None


def test_the_note_names_the_folder_unless_it_is_the_working_directory(tmp_path, monkeypatch):
    write(tmp_path / "m1" / "tokenizer_config.json", {"chat_template": "{{ messages[0].content }}"})
    write(tmp_path / "m1" / "chat_template.jinja", "{{ messages[0].content }}!")
    note = "chat_template.jinja is in force; it overrides the template in tokenizer_config.json\n"
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["m1/tokenizer_config.json", "--no-prove"])
    assert (result.exit_code, result.stdout) == (0, "note: m1: " + note + "All checks passed!\n")
    monkeypatch.chdir(tmp_path / "m1")  # not "note: .: chat_template.jinja ..."
    result = CliRunner().invoke(main, ["tokenizer_config.json", "--no-prove"])
    assert (result.exit_code, result.stdout) == (0, "note: " + note + "All checks passed!\n")
    # a folder whose name holds a newline is quoted as the report quotes every name
    (tmp_path / "m1").rename(tmp_path / "m\n1")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["m\n1/tokenizer_config.json", "--no-prove"])
    assert (result.exit_code, result.stdout) == (0, 'note: "m\\n1": ' + note + "All checks passed!\n")


def test_model_directory_without_jinja_uses_chat_template_json(tmp_path):
    write(tmp_path / "tokenizer_config.json", {"chat_template": "from config"})
    write(tmp_path / "chat_template.json", {"chat_template": "from chat_template.json"})
    sources, errors = collect([tmp_path])
    assert [s.text for s in sources] == ["from chat_template.json"]


def test_directory_walk_finds_nested_models_and_loose_templates(tmp_path):
    write(tmp_path / "org" / "model" / "tokenizer_config.json", {"chat_template": "m"})
    write(tmp_path / "loose" / "x.j2", "j2")
    write(tmp_path / "loose" / "y.jinja", "jinja")
    write(tmp_path / "loose" / "notes.txt", "not a template")
    sources, errors = collect([tmp_path])
    assert errors == []
    assert sorted(s.text for s in sources) == ["j2", "jinja", "m"]


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        (
            "tokenizer_config.json",
            b"{not json",
            "invalid JSON: Expecting property name enclosed in double quotes (line 1, column 2)",
        ),
        ("tokenizer_config.json", b"\xff\xfe{}", "not valid UTF-8 (byte 0)"),
        ("chat_template.json", b"{}", "no chat_template key"),
        (
            "tokenizer_config.json",
            b'{"chat_template": 3}',
            "chat_template is a number, expected a string or a list of named templates",
        ),
        ("tokenizer_config.json", b'{"chat_template": ""}', "empty chat template"),
        ("tokenizer_config.json", b"[1, 2]", "expected a JSON object with a chat_template key"),
        ("tokenizer_config.json", b'{"chat_template": [{"template": "x"}]}', "chat_template[0] has no name"),
        (
            "tokenizer_config.json",
            b'{"chat_template": [{"name": "a", "template": "x"}, {"name": "a", "template": "y"}]}',
            "chat_template names 'a' twice",
        ),
        ("t.jinja", b"\x00\x01binary", "binary file (contains NUL bytes), not a template"),
        ("t.jinja", b"   \n", "empty chat template"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, name, data, message):
    path = write(tmp_path / name, data)
    sources, errors = collect([path])
    assert sources == []
    assert [str(error) for error in errors] == [f"{path}: {message}"]


def test_a_bad_file_does_not_stop_the_batch(tmp_path):
    bad = write(tmp_path / "bad" / "tokenizer_config.json", b"{")
    good = write(tmp_path / "good" / "chat_template.jinja", TEMPLATE)
    sources, errors = collect([tmp_path / "bad", tmp_path / "good", tmp_path / "missing"])
    assert [s.path for s in sources] == [good]
    assert [e.path for e in errors] == [bad, tmp_path / "missing"]


def test_symlink_loop_does_not_hang(tmp_path):
    write(tmp_path / "d" / "t.jinja", TEMPLATE)
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d")
    sources, errors = collect([tmp_path])
    assert [s.path.name for s in sources] == ["t.jinja"]


def test_a_named_link_that_leads_nowhere_says_why(tmp_path):
    (tmp_path / "one.jinja").symlink_to(tmp_path / "two.jinja")
    (tmp_path / "two.jinja").symlink_to(tmp_path / "one.jinja")
    (tmp_path / "gone.jinja").symlink_to(tmp_path / "nothing.jinja")
    _, errors = collect([tmp_path / "one.jinja", tmp_path / "gone.jinja"])
    assert [(error.path.name, error.message) for error in errors] == [
        ("one.jinja", "Too many levels of symbolic links"),  # as os.strerror(ELOOP), what a walk says
        ("gone.jinja", "broken symbolic link"),
    ]


def test_a_models_template_link_that_leads_nowhere_is_an_error_in_a_walk(tmp_path):
    """A cache snapshot whose blob is missing (a download cut short): the link is one error
    line, as when it is named, and the file transformers then loads is linted."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "tokenizer_config.json").symlink_to("../../blobs/missing")
    write(tmp_path / "b" / "tokenizer_config.json", {"chat_template": TEMPLATE})
    (tmp_path / "b" / "chat_template.jinja").symlink_to("../../blobs/gone")
    sources, errors = collect([tmp_path])
    assert [(source.path.relative_to(tmp_path).as_posix(), source.note) for source in sources] == [
        ("b/tokenizer_config.json", None)
    ]
    assert [(error.path.relative_to(tmp_path).as_posix(), error.message) for error in errors] == [
        ("a/tokenizer_config.json", "broken symbolic link"),
        ("b/chat_template.jinja", "broken symbolic link"),
    ]


def test_two_hard_links_to_one_file_are_one_template(tmp_path):
    write(tmp_path / "one.jinja", TEMPLATE)
    os.link(tmp_path / "one.jinja", tmp_path / "two.jinja")
    sources, _ = collect([tmp_path / "one.jinja", tmp_path / "two.jinja", tmp_path])
    assert [source.path.name for source in sources] == ["one.jinja"]


def test_crlf_is_kept_exactly(tmp_path):
    path = write(tmp_path / "t.jinja", b"{{ messages[0].content }}\r\n")
    (source,), _ = collect([path])
    assert source.text == "{{ messages[0].content }}\r\n"


def test_source_error_is_an_exception_with_path():
    error = SourceError(Path("x.json"), "boom")
    assert str(error) == "x.json: boom"


# -- special files, and sizes read rather than stated ----------------------------------------


def lint_process(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "tmpl_lint", *map(str, args), "--no-prove"], capture_output=True, text=True, timeout=timeout
    )


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "models" / "chat.jinja"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    good = write(tmp_path / "models" / "good.jinja", TEMPLATE)
    for named in ([fifo], [tmp_path / "models"]):  # named, and met while walking a folder
        result = lint_process(*named)  # no writer ever opens the FIFO: waiting for one would time out
        assert result.returncode == 2
        assert result.stderr == f"tmpl-lint: error: {fifo}: is a FIFO (named pipe), not a regular file\n"
    assert lint_process(good).returncode == 0


def test_a_device_is_never_read(tmp_path):
    link = tmp_path / "chat_template.jinja"
    link.symlink_to("/dev/zero")
    for named in (Path("/dev/zero"), link):
        result = lint_process(named)  # read until MemoryError before
        assert (result.returncode, result.stderr) == (
            2,
            f"tmpl-lint: error: {named}: is a character device, not a regular file\n",
        )


def test_the_size_limit_counts_the_bytes_read_not_st_size():
    # /proc files state a size of 0 and hold more: the limit must hold on what is read.
    maps = Path("/proc/self/maps")
    assert maps.stat().st_size == 0
    with pytest.raises(SourceError, match="file is over the 100-byte limit for a template"):
        read_bytes(maps, limit=100)
    data, _ = read_bytes(maps, limit=1 << 20)
    assert len(data) > 100


def test_deeply_nested_json_is_one_error_and_the_batch_goes_on(tmp_path):
    deep = write(tmp_path / "a" / "tokenizer_config.json", '{"chat_template": ' + "[" * 100_000 + "]" * 100_000 + "}")
    fine = write(tmp_path / "b" / "chat_template.jinja", "{{ strftime_now('%Y') }}")
    result = lint_process(deep, fine, "--format", "json")
    assert result.returncode == 2
    assert result.stderr == f"tmpl-lint: error: {deep}: invalid JSON: nested too deeply to read\n"
    assert [(finding["path"], finding["code"]) for finding in json.loads(result.stdout)] == [(str(fine), "PC001")]


def test_a_template_less_tokenizer_config_beside_a_template_file_lints_that_file_once(tmp_path):
    # gpt-oss: the template is chat_template.jinja; tokenizer_config.json has none, and
    # pre-commit names both files: the template is linted once.
    config = write(tmp_path / "tokenizer_config.json", {"eos_token": "<|return|>"})
    template = write(tmp_path / "chat_template.jinja", TEMPLATE)
    note = "tokenizer_config.json holds no chat template: transformers loads chat_template.jinja beside it"
    for named in ([config, template], [template, config], [config, config, tmp_path]):
        sources, errors = collect(named)
        assert (errors, [source.path for source in sources]) == ([], [template])
    # an extra template beside it is linted too, without the note: transformers loads it by name
    extra = write(tmp_path / "additional_chat_templates" / "tool_use.jinja", TEMPLATE)
    sources, _ = collect([config])
    assert [(source.path, source.note) for source in sources] == [(template, note), (extra, None)]
    # named alone (`tmpl-lint tokenizer_config.json`, as the tokenizer), the template
    # transformers loads with it is linted, and a note says which file that is: passing
    # it over said "no chat templates found" and exited 0 over a failing template
    write(tmp_path / "chat_template.jinja", "{{ strftime_now('%Y') }}")
    result = CliRunner().invoke(main, [str(config), "--no-prove"])
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0] == f"note: {tmp_path}: {note}"
    assert result.stdout.splitlines()[1].startswith(f"{template}:1:4: PC001 [live-clock]")
    # without the template file beside it, it is a base model's: nothing to lint, which a
    # check says in a warning (and a command that needs a template in an error)
    template.unlink()
    (error,) = collect([config])[1]
    assert isinstance(error, NothingToLint)
    assert str(error) == f"{config}: no chat_template key: nothing to lint (a base model holds no chat template)"


# -- base models: a tokenizer_config.json without a template ---------------------------------


def test_a_base_model_in_a_directory_walk_is_passed_over_and_the_findings_decide_the_exit(tmp_path):
    # A Hugging Face cache or a repo of models holds base models, whose tokenizer config has
    # no chat template: a walk passes them over, as it passes over a GGUF without one.
    write(tmp_path / "base" / "tokenizer_config.json", {"bos_token": "<s>"})
    clean = write(tmp_path / "chat" / "chat_template.jinja", TEMPLATE)
    assert collect([tmp_path]) == ([TemplateSource(clean, None, TEMPLATE, "jinja")], [])
    result = CliRunner().invoke(main, [str(tmp_path), "--no-prove"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "All checks passed!\n", "")
    write(tmp_path / "clock" / "chat_template.jinja", "{{ strftime_now('%Y') }}")
    result = CliRunner().invoke(main, [str(tmp_path), "--no-prove", "--format", "json"])
    assert (result.exit_code, result.stderr) == (1, "")
    assert [finding["code"] for finding in json.loads(result.stdout)] == ["PC001"]
    # a walk of the base model alone finds nothing: the run's warning, as ruff's
    result = CliRunner().invoke(main, [str(tmp_path / "base"), "--no-prove"])
    assert (result.exit_code, result.stdout) == (0, "")
    assert result.stderr == "tmpl-lint: warning: no chat templates found in the given paths\n"


def test_a_named_base_model_tokenizer_config_is_one_warning_and_does_not_fail_the_run(tmp_path):
    # pre-commit names every tokenizer_config.json a commit touches, a base model's too.
    base = write(tmp_path / "base" / "tokenizer_config.json", {"bos_token": "<s>"})
    chat = write(tmp_path / "chat" / "tokenizer_config.json", {"chat_template": TEMPLATE})
    warning = f"tmpl-lint: warning: {base}: no chat_template key: nothing to lint (a base model holds no chat template)\n"
    result = CliRunner().invoke(main, [str(base), str(chat), "--no-prove"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "All checks passed!\n", warning)
    result = CliRunner().invoke(main, [str(base), "--no-prove"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", warning)


def test_a_model_directory_whose_chat_template_json_holds_none_is_still_an_error(tmp_path):
    # chat_template.json exists to hold the template: without one it is a broken file.
    write(tmp_path / "model" / "tokenizer_config.json", {"bos_token": "<s>"})
    write(tmp_path / "model" / "chat_template.json", {})
    assert [str(error) for error in collect([tmp_path])[1]] == [
        f"{tmp_path / 'model'}: no chat template in chat_template.json, tokenizer_config.json"
    ]


# -- named files of a kind tmpl-lint does not read ---------------------------------------------


def test_a_named_file_of_a_kind_tmpl_lint_does_not_read_is_one_warning_and_skipped(tmp_path):
    # Plain prose is a valid Jinja template: linted as one it "passed". As ruff with a file
    # of a type it does not lint, it is skipped with a warning, and the rest is linted.
    prose = write(tmp_path / "readme.txt", "Just some prose.\n")
    clock = write(tmp_path / "clock.jinja", "{{ strftime_now('%Y') }}")
    warning = f"tmpl-lint: warning: {prose}: not a chat template: tmpl-lint does not read .txt files (name a template .jinja)\n"
    result = CliRunner().invoke(main, [str(prose), "--no-prove"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", warning)
    result = CliRunner().invoke(main, [str(prose), str(clock), "--no-prove", "--format", "json"])
    assert (result.exit_code, result.stderr) == (1, warning)
    assert [(finding["path"], finding["code"]) for finding in json.loads(result.stdout)] == [(str(clock), "PC001")]


@pytest.mark.parametrize("name", ["t.jinja", "t.j2", "t.jinja2", "t.tmpl", "template"])
def test_named_template_files_are_read_as_templates(tmp_path, name):
    # A file without an extension is read as ruff reads one as Python: the user named it.
    path = write(tmp_path / name, TEMPLATE)
    assert collect([path]) == ([TemplateSource(path, None, TEMPLATE, "jinja")], [])


def test_a_template_given_with_template_is_read_whatever_its_extension(tmp_path):
    # diff and replay --template: the option says the file is the template.
    from tmpl_lint.diff import read_template

    path = write(tmp_path / "template.txt", TEMPLATE)
    assert read_template(path) == (TEMPLATE, {})


def test_a_yaml_file_of_several_documents_is_one_line_saying_so(tmp_path):
    # valid YAML, which tmpl-lint does not read: not "not valid YAML: expected a single document"
    pytest.importorskip("ruamel.yaml")
    config = tmp_path / "models.yaml"
    config.write_text('a:\n  chat_template: "{{ messages }}"\n---\nb: 1\n')
    result = CliRunner().invoke(main, [str(config), "--no-prove"])
    assert (result.exit_code, result.stderr) == (
        2,
        f"tmpl-lint: error: {config}: holds several YAML documents (---); tmpl-lint reads a file of one\n",
    )


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ('chat_template = f"{BOS}{{{{ messages }}}}"\n', "an f-string"),
        ('chat_template = BOS + "{{ messages }}"\n', "an expression built with +"),
    ],
)
def test_a_python_template_built_by_code_is_named_not_passed_over(tmp_path, line, what):
    # it said "no string assigned to chat_template" where a string plainly is
    pytest.importorskip("libcst")
    source = tmp_path / "serving.py"
    source.write_text('BOS = "<s>"\n' + line)
    result = CliRunner().invoke(main, [str(source), "--no-prove"])
    assert (result.exit_code, result.stderr) == (
        2,
        f"tmpl-lint: error: {source}: chat_template at line 2 is {what}: tmpl-lint reads a template written as a string literal\n",
    )


def test_a_yaml_template_an_alias_or_a_merge_repeats_is_read_once_where_it_is_written(tmp_path):
    # it was a second template, models.0.chat_template, placed at 1:1 (the file's comment)
    pytest.importorskip("ruamel.yaml")
    config = tmp_path / "models.yaml"
    config.write_text(
        "# models\n"
        "defaults: &defaults\n"
        '  chat_template: "{{ messages }}"\n'
        "models:\n"
        "  - <<: *defaults\n"
        "    name: a\n"
        "  - *defaults\n"
        '  - chat_template: "{{ messages[0] }}"\n'
    )
    sources, errors = collect([config])
    assert errors == []
    assert [(source.name, source.text) for source in sources] == [
        ("defaults.chat_template", "{{ messages }}"),
        ("models.2.chat_template", "{{ messages[0] }}"),
    ]


def test_a_python_template_built_by_code_beside_a_literal_is_said_to_be_passed_over(tmp_path, monkeypatch):
    pytest.importorskip("libcst")
    (tmp_path / "serving.py").write_text(
        'BOS = "<s>"\nchat_template = f"{BOS}{{{{ messages }}}}"\nchat_template = "{{ messages[0].content }}"\n'
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["serving.py", "--no-prove"])
    assert (result.exit_code, result.stdout) == (
        0,
        "note: serving.py: passed over: chat_template at line 2 is an f-string: tmpl-lint reads a template written "
        "as a string literal\nAll checks passed!\n",
    )


CLOCK_DAY = '{{ strftime_now("%Y-%m-%d") }}' + TEMPLATE
CLOCK_MINUTE = TEMPLATE + '{{ strftime_now("%H:%M") }}'


def live_clock_model(folder: Path, draft: bytes) -> Path:
    """A model directory with live clocks in its tokenizer config and in one extra template,
    and a second extra template holding ``draft``."""
    write(folder / "tokenizer_config.json", {"chat_template": CLOCK_DAY})
    write(folder / "additional_chat_templates" / "tool_use.jinja", CLOCK_MINUTE)
    write(folder / "additional_chat_templates" / "draft.jinja", draft)
    return folder


@pytest.mark.parametrize(("draft", "message"), [(b"", "empty chat template"), (b"\xff\xfe{{ x }}", "not valid UTF-8 (byte 0)")])
def test_an_unreadable_extra_template_is_its_own_error_and_hides_no_other_template(tmp_path, monkeypatch, draft, message):
    monkeypatch.chdir(tmp_path)
    model = live_clock_model(Path("m"), draft)
    config, tool_use, bad = (
        model / "tokenizer_config.json",
        model / "additional_chat_templates" / "tool_use.jinja",
        model / "additional_chat_templates" / "draft.jinja",
    )
    sources, errors = collect([model])
    assert [(s.path, s.name, s.container) for s in sources] == [(config, None, "json"), (tool_use, "tool_use", "jinja")]
    assert [str(error) for error in errors] == [f"{bad}: {message}"]

    result = CliRunner().invoke(main, ["m", "--no-prove", "-q"])
    assert result.exit_code == 2
    assert result.stderr == f"tmpl-lint: error: m/additional_chat_templates/draft.jinja: {message}\n"
    assert [line.split(" (not proven")[0] for line in result.stdout.splitlines()] == [
        "m/tokenizer_config.json:1:23: PC001 [live-clock]",
        "m/additional_chat_templates/tool_use.jinja:1:54: PC001 [live-clock] (template tool_use)",
        "m/additional_chat_templates/tool_use.jinja:1:54: PC007 [text-after-history] (template tool_use)",
    ]

    result = CliRunner().invoke(main, ["m", "--no-prove", "-q", "--fix", "--unsafe-fixes", "--frozen-date", "2026-01-15"])
    assert result.exit_code == 2
    assert result.stdout.splitlines()[0] == (
        "m/tokenizer_config.json:1:23: fixed PC001 [live-clock]: the model sees the date 2026-01-15 instead of today's"
        " unless the caller passes date_string"
    )
    assert json.loads(config.read_text())["chat_template"] == (
        '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}\n{{ date_string }}' + TEMPLATE
    )
    assert result.stderr == f"tmpl-lint: error: m/additional_chat_templates/draft.jinja: {message}\n"


def test_an_unreadable_template_in_force_is_an_error_and_the_one_it_overrides_is_not_linted_instead(tmp_path):
    model = live_clock_model(tmp_path / "m", TEMPLATE.encode())
    write(model / "chat_template.jinja", b"\xff{{ x }}")
    sources, errors = collect([model])
    assert [(s.path.name, s.name) for s in sources] == [("draft.jinja", "draft"), ("tool_use.jinja", "tool_use")]
    assert [str(error) for error in errors] == [f"{model / 'chat_template.jinja'}: not valid UTF-8 (byte 0)"]
    # Named on its own, a config without a template of its own lints what transformers loads
    # beside it: the extra templates, and the error of the one in force.
    write(model / "tokenizer_config.json", {"eos_token": "</s>"})
    sources, errors = collect([model / "tokenizer_config.json"])
    assert [(s.path.name, s.name, s.note) for s in sources] == [
        ("draft.jinja", "draft", None),
        ("tool_use.jinja", "tool_use", None),
    ]
    assert [str(error) for error in errors] == [f"{model / 'chat_template.jinja'}: not valid UTF-8 (byte 0)"]


def test_an_unreadable_file_named_twice_or_with_its_folder_is_one_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    live_clock_model(Path("m"), b"\xff")
    write(Path("bad.jinja"), b"\xff")
    Path("link.jinja").symlink_to("bad.jinja")
    _, errors = collect(
        [
            Path("bad.jinja"),
            Path("./bad.jinja"),
            tmp_path / "bad.jinja",
            Path("m"),
            Path("m/additional_chat_templates/draft.jinja"),
            Path("link.jinja"),  # a link to bad.jinja: the same file
        ]
    )
    assert [str(error) for error in errors] == [
        "bad.jinja: not valid UTF-8 (byte 0)",
        "m/additional_chat_templates/draft.jinja: not valid UTF-8 (byte 0)",
    ]
    result = CliRunner().invoke(main, ["bad.jinja", "bad.jinja", "--no-prove"])
    assert (result.exit_code, result.stdout) == (2, "No findings; 1 input could not be read (see the errors above).\n")
    assert result.stderr == "tmpl-lint: error: bad.jinja: not valid UTF-8 (byte 0)\n"


def test_adjacent_literals_python_refuses_are_one_error_line_naming_the_file(tmp_path, monkeypatch):
    # Python reads adjacent str literals as one string, and tmpl-lint lints that string; str
    # beside bytes is no string at all (Python refuses to compile it): libcst's validation
    # error ended the batch as an internal error that named no file.
    pytest.importorskip("libcst")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mixed.py").write_text('chat_template = ("{% for m in messages %}"\n    b"{{ m.content }}{% endfor %}")\n')
    (tmp_path / "raw.py").write_text('chat_template = b"{{ messages }}" b"{{ x }}"\n')
    (tmp_path / "joined.py").write_text(
        'chat_template = (\n    "{{ strftime_now(\'%Y\') }}"\n    "{% for m in messages %}{{ m.content }}{% endfor %}"\n)\n'
    )
    result = CliRunner().invoke(main, ["mixed.py", "raw.py", "joined.py", "--no-prove", "--format", "json"])
    assert result.exit_code == 2
    assert result.stderr == (
        "tmpl-lint: error: mixed.py: not valid Python: cannot mix bytes and nonbytes literals (line 2)\n"
        "tmpl-lint: error: raw.py: chat_template at line 1 is a bytes literal: tmpl-lint reads a template written as a "
        "string literal\n"
    )
    # the rest of the batch: the two literals of joined.py linted as the one string Python makes
    assert [(finding["path"], finding["code"], finding["line"]) for finding in json.loads(result.stdout)] == [
        ("joined.py", "PC001", 2)
    ]
