"""llama.cpp's engine as tmpl-lint runs it: bounded like every render, llama-server's
context around it, and GGUF templates proven through it."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import CORPUS, SHARED_TEMPLATES, needs_shared

from tmpl_lint import isolation
from tmpl_lint.cli import main
from tmpl_lint.render import RenderError, RenderLimitExceeded, RenderLimits

llamacpp = pytest.importorskip("tmpl_lint.engines.llamacpp")
pytestmark = pytest.mark.usefixtures("llamacpp_engine")


CLOCK = (CORPUS / "PC001_live_clock.jinja").read_text()
USER = [{"role": "user", "content": "hi"}]


def at(instant: datetime):
    return lambda: instant


# -- bounded ------------------------------------------------------------------------------


def test_a_render_that_runs_on_is_stopped_at_its_time_limit():
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(RenderLimitExceeded, match=r"rendering took over 0\.5 s"):
        llamacpp.render_llamacpp(endless, {}, RenderLimits(seconds=0.5))
    assert time.monotonic() - started < 5
    assert llamacpp.render_llamacpp("{{ 1 + 1 }}", {}) == "2"  # the next render is a fresh instance


def test_a_render_that_asks_for_more_memory_than_the_ceiling_is_stopped(monkeypatch):
    monkeypatch.setattr(llamacpp, "MEMORY_BYTES", 32 * 1024**2)  # reached in a tenth of the time
    with pytest.raises(RenderLimitExceeded, match=r"ran out of memory \(32 MiB\)"):
        llamacpp.render_llamacpp("{% set xs = range(100000000) %}{{ xs | length }}", {}, RenderLimits(seconds=60))


def test_a_render_that_prints_more_than_the_limit_is_stopped():
    with pytest.raises(RenderLimitExceeded, match="printed over 1000 characters"):
        llamacpp.render_llamacpp("{% for i in range(200) %}0123456789{% endfor %}", {}, RenderLimits(max_bytes=1000))


def test_endless_recursion_is_stopped():
    with pytest.raises(RenderLimitExceeded, match="recursion too deep"):
        llamacpp.render_llamacpp("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {})


def test_a_render_in_a_child_under_the_address_space_limit():
    """Workers render under isolation's address-space limit: the engine's memory is reserved
    within it."""
    rendered = isolation.run_isolated(llamacpp.render_llamacpp, ("{{ messages[0].content }}", {"messages": USER}))
    assert rendered == "hi"


def test_a_module_other_than_the_pinned_one_is_refused(monkeypatch):
    monkeypatch.setattr(llamacpp, "MODULE_SHA256", "0" * 64)
    llamacpp._runtime.cache_clear()
    try:
        with pytest.raises(llamacpp.EngineUnavailable, match=r"not llama\.cpp b10775's .*install ggufdoctor==0\.3\.0"):
            llamacpp.render_llamacpp("x", {})
    finally:
        llamacpp._runtime.cache_clear()


def test_the_engines_refusals_are_its_own():
    assert llamacpp.render_llamacpp("{{ raise_exception('no system') }}", {}) == llamacpp.Refusal("raise", "no system")
    refusal = llamacpp.render_llamacpp("{% if %}", {})
    assert isinstance(refusal, llamacpp.Refusal) and refusal.stage == "parser"
    with pytest.raises(RenderError, match=r"llama\.cpp b10775 refuses to render: raise:no system"):
        llamacpp.render_request("{{ raise_exception('no system') }}", USER, clock=at(datetime(2026, 3, 1)))


# -- llama-server's context ----------------------------------------------------------------


def test_llama_server_gives_its_date_and_only_bos_and_eos():
    """common_chat_extra_context(): datetime "%b %d %Y", date_string "%d %b %Y"; the vocabulary's
    bos_token and eos_token are the only special tokens; chat_template_kwargs go over them."""
    template = "{{ datetime }}|{{ date_string }}|{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}"
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    clock = at(datetime(2026, 3, 1, 12))
    assert (
        llamacpp.render_request(template, USER, clock=clock, special_tokens=special) == "Mar 01 2026|01 Mar 2026|<s>|</s>|False"
    )
    pinned = llamacpp.render_request(template, USER, clock=clock, special_tokens=special, template_kwargs={"date_string": "x"})
    assert pinned == "Mar 01 2026|x|<s>|</s>|False"


def test_thinking_is_on_unless_the_request_says_and_the_generation_prompt_is_defined_only_when_on():
    template = "{{ enable_thinking }}|{{ add_generation_prompt is defined }}"
    clock = at(datetime(2026, 3, 1))
    assert llamacpp.render_request(template, USER, clock=clock, add_generation_prompt=False) == "True|False"
    off = llamacpp.render_request(template, USER, clock=clock, template_kwargs={"enable_thinking": False})
    assert off == "False|True"


def test_strftime_now_reads_the_renders_clock():
    before = llamacpp.render_request(CLOCK, USER, clock=at(datetime(2026, 3, 1, 23, 59)))
    after = llamacpp.render_request(CLOCK, USER, clock=at(datetime(2026, 3, 2, 0, 1)))
    assert "Current date: 2026-03-01\n" in before and "Current date: 2026-03-02\n" in after
    assert before.replace("2026-03-01", "2026-03-02") == after


def test_only_calls_in_code_are_given_the_clock():
    template = "\n{# strftime_now('%Y') #}{{ 'strftime_now(\"%Y\")' }}|{{ strftime_now('%d %b') }}"
    rendered = llamacpp.render_request(template, USER, clock=at(datetime(2026, 3, 1)))
    assert rendered == '\nstrftime_now("%Y")|01 Mar'
    assert llamacpp.with_clock(template)[0].endswith(template.replace("{{ strftime_now(", "{{ tmpl_lint_strftime_now("))


@needs_shared
def test_llama_31_prints_llama_servers_date():
    template = (SHARED_TEMPLATES / "meta-llama--Llama-3.1-8B-Instruct.jinja").read_text()
    rendered = llamacpp.render_request(template, USER, clock=at(datetime(2026, 3, 1, 12)))
    assert "Today Date: 01 Mar 2026\n" in rendered


# -- GGUF templates are proven as llama.cpp renders them -------------------------------------


def write_gguf(path: Path, template: str) -> Path:
    """test_gguf's small GGUF, carrying ``template``; imported here, not at the top, so that
    without the gguf package only these tests skip."""
    pytest.importorskip("gguf")
    from test_gguf import write_gguf as small_gguf

    return small_gguf(path, template)


def check(*args) -> dict[str, dict]:
    result = CliRunner().invoke(main, [*map(str, args), "--format", "json"])
    assert "Traceback" not in result.stderr, result.stderr
    return {finding["code"]: finding for finding in json.loads(result.stdout)}


@needs_shared
def test_a_gguf_is_proven_as_llama_cpp_renders_it(tmp_path):
    """Llama 3.2 Vision's template: llama.cpp b10775 refuses it with a system message or tools
    ("selectattr: unknown test 'text'", 10 lines of the golden file), transformers renders it.
    From a GGUF, PC004 (tool arguments through tojson) is then not reproduced, the agent
    scenarios being the engine's refusals; proven as transformers renders the template."""
    template = (SHARED_TEMPLATES / "meta-llama--Llama-3.2-11B-Vision-Instruct.jinja").read_text()
    model = write_gguf(tmp_path / "v.gguf", template)
    on_llamacpp = check(model)
    assert on_llamacpp["PC004"]["proof"]["status"] == "not-reproduced"
    assert "llama.cpp b10775 refuses to render: render:Error: selectattr: unknown test 'text'" in json.dumps(
        on_llamacpp["PC004"]["proof"]
    )
    assert check(model, "--engine", "hf")["PC004"]["proof"]["status"] == "proven"
    plain = tmp_path / "v.jinja"
    plain.write_text(template)
    on_llamacpp["PC004"]["proof"].pop("note")  # which tokenizer: none in the GGUF
    assert check(plain, "--engine", "llamacpp")["PC004"]["proof"] == on_llamacpp["PC004"]["proof"]
    # the live date is llama-server's date_string, a day apart
    assert on_llamacpp["PC001"]["proof"]["status"] == "proven"


