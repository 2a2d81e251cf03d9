"""tmpl-lint: find and fix chat-template patterns that break the serving engine's prefix cache."""

__version__ = "0.1.0"
