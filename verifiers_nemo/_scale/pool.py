"""``NeMoGymPool``: rollouts of one or more environments over several Gym stacks, in this process or on
Ray actors, fed from one work queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from .._dispatch import EndpointChoice, EndpointPicker, check_concurrency, stream_rollouts
from .._endpoint import Endpoint
from .._exceptions import ConfigurationError, WorkerLost
from .._gym import canonical_reference
from .._result import RolloutResult
from .._tasks import Task
from .handles import LocalWorker, WorkerHandle
from .ray_cluster import RayCluster, RayPlacement
from .seats import Seat, Seats
from .worker import RolloutCall

logger = logging.getLogger(__name__)

JUDGE_COLLECT_EVERY = 500
"""Results between two collections of the workers' judge calls during a run (and one at its end)."""


class NeMoGymPool:
    """Runs tasks of one or more Gym environments, each on a stack of its own environment.

    ``envs`` names the environments (a name, a list, or a mapping from name to that environment's own
    ``NeMoGymHarness`` arguments); ``harness_args`` apply to every one. Without ``ray`` each environment
    gets one stack in this process. With ``ray`` (``"local"``/``True``: start a cluster here; an address:
    join it; or the cluster this process is already connected to) each environment gets ``workers`` Ray
    actors (a count, or a count per environment name; default: the cluster's CPUs / ``cpus_per_stack``
    when that is given, else one per live node), each owning a Gym stack and its routing proxy.

    Rollouts are taken from one queue as slots free up, each sent to the least-loaded live worker of its
    task's environment (``task.env``), and yielded in completion order. A rollout whose worker dies is
    retried once on another worker of its environment; if there is none it is a ``worker_lost`` row.
    Policy endpoints may be a list (several replicas): each rollout takes the least-loaded one.
    """

    def __init__(
        self,
        envs: str | Sequence[str] | Mapping[str, Mapping[str, Any]],
        *,
        ray: str | bool | None = None,
        workers: int | Mapping[str, int] | None = None,
        cpus_per_stack: float | None = None,
        actor_options: Mapping[str, Any] | None = None,
        secrets: Iterable[str] = (),
        **harness_args: Any,
    ) -> None:
        if isinstance(envs, str):
            envs = [envs]
        per_env = dict(envs) if isinstance(envs, Mapping) else {name: {} for name in envs}
        runtime = (harness_args.get("gym_python"), harness_args.get("gym_version"))
        per_env = {canonical_reference(name, *runtime): own for name, own in per_env.items()}  # yours: by path
        if not per_env:
            raise ConfigurationError("NeMoGymPool needs at least one environment.")
        self.env_args = {name: {**harness_args, **dict(own)} for name, own in per_env.items()}
        self.env_name = "+".join(self.env_args)
        self.ray = ray
        counts = workers.values() if isinstance(workers, Mapping) else [workers]
        if ray is None and any(count not in (None, 1) for count in counts):
            raise ConfigurationError("workers > 1 needs Ray (--ray): in one process an environment runs on one stack.")
        self.placement = RayPlacement(workers=workers, cpus_per_stack=cpus_per_stack, actor_options=actor_options)
        self._secrets = {s for s in secrets if s}
        self._replay_tasks: dict[str, list[Task]] | None = None
        self._cluster: RayCluster | None = None
        self._seats: list[Seat] = []
        self._live: dict[str, Seats] = {}
        self._started = False
        self._start_lock = asyncio.Lock()
        self._judge_calls: dict[str, list[Any]] = {}
        self._judge_labels: dict[str, str] = {}
        self._closed = False

    # -- configuration, before start -------------------------------------------------------------

    def add_secrets(self, *values: str) -> None:
        """Values no Gym process may see (API keys), like ``NeMoGymHarness.add_secrets``."""
        self._secrets |= {v for v in values if v}

    def use_replay(self, tasks: Iterable[Task]) -> None:
        """Answer the policy (and judge) calls of these recorded tasks from their recordings: each worker
        serves those of its environment itself. Rollouts then take ``endpoints=None``."""
        by_env: dict[str, list[Task]] = {}
        for task in tasks:
            by_env.setdefault(self._env_of(task), []).append(task)
        self._replay_tasks = by_env

    @property
    def handles(self) -> list[WorkerHandle]:
        """The workers (``LocalWorker``, or ``RayWorker`` whose ``actor`` is the Ray actor)."""
        return [seat.handle for seat in self._seats]

    @property
    def workers(self) -> list[dict[str, Any]]:
        """Where each worker runs (env, host, pid, Ray node, start seconds, rollouts done, alive)."""
        return [
            {**(seat.info or {"env": seat.handle.env}), "done": seat.done, "alive": seat.alive} for seat in self._seats
        ]

    # -- lifecycle -------------------------------------------------------------------------------

    async def astart(self) -> NeMoGymPool:
        """Start every worker's stack (at once). Idempotent."""
        async with self._start_lock:
            if self._started:
                return self
            if self._closed:
                raise RuntimeError("this NeMoGymPool is closed")
            self._seats = [Seat(handle) for handle in await self._make_handles()]
            started = time.monotonic()
            infos = await asyncio.gather(
                *(
                    seat.handle.start(
                        sorted(self._secrets),
                        None if self._replay_tasks is None else self._replay_tasks.get(seat.handle.env, []),
                    )
                    for seat in self._seats
                ),
                return_exceptions=True,
            )
            failures = [info for info in infos if isinstance(info, BaseException)]
            if failures:
                await self.aclose()
                raise failures[0]
            for seat, info in zip(self._seats, infos, strict=True):
                seat.info = info  # type: ignore[assignment]
                self._live.setdefault(seat.handle.env, Seats()).add(seat)
                self._judge_labels.update(info.get("judges") or {})  # type: ignore[union-attr]
            self._started = True
            logger.info("%d Gym stacks started in %.1fs", len(self._seats), time.monotonic() - started)
            return self

    async def _make_handles(self) -> list[WorkerHandle]:
        """One local worker per environment, or the Ray actors (the cluster started or joined first)."""
        if self.ray is None:
            return [LocalWorker(env, args) for env, args in self.env_args.items()]
        self._cluster = await asyncio.to_thread(RayCluster, self.ray)
        return list(self._cluster.place(self.env_args, self.placement))

    async def aclose(self) -> None:
        """Stop every worker's stack (and the Ray actors; a Ray cluster started here too). Idempotent."""
        self._closed = True
        seats, self._seats = self._seats, []
        self._live.clear()
        await asyncio.gather(*(seat.handle.stop() for seat in seats), return_exceptions=True)
        if self._cluster is not None:
            cluster, self._cluster = self._cluster, None
            await cluster.close()

    async def __aenter__(self) -> NeMoGymPool:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- rollouts --------------------------------------------------------------------------------

    def _env_of(self, task: Task) -> str:
        if task.env in self.env_args:
            return task.env  # type: ignore[return-value]
        if task.env is None and len(self.env_args) == 1:
            return next(iter(self.env_args))
        raise ConfigurationError(
            f"task {task.task_index} is of environment {task.env!r}, which this pool does not run "
            f"({', '.join(self.env_args)})."
        )

    async def rollout(
        self,
        task: Task,
        endpoint: Endpoint | None,
        sampling_args: dict[str, Any] | None = None,
        timeout: float | None = None,
        replicas: tuple[Endpoint, ...] | None = None,
    ) -> RolloutResult:
        """One rollout on the least-loaded live worker of its environment; retried once elsewhere if that
        worker dies. Never raises for a rollout failure (the result carries a typed error). ``replicas``: the
        endpoints ``endpoint`` is one of, among which the worker moves calls that do not connect."""
        await self.astart()
        env = self._env_of(task)
        tried: list[Seat] = []
        lost: WorkerLost | None = None
        seats = self._live.get(env) or Seats()
        call = RolloutCall(task, endpoint, sampling_args, timeout, replicas)
        for _attempt in range(2):
            seat = seats.take(avoid=tried)
            if seat is None:
                break
            try:
                result = await seat.handle.rollout(call)
                seat.done += 1
                return result
            except WorkerLost as exc:
                if seat.alive:
                    seats.drop(seat)
                    seat.alive = False
                    logger.warning("%s (%s) is gone: %s", seat.handle.label, env, exc)
                lost = exc
                tried.append(seat)
            finally:
                seats.give_back(seat)
        result = RolloutResult(
            task_index=task.task_index,
            rollout_index=task.rollout_index,
            example_id=task.example_id,
            env=env,
            agent=task.agent_name,
            endpoint=endpoint.label if endpoint is not None else None,
            prompt=list(task.prompt),
        )
        result.error = lost or WorkerLost(f"no live worker of environment {env!r} is left")
        return result

    async def run(
        self,
        tasks: Iterable[Task],
        endpoints: EndpointChoice | None,
        *,
        concurrency: int = 32,
        sampling_args: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[RolloutResult]:
        """Run ``tasks`` with at most ``concurrency`` in flight over all workers; yield results as they
        finish. ``endpoints``: one, a list of replicas or a ``Replicas`` (the least-loaded live one first), a
        function of the task, or ``None`` after ``use_replay``.

        With replicas, two views of their health: each worker moves its own calls off a replica that does not
        connect, on its own view (a call cannot wait for a word from this process, and a replica may be reachable
        from one node and not another); this process places each rollout on its view, which a result whose
        calls moved off a replica updates (``RolloutResult.failed_over``), and which probes that replica."""
        check_concurrency(concurrency)
        if endpoints is None and self._replay_tasks is None:
            raise ConfigurationError("endpoints=None replays recordings: call use_replay(tasks) first.")
        picker = EndpointPicker(endpoints)
        replicas = tuple(picker.replicas.endpoints) if picker.replicas is not None else None
        self.add_secrets(*(e.secret_key for e in picker.known if e.secret_key))

        async def run_one(task: Task) -> RolloutResult:
            started_at = time.time()
            pick = picker.acquire(task)
            try:
                result = await self.rollout(task, pick.endpoint, sampling_args, timeout, replicas)
            finally:
                pick.release()
            if picker.replicas is not None:
                for label in result.failed_over:
                    where = result.worker or "a worker"
                    picker.replicas.report_down(label, f"a call on {where} moved off it", seen_at=started_at)
            return result

        judged = False
        count = 0
        try:
            await self.astart()
            judged = any((seat.info or {}).get("judges") for seat in self._seats)
            async with contextlib.aclosing(stream_rollouts(tasks, run_one, concurrency)) as stream:
                async for result in stream:
                    count += 1
                    if judged and count % JUDGE_COLLECT_EVERY == 0:
                        await self._collect_judge_calls()  # the workers' judge routes keep only the latest
                    yield result
        finally:
            picker.close()
            await self._collect_judge_calls()

    async def gym_metrics(self, entries: Mapping[tuple[str, str | None], list[dict[str, Any]]]) -> dict[str, Any]:
        """Gym's own metrics (``/aggregate_metrics``) of verify responses by (environment, agent), each environment's
        asked of one live worker of it: ``{env: {agent: answer}}`` (``_eval/gym_metrics.py``)."""
        by_env: dict[str, dict[str | None, list[dict[str, Any]]]] = {}
        for (env, agent), rows in entries.items():
            by_env.setdefault(env, {})[agent] = rows
        answers: dict[str, Any] = {}
        for env, agents in by_env.items():
            for seat in (s for s in self._seats if s.alive and s.handle.env == env):
                try:
                    answer = await seat.handle.gym_metrics(agents)
                except WorkerLost:
                    continue  # another worker of the environment, if one is left
                if answer:
                    answers[env] = answer
                    break
        return answers

    # -- judges ----------------------------------------------------------------------------------

    async def _collect_judge_calls(self) -> None:
        live = [seat for seat in self._seats if seat.alive and (seat.info or {}).get("judges")]
        batches = await asyncio.gather(*(seat.handle.judge_calls() for seat in live), return_exceptions=True)
        for batch in batches:
            if isinstance(batch, dict):
                for name, calls in batch.items():
                    self._judge_calls.setdefault(name, []).extend(calls)

    def judge_calls(self) -> dict[str, list[Any]]:
        """The judge calls of every worker recorded since the last call (collected when a run ends)."""
        calls, self._judge_calls = self._judge_calls, {}
        return calls

    def judge_label(self, name: str) -> str:
        return self._judge_labels.get(name, name)
