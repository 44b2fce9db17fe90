"""One refcounted registry: the process shares one object per key (a stack per config, a Ray head per
Gym runtime) among its users; the last user to let go stops it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable


class Registry[K: Hashable, V]:
    """``acquire(key, create)`` gives the shared value for ``key`` (made by ``create()`` on first use or when
    ``reusable(value)`` says the old one is spent); ``release(key, value)`` says whether that was the last user
    (None: ``value`` is not the one registered for ``key``, e.g. a spent one already replaced)."""

    def __init__(self, reusable: Callable[[V], bool] = lambda value: True) -> None:
        self._lock = threading.Lock()
        self._entries: dict[K, tuple[V, int]] = {}
        self._reusable = reusable

    def acquire(self, key: K, create: Callable[[], V]) -> tuple[V, V | None]:
        """The value for ``key`` with one more user, and the spent value it replaced (to stop), if any."""
        with self._lock:
            value, count = self._entries.get(key, (None, 0))
            spent = None
            if value is not None and not self._reusable(value):
                spent, value, count = value, None, 0
            if value is None:
                value = create()
            self._entries[key] = (value, count + 1)
            return value, spent

    def release(self, key: K, value: V) -> bool | None:
        """Drop one user of ``value``: True when none is left (the caller stops it), None when not registered."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] is not value:
                return None
            if entry[1] > 1:
                self._entries[key] = (value, entry[1] - 1)
                return False
            del self._entries[key]
            return True

    def clear(self) -> list[V]:
        """Forget every value (at exit); returns them, for the caller to stop."""
        with self._lock:
            values = [value for value, _ in self._entries.values()]
            self._entries.clear()
            return values
