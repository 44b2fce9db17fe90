"""NeMoGymHarness: run tasks as rollouts through a real Gym agent, each policy call on its own route."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._attempts import RolloutAttempts
from ._dispatch import run_batch
from ._endpoint import Endpoint
from ._exceptions import (
    ConfigurationError,
    GymServerDown,
    RolloutError,
    RolloutTimeout,
    StackStartError,
    UpstreamError,
)
from ._gym import POLICY_MODEL, canonical_reference, merged_configs, server_instances
from ._judge.router import JudgeRouter
from ._replicas import Lease, Replicas, ReplicaViews
from ._result import RolloutResult
from ._routing import PolicyCall, ProxyConfig, RoutingProxy, get_proxy
from ._stack import GymStack, acquire_stack, release_stack
from ._stack.agent_client import DEATH_GRACE_S, GymAgentClient
from ._stack.options import DEFAULT_MAX_STEPS, StackOptions
from ._stack.plan import refuse_unknown_references
from ._sync import run_blocking
from ._tasks import NeMoGymTaskset, Task, harness_runtime
from ._tasks.recorded import row_fields
from ._upstreams import Upstream

logger = logging.getLogger(__name__)

# Keys Gym accepts inside responses_create_params (nemo-gym rejects any other); sampling args with
# other names (top_k, logprobs, ...) travel on the route and reach the upstream request body.
RESPONSES_SAMPLING_KEYS = frozenset(
    {
        "max_output_tokens",
        "max_tool_calls",
        "parallel_tool_calls",
        "reasoning",
        "temperature",
        "text",
        "tool_choice",
        "top_logprobs",
        "top_p",
        "truncation",
        "service_tier",
    }
)
_SAMPLING_ALIASES = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens"}


def split_sampling_args(sampling_args: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split sampling args into (Responses params for the Gym row, extra body for the upstream)."""
    gym, extra = {}, {}
    for key, value in (sampling_args or {}).items():
        key = _SAMPLING_ALIASES.get(key, key)
        if value is None:
            continue
        (gym if key in RESPONSES_SAMPLING_KEYS else extra)[key] = value
    return gym, extra