def test_a_ggufs_clock_is_proven_through_llama_cpps_strftime_now(tmp_path):
    finding = check(write_gguf(tmp_path / "m.gguf", CLOCK))["PC001"]
    assert finding["proof"]["status"] == "proven"
    assert "Current date: 2026-03-0" in json.dumps(finding["proof"])


def test_pc001s_date_string_fix_is_not_made_for_a_gguf_llama_server_dates_it_itself(tmp_path):
    """llama-server defines date_string from its clock (common_chat_extra_context), so a
    template fixed to read date_string still changes every day there: --fix declines."""
    model = write_gguf(tmp_path / "m.gguf", CLOCK)
    result = CliRunner().invoke(main, [str(model), "--fix", "--unsafe-fixes", "--frozen-date", "2026-01-15", "--no-prove"])
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout.startswith(f"{model}:default:3:28: not fixed PC001 [live-clock]: ")
    assert not (tmp_path / "m.chat_template.jinja").exists()
    fixed = '{%- if date_string is not defined %}{%- set date_string = "2026-01-15" %}{%- endif %}{{ date_string }}'
    days = [llamacpp.render_request(fixed, USER, clock=at(datetime(2026, 3, day))) for day in (1, 2)]
    assert days == ["01 Mar 2026", "02 Mar 2026"]


