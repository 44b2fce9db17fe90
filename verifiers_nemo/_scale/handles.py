"""How a pool talks to its workers: ``WorkerHandle``, and the in-process handle (``LocalWorker``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .._result import RolloutResult
from .._tasks import Task
from .worker import RolloutCall, StackWorker


class WorkerHandle(Protocol):
    """One worker of a pool, wherever it runs. ``rollout`` raises ``WorkerLost`` when the worker is gone
    (its rollout may be retried elsewhere); every other failure is a typed error on the result."""

    env: str
    label: str
    """Where it runs, for messages (``node 3f2a… pid 1234``)."""

    async def start(self, secrets: Sequence[str], replay_tasks: Sequence[Task] | None) -> dict[str, Any]: ...

    async def rollout(self, call: RolloutCall) -> RolloutResult: ...

    async def judge_calls(self) -> dict[str, list[Any]]: ...

    async def gym_metrics(self, entries: dict[str | None, list[dict[str, Any]]]) -> dict[str, Any]: ...

    async def stop(self) -> None: ...


class LocalWorker:
    """A ``StackWorker`` in this process."""

    def __init__(self, env: str, harness_args: dict[str, Any]) -> None:
        self.env = env
        self.label = "this process"
        self.worker = StackWorker(env, harness_args)

    async def start(self, secrets: Sequence[str], replay_tasks: Sequence[Task] | None) -> dict[str, Any]:
        return await self.worker.start(secrets, replay_tasks)

    async def rollout(self, call: RolloutCall) -> RolloutResult:
        return await self.worker.rollout(call)

    async def judge_calls(self) -> dict[str, list[Any]]:
        return self.worker.judge_calls()

    async def gym_metrics(self, entries: dict[str | None, list[dict[str, Any]]]) -> dict[str, Any]:
        return await self.worker.gym_metrics(entries)

    async def stop(self) -> None:
        await self.worker.stop()
