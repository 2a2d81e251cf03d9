"""Findings as a JSON array, one object per finding."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..findings import Finding

if TYPE_CHECKING:
    pass


def json_report(findings: Sequence[Finding], strict: bool = False) -> str:
    return json.dumps([finding.to_json(strict) for finding in findings], indent=2, ensure_ascii=False) + "\n"
