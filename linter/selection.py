"""Which findings a run reports: codes selected and ignored, per-file ignores (suppression
comments in the template are suppressions.py's), and how the model writes tool-call arguments (which decides
whether re-serialising them changes anything). One ``Selection`` decides for check, ``--fix``,
``--diff`` and ``audit`` alike (``lint_with_facts`` applies it).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from .rules import RULES
from .suppressions import codes_in


class SelectionError(ValueError):
    pass


@dataclass(frozen=True)
class Selection:
    """Which codes run, by prefix, the most specific prefix winning (as in ruff)."""

    select: tuple[str, ...] = ("PC",)
    ignore: tuple[str, ...] = ()
    # (file pattern, codes) pairs, patterns matched relative to ``root`` (the config's folder).
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    root: Path | None = None
    # The command line's --ignore over a configuration's selection, a later layer as in ruff:
    # a code it names is off however specifically the configuration selects it.
    also_ignore: tuple[str, ...] = ()
    # How the model writes tool-call arguments (--tool-args-style, the tool-args-style key):
    # "compact" or "spaced"; None where the run does not say. It decides which `tojson` of
    # arguments replays what the model wrote (PC004), in the static lint as in the proofs.
    tool_args_style: str | None = None

    @classmethod
    def parse(
        cls,
        select: Iterable[str] | None,
        ignore: Iterable[str] | None,
        per_file_ignores: dict[str, list[str]] | None = None,
        root: Path | None = None,
        also_ignore: Iterable[str] | None = None,
    ) -> Selection:
        per_file_codes = [code for codes in (per_file_ignores or {}).values() for code in codes]
        for value in (*(select or ()), *(ignore or ()), *(also_ignore or ()), *per_file_codes):
            # `--select ""` (a script's empty variable) or `PC001,` selected every rule, as no
            # --select does; ruff refuses an empty selector.
            if not all(part.strip() for part in value.split(",")):
                raise SelectionError(
                    f"empty rule code or prefix in {value!r}: name codes such as PC001 or prefixes such as PC00, separated by commas"
                )
        chosen = tuple(codes_in(select)) or ("PC",)
        ignored = tuple(codes_in(ignore))
        later = tuple(codes_in(also_ignore))
        per_file = tuple((pattern, tuple(codes_in(codes))) for pattern, codes in (per_file_ignores or {}).items())
        for prefix in chosen + ignored + later + tuple(code for _, codes in per_file for code in codes):
            _check_known(prefix)
        chosen = tuple("PC" if prefix == "ALL" else prefix for prefix in chosen)
        return cls(chosen, ignored, per_file, root, tuple("PC" if prefix == "ALL" else prefix for prefix in later))

    def includes(self, code: str) -> bool:
        if any(code.startswith(prefix) for prefix in self.also_ignore):
            return False
        best_select = max((len(p) for p in self.select if code.startswith(p)), default=-1)
        best_ignore = max((len(p) for p in self.ignore if code.startswith(p)), default=-1)
        return best_select > best_ignore

    @staticmethod
    def knows(prefix: str) -> bool:
        """Whether ``prefix`` (a code, a prefix of codes or ALL) names any rule."""
        return _known(prefix)

    def checks_any(self, prefix: str) -> bool:
        """Whether a rule whose code starts with ``prefix`` (or any rule, for ALL) runs."""
        return any(self.includes(rule.RULE.code) for rule in RULES if prefix == "ALL" or rule.RULE.code.startswith(prefix))

    def runs_every_code_on(self, path: Path | str) -> bool:
        """Whether every code runs on ``path``: all selected, none ignored there. The folder
        the config was found in (``root``) does not select anything, so it is not compared."""
        here = self.for_path(path)
        return (here.select, here.ignore, here.also_ignore) == (Selection().select, (), ())

    def for_path(self, path: Path | str) -> Selection:
        """This selection with the per-file ignores that match ``path`` added to ``ignore``."""
        if not self.per_file_ignores:
            return self
        candidate = Path(path)
        try:
            relative = candidate.resolve().relative_to(self.root.resolve()).as_posix() if self.root else candidate.as_posix()
        except ValueError:
            relative = candidate.as_posix()
        extra = [
            code
            for pattern, codes in self.per_file_ignores
            if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(candidate.name, pattern)
            for code in codes
        ]
        return replace(self, ignore=self.ignore + tuple(extra), per_file_ignores=(), root=None)


def _check_known(prefix: str) -> None:
    if not _known(prefix):
        raise SelectionError(f"unknown rule code or prefix: {prefix}")


def _known(prefix: str) -> bool:
    return prefix == "ALL" or any(rule.RULE.code.startswith(prefix) for rule in RULES)
