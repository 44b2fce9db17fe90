"""Gym stacks on a Ray cluster: start or join it, place one actor per stack, and talk to the actors.

Each actor is a ``StackWorker`` (one Gym stack and routing proxy), placed node by node (round-robin over
the cluster's live nodes, pinned softly so that a full node spills over). The Gym processes of an actor
run under our supervisor, which reads a pipe from the actor: when Ray kills the actor (``ray.kill``,
its node dying, the driver's job ending) the pipe closes and the supervisor takes every Gym process of
that stack down, so no Gym process outlives its actor. The supervisor also unblocks SIGINT, which Ray
workers block and their children inherit.

An actor's stack keeps a Ray head of its own (as every harness process does): Gym's servers are Ray
drivers, and a head private to the actor's stack keeps them out of the user's cluster (and of its Ray
version, which need not be the Gym runtime's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._exceptions import ConfigurationError, RolloutError, VerifiersNemoError, WorkerLost
from .._result import RolloutResult
from .._stack.procs import sweep_dead_owners
from .._tasks import Task
from .worker import RolloutCall

logger = logging.getLogger(__name__)

LOCAL = "local"
"""``ray=`` value (``--ray`` with no address): start a Ray cluster on this machine for the run."""
ACTOR_CONCURRENCY = 10_000
"""Calls an actor runs at once (its rollouts are coroutines); the pool bounds them, not Ray."""
_STOP_TIMEOUT_S = 60.0
TEMP_PREFIX = "vnr-rl-"
"""A local cluster's folder, ``<tmp>/vnr-rl-<owner pid>-<random>``: short (Ray's socket paths live under it)."""
_QUIET = {"log_to_driver": False, "logging_level": logging.ERROR}
"""Ray's own messages stay out of the eval's output (actors' logs stay in Ray's session folder)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigurationError(
            "--ray needs Ray in this environment: pip install 'verifiers-nemo[ray]' (the same Ray version on "
            "every node of the cluster)."
        ) from None
    return ray


class RayWorker:
    """The handle of one ``StackWorker`` actor."""

    def __init__(self, actor: Any, env: str, node_id: str) -> None:
        self.actor = actor
        self.env = env
        self.node_id = node_id
        self.label = f"Ray actor on node {node_id[:8]}"
        self.name = f"ray:{node_id[:8]}"

    async def start(self, secrets: Sequence[str], replay_tasks: Sequence[Task] | None) -> dict[str, Any]:
        ray = _ray()
        try:
            info = await self.actor.start.remote(list(secrets), None if replay_tasks is None else list(replay_tasks))
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause  # e.g. a judge env given no judge: the same error as without Ray
            raise (cause if isinstance(cause, VerifiersNemoError) else exc) from None
        self.name = f"ray:{self.node_id[:8]}:{info['pid']}"
        return {**info, "node_id": self.node_id}

    async def rollout(self, call: RolloutCall) -> RolloutResult:
        ray = _ray()
        try:
            result = await self.actor.rollout.remote(call)
        except ray.exceptions.RayActorError as exc:
            raise WorkerLost(f"the {self.label} died during the rollout: {_first_line(exc)}") from None
        except ray.exceptions.RayError as exc:  # the rollout raised in the actor: not expected, but typed
            task = call.task
            result = RolloutResult(task_index=task.task_index, rollout_index=task.rollout_index, env=self.env)
            result.error = RolloutError(f"the {self.label} failed the rollout: {_first_line(exc)}")
        result.worker = self.name
        return result

    async def judge_calls(self) -> dict[str, list[Any]]:
        ray = _ray()
        try:
            return await self.actor.judge_calls.remote()
        except ray.exceptions.RayActorError:
            return {}

    async def gym_metrics(self, entries: dict[str | None, list[dict[str, Any]]]) -> dict[str, Any]:
        """Its environment's metrics, asked of its stack (``StackWorker.gym_metrics``); ``WorkerLost`` when it died."""
        ray = _ray()
        try:
            return await self.actor.gym_metrics.remote(entries)
        except ray.exceptions.RayActorError as exc:
            raise WorkerLost(f"the {self.label} died: {_first_line(exc)}") from None

    async def gym_sessions(self) -> list[int]:
        return await self.actor.gym_sessions.remote()

    async def stop(self) -> None:
        """Stop its stack (bounded), then the actor. Idempotent."""
        ray = _ray()
        try:
            await asyncio.wait_for(self.actor.stop.remote(), timeout=_STOP_TIMEOUT_S)
        except (ray.exceptions.RayActorError, TimeoutError):
            pass  # gone already, or stuck: killing the actor closes its supervisors' pipes
        finally:
            ray.kill(self.actor, no_restart=True)


