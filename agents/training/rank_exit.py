"""How a command ends once it has joined a torch process group: its exit handlers run and its output is
flushed, then it leaves with ``os._exit`` instead of finalising the interpreter.

Why: gloo's worker threads let go of each collective's work after the caller already has its result.
Where that work holds a tensor that Python no longer references, letting go of it takes the GIL. If the
main thread has begun to finalise the interpreter by then, Python ends the worker thread, and the unwind
through C++ code that may not throw aborts the whole process (SIGABRT, "terminate called without an
active exception") after its work is done and written: torchrun then reports the run as failed. Freeing
the process groups first would join those threads, but DeepSpeed keeps references to them (its engine,
its optimiser, every ZeRO-3 parameter), so they outlive ``destroy_process_group``. Leaving without
finalisation ends the threads with the process, whatever they still hold.

A process that never joined a group ends as usual (``sys.exit``).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Callable, NoReturn

__all__ = ["exit_process", "run_main"]


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """Run a command's ``main`` and end the process with its status, as :func:`exit_process` does.

    ``main`` returns an exit status (``None`` is 0) or raises ``SystemExit``; any other exception is
    printed as the interpreter prints an uncaught one, and the status is 1 (130 for ``KeyboardInterrupt``).
    """
    try:
        status: object = main()
    except SystemExit as exc:
        status = exc.code
    except BaseException as exc:  # what the interpreter would print and exit with, before leaving our way
        sys.excepthook(type(exc), exc, exc.__traceback__)
        status = 130 if isinstance(exc, KeyboardInterrupt) else 1
    exit_process(_exit_code(status))


def exit_process(code: int) -> NoReturn:
    """End the process with ``code``. After joining a torch process group: wait for the non-daemon
    threads, run the exit handlers (the process group's teardown among them), flush stdout and stderr,
    then ``os._exit(code)``; otherwise ``sys.exit(code)``."""
    if not _joined_process_group():
        sys.exit(code)
    main = threading.main_thread()
    for thread in threading.enumerate():  # as the interpreter waits for them before its exit handlers
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe nobody reads any more
            pass
    os._exit(code)


def _joined_process_group() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def _exit_code(status: object) -> int:
    """The process's exit status for what ``main`` returned or passed to ``SystemExit``: ``None`` is 0,
    an integer itself, anything else is printed to stderr and is 1 (as ``sys.exit("message")`` does)."""
    if status is None:
        return 0
    if isinstance(status, int):
        return int(status)
    print(status, file=sys.stderr)
    return 1
