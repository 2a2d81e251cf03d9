import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import CORPUS, SHARED_TOKENIZERS, at, lint_fixture, lint_text, needs_shared, prove_fixture, prove_text

from tmpl_lint.checker import lint_with_facts
from tmpl_lint.cli import main
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.proving.session import Prover
from tmpl_lint.rules import BY_CODE


def test_fixture_unguarded_is_a_warning():
    codes, findings = lint_fixture("PC004_tool_args_reserialized.jinja")
    assert codes == [("PC004", 5, 89)]
    assert findings[0].severity == "warning"


def test_fixture_guarded_is_a_warning_that_names_the_pass_through():
    # vLLM passes every argument string as a mapping: the pass-through never fires there.
    codes, findings = lint_fixture("PC004_tool_args_guarded.jinja")
    assert codes == [("PC004", 8, 43)]
    assert findings[0].severity == "warning"
    assert findings[0].message.startswith("tool-call arguments pass through `tojson` when they are not a string: ")


@pytest.mark.parametrize(
    ("source", "anchors"),
    [
        # the whole function object, arguments inside
        ("{% for m in messages %}{% for c in m.tool_calls %}{{ c.function | tojson }}{% endfor %}{% endfor %}", ["tojson"]),
        # first tool call by index, then .function
        ("{% for m in messages %}{% set c = m.tool_calls[0].function %}{{ c.arguments|tojson }}{% endfor %}", ["tojson"]),
        # guarded with a ternary
        (
            "{% for m in messages %}{% for c in m.tool_calls %}{{ c.arguments if c.arguments is string else c.arguments|tojson }}{% endfor %}{% endfor %}",
            ["tojson"],
        ),
        # tool schemas are not arguments: noop
        ("{% for t in tools %}{{ t | tojson }}{% endfor %}", []),
        # tool-call names are not arguments: noop
        ("{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.name | tojson }}{% endfor %}{% endfor %}", []),
    ],
)
def test_cases(source, anchors):
    assert lint_text(source)[0] == [at("PC004", source, anchor) for anchor in anchors]


def test_a_ternary_pass_through_is_named_too():
    _, findings = lint_text(
        "{% for m in messages %}{% for c in m.tool_calls %}{{ c.arguments if c.arguments is string else c.arguments|tojson }}{% endfor %}{% endfor %}"
    )
    assert (findings[0].severity, "when they are not a string" in findings[0].message) == ("warning", True)


# -- proofs: the arguments as the model wrote them against their render in history ---------

# Call 2 of the argument replay, up to the arguments, counted by hand.
BEFORE_ARGUMENTS = (
    "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments": '
)


def test_a_string_passed_through_tojson_is_proven_against_the_json_the_model_wrote():
    (finding,) = prove_fixture("PC004_tool_args_reserialized.jinja", "hf")[1]
    divergence = finding.proof.divergence
    assert (divergence.scenario, divergence.check, divergence.call) == ("compact tool arguments replayed as sent", "c", 0)
    # the model wrote {"city":"Paris"}; history prints the string quoted: "{\"city\":\"Paris\"}"
    assert divergence.first_divergence == len(BEFORE_ARGUMENTS)
    assert (divergence.message_index, divergence.field, divergence.cause) == (
        1,
        "tool_calls.function.arguments",
        "tool-arguments",
    )
    assert divergence.before.endswith('"arguments": {"city":"Paris"}}</tool_call><|im_end|>')


def test_vllm_parses_the_string_so_a_mapping_is_reserialised():
    (finding,) = prove_fixture("PC004_tool_args_reserialized.jinja", "vllm")[1]
    divergence = finding.proof.divergence
    assert divergence.first_divergence == len(BEFORE_ARGUMENTS + '{"city":')  # '"Paris"' against ' "Paris"'


