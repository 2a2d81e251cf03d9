"""Accuracy against an independent oracle: ../shared/corpus/ORACLE.tsv.

The oracle rendered each shared template with transformers' own renderer on three
scenarios (chat, agent loop, a clock crossing midnight) and says where the first differing
character of each turn fell: ``history`` (a message that was already history), ``tail``
(the generation prompt or the reply itself), ``system`` (the first message), ``system-date``
(the clock reached the first message), or ``stable``; ``args`` says whether a compact
argument string replays byte for byte (``verbatim``) or a mapping is re-serialised
(``spaced``). Read its header for the details.

For each class this prints recall (templates the oracle flags that get a failing finding
of a rule of that class), the templates recalled only by another named rule or only by the
rule for unexplained divergences, and false alarms (templates the oracle calls stable for
that class, in a scenario the template accepts, that still get a failing finding of it).
It also counts failing findings on templates the oracle calls stable everywhere, and
failing findings whose proof did not reproduce them (the goal is none).

A rule's class comes from what it declares (``RuleInfo``): proven in clock scenarios ->
clock; proven by re-serialised tool arguments -> arguments; by the generation prompt ->
generation prompt; by a history rewrite -> history. The rule that reports unexplained
divergences names no class.

Run: python bench/accuracy.py [--engine hf|vllm] [--verbose]
(the oracle rendered as transformers does, so ``hf`` is the default here).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tmpl_lint.findings import Outcome
from tmpl_lint.proofs import Cause
from tmpl_lint.rules import RULES
from tmpl_lint.scenarios import ScenarioKind

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"

HISTORY, TAIL, CLOCK, ARGUMENTS = "history", "generation prompt", "clock", "tool arguments"
CLASSES = (HISTORY, TAIL, CLOCK, ARGUMENTS)


def rule_class(info) -> str | None:
    """The oracle class a rule's findings speak for, from what the rule declares."""
    if info.reports is not None:
        return None
    if ScenarioKind.CLOCK in info.proven_in:
        return CLOCK
    if Cause.TOOL_ARGUMENTS in info.proven_by:
        return ARGUMENTS
    if Cause.GENERATION_PROMPT in info.proven_by:
        return TAIL
    if Cause.HISTORY_REWRITE in info.proven_by:
        return HISTORY
    return None


CLASS_OF = {rule.RULE.code: rule_class(rule.RULE) for rule in RULES}
UNEXPLAINED = next(rule.RULE.code for rule in RULES if rule.RULE.reports is Outcome.UNEXPLAINED_DIVERGENCE)


@dataclass
class Verdict:
    """One template's oracle row, as the classes it flags and the classes it can judge."""

    flagged: set[str] = field(default_factory=set)
    judged: set[str] = field(default_factory=set)
    stable_everywhere: bool = False


def read_oracle(path: Path) -> dict[str, Verdict]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    verdicts = {}
    for row in csv.DictReader(lines, delimiter="\t"):
        verdict = Verdict()
        turns = [set(row[column].split(",")) for column in ("chat", "agent")]
        if any(values != {"n/a"} for values in turns):
            verdict.judged |= {HISTORY, TAIL}
        for values in turns:
            # "system" in a turn scenario: the first message was rewritten, a history rewrite
            # that loses the whole cache.
            if values & {"history", "system"}:
                verdict.flagged.add(HISTORY)
            if "tail" in values:
                verdict.flagged.add(TAIL)
        if row["clock"] != "n/a":
            verdict.judged.add(CLOCK)
        if row["clock"] == "system-date":
            verdict.flagged.add(CLOCK)
        if row["args"] != "n/a":
            verdict.judged.add(ARGUMENTS)
        if row["args"] == "spaced":
            verdict.flagged.add(ARGUMENTS)
        values = [row[column] for column in ("chat", "agent", "clock", "args")]
        verdict.stable_everywhere = all(value in ("stable", "n/a", "verbatim") for value in values)
        verdicts[row["template"]] = verdict
    return verdicts


