"""How tool-call arguments are serialised: the separators a template's ``tojson`` writes and
the ones the model writes (what the prover writes replies with, and a rule compares)."""

from __future__ import annotations

from .facts import Facts, LabelKind


def argument_separators(facts: Facts) -> tuple[str, str] | None:
    """The separators a template names for ``tojson`` of tool-call arguments, if it names
    any: a template that states how it writes arguments is taken to write them as its model
    does."""
    for use in facts.json_uses:
        if use.separators is not None and any(label.kind is LabelKind.TOOL_ARGS for label in use.labels):
            return use.separators
    return None


# How a model writes tool-call arguments (``--tool-args-style``, the ``tool-args-style`` key):
# compact, {"city":"Paris"}, or spaced, {"city": "Paris"}, as `tojson` writes by default.
TOOL_ARGS_STYLES: dict[str, tuple[str, str]] = {"compact": (",", ":"), "spaced": (", ", ": ")}
DEFAULT_TOOL_ARGS_STYLE = "compact"
TOJSON_SEPARATORS = (", ", ": ")  # transformers' `tojson` names none: json.dumps' own


def model_separators(facts: Facts) -> tuple[str, str]:
    """How the model writes tool-call arguments: as the run says (``--tool-args-style``, the
    ``tool-args-style`` key: ``facts.tool_args_style``), else as the template says where it
    names the separators it writes them with, else compact."""
    if facts.tool_args_style is not None:
        return TOOL_ARGS_STYLES[facts.tool_args_style]
    return argument_separators(facts) or TOOL_ARGS_STYLES[DEFAULT_TOOL_ARGS_STYLE]
