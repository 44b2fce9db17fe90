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

import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)

OnSignal = Callable[[signal.Signals, int], object]
"""``on_signal(sig, count)``: ``count`` is how many signals the block has captured so far, this one included."""


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
