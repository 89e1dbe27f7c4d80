"""Ctrl-C and DuckDB: a statement stopped by an interrupt ends in exactly one KeyboardInterrupt, and a rollback
runs whole."""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import duckdb


def caused_by_ctrl_c(exc: BaseException) -> bool:
    """``exc`` is a Ctrl-C, DuckDB's error for one, or an error raised while handling either (a wrapper that
    turned the interrupt into its own error must not make a Ctrl-C look like a failure)."""
    seen: BaseException | None = exc
    for _ in range(32):  # a chain is short; a cycle would be a bug elsewhere, not a reason to hang
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt) or _interrupted(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _interrupted(exc: BaseException) -> bool:
    """A Ctrl-C that landed while DuckDB ran a statement: its Python client stops the query and raises
    ``RuntimeError("Query interrupted")`` (or, for a statement :func:`interruptible` stopped,
    ``duckdb.InterruptException``) in place of the KeyboardInterrupt, which we raise again as itself."""
    return (type(exc) is RuntimeError and str(exc) == "Query interrupted") or isinstance(exc, duckdb.InterruptException)


@contextmanager
def interruptible(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Let Ctrl-C stop the DuckDB statement running inside the block (opening and migrating a store, a long
    ``sql`` query): the block ends with exactly one KeyboardInterrupt. For blocks that are mostly statements.

    DuckDB runs a statement without returning to the interpreter, so Python's SIGINT handler waits for its end
    (measured: a Ctrl-C during a slow statement was never seen; DuckDB's client may even run the handler itself
    and drop its KeyboardInterrupt). The C-level handler still writes the signal number to
    ``signal.set_wakeup_fd`` at once: a watcher thread reading it calls ``con.interrupt()``, and the statement
    ends with DuckDB's interrupt error. Inside the block SIGINT only records the Ctrl-C — a KeyboardInterrupt
    raised in the middle of the rollback that error starts would leave the transaction open — and the block
    raises KeyboardInterrupt in place of whatever the interrupt ended with, or at its end when the statement
    finished first: a Ctrl-C is never swallowed. The wakeup fd is process-wide (asyncio uses it): the previous
    one is restored on exit and gets every byte meanwhile. Outside the main thread (where signals are not
    delivered), or when SIGINT has a handler other than Python's default, this does nothing.
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    r, w = socket.socketpair()
    w.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    except ValueError:  # a main thread of an embedded interpreter without signal support
        r.close()
        w.close()
        yield
        return
    pressed: list[int] = []

    def on_sigint(signum: int, frame: Any) -> None:
        pressed.append(signum)

    def watch() -> None:
        # until the NUL byte the block's exit sends, after every signal byte that came before it
        while data := r.recv(64):
            signals = data.replace(b"\0", b"")
            if signals and previous != -1:
                with suppress(OSError):
                    os.write(previous, signals)
            if b"\0" in data:
                return
            if signal.SIGINT in signals:
                con.interrupt()

    watcher = threading.Thread(target=watch, name="promptcache-interrupt", daemon=True)
    signal.signal(signal.SIGINT, on_sigint)
    watcher.start()
    try:
        yield
    except BaseException as exc:
        if (pressed or _interrupted(exc)) and not isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt from None  # DuckDB's interrupt error, or what a caller made of it
        raise
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(previous)
        w.send(b"\0")  # signal numbers start at 1: this one tells the watcher to forward what is left and leave
        watcher.join()
        r.close()
        w.close()
    if pressed:  # the statement finished before the interrupt reached it, or Python code ran
        raise KeyboardInterrupt


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """A Ctrl-C that arrives inside the block waits for its end, then raises KeyboardInterrupt: a rollback, and
    the reads that bring objects back to what the store holds after it, run whole even when Ctrl-C is pressed
    again (a KeyboardInterrupt in the middle of a rollback would leave the transaction open). Only in the main
    thread with Python's default SIGINT handler (as :func:`interruptible`, which already only records one)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    pressed: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if pressed:
        raise KeyboardInterrupt
