"""NeMoGymHarness: run tasks as rollouts through a real Gym agent, each policy call on its own route."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from ._dispatch import EndpointPicker, check_concurrency, stream_rollouts
from ._endpoint import Endpoint
from ._exceptions import (
    ConfigurationError,
    GymAgentError,
    GymServerDown,
    InvalidResult,
    RolloutError,
    RolloutTimeout,
    UpstreamError,
)
from ._gym import POLICY_MODEL, merged_configs, server_instances
from ._judge import NO_POLICY_YET, NO_POLICY_YET_UPSTREAM, JudgeEndpoints
from ._protocol import output_to_messages
from ._result import (
    RolloutResult,
    extract_metrics,
    parse_reward,
    strip_route,
    sum_usage,
)
from ._routing import ROUTE_METADATA_KEY, PolicyCall, ProxyConfig, RoutingProxy, get_proxy
from ._stack import GymStack, StackConfig, acquire_stack, release_stack
from ._tasks import NeMoGymTaskset, Task
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
DEFAULT_MAX_STEPS = 100
# Connections the harness opens to one Gym agent at most (Gym's own client default per host,
# ``global_aiohttp_connector_limit_per_host``). Rollouts beyond it wait here, route open, as in
# ng_collect_rollouts; without a cap, thousands of connects at once overflow the agent's listen queue
# (uvicorn's backlog is 2,048) and the kernel drops them.
AGENT_CONNECTIONS = 1024
# How long a request in flight when its stack died may take to fail by itself (see _post_run).
DEATH_GRACE_S = 2.0
_STEP_BOUNDED_AGENTS = frozenset({"simple_agent"})  # agents whose config has max_steps


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

    Stacks join the process's one Ray head (``shared_ray=True``); pass ``shared_ray=False`` to let each
    stack's ``ng_run`` start a Ray cluster of its own, or ``overrides=["+ray_head_node_address=HOST:PORT"]``
    to join a cluster of yours.

    ``proxy`` is the routing proxy its Gym agents call: a ``RoutingProxy`` of yours (started here if it
    is not, never stopped here), a ``ProxyConfig`` (a proxy of this harness's own, stopped on
    ``close()``), or ``None`` for the process's shared default proxy. ``secrets`` are values Gym
    processes must never see in their environment; the API keys of the endpoints this harness is given
    before its stack starts are added to them. ``agent_urls`` sends the ``/run`` of the named Gym agents
    to another address (e.g. a Gym agent you run yourself, or a recorder in front of the stack's).

    ``judge`` is where the environment's judge calls go (its resources server calling a model while
    scoring): one ``Endpoint`` for every judge name of the environment, or a mapping from judge name (as
    the Gym config names it: ``judge_model``, ``genrm_model``, ``policy_model``...) to ``Endpoint``, with
    ``"*"`` for the rest. Judge calls reach the judge through a port of the routing proxy of their own,
    never the policy's route, and the judge's key never reaches a Gym process. An environment whose
    judge is ``policy_model`` and that is given no judge sends its judge calls to the policy endpoint of
    the latest rollout. ``judge_calls()`` returns the judge calls recorded since it was last called.
    """

    def __init__(
        self,
        nemo_env: str | None = None,
        *,
        taskset: NeMoGymTaskset | None = None,
        config_paths: Sequence[str | Path] | None = None,
        agent: str | None = None,
        gym_python: str | None = None,
        isolated_venvs: bool = False,
        max_steps: int | None = DEFAULT_MAX_STEPS,
        timeout: float = 600.0,
        start_timeout: float = 300.0,
        overrides: Sequence[str] = (),
        shared_ray: bool = True,
        proxy: RoutingProxy | ProxyConfig | None = None,
        secrets: Iterable[str] = (),
        agent_urls: Mapping[str, str] | None = None,
        judge: Endpoint | Mapping[str, Endpoint] | None = None,
    ) -> None:
        if taskset is not None and nemo_env is None:
            nemo_env = taskset.env_name
        if nemo_env is None and not config_paths:
            raise ConfigurationError("NeMoGymHarness needs nemo_env=, taskset= or config_paths=.")
        self.env_name = nemo_env or Path(str(config_paths[0])).stem  # type: ignore[index]
        self.taskset = taskset
        self.default_agent = agent
        self.timeout = timeout
        self._gym_python = gym_python
        self._isolated_venvs = isolated_venvs
        self._max_steps = max_steps
        self._start_timeout = start_timeout
        self._extra_overrides = tuple(overrides)
        self._shared_ray = shared_ray
        self._config_paths = tuple(Path(p) for p in config_paths) if config_paths else None
        self._proxy_option = proxy
        self._owns_proxy = isinstance(proxy, ProxyConfig)
        self._secrets = {s for s in secrets if s}
        self._agent_urls = {name: url.rstrip("/") for name, url in (agent_urls or {}).items()}
        self._judges = JudgeEndpoints.of(judge)
        self._secrets |= self._judges.secrets()
        self._judge_routes: dict[str, Any] = {}
        self._policy_judge: Any = None
        self._proxy: RoutingProxy | None = None
        self._stack: GymStack | None = None
        self._lock = threading.Lock()
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._closed = False
        self._external_reported = False

    # -- lifecycle -------------------------------------------------------------------------------

    def _resolve_config_paths(self) -> tuple[Path, ...]:
        if self._config_paths:
            return self._config_paths
        from ._gym import get_environment

        env = get_environment(self.env_name, root=self._gym_root())
        if env.default_config is None:
            raise ConfigurationError(f"Gym environment {self.env_name} has no config file.")
        return (env.default_config.path,)

    def _gym_root(self) -> Path:
        from ._gym import gym_root

        return gym_root(self._gym_python)

    def check(self) -> tuple[str, ...]:
        """Raise now, starting nothing and writing nothing, what ``start()`` would refuse: an unknown
        environment, one scored by a judge model, servers whose packages the Gym runtime lacks.

        Returns why the environment may need an external service (a download, a credential...), for the
        caller to show; ``start()`` then does not log it again."""
        config_paths = self._resolve_config_paths()
        external = self._check_judges(config_paths)
        if not self._isolated_venvs:
            from ._gym import find_gym_runtime
            from ._stack import check_requirements

            instances = [i for i in server_instances(merged_configs(list(config_paths))) if i.name != POLICY_MODEL]
            check_requirements(self.env_name, instances, find_gym_runtime(self._gym_python))
        self._external_reported = True
        return external

    def start(self) -> GymStack:
        """Start (or join) the shared proxy and stack; blocking. Safe to call repeatedly."""
        with self._lock:
            if self._closed:
                raise ConfigurationError("This NeMoGymHarness is closed.")
            if self._stack is None:
                config_paths = self._resolve_config_paths()
                external = self._check_judges(config_paths)  # before the proxy or anything else starts
                if not self._external_reported:
                    self._external_reported = True
                    for reason in external:
                        logger.warning("Gym environment %s may need an external service: %s", self.env_name, reason)
            if self._proxy is None:
                self._proxy = self._make_proxy()
            if self._stack is None:
                launched_paths, placeholders = self._route_judges(config_paths)
                config = StackConfig(
                    name=self.env_name,
                    config_paths=launched_paths,
                    model_placeholders=placeholders,
                    policy_url=self._proxy.url,
                    overrides=(*self._step_bound_overrides(config_paths), *self._extra_overrides),
                    gym_python=self._gym_python,
                    isolated_venvs=self._isolated_venvs,
                    shared_ray=self._shared_ray,
                    start_timeout=self._start_timeout,
                    secrets=frozenset(self._secrets),
                )
                stack = acquire_stack(config)
                self._stack = stack
            stack = self._stack
        stack.ensure_running()
        return stack

    def _make_proxy(self) -> RoutingProxy:
        option = self._proxy_option
        if isinstance(option, RoutingProxy):
            return option.start()
        if isinstance(option, ProxyConfig):
            return RoutingProxy(option).start()
        return get_proxy()  # one per process, lives until exit

    def add_secrets(self, *values: str) -> None:
        """Values (API keys) Gym processes must never see; applies to a stack not yet started."""
        self._secrets.update(v for v in values if v)

    def _remember_key(self, endpoint: Endpoint) -> None:
        if self._stack is None and endpoint.secret_key is not None:
            self._secrets.add(endpoint.secret_key)

    def _check_judges(self, config_paths: tuple[Path, ...]) -> tuple[str, ...]:
        """Refuse, before anything starts, an environment whose judge this harness was not given (a
        ``policy_model`` judge defaults to the policy) or that calls a judge URL itself. (The rule lives in
        ``classify_config``.) Returns why the environment may need an external service."""
        from ._gym import classify_config

        judges, external = classify_config(merged_configs(list(config_paths)), self._gym_root())
        direct = [j for j in judges if j.startswith("${")]
        if direct:
            raise ConfigurationError(
                f"Gym environment {self.env_name} calls its judge at {', '.join(direct)} itself (not through "
                "a Gym model server), so its calls cannot be routed; it is not supported."
            )
        missing = [j for j in judges if j != POLICY_MODEL and self._judges.for_name(j) is None]
        if missing:
            raise ConfigurationError(
                f"Gym environment {self.env_name} scores with a judge model ({', '.join(missing)}) and no "
                "judge endpoint was given. Pass --judge-base-url URL --judge-model MODEL "
                "[--judge-api-key-var VAR] (CLI), or judge=Endpoint(...) (Python); a mapping "
                "{name: Endpoint} (CLI: --judge NAME=URL,MODEL) gives each judge name its own."
            )
        return tuple(external)

    def _route_judges(self, config_paths: tuple[Path, ...]) -> tuple[tuple[Path, ...], tuple[tuple[str, str], ...]]:
        """Open a judge route on the proxy for each judge name and rewrite the configs to call them:
        ``(configs to launch, (placeholder, URL) pairs)``."""
        from ._gym import cache_dir
        from ._gym.judges import plan_judges

        plan = plan_judges(config_paths, cache_dir() / "judge-configs")
        placeholders = []
        for target in plan.targets:
            endpoint = self._judges.for_name(target)
            if endpoint is None:  # a policy_model judge with no judge given: it follows the policy
                route = self.proxy.open_judge_route(NO_POLICY_YET, upstream=NO_POLICY_YET_UPSTREAM)
                self._policy_judge = route
            else:
                route = self.proxy.open_judge_route(endpoint)
            self._judge_routes[target] = route
            placeholders.append((plan.placeholders[target], route.url))
        if plan.targets:
            logger.info(
                "Gym environment %s: judge calls go to %s",
                self.env_name,
                ", ".join(f"{t} → {self.judge_label(t)}" for t in plan.targets),
            )
        return plan.config_paths, tuple(placeholders)

    def set_judge(self, judge: Endpoint | Mapping[str, Endpoint] | None) -> None:
        """Replace ``judge=`` (see the class docs); only before the stack starts."""
        with self._lock:
            if self._stack is not None:
                raise ConfigurationError("set_judge() must come before the harness starts.")
            self._judges = JudgeEndpoints.of(judge)
            self._secrets |= self._judges.secrets()

    @property
    def has_judge(self) -> bool:
        """Whether a judge endpoint was given."""
        return bool(self._judges)

    def judge_label(self, name: str) -> str:
        """Where the judge ``name``'s calls go, in words (for summaries)."""
        endpoint = self._judges.for_name(name)
        if endpoint is not None:
            return endpoint.label
        return "the policy endpoint (no judge given)" if name == POLICY_MODEL else "nowhere (no judge given)"

    @property
    def judge_names(self) -> tuple[str, ...]:
        """The judge names of the running stack's environment (empty before start or without judges)."""
        return tuple(self._judge_routes)

    def judge_calls(self) -> dict[str, list[PolicyCall]]:
        """Judge calls recorded since the last call of this method, by judge name (taken, not copied)."""
        return {name: route.take_calls() for name, route in self._judge_routes.items()}

    def _step_bound_overrides(self, config_paths: tuple[Path, ...]) -> list[str]:
        """Bound the steps of simple agents that set no bound (nemo-gym's default is unbounded)."""
        if self._max_steps is None:
            return []
        overrides = []
        for instance in server_instances(merged_configs(list(config_paths))):
            if instance.implementation in _STEP_BOUNDED_AGENTS and not instance.config.get("max_steps"):
                overrides.append(f"++{instance.override_prefix}.max_steps={int(self._max_steps)}")
        return overrides

    async def astart(self) -> GymStack:
        return await asyncio.to_thread(self.start)

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
            sessions, self._sessions = self._sessions, {}
            judge_routes, self._judge_routes = self._judge_routes, {}
        for judge_route in judge_routes.values():
            judge_route.close()
        for loop, session in sessions.items():
            if session.closed or loop.is_closed():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                loop.create_task(session.close())
            elif not loop.is_running():
                loop.run_until_complete(session.close())
        if stack is not None:
            release_stack(stack)
        if proxy is not None and self._owns_proxy:
            proxy.stop()
        # otherwise the proxy outlives this harness (the shared one lives until exit; yours is yours)

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()
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

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=AGENT_CONNECTIONS, force_close=False),
                timeout=aiohttp.ClientTimeout(total=None),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            self._sessions[loop] = session
        return session

    async def rollout(
        self,
        task: Task,
        endpoint: Endpoint,
        sampling_args: dict[str, Any] | None = None,
        timeout: float | None = None,
        *,
        upstream: Upstream | None = None,
        _queued_at: float | None = None,
    ) -> RolloutResult:
        """Run one task as one rollout against ``endpoint``. Never raises for a rollout failure:
        the result carries a typed ``error`` instead (and no reward).

        ``upstream`` replaces how this rollout's policy calls reach ``endpoint`` (by default the
        proxy's upstream for ``endpoint.api``), e.g. ``FunctionUpstream(fn)`` to answer with a plain
        function."""
        started = time.monotonic()
        result = RolloutResult(
            task_index=task.task_index,
            rollout_index=task.rollout_index,
            example_id=task.example_id,
            env=task.env or self.env_name,
            agent=task.agent_name or self.default_agent,
            endpoint=endpoint.label,
            prompt=list(task.prompt),
        )
        result.timing["queue_s"] = started - _queued_at if _queued_at is not None else 0.0
        self._remember_key(endpoint)
        try:
            await self._running_stack()
        except RolloutError as exc:
            result.error = exc
            return result
        if self._policy_judge is not None and self._policy_judge.endpoint is not endpoint:
            self._policy_judge.retarget(endpoint, upstream)
        gym_args, extra_args = split_sampling_args(sampling_args)
        routes: list[Any] = []  # one route per attempt: a retry never shares a trace with a dead attempt

        def open_route() -> Any:
            routes.append(self.proxy.open_route(endpoint, sampling_args=extra_args or None, upstream=upstream))
            return routes[-1]

        row = task.gym_row()
        try:
            limit = self.timeout if timeout is None else timeout
            run_started = time.monotonic()
            try:
                gym_result = await asyncio.wait_for(
                    self._run_on_stack(result.agent, row, gym_args, open_route), timeout=limit
                )
            except TimeoutError:
                result.error = RolloutTimeout(f"rollout did not finish within {limit:g}s")
                gym_result = None
            except RolloutError as exc:
                result.error = routes[-1].error if routes and routes[-1].error is not None else exc
                gym_result = None
            result.timing["rollout_s"] = time.monotonic() - run_started
        finally:
            for attempt_route in routes:
                attempt_route.close()  # an orphaned agent's later calls are refused from now on
        if not routes:  # the stack could not be reached before any attempt
            result.timing["total_s"] = time.monotonic() - (_queued_at or started)
            return result
        route = routes[-1]
        result.trace = list(route.calls)
        result.timing["policy_s"] = sum(getattr(c, "latency_s", 0.0) or 0.0 for c in result.trace)
        result.usage = sum_usage([getattr(c, "usage", None) for c in result.trace])
        if gym_result is not None:
            self._map_result(result, gym_result, route.key, endpoint.model)
        result.timing["total_s"] = time.monotonic() - (_queued_at or started)
        return result

    async def _running_stack(self) -> GymStack:
        stack = self._stack
        if stack is not None and stack.running:
            return stack
        return await self.astart()

    async def _run_on_stack(
        self, agent: str | None, row: dict[str, Any], gym_args: dict[str, Any], open_route: Callable[[], Any]
    ) -> dict[str, Any]:
        """POST the row to the agent's ``/run`` on a new route.

        When the agent does not answer (the connection is refused or dropped), the stack is checked
        (``_died``); if it is dead it is restarted and the row resubmitted once, on a fresh route, so the
        result's trace is that of one attempt only."""
        for attempt in range(2):
            stack = await self._running_stack()
            generation = stack.generation
            try:
                url = self._agent_urls.get(agent or "") or stack.agent_url(agent)
            except ConfigurationError as exc:
                raise GymAgentError(str(exc)) from None
            url += "/run"
            route = open_route()
            try:
                return await self._post_run(url, _row_for_route(row, route.key, gym_args), stack, generation)
            except _NotDelivered as exc:
                route.close()
                if attempt == 1 or not await self._died(stack, generation):
                    raise GymServerDown(f"the Gym agent at {url} is unreachable: {exc}") from None
        raise AssertionError("unreachable")

    @staticmethod
    async def _died(stack: GymStack, generation: int) -> bool:
        """Whether ``generation`` died, for a caller whose request the agent did not answer.

        The monitor sees a process exit within milliseconds, but the client can see the broken
        connection first (the kernel resets a dead process's sockets as it exits): wait up to
        ``DEATH_GRACE_S`` for the monitor's verdict, then probe the servers ourselves."""
        death = stack.death_future(generation)  # shared by every rollout of the generation: never cancelled
        await asyncio.wait({death}, timeout=DEATH_GRACE_S)
        if death.done():
            return True
        return not await asyncio.to_thread(stack.probe_now, generation)

    async def _post_run(self, url: str, body: dict[str, Any], stack: GymStack, generation: int) -> dict[str, Any]:
        session = self._session()
        death = stack.death_future(generation)
        request = asyncio.ensure_future(session.post(url, json=body))
        try:
            await asyncio.wait({request, death}, return_when=asyncio.FIRST_COMPLETED)
            if not request.done():
                # Deaths are seen from process exit within milliseconds, often before this request
                # fails. A request to a dead process fails at once (the kernel closed its sockets):
                # wait for that, so a /run that never reached the agent is resubmitted after the restart.
                await asyncio.wait({request}, timeout=DEATH_GRACE_S)
            if not request.done():
                raise GymServerDown(f"the Gym stack died during the rollout: {death.result()}")
            try:
                response = request.result()
            except aiohttp.ClientConnectorError as exc:
                raise _NotDelivered(repr(exc)) from exc
            except aiohttp.ClientConnectionError as exc:
                raise _NotDelivered(repr(exc), dropped=True) from exc
            async with response:
                text = await response.text()
                if response.status != 200:
                    if stack.is_dead(generation):
                        raise GymServerDown(f"the Gym stack died during the rollout: {stack.dead_reason}")
                    raise GymAgentError(f"Gym agent answered {response.status}: {_clip(text)}")
                try:
                    return await asyncio.to_thread(_loads, text) if len(text) > 1 << 20 else _loads(text)
                except ValueError as exc:
                    raise InvalidResult(f"Gym agent answered invalid JSON: {text[:500]!r}") from exc
        finally:
            if not request.done():
                request.cancel()

    def _map_result(self, result: RolloutResult, gym_result: dict[str, Any], key: str, model: str) -> None:
        if not isinstance(gym_result, dict):
            result.error = InvalidResult(f"Gym result is a {type(gym_result).__name__}, not an object")
            return
        strip_route(gym_result, key, model)
        result.gym_result = gym_result
        response = gym_result.get("response") or {}
        output = response.get("output") if isinstance(response, dict) else None
        result.completion = output_to_messages(output or [])
        result.metrics = extract_metrics(gym_result)
        if not result.usage.get("total_tokens") and isinstance(response, dict):
            result.usage = sum_usage([response.get("usage")])
        try:
            result.reward = parse_reward(gym_result.get("reward"))
        except InvalidResult as exc:
            result.error = exc
            result.reward = None

    async def run(
        self,
        tasks: Iterable[Task],
        endpoints: Endpoint | Sequence[Endpoint] | Callable[[Task], Endpoint],
        *,
        concurrency: int = 32,
        sampling_args: dict[str, Any] | None = None,
        timeout: float | None = None,
        upstream: Upstream | None = None,
    ) -> AsyncIterator[RolloutResult]:
        """Run ``tasks`` with at most ``concurrency`` at once; yield results as they finish.

        ``endpoints`` is one endpoint, a list (each rollout goes to the one with the fewest rollouts in
        flight), or a function of the task.
        """
        check_concurrency(concurrency)
        picker = EndpointPicker(endpoints)
        for endpoint in picker.known:
            self._remember_key(endpoint)
        await self.astart()

        async def run_one(task: Task) -> RolloutResult:
            queued_at = time.monotonic()
            endpoint, release = picker.acquire(task)
            try:
                assert endpoint is not None
                return await self.rollout(
                    task, endpoint, sampling_args, timeout, upstream=upstream, _queued_at=queued_at
                )
            finally:
                release()

        async with contextlib.aclosing(stream_rollouts(tasks, run_one, concurrency)) as stream:
            async for result in stream:
                yield result

    def run_sync(
        self,
        tasks: Iterable[Task],
        endpoints: Endpoint | Sequence[Endpoint] | Callable[[Task], Endpoint],
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
                session = self._sessions.pop(asyncio.get_running_loop(), None)
                if session is not None:
                    await session.close()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(collect())
        outcome: list[list[RolloutResult]] = []
        failure: list[BaseException] = []

        def work() -> None:
            try:
                outcome.append(asyncio.run(collect()))
            except BaseException as exc:  # handed to the caller's thread below
                failure.append(exc)

        worker = threading.Thread(target=work, name=f"run_sync-{self.env_name}", daemon=True)
        worker.start()
        worker.join()
        if failure:
            raise failure[0]
        return outcome[0]


class _NotDelivered(Exception):
    """The agent did not answer the request: the connection was refused, or (``dropped``) it broke."""

    def __init__(self, message: str, *, dropped: bool = False) -> None:
        super().__init__(message)
        self.dropped = dropped


def _clip(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else f"{text[: limit // 2]} ... {text[-limit // 2 :]}"


def _loads(text: str) -> Any:
    import json

    return json.loads(text)


def _row_for_route(row: dict[str, Any], key: str, gym_sampling: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(row)
    params = body.setdefault("responses_create_params", {})
    params.update(gym_sampling)
    params["model"] = key
    metadata = dict(params.get("metadata") or {})
    metadata[ROUTE_METADATA_KEY] = key
    params["metadata"] = metadata
    return body


__all__ = ["NeMoGymHarness", "RolloutResult", "UpstreamError", "split_sampling_args"]
