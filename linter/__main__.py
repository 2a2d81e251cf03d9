"""The ``tmpl-lint`` console script and ``python -m tmpl_lint``.

Signals are handled before the command's modules load: they take the first few tenths of
a second, and Ctrl-C then printed a traceback and the process died by the signal. Here only
the standard library (and ``stopping``, which needs no more) is loaded, and a Ctrl-C or
SIGTERM at any moment after ends as one arriving later does: one line, "tmpl-lint:
interrupted" and exit 130, or "tmpl-lint: terminated" and exit 143.
"""

import _thread  # noqa: PLC2701 - the standard library's module, not a private name of ours
import signal
import sys
import threading

from .stopping import Terminated, stopped_by, terminated


def run() -> None:
    signal.signal(signal.SIGTERM, terminated)
    sys.unraisablehook = signal_again
    try:
        from .cli import run as run_command  # noqa: PLC0415 -- after the signal handlers: the commands load in tenths of a second

        run_command()  # says "interrupted" or "terminated" itself once it runs
    except (KeyboardInterrupt, Terminated, RuntimeError) as error:
        stop = stopped_by(error)
        if stop is None:
            raise
        sys.stderr.write(f"tmpl-lint: {stop.word}\n")
        sys.exit(stop.status)
    finally:
        forget_interrupts_caught_after_exec()


def forget_interrupts_caught_after_exec() -> None:
    """The exit status chosen above is the process's, also after a Ctrl-C that landed in code
    run by exec() or eval() of a string, as dataclasses and namedtuple make their methods while
    modules load. CPython (3.10 to 3.13 at least; Python/pythonrun.c, run_eval_code_obj) then
    flags the KeyboardInterrupt as unhandled, even once caught, and at its very end `python -m`
    (Modules/main.c, Py_RunMain) kills itself with SIGINT: -2, not 130, after "interrupted"
    was said. (A script, as the console script is, exits earlier, by Py_Exit.) The same
    function clears the flag as each such run starts, so one that ends normally clears it;
    where a caught interrupt is never flagged (CPython's main branch), this changes nothing.
    Unlike os._exit, nothing is skipped: atexit and finalisation still run."""
    exec("")


def signal_again(unraisable) -> None:
    """A Ctrl-C or SIGTERM that lands in a __del__ or a weakref callback (importlib runs some
    as modules load) cannot leave it: Python says "Exception ignored ... KeyboardInterrupt" and
    the run went on to its end, exit 0. The signal is sent again to the main thread, whose
    code then raises its exception once this hook and the __del__ are done, and the run ends
    as anywhere else. It is sent from another thread: the main thread raises a signal's
    exception at its next bytecode, which here would still be in this hook."""
    error = unraisable.exc_value
    if isinstance(error, KeyboardInterrupt):
        number = signal.SIGINT
    elif isinstance(error, Terminated):
        number = signal.SIGTERM
    else:
        sys.__unraisablehook__(unraisable)
        return
    main_thread = threading.main_thread().ident
    assert main_thread is not None, "the main thread has started"
    _thread.start_new_thread(signal.pthread_kill, (main_thread, number))


if __name__ == "__main__":
    run()
