"""Orchestration of one eval: tasks loaded, the Gym stack started, the policy started, rollouts run
and their results yielded. Progress goes to a small observer interface; the console belongs to the CLI."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .._exceptions import ConfigurationError
from .gym_metrics import VERIFY_KEY, GymMetricsTally, aggregate_metrics_url, ask_gym_metrics, verify_entry
from .results import ExpectedRollouts
from .settings import MIX_STRIDE, EvalSettings, check_env_args
from .tasks import EnvRows, RunTasks

if TYPE_CHECKING:
    from .._endpoint import Endpoint
    from .._factory import NeMoGymEnv
    from .._harness import NeMoGymHarness
    from .._policy_script import ScriptPolicyServer
    from .._replay import ReplayServer
    from .._replicas import Replicas
    from .._result import RolloutResult
    from .._scale import NeMoGymPool
    from .._tasks import Task
    from .._training import TrainingClientRunner


class RunObserver(Protocol):
    """What the eval reports while it runs (the CLI draws it)."""

    def stack_starting(self, what: str) -> None:
        """``what``: e.g. "the Gym stack for example_multi_step"."""

    def stack_ready(self, seconds: float) -> None: ...

    def rollouts_starting(self, total: int, done: int) -> None: ...

    def rollout_finished(self, result: RolloutResult) -> None: ...


@dataclass
class SessionTiming:
    """Timing of one invocation (a resumed run has several)."""

    started_at: float = field(default_factory=time.time)
    stack_start_s: float | None = None
    rollouts_s: float | None = None
    rollouts: int = 0


class Evaluation:
    """One eval: its tasks, the harness that runs them and the policy that answers.

    ``load()`` reads the tasks (no processes yet); ``start(observer)`` starts the Gym stack;
    ``run(pending, observer)`` starts the policy (the replay server, or an endpoint), runs the pending
    tasks and yields their results as they finish; ``aclose()`` releases everything.
    """

    def __init__(self, settings: EvalSettings, *, api_key: str | None = None) -> None:
        self.settings = settings
        self._api_key: str | None = None
        self.use_api_key(api_key)
        self.env: NeMoGymEnv | None = None
        """The (first) environment."""
        self.envs: list[NeMoGymEnv] = []
        self.tasks = RunTasks([], settings.rollouts_per_example)
        """The run's tasks (made as they are taken; ``load()`` fills it)."""
        self._replay: ReplayServer | None = None
        self._script: ScriptPolicyServer | None = None
        self.pool: NeMoGymPool | None = None
        """With ``settings.ray``: the Ray actors that run the rollouts (``env.harness`` only checks then)."""
        self.training: TrainingClientRunner | None = None
        """With ``--client-type train``: verifiers' environments under its training client run the rollouts
        (``env.harness`` only checks then)."""
        self.timing = SessionTiming()
        self.recorded_rewards: dict[int, Any] = {}
        """Replay: each task's recorded reward, which its rollouts must reproduce."""
        self.judges: dict[str, dict[str, Any]] = {}
        """Judge name → where its calls went, how many, failed, tokens (this session)."""
        self.replicas: Replicas | None = None
        """With several ``-b`` URLs: the replicas and their health (which were out of the rotation, how long)."""

    def load(self) -> RunTasks:
        """Build the environments' tasksets and harnesses (raises ConfigurationError on bad input).

        A mix of environments (or ``--ray``) runs on a ``NeMoGymPool``: one stack per environment here, or
        Ray actors; the tasks of environment ``i`` are numbered from ``i * MIX_STRIDE``."""
        s = self.settings
        args = {k: v for k, v in s.env_args.items() if k != "nemo_env"}
        check_env_args(args)
        if s.policy == "replay" and "dataset" in args:
            raise ConfigurationError(
                "-a dataset picks the tasks for a model endpoint (add -b URL); the replay policy runs the "
                "recorded rollouts (or the recordings in -a jsonl_path)."
            )
        names = s.env_names
        if len(names) > 1 and ({"dataset", "jsonl_path"} & set(args)):
            raise ConfigurationError(
                "-a dataset/jsonl_path name one environment's data; run the environments of a mix on their "
                "packaged data, or evaluate one environment at a time."
            )
        judge = self._judge_endpoints() or None  # read once: every environment and the pool share them
        self.envs = [self._load_env(name, args, judge) for name in names]
        self.env = self.envs[0]
        if s.client_type == "train":
            self.training = self._make_training_runner(args)
        elif s.ray is not None or len(names) > 1:
            self.pool = self._make_pool(args, judge)
        self.tasks = RunTasks([self._rows_of(env) for env in self.envs], s.rollouts_per_example, MIX_STRIDE)
        if s.policy == "replay":
            self.recorded_rewards = {t.task_index: t.recorded_reward for t in self.tasks.firsts()}
        return self.tasks

    def _rows_of(self, env: NeMoGymEnv) -> EnvRows:
        """An environment's rows, each the task of its first rollout, read from its taskset when a rollout of it
        runs (for the replay policy the taskset's recordings, runnable as they are)."""
        taskset = env.taskset
        r = taskset.rollouts_per_task
        if not taskset.num_rows:
            raise ConfigurationError(f"{env.name}: the dataset has no tasks.")
        return EnvRows(env.name, taskset.num_rows, lambda row: taskset[row * r])

    def _load_env(self, name: str, args: dict[str, Any], judge: dict[str, Endpoint] | None) -> NeMoGymEnv:
        from .._factory import load_environment

        s = self.settings
        try:
            return load_environment(
                name,
                recorded=s.policy == "replay",
                num_examples=s.num_examples,
                rollouts_per_example=s.rollouts_per_example,
                timeout=s.timeout,
                secrets=(self._api_key,) if self._api_key else (),
                judge=judge,
                **args,
            )
        except TypeError as exc:  # an env arg of the wrong kind
            raise ConfigurationError(f"-a: {exc}") from None

    @property
    def harness(self) -> NeMoGymHarness | NeMoGymPool | TrainingClientRunner:
        """What runs the rollouts: the training-client runner, the pool (a mix, or Ray), else the environment's
        harness."""
        assert self.env is not None, "load() first"
        if self.training is not None:
            return self.training
        return self.pool if self.pool is not None else self.env.harness

    def _make_pool(self, env_args: dict[str, Any], judge: dict[str, Endpoint] | None) -> NeMoGymPool:
        import inspect

        from .._harness import NeMoGymHarness
        from .._scale import NeMoGymPool

        s = self.settings
        accepted = set(inspect.signature(NeMoGymHarness.__init__).parameters) - {"self", "taskset", "nemo_env"}
        harness_args = {k: v for k, v in env_args.items() if k in accepted}
        return NeMoGymPool(
            s.env_names,
            ray=s.ray,
            workers=s.workers,
            cpus_per_stack=s.cpus_per_stack,
            secrets=(self._api_key,) if self._api_key else (),
            timeout=s.timeout,
            judge=judge,
            **harness_args,
        )

    def _make_training_runner(self, env_args: dict[str, Any]) -> TrainingClientRunner:
        from .._training import RendererSpec, TrainingClientRunner, TrainingSetup, verifiers_env_config

        s = self.settings
        setup = TrainingSetup(
            renderer=RendererSpec(s.renderer or "auto", s.renderer_model, dict(s.renderer_config)),
            model=s.model,
            base_urls=tuple(s.base_url.split(",")) if s.base_url else None,
            api_key_var=s.api_key_var,
            generate_shape=s.generate_shape or "vllm-0.31",
        )
        configs = {
            name: verifiers_env_config(
                name, env_args, recorded=s.policy == "replay", timeout=s.timeout, judges=s.judges
            )
            for name in s.env_names
        }
        return TrainingClientRunner(setup, configs)

    def _judge_endpoints(self) -> dict[str, Endpoint]:
        """The judges of the settings as endpoints (keys read from their variables now)."""
        from .._judge import judge_endpoint
        from .preflight import check_base_url

        return {
            name: judge_endpoint(
                check_base_url(judge["base_url"]),
                judge["model"],
                api_key_var=judge.get("api_key_var"),
                api=judge.get("api") or "responses",
            )
            for name, judge in self.settings.judges.items()
        }

    def _count_judge_calls(self) -> None:
        from .._judge.router import tally_judge_calls

        tally_judge_calls(self.judges, self.harness.judge_calls(), self.harness.judge_label)

    def use_api_key(self, api_key: str | None) -> None:
        """The endpoint's API key (call before ``start``: Gym processes must not inherit it)."""
        self._api_key = api_key
        if api_key and self.env is not None:
            self.harness.add_secrets(api_key)

    def check(self) -> tuple[str, ...]:
        """Raise now what starting the stack would refuse (a judge-scored environment given no judge,
        missing packages); starts no Gym process. Returns why the environment may need an external service.

        Replay with no judge given: the replay server (started here) answers judge calls from the
        recorded judge I/O too."""
        assert self.env is not None, "load() first"
        if self.settings.policy == "replay" and self.pool is not None:
            # Each worker of the pool replays its environment's tasks (and their judge calls) on a server
            # of its own; the environments' harnesses, never started then, get that address only to check.
            self.pool.use_replay(self.tasks.firsts())
        if self.training is not None and self.settings.policy == "replay":
            self.training.use_replay(self.tasks.firsts())
        external: list[str] = []
        for env in self.envs:
            if self.settings.policy == "replay" and not env.harness.judges:
                from .._judge import ANY_JUDGE

                pooled = self.pool is not None
                judge = self._replay_placeholder() if pooled else self._replay_server().judge_endpoint()
                env.harness.set_judge({ANY_JUDGE: judge})
                if self.training is not None:
                    self.training.use_judge(env.name, judge)
            external.extend(env.harness.check())
        return tuple(external)

    @staticmethod
    def _replay_placeholder() -> Endpoint:
        from .._endpoint import Endpoint
        from .settings import REPLAY_MODEL

        return Endpoint(base_url="http://127.0.0.1:9/v1", model=REPLAY_MODEL, name="replay (on each Ray actor)")

    def _replay_server(self) -> ReplayServer:
        """The replay server of every recording of the run (one per row)."""
        if self._replay is None:
            from .._replay import ReplayServer

            self._replay = ReplayServer.from_tasks(list(self.tasks.firsts())).start()
        return self._replay

    @property
    def expected(self) -> ExpectedRollouts:
        """The (task_index, rollout_index) pairs of the run (numbered, not listed)."""
        return self.tasks.expected

    def _endpoints(self) -> Endpoint | Replicas | Callable[[Task], Endpoint] | None:
        from .._endpoint import Endpoint
        from .._replicas import Replicas

        s = self.settings
        if self.training is not None:
            return None  # the training client's engine is the runner's
        if s.policy == "replay":
            return None if self.pool is not None else self._replay_server().endpoint_for
        if s.policy == "script":
            return self._script_endpoint()
        assert s.base_url is not None
        replicas = [
            Endpoint(
                base_url=url, model=s.model, api_key=self._api_key or "EMPTY", api=s.api, exact_tokens=s.exact_tokens
            )
            for url in s.base_url.split(",")
        ]
        if len(replicas) == 1:
            return replicas[0]
        if self.replicas is None:  # the least-loaded live one first; one that does not connect is left
            self.replicas = Replicas(replicas)
        return self.replicas

    def _script_endpoint(self) -> Endpoint:
        """The policy script of the run, served on 127.0.0.1 (started here, once)."""
        from .._endpoint import Endpoint
        from .._policy_script import ScriptPolicyServer

        assert self.settings.policy_script is not None
        if self._script is None:
            self._script = ScriptPolicyServer.from_spec(self.settings.policy_script).start()
        return Endpoint(base_url=self._script.base_url, model=self._script.name, api=self.settings.api, name="script")

    async def start(self, observer: RunObserver) -> None:
        """Start the Gym stack (shown as its own step)."""
        assert self.env is not None, "load() first"
        s = self.settings
        names = ", ".join(s.env_names)
        if self.training is not None:
            observer.stack_starting(
                f"verifiers' environment{'s' if len(s.env_names) > 1 else ''} for {names} "
                "(training client; Gym stacks included)"
            )
        elif s.ray is not None:
            workers = f"{s.workers} Ray actor{'s' if s.workers != 1 else ''} each" if s.workers else "Ray actors"
            observer.stack_starting(f"the Gym stacks for {names} ({workers}; Ray: {s.ray})")
        else:
            observer.stack_starting(f"the Gym stack{'s' if len(s.env_names) > 1 else ''} for {names}")
        started = time.monotonic()
        await self.harness.astart()
        self.timing.stack_start_s = time.monotonic() - started
        observer.stack_ready(self.timing.stack_start_s)

    async def run(
        self, pending: Iterable[Task], observer: RunObserver, *, done: int = 0
    ) -> AsyncIterator[RolloutResult]:
        """Run ``pending`` tasks (taken one at a time as slots free up; ``done``: how many of the run's rollouts
        were done before); yield each result as it finishes."""
        assert self.env is not None, "load() first"
        endpoints = self._endpoints()
        observer.rollouts_starting(len(self.tasks), done)
        started = time.monotonic()
        try:
            stream = self.harness.run(
                pending,
                endpoints,
                concurrency=self.settings.max_concurrent,
                sampling_args=dict(self.settings.sampling_args) or None,
                timeout=self.settings.timeout,
            )
            async with contextlib.aclosing(stream):
                async for result in stream:
                    self.timing.rollouts += 1
                    self.timing.rollouts_s = time.monotonic() - started
                    self._count_judge_calls()  # counted as they come: none is held for the end
                    observer.rollout_finished(result)
                    yield result
        finally:
            self.timing.rollouts_s = time.monotonic() - started
            self._count_judge_calls()

    async def gym_metrics(self, tally: GymMetricsTally) -> dict[str, Any]:
        """Gym's own metrics of the run's verify responses, asked of the stacks that ran them (``gym_metrics``: this
        process's, or a live worker's of each environment in a mix or on Ray actors); empty under verifiers' training
        client (its rollouts ran through verifiers) or when no stack is running."""
        if self.training is not None:
            return {}
        if self.pool is not None:
            return await self.pool.gym_metrics(tally.entries)
        urls = {}
        for env in self.envs:
            harness = env.harness
            if not harness.started:
                continue
            for env_name, agent in tally.entries:
                if env_name == harness.env_name:
                    urls[(env_name, agent)] = aggregate_metrics_url(harness, agent)
        return await ask_gym_metrics(urls, tally.entries) if urls else {}

    def replica_outages(self) -> list[dict[str, Any]]:
        """This session's outages of the ``-b`` replicas (which, when, how long, why), in the order they began."""
        return [outage.to_dict() for outage in self.replicas.outages()] if self.replicas is not None else []

    async def aclose(self) -> None:
        if self.replicas is not None:
            self.replicas.close()
        if self._replay is not None:
            self._replay.stop()
            self._replay = None
        if self._script is not None:
            self._script.stop()
            self._script = None
        if self.pool is not None:
            await self.pool.aclose()
        if self.training is not None:
            await self.training.aclose()
        for env in self.envs:
            await env.harness.aclose()

    def record_of(self, result: RolloutResult) -> dict[str, Any]:
        """The ``results.jsonl`` line of a result (a replay's also carries the recorded reward; with token IDs
        recorded, whether they are contiguous: ``token_ids``)."""
        from .token_ids import rollout_token_ids

        save = self.settings.save_trace  # the calls, and Gym's own record (a recording: replayable as Gym's are)
        record = result.to_dict(include_trace=save, include_gym_result=save)
        token_ids = rollout_token_ids(result.trace)
        if token_ids is not None:
            record["token_ids"] = token_ids
        if isinstance(result.gym_result, dict) and result.error is None:  # what Gym's /aggregate_metrics takes
            record[VERIFY_KEY] = verify_entry(result.gym_result, result.task_index, result.rollout_index)
        if result.task_index in self.recorded_rewards:
            record["recorded_reward"] = self.recorded_rewards[result.task_index]
        return record
