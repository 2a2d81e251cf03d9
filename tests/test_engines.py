"""vLLM's request preprocessing, mirrored without vLLM installed (tmpl_lint.engines)."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner
from helpers import CORPUS

from tmpl_lint.cli import main
from tmpl_lint.engines import prepare
from tmpl_lint.engines.base import EngineError
from tmpl_lint.engines.vllm import content_format, parse_arguments
from tmpl_lint.proving.session import Prover
from tmpl_lint.render import RenderError

PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"
PARTS = "{% for m in messages %}{% for part in m['content'] %}{{ part.text }}{% endfor %}{% endfor %}"


def assistant(arguments):
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": arguments}}],
    }


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"city":"Paris"}', {"city": "Paris"}),  # a string is parsed
        ({"city": "Paris"}, {"city": "Paris"}),  # a mapping stays
        ("", {}),  # empty
        (None, {}),  # null
        ("{not json", {}),  # malformed: coerced so the conversation can go on
        ("[1, 2]", {}),  # JSON, but not an object
        ("42", {}),
    ],
)
def test_tool_call_arguments_become_mappings(arguments, expected):
    messages, _ = prepare("vllm", PLAIN, [assistant(arguments)])
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == expected
    assert parse_arguments(arguments) == expected


def test_empty_tool_calls_are_dropped_and_input_untouched():
    original = [{"role": "assistant", "content": "hi", "tool_calls": []}]
    messages, _ = prepare("vllm", PLAIN, original)
    assert messages == [{"role": "assistant", "content": "hi"}]
    assert original[0]["tool_calls"] == []


def test_bad_tool_calls_are_rejected_like_vllm():
    with pytest.raises(EngineError, match="must be objects"):
        prepare("vllm", PLAIN, [{"role": "assistant", "content": "", "tool_calls": ["x"]}])
    with pytest.raises(EngineError, match="type 'function'"):
        prepare("vllm", PLAIN, [{"role": "assistant", "content": "", "tool_calls": [{"type": "code", "function": {}}]}])


def test_content_parts_flatten_unless_the_template_reads_them():
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "b"},
            ],
        }
    ]
    assert content_format(PLAIN) == "string"
    assert prepare("vllm", PLAIN, parts)[0][0]["content"] == "a\nb"
    assert content_format(PARTS) == "openai"
    assert prepare("vllm", PARTS, parts)[0][0]["content"] == parts[0]["content"]


def test_vllm_rebuilds_each_message_as_its_chat_parsing_does():
    # vllm/entrypoints/chat_utils.py, _parse_chat_message_content: a null content is no
    # text; an assistant's `reasoning` is copied to `reasoning_content`, and a client's own
    # `reasoning_content` is `reasoning` by then (ChatCompletionRequest.
    # _normalize_messages_before; vLLM 0.33's render server renders both names alike:
    # ../shared/engine-golden/vllm-0.33.0.jsonl, reasoning_content-after-query); a tool's
    # text parts become one string; only name and task of the other fields reach the template.
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    sent = [
        {"role": "user", "content": "Hi", "cache_control": {"type": "ephemeral"}},
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "renamed"},
        {
            "role": "tool",
            "tool_call_id": "a",
            "name": "f",
            "content": [{"type": "text", "text": "1"}, {"type": "text", "text": "2"}],
        },
        {"role": "assistant", "content": "Done.", "reasoning": "kept", "thinking": "dropped"},
    ]
    messages, _ = prepare("vllm", PLAIN, sent)
    assert messages == [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "a", "function": {"arguments": {}, "name": "f"}, "type": "function"}],
            "reasoning": "renamed",
            "reasoning_content": "renamed",
        },
        {"role": "tool", "content": "1\n2", "tool_call_id": "a", "name": "f"},
        {"role": "assistant", "content": "Done.", "reasoning": "kept", "reasoning_content": "kept"},
    ]
    # a template that loops over content parts gets parts: a string is one, null none
    parts, _ = prepare("vllm", PARTS, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}])
    assert [message["content"] for message in parts] == [[{"type": "text", "text": "Hi"}], []]


def test_a_null_content_renders_under_vllm_as_an_empty_one():
    # an OpenAI-SDK agent sends tool-call messages back with "content": null. vLLM
    # renders them (its parsing makes the content empty); transformers' renderer fails on
    # the same messages, and renders them with "" as vLLM's rebuild hands them.
    from datetime import datetime

    from tmpl_lint.engines import render_prompt

    template = "{% for m in messages %}{{ m.role }}: {{ m.content.strip() }}\n{% endfor %}"
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    text = render_prompt("vllm", template, messages, clock=lambda: datetime(2026, 1, 1), add_generation_prompt=False).text
    assert text == "user: Weather?\nassistant: \n"
    with pytest.raises(RenderError, match="'dict object' has no attribute 'content'"):
        render_prompt("hf", template, messages, clock=lambda: datetime(2026, 1, 1), add_generation_prompt=False)


def test_vllm_hands_reasoning_and_reasoning_content_on_under_its_two_names():
    from datetime import datetime

    from tmpl_lint.engines import render_prompt

    template = "{% for m in messages %}[{{ m.thinking }}|{{ m.reasoning_content }}|{{ m.reasoning }}]{% endfor %}"
    messages = [
        {"role": "assistant", "content": "a", "reasoning": "r"},
        {"role": "assistant", "content": "b", "reasoning_content": "c"},
    ]
    render = {
        engine: render_prompt(engine, template, messages, clock=lambda: datetime(2026, 1, 1), add_generation_prompt=False).text
        for engine in ("vllm", "hf")
    }
    assert render["vllm"] == "[|r|r][|c|c]"  # `thinking` is never read
    assert render["hf"] == "[r|r|r][c|c|]"  # the prover's names for a client's reasoning


def test_vllm_hands_the_template_each_tool_as_its_request_type_dumps_it():
    # ChatCompletionToolsParam(type, function: FunctionDefinition(name, description,
    # parameters)).model_dump(): declared fields first, unset ones null, extras after.
    from tmpl_lint.engines.vllm import vllm_tools

    sent = [{"function": {"parameters": {}, "name": "f", "strict": True}, "type": "function"}]
    assert vllm_tools(sent) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": {}, "strict": True}}
    ]
    assert [list(tool["function"]) for tool in vllm_tools(sent)] == [["name", "description", "parameters", "strict"]]
    assert sent == [{"function": {"parameters": {}, "name": "f", "strict": True}, "type": "function"}]  # untouched


@pytest.mark.parametrize(
    ("template", "form"),
    [
        # a loop over the parts wherever statements go: a macro, a call block, an else, a filter block
        ("{% macro show(m) %}{% if m %}{% for p in m.content | list %}{{ p }}{% endfor %}{% endif %}{% endmacro %}", "openai"),
        ("{% call(x) show() %}{% for p in x['content'] %}{{ p }}{% endfor %}{% endcall %}", "openai"),
        ("{% for m in messages %}{% else %}{% for p in m.content %}{% endfor %}{% endfor %}", "openai"),
        ("{% filter upper %}{% for p in messages[0].content | reverse %}{{ p }}{% endfor %}{% endfilter %}", "openai"),
        ("{% set ns = namespace(x=1) %}{% for m in messages %}{% set ns.x = m.content %}{% endfor %}", "string"),
        ("{{ messages[0].content | map(attribute='text') | join }}", "string"),  # no loop statement
        ("{% for k in m.content_parts %}{% endfor %}{% for k in m['contents'] %}{% endfor %}", "string"),
    ],
)
def test_content_format_finds_a_loop_over_the_parts_at_any_depth(template, form):
    assert content_format(template) == form


def test_hf_changes_nothing_and_kwargs_merge_over_server_defaults():
    message = assistant('{"a":1}')
    messages, kwargs = prepare("hf", PLAIN, [message], {"enable_thinking": False}, {"enable_thinking": True, "x": 1})
    assert messages == [message]
    assert kwargs == {"enable_thinking": False, "x": 1}


def test_under_vllm_the_string_pass_through_never_fires():
    from datetime import datetime

    from tmpl_lint.engines import render_prompt

    template = (CORPUS / "PC004_tool_args_guarded.jinja").read_text()
    messages = [{"role": "user", "content": "Weather?"}, assistant('{"city":"Paris"}')]
    renders = {
        engine: render_prompt(engine, template, messages, clock=lambda: datetime(2026, 1, 1), add_generation_prompt=False).text
        for engine in ("hf", "vllm")
    }
    # transformers hands the template the string as sent, which the guard passes through;
    # vLLM parses it into a mapping first, which tojson re-serialises with spaces
    assert '{"city":"Paris"}' in renders["hf"] and '{"city": "Paris"}' not in renders["hf"]
    assert '{"city": "Paris"}' in renders["vllm"] and '{"city":"Paris"}' not in renders["vllm"]


def test_compact_tool_args_style_fix_makes_the_replay_match(tmp_path):
    path = tmp_path / "t.jinja"
    shutil.copyfile(CORPUS / "PC004_tool_args_reserialized.jinja", path)
    result = CliRunner().invoke(main, [str(path), "--fix", "--unsafe-fixes", "--no-prove", "--tool-args-style", "compact"])
    assert (
        f"{path}:5:89: fixed PC004 [tool-args-reserialized]: tool-call arguments render as the model writes them: "
        'a string byte for byte, a mapping as {"city":"Paris"}\n'
    ) in result.stdout
    patched = path.read_text()
    assert '(call.arguments if call.arguments is string else call.arguments | tojson(separators=(",", ":")))' in patched
    report = Prover(patched, None, engine="vllm").run({})
    assert [d for d in report.divergences() if d.cause == "tool-arguments"] == []


def test_tool_call_fields_in_the_order_vllm_validates_them():
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}, "id": "x"}],
    }
    (prepared,), _ = prepare("vllm", PLAIN, [message])
    call = prepared["tool_calls"][0]
    assert list(call) == ["id", "function", "type"]
    assert list(call["function"]) == ["arguments", "name"]
    assert list(message["tool_calls"][0]["function"]) == ["name", "arguments"]  # the caller's request is untouched


THINKING = "{{ messages[0].content }}|{{ reasoning_effort }}|{{ enable_thinking }}"


@pytest.mark.parametrize(
    ("effort", "kwargs", "expected"),
    [
        (None, {}, {}),
        ("high", {}, {"reasoning_effort": "high", "enable_thinking": True}),
        ("none", {}, {"reasoning_effort": "none", "enable_thinking": False}),
        ("none", {"enable_thinking": True}, {"reasoning_effort": "none", "enable_thinking": True}),  # the request's own word wins
    ],
)
def test_the_requests_reasoning_effort_reaches_the_template_and_sets_thinking(effort, kwargs, expected):
    # Checked against vLLM 0.33's server with Qwen3 (same token ids for each row).
    _, merged = prepare("vllm", THINKING, [{"role": "user", "content": "x"}], kwargs, reasoning_effort=effort)
    assert merged == {**kwargs, **expected}
    _, untouched = prepare("hf", THINKING, [{"role": "user", "content": "x"}], kwargs, reasoning_effort=effort)
    assert untouched == kwargs  # transformers has no such request field
