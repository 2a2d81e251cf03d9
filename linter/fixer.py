"""``--fix`` and ``--diff``: apply the rules' edits, verify them, write only the template.

A fix is kept only if the patched template parses, renders every scenario the original
rendered, leaves the prover no divergence of the causes it fixed (check b, with the
tokenizer when there is one), and renders a single-turn conversation exactly as the
original does at the fix date. Otherwise nothing is written for that finding and the
reason is printed. Files are replaced atomically, keeping their mode.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path

from .analysis import parse
from .checker import Selection, lint_source, lint_with_facts, prover_inputs
from .containers import ContainerError, replace_in_container
from .edits import Edit, OverlappingEdits, apply_edits
from .engines import HARMONY, resolve_engine
from .findings import Finding
from .proofs import Cause
from .prover import Prover, resolve_special_tokens
from .render import FrozenClock, RenderError, render
from .rules import BY_CODE
from .sources import TemplateSource, model_type_beside, read_text


class WriteError(Exception):
    pass


@dataclass(frozen=True)
class FixOptions:
    frozen_date: date
    tokenizer: Path | None = None
    block_size: int = 16
    # "compact" or "spaced": render tool-call argument mappings with the separators the
    # model generates (PC004); None only adds the string pass-through.
    tool_args_style: str | None = None
    engine: str = "vllm"  # whose request preprocessing the verifying proofs apply, as the check's


@dataclass
class TemplateFix:
    source: TemplateSource
    patched: str
    applied: list[tuple[Finding, str]] = field(default_factory=list)
    skipped: list[tuple[Finding, str]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.patched != self.source.text


class Verifier:
    """Checks a patched template against the original."""

    def __init__(self, source: TemplateSource, options: FixOptions):
        self.source = source
        self.tokenizer, config = prover_inputs(source, options.tokenizer)
        self.special = resolve_special_tokens(self.tokenizer, config)
        self.block_size = options.block_size
        # The fix is proven as the check proves the template: where vLLM renders the model
        # without it (openai-harmony), the template is proven as transformers renders it.
        engine = resolve_engine(options.engine, source.text, model_type_beside(source.path))
        self.engine = "hf" if engine == HARMONY else engine
        self.clock = FrozenClock(datetime.combine(options.frozen_date, time(12, 0)))
        self.original_report = self.prove(source.text)
        self.original_rendered = {result.scenario.name for result in self.original_report.rendered}
        self.original_codes = self.severe_codes(source.text)

    def prove(self, text: str):
        return Prover(text, self.tokenizer, self.block_size, self.special, engine=self.engine).run({})

    def severe_codes(self, text: str) -> Counter:
        """Findings that apply by default: not informational, and not only when a caller
        sets a switch to its unstable value."""
        findings = lint_source(TemplateSource(self.source.path, self.source.name, text, self.source.container))
        return Counter(
            finding.code
            for finding in findings
            if finding.severity != "info" and not (finding.switch and finding.switch.default_is_stable)
        )

    def single_turns(self, text: str) -> list[str | None]:
        out = []
        for messages in (
            [{"role": "user", "content": "Hello"}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        ):
            try:
                out.append(render(text, messages, clock=self.clock, add_generation_prompt=True, special_tokens=self.special))
            except RenderError:
                out.append(None)
        return out

    def check(self, patched: str, fixed: list[Finding]) -> str | None:
        """None if ``patched`` verifies for the ``fixed`` findings, else the reason."""
        tree, error = parse(patched)
        if error is not None:
            return f"the patched template does not parse: {error.message}"
        codes = self.severe_codes(patched)
        for code, count in Counter(finding.code for finding in fixed).items():
            if codes[code] > self.original_codes[code] - count:
                return f"{code} is still found in the patched template"
        if self.single_turns(patched) != self.single_turns(self.source.text):
            return "a single-turn conversation would render differently"
        report = self.prove(patched)
        missing = self.original_rendered - {result.scenario.name for result in report.rendered}
        if missing:
            return f"the patched template no longer renders: {', '.join(sorted(missing))}"
        fixed_rules = [BY_CODE[code] for code in {finding.code for finding in fixed}]
        still_found = [BY_CODE[code].RULE for code in codes if code not in {rule.RULE.code for rule in fixed_rules}]
        # A reply that renders differently as history than as generated is the model's own
        # format (gpt-oss drops a final answer's analysis by design): only a fix of a rule the
        # generation prompt proves is asked to change it.
        fixes_replies = any(Cause.GENERATION_PROMPT in rule.RULE.proven_by for rule in fixed_rules)
        for divergence in report.divergences():
            if divergence.check != "b" or (divergence.in_reply and not fixes_replies):
                continue
            # A divergence another finding still explains cannot be asked to vanish.
            if any(rule.proves(divergence) for rule in still_found):
                continue
            if any(rule.RULE.fix_removes_proof and rule.RULE.proves(divergence) for rule in fixed_rules):
                return f'the prover still finds a {divergence.cause} divergence in "{divergence.scenario}"'
        for rule in fixed_rules:
            reason = rule.verify_fix(self, patched) if hasattr(rule, "verify_fix") else None
            if reason is not None:
                return reason
        return None

    def render(self, text: str, messages: list[dict]) -> str | None:
        """``text`` rendered at the fix date without a generation prompt, or None if it fails."""
        try:
            return render(text, messages, clock=self.clock, special_tokens=self.special)
        except RenderError:
            return None


def fix_template(source: TemplateSource, options: FixOptions, selection: Selection = Selection()) -> TemplateFix:
    facts, findings = lint_with_facts(source, selection)
    result = TemplateFix(source, source.text)
    if facts.tree is None:
        result.skipped = [(finding, "the template does not parse") for finding in findings]
        return result
    random = [finding for finding in findings if BY_CODE[finding.code].RULE.makes_renders_incomparable]
    if random:
        # Random output makes two renders differ: no fix could be verified.
        reason = f"the template prints random text ({random[0].code}): fixes cannot be verified"
        result.skipped = [(finding, reason) for finding in findings]
        return result
    verifier = None
    chosen: list[Edit] = []
    pending: list[tuple[Finding, object]] = []
    for finding in sorted(findings, key=lambda f: (f.code, f.line, f.column)):
        rule = BY_CODE.get(finding.code)
        fix = rule.fix(facts, finding, options) if rule is not None and hasattr(rule, "fix") else None
        if fix is None:
            result.skipped.append((finding, "no automatic fix for this rule"))
        elif fix.unfixable:
            result.skipped.append((finding, fix.unfixable))
        else:
            pending.append((finding, fix))
    reasons: dict[int, str] = {}
    # A fix that fails alone may verify once another is in (two tojson calls feeding one
    # render), so passes repeat while any fix gets in: a second --fix then has nothing to do.
    progress = True
    while pending and progress:
        progress = False
        for finding, fix in list(pending):
            if verifier is None:
                verifier = Verifier(source, options)
            for alternative in fix.alternatives:
                edits = list(dict.fromkeys(chosen + alternative))
                try:
                    patched = apply_edits(source.text, edits)
                except OverlappingEdits as error:
                    reasons[id(finding)] = str(error)
                    continue
                reason = verifier.check(patched, [f for f, _ in result.applied] + [finding])
                if reason is None:
                    chosen = edits
                    result.patched = patched
                    result.applied.append((finding, fix.title))
                    pending.remove((finding, fix))
                    progress = True
                    break
                reasons[id(finding)] = reason
    for finding, _fix in pending:
        result.skipped.append((finding, f"not fixed: {reasons.get(id(finding), 'no candidate edit')}"))
    return result


def write_atomic(path: Path, data: str) -> None:
    """Replace ``path`` with ``data`` through a temporary file in the same folder."""
    try:
        status = path.stat()
    except FileNotFoundError:
        raise WriteError(f"{path}: the file vanished before it could be written") from None
    if not status.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise WriteError(f"{path}: the file is read-only; nothing written")
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise WriteError(f"{path}: cannot write beside it: {error.strerror}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, stat.S_IMODE(status.st_mode))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def patched_file(path: Path, fixes: list[TemplateFix]) -> tuple[str, str]:
    """(the file's text now, its text with every patched template put back)."""
    original = read_text(path)
    text = original
    for fix in fixes:
        if not fix.changed:
            continue
        if fix.source.container == "jinja":
            text = fix.patched
            continue
        try:
            text = replace_in_container(path, text, fix.source.name, fix.patched, fix.source.container)
        except ContainerError as error:
            raise WriteError(f"{path}: {error}") from None
    return original, text