class NeMoGymHarness:
    """Runs NeMo Gym tasks as rollouts through the process's shared Gym stack and routing proxy.

    The stack and proxy start on first use and are shared (refcounted) with any other harness of the
    same environment in this process. Use as ``async with`` / ``with``, or call ``close()``.

    Lifecycle: constructing a harness starts nothing (``check()`` refuses now what a start would refuse). The first
    of ``await astart()`` / ``start()``, entering ``async with`` / ``with``, ``rollout`` or ``run`` starts the Gym
    stack (or joins the one this process already runs for the same environment and settings) and the routing proxy;
    later calls reuse them, and a stack whose process died is restarted by the next rollout. ``await aclose()`` /
    ``close()`` (leaving the ``with`` block) releases this harness's share: the last user of a stack stops it,
    bounded; a closed harness refuses further use. The Gym processes go down with this process however it ends
    (their supervisor watches it), so an interrupted program leaves none behind.

    The Gym runtime is ``gym_python`` (an interpreter with nemo-gym), else ``VERIFIERS_NEMO_GYM_PYTHON``, else
    this interpreter when it has nemo-gym, else a managed one of the nemo-gym series ``gym_version`` (``"0.7"``,
    ``"0.4"``; default: the newest an interpreter on this machine runs). Given ``taskset=`` and neither, it runs the
    taskset's (``NeMoGymTaskset(gym_python=, gym_version=)``); naming a release other than the one the taskset read
    its rows from is refused.

    Stacks join the machine's one Ray head for Gym stacks, shared with other processes through leases
    (``shared_ray=True``); pass ``shared_ray=False`` to let each
    stack's ``ng_run`` start a Ray cluster of its own, or ``overrides=["+ray_head_node_address=HOST:PORT"]``
    to join a cluster of yours.

    ``proxy``: a ``RoutingProxy`` of yours (started here, never stopped here), a ``ProxyConfig`` (a proxy of
    this harness's own, stopped on ``close()``), or ``None`` (the process's shared proxy). ``secrets``: values
    Gym processes must never see (the keys of endpoints given before the start are added). ``agent_urls``
    sends the named agents' ``/run`` elsewhere (an agent of yours, a recorder).

    ``judge``: where the environment's judge calls go, one ``Endpoint`` for every judge name or a mapping
    from judge name (``judge_model``, ``genrm_model``, ``policy_model``...) to ``Endpoint`` (``"*"``: the
    rest); see ``JudgeRouter``. A ``policy_model`` judge given none follows the latest rollout's policy.
    ``death_grace``: how long a rollout whose ``/run`` went unanswered waits for the stack's verdict on its
    death (then it probes) before resubmitting after a restart.
    """

    def __init__(
        self,
        nemo_env: str | None = None,
        *,
        taskset: NeMoGymTaskset | None = None,
        config_paths: Sequence[str | Path] | None = None,
        agent: str | None = None,
        gym_python: str | None = None,
        gym_version: str | None = None,
        isolated_venvs: bool = False,
        max_steps: int | None = DEFAULT_MAX_STEPS,
        timeout: float = 600.0,
        start_timeout: float | None = None,
        overrides: Sequence[str] = (),
        shared_ray: bool = True,
        proxy: RoutingProxy | ProxyConfig | None = None,
        secrets: Iterable[str] = (),
        agent_urls: Mapping[str, str] | None = None,
        judge: Endpoint | Mapping[str, Endpoint] | None = None,
        death_grace: float = DEATH_GRACE_S,
    ) -> None:
        if taskset is not None and nemo_env is None:
            nemo_env = taskset.env_name
        gym_python, gym_version = harness_runtime(taskset, gym_python, gym_version)  # the taskset's, if none here
        if nemo_env is None and not config_paths:
            raise ConfigurationError("NeMoGymHarness needs nemo_env=, taskset= or config_paths=.")
        # a folder of yours by its absolute path (what its tasks carry, what Ray workers are sent)
        first_config = Path(str(config_paths[0])).stem if config_paths else ""
        self.env_name = canonical_reference(nemo_env, gym_python, gym_version) if nemo_env else first_config
        self.taskset = taskset
        self.default_agent = agent
        self.timeout = timeout
        self.options = StackOptions(
            gym_python,
            gym_version,
            isolated_venvs,
            max_steps,
            start_timeout,
            tuple(overrides),
            shared_ray,
            tuple(Path(p) for p in config_paths) if config_paths else None,
        )
        """What this harness asks of its stack (runtime, venvs, step bound, Ray, timeouts)."""
        self._proxy_option = proxy
        self._owns_proxy = isinstance(proxy, ProxyConfig)
        self.agents = GymAgentClient(agent_urls=agent_urls, death_grace=death_grace)
        """The HTTP client of the stack's Gym agents (``/run``, retry once after a stack death)."""
        self.judges = JudgeRouter(self.env_name, judge)
        """The environment's judges: where each judge name's calls go, and the calls recorded."""
        self._secrets = {s for s in secrets if s} | self.judges.secrets()
        self._proxy: RoutingProxy | None = None
        self._stack: GymStack | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._external_reported = False
        self._replica_views = ReplicaViews()

    # -- lifecycle -------------------------------------------------------------------------------

    def check(self) -> tuple[str, ...]:
        """Raise now, starting nothing and writing nothing, what ``start()`` would refuse: an unknown
        environment, one scored by a judge model, servers whose packages the Gym runtime lacks.

        Returns why the environment may need an external service (a download, a credential...), for the
        caller to show; ``start()`` then does not log it again."""
        config_paths = self.options.env_config_paths(self.env_name)
        instances = [i for i in server_instances(merged_configs(list(config_paths))) if i.name != POLICY_MODEL]
        refuse_unknown_references(instances, config_paths)  # a typo of a server's name, before anything starts
        external = self.judges.check(config_paths, self.options.root())
        if not self.options.isolated_venvs:
            from ._stack import check_requirements

            server_dirs = dict(self.options.server_dirs(config_paths))
            check_requirements(self.env_name, instances, self.options.runtime(), server_dirs=server_dirs)
        self._external_reported = True
        return external

    def start(self) -> GymStack:
        """Start (or join) the shared proxy and stack; blocking. Safe to call repeatedly."""
        with self._lock:
            if self._closed:
                raise ConfigurationError("This NeMoGymHarness is closed.")
            if self._stack is None:
                config_paths = self.options.env_config_paths(self.env_name)
                external = self.judges.check(config_paths, self.options.root())  # before anything starts
                if not self._external_reported:
                    self._external_reported = True
                    for reason in external:
                        logger.warning("Gym environment %s may need an external service: %s", self.env_name, reason)
                if self._proxy is None:
                    self._proxy = _proxy_for(self._proxy_option)
                launched, placeholders = self.judges.open(self._proxy, config_paths)
                self._stack = acquire_stack(
                    self.options.stack_config(
                        self.env_name, config_paths, launched, placeholders, self._proxy.url, frozenset(self._secrets)
                    )
                )
            stack = self._stack
        stack.ensure_running()
        return stack

    def add_secrets(self, *values: str) -> None:
        """Values (API keys) Gym processes must never see; applies to a stack not yet started."""
        self._secrets.update(v for v in values if v)

    def set_judge(self, judge: Endpoint | Mapping[str, Endpoint] | None) -> None:
        """Replace ``judge=`` (see the class docs); only before the stack starts."""
        with self._lock:
            if self._stack is not None:
                raise ConfigurationError("set_judge() must come before the harness starts.")
            self.judges.replace(judge)
            self._secrets |= self.judges.secrets()

    def judge_label(self, name: str) -> str:
        """Where the judge ``name``'s calls go, in words (for summaries)."""
        return self.judges.label(name)

    def judge_calls(self) -> dict[str, list[PolicyCall]]:
        """Judge calls recorded since the last call of this method, by judge name (taken, not copied)."""
        return self.judges.take_calls()

    async def astart(self) -> GymStack:
        """``start()`` from async code (in a thread: a first start takes seconds)."""
        return await asyncio.to_thread(self.start)

    @property
    def gym_version(self) -> str | None:
        """The nemo-gym release of the running stack's Gym runtime (None before it starts)."""
        runtime = self._stack.runtime if self._stack is not None else None
        return runtime.nemo_gym_version if runtime is not None else None

    @property
    def started(self) -> bool:
        """Whether ``start()`` got as far as taking a routing proxy or a stack (a refusal starts neither)."""
        return self._stack is not None or self._proxy is not None

    @property
    def stack(self) -> GymStack:
        if self._stack is None:
            raise ConfigurationError("The harness has not started; call start() or run a rollout first.")
        return self._stack

    @property
    def proxy(self) -> RoutingProxy:
        if self._proxy is None:
            raise ConfigurationError("The harness has not started; call start() or run a rollout first.")
        return self._proxy

    def close(self) -> None:
        """Release the shared stack and proxy (the last user stops them). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            stack, proxy = self._stack, self._proxy
            self._stack = self._proxy = None
        self.judges.close()
        self.agents.close()
        self._replica_views.close()
        if stack is not None:
            release_stack(stack)
        if proxy is not None and self._owns_proxy:  # else it outlives this harness (the shared one lives until exit)
            proxy.stop()

    async def aclose(self) -> None:
        """``close()`` from async code, after closing the HTTP session the agents' ``/run`` calls use."""
        await self.agents.close_session()
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> NeMoGymHarness:
        await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> NeMoGymHarness:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rollouts --------------------------------------------------------------------------------

    async def rollout(
        self,
        task: Task,
        endpoint: Endpoint,
        sampling_args: dict[str, Any] | None = None,
        timeout: float | None = None,
        *,
        upstream: Upstream | None = None,
        replicas: Replicas | Sequence[Endpoint] | None = None,
        _queued_at: float | None = None,
        _lease: Lease | None = None,
    ) -> RolloutResult:
        """Run one task as one rollout against ``endpoint``. Never raises for a rollout failure:
        the result carries a typed ``error`` instead (and no reward).

        ``upstream`` replaces how this rollout's policy calls reach ``endpoint`` (by default the
        proxy's upstream for ``endpoint.api``), e.g. ``FunctionUpstream(fn)`` to answer with a plain
        function. ``replicas``: other endpoints serving the same model (a ``Replicas``, or a list: this
        harness keeps one health view per list); when ``endpoint`` does not connect or times out, the call and
        the rollout's later calls move to a live one (``result.failed_over`` names the ones left)."""
        if _lease is None and replicas is not None:
            _lease = self._replica_views.view(replicas).acquire(prefer=endpoint)
            try:
                return await self.rollout(
                    task, endpoint, sampling_args, timeout, upstream=upstream, _queued_at=_queued_at, _lease=_lease
                )
            finally:
                _lease.release()
        if _lease is not None:
            endpoint = _lease.endpoint
        started = time.monotonic()
        result = RolloutResult(
            task_index=task.task_index,
            rollout_index=task.rollout_index,
            example_id=task.example_id,
            env=task.env or self.env_name,
            agent=task.agent_name or self.default_agent,
            endpoint=endpoint.label,
            prompt=list(task.prompt),
            row_fields=row_fields(task.row),
        )
        result.timing["queue_s"] = started - _queued_at if _queued_at is not None else 0.0
        self.add_secrets(endpoint.secret_key or "")  # before a first start: Gym never sees it
        try:
            await self._running_stack()
        except RolloutError as exc:
            result.error = exc
            return result
        self.judges.follow_policy(endpoint, upstream)
        attempts = RolloutAttempts(
            self.proxy, endpoint, task.gym_row(), *split_sampling_args(sampling_args), upstream, _lease
        )
        try:
            limit = self.timeout if timeout is None else timeout
            run_started = time.monotonic()
            try:
                gym_result = await asyncio.wait_for(
                    self.agents.run_episode(self._running_stack, result.agent, attempts), timeout=limit
                )
            except TimeoutError:
                result.error = RolloutTimeout(f"rollout did not finish within {limit:g}s")
                gym_result = None
            except RolloutError as exc:
                result.error = attempts.error(exc)
                gym_result = None
            result.timing["rollout_s"] = time.monotonic() - run_started
        finally:
            attempts.close()
        attempts.fill(result, gym_result)
        result.timing["total_s"] = time.monotonic() - (_queued_at or started)
        return result

    async def _running_stack(self) -> GymStack:
        """The running stack, restarted if it died; a failed restart is the rollout's typed ``GymServerDown``."""
        stack = self._stack
        if stack is not None and stack.running:
            return stack
        if stack is None or stack.generation == 0:
            return await self.astart()
        try:
            await asyncio.to_thread(stack.start, time.monotonic())
        except StackStartError as exc:
            raise GymServerDown(f"the Gym stack is down and could not be restarted: {exc}") from None
        return stack

    async def run(
        self,
        tasks: Iterable[Task],
        endpoints: Endpoint | Sequence[Endpoint] | Replicas | Callable[[Task], Endpoint],
        *,
        concurrency: int = 32,
        sampling_args: dict[str, Any] | None = None,
        timeout: float | None = None,
        upstream: Upstream | None = None,
    ) -> AsyncIterator[RolloutResult]:
        """Run ``tasks`` with at most ``concurrency`` at once; yield results as they finish.

        ``endpoints`` is one endpoint, a list of replicas of one model or a ``Replicas`` (each rollout goes to
        the live one with the fewest rollouts in flight; a replica that does not connect leaves the rotation
        and its calls move to a live one, see ``Replicas``), or a function of the task.
        """
        stream = run_batch(
            self, tasks, endpoints, concurrency=concurrency, sampling_args=sampling_args, timeout=timeout,
            upstream=upstream,
        )  # fmt: skip
        async with contextlib.aclosing(stream):
            async for result in stream:
                yield result

    def run_sync(
        self,
        tasks: Iterable[Task],
        endpoints: Endpoint | Sequence[Endpoint] | Replicas | Callable[[Task], Endpoint],
        **kwargs: Any,
    ) -> list[RolloutResult]:
        """Blocking form of ``run`` for synchronous callers: all results, in completion order.

        Called where an event loop already runs in this thread (a Jupyter cell, an async function),
        it runs the rollouts on a loop of its own in a worker thread and blocks until they are done;
        in async code, ``async for result in harness.run(...)`` does not block the loop."""

        async def collect() -> list[RolloutResult]:
            try:
                return [r async for r in self.run(tasks, endpoints, **kwargs)]
            finally:
                await self.agents.close_session()

        return run_blocking(collect, name=f"run_sync-{self.env_name}")


def _proxy_for(option: RoutingProxy | ProxyConfig | None) -> RoutingProxy:
    """The routing proxy of ``proxy=``: yours (started), one of this config's, or the process's shared one."""
    if isinstance(option, RoutingProxy):
        return option.start()
    if isinstance(option, ProxyConfig):
        return RoutingProxy(option).start()
    return get_proxy()  # one per process, lives until exit


__all__ = ["NeMoGymHarness", "RolloutResult", "UpstreamError", "split_sampling_args"]
