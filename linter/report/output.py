"""Where a report goes: standard output, or a file written whole (writes.py)."""

from __future__ import annotations

from pathlib import Path


def write_report(path: Path, text: str) -> None:
    """Write a report file whole or not at all (a WriteError says why not)."""
    from ..writes import write_file  # noqa: PLC0415 -- only with --output-file

    write_file(path, text)
