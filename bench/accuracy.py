"""Accuracy against an independent oracle: ../shared/corpus/ORACLE.tsv.

The oracle rendered each shared template with transformers' own renderer on three
scenarios (chat, agent loop, a clock crossing midnight) and says where the first differing
character of each turn fell: ``history`` (a message that was already history), ``tail``
(the generation prompt or the reply itself), ``system`` (the first message), ``system-date``
(the clock reached the first message), or ``stable``; ``args`` says whether a compact
argument string replays byte for byte (``verbatim``) or a mapping is re-serialised
(``spaced``). Read its header for the details.

The ``knobs`` column gives the same verdicts under each value of each thinking switch the
template reads: a break under any value is a break (a deployment may set it), so those
count as the template's, and the switched scenarios the oracle rendered ("chat,
enable_thinking=false") are among those a false alarm is judged on. A template flagged
only under a switch value is a "switch-only" break; the figures say how many there are.

Each failing finding's proof says which scenarios' divergences it explains, and of which
cause; that places it in a class: clock scenarios -> clock; re-serialised tool arguments
-> arguments; a divergence in the generation prompt or the reply just generated (cause
generation-prompt or reply-rewrite) -> generation prompt (the oracle's ``tail``); a history
rewrite or a changed first message -> history.

For each class this prints recall (templates the oracle flags that get a finding of a named
rule in that class: failing, or informational with its bounded loss stated, which the
oracle's "tail" counts when the reply's end marker differs; those only the rule for
unexplained divergences catches, and those missed), and false alarms: templates the oracle calls stable for that class whose
failing findings show it in the scenarios that match the oracle's (chat and agent with and
without a system message, the clock with a system message and no tools, the argument
replay). Findings that show a class only in scenarios the oracle does not run (no system
message, tools on the clock, reasoning replayed in content, narrated tool calls, a
template variable set) are listed apart: they disagree with no verdict of the oracle. It
also counts failing findings that are unproven (the goal is none).

Run: python bench/accuracy.py [--engine hf|vllm] [--verbose]
(the earlier "midnight" scenario, with a system message and no tools, counts as the clock's)
(the oracle rendered as transformers does, so ``hf`` is the default here).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tmpl_lint.findings import Outcome
from tmpl_lint.rules import RULES

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"

HISTORY, TAIL, CLOCK, ARGUMENTS = "history", "generation prompt", "clock", "tool arguments"
CLASSES = (HISTORY, TAIL, CLOCK, ARGUMENTS)
UNEXPLAINED = next(rule.RULE.code for rule in RULES if rule.RULE.reports is Outcome.UNEXPLAINED_DIVERGENCE)
# Scenarios that render what the oracle's scenarios render (the clock: with a system
# message and without tools), by name as the prover calls them.
ORACLE_SCENARIOS = re.compile(
    r"(chat|chat with system|agent|agent with system|clock with system, .* later|midnight|compact tool arguments replayed .*)$"
)
# A switched scenario, as the prover names it ("agent, enable_thinking=false"): the oracle's
# knob verdicts judge it where the oracle rendered that value.
SWITCHED = re.compile(r"(chat|agent), (\w+)=(.+)$")


# Causes by their JSON names (reports from before a cause existed read the same).
CAUSE_CLASSES = {
    "tool-arguments": ARGUMENTS,
    "generation-prompt": TAIL,
    "reply-rewrite": TAIL,
    "history-rewrite": HISTORY,
    "system": HISTORY,
}


def divergence_class(scenario: str, cause: str) -> str | None:
    if scenario.endswith("changed between calls"):
        return None  # the client changed a setting (PC008): no class of the oracle's
    if scenario.startswith(("clock", "midnight")):
        return CLOCK
    return CAUSE_CLASSES.get(cause)


def shown(finding: dict, cls: str, comparable: frozenset[str] | None = None) -> bool:
    """Whether a finding's proof explains a divergence of class ``cls`` (in a scenario that
    matches the oracle's, if ``comparable``: the switched scenarios the oracle rendered for
    this template). A report whose proofs do not list what they explain (an older tmpl-lint)
    is read by its proving divergence alone."""
    proof = finding.get("proof") or {}
    pairs = proof.get("explains")
    if pairs is None and proof.get("status") == "proven" and "scenario" in proof:
        pairs = [{"scenario": proof["scenario"], "cause": proof["cause"]}]
    return any(
        divergence_class(pair["scenario"], pair["cause"]) == cls
        and (comparable is None or ORACLE_SCENARIOS.match(pair["scenario"]) or pair["scenario"] in comparable)
        for pair in pairs or ()
    )


@dataclass
class Verdict:
    """One template's oracle row, as the classes it flags and the classes it can judge."""

    flagged: set[str] = field(default_factory=set)
    judged: set[str] = field(default_factory=set)
    stable_everywhere: bool = False
    switch_only: set[str] = field(default_factory=set)  # classes flagged only under a switch value
    switched: frozenset[str] = frozenset()  # the switched scenarios the oracle rendered, as the prover names them


