"""SARIF (validated against the official schema), GitHub annotations, -o FILE."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import CORPUS, SHARED, SHARED_TEMPLATES, needs_shared, prove_text

from tmpl_lint.cli import main

SCHEMA = SHARED / "schemas" / "sarif-schema-2.1.0.json"


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def validate(document):
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.is_file():
        pytest.skip("../shared is not present (fresh clone): no SARIF schema to validate against")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator(schema).validate(document)


@needs_shared
def test_sarif_for_the_whole_shared_corpus_validates(tmp_path):
    out = tmp_path / "report.sarif"
    code, stdout, _ = run(str(SHARED_TEMPLATES), "--format", "sarif", "--no-prove", "-o", str(out))
    assert code == 1 and stdout == ""
    document = json.loads(out.read_text())
    validate(document)
    run_ = document["runs"][0]
    rules = run_["tool"]["driver"]["rules"]
    assert {rule["id"] for rule in rules} >= {"PC000", "PC001", "PC002", "PC003", "PC004", "PC005", "PC006", "PC100", "PC900"}
    assert all(
        rule["shortDescription"]["text"] and rule["fullDescription"]["text"] and rule["help"]["markdown"] for rule in rules
    )
    results = run_["results"]
    assert len(results) > 50
    for result in results:
        assert result["level"] in ("error", "warning", "note")
        assert result["partialFingerprints"]["primaryLocationLineHash"]
        location = result["locations"][0]["physicalLocation"]
        assert location["region"]["startLine"] >= 1


@needs_shared
def test_sarif_region_for_a_tokenizer_config_points_at_the_chat_template_key(tmp_path, monkeypatch):
    config = tmp_path / "tokenizer_config.json"
    config.write_text((SHARED / "tokenizers" / "qwen3" / "tokenizer_config.json").read_text())
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("tokenizer_config.json", "--format", "sarif", "--no-prove")
    document = json.loads(out)
    validate(document)
    lines = config.read_text().splitlines()
    key_line = next(number for number, line in enumerate(lines, 1) if '"chat_template"' in line)
    for result in document["runs"][0]["results"]:
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"] == {"uri": "tokenizer_config.json", "uriBaseId": "%SRCROOT%"}
        assert location["region"]["startLine"] == key_line
        assert result["properties"]["templateLine"] >= 1


def test_github_annotations(tmp_path, monkeypatch):
    target = tmp_path / "chat_template.jinja"
    target.write_text((CORPUS / "PC001_live_clock.jinja").read_text())
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("chat_template.jinja", "--format", "github", "--no-prove")
    assert code == 1
    assert out == (
        "::warning file=chat_template.jinja,line=3,col=28,title=PC001 [live-clock]::(not proven: --no-prove) "
        "`strftime_now(...)` puts the current time into the prompt: the prefix cache goes cold whenever the rendered date changes\n"
    )


def test_sarif_uri_is_percent_encoded_relative_and_absolute(tmp_path, monkeypatch):
    # SARIF 2.1.0 3.10: a URI per RFC 3986; "#" would start a fragment, " " is not allowed.
    (tmp_path / "here").mkdir()
    inside = tmp_path / "here" / "sp ace \u00fc#1.jinja"
    outside = tmp_path / "dir:x" / "a%b?.jinja"
    outside.parent.mkdir()
    for path in (inside, outside):
        path.write_text((CORPUS / "PC001_live_clock.jinja").read_text())
    monkeypatch.chdir(tmp_path / "here")
    code, out, _ = run(inside.name, str(outside), "--format", "sarif", "--no-prove")
    document = json.loads(out)
    validate(document)
    locations = [result["locations"][0]["physicalLocation"]["artifactLocation"] for result in document["runs"][0]["results"]]
    assert locations == [
        {"uri": "sp%20ace%20%C3%BC%231.jinja", "uriBaseId": "%SRCROOT%"},
        {"uri": f"file://{tmp_path.resolve().as_posix()}/dir%3Ax/a%25b%3F.jinja"},  # outside: absolute
    ]


def test_inputs_that_cannot_be_read_are_in_sarif_and_github_annotations(tmp_path, monkeypatch):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "clock.jinja").write_text((CORPUS / "PC001_live_clock.jinja").read_text())
    monkeypatch.chdir(tmp_path)
    code, out, err = run("bad.json", "missing.jinja", "clock.jinja", "--format", "sarif", "--no-prove")
    assert code == 2
    document = json.loads(out)
    validate(document)
    (invocation,) = document["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    notifications = invocation["toolExecutionNotifications"]
    messages = [line.removeprefix("tmpl-lint: error: ") for line in err.splitlines()]
    assert [
        (note["level"], note["locations"][0]["physicalLocation"]["artifactLocation"], note["message"]["text"])
        for note in notifications
    ] == [
        ("error", {"uri": "bad.json", "uriBaseId": "%SRCROOT%"}, messages[0].removeprefix("bad.json: ")),
        ("error", {"uri": "missing.jinja", "uriBaseId": "%SRCROOT%"}, "no such file or directory"),
    ]
    assert messages[0].startswith("bad.json: ") and messages[1] == "missing.jinja: no such file or directory"
    assert [result["ruleId"] for result in document["runs"][0]["results"]] == ["PC001"]
    code, out, err = run("bad.json", "missing.jinja", "clock.jinja", "--format", "github", "--no-prove")
    assert code == 2
    assert out.splitlines()[:2] == [
        f"::error file=bad.json::{messages[0].removeprefix('bad.json: ')}",
        "::error file=missing.jinja::no such file or directory",
    ]
    assert out.splitlines()[2].startswith("::warning file=clock.jinja,line=3,col=28,")
    # a clean run says so
    code, out, _ = run("clock.jinja", "--format", "sarif", "--no-prove")
    assert json.loads(out)["runs"][0]["invocations"] == [{"executionSuccessful": True}]


def test_output_file_is_written_whole(tmp_path):
    out = tmp_path / "findings.json"
    code, stdout, _ = run(str(CORPUS / "PC005_nondeterministic_render.jinja"), "--format", "json", "--no-prove", "-o", str(out))
    assert code == 1 and stdout == ""
    assert [f["code"] for f in json.loads(out.read_text())] == ["PC005"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["findings.json"]


def test_output_into_a_missing_folder_is_an_error(tmp_path):
    code, _, err = run(str(CORPUS / "clean_chatml.jinja"), "-o", str(tmp_path / "no" / "such" / "dir" / "r.txt"))
    assert code == 2
    assert "cannot write the report" in err


def test_sarif_line_in_yaml_is_the_templates_own_line_of_the_right_key(tmp_path, monkeypatch):
    config = tmp_path / "serving.yaml"
    config.write_text(
        "models:\n"
        "  - name: a\n"
        '    chat_template: "{{ messages }}"\n'
        "  - name: b\n"
        "    chat_template: |\n"
        "      {%- for m in messages %}{{ m.content }}{% endfor %}\n"
        '      {{- strftime_now("%Y") }}\n'
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("serving.yaml", "--format", "sarif", "--no-prove")
    results = json.loads(out)["runs"][0]["results"]
    # the clock (PC001), printed after the messages (PC007): both at the call, in one template
    assert [(r["ruleId"], r["properties"]["template"], r["properties"]["templateLine"]) for r in results] == [
        ("PC001", "models.1.chat_template", 2),
        ("PC007", "models.1.chat_template", 2),
    ]
    # the second chat_template key is line 5; its block's second line is line 7
    assert [result["locations"][0]["physicalLocation"]["region"]["startLine"] for result in results] == [7, 7]


def test_sarif_line_in_python_follows_the_literals_own_newlines(tmp_path, monkeypatch):
    (tmp_path / "serving.py").write_text(
        "A = {\n"
        '    "chat_template": "{% for m in messages %}{{ m.content }}\\n{% endfor %}\\n{{ strftime_now(\'%Y\') }}",\n'
        "}\n"
        "\n"
        "class S:\n"
        '    chat_template = """{%- for m in messages %}\n'
        "{{- m.content + '\\\\n' }}\n"
        "{%- endfor %}\\\n"
        '{{- strftime_now("%Y") }}\n'
        '{{ lipsum() }}"""\n'
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("serving.py", "--format", "sarif", "--no-prove")
    found = [
        (
            r["ruleId"],
            r["properties"]["template"],
            r["properties"]["templateLine"],
            r["locations"][0]["physicalLocation"]["region"]["startLine"],
            r["locations"][0]["physicalLocation"]["region"]["startColumn"],
        )
        for r in json.loads(out)["runs"][0]["results"]
    ]
    lines = (tmp_path / "serving.py").read_text().splitlines()
    assert found == [
        # escaped newlines: the whole template is on line 2, the call where it is written (the
        # clock, and the text it prints after the messages, which starts with it)
        ("PC001", "chat_template@2", 3, 2, lines[1].index("strftime_now") + 1),
        ("PC007", "chat_template@2", 3, 2, lines[1].index("strftime_now") + 1),
        # a backslash continuation joins file lines 8 and 9: the call is on line 9
        ("PC001", "chat_template@6", 3, 9, lines[8].index("strftime_now") + 1),
        ("PC007", "chat_template@6", 3, 9, lines[8].index("strftime_now") + 1),
        ("PC005", "chat_template@6", 4, 10, lines[9].index("lipsum") + 1),
    ]


