"""What a rule reports: a finding, the switch that avoids it, and later its proof and fix."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar

from .analysis.facts import Label, LabelKind, Site
from .jinja_env import REQUEST_VARIABLES
from .proofs import Proof, ProofStatus


def quoted_name(name: str | os.PathLike) -> str:
    """A file's name for a line of text, as git writes one: as it is, or C-quoted (git's
    quote_c_style: ``"nl\\nx.jinja"``) when it holds a control character, a quote, a
    backslash or bytes that are not UTF-8, so that no name splits a line or reads back as
    another. The text report, the fix lines and --diff's patch name files so."""
    data = os.fsencode(name)
    letters = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r", 34: '"', 92: "\\"}
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        plain = False
    else:
        plain = not any(byte < 32 or byte == 127 or byte in letters for byte in data)
    if plain:
        return os.fsdecode(data)
    escaped = (
        f"\\{letters[byte]}" if byte in letters else f"\\{byte:03o}" if byte < 32 or byte >= 127 else chr(byte) for byte in data
    )
    return f'"{"".join(escaped)}"'


# Labels whose site is an expression a decision reads, and a fix may replace.
READS = frozenset({LabelKind.SCAN_POSITION, LabelKind.SCAN_FLAG, LabelKind.NAMESPACE_READ, LabelKind.LAST, LabelKind.NEXT})


@dataclass(frozen=True)
class Switch:
    """A template variable whose value decides whether the pattern applies."""

    name: str
    stable_value: Any  # None when only leaving the variable unset is stable
    default_is_stable: bool
    unstable_value: Any = None  # a value that brings the pattern back, for the message
    # Other variables whose value the renders show it with (DeepSeek-V3.2 sets `thinking`
    # from `enable_thinking`): (name, value), for the message.
    also: tuple[tuple[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "stable_value": self.stable_value, "default_is_stable": self.default_is_stable}
        if self.also:
            out["also"] = [{"name": name, "value": value} for name, value in self.also]
        return out

    def advice(self, measured_already: bool = False, short: bool = False) -> str:
        """How to avoid the finding by the switch. ``measured_already``: the message names the
        values the renders showed breaking, so only the stable value to pass is said.
        ``short`` leaves out how to pass the value (per request, server-wide)."""
        if measured_already:
            if self.stable_value is None:
                return f"leave {self.name} unset to avoid it" if self.default_is_stable else ""
            head = f"set {self.name}={_jinja_literal(self.stable_value)} to avoid it"
        elif self.default_is_stable:
            shown = [(self.name, self.unstable_value), *self.also]
            when = " or ".join(f"{name}={_jinja_literal(value)}" for name, value in shown)
            names = [name for name, _ in shown]
            left = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
            head = f"breaks when {when}: leave {left} unset"
            if self.stable_value is None:
                return head
            head += f" or pass {self.name + '=' if self.also else ''}{_jinja_literal(self.stable_value)}"
        else:
            head = f"set {self.name}={_jinja_literal(self.stable_value)} to avoid it"
        if short:
            return head
        kwargs = f'{{"{self.name}": {json.dumps(self.stable_value)}}}'
        return f"{head} (per request: chat_template_kwargs={kwargs}; vLLM server-wide: --default-chat-template-kwargs '{kwargs}')"


class FixSafety(StrEnum):
    """Whether a rule's fix keeps what the model sees (ruff's fix applicability): ``--fix``
    applies safe fixes; unsafe ones, which change the prompt the model reads (a frozen
    date, reasoning kept in history), only with ``--unsafe-fixes``."""

    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True)
class FixOffer:
    """What the check says of a finding's fix: the edit its rule offers and how safe it is,
    or (``safety`` None) why the rule makes no edit for it."""

    safety: FixSafety | None
    message: str  # the fix's title, or why there is none

    @property
    def available(self) -> bool:
        return self.safety is not None

    def to_json(self) -> dict[str, Any] | None:
        """As ruff's JSON: ``fix`` null where there is none."""
        return {"applicability": str(self.safety), "message": self.message} if self.safety is not None else None


class Verdict(StrEnum):
    """What a finding does to the run. The proof decides: a static pattern is a hypothesis,
    and a hypothesis whose proof ran and did not reproduce it does not fail the run."""

    FAILS = "fails"  # proven; or no proof could run (--no-prove, not provable): the rule's severity holds
    UNPROVEN = "unproven"  # the proof ran and did not reproduce it: reported, fails only under --strict
    INFO = "info"  # advice, or a proven loss bounded whatever the session's length: never fails


