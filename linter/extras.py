"""Which optional part of tmpl-lint (a pip extra) installs a module, read from the
installed package's own metadata, so that a missing one is named with the extra to install."""

from __future__ import annotations

import importlib.metadata
import re

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*).*?\bextra\s*==\s*[\"']([A-Za-z0-9_-]+)[\"']")
_IMPORT_NAMES = {"ruamel-yaml": "ruamel", "oss-harmony": "openai_harmony"}  # distributions imported by another name


def extra_for(module: str) -> str | None:
    """The extra whose packages include ``module`` (a top-level import name), or None."""
    try:
        requires = importlib.metadata.requires("tmpl-lint") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requires:
        match = _REQUIREMENT.match(requirement)
        if match is None or match.group(1).lower().startswith("tmpl-lint"):
            continue  # tmpl-lint[test] names the other extras
        distribution = re.sub(r"[._]", "-", match.group(1).lower())
        if _IMPORT_NAMES.get(distribution, distribution.replace("-", "_")) == module:
            return match.group(2)
    return None


def missing_message(error: ModuleNotFoundError) -> str | None:
    """One line for a module an extra installs, or None for any other missing module."""
    module = (error.name or "").split(".")[0]
    extra = extra_for(module)
    if extra is None:
        return None
    return f"{module} is not installed; it comes with tmpl-lint[{extra}]: pip install 'tmpl-lint[{extra}]'"
