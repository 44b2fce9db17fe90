"""How a stack tells everyone that its current generation ended: threads ask, listeners are called, and
event loops await one future per (generation, loop)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Deaths:
    """The end of a stack's generations: ``begin(generation)`` when one runs, ``die`` when it died (once, with
    the reason; listeners called), ``end`` when it was stopped. Thread-safe; futures resolved on their loops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._over = True
        self._reason: str | None = None
        self._died = False
        self._listeners: list[Callable[[int, str], None]] = []
        self._waiters: dict[tuple[int, asyncio.AbstractEventLoop], asyncio.Future[str]] = {}

    @property
    def died(self) -> bool:
        """Whether the current generation died (not merely stopped)."""
        return self._died

    @property
    def reason(self) -> str | None:
        """Why the current generation died; None while it lives or when it was stopped."""
        return self._reason

    def begin(self, generation: int) -> None:
        with self._lock:
            self._generation, self._over, self._died, self._reason = generation, False, False, None

    def is_over(self, generation: int | None = None) -> bool:
        """Whether the current generation (or ``generation``: also true for any other one) ended."""
        return self._over or (generation is not None and generation != self._generation)

    def on_death(self, listener: Callable[[int, str], None]) -> None:
        """Call ``listener(generation, reason)`` (from the thread that saw the death) when a generation dies."""
        self._listeners.append(listener)

    def die(self, generation: int, reason: str) -> bool:
        """Generation ``generation`` died of ``reason``: false when it had already ended (or is not current)."""
        with self._lock:
            if self._over or generation != self._generation:
                return False
            self._over, self._died, self._reason = True, True, reason
        self._resolve(reason)
        for listener in list(self._listeners):
            try:
                listener(generation, reason)
            except Exception:  # a listener's bug must not stop the others
                logger.exception("stack death listener failed")
        return True

    def end(self, reason: str) -> None:
        """The current generation was stopped: its waiters learn ``reason`` (or why it had died)."""
        with self._lock:
            self._over = True
        self._resolve(self._reason or reason)

    def future(self, generation: int) -> asyncio.Future[str]:
        """A future of the running event loop that resolves, with the reason, when ``generation`` ends (at once
        if it has). One per (generation, loop), shared by every rollout waiting on it, so a rollout waits on
        its request and this instead of polling."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._over or generation != self._generation:
                future = loop.create_future()
                future.set_result(self._reason or "stopped")
                return future
            future = self._waiters.get((generation, loop))
            if future is None:
                for key in [k for k in self._waiters if k[1].is_closed()]:
                    del self._waiters[key]
                future = self._waiters[(generation, loop)] = loop.create_future()
            return future

    def _resolve(self, reason: str) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, {}
        for (_, loop), future in waiters.items():
            try:
                loop.call_soon_threadsafe(_set_result, future, reason)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass


def _set_result(future: asyncio.Future[str], reason: str) -> None:
    if not future.done():
        future.set_result(reason)