@dataclass(frozen=True)
class Message:
    """What a finding says, as pyflakes' messages: a class per message (each rule's module
    holds its own), whose format string ``text`` its fields fill in. What a later layer
    adds (the proof's clock step, harmony's analysis drop) is a field, not text appended."""

    text: ClassVar[str] = ""

    def __str__(self) -> str:
        return self.text.format_map(_Attributes(self))


class _Attributes:
    """A message's fields and properties, by name, for its format string."""

    def __init__(self, message: Message):
        self._of = message

    def __getitem__(self, name: str) -> Any:
        return getattr(self._of, name)


@dataclass(frozen=True)
class Finding:
    """A finding as its rule made it (``RuleInfo.at``), and, completed by ``assemble``, as
    reports read it. Never edited: what the proof, the placement and the fix offer add is
    ``assemble``'s to put in a new one."""

    code: str
    name: str
    severity: str
    line: int
    column: int
    body: Message
    path: str = ""
    template: str | None = None
    source_line: str = ""
    switch: Switch | None = None
    # Template variables that may decide the pattern; the checker tries each.
    candidates: frozenset[str] = frozenset()
    proof: Proof | None = None
    # Where in the template the finding is, and other places its decision reads: what a
    # fix edits. Places hold parse trees: they never cross processes (``__getstate__``).
    site: Site | None = field(default=None, repr=False, compare=False)
    related: tuple[Site, ...] = field(default=(), repr=False, compare=False)
    # A static pattern the proof must confirm (a rule's check), rather than a fact about
    # the run (a syntax error, a render that failed, an unused suppression).
    hypothesis: bool = True
    # Other findings whose pattern the same proven divergence shows: this one explains it,
    # they are its related locations (JSON "related", SARIF relatedLocations).
    related_findings: tuple[Finding, ...] = field(default=(), repr=False, compare=False)
    # Where the finding is in the file that holds the template (``line``/``column`` are the
    # template's own): the same for a .jinja file; for a template inside JSON, Python or
    # YAML, the character's place in that file. None when the file no longer holds it.
    file_line: int | None = None
    file_column: int | None = None
    # The fix the finding's rule offers (None: the rule has none).
    fix: FixOffer | None = None

    @property
    def message(self) -> str:
        return str(self.body)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "site": None, "related": ()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.code, self.line, self.column)

    def location(self) -> str:
        """``path:line:col`` in the file, as editors read it (the template's own place where
        the file no longer holds the template)."""
        path = quoted_name(self.path)
        if self.file_line is not None:
            return f"{path}:{self.file_line}:{self.file_column}"
        where = f"{path}:{quoted_name(self.template)}" if self.template else path
        return f"{where}:{self.line}:{self.column}"

    def template_label(self) -> str:
        """ "(template NAME) " for a named template whose name the location does not give (the
        name quoted as a file's is: a newline in it would split the line)."""
        return f"(template {quoted_name(self.template)}) " if self.template and self.file_line is not None else ""

    def verdict(self, strict: bool = False) -> Verdict:
        """The one place the severity policy lives (README, "Proofs decide what fails")."""
        if self.severity == "info":
            return Verdict.INFO
        if self.proof is not None and self.proof.status is ProofStatus.NOT_REPRODUCED and not strict:
            return Verdict.UNPROVEN
        return Verdict.FAILS

    def fails(self, strict: bool = False) -> bool:
        return self.verdict(strict) is Verdict.FAILS

    @property
    def unproven(self) -> bool:
        """A hypothesis no render has shown: not run (--no-prove), not reproduced, or not provable."""
        return self.hypothesis and (self.proof is None or not self.proof.is_proven)

    def unproven_reason(self) -> str | None:
        """Why the finding is unproven, in a few words; None when it is proven (or a fact)."""
        if not self.unproven:
            return None
        if self.proof is None:
            return "not proven: --no-prove"
        if self.proof.status is ProofStatus.NOT_PROVABLE:
            return f"not provable: {self.proof.reason}"
        return f"not reproduced in {len(self.proof.scenarios)} scenarios"

    def full_message(self, short: bool = False) -> str:
        """The message, then what the renders showed under each switch value (or, unproven,
        the analysis's advice), then the switch's advice (``short``: without how to pass
        the value)."""
        parts = [self.message]
        measured = self.proof.switches if self.proof is not None else ()
        parts += [values.text() for values in measured]
        if self.proof is not None and self.proof.bound is not None:
            parts.append(f"bounded: {self.proof.bound}: informational")
        if self.switch is not None:
            parts.append(self.switch.advice(measured_already=bool(measured), short=short))
        return "; ".join(part for part in parts if part)

    def reported_message(self, short: bool = False) -> str:
        """The message as every report shows it: a finding no render showed says so first,
        and one whose rule makes no edit for it says why."""
        label = f"({self.unproven_reason()}) " if self.unproven else ""
        # (A finding the proof did not reproduce fails nothing: nothing to fix.)
        declined = self.fix is not None and not self.fix.available and self.verdict() is not Verdict.UNPROVEN
        refused = f"; no automatic fix: {self.fix.message}" if declined and self.fix is not None else ""
        return label + self.full_message(short) + refused

    def fixable(self, strict: bool = False) -> bool:
        """Whether ``--fix`` makes an edit for it: its rule offers one, and it is not a
        finding the proof did not reproduce (which --fix leaves, as it does not fail)."""
        return self.fix is not None and self.fix.available and self.verdict(strict) is not Verdict.UNPROVEN

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity,
            "fails": self.fails(strict),
            "unproven": self.unproven,
            "path": self.path,
            "template": self.template,
            # In the file (null if the file no longer holds the template), then in the template.
            "line": self.file_line,
            "column": self.file_column,
            "template_line": self.line,
            "template_column": self.column,
            "message": self.full_message(),
            "switch": self.switch.to_json() if self.switch else None,
            "fix": self.fix.to_json() if self.fix else None,
            "proof": self.proof.to_json() if self.proof else None,
            "related": [
                {
                    "code": other.code,
                    "name": other.name,
                    "line": other.file_line,
                    "column": other.file_column,
                    "template_line": other.line,
                    "template_column": other.column,
                    "message": other.message,
                }
                for other in self.related_findings
            ],
        }