def test_a_template_written_as_adjacent_python_literals_is_placed_in_each(tmp_path, monkeypatch):
    (tmp_path / "serving.py").write_text(
        "chat_template = (\n"
        '    "{% for m in messages %}{{ m.content }}\\n{% endfor %}"  # one part\n'
        "    '{{ strftime_now(\"%Y\") }}'\n"
        ")\n"
    )
    monkeypatch.chdir(tmp_path)
    lines = (tmp_path / "serving.py").read_text().splitlines()
    code, out, _ = run("--output-format", "full", "serving.py", "--no-prove", "-q")
    assert out.splitlines() == [
        f"serving.py:3:{lines[2].index('strftime_now') + 1}: PC001 [live-clock] (template chat_template@2) (not proven: "
        "--no-prove) `strftime_now(...)` puts the current time into the prompt: the prefix cache goes cold whenever the "
        "rendered date changes",
        # the year is printed after the messages, in the second literal
        f"serving.py:3:{lines[2].index('strftime_now') + 1}: PC007 [text-after-history] (template chat_template@2) (not "
        "proven: --no-prove) '{{ strftime_now(\"%Y\") }}' is printed after the messages, outside the generation prompt: "
        "the next turn renders its new messages before it, so the prompt diverges at the end of the last message; "
        "no automatic fix: no edit keeps the model's trained format: it was trained to see this after the messages",
    ]
    code, out, _ = run("--output-format", "full", "serving.py", "--no-prove", "--format", "sarif")
    regions = [r["locations"][0]["physicalLocation"]["region"] for r in json.loads(out)["runs"][0]["results"]]
    assert [(region["startLine"], region["startColumn"]) for region in regions] == [(3, lines[2].index("strftime_now") + 1)] * 2


