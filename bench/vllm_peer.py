"""Offline proofs against a real vLLM: token ids for every prover scenario, both ways.

For each template of ../shared/corpus whose tokenizer is in ../shared/tokenizers, every
call of every prover scenario is rendered through a running vLLM render server
(POST /v1/chat/completions/render) and through tmpl-lint's offline path with --engine
vllm, and the script prints how many requests give identical token ids.

    TMPL_LINT_VLLM_URL=http://127.0.0.1:8100 python bench/vllm_peer.py qwen3

One server serves one model (one tokenizer): pass the tokenizer directory name it was
started with. How to start one is in the README, "Verifying against vLLM".
"""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

from tmpl_lint.engines import prepare
from tmpl_lint.render import FrozenClock, render
from tmpl_lint.scenarios import scenarios
from tmpl_lint.server import ServerError, prompt_token_ids
from tmpl_lint.tokenizer import load_tokenizer

SHARED = Path(__file__).resolve().parents[2] / "shared"
TEMPLATES = {
    "qwen3": ["Qwen--Qwen3-0.6B.jinja"],
    "qwen2.5": ["Qwen--Qwen2.5-7B-Instruct.jinja"],
    "gpt-oss": ["openai--gpt-oss-120b.jinja"],
    "mistral-nemo": ["mistralai--Mistral-Nemo-Instruct-2407.jinja"],
}


def main() -> None:
    url = os.environ.get("TMPL_LINT_VLLM_URL")
    if not url or len(sys.argv) != 2 or sys.argv[1] not in TEMPLATES:
        sys.exit(f"usage: TMPL_LINT_VLLM_URL=URL python bench/vllm_peer.py {{{'|'.join(TEMPLATES)}}}")
    name = sys.argv[1]
    tokenizer = load_tokenizer(SHARED / "tokenizers" / name)
    for template_name in TEMPLATES[name]:
        template = (SHARED / "corpus" / "templates" / template_name).read_text()
        same = total = 0
        for scenario in scenarios({}):
            for call in scenario.calls:
                clock = FrozenClock(datetime.now())  # the server reads its own clock
                messages, kwargs = prepare("vllm", template, call.messages, scenario.kwargs)
                text = render(template, messages, clock=clock, tools=scenario.tools, add_generation_prompt=True,
                              special_tokens=tokenizer.special_tokens, template_kwargs=kwargs)
                body = {"messages": call.messages, "tools": scenario.tools, "chat_template_kwargs": scenario.kwargs,
                        "chat_template": template}
                try:
                    served = prompt_token_ids(url, body)
                except ServerError as error:
                    sys.exit(f"{template_name}: {error}")
                total += 1
                same += served == tokenizer.encode(text)
        print(f"{template_name}: {same} of {total} requests give identical token ids")


if __name__ == "__main__":
    main()
