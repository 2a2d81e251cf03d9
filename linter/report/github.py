"""Findings as GitHub Actions workflow commands (annotations on the pull request)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..findings import Finding
from .text import file_position, level

if TYPE_CHECKING:
    from ..runner import InputError


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_report(findings: Sequence[Finding], strict: bool = False, errors: Sequence[InputError] = ()) -> str:
    """GitHub Actions workflow commands: an error annotation on each input that could not be
    read, then one annotation per finding."""
    levels = {"error": "error", "warning": "warning", "info": "notice"}
    lines = [f"::error file={_escape_property(str(error.path))}::{_escape_data(error.message)}" for error in errors]
    for finding in findings:
        properties = ",".join(
            [
                f"file={_escape_property(finding.path)}",
                f"line={file_position(finding)[0]}",
                f"col={file_position(finding)[1]}",
                f"title={_escape_property(f'{finding.code} [{finding.name}]')}",
            ]
        )
        where = f"{finding.template}:{finding.line}: " if finding.template else ""
        lines.append(f"::{levels[level(finding, strict)]} {properties}::{_escape_data(where + finding.reported_message())}")
    return "".join(line + "\n" for line in lines)