# -- what fails the run: the proof decides ------------------------------------------------

UNPROVEN = CORPUS / "PC003_unproven_same_text_either_way.jinja"


def test_a_finding_the_proof_does_not_reproduce_is_reported_and_does_not_fail():
    code, out, _ = run("--output-format", "full", str(UNPROVEN))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        f"{UNPROVEN}:5:12: PC003 [future-dependent-render] (not reproduced in 11 scenarios) `loop.last` makes a "
        "message render differently while it is the last one: the next turn renders it again without that"
    )
    assert lines[3] == (
        "      proof: not reproduced in 11 scenarios (unit: char), so it does not fail the run (--strict makes it fail); "
        'tried: "chat", "chat with system", "agent", "agent with system", '
        '"agent, narrated tool calls", "agent, chained tool calls", "clock, everything later", "clock with system, everything later", '
        '"clock with tools, everything later", "clock with system and tools, everything later", '
        '"compact tool arguments replayed as sent"'
    )
    assert lines[-1] == "Found 1 finding (0 failing, 1 not reproduced)."


# The unproven fixture's loop, printing a tool call's arguments by concatenation, as
# DeepSeek-R1 does: transformers hands the template the model's string, vLLM a mapping.
CONCATENATES_ARGUMENTS = UNPROVEN.read_text().replace(
    "{%- if loop.last %}",
    "{%- if message.tool_calls %}{{- '<call>' + message.tool_calls[0].function.arguments }}\n    {%- elif loop.last %}",
)


