"""``tmpl-lint render REQUEST.json``: what the engine would feed the model, or the engine's
refusal as exit 2 and one line naming the field (vLLM's 400s, read from its request
validators in vllm/entrypoints/openai/chat_completion/protocol.py and the OpenAI message
types it validates against)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import SHARED_TOKENIZERS, needs_shared, transformers_tokenizer

from tmpl_lint.cli import main

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"id": "call1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def render(tmp_path, body, *args):
    request = tmp_path / "request.json"
    request.write_text(json.dumps(body))
    return CliRunner().invoke(main, ["render", str(request), *map(str, args)])


def test_a_bare_template_takes_bos_and_eos_from_the_tokenizer_config_given_as_template(tmp_path):
    config = tmp_path / "tokenizer_config.json"
    config.write_text(
        json.dumps({"chat_template": "{{ bos_token }}" + CHATML + "{{ eos_token }}", "bos_token": "<B>", "eos_token": "<E>"})
    )
    result = render(tmp_path, {"messages": [USER]}, "--template", config, "--format", "json")
    assert result.exit_code == 0, result.stderr
    rendered = json.loads(result.stdout)
    assert rendered == {
        "text": "<B><|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n<E>",
        "token_ids": None,  # no tokenizer given
        "engine": "vLLM 0.33.0",
    }


@needs_shared
@pytest.mark.parametrize("engine, label", [("vllm", "vLLM 0.33.0"), ("sglang", "SGLang 0.5.23"), ("hf", "transformers")])
def test_render_gives_text_and_token_ids_as_transformers_renders_this_request(tmp_path, engine, label):
    body = {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}], "tools": TOOLS}
    body["messages"].append({"role": "tool", "tool_call_id": "call1", "content": "18 C"})
    result = render(tmp_path, body, "--tokenizer", SHARED_TOKENIZERS / "qwen2.5", "--engine", engine, "--format", "json")
    assert result.exit_code == 0, result.stderr
    rendered = json.loads(result.stdout)
    tokenizer = transformers_tokenizer("qwen2.5")
    # transformers takes the arguments as vLLM hands them on: parsed into a mapping
    parsed = [
        dict(m, tool_calls=[dict(CALL, function={**CALL["function"], "arguments": {"city": "Paris"}})])
        if "tool_calls" in m
        else m
        for m in body["messages"]
    ]
    messages = parsed if engine == "vllm" else body["messages"]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    if engine == "vllm":
        # vLLM dumps each tool as its request type: an unset description is null
        tools = [{"type": "function", "function": {"name": "get_weather", "description": None, "parameters": {"type": "object"}}}]
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert rendered["text"] == text
    assert rendered["token_ids"] == tokenizer.encode(text, add_special_tokens=False)
    assert rendered["engine"] == label


@pytest.mark.parametrize(
    "body, line",
    [
        (
            {"messages": [USER], "tools": []},
            "vLLM 0.33.0 answers 400: tools: must not be an empty array; give at least one tool or leave the field out",
        ),
        (
            {
                "messages": [
                    USER,
                    {"role": "assistant", "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "call1", "content": None},
                ]
            },
            "vLLM 0.33.0 answers 400: messages[2].content: must be a string or a list of content parts, not null",
        ),
        (
            {
                "messages": [
                    USER,
                    {"role": "assistant", "tool_calls": [dict(CALL, function={"name": "f", "arguments": {"city": "Paris"}})]},
                ]
            },
            "vLLM 0.33.0 answers 400: messages[1].tool_calls[0].function.arguments: must be a string of JSON text, not an object",
        ),
        (
            {
                "messages": [USER, {"role": "assistant", "content": "It is"}],
                "continue_final_message": True,
                "add_generation_prompt": True,
            },
            "vLLM 0.33.0 answers 400: continue_final_message: cannot be true together with add_generation_prompt",
        ),
        (
            {"messages": [USER, {"role": "assistant", "content": "It is"}], "continue_final_message": True},
            "vLLM 0.33.0 answers 400: continue_final_message: cannot be true together with add_generation_prompt",
        ),
        (
            {"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c", "function": CALL["function"]}]}]},
            'vLLM 0.33.0 answers 400: messages[1].tool_calls[0].type: is required ("function")',
        ),
        (
            {"messages": [USER, {"role": "assistant", "tool_calls": [dict(CALL, function={"name": "f"})]}]},
            "vLLM 0.33.0 answers 400: messages[1].tool_calls[0].function.arguments: is required (a string)",
        ),
        (
            {"messages": [USER, {"role": "assistant", "tool_calls": [dict(CALL, function={"name": "f", "arguments": None})]}]},
            "vLLM 0.33.0 answers 400: messages[1].tool_calls[0].function.arguments: must be a string of JSON text, not null",
        ),
        (
            {"messages": [{"role": "system", "content": None}, USER]},
            "vLLM 0.33.0 answers 400: messages[0].content: must be a string or a list of content parts, not null",
        ),
    ],
    # each checked against a running vLLM 0.33.0 render server (tmpl-lint validate): it answers 400
    ids=[
        "empty-tools",
        "tool-null-content",
        "arguments-object",
        "continue-and-generation-prompt",
        "continue-default-prompt",
        "call-without-type",
        "call-without-arguments",
        "arguments-null",
        "system-null-content",
    ],
)
def test_a_request_vllm_answers_400_is_refused_in_one_line(tmp_path, body, line):
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    result = render(tmp_path, body, "--template", template)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"tmpl-lint: error: {tmp_path / 'request.json'}: {line}\n"


def test_transformers_renders_what_vllm_refuses(tmp_path):
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    result = render(tmp_path, {"messages": [USER], "tools": []}, "--template", template, "--engine", "hf", "--format", "json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["engine"] == "transformers"


def test_continue_final_message_stops_where_the_message_ends(tmp_path):
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    body = {
        "messages": [USER, {"role": "assistant", "content": "It is"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    result = render(tmp_path, body, "--template", template, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert (
        json.loads(result.stdout)["text"]
        == "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\nIt is"
    )


def test_text_format_prints_the_prompt_then_whose_render_it_is(tmp_path):
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    result = render(tmp_path, {"messages": [USER]}, "--template", template)
    assert result.exit_code == 0
    assert result.stdout == (
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
        "--- vLLM 0.33.0; no token ids without --tokenizer ---\n"
    )


def test_what_vllm_renders_is_not_refused(tmp_path):
    # a running vLLM 0.33.0 renders these: a tool message without content, an assistant's null content
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    for messages in (
        [USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call1"}],
        [USER, {"role": "assistant", "content": None}],
    ):
        result = render(tmp_path, {"messages": messages, "tools": TOOLS}, "--template", template)
        assert result.exit_code == 0, result.stderr
