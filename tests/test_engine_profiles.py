"""Engine profiles: what serves the model, named with its version, and what each passes to
the template of a client's reasoning field."""

from __future__ import annotations

import json

import pytest
from helpers import SHARED

from tmpl_lint.engines import PROFILES, engine_for_cache, profile_of

GOLDEN = SHARED / "engine-golden" / "vllm-0.33.0.jsonl"


@pytest.mark.parametrize(
    "engine, cache_model, chosen",
    [
        (None, None, ("vllm", "vllm")),
        (None, "sglang", ("sglang", "sglang")),  # SGLang's cache alone means SGLang serves it
        (None, "llamacpp", ("vllm", "llamacpp")),
        ("sglang", None, ("sglang", "sglang")),
        ("llamacpp", None, ("llamacpp", "llamacpp")),
        ("hf", None, ("hf", "vllm")),
        ("vllm", "sglang", ("vllm", "sglang")),  # --cache-model overrides
    ],
)
def test_the_cache_model_follows_the_engine_and_a_flag_overrides_it(engine, cache_model, chosen):
    assert engine_for_cache(engine, cache_model) == chosen


def test_each_profile_names_its_engine_and_version():
    assert {name: profile.label for name, profile in PROFILES.items()} == {
        "vllm": "vLLM 0.33.0",
        "sglang": "SGLang 0.5.23",
        "llamacpp": "llama.cpp b10775",
        "hf": "transformers",
    }
    assert profile_of("vllm-harmony").label == "vLLM 0.33.0"  # gpt-oss on vLLM


def test_what_each_engine_passes_to_the_template_of_a_reasoning_field():
    vllm, sglang = PROFILES["vllm"], PROFILES["sglang"]
    assert vllm.passes_reasoning("reasoning_content") == ("reasoning", "reasoning_content")
    assert vllm.passes_reasoning("reasoning") == ("reasoning", "reasoning_content")
    assert vllm.passes_reasoning("thinking") == ()
    assert sglang.passes_reasoning("thinking") == ("reasoning_content", "thinking")
    assert sglang.passes_reasoning("reasoning_content") == ("reasoning_content", "thinking")


@pytest.mark.skipif(not GOLDEN.is_file(), reason="../shared is not present (fresh clone)")
def test_vllm_s_own_render_server_agrees_on_which_reasoning_fields_reach_the_template():
    # Qwen3's template prints reasoning_content after the last query: a field the engine
    # passes makes the prompt longer than the same request without it.
    lines = {line["case"]: line for line in map(json.loads, GOLDEN.read_text().splitlines()) if line["tokenizer"] == "qwen3"}
    without = len(lines["content-null-tool-calls"]["token_ids"])
    for case, field in (
        ("reasoning_content-after-query", "reasoning_content"),
        ("reasoning-after-query", "reasoning"),
        ("thinking-field", "thinking"),
    ):
        passed = bool(PROFILES["vllm"].passes_reasoning(field))
        assert (len(lines[case]["token_ids"]) > without) is passed, case


@pytest.mark.parametrize("engine, label", [("vllm", "vLLM 0.33.0"), ("sglang", "SGLang 0.5.23"), ("hf", "transformers")])
def test_diff_names_the_engine_it_modelled(tmp_path, engine, label):
    from click.testing import CliRunner

    from tmpl_lint.cli import main

    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    user = {"role": "user", "content": "hi"}
    paths = []
    for name, messages in (("a.json", [user]), ("b.json", [user, {"role": "assistant", "content": "yo"}, user])):
        (tmp_path / name).write_text(json.dumps({"messages": messages}))
        paths.append(str(tmp_path / name))
    result = CliRunner().invoke(main, ["diff", *paths, "--template", str(template), "--engine", engine, "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["engine"] == label
