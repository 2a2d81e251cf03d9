import pytest
from helpers import at, lint_fixture, lint_text, prove_fixture


def test_fixture_unguarded_is_a_warning():
    codes, findings = lint_fixture("PC004_tool_args_reserialized.jinja")
    assert codes == [("PC004", 5, 89)]
    assert findings[0].severity == "warning"


def test_fixture_guarded_is_info():
    codes, findings = lint_fixture("PC004_tool_args_guarded.jinja")
    assert codes == [("PC004", 8, 43)]
    assert findings[0].severity == "info"


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


def test_guarded_severity_per_case():
    _, findings = lint_text(
        "{% for m in messages %}{% for c in m.tool_calls %}{{ c.arguments if c.arguments is string else c.arguments|tojson }}{% endfor %}{% endfor %}"
    )
    assert findings[0].severity == "info"


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
    (finding,) = prove_fixture("PC004_tool_args_guarded.jinja", "hf")[1]
    assert (finding.severity, finding.proof.status) == ("info", "not-reproduced")
    (finding,) = prove_fixture("PC004_tool_args_guarded.jinja", "vllm")[1]
    assert (finding.severity, finding.proof.status, finding.proof.cause) == ("info", "proven", "tool-arguments")


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
