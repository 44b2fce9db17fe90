"""``run_blocking``: a coroutine run to the end from synchronous code, even where a loop already runs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any


def run_blocking[T](make: Callable[[], Coroutine[Any, Any, T]], *, name: str = "run_blocking") -> T:
    """Run ``make()`` and return its result, blocking the caller.

    Without a running loop in this thread it is ``asyncio.run``; inside one (a Jupyter cell, an async
    function) the coroutine runs on a loop of its own in a worker thread, and its exception, if any, is
    raised here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    outcome: list[T] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            outcome.append(asyncio.run(make()))
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)

    worker = threading.Thread(target=work, name=name, daemon=True)
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return outcome[0]
