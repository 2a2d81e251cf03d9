"""Findings as SARIF 2.1.0, for code-scanning tools."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote_from_bytes

from .. import __version__
from ..findings import Finding
from ..rules import RULES
from .text import file_position, level

if TYPE_CHECKING:
    from ..runner import InputError


# -- SARIF and GitHub annotations --------------------------------------------------------

SARIF_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def _artifact(path: str | Path) -> dict:
    """SARIF's artifactLocation: a URI as RFC 3986 writes it (SARIF 2.1.0 3.10), percent-encoded
    ("#" would start a fragment): relative to the working directory, as GitHub code scanning
    takes it from the repository's root (``uriBaseId`` %SRCROOT%), when the file is under
    it; else an absolute ``file:`` URI."""
    candidate = Path(path).resolve()
    try:
        relative = candidate.relative_to(Path.cwd().resolve())
    except ValueError:
        return {"uri": candidate.as_uri()}  # percent-encoded too
    return {"uri": quote_from_bytes(os.fsencode(relative.as_posix())), "uriBaseId": "%SRCROOT%"}


def _first_paragraph(doc: str) -> str:
    body = doc.split("## What it does", 1)[-1].split("##", 1)[0]
    return " ".join(body.split())


def sarif_report(findings: Sequence[Finding], strict: bool = False, errors: Sequence[InputError] = ()) -> str:
    """SARIF 2.1.0 with what GitHub code scanning reads; regions are in the file on disk. The
    inputs that could not be read are the invocation's error notifications, each at its file."""
    rules = [
        {
            "id": rule.RULE.code,
            "name": rule.RULE.name,
            "shortDescription": {"text": rule.RULE.summary},
            "fullDescription": {"text": _first_paragraph(rule.doc)},
            "help": {"text": rule.doc.strip(), "markdown": rule.doc.strip()},
            "defaultConfiguration": {"level": SARIF_LEVELS[rule.RULE.severity]},
        }
        for rule in RULES
    ]
    index = {rule["id"]: position for position, rule in enumerate(rules)}
    results = []
    seen: Counter = Counter()
    for finding in findings:
        artifact = _artifact(finding.path)
        key = f"{finding.code}:{artifact['uri']}:{finding.template or ''}:{finding.source_line.strip()}"
        seen[key] += 1
        fingerprint = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32] + f":{seen[key]}"
        result = {
            "ruleId": finding.code,
            "ruleIndex": index[finding.code],
            "level": SARIF_LEVELS[level(finding, strict)],
            "message": {"text": finding.reported_message()},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": artifact,
                        "region": dict(zip(("startLine", "startColumn"), file_position(finding))),
                    }
                }
            ],
            "partialFingerprints": {"primaryLocationLineHash": fingerprint},
            **(
                {
                    "relatedLocations": [
                        {
                            "id": number,
                            "physicalLocation": {
                                "artifactLocation": artifact,
                                "region": dict(zip(("startLine", "startColumn"), file_position(other))),
                            },
                            "message": {"text": f"{other.code} [{other.name}] shows the same divergence: {other.message}"},
                        }
                        for number, other in enumerate(finding.related_findings)
                    ]
                }
                if finding.related_findings
                else {}
            ),
            "properties": {
                "template": finding.template,
                "templateLine": finding.line,
                "templateColumn": finding.column,
                "fails": finding.fails(strict),
                "unproven": finding.unproven,
                # As ruff's JSON carries it: the fix's applicability (safe, unsafe), null without one.
                "fix": finding.fix.to_json() if finding.fix else None,
                "proof": finding.proof.to_json() if finding.proof else None,
            },
        }
        results.append(result)
    invocation: dict = {"executionSuccessful": not errors}
    if errors:
        invocation["toolExecutionNotifications"] = [
            {
                "level": "error",
                "message": {"text": error.message},
                "locations": [{"physicalLocation": {"artifactLocation": _artifact(error.path)}}],
            }
            for error in errors
        ]
    document = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "tmpl-lint", "version": __version__, "rules": rules}},
                "invocations": [invocation],
                "results": results,
            }
        ],
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
