"""What a serving engine's KV cache keeps between requests, replayed request by request:
``pools`` (one engine's cache: vLLM's block pool, SGLang's radix tree, llama.cpp's slots),
``hybrid`` (vLLM's coordinator for sliding-window, Mamba and linear-attention layers),
``fleet`` (replicas behind a router) and ``hosted`` (hosted APIs' published caching rules)."""