def test_a_finding_not_reproduced_says_which_scenarios_could_not_be_rendered_and_why(tmp_path):
    (under_hf,) = [finding for finding in prove_text(CONCATENATES_ARGUMENTS, "hf")[1] if finding.code == "PC003"]
    _, (under_vllm,) = prove_text(CONCATENATES_ARGUMENTS, "vllm")
    assert under_hf.proof.status == under_vllm.proof.status == "not-reproduced"
    assert under_hf.proof.unrendered == ()
    untried = set(under_hf.proof.scenarios) - set(under_vllm.proof.scenarios)
    assert {"agent", "agent, chained tool calls"} <= untried
    error = 'TypeError: can only concatenate str (not "dict") to str'
    # the replay of the string as sent fails, then its fallback, the parsed mapping: that one is named
    untried = untried - {"compact tool arguments replayed as sent"} | {"compact tool arguments replayed as a mapping"}
    assert sorted(under_vllm.proof.unrendered) == sorted((name, error) for name in untried)
    assert under_vllm.proof.to_json()["not_rendered"] == [
        {"scenario": name, "error": error} for name, _ in under_vllm.proof.unrendered
    ]
    path = tmp_path / "concatenates.jinja"
    path.write_text(CONCATENATES_ARGUMENTS)
    code, out, _ = run("--output-format", "full", str(path))
    names = ", ".join(f'"{name}"' for name, _ in under_vllm.proof.unrendered)
    assert code == 0
    assert f"             not tried: {names}: the template cannot render them: {error}" in out.splitlines()


def test_strict_makes_a_finding_the_proof_does_not_reproduce_fail():
    code, out, _ = run(str(UNPROVEN), "--strict")
    assert code == 1
    assert out.splitlines()[-1] == "Found 1 finding (1 failing; 1 of the failing unproven)."


def test_strict_from_the_configuration(tmp_path):
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.tmpl-lint]\nstrict = true\n")
    assert run(str(UNPROVEN), "--config", str(config))[0] == 1


def test_without_proofs_static_findings_keep_their_severity_and_say_they_are_unproven():
    code, out, _ = run("--output-format", "full", str(UNPROVEN), "--no-prove")
    assert code == 1
    assert "PC003 [future-dependent-render] (not proven: --no-prove) `loop.last`" in out.splitlines()[0]
    assert out.splitlines()[-1] == "Found 1 finding (1 failing; 1 of the failing unproven)."


def test_json_says_whether_each_finding_fails_and_whether_it_is_proven():
    code, out, _ = run(str(UNPROVEN), "--format", "json")
    (finding,) = json.loads(out)
    assert (code, finding["fails"], finding["unproven"], finding["severity"]) == (0, False, True, "warning")
    assert finding["proof"]["status"] == "not-reproduced"
    # no raw "<think>" replay: the template names no think tag, so it would render it as any text
    assert finding["proof"]["scenarios"][:4] == ["chat", "chat with system", "agent", "agent with system"]
    _, out, _ = run(str(UNPROVEN), "--format", "json", "--strict")
    assert json.loads(out)[0]["fails"] is True
    _, out, _ = run(str(CORPUS / "PC001_live_clock.jinja"), "--format", "json")
    (proven,) = json.loads(out)
    assert (proven["fails"], proven["unproven"]) == (True, False)