def fails(finding: dict) -> bool:
    """Whether a finding fails the run, as the JSON report says (before the report said
    so, every finding that was not info failed)."""
    if "fails" in finding:
        return finding["fails"]
    return finding["severity"] != "info"


def unproven(finding: dict) -> bool:
    proof = finding.get("proof")
    return proof is None or proof.get("status") != "proven"


def lint(templates: Path, engine: str) -> dict[str, list[dict]]:
    command = [sys.executable, "-m", "tmpl_lint", str(templates), "--format", "json", "--exit-zero", "--engine", engine]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"tmpl-lint failed ({result.returncode}): {result.stderr.strip()}")
    by_template: dict[str, list[dict]] = defaultdict(list)
    for finding in json.loads(result.stdout):
        by_template[Path(finding["path"]).name].append(finding)
    return by_template


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--verbose", action="store_true", help="Name every template behind each figure.")
    options = parser.parse_args()
    if not CORPUS.is_dir():
        sys.exit(f"needs {CORPUS}")
    oracle = read_oracle(CORPUS / "ORACLE.tsv")
    found = lint(CORPUS / "templates", options.engine)

    def failing(name: str) -> list[dict]:
        return [finding for finding in found.get(name, ()) if fails(finding)]

    print(f"{len(oracle)} templates, engine {options.engine}; oracle: {CORPUS / 'ORACLE.tsv'}")
    for cls in CLASSES:
        positives = sorted(name for name, verdict in oracle.items() if cls in verdict.flagged)
        negatives = sorted(name for name, verdict in oracle.items() if cls in verdict.judged and cls not in verdict.flagged)
        by_class, by_other, by_unexplained, missed = [], [], [], []
        for name in positives:
            codes = {finding["code"] for finding in failing(name)}
            if any(CLASS_OF.get(code) == cls for code in codes):
                by_class.append(name)
            elif any(CLASS_OF.get(code) for code in codes):
                by_other.append(f"{name} ({', '.join(sorted(c for c in codes if CLASS_OF.get(c)))})")
            elif UNEXPLAINED in codes:
                by_unexplained.append(name)
            else:
                missed.append(name)
        alarms = [
            f"{name} ({', '.join(sorted({f['code'] for f in failing(name) if CLASS_OF.get(f['code']) == cls}))})"
            for name in negatives
            if any(CLASS_OF.get(finding["code"]) == cls for finding in failing(name))
        ]
        recall = len(by_class) / len(positives) if positives else 1.0
        print(
            f"{cls:18} recall {len(by_class)}/{len(positives)} = {recall:.0%} by its rules"
            f" (+{len(by_other)} by another named rule, +{len(by_unexplained)} only by {UNEXPLAINED}, {len(missed)} missed);"
            f" false alarms {len(alarms)}/{len(negatives)}"
        )
        if options.verbose:
            for label, names in (
                ("another rule", by_other),
                (f"only {UNEXPLAINED}", by_unexplained),
                ("missed", missed),
                ("false alarm", alarms),
            ):
                for name in names:
                    print(f"    {label}: {name}")
    stable = sorted(name for name, verdict in oracle.items() if verdict.stable_everywhere)
    noisy = [name for name in stable if failing(name)]
    print(f"stable everywhere: {len(noisy)}/{len(stable)} templates with a failing finding")
    if options.verbose:
        for name in noisy:
            print(f"    {name}: {', '.join(sorted({f['code'] for f in failing(name)}))}")
    every = [finding for name in oracle for finding in failing(name)]
    not_proven = [finding for finding in every if unproven(finding)]
    unexplained = [finding for finding in every if finding["code"] == UNEXPLAINED]
    print(
        f"failing findings: {len(every)}, of which unproven {len(not_proven)}, "
        f"{UNEXPLAINED} (no rule explains) {len(unexplained)}"
    )
    if options.verbose:
        for finding in not_proven:
            print(f"    unproven: {Path(finding['path']).name}:{finding['line']} {finding['code']}")


if __name__ == "__main__":
    main()
