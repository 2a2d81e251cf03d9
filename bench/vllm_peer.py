"""Offline proofs against a real vLLM: token ids for every prover scenario, both ways.

For the model a running vLLM render server serves (one of ../shared/tokenizers, whose
template is that model's template of ../shared/corpus), every call of every prover
scenario is rendered through the server (POST /v1/chat/completions/render) and through
tmpl-lint's offline path with --engine vllm, and the script prints how many requests give
identical token ids.

    TMPL_LINT_VLLM_URL=http://127.0.0.1:8100 python bench/vllm_peer.py qwen3

One server serves one model (one tokenizer): pass the tokenizer directory name it was
started with. How to start one is in the README, "Verifying against vLLM".
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path

from tmpl_lint.checker import lint_with_facts
from tmpl_lint.diff import read_template
from tmpl_lint.engines import render_prompt, resolve_engine
from tmpl_lint.inputs import TemplateSource
from tmpl_lint.proving.session import switch_values
from tmpl_lint.render import FrozenClock
from tmpl_lint.scenarios import scenarios
from tmpl_lint.server import ServerError, prompt_token_ids
from tmpl_lint.sources import model_type_beside
from tmpl_lint.tokenizer import load_tokenizer

SHARED = Path(__file__).resolve().parents[2] / "shared"
# The template each tokenizer directory carries is the one the server renders with; it is
# the corpus template of that model (Qwen3-0.6B, Qwen2.5-7B-Instruct, gpt-oss-120b, Nemo).
TOKENIZERS = ("qwen3", "qwen2.5", "gpt-oss", "mistral-nemo")


def wire_format(messages):
    """Messages as the OpenAI API carries them: tool-call arguments are JSON strings."""
    out = json.loads(json.dumps(messages))
    for message in out:
        for call in message.get("tool_calls") or ():
            if not isinstance(call["function"].get("arguments"), str):
                call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    return out


def main() -> None:
    url = os.environ.get("TMPL_LINT_VLLM_URL")
    if not url or len(sys.argv) != 2 or sys.argv[1] not in TOKENIZERS:
        sys.exit(f"usage: TMPL_LINT_VLLM_URL=URL python bench/vllm_peer.py {{{'|'.join(TOKENIZERS)}}}")
    name = sys.argv[1]
    directory = SHARED / "tokenizers" / name
    tokenizer = load_tokenizer(directory)
    template, _ = read_template(directory)
    same = total = 0
    mismatches = []
    engine = resolve_engine("vllm", template, model_type_beside(directory))  # gpt-oss: openai-harmony
    # The scenarios the prover renders for this template: its reasoning switches included.
    facts, findings = lint_with_facts(TemplateSource(directory, None, template, "jinja"))
    for scenario in scenarios(switch_values(findings, facts.variables)):
        for index, call in enumerate(scenario.calls):
            clock = FrozenClock(datetime.now())  # the server reads its own clock
            request_messages = wire_format(call.messages)
            text = render_prompt(
                engine,
                template,
                request_messages,
                clock=clock,
                tools=scenario.tools,
                kwargs=scenario.kwargs,
                special_tokens=tokenizer.special_tokens,
            ).text
            body = {"messages": request_messages, "chat_template_kwargs": scenario.kwargs}
            if scenario.tools:
                body["tools"] = scenario.tools
            try:
                served = prompt_token_ids(url, body)
            except ServerError as error:
                mismatches.append(f"{scenario.name} call {index + 1}: server refused: {error}")
                continue
            total += 1
            if served == tokenizer.encode(text):
                same += 1
            else:
                mismatches.append(
                    f"{scenario.name} call {index + 1}: {len(served)} served vs {len(tokenizer.encode(text))} offline"
                )
    print(f"{name}: {same} of {total} requests give identical token ids (engine vllm, offline vs server)")
    for line in mismatches[:10]:
        print(f"  {line}")


if __name__ == "__main__":
    main()