@dataclass
class RayPlacement:
    """Where a run's actors go: how many per environment, and what each reserves."""

    workers: int | Mapping[str, int] | None = None
    """Actors per environment (one count for all, or by environment name). ``None``: by the CPU budget
    when ``cpus_per_stack`` is given (the cluster's CPUs / ``cpus_per_stack``, shared by the
    environments), else one per live node."""
    cpus_per_stack: float | None = None
    """CPUs each actor reserves (Ray's ``num_cpus``): how Ray packs stacks onto nodes; ``None``: 1."""
    actor_options: Mapping[str, Any] | None = None
    """More ``.options()`` for every actor (``runtime_env``, ``resources``...)."""

    def count(self, env: str, nodes: Sequence[Mapping[str, Any]], envs: int = 1) -> int:
        """How many actors ``env`` gets on a cluster of these live ``nodes``, shared by ``envs`` environments."""
        workers = self.workers.get(env) if isinstance(self.workers, Mapping) else self.workers
        if workers is None and self.cpus_per_stack:
            cpus = sum(float((node.get("Resources") or {}).get("CPU", 0)) for node in nodes)
            workers = max(1, int(cpus // self.cpus_per_stack) // max(1, envs))
        count = len(nodes) if workers is None else workers
        if not isinstance(count, int) or count < 1:
            raise ConfigurationError(f"workers of {env!r} must be a positive integer, not {count!r}.")
        return count


class RayCluster:
    """The run's connection to Ray: started here (``ray="local"``), joined (an address) or the one this
    process is already connected to. ``close()`` kills this run's actors and leaves a cluster it found
    as it was (it shuts down only a cluster it started)."""

    def __init__(self, address: str | bool | None) -> None:
        ray = _ray()
        self._initialized_here = False
        self._temp_dir: Path | None = None
        if not ray.is_initialized():
            if address in (None, True, LOCAL, ""):
                # A cluster of the run's own: its files in a private folder removed at close (not the
                # machine-wide /tmp/ray); address="local": new even where RAY_ADDRESS names one.
                sweep_dead_owners(Path(tempfile.gettempdir()), prefix=TEMP_PREFIX)  # those of killed runs
                self._temp_dir = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
                ray.init(
                    address="local",
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    _temp_dir=str(self._temp_dir),
                    **_QUIET,
                )
            else:
                ray.init(address=str(address), **_QUIET)
            self._initialized_here = True
        self.address = ray.get_runtime_context().gcs_address
        self.workers: list[RayWorker] = []

    @staticmethod
    def live_nodes() -> list[dict[str, Any]]:
        return [node for node in _ray().nodes() if node.get("Alive")]

    def place(self, envs: Mapping[str, dict[str, Any]], placement: RayPlacement) -> list[RayWorker]:
        """Create the actors: ``placement.count`` per environment, node by node round-robin. They start
        nothing until ``start``."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from .worker import StackWorker

        ray = _ray()
        live = self.live_nodes()
        nodes = [node["NodeID"] for node in live]
        if not nodes:
            raise ConfigurationError(f"the Ray cluster at {self.address} has no live node.")
        remote = ray.remote(StackWorker)
        turn = 0
        for env, harness_args in envs.items():
            for _ in range(placement.count(env, live, len(envs))):
                node = nodes[turn % len(nodes)]
                turn += 1
                options = {
                    "num_cpus": placement.cpus_per_stack or 1.0,
                    "max_concurrency": ACTOR_CONCURRENCY,
                    "max_restarts": 0,
                    "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=True),
                    **dict(placement.actor_options or {}),
                }
                options["runtime_env"] = with_driver_settings(options.get("runtime_env"))
                actor = remote.options(**options).remote(env, harness_args)
                self.workers.append(RayWorker(actor, env, node))
        return self.workers

    async def close(self) -> None:
        """Kill every actor of this run (``RayWorker.stop`` stops each one's stack first), then disconnect
        if this run connected."""
        ray = _ray()
        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(worker.actor, no_restart=True)
        self.workers.clear()
        if self._initialized_here:
            _ray().shutdown()
            self._initialized_here = False
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None


DRIVER_SETTINGS = ("VERIFIERS_NEMO_OFFLINE_DIR", "VERIFIERS_NEMO_START_TIMEOUT", "VERIFIERS_NEMO_WARM_START")
"""The variables set where the run starts that its actors take too (a node's own shell may lack them)."""


def with_driver_settings(runtime_env: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``runtime_env`` with this process's ``DRIVER_SETTINGS`` among its ``env_vars`` (a value the user's own
    runtime_env sets wins): the actors of a cluster started without them install from the same offline folder,
    and start their stacks under the same limit and warm-start setting. An offline folder must be at that path on
    every node (a shared filesystem)."""
    settings = {name: os.environ[name] for name in DRIVER_SETTINGS if os.environ.get(name)}
    if not settings:
        return dict(runtime_env) if runtime_env is not None else None
    merged = dict(runtime_env or {})
    merged["env_vars"] = {**settings, **dict(merged.get("env_vars") or {})}
    return merged


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
