"""Proof speed against its floors, measured in the same run.

Goals (issue 19): a warm proof (tokenizer loaded, template seen once) under 0.2 s per
template; a cold `tmpl-lint TEMPLATE --tokenizer DIR` under 1.5 s. Each figure is printed
beside its floor:

- warm proof: rendering each distinct request the prover's scenarios make once, and
  encoding it: what any proof of those scenarios must do (gpt-oss on vLLM: as
  transformers renders its template, and with openai-harmony, which encodes as it renders);
- cold CLI: a process that only loads what the proof must load: the tokenizer (its
  tokenizer.json, or openai-harmony's vocabulary where the file is that vocabulary, as
  gpt-oss's is: tests/test_tokenizer.py), and openai-harmony's vocabulary where vLLM
  renders with it. The interpreter's own start is printed too.

Warm: best of 5. Cold: the command and its floor run in turn, best of 5 each, wall and CPU
(user + system, the kernel's accounting of the finished child: the steadier figure on a
shared machine), bytecode cached as after `pip install`, compiled templates not
(TMPL_LINT_NO_CACHE: every run compiles its template, as the first run after a change does).
Run: python bench/prove_speed.py
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from tmpl_lint.checker import ProveOptions, lint_source, lint_with_facts
from tmpl_lint.engines import render_prompt, resolve_engine
from tmpl_lint.engines.base import HARMONY, EngineError
from tmpl_lint.proving.session import Prover, switch_values
from tmpl_lint.render import FrozenClock, RenderError
from tmpl_lint.sources import collect
from tmpl_lint.tokenizer import HarmonyVocabularyTokenizer, load_tokenizer

SHARED = Path(__file__).resolve().parents[2] / "shared"
CASES = [
    ("Qwen--Qwen3-0.6B.jinja", "qwen3"),
    ("Qwen--Qwen2.5-7B-Instruct.jinja", "qwen2.5"),
    ("openai--gpt-oss-120b.jinja", "gpt-oss"),
    ("mistralai--Mistral-Nemo-Instruct-2407.jinja", "mistral-nemo"),
]
WARM_GOAL, COLD_GOAL = 0.2, 1.5

LOAD_FLOOR = """
import sys
if sys.argv[1] != "-":
    from tokenizers import Tokenizer
    Tokenizer.from_file(sys.argv[1])
if sys.argv[2] == "harmony":
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
"""
COLD_RUNS = 5


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one run of ``command``, cpu from the kernel's accounting."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def in_turn(commands: list[list[str]], env: dict[str, str]) -> list[tuple[float, float]]:
    """Best (wall, cpu) of each command, the commands run in turn so that all meet the same machine."""
    for command in commands:  # untimed: writes the bytecode, warms the file cache
        subprocess.run(command, capture_output=True, env=env, check=False)
    runs = [[timed(command, env) for command in commands] for _ in range(COLD_RUNS)]
    return [(min(run[i][0] for run in runs), min(run[i][1] for run in runs)) for i in range(len(commands))]


def best(function, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


class Recorder(Prover):
    """A prover that notes each distinct request it renders (the determinism check's
    repeats aside)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests = {}

    def render(self, scenario, messages, at, generation_prompt):
        if scenario.name != "determinism":
            key = json.dumps([messages, at.isoformat(), generation_prompt, scenario.tools, scenario.kwargs], sort_keys=True)
            self.requests.setdefault(key, (scenario, messages, at, generation_prompt))
        return super().render(scenario, messages, at, generation_prompt)


def requests_of(text: str, engine: str, tokenizer, switches) -> list[tuple]:
    recorder = Recorder(text, tokenizer, engine=engine)
    recorder.run(switches)
    return [(engine, *request) for request in recorder.requests.values()]


def render_floor(text: str, requests: list[tuple], tokenizer) -> None:
    """Each distinct request rendered once, and encoded (openai-harmony's render is ids)."""
    for engine, scenario, messages, at, generation_prompt in requests:
        try:
            prompt = render_prompt(
                engine,
                text,
                messages,
                clock=FrozenClock(at),
                tools=scenario.tools,
                kwargs=scenario.kwargs,
                add_generation_prompt=generation_prompt,
                special_tokens=tokenizer.special_tokens,
            )
        except (RenderError, EngineError):
            continue  # the proof meets the same refusal
        if engine != HARMONY:
            tokenizer.encode(prompt.text)


def main() -> None:
    if not SHARED.is_dir():
        sys.exit(f"needs {SHARED}")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["TMPL_LINT_NO_CACHE"] = "1"  # cold: the template compiled in the run, not loaded from an earlier one
    for template, tokenizer_name in CASES:
        (source,), _ = collect([SHARED / "corpus" / "templates" / template])
        directory = SHARED / "tokenizers" / tokenizer_name
        tokenizer = load_tokenizer(directory)
        options = ProveOptions(directory)
        engine = resolve_engine(options.engine, source.text)
        lint_source(source, prove=options)  # first run compiles the template
        warm = best(lambda: lint_source(source, prove=options), 5)  # noqa: B023 - called at once
        # gpt-oss on vLLM: proven as transformers renders its template, and as vLLM renders it
        facts, findings = lint_with_facts(source)
        switches = switch_values(findings, facts.variables)
        requests = [
            request
            for each in (["hf", HARMONY] if engine == HARMONY else [engine])
            for request in requests_of(source.text, each, tokenizer, switches if each != HARMONY else {})
        ]
        floor = best(lambda: render_floor(source.text, requests, tokenizer), 5)  # noqa: B023

        command = [sys.executable, "-m", "tmpl_lint", str(source.path), "--tokenizer", str(directory), "-q"]
        # What the proof must load: the file, unless openai-harmony's vocabulary is the file.
        tokenizer_file = "-" if isinstance(tokenizer, HarmonyVocabularyTokenizer) else str(directory / "tokenizer.json")
        harmony = "harmony" if engine == HARMONY or tokenizer_file == "-" else "-"
        load = [sys.executable, "-c", LOAD_FLOOR, tokenizer_file, harmony]
        interpreter = [sys.executable, "-c", "pass"]
        (cold, cold_cpu), (floor_wall, floor_cpu), (start, _) = in_turn([command, load, interpreter], env)
        loads = " + ".join(
            name for name, used in (("tokenizer.json", tokenizer_file != "-"), ("harmony", harmony != "-")) if used
        )
        print(
            f"{template:44} warm proof {warm:.3f} s (floor: render + encode each request once {floor:.3f} s, "
            f"{warm / floor:.1f}x; goal < {WARM_GOAL})\n"
            f"{'':44} cold CLI with proof {cold:.2f} s wall, {cold_cpu:.2f} s cpu (floor: loading {loads} "
            f"{floor_wall:.2f} s wall, {floor_cpu:.2f} s cpu: {cold / floor_wall:.2f}x wall, {cold_cpu / floor_cpu:.2f}x cpu; "
            f"interpreter start {start:.2f} s; goal < {COLD_GOAL} s)"
        )


if __name__ == "__main__":
    main()
