"""llama.cpp's own engine, as tmpl-lint runs it, against 670 renders by llama.cpp b10775's
engine (../shared/engine-golden/llamacpp-b10775.jsonl): the text, or the same refusal."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from helpers import SHARED, SHARED_TEMPLATES

from tmpl_lint.render import RenderError, render

GOLDEN = SHARED / "engine-golden" / "llamacpp-b10775.jsonl"
LINES = [json.loads(line) for line in GOLDEN.read_text(encoding="utf-8").splitlines()] if GOLDEN.is_file() else []

needs_golden = pytest.mark.skipif(not LINES, reason="../shared is not present (fresh clone)")
llamacpp = pytest.importorskip("tmpl_lint.engines.llamacpp")
pytestmark = [needs_golden, pytest.mark.usefixtures("llamacpp_engine")]


# Lines whose render cannot agree, by (template, conversation, add_generation_prompt), with why.
# None: every line agrees.
CANNOT_AGREE: dict[tuple[str, str, bool], str] = {}


def line_id(line: dict) -> str:
    prompt = "gp" if line["context"]["add_generation_prompt"] else "no-gp"
    return f"{line['template'].removesuffix('.jinja')}-{line['conversation']}-{prompt}"


def template_text(name: str) -> str:
    return (SHARED_TEMPLATES / name).read_text(encoding="utf-8")


def test_the_golden_file_is_the_one_described():
    assert len(LINES) == 670
    assert sum(line["error"] is not None for line in LINES) == 116


@pytest.mark.parametrize("line", LINES, ids=[line_id(line) for line in LINES])
def test_each_render_is_llama_cpps(line):
    key = (line["template"], line["conversation"], line["context"]["add_generation_prompt"])
    if key in CANNOT_AGREE:
        pytest.skip(CANNOT_AGREE[key])
    rendered = llamacpp.render_llamacpp(template_text(line["template"]), line["context"])
    if line["error"] is None:
        assert rendered == line["text"]
    else:
        assert isinstance(rendered, llamacpp.Refusal)
        assert str(rendered) == line["error"]


def test_jinja2_as_transformers_runs_it_differs_on_some_lines():
    """The lines above would catch a renderer that is Jinja2 after all: transformers' render
    differs from llama.cpp's on at least one line in nine (the golden file's README; 159
    of 670 as measured, refusals included)."""
    differing = 0
    for line in LINES:
        context = dict(line["context"])
        try:
            text = render(
                template_text(line["template"]),
                context.pop("messages"),
                clock=lambda: datetime(2026, 1, 1),
                tools=context.pop("tools", None),
                add_generation_prompt=context.pop("add_generation_prompt"),
                special_tokens=context,
            )
        except RenderError:
            text = None
        differing += text != line["text"]
    assert differing >= len(LINES) // 9, differing
