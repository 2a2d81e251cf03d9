"""llama.cpp's engine (WebAssembly, engines/llamacpp.py) against Jinja2, measured in the same run.

Per render: the 670 requests of ../shared/engine-golden/llamacpp-b10775.jsonl, each rendered
by llama.cpp's engine and by tmpl-lint's Jinja2 render (``render``, as transformers renders:
the floor). Per proof: the proof of each shared template with no switch values, as a GGUF's
template is proven (``Prover``, engine ``llamacpp``) and as transformers renders it
(``hf``): how many renders a proof makes, and what it costs. Also the module's compile,
once a process. CPU time of the process and wall time (a busy machine shows in the wall).
Run: python bench/llamacpp_speed.py [--templates N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

from tmpl_lint.engines import llamacpp
from tmpl_lint.proving import session
from tmpl_lint.proving.session import Prover
from tmpl_lint.render import RenderError, render

SHARED = Path(__file__).resolve().parents[2] / "shared"
GOLDEN = SHARED / "engine-golden" / "llamacpp-b10775.jsonl"
TEMPLATES = SHARED / "corpus" / "templates"


def timed(function, *args):
    wall, cpu = time.perf_counter(), time.process_time()
    with contextlib.suppress(RenderError):
        function(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def jinja2_render(template: str, context: dict) -> str:
    context = dict(context)
    return render(
        template,
        context.pop("messages"),
        clock=lambda: datetime(2026, 1, 1),
        tools=context.pop("tools", None),
        add_generation_prompt=context.pop("add_generation_prompt"),
        special_tokens=context,
    )


def line(label: str, walls: list[float], cpus: list[float]) -> str:
    ms = [value * 1e3 for value in walls]
    cpu = [value * 1e3 for value in cpus]
    return (
        f"{label:34} median {statistics.median(ms):7.2f} ms wall, {statistics.median(cpu):7.2f} ms CPU; "
        f"p90 {sorted(ms)[int(len(ms) * 0.9)]:7.2f} ms wall; total {sum(cpu) / 1e3:6.2f} s CPU"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--templates", type=int, default=None, help="prove only the first N shared templates")
    arguments = parser.parse_args()
    if not GOLDEN.is_file():
        print("../shared is not present: nothing to measure")
        return 0
    wall, cpu = timed(llamacpp.ready)
    print(f"module compile (once a process): {wall:.2f} s wall, {cpu:.2f} s CPU")

    lines = [json.loads(text) for text in GOLDEN.read_text(encoding="utf-8").splitlines()]
    texts = {name: (TEMPLATES / name).read_text(encoding="utf-8") for name in {entry["template"] for entry in lines}}
    measured = {"llama.cpp b10775 (WASM)": ([], []), "jinja2 (floor)": ([], [])}
    for entry in lines:
        text = texts[entry["template"]]
        for label, function in (("llama.cpp b10775 (WASM)", llamacpp.render_llamacpp), ("jinja2 (floor)", jinja2_render)):
            wall, cpu = timed(function, text, entry["context"])
            measured[label][0].append(wall)
            measured[label][1].append(cpu)
    print(f"per render, {len(lines)} requests of the golden file:")
    for label, (walls, cpus) in measured.items():
        print("  " + line(label, walls, cpus))

    names = sorted(texts)[: arguments.templates]
    counts: dict[str, list[int]] = {"llamacpp": [], "hf": []}
    proofs: dict[str, tuple[list[float], list[float]]] = {"llamacpp": ([], []), "hf": ([], [])}
    made = [0]
    original = session.render_prompt

    def counted(*args, **kwargs):  # each render a proof makes (a repeated request is not rendered again)
        made[0] += 1
        return original(*args, **kwargs)

    session.render_prompt = counted
    for engine in ("llamacpp", "hf"):
        for name in names:
            made[0] = 0
            wall, cpu = timed(Prover(texts[name], None, engine=engine).run, {})
            proofs[engine][0].append(wall)
            proofs[engine][1].append(cpu)
            counts[engine].append(made[0])
    print(f"per proof, {len(names)} shared templates (no switch values, no tokenizer):")
    for engine, label in (("llamacpp", "as a GGUF's: llama.cpp"), ("hf", "as transformers (floor)")):
        made = counts[engine]
        print(f"  {label:34} renders made: median {statistics.median(made):.0f}, max {max(made)}")
        print("  " + line(label, *proofs[engine]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
