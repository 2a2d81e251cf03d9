"""The imports kept inside functions (each marked ``# noqa: PLC0415 -- why``) keep the cheap
runs from loading what they never use: ``--help`` (run by scripts and shell completion) and a
lint without proofs. Each module named here is one such reason; loaded by one of these runs,
the import that names it can move to the top of its module."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).parent.parent / "corpus"

# Loaded by neither run: the other commands and pipelines, and what only a proof, a fix, a
# GGUF, a template inside JSON/Python/YAML or gpt-oss needs.
NEITHER = (
    "tmpl_lint.commands",
    "tmpl_lint.diff",
    "tmpl_lint.server",
    "tmpl_lint.audit",
    "tmpl_lint.replay",
    "tmpl_lint.fix",
    "tmpl_lint.writes",
    "tmpl_lint.tokenizer",
    "tmpl_lint.gguf",
    "tmpl_lint.containers",
    "tmpl_lint.engines.harmony",
    "openai_harmony",
    "wasmtime",
    "filelock",
    "rich",
    "concurrent",
)
# A lint runs each template in a limited child process (prctl, through ctypes, makes each
# child die with its parent): --help forks none.
FORKS = ("ctypes",)


def loaded_by(*args: str) -> list[str]:
    """The modules of ``NEITHER`` and ``FORKS`` a ``tmpl-lint`` run with ``args`` loaded."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['tmpl-lint', *{list(args)!r}]\n"
        "try:\n"
        "    runpy.run_module('tmpl_lint', run_name='__main__')\n"
        "except SystemExit:\n"
        f"    names = {NEITHER + FORKS!r}\n"
        "    print(sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in names)))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.stderr == ""
    return ast.literal_eval(ran.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (("--help",), ()),
        (("--no-prove", "-q", str(CORPUS / "clean_chatml.jinja")), FORKS),
    ],
    ids=["help", "static"],
)
def test_a_cheap_run_loads_none_of_what_the_lazy_imports_keep_out(args, allowed):
    loaded = loaded_by(*args)
    assert [name for name in loaded if not any(name == n or name.startswith(n + ".") for n in allowed)] == []
