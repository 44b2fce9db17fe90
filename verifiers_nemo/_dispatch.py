"""Feeding rollouts to whoever runs them: the bounded, completion-ordered stream every runner shares,
and the choice of endpoint per rollout (the least-loaded live one among several replicas: ``_replicas``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._endpoint import Endpoint
from ._exceptions import ConfigurationError
from ._replicas import Lease, Replicas

if TYPE_CHECKING:
    from ._harness import NeMoGymHarness
    from ._result import RolloutResult
    from ._tasks import Task
    from ._upstreams import Upstream

EndpointChoice = Endpoint | Sequence[Endpoint] | Replicas | Callable[["Task"], Endpoint]


class Pick:
    """Where one rollout goes: its endpoint (``None``: the worker picks), the lease when it is one of several
    replicas, and ``release()`` for when the rollout ends."""

    __slots__ = ("endpoint", "lease")

    def __init__(self, endpoint: Endpoint | None, lease: Lease | None = None) -> None:
        self.endpoint = endpoint
        self.lease = lease

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()


class EndpointPicker:
    """``endpoints=`` of a run, as a choice per task: one endpoint, a list or a ``Replicas`` (the least-loaded
    live replica first; a list makes a ``Replicas`` for the run, closed by ``close()``) or a function of the
    task. ``None`` stands for "the worker picks" (a replay worker's own server)."""

    def __init__(self, endpoints: EndpointChoice | None) -> None:
        self._fixed: Endpoint | None = None
        self._function: Callable[[Task], Endpoint] | None = None
        self.replicas: Replicas | None = None
        """The health view of several replicas (None: one endpoint or a function)."""
        self._owns_replicas = False
        if endpoints is None or isinstance(endpoints, Endpoint):
            self._fixed = endpoints
        elif isinstance(endpoints, Replicas):
            self.replicas = endpoints
        elif callable(endpoints):
            self._function = endpoints
        else:
            self.replicas = Replicas(endpoints)
            self._owns_replicas = True

    @property
    def known(self) -> list[Endpoint]:
        """The endpoints known before any task is seen (for their keys)."""
        if self.replicas is not None:
            return self.replicas.endpoints
        return [self._fixed] if self._fixed is not None else []

    def acquire(self, task: Task) -> Pick:
        """Where ``task``'s rollout goes (release the pick when it ends)."""
        if self.replicas is not None:
            lease = self.replicas.acquire()
            return Pick(lease.endpoint, lease)
        if self._function is not None:
            return Pick(self._function(task))
        return Pick(self._fixed)

    def close(self) -> None:
        """Stop probing the replicas of a list given as ``endpoints=`` (a ``Replicas`` given is the caller's)."""
        if self._owns_replicas and self.replicas is not None:
            self.replicas.close()


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


async def run_batch(
    harness: NeMoGymHarness,
    tasks: Iterable[Task],
    endpoints: Endpoint | Sequence[Endpoint] | Replicas | Callable[[Task], Endpoint],
    *,
    concurrency: int,
    sampling_args: dict[str, Any] | None,
    timeout: float | None,
    upstream: Upstream | None,
) -> AsyncIterator[RolloutResult]:
    """``NeMoGymHarness.run``: each task a ``harness.rollout`` on the endpoint its pick gives, ``concurrency`` at
    once, results as they finish."""
    check_concurrency(concurrency)
    picker = EndpointPicker(endpoints)
    harness.add_secrets(*(e.secret_key or "" for e in picker.known))  # before the stack starts: Gym never sees them
    try:
        await harness.astart()

        async def run_one(task: Task) -> RolloutResult:
            queued_at = time.monotonic()
            pick = picker.acquire(task)
            try:
                assert pick.endpoint is not None
                return await harness.rollout(
                    task, pick.endpoint, sampling_args, timeout, upstream=upstream, _queued_at=queued_at,
                    _lease=pick.lease,
                )  # fmt: skip
            finally:
                pick.release()

        async with contextlib.aclosing(stream_rollouts(tasks, run_one, concurrency)) as stream:
            async for result in stream:
                yield result
    finally:
        picker.close()
