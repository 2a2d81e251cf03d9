"""The Jinja environment chat templates run in.

It mirrors the one transformers builds in
``transformers.utils.chat_template_utils._cached_compile_jinja_template`` (sandboxed,
``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, the ``{% generation %}`` tag, and the
globals ``raise_exception``, ``strftime_now``, ``dict``, ``namespace`` and the ``tojson``
filter), so that every template transformers renders parses here and renders to the same
bytes. Unlike transformers, the clock behind ``strftime_now`` is a parameter: the prover
freezes it and steps it across midnight without touching the machine's clock.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.filters
import jinja2.nodes
import jinja2.runtime
import jinja2.utils
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

Clock = Callable[[], datetime]
DICT_ATTRIBUTES = frozenset(dir(dict))
STR_METHODS = frozenset(name for name in dir(str) if not name.startswith("_")) - {"format", "format_map"}
PLAIN_DATA = frozenset({str, int, float, bool, type(None), list, dict, tuple})
LOOP_NUMBERS = frozenset({"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0"})


class GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body unchanged.

    transformers uses the tag to find assistant tokens for training masks; for rendering a
    prompt it is transparent.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Callable[[], str]) -> str:
        return caller()


class TemplateNamespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore attributes, as transformers' does."""

    # The names are tested inline, not by a call each: templates make a namespace per
    # message and set one per step (three times what jinja2's own namespace cost).

    def __init__(*args, **kwargs):  # same signature trick as jinja2.utils.Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs) if args else kwargs
        for name in attrs:
            if isinstance(name, str) and name[:1] == "_":
                TemplateNamespace._refuse(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        if isinstance(name, str) and name[:1] == "_":
            TemplateNamespace._refuse(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _refuse(name):
        raise jinja2.exceptions.SecurityError(
            f"chat templates cannot store underscore-prefixed attributes on a namespace: {name!r}"
        )


class TemplateDict:
    """``dict(...)`` without the type object itself, so templates cannot reach its attributes."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' override: plain json.dumps, so default separators are ", " and ": ".
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class NoFoldingCodeGenerator(CodeGenerator):
    """Jinja's compiler, without evaluating the template's constant expressions while it
    compiles. Folding runs filters and methods on constants (``{{ 'a'|center(3000000000) }}``)
    at compile time, before any render limit applies; unfolded, they run in the render, under
    its time and size limits, and print the same text."""

    def _output_child_to_const(self, node, frame, finalize):
        if isinstance(node, jinja2.nodes.TemplateData):
            return super()._output_child_to_const(node, frame, finalize)
        raise jinja2.nodes.Impossible()

    def visit_Concat(self, node, frame):
        # ``a ~ b``: the joined string passes the environment's ``joined`` (the render's size
        # limit: a string doubled forty times was gigabytes before the time limit stopped it).
        self.write("environment.joined(")
        super().visit_Concat(node, frame)
        self.write(")")

    def visit_EvalContextModifier(self, node, frame):
        # ``{% autoescape EXPR %}`` evaluates EXPR while compiling unless it is a literal.
        if all(isinstance(keyword.value, jinja2.nodes.Const) for keyword in node.options):
            return super().visit_EvalContextModifier(node, frame)
        for keyword in node.options:
            self.writeline(f"context.eval_ctx.{keyword.key} = ")
            self.visit(keyword.value, frame)
        frame.eval_ctx.volatile = True


class ChatTemplateSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, remembering its verdicts on attributes. A verdict depends only
    on the object's type and the attribute's name (jinja2's ``is_internal_attribute`` and
    ``modifies_known_mutable`` test nothing else), and reaching it took a quarter of the
    time of rendering a long conversation. Constant expressions are not folded while
    compiling (see NoFoldingCodeGenerator)."""

    MAX_REMEMBERED = 10_000  # a template can make up attribute names without end
    code_generator_class = NoFoldingCodeGenerator

    def __init__(self, *args, **kwargs):
        super().__init__(*args, optimized=False, **kwargs)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def joined(self, value: str) -> str:
        """What ``~`` made (render.RenderSandbox bounds it by the render's limits)."""
        return value

    def getattr(self, obj, attribute):
        # ``message.role``: for a plain dict jinja2 tries the attribute, catches the
        # AttributeError and then looks the key up. A dict has no instance attributes, so
        # the lookup is the answer exactly when the name is not one of dict's own: this
        # skips the exception, a fifth of rendering a long conversation.
        if type(obj) is dict and attribute not in DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        # ``content.startswith``: a public str method other than format and format_map is
        # what jinja2 returns after checking (it wraps those two, and refuses "_" names).
        if type(obj) is str and attribute in STR_METHODS:
            return getattr(obj, attribute)
        # ``loop.last``, ``loop.index0``: always an int or a bool, which jinja2 returns as is.
        if type(obj) is jinja2.runtime.LoopContext and attribute in LOOP_NUMBERS:
            return getattr(obj, attribute)
        # ``ns.last_query_index``: a namespace's value, when it is plain data (a bound
        # str.format stored there still takes jinja2's path, which wraps it).
        if type(obj) is TemplateNamespace and not attribute.startswith("_"):
            value = object.__getattribute__(obj, "_Namespace__attrs").get(attribute, self)
            if type(value) in PLAIN_DATA:
                return value
        return super().getattr(obj, attribute)

    def handle_exception(self, source=None):
        # jinja2 rewrites the traceback of an error raised while rendering so that it shows
        # template lines, compiling a fake frame for each template frame: a third of a
        # render that fails (a proof meets hundreds: raise_exception refusing a request), and
        # a frame per level of a recursion too deep. tmpl-lint reports a render's error by its
        # message (render.py), which the rewrite leaves as it is; so only a syntax error,
        # whose printing the rewrite sets, takes it. (An error no rule reports, an internal
        # error, shows the compiled template's own frames under TMPL_LINT_DEBUG.)
        error = sys.exc_info()[1]
        if isinstance(error, jinja2.TemplateSyntaxError):
            return super().handle_exception(source)
        raise error

    def is_safe_attribute(self, obj, attr, value) -> bool:
        key = (type(obj), attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = super().is_safe_attribute(obj, attr, value)
            if len(self._verdicts) < self.MAX_REMEMBERED:
                self._verdicts[key] = verdict
        return verdict


# How many times this thread's renders drew from a random source: the ``random`` filter
# and ``lipsum()`` are the only ones a sandboxed template reaches (the clock is the
# caller's). A proof whose renders drew nothing has its answer to "is the render
# deterministic?" without rendering a request twenty times (proving.session.Prover.deterministic).
_draws = threading.local()


def random_draws() -> int:
    return getattr(_draws, "count", 0)


def _drawn() -> None:
    _draws.count = random_draws() + 1


@jinja2.pass_context
def _counted_random(context, seq):
    _drawn()
    return jinja2.filters.do_random(context, seq)


def _counted_lipsum(*args, **kwargs):
    _drawn()
    return jinja2.utils.generate_lorem_ipsum(*args, **kwargs)


def make_environment(
    clock: Clock = datetime.now, sandbox: Callable[..., ChatTemplateSandbox] = ChatTemplateSandbox
) -> ChatTemplateSandbox:
    """The environment templates parse and render in; ``sandbox``: the class to make it of
    (rendering makes a subclass that bounds what a render allocates, render.RenderSandbox)."""
    env = sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.filters["random"] = _counted_random
    env.globals["lipsum"] = _counted_lipsum
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: clock().strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


# Parsing does not depend on the clock, so one environment serves every parse.
PARSE_ENVIRONMENT = make_environment()

# Names a chat template receives from transformers' apply_chat_template and vLLM's renderer
# that are request data, not switches a user sets.
REQUEST_VARIABLES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "sep_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
    }
)