@dataclass(frozen=True)
class Attribution:
    """What the proof makes of a rule's finding (``proving.attribution`` decides it): its
    proof, severity and switch, whether it stays a hypothesis, its message as the proof
    tells it, and the finding that explains its divergence, if another does. The checker
    folds such a finding into that one's related findings; ``explained_by`` is a reference
    within one process, never carried by a finding."""

    proof: Proof | None
    switch: Switch | None
    severity: str
    hypothesis: bool
    body: Message
    explained_by: Finding | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, finding: Finding, switch: Switch | None = None, proof: Proof | None = None) -> Attribution:
        """The finding as its rule made it, with ``switch`` (the switch trials') and ``proof``."""
        return cls(proof, switch, finding.severity, finding.hypothesis, finding.body)


@dataclass(frozen=True)
class Place:
    """Where a finding is: its file and template, the template's line, and its place in
    the file (None when the file no longer holds the template)."""

    path: str
    template: str | None
    source_line: str = ""
    file_line: int | None = None
    file_column: int | None = None


def assemble(
    finding: Finding,
    attribution: Attribution | None = None,
    place: Place | None = None,
    related: tuple[Finding, ...] = (),
    offer: Callable[[Finding], FixOffer | None] | None = None,
    sites: bool = True,
) -> Finding:
    """The one place a finding is completed: the rule's finding, with what the proof made of
    it (``attribution``), where it is (``place``), the findings it explains (``related``,
    assembled already) and its fix offer (``offer``: asked of the finding as proven, since a
    rule's fix may read its switch). ``sites`` False leaves out its places in the parse
    tree, which a report never reads and which keep the tree alive."""
    made = finding
    if attribution is not None:
        made = replace(
            made,
            proof=attribution.proof,
            switch=attribution.switch,
            severity=attribution.severity,
            hypothesis=attribution.hypothesis,
            body=attribution.body,
        )
    if place is not None:
        made = replace(
            made,
            path=place.path,
            template=place.template,
            source_line=place.source_line,
            file_line=place.file_line,
            file_column=place.file_column,
        )
    if related:
        made = replace(made, related_findings=related)
    if offer is not None:
        made = replace(made, fix=offer(made))
    if not sites:
        made = replace(made, site=None, related=())
    return made


class Outcome(StrEnum):
    """What the engine reports through a rule of its own, rather than a rule's check."""

    SYNTAX_ERROR = "syntax-error"
    UNEXPLAINED_DIVERGENCE = "unexplained-divergence"
    RENDER_LIMIT_EXCEEDED = "render-limit-exceeded"
    RENDER_ERROR = "render-error"
    ENGINE_RENDER_UNSTABLE = "engine-render-unstable"
    UNUSED_SUPPRESSION = "unused-suppression"


def switch_candidates(labels) -> frozenset[str]:
    names = {label.name for label in labels if isinstance(label, Label) and label.kind is LabelKind.VARIABLE}
    return frozenset(name for name in names if name and name not in REQUEST_VARIABLES)


def _jinja_literal(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return repr(value)
