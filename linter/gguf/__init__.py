"""GGUF models: the chat templates in a file's metadata, the tokenizer it describes, fixes.

llama.cpp, LM Studio and Ollama's GGUF imports read the chat template from the metadata:
``tokenizer.chat_template`` (reported as ``model.gguf:default``) and named
``tokenizer.chat_template.<name>`` variants (``model.gguf:<name>``; llama.cpp uses
``tool_use`` for requests with tools). A split model (``*-00001-of-0000N.gguf``) keeps its
metadata in the first split.

Where to go:

- ``format``: reading the header and metadata of a file (or of a Hub model's first bytes);
- ``models``: a model on disk: its name, splits, templates, and the fixed files beside it;
- ``tokenizer``: the tokenizer its metadata describes, and the special tokens;
- ``cache``: the built tokenizers kept under the user's cache;
- ``writing``: ``--fix`` beside a model and ``--gguf-copy``;
- ``hub``: GGUF repos on the Hugging Face Hub.
"""