def test_the_string_pass_through_replays_byte_for_byte_unless_vllm_parses_it():
    # transformers passes the string, which the pass-through prints as the model wrote it;
    # vLLM passes a mapping, which tojson re-serialises: there the finding fails the run.
    (finding,) = prove_fixture("PC004_tool_args_guarded.jinja", "hf")[1]
    assert (finding.severity, finding.proof.status, finding.fails()) == ("warning", "not-reproduced", False)
    (finding,) = prove_fixture("PC004_tool_args_guarded.jinja", "vllm")[1]
    assert (finding.severity, finding.proof.status, finding.proof.cause, finding.fails()) == (
        "warning",
        "proven",
        "tool-arguments",
        True,
    )


@pytest.mark.parametrize(
    ("engine", "scenario"),
    # transformers hands the template the string, which `.items()` refuses: the replay falls
    # back to the parsed mapping; vLLM parses the string itself
    [("hf", "compact tool arguments replayed as a mapping"), ("vllm", "compact tool arguments replayed as sent")],
)
def test_arguments_the_template_serialises_itself_are_found_by_the_proof(engine, scenario):
    assert lint_fixture("PC004_found_by_proof.jinja")[0] == []  # no `tojson` for the analysis
    codes, (finding,) = prove_fixture("PC004_found_by_proof.jinja", engine)
    assert codes == [("PC004", 8, 31)]  # where the template first reads `arguments`
    assert finding.message.startswith(
        'tool-call arguments replay as \'{"city": "Paris"}\' where the model wrote \'{"city":"Paris"}\''
    )
    divergence = finding.proof.divergence
    assert (divergence.scenario, divergence.check, divergence.cause) == (scenario, "c", "tool-arguments")
    assert divergence.first_divergence == len(BEFORE_ARGUMENTS + '{"city":')
    assert finding.proof.hit_rate is None  # tool calls compared, not whole prompts


# -- named separators, and the fix that writes them ----------------------------------------

LOOP = "{% for m in messages %}{% for c in m.tool_calls %}{{ X }}{% endfor %}{% endfor %}"


@pytest.mark.parametrize(
    "expression",
    [
        'c.function.arguments|tojson(separators=(",", ":"))',
        'c.function.arguments|tojson(separators=(", ", ": "))',
        "c.function.arguments|tojson(indent=4)",
    ],
)
def test_a_template_that_names_its_json_layout_is_taken_at_its_word(expression):
    assert lint_text(LOOP.replace("X", expression))[0] == []


def fix_file(tmp_path, name, *options):
    path = tmp_path / name
    shutil.copyfile(CORPUS / name, path)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove", *options])
    return path, result


def test_the_fix_writes_compact_mappings_by_default_and_nothing_is_found_after(tmp_path):
    path, result = fix_file(tmp_path, "PC004_tool_args_reserialized.jinja")
    assert result.stdout.splitlines()[0] == (
        f"{path}:5:89: fixed PC004 [tool-args-reserialized]: tool-call arguments render as the model writes them: "
        'a string byte for byte, a mapping as {"city":"Paris"}'
    )
    patched = path.read_text()
    assert '+ (call.arguments if call.arguments is string else call.arguments | tojson(separators=(",", ":"))) +' in patched
    assert lint_text(patched)[0] == []
    proof = Prover(patched, None, engine="vllm").run({})
    assert [d for d in proof.divergences() if d.cause == "tool-arguments"] == []
    assert result.exit_code == 0


def test_behind_a_pass_through_the_fix_names_the_separators_only(tmp_path):
    path, result = fix_file(tmp_path, "PC004_tool_args_guarded.jinja")
    assert result.stdout.splitlines()[0] == (
        f"{path}:8:43: fixed PC004 [tool-args-reserialized]: a mapping of tool-call arguments (vLLM always passes one) "
        'renders as the model writes it: {"city":"Paris"}'
    )
    assert path.read_text().splitlines()[7] == '            {{- call.function.arguments | tojson(separators=(",", ":")) }}'
    assert lint_text(path.read_text())[0] == []


