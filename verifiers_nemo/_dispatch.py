"""Feeding rollouts to whoever runs them: the bounded, completion-ordered stream every runner shares,
and the least-loaded choice among several policy endpoints."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from ._endpoint import Endpoint
from ._exceptions import ConfigurationError

if TYPE_CHECKING:
    from ._result import RolloutResult
    from ._tasks import Task

EndpointChoice = Endpoint | Sequence[Endpoint] | Callable[["Task"], Endpoint]


class LeastLoaded:
    """Several endpoints (e.g. vLLM replicas): each rollout goes to the one with the fewest rollouts in
    flight; ties go to the one used least recently, so an idle pool is used round-robin."""

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints = list(endpoints)
        if not self.endpoints:
            raise ConfigurationError("endpoints is an empty list; pass at least one Endpoint.")
        self.in_flight = [0] * len(self.endpoints)
        self._last_used = [0] * len(self.endpoints)
        self._clock = 0

    def acquire(self) -> int:
        """The index of the endpoint to use now (release it when the rollout ends)."""
        index = min(range(len(self.endpoints)), key=lambda i: (self.in_flight[i], self._last_used[i]))
        self.in_flight[index] += 1
        self._clock += 1
        self._last_used[index] = self._clock
        return index

    def release(self, index: int) -> None:
        self.in_flight[index] -= 1


class EndpointPicker:
    """``endpoints=`` of a run, as a choice per task: one endpoint, a list (least loaded first) or a
    function of the task. ``None`` stands for "the worker picks" (a replay worker's own server)."""

    def __init__(self, endpoints: EndpointChoice | None) -> None:
        self._fixed: Endpoint | None = None
        self._function: Callable[[Task], Endpoint] | None = None
        self._pool: LeastLoaded | None = None
        if endpoints is None or isinstance(endpoints, Endpoint):
            self._fixed = endpoints
        elif callable(endpoints):
            self._function = endpoints
        else:
            self._pool = LeastLoaded(endpoints)

    @property
    def known(self) -> list[Endpoint]:
        """The endpoints known before any task is seen (for their keys)."""
        if self._pool is not None:
            return list(self._pool.endpoints)
        return [self._fixed] if self._fixed is not None else []

    def acquire(self, task: Task) -> tuple[Endpoint | None, Callable[[], None]]:
        """The endpoint for ``task`` and the call that says its rollout ended."""
        if self._pool is not None:
            index = self._pool.acquire()
            return self._pool.endpoints[index], lambda: self._pool.release(index)  # type: ignore[union-attr]
        if self._function is not None:
            return self._function(task), _nothing
        return self._fixed, _nothing


def _nothing() -> None:
    return None


def check_concurrency(concurrency: object) -> int:
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ConfigurationError(f"concurrency must be a positive integer, not {concurrency!r}.")
    return concurrency


async def stream_rollouts(
    tasks: Iterable[Task],
    run_one: Callable[[Task], Awaitable[RolloutResult]],
    concurrency: int,
) -> AsyncIterator[RolloutResult]:
    """Run ``run_one`` over ``tasks`` with at most ``concurrency`` at once, taking the next task only when
    one finishes (a work queue: slow rollouts never hold back fast ones); yield results as they finish.

    Finished rollouts are handed over by a done-callback: O(1) per rollout, where ``asyncio.wait`` over
    every pending one would cost O(concurrency) per completion. Closing the stream cancels the rest."""
    finished: asyncio.Queue[asyncio.Future[RolloutResult]] = asyncio.Queue()
    running: set[asyncio.Future[RolloutResult]] = set()
    iterator = iter(tasks)
    exhausted = False
    try:
        while True:
            while not exhausted and len(running) < concurrency:
                try:
                    task = next(iterator)
                except StopIteration:
                    exhausted = True
                    break
                future = asyncio.ensure_future(run_one(task))
                future.add_done_callback(finished.put_nowait)
                running.add(future)
            if not running:
                return
            done = await finished.get()
            running.discard(done)
            yield done.result()
    finally:
        for leftover in running:
            leftover.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
