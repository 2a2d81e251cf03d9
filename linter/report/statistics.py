"""Findings counted per code (``--statistics``), as text or JSON."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..findings import Finding, Verdict
from .text import VERDICT_WORDS

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class CodeCount:
    """One row of --statistics: how many findings of a code have one verdict (fail the run,
    are not reproduced, are info)."""

    code: str
    name: str
    verdict: Verdict
    count: int

    @property
    def fails(self) -> bool:
        return self.verdict is Verdict.FAILS


def code_counts(findings: Sequence[Finding], strict: bool = False) -> list[CodeCount]:
    """Findings per code, as ruff counts them; those that do not fail the run on rows of
    their own after the code's failing ones: not reproduced, then info (as the summary
    counts them)."""
    order = list(Verdict)
    counts = Counter((finding.code, finding.name, order.index(finding.verdict(strict))) for finding in findings)
    return [CodeCount(code, name, order[index], count) for (code, name, index), count in sorted(counts.items())]


def statistics_report(findings: Sequence[Finding], strict: bool = False) -> str:
    """--statistics as text: a row per code and verdict, those that do not fail marked as
    the summary counts them: (not reproduced) or (info)."""
    return "".join(
        f"{row.count:>5}\t{row.code}\t[{row.name}]{'' if row.fails else f' ({VERDICT_WORDS[row.verdict]})'}\n"
        for row in code_counts(findings, strict)
    )


def statistics_json(findings: Sequence[Finding], strict: bool = False) -> str:
    """--statistics --format json: a list of rows, as ruff prints its statistics in JSON;
    ``verdict`` in the summary's words."""
    rows = [
        {"code": row.code, "name": row.name, "count": row.count, "fails": row.fails, "verdict": VERDICT_WORDS[row.verdict]}
        for row in code_counts(findings, strict)
    ]
    return json.dumps(rows, indent=2) + "\n"
