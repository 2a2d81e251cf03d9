"""Where a report goes: standard output, or a file written whole (writes.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


def write_report(path: Path, text: str) -> None:
    """Write a report file whole or not at all (a WriteError says why not)."""
    from ..writes import write_file

    write_file(path, text)