def test_sarif_and_github_show_a_finding_that_does_not_fail_as_a_note(tmp_path, monkeypatch):
    target = tmp_path / "chat_template.jinja"
    target.write_text(UNPROVEN.read_text())
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("chat_template.jinja", "--format", "sarif")
    (result,) = json.loads(out)["runs"][0]["results"]
    assert (code, result["level"], result["properties"]["fails"]) == (0, "note", False)
    # the message code scanning shows says it, as the text report and annotations do
    assert result["message"]["text"].startswith("(not reproduced in 11 scenarios) `loop.last`")
    code, out, _ = run("chat_template.jinja", "--format", "sarif", "--no-prove")
    (result,) = json.loads(out)["runs"][0]["results"]
    assert (code, result["level"], result["message"]["text"][:36]) == (1, "warning", "(not proven: --no-prove) `loop.last`")
    code, out, _ = run("chat_template.jinja", "--format", "github")
    assert out.startswith("::notice file=chat_template.jinja,line=5,col=12,")
    assert "::(not reproduced in 11 scenarios) `loop.last`" in out


def test_info_findings_never_fail_even_when_strict():
    # a bounded loss: only the reply's end marker differs (</s> newest, <|im_end|> in history)
    source = (CORPUS / "PC003_end_marker_bounded.jinja").read_text()
    _, (finding,) = prove_text(source)
    assert (finding.severity, finding.proof.bound is not None) == ("info", True)
    assert not finding.fails() and not finding.fails(strict=True)


def test_one_divergence_one_failing_finding_the_other_a_related_location(tmp_path, monkeypatch):
    target = tmp_path / "chat_template.jinja"
    target.write_text((CORPUS / "PC003_future_dependent_render.jinja").read_text())
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("--output-format", "full", "chat_template.jinja", "--format", "sarif")
    document = json.loads(out)
    validate(document)
    (result,) = document["runs"][0]["results"]
    assert (code, result["ruleId"], result["locations"][0]["physicalLocation"]["region"]) == (
        1,
        "PC003",
        {"startLine": 11, "startColumn": 37},
    )
    (related,) = result["relatedLocations"]
    assert related["physicalLocation"]["region"] == {"startLine": 14, "startColumn": 16}
    assert related["physicalLocation"]["artifactLocation"] == {"uri": "chat_template.jinja", "uriBaseId": "%SRCROOT%"}
    assert related["message"]["text"].startswith("PC003 [future-dependent-render] shows the same divergence: `loop.last`")
    code, out, _ = run("--output-format", "full", "chat_template.jinja")
    assert "      related: 14:16: PC003 [future-dependent-render] shows the same divergence: `loop.last`" in out
    assert out.splitlines()[-1] == "Found 1 finding (1 failing)."


def test_locations_are_in_the_file_and_json_names_the_templates_own(tmp_path, monkeypatch):
    # A two-line chat_template.json whose template has many lines: the finding is on line 2
    # of the file, at the call's column counted in the file (escapes included).
    template = "{#- a note #}\n" * 9 + '{{ "Today: " + strftime_now("%Y") }}{% for m in messages %}{{ m.content }}{% endfor %}'
    document = '{\n  "chat_template": ' + json.dumps(template) + "}\n"
    (tmp_path / "chat_template.json").write_text(document)
    monkeypatch.chdir(tmp_path)
    column = document.splitlines()[1].index("strftime_now") + 1
    code, out, _ = run("--output-format", "full", "chat_template.json", "-q", "--no-prove")
    assert out.startswith(f"chat_template.json:2:{column}: PC001 [live-clock] (not proven: --no-prove) `strftime_now(...)`")
    code, out, _ = run("--output-format", "full", "chat_template.json", "--format", "json", "--no-prove")
    (finding,) = json.loads(out)
    assert (finding["line"], finding["column"]) == (2, column)
    assert (finding["template_line"], finding["template_column"]) == (10, template.splitlines()[9].index("strftime_now") + 1)
    # the text report shows the template's own line under it, and says it is the template's
    code, out, _ = run("--output-format", "full", "chat_template.json", "--no-prove")
    assert (
        out.splitlines()[1]
        == 'template line 10 | {{ "Today: " + strftime_now("%Y") }}{% for m in messages %}{{ m.content }}{% endfor %}'
    )