def test_the_compiled_module_is_kept_sealed_and_a_tampered_one_is_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPL_LINT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("TMPL_LINT_NO_CACHE", raising=False)
    from tmpl_lint import sealed

    sealed.secret.cache_clear()
    llamacpp._runtime.cache_clear()
    try:
        llamacpp.ready()
        (entry,) = (tmp_path / "cache" / "llamacpp").glob("llamacpp-b10775-*.cwasm")
        kept = entry.read_bytes()
        entry.write_bytes(kept[:32] + bytes([kept[32] ^ 1]) + kept[33:])  # one bit of the code changed
        llamacpp._runtime.cache_clear()
        assert llamacpp.render_llamacpp("{{ 1 + 2 }}", {}) == "3"
        assert entry.read_bytes() == kept  # not loaded: compiled again, and kept again
    finally:
        sealed.secret.cache_clear()
        llamacpp._runtime.cache_clear()


def test_render_and_diff_render_a_ggufs_template_as_check_proves_it(tmp_path):
    """llama.cpp defines enable_thinking (true) for every render; vLLM and transformers leave
    it undefined. A GGUF's template is rendered by llama.cpp unless --engine hf, as check
    proves it: render and diff said vLLM before."""
    model = write_gguf(tmp_path / "m.gguf", "{{ enable_thinking is defined }}|{{ messages[-1]['content'] }}")
    first = tmp_path / "1.json"
    first.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    second = tmp_path / "2.json"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "x"}]
    second.write_text(json.dumps({"messages": turns}))
    runner = CliRunner()
    rendered = runner.invoke(main, ["render", str(first), "--template", str(model), "--format", "json"])
    assert (rendered.exit_code, json.loads(rendered.stdout)) == (
        0,
        {"text": "True|hi", "token_ids": None, "engine": "llama.cpp b10775"},
    )
    on_hf = runner.invoke(main, ["render", str(first), "--template", str(model), "--engine", "hf", "--format", "json"])
    assert json.loads(on_hf.stdout)["text"] == "False|hi"
    diffed = runner.invoke(main, ["diff", str(first), str(second), "--template", str(model), "--format", "json"])
    assert diffed.exit_code == 1 and json.loads(diffed.stdout)["engine"] == "llama.cpp b10775"
    assert runner.invoke(main, ["diff", str(first), str(second), "--template", str(model)]).stdout.endswith(
        "requests as llama.cpp b10775 renders them\n"
    )
