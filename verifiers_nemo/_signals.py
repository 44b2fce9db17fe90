"""The one owner of process signals: ``capture_signals()``, in uvicorn's style.

While the block runs, SIGINT and SIGTERM (or the ``signals`` given) only get *recorded*: the handler
appends the signal to ``captured.signals`` and calls ``on_signal(sig, count)``, nothing else. On exit the
previous handlers are restored (whatever they were, not the defaults), and every captured signal is
raised again, so the caller still sees what the user sent: SIGINT becomes ``KeyboardInterrupt`` under
Python's default handler, SIGTERM ends the process. A repeated signal (``force=True``) restores the
previous handlers and re-raises at once: the user asked twice. Nothing is torn down inside a handler;
the Gym processes need no handler at all, since their supervisor takes them down when its pipe from
this process closes, however this process ends.

Usage (an asyncio CLI)::

    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    with capture_signals(lambda sig, count: loop.call_soon_threadsafe(task.cancel)) as captured:
        try:
            await work()
        except asyncio.CancelledError:
            if not captured:
                raise
            task.uncancel()
        await cleanup()  # runs with the signal recorded, before it is raised again
    # (reached only when no signal came, or its previous handler returned, e.g. SIG_IGN)

``on_signal`` runs in the main thread between two bytecodes of whatever it interrupted: it must only
schedule (``loop.call_soon_threadsafe``) or record, never block, take a lock or stop anything. Signals can
only be handled in the main thread: elsewhere the block runs with nothing captured (``reraise`` moot).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)

OnSignal = Callable[[signal.Signals, int], object]
"""``on_signal(sig, count)``: ``count`` is how many signals the block has captured so far, this one included."""


# -- what a forced exit waits for -------------------------------------------------------------------

FORCED_EXIT_WAIT_S = 5.0
_unfinished = threading.Lock()
_unfinished_owner: int | None = None


@contextlib.contextmanager
def before_forced_exit() -> Iterator[None]:
    """A short section a forced exit (a repeated signal) lets finish first, at most ``FORCED_EXIT_WAIT_S``:
    one that leaves files behind unless it completes, e.g. a stack's run folder created before the
    supervisor that removes it is started. One at a time in the process."""
    global _unfinished_owner
    with _unfinished:
        _unfinished_owner = threading.get_ident()
        try:
            yield
        finally:
            _unfinished_owner = None


def end_now(sig: signal.Signals) -> None:
    """End the process by ``sig`` (its default action) at once, as the user asked by repeating it: after a
    ``before_forced_exit`` section another thread is in (unless it is this thread, which the handler
    interrupted). The one wait a handler may make (bounded), since nothing runs after it."""
    if _unfinished_owner != threading.get_ident() and _unfinished.acquire(timeout=FORCED_EXIT_WAIT_S):
        _unfinished.release()
    signal.signal(sig, signal.SIG_DFL)
    signal.raise_signal(sig)


@dataclass
class CapturedSignals:
    """The signals a ``capture_signals()`` block received, in order; true when there is one."""

    signals: list[signal.Signals] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.signals)


@contextlib.contextmanager
def capture_signals(
    on_signal: OnSignal | None = None,
    signals: Iterable[signal.Signals] = HANDLED_SIGNALS,
    *,
    force: bool = True,
    reraise: bool = True,
) -> Iterator[CapturedSignals]:
    """Record ``signals`` while the block runs; restore the previous handlers and re-raise them after it."""
    captured = CapturedSignals()
    if threading.current_thread() is not threading.main_thread():
        yield captured
        return
    previous: dict[signal.Signals, Any] = {}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        previous.clear()

    def handle(signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if force and captured.signals:  # asked again: give the process back to the previous handlers now
            restore()
            signal.raise_signal(sig)
            return
        captured.signals.append(sig)
        if on_signal is not None:
            on_signal(sig, len(captured.signals))

    for sig in dict.fromkeys(signals):
        previous[sig] = signal.signal(sig, handle)
    try:
        yield captured
    finally:
        restore()
        if reraise:
            for sig in reversed(captured.signals):  # LIFO, as uvicorn does
                signal.raise_signal(sig)


# -- the one teardown path at interpreter exit -------------------------------------------------------

_exit_lock = threading.Lock()
_exit_callbacks: list[Callable[[], object]] = []


def at_exit(callback: Callable[[], object]) -> None:
    """Run ``callback`` at interpreter exit (last registered, first run), in the one teardown path.

    Teardown runs with SIGINT/SIGTERM captured: a signal that comes meanwhile (an impatient second
    Ctrl-C) does not break it into a traceback; once it is done the process ends by that signal. A
    second signal during teardown ends the process at once (each stack's supervisor cleans up)."""
    with _exit_lock:
        if not _exit_callbacks:
            atexit.register(run_exit_teardown)
        if callback not in _exit_callbacks:
            _exit_callbacks.append(callback)


def run_exit_teardown() -> None:
    """Run the ``at_exit`` callbacks now (idempotent: each runs once)."""

    def on_signal(sig: signal.Signals, count: int) -> None:
        if count > 1:
            end_now(sig)

    with capture_signals(on_signal, force=False, reraise=False) as captured:
        while True:
            with _exit_lock:
                if not _exit_callbacks:
                    break
                callback = _exit_callbacks.pop()
            try:
                callback()
            except Exception:
                logger.exception("teardown at exit failed: %r", callback)
    if captured:
        end_now(captured.signals[0])