def turn_classes(values: set[str]) -> set[str]:
    """The classes a chat or agent verdict flags. "system" in a turn scenario: the first
    message was rewritten, a history rewrite that loses the whole cache."""
    return ({HISTORY} if values & {"history", "system"} else set()) | ({TAIL} if "tail" in values else set())


def read_knobs(text: str) -> tuple[set[str], frozenset[str]]:
    """The classes the knob verdicts flag ("enable_thinking=False -> chat=tail agent=history;
    ..."), and the switched scenarios they judge, named as the prover names them."""
    flagged, scenarios = set(), set()
    for entry in filter(None, (part.strip() for part in text.split(";"))) if text.strip() != "-" else ():
        setting, _, verdicts = entry.partition("->")
        name, _, value = setting.strip().partition("=")
        literal = json.dumps({"True": True, "False": False}.get(value, value))
        for verdict in verdicts.split():
            shape, _, values = verdict.partition("=")
            flagged |= turn_classes(set(values.split(",")))
            scenarios.add(f"{shape}, {name}={literal}")
    return flagged, frozenset(scenarios)


def read_oracle(path: Path) -> dict[str, Verdict]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    verdicts = {}
    for row in csv.DictReader(lines, delimiter="\t"):
        verdict = Verdict()
        turns = [set(row[column].split(",")) for column in ("chat", "agent")]
        if any(values != {"n/a"} for values in turns):
            verdict.judged |= {HISTORY, TAIL}
        for values in turns:
            verdict.flagged |= turn_classes(values)
        knobbed, verdict.switched = read_knobs(row.get("knobs") or "-")
        verdict.switch_only = knobbed - verdict.flagged
        verdict.flagged |= knobbed
        if row["clock"] != "n/a":
            verdict.judged.add(CLOCK)
        if row["clock"] == "system-date":
            verdict.flagged.add(CLOCK)
        if row["args"] != "n/a":
            verdict.judged.add(ARGUMENTS)
        if row["args"] == "spaced":
            verdict.flagged.add(ARGUMENTS)
        values = [row[column] for column in ("chat", "agent", "clock", "args")]
        verdict.stable_everywhere = not knobbed and all(value in ("stable", "n/a", "verbatim") for value in values)
        verdicts[row["template"]] = verdict
    return verdicts


def fails(finding: dict) -> bool:
    """Whether a finding fails the run, as the JSON report says (before the report said
    so, every finding that was not info failed)."""
    if "fails" in finding:
        return finding["fails"]
    return finding["severity"] != "info"


def unproven(finding: dict) -> bool:
    if "unproven" in finding:
        return finding["unproven"]
    proof = finding.get("proof")
    return proof is None or proof.get("status") != "proven"


