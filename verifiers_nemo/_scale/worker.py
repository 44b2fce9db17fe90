"""``StackWorker``: one Gym stack and routing proxy for one environment, driven by a ``StackPool``.

A worker lives in the driver's process (a local pool, e.g. a mix of environments on one machine) or in
a Ray actor (``--ray``); the pool talks to it through the same four calls either way. Everything a
worker takes and returns pickles (tasks, endpoints, a ``RolloutCall``, results), so a Ray actor can host it
unchanged.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._endpoint import Endpoint
from .._result import RolloutResult
from .._tasks import Task


@dataclass(frozen=True)
class RolloutCall:
    """One rollout as a pool hands it to a worker (``WorkerHandle.rollout``, ``StackWorker.rollout``): the
    arguments of ``NeMoGymPool.rollout``, in one value that pickles to a Ray actor as it is."""

    task: Task
    endpoint: Endpoint | None
    """``None``: the replay of ``task``'s recording."""
    sampling_args: dict[str, Any] | None = None
    timeout: float | None = None
    replicas: tuple[Endpoint, ...] | None = None
    """The run's replicas of the policy, ``endpoint`` among them."""


class StackWorker:
    """One environment's harness: its Gym stack, proxy and, for a replay, a replay server of its own.

    ``harness_args`` are ``NeMoGymHarness``'s keyword arguments. A replay worker answers the policy and
    judge calls of the tasks it was given at ``start`` from their recordings, on a server of its own on
    its own machine (a Ray node cannot reach the driver's loopback)."""

    def __init__(self, env: str, harness_args: dict[str, Any]) -> None:
        from .._harness import NeMoGymHarness

        self.env = env
        self.harness = NeMoGymHarness(env, **harness_args)
        self._replay: Any = None

    async def start(self, secrets: Sequence[str] = (), replay_tasks: Sequence[Task] | None = None) -> dict[str, Any]:
        """Start the stack (and the replay server); returns where it runs and how long the start took."""
        started = time.monotonic()
        self.harness.add_secrets(*secrets)
        if replay_tasks is not None and self._replay is None:
            from .._judge import ANY_JUDGE
            from .._replay import ReplayServer

            self._replay = ReplayServer.from_tasks(list(replay_tasks)).start()
            if not self.harness.judges:
                self.harness.set_judge({ANY_JUDGE: self._replay.judge_endpoint()})
        self.harness.check()
        await self.harness.astart()
        return {
            "env": self.env,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start_s": time.monotonic() - started,
            "judges": {name: self.harness.judge_label(name) for name in self.harness.judges.names},
        }

    async def rollout(self, call: RolloutCall) -> RolloutResult:
        """One rollout (``call.endpoint=None``: the replay of its task's recording). ``call.replicas``: the run's
        replicas of the policy, whose calls move among them on this worker's own view of their health (the
        harness keeps one per list)."""
        endpoint = call.endpoint
        if endpoint is None:
            if self._replay is None:
                raise RuntimeError("this worker was started without replay tasks; pass an endpoint")
            endpoint = self._replay.endpoint_for(call.task)
        return await self.harness.rollout(
            call.task, endpoint, call.sampling_args, call.timeout, replicas=call.replicas, _queued_at=time.monotonic()
        )

    def judge_calls(self) -> dict[str, list[Any]]:
        """The judge calls recorded since the last call, by judge name."""
        return self.harness.judge_calls()

    async def gym_metrics(self, entries: dict[str | None, list[dict[str, Any]]]) -> dict[str, Any]:
        """Gym's own metrics of verify responses of this environment's rollouts (by agent), as its stack's
        ``/aggregate_metrics`` answers them: ``{agent: answer}``; empty when the stack is not running."""
        from .._eval.gym_metrics import aggregate_metrics_url, ask_gym_metrics

        if not self.harness.started:
            return {}
        env = self.harness.env_name
        urls = {(env, agent): aggregate_metrics_url(self.harness, agent) for agent in entries}
        answers = await ask_gym_metrics(urls, {(env, agent): rows for agent, rows in entries.items()})
        return answers.get(env, {})

    def gym_sessions(self) -> list[int]:
        """Session ids of this worker's own Gym processes (its stack's supervisor; the Ray head it joined is
        the machine's, shared with other processes, and outlives the worker while they hold it)."""
        stack = self.harness._stack
        if stack is not None and stack.launch is not None:
            return [stack.launch.supervisor.pid]
        return []

    async def stop(self) -> None:
        """Stop the stack and the replay server. Idempotent."""
        try:
            await self.harness.aclose()
        finally:
            if self._replay is not None:
                self._replay.stop()
                self._replay = None
