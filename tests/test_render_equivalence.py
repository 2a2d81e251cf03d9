"""tmpl-lint's renderer against transformers' on every template of ../shared/corpus.

Each call of every scenario is rendered both ways, with and without the generation prompt,
the clock frozen in both; the bytes must be equal, and a conversation one refuses the other
refuses too.
"""

from __future__ import annotations

import re
from datetime import datetime

import jinja2
import pytest
from helpers import CORPUS, SHARED_TEMPLATES, needs_shared

from tmpl_lint.checker import lint_with_facts
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.jinja_env import make_environment
from tmpl_lint.render import FrozenClock, RenderError, render
from tmpl_lint.scenarios import scenarios

pytestmark = [needs_shared, pytest.mark.no_fork(long=True)]
chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
TEMPLATES = sorted(SHARED_TEMPLATES.glob("*.jinja")) if SHARED_TEMPLATES.is_dir() else []


def hf_render(text, messages, tools, generation_prompt, kwargs):
    normalized = chat_template_utils._normalize_chat_messages(messages)  # as apply_chat_template does
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[normalized], tools=tools, chat_template=text, add_generation_prompt=generation_prompt, **SPECIAL, **kwargs
    )
    return rendered[0]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda path: path.stem)
def test_same_bytes_as_transformers(path, monkeypatch):
    text = path.read_text(encoding="utf-8")
    instant = datetime(2026, 3, 1, 12, 0, 0)

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return instant

    monkeypatch.setattr(chat_template_utils, "datetime", Frozen)
    clock = FrozenClock(instant)
    compared = 0
    for scenario in scenarios({"enable_thinking": [False]}):
        for call in scenario.calls:
            for generation_prompt in (True, False):
                try:
                    expected = hf_render(text, call.messages, scenario.tools, generation_prompt, scenario.kwargs)
                except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError):
                    with pytest.raises(RenderError):
                        render(
                            text,
                            call.messages,
                            clock=clock,
                            tools=scenario.tools,
                            add_generation_prompt=generation_prompt,
                            special_tokens=SPECIAL,
                            template_kwargs=scenario.kwargs,
                        )
                    continue
                ours = render(
                    text,
                    call.messages,
                    clock=clock,
                    tools=scenario.tools,
                    add_generation_prompt=generation_prompt,
                    special_tokens=SPECIAL,
                    template_kwargs=scenario.kwargs,
                )
                assert ours == expected, f"{scenario.name}, {len(call.messages)} messages, generation prompt {generation_prompt}"
                compared += 1
    print(f"{path.stem}: {compared} renders identical")


SOURCES = TEMPLATES + sorted(CORPUS.glob("*.jinja")) + sorted((CORPUS.parent / "tests" / "hostile").glob("*.jinja"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.stem)
def test_a_proof_compiles_the_lints_parse_to_the_code_of_the_text(path):
    """A proof compiles the tree the lint parsed and analysed (switch trials and all), not
    the text again: the generated code must be the text's, byte for byte."""
    text = path.read_text(encoding="utf-8", errors="replace")
    facts, _ = lint_with_facts(TemplateSource(path, None, text, "jinja"))
    if facts.tree is None:
        pytest.skip("does not parse")
    environment = make_environment()
    environment.intercepted_binops = frozenset({"*", "**"})  # as the render compiles
    try:
        expected = environment.compile(text, raw=True)
    except jinja2.TemplateSyntaxError as error:  # an unknown filter, say: the same refusal
        with pytest.raises(type(error), match=re.escape(error.message)):
            environment.compile(facts.tree, raw=True)
        return
    assert environment.compile(facts.tree, raw=True) == expected