def bounded(finding: dict) -> bool:
    """An informational finding whose proof states a bounded loss (the reply's end marker)."""
    return not fails(finding) and bool((finding.get("proof") or {}).get("bound"))


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
    parser.add_argument(
        "--report",
        type=Path,
        help="Read this JSON report (tmpl-lint --format json) instead of running tmpl-lint: another version's.",
    )
    options = parser.parse_args()
    if not CORPUS.is_dir():
        sys.exit(f"needs {CORPUS}")
    oracle = read_oracle(CORPUS / "ORACLE.tsv")
    if options.report is not None:
        found = defaultdict(list)
        for finding in json.loads(options.report.read_text(encoding="utf-8")):
            found[Path(finding["path"]).name].append(finding)
    else:
        found = lint(CORPUS / "templates", options.engine)

    def failing(name: str) -> list[dict]:
        return [finding for finding in found.get(name, ()) if fails(finding)]

    def explaining(name: str) -> list[dict]:
        return [finding for finding in found.get(name, ()) if fails(finding) or bounded(finding)]

    print(f"{len(oracle)} templates, engine {options.engine}; oracle: {CORPUS / 'ORACLE.tsv'}")
    for cls in CLASSES:
        positives = sorted(name for name, verdict in oracle.items() if cls in verdict.flagged)
        negatives = sorted(name for name, verdict in oracle.items() if cls in verdict.judged and cls not in verdict.flagged)
        recalled, by_unexplained, missed, as_bounded = [], [], [], []
        switch_only = [name for name in positives if cls in oracle[name].switch_only]
        switch_recalled = 0
        for name in positives:
            showing = {finding["code"] for finding in explaining(name) if shown(finding, cls)}
            if showing - {UNEXPLAINED}:
                failing_codes = {finding["code"] for finding in failing(name) if shown(finding, cls)} - {UNEXPLAINED}
                label = ", ".join(sorted(showing)) + ("" if failing_codes else "; bounded, info")
                recalled.append(f"{name} ({label})")
                switch_recalled += name in switch_only
                if not failing_codes:
                    as_bounded.append(name)
            elif showing:
                by_unexplained.append(name)
            else:
                missed.append(name)
        alarms, beyond = [], []
        for name in negatives:
            comparable = {f["code"] for f in failing(name) if shown(f, cls, oracle[name].switched)}
            elsewhere = {f["code"] for f in failing(name) if shown(f, cls)} - comparable
            if comparable:
                alarms.append(f"{name} ({', '.join(sorted(comparable))})")
            elif elsewhere:
                beyond.append(f"{name} ({', '.join(sorted(elsewhere))})")
        recall = len(recalled) / len(positives) if positives else 1.0
        print(
            f"{cls:18} recall {len(recalled)}/{len(positives)} = {recall:.0%} by a named rule"
            f" ({len(as_bounded)} of them bounded, info; switch-only breaks {switch_recalled}/{len(switch_only)};"
            f" +{len(by_unexplained)} only by {UNEXPLAINED}, {len(missed)} missed);"
            f" false alarms {len(alarms)}/{len(negatives)}; {len(beyond)} found only beyond the oracle's scenarios"
        )
        if options.verbose:
            for label, names in (
                ("recalled", recalled),
                (f"only {UNEXPLAINED}", by_unexplained),
                ("missed", missed),
                ("false alarm", alarms),
                ("beyond the oracle", beyond),
            ):
                for name in names:
                    print(f"    {label}: {name}")
    stable = sorted(name for name, verdict in oracle.items() if verdict.stable_everywhere)
    noisy = [name for name in stable if failing(name)]
    # A failing finding shown only in scenarios the oracle does not render (no system message,
    # a switch it does not try): no verdict of the oracle's disagrees with it.
    comparable = [
        name for name in noisy if any(shown(finding, cls, oracle[name].switched) for finding in failing(name) for cls in CLASSES)
    ]
    print(
        f"stable everywhere: {len(noisy)}/{len(stable)} templates with a failing finding, "
        f"{len(comparable)} of them in the oracle's scenarios"
    )
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
        for finding in not_proven + unexplained:
            print(f"    {finding['code']}: {Path(finding['path']).name}:{finding['line']} {finding['message'][:100]}")


if __name__ == "__main__":
    main()