def test_a_spaced_fix_of_a_template_that_already_writes_spaced_json_writes_nothing(tmp_path):
    """`tojson` writes ", " and ": " itself: for a model that writes spaced JSON there is
    nothing to fix. The fix wrote the same separators spelled out and said "fixed PC004", an
    edit that changes no render."""
    for name in ("PC004_tool_args_guarded.jinja", "PC004_tool_args_reserialized.jinja"):
        path, result = fix_file(tmp_path, name, "--tool-args-style", "spaced")
        assert (result.exit_code, result.stdout) == (0, "All checks passed!\n")
        assert path.read_text() == (CORPUS / name).read_text()


def test_a_spaced_fix_replaces_the_compact_separators_a_template_names(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text((CORPUS / "PC004_tool_args_guarded.jinja").read_text().replace("tojson", 'tojson(separators=(",", ":"))'))
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--tool-args-style", "spaced"])
    assert result.stdout.splitlines()[0] == (
        f"{path}:8:43: fixed PC004 [tool-args-reserialized]: a mapping of tool-call arguments (vLLM always passes one) "
        'renders as the model writes it: {"city": "Paris"}'
    )
    assert path.read_text().splitlines()[7] == '            {{- call.function.arguments | tojson(separators=(", ", ": ")) }}'
    assert result.exit_code == 0


def test_separators_join_the_arguments_tojson_already_has():
    source = LOOP.replace("X", "c.function.arguments|tojson(ensure_ascii=False)")
    facts, findings = lint_with_facts(TemplateSource(Path("t.jinja"), None, source, "jinja"))
    fix = BY_CODE["PC004"].fix(facts, findings[0], None)
    (edit,) = fix.alternatives[0]
    assert edit.text == (
        "(c.function.arguments if c.function.arguments is string else "
        'c.function.arguments |tojson(ensure_ascii=False, separators=(",", ":")))'
    )


def test_a_template_that_never_prints_arguments_is_not_fixed_and_says_why(tmp_path):
    # No conversation tried sets show_arguments: nothing to check a fix against.
    source = (
        "{% for m in messages %}{{ m.content }}{% if m.show_arguments %}{% for c in m.tool_calls %}"
        "{{ c.function.arguments|tojson }}{% endfor %}{% endif %}{% endfor %}"
    )
    path = tmp_path / "t.jinja"
    path.write_text(source)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove"])
    assert result.stdout.splitlines()[0] == (
        f"{path}:1:{at('PC004', source, 'tojson')[2]}: not fixed PC004 [tool-args-reserialized]: no conversation the template renders prints "
        "tool-call arguments, so the fix cannot be checked"
    )
    assert path.read_text() == source


def test_arguments_reached_through_a_dict_literal_passed_to_a_macro_are_found():
    # GigaChat's shape: the tool call goes into a macro inside a dict literal; the macro
    # reads it back by key. A union of the dict's values lost that it was a tool call, so
    # only the proof found the re-serialisation (no static finding, so no fix).
    source = (
        "{%- macro show(message) -%}\n"
        "    {%- set call = message['content'] -%}\n"
        "    {%- set arguments = call['arguments'] -%}\n"
        "    {%- if arguments is not string -%}{%- set arguments = arguments | tojson -%}{%- endif -%}\n"
        "    {{- '{\"name\": \"' ~ call['name'] ~ '\", \"arguments\": ' ~ arguments ~ '}' }}\n"
        "{%- endmacro -%}\n"
        "{%- for message in messages %}{{- message.role + ': ' + (message.content or '') }}\n"
        "    {%- for tc in message.tool_calls or [] %}{{- show({'role': 'function call', 'content': tc.function}) }}{%- endfor %}\n"
        "{%- endfor %}\n"
    )
    assert lint_text(source)[0] == [at("PC004", source, "tojson")]


# -- arguments printed as the mapping they are: Python's {'city': 'Paris'} -----------------

PRINTS_ARGUMENTS_AS_IS = (
    "{%- for m in messages %}{{ m.role }}:{% if m.tool_calls %}{% for tc in m.tool_calls %}"
    "<tool_call>{{ tc.function.arguments ARGUMENTS }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}|"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.mark.parametrize("printed", ["", "| string"])
def test_arguments_printed_as_a_mapping_are_found_by_the_proof_under_vllm(printed):
    # vLLM parses the model's {"city":"Paris"} into a mapping; `{{ arguments }}` (or `|string`)
    # prints Python's {'city': 'Paris'}: quotes and spaces the model never wrote
    source = PRINTS_ARGUMENTS_AS_IS.replace("ARGUMENTS", printed)
    assert lint_text(source)[0] == []  # no `tojson` for the analysis
    codes, (finding,) = prove_text(source, "vllm")
    assert codes == [at("PC004", source, "tc.function.arguments")]  # where the template first reads `arguments`
    assert finding.fails()
    assert finding.message.startswith(
        "tool-call arguments replay as \"{'city': 'Paris'}\" where the model wrote '{\"city\":\"Paris\"}'"
    )
    divergence = finding.proof.divergence
    assert (divergence.scenario, divergence.check, divergence.call) == ("compact tool arguments replayed as sent", "c", 0)
    # counted by hand: the first quote of the arguments, ' against "
    assert divergence.first_divergence == len("user:What is the weather in Paris?|assistant:<tool_call>{")
    assert (divergence.message_index, divergence.field, divergence.cause) == (
        1,
        "tool_calls.function.arguments",
        "tool-arguments",
    )


@pytest.mark.parametrize("printed", ["", "| string"])
def test_an_argument_string_printed_as_is_replays_byte_for_byte_under_transformers(printed):
    # transformers passes the string the client sent: printed as is, it is what the model wrote
    source = PRINTS_ARGUMENTS_AS_IS.replace("ARGUMENTS", printed)
    assert prove_text(source, "hf")[0] == []


def test_tool_arguments_of_a_namespace_copy_of_the_messages_are_found_and_fixed(tmp_path):
    """A loop over a copy of the messages (`ns.msgs = ns.msgs + [x]`) renders their tool
    calls: PC004 is found at the `tojson`, where the fix edits, not only by the proof."""
    source = (
        "{%- set ns = namespace(msgs=[]) %}{%- for x in messages %}{%- set ns.msgs = ns.msgs + [x] %}{%- endfor %}\n"
        "{%- for m in ns.msgs %}\n"
        "{%- if m.role == 'assistant' and m.tool_calls %}<|assistant|>\n"
        "{%- for tc in m.tool_calls %}{%- set arguments = tc.function.arguments %}\n"
        "{%- if arguments is not string %}{%- set arguments = arguments|tojson %}{%- endif %}\n"
        "{{- '<call>' ~ tc.function.name ~ ' ' ~ arguments ~ '</call>' }}{%- endfor %}<|end|>\n"
        "{%- else %}<|{{ m.role }}|>{{ m.content }}<|end|>{%- endif %}\n"
        "{%- endfor %}{%- if add_generation_prompt %}<|assistant|>{%- endif %}"
    )
    assert lint_text(source)[0] == [at("PC004", source, "tojson")]
    path = tmp_path / "copy.jinja"
    path.write_text(source)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes"])
    _, line, column = at("PC004", source, "tojson")
    assert result.stdout.startswith(f"{path}:{line}:{column}: fixed PC004 [tool-args-reserialized]")
    assert result.exit_code == 0
    assert lint_text(path.read_text())[0] == []


# -- how the model writes arguments: --tool-args-style, for the check as for the fix ------

# tojson names no separators; names transformers' own (", " and ": "); names compact ones
WRITTEN = {
    "tojson": "call.arguments | tojson",
    "spaced": 'call.arguments | tojson(separators=(", ", ": "))',
    "compact": 'call.arguments | tojson(separators=(",", ":"))',
}


@pytest.mark.parametrize(
    ("style", "verdicts"),
    [
        # no style given: a template that names separators says how its model writes them
        (None, {"tojson": 1, "spaced": 0, "compact": 0}),
        # given: it is how the model writes them, whatever the template names
        ("compact", {"tojson": 1, "spaced": 1, "compact": 0}),
        ("spaced", {"tojson": 0, "spaced": 0, "compact": 1}),
    ],
)
def test_templates_that_render_alike_get_one_verdict_for_the_style_the_model_writes(tmp_path, style, verdicts):
    """`tojson` and `tojson(separators=(", ", ": "))` render the same text for every request:
    one was a proven PC004 and the other passed, and the check took --tool-args-style and
    ignored it, so a model that writes spaced JSON could not pass."""
    found = {}
    for name, expression in WRITTEN.items():
        path = tmp_path / f"{name}.jinja"
        path.write_text(
            (CORPUS / "PC004_tool_args_reserialized.jinja").read_text().replace("call.arguments | tojson", expression)
        )
        result = CliRunner().invoke(
            main, [str(path), "--output-format", "full", *(["--tool-args-style", style] if style else [])]
        )
        found[name] = result.exit_code
        if result.exit_code:
            assert result.stdout.startswith(f"{path}:5:89: PC004 [tool-args-reserialized]")
            assert "proof: proven in" in result.stdout
        else:
            assert result.stdout == "All checks passed!\n"
    assert found == verdicts


def test_the_style_is_read_from_the_configuration_and_the_flag_overrides_it(tmp_path, monkeypatch):
    shutil.copyfile(CORPUS / "PC004_tool_args_reserialized.jinja", tmp_path / "t.jinja")
    (tmp_path / "pyproject.toml").write_text('[tool.tmpl-lint]\ntool-args-style = "spaced"\n')
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(main, ["t.jinja", "--no-prove"]).stdout == "All checks passed!\n"
    result = CliRunner().invoke(main, ["t.jinja", "--no-prove", "--tool-args-style", "compact"])
    assert result.exit_code == 1
    assert result.stdout.startswith("t.jinja:5:89: PC004 [tool-args-reserialized] ")


def test_a_string_encoded_again_is_what_the_message_says():
    """transformers passes the argument string on, and `tojson` quotes it: the proof shows
    "{\\"city\\":...}", where the message said ", " and ": " separators."""
    (finding,) = prove_fixture("PC004_tool_args_reserialized.jinja", "hf")[1]
    assert finding.message == (
        "tool-call arguments pass through `tojson`, which JSON-encodes an argument string a second time: the replay "
        'shows "{\\"city\\":\\"Paris\\"}" where the model wrote {"city":"Paris"}; '
        'say how the model writes them with --tool-args-style (compact, the default, or spaced for ", " and ": ")'
    )
    (finding,) = prove_fixture("PC004_tool_args_reserialized.jinja", "vllm")[1]
    assert 'which re-serialises them with ", " and ": " separators' in finding.message
    assert finding.proof.note is None


@needs_shared
def test_a_failing_proof_that_costs_no_token_in_its_scenario_says_why():
    """Qwen3 with its own tokenizer: the arguments end inside the reply's last partial block,
    so the proof's pair recomputes 0 tokens while the finding fails."""
    result = CliRunner().invoke(main, [str(SHARED_TOKENIZERS / "qwen3"), "--select", "PC004", "--format", "json"])
    (finding,) = json.loads(result.stdout)
    proof = finding["proof"]
    assert (proof["status"], proof["lost_tokens"], proof["prompt_tokens"][0], proof["first_divergence"]) == (
        "proven",
        0,
        191,
        186,
    )
    assert proof["note"] == (
        "0 recomputed here: the replay first differs at token 186, in the last partial block of the reply as written "
        "(tokens 176-190), which the cache never holds (it keeps full blocks only); where the arguments end a block or "
        "more before the reply does (a longer argument, text after the call), every block from the one the difference "
        "falls in is recomputed on every turn"
    )
    assert result.exit_code == 1
