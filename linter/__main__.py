"""The ``tmpl-lint`` console script and ``python -m tmpl_lint``.

Signals are handled before the command's modules load: they take the first few tenths of
a second, and Ctrl-C then printed a traceback and the process died by the signal. Here only
the standard library is loaded, and a Ctrl-C or SIGTERM at any moment after ends as one
arriving later does: one line and exit 130, or exit 143.
"""

import signal
import sys


def run() -> None:
    signal.signal(signal.SIGTERM, terminated)
    try:
        from .cli import run as run_command

        run_command()  # says "interrupted" itself for a Ctrl-C once it runs
    except KeyboardInterrupt:
        sys.stderr.write("tmpl-lint: interrupted\n")
        sys.exit(130)


def terminated(signum, frame):
    # Raised in the main thread like Ctrl-C's KeyboardInterrupt, so cleanup runs.
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    run()
